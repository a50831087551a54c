"""Number formats shared by the kernels and their torch references (SPEC §2).

FP8: OCP e4m3fn (max 448) on gfx950 / sm90, e4m3fnuz (max 240) on gfx942.
MXFP4 (OCP MX v1.0): blocks of 32 along K, e2m1 elements packed two per byte (even element in the
low nibble), e8m0 scales (value 2^(s-127), 255 = NaN).

The e8m0 exponent is computed from the float's bits, never through `log2`, so that the torch
reference and the Triton kernels agree exactly (fp32 `log2` rounds to an integer just above powers
of two, which would move `ceil` by one).
"""

from __future__ import annotations

import torch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
MXFP4_BLOCK = 32
MXFP4_ROUNDINGS = ("floor", "even", "ceil")


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of an FP8 dtype (448 for e4m3fn, 240 for e4m3fnuz)."""
    if dtype not in FP8_DTYPES:
        raise ValueError(f"dtype: expected one of {FP8_DTYPES}, got {dtype}")
    return float(torch.finfo(dtype).max)


def check_rounding(rounding: str) -> None:
    if rounding not in MXFP4_ROUNDINGS:
        raise ValueError(f"rounding: expected one of {MXFP4_ROUNDINGS}, got {rounding!r}")


def e8m0_exponent_ref(amax: torch.Tensor, rounding: str) -> torch.Tensor:
    """Unbiased shared exponent e (int32, clamped to [-127, 127]) of each block's fp32 amax."""
    check_rounding(rounding)
    bits = amax.float().contiguous().view(torch.int32)
    if rounding == "even":
        # AITER: round the amax's mantissa at bit 21 before taking floor(log2).
        bits = (bits + 0x200000) & -0x800000  # 0xFF800000 as a signed int32
    if rounding in ("floor", "even"):
        # floor(log2(amax)) - 2 from the exponent field; subnormals and zero clamp to -127.
        exponent = ((bits >> 23) & 0xFF) - 127 - 2
    else:
        # ceil(log2(amax / 6)) exactly: floor, plus one unless the quotient is a power of two.
        # A tensor divisor: a correctly rounded division on every device (CUDA turns a
        # division by a Python number into a multiply by its reciprocal).
        amax = amax.float()
        quotient_bits = (amax / torch.full_like(amax, 6.0)).contiguous().view(torch.int32)
        exponent = ((quotient_bits >> 23) & 0xFF) - 127
        exponent = exponent + ((quotient_bits & 0x7FFFFF) != 0).to(torch.int32)
        exponent = torch.where((quotient_bits & 0x7F800000) == 0, -127, exponent)
    return exponent.clamp(-127, 127).to(torch.int32)


def e2m1_code_ref(v: torch.Tensor) -> torch.Tensor:
    """Round fp32 values (already scaled) to the e2m1 grid, nearest-even, saturating at ±6.

    Returns the 4-bit code (int32): magnitude index 0..7, bit 3 the sign.
    """
    mag = v.abs()
    # Midpoints between grid values; at a tie the even code (mantissa bit 0) wins: `<=` where the
    # lower code is even, `<` where the upper one is.
    code = torch.zeros_like(mag, dtype=torch.int32)
    code = torch.where(mag > 0.25, 1, code)
    code = torch.where(mag >= 0.75, 2, code)
    code = torch.where(mag > 1.25, 3, code)
    code = torch.where(mag >= 1.75, 4, code)
    code = torch.where(mag > 2.5, 5, code)
    code = torch.where(mag >= 3.5, 6, code)
    code = torch.where(mag > 5.0, 7, code)
    sign = (v < 0).to(torch.int32) << 3
    return code | sign


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """fp32 values of 4-bit e2m1 codes (int tensor)."""
    # From the bits, with no table: a host-built table cannot be made during CUDA graph capture.
    exponent = ((codes >> 1) & 3).to(torch.float32)
    mantissa = (codes & 1).to(torch.float32)
    mag = torch.where(exponent == 0, 0.5 * mantissa, torch.exp2(exponent - 1) * (1 + 0.5 * mantissa))
    return torch.where((codes & 8) != 0, -mag, mag)


def unpack_mxfp4(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Dequantize packed MXFP4 (M, K/2) uint8 with e8m0 scales (M, K/32) to fp32 (M, K)."""
    lo = (q & 0xF).to(torch.int32)
    hi = (q >> 4).to(torch.int32)
    codes = torch.stack([lo, hi], dim=-1).reshape(*q.shape[:-1], q.shape[-1] * 2)
    values = e2m1_decode(codes)
    exp = scale.to(torch.int32) - 127
    factors = torch.pow(2.0, exp.float()).repeat_interleave(MXFP4_BLOCK, dim=-1)
    factors = torch.where(scale.repeat_interleave(MXFP4_BLOCK, dim=-1) == 255, float("nan"), factors)
    return values * factors
