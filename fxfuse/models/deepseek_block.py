"""A DeepSeek-style decoder block in plain torch: residual RMSNorms, a low-rank (MLA-like) query
and key/value path through quantized linears, causal attention, and a SwiGLU MLP. It is the
demo's default model; weights are random from a config."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from fxfuse.models.quant_linear import QuantLinear


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    hidden: int = 256
    q_lora_rank: int = 128
    kv_lora_rank: int = 128
    heads: int = 4
    head_dim: int = 64
    intermediate: int = 512
    layers: int = 2
    eps: float = 1e-6
    quant: str = "fp8_rowwise"


class RMSNorm(nn.Module):
    """DeepSeek / Llama spelling: fp32 statistics, round, then the weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter((1.0 + 0.1 * torch.randn(dim)).to(torch.bfloat16))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.eps)
        return self.weight * h.to(dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: BlockConfig):
        super().__init__()
        self.cfg = cfg

        def linear(n, k):
            return QuantLinear(torch.randn(n, k) / k**0.5, cfg.quant)

        qk = cfg.heads * cfg.head_dim
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        self.q_a_proj = linear(cfg.q_lora_rank, cfg.hidden)
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.eps)
        self.q_b_proj = linear(qk, cfg.q_lora_rank)
        self.kv_a_proj = linear(cfg.kv_lora_rank, cfg.hidden)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.eps)
        self.kv_b_proj = linear(2 * qk, cfg.kv_lora_rank)
        self.o_proj = linear(cfg.hidden, qk)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        self.gate_proj = linear(cfg.intermediate, cfg.hidden)
        self.up_proj = linear(cfg.intermediate, cfg.hidden)
        self.down_proj = linear(cfg.hidden, cfg.intermediate)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        b, s, _ = hidden.shape
        hidden = hidden + residual
        residual = hidden
        x = self.input_layernorm(hidden)
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        kv = self.kv_b_proj(self.kv_a_layernorm(self.kv_a_proj(x)))
        k, v = kv.split(cfg.heads * cfg.head_dim, dim=-1)

        def heads(t):
            return t.view(b, s, cfg.heads, cfg.head_dim).transpose(1, 2)

        attn = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        hidden = self.o_proj(attn.transpose(1, 2).reshape(b, s, -1))
        hidden = hidden + residual
        residual = hidden
        x = self.post_attention_layernorm(hidden)
        hidden = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return hidden, residual


class DeepSeekBlock(nn.Module):
    """`layers` decoder layers over bf16 hidden states (batch, seq, hidden); returns the final
    normed hidden state."""

    def __init__(self, cfg: BlockConfig = BlockConfig()):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        residual = torch.zeros_like(hidden)
        for layer in self.layers:
            hidden, residual = layer(hidden, residual)
        return self.norm(hidden + residual)


def build(cfg: BlockConfig = BlockConfig(), device="cpu", seed: int = 0) -> DeepSeekBlock:
    torch.manual_seed(seed)
    # Only .to(device): a dtype cast would turn the FP8 weight buffers into bf16.
    return DeepSeekBlock(cfg).to(device=device).eval()


def example_inputs(cfg, batch: int = 2, seq: int = 16, device="cpu", seed: int = 1):
    """(hidden,) bf16 (batch, seq, cfg.hidden), for any config with a `hidden` (this block's and
    deepseek_v32's). A decode step of M requests is (M, 1, hidden)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(batch, seq, cfg.hidden, generator=g).to(device=device, dtype=torch.bfloat16),)
