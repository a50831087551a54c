"""torch.library custom ops for the quantized GEMMs and the chains that end in them.

Canonical ops: `gemm_fp8` (rowwise, tensorwise or 1×128 × 128×128 blockscale) and `gemm_mxfp4`,
what `torch._scaled_mm` and `fxfuse.ops.gemm_*` become. Fused ops: `[add_]rms_norm_quant_gemm`
(`..._with_norm` also returns the normed y) and `quant_gemm`, which choose at run time by token
count M (ATOM's hand-made choice, made per call in one graph):

    M >  prologue_quant_max_m:  [residual +] RMSNorm + quant kernel, then an A8W8 / AFP4WFP4 GEMM
    M <= prologue_quant_max_m:  [residual +] RMSNorm kernel, then a GEMM that quantizes its
                                activation tile in registers (A16W8 / A16WFP4 "prequant")

Both sides quantize with the same arithmetic, so the quantized activations are the same bytes.
The A8W8 GEMMs have two implementations, picked per shape by a launch table (`gemm_fp8_backend`
for rowwise / tensorwise scales, `gemm_fp8_block_backend` for 1×128 × 128×128 blockscale;
FXFUSE_GEMM_BACKEND=triton|vendor overrides both): fxfuse's Triton kernel, or the vendor library
through `torch._scaled_mm` where it is faster (on the H200: M above 64) and takes the layout.
Without Triton (CPU, no interpreter) every op runs its torch reference.
"""

from __future__ import annotations

import math
import os

import torch

from fxfuse.kernels import gemm_ref
from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref, quant_mxfp4_ref
from fxfuse.runtime import launch_tables, norm_quant_ops
from fxfuse.runtime.dispatch import (  # noqa: F401 - the backend names are also read from here
    BACKEND_TRITON,
    BACKEND_VENDOR,
    GEMM_BACKEND_ENV,
    GEMM_BACKENDS,
    gemm_backend_override,
    use_triton,
)
from fxfuse.runtime.registry import fused_op, variant_schema
from fxfuse.runtime.target import detect_target, interpreting

fxfuse = torch.ops.fxfuse


def _fp8_kernels():
    from fxfuse.kernels import gemm_fp8  # imports triton: only when used

    return gemm_fp8


def _mxfp4_kernels():
    from fxfuse.kernels import gemm_mxfp4

    return gemm_mxfp4


# --- canonical GEMMs ----------------------------------------------------------------------------


def _vendor_rowwise_ok(q, x_scale, w, w_scale, out_dtype) -> bool:
    """torch._scaled_mm takes this A8W8 GEMM as it is: row-major q, K-contiguous w (a column-major
    B), 16-aligned K and N, rowwise or tensorwise fp32 scales, bf16 out (what rowwise requires)."""
    m, k = q.shape
    n = w.shape[0]
    return (
        q.dtype == w.dtype == torch.float8_e4m3fn
        and out_dtype == torch.bfloat16
        and q.stride() == (k, 1)
        and w.stride() == (k, 1)
        and k % 16 == 0
        and n % 16 == 0
        and x_scale.dtype == w_scale.dtype == torch.float32
        and x_scale.numel() in (1, m)
        and w_scale.numel() in (1, n)
    )


def _vendor_block_ok(q, x_scale, w, w_scale, out_dtype) -> bool:
    """torch._scaled_mm's blockwise mode may take this 1×128 × 128×128 GEMM: CUDA (cuBLASLt's
    blockwise scaling; not tried on ROCm, so ROCm keeps the Triton kernel), e4m3fn row-major q, K-contiguous w, K a multiple of
    128, fp32 scales, bf16 out, and this device has not already found that torch takes none of
    the scale layouts `_block_scale_layouts` offers."""
    k = q.shape[1]
    return (
        not torch.version.hip
        and q.dtype == w.dtype == torch.float8_e4m3fn
        and out_dtype == torch.bfloat16
        and q.stride() == (k, 1)
        and w.stride() == (k, 1)
        and k % 128 == 0
        and x_scale.dtype == w_scale.dtype == torch.float32
        # K / 128 a multiple of 4: cuBLASLt's blockwise GEMM returned garbage on the H200 for
        # K = 2304 (18 blocks; relative error 1.6e3, benchmarks/results/logs/blockscale_check.log)
        # and was exact for 12, 16 and 56 blocks.
        and (k // 128) % 4 == 0
        and _VENDOR_BLOCK_LAYOUT.get(q.device.index, _UNTRIED) is not None
    )


def _vendor_kind(q, x_scale, w, w_scale, out_dtype) -> str | None:
    """The scale kind (gemm_ref.SCALE_*) when the vendor GEMM runs this call, else None.

    Everything it reads is argument metadata, the backend override, FXFUSE_TARGET and what the
    device has shown of the blockscale layouts, so the answer is kept per such key (compiled
    graphs repeat the same few calls; the checks and the table lookup cost more host time than
    torch._scaled_mm's launch)."""
    choice = gemm_backend_override()
    if choice == "triton" or q.device.type != "cuda" or interpreting():
        return None
    key = (
        choice, out_dtype, os.environ.get("FXFUSE_TARGET"),
        _VENDOR_BLOCK_LAYOUT.get(q.device.index, _UNTRIED),
        *(_meta(t) for t in (q, x_scale, w, w_scale)),
    )  # fmt: skip
    kind = _VENDOR_KINDS.get(key, _UNTRIED)
    if kind == _UNTRIED:
        kind = _decide_vendor_kind(choice, q, x_scale, w, w_scale, out_dtype)
        if len(_VENDOR_KINDS) >= _VENDOR_KINDS_MAX:
            _VENDOR_KINDS.clear()
        _VENDOR_KINDS[key] = kind
    return kind


def _meta(t: torch.Tensor) -> tuple:
    return t.shape, t.stride(), t.dtype, t.device


# _vendor_kind's answers by metadata key (bounded: cleared when full).
_VENDOR_KINDS: dict = {}
_VENDOR_KINDS_MAX = 1024


def _decide_vendor_kind(choice, q, x_scale, w, w_scale, out_dtype) -> str | None:
    kind = gemm_ref.check_gemm_fp8_args(q, x_scale, w, w_scale, out_dtype)
    if kind == gemm_ref.SCALE_ROWWISE:
        ok, table = _vendor_rowwise_ok(q, x_scale, w, w_scale, out_dtype), "gemm_fp8_backend"
    else:
        ok, table = _vendor_block_ok(q, x_scale, w, w_scale, out_dtype), "gemm_fp8_block_backend"
    if not ok:
        return None
    if choice == "vendor":
        return kind
    m, k = q.shape
    target = detect_target(q.device)
    config = launch_tables.lookup(table, target, m=max(m, 1), n=w.shape[0], k=k)
    return kind if config["BACKEND"] == BACKEND_VENDOR else None


def _use_vendor(q, x_scale, w, w_scale, out_dtype) -> bool:
    return _vendor_kind(q, x_scale, w, w_scale, out_dtype) is not None


def _gemm_fp8_vendor(q, x_scale, w, w_scale, out_dtype):
    """Rowwise / tensorwise A8W8 through torch._scaled_mm (fp32 scales, checked by the caller):
    (M, 1) and (1, N) contiguous scales, or two scalars. Scales already in that form are passed
    as they are (no copies, no extra torch calls on the host)."""
    m, n = q.shape[0], w.shape[0]
    if x_scale.numel() == 1 and w_scale.numel() == 1:  # tensorwise
        return torch._scaled_mm(
            q, w.t(), x_scale.reshape(()), w_scale.reshape(()), out_dtype=out_dtype
        )
    if x_scale.shape == (m, 1) and (m == 1 or x_scale.stride(0) == 1):
        a_s = x_scale
    else:
        a_s = x_scale.reshape(-1, 1).expand(m, 1).contiguous()
    if w_scale.numel() == n and w_scale.is_contiguous():
        b_s = w_scale.view(1, n)
    else:
        b_s = w_scale.reshape(1, -1).expand(1, n).contiguous()
    return torch._scaled_mm(q, w.t(), a_s, b_s, out_dtype=out_dtype)


# Which (scale_a, scale_b) layout of `_block_scale_layouts` this torch build's blockwise
# torch._scaled_mm takes, per CUDA device index; None: none (the Triton kernel runs there).
_UNTRIED = -1
_VENDOR_BLOCK_LAYOUT: dict[int | None, int | None] = {}


def _block_scale_layouts(x_scale, w_scale):
    """Candidate (scale_a, scale_b) for q (M, K) @ w.t() (K, N), as builders (only the one used
    is made): the 1×128 scales (M, K/128) outer-dim-major (column-major) or row-major, the 128×128
    ones (N/128, K/128) transposed to (K/128, N/128) or as stored."""

    def col_major():
        return x_scale if x_scale.stride(0) == 1 else x_scale.t().contiguous().t()

    return (
        lambda: (col_major(), w_scale.t()),
        lambda: (col_major(), w_scale),
        lambda: (x_scale.contiguous(), w_scale.t()),
    )


def _gemm_fp8_vendor_block(q, x_scale, w, w_scale, out_dtype):
    """Blockscale A8W8 through torch._scaled_mm. A device's first call finds the scale layout
    torch takes (eagerly: the fused ops run before any CUDA graph is captured); if torch takes
    none, that device runs the Triton kernel from then on."""
    key = q.device.index
    layouts = _block_scale_layouts(x_scale, w_scale)
    known = _VENDOR_BLOCK_LAYOUT.get(key, _UNTRIED)
    if known != _UNTRIED:
        return torch._scaled_mm(q, w.t(), *layouts[known](), out_dtype=out_dtype)
    for i, layout in enumerate(layouts):
        try:
            out = torch._scaled_mm(q, w.t(), *layout(), out_dtype=out_dtype)
        except (RuntimeError, ValueError, NotImplementedError):
            continue
        _VENDOR_BLOCK_LAYOUT[key] = i
        return out
    _VENDOR_BLOCK_LAYOUT[key] = None
    return _fp8_kernels().gemm_fp8(q, x_scale, w, w_scale, out_dtype)


def _gemm_fp8(q, x_scale, w, w_scale, out_dtype):
    if use_triton(q, w):
        kind = _vendor_kind(q, x_scale, w, w_scale, out_dtype)
        if kind == gemm_ref.SCALE_ROWWISE:
            return _gemm_fp8_vendor(q, x_scale, w, w_scale, out_dtype)
        if kind == gemm_ref.SCALE_BLOCK:
            return _gemm_fp8_vendor_block(q, x_scale, w, w_scale, out_dtype)
        return _fp8_kernels().gemm_fp8(q, x_scale, w, w_scale, out_dtype)
    return gemm_ref.gemm_fp8_ref(q, x_scale, w, w_scale, out_dtype)


def _mxfp4_layout(w, w_scale, k: int) -> dict:
    """The kernels' layout arguments for MXFP4 weights, plain or preshuffled (told by shape,
    `gemm_ref.mxfp4_weight_layout`; the weight-prepack pass makes the preshuffled ones)."""
    n, preshuffled = gemm_ref.mxfp4_weight_layout(w, w_scale, k)
    return {"preshuffled": True, "n": n} if preshuffled else {}


def _gemm_mxfp4(q, x_scale, w, w_scale, out_dtype):
    if use_triton(q, w):
        layout = _mxfp4_layout(w, w_scale, 2 * q.shape[1])
        return _mxfp4_kernels().gemm_mxfp4(q, x_scale, w, w_scale, out_dtype, **layout)
    w, w_scale = gemm_ref.unshuffled_weights(w, w_scale, 2 * q.shape[1])
    return gemm_ref.gemm_mxfp4_ref(q, x_scale, w, w_scale, out_dtype)


@fused_op("fxfuse::gemm_fp8", mutates_args=())
def gemm_fp8(
    q: torch.Tensor,
    x_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """(q · x_scale) @ (w · w_scale)ᵀ; w (N, K) fp8, w_scale (N,) | (N, 1) | () | (N/128, K/128)."""
    return _gemm_fp8(q, x_scale, w, w_scale, out_dtype)


@gemm_fp8.register_fake
def _(q, x_scale, w, w_scale, out_dtype=torch.bfloat16):
    gemm_ref.check_gemm_fp8_args(q, x_scale, w, w_scale, out_dtype)
    return q.new_empty((q.shape[0], w.shape[0]), dtype=out_dtype)


@fused_op("fxfuse::gemm_mxfp4", mutates_args=())
def gemm_mxfp4(
    q: torch.Tensor,
    x_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """unpack(q, x_scale) @ unpack(w, w_scale)ᵀ; q (M, K/2), w (N, K/2) uint8, e8m0 scales."""
    return _gemm_mxfp4(q, x_scale, w, w_scale, out_dtype)


@gemm_mxfp4.register_fake
def _(q, x_scale, w, w_scale, out_dtype=torch.bfloat16):
    n, preshuffled = gemm_ref.mxfp4_weight_layout(w, w_scale, 2 * q.shape[1])
    if not preshuffled:
        gemm_ref.check_gemm_mxfp4_args(q, x_scale, w, w_scale, out_dtype)
    return q.new_empty((q.shape[0], n), dtype=out_dtype)


# --- the prequant GEMMs (activation quantized in the GEMM's prologue) ---------------------------


def _prequant_gemm(y, w, w_scale, out_dtype, quant_args):
    """GEMM of the unquantized rows y whose activation quant happens inside the GEMM."""
    if quant_args["quant"] == "mxfp4":
        if use_triton(y, w):
            return _mxfp4_kernels().gemm_a16wfp4(
                y, w, w_scale, rounding=quant_args["rounding"], out_dtype=out_dtype,
                **_mxfp4_layout(w, w_scale, y.shape[-1]),
            )
        q, s = quant_mxfp4_ref(y, quant_args["rounding"])
        w, w_scale = gemm_ref.unshuffled_weights(w, w_scale, y.shape[-1])
        return gemm_ref.gemm_mxfp4_ref(q, s, w, w_scale, out_dtype)
    kwargs = {k: quant_args[k] for k in ("group_size", "quant_eps", "eps_on_scale", "apply_reciprocal")}
    if use_triton(y, w):
        return _fp8_kernels().gemm_a16w8(y, w, w_scale, out_dtype=out_dtype, **kwargs)
    q, s = quant_fp8_ref(y, kwargs["group_size"], w.dtype, kwargs["quant_eps"],
                         kwargs["eps_on_scale"], kwargs["apply_reciprocal"])
    return gemm_ref.gemm_fp8_ref(q, s, w, w_scale, out_dtype)


def _quantized_gemm(q, scale, w, w_scale, out_dtype, quant_args):
    if quant_args["quant"] == "mxfp4":
        return _gemm_mxfp4(q, scale, w, w_scale, out_dtype)
    return _gemm_fp8(q, scale, w, w_scale, out_dtype)


def _check_dispatch_args(x, w, quant_args, max_m):
    if not isinstance(max_m, int) or max_m < 0:
        raise ValueError(f"prologue_quant_max_m: expected an int >= 0, got {max_m!r}")
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"x: expected (..., K) with K > 0, got shape {tuple(x.shape)}")
    if quant_args["quant"] == "fp8":
        if quant_args["group_size"] not in (0, 128):
            raise ValueError(f"group_size: expected 0 or 128, got {quant_args['group_size']}")
        if w.dtype != quant_args["fp8_dtype"]:
            raise ValueError(f"w: dtype {w.dtype} differs from the quant's {quant_args['fp8_dtype']}")
    elif quant_args["quant"] != "mxfp4":
        raise ValueError(f"quant: expected 'fp8' or 'mxfp4', got {quant_args['quant']!r}")


def dispatch_by_rows(x, w, w_scale, out_dtype, quant_args, max_m, norm_quant, norm,
                     keep_norm=False):
    """The token-count dispatch of every chain ending in a GEMM: above max_m rows,
    `norm_quant()` → (q, scale, h[, y]) then the quantized GEMM; at or below, `norm()` → (y, h)
    then the prequant GEMM. Returns (out (M, N), h), and y last when keep_norm (norm_quant then
    returns it too: the norm's other readers take it)."""
    _check_dispatch_args(x, w, quant_args, max_m)
    if _rows(x) > max_m:
        q, scale, h, *y = norm_quant()
        q, scale = q.reshape(-1, q.shape[-1]), scale.reshape(-1, scale.shape[-1])
        out = _quantized_gemm(q, scale, w, w_scale, out_dtype, quant_args)
    else:
        y0, h = norm()
        y = [y0]
        out = _prequant_gemm(y0.reshape(-1, y0.shape[-1]), w, w_scale, out_dtype, quant_args)
    return (out, h, *y) if keep_norm else (out, h)


def _norm_quant_gemm(x, residual, weight, eps, norm, quant_args, w, w_scale, out_dtype, max_m,
                     keep_norm=False):
    return dispatch_by_rows(
        x, w, w_scale, out_dtype, quant_args, max_m,
        lambda: norm_quant_ops._fused(x, residual, weight, eps, norm, quant_args,
                                      write_norm=keep_norm),
        lambda: norm_quant_ops._norm(x, weight, eps, residual, norm["weight_offset"],
                                     norm["round_before_weight"], norm["norm_dtype"],
                                     norm["reciprocal_sqrt"]),
        keep_norm,
    )  # fmt: skip


def _rows(x: torch.Tensor):
    """Token count M of an (..., K) activation."""
    return math.prod(x.shape[:-1])


def _gemm_fake(x, w, quant_args, out_dtype, max_m):
    """(M, N): x (..., K) is flattened to M rows, as the GEMM it replaces saw them."""
    _check_dispatch_args(x, w, quant_args, max_m)
    n = w.shape[0]
    if quant_args["quant"] == "mxfp4" and gemm_ref.is_preshuffled(w, x.shape[-1]):
        n *= 16  # (N/16, K/2·16): the fake sees w, not w_scale
    return x.new_empty((_rows(x), n), dtype=out_dtype)


@fused_op("fxfuse::rms_norm_quant_gemm", mutates_args=())
def rms_norm_quant_gemm(
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
    w: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype,
    prologue_quant_max_m: int,
) -> torch.Tensor:
    """RMSNorm → quant → GEMM, dispatched by M (module docstring). x (M, K) → (M, N)."""
    norm, quant_args = norm_quant_ops._norm_quant_args(
        weight_offset, round_before_weight, norm_dtype, reciprocal_sqrt, quant, group_size,
        fp8_dtype, quant_eps, eps_on_scale, apply_reciprocal, scale_col_major, rounding)
    out, _ = _norm_quant_gemm(x, None, weight, eps, norm, quant_args, w, w_scale, out_dtype,
                              prologue_quant_max_m)
    return out


@rms_norm_quant_gemm.register_fake
def _(x, weight, eps, *args):
    *nq, w, _w_scale, out_dtype, max_m = args
    _, quant_args = norm_quant_ops._norm_quant_args(*nq)
    return _gemm_fake(x, w, quant_args, out_dtype, max_m)


@fused_op("fxfuse::add_rms_norm_quant_gemm", mutates_args=())
def add_rms_norm_quant_gemm(
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
    w: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype,
    prologue_quant_max_m: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add → RMSNorm → quant → GEMM, dispatched by M: (out, x + residual)."""
    norm, quant_args = norm_quant_ops._norm_quant_args(
        weight_offset, round_before_weight, norm_dtype, reciprocal_sqrt, quant, group_size,
        fp8_dtype, quant_eps, eps_on_scale, apply_reciprocal, scale_col_major, rounding)
    return _norm_quant_gemm(x, residual, weight, eps, norm, quant_args, w, w_scale, out_dtype,
                            prologue_quant_max_m)


@add_rms_norm_quant_gemm.register_fake
def _(x, residual, weight, eps, *args):
    *nq, w, _w_scale, out_dtype, max_m = args
    _, quant_args = norm_quant_ops._norm_quant_args(*nq)
    return _gemm_fake(x, w, quant_args, out_dtype, max_m), torch.empty_like(x)


# --- the same, with the normed y as an output too ------------------------------------------------
# For a norm whose y is also read by something other than the quant (an MoE layer's router) while
# the quant feeds one GEMM (a shared expert's merged gate_up projection): y comes from the kernel
# that runs anyway, the norm kernel at or below prologue_quant_max_m, the norm-quant kernel above.


def _norm_fake(x, args):
    return x.new_empty(x.shape, dtype=args[2] or x.dtype)  # args[2]: norm_dtype


@fused_op("fxfuse::rms_norm_quant_gemm_with_norm",
          schema=variant_schema(rms_norm_quant_gemm, "(Tensor, Tensor)"))
def rms_norm_quant_gemm_with_norm(x, weight, eps, *args):
    """rms_norm_quant_gemm (the same arguments) that also returns the normed y: (out, y)."""
    *nq, w, w_scale, out_dtype, max_m = args
    norm, quant_args = norm_quant_ops._norm_quant_args(*nq)
    out, _, y = _norm_quant_gemm(x, None, weight, eps, norm, quant_args, w, w_scale, out_dtype,
                                 max_m, keep_norm=True)
    return out, y


@rms_norm_quant_gemm_with_norm.register_fake
def _(x, weight, eps, *args):
    return fxfuse.rms_norm_quant_gemm(x, weight, eps, *args), _norm_fake(x, args)


@fused_op("fxfuse::add_rms_norm_quant_gemm_with_norm",
          schema=variant_schema(add_rms_norm_quant_gemm, "(Tensor, Tensor, Tensor)"))
def add_rms_norm_quant_gemm_with_norm(x, residual, weight, eps, *args):
    """add_rms_norm_quant_gemm (the same arguments) that also returns the normed y:
    (out, x + residual, y)."""
    *nq, w, w_scale, out_dtype, max_m = args
    norm, quant_args = norm_quant_ops._norm_quant_args(*nq)
    return _norm_quant_gemm(x, residual, weight, eps, norm, quant_args, w, w_scale, out_dtype,
                            max_m, keep_norm=True)


@add_rms_norm_quant_gemm_with_norm.register_fake
def _(x, residual, weight, eps, *args):
    return (*fxfuse.add_rms_norm_quant_gemm(x, residual, weight, eps, *args), _norm_fake(x, args))


@fused_op("fxfuse::quant_gemm", mutates_args=())
def quant_gemm(
    x: torch.Tensor,
    quant: str,
    group_size: int,
    fp8_dtype: torch.dtype,
    quant_eps: float,
    eps_on_scale: bool,
    apply_reciprocal: bool,
    rounding: str,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype,
    prologue_quant_max_m: int,
) -> torch.Tensor:
    """quant → GEMM: the quant kernel then the GEMM above prologue_quant_max_m, the prequant
    GEMM at or below it."""
    quant_args = {
        "quant": quant, "group_size": group_size, "fp8_dtype": fp8_dtype, "quant_eps": quant_eps,
        "eps_on_scale": eps_on_scale, "apply_reciprocal": apply_reciprocal,
        "scale_col_major": False, "rounding": rounding,
    }
    _check_dispatch_args(x, w, quant_args, prologue_quant_max_m)
    x = x.reshape(-1, x.shape[-1])
    if x.shape[0] <= prologue_quant_max_m:
        return _prequant_gemm(x, w, w_scale, out_dtype, quant_args)
    # The quant ops' implementations, called directly: this op is already past the dispatcher.
    if quant == "mxfp4":
        q, scale = norm_quant_ops.quant_mxfp4.impl(x, rounding)
    else:
        q, scale = norm_quant_ops.quant_fp8.impl(x, group_size, fp8_dtype, quant_eps,
                                                 eps_on_scale, apply_reciprocal, False)
    return _quantized_gemm(q, scale, w, w_scale, out_dtype, quant_args)


@quant_gemm.register_fake
def _(x, quant, group_size, fp8_dtype, quant_eps, eps_on_scale, apply_reciprocal, rounding, w,
      w_scale, out_dtype, prologue_quant_max_m):
    quant_args = {"quant": quant, "group_size": group_size, "fp8_dtype": fp8_dtype}
    return _gemm_fake(x, w, quant_args, out_dtype, prologue_quant_max_m)
