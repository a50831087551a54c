"""One profiled call of a fused kernel for Nsight Compute (device machines with hardware counters).

Warms the call up (compiles, fills caches), then runs it once between cudaProfilerStart / Stop,
so `ncu --profile-from-start off` records only that call's kernels:

    ncu --clock-control none --profile-from-start off --set full -o $OUT/topk -f \
        python benchmarks/experiments/ncu_driver.py topk --rows 256 --length 131072 --k 2048
    ncu --clock-control none --profile-from-start off --set full -o $OUT/a16wfp4 -f \
        python benchmarks/experiments/ncu_driver.py a16wfp4 --m 16 --n 24576 --kdim 1536

Cases: topk (the DSA page transform of bench_topk, the launch table's path), a16wfp4 / afp4wfp4
(bench_gemm_mxfp4's inputs, the launch table's config).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def topk_call(args):
    import bench_topk

    from fxfuse.kernels import topk

    device = torch.device("cuda")
    scores, lengths, table = bench_topk.page_inputs(args.rows, args.length, device, seed=1)[0]

    def call():
        return topk.topk_page_transform(
            scores, args.k, lengths, table, bench_topk.PAGE_SIZE, sorted=False, path=args.path
        )

    return call


def gemm_call(args):
    import bench_gemm_mxfp4

    calls, _ = bench_gemm_mxfp4.make_case(args.case, args.m, args.n, args.kdim, None, check=True)
    return calls[0]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case", choices=("topk", "a16wfp4", "afp4wfp4"))
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--length", type=int, default=131072)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--path", default="auto")
    p.add_argument("--m", type=int, default=16)
    p.add_argument("--n", type=int, default=24576)
    p.add_argument("--kdim", type=int, default=1536)
    args = p.parse_args(argv)
    call = topk_call(args) if args.case == "topk" else gemm_call(args)
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
