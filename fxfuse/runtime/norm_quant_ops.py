"""torch.library custom ops for RMSNorm, quant and their fusion (`torch.ops.fxfuse.*`).

The canonical ops (`rms_norm`, `add_rms_norm`, `quant_fp8`, `quant_mxfp4`) are what every
recognised spelling becomes; they record what the graph spelled (rounding points, eps, divide or
multiply) so the fused kernels give the spelled bytes. The quants run the norm-quant kernel's
quant-only mode where Triton runs, with their references' bytes. The fused ops (`rms_norm_quant`,
`add_rms_norm_quant`) replace a canonical norm followed by a canonical quant. Each op has an
explicit fake and takes any leading dims: kernels see (rows, N).
"""

from __future__ import annotations

import torch

from fxfuse.kernels import formats
from fxfuse.kernels import rms_norm_quant_ref as ref
from fxfuse.runtime.dispatch import use_triton
from fxfuse.runtime.registry import fused_op, variant_schema


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as (M, K) rows; a 2-D x as it is (no torch call: each costs host time per op call)."""
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def _unrows(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(M, C) rows of x's leading dims back in x's shape: (..., C)."""
    return t if x.dim() == 2 else t.reshape(*x.shape[:-1], t.shape[-1])


def _kernels():
    from fxfuse.kernels import rms_norm_quant as kernels  # imports triton: only when used

    return kernels


# The dtypes the ops take (the references compute in fp32 from any of them); the kernels read
# _KERNEL_DTYPES, and a call with another of these runs the reference (as without Triton).
_FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
# The dtypes the kernels read (rms_norm_quant.FLOAT_DTYPES, not imported here: that loads triton).
_KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check_float(name: str, dtype: torch.dtype) -> None:
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name}: dtype must be one of {_FLOAT_DTYPES}, got {dtype}")


def _kernel_dtypes(*dtypes: torch.dtype | None) -> bool:
    """Whether the kernels read (and write) these dtypes; None: an output in the input's."""
    return all(dtype is None or dtype in _KERNEL_DTYPES for dtype in dtypes)


def _check_norm_args(
    x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None,
    out_dtype: torch.dtype | None = None, out_name: str = "out_dtype",
):  # fmt: skip
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x: expected a tensor with a non-empty last dim, got shape {tuple(x.shape)}")
    _check_float("x", x.dtype)
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight: expected shape ({x.shape[-1]},), got {tuple(weight.shape)}")
    _check_float("weight", weight.dtype)
    if out_dtype is not None:
        _check_float(out_name, out_dtype)
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"residual: expected {tuple(x.shape)} {x.dtype}, got {tuple(residual.shape)} "
            f"{residual.dtype}"
        )


# --- RMSNorm ------------------------------------------------------------------------------------


def _norm(x, weight, eps, residual, weight_offset, round_before_weight, out_dtype, reciprocal_sqrt):
    _check_norm_args(x, weight, residual, out_dtype)
    rows = _rows(x)
    res_rows = None if residual is None else _rows(residual)
    if use_triton(x, weight) and _kernel_dtypes(x.dtype, weight.dtype, out_dtype):
        # The kernel always computes 1 / sqrt_rn(...), exactly the `1/sqrt` spelling; for `rsqrt`
        # spellings it can differ by 1 ulp (SPEC §5), as torch's own rsqrt does across devices.
        y, h = _kernels().rms_norm(
            rows,
            weight,
            eps,
            res_rows,
            weight_offset=weight_offset,
            round_before_weight=round_before_weight,
            norm_dtype=out_dtype,
        )
    else:
        y, h = ref.rms_norm_ref(
            rows, weight, eps, res_rows, weight_offset, round_before_weight, out_dtype,
            reciprocal_sqrt,
        )
    return _unrows(y, x), _unrows(h, x)


@fused_op("fxfuse::rms_norm", mutates_args=())
def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    weight_offset: float = 0.0,
    round_before_weight: bool = True,
    out_dtype: torch.dtype | None = None,
    reciprocal_sqrt: bool = False,
) -> torch.Tensor:
    """Canonical RMSNorm: y = x · rsqrt(mean(x², -1) + eps) · (weight + weight_offset)."""
    args = (weight_offset, round_before_weight, out_dtype, reciprocal_sqrt)
    return _norm(x, weight, eps, None, *args)[0]


@rms_norm.register_fake
def _(x, weight, eps, weight_offset=0.0, round_before_weight=True, out_dtype=None,
      reciprocal_sqrt=False):
    _check_norm_args(x, weight, None, out_dtype)
    return x.new_empty(x.shape, dtype=out_dtype or x.dtype)


@fused_op("fxfuse::add_rms_norm", mutates_args=())
def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    weight_offset: float = 0.0,
    round_before_weight: bool = True,
    out_dtype: torch.dtype | None = None,
    reciprocal_sqrt: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Canonical residual RMSNorm: h = x + residual; returns (rms_norm(h), h)."""
    args = (weight_offset, round_before_weight, out_dtype, reciprocal_sqrt)
    y, h = _norm(x, weight, eps, residual, *args)
    return y, h


@add_rms_norm.register_fake
def _(x, residual, weight, eps, weight_offset=0.0, round_before_weight=True, out_dtype=None,
      reciprocal_sqrt=False):
    _check_norm_args(x, weight, residual, out_dtype)
    return x.new_empty(x.shape, dtype=out_dtype or x.dtype), torch.empty_like(x)


# --- quant --------------------------------------------------------------------------------------


def _quant_kernel_applies(x: torch.Tensor) -> bool:
    """Whether the quant-only kernel runs (else the reference): Triton active, a float dtype the
    kernel reads, a non-empty last dim (the reference's own errors stay its own)."""
    return _kernel_dtypes(x.dtype) and x.shape[-1] > 0 and use_triton(x)


def _quant_rows(x: torch.Tensor, scale_col_major: bool, **quant_args):
    """The quant-only kernel over x's rows: (q, scale) reshaped back to x's leading dims. A
    column-major scale buffer only for 2-D x, as the op returns it (contiguous otherwise)."""
    q, scale = _kernels().quant(
        _rows(x), scale_col_major=scale_col_major and x.dim() == 2, **quant_args
    )
    return _unrows(q, x), _unrows(scale, x)


def _check_fp8_args(x: torch.Tensor, group_size: int, fp8_dtype: torch.dtype):
    _check_float("x", x.dtype)
    formats.fp8_max(fp8_dtype)
    if group_size < 0 or (group_size and x.shape[-1] % group_size):
        raise ValueError(
            f"group_size: expected 0 (per token) or a divisor of the last dim {x.shape[-1]}, "
            f"got {group_size}"
        )


def _scale_shape(x: torch.Tensor, group_size: int) -> tuple[int, ...]:
    groups = 1 if group_size == 0 else x.shape[-1] // group_size
    return (*x.shape[:-1], groups)


def _empty_scale(x: torch.Tensor, group_size: int, col_major: bool) -> torch.Tensor:
    shape = _scale_shape(x, group_size)
    if col_major:
        flipped = (*shape[:-2], shape[-1], shape[-2]) if len(shape) >= 2 else shape
        return x.new_empty(flipped, dtype=torch.float32).transpose(-1, -2)
    return x.new_empty(shape, dtype=torch.float32)


@fused_op("fxfuse::quant_fp8", mutates_args=())
def quant_fp8(
    x: torch.Tensor,
    group_size: int = 0,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    eps: float = 1e-10,
    eps_on_scale: bool = False,
    apply_reciprocal: bool = False,
    scale_col_major: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Canonical dynamic FP8 quant (per token, or per 1×group_size group) of the last dim."""
    _check_fp8_args(x, group_size, fp8_dtype)
    if _quant_kernel_applies(x):
        return _quant_rows(
            x,
            scale_col_major,
            quant="fp8",
            group_size=group_size,
            fp8_dtype=fp8_dtype,
            quant_eps=eps,
            eps_on_scale=eps_on_scale,
            apply_reciprocal=apply_reciprocal,
        )
    q, scale = ref.quant_fp8_ref(
        x, group_size, fp8_dtype, eps, eps_on_scale, apply_reciprocal, scale_col_major
    )
    return q, scale if scale_col_major and x.dim() == 2 else scale.contiguous()


@quant_fp8.register_fake
def _(x, group_size=0, fp8_dtype=torch.float8_e4m3fn, eps=1e-10, eps_on_scale=False,
      apply_reciprocal=False, scale_col_major=False):
    _check_fp8_args(x, group_size, fp8_dtype)
    col_major = scale_col_major and x.dim() == 2
    return x.new_empty(x.shape, dtype=fp8_dtype), _empty_scale(x, group_size, col_major)


def _check_mxfp4_args(x: torch.Tensor, rounding: str):
    _check_float("x", x.dtype)
    formats.check_rounding(rounding)
    if x.shape[-1] % formats.MXFP4_BLOCK:
        raise ValueError(f"x: last dim must be a multiple of 32 for MXFP4, got {x.shape[-1]}")


@fused_op("fxfuse::quant_mxfp4", mutates_args=())
def quant_mxfp4(x: torch.Tensor, rounding: str = "even") -> tuple[torch.Tensor, torch.Tensor]:
    """Canonical MXFP4 quant: (q uint8 (..., K/2), e8m0 scale uint8 (..., K/32))."""
    _check_mxfp4_args(x, rounding)
    if _quant_kernel_applies(x):
        return _quant_rows(x, False, quant="mxfp4", rounding=rounding)
    return ref.quant_mxfp4_ref(x, rounding)


@quant_mxfp4.register_fake
def _mxfp4_fake(x, rounding="even"):
    _check_mxfp4_args(x, rounding)
    k = x.shape[-1]
    return (
        x.new_empty((*x.shape[:-1], k // 2), dtype=torch.uint8),
        x.new_empty((*x.shape[:-1], k // formats.MXFP4_BLOCK), dtype=torch.uint8),
    )


# --- fused RMSNorm → quant ----------------------------------------------------------------------


def _fused(x, residual, weight, eps, norm_args, quant_args, write_norm=False):
    """(q, scale, h), and y (the normed value) last when write_norm."""
    norm_dtype = norm_args["norm_dtype"]
    _check_norm_args(x, weight, residual, norm_dtype, "norm_dtype")
    rows = _rows(x)
    res_rows = None if residual is None else _rows(residual)
    if use_triton(x, weight) and _kernel_dtypes(x.dtype, weight.dtype, norm_dtype):
        kernel_norm_args = {k: v for k, v in norm_args.items() if k != "reciprocal_sqrt"}
        q, scale, h, y = _kernels().rms_norm_quant(
            rows, weight, eps, res_rows, **kernel_norm_args, **quant_args, write_norm=write_norm
        )
    else:
        q, scale, h, y = ref.rms_norm_quant_with_norm_ref(
            rows, weight, eps, res_rows, **norm_args, **quant_args
        )
    scale = scale if quant_args["scale_col_major"] and x.dim() == 2 else scale.contiguous()
    fused = _unrows(q, x), _unrows(scale, x), _unrows(h, x)
    return (*fused, _unrows(y, x)) if write_norm else fused


def _fused_fake(x, residual, weight, norm_args, quant_args, write_norm=False):
    """`_fused`'s outputs as empty tensors: (q, scale, h), and y last when write_norm."""
    _check_norm_args(x, weight, residual, norm_args["norm_dtype"], "norm_dtype")
    y_fake = x.new_empty(x.shape, dtype=norm_args["norm_dtype"] or x.dtype)
    if quant_args["quant"] == "mxfp4":
        q, scale = _mxfp4_fake(y_fake, quant_args["rounding"])
    elif quant_args["quant"] == "fp8":
        g, col = quant_args["group_size"], quant_args["scale_col_major"] and x.dim() == 2
        _check_fp8_args(x, g, quant_args["fp8_dtype"])
        q, scale = x.new_empty(x.shape, dtype=quant_args["fp8_dtype"]), _empty_scale(x, g, col)
    else:
        raise ValueError(f"quant: expected 'fp8' or 'mxfp4', got {quant_args['quant']!r}")
    fused = q, scale, torch.empty_like(x)
    return (*fused, y_fake) if write_norm else fused


def _norm_quant_args(weight_offset, round_before_weight, norm_dtype, reciprocal_sqrt, quant,
                     group_size, fp8_dtype, quant_eps, eps_on_scale, apply_reciprocal,
                     scale_col_major, rounding):
    norm = dict(weight_offset=weight_offset, round_before_weight=round_before_weight,
                norm_dtype=norm_dtype, reciprocal_sqrt=reciprocal_sqrt)
    quant_args = dict(quant=quant, group_size=group_size, fp8_dtype=fp8_dtype, quant_eps=quant_eps,
                      eps_on_scale=eps_on_scale, apply_reciprocal=apply_reciprocal,
                      scale_col_major=scale_col_major, rounding=rounding)
    return norm, quant_args


@fused_op("fxfuse::rms_norm_quant", mutates_args=())
def rms_norm_quant(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    weight_offset: float,
    round_before_weight: bool,
    norm_dtype: torch.dtype | None,
    reciprocal_sqrt: bool,
    quant: str,
    group_size: int,
    fp8_dtype: torch.dtype,
    quant_eps: float,
    eps_on_scale: bool,
    apply_reciprocal: bool,
    scale_col_major: bool,
    rounding: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused RMSNorm → quant: (q, scale), bytes equal to the canonical ops run one after the other."""
    norm, quant_args = _norm_quant_args(weight_offset, round_before_weight, norm_dtype,
                                        reciprocal_sqrt, quant, group_size, fp8_dtype, quant_eps,
                                        eps_on_scale, apply_reciprocal, scale_col_major, rounding)
    q, scale, _ = _fused(x, None, weight, eps, norm, quant_args)
    return q, scale


@rms_norm_quant.register_fake
def _(x, weight, eps, *args):
    q, scale, _ = _fused_fake(x, None, weight, *_norm_quant_args(*args))
    return q, scale


@fused_op("fxfuse::add_rms_norm_quant", mutates_args=())
def add_rms_norm_quant(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    weight_offset: float,
    round_before_weight: bool,
    norm_dtype: torch.dtype | None,
    reciprocal_sqrt: bool,
    quant: str,
    group_size: int,
    fp8_dtype: torch.dtype,
    quant_eps: float,
    eps_on_scale: bool,
    apply_reciprocal: bool,
    scale_col_major: bool,
    rounding: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fused residual add → RMSNorm → quant: (q, scale, x + residual)."""
    norm, quant_args = _norm_quant_args(weight_offset, round_before_weight, norm_dtype,
                                        reciprocal_sqrt, quant, group_size, fp8_dtype, quant_eps,
                                        eps_on_scale, apply_reciprocal, scale_col_major, rounding)
    return _fused(x, residual, weight, eps, norm, quant_args)


@add_rms_norm_quant.register_fake
def _(x, residual, weight, eps, *args):
    return _fused_fake(x, residual, weight, *_norm_quant_args(*args))


# --- the same, with the normed y as an output too ------------------------------------------------
# For a norm whose y is also read by something other than the quant (an MoE layer's router reads
# the bf16 y, its experts the quantized one): the kernel stores y beside q and scale, so the
# quant's second read of y goes away.


_WITH_NORM_3 = variant_schema(rms_norm_quant, "(Tensor, Tensor, Tensor)")
_WITH_NORM_4 = variant_schema(add_rms_norm_quant, "(Tensor, Tensor, Tensor, Tensor)")


@fused_op("fxfuse::rms_norm_quant_with_norm", schema=_WITH_NORM_3)
def rms_norm_quant_with_norm(x, weight, eps, *args):
    """rms_norm_quant (the same arguments) that also returns the normed y (norm_dtype):
    (q, scale, y)."""
    q, scale, _, y = _fused(x, None, weight, eps, *_norm_quant_args(*args), write_norm=True)
    return q, scale, y


@rms_norm_quant_with_norm.register_fake
def _(x, weight, eps, *args):
    q, scale, _, y = _fused_fake(x, None, weight, *_norm_quant_args(*args), write_norm=True)
    return q, scale, y


@fused_op("fxfuse::add_rms_norm_quant_with_norm", schema=_WITH_NORM_4)
def add_rms_norm_quant_with_norm(x, residual, weight, eps, *args):
    """add_rms_norm_quant (the same arguments) that also returns the normed y:
    (q, scale, x + residual, y)."""
    return _fused(x, residual, weight, eps, *_norm_quant_args(*args), write_norm=True)


@add_rms_norm_quant_with_norm.register_fake
def _(x, residual, weight, eps, *args):
    return _fused_fake(x, residual, weight, *_norm_quant_args(*args), write_norm=True)
