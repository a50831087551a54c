"""Fused top-k → page transform / block table / mask vs the torch chain, eager and under Inductor.

    PYTHONPATH=. python benchmarks/bench_topk.py --out $OUT            # table + JSON
    PYTHONPATH=. python benchmarks/bench_topk.py --out $OUT --sweep    # sm90 launch table
    PYTHONPATH=. python benchmarks/bench_topk.py --out $OUT --path both  # row vs multi path
    PYTHONPATH=. python benchmarks/bench_topk.py --out $OUT --graph-all  # all rows in graphs
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/bench_topk.py --cpu-smoke

Cases (PERFORMANCE.md): DSA page transform (fp32 scores, full lengths, page size 64, a permuted
page table) at k in {512, 2048} over rows x length in {1x8K, 1x32K, 1x128K, 64x128K, 256x128K,
16384x17920}; the same sorted at 256x128K; a MiniMax-M3 block table and a bool top-k mask.
Peers: the torch spelling (masked_fill + torch.topk + gather / transform, or scatter into the
mask) eager and under torch.compile. Roofline: score bytes / 4.25 TB/s. Each case is checked
against the torch reference (exact sets) before it is timed. Rows under ~50 us use
do_bench_cudagraph over inputs rotated past the 60 MB L2; longer ones do_bench (it flushes L2).
--path row / multi forces one top-k kernel path for the page-transform cases (default: auto, as
the launch table dispatches); --config '{"MULTI_PREFETCH": 3}' times them with launch overrides
(a candidate table entry); --path both times the row path as fxfuse_us and the multi-program
path beside it as peers_us["fxfuse_multi"] (each checked first).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

import torch
import triton

from fxfuse.kernels import topk, topk_ref
from fxfuse.runtime import launch_tables

SUITE = "topk"
COPY_BYTES_PER_US = 4.25e12 / 1e6  # measured copy ceiling of the H200 (PERFORMANCE.md)
L2_BYTES = 60 * 2**20
GRAPH_BELOW_US = 50.0
PAGE_SIZE = 64
DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16"}  # --dtype's names
DTYPE_BY_NAME = {name: dtype for dtype, name in DTYPES.items()}
SHAPES = ((1, 8192), (1, 32768), (1, 131072), (64, 131072), (256, 131072), (16384, 17920))
TOPKS = (512, 2048)
SWEEP_SHAPES = ((1, 131072), (64, 131072), (256, 131072), (16384, 17920))
SWEEP_CONFIGS = [
    {"BLOCK": b, "RADIX_BITS": r, "PROGRAMS_PER_SM": p, "num_warps": w}
    for b, w in ((2048, 8), (4096, 8), (4096, 16), (8192, 16))
    for p in (1, 2, 4)
    for r in (5, 6)
]


# ---------------------------------------------------------------------------------------------
# the torch spellings a model would run


def page_transform_chain(scores, lengths, page_table, k, page_size=PAGE_SIZE):
    """DeepSeek-V3.2 indexer in torch: mask past the length, top-k, then the page transform."""
    cols = torch.arange(scores.shape[1], device=scores.device)
    masked = scores.masked_fill(cols[None, :] >= lengths[:, None], float("-inf"))
    idx = torch.topk(masked, k, dim=-1).indices
    idx = torch.where(idx < lengths[:, None], idx, -1)
    safe = idx.clamp(min=0)
    phys = page_table.gather(1, safe // page_size)
    return torch.where(idx >= 0, phys * page_size + safe % page_size, -1).to(torch.int32)


def block_table_chain(block_scores, positions, k, n_init=1, n_local=1, ppb=2, heads=4):
    """MiniMax-M3 style in torch: causal + forced blocks, top-k, ascending ids, pages, ctx."""
    rows, num_blocks = block_scores.shape
    pos = positions.repeat_interleave(heads)
    last = pos // 128
    cols = torch.arange(num_blocks, device=block_scores.device)
    forced = (cols[None, :] < n_init) | (cols[None, :] > (last - n_local)[:, None])
    s = block_scores.masked_fill(forced, float("inf"))
    s = s.masked_fill(cols[None, :] > last[:, None], float("-inf"))
    vals, idx = torch.topk(s, k, dim=-1)
    idx = torch.where(vals > float("-inf"), idx, num_blocks)
    blocks = idx.sort(dim=-1).values
    valid = blocks < num_blocks
    blocks = torch.where(valid, blocks, -1)
    h = torch.arange(rows, device=block_scores.device) % heads
    j = torch.arange(ppb, device=block_scores.device)
    pages = blocks[:, :, None] * ppb * heads + j * heads + h[:, None, None]
    pages = torch.where(valid[:, :, None], pages, -1).reshape(rows, -1)
    n_sel = valid.sum(-1)
    tail = (blocks == last[:, None]).any(-1).long()
    ctx = 128 * (n_sel - tail) + tail * (pos % 128 + 1)
    return blocks.int(), pages.int(), ctx.int()


def mask_chain(scores, k):
    """DeepSeek-V3.2 in HF: the top-k indices scattered into a bool mask."""
    idx = torch.topk(scores, k, dim=-1).indices
    return torch.ones_like(scores, dtype=torch.bool).scatter(-1, idx, False)


# ---------------------------------------------------------------------------------------------
# inputs, timing


def page_inputs(rows, length, device, seed, copies=1, dtype=torch.float32):
    g = torch.Generator(device=device).manual_seed(seed)
    sets = []
    pages = triton.cdiv(length, PAGE_SIZE)
    for _ in range(copies):
        scores = torch.randn(rows, length, device=device, generator=g).to(dtype)
        lengths = torch.full((rows,), length, dtype=torch.int32, device=device)
        perm = torch.randperm(pages * 4, device=device, generator=g)[:pages]
        table = perm.to(torch.int32).repeat(rows, 1)
        sets.append((scores, lengths, table))
    return sets


class Rotating:
    """Calls fn on the next input set each time, keeping each set's outputs alive until its next
    turn so outputs rotate too."""

    def __init__(self, fn, input_sets):
        self.fn, self.input_sets = fn, input_sets
        self.outputs = [None] * len(input_sets)
        self.i = 0

    def __call__(self):
        i = self.i
        self.i = (i + 1) % len(self.input_sets)
        self.outputs[i] = None
        self.outputs[i] = self.fn(*self.input_sets[i])


def time_us(fn, graph: bool, rep_ms: int = 20) -> float:
    if graph:
        return triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median") * 1e3
    return triton.testing.do_bench(fn, warmup=5, rep=2 * rep_ms, return_mode="median") * 1e3


def copies_for(footprint: int, graph: bool) -> int:
    if not graph or footprint >= 3 * L2_BYTES:
        return 1
    return min(64, math.ceil(3 * L2_BYTES / footprint))


# ---------------------------------------------------------------------------------------------
# correctness


def _same_sets(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.sort(-1).values, b.sort(-1).values)


def page_verdict(out: torch.Tensor, ref: torch.Tensor, sorted=False) -> tuple[bool, str]:
    """(ok, "exact" or how many slots differ) of a page transform against its reference: equal
    where sorted, the same sets otherwise."""
    ok = torch.equal(out, ref) if sorted else _same_sets(out, ref)
    return (
        ok,
        "exact" if ok else f"{(out.sort(-1).values != ref.sort(-1).values).sum()} slots differ",
    )


def check_page_case(
    rows, length, k, device, sorted=False, config=None, path=None, dtype=torch.float32
) -> tuple[bool, str]:
    ((scores, lengths, table),) = page_inputs(
        rows, length, device, seed=rows + length + k, dtype=dtype
    )
    scores[:, ::97] = 0.5  # ties at many ranks
    lengths = lengths - torch.arange(rows, device=device, dtype=torch.int32) % 1000
    out = topk.topk_page_transform(
        scores, k, lengths, table, PAGE_SIZE, sorted=sorted, config=config, path=path
    )
    ref = topk_ref.topk_page_transform_ref(scores, k, lengths, table, PAGE_SIZE, sorted=sorted)
    return page_verdict(out, ref, sorted)


def check_families(device) -> list[tuple[str, bool]]:
    """Each fused family and option once against its reference; an exception counts as a fail."""
    g = torch.Generator(device=device).manual_seed(5)
    s = torch.randn(8, 3000, device=device, generator=g)
    s[:4, 100:2000] = 1.0  # a tie straddling the threshold
    odd = torch.randn(6, 3001, device=device, generator=g)[:, 1:]  # row stride 3001
    bf = (torch.randn(4, 2000, device=device, generator=g) * 2).to(torch.bfloat16)
    bs = torch.randn(16, 50, device=device, generator=g)
    pos = torch.tensor([-1, 0, 127, 128, 1000, 6000, 4000, 300], device=device)
    checks = {
        "indices unsorted": lambda: _same_sets(
            topk.topk_indices(s, 64), topk_ref.topk_indices_ref(s, 64)
        ),
        "indices sorted": lambda: torch.equal(
            topk.topk_indices(s, 64, sorted=True), topk_ref.topk_indices_ref(s, 64, sorted=True)
        ),
        "indices split rows": lambda: torch.equal(
            topk.topk_indices(s, 64, sorted=True, config={"SEGMENTS": 3}),
            topk_ref.topk_indices_ref(s, 64, sorted=True),
        ),
        "odd stride": lambda: _same_sets(
            topk.topk_indices(odd, 64), topk_ref.topk_indices_ref(odd, 64)
        ),
        "bf16 ties sorted": lambda: torch.equal(
            topk.topk_indices(bf, 256, sorted=True),
            topk_ref.topk_indices_ref(bf, 256, sorted=True),
        ),
        "block table": lambda: all(
            torch.equal(a, b)
            for a, b in zip(
                topk.topk_block_table(bs, 8, pos, 128, 2, 2, 2, num_kv_heads=2),
                topk_ref.topk_block_table_ref(bs, 8, pos, 128, 2, 2, 2, num_kv_heads=2),
            )
        ),
        "mask bool": lambda: torch.equal(
            topk.topk_mask(bf, 100, block_size=4), topk_ref.topk_mask_ref(bf, 100, block_size=4)
        ),
        "mask additive": lambda: torch.equal(
            topk.topk_mask(bf, 100, kind="additive", block_size=4),
            topk_ref.topk_mask_ref(bf, 100, kind="additive", block_size=4),
        ),
    }
    results = []
    for name, check in checks.items():
        try:
            results.append((name, bool(check())))
        except Exception as exc:  # noqa: BLE001 (report every family, not just the first error)
            print(f"  {name}: {type(exc).__name__}: {str(exc)[:2000]}", flush=True)
            results.append((name, False))
    return results


# ---------------------------------------------------------------------------------------------
# main table


def run_table(args, device):
    rows_out, checks, failed = [], [], False
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    for name, ok in check_families(device):
        checks.append({"case": name, "ok": ok})
        print(f"check {name}: {'ok' if ok else 'FAIL'}", flush=True)
        failed |= not ok
    compiled = None
    if args.inductor:
        compiled = torch.compile(page_transform_chain, dynamic=True)  # one compile per k
    cases = [(r, n, k, False) for k in args.topks for r, n in args.shapes]
    if (256, 131072) in args.shapes and 2048 in args.topks:
        cases.append((256, 131072, 2048, True))
    paths = ("row", "multi") if args.path == "both" else (args.path,)
    for rows, length, k, sorted in cases:
        if time.time() - args.start > args.budget_s:
            print("time budget spent: skipping the remaining cases", flush=True)
            break
        for path in paths:
            ok, detail = check_page_case(
                min(rows, 512), length, k, device, sorted, args.config, path, args.dtype
            )
            case = f"page_transform {rows}x{length} k={k} sorted={sorted} path={path}"
            case += f" {DTYPES[args.dtype]}" if args.dtype != torch.float32 else ""
            checks.append({"case": case, "ok": ok})
            print(f"check {case}: {'ok' if ok else 'FAIL'} ({detail})", flush=True)
            failed |= not ok
        rows_out.append(
            time_page_row(
                rows, length, k, sorted, device, compiled, paths, args.graph_all, args.config,
                args.dtype,
            )
        )
        print_row(rows_out[-1])
    if args.families:
        rows_out += time_block_table(device, args.inductor)
        rows_out += time_mask(device, args.inductor)
    return rows_out, checks, failed


def time_page_row(
    rows, length, k, sorted, device, compiled, paths=("auto",), graph_all=False, config=None,
    dtype=torch.float32,
):  # fmt: skip
    """fxfuse_us is the first of `paths`; a second one is timed beside it as a peer. graph_all:
    every row in CUDA graphs (fxfuse and its peers alike), as a CUDA-graph decode step runs them.
    config: launch overrides of fxfuse's top-k (None: the launch table's). dtype: the scores'
    (the roofline reads its bytes)."""
    score_bytes = rows * length * dtype.itemsize
    roofline_us = score_bytes / COPY_BYTES_PER_US
    graph = graph_all or roofline_us * 4 < GRAPH_BELOW_US
    sets = page_inputs(
        rows, length, device, seed=rows * 7 + length, copies=copies_for(score_bytes, graph),
        dtype=dtype,
    )  # fmt: skip

    def fused(path):
        def run(scores, lengths, table):
            return topk.topk_page_transform(
                scores, k, lengths, table, PAGE_SIZE, sorted=sorted, config=config, path=path
            )

        return run

    def eager(scores, lengths, table):
        return page_transform_chain(scores, lengths, table, k)

    def inductor(scores, lengths, table):
        return compiled(scores, lengths, table, k)

    fns = {"fxfuse": Rotating(fused(paths[0]), sets)}
    for path in paths[1:]:
        fns[f"fxfuse_{path}"] = Rotating(fused(path), sets)
    fns["eager"] = Rotating(eager, sets)
    if compiled is not None:
        fns["inductor"] = Rotating(inductor, sets)
    for fn in fns.values():
        for _ in range(len(sets)):
            fn()
    torch.cuda.synchronize()
    first = time_us(fns["fxfuse"], graph)
    peers = {name: time_us(fn, graph) for name, fn in fns.items() if name != "fxfuse"}
    again = time_us(fns["fxfuse"], graph)
    return {
        "case": "topk_page_transform" + ("_sorted" if sorted else "")
        + (f"_{DTYPES[dtype]}" if dtype != torch.float32 else ""),
        "shape": {"rows": rows, "length": length, "topk": k},
        "fxfuse_us": round(min(first, again), 3),
        "fxfuse_spread_us": round(abs(first - again), 3),
        "peers_us": {name: round(v, 3) for name, v in peers.items()},
        "roofline_us": round(roofline_us, 3),
        "timing": "cudagraph" if graph else "do_bench",
        "path": paths[0],
    }  # fmt: skip


def time_block_table(device, inductor, queries=512, heads=4, num_blocks=1024, k=64):
    g = torch.Generator(device=device).manual_seed(3)
    scores = torch.randn(queries * heads, num_blocks, device=device, generator=g)
    positions = torch.randint(0, num_blocks * 128, (queries,), device=device, generator=g)
    got = topk.topk_block_table(scores, k, positions, 128, 1, 1, 2, heads)
    want = block_table_chain(scores, positions, k)
    ok = all(torch.equal(a, b) for a, b in zip(got, want))
    print(f"check block table vs torch chain: {'ok' if ok else 'FAIL'}", flush=True)
    fns = {
        "fxfuse": lambda: topk.topk_block_table(scores, k, positions, 128, 1, 1, 2, heads),
        "eager": lambda: block_table_chain(scores, positions, k),
    }
    if inductor:
        compiled = torch.compile(block_table_chain, dynamic=False)
        fns["inductor"] = lambda: compiled(scores, positions, k)
    for fn in fns.values():
        fn()
    times = {name: time_us(fn, True) for name, fn in fns.items()}
    row = {
        "case": "topk_block_table",
        "shape": {"rows": queries * heads, "length": num_blocks, "topk": k},
        "fxfuse_us": round(times.pop("fxfuse"), 3),
        "peers_us": {name: round(v, 3) for name, v in times.items()},
        "roofline_us": round(scores.numel() * 4 / COPY_BYTES_PER_US, 3),
        "timing": "cudagraph",
        "matches_torch_chain": ok,
    }
    print_row(row)
    return [row]


def time_mask(device, inductor, rows=256, length=16384, k=2048):
    g = torch.Generator(device=device).manual_seed(4)
    scores = torch.randn(rows, length, device=device, generator=g)
    ok = torch.equal(topk.topk_mask(scores, k), topk_ref.topk_mask_ref(scores, k))
    print(f"check mask: {'ok' if ok else 'FAIL'}", flush=True)
    fns = {"fxfuse": lambda: topk.topk_mask(scores, k), "eager": lambda: mask_chain(scores, k)}
    if inductor:
        compiled = torch.compile(mask_chain, dynamic=False)
        fns["inductor"] = lambda: compiled(scores, k)
    for fn in fns.values():
        fn()
    times = {name: time_us(fn, False) for name, fn in fns.items()}
    row = {
        "case": "topk_mask_bool",
        "shape": {"rows": rows, "length": length, "topk": k},
        "fxfuse_us": round(times.pop("fxfuse"), 3),
        "peers_us": {name: round(v, 3) for name, v in times.items()},
        # scores read + the bool mask written
        "roofline_us": round(rows * length * 5 / COPY_BYTES_PER_US, 3),
        "timing": "do_bench",
    }
    print_row(row)
    return [row]


def print_row(row):
    fx, peers, roof = row["fxfuse_us"], row["peers_us"], row["roofline_us"]
    shape = row["shape"]
    print(
        f"{row['case']:<28} {shape['rows']:>6}x{shape['length']:<7} k={shape['topk']:<5} "
        f"fxfuse {fx:9.2f} us  eager {peers['eager']:9.2f}  "
        f"inductor {peers.get('inductor', float('nan')):9.2f}  "
        f"roofline {roof:8.2f}  {fx / roof:5.2f}x roofline  {peers['eager'] / fx:6.2f}x eager  "
        + "".join(
            f"{name} {v:9.2f} ({v / roof:5.2f}x roofline)  "
            for name, v in peers.items()
            if name.startswith("fxfuse_")
        )
        + f"[{row['timing']}{', path ' + row['path'] if 'path' in row else ''}]",
        flush=True,
    )


# ---------------------------------------------------------------------------------------------
# launch-config sweep


def run_sweep(args, device):
    """Time each config on each sweep shape (sum over k); the best per shape bucket."""
    best = {}
    for rows, length in SWEEP_SHAPES:
        score_bytes = rows * length * 4
        graph = score_bytes / COPY_BYTES_PER_US * 4 < GRAPH_BELOW_US
        sets = page_inputs(
            rows, length, device, seed=rows + length, copies=copies_for(score_bytes, graph)
        )
        totals = []
        for cfg in SWEEP_CONFIGS:
            total = 0.0
            for k in TOPKS:
                fn = Rotating(
                    lambda s, n, t, k=k, cfg=cfg: topk.topk_page_transform(
                        s, k, n, t, PAGE_SIZE, config=cfg
                    ),
                    sets,
                )
                try:
                    fn()
                    total += time_us(fn, graph, rep_ms=10)
                except Exception as exc:  # noqa: BLE001 (a config that cannot run loses)
                    print(f"  {cfg}: {type(exc).__name__}: {exc}", flush=True)
                    total = math.inf
                    break
            totals.append((total, cfg))
        totals.sort(key=lambda item: item[0])
        best[(rows, length)] = totals[0][1]
        line = ", ".join(
            f"{c['BLOCK']}/{c['num_warps']}w/{c['PROGRAMS_PER_SM']}p/r{c['RADIX_BITS']} {t:.1f}"
            for t, c in totals[:5]
        )
        print(f"sweep {rows}x{length}: best {totals[0][1]} (sum over k, us: {line})", flush=True)
    return best


def sweep_table(best: dict, source: str) -> dict:
    """The sm90 block of topk.json: shape buckets by length, then rows. The sweep covers the
    row path's fields; the multi-program path's fields keep the current table's values."""
    entries = []
    for (rows, length), cfg in sorted(best.items(), key=lambda item: (item[0][1], item[0][0])):
        current = launch_tables.lookup(topk.KERNEL_NAME, "sm90", rows=rows, length=length)
        entries.append(
            {
                "when": {"length_max": length, "rows_max": max(rows * 4, 4)},
                "config": {**current, **cfg},
            }
        )
    if entries:
        last = dict(entries[-1]["config"])
    else:
        last = {**launch_tables.lookup(topk.KERNEL_NAME, "sm90"), **SWEEP_CONFIGS[0]}
    entries.append({"when": {}, "config": last})
    return {"timed": True, "source": source, "entries": entries}  # fmt: skip


# ---------------------------------------------------------------------------------------------


def cpu_smoke():
    """The correctness half on tiny shapes in Triton's interpreter (no timing, nothing written)."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    device = torch.device("cpu")
    failed = False
    for name, ok in check_families(device):
        print(f"check {name}: {'ok' if ok else 'FAIL'}")
        failed |= not ok
    multi = {"MULTI_BLOCK": 256, "MULTI_CHUNKS": 2, "MULTI_SAMPLE": 256}
    for rows, length, k, sorted, cfg, path in (
        (2, 3000, 64, False, None, "row"),
        (2, 3000, 64, True, {"BLOCK": 256}, "row"),
        (1, 4000, 128, False, {"BLOCK": 256, "SEGMENTS": 3}, "row"),
        (2, 3000, 64, False, multi, "multi"),
        (2, 3000, 64, True, {**multi, "MULTI_ESTIMATE": 0}, "multi"),
    ):
        for dtype in DTYPES:
            ok, detail = check_page_case(rows, length, k, device, sorted, cfg, path, dtype)
            print(
                f"check page transform {rows}x{length} k={k} sorted={sorted} {cfg} path={path} "
                f"{DTYPES[dtype]}: {'ok' if ok else 'FAIL'} ({detail})"
            )
            failed |= not ok
    scores, lengths, table = page_inputs(2, 3000, device, 0)[0]
    chain = page_transform_chain(scores, lengths, table, 64)
    ok = _same_sets(chain, topk.topk_page_transform(scores, 64, lengths, table, PAGE_SIZE))
    print(f"check torch chain agrees: {'ok' if ok else 'FAIL'}")
    failed |= not ok
    fake = {shape: dict(SWEEP_CONFIGS[0]) for shape in SWEEP_SHAPES}
    table_json = json.loads(json.dumps(launch_tables.load_table("topk")))
    table_json["targets"]["sm90"] = sweep_table(fake, "smoke")
    launch_tables._validate(table_json, "topk")  # what --sweep prints must load
    for rows, length in ((1, 8192), (256, 131072), (16384, 17920)):
        print(f"  roofline {rows}x{length}: {rows * length * 4 / COPY_BYTES_PER_US:.2f} us")
    print("cpu smoke", "FAILED" if failed else "ok")
    return 1 if failed else 0  # fmt: skip


def _shapes(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in item.split("x")) for item in text.split(",")]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder for <suite>.json")
    parser.add_argument("--sweep", action="store_true", help="sweep launch configs instead")
    parser.add_argument("--cpu-smoke", action="store_true", help="correctness only, interpreter")
    parser.add_argument("--budget-s", type=float, default=170.0, help="stop timing new cases after")
    parser.add_argument(
        "--shapes", type=_shapes, default=list(SHAPES), help="rows x length list: 1x8192,256x131072"
    )
    parser.add_argument("--topks", type=int, nargs="+", default=list(TOPKS))
    parser.add_argument(
        "--path",
        choices=("auto", "row", "multi", "both"),
        default="auto",
        help="top-k kernel path of the page-transform cases; both: row and multi side by side",
    )
    parser.add_argument(
        "--config",
        type=json.loads,
        default=None,
        help="launch overrides (JSON) for the page-transform cases, e.g. a candidate table entry",
    )
    parser.add_argument(
        "--dtype",
        choices=list(DTYPES.values()),
        default=DTYPES[torch.float32],
        help="the page-transform rows' score dtype (bf16: its k-th score ties)",
    )
    parser.add_argument("--no-inductor", dest="inductor", action="store_false")
    parser.add_argument(
        "--graph-all",
        action="store_true",
        help="time every page-transform row in CUDA graphs (fxfuse and peers), not only short ones",
    )
    parser.add_argument(
        "--no-families",
        dest="families",
        action="store_false",
        help="skip timing the block table and mask",
    )
    args = parser.parse_args()
    args.dtype = DTYPE_BY_NAME[args.dtype]
    if args.cpu_smoke:
        return cpu_smoke()
    if not torch.cuda.is_available():
        print("needs a GPU (or --cpu-smoke)")
        return 2
    device = torch.device("cuda")
    args.start = time.time()
    meta = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.date.today().isoformat(),
        "command": "python " + " ".join(sys.argv),
        "config": args.config,
    }
    os.makedirs(args.out, exist_ok=True)
    if args.sweep:
        best = run_sweep(args, device)
        source = f"benchmarks/bench_topk.py --sweep, {meta['date']}, {meta['device']}"
        table = sweep_table(best, source)
        print(json.dumps({"sm90": table}, indent=2))
        with open(os.path.join(args.out, "topk_sweep.json"), "w") as f:
            json.dump({**meta, "sm90": table}, f, indent=2)
        return 0
    rows, checks, failed = run_table(args, device)
    with open(os.path.join(args.out, f"{SUITE}.json"), "w") as f:
        json.dump({**meta, "checks": checks, "rows": rows}, f, indent=2)
    print(f"done in {time.time() - args.start:.0f}s; wrote {args.out}/{SUITE}.json")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
