"""Torch references of GEMM → split → cat (SPEC §3), spelled like the model code they replace.

    c       = (x @ wᵀ).view(M, D, S1 + S2)         x (M, K), w (N, K) with N = D·(S1 + S2)
    c1, c2  = split(c, [S1, S2], -1)
    out     = cat([c1, y], -1)                      y (M, D, S3), any strides (often an expand)
    returns (out (M, D, S1 + S3) contiguous, c2 (M, D, S2) the split's view of c, not copied)

`gemm_split_ref` is the same without the cat: the pieces of `split(c, sizes, -1)`, each contiguous
except the `view_piece` (when given), which stays the view of c the split made: a piece the
graph reads in place is not copied (`piece_buffers` lays out the kernels' destinations alike).
`split_cat_of` / `split_of` are the part after the GEMM, for any GEMM (the quantized producers);
`check_cat_args` / `check_sizes` validate the split arguments for the ops and the kernels alike.
The GEMM runs in x.dtype as torch runs it; tests compare against a float64 reference instead.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gemm_split_cat_ref(
    x: torch.Tensor, w: torch.Tensor, d: int, s1: int, s2: int, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    c = F.linear(x, w)
    c1 = c.view(c.shape[0], d, s1 + s2)[..., :s1]
    return torch.cat([c1, y], dim=-1), split_cat_c2(c, d, s1, s2)


def gemm_split_ref(
    x: torch.Tensor,
    w: torch.Tensor,
    d: int,
    sizes: list[int] | tuple[int, ...],
    view_piece: int = -1,
) -> tuple[torch.Tensor, ...]:
    return split_of(F.linear(x, w), d, sizes, view_piece)


def split_cat_of(
    c: torch.Tensor, d: int, s1: int, s2: int, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cat([c1, y], -1), c2) of a GEMM's (M, N) output c, as the model code spells it."""
    c1, c2 = torch.split(c.view(c.shape[0], d, s1 + s2), [s1, s2], dim=-1)
    return torch.cat([c1, y], dim=-1), c2.contiguous()


def split_cat_c2(c: torch.Tensor, d: int, s1: int, s2: int) -> torch.Tensor:
    """c2 as the quantized split-cat ops return it: the view the unfused graph has, the last s2
    columns of each head of c (M, d·(s1 + s2)) viewed as (M, d, s1 + s2); not copied."""
    return c.view(c.shape[0], d, s1 + s2)[..., s1:]


def split_cat_buffers(
    m: int, d: int, s1: int, s2: int, s3: int, dtype: torch.dtype, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty (out, c2) of a split-cat as every implementation returns them: out (M, d, s1 + s3)
    contiguous, c2 (M, d, s2) `split_cat_c2`'s view of an (M, d·(s1 + s2)) buffer."""
    out = torch.empty((m, d, s1 + s3), dtype=dtype, device=device)
    c = torch.empty((m, d * (s1 + s2)), dtype=dtype, device=device)
    return out, split_cat_c2(c, d, s1, s2)


def split_of(
    c: torch.Tensor, d: int, sizes: list[int] | tuple[int, ...], view_piece: int = -1
) -> tuple[torch.Tensor, ...]:
    """The pieces of split(c.view(M, d, sum(sizes)), sizes, -1): contiguous copies, except
    piece `view_piece` (-1: none), the split's own view of c."""
    pieces = torch.split(c.view(c.shape[0], d, sum(sizes)), list(sizes), dim=-1)
    return tuple(p if i == view_piece else p.contiguous() for i, p in enumerate(pieces))


def piece_buffers(
    m: int, d: int, sizes, view_piece: int, dtype: torch.dtype, device
) -> list[torch.Tensor]:
    """Empty destinations for the pieces of a split of an (M, d·sum(sizes)) GEMM output, laid out
    as `split_of` returns them: (M, d, size) contiguous, except piece `view_piece`, which is its
    columns of each head of an (M, d, sum(sizes)) buffer (strides (d·sum, sum, 1)), as the
    unfused split's view. Only that piece lives in the buffer: no two outputs share storage."""
    pieces = []
    for i, size in enumerate(sizes):
        if i == view_piece:
            lo, width = sum(sizes[:i]), sum(sizes)
            full = torch.empty((m, d, width), dtype=dtype, device=device)
            pieces.append(full[..., lo : lo + size])
        else:
            pieces.append(torch.empty((m, d, size), dtype=dtype, device=device))
    return pieces


MAX_PIECES = 4  # the kernels' most output pieces


def check_cat_args(m: int, n: int, dtype, device, d, s1, s2, y, first: str) -> None:
    """The split / cat arguments of a GEMM of m rows and n columns giving dtype on device, whose
    first operand is called `first` (ValueError naming the argument)."""
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"d: expected a positive int, got {d!r}")
    for name, value in (("s1", s1), ("s2", s2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: expected a non-negative int, got {value!r}")
    if s1 + s2 == 0:
        raise ValueError("s1: s1 + s2 must be positive")
    if n != d * (s1 + s2):
        raise ValueError(f"w: has {n} output rows, expected d·(s1 + s2) = {d * (s1 + s2)}")
    if not isinstance(y, torch.Tensor) or y.dim() != 3:
        raise ValueError(f"y: expected a 3-D (M, d, S3) tensor, got {getattr(y, 'shape', type(y))}")
    if y.shape[0] != m or y.shape[1] != d:
        raise ValueError(f"y: expected shape ({m}, {d}, S3), got {tuple(y.shape)}")
    if y.dtype != dtype:
        raise ValueError(f"y: dtype {y.dtype} differs from the output's {dtype}")
    if y.device != device:
        raise ValueError(f"y: on {y.device}, {first} on {device}")


def check_sizes(n: int, d, sizes, view_piece=-1) -> None:
    """The split sizes of a GEMM of n columns viewed as (d, sum(sizes)), and the index of the
    piece returned as a view (-1: none)."""
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"d: expected a positive int, got {d!r}")
    if not isinstance(sizes, (list, tuple)) or not 1 <= len(sizes) <= MAX_PIECES:
        raise ValueError(f"sizes: expected 1 to {MAX_PIECES} sizes, got {sizes!r}")
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in sizes) or not sum(sizes):
        raise ValueError(f"sizes: expected non-negative ints with a positive sum, got {sizes}")
    if n != d * sum(sizes):
        raise ValueError(f"w: has {n} output rows, expected d·sum(sizes) = {d * sum(sizes)}")
    if (
        isinstance(view_piece, bool)
        or not isinstance(view_piece, int)
        or not -1 <= view_piece < len(sizes)
    ):
        raise ValueError(
            f"view_piece: expected -1 or a piece index below {len(sizes)}, got {view_piece!r}"
        )
