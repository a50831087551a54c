"""Why the fxfuse prefill time of the deepseek_v32 layer differs between two timings of one
session (bench_layer.py's "again" column, e.g. 3662 vs 5562 us at fp8_rowwise M = 4096) while
Inductor's does not: each backend timed four times, interleaved, with the caching allocator's
device allocations / frees / retries counted over each timing, and a plain event-timed loop
(no L2 flush) beside do_bench.

    PYTHONPATH=. python benchmarks/experiments/layer_variance.py --quant fp8_rowwise --m 4096
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_layer

from fxfuse.models import deepseek_v32


def loop_us(fn, iters=10):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return 1e3 * start.elapsed_time(end) / iters


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quant", default="fp8_rowwise")
    parser.add_argument("--m", type=int, default=4096)
    parser.add_argument("--backends", default="inductor,fxfuse")
    parser.add_argument(
        "--host",
        action="store_true",
        help="also time the host's issue of 10 calls (no sync) against their wall",
    )
    args = parser.parse_args()
    dev = torch.device("cuda")
    cfg = bench_layer.model_config("deepseek_v32", args.quant, 1, dry_run=False)
    model = deepseek_v32.build(cfg, device=dev)
    (x,) = deepseek_v32.example_inputs(cfg, batch=1, seq=args.m, device=dev, seed=args.m)
    fns = {}
    with torch.no_grad():
        for backend in args.backends.split(","):
            fns[backend] = bench_layer.compiled(model, backend, x)[0]
        if args.host:
            import time

            for rnd in range(3):
                for backend, fn in fns.items():
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(10):
                        fn(x)
                    t1 = time.perf_counter()
                    torch.cuda.synchronize()
                    t2 = time.perf_counter()
                    print(
                        f"host {rnd} {backend:9s} issue {1e5 * (t1 - t0):9.1f} us/call  "
                        f"wall {1e5 * (t2 - t0):9.1f} us/call",
                        flush=True,
                    )
        for rnd in range(4):
            for backend, fn in fns.items():
                s0 = torch.cuda.memory_stats()
                us = 1e3 * triton.testing.do_bench(lambda fn=fn: fn(x), warmup=10, rep=100)
                s1 = torch.cuda.memory_stats()
                lus = loop_us(lambda fn=fn: fn(x))
                d = {
                    key: s1.get(key, 0) - s0.get(key, 0)
                    for key in ("num_device_alloc", "num_device_free", "num_alloc_retries")
                }
                print(
                    f"round {rnd} {backend:9s} do_bench {us:9.1f} us  loop {lus:9.1f} us  "
                    f"reserved {s1.get('reserved_bytes.all.current', 0) / 2**30:6.2f} GiB  {d}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
