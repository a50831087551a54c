"""Pattern `rmsnorm_quant`: each spelling fires and gives the unfused bytes; near-misses don't."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fxfuse
from tests.helpers import fused_targets, outputs_bytes_equal

FP8 = torch.float8_e4m3fn
N = 256


# --- norm spellings (each takes h, w and returns y) ---------------------------------------------


def llama(h, w, eps=1e-6):
    hf = h.to(torch.float32)
    var = hf.pow(2).mean(-1, keepdim=True)
    return w * (hf * torch.rsqrt(var + eps)).to(h.dtype)


def mul_then_cast(h, w, eps=1e-6):
    hf = h.float()
    return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(h.dtype)


def gemma(h, w, eps=1e-6):
    hf = h.float()
    normed = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (1.0 + w.float())).type_as(h)


def functional(h, w, eps=1e-6):
    return F.rms_norm(h, (h.shape[-1],), w, eps)


def x_times_x(h, w, eps=1e-6):
    hf = h.float()
    return w * (hf * torch.rsqrt((hf * hf).mean(-1, keepdim=True) + eps)).to(h.dtype)


def reciprocal_sqrt(h, w, eps=1e-6):
    hf = h.float()
    return w * (hf * (1 / torch.sqrt(hf.pow(2).mean(-1, keepdim=True) + eps))).to(h.dtype)


def sum_over_n(h, w, eps=1e-6):
    hf = h.float()
    var = hf.pow(2).sum(-1, keepdim=True) / h.shape[-1]
    return w * (hf * torch.rsqrt(var + eps)).to(h.dtype)


def square(h, w, eps=1e-6):
    hf = h.float()
    return w * (hf * torch.rsqrt(hf.square().mean(-1, keepdim=True) + eps)).to(h.dtype)


def t5(h, w, eps=1e-6):
    """T5 / older HF: the variance from an fp32 cast, h itself times rsqrt (promoted to fp32),
    cast to the weight's dtype."""
    variance = h.to(torch.float32).pow(2).mean(-1, keepdim=True)
    hs = h * torch.rsqrt(variance + eps)
    if w.dtype in [torch.float16, torch.bfloat16]:
        hs = hs.to(w.dtype)
    return w * hs


def fxfuse_op(h, w, eps=1e-6):
    return fxfuse.ops.rms_norm(h, w, eps)


NORMS = [
    llama, mul_then_cast, gemma, functional, x_times_x, reciprocal_sqrt, sum_over_n, square, t5,
    fxfuse_op,
]  # fmt: skip


# --- quant spellings (each takes y and returns q, scale) ----------------------------------------


def per_token_div(y, eps=1e-10):
    amax = y.abs().amax(dim=-1, keepdim=True).float().clamp(min=eps)
    scale = amax / 448.0
    return (y.float() / scale).clamp(-448.0, 448.0).to(FP8), scale


def per_token_reciprocal(y, eps=1e-12):
    amax = y.float().abs().max(dim=-1, keepdim=True)[0]
    scale = (amax / 448.0).clamp(min=eps)
    q = y.float() * (1.0 / scale)
    return q.clamp(min=-448.0, max=448.0).to(FP8), scale


def group_128(y, eps=1e-10):
    m, k = y.shape[0], y.shape[-1]
    yg = y.float().view(m, k // 128, 128)
    scale = yg.abs().amax(dim=-1, keepdim=True).clamp(min=eps) / 448.0
    q = (yg / scale).clamp(-448.0, 448.0).to(FP8)
    return q.view(m, k), scale.squeeze(-1)


def vllm_per_token(y, eps=1e-12):
    """vLLM's torch spelling: max(...).values, clamp, multiply by scale.reciprocal()."""
    x_max = y.abs().max(dim=-1, keepdim=True).values.float().clamp(min=eps)
    scale = x_max / 448.0
    return (y.float() * scale.reciprocal()).clamp(-448.0, 448.0).to(FP8), scale


def group_unflatten(y, eps=1e-10):
    """1×128 groups by unflatten / flatten instead of view."""
    yg = y.float().unflatten(-1, (-1, 128))
    scale = yg.abs().amax(dim=-1, keepdim=True).clamp_min(eps) / 448.0
    q = (yg / scale).clamp(-448.0, 448.0).to(FP8)
    return q.flatten(-2), scale.squeeze(-1)


def fxfuse_quant_fp8(y):
    return fxfuse.ops.quant_fp8(y)


def fxfuse_quant_group(y):
    return fxfuse.ops.quant_fp8(y, group_size=128)


def mxfp4(rounding):
    def quant(y):
        return fxfuse.ops.quant_mxfp4(y, rounding=rounding)

    quant.__name__ = f"mxfp4_{rounding}"
    return quant


QUANTS = [per_token_div, per_token_reciprocal, vllm_per_token, group_128, group_unflatten]
QUANTS += [fxfuse_quant_fp8, fxfuse_quant_group]
QUANTS += [mxfp4(r) for r in ("floor", "even", "ceil")]


class Chain(nn.Module):
    def __init__(self, norm, quant, residual: bool, n: int = N):
        super().__init__()
        self.norm, self.quant, self.residual = norm, quant, residual
        self.weight = nn.Parameter((1 + 0.1 * torch.randn(n)).to(torch.bfloat16))

    def forward(self, x, r):
        h = x + r if self.residual else x
        q, scale = self.quant(self.norm(h, self.weight))
        return (q, scale, h) if self.residual else (q, scale)


def _inputs(m=8, n=N, dtype=torch.bfloat16):
    return torch.randn(m, n).mul(3).to(dtype), torch.randn(m, n).to(dtype)


def _fuse(model, inputs, **kw):
    with torch.no_grad():
        return fxfuse.apply_fusions(model, inputs, **kw)


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("quant", QUANTS, ids=lambda q: q.__name__)
@pytest.mark.parametrize("norm", NORMS, ids=lambda f: f.__name__)
def test_spelling_fires_and_matches_bytes(norm, quant, residual, reference_path):
    model = Chain(norm, quant, residual)
    inputs = _inputs()
    fused = _fuse(model, inputs)
    assert fused.fxfuse_report.counts["rmsnorm_quant"] == 1, str(fused.fxfuse_report)
    op = "fxfuse.add_rms_norm_quant.default" if residual else "fxfuse.rms_norm_quant.default"
    assert op in fused_targets(fused)
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


@pytest.mark.parametrize("quant", [per_token_div, group_128, mxfp4("even")], ids=lambda q: q.__name__)
def test_fused_kernel_in_interpreter_matches(quant):
    """The Triton kernel itself (TRITON_INTERPRET=1) against the unfused spelling. The kernel
    computes 1 / sqrt in correctly rounded steps, so the `1/sqrt` spelling matches bit for bit."""
    model = Chain(reciprocal_sqrt, quant, residual=True)
    inputs = _inputs(m=4)
    fused = _fuse(model, inputs)
    assert fused.fxfuse_report.counts["rmsnorm_quant"] == 1
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


def test_duplicate_quants_of_one_norm_fuse_once(reference_path):
    class QKV(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(N, dtype=torch.bfloat16))

        def forward(self, x):
            y = llama(x, self.weight)
            return per_token_div(y), per_token_div(y), per_token_div(y)

    model, inputs = QKV(), _inputs()[:1]
    fused = _fuse(model, inputs)
    assert fused.fxfuse_report.counts["rmsnorm_quant"] == 1
    assert fused_targets(fused).count("fxfuse.rms_norm_quant.default") == 1
    assert outputs_bytes_equal(sum(fused(*inputs), ()), sum(model(*inputs), ()))


def test_leading_dims_and_reshape_before_quant(reference_path):
    class Flatten(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(N, dtype=torch.bfloat16))

        def forward(self, x, r):
            h = x + r
            y = llama(h, self.weight).reshape(-1, N)
            return (*per_token_div(y), h)

    model = Flatten()
    inputs = tuple(t.view(2, 4, N) for t in _inputs())
    fused = _fuse(model, inputs)
    assert fused.fxfuse_report.counts["rmsnorm_quant"] == 1
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


# --- near-misses --------------------------------------------------------------------------------


def _assert_not_fused(model, inputs, reason_fragment):
    fused = _fuse(model, inputs)
    report = fused.fxfuse_report
    assert report.counts["rmsnorm_quant"] == 0, str(report)
    assert not any("rms_norm_quant" in t for t in fused_targets(fused))
    reasons = " | ".join(r for _, _, r in report.rejected)
    assert reason_fragment in reasons, reasons
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


class NearMiss(nn.Module):
    def __init__(self, body, weight_shape=(N,)):
        super().__init__()
        self.body = body
        self.weight = nn.Parameter(torch.ones(weight_shape, dtype=torch.bfloat16))

    def forward(self, x):
        return self.body(x, self.weight)


def test_mean_over_another_dim_does_not_fire(reference_path):
    def body(x, w):
        hf = x.float()
        y = w * (hf * torch.rsqrt(hf.pow(2).mean(0, keepdim=True) + 1e-6)).to(x.dtype)
        return per_token_div(y)

    _assert_not_fused(NearMiss(body), _inputs(m=N)[:1], "not the last dim")


def test_weight_not_per_column_does_not_fire(reference_path):
    _assert_not_fused(
        NearMiss(lambda x, w: per_token_div(llama(x, w)), (8, N)), _inputs()[:1], "per-column"
    )


def test_rows_view_read_elsewhere_fuses_with_the_norm_kept(reference_path):
    """The flattened rows the quant reads are read elsewhere too (ERNIE 4.5 / HunYuan MoE: the
    router and the experts' gather read them): those readers take the fused y, viewed so."""

    def body(x, w):
        y = llama(x, w).reshape(-1, N)
        return (*per_token_div(y), y * 2, y[[0, 3]])

    model, inputs = NearMiss(body), (_inputs()[0].view(2, 4, N),)
    fused = _fuse(model, inputs)
    assert fused.fxfuse_report.counts["rmsnorm_quant"] == 1, str(fused.fxfuse_report)
    assert "fxfuse.rms_norm_quant_with_norm.default" in fused_targets(fused)
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


def test_both_y_and_its_rows_view_read_elsewhere(reference_path):
    def body(x, w):
        y = llama(x, w)
        rows = y.reshape(-1, N)
        return (*per_token_div(rows), y.sum(-1), rows * 2)

    model, inputs = NearMiss(body), (_inputs()[0].view(2, 4, N),)
    fused = _fuse(model, inputs)
    assert fused.fxfuse_report.counts["rmsnorm_quant"] == 1, str(fused.fxfuse_report)
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


def test_normed_output_read_elsewhere_and_one_gemm_fuses_into_the_gemm_chain(reference_path):
    """y read elsewhere and the quant's only reader one GEMM: the norm and quant fuse with y kept,
    then rmsnorm_quant_gemm takes that op and the GEMM (its y kept too), not quant_gemm."""
    w_fp8 = torch.randn(64, N).to(FP8)
    w_scale = torch.rand(64, dtype=torch.float32) + 0.5

    def body(x, w):
        y = llama(x, w)
        q, s = per_token_div(y)
        return fxfuse.ops.gemm_fp8(q, s, w_fp8, w_scale, torch.bfloat16), y * 2

    model, inputs = NearMiss(body), _inputs()[:1]
    fused = _fuse(model, inputs)
    counts = fused.fxfuse_report.counts
    assert counts["rmsnorm_quant"] == 1 and counts["rmsnorm_quant_gemm"] == 1, str(counts)
    assert counts["quant_gemm"] == 0, str(counts)
    assert fused_targets(fused) == ["fxfuse.rms_norm_quant_gemm_with_norm.default"]
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


def test_normed_output_read_elsewhere_and_a_gemm_quant_gemm_refuses_fuses_here(reference_path):
    """The same with column-major 1×128 scales, which quant_gemm's prequant path refuses: the
    norm and quant fuse here (y kept), the GEMM reads their q and scale."""
    w_fp8 = torch.randn(64, N).to(FP8)
    w_scale = torch.rand(64 // 128 + 1, N // 128, dtype=torch.float32) + 0.5

    def body(x, w):
        y = llama(x, w)
        q, s = torch.ops.fxfuse.quant_fp8(y, 128, FP8, 1e-10, False, False, True)
        return fxfuse.ops.gemm_fp8(q, s, w_fp8, w_scale, torch.bfloat16), y * 2

    model, inputs = NearMiss(body), _inputs()[:1]
    fused = _fuse(model, inputs)
    report = fused.fxfuse_report
    assert report.counts["rmsnorm_quant"] == 1 and report.counts["quant_gemm"] == 0, str(report)
    assert "fxfuse.rms_norm_quant_with_norm.default" in fused_targets(fused)
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


# --- the normed value read elsewhere too (an MoE router beside its quantized experts) -----------


class RouterAndExperts(nn.Module):
    """The MoE input: the router reads y (in fp32), the experts its quant (returned here, as
    several GEMMs would read it)."""

    def __init__(self, quant, residual: bool):
        super().__init__()
        self.quant, self.residual = quant, residual
        self.weight = nn.Parameter((1 + 0.1 * torch.randn(N)).to(torch.bfloat16))
        self.router = nn.Parameter(torch.randn(8, N).to(torch.bfloat16))

    def forward(self, x, r):
        h = x + r if self.residual else x
        y = llama(h, self.weight)
        logits = F.linear(y.float(), self.router.float())
        q, scale = self.quant(y)
        return (q, scale, logits, h) if self.residual else (q, scale, logits)


WITH_NORM_QUANTS = [per_token_div, group_128, mxfp4("even")]


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("quant", WITH_NORM_QUANTS, ids=lambda q: q.__name__)
def test_normed_output_read_elsewhere_fuses_with_the_norm_kept(quant, residual, reference_path):
    model, inputs = RouterAndExperts(quant, residual), _inputs()
    fused = _fuse(model, inputs)
    assert fused.fxfuse_report.counts["rmsnorm_quant"] == 1, str(fused.fxfuse_report)
    targets = fused_targets(fused)
    op = "add_rms_norm_quant_with_norm" if residual else "rms_norm_quant_with_norm"
    assert f"fxfuse.{op}.default" in targets, targets
    # No norm is left: the router reads the fused op's y.
    assert not any(t.startswith(("fxfuse.rms_norm.", "fxfuse.add_rms_norm.")) for t in targets)
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


@pytest.mark.parametrize("quant", WITH_NORM_QUANTS, ids=lambda q: q.__name__)
def test_normed_output_read_elsewhere_in_interpreter_matches(quant):
    """The kernel writing y beside q and scale (TRITON_INTERPRET=1) against the unfused
    spelling."""
    model, inputs = RouterAndExperts(quant, residual=True), _inputs(m=4)
    fused = _fuse(model, inputs)
    assert "fxfuse.add_rms_norm_quant_with_norm.default" in fused_targets(fused)
    got, want = fused(*inputs), model(*inputs)
    assert outputs_bytes_equal(got[:2] + got[3:], want[:2] + want[3:])
    # The router's fp32 GEMM over y: y itself is the same bytes (the kernel's 1 / sqrt against the
    # spelled rsqrt may differ by an ulp, SPEC §5), so the logits agree to fp32 rounding.
    torch.testing.assert_close(got[2], want[2], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_normed_output_read_elsewhere_fuses_under_torch_compile(residual, reference_path):
    """Inductor's post-grad graph: the same rewrite, the same bytes (the router's fp32 GEMM too:
    on the reference path y is the spelled norm's bytes)."""
    model, inputs = RouterAndExperts(per_token_div, residual), _inputs()
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend="fxfuse")(*inputs)
    report = fxfuse.last_report()
    op = "add_rms_norm_quant_with_norm" if residual else "rms_norm_quant_with_norm"
    assert [r.replacement for r in report.rewrites] == [f"fxfuse.{op}.default"], str(report)
    assert outputs_bytes_equal(got, model(*inputs))


class EpsArgument(nn.Module):
    """The norm's eps passed in as a Python float (a function argument, not a module constant)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter((1 + 0.1 * torch.randn(N)).to(torch.bfloat16))

    def forward(self, x, eps: float):
        return per_token_div(llama(x, self.weight, eps))


def test_torch_compile_dynamic_true_says_why_an_eps_argument_stays(reference_path):
    """dynamic=True passes a Python float argument (the norm's eps) as a graph input: the norm
    cannot be read, and the report says so and what to do; with floats specialized it fuses."""
    model, (x, _) = EpsArgument(), _inputs()
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend="fxfuse", dynamic=True)(x, 1e-6)  # Inductor's own numbers
    report = fxfuse.last_report()
    assert report.counts["rmsnorm_quant"] == 0, str(report)
    reasons = [why for name, _, why in report.rejected if name == "rmsnorm_quant"]
    assert any(why.startswith("eps is the graph input") and "specialize_float" in why
               for why in reasons), reasons
    torch._dynamo.reset()
    # config.patch, not monkeypatch: undoing a monkeypatch of this flag deletes it in torch 2.11
    with torch.no_grad(), torch._dynamo.config.patch(specialize_float=True):
        got = torch.compile(model, backend="fxfuse", dynamic=True)(x, 1e-6)
    assert fxfuse.last_report().counts["rmsnorm_quant"] == 1, str(fxfuse.last_report())
    assert outputs_bytes_equal(got, model(x, 1e-6))


def test_eps_that_is_a_tensor_does_not_fire(reference_path):
    def norm(h, w):
        return llama(h, w, torch.full((1,), 1e-6))

    _assert_not_fused(Chain(norm, per_token_div, False), _inputs(), "eps is the graph value")


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_with_norm_ops_pass_opcheck(residual):
    x, r = _inputs(m=4)
    w = torch.ones(N, dtype=torch.bfloat16)
    norm = (1e-6, 0.0, True, None, False)
    quant = ("fp8", 0, FP8, 1e-10, False, False, False, "even")
    ops = torch.ops.fxfuse
    if residual:
        op, args = ops.add_rms_norm_quant_with_norm, (x, r, w, *norm, *quant)
        plain = ops.add_rms_norm_quant(*args)
    else:
        op, args = ops.rms_norm_quant_with_norm, (x, w, *norm, *quant)
        plain = ops.rms_norm_quant(*args)
    # test_schema compares outputs with a multiply torch's CPU backend lacks for float8.
    utils = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    torch.library.opcheck(op.default, args, test_utils=utils)
    got = op(*args)
    h = x + r if residual else x
    want_y = ops.rms_norm(h, w, *norm)
    assert outputs_bytes_equal(tuple(got[: len(plain)]), tuple(plain))
    assert outputs_bytes_equal((got[-1],), (want_y,))


def test_wrong_fp8_max_literal_does_not_fire(reference_path):
    def body(x, w):
        y = llama(x, w)
        scale = y.abs().amax(-1, keepdim=True).float().clamp(min=1e-10) / 400.0
        return (y.float() / scale).clamp(-448.0, 448.0).to(FP8), scale

    _assert_not_fused(NearMiss(body), _inputs()[:1], "not torch.float8_e4m3fn's max")


def test_wrong_clamp_bounds_do_not_fire(reference_path):
    def body(x, w):
        y = llama(x, w)
        scale = y.abs().amax(-1, keepdim=True).float().clamp(min=1e-10) / 448.0
        return (y.float() / scale).clamp(-240.0, 240.0).to(FP8), scale

    _assert_not_fused(NearMiss(body), _inputs()[:1], "clamp to")


@pytest.mark.parametrize("bound", ["amax", "scale"])
def test_amax_clamp_with_an_upper_bound_does_not_fire(bound, reference_path):
    """The quant's clamp also caps the amax (or scale) from above: the kernel's scale has no
    such cap, and the pattern, which names only clamp's lower bound, must see the upper one."""

    def body(x, w):
        y = llama(x, w)
        amax = y.abs().amax(-1, keepdim=True).float()
        if bound == "amax":
            scale = amax.clamp(min=1e-10, max=1.0) / 448.0
        else:
            scale = (amax / 448.0).clamp(1e-10, 1e-3)
        return (y.float() / scale).clamp(-448.0, 448.0).to(FP8), scale

    model, inputs = NearMiss(body), _inputs()[:1]
    fused = _fuse(model, inputs)
    assert fused.fxfuse_report.counts["rmsnorm_quant"] == 0, str(fused.fxfuse_report)
    assert not any("quant" in t for t in fused_targets(fused))
    got, want = fused(*inputs), model(*inputs)
    assert want[1].max() < inputs[0].abs().amax(-1).min() / 448.0  # the cap binds
    assert outputs_bytes_equal(got, want)


def test_adds_with_alpha_are_not_the_norms_adds(reference_path):
    """`var + eps` written with alpha 2 is no RMSNorm; a residual add with alpha 2 stays outside
    the fused op (the norm of its sum still fuses, without the residual)."""

    def eps_alpha(x, w):
        hf = x.float()
        var = torch.add(hf.pow(2).mean(-1, keepdim=True), 1e-6, alpha=2)
        return per_token_div(w * (hf * torch.rsqrt(var)).to(x.dtype))

    def residual_alpha(x, w):
        return per_token_div(llama(torch.add(x, x.flip(0), alpha=2), w))

    for body, fused_op in ((eps_alpha, None), (residual_alpha, "fxfuse.rms_norm_quant.default")):
        model, inputs = NearMiss(body), _inputs()[:1]
        fused = _fuse(model, inputs)
        targets = fused_targets(fused)
        assert fused.fxfuse_report.counts["rmsnorm_quant"] == int(fused_op is not None), targets
        assert not any("add_rms_norm" in t for t in targets), targets
        assert fused_op is None or fused_op in targets, targets
        assert outputs_bytes_equal(fused(*inputs), model(*inputs))


def test_statistics_not_in_fp32_do_not_fire(reference_path):
    def body(x, w):  # mean(x²) in fp16: a different number, not our kernel's
        h = x.to(torch.float16)
        return per_token_div(w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)))

    fused = _fuse(NearMiss(body), _inputs()[:1])
    assert fused.fxfuse_report.counts["rmsnorm_quant"] == 0


def test_group_size_the_kernel_lacks_does_not_fire(reference_path):
    def body(x, w):
        y = llama(x, w)
        yg = y.float().view(8, N // 16, 16)
        scale = yg.abs().amax(-1, keepdim=True).clamp(min=1e-10) / 448.0
        return (yg / scale).clamp(-448.0, 448.0).to(FP8).view(8, N), scale

    _assert_not_fused(NearMiss(body), _inputs()[:1], "group size 16")


def test_disable_turns_the_pattern_off(reference_path, monkeypatch):
    model, inputs = Chain(llama, per_token_div, True), _inputs()
    fused = _fuse(model, inputs, config=fxfuse.FusionConfig(disable=("rmsnorm_quant",)))
    assert "rmsnorm_quant" not in fused.fxfuse_report.counts
    assert not any("rms_norm_quant" in t for t in fused_targets(fused))
    monkeypatch.setenv("FXFUSE_DISABLE", "rmsnorm_quant")
    fused = _fuse(model, inputs)
    assert not any("rms_norm_quant" in t for t in fused_targets(fused))
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


class _GroupQuantOnly(nn.Module):
    """A 1×128 quant spelled in torch over any leading dims (no norm before it)."""

    def forward(self, x):
        y = x * 2
        yg = y.float().view(*y.shape[:-1], y.shape[-1] // 128, 128)
        scale = yg.abs().amax(dim=-1, keepdim=True).clamp(min=1e-10) / 448.0
        q = (yg / scale).clamp(-448.0, 448.0).to(FP8)
        return q.view(y.shape), scale.squeeze(-1)


@pytest.mark.parametrize("dims", [1, 2], ids=["dynamic-rows", "dynamic-batch-and-seq"])
def test_group_quant_with_symbolic_leading_dims(reference_path, dims):
    """The canonical quant views q and scale back with the graph's sizes (sym_size where symbolic),
    so one dynamic capture runs at other sizes with the unfused bytes."""
    model = _GroupQuantOnly()
    if dims == 1:
        x = torch.randn(8, 256).to(torch.bfloat16)
        dynamic = ({0: torch.export.Dim("rows", min=2, max=512)},)
        others = [torch.randn(m, 256).to(torch.bfloat16) for m in (3, 33)]
    else:
        x = torch.randn(2, 8, 256).to(torch.bfloat16)
        dynamic = ({0: torch.export.Dim("b", min=2, max=8), 1: torch.export.Dim("s", min=2, max=64)},)
        others = [torch.randn(b, s, 256).to(torch.bfloat16) for b, s in ((3, 5), (4, 33))]
    fused = fxfuse.apply_fusions(model, (x,), dynamic_shapes=dynamic)
    assert "fxfuse.quant_fp8.default" in fused_targets(fused)
    for inp in (x, *others):
        assert outputs_bytes_equal(fused(inp), model(inp))


# --- found by probing (eighteenth session) ------------------------------------------------------


class TwoEqualNormsOneWritten(nn.Module):
    """Two equal norms of x, one scaled in place after: they are two tensors, not one."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(N, dtype=torch.bfloat16), requires_grad=False)

    def forward(self, x):
        a = llama(x, self.weight)
        b = llama(x, self.weight)
        a.mul_(2)
        return a, b


def test_equal_canonical_ops_one_written_in_place_stay_two(reference_path):
    model, inputs = TwoEqualNormsOneWritten(), _inputs()[:1]
    fused = _fuse(model, inputs)
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


class SumTimesReciprocal(nn.Module):
    """The mean spelled sum(h²) · (1/N): exact only where 1/N is (N a power of 2)."""

    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter((1 + 0.1 * torch.randn(n)).to(torch.bfloat16))
        self.n = n

    def forward(self, x):
        h = x.float()
        var = h.pow(2).sum(-1, keepdim=True) * (1.0 / self.n)
        y = self.weight * (h * torch.rsqrt(var + 1e-6)).to(x.dtype)
        return per_token_div(y)


def test_mean_as_sum_times_reciprocal_fuses_only_where_it_rounds_as_the_op(reference_path):
    """CPU target: the op's mean is sum / N; sum · (1/96) is another rounding (refused), while
    sum · (1/128) is exact (fuses); on a GPU target the op multiplies, so 96 fuses there."""
    for n, fires in ((96, False), (128, True)):
        model, x = SumTimesReciprocal(n), torch.randn(16, n).mul(3).to(torch.bfloat16)
        fused = _fuse(model, (x,))
        assert fused.fxfuse_report.counts["rmsnorm_quant"] == int(fires), str(fused.fxfuse_report)
        assert outputs_bytes_equal(fused(x), model(x))
        if not fires:
            reasons = " | ".join(r for _, _, r in fused.fxfuse_report.rejected)
            assert "sum · (1/96) on the CPU target" in reasons, reasons
    x = torch.randn(16, 96).mul(3).to(torch.bfloat16)
    gpu = _fuse(SumTimesReciprocal(96), (x,), config=fxfuse.FusionConfig(target="sm90"))
    assert gpu.fxfuse_report.counts["rmsnorm_quant"] == 1, str(gpu.fxfuse_report)


class PermutedNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter((1 + 0.1 * torch.randn(64)).to(torch.bfloat16))

    def forward(self, x):  # x dense but permuted: eager's outputs keep its layout
        y = llama(x, self.weight)
        return y.transpose(1, 2).reshape(x.shape[0], -1).view(x.shape[0], -1), y


def test_a_permuted_input_keeps_its_layout(reference_path):
    x = torch.randn(2, 64, 3).to(torch.bfloat16).transpose(1, 2)
    model = PermutedNorm()
    fused = _fuse(model, (x,))
    got, want = fused(x), model(x)
    assert got[1].stride() == want[1].stride()
    assert outputs_bytes_equal(got, want)
