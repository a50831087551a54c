"""Fused [residual add →] RMSNorm → quant: one Triton kernel, one read of each input row.

Math (exactly `rms_norm_quant_ref.rms_norm_quant_ref`; all arithmetic fp32 after the input cast):
    h    = round_x(x + residual)                         stored: it is itself an output
    inv  = 1 / sqrt_rn(sum(h²) / N + eps)                correctly rounded steps, like torch on CPU
    y    = round_n(round_x(h · inv) · w)                 round_before_weight (Llama, aten.rms_norm)
    y    = round_n(h · inv · w)                          otherwise ((h·w).to(dtype); Gemma)
    with w = weight (+ weight_offset when it is nonzero), round_x / round_n to x.dtype / norm_dtype.
    FP8, per row or per group of G columns:
        s = max(amax, quant_eps) / FP8_MAX   (eps_on_scale: max(amax / FP8_MAX, quant_eps))
        q = clamp(y / s, ±FP8_MAX)           (apply_reciprocal: y · (1 / s)), nearest even
    MXFP4 (blocks of 32): e8m0 exponent from the fp32 bits of the block amax (formats.py: floor /
    even / ceil), elements y · 2^-e on the e2m1 grid, nearest even, saturating at ±6.
Quant only (`quant`, HAS_NORM off; behind `fxfuse.quant_fp8` / `quant_mxfp4`): y = fp32(x), the
same quant code, `quant_fp8_ref` / `quant_mxfp4_ref` exactly (an inf in a row gives that row's NaN
bytes and inf scale as torch does; a NaN input is not matched: the amax reductions drop NaN).

Layouts: x, residual (M, N) with any strides; weight (N,); h and y (M, N) contiguous.
    FP8: q (M, N) fp8; scale (M, 1) per row or (M, N/G) per group, fp32, row-major or a
        column-major (N/G, M) buffer returned transposed.
    MXFP4: q (M, N/2) uint8, byte = code[2i] | code[2i+1] << 4; scale (M, N/32) uint8 (e8m0).

Tiling: a row is a (chunks, CHUNK / VEC, VEC) register tile; chunk c holds columns c·GROUP + j,
j < GROUP ≤ CHUNK (CHUNK a power of 2), so a group / MX block is one chunk and its amax a
reduction over the last two axes, for any group size. VEC = 16 bytes of x bounds the vector width
of every access alike, so loads and stores share one register layout (no shared-memory shuffles).
A row whose padded width fits BLOCK_N_MAX is read once; a wider row loops over tiles: a
sum-of-squares pass, then (per-row FP8 only) an amax pass, then the output pass, each recomputing
h from x (+ residual) bit for bit.

Numerics: the quantized bytes and scales equal the reference's on the same y. y itself can differ
from the torch reference by 1 ulp where the different summation order of sum(h²) moves inv by an
fp32 ulp across a rounding boundary. Triton's interpreter converts fp32 → bf16 / fp8 inexactly (no
ties-to-even, no carry), so under it (EXACT_CASTS) those casts are integer arithmetic; compiled
code uses the hardware round-to-nearest-even converts, and a software e4m3 encoder where the
target has none (e4m3fnuz).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fxfuse.kernels import formats
from fxfuse.kernels._plans import launch, planned
from fxfuse.runtime import launch_tables
from fxfuse.runtime.target import TARGETS, detect_target, interpreting

# fmt: off
# (Kernel arguments stay grouped by role, as in the Triton tutorials.)

QUANT_NONE = tl.constexpr(0)
QUANT_FP8_ROW = tl.constexpr(1)
QUANT_FP8_GROUP = tl.constexpr(2)
QUANT_MXFP4 = tl.constexpr(3)


# ---------------------------------------------------------------------------------------------
# element helpers


@triton.jit
def _to_f32(v, EXACT_CASTS: tl.constexpr):
    """Widen to fp32 (bf16 by a shift when interpreting: its converter is inexact)."""
    if EXACT_CASTS and v.dtype == tl.bfloat16:
        return (v.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return v.to(tl.float32)


@triton.jit
def _load_f32(ptrs, mask, EXACT_CASTS: tl.constexpr):
    return _to_f32(tl.load(ptrs, mask=mask, other=0.0), EXACT_CASTS)


@triton.jit
def _round_to(v, DTYPE: tl.constexpr, EXACT_CASTS: tl.constexpr):
    """fp32 v rounded (nearest even) to DTYPE, returned as fp32."""
    if DTYPE == tl.float32:
        return v
    if EXACT_CASTS and DTYPE == tl.bfloat16:
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return tl.where(v != v, v, bits.to(tl.float32, bitcast=True))  # noqa: PLR0124 (NaN)
    return v.to(DTYPE).to(tl.float32)


@triton.jit
def _store_as(ptrs, v, mask, EXACT_CASTS: tl.constexpr):
    """Store fp32 v, already representable in the pointer's dtype, exactly."""
    DTYPE: tl.constexpr = ptrs.dtype.element_ty
    if EXACT_CASTS and DTYPE == tl.bfloat16:
        bits = (v.to(tl.uint32, bitcast=True) >> 16).to(tl.uint16)
        tl.store(ptrs, bits.to(tl.bfloat16, bitcast=True), mask=mask)
    else:
        tl.store(ptrs, v.to(DTYPE), mask=mask)


@triton.jit
def _fp8_bits(v, FNUZ: tl.constexpr, NATIVE: tl.constexpr):
    """e4m3 byte of fp32 v, round to nearest even (torch's conversion). NATIVE (e4m3fn only, see
    _fp8_native) saturates out-of-range v; the software encoder needs v in [-FP8_MAX, FP8_MAX]."""
    if NATIVE:
        return v.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    BIAS: tl.constexpr = 8 if FNUZ else 7
    bits = v.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    abs_bits = bits & 0x7FFFFFFF
    # Subnormal range: adding 2^(21-BIAS) puts the e4m3 subnormal step at the fp32 ulp, so the
    # fp32 add rounds to nearest even and the low bits are the code.
    magic = (abs_bits.to(tl.float32, bitcast=True) + 2.0 ** (21 - BIAS)).to(tl.int32, bitcast=True)
    subnormal = magic - ((148 - BIAS) << 23)
    # Normal range: rebias the exponent and round the mantissa from 23 to 3 bits, ties to even.
    odd = (abs_bits >> 20) & 1
    normal = (abs_bits + ((BIAS - 127) << 23) + 0x7FFFF + odd) >> 20
    code = tl.where(abs_bits < ((128 - BIAS) << 23), subnormal, normal)
    # NaN (a NaN row / group, or ±inf / inf-scale quotients) as torch casts it: fnuz has the one
    # NaN 0x80; e4m3fn's is 0x7F with the sign kept.
    nan = abs_bits > 0x7F800000
    if FNUZ:
        sign = tl.where(code == 0, 0, sign)  # 0x80 is NaN in fnuz: -0 becomes +0
        return tl.where(nan, 0x80, sign | code).to(tl.uint8)
    return (sign | tl.where(nan, 0x7F, code)).to(tl.uint8)


@triton.jit
def _div_const(v, c: tl.constexpr, CONST_DIV_AS_MUL: tl.constexpr):
    """v / c for a constant c, as torch computes it on the tensors' device: on CUDA/ROCm (eager
    and Inductor alike) a multiply by fp32(1 / c), on CPU a correctly rounded division."""
    if CONST_DIV_AS_MUL:
        return v * (1.0 / c)
    return tl.math.div_rn(v, c)


@triton.jit
def _fp8_scale(
    amax, quant_eps, FP8_MAX: tl.constexpr, EPS_ON_SCALE: tl.constexpr,
    CONST_DIV_AS_MUL: tl.constexpr,
):
    if EPS_ON_SCALE:
        return tl.maximum(_div_const(amax, FP8_MAX, CONST_DIV_AS_MUL), quant_eps)
    return _div_const(tl.maximum(amax, quant_eps), FP8_MAX, CONST_DIV_AS_MUL)


@triton.jit
def _div_by_scale(y, scale, rcp):
    """y / scale correctly rounded, given rcp = 1 / scale correctly rounded: no division per
    element. One remainder step (exact through the FMA) fixes the product's rounding; this is the
    fast path of div.rn.f32 itself. Its range checks never fire here: scales are normal and
    |quotients| <= ~448 (a quotient that underflows is ±0 in e4m3 either way)."""
    q0 = y * rcp
    q1 = tl.fma(tl.fma(-q0, scale, y), rcp, q0)
    # Where q0 is exact the FMA step would spoil it: -0 / s is -0 (not +0), 0 / 0 is NaN and
    # y / inf is ±0 or NaN (an inf in the row; the remainder step gives NaN for every y).
    return tl.where((y == 0.0) | (rcp == 0.0), q0, q1)


@triton.jit
def _fp8_quant(
    y, scale, FP8_MAX: tl.constexpr, FNUZ: tl.constexpr, NATIVE: tl.constexpr,
    APPLY_RECIPROCAL: tl.constexpr, EXACT_CASTS: tl.constexpr,
):
    """Bytes of clamp(y / scale, ±FP8_MAX); scale (one per row or group) broadcasts against y."""
    if APPLY_RECIPROCAL:
        scaled = y * tl.math.div_rn(1.0, scale)
    elif EXACT_CASTS:
        scaled = tl.math.div_rn(y, scale)  # the interpreter's fma is not fused
    else:
        # A subnormal scale (eps 0, tiny rows) has no finite reciprocal: scale it and y by 2^64,
        # exactly, which leaves the quotient and its rounding unchanged.
        tiny = scale < 1.1754943508222875e-38
        scale = tl.where(tiny, scale * 18446744073709551616.0, scale)
        y = tl.where(tiny, y * 18446744073709551616.0, y)
        scaled = _div_by_scale(y, scale, tl.math.div_rn(1.0, scale))  # one rcp per row / group
    if not NATIVE:  # the hardware convert saturates to ±FP8_MAX itself (satfinite)
        # torch's clamp keeps NaN (minnum / maxnum would turn it into ±FP8_MAX).
        scaled = tl.maximum(scaled, -FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
        scaled = tl.minimum(scaled, FP8_MAX, propagate_nan=tl.PropagateNan.ALL)
    return _fp8_bits(scaled, FNUZ, NATIVE)


@triton.jit
def _e8m0_exponent(amax, ROUNDING: tl.constexpr):
    """Shared exponent (int32 in [-127, 127]) from the amax bits; 0 floor, 1 even, 2 ceil."""
    if ROUNDING == 2:
        # ceil(log2(amax / 6)): floor from the exponent field, +1 unless a power of two.
        bits = tl.math.div_rn(amax, 6.0).to(tl.int32, bitcast=True)
        exponent = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)
        exponent = tl.where((bits & 0x7F800000) == 0, -127, exponent)
    else:
        bits = amax.to(tl.int32, bitcast=True)
        if ROUNDING == 1:
            bits = (bits + 0x200000) & -0x800000  # AITER: round the mantissa at bit 21
        exponent = ((bits >> 23) & 0xFF) - 129  # floor(log2(amax)) - 2
    return tl.minimum(tl.maximum(exponent, -127), 127)


@triton.jit
def _e8m0_factor(exponent):
    """2^-exponent as fp32, from its bits (exact, no pow); e = 127 needs the subnormal 2^-127."""
    return tl.where(exponent == 127, 0x400000, (127 - exponent) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _e2m1_code(v):
    """4-bit e2m1 code of fp32 v: nearest even on {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating."""
    mag = tl.abs(v)
    # |v| < 1: adding 2^22 rounds to the 0.5-step grid (nearest even); the step count is the code.
    small = (mag + 4194304.0).to(tl.int32, bitcast=True) - 0x4A800000
    # |v| >= 1: round the mantissa to 1 bit, ties to even; (exponent, bit) - (127, 0) + 2 is the
    # code, and 6.0 (code 7) is the largest.
    bits = mag.to(tl.int32, bitcast=True)
    large = tl.minimum((bits + 0x1FFFFF + ((bits >> 22) & 1)) >> 22, 259) - 252
    code = tl.where(mag < 1.0, small, large)
    return code | ((v < 0).to(tl.int32) << 3)


@triton.jit
def _mxfp4_quant(y, ROUNDING: tl.constexpr):
    """y (chunks, S, V) with one 32-element MX block per chunk: (packed bytes (chunks, S, V / 2),
    e8m0 scale bytes (chunks,))."""
    exponent = _e8m0_exponent(_chunk_max(tl.abs(y)), ROUNDING)
    codes = _e2m1_code(y * _e8m0_factor(exponent)[:, None, None])
    even, odd = tl.split(tl.reshape(codes, (y.shape[0], y.shape[1], y.shape[2] // 2, 2)))
    return (even | (odd << 4)).to(tl.uint8), (exponent + 127).to(tl.uint8)


# ---------------------------------------------------------------------------------------------
# tile helpers: a tile is (TILE_CHUNKS, CHUNK // VEC, VEC); chunk c holds columns c·GROUP + j.
# The innermost VEC columns (16 bytes of x) bound every access's vector width, so loads and the
# h / y / q stores all get the same register layout and no tile crosses shared memory.


@triton.jit
def _chunk_max(a):
    return tl.max(tl.max(a, axis=2), axis=1)


@triton.jit
def _tile_sum(a):
    return tl.sum(tl.sum(tl.sum(a, axis=2), axis=1), axis=0)


@triton.jit
def _tile_columns(
    t, N, num_groups, GROUP: tl.constexpr, CHUNK: tl.constexpr, VEC: tl.constexpr,
    TILE_CHUNKS: tl.constexpr,
):
    """Chunk ids (TILE_CHUNKS,), column ids and their mask for tile t, and which chunks exist."""
    chunk = t * TILE_CHUNKS + tl.arange(0, TILE_CHUNKS)
    j = tl.arange(0, CHUNK // VEC)[None, :, None] * VEC + tl.arange(0, VEC)[None, None, :]
    cols = chunk[:, None, None] * GROUP + j
    mask = cols < N
    if GROUP < CHUNK:
        mask = mask & (j < GROUP)
    return chunk, cols, mask, chunk < num_groups


@triton.jit
def _load_inputs(
    x_ptr, residual_ptr, row, cols, mask, stride_xm, stride_xn, stride_rm, stride_rn,
    HAS_RESIDUAL: tl.constexpr,
):
    """The raw x and residual tiles (x twice without a residual), in their own dtype."""
    x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=mask, other=0.0)
    r = x
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_rm + cols * stride_rn, mask=mask, other=0.0)
    return x, r


@triton.jit
def _residual_sum(
    x, r, h_ptr, row, cols, mask, stride_hm,
    X_DTYPE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, STORE_H: tl.constexpr,
    EXACT_CASTS: tl.constexpr,
):
    """h = x (+ residual) in fp32, rounded to x's dtype; stores h if asked."""
    h = _to_f32(x, EXACT_CASTS)
    if HAS_RESIDUAL:
        h = _round_to(h + _to_f32(r, EXACT_CASTS), X_DTYPE, EXACT_CASTS)
        if STORE_H:
            _store_as(h_ptr + row * stride_hm + cols, h, mask, EXACT_CASTS)
    return h


@triton.jit
def _load_h(
    x_ptr, residual_ptr, h_ptr, row, cols, mask,
    stride_xm, stride_xn, stride_rm, stride_rn, stride_hm,
    X_DTYPE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, STORE_H: tl.constexpr,
    EXACT_CASTS: tl.constexpr,
):
    x, r = _load_inputs(
        x_ptr, residual_ptr, row, cols, mask, stride_xm, stride_xn, stride_rm, stride_rn,
        HAS_RESIDUAL,
    )
    return _residual_sum(
        x, r, h_ptr, row, cols, mask, stride_hm, X_DTYPE, HAS_RESIDUAL, STORE_H, EXACT_CASTS
    )


@triton.jit
def _inv_rms(sum_sq, n_f32, eps, CONST_DIV_AS_MUL: tl.constexpr):
    # 1 / sqrt(mean + eps) in correctly rounded steps: torch's CPU rsqrt is 1 / sqrt. The mean
    # is sum / N on CPU, sum · fp32(1 / N) on CUDA/ROCm (torch's mean kernel and Inductor's).
    if CONST_DIV_AS_MUL:
        mean = sum_sq * tl.math.div_rn(1.0, n_f32)
    else:
        mean = tl.math.div_rn(sum_sq, n_f32)
    return tl.math.div_rn(1.0, tl.sqrt_rn(mean + eps))


@triton.jit
def _normalize(
    h, w, inv, X_DTYPE: tl.constexpr, NORM_DTYPE: tl.constexpr,
    ROUND_BEFORE_WEIGHT: tl.constexpr, EXACT_CASTS: tl.constexpr,
):
    normed = h * inv
    if ROUND_BEFORE_WEIGHT:
        normed = _round_to(normed, X_DTYPE, EXACT_CASTS)
    return _round_to(normed * w, NORM_DTYPE, EXACT_CASTS)


@triton.jit
def _load_weight(
    weight_ptr, cols, mask, stride_w, weight_offset, HAS_WEIGHT_OFFSET: tl.constexpr,
    EXACT_CASTS: tl.constexpr,
):
    w = _load_f32(weight_ptr + cols * stride_w, mask, EXACT_CASTS)
    if HAS_WEIGHT_OFFSET:
        w = w + weight_offset  # only when nonzero: adding 0.0 would turn -0.0 weights into +0.0
    return w


@triton.jit
def _load_y(
    x_ptr, residual_ptr, weight_ptr, h_ptr, row, cols, mask, inv, weight_offset,
    stride_xm, stride_xn, stride_rm, stride_rn, stride_w, stride_hm,
    X_DTYPE: tl.constexpr, NORM_DTYPE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT_OFFSET: tl.constexpr, ROUND_BEFORE_WEIGHT: tl.constexpr,
    EXACT_CASTS: tl.constexpr, HAS_NORM: tl.constexpr,
):
    """A later pass's y tile: h recomputed from x (+ residual), normed with the row's inv
    (without HAS_NORM, fp32(x) itself)."""
    h = _load_h(
        x_ptr, residual_ptr, h_ptr, row, cols, mask,
        stride_xm, stride_xn, stride_rm, stride_rn, stride_hm,
        X_DTYPE, HAS_RESIDUAL, False, EXACT_CASTS,
    )
    y = h
    if HAS_NORM:
        w = _load_weight(
            weight_ptr, cols, mask, stride_w, weight_offset, HAS_WEIGHT_OFFSET, EXACT_CASTS
        )
        y = _normalize(h, w, inv, X_DTYPE, NORM_DTYPE, ROUND_BEFORE_WEIGHT, EXACT_CASTS)
    return y


@triton.jit
def _store_outputs(
    y, row, chunk, cols, mask, chunk_ok,
    y_ptr, q_ptr, scale_ptr, stride_ym, stride_qm, stride_sm, stride_sg, row_scale, quant_eps,
    WRITE_NORM: tl.constexpr, QUANT: tl.constexpr, FP8_MAX: tl.constexpr, FP8_FNUZ: tl.constexpr,
    FP8_NATIVE: tl.constexpr, EPS_ON_SCALE: tl.constexpr, APPLY_RECIPROCAL: tl.constexpr,
    MX_ROUNDING: tl.constexpr, EXACT_CASTS: tl.constexpr, CONST_DIV_AS_MUL: tl.constexpr,
):
    """Write one tile's normed output and its quantized bytes / per-group scales."""
    if WRITE_NORM:
        _store_as(y_ptr + row * stride_ym + cols, y, mask, EXACT_CASTS)
    if QUANT == QUANT_FP8_ROW:
        q = _fp8_quant(
            y, row_scale, FP8_MAX, FP8_FNUZ, FP8_NATIVE, APPLY_RECIPROCAL, EXACT_CASTS
        )
        tl.store(q_ptr + row * stride_qm + cols, q, mask=mask)
    elif QUANT == QUANT_FP8_GROUP:
        scale = _fp8_scale(
            _chunk_max(tl.abs(y)), quant_eps, FP8_MAX, EPS_ON_SCALE, CONST_DIV_AS_MUL
        )
        q = _fp8_quant(
            y, scale[:, None, None], FP8_MAX, FP8_FNUZ, FP8_NATIVE, APPLY_RECIPROCAL, EXACT_CASTS
        )
        tl.store(q_ptr + row * stride_qm + cols, q, mask=mask)
        tl.store(scale_ptr + row * stride_sm + chunk * stride_sg, scale, mask=chunk_ok)
    elif QUANT == QUANT_MXFP4:
        packed, scale = _mxfp4_quant(y, MX_ROUNDING)
        # Byte b of chunk c holds columns 2b, 2b + 1 of its block: c·16 + (column offset) / 2.
        half: tl.constexpr = y.shape[2] // 2
        byte_cols = (
            chunk[:, None, None] * 16
            + tl.arange(0, y.shape[1])[None, :, None] * half
            + tl.arange(0, half)[None, None, :]
        )
        tl.store(q_ptr + row * stride_qm + byte_cols, packed, mask=chunk_ok[:, None, None])
        tl.store(scale_ptr + row * stride_sm + chunk * stride_sg, scale, mask=chunk_ok)


# ---------------------------------------------------------------------------------------------
# kernel


# M varies per call: specializing on it (M == 1, M % 16) would only multiply compiles.
@triton.jit(do_not_specialize=["M"])
def _rms_norm_quant_kernel(
    # pointers
    x_ptr, residual_ptr, weight_ptr, h_ptr, y_ptr, q_ptr, scale_ptr,
    # sizes and scalars
    M, N, eps, weight_offset, quant_eps,
    # strides, in elements of each tensor's own dtype (q: bytes)
    stride_xm, stride_xn, stride_rm, stride_rn, stride_w, stride_hm, stride_ym, stride_qm,
    stride_sm, stride_sg,
    # dtypes and switches
    X_DTYPE: tl.constexpr, NORM_DTYPE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT_OFFSET: tl.constexpr, ROUND_BEFORE_WEIGHT: tl.constexpr, WRITE_NORM: tl.constexpr,
    QUANT: tl.constexpr, FP8_MAX: tl.constexpr, FP8_FNUZ: tl.constexpr, FP8_NATIVE: tl.constexpr,
    EPS_ON_SCALE: tl.constexpr, APPLY_RECIPROCAL: tl.constexpr, MX_ROUNDING: tl.constexpr,
    EXACT_CASTS: tl.constexpr, CONST_DIV_AS_MUL: tl.constexpr,
    # meta-parameters
    GROUP: tl.constexpr, CHUNK: tl.constexpr, VEC: tl.constexpr, TILE_CHUNKS: tl.constexpr,
    NUM_TILES: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr,
    # quant only (False): y = fp32(x); weight, eps, residual and h unused. Last, with a default,
    # so that the one-shot all-reduce kernel's calls need not name it.
    HAS_NORM: tl.constexpr = True,
):
    pid = tl.program_id(0)
    num_groups = tl.cdiv(N, GROUP)
    n_f32 = tl.cast(N, tl.float32)

    if NUM_TILES == 1:
        # The whole row is one register tile; the weight is loaded once for all rows.
        chunk, cols, col_mask, chunk_exists = _tile_columns(
            0, N, num_groups, GROUP, CHUNK, VEC, TILE_CHUNKS
        )
        if HAS_NORM:
            w = _load_weight(
                weight_ptr, cols, col_mask, stride_w, weight_offset, HAS_WEIGHT_OFFSET,
                EXACT_CASTS,
            )
        first = pid * ROWS_PER_PROGRAM
        x_next, r_next = _load_inputs(
            x_ptr, residual_ptr, first.to(tl.int64), cols, col_mask & (first < M),
            stride_xm, stride_xn, stride_rm, stride_rn, HAS_RESIDUAL,
        )

    for i in tl.static_range(ROWS_PER_PROGRAM):
        row_i32 = pid * ROWS_PER_PROGRAM + i
        row_ok = row_i32 < M
        row = row_i32.to(tl.int64)
        if NUM_TILES == 1:
            mask = col_mask & row_ok
            # Issue the next row's loads before this row's math: they overlap it.
            x_cur, r_cur = x_next, r_next
            if i + 1 < ROWS_PER_PROGRAM:
                x_next, r_next = _load_inputs(
                    x_ptr, residual_ptr, row + 1, cols, col_mask & (row_i32 + 1 < M),
                    stride_xm, stride_xn, stride_rm, stride_rn, HAS_RESIDUAL,
                )
            h = _residual_sum(
                x_cur, r_cur, h_ptr, row, cols, mask, stride_hm,
                X_DTYPE, HAS_RESIDUAL, True, EXACT_CASTS,
            )
            y = h
            if HAS_NORM:
                inv = _inv_rms(_tile_sum(h * h), n_f32, eps, CONST_DIV_AS_MUL)
                y = _normalize(h, w, inv, X_DTYPE, NORM_DTYPE, ROUND_BEFORE_WEIGHT, EXACT_CASTS)
            row_scale = 0.0
            if QUANT == QUANT_FP8_ROW:
                # Per-token scale: the row amax after the norm, from the registers.
                row_scale = _fp8_scale(
                    tl.max(_chunk_max(tl.abs(y)), axis=0), quant_eps, FP8_MAX, EPS_ON_SCALE,
                    CONST_DIV_AS_MUL,
                )
                tl.store(scale_ptr + row * stride_sm, row_scale, mask=row_ok)
            _store_outputs(
                y, row, chunk, cols, mask, chunk_exists & row_ok,
                y_ptr, q_ptr, scale_ptr, stride_ym, stride_qm, stride_sm, stride_sg,
                row_scale, quant_eps,
                WRITE_NORM, QUANT, FP8_MAX, FP8_FNUZ, FP8_NATIVE, EPS_ON_SCALE,
                APPLY_RECIPROCAL, MX_ROUNDING, EXACT_CASTS, CONST_DIV_AS_MUL,
            )
        else:
            # Wide rows: pass 1 sums squares (and stores h); later passes recompute h, which is
            # bit-identical and needs no barrier between this program's stores and loads.
            inv = 0.0
            if HAS_NORM:
                sum_sq = tl.zeros((TILE_CHUNKS, CHUNK // VEC, VEC), tl.float32)
                for t in range(NUM_TILES):
                    _, cols, mask, _ = _tile_columns(
                        t, N, num_groups, GROUP, CHUNK, VEC, TILE_CHUNKS
                    )
                    h = _load_h(
                        x_ptr, residual_ptr, h_ptr, row, cols, mask & row_ok,
                        stride_xm, stride_xn, stride_rm, stride_rn, stride_hm,
                        X_DTYPE, HAS_RESIDUAL, True, EXACT_CASTS,
                    )
                    sum_sq += h * h
                inv = _inv_rms(_tile_sum(sum_sq), n_f32, eps, CONST_DIV_AS_MUL)
            row_scale = 0.0
            if QUANT == QUANT_FP8_ROW:
                amax = tl.zeros((TILE_CHUNKS, CHUNK // VEC, VEC), tl.float32)
                for t in range(NUM_TILES):
                    _, cols, mask, _ = _tile_columns(
                        t, N, num_groups, GROUP, CHUNK, VEC, TILE_CHUNKS
                    )
                    mask = mask & row_ok
                    y = _load_y(
                        x_ptr, residual_ptr, weight_ptr, h_ptr, row, cols, mask, inv,
                        weight_offset, stride_xm, stride_xn, stride_rm, stride_rn, stride_w,
                        stride_hm, X_DTYPE, NORM_DTYPE, HAS_RESIDUAL, HAS_WEIGHT_OFFSET,
                        ROUND_BEFORE_WEIGHT, EXACT_CASTS, HAS_NORM,
                    )
                    amax = tl.maximum(amax, tl.abs(y))
                row_scale = _fp8_scale(
                    tl.max(_chunk_max(amax), axis=0), quant_eps, FP8_MAX, EPS_ON_SCALE,
                    CONST_DIV_AS_MUL,
                )
                tl.store(scale_ptr + row * stride_sm, row_scale, mask=row_ok)
            for t in range(NUM_TILES):
                chunk, cols, mask, chunk_exists = _tile_columns(
                    t, N, num_groups, GROUP, CHUNK, VEC, TILE_CHUNKS
                )
                mask = mask & row_ok
                y = _load_y(
                    x_ptr, residual_ptr, weight_ptr, h_ptr, row, cols, mask, inv,
                    weight_offset, stride_xm, stride_xn, stride_rm, stride_rn, stride_w,
                    stride_hm, X_DTYPE, NORM_DTYPE, HAS_RESIDUAL, HAS_WEIGHT_OFFSET,
                    ROUND_BEFORE_WEIGHT, EXACT_CASTS, HAS_NORM,
                )
                _store_outputs(
                    y, row, chunk, cols, mask, chunk_exists & row_ok,
                    y_ptr, q_ptr, scale_ptr, stride_ym, stride_qm, stride_sm, stride_sg,
                    row_scale, quant_eps,
                    WRITE_NORM, QUANT, FP8_MAX, FP8_FNUZ, FP8_NATIVE, EPS_ON_SCALE,
                    APPLY_RECIPROCAL, MX_ROUNDING, EXACT_CASTS, CONST_DIV_AS_MUL,
                )


# One row in one (NG, G) register tile: G = the quant group (the whole padded row when there is
# no group), NG groups. Plain 2-D tiles reach ~95 % of the H200's copy roofline at N = 7168 where
# the chunked 3-D tiles above reached ~40 % (benchmarks/experiments/rms_fp8_probe.py); the chunked
# kernel remains for rows wider than BLOCK_N_MAX.
@triton.jit(do_not_specialize=["M"])
def _rms_norm_quant_rows_kernel(
    x_ptr, residual_ptr, weight_ptr, h_ptr, y_ptr, q_ptr, scale_ptr,
    M, N, eps, weight_offset, quant_eps,
    stride_xm, stride_xn, stride_rm, stride_rn, stride_w, stride_hm, stride_ym, stride_qm,
    stride_sm, stride_sg,
    X_DTYPE: tl.constexpr, NORM_DTYPE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT_OFFSET: tl.constexpr, ROUND_BEFORE_WEIGHT: tl.constexpr, WRITE_NORM: tl.constexpr,
    QUANT: tl.constexpr, FP8_MAX: tl.constexpr, FP8_FNUZ: tl.constexpr, FP8_NATIVE: tl.constexpr,
    EPS_ON_SCALE: tl.constexpr, APPLY_RECIPROCAL: tl.constexpr, MX_ROUNDING: tl.constexpr,
    EXACT_CASTS: tl.constexpr, CONST_DIV_AS_MUL: tl.constexpr,
    NG: tl.constexpr, G: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr,
    HAS_NORM: tl.constexpr = True,  # as in _rms_norm_quant_kernel
):
    pid = tl.program_id(0)
    groups = tl.arange(0, NG)
    cols = groups[:, None] * G + tl.arange(0, G)[None, :]
    col_mask = cols < N
    group_ok = groups * G < N
    if HAS_NORM:
        w = _load_weight(
            weight_ptr, cols, col_mask, stride_w, weight_offset, HAS_WEIGHT_OFFSET, EXACT_CASTS
        )
    n_f32 = tl.cast(N, tl.float32)
    for i in tl.static_range(ROWS_PER_PROGRAM):
        row_i32 = pid * ROWS_PER_PROGRAM + i
        row_ok = row_i32 < M
        row = row_i32.to(tl.int64)
        mask = col_mask & row_ok
        x, r = _load_inputs(
            x_ptr, residual_ptr, row, cols, mask, stride_xm, stride_xn, stride_rm, stride_rn,
            HAS_RESIDUAL,
        )
        h = _residual_sum(
            x, r, h_ptr, row, cols, mask, stride_hm, X_DTYPE, HAS_RESIDUAL, True, EXACT_CASTS
        )
        y = h
        if HAS_NORM:
            inv = _inv_rms(tl.sum(tl.sum(h * h, axis=1), axis=0), n_f32, eps, CONST_DIV_AS_MUL)
            y = _normalize(h, w, inv, X_DTYPE, NORM_DTYPE, ROUND_BEFORE_WEIGHT, EXACT_CASTS)
        if WRITE_NORM:
            _store_as(y_ptr + row * stride_ym + cols, y, mask, EXACT_CASTS)
        if QUANT == QUANT_FP8_ROW:
            scale = _fp8_scale(
                tl.max(tl.max(tl.abs(y), axis=1), axis=0), quant_eps, FP8_MAX, EPS_ON_SCALE,
                CONST_DIV_AS_MUL,
            )
            tl.store(scale_ptr + row * stride_sm, scale, mask=row_ok)
            q = _fp8_quant(y, scale, FP8_MAX, FP8_FNUZ, FP8_NATIVE, APPLY_RECIPROCAL, EXACT_CASTS)
            tl.store(q_ptr + row * stride_qm + cols, q, mask=mask)
        elif QUANT == QUANT_FP8_GROUP:
            scale = _fp8_scale(
                tl.max(tl.abs(y), axis=1), quant_eps, FP8_MAX, EPS_ON_SCALE, CONST_DIV_AS_MUL
            )
            q = _fp8_quant(
                y, scale[:, None], FP8_MAX, FP8_FNUZ, FP8_NATIVE, APPLY_RECIPROCAL, EXACT_CASTS
            )
            tl.store(q_ptr + row * stride_qm + cols, q, mask=mask)
            tl.store(scale_ptr + row * stride_sm + groups * stride_sg, scale, mask=group_ok & row_ok)
        elif QUANT == QUANT_MXFP4:
            exponent = _e8m0_exponent(tl.max(tl.abs(y), axis=1), MX_ROUNDING)
            codes = _e2m1_code(y * _e8m0_factor(exponent)[:, None])
            even, odd = tl.split(tl.reshape(codes, (NG, G // 2, 2)))
            byte_cols = groups[:, None] * (G // 2) + tl.arange(0, G // 2)[None, :]
            tl.store(
                q_ptr + row * stride_qm + byte_cols, (even | (odd << 4)).to(tl.uint8),
                mask=group_ok[:, None] & row_ok,
            )
            tl.store(
                scale_ptr + row * stride_sm + groups * stride_sg, (exponent + 127).to(tl.uint8),
                mask=group_ok & row_ok,
            )


# fmt: on
# ---------------------------------------------------------------------------------------------
# launcher

KERNEL_NAME = "rms_norm_quant"
CONFIG_FIELDS = ("BLOCK_N_MAX", "ROWS_PER_PROGRAM", "num_warps")
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
QUANT_KINDS = ("fp8", "mxfp4")
# Per-row FP8 and norm-only rows have no group structure: any power-of-2 chunk works.
ROW_CHUNK = 128
_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def _check_rows(x):
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x: expected a 2-D (M, N) tensor, got {getattr(x, 'shape', type(x))}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"x: dtype must be one of {FLOAT_DTYPES}, got {x.dtype}")
    if x.device.type == "cpu" and not interpreting():
        raise ValueError("x: a CPU tensor needs Triton's interpreter (TRITON_INTERPRET=1)")


def _check_inputs(x, weight, residual, norm_dtype):
    _check_rows(x)
    n = x.shape[1]
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (n,):
        raise ValueError(
            f"weight: expected shape ({n},), got {tuple(getattr(weight, 'shape', ()))}"
        )
    if weight.dtype not in FLOAT_DTYPES or weight.device != x.device:
        raise ValueError(
            f"weight: expected a float tensor on {x.device}, got {weight.dtype} on {weight.device}"
        )
    if residual is not None and (
        not isinstance(residual, torch.Tensor)
        or residual.shape != x.shape
        or residual.dtype != x.dtype
        or residual.device != x.device
    ):
        raise ValueError(
            f"residual: expected {tuple(x.shape)} {x.dtype} on {x.device} like x, got "
            f"{tuple(getattr(residual, 'shape', ()))} {getattr(residual, 'dtype', None)}"
        )
    if norm_dtype is not None and norm_dtype not in FLOAT_DTYPES:
        raise ValueError(f"norm_dtype: expected None or one of {FLOAT_DTYPES}, got {norm_dtype}")


def _launch_config(target: str | None, device: torch.device, m: int, n: int, config) -> dict:
    target = detect_target(device) if target is None else target
    if target not in TARGETS:
        raise ValueError(f"target: unknown {target!r}; expected one of {TARGETS}")
    resolved = launch_tables.lookup(KERNEL_NAME, target, m=m, n=n)
    if config:
        unknown = sorted(set(config) - set(CONFIG_FIELDS))
        if unknown:
            raise ValueError(
                f"config: unknown keys {unknown}; expected a subset of {CONFIG_FIELDS}"
            )
        resolved.update(config)
    block, rows, warps = (resolved[k] for k in CONFIG_FIELDS)
    if not isinstance(block, int) or block < 16 or block & (block - 1):
        raise ValueError(f"config: BLOCK_N_MAX must be a power of 2 >= 16, got {block!r}")
    if not isinstance(rows, int) or rows < 1:
        raise ValueError(f"config: ROWS_PER_PROGRAM must be a positive int, got {rows!r}")
    if warps not in launch_tables.NUM_WARPS:
        raise ValueError(
            f"config: num_warps must be one of {launch_tables.NUM_WARPS}, got {warps!r}"
        )
    return resolved


def _fp8_native(fp8_dtype: torch.dtype, device: torch.device) -> bool:
    """Whether Triton's own round-to-nearest-even fp32 → e4m3 convert is used (else: software).

    Only OCP e4m3fn on sm_89+ and gfx950. e4m3fnuz takes the integer encoder everywhere: Triton
    has no e4m3fnuz type on NVIDIA, and on gfx942 (triton 3.6) its RTNE lowering asserts for
    these tiles.
    """
    if interpreting() or device.type != "cuda" or fp8_dtype != torch.float8_e4m3fn:
        return False
    if torch.version.hip:
        return torch.cuda.get_device_properties(device).gcnArchName.split(":")[0] == "gfx950"
    return torch.cuda.get_device_capability(device) >= (8, 9)


def _launch(
    x,
    weight,
    eps,
    residual,
    h,
    y,
    q,
    scale,
    *,
    weight_offset,
    round_before_weight,
    norm_dtype,
    quant_kind,
    group,
    chunk,
    fp8_dtype,
    quant_eps,
    eps_on_scale,
    apply_reciprocal,
    rounding,
    config,
    target,
):
    m, n = x.shape
    cfg = _launch_config(target, x.device, m, n, config)
    rows = cfg["ROWS_PER_PROGRAM"]
    # Unused pointers get x: the kernel's constexpr switches never touch them. No weight: quant
    # only (HAS_NORM off).
    weight_t = x if weight is None else weight
    residual_t = x if residual is None else residual
    y_t = x if y is None else y
    q_t = x if q is None else q.view(torch.uint8)
    scale_t = x if scale is None else scale
    scale_strides = (0, 0) if scale is None else scale.stride()
    grouped = quant_kind.value in (QUANT_FP8_GROUP.value, QUANT_MXFP4.value)
    g = group if grouped else triton.next_power_of_2(n)
    ng = triton.next_power_of_2(triton.cdiv(n, g))
    if g & (g - 1) == 0 and ng * g <= cfg["BLOCK_N_MAX"]:
        kernel, tiling = _rms_norm_quant_rows_kernel, {"NG": ng, "G": g}
    else:
        num_groups = triton.cdiv(n, group)
        tile_chunks = max(1, cfg["BLOCK_N_MAX"] // chunk)
        kernel, tiling = _rms_norm_quant_kernel, {
            "GROUP": group,
            "CHUNK": chunk,
            "VEC": min(chunk, 16 // x.element_size()),
            "TILE_CHUNKS": min(tile_chunks, triton.next_power_of_2(num_groups)),
            "NUM_TILES": triton.cdiv(num_groups, tile_chunks),
        }
    launch(kernel, (triton.cdiv(m, rows),),
        x,
        residual_t,
        weight_t,
        h,
        y_t,
        q_t,
        scale_t,
        m,
        n,
        float(eps),
        float(weight_offset),
        float(quant_eps),
        x.stride(0),
        x.stride(1),
        residual_t.stride(0),
        residual_t.stride(1),
        weight_t.stride(0),
        h.stride(0),
        y_t.stride(0),
        q_t.stride(0),
        scale_strides[0],
        scale_strides[1],
        X_DTYPE=_TL_DTYPES[x.dtype],
        NORM_DTYPE=_TL_DTYPES[norm_dtype],
        HAS_RESIDUAL=residual is not None,
        HAS_WEIGHT_OFFSET=weight_offset != 0,
        ROUND_BEFORE_WEIGHT=bool(round_before_weight),
        WRITE_NORM=y is not None,
        QUANT=quant_kind.value,
        FP8_MAX=formats.fp8_max(fp8_dtype),
        FP8_FNUZ=fp8_dtype == torch.float8_e4m3fnuz,
        FP8_NATIVE=_fp8_native(fp8_dtype, x.device),
        EPS_ON_SCALE=bool(eps_on_scale),
        APPLY_RECIPROCAL=bool(apply_reciprocal),
        MX_ROUNDING=formats.MXFP4_ROUNDINGS.index(rounding),
        EXACT_CASTS=interpreting(),
        CONST_DIV_AS_MUL=x.device.type != "cpu",
        **tiling,
        ROWS_PER_PROGRAM=rows,
        HAS_NORM=weight is not None,
        num_warps=cfg["num_warps"],
    )


@planned
def rms_norm_quant(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    weight_offset: float = 0.0,
    round_before_weight: bool = True,
    norm_dtype: torch.dtype | None = None,
    quant: str = "fp8",
    group_size: int = 0,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    quant_eps: float = 1e-10,
    eps_on_scale: bool = False,
    apply_reciprocal: bool = False,
    scale_col_major: bool = False,
    rounding: str = "even",
    write_norm: bool = False,
    config: dict | None = None,
    target: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """[residual add →] RMSNorm → FP8 / MXFP4 quant in one kernel (`rms_norm_quant_ref` exactly).

    Returns (q, scale, h, y): h is the residual sum (x itself, not a copy, without a residual);
    y the normed output in norm_dtype (default x.dtype) when write_norm, else None.
    """
    _check_inputs(x, weight, residual, norm_dtype)
    quant_kind, group, chunk, q, scale = _quant_outputs(
        x, quant, group_size, fp8_dtype, scale_col_major, rounding
    )
    m, n = x.shape
    norm_dtype = norm_dtype or x.dtype
    h = x if residual is None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    y = torch.empty((m, n), dtype=norm_dtype, device=x.device) if write_norm else None
    if m:
        _launch(
            x,
            weight,
            eps,
            residual,
            h,
            y,
            q,
            scale,
            weight_offset=weight_offset,
            round_before_weight=round_before_weight,
            norm_dtype=norm_dtype,
            quant_kind=quant_kind,
            group=group,
            chunk=chunk,
            fp8_dtype=fp8_dtype,
            quant_eps=quant_eps,
            eps_on_scale=eps_on_scale,
            apply_reciprocal=apply_reciprocal,
            rounding=rounding,
            config=config,
            target=target,
        )
    return q, scale, h, y


def _quant_outputs(x, quant, group_size, fp8_dtype, scale_col_major, rounding):
    """Validate the quant arguments; returns (quant kind, group, chunk, q, scale), q and scale
    allocated for (M, N) rows x."""
    if quant not in QUANT_KINDS:
        raise ValueError(f"quant: expected one of {QUANT_KINDS}, got {quant!r}")
    formats.check_rounding(rounding)
    if fp8_dtype not in formats.FP8_DTYPES:
        raise ValueError(f"fp8_dtype: expected one of {formats.FP8_DTYPES}, got {fp8_dtype}")
    m, n = x.shape
    if quant == "mxfp4":
        if n % formats.MXFP4_BLOCK:
            raise ValueError(f"x: last dim must be a multiple of 32 for MXFP4, got {n}")
        quant_kind, group = QUANT_MXFP4, formats.MXFP4_BLOCK
        q = torch.empty((m, n // 2), dtype=torch.uint8, device=x.device)
        # scale_col_major applies to FP8 group scales only, as in the reference.
        scale = torch.empty((m, n // group), dtype=torch.uint8, device=x.device)
        chunk = group
    else:
        if not isinstance(group_size, int) or group_size < 0 or (group_size and n % group_size):
            raise ValueError(f"group_size: expected 0 or a divisor of N={n}, got {group_size!r}")
        if group_size:
            quant_kind, group = QUANT_FP8_GROUP, group_size
            chunk = triton.next_power_of_2(group)
        else:
            quant_kind = QUANT_FP8_ROW
            group = chunk = min(ROW_CHUNK, triton.next_power_of_2(n))
        q = torch.empty((m, n), dtype=fp8_dtype, device=x.device)
        num_scales = n // group_size if group_size else 1
        # A per-row (M, 1) scale is the same buffer either way (the reference's strides too).
        if scale_col_major and group_size:
            scale = torch.empty((num_scales, m), dtype=torch.float32, device=x.device).t()
        else:
            scale = torch.empty((m, num_scales), dtype=torch.float32, device=x.device)
    return quant_kind, group, chunk, q, scale


@planned
def quant(
    x: torch.Tensor,
    *,
    quant: str = "fp8",
    group_size: int = 0,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    quant_eps: float = 1e-10,
    eps_on_scale: bool = False,
    apply_reciprocal: bool = False,
    scale_col_major: bool = False,
    rounding: str = "even",
    config: dict | None = None,
    target: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 / MXFP4 quant of (M, N) rows alone, the fused kernel without its norm: returns
    (q, scale), `quant_fp8_ref` / `quant_mxfp4_ref` of x exactly (quant_eps is their eps)."""
    _check_rows(x)
    if x.shape[1] == 0:
        raise ValueError("x: the last dim is empty")
    quant_kind, group, chunk, q, scale = _quant_outputs(
        x, quant, group_size, fp8_dtype, scale_col_major, rounding
    )
    if x.shape[0]:
        # The norm-quant launch table: quant-only rows move less (no weight, no h) and are
        # untimed there.
        _launch(
            x,
            None,
            0.0,
            None,
            x,
            None,
            q,
            scale,
            weight_offset=0.0,
            round_before_weight=True,
            norm_dtype=x.dtype,
            quant_kind=quant_kind,
            group=group,
            chunk=chunk,
            fp8_dtype=fp8_dtype,
            quant_eps=quant_eps,
            eps_on_scale=eps_on_scale,
            apply_reciprocal=apply_reciprocal,
            rounding=rounding,
            config=config,
            target=target,
        )
    return q, scale


@planned
def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    weight_offset: float = 0.0,
    round_before_weight: bool = True,
    norm_dtype: torch.dtype | None = None,
    config: dict | None = None,
    target: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[residual add →] RMSNorm alone (`rms_norm_ref` exactly): returns (y, h)."""
    _check_inputs(x, weight, residual, norm_dtype)
    m, n = x.shape
    norm_dtype = norm_dtype or x.dtype
    h = x if residual is None else torch.empty((m, n), dtype=x.dtype, device=x.device)
    y = torch.empty((m, n), dtype=norm_dtype, device=x.device)
    if m:
        chunk = min(ROW_CHUNK, triton.next_power_of_2(n))
        _launch(
            x,
            weight,
            eps,
            residual,
            h,
            y,
            None,
            None,
            weight_offset=weight_offset,
            round_before_weight=round_before_weight,
            norm_dtype=norm_dtype,
            quant_kind=QUANT_NONE,
            group=chunk,
            chunk=chunk,
            fp8_dtype=torch.float8_e4m3fn,
            quant_eps=0.0,
            eps_on_scale=False,
            apply_reciprocal=False,
            rounding="even",
            config=config,
            target=target,
        )
    return y, h
