"""The top-k → sparse-block kernels against their torch references (SPEC §3, §5).

The selected set is deterministic (ties go to the lowest index), so every kernel output is
compared with the reference exactly: as a set for unsorted indices, slot for slot otherwise.
The references themselves are checked against torch.topk under the equal-score rule.
Small BLOCK configs push short rows through the buffer compaction and multi-pass select paths.
"""

from __future__ import annotations

import pytest
import torch

from fxfuse.kernels import topk, topk_ref
from fxfuse.runtime import launch_tables
from tests.helpers import narrow_dtype_rows

# BLOCK 128, k <= 64: CAP = 2·128 + k_pad, so rows of a few hundred compact at least once.
# Each test runs twice: rows streamed through the candidate buffer (TILE_MAX 1: no row fits a
# tile) and rows taken whole as one register tile (TILE_MAX 16384: every test row fits). `small`
# also runs the tile's select with the radix descent (TILE_SELECT 0; the default bisects).
SMALL = {"BLOCK": 128, "TILE_MAX": 1}
TINY = {"BLOCK": 16, "TILE_MAX": 1}
TILE = {"TILE_MAX": 16384}
TILE_RADIX = {"TILE_MAX": 16384, "TILE_SELECT": topk.SELECT_RADIX.value}


@pytest.fixture(params=["stream", "tile", "tile_radix"])
def small(request):
    return {"stream": SMALL, "tile": {**SMALL, **TILE}, "tile_radix": {**SMALL, **TILE_RADIX}}[
        request.param
    ]


@pytest.fixture(params=["stream", "tile"])
def tiny(request):
    return TINY if request.param == "stream" else {**TINY, **TILE}


def _set(t: torch.Tensor) -> torch.Tensor:
    return t.sort(dim=-1).values


def _rank_values(scores: torch.Tensor) -> torch.Tensor:
    x = scores.float()
    return torch.where(torch.isnan(x), float("-inf"), x)


def _check_indices(scores, k, out, lengths=None, row_starts=None, sorted=False, pad=-1):
    ref = topk_ref.topk_indices_ref(scores, k, lengths, row_starts, sorted, pad)
    assert out.dtype == torch.int32 and out.shape == ref.shape
    if sorted:
        assert torch.equal(out, ref)
    else:
        assert torch.equal(_set(out), _set(ref))
    return ref


# ---------------------------------------------------------------------------------------------
# the reference against torch.topk


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_agrees_with_torch_topk(dtype):
    # bf16 of a narrow range has many equal scores: sets may differ only among equal values.
    scores = (torch.randn(6, 300) * 4).to(dtype)
    scores[0, 5] = float("nan")
    k = 40
    idx = topk_ref.topk_indices_ref(scores, k, sorted=True).long()
    values = _rank_values(scores)
    ours = values.gather(1, idx)
    theirs = torch.topk(values, k, dim=1).values
    assert torch.equal(ours, theirs)  # same multiset of values, descending
    # within equal values the lower index comes first
    same = ours[:, 1:] == ours[:, :-1]
    assert (idx[:, 1:][same] > idx[:, :-1][same]).all()


def test_keys_order_preserving():
    values = torch.tensor([float("-inf"), -3e38, -1.0, -1e-40, -0.0, 0.0, 1e-40, 1.0, 3e38,
                           float("inf")])  # fmt: skip
    keys = topk_ref.score_keys_ref(values)
    assert (keys[1:] >= keys[:-1]).all() and keys[4] == keys[5]
    assert topk_ref.score_keys_ref(torch.tensor([float("nan")])) == keys[0]


# ---------------------------------------------------------------------------------------------
# topk_indices


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("sorted", [False, True])
def test_random_rows(dtype, sorted, small):
    scores = torch.randn(5, 777).to(dtype)
    out = topk.topk_indices(scores, 48, sorted=sorted, config=small)
    _check_indices(scores, 48, out, sorted=sorted)


def _adversarial(name: str, rows: int, length: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    if name == "constant":
        return torch.full((rows, length), 0.25)
    if name == "ascending":
        return torch.arange(length, dtype=torch.float32).repeat(rows, 1)
    if name == "descending":
        return -torch.arange(length, dtype=torch.float32).repeat(rows, 1)
    if name == "all_neg_inf":
        return torch.full((rows, length), float("-inf"))
    if name == "nan_mix":
        x = torch.randn(rows, length, generator=g)
        x[torch.rand(rows, length, generator=g) < 0.3] = float("nan")
        x[:, :5] = float("-inf")
        return x
    if name == "all_nan":
        return torch.full((rows, length), float("nan"))
    if name == "top22_equal":
        # Equal in their top 22 bits: only the last 10 mantissa bits (and the index) decide.
        base = torch.tensor(1.5).view(torch.int32)
        low = torch.randint(0, 1024, (rows, length), generator=g, dtype=torch.int32)
        return (base + low).view(torch.float32)
    if name == "few_values":
        return torch.randint(-2, 3, (rows, length), generator=g).float()
    if name == "signed_zeros":
        x = torch.zeros(rows, length)
        x[:, ::3] = -0.0
        x[:, 7::11] = -1.0
        return x
    raise AssertionError(name)


ADVERSARIAL = [
    "constant", "ascending", "descending", "all_neg_inf", "nan_mix", "all_nan", "top22_equal",
    "few_values", "signed_zeros",
]  # fmt: skip


@pytest.mark.parametrize("name", ADVERSARIAL)
def test_adversarial_rows(name, small):
    scores = _adversarial(name, 2, 500)
    for sorted in (False, True):
        out = topk.topk_indices(scores, 40, sorted=sorted, config=small)
        _check_indices(scores, 40, out, sorted=sorted)


def test_bf16_ties(small):
    scores = torch.randint(0, 4, (3, 400)).to(torch.bfloat16) * 0.125
    out = topk.topk_indices(scores, 64, sorted=True, config=small)
    _check_indices(scores, 64, out, sorted=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_narrow_dtype_ties(dtype, small):
    """The tile select's descent over bf16 / fp16 keys without the low bits the dtype leaves
    equal (`_take_top_of`): exact, sorted and not, at ranks among and across the tied values
    (`narrow_dtype_rows`: -inf, NaN, signed zeros, an all-negative row)."""
    scores = narrow_dtype_rows(dtype, 4, 500, steps=12, seed=11)
    for k in (40, 64, 200):
        for sorted in (False, True):
            out = topk.topk_indices(scores, k, sorted=sorted, config=small)
            _check_indices(scores, k, out, sorted=sorted)


def test_lengths_around_k_and_chunk_edges(tiny):
    k, block = 24, 16
    cap = 2 * block + 32  # the kernel's CAP for k_pad 32
    # k-1, k, k+1; the chunk size and its neighbours; the buffer capacity and its neighbours.
    lens = [0, 1, k - 1, k, k + 1, block - 1, block, block + 1, cap - 1, cap, cap + 1, 300]
    scores = torch.randn(len(lens), 300)
    scores[1::2, ::4] = 0.5  # ties across the threshold in every other row
    lengths = torch.tensor(lens, dtype=torch.int32)
    for sorted in (False, True):
        out = topk.topk_indices(scores, k, lengths, sorted=sorted, config=tiny)
        ref = _check_indices(scores, k, out, lengths, sorted=sorted)
        # short rows: the identity, then padding
        if not sorted:
            assert torch.equal(out[2], torch.tensor(list(range(k - 1)) + [-1], dtype=torch.int32))
        assert (ref[0] == -1).all()


def test_row_starts_and_pad(small):
    scores = torch.randn(4, 600)
    starts = torch.tensor([0, 100, 550, 700], dtype=torch.int64)  # the last is clamped to L
    lengths = torch.tensor([600, 300, 100, 10], dtype=torch.int64)
    out = topk.topk_indices(scores, 32, lengths, starts, pad=600, config=small)
    _check_indices(scores, 32, out, lengths, starts, pad=600)
    assert ((out[2] >= 0) & (out[2] < 50)).all()  # row 2 is clamped to the 50 scores left
    assert (out[3] == 600).all()


def test_odd_strides(small):
    base = torch.randn(6, 1001)
    scores = base[:, 3:503]  # row stride 1001 (not a multiple of 4), unaligned start
    out = topk.topk_indices(scores, 20, sorted=True, config=small)
    _check_indices(scores, 20, out, sorted=True)
    transposed = torch.randn(300, 3).t()  # column stride 3
    out = topk.topk_indices(transposed, 20, config=small)
    _check_indices(transposed, 20, out)


def test_default_config_k_2048():
    scores = torch.randn(1, 5000)
    scores[0, 1000:3000] = 0.0  # a big tie straddling the threshold
    out = topk.topk_indices(scores, 2048)
    _check_indices(scores, 2048, out)


@pytest.mark.parametrize("segments", [2, 3])
def test_split_rows(segments, small):
    scores = torch.randn(2, 700)
    scores[1, :] = 1.0  # ties across every segment: the lowest indices must win
    lengths = torch.tensor([700, 650], dtype=torch.int32)
    for sorted in (False, True):
        out = topk.topk_indices(
            scores, 50, lengths, sorted=sorted, config={**small, "SEGMENTS": segments}
        )
        _check_indices(scores, 50, out, lengths, sorted=sorted)


# ---------------------------------------------------------------------------------------------
# page transform


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_page_transform(page_size, small):
    rows, length, batches = 5, 512, 3
    scores = torch.randn(rows, length)
    lengths = torch.tensor([512, 300, 17, 5, 0], dtype=torch.int32)
    starts = torch.tensor([0, 200, 3, 0, 0], dtype=torch.int32)
    row_to_batch = torch.tensor([2, 0, 1, 2, 0], dtype=torch.int64)
    pages = length // page_size
    # A permuted table per batch, so the transform can be inverted.
    table = torch.stack([torch.randperm(pages * batches)[:pages] for _ in range(batches)])
    table = table.to(torch.int32)
    for sorted in (False, True):
        out = topk.topk_page_transform(
            scores, 32, lengths, table, page_size, starts, row_to_batch, sorted, config=small
        )
        ref = topk_ref.topk_page_transform_ref(
            scores, 32, lengths, table, page_size, starts, row_to_batch, sorted
        )
        assert torch.equal(out if sorted else _set(out), ref if sorted else _set(ref))
    # invert: physical page -> logical page of the row's batch gives back the indices
    idx = topk_ref.topk_indices_ref(scores, 32, lengths, starts, sorted=True)
    valid = out >= 0
    assert torch.equal(valid, idx >= 0)
    inverse = torch.full((batches, pages * batches), -1, dtype=torch.int64)
    for b in range(batches):
        inverse[b, table[b].long()] = torch.arange(pages)
    b = row_to_batch.long()[:, None].expand_as(out)
    logical = inverse[b[valid], (out[valid].long() >> (page_size.bit_length() - 1))]
    back = logical * page_size + (out[valid].long() & (page_size - 1))
    assert torch.equal(back, idx[valid].long())


def test_page_transform_without_row_to_batch_and_out_of_table(small):
    scores = torch.randn(2, 128)
    lengths = torch.tensor([128, 128])
    table = torch.arange(2 * 4, dtype=torch.int64).reshape(2, 4) * 10  # covers 64 of 128
    out = topk.topk_page_transform(scores, 100, lengths, table, 16, config=small)
    ref = topk_ref.topk_page_transform_ref(scores, 100, lengths, table, 16)
    assert torch.equal(_set(out), _set(ref))
    idx = topk_ref.topk_indices_ref(scores, 100, lengths, sorted=True)
    assert ((_set(out) == -1).sum(1) == (idx >= 64).sum(1)).all()  # pages past the table


def test_page_transform_without_table_is_the_row_local_indices(small):
    """No page table (vLLM's packed prefill rows): the indices within each row's window."""
    scores = torch.randn(4, 300)
    lengths = torch.tensor([300, 120, 7, 0], dtype=torch.int32)
    starts = torch.tensor([0, 150, 290, 5], dtype=torch.int32)
    for sorted in (False, True):
        out = topk.topk_page_transform(
            scores, 16, lengths, None, 1, starts, sorted=sorted, pad=-2, config=small
        )
        ref = topk_ref.topk_indices_ref(scores, 16, lengths, starts, sorted, pad=-2)
        assert torch.equal(out if sorted else _set(out), ref if sorted else _set(ref))
    assert (out[2] >= 0).sum() == 7 and (out[3] == -2).all()


# ---------------------------------------------------------------------------------------------
# block table


def _block_case(q=6, heads=2, blocks=40):
    scores = torch.randn(q * heads, blocks)
    scores[0, :] = 2.0  # all equal: ties go to low blocks
    positions = torch.tensor([-1, 0, 127, 128, 2000, 40 * 128 + 500], dtype=torch.int64)
    return scores, positions[:q], heads


@pytest.mark.parametrize(
    "n_init,n_local,ppb", [(1, 1, None), (0, 0, None), (2, 3, 2), (1, 2, 1), (4, 4, 8)]
)
def test_block_table(n_init, n_local, ppb, tiny):
    scores, positions, heads = _block_case()
    k = 8
    blocks, pages, ctx = topk.topk_block_table(
        scores, k, positions, 128, n_init, n_local, ppb, heads, config=tiny
    )
    rblocks, rpages, rctx = topk_ref.topk_block_table_ref(
        scores, k, positions, 128, n_init, n_local, ppb, heads
    )
    assert torch.equal(blocks, rblocks) and torch.equal(ctx, rctx)
    assert (pages is None) == (ppb is None)
    if ppb is not None:
        assert torch.equal(pages, rpages)
    last = (positions.repeat_interleave(heads) >> 7)[:, None]
    assert ((blocks <= last) | (blocks == -1)).all()  # causal limit
    for r in range(blocks.shape[0]):
        kept = set(blocks[r][blocks[r] >= 0].tolist())
        eligible = set(range(min(int(last[r]) + 1, scores.shape[1])))
        forced = {b for b in eligible if b < n_init or b > int(last[r]) - n_local}
        assert forced <= kept and len(kept) == min(k, len(eligible))


def test_block_table_3d_and_ctx():
    scores = torch.randn(3, 4, 10)
    positions = torch.tensor([130, 1279, 5], dtype=torch.int32)
    blocks, pages, ctx = topk.topk_block_table(scores, 4, positions, pages_per_block=2)
    assert blocks.shape == (3, 4, 4) and pages.shape == (3, 4, 8) and ctx.shape == (3, 4)
    # p=130: blocks 0 and 1 (tail, 3 keys): 128 + 3; p=1279: 4 blocks, tail full; p=5: 1 block
    assert ctx[:, 0].tolist() == [131, 512, 6]
    r = topk_ref.topk_block_table_ref(scores, 4, positions, pages_per_block=2, num_kv_heads=4)
    assert torch.equal(blocks.reshape(12, 4), r[0]) and torch.equal(pages.reshape(12, 8), r[1])


# ---------------------------------------------------------------------------------------------
# mask


@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("block_size", [1, 4])
def test_mask(kind, block_size, small):
    scores = torch.randn(3, 200).to(torch.bfloat16)
    lengths = torch.tensor([200, 10, 150])
    out = topk.topk_mask(scores, 24, lengths, kind, block_size, config=small)
    ref = topk_ref.topk_mask_ref(scores, 24, lengths, kind, block_size)
    assert out.dtype == ref.dtype and torch.equal(out, ref)


@pytest.mark.parametrize("segments", [1, 3])
def test_mask_finite_only(small, segments):
    """finite_only: a selected column whose score is -inf or NaN stays masked (HF MiniMax-M3
    pads such picks and sends them to a throwaway column). Rows with fewer finite scores than
    k, NaN among them, a row of -inf only, a full row; with lengths (absent columns) and the
    masked tail (columns past the length rank as -inf, so a pick there stays masked too)."""
    scores = torch.randn(5, 200)
    scores[0, 30:] = float("-inf")  # 30 finite of 200, k 40
    scores[1, ::3] = float("nan")
    scores[1, 100:] = float("-inf")
    scores[2] = float("-inf")
    scores[3, 150:] = float("-inf")
    lengths = torch.tensor([200, 120, 200, 35, 200])
    cfg = {**small, "SEGMENTS": segments}
    for kind, block in (("bool", 1), ("additive", 4)):
        plain = topk_ref.topk_mask_ref(scores, 40, None, kind, block)
        out = topk.topk_mask(scores, 40, None, kind, block, finite_only=True, config=cfg)
        ref = topk_ref.topk_mask_ref(scores, 40, None, kind, block, finite_only=True)
        assert torch.equal(out, ref)
        assert not torch.equal(ref, plain)  # the -inf / NaN picks of rows 0-2 differ
        if segments == 1:  # (lengths are one segment a row)
            for tail in (False, True):
                out = topk.topk_mask(scores, 40, lengths, kind, block, masked_tail=tail,
                                     finite_only=True, config=small)  # fmt: skip
                ref = topk_ref.topk_mask_ref(scores, 40, lengths, kind, block, masked_tail=tail,
                                             finite_only=True)  # fmt: skip
                assert torch.equal(out, ref)
    # The reference: a pick stays masked exactly where its score ranks as -inf.
    ref = topk_ref.topk_mask_ref(scores, 40, None, "keep", finite_only=True)
    plain = topk_ref.topk_mask_ref(scores, 40, None, "keep")
    ranked = torch.where(scores.isnan(), float("-inf"), scores)
    assert torch.equal(ref, plain & (ranked > float("-inf")))


def test_mask_additive_dtype(tiny):
    scores = torch.randn(2, 64)
    out = topk.topk_mask(scores, 8, kind="additive", dtype=torch.float16, config=tiny)
    assert out.dtype == torch.float16
    assert torch.equal(out, topk_ref.topk_mask_ref(scores, 8, kind="additive", dtype=torch.float16))


def test_mask_keep_and_custom_values(tiny):
    scores = torch.randn(3, 90)
    lengths = torch.tensor([90, 5, 40])
    keep = topk.topk_mask(scores, 12, lengths, "keep", 2, config=tiny)
    assert keep.dtype == torch.bool
    assert torch.equal(keep, topk_ref.topk_mask_ref(scores, 12, lengths, "keep", 2))
    assert torch.equal(keep, ~topk_ref.topk_mask_ref(scores, 12, lengths, "bool", 2))
    # HF's finfo.min bias, and a selection-weight mask
    low = torch.finfo(torch.bfloat16).min
    bias = topk.topk_mask(scores, 12, kind="additive", dtype=torch.bfloat16, masked_value=low,
                          config=tiny)  # fmt: skip
    ref = topk_ref.topk_mask_ref(scores, 12, None, "additive", 1, torch.bfloat16, low)
    assert torch.equal(bias, ref) and (bias == low).sum() == 3 * (90 - 12)
    weights = topk.topk_mask(scores, 12, kind="additive", masked_value=0.0, selected_value=1.0,
                             config=tiny)  # fmt: skip
    assert torch.equal(weights.sum(1), torch.full((3,), 12.0))


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_mask_masked_tail(kind, small):
    """masked_tail: the kernel does not read past lengths[r] but ranks those columns as -inf,
    exactly as top-k over scores.masked_fill(cols >= lengths, -inf) does."""
    scores = torch.randn(5, 300)
    scores[3, :7] = float("-inf")  # real -inf scores tie with the masked tail
    lengths = torch.tensor([300, 5, 0, 150, 11])
    for segments in (1, 3):
        out = topk.topk_mask(scores, 20, lengths, kind, masked_tail=True,
                             config={**small, "SEGMENTS": segments})  # fmt: skip
        ref = topk_ref.topk_mask_ref(scores, 20, lengths, kind, masked_tail=True)
        assert torch.equal(out, ref)
    selected = (out == 0) if kind == "additive" else ~out
    assert (selected.sum(1) == 20).all()  # short rows still select k columns
    cols = torch.arange(300)
    masked = scores.masked_fill(cols >= lengths[:, None], float("-inf"))
    values = masked.topk(20, dim=1).values
    ours = masked[selected].view(5, 20).sort(1, descending=True).values
    assert torch.equal(ours, values)  # the same multiset of scores as torch.topk


@pytest.mark.parametrize("select", [topk.SELECT_RADIX.value, topk.SELECT_BISECT.value])
def test_masked_tail_half_tile(select):
    """Masked rows in a 4096 tile (length 3000): n_load < k takes the first k columns with no
    select, k <= n_load <= 2048 a half tile (columns past it written masked), longer rows the
    whole tile; real -inf scores tie with the tail and win by index."""
    k = 64
    scores = torch.randn(8, 3000, generator=torch.Generator().manual_seed(11))
    scores[4, :2000] = float("-inf")  # more real -inf scores than k - (finite ones): ties
    scores[6] = 0.5  # constant: the select ends on index bits
    lengths = torch.tensor([0, 63, 64, 65, 2048, 2049, 2048, 3000])
    cfg = {"TILE_MAX": 4096, "TILE_SELECT": select}
    out = topk.topk_mask(scores, k, lengths, masked_tail=True, config=cfg)
    assert torch.equal(out, topk_ref.topk_mask_ref(scores, k, lengths, masked_tail=True))
    keep = topk.topk_mask(scores, k, lengths, "keep", 2, masked_tail=True, config=cfg)
    ref = topk_ref.topk_mask_ref(scores, k, lengths, "keep", 2, masked_tail=True)
    assert torch.equal(keep, ref)


@pytest.mark.parametrize("select", [topk.SELECT_RADIX.value, topk.SELECT_BISECT.value])
def test_causal_bias_rows(select):
    """Rows whose tail is -inf in the scores themselves (a causal bias added before the top-k,
    as the DSA indexer spells it; no lengths, so the whole 4096 tile): fewer than k finite
    scores take them and then the first -inf columns by index; NaN ranks as -inf."""
    rows, length = 12, 3000
    scores = torch.randn(rows, length, generator=torch.Generator().manual_seed(5))
    visible = torch.tensor([1, 63, 64, 65, 1000, 2047, 2048, 2049, 2500, 3000, 2048, 1500])
    scores[torch.arange(length)[None, :] >= visible[:, None]] = float("-inf")
    scores[10, 5:40] = float("nan")  # NaN before the tail: -inf, by index
    scores[11, :1500] = 0.25  # ties among the finite scores
    cfg = {"TILE_MAX": 4096, "TILE_SELECT": select}
    for k in (64, 1500):
        out = topk.topk_mask(scores, k, config=cfg)
        assert torch.equal(out, topk_ref.topk_mask_ref(scores, k))
        for sorted in (False, True) if k < 1024 else (False,):  # (the interpreter's sort of
            # 2048 slots takes ~30 s)
            idx = topk.topk_indices(scores, k, sorted=sorted, config=cfg, path="row")
            _check_indices(scores, k, idx, sorted=sorted)


def test_page_transform_pad(tiny):
    scores = torch.randn(3, 64)
    lengths = torch.tensor([64, 3, 0])
    table = torch.randperm(12).reshape(3, 4).to(torch.int32)
    out = topk.topk_page_transform(scores, 8, lengths, table, 16, pad=-7, config=tiny)
    ref = topk_ref.topk_page_transform_ref(scores, 8, lengths, table, 16, pad=-7)
    assert torch.equal(_set(out), _set(ref)) and (out[2] == -7).all() and (out[1] == -7).sum() == 5


# ---------------------------------------------------------------------------------------------
# input checks, reference path, launch table


@pytest.mark.parametrize(
    "call,name",
    [
        (lambda s: topk.topk_indices(s[0], 4), "scores"),
        (lambda s: topk.topk_indices(s.int(), 4), "scores"),
        (lambda s: topk.topk_indices(s, 0), "k"),
        (lambda s: topk.topk_indices(s, 4096), "k"),
        (lambda s: topk.topk_indices(s, 4, torch.ones(3)), "lengths"),
        (lambda s: topk.topk_indices(s, 4, torch.ones(5, dtype=torch.int32)), "lengths"),
        (lambda s: topk.topk_indices(s, 4, row_starts=torch.ones(2, 1).int()), "row_starts"),
        (lambda s: topk.topk_indices(s, 4, config={"BLOCKS": 64}), "config"),
        (lambda s: topk.topk_indices(s, 4, config={"BLOCK": 48}), "config"),
        (lambda s: topk.topk_indices(s, 4, config={"TILE_SELECT": 2}), "config"),
        (lambda s: topk.topk_indices(s, 4, target="sm80"), "target"),
        (lambda s: topk.topk_page_transform(s, 4, None, torch.zeros(3, 2).int(), 16), "lengths"),
        (lambda s: topk.topk_page_transform(s, 4, _len(), torch.zeros(3, 2).int(), 12), "page_size"),
        (lambda s: topk.topk_page_transform(s, 4, _len(), torch.zeros(3, 2), 16), "page_table"),
        (lambda s: topk.topk_page_transform(s, 4, _len(), torch.zeros(1, 2).int(), 16), "page_table"),
        (lambda s: topk.topk_page_transform(s, 4, _len(), torch.zeros(3, 2).int(), 16,
                                            row_to_batch=torch.zeros(3)), "row_to_batch"),
        (lambda s: topk.topk_page_transform(s, 4, _len(), None, 16), "page_table"),
        (lambda s: topk.topk_page_transform(s, 4, _len(), None, 1, row_to_batch=_len()),
         "page_table"),
        (lambda s: topk.topk_block_table(s, 4, torch.zeros(2).int()), "positions"),
        (lambda s: topk.topk_block_table(s, 4, _len(), block_size=100), "block_size"),
        (lambda s: topk.topk_block_table(s, 4, _len(), n_init=3, n_local=2), "n_init"),
        (lambda s: topk.topk_block_table(s, 4, _len(), n_local=-1), "n_local"),
        (lambda s: topk.topk_block_table(s, 4, _len(), pages_per_block=0), "pages_per_block"),
        (lambda s: topk.topk_block_table(s, 4, _len(), num_kv_heads=2), "num_kv_heads"),
        (lambda s: topk.topk_block_table(s[0], 4, _len()), "block_scores"),
        (lambda s: topk.topk_mask(s, 4, kind="float"), "kind"),
        (lambda s: topk.topk_mask(s, 4, block_size=0), "block_size"),
        (lambda s: topk.topk_mask(s, 4, kind="additive", dtype=torch.int8), "dtype"),
        (lambda s: topk.topk_mask(s, 4, kind="keep", dtype=torch.float32), "dtype"),
        (lambda s: topk.topk_mask(s, 4, masked_value=0.5), "masked_value"),
        (lambda s: topk.topk_mask(s, 4, kind="additive", selected_value=True), "selected_value"),
        (lambda s: topk.topk_mask(s, 4, masked_tail=True), "masked_tail"),
        (lambda s: topk.topk_mask(s, 4, finite_only=1), "finite_only"),
        (lambda s: topk.topk_page_transform(s, 4, _len(), torch.zeros(3, 2).int(), 16, pad=0.5),
         "pad"),
    ],
)  # fmt: skip
def test_bad_inputs(call, name):
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        call(torch.randn(3, 32))


def _len():
    return torch.full((3,), 32, dtype=torch.int32)


def test_reference_path_without_interpreter(reference_path):
    scores = torch.randn(3, 100)
    assert torch.equal(topk.topk_indices(scores, 10), topk_ref.topk_indices_ref(scores, 10))
    mask = topk.topk_mask(scores, 10, kind="additive", block_size=2)
    assert torch.equal(mask, topk_ref.topk_mask_ref(scores, 10, kind="additive", block_size=2))


def test_empty_shapes():
    assert topk.topk_indices(torch.randn(0, 10), 4).shape == (0, 4)
    out = topk.topk_indices(torch.randn(2, 0), 4)
    assert (out == -1).all()
    assert topk.topk_mask(torch.randn(2, 0), 4).shape == (2, 0)


def test_launch_table_loads():
    table = launch_tables.load_table("topk")
    for target in launch_tables.TABLE_TARGETS:
        cfg = launch_tables.lookup("topk", target, rows=256, length=131072, topk=2048)
        assert sorted(cfg) == sorted(table["fields"])


@pytest.mark.parametrize("rows, chunks", [(1, 4), (8, 4), (9, 8), (16, 8), (17, 16), (256, 16)])
def test_launch_table_segments_by_row_count(rows, chunks):
    """sm90: few rows longer than 32K split into shorter segments (more programs a row); rows of
    32K or less keep their length entry whatever the row count."""
    cfg = launch_tables.lookup("topk", "sm90", rows=rows, length=131072, topk=2048)
    assert (cfg["MULTI_CHUNKS"], cfg["MULTI_PREFETCH"]) == (chunks, 3)
    short = launch_tables.lookup("topk", "sm90", rows=rows, length=32768, topk=2048)
    assert short["MULTI_CHUNKS"] == 16
    # rows longer than 32K are finished by a second kernel, shorter ones by their last segment
    assert (cfg["MULTI_FINISH_WARPS"], short["MULTI_FINISH_WARPS"]) == (8, 0)


# ---------------------------------------------------------------------------------------------
# GPU: the register-tile rows compiled, both descents, adversarial rows, against the reference


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("select", [topk.SELECT_RADIX.value, topk.SELECT_BISECT.value])
@pytest.mark.parametrize("name", ADVERSARIAL + ["randn"])
def test_gpu_tile_rows_adversarial(name, select):
    """Rows of 4000 (one 4096 tile) at k 2048 and 64: the indices as a set and the bool mask, with
    per-row lengths around k and masked tails (the DSA indexer's causal rows)."""
    rows, length = 6, 4000
    if name == "randn":
        scores = torch.randn(rows, length, generator=torch.Generator().manual_seed(3))
    else:
        scores = _adversarial(name, rows, length)
    lengths = torch.tensor([length, 2047, 2048, 2049, 3000, 1], dtype=torch.int32)
    cfg = {"TILE_MAX": 4096, "TILE_SELECT": select}
    for k in (2048, 64):
        out = topk.topk_indices(scores.cuda(), k, lengths.cuda(), config=cfg, path="row")
        _check_indices(scores, k, out.cpu(), lengths=lengths)
        mask = topk.topk_mask(scores.cuda(), k, lengths.cuda(), masked_tail=True, config=cfg)
        want = topk_ref.topk_mask_ref(scores, k, lengths, masked_tail=True)
        assert torch.equal(mask.cpu(), want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize(
    "cfg", [{"TILE_MAX": 4096}, {"TILE_MAX": 1}, {"TILE_MAX": 1, "SEGMENTS": 3}]
)
def test_gpu_mask_finite_only(cfg):
    """finite_only compiled: tile rows, streamed rows (`_finish`) and split rows; rows of fewer
    finite scores than k, NaN, all -inf."""
    rows, length, k = 5, 3000, 256
    scores = torch.randn(rows, length, generator=torch.Generator().manual_seed(7))
    scores[0, 100:] = float("-inf")
    scores[1, ::5] = float("nan")
    scores[1, 700:] = float("-inf")
    scores[2] = float("-inf")
    for kind, block in (("bool", 1), ("additive", 4)):
        out = topk.topk_mask(scores.cuda(), k, None, kind, block, finite_only=True, config=cfg)
        want = topk_ref.topk_mask_ref(scores, k, None, kind, block, finite_only=True)
        assert torch.equal(out.cpu(), want)


def test_block_table_int64_positions_clamp_before_narrowing():
    """Positions past int32 (and far past the row) count as the row's whole length, as the int64
    reference has them, not as their low 32 bits; forced local blocks as the reference's too."""
    scores = torch.randn(3, 40)
    positions = torch.tensor([2**32 + 5, 40 * 128 + 500, -7], dtype=torch.int64)
    for n_init, n_local in ((1, 1), (0, 3)):
        got = topk.topk_block_table(scores, 8, positions, 128, n_init, n_local)
        want = topk_ref.topk_block_table_ref(scores, 8, positions, 128, n_init, n_local)
        assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
