"""All-reduce as fxfuse's own spelling: the traceable functional collective of torch.distributed."""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor, group=None) -> torch.Tensor:
    """Sum of x over `group` (default: the world); a copy of x without a group or with one rank."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x: expected a tensor, got {type(x).__name__}")
    if not (dist.is_available() and dist.is_initialized()):
        return x.clone()
    group = group or dist.group.WORLD
    if dist.get_world_size(group) == 1:
        return x.clone()
    from torch.distributed import _functional_collectives as funcol

    return funcol.all_reduce(x, "sum", group)
