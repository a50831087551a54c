"""Can a persistent, TMA-fed Triton GEMM → split → cat reach cuBLAS's GEMM time at kv_b (K 512)?

Question for issue 4 (≤ 1.1× the GEMM alone, ≥ 1.25× Inductor at M ≥ 8192). The shipped kernel
is one program per tile with pointer loads (99 µs at M 8192 against cuBLAS's 57). This probe
times, in CUDA graphs at kv_b (M×4096×512, D 16, S 128/128/64, y an expand):
- `plain`: a persistent TMA GEMM into one contiguous (M, N) output: Triton's ceiling here;
- `fused`: the same GEMM whose tiles are TMA-stored straight into out[:, d, :S1] and c2, the tile
  that starts a head's S1 piece also copying that head's y slice into out[:, d, S1:];
over block shapes, pipeline depths, warps, warp specialization and loop flattening; against
F.linear (cuBLAS), the shipped op and Inductor's compile of the unfused chain. Every fused
variant is checked against F.linear + split + cat (≤ 1e-2 relative) before it is timed.

    PYTHONPATH=. python benchmarks/experiments/split_cat_persistent.py --out $OUT
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
import triton.testing
from triton.tools.tensor_descriptor import TensorDescriptor

D, S1, S2, S3, K = 16, 128, 128, 64, 512

# fmt: off


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    group = GROUP_M * num_pid_n
    first_m = (tile_id // group) * GROUP_M
    group_size = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % group) % group_size
    pid_n = (tile_id % group) // group_size
    return pid_m, pid_n


@triton.jit
def _store_piece(
    vals, m0, n, out_desc, c2_desc, y_ptr, out_ptr,
    M, SW, S1, LD0, ROW, stride_ym, stride_yd, stride_ys,
    BM: tl.constexpr, BLOCK_S3: tl.constexpr,
):
    d = n // SW
    s = n % SW
    if s < S1:
        out_desc.store([m0, d * LD0 + s], vals)
        if s == 0:  # this head's y slice goes with its first S1 tile
            rows = (m0 + tl.arange(0, BM)).to(tl.int64)
            cols = tl.arange(0, BLOCK_S3)
            mask = (rows < M)[:, None]
            yv = tl.load(
                y_ptr + (rows * stride_ym + d * stride_yd)[:, None] + cols[None, :] * stride_ys,
                mask=mask,
            )
            dst = out_ptr + rows[:, None] * ROW + d * LD0 + S1
            tl.store(dst + cols[None, :], yv, mask=mask)
    else:
        c2_desc.store([m0, d * (SW - S1) + s - S1], vals)


@triton.jit
def _persistent_kernel(
    x_desc, w_desc, out_desc, c2_desc, y_ptr, out_ptr,
    M, N, K, SW, S1, LD0, ROW,
    stride_ym, stride_yd, stride_ys,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr, EPI_SPLIT: tl.constexpr, BLOCK_S3: tl.constexpr,
    FLATTEN: tl.constexpr, WS: tl.constexpr, PLAIN: tl.constexpr, DOT_F32: tl.constexpr,
):
    start = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BK)
    for tile_id in tl.range(start, num_tiles, NUM_SMS, flatten=FLATTEN, warp_specialize=WS):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        m0 = pid_m * BM
        n0 = pid_n * BN
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(k_tiles):
            a = x_desc.load([m0, ki * BK])
            b = w_desc.load([n0, ki * BK])
            if DOT_F32:  # the interpreter multiplies bf16 as raw integers
                acc = tl.dot(a.to(tl.float32), b.T.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b.T, acc)
        vals = acc.to(tl.bfloat16)
        if PLAIN:
            out_desc.store([m0, n0], vals)
        elif EPI_SPLIT == 1:
            _store_piece(vals, m0, n0, out_desc, c2_desc, y_ptr, out_ptr, M, SW, S1, LD0, ROW,
                         stride_ym, stride_yd, stride_ys, BM, BLOCK_S3)
        else:
            halves = tl.permute(tl.reshape(vals, (BM, 2, BN // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            _store_piece(left, m0, n0, out_desc, c2_desc, y_ptr, out_ptr, M, SW, S1, LD0, ROW,
                         stride_ym, stride_yd, stride_ys, BM, BLOCK_S3)
            _store_piece(right, m0, n0 + BN // 2, out_desc, c2_desc, y_ptr, out_ptr, M, SW, S1,
                         LD0, ROW, stride_ym, stride_yd, stride_ys, BM, BLOCK_S3)



@triton.jit
def _halves(v, BM: tl.constexpr, W: tl.constexpr):
    return tl.split(tl.permute(tl.reshape(v, (BM, 2, W // 2)), (0, 2, 1)))


@triton.jit
def _copy_y_tile(y_ptr, out_ptr, y_desc, m0, d, M, LD0, ROW, S1, stride_ym, stride_yd, stride_ys,
                 BM: tl.constexpr, BLOCK_S3: tl.constexpr, Y_MODE: tl.constexpr):
    rows = (m0 + tl.arange(0, BM)).to(tl.int64)
    cols = tl.arange(0, BLOCK_S3)
    mask = (rows < M)[:, None]
    yv = tl.load(y_ptr + (rows * stride_ym + d * stride_yd)[:, None] + cols[None, :] * stride_ys,
                 mask=mask)
    if Y_MODE == 1:
        tl.store(out_ptr + rows[:, None] * ROW + d * LD0 + S1 + cols[None, :], yv, mask=mask)
    elif Y_MODE == 2:
        y_desc.store([m0, d * LD0 + S1], yv)


@triton.jit
def _head_tile_kernel(
    x_desc, w_desc, out_desc, c2_desc, y_desc, y_ptr, out_ptr,
    M, N, K, SW, S1, LD0, ROW,
    stride_ym, stride_yd, stride_ys,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr, EPI_SPLIT: tl.constexpr, BLOCK_S3: tl.constexpr,
    FLATTEN: tl.constexpr, WS: tl.constexpr, Y_MODE: tl.constexpr, DOT_F32: tl.constexpr,
):
    """BN == SW = 2·S1 = 2·S2: a tile is one head, its left half out's, its right half c2's."""
    start = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BK)
    for tile_id in tl.range(start, num_tiles, NUM_SMS, flatten=FLATTEN, warp_specialize=WS):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        m0 = pid_m * BM
        n0 = pid_n * BN
        d = pid_n
        if Y_MODE >= 3:  # y's tile is loaded before the K loop: its latency hides behind it
            y_rows = (m0 + tl.arange(0, BM)).to(tl.int64)
            y_cols = tl.arange(0, BLOCK_S3)
            y_mask = (y_rows < M)[:, None]
            yv = tl.load(y_ptr + (y_rows * stride_ym + d * stride_yd)[:, None]
                         + y_cols[None, :] * stride_ys, mask=y_mask)
        if Y_MODE == 5:  # the y slice is copied before the K loop: its stores overlap the MMAs
            tl.store(out_ptr + y_rows[:, None] * ROW + d * LD0 + S1 + y_cols[None, :], yv,
                     mask=y_mask)
        elif Y_MODE == 6:
            y_desc.store([m0, d * LD0 + S1], yv)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(k_tiles):
            a = x_desc.load([m0, ki * BK])
            b = w_desc.load([n0, ki * BK])
            if DOT_F32:
                acc = tl.dot(a.to(tl.float32), b.T.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b.T, acc)
        vals = acc.to(tl.bfloat16)
        left, right = _halves(vals, BM, BN)
        if EPI_SPLIT == 2:
            out_desc.store([m0, d * LD0], left)
            c2_desc.store([m0, d * S1], right)
        else:
            l0, l1 = _halves(left, BM, BN // 2)
            r0, r1 = _halves(right, BM, BN // 2)
            out_desc.store([m0, d * LD0], l0)
            out_desc.store([m0, d * LD0 + BN // 4], l1)
            c2_desc.store([m0, d * S1], r0)
            c2_desc.store([m0, d * S1 + BN // 4], r1)
        if Y_MODE == 3:
            tl.store(out_ptr + y_rows[:, None] * ROW + d * LD0 + S1 + y_cols[None, :], yv,
                     mask=y_mask)
        elif Y_MODE == 4:
            y_desc.store([m0, d * LD0 + S1], yv)
        elif Y_MODE == 1 or Y_MODE == 2:
            _copy_y_tile(y_ptr, out_ptr, y_desc, m0, d, M, LD0, ROW, S1,
                         stride_ym, stride_yd, stride_ys, BM, BLOCK_S3, Y_MODE)


# fmt: on


def run_variant(x, w, y, cfg, plain, num_sms):
    m = x.shape[0]
    n = w.shape[0]
    bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
    sub = bn // cfg["EPI_SPLIT"]
    x_desc = TensorDescriptor.from_tensor(x, [bm, bk])
    w_desc = TensorDescriptor.from_tensor(w, [bn, bk])
    if plain:
        c = torch.empty(m, n, dtype=x.dtype, device=x.device)
        out_desc = TensorDescriptor.from_tensor(c, [bm, bn])
        c2_desc, out, c2 = out_desc, c, c
    else:
        out = torch.empty(m, D, S1 + S3, dtype=x.dtype, device=x.device)
        c2 = torch.empty(m, D, S2, dtype=x.dtype, device=x.device)
        out_desc = TensorDescriptor.from_tensor(out.view(m, -1), [bm, sub])
        c2_desc = TensorDescriptor.from_tensor(c2.view(m, -1), [bm, sub])
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    grid = (min(num_sms, tiles),)

    def launch():
        _persistent_kernel[grid](
            x_desc, w_desc, out_desc, c2_desc, y, out,
            m, n, K, S1 + S2, S1, S1 + S3, D * (S1 + S3),
            *y.stride(),
            BM=bm, BN=bn, BK=bk, GROUP_M=8, NUM_SMS=num_sms, EPI_SPLIT=cfg["EPI_SPLIT"],
            BLOCK_S3=S3, FLATTEN=cfg["FLATTEN"], WS=cfg["WS"], PLAIN=plain,
            DOT_F32=os.environ.get("TRITON_INTERPRET") == "1",
            num_warps=cfg["warps"], num_stages=cfg["stages"],
        )  # fmt: skip

    return launch, out, c2


def run_head_tile(x, w, y, cfg, num_sms):
    m, n = x.shape[0], w.shape[0]
    bm, bn, bk = cfg["BM"], 2 * S1, cfg["BK"]
    sub = bn // cfg["EPI_SPLIT"]
    x_desc = TensorDescriptor.from_tensor(x, [bm, bk])
    w_desc = TensorDescriptor.from_tensor(w, [bn, bk])
    out = torch.empty(m, D, S1 + S3, dtype=x.dtype, device=x.device)
    c2 = torch.empty(m, D, S2, dtype=x.dtype, device=x.device)
    out_desc = TensorDescriptor.from_tensor(out.view(m, -1), [bm, sub])
    c2_desc = TensorDescriptor.from_tensor(c2.view(m, -1), [bm, sub])
    y_desc = TensorDescriptor.from_tensor(out.view(m, -1), [bm, S3])
    grid = (min(num_sms, triton.cdiv(m, bm) * D),)

    def launch():
        _head_tile_kernel[grid](
            x_desc, w_desc, out_desc, c2_desc, y_desc, y, out,
            m, n, K, S1 + S2, S1, S1 + S3, D * (S1 + S3),
            *y.stride(),
            BM=bm, BN=bn, BK=bk, GROUP_M=cfg.get("GROUP_M", 8), NUM_SMS=num_sms,
            EPI_SPLIT=cfg["EPI_SPLIT"], BLOCK_S3=S3, FLATTEN=cfg["FLATTEN"], WS=cfg["WS"],
            Y_MODE=cfg["Y_MODE"], DOT_F32=os.environ.get("TRITON_INTERPRET") == "1",
            num_warps=cfg["warps"], num_stages=cfg["stages"],
        )  # fmt: skip

    return launch, out, c2


def us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=30)


def reference(x, w, y):
    c = F.linear(x, w).view(x.shape[0], D, S1 + S2)
    c1, c2 = c.split([S1, S2], -1)
    return torch.cat([c1, y], -1), c2


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep-m", type=int, default=8192)
    parser.add_argument("--m", default="1024,4096,8192,16384,32768")
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--out", default=None)
    parser.add_argument("--suite", choices=("general", "head", "head-scale"), default="general")
    args = parser.parse_args()
    if args.suite == "head":
        return main_head(args)
    if args.suite == "head-scale":
        return main_head_scale(args)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)

    def inputs(m):
        x = torch.randn(m, K, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(D * (S1 + S2), K, dtype=torch.bfloat16, device="cuda") / K**0.5
        y = torch.randn(m, 1, S3, dtype=torch.bfloat16, device="cuda").expand(m, D, S3)
        return x, w, y

    space = [
        dict(BM=128, BN=bn, BK=bk, stages=st, warps=wp, WS=ws, FLATTEN=fl, EPI_SPLIT=es)
        for bn, bk, st, wp, (ws, fl), es in itertools.product(
            (128, 256), (64, 128), (3, 4), (4, 8), ((False, False), (False, True), (True, False)),
            (1, 2),
        )
        if not (bn == 128 and es == 2)
        and not (bn == 256 and (wp == 4 or (bk == 128 and st == 4)))
    ]
    rows, errors = [], []
    x, w, y = inputs(args.sweep_m)
    ref_out, ref_c2 = reference(x, w, y)
    print(f"sweep at M={args.sweep_m}: {len(space)} configs x 2, {num_sms} SMs", flush=True)
    t0 = time.time()
    for plain in (True, False):
        for cfg in space:
            if plain and cfg["EPI_SPLIT"] == 2:
                continue
            name = ("plain " if plain else "fused ") + json.dumps(cfg, sort_keys=True)
            try:
                launch, out, c2 = run_variant(x, w, y, cfg, plain, num_sms)
                launch()
                torch.cuda.synchronize()
                if plain:
                    err = rel(out, F.linear(x, w))
                else:
                    err = max(rel(out, ref_out), rel(c2, ref_c2))
                if not err <= 1e-2:
                    raise RuntimeError(f"wrong result: rel err {err:.3e}")
                t = us(launch)
            except Exception as exc:  # noqa: BLE001 - a probe: record and go on
                errors.append({"variant": name, "error": str(exc).splitlines()[0][:300]})
                print(f"FAIL {name}: {errors[-1]['error']}", flush=True)
                continue
            rows.append({"m": args.sweep_m, "plain": plain, **cfg, "us": round(t, 2),
                         "rel_err": err})  # fmt: skip
            print(f"{t:8.2f} us  err {err:.1e}  {name}", flush=True)
            if args.out:
                with open(os.path.join(args.out, "sweep_partial.json"), "w") as f:
                    json.dump({"sweep": rows, "errors": errors}, f)
    print(f"sweep took {time.time() - t0:.0f}s", flush=True)

    best = {}
    for plain in (True, False):
        ranked = sorted((r for r in rows if r["plain"] == plain), key=lambda r: r["us"])
        best[plain] = [
            {k: r[k] for k in ("BM", "BN", "BK", "stages", "warps", "WS", "FLATTEN", "EPI_SPLIT")}
            for r in ranked[: args.top]
        ]
    from fxfuse.kernels import gemm_split_cat as kernel_mod
    from fxfuse.runtime import gemm_split_cat_ops

    def unfused(x, w, y):
        return reference(x, w, y)

    compiled = torch.compile(unfused, backend="inductor", dynamic=False)
    scaling = []
    for m in (int(v) for v in args.m.split(",")):
        x, w, y = inputs(m)
        row = {"m": m}
        row["F.linear"] = us(lambda: F.linear(x, w))
        row["shipped kernel"] = us(lambda: kernel_mod.gemm_split_cat(x, w, D, S1, S2, y))
        row["vendor path"] = us(lambda: gemm_split_cat_ops._vendor_split_cat(x, w, D, S1, S2, y))
        compiled(x, w, y)
        row["inductor"] = us(lambda: compiled(x, w, y))
        ref_out, ref_c2 = reference(x, w, y)
        for plain in (True, False):
            for i, cfg in enumerate(best[plain]):
                launch, out, c2 = run_variant(x, w, y, cfg, plain, num_sms)
                launch()
                torch.cuda.synchronize()
                if not plain:
                    err = max(rel(out, ref_out), rel(c2, ref_c2))
                    assert err <= 1e-2, (m, cfg, err)
                row[f"{'plain' if plain else 'fused'}#{i}"] = us(launch)
        scaling.append({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()})
        print(json.dumps(scaling[-1]), flush=True)
    print("best configs:", json.dumps({("plain" if k else "fused"): v for k, v in best.items()}))
    if args.out:
        with open(os.path.join(args.out, "split_cat_persistent.json"), "w") as f:
            best_json = {str(k): v for k, v in best.items()}
            json.dump({"sweep": rows, "errors": errors, "best": best_json, "scaling": scaling}, f,
                      indent=1)  # fmt: skip
    return 0


def main_head(args) -> int:
    """The head-tile kernel (a tile is one head): its sweep at --sweep-m, then the best over M."""
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)

    def inputs(m):
        x = torch.randn(m, K, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(D * (S1 + S2), K, dtype=torch.bfloat16, device="cuda") / K**0.5
        y = torch.randn(m, 1, S3, dtype=torch.bfloat16, device="cuda").expand(m, D, S3)
        return x, w, y

    space = [
        dict(BM=128, BK=bk, stages=st, warps=8, WS=ws, FLATTEN=fl, EPI_SPLIT=es, Y_MODE=ym)
        for bk, st, (ws, fl), es, ym in itertools.product(
            (64, 128), (3, 4), ((False, False), (False, True), (True, False)), (2, 4), (0, 1, 2)
        )
        if not (bk == 128 and st == 4) and not (ym == 0 and es == 4)
    ]
    rows, errors = [], []
    x, w, y = inputs(args.sweep_m)
    ref_out, ref_c2 = reference(x, w, y)
    print(f"head sweep at M={args.sweep_m}: {len(space)} configs", flush=True)
    for cfg in space:
        name = json.dumps(cfg, sort_keys=True)
        try:
            launch, out, c2 = run_head_tile(x, w, y, cfg, num_sms)
            launch()
            torch.cuda.synchronize()
            got = out if cfg["Y_MODE"] else out[:, :, :S1]
            want = ref_out if cfg["Y_MODE"] else ref_out[:, :, :S1]
            err = max(rel(got, want), rel(c2, ref_c2))
            if not err <= 1e-2:
                raise RuntimeError(f"wrong result: rel err {err:.3e}")
            t = us(launch)
        except Exception as exc:  # noqa: BLE001 - a probe: record and go on
            errors.append({"variant": name, "error": str(exc).splitlines()[0][:300]})
            print(f"FAIL {name}: {errors[-1]['error']}", flush=True)
            continue
        rows.append({"m": args.sweep_m, **cfg, "us": round(t, 2), "rel_err": err})
        print(f"{t:8.2f} us  {name}", flush=True)
    ranked = sorted((r for r in rows if r["Y_MODE"]), key=lambda r: r["us"])
    best = [{k: r[k] for k in space[0]} for r in ranked[: args.top]]
    plain_cfg = dict(BM=128, BN=256, BK=64, stages=3, warps=8, WS=False, FLATTEN=True, EPI_SPLIT=1)
    compiled = torch.compile(reference, backend="inductor", dynamic=False)
    scaling = []
    for m in (int(v) for v in args.m.split(",")):
        x, w, y = inputs(m)
        row = {"m": m, "F.linear": us(lambda: F.linear(x, w))}
        launch, _, _ = run_variant(x, w, y, plain_cfg, True, num_sms)
        row["plain"] = us(launch)
        compiled(x, w, y)
        row["inductor"] = us(lambda: compiled(x, w, y))
        ref_out, ref_c2 = reference(x, w, y)
        for i, cfg in enumerate(best):
            launch, out, c2 = run_head_tile(x, w, y, cfg, num_sms)
            launch()
            torch.cuda.synchronize()
            err = max(rel(out, ref_out), rel(c2, ref_c2))
            assert err <= 1e-2, (m, cfg, err)
            row[f"head#{i}"] = us(launch)
        scaling.append({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()})
        print(json.dumps(scaling[-1]), flush=True)
    print("best head configs:", json.dumps(best))
    if args.out:
        with open(os.path.join(args.out, "split_cat_head_tile.json"), "w") as f:
            json.dump({"sweep": rows, "errors": errors, "best": best, "scaling": scaling}, f,
                      indent=1)  # fmt: skip
    return 0


def main_head_scale(args) -> int:
    """A few head-tile variants at every M against cuBLAS, the shipped op and Inductor."""
    from fxfuse.runtime import gemm_split_cat_ops  # noqa: F401 - registers the op

    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)
    base = dict(BK=64, warps=8, WS=False, FLATTEN=True, EPI_SPLIT=2)
    variants = {
        "bm128_s3_y1": dict(base, BM=128, stages=3, Y_MODE=1),
        "bm128_s3_y5": dict(base, BM=128, stages=3, Y_MODE=5),
        "bm128_s3_y6": dict(base, BM=128, stages=3, Y_MODE=6),
        "bm128_s2_y1": dict(base, BM=128, stages=2, Y_MODE=1),
        "bm128_s3_y1_g4": dict(base, BM=128, stages=3, Y_MODE=1, GROUP_M=4),
        "bm128_s3_y1_g16": dict(base, BM=128, stages=3, Y_MODE=1, GROUP_M=16),
        "bm128_s3_y1_g1": dict(base, BM=128, stages=3, Y_MODE=1, GROUP_M=1),
    }
    if args.top == 3:  # the earlier set
        variants.update({
            "bm128_s3_y3": dict(base, BM=128, stages=3, Y_MODE=3),
        "bm128_s3_y4": dict(base, BM=128, stages=3, Y_MODE=4),
        "bm128_s4_y3": dict(base, BM=128, stages=4, Y_MODE=3),
        "bm64_w4_s3_y3": dict(base, BM=64, warps=4, stages=3, Y_MODE=3),
        "bm64_w4_s4_y3": dict(base, BM=64, warps=4, stages=4, Y_MODE=3),
        "bm64_w8_s4_y3": dict(base, BM=64, warps=8, stages=4, Y_MODE=3),
    })
    for limit in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 64)
    compiled = torch.compile(reference, backend="inductor", dynamic=False)
    scaling, errors = [], []
    for m in (int(v) for v in args.m.split(",")):
        x = torch.randn(m, K, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(D * (S1 + S2), K, dtype=torch.bfloat16, device="cuda") / K**0.5
        y = torch.randn(m, 1, S3, dtype=torch.bfloat16, device="cuda").expand(m, D, S3)
        row = {"m": m, "F.linear": us(lambda: F.linear(x, w))}
        row["op"] = us(lambda: torch.ops.fxfuse.gemm_split_cat(x, w, D, S1, S2, y))
        compiled(x, w, y)
        row["inductor"] = us(lambda: compiled(x, w, y))
        ref_out, ref_c2 = reference(x, w, y)
        for name, cfg in variants.items():
            try:
                launch, out, c2 = run_head_tile(x, w, y, cfg, num_sms)
                launch()
                torch.cuda.synchronize()
                err = max(rel(out, ref_out), rel(c2, ref_c2))
                if not err <= 1e-2:
                    raise RuntimeError(f"wrong result: rel err {err:.3e}")
                row[name] = us(launch)
            except Exception as exc:  # noqa: BLE001 - a probe: record and go on
                errors.append({"m": m, "variant": name, "error": str(exc).splitlines()[0][:300]})
                print(f"FAIL {m} {name}: {errors[-1]['error']}", flush=True)
        scaling.append({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()})
        print(json.dumps(scaling[-1]), flush=True)
    if args.out:
        with open(os.path.join(args.out, "split_cat_head_scale.json"), "w") as f:
            json.dump({"variants": variants, "scaling": scaling, "errors": errors}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
