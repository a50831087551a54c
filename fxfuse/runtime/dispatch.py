"""Run-time choice between a Triton kernel and its torch reference."""

from __future__ import annotations

import functools
import os

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


# Who runs a GEMM that has a vendor path (the A8W8 GEMMs through torch._scaled_mm, GEMM → split →
# cat through torch.bmm): the launch table `<kernel>_backend.json` per shape, or an override.
BACKEND_TRITON = 1
BACKEND_VENDOR = 2  # cuBLAS(Lt) on NVIDIA, hipBLAS(Lt) on ROCm, through torch
BACKEND_UNFUSED = 3  # the unfused torch chain the rewrite replaced (the vendor GEMM, then copies)
GEMM_BACKEND_ENV = "FXFUSE_GEMM_BACKEND"
GEMM_BACKENDS = ("auto", "triton", "vendor")


def gemm_backend_override() -> str:
    """FXFUSE_GEMM_BACKEND: "auto" (the launch table decides, the default), "triton" or "vendor"."""
    value = os.environ.get(GEMM_BACKEND_ENV, "").strip() or "auto"
    if value not in GEMM_BACKENDS:
        raise ValueError(f"{GEMM_BACKEND_ENV}: unknown value {value!r}; expected one of {GEMM_BACKENDS}")
    return value
