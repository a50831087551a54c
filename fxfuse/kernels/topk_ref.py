"""Torch references of the top-k → sparse-block builds (SPEC §3 "Top-k families"): the exact
semantics the Triton kernels in `topk.py` implement.

Shared contract. Scores are fp32 / bf16 / fp16 rows (R, L) with any strides. Row r reads
    scores[r, start_r : start_r + n_r],   start_r = clamp(row_starts[r], 0, L)   (0 without row_starts)
                                          n_r     = clamp(lengths[r], 0, L - start_r)   (L without lengths)
and indices are row-local (0 .. n_r - 1). Ranking is by the order-preserving uint32 key of the
fp32 value (`score_keys_ref`): NaN ranks as -inf, -0.0 equals +0.0. The selected set is the first
min(k, n_r) elements in (score descending, index ascending) order, so ties take the lowest indices
and the set is deterministic. Outputs are int32 (R, k), valid entries front-packed, every other
slot the padding value.
    sorted=True:  values descending, equal values lower index first. This applies to rows with
                  n_r <= k too (their set is the whole row).
    sorted=False: the kernels' order is unspecified; the references return ascending indices, so
                  a row with n_r <= k gives the identity 0 .. n_r - 1.
"""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Block-table forced blocks outrank every real key (+inf's key is 0xFF800000).
FORCED_KEY = 1 << 32


def score_keys_ref(scores: torch.Tensor) -> torch.Tensor:
    """Order-preserving key of each score as int64 in [0, 2^32): a > b  <=>  key(a) > key(b).

    fp32 bits with the sign bit flipped for positives and all bits flipped for negatives; NaN takes
    the key of -inf and -0.0 that of +0.0.
    """
    x = scores.float()
    x = torch.where(torch.isnan(x), float("-inf"), x)
    x = torch.where(x == 0, 0.0, x)  # -0.0 -> +0.0
    bits = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    negative = bits >= 0x80000000
    return torch.where(negative, bits ^ 0xFFFFFFFF, bits | 0x80000000)


def row_ranges_ref(
    num_rows: int,
    length: int,
    lengths: torch.Tensor | None,
    row_starts: torch.Tensor | None,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(start, n) int64 per row, clamped as in the module docstring."""
    if row_starts is None:
        start = torch.zeros(num_rows, dtype=torch.int64, device=device)
    else:
        start = row_starts.to(torch.int64).clamp(0, length)
    if lengths is None:
        n = length - start
    else:
        n = torch.minimum(lengths.to(torch.int64).clamp(min=0), length - start)
    return start, n


def _row_keys(scores, lengths, row_starts):
    """Keys of each row's window, left-aligned (R, L) int64, -1 past the row's length."""
    num_rows, length = scores.shape
    start, n = row_ranges_ref(num_rows, length, lengths, row_starts, scores.device)
    cols = torch.arange(length, device=scores.device)
    if length == 0:
        return torch.zeros(num_rows, 0, dtype=torch.int64, device=scores.device)
    gather_at = (start[:, None] + cols[None, :]).clamp(max=length - 1)
    keys = score_keys_ref(scores.gather(1, gather_at))
    return torch.where(cols[None, :] < n[:, None], keys, -1)


def select_ref(keys: torch.Tensor, k: int, sorted: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k columns of int64 keys (-1 = absent): (indices int64 (R, k), valid bool (R, k)).

    Ties go to the lower column; sorted=False returns the selected columns ascending."""
    num_rows, _width = keys.shape
    # A stable descending sort keeps equal keys in column order: lower index first.
    order = torch.sort(keys, dim=1, descending=True, stable=True).indices[:, :k]
    valid = keys.gather(1, order) >= 0
    if order.shape[1] < k:
        fill = k - order.shape[1]
        order = torch.cat([order, order.new_zeros(num_rows, fill)], 1)
        valid = torch.cat([valid, valid.new_zeros(num_rows, fill)], 1)
    if not sorted:
        big = torch.iinfo(torch.int64).max
        order = torch.sort(torch.where(valid, order, big), dim=1).values
        valid = order != big
        order = torch.where(valid, order, 0)
    return order, valid


def topk_indices_ref(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None = None,
    row_starts: torch.Tensor | None = None,
    sorted: bool = False,
    pad: int = -1,
) -> torch.Tensor:
    """Per-row top-k row-local indices, int32 (R, k), front-packed, `pad` elsewhere."""
    order, valid = select_ref(_row_keys(scores, lengths, row_starts), k, sorted)
    return torch.where(valid, order, pad).to(torch.int32)


def page_transform_ref(
    indices: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    row_to_batch: torch.Tensor | None = None,
    pad: int = -1,
) -> torch.Tensor:
    """out = pt[b, i >> log2(ps)] << log2(ps) | (i & (ps - 1)), b = row_to_batch[r] (else r).

    Negative indices (padding) become `pad`, and so does an index whose page lies past the
    table's last column (the kernels never read outside the table).
    """
    shift = page_size.bit_length() - 1
    idx = indices.to(torch.int64)
    num_rows = idx.shape[0]
    batch = (
        torch.arange(num_rows, device=idx.device)
        if row_to_batch is None
        else row_to_batch.to(torch.int64)
    )
    page = idx >> shift
    ok = (idx >= 0) & (page < page_table.shape[1])
    safe_page = torch.where(ok, page, 0)
    phys = page_table.to(torch.int64)[batch[:, None], safe_page] if idx.numel() else idx
    # int32 arithmetic, as the kernels do it (a physical page id << shift may wrap).
    phys = phys.to(torch.int32)
    out = (phys << shift) | (idx & (page_size - 1)).to(torch.int32)
    return torch.where(ok, out, pad).to(torch.int32)


def topk_page_transform_ref(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor,
    page_table: torch.Tensor | None,
    page_size: int,
    row_starts: torch.Tensor | None = None,
    row_to_batch: torch.Tensor | None = None,
    sorted: bool = False,
    pad: int = -1,
) -> torch.Tensor:
    """DeepSeek-V3.2 / GLM-5 DSA: top-k per row, then the page-table transform of the indices
    (padding and indices past the table: `pad`); no page table: the row-local indices."""
    if page_table is None:
        return topk_indices_ref(scores, k, lengths, row_starts, sorted, pad)
    idx = topk_indices_ref(scores, k, lengths, row_starts, sorted)
    return page_transform_ref(idx, page_table, page_size, row_to_batch, pad)


def topk_block_table_ref(
    block_scores: torch.Tensor,
    k: int,
    positions: torch.Tensor,
    block_size: int = 128,
    n_init: int = 1,
    n_local: int = 1,
    pages_per_block: int | None = None,
    num_kv_heads: int = 1,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """MiniMax-M3 style block table: (blocks (R, k), pages (R, k·ppb) or None, ctx_lens (R,)).

    block_scores (R, NB): one row per (query q, kv head h), r = q·Hkv + h (a (Q, Hkv, NB) tensor is
    flattened so); positions (Q,) the query's absolute position p; blocks of `block_size` keys.
    - eligible blocks: 0 <= blk <= last = p // block_size (floor; blk < NB too). n = #eligible.
    - forced in: the init blocks blk < n_init and the local blocks last - n_local < blk <= last
      (n_init + n_local <= k, so they always fit).
    - the remaining slots take the top-scoring other eligible blocks (NaN as -inf, ties to the
      lower block), min(k, n) blocks in all.
    - blocks: the selected block ids ascending, -1 padded.
    - pages: block b of head h expands to page ids b·ppb·Hkv + j·Hkv + h, j < ppb, at slots
      s·ppb + j of the block's slot s; -1 for padding slots.
    - ctx_lens: tokens covered, 128·n_full + (p % 128 + 1) when the tail block `last` is kept,
      else 128·n_sel, with n_full = the other kept blocks and block_size in place of 128.
    """
    scores = block_scores.reshape(-1, block_scores.shape[-1])
    num_rows, num_blocks = scores.shape
    shift = block_size.bit_length() - 1
    pos = positions.to(torch.int64).repeat_interleave(num_kv_heads)
    last = pos >> shift  # floor division, also for negative positions
    n = (last + 1).clamp(0, num_blocks)
    cols = torch.arange(num_blocks, device=scores.device)
    keys = score_keys_ref(scores)
    forced = (cols[None, :] < n_init) | (cols[None, :] > (last - n_local)[:, None])
    keys = torch.where(forced, FORCED_KEY, keys)
    keys = torch.where(cols[None, :] < n[:, None], keys, -1)
    order, valid = select_ref(keys, k, sorted=False)
    blocks = torch.where(valid, order, -1)
    n_sel = valid.sum(1)
    tail = (valid & (order == last[:, None])).any(1).to(torch.int64)
    ctx = block_size * (n_sel - tail) + tail * ((pos & (block_size - 1)) + 1)
    pages = None
    if pages_per_block is not None:
        heads = torch.arange(num_rows, device=scores.device) % num_kv_heads
        j = torch.arange(pages_per_block, device=scores.device)
        page_ids = (
            blocks[:, :, None] * pages_per_block * num_kv_heads
            + j[None, None, :] * num_kv_heads
            + heads[:, None, None]
        )
        pages = torch.where(valid[:, :, None], page_ids, -1).reshape(num_rows, -1)
        pages = pages.to(torch.int32)
    return blocks.to(torch.int32), pages, ctx.to(torch.int32)


MASK_KINDS = ("bool", "keep", "additive")


def mask_values(
    kind: str,
    scores_dtype: torch.dtype,
    dtype: torch.dtype | None = None,
    masked_value: bool | float | None = None,
    selected_value: bool | float | None = None,
) -> tuple[torch.dtype, bool | float, bool | float]:
    """(mask dtype, masked value, selected value) of a mask kind, checked: "bool" (True, False),
    "keep" (False, True), "additive" (-inf, 0.0) in `dtype` (default scores_dtype)."""
    if kind not in MASK_KINDS:
        raise ValueError(f"kind: expected one of {MASK_KINDS}, got {kind!r}")
    if kind == "additive":
        dtype = dtype or scores_dtype
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"dtype: expected one of {FLOAT_DTYPES}, got {dtype}")
        defaults, value_type = (float("-inf"), 0.0), (int, float)
    else:
        if dtype not in (None, torch.bool):
            raise ValueError(f"dtype: a {kind} mask is torch.bool, got {dtype}")
        dtype = torch.bool
        defaults, value_type = ((True, False) if kind == "bool" else (False, True)), bool
    values = []
    for name, value, default in (
        ("masked_value", masked_value, defaults[0]),
        ("selected_value", selected_value, defaults[1]),
    ):
        if value is None:
            value = default
        elif not isinstance(value, value_type) or (
            value_type is not bool and isinstance(value, bool)
        ):
            raise ValueError(f"{name}: expected a {kind} mask value, got {value!r}")
        values.append(float(value) if kind == "additive" else value)
    return dtype, values[0], values[1]


def topk_mask_ref(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None = None,
    kind: str = "bool",
    block_size: int = 1,
    dtype: torch.dtype | None = None,
    masked_value: bool | float | None = None,
    selected_value: bool | float | None = None,
    masked_tail: bool = False,
    finite_only: bool = False,
) -> torch.Tensor:
    """The top-k indices scattered into a mask over the row's columns, (R, L·block_size).

    Every element is the masked value except the selected columns (`mask_values` has the kinds):
    kind "bool": True where masked out, `ones(bool).scatter(-1, idx, False)` (DeepSeek-V3.2, HF);
    kind "keep": True where selected, `zeros(bool).scatter_(-1, idx, True)`;
    kind "additive": 0 where selected, -inf elsewhere: `full(-inf).scatter_(-1, safe_idx, 0)` with
    padding sent to a throwaway column (MiniMax-M3, HF).
    Then `repeat_interleave(block_size, -1)` back to key level.
    masked_tail=True: the row is all L columns and columns from lengths[r] on rank as -inf,
    as after `scores.masked_fill(cols >= lengths[:, None], -inf)`: a short row still selects k.
    finite_only=True: a selected column whose score ranks as -inf (-inf or NaN) stays masked, as
    after `idx.masked_fill(values == -inf, -1)` sent to the throwaway column (MiniMax-M3, HF).
    """
    num_rows, length = scores.shape
    dtype, masked_value, selected_value = mask_values(
        kind, scores.dtype, dtype, masked_value, selected_value
    )
    if masked_tail:
        if lengths is None:
            raise ValueError("masked_tail: needs lengths")
        cols = torch.arange(length, device=scores.device)
        real = cols[None, :] < lengths.to(torch.int64)[:, None]
        scores, lengths = torch.where(real, scores.float(), float("-inf")), None
    idx = topk_indices_ref(scores, k, lengths).to(torch.int64)
    if finite_only:
        picked = scores.float().gather(1, idx.clamp(min=0))
        idx = torch.where((picked == float("-inf")) | picked.isnan(), -1, idx)
    safe_idx = torch.where(idx >= 0, idx, length)  # padding -> the throwaway column
    mask = torch.full((num_rows, length + 1), masked_value, dtype=dtype, device=scores.device)
    mask = mask.scatter_(-1, safe_idx, selected_value)[:, :length]
    return mask.repeat_interleave(block_size, dim=-1) if block_size > 1 else mask.contiguous()
