"""Per-GEMM check of the deepseek_v32 fp8_block linears at prefill M on a GPU: the user's spelling
(QuantLinear.forward: torch 1x128 quant, fp32 dequant matmul) against fxfuse.quant_fp8 (quant-only
kernel) + fxfuse.gemm_fp8 under FXFUSE_GEMM_BACKEND auto / triton / vendor, and each blockwise
scale layout of torch._scaled_mm tried by hand. Prints relative errors.

    PYTHONPATH=. python benchmarks/experiments/blockscale_check.py
"""

from __future__ import annotations

import os

import torch

import fxfuse  # noqa: F401
from fxfuse.kernels.gemm_ref import gemm_fp8_ref
from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref
from fxfuse.models import deepseek_v32 as d
from fxfuse.runtime import gemm_ops

FN = torch.float8_e4m3fn


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def main():
    dev = torch.device("cuda", 0)
    cfg = d.V32Config.deepseek_v32_tp8(quant="fp8_block", layers=1)
    torch.manual_seed(0)
    model = d.build(cfg, device=dev)
    for name, mod in model.named_modules():
        if not hasattr(mod, "weight_scale"):
            continue
        w, ws = mod.weight, mod.weight_scale
        n, k = w.shape
        for m in (256, 4096):
            x = torch.randn(m, k, device=dev).to(torch.bfloat16)
            want = mod(x).float()
            q, s = torch.ops.fxfuse.quant_fp8(x, 128, FN, 1e-10, False, False, False)
            rq, rs = quant_fp8_ref(x, 128, FN)
            exact = torch.equal(q.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(s, rs)
            ref = gemm_fp8_ref(q, s, w, ws, torch.float32)
            row = [f"{name:32s} {n:5d}x{k:5d} M={m:5d} quant-exact={exact}"]
            for choice in ("auto", "triton", "vendor"):
                os.environ[gemm_ops.GEMM_BACKEND_ENV] = choice
                out = torch.ops.fxfuse.gemm_fp8(q, s, w, ws, torch.bfloat16)
                row.append(f"{choice}={rel(out, ref):.1e}")
            os.environ.pop(gemm_ops.GEMM_BACKEND_ENV)
            row.append(f"layout={gemm_ops._VENDOR_BLOCK_LAYOUT}")
            for i, layout in enumerate(gemm_ops._block_scale_layouts(s, ws)):
                try:
                    o = torch._scaled_mm(q, w.t(), *layout(), out_dtype=torch.bfloat16)
                    row.append(f"L{i}={rel(o, ref):.1e}")
                except Exception as e:  # noqa: BLE001
                    row.append(f"L{i}=rejected({type(e).__name__})")
            row.append(f"vs-user={rel(ref[:, : want.shape[-1]], want):.1e}")  # padded rows sliced off
            print(" ".join(row), flush=True)


if __name__ == "__main__":
    main()
