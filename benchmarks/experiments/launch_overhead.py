"""Host time of one fused op at a prefill shape, peeled layer by layer (device host).

For the norm-quant op (M 4096, K 7168, FP8 per token) and the vendor-routed FP8 GEMM (M 4096,
2112 x 7168), the host issue time per call (no sync) of:
  op          through the dispatcher, as a compiled graph calls it
  impl        the op's Python implementation
  wrapper     the kernel module's launcher (checks, allocation, table lookup, launch)
  jit run     the same `kernel[grid](...)` call with its arguments prebuilt (Triton's binding)
  ck.run      the compiled kernel's launcher called directly (no binding): the floor
each with launch plans off and on (fxfuse/kernels/_plans.py), and the deepseek_v32 layer's
issue time per call at M 4096 under both backends (plans on).

    PYTHONPATH=. python benchmarks/experiments/launch_overhead.py --out $OUT
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def issue_us(fn, calls: int = 300) -> float:
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        best = min(best, 1e6 * (t1 - t0) / calls)
    return best


def capture_launch(jit_fn, call):
    """Run `call` once with jit_fn.run wrapped; returns (args, kwargs) of its launch."""
    captured = []
    orig = jit_fn.run

    def run(*args, **kwargs):
        captured.append((args, dict(kwargs)))
        return orig(*args, **kwargs)

    jit_fn.run = run
    try:
        call()
    finally:
        del jit_fn.run
    return captured[-1]


def direct_launcher(jit_fn, args, kwargs):
    """A closure calling the compiled kernel's launcher with prebuilt arguments."""
    grid = kwargs.pop("grid")
    kwargs.pop("warmup", None)
    ck = jit_fn.run(*args, grid=grid, warmup=False, **kwargs)
    params = list(inspect.signature(jit_fn.fn).parameters)
    bound = dict(zip(params, args))
    for name in params[len(args):]:
        bound[name] = kwargs.get(name, inspect.signature(jit_fn.fn).parameters[name].default)
    values = [bound[p] for p in params]
    g = tuple(grid) + (1, 1)
    stream = torch.cuda.current_stream().cuda_stream
    fn, meta = ck.function, ck.packed_metadata

    def launch():
        ck.run(g[0], g[1], g[2], stream, fn, meta, None, None, None, *values)

    return launch


def op_rows() -> list[dict]:
    from fxfuse.kernels import rms_norm_quant as nq_kernels
    from fxfuse.runtime import gemm_ops, norm_quant_ops

    dev = torch.device("cuda")
    m, k, n = 4096, 7168, 2112
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    wn = torch.rand(k, device=dev, dtype=torch.bfloat16)
    nq_args = (x, wn, 1e-6, 0.0, True, None, False, "fp8", 0, torch.float8_e4m3fn, 1e-10, False,
               False, False, "even")
    q = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
    w = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn)
    xs, ws = torch.rand(m, 1, device=dev), torch.rand(n, device=dev)
    bf16 = torch.bfloat16

    def wrapper():
        return nq_kernels.rms_norm_quant(x, wn, 1e-6)

    cases = {
        "rms_norm_quant op": lambda: torch.ops.fxfuse.rms_norm_quant.default(*nq_args),
        "rms_norm_quant impl": lambda: norm_quant_ops.rms_norm_quant.impl(*nq_args),
        "rms_norm_quant wrapper": wrapper,
    }
    jit_fn = nq_kernels._rms_norm_quant_rows_kernel
    try:
        args, kwargs = capture_launch(jit_fn, wrapper)
        cases["rms_norm_quant jit run"] = lambda: jit_fn.run(*args, **kwargs)
        cases["rms_norm_quant ck.run"] = direct_launcher(jit_fn, args, dict(kwargs))
    except Exception as e:  # noqa: BLE001 - a probe: report and go on
        print("capture failed:", type(e).__name__, e)
    cases.update({
        "gemm_fp8 op (vendor)": lambda: torch.ops.fxfuse.gemm_fp8.default(q, xs, w, ws, bf16),
        "gemm_fp8 impl (vendor)": lambda: gemm_ops.gemm_fp8.impl(q, xs, w, ws, bf16),
        "torch._scaled_mm": lambda: torch._scaled_mm(q, w.t(), xs, ws.view(1, -1), out_dtype=bf16),
        "empty (4096x7168 bf16)": lambda: torch.empty((m, k), device=dev, dtype=bf16),
    })
    from fxfuse.kernels import _plans

    rows = []
    with torch.no_grad():
        for plans in (False, True):
            _plans.enabled = plans
            for name, fn in cases.items():
                if plans and ("jit run" in name or "ck.run" in name or "empty" in name):
                    continue
                try:
                    host = issue_us(fn)
                except Exception as e:  # noqa: BLE001
                    print(f"op {name:28s} failed: {type(e).__name__}: {e}")
                    continue
                rows.append({"case": name, "plans": plans, "issue_us": host})
                print(f"op {name:28s} plans {int(plans)} issue {host:8.2f} us", flush=True)
    return rows


def layer_rows(m: int) -> list[dict]:
    import bench_layer

    from fxfuse.models import deepseek_v32

    dev = torch.device("cuda")
    cfg = bench_layer.model_config("deepseek_v32", "fp8_rowwise", 1, dry_run=False)
    model = deepseek_v32.build(cfg, device=dev)
    (x,) = deepseek_v32.example_inputs(cfg, batch=1, seq=m, device=dev, seed=m)
    rows = []
    with torch.no_grad():
        fns = {name: bench_layer.compiled(model, name, x)[0] for name in ("inductor", "fxfuse")}
        for rnd in range(3):
            for name, fn in fns.items():
                fn(x)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(20):
                    fn(x)
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                host, wall = 1e6 * (t1 - t0) / 20, 1e6 * (t2 - t0) / 20
                rows.append({"round": rnd, "backend": name, "issue_us": host, "wall_us": wall})
                print(f"layer M={m} round {rnd} {name:9s} issue {host:8.1f} us  "
                      f"wall {wall:8.1f} us", flush=True)  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--m", type=int, default=4096)
    parser.add_argument("--no-layer", action="store_true")
    args = parser.parse_args()
    result = {"torch": torch.__version__, "ops": op_rows()}
    if not args.no_layer:
        result["layer"] = layer_rows(args.m)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "launch_overhead.json"), "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
