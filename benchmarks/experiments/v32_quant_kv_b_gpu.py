"""GPU check of the quantized kv_b split-cat in a whole model: the bundled DeepSeek-V3.2 layer
with kv_b a quantized linear (dense_kv_b=False) fused by apply_fusions on CUDA, at token counts
on each side of the ops' dispatch (Triton epilogue, `_scaled_mm` + cat_pieces, FP8 head tiles),
against the same fusion with gemm_split_cat disabled (the change alone; ≤ 1e-2 relative) and,
for context, against the unfused model (on the GPU every fused kernel rounds a little
differently from the model's torch ops, and the indexer's top-k turns that into ~2e-2 for
Inductor's compile too: results/layer.json). Prints which kv_b path ran.

    PYTHONPATH=. python benchmarks/experiments/v32_quant_kv_b_gpu.py
"""

from __future__ import annotations

import torch

import fxfuse
from fxfuse.kernels import gemm_split_cat as kernels
from fxfuse.models import deepseek_v32

# 4 heads of nope 64 | v 64 (one head tile 128 wide), rope 32, kv latent 256.
CONFIG = dict(
    hidden=512, q_lora_rank=256, kv_lora_rank=256, heads=4, qk_nope_head_dim=64,
    qk_rope_head_dim=32, v_head_dim=64, index_heads=8, index_head_dim=64, index_topk=64,
    intermediate=512, layers=1, dense_kv_b=False,
)  # fmt: skip
CASES = [("fp8_rowwise", 1, 16), ("fp8_rowwise", 4, 512), ("fp8_block", 2, 256)]


def main() -> None:
    calls = []
    original = kernels.fp8_head_tiles

    def counted(*args, **kwargs):
        got = original(*args, **kwargs)
        calls.append(got is not None)
        return got

    kernels.fp8_head_tiles = counted
    for quant, batch, seq in CASES:
        cfg = deepseek_v32.V32Config(**CONFIG, quant=quant)
        model = deepseek_v32.build(cfg, device="cuda")
        inputs = tuple(
            t.cuda() for t in deepseek_v32.example_inputs(cfg, batch=batch, seq=seq)
        )
        calls.clear()
        off = fxfuse.FusionConfig(disable=("gemm_split_cat",))
        with torch.no_grad():
            fused = fxfuse.apply_fusions(model, inputs)
            got = fused(*inputs)
            without = fxfuse.apply_fusions(model, inputs, config=off)(*inputs)
            eager = model(*inputs)
        counts = fused.fxfuse_report.counts
        rel = _rel(got, without)
        print(
            f"{quant:<12} M={batch * seq:>5}  gemm_split_cat={counts['gemm_split_cat']} "
            f"head tiles={sum(calls)}  vs without it {rel:.2e} "
            f"{'ok' if rel <= 1e-2 else 'FAIL'}  (vs eager {_rel(got, eager):.2e}, without it vs "
            f"eager {_rel(without, eager):.2e})",
            flush=True,
        )


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


if __name__ == "__main__":
    main()
