"""Run-time choice between a Triton kernel and its torch reference."""

from __future__ import annotations

import functools

import torch

from fxfuse.runtime.target import interpreting


@functools.cache
def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def use_triton(*tensors: torch.Tensor) -> bool:
    """Kernels run compiled on CUDA/ROCm tensors and in Triton's interpreter for CPU tensors when
    TRITON_INTERPRET=1; otherwise the fused op runs its torch reference (SPEC §4)."""
    if not _triton_available():
        return False
    devices = {t.device.type for t in tensors if isinstance(t, torch.Tensor)}
    if devices == {"cuda"}:
        return True
    return devices == {"cpu"} and interpreting()
