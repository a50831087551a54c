"""MXFP4 GEMM benchmark (suite "gemm_mxfp4"): fxfuse AFP4WFP4 and prequant A16WFP4 against
dequantize-then-bf16 F.linear and bf16 F.linear on the unquantized weight (PERFORMANCE.md), on
the DeepSeek-R1 shapes.

    PYTHONPATH=. python benchmarks/bench_gemm_mxfp4.py --out benchmarks/results   # H200, ~3 min
    PYTHONPATH=. python benchmarks/bench_gemm_mxfp4.py --sweep --shapes 2112x7168  # ~2 min a shape;
        # writes gemm_a16wfp4_sweep.json (M <= 128) and gemm_mxfp4_sweep.json (larger M)
    PYTHONPATH=. python benchmarks/bench_gemm_mxfp4.py --cpu-smoke                 # interpreter

Also times Triton's tl.dot_scaled emulation on non-gfx950 targets for a few M (case suffix
"_dot_scaled") to show which inner product the target should default to. Timing and roofline as in
bench_gemm_fp8 (FLOPs at the bf16 rate, 680 TFLOP/s: the H200 has no FP4 tensor cores).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gemm_fp8 as common

SHAPES = list(common.SHAPES)
M_VALUES = [1, 4, 16, 32, 64, 128, 1024, 4096, 8192, 16384]
PREQUANT_M = [1, 4, 16, 32, 64, 128]
DOT_SCALED_M = [16, 4096]
SUITE = "gemm_mxfp4"


def _mx(rows, k, device):
    from fxfuse.kernels.rms_norm_quant_ref import quant_mxfp4_ref

    x = torch.randn(rows, k, device=device) * torch.exp(torch.randn(rows, k, device=device))
    x = x.to(torch.bfloat16)
    q, s = quant_mxfp4_ref(x)
    return x, q, s


def make_case(case: str, m: int, n: int, k: int, config: dict | None, check: bool = True):
    from fxfuse.kernels import formats
    from fxfuse.kernels.gemm_mxfp4 import gemm_a16wfp4, gemm_mxfp4
    from fxfuse.kernels.gemm_ref import gemm_mxfp4_ref

    device = torch.device("cuda")
    prequant = case.startswith("a16wfp4")
    dot_scaled = True if case.endswith("_dot_scaled") else None
    copies = common.copies_for(n * k // 2 + m * k * (2 if prequant else 1))
    inputs = []
    for _ in range(copies):
        wf, w, ws = _mx(n, k, device)
        x, q, xs = _mx(m, k, device)
        inputs.append((x, q, xs, w, ws, wf))

    if prequant:

        def fused(x, q, xs, w, ws):
            return gemm_a16wfp4(x, w, ws, use_dot_scaled=dot_scaled, config=config)
    else:

        def fused(x, q, xs, w, ws):
            return gemm_mxfp4(q, xs, w, ws, use_dot_scaled=dot_scaled, config=config)

    if check:
        x, q, xs, w, ws, _ = inputs[0]
        rows = slice(0, min(m, 256))
        err = common.rel_error(
            fused(x, q, xs, w, ws)[rows], gemm_mxfp4_ref(q[rows], xs[rows], w, ws)
        )
        if err > 1e-2:
            raise AssertionError(f"{case} m={m} n={n} k={k}: relative error {err:.3g} > 1e-2")

    def dequant_linear(a):
        # What a user runs without a kernel: unpack the weight to bf16 every call.
        w_bf16 = formats.unpack_mxfp4(a[3], a[4]).to(torch.bfloat16)
        if prequant:
            return F.linear(a[0], w_bf16)
        return F.linear(formats.unpack_mxfp4(a[1], a[2]).to(torch.bfloat16), w_bf16)

    calls = [lambda a=a: fused(*a[:5]) for a in inputs]
    peers = {
        "dequant_bf16_linear": [lambda a=a: dequant_linear(a) for a in inputs],
        "bf16_linear": [lambda a=a: F.linear(a[0], a[5]) for a in inputs],
    }
    return calls, peers


def bench_row(case: str, m: int, n: int, k: int) -> dict:
    calls, peers = make_case(case, m, n, k, None)
    timing, fxfuse_us = common.time_case(calls)
    use_graph = timing == "cudagraph"
    peers_us = {name: common.time_us(p, use_graph) for name, p in peers.items()}
    a_bytes = m * k * 2 if case.startswith("a16wfp4") else m * k // 2 + m * k // 32
    bytes_moved = n * k // 2 + n * k // 32 + a_bytes + 2 * m * n
    row = {
        "case": case,
        "shape": {"m": m, "n": n, "k": k},
        "fxfuse_us": round(fxfuse_us, 2),
        "peers_us": {name: round(v, 2) for name, v in peers_us.items()},
        "roofline_us": round(
            common.roofline_us(bytes_moved, 2.0 * m * n * k, common.BF16_TFLOPS), 2
        ),
        "timing": timing,
    }
    del calls, peers
    torch.cuda.empty_cache()
    return row


def cases_for(m_values, target):
    for n, k in SHAPES:
        for m in m_values:
            yield "afp4wfp4", m, n, k
            if m in PREQUANT_M:
                yield "a16wfp4", m, n, k
            if target != "gfx950" and m in DOT_SCALED_M and (n, k) == SHAPES[0]:
                yield "afp4wfp4_dot_scaled", m, n, k
                if m in PREQUANT_M:
                    yield "a16wfp4_dot_scaled", m, n, k


def cpu_smoke() -> None:
    """The correctness half, tiny, in Triton's interpreter (no timings)."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from fxfuse.kernels.gemm_mxfp4 import gemm_a16wfp4, gemm_mxfp4
    from fxfuse.kernels.gemm_ref import (
        gemm_a16wfp4_ref,
        gemm_mxfp4_ref,
        preshuffle_scale_e8m0,
        preshuffle_weight_fp4,
    )
    from fxfuse.kernels.rms_norm_quant_ref import quant_mxfp4_ref

    small = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128, "SPLIT_K": 2}
    for (n, k), m in itertools.product([(64, 256), (48, 512)], [1, 17]):
        x = torch.randn(m, k).to(torch.bfloat16)
        w, ws = quant_mxfp4_ref(torch.randn(n, k))
        q, xs = quant_mxfp4_ref(x)
        err = common.rel_error(gemm_mxfp4(q, xs, w, ws, config=small), gemm_mxfp4_ref(q, xs, w, ws))
        err_p = common.rel_error(gemm_a16wfp4(x, w, ws, config=small), gemm_a16wfp4_ref(x, w, ws))
        shuffled = gemm_mxfp4(
            q,
            xs,
            preshuffle_weight_fp4(w),
            preshuffle_scale_e8m0(ws),
            preshuffled=True,
            n=n,
            config=small,
        )
        err_s = common.rel_error(shuffled, gemm_mxfp4_ref(q, xs, w, ws))
        print(
            f"cpu-smoke m={m} n={n} k={k}: afp4wfp4 {err:.2e} a16wfp4 {err_p:.2e} "
            f"preshuffled {err_s:.2e}"
        )
        assert max(err, err_p, err_s) <= 1e-2
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
    from fxfuse.runtime.target import detect_target

    global SHAPES
    if args.shapes:
        SHAPES = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    m_values = [int(v) for v in args.m.split(",")] if args.m else M_VALUES
    command = "PYTHONPATH=. python benchmarks/bench_gemm_mxfp4.py " + " ".join(sys.argv[1:])
    results = common.header(command.strip())
    start = time.time()
    if args.sweep:
        # M <= 128 sweeps the prequant A16WFP4 kernel (its own table), larger M AFP4WFP4.
        sweep_m = m_values if args.m else [16, 32, 64, 128, 1024, 8192]
        for table, case, ms in (("gemm_a16wfp4", "a16wfp4", [m for m in sweep_m if m <= 128]),
                                ("gemm_mxfp4", "afp4wfp4", [m for m in sweep_m if m > 128])):
            if not ms:
                continue
            sweep_rows = []

            def calls_for(m, n, k, config, case=case):
                return make_case(case, m, n, k, config, check=False)

            common.run_sweep(table, SHAPES, calls_for, ms, sweep_rows)
            common.write_results({**results, "sweep": sweep_rows}, args.out, table + "_sweep")
        return
    for case, m, n, k in cases_for(m_values, detect_target()):
        row = bench_row(case, m, n, k)
        common.print_row(row)
        results["rows"].append(row)
    print(f"{len(results['rows'])} rows in {time.time() - start:.0f} s")
    common.write_results(results, args.out, SUITE)


if __name__ == "__main__":
    main()
