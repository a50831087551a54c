"""The multi-program top-k at its register-bound occupancy (issue 5).

The sm90 compile of `_topk_multi_kernel` at the catch-all entry as it was (MULTI_BLOCK 4096,
16 warps; w16 below) takes 128 registers a thread (cuobjdump --dump-resource-usage): one
512-thread program per SM, so while one program finishes its row (select + epilogue,
latency-bound) its SM streams nothing. Variants that
fit two or more programs per SM, interleaved, every one checked first (exact sets against the
reference, ties at many ranks; a variant the launcher refuses is noted and not timed):

- table: the launch table's entry (since 2026-12-05: w8nreg80 for rows longer than 32K);
- w16: the entry before it, MULTI_BLOCK 4096 x 8 chunks, 16 warps (runs 1-2's "table");
- nreg64 / nreg80: w16 with Triton's maxnreg (the sm90 compile here: 64 regs + 56 B stack,
  80 + 24 B);
- w8: MULTI_BLOCK 2048, 8 warps, 16 chunks (114-128 regs, no stack: two programs per SM), w8c8
  with 8 chunks (16K-score segments); w8nreg80 / w8nreg64: w8 capped (three / four per SM);
  w8c8nreg80; w4, w4nreg96, w4nreg128: w8 at 4 warps;
- s4, nreg64s4: w16 with the sample estimate at 4 warps (64 sample scores a thread);
- pairs, nreg64s4p: w16 with the sample's and the finishing select's bisections two bits a
  count;
- w8c4nreg80, w4c4nreg96: 8K-score segments (rows of 8K-32K);
- row: the row path (one program per row) at the table's entry, the path that many rows took
  before the 2026-12-05 runs 6-8 moved them to the multi path;
- sw16 / smp4096: the table's entry with the sample estimate at 16 warps / from 4096 scores;
  sw1 / sw2 / sw4 at 1 / 2 / 4 warps; keys / nokeys: the walk storing the candidates' scores
  forced on / off;
- r2, r2nreg96, b4096nreg80: 16 scores a thread a stream step instead of 8 (two-row chunks, or
  4096-score chunks), the same 32K-score segments; pf2: the table's entry with two chunks'
  loads in flight (MULTI_PREFETCH 2); pf3 / pf4: through Triton's pipeliner (async copies to
  shared memory), 3 / 4 stages;
- c4 / c8 / c16 / c4pf3: the table's entry with 8K / 16K / 32K-score segments; pf1: one chunk
  prefetched in registers.
- radix: the sample estimate and the finishing select by 32-bin histograms (TILE_SELECT 0).
- fk4 / fk8 / fk16: the rows finished by a second kernel (MULTI_FINISH_WARPS), one program
  of that many warps per row, after the collect kernel; fk4p with two bits a count; fused:
  the collect kernel finishes every row (MULTI_FINISH_WARPS 0). (Runs 13-14,
  2026-12-06, also timed a "ranges" finishing select, counts at 32 edges a pass then a pairwise
  rank: 1.3-1.7x slower in the collect kernel, 3.4-10x as the finish kernel; removed.)
- --module NAME=FILE.py: a patched kernels/topk.py timed as variant NAME at the table's entry;
  with --unchecked NAME it is timed without the exactness check (a measurement-only patch, such
  as a multi kernel that skips the rows' finishing select).

    PYTHONPATH=. python benchmarks/experiments/topk_occupancy.py [--out DIR] [--rounds 2]
        [--old FILE.py]  # also "old": the table's entry with kernels/topk.py as in FILE.py
                         # (and variant "oldrow": that file on the row path)
        [--shapes 16384x17920,1024x32768] [--variants row,table,w8c4nreg80]
        [--dtype bf16]

Page transform (randn scores, fp32 unless --dtype, full lengths, page size 64) in CUDA graphs,
inputs rotated past L2 as in bench_topk. Rows go to topk_occupancy.jsonl as they come.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import bench_topk as bt  # noqa: E402

from fxfuse.kernels import topk, topk_ref  # noqa: E402

# Every variant spells out the geometry it times, so the names keep their meaning as the table
# changes: W16 is the catch-all entry the 2026-12-05 runs 1-2 called "table".
W16 = {"MULTI_BLOCK": 4096, "MULTI_WARPS": 16, "MULTI_CHUNKS": 8, "MULTI_MAXNREG": 0}
W8 = {"MULTI_BLOCK": 2048, "MULTI_WARPS": 8, "MULTI_CHUNKS": 16, "MULTI_MAXNREG": 0}
VARIANTS = {
    "table": {},
    "w16": W16,
    "nreg64": {**W16, "MULTI_MAXNREG": 64},
    "nreg80": {**W16, "MULTI_MAXNREG": 80},
    "s4": {**W16, "MULTI_SAMPLE_WARPS": 4},
    "nreg64s4": {**W16, "MULTI_MAXNREG": 64, "MULTI_SAMPLE_WARPS": 4},
    "pairs": {**W16, "MULTI_BISECT_PAIRS": 1},
    "nreg64s4p": {**W16, "MULTI_MAXNREG": 64, "MULTI_SAMPLE_WARPS": 4, "MULTI_BISECT_PAIRS": 1},
    "w8": W8,
    "w8c8": {**W8, "MULTI_CHUNKS": 8},
    "w8nreg80": {**W8, "MULTI_MAXNREG": 80},
    "w8nreg64": {**W8, "MULTI_MAXNREG": 64},
    "w8c8nreg80": {**W8, "MULTI_CHUNKS": 8, "MULTI_MAXNREG": 80},
    "w4": {**W8, "MULTI_WARPS": 4},
    "w4nreg96": {**W8, "MULTI_WARPS": 4, "MULTI_MAXNREG": 96},
    "w4nreg128": {**W8, "MULTI_WARPS": 4, "MULTI_MAXNREG": 128},
    "w8c4nreg80": {**W8, "MULTI_CHUNKS": 4, "MULTI_MAXNREG": 80},
    "w4c4nreg96": {**W8, "MULTI_WARPS": 4, "MULTI_CHUNKS": 4, "MULTI_MAXNREG": 96},
    "row": {},  # the row path at the table's entry (ROW_PATH)
    # the table's entry with the sample estimate at 16 warps, or from 4096 scores
    "sw16": {"MULTI_SAMPLE_WARPS": 16},
    # the sample estimate in fewer warps: at 1 warp every count is a warp's shuffles, no
    # block barrier (16 dependent counts a row set the sample kernel's time, not the work)
    "sw1": {"MULTI_SAMPLE_WARPS": 1},
    "sw2": {"MULTI_SAMPLE_WARPS": 2},
    "sw4": {"MULTI_SAMPLE_WARPS": 4},
    # the walk storing the candidates' scores beside their indices, forced on / off (the
    # plan's rule: on where a second kernel finishes the rows and k >= 1024)
    "keys": {"MULTI_KEYS": 1},
    "nokeys": {"MULTI_KEYS": 0},
    "smp4096": {"MULTI_SAMPLE": 4096},
    # more bytes in flight a stream step (ncu, 2026-12-06: 63 % of the multi kernel's stall
    # samples wait on the stream's loads, one chunk of prefetch, 8 scores a thread)
    "r2": {**W8, "MULTI_ROWS": 2, "MULTI_CHUNKS": 8, "MULTI_MAXNREG": 80},
    "r2nreg96": {**W8, "MULTI_ROWS": 2, "MULTI_CHUNKS": 8, "MULTI_MAXNREG": 96},
    "b4096nreg80": {**W8, "MULTI_BLOCK": 4096, "MULTI_CHUNKS": 8, "MULTI_MAXNREG": 80},
    "pf2": {"MULTI_PREFETCH": 2},  # the table's entry, two chunks' loads in flight
    "pf3": {"MULTI_PREFETCH": 3},  # the table's entry through Triton's pipeliner, 3 stages
    "pf4": {"MULTI_PREFETCH": 4},
    # shorter segments (more programs a row) for few rows: at 1 x 128K the table's 32K-score
    # segments keep 4 SMs busy, each waiting on 16 chunks in turn
    "c4": {"MULTI_CHUNKS": 4},
    "c8": {"MULTI_CHUNKS": 8},
    "c4pf3": {"MULTI_CHUNKS": 4, "MULTI_PREFETCH": 3},
    "pf1": {"MULTI_PREFETCH": 1},  # the table's entry, one chunk prefetched in registers
    "c16": {"MULTI_CHUNKS": 16},  # the table's entry with 32K-score segments
    # segments sized for whole waves: at 256 x 128K the table's 32K-score segments make 1024
    # programs, 2.6 waves of 3 programs on 132 SMs (the last 59 % full); 22 chunks (45056
    # scores, 3 a row) make 768, 1.94 waves; 11 chunks (22528, 6 a row) 1536, 3.88 waves
    "c22": {"MULTI_CHUNKS": 22},
    "c11": {"MULTI_CHUNKS": 11},
    # the finishing select's counts at interpolated points (`_interp_edge`), not per bit
    "interp": {"MULTI_INTERP": 1},
    "bisect": {"MULTI_INTERP": 0},  # one count per bit (the default before 2026-12-07)
    "isample": {"MULTI_INTERP": 2},  # the sample estimate's counts interpolated too
    # the sample estimate and the finishing select by 32-bin histograms instead of bisection
    "radix": {"TILE_SELECT": 0},
    # the rows finished by a second kernel, one program of 4 / 8 / 16 warps per row
    "fk4": {"MULTI_FINISH_WARPS": 4},
    "fk8": {"MULTI_FINISH_WARPS": 8},
    "fk16": {"MULTI_FINISH_WARPS": 16},
    "fk4p": {"MULTI_FINISH_WARPS": 4, "MULTI_BISECT_PAIRS": 1},
    "fused": {"MULTI_FINISH_WARPS": 0},  # the collect kernel finishes every row
    # a 2048-pair candidate tile (k <= 512: the table's 4096 is 8x k at 512)
    "cap2048": {"MULTI_CAP": 2048},
}
# variants run with path="row" (oldrow: --old's file there); every other one with path="multi"
ROW_PATH = {"row", "oldrow"}
SHAPES = ((256, 131072), (64, 131072), (1, 131072))


def _shapes(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in item.split("x")) for item in text.split(",")]


def _path(name: str) -> str:
    return "row" if name in ROW_PATH else "multi"


def _short_rows(sets, k, short, seed):
    """The input sets with each row's length drawn in (k, short], the same draw for every set."""
    lengths = sets[0][1]
    g = torch.Generator(device=lengths.device).manual_seed(seed)
    drawn = torch.randint(k + 1, short + 1, lengths.shape, generator=g, device=lengths.device,
                          dtype=torch.int32)  # fmt: skip
    return [(scores, drawn, table) for scores, _, table in sets]


def _check_short(mod, inputs, k, config, path) -> str:
    """A variant's page transform of the short rows against the reference: "exact" or why not."""
    scores, lengths, table = inputs
    out = mod.topk_page_transform(scores, k, lengths, table, bt.PAGE_SIZE, config=config,
                                  path=path)  # fmt: skip
    ref = topk_ref.topk_page_transform_ref(scores, k, lengths, table, bt.PAGE_SIZE)
    return bt.page_verdict(out, ref)[1]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="/tmp/fxfuse_results")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--topks", default="2048,512")
    p.add_argument("--old", help="an earlier kernels/topk.py, timed as variant 'old'")
    p.add_argument("--module", action="append", default=[],
                   help="NAME=FILE.py: a patched kernels/topk.py timed as variant NAME")
    p.add_argument("--unchecked", default="", help="variants timed without the check")
    p.add_argument("--shapes", type=_shapes, default=list(SHAPES), help="rows x length list")
    p.add_argument("--dtype", choices=list(bt.DTYPES.values()), default="fp32",
                   help="the scores' dtype (bf16: the k-th score tied tens of times)")
    p.add_argument("--short", type=int, default=0, metavar="L",
                   help="each row's length drawn in (k, L] (a decode batch of short contexts "
                        "in a long bucket: rows the sample holds whole); checked and timed so")
    args = p.parse_args(argv)
    modules = {}
    if args.old:
        spec = importlib.util.spec_from_file_location("topk_old", args.old)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        modules["old"] = old
        modules["oldrow"] = old  # the same file on the row path
    for item in args.module:
        name, _, file = item.partition("=")
        spec = importlib.util.spec_from_file_location(f"topk_{name}", file)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        modules[name] = mod
    unchecked = set(filter(None, args.unchecked.split(",")))
    dtype = bt.DTYPE_BY_NAME[args.dtype]
    os.makedirs(args.out, exist_ok=True)
    device = torch.device("cuda")
    extra = [n for n in modules if n not in ("old", "oldrow")]
    names = (["old"] if args.old else []) + args.variants.split(",") + extra
    configs = {**VARIANTS, "old": {}, "oldrow": {}, **{n: {} for n in extra}}
    unknown = [n for n in names if n not in configs]
    if unknown:
        p.error(f"--variants: unknown {unknown}; expected names from {sorted(VARIANTS)}")
    path = os.path.join(args.out, "topk_occupancy.jsonl")
    for rows, length in args.shapes:
        for k in [int(v) for v in args.topks.split(",")]:
            checked = {}
            sets = bt.page_inputs(rows, length, device, seed=rows + k, dtype=dtype,
                                  copies=bt.copies_for(rows * length * 4, True))  # fmt: skip
            if args.short:
                sets = _short_rows(sets, k, args.short, seed=rows + k)
            for name in names:
                if name in unchecked:
                    checked[name] = "unchecked"  # a measurement-only patch
                    continue
                bt.topk = modules.get(name, topk)  # check_page_case calls bt.topk
                try:
                    if args.short:
                        why = _check_short(modules.get(name, topk), sets[0], k, configs[name],
                                           _path(name))  # fmt: skip
                    else:
                        ok, why = bt.check_page_case(rows, length, k, device,
                                                     config=configs[name], path=_path(name),
                                                     dtype=dtype)  # fmt: skip
                except ValueError as e:  # a variant the launcher refuses: noted, not timed
                    why = f"refused: {e}"
                except Exception as e:  # a variant that fails to compile or run: noted, not timed
                    why = f"failed: {type(e).__name__}: {str(e)[:300]}"
                checked[name] = why
            bt.topk = topk

            def make(name):
                mod, cfg = modules.get(name, topk), configs[name]
                return bt.Rotating(
                    lambda s, lens, t: mod.topk_page_transform(
                        s, k, lens, t, bt.PAGE_SIZE, config=cfg, path=_path(name)
                    ),
                    sets,
                )

            fns = {n: make(n) for n in names if checked[n] in ("exact", "unchecked")}
            for fn in fns.values():
                fn()
            torch.cuda.synchronize()
            times = {n: [] for n in fns}
            for _ in range(args.rounds):
                for n, fn in fns.items():
                    times[n].append(round(bt.time_us(fn, graph=True), 2))
            row = {"rows": rows, "length": length, "k": k, "dtype": args.dtype, "us": times,
                   **({"short": args.short} if args.short else {}),
                   "checks": checked, "roofline_us": round(
                       rows * length * dtype.itemsize / bt.COPY_BYTES_PER_US, 2)}  # fmt: skip
            print(json.dumps(row), flush=True)
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
