"""Target detection: which launch table and FP8 flavour apply (FXFUSE_TARGET overrides)."""

from __future__ import annotations

import os

import torch

TARGETS = ("gfx950", "gfx942", "sm90", "cpu")


def parse_target(value: str, source: str = "FXFUSE_TARGET") -> str:
    value = value.strip()
    if value not in TARGETS:
        raise ValueError(f"{source}: unknown target {value!r}; expected one of {', '.join(TARGETS)}")
    return value


def detect_target(device: torch.device | None = None) -> str:
    """The target of `device` (default: the current accelerator, else the CPU)."""
    env = os.environ.get("FXFUSE_TARGET")
    if env:
        return parse_target(env)
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if device.type != "cuda":
        return "cpu"
    if torch.version.hip:
        arch = torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
        return "gfx950" if arch == "gfx950" else "gfx942"
    # Every NVIDIA part uses the Hopper table: it is the only one measured.
    return "sm90"


def fp8_dtype_for(target: str) -> torch.dtype:
    """gfx942 uses e4m3fnuz (max 240); everything else OCP e4m3fn (max 448)."""
    return torch.float8_e4m3fnuz if target == "gfx942" else torch.float8_e4m3fn


def interpreting() -> bool:
    """True when Triton kernels run in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
