"""Masks built from a tensor and a scalar comparison (`offs < n` & `pid == 0`) work in Triton's
interpreter, on whichever Triton is installed (triton 3.9 needs fxfuse's splat workaround)."""

from __future__ import annotations

import pytest
import torch

from fxfuse.runtime.target import interpreting

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

pytestmark = pytest.mark.skipif(not interpreting(), reason="interpreter behaviour")


@triton.jit
def _masked_store(x_ptr, n, MODE: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, 16)
    mask = offs < n
    if MODE == 0:
        mask = mask & (pid == 0)
    elif MODE == 1:
        mask = (pid == 0) & mask
    else:
        mask = mask & (n > 3)
    tl.store(x_ptr + pid * 16 + offs, offs.to(tl.float32) + 1.0, mask=mask)


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_scalar_condition_in_mask(mode):
    import fxfuse.kernels  # noqa: F401  (applies the workaround)

    x = torch.zeros(32)
    _masked_store[(2,)](x, 5, MODE=mode)
    want = torch.zeros(32)
    want[:5] = torch.arange(1, 6, dtype=torch.float32)
    if mode == 2:  # no pid condition: the second program writes too
        want[16:21] = torch.arange(1, 6, dtype=torch.float32)
    assert torch.equal(x, want)


@triton.jit
def _count_to(x_ptr, n_ptr):
    n = tl.load(n_ptr)
    total = 0
    for _ in range(0, n):  # a loop bound read from memory: a scalar tensor's __index__
        total += 1
    for i in tl.range(tl.program_id(0), n, 2):
        total += i
    tl.store(x_ptr + tl.program_id(0), total)


def test_scalar_tensor_as_a_loop_bound():
    import fxfuse.kernels  # noqa: F401  (applies the workaround)

    x = torch.zeros(2, dtype=torch.int32)
    _count_to[(2,)](x, torch.tensor([5], dtype=torch.int32))
    assert x.tolist() == [5 + 0 + 2 + 4, 5 + 1 + 3]
