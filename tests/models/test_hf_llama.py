"""HF transformers Llama (tiny config, random weights) with its Linear layers swapped for a
torch-spelled dynamic-FP8 linear: every decoder layer's two norms fuse, and the logits match."""

import pytest
import torch

from fxfuse.models.quant_linear import quantize_linears
from tests.helpers import Logits, assert_logits_close, fuse_and_run

transformers = pytest.importorskip("transformers")


def _tiny_llama(quant, layers=2):
    # hidden 256, head_dim 64, 2 KV heads: every projection is a multiple of 128 (block quant).
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-6,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    return quantize_linears(model, quant)


@pytest.mark.parametrize("quant", ["fp8_rowwise", "fp8_block"])
def test_llama_norms_fuse_and_logits_match(quant, reference_path):
    layers = 2
    model = _tiny_llama(quant, layers)
    input_ids = torch.randint(0, 128, (2, 12))

    fused, got, want = fuse_and_run(Logits(model), (input_ids,))
    report = fused.fxfuse_report
    # input_layernorm (q/k/v share one quant) and post_attention_layernorm (gate/up) per layer;
    # the final norm feeds the unquantized lm_head.
    assert report.counts["rmsnorm_quant"] == 2 * layers, str(report)
    assert_logits_close(got, want)
