"""gemm_split_cat's quantized producers (FP8 per token, FP8 1×128 blockscale, MXFP4) against the
unfused chain and the GEMM alone.

    PYTHONPATH=. python benchmarks/bench_gemm_split_cat_quant.py --out $OUT   # GPU: table + JSON
    PYTHONPATH=. python benchmarks/bench_gemm_split_cat_quant.py --cpu-smoke  # interpreter, tiny

Columns (µs; CUDA graphs, input sets rotated past L2):
  fxfuse    torch.ops.fxfuse.gemm_{fp8,mxfp4}_split_cat, what a rewritten graph calls: the Triton
            GEMM with the split epilogue, or, where the A8W8 backend table runs the vendor GEMM,
            `_scaled_mm` and the pieces copied out of its result
  epilogue  the Triton GEMM with the split epilogue, at every M
  unfused   what the graph runs without this fusion: the GEMM op (fxfuse.gemm_fp8 / gemm_mxfp4,
            its backend table's choice), then torch view → split → cat (c2 stays a view)
  gemm      the GEMM op alone
  inductor  rowwise only: torch.compile of the model's spelling, `_scaled_mm` → view → split → cat
Every case is checked first: the fused op's pieces ≤ 1e-2 relative to a float64 GEMM of the same
quantized operands, y's slice bit-exact, and the epilogue kernel equal to the plain Triton GEMM
split by torch, bit for bit.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys

if __name__ == "__main__" and "--cpu-smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch
import triton
import triton.testing

from fxfuse.kernels import gemm_fp8, gemm_mxfp4, gemm_ref
from fxfuse.kernels.gemm_split_cat_ref import split_cat_of
from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref, quant_mxfp4_ref
from fxfuse.runtime import gemm_ops

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_gemm_split_cat import rotating  # noqa: E402

SUITE = "gemm_split_cat_quant"
L2_BYTES = 60 * 2**20
FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
KINDS = ("fp8_rowwise", "fp8_block", "mxfp4")
# DeepSeek-R1 MLA kv_b at TP8: K 512, N 4096 = 16 heads × (128 qk_nope + 128 v), rope 64.
KV_B = {"k": 512, "d": 16, "s1": 128, "s2": 128, "s3": 64}
KV_B_MS = (1, 32, 128, 1024, 4096, 8192, 16384)
# Not DeepSeek: widths that are no multiple of a tile (column-scatter epilogue).
OTHER = {"k": 1024, "d": 8, "s1": 96, "s2": 160, "s3": 32}
OTHER_MS = (32, 4096)


def make_inputs(kind: str, m: int, shape: dict, device) -> dict:
    k, d, s1, s2, s3 = (shape[key] for key in ("k", "d", "s1", "s2", "s3"))
    n = d * (s1 + s2)
    x, w = torch.randn(m, k, device=device), torch.randn(n, k, device=device) / math.sqrt(k)
    if kind == "mxfp4":
        (q, x_scale), (wq, w_scale) = quant_mxfp4_ref(x, "even"), quant_mxfp4_ref(w, "even")
    else:
        group = 128 if kind == "fp8_block" else 0
        q, x_scale = quant_fp8_ref(x, group, FP8, 1e-10, False, False)
        wq, w_scale = quant_fp8_ref(w, 0, FP8, 1e-10, False, False)
        w_scale = w_scale.view(-1)
        if group:  # 128×128 weight blocks
            w_scale = torch.rand(-(-n // 128), k // 128, device=device) + 0.5
    y = torch.randn(m, 1, s3, dtype=BF16, device=device).expand(m, d, s3)
    return {"gemm": (q, x_scale, wq, w_scale), "d": d, "s1": s1, "s2": s2, "y": y}


def input_sets(kind: str, m: int, shape: dict, device) -> list[dict]:
    """Several input sets when one fits in L2, so that rotating among them defeats the cache."""
    n = shape["d"] * (shape["s1"] + shape["s2"])
    set_bytes = m * shape["k"] + n * shape["k"] + 2 * m * n
    count = max(1, min(16, math.ceil(2 * L2_BYTES / set_bytes)))
    return [make_inputs(kind, m, shape, device) for _ in range(count)]


def _ops(kind: str):
    if kind == "mxfp4":
        return torch.ops.fxfuse.gemm_mxfp4_split_cat, torch.ops.fxfuse.gemm_mxfp4
    return torch.ops.fxfuse.gemm_fp8_split_cat, torch.ops.fxfuse.gemm_fp8


def calls(kind: str) -> dict:
    split_cat_op, gemm_op = _ops(kind)
    kernels = gemm_mxfp4.gemm_mxfp4_split_cat if kind == "mxfp4" else gemm_fp8.gemm_fp8_split_cat

    def fused(i):
        return split_cat_op(*i["gemm"], BF16, i["d"], i["s1"], i["s2"], i["y"])

    def epilogue(i):
        return kernels(*i["gemm"], i["d"], i["s1"], i["s2"], i["y"])

    def unfused(i):
        c = gemm_op(*i["gemm"], BF16).view(i["y"].shape[0], i["d"], i["s1"] + i["s2"])
        c1, c2 = torch.split(c, [i["s1"], i["s2"]], dim=-1)
        return torch.cat([c1, i["y"]], dim=-1), c2

    def gemm(i):
        return gemm_op(*i["gemm"], BF16)

    return {"fxfuse": fused, "epilogue": epilogue, "unfused": unfused, "gemm": gemm}


def inductor_chain():
    """The model's FP8 rowwise spelling, compiled: _scaled_mm → view → split → cat."""

    def chain(q, x_scale, w, w_scale, d: int, s1: int, s2: int, y):
        c = torch._scaled_mm(q, w.t(), scale_a=x_scale, scale_b=w_scale.view(1, -1), out_dtype=BF16)
        c1, c2 = torch.split(c.view(q.shape[0], d, s1 + s2), [s1, s2], dim=-1)
        return torch.cat([c1, y], dim=-1), c2

    return torch.compile(chain, dynamic=False)


def reference(kind: str, i: dict) -> torch.Tensor:
    q, x_scale, w, w_scale = i["gemm"]
    if kind == "mxfp4":
        c = gemm_ref.gemm_mxfp4_ref(q, x_scale, w, w_scale, torch.float64)
    else:
        c = gemm_ref.gemm_fp8_ref(q, x_scale, w, w_scale, torch.float64)
    return c.view(q.shape[0], i["d"], i["s1"] + i["s2"])


def check(kind: str, i: dict, fns: dict) -> float:
    """Relative error of the fused op against float64; raises when out of tolerance or when the
    epilogue kernel differs from the plain kernel split by torch."""
    s1 = i["s1"]
    out, c2 = fns["fxfuse"](i)
    c = reference(kind, i)
    errors = [
        ((out[..., :s1].double() - c[..., :s1]).norm() / c[..., :s1].norm()).item(),
        ((c2.double() - c[..., s1:]).norm() / c[..., s1:].norm()).item(),
    ]
    if max(errors) > 1e-2 or not torch.equal(out[..., s1:], i["y"]):
        raise AssertionError(f"{kind} fused op wrong: rel errors {errors}")
    plain_kernel = gemm_mxfp4.gemm_mxfp4 if kind == "mxfp4" else gemm_fp8.gemm_fp8
    want = split_cat_of(plain_kernel(*i["gemm"], BF16), i["d"], s1, i["s2"], i["y"])
    got = fns["epilogue"](i)
    if not all(torch.equal(a, b) for a, b in zip(got, want)):
        raise AssertionError(f"{kind}: the split epilogue differs from the plain kernel")
    return max(errors)


HEAD_TILES_MIN_M = 4096
HEAD_CONFIGS = False  # --head-configs: time each of HEAD_TILE_CONFIGS (do_bench)
# The FP8 rowwise head-tile kernel (kernels/gemm_split_cat.fp8_head_tiles), a few configs.
HEAD_TILE_CONFIGS = {
    "m128k128s3": {"BLOCK_M": 128, "BLOCK_K": 128, "num_warps": 8, "num_stages": 3},
    "m128k128s4": {"BLOCK_M": 128, "BLOCK_K": 128, "num_warps": 8, "num_stages": 4},
    "m128k256s2": {"BLOCK_M": 128, "BLOCK_K": 256, "num_warps": 8, "num_stages": 2},
    "m64k128s4": {"BLOCK_M": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4},
    "m64k256s2": {"BLOCK_M": 64, "BLOCK_K": 256, "num_warps": 8, "num_stages": 2},
}


def _head_tiles(i: dict, cfg: dict, kind: str):
    """fp8_head_tiles with cfg, checked against float64 on first use (None: does not apply)."""
    from fxfuse.kernels import gemm_split_cat as kernels

    got = kernels.fp8_head_tiles(*i["gemm"], i["d"], i["s1"], i["s2"], i["y"], config=cfg)
    if got is not None and not i.setdefault("_checked", set()) >= {id(cfg)}:
        c, s1 = reference(kind, i), i["s1"]
        errors = [((got[0][..., :s1].double() - c[..., :s1]).norm() / c[..., :s1].norm()).item(),
                  ((got[1].double() - c[..., s1:]).norm() / c[..., s1:].norm()).item()]  # fmt: skip
        if max(errors) > 1e-2 or not torch.equal(got[0][..., s1:], i["y"]):
            raise AssertionError(f"fp8 head tiles wrong with {cfg}: {errors}")
        i["_checked"].add(id(cfg))
    return got


def backend(kind: str, i: dict) -> str:
    if kind == "mxfp4":
        return "triton"
    vendor = gemm_ops._vendor_kind(*i["gemm"], BF16)
    if not vendor:
        return "triton"
    from fxfuse.kernels import gemm_split_cat as kernels
    from fxfuse.runtime import gemm_split_cat_ops

    takes = vendor == "rowwise" and gemm_split_cat_ops._fp8_head_tiles_take(i["gemm"][0])
    q, w = i["gemm"][0], i["gemm"][2]
    cfg = {**kernels.fp8_head_tile_config(q.shape[0]), "PERSISTENT": 1,
           "BLOCK_N": i["s1"] + i["s2"]}  # fmt: skip
    if takes and kernels._head_tiles_apply(q, w, i["d"], [i["s1"], i["s2"]], i["y"], cfg):
        return "fp8-head-tiles"
    return "vendor+copy"


def time_us_eager(fn) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3


def time_us(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3


def bench_case(kind: str, name: str, m: int, shape: dict, device, compiled) -> dict:
    sets = input_sets(kind, m, shape, device)
    fns = calls(kind)
    error = check(kind, sets[0], fns)
    timed = {key: rotating(sets, fn) for key, fn in fns.items()}
    if kind == "fp8_rowwise" and compiled is not None:

        def inductor(i):
            return compiled(*i["gemm"], i["d"], i["s1"], i["s2"], i["y"])

        timed["inductor"] = rotating(sets, inductor)
        timed["inductor"]()  # compile outside the timing
    if HEAD_CONFIGS and kind.startswith("fp8") and m >= HEAD_TILES_MIN_M:
        for label, cfg in HEAD_TILE_CONFIGS.items():
            try:
                applies = _head_tiles(sets[0], cfg, kind) is not None
            except triton.runtime.errors.OutOfResources as err:
                print(f"head tiles {label}: {err}", flush=True)
                continue
            if applies:
                timed[f"head_tiles_{label}"] = rotating(
                    sets, lambda i, c=cfg: _head_tiles(i, c, kind)
                )
    # The head-tile configs by do_bench (the op's own column is a CUDA graph): a capture failed
    # once with an unfitting config among them (2026-12-06, triton 3.6; one call alone captured).
    us = {key: (time_us(fn) if not key.startswith("head") else time_us_eager(fn))
          for key, fn in timed.items()}  # fmt: skip
    us["fxfuse_again"] = time_us(timed["fxfuse"])  # the same thing twice: the noise floor
    row = {
        "case": f"{name}_{kind}",
        "shape": {"m": m, "n": shape["d"] * (shape["s1"] + shape["s2"]), **shape},
        "fxfuse_us": round(us.pop("fxfuse"), 2),
        "peers_us": {key: round(value, 2) for key, value in us.items()},
        "backend_chosen": backend(kind, sets[0]),
        "timing": "cudagraph",
        "max_rel_error": error,
    }
    p = row["peers_us"]
    ind = f"{p['inductor']:9.2f}" if "inductor" in p else f"{'-':>9}"
    print(
        f"{row['case']:<18} {m:>6} {row['fxfuse_us']:9.2f} {p['fxfuse_again']:9.2f} "
        f"{p['epilogue']:9.2f} {p['unfused']:9.2f} {p['gemm']:9.2f} {ind} "
        f"{p['unfused'] / row['fxfuse_us']:6.2f} {row['fxfuse_us'] / p['gemm']:6.2f}  "
        f"{row['backend_chosen']}  "
        + " ".join(f"{k[11:]} {v:.2f}" for k, v in p.items() if k.startswith("head_tiles_")),
        flush=True,
    )
    return row


def cpu_smoke() -> None:
    shape = {"k": 128, "d": 2, "s1": 64, "s2": 64, "s3": 16}
    for kind in KINDS:
        i = make_inputs(kind, 5, shape, torch.device("cpu"))
        print(kind, "max rel error", check(kind, i, calls(kind)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder for <suite>.json (default: none)")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes in the interpreter")
    parser.add_argument("--m", default=None, help="kv_b M values, comma-separated")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument(
        "--head-configs",
        action="store_true",
        help="also time each FP8 head-tile config by do_bench (M >= 4096)",
    )
    parser.add_argument(
        "--head-tiles-from",
        type=int,
        default=None,
        help="the ops take the FP8 head tiles from this M (sm90) for this run",
    )
    args = parser.parse_args()
    global HEAD_CONFIGS
    HEAD_CONFIGS = args.head_configs
    if args.head_tiles_from is not None:
        from fxfuse.kernels import gemm_split_cat as kernels

        kernels.FP8_HEAD_TILES_MIN_M["sm90"] = args.head_tiles_from
    if args.cpu_smoke:
        cpu_smoke()
        return
    device = torch.device("cuda")
    ms = [int(v) for v in args.m.split(",")] if args.m else list(KV_B_MS)
    kinds = args.kinds.split(",")
    compiled = inductor_chain()
    print(
        f"{'case':<18} {'m':>6} {'fxfuse':>9} {'again':>9} {'epilogue':>9} {'unfused':>9} "
        f"{'gemm':>9} {'inductor':>9} {'unf/fx':>6} {'fx/gemm':>6}  backend"
    )
    rows = []
    for kind in kinds:
        cases = [("kv_b", m, KV_B) for m in ms] + [("other", m, OTHER) for m in OTHER_MS]
        for name, m, shape in cases:
            try:
                rows.append(bench_case(kind, name, m, shape, device, compiled))
            except Exception as err:  # noqa: BLE001 - report the row, go on with the others
                print(f"{name}_{kind} m={m}: FAILED {type(err).__name__}: {err}", flush=True)
                rows.append({"case": f"{name}_{kind}", "shape": {"m": m, **shape},
                             "error": f"{type(err).__name__}: {err}"})  # fmt: skip
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        result = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "date": datetime.date.today().isoformat(),
            "command": "PYTHONPATH=. python benchmarks/bench_gemm_split_cat_quant.py "
            + " ".join(sys.argv[1:]),
            "rows": rows,
        }
        with open(os.path.join(args.out, f"{SUITE}.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
