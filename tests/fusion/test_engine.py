"""The rewrite engine's placement of a replacement: inputs the graph defines after an early
reader of the match's outputs are moved up when nothing they cross may write memory."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import fxfuse
from fxfuse.fusion.passes import run_passes
from fxfuse.models.quant_linear import QuantLinear
from tests.helpers import fused_targets, outputs_bytes_equal
from tests.patterns.test_rms_norm_quant import llama, per_token_div

FP8 = torch.float8_e4m3fn
K, N = 64, 32
NORM_QUANT = (1e-6, 0.0, True, None, False, "fp8", 0, FP8, 1e-10, False, False, False, "even")


def _chain(mutate: str | None):
    """norm-quant with y kept → a reader of y → [an in-place write: of the weight scale, or of a
    buffer of its own, as MoE routing writes] → the weight scale's reshape → the GEMM: the GEMM's
    last input comes after y's reader."""

    def chain(x, w, w_fp8, w_scale):
        q, s, y = torch.ops.fxfuse.rms_norm_quant_with_norm(x, w, *NORM_QUANT)
        logits = y.float() * 2
        if mutate == "weight_scale":
            w_scale.mul_(2.0)
        elif mutate == "own_buffer":
            logits = torch.zeros_like(logits).index_add_(0, torch.arange(8), logits)
        out = fxfuse.ops.gemm_fp8(q, s, w_fp8, w_scale.reshape(-1, 1), torch.bfloat16)
        return out, logits

    return chain


def _inputs():
    x = torch.randn(8, K).to(torch.bfloat16)
    w = torch.ones(K, dtype=torch.bfloat16)
    w_fp8 = torch.randn(N, K).to(FP8)
    return x, w, w_fp8, torch.rand(N) + 0.5


@pytest.mark.parametrize("mutate", [None, "own_buffer"])
def test_late_pure_input_moves_up_and_the_chain_fuses(mutate, reference_path):
    inputs = _inputs()
    gm = make_fx(_chain(mutate), tracing_mode="fake")(*inputs)
    report = run_passes(gm)
    assert report.counts["rmsnorm_quant_gemm"] == 1, str(report)
    assert fused_targets(gm) == ["fxfuse.rms_norm_quant_gemm_with_norm.default"]
    assert any(n.target is torch.ops.aten.index_add_.default for n in gm.graph.nodes) == bool(
        mutate
    )
    want = _chain(mutate)(*inputs)
    got = gm(*inputs)
    assert torch.equal(got[1], want[1])
    assert torch.equal(got[0], want[0])


def test_late_input_behind_an_in_place_write_stays_and_is_reported(reference_path):
    inputs = _inputs()
    gm = make_fx(_chain("weight_scale"), tracing_mode="fake")(*inputs)
    report = run_passes(gm)
    assert report.counts["rmsnorm_quant_gemm"] == 0, str(report)
    reasons = [why for name, _, why in report.rejected if name == "rmsnorm_quant_gemm"]
    assert reasons == ["inputs are defined after a consumer"], reasons
    want = _chain("weight_scale")(*[t.clone() for t in inputs])
    got = gm(*[t.clone() for t in inputs])
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# --- in-place writes between the reads a replacement merges -------------------------------------


class _WrittenChain(torch.nn.Module):
    """residual add → RMSNorm → FP8 per-token quant, with an in-place write (through a view) to
    the residual sum or the normed value at `where`; returns (q, scale, h)."""

    def __init__(self, write: str):
        super().__init__()
        self.write = write
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, K).to(torch.bfloat16))

    def forward(self, x, r):
        h = x + r
        if self.write == "view_add_":
            h.view(-1).add_(1.0)
        elif self.write == "slice_fill_":
            h[:, :8].fill_(0.5)
        elif self.write == "row_setitem":
            h[0] = 2.0
        y = llama(h, self.weight)
        if self.write == "normed_setitem":
            y[:, :4] = 3.0
        q, scale = per_token_div(y)
        if self.write == "after_the_chain":
            h.add_(1.0)
        return q, scale, h


@pytest.mark.parametrize("write", ["view_add_", "slice_fill_", "row_setitem", "normed_setitem"])
def test_a_write_between_merged_reads_stops_the_fusion(write, reference_path):
    """torch.export keeps in-place writes. One between the residual add and the norm (or the norm
    and the quant) must not be reordered after the fused op, which reads the inputs at once."""
    model = _WrittenChain(write)
    inputs = (torch.randn(4, K).to(torch.bfloat16), torch.randn(4, K).to(torch.bfloat16))
    with torch.no_grad():
        fused = fxfuse.apply_fusions(model, inputs)
        got, want = fused(*inputs), model(*inputs)
    report = fused.fxfuse_report
    assert report.counts["rmsnorm_quant"] == 0, str(report)
    assert not any("rms_norm_quant" in t for t in fused_targets(fused))
    reasons = " | ".join(why for _, _, why in report.rejected)
    assert "in place between reads the replacement would merge" in reasons, reasons
    assert outputs_bytes_equal(got, want)


def test_a_write_after_the_chain_still_fuses(reference_path):
    model = _WrittenChain("after_the_chain")
    inputs = (torch.randn(4, K).to(torch.bfloat16), torch.randn(4, K).to(torch.bfloat16))
    with torch.no_grad():
        fused = fxfuse.apply_fusions(model, inputs)
        got, want = fused(*inputs), model(*inputs)
    assert fused.fxfuse_report.counts["rmsnorm_quant"] == 1, str(fused.fxfuse_report)
    assert outputs_bytes_equal(got, want)


class _TwoNormsOfOneSum(torch.nn.Module):
    """h = x + r read by two norms (a parallel block), each into its own quantized linear."""

    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.linspace(0.5, 1.5, K).to(torch.bfloat16))
        self.w2 = torch.nn.Parameter(torch.linspace(1.5, 0.5, K).to(torch.bfloat16))
        self.a = QuantLinear(torch.randn(64, K) / K**0.5)
        self.b = QuantLinear(torch.randn(32, K) / K**0.5)

    def forward(self, x, r):
        h = x + r
        return self.a(llama(h, self.w1)), self.b(llama(h, self.w2)), h


def test_two_norms_of_one_residual_sum_both_fuse(reference_path):
    """The first rewrite replaces h, which the second match had bound: it matches again over the
    rewritten graph instead of reading the erased node (a lint error before)."""
    torch.manual_seed(0)
    model = _TwoNormsOfOneSum()
    inputs = (torch.randn(4, K).to(torch.bfloat16), torch.randn(4, K).to(torch.bfloat16))
    with torch.no_grad():
        fused = fxfuse.apply_fusions(model, inputs)
        got, want = fused(*inputs), model(*inputs)
    assert fused.fxfuse_report.counts["rmsnorm_quant_gemm"] == 2, str(fused.fxfuse_report)
    assert sorted(fused_targets(fused)) == [
        "fxfuse.add_rms_norm_quant_gemm.default", "fxfuse.rms_norm_quant_gemm.default"
    ]
    assert outputs_bytes_equal(got, want)


def test_a_replacement_whose_op_refuses_its_arguments_leaves_the_graph_as_it_was():
    """A fused op's fake raising ValueError (bad arguments the guard let through): the rewrite is
    reported as refused and the graph keeps every node, lint-clean (no orphaned new node)."""
    from fxfuse.fusion.engine import fake_mode_of, run_rule
    from fxfuse.fusion.report import FusionReport
    from fxfuse.patterns.matcher import Any, Op
    from fxfuse.patterns.rule import Context, Rule

    aten = torch.ops.aten

    def replace(m, ctx, insert):
        neg = insert.call(aten.neg.default, (m["x"],))  # fine
        # quant_fp8 with group_size 3: its fake raises ValueError naming the argument
        return [insert.call(torch.ops.fxfuse.quant_fp8.default, (neg, 3, FP8, 1e-10, False,
                                                                  False, False))]  # fmt: skip

    gm = make_fx(lambda x: torch.relu(torch.relu(x)) + 1, tracing_mode="fake")(torch.randn(4, 8))
    before = [n.format_node() for n in gm.graph.nodes]
    rule = Rule(name="probe", pattern=Op(aten.relu.default, Op(aten.relu.default, Any("x"))),
                outputs=lambda m: [m.root], replace=replace)  # fmt: skip
    report = FusionReport()
    ctx = Context(gm.graph, report, fxfuse.FusionConfig(), "cpu", fake_mode_of(gm.graph))
    assert run_rule(rule, ctx) == 0
    gm.graph.lint()
    assert [n.format_node() for n in gm.graph.nodes] == before
    assert any("replacement refused" in reason for _, _, reason in report.rejected)


class _WriteThroughAnInPlaceResult(torch.nn.Module):
    """lc views `lengths`; after `lengths.add_(0)` (whose result aliases lengths) the second
    add_ writes lc's memory between the score masking and the index check that both read lc."""

    def forward(self, scores, lengths, pt):
        lengths = lengths.clone()
        lc = lengths[:, None]
        lengths.add_(0)
        pos = torch.arange(scores.shape[1])
        masked = scores.masked_fill(pos[None, :] >= lc, float("-inf"))
        idx = torch.topk(masked, 8, dim=-1).indices
        lengths.add_(1)
        idx = idx.masked_fill(idx >= lc, -1)
        return torch.gather(pt, 1, idx.clamp(min=0)).masked_fill(idx < 0, -1)


def test_a_write_through_an_in_place_result_between_merged_reads_stops_the_fusion(
    reference_path,
):
    model = _WriteThroughAnInPlaceResult()
    scores, lengths = torch.randn(2, 8), torch.tensor([3, 5])
    pt = torch.arange(16, dtype=torch.int32).reshape(2, 8)
    with torch.no_grad():
        fused = fxfuse.apply_fusions(model, (scores, lengths, pt))
        got, want = fused(scores, lengths.clone(), pt), model(scores, lengths.clone(), pt)
    assert fused.fxfuse_report.counts["topk_page_transform"] == 0
    reasons = " | ".join(r for _, _, r in fused.fxfuse_report.rejected)
    assert "in place between reads" in reasons, reasons
    assert torch.equal(got.sort(-1).values, want.sort(-1).values)
