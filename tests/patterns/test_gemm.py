"""Patterns `rmsnorm_quant_gemm` and `quant_gemm`, the `_scaled_mm` canonicalization and the
run-time token-count dispatch (SPEC §3, §5)."""

import pytest
import torch
import torch.nn.functional as F

import fxfuse
from fxfuse import ops
from fxfuse.kernels import gemm_ref
from fxfuse.models.quant_linear import CPU_ROWWISE_SCALED_MM, QuantLinear
from tests.helpers import fused_targets

K, N = 128, 48
M_VALUES = (1, 4, 31, 32, 33, 200)  # both sides of prologue_quant_max_m = 32
# The eager spelling of a rowwise torch._scaled_mm needs a torch whose CPU build takes it (2.13).
NO_CPU_ROWWISE = "this torch's CPU torch._scaled_mm takes per-tensor scales only"


class NormLinear(torch.nn.Module):
    """[residual +] Llama RMSNorm, then a torch-spelled quantized linear."""

    def __init__(self, quant="fp8_rowwise", residual=True):
        super().__init__()
        self.residual = residual
        self.weight = torch.nn.Parameter((1 + 0.1 * torch.randn(K)).to(torch.bfloat16))
        self.proj = QuantLinear(torch.randn(N, K) / K**0.5, quant)

    def normed(self, x, r):
        """(y, h): the Llama norm of h = [x + r]."""
        h = x + r if self.residual else x
        var = h.float().pow(2).mean(-1, keepdim=True)
        return (h.float() * torch.rsqrt(var + 1e-6)).to(torch.bfloat16) * self.weight, h

    def forward(self, x, r):
        y, h = self.normed(x, r)
        return self.proj(y), h


class QuantOnly(torch.nn.Module):
    def __init__(self, quant="fp8_rowwise"):
        super().__init__()
        self.proj = QuantLinear(torch.randn(N, K) / K**0.5, quant)

    def forward(self, x):
        return self.proj(x)


def _inputs(m, lead=()):
    shape = (*lead, m, K)
    return torch.randn(shape).to(torch.bfloat16), torch.randn(shape).to(torch.bfloat16)


def _rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def _expected_fp8(model, x, r):
    """float64 GEMM of the unfused graph's own quantized activation (SPEC §5's reference)."""
    y, _ = model.normed(x, r)
    q, s = ops.quant_fp8(y.reshape(-1, K))
    w, ws = model.proj.weight, model.proj.weight_scale.reshape(-1, 1)
    return gemm_ref.gemm_fp8_ref(q, s, w, ws, torch.float64, torch.float64)


@pytest.mark.parametrize("quant", ["fp8_rowwise", "mxfp4"])
@pytest.mark.parametrize("residual", [True, False])
def test_norm_chain_fires_and_matches(reference_path, quant, residual):
    model = NormLinear(quant, residual)
    x, r = _inputs(6, lead=(2,))
    fused = fxfuse.apply_fusions(model, (x, r))
    report = fused.fxfuse_report
    assert report.counts["rmsnorm_quant_gemm"] == 1
    op = "add_rms_norm_quant_gemm" if residual else "rms_norm_quant_gemm"
    assert f"fxfuse.{op}.default" in fused_targets(fused)
    assert not any(t in fused_targets(fused) for t in
                   ("fxfuse.gemm_fp8.default", "fxfuse.gemm_mxfp4.default"))
    out, h = fused(x, r)
    ref_out, ref_h = model(x, r)
    assert torch.equal(h, ref_h)
    assert _rel(out, ref_out) <= 1e-2
    if quant == "fp8_rowwise":
        assert _rel(out.reshape(-1, N), _expected_fp8(model, x, r)) <= 1e-2


@pytest.mark.parametrize("quant", ["fp8_rowwise", "mxfp4"])
def test_quant_chain_fires_and_matches(reference_path, quant):
    model = QuantOnly(quant)
    x, _ = _inputs(40)
    fused = fxfuse.apply_fusions(model, (x,))
    assert fused.fxfuse_report.counts["quant_gemm"] == 1
    assert "fxfuse.quant_gemm.default" in fused_targets(fused)
    assert _rel(fused(x), model(x)) <= 1e-2


@pytest.mark.parametrize("router", [False, True], ids=["y_in_chain", "y_read_elsewhere"])
@pytest.mark.parametrize("path", ["reference", "interpreter"])
def test_one_graph_dynamic_m_both_sides_of_dispatch(monkeypatch, path, router):
    """router: the normed y also read by a router (the with-norm op), its bytes checked too."""
    monkeypatch.setenv("TRITON_INTERPRET", "1" if path == "interpreter" else "0")
    model = NormLinearRouter("fp8_rowwise") if router else NormLinear("fp8_rowwise")
    rows = torch.export.Dim("rows", min=1, max=4096)
    x, r = _inputs(8)
    fused = fxfuse.apply_fusions(model, (x, r), dynamic_shapes=({0: rows}, {0: rows}))
    assert fused.fxfuse_report.counts["rmsnorm_quant_gemm"] == 1
    for m in M_VALUES:
        x, r = _inputs(m)
        out, h, *logits = fused(x, r)
        assert out.shape == (m, N)
        assert torch.equal(h, x + r)
        assert _rel(out, _expected_fp8(model, x, r)) <= 1e-2, m
        if router:
            assert torch.equal(logits[0], model(x, r)[2]), m


@pytest.mark.parametrize("group_size", [0, 128])
def test_dispatch_sides_quantize_identically(group_size):
    # Interpreter: the prequant GEMM's in-register quant equals the fused norm-quant kernel's.
    from fxfuse.kernels.gemm_fp8 import gemm_a16w8
    from fxfuse.kernels.rms_norm_quant import rms_norm, rms_norm_quant

    x, r = _inputs(33)
    w_norm = (1 + 0.1 * torch.randn(K)).to(torch.bfloat16)
    w = (torch.randn(N, K) * 8).clamp(-448, 448).to(torch.float8_e4m3fn)
    w_scale = torch.rand(N, 1) + 0.5 if not group_size else torch.rand(1, 1) + 0.5
    q, s, _, _ = rms_norm_quant(x, w_norm, 1e-6, r, quant="fp8", group_size=group_size)
    y, _ = rms_norm(x, w_norm, 1e-6, r)
    _, pre_q, pre_s = gemm_a16w8(y, w, w_scale, group_size=group_size, return_quant=True)
    assert torch.equal(pre_q.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(pre_s, s)


def test_dispatch_sides_give_the_same_outputs(reference_path):
    model = NormLinear("fp8_rowwise")
    x, r = _inputs(33)
    small = fxfuse.apply_fusions(model, (x, r), config=fxfuse.FusionConfig(prologue_quant_max_m=64))
    large = fxfuse.apply_fusions(model, (x, r), config=fxfuse.FusionConfig(prologue_quant_max_m=0))
    assert torch.equal(small(x, r)[0], large(x, r)[0])


# --- the normed y also read elsewhere (an MoE router beside a merged gate_up GEMM) ---------------


class NormLinearRouter(NormLinear):
    """NormLinear whose y a router reads too (fp32, as MoE routers do); rows: y flattened to
    (M, K) before the quant and the router, as HunYuan / ERNIE MoE layers do."""

    def __init__(self, quant="fp8_rowwise", residual=True, rows=False):
        super().__init__("mxfp4" if quant == "mxfp4" else "fp8_rowwise", residual)
        if quant == "fp8_block":  # (N, K) multiples of 128
            self.proj = QuantLinear(torch.randn(128, K) / K**0.5, quant)
        self.rows = rows
        self.router = torch.nn.Parameter(torch.randn(4, K))

    def forward(self, x, r):
        y, h = self.normed(x, r)
        y = y.reshape(-1, K) if self.rows else y
        return self.proj(y), h, y.float() @ self.router.t()


@pytest.mark.parametrize("quant", ["fp8_rowwise", "fp8_block", "mxfp4"])
@pytest.mark.parametrize("residual", [True, False], ids=["residual", "plain"])
@pytest.mark.parametrize("rows", [False, True], ids=["y", "rows"])
def test_norm_chain_with_the_norm_read_elsewhere(reference_path, quant, residual, rows):
    """The chain fuses whole and keeps y for the router; on both sides of the dispatch the router
    reads the unfused model's y (bytes) and the GEMM matches."""
    model = NormLinearRouter(quant, residual, rows)
    x, r = _inputs(6, lead=(2,))
    op = "add_rms_norm_quant_gemm_with_norm" if residual else "rms_norm_quant_gemm_with_norm"
    for max_m in (0, 64):  # the norm-quant kernel, then the norm kernel, writes y
        config = fxfuse.FusionConfig(prologue_quant_max_m=max_m)
        fused = fxfuse.apply_fusions(model, (x, r), config=config)
        counts = fused.fxfuse_report.counts
        assert counts["rmsnorm_quant_gemm"] == 1 and counts["quant_gemm"] == 0, str(counts)
        assert fused_targets(fused) == [f"fxfuse.{op}.default"]
        out, h, logits = fused(x, r)
        ref_out, ref_h, ref_logits = model(x, r)
        assert torch.equal(h, ref_h) and torch.equal(logits, ref_logits), max_m
        assert _rel(out, ref_out) <= 1e-2, max_m


@pytest.mark.parametrize("residual", [True, False], ids=["residual", "plain"])
def test_with_norm_gemm_ops_return_the_chain_and_y(residual, reference_path):
    """The with-norm ops: the base op's outputs and the norm's y, on both sides of the dispatch;
    they pass opcheck."""
    model = NormLinear("fp8_rowwise", residual)
    w, ws = model.proj.weight, model.proj.weight_scale.reshape(-1, 1)
    norm_w = model.weight.detach()
    nq = (1e-6, 0.0, True, None, False, "fp8", 0, torch.float8_e4m3fn, 1e-10, False, False,
          False, "even")  # fmt: skip
    ops = torch.ops.fxfuse
    for m in (4, 40):
        x, r = _inputs(m)
        gemm = (w, ws, torch.bfloat16, 32)
        if residual:
            base, op, args = ops.add_rms_norm_quant_gemm, ops.add_rms_norm_quant_gemm_with_norm, (
                x, r, norm_w, *nq, *gemm)
            y = ops.add_rms_norm(x, r, norm_w, *nq[:5])[0]
        else:
            base, op, args = ops.rms_norm_quant_gemm, ops.rms_norm_quant_gemm_with_norm, (
                x, norm_w, *nq, *gemm)
            y = ops.rms_norm(x, norm_w, *nq[:5])
        want = base(*args)
        want = want if residual else (want,)
        got = op(*args)
        assert len(got) == len(want) + 1
        for a, b in zip(got, (*want, y)):
            assert torch.equal(a, b), m
        utils = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
        torch.library.opcheck(op.default, args, test_utils=utils)


def test_torch_compile_fuses_the_chain_with_the_norm_read_elsewhere(reference_path):
    model = NormLinearRouter("fp8_rowwise").requires_grad_(False)
    x, r = _inputs(40)
    out, h, logits = torch.compile(model, backend="fxfuse")(x, r)
    report = fxfuse.last_report()
    assert report.counts["rmsnorm_quant_gemm"] == 1, str(report)
    replacements = [w.replacement for w in report.rewrites]
    assert "fxfuse.add_rms_norm_quant_gemm_with_norm.default" in replacements, replacements
    ref_out, ref_h, ref_logits = model(x, r)
    assert torch.equal(h, ref_h)
    assert _rel(logits, ref_logits) <= 1e-5  # Inductor compiles the router's fp32 matmul
    assert _rel(out, ref_out) <= 1e-2


# --- near-misses ---------------------------------------------------------------------------------


class SharedQuant(NormLinear):
    """The quantized activation also leaves the graph: the GEMM cannot absorb the quant."""

    def forward(self, x, r):
        h = x + r
        var = h.float().pow(2).mean(-1, keepdim=True)
        y = (h.float() * torch.rsqrt(var + 1e-6)).to(torch.bfloat16) * self.weight
        y = y.reshape(-1, K)
        q, s = ops.quant_fp8(y)
        w, ws = self.proj.weight, self.proj.weight_scale.reshape(-1, 1)
        return ops.gemm_fp8(q, s, w, ws), q


class BiasedScaledMM(QuantOnly):
    def forward(self, x):
        amax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-10)
        scale = amax / 448.0
        q = (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        bias = torch.ones(N, dtype=torch.bfloat16)
        return torch._scaled_mm(q, self.proj.weight.t(), scale_a=scale,
                                scale_b=self.proj.weight_scale, bias=bias,
                                out_dtype=torch.bfloat16)


def test_quant_with_another_user_does_not_fuse_the_gemm(reference_path):
    model = SharedQuant()
    x, r = _inputs(5)
    fused = fxfuse.apply_fusions(model, (x, r))
    report = fused.fxfuse_report
    assert report.counts["rmsnorm_quant_gemm"] == 0
    assert report.counts["rmsnorm_quant"] == 1
    assert any(p == "rmsnorm_quant_gemm" and "other users" in why for p, _, why in report.rejected)
    out, q = fused(x, r)
    ref_out, ref_q = model(x, r)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    assert _rel(out, ref_out) <= 1e-2


@pytest.mark.parametrize("n", [1, N], ids=["one_column", "wide"])
@pytest.mark.parametrize("tensorwise", [False, True], ids=["rowwise", "tensorwise"])
def test_scaled_mm_one_column_weight_stays_rowwise(reference_path, n, tensorwise):
    """A (1, 1) weight scale beside (M, 1) token scales is rowwise (Qwen2-MoE's shared-expert
    gate is Linear(hidden, 1)); only two scalar scales are tensorwise."""
    if not tensorwise and not CPU_ROWWISE_SCALED_MM:
        pytest.skip(NO_CPU_ROWWISE)

    class ScaledMM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = QuantLinear(torch.randn(n, K) / K**0.5, "fp8_rowwise")

        def forward(self, x):
            amax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-10)
            scale = amax.amax().reshape(1, 1) / 448.0 if tensorwise else amax / 448.0
            q = (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
            w_scale = self.proj.weight_scale.amax().reshape(1, 1) if tensorwise else (
                self.proj.weight_scale)
            return torch._scaled_mm(q, self.proj.weight.t(), scale_a=scale, scale_b=w_scale,
                                    out_dtype=torch.bfloat16)

    model, (x, _) = ScaledMM(), _inputs(24)
    fused = fxfuse.apply_fusions(model, (x,))
    assert fused.fxfuse_report.canonicalized.get("gemm_fp8") == 1, str(fused.fxfuse_report)
    assert "aten._scaled_mm.default" not in [str(t.target) for t in fused.graph.nodes]
    out, want = fused(x), model(x)
    assert out.shape == want.shape == (24, n)
    assert _rel(out, want) <= 1e-2


@pytest.mark.skipif(not CPU_ROWWISE_SCALED_MM, reason=NO_CPU_ROWWISE)
def test_scaled_mm_with_bias_is_left_alone(reference_path):
    model = BiasedScaledMM()
    x, _ = _inputs(5)
    fused = fxfuse.apply_fusions(model, (x,))
    report = fused.fxfuse_report
    assert report.counts["quant_gemm"] == 0
    assert any("bias" in why for p, _, why in report.rejected if p == "quant_gemm")
    assert "aten._scaled_mm.default" in [str(n.target) for n in fused.graph.nodes]
    assert torch.equal(fused(x), model(x))


class PreTransposedScaledMM(torch.nn.Module):
    """vLLM's spelling: the FP8 weight stored transposed, (K, N) column-major, and handed to
    torch._scaled_mm as it is (no transpose node in the graph)."""

    def __init__(self):
        super().__init__()
        proj = QuantLinear(torch.randn(N, K) / K**0.5, "fp8_rowwise")
        self.weight = torch.nn.Parameter(proj.weight.t(), requires_grad=False)
        self.weight_scale = torch.nn.Parameter(proj.weight_scale, requires_grad=False)

    def forward(self, x):
        amax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-10)
        scale = amax / 448.0
        q = (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        return torch._scaled_mm(q, self.weight, scale_a=scale, scale_b=self.weight_scale,
                                out_dtype=torch.bfloat16)  # fmt: skip


@pytest.mark.skipif(not CPU_ROWWISE_SCALED_MM, reason=NO_CPU_ROWWISE)
@pytest.mark.parametrize("ir", ["export", "compile"])
def test_scaled_mm_of_a_pretransposed_weight_fuses(ir, reference_path):
    """The canonical GEMM takes the (N, K) weight back as a permute of the (K, N) operand: a
    transpose op (aten.t) there failed Inductor's lowering of the post-grad graph."""
    model, (x, _) = PreTransposedScaledMM(), _inputs(6)
    with torch.no_grad():
        want = model(x)
        if ir == "export":
            fused = fxfuse.apply_fusions(model, (x,))
            got, report = fused(x), fused.fxfuse_report
        else:
            torch._dynamo.reset()
            got, report = torch.compile(model, backend="fxfuse")(x), fxfuse.last_report()
    assert report.counts["quant_gemm"] == 1, str(report)
    assert _rel(got, want) <= 1e-2


def test_disabled_pattern_keeps_the_norm_quant_fusion(reference_path):
    model = NormLinear("fp8_rowwise")
    x, r = _inputs(5)
    config = fxfuse.FusionConfig(disable=("rmsnorm_quant_gemm",))
    fused = fxfuse.apply_fusions(model, (x, r), config=config)
    assert fused.fxfuse_report.counts.get("rmsnorm_quant_gemm", 0) == 0
    assert fused.fxfuse_report.counts["rmsnorm_quant"] == 1
    assert "fxfuse.gemm_fp8.default" in fused_targets(fused)


def test_torch_compile_backend_fuses_the_chain(reference_path):
    model = NormLinear("fp8_rowwise").requires_grad_(False)
    x, r = _inputs(7)
    compiled = torch.compile(model, backend="fxfuse")
    out, _ = compiled(x, r)
    assert fxfuse.last_report().counts["rmsnorm_quant_gemm"] == 1
    assert _rel(out, model(x, r)[0]) <= 1e-2


def test_torch_compile_with_a_dynamic_token_dim_fuses_one_graph(reference_path):
    """The serving engines' way: the token dim marked dynamic, one graph for every M, fused, on
    both sides of the dispatch."""
    model = NormLinear("fp8_rowwise").requires_grad_(False)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(model, backend="fxfuse")
    for m in (40, 7, 200):
        x, r = _inputs(m)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(r, 0)
        out, h = compiled(x, r)
        assert fxfuse.last_report().counts["rmsnorm_quant_gemm"] == 1, m
        assert torch.equal(h, x + r) and _rel(out, _expected_fp8(model, x, r)) <= 1e-2, m
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def test_torch_compile_dynamic_true_says_why_the_quant_stays(reference_path):
    """dynamic=True passes Python floats (FP8_MAX) as graph inputs: the quant cannot be read as
    FP8 per token, and the report says so and what to do; with floats specialized it fuses."""
    model = NormLinear("fp8_rowwise").requires_grad_(False)
    x, r = _inputs(40)
    torch._dynamo.reset()
    torch.compile(model, backend="fxfuse", dynamic=True)(x, r)  # Inductor's own numbers
    report = fxfuse.last_report()
    assert report.counts["rmsnorm_quant_gemm"] == 0 and report.counts["rmsnorm_quant"] == 0
    reasons = [why for name, _, why in report.rejected if name == "rmsnorm_quant"]
    assert reasons and all("specialize_float" in why for why in reasons), reasons
    torch._dynamo.reset()
    # config.patch, not monkeypatch: undoing a monkeypatch of this flag deletes it in torch 2.11
    with torch._dynamo.config.patch(specialize_float=True):
        out, _ = torch.compile(model, backend="fxfuse", dynamic=True)(x, r)
    assert fxfuse.last_report().counts["rmsnorm_quant_gemm"] == 1
    assert _rel(out, _expected_fp8(model, x, r)) <= 1e-2


def test_bad_dispatch_argument_names_it():
    x = torch.randn(4, K).to(torch.bfloat16)
    w = torch.zeros(N, K, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="prologue_quant_max_m"):
        torch.ops.fxfuse.quant_gemm(x, "fp8", 0, torch.float8_e4m3fn, 1e-10, False, False, "even",
                                    w, torch.ones(N, 1), torch.bfloat16, -1)
    with pytest.raises(ValueError, match="group_size"):
        torch.ops.fxfuse.quant_gemm(x, "fp8", 64, torch.float8_e4m3fn, 1e-10, False, False, "even",
                                    w, torch.ones(N, 1), torch.bfloat16, 32)


# --- dequantize-then-matmul spellings ------------------------------------------------------------


class DequantPerToken(torch.nn.Module):
    """(q.float() * s) @ (w.float() * ws).t(), per token × per channel, written in torch."""

    def __init__(self):
        super().__init__()
        self.proj = QuantLinear(torch.randn(N, K) / K**0.5, "fp8_rowwise")

    def forward(self, x):
        q, s = ops.quant_fp8(x)
        w_deq = self.proj.weight.float() * self.proj.weight_scale.reshape(-1, 1)
        return ((q.float() * s) @ w_deq.t()).to(torch.bfloat16)


class DequantLinear(torch.nn.Module):
    """F.linear(q.to(fp32) * s, w.to(fp32) * ws): export keeps aten.linear. `tokens_3d`: the
    dequantized tokens viewed (2, M / 2, K) first, a 3-D GEMM output (a near-miss)."""

    def __init__(self, bias=False, tokens_3d=False):
        super().__init__()
        self.proj = QuantLinear(torch.randn(N, K) / K**0.5, "fp8_rowwise")
        self.bias = torch.nn.Parameter(torch.randn(N)) if bias else None
        self.tokens_3d = tokens_3d

    def forward(self, x):
        q, s = ops.quant_fp8(x)
        w_deq = self.proj.weight.to(torch.float32) * self.proj.weight_scale.reshape(-1, 1)
        x_deq = q.to(torch.float32) * s
        if self.tokens_3d:
            x_deq = x_deq.view(2, -1, K)
        return F.linear(x_deq, w_deq, self.bias).to(torch.bfloat16)


class DequantBlocks(torch.nn.Module):
    """QuantLinear's fp8_block spelling with the weight scales expanded `rep` times."""

    def __init__(self, rep=128):
        super().__init__()
        self.rep = rep
        self.proj = QuantLinear(torch.randn(128, K) / K**0.5, "fp8_block")

    def forward(self, x):
        xg = x.float().view(-1, K // 128, 128)
        scale = xg.abs().amax(dim=-1, keepdim=True).clamp(min=1e-10) / 448.0
        q = (xg / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        x_deq = (q.float() * scale).view(-1, K)
        # rep 64: two scale columns per 128 of K (not the 128×128 blocks the GEMM takes).
        base = self.proj.weight_scale.repeat(1, 128 // self.rep)
        ws = base.repeat_interleave(128, 0).repeat_interleave(self.rep, 1)
        return (x_deq @ (self.proj.weight.float() * ws).t()).to(torch.bfloat16)


@pytest.mark.parametrize("model_cls", [DequantPerToken, DequantLinear, DequantBlocks])
def test_dequant_then_matmul_fuses(reference_path, model_cls):
    model = model_cls()
    x, _ = _inputs(40)
    fused = fxfuse.apply_fusions(model, (x,))
    report = fused.fxfuse_report
    assert report.canonicalized.get("gemm_fp8[dequant]") == 1, report
    assert report.counts["quant_gemm"] == 1
    assert "fxfuse.quant_gemm.default" in fused_targets(fused)
    targets = [str(n.target) for n in fused.graph.nodes]
    assert "aten.matmul.default" not in targets and "aten.linear.default" not in targets
    assert _rel(fused(x), model(x)) <= 1e-2


class DequantMatmul3d(DequantPerToken):
    """The dequantized tokens viewed (2, M / 2, K) before `@`: a 3-D output (a near-miss; the
    rewrite once returned (M, N) here)."""

    def forward(self, x):
        q, s = ops.quant_fp8(x)
        w_deq = self.proj.weight.float() * self.proj.weight_scale.reshape(-1, 1)
        return ((q.float() * s).view(2, -1, K) @ w_deq.t()).to(torch.bfloat16)


def test_dequant_matmul_with_3d_output_is_left_alone(reference_path):
    model = DequantMatmul3d()
    x, _ = _inputs(40)
    fused = fxfuse.apply_fusions(model, (x,))
    assert fused.fxfuse_report.canonicalized.get("gemm_fp8[dequant]", 0) == 0
    reasons = " | ".join(why for _, _, why in fused.fxfuse_report.rejected)
    assert "3-D, not (M, N)" in reasons, reasons
    assert torch.equal(fused(x), model(x))


@pytest.mark.parametrize("kw", [{"bias": True}, {"tokens_3d": True}], ids=["bias", "3d"])
def test_dequant_linear_near_misses_are_left_alone(reference_path, kw):
    model = DequantLinear(**kw)
    x, _ = _inputs(40)
    fused = fxfuse.apply_fusions(model, (x,))
    assert fused.fxfuse_report.canonicalized.get("gemm_fp8[dequant]", 0) == 0
    assert "aten.linear.default" in [str(n.target) for n in fused.graph.nodes]
    assert torch.equal(fused(x), model(x))


@pytest.mark.parametrize("rep", [128, 64])
def test_dequant_blocks_under_torch_compile(reference_path, rep):
    """Inductor decomposes repeat_interleave before the post-grad pass: unsqueeze → expand →
    clone → reshape. The 128×128 blocks still canonicalize; 64-wide ones stay a near-miss."""
    model = DequantBlocks(rep=rep).requires_grad_(False)
    x, _ = _inputs(24)
    torch._dynamo.reset()
    out = torch.compile(model, backend="fxfuse")(x)
    report = fxfuse.last_report()
    assert report.canonicalized.get("gemm_fp8[dequant]", 0) == (rep == 128), report
    assert report.counts["quant_gemm"] == (rep == 128)
    assert _rel(out, model(x)) <= 1e-2


def test_dequant_with_other_blocks_is_a_near_miss(reference_path):
    model = DequantBlocks(rep=64)
    x, _ = _inputs(8)
    fused = fxfuse.apply_fusions(model, (x,))
    assert "gemm_fp8[dequant]" not in fused.fxfuse_report.canonicalized
    assert fused.fxfuse_report.counts["quant_gemm"] == 0
    assert torch.equal(fused(x), model(x))


# --- found by probing (eighteenth session) ------------------------------------------------------


class Bf16ScaleQuant(torch.nn.Module):
    """A per-token FP8 quant whose scale stays bf16 (no .float() on amax): the canonical op
    computes it in fp32, which would change q's bytes and the scale's dtype."""

    def forward(self, x):
        amax = x.abs().amax(-1, keepdim=True)
        s = amax.clamp(min=1e-10) / 448.0
        q = (x.float() / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        return q, s


def test_quant_with_a_bf16_scale_is_not_canonicalized(reference_path):
    x = (torch.randn(8, K) * 3.7).to(torch.bfloat16)
    model = Bf16ScaleQuant()
    fused = fxfuse.apply_fusions(model, (x,))
    assert not fused.fxfuse_report.canonicalized
    reasons = " | ".join(r for _, _, r in fused.fxfuse_report.rejected)
    assert "not fp32" in reasons, str(fused.fxfuse_report)
    (q, s), (q_want, s_want) = fused(x), model(x)
    assert s.dtype == torch.bfloat16 and torch.equal(s, s_want)
    assert torch.equal(q.view(torch.uint8), q_want.view(torch.uint8))


class MispairedScales(torch.nn.Module):
    """K = 128: a 1×128 quant (scale (M, 1)) feeding a per-channel weight scale, or a per-token
    quant feeding 128×128 block scales; valid GEMMs, not pairings the fused ops take."""

    def __init__(self, group_size):
        super().__init__()
        n = 256 if group_size == 0 else 32
        self.group_size = group_size
        self.register_buffer("w", (torch.randn(n, 128) * 8).clamp(-448, 448).to(torch.float8_e4m3fn))
        scale_shape = (n // 128, 1) if group_size == 0 else (n, 1)
        self.register_buffer("ws", torch.rand(scale_shape) + 0.5)

    def forward(self, x):
        q, s = ops.quant_fp8(x, self.group_size or None)
        return ops.gemm_fp8(q, s, self.w, self.ws)


@pytest.mark.parametrize("group_size", [0, 128])
@pytest.mark.parametrize("rows", [1, 33])
def test_mispaired_quant_and_weight_scales_are_left_alone(group_size, rows):
    """Interpreter (the prequant kernel at M ≤ 32 refused these): no fusion, eager's numbers."""
    model = MispairedScales(group_size)
    x = torch.randn(rows, 128).to(torch.bfloat16)
    fused = fxfuse.apply_fusions(model, (x,))
    assert fused.fxfuse_report.counts["quant_gemm"] == 0, str(fused.fxfuse_report)
    reasons = " | ".join(r for _, _, r in fused.fxfuse_report.rejected)
    assert "weight scale" in reasons, str(fused.fxfuse_report)
    assert torch.equal(fused(x), model(x))
