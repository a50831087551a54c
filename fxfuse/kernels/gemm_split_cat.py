"""Fused GEMM → split → cat (SPEC §3): each GEMM tile is written straight to its destination.

    c       = (x @ wᵀ).view(M, D, S1 + S2)         x (M, K), w (N, K) (F.linear layout), N = D·(S1+S2)
    c1, c2  = split(c, [S1, S2], -1)
    out     = cat([c1, y], -1)                      y (M, D, S3), any strides (stride 0 for an expand)
    returns out (M, D, S1 + S3) contiguous and c2 (M, D, S2) laid out as the unfused graph's c2
    (the last S2 columns of each head of an (M, D, S1 + S2) buffer), dtype x.dtype.

GEMM column n of row m is (d, s) = divmod(n, S1 + S2); the epilogue sends s < S1 to out[m, d, s]
and s ≥ S1 to c2[m, d, s − S1]. In general the destinations are up to four "pieces" of widths
W0..W3 (the split sizes), piece i with row width LDi; gemm_split_cat uses piece 0 = out
(LD0 = S1 + S3) and piece 1 = c2, and programs past the GEMM grid copy y into out[:, :, S1:].
`gemm_split` is the same kernel with no copy: the pieces of split(c, sizes, -1), each contiguous.

Accumulation is fp32 (tl.dot), rounded once to x.dtype at the store. When every piece width is a
multiple of BLOCK_N / EPILOGUE_SUBTILES, each column sub-tile lies in one (d, piece) and is stored
as one contiguous block (vector stores); otherwise each column is scattered on its own.
Split-K (small M): fp32 partials (SPLIT_K, M, N) in a workspace, then a second kernel sums them in
a fixed order (deterministic, no atomics), does the same scatter and the y copy.

Head tiles (config PERSISTENT = 1, the sm90 table from M 129): when s1 == s2 and BLOCK_N == s1 + s2,
a tile is one head: a persistent grid (one program per SM) walks the tiles, x and w come in through
TMA descriptors, the tile's left half is TMA-stored into out[:, d, :s1] and its right half into
c2[:, d, :], and the same program copies that head's y slice into out[:, d, s1:]. The tile loop
and the K loop are flattened, so one tile's stores overlap the next tile's loads. It needs TMA
(NVIDIA sm90 or later; the interpreter runs it one tile per program) and 16-byte aligned rows;
any other call takes the tile kernel above with the same config.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from fxfuse.kernels import gemm_ref
from fxfuse.kernels import gemm_split_cat_ref as ref
from fxfuse.kernels._plans import launch, planned
from fxfuse.kernels.rms_norm_quant import _round_to
from fxfuse.runtime import launch_tables
from fxfuse.runtime.target import detect_target, interpreting

try:  # host-side TMA descriptors: triton >= 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: the head-tile kernel is never chosen
    TensorDescriptor = None

KERNEL = "gemm_split_cat"
MAX_PIECES = ref.MAX_PIECES  # the kernels' piece pointers p0..p3
DTYPES = (torch.bfloat16, torch.float16)
# A copy step moves about this many elements of y; a copy program does COPY_ITERS steps, so that
# copy programs (which take a GEMM-sized slot: same kernel, same shared memory) stay few. Fixed,
# not by M: a constexpr that varied with M would compile once per bucket.
COPY_STEP_ELEMENTS = 4096
COPY_ITERS = 4
MAX_BLOCK_S3 = 1024
# The head-tile grid in the interpreter: 0 runs one tile per program; a test sets a few programs
# to run the persistent tile loop (the GPU's grid is the SM count).
INTERPRETER_PROGRAMS = 0

# The head-tile kernel's FP8_SCALES: bf16 / fp16 operands, or e4m3fn with these scales.
FP8_NONE = tl.constexpr(0)
FP8_ROWWISE = tl.constexpr(1)  # x_scale (M,) or one, w_scale (N,) or one
FP8_BLOCK = tl.constexpr(2)  # x_scale (M, K/128), w_scale (N/128, K/128)

# Kernel arguments are grouped on lines by role (pointers, sizes, strides, meta-parameters).
# fmt: off


@triton.jit
def _cdiv(a, b):
    # Not tl.cdiv: in the interpreter it returns a 1-element tensor, which `range` rejects.
    return (a + b - 1) // b


@triton.jit
def _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of tile number `tile`: GROUP_M row blocks sweep the columns together, so
    w's tiles are reused from L2."""
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (tile // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile % num_pid_in_group) % group_size_m
    pid_n = (tile % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _store_columns(vals, dst_ptr, rows, mask, D, LD, lo, width, d, s):
    """Scatter columns whose s falls in [lo, lo + width) of one piece (row width LD)."""
    in_piece = mask & ((s >= lo) & (s < lo + width))[None, :]
    offsets = rows[:, None] * (D * LD) + (d * LD + s - lo)[None, :]
    tl.store(dst_ptr + offsets, vals, mask=in_piece)


@triton.jit
def _store_block(vals, dst_ptr, rows, row_mask, offs_sub, D, LD, lo, d, s0):
    """Store a sub-tile that lies inside one piece at one d: contiguous along the columns."""
    offsets = rows[:, None] * (D * LD) + (d * LD + s0 - lo) + offs_sub[None, :]
    tl.store(dst_ptr + offsets, vals, mask=row_mask[:, None])


@triton.jit
def _store_subtile(
    vals, n0, rows, row_mask,
    p0_ptr, p1_ptr, p2_ptr, p3_ptr,
    N, D, SW, W0, W1, W2, LD0, LD1, LD2, LD3,
    SUB_N: tl.constexpr, NUM_PIECES: tl.constexpr,
):
    offs_sub = tl.arange(0, SUB_N)
    d = n0 // SW
    s0 = n0 % SW
    lo1 = W0
    lo2 = W0 + W1
    lo3 = W0 + W1 + W2
    # Constexpr guards stay separate from the run-time tests (Triton has no `and` over tensors).
    if n0 < N:
        if s0 < lo1:
            _store_block(vals, p0_ptr, rows, row_mask, offs_sub, D, LD0, 0, d, s0)
        if NUM_PIECES > 1:  # noqa: SIM102
            if (s0 >= lo1) & (s0 < lo2):
                _store_block(vals, p1_ptr, rows, row_mask, offs_sub, D, LD1, lo1, d, s0)
        if NUM_PIECES > 2:  # noqa: SIM102
            if (s0 >= lo2) & (s0 < lo3):
                _store_block(vals, p2_ptr, rows, row_mask, offs_sub, D, LD2, lo2, d, s0)
        if NUM_PIECES > 3:  # noqa: SIM102
            if s0 >= lo3:
                _store_block(vals, p3_ptr, rows, row_mask, offs_sub, D, LD3, lo3, d, s0)


@triton.jit
def _store_tile(
    acc, offs_m, pid_n,
    p0_ptr, p1_ptr, p2_ptr, p3_ptr,
    M, N, D, SW, W0, W1, W2, LD0, LD1, LD2, LD3,
    BLOCK_N: tl.constexpr, NUM_PIECES: tl.constexpr, EPILOGUE_SUBTILES: tl.constexpr,
    EXACT_BF16: tl.constexpr,
):
    """Write an fp32 (BLOCK_M, BLOCK_N) GEMM tile to the pieces, rounded to their dtype
    (EXACT_BF16: nearest-even from the bits; the interpreter's fp32 → bf16 cast truncates)."""
    DTYPE: tl.constexpr = p0_ptr.dtype.element_ty
    if EXACT_BF16:  # rounded exactly first, the cast back is exact
        vals = _round_to(acc, DTYPE, True).to(DTYPE)
    else:
        vals = acc.to(DTYPE)
    rows = offs_m.to(tl.int64)
    row_mask = offs_m < M
    n_start = pid_n * BLOCK_N
    if EPILOGUE_SUBTILES == 1:
        _store_subtile(
            vals, n_start, rows, row_mask, p0_ptr, p1_ptr, p2_ptr, p3_ptr,
            N, D, SW, W0, W1, W2, LD0, LD1, LD2, LD3, BLOCK_N, NUM_PIECES,
        )
    elif EPILOGUE_SUBTILES == 2:
        # Columns [0, BLOCK_N/2) and [BLOCK_N/2, BLOCK_N) as two tiles (each inside one piece).
        halves = tl.permute(tl.reshape(vals, (vals.shape[0], 2, BLOCK_N // 2)), (0, 2, 1))
        left, right = tl.split(halves)
        _store_subtile(
            left, n_start, rows, row_mask, p0_ptr, p1_ptr, p2_ptr, p3_ptr,
            N, D, SW, W0, W1, W2, LD0, LD1, LD2, LD3, BLOCK_N // 2, NUM_PIECES,
        )
        _store_subtile(
            right, n_start + BLOCK_N // 2, rows, row_mask, p0_ptr, p1_ptr, p2_ptr, p3_ptr,
            N, D, SW, W0, W1, W2, LD0, LD1, LD2, LD3, BLOCK_N // 2, NUM_PIECES,
        )
    else:
        offs_n = n_start + tl.arange(0, BLOCK_N)
        d = offs_n // SW
        s = offs_n % SW
        mask = row_mask[:, None] & (offs_n < N)[None, :]
        _store_columns(vals, p0_ptr, rows, mask, D, LD0, 0, W0, d, s)
        if NUM_PIECES > 1:
            _store_columns(vals, p1_ptr, rows, mask, D, LD1, W0, W1, d, s)
        if NUM_PIECES > 2:
            _store_columns(vals, p2_ptr, rows, mask, D, LD2, W0 + W1, W2, d, s)
        if NUM_PIECES > 3:
            _store_columns(vals, p3_ptr, rows, mask, D, LD3, W0 + W1 + W2, SW, d, s)


@triton.jit
def _copy_y(
    copy_pid, y_ptr, out_ptr,
    M, D, S3, COL, LD,
    stride_ym, stride_yd, stride_ys,
    COPY_ROWS: tl.constexpr, BLOCK_S3: tl.constexpr, COPY_ITERS: tl.constexpr,
    COPY_COL_ITERS: tl.constexpr,
):
    """out[m, d, COL + s] = y[m, d, s] for COPY_ITERS blocks of COPY_ROWS rows r = m·D + d."""
    total_rows = M * D
    for i in range(COPY_ITERS):
        rows = (copy_pid * COPY_ITERS + i).to(tl.int64) * COPY_ROWS + tl.arange(0, COPY_ROWS)
        row_mask = rows < total_rows
        m = rows // D
        d = rows % D
        for j in range(COPY_COL_ITERS):
            offs_s = j * BLOCK_S3 + tl.arange(0, BLOCK_S3)
            mask = row_mask[:, None] & (offs_s < S3)[None, :]
            y_ptrs = (
                y_ptr
                + (m * stride_ym + d * stride_yd)[:, None]
                + offs_s[None, :].to(tl.int64) * stride_ys
            )
            vals = tl.load(y_ptrs, mask=mask)
            tl.store(out_ptr + rows[:, None] * LD + COL + offs_s[None, :], vals, mask=mask)


@triton.jit
def _copy_tile_heads(
    y_ptr, out_ptr, offs_m, n0, M, D, SW, S3, COL, LD,
    stride_ym, stride_yd, stride_ys,
    BLOCK_N: tl.constexpr, Y_HEADS: tl.constexpr, BLOCK_S3: tl.constexpr,
    Y_COL_ITERS: tl.constexpr,
):
    """out[m, d, COL + s] = y[m, d, s] for the tile's rows m and each head d whose first GEMM
    column d·SW lies in the tile's columns [n0, n0 + BLOCK_N): over the grid, every head once.
    Y_HEADS >= cdiv(BLOCK_N, SW), the most head starts a tile can hold."""
    rows = offs_m.to(tl.int64)
    row_mask = offs_m < M
    first = (n0 + SW - 1) // SW
    for h in tl.static_range(Y_HEADS):
        d = first + h
        if (d * SW < n0 + BLOCK_N) & (d < D):
            for j in tl.static_range(Y_COL_ITERS):
                offs_s = j * BLOCK_S3 + tl.arange(0, BLOCK_S3)
                mask = row_mask[:, None] & (offs_s < S3)[None, :]
                src = (
                    y_ptr
                    + (rows * stride_ym + d * stride_yd)[:, None]
                    + offs_s[None, :].to(tl.int64) * stride_ys
                )
                dst = out_ptr + rows[:, None] * (D * LD) + (d * LD + COL) + offs_s[None, :]
                tl.store(dst, tl.load(src, mask=mask), mask=mask)


@triton.jit
def split_epilogue(
    acc, offs_m, pid_n,
    p0_ptr, p1_ptr, p2_ptr, p3_ptr, y_ptr,
    M, N, D, SW, W0, W1, W2, LD0, LD1, LD2, LD3, S3,
    stride_ym, stride_yd, stride_ys,
    BLOCK_N: tl.constexpr, NUM_PIECES: tl.constexpr, EPILOGUE_SUBTILES: tl.constexpr,
    EXACT_CASTS: tl.constexpr, Y_HEADS: tl.constexpr, BLOCK_S3: tl.constexpr,
    Y_COL_ITERS: tl.constexpr,
):
    """The epilogue other GEMM kernels (FP8, MXFP4) take to write their fp32 tile straight into
    split pieces, and y's slice of each head that starts in the tile into piece 0 (after its
    first W0 columns). Arguments: `epilogue_args`."""
    _store_tile(
        acc, offs_m, pid_n, p0_ptr, p1_ptr, p2_ptr, p3_ptr,
        M, N, D, SW, W0, W1, W2, LD0, LD1, LD2, LD3,
        BLOCK_N, NUM_PIECES, EPILOGUE_SUBTILES, EXACT_CASTS,
    )
    if Y_HEADS > 0:
        _copy_tile_heads(
            y_ptr, p0_ptr, offs_m, pid_n * BLOCK_N, M, D, SW, S3, W0, LD0,
            stride_ym, stride_yd, stride_ys, BLOCK_N, Y_HEADS, BLOCK_S3, Y_COL_ITERS,
        )


@triton.jit
def _gemm_split_cat_kernel(
    # pointers: inputs, fp32 split-K workspace, the pieces (piece 0 also receives y)
    x_ptr, w_ptr, y_ptr, partial_ptr,
    p0_ptr, p1_ptr, p2_ptr, p3_ptr,
    # sizes: GEMM, the (D, SW) view of a row, piece widths and row widths, y's width
    M, N, K, D, SW, W0, W1, W2, LD0, LD1, LD2, LD3, S3,
    # strides (in elements)
    stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yd, stride_ys,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, K_ITERS: tl.constexpr, EVEN_K: tl.constexpr, DOT_IN_FP32: tl.constexpr,
    NUM_PIECES: tl.constexpr,
    EPILOGUE_SUBTILES: tl.constexpr,
    COPY_ROWS: tl.constexpr, BLOCK_S3: tl.constexpr, COPY_ITERS: tl.constexpr,
    COPY_COL_ITERS: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = _cdiv(M, BLOCK_M)
    num_pid_n = _cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    if pid < num_tiles * SPLIT_K:
        pid_k = pid // num_tiles
        tile = pid % num_tiles
        pid_m, pid_n = _grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)

        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        # Out-of-range rows / columns wrap around instead of being masked; their results are
        # never stored.
        offs_am = tl.max_contiguous(tl.multiple_of(offs_m % M, BLOCK_M), BLOCK_M).to(tl.int64)
        offs_bn = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N).to(tl.int64)
        # Split pid_k covers K_ITERS blocks of BLOCK_K from k_start (the last split may run past K).
        k_start = pid_k * (K_ITERS * BLOCK_K)
        offs_k = k_start + tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + offs_am[:, None] * stride_xm + offs_k[None, :] * stride_xk
        w_ptrs = w_ptr + offs_k[:, None] * stride_wk + offs_bn[None, :] * stride_wn

        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for i in range(K_ITERS):
            if EVEN_K:
                a = tl.load(x_ptrs)
                b = tl.load(w_ptrs)
            else:
                k_mask = (k_start + i * BLOCK_K + tl.arange(0, BLOCK_K)) < K
                a = tl.load(x_ptrs, mask=k_mask[None, :], other=0.0)
                b = tl.load(w_ptrs, mask=k_mask[:, None], other=0.0)
            if DOT_IN_FP32:
                # The interpreter's tl.dot multiplies bf16 as raw uint16 (triton 3.6); bf16 -> fp32
                # is exact and the products are exact in fp32, so this changes nothing else.
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
            x_ptrs += BLOCK_K * stride_xk
            w_ptrs += BLOCK_K * stride_wk

        if SPLIT_K == 1:
            _store_tile(
                acc, offs_m, pid_n, p0_ptr, p1_ptr, p2_ptr, p3_ptr,
                M, N, D, SW, W0, W1, W2, LD0, LD1, LD2, LD3,
                BLOCK_N, NUM_PIECES, EPILOGUE_SUBTILES, DOT_IN_FP32,
            )
        else:
            rows = offs_m.to(tl.int64)
            partial_ptrs = (
                partial_ptr + (pid_k * M + rows)[:, None] * N + offs_n[None, :]
            )
            mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
            tl.store(partial_ptrs, acc, mask=mask)
    else:
        _copy_y(
            pid - num_tiles * SPLIT_K, y_ptr, p0_ptr, M, D, S3, W0, LD0,
            stride_ym, stride_yd, stride_ys, COPY_ROWS, BLOCK_S3, COPY_ITERS, COPY_COL_ITERS,
        )


@triton.jit
def _split_k_reduce_kernel(
    # pointers
    partial_ptr, y_ptr, p0_ptr, p1_ptr, p2_ptr, p3_ptr,
    # sizes
    M, N, D, SW, W0, W1, W2, LD0, LD1, LD2, LD3, S3,
    # strides of y
    stride_ym, stride_yd, stride_ys,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
    NUM_PIECES: tl.constexpr, EPILOGUE_SUBTILES: tl.constexpr,
    COPY_ROWS: tl.constexpr, BLOCK_S3: tl.constexpr, COPY_ITERS: tl.constexpr,
    COPY_COL_ITERS: tl.constexpr, EXACT_BF16: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_n = _cdiv(N, BLOCK_N)
    num_tiles = _cdiv(M, BLOCK_M) * num_pid_n
    if pid < num_tiles:
        pid_m = pid // num_pid_n
        pid_n = pid % num_pid_n
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
        partial_ptrs = partial_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        # Fixed summation order over the splits: the result does not depend on scheduling.
        for split in range(SPLIT_K):
            acc += tl.load(partial_ptrs + split * M * N, mask=mask, other=0.0)
        _store_tile(
            acc, offs_m, pid_n, p0_ptr, p1_ptr, p2_ptr, p3_ptr,
            M, N, D, SW, W0, W1, W2, LD0, LD1, LD2, LD3,
            BLOCK_N, NUM_PIECES, EPILOGUE_SUBTILES, EXACT_BF16,
        )
    else:
        _copy_y(
            pid - num_tiles, y_ptr, p0_ptr, M, D, S3, W0, LD0,
            stride_ym, stride_yd, stride_ys, COPY_ROWS, BLOCK_S3, COPY_ITERS, COPY_COL_ITERS,
        )


@triton.jit
def _head_tile(
    tile_id, x_desc, w_desc, out_desc, c2_desc, y_ptr, out_ptr, xs_ptr, ws_ptr,
    M, S, LD0, LD1, S3, stride_ym, stride_yd, stride_ys,
    stride_xs, stride_xsk, stride_ws, stride_wsk, num_pid_m, num_pid_n,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    K_ITERS: tl.constexpr, BLOCK_S3: tl.constexpr, DOT_IN_FP32: tl.constexpr,
    FP8_SCALES: tl.constexpr, EXACT_BF16: tl.constexpr,
):
    pid_m, d = _grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M)  # a column block is a head
    m0 = pid_m * BLOCK_M
    rows = (m0 + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = d * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(K_ITERS):  # TMA fills the K tail and rows past M with zeros
        a = x_desc.load([m0, i * BLOCK_K])
        b = w_desc.load([d * BLOCK_N, i * BLOCK_K])
        if FP8_SCALES != FP8_NONE:  # e4m3fn bytes (the descriptors are over uint8 views)
            a = a.to(tl.float8e4nv, bitcast=True)
            b = b.to(tl.float8e4nv, bitcast=True)
        if FP8_SCALES == FP8_BLOCK:
            # BLOCK_K = 128: one scale group a K-tile, as the A8W8 blockscale kernel sums them.
            x_s = tl.load(xs_ptr + rows * stride_xs + i * stride_xsk, mask=rows < M, other=0.0)
            w_s = tl.load(ws_ptr + (cols // 128) * stride_ws + i * stride_wsk)
            acc += tl.dot(a, b.T) * (x_s[:, None] * w_s[None, :])
        elif DOT_IN_FP32:  # the interpreter's bf16 dot: see _gemm_split_cat_kernel
            acc = tl.dot(a.to(tl.float32), b.T.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b.T, acc)
    if FP8_SCALES == FP8_ROWWISE:  # (q · x_scale) @ (w · w_scale)ᵀ: the A8W8 kernel's order
        x_s = tl.load(xs_ptr + rows * stride_xs, mask=rows < M, other=0.0)
        w_s = tl.load(ws_ptr + cols * stride_ws)
        acc = acc * x_s[:, None] * w_s[None, :]
    if EXACT_BF16:
        vals = _round_to(acc, tl.bfloat16, True).to(tl.bfloat16)
    else:
        vals = acc.to(y_ptr.dtype.element_ty)
    left, right = tl.split(tl.permute(tl.reshape(vals, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
    out_desc.store([m0, d * LD0], left)  # rows past M are clipped by TMA
    c2_desc.store([m0, d * LD1 + (LD1 - S)], right)  # c2: the last S columns of LD1
    cols = tl.arange(0, BLOCK_S3)
    mask = (rows < M)[:, None] & (cols < S3)[None, :]
    y_ptrs = y_ptr + (rows * stride_ym + d * stride_yd)[:, None] + cols[None, :] * stride_ys
    out_ptrs = out_ptr + rows[:, None] * (num_pid_n * LD0) + (d * LD0 + S) + cols[None, :]
    tl.store(out_ptrs, tl.load(y_ptrs, mask=mask), mask=mask)


@triton.jit
def _head_tile_kernel(
    # TMA descriptors: x (M, K), w (N, K), out as (M, D·LD0), c2's buffer as (M, D·LD1); y and
    # out pointers; with FP8_SCALES, x_scale and w_scale (rowwise: (M,), (N,); blockscale:
    # (M, K/128), (N/128, K/128))
    x_desc, w_desc, out_desc, c2_desc, y_ptr, out_ptr, xs_ptr, ws_ptr,
    # sizes: S = s1 = s2, LD0 = s1 + S3 (out's row width), LD1: c2's (S, or 2·S: see destinations)
    M, S, LD0, LD1, S3,
    stride_ym, stride_yd, stride_ys, stride_xs, stride_xsk, stride_ws, stride_wsk,
    # meta-parameters; BLOCK_N = 2·S. NUM_PROGRAMS: the persistent grid (0: one tile per program)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    K_ITERS: tl.constexpr, NUM_D: tl.constexpr, BLOCK_S3: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, DOT_IN_FP32: tl.constexpr, FP8_SCALES: tl.constexpr,
    EXACT_BF16: tl.constexpr,
):
    num_pid_m = _cdiv(M, BLOCK_M)
    if NUM_PROGRAMS == 0:
        _head_tile(
            tl.program_id(0), x_desc, w_desc, out_desc, c2_desc, y_ptr, out_ptr, xs_ptr, ws_ptr,
            M, S, LD0, LD1, S3, stride_ym, stride_yd, stride_ys,
            stride_xs, stride_xsk, stride_ws, stride_wsk, num_pid_m, NUM_D,
            BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, K_ITERS, BLOCK_S3, DOT_IN_FP32, FP8_SCALES,
            EXACT_BF16,
        )
    else:
        for tile_id in tl.range(tl.program_id(0), num_pid_m * NUM_D, NUM_PROGRAMS, flatten=True):
            _head_tile(
                tile_id, x_desc, w_desc, out_desc, c2_desc, y_ptr, out_ptr, xs_ptr, ws_ptr,
                M, S, LD0, LD1, S3, stride_ym, stride_yd, stride_ys,
                stride_xs, stride_xsk, stride_ws, stride_wsk, num_pid_m, NUM_D,
                BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, K_ITERS, BLOCK_S3, DOT_IN_FP32, FP8_SCALES,
                EXACT_BF16,
            )


# fmt: on

CONFIG_FIELDS = (
    "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "PERSISTENT", "num_warps", "num_stages",
)  # fmt: skip


def _launch_config(
    m: int, n: int, k: int, config: dict | None, target: str | None, device: torch.device
) -> dict:
    target = target or detect_target(device)
    chosen = launch_tables.lookup(KERNEL, target, m=m, n=n, k=k)
    if config:
        unknown = sorted(set(config) - set(CONFIG_FIELDS))
        if unknown:
            raise ValueError(f"config: unknown keys {unknown}; expected some of {CONFIG_FIELDS}")
        chosen.update(config)
    for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        value = chosen[key]
        if value < 16 or value & (value - 1):
            raise ValueError(f"config: {key}={value} must be a power of two >= 16 (tl.dot)")
    if chosen.get("PERSISTENT", 0) not in (0, 1):
        raise ValueError(f"config: PERSISTENT={chosen['PERSISTENT']} must be 0 or 1")
    return chosen


def _epilogue_subtiles(block_n: int, widths: list[int]) -> int:
    """1 or 2 when every piece width is a multiple of the sub-tile width, else 0 (scatter)."""
    for subtiles in (1, 2):
        if all(width % (block_n // subtiles) == 0 for width in widths):
            return subtiles
    return 0


def _copy_meta(rows: int, s3: int) -> dict:
    block_s3 = min(triton.next_power_of_2(max(s3, 1)), MAX_BLOCK_S3)
    copy_rows = max(1, COPY_STEP_ELEMENTS // block_s3)
    programs = triton.cdiv(rows, copy_rows * COPY_ITERS) if s3 > 0 else 0
    return {
        "COPY_ROWS": copy_rows,
        "BLOCK_S3": block_s3,
        "COPY_ITERS": COPY_ITERS,
        "COPY_COL_ITERS": triton.cdiv(s3, block_s3),
        "programs": programs,
    }


# A split epilogue's y copy moves (BLOCK_M, BLOCK_S3) blocks: at most this many elements each.
EPILOGUE_COPY_ELEMENTS = 8192
NO_SPLIT = {
    "NUM_PIECES": 0, "EPILOGUE_SUBTILES": 0, "Y_HEADS": 0, "BLOCK_S3": 16, "Y_COL_ITERS": 0,
}


def epilogue_args(dest, out: torch.Tensor, block_m: int, block_n: int) -> tuple[tuple, dict]:
    """(run-time arguments, constexprs) of `split_epilogue` for a GEMM kernel that takes it.

    dest None: NUM_PIECES 0, the kernel stores its (M, N) tile to out as usual (the arguments are
    placeholders). Else dest = (pieces, widths, d, y): row m of the GEMM viewed as (d, sum(widths))
    and split along its last dim; piece i, with out = pieces[0], takes columns [lo_i, lo_i +
    widths[i]) of each head at its columns [0, widths[i]); pieces[0] also takes y (M, d, S3) (any
    strides, None for none) at columns [widths[0], widths[0] + S3). A piece is (M, d, ·) with
    strides (d·LD_i, LD_i, 1): contiguous, or the tail columns of a wider such buffer."""
    if dest is None:
        return (out, out, out, out, *([0] * 13)), NO_SPLIT
    pieces, widths, d, y = dest
    num = len(pieces)
    if not 1 <= num <= MAX_PIECES or len(widths) != num or pieces[0] is not out:
        raise ValueError(f"dest: expected 1 to {MAX_PIECES} pieces with widths, out first")
    sw = sum(widths)
    ptrs = list(pieces) + [out] * (MAX_PIECES - num)
    w_pad = list(widths) + [0] * (MAX_PIECES - num)
    for i, p in enumerate(pieces):
        if p.dim() != 3 or p.stride(2) != 1 or p.stride(0) != d * p.stride(1):
            raise ValueError(f"dest: piece {i} is not rows of (d, LD) with unit column stride")
    ld = [p.stride(1) for p in pieces] + [1] * (MAX_PIECES - num)
    s3 = 0 if y is None else y.shape[-1]
    block_s3 = min(
        triton.next_power_of_2(max(s3, 1)), max(16, EPILOGUE_COPY_ELEMENTS // block_m)
    )
    args = (
        *ptrs[1:], out if y is None else y,
        d, sw, w_pad[0], w_pad[1], w_pad[2], *ld, s3,
        *((0, 0, 0) if y is None else y.stride()),
    )  # fmt: skip
    meta = {
        "NUM_PIECES": num,
        "EPILOGUE_SUBTILES": _epilogue_subtiles(block_n, list(widths)),
        "Y_HEADS": triton.cdiv(block_n, sw) if s3 else 0,
        "BLOCK_S3": block_s3,
        "Y_COL_ITERS": triton.cdiv(s3, block_s3),
    }
    return args, meta


def destinations(
    q: torch.Tensor, n: int, d: int, widths, y, dtype: torch.dtype, view_piece: int = -1
):
    """(outputs, dest) for a GEMM of q's rows and n columns in dtype, validated; dest is
    `epilogue_args`'s. With y, the split-cat's (out, c2) (widths = [s1, s2]): out contiguous, c2
    laid out as the unfused graph's c2, the last s2 columns of an (M, d, s1 + s2) buffer
    (`split_cat_c2`). Without y, the pieces of the split by widths, each contiguous except
    `view_piece`, laid out as the split's view (`piece_buffers`)."""
    m = q.shape[0]
    if y is None:
        ref.check_sizes(n, d, widths, view_piece)
        pieces = ref.piece_buffers(m, d, list(widths), view_piece, dtype, q.device)
        return tuple(pieces), (pieces, list(widths), d, None)
    ref.check_cat_args(m, n, dtype, q.device, d, *widths, y, "q")
    out, c2 = ref.split_cat_buffers(m, d, *widths, y.shape[2], dtype, q.device)
    return (out, c2), ([out, c2], list(widths), d, y)


@triton.jit
def _copy_columns(
    src_ptr, dst_ptr, rows, row_ok, src_rows, src_cols, dst_rows,
    WIDTH: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """dst[r, :WIDTH] = src[r, :WIDTH] for a block of rows, BLOCK_C columns at a time; src_rows
    and dst_rows are the rows' element offsets, src_cols the column stride (1, or y's)."""
    for j in tl.static_range(triton.cdiv(WIDTH, BLOCK_C)):
        cols = j * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = row_ok[:, None] & (cols < WIDTH)[None, :]
        src = src_ptr + src_rows[:, None] + cols[None, :].to(tl.int64) * src_cols
        v = tl.load(src, mask=mask)
        tl.store(dst_ptr + dst_rows[:, None] + cols[None, :], v, mask=mask)


@triton.jit
def _cat_kernel(
    c_ptr, y_ptr, out_ptr,
    R, stride_ym, stride_yd, stride_ys,
    D: tl.constexpr, S1: tl.constexpr, SW: tl.constexpr, S3: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C1: tl.constexpr, BLOCK_C3: tl.constexpr,
):
    """out[r, :S1] = c[r, :S1] and out[r, S1:] = y[m, d, :] for rows r = m·D + d of c viewed as
    (M·D, SW) and out as (M·D, S1 + S3): the cat of the unfused spelling, in one pass. The sizes
    are a layer's constants: as constexprs the row offsets are known multiples of them (16-byte
    accesses), and c's and y's parts are separate tiles with no masked-off lanes between them."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < R
    out_rows = rows * (S1 + S3)
    _copy_columns(c_ptr, out_ptr, rows, row_ok, rows * SW, 1, out_rows, S1, BLOCK_C1)
    y_rows = (rows // D) * stride_ym + (rows % D) * stride_yd
    _copy_columns(y_ptr, out_ptr + S1, rows, row_ok, y_rows, stride_ys, out_rows, S3, BLOCK_C3)


# The cat kernel's tiles: CAT_ROWS rows of c's slice and y's, at most CAT_MAX_COLS columns a step.
# H100, CUDA graphs (benchmarks/experiments/split_cat_small_m.py, results/split_cat_small_m.json):
# kv_b (D 16, 128 | 64) M 128 / 512 / 1024 1.49 / 2.48 / 3.82 µs against 2.00 / 2.89 / 4.45 for
# the kernel before (16 rows of 256 masked columns) and 1.56 / 3.53 / 5.55 for Inductor's cat.
CAT_ROWS = 8
CAT_MAX_COLS = 256
CAT_WARPS = 4


def cat_pieces(c: torch.Tensor, d: int, s1: int, s2: int, y: torch.Tensor) -> torch.Tensor:
    """cat([c.view(M, d, s1 + s2)[..., :s1], y], -1) of a contiguous (M, N) GEMM result c, as one
    kernel (the split-cat ops' path after a vendor GEMM); contiguous, c's dtype."""
    m, s3 = c.shape[0], y.shape[2]
    out = torch.empty((m, d, s1 + s3), dtype=c.dtype, device=c.device)
    rows = m * d
    if rows:
        launch(_cat_kernel, (triton.cdiv(rows, CAT_ROWS),),
            c, y, out, rows, *y.stride(), D=d, S1=s1, SW=s1 + s2, S3=s3,
            BLOCK_R=CAT_ROWS, BLOCK_C1=min(triton.next_power_of_2(max(s1, 1)), CAT_MAX_COLS),
            BLOCK_C3=min(triton.next_power_of_2(max(s3, 1)), CAT_MAX_COLS), num_warps=CAT_WARPS,
        )  # fmt: skip
    return out


def _plan_uncached(m, n, k, d, widths, s3, config, target) -> dict:
    """Everything host-side about a launch that depends only on shapes and the config."""
    cfg = _launch_config(m, n, k, config, target, None)
    head = widths[0] if len(widths) == 2 and widths[0] == widths[1] else 0
    narrower = 2 * head in (64, 128) and cfg["BLOCK_N"] > 2 * head
    if not config and cfg.get("PERSISTENT") and s3 and narrower:
        # Head tiles are one head wide: the table's persistent rows, tuned on 256-wide kv_b
        # heads, take narrower heads (MiniCPM3's 64 + 64) one a tile, with the same rows and
        # K step, instead of 256-column tiles scattering each column.
        cfg = {**cfg, "BLOCK_N": 2 * head}
    block_m, block_n, block_k = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    split_k = cfg["SPLIT_K"]
    copy = _copy_meta(m * d, s3)
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    plan = {
        "cfg": cfg,
        "copy_meta": {key: value for key, value in copy.items() if key != "programs"},
        "copy_programs": copy["programs"],
        "epilogue": _epilogue_subtiles(block_n, list(widths)),
        "tiles": tiles,
        "split_k": split_k,
        # Loop trip counts are constexprs: the interpreter (triton 3.6, numpy 2.4) cannot run
        # `range` over a run-time bound. A layer's K is fixed: no extra compiles in practice.
        "k_iters": triton.cdiv(k, block_k * split_k),
        "even_k": k % (block_k * split_k) == 0,
    }
    if split_k > 1:
        # The reduce is memory-bound: fixed modest tiles whatever the GEMM's were.
        reduce_m, reduce_n = 16, min(block_n, 128)
        plan["reduce"] = (
            reduce_m,
            reduce_n,
            triton.cdiv(m, reduce_m) * triton.cdiv(n, reduce_n),
            _epilogue_subtiles(reduce_n, list(widths)),
        )
    return plan


# Per-call host work is what bounds this op below a few thousand tokens (one launch of a
# ~10 µs kernel): plans are cached per shape, and the table is not re-read per call.
_plan_cached = functools.lru_cache(maxsize=4096)(_plan_uncached)


def _plan(m, n, k, d, widths, s3, config, target, device) -> dict:
    target = target or detect_target(device)
    if config:
        return _plan_uncached(m, n, k, d, tuple(widths), s3, config, target)
    return _plan_cached(m, n, k, d, tuple(widths), s3, None, target)


@functools.lru_cache(maxsize=16)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _tma_rows_ok(t: torch.Tensor) -> bool:
    """A 2-D tensor a TMA descriptor can address: unit inner stride, 16-byte aligned base, rows."""
    size = t.element_size()
    return t.stride(1) == 1 and (t.stride(0) * size) % 16 == 0 and t.data_ptr() % 16 == 0


def _head_tiles_apply(x, w, d, widths, y, cfg) -> bool:
    """Whether the head-tile kernel takes this call (see the module docstring)."""
    if not cfg.get("PERSISTENT") or TensorDescriptor is None or y is None or len(widths) != 2:
        return False
    s = widths[0]
    if widths[1] != s or cfg["BLOCK_N"] != 2 * s or not 1 <= y.shape[-1] <= MAX_BLOCK_S3:
        return False
    # TMA: boxes of at most 256 per dimension, 16-byte box rows, 16-byte aligned row strides.
    size = x.element_size()
    if cfg["BLOCK_N"] > 256 or cfg["BLOCK_M"] > 256 or (s * size) % 16:
        return False
    if (d * (s + y.shape[-1]) * size) % 16 or not (_tma_rows_ok(x) and _tma_rows_ok(w)):
        return False
    if interpreting():
        return True
    if x.device.type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(x.device)[0] >= 9


def takes_head_tiles(
    x: torch.Tensor, w: torch.Tensor, d: int, widths, y: torch.Tensor | None
) -> bool:
    """Whether a call with these operands runs the head-tile kernel under the launch table."""
    m, k = x.shape
    if m == 0:
        return False
    s3 = 0 if y is None else y.shape[-1]
    cfg = _plan(m, w.shape[0], k, d, tuple(widths), s3, None, None, x.device)["cfg"]
    return cfg["SPLIT_K"] == 1 and _head_tiles_apply(x, w, d, list(widths), y, cfg)


def _launch_head_tiles(x, w, d, out, c2, y, cfg, k_iters, scales=None) -> None:
    """The head-tile kernel. scales = (kind, x_scale, w_scale): x and w are e4m3fn with those
    scales (`fp8_head_tiles`). c2 is (M, d, S) with row width LD1 = c2.stride(1) (S, or 2·S as
    the quantized split-cat ops lay it out)."""
    m, k = x.shape
    s = c2.shape[-1]
    s3 = y.shape[-1]
    ld1 = c2.stride(1)
    block_m, block_n, block_k = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    if scales is not None:
        x, w = x.view(torch.uint8), w.view(torch.uint8)
    x_desc = TensorDescriptor(x, [m, k], [x.stride(0), 1], [block_m, block_k])
    w_desc = TensorDescriptor(w, [w.shape[0], k], [w.stride(0), 1], [block_n, block_k])
    out2 = out.view(m, d * (s + s3))
    out_desc = TensorDescriptor(out2, [m, d * (s + s3)], [d * (s + s3), 1], [block_m, s])
    c2_base = c2.as_strided((m, d * ld1), (d * ld1, 1), c2.storage_offset() - (ld1 - s))
    c2_desc = TensorDescriptor(c2_base, [m, d * ld1], [d * ld1, 1], [block_m, s])
    tiles = triton.cdiv(m, block_m) * d
    if interpreting():
        programs = INTERPRETER_PROGRAMS
        grid = min(programs, tiles) if programs else tiles
    else:
        index = x.device.index if x.device.index is not None else torch.cuda.current_device()
        programs = _sm_count(index)
        grid = min(programs, tiles)
    kind, xs, ws = scales if scales is not None else (FP8_NONE, out, out)
    exact = interpreting() and out.dtype == torch.bfloat16
    launch(_head_tile_kernel, (grid,),
        x_desc, w_desc, out_desc, c2_desc, y, out, xs, ws,
        m, s, s + s3, ld1, s3,
        *y.stride(), *gemm_ref.scale_strides(xs), *gemm_ref.scale_strides(ws),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=cfg["GROUP_M"],
        K_ITERS=k_iters, NUM_D=d, BLOCK_S3=triton.next_power_of_2(s3),
        NUM_PROGRAMS=programs, DOT_IN_FP32=exact and scales is None, FP8_SCALES=kind,
        EXACT_BF16=exact, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )  # fmt: skip


# FP8 head tiles (`fp8_head_tiles`): the split-cat ops take them for rowwise / tensorwise scales
# from this M on, per target (TMA: NVIDIA sm90+). H100, DeepSeek kv_b (K 512, 16 heads of
# 128 | 128, rope 64), CUDA graphs, results/gemm_split_cat_quant_head_tiles_graph.json:
# M 1024 / 4096 / 8192 / 16384 10.8 / 34.7 / 62.2 / 116.4 us against 13.3 / 39.5 / 78.0 / 149.2
# (the last two from an earlier call) for `_scaled_mm` + cat_pieces and 14.0 / 41.9 / 80.2 /
# 147.2 for Inductor's compile of the unfused chain. Below M 1024 (results/split_cat_small_m.json,
# another H100): with 64-row tiles (FP8_HEAD_TILE_SMALL_M) M 256 / 512 7.43 / 7.76 us against
# 7.49 / 8.64 for `_scaled_mm` + the present cat_pieces and 7.49 / 9.37 for Inductor; at M 128
# 6.99 against 6.93 and 7.08, so not below 256.
# Blockscale is not dispatched here: its head tiles scale each K-tile's product outside the MMA
# (as the A8W8 blockscale kernel does) and took 169.8 us at M 8192 against 78.9 for the vendor
# path.
FP8_HEAD_TILES_MIN_M = {"sm90": 256}
# Of five configs timed there, the best at M 16384 (123.2 us; 124.9 with 3 stages). Blockscale
# takes BLOCK_K 128 whatever the config says (one scale group a K-tile).
FP8_HEAD_TILE_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "GROUP_M": 8,
                        "num_warps": 8, "num_stages": 4}  # fmt: skip
# Up to this M, 64-row tiles with 4 warps (M 512: 7.76 us against 9.83 with 128-row tiles; at
# M 1024 128-row tiles won, 10.61 against 12.68). At M 768 64-row tiles took 12.57 us, behind
# `_scaled_mm` + cat_pieces (11.92) and Inductor (11.83): 192 tiles are 1.45 waves on 132 SMs, so
# 128-row tiles (96, one wave) take M > 512 (results/split_cat_small_m_after.json).
FP8_HEAD_TILE_SMALL_M = 512
FP8_HEAD_TILE_SMALL = {"BLOCK_M": 64, "num_warps": 4}


def fp8_head_tile_config(m: int) -> dict:
    """The FP8 head-tile kernel's config for M rows."""
    if m <= FP8_HEAD_TILE_SMALL_M:
        return {**FP8_HEAD_TILE_CONFIG, **FP8_HEAD_TILE_SMALL}
    return dict(FP8_HEAD_TILE_CONFIG)


def fp8_head_tiles(q, x_scale, w, w_scale, d, s1, s2, y, config=None):
    """The split-cat of an A8W8 GEMM (rowwise / tensorwise, or 1×128 × 128×128 blockscale) by the
    head-tile kernel, or None where it does not apply (`_head_tiles_apply`; e4m3fn, bf16 out).
    Returns (out, c2) laid out as `destinations` lays them out."""
    kind = gemm_ref.check_gemm_fp8_args(q, x_scale, w, w_scale, y.dtype)
    cfg = {**fp8_head_tile_config(q.shape[0]), **(config or {}), "PERSISTENT": 1,
           "BLOCK_N": s1 + s2}  # fmt: skip
    if kind == gemm_ref.SCALE_BLOCK:
        cfg["BLOCK_K"] = gemm_ref.FP8_BLOCK
    if (
        q.dtype != torch.float8_e4m3fn or y.dtype != torch.bfloat16
        or not _head_tiles_apply(q, w, d, [s1, s2], y, cfg)
    ):  # fmt: skip
        return None
    (out, c2), _ = destinations(q, w.shape[0], d, [s1, s2], y, y.dtype)
    if q.shape[0]:
        k_iters = triton.cdiv(q.shape[1], cfg["BLOCK_K"])
        fp8 = FP8_BLOCK if kind == gemm_ref.SCALE_BLOCK else FP8_ROWWISE
        _launch_head_tiles(q, w, d, out, c2, y, cfg, k_iters, (fp8, x_scale, w_scale))
    return out, c2


def _check_gemm_inputs(x: torch.Tensor, w: torch.Tensor, d: int) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x: expected a 2-D (M, K) tensor, got {getattr(x, 'shape', type(x))}")
    if x.dtype not in DTYPES:
        raise ValueError(f"x: dtype must be one of {DTYPES}, got {x.dtype}")
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise ValueError(f"w: expected a 2-D (N, K) tensor, got {getattr(w, 'shape', type(w))}")
    if w.dtype != x.dtype:
        raise ValueError(f"w: dtype {w.dtype} differs from x's {x.dtype}")
    if w.device != x.device:
        raise ValueError(f"w: on {w.device}, x on {x.device}")
    if w.shape[1] != x.shape[1]:
        raise ValueError(f"w: K = {w.shape[1]} differs from x's K = {x.shape[1]}")
    if not isinstance(d, int) or d < 1:
        raise ValueError(f"d: expected a positive int, got {d!r}")


def _launch(
    x: torch.Tensor,
    w: torch.Tensor,
    d: int,
    pieces: list[torch.Tensor],
    widths: list[int],
    y: torch.Tensor | None,
    config: dict | None,
    target: str | None,
) -> None:
    """Run the GEMM into `pieces` (piece 0 also receives y at column widths[0] when given)."""
    m, k = x.shape
    n = w.shape[0]
    if m == 0:
        return
    num_pieces = len(pieces)
    s3 = 0 if y is None else y.shape[-1]
    plan = _plan(m, n, k, d, widths, s3, config, target, x.device)
    cfg, split_k = plan["cfg"], plan["split_k"]
    if split_k == 1 and _head_tiles_apply(x, w, d, widths, y, cfg):
        _launch_head_tiles(x, w, d, pieces[0], pieces[1], y, cfg, plan["k_iters"])
        return
    dst = pieces + [pieces[0]] * (MAX_PIECES - num_pieces)
    w_pad = widths + [0] * (MAX_PIECES - num_pieces)
    ld = [p.stride(1) for p in pieces] + [1] * (MAX_PIECES - num_pieces)
    y_arg = x if y is None else y
    y_strides = (0, 0, 0) if y is None else y.stride()
    sizes = (m, n, k, d, sum(widths), w_pad[0], w_pad[1], w_pad[2], *ld, s3)
    copy_meta = plan["copy_meta"]
    interp_bf16 = interpreting() and x.dtype == torch.bfloat16
    if split_k == 1:
        partial = x  # unused
        gemm_programs = plan["tiles"] + plan["copy_programs"]
    else:
        partial = torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
        gemm_programs = plan["tiles"] * split_k
    launch(_gemm_split_cat_kernel, (gemm_programs,),
        x, w, y_arg, partial, *dst,
        *sizes,
        x.stride(0), x.stride(1), w.stride(0), w.stride(1), *y_strides,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        GROUP_M=cfg["GROUP_M"], SPLIT_K=split_k, K_ITERS=plan["k_iters"], EVEN_K=plan["even_k"],
        DOT_IN_FP32=interp_bf16, NUM_PIECES=num_pieces,
        EPILOGUE_SUBTILES=plan["epilogue"], **copy_meta,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )  # fmt: skip
    if split_k > 1:
        reduce_m, reduce_n, reduce_tiles, reduce_epilogue = plan["reduce"]
        launch(_split_k_reduce_kernel, (reduce_tiles + plan["copy_programs"],),
            partial, y_arg, *dst,
            m, n, d, sum(widths), w_pad[0], w_pad[1], w_pad[2], *ld, s3,
            *y_strides,
            BLOCK_M=reduce_m, BLOCK_N=reduce_n, SPLIT_K=split_k, NUM_PIECES=num_pieces,
            EPILOGUE_SUBTILES=reduce_epilogue, **copy_meta,
            EXACT_BF16=interp_bf16, num_warps=4,
        )  # fmt: skip


@planned
def gemm_split_cat(
    x: torch.Tensor,
    w: torch.Tensor,
    d: int,
    s1: int,
    s2: int,
    y: torch.Tensor,
    *,
    config: dict | None = None,
    target: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cat([c1, y], -1), c2) of c1, c2 = split((x @ wᵀ).view(M, d, s1 + s2), [s1, s2], -1)."""
    _check_gemm_inputs(x, w, d)
    m = x.shape[0]
    ref.check_cat_args(m, w.shape[0], x.dtype, x.device, d, s1, s2, y, "x")
    out, c2 = ref.split_cat_buffers(m, d, s1, s2, y.shape[2], x.dtype, x.device)
    _launch(x, w, d, [out, c2], [s1, s2], y, config, target)
    return out, c2


@planned
def gemm_split(
    x: torch.Tensor,
    w: torch.Tensor,
    d: int,
    sizes: list[int] | tuple[int, ...],
    view_piece: int = -1,
    *,
    config: dict | None = None,
    target: str | None = None,
) -> tuple[torch.Tensor, ...]:
    """The pieces of split((x @ wᵀ).view(M, d, sum(sizes)), sizes, -1), each (M, d, size)
    contiguous except `view_piece` (laid out as the split's view of the GEMM output,
    `gemm_split_cat_ref.piece_buffers`), written straight from the GEMM tiles (up to four)."""
    _check_gemm_inputs(x, w, d)
    sizes = list(sizes)
    ref.check_sizes(w.shape[0], d, sizes, view_piece)
    pieces = ref.piece_buffers(x.shape[0], d, sizes, view_piece, x.dtype, x.device)
    _launch(x, w, d, pieces, sizes, None, config, target)
    return tuple(pieces)
