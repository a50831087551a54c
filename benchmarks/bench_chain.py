"""The whole residual + RMSNorm → FP8 quant → GEMM chain, fused by fxfuse, against Inductor's
compile of the unfused spelling (a torch-spelled dynamic-FP8 linear after a Llama RMSNorm).

    PYTHONPATH=. python benchmarks/bench_chain.py --out $OUT     # H200: checks, then timings
    PYTHONPATH=. python benchmarks/bench_chain.py --cpu-smoke    # reference path, checks only

One graph with a dynamic M serves every M (both sides of prologue_quant_max_m = 32). Correctness:
≤ 1e-2 relative to a float64 GEMM of the unfused graph's own quantized activation (SPEC §5).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import sys

import torch

import fxfuse
from fxfuse import ops
from fxfuse.kernels import gemm_ref
from fxfuse.models.quant_linear import QuantLinear

SUITE = "chain"
SHAPES = ((7168, 2112), (7168, 4096), (1536, 3072))  # (K, N): DeepSeek-R1 q_a/kv_a, o-like, q_b
M_LIST = (1, 4, 16, 32, 33, 64, 128, 1024, 4096, 8192)
CHECK_M = (1, 4, 31, 32, 33, 200)


class NormLinear(torch.nn.Module):
    def __init__(self, k, n):
        super().__init__()
        self.weight = torch.nn.Parameter((1 + 0.1 * torch.randn(k)).to(torch.bfloat16))
        self.proj = QuantLinear(torch.randn(n, k) / k**0.5, "fp8_rowwise")

    def forward(self, x, r):
        h = x + r
        var = h.float().pow(2).mean(-1, keepdim=True)
        y = (h.float() * torch.rsqrt(var + 1e-6)).to(torch.bfloat16) * self.weight
        return self.proj(y), h


def expected(model, x, r):
    h = x + r
    var = h.float().pow(2).mean(-1, keepdim=True)
    y = (h.float() * torch.rsqrt(var + 1e-6)).to(torch.bfloat16) * model.weight
    q, s = ops.quant_fp8(y)
    w, ws = model.proj.weight, model.proj.weight_scale.reshape(-1, 1)
    return gemm_ref.gemm_fp8_ref(q, s, w, ws, torch.float64, torch.float64)


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--cpu-smoke", action="store_true")
    args = parser.parse_args()
    device = "cpu" if args.cpu_smoke else "cuda"
    shapes = ((256, 96),) if args.cpu_smoke else SHAPES
    rows, failed = [], False
    for k, n in shapes:
        torch.manual_seed(0)
        model = NormLinear(k, n).to(device).requires_grad_(False)
        dim = torch.export.Dim("rows", min=1, max=65536)
        # Two distinct example tensors: export would trace one tensor passed twice as aliased.
        example = tuple(torch.randn(8, k, device=device).to(torch.bfloat16) for _ in range(2))
        fused = fxfuse.apply_fusions(model, example, dynamic_shapes=({0: dim}, {0: dim}))
        fired = fused.fxfuse_report.counts["rmsnorm_quant_gemm"]
        errors = {}
        for m in CHECK_M:
            x, r = (torch.randn(m, k, device=device).to(torch.bfloat16) for _ in range(2))
            errors[m] = rel(fused(x, r)[0], expected(model, x, r))
        ok = fired == 1 and max(errors.values()) <= 1e-2
        failed |= not ok
        print(f"check K={k} N={n}: {'ok' if ok else 'FAIL'} fired={fired} max rel "
              f"{max(errors.values()):.2e} over M={list(CHECK_M)}")
        if args.cpu_smoke:
            continue
        import triton.testing

        inductor = torch.compile(model, backend="inductor", dynamic=True)
        for m in M_LIST:
            x, r = (torch.randn(m, k, device=device).to(torch.bfloat16) for _ in range(2))
            inductor(x, r)
            row = {"K": k, "N": n, "M": m}
            for name, fn in (("fxfuse", functools.partial(fused, x, r)),
                             ("inductor", functools.partial(inductor, x, r)),
                             ("eager", functools.partial(model, x, r))):
                fn()
                torch.cuda.synchronize()
                try:
                    us = triton.testing.do_bench_cudagraph(fn, rep=30) * 1e3
                except Exception:  # noqa: BLE001 - say which timing it was
                    us = triton.testing.do_bench(fn, rep=60) * 1e3
                row[name] = round(us, 2)
            row["speedup_vs_inductor"] = round(row["inductor"] / row["fxfuse"], 3)
            rows.append(row)
            print(f"K={k:5d} N={n:5d} M={m:6d}  fxfuse {row['fxfuse']:9.2f} us  inductor "
                  f"{row['inductor']:9.2f}  eager {row['eager']:9.2f}  "
                  f"{row['speedup_vs_inductor']:.2f}x inductor")
    if not args.cpu_smoke:
        os.makedirs(args.out, exist_ok=True)
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv)}
        with open(os.path.join(args.out, f"{SUITE}.json"), "w") as f:
            json.dump({**meta, "rows": rows}, f, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
