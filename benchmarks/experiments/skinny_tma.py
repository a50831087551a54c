"""Skinny-M A8W8 rowwise GEMM fed by TMA: how near the weight-read roofline a swapped,
split-K kernel whose operands arrive by tensor descriptors gets, against the shipped
pointer-load kernel (its launch table) and torch._scaled_mm.

The probe kernel computes outᵀ tiles (weight rows fill the MMA's M slot): each program loads
(BLOCK_N, BLOCK_K) weight and (BLOCK_M, BLOCK_K) activation tiles by TMA over its share of K
(the last share may run past K: TMA fills zeros), FP8 MMAs into an fp32 (BLOCK_N, BLOCK_M)
accumulator, and with SPLIT_K > 1 hands its partial to the last program of the tile (counter),
which applies the row and column scales and stores bf16. Every configuration is checked against
gemm_fp8_ref (relative error ≤ 1e-2) before it is timed.

    PYTHONPATH=. python benchmarks/experiments/skinny_tma.py --out $OUT          # grid, M 16 / 64
    PYTHONPATH=. python benchmarks/experiments/skinny_tma.py --cpu-smoke         # interpreter

Times are µs per call in CUDA graphs over weight copies rotated past the L2 (bench_gemm_fp8's
time_us); achieved TB/s counts weight + activation + output bytes.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import os
import sys
import time

import torch
import triton
import triton.language as tl

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None

SHAPES = [(2112, 7168), (7168, 2048), (24576, 1536), (3072, 1536), (4096, 512)]


@triton.jit(do_not_specialize=["M"])
def _skinny_fp8_tma(
    a_desc, w_desc, a_scale_ptr, w_scale_ptr, out_ptr, partial_ptr, lock_ptr,
    M, N, K, stride_om, stride_asm, stride_wsn,
    BLOCKWISE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    n0 = pid_n * BLOCK_N
    acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    k_first = pid_k * TILES_PER_SPLIT
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    mask_n = offs_n < N
    for i in tl.range(TILES_PER_SPLIT, num_stages=NUM_STAGES):
        kt = k_first + i
        w = w_desc.load([n0, kt * BLOCK_K])
        a = a_desc.load([0, kt * BLOCK_K])
        if BLOCKWISE:  # BLOCK_K == 128: one scale group per tile
            # The last split may run past K (TMA reads zeros there): its scales are not read.
            k_ok = kt * BLOCK_K < K
            a_s = tl.load(a_scale_ptr + offs_m * stride_asm + kt, mask=mask_m & k_ok, other=0.0)
            w_s = tl.load(w_scale_ptr + (offs_n // 128) * stride_wsn + kt, mask=mask_n & k_ok,
                          other=0.0)
            acc += tl.dot(w, tl.trans(a)) * (w_s[:, None] * a_s[None, :])
        else:
            acc = tl.dot(w, tl.trans(a), acc)
    is_last = True
    if SPLIT_K > 1:
        # gemm_fp8._split_k_reduce laid out for the transposed (BLOCK_N, BLOCK_M) tile, as timed
        # (calling the shipped one would add a transpose of the accumulator).
        offs = tl.arange(0, BLOCK_N)[:, None] * BLOCK_M + offs_m[None, :]
        tile_ptr = partial_ptr + pid_n.to(tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N)
        tl.store(tile_ptr + pid_k * (BLOCK_M * BLOCK_N) + offs, acc, mask=mask_m[None, :])
        tl.debug_barrier()
        arrived = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        is_last = arrived == SPLIT_K - 1
        if is_last:
            acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
            for s in tl.static_range(SPLIT_K):
                acc += tl.load(tile_ptr + s * (BLOCK_M * BLOCK_N) + offs, mask=mask_m[None, :],
                               other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(lock_ptr + pid_n, 0, sem="relaxed", scope="gpu")
    if is_last:
        if not BLOCKWISE:
            a_s = tl.load(a_scale_ptr + offs_m, mask=mask_m, other=0.0)
            w_s = tl.load(w_scale_ptr + offs_n, mask=mask_n, other=0.0)
            acc = acc * w_s[:, None] * a_s[None, :]
        ptrs = out_ptr + offs_m[None, :].to(tl.int64) * stride_om + offs_n[:, None]
        tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask_n[:, None] & mask_m[None, :])


_LOCKS = {}


def skinny_fp8(q, x_scale, w, w_scale, cfg, descs=None):
    m, k = q.shape
    n = w.shape[0]
    bm, bn, bk, sk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"], cfg["SPLIT_K"]
    assert m <= bm
    k_tiles = triton.cdiv(k, bk)
    sk = min(sk, k_tiles)
    tps = triton.cdiv(k_tiles, sk)
    sk = triton.cdiv(k_tiles, tps)
    n_tiles = triton.cdiv(n, bn)
    out = torch.empty((m, n), dtype=torch.bfloat16, device=q.device)
    if sk > 1:
        partials = torch.empty(n_tiles * sk * bm * bn, dtype=torch.float32, device=q.device)
        locks = _LOCKS.get(q.device)
        if locks is None or locks.numel() < n_tiles:
            locks = _LOCKS[q.device] = torch.zeros(max(4096, n_tiles), dtype=torch.int32,
                                                   device=q.device)
    else:
        partials = locks = out
    if descs is None:
        a_desc = TensorDescriptor(q, [m, k], [q.stride(0), 1], [bm, bk])
        w_desc = TensorDescriptor(w, [n, k], [w.stride(0), 1], [bn, bk])
    else:
        a_desc, w_desc = descs
    _skinny_fp8_tma[(n_tiles, sk)](
        a_desc, w_desc, x_scale, w_scale, out, partials, locks, m, n, k, out.stride(0),
        x_scale.stride(0), w_scale.stride(0), BLOCKWISE=x_scale.dim() == 2, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, TILES_PER_SPLIT=tps,
        NUM_STAGES=cfg["num_stages"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return out


def grid_for(m, n, k, block=False):
    bm = max(16, triton.next_power_of_2(m))
    out = []
    for bn, bk, stages in itertools.product((64, 128), (128,) if block else (128, 256), (3, 5)):
        if (bn + bm) * bk * stages > 200 * 1024:
            continue
        n_tiles = triton.cdiv(n, bn)
        k_tiles = triton.cdiv(k, bk)
        for sk in (1, 2, 3, 4, 6, 8, 12, 16):
            if sk > k_tiles:
                continue
            if n_tiles * sk > 132 * 4 or (sk > 1 and n_tiles * sk // 2 > 132 * 2):
                continue
            if n_tiles * sk < 66 and sk < k_tiles:
                continue
            out.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=4,
                            num_stages=stages))
    return out


def _inputs(m, n, k, copies, device, block=False):
    """[(q, x_scale, w, w_scale)]: rowwise scales as (M,) / (N,), blockwise as (M, K/128) /
    (N/128, K/128)."""
    import bench_gemm_fp8 as fb

    from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref

    res = []
    for w, ws, _ in fb._fp8_weights(n, k, device, block, copies):
        x = torch.randn(m, k, device=device).to(torch.bfloat16)
        q, xs = quant_fp8_ref(x, 128 if block else 0, torch.float8_e4m3fn)
        if block:
            res.append((q, xs.contiguous(), w, ws.contiguous()))
        else:
            res.append((q, xs.reshape(m).contiguous(), w, ws.reshape(n).contiguous()))
    return res


def _as_2d(a, m, n, block):
    """The (q, x_scale, w, w_scale) as gemm_fp8 / gemm_fp8_ref take them."""
    if block:
        return a
    return a[0], a[1].reshape(m, 1), a[2], a[3].reshape(n, 1)


def _rel(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def _compile(job):
    m, n, k, cfg, block = job
    dev = torch.device("cuda")
    try:
        (q, xs, w, ws), = _inputs(m, n, k, 1, dev, block)
        skinny_fp8(q, xs, w, ws, cfg)
        torch.cuda.synchronize()
        return None
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"[:200]


def run(args):
    import bench_gemm_fp8 as fb
    from _rows import row_writer

    from fxfuse.kernels.gemm_fp8 import gemm_fp8
    from fxfuse.kernels.gemm_ref import gemm_fp8_ref

    dev = torch.device("cuda")
    torch.manual_seed(0)
    header = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "date": time.strftime("%Y-%m-%d"),
              "command": " ".join(sys.argv)}
    name = f"skinny_tma_{args.kind}.json"
    emit = row_writer(os.path.join(args.out, name) if args.out else None, header)
    ms = [int(v) for v in args.m.split(",")]
    shapes = [s for s in SHAPES if args.shapes is None or f"{s[0]}x{s[1]}" in args.shapes]
    block = args.kind == "block"
    jobs = [(m, n, k, c, block) for n, k in shapes for m in ms for c in grid_for(m, n, k, block)]
    t0 = time.time()
    ctx = mp.get_context("spawn")
    with ctx.Pool(min(16, os.cpu_count() or 4)) as pool:
        errors = pool.map(_compile, jobs)
    print(f"compiled {len(jobs)} in {time.time() - t0:.0f} s, "
          f"{sum(e is not None for e in errors)} failed", flush=True)
    bad = {i: e for i, e in enumerate(errors) if e}
    for i, e in list(bad.items())[:3]:
        print("compile error", jobs[i][3], e)
    for n, k in shapes:
        for m in ms:
            copies = fb.copies_for(n * k + m * k)
            inputs = _inputs(m, n, k, copies, dev, block)
            q, xs, w, ws = inputs[0]
            ref = gemm_fp8_ref(*_as_2d(inputs[0], m, n, block), torch.float32)
            bytes_moved = n * k + m * k + 2 * m * n + 4 * (m + n)
            base = {"table": fb.time_us([lambda a=a: gemm_fp8(*_as_2d(a, m, n, block))
                                         for a in inputs], True)}
            if block:
                if fb._scaled_mm_blockwise(*inputs[0]) is not None:
                    base["scaled_mm"] = fb.time_us(
                        [lambda a=a: fb._scaled_mm_blockwise(*a) for a in inputs], True)
            else:
                base["scaled_mm"] = fb.time_us([lambda a=a: torch._scaled_mm(
                    a[0], a[2].t(), a[1].reshape(m, 1), a[3].reshape(1, n),
                    out_dtype=torch.bfloat16) for a in inputs], True)
            best = None
            for i, (jm, jn, jk, cfg, _) in enumerate(jobs):
                if (jm, jn, jk) != (m, n, k) or i in bad:
                    continue
                err = _rel(skinny_fp8(q, xs, w, ws, cfg), ref)
                if err > 1e-2:
                    emit({"m": m, "n": n, "k": k, "cfg": cfg, "error": err})
                    continue
                descs = [(TensorDescriptor(a[0], [m, k], [k, 1], [cfg["BLOCK_M"], cfg["BLOCK_K"]]),
                          TensorDescriptor(a[2], [n, k], [k, 1], [cfg["BLOCK_N"], cfg["BLOCK_K"]]))
                         for a in inputs]
                us = fb.time_us([lambda a=a, d=d: skinny_fp8(*a, cfg, d)
                                 for a, d in zip(inputs, descs)], True)
                row = {"kind": args.kind, "m": m, "n": n, "k": k, "cfg": cfg, "us": round(us, 2),
                       "tbps": round(bytes_moved / us / 1e6, 2)}
                emit(row)
                if best is None or us < best["us"]:
                    best = row
            summary = {"summary": True, "kind": args.kind, "m": m, "n": n, "k": k,
                       **{f"{a}_us": round(b, 2) for a, b in base.items()},
                       "best": best}
            emit(summary)
            print(f"== {args.kind} {n}x{k} M={m}: table {base['table']:.2f}  scaled_mm "
                  f"{base.get('scaled_mm', 0):.2f}  tma best {best and best['us']} "
                  f"{best and best['cfg']}", flush=True)


def cpu_smoke():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from fxfuse.kernels.gemm_ref import gemm_fp8_ref

    for block, m, n, k, sk in itertools.product((False, True), (3, 16), (96,), (384,), (1, 2)):
        a = _inputs(m, n, k, 1, torch.device("cpu"), block)[0]
        cfg = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=sk, num_warps=4, num_stages=2)
        out = skinny_fp8(*a, cfg)
        ref = gemm_fp8_ref(*_as_2d(a, m, n, block), torch.float32)
        print("block" if block else "rowwise", m, n, k, sk, _rel(out, ref))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT"))
    p.add_argument("--m", default="16,64")
    p.add_argument("--shapes", default=None, help="comma list of NxK")
    p.add_argument("--kind", choices=("rowwise", "block"), default="rowwise")
    p.add_argument("--cpu-smoke", action="store_true")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        cpu_smoke()
        return
    run(args)


if __name__ == "__main__":
    main()
