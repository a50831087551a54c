"""All-reduce as fxfuse's own spelling (the traceable functional collective of torch.distributed),
and what the fused all-reduce ops need at run time: process groups by name, as torch's functional
collectives pass them (`_c10d_functional.all_reduce(x, "sum", group_name)`), the collective itself,
and each group's symmetric-memory workspace for the one-shot kernel."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist


def all_reduce(x: torch.Tensor, group=None) -> torch.Tensor:
    """Sum of x over `group` (default: the world); a copy of x without a group or with one rank."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x: expected a tensor, got {type(x).__name__}")  # noqa: TRY004
    if not (dist.is_available() and dist.is_initialized()):
        return x.clone()
    group = group or dist.group.WORLD
    if dist.get_world_size(group) == 1:
        return x.clone()
    from torch.distributed import _functional_collectives as funcol

    return funcol.all_reduce(x, "sum", group)


# --- process groups by name ---------------------------------------------------------------------


def initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def group_name_of(group=None) -> str | None:
    """The name torch's functional collectives record for `group` (default: the world); None
    without torch.distributed."""
    if not initialized():
        return None
    return (group or dist.group.WORLD).group_name


def resolve_group(group_name: str | None):
    """The ProcessGroup named `group_name`; None for no name or no torch.distributed."""
    if group_name is None or not initialized():
        return None
    from torch.distributed.distributed_c10d import _resolve_process_group

    try:
        return _resolve_process_group(group_name)
    except (KeyError, ValueError, RuntimeError) as err:
        raise ValueError(f"group_name: no process group named {group_name!r} ({err})") from err


def world_size(group_name: str | None) -> int:
    """Ranks in the group (1 without a group: the all-reduce is the identity)."""
    group = resolve_group(group_name)
    return 1 if group is None else group.size()


def all_reduce_sum(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """The functional all-reduce the unfused graph runs (`_c10d_functional.all_reduce` then
    `wait_tensor`), through the group's backend: its bytes exactly."""
    c10d = torch.ops._c10d_functional
    return c10d.wait_tensor(c10d.all_reduce(x, "sum", group_name))


# --- symmetric memory ---------------------------------------------------------------------------

_WORKSPACES: dict[tuple[str, str], tuple[torch.Tensor, object, object]] = {}


def symmetric_memory_available(device: torch.device) -> bool:
    """torch symmetric memory can back a one-shot kernel on `device` (CUDA / ROCm builds)."""
    if device.type != "cuda" or not dist.is_available():
        return False
    try:
        from torch._C._distributed_c10d import _SymmetricMemory  # noqa: F401
    except ImportError:
        return False
    return True


def symmetric_peers(group_name: str, device: torch.device, buffer_bytes: int):
    """`kernels.allreduce_oneshot.Peers` of the group's one-shot workspace on `device`: a
    buffer of at least `buffer_bytes` per rank and its signal pads. Allocated and rendezvoused on
    first use, which is collective: every rank of the group reaches it at the same call (the
    fused op's dispatch depends only on what all ranks share). Not during CUDA-graph capture."""
    from torch._C._distributed_c10d import _SymmetricMemory

    from fxfuse.kernels.allreduce_oneshot import Peers

    key = (group_name, str(device))
    cached = _WORKSPACES.get(key)
    if cached is not None and cached[2].buffer_bytes >= buffer_bytes:
        return cached[2]
    try:  # torch < 2.9 needs the group registered; later versions deprecate the call
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            enable_symm_mem_for_group(group_name)
    except ImportError:
        pass
    with torch.cuda.device(device):
        # Its own allocation (not the shared pool): the signal pad is this workspace's alone.
        buffer = _SymmetricMemory.empty_strided_p2p(
            (buffer_bytes,), (1,), torch.uint8, device, group_name
        )
        handle = _SymmetricMemory.rendezvous(buffer, group_name)
    peers = Peers(
        buffer_ptrs=torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device=device),
        signal_pad_ptrs=torch.tensor(handle.signal_pad_ptrs, dtype=torch.int64, device=device),
        rank=handle.rank,
        buffer_bytes=buffer_bytes,
        # Torch before the size became configurable used a fixed 2048-byte pad.
        signal_pad_bytes=getattr(_SymmetricMemory, "signal_pad_size", 2048),
    )
    _WORKSPACES[key] = (buffer, handle, peers)
    return peers
