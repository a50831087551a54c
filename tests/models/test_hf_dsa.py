"""HF transformers DeepSeek-V3.2 and GLM-5 (`glm_moe_dsa`), the DSA models (tiny configs, random
weights, never downloaded): in every layer the indexer's top-k → boolean mask becomes one
`fxfuse.topk_mask` and kv_b's GEMM → split → cat one `fxfuse.gemm_split_cat`, and the logits
match. The indexer runs under `torch.no_grad()` and casts its indices to int32 and back; the
capture is made with grad on, as a user would call `apply_fusions`. DeepSeek-V4's compressed
sparse attention: its Lightning Indexer's top-k → causal -1 → (B, 1, S, T) bias."""

import pytest
import torch

import fxfuse
from tests.helpers import (
    Logits,
    assert_kv_b_feeds_only_split_cat,
    assert_logits_close,
    fuse_and_run,
    fused_targets,
)

transformers = pytest.importorskip("transformers")
LAYERS = 2
TOPK = 4  # of 7 keys a sequence: rows 0-3 (causal) keep every visible key and masked ones


# 4 heads of qk_nope 16 | v 16 from a 32-wide latent, rope 8; an indexer of 4 heads of 16.
TINY = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
    num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=4,
    n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
    first_k_dense_replace=LAYERS, q_lora_rank=48, kv_lora_rank=32, qk_rope_head_dim=8,
    qk_nope_head_dim=16, v_head_dim=16, max_position_embeddings=64, index_topk=TOPK,
    index_head_dim=16, index_n_heads=4,
)  # fmt: skip


def _tiny(name: str, attn: str, indexer_types=None):
    common = dict(TINY)
    if name == "deepseek_v32":
        cfg = transformers.DeepseekV32Config(**common, head_dim=8)
        cls = transformers.DeepseekV32ForCausalLM
    else:  # every layer runs its own indexer ("full") unless told
        layers = len(indexer_types or ()) or LAYERS
        common["num_hidden_layers"] = common["first_k_dense_replace"] = layers
        types = indexer_types or ["full"] * layers
        cfg = transformers.GlmMoeDsaConfig(**common, indexer_types=types)
        cls = transformers.GlmMoeDsaForCausalLM
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    return Logits(cls(cfg).to(torch.bfloat16).eval())


def _fuse(name: str, attn: str):
    model = _tiny(name, attn)
    ids = torch.randint(0, 128, (2, 7))
    return fuse_and_run(model, (ids,), capture_with_grad=True)  # the indexer's no_grad region


def _check_every_layer(fused) -> None:
    counts = fused.fxfuse_report.counts
    assert counts["topk_mask"] == LAYERS, str(fused.fxfuse_report)
    assert counts["gemm_split_cat"] == LAYERS, str(fused.fxfuse_report)
    assert fused_targets(fused).count("fxfuse.topk_mask.default") == LAYERS
    assert not any(n.target is torch.ops.aten.topk.default for n in fused.graph.nodes)
    assert_kv_b_feeds_only_split_cat(fused, LAYERS)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["deepseek_v32", "glm_moe_dsa"])
def test_indexer_mask_and_kv_b_fuse_and_logits_match(name, attn, reference_path):
    fused, got, want = _fuse(name, attn)
    _check_every_layer(fused)
    # The reference ops are the unfused spelling: the same bytes (the rows that keep masked
    # keys pick them among equal scores, and the causal mask drops them either way).
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", ["deepseek_v32", "glm_moe_dsa"])
def test_kernels_in_interpreter_logits_match(name):
    fused, got, want = _fuse(name, "eager")
    _check_every_layer(fused)
    assert_logits_close(got, want)


def test_glm5_shared_indexer_layer_reuses_the_fused_mask(reference_path):
    """GLM-5's "shared" layers rebuild the mask from the previous layer's indices: the two mask
    chains merge into one fused op per full layer."""
    model = _tiny("glm_moe_dsa", "eager", indexer_types=["full", "shared", "full"])
    ids = torch.randint(0, 128, (2, 7))
    fused, got, want = fuse_and_run(model, (ids,), capture_with_grad=True)
    assert fused.fxfuse_report.counts["topk_mask"] == 2, str(fused.fxfuse_report)
    assert fused_targets(fused).count("fxfuse.topk_mask.default") == 2
    assert torch.equal(got, want)


def _tiny_v4():
    # Compressed sparse attention in both layers (entries of 4 tokens), an indexer of 16 heads
    # of 16 keeping 3 entries: with few heads, relu(q·k) = 0 in every head ties many scores,
    # and the fused and unfused top-k may keep different tied entries (SPEC §5 allows it).
    cfg = transformers.DeepseekV4Config(
        vocab_size=128, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=1, head_dim=32, q_lora_rank=32,
        num_experts_per_tok=2, n_routed_experts=4, n_shared_experts=1,
        layer_types=["compressed_sparse_attention"] * LAYERS, mlp_layer_types=["moe"] * LAYERS,
        hc_mult=2, hc_sinkhorn_iters=2, sliding_window=8, o_groups=2, o_lora_rank=16,
        index_n_heads=16, index_head_dim=16, index_topk=3, max_position_embeddings=128,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return Logits(transformers.DeepseekV4ForCausalLM(cfg).to(torch.bfloat16).eval())


@pytest.mark.parametrize("path", ["reference", "kernel"])
def test_deepseek_v4_indexer_bias_fuses_and_logits_match(path, monkeypatch):
    if path == "reference":
        monkeypatch.setenv("TRITON_INTERPRET", "0")
    model = _tiny_v4()
    ids = torch.randint(0, 128, (2, 33))  # 8 compressed entries; the first queries see none
    fused, got, want = fuse_and_run(model, (ids,), capture_with_grad=True)
    assert fused.fxfuse_report.counts["topk_mask"] == LAYERS, str(fused.fxfuse_report)
    assert fused_targets(fused).count("fxfuse.topk_mask.default") == LAYERS
    # The top-k left are the MoE routers' (2 experts a token), not the indexers' (3 entries).
    left = [n.args[1] for n in fused.graph.nodes if n.target is torch.ops.aten.topk.default]
    assert left and set(left) == {2}
    if path == "reference":
        assert torch.equal(got, want)
    assert_logits_close(got, want)


def _compiled_with_and_without_fusions(model, ids):
    """The model under torch.compile(backend="fxfuse"), then again with the indexer's and
    kv_b's patterns off: ([logits], [report counts]) of the two."""
    outs, counts = [], []
    for disable in ((), ("topk_mask", "gemm_split_cat")):
        torch._dynamo.reset()
        backend = fxfuse.make_backend(fxfuse.FusionConfig(disable=disable))
        with torch.no_grad():
            outs.append(torch.compile(model, backend=backend)(ids))
        counts.append(fxfuse.last_report().counts)
    return outs, counts


@pytest.mark.parametrize("name", ["deepseek_v32", "deepseek_v4"])
def test_torch_compile_backend_fuses_the_indexer(name, reference_path):
    """torch.compile(backend="fxfuse"): the indexer's top-k → mask (and V3.2's kv_b) fuse in
    Inductor's graph, and the logits equal the same backend's with those two patterns off (the
    unfused chain compiled by Inductor; ties apart, the masks are the same)."""
    model = _tiny_v4() if name == "deepseek_v4" else _tiny(name, "eager")
    ids = torch.randint(0, 128, (2, 33 if name == "deepseek_v4" else 7))
    outs, counts = _compiled_with_and_without_fusions(model, ids)
    assert counts[0]["topk_mask"] == LAYERS, counts
    assert counts[0]["gemm_split_cat"] == (LAYERS if name == "deepseek_v32" else 0), counts
    assert torch.equal(outs[0], outs[1])


# Other DSA models in HF transformers: (model type, config fields, indexers, MLA layers). Each
# layer with its own indexer fuses its top-k → mask; every MLA layer its kv_b.
OTHER_DSA = {
    # A.X K2: an indexer in every layer
    "axk2": ({"layer_types": ["indexed_attention"] * LAYERS}, LAYERS, LAYERS),
    # dots.3 note: DSA layers between sliding-window MLA layers
    "dots3_note": ({"layer_types": ["indexed_attention", "sliding_attention"]}, 1, LAYERS),
    # HY-V4: a "shared" layer reuses the previous full layer's top-k
    "hy_v4": ({"layer_types": ["indexed_attention"] * LAYERS,
               "indexer_types": ["full", "shared"]}, 1, LAYERS),
    # Mistral Large 4 (its text model inside the multimodal one): no KV shared across layers
    "mistral_large4": ({"layer_types": ["indexed_attention"] * LAYERS,
                        "indexer_types": ["full"] * LAYERS, "kv_source_layers": [0, 1],
                        "no_rope_layers": [1, 1]}, LAYERS, LAYERS),
}  # fmt: skip


def _tiny_other(model_type: str):
    top = cfg = transformers.AutoConfig.for_model(model_type)
    if getattr(cfg, "text_config", None) is not None:
        cfg = cfg.text_config
    fields = dict(
        TINY, head_dim=8, qk_head_dim=24, pad_token_id=0, mlp_layer_types=["dense"] * LAYERS
    )
    for key, value in {**fields, **OTHER_DSA[model_type][0]}.items():
        setattr(cfg, key, value)
    top._attn_implementation = cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    try:  # the text model where AutoModelForCausalLM maps its config
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    except ValueError:  # else the multimodal model, its vision tower shrunk (never run)
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, head_dim=16, image_size=28)  # fmt: skip
        for key, value in vision.items():
            setattr(top.vision_config, key, value)
        model = transformers.AutoModelForImageTextToText.from_config(top)
    return Logits(model.to(torch.bfloat16).eval())


@pytest.mark.parametrize("model_type", list(OTHER_DSA))
def test_other_dsa_models_fuse_indexer_and_kv_b(model_type, reference_path):
    _, indexers, mla_layers = OTHER_DSA[model_type]
    ids = torch.randint(0, 128, (2, 7))
    fused, got, want = fuse_and_run(_tiny_other(model_type), (ids,), capture_with_grad=True)
    assert fused.fxfuse_report.counts["topk_mask"] == indexers, str(fused.fxfuse_report)
    assert fused_targets(fused).count("fxfuse.topk_mask.default") == indexers
    assert not any(n.target is torch.ops.aten.topk.default for n in fused.graph.nodes)
    assert_kv_b_feeds_only_split_cat(fused, mla_layers)
    assert torch.equal(got, want)


def test_hy_v4_shared_layer_fuses_under_torch_compile(reference_path):
    """Inductor's post-grad graph gives each layer's `new_ones` a `full` of its own; the shared
    layer's mask chain still merges with the full layer's, and one fused op feeds both."""
    model = _tiny_other("hy_v4")
    ids = torch.randint(0, 128, (2, 7))
    outs, counts = _compiled_with_and_without_fusions(model, ids)
    assert counts[0]["topk_mask"] == 1, counts
    assert counts[0]["gemm_split_cat"] == LAYERS, counts
    assert torch.equal(outs[0], outs[1])
