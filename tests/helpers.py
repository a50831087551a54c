"""Shared test helpers."""

import torch


def bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality of two tensors of one dtype and shape (NaNs compare by their bits)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def outputs_bytes_equal(a, b) -> bool:
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    return len(a) == len(b) and all(bytes_equal(x, y) for x, y in zip(a, b))


def fused_targets(gm) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if str(n.target).startswith("fxfuse.")]
