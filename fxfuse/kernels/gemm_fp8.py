"""FP8 GEMMs: A8W8 (`gemm_fp8`) and the prequant A16W8 (`gemm_a16w8`), fp32 accumulation.

Math (exactly `gemm_ref.gemm_fp8_ref` up to fp32 summation order):
    rowwise:    out[m, n] = (Σ_k q[m, k] · w[n, k]) · x_scale[m] · w_scale[n]
    blockscale: out[m, n] = Σ_g (Σ_{k ∈ g} q[m, k] · w[n, k]) · x_scale[m, g] · w_scale[n // 128, g]
    with g the 128-column groups of K; tensorwise scales broadcast (stride 0).
A16W8: each program quantizes its bf16 activation tile in registers by the rule of
`rms_norm_quant_ref.quant_fp8_ref` (per token, or 1×128 groups), bit for bit, then does the above.
Per-token needs the row amax over all of K: either a first loop over K inside the GEMM (tiny M,
where re-reading x per program is cheap) or a pre-pass kernel writing the (M,) scales.
Decode M (one M tile, M < BLOCK_M / 2): a program quantizes QUANT_ROWS rows of x, not the whole
tile, and repeats each over BLOCK_M / QUANT_ROWS tile rows (`_spread_rows`); only the first
row of each repeat is stored. `prequant_rows` picks QUANT_ROWS per kernel from measurements
(the MXFP4 kernel shares the mechanism).

Layouts: q (M, K) and w (N, K) fp8 with any strides (read as bytes); x_scale (M, 1) / () / (1,)
or (M, K/128) row- or column-major; w_scale (N,) / (N, 1) / () / (1,) or (ceil(N/128), K/128);
out (M, N) contiguous in out_dtype, or (`gemm_fp8_split_cat` / `gemm_fp8_split`, NUM_PIECES > 0)
the pieces of split(out.view(M, d, ·)) written by gemm_split_cat's epilogue, y's slice with them.

Tiling: (BLOCK_M, BLOCK_N) output tiles in GROUP_M-swizzled order for L2 reuse; w is read as a
(BLOCK_K, BLOCK_N) view of its K-contiguous rows (the K-major B operand fp8 MMAs want). Split-K
(skinny M, long K): program (tile, s) sums K-tiles [s·T, (s+1)·T); each writes its fp32 partial to
a workspace and bumps the tile's counter; the last to arrive adds the SPLIT_K partials in split
order (deterministic), applies the scales, stores, and resets the counter to 0 for the next launch.
SWAP_AB (skinny M): the program computes the tile's transpose, dot(w (BLOCK_N, BLOCK_K), qᵀ), so
the weight rows fill the MMA's M slot (64 on Hopper's wgmma) and the few tokens its N slot (16+),
instead of padding a 16-row token tile up to the MMA's M; the sum is the same, the tile is
transposed back before the epilogue.
Loop trip counts are constexprs (K-tiles per split, chosen to divide the K-tiles evenly): Triton's
interpreter cannot take a run-time `range` bound under numpy >= 2.4, and K is fixed per weight.

Numerics: the FP8 products are exact and accumulate in fp32. The dot runs on the fp8 type where
the target has it (e4m3fn: sm_89+, gfx950 and the interpreter; e4m3fnuz: gfx942); elsewhere the
bytes are decoded exactly to bf16 (fp32 in the interpreter, whose bf16 dot is broken in triton 3.6).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from fxfuse.kernels import formats
from fxfuse.kernels._plans import launch, planned
from fxfuse.kernels.gemm_ref import (
    FP8_BLOCK,
    OUT_DTYPES,
    SCALE_BLOCK,
    _check_devices,
    _check_out_dtype,
    _check_tensor,
    check_gemm_fp8_args,
    is_rowwise_w_scale,
    scale_strides,
)
from fxfuse.kernels.gemm_split_cat import destinations, epilogue_args, split_epilogue
from fxfuse.kernels.rms_norm_quant import (
    _fp8_native,
    _fp8_quant,
    _fp8_scale,
    _load_f32,
    _round_to,
    _store_as,
)
from fxfuse.runtime import launch_tables
from fxfuse.runtime.target import TARGETS, detect_target, interpreting

# fmt: off
# (Kernel arguments stay grouped by role, as in the Triton tutorials.)

A_FP8 = tl.constexpr(0)          # q is FP8 bytes
A_ROW_PRESCALED = tl.constexpr(1)  # bf16 x, per-token scales from the pre-pass kernel
A_ROW_AMAX = tl.constexpr(2)     # bf16 x, per-token amax in a first loop over K
A_GROUP = tl.constexpr(3)        # bf16 x, 1×128 group scales from the tile itself


# ---------------------------------------------------------------------------------------------
# helpers (shared with gemm_mxfp4)


@triton.jit
def _tile_ids(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n, tile id) of program_id(0), GROUP_M row-tiles per swizzle group."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n, pid


@triton.jit
def _spread_rows(v, ROWS: tl.constexpr, SPREAD: tl.constexpr):
    """(ROWS, C) → (ROWS · SPREAD, C), or (ROWS,) → (ROWS · SPREAD,): each row repeated SPREAD
    times in place (row r fills rows r · SPREAD ...). One return: Triton's code generator goes
    on past a `return` inside a compile-time `if`."""
    out = v
    if ROWS == 1:  # a plain broadcast: no reshape, no layout change
        if len(v.shape) == 1:
            out = tl.broadcast_to(v, (SPREAD,))
        else:
            out = tl.broadcast_to(v, (SPREAD, v.shape[1]))
    elif SPREAD > 1:
        if len(v.shape) == 1:
            out = tl.reshape(tl.broadcast_to(v[:, None], (ROWS, SPREAD)), (ROWS * SPREAD,))
        else:
            C: tl.constexpr = v.shape[1]
            out = tl.reshape(tl.broadcast_to(v[:, None, :], (ROWS, SPREAD, C)),
                             (ROWS * SPREAD, C))
    return out


@triton.jit
def _spread_offsets(pid_m, M, BLOCK_M: tl.constexpr, QUANT_ROWS: tl.constexpr):
    """(out row of each tile row, out row of each quantized row) for a prequant program that
    quantizes QUANT_ROWS rows of x and repeats each over BLOCK_M // QUANT_ROWS tile rows (M <=
    QUANT_ROWS < BLOCK_M: one M tile). Tile rows that repeat a row read M (masked off)."""
    SPREAD: tl.constexpr = BLOCK_M // QUANT_ROWS
    tile_rows = tl.arange(0, BLOCK_M)
    if SPREAD > 1:
        offs_m = tl.where(tile_rows % SPREAD == 0, tile_rows // SPREAD, M)
    else:
        offs_m = pid_m * BLOCK_M + tile_rows
    return offs_m, pid_m * BLOCK_M + tl.arange(0, QUANT_ROWS)


@triton.jit
def _split_k_reduce(
    acc, partial_ptr, lock_ptr, tile_id, pid_k, mask_m, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
):
    """Store this split's partial; the last split of the tile returns (Σ partials, True).

    Only the tile's rows below M (mask_m) travel: a decode tile (M = 1 in a 16-row tile) writes
    and reads back 1/16 of the partial, which is what lets skinny GEMMs split K many ways."""
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    rows = mask_m[:, None]  # broadcast over the tile's columns
    tile_ptr = partial_ptr + tile_id.to(tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N)
    tl.store(tile_ptr + pid_k * (BLOCK_M * BLOCK_N) + offs, acc, mask=rows)
    # Every thread's store precedes the release by the one thread that bumps the counter.
    tl.debug_barrier()
    arrived = tl.atomic_add(lock_ptr + tile_id, 1, sem="acq_rel", scope="gpu")
    is_last = arrived == SPLIT_K - 1
    if is_last:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for s in tl.static_range(SPLIT_K):
            # .cg: read L2, where the other programs' partials are, never a stale L1 line.
            acc += tl.load(tile_ptr + s * (BLOCK_M * BLOCK_N) + offs, mask=rows, other=0.0,
                           cache_modifier=".cg")
        tl.atomic_xchg(lock_ptr + tile_id, 0, sem="relaxed", scope="gpu")
    return acc, is_last


@triton.jit
def _store_tile(
    out_ptr, acc, offs_m, offs_n, M, N, stride_om, stride_on, EXACT_CASTS: tl.constexpr,
):
    OUT_DTYPE: tl.constexpr = out_ptr.dtype.element_ty
    ptrs = out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :] * stride_on
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    _store_as(ptrs, _round_to(acc, OUT_DTYPE, EXACT_CASTS), mask, EXACT_CASTS)


@triton.jit
def _fp8_decode(bits, FNUZ: tl.constexpr):
    """fp32 value of e4m3fn / e4m3fnuz bytes, exactly (bf16 holds every one of them too)."""
    b = bits.to(tl.int32)
    BIAS: tl.constexpr = 8 if FNUZ else 7
    exponent = (b >> 3) & 0xF
    mantissa = b & 7
    negative = (b & 0x80) != 0
    normal = ((exponent + (127 - BIAS)) << 23) | (mantissa << 20)
    magnitude = tl.where(
        exponent == 0,
        mantissa.to(tl.float32) * (2.0 ** (-2 - BIAS)),  # subnormals: m · 2^(1 - BIAS - 3)
        normal.to(tl.float32, bitcast=True),
    )
    value = tl.where(negative, -magnitude, magnitude)
    if FNUZ:
        value = tl.where(b == 0x80, float("nan"), value)
    else:
        value = tl.where((b & 0x7F) == 0x7F, float("nan"), value)
    return value


@triton.jit
def _fp8_operand(bits, DOT_DTYPE: tl.constexpr, FNUZ: tl.constexpr):
    """FP8 bytes as a dot operand: bitcast to the fp8 type, or decoded to DOT_DTYPE."""
    if DOT_DTYPE.is_fp8():
        return bits.to(DOT_DTYPE, bitcast=True)
    return _fp8_decode(bits, FNUZ).to(DOT_DTYPE)


# ---------------------------------------------------------------------------------------------
# kernels


@triton.jit
def _row_scale_kernel(
    x_ptr, scale_ptr, M, K, stride_xm, stride_xk, quant_eps,
    FP8_MAX: tl.constexpr, EPS_ON_SCALE: tl.constexpr, EXACT_CASTS: tl.constexpr,
    CONST_DIV_AS_MUL: tl.constexpr, BLOCK_K: tl.constexpr, NUM_K_CHUNKS: tl.constexpr,
):
    """Per-token FP8 scale max(amax(row), eps) / FP8_MAX (fp32, correctly rounded), one row each."""
    row = tl.program_id(0).to(tl.int64)
    amax = tl.zeros((BLOCK_K,), tl.float32)
    for i in range(NUM_K_CHUNKS):
        offs_k = i * BLOCK_K + tl.arange(0, BLOCK_K)
        x = _load_f32(x_ptr + row * stride_xm + offs_k * stride_xk, offs_k < K, EXACT_CASTS)
        amax = tl.maximum(amax, tl.abs(x))
    scale = _fp8_scale(tl.max(amax, axis=0), quant_eps, FP8_MAX, EPS_ON_SCALE, CONST_DIV_AS_MUL)
    tl.store(scale_ptr + row, scale)


# M varies per call: specializing on it (M == 1, M % 16) would only multiply compiles.
@triton.jit(do_not_specialize=["M"])
def _gemm_fp8_kernel(
    # pointers
    a_ptr, a_scale_ptr, w_ptr, w_scale_ptr, out_ptr, partial_ptr, lock_ptr, q_out_ptr,
    q_scale_out_ptr,
    # sizes and scalars
    M, N, K, quant_eps,
    # strides, in elements (a, w: bytes when FP8)
    stride_am, stride_ak, stride_wn, stride_wk, stride_asm, stride_ask, stride_wsn, stride_wsk,
    stride_om, stride_on, stride_qm, stride_qsm, stride_qsk,
    # split epilogue (gemm_split_cat.epilogue_args; out_ptr is piece 0)
    p1_ptr, p2_ptr, p3_ptr, y_ptr, D, SW, W0, W1, W2, LD0, LD1, LD2, LD3, S3,
    stride_ym, stride_yd, stride_ys,
    # switches
    A_KIND: tl.constexpr, SCALE_BLOCKWISE: tl.constexpr, DOT_DTYPE: tl.constexpr,
    FP8_MAX: tl.constexpr, FP8_FNUZ: tl.constexpr, FP8_NATIVE: tl.constexpr,
    EPS_ON_SCALE: tl.constexpr, APPLY_RECIPROCAL: tl.constexpr, WRITE_QUANT: tl.constexpr,
    EVEN_K: tl.constexpr, EXACT_CASTS: tl.constexpr, CONST_DIV_AS_MUL: tl.constexpr,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, NUM_K_TILES: tl.constexpr, TILES_PER_SPLIT: tl.constexpr,
    SWAP_AB: tl.constexpr, QUANT_ROWS: tl.constexpr,
    NUM_PIECES: tl.constexpr, EPILOGUE_SUBTILES: tl.constexpr, Y_HEADS: tl.constexpr,
    BLOCK_S3: tl.constexpr, Y_COL_ITERS: tl.constexpr,
):
    pid_m, pid_n, tile_id = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    # Prequant decode: QUANT_ROWS (< BLOCK_M) rows of x quantized, each repeated to fill the tile.
    SPREAD: tl.constexpr = BLOCK_M // QUANT_ROWS
    offs_m, offs_q = _spread_offsets(pid_m, M, BLOCK_M, QUANT_ROWS)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_q = offs_q < M
    mask_n = offs_n < N
    a_rows = a_ptr + offs_q[:, None].to(tl.int64) * stride_am
    w_cols = w_ptr + offs_n[None, :].to(tl.int64) * stride_wn  # (BLOCK_K, BLOCK_N) view
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn  # (BLOCK_N, BLOCK_K) (SWAP_AB)
    k_tile_start = pid_k * TILES_PER_SPLIT
    # Debug copies of the in-register quant (prequant only): the pid_n == 0 programs write them.
    write_q = pid_n == 0

    row_scale = tl.zeros((QUANT_ROWS,), tl.float32)
    if A_KIND == A_ROW_PRESCALED:
        row_scale = tl.load(a_scale_ptr + offs_q * stride_asm, mask=mask_q, other=1.0)
    elif A_KIND == A_ROW_AMAX:
        amax = tl.zeros((QUANT_ROWS,), tl.float32)
        for kt in range(NUM_K_TILES):
            offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
            x = _load_f32(
                a_rows + offs_k[None, :] * stride_ak, mask_q[:, None] & (offs_k[None, :] < K),
                EXACT_CASTS,
            )
            amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
        row_scale = _fp8_scale(amax, quant_eps, FP8_MAX, EPS_ON_SCALE, CONST_DIV_AS_MUL)
        if WRITE_QUANT:
            if pid_k == 0:
                tl.store(q_scale_out_ptr + offs_q * stride_qsm, row_scale, mask=mask_q & write_q)

    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)  # outᵀ: N fills the MMA's M slot
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for i in range(TILES_PER_SPLIT):
        kt = k_tile_start + i
        offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
        if EVEN_K:
            mask_a = mask_q[:, None]
        else:
            mask_a = mask_q[:, None] & (offs_k[None, :] < K)
        if SWAP_AB:
            if EVEN_K:
                mask_w = mask_n[:, None]
            else:
                mask_w = mask_n[:, None] & (offs_k[None, :] < K)
            w_bits = tl.load(w_rows + offs_k[None, :] * stride_wk, mask=mask_w, other=0)
        else:
            if EVEN_K:
                mask_w = mask_n[None, :]
            else:
                mask_w = mask_n[None, :] & (offs_k[:, None] < K)
            w_bits = tl.load(w_cols + offs_k[:, None] * stride_wk, mask=mask_w, other=0)
        a_ptrs = a_rows + offs_k[None, :] * stride_ak
        if A_KIND == A_FP8:
            a_bits = tl.load(a_ptrs, mask=mask_a, other=0)
        else:
            x = _load_f32(a_ptrs, mask_a, EXACT_CASTS)
            if A_KIND == A_GROUP:
                # BLOCK_K == 128: the tile row is exactly one quant group.
                group_scale = _fp8_scale(
                    tl.max(tl.abs(x), axis=1), quant_eps, FP8_MAX, EPS_ON_SCALE,
                    CONST_DIV_AS_MUL,
                )
                a_bits = _fp8_quant(
                    x, group_scale[:, None], FP8_MAX, FP8_FNUZ, FP8_NATIVE, APPLY_RECIPROCAL,
                    EXACT_CASTS,
                )
                if WRITE_QUANT:
                    tl.store(q_scale_out_ptr + offs_q * stride_qsm + kt * stride_qsk,
                             group_scale, mask=mask_q & write_q)
            else:
                a_bits = _fp8_quant(
                    x, row_scale[:, None], FP8_MAX, FP8_FNUZ, FP8_NATIVE, APPLY_RECIPROCAL,
                    EXACT_CASTS,
                )
            if WRITE_QUANT:
                tl.store(q_out_ptr + offs_q[:, None] * stride_qm + offs_k[None, :], a_bits,
                         mask=mask_a & (offs_k[None, :] < K) & write_q)
        a = _spread_rows(_fp8_operand(a_bits, DOT_DTYPE, FP8_FNUZ), QUANT_ROWS, SPREAD)
        w = _fp8_operand(w_bits, DOT_DTYPE, FP8_FNUZ)
        if SCALE_BLOCKWISE:
            # One 128-group per K-tile: scale the group's partial product before summing.
            if A_KIND == A_GROUP:
                a_s = _spread_rows(group_scale, QUANT_ROWS, SPREAD)
            else:
                a_s = tl.load(a_scale_ptr + offs_m * stride_asm + kt * stride_ask, mask=mask_m,
                              other=0.0)
            w_s = tl.load(w_scale_ptr + (offs_n // 128) * stride_wsn + kt * stride_wsk,
                          mask=mask_n, other=0.0)
            if SWAP_AB:
                acc += tl.dot(w, tl.trans(a)) * (w_s[:, None] * a_s[None, :])
            else:
                acc += tl.dot(a, w) * (a_s[:, None] * w_s[None, :])
        elif SWAP_AB:
            acc = tl.dot(w, tl.trans(a), acc)
        else:
            acc = tl.dot(a, w, acc)

    if SWAP_AB:
        acc = tl.trans(acc)
    is_last = True
    if SPLIT_K > 1:
        acc, is_last = _split_k_reduce(
            acc, partial_ptr, lock_ptr, tile_id, pid_k, mask_m, BLOCK_M, BLOCK_N, SPLIT_K
        )
    if is_last:
        if not SCALE_BLOCKWISE:
            if A_KIND == A_FP8:
                tile_scale = tl.load(a_scale_ptr + offs_m * stride_asm, mask=mask_m, other=0.0)
            else:
                tile_scale = _spread_rows(row_scale, QUANT_ROWS, SPREAD)
            w_s = tl.load(w_scale_ptr + offs_n * stride_wsn, mask=mask_n, other=0.0)
            acc = acc * tile_scale[:, None] * w_s[None, :]
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

KERNEL_NAME = "gemm_fp8"
# One launch table per variant: A8W8 rowwise (KERNEL_NAME), A8W8 blockscale and the prequant
# kernels have different best tiles (a config swept for one made another up to 3.6x slower).
BLOCK_TABLE = "gemm_fp8_block"
PREQUANT_TABLE = "gemm_a16w8"
TABLES = (KERNEL_NAME, BLOCK_TABLE, PREQUANT_TABLE)
CONFIG_FIELDS = (
    "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "num_warps", "num_stages", "SWAP_AB",
)
# Tables written before SWAP_AB existed (or other kernels' tables sharing this launcher) omit it.
CONFIG_DEFAULTS = {"SWAP_AB": 0}
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ROW_AMAX_MODES = ("auto", "kernel", "prepass")
# Per-token prequant: up to this K the GEMM finds the row amax itself (each program re-reads its
# rows of x before its main loop); above it a pre-pass kernel does (one more launch). The cost
# of the re-read grows with K, not M (H200, CUDA graphs, benchmarks/experiments/prequant_amax.py,
# M 1-32: in-kernel 4-6 us faster at K 1536-2304, 7-8 us slower at K 7168).
ROW_AMAX_IN_KERNEL_MAX_K = 2304
_TL_FP8 = {torch.float8_e4m3fn: tl.float8e4nv, torch.float8_e4m3fnuz: tl.float8e4b8}
# Split-K counters: one zeroed int32 buffer per (device, stream), reset by the kernels themselves.
_LOCKS: dict = {}
_MIN_LOCKS = 4096


def resolve_target(target: str | None, device: torch.device) -> str:
    target = detect_target(device) if target is None else target
    if target not in TARGETS:
        raise ValueError(f"target: unknown {target!r}; expected one of {TARGETS}")
    return target


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)  # host-side: triton.cdiv is a constexpr function, slow to call from Python


@functools.lru_cache(maxsize=4096)
def _table_config(kernel: str, target: str, m: int, n: int, k: int) -> dict:
    return launch_tables.lookup(kernel, target, m=max(m, 1), n=n, k=k)


def launch_config(kernel: str, target: str, m: int, n: int, k: int, config: dict | None) -> dict:
    """The table's config for (m, n, k) on target, with `config`'s keys overriding it."""
    resolved = {**CONFIG_DEFAULTS, **_table_config(kernel, target, m, n, k)}
    if not config:
        return resolved  # validated on load
    if config:
        unknown = sorted(set(config) - set(CONFIG_FIELDS))
        if unknown:
            raise ValueError(
                f"config: unknown keys {unknown}; expected a subset of {CONFIG_FIELDS}"
            )
        resolved.update(config)
    if resolved["SWAP_AB"] not in (0, 1):
        raise ValueError(f"config: SWAP_AB must be 0 or 1, got {resolved['SWAP_AB']!r}")
    for key in CONFIG_FIELDS:
        value = resolved[key]
        if key == "SWAP_AB":
            continue
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"config: {key} must be a positive int, got {value!r}")
        if key.startswith("BLOCK_") and (value < 16 or value & (value - 1)):
            raise ValueError(f"config: {key} must be a power of 2 >= 16, got {value!r}")
    if resolved["num_warps"] not in launch_tables.NUM_WARPS:
        raise ValueError(f"config: num_warps must be one of {launch_tables.NUM_WARPS}")
    return resolved


def table_name(a_kind: int, blockwise: bool) -> str:
    """The launch table of a variant: rowwise A8W8, blockscale A8W8 or prequant A16W8."""
    if a_kind != A_FP8:
        return PREQUANT_TABLE
    return BLOCK_TABLE if blockwise else KERNEL_NAME


def quant_rows(m: int, block_m: int, floor: int = 1) -> int:
    """Rows of x a prequant program quantizes (QUANT_ROWS): the power of two >= max(M, floor)
    when that is under BLOCK_M (one M tile; the kernel repeats each over BLOCK_M / QUANT_ROWS
    tile rows), else BLOCK_M."""
    return min(block_m, max(floor, 1 << max(0, m - 1).bit_length()))


def prequant_rows(a_kind, m: int, block_m: int) -> int:
    """QUANT_ROWS of the A16W8 kernels. Per-token scales: at least 4 rows, one per warp of a
    4-warp tile, so the row amax reduces within a warp: at M 1-4 that took 24576x1536 from 24.3
    to 19.5 us, 7168x2048 15.3 -> 11.6, 3072x1536 10.6 -> 7.7, where 1-2 rows were no faster
    (H100, experiments/decode_rows.py, results/decode_rows_floors.json). 1x128 groups: the whole
    tile; fewer rows were slower at every M (24576x1536 21.6 -> 37.8 us at 2 rows)."""
    if a_kind == A_ROW_AMAX or a_kind == A_ROW_PRESCALED:
        return quant_rows(m, block_m, 4)
    return block_m


def split_k_plan(k: int, block_k: int, split_k: int) -> tuple[int, int]:
    """(effective SPLIT_K, K-tiles per split): the largest split count <= split_k that divides
    the K-tiles evenly, so every split runs the same constexpr-bounded loop."""
    k_tiles = max(1, _cdiv(k, block_k))
    split = max(s for s in range(1, max(1, min(split_k, k_tiles)) + 1) if k_tiles % s == 0)
    return split, k_tiles // split


def split_k_buffers(device, tiles: int, split_k: int, block_m: int, block_n: int):
    """(fp32 partials workspace, zeroed int32 counters) for a split-K launch (dummies if none)."""
    if split_k == 1:
        dummy = torch.empty(1, dtype=torch.int32, device=device)
        return dummy, dummy
    partials = torch.empty(tiles * split_k * block_m * block_n, dtype=torch.float32, device=device)
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    key = (device, torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)
    locks = _LOCKS.get(key)
    if locks is None or locks.numel() < tiles:
        locks = torch.zeros(max(tiles, _MIN_LOCKS), dtype=torch.int32, device=device)
        if capturing:
            return partials, locks  # allocated inside a graph: never cached outside it
        _LOCKS[key] = locks
    return partials, locks


@functools.lru_cache(maxsize=64)
def dot_dtype(fp8_dtype: torch.dtype, device: torch.device, target: str):
    """The tl dtype the FP8 tiles enter tl.dot as: native fp8 where supported, else decoded."""
    if interpreting() or device.type != "cuda":
        return tl.float8e4nv if fp8_dtype == torch.float8_e4m3fn else tl.float32
    if torch.version.hip:
        arch = torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
        native = torch.float8_e4m3fnuz if arch == "gfx942" else torch.float8_e4m3fn
        return _TL_FP8[fp8_dtype] if fp8_dtype == native else tl.bfloat16
    if fp8_dtype == torch.float8_e4m3fn and torch.cuda.get_device_capability(device) >= (8, 9):
        return tl.float8e4nv
    return tl.bfloat16


_fp8_native_cached = functools.lru_cache(maxsize=64)(_fp8_native)


def _launch(
    a,
    a_scale,
    w,
    w_scale,
    out,
    *,
    a_kind,
    blockwise,
    fp8_dtype,
    quant_eps=1e-10,
    eps_on_scale=False,
    apply_reciprocal=False,
    q_out=None,
    q_scale_out=None,
    dest=None,
    config,
    target,
):
    """Launch the kernel into out (M, N), or into dest's split pieces (`epilogue_args`)."""
    m, k = a.shape
    n = w.shape[0]
    target = resolve_target(target, a.device)
    cfg = launch_config(table_name(a_kind, blockwise), target, m, n, k, config)
    if blockwise:
        cfg["BLOCK_K"] = FP8_BLOCK  # one scale group per K-tile
        # Each K-tile's product lives beside the accumulator: two fp32 tiles of registers.
        cfg["BLOCK_N"] = min(cfg["BLOCK_N"], max(16, 128 * 128 // cfg["BLOCK_M"]))
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    split_k, tiles_per_split = split_k_plan(k, bk, cfg["SPLIT_K"])
    tiles = _cdiv(m, bm) * _cdiv(n, bn)
    partials, locks = split_k_buffers(a.device, tiles, split_k, bm, bn)
    a_t = a.view(torch.uint8) if a.dtype in formats.FP8_DTYPES else a
    q_t = out if q_out is None else q_out.view(torch.uint8)
    qs_t = out if q_scale_out is None else q_scale_out
    asm, ask = scale_strides(a_scale)
    wsn, wsk = scale_strides(w_scale)
    qsm, qsk = (0, 0) if q_scale_out is None else scale_strides(q_scale_out)
    split_args, split_meta = epilogue_args(dest, out, bm, bn)
    launch(_gemm_fp8_kernel, (tiles, split_k),
        a_t,
        a_scale,
        w.view(torch.uint8),
        w_scale,
        out,
        partials,
        locks,
        q_t,
        qs_t,
        m,
        n,
        k,
        float(quant_eps),
        a_t.stride(0),
        a_t.stride(1),
        w.stride(0),
        w.stride(1),
        asm,
        ask,
        wsn,
        wsk,
        out.stride(0),
        out.stride(1),
        q_t.stride(0),
        qsm,
        qsk,
        *split_args,
        A_KIND=a_kind,
        SCALE_BLOCKWISE=blockwise,
        DOT_DTYPE=dot_dtype(fp8_dtype, a.device, target),
        FP8_MAX=formats.fp8_max(fp8_dtype),
        FP8_FNUZ=fp8_dtype == torch.float8_e4m3fnuz,
        FP8_NATIVE=_fp8_native_cached(fp8_dtype, a.device),
        EPS_ON_SCALE=bool(eps_on_scale),
        APPLY_RECIPROCAL=bool(apply_reciprocal),
        WRITE_QUANT=q_out is not None,
        EVEN_K=k % bk == 0,
        EXACT_CASTS=interpreting(),
        CONST_DIV_AS_MUL=a.device.type != "cpu",
        BLOCK_M=bm,
        BLOCK_N=bn,
        BLOCK_K=bk,
        GROUP_M=cfg["GROUP_M"],
        SPLIT_K=split_k,
        NUM_K_TILES=_cdiv(k, bk),
        TILES_PER_SPLIT=tiles_per_split,
        SWAP_AB=bool(cfg["SWAP_AB"]),
        QUANT_ROWS=prequant_rows(a_kind, m, bm),
        **split_meta,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )


def _check_runnable(t: torch.Tensor, name: str) -> None:
    if t.device.type == "cpu" and not interpreting():
        raise ValueError(f"{name}: a CPU tensor needs Triton's interpreter (TRITON_INTERPRET=1)")


@planned
def gemm_fp8(
    q: torch.Tensor,
    x_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    config: dict | None = None,
    target: str | None = None,
) -> torch.Tensor:
    """A8W8 GEMM (q · x_scale) @ (w · w_scale)ᵀ → (M, N) out_dtype; see the module docstring."""
    kind = check_gemm_fp8_args(q, x_scale, w, w_scale, out_dtype)
    _check_runnable(q, "q")
    m, n = q.shape[0], w.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=q.device)
    if m and n:
        _launch(
            q,
            x_scale,
            w,
            w_scale,
            out,
            a_kind=A_FP8,
            blockwise=kind == SCALE_BLOCK,
            fp8_dtype=q.dtype,
            config=config,
            target=target,
        )
    return out


def _gemm_fp8_into(
    q, x_scale, w, w_scale, out_dtype, d, widths, y, config, target, view_piece=-1
):
    """gemm_fp8 into `destinations(..)`: the split-cat's (out, c2) with y, else the pieces (piece
    `view_piece` laid out as the split's view)."""
    kind = check_gemm_fp8_args(q, x_scale, w, w_scale, out_dtype)
    _check_runnable(q, "q")
    outputs, dest = destinations(q, w.shape[0], d, widths, y, out_dtype, view_piece)
    if q.shape[0]:
        _launch(
            q, x_scale, w, w_scale, dest[0][0], a_kind=A_FP8, blockwise=kind == SCALE_BLOCK,
            fp8_dtype=q.dtype, dest=dest, config=config, target=target,
        )
    return outputs


@planned
def gemm_fp8_split_cat(
    q, x_scale, w, w_scale, d: int, s1: int, s2: int, y: torch.Tensor,
    *, config: dict | None = None, target: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cat([c1, y], -1), c2) of c1, c2 = split(gemm_fp8(q, ..).view(M, d, s1 + s2), [s1, s2],
    -1) in y's dtype, each tile written straight to its destination and y copied by the tiles
    (gemm_split_cat.split_epilogue)."""
    out_dtype = _split_cat_dtype(y)
    return _gemm_fp8_into(q, x_scale, w, w_scale, out_dtype, d, [s1, s2], y, config, target)


@planned
def gemm_fp8_split(
    q, x_scale, w, w_scale, d: int, sizes, out_dtype: torch.dtype = torch.bfloat16,
    view_piece: int = -1, *, config: dict | None = None, target: str | None = None,
) -> tuple[torch.Tensor, ...]:
    """The pieces of split(gemm_fp8(q, ..).view(M, d, sum(sizes)), sizes, -1), each contiguous
    except `view_piece` (the split's view, `gemm_split_cat_ref.piece_buffers`), written straight
    from the GEMM tiles (up to four)."""
    return _gemm_fp8_into(
        q, x_scale, w, w_scale, out_dtype, d, sizes, None, config, target, view_piece
    )


def _split_cat_dtype(y) -> torch.dtype:
    """A split-cat's output dtype: y's (the cat's pieces share one)."""
    if not isinstance(y, torch.Tensor):
        raise ValueError(f"y: expected an (M, d, S3) tensor, got {type(y).__name__}")
    return y.dtype


@planned
def gemm_a16w8(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    *,
    group_size: int = 0,
    quant_eps: float = 1e-10,
    eps_on_scale: bool = False,
    apply_reciprocal: bool = False,
    out_dtype: torch.dtype = torch.bfloat16,
    row_amax: str = "auto",
    return_quant: bool = False,
    config: dict | None = None,
    target: str | None = None,
):
    """Prequant GEMM: quant_fp8_ref(x) (per token, or 1×128 with group_size=128) in registers,
    then the FP8 GEMM with w (N, K) fp8 and its scales. Returns out, or (out, q, x_scale) with the
    in-kernel quant's bytes and scales when return_quant (a debug / test aid)."""
    _check_tensor("x", x, FLOAT_DTYPES, 2)
    _check_tensor("w", w, formats.FP8_DTYPES, 2)
    _check_tensor("w_scale", w_scale, (torch.float32,))
    _check_out_dtype(out_dtype)
    _check_runnable(x, "x")
    if group_size not in (0, FP8_BLOCK):
        raise ValueError(f"group_size: expected 0 (per token) or 128, got {group_size!r}")
    if row_amax not in ROW_AMAX_MODES:
        raise ValueError(f"row_amax: expected one of {ROW_AMAX_MODES}, got {row_amax!r}")
    m, k = x.shape
    fp8_dtype = w.dtype
    fp8_max = formats.fp8_max(fp8_dtype)
    if group_size and k % FP8_BLOCK:
        raise ValueError(f"x: K must be a multiple of 128 for group_size=128, got {k}")
    _check_devices({"x": x, "w": w, "w_scale": w_scale})
    n = w.shape[0]
    w_rowwise = is_rowwise_w_scale(w_scale, n)
    if w_rowwise == bool(group_size):
        raise ValueError(
            f"w_scale: shape {tuple(w_scale.shape)} does not pair with group_size={group_size} "
            "(per token needs a per-channel / tensorwise w_scale, 128 a 128×128 blockscale)"
        )
    # Validate w and w_scale by the A8W8 rule on (meta) stand-ins of the quant's outputs.
    num_scales = k // FP8_BLOCK if group_size else 1
    check_gemm_fp8_args(
        torch.empty((m, k), dtype=fp8_dtype, device="meta"),
        torch.empty((m, num_scales), device="meta"),
        w.to("meta"),
        w_scale.to("meta"),
        out_dtype,
    )
    x_scale_like = torch.empty((m, num_scales), dtype=torch.float32, device=x.device)
    out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    q_out = torch.empty((m, k), dtype=fp8_dtype, device=x.device) if return_quant else None
    scale_out = torch.empty_like(x_scale_like) if return_quant else None
    if group_size:
        a_kind, a_scale = A_GROUP, x_scale_like  # unused by the kernel: scales come from tiles
    elif row_amax == "kernel" or (row_amax == "auto" and k <= ROW_AMAX_IN_KERNEL_MAX_K):
        a_kind, a_scale = A_ROW_AMAX, x_scale_like
    else:
        a_kind = A_ROW_PRESCALED
        a_scale = torch.empty((m, 1), dtype=torch.float32, device=x.device)
        row_block = min(4096, 1 << (max(k, 16) - 1).bit_length())
        if m:
            launch(_row_scale_kernel, (m,),
                x,
                a_scale,
                m,
                k,
                x.stride(0),
                x.stride(1),
                float(quant_eps),
                FP8_MAX=fp8_max,
                EPS_ON_SCALE=bool(eps_on_scale),
                EXACT_CASTS=interpreting(),
                CONST_DIV_AS_MUL=x.device.type != "cpu",
                BLOCK_K=row_block,
                NUM_K_CHUNKS=_cdiv(k, row_block),
                num_warps=4,
            )
        if scale_out is not None:
            scale_out = a_scale
    if m and n:
        _launch(
            x,
            a_scale,
            w,
            w_scale,
            out,
            a_kind=a_kind,
            blockwise=bool(group_size),
            fp8_dtype=fp8_dtype,
            quant_eps=quant_eps,
            eps_on_scale=eps_on_scale,
            apply_reciprocal=apply_reciprocal,
            q_out=q_out,
            q_scale_out=None if a_kind == A_ROW_PRESCALED else scale_out,
            config=config,
            target=target,
        )
    if return_quant:
        return out, q_out, scale_out
    return out


__all__ = ["OUT_DTYPES", "gemm_a16w8", "gemm_fp8", "gemm_fp8_split", "gemm_fp8_split_cat"]
