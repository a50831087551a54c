"""Skinny-M GEMMs (decode): how far more K splits and the cheaper MXFP4 decode move them.

Times gemm_a16wfp4 / gemm_mxfp4 / gemm_fp8 (a8w8 rowwise) at M = 1 and 32 on the DeepSeek shapes
of bench_gemm_fp8, each at its launch-table entry and over a grid of swapped tiles with SPLIT_K up
to 32 (the sweeps of bench_gemm_* stop at 8), every configuration checked against the reference.
`--old` runs the table entries with the kernels as they were before this experiment, patched in
before anything compiles: the split-K partials stored and summed whole (all BLOCK_M rows, not the
rows below M) and the 4-byte inline-PTX decode in both MXFP4 GEMMs (`--old-decode`: only that).

    PYTHONPATH=. python benchmarks/experiments/skinny_split.py --out $OUT          # ~2 min, H100
    PYTHONPATH=. python benchmarks/experiments/skinny_split.py --old --out $OUT    # table only
    PYTHONPATH=. python benchmarks/experiments/skinny_split.py --table-only --out $OUT
    PYTHONPATH=. python benchmarks/experiments/skinny_split.py --confirm [m32] --out $OUT
        # the 3 grid points (run 1's, or m32: the M = 32 A16WFP4 grid's) that once beat the
        # table, each against its entry, alternating, 4 rounds

Compiles run first in worker processes (they fill Triton's cache); timings then run in this one.
Rows go to skinny_split[_old|_old_decode].jsonl as they come (a run cut short keeps what it
timed). Results of 2026-12-05: benchmarks/results/skinny_split.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import sys
import time

import torch
import triton
import triton.language as tl

from fxfuse.kernels import gemm_fp8, gemm_mxfp4

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import bench_gemm_fp8 as fp8_bench  # noqa: E402
import bench_gemm_mxfp4 as fp4_bench  # noqa: E402

# The shipped reduce, captured before patch_old swaps it out of the kernel modules.
_rows_split_k_reduce = gemm_fp8._split_k_reduce


@triton.jit
def _old_split_k_reduce(
    acc,
    partial_ptr,
    lock_ptr,
    tile_id,
    pid_k,
    mask_m,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    """The reduce before this experiment: every row of the tile's partial stored and summed
    (the shipped one with all rows valid; the constant mask folds away)."""
    every_row = tl.full((BLOCK_M,), 1, tl.int1)
    return _rows_split_k_reduce(
        acc, partial_ptr, lock_ptr, tile_id, pid_k, every_row, BLOCK_M, BLOCK_N, SPLIT_K
    )


def patch_old(decode_only: bool = False) -> None:
    """The kernels as they were before this experiment (see the module doc): the 4-byte decode
    in both MXFP4 GEMMs (DECODE_PTX 4, still the kernel's A16WFP4 path) and, unless decode_only,
    the whole-tile split-K partials."""
    if not decode_only:
        gemm_fp8._split_k_reduce = _old_split_k_reduce
        gemm_mxfp4._split_k_reduce = _old_split_k_reduce
    gemm_mxfp4.PTX_PACK = {False: 4, True: 4}


CASES = ("a16wfp4", "afp4wfp4", "a8w8_rowwise")


def grid(m: int) -> list[dict | None]:
    """None (the table's entry) and swapped tiles with 8-32 K splits."""
    configs: list[dict | None] = [None]
    for bn, bk, split in itertools.product((64, 128), (128, 256), (8, 16, 32)):
        configs.append(
            {
                "BLOCK_M": 16 if m <= 16 else 32,
                "BLOCK_N": bn,
                "BLOCK_K": bk,
                "GROUP_M": 1,
                "SPLIT_K": split,
                "num_warps": 4,
                "num_stages": 3 if bn * bk > 16384 else 4,
                "SWAP_AB": 1,
            }
        )
    return configs


def _effective(case, m, n, k, config):
    """The config as launched (split reduced to a divisor of the K tiles), to drop repeats."""
    if config is None:
        return None
    from fxfuse.kernels.gemm_fp8 import split_k_plan

    c = dict(config)
    c["SPLIT_K"] = split_k_plan(k, c["BLOCK_K"], c["SPLIT_K"])[0]
    return c


def jobs(cases, m_values, table_only: bool):
    seen = set()
    for case in cases:
        for n, k in fp8_bench.SHAPES:
            for m in m_values:
                for config in [None] if table_only else grid(m):
                    eff = _effective(case, m, n, k, config)
                    key = (case, m, n, k, json.dumps(eff, sort_keys=True))
                    if key in seen:
                        continue
                    seen.add(key)
                    yield case, m, n, k, config


def _make(case, m, n, k, config, check):
    maker = fp8_bench.make_case if case.startswith("a8w8") else fp4_bench.make_case
    return maker(case, m, n, k, config, check=check)


def _compile(job):
    """Worker: one call of the configuration on one input set (fills Triton's cache)."""
    old, (case, m, n, k, config) = job
    if old:
        patch_old(decode_only=old == "decode")
    fp8_bench.copies_for = lambda bytes_per_call: 1
    try:
        calls, _ = _make(case, m, n, k, config, check=False)
        calls[0]()
        torch.cuda.synchronize()
        return None
    except Exception as e:  # noqa: BLE001 - configs the compiler rejects; timed phase skips them
        return f"{case} m={m} n={n} k={k} {config}: {type(e).__name__}: {str(e)[:200]}"


# --confirm: the table entries this experiment changed, old entry against new, interleaved.
# --confirm: run 1's grid points that beat the table entry by > 10 % (3072x1536), each against
# the entry, alternating. (On 2026-12-05 the tables held these candidates while it ran, the
# explicit configs were the entries; results/skinny_split.json "confirm" names them so.)
_SWAP_64_256 = {"BLOCK_N": 64, "BLOCK_K": 256, "GROUP_M": 1, "num_warps": 4, "SWAP_AB": 1}
CONFIRM = [
    ("a16wfp4", 1, 3072, 1536, {**_SWAP_64_256, "BLOCK_M": 16, "SPLIT_K": 6, "num_stages": 4}),
    ("afp4wfp4", 1, 3072, 1536, {**_SWAP_64_256, "BLOCK_M": 16, "SPLIT_K": 6, "num_stages": 4}),
    ("afp4wfp4", 32, 3072, 1536, {**_SWAP_64_256, "BLOCK_M": 32, "SPLIT_K": 6, "num_stages": 4}),
]
# --confirm m32: the grid points of the 2026-12-05 fourth-session M = 32 A16WFP4 grid (run 5)
# that beat the entries of the final code.
CONFIRM_M32 = [
    ("a16wfp4", 32, 7168, 2048, {**_SWAP_64_256, "BLOCK_M": 32, "SPLIT_K": 8, "num_stages": 4}),
    ("a16wfp4", 32, 3072, 1536, {**_SWAP_64_256, "BLOCK_M": 32, "SPLIT_K": 6, "num_stages": 4}),
    ("a16wfp4", 32, 2112, 7168, {**_SWAP_64_256, "BLOCK_M": 32, "BLOCK_K": 128, "SPLIT_K": 8,
                                 "num_stages": 4}),
]
CONFIRM_SETS = {"run1": CONFIRM, "m32": CONFIRM_M32}


def confirm(out_dir: str, candidates=CONFIRM, rounds: int = 4) -> None:
    """Each CONFIRM candidate against the table's entry (None), `rounds` times each, alternating,
    every call checked against the reference."""
    rows = []
    for case, m, n, k, candidate in candidates:
        made = {
            name: _make(case, m, n, k, cfg, check=True)[0]
            for name, cfg in (("candidate", candidate), ("table", None))
        }
        times = {name: [] for name in made}
        for _ in range(rounds):
            for name, calls in made.items():
                times[name].append(round(fp8_bench.time_us(calls, use_graph=True), 2))
        rows.append({"case": case, "m": m, "n": n, "k": k, "candidate": candidate, "us": times})
        print(case, m, n, k, times, flush=True)
    with open(os.path.join(out_dir, "skinny_split_confirm.json"), "w") as f:
        json.dump(rows, f, indent=1)


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="/tmp/fxfuse_results")
    p.add_argument("--old", action="store_true")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--m", default="1,32")
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--budget-s", type=float, default=480.0)
    p.add_argument("--confirm", nargs="?", const="run1", choices=sorted(CONFIRM_SETS))
    p.add_argument("--table-only", action="store_true", help="only the table entries (as --old)")
    p.add_argument("--old-decode", action="store_true", help="--old for the decode only")
    args = p.parse_args(argv)
    t0 = time.time()
    if args.confirm:
        os.makedirs(args.out, exist_ok=True)
        confirm(args.out, CONFIRM_SETS[args.confirm])
        return
    if args.old_decode:
        args.old = "decode"
    if args.old:
        patch_old(decode_only=args.old == "decode")
    cases = args.cases.split(",")
    m_values = [int(v) for v in args.m.split(",")]
    todo = list(jobs(cases, m_values, args.old or args.table_only))
    print(f"{len(todo)} configurations", flush=True)
    ctx = mp.get_context("spawn")
    with ctx.Pool(args.workers) as pool:
        for err in pool.imap_unordered(_compile, [(args.old, j) for j in todo]):
            if err:
                print("compile:", err, flush=True)
    print(f"compiled in {time.time() - t0:.0f} s", flush=True)

    os.makedirs(args.out, exist_ok=True)
    name = {"decode": "skinny_split_old_decode", True: "skinny_split_old"}.get(
        args.old, "skinny_split"
    )
    path = os.path.join(args.out, name + ".jsonl")
    peers_done = set()
    with open(path, "w") as f:
        for case, m, n, k, config in todo:
            if time.time() - t0 > args.budget_s:
                print("budget spent; stopping", flush=True)
                break
            try:
                calls, peers = _make(case, m, n, k, config, check=True)
                us = fp8_bench.time_us(calls, use_graph=True)
            except Exception as e:  # noqa: BLE001
                print(f"skip {case} m={m} n={n} k={k} {config}: {type(e).__name__}", flush=True)
                continue
            row = {
                "case": case,
                "m": m,
                "n": n,
                "k": k,
                "config": _effective(case, m, n, k, config),
                "us": round(us, 2),
                "old": args.old,
            }
            if (case, m, n, k) not in peers_done:
                peers_done.add((case, m, n, k))
                row["peers_us"] = {
                    name: round(fp8_bench.time_us(c, True), 2)
                    for name, c in peers.items()
                    if c is not None and name in ("bf16_linear", "scaled_mm")
                }
            del calls, peers
            torch.cuda.empty_cache()
            f.write(json.dumps(row) + "\n")
            f.flush()
            tag = (
                "table"
                if config is None
                else (f"bn{config['BLOCK_N']} bk{config['BLOCK_K']} sk{row['config']['SPLIT_K']}")
            )
            print(
                f"{case:13s} m={m:<3d} {n:>6d}x{k:<5d} {tag:22s} {us:8.2f} us "
                f"{row.get('peers_us', '')}",
                flush=True,
            )
    print(f"wrote {path} ({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
