"""Residual RMSNorm → quant with the normed y kept (an MoE router reads y, its experts the
quant): `fxfuse.add_rms_norm_quant_with_norm` against what the graph ran before it fused (the
canonical `add_rms_norm` then `quant_fp8` / `quant_mxfp4`, two kernels) and Inductor's compile
of the spelled chain returning (q, scale, h, y). Each fused output is compared with the
two-kernel path first (where not bit-equal: the rows of y that differ, by how many ulps, and
whether q is the quant of the fused y). µs, medians; CUDA graphs over rotated inputs.

    PYTHONPATH=. python benchmarks/experiments/norm_quant_with_norm.py [--n 7168] [--m 1,32,4096]
    (writes $OUT/norm_quant_with_norm.json)
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_rms_norm_quant import (  # noqa: E402
    CASES,
    COPY_BYTES_PER_US,
    EPS,
    Rotating,
    bytes_moved,
    copies_for,
    make_inputs,
    max_ulps,
    residual_rms_norm,
    time_us,
    unfused,
    use_graph,
)

import fxfuse  # noqa: E402, F401  (registers the ops)

ops = torch.ops.fxfuse


def quant_args(case: str) -> tuple:
    kw = CASES[case]
    if kw["quant"] == "mxfp4":
        return ("mxfp4", 0, torch.float8_e4m3fn, 0.0, False, False, False, kw["rounding"])
    return ("fp8", kw["group_size"], torch.float8_e4m3fn, 1e-10, False, False, False, "even")


def with_norm(case: str):
    args = quant_args(case)

    def call(x, r, w):
        return ops.add_rms_norm_quant_with_norm(x, r, w, EPS, 0.0, True, None, False, *args)

    return call


def two_kernels(case: str):
    quant, group, fp8, qeps, *_ = quant_args(case)

    def call(x, r, w):
        y, h = ops.add_rms_norm(x, r, w, EPS)
        if quant == "mxfp4":
            q, s = ops.quant_mxfp4(y, "even")
        else:
            q, s = ops.quant_fp8(y, group, fp8, qeps)
        return q, s, h, y

    return call


def compare(case: str, got, want, inputs) -> dict:
    """How the fused (q, scale, h, y) differ from the two kernels': rows of y that differ and by
    how many bf16 ulps (the two kernels' reductions may round a row's sum differently: SPEC §5),
    and whether the fused q, scale are the quant of the fused y (its own bytes, consistent)."""
    quant, group, fp8, qeps, *_ = quant_args(case)
    y, y_want = got[3], want[3]
    rows = (y.view(torch.int16) != y_want.view(torch.int16)).any(-1)
    if quant == "mxfp4":
        q, s = ops.quant_mxfp4(y, "even")
    else:
        q, s = ops.quant_fp8(y, group, fp8, qeps)
    consistent = torch.equal(q.view(torch.uint8), got[0].view(torch.uint8)) and torch.equal(
        s.view(torch.uint8), got[1].view(torch.uint8)
    )
    spelled_y = residual_rms_norm(*inputs)[0]
    return {"y_rows_differ": int(rows.sum()), "rows": y.shape[0], "y_max_ulps": max_ulps(y, y_want),
            "h_equal": torch.equal(got[2], want[2]), "q_is_quant_of_y": consistent,
            # SPEC §5 holds each against the spelled chain (torch's own reduction order)
            "fused_y_vs_spelled_max_ulps": max_ulps(y, spelled_y),
            "two_kernel_y_vs_spelled_max_ulps": max_ulps(y_want, spelled_y)}  # fmt: skip


def spelled(case: str):
    chain = unfused(case)

    def call(x, r, w):
        q, s, h = chain(x, r, w)
        return q, s, h, residual_rms_norm(x, r, w)[0]

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=7168)
    parser.add_argument("--m", default="1,32,4096,16384")
    parser.add_argument("--check-only", action="store_true", help="compare, do not time")
    args = parser.parse_args()
    rows, n = [], args.n
    for case in CASES:
        compiled = torch.compile(spelled(case), dynamic=False)
        for m in (int(v) for v in args.m.split(",")):
            moved = bytes_moved(case, m, n) + 2 * m * n  # and y written
            graph = use_graph(moved / COPY_BYTES_PER_US, moved)
            sets = make_inputs(m, n, "cuda", seed=m + n, copies=copies_for(moved, graph))
            got, want = with_norm(case)(*sets[0]), two_kernels(case)(*sets[0])
            same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                       for a, b in zip(got, want))  # fmt: skip
            diff = {} if same else compare(case, got, want, sets[0])
            if args.check_only:
                print(f"{case:32s} m={m:>6} equal={same} {diff}", flush=True)
                rows.append({"case": case, "m": m, "n": n, "bit_equal": same, **diff})
                continue
            fns = {"with_norm": with_norm(case), "two_kernels": two_kernels(case),
                   "inductor": compiled}  # fmt: skip
            us = {}
            for name, fn in fns.items():
                rot = Rotating(fn, sets)
                for _ in range(len(sets)):
                    rot()
                us[name] = round(time_us(rot, graph), 3)
            us["with_norm_again"] = round(time_us(Rotating(fns["with_norm"], sets), graph), 3)
            row = {"case": case, "m": m, "n": n, "us": us, "bit_equal": same, **diff,
                   "roofline_us": round(moved / COPY_BYTES_PER_US, 3),
                   "timing": "cudagraph" if graph else "do_bench"}  # fmt: skip
            rows.append(row)
            cells = " ".join(f"{k} {v:8.2f}" for k, v in us.items())
            print(f"{case:32s} m={m:>6} equal={same} {diff} {cells}", flush=True)
    out = os.path.join(os.environ.get("OUT", "/tmp"), "norm_quant_with_norm.json")
    with open(out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "rows": rows}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
