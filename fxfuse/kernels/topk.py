"""Top-k → sparse-block builds (SPEC §3): exact per-row top-k, with the page-table transform,
the MiniMax-M3 block table or the scatter into a mask fused into the write. Semantics: exactly
`topk_ref` (the set, the tie rule, the padding); see its docstring.

Keys. Every score becomes the order-preserving uint32 key of its fp32 value: sign bit flipped for
positives, all bits flipped for negatives, NaN → key(-inf), -0.0 → +0.0. Key 0 means "no element"
(the smallest real key, -inf's, is 0x007FFFFF); block-table forced blocks get 0xFFFFFFFE, above
+inf's 0xFF800000. Among equal keys the lower index wins.

Per row, one program (a persistent grid walks the rows), in three phases:
1. Stream. The row is read once, BLOCK elements at a time (the next chunk's load is issued before
   the current one is processed). Elements with key >= `lo` are appended, in index order, to a
   candidate buffer of CAP (key, index) pairs in a per-program scratch. `lo` is a lower bound of
   the row's final k-th key, so nothing dropped could be selected. When a chunk would overflow
   the buffer it is compacted first: radix passes (RADIX_BITS per pass, histograms over the
   buffer) find a key edge with k <= #(keys >= edge) <= KEEP_MAX = CAP - BLOCK, the buffer keeps
   those, and `lo` rises to the edge. If all 32 bits are resolved and too many keys still tie,
   it keeps exactly k (the equal ones of lowest index: the buffer is in index order) and `lo`
   becomes key + 1 — a later equal key has a higher index and can never win.
2. Select. Radix select over the buffer, shrinking: each pass histograms the current set, takes
   the pairs whose digit is above the k-th's straight to the output slots, keeps the k-th's bin
   as the next set (ping-pong buffers). When the full 32-bit key still ties, the passes go on
   over the index bits (lower index ranks higher), so the tie rule needs no ordering.
3. Finish. The ≤ k selected pairs are loaded as one K_PAD tile, sorted when asked (bitonic:
   (key desc, index asc) packed in a uint64, or by index for block tables), and the epilogue
   writes every one of the k slots: indices / page ids, block ids + page ids + ctx length, or
   the mask scatter (the mask row was filled with "masked" before phase 1).
Rows that fit a register tile (length <= the table's TILE_MAX, and not split): phases 1–2 are
one load of the whole row as a tile, its keys, and a descent to the k-th key in registers
(`_take_top`; then the index bits among the k-th key's ties); the selected pairs go to the
program's slots for phase 3, and a mask row is written once, densely (selected or masked per
column), instead of filled and then scattered. No candidate buffer, no passes over global
memory. A masked row (LEN_MASKED) selects among its read scores only when they number >= k
(the masked tail ranks after every one of them), takes the first k columns without a select
when they do not, and uses a half-size tile when its read scores fit one (a causal indexer's
early rows). The descent (TILE_SELECT) bisects by default: one count of the keys >= a trial value
per bit, stopping as soon as exactly k reach it; the radix descent's histograms pile shared-
memory atomics onto a few bins and measured 1.4-1.9x slower (results/topk_select.json,
2026-12-04 night). The multi-program path's finishing select over its candidates uses the same
descent.
Few long rows: phases 1–2 run per segment of a row (STAGE_SEGMENT, one program per segment,
exact top-k per segment into a pair area), then one program per row selects the top-k of the
union (STAGE_MERGE). Ties stay exact: the merge breaks them by index bits.

Many long rows (the multi-program path: index and page epilogues, full or per-row lengths,
row_starts; dispatch by the launch table's MULTI_MIN_LENGTH / MULTI_MIN_ELEMENTS, or forced by
`path=` / $FXFUSE_TOPK_PATH). The row path reads ~1.5 GB/s per program; this one reads each
score once in the common case, spread over one program per (row, segment):
0. Sample (one program per row): MULTI_SAMPLE scores in evenly spaced runs of 16; the estimate
   is the rank-r key of the sample with r = 1.5 k · sample / n (>= sample / 128), the exact
   k-th key when the row fits the sample. About 1.5 k of the row's keys reach it. Found by
   counts at interpolated points between the sample's extremes (MULTI_INTERP 2, the default;
   else a bisection down to ESTIMATE_LOW_BIT). The program also zeroes the row's other state
   words.
1. Collect (one program per segment of MULTI_ROWS x MULTI_BLOCK x MULTI_CHUNKS scores):
   stream the segment once, each column's candidates (keys >= the estimate, tested on the
   floats) kept as a bit mask in registers, then their indices placed in the row's candidate
   area (one atomic per segment reserves the slots; `_collect_segment`), and the maxima of the
   MULTI_BLOCK strided groups {j + c·BLOCK} stored. The segment that finishes last (a per-row
   ticket, acq_rel: every segment's stores are visible to it) finishes the row: k <= m <= CAP
   candidates (CAP, the select's tile: twice the estimate's expected count, a power of 2 in
   [2048, MULTI_CAP], at least 2 k; each count of the select costs in proportion to it) ->
   exact select (their scores reloaded by index, or, where the walk stored them beside the
   indices (MULTI_KEYS: a second kernel finishes, k >= 1024), read in order; made keys, counts
   at points interpolated between the estimate and the largest key (MULTI_INTERP >= 1, the
   default; with MULTI_INTERP 0 a bisection from below the bits the two share), then a
   bisection over the index bits among the k-th key's ties) and the epilogue; unsorted indices
   and pages go straight from the candidates' tile to their output slots (a cumsum of the
   selected), no pairs stored and reloaded. Where the table sets MULTI_FINISH_WARPS (rows
   longer than 32K on sm90), the rows are finished instead by a second kernel, one program per
   row, after the collect kernel: the collect programs then never hold an SM slot for a row's
   latency-bound select.
   Otherwise the estimate missed: the bound is the k-th largest group maximum (at least k
   groups, hence k scores, reach it: BLOCK >= k makes >= k groups non-empty) and the program
   retries the row itself (no second launch): it collects the keys >= the bound (for iid
   scores ~1.1-1.2 k) segment after segment and finishes the same way; more than CAP (a
   constant row, scores equal in most of their bits) takes the row path's exact one-program
   stream + select over the whole row. Rows no longer than k take that machinery at once
   (identity, or sorted, then padding).
Occupancy decides this path's speed more than its instruction count: at one 16-warp program
per SM (128 registers a thread) a row's finishing select idles its SM, so the sm90 table runs
8-warp programs under Triton's maxnreg (MULTI_MAXNREG), three per SM, and full segments stream
through Triton's pipeliner (MULTI_PREFETCH 3: async copies to shared memory, two chunks ahead);
few long rows take shorter segments, more programs a row (docs/benchmarks.md).
Why not an exact histogram of the top 11 bits in a first pass: tl.histogram lowers to warp
ballots plus one popcount per bin per 32 lanes, ~8 warp instructions per score for 2048 bins
(~250 us at 256 x 128K), and two full reads are 64 us at 4.25 TB/s, the bar itself. Row groups
for L2 reuse are unneeded while one read suffices; rows are launched in groups only to bound
the scratch (MULTI_SCRATCH_BYTES). Per-row state is zeroed each call (by the sample kernel,
or the launcher without an estimate), so CUDA-graph replays start clean; no host sync on data.

Layouts: scores (R, L) any strides; lengths / row_starts / row_to_batch / positions (R,) or
(Q,) int32 / int64; page_table (B, P) int32 / int64, any strides. Outputs int32 (R, k), block
pages (R, k·ppb), ctx (R,); masks (R, L·block_size) bool or float, any two values (stored as bit
patterns). A masked row (LEN_MASKED: a graph that set the scores past lengths[r] to -inf before
its top-k) spans all L columns but reads only the first lengths[r]; the rest rank as -inf.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from fxfuse.kernels import topk_ref
from fxfuse.kernels._plans import launch, planned
from fxfuse.runtime import launch_tables
from fxfuse.runtime.target import TARGETS, detect_target, interpreting

# fmt: off
# (Kernel arguments stay grouped by role, as in the Triton tutorials.)

STAGE_ROW = tl.constexpr(0)        # whole rows: stream, select, epilogue
STAGE_SEGMENT = tl.constexpr(1)    # split rows, pass 1: exact top-k per segment into the pair area
STAGE_MERGE = tl.constexpr(2)      # split rows, pass 2: top-k of each row's segment results

LEN_FULL = tl.constexpr(0)         # every row is L long
LEN_ARRAY = tl.constexpr(1)        # lengths[r]
LEN_POSITIONS = tl.constexpr(2)    # block tables: last eligible block = positions[q] >> LOG2_BLOCK
LEN_MASKED = tl.constexpr(3)       # L long, columns from lengths[r] on rank as -inf (a masked row)

EPI_INDICES = tl.constexpr(0)
EPI_PAGES = tl.constexpr(1)
EPI_BLOCKS = tl.constexpr(2)
EPI_MASK = tl.constexpr(3)
EPI_PAIRS = tl.constexpr(4)        # STAGE_SEGMENT's output

SORT_NONE = tl.constexpr(0)
SORT_VALUE = tl.constexpr(1)       # values descending, lower index first among equals
SORT_INDEX = tl.constexpr(2)       # indices ascending (block tables)

FORCED_KEY = tl.constexpr(0xFFFFFFFE)
NEG_INF_KEY = tl.constexpr(0x007FFFFF)  # _ordered_key(-inf)
INDEX_MASK = tl.constexpr(0x7FFFFFFF)  # tie passes rank by INDEX_MASK - index: lower index higher
INDEX_BITS = tl.constexpr(31)

# The multi-program path (module docstring, "Many long rows").
# Per-row state words (int32, zeroed each call).
ST_ESTIMATE = tl.constexpr(0)      # the sample estimate (a key)
ST_COUNT = tl.constexpr(1)         # candidates >= the estimate, over the row's segments
ST_TICKET = tl.constexpr(2)        # segments done
ST_BOUND = tl.constexpr(3)         # the group-max bound (a key) of a retried row
ST_RETRY = tl.constexpr(4)         # 1: the estimate missed and the row was retried
ST_RETRY_COUNT = tl.constexpr(5)   # candidates >= the bound
STATE_WORDS = tl.constexpr(8)
SELECT_BITS = tl.constexpr(5)      # 32-bin histograms: the fewest ballots per resolved bit
# The register-tile select (`_take_top`): its descent to the k-th key.
SELECT_RADIX = tl.constexpr(0)     # RADIX_BITS-digit histograms (tl.histogram)
SELECT_BISECT = tl.constexpr(1)    # one count per bit, stopping at an exact k
# The multi path's finishing select only (MULTI_INTERP 1): counts at points interpolated
# between a bracket's ends (`_interp_edge`); its sample estimate still bisects.
SELECT_INTERP = tl.constexpr(2)
# MULTI_INTERP 2, the default: the sample estimate too (`_sample_edge`).
SELECT_INTERP_SAMPLE = tl.constexpr(3)
# `_interp_edge`'s interpolated counts before it halves the bracket instead (a bound on the
# worst case: at most this plus 32 counts).
INTERP_STEPS = tl.constexpr(16)
# Sampled estimates by bisection resolve the key's bits down to this one: sign, exponent and 7
# mantissa bits, a value within 1 % below the sample's rank-r score.
ESTIMATE_LOW_BIT = tl.constexpr(16)
HALF_TILE_MIN = tl.constexpr(1024)  # masked rows take a half tile from this size on
FALLBACK_BLOCK = tl.constexpr(1024)  # chunk of the whole-row fallback (the row path's machinery)
SAMPLE_SECTOR = tl.constexpr(16)   # consecutive scores per sample position (one 64 B line of fp32)


# ---------------------------------------------------------------------------------------------
# keys, digits, bins


@triton.jit
def _ordered_key(x, valid):
    """uint32 key of each score (0 where not valid); see the module docstring."""
    return tl.where(valid, _score_key(x), 0)


@triton.jit
def _score_key(x):
    """uint32 key of each score, every one taking part; see the module docstring."""
    if x.dtype == tl.bfloat16:
        bits = x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16  # exact widening
    else:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
    magnitude = bits & 0x7FFFFFFF
    bits = tl.where(magnitude > 0x7F800000, 0xFF800000, bits)  # NaN -> -inf
    bits = tl.where(magnitude == 0, 0, bits)  # -0.0 -> +0.0
    # `^ 0xFFFFFFFF`, not `~`: the interpreter cannot invert a uint32.
    return tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)


@triton.jit
def _row_keys(x, offs, idx, valid, n_load, last, n_init, n_local, FORCED: tl.constexpr):
    """Keys of a row window's elements offs (row indices idx): elements n_load <= offs < n are
    not read and rank as -inf; with FORCED (block tables) the first n_init and last n_local
    blocks up to `last` get FORCED_KEY."""
    key = _ordered_key(x, valid)
    key = tl.where(valid & (offs >= n_load), NEG_INF_KEY, key)
    if FORCED:
        forced = valid & ((idx < n_init) | (idx > last - n_local))
        key = tl.where(forced, FORCED_KEY, key)
    return key


@triton.jit
def _pick_bin(hist, need, NUM_BINS: tl.constexpr):
    """The bin b holding the need-th largest element: (b, #above b, #in b); b = -1 if fewer."""
    bins = tl.arange(0, NUM_BINS)
    at_or_above = tl.cumsum(hist, 0, reverse=True)
    b = tl.sum((at_or_above >= need).to(tl.int32), 0) - 1
    in_bin = tl.sum(tl.where(bins == b, hist, 0), 0)
    above = tl.sum(tl.where(bins == b, at_or_above, 0), 0) - in_bin
    return b, above, in_bin


@triton.jit
def _append(keys_ptr, idx_ptr, base, count, key, idx, sel):
    """Store the selected pairs at base + count + (their rank); returns the new count."""
    sel32 = sel.to(tl.int32)
    pos = base + count + tl.cumsum(sel32, 0) - 1
    tl.store(keys_ptr + pos, key.to(tl.int32, bitcast=True), mask=sel)
    tl.store(idx_ptr + pos, idx, mask=sel)
    return count + tl.sum(sel32, 0)


# ---------------------------------------------------------------------------------------------
# phase 1: stream a row window into the candidate buffer


@triton.jit
def _compact(
    keys_ptr, idx_ptr, src, dst, count, lo, k,
    CAP: tl.constexpr, BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr,
):
    """Shrink the buffer at src (count > KEEP_MAX pairs, index order) into dst; returns the new
    count and the new lower bound."""
    NUM_BINS: tl.constexpr = 1 << RADIX_BITS
    KEEP_MAX: tl.constexpr = CAP - BLOCK
    offs0 = tl.arange(0, BLOCK)
    need = k
    kept = count
    s = 32
    prefix = tl.full((), 0, tl.uint32)  # the top 32 - s bits of the k-th key
    while (kept > KEEP_MAX) & (s > 0):
        s_next = tl.maximum(s - RADIX_BITS, 0)
        digit_mask = (1 << (s - s_next)) - 1  # bits [s_next, s) of a key
        hist = tl.zeros((NUM_BINS,), tl.int32)
        start = 0
        while start < count:
            offs = start + offs0
            key = tl.load(keys_ptr + src + offs, mask=offs < count, other=0)
            key = key.to(tl.uint32, bitcast=True)
            # tl.where, not `scalar | tensor`: the interpreter (triton 3.9) widens a broadcast
            # scalar bool to int32, which a load / store mask rejects.
            match = (offs < count) & tl.where(s >= 32, True, (key >> tl.minimum(s, 31)) == prefix)
            digit = ((key >> s_next) & digit_mask).to(tl.int32)
            hist += tl.histogram(digit, NUM_BINS, mask=match)
            start += BLOCK
        b, above, in_bin = _pick_bin(hist, need, NUM_BINS)
        need -= above
        kept = (k - need) + in_bin
        prefix = (prefix << (s - s_next)) | b.to(tl.uint32)
        s = s_next
    # Still too many after all 32 bits: `prefix` is the k-th key and its ties keep the `need`
    # of lowest index. Otherwise keep every key >= the edge.
    exact = kept > KEEP_MAX
    edge = tl.where(exact, prefix + 1, prefix << s)
    tie = tl.where(exact, prefix, 0)  # no stored key is 0
    take_ties = tl.where(exact, need, 0)
    new_count = 0
    ties_seen = 0
    start = 0
    while start < count:
        offs = start + offs0
        valid = offs < count
        key = tl.load(keys_ptr + src + offs, mask=valid, other=0).to(tl.uint32, bitcast=True)
        idx = tl.load(idx_ptr + src + offs, mask=valid, other=0)
        is_tie = valid & (key == tie)
        tie_rank = ties_seen + tl.cumsum(is_tie.to(tl.int32), 0) - 1
        sel = valid & ((key >= edge) | (is_tie & (tie_rank < take_ties)))
        new_count = _append(keys_ptr, idx_ptr, dst, new_count, key, idx, sel)
        ties_seen += tl.sum(is_tie.to(tl.int32), 0)
        start += BLOCK
    return new_count, tl.maximum(lo, edge)


@triton.jit
def _stream(
    scores_ptr, row_off, stride_sl, n, n_load, idx_base, keys_ptr, idx_ptr, buf0, buf1, k,
    last, n_init, n_local,
    FORCED: tl.constexpr, CAP: tl.constexpr, BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr,
):
    """Candidates of scores[row_off + i·stride_sl], i < n (indices idx_base + i) into a buffer;
    elements n_load <= i < n are not read and rank as -inf. Returns (count, its offset, the other
    buffer's offset)."""
    offs0 = tl.arange(0, BLOCK)
    count = 0
    lo = tl.full((), 1, tl.uint32)  # every real key is >= 1
    src = buf0
    dst = buf1
    x_next = tl.load(scores_ptr + row_off + offs0 * stride_sl, mask=offs0 < n_load, other=0.0)
    start = 0
    while start < n:
        offs = start + offs0
        valid = offs < n
        x = x_next
        # Issue the next chunk's load before this chunk's work: it overlaps it.
        offs_next = offs + BLOCK
        x_next = tl.load(
            scores_ptr + row_off + offs_next * stride_sl, mask=offs_next < n_load, other=0.0
        )
        idx = idx_base + offs
        key = _row_keys(x, offs, idx, valid, n_load, last, n_init, n_local, FORCED)
        cand = key >= lo
        n_cand = tl.sum(cand.to(tl.int32), 0)
        if count + n_cand > CAP:
            tl.debug_barrier()  # the buffer's stores by every thread land before it is read
            count, lo = _compact(keys_ptr, idx_ptr, src, dst, count, lo, k, CAP, BLOCK, RADIX_BITS)
            src, dst = dst, src
            cand = key >= lo
        count = _append(keys_ptr, idx_ptr, src, count, key, idx, cand)
        start += BLOCK
    return count, src, dst


# ---------------------------------------------------------------------------------------------
# phase 2: exact radix select


@triton.jit
def _select(
    keys_ptr, idx_ptr, src, alt, out, m, k,
    BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr,
):
    """Top-k of the m pairs at src (key 0 = absent) into slots out ..; returns how many (<= k).
    src and alt (capacity >= m) are both overwritten."""
    NUM_BINS: tl.constexpr = 1 << RADIX_BITS
    offs0 = tl.arange(0, BLOCK)
    need = k
    n_out = 0
    s = 32
    by_index = 0  # 0: key bits, 1: (tie) index bits
    cur = src
    nxt = alt
    active = m >= 0
    while active:
        tl.debug_barrier()  # the set was written by other threads
        s_next = tl.maximum(s - RADIX_BITS, 0)
        digit_mask = (1 << (s - s_next)) - 1  # bits [s_next, s) of the ranked value
        hist = tl.zeros((NUM_BINS,), tl.int32)
        if m > need:  # otherwise every present pair is taken: b stays -1
            start = 0
            while start < m:
                offs = start + offs0
                key = tl.load(keys_ptr + cur + offs, mask=offs < m, other=0)
                key = key.to(tl.uint32, bitcast=True)
                idx = tl.load(idx_ptr + cur + offs, mask=offs < m, other=0)
                # Tie passes rank 0x7FFFFFFF - index (= index ^ 0x7FFFFFFF): lower index higher.
                v = tl.where(by_index != 0, (idx ^ 0x7FFFFFFF).to(tl.uint32), key)
                digit = ((v >> s_next) & digit_mask).to(tl.int32)
                hist += tl.histogram(digit, NUM_BINS, mask=key != 0)
                start += BLOCK
        b, above, in_bin = _pick_bin(hist, need, NUM_BINS)
        final = (b < 0) | (above + in_bin == need) | ((by_index != 0) & (s_next == 0))
        kept = 0
        start = 0
        while start < m:
            offs = start + offs0
            key = tl.load(keys_ptr + cur + offs, mask=offs < m, other=0).to(tl.uint32, bitcast=True)
            idx = tl.load(idx_ptr + cur + offs, mask=offs < m, other=0)
            v = tl.where(by_index != 0, (idx ^ 0x7FFFFFFF).to(tl.uint32), key)
            digit = ((v >> s_next) & digit_mask).to(tl.int32)
            present = key != 0
            in_b = digit == b
            take = present & ((digit > b) | tl.where(final, in_b, False))
            n_out = _append(keys_ptr, idx_ptr, out, n_out, key, idx, take)
            keep = present & tl.where(final, False, in_b)
            kept = _append(keys_ptr, idx_ptr, nxt, kept, key, idx, keep)
            start += BLOCK
        need = k - n_out
        m = kept
        cur, nxt = nxt, cur
        by_index = tl.where(s_next == 0, 1, by_index)
        s = tl.where(s_next == 0, INDEX_BITS, s_next)
        active = ~final
    return n_out


# ---------------------------------------------------------------------------------------------
# phase 3: sort and epilogues


@triton.jit
def _page_tokens(idx, valid, pad, row, row64, page_table_ptr, row_to_batch_ptr, pt_cols,
                 stride_ptb, stride_ptp, HAS_ROW_TO_BATCH: tl.constexpr,
                 LOG2_PAGE: tl.constexpr):  # fmt: skip
    """The page transform of valid row-local indices (pad elsewhere, and past the table)."""
    batch = row64
    if HAS_ROW_TO_BATCH:
        batch = tl.load(row_to_batch_ptr + row).to(tl.int64)
    page = idx >> LOG2_PAGE
    # A negative batch (torch would index from the end) reads nothing: padding, never memory
    # before the table.
    ok = valid & (page < pt_cols) & (batch >= 0)
    phys = tl.load(page_table_ptr + batch * stride_ptb + page * stride_ptp, mask=ok,
                   other=0).to(tl.int32)  # fmt: skip
    token = (phys << LOG2_PAGE) | (idx & ((1 << LOG2_PAGE) - 1))
    return tl.where(ok, token, pad)


@triton.jit
def _finish(
    keys_ptr, idx_ptr, out_slots, n_sel, k, pad, row, row64, item, p, last,
    out_ptr, pages_ptr, ctx_ptr, page_table_ptr, row_to_batch_ptr, pt_cols,
    stride_or, stride_pr, stride_ptb, stride_ptp,
    EPILOGUE: tl.constexpr, SORT: tl.constexpr, HAS_ROW_TO_BATCH: tl.constexpr,
    LOG2_PAGE: tl.constexpr, LOG2_BLOCK: tl.constexpr, PAGES_PER_BLOCK: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr, MASK_REPEAT: tl.constexpr, MASK_SELECTED: tl.constexpr,
    K_PAD: tl.constexpr, MASK_FINITE: tl.constexpr = False,
):
    tl.debug_barrier()  # the selected slots were written by other threads
    offs = tl.arange(0, K_PAD)
    valid = offs < n_sel
    slot_ok = offs < k
    key = tl.load(keys_ptr + out_slots + offs, mask=valid, other=0).to(tl.uint32, bitcast=True)
    idx = tl.load(idx_ptr + out_slots + offs, mask=valid, other=0)
    if SORT == SORT_VALUE:
        # (key desc, index asc) as one uint64; absent slots pack to 0 and sort last.
        low = (idx ^ 0x7FFFFFFF).to(tl.uint32).to(tl.uint64)
        packed = tl.where(valid, (key.to(tl.uint64) << 32) | low, 0)
        packed = tl.sort(packed, descending=True)
        key = (packed >> 32).to(tl.uint32)
        idx = ((packed & 0xFFFFFFFF).to(tl.uint32) ^ 0x7FFFFFFF).to(tl.int32)
    elif SORT == SORT_INDEX:
        idx = tl.sort(tl.where(valid, idx, INDEX_MASK))

    out_row = out_ptr + row64 * stride_or
    if EPILOGUE == EPI_INDICES:
        tl.store(out_row + offs, tl.where(valid, idx, pad), mask=slot_ok)
    elif EPILOGUE == EPI_PAGES:
        token = _page_tokens(
            idx, valid, pad, row, row64, page_table_ptr, row_to_batch_ptr, pt_cols, stride_ptb,
            stride_ptp, HAS_ROW_TO_BATCH, LOG2_PAGE,
        )
        tl.store(out_row + offs, token, mask=slot_ok)
    elif EPILOGUE == EPI_BLOCKS:
        tl.store(out_row + offs, tl.where(valid, idx, -1), mask=slot_ok)
        if PAGES_PER_BLOCK > 0:
            PPB_PAD: tl.constexpr = triton.next_power_of_2(PAGES_PER_BLOCK)
            j = tl.arange(0, PPB_PAD)[None, :]
            head = row % NUM_KV_HEADS
            page_ids = idx[:, None] * (PAGES_PER_BLOCK * NUM_KV_HEADS) + j * NUM_KV_HEADS + head
            tl.store(
                pages_ptr + row64 * stride_pr + offs[:, None] * PAGES_PER_BLOCK + j,
                tl.where(valid[:, None], page_ids, -1),
                mask=slot_ok[:, None] & (j < PAGES_PER_BLOCK),
            )
        # The tail block `last` holds p % block + 1 keys; every other kept block is full.
        tail = tl.sum((valid & (idx == last)).to(tl.int32), 0)
        block: tl.constexpr = 1 << LOG2_BLOCK
        ctx = block * (n_sel - tail) + tail * ((p & (block - 1)) + 1)
        tl.store(ctx_ptr + row, ctx)
    elif EPILOGUE == EPI_MASK:
        REPEAT_PAD: tl.constexpr = triton.next_power_of_2(MASK_REPEAT)
        j = tl.arange(0, REPEAT_PAD)[None, :]
        selected = tl.full((K_PAD, REPEAT_PAD), MASK_SELECTED, out_ptr.dtype.element_ty)
        marked = valid
        if MASK_FINITE:  # a selected -inf (or NaN) score stays masked
            marked = marked & (key != NEG_INF_KEY)
        tl.store(
            out_row + idx[:, None] * MASK_REPEAT + j, selected,
            mask=marked[:, None] & (j < MASK_REPEAT),
        )
    elif EPILOGUE == EPI_PAIRS:
        # STAGE_SEGMENT: k slots per (row, segment) at item·k of the pair area (offset 0).
        tl.store(keys_ptr + item * k + offs, tl.where(valid, key, 0).to(tl.int32, bitcast=True),
                 mask=slot_ok)
        tl.store(idx_ptr + item * k + offs, idx, mask=slot_ok)


# ---------------------------------------------------------------------------------------------
# kernel


@triton.jit
def _mask_columns(out_ptr, row64, stride_or, cols, take, length, MASK_REPEAT: tl.constexpr,
                  MASK_FILL: tl.constexpr, MASK_SELECTED: tl.constexpr):
    """Mask columns `cols` of a row (those < length), each MASK_REPEAT wide: selected where
    `take`, masked elsewhere."""
    REPEAT_PAD: tl.constexpr = triton.next_power_of_2(MASK_REPEAT)
    j = tl.arange(0, REPEAT_PAD)[None, :]
    value = tl.where(take[:, None], MASK_SELECTED, MASK_FILL)
    tl.store(
        out_ptr + row64 * stride_or + cols[:, None] * MASK_REPEAT + j,
        value.to(out_ptr.dtype.element_ty),
        mask=(cols < length)[:, None] & (j < MASK_REPEAT),
    )


@triton.jit
def _tile_row(
    scores_ptr, row_off, stride_sl, n, n_load, k, last, n_init, n_local, row64, length, out_ptr,
    stride_or, keys_ptr, idx_ptr, out_slots,
    LENGTHS: tl.constexpr, EPILOGUE: tl.constexpr, MASK_REPEAT: tl.constexpr,
    MASK_FILL: tl.constexpr, MASK_SELECTED: tl.constexpr, T: tl.constexpr, T_BITS: tl.constexpr,
    RADIX_BITS: tl.constexpr, SELECT: tl.constexpr, MASK_FINITE: tl.constexpr = False,
):
    """A row's first T columns as one register tile (n <= T, or a masked row whose top k lie in
    them): its keys, the exact select, and the mask columns [0, T) or the selected pairs in the
    program's slots."""
    offs = tl.arange(0, T)
    valid = offs < n
    x = tl.load(scores_ptr + row_off + offs * stride_sl, mask=offs < n_load, other=0.0)
    key = _row_keys(x, offs, offs, valid, n_load, last, n_init, n_local, LENGTHS == LEN_POSITIONS)
    if LENGTHS == LEN_MASKED:
        # The masked tail (scores past n_load, ranked -inf) sorts after every read score, lower
        # index first among equal keys: with n_load >= k the top k are among the read scores,
        # else they are the first k columns (all read scores, then the tail's first ones).
        read = offs < n_load
        if n_load >= k:
            take = _take_top_of(scores_ptr, tl.where(read, key, 0), offs, read, n_load, k,
                                T_BITS, 0, RADIX_BITS, SELECT, False)  # fmt: skip
        else:
            take = valid & (offs < k)
    else:
        take = _take_top_of(scores_ptr, key, offs, valid, n, k, T_BITS, 0, RADIX_BITS, SELECT,
                            False)  # fmt: skip
    if EPILOGUE == EPI_MASK:
        # The mask row written once, densely: selected or masked per column (no _finish); with
        # MASK_FINITE a selected -inf (or NaN) score stays masked.
        if MASK_FINITE:
            take = take & (key != NEG_INF_KEY)
        _mask_columns(out_ptr, row64, stride_or, offs, take, length, MASK_REPEAT, MASK_FILL,
                      MASK_SELECTED)  # fmt: skip
    else:
        pos = out_slots + tl.cumsum(take.to(tl.int32), 0) - 1
        tl.store(keys_ptr + pos, key.to(tl.int32, bitcast=True), mask=take)
        tl.store(idx_ptr + pos, offs, mask=take)


@triton.jit(do_not_specialize=["num_rows", "length", "pt_cols", "seg_len"])
def _topk_kernel(
    # pointers
    scores_ptr, lengths_ptr, starts_ptr, positions_ptr, row_to_batch_ptr, page_table_ptr,
    out_ptr, pages_ptr, ctx_ptr, keys_ptr, idx_ptr,
    # sizes and scalars
    num_rows, length, k, pad, n_init, n_local, pt_cols, num_segments, seg_len, region_base,
    # strides, in elements
    stride_sr, stride_sl, stride_or, stride_pr, stride_ptb, stride_ptp,
    # switches
    STAGE: tl.constexpr, LENGTHS: tl.constexpr, HAS_STARTS: tl.constexpr,
    HAS_ROW_TO_BATCH: tl.constexpr, EPILOGUE: tl.constexpr, SORT: tl.constexpr,
    LOG2_PAGE: tl.constexpr, LOG2_BLOCK: tl.constexpr, PAGES_PER_BLOCK: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr, MASK_REPEAT: tl.constexpr, MASK_FILL: tl.constexpr,
    MASK_SELECTED: tl.constexpr, MASK_FINITE: tl.constexpr,
    # meta-parameters
    BLOCK: tl.constexpr, CAP: tl.constexpr, K_PAD: tl.constexpr, RADIX_BITS: tl.constexpr,
    TILE: tl.constexpr, TILE_BITS: tl.constexpr, SELECT: tl.constexpr,
):
    pid = tl.program_id(0)
    num_programs = tl.num_programs(0)
    # Per-program scratch: two candidate buffers and the selected slots.
    base = region_base + pid * (2 * CAP + K_PAD)
    buf0 = base
    buf1 = base + CAP
    out_slots = base + 2 * CAP
    num_items = num_rows
    if STAGE == STAGE_SEGMENT:
        num_items = num_rows * num_segments
    item = pid
    while item < num_items:
        row = item
        if STAGE == STAGE_SEGMENT:
            row = item // num_segments
        row64 = row.to(tl.int64)
        # The row's window [start, start + n) of the scores.
        n = length
        p = 0
        last = 0
        # Lengths, starts and positions are clamped in their own dtype before they narrow to
        # int32 (an int64 length 2**32 + 3 is longer than the row, not 3 long).
        if (LENGTHS == LEN_ARRAY) | (LENGTHS == LEN_MASKED):
            n = tl.minimum(tl.maximum(tl.load(lengths_ptr + row), 0), length).to(tl.int32)
        elif LENGTHS == LEN_POSITIONS:
            # a last block past the row's by k or more (n_local <= k) forces, limits and counts
            # the row's blocks as the real one does
            p_top = ((length + k + 1) << LOG2_BLOCK) - 1
            p = tl.load(positions_ptr + row // NUM_KV_HEADS)
            p = tl.minimum(tl.maximum(p, -1), p_top).to(tl.int32)
            last = p >> LOG2_BLOCK  # arithmetic shift: floor, also for p < 0
            n = last + 1
        start = 0
        if HAS_STARTS:
            start = tl.minimum(tl.maximum(tl.load(starts_ptr + row), 0), length).to(tl.int32)
        n = tl.minimum(tl.maximum(n, 0), length - start)
        n_load = n  # the first n_load of the row's n elements are read; the rest rank as -inf
        if LENGTHS == LEN_MASKED:
            n = length - start

        if TILE > 0:
            # The whole row in one register tile (STAGE_ROW, length <= TILE): keys, the exact
            # select in registers, then the epilogue; no candidate buffer, no passes over it.
            # A masked row whose first n_load >= k scores hold its top k (the masked tail ranks
            # last) and fit half the tile takes a half-size tile (the causal rows of a DSA
            # indexer's prefill: half of them).
            row_off = row64 * stride_sr + tl.cast(start, tl.int64) * stride_sl
            HALF: tl.constexpr = TILE // 2
            half = False  # stays a constant (one branch compiled) unless the row is masked
            if (LENGTHS == LEN_MASKED) & (HALF >= HALF_TILE_MIN):
                half = (n_load >= k) & (2 * n_load <= TILE)
            if half:
                _tile_row(
                    scores_ptr, row_off, stride_sl, n, n_load, k, last, n_init, n_local, row64,
                    length, out_ptr, stride_or, keys_ptr, idx_ptr, out_slots,
                    LENGTHS, EPILOGUE, MASK_REPEAT, MASK_FILL, MASK_SELECTED, HALF,
                    TILE_BITS - 1, RADIX_BITS, SELECT, MASK_FINITE,
                )
                if EPILOGUE == EPI_MASK:
                    # The columns past the half tile: the masked tail, never selected.
                    rest = HALF + tl.arange(0, HALF)
                    _mask_columns(out_ptr, row64, stride_or, rest, rest < 0, length,
                                  MASK_REPEAT, MASK_FILL, MASK_SELECTED)  # fmt: skip
            else:
                _tile_row(
                    scores_ptr, row_off, stride_sl, n, n_load, k, last, n_init, n_local, row64,
                    length, out_ptr, stride_or, keys_ptr, idx_ptr, out_slots,
                    LENGTHS, EPILOGUE, MASK_REPEAT, MASK_FILL, MASK_SELECTED, TILE,
                    TILE_BITS, RADIX_BITS, SELECT, MASK_FINITE,
                )
            n_sel = tl.minimum(n, k)
        else:
            if EPILOGUE == EPI_MASK:
                # Everything masked first; the selected columns are cleared in _finish.
                width = length * MASK_REPEAT
                masked = tl.full((BLOCK,), MASK_FILL, out_ptr.dtype.element_ty)
                c = 0
                while c < width:
                    cols = c + tl.arange(0, BLOCK)
                    tl.store(out_ptr + row64 * stride_or + cols, masked, mask=cols < width)
                    c += BLOCK

            if STAGE == STAGE_MERGE:
                # The row's segment results: num_segments · k pairs (key 0 = absent).
                n_sel = _select(
                    keys_ptr, idx_ptr, row * num_segments * k, buf0, out_slots,
                    num_segments * k, k, BLOCK, RADIX_BITS,
                )
            else:
                idx_base = 0
                if STAGE == STAGE_SEGMENT:
                    idx_base = (item % num_segments) * seg_len
                    n = tl.minimum(tl.maximum(n - idx_base, 0), seg_len)
                    n_load = tl.minimum(tl.maximum(n_load - idx_base, 0), seg_len)
                row_off = row64 * stride_sr + tl.cast(start + idx_base, tl.int64) * stride_sl
                count, src, dst = _stream(
                    scores_ptr, row_off, stride_sl, n, n_load, idx_base, keys_ptr, idx_ptr, buf0, buf1,
                    k,
                    last, n_init, n_local,
                    LENGTHS == LEN_POSITIONS, CAP, BLOCK, RADIX_BITS,
                )
                n_sel = _select(keys_ptr, idx_ptr, src, dst, out_slots, count, k, BLOCK, RADIX_BITS)
        if (EPILOGUE != EPI_MASK) | (TILE == 0):
            _finish(
                keys_ptr, idx_ptr, out_slots, n_sel, k, pad, row, row64, item, p, last,
                out_ptr, pages_ptr, ctx_ptr, page_table_ptr, row_to_batch_ptr, pt_cols,
                stride_or, stride_pr, stride_ptb, stride_ptp,
                EPILOGUE, SORT, HAS_ROW_TO_BATCH, LOG2_PAGE, LOG2_BLOCK, PAGES_PER_BLOCK,
                NUM_KV_HEADS, MASK_REPEAT, MASK_SELECTED, K_PAD, MASK_FINITE,
            )
        item += num_programs


# ---------------------------------------------------------------------------------------------
# multi-program path: helpers


@triton.jit
def _row_window(row, length, lengths_ptr, starts_ptr, LENGTHS: tl.constexpr,
                HAS_STARTS: tl.constexpr):
    """(n, start) of row `row`: it reads scores[row, start : start + n]."""
    n = length
    if LENGTHS == LEN_ARRAY:  # clamped in the array's own dtype: an int64 2**32 + 3 is no 3
        n = tl.minimum(tl.maximum(tl.load(lengths_ptr + row), 0), length).to(tl.int32)
    start = 0
    if HAS_STARTS:
        start = tl.minimum(tl.maximum(tl.load(starts_ptr + row), 0), length).to(tl.int32)
    n = tl.minimum(tl.maximum(n, 0), length - start)
    return n, start


@triton.jit
def _radix_edge(v, match, need, s, RADIX_BITS: tl.constexpr):
    """Radix descent over the uint32 tile v[match] (need <= its size) for the need-th largest,
    from bit s down, stopping as soon as a bin holds exactly the rest. Returns (prefix, s, need,
    in_bin): the elements with v >> s > prefix are above it, the in_bin ones with
    v >> s == prefix tie with it and `need` of them complete the set (all when in_bin == need;
    otherwise s is 0)."""
    NUM_BINS: tl.constexpr = 1 << RADIX_BITS
    s = tl.full((), 0, tl.int32) + s
    prefix = tl.full((), 0, tl.uint32)
    in_bin = need + 1
    while (s > 0) & (in_bin != need):
        s_next = tl.maximum(s - RADIX_BITS, 0)
        digit_mask = (1 << (s - s_next)) - 1
        sel = match & tl.where(s >= 32, True, (v >> tl.minimum(s, 31)) == prefix)
        digit = ((v >> s_next) & digit_mask).to(tl.int32)
        hist = tl.histogram(digit, NUM_BINS, mask=sel)
        b, above, in_bin = _pick_bin(hist, need, NUM_BINS)
        need -= above
        prefix = (prefix << (s - s_next)) | tl.maximum(b, 0).to(tl.uint32)
        s = s_next
    return prefix, s, need, in_bin


@triton.jit
def _radix_edge_global(keys_ptr, base, count, need, BLOCK: tl.constexpr,
                       RADIX_BITS: tl.constexpr):
    """A key edge with #(keys >= edge) >= need <= #(present keys) among the `count` keys at
    base (0 = absent), written by other programs: the need-th largest, or the lower edge of a
    bin that ends the descent early (then exactly `need` keys are >= it)."""
    NUM_BINS: tl.constexpr = 1 << RADIX_BITS
    offs0 = tl.arange(0, BLOCK)
    s = tl.full((), 32, tl.int32)
    prefix = tl.full((), 0, tl.uint32)
    in_bin = need + 1
    while (s > 0) & (in_bin != need):
        s_next = tl.maximum(s - RADIX_BITS, 0)
        digit_mask = (1 << (s - s_next)) - 1
        hist = tl.zeros((NUM_BINS,), tl.int32)
        start = 0
        while start < count:
            offs = start + offs0
            ok = offs < count
            key = tl.load(keys_ptr + base + offs, mask=ok, other=0, cache_modifier=".cg")
            key = key.to(tl.uint32, bitcast=True)
            sel = ok & (key != 0) & tl.where(s >= 32, True, (key >> tl.minimum(s, 31)) == prefix)
            digit = ((key >> s_next) & digit_mask).to(tl.int32)
            hist += tl.histogram(digit, NUM_BINS, mask=sel)
            start += BLOCK
        b, above, in_bin = _pick_bin(hist, need, NUM_BINS)
        need -= above
        prefix = (prefix << (s - s_next)) | tl.maximum(b, 0).to(tl.uint32)
        s = s_next
    return prefix << s


@triton.jit
def _bisect_bit(v, t, c, b, need):
    """One step of `_bisect_edge`: bit b of the edge."""
    trial = t | (tl.full((), 1, tl.uint32) << b.to(tl.uint32))
    cnt = tl.sum((v >= trial).to(tl.int32), 0)
    return tl.where(cnt >= need, trial, t), tl.where(cnt >= need, cnt, c)


@triton.jit
def _bisect_pair(v, t, c, b, need):
    """Two steps of `_bisect_edge` in one pass: bits b and b - 1 of the edge, from the counts of
    the three trials packed in one int64 sum (21 bits each)."""
    one = tl.full((), 1, tl.uint32)
    t_lo = t | (one << (b - 1).to(tl.uint32))
    t_hi = t | (one << b.to(tl.uint32))
    t_both = t_hi | t_lo
    packed = ((v >= t_lo).to(tl.int64) + ((v >= t_hi).to(tl.int64) << 21)
              + ((v >= t_both).to(tl.int64) << 42))  # fmt: skip
    total = tl.sum(packed, 0)
    c_lo = (total & 0x1FFFFF).to(tl.int32)
    c_hi = ((total >> 21) & 0x1FFFFF).to(tl.int32)
    c_both = (total >> 42).to(tl.int32)
    # The largest trial that keeps >= need (the counts fall as the trials rise).
    t_new = tl.where(c_lo >= need, t_lo, t)
    c_new = tl.where(c_lo >= need, c_lo, c)
    t_new = tl.where(c_hi >= need, t_hi, t_new)
    c_new = tl.where(c_hi >= need, c_hi, c_new)
    return tl.where(c_both >= need, t_both, t_new), tl.where(c_both >= need, c_both, c_new)


@triton.jit
def _bisect_edge(v, count, need, top_bit, low_bit, t0, PAIRS: tl.constexpr):
    """(t, c): the largest uint32 t with c = #(v >= t) >= need, for a tile v that is 0 wherever an
    element does not take part and `count` >= need elements that do (a 0 among them ranks last:
    every trial is >= 1). t0: the bits above top_bit that every taking part v has (t0's bits from
    top_bit down are 0; 0 with top_bit 31 for any tile), or, to resolve more bits of an earlier
    result, that result t0 (bits above top_bit fixed) with `count` its c. One count per bit from
    top_bit down to low_bit; stops early at a t with c == need: {v >= t} is then exactly the top
    `need`. Otherwise (bits down to 0 resolved, c > need) t is the need-th largest value and it is
    tied; with low_bit > 0, t is that value with its bits below low_bit cleared (a lower edge: still
    c >= need). A compare and an add per element and bit: no histogram, so no shared-memory atomics
    piling onto a few bins. PAIRS: two bits per pass where two are left, the counts of the three
    trials packed in one int64 sum (21 bits each: tiles < 2**21), so a wide program waits on half as
    many block reductions."""
    t = tl.full((), 0, tl.uint32) + t0
    c = tl.full((), 0, tl.int32) + count
    b = tl.full((), 0, tl.int32) + top_bit
    while (b >= low_bit) & (c != need):
        if PAIRS:
            if b > low_bit:
                t, c = _bisect_pair(v, t, c, b, need)
                b -= 2
            else:
                t, c = _bisect_bit(v, t, c, b, need)
                b -= 1
        else:
            t, c = _bisect_bit(v, t, c, b, need)
            b -= 1
    return t, c


@triton.jit
def _interp_edge(v, c_lo, need, lo, hi, c_hi, slack, min_width):
    """(t, c, t_hi, c_hi_end) with t in [lo, hi), c = #(v >= t) >= need, for a tile v whose
    counts at the bracket's ends are c_lo = #(v >= lo) >= need > c_hi = #(v >= hi): each count
    at a point interpolated between the bracket's ends by their counts (regula falsi, the end
    kept twice in a row weighted by half: Illinois), the bracket shrinking to [t, t_hi) (c_hi_end
    its end's count), until c <= need + slack or the bracket is min_width wide; after
    INTERP_STEPS counts, at the bracket's midpoint. With slack 0 and min_width 1 that is
    `_bisect_edge`'s answer: the largest t with c >= need, or one with c == need, whose
    {v >= t} is then exactly the top `need`. A CPU simulation of the multi path's finish (the
    top k of ~1.5 k candidates): ~10 counts for k 2048 of a Gaussian row, 5-9 for uniform /
    log-normal / relu / random-walk rows, against the bit descent's 11-22; no better where the
    k-th score is one of hundreds of equal ones (both resolve it to its last bit)."""
    t_lo = tl.full((), 0, tl.uint32) + lo
    t_hi = tl.full((), 0, tl.uint32) + hi
    c_lo = tl.full((), 0, tl.int32) + c_lo
    c_hi = tl.full((), 0, tl.int32) + c_hi
    w_lo = tl.full((), 1.0, tl.float32)
    w_hi = tl.full((), 1.0, tl.float32)
    last = tl.full((), 0, tl.int32)  # 1: the last count raised t_lo, 2: it lowered t_hi
    steps = tl.full((), 0, tl.int32)
    while ((t_hi - t_lo) > min_width) & (c_lo - need > slack):
        width = t_hi - t_lo
        a = ((c_lo - need).to(tl.float32) + 0.5) * w_lo  # > 0
        b = ((c_hi - need).to(tl.float32) + 0.5) * w_hi  # < 0
        step = (a / (a - b) * width.to(tl.float32)).to(tl.uint32)
        step = tl.where(steps >= INTERP_STEPS, width // 2, step)
        step = tl.minimum(tl.maximum(step, 1), width - 1)
        t = t_lo + step
        c = tl.sum((v >= t).to(tl.int32), 0)
        up = c >= need
        w_hi = tl.where(up & (last == 1), w_hi * 0.5, 1.0)
        w_lo = tl.where(~up & (last == 2), w_lo * 0.5, 1.0)
        t_lo = tl.where(up, t, t_lo)
        c_lo = tl.where(up, c, c_lo)
        t_hi = tl.where(up, t_hi, t)
        c_hi = tl.where(up, c_hi, c)
        last = tl.where(up, 1, 2)
        steps += 1
    return t_lo, c_lo, t_hi, c_hi


@triton.jit
def _take_top(
    key, idx, valid, m, k, idx_bits, floor, RADIX_BITS: tl.constexpr, SELECT: tl.constexpr,
    PAIRS: tl.constexpr, KEY_SHIFT: tl.constexpr = 0,
):
    """Mask of exactly the top min(k, m) of the m present (valid) pairs of a register tile,
    lower index first among equal keys (indices distinct, < 2**idx_bits). SELECT: the descent,
    SELECT_BISECT (counting per bit), SELECT_RADIX (histograms of RADIX_BITS digits) or, with a
    floor, SELECT_INTERP (`_interp_edge` between the floor and the largest key; bisecting
    without one). floor: a key <= every valid key (0: none known); the bisection then starts
    below the bits that floor and the largest key share (the multi path's candidates all reach
    its estimate: ~8 fewer counts for a Gaussian row's top 1.5 %). PAIRS: see `_bisect_edge`.
    KEY_SHIFT (`_take_top_of`): the low key bits that the scores' dtype leaves equal among all
    keys of one value; the descents run on the keys without them (an order-preserving map,
    one-to-one on the values, so the same selection), so a tied k-th key of bf16 scores is
    resolved in 16 bits, not 32 (a CPU simulation of the multi path's finish over bf16
    Gaussian rows of 128K, k 2048: 21.7 interpolated counts a row before it, 5.0 with it)."""
    take = valid
    if m > k:
        if SELECT != SELECT_RADIX:
            if KEY_SHIFT > 0:
                key = key >> KEY_SHIFT  # valid keys stay >= 1: key(-inf) >> 16 is 0x7F
            # Keys are 0 off the valid elements (`_ordered_key`, and the candidates' padding),
            # the m valid ones > 0.
            kmax = tl.full((), 0, tl.uint32)
            if floor > 0:
                kmax = tl.max(key, 0)
            if (SELECT >= SELECT_INTERP) & (floor > 0):
                # every valid key is in [floor, kmax]; kmax + 1 does not wrap (+inf's key is
                # 0xFF800000, NaN ranks as -inf)
                t, c, _, _ = _interp_edge(key, m, k, floor.to(tl.uint32) >> KEY_SHIFT, kmax + 1,
                                          0, 0, 1)  # fmt: skip
            else:
                top = tl.full((), 31 - KEY_SHIFT, tl.int32)
                t0 = tl.full((), 0, tl.uint32)
                if floor > 0:
                    # The highest bit where kmax and floor differ, from the exponent of its
                    # float (rounding may make it one too high: fewer shared bits, still shared).
                    d = kmax ^ (floor.to(tl.uint32) >> KEY_SHIFT)
                    high = (d.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127
                    high = tl.minimum(high, 31)  # -127 when d == 0: every key is kmax
                    ones = tl.full((), 0xFFFFFFFF, tl.uint32)
                    keep = (ones << tl.maximum(high, 0).to(tl.uint32)) << 1
                    t0 = tl.where(high >= 0, kmax & keep, kmax)
                    top = tl.maximum(high, -1)
                t, c = _bisect_edge(key, m, k, top, 0, t0, PAIRS)
            take = valid & (key >= t)
            if c != k:
                # The k-th key t is tied: all keys above it, then its `need` lowest indices
                # (distinct ranks: the rank descent ends with exactly `need`).
                tie = valid & (key == t)
                above = take & (key != t)
                need = k - tl.sum(above.to(tl.int32), 0)
                rank = (idx ^ ((1 << idx_bits) - 1)).to(tl.uint32)
                r_t, _ = _bisect_edge(tl.where(tie, rank, 0), c - (k - need), need,
                                      idx_bits - 1, 0, 0, PAIRS)  # fmt: skip
                take = above | (tie & (rank >= r_t))
        else:
            prefix, s, need, in_bin = _radix_edge(key, valid, k, 32, RADIX_BITS)
            above = valid & ((key >> s) > prefix)
            tie = valid & ((key >> s) == prefix)
            take_tie = tie
            if in_bin != need:
                # The k-th key itself is tied (s == 0): its `need` lowest indices win. Indices
                # are distinct, so this descent always ends with a bin of exactly `need`.
                rank = (idx ^ ((1 << idx_bits) - 1)).to(tl.uint32)
                r_prefix, r_s, _, _ = _radix_edge(rank, tie, need, idx_bits, RADIX_BITS)
                take_tie = tie & ((rank >> r_s) >= r_prefix)
            take = above | take_tie
    return take


@triton.jit
def _take_top_of(
    scores_ptr, key, idx, valid, m, k, idx_bits, floor, RADIX_BITS: tl.constexpr,
    SELECT: tl.constexpr, PAIRS: tl.constexpr,
):
    """`_take_top` of keys made from scores_ptr's dtype, with its KEY_SHIFT: the low key bits
    that the dtype leaves equal among the keys of one value (bf16 16, fp16 13: their widening to
    fp32 is exact, so those mantissa bits are 0, and all 1 in a negative score's key;
    FORCED_KEY >> 16 stays above every score's key), 0 for fp32."""
    DTYPE: tl.constexpr = scores_ptr.dtype.element_ty
    KEY_SHIFT: tl.constexpr = 16 if DTYPE == tl.bfloat16 else (13 if DTYPE == tl.float16 else 0)
    return _take_top(key, idx, valid, m, k, idx_bits, floor, RADIX_BITS, SELECT, PAIRS, KEY_SHIFT)


@triton.jit
def _take_candidates(
    scores_ptr, row_off, stride_sl, keys_ptr, idx_ptr, src, m, k, idx_bits, lo,
    CAP: tl.constexpr, RADIX_BITS: tl.constexpr, SELECT: tl.constexpr, PAIRS: tl.constexpr,
    KEYS: tl.constexpr,
):
    """(take, key, idx): the k <= m <= CAP candidates at src (the indices in the row at row_off
    of scores whose keys are >= lo, stored by other programs: `_collect_segment`; with KEYS the
    scores' fp32 bits beside them, else gathered from the row here) as a CAP tile of keys and
    indices, take marking exactly the top k, lower index first among equal keys."""
    offs = tl.arange(0, CAP)
    valid = offs < m
    idx = tl.load(idx_ptr + src + offs, mask=valid, other=0, cache_modifier=".cg")
    if KEYS:
        bits = tl.load(keys_ptr + src + offs, mask=valid, other=0, cache_modifier=".cg")
        x = bits.to(tl.float32, bitcast=True)
    else:
        x = tl.load(scores_ptr + row_off + idx.to(tl.int64) * stride_sl, mask=valid, other=0.0)
    key = _ordered_key(x.to(tl.float32), valid)
    take = _take_top_of(scores_ptr, key, idx, valid, m, k, idx_bits, lo, RADIX_BITS, SELECT,
                        PAIRS)  # fmt: skip
    return take, key, idx


@triton.jit
def _select_candidates(
    scores_ptr, row_off, stride_sl, keys_ptr, idx_ptr, src, m, k, dst, idx_bits, lo,
    CAP: tl.constexpr, RADIX_BITS: tl.constexpr, SELECT: tl.constexpr, PAIRS: tl.constexpr,
    KEYS: tl.constexpr,
):
    """`_take_candidates`' top k into dst .. dst + k - 1 as (key, index) pairs (any order)."""
    take, key, idx = _take_candidates(
        scores_ptr, row_off, stride_sl, keys_ptr, idx_ptr, src, m, k, idx_bits, lo, CAP,
        RADIX_BITS, SELECT, PAIRS, KEYS,
    )
    pos = dst + tl.cumsum(take.to(tl.int32), 0) - 1
    tl.store(keys_ptr + pos, key.to(tl.int32, bitcast=True), mask=take)
    tl.store(idx_ptr + pos, idx, mask=take)


@triton.jit
def _key_float(key):
    """The fp32 whose `_ordered_key` is key (a NaN for keys above +inf's)."""
    bits = tl.where(key >= 0x80000000, key ^ 0x80000000, key ^ 0xFFFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _popcount(v):
    """Set bits of each uint32."""
    v = v - ((v >> 1) & 0x55555555)
    v = (v & 0x33333333) + ((v >> 2) & 0x33333333)
    v = (v + (v >> 4)) & 0x0F0F0F0F
    return ((v * 0x01010101) >> 24).to(tl.int32)


@triton.jit
def _absorb_chunk(
    x, gmax, found, shift, rows, lo_f, take_all, start, offs0, n_seg,
    MASKED: tl.constexpr, COLLECT: tl.constexpr, GROUP_MAX: tl.constexpr, ROWS: tl.constexpr,
):
    """One fp32 chunk x (ROWS, BLOCK) of `_stream_columns` (its first score at `start` of the
    segment) into the columns' maxima and candidate masks (row r's bit: shift + r). MASKED:
    scores past n_seg are no candidates."""
    if GROUP_MAX:
        gmax = tl.maximum(gmax, tl.max(x, 0))
    if COLLECT:
        cand = (x >= lo_f) | take_all
        if MASKED:
            cand = cand & ((start + offs0) < n_seg)
        bit = tl.full((ROWS, 1), 1, tl.uint32) << (shift + rows[:, None]).to(tl.uint32)
        found |= tl.sum(tl.where(cand, bit, 0), 0)  # distinct bits
    return gmax, found


@triton.jit
def _stream_columns(
    scores_ptr, row_off, stride_sl, n_seg, lo_f, take_all, offs0, rows,
    MASKED: tl.constexpr, COLLECT: tl.constexpr, GROUP_MAX: tl.constexpr, BLOCK: tl.constexpr,
    CHUNK: tl.constexpr, ROWS: tl.constexpr, PREFETCH: tl.constexpr = 1,
):
    """The streaming loop of `_collect_segment`: per column the candidate bit mask and the fp32
    group maximum (-inf if none; NaN scores are skipped: they rank as -inf). MASKED: n_seg is
    not a whole number of chunks (the loads are masked; else none is and, with a unit stride,
    they are vectorized). The next chunk's load is issued before the current one is processed
    (unmasked with PREFETCH 2: the next two chunks', twice the bytes in flight a thread: the
    stream waits on DRAM latency, not bandwidth, at one chunk; PREFETCH >= 3: Triton's
    pipeliner with PREFETCH stages); unmasked, the last steps reload the last chunk (an L1 / L2
    hit) instead of reading past the segment."""
    gmax = tl.full((BLOCK,), float("-inf"), tl.float32)
    found = tl.zeros((BLOCK,), tl.uint32)  # bit c·ROWS + r: [r, j] of chunk c is a candidate
    if PREFETCH >= 3:
        if not MASKED:
            # Triton's pipeliner: async copies through shared memory, PREFETCH - 1 chunks ahead
            # (no registers held for them).
            for c in tl.range(0, n_seg // CHUNK, num_stages=PREFETCH):
                x = tl.load(scores_ptr + row_off + (c * CHUNK + offs0) * stride_sl)
                gmax, found = _absorb_chunk(
                    x.to(tl.float32), gmax, found, c * ROWS, rows, lo_f, take_all, 0, offs0,
                    n_seg, False, COLLECT, GROUP_MAX, ROWS,
                )  # fmt: skip
            return found, gmax
    if MASKED:
        x_next = tl.load(scores_ptr + row_off + offs0 * stride_sl, mask=offs0 < n_seg,
                         other=float("-inf"))  # fmt: skip
    else:
        x_next = tl.load(scores_ptr + row_off + offs0 * stride_sl)
    last = n_seg - CHUNK  # unmasked: the last chunk's first score
    x_after = x_next
    if PREFETCH == 2:
        if not MASKED:
            after = tl.multiple_of(tl.minimum(CHUNK, last), CHUNK)
            x_after = tl.load(scores_ptr + row_off + (after + offs0) * stride_sl)
    start = 0
    shift = 0
    while start < n_seg:
        x = x_next.to(tl.float32)
        if MASKED:
            offs_next = start + CHUNK + offs0
            x_next = tl.load(scores_ptr + row_off + offs_next * stride_sl, mask=offs_next < n_seg,
                             other=float("-inf"))  # fmt: skip
        elif PREFETCH == 2:
            x_next = x_after
            nxt = tl.multiple_of(tl.minimum(start + 2 * CHUNK, last), CHUNK)
            x_after = tl.load(scores_ptr + row_off + (nxt + offs0) * stride_sl)
        else:
            nxt = tl.multiple_of(tl.minimum(start + CHUNK, last), CHUNK)
            x_next = tl.load(scores_ptr + row_off + (nxt + offs0) * stride_sl)
        gmax, found = _absorb_chunk(
            x, gmax, found, shift, rows, lo_f, take_all, start, offs0, n_seg,
            MASKED, COLLECT, GROUP_MAX, ROWS,
        )  # fmt: skip
        start += CHUNK
        shift += ROWS
    return found, gmax


@triton.jit
def _collect_segment(
    scores_ptr, row_off, stride_sl, n_seg, seg_start, lo, keys_ptr, idx_ptr, area, count_ptr,
    gmax_ptr, gmax_at,
    COLLECT: tl.constexpr, GROUP_MAX: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
    CAP: tl.constexpr, KEYS: tl.constexpr, PREFETCH: tl.constexpr = 1,
):
    """Stream one segment (n_seg <= 32 x BLOCK scores from row_off) once, ROWS x BLOCK scores a
    chunk: append the indices of the keys >= lo to the row's candidate area (slots from the
    row's counter; those past CAP are counted, not stored) and store the maxima of the BLOCK
    strided groups {j + c·BLOCK} (0 for an empty group).

    A chunk is a (ROWS, BLOCK) tile, score j + r·BLOCK at [r, j], and a thread keeps its columns
    along axis 0. While streaming nothing crosses threads and nothing is stored: each column
    keeps a bit mask of its candidates (bit c·ROWS + r) and its fp32 maximum in registers. The
    test is on floats, key(x) >= lo as x >= the float of lo (IEEE order is the keys' order for
    non-NaN scores, -0.0 == +0.0 included; a NaN compares false and ranks as -inf, below any
    lo > key(-inf); lo <= key(-inf) takes every score), so a score costs a compare, a select,
    an or and a max. After the segment, one scan of the columns' counts (their masks' popcounts)
    and one atomic place every column's run in the row's area, and the columns walk their
    masks lowest bit first (the bit's position from the exponent of its float value), storing
    each candidate's index; with KEYS a pass over the segment's run of slots then stores the
    candidates' fp32 score bits (gathered from the segment just streamed), which the finishing
    select then reads in order instead of gathering the scores by index (`_multi_plan` says
    when: an ncu of the separate finish kernel at 256 x 128K on an H100 put ~45 % of its
    samples on that gather from DRAM, yet the walk's reload, one dependent load a walk step as
    it was then, cost the collect kernel about as much where k or the rows are small). Full
    segments stream unmasked (`_stream_columns`). Per-chunk scans, reductions and atomics
    cost 106-221 us at 256 x 128K, queues in memory ~75 over the stream
    (benchmarks/experiments/topk_lanes.py)."""
    CHUNK: tl.constexpr = ROWS * BLOCK
    rows = tl.arange(0, ROWS)
    offs0 = rows[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    # The column indices in the layout of the column reductions (found, gmax), so the walk's
    # masks and positions share it; its scattered stores still go through a layout conversion
    # (shared memory: the index and the mask, each step).
    cols = tl.min(offs0, 0)
    lo_u = lo.to(tl.uint32)
    lo_f = _key_float(lo_u)
    take_all = lo_u <= NEG_INF_KEY
    if n_seg % CHUNK == 0:
        found, gmax = _stream_columns(
            scores_ptr, row_off, stride_sl, n_seg, lo_f, take_all, offs0, rows,
            False, COLLECT, GROUP_MAX, BLOCK, CHUNK, ROWS, PREFETCH,
        )  # fmt: skip
    else:
        found, gmax = _stream_columns(
            scores_ptr, row_off, stride_sl, n_seg, lo_f, take_all, offs0, rows,
            True, COLLECT, GROUP_MAX, BLOCK, CHUNK, ROWS,
        )  # fmt: skip
    if GROUP_MAX:
        # The groups' maxima as keys; an empty group (its column past n_seg) 0.
        gkey = _ordered_key(gmax, cols < n_seg)
        tl.store(gmax_ptr + gmax_at + cols, gkey.to(tl.int32, bitcast=True))
    if COLLECT:
        count = _popcount(found)
        n_cand = tl.sum(count, 0)
        if n_cand > 0:
            base = tl.atomic_add(count_ptr, n_cand, sem="relaxed")
            pos = base + tl.cumsum(count, 0) - count
            deepest = tl.max(count, 0)
            # A for loop (not a while): the layout pass then keeps a copy of pos in the stores'
            # layout instead of converting the store pointers every step (the sm90 TTGIR of
            # triton 3.9 here).
            for _ in range(0, deepest):
                low = found & (0 - found)  # the lowest candidate bit left (0: none)
                # log2 of a power of two: its float's exponent
                bit = (low.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127
                offs = (bit // ROWS) * CHUNK + (bit % ROWS) * BLOCK + cols
                keep = (low != 0) & (pos < CAP)
                tl.store(idx_ptr + area + pos, seg_start + offs, mask=keep)
                found ^= low
                pos += 1
            if KEYS:
                # The scores of this segment's run of slots, after the walk: the run's indices
                # read back in order and every gather of a chunk in flight at once (the segment
                # was just streamed: L2 hits), not one dependent reload a walk step.
                tl.debug_barrier()  # the walk's index stores land before they are read back
                end = tl.minimum(base + n_cand, CAP)
                slots = tl.arange(0, CHUNK)
                for first in range(base, end, CHUNK):
                    at = first + slots
                    ok = at < end
                    i = tl.load(idx_ptr + area + at, mask=ok, other=seg_start)
                    x = tl.load(scores_ptr + row_off + (i - seg_start) * stride_sl, mask=ok,
                                other=0.0)  # fmt: skip
                    tl.store(keys_ptr + area + at, x.to(tl.float32).to(tl.int32, bitcast=True),
                             mask=ok)  # fmt: skip


@triton.jit
def _emit(
    keys_ptr, idx_ptr, out_slots, n_sel, k, pad, row, row64, out_ptr, page_table_ptr,
    row_to_batch_ptr, pt_cols, stride_or, stride_ptb, stride_ptp,
    EPILOGUE: tl.constexpr, SORT: tl.constexpr, HAS_ROW_TO_BATCH: tl.constexpr,
    LOG2_PAGE: tl.constexpr, K_PAD: tl.constexpr,
):
    """_finish for the index / page epilogues (every slot of the output row written)."""
    _finish(
        keys_ptr, idx_ptr, out_slots, n_sel, k, pad, row, row64, 0, 0, 0,
        out_ptr, out_ptr, out_ptr, page_table_ptr, row_to_batch_ptr, pt_cols,
        stride_or, 0, stride_ptb, stride_ptp,
        EPILOGUE, SORT, HAS_ROW_TO_BATCH, LOG2_PAGE, 0, 0, 1, 1, 0, K_PAD,
    )


@triton.jit
def _whole_row(
    scores_ptr, row_off, stride_sl, n, keys_ptr, idx_ptr, area, k,
    K_PAD: tl.constexpr, FB_BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr,
):
    """The row path's stream + select over a whole row in one program (short rows, and rows
    whose candidates overflow: constant rows, scores equal in most of their bits). Returns
    (the selected slots' offset, how many)."""
    CAP_FB: tl.constexpr = 2 * FB_BLOCK + K_PAD
    count, src, dst = _stream(
        scores_ptr, row_off, stride_sl, n, n, 0, keys_ptr, idx_ptr, area, area + CAP_FB, k,
        0, 0, 0, False, CAP_FB, FB_BLOCK, RADIX_BITS,
    )
    out_slots = area + 2 * CAP_FB
    n_sel = _select(keys_ptr, idx_ptr, src, dst, out_slots, count, k, FB_BLOCK, RADIX_BITS)
    return out_slots, n_sel


# ---------------------------------------------------------------------------------------------
# multi-program path: kernels


@triton.jit
def _sample_edge(key, valid, count, rank, low_bit, RADIX_BITS: tl.constexpr,
                 SELECT: tl.constexpr, PAIRS: tl.constexpr):  # fmt: skip
    """The rank-th largest of `count` valid keys (0 off them) by SELECT's descent; the
    bisection stops at low_bit (that key with its lower bits cleared) unless more than 1.5 rank
    keys reach it there: the scores then differ only below low_bit (a large common offset,
    5 + 1e-3 x), the floor would take every one of them as a candidate and the row would be
    retried, so the bisection goes on down to bit 0. SELECT_INTERP_SAMPLE: `_interp_edge`
    between the sample's smallest and largest keys instead, stopping within rank / 32 of the
    rank (exactly at it with low_bit 0) or at a bracket 2**low_bit wide, then on to a bracket
    of 1 when more than 1.5 rank keys reach the edge there (a CPU simulation of 8192-score
    samples at rank 192: 3-8 counts for Gaussian / uniform / log-normal / relu / tied rows, 8 on
    average for random walks, plus the two extrema, against the bisection's 16)."""
    if SELECT == SELECT_INTERP_SAMPLE:
        kmin = tl.min(tl.where(valid, key, 0xFFFFFFFF), 0)
        kmax = tl.max(key, 0)  # every valid key is >= 1, the others 0
        slack = tl.where(low_bit > 0, rank // 32, 0)  # exact where the sample is the row
        floor_width = tl.full((), 1, tl.uint32) << low_bit
        edge, c, hi, c_hi = _interp_edge(key, count, rank, kmin, kmax + 1, 0, slack,
                                         floor_width)  # fmt: skip
        if (low_bit > 0) & (c > rank + rank // 2):
            edge, _, _, _ = _interp_edge(key, c, rank, edge, hi, c_hi, slack, 1)
    elif SELECT != SELECT_RADIX:  # SELECT_INTERP's estimate bisects
        edge, c = _bisect_edge(key, count, rank, 31, low_bit, 0, PAIRS)
        if (low_bit > 0) & (c > rank + rank // 2):
            edge, _ = _bisect_edge(key, c, rank, low_bit - 1, 0, edge, PAIRS)
    else:
        prefix, s, _, _ = _radix_edge(key, valid, rank, 32, RADIX_BITS)
        edge = prefix << s
    return edge


@triton.jit(do_not_specialize=["length", "row_base"])
def _topk_sample_kernel(
    # pointers
    scores_ptr, lengths_ptr, starts_ptr, state_ptr,
    # sizes and scalars
    length, k, row_base,
    # strides, in elements
    stride_sr, stride_sl,
    # switches and meta-parameters
    LENGTHS: tl.constexpr, HAS_STARTS: tl.constexpr, SAMPLE: tl.constexpr,
    SECTOR: tl.constexpr, MIN_RANK: tl.constexpr, RADIX_BITS: tl.constexpr,
    SELECT: tl.constexpr, PAIRS: tl.constexpr,
):
    """Per row: the estimate, a key whose count in the row should be ~1.5 k (exact when the
    whole row fits the sample), stored with the row's other state words zeroed. SELECT: the
    descent to the sample's rank-r key, radix histograms, or a bisection (two bits a count with
    PAIRS) that stops at ESTIMATE_LOW_BIT on sampled rows (the estimate need not be exact, only
    a key that r sampled keys reach)."""
    row = row_base + tl.program_id(0)
    row64 = row.to(tl.int64)
    n, start = _row_window(row, length, lengths_ptr, starts_ptr, LENGTHS, HAS_STARTS)
    row_off = row64 * stride_sr + tl.cast(start, tl.int64) * stride_sl
    edge = tl.full((), 0, tl.uint32)
    offs = tl.arange(0, SAMPLE)
    if n > SAMPLE:
        # SAMPLE / SECTOR runs of SECTOR consecutive scores, evenly spaced; no mask (a masked
        # tile keeps its predicate in every count's compare).
        stride = n // (SAMPLE // SECTOR)
        pos = (offs // SECTOR) * stride + offs % SECTOR
        rank = (3 * k * SAMPLE + 2 * n - 1) // (2 * n)  # 1.5 k scaled to the sample
        rank = tl.minimum(tl.maximum(rank, MIN_RANK), SAMPLE)
        key = _score_key(tl.load(scores_ptr + row_off + pos * stride_sl))
        edge = _sample_edge(key, offs < SAMPLE, SAMPLE, rank, ESTIMATE_LOW_BIT, RADIX_BITS,
                            SELECT, PAIRS)  # fmt: skip
    elif n > k:
        # The whole row: the exact k-th key, its descent over the keys without the low bits the
        # scores' dtype leaves equal (`_take_top_of`: a tied bf16 k-th key resolved in 16 bits,
        # not 32), then widened back: key >= edge << s exactly where key >> s >= edge.
        DTYPE: tl.constexpr = scores_ptr.dtype.element_ty
        KEY_SHIFT: tl.constexpr = 16 if DTYPE == tl.bfloat16 else (13 if DTYPE == tl.float16 else 0)
        valid = offs < n
        key = _ordered_key(tl.load(scores_ptr + row_off + offs * stride_sl, mask=valid), valid)
        edge = _sample_edge(key >> KEY_SHIFT, valid, n, k, 0, RADIX_BITS, SELECT, PAIRS)
        edge = edge << KEY_SHIFT
    # The row's whole state: the estimate, every counter 0 (no separate zeroing launch).
    words = tl.arange(0, STATE_WORDS)
    tl.store(state_ptr + row64 * STATE_WORDS + words,
             tl.where(words == ST_ESTIMATE, edge.to(tl.int32, bitcast=True), 0))


# stride_sl specialized: a unit stride makes `_collect_segment`'s unmasked loads 16-byte vectors.
@triton.jit
def _retry_row(
    scores_ptr, row_off, stride_sl, n, n_segments, k, lo, state, keys_ptr, idx_ptr, gmax_ptr,
    area, idx_bits,
    SEGMENT: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr,
    K_PAD: tl.constexpr, FB_BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr,
    SELECT: tl.constexpr, PAIRS: tl.constexpr,
):
    """A row whose estimate missed, in the program that found it out: the keys >= lo (the
    group-max bound) collected segment after segment, then the exact select; more than CAP of
    them (a constant row, scores equal in most bits) take the row path's exact one-program
    stream + select over the whole row. Returns (the selected slots' offset, how many)."""
    for s in range(0, n_segments):
        s_start = s * SEGMENT
        _collect_segment(
            scores_ptr, row_off + tl.cast(s_start, tl.int64) * stride_sl, stride_sl,
            tl.minimum(n - s_start, SEGMENT), s_start, lo, keys_ptr, idx_ptr, area,
            state + ST_RETRY_COUNT, gmax_ptr, 0,
            True, False, ROWS, BLOCK, CAP, False,  # the rare retry gathers its keys
        )  # fmt: skip
    tl.debug_barrier()  # every thread's candidates stored before the select reads them
    m = tl.atomic_add(state + ST_RETRY_COUNT, 0, sem="acquire")
    out_slots = area + CAP
    n_sel = k
    if (m >= k) & (m <= CAP):
        _select_candidates(
            scores_ptr, row_off, stride_sl, keys_ptr, idx_ptr, area, m, k, area + CAP,
            idx_bits, lo, CAP, RADIX_BITS, SELECT, PAIRS, False,
        )
    else:
        out_slots, n_sel = _whole_row(
            scores_ptr, row_off, stride_sl, n, keys_ptr, idx_ptr, area, k, K_PAD,
            FB_BLOCK, RADIX_BITS,
        )
    return out_slots, n_sel


# stride_sl specialized: a unit stride makes `_collect_segment`'s unmasked loads 16-byte vectors.
@triton.jit(do_not_specialize=["length", "pt_cols", "row_base", "idx_bits"])
def _topk_multi_kernel(
    # pointers
    scores_ptr, lengths_ptr, starts_ptr, row_to_batch_ptr, page_table_ptr, out_ptr, state_ptr,
    keys_ptr, idx_ptr, gmax_ptr,
    # sizes and scalars
    length, k, pad, pt_cols, row_base, num_segments, idx_bits,
    # strides, in elements
    stride_sr, stride_sl, stride_or, stride_ptb, stride_ptp,
    # switches
    LENGTHS: tl.constexpr, HAS_STARTS: tl.constexpr,
    HAS_ROW_TO_BATCH: tl.constexpr, EPILOGUE: tl.constexpr, SORT: tl.constexpr,
    LOG2_PAGE: tl.constexpr, ESTIMATE: tl.constexpr,
    # meta-parameters
    ROWS: tl.constexpr, BLOCK: tl.constexpr, CHUNKS: tl.constexpr, CAP: tl.constexpr,
    AREA: tl.constexpr, K_PAD: tl.constexpr, FB_BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr,
    SELECT: tl.constexpr, PAIRS: tl.constexpr, PREFETCH: tl.constexpr = 1,
    FINISH: tl.constexpr = True, KEYS: tl.constexpr = False,
):
    """One program per (row of this group, segment); the row's last segment to finish
    finishes the row (see the module docstring), or, FINISH off, `_topk_finish_kernel` does
    after this kernel."""
    SEGMENT: tl.constexpr = ROWS * BLOCK * CHUNKS
    pid = tl.program_id(0)
    local = pid // num_segments  # the row's slot in this group's scratch
    seg = pid % num_segments
    row = row_base + local
    row64 = row.to(tl.int64)
    state = state_ptr + row64 * STATE_WORDS
    area = local * AREA  # candidates [0, CAP), selected [CAP, CAP + K_PAD); fallback all
    gmax_row = local * (num_segments * BLOCK)
    n, start = _row_window(row, length, lengths_ptr, starts_ptr, LENGTHS, HAS_STARTS)
    seg_start = seg * SEGMENT
    n_segments = (n + SEGMENT - 1) // SEGMENT  # segments holding scores: one ticket each
    row_off = row64 * stride_sr + tl.cast(start, tl.int64) * stride_sl
    seg_off = row_off + tl.cast(seg_start, tl.int64) * stride_sl
    n_seg = tl.minimum(n - seg_start, SEGMENT)
    if n <= k:
        if seg == 0:  # the whole row is the set: identity (or sorted) then padding
            out_slots, n_sel = _whole_row(
                scores_ptr, row_off, stride_sl, n, keys_ptr, idx_ptr, area, k, K_PAD,
                FB_BLOCK, RADIX_BITS,
            )
            _emit(
                keys_ptr, idx_ptr, out_slots, n_sel, k, pad, row, row64, out_ptr,
                page_table_ptr, row_to_batch_ptr, pt_cols, stride_or, stride_ptb,
                stride_ptp, EPILOGUE, SORT, HAS_ROW_TO_BATCH, LOG2_PAGE, K_PAD,
            )
    elif seg_start < n:
        lo = tl.full((), 0xFFFFFFFF, tl.uint32)  # above every key: nothing collected
        if ESTIMATE:
            lo = tl.load(state + ST_ESTIMATE).to(tl.uint32, bitcast=True)
        _collect_segment(
            scores_ptr, seg_off, stride_sl, n_seg, seg_start, lo, keys_ptr, idx_ptr, area,
            state + ST_COUNT, gmax_ptr, gmax_row + seg * BLOCK,
            ESTIMATE, True, ROWS, BLOCK, CAP, KEYS, PREFETCH,
        )
        if FINISH:
            # Every thread's stores land before the ticket (release); the last segment to
            # finish sees them all (acquire) and finishes the row.
            tl.debug_barrier()
            ticket = tl.atomic_add(state + ST_TICKET, 1, sem="acq_rel")
            if ticket == n_segments - 1:
                m = tl.atomic_add(state + ST_COUNT, 0, sem="acquire")
                _finish_row(
                    scores_ptr, row_off, stride_sl, n, n_segments, k, pad, lo, m, row, row64,
                    state, out_ptr, page_table_ptr, row_to_batch_ptr, keys_ptr, idx_ptr,
                    gmax_ptr, area, gmax_row, idx_bits, pt_cols, stride_or, stride_ptb,
                    stride_ptp, EPILOGUE, SORT, HAS_ROW_TO_BATCH, LOG2_PAGE, SEGMENT, ROWS,
                    BLOCK, CAP, K_PAD, FB_BLOCK, RADIX_BITS, SELECT, PAIRS, KEYS,
                )


@triton.jit
def _finish_row(
    scores_ptr, row_off, stride_sl, n, n_segments, k, pad, lo, m, row, row64, state, out_ptr,
    page_table_ptr, row_to_batch_ptr, keys_ptr, idx_ptr, gmax_ptr, area, gmax_row, idx_bits,
    pt_cols, stride_or, stride_ptb, stride_ptp,
    EPILOGUE: tl.constexpr, SORT: tl.constexpr, HAS_ROW_TO_BATCH: tl.constexpr,
    LOG2_PAGE: tl.constexpr, SEGMENT: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
    CAP: tl.constexpr, K_PAD: tl.constexpr, FB_BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr,
    SELECT: tl.constexpr, PAIRS: tl.constexpr, KEYS: tl.constexpr,
):
    """A row whose m candidates (keys >= lo) are all collected: the exact select and the
    epilogue, or, when the estimate missed, the retry. KEYS: the walk stored the candidates'
    score bits (`_collect_segment`)."""
    if (m >= k) & (m <= CAP):
        if SORT == SORT_NONE:
            # Unsorted indices or pages: each selected pair goes straight to its output slot
            # from the candidates' tile (no store of the pairs and reload in `_emit`).
            take, key, idx = _take_candidates(
                scores_ptr, row_off, stride_sl, keys_ptr, idx_ptr, area, m, k, idx_bits, lo,
                CAP, RADIX_BITS, SELECT, PAIRS, KEYS,
            )
            slot = tl.cumsum(take.to(tl.int32), 0) - 1  # exactly k taken: slots 0 .. k - 1
            out_row = out_ptr + row64 * stride_or
            if EPILOGUE == EPI_INDICES:
                tl.store(out_row + slot, idx, mask=take)
            else:
                token = _page_tokens(idx, take, pad, row, row64, page_table_ptr,
                                     row_to_batch_ptr, pt_cols, stride_ptb, stride_ptp,
                                     HAS_ROW_TO_BATCH, LOG2_PAGE)  # fmt: skip
                tl.store(out_row + slot, token, mask=take)
        else:
            _select_candidates(
                scores_ptr, row_off, stride_sl, keys_ptr, idx_ptr, area, m, k, area + CAP,
                idx_bits, lo, CAP, RADIX_BITS, SELECT, PAIRS, KEYS,
            )
            _emit(
                keys_ptr, idx_ptr, area + CAP, k, k, pad, row, row64, out_ptr,
                page_table_ptr, row_to_batch_ptr, pt_cols, stride_or, stride_ptb,
                stride_ptp, EPILOGUE, SORT, HAS_ROW_TO_BATCH, LOG2_PAGE, K_PAD,
            )
    else:
        # The estimate missed (fewer than k above it, or more than CAP; rare): at least k
        # groups have a maximum >= the k-th largest group maximum, so at least k scores do;
        # this program collects those (no retry launch: a grid of programs that return at
        # once cost 2-7 us).
        bound = _radix_edge_global(gmax_ptr, gmax_row, n_segments * BLOCK, k, BLOCK, RADIX_BITS)
        tl.store(state + ST_BOUND, bound.to(tl.int32, bitcast=True))
        tl.store(state + ST_RETRY, 1)  # for tests: which branch the row took
        out_slots, n_sel = _retry_row(
            scores_ptr, row_off, stride_sl, n, n_segments, k, bound, state, keys_ptr,
            idx_ptr, gmax_ptr, area, idx_bits, SEGMENT, ROWS, BLOCK, CAP, K_PAD,
            FB_BLOCK, RADIX_BITS, SELECT, PAIRS,
        )
        _emit(
            keys_ptr, idx_ptr, out_slots, n_sel, k, pad, row, row64, out_ptr,
            page_table_ptr, row_to_batch_ptr, pt_cols, stride_or, stride_ptb,
            stride_ptp, EPILOGUE, SORT, HAS_ROW_TO_BATCH, LOG2_PAGE, K_PAD,
        )


# stride_sl specialized (see _topk_multi_kernel).
@triton.jit(do_not_specialize=["length", "pt_cols", "row_base", "idx_bits"])
def _topk_finish_kernel(
    # pointers
    scores_ptr, lengths_ptr, starts_ptr, row_to_batch_ptr, page_table_ptr, out_ptr, state_ptr,
    keys_ptr, idx_ptr, gmax_ptr,
    # sizes and scalars
    length, k, pad, pt_cols, row_base, num_segments, idx_bits,
    # strides, in elements
    stride_sr, stride_sl, stride_or, stride_ptb, stride_ptp,
    # switches
    LENGTHS: tl.constexpr, HAS_STARTS: tl.constexpr,
    HAS_ROW_TO_BATCH: tl.constexpr, EPILOGUE: tl.constexpr, SORT: tl.constexpr,
    LOG2_PAGE: tl.constexpr, ESTIMATE: tl.constexpr,
    # meta-parameters
    ROWS: tl.constexpr, BLOCK: tl.constexpr, CHUNKS: tl.constexpr, CAP: tl.constexpr,
    AREA: tl.constexpr, K_PAD: tl.constexpr, FB_BLOCK: tl.constexpr, RADIX_BITS: tl.constexpr,
    SELECT: tl.constexpr, PAIRS: tl.constexpr, KEYS: tl.constexpr = False,
):
    """One program per row of this group, after `_topk_multi_kernel` with FINISH off: the
    row's select and epilogue (rows no longer than k were done there)."""
    SEGMENT: tl.constexpr = ROWS * BLOCK * CHUNKS
    local = tl.program_id(0)
    row = row_base + local
    row64 = row.to(tl.int64)
    state = state_ptr + row64 * STATE_WORDS
    n, start = _row_window(row, length, lengths_ptr, starts_ptr, LENGTHS, HAS_STARTS)
    if n > k:
        n_segments = (n + SEGMENT - 1) // SEGMENT
        row_off = row64 * stride_sr + tl.cast(start, tl.int64) * stride_sl
        lo = tl.full((), 0xFFFFFFFF, tl.uint32)
        if ESTIMATE:
            lo = tl.load(state + ST_ESTIMATE).to(tl.uint32, bitcast=True)
        m = tl.load(state + ST_COUNT)
        _finish_row(
            scores_ptr, row_off, stride_sl, n, n_segments, k, pad, lo, m, row, row64, state,
            out_ptr, page_table_ptr, row_to_batch_ptr, keys_ptr, idx_ptr, gmax_ptr,
            local * AREA, local * (num_segments * BLOCK), idx_bits, pt_cols, stride_or,
            stride_ptb, stride_ptp, EPILOGUE, SORT, HAS_ROW_TO_BATCH, LOG2_PAGE, SEGMENT,
            ROWS, BLOCK, CAP, K_PAD, FB_BLOCK, RADIX_BITS, SELECT, PAIRS, KEYS,
        )


# fmt: on
# ---------------------------------------------------------------------------------------------
# launchers

KERNEL_NAME = "topk"
CONFIG_FIELDS = ("BLOCK", "RADIX_BITS", "PROGRAMS_PER_SM", "num_warps", "TILE_MAX")
# The multi-program path: when it is taken (MIN_LENGTH, MIN_ELEMENTS = rows · length, MAX_ROWS:
# beyond it the row path takes the rows; sm90 sets no limit since the multi path won at every row
# count measured), its chunk (MULTI_ROWS x MULTI_BLOCK scores, MULTI_BLOCK strided groups),
# chunks per segment, candidate capacity, sample size, warps, register cap (MULTI_MAXNREG > 0:
# Triton's maxnreg for the multi-program kernel, CUDA only; 0 the compiler's choice) and how a
# full segment streams (MULTI_PREFETCH 1: the next chunk's loads issued before the current one
# is absorbed; 2: the next two chunks'; 3 / 4: through Triton's pipeliner, async copies to
# shared memory with that many stages), and who finishes a row (MULTI_FINISH_WARPS 0: its last
# segment's program in the collect kernel; > 0: a second kernel, one program of that many warps
# per row, after the collect kernel).
MULTI_FIELDS = (
    "MULTI_MIN_LENGTH", "MULTI_MIN_ELEMENTS", "MULTI_MAX_ROWS", "MULTI_BLOCK", "MULTI_ROWS",
    "MULTI_CHUNKS", "MULTI_CAP", "MULTI_SAMPLE", "MULTI_WARPS", "MULTI_MAXNREG", "MULTI_PREFETCH",
    "MULTI_FINISH_WARPS",
)  # fmt: skip
TABLE_FIELDS = (*CONFIG_FIELDS, *MULTI_FIELDS)
# Not in the table: chosen per call (SEGMENTS > 1 splits each row over that many programs;
# MULTI_ESTIMATE 0 skips the sample estimate, every long row is then retried;
# MULTI_SAMPLE_WARPS > 0: the sample estimate's warps, else MULTI_WARPS; MULTI_BISECT_PAIRS 1:
# the sample's and the finishing select's bisections resolve two bits a count).
# TILE_SELECT: the descent of the register-tile selects and of the multi path's sample
# estimate, SELECT_RADIX or SELECT_BISECT (default DEFAULT_TILE_SELECT). MULTI_KEYS: whether the
# collect kernel's walk stores the candidates' scores beside their indices (1) or the finishing
# select gathers them by index (0); -1, `_multi_plan`'s rule (MULTI_KEYS_MIN_K). MULTI_INTERP
# 1: the multi path's finishing select counts at interpolated points (SELECT_INTERP) where
# TILE_SELECT bisects; 2 (DEFAULT_MULTI_INTERP): its sample estimate too
# (SELECT_INTERP_SAMPLE); 0: one count per bit.
OVERRIDE_FIELDS = (
    *TABLE_FIELDS, "SEGMENTS", "MULTI_ESTIMATE", "TILE_SELECT", "MULTI_SAMPLE_WARPS",
    "MULTI_BISECT_PAIRS", "MULTI_KEYS", "MULTI_INTERP",
)  # fmt: skip
PATHS = ("auto", "row", "multi")
PATH_ENV = "FXFUSE_TOPK_PATH"
# A segment's column holds MULTI_ROWS x MULTI_CHUNKS scores, tracked as one uint32 bit mask.
MULTI_COLUMN_BITS = 32
# Scratch of the multi-program path per launch group; more rows run as several groups.
MULTI_SCRATCH_BYTES = 256 * 2**20
MAX_K = 2048
# The smallest candidate tile the multi path's plan picks below MULTI_CAP (measured: 2048 for
# k <= 512, 1.08-1.23x faster than 4096 at 64 x 128K ... 16384 x 17920; smaller tiles untimed).
MULTI_CAP_MIN = 2048
# The walk stores the candidates' scores where a separate kernel finishes the rows and k is at
# least this (H100, 2026-12-07, against gathering them in the finish: 256 x 128K k 2048 110.0 ->
# 105.2 us, 1 x 128K 25.4 -> 24.4, 64 x 128K 44.0 -> 44.2; slower at k 512, by 1-3 us, and
# where the collect kernel finishes, 16384 x 17920 by 10 %; k 513-1023 untimed).
MULTI_KEYS_MIN_K = 1024
# The row path's register-tile mode (rows of length <= the table's TILE_MAX): at most this.
MAX_TILE = 16384
INDEX_DTYPES = (torch.int32, torch.int64)
DEFAULT_TILE_SELECT = SELECT_BISECT.value
# The multi path's finishing select interpolates (H100, 2026-12-07, against one count per bit,
# every shape exact: 256 x 128K k 2048 106.2 -> 104.4 us, 64 x 128K 43.9 -> 41.6, 1 x 128K
# 24.4 -> 22.5, 1024 x 32768 140.3 -> 134.2, 16384 x 17920 1650 -> 1479; k 512 flat at
# 256 x 128K, 3-11 % faster elsewhere; benchmarks/results/topk_interp_h100_2026-12-07.json).
# Its sample estimate too (2; H100, 2026-12-07, against 1, every shape exact and faster, both
# rounds: 256 x 128K k 2048 103.6 -> 100.5 us (the sample kernel 15.6 -> 12.5), k 512 89.9 ->
# 88.5; 64 x 128K 41.4 -> 40.8; 1 x 128K 22.6 -> 20.0; 16384 x 17920 1476 -> 1434 and 1091 ->
# 1033; 1024 x 32768 132.7 -> 131.4; benchmarks/results/topk_isample_h100_2026-12-07.json).
DEFAULT_MULTI_INTERP = 2
# The interpreter runs programs one after another: a small persistent grid suffices.
CPU_PROGRAMS = 2


def _use_reference(device: torch.device) -> bool:
    """A CPU tensor without Triton's interpreter runs the torch reference (SPEC §4)."""
    return device.type == "cpu" and not interpreting()


def _check_scores(name: str, scores) -> None:
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2:
        raise ValueError(
            f"{name}: expected a 2-D (R, L) tensor, got {getattr(scores, 'shape', type(scores))}"
        )
    if scores.dtype not in topk_ref.FLOAT_DTYPES:
        raise ValueError(
            f"{name}: dtype must be one of {topk_ref.FLOAT_DTYPES}, got {scores.dtype}"
        )


def _check_k(k) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
        raise ValueError(f"k: expected an int in [1, {MAX_K}], got {k!r}")


def _check_rows(name: str, t, num_rows: int, device: torch.device) -> None:
    if t is None:
        return
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] != num_rows:
        shape = tuple(getattr(t, "shape", ()))
        raise ValueError(f"{name}: expected a 1-D tensor of {num_rows} entries, got {shape}")
    if t.dtype not in INDEX_DTYPES or t.device != device:
        raise ValueError(f"{name}: expected int32 / int64 on {device}, got {t.dtype} on {t.device}")


def _check_pad(pad) -> None:
    if not isinstance(pad, int) or isinstance(pad, bool) or not -(2**31) <= pad < 2**31:
        raise ValueError(f"pad: expected an int32 value, got {pad!r}")


def _check_power_of_two(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or value & (value - 1):
        raise ValueError(f"{name}: expected a power of 2, got {value!r}")
    return value.bit_length() - 1


def _launch_config(target, device, rows, length, k, config) -> dict:
    target = detect_target(device) if target is None else target
    if target not in TARGETS:
        raise ValueError(f"target: unknown {target!r}; expected one of {TARGETS}")
    resolved = launch_tables.lookup(KERNEL_NAME, target, rows=rows, length=length, topk=k)
    resolved["SEGMENTS"] = 0  # 0: decided by _num_segments
    resolved["MULTI_ESTIMATE"] = 1
    resolved["TILE_SELECT"] = DEFAULT_TILE_SELECT
    resolved["MULTI_SAMPLE_WARPS"] = 0
    resolved["MULTI_BISECT_PAIRS"] = 0
    resolved["MULTI_KEYS"] = -1
    resolved["MULTI_INTERP"] = DEFAULT_MULTI_INTERP
    if config:
        unknown = sorted(set(config) - set(OVERRIDE_FIELDS))
        if unknown:
            raise ValueError(
                f"config: unknown keys {unknown}; expected a subset of {OVERRIDE_FIELDS}"
            )
        resolved.update(config)

    def check(name, ok, what):
        value = resolved[name]
        if isinstance(value, bool) or not isinstance(value, int) or not ok(value):
            raise ValueError(f"config: {name} must be {what}, got {value!r}")

    def pow2(v):
        return v > 0 and not v & (v - 1)

    check("BLOCK", lambda v: v >= 16 and pow2(v), "a power of 2 >= 16")
    check("RADIX_BITS", lambda v: 4 <= v <= 8, "in 4..8")
    check("PROGRAMS_PER_SM", lambda v: v >= 1, "a positive int")
    check("TILE_MAX", lambda v: pow2(v) and v <= MAX_TILE, f"a power of 2 <= {MAX_TILE}")
    for name in ("num_warps", "MULTI_WARPS"):
        check(name, lambda v: v in launch_tables.NUM_WARPS, f"one of {launch_tables.NUM_WARPS}")
    check("SEGMENTS", lambda v: v >= 0, "a non-negative int")
    for name in ("MULTI_MIN_LENGTH", "MULTI_MIN_ELEMENTS", "MULTI_MAX_ROWS", "MULTI_CHUNKS"):
        check(name, lambda v: v >= 1, "a positive int")
    for name in ("MULTI_BLOCK", "MULTI_CAP"):
        check(name, lambda v: v >= 16 and pow2(v), "a power of 2 >= 16")
    check("MULTI_ROWS", pow2, "a power of 2")
    if resolved["MULTI_ROWS"] * resolved["MULTI_CHUNKS"] > MULTI_COLUMN_BITS:
        raise ValueError(
            f"config: MULTI_ROWS x MULTI_CHUNKS must be <= {MULTI_COLUMN_BITS} (a segment's "
            f"column is one bit mask), got {resolved['MULTI_ROWS']} x {resolved['MULTI_CHUNKS']}"
        )
    check("MULTI_SAMPLE", lambda v: v >= 2 * SAMPLE_SECTOR.value and pow2(v),
          f"a power of 2 >= {2 * SAMPLE_SECTOR.value}")  # fmt: skip
    check("MULTI_ESTIMATE", lambda v: v in (0, 1), "0 or 1")
    check("MULTI_BISECT_PAIRS", lambda v: v in (0, 1), "0 or 1")
    check("MULTI_KEYS", lambda v: v in (-1, 0, 1), "-1 (the plan's rule), 0 or 1")
    check("MULTI_INTERP", lambda v: v in (0, 1, 2), "0, 1 or 2")
    check("MULTI_PREFETCH", lambda v: v in (1, 2, 3, 4),
          "1, 2 (chunks of loads in flight) or 3, 4 (Triton's pipeliner's stages)")  # fmt: skip
    check("MULTI_FINISH_WARPS", lambda v: v == 0 or v in launch_tables.NUM_WARPS,
          f"0 (the collect kernel finishes) or one of {launch_tables.NUM_WARPS}")  # fmt: skip
    check("MULTI_SAMPLE_WARPS", lambda v: v == 0 or v in launch_tables.NUM_WARPS,
          f"0 (MULTI_WARPS) or one of {launch_tables.NUM_WARPS}")  # fmt: skip
    check("MULTI_MAXNREG", lambda v: v == 0 or 24 <= v <= 255,
          "0 (the compiler's choice) or in 24..255")  # fmt: skip
    if resolved["MULTI_MAXNREG"] and target.startswith("gfx"):
        raise ValueError(
            f"config: MULTI_MAXNREG caps CUDA registers; target {target} takes 0, got "
            f"{resolved['MULTI_MAXNREG']}"
        )
    check("TILE_SELECT", lambda v: v in (SELECT_RADIX.value, SELECT_BISECT.value),
          f"{SELECT_RADIX.value} (radix) or {SELECT_BISECT.value} (bisect)")  # fmt: skip
    return resolved


def _resolve_path(path) -> str:
    """The path a call asked for: the `path` argument, else $FXFUSE_TOPK_PATH, else "auto"."""
    if path is None:
        env = os.environ.get(PATH_ENV, "").strip()
        if env and env not in PATHS:
            raise ValueError(f"{PATH_ENV}: unknown path {env!r}; expected one of {PATHS}")
        return env or "auto"
    if path not in PATHS:
        raise ValueError(f"path: unknown {path!r}; expected one of {PATHS}")
    return path


def _num_programs(device: torch.device, per_sm: int) -> int:
    if device.type != "cuda":
        return CPU_PROGRAMS
    return torch.cuda.get_device_properties(device).multi_processor_count * per_sm


def _num_segments(cfg, rows, length, k_pad, slots, splittable) -> int:
    """Split rows over programs when there are too few rows to fill the GPU."""
    if cfg["SEGMENTS"]:
        return min(cfg["SEGMENTS"], max(1, length)) if splittable else 1
    if not splittable or 2 * rows >= slots:
        return 1
    # A segment should be a few times k long, or the merge reads nearly as much as the row.
    min_seg = max(4 * k_pad, 2 * cfg["BLOCK"])
    return max(1, min(length // min_seg, triton.cdiv(slots, rows)))


def _launch(
    scores, k, out, *, epilogue, sort, lengths=None, row_starts=None, positions=None,
    pad=-1, page_table=None, page_size=1, row_to_batch=None, block_size=128, n_init=0,
    n_local=0, pages_per_block=0, num_kv_heads=1, pages=None, ctx=None, mask_repeat=1,
    mask_fill=1, mask_selected=0, masked_tail=False, mask_finite=False,
    config=None, target=None, path=None,
):  # fmt: skip
    """Check the config, pick the path, allocate scratch, launch. Returns the multi-program
    path's per-row state, None on the row path."""
    rows, length = scores.shape
    device = scores.device
    cfg = _launch_config(target, device, rows, length, k, config)
    path = _resolve_path(path)
    # The multi-program path covers the index and page epilogues over plain rows; block
    # tables, masks and masked tails always take the row path.
    covered = (
        epilogue in (EPI_INDICES.value, EPI_PAGES.value)
        and positions is None
        and not masked_tail
        and 1 <= length <= 2**30
    )
    few_long_rows = (
        length >= cfg["MULTI_MIN_LENGTH"]
        and rows * length >= cfg["MULTI_MIN_ELEMENTS"]
        and rows <= cfg["MULTI_MAX_ROWS"]
    )
    if covered and (path == "multi" or (path == "auto" and few_long_rows)):
        return _launch_multi(
            scores, k, out, cfg, epilogue=epilogue, sort=sort, lengths=lengths,
            row_starts=row_starts, pad=pad, page_table=page_table, page_size=page_size,
            row_to_batch=row_to_batch,
        )  # fmt: skip
    block, radix, per_sm, warps, tile_max = (cfg[f] for f in CONFIG_FIELDS)
    k_pad = triton.next_power_of_2(k)
    slots = _num_programs(device, per_sm)
    segments = _num_segments(cfg, rows, length, k_pad, slots, positions is None)
    # Whole rows that fit a register tile skip the candidate buffer (kernel docstring).
    tile = triton.next_power_of_2(length) if segments == 1 and length <= tile_max else 0
    # The buffer keeps up to CAP - BLOCK pairs after a compaction, so a whole chunk always fits.
    cap = 0 if tile else 2 * block + k_pad
    seg_len = triton.cdiv(length, segments)
    pair_area = rows * segments * k if segments > 1 else 0
    merge_cap = segments * k
    grid_stream = min(rows * segments, slots)
    grid_merge = min(rows, slots) if segments > 1 else 0
    scratch = pair_area + max(grid_stream * (2 * cap + k_pad), grid_merge * (2 * merge_cap + k_pad))
    keys = torch.empty(scratch, dtype=torch.int32, device=device)
    idx = torch.empty(scratch, dtype=torch.int32, device=device)

    dummy = out  # unused pointers: the constexpr switches never touch them
    lengths_mode = 0 if lengths is None else (3 if masked_tail else 1)
    if positions is not None:
        lengths_mode = 2
    page_strides = (0, 0) if page_table is None else page_table.stride()
    common = {
        "LENGTHS": lengths_mode,
        "HAS_STARTS": row_starts is not None,
        "HAS_ROW_TO_BATCH": row_to_batch is not None,
        "LOG2_PAGE": page_size.bit_length() - 1,
        "LOG2_BLOCK": block_size.bit_length() - 1,
        "PAGES_PER_BLOCK": pages_per_block,
        "NUM_KV_HEADS": num_kv_heads,
        "MASK_REPEAT": mask_repeat,
        "MASK_FILL": mask_fill,
        "MASK_SELECTED": mask_selected,
        "MASK_FINITE": mask_finite,
        "BLOCK": block,
        "K_PAD": k_pad,
        "RADIX_BITS": radix,
        "SELECT": cfg["TILE_SELECT"],
        "num_warps": warps,
    }

    def run(grid, stage, epi, srt, cap_, region_base):
        launch(_topk_kernel, (grid,),
            scores,
            dummy if lengths is None else lengths,
            dummy if row_starts is None else row_starts,
            dummy if positions is None else positions,
            dummy if row_to_batch is None else row_to_batch,
            dummy if page_table is None else page_table,
            out,
            dummy if pages is None else pages,
            dummy if ctx is None else ctx,
            keys,
            idx,
            rows,
            length,
            k,
            pad,
            n_init,
            n_local,
            0 if page_table is None else page_table.shape[1],
            segments,
            seg_len,
            region_base,
            scores.stride(0),
            scores.stride(1),
            out.stride(0),
            0 if pages is None else pages.stride(0),
            page_strides[0],
            page_strides[1],
            STAGE=stage,
            EPILOGUE=epi,
            SORT=srt,
            CAP=cap_,
            TILE=tile,
            TILE_BITS=max(1, tile.bit_length() - 1),
            **common,
        )

    if segments == 1:
        run(grid_stream, STAGE_ROW.value, epilogue, sort, cap, 0)
    else:
        run(grid_stream, STAGE_SEGMENT.value, EPI_PAIRS.value, SORT_NONE.value, cap, pair_area)
        run(grid_merge, STAGE_MERGE.value, epilogue, sort, merge_cap, pair_area)


def _multi_plan(cfg: dict, rows: int, length: int, k: int) -> dict:
    """Sizes of the multi-program path for one call (all host-side, from shapes only)."""
    k_pad = triton.next_power_of_2(k)
    # BLOCK >= k: a row longer than k then has >= k non-empty groups, so the group-max bound
    # exists. CAP: the finishing select's tile, whose every count costs in proportion to it.
    # The sample estimate leaves ~max(1.5 k, L · MIN_RANK / SAMPLE) candidates (its rank is at
    # least SAMPLE / 128); twice that (a power of 2, >= MULTI_CAP_MIN) leaves room for its
    # spread, at most MULTI_CAP, and never below 2 k.
    block = max(cfg["MULTI_BLOCK"], k_pad)
    sample = cfg["MULTI_SAMPLE"]
    expected = max(3 * k / 2, length * max(1, sample // 128) / sample)
    wanted = max(MULTI_CAP_MIN, triton.next_power_of_2(math.ceil(2 * expected)))
    cap = max(min(cfg["MULTI_CAP"], wanted), 2 * k_pad)
    segment = block * cfg["MULTI_ROWS"] * cfg["MULTI_CHUNKS"]
    segments = triton.cdiv(length, segment)
    fallback = 2 * (2 * FALLBACK_BLOCK.value + k_pad) + k_pad
    area = max(cap + k_pad, fallback)  # pairs per row
    gmax_row = segments * block
    per_row = 8 * area + 4 * gmax_row
    group = max(1, min(rows, MULTI_SCRATCH_BYTES // per_row))
    if group * max(area, gmax_row) >= 2**31:
        group = max(1, (2**31 - 1) // max(area, gmax_row))
    return {
        "k_pad": k_pad, "block": block, "rows": cfg["MULTI_ROWS"], "chunks": cfg["MULTI_CHUNKS"],
        "cap": cap,
        "segments": segments, "area": area, "gmax_row": gmax_row, "group": group,
        "sample": cfg["MULTI_SAMPLE"], "warps": cfg["MULTI_WARPS"],
        "sample_warps": cfg["MULTI_SAMPLE_WARPS"] or cfg["MULTI_WARPS"],
        "estimate": cfg["MULTI_ESTIMATE"],
        "finish_warps": cfg["MULTI_FINISH_WARPS"],
        "select": ((SELECT_INTERP.value, SELECT_INTERP_SAMPLE.value)[cfg["MULTI_INTERP"] - 1]
                   if cfg["MULTI_INTERP"] and cfg["TILE_SELECT"] == SELECT_BISECT.value
                   else cfg["TILE_SELECT"]),
        "keys": bool(cfg["MULTI_FINISH_WARPS"] and k >= MULTI_KEYS_MIN_K
                     if cfg["MULTI_KEYS"] < 0 else cfg["MULTI_KEYS"]),
        "launch": {"maxnreg": cfg["MULTI_MAXNREG"]} if cfg["MULTI_MAXNREG"] else {},
    }  # fmt: skip


def _launch_multi(
    scores, k, out, cfg, *, epilogue, sort, lengths, row_starts, pad, page_table, page_size,
    row_to_batch,
):  # fmt: skip
    """The multi-program path: per group of rows, the sample estimate (one program per row)
    and the collect kernel (one program per row and segment; a row whose estimate missed is
    retried by its last segment's program). No host sync. Returns the per-row state (rows,
    STATE_WORDS) (tests read which branch each row took)."""
    rows, length = scores.shape
    device = scores.device
    plan = _multi_plan(cfg, rows, length, k)
    group = plan["group"]
    # The sample kernel writes every state word of its rows; without it they start at 0.
    new_state = torch.empty if plan["estimate"] else torch.zeros
    state = new_state(rows * STATE_WORDS.value, dtype=torch.int32, device=device)
    keys = torch.empty(group * plan["area"], dtype=torch.int32, device=device)
    idx = torch.empty(group * plan["area"], dtype=torch.int32, device=device)
    gmax = torch.empty(group * plan["gmax_row"], dtype=torch.int32, device=device)
    dummy = out  # unused pointers: the constexpr switches never touch them
    lengths_mode = LEN_FULL.value if lengths is None else LEN_ARRAY.value
    page_strides = (0, 0) if page_table is None else page_table.stride()
    idx_bits = max(1, (length - 1).bit_length())
    for row_base in range(0, rows, group):
        group_rows = min(group, rows - row_base)
        if plan["estimate"]:
            launch(_topk_sample_kernel, (group_rows,),
                scores, dummy if lengths is None else lengths,
                dummy if row_starts is None else row_starts, state,
                length, k, row_base, scores.stride(0), scores.stride(1),
                LENGTHS=lengths_mode, HAS_STARTS=row_starts is not None,
                SAMPLE=plan["sample"], SECTOR=SAMPLE_SECTOR.value,
                MIN_RANK=max(1, plan["sample"] // 128), RADIX_BITS=SELECT_BITS.value,
                SELECT=plan["select"], PAIRS=bool(cfg["MULTI_BISECT_PAIRS"]),
                num_warps=plan["sample_warps"],
            )  # fmt: skip
        args = (
            scores, dummy if lengths is None else lengths,
            dummy if row_starts is None else row_starts,
            dummy if row_to_batch is None else row_to_batch,
            dummy if page_table is None else page_table,
            out, state, keys, idx, gmax,
            length, k, pad, 0 if page_table is None else page_table.shape[1], row_base,
            plan["segments"], idx_bits,
            scores.stride(0), scores.stride(1), out.stride(0), page_strides[0],
            page_strides[1],
        )  # fmt: skip
        meta = dict(
            LENGTHS=lengths_mode, HAS_STARTS=row_starts is not None,
            HAS_ROW_TO_BATCH=row_to_batch is not None, EPILOGUE=epilogue, SORT=sort,
            LOG2_PAGE=page_size.bit_length() - 1, ESTIMATE=plan["estimate"],
            ROWS=plan["rows"], BLOCK=plan["block"], CHUNKS=plan["chunks"], CAP=plan["cap"],
            AREA=plan["area"], K_PAD=plan["k_pad"], FB_BLOCK=FALLBACK_BLOCK.value,
            RADIX_BITS=SELECT_BITS.value, SELECT=plan["select"],
            PAIRS=bool(cfg["MULTI_BISECT_PAIRS"]), KEYS=plan["keys"],
        )  # fmt: skip
        finish_warps = plan["finish_warps"]
        launch(_topk_multi_kernel, (group_rows * plan["segments"],), *args, **meta,
               PREFETCH=cfg["MULTI_PREFETCH"], FINISH=not finish_warps,
               num_warps=plan["warps"], **plan["launch"])  # fmt: skip
        if finish_warps:
            launch(_topk_finish_kernel, (group_rows,), *args, **meta, num_warps=finish_warps)
    return state.view(rows, STATE_WORDS.value)


@planned
def topk_indices(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None = None,
    row_starts: torch.Tensor | None = None,
    sorted: bool = False,
    pad: int = -1,
    *,
    config: dict | None = None,
    target: str | None = None,
    path: str | None = None,
) -> torch.Tensor:
    """Per-row top-k row-local indices, int32 (R, k), front-packed, `pad` elsewhere
    (`topk_ref.topk_indices_ref`; unsorted order unspecified). path "row" / "multi" forces a
    kernel path (default: $FXFUSE_TOPK_PATH, else "auto", chosen by the launch table)."""
    _check_scores("scores", scores)
    _check_k(k)
    rows = scores.shape[0]
    _check_rows("lengths", lengths, rows, scores.device)
    _check_rows("row_starts", row_starts, rows, scores.device)
    _check_pad(pad)
    _resolve_path(path)
    if _use_reference(scores.device):
        return topk_ref.topk_indices_ref(scores, k, lengths, row_starts, sorted, pad)
    out = torch.empty((rows, k), dtype=torch.int32, device=scores.device)
    if rows:
        _launch(
            scores, k, out, epilogue=EPI_INDICES.value,
            sort=SORT_VALUE.value if sorted else SORT_NONE.value,
            lengths=lengths, row_starts=row_starts, pad=pad, config=config, target=target,
            path=path,
        )  # fmt: skip
    return out


@planned
def topk_page_transform(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor,
    page_table: torch.Tensor | None,
    page_size: int,
    row_starts: torch.Tensor | None = None,
    row_to_batch: torch.Tensor | None = None,
    sorted: bool = False,
    pad: int = -1,
    *,
    config: dict | None = None,
    target: str | None = None,
    path: str | None = None,
) -> torch.Tensor:
    """Top-k per row, indices mapped through the page table (DeepSeek-V3.2 / GLM-5 DSA):
    out = pt[b, i >> log2(ps)] << log2(ps) | (i & (ps - 1)), `pad` elsewhere
    (`topk_ref.topk_page_transform_ref`); no page table (page size 1, no row_to_batch): the
    row-local indices, as `topk_indices`. path: as for `topk_indices`."""
    _check_scores("scores", scores)
    _check_k(k)
    _check_pad(pad)
    rows = scores.shape[0]
    if lengths is None:
        raise ValueError("lengths: required for the page transform, got None")
    _check_rows("lengths", lengths, rows, scores.device)
    _check_rows("row_starts", row_starts, rows, scores.device)
    _check_rows("row_to_batch", row_to_batch, rows, scores.device)
    _check_power_of_two("page_size", page_size)
    if page_table is None:
        if page_size != 1 or row_to_batch is not None:
            raise ValueError(
                "page_table: None (the row-local indices) takes page_size 1 and no "
                f"row_to_batch, got page_size {page_size}"
            )
        return topk_indices(scores, k, lengths, row_starts, sorted, pad, config=config,
                            target=target, path=path)  # fmt: skip
    if (
        not isinstance(page_table, torch.Tensor)
        or page_table.dim() != 2
        or page_table.dtype not in INDEX_DTYPES
        or page_table.device != scores.device
    ):
        raise ValueError(
            f"page_table: expected a 2-D int32 / int64 tensor on {scores.device}, got "
            f"{tuple(getattr(page_table, 'shape', ()))} {getattr(page_table, 'dtype', None)}"
        )
    if row_to_batch is None and page_table.shape[0] < rows:
        raise ValueError(
            f"page_table: needs a row per score row ({rows}) without row_to_batch, "
            f"got {page_table.shape[0]}"
        )
    _resolve_path(path)
    if _use_reference(scores.device):
        return topk_ref.topk_page_transform_ref(
            scores, k, lengths, page_table, page_size, row_starts, row_to_batch, sorted, pad
        )
    out = torch.empty((rows, k), dtype=torch.int32, device=scores.device)
    if rows:
        _launch(
            scores, k, out, epilogue=EPI_PAGES.value,
            sort=SORT_VALUE.value if sorted else SORT_NONE.value,
            lengths=lengths, row_starts=row_starts, page_table=page_table, page_size=page_size,
            row_to_batch=row_to_batch, pad=pad, config=config, target=target, path=path,
        )  # fmt: skip
    return out


@planned
def topk_block_table(
    block_scores: torch.Tensor,
    k: int,
    positions: torch.Tensor,
    block_size: int = 128,
    n_init: int = 1,
    n_local: int = 1,
    pages_per_block: int | None = None,
    num_kv_heads: int = 1,
    *,
    config: dict | None = None,
    target: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """MiniMax-M3 block table: (blocks (..., k), pages (..., k·ppb) or None, ctx_lens (...,)),
    `...` = block_scores.shape[:-1] (`topk_ref.topk_block_table_ref` has the contract)."""
    if not isinstance(block_scores, torch.Tensor) or block_scores.dim() not in (2, 3):
        raise ValueError(
            "block_scores: expected (R, NB) or (Q, Hkv, NB), got "
            f"{getattr(block_scores, 'shape', type(block_scores))}"
        )
    if block_scores.dim() == 3:
        if num_kv_heads not in (1, block_scores.shape[1]):
            raise ValueError(
                f"num_kv_heads: {num_kv_heads} disagrees with block_scores' head dim "
                f"{block_scores.shape[1]}"
            )
        num_kv_heads = block_scores.shape[1]
    lead = block_scores.shape[:-1]
    scores = block_scores.reshape(-1, block_scores.shape[-1])
    _check_scores("block_scores", scores)
    _check_k(k)
    if not isinstance(num_kv_heads, int) or num_kv_heads < 1 or scores.shape[0] % num_kv_heads:
        raise ValueError(
            f"num_kv_heads: expected a divisor of {scores.shape[0]} rows, got {num_kv_heads!r}"
        )
    _check_rows("positions", positions, scores.shape[0] // num_kv_heads, scores.device)
    _check_power_of_two("block_size", block_size)
    for name, value in (("n_init", n_init), ("n_local", n_local)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: expected a non-negative int, got {value!r}")
    if n_init + n_local > k:
        raise ValueError(f"n_init: n_init + n_local = {n_init + n_local} must not exceed k = {k}")
    if pages_per_block is not None and (
        not isinstance(pages_per_block, int) or not 1 <= pages_per_block <= block_size
    ):
        raise ValueError(
            f"pages_per_block: expected None or an int in [1, {block_size}], got {pages_per_block!r}"
        )
    if _use_reference(scores.device):
        blocks, pages, ctx = topk_ref.topk_block_table_ref(
            scores, k, positions, block_size, n_init, n_local, pages_per_block, num_kv_heads
        )
    else:
        rows = scores.shape[0]
        blocks = torch.empty((rows, k), dtype=torch.int32, device=scores.device)
        ctx = torch.empty((rows,), dtype=torch.int32, device=scores.device)
        pages = None
        if pages_per_block is not None:
            pages = torch.empty(
                (rows, k * pages_per_block), dtype=torch.int32, device=scores.device
            )
        if rows:
            _launch(
                scores, k, blocks, epilogue=EPI_BLOCKS.value, sort=SORT_INDEX.value,
                positions=positions, block_size=block_size, n_init=n_init, n_local=n_local,
                pages_per_block=pages_per_block or 0, num_kv_heads=num_kv_heads, pages=pages,
                ctx=ctx, config=config, target=target,
            )  # fmt: skip
    blocks = blocks.reshape(*lead, k)
    pages = None if pages is None else pages.reshape(*lead, -1)
    return blocks, pages, ctx.reshape(lead)


@planned
def topk_mask(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None = None,
    kind: str = "bool",
    block_size: int = 1,
    *,
    dtype: torch.dtype | None = None,
    masked_value: bool | float | None = None,
    selected_value: bool | float | None = None,
    masked_tail: bool = False,
    finite_only: bool = False,
    config: dict | None = None,
    target: str | None = None,
) -> torch.Tensor:
    """The top-k of each row scattered into a mask (R, L·block_size) (`topk_ref.topk_mask_ref`
    has the contract): kind "bool" True where masked out, "keep" True where selected, "additive"
    0 where selected and -inf elsewhere in `dtype` (default scores.dtype); masked_value /
    selected_value override the kind's two values. masked_tail: columns past lengths[r] are
    -inf candidates (the graph masked the scores) instead of absent. finite_only: a selected
    column whose score is -inf (or NaN) stays masked (the graph padded such picks)."""
    _check_scores("scores", scores)
    _check_k(k)
    rows, length = scores.shape
    _check_rows("lengths", lengths, rows, scores.device)
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
        raise ValueError(f"block_size: expected a positive int, got {block_size!r}")
    dtype, masked_value, selected_value = topk_ref.mask_values(
        kind, scores.dtype, dtype, masked_value, selected_value
    )
    if masked_tail and lengths is None:
        raise ValueError("masked_tail: needs lengths")
    if not isinstance(finite_only, bool):
        raise ValueError(f"finite_only: expected a bool, got {finite_only!r}")
    if _use_reference(scores.device):
        return topk_ref.topk_mask_ref(
            scores, k, lengths, kind, block_size, dtype, masked_value, selected_value,
            masked_tail, finite_only,
        )  # fmt: skip
    width = length * block_size
    mask = torch.empty((rows, width), dtype=dtype, device=scores.device)
    # The kernel stores the two values' bit patterns through an integer view: no float
    # conversion in the kernel.
    int_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[mask.element_size()]
    out = mask.view(int_dtype)
    fill, selected = (
        torch.tensor(v, dtype=dtype).view(int_dtype).item() for v in (masked_value, selected_value)
    )
    if rows and width:
        _launch(
            scores, k, out, epilogue=EPI_MASK.value, sort=SORT_NONE.value, lengths=lengths,
            mask_repeat=block_size, mask_fill=fill, mask_selected=selected,
            masked_tail=masked_tail, mask_finite=finite_only, config=config, target=target,
        )  # fmt: skip
    return mask
