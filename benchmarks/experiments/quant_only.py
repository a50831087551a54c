"""The quant-only mode of the norm-quant kernel (behind `fxfuse.quant_fp8` / `quant_mxfp4`, and so
behind `fxfuse.quant_gemm` above prologue_quant_max_m) against the torch references it replaces.

For each (kind, M, K): checks the kernel's q and scale bytes against `quant_fp8_ref` /
`quant_mxfp4_ref` run on the same device (bit for bit, SPEC §5; inputs with outliers, a zero row,
a -0.0 row and a huge value), then times kernel and reference in microseconds. Roofline: x read
plus q and scales written / 4.25 TB/s (the H200 copy ceiling, PERFORMANCE.md). Timing as in
bench_rms_norm_quant.py: CUDA graphs (do_bench_cudagraph) over input sets rotated past the L2 when
a call is short or the inputs exceed 3x L2, do_bench otherwise. JSON is rewritten after every row,
so a run cut off by its time limit keeps what it measured.

    PYTHONPATH=. python benchmarks/experiments/quant_only.py [--out DIR_OR_FILE.json]
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/experiments/quant_only.py --cpu-smoke
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import triton
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_rms_norm_quant import Rotating, quant_out_bytes, time_us  # benchmarks/ is on sys.path

from fxfuse.kernels.rms_norm_quant import quant
from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref, quant_mxfp4_ref

KINDS = {
    "fp8_per_token": {"quant": "fp8", "group_size": 0},
    "fp8_group128": {"quant": "fp8", "group_size": 128},
    "mxfp4": {"quant": "mxfp4", "rounding": "even"},
}
M_LIST = (1, 16, 64, 256, 4096)
K_LIST = (2048, 7168, 18432)
COPY_BYTES_PER_US = 4.25e12 / 1e6
L2_BYTES = 60 * 2**20
GRAPH_BELOW_US = 50.0


def reference(x, kind):
    kw = KINDS[kind]
    if kw["quant"] == "mxfp4":
        return quant_mxfp4_ref(x, kw["rounding"])
    return quant_fp8_ref(x, kw["group_size"])


def kernel(x, kind):
    return quant(x, **KINDS[kind])


def make_inputs(m, k, device, seed, copies=1):
    g = torch.Generator(device=device).manual_seed(seed)
    sets = []
    for _ in range(copies):
        # Log-normal magnitudes: rows and groups with outliers, so scales and exponents vary.
        x = torch.randn(m, k, device=device, generator=g)
        x = x * torch.exp(torch.randn(m, k, device=device, generator=g))
        sets.append(x.to(torch.bfloat16))
    return sets


def adversarial(m, k, device):
    x = make_inputs(m, k, device, seed=m * 7 + k)[0]
    if m >= 4:
        x[0] = 0.0
        x[1] = -0.0
        x[2, k // 3] = torch.finfo(torch.bfloat16).max
        x[3, ::129] = 448.0
    return x


def bytes_moved(kind, m, k, elem=2):
    return m * k * elem + quant_out_bytes(KINDS[kind], m, k)  # x read; q + scales written


def _bytes(t):
    return t.flatten().view(torch.uint8)


def check(kind, m, k, device) -> tuple[bool, str]:
    x = adversarial(m, k, device)
    q, scale = kernel(x, kind)
    ref_q, ref_scale = reference(x, kind)
    problems = []
    if q.shape != ref_q.shape or not torch.equal(_bytes(q), _bytes(ref_q)):
        rows = (q.view(torch.uint8) != ref_q.view(torch.uint8)).any(-1).sum().item()
        problems.append(f"q differs on {rows}/{m} rows")
    if scale.shape != ref_scale.shape or not torch.equal(_bytes(scale), _bytes(ref_scale)):
        problems.append("scale differs")
    return not problems, "; ".join(problems) or "bit-exact"


def time_row(kind, m, k, device, rep_ms):
    moved = bytes_moved(kind, m, k)
    roofline_us = moved / COPY_BYTES_PER_US
    footprint = moved + 3 * m * k * 4  # plus the reference's fp32 intermediates
    graph = roofline_us / 0.9 < GRAPH_BELOW_US or footprint >= 3 * L2_BYTES
    copies = (
        1
        if not graph or footprint >= 3 * L2_BYTES
        else min(64, math.ceil(3 * L2_BYTES / footprint))
    )
    sets = make_inputs(m, k, device, seed=m * 31 + k, copies=copies)
    fns = {
        "kernel": Rotating(lambda x: kernel(x, kind), [(x,) for x in sets]),
        "reference": Rotating(lambda x: reference(x, kind), [(x,) for x in sets]),
    }
    for fn in fns.values():  # compile outside the timed region
        for _ in range(len(sets)):
            fn()
    torch.cuda.synchronize()
    first = time_us(fns["kernel"], graph, rep_ms)
    ref_us = time_us(fns["reference"], graph, rep_ms)
    again = time_us(fns["kernel"], graph, rep_ms)
    kernel_us = min(first, again)
    return {
        "kernel_us": round(kernel_us, 3),
        "kernel_spread_us": round(abs(first - again), 3),
        "reference_us": round(ref_us, 3),
        "speedup": round(ref_us / kernel_us, 2),
        "roofline_us": round(roofline_us, 3),
        "of_roofline": round(roofline_us / kernel_us, 3),
        "timing": "cudagraph" if graph else "do_bench",
    }


def out_path(out):
    """--out as a .json file, or a directory (device_suite passes $RES) to hold quant_only.json."""
    if not out:
        return None
    if out.endswith(".json"):
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        return out
    os.makedirs(out, exist_ok=True)
    return os.path.join(out, "quant_only.json")


def write(path, meta, rows, checks_ok):
    if path:
        with open(path, "w") as f:
            json.dump({**meta, "all_bit_exact": checks_ok, "rows": rows}, f, indent=1)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_out = (
        os.path.join(os.environ["OUT"], "quant_only.json") if os.environ.get("OUT") else None
    )
    parser.add_argument("--out", default=default_out, help="a .json path or a directory")
    parser.add_argument("--m", type=int, nargs="+", default=list(M_LIST))
    parser.add_argument("--k", type=int, nargs="+", default=list(K_LIST))
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS))
    parser.add_argument("--rep-ms", type=int, default=10, help="timed milliseconds per measurement")
    parser.add_argument("--check-only", action="store_true", help="bit-exactness only, no timing")
    parser.add_argument(
        "--budget-s", type=float, default=105.0, help="stop timing new rows after this many seconds"
    )
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="checks only, tiny shapes, on the CPU (needs TRITON_INTERPRET=1)",
    )
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.cpu_smoke:
        device = torch.device("cpu")
        args.m, args.k, args.check_only = [1, 5], [256, 384], True
    elif not torch.cuda.is_available():
        sys.exit("quant_only: needs a CUDA/ROCm GPU (or --cpu-smoke with TRITON_INTERPRET=1)")
    else:
        device = torch.device("cuda", torch.cuda.current_device())
    path = out_path(args.out)
    meta = {
        "suite": "quant_only",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "timing": "median us; cudagraph rows over rotated inputs, do_bench rows L2-flushed",
        "reference": "quant_fp8_ref / quant_mxfp4_ref eager on the same device",
    }
    t0 = time.time()
    rows, all_ok = [], True
    header = f"{'kind':<14} {'K':>6} {'M':>5}  {'check':<10} {'kernel us':>10} {'ref us':>9} {'x':>6} {'roof':>6}"
    print(header, flush=True)
    for kind in args.kinds:
        for k in args.k:
            for m in args.m:
                ok, detail = check(kind, m, k, device)
                all_ok &= ok
                row = {"kind": kind, "m": m, "k": k, "bit_exact": ok, "check": detail}
                if not args.check_only and time.time() - t0 < args.budget_s:
                    row.update(time_row(kind, m, k, device, args.rep_ms))
                rows.append(row)
                write(path, meta, rows, all_ok)
                timed = (
                    f"{row['kernel_us']:>10.2f} {row['reference_us']:>9.2f} "
                    f"{row['speedup']:>5.1f}x {row['of_roofline']:>6.0%}"
                    if "kernel_us" in row
                    else "untimed"
                )
                print(
                    f"{kind:<14} {k:>6} {m:>5}  {'ok' if ok else 'FAIL':<10} {timed}"
                    + ("" if ok else f"  ({detail})"),
                    flush=True,
                )
    print(f"all bit-exact: {all_ok}; {time.time() - t0:.0f}s" + (f"; wrote {path}" if path else ""))
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
