"""The FP8 GEMM's GEMV mode (no MMA, `GEMV: 1` in a gemm_fp8 / gemm_a16w8 config) against the
launch table's entry and torch._scaled_mm at decode M, on the DeepSeek-R1 shapes.

    PYTHONPATH=. python benchmarks/experiments/gemv_fp8.py --out RESULTS   # GPU, ~5 min

At M <= 4 the MMA kernels pad the tokens to a 16-row (or, swapped, 16-column) tile, and their
few programs (2112 x 7168 at M 1: 67 tiles x 4 K-splits) leave the weight stream far from the
copy roofline (11.3 us against 4.5 on an H100, 2026-12-07). The GEMV mode multiplies on the FP32
units instead: each program reads BLOCK_N weight rows over its K range with 16-byte loads and
keeps per-lane partial sums, so the grid can hold many small programs.

Every candidate is checked against the float reference (relative error <= 1e-2,
`bench_gemm_fp8.make_case`) before it is timed. Compiles run first in parallel worker
processes (the Triton cache then serves the timing process). Timing as bench_gemm_fp8: a CUDA
graph over rotated inputs, µs per call. Writes gemv_fp8.json under --out: per case, shape and
M, the table entry's time, every candidate's, the best, and the peers.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

SHAPES = [(2112, 7168), (3072, 1536), (4096, 512), (7168, 2048), (24576, 1536)]
CASES = ("a8w8_rowwise", "a16w8_pertoken")
TILES = ((2, 1024), (4, 512), (4, 1024), (8, 512), (8, 1024), (16, 256), (16, 512))
SPLITS = (1, 2, 4)


def candidates(m: int, k: int) -> list[dict]:
    """GEMV configs: (BLOCK_N, BLOCK_K) x K-splits (each effective split count once)."""
    from fxfuse.kernels.gemm_fp8 import split_k_plan

    out, seen = [], set()
    for (bn, bk), sk in itertools.product(TILES, SPLITS):
        split = split_k_plan(k, bk, sk)[0]
        if (bn, bk, split) in seen:
            continue
        seen.add((bn, bk, split))
        out.append({"GEMV": 1, "BLOCK_M": 8, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1,
                    "SPLIT_K": split, "num_warps": 4 if bn * bk <= 4096 else 8,
                    "num_stages": 1, "SWAP_AB": 0})
    return out


def tasks(cases, shapes, m_values):
    for case, (n, k), m in itertools.product(cases, shapes, m_values):
        yield case, m, n, k


def _warm(task) -> str:
    """Compile one (case, shape, M, config) in a worker: run it once (fills the Triton cache)."""
    import bench_gemm_fp8 as bench

    case, m, n, k, config = task
    try:
        calls, _ = bench.make_case(case, m, n, k, config, check=False)
        calls[0]()
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # noqa: BLE001 - reported, and the config is skipped when timed
        return f"{case} {m}x{n}x{k} {config}: {type(e).__name__}: {str(e)[:200]}"


def main(argv=None) -> None:
    import bench_gemm_fp8 as bench

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--shapes", default="")
    p.add_argument("--m", default="1,4")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--workers", type=int, default=min(15, os.cpu_count() or 1))
    args = p.parse_args(argv)
    shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
              if args.shapes else SHAPES)
    m_values = [int(v) for v in args.m.split(",")]
    cases = args.cases.split(",")
    work = [(c, m, n, k, cfg) for c, m, n, k in tasks(cases, shapes, m_values)
            for cfg in candidates(m, k)]
    t0 = time.time()
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        failed = [f for f in pool.imap_unordered(_warm, work, chunksize=1) if f]
    print(f"compiled {len(work)} candidates in {time.time() - t0:.0f} s; {len(failed)} failed",
          flush=True)
    for f in failed[:10]:
        print("  ", f)
    results = bench.header("PYTHONPATH=. python benchmarks/experiments/gemv_fp8.py "
                           + " ".join(sys.argv[1:]))
    for case, m, n, k in tasks(cases, shapes, m_values):
        calls, peers = bench.make_case(case, m, n, k, None)
        table_us = bench.time_us(calls, use_graph=True)
        peers_us = {name: round(bench.time_us(c, True), 2) for name, c in peers.items()
                    if c is not None and name != "fxfuse_op"}
        del calls, peers
        timed = []
        for config in candidates(m, k):
            try:
                calls, _ = bench.make_case(case, m, n, k, config)  # checked first
                timed.append((round(bench.time_us(calls, use_graph=True), 2), config))
            except Exception as e:  # noqa: BLE001 - a failed candidate is reported, not fatal
                print(f"  skip {config}: {type(e).__name__}: {str(e)[:160]}", flush=True)
            torch.cuda.empty_cache()
        timed.sort(key=lambda t: t[0])
        best_us, best = timed[0] if timed else (None, None)
        row = {"case": case, "m": m, "n": n, "k": k, "table_us": round(table_us, 2),
               "gemv_best_us": best_us, "gemv_best": best, "peers_us": peers_us,
               "gemv_all": timed}
        results["rows"].append(row)
        short = None if best is None else {key: best[key] for key in
                                           ("BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps")}
        peers = " ".join(f"{name} {us:.2f}" for name, us in peers_us.items())
        print(f"{case:<15} m={m:<3} {n}x{k}: table {table_us:7.2f}  gemv {best_us}  {short}"
              f"  | {peers}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gemv_fp8.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {path} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
