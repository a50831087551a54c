"""Where the host's time goes when a compiled layer calls fxfuse's custom ops.

1. Dispatch alone: a trivial op (a clone) called directly, as a `torch.library.custom_op`, and as
   an op defined with `torch.library.Library` and a plain kernel registration, under no_grad and
   inference_mode: the issue time per call (no sync), on a tensor so small that the GPU is idle.
2. The deepseek_v32 layer compiled by Inductor and by fxfuse: the host's issue time per call
   against the wall per call (3 rounds), then cProfile over 10 fxfuse calls (top functions by own
   time and by cumulative time, written to $OUT/host_profile_<quant>_<m>.txt).

    PYTHONPATH=. python benchmarks/experiments/host_overhead.py --quant fp8_rowwise --m 4096 --out $OUT
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
import bench_layer

from fxfuse.models import deepseek_v32


def issue_us(fn, calls: int = 200) -> tuple[float, float]:
    """(host issue µs per call without a sync, wall µs per call with the final sync)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return 1e6 * (t1 - t0) / calls, 1e6 * (t2 - t0) / calls


@torch.library.custom_op("fxfuse_probe::clone_custom", mutates_args=())
def clone_custom(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@clone_custom.register_fake
def _(x):
    return torch.empty_like(x)


_LIB = torch.library.Library("fxfuse_probe", "FRAGMENT")
_LIB.define("clone_lib(Tensor x) -> Tensor")
_LIB.impl("clone_lib", lambda x: x.clone(), "CUDA")


def dispatch_rows() -> list[dict]:
    x = torch.randn(16, device="cuda")
    cases = {
        "direct x.clone()": lambda: x.clone(),
        "aten.clone (C++ op)": lambda: torch.ops.aten.clone.default(x),
        "custom_op": lambda: torch.ops.fxfuse_probe.clone_custom.default(x),
        "Library.impl CUDA": lambda: torch.ops.fxfuse_probe.clone_lib.default(x),
    }
    rows = []
    for mode_name, mode in (("no_grad", torch.no_grad), ("inference_mode", torch.inference_mode)):
        for name, fn in cases.items():
            with mode():
                host, wall = issue_us(fn)
            rows.append({"mode": mode_name, "case": name, "issue_us": host, "wall_us": wall})
            print(f"dispatch {mode_name:15s} {name:22s} issue {host:7.2f} us  wall {wall:7.2f} us")
    return rows


def op_rows() -> list[dict]:
    """One op at a layer shape, peeled: through the dispatcher (what a compiled graph calls), its
    Python implementation without the custom_op layers, the kernel's launcher alone; and a bare
    Triton launch of a 3-argument kernel, the floor of any launch."""
    import triton
    import triton.language as tl

    from fxfuse.kernels import gemm_fp8 as gemm_fp8_kernels
    from fxfuse.runtime import gemm_ops, norm_quant_ops

    @triton.jit
    def _touch(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    dev = torch.device("cuda")
    q = torch.randn(16, 7168, device=dev).to(torch.float8_e4m3fn)
    w = torch.randn(2112, 7168, device=dev).to(torch.float8_e4m3fn)
    xs, ws = torch.rand(16, 1, device=dev), torch.rand(2112, device=dev)
    x = torch.randn(16, 7168, device=dev, dtype=torch.bfloat16)
    small = torch.randn(16, device=dev)
    bf16 = torch.bfloat16
    cases = {
        "gemm_fp8 op": lambda: torch.ops.fxfuse.gemm_fp8.default(q, xs, w, ws, bf16),
        "gemm_fp8 python impl": lambda: gemm_ops._gemm_fp8(q, xs, w, ws, bf16),
        "gemm_fp8 launcher": lambda: gemm_fp8_kernels.gemm_fp8(q, xs, w, ws, bf16),
        "torch._scaled_mm": lambda: torch._scaled_mm(
            q, w.t(), xs, ws.view(1, -1), out_dtype=bf16
        ),
        "quant_fp8 op": lambda: torch.ops.fxfuse.quant_fp8.default(x),
        "quant_fp8 python impl": lambda: norm_quant_ops.quant_fp8.impl(x),
        "bare triton launch": lambda: _touch[(1,)](small, 16, BLOCK=16),
    }
    rows = []
    with torch.no_grad():
        for name, fn in cases.items():
            host, wall = issue_us(fn)
            rows.append({"case": name, "issue_us": host, "wall_us": wall})
            print(f"op {name:24s} issue {host:7.2f} us  wall {wall:7.2f} us")
    return rows


def layer_rows(quant: str, m: int, out_dir: str | None) -> list[dict]:
    dev = torch.device("cuda")
    cfg = bench_layer.model_config("deepseek_v32", quant, 1, dry_run=False)
    model = deepseek_v32.build(cfg, device=dev)
    decode = m <= bench_layer.DECODE_MAX_M
    batch, seq = (m, 1) if decode else (1, m)
    (x,) = deepseek_v32.example_inputs(cfg, batch=batch, seq=seq, device=dev, seed=m)
    rows = []
    with torch.no_grad():
        fns = {name: bench_layer.compiled(model, name, x)[0] for name in ("inductor", "fxfuse")}
        for rnd in range(3):
            for name, fn in fns.items():
                host, wall = issue_us(lambda fn=fn: fn(x), calls=10)
                rows.append({"round": rnd, "backend": name, "issue_us": host, "wall_us": wall})
                print(f"layer {quant} M={m} round {rnd} {name:9s} issue {host:9.1f} us/call  "
                      f"wall {wall:9.1f} us/call", flush=True)  # fmt: skip
        import threading

        print("threads:", [t.name for t in threading.enumerate()], "switch interval",
              sys.getswitchinterval())  # fmt: skip
        from torch.profiler import ProfilerActivity, profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(10):
                fns["fxfuse"](x)
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=30)
        print(table)
        if out_dir:
            with open(os.path.join(out_dir, f"host_ops_{quant}_{m}.txt"), "w") as f:
                f.write(table)
        # A busy background thread would take the GIL whenever an op releases it: time the
        # calls again with Inductor's compile workers (and their helper threads) shut down.
        from torch._inductor import async_compile

        async_compile.shutdown_compile_workers()
        print("threads after shutdown:", [t.name for t in threading.enumerate()])
        for name, fn in fns.items():
            host, wall = issue_us(lambda fn=fn: fn(x), calls=10)
            rows.append({"round": "no_workers", "backend": name, "issue_us": host, "wall_us": wall})
            print(f"layer {quant} M={m} no workers {name:9s} issue {host:9.1f} us/call  "
                  f"wall {wall:9.1f} us/call", flush=True)  # fmt: skip
        profile = cProfile.Profile()
        fn = fns["fxfuse"]
        fn(x)
        torch.cuda.synchronize()
        profile.enable()
        for _ in range(10):
            fn(x)
        profile.disable()
        torch.cuda.synchronize()
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(60)
    report = text.getvalue()
    print(report[:12000])
    if out_dir:
        with open(os.path.join(out_dir, f"host_profile_{quant}_{m}.txt"), "w") as f:
            f.write(report)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quant", default="fp8_rowwise")
    parser.add_argument("--m", default="4096", help="comma list of token counts")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    result = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
    result["dispatch"] = dispatch_rows()
    result["ops"] = op_rows()
    result["layer"] = {}
    for m in (int(v) for v in args.m.split(",")):
        result["layer"][m] = layer_rows(args.quant, m, args.out)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "host_overhead.json"), "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
