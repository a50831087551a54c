"""Why is residual RMSNorm + FP8 per-token / MXFP4 at N = 7168, M = 4096 slower than M = 8192?

Times the fused kernel and Inductor's compile of the unfused spelling at M in {4096, 8192, 16384},
N = 7168, three ways each: do_bench (L2 flushed before each call), do_bench_cudagraph over one
input set, and do_bench_cudagraph over rotated input sets; and the kernel under several configs.

    PYTHONPATH=. python benchmarks/experiments/rms_midm_probe.py
"""

from __future__ import annotations

import torch
import triton.testing

import bench_rms_norm_quant as bench  # noqa: E402  (benchmarks/ on sys.path: run from there)
from fxfuse.kernels.rms_norm_quant import rms_norm_quant


def _graph(fn):
    return triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3


def _plain(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3


def main():
    dev = torch.device("cuda")
    n = 7168
    configs = [None] + [
        {"BLOCK_N_MAX": 8192, "ROWS_PER_PROGRAM": rpp, "num_warps": w}
        for rpp, w in ((1, 4), (1, 8), (1, 16), (2, 8), (2, 16), (4, 16))
    ]
    for case in bench.CASES:
        kw = bench.CASES[case]
        for m in (4096, 8192, 16384):
            moved = bench.bytes_moved(case, m, n)
            roof = moved / bench.COPY_BYTES_PER_US
            sets = bench.make_inputs(m, n, dev, seed=m, copies=1)
            x, r, w = sets[0]
            rot = bench.make_inputs(m, n, dev, seed=m + 1, copies=3)
            line = []
            for cfg in configs:
                fn = lambda cfg=cfg: rms_norm_quant(x, w, bench.EPS, r, config=cfg, **kw)  # noqa: E731
                try:
                    g = _graph(fn)
                except Exception as e:  # noqa: BLE001
                    line.append(f"{cfg}: {type(e).__name__}")
                    continue
                name = "table" if cfg is None else f"r{cfg['ROWS_PER_PROGRAM']}w{cfg['num_warps']}"
                line.append(f"{name} {g:6.1f} ({roof / g:4.0%})")
            it = iter(range(10**9))
            fn_rot = lambda: rms_norm_quant(*_pick(rot, next(it)), **kw)  # noqa: E731
            spelled = torch.compile(bench.unfused(case))
            spelled(x, r, w)
            ind = lambda: spelled(x, r, w)  # noqa: E731
            print(
                f"{case:32s} M={m:6d} roof {roof:6.1f}  plain {_plain(lambda: rms_norm_quant(x, w, bench.EPS, r, **kw)):6.1f}"
                f"  graph-rot {_graph(fn_rot):6.1f}  inductor graph {_graph(ind):6.1f} plain {_plain(ind):6.1f}",
                flush=True,
            )
            print("    " + " | ".join(line), flush=True)
            torch._dynamo.reset()


def _pick(sets, i):
    x, r, w = sets[i % len(sets)]
    return x, w, bench.EPS, r


if __name__ == "__main__":
    main()
