"""Pattern `gemm_split_cat`: every spelling of GEMM → [view/transpose →] split → cat (and GEMM → split
whose piece is copied) fires in both IRs and matches; near-misses stay unfused, with a reason.

Numbers: GEMM outputs ≤ 1e-2 relative to the same spelling run in float64 (SPEC §5), y's copied
slice bit-exact; on the reference path (no interpreter) the fused graph equals the unfused one."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxfuse
from fxfuse.patterns import gemm_split_cat
from fxfuse.runtime import gemm_split_cat_ops
from tests.helpers import fused_targets, outputs_bytes_equal

NAME = "gemm_split_cat"
RTOL = 1e-2
# Odd token count, sizes no power of two: K 40, D 3 heads of (S1 24 | S2 20), y width S3 12.
M, K, D, S1, S2, S3 = 7, 40, 3, 24, 20, 12
BF16 = torch.bfloat16
SPLIT_CAT_OP = "fxfuse.gemm_split_cat.default"
SPLIT_OP = "fxfuse.gemm_split.default"


# --- spellings: (x, w, y) -> (out, *pieces); out[..., :S1] is GEMM, out[..., S1:] is y -------------


def split_cat(x, w, y):  # the SPEC's form; y broadcast over heads (stride 0)
    c = F.linear(x, w).view(x.shape[0], D, S1 + S2)
    c1, c2 = torch.split(c, [S1, S2], dim=-1)
    return torch.cat([c1, y.expand(-1, D, -1)], dim=-1), c2


def split_even(x, w, y):  # split(c, S): split.Tensor, equal pieces
    c = F.linear(x, w).view(x.shape[0], D, S1 + S2)
    c1, c2 = c.split((S1 + S2) // 2, dim=-1)
    return torch.cat([c1, y.expand(-1, D, -1)], dim=-1), c2


def slices(x, w, y):  # two slices instead of a split
    c = F.linear(x, w).view(x.shape[0], D, S1 + S2)
    return torch.cat([c[..., :S1], y.expand(-1, D, -1)], dim=-1), c[..., S1:]


def matmul_t(x, w, y):  # x @ wᵀ on (B, S, K) tokens, y already (B, S, D, S3)
    c = (x @ w.t()).view(*x.shape[:-1], D, S1 + S2)
    c1, c2 = torch.split(c, [S1, S2], dim=-1)
    return torch.cat([c1, y], dim=-1), c2


def heads_first(x, w, y):  # (B, S, H, W).transpose(1, 2): HF's layout, spelled with cat
    b, s = x.shape[:2]
    c = F.linear(x, w).view(b, s, D, S1 + S2).transpose(1, 2)
    c1, c2 = torch.split(c, [S1, S2], dim=-1)
    return torch.cat([c1, y.expand(-1, D, -1, -1)], dim=-1), c2


def no_rope_cat(x, w, y):  # heads_first with a 0-wide y (post-grad: a clone of the piece)
    b, s = x.shape[:2]
    c = F.linear(x, w).view(b, s, D, S1 + S2).transpose(1, 2)
    c1, c2 = torch.split(c, [S1, S2], dim=-1)
    return torch.cat([c1, y.expand(-1, D, -1, -1)], dim=-1), c2


def heads_clone(x, w, y):  # transposed heads, a piece cloned: clone keeps its strides
    b, s = x.shape[:2]
    c = F.linear(x, w).view(b, s, D, S1 + S2).transpose(1, 2)
    c1, c2 = torch.split(c, [S1, S2], dim=-1)
    return c1.clone(), c2


def hf_new_empty(x, w, y):  # HF DeepSeek-V3 expand_kv: new_empty + slice copy_
    b, _, s, _ = x.shape
    kv = F.linear(x, w).view(b, s, -1, S1 + S2).transpose(1, 2)
    k_nope, value = torch.split(kv, [S1, S2], dim=-1)
    k_rot = y.expand(-1, k_nope.shape[1], -1, -1)
    key = kv.new_empty(*kv.shape[:-1], S1 + S3)
    key[..., :S1].copy_(k_nope)
    key[..., S1:].copy_(k_rot)
    return key, value


def hf_no_rope(x, w, y):  # the same with a 0-wide rope part (GLM-5.3-Flash): export's alias copy
    b, _, s, _ = x.shape
    kv = F.linear(x, w).view(b, s, -1, S1 + S2).transpose(1, 2)
    k_nope, value = torch.split(kv, [S1, S2], dim=-1)
    k_rot = y.expand(-1, k_nope.shape[1], -1, -1)
    key = kv.new_empty(*kv.shape[:-1], S1 + y.shape[-1])
    key[..., :S1].copy_(k_nope)
    key[..., S1:].copy_(k_rot)
    return key, value


def setitem(x, w, y):  # the same buffer filled by slice assignment, y broadcast by the copy
    c = F.linear(x, w).view(x.shape[0], D, S1 + S2)
    c1, c2 = torch.split(c, [S1, S2], dim=-1)
    out = torch.empty(x.shape[0], D, S1 + S3, dtype=x.dtype)
    out[..., :S1] = c1
    out[..., S1:] = y
    return out, c2


def three_pieces(x, w, y):  # q_a | kv_a | k_pe style: pieces after the first come from c2
    c = F.linear(x, w).view(x.shape[0], D, S1 + S2)
    c1, c2a, c2b = torch.split(c, [S1, 8, S2 - 8], dim=-1)
    return torch.cat([c1, y.expand(-1, D, -1)], dim=-1), c2a, c2b


def no_heads(x, w, y):  # D = 1: split the (M, N) GEMM output itself
    c1, c2 = torch.split(F.linear(x, w), [S1 * D, S2 * D], dim=-1)
    return torch.cat([c1, y], dim=-1), c2


def kv_a(x, w, y):  # GEMM → split, no cat: DeepSeek kv_a; the copy is what the fused op saves
    a, b = torch.split(F.linear(x, w), [S1 * D, S2 * D], dim=-1)
    return a.contiguous(), b


def _inputs(spelling, dtype=BF16, m=M):
    n = D * (S1 + S2)
    w = torch.randn(n, K, dtype=dtype) / K**0.5
    if spelling in (hf_new_empty, hf_no_rope):
        s3 = 0 if spelling is hf_no_rope else S3
        return torch.randn(2, 1, m, K, dtype=dtype), w, torch.randn(2, 1, m, s3, dtype=dtype)
    if spelling in (heads_first, no_rope_cat, heads_clone):
        s3 = S3 if spelling is heads_first else 0
        return torch.randn(2, m, K, dtype=dtype), w, torch.randn(2, 1, m, s3, dtype=dtype)
    if spelling is matmul_t:
        return torch.randn(2, m, K, dtype=dtype), w, torch.randn(2, m, D, S3, dtype=dtype)
    if spelling is setitem:
        return torch.randn(m, K, dtype=dtype), w, torch.randn(m, 1, S3, dtype=dtype)
    if spelling in (no_heads, kv_a):
        return torch.randn(m, K, dtype=dtype), w, torch.randn(m, S3, dtype=dtype)
    return torch.randn(m, K, dtype=dtype), w, torch.randn(m, 1, S3, dtype=dtype)


class Spelled(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x, w, y):
        return self.body(x, w, y)


def _fuse(model, inputs, **kw):
    with torch.no_grad():
        return fxfuse.apply_fusions(model, inputs, **kw)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _check_numbers(got, inputs, spelling, s1, eager_strides=True):
    """GEMM parts ≤ RTOL against the spelling in float64; y's slice exact; eager_strides: each
    output has eager's strides (under torch.compile Inductor picks its outputs' strides)."""
    want = spelling(*(t.double() for t in inputs))
    assert len(got) == len(want)
    for i, (g, ref) in enumerate(zip(got, want)):
        assert g.shape == ref.shape and g.dtype == inputs[0].dtype
        if eager_strides:  # the caller may view it
            assert g.stride() == ref.stride(), (i, g.stride(), ref.stride())
        if i == 0 and spelling is not kv_a:
            assert rel_err(g[..., :s1], ref[..., :s1]) <= RTOL
            assert torch.equal(g[..., s1:].double(), ref[..., s1:])
        else:
            assert rel_err(g, ref) <= RTOL


FIRING = [
    (split_cat, S1, SPLIT_CAT_OP),
    (split_even, (S1 + S2) // 2, SPLIT_CAT_OP),
    (slices, S1, SPLIT_CAT_OP),
    (matmul_t, S1, SPLIT_CAT_OP),
    (heads_first, S1, SPLIT_CAT_OP),
    (hf_new_empty, S1, SPLIT_CAT_OP),
    (hf_no_rope, S1, SPLIT_OP),  # nothing to append: the split's pieces, the first the output
    (no_rope_cat, S1, SPLIT_OP),
    (heads_clone, S1, SPLIT_OP),
    (setitem, S1, SPLIT_CAT_OP),
    (three_pieces, S1, SPLIT_CAT_OP),
    (no_heads, S1 * D, SPLIT_CAT_OP),
    (kv_a, 0, SPLIT_OP),
]


@pytest.mark.parametrize("spelling, s1, op", FIRING, ids=lambda v: getattr(v, "__name__", ""))
def test_spelling_fires_and_matches(spelling, s1, op):
    """The Triton kernel (interpreter) behind the fused op, against float64."""
    model, inputs = Spelled(spelling), _inputs(spelling)
    fused = _fuse(model, inputs)
    assert fused.fxfuse_report.counts[NAME] == 1, str(fused.fxfuse_report)
    assert fused_targets(fused) == [op]
    _check_numbers(fused(*inputs), inputs, spelling, s1)


@pytest.mark.parametrize("spelling, s1, op", FIRING, ids=lambda v: getattr(v, "__name__", ""))
def test_reference_path_equals_unfused(spelling, s1, op, reference_path):
    model, inputs = Spelled(spelling), _inputs(spelling)
    fused = _fuse(model, inputs)
    assert fused.fxfuse_report.counts[NAME] == 1
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


def test_fp16_and_the_copy_is_dropped():
    model, inputs = Spelled(kv_a), _inputs(kv_a, torch.float16)
    fused = _fuse(model, inputs)
    assert fused.fxfuse_report.counts[NAME] == 1
    targets = [str(n.target) for n in fused.graph.nodes if n.op == "call_function"]
    assert (
        "aten.contiguous.default" not in targets and "aten.split_with_sizes.default" not in targets
    )
    out, want = fused(*inputs), model(*inputs)
    # The copied piece is the fused op's own; the one read in place keeps the split's view
    # strides (the op lays it out so, and no backend copies it).
    assert out[0].is_contiguous() and not want[1].is_contiguous()
    assert out[1].stride() == want[1].stride()
    (node,) = [n for n in fused.graph.nodes if n.target is torch.ops.fxfuse.gemm_split.default]
    assert node.args[-1] == 1  # view_piece
    _check_numbers(out, inputs, kv_a, 0)


def test_clone_of_a_transposed_piece_is_dropped_and_its_strides_kept(reference_path):
    model, inputs = Spelled(heads_clone), _inputs(heads_clone)
    fused = _fuse(model, inputs)
    targets = [str(n.target) for n in fused.graph.nodes if n.op == "call_function"]
    assert "aten.clone.default" not in targets and SPLIT_OP in targets
    got, want = fused(*inputs), model(*inputs)
    assert got[0].stride() == want[0].stride()
    assert outputs_bytes_equal(got, want)


@pytest.mark.parametrize("spelling", [hf_no_rope, no_rope_cat, heads_clone, kv_a])
def test_split_keeps_the_piece_read_in_place_as_the_graphs_view(spelling, reference_path):
    """gemm_split returns the piece the graph reads in place (the value) as the split's own view,
    never the copied one: the value has the unfused model's strides, so no backend copies a
    piece the graph did not (at small M the op runs the graph's own chain)."""
    model, inputs = Spelled(spelling), _inputs(spelling)
    fused = _fuse(model, inputs)
    (node,) = [n for n in fused.graph.nodes if n.target is torch.ops.fxfuse.gemm_split.default]
    assert node.args[-1] == 1
    got, want = fused(*inputs), model(*inputs)
    assert got[1].stride() == want[1].stride() and not want[1].is_contiguous()
    assert outputs_bytes_equal(got, want)


def test_dynamic_tokens(reference_path):
    model, inputs = Spelled(split_cat), _inputs(split_cat, m=9)
    m = torch.export.Dim("m", min=2, max=64)
    fused = _fuse(model, inputs, dynamic_shapes=({0: m}, None, {0: m}))
    assert fused.fxfuse_report.counts[NAME] == 1
    assert fused_targets(fused) == [SPLIT_CAT_OP]
    for rows in (9, 5, 33):
        x, w, y = _inputs(split_cat, m=rows)
        assert outputs_bytes_equal(fused(x, w, y), model(x, w, y))


def test_dynamic_tokens_kernel_heads_first():
    model, inputs = Spelled(heads_first), _inputs(heads_first, m=5)
    s = torch.export.Dim("s", min=2, max=64)
    fused = _fuse(model, inputs, dynamic_shapes=({1: s}, None, {2: s}))
    assert fused.fxfuse_report.counts[NAME] == 1
    inputs = _inputs(heads_first, m=3)
    _check_numbers(fused(*inputs), inputs, heads_first, S1)


@pytest.mark.parametrize(
    "spelling",
    [split_cat, hf_new_empty, hf_no_rope, no_rope_cat, heads_clone, kv_a],
    ids=lambda f: f.__name__,
)
def test_torch_compile_post_grad_fires(spelling):
    """Inductor's post-grad graph: mm + reshape/permute, and the copies as slice_scatter (with
    no rope part, a whole-buffer copy of the piece under the 0-wide scatter)."""
    model, inputs = Spelled(spelling), _inputs(spelling)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend="fxfuse")(*inputs)
    report = fxfuse.last_report()
    assert report.counts[NAME] == 1, str(report)
    op = SPLIT_OP if spelling in (kv_a, hf_no_rope, no_rope_cat, heads_clone) else SPLIT_CAT_OP
    assert any(r.replacement == op for r in report.rewrites)
    _check_numbers(got, inputs, spelling, 0 if spelling is kv_a else S1, eager_strides=False)


# --- near-misses --------------------------------------------------------------------------------


def _assert_not_fused(body, inputs, reason_fragment):
    model = Spelled(body)
    fused = _fuse(model, inputs)
    report = fused.fxfuse_report
    assert report.counts[NAME] == 0, str(report)
    assert not any("gemm_split" in t for t in fused_targets(fused))
    reasons = " | ".join(r for p, _, r in report.rejected if p == NAME)
    assert reason_fragment in reasons, reasons
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


def _chain(x, w):
    return torch.split(F.linear(x, w).view(x.shape[0], D, S1 + S2), [S1, S2], dim=-1)


def test_split_output_used_elsewhere_does_not_fire(reference_path):
    def body(x, w, y):
        c1, c2 = _chain(x, w)
        return torch.cat([c1, y.expand(-1, D, -1)], -1), c2, c1 * 2

    _assert_not_fused(body, _inputs(split_cat), "other users")


def test_split_on_another_dim_does_not_fire(reference_path):
    def body(x, w, y):
        c = F.linear(x, w).view(x.shape[0], D, S1 + S2)
        c1, c2 = torch.split(c, [1, D - 1], dim=1)
        return torch.cat([c1, y[:, :, :S3]], dim=-1), c2

    _assert_not_fused(body, _inputs(split_cat), "split along dim 1")


def test_cat_on_another_dim_does_not_fire(reference_path):
    def body(x, w, y):
        c1, c2 = _chain(x, w)
        return torch.cat([c1, y.expand(-1, 2, S1)], dim=1), c2

    x, w, _ = _inputs(split_cat)
    _assert_not_fused(body, (x, w, torch.randn(M, 1, 1, dtype=BF16)), "cat along dim 1")


def test_y_before_the_piece_does_not_fire(reference_path):
    def body(x, w, y):
        c1, c2 = _chain(x, w)
        return torch.cat([y.expand(-1, D, -1), c1], -1), c2

    _assert_not_fused(body, _inputs(split_cat), "y comes before")


def test_cat_of_the_second_piece_does_not_fire(reference_path):
    def body(x, w, y):
        c1, c2 = _chain(x, w)
        return torch.cat([c2, y.expand(-1, D, -1)], -1), c1

    _assert_not_fused(body, _inputs(split_cat), "split piece 1")


def test_no_rope_copy_of_the_second_piece_does_not_fire(reference_path):
    def body(x, w, y):  # hf_no_rope with the value piece copied into the buffer
        b, _, s, _ = x.shape
        kv = F.linear(x, w).view(b, s, -1, S1 + S2).transpose(1, 2)
        k_nope, value = torch.split(kv, [S1, S2], dim=-1)
        out = kv.new_empty(*kv.shape[:-1], S2 + y.shape[-1])
        out[..., :S2].copy_(value)
        out[..., S2:].copy_(y.expand(-1, value.shape[1], -1, -1))
        return out, k_nope

    _assert_not_fused(body, _inputs(hf_no_rope), "split piece 1")


def test_copies_that_broadcast_the_piece_do_not_fire(reference_path):
    def body(x, w, y):  # hf_new_empty with a 1 wide piece copied into 4 columns (copy_ broadcasts)
        b, _, s, _ = x.shape
        kv = F.linear(x, w).view(b, s, -1, S1 + S2).transpose(1, 2)
        narrow, rest = torch.split(kv, [1, S1 + S2 - 1], dim=-1)
        key = kv.new_empty(*kv.shape[:-1], 4 + S3)
        key[..., :4].copy_(narrow)
        key[..., 4:].copy_(y.expand(-1, narrow.shape[1], -1, -1))
        return key, rest

    _assert_not_fused(body, _inputs(hf_new_empty), "into 4 columns")


def test_y_computed_from_the_gemm_does_not_fire(reference_path):
    def body(x, w, y):  # DeepSeek q: cat((q_nope, rope(q_pe)))
        c1, c2 = _chain(x, w)
        return (torch.cat([c1, c2[..., :S3] * 2], -1),)

    _assert_not_fused(body, _inputs(split_cat), "computed from the GEMM")


def test_bias_does_not_fire(reference_path):
    class Biased(nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = nn.Parameter(torch.randn(D * (S1 + S2), dtype=BF16))

        def forward(self, x, w, y):
            c = F.linear(x, w, self.bias).view(x.shape[0], D, S1 + S2)
            c1, c2 = torch.split(c, [S1, S2], -1)
            return torch.cat([c1, y.expand(-1, D, -1)], -1), c2

    model, inputs = Biased(), _inputs(split_cat)
    fused = _fuse(model, inputs)
    assert fused.fxfuse_report.counts[NAME] == 0
    assert any("bias" in r for _, _, r in fused.fxfuse_report.rejected)
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


def test_fp32_does_not_fire(reference_path):
    _assert_not_fused(split_cat, _inputs(split_cat, torch.float32), "bf16 / fp16")


def test_split_without_a_copy_does_not_fire(reference_path):
    def body(x, w, y):
        a, b = torch.split(F.linear(x, w), [S1 * D, S2 * D], dim=-1)
        return a * 2, b

    _assert_not_fused(body, _inputs(kv_a), "no copy to save")


def test_contiguous_of_a_transposed_piece_does_not_fire(reference_path):
    def body(x, w, y):  # heads_clone with .contiguous(): a new layout, so the copy stays
        b, s = x.shape[:2]
        c = F.linear(x, w).view(b, s, D, S1 + S2).transpose(1, 2)
        c1, c2 = torch.split(c, [S1, S2], dim=-1)
        return c1.contiguous(), c2

    _assert_not_fused(body, _inputs(heads_clone), "no copy to save")


def test_split_with_a_long_k_does_not_fire(reference_path):
    # kv_a's own K (7168): the unfused GEMM + copies beat the fused op there (the guard's note).
    _, w, y = _inputs(kv_a)
    k = gemm_split_cat.SPLIT_ONLY_MAX_K + 128
    inputs = (torch.randn(M, k, dtype=BF16), torch.randn(w.shape[0], k, dtype=BF16) / k**0.5, y)
    _assert_not_fused(kv_a, inputs, f"K = {k} > {gemm_split_cat.SPLIT_ONLY_MAX_K}")


def test_no_rope_copy_with_a_long_k_does_not_fire(reference_path):
    # the 0-wide y makes hf_no_rope a split (gemm_split): the same K limit
    x, w, y = _inputs(hf_no_rope)
    k = gemm_split_cat.SPLIT_ONLY_MAX_K + 128
    x = torch.randn(*x.shape[:-1], k, dtype=BF16)
    w = torch.randn(w.shape[0], k, dtype=BF16) / k**0.5
    _assert_not_fused(hf_no_rope, (x, w, y), f"K = {k} > {gemm_split_cat.SPLIT_ONLY_MAX_K}")


def test_consumer_needing_the_old_strides_does_not_fire(reference_path):
    def body(x, w, y):  # HF's key, then a view that only its contiguous (B, H, S, ·) layout allows
        key, value = hf_new_empty(x, w, y)
        return key.view(key.shape[0], -1, S1 + S3), value

    _assert_not_fused(body, _inputs(hf_new_empty), "cannot take the fused output's strides")


def test_disable_turns_the_pattern_off(reference_path, monkeypatch):
    model, inputs = Spelled(split_cat), _inputs(split_cat)
    fused = _fuse(model, inputs, config=fxfuse.FusionConfig(disable=(NAME,)))
    assert NAME not in fused.fxfuse_report.counts and not fused_targets(fused)
    monkeypatch.setenv("FXFUSE_DISABLE", NAME)
    fused = _fuse(model, inputs)
    assert not fused_targets(fused)
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


# --- the custom ops -----------------------------------------------------------------------------


def _op_args(dtype=BF16):
    x, w = torch.randn(5, K, dtype=dtype), torch.randn(D * (S1 + S2), K, dtype=dtype)
    return x, w, torch.randn(5, 1, S3, dtype=dtype).expand(5, D, S3)


@pytest.mark.parametrize("path", ["kernel", "reference"])
def test_ops_pass_opcheck(path, monkeypatch):
    if path == "reference":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, w, y = _op_args()
    torch.library.opcheck(torch.ops.fxfuse.gemm_split_cat.default, (x, w, D, S1, S2, y))
    torch.library.opcheck(torch.ops.fxfuse.gemm_split.default, (x, w, D, [S1, 8, S2 - 8]))
    # A piece returned as the split's view (strides of the (M, D, S1 + S2) GEMM output).
    torch.library.opcheck(torch.ops.fxfuse.gemm_split.default, (x, w, D, [S1, 8, S2 - 8], 1))


def test_ops_run_fp32_on_the_reference():
    x, w, y = _op_args(torch.float32)
    out, c2 = torch.ops.fxfuse.gemm_split_cat(x, w, D, S1, S2, y)
    c = (x.double() @ w.double().T).view(5, D, -1)
    assert rel_err(out[..., :S1], c[..., :S1]) <= 1e-5 and rel_err(c2, c[..., S1:]) <= 1e-5
    assert torch.equal(out[..., S1:], y)


@pytest.mark.parametrize(
    "mutate, argument",
    [
        (lambda a: {**a, "x": a["x"][None]}, "x"),
        (lambda a: {**a, "w": a["w"][:-1]}, "w"),
        (lambda a: {**a, "w": a["w"].half()}, "w"),
        (lambda a: {**a, "d": 0}, "d"),
        (lambda a: {**a, "s1": -1}, "s1"),
        (lambda a: {**a, "y": a["y"][:, :1]}, "y"),
        (lambda a: {**a, "y": a["y"].half()}, "y"),
    ],
)
def test_ops_name_the_bad_argument(mutate, argument):
    x, w, y = _op_args()
    a = mutate({"x": x, "w": w, "d": D, "s1": S1, "s2": S2, "y": y})
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        torch.ops.fxfuse.gemm_split_cat(a["x"], a["w"], a["d"], a["s1"], a["s2"], a["y"])
    if argument not in ("s1", "y"):
        with pytest.raises(ValueError, match=rf"^{argument}:"):
            torch.ops.fxfuse.gemm_split(a["x"], a["w"], a["d"], [S1, S2])
    with pytest.raises(ValueError, match=r"^sizes:"):
        torch.ops.fxfuse.gemm_split(x, w, D, [S1, 0, 0, 0, S2])


def test_guard_constants_follow_the_kernel():
    from fxfuse.kernels import gemm_split_cat as kernel

    assert gemm_split_cat_ops.KERNEL_DTYPES == kernel.DTYPES
    assert gemm_split_cat_ops.MAX_PIECES == kernel.MAX_PIECES


# --- quantized producers: FP8 (rowwise, blockscale) and MXFP4 GEMMs -------------------------------
# The GEMM is fxfuse's canonical gemm_fp8 / gemm_mxfp4, whatever the model spelled (_scaled_mm,
# dequantize-then-matmul, fxfuse.ops.gemm_mxfp4; models/quant_linear.py). N and K multiples of 128
# (blockscale), heads D 2 of (64 | 64), y 16 wide.
QD, QS1, QS2, QS3, QK = 2, 64, 64, 16, 128
QUANT_OPS = {
    "fp8_rowwise": "fxfuse.gemm_fp8_split_cat.default",
    "fp8_block": "fxfuse.gemm_fp8_split_cat.default",
    "mxfp4": "fxfuse.gemm_mxfp4_split_cat.default",
}


class QuantSplitCat(nn.Module):
    """[RMSNorm →] quantized linear → view → split → cat with y broadcast over the heads."""

    def __init__(self, quant: str, norm: bool = False, y_dtype=BF16):
        super().__init__()
        from fxfuse.models.quant_linear import QuantLinear

        self.proj = QuantLinear(torch.randn(QD * (QS1 + QS2), QK) / QK**0.5, quant)
        self.norm = norm
        self.y_dtype = y_dtype
        self.register_buffer("norm_w", torch.rand(QK, dtype=BF16) + 0.5)

    def normed(self, x):
        if not self.norm:
            return x
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.norm_w * h.to(x.dtype)

    def forward(self, x, y):
        c = self.proj(self.normed(x)).view(x.shape[0], QD, QS1 + QS2)
        c1, c2 = torch.split(c, [QS1, QS2], dim=-1)
        return torch.cat([c1, y.to(self.y_dtype).expand(-1, QD, -1)], dim=-1), c2


def _quant_inputs(m=7):
    return torch.randn(m, QK, dtype=BF16), torch.randn(m, 1, QS3, dtype=BF16)


def _quantized_ref(model: QuantSplitCat, x: torch.Tensor) -> torch.Tensor:
    """The GEMM in float64 from the same quantized activation and weights, (M, QD, QS1 + QS2)."""
    from fxfuse.kernels import gemm_ref
    from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref, quant_mxfp4_ref

    proj, xn = model.proj, model.normed(x)
    if proj.quant == "mxfp4":
        q, s = quant_mxfp4_ref(xn, "even")
        c = gemm_ref.gemm_mxfp4_ref(q, s, proj.weight, proj.weight_scale, torch.float64)
    else:
        group = 128 if proj.quant == "fp8_block" else 0
        q, s = quant_fp8_ref(xn, group, torch.float8_e4m3fn, 1e-10, False, False)
        w_scale = proj.weight_scale.reshape(-1) if not group else proj.weight_scale
        c = gemm_ref.gemm_fp8_ref(q, s, proj.weight, w_scale, torch.float64)
    return c.view(x.shape[0], QD, QS1 + QS2)


def _check_quantized(model, x, y, got):
    out, c2 = got
    c = _quantized_ref(model, x)
    assert out.shape == (x.shape[0], QD, QS1 + QS3) and out.dtype == BF16
    assert rel_err(out[..., :QS1], c[..., :QS1]) <= RTOL and rel_err(c2, c[..., QS1:]) <= RTOL
    assert torch.equal(out[..., QS1:], y.expand(-1, QD, -1))


@pytest.mark.parametrize("norm", [False, True], ids=["quant", "rmsnorm_quant"])
@pytest.mark.parametrize("quant", list(QUANT_OPS))
def test_quantized_producer_fires_and_matches(quant, norm):
    """The kernel (interpreter): the quantized GEMM writes the pieces; the norm and quant before
    it fuse into one rms_norm_quant (the chain's GEMM is this one)."""
    model, (x, y) = QuantSplitCat(quant, norm), _quant_inputs()
    fused = _fuse(model, (x, y))
    counts = fused.fxfuse_report.counts
    assert counts[NAME] == 1, str(fused.fxfuse_report)
    assert counts["rmsnorm_quant_gemm"] == counts["quant_gemm"] == 0
    assert counts["rmsnorm_quant"] == int(norm)
    targets = fused_targets(fused)
    assert QUANT_OPS[quant] in targets and "fxfuse.gemm_fp8.default" not in targets
    _check_quantized(model, x, y, fused(x, y))


@pytest.mark.parametrize("quant", list(QUANT_OPS))
def test_quantized_reference_path_equals_unfused(quant, reference_path):
    model, inputs = QuantSplitCat(quant, norm=True), _quant_inputs()
    fused = _fuse(model, inputs)
    assert fused.fxfuse_report.counts[NAME] == 1
    assert QUANT_OPS[quant] in fused_targets(fused)
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


def test_quantized_dynamic_tokens():
    """One graph, M from 1 up: the interpreter's kernel at every M."""
    model, inputs = QuantSplitCat("fp8_rowwise", norm=True), _quant_inputs(9)
    m = torch.export.Dim("m", min=1, max=64)
    fused = _fuse(model, inputs, dynamic_shapes=({0: m}, {0: m}))
    assert fused.fxfuse_report.counts[NAME] == 1
    for rows in (1, 4, 33):
        x, y = _quant_inputs(rows)
        _check_quantized(model, x, y, fused(x, y))


def test_quantized_disabled_leaves_the_chain_fusion(reference_path):
    """Without gemm_split_cat the chain ends in the GEMM as before: rmsnorm_quant_gemm."""
    model, inputs = QuantSplitCat("fp8_rowwise", norm=True), _quant_inputs()
    fused = _fuse(model, inputs, config=fxfuse.FusionConfig(disable=(NAME,)))
    assert fused.fxfuse_report.counts["rmsnorm_quant_gemm"] == 1
    assert not any("split" in t for t in fused_targets(fused))
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


def test_quantized_y_of_another_dtype_does_not_fire(reference_path):
    """cat promotes a bf16 GEMM piece and an fp32 y to fp32: the pieces' dtypes differ."""
    model, inputs = QuantSplitCat("fp8_rowwise", y_dtype=torch.float32), _quant_inputs()
    fused = _fuse(model, inputs)
    assert fused.fxfuse_report.counts[NAME] == 0
    reasons = " | ".join(r for p, _, r in fused.fxfuse_report.rejected if p == NAME)
    assert "differ in dtype" in reasons, reasons
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


@pytest.mark.parametrize("quant", list(QUANT_OPS))
def test_quantized_torch_compile_post_grad_fires(quant):
    model, (x, y) = QuantSplitCat(quant, norm=True), _quant_inputs()
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend="fxfuse")(x, y)
    report = fxfuse.last_report()
    assert report.counts[NAME] == 1, str(report)
    assert any(r.replacement == QUANT_OPS[quant] for r in report.rewrites)
    _check_quantized(model, x, y, got)


def _quantized_op_args(kind):
    from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref, quant_mxfp4_ref

    x, w = torch.randn(5, QK), torch.randn(QD * (QS1 + QS2), QK)
    y = torch.randn(5, 1, QS3, dtype=BF16).expand(5, QD, QS3)
    if kind == "mxfp4":
        return (*quant_mxfp4_ref(x, "even"), *quant_mxfp4_ref(w, "even")), y
    q, s = quant_fp8_ref(x, 0, torch.float8_e4m3fn, 1e-10, False, False)
    wq, ws = quant_fp8_ref(w, 0, torch.float8_e4m3fn, 1e-10, False, False)
    return (q, s, wq, ws.view(-1)), y


@pytest.mark.parametrize("path", ["kernel", "reference"])
@pytest.mark.parametrize("kind", ["fp8", "mxfp4"])
def test_quantized_ops_pass_opcheck(kind, path, monkeypatch):
    if path == "reference":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    gemm, y = _quantized_op_args(kind)
    # test_schema compares FP8 inputs with a multiply torch's CPU backend lacks for float8.
    utils = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    ops = torch.ops.fxfuse
    split_cat, split = (
        (ops.gemm_fp8_split_cat, ops.gemm_fp8_split)
        if kind == "fp8"
        else (ops.gemm_mxfp4_split_cat, ops.gemm_mxfp4_split)
    )
    torch.library.opcheck(split_cat.default, (*gemm, BF16, QD, QS1, QS2, y), test_utils=utils)
    torch.library.opcheck(split.default, (*gemm, BF16, QD, [QS1, 8, QS2 - 8]), test_utils=utils)
    three = (*gemm, BF16, QD, [QS1, 8, QS2 - 8], 2)
    torch.library.opcheck(split.default, three, test_utils=utils)
    out, c2 = split_cat(*gemm, BF16, QD, QS1, QS2, y)
    pieces = split(*gemm, BF16, QD, [QS1, QS2])
    assert torch.equal(out[..., :QS1], pieces[0]) and torch.equal(c2, pieces[1])
    assert torch.equal(out[..., QS1:], y)
    # The view piece: c2's layout (the split's view), the same bytes; the others contiguous.
    viewed = split(*gemm, BF16, QD, [QS1, QS2], 1)
    assert viewed[0].is_contiguous() and viewed[1].stride() == c2.stride()
    assert torch.equal(viewed[0], pieces[0]) and torch.equal(viewed[1], pieces[1])


@pytest.mark.parametrize(
    "change, argument",
    [({"out_dtype": torch.float16}, "y"), ({"d": 3}, "w"), ({"s2": -1}, "s2"), ({"d": 0}, "d")],
)
@pytest.mark.parametrize("kind", ["fp8", "mxfp4"])
def test_quantized_ops_name_the_bad_argument(kind, change, argument):
    gemm, y = _quantized_op_args(kind)
    a = {"out_dtype": BF16, "d": QD, "s1": QS1, "s2": QS2, **change}
    op = (
        torch.ops.fxfuse.gemm_fp8_split_cat
        if kind == "fp8"
        else torch.ops.fxfuse.gemm_mxfp4_split_cat
    )
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        op(*gemm, a["out_dtype"], a["d"], a["s1"], a["s2"], y)


class QuantSplit(nn.Module):
    """kv_a's spelling on a quantized linear: GEMM → split, each piece copied (contiguous)."""

    def __init__(self, quant: str):
        super().__init__()
        from fxfuse.models.quant_linear import QuantLinear

        self.proj = QuantLinear(torch.randn(QD * (QS1 + QS2), QK) / QK**0.5, quant)

    def normed(self, x):  # what _quantized_ref quantizes: x itself
        return x

    def forward(self, x):
        a, b = torch.split(self.proj(x), [192, 64], dim=-1)
        return a.contiguous(), b.contiguous()


@pytest.mark.parametrize("quant", list(QUANT_OPS))
def test_quantized_split_without_cat_fires(quant):
    model, x = QuantSplit(quant), _quant_inputs()[0]
    fused = _fuse(model, (x,))
    assert fused.fxfuse_report.counts[NAME] == 1, str(fused.fxfuse_report)
    op = QUANT_OPS[quant].replace("_split_cat", "_split")
    assert op in fused_targets(fused)
    c = _quantized_ref(model, x).view(x.shape[0], -1)  # float64, same quantized operands
    got = fused(x)
    assert all(g.is_contiguous() for g in got)
    assert rel_err(got[0], c[:, :192]) <= RTOL and rel_err(got[1], c[:, 192:]) <= RTOL


# Kimi-Linear's width class (N above 5120) at small K: the sm90 backend table runs the unfused
# chain there up to M 128 (the kernel measured 0.85× Inductor's compile of the chain).
WIDE_D, WIDE_S, WIDE_K, WIDE_S3 = 41, 64, 32, 16


def _wide_split_cat(x, w, y):
    c = F.linear(x, w).view(x.shape[0], WIDE_D, 2 * WIDE_S)
    c1, c2 = torch.split(c, [WIDE_S, WIDE_S], dim=-1)
    return torch.cat([c1, y.expand(-1, WIDE_D, -1)], dim=-1), c2


def _wide_inputs(m):
    w = torch.randn(WIDE_D * 2 * WIDE_S, WIDE_K, dtype=BF16) / WIDE_K**0.5
    return torch.randn(m, WIDE_K, dtype=BF16), w, torch.randn(m, 1, WIDE_S3, dtype=BF16)


def test_static_m_where_the_table_runs_the_chain_stays_unfused(reference_path):
    """A static M the sm90 table gives to the unfused chain: no rewrite, the reason says why;
    the same graph for the CPU target, or above M 128, fuses."""
    model, inputs = Spelled(_wide_split_cat), _wide_inputs(4)
    sm90 = fxfuse.FusionConfig(target="sm90")
    fused = _fuse(model, inputs, config=sm90)
    assert fused.fxfuse_report.counts[NAME] == 0 and fused_targets(fused) == []
    reasons = " | ".join(r for p, _, r in fused.fxfuse_report.rejected if p == NAME)
    assert "M = 4 (N 5248, K 32)" in reasons and "runs the unfused chain" in reasons, reasons
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))
    cpu = _fuse(model, inputs, config=fxfuse.FusionConfig(target="cpu"))
    assert cpu.fxfuse_report.counts[NAME] == 1 and fused_targets(cpu) == [SPLIT_CAT_OP]
    wider = _wide_inputs(129)
    above = _fuse(model, wider, config=sm90)
    assert above.fxfuse_report.counts[NAME] == 1 and fused_targets(above) == [SPLIT_CAT_OP]
    assert outputs_bytes_equal(above(*wider), model(*wider))


def test_dynamic_m_fuses_where_the_table_may_run_the_chain(reference_path):
    """With M known only at run time the rewrite happens: the op picks per call."""
    model, inputs = Spelled(_wide_split_cat), _wide_inputs(4)
    m = torch.export.Dim("m", min=2, max=512)
    sm90 = fxfuse.FusionConfig(target="sm90")
    fused = _fuse(model, inputs, config=sm90, dynamic_shapes=({0: m}, None, {0: m}))
    assert fused.fxfuse_report.counts[NAME] == 1 and fused_targets(fused) == [SPLIT_CAT_OP]
    for rows in (4, 200):
        x, w, y = _wide_inputs(rows)
        assert outputs_bytes_equal(fused(x, w, y), model(x, w, y))


def test_static_m_split_only_under_the_split_table_stays_unfused(reference_path):
    """gemm_split's sm90 table runs the unfused chain up to M 2048: a static kv_a-like split
    there is left alone on sm90 (and fuses for the CPU target)."""
    model, inputs = Spelled(kv_a), _inputs(kv_a)
    fused = _fuse(model, inputs, config=fxfuse.FusionConfig(target="sm90"))
    assert fused.fxfuse_report.counts[NAME] == 0
    reasons = " | ".join(r for p, _, r in fused.fxfuse_report.rejected if p == NAME)
    assert "split backend table runs the unfused chain" in reasons, reasons
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))
    cpu = _fuse(model, inputs, config=fxfuse.FusionConfig(target="cpu"))
    assert cpu.fxfuse_report.counts[NAME] == 1
