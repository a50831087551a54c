"""Unfused reference ops that model code may call (SPEC §1); patterns match them like any other
spelling. Each is a `torch.ops.fxfuse.*` custom op, so graphs that call them stay traceable."""

from __future__ import annotations

import torch

from fxfuse.runtime import gemm_ops, norm_quant_ops  # noqa: F401 - registers torch.ops.fxfuse.*
from fxfuse.runtime.target import detect_target, fp8_dtype_for

fxfuse_ops = torch.ops.fxfuse


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """RMSNorm of x (or of x + residual): y, or (y, x + residual)."""
    if residual is None:
        return fxfuse_ops.rms_norm(x, weight, float(eps))
    return fxfuse_ops.add_rms_norm(x, residual, weight, float(eps))


def quant_fp8(x: torch.Tensor, group_size: int | None = None):
    """Dynamic FP8 quant: (q, scale (M, 1)) per token, or scale (M, K / group_size) per group."""
    if group_size is not None and (not isinstance(group_size, int) or group_size <= 0):
        raise ValueError(f"group_size: expected None or a positive int, got {group_size!r}")
    fp8_dtype = fp8_dtype_for(detect_target(x.device))
    return fxfuse_ops.quant_fp8(x, group_size or 0, fp8_dtype)


def quant_mxfp4(x: torch.Tensor, rounding: str = "even"):
    """MXFP4 quant: (q uint8 (M, K/2), e8m0 scale uint8 (M, K/32)); rounding floor|even|ceil."""
    return fxfuse_ops.quant_mxfp4(x, rounding)


def gemm_fp8(q, x_scale, w, w_scale, out_dtype=torch.bfloat16):
    """(q · x_scale) @ (w · w_scale)ᵀ; w (N, K) fp8, w_scale (N,) | (N, 1) | (N/128, K/128)."""
    return fxfuse_ops.gemm_fp8(q, x_scale, w, w_scale, out_dtype)


def gemm_mxfp4(q, x_scale, w, w_scale, out_dtype=torch.bfloat16):
    """MXFP4 GEMM; q (M, K/2), x_scale (M, K/32), w (N, K/2), w_scale (N, K/32), all uint8."""
    return fxfuse_ops.gemm_mxfp4(q, x_scale, w, w_scale, out_dtype)


def all_reduce(x: torch.Tensor, group=None):
    """Sum of x over the process group (x itself when no group is initialised or its size is 1)."""
    from fxfuse.runtime import collective_ops

    return collective_ops.all_reduce(x, group)
