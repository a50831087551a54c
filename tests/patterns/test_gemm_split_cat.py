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


def hf_new_empty(x, w, y):  # HF DeepSeek-V3 expand_kv: new_empty + slice copy_
    b, _, s, _ = x.shape
    kv = F.linear(x, w).view(b, s, -1, S1 + S2).transpose(1, 2)
    k_nope, value = torch.split(kv, [S1, S2], dim=-1)
    k_rot = y.expand(-1, k_nope.shape[1], -1, -1)
    key = kv.new_empty(*kv.shape[:-1], S1 + S3)
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
    if spelling in (hf_new_empty,):
        return torch.randn(2, 1, m, K, dtype=dtype), w, torch.randn(2, 1, m, S3, dtype=dtype)
    if spelling is heads_first:
        return torch.randn(2, m, K, dtype=dtype), w, torch.randn(2, 1, m, S3, dtype=dtype)
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


def _check_numbers(got, inputs, spelling, s1):
    """GEMM parts ≤ RTOL against the spelling in float64; y's slice exact."""
    want = spelling(*(t.double() for t in inputs))
    assert len(got) == len(want)
    for i, (g, ref) in enumerate(zip(got, want)):
        assert g.shape == ref.shape and g.dtype == inputs[0].dtype
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
    out = fused(*inputs)
    assert all(t.is_contiguous() for t in out)
    _check_numbers(out, inputs, kv_a, 0)


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


@pytest.mark.parametrize("spelling", [split_cat, hf_new_empty, kv_a], ids=lambda f: f.__name__)
def test_torch_compile_post_grad_fires(spelling):
    """Inductor's post-grad graph: mm + reshape/permute, and the copies as slice_scatter."""
    model, inputs = Spelled(spelling), _inputs(spelling)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend="fxfuse")(*inputs)
    report = fxfuse.last_report()
    assert report.counts[NAME] == 1, str(report)
    op = SPLIT_OP if spelling is kv_a else SPLIT_CAT_OP
    assert any(r.replacement == op for r in report.rewrites)
    _check_numbers(got, inputs, spelling, 0 if spelling is kv_a else S1)


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


def test_split_with_a_long_k_does_not_fire(reference_path):
    # kv_a's own K (7168): the unfused GEMM + copies beat the fused op there (the guard's note).
    _, w, y = _inputs(kv_a)
    k = gemm_split_cat.SPLIT_ONLY_MAX_K + 128
    inputs = (torch.randn(M, k, dtype=BF16), torch.randn(w.shape[0], k, dtype=BF16) / k**0.5, y)
    _assert_not_fused(kv_a, inputs, f"K = {k} > {gemm_split_cat.SPLIT_ONLY_MAX_K}")


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
