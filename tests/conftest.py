import os

# Kernels are decorated at import time: the interpreter must be chosen before triton loads.
os.environ.setdefault("TRITON_INTERPRET", "1")

import importlib
import pkgutil

import pytest
import torch

import fxfuse.kernels

# Every kernel module now, under this choice: the ops import them on first use, and a first use
# under `reference_path` (TRITON_INTERPRET=0) would decorate them for the compiler, so a later
# interpreter test in the same process could not run them.
for _module in pkgutil.iter_modules(fxfuse.kernels.__path__):
    importlib.import_module(f"fxfuse.kernels.{_module.name}")


@pytest.fixture
def reference_path(monkeypatch):
    """Run fused ops through their torch references (the CPU default without the interpreter)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)

