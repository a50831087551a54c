"""FP8 GEMM benchmark (suite "gemm_fp8"): fxfuse A8W8 rowwise / blockscale and prequant A16W8
against torch._scaled_mm (rowwise; blockwise where torch takes it) and bf16 F.linear, on the
DeepSeek-R1 shapes (PERFORMANCE.md).

    PYTHONPATH=. python benchmarks/bench_gemm_fp8.py --out benchmarks/results   # H200, ~3 min
    PYTHONPATH=. python benchmarks/bench_gemm_fp8.py --sweep --shapes 2112x7168  # ~2 min a shape
    PYTHONPATH=. python benchmarks/bench_gemm_fp8.py --cpu-smoke                 # interpreter

Each case is checked against a float reference first. Timing: the launches of one case over
rotated input copies (so the weights stream from HBM, not the 60 MB L2) are captured in one CUDA
graph; where a launch takes ~50 µs or more the case is re-timed with do_bench (peers alike); the
reported time is per launch.
Roofline: max(bytes / 4.25 TB/s, FLOPs / 1250 TFLOP/s).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = [(2112, 7168), (3072, 1536), (4096, 512), (7168, 2048), (24576, 1536)]
M_VALUES = [1, 4, 16, 32, 64, 128, 1024, 4096, 8192, 16384]
# Subsets that keep one run near 3 minutes (Triton compiles once per shape and M bucket).
BLOCKSCALE_M = [1, 16, 128, 4096, 16384]
PREQUANT_M = [1, 4, 16, 32]
COPY_TBPS = 4.25
FP8_TFLOPS = 1250.0
BF16_TFLOPS = 680.0
L2_BYTES = 60 * 2**20
GRAPH_BELOW_US = 50.0
SUITE = "gemm_fp8"


# --- shared helpers (bench_gemm_mxfp4 imports these) -------------------------------------------


def roofline_us(bytes_moved: float, flops: float, tflops: float) -> float:
    return max(bytes_moved / (COPY_TBPS * 1e12), flops / (tflops * 1e12)) * 1e6


def copies_for(bytes_per_call: int) -> int:
    """Input sets to rotate through so that one pass reads well over the L2's 60 MB."""
    return max(1, min(64, -(-3 * L2_BYTES // max(bytes_per_call, 1))))


def time_us(calls: list, use_graph: bool) -> float:
    """Median µs per call of `calls` (zero-argument callables over rotated inputs)."""
    import triton.testing

    for call in calls:  # compile, and allocate split-K counters outside any graph
        call()
    torch.cuda.synchronize()
    if not use_graph:
        cycle = itertools.cycle(calls)
        return triton.testing.do_bench(lambda: next(cycle)(), warmup=10, rep=50) * 1e3
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:
            call()
        with torch.cuda.graph(graph, stream=stream):
            for call in calls:
                call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return triton.testing.do_bench(graph.replay, warmup=10, rep=50) * 1e3 / len(calls)


def time_case(calls: list) -> tuple[str, float]:
    """(timing, µs per call): a CUDA graph of the rotated calls, so that Python and launch overhead
    never count; a case whose launch takes ≥ ~50 µs is re-timed with plain do_bench."""
    graph_us = time_us(calls, use_graph=True)
    if graph_us < GRAPH_BELOW_US:
        return "cudagraph", graph_us
    return "do_bench", time_us(calls, use_graph=False)


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def header(command: str) -> dict:
    import triton

    return {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.date.today().isoformat(),
        "command": command,
        "rows": [],
    }


def print_row(row: dict) -> None:
    shape = row["shape"]
    peers = " ".join(
        f"{k}={v:8.1f}" if v is not None else f"{k}=   n/a" for k, v in row["peers_us"].items()
    )
    best = [v for v in row["peers_us"].values() if v]
    ratio = f"{min(best) / row['fxfuse_us']:5.2f}x" if best else "  n/a"
    frac = row["roofline_us"] / row["fxfuse_us"]
    print(
        f"{row['case']:<22} m={shape['m']:<6} n={shape['n']:<6} k={shape['k']:<6} "
        f"fxfuse={row['fxfuse_us']:8.1f} {peers}  vs-best-peer={ratio}  "
        f"roofline={row['roofline_us']:7.1f} ({frac:4.0%}) [{row['timing']}]",
        flush=True,
    )


def write_results(results: dict, out_dir: str, suite: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{suite}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {path}")


def sweep_candidates(m: int, k: int, base: dict) -> list[dict]:
    """A small grid around the table's entry (one compile each)."""
    if m <= 128:
        block_m = max(16, min(128, 1 << (m - 1).bit_length()))
        grid = [
            {"BLOCK_M": block_m, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sk, "num_stages": 4,
             "SWAP_AB": 0, "num_warps": 4 if block_m < 128 else 8}
            for bn, bk, sk in itertools.product((32, 64), (256,), (1, 2, 4, 8))
        ]
        # Swapped tiles: the weight rows fill the MMA's M (64 / 128), the tokens its N. (Splits
        # of 12-32 were slower than 6-8 everywhere: experiments/skinny_split.py, 2026-12-05.)
        grid += [
            {"BLOCK_M": min(block_m, 64), "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": sk,
             "num_stages": 3 if bn * bk > 16384 else 4, "SWAP_AB": 1, "num_warps": 4}
            for bn, bk, sk in itertools.product((64, 128), (128, 256), (1, 2, 4, 8))
        ]
    else:
        grid = [
            {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "num_warps": w, "num_stages": st}
            for bm, bn, w, st in (
                (128, 128, 4, 4),
                (128, 128, 8, 4),
                (128, 256, 8, 3),
                (256, 128, 8, 3),
                (64, 256, 4, 4),
                (128, 256, 8, 4),
            )
        ]
    # Keep only grids whose split count divides the K-tiles (others fall back to fewer splits).
    return [{**base, **g} for g in grid if k // g["BLOCK_K"] >= g.get("SPLIT_K", 1)]


def run_sweep(name: str, shapes, make_calls, m_values, out_rows: list) -> None:
    """Time each candidate config per (shape, M bucket) and print the best, for the sm90 table."""
    from fxfuse.kernels import gemm_fp8 as kernels

    for n, k in shapes:
        for m in m_values:
            base = kernels.launch_config(name, "sm90", m, n, k, None)
            timings = []
            for config in sweep_candidates(m, k, base):
                calls, _ = make_calls(m, n, k, config)
                try:
                    us = time_us(calls, use_graph=m <= 128)
                except Exception as e:  # noqa: BLE001 - configs the compiler rejects (smem)
                    print(f"  skip {config}: {type(e).__name__}")
                    continue
                timings.append((us, config))
                torch.cuda.empty_cache()
            timings.sort(key=lambda t: t[0])
            if not timings:
                continue
            best_us, best = timings[0]
            table_us = next((us for us, c in timings if c == base), None)
            print(
                f"sweep {name} m={m} n={n} k={k}: best {best_us:.1f} us {best} "
                f"(table entry: {table_us if table_us is None else round(table_us, 1)} us)",
                flush=True,
            )
            out_rows.append(
                {
                    "m": m,
                    "n": n,
                    "k": k,
                    "best_us": best_us,
                    "best": best,
                    "table_us": table_us,
                    "top5": timings[:5],
                }
            )


# --- FP8 cases --------------------------------------------------------------------------------


def _fp8_weights(n, k, device, block, copies):
    from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref

    out = []
    for i in range(copies):
        wf = torch.randn(n, k, device=device)
        if block:
            nb, kb = -(-n // 128), -(-k // 128)
            scale = torch.rand(nb, kb, device=device) * 0.004 + 0.001
            full = scale.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
            out.append(((wf / full).clamp(-448, 448).to(torch.float8_e4m3fn), scale, wf))
        else:
            w, s = quant_fp8_ref(wf, 0, torch.float8_e4m3fn)
            out.append((w, s.reshape(n), wf))
    return out


def _scaled_mm_blockwise(q, x_scale, w, w_scale):
    """torch._scaled_mm with 1×128 × 128×128 scales, in the layouts recent torch accepts."""
    xs_col = x_scale.t().contiguous().t()
    for a_s, b_s in ((xs_col, w_scale.t()), (xs_col, w_scale), (x_scale, w_scale.t())):
        try:
            return torch._scaled_mm(q, w.t(), a_s, b_s, out_dtype=torch.bfloat16)
        except (RuntimeError, ValueError):
            continue
    return None


def make_case(case: str, m: int, n: int, k: int, config: dict | None, check: bool = True):
    """(calls, peers) for one case: calls run fxfuse over rotated inputs; peers map a peer name to
    its calls (None where torch does not take the case)."""
    from fxfuse.kernels.gemm_fp8 import gemm_a16w8, gemm_fp8
    from fxfuse.kernels.gemm_ref import gemm_fp8_ref
    from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref

    device = torch.device("cuda")
    block = case in ("a8w8_blockscale", "a16w8_group128")
    prequant = case.startswith("a16w8")
    group = 128 if block else 0
    copies = copies_for(n * k + m * k * (2 if prequant else 1))
    weights = _fp8_weights(n, k, device, block, copies)
    inputs = []
    for w, w_scale, wf in weights:
        x = (torch.randn(m, k, device=device) * torch.exp(torch.randn(m, k, device=device))).to(
            torch.bfloat16
        )
        q, x_scale = quant_fp8_ref(x, group, torch.float8_e4m3fn)
        inputs.append((x, q, x_scale, w, w_scale, wf.to(torch.bfloat16)))

    if prequant:

        def fused(x, q, xs, w, ws):
            return gemm_a16w8(x, w, ws, group_size=group, config=config)
    else:

        def fused(x, q, xs, w, ws):
            return gemm_fp8(q, xs, w, ws, config=config)

    if check:
        x, q, xs, w, ws, _ = inputs[0]
        rows = slice(0, min(m, 256))
        out = fused(x, q, xs, w, ws)[rows]
        ref = gemm_fp8_ref(q[rows], xs[rows], w, ws, torch.float32)
        err = rel_error(out, ref)
        if err > 1e-2:
            raise AssertionError(f"{case} m={m} n={n} k={k}: relative error {err:.3g} > 1e-2")

    calls = [lambda a=a: fused(*a[:5]) for a in inputs]
    peers = {}
    if not block:
        peers["scaled_mm"] = [
            lambda a=a: torch._scaled_mm(
                a[1], a[3].t(), a[2], a[4].reshape(1, n), out_dtype=torch.bfloat16
            )
            for a in inputs
        ]
        if prequant:  # what a user runs instead: torch quant, then _scaled_mm

            def quant_then_mm(a):
                q, xs = quant_fp8_ref(a[0], 0, torch.float8_e4m3fn)
                return torch._scaled_mm(
                    q, a[3].t(), xs, a[4].reshape(1, n), out_dtype=torch.bfloat16
                )

            peers["quant+scaled_mm"] = [lambda a=a: quant_then_mm(a) for a in inputs]
    else:
        a = inputs[0]
        blockwise = _scaled_mm_blockwise(a[1], a[2], a[3], a[4])
        ok = (
            blockwise is not None
            and rel_error(
                blockwise[: min(m, 256)], gemm_fp8_ref(a[1][:256], a[2][:256], a[3], a[4])
            )
            < 1e-2
        )
        peers["scaled_mm_blockwise"] = (
            [lambda a=a: _scaled_mm_blockwise(a[1], a[2], a[3], a[4]) for a in inputs]
            if ok
            else None
        )
    peers["bf16_linear"] = [lambda a=a: F.linear(a[0], a[5]) for a in inputs]
    if case in ("a8w8_rowwise", "a8w8_blockscale") and config is None:
        import fxfuse.runtime.gemm_ops  # noqa: F401  (registers torch.ops.fxfuse.gemm_fp8)

        # The op a captured graph calls: the backend tables (gemm_fp8_backend,
        # gemm_fp8_block_backend) may send it to torch._scaled_mm.
        peers["fxfuse_op"] = [
            lambda a=a: torch.ops.fxfuse.gemm_fp8(a[1], a[2], a[3], a[4], torch.bfloat16)
            for a in inputs
        ]
    return calls, peers


def bench_row(case: str, m: int, n: int, k: int) -> dict:
    calls, peers = make_case(case, m, n, k, None)
    timing, fxfuse_us = time_case(calls)
    use_graph = timing == "cudagraph"
    peers_us = {
        name: (time_us(p, use_graph) if p is not None else None) for name, p in peers.items()
    }
    a_bytes = m * k * (2 if case.startswith("a16w8") else 1)
    bytes_moved = n * k + a_bytes + 2 * m * n
    row = {
        "case": case,
        "shape": {"m": m, "n": n, "k": k},
        "fxfuse_us": round(fxfuse_us, 2),
        "peers_us": {k_: (round(v, 2) if v is not None else None) for k_, v in peers_us.items()},
        "roofline_us": round(roofline_us(bytes_moved, 2.0 * m * n * k, FP8_TFLOPS), 2),
        "timing": timing,
    }
    del calls, peers
    torch.cuda.empty_cache()
    return row


def cases_for(m_values):
    for n, k in SHAPES:
        for m in m_values:
            yield "a8w8_rowwise", m, n, k
            if m in BLOCKSCALE_M:
                yield "a8w8_blockscale", m, n, k
            if m in PREQUANT_M:
                yield "a16w8_pertoken", m, n, k
                yield "a16w8_group128", m, n, k


# --- CPU smoke --------------------------------------------------------------------------------


def cpu_smoke() -> None:
    """The correctness half, tiny, in Triton's interpreter (no timings)."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from fxfuse.kernels.gemm_fp8 import gemm_a16w8, gemm_fp8
    from fxfuse.kernels.gemm_ref import gemm_a16w8_ref, gemm_fp8_ref
    from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref

    small = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128, "SPLIT_K": 2}
    for (n, k), m in itertools.product([(64, 256), (48, 512)], [1, 17]):
        x = torch.randn(m, k).to(torch.bfloat16)
        w, ws = quant_fp8_ref(torch.randn(n, k), 0, torch.float8_e4m3fn)
        ws = ws.reshape(n)
        q, xs = quant_fp8_ref(x, 0, torch.float8_e4m3fn)
        err = rel_error(gemm_fp8(q, xs, w, ws, config=small), gemm_fp8_ref(q, xs, w, ws))
        qg, xg = quant_fp8_ref(x, 128, torch.float8_e4m3fn)
        wb, wbs = torch.randn(n, k).to(torch.float8_e4m3fn), torch.rand(1, k // 128) + 0.5
        err_b = rel_error(gemm_fp8(qg, xg, wb, wbs, config=small), gemm_fp8_ref(qg, xg, wb, wbs))
        err_p = rel_error(gemm_a16w8(x, w, ws, config=small), gemm_a16w8_ref(x, w, ws))
        print(
            f"cpu-smoke m={m} n={n} k={k}: rowwise {err:.2e} blockscale {err_b:.2e} "
            f"a16w8 {err_p:.2e}"
        )
        assert max(err, err_b, err_p) <= 1e-2
    print("cpu-smoke ok")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--sweep", action="store_true", help="sweep launch configs (sm90 table)")
    parser.add_argument("--shapes", default="", help="e.g. 2112x7168,4096x512 (default: all)")
    parser.add_argument("--m", default="", help="comma-separated M values (default: the list)")
    parser.add_argument("--cpu-smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        cpu_smoke()
        return
    if not torch.cuda.is_available():
        sys.exit("needs a GPU (or --cpu-smoke)")
    global SHAPES
    if args.shapes:
        SHAPES = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    m_values = [int(v) for v in args.m.split(",")] if args.m else M_VALUES
    command = "PYTHONPATH=. python benchmarks/bench_gemm_fp8.py " + " ".join(sys.argv[1:])
    results = header(command.strip())
    start = time.time()
    if args.sweep:
        sweep_rows = []

        def calls_for(m, n, k, config):
            return make_case("a8w8_rowwise", m, n, k, config, check=False)

        sweep_m = m_values if args.m else [16, 32, 64, 128, 1024, 8192]
        run_sweep("gemm_fp8", SHAPES, calls_for, sweep_m, sweep_rows)
        results["sweep"] = sweep_rows
        write_results(results, args.out, SUITE + "_sweep")
        return
    for case, m, n, k in cases_for(m_values):
        row = bench_row(case, m, n, k)
        print_row(row)
        results["rows"].append(row)
    print(f"{len(results['rows'])} rows in {time.time() - start:.0f} s")
    write_results(results, args.out, SUITE)


if __name__ == "__main__":
    main()
