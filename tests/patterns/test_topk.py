"""Patterns `topk_page_transform`, `topk_block_table`, `topk_mask` (SPEC §3 "Top-k families").

Each spelling is model code (SGLang's DSA torch fallback, MiniMax-M3 block tables, the HF
DeepSeek-V3.2 / MiniMax-M3 masks). A firing test asserts the rewrite (report count, the fused op
in the graph and the only top-k that runs) and the numbers: equal to the SPEC reference slot for
slot (its tie rule is deterministic), and to the unfused chain as sets up to equal scores (SPEC
§5). Near-misses leave the graph alone and say why. Fused ops run their torch reference here
(`reference_path`); one case per family runs the Triton kernel in the interpreter.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch import nn
from torch._inductor.utils import run_and_get_code
from torch.utils._python_dispatch import TorchDispatchMode

import fxfuse
from fxfuse.kernels import topk_ref

NEG_INF = float("-inf")
K = 8


class Model(nn.Module):
    def __init__(self, fn, **consts):
        super().__init__()
        self.fn, self.consts = fn, consts

    def forward(self, *args):
        return self.fn(*args, **self.consts)


class OpsRun(TorchDispatchMode):
    """Names of the ops a call runs."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def _run_ops(fn, args):
    with OpsRun() as seen:
        out = fn(*args)
    return out, seen.names


def _fuse(fn, args, ir, **consts):
    """(output, report, what ran) of the spelling fused through `ir`: "export" (apply_fusions;
    the ops run) or "compile" (torch.compile's post-grad graph; the generated code)."""
    model = Model(fn, **consts)
    with torch.no_grad():
        if ir == "export":
            fused = fxfuse.apply_fusions(model, args)
            out, ops = _run_ops(fused, args)
            return out, fused.fxfuse_report, " ".join(ops)
        torch._dynamo.reset()
        out, code = run_and_get_code(torch.compile(model, backend="fxfuse"), *args)
        return out, fxfuse.last_report(), " ".join(code)


def _assert_fired(report, ran, name, op):
    assert report.counts[name] == 1, str(report)
    assert any(r.pattern == name and op in r.replacement for r in report.rewrites), str(report)
    assert f"{op}.default" in ran, ran
    assert not any(f"aten.{op}" in ran for op in ("topk", "sort", "argsort")), ran


def _assert_not_fired(fn, args, name, reason, ir="export", **consts):
    out, report, ran = _fuse(fn, args, ir, **consts)
    assert report.counts[name] == 0, str(report)
    assert "fxfuse.topk" not in ran, ran
    reasons = " | ".join(why for pattern, _, why in report.rejected if pattern == name)
    assert reason in reasons, str(report)
    expected = Model(fn, **consts)(*args)
    for a, b in zip(_tuple(out), _tuple(expected)):
        assert torch.equal(a, b)


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _ranked(scores: torch.Tensor) -> torch.Tensor:
    """Scores as SPEC ranks them (NaN as -inf)."""
    x = scores.float()
    return torch.where(torch.isnan(x), NEG_INF, x)


def _same_up_to_ties(scores, idx_a, idx_b):
    """Two selections (R, k) of row-local indices, -1 = none, select the same multiset of scores:
    they differ only between equal scores (an empty slot counts as -inf)."""
    values = _ranked(scores)

    def chosen(idx):
        idx = idx.long()
        got = values.gather(1, idx.clamp(min=0))
        return torch.where(idx >= 0, got, NEG_INF).sort(1).values

    return torch.equal(chosen(idx_a), chosen(idx_b))


# --- topk_page_transform ------------------------------------------------------------------------


def sglang_decode(scores, lengths, page_table, k=K):
    """SGLang's torch fallback: mask past the length, topk, transform_index_page_table_decode_ref
    (gather with clamped indices, then `result[topk_indices < 0] = -1`)."""
    pos = torch.arange(scores.shape[1], device=scores.device)
    masked = scores.masked_fill(pos[None, :] >= lengths[:, None], NEG_INF)
    idx = torch.topk(masked, k, dim=-1, sorted=False).indices
    idx = idx.masked_fill(idx >= lengths[:, None], -1)
    out = torch.gather(page_table, 1, idx.clamp(min=0))
    out[idx < 0] = -1
    return out


def where_shift_or(scores, lengths, page_table, row_to_batch, k=K, page_size=16):
    """Packed rows mapped to their request's page table, paged with shift / or, sorted top-k."""
    bits = page_size.bit_length() - 1
    pos = torch.arange(scores.shape[1], device=scores.device)
    masked = torch.where(pos < lengths.unsqueeze(-1), scores, NEG_INF)
    idx = masked.topk(k, dim=-1).indices
    valid = idx < lengths[:, None]
    safe = torch.where(valid, idx, 0)
    phys = page_table[row_to_batch].gather(1, safe >> bits)
    out = (phys << bits) | (safe & (page_size - 1))
    return torch.where(valid, out, -1).to(torch.int32)


def floordiv_mul_add(scores, lengths, page_table, k=K, page_size=64):
    """`// ps`, `* ps + % ps`, the length test written `lengths <= pos`, an int32 output."""
    pos = torch.arange(scores.shape[1], device=scores.device)
    masked = scores.masked_fill(lengths[:, None] <= pos[None, :], float("-inf"))
    idx = masked.topk(k, dim=1, sorted=False)[1]
    idx = torch.where(idx >= lengths.unsqueeze(1), -1, idx)
    safe = idx.clamp(min=0)
    out = torch.gather(page_table, 1, safe // page_size) * page_size + safe % page_size
    return torch.where(idx < 0, -1, out).int()


def vectorized_inplace(scores, seq_lens, page_tables, row_to_batch, k=K, page_size=4):
    """SGLang's vectorized fallback style: clone + masked_fill_, index_select of the tables,
    page_indices.masked_fill_(~valid_topk, -1) in place."""
    bits, mask = page_size.bit_length() - 1, page_size - 1
    positions = torch.arange(scores.shape[1], device=scores.device).unsqueeze(0)
    valid_mask = positions < seq_lens.unsqueeze(1)
    masked_scores = scores.clone()
    masked_scores.masked_fill_(~valid_mask, float("-inf"))
    raw_indices = torch.topk(masked_scores, k=k, dim=1, largest=True, sorted=False)[1]
    valid_topk = raw_indices < seq_lens.unsqueeze(1)
    physical = torch.gather(page_tables.index_select(0, row_to_batch), 1, raw_indices >> bits)
    page_indices = ((physical << bits) | (raw_indices & mask)).to(torch.int32)
    page_indices.masked_fill_(~valid_topk, -1)
    return page_indices


def full_like_fills(scores, lengths, page_table, k=K):
    """Fills as tensors (`torch.where(keep, s, torch.full_like(s, -inf))`, the same for the
    indices), the top-k's named `.indices`, `clamp_min`, a gather along -1, `masked_fill` of
    `idx.eq(-1)`, an int32 output by `.to`."""
    keep = torch.arange(scores.shape[-1], device=scores.device).unsqueeze(0) < lengths.unsqueeze(-1)
    s = torch.where(keep, scores, torch.full_like(scores, float("-inf")))
    idx = torch.topk(s, k, dim=-1).indices
    idx = torch.where(idx < lengths.unsqueeze(-1), idx, torch.full_like(idx, -1))
    pages = page_table.gather(-1, idx.clamp_min(0))
    return pages.masked_fill(idx.eq(-1), -1).to(torch.int32)


def argsort_prefix(scores, lengths, page_table, k=K, page_size=8):
    """A sorted top-k spelled as the first k of a descending argsort, paged with `//` and `%`."""
    pos = torch.arange(scores.shape[1], device=scores.device)
    masked = scores.masked_fill(pos >= lengths[:, None], NEG_INF)
    idx = torch.argsort(masked, dim=-1, descending=True)[:, :k]
    valid = idx < lengths[:, None]
    phys = page_table.gather(1, idx // page_size) * page_size + idx % page_size
    return torch.where(valid, phys, -1)


def sort_indices_prefix(scores, lengths, page_table, k=K):
    """`sort(descending=True).indices[..., :k]`, stable, a plain gather (page size 1)."""
    pos = torch.arange(scores.shape[1], device=scores.device)
    masked = scores.masked_fill(pos[None, :] >= lengths[:, None], NEG_INF)
    idx = masked.sort(dim=-1, descending=True, stable=True).indices[..., :k]
    idx = idx.masked_fill(idx >= lengths[:, None], -1)
    out = torch.gather(page_table, 1, idx.clamp(min=0))
    return out.masked_fill(idx < 0, -1)


def _page_case(rows=4, length=64, page_size=1, batches=None, seed=0, lengths=None):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, length, generator=g)
    lengths = torch.tensor(lengths or [length, 3, K, K + 1][:rows], dtype=torch.int64)
    pages = length // page_size
    batches = batches or rows
    # Permuted tables (disjoint physical pages per batch), so the transform can be inverted.
    table = torch.randperm(pages * batches, generator=g).reshape(batches, pages).to(torch.int32)
    return scores, lengths, table


def _logical(out, table, page_size, row_to_batch=None):
    """The row-local indices a page-transform output came from (-1 stays -1)."""
    inverse = torch.full((table.numel(),), -1, dtype=torch.int64)
    inverse[table.reshape(-1).long()] = torch.arange(table.shape[1]).repeat(table.shape[0])
    out = out.long()
    page = inverse[(out.clamp(min=0) // page_size)]
    return torch.where(out >= 0, page * page_size + out.clamp(min=0) % page_size, -1)


PAGE_SPELLINGS = {
    "sglang_decode": (sglang_decode, 1, False, False),
    "where_shift_or": (where_shift_or, 16, True, True),
    "floordiv_mul_add": (floordiv_mul_add, 64, False, False),
    "vectorized_inplace": (vectorized_inplace, 4, True, False),
    "full_like_fills": (full_like_fills, 1, False, True),
    "argsort_prefix": (argsort_prefix, 8, False, True),
    "sort_indices_prefix": (sort_indices_prefix, 1, False, True),
}


def _page_args(name, scores, lengths, table):
    with_batch = PAGE_SPELLINGS[name][2]
    if with_batch:
        row_to_batch = torch.arange(scores.shape[0]).flip(0) % table.shape[0]
        return (scores, lengths, table, row_to_batch)
    return (scores, lengths, table)


def _check_page_numbers(name, args, out, expected):
    _, page_size, with_batch, sorted_ = PAGE_SPELLINGS[name]
    scores, lengths, table = args[:3]
    row_to_batch = args[3] if with_batch else None
    ref = topk_ref.topk_page_transform_ref(
        scores, K, lengths, table, page_size, None, row_to_batch, sorted_
    )
    assert out.dtype == expected.dtype and out.shape == expected.shape
    if sorted_:
        assert torch.equal(out.int(), ref)
    else:
        assert torch.equal(out.sort(-1).values.int(), ref.sort(-1).values)
    # against the unfused chain: the same scores selected (page ids mapped back to indices)
    tables = table if row_to_batch is None else table[row_to_batch]
    ours, theirs = (_logical(t, tables, page_size) for t in (out, expected))
    assert _same_up_to_ties(scores, ours, theirs)


@pytest.mark.parametrize("ir", ["export", "compile"])
@pytest.mark.parametrize("name", list(PAGE_SPELLINGS))
def test_page_transform_spelling_fires(name, ir, reference_path):
    fn, page_size, with_batch, _ = PAGE_SPELLINGS[name]
    scores, lengths, table = _page_case(page_size=page_size, batches=2 if with_batch else None)
    args = _page_args(name, scores, lengths, table)
    out, report, ops = _fuse(fn, args, ir)
    _assert_fired(report, ops, "topk_page_transform", "fxfuse.topk_page_transform")
    _check_page_numbers(name, args, out, fn(*args))


def _adversarial(kind: str, rows: int, length: int) -> torch.Tensor:
    if kind == "constant":
        return torch.full((rows, length), 0.5)
    if kind == "ties":
        return torch.randint(0, 3, (rows, length)).float()
    if kind == "neg_inf":
        x = torch.randn(rows, length)
        x[:, ::2] = NEG_INF
        x[0] = NEG_INF
        return x
    if kind == "bf16_ties":
        return (torch.randn(rows, length) * 0.01).to(torch.bfloat16)
    if kind == "top22_equal":  # equal in their top 22 bits: only the low mantissa bits decide
        low = torch.randint(0, 1024, (rows, length), dtype=torch.int32)
        return (torch.tensor(1.5).view(torch.int32) + low).view(torch.float32)
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["constant", "ties", "neg_inf", "bf16_ties", "top22_equal"])
def test_page_transform_adversarial_rows(kind, reference_path):
    """Lengths k-1, k, k+1, 0 and the full row; ties and -inf may only move between equals."""
    scores = _adversarial(kind, 5, 40)
    _, lengths, table = _page_case(rows=5, length=40, lengths=[K - 1, K, K + 1, 0, 40])
    args = (scores, lengths, table)
    out, report, ops = _fuse(sglang_decode, args, "export")
    _assert_fired(report, ops, "topk_page_transform", "fxfuse.topk_page_transform")
    _check_page_numbers("sglang_decode", args, out, sglang_decode(*args))
    assert (out[0] >= 0).sum() == K - 1 and (out[3] == -1).all()  # identity, then padding


def test_page_transform_nan_ranks_as_neg_inf(reference_path):
    """SPEC: NaN ranks as -inf (torch.topk ranks it highest): the fused op follows the SPEC."""
    scores, lengths, table = _page_case()
    scores[0, :20] = float("nan")
    args = (scores, lengths, table)
    out, report, _ = _fuse(sglang_decode, args, "export")
    assert report.counts["topk_page_transform"] == 1
    ref = topk_ref.topk_page_transform_ref(scores, K, lengths, table, 1)
    assert torch.equal(out.sort(-1).values.int(), ref.sort(-1).values)
    assert (_logical(out, table, 1)[0] >= 20).all()


def test_page_transform_kernel_in_interpreter():
    """The Triton kernel itself (TRITON_INTERPRET=1) behind the rewritten graph."""
    scores, lengths, table = _page_case(page_size=16, batches=2)
    args = _page_args("where_shift_or", scores, lengths, table)
    out, report, ops = _fuse(where_shift_or, args, "export")
    _assert_fired(report, ops, "topk_page_transform", "fxfuse.topk_page_transform")
    _check_page_numbers("where_shift_or", args, out, where_shift_or(*args))


# near-misses


def topk_over_rows(scores, lengths, page_table, k=K):
    pos = torch.arange(scores.shape[1])
    masked = scores.masked_fill(pos[None, :] >= lengths[:, None], NEG_INF)
    idx = torch.topk(masked, 2, dim=0).indices  # over the rows
    return torch.gather(page_table, 1, idx.clamp(min=0)).masked_fill(idx >= 4, -1)


def smallest(scores, lengths, page_table, k=K):
    pos = torch.arange(scores.shape[1])
    masked = scores.masked_fill(pos[None, :] >= lengths[:, None], NEG_INF)
    idx = torch.topk(masked, k, dim=-1, largest=False).indices
    idx = idx.masked_fill(idx >= lengths[:, None], -1)
    return torch.gather(page_table, 1, idx.clamp(min=0)).masked_fill(idx < 0, -1)


def reads_values(scores, lengths, page_table, k=K):
    pos = torch.arange(scores.shape[1])
    masked = scores.masked_fill(pos[None, :] >= lengths[:, None], NEG_INF)
    values, idx = torch.topk(masked, k, dim=-1)
    idx = idx.masked_fill(idx >= lengths[:, None], -1)
    return torch.gather(page_table, 1, idx.clamp(min=0)).masked_fill(idx < 0, -1), values


def indices_escape(scores, lengths, page_table, k=K):
    pos = torch.arange(scores.shape[1])
    idx = scores.masked_fill(pos[None, :] >= lengths[:, None], NEG_INF).topk(k).indices
    idx = idx.masked_fill(idx >= lengths[:, None], -1)
    out = torch.gather(page_table, 1, idx.clamp(min=0)).masked_fill(idx < 0, -1)
    return out, idx + 1


def page_size_48(scores, lengths, page_table, k=K):
    return floordiv_mul_add(scores, lengths, page_table, k, page_size=48)


def finite_mask(scores, lengths, page_table, k=K):
    pos = torch.arange(scores.shape[1])
    masked = scores.masked_fill(pos[None, :] >= lengths[:, None], -1e9)
    idx = masked.topk(k).indices
    idx = idx.masked_fill(idx >= lengths[:, None], -1)
    return torch.gather(page_table, 1, idx.clamp(min=0)).masked_fill(idx < 0, -1)


def other_length(scores, lengths, page_table, k=K):
    pos = torch.arange(scores.shape[1])
    masked = scores.masked_fill(pos[None, :] >= lengths[:, None], NEG_INF)
    idx = masked.topk(k).indices
    idx = idx.masked_fill(idx >= lengths[:, None] - 1, -1)
    return torch.gather(page_table, 1, idx.clamp(min=0)).masked_fill(idx < 0, -1)


def fill_broadcasts_scores(scores, lengths, page_table, k=K):
    """One row's scores broadcast over every row by a tensor fill of the full shape: the top-k
    is not over `scores`' own rows, so the fill is no masking of them."""
    keep = torch.arange(scores.shape[1])[None, :] < lengths[:, None]
    masked = torch.where(keep, scores[:1], torch.full_like(scores, NEG_INF))
    idx = masked.topk(k).indices
    idx = idx.masked_fill(idx >= lengths[:, None], -1)
    return torch.gather(page_table, 1, idx.clamp(min=0)).masked_fill(idx < 0, -1)


def sorted_rows_prefix(scores, lengths, page_table, k=K):
    """The descending argsort's first rows, not its first k columns."""
    pos = torch.arange(scores.shape[1])
    masked = scores.masked_fill(pos[None, :] >= lengths[:, None], NEG_INF)
    idx = torch.argsort(masked, dim=-1, descending=True)[:2]
    idx = idx.masked_fill(idx >= lengths[:2, None], -1)
    return torch.gather(page_table, 1, idx.clamp(min=0)).masked_fill(idx < 0, -1)


@pytest.mark.parametrize(
    "fn,reason",
    [
        (fill_broadcasts_scores, "not masked past a row length"),
        (sorted_rows_prefix, "sliced along dim 0"),
        (topk_over_rows, "not the last dim"),
        (smallest, "largest=False"),
        (reads_values, "other users"),
        (indices_escape, "other users"),
        (finite_mask, "not -inf"),
        (other_length, "another length"),
    ],
)
def test_page_transform_near_misses(fn, reason, reference_path):
    scores, lengths, table = _page_case()
    _assert_not_fired(fn, (scores, lengths, table), "topk_page_transform", reason)


def page_add_alpha(scores, lengths, page_table, k=K, page_size=4):
    """The page's base and the offset in it added with alpha 2: not the page transform."""
    pos = torch.arange(scores.shape[1])
    idx = scores.masked_fill(lengths[:, None] <= pos[None, :], NEG_INF).topk(k).indices
    idx = torch.where(idx >= lengths[:, None], -1, idx)
    safe = idx.clamp(min=0)
    base = torch.gather(page_table, 1, safe // page_size) * page_size
    return torch.where(idx < 0, -1, torch.add(base, safe % page_size, alpha=2)).int()


@pytest.mark.parametrize("ir", ["export", "compile"])
def test_page_add_with_alpha_does_not_fire(ir, reference_path):
    """Patterns name add's two operands only; the alpha they do not name must be 1."""
    args = _page_case(page_size=4)
    out, report, ran = _fuse(page_add_alpha, args, ir)
    assert report.counts["topk_page_transform"] == 0, str(report)
    assert "fxfuse.topk" not in ran, ran
    assert torch.equal(out, Model(page_add_alpha)(*args))


@pytest.mark.parametrize("ir", ["export", "compile"])
def test_page_size_not_power_of_two_does_not_fire(ir, reference_path):
    scores, lengths, table = _page_case(length=96, page_size=48)
    _assert_not_fired(
        page_size_48, (scores, lengths, table), "topk_page_transform", "not a power of 2", ir
    )


# packed prefill rows: each row ranks its window [ks, ke) of the packed keys, indices row-local


def vllm_prefill(logits, ks, ke, k=K):
    """vLLM's DSA prefill torch path (DeepGEMM's reference logits masking, then the indexer's
    topk, `-=` and validity mask, as in vLLM / TensorRT-LLM), verbatim in structure."""
    seq_len_kv = logits.shape[-1]
    mask_lo = torch.arange(0, seq_len_kv)[None, :] >= ks[:, None]
    mask_hi = torch.arange(0, seq_len_kv)[None, :] < ke[:, None]
    mask = mask_lo & mask_hi
    logits = logits.masked_fill(~mask, NEG_INF)
    topk_indices = logits.topk(min(k, logits.shape[-1]), dim=-1)[1]
    topk_indices -= ks[:, None]
    mask_lo = topk_indices >= 0
    mask_hi = topk_indices - (ke - ks)[:, None] < 0
    mask = torch.full_like(topk_indices, False, dtype=torch.bool)  # dead, as in vLLM
    mask = mask_lo & mask_hi
    topk_indices = topk_indices.masked_fill(~mask, -1)
    return topk_indices.to(dtype=torch.int32)


def outside_where_prefill(logits, ks, ke, k=K):
    """The window as an or of outside tests, where-spelled fills, unsorted, int64 out."""
    cols = torch.arange(logits.shape[-1])
    outside = (cols[None, :] < ks[:, None]) | (cols[None, :] >= ke[:, None])
    masked = logits.masked_fill(outside, NEG_INF)
    local = torch.topk(masked, k, dim=-1, sorted=False).indices - ks[:, None]
    keep = (local >= 0) & (local < (ke - ks)[:, None])
    return torch.where(keep, local, -1)


PACKED_SPELLINGS = {
    "vllm_prefill": (vllm_prefill, True),
    "outside_where": (outside_where_prefill, False),
}


def _packed_case(length=48):
    """Windows of every kind: full, inside, lengths k - 1 / k / k + 1, empty (ke < ks), past the
    row (ke > L, ks > L) and starting before it (ks < 0: indices still count from ks)."""
    ks = torch.tensor([0, 5, 10, 20, 30, 12, 40, 60, -3, 0], dtype=torch.int32)
    ke = torch.tensor([48, 30, 10 + K - 1, 20 + K, 30 + K + 1, 4, 60, 70, 6, 0], dtype=torch.int32)
    return torch.randn(ks.shape[0], length), ks, ke


def _packed_expected(scores, ks, ke, k, sorted_):
    """Row by row from the contract: the window's columns in [0, L), ranked (NaN as -inf, ties
    to the lower column), made local to ks; -1 after."""
    values = _ranked(scores)
    out = torch.full((scores.shape[0], k), -1, dtype=torch.int64)
    for r in range(scores.shape[0]):
        lo, hi = max(int(ks[r]), 0), min(int(ke[r]), scores.shape[1])
        cols = torch.arange(lo, max(hi, lo))
        order = torch.sort(values[r, cols], descending=True, stable=True).indices[:k]
        picked = cols[order] if sorted_ else cols[order].sort().values
        out[r, : picked.numel()] = picked - int(ks[r])
    return out


def _check_packed(name, args, out, expected):
    fn, sorted_ = PACKED_SPELLINGS[name]
    scores, ks, ke = args
    assert out.dtype == expected.dtype and out.shape == expected.shape
    ref = _packed_expected(scores, ks, ke, K, sorted_)
    assert torch.equal(out.long() if sorted_ else out.long().sort(-1).values,
                       ref if sorted_ else ref.sort(-1).values)  # fmt: skip
    # against the unfused chain: the same scores (the columns local + ks) up to equal ones
    def cols(t):
        return torch.where(t >= 0, t.long() + ks[:, None].long(), -1)

    assert _same_up_to_ties(scores, cols(out), cols(expected))


@pytest.mark.parametrize("ir", ["export", "compile"])
@pytest.mark.parametrize("name", list(PACKED_SPELLINGS))
def test_packed_rows_spelling_fires(name, ir, reference_path):
    fn = PACKED_SPELLINGS[name][0]
    args = _packed_case()
    out, report, ops = _fuse(fn, args, ir)
    _assert_fired(report, ops, "topk_page_transform", "fxfuse.topk_page_transform")
    _check_packed(name, args, out, fn(*args))
    valid = out[8][out[8] >= 0]  # ks -3, ke 6: columns 0..5, as 3..8
    assert valid.numel() == 6 and set(valid.tolist()) == set(range(3, 9))


@pytest.mark.parametrize("kind", ["constant", "ties", "neg_inf", "top22_equal"])
def test_packed_rows_adversarial(kind, reference_path):
    _, ks, ke = _packed_case()
    args = (_adversarial(kind, ks.shape[0], 48), ks, ke)
    out, report, ops = _fuse(vllm_prefill, args, "export")
    _assert_fired(report, ops, "topk_page_transform", "fxfuse.topk_page_transform")
    _check_packed("vllm_prefill", args, out, vllm_prefill(*args))


def test_packed_rows_dynamic_row_count(reference_path):
    """One capture with a symbolic row count serves other counts and random windows (starts
    before 0, ends past L, empty ones included)."""
    rows = torch.export.Dim("rows", min=2, max=64)
    fused = fxfuse.apply_fusions(
        Model(vllm_prefill), _packed_case(), dynamic_shapes=(({0: rows}, {0: rows}, {0: rows}),)
    )
    assert fused.fxfuse_report.counts["topk_page_transform"] == 1, str(fused.fxfuse_report)
    for n in (3, 17, 40):
        ks = torch.randint(-5, 50, (n,), dtype=torch.int32)
        ke = ks + torch.randint(-3, 30, (n,), dtype=torch.int32)
        scores = torch.randn(n, 48)
        want = _packed_expected(scores, ks, ke, K, True)
        assert torch.equal(fused(scores, ks, ke).long(), want)


def test_packed_rows_kernel_in_interpreter():
    args = _packed_case()
    out, report, ops = _fuse(outside_where_prefill, args, "export")
    _assert_fired(report, ops, "topk_page_transform", "fxfuse.topk_page_transform")
    _check_packed("outside_where", args, out, outside_where_prefill(*args))


def opaque_logits(logits, ks, ke, k=K):
    """vLLM with DeepGEMM's fp8_mqa_logits: the window masking happens inside that kernel, so the
    graph's top-k ranks the whole row and may pick outside the window."""
    local = logits.topk(k, dim=-1)[1] - ks[:, None]
    return local.masked_fill(~((local >= 0) & (local - (ke - ks)[:, None] < 0)), -1)


def no_lower_bound(logits, ks, ke, k=K):
    cols = torch.arange(logits.shape[-1])
    local = logits.masked_fill(cols[None, :] >= ke[:, None], NEG_INF).topk(k)[1] - ks[:, None]
    return local.masked_fill(~((local >= 0) & (local - (ke - ks)[:, None] < 0)), -1)


def upper_not_width(logits, ks, ke, k=K):
    cols = torch.arange(logits.shape[-1])
    masked = logits.masked_fill(~((cols >= ks[:, None]) & (cols < ke[:, None])), NEG_INF)
    local = masked.topk(k)[1] - ks[:, None]
    return local.masked_fill(~((local >= 0) & (local < ke[:, None])), -1)


def only_upper_kept(logits, ks, ke, k=K):
    cols = torch.arange(logits.shape[-1])
    masked = logits.masked_fill(~((cols >= ks[:, None]) & (cols < ke[:, None])), NEG_INF)
    local = masked.topk(k)[1] - ks[:, None]
    return local.masked_fill(local - (ke - ks)[:, None] >= 0, -1)


def local_to_end(logits, ks, ke, k=K):
    cols = torch.arange(logits.shape[-1])
    masked = logits.masked_fill(~((cols >= ks[:, None]) & (cols < ke[:, None])), NEG_INF)
    local = masked.topk(k)[1] - ke[:, None]
    return local.masked_fill(~((local >= 0) & (local - (ke - ks)[:, None] < 0)), -1)


def zero_pad(logits, ks, ke, k=K):
    cols = torch.arange(logits.shape[-1])
    masked = logits.masked_fill(~((cols >= ks[:, None]) & (cols < ke[:, None])), NEG_INF)
    local = masked.topk(k)[1] - ks[:, None]
    return local.masked_fill(~((local >= 0) & (local - (ke - ks)[:, None] < 0)), 0)


@pytest.mark.parametrize(
    "fn,reason",
    [
        (opaque_logits, "not masked to the row's window"),
        (no_lower_bound, "not a window test"),
        (upper_not_width, "not the window's width"),
        (only_upper_kept, "does not keep exactly 0 <= local"),
        (local_to_end, "not made local by subtracting the window's start"),
        (zero_pad, "not a negative int32"),
    ],
)
def test_packed_rows_near_misses(fn, reason, reference_path):
    _assert_not_fired(fn, _packed_case(), "topk_page_transform", reason)


# --- topk_block_table ---------------------------------------------------------------------------


def minimax_block_table(block_scores, positions, k=K, n_init=1, n_local=1, block=128):
    """MiniMax-M3 block table: forced init / local blocks (+inf), causal limit (-inf), top-k,
    ineligible -> NB, sort, NB -> -1."""
    nb = block_scores.shape[-1]
    last = positions // block
    blk = torch.arange(nb, device=block_scores.device)
    forced = (blk[None, :] < n_init) | (blk[None, :] > last[:, None] - n_local)
    s = block_scores.masked_fill(forced, float("inf"))
    s = s.masked_fill(blk[None, :] > last[:, None], float("-inf"))
    idx = s.topk(k, dim=-1).indices
    idx = torch.where(idx <= last[:, None], idx, nb)
    idx = idx.sort(dim=-1).values
    return idx.masked_fill(idx == nb, -1).to(torch.int32)


def per_kv_head(block_scores, positions, k=K):
    """(Q, Hkv, NB) scores, `p >> 7`, two init and two local blocks, where-spelled masks."""
    nb = block_scores.shape[-1]
    last = (positions >> 7)[:, None, None]
    blk = torch.arange(nb)
    forced = torch.logical_or(blk < 2, blk >= last - 1)
    s = torch.where(forced, float("inf"), block_scores)
    s = torch.where(blk <= last, s, float("-inf"))
    idx = torch.topk(s, k, dim=-1, sorted=False).indices
    idx = idx.masked_fill(idx > last, 1 << 20)
    idx = torch.sort(idx, dim=-1, stable=True).values
    return torch.where(idx >= nb, -1, idx)


def no_forced_blocks(block_scores, positions, k=K):
    nb = block_scores.shape[-1]
    last = torch.div(positions, 128, rounding_mode="floor").unsqueeze(1)
    blk = torch.arange(nb).unsqueeze(0)
    s = block_scores.masked_fill(blk > last, float("-inf"))
    idx = s.topk(k).indices
    idx = torch.where(idx > last, nb, idx).sort(-1)[0]
    return torch.where(idx == nb, -1, idx).int()


BLOCK_SPELLINGS = {
    "minimax_block_table": (minimax_block_table, (1, 1), False),
    "per_kv_head": (per_kv_head, (2, 2), True),
    "no_forced_blocks": (no_forced_blocks, (0, 0), False),
}


def _block_case(heads: bool, nb=20, adversarial=None):
    # 1, 1, 2 eligible blocks; k-1, k, k+1; all 20 (the last past the block count)
    positions = torch.tensor([0, 127, 128, (K - 1) * 128 - 1, K * 128 - 1, K * 128, 2437, 5000])
    q = positions.numel()
    scores = torch.randn(q, 2, nb) if heads else torch.randn(q, nb)
    if adversarial is not None:
        scores = _adversarial(adversarial, q * (2 if heads else 1), nb).reshape(scores.shape)
    return scores, positions


def _check_blocks(name, args, out, expected):
    _, (n_init, n_local), heads = BLOCK_SPELLINGS[name]
    scores, positions = args
    nh = scores.shape[1] if heads else 1
    ref, _, _ = topk_ref.topk_block_table_ref(
        scores.reshape(-1, scores.shape[-1]), K, positions, 128, n_init, n_local, None, nh
    )
    assert out.dtype == expected.dtype and out.shape == expected.shape
    assert torch.equal(out.reshape(ref.shape).int(), ref)
    flat = scores.reshape(-1, scores.shape[-1])
    assert _same_up_to_ties(flat, out.reshape(ref.shape), expected.reshape(ref.shape))
    # front-packed: no block id after a -1
    valid = out >= 0
    assert (valid[..., :-1] | ~valid[..., 1:]).all()


@pytest.mark.parametrize("ir", ["export", "compile"])
@pytest.mark.parametrize("name", list(BLOCK_SPELLINGS))
def test_block_table_spelling_fires(name, ir, reference_path):
    fn, _, heads = BLOCK_SPELLINGS[name]
    args = _block_case(heads)
    out, report, ops = _fuse(fn, args, ir)
    _assert_fired(report, ops, "topk_block_table", "fxfuse.topk_block_table")
    _check_blocks(name, args, out, fn(*args))


@pytest.mark.parametrize("kind", ["constant", "ties", "neg_inf"])
def test_block_table_adversarial(kind, reference_path):
    args = _block_case(False, adversarial=kind)
    out, report, ops = _fuse(minimax_block_table, args, "export")
    _assert_fired(report, ops, "topk_block_table", "fxfuse.topk_block_table")
    _check_blocks("minimax_block_table", args, out, minimax_block_table(*args))


def test_block_table_kernel_in_interpreter():
    args = _block_case(True)
    out, report, ops = _fuse(per_kv_head, args, "export")
    _assert_fired(report, ops, "topk_block_table", "fxfuse.topk_block_table")
    _check_blocks("per_kv_head", args, out, per_kv_head(*args))


def minimax_pages_and_ctx(block_scores, positions, k=K, ppb=2, block=128):
    """The block table with its page expansion (repeat_interleave) and per-query ctx lengths."""
    blocks = minimax_block_table(block_scores, positions, k)
    rep = blocks.repeat_interleave(ppb, dim=-1)
    pages = (rep * ppb + torch.arange(ppb).repeat(k)).masked_fill(rep < 0, -1)
    n_sel = (blocks >= 0).sum(-1)
    tail = (blocks == (positions // block)[:, None]).any(-1)
    ctx_lens = torch.where(tail, (n_sel - 1) * block + positions % block + 1, n_sel * block)
    return blocks, pages, ctx_lens


def per_kv_head_pages(block_scores, positions, k=K, ppb=4):
    """Per-head page ids b·ppb·Hkv + j·Hkv + h of (Q, Hkv, k) blocks, flattened per slot."""
    heads = block_scores.shape[1]
    blocks = per_kv_head(block_scores, positions, k)
    offsets = torch.arange(ppb) * heads + torch.arange(heads).view(heads, 1, 1)
    pages = blocks[..., None] * (ppb * heads) + offsets
    pages = torch.where(blocks[..., None] >= 0, pages, -1).flatten(-2)
    return blocks, pages


@pytest.mark.parametrize("ir", ["export", "compile"])
@pytest.mark.parametrize("fn", [minimax_pages_and_ctx, per_kv_head_pages])
def test_block_table_pages_and_ctx_fuse_into_one_kernel(fn, ir, reference_path):
    heads = fn is per_kv_head_pages
    args = _block_case(heads)
    out, report, ran = _fuse(fn, args, ir)
    _assert_fired(report, ran, "topk_block_table", "fxfuse.topk_block_table")
    assert report.canonicalized.get("topk_block_table") == len(out) - 1, str(report)
    if ir == "export":
        assert ran.count("fxfuse.topk_block_table.default") == 1  # one kernel for all outputs
    expected = fn(*args)
    scores, positions = args
    nh = scores.shape[1] if heads else 1
    ppb = 4 if heads else 2
    _, pages, ctx_lens = topk_ref.topk_block_table_ref(
        scores.reshape(-1, scores.shape[-1]),
        K,
        positions,
        128,
        *((2, 2) if heads else (1, 1)),
        ppb,
        nh,
    )
    assert torch.equal(out[1].reshape(pages.shape).int(), pages)
    for a, b in zip(out, expected):  # random scores: exactly the unfused chain
        assert a.dtype == b.dtype and torch.equal(a, b)
    if not heads:
        assert torch.equal(out[2].int(), ctx_lens)


def sorted_descending(block_scores, positions, k=K):
    nb = block_scores.shape[-1]
    last = positions // 128
    blk = torch.arange(nb)
    s = block_scores.masked_fill(blk[None, :] > last[:, None], float("-inf"))
    idx = s.topk(k).indices
    idx = torch.where(idx <= last[:, None], idx, nb).sort(-1, descending=True).values
    return idx.masked_fill(idx == nb, -1)


def too_many_forced(block_scores, positions, k=K):
    return minimax_block_table(block_scores, positions, k, n_init=5, n_local=4)


def causal_off_by_one(block_scores, positions, k=K):
    nb = block_scores.shape[-1]
    last = positions // 128
    blk = torch.arange(nb)
    s = block_scores.masked_fill(blk[None, :] >= last[:, None], float("-inf"))
    idx = s.topk(k).indices
    idx = torch.where(idx < last[:, None], idx, nb).sort(-1).values
    return idx.masked_fill(idx == nb, -1)


@pytest.mark.parametrize(
    "fn,reason",
    [
        (sorted_descending, "not sorted ascending"),
        (too_many_forced, "exceeds k"),
        (causal_off_by_one, "causal limit"),
    ],
)
def test_block_table_near_misses(fn, reason, reference_path):
    _assert_not_fired(fn, _block_case(False), "topk_block_table", reason)


# --- topk_mask ----------------------------------------------------------------------------------


def deepseek_hf_bool(index_scores, k=K):
    """HF DeepSeek-V3.2: True where a key is outside the top-k (scores (B, S, T))."""
    topk_indices = index_scores.topk(k, dim=-1).indices
    return index_scores.new_ones(index_scores.shape, dtype=torch.bool).scatter(
        -1, topk_indices, False
    )


def deepseek_hf_v32_int32(index_scores, k=K):
    """HF DeepSeek-V3.2 as transformers 5 writes it: the indexer returns int32 indices, the
    attention makes the mask from them (`new_ones` of the int32 tensor) and scatters `.long()`."""
    topk_indices = index_scores.topk(k, dim=-1).indices.to(torch.int32)
    b, s, t = index_scores.shape
    return topk_indices.new_ones((b, s, t), dtype=torch.bool).scatter(-1, topk_indices.long(),
                                                                     False)  # fmt: skip


def deepseek_official_additive(index_score, k=K):
    """DeepSeek-V3.2's inference model.py: full(-inf).scatter_(-1, topk_indices, 0)."""
    bsz, seqlen, end = index_score.shape
    topk_indices = index_score.topk(min(k, end), dim=-1)[1]
    return torch.full((bsz, seqlen, end), float("-inf")).scatter_(-1, topk_indices, 0)


def keep_mask_expanded(block_scores, k=K, block=4):
    """A keep mask (True = attend) built per block, expanded to keys with expand + reshape."""
    rows, nb = block_scores.shape
    idx = torch.topk(block_scores, k, dim=-1, sorted=False).indices
    keep = torch.zeros((rows, nb), dtype=torch.bool).scatter_(-1, idx, True)
    return keep[..., None].expand(rows, nb, block).reshape(rows, nb * block)


def minimax_throwaway(block_scores, n_blocks, k=K, block=4):
    """MiniMax-M3 in HF: -1-padded indices sent to a throwaway column, sliced off, expanded."""
    rows, nb = block_scores.shape
    cols = torch.arange(nb)
    masked = block_scores.masked_fill(cols[None, :] >= n_blocks[:, None], float("-inf"))
    idx = masked.topk(k, dim=-1).indices
    idx = idx.masked_fill(idx >= n_blocks[:, None], -1)
    safe_idx = torch.where(idx < 0, nb, idx)
    bias = torch.full((rows, nb + 1), float("-inf"), dtype=torch.bfloat16)
    bias = bias.scatter_(-1, safe_idx, 0.0)[:, :nb]
    return bias.repeat_interleave(block, dim=-1)


def masked_tail_additive(block_scores, n_blocks, k=K, block=4):
    """Length-masked scores scattered without a throwaway column: a short row still selects k
    (masked) columns, as the graph wrote it."""
    cols = torch.arange(block_scores.shape[-1])
    masked = block_scores.masked_fill(cols >= n_blocks[:, None], float("-inf"))
    idx = masked.topk(k, dim=-1).indices
    bias = torch.full_like(block_scores, torch.finfo(torch.float32).min).scatter_(-1, idx, 0.0)
    return bias.repeat_interleave(block, -1)


def argsort_where_additive(block_scores, n_blocks, k=K, block=4):
    """Scores masked by `where` with a `full_like` fill, the top-k as a descending argsort's
    first k, an additive bias scattered into a `new_full` base."""
    keep = torch.arange(block_scores.shape[-1]) < n_blocks.unsqueeze(-1)
    masked = torch.where(keep, block_scores, torch.full_like(block_scores, float("-inf")))
    idx = masked.argsort(dim=-1, descending=True)[..., :k]
    bias = block_scores.new_full(block_scores.shape, float("-inf")).scatter(-1, idx, 0.0)
    return bias.repeat_interleave(block, -1)


MASK_SPELLINGS = {
    # name: (fn, needs lengths, scores shape, block, selected value, the SPEC reference)
    "deepseek_hf_bool": (deepseek_hf_bool, False, (2, 3, 40), 1, False,
                         lambda s, n: topk_ref.topk_mask_ref(s, K, None, "bool")),
    "deepseek_hf_v32_int32": (deepseek_hf_v32_int32, False, (2, 3, 40), 1, False,
                              lambda s, n: topk_ref.topk_mask_ref(s, K, None, "bool")),
    "deepseek_official_additive": (deepseek_official_additive, False, (2, 3, 40), 1, 0.0,
                                   lambda s, n: topk_ref.topk_mask_ref(s, K, None, "additive")),
    "keep_mask_expanded": (keep_mask_expanded, False, (5, 40), 4, True,
                           lambda s, n: topk_ref.topk_mask_ref(s, K, None, "keep", 4)),
    "minimax_throwaway": (minimax_throwaway, True, (5, 40), 4, 0.0,
                          lambda s, n: topk_ref.topk_mask_ref(s, K, n, "additive", 4,
                                                              torch.bfloat16)),
    "masked_tail_additive": (masked_tail_additive, True, (5, 40), 4, 0.0,
                             lambda s, n: topk_ref.topk_mask_ref(
                                 s, K, n, "additive", 4, masked_value=torch.finfo().min,
                                 masked_tail=True)),
    "argsort_where_additive": (argsort_where_additive, True, (5, 40), 4, 0.0,
                               lambda s, n: topk_ref.topk_mask_ref(
                                   s, K, n, "additive", 4, masked_tail=True)),
}  # fmt: skip
MASK_LENGTHS = [K - 1, K, K + 1, 0, 40]


def _mask_args(name, scores=None):
    _, needs_lengths, shape, _, _, _ = MASK_SPELLINGS[name]
    scores = torch.randn(shape) if scores is None else scores.reshape(shape)
    return (scores, torch.tensor(MASK_LENGTHS)) if needs_lengths else (scores,)


def _check_mask(name, args, out, expected):
    _, needs_lengths, _, block, selected_value, reference = MASK_SPELLINGS[name]
    assert out.dtype == expected.dtype and out.shape == expected.shape
    scores = args[0].reshape(-1, args[0].shape[-1])
    length = scores.shape[-1]
    ref = reference(scores, args[1] if needs_lengths else None)
    assert torch.equal(out.reshape(ref.shape), ref)

    def selection(mask):
        at_blocks = mask.reshape(-1, length, block)[..., 0]
        return at_blocks == selected_value

    ours, theirs = selection(out), selection(expected)
    # every key of a block carries its block's value, only the two values occur
    assert torch.equal(out, out.reshape(-1, length, block)[..., :1].expand(-1, -1, block)
                       .reshape(out.shape))  # fmt: skip
    assert torch.equal(out[~ours.repeat_interleave(block, -1).reshape(out.shape)].unique(),
                       expected[~theirs.repeat_interleave(block, -1).reshape(out.shape)].unique())  # fmt: skip
    # the same scores selected (a column left out counts as -inf); the masked tail ranks as -inf
    ranked = scores.clone()
    if needs_lengths:
        ranked[torch.arange(length)[None, :] >= args[1][:, None]] = NEG_INF
    idx = torch.arange(length).expand_as(ours)

    def pick(selected):
        return torch.where(selected, idx, -1).sort(1, descending=True).values[:, : K + 1]

    assert _same_up_to_ties(ranked, pick(ours), pick(theirs))


@pytest.mark.parametrize("ir", ["export", "compile"])
@pytest.mark.parametrize("name", list(MASK_SPELLINGS))
def test_mask_spelling_fires(name, ir, reference_path):
    fn = MASK_SPELLINGS[name][0]
    args = _mask_args(name)
    out, report, ops = _fuse(fn, args, ir)
    _assert_fired(report, ops, "topk_mask", "fxfuse.topk_mask")
    expected = fn(*args)
    _check_mask(name, args, out, expected)
    if name in ("deepseek_hf_bool", "deepseek_hf_v32_int32", "deepseek_official_additive",
                "keep_mask_expanded"):
        assert torch.equal(out, expected)  # random scores, no ties: exactly the unfused mask


@pytest.mark.parametrize("kind", ["constant", "ties", "neg_inf"])
@pytest.mark.parametrize("name", ["minimax_throwaway", "masked_tail_additive"])
def test_mask_adversarial(name, kind, reference_path):
    args = _mask_args(name, _adversarial(kind, 5, 40))
    out, report, ops = _fuse(MASK_SPELLINGS[name][0], args, "export")
    _assert_fired(report, ops, "topk_mask", "fxfuse.topk_mask")
    _check_mask(name, args, out, MASK_SPELLINGS[name][0](*args))


def test_mask_kernel_in_interpreter():
    args = _mask_args("minimax_throwaway")
    out, report, ops = _fuse(minimax_throwaway, args, "export")
    _assert_fired(report, ops, "topk_mask", "fxfuse.topk_mask")
    assert torch.equal(out, minimax_throwaway(*args))


def hf_minimax_m3_block_bias(idx_q, idx_k, q_positions, topk_blocks=3, block=4, init_blocks=1,
                             local_blocks=1):  # fmt: skip
    """MiniMaxM3VLIndexer._block_bias (HF transformers): only top-k -> scatter fuses; the init /
    local edits, the re-mask and the key expansion stay graph ops on the fused mask."""
    batch, heads, q_len, _ = idx_q.shape
    k_len = idx_k.shape[2]
    n_blocks = -(-k_len // block)
    scores = torch.matmul(idx_q.float(), idx_k.expand(-1, heads, -1, -1).float().transpose(-1, -2))
    scores = scores.view(batch, heads, q_len, n_blocks, block)
    block_scores = scores.amax(dim=-1).amax(dim=1)
    q_block = q_positions // block
    future = torch.arange(n_blocks).view(1, 1, -1) > q_block.view(1, -1, 1)
    block_scores = block_scores.masked_fill(future, float("-inf"))
    bias = block_scores.new_full((batch, q_len, n_blocks), float("-inf"))
    bias.scatter_(-1, block_scores.topk(min(topk_blocks, n_blocks), dim=-1).indices, 0.0)
    bias[..., :init_blocks] = 0.0
    local = torch.arange(local_blocks)
    local = (q_block.view(-1, 1) - local.view(1, -1)).clamp(min=0)
    bias.scatter_(-1, local.unsqueeze(0).expand(batch, -1, -1), 0.0)
    bias = bias.masked_fill(future, float("-inf"))
    token_bias = bias.repeat_interleave(block, dim=-1)[..., :k_len]
    return token_bias.to(idx_q.dtype).unsqueeze(1)


@pytest.mark.parametrize("ir", ["export", "compile"])
def test_hf_minimax_m3_indexer(ir, reference_path):
    q_len, k_len = 24, 24
    args = (torch.randn(2, 2, q_len, 8), torch.randn(2, 1, k_len, 8), torch.arange(q_len))
    out, report, ops = _fuse(hf_minimax_m3_block_bias, args, ir)
    assert report.counts["topk_mask"] == 1, str(report)
    assert "fxfuse.topk_mask.default" in ops and "aten.topk" not in ops
    assert torch.equal(out, hf_minimax_m3_block_bias(*args))


def hf_minimax_m3_keep(scores, positions, topk_blocks=3, block=4, local_blocks=1, pad=-1,
                       pad_score=NEG_INF, argsort_indices=False):  # fmt: skip
    """MiniMaxM3VLIndexer (HF transformers 5.25) forward + build_block_mask on token scores
    (B, H, S_q, S_k): future keys -inf, blocks max-pooled, the local blocks forced (+inf), top-k,
    the picks of -inf blocks padded -1 by their *values*, a throwaway column, then the keep mask
    `(bias == 0.0)` expanded to keys and cut to the key length."""
    batch, heads, q_len, k_len = scores.shape
    n_blocks = -(-k_len // block)
    future = torch.arange(k_len)[None, None, None, :] > positions[:, None, :, None]
    scores = scores.masked_fill(future, NEG_INF)
    scores = torch.nn.functional.pad(scores, (0, n_blocks * block - k_len), value=NEG_INF)
    block_scores = scores.view(batch, heads, q_len, n_blocks, block).amax(dim=-1)
    q_block = positions // block
    local = (q_block[..., None] - torch.arange(local_blocks).view(1, 1, -1)).clamp(min=0)
    block_scores.scatter_(-1, local.unsqueeze(1).expand(-1, heads, -1, -1), float("inf"))
    values, indices = block_scores.topk(min(topk_blocks, n_blocks), dim=-1)
    if argsort_indices:  # the same picks, but not this top-k's own indices
        indices = block_scores.argsort(dim=-1, descending=True)[..., :topk_blocks]
    idx = indices.masked_fill(values == pad_score, pad)
    safe = idx.masked_fill(idx < 0, n_blocks)
    bias = idx.new_full((batch, heads, q_len, n_blocks + 1), NEG_INF, dtype=torch.bfloat16)
    bias.scatter_(-1, safe, 0.0)
    keep = (bias[..., :n_blocks] == 0.0).repeat_interleave(block, dim=-1)[..., :k_len]
    return keep


def _m3_case(q_len=23, heads=2):
    scores = torch.randn(2, heads, q_len, q_len)
    positions = torch.arange(q_len).expand(2, q_len)
    return scores, positions


@pytest.mark.parametrize("ir", ["export", "compile"])
def test_hf_minimax_m3_value_padded_keep_mask(ir, reference_path):
    """The whole chain from the block scores on becomes one op with finite_only (the -inf picks
    of the early queries stay masked), and the output is the unfused chain's."""
    args = _m3_case()
    out, report, ops = _fuse(hf_minimax_m3_keep, args, ir)
    _assert_fired(report, ops, "topk_mask", "fxfuse.topk_mask")
    expected = hf_minimax_m3_keep(*args)
    assert out.dtype == torch.bool and torch.equal(out, expected)
    # The early queries see fewer than k blocks: their -inf picks were dropped, not kept.
    assert (expected[:, :, 0].sum(-1) == 4).all()


@pytest.mark.parametrize(
    "fn,reason",
    [
        (lambda s, p: hf_minimax_m3_keep(s, p, pad_score=0.0), "where the score is 0.0"),
        (lambda s, p: hf_minimax_m3_keep(s, p, argsort_indices=True), "another top-k"),
        (lambda s, p: hf_minimax_m3_keep(s, p, pad=0), "not a negative index"),
    ],
)
def test_hf_minimax_m3_value_padding_near_misses(fn, reason, reference_path):
    _assert_not_fired(fn, _m3_case(), "topk_mask", reason)


def hf_deepseek_v4_bias(index_scores, positions, compress_rate=4, k=3, heads=1):
    """DeepseekV4 CSA compressor + Lightning Indexer (HF transformers 5.25): each query sees the
    compressed entries below (p + 1) // m; the top-k past that limit become -1 (`where` with a
    `full_like`), are sent to a throwaway column, and the indices are unsqueezed into a
    (B, 1, S, T + 1) bias."""
    batch, seq, length = index_scores.shape
    threshold = (positions + 1) // compress_rate
    future = torch.arange(length).view(1, 1, -1) >= threshold.unsqueeze(-1)
    index_scores = index_scores.masked_fill(future, NEG_INF)
    idx = index_scores.topk(k, dim=-1).indices
    idx = torch.where(idx >= threshold.unsqueeze(-1), torch.full_like(idx, -1), idx)
    safe = torch.where(idx >= 0, idx, torch.full_like(idx, length))
    bias = index_scores.new_full((batch, heads, seq, length + 1), NEG_INF)
    bias.scatter_(-1, safe.unsqueeze(1), 0.0)
    return bias[..., :length]


@pytest.mark.parametrize("ir", ["export", "compile"])
def test_hf_deepseek_v4_unsqueezed_bias(ir, reference_path):
    """The indices unsqueezed into a mask of one more dim: fused, the op's mask unsqueezed."""
    scores, positions = torch.randn(2, 33, 8), torch.arange(33).expand(2, 33)
    out, report, ops = _fuse(hf_deepseek_v4_bias, (scores, positions), ir)
    _assert_fired(report, ops, "topk_mask", "fxfuse.topk_mask")
    expected = hf_deepseek_v4_bias(scores, positions)
    assert out.shape == expected.shape == (2, 1, 33, 8) and torch.equal(out, expected)


def test_hf_deepseek_v4_bias_of_two_heads_does_not_fire(reference_path):
    # (B, 1, S, k) indices into a (B, 2, S, T + 1) bias: only head 0 gets them.
    args = (torch.randn(2, 33, 8), torch.arange(33).expand(2, 33))
    _assert_not_fired(hf_deepseek_v4_bias, args, "topk_mask", "not shaped like the scores",
                      heads=2)  # fmt: skip


def shared_indices_two_masks(scores, k=K):
    """One top-k, its mask spelled twice (HF GLM-5: a "shared" layer rebuilds the mask from the
    previous layer's indices): the duplicate chain merges, one fused op feeds both."""
    idx = scores.topk(k, dim=-1).indices.to(torch.int32)
    one = idx.new_ones(scores.shape, dtype=torch.bool).scatter(-1, idx.long(), False)
    two = idx.new_ones(scores.shape, dtype=torch.bool).scatter(-1, idx.long(), False)
    return one.unsqueeze(1) & two.unsqueeze(1), two.sum()


def shared_indices_written_bases(scores, k=K):
    """The same, into bases written in place with different values: not duplicates."""
    idx = scores.topk(k, dim=-1).indices
    one = scores.new_full(scores.shape, NEG_INF).scatter_(-1, idx, 0.0)
    two = scores.new_full(scores.shape, NEG_INF).scatter_(-1, idx, 1.0)
    return one + two


@pytest.mark.parametrize("ir", ["export", "compile"])
def test_duplicate_mask_chains_of_one_topk_merge(ir, reference_path):
    """Post-grad, each `new_ones` is a `full` of its own, read by no top-k: equal constants are
    compared by value, so the two scatters are still duplicates."""
    scores = torch.randn(2, 5, 40)
    out, report, ops = _fuse(shared_indices_two_masks, (scores,), ir)
    _assert_fired(report, ops, "topk_mask", "fxfuse.topk_mask")
    assert report.counts["topk_mask"] == 1, str(report)
    if ir == "export":  # (compile: ops is Inductor's code, which names the op more than once)
        assert ops.count("fxfuse.topk_mask.default") == 1
    for a, b in zip(out, shared_indices_two_masks(scores)):
        assert torch.equal(a, b)
    _assert_not_fired(shared_indices_written_bases, (scores,), "topk_mask", "other users")


def hf_v32_sdpa_masked(index_scores, keep, k=K):
    """HF DeepSeek-V3.2 under SDPA: the scores masked by the boolean attention mask (any
    pattern, not a length test), then top-k → mask."""
    index_scores = index_scores.masked_fill(~keep, NEG_INF)
    idx = index_scores.topk(k, dim=-1).indices.to(torch.int32)
    return idx.new_ones(index_scores.shape, dtype=torch.bool).scatter(-1, idx.long(), False)


@pytest.mark.parametrize("ir", ["export", "compile"])
def test_mask_over_scores_masked_by_any_bool_mask(ir, reference_path):
    scores = torch.randn(2, 6, 40)
    keep = torch.rand(2, 6, 40) < 0.5  # rows with fewer than k kept keys pick masked ones
    keep[0, 0] = False
    out, report, ops = _fuse(hf_v32_sdpa_masked, (scores, keep), ir)
    _assert_fired(report, ops, "topk_mask", "fxfuse.topk_mask")
    masked = scores.masked_fill(~keep, NEG_INF).reshape(-1, 40)
    assert torch.equal(out.reshape(-1, 40), topk_ref.topk_mask_ref(masked, K, None, "bool"))
    # against the unfused mask: the same scores selected, up to equal (-inf) ones
    expected = hf_v32_sdpa_masked(scores, keep).reshape(-1, 40)
    idx = torch.arange(40).expand(12, 40)

    def pick(mask):
        return torch.where(~mask, idx, -1).sort(1, descending=True).values[:, :K]

    assert _same_up_to_ties(masked, pick(out.reshape(-1, 40)), pick(expected))


def scattered_along_rows(scores, k=K):
    idx = scores.topk(k, dim=-1).indices  # (40, k) column ids, scattered as row ids
    return torch.ones(scores.shape, dtype=torch.bool).scatter(0, idx, False)


def values_reused(scores, k=K):
    values, idx = scores.topk(k, dim=-1)
    return torch.full(scores.shape, NEG_INF).scatter_(-1, idx, 0.0), values.sum()


def repeated_along_rows(scores, k=K):
    idx = scores.topk(k, dim=-1).indices
    return torch.full(scores.shape, NEG_INF).scatter(-1, idx, 0.0).repeat_interleave(2, dim=0)


def rounded_indices(scores, k=K):
    """Indices through bf16 and back: past 256 odd columns round to even ones."""
    idx = scores.topk(k, dim=-1).indices.to(torch.bfloat16).long()
    return torch.ones(scores.shape, dtype=torch.bool).scatter(-1, idx, False)


def narrowed_no_wrap(scores, k=K):
    idx = scores.topk(k, dim=-1).indices.to(torch.int8).long()
    return torch.ones(scores.shape, dtype=torch.bool).scatter(-1, idx, False)


@pytest.mark.parametrize(
    "fn,reason",
    [
        (scattered_along_rows, "along dim 0"),
        (values_reused, "other users"),
        (repeated_along_rows, "repeat_interleave along dim 0"),
    ],
)
def test_mask_near_misses(fn, reason, reference_path):
    _assert_not_fired(fn, (torch.randn(40, 40),), "topk_mask", reason)


def test_lossy_index_cast_does_not_fire(reference_path):
    # Rows of 40: int8 holds every index, so the round trip fires.
    out, report, ops = _fuse(narrowed_no_wrap, (torch.randn(6, 40),), "export")
    _assert_fired(report, ops, "topk_mask", "fxfuse.topk_mask")
    # Rows of 300, the top-k at columns 290-297: bf16 rounds half of them to their neighbours.
    scores = torch.arange(300.0).repeat(6, 1) + torch.rand(6, 300)
    scores[:, 298:] = -1.0
    assert not torch.equal(rounded_indices(scores), deepseek_hf_bool(scores[:, None])[:, 0])
    _assert_not_fired(rounded_indices, (scores,), "topk_mask", "cast to torch.bfloat16")


class NoGradIndexer(nn.Module):
    """The top-k under `torch.no_grad()` in a method, as HF's DeepSeek-V3.2 indexer has it:
    torch.export wraps it in a `wrap_with_set_grad_enabled` call when grad is on."""

    @torch.no_grad()
    def select(self, scores):
        return scores.topk(K, dim=-1).indices.to(torch.int32)

    def forward(self, scores):
        idx = self.select(scores * 2)
        return idx.new_ones(scores.shape, dtype=torch.bool).scatter(-1, idx.long(), False)


def test_no_grad_region_is_inlined_and_fuses(reference_path):
    scores = torch.randn(3, 40)
    assert torch.is_grad_enabled()
    fused = fxfuse.apply_fusions(NoGradIndexer(), (scores,))
    assert not any("wrap_with_set_grad_enabled" in str(n.target) for n in fused.graph.nodes)
    out, ops = _run_ops(fused, (scores,))
    _assert_fired(fused.fxfuse_report, " ".join(ops), "topk_mask", "fxfuse.topk_mask")
    assert torch.equal(out, NoGradIndexer()(scores))


def causal_bias_mask(scores, k=K, diagonal=0, offset=0):
    """DeepSeek-V3.2's indexer in fxfuse's bundled model: a causal -inf bias added to the scores
    (query row q sees keys <= q + offset + diagonal), top-k, HF's scatter into a bool mask."""
    s_q, s_k = scores.shape[-2:]
    if offset:  # queries at the end of a longer key range (chunked prefill)
        visible = torch.arange(s_k)[None, :] <= torch.arange(s_q)[:, None] + offset + diagonal
    else:
        visible = torch.ones(s_q, s_k, dtype=torch.bool).tril(diagonal)
    bias = torch.zeros(s_q, s_k).masked_fill(~visible, float("-inf"))
    idx = (scores + bias).topk(k, dim=-1).indices
    return torch.ones(scores.shape, dtype=torch.bool).scatter(-1, idx, False)


def causal_bias_row_minus_col(scores, k=K, diagonal=1):
    """The causal bias spelled as a difference `row - col >= -d` (visible keys), added on the
    left of the scores."""
    s_q, s_k = scores.shape[-2:]
    visible = (torch.arange(s_q)[:, None] - torch.arange(s_k)[None, :]) >= -diagonal
    bias = torch.zeros(s_q, s_k).masked_fill(~visible, float("-inf"))
    idx = (bias + scores).topk(k, dim=-1).indices
    return torch.ones(scores.shape, dtype=torch.bool).scatter(-1, idx, False)


@pytest.mark.parametrize("ir", ["export", "compile"])
def test_causal_bias_as_row_minus_col(ir, reference_path):
    scores = torch.randn(2, 24, 24)
    out, report, ran = _fuse(causal_bias_row_minus_col, (scores,), ir)
    _assert_fired(report, ran, "topk_mask", "fxfuse.topk_mask")
    if ir == "export":
        assert "aten.masked_fill" not in ran, ran  # the bias is gone
    else:
        assert re.search(r"fxfuse\.topk_mask\.default\([^)]*, True\)", ran), ran
    lengths = (torch.arange(24) + 2).clamp(0, 24).repeat(2)
    ref = topk_ref.topk_mask_ref(scores.reshape(-1, 24), K, lengths, masked_tail=True)
    assert torch.equal(out.reshape(ref.shape), ref)


def noncausal_bias_mask(scores, blocked, k=K):
    """An -inf bias that is no per-row limit: fused as plain scores (no masked tail)."""
    bias = torch.zeros(scores.shape[-2:]).masked_fill(blocked, float("-inf"))
    idx = (scores + bias).topk(k, dim=-1).indices
    return torch.ones(scores.shape, dtype=torch.bool).scatter(-1, idx, False)


@pytest.mark.parametrize("ir", ["export", "compile"])
@pytest.mark.parametrize("diagonal, offset", [(0, 0), (-1, 0), (2, 0), (0, 17)])
def test_causal_bias_becomes_a_masked_tail(ir, diagonal, offset, reference_path):
    """scores + causal bias -> top-k -> mask: the bias add is absorbed, each row's limit becomes
    lengths with masked_tail (the kernel reads only the visible keys); the mask is the SPEC
    reference's, and the spelled chain's wherever a row sees >= k keys (ties in -inf apart)."""
    s_q = 24 if not offset else 7
    scores = torch.randn(2, s_q, 24)
    out, report, ran = _fuse(causal_bias_mask, (scores,), ir, diagonal=diagonal, offset=offset)
    _assert_fired(report, ran, "topk_mask", "fxfuse.topk_mask")
    if ir == "export":
        assert "aten.masked_fill" not in ran and "aten.where" not in ran, ran  # bias gone
    else:  # the generated code calls the op with lengths and masked_tail=True
        assert re.search(r"fxfuse\.topk_mask\.default\([^)]*, True\)", ran), ran
    lengths = (torch.arange(s_q) + 1 + diagonal + offset).clamp(0, 24).repeat(2)
    ref = topk_ref.topk_mask_ref(scores.reshape(-1, 24), K, lengths, masked_tail=True)
    assert torch.equal(out.reshape(ref.shape), ref)
    expected = causal_bias_mask(scores, diagonal=diagonal, offset=offset).reshape(ref.shape)
    full = lengths >= K
    assert torch.equal(out.reshape(ref.shape)[full], expected[full])


def test_noncausal_bias_fuses_without_a_tail(reference_path):
    scores, blocked = torch.randn(2, 24, 24), torch.rand(24, 24) < 0.3
    out, report, ran = _fuse(noncausal_bias_mask, (scores, blocked), "export")
    _assert_fired(report, ran, "topk_mask", "fxfuse.topk_mask")
    assert "aten.masked_fill" in ran  # the bias stays a graph op, the op sees biased scores
    biased = scores + torch.zeros(24, 24).masked_fill(blocked, NEG_INF)
    ref = topk_ref.topk_mask_ref(biased.reshape(-1, 24), K)
    assert torch.equal(out.reshape(ref.shape), ref)


def deepseek_mask_k512(scores):
    idx = scores.topk(512, dim=-1).indices
    return torch.ones(scores.shape, dtype=torch.bool).scatter(-1, idx, False)


@pytest.mark.parametrize("length", [600, 2047, 2048])
def test_dense_mask_fires(length, reference_path):
    """k = 512 over most of a row: fused too (rows up to the tile limit take the register-tile
    select, 3.2x torch's top-k + scatter at 4096 x 4096, k 2048, on the H200)."""
    args = (torch.randn(2, length),)
    out, report, ops = _fuse(deepseek_mask_k512, args, "export")
    _assert_fired(report, ops, "topk_mask", "fxfuse.topk_mask")
    assert torch.equal(out, deepseek_mask_k512(*args))


# --- dynamic rows -------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["page", "block", "mask"])
def test_symbolic_row_count(family, reference_path):
    """apply_fusions with a dynamic row / query count: one graph for every batch size."""
    rows = torch.export.Dim("rows", min=2, max=64)
    if family == "page":
        fn, name, args = sglang_decode, "topk_page_transform", _page_case()
    elif family == "block":
        fn, name, args = minimax_block_table, "topk_block_table", _block_case(False)
    else:
        fn, name, args = minimax_throwaway, "topk_mask", _mask_args("minimax_throwaway")
    dynamic = {"args": tuple({0: rows} for _ in args)}
    with torch.no_grad():
        fused = fxfuse.apply_fusions(Model(fn), args, dynamic_shapes=dynamic)
    assert fused.fxfuse_report.counts[name] == 1, str(fused.fxfuse_report)
    bigger = tuple(torch.cat([a, a]) for a in args)
    if family == "page":  # a page table row per score row, disjoint pages
        bigger = (*bigger[:2], torch.cat([args[2], args[2] + args[2].numel()]))
    out, expected = fused(*bigger), fn(*bigger)
    if family == "page":
        assert torch.equal(out.sort(-1).values, expected.sort(-1).values)
    else:
        assert torch.equal(out, expected)


# --- ops ----------------------------------------------------------------------------------------


def _op_args():
    scores, lengths, table = _page_case(page_size=16, batches=2)
    r2b = torch.tensor([1, 0, 1, 0])
    bs, pos = _block_case(True)
    return [
        ("topk_page_transform", (scores, K, lengths, table, 16, None, r2b, True, -1)),
        ("topk_page_transform", (scores, K, lengths.int(), table[r2b], 16, lengths // 8, None,
                                 False, 0)),
        ("topk_block_table", (bs, K, pos, 128, 1, 2, 2, 2)),
        ("topk_page_transform", (scores, K, lengths, None, 1, lengths // 8, None, True, -1)),
        ("topk_block_table", (bs.reshape(-1, 20), K, pos.repeat_interleave(2), 128, 0, 0, 0, 1)),
        ("topk_mask", (torch.randn(2, 3, 40), K, None, 4, torch.bool, 1.0, 0.0, False)),
        ("topk_mask", (torch.randn(5, 40), K, torch.tensor(MASK_LENGTHS), 1, torch.bfloat16,
                       NEG_INF, 0.0, True)),
        ("topk_mask", (torch.randn(5, 40).masked_fill(torch.rand(5, 40) < 0.9, NEG_INF), K, None,
                       4, torch.bool, 0.0, 1.0, False, True)),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(8))
def test_ops_pass_opcheck(case, reference_path):
    name, args = _op_args()[case]
    torch.library.opcheck(getattr(torch.ops.fxfuse, name).default, args)


def test_ops_kernel_path_matches_reference():
    """Each op through the Triton interpreter equals its reference path (kernel internals are
    tested in tests/kernels/test_topk_kernel.py)."""
    for name, args in _op_args()[::2]:
        got = getattr(torch.ops.fxfuse, name)(*args)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("TRITON_INTERPRET", "0")
            want = getattr(torch.ops.fxfuse, name)(*args)
        for a, b in zip(_tuple(got), _tuple(want)):
            sorted_ = name != "topk_page_transform" or args[7]
            assert torch.equal(a, b) if sorted_ else torch.equal(a.sort(-1)[0], b.sort(-1)[0])


@pytest.mark.parametrize(
    "name,args,arg",
    [
        ("topk_page_transform", lambda s, n, t: (s, 0, n, t, 16), "k"),
        ("topk_page_transform", lambda s, n, t: (s, K, n, t, 12), "page_size"),
        ("topk_page_transform", lambda s, n, t: (s, K, n[:2], t, 16), "lengths"),
        ("topk_page_transform", lambda s, n, t: (s, K, n, t.float(), 16), "page_table"),
        ("topk_mask", lambda s, n, t: (s, K, None, 1, torch.int32, 1.0, 0.0), "dtype"),
        ("topk_mask", lambda s, n, t: (s, K, None, 1, torch.bool, 2.0, 0.0), "masked_value"),
        ("topk_mask", lambda s, n, t: (s, K, None, 1, torch.bool, 1.0, 0.0, True), "masked_tail"),
        ("topk_block_table", lambda s, n, t: (s, K, n, 128, 5, 4), "n_init"),
        ("topk_block_table", lambda s, n, t: (s, K, n[:2], 128), "positions"),
    ],
)
def test_ops_bad_inputs(name, args, arg, reference_path):
    scores, lengths, table = _page_case(page_size=16)
    with pytest.raises(ValueError, match=rf"^{arg}\b"):
        getattr(torch.ops.fxfuse, name)(*args(scores, lengths, table))


def test_disable_turns_the_patterns_off(reference_path):
    scores, lengths, table = _page_case()
    config = fxfuse.FusionConfig(disable=("topk_page_transform",))
    fused = fxfuse.apply_fusions(Model(sglang_decode), (scores, lengths, table), config=config)
    assert "topk_page_transform" not in fused.fxfuse_report.counts
    assert not any("topk" in str(n.target) and "fxfuse" in str(n.target) for n in fused.graph.nodes)
    assert math.isfinite(fused(scores, lengths, table).float().sum())


# --- found by probing (eighteenth session): forms that fired with other meanings ----------------


def safe_fill(scores, lengths, page_table, k=K, below=0):
    """The safe gather index: `where(idx < below, 0, idx)`. below 0 moves exactly the padded
    (negative) indices; below 4 also moves VALID ones (idx 1..3 → 0): not the page transform."""
    pos = torch.arange(scores.shape[1])
    masked = scores.masked_fill(pos[None, :] >= lengths[:, None], NEG_INF)
    idx = torch.topk(masked, k, dim=-1).indices
    idx = idx.masked_fill(idx >= lengths[:, None], -1)
    safe = torch.where(idx < below, 0, idx)
    return torch.gather(page_table, 1, safe).masked_fill(idx < 0, -1)


def narrowed_length_check(scores, lengths, page_table, k=K):
    """The index check reads lengths.to(int8) (200 → -56), the score masking lengths."""
    pos = torch.arange(scores.shape[1])
    masked = scores.masked_fill(pos[None, :] >= lengths[:, None], NEG_INF)
    idx = torch.topk(masked, k, dim=-1).indices
    idx = idx.masked_fill(idx >= lengths.to(torch.int8)[:, None], -1)
    return torch.gather(page_table, 1, idx.clamp(min=0)).masked_fill(idx < 0, -1)


def test_safe_gather_index_must_move_only_invalid_indices(reference_path):
    scores, lengths, table = _page_case()
    scores[:, :4] += 10  # the first four columns are always picked
    args = (scores, lengths, table)
    _assert_not_fired(safe_fill, args, "topk_page_transform", "safe gather", below=4)
    out, report, ops = _fuse(safe_fill, args, "export")
    _assert_fired(report, ops, "topk_page_transform", "fxfuse.topk_page_transform")
    want = safe_fill(scores, lengths, table)
    assert torch.equal(out.sort(-1).values, want.sort(-1).values)


def test_a_narrowing_cast_is_another_length(reference_path):
    scores, _, table = _page_case(length=256)
    lengths = torch.tensor([200, 5, 130, 256])
    _assert_not_fired(
        narrowed_length_check, (scores, lengths, table), "topk_page_transform", "another length"
    )


def test_int64_page_ids_kept_int64_do_not_fire(reference_path):
    """The fused op computes int32 token ids: an int64 table whose ids the graph keeps in int64
    (≥ 2**31 here) is left alone; the same table with an int32 output fuses (it wraps alike)."""
    scores, lengths, _ = _page_case()
    table = torch.arange(4 * 64, dtype=torch.int64).reshape(4, 64) + 2**31 + 7

    def wide(scores, lengths, page_table, k=K):
        return safe_fill(scores, lengths, page_table, k)

    _assert_not_fired(wide, (scores, lengths, table), "topk_page_transform", "int32 token ids")

    def narrowed(scores, lengths, page_table, k=K):
        return safe_fill(scores, lengths, page_table, k).to(torch.int32)

    out, report, ops = _fuse(narrowed, (scores, lengths, table), "export")
    _assert_fired(report, ops, "topk_page_transform", "fxfuse.topk_page_transform")
    want = narrowed(scores, lengths, table)
    assert torch.equal(out.sort(-1).values, want.sort(-1).values)


def _forced_table(block_scores, positions, k=4, init=(3, 1), local=(1,), past_local=False):
    """Forced blocks spelled as several tests ORed: blk < a | blk < b | blk > last - c ...;
    `past_local`: a local test past the causal limit (blk > last + 1), which forces nothing."""
    nb = block_scores.shape[-1]
    last = positions // 128
    blk = torch.arange(nb)[None, :]
    forced = blk < init[0]
    for a in init[1:]:
        forced = forced | (blk < a)
    for c in local:
        forced = forced | (blk > last[:, None] - c)
    if past_local:
        forced = forced | (blk > last[:, None] + 1)
    s = block_scores.masked_fill(forced, float("inf"))
    s = s.masked_fill(blk > last[:, None], float("-inf"))
    idx = s.topk(k, dim=-1).indices
    idx = torch.where(idx <= last[:, None], idx, nb).sort(dim=-1).values
    return idx.masked_fill(idx == nb, -1).to(torch.int32)


@pytest.mark.parametrize(
    "consts",
    [
        {"init": (3, 1), "local": (1,)},  # two init tests: the wider, 3
        {"init": (1,), "local": (3, 1)},  # two local tests: the wider, 3
        {"init": (1,), "local": (), "past_local": True},  # forces nothing past the limit
    ],
)
def test_block_table_forced_tests_or_into_their_union(consts, reference_path):
    positions = torch.tensor([2437, 700, 5000])
    scores = torch.linspace(1, 0, 20).repeat(3, 1)
    scores[:, 1:3] = -100.0  # bad, but forced by blk < 3
    scores[:, 17:19] = -100.0  # bad, but forced by blk > last - 3 (last 19)
    out, report, ops = _fuse(_forced_table, (scores, positions), "export", **consts)
    _assert_fired(report, ops, "topk_block_table", "fxfuse.topk_block_table")
    assert torch.equal(out, _forced_table(scores, positions, **consts))


def test_page_transform_kernel_clamps_int64_lengths_before_narrowing():
    """Interpreter: a length of 2**32 + 3 is longer than the row (torch clamps in int64), not 3."""
    scores, _, table = _page_case(rows=2, length=32)
    lengths = torch.tensor([2**32 + 3, 5])
    out = torch.ops.fxfuse.topk_page_transform(scores, K, lengths, table.int(), 1)
    want = topk_ref.topk_page_transform_ref(scores, K, lengths, table.int(), 1)
    assert torch.equal(out.sort(-1).values, want.sort(-1).values)
    assert (out[0] >= 0).all()


def test_page_transform_kernel_pads_a_negative_row_to_batch():
    """Interpreter: a negative row_to_batch entry reads no memory before the table: padding
    (documented: entries are batch rows; torch and the reference index from the end)."""
    scores, lengths, table = _page_case(rows=2, length=32, batches=2)
    r2b = torch.tensor([-1, 0])
    out = torch.ops.fxfuse.topk_page_transform(scores, K, lengths, table, 1, None, r2b)
    assert (out[0] == -1).all()
    want = topk_ref.topk_page_transform_ref(scores, K, lengths, table, 1, None, r2b)
    assert torch.equal(out[1].sort().values, want[1].sort().values)
