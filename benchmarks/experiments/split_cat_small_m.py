"""Where gemm_split_cat loses at small M (issue 4): the cat after a vendor GEMM, and which path
each M should take.

    PYTHONPATH=. python benchmarks/experiments/split_cat_small_m.py --out $OUT

Three parts, all in CUDA graphs over input sets rotated past L2 (µs, median):
  cat     the cat kernel alone (`cat_pieces` and candidate tilings, `--cat` variants) on the
          (M, N) result of a GEMM, against Inductor's compile of the cat alone;
  fp8     kv_b / "other" with FP8 rowwise operands: the op as dispatched, `_scaled_mm` followed
          by each cat variant, the FP8 head tiles forced (two tile heights), `_scaled_mm` alone
          and Inductor's compile of `_scaled_mm` → view → split → cat;
  dense   bf16: the op as dispatched, the tile kernel under a few configs, F.linear followed by
          the best cat, F.linear alone, and Inductor's compile of the chain.
Every output is compared with the unfused spelling on the same GPU first (bit-equal for the
cat kernels, ≤ 1e-2 relative for the GEMM paths).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
import triton.testing

from fxfuse.kernels import gemm_split_cat as kernels
from fxfuse.kernels._plans import launch
from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_gemm_split_cat import CASES, rotating  # noqa: E402

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
L2_BYTES = 60 * 2**20


@triton.jit
def _cat_tiles_kernel(
    c_ptr, y_ptr, out_ptr, R, stride_ym, stride_yd, stride_ys,
    D: tl.constexpr, S1: tl.constexpr, SW: tl.constexpr, W: tl.constexpr, S3: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_S1: tl.constexpr, BLOCK_S3: tl.constexpr,
):  # fmt: skip
    """The cat as two tiles per block of rows (c's head slice, y's slice), sizes as constexprs."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < R
    cols = tl.arange(0, BLOCK_S1)
    mask = row_ok[:, None] & (cols < S1)[None, :]
    v = tl.load(c_ptr + rows[:, None] * SW + cols[None, :], mask=mask)
    tl.store(out_ptr + rows[:, None] * W + cols[None, :], v, mask=mask)
    m = rows // D
    d = rows % D
    cols3 = tl.arange(0, BLOCK_S3)
    mask3 = row_ok[:, None] & (cols3 < S3)[None, :]
    y_ptrs = y_ptr + (m * stride_ym + d * stride_yd)[:, None] + cols3[None, :] * stride_ys
    tl.store(out_ptr + rows[:, None] * W + S1 + cols3[None, :], tl.load(y_ptrs, mask=mask3),
             mask=mask3)  # fmt: skip


@triton.jit
def _cat_flat_kernel(
    c_ptr, y_ptr, out_ptr, TOTAL, stride_ym, stride_yd, stride_ys,
    D: tl.constexpr, S1: tl.constexpr, SW: tl.constexpr, W: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """The cat over out's flat index (Inductor's shape of it), sizes as constexprs."""
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = idx < TOTAL
    row = idx // W
    col = idx % W
    from_c = col < S1
    cv = tl.load(c_ptr + row * SW + col, mask=ok & from_c)
    m = row // D
    d = row % D
    yv = tl.load(y_ptr + m * stride_ym + d * stride_yd + (col - S1) * stride_ys, mask=ok & ~from_c)
    tl.store(out_ptr + idx, tl.where(from_c, cv, yv), mask=ok)


def cat_current(c, d, s1, s2, y):
    """The shipped `cat_pieces` (since 2026-12-06 the two-tile kernel below, as tiles_r8w4; the
    first run's "current" was a 16-row kernel of 256 masked columns, cur_* its tilings)."""
    return kernels.cat_pieces(c, d, s1, s2, y)


def cat_tiles(c, d, s1, s2, y, block_r=8, warps=4):
    m, s3 = c.shape[0], y.shape[2]
    out = torch.empty((m, d, s1 + s3), dtype=c.dtype, device=c.device)
    launch(_cat_tiles_kernel, (triton.cdiv(m * d, block_r),),
           c, y, out, m * d, *y.stride(), D=d, S1=s1, SW=s1 + s2, W=s1 + s3, S3=s3,
           BLOCK_R=block_r, BLOCK_S1=triton.next_power_of_2(s1),
           BLOCK_S3=triton.next_power_of_2(s3), num_warps=warps)  # fmt: skip
    return out


def cat_flat(c, d, s1, s2, y, block=1024, warps=4):
    m, s3 = c.shape[0], y.shape[2]
    out = torch.empty((m, d, s1 + s3), dtype=c.dtype, device=c.device)
    total = out.numel()
    launch(_cat_flat_kernel, (triton.cdiv(total, block),),
           c, y, out, total, *y.stride(), D=d, S1=s1, SW=s1 + s2, W=s1 + s3, BLOCK=block,
           num_warps=warps)  # fmt: skip
    return out


CAT_VARIANTS = {
    "current": lambda c, d, s1, s2, y: cat_current(c, d, s1, s2, y),
    "tiles_r4w2": lambda c, d, s1, s2, y: cat_tiles(c, d, s1, s2, y, 4, 2),
    "tiles_r8w4": lambda c, d, s1, s2, y: cat_tiles(c, d, s1, s2, y, 8, 4),
    "tiles_r16w4": lambda c, d, s1, s2, y: cat_tiles(c, d, s1, s2, y, 16, 4),
    "tiles_r32w8": lambda c, d, s1, s2, y: cat_tiles(c, d, s1, s2, y, 32, 8),
    "flat_1024w4": lambda c, d, s1, s2, y: cat_flat(c, d, s1, s2, y, 1024, 4),
    "flat_2048w8": lambda c, d, s1, s2, y: cat_flat(c, d, s1, s2, y, 2048, 8),
}


def graph_us(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3


def count_for(set_bytes: int) -> int:
    return max(1, min(16, math.ceil(2 * L2_BYTES / set_bytes)))


def make_set(m, shape, device, fp8: bool) -> dict:
    k, d, s1, s2, s3 = (shape[key] for key in ("k", "d", "s1", "s2", "s3"))
    n = d * (s1 + s2)
    x = torch.randn(m, k, device=device)
    w = torch.randn(n, k, device=device) / math.sqrt(k)
    y = torch.randn(m, 1, s3, dtype=BF16, device=device).expand(m, d, s3)
    i = {"d": d, "s1": s1, "s2": s2, "y": y}
    if fp8:
        q, xs = quant_fp8_ref(x, 0, FP8, 1e-10, False, False)
        wq, ws = quant_fp8_ref(w, 0, FP8, 1e-10, False, False)
        i["gemm"] = (q, xs, wq, ws.view(-1))
        i["c"] = torch._scaled_mm(q, wq.t(), scale_a=xs, scale_b=ws.view(1, -1), out_dtype=BF16)
    else:
        i["x"], i["w"] = x.to(BF16), w.to(BF16)
        i["c"] = F.linear(i["x"], i["w"])
    return i


def unfused_cat(i):
    m = i["c"].shape[0]
    c1 = i["c"].view(m, i["d"], i["s1"] + i["s2"])[..., : i["s1"]]
    return torch.cat([c1, i["y"]], dim=-1)


def rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def part_cat(ms, shapes, device, rows, variants):
    def cat_only(c, y, d: int, s1: int, s2: int):
        c1 = c.view(c.shape[0], d, s1 + s2)[..., :s1]
        return torch.cat([c1, y], dim=-1)

    compiled = torch.compile(cat_only, dynamic=False)
    for name, shape in shapes.items():
        for m in ms:
            n = shape["d"] * (shape["s1"] + shape["s2"])
            sets = [make_set(m, shape, device, True) for _ in range(count_for(4 * m * n))]
            want = unfused_cat(sets[0])
            us = {}
            for label, fn in variants.items():
                got = fn(sets[0]["c"], sets[0]["d"], sets[0]["s1"], sets[0]["s2"], sets[0]["y"])
                if not torch.equal(got, want):
                    raise AssertionError(f"cat variant {label} differs at {name} M {m}")
                us[label] = graph_us(rotating(sets, lambda i, f=fn: f(
                    i["c"], i["d"], i["s1"], i["s2"], i["y"])))  # fmt: skip
            ind = rotating(sets, lambda i: compiled(i["c"], i["y"], i["d"], i["s1"], i["s2"]))
            ind()
            us["inductor"] = graph_us(ind)
            us["current_again"] = graph_us(rotating(sets, lambda i: kernels.cat_pieces(
                i["c"], i["d"], i["s1"], i["s2"], i["y"])))  # fmt: skip
            print(f"cat {name:5s} M {m:6d} " + " ".join(f"{k} {v:.2f}" for k, v in us.items()),
                  flush=True)  # fmt: skip
            rows.append({"part": "cat", "case": name, "shape": {"m": m, **shape}, "us": us})


def check_and_time(part, name, m, shape, sets, calls, want, extra, rows):
    """Each call checked against the unfused cat (≤ 1e-2, y's slice exact), then timed with the
    `extra` peers and the first call again; one row printed and kept."""
    i0 = sets[0]
    for label, fn in calls.items():
        got = fn(i0)
        out = got[0] if isinstance(got, tuple) else got
        error = rel(out, want)
        if error > 1e-2 or not torch.equal(out[..., i0["s1"]:], i0["y"]):
            raise AssertionError(f"{part} {label} wrong at {name} M {m}: {error}")
    us = {label: graph_us(rotating(sets, fn)) for label, fn in calls.items()}
    for label, fn in extra.items():
        timed = rotating(sets, fn)
        timed()  # a compile outside the timing
        us[label] = graph_us(timed)
    us["op_again"] = graph_us(rotating(sets, calls["op"]))
    print(f"{part} {name:5s} M {m:6d} " + " ".join(f"{k} {v:.2f}" for k, v in us.items()),
          flush=True)  # fmt: skip
    rows.append({"part": part, "case": name, "shape": {"m": m, **shape}, "us": us})


def part_fp8(ms, shapes, device, rows, cat_best):
    def chain(q, x_scale, w, w_scale, d: int, s1: int, s2: int, y):
        c = torch._scaled_mm(q, w.t(), scale_a=x_scale, scale_b=w_scale.view(1, -1),
                             out_dtype=BF16)  # fmt: skip
        c1, c2 = torch.split(c.view(q.shape[0], d, s1 + s2), [s1, s2], dim=-1)
        return torch.cat([c1, y], dim=-1), c2

    compiled = torch.compile(chain, dynamic=False)
    op = torch.ops.fxfuse.gemm_fp8_split_cat

    def scaled_mm(i):
        q, xs, wq, ws = i["gemm"]
        return torch._scaled_mm(q, wq.t(), scale_a=xs, scale_b=ws.view(1, -1), out_dtype=BF16)

    for name, shape in shapes.items():
        for m in ms:
            n = shape["d"] * (shape["s1"] + shape["s2"])
            set_bytes = m * shape["k"] + n * shape["k"] + 4 * m * n
            sets = [make_set(m, shape, device, True) for _ in range(count_for(set_bytes))]
            i0 = sets[0]
            want = unfused_cat(i0)
            calls = {"op": lambda i: op(*i["gemm"], BF16, i["d"], i["s1"], i["s2"], i["y"])}
            for label in cat_best:
                fn = CAT_VARIANTS[label]
                calls[f"mm+{label}"] = lambda i, f=fn: f(
                    scaled_mm(i), i["d"], i["s1"], i["s2"], i["y"])  # fmt: skip
            for label, cfg in (("ht128", {}), ("ht64", {"BLOCK_M": 64, "num_warps": 4})):
                if kernels.fp8_head_tiles(*i0["gemm"], i0["d"], i0["s1"], i0["s2"], i0["y"],
                                          config=cfg) is not None:  # fmt: skip
                    calls[label] = lambda i, c=cfg: kernels.fp8_head_tiles(
                        *i["gemm"], i["d"], i["s1"], i["s2"], i["y"], config=c)  # fmt: skip
            calls["epilogue"] = lambda i: kernels_fp8().gemm_fp8_split_cat(
                *i["gemm"], i["d"], i["s1"], i["s2"], i["y"])  # fmt: skip
            extra = {
                "scaled_mm": scaled_mm,
                "inductor": lambda i: compiled(*i["gemm"], i["d"], i["s1"], i["s2"], i["y"]),
            }
            check_and_time("fp8", name, m, shape, sets, calls, want, extra, rows)


def kernels_fp8():
    from fxfuse.kernels import gemm_fp8

    return gemm_fp8


DENSE_CONFIGS = {
    "t16x64k256": {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 256, "GROUP_M": 8, "SPLIT_K": 1,
                   "PERSISTENT": 0, "num_warps": 4, "num_stages": 3},
    "t32x64k128": {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": 1,
                   "PERSISTENT": 0, "num_warps": 4, "num_stages": 3},
    "t64x128k64": {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1,
                   "PERSISTENT": 0, "num_warps": 4, "num_stages": 3},
    "t64x64k128": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": 1,
                   "PERSISTENT": 0, "num_warps": 4, "num_stages": 3},
    "t32x64k128s2": {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": 2,
                     "PERSISTENT": 0, "num_warps": 4, "num_stages": 3},
    "t64x256k64p": {"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1,
                    "PERSISTENT": 1, "num_warps": 4, "num_stages": 3},
}  # fmt: skip


def part_dense(ms, shapes, device, rows, cat_best):
    def chain(x, w, d: int, s1: int, s2: int, y):
        c = F.linear(x, w).view(x.shape[0], d, s1 + s2)
        c1, c2 = torch.split(c, [s1, s2], dim=-1)
        return torch.cat([c1, y], dim=-1), c2

    compiled = torch.compile(chain, dynamic=False)
    op = torch.ops.fxfuse.gemm_split_cat
    for name, shape in shapes.items():
        for m in ms:
            n = shape["d"] * (shape["s1"] + shape["s2"])
            set_bytes = 2 * (m * shape["k"] + n * shape["k"]) + 4 * m * n
            sets = [make_set(m, shape, device, False) for _ in range(count_for(set_bytes))]
            i0 = sets[0]
            want = unfused_cat(i0)
            calls = {"op": lambda i: op(i["x"], i["w"], i["d"], i["s1"], i["s2"], i["y"])}
            for label, cfg in DENSE_CONFIGS.items():
                calls[label] = lambda i, c=cfg: kernels.gemm_split_cat(
                    i["x"], i["w"], i["d"], i["s1"], i["s2"], i["y"], config=c)  # fmt: skip
            for label in cat_best:
                fn = CAT_VARIANTS[label]
                calls[f"lin+{label}"] = lambda i, f=fn: f(
                    F.linear(i["x"], i["w"]), i["d"], i["s1"], i["s2"], i["y"])  # fmt: skip
            for label, fn in list(calls.items()):
                try:
                    fn(i0)
                except triton.runtime.errors.OutOfResources as err:
                    print(f"dense {label}: {err}", flush=True)
                    del calls[label]
            extra = {
                "linear": lambda i: F.linear(i["x"], i["w"]),
                "inductor": lambda i: compiled(i["x"], i["w"], i["d"], i["s1"], i["s2"], i["y"]),
            }
            check_and_time("dense", name, m, shape, sets, calls, want, extra, rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--parts", default="cat,fp8,dense")
    parser.add_argument("--cat-m", default="128,256,512,1024")
    parser.add_argument("--fp8-m", default="64,128,256,512,768,1024")
    parser.add_argument("--dense-m", default="32,64,128,256,512,768,1024,2048")
    parser.add_argument("--cat-best", default="current,tiles_r8w4,flat_1024w4")
    parser.add_argument("--dense-configs", default=",".join(DENSE_CONFIGS))
    parser.add_argument("--cases", default="kv_b,other",
                        help=f"bench_gemm_split_cat's shapes, comma-separated: {sorted(CASES)}")
    args = parser.parse_args()
    device = torch.device("cuda")
    # One compile per (shape, M) of each chain: more than dynamo's default limit of 8, past which
    # it would run the rest eagerly (the first run's dense "other" M 512 / 1024 Inductor figures).
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 1024
    for label in set(DENSE_CONFIGS) - set(args.dense_configs.split(",")):
        del DENSE_CONFIGS[label]
    unknown = sorted(set(args.cases.split(",")) - set(CASES))
    if unknown:
        parser.error(f"--cases: unknown {unknown}; expected names from {sorted(CASES)}")
    shapes = {name: CASES[name] for name in args.cases.split(",")}
    rows = []
    parts = args.parts.split(",")
    best = args.cat_best.split(",")
    ints = lambda s: [int(v) for v in s.split(",")]  # noqa: E731
    for part in parts:
        try:
            if part == "cat":
                part_cat(ints(args.cat_m), shapes, device, rows, CAT_VARIANTS)
            elif part == "fp8":
                part_fp8(ints(args.fp8_m), shapes, device, rows, best)
            elif part == "dense":
                part_dense(ints(args.dense_m), shapes, device, rows, best)
        except Exception as err:  # noqa: BLE001 - report, go on with the next part
            print(f"part {part} FAILED: {type(err).__name__}: {err}", flush=True)
            rows.append({"part": part, "error": f"{type(err).__name__}: {err}"})
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "split_cat_small_m.json"), "w") as f:
            json.dump({
                "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "triton": triton.__version__, "date": datetime.date.today().isoformat(),
                "command": "PYTHONPATH=. python benchmarks/experiments/split_cat_small_m.py "
                + " ".join(sys.argv[1:]),
                "rows": rows,
            }, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
