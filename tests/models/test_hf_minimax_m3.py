"""HF transformers MiniMax-M3 (`minimax_m3_vl`'s text model; tiny config, random weights, never
downloaded): in every sparse-attention layer the block indexer's top-k, its -inf picks padded by
their values, the throwaway-column scatter and the `(bias == 0)` keep mask expanded to keys
become one `fxfuse.topk_mask` (finite_only), and the logits match."""

import pytest
import torch

import fxfuse
from tests.helpers import Logits, assert_logits_close, fuse_and_run, fused_targets

transformers = pytest.importorskip("transformers")
LAYERS = 2


def _tiny(attn: str):
    # 4 heads (2 KV) of 16; an indexer of 2 heads of 16 over blocks of 4 keys, top-3 blocks with
    # one local block forced in: 23 tokens are 6 blocks, the early queries see fewer than 3.
    cfg = transformers.MiniMaxM3VLTextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, dense_intermediate_size=128,
        shared_intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, rotary_dim=8,
        index_n_heads=2, index_head_dim=16, index_block_size=4, index_topk_blocks=3,
        index_local_blocks=1, layer_types=["minimax_m3_sparse"] * LAYERS,
        mlp_layer_types=["dense"] * LAYERS, max_position_embeddings=128, bos_token_id=None,
        eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    return Logits(transformers.MiniMaxM3VLForCausalLM(cfg).to(torch.bfloat16).eval())


def _fuse(attn: str):
    model = _tiny(attn)
    ids = torch.randint(0, 128, (2, 23))
    return fuse_and_run(model, (ids,), capture_with_grad=True)


def _check_every_layer(fused) -> None:
    report = fused.fxfuse_report
    assert report.counts["topk_mask"] == LAYERS, str(report)
    masks = [n for n in fused.graph.nodes if n.target is torch.ops.fxfuse.topk_mask.default]
    assert len(masks) == LAYERS and fused_targets(fused).count("fxfuse.topk_mask.default") == LAYERS
    assert all(n.args[-1] is True for n in masks)  # finite_only: the -inf picks stay masked
    assert not any(n.target is torch.ops.aten.topk.default for n in fused.graph.nodes)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_block_indexer_mask_fuses_and_logits_match(attn, reference_path):
    fused, got, want = _fuse(attn)
    _check_every_layer(fused)
    assert torch.equal(got, want)


def test_kernel_in_interpreter_logits_match():
    fused, got, want = _fuse("eager")
    _check_every_layer(fused)
    assert_logits_close(got, want)


def test_torch_compile_backend_fuses_the_block_indexer(reference_path):
    """torch.compile(backend="fxfuse"): the mask fuses in Inductor's graph of every layer, and
    the logits equal the same backend's with topk_mask off."""
    model, ids = _tiny("eager"), torch.randint(0, 128, (2, 23))
    outs, counts = [], []
    for disable in ((), ("topk_mask",)):
        torch._dynamo.reset()
        backend = fxfuse.make_backend(fxfuse.FusionConfig(disable=disable))
        with torch.no_grad():
            outs.append(torch.compile(model, backend=backend)(ids))
        counts.append(fxfuse.last_report().counts.get("topk_mask"))
    assert counts == [LAYERS, None]
    assert torch.equal(outs[0], outs[1])
