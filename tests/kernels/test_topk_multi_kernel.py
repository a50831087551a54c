"""The multi-program top-k path (many long rows; `kernels/topk.py`, "Many long rows") in
Triton's interpreter, forced on small shapes with small tiles, against the torch reference.

Small configs: 32-score chunks, 2 chunks per segment (so a 300-score row has 5 segments), 64
candidate slots, a 64-score sample; TILED streams the same 64-score segments as one (2, 32)
chunk (the column masks of `_collect_segment`). Each test says which branch the rows take (the
per-row state `_launch` returns): the estimate's candidates, the group-max retry, or the whole-row
fallback when the candidates overflow.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import triton
import triton.language as tl

from fxfuse.kernels import topk, topk_ref
from tests.helpers import narrow_dtype_rows

MULTI = {"MULTI_BLOCK": 32, "MULTI_ROWS": 1, "MULTI_CHUNKS": 2, "MULTI_CAP": 64, "MULTI_SAMPLE": 64}
TILED = {**MULTI, "MULTI_ROWS": 2, "MULTI_CHUNKS": 1}
GEOMETRIES = pytest.mark.parametrize("geometry", [MULTI, TILED], ids=["rows1", "rows2"])


def _retry_only(config: dict) -> dict:
    """config without the sample estimate: every long row is retried (the group-max bound)."""
    return {**config, "MULTI_ESTIMATE": 0}
# A sample as large as the row: the estimate is the exact k-th key.
WHOLE_SAMPLE = {**MULTI, "MULTI_SAMPLE": 512}
CAP = MULTI["MULTI_CAP"]


FINISHES = {
    "bit": {"MULTI_BISECT_PAIRS": 0, "MULTI_INTERP": 0},  # the finishing select per bit
    "pairs": {"MULTI_BISECT_PAIRS": 1, "MULTI_INTERP": 0},
    "interp": {},  # the default: counts at interpolated points (`_interp_edge`)
    "kernel": {"MULTI_FINISH_WARPS": 4},  # the rows finished by a second kernel
    "kernel_bisect": {"MULTI_FINISH_WARPS": 4, "MULTI_INTERP": 0},
    "interp_sample": {"MULTI_INTERP": 2},  # the sample estimate's counts interpolated too
    "kernel_interp_sample": {"MULTI_FINISH_WARPS": 4, "MULTI_INTERP": 2},
    # the walk stores the candidates' scores beside their indices (the select reads them)
    "keys": {"MULTI_KEYS": 1},
    "kernel_keys": {"MULTI_FINISH_WARPS": 4, "MULTI_KEYS": 1},
}


def _set(t: torch.Tensor) -> torch.Tensor:
    return t.sort(dim=-1).values


def _indices(scores, k, lengths=None, row_starts=None, sorted=False, pad=-1, config=MULTI):
    """(out, state): the multi path's indices and its per-row state."""
    out = torch.empty((scores.shape[0], k), dtype=torch.int32)
    state = topk._launch(
        scores, k, out, epilogue=topk.EPI_INDICES.value,
        sort=(topk.SORT_VALUE if sorted else topk.SORT_NONE).value, lengths=lengths,
        row_starts=row_starts, pad=pad, config=config, path="multi",
    )  # fmt: skip
    assert state is not None  # the multi path ran
    return out, state


def _check(scores, k, out, lengths=None, row_starts=None, sorted=False, pad=-1):
    ref = topk_ref.topk_indices_ref(scores, k, lengths, row_starts, sorted, pad)
    assert out.dtype == torch.int32 and out.shape == ref.shape
    if sorted:
        assert torch.equal(out, ref)
    else:
        assert torch.equal(_set(out), _set(ref))


def _retried(state):
    return state[:, topk.ST_RETRY.value] != 0


def _retry_count(state):
    return state[:, topk.ST_RETRY_COUNT.value]


# ---------------------------------------------------------------------------------------------
# branches


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sorted", [False, True])
def test_estimate_branch(dtype, sorted):
    scores = torch.randn(4, 300).to(dtype)
    out, state = _indices(scores, 24, sorted=sorted, config=WHOLE_SAMPLE)
    _check(scores, 24, out, sorted=sorted)
    assert not _retried(state).any()  # the exact estimate leaves k candidates: no retry
    # the set agrees with torch.topk: the same multiset of values
    values = torch.where(scores.float().isnan(), float("-inf"), scores.float())
    ours = values.gather(1, out.long()).sort(1, descending=True).values
    assert torch.equal(ours, values.topk(24, dim=1).values)


@pytest.mark.parametrize("finish", list(FINISHES))
@pytest.mark.parametrize("sorted", [False, True])
def test_finishing_select_from_the_estimate(sorted, finish):
    # The finishing select starts its bisection below the bits the estimate (every candidate's
    # floor) shares with the largest candidate: rows where they share all 32 (every candidate
    # ties at the estimate), the sign bit only, or a few exponent bits.
    scores = -torch.rand(4, 300) - 1.0
    scores[0, 7::7] = 5.0  # 42 candidates, all equal to the exact estimate: the tie path
    scores[1, ::5] = torch.linspace(-0.5, 8.0, 60)  # candidates across the sign bit
    scores[2, ::5] = torch.linspace(2.0, 3.9, 60)  # one exponent, mantissa bits differ
    scores[3, 200:240] = 1.5  # ties at the k-th key below a few larger ones
    scores[3, 250:260] = 2.5
    for config in (WHOLE_SAMPLE, MULTI):  # the exact k-th key, a sampled estimate below it
        out, state = _indices(scores, 24, sorted=sorted, config={**config, **FINISHES[finish]})
        _check(scores, 24, out, sorted=sorted)
        counts = torch.where(_retried(state), _retry_count(state), state[:, topk.ST_COUNT.value])
        assert (counts >= 24).all() and (counts <= CAP).all()  # each row took the select
        if config is MULTI:
            assert (counts > 24).all()  # more candidates than k: the bisection ran


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("finish", list(FINISHES))
def test_narrow_dtype_ties(dtype, finish):
    """The finishing select over bf16 / fp16 candidates without the low key bits the dtype
    leaves equal (`_take_top_of`): consecutive values of the dtype, the k-th tied many times,
    across the sign, with -inf, NaN and signed zeros; exact, sorted and not."""
    scores = narrow_dtype_rows(dtype, 4, 300, steps=9, seed=5)
    for sorted in (False, True):
        out, state = _indices(scores, 24, sorted=sorted, config={**MULTI, **FINISHES[finish]})
        _check(scores, 24, out, sorted=sorted)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interp", [0, 2], ids=["bisect", "interp_sample"])
def test_narrow_dtype_exact_estimate(dtype, interp):
    """A row the sample holds whole: its exact k-th key found without the low key bits the
    dtype leaves equal, then widened back (those bits 0), so the same k candidates and no retry;
    the k-th value tied many times, negative in row 3 (keys whose low bits are all 1)."""
    scores = narrow_dtype_rows(dtype, 4, 300, steps=9, seed=6)
    out, state = _indices(scores, 24, config={**WHOLE_SAMPLE, "MULTI_INTERP": interp})
    _check(scores, 24, out)
    assert not _retried(state).any()
    shift = 16 if dtype == torch.bfloat16 else 13
    kth = topk_ref.score_keys_ref(scores.float()).sort(1, descending=True).values[:, 23]
    estimate = state[:, topk.ST_ESTIMATE.value].to(torch.int64) & 0xFFFFFFFF
    assert torch.equal(estimate, kth & ~((1 << shift) - 1))


@GEOMETRIES
@pytest.mark.parametrize("finish", ["bit", "pairs", "interp", "kernel", "kernel_bisect",
                                    "kernel_keys", "interp_sample", "kernel_interp_sample"])
@pytest.mark.parametrize("sorted", [False, True])
def test_sampled_estimate_and_retry(sorted, geometry, finish):
    # A 64-score sample of 300: some rows' estimates miss and retry; both must be exact.
    scores = torch.randn(8, 300)
    scores[1::2, ::3] = 0.25  # ties across the threshold in every other row
    config = {**geometry, **FINISHES[finish]}
    out, state = _indices(scores, 24, sorted=sorted, config=config)
    _check(scores, 24, out, sorted=sorted)
    # every segment took its ticket, unless a second kernel finishes the rows (no tickets)
    tickets = 0 if finish.startswith("kernel") else 5
    assert state[:, topk.ST_TICKET.value].eq(tickets).all()
    retried = _retried(state)
    assert retried.any() and not retried.all()  # (seeded) both branches ran


@pytest.mark.parametrize(("select", "interp"), [(0, 0), (1, 0), (1, 2)],
                         ids=["radix", "bisect", "interp"])  # fmt: skip
def test_estimate_descents(select, interp):
    # The sample's rank-r key by radix histograms (exact), by a bisection stopped at
    # ESTIMATE_LOW_BIT (a lower edge), or by interpolated counts stopped within rank / 32 of the
    # rank (MULTI_INTERP 2): each a key that r sampled scores reach.
    scores = torch.randn(8, 300)
    config = {**MULTI, "TILE_SELECT": select, "MULTI_INTERP": interp}
    out, state = _indices(scores, 24, config=config)
    _check(scores, 24, out)
    estimate = state[:, topk.ST_ESTIMATE.value].to(torch.int64) & 0xFFFFFFFF
    # MULTI's sample: 4 runs of 16 scores, 75 apart; rank ceil(1.5 * 24 * 64 / 300) = 8
    pos = torch.arange(64) // 16 * 75 + torch.arange(64) % 16
    sample = topk_ref.score_keys_ref(scores[:, pos])
    rank_key = sample.sort(1, descending=True).values[:, 7]
    reached = (sample >= estimate[:, None]).sum(1)
    assert (reached >= 8).all() and (estimate <= rank_key).all()
    if interp:  # rank 8: a slack of 8 // 32 = 0, or a bracket 2**16 wide
        above = sample >= (estimate[:, None] + (1 << topk.ESTIMATE_LOW_BIT.value))
        assert ((reached == 8) | (above.sum(1) < 8)).all()
        return
    # Both descents stop early at an edge that exactly 8 reach; else the radix one is exact,
    # the bisection's low bits are cleared.
    low = (1 << topk.ESTIMATE_LOW_BIT.value) - 1 if select else 0
    assert ((reached == 8) | (estimate >= rank_key & ~low)).all()


def test_estimate_below_the_bisection_floor():
    # Scores that differ only below the estimate's 16-bit floor (5 + 1e-3 x): the floor would
    # take every sampled score (each row retried, its candidates past CAP); the sample's
    # bisection goes on to bit 0 there, and these rows keep the estimate's branch.
    g = torch.Generator().manual_seed(0)
    scores = 5 + 1e-3 * torch.randn(4, 300, generator=g)
    scores[3] = -2 + 1e-4 * torch.randn(300, generator=g)
    for interp in (0, 2):  # the sample's bisection, or its interpolated counts
        out, state = _indices(scores, 24, config={**MULTI, "MULTI_INTERP": interp})
        _check(scores, 24, out)
        counts = state[:, topk.ST_COUNT.value]
        assert (counts <= CAP).all()  # the floor gave 150+ of 300 here
        # A row retries only when its estimate, now tight, misses low (the 64-score sample's
        # spread).
        assert torch.equal(_retried(state), counts < 24)
        assert not _retried(state)[:3].any()  # (seeded)


@GEOMETRIES
@pytest.mark.parametrize("sorted", [False, True])
def test_retry_branch(sorted, geometry):
    scores = torch.randn(3, 300)
    scores[2, 100:130] = 1.5  # a 30-way tie straddling the threshold (1.5 is in the top 24)
    out, state = _indices(scores, 24, sorted=sorted, config=_retry_only(geometry))
    _check(scores, 24, out, sorted=sorted)
    assert _retried(state).all()
    counts = _retry_count(state)
    assert ((counts >= 24) & (counts <= CAP)).all()  # the group-max bound kept 24..CAP


def _adversarial(name: str, rows: int, length: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    if name == "constant":
        return torch.full((rows, length), -3.0)
    if name == "ascending":
        return torch.arange(length, dtype=torch.float32).repeat(rows, 1)
    if name == "descending":
        return -torch.arange(length, dtype=torch.float32).repeat(rows, 1)
    if name == "all_neg_inf":
        return torch.full((rows, length), float("-inf"))
    if name == "all_nan":
        return torch.full((rows, length), float("nan"))
    if name == "nan_mix":
        x = torch.randn(rows, length, generator=g)
        x[torch.rand(rows, length, generator=g) < 0.3] = float("nan")
        x[:, :7] = float("-inf")
        return x
    if name == "top22_equal":
        # Equal in their top 22 bits: only the last 10 mantissa bits (and the index) decide.
        base = torch.tensor(1.5).view(torch.int32)
        low = torch.randint(0, 1024, (rows, length), generator=g, dtype=torch.int32)
        return (base + low).view(torch.float32)
    if name == "top30_equal":
        # Equal in their top 30 bits: ~75 copies of each of 4 values, more than CAP tie.
        base = torch.tensor(-1.5).view(torch.int32)
        low = torch.randint(0, 4, (rows, length), generator=g, dtype=torch.int32)
        return (base + low).view(torch.float32)
    if name == "signed_zeros":
        x = torch.zeros(rows, length)
        x[:, ::3] = -0.0
        x[:, 5::13] = 1.0
        return x
    raise AssertionError(name)


# Rows where more than CAP scores reach the group-max bound: the whole-row fallback.
OVERFLOWING = {"constant", "all_neg_inf", "all_nan", "top30_equal", "signed_zeros"}


@pytest.mark.parametrize(
    "name",
    ["constant", "ascending", "descending", "all_neg_inf", "all_nan", "nan_mix", "top22_equal",
     "top30_equal", "signed_zeros"],
)  # fmt: skip
@GEOMETRIES
def test_adversarial_rows(name, geometry):
    scores = _adversarial(name, 2, 300)
    for sorted in (False, True):
        # the finishing select (interpolated, the default, or per bit) in the collect kernel or
        # in a separate finish kernel
        for finish in ({}, FINISHES["bit"], FINISHES["kernel"], FINISHES["kernel_bisect"]):
            config = {**_retry_only(geometry), **finish}
            out, state = _indices(scores, 24, sorted=sorted, config=config)
            _check(scores, 24, out, sorted=sorted)
            assert (_retry_count(state) > CAP).all() == (name in OVERFLOWING)
        # with the estimate, the walk storing the scores too: segments with more candidates
        # than a chunk holds, rows past CAP (their slots not stored) retried
        for finish in ("kernel_keys", "bit"):
            out, _ = _indices(scores, 24, sorted=sorted, config={**geometry, **FINISHES[finish]})
            _check(scores, 24, out, sorted=sorted)


@GEOMETRIES
def test_lengths_around_k_and_segments(geometry):
    k, segment = 24, 64  # 64-score segments (MULTI and TILED)
    # empty, 1, k-1, k, k+1, a segment's edges, several segments, the full row
    lens = [0, 1, k - 1, k, k + 1, segment - 1, segment, segment + 1, 2 * segment + 1, 300]
    scores = torch.randn(len(lens), 300)
    scores[1::2, ::4] = 0.5
    lengths = torch.tensor(lens, dtype=torch.int32)
    for sorted in (False, True):
        for config in (geometry, _retry_only(geometry), {**geometry, "MULTI_FINISH_WARPS": 4}):
            out, _ = _indices(scores, k, lengths, sorted=sorted, config=config)
            _check(scores, k, out, lengths, sorted=sorted)
            if not sorted:  # rows no longer than k: the identity, then padding
                identity = list(range(k - 1)) + [-1]
                assert torch.equal(out[2], torch.tensor(identity, dtype=torch.int32))
                assert torch.equal(out[3], torch.arange(k, dtype=torch.int32))
            assert (out[0] == -1).all()


@pytest.mark.parametrize("chunks", [1, 2, 4])
def test_prefetch(chunks):
    # MULTI_PREFETCH 2 (two chunks' loads in flight) and 3 (Triton's pipeliner): full segments
    # of 1, 2 and 4 chunks (the loads past the segment's last chunk clamp to it), a partial last
    # segment (masked, one chunk ahead), all exact.
    g = torch.Generator().manual_seed(chunks)
    scores = torch.randn(4, 300, generator=g)
    scores[1, ::3] = 0.25  # ties across the threshold
    lengths = torch.tensor([300, 32 * chunks, 32 * chunks * 2 + 5, 97], dtype=torch.int32)
    for prefetch in (1, 2, 3):
        config = {**MULTI, "MULTI_CHUNKS": chunks, "MULTI_PREFETCH": prefetch}
        for sorted in (False, True):
            out, _ = _indices(scores, 24, lengths, sorted=sorted, config=config)
            _check(scores, 24, out, lengths, sorted=sorted)


@GEOMETRIES
def test_row_starts_pad_and_odd_strides(geometry):
    base = torch.randn(5, 1003)
    scores = base[:, 3:403]  # row stride 1003 (not a multiple of 4), unaligned start
    starts = torch.tensor([0, 50, 370, 500, 7], dtype=torch.int64)  # 500 is clamped to L
    lengths = torch.tensor([400, 200, 100, 10, 25], dtype=torch.int64)
    for config in (geometry, _retry_only(geometry)):
        out, _ = _indices(scores, 24, lengths, starts, pad=400, config=config)
        _check(scores, 24, out, lengths, starts, pad=400)
    assert (out[3] == 400).all() and ((out[2] >= 0) & (out[2] < 30)).all()


@GEOMETRIES
def test_column_major_scores(geometry):
    """Scores with an element stride of 3 (a transposed view): the stream, the group maxima and
    the finishing select's reload by index all step by it."""
    scores = torch.randn(300, 3).t()
    assert scores.stride() == (1, 3)
    starts = torch.tensor([0, 40, 7], dtype=torch.int64)
    lengths = torch.tensor([300, 250, 200], dtype=torch.int64)
    for config in (geometry, _retry_only(geometry)):
        out, state = _indices(scores, 24, lengths, starts, config=config)
        _check(scores, 24, out, lengths, starts)
        assert _retried(state).all() == (config.get("MULTI_ESTIMATE") == 0)


@triton.jit
def _float_test_kernel(x_ptr, lo_ptr, out_ptr, N: tl.constexpr, L: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, N))
    lo = tl.load(lo_ptr + tl.arange(0, L)).to(tl.uint32, bitcast=True)
    lo_f = topk._key_float(lo)
    cand = (x[None, :] >= lo_f[:, None]) | (lo <= topk.NEG_INF_KEY)[:, None]
    offs = tl.arange(0, L)[:, None] * N + tl.arange(0, N)[None, :]
    tl.store(out_ptr + offs, cand.to(tl.int8))


@triton.jit
def _bisect_test_kernel(v_ptr, out_ptr, count, need, low_bit, N: tl.constexpr,
                        PAIRS: tl.constexpr):  # fmt: skip
    v = tl.load(v_ptr + tl.program_id(0) * N + tl.arange(0, N)).to(tl.uint32, bitcast=True)
    t, c = topk._bisect_edge(v, count, need, 31, low_bit, 0, PAIRS)
    tl.store(out_ptr + tl.program_id(0) * 2, t.to(tl.int32, bitcast=True))
    tl.store(out_ptr + tl.program_id(0) * 2 + 1, c)


@pytest.mark.parametrize("pairs", [False, True], ids=["bit", "pairs"])
@pytest.mark.parametrize("low_bit", [0, 16, 17])
def test_bisect_edge(pairs, low_bit):
    # (t, c) with c = #(v >= t) >= need, and either exactly need reach t or t is the need-th
    # largest value with its bits below low_bit cleared; one bit a count or two.
    g = torch.Generator().manual_seed(low_bit)
    n = 128
    rows = [torch.randint(1, 2**31, (n,), generator=g) * 2 + 1,  # distinct-ish, odd, large
            torch.randint(1, 6, (n,), generator=g),  # many ties
            (torch.randint(0, 2**12, (n,), generator=g) << 20) | 0x5,  # equal low bits
            torch.full((n,), 0x80000000)]  # all tied  # fmt: skip
    v = torch.stack(rows).to(torch.int64)
    v[:, ::9] = 0  # elements not taking part
    for need in (1, 7, 50, 100):
        out = torch.empty((len(rows), 2), dtype=torch.int32)
        counts = (v != 0).sum(1)
        v32 = torch.where(v >= 2**31, v - 2**32, v).to(torch.int32)
        _bisect_test_kernel[(len(rows),)](v32, out, int(counts[0]), need, low_bit, N=n,
                                          PAIRS=pairs)  # fmt: skip
        assert (counts == counts[0]).all()  # the kernel takes one count for every row
        for r in range(len(rows)):
            t, c = int(out[r, 0]) & 0xFFFFFFFF, int(out[r, 1])
            live = v[r][v[r] != 0]
            assert c == int((live >= t).sum()) and c >= need
            if c != need:
                kth = int(live.sort(descending=True).values[need - 1])
                assert t == kth & ~((1 << low_bit) - 1)


@triton.jit
def _interp_test_kernel(v_ptr, bounds_ptr, out_ptr, count, need, slack, min_width,
                        N: tl.constexpr):  # fmt: skip
    v = tl.load(v_ptr + tl.program_id(0) * N + tl.arange(0, N)).to(tl.uint32, bitcast=True)
    lo = tl.load(bounds_ptr + tl.program_id(0) * 2).to(tl.uint32, bitcast=True)
    hi = tl.load(bounds_ptr + tl.program_id(0) * 2 + 1).to(tl.uint32, bitcast=True)
    t, c, t_hi, c_hi = topk._interp_edge(v, count, need, lo, hi, 0, slack, min_width)
    tl.store(out_ptr + tl.program_id(0) * 4, t.to(tl.int32, bitcast=True))
    tl.store(out_ptr + tl.program_id(0) * 4 + 1, c)
    tl.store(out_ptr + tl.program_id(0) * 4 + 2, t_hi.to(tl.int32, bitcast=True))
    tl.store(out_ptr + tl.program_id(0) * 4 + 3, c_hi)


@pytest.mark.parametrize(("slack", "min_width"), [(0, 1), (3, 1), (0, 2**16), (5, 2**8)])
def test_interp_edge(slack, min_width):
    # With slack 0 and min_width 1, `_bisect_edge`'s answer by interpolated counts, for brackets
    # from tight to the whole uint32 range: c = #(v >= t) >= need and either exactly need reach
    # t or t is the need-th largest value (ties at the k-th, a constant row, one huge outlier,
    # keys at the range's ends), the outlier row ending too (after INTERP_STEPS counts the
    # bracket halves). Looser (the sample estimate's): c <= need + slack or the final bracket
    # [t, t_hi) at most min_width wide, with fewer than need reaching t_hi.
    g = torch.Generator().manual_seed(3)
    n = 128
    rows = [torch.randint(1, 2**31, (n,), generator=g) * 2 + 1,
            torch.randint(1, 6, (n,), generator=g),
            (torch.randint(0, 2**12, (n,), generator=g) << 20) | 0x5,
            torch.full((n,), 0x80000000),
            torch.cat([torch.full((n - 1,), 7), torch.tensor([2**32 - 2])]),  # an outlier
            torch.randint(2**32 - 300, 2**32 - 1, (n,), generator=g)]  # fmt: skip
    v = torch.stack(rows).to(torch.int64)
    v[:, ::9] = 0  # elements not taking part
    live = [r[r != 0] for r in v]
    counts = [len(r) for r in live]
    assert len(set(counts)) == 1
    for need in (1, 7, 50, counts[0] - 1, counts[0]):
        for pad in (0, 1, 1000):  # the bracket [lo, hi): tight, or wider than the keys
            bounds = torch.tensor(
                [[max(int(r.min()) - pad, 1), min(int(r.max()) + 1 + pad, 2**32 - 1)] for r in live]
            )
            b32 = torch.where(bounds >= 2**31, bounds - 2**32, bounds).to(torch.int32)
            v32 = torch.where(v >= 2**31, v - 2**32, v).to(torch.int32)
            out32 = torch.empty((len(rows), 4), dtype=torch.int32)
            _interp_test_kernel[(len(rows),)](v32, b32, out32, counts[0], need, slack, min_width,
                                              N=n)  # fmt: skip
            out = out32.to(torch.int64) & 0xFFFFFFFF
            for r in range(len(rows)):
                t, c, t_hi, c_hi = (int(x) for x in out[r])
                assert c == int((live[r] >= t).sum()) and c >= need, (r, need, pad)
                assert c_hi == int((live[r] >= t_hi).sum()) < need and t < t_hi, (r, need, pad)
                if (slack, min_width) == (0, 1):
                    if c != need:
                        kth = int(live[r].sort(descending=True).values[need - 1])
                        assert t == kth, (r, need)
                else:
                    assert c <= need + slack or t_hi - t <= min_width, (r, need, pad)


def test_float_candidate_test_is_the_key_order():
    # `_collect_segment` tests x >= float(lo) (or lo <= key(-inf)) instead of key(x) >= lo: the
    # same answer for every score (signed zeros, infinities, NaN, subnormals) and every edge key.
    x = torch.tensor(
        [0.0, -0.0, 1e-45, -1e-45, 1.0, -1.0, 3.4e38, -3.4e38, float("inf"), float("-inf"),
         float("nan"), -float("nan"), 2.5, -2.5, 1e-40, -1e-40]
    )  # fmt: skip
    keys = topk_ref.score_keys_ref(x)
    edges = {0, 1, 0x007FFFFE, 0x007FFFFF, 0x00800000, 0x7FFFFFFE, 0x7FFFFFFF, 0x80000000,
             0x80000001, 0xFF7FFFFF, 0xFF800000, 0xFF800001, 0xFFFFFFFE, 0xFFFFFFFF}  # fmt: skip
    edges |= {int(k) + d for k in keys for d in (-1, 0, 1) if 0 <= int(k) + d < 2**32}
    lo = torch.tensor(sorted(edges), dtype=torch.int64)
    lo = torch.cat([lo, lo[-1:].expand(64 - lo.numel())])  # 64 rows for the kernel
    lo32 = torch.where(lo >= 2**31, lo - 2**32, lo).to(torch.int32)
    out = torch.empty((64, 16), dtype=torch.int8)
    _float_test_kernel[(1,)](x, lo32, out, N=16, L=64)
    want = keys[None, :] >= lo[:, None]
    assert torch.equal(out.bool(), want)


def test_full_column_masks():
    # 32 scores per column per segment (a (4, 32) chunk, 8 chunks): every bit of a column's
    # candidate mask set, in the first segment's column 5 and across the second segment.
    config = {**MULTI, "MULTI_ROWS": 4, "MULTI_CHUNKS": 8}
    scores = torch.randn(3, 2048)
    scores[0, 5::32][:32] = 5.0  # column 5 of segment 0: 32 ties, the top 24 the first ones
    scores[1, 1024:] = 4.0 + torch.rand(1024)  # every score of segment 1 above segment 0's
    for sorted, finish in itertools.product((False, True), ("bit", "kernel_keys")):
        out, state = _indices(scores, 24, sorted=sorted, config={**config, **FINISHES[finish]})
        _check(scores, 24, out, sorted=sorted)
        assert (state[:2, topk.ST_COUNT.value] >= 24).all()


def test_fp16_and_two_launches_in_a_row():
    # State is per call: a second launch over other scores must not see the first one's.
    first = torch.randn(3, 300).half()
    second = torch.full((3, 300), 2.0).half()
    second[:, 250:] = 3.0
    for scores in (first, second, first):
        out, _ = _indices(scores, 24, sorted=True)
        _check(scores, 24, out, sorted=True)


def test_row_groups(monkeypatch):
    # Scratch for one row per group: 3 groups of launches reusing the same scratch.
    def plan():
        return topk._multi_plan(topk._launch_config("cpu", None, 3, 300, 24, MULTI), 3, 300, 24)

    one_row = plan()
    monkeypatch.setattr(topk, "MULTI_SCRATCH_BYTES", 8 * one_row["area"] + 4 * one_row["gmax_row"])
    assert plan()["group"] == 1
    scores = torch.randn(3, 300)
    scores[1] = 1.0  # the fallback in the middle group
    out, state = _indices(scores, 24, sorted=True)
    _check(scores, 24, out, sorted=True)
    assert (_retry_count(state) > CAP).tolist() == [False, True, False]


# ---------------------------------------------------------------------------------------------
# page transform


@pytest.mark.parametrize("page_size", [1, 16])
def test_page_transform(page_size):
    rows, length, batches = 4, 320, 3
    scores = torch.randn(rows, length)
    scores[3] = 0.75  # the fallback
    lengths = torch.tensor([320, 200, 30, 320], dtype=torch.int32)
    starts = torch.tensor([0, 100, 5, 0], dtype=torch.int32)
    row_to_batch = torch.tensor([2, 0, 1, 0], dtype=torch.int64)
    pages = length // page_size
    # A permuted table per batch, so the transform can be inverted.
    table = torch.stack([torch.randperm(pages * batches)[:pages] for _ in range(batches)])
    table = table.to(torch.int32)
    # the collect kernel's last segment finishes each row, or a second kernel does (unsorted:
    # the pages written straight from the candidates' tile; sorted: through the pairs)
    for config in (MULTI, {**MULTI, "MULTI_FINISH_WARPS": 4}):
        for sorted in (False, True):
            out = topk.topk_page_transform(
                scores, 24, lengths, table, page_size, starts, row_to_batch, sorted,
                config=config, path="multi",
            )  # fmt: skip
            ref = topk_ref.topk_page_transform_ref(
                scores, 24, lengths, table, page_size, starts, row_to_batch, sorted
            )
            assert torch.equal(out if sorted else _set(out), ref if sorted else _set(ref))
    # invert: physical page -> logical page of the row's batch gives back the indices
    idx = topk_ref.topk_indices_ref(scores, 24, lengths, starts, sorted=True)
    valid = out >= 0
    assert torch.equal(valid, idx >= 0)
    inverse = torch.full((batches, pages * batches), -1, dtype=torch.int64)
    for b in range(batches):
        inverse[b, table[b].long()] = torch.arange(pages)
    b = row_to_batch.long()[:, None].expand_as(out)
    logical = inverse[b[valid], (out[valid].long() >> (page_size.bit_length() - 1))]
    back = logical * page_size + (out[valid].long() & (page_size - 1))
    assert torch.equal(back, idx[valid].long())


# ---------------------------------------------------------------------------------------------
# dispatch


def _path_taken(scores, k, **kwargs):
    out = torch.empty((scores.shape[0], k), dtype=torch.int32)
    state = topk._launch(
        scores, k, out, epilogue=topk.EPI_INDICES.value, sort=topk.SORT_NONE.value, **kwargs
    )
    _check(scores, k, out)
    return "row" if state is None else "multi"


def test_dispatch(monkeypatch):
    scores = torch.randn(2, 300)
    low = {**MULTI, "MULTI_MIN_LENGTH": 256, "MULTI_MIN_ELEMENTS": 600}
    high = {**MULTI, "MULTI_MIN_LENGTH": 256, "MULTI_MIN_ELEMENTS": 601}
    assert _path_taken(scores, 24, config=low) == "multi"  # 2 x 300 >= 600
    assert _path_taken(scores, 24, config=high) == "row"
    # more rows than MULTI_MAX_ROWS: the row path fills the GPU on its own
    assert _path_taken(scores, 24, config={**low, "MULTI_MAX_ROWS": 1}) == "row"
    assert _path_taken(scores, 24, config={**low, "MULTI_MAX_ROWS": 2}) == "multi"
    assert _path_taken(scores, 24, config={**low, "MULTI_MAX_ROWS": 1}, path="multi") == "multi"
    assert _path_taken(scores, 24, config=low, path="row") == "row"
    assert _path_taken(scores, 24, config=high, path="multi") == "multi"
    monkeypatch.setenv(topk.PATH_ENV, "multi")
    assert _path_taken(scores, 24, config=high) == "multi"
    assert _path_taken(scores, 24, config=low, path="auto") == "multi"
    monkeypatch.setenv(topk.PATH_ENV, "row")
    assert _path_taken(scores, 24, config=low) == "row"
    # the default table keeps short tests on the row path
    monkeypatch.delenv(topk.PATH_ENV)
    assert _path_taken(scores, 24) == "row"


def test_masks_and_block_tables_keep_the_row_path(monkeypatch):
    monkeypatch.setenv(topk.PATH_ENV, "multi")
    scores = torch.randn(2, 300)
    assert torch.equal(topk.topk_mask(scores, 24, config=MULTI), topk_ref.topk_mask_ref(scores, 24))


@pytest.mark.parametrize(
    "call,name",
    [
        (lambda s: topk.topk_indices(s, 4, path="fast"), "path"),
        (lambda s: topk.topk_indices(s, 4, config={"MULTI_CAP": 100}), "config"),
        (lambda s: topk.topk_indices(s, 4, config={"MULTI_SAMPLE": 16}), "config"),
        (lambda s: topk.topk_indices(s, 4, config={"MULTI_ESTIMATE": 2}), "config"),
        (lambda s: topk.topk_indices(s, 4, config={"MULTI_PREFETCH": 5}), "config"),
        (lambda s: topk.topk_indices(s, 4, config={"MULTI_WARPS": 3}), "config"),
        (lambda s: topk.topk_indices(s, 4, config={"MULTI_CHUNKS": 0}), "config"),
        (lambda s: topk.topk_indices(s, 4, config={"MULTI_ROWS": 3}), "config"),
        (lambda s: topk.topk_indices(s, 4, config={"MULTI_ROWS": 8, "MULTI_CHUNKS": 5}), "config"),
        (lambda s: topk.topk_indices(s, 4, config={"MULTI_MAX_ROWS": 0}), "config"),
        (lambda s: topk.topk_indices(s, 4, config={"MULTI_MAXNREG": 16}), "config"),
        (lambda s: topk.topk_indices(s, 4, config={"MULTI_SAMPLE_WARPS": 3}), "config"),
        (lambda s: topk.topk_indices(s, 4, config={"MULTI_BISECT_PAIRS": 2}), "config"),
        (lambda s: topk.topk_indices(s, 4, config={"MULTI_MAXNREG": 64}, target="gfx950"),
         "config"),
    ],
)
def test_bad_inputs(call, name):
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        call(torch.randn(3, 32))


def test_bad_path_env(monkeypatch):
    monkeypatch.setenv(topk.PATH_ENV, "fastest")
    with pytest.raises(ValueError, match=rf"^{topk.PATH_ENV}\b"):
        topk.topk_indices(torch.randn(3, 32), 4)


# ---------------------------------------------------------------------------------------------
# GPU: both paths compiled, at DSA shapes (the table's own configs), against the reference


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("path", ["row", "multi"])
@pytest.mark.parametrize("rows, length", [(4, 65536), (64, 131072)])
@pytest.mark.parametrize("sorted", [False, True])
def test_gpu_paths_at_dsa_shapes(path, rows, length, sorted):
    k = 2048
    g = torch.Generator().manual_seed(rows + length)
    scores = torch.randn(rows, length, generator=g)
    scores[1, ::5] = 0.5  # a row with many ties at the threshold
    lengths = torch.randint(k // 2, length + 1, (rows,), generator=g, dtype=torch.int32)
    lengths[0] = length
    for _ in range(2):  # a second launch reuses the per-row tickets: they must reset
        out = topk.topk_indices(scores.cuda(), k, lengths.cuda(), sorted=sorted, path=path)
        _check(scores, k, out.cpu(), lengths=lengths, sorted=sorted)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("prefetch", [2, 3, 4])
def test_gpu_prefetch(prefetch):
    # The stream's deeper prefetch compiled (register rotation, or Triton's pipeliner through
    # shared memory), full and partial segments, ties at the threshold.
    k, rows, length = 2048, 8, 131072
    g = torch.Generator().manual_seed(prefetch)
    scores = torch.randn(rows, length, generator=g)
    scores[1, ::5] = 0.5
    lengths = torch.randint(k // 2, length + 1, (rows,), generator=g, dtype=torch.int32)
    lengths[0] = length
    out = topk.topk_indices(scores.cuda(), k, lengths.cuda(), path="multi",
                            config={"MULTI_PREFETCH": prefetch})  # fmt: skip
    _check(scores, k, out.cpu(), lengths=lengths)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interp", [0, 2], ids=["bisect", "interp_sample"])
def test_gpu_short_narrow_rows(dtype, interp):
    # Rows the 8192-score sample holds whole in the 128K bucket (a varlen decode batch): their
    # exact k-th key over the narrowed bf16 / fp16 keys, compiled; the k-th value tied many
    # times, negative rows (keys whose low bits are all 1), -inf and NaN.
    k, rows, length = 2048, 8, 131072
    scores = narrow_dtype_rows(dtype, rows, length, steps=40, seed=9)
    lengths = torch.tensor([k + 1, 3000, 8192, 5000, 4096, 8000, 2500, 131072], dtype=torch.int32)
    out = topk.topk_indices(scores.cuda(), k, lengths.cuda(), path="multi",
                            config={"MULTI_INTERP": interp})  # fmt: skip
    _check(scores, k, out.cpu(), lengths=lengths)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("name", ["constant", "ascending", "nan_mix", "top30_equal", "signed_zeros"])
def test_gpu_multi_adversarial(name):
    scores = _adversarial(name, 8, 32768)
    out = topk.topk_indices(scores.cuda(), 2048, path="multi")
    _check(scores, 2048, out.cpu())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("finish", [{"TILE_SELECT": 0}, {"TILE_SELECT": 1, "MULTI_INTERP": 0},
                                    {"MULTI_FINISH_WARPS": 4}, {"MULTI_FINISH_WARPS": 16},
                                    {"MULTI_INTERP": 1}, {"MULTI_INTERP": 1, "MULTI_KEYS": 0},
                                    {"MULTI_INTERP": 2}],
                         ids=["radix", "bisect", "kernel4", "kernel16", "interp",
                              "interp_gather", "interp_sample"])  # fmt: skip
@pytest.mark.parametrize("k", [512, 2048])
def test_gpu_finishing_selects(finish, k):
    # The multi path's finishing selects compiled, and the finish in a second kernel, over rows
    # of several shapes of tail (hundreds of scores equal at the k-th, a large common offset
    # 5 + 1e-3 x, ties everywhere, NaN), exact against the reference.
    rows, length = 8, 131072
    g = torch.Generator().manual_seed(k)
    scores = torch.randn(rows, length, generator=g)
    scores[1] = torch.rand(length, generator=g)
    scores[2] = torch.randn(length, generator=g).exp()
    scores[3] = 5.0 + 1e-3 * torch.randn(length, generator=g)
    scores[4, ::97] = 2.0  # ~1350 equal scores around the k-th
    scores[5] = (scores[5] * 64).round() / 64  # ties everywhere
    scores[6, :3000] = float("nan")
    out = topk.topk_indices(scores.cuda(), k, path="multi", config=finish)
    _check(scores, k, out.cpu())


@pytest.mark.parametrize(
    ("rows", "length", "k", "cap"),
    [(256, 131072, 2048, 4096), (256, 131072, 1024, 4096), (256, 131072, 512, 2048),
     (16384, 17920, 512, 2048), (16384, 17920, 64, 2048), (64, 131072, 16, 2048)],
)  # fmt: skip
def test_candidate_tile_from_k_and_the_sample(rows, length, k, cap):
    # The select's tile: twice the estimate's expected candidates (max(1.5 k, L / 128)), a power
    # of 2 from MULTI_CAP_MIN up to the table's MULTI_CAP (4096 on sm90), never below 2 k.
    cfg = topk._launch_config("sm90", None, rows, length, k, None)
    plan = topk._multi_plan(cfg, rows, length, k)
    assert plan["cap"] == cap
    expected = max(1.5 * k, length * max(1, cfg["MULTI_SAMPLE"] // 128) / cfg["MULTI_SAMPLE"])
    assert plan["cap"] >= min(2 * expected, cfg["MULTI_CAP"]) and plan["cap"] >= 2 * k


@pytest.mark.parametrize("interp", [0, 1, 2], ids=["bisect", "interp", "interp_sample"])
def test_estimate_at_the_sm90_geometry(interp):
    # The sample estimate at the sm90 entry's geometry (an 8192-score sample of 128K-score rows,
    # 4096 candidate slots, k 2048) over eight kinds of row: each row's candidates land between
    # k and CAP (no retry), and the result is exact, whichever descents run.
    g = torch.Generator().manual_seed(1)
    n = 131072
    def randn():
        return torch.randn(n, generator=g)

    rows = [randn(), torch.rand(n, generator=g), randn().exp(), randn().relu(), randn().cumsum(0),
            (randn() * 64).round() / 64, 5 + 1e-3 * randn(), 3 * randn() + 10]  # fmt: skip
    scores = torch.stack(rows)
    config = {"MULTI_BLOCK": 2048, "MULTI_ROWS": 1, "MULTI_CHUNKS": 16, "MULTI_CAP": 4096,
              "MULTI_SAMPLE": 8192, "MULTI_FINISH_WARPS": 8, "MULTI_INTERP": interp}  # fmt: skip
    out, state = _indices(scores, 2048, config=config)
    _check(scores, 2048, out)
    counts = state[:, topk.ST_COUNT.value]
    assert not _retried(state).any() and (counts >= 2048).all() and (counts <= 4096).all(), counts


def test_page_transform_at_the_sm90_entry():
    # The shipped sm90 entry as it is (32K-score segments, an 8192-score sample, the finish
    # kernel, the scores stored by the walk, the interpolated finish) at the DSA shape's row
    # length, page size 64 through a permuted table: Gaussian, uniform, 1/64-quantized (ties
    # everywhere), ties every 97th score, bf16-valued rows; full, short by 1 and 1000, 70000
    # (a partial last segment) and 2500 (the sample is the whole row); unsorted and sorted.
    g = torch.Generator().manual_seed(7)
    rows, n, k, page = 6, 131072, 2048, 64
    scores = torch.randn(rows, n, generator=g)
    scores[1] = torch.rand(n, generator=g)
    scores[2] = (torch.randn(n, generator=g) * 64).round() / 64
    scores[3, ::97] = 0.5
    scores[4] = torch.randn(n, generator=g).to(torch.bfloat16).float()
    lengths = torch.tensor([n, n - 1, n - 1000, 70000, n, 2500], dtype=torch.int32)
    pages = n // page
    table = torch.stack([torch.randperm(2 * pages, generator=g)[:pages] for _ in range(rows)])
    table = table.to(torch.int32)
    for sorted, r in ((False, rows), (True, 2)):
        out = topk.topk_page_transform(scores[:r], k, lengths[:r], table[:r], page, sorted=sorted,
                                       target="sm90", path="multi")  # fmt: skip
        ref = topk_ref.topk_page_transform_ref(scores[:r], k, lengths[:r], table[:r], page,
                                               sorted=sorted)  # fmt: skip
        assert torch.equal(out, ref) if sorted else torch.equal(_set(out), _set(ref))


def test_finishing_select_interpolates_unless_told_otherwise():
    """MULTI_INTERP 2 (the default): the multi path's sample estimate and finishing select at
    interpolated points where TILE_SELECT bisects; 1 the finishing select only; 0, or radix
    histograms, keep theirs; other values are refused."""

    def select(**config):
        cfg = topk._launch_config("sm90", torch.device("cuda"), 4, 8192, 64, config)
        return topk._multi_plan(cfg, 4, 8192, 64)["select"]

    assert select() == topk.SELECT_INTERP_SAMPLE.value
    assert select(MULTI_INTERP=1) == topk.SELECT_INTERP.value
    assert select(MULTI_INTERP=0) == topk.SELECT_BISECT.value
    assert select(MULTI_INTERP=2) == topk.SELECT_INTERP_SAMPLE.value
    assert select(TILE_SELECT=topk.SELECT_RADIX.value) == topk.SELECT_RADIX.value
    with pytest.raises(ValueError, match="MULTI_INTERP"):
        select(MULTI_INTERP=3)


def test_keys_are_stored_where_a_second_kernel_finishes_long_k():
    """MULTI_KEYS -1 (the plan's rule): the walk stores scores only where the finish kernel
    runs and k >= MULTI_KEYS_MIN_K; 0 / 1 force it; other values are refused."""

    def keys(k, **config):
        cfg = topk._launch_config("cpu", None, 4, 8192, k, {**MULTI, **config})
        return topk._multi_plan(cfg, 4, 8192, k)["keys"]

    big = topk.MULTI_KEYS_MIN_K
    assert keys(big, MULTI_FINISH_WARPS=4) and keys(2048, MULTI_FINISH_WARPS=8)
    assert not keys(big - 1, MULTI_FINISH_WARPS=4) and not keys(big, MULTI_FINISH_WARPS=0)
    assert keys(24, MULTI_KEYS=1) and not keys(2048, MULTI_FINISH_WARPS=4, MULTI_KEYS=0)
    with pytest.raises(ValueError, match="MULTI_KEYS"):
        keys(24, MULTI_KEYS=2)
