"""Torch references of [residual add →] RMSNorm → quant, written step for step like the spellings
fxfuse recognises, so that each reference gives the spelled graph's exact bytes on CPU.

RMSNorm (SPEC §3), all in fp32 after the input cast:
    h    = x + residual                  (rounded to x.dtype: it is itself an output)
    inv  = rsqrt(mean(h², -1) + eps)         (reciprocal_sqrt: 1 / sqrt(...), which rounds differently)
    y    = round(round(h · inv) · w)     round_before_weight (Llama / DeepSeek / aten.rms_norm)
    y    = round(h · inv · (w + offset)) otherwise ((h·w).to(dtype); Gemma with offset 1)
FP8 quant, per row or per (row, group of `group_size` columns):
    amax = max(|y|);  s = max(amax, eps) / FP8_MAX   (eps_on_scale: max(amax / FP8_MAX, eps))
    q    = clamp(y / s, ±FP8_MAX)                    (apply_reciprocal: y · (1 / s))
MXFP4: SPEC §2, see formats.py.
"""

from __future__ import annotations

import torch

from fxfuse.kernels import formats


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    weight_offset: float = 0.0,
    round_before_weight: bool = True,
    out_dtype: torch.dtype | None = None,
    reciprocal_sqrt: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (y, h): the normed output and the (residual-summed) input it was computed from."""
    h = x if residual is None else x + residual
    out_dtype = out_dtype or h.dtype
    h32 = h.float()
    mean_square = h32.pow(2).mean(-1, keepdim=True) + eps
    inv = 1.0 / torch.sqrt(mean_square) if reciprocal_sqrt else torch.rsqrt(mean_square)
    normed = h32 * inv
    w32 = weight.float() + weight_offset if weight_offset else weight.float()
    if round_before_weight:
        y = (normed.to(h.dtype).float() * w32).to(out_dtype)
    else:
        y = (normed * w32).to(out_dtype)
    return y, h


def quant_fp8_ref(
    x: torch.Tensor,
    group_size: int = 0,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    eps: float = 1e-10,
    eps_on_scale: bool = False,
    apply_reciprocal: bool = False,
    scale_col_major: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic FP8 quant of the last dim: per row (group_size 0) or per group of columns.

    Returns (q, scale); scale is (..., 1) per row or (..., K / group_size) per group, fp32. A
    column-major group scale has the same shape with transposed strides.
    """
    fp8_max = formats.fp8_max(fp8_dtype)
    k = x.shape[-1]
    g = k if group_size == 0 else group_size
    if k % g:
        raise ValueError(f"group_size: {group_size} does not divide the last dim {k}")
    xg = x.float().reshape(*x.shape[:-1], k // g, g)
    amax = xg.abs().amax(-1, keepdim=True)
    if eps_on_scale:
        scale = (amax / fp8_max).clamp(min=eps)
    else:
        scale = amax.clamp(min=eps) / fp8_max
    scaled = xg * (1.0 / scale) if apply_reciprocal else xg / scale
    q = scaled.clamp(-fp8_max, fp8_max).to(fp8_dtype).reshape(x.shape)
    scale = scale.reshape(*x.shape[:-1], k // g)
    if scale_col_major:
        scale = scale.transpose(-1, -2).contiguous().transpose(-1, -2)
    return q, scale


def quant_mxfp4_ref(x: torch.Tensor, rounding: str = "even") -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 quant of the last dim (a multiple of 32): (q uint8 (..., K/2), scale uint8 (..., K/32))."""
    formats.check_rounding(rounding)
    k = x.shape[-1]
    if k % formats.MXFP4_BLOCK:
        raise ValueError(f"x: last dim must be a multiple of 32 for MXFP4, got {k}")
    xb = x.float().reshape(*x.shape[:-1], k // formats.MXFP4_BLOCK, formats.MXFP4_BLOCK)
    amax = xb.abs().amax(-1, keepdim=True)
    exponent = formats.e8m0_exponent_ref(amax, rounding)
    # 2^-e is exact in fp32 for e in [-127, 127] except 2^127's reciprocal side: use ldexp.
    scaled = torch.ldexp(xb, -exponent)
    codes = formats.e2m1_code_ref(scaled).reshape(*x.shape[:-1], k)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    scale = (exponent + 127).to(torch.uint8).reshape(*x.shape[:-1], k // formats.MXFP4_BLOCK)
    return packed, scale


def rms_norm_quant_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    **norm_quant_args,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The whole chain: (q, scale, h) with h the residual sum (x itself without a residual);
    keyword arguments as `rms_norm_quant_with_norm_ref`'s."""
    return rms_norm_quant_with_norm_ref(x, weight, eps, residual, **norm_quant_args)[:3]


def rms_norm_quant_with_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    weight_offset: float = 0.0,
    round_before_weight: bool = True,
    norm_dtype: torch.dtype | None = None,
    reciprocal_sqrt: bool = False,
    quant: str = "fp8",
    group_size: int = 0,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    quant_eps: float = 1e-10,
    eps_on_scale: bool = False,
    apply_reciprocal: bool = False,
    scale_col_major: bool = False,
    rounding: str = "even",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, scale, h, y): the chain's, and the normed y it quantized (what other readers of the
    norm read)."""
    y, h = rms_norm_ref(
        x, weight, eps, residual, weight_offset, round_before_weight, norm_dtype, reciprocal_sqrt
    )
    if quant == "mxfp4":
        q, scale = quant_mxfp4_ref(y, rounding)
    elif quant == "fp8":
        q, scale = quant_fp8_ref(
            y, group_size, fp8_dtype, quant_eps, eps_on_scale, apply_reciprocal, scale_col_major
        )
    else:
        raise ValueError(f"quant: expected 'fp8' or 'mxfp4', got {quant!r}")
    return q, scale, h, y
