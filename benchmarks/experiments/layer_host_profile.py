"""Where the fxfuse layer's host time goes (device host): issue time per call of the
deepseek_v32 layer at a prefill M under both backends, then a cProfile of the fxfuse-compiled
layer's calls, as the top functions by own time and by cumulative time.

A prefill layer whose host issue time nears its GPU time reads the host's time, not the
kernels' (benchmarks/NOTES.md, 2026-12-03 night); this names the Python that costs it.

    PYTHONPATH=. python benchmarks/experiments/layer_host_profile.py --out $OUT [--m 4096]
    PYTHONPATH=. python benchmarks/experiments/layer_host_profile.py --dry-run   # CPU, tiny
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def issue_and_wall(fn, x, device, calls: int) -> tuple[float, float]:
    fn(x)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(x)
    t1 = time.perf_counter()
    _sync(device)
    t2 = time.perf_counter()
    return 1e6 * (t1 - t0) / calls, 1e6 * (t2 - t0) / calls


def top(stats: pstats.Stats, key: str, limit: int, calls: int) -> list[dict]:
    stats.sort_stats(key)
    rows = []
    for func in stats.fcn_list[:limit]:
        cc, nc, tt, ct, _ = stats.stats[func]
        file, line, name = func
        rows.append({
            "function": f"{os.path.basename(file)}:{line}({name})",
            "calls_per_layer": round(nc / calls, 2),
            "own_us_per_layer": round(1e6 * tt / calls, 1),
            "cum_us_per_layer": round(1e6 * ct / calls, 1),
        })  # fmt: skip
    return rows


def main() -> int:
    import bench_layer

    from fxfuse.models import deepseek_v32

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--m", type=int, default=4096)
    parser.add_argument("--quant", default="fp8_rowwise")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--dry-run", action="store_true", help="tiny config on the CPU")
    args = parser.parse_args()
    device = torch.device("cpu" if args.dry_run else "cuda")
    m = 64 if args.dry_run else args.m
    cfg = bench_layer.model_config("deepseek_v32", args.quant, 1, dry_run=args.dry_run)
    model = deepseek_v32.build(cfg, device=device)
    (x,) = deepseek_v32.example_inputs(cfg, batch=1, seq=m, device=device, seed=m)
    result = {"torch": torch.__version__, "m": m, "quant": args.quant, "rounds": []}
    with torch.no_grad():
        fns = {}
        for name in ("inductor", "fxfuse"):
            fns[name] = bench_layer.compiled(model, name, x)[0]
        for rnd in range(3):
            for name, fn in fns.items():
                issue, wall = issue_and_wall(fn, x, device, args.calls)
                result["rounds"].append({"round": rnd, "backend": name, "issue_us": round(issue, 1),
                                         "wall_us": round(wall, 1)})  # fmt: skip
                print(f"M={m} round {rnd} {name:9s} issue {issue:8.1f} us  wall {wall:8.1f} us",
                      flush=True)  # fmt: skip
        fn = fns["fxfuse"]
        fn(x)
        _sync(device)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            fn(x)
        prof.disable()
        _sync(device)
    stats = pstats.Stats(prof, stream=io.StringIO())
    result["own"] = top(stats, "tottime", 35, args.calls)
    result["cumulative"] = top(stats, "cumulative", 60, args.calls)
    for what in ("own", "cumulative"):
        print(f"-- by {what} time (per layer call; cProfile inflates short calls)")
        for row in result[what]:
            print(f"  {row['own_us_per_layer']:9.1f} own {row['cum_us_per_layer']:9.1f} cum "
                  f"{row['calls_per_layer']:6.2f}x  {row['function'][:110]}")  # fmt: skip
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "layer_host_profile.json"), "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
