"""Prequant GEMMs at decode M: quantizing only the rows that exist.

The prequant kernels (A16WFP4 `gemm_a16wfp4`, A16W8 `gemm_a16w8` per-token and 1×128) quantize
their activation tile in every program, once per K-tile. With M = 1 in a 16-row tile they used to
quantize 16 rows, 15 of them padding; now a program quantizes quant_rows(M) rows (the power of
two ≥ M, with a floor per kernel: `prequant_rows`) and repeats them over the tile. This times
"rows" (the shipped code) and "full" (QUANT_ROWS = BLOCK_M, the old work) at the DeepSeek
shapes of bench_gemm_fp8, alternating, and the bf16 F.linear / quant + _scaled_mm peers;
`--floors 1,2,4,8` times "qrN" (at least N rows) instead of "rows"; `--tables` times the
A16WFP4 decode with its tables as operands ("tables") against written into the PTX
("written"). Each case is checked against its reference (bench_gemm_*.make_case) under every
variant before it is timed.

    PYTHONPATH=. python benchmarks/experiments/decode_rows.py --out $OUT

µs per call in CUDA graphs over inputs rotated past the L2 (bench_gemm_fp8.time_us); the
better of `--rounds` (default 2) per variant.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

import torch
import triton

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

CASES = ("a16wfp4", "a16w8_pertoken", "a16w8_group128")
VARIANTS = ("rows", "full")
# --floors: "qrN" variants, at least N rows quantized (a power of two >= M, capped at BLOCK_M).


def _rows_for(variant: str):
    """quant_rows for a variant; the kernels' prequant_rows policies call it (A16W8 1x128 never
    does: it always quantizes the whole tile)."""
    shipped = _SHIPPED["shipped"]
    if variant == "rows":
        return shipped
    if variant == "full":
        return lambda m, block_m, floor=1: block_m
    least = 2 if variant == "min2" else int(variant[2:])
    return lambda m, block_m, floor=1: min(block_m, max(least, shipped(m, block_m, floor)))


def _set_variant(variant: str) -> None:
    """Patch the kernel modules for a variant: a row policy, or (--tables) the A16WFP4 e2m1
    decode's tables as operands ("tables") or written into its PTX ("written", the default)."""
    from fxfuse.kernels import gemm_fp8, gemm_mxfp4

    if "shipped" not in _SHIPPED:
        _SHIPPED["shipped"] = gemm_fp8.quant_rows
    gemm_mxfp4.PTX_TABLE_OPERANDS = variant == "tables"
    rows = _rows_for("rows" if variant in ("tables", "written") else variant)
    gemm_fp8.quant_rows = rows
    gemm_mxfp4.quant_rows = rows


def _make(case, m, n, k):
    import bench_gemm_fp8 as fb
    import bench_gemm_mxfp4 as mb

    bench = mb if case == "a16wfp4" else fb
    return bench.make_case(case, m, n, k, None, check=True)


def _compile(job):
    case, m, n, k, variants = job
    try:
        calls, _ = _make(case, m, n, k)
        for variant in variants:
            _set_variant(variant)
            calls[0]()
        torch.cuda.synchronize()
        return None
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"[:300]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT"))
    p.add_argument("--m", default="1,4,16")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--floors", default=None,
                   help="comma list of row floors: variants full + qrN instead of rows/full/min2")
    p.add_argument("--tables", action="store_true",
                   help="variants tables / written: the A16WFP4 decode's table operands")
    args = p.parse_args(argv)
    if args.tables:
        variants = ["tables", "written"]
    elif args.floors:
        variants = ["full"] + [f"qr{v}" for v in args.floors.split(",")]
    else:
        variants = list(VARIANTS)

    import bench_gemm_fp8 as fb
    from _rows import row_writer

    header = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "date": time.strftime("%Y-%m-%d"),
              "command": " ".join(sys.argv)}
    emit = row_writer(os.path.join(args.out, "decode_rows.json") if args.out else None, header)
    ms = [int(v) for v in args.m.split(",")]
    jobs = [(c, m, n, k, variants) for c in args.cases.split(",") for n, k in fb.SHAPES
            for m in ms]
    t0 = time.time()
    with mp.get_context("spawn").Pool(min(16, os.cpu_count() or 4)) as pool:
        errors = pool.map(_compile, jobs)
    print(f"compiled {len(jobs)} cases in {time.time() - t0:.0f} s", flush=True)
    print(f"{'case':16} {'N x K':>11} {'M':>3} " + " ".join(f"{v:>7}" for v in variants)
          + f" {'bf16':>7} {'peer2':>7}")
    for job, err in zip(jobs, errors):
        case, m, n, k, _ = job
        if err:
            emit({"case": case, "m": m, "n": n, "k": k, "error": err})
            continue
        best = {v: float("inf") for v in variants}
        try:
            for variant in variants:  # each variant checked against the reference first
                _set_variant(variant)
                _make(case, m, n, k)
        except AssertionError as e:
            emit({"case": case, "m": m, "n": n, "k": k, "variant": variant, "error": str(e)})
            print(f"{case} {n}x{k} M={m} {variant}: CHECK FAILED {e}", flush=True)
            continue
        finally:
            _set_variant("rows")
        calls, peers = _make(case, m, n, k)
        for _ in range(args.rounds):
            for variant in variants:
                _set_variant(variant)
                best[variant] = min(best[variant], fb.time_us(calls, True))
        _set_variant("rows")
        bf16 = fb.time_us(peers["bf16_linear"], True)
        other = peers.get("quant+scaled_mm")
        other_us = fb.time_us(other, True) if other else None
        row = {"case": case, "m": m, "n": n, "k": k,
               **{f"{v}_us": round(t, 2) for v, t in best.items()},
               "bf16_linear_us": round(bf16, 2),
               "quant_scaled_mm_us": other_us and round(other_us, 2)}
        emit(row)
        print(f"{case:16} {n:>5}x{k:<5} {m:>3} " + " ".join(f"{best[v]:7.2f}" for v in variants)
              + f" {bf16:7.2f} {other_us or 0:7.2f}", flush=True)


_SHIPPED: dict = {}

if __name__ == "__main__":
    main()
