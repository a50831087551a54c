"""HF transformers' other MLA models (tiny configs, random weights, never downloaded): MiniCPM3,
LongCat-Flash, Sarvam-MLA, Kimi-Linear (its full-attention layers), DeepSeek-V2, GLM-4.7-Flash
(glm4_moe_lite), Youtu-LLM, A.X K1, Mistral 4 and Ling's hybrid (bailing_hybrid, its MLA layers)
spell the kv_b GEMM → split → cat as DeepSeek-V3 does, with their own head widths; each kv_b
becomes one `fxfuse.gemm_split_cat` and the logits are the same bytes on the reference path."""

import pytest
import torch

from tests.helpers import (
    Logits,
    assert_kv_b_feeds_only_split_cat,
    assert_logits_close,
    fuse_and_run,
)

transformers = pytest.importorskip("transformers")

# 4 heads of qk_nope 16 | v 16 from a 32-wide latent, rope 8; dense MLPs where the model has a
# switch for them (the MoE router is not what is tested).
MLA = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48,
    qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, head_dim=8, qk_head_dim=24,
    max_position_embeddings=64, pad_token_id=0,
)  # fmt: skip
SMALL_MOE = dict(
    moe_intermediate_size=32, expert_ffn_hidden_size=32, ffn_hidden_size=32, n_routed_experts=4,
    num_experts=4, num_experts_per_tok=2, first_k_dense_replace=2, n_group=1, topk_group=1,
)  # fmt: skip
# model type -> the layers with an MLA kv_b
MODELS = {
    "minicpm3": 2, "longcat_flash": 2, "sarvam_mla": 2, "kimi_linear": 1, "deepseek_v2": 2,
    "glm4_moe_lite": 2, "youtu": 2, "axk1": 2, "mistral4": 2, "bailing_hybrid": 1,
}  # fmt: skip
# Per model: the config fields that differ from MLA / SMALL_MOE.
FIXES = {
    # one linear-attention (KDA) layer, one MLA layer
    "kimi_linear": dict(layer_types=["linear_attention", "full_attention"],
                        mlp_layer_types=["dense", "dense"]),
    # one linear-attention layer, one MLA layer (the default puts MLA in every sixth)
    "bailing_hybrid": dict(layer_types=["linear_attention", "full_attention"],
                           mlp_layer_types=["dense", "dense"], linear_head_dim=16,
                           linear_num_heads=4),
    # rope on half of head_dim: 16 · 0.5 = the rope width 8
    "mistral4": dict(head_dim=16),
}  # fmt: skip
# Models that AutoModelForCausalLM does not map.
CLASSES = {"mistral4": "Mistral4ForCausalLM"}


def _tiny(model_type: str):
    cfg = transformers.AutoConfig.for_model(model_type)
    for key, value in MLA.items():
        setattr(cfg, key, value)
    for key, value in SMALL_MOE.items():
        if hasattr(cfg, key):
            setattr(cfg, key, value)
    for key, value in FIXES.get(model_type, {}).items():
        setattr(cfg, key, value)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    if model_type in CLASSES:
        model = getattr(transformers, CLASSES[model_type])(cfg)
    else:
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return model.to(torch.bfloat16).eval()


def _fuse(model_type: str):
    ids = torch.randint(0, 128, (2, 7))
    fused, got, want = fuse_and_run(Logits(_tiny(model_type)), (ids,))
    layers = MODELS[model_type]
    assert fused.fxfuse_report.counts["gemm_split_cat"] == layers, str(fused.fxfuse_report)
    assert_kv_b_feeds_only_split_cat(fused, layers)
    return got, want


@pytest.mark.parametrize("model_type", list(MODELS))
def test_kv_b_fuses_and_logits_are_the_same_bytes(model_type, reference_path):
    got, want = _fuse(model_type)
    assert torch.equal(got, want)


def test_minicpm3_kv_b_kernel_in_interpreter():
    got, want = _fuse("minicpm3")
    assert_logits_close(got, want)


def test_glm5_next_kv_b_without_rope_fuses_as_a_split(reference_path):
    """GLM-5.3-Flash (`glm5_next`, the text model inside the multimodal one): its MLA has no rope
    part, so HF's key buffer is a copy of k_nope alone and the kv_b becomes one `fxfuse.gemm_split`
    (both pieces written by the GEMM, the copy gone). Its indexer ranks pooled keys and gathers
    each chosen pool's token indices: that chain is not matched."""
    top = transformers.AutoConfig.for_model("glm5_next")
    cfg = top.text_config
    fields = dict(
        MLA, qk_rope_head_dim=0, head_dim=0, qk_head_dim=16, linear_head_dim=16,
        linear_num_heads=4, hc_mult=2, index_kpool=2, index_topk=4, index_head_dim=16,
        index_n_heads=4, layer_types=["linear_attention", "indexed_attention"],
        mlp_layer_types=["dense", "dense"], indexer_types=["full", "full"],
    )  # fmt: skip
    for key, value in fields.items():
        setattr(cfg, key, value)
    # the vision tower shrunk (never run)
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
                  projection_intermediate_size=64)  # fmt: skip
    for key, value in vision.items():
        setattr(top.vision_config, key, value)
    top._attn_implementation = cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForImageTextToText.from_config(top).to(torch.bfloat16).eval()
    fused, got, want = fuse_and_run(Logits(model), (torch.randint(0, 128, (2, 7)),))
    assert fused.fxfuse_report.counts["gemm_split_cat"] == 1, str(fused.fxfuse_report)
    assert_kv_b_feeds_only_split_cat(fused, 1, op="gemm_split")
    assert torch.equal(got, want)
