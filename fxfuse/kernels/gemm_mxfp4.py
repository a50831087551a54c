"""MXFP4 GEMMs: AFP4WFP4 (`gemm_mxfp4`) and the prequant A16WFP4 (`gemm_a16wfp4`).

Math (exactly `gemm_ref.gemm_mxfp4_ref` up to fp32 summation order):
    out[m, n] = Σ_k e2m1(q[m, k]) · 2^(xs[m, k/32] − 127) · e2m1(w[n, k]) · 2^(ws[n, k/32] − 127)
A16WFP4: each program quantizes its activation tile in registers by the rule of
`rms_norm_quant_ref.quant_mxfp4_ref` (e8m0 exponent from the amax bits, floor / even / ceil;
elements nearest-even on the e2m1 grid), bit for bit, once per K-tile, then does the above.

Layouts (SPEC §2): q (M, K/2), w (N, K/2) uint8, byte = code[2i] | code[2i+1] << 4; x_scale
(M, K/32), w_scale (N, K/32) e8m0 uint8 (255 = NaN); any strides. With preshuffled=True, w is
`preshuffle_weight_fp4(w)` (N/16, K/2·16) and w_scale `preshuffle_scale_e8m0(w_scale)`; the kernel
reads them in place through the inverse index maps (gfx950's layouts; identical results).
`gemm_mxfp4_split_cat` / `gemm_mxfp4_split` write the pieces of split(out.view(M, d, ·)) through
gemm_split_cat's epilogue instead of out (M, N).

Two inner products, chosen by the constexpr USE_DOT_SCALED:
- `tl.dot_scaled(…, "e2m1", …)`: the scaled MFMA on gfx950; Triton emulates it elsewhere.
- dequant (sm90, gfx942, the interpreter): e2m1 × e8m0 decoded exactly to bf16 (2 significant
  bits; the interpreter, whose bf16 dot is broken in triton 3.6, uses fp32), bf16 tl.dot with fp32
  accumulation.

Dequant without interleaving. A packed (rows, BLOCK_K/2) byte tile holds the even-k elements in its
low nibbles and the odd-k ones in its high nibbles. Each is decoded into its own (rows, BLOCK_K/2)
tile, and the K-tile's product is the sum of two dots, low nibbles against the even activation
columns and high nibbles against the odd ones: the same exact products as one dot over the
interleaved K, summed in another order. The byte tile thus feeds the MMA operand layout element
for element (no join / reshape of the decoded values, no layout shuffle of bf16 data); the
activation, BLOCK_M/BLOCK_N the size of the weight tile, is the one split into even / odd columns.

Decode (per weight element; the weight tile is what the program mostly does):
- DECODE_PTX (CUDA): inline PTX turns packed bytes into bf16 values with byte permutes (`prmt`)
  used as 8-entry lookup tables: the low and the high byte of bf16(|e2m1|) and the sign byte, then
  two permutes interleave them into the bf16x2 registers the MMA takes; no select, no float op.
  DECODE_PTX is the bytes per call: 2 (a 16-bit register → 4 values, 10 integer instructions) or
  4 (a 32-bit register → 8 values, 17). The MMA operand layout gives each thread its bytes in
  pairs (16-bit shared-memory loads), so 4-byte calls first gather two pairs into a register
  (~5 byte permutes per 4 bytes in the sm90 SASS compiled here). AFP4WFP4, which decodes both
  operands, takes 2 (skinny M on an H100, benchmarks/experiments/skinny_split.py, old code →
  this: 1-7 % faster with the masked split-K partials, 19 % at 24576x1536 M = 1, which has no
  split); A16WFP4 keeps 4 (with 2, two of its table's tiles were 5-14 % slower: 24576x1536
  M = 1, 7168x2048 M = 32). The launcher enables the decode only where each thread holds a
  multiple of that many bytes of every decoded tile. The e8m0 factor 2^(s−127) is then one
  packed bf16 multiply per 2 values (exact: a power of two times a 2-bit value; s = 0 is the bf16
  subnormal 2^−127, 255 NaN).
- otherwise (interpreter, ROCm): the 3 magnitude bits at fp32 bits 24..22 read as the e2m1 value
  times 2^−126 for every code (e = 0 lands on the fp32 subnormal 0.5·2^−126); one multiply by 2^126
  and one by the factor, in fp32 (a single multiply by 2^(s−1) would overflow for s ≥ 129).
A16WFP4 without WRITE_QUANT rounds the scaled activations to e2m1 values directly
(`_e2m1_round`: add-and-subtract 2^(22 + binade) rounds to 2 significant bits, nearest even),
never forming the 4-bit codes: the same values as decoding `_e2m1_code`'s codes.

Tiling: (BLOCK_M, BLOCK_N) output tiles, GROUP_M-swizzled; split-K and its deterministic reduce
as in gemm_fp8 (the same helpers). SWAP_AB (skinny M): the program computes the transposed tile
dot(decoded w (BLOCK_N, BLOCK_K/2), activationᵀ) so the weight rows fill the MMA's M slot (64 on
Hopper's wgmma, which takes this operand straight from registers) and the few tokens its N slot,
instead of padding a 16-row token tile up to the MMA's M and staging the decoded weights in
shared memory; the tile is transposed back before the epilogue.

Numerics: every product is exact and sums in fp32. Edge: a value 6 · 2^(s − 127) above the fp32
(bf16) range (s ≥ 254 with a 6) is inf here, finite in an fp64 reference; bf16 subnormals
(|v| < 2^-126) may flush on GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fxfuse.kernels import formats
from fxfuse.kernels._plans import launch, planned
from fxfuse.kernels.gemm_fp8 import (
    _cdiv,
    _split_cat_dtype,
    _split_k_reduce,
    _spread_offsets,
    _spread_rows,
    _store_tile,
    _tile_ids,
    launch_config,
    quant_rows,
    resolve_target,
    split_k_buffers,
    split_k_plan,
)
from fxfuse.kernels.gemm_ref import (
    _check_devices,
    _check_out_dtype,
    _check_tensor,
    _shape,
    check_gemm_mxfp4_args,
    preshuffled_shapes,
)
from fxfuse.kernels.gemm_split_cat import destinations, epilogue_args, split_epilogue
from fxfuse.kernels.rms_norm_quant import _e2m1_code, _e8m0_exponent, _e8m0_factor, _load_f32
from fxfuse.runtime.target import interpreting

# fmt: off
# (Kernel arguments stay grouped by role, as in the Triton tutorials.)

# `prmt d, a, b, c` picks each byte of d from the 8 bytes of {b, a} by a 3-bit index in c's
# nibbles, an 8-entry table lookup. The tables:
#   L = low bytes of bf16(0, .5, 1, 1.5, 2, 3, 4, 6): 00 00 80 C0 00 40 80 C0
#   H = their high bytes:                              00 3F 3F 3F 40 40 40 40
#   S = the sign byte of nibble bit 3 (0 or 1):         00 80
# Masking with 0x7777 puts the magnitudes of [lo e0, hi e0, lo e1, hi e1] in the 4 index nibbles;
# the last permutes pair each L byte with its H|S byte.
# Two bytes e0, e1 (the 16-bit $2) → bf16x2 of their low nibbles ($0) and of their high ones ($1).
E2M1_BF16_PTX2_TEXT = """
{
.reg .b32 r, m, s, l, h;
cvt.u32.u16 r, $2;
and.b32 m, r, 0x7777;
shr.u32 s, r, 3;
and.b32 s, s, 0x1111;
prmt.b32 l, 0xC0800000, 0xC0804000, m;
prmt.b32 h, 0x3F3F3F00, 0x40404040, m;
prmt.b32 s, 0x00008000, 0, s;
or.b32 h, h, s;
prmt.b32 $0, l, h, 0x6240;
prmt.b32 $1, l, h, 0x7351;
}
"""
# Four bytes e0..e3 ($4) → the low nibbles' bf16x2 ($0 = e0, e1; $1 = e2, e3) and the high ones'
# ($2, $3). One text, two forms of its three tables (low bytes, high bytes, sign), each read as
# `a` of two prmts:
# - E2M1_BF16_PTX4_TEXT, the shipped form: written in, through a register `lut` (known-good PTX
#   only ever has an immediate as `b` or `c`);
# - E2M1_BF16_PTX4_TABLES_TEXT: operands $5, $9, $13 (each a 32-bit input that the pack of 4
#   passes four times; only the first is read), loaded once per program from a device tensor,
#   so ptxas keeps them in registers for the whole K loop. Written in, they are copied from
#   uniform registers before every prmt: 84 of the 848 SASS in a 16x64x256 K-loop (sm90
#   compile). With operands the swapped 16x64x128 loop went 551 -> 461. Off until timed
#   (PTX_TABLE_OPERANDS).
_E2M1_BF16_PTX4 = """
{{
.reg .b32 m01, m23, s01, s23, l01, l23, h01, h23{lut};
and.b32 m01, $4, 0x77777777;
shr.u32 m23, m01, 16;
shr.u32 s01, $4, 3;
and.b32 s01, s01, 0x11111111;
shr.u32 s23, s01, 16;
{mov_low}prmt.b32 l01, {low}, 0xC0804000, m01;
prmt.b32 l23, {low}, 0xC0804000, m23;
{mov_high}prmt.b32 h01, {high}, 0x40404040, m01;
prmt.b32 h23, {high}, 0x40404040, m23;
{mov_sign}prmt.b32 s01, {sign}, 0, s01;
prmt.b32 s23, {sign}, 0, s23;
or.b32 h01, h01, s01;
or.b32 h23, h23, s23;
prmt.b32 $0, l01, h01, 0x6240;
prmt.b32 $1, l23, h23, 0x6240;
prmt.b32 $2, l01, h01, 0x7351;
prmt.b32 $3, l23, h23, 0x7351;
}}
"""
# The three table words (low bytes, high bytes, sign), as bit patterns.
_E2M1_BF16_TABLE_WORDS = (0xC0800000, 0x3F3F3F00, 0x00008000)
E2M1_BF16_PTX4_TEXT = _E2M1_BF16_PTX4.format(
    lut=", lut", low="lut", high="lut", sign="lut",
    **{f"mov_{part}": f"mov.b32 lut, 0x{word:08X};\n"
       for part, word in zip(("low", "high", "sign"), _E2M1_BF16_TABLE_WORDS)},
)  # fmt: skip
E2M1_BF16_PTX4_TABLES_TEXT = _E2M1_BF16_PTX4.format(
    lut="", low="$5", high="$9", sign="$13", mov_low="", mov_high="", mov_sign=""
)
# The table words in operand order, as the int32 tensor `_decode_tables` fills.
E2M1_BF16_PTX4_TABLES = tuple(w - 2**32 if w >= 2**31 else w for w in _E2M1_BF16_TABLE_WORDS)
# tests/kernels/test_gemm_mxfp4_kernel.py runs the strings in a Python model of the PTX.
# A kernel reads globals only as constexpr.
E2M1_BF16_PTX2 = tl.constexpr(E2M1_BF16_PTX2_TEXT)
E2M1_BF16_PTX4 = tl.constexpr(E2M1_BF16_PTX4_TEXT)
E2M1_BF16_PTX4T = tl.constexpr(E2M1_BF16_PTX4_TABLES_TEXT)


# ---------------------------------------------------------------------------------------------
# helpers


@triton.jit
def _e2m1_value(codes):
    """fp32 value of 4-bit e2m1 codes (int32), exactly.

    The 3 magnitude bits placed at fp32 bits 24..22 read as 2^(e−127)·(1 + m/2) (normal) or
    m·2^−127 (e = 0, subnormal): the e2m1 value times 2^−126, for every code.
    """
    bits = ((codes & 7) << 22) | ((codes & 8) << 28)
    return bits.to(tl.float32, bitcast=True) * (2.0 ** 126)


@triton.jit
def _e8m0_value(scale):
    """fp32 2^(s − 127) of e8m0 bytes (s = 0 is the subnormal 2^−127; 255 is NaN)."""
    s = scale.to(tl.int32)
    bits = tl.where(s == 0, 0x400000, s << 23)
    bits = tl.where(s == 255, 0x7FC00000, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _e8m0_bf16(scale):
    """bf16 2^(s − 127) of e8m0 bytes: bits s << 7 (s = 0: the subnormal 0x0040; 255: NaN)."""
    s = scale.to(tl.int32)
    bits = tl.where(s == 255, 0x7FC0, tl.maximum(s << 7, 0x40))
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _per_byte(block_values, ROWS: tl.constexpr, KB: tl.constexpr):
    """(ROWS, KB/16) per-block values → (ROWS, KB), one per packed byte (16 bytes a block)."""
    v = tl.broadcast_to(block_values[:, :, None], (ROWS, KB // 16, 16))
    return tl.reshape(v, (ROWS, KB))


@triton.jit
def _dequant_halves(packed, scale, ROWS: tl.constexpr, KB: tl.constexpr,
                    DOT_DTYPE: tl.constexpr, DECODE_PTX: tl.constexpr, tables=None):
    """(ROWS, KB) packed bytes, (ROWS, KB/16) e8m0 bytes → the values of the low nibbles (even k)
    and of the high nibbles (odd k), (ROWS, KB) each in DOT_DTYPE. tables: None, or the 4-byte
    decode's three table words (int32 scalars) for its operand form."""
    if DECODE_PTX:
        if DECODE_PTX == 2:
            lo, hi = tl.inline_asm_elementwise(
                E2M1_BF16_PTX2, "=r,=r,h", [packed], dtype=(tl.bfloat16, tl.bfloat16),
                is_pure=True, pack=2,
            )
        elif tables is not None:
            lo, hi = tl.inline_asm_elementwise(
                E2M1_BF16_PTX4T, "=r,=r,=r,=r,r" + ",r" * 12,
                [packed, tl.broadcast_to(tables[0], packed.shape),
                 tl.broadcast_to(tables[1], packed.shape),
                 tl.broadcast_to(tables[2], packed.shape)],
                dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4,
            )  # fmt: skip
        else:
            lo, hi = tl.inline_asm_elementwise(
                E2M1_BF16_PTX4, "=r,=r,=r,=r,r", [packed], dtype=(tl.bfloat16, tl.bfloat16),
                is_pure=True, pack=4,
            )
        factor = _per_byte(_e8m0_bf16(scale), ROWS, KB)
        return lo * factor, hi * factor
    else:
        b = packed.to(tl.int32)
        factor = _per_byte(_e8m0_value(scale), ROWS, KB)
        lo = _e2m1_value(b & 0xF) * factor
        hi = _e2m1_value(b >> 4) * factor
        return lo.to(DOT_DTYPE), hi.to(DOT_DTYPE)


@triton.jit
def _quant_tile(x, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, ROUNDING: tl.constexpr):
    """quant_mxfp4_ref of an fp32 (ROWS, BLOCK_K) tile: (codes (ROWS, BLOCK_K / 32, 32) int32,
    exponents (ROWS, BLOCK_K / 32) int32)."""
    blocks = tl.reshape(x, (ROWS, BLOCK_K // 32, 32))
    exponent = _e8m0_exponent(tl.max(tl.abs(blocks), axis=2), ROUNDING)
    codes = _e2m1_code(blocks * _e8m0_factor(exponent)[:, :, None])
    return codes, exponent


@triton.jit
def _e2m1_round(v):
    """fp32 v rounded to the e2m1 grid, nearest even, saturating at ±6: the value of
    `_e2m1_code(v)`'s code, sign included (NaN → +6, like the code), without forming the code.

    |v| ≤ 6 gains 2 significant bits, but no step finer than 0.5, by adding and removing
    2^(22 + max(binade, 0)) (the add rounds to nearest even)."""
    c = tl.maximum(tl.minimum(v, 6.0), -6.0)  # minimum first: NaN → 6, as in _e2m1_code
    mag = tl.abs(c)
    binade = tl.maximum(mag.to(tl.int32, bitcast=True) & 0x7F800000, 0x3F800000)
    magic = (binade + (22 << 23)).to(tl.float32, bitcast=True)
    r = (mag + magic) - magic
    return tl.where(c < 0, -r, r)


@triton.jit
def _quant_values(x, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, ROUNDING: tl.constexpr):
    """The dequantized values of quant_mxfp4_ref(x) for an fp32 (ROWS, BLOCK_K) tile: exactly
    e2m1(code) · 2^e of `_quant_tile`'s codes and exponents, fp32 (ROWS, BLOCK_K)."""
    blocks = tl.reshape(x, (ROWS, BLOCK_K // 32, 32))
    exponent = _e8m0_exponent(tl.max(tl.abs(blocks), axis=2), ROUNDING)
    v = _e2m1_round(blocks * _e8m0_factor(exponent)[:, :, None])
    return tl.reshape(v * _e8m0_value(exponent + 127)[:, :, None], (ROWS, BLOCK_K))


@triton.jit
def _pack_codes(codes, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    even, odd = tl.split(tl.reshape(codes, (ROWS, BLOCK_K // 2, 2)))
    return (even | (odd << 4)).to(tl.uint8)


@triton.jit
def _even_odd(values, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """fp32 (ROWS, BLOCK_K) → its even and odd columns, (ROWS, BLOCK_K/2) each in DOT_DTYPE."""
    even, odd = tl.split(tl.reshape(values, (ROWS, BLOCK_K // 2, 2)))
    return even.to(DOT_DTYPE), odd.to(DOT_DTYPE)


# ---------------------------------------------------------------------------------------------
# kernel


# M varies per call: specializing on it (M == 1, M % 16) would only multiply compiles.
@triton.jit(do_not_specialize=["M"])
def _gemm_mxfp4_kernel(
    # pointers
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, out_ptr, partial_ptr, lock_ptr, q_out_ptr,
    q_scale_out_ptr, table_ptr,
    # sizes
    M, N, K,
    # strides (a, w: bytes of the packed rows; preshuffled w / w_scale: rows of the shuffled views)
    stride_am, stride_ak, stride_asm, stride_ask, stride_wn, stride_wk, stride_wsn, stride_wsk,
    stride_om, stride_on, stride_qm, stride_qsm,
    # split epilogue (gemm_split_cat.epilogue_args; out_ptr is piece 0)
    p1_ptr, p2_ptr, p3_ptr, y_ptr, D, SW, W0, W1, W2, LD0, LD1, LD2, LD3, S3,
    stride_ym, stride_yd, stride_ys,
    # switches
    A_BF16: tl.constexpr, ROUNDING: tl.constexpr, USE_DOT_SCALED: tl.constexpr,
    PRESHUFFLED: tl.constexpr, WRITE_QUANT: tl.constexpr, DOT_DTYPE: tl.constexpr,
    DECODE_PTX: tl.constexpr, PTX_TABLES: tl.constexpr, EXACT_CASTS: tl.constexpr,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, SWAP_AB: tl.constexpr,
    QUANT_ROWS: tl.constexpr,
    NUM_PIECES: tl.constexpr, EPILOGUE_SUBTILES: tl.constexpr, Y_HEADS: tl.constexpr,
    BLOCK_S3: tl.constexpr, Y_COL_ITERS: tl.constexpr,
):
    pid_m, pid_n, tile_id = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    # A16WFP4 decode: QUANT_ROWS (< BLOCK_M) rows of x quantized, each repeated to fill the tile.
    SPREAD: tl.constexpr = BLOCK_M // QUANT_ROWS
    offs_m, offs_q = _spread_offsets(pid_m, M, BLOCK_M, QUANT_ROWS)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    rows_m = offs_m[:, None].to(tl.int64)
    rows_n = offs_n[:, None].to(tl.int64)
    mask_q = offs_q < M
    rows_q = offs_q[:, None].to(tl.int64)
    # Debug copies of the in-register quant come from the pid_n == 0 column. (A tensor, not a
    # scalar, in the masks: triton 3.9's interpreter rejects `tensor & scalar` masks.)
    write_q = tl.full((QUANT_ROWS,), 1, tl.int1) & (pid_n == 0)
    KB: tl.constexpr = BLOCK_K // 2
    KS: tl.constexpr = BLOCK_K // 32

    tables = None
    if PTX_TABLES:  # the weight decode's tables, in registers for the whole K loop
        tables = (tl.load(table_ptr), tl.load(table_ptr + 1), tl.load(table_ptr + 2))
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)  # outᵀ: the weight rows fill the MMA's M
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for i in range(TILES_PER_SPLIT):
        kt = pid_k * TILES_PER_SPLIT + i
        offs_kb = kt * KB + tl.arange(0, KB)   # packed byte columns
        offs_ks = kt * KS + tl.arange(0, KS)   # scale columns
        mask_kb = offs_kb < K // 2
        mask_ks = offs_ks < K // 32

        # weights: (BLOCK_N, KB) bytes and (BLOCK_N, KS) scales
        if PRESHUFFLED:
            # (n, kb) sits at row n/16, column (kb/32)·512 + ((kb/16)%2)·256 + (n%16)·16 + kb%16.
            n16 = offs_n[:, None]
            kb = offs_kb[None, :]
            w_ptrs = (w_ptr + (n16 // 16).to(tl.int64) * stride_wn
                      + (kb // 32) * 512 + ((kb // 16) % 2) * 256 + (n16 % 16) * 16 + kb % 16)
            # (r, c) sits at row r/32, column
            # (c/8)·256 + (c%4)·64 + (r%16)·4 + ((c/4)%2)·2 + (r/16)%2.
            ks = offs_ks[None, :]
            ws_ptrs = (w_scale_ptr + (n16 // 32).to(tl.int64) * stride_wsn + (ks // 8) * 256
                       + (ks % 4) * 64 + (n16 % 16) * 4 + ((ks // 4) % 2) * 2 + (n16 // 16) % 2)
        else:
            w_ptrs = w_ptr + rows_n * stride_wn + offs_kb[None, :] * stride_wk
            ws_ptrs = w_scale_ptr + rows_n * stride_wsn + offs_ks[None, :] * stride_wsk
        w_bytes = tl.load(w_ptrs, mask=mask_n[:, None] & mask_kb[None, :], other=0)
        w_scale = tl.load(ws_ptrs, mask=mask_n[:, None] & mask_ks[None, :], other=127)

        # activations: packed bytes + scales, or a bf16 tile quantized here (once per K-tile)
        if A_BF16:
            offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
            x = _load_f32(a_ptr + rows_q * stride_am + offs_k[None, :] * stride_ak,
                          mask_q[:, None] & (offs_k[None, :] < K), EXACT_CASTS)
            if USE_DOT_SCALED or WRITE_QUANT:
                codes, exponent = _quant_tile(x, QUANT_ROWS, BLOCK_K, ROUNDING)
                a_scale = (exponent + 127).to(tl.uint8)
                a_bytes = _pack_codes(codes, QUANT_ROWS, BLOCK_K)
                if WRITE_QUANT:
                    tl.store(q_out_ptr + rows_q * stride_qm + offs_kb[None, :], a_bytes,
                             mask=mask_q[:, None] & mask_kb[None, :] & write_q[:, None])
                    tl.store(q_scale_out_ptr + rows_q * stride_qsm + offs_ks[None, :], a_scale,
                             mask=mask_q[:, None] & mask_ks[None, :] & write_q[:, None])
                if USE_DOT_SCALED:
                    a_bytes = _spread_rows(a_bytes, QUANT_ROWS, SPREAD)
                    a_scale = _spread_rows(a_scale, QUANT_ROWS, SPREAD)
                else:
                    a_values = _e2m1_value(codes) * _e8m0_value(a_scale)[:, :, None]
                    a_even, a_odd = _even_odd(tl.reshape(a_values, (QUANT_ROWS, BLOCK_K)),
                                              QUANT_ROWS, BLOCK_K, DOT_DTYPE)
            else:
                a_even, a_odd = _even_odd(_quant_values(x, QUANT_ROWS, BLOCK_K, ROUNDING),
                                          QUANT_ROWS, BLOCK_K, DOT_DTYPE)
            if not USE_DOT_SCALED:
                a_even = _spread_rows(a_even, QUANT_ROWS, SPREAD)
                a_odd = _spread_rows(a_odd, QUANT_ROWS, SPREAD)
        else:
            a_mask_ks = mask_m[:, None] & mask_ks[None, :]
            a_bytes = tl.load(a_ptr + rows_m * stride_am + offs_kb[None, :] * stride_ak,
                              mask=mask_m[:, None] & mask_kb[None, :], other=0)
            a_scale = tl.load(a_scale_ptr + rows_m * stride_asm + offs_ks[None, :] * stride_ask,
                              mask=a_mask_ks, other=127)
            if not USE_DOT_SCALED:
                a_even, a_odd = _dequant_halves(a_bytes, a_scale, BLOCK_M, KB, DOT_DTYPE,
                                                DECODE_PTX)

        if USE_DOT_SCALED:
            if SWAP_AB:
                acc = tl.dot_scaled(w_bytes, w_scale, "e2m1", tl.trans(a_bytes), a_scale, "e2m1",
                                    acc)
            else:
                acc = tl.dot_scaled(a_bytes, a_scale, "e2m1", tl.trans(w_bytes), w_scale, "e2m1",
                                    acc)
        else:
            w_even, w_odd = _dequant_halves(w_bytes, w_scale, BLOCK_N, KB, DOT_DTYPE, DECODE_PTX,
                                            tables)
            if SWAP_AB:
                acc = tl.dot(w_even, tl.trans(a_even), acc)
                acc = tl.dot(w_odd, tl.trans(a_odd), acc)
            else:
                acc = tl.dot(a_even, tl.trans(w_even), acc)
                acc = tl.dot(a_odd, tl.trans(w_odd), acc)

    if SWAP_AB:
        acc = tl.trans(acc)
    is_last = True
    if SPLIT_K > 1:
        acc, is_last = _split_k_reduce(
            acc, partial_ptr, lock_ptr, tile_id, pid_k, mask_m, BLOCK_M, BLOCK_N, SPLIT_K
        )
    if is_last:
        if NUM_PIECES == 0:
            _store_tile(out_ptr, acc, offs_m, offs_n, M, N, stride_om, stride_on, EXACT_CASTS)
        else:
            split_epilogue(
                acc, offs_m, pid_n, out_ptr, p1_ptr, p2_ptr, p3_ptr, y_ptr,
                M, N, D, SW, W0, W1, W2, LD0, LD1, LD2, LD3, S3, stride_ym, stride_yd, stride_ys,
                BLOCK_N, NUM_PIECES, EPILOGUE_SUBTILES, EXACT_CASTS, Y_HEADS, BLOCK_S3,
                Y_COL_ITERS,
            )


# fmt: on
# ---------------------------------------------------------------------------------------------
# launcher

KERNEL_NAME = "gemm_mxfp4"
# The prequant A16WFP4 variant has its own launch table (its best skinny tiles differ).
PREQUANT_TABLE = "gemm_a16wfp4"
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Targets whose tensor cores take e2m1 × e8m0 directly (tl.dot_scaled); elsewhere the dequant
# path, unless a caller asks for Triton's dot_scaled emulation.
DOT_SCALED_TARGETS = ("gfx950",)


# Bytes per inline-PTX decode call (DECODE_PTX above): AFP4WFP4 (activation bytes), A16WFP4.
# Triton's inline asm aborts the process at compile time when a thread holds a count of elements
# that the pack does not divide.
PTX_PACK = {False: 2, True: 4}
# The 4-byte decode with its tables as operands (E2M1_BF16_PTX4_TABLES_TEXT) instead of written
# in. Off: on the H100 (2026-12-06, results/decode_tables.json, `decode_rows.py --tables`) it
# was slower in 10 of 15 A16WFP4 cases at M 1 / 16 / 32 (up to 1.29x: 24576x1536 M 16, 34.2 vs
# 26.5 us) and at most 6 % faster (7168x2048 M 16 / 32), though its sm90 K-loop is 16 % shorter.
# The GPU tests pass with it on (test_gemm_mxfp4_kernel.py, decode_and_swap).
PTX_TABLE_OPERANDS = False
_TABLES: dict = {}


def _decode_tables(device: torch.device) -> torch.Tensor:
    """The 4-byte decode's table words on `device` (int32), one cached tensor per device. Filled
    by fill kernels, not copied from the host, so that a first call inside CUDA-graph capture
    works; a tensor made during capture belongs to that graph and is not cached."""
    t = _TABLES.get(device)
    if t is None:
        t = torch.empty(len(E2M1_BF16_PTX4_TABLES), dtype=torch.int32, device=device)
        for i, word in enumerate(E2M1_BF16_PTX4_TABLES):
            t[i].fill_(word)
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            _TABLES[device] = t
    return t


def _use_dot_scaled(use_dot_scaled: bool | None, target: str) -> bool:
    if interpreting():
        if use_dot_scaled:
            raise ValueError("use_dot_scaled: tl.dot_scaled does not run in Triton's interpreter")
        return False
    return target in DOT_SCALED_TARGETS if use_dot_scaled is None else bool(use_dot_scaled)


def _decode_ptx(device: torch.device, dot_scaled: bool, a_bf16: bool, cfg: dict) -> int:
    """Bytes per inline-PTX e2m1 decode call (0: no PTX): CUDA only (not the interpreter, not
    ROCm), on the dequant path, PTX_PACK[a_bf16] where every thread holds at least that many
    bytes of each tile it decodes (the weight tile, and the activation tile unless A16WFP4):
    power-of-two tiles then hold a multiple of it."""
    if interpreting() or dot_scaled or device.type != "cuda" or torch.version.hip:
        return 0
    pack = PTX_PACK[a_bf16]
    rows = cfg["BLOCK_N"] if a_bf16 else min(cfg["BLOCK_M"], cfg["BLOCK_N"])
    return pack if rows * (cfg["BLOCK_K"] // 2) >= pack * 32 * cfg["num_warps"] else 0


def prequant_rows(m: int, block_m: int, swap_ab: bool) -> int:
    """QUANT_ROWS of the A16WFP4 kernel: M = 1 quantizes one row (two in swapped tiles), M = 2
    two, M >= 3 the whole tile. H100 (experiments/decode_rows.py,
    results/decode_rows_floors.json), M = 1: 24576x1536 26.4 -> 23.3 us, 7168x2048 14.1 ->
    12.8, 4096x512 4.8 -> 4.2, 2112x7168 (swapped) 14.5 -> 13.5 at two rows (14.9 at one); at
    M = 4 four rows were 3 % slower at 24576x1536 and 8 rows slower everywhere."""
    if m > 2:
        return block_m
    return quant_rows(m, block_m, 2 if swap_ab else 1)


def _check_preshuffled(w, w_scale, n: int, k: int) -> None:
    """Shapes of preshuffle_weight_fp4(w) and preshuffle_scale_e8m0(w_scale) for (N, K)."""
    if n % 16 or (k // 2) % 32:
        raise ValueError(f"w: preshuffled weights need N % 16 == 0, K/2 % 32 == 0 (N {n}, K {k})")
    w_shape, scale_shape = preshuffled_shapes(n, k)
    if _shape(w) != w_shape or not w.is_contiguous():
        raise ValueError(f"w: expected a contiguous {w_shape}, got {_shape(w)}")
    if _shape(w_scale) != scale_shape or not w_scale.is_contiguous():
        raise ValueError(f"w_scale: expected a contiguous {scale_shape}, got {_shape(w_scale)}")


def _launch(
    a,
    a_scale,
    w,
    w_scale,
    out,
    n,
    k,
    *,
    a_bf16,
    rounding="even",
    preshuffled,
    use_dot_scaled,
    q_out=None,
    q_scale_out=None,
    dest=None,
    config,
    target,
):
    """Launch the kernel into out (M, N), or into dest's split pieces (`epilogue_args`);
    returns Triton's compiled kernel (its `asm` holds the PTX)."""
    m = a.shape[0]
    target = resolve_target(target, a.device)
    dot_scaled = _use_dot_scaled(use_dot_scaled, target)
    cfg = launch_config(PREQUANT_TABLE if a_bf16 else KERNEL_NAME, target, m, n, k, config)
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    if bk < 64:
        raise ValueError(f"config: BLOCK_K must be >= 64 for MXFP4 (32 packed bytes), got {bk}")
    split_k, tiles_per_split = split_k_plan(k, bk, cfg["SPLIT_K"])
    tiles = _cdiv(m, bm) * _cdiv(n, bn)
    partials, locks = split_k_buffers(a.device, tiles, split_k, bm, bn)
    q_t = out if q_out is None else q_out
    qs_t = out if q_scale_out is None else q_scale_out
    decode_ptx = _decode_ptx(a.device, dot_scaled, a_bf16, cfg)
    ptx_tables = decode_ptx == 4 and PTX_TABLE_OPERANDS
    tables = _decode_tables(a.device) if ptx_tables else out
    # The interpreter's bf16 dot is broken (triton 3.6): dot the same exact values in fp32.
    dot_dtype = tl.float32 if interpreting() else tl.bfloat16
    split_args, split_meta = epilogue_args(dest, out, bm, bn)
    return launch(_gemm_mxfp4_kernel, (tiles, split_k),
        a,
        a_scale,
        w,
        w_scale,
        out,
        partials,
        locks,
        q_t,
        qs_t,
        tables,
        m,
        n,
        k,
        a.stride(0),
        a.stride(1),
        a_scale.stride(0),
        a_scale.stride(1),
        w.stride(0),
        w.stride(1),
        w_scale.stride(0),
        w_scale.stride(1),
        out.stride(0),
        out.stride(1),
        q_t.stride(0),
        qs_t.stride(0),
        *split_args,
        A_BF16=a_bf16,
        ROUNDING=formats.MXFP4_ROUNDINGS.index(rounding),
        USE_DOT_SCALED=dot_scaled,
        PRESHUFFLED=bool(preshuffled),
        WRITE_QUANT=q_out is not None,
        DOT_DTYPE=dot_dtype,
        DECODE_PTX=decode_ptx,
        PTX_TABLES=ptx_tables,
        EXACT_CASTS=interpreting(),
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=cfg["GROUP_M"],
        SPLIT_K=split_k,
        TILES_PER_SPLIT=tiles_per_split,
        SWAP_AB=bool(cfg["SWAP_AB"]),
        QUANT_ROWS=prequant_rows(m, bm, bool(cfg["SWAP_AB"])) if a_bf16 else bm,
        **split_meta,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )


def _check_weights(w, w_scale, n_hint, k, preshuffled):
    """(N) of the weights, validated against K; n_hint is N for preshuffled weights."""
    if preshuffled:
        if not isinstance(n_hint, int) or n_hint < 1:
            raise ValueError(f"n: preshuffled weights need the output size N, got {n_hint!r}")
        _check_tensor("w", w, (torch.uint8,), 2)
        _check_tensor("w_scale", w_scale, (torch.uint8,), 2)
        _check_preshuffled(w, w_scale, n_hint, k)
        return n_hint
    return w.shape[0]


def _check_runnable(t: torch.Tensor, name: str) -> None:
    if t.device.type == "cpu" and not interpreting():
        raise ValueError(f"{name}: a CPU tensor needs Triton's interpreter (TRITON_INTERPRET=1)")


@planned
def gemm_mxfp4(
    q: torch.Tensor,
    x_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    preshuffled: bool = False,
    n: int | None = None,
    use_dot_scaled: bool | None = None,
    config: dict | None = None,
    target: str | None = None,
) -> torch.Tensor:
    """AFP4WFP4 GEMM unpack(q, x_scale) @ unpack(w, w_scale)ᵀ → (M, N) out_dtype.

    preshuffled: w / w_scale are gfx950's shuffled layouts (then `n` gives N).
    use_dot_scaled: None picks by target (gfx950: tl.dot_scaled; else the dequant path)."""
    m, k, n = _checked_args(q, x_scale, w, w_scale, out_dtype, preshuffled, n)
    out = torch.empty((m, n), dtype=out_dtype, device=q.device)
    if m and n:
        _launch(
            q,
            x_scale,
            w,
            w_scale,
            out,
            n,
            k,
            a_bf16=False,
            preshuffled=preshuffled,
            use_dot_scaled=use_dot_scaled,
            config=config,
            target=target,
        )
    return out


def _checked_args(q, x_scale, w, w_scale, out_dtype, preshuffled, n) -> tuple[int, int, int]:
    """(M, K, N) of an AFP4WFP4 GEMM's arguments, validated."""
    if preshuffled:
        for name, t in (("q", q), ("x_scale", x_scale)):
            _check_tensor(name, t, (torch.uint8,), 2)
        m, k = q.shape[0], 2 * q.shape[1]
        if k % formats.MXFP4_BLOCK:
            raise ValueError(f"q: K = 2 · q.shape[1] = {k} must be a multiple of 32 for MXFP4")
        if _shape(x_scale) != (m, k // 32):
            raise ValueError(
                f"x_scale: expected (M, K/32) = ({m}, {k // 32}), got {_shape(x_scale)}"
            )
        _check_out_dtype(out_dtype)
        _check_devices({"q": q, "x_scale": x_scale, "w": w, "w_scale": w_scale})
        n = _check_weights(w, w_scale, n, k, True)
    else:
        check_gemm_mxfp4_args(q, x_scale, w, w_scale, out_dtype)
        m, k, n = q.shape[0], 2 * q.shape[1], w.shape[0]
    _check_runnable(q, "q")
    return m, k, n


def _gemm_into(q, x_scale, w, w_scale, out_dtype, d, widths, y, layout: dict, view_piece=-1):
    """gemm_mxfp4 into `destinations(..)`: the split-cat's (out, c2) with y, else the pieces
    (piece `view_piece` laid out as the split's view)."""
    m, k, n = _checked_args(
        q, x_scale, w, w_scale, out_dtype, layout["preshuffled"], layout["n"]
    )
    outputs, dest = destinations(q, n, d, widths, y, out_dtype, view_piece)
    if m:
        _launch(
            q, x_scale, w, w_scale, dest[0][0], n, k, a_bf16=False,
            preshuffled=layout["preshuffled"], use_dot_scaled=layout["use_dot_scaled"],
            dest=dest, config=layout["config"], target=layout["target"],
        )
    return outputs


@planned
def gemm_mxfp4_split_cat(
    q, x_scale, w, w_scale, d: int, s1: int, s2: int, y: torch.Tensor,
    *, preshuffled: bool = False, n: int | None = None, use_dot_scaled: bool | None = None,
    config: dict | None = None, target: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cat([c1, y], -1), c2) of c1, c2 = split(gemm_mxfp4(q, ..).view(M, d, s1 + s2),
    [s1, s2], -1) in y's dtype, each tile written straight to its destination and y copied by
    the tiles (gemm_split_cat.split_epilogue). Other arguments as gemm_mxfp4's."""
    layout = dict(preshuffled=preshuffled, n=n, use_dot_scaled=use_dot_scaled, config=config,
                  target=target)  # fmt: skip
    out_dtype = _split_cat_dtype(y)
    return _gemm_into(q, x_scale, w, w_scale, out_dtype, d, [s1, s2], y, layout)


@planned
def gemm_mxfp4_split(
    q, x_scale, w, w_scale, d: int, sizes, out_dtype: torch.dtype = torch.bfloat16,
    view_piece: int = -1, *, preshuffled: bool = False, n: int | None = None,
    use_dot_scaled: bool | None = None, config: dict | None = None, target: str | None = None,
) -> tuple[torch.Tensor, ...]:
    """The pieces of split(gemm_mxfp4(q, ..).view(M, d, sum(sizes)), sizes, -1), each
    contiguous except `view_piece` (the split's view, `gemm_split_cat_ref.piece_buffers`),
    written straight from the GEMM tiles (up to four)."""
    layout = dict(preshuffled=preshuffled, n=n, use_dot_scaled=use_dot_scaled, config=config,
                  target=target)  # fmt: skip
    return _gemm_into(q, x_scale, w, w_scale, out_dtype, d, sizes, None, layout, view_piece)


@planned
def gemm_a16wfp4(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    *,
    rounding: str = "even",
    out_dtype: torch.dtype = torch.bfloat16,
    preshuffled: bool = False,
    n: int | None = None,
    use_dot_scaled: bool | None = None,
    return_quant: bool = False,
    config: dict | None = None,
    target: str | None = None,
):
    """Prequant GEMM: quant_mxfp4_ref(x, rounding) in registers, then the AFP4WFP4 GEMM.

    Returns out, or (out, q, x_scale) with the in-kernel quant's bytes when return_quant."""
    _check_tensor("x", x, FLOAT_DTYPES, 2)
    _check_tensor("w", w, (torch.uint8,), 2)
    _check_tensor("w_scale", w_scale, (torch.uint8,), 2)
    formats.check_rounding(rounding)
    _check_out_dtype(out_dtype)
    _check_devices({"x": x, "w": w, "w_scale": w_scale})
    _check_runnable(x, "x")
    m, k = x.shape
    if k % formats.MXFP4_BLOCK:
        raise ValueError(f"x: K must be a multiple of 32 for MXFP4, got {k}")
    if preshuffled:
        n = _check_weights(w, w_scale, n, k, True)
    else:
        check_gemm_mxfp4_args(
            torch.empty((m, k // 2), dtype=torch.uint8, device="meta"),
            torch.empty((m, k // 32), dtype=torch.uint8, device="meta"),
            w.to("meta"),
            w_scale.to("meta"),
            out_dtype,
        )
        n = w.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    q_out = torch.empty((m, k // 2), dtype=torch.uint8, device=x.device) if return_quant else None
    scale_out = (
        torch.empty((m, k // 32), dtype=torch.uint8, device=x.device) if return_quant else None
    )
    if m and n:
        _launch(
            x,
            x,  # no activation scales to read: they come from the tile
            w,
            w_scale,
            out,
            n,
            k,
            a_bf16=True,
            rounding=rounding,
            preshuffled=preshuffled,
            use_dot_scaled=use_dot_scaled,
            q_out=q_out,
            q_scale_out=scale_out,
            config=config,
            target=target,
        )
    if return_quant:
        return out, q_out, scale_out
    return out


__all__ = [
    "DOT_SCALED_TARGETS", "gemm_a16wfp4", "gemm_mxfp4", "gemm_mxfp4_split", "gemm_mxfp4_split_cat",
]
