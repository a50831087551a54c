"""DeepSeek-V3.2-style decoder layers in plain torch, the demo's default model: residual RMSNorms,
MLA attention (low-rank q, a compressed kv latent with a shared rope key, kv_b expanded per head),
the DSA "lightning indexer" choosing the top-k keys each query attends to, and a SwiGLU MLP.
Weights are random from a seed; every linear is quantized (FP8 1×128 / 128×128 blocks, FP8 per
token / per channel, or MXFP4) the way model code spells it (`quant_linear.QuantLinear`).

Shapes follow DeepSeek-V3.2 (`V32Config.deepseek_v32_tp8()` is one rank's shard at TP8); the
defaults are small enough for a CPU. Sparse attention runs as a dense SDPA under the top-k mask.
Tensor parallelism: when torch.distributed is initialised with world size > 1, q_b / kv_b /
gate_up are column-parallel (heads, intermediate), o_proj / down_proj row-parallel with an
in-place `torch.distributed.all_reduce` of their outputs; q_a, kv_a and the indexer are
replicated, as in DeepSeek's inference code.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from fxfuse.kernels import formats, gemm_ref
from fxfuse.models.deepseek_block import RMSNorm, example_inputs  # noqa: F401 - example_inputs re-exported
from fxfuse.models.quant_linear import QUANT_KINDS, QuantLinear

# Output-row alignment per kind: fp8_block stores 128×128 weight blocks; `torch._scaled_mm`
# needs N % 16 on CUDA. Rows past N are zero and sliced off (kv_a's 576 = 512 + 64 is not one).
ROW_ALIGN = {"fp8_block": 128, "fp8_rowwise": 16, "mxfp4": 16}


@dataclasses.dataclass(frozen=True)
class V32Config:
    hidden: int = 256
    q_lora_rank: int = 128
    kv_lora_rank: int = 128
    heads: int = 4
    qk_nope_head_dim: int = 64
    qk_rope_head_dim: int = 32
    v_head_dim: int = 64
    index_heads: int = 16
    index_head_dim: int = 64
    index_topk: int = 8
    intermediate: int = 512
    layers: int = 2
    eps: float = 1e-6
    rope_theta: float = 10000.0
    quant: str = "fp8_block"
    # kv_b's weight dequantized once to bf16 (vLLM's MLA keeps W_UK / W_UV so; DeepSeek's
    # model.py does it with gemm_impl="bf16"): the GEMM -> split -> cat that gemm_split_cat fuses.
    # False: kv_b is a QuantLinear like the others.
    dense_kv_b: bool = True
    # Shard over torch.distributed when it is initialised with world size > 1.
    tensor_parallel: bool = True

    def __post_init__(self):
        if self.quant not in QUANT_KINDS:
            raise ValueError(f"quant: expected one of {QUANT_KINDS}, got {self.quant!r}")
        for name in ("hidden", "q_lora_rank", "kv_lora_rank", "intermediate"):
            if getattr(self, name) % 128:
                raise ValueError(f"{name}: must be a multiple of 128 (1x128 activation groups)")
        for name in ("qk_rope_head_dim", "index_head_dim"):
            if getattr(self, name) % 2:
                raise ValueError(f"{name}: must be even (rotary halves)")
        if not 0 < self.qk_rope_head_dim <= self.index_head_dim:
            raise ValueError("qk_rope_head_dim: must be in (0, index_head_dim]")
        if self.index_topk < 1 or self.layers < 1 or self.heads < 1 or self.index_heads < 1:
            raise ValueError("index_topk, layers, heads and index_heads must be positive")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @classmethod
    def deepseek_v32_tp8(cls, **overrides) -> V32Config:
        """One rank's shard of DeepSeek-V3.2 at TP8 (128 heads / 8, dense MLP 18432 / 8)."""
        shape = dict(
            hidden=7168, q_lora_rank=1536, kv_lora_rank=512, heads=16, qk_nope_head_dim=128,
            qk_rope_head_dim=64, v_head_dim=128, index_heads=64, index_head_dim=128,
            index_topk=2048, intermediate=2304,
        )  # fmt: skip
        return cls(**{**shape, **overrides})


def tensor_parallel(cfg: V32Config) -> tuple[int, int]:
    """(rank, world size) the model shards over: (0, 1) without an initialised process group."""
    if not cfg.tensor_parallel or not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


# --- building blocks ----------------------------------------------------------------------------


class PaddedQuantLinear(QuantLinear):
    """A QuantLinear whose output rows are padded with zero weights to the kind's alignment and
    sliced back (checkpoints store such a weight with a partial last block)."""

    def __init__(self, weight: torch.Tensor, quant: str):
        n, k = weight.shape
        padded = -(-n // ROW_ALIGN[quant]) * ROW_ALIGN[quant]
        super().__init__(torch.cat([weight, weight.new_zeros(padded - n, k)]), quant)
        self.features = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out if self.features == self.out_features else out[..., : self.features]


def dequantized_weight(layer: QuantLinear) -> torch.Tensor:
    """The (N, K) fp32 values a QuantLinear's stored weight and scales stand for."""
    if layer.quant == "mxfp4":
        return formats.unpack_mxfp4(layer.weight, layer.weight_scale)
    scale = layer.weight_scale
    if layer.quant == "fp8_rowwise":
        scale = scale.reshape(-1, 1)  # stored (1, N) for _scaled_mm's scale_b
    return gemm_ref.dequant_fp8(layer.weight, scale)


class DequantizedLinear(nn.Module):
    """`F.linear` in bf16 on a weight quantized as `quant` and dequantized once at build."""

    def __init__(self, weight: torch.Tensor, quant: str):
        super().__init__()
        w = dequantized_weight(QuantLinear(weight, quant)).to(torch.bfloat16)
        self.weight = nn.Parameter(w, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


def rotary(seq: int, dim: int, theta: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (seq, dim) fp32 of positions 0..seq-1, halves layout (rotate_half)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    freqs = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (B, S, H, dim) in fp32, back in x's dtype."""
    h = x.float()
    x1, x2 = h.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (h * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


class _Weights:
    """Random fp32 weights in construction order, then quantized: every rank draws the same
    full matrices and keeps its shard, so a sharded model computes the unsharded one."""

    def __init__(self, quant: str):
        self.quant = quant

    @staticmethod
    def draw(n: int, k: int) -> torch.Tensor:
        return torch.randn(n, k) / k**0.5

    def linear(self, weight: torch.Tensor) -> QuantLinear:
        return PaddedQuantLinear(weight, self.quant)


# --- the layer ----------------------------------------------------------------------------------


class Indexer(nn.Module):
    """DSA lightning indexer: per query, sum over index heads of relu(q·k) · w_head, over every
    key; returns the top-`index_topk` key ids of the causally masked scores."""

    def __init__(self, cfg: V32Config, weights: _Weights):
        super().__init__()
        self.cfg = cfg
        hi, di = cfg.index_heads, cfg.index_head_dim
        self.wq_b = weights.linear(weights.draw(hi * di, cfg.q_lora_rank))
        self.wk = weights.linear(weights.draw(di, cfg.hidden))
        self.k_norm = nn.LayerNorm(di, dtype=torch.bfloat16)
        self.weights_proj = weights.linear(weights.draw(hi, cfg.hidden))

    def forward(self, x, q_latent, cos, sin, causal_bias):
        cfg = self.cfg
        b, s, _ = x.shape
        rope = cfg.qk_rope_head_dim
        q = self.wq_b(q_latent).view(b, s, cfg.index_heads, cfg.index_head_dim)
        q_pe, q_nope = torch.split(q, [rope, cfg.index_head_dim - rope], dim=-1)
        q = torch.cat([apply_rotary(q_pe, cos, sin), q_nope], dim=-1)
        k = self.k_norm(self.wk(x))
        k_pe, k_nope = torch.split(k, [rope, cfg.index_head_dim - rope], dim=-1)
        k = torch.cat([apply_rotary(k_pe.unsqueeze(2), cos, sin).squeeze(2), k_nope], dim=-1)
        head_weights = self.weights_proj(x).float() * (cfg.index_heads * cfg.index_head_dim) ** -0.5
        # q·k in bf16 (DeepSeek runs it in FP8), the weighted sum over heads in fp32.
        logits = torch.einsum("bshd,btd->bsht", q, k).float().relu()
        index_scores = (logits * head_weights.unsqueeze(-1)).sum(dim=2) + causal_bias
        return index_scores.topk(min(cfg.index_topk, s), dim=-1).indices


class MLAttention(nn.Module):
    def __init__(self, cfg: V32Config, weights: _Weights, rank: int, world: int):
        super().__init__()
        self.cfg, self.world = cfg, world
        self.heads = cfg.heads // world
        own = slice(rank * self.heads, (rank + 1) * self.heads)

        def per_head_rows(n_per_head, k):  # column-parallel: this rank's heads' output rows
            w = weights.draw(cfg.heads * n_per_head, k)
            return w.view(cfg.heads, n_per_head, k)[own].reshape(-1, k)

        self.q_a_proj = weights.linear(weights.draw(cfg.q_lora_rank, cfg.hidden))
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.eps)
        self.q_b_proj = weights.linear(per_head_rows(cfg.qk_head_dim, cfg.q_lora_rank))
        self.kv_a_proj = weights.linear(
            weights.draw(cfg.kv_lora_rank + cfg.qk_rope_head_dim, cfg.hidden)
        )
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.eps)
        kv_b = per_head_rows(cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.kv_lora_rank)
        self.kv_b_proj = (
            DequantizedLinear(kv_b, cfg.quant) if cfg.dense_kv_b else weights.linear(kv_b)
        )
        o = weights.draw(cfg.hidden, cfg.heads * cfg.v_head_dim)  # row-parallel: own columns
        o = o.view(cfg.hidden, cfg.heads, cfg.v_head_dim)[:, own].reshape(cfg.hidden, -1)
        self.o_proj = weights.linear(o)
        self.indexer = Indexer(cfg, weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg, h = self.cfg, self.heads
        b, s, _ = x.shape
        nope, rope = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        cos, sin = rotary(s, rope, cfg.rope_theta, x.device)

        q_latent = self.q_a_layernorm(self.q_a_proj(x))
        q = self.q_b_proj(q_latent).view(b, s, h, cfg.qk_head_dim)
        q_nope, q_pe = torch.split(q, [nope, rope], dim=-1)
        q = torch.cat([q_nope, apply_rotary(q_pe, cos, sin)], dim=-1)

        kv_latent, k_pe = torch.split(self.kv_a_proj(x), [cfg.kv_lora_rank, rope], dim=-1)
        k_pe = apply_rotary(k_pe.view(b, s, 1, rope), cos, sin)  # one rope key, shared by heads
        kv = self.kv_b_proj(self.kv_a_layernorm(kv_latent)).view(b, s, h, nope + cfg.v_head_dim)
        k_nope, v = torch.split(kv, [nope, cfg.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(b, s, h, rope)], dim=-1)

        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        causal_bias = torch.zeros(s, s, device=x.device).masked_fill(~causal, float("-inf"))
        topk_indices = self.indexer(x, q_latent, cos, sin, causal_bias)
        # HF DeepSeek-V3.2's spelling: True where a key is outside the query's top-k.
        index_mask = torch.ones(b, s, s, dtype=torch.bool, device=x.device).scatter(
            -1, topk_indices, False
        )
        allowed = causal & ~index_mask
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=allowed[:, None]
        )
        out = self.o_proj(attn.transpose(1, 2).reshape(b, s, h * cfg.v_head_dim))
        if self.world > 1:
            dist.all_reduce(out)
        return out


class MLP(nn.Module):
    """SwiGLU with gate and up in one column-parallel GEMM (vLLM / SGLang's gate_up_proj)."""

    def __init__(self, cfg: V32Config, weights: _Weights, rank: int, world: int):
        super().__init__()
        self.world = world
        part = cfg.intermediate // world
        own = slice(rank * part, (rank + 1) * part)
        gate = weights.draw(cfg.intermediate, cfg.hidden)[own]
        up = weights.draw(cfg.intermediate, cfg.hidden)[own]
        self.gate_up_proj = weights.linear(torch.cat([gate, up]))
        self.down_proj = weights.linear(weights.draw(cfg.hidden, cfg.intermediate)[:, own])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        out = self.down_proj(F.silu(gate) * up)
        if self.world > 1:
            dist.all_reduce(out)
        return out


class DecoderLayer(nn.Module):
    def __init__(self, cfg: V32Config, weights: _Weights, rank: int, world: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        self.self_attn = MLAttention(cfg, weights, rank, world)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.eps)
        self.mlp = MLP(cfg, weights, rank, world)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor):
        hidden = hidden + residual
        residual = hidden
        hidden = self.self_attn(self.input_layernorm(hidden))
        hidden = hidden + residual
        residual = hidden
        hidden = self.mlp(self.post_attention_layernorm(hidden))
        return hidden, residual


class DeepSeekV32(nn.Module):
    """`layers` decoder layers over bf16 hidden states (batch, seq, hidden); returns the final
    normed hidden state."""

    def __init__(self, cfg: V32Config = V32Config()):
        super().__init__()
        rank, world = tensor_parallel(cfg)
        if cfg.heads % world or cfg.intermediate % world:
            raise ValueError(
                f"cfg: heads {cfg.heads} and intermediate {cfg.intermediate} must divide by the "
                f"tensor-parallel world size {world}"
            )
        # The row-parallel GEMMs' K per rank: 1x128 activation groups, or MXFP4 blocks of 32.
        k_align = {"fp8_block": 128, "mxfp4": 32}.get(cfg.quant, 16)
        for name, k in (("heads * v_head_dim", cfg.heads * cfg.v_head_dim // world),
                        ("intermediate", cfg.intermediate // world)):  # fmt: skip
            if k % k_align:
                raise ValueError(
                    f"cfg: {name} per rank is {k}; {cfg.quant} needs a multiple of {k_align}"
                )
        self.cfg, self.tp_rank, self.tp_world = cfg, rank, world
        weights = _Weights(cfg.quant)
        self.layers = nn.ModuleList(DecoderLayer(cfg, weights, rank, world) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        residual = torch.zeros_like(hidden)
        for layer in self.layers:
            hidden, residual = layer(hidden, residual)
        return self.norm(hidden + residual)


def build(cfg: V32Config = V32Config(), device="cpu", seed: int = 0) -> DeepSeekV32:
    torch.manual_seed(seed)
    # Only .to(device): a dtype cast would turn the FP8 weight buffers into bf16.
    return DeepSeekV32(cfg).to(device=device).eval()
