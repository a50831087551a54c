"""HF transformers DeepSeek-V3 (tiny config, random weights, never downloaded): the MLA kv_b GEMM →
view → transpose → split → `new_empty` + slice `copy_` of every attention layer becomes one
`fxfuse.gemm_split_cat`, and the logits match; with the linears quantized (FP8 per token, MXFP4)
it becomes the quantized GEMM with the split epilogue."""

import pytest
import torch

from fxfuse.models.quant_linear import quantize_linears
from tests.helpers import (
    Logits,
    assert_kv_b_feeds_only_split_cat,
    assert_logits_close,
    fuse_and_run,
)

transformers = pytest.importorskip("transformers")
LAYERS = 2


def _tiny_deepseek(attn: str, q_lora_rank: int = 48, dense_layers: int = LAYERS):
    # 4 heads of qk_nope 16 | v 16 from a 32-wide latent, rope 8: kv_b is (M, 32) x (32, 128).
    # Dense MLPs unless dense_layers < LAYERS (first_k_dense_replace: the MoE layers come after).
    cfg = transformers.DeepseekV3Config(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=4,
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=dense_layers, q_lora_rank=q_lora_rank, kv_lora_rank=32,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=64,
    )  # fmt: skip
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    return transformers.DeepseekV3ForCausalLM(cfg).to(torch.bfloat16).eval()


def _fuse_and_run(attn: str, quant: str | None = None):
    model = _tiny_deepseek(attn, q_lora_rank=64 if quant == "mxfp4" else 48)  # MXFP4: K % 32
    if quant:
        model = quantize_linears(model, quant)
    model = Logits(model)
    ids = torch.randint(0, 128, (2, 7))  # 14 tokens: odd per sequence
    return fuse_and_run(model, (ids,))


def _kv_b_fused_in_every_layer(fused, op: str = "gemm_split_cat") -> None:
    report = fused.fxfuse_report
    assert report.counts["gemm_split_cat"] == LAYERS, str(report)
    assert_kv_b_feeds_only_split_cat(fused, LAYERS, op)
    # The q_b split feeds a cat of its own rope output: declined, with the reason.
    assert any("computed from the GEMM" in r for _, _, r in report.rejected)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_kv_b_fuses_in_every_layer_and_logits_match(attn, reference_path):
    fused, got, want = _fuse_and_run(attn)
    _kv_b_fused_in_every_layer(fused)
    # The reference path is the unfused spelling: the logits are the same bytes.
    assert torch.equal(got, want)


def test_kv_b_kernel_in_interpreter_logits_match():
    fused, got, want = _fuse_and_run("eager")
    _kv_b_fused_in_every_layer(fused)
    assert_logits_close(got, want)


QUANT_OPS = {"fp8_rowwise": "gemm_fp8_split_cat", "mxfp4": "gemm_mxfp4_split_cat"}


@pytest.mark.parametrize("quant", list(QUANT_OPS))
@pytest.mark.parametrize("path", ["kernel", "reference"])
def test_quantized_kv_b_fuses_in_every_layer_and_logits_match(quant, path, monkeypatch):
    if path == "reference":  # the unfused spelling over the reference GEMM: the same bytes
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    fused, got, want = _fuse_and_run("eager", quant)
    _kv_b_fused_in_every_layer(fused, QUANT_OPS[quant])
    if path == "reference":
        assert torch.equal(got, want)
    assert_logits_close(got, want)


@pytest.mark.parametrize("quant", ["fp8_rowwise", "mxfp4"])
@pytest.mark.parametrize("path", ["kernel", "reference"])
def test_moe_layers_fuse_the_norm_the_router_also_reads(quant, path, monkeypatch):
    """MoE layers: the post-attention norm's y feeds the router (bf16, not quantized) and the
    shared expert's quant (gate and up: two GEMMs). The norm and quant fuse with y kept
    (`add_rms_norm_quant_with_norm`) in every layer, and the logits match."""
    if path == "reference":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    model = _tiny_deepseek("eager", q_lora_rank=64, dense_layers=0)
    ids = torch.randint(0, 128, (2, 7))
    fused, got, want = fuse_and_run(Logits(quantize_linears(model, quant)), (ids,))
    targets = [str(n.target) for n in fused.graph.nodes if n.op == "call_function"]
    assert targets.count("fxfuse.add_rms_norm_quant_with_norm.default") == LAYERS, targets
    if path == "reference":
        assert torch.equal(got, want)
    assert_logits_close(got, want)
