"""The rewrite engine's placement of a replacement: inputs the graph defines after an early
reader of the match's outputs are moved up when nothing they cross may write memory."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import fxfuse
from fxfuse.fusion.passes import run_passes
from tests.helpers import fused_targets

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
