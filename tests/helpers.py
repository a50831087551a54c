"""Shared test helpers."""

import json
import os
import subprocess
import sys

import pytest
import torch

from fxfuse.fusion.engine import is_fxfuse_op


def bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality of two tensors of one dtype and shape (NaNs compare by their bits)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def outputs_bytes_equal(a, b) -> bool:
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    return len(a) == len(b) and all(bytes_equal(x, y) for x, y in zip(a, b))


def fuse_and_run(model, inputs: tuple, capture_with_grad: bool = False):
    """(fused, fused(*inputs), model(*inputs)): `apply_fusions(model, inputs)`, both run without
    grad. capture_with_grad: capture as a user calling it outside `torch.no_grad()` would, so the
    model's own no-grad regions come wrapped (and `apply_fusions` must inline them)."""
    import fxfuse

    with torch.set_grad_enabled(capture_with_grad):
        fused = fxfuse.apply_fusions(model, inputs)
    with torch.no_grad():
        return fused, fused(*inputs), model(*inputs)


def assert_logits_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """SPEC §5, whole models: logits fused vs unfused within 1e-2 relative (‖got − want‖ /
    ‖want‖), the same argmax on at least 99 % of positions."""
    rel = ((got.double() - want.double()).norm() / want.double().norm()).item()
    assert rel <= 1e-2, rel
    same = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    assert same >= 0.99, same


def fused_targets(gm) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if is_fxfuse_op(n)]


def assert_kv_b_feeds_only_split_cat(gm, layers: int, op: str = "gemm_split_cat") -> None:
    """The graph holds `layers` kv_b weights, each read by the fused GEMM → split → cat
    (`fxfuse.<op>`) and nothing else."""
    weights = [
        n for n in gm.graph.nodes if n.op == "get_attr" and n.target.endswith("kv_b_proj.weight")
    ]
    assert len(weights) == layers, [w.target for w in weights]
    for weight in weights:
        assert [str(u.target) for u in weight.users] == [f"fxfuse.{op}.default"], weight.target


class Logits(torch.nn.Module):
    """An HF causal LM as a module of the token ids alone, returning its logits (no cache)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, ids):
        return self.inner(input_ids=ids, use_cache=False).logits


def compile_in_subprocess(script: str) -> dict:
    """Runs a script that compiles kernels for a GPU target (no device needed) with the
    interpreter off, in a fresh process from the repository root; returns the JSON dict its
    last line prints. Skips where a GPU toolchain piece (ptxas, or lld for AMD targets) is
    missing."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run(
        [sys.executable, "-c", script], check=False, env=env, capture_output=True, text=True,
        timeout=600, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )  # fmt: skip
    if proc.returncode and ("ptxas" in proc.stderr or "lld" in proc.stderr.lower()):
        pytest.skip(f"a GPU toolchain piece is missing: {proc.stderr.splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def narrow_dtype_rows(dtype: torch.dtype, rows: int, length: int, steps: int, seed: int):
    """bf16 / fp16 top-k rows whose k-th value is tied many times: consecutive values of the
    dtype, +-(1 + j ulp) for |j| <= steps (one unit in its last mantissa place apart, so a
    descent that skipped one key bit too many would merge neighbours), 0 for j = 0, with -inf in
    row 0, NaN in row 1, -0.0 in row 2 and every score of row 3 negative (keys with their low
    bits all 1)."""
    g = torch.Generator().manual_seed(seed)
    ulp = 2.0 ** -(7 if dtype == torch.bfloat16 else 10)
    j = torch.randint(-steps, steps + 1, (rows, length), generator=g).float()
    x = (1.0 + j.abs() * ulp) * j.sign()
    x[0, ::7] = float("-inf")
    x[1, 3::11] = float("nan")
    x[2, 5::13] = -0.0
    x[3] = -x[3].abs()
    torch.testing.assert_close(x.to(dtype).float(), x, rtol=0, atol=0, equal_nan=True)  # exact
    return x.to(dtype)
