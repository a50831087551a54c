"""Where a deepseek_v32 layer's GPU time goes under backend="inductor" and backend="fxfuse":
torch.profiler over a few calls, the top kernels by CUDA time, and the fxfuse report.

    PYTHONPATH=. python benchmarks/experiments/layer_profile.py --quant fp8_block --m 16,4096
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import fxfuse
from fxfuse.models import deepseek_v32

TOP = 14


def profile_backend(model, x, backend: str, reps: int = 3) -> None:
    torch._dynamo.reset()
    fn = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        fn(x)
        torch.cuda.synchronize()
        if backend == "fxfuse":
            report = fxfuse.last_report()
            print("  rewrites:", {k: v for k, v in report.counts.items() if v})
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn(x)
            torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_type.name == "CUDA" or e.self_device_time_total]
    rows.sort(key=lambda e: e.self_device_time_total, reverse=True)
    total = sum(e.self_device_time_total for e in rows) / reps
    print(f"  {backend}: {total:9.1f} us of kernels per call")
    for e in rows[:TOP]:
        us = e.self_device_time_total / reps
        print(f"    {us:9.1f} us {100 * us / max(total, 1e-9):5.1f}%  x{e.count // reps:<3d} {e.key[:110]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quant", default="fp8_block")
    parser.add_argument("--m", default="16,4096")
    args = parser.parse_args()
    cfg = deepseek_v32.V32Config.deepseek_v32_tp8(quant=args.quant, layers=1)
    model = deepseek_v32.build(cfg, device="cuda")
    for m in (int(v) for v in args.m.split(",")):
        batch, seq = (m, 1) if m <= 64 else (1, m)
        (x,) = deepseek_v32.example_inputs(cfg, batch=batch, seq=seq, device="cuda", seed=m)
        print(f"== {args.quant} M={m} (batch {batch}, seq {seq})")
        for backend in ("inductor", "fxfuse"):
            profile_backend(model, x, backend)


if __name__ == "__main__":
    main()
