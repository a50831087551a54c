"""HF transformers adapter: `patch_quantized_linears(model)` swaps the quantized linear modules of a
loaded HF model for small modules that call the `fxfuse.ops` reference ops, so the model's graph
fuses under `fxfuse.apply_fusions` / `torch.compile(backend="fxfuse")`.

Handled (transformers.integrations.finegrained_fp8.FP8Linear, dynamic activations):
- FP8 e4m3fn weight (N, K), `weight_scale_inv` (ceil(N/128), K/128) with block_size (128, 128):
  `quant_fp8(x, 128)` + `gemm_fp8`. Despite its name, HF multiplies by `weight_scale_inv` when it
  dequantizes (`weight * weight_scale_inv`), which is fxfuse's `w_scale`.
- FP8 weight with block_size None (one per-tensor scale): per-token `quant_fp8(x)` + `gemm_fp8`.
- FP4-packed weight (N, K/2) int8 with UE8M0 scales (N, K/32): viewed as uint8 (same bytes, low
  nibble = even element, e8m0 byte = exponent + 127), `quant_mxfp4(x)` + `gemm_mxfp4`. The
  activations are quantized to MXFP4 here; HF's kernel may quantize them differently.
transformers.integrations.mxfp4 only has GPT-OSS MoE experts (Mxfp4GptOssExperts, triton_kernels
hub kernel), no linear module: nothing to swap there.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from fxfuse import ops

FP8_BLOCK = 128
MXFP4_BLOCK = 32


class FP8BlockLinear(nn.Module):
    """y = gemm_fp8(quant_fp8(x, 1×128), W (N, K) e4m3, 128×128 block scales) [+ bias]."""

    def __init__(self, weight, weight_scale, bias=None, group_size: int | None = FP8_BLOCK):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.group_size = group_size
        self.weight, self.weight_scale_inv, self.bias = weight, weight_scale, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        q, scale = ops.quant_fp8(x.reshape(-1, self.in_features), self.group_size)
        out = ops.gemm_fp8(q, scale, self.weight, self.weight_scale_inv, x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*lead, self.out_features)


class MXFP4Linear(nn.Module):
    """y = gemm_mxfp4(quant_mxfp4(x), W (N, K/2) uint8, e8m0 scales (N, K/32)) [+ bias]."""

    def __init__(self, weight, weight_scale, bias=None, rounding: str = "even"):
        super().__init__()
        self.out_features, self.in_features = weight.shape[0], 2 * weight.shape[1]
        self.rounding = rounding
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale_inv", weight_scale)
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        q, scale = ops.quant_mxfp4(x.reshape(-1, self.in_features), self.rounding)
        out = ops.gemm_mxfp4(q, scale, self.weight, self.weight_scale_inv, x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*lead, self.out_features)


def _hf_fp8_linear_class():
    try:
        from transformers.integrations.finegrained_fp8 import FP8Linear
    except ImportError:  # transformers missing, or a version without the fine-grained FP8 module
        return None
    return FP8Linear


def _convert_fp8_linear(module) -> tuple[nn.Module | None, str | None]:
    """The fxfuse replacement of one HF FP8Linear, or (None, why it stays as it is)."""
    weight, scale = module.weight, module.weight_scale_inv
    if getattr(module, "activation_scale", None) is not None:
        return None, "static activation scale"
    bias = module.bias
    k = module.in_features
    e8m0 = getattr(torch, "float8_e8m0fnu", None)
    if weight.dtype == torch.int8:
        # FP4-packed: two e2m1 per byte; the kernel infers 1×32 scale blocks from the dtype.
        if scale.dtype != e8m0:
            return None, f"FP4 weight with {scale.dtype} scales (expected float8_e8m0fnu)"
        if k % MXFP4_BLOCK or tuple(scale.shape) != (module.out_features, k // MXFP4_BLOCK):
            return None, f"FP4 scales {tuple(scale.shape)} are not 1x32 blocks of K={k}"
        w_bytes, s_bytes = weight.detach().view(torch.uint8), scale.detach().view(torch.uint8)
        return MXFP4Linear(w_bytes, s_bytes, bias), None
    if weight.dtype != torch.float8_e4m3fn:
        return None, f"weight dtype {weight.dtype} (dequantized or unknown)"
    if scale.dtype == e8m0:
        # UE8M0 scales are powers of two: the fp32 copy (one float per block) is exact.
        scale = nn.Parameter(scale.detach().float(), requires_grad=False)
    elif scale.dtype != torch.float32:
        return None, f"weight_scale_inv dtype {scale.dtype}"
    if module.block_size is None:
        return FP8BlockLinear(weight, scale, bias, group_size=None), None
    if tuple(module.block_size) != (FP8_BLOCK, FP8_BLOCK):
        return None, f"block_size {tuple(module.block_size)} (gemm_fp8 takes 128x128 blocks)"
    if k % FP8_BLOCK:
        return None, f"in_features {k} is not a multiple of 128"
    return FP8BlockLinear(weight, scale, bias), None


def patch_quantized_linears(model: nn.Module) -> int:
    """Swaps every HF FP8 / FP4 linear under `model` for an fxfuse.ops module sharing its weight and
    scale tensors (no re-quantization); returns how many modules were swapped. Modules fxfuse has
    no op for stay as they are, with a warning naming them."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"model: expected an nn.Module, got {type(model).__name__}")  # noqa: TRY004
    fp8_linear = _hf_fp8_linear_class()
    if fp8_linear is None:
        return 0
    swapped = 0
    for name, module in list(model.named_modules()):
        if type(module) is not fp8_linear:
            continue  # FP8GroupedLinear subclasses FP8Linear with a block-diagonal contract
        replacement, reason = _convert_fp8_linear(module)
        if replacement is None:
            warnings.warn(f"fxfuse: {name} ({type(module).__name__}) left unpatched: {reason}",
                          stacklevel=2)
            continue
        model.set_submodule(name, replacement)
        swapped += 1
    return swapped
