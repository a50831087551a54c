"""Torch references of the quantized GEMMs, their argument checks, and the gfx950 preshuffles.

FP8 (SPEC §1, §2), out = (q · x_scale) @ (w · w_scale)ᵀ with fp32 (or, for tests, fp64) math:
    rowwise:    x_scale (M, 1) per token or () / (1,) tensorwise;
                w_scale (N,) / (N, 1) per channel or () / (1,) tensorwise
    blockscale: x_scale (M, K/128) per 1×128 group (row- or column-major strides);
                w_scale (ceil(N/128), K/128) per 128×128 block
MXFP4 (OCP MX v1.0): q (M, K/2), x_scale (M, K/32), w (N, K/2), w_scale (N, K/32), uint8;
    out = unpack(q, x_scale) @ unpack(w, w_scale)ᵀ.
Prequant (A16W8 / A16WFP4): x is quantized by `rms_norm_quant_ref.quant_fp8_ref` /
`quant_mxfp4_ref` first, so the result is the A8W8 / AFP4WFP4 GEMM of those exact bytes.

gfx950 preshuffled layouts (SPEC §2) and their inverses: `preshuffle_weight_fp4`,
`preshuffle_scale_e8m0`.
"""

from __future__ import annotations

import torch

from fxfuse.kernels import formats
from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref, quant_mxfp4_ref

FP8_BLOCK = 128
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
REF_OUT_DTYPES = (*OUT_DTYPES, torch.float64)  # the references also give fp64 for tests
SCALE_ROWWISE = "rowwise"
SCALE_BLOCK = "blockscale"


def _shape(t) -> tuple:
    return tuple(getattr(t, "shape", ()))


def _check_tensor(name: str, t, dtypes: tuple, dim: int | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        # ValueError like every other bad argument here (the contract names the argument).
        raise ValueError(f"{name}: expected a tensor, got {type(t).__name__}")  # noqa: TRY004
    if t.dtype not in dtypes:
        raise ValueError(f"{name}: dtype must be one of {dtypes}, got {t.dtype}")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name}: expected a {dim}-D tensor, got shape {_shape(t)}")


def _check_out_dtype(out_dtype, allowed: tuple = OUT_DTYPES) -> None:
    if out_dtype not in allowed:
        raise ValueError(f"out_dtype: expected one of {allowed}, got {out_dtype}")


def _check_devices(tensors: dict) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    first = next(iter(devices.values()))
    for name, device in devices.items():
        if device != first:
            raise ValueError(f"{name}: on {device}, the other inputs are on {first}")


def _is_scalar_scale(s: torch.Tensor) -> bool:
    return s.dim() == 0 or (s.dim() == 1 and s.shape[0] == 1)


def is_rowwise_w_scale(w_scale: torch.Tensor, n: int) -> bool:
    """An FP8 weight scale per channel ((N,), (N, 1)) or tensorwise ((), (1,)), as the GEMMs
    read it (any other shape is a 128×128 blockscale)."""
    return _is_scalar_scale(w_scale) or _shape(w_scale) in ((n,), (n, 1))


def scale_strides(s: torch.Tensor) -> tuple[int, int]:
    """Strides (rows, groups) of an FP8 GEMM's scale tensor, for kernels; 0 where it broadcasts."""
    if _is_scalar_scale(s):
        return 0, 0
    if s.dim() == 1:
        return s.stride(0), 0
    return s.stride(0), s.stride(1)


def check_gemm_fp8_args(q, x_scale, w, w_scale, out_dtype, out_dtypes=OUT_DTYPES) -> str:
    """Validate an FP8 GEMM's arguments (ValueError naming the argument); returns the scale kind."""
    _check_tensor("q", q, formats.FP8_DTYPES, 2)
    _check_tensor("w", w, formats.FP8_DTYPES, 2)
    _check_tensor("x_scale", x_scale, (torch.float32,))
    _check_tensor("w_scale", w_scale, (torch.float32,))
    _check_out_dtype(out_dtype, out_dtypes)
    if w.dtype != q.dtype:
        raise ValueError(f"w: dtype {w.dtype} differs from q's {q.dtype}")
    m, k = q.shape
    n = w.shape[0]
    if w.shape[1] != k:
        raise ValueError(f"w: expected (N, {k}) to match q's K, got {_shape(w)}")
    _check_devices({"q": q, "x_scale": x_scale, "w": w, "w_scale": w_scale})
    kb, nb = -(-k // FP8_BLOCK), -(-n // FP8_BLOCK)
    w_rowwise = is_rowwise_w_scale(w_scale, n)
    if w_rowwise:
        if not (_is_scalar_scale(x_scale) or _shape(x_scale) == (m, 1)):
            raise ValueError(
                f"x_scale: with a per-channel / tensorwise w_scale expected (M, 1) = ({m}, 1), "
                f"() or (1,), got {_shape(x_scale)}"
            )
        return SCALE_ROWWISE
    if _shape(w_scale) != (nb, kb):
        raise ValueError(
            f"w_scale: expected (N,) / (N, 1) = ({n},) per channel, () / (1,) tensorwise or "
            f"(ceil(N/128), K/128) = ({nb}, {kb}) per block, got {_shape(w_scale)}"
        )
    if k % FP8_BLOCK:
        raise ValueError(f"q: K must be a multiple of 128 for blockscale scales, got {k}")
    if _shape(x_scale) != (m, kb):
        raise ValueError(
            f"x_scale: with a blockscale w_scale expected (M, K/128) = ({m}, {kb}), "
            f"got {_shape(x_scale)}"
        )
    return SCALE_BLOCK


def check_gemm_mxfp4_args(q, x_scale, w, w_scale, out_dtype, out_dtypes=OUT_DTYPES) -> None:
    """Validate an MXFP4 GEMM's (unshuffled) arguments (ValueError naming the argument)."""
    for name, t in (("q", q), ("x_scale", x_scale), ("w", w), ("w_scale", w_scale)):
        _check_tensor(name, t, (torch.uint8,), 2)
    _check_out_dtype(out_dtype, out_dtypes)
    m, kb = q.shape
    k = 2 * kb
    if k % formats.MXFP4_BLOCK:
        raise ValueError(f"q: K = 2 · q.shape[1] = {k} must be a multiple of 32 for MXFP4")
    n = w.shape[0]
    if w.shape[1] != kb:
        raise ValueError(f"w: expected (N, K/2) = (N, {kb}) to match q, got {_shape(w)}")
    if _shape(x_scale) != (m, k // formats.MXFP4_BLOCK):
        raise ValueError(f"x_scale: expected (M, K/32) = ({m}, {k // 32}), got {_shape(x_scale)}")
    if _shape(w_scale) != (n, k // formats.MXFP4_BLOCK):
        raise ValueError(f"w_scale: expected (N, K/32) = ({n}, {k // 32}), got {_shape(w_scale)}")
    _check_devices({"q": q, "x_scale": x_scale, "w": w, "w_scale": w_scale})


# --- dequantization ------------------------------------------------------------------------------


def dequant_fp8(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """q (R, K) fp8 times its scale: () / (1,), (R,) / (R, 1), or (R', K/128) per 128-group of
    columns (R' = R: 1×128 groups; R' = ceil(R/128): 128×128 blocks)."""
    values = q.to(dtype)
    scale = scale.to(dtype)
    if _is_scalar_scale(scale):
        return values * scale.reshape(())
    rows, k = q.shape
    if scale.dim() == 1 or (scale.shape[1] == 1 and scale.shape[0] == rows):
        return values * scale.reshape(-1, 1)  # per row (one group covers K ≤ 128 alike)
    full = scale.repeat_interleave(FP8_BLOCK, dim=1)[:, :k]
    if scale.shape[0] != rows:  # 128×128 blocks
        full = full.repeat_interleave(FP8_BLOCK, dim=0)[:rows]
    return values * full


def gemm_fp8_ref(q, x_scale, w, w_scale, out_dtype=torch.bfloat16, compute_dtype=torch.float32):
    """(q · x_scale) @ (w · w_scale)ᵀ in compute_dtype (fp64 for tests), rounded to out_dtype."""
    check_gemm_fp8_args(q, x_scale, w, w_scale, out_dtype, REF_OUT_DTYPES)
    a = dequant_fp8(q, x_scale, compute_dtype)
    b = dequant_fp8(w, w_scale, compute_dtype)
    return (a @ b.t()).to(out_dtype)


def gemm_mxfp4_ref(q, x_scale, w, w_scale, out_dtype=torch.bfloat16, compute_dtype=torch.float32):
    """unpack(q, x_scale) @ unpack(w, w_scale)ᵀ in compute_dtype, rounded to out_dtype."""
    check_gemm_mxfp4_args(q, x_scale, w, w_scale, out_dtype, REF_OUT_DTYPES)
    a = formats.unpack_mxfp4(q, x_scale).to(compute_dtype)
    b = formats.unpack_mxfp4(w, w_scale).to(compute_dtype)
    return (a @ b.t()).to(out_dtype)


def gemm_a16w8_ref(
    x,
    w,
    w_scale,
    group_size: int = 0,
    quant_eps: float = 1e-10,
    eps_on_scale: bool = False,
    apply_reciprocal: bool = False,
    out_dtype=torch.bfloat16,
    compute_dtype=torch.float32,
):
    """quant_fp8_ref(x) (per token or 1×128) with w's FP8 dtype, then `gemm_fp8_ref`."""
    _check_tensor("w", w, formats.FP8_DTYPES, 2)
    q, x_scale = quant_fp8_ref(x, group_size, w.dtype, quant_eps, eps_on_scale, apply_reciprocal)
    return gemm_fp8_ref(q, x_scale, w, w_scale, out_dtype, compute_dtype)


def gemm_a16wfp4_ref(
    x, w, w_scale, rounding="even", out_dtype=torch.bfloat16, compute_dtype=torch.float32
):
    """quant_mxfp4_ref(x, rounding), then `gemm_mxfp4_ref`."""
    q, x_scale = quant_mxfp4_ref(x, rounding)
    return gemm_mxfp4_ref(q, x_scale, w, w_scale, out_dtype, compute_dtype)


# --- gfx950 preshuffled layouts (SPEC §2) ---------------------------------------------------------

SCALE_PAD_VALUE = 127  # e8m0 for 1.0


def preshuffle_weight_fp4(w: torch.Tensor) -> torch.Tensor:
    """(16, 16) shuffle of packed MXFP4 bytes (N, Kb) → (N/16, Kb·16); N % 16 == Kb % 32 == 0."""
    _check_tensor("w", w, (torch.uint8,), 2)
    n, kb = w.shape
    if n % 16 or kb % 32:
        raise ValueError(f"w: expected N % 16 == 0 and K/2 % 32 == 0, got {_shape(w)}")
    return w.reshape(n // 16, 16, kb // 32, 2, 16).permute(0, 2, 3, 1, 4).reshape(n // 16, kb * 16)


def unshuffle_weight_fp4(w_shuffled: torch.Tensor) -> torch.Tensor:
    """Inverse of `preshuffle_weight_fp4`: (N/16, Kb·16) → (N, Kb)."""
    _check_tensor("w_shuffled", w_shuffled, (torch.uint8,), 2)
    n16, kb16 = w_shuffled.shape
    if kb16 % (16 * 32):
        raise ValueError(f"w_shuffled: expected Kb·16 with Kb % 32 == 0, got {_shape(w_shuffled)}")
    kb = kb16 // 16
    return w_shuffled.reshape(n16, kb // 32, 2, 16, 16).permute(0, 3, 1, 2, 4).reshape(n16 * 16, kb)


def preshuffle_scale_e8m0(s: torch.Tensor) -> torch.Tensor:
    """e8m0 scale shuffle: pad (R, C) to multiples of (256, 8) with 127, → (R'/32, C'·32)."""
    _check_tensor("s", s, (torch.uint8,), 2)
    rows, cols = s.shape
    r, c = -(-rows // 256) * 256, -(-cols // 8) * 8
    padded = torch.full((r, c), SCALE_PAD_VALUE, dtype=s.dtype, device=s.device)
    padded[:rows, :cols] = s
    shuffled = padded.reshape(r // 32, 2, 16, c // 8, 2, 4).permute(0, 3, 5, 2, 4, 1)
    return shuffled.reshape(r // 32, c * 32)


def preshuffled_shapes(n: int, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """(weight shape, scale shape) of N × K MXFP4 weights in the preshuffled layouts."""
    rows, cols = -(-n // 256) * 256, -(-(k // formats.MXFP4_BLOCK) // 8) * 8
    return (n // 16, k // 2 * 16), (rows // 32, cols * 32)


def is_preshuffled(w, k: int) -> bool:
    """Whether MXFP4 weight bytes for reduction size K are in the preshuffled layout: its rows
    hold K/2·16 bytes (8·K), the plain layout's K/2."""
    return w.dim() == 2 and w.shape[1] == k // 2 * 16


def mxfp4_weight_layout(w, w_scale, k: int) -> tuple[int, bool]:
    """(N, preshuffled) of MXFP4 weights for reduction size K, told apart by shape: plain
    (N, K/2) bytes, or the preshuffled (N/16, K/2·16) that a weight-prepack pass made (8·K
    bytes a row, never K/2). Checks the scales' shape against the layout (ValueError naming
    the argument); the plain layout's other checks stay with `check_gemm_mxfp4_args`."""
    _check_tensor("w", w, (torch.uint8,), 2)
    _check_tensor("w_scale", w_scale, (torch.uint8,), 2)
    if not is_preshuffled(w, k):
        return w.shape[0], False
    n = 16 * w.shape[0]
    if (k // 2) % 32:
        raise ValueError(f"w: preshuffled weights need K/2 % 32 == 0, got K = {k}")
    _, scale_shape = preshuffled_shapes(n, k)
    if _shape(w_scale) != scale_shape:
        raise ValueError(
            f"w_scale: expected the preshuffled {scale_shape} for N = {n}, K = {k}, "
            f"got {_shape(w_scale)}"
        )
    return n, True


def unshuffled_weights(w, w_scale, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(w, w_scale) in the plain layouts, whichever layout they are in."""
    n, preshuffled = mxfp4_weight_layout(w, w_scale, k)
    if not preshuffled:
        return w, w_scale
    return unshuffle_weight_fp4(w), unshuffle_scale_e8m0(w_scale, n, k // formats.MXFP4_BLOCK)


def unshuffle_scale_e8m0(s_shuffled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Inverse of `preshuffle_scale_e8m0`: the (rows, cols) scales, padding dropped."""
    _check_tensor("s_shuffled", s_shuffled, (torch.uint8,), 2)
    r, c = -(-rows // 256) * 256, -(-cols // 8) * 8
    if _shape(s_shuffled) != (r // 32, c * 32):
        raise ValueError(
            f"s_shuffled: expected ({r // 32}, {c * 32}) for {rows}×{cols} scales, "
            f"got {_shape(s_shuffled)}"
        )
    unshuffled = s_shuffled.reshape(r // 32, c // 8, 4, 16, 2, 2).permute(0, 5, 3, 1, 4, 2)
    return unshuffled.reshape(r, c)[:rows, :cols]
