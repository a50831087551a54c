"""Where the top-k kernels spend their time (issue 5): per-kernel GPU time from the profiler for
the multi-program and row paths at the bench shapes, launch-config variants of the multi path,
and read-bandwidth references (torch.amax over the rows; a Triton kernel that only streams the
scores and keeps a max, at the multi path's segment size).

Every variant is checked exact against torch.topk's set (`topk_ref`) before it is timed.

    PYTHONPATH=. python benchmarks/experiments/topk_probe.py [--out FILE.json] [--quick]
    ... --suite tile     register-tile rows against streaming, launch variants
    ... --suite select   the tile select's radix descent against the bisection (TILE_SELECT)
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import triton
import triton.language as tl
import triton.testing
from _rows import row_writer  # this folder: the script's own path entry

from fxfuse.kernels import topk

COPY_BYTES_PER_US = 4.25e12 / 1e6


@triton.jit
def _stream_max_kernel(x_ptr, out_ptr, n, SEGMENT: tl.constexpr, BLOCK: tl.constexpr):
    """Read SEGMENT scores per program, BLOCK at a time, keep a running max (read roofline)."""
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * SEGMENT
    offs = tl.arange(0, BLOCK)
    acc = tl.full((BLOCK,), float("-inf"), tl.float32)
    for start in range(0, SEGMENT, BLOCK):
        x = tl.load(x_ptr + base + start + offs, mask=base + start + offs < n, other=0.0)
        acc = tl.maximum(acc, x)
    tl.store(out_ptr + pid, tl.max(acc, 0))


def stream_max(x, segment, block, warps):
    n = x.numel()
    grid = triton.cdiv(n, segment)
    out = torch.empty(grid, device=x.device, dtype=torch.float32)
    _stream_max_kernel[(grid,)](x, out, n, SEGMENT=segment, BLOCK=block, num_warps=warps)
    return out


def kernel_times(fn, calls=20):
    """{kernel name: mean GPU microseconds per call} from the profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None)
        if t is None:
            t = ev.cuda_time_total
        if t > 0 and ev.count >= calls:
            out[ev.key[:60]] = round(t / calls, 2)
    return out


def _check_and_time(emit, row: dict, fn, exact, roof: float) -> None:
    """Emit `row` with fn's result checked (`exact(got)`), its CUDA-graph time and its multiple
    of the roofline; a variant that cannot launch is emitted with its error instead."""
    try:
        ok = bool(exact(fn()))
        us = triton.testing.do_bench_cudagraph(fn, rep=30) * 1e3
    except Exception as e:  # noqa: BLE001 - a variant that cannot launch is reported
        emit({**row, "error": repr(e)[:200]})
        return
    emit({**row, "exact": ok, "us": round(us, 2), "x_roofline": round(us / roof, 2)})


def tile_suite(emit, dev) -> None:
    """The row path's register-tile mode against its streaming mode and torch (indices and the
    bool mask), and its launch variants (warps, programs per SM)."""
    shapes = [
        (4096, 4096, 2048),
        (4096, 4096, 512),
        (16384, 2048, 256),
        (1024, 8192, 2048),
        (256, 16384, 2048),
        (2048, 1024, 64),
    ]
    variants = [("stream", {"TILE_MAX": 1}), ("tile", {"TILE_MAX": 16384})]
    for w in (4, 8, 16):
        for per_sm in (2, 4, 8):
            variants.append(
                (
                    f"tile_w{w}_p{per_sm}",
                    {"TILE_MAX": 16384, "num_warps": w, "PROGRAMS_PER_SM": per_sm},
                )
            )
    for rows, length, k in shapes:
        g = torch.Generator(device=dev).manual_seed(rows + k)
        scores = torch.randn(rows, length, device=dev, generator=g)
        roof = rows * length * 4 / COPY_BYTES_PER_US
        ref_sets = torch.topk(scores, k, dim=1).indices.sort(1).values
        ref_mask = torch.ones_like(scores, dtype=torch.bool).scatter_(
            1, torch.topk(scores, k, dim=1).indices, False
        )

        def eager(s=scores, k=k):
            return torch.topk(s, k, dim=1)

        def eager_mask(s=scores, k=k):
            return torch.ones_like(s, dtype=torch.bool).scatter_(
                1, torch.topk(s, k, dim=1).indices, False
            )

        for name, fn in (("torch.topk", eager), ("torch.topk+scatter", eager_mask)):
            emit(
                {
                    "suite": "tile",
                    "shape": [rows, length, k],
                    "variant": name,
                    "us": round(triton.testing.do_bench_cudagraph(fn, rep=30) * 1e3, 2),
                    "roofline_us": round(roof, 2),
                }
            )
        for name, cfg in variants:
            for what in ("indices", "mask"):
                if what == "mask" and name.startswith("tile_w") and length != 4096:
                    continue

                def fn(s=scores, k=k, cfg=cfg, what=what):
                    if what == "mask":
                        return topk.topk_mask(s, k, config=cfg)
                    return topk.topk_indices(s, k, config=cfg, path="row")

                def exact(got, what=what):
                    if what == "indices":
                        return torch.equal(got.long().sort(1).values, ref_sets)
                    return torch.equal(got, ref_mask)

                row = {"suite": "tile", "shape": [rows, length, k], "variant": name, "what": what}
                _check_and_time(emit, row, fn, exact, roof)


def select_suite(emit, dev, quick: bool = False) -> None:
    """The register-tile select's two descents (TILE_SELECT 0 radix histograms, 1 bisection):
    tile rows (indices, bool mask, the layer's causal masked-tail mask) and the multi-program
    path, whose rows finish with the same select over their candidates."""
    tile_cases = [(4096, 4096, 2048), (8192, 8192, 2048), (4096, 4096, 512), (16384, 2048, 256),
                  (1024, 8192, 2048), (2048, 1024, 64)]  # fmt: skip
    tile_variants = [("radix", {"TILE_SELECT": 0}), ("bisect", {"TILE_SELECT": 1})]
    if quick:  # the layer's causal rows only
        tile_cases = tile_cases[:2]
    for w in (4, 8) if not quick else ():
        for per_sm in (2, 4, 8):
            tile_variants.append(
                (f"bisect_w{w}_p{per_sm}",
                 {"TILE_SELECT": 1, "num_warps": w, "PROGRAMS_PER_SM": per_sm})
            )  # fmt: skip
    for rows, length, k in tile_cases:
        g = torch.Generator(device=dev).manual_seed(rows + k)
        scores = torch.randn(rows, length, device=dev, generator=g)
        roof = rows * length * 4 / COPY_BYTES_PER_US
        ref_sets = torch.topk(scores, k, dim=1).indices.sort(1).values
        ref_mask = torch.ones_like(scores, dtype=torch.bool).scatter_(
            1, torch.topk(scores, k, dim=1).indices, False
        )
        causal = None
        if rows == length:
            # The layer's indexer: row r sees r + 1 scores, the rest masked to -inf.
            causal = torch.arange(1, rows + 1, device=dev, dtype=torch.int32)
            masked = scores.masked_fill(
                torch.arange(length, device=dev)[None, :] >= causal[:, None], float("-inf")
            )
            ref_causal = torch.ones_like(scores, dtype=torch.bool).scatter_(
                1, torch.topk(masked, k, dim=1).indices, False
            )
        # causal_mask: lengths + masked_tail (the kernel skips the tail); causal_bias: the
        # scores already -inf past the diagonal (the layer's spelling: a causal bias added).
        whats = ["indices", "mask"] + (["causal_mask", "causal_bias"] if causal is not None else [])
        if rows == 8192:  # the layer's prefill at M = 8192: only its causal masks
            whats = ["causal_mask", "causal_bias"]
        for name, cfg in tile_variants:
            for what in whats:
                if name.startswith("bisect_w") and (what != "mask" or rows == 8192):
                    continue

                def fn(s=scores, k=k, cfg=cfg, what=what):
                    if what == "mask":
                        return topk.topk_mask(s, k, config=cfg)
                    if what == "causal_mask":
                        return topk.topk_mask(s, k, causal, masked_tail=True, config=cfg)
                    if what == "causal_bias":
                        return topk.topk_mask(masked, k, config=cfg)
                    return topk.topk_indices(s, k, config=cfg, path="row")

                def exact(got, what=what):
                    if what == "indices":
                        return torch.equal(got.long().sort(1).values, ref_sets)
                    return torch.equal(got, ref_mask if what == "mask" else ref_causal)

                row = {"suite": "select", "shape": [rows, length, k], "variant": name, "what": what}
                _check_and_time(emit, row, fn, exact, roof)
    for rows, length, k in () if quick else ((1, 131072, 2048), (64, 131072, 2048),
                                             (64, 131072, 512), (256, 131072, 2048)):
        g = torch.Generator(device=dev).manual_seed(rows + k)
        scores = torch.randn(rows, length, device=dev, generator=g)
        ref_sets = torch.topk(scores, k, dim=1).indices.sort(1).values
        for name, sel in (("radix", 0), ("bisect", 1)):

            def fn(s=scores, k=k, sel=sel):
                return topk.topk_indices(s, k, config={"TILE_SELECT": sel}, path="multi")

            got = fn()
            ok = bool(torch.equal(got.long().sort(1).values, ref_sets))
            bench = triton.testing.do_bench_cudagraph if rows <= 64 else triton.testing.do_bench
            us = bench(fn, rep=30) * 1e3
            emit({"suite": "select", "shape": [rows, length, k], "variant": name,
                  "what": "multi_indices", "exact": ok, "us": round(us, 2)})  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--suite", default="paths", choices=("paths", "tile", "select"))
    args = parser.parse_args()
    dev = torch.device("cuda")
    t0 = time.time()
    emit = row_writer(args.out, {"device": torch.cuda.get_device_name()})

    if args.suite in ("tile", "select"):
        if args.suite == "tile":
            tile_suite(emit, dev)
        else:
            select_suite(emit, dev, quick=args.quick)
        return 0
    shapes = [
        (1, 8192, 512),
        (1, 131072, 2048),
        (64, 131072, 2048),
        (256, 131072, 2048),
        (256, 131072, 512),
    ]
    variants = [
        ("auto", {}, None),
        ("row", {}, "row"),
        ("multi", {}, "multi"),
        ("multi_noest", {"MULTI_ESTIMATE": 0}, "multi"),
    ]
    for w in (4, 8):
        variants.append((f"multi_w{w}", {"MULTI_WARPS": w}, "multi"))
    # chunk geometry (MULTI_ROWS x MULTI_BLOCK, MULTI_CHUNKS per segment) and warps
    for r, blk, ch, w in ((2, 2048, 8, 16), (4, 2048, 4, 16), (4, 2048, 8, 16), (2, 2048, 2, 8)):
        geometry = {"MULTI_ROWS": r, "MULTI_BLOCK": blk, "MULTI_CHUNKS": ch, "MULTI_WARPS": w}
        variants.append((f"multi_r{r}_b{blk}_c{ch}_w{w}", geometry, "multi"))
    variants.append(("multi_radix", {"TILE_SELECT": 0}, "multi"))
    variants.append(("multi_sample4096", {"MULTI_SAMPLE": 4096}, "multi"))
    for rows, length, k in shapes:
        g = torch.Generator(device=dev).manual_seed(rows * 7 + k)
        scores = torch.randn(rows, length, device=dev, generator=g)
        roof = rows * length * 4 / COPY_BYTES_PER_US
        ref_sets = torch.topk(scores, k, dim=1).indices.sort(1).values
        eager_us = (
            triton.testing.do_bench(lambda s=scores, k=k: torch.topk(s, k, dim=1), rep=50) * 1e3
        )
        amax_us = triton.testing.do_bench(lambda s=scores: s.amax(1), rep=50) * 1e3
        emit(
            {
                "shape": [rows, length, k],
                "variant": "torch.topk",
                "us": round(eager_us, 2),
                "roofline_us": round(roof, 2),
            }
        )
        emit({"shape": [rows, length, k], "variant": "torch.amax", "us": round(amax_us, 2)})
        flat = scores.reshape(-1)
        for seg, blk, w in (
            (32768, 4096, 16),
            (32768, 4096, 8),
            (8192, 2048, 8),
            (131072, 4096, 8),
        ):
            us = triton.testing.do_bench(lambda a=(flat, seg, blk, w): stream_max(*a), rep=50) * 1e3
            emit(
                {
                    "shape": [rows, length, k],
                    "variant": f"stream_max s{seg} b{blk} w{w}",
                    "us": round(us, 2),
                    "x_roofline": round(us / roof, 2),
                }
            )
        for name, cfg, path in variants:
            if args.quick and name not in ("auto", "row", "multi"):
                continue
            if path == "row" and rows * length > 2**25 and name != "row":
                continue

            def fn(s=scores, k=k, cfg=cfg, path=path):
                return topk.topk_indices(s, k, config=cfg or None, path=path)

            try:
                got = fn()
                ok = bool(torch.equal(got.long().sort(1).values, ref_sets))
                us = triton.testing.do_bench(fn, rep=50) * 1e3
                kt = kernel_times(fn)
            except Exception as e:  # noqa: BLE001 - a variant that cannot launch is reported
                emit({"shape": [rows, length, k], "variant": name, "error": repr(e)[:200]})
                continue
            emit(
                {
                    "shape": [rows, length, k],
                    "variant": name,
                    "exact": ok,
                    "us": round(us, 2),
                    "x_eager": round(eager_us / us, 2),
                    "x_roofline": round(us / roof, 2),
                    "kernels": kt,
                }
            )
        print(f"-- {rows}x{length} k={k} done at {time.time() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
