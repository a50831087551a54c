import os

# Kernels are decorated at import time: the interpreter must be chosen before triton loads.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch


@pytest.fixture
def reference_path(monkeypatch):
    """Run fused ops through their torch references (the CPU default without the interpreter)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)

