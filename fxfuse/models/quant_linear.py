"""Quantized linear layers written as ordinary torch code, the way model code spells them
(dynamic per-token or 1×128 FP8 activations, MXFP4 through fxfuse.ops). fxfuse recognises these
spellings; nothing here calls a fused kernel.

The per-token FP8 GEMM is `torch._scaled_mm` with rowwise scales, except on the CPU of a torch
whose CPU `_scaled_mm` takes per-tensor scales only (2.11; 2.13 takes rowwise ones): there it is
`fxfuse.ops.gemm_fp8`, the same product spelled through fxfuse's reference op, so the model runs
(and fuses) on either.
"""

from __future__ import annotations

import torch
from torch import nn

from fxfuse import ops

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
QUANT_KINDS = ("fp8_rowwise", "fp8_block", "mxfp4")


def _cpu_rowwise_scaled_mm() -> bool:
    """Whether this torch's CPU `torch._scaled_mm` takes rowwise scales (run once, at import:
    outside any tracing, on real tensors)."""
    q = torch.zeros(16, 16).to(FP8)
    try:
        torch._scaled_mm(q, q.t(), torch.ones(16, 1), torch.ones(1, 16), out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError):
        return False
    return True


CPU_ROWWISE_SCALED_MM = _cpu_rowwise_scaled_mm()


class QuantLinear(nn.Module):
    """y = quant(x) @ quant(W)ᵀ with the activation quantized at run time."""

    def __init__(self, weight: torch.Tensor, quant: str = "fp8_rowwise"):
        super().__init__()
        if quant not in QUANT_KINDS:
            raise ValueError(f"quant: expected one of {QUANT_KINDS}, got {quant!r}")
        self.quant, self.out_features, self.in_features = quant, *weight.shape
        w = weight.detach().float()
        if quant == "fp8_rowwise":
            scale = w.abs().amax(-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
            self.register_buffer("weight", (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8))
            self.register_buffer("weight_scale", scale.reshape(1, -1))
        elif quant == "fp8_block":
            n, k = w.shape
            if n % 128 or k % 128:
                raise ValueError(f"weight: fp8_block needs (N, K) multiples of 128, got {(n, k)}")
            blocks = w.reshape(n // 128, 128, k // 128, 128)
            scale = blocks.abs().amax((1, 3), keepdim=True).clamp(min=1e-12) / FP8_MAX
            q = (blocks / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).reshape(n, k)
            self.register_buffer("weight", q)
            self.register_buffer("weight_scale", scale.reshape(n // 128, k // 128))
        else:
            q, scale = ops.quant_mxfp4(w, rounding="even")
            self.register_buffer("weight", q)
            self.register_buffer("weight_scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x = x.reshape(-1, self.in_features)
        if self.quant == "fp8_rowwise":
            amax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-10)
            scale = amax / FP8_MAX
            q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
            if x.device.type == "cpu" and not CPU_ROWWISE_SCALED_MM:
                w_scale = self.weight_scale.view(-1)  # (N,): the op takes no (1, N)
                out = ops.gemm_fp8(q, scale, self.weight, w_scale, torch.bfloat16)
            else:
                out = torch._scaled_mm(
                    q, self.weight.t(), scale_a=scale, scale_b=self.weight_scale,
                    out_dtype=torch.bfloat16,
                )
        elif self.quant == "fp8_block":
            xg = x.float().view(-1, self.in_features // 128, 128)
            amax = xg.abs().amax(dim=-1, keepdim=True).clamp(min=1e-10)
            scale = amax / FP8_MAX
            q = (xg / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
            x_deq = (q.float() * scale).view(-1, self.in_features)
            w_scale = self.weight_scale.repeat_interleave(128, 0).repeat_interleave(128, 1)
            out = (x_deq @ (self.weight.float() * w_scale).t()).to(torch.bfloat16)
        else:
            q, scale = ops.quant_mxfp4(x, rounding="even")
            out = ops.gemm_mxfp4(q, scale, self.weight, self.weight_scale, torch.bfloat16)
        return out.reshape(*lead, self.out_features)


def quantize_linears(module: nn.Module, quant: str = "fp8_rowwise", skip=("lm_head",)) -> nn.Module:
    """Replaces every nn.Linear under `module` (except names in `skip`) by a QuantLinear."""
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear) and name not in skip:
            setattr(module, name, QuantLinear(child.weight, quant))
        else:
            quantize_linears(child, quant, skip)
    return module
