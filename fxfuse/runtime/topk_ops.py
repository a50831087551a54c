"""torch.library custom ops for the top-k → sparse-block builds (`torch.ops.fxfuse.topk_*`).

Each replaces a top-k whose indices only feed a page-table transform, a block table or a mask
(SPEC §3 "Top-k families"; `kernels/topk_ref.py` has the exact contract). Outputs have static
shapes: int32 (R, k) indices / page ids, blocks (..., k), pages (..., k·ppb), ctx (...), masks
(..., L·block_size); no data-dependent size. Each op has an explicit fake; on CPU without
Triton's interpreter it runs the torch reference.
"""

from __future__ import annotations

import torch

from fxfuse.kernels import topk_ref as ref
from fxfuse.runtime.dispatch import use_triton
from fxfuse.runtime.registry import fused_op

INDEX_DTYPES = (torch.int32, torch.int64)


def _kernels():
    from fxfuse.kernels import topk as kernels  # imports triton: only when used

    return kernels


def _check_scores(name: str, scores: torch.Tensor, dims: tuple[int, ...]) -> None:
    if scores.dim() not in dims:
        raise ValueError(f"{name}: expected {dims[0]}-D scores, got shape {tuple(scores.shape)}")
    if scores.dtype not in ref.FLOAT_DTYPES:
        raise ValueError(f"{name}: dtype must be one of {ref.FLOAT_DTYPES}, got {scores.dtype}")


def _check_k(k: int) -> None:
    if not 1 <= k <= 2048:
        raise ValueError(f"k: expected an int in [1, 2048], got {k}")


def _check_index(name: str, t: torch.Tensor | None, shape: tuple) -> None:
    if t is None:
        return
    if tuple(t.shape) != tuple(shape) or t.dtype not in INDEX_DTYPES:
        raise ValueError(
            f"{name}: expected int32 / int64 of shape {tuple(shape)}, got {t.dtype} "
            f"{tuple(t.shape)}"
        )


def _check_power_of_two(name: str, value: int) -> None:
    if value < 1 or value & (value - 1):
        raise ValueError(f"{name}: expected a power of 2, got {value}")


# --- page transform (DeepSeek-V3.2 / GLM-5 DSA) ---------------------------------------------------


def _check_page_transform(scores, k, lengths, page_table, page_size, row_starts, row_to_batch):
    _check_scores("scores", scores, (2,))
    _check_k(k)
    rows = scores.shape[0]
    _check_index("lengths", lengths, (rows,))
    _check_index("row_starts", row_starts, (rows,))
    _check_index("row_to_batch", row_to_batch, (rows,))
    _check_power_of_two("page_size", page_size)
    if page_table is None:
        if page_size != 1 or row_to_batch is not None:
            raise ValueError(
                "page_table: None (the row-local indices themselves) takes page_size 1 and no "
                f"row_to_batch, got page_size {page_size}, row_to_batch "
                f"{'given' if row_to_batch is not None else 'None'}"
            )
        return
    if page_table.dim() != 2 or page_table.dtype not in INDEX_DTYPES:
        raise ValueError(
            f"page_table: expected a 2-D int32 / int64 table, got {page_table.dtype} "
            f"{tuple(page_table.shape)}"
        )


@fused_op("fxfuse::topk_page_transform", mutates_args=())
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
) -> torch.Tensor:
    """Top-k of each row's scores[r, start : start + lengths[r]] mapped through the page table:
    pt[b, i >> log2(ps)] << log2(ps) | (i & (ps - 1)), b = row_to_batch[r] (else r); int32
    (R, k), valid entries front-packed, `pad` elsewhere. No page table (page size 1, no
    row_to_batch): the row-local indices i themselves (vLLM's packed prefill rows)."""
    _check_page_transform(scores, k, lengths, page_table, page_size, row_starts, row_to_batch)
    args = (scores, k, lengths, page_table, page_size, row_starts, row_to_batch, sorted, pad)
    if use_triton(scores, lengths, page_table):
        return _kernels().topk_page_transform(*args)
    return ref.topk_page_transform_ref(*args)


@topk_page_transform.register_fake
def _(scores, k, lengths, page_table, page_size, row_starts=None, row_to_batch=None,
      sorted=False, pad=-1):  # fmt: skip
    _check_page_transform(scores, k, lengths, page_table, page_size, row_starts, row_to_batch)
    return scores.new_empty((scores.shape[0], k), dtype=torch.int32)


# --- block table (MiniMax-M3) ------------------------------------------------------------------


def _check_block_table(block_scores, k, positions, block_size, n_init, n_local, pages_per_block,
                       num_kv_heads):  # fmt: skip
    _check_scores("block_scores", block_scores, (2, 3))
    _check_k(k)
    heads = block_scores.shape[1] if block_scores.dim() == 3 else num_kv_heads
    if num_kv_heads < 1 or (block_scores.dim() == 3 and num_kv_heads not in (1, heads)):
        raise ValueError(f"num_kv_heads: {num_kv_heads} disagrees with block_scores' head dim")
    rows = block_scores.shape[:-1].numel()
    if rows % heads:
        raise ValueError(f"num_kv_heads: expected a divisor of {rows} rows, got {num_kv_heads}")
    _check_index("positions", positions, (rows // heads,))
    _check_power_of_two("block_size", block_size)
    if n_init < 0 or n_local < 0 or n_init + n_local > k:
        raise ValueError(f"n_init: n_init {n_init} + n_local {n_local} must lie in [0, k = {k}]")
    if not 0 <= pages_per_block <= block_size:
        raise ValueError(
            f"pages_per_block: expected an int in [0, {block_size}], got {pages_per_block}"
        )


@fused_op("fxfuse::topk_block_table", mutates_args=())
def topk_block_table(
    block_scores: torch.Tensor,
    k: int,
    positions: torch.Tensor,
    block_size: int = 128,
    n_init: int = 1,
    n_local: int = 1,
    pages_per_block: int = 0,
    num_kv_heads: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MiniMax-M3 block table over (R, NB) or (Q, Hkv, NB) block scores: (blocks (..., k) block
    ids ascending, -1 padded; pages (..., k·ppb) page ids, (..., 0) when pages_per_block is 0;
    ctx (...) tokens covered), all int32 (`topk_ref.topk_block_table_ref`)."""
    args = (block_scores, k, positions, block_size, n_init, n_local, pages_per_block, num_kv_heads)
    _check_block_table(*args)
    ppb = pages_per_block or None
    if use_triton(block_scores, positions):
        blocks, pages, ctx = _kernels().topk_block_table(*args[:6], ppb, num_kv_heads)
    else:
        flat = block_scores.reshape(-1, block_scores.shape[-1])
        heads = block_scores.shape[1] if block_scores.dim() == 3 else num_kv_heads
        blocks, pages, ctx = ref.topk_block_table_ref(flat, *args[1:6], ppb, heads)
        lead = block_scores.shape[:-1]
        blocks, ctx = blocks.reshape(*lead, k), ctx.reshape(lead)
        pages = None if pages is None else pages.reshape(*lead, -1)
    if pages is None:
        pages = blocks.new_empty((*blocks.shape[:-1], 0))
    return blocks, pages, ctx


@topk_block_table.register_fake
def _(block_scores, k, positions, block_size=128, n_init=1, n_local=1, pages_per_block=0,
      num_kv_heads=1):  # fmt: skip
    _check_block_table(block_scores, k, positions, block_size, n_init, n_local, pages_per_block,
                       num_kv_heads)  # fmt: skip
    lead = block_scores.shape[:-1]
    return (
        block_scores.new_empty((*lead, k), dtype=torch.int32),
        block_scores.new_empty((*lead, k * pages_per_block), dtype=torch.int32),
        block_scores.new_empty(lead, dtype=torch.int32),
    )


# --- mask (DeepSeek-V3.2 / MiniMax-M3 in HF) ------------------------------------------------------


def _mask_kind(dtype: torch.dtype, masked_value: float, selected_value: float):
    """(kernel kind, masked, selected) for a mask of `dtype`; bool values come as 0.0 / 1.0."""
    if dtype == torch.bool:
        if {masked_value, selected_value} - {0.0, 1.0}:
            raise ValueError(
                f"masked_value: a bool mask takes 0 / 1, got {masked_value}, {selected_value}"
            )
        return "bool", bool(masked_value), bool(selected_value)
    if dtype not in ref.FLOAT_DTYPES:
        raise ValueError(f"dtype: expected torch.bool or one of {ref.FLOAT_DTYPES}, got {dtype}")
    return "additive", masked_value, selected_value


def _check_mask(scores, k, lengths, block_size, dtype, masked_value, selected_value, masked_tail,
                finite_only):  # fmt: skip
    _check_scores("scores", scores, tuple(range(1, 9)))
    _check_k(k)
    if lengths is not None and lengths.dim() == 1:
        _check_index("lengths", lengths, (scores.shape[:-1].numel(),))
    else:
        _check_index("lengths", lengths, scores.shape[:-1])
    if block_size < 1:
        raise ValueError(f"block_size: expected a positive int, got {block_size}")
    if masked_tail and lengths is None:
        raise ValueError("masked_tail: needs lengths")
    if not isinstance(finite_only, bool):
        raise ValueError(f"finite_only: expected a bool, got {finite_only!r}")
    return _mask_kind(dtype, masked_value, selected_value)


@fused_op("fxfuse::topk_mask", mutates_args=())
def topk_mask(
    scores: torch.Tensor,
    k: int,
    lengths: torch.Tensor | None,
    block_size: int,
    dtype: torch.dtype,
    masked_value: float,
    selected_value: float,
    masked_tail: bool = False,
    finite_only: bool = False,
) -> torch.Tensor:
    """A mask (..., L·block_size) of `dtype` holding masked_value except at the top-k columns of
    each row of scores (..., L) (repeated block_size times along the last dim): selected_value.
    lengths (...,) or flat (rows,): each row's length; masked_tail: the columns past it rank as -inf instead
    of being absent (the graph masked the scores); finite_only: a selected column whose score is
    -inf (or NaN) stays masked (the graph padded such picks, MiniMax-M3 in HF)."""
    kind, masked, selected = _check_mask(
        scores, k, lengths, block_size, dtype, masked_value, selected_value, masked_tail,
        finite_only,
    )  # fmt: skip
    lead, length = scores.shape[:-1], scores.shape[-1]
    rows = scores.reshape(-1, length)
    row_lengths = None if lengths is None else lengths.reshape(-1)
    if use_triton(scores, lengths):
        mask = _kernels().topk_mask(
            rows, k, row_lengths, kind, block_size, dtype=dtype, masked_value=masked,
            selected_value=selected, masked_tail=masked_tail, finite_only=finite_only,
        )  # fmt: skip
    else:
        mask = ref.topk_mask_ref(
            rows, k, row_lengths, kind, block_size, dtype, masked, selected, masked_tail,
            finite_only,
        )  # fmt: skip
    return mask.reshape(*lead, length * block_size)


@topk_mask.register_fake
def _(scores, k, lengths, block_size, dtype, masked_value, selected_value, masked_tail=False,
      finite_only=False):  # fmt: skip
    _check_mask(scores, k, lengths, block_size, dtype, masked_value, selected_value, masked_tail,
                finite_only)  # fmt: skip
    return scores.new_empty((*scores.shape[:-1], scores.shape[-1] * block_size), dtype=dtype)
