"""A16W8 per-token prequant GEMM at decode sizes: the row amax found inside the GEMM (each
program re-reads its rows of x) against the pre-pass kernel (one more launch), H200, CUDA graphs.
Decides ROW_AMAX_IN_KERNEL_MAX_M in kernels/gemm_fp8.py. Outputs of the two modes are compared
bit for bit first (same scale, same quantized tile).

    PYTHONPATH=. python benchmarks/experiments/prequant_amax.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import triton.testing

from fxfuse.kernels import gemm_fp8

# The deepseek_v32 layer's per-token prequant GEMMs (N, K) and the DeepSeek-R1 bench shapes.
SHAPES = [(2112, 7168), (1536, 7168), (7168, 2048), (7168, 2304), (4608, 7168), (3072, 1536)]
M_LIST = (1, 4, 8, 16, 32)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dev = torch.device("cuda")
    rows = []
    for n, k in SHAPES:
        w = (torch.randn(n, k, device=dev) / 4).to(torch.float8_e4m3fn)
        ws = torch.rand(n, device=dev) + 0.5
        for m in M_LIST:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            outs, times = {}, {}
            for mode in ("kernel", "prepass"):

                def fn(mode=mode, a=(x, w, ws)):
                    return gemm_fp8.gemm_a16w8(*a, row_amax=mode)

                outs[mode] = fn()
                times[mode] = triton.testing.do_bench_cudagraph(fn, rep=20) * 1e3
            row = {
                "n": n,
                "k": k,
                "m": m,
                "equal": bool(torch.equal(outs["kernel"], outs["prepass"])),
                "kernel_us": round(times["kernel"], 2),
                "prepass_us": round(times["prepass"], 2),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
