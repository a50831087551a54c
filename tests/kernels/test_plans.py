"""Launch plans (fxfuse.kernels._plans): a planned wrapper's later calls replay its launches.

On CPU the machinery runs with fake kernels (a compiled kernel whose launcher runs a torch body);
the GPU tests at the end run the real wrappers twice, planned and not, and compare the bytes.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import triton
from torch.utils._python_dispatch import _disable_current_modes

from fxfuse.kernels import _plans


class FakeCompiled:
    """A compiled kernel: `run` calls Triton's launch-enter hook, as its launcher does, then the
    body on the argument values (tensors: the plan passes no raw pointers here)."""

    def __init__(self, body):
        self.body = body
        self.function = object()
        self.packed_metadata = ()
        self.launches = 0

    def launch_metadata(self, grid, stream, *values):
        return None

    def run(self, g0, g1, g2, stream, function, packed, meta, enter, leave, *values):
        if enter is not None:
            enter(meta)
        self.launches += 1
        with _disable_current_modes():  # the kernel's own work is not the wrapper's
            self.body(*values)


class FakeKernel:
    """A JITFunction stand-in: `kernel[grid](*args, **kwargs)` binds as Triton does (defaults
    filled) and runs the one compiled kernel."""

    def __init__(self, fn, body):
        self.fn = fn
        self.compiled = FakeCompiled(body)

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
            bound.apply_defaults()
            hook = triton.knobs.runtime.launch_enter_hook
            self.compiled.run(*grid, 1, 1, None, None, None, None, hook, None,
                              *bound.arguments.values())  # fmt: skip
            return self.compiled

        return run


def _scale_sig(x_ptr, out_ptr, n, FACTOR=2.0):  # the fake kernel's parameters
    pass


def _scale_body(x, out, n, factor):
    out.copy_(x * factor)


@pytest.fixture
def fake_device(monkeypatch):
    """Plans for CPU tensors, outside the interpreter switch, on a null stream."""
    monkeypatch.setattr(_plans, "DEVICE_TYPES", ("cpu",))
    monkeypatch.setattr(_plans, "interpreting", lambda: False)
    monkeypatch.setattr(_plans, "_current_stream", lambda index: None)
    monkeypatch.setattr(_plans, "enabled", True)


def _make_wrapper(kernel, calls, *, device_work=False, unrecorded=False):
    @_plans.planned
    def scale(x: torch.Tensor, factor: float, residual: torch.Tensor | None = None):
        calls.append(1)
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if device_work:
            out.zero_()
        if unrecorded:
            kernel[(1,)](x, out, x.numel(), FACTOR=factor)
        else:
            _plans.launch(kernel, (1,), x, out, x.numel(), FACTOR=factor)
        h = x if residual is None else residual
        return out, h

    return scale


def test_replay_matches_and_skips_the_wrapper(fake_device):
    kernel, calls = FakeKernel(_scale_sig, _scale_body), []
    scale = _make_wrapper(kernel, calls)
    x = torch.randn(4, 8)
    first, h = scale(x, 3.0)
    assert len(calls) == 1 and h is x
    for _ in range(3):
        y = torch.randn(4, 8)
        out, h = scale(y, 3.0)
        torch.testing.assert_close(out, y * 3.0, rtol=0, atol=0)
        assert h is y and out is not first  # fresh output, input passed through
    assert len(calls) == 1, "the plan replays: the wrapper ran once"
    assert kernel.compiled.launches == 4
    torch.testing.assert_close(first, x * 3.0, rtol=0, atol=0)


def test_signature_changes_build_new_plans(fake_device):
    kernel, calls = FakeKernel(_scale_sig, _scale_body), []
    scale = _make_wrapper(kernel, calls)
    x = torch.randn(4, 8)
    scale(x, 3.0)
    scale(torch.randn(2, 8), 3.0)  # shape
    scale(x, 5.0)  # a scalar argument
    scale(x.t(), 3.0)  # strides
    out, h = scale(x, 3.0, x)  # the same tensor twice (alias) ...
    scale(x, 3.0, torch.randn(4, 8))  # ... is not two distinct tensors
    assert len(calls) == 6 and len(scale.plans) == 6
    out, _ = scale(x, 5.0)
    torch.testing.assert_close(out, x * 5.0, rtol=0, atol=0)
    assert len(calls) == 6


def test_device_work_in_the_wrapper_is_never_planned(fake_device):
    kernel, calls = FakeKernel(_scale_sig, _scale_body), []
    scale = _make_wrapper(kernel, calls, device_work=True)
    x = torch.randn(4, 8)
    for _ in range(4):
        out, _ = scale(x, 2.0)
        torch.testing.assert_close(out, x * 2.0, rtol=0, atol=0)
    assert len(calls) == 4, "zero_() is device work a replay would skip: the wrapper runs"
    assert not any(isinstance(p, _plans._Plan) for p in scale.plans.values())


def test_a_launch_not_made_through_launch_is_never_planned(fake_device):
    kernel, calls = FakeKernel(_scale_sig, _scale_body), []
    scale = _make_wrapper(kernel, calls, unrecorded=True)
    x = torch.randn(4, 8)
    for _ in range(3):
        out, _ = scale(x, 2.0)
        torch.testing.assert_close(out, x * 2.0, rtol=0, atol=0)
    assert len(calls) == 3


def test_unhashable_arguments_and_switched_off_bypass(fake_device, monkeypatch):
    kernel, calls = FakeKernel(_scale_sig, _scale_body), []

    @_plans.planned
    def scale(x, config=None):
        calls.append(1)
        out = torch.empty_like(x)
        _plans.launch(kernel, (1,), x, out, x.numel(), FACTOR=2.0)
        return out

    x = torch.randn(8)
    scale(x, config={"BLOCK": 16})
    scale(x, config={"BLOCK": 16})
    assert len(calls) == 2 and not scale.plans
    monkeypatch.setattr(_plans, "enabled", False)
    scale(x)
    scale(x)
    assert len(calls) == 4 and not scale.plans


def test_launch_plans_env_is_strict(monkeypatch):
    monkeypatch.setenv(_plans.PLANS_ENV, "yes")
    with pytest.raises(ValueError, match="FXFUSE_LAUNCH_PLANS"):
        _plans._parse_enabled()
    monkeypatch.setenv(_plans.PLANS_ENV, "0")
    assert _plans._parse_enabled() is False


# --- the real wrappers on a GPU -------------------------------------------------------------

def gpu(test):
    test = pytest.mark.gpu(test)
    missing = not torch.cuda.is_available() or _plans.interpreting()
    return pytest.mark.skipif(missing, reason="needs a GPU, TRITON_INTERPRET=0")(test)


def _twice_planned_and_not(fn, monkeypatch):
    """fn() three times with plans (record, replay, replay) and once without; all equal."""
    monkeypatch.setattr(_plans, "enabled", True)
    outs = [fn() for _ in range(3)]
    monkeypatch.setattr(_plans, "enabled", False)
    outs.append(fn())
    flat = [torch.utils._pytree.tree_leaves(o) for o in outs]
    for other in flat[1:]:
        for a, b in zip(flat[0], other):
            if isinstance(a, torch.Tensor):
                assert a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
                bytes_a, bytes_b = (t.contiguous().view(torch.uint8) for t in (a, b))
                assert torch.equal(bytes_a, bytes_b)
    return outs


@gpu
@pytest.mark.parametrize("m", [1, 33, 4096])
def test_gpu_norm_quant_wrappers_replay_bit_exact(m, monkeypatch):
    from fxfuse.kernels import rms_norm_quant as k

    x = torch.randn(m, 7168, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.rand(7168, device="cuda", dtype=torch.bfloat16)
    _twice_planned_and_not(lambda: k.rms_norm_quant(x, w, 1e-6, r), monkeypatch)
    _twice_planned_and_not(lambda: k.rms_norm_quant(x, w, 1e-6, group_size=128), monkeypatch)
    _twice_planned_and_not(
        lambda: k.rms_norm_quant(x, w, 1e-6, group_size=128, scale_col_major=True), monkeypatch
    )
    _twice_planned_and_not(lambda: k.rms_norm_quant(x, w, 1e-6, quant="mxfp4"), monkeypatch)
    _twice_planned_and_not(lambda: k.quant(x), monkeypatch)
    _twice_planned_and_not(lambda: k.rms_norm(x, w, 1e-6, r), monkeypatch)
    assert any(isinstance(p, _plans._Plan) for p in k.rms_norm_quant.plans.values())


@gpu
@pytest.mark.parametrize("m", [16, 4096])
def test_gpu_gemm_and_topk_wrappers_replay_bit_exact(m, monkeypatch):
    from fxfuse.kernels import gemm_fp8, topk

    q = torch.randn(m, 1024, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(512, 1024, device="cuda").to(torch.float8_e4m3fn)
    xs, ws = torch.rand(m, 1, device="cuda"), torch.rand(512, device="cuda")
    x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
    _twice_planned_and_not(lambda: gemm_fp8.gemm_fp8(q, xs, w, ws), monkeypatch)
    _twice_planned_and_not(lambda: gemm_fp8.gemm_a16w8(x, w, ws), monkeypatch)
    scores = torch.randn(m, 4096, device="cuda")
    _twice_planned_and_not(lambda: topk.topk_mask(scores, 64), monkeypatch)
    assert any(isinstance(p, _plans._Plan) for p in gemm_fp8.gemm_fp8.plans.values())
    assert any(isinstance(p, _plans._Plan) for p in topk.topk_mask.plans.values())


@gpu
def test_gpu_capture_runs_the_wrapper_and_replays_match(monkeypatch):
    """A planned signature captured in a CUDA graph: the capture runs the wrapper as written
    (stream-keyed buffers are the capture stream's) and the graph's output equals eager's."""
    from fxfuse.kernels import gemm_fp8

    monkeypatch.setattr(_plans, "enabled", True)
    q = torch.randn(16, 1024, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(512, 1024, device="cuda").to(torch.float8_e4m3fn)
    xs, ws = torch.rand(16, 1, device="cuda"), torch.rand(512, device="cuda")
    eager = [gemm_fp8.gemm_fp8(q, xs, w, ws) for _ in range(3)][-1]  # planned by now
    plans_before = dict(gemm_fp8.gemm_fp8.plans)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = gemm_fp8.gemm_fp8(q, xs, w, ws)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    assert gemm_fp8.gemm_fp8.plans == plans_before
