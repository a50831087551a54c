"""fxfuse.models.hf.patch_quantized_linears on a tiny HF Llama whose linears are HF FP8Linear modules
(random FP8 weights and 128×128 block scales, as a loaded checkpoint has them): every decoder
layer's norms fuse and the logits match a float64 dequantize-then-matmul reference.

HF's own FP8Linear.forward needs the `kernels` hub kernel (finegrained-fp8, GPU), so on CPU the
reference replaces that call with float64 math on the same quantized weights."""

import pytest
import torch

import fxfuse
from fxfuse.models.hf import FP8BlockLinear, MXFP4Linear, patch_quantized_linears
from tests.helpers import Logits, assert_logits_close, fused_targets

transformers = pytest.importorskip("transformers")
finegrained_fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")
FP8Linear = finegrained_fp8.FP8Linear
FP8_MAX = 448.0
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def _block_fp8_linear(linear: torch.nn.Linear) -> FP8Linear:
    """The FP8Linear a fine-grained FP8 checkpoint of `linear` loads into (ceil-sized scale grid)."""
    n, k = linear.weight.shape
    module = FP8Linear(k, n, block_size=(128, 128), has_bias=linear.bias is not None)
    nb = -(-n // 128)
    w = torch.nn.functional.pad(linear.weight.detach().float(), (0, 0, 0, nb * 128 - n))
    blocks = w.reshape(nb, 128, k // 128, 128)
    scale = blocks.abs().amax((1, 3), keepdim=True).clamp(min=1e-12) / FP8_MAX
    q = (blocks / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).reshape(-1, k)[:n]
    module.weight = torch.nn.Parameter(q, requires_grad=False)
    module.weight_scale_inv = torch.nn.Parameter(scale.reshape(nb, k // 128))
    if linear.bias is not None:
        module.bias = torch.nn.Parameter(linear.bias.detach().clone())
    return module


def _dequantized_weight(module: FP8Linear) -> torch.Tensor:
    """float64 weight of an HF FP8Linear (fp8 blocks, or FP4 bytes with e8m0 1×32 scales)."""
    w, s = module.weight, module.weight_scale_inv.double()
    if w.dtype == torch.int8:
        lut = torch.tensor(E2M1, dtype=torch.float64)
        u8 = w.view(torch.uint8).long()
        vals = torch.stack([lut[u8 & 0xF], lut[u8 >> 4]], -1).reshape(w.shape[0], -1)
        return vals * s.repeat_interleave(32, 1)
    if module.block_size is None:
        return w.double() * s
    n, k = w.shape
    return w.double() * s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]


def _float64_fp8_forward(module: FP8Linear, x: torch.Tensor) -> torch.Tensor:
    """HF's dynamic fine-grained FP8 linear: 1×128 activation groups (per token without blocks),
    then the matmul in float64."""
    rows = x.reshape(-1, module.in_features).double()
    group = module.in_features if module.block_size is None else module.block_size[1]
    g = rows.view(rows.shape[0], -1, group)
    scale = g.abs().amax(-1, keepdim=True).clamp(min=1e-10) / FP8_MAX
    x_deq = ((g / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).double() * scale)
    out = x_deq.reshape(rows.shape) @ _dequantized_weight(module).t()
    if module.bias is not None:
        out = out + module.bias.double()
    return out.to(x.dtype).reshape(*x.shape[:-1], module.out_features)


def _to_fp8_linears(module: torch.nn.Module, skip=("lm_head",)) -> int:
    converted = 0
    for name, child in list(module.named_children()):
        if type(child) is torch.nn.Linear and name not in skip:
            setattr(module, name, _block_fp8_linear(child))
            converted += 1
        else:
            converted += _to_fp8_linears(child, skip)
    return converted


def _tiny_fp8_llama(layers=2):
    # hidden 128, head_dim 32, 2 KV heads: k_proj / v_proj have N = 64, one partial scale row.
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-6,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    assert _to_fp8_linears(model) == 7 * layers
    return model


def test_fp8_llama_patched_fuses_and_logits_match(reference_path, monkeypatch):
    layers = 2
    model = _tiny_fp8_llama(layers)
    fp8_modules = {n: m for n, m in model.named_modules() if type(m) is FP8Linear}
    input_ids = torch.randint(0, 128, (2, 12))
    wrapped = Logits(model)
    with torch.no_grad(), monkeypatch.context() as patch:
        patch.setattr(FP8Linear, "forward", _float64_fp8_forward)
        want = wrapped(input_ids)

    assert patch_quantized_linears(model) == 7 * layers
    for name, old in fp8_modules.items():
        new = model.get_submodule(name)
        assert isinstance(new, FP8BlockLinear)
        # the checkpoint's tensors themselves, not copies
        assert new.weight is old.weight and new.weight_scale_inv is old.weight_scale_inv
    assert not any(type(m) is FP8Linear for m in model.modules())

    with torch.no_grad():
        fused = fxfuse.apply_fusions(wrapped, (input_ids,))
        got = fused(input_ids)
    report = fused.fxfuse_report
    # Per layer: input_layernorm (q/k/v share one quant) and post_attention_layernorm (gate/up)
    # fuse with their quant; o_proj and down_proj fuse with theirs. With 2 * layers fused norms
    # and only the final norm (feeding the unquantized lm_head) left, every layer's norms fused.
    assert report.counts["rmsnorm_quant"] == 2 * layers, str(report)
    assert report.counts["quant_gemm"] == 2 * layers, str(report)
    targets = fused_targets(fused)
    assert targets.count("fxfuse.add_rms_norm_quant.default") == 2 * layers - 1, targets
    assert targets.count("fxfuse.rms_norm_quant.default") == 1, targets
    assert targets.count("fxfuse.add_rms_norm.default") == 1, targets
    assert targets.count("fxfuse.quant_gemm.default") == 2 * layers, targets
    assert "fxfuse.quant_fp8.default" not in targets, targets
    assert_logits_close(got, want)


def _fp4_fp8_linear(n, k):
    """An FP8Linear holding a DeepSeek-V4-style FP4 checkpoint weight: int8 (N, K/2), e8m0 (N, K/32)."""
    module = FP8Linear(k, n, block_size=(128, 128))
    module.weight = torch.nn.Parameter(
        torch.randint(-128, 128, (n, k // 2), dtype=torch.int8), requires_grad=False
    )
    exps = torch.randint(120, 130, (n, k // 32), dtype=torch.uint8)
    module.weight_scale_inv = torch.nn.Parameter(
        exps.view(torch.float8_e8m0fnu), requires_grad=False
    )
    return module


@pytest.mark.parametrize("kind", ["fp8_tensorwise", "fp4"])
def test_single_module_variants_match_float64(kind, reference_path):
    n, k = 96, 128
    if kind == "fp4":
        old = _fp4_fp8_linear(n, k)
    else:
        old = FP8Linear(k, n, block_size=None)
        old.weight = torch.nn.Parameter(
            (torch.randn(n, k) * 100).clamp(-448, 448).to(torch.float8_e4m3fn), requires_grad=False
        )
        old.weight_scale_inv = torch.nn.Parameter(torch.tensor(0.01))
    holder = torch.nn.Sequential(old)
    assert patch_quantized_linears(holder) == 1
    new = holder[0]
    x = torch.randn(3, 5, k, dtype=torch.bfloat16)
    with torch.no_grad():
        got = new(x)
    if kind == "fp4":
        assert isinstance(new, MXFP4Linear)
        # byte views of the checkpoint tensors
        assert new.weight.data_ptr() == old.weight.data_ptr() and new.weight.dtype == torch.uint8
        assert new.weight_scale_inv.data_ptr() == old.weight_scale_inv.data_ptr()
        # MXFP4 activations: compare against the same quantized activation, float64 matmul.
        q, s = fxfuse.ops.quant_mxfp4(x.reshape(-1, k))
        lut = torch.tensor(E2M1, dtype=torch.float64)
        codes = torch.stack([lut[q.long() & 0xF], lut[q.long() >> 4]], -1).reshape(15, k)
        x_deq = codes * torch.exp2(s.double() - 127).repeat_interleave(32, 1)
        want = (x_deq @ _dequantized_weight(old).t()).reshape(3, 5, n)
    else:
        assert isinstance(new, FP8BlockLinear) and new.weight is old.weight
        want = _float64_fp8_forward(old, x).double()
    rel = ((got.double() - want).norm() / want.norm()).item()
    assert rel <= 1e-2, rel


def test_unsupported_modules_stay_and_warn():
    static = FP8Linear(128, 128, block_size=(128, 128), activation_scheme="static")
    odd_block = FP8Linear(128, 128, block_size=(64, 64))
    odd_k = FP8Linear(96, 128, block_size=(128, 128))
    plain = torch.nn.Linear(128, 128)
    holder = torch.nn.Sequential(static, odd_block, odd_k, plain)
    with pytest.warns(UserWarning) as record:
        assert patch_quantized_linears(holder) == 0
    reasons = " ".join(str(w.message) for w in record)
    assert "static activation scale" in reasons
    assert "block_size (64, 64)" in reasons
    assert "in_features 96" in reasons
    assert [type(m) for m in holder] == [FP8Linear, FP8Linear, FP8Linear, torch.nn.Linear]


def test_bad_model_argument():
    with pytest.raises(ValueError, match="model"):
        patch_quantized_linears("not a module")
