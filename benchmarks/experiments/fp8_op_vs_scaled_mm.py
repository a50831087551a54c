"""Why the gemm_fp8 op (vendor path) trailed torch._scaled_mm at large outputs in bench_gemm_fp8:
the same call direct, through the op and through the runtime's Python function; do_bench and
CUDA graphs, two rounds each (console only).

    PYTHONPATH=. python benchmarks/experiments/fp8_op_vs_scaled_mm.py
"""

import torch
import triton

from fxfuse.runtime import gemm_ops

SHAPES = ((8192, 24576, 1536), (16384, 7168, 2048), (8192, 2112, 7168))  # (M, N, K)


def main() -> None:
    torch.manual_seed(0)
    for m, n, k in SHAPES:
        q = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        xs = torch.rand(m, 1, device="cuda") + 0.5
        ws = torch.rand(n, device="cuda") + 0.5
        bf16 = torch.bfloat16
        fns = {
            "scaled_mm": lambda: torch._scaled_mm(q, w.t(), xs, ws.view(1, n), out_dtype=bf16),
            "op": lambda: torch.ops.fxfuse.gemm_fp8(q, xs, w, ws, bf16),
            "runtime_fn": lambda: gemm_ops._gemm_fp8(q, xs, w, ws, bf16),
        }
        assert torch.equal(fns["op"](), fns["scaled_mm"]())
        us: dict[str, list[float]] = {}
        for _ in range(2):
            for name, fn in fns.items():
                plain = triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median")
                graph = triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")
                us.setdefault(name, []).append(round(plain * 1e3, 1))
                us.setdefault(name + "_graph", []).append(round(graph * 1e3, 1))
        cells = " ".join(f"{name}={t}" for name, t in us.items())
        print(f"fp8op m={m} n={n} k={k} {cells}", flush=True)


if __name__ == "__main__":
    main()
