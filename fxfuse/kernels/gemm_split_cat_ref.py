"""Torch references of GEMM → split → cat (SPEC §3), spelled like the model code they replace.

    c       = (x @ wᵀ).view(M, D, S1 + S2)         x (M, K), w (N, K) with N = D·(S1 + S2)
    c1, c2  = split(c, [S1, S2], -1)
    out     = cat([c1, y], -1)                      y (M, D, S3), any strides (often an expand)
    returns (out (M, D, S1 + S3), c2 (M, D, S2)), both contiguous

`gemm_split_ref` is the same without the cat: the pieces of `split(c, sizes, -1)`, each contiguous.
`split_cat_of` / `split_of` are the part after the GEMM, for any GEMM (the quantized producers).
The GEMM runs in x.dtype as torch runs it; tests compare against a float64 reference instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gemm_split_cat_ref(
    x: torch.Tensor, w: torch.Tensor, d: int, s1: int, s2: int, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return split_cat_of(F.linear(x, w), d, s1, s2, y)


def gemm_split_ref(
    x: torch.Tensor, w: torch.Tensor, d: int, sizes: list[int] | tuple[int, ...]
) -> tuple[torch.Tensor, ...]:
    return split_of(F.linear(x, w), d, sizes)


def split_cat_of(
    c: torch.Tensor, d: int, s1: int, s2: int, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cat([c1, y], -1), c2) of a GEMM's (M, N) output c, as the model code spells it."""
    c1, c2 = torch.split(c.view(c.shape[0], d, s1 + s2), [s1, s2], dim=-1)
    return torch.cat([c1, y], dim=-1), c2.contiguous()


def split_of(
    c: torch.Tensor, d: int, sizes: list[int] | tuple[int, ...]
) -> tuple[torch.Tensor, ...]:
    """The contiguous pieces of split(c.view(M, d, sum(sizes)), sizes, -1)."""
    pieces = torch.split(c.view(c.shape[0], d, sum(sizes)), list(sizes), dim=-1)
    return tuple(piece.contiguous() for piece in pieces)
