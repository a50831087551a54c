"""Other HF transformers decoders (tiny configs, random weights) with their Linear layers swapped
for the torch-spelled dynamic-FP8 (per token, 1×128) or MXFP4 linear, as for Llama
(test_hf_llama.py): each architecture's own RMSNorm spelling (Gemma's `(1 + w)`, Qwen2's and
Mistral's Llama form; Qwen3, Gemma 3, Phi-3 and GLM-4 too) fuses with the quant in every decoder
layer, and the logits match."""

import pytest
import torch

from fxfuse.models.quant_linear import quantize_linears
from tests.helpers import Logits, assert_logits_close, fuse_and_run

transformers = pytest.importorskip("transformers")

LAYERS = 2
ARCHITECTURES = {
    # name: (config class, model class, extra config)
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 64}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"head_dim": 64}),
    # q_norm / k_norm on the heads besides the layer norms
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 64}),
    # Gemma's (1 + w) with pre- and post-feedforward norms
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 64}),
    # fused qkv_proj and gate_up_proj: one GEMM after each norm's quant
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0}),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", {"head_dim": 64, "pad_token_id": 0}),
}


@pytest.mark.parametrize("quant", ["fp8_rowwise", "fp8_block", "mxfp4"])
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_decoder_norms_fuse_and_logits_match(name, quant, reference_path):
    config_name, model_name, extra = ARCHITECTURES[name]
    if not hasattr(transformers, model_name):
        pytest.skip(f"transformers {transformers.__version__} has no {model_name}")
    cfg = getattr(transformers, config_name)(
        vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-6, **extra,
    )  # fmt: skip
    model = getattr(transformers, model_name)(cfg).to(torch.bfloat16).eval()
    input_ids = torch.randint(0, 128, (2, 12))
    fused, got, want = fuse_and_run(Logits(quantize_linears(model, quant)), (input_ids,))
    report = fused.fxfuse_report
    # input_layernorm (q/k/v share one quant) and post_attention_layernorm (gate/up) per layer;
    # the final norm feeds the unquantized lm_head. o_proj's and down_proj's activations are
    # quantized alone: quant → GEMM, two a layer.
    assert report.counts["rmsnorm_quant"] == 2 * LAYERS, str(report)
    assert report.counts["quant_gemm"] == 2 * LAYERS, str(report)
    assert_logits_close(got, want)


# MoE layers: the router reads the post-attention norm's y in bf16 (or fp32), the shared expert
# (gate and up, two GEMMs) its quant, so the norm and quant fuse with y kept
# (`add_rms_norm_quant_with_norm`). name: (model type, MoE layers of the two, extra config)
MOE = {
    # GLM-4.5: first_k_dense_replace 1, so one MoE layer of two
    "glm4_moe": ("glm4_moe", 1, {"head_dim": 16, "n_routed_experts": 4, "n_shared_experts": 1}),
    # ERNIE 4.5: the router and the experts' gather read the flattened rows the quant reads
    "ernie4_5_moe": ("ernie4_5_moe", 1, {"head_dim": 16, "moe_num_experts": 4}),
    # Qwen2-MoE: every layer MoE; its shared-expert gate is Linear(hidden, 1), a one-column
    # rowwise _scaled_mm
    "qwen2_moe": ("qwen2_moe", 2, {"head_dim": 16, "num_experts": 4,
                                   "shared_expert_intermediate_size": 32}),
}


def _fuse_tiny(model_type, sizes, tokens, layers=None):
    """The model type's config with these sizes (eager attention), random bf16 weights, FP8
    rowwise linears: fused and run on a (2, tokens) batch (`fuse_and_run`). layers: the block
    types its first layers must have."""
    cfg = transformers.AutoConfig.for_model(model_type)
    for key, value in sizes.items():
        setattr(cfg, key, value)
    cfg._attn_implementation = "eager"
    if layers is not None:
        assert cfg.layers_block_type[: len(layers)] == layers, cfg.layers_block_type
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16).eval()
    ids = torch.randint(0, 128, (2, tokens))
    return fuse_and_run(Logits(quantize_linears(model, "fp8_rowwise")), (ids,))


@pytest.mark.parametrize("name", list(MOE))
def test_moe_post_attention_norm_fuses_with_y_kept(name, reference_path):
    model_type, moe_layers, extra = MOE[name]
    sizes = dict(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, num_experts_per_tok=2, pad_token_id=0, **extra,
    )  # fmt: skip
    fused, got, want = _fuse_tiny(model_type, sizes, tokens=7)
    report = fused.fxfuse_report
    targets = [str(n.target) for n in fused.graph.nodes if n.op == "call_function"]
    assert targets.count("fxfuse.add_rms_norm_quant_with_norm.default") == moe_layers, str(report)
    assert report.counts["rmsnorm_quant"] == 2 * LAYERS, str(report)
    assert torch.equal(got, want)  # the reference path: the unfused bytes


def test_moe_norm_into_one_gemm_keeps_y_nemotron_h(reference_path):
    """Nemotron-H's MoE layer: the router reads the norm's y, the shared expert's one up_proj
    (relu², no gate) its quant, so the norm, quant and GEMM fuse as one chain that keeps y
    (`rms_norm_quant_gemm_with_norm`); the shared expert's GEMM inputs that the graph places
    after the routing's in-place writes move up past them."""
    sizes = dict(
        vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, head_dim=64,
        pad_token_id=0, moe_intermediate_size=64, moe_shared_expert_intermediate_size=64,
    )  # fmt: skip
    fused, got, want = _fuse_tiny("nemotron_h", sizes, tokens=12,
                                  layers=["linear_attention", "moe"])  # fmt: skip
    report = fused.fxfuse_report
    targets = [str(n.target) for n in fused.graph.nodes if n.op == "call_function"]
    assert targets.count("fxfuse.rms_norm_quant_gemm_with_norm.default") == 1, str(report)
    assert not any("after a consumer" in why for _, _, why in report.rejected), report.rejected
    assert torch.equal(got, want)  # the reference path: the unfused bytes
