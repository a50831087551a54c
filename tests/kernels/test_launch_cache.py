"""kernels/launch_cache.py: what selects a compiled kernel is in the key; a cached launch gives
what Triton's own launch gives (GPU); the interpreter and FXFUSE_LAUNCH_CACHE=0 bypass it."""

import pytest
import torch
import triton
import triton.language as tl

from fxfuse.kernels import launch_cache


@triton.jit
def _axpy_kernel(x_ptr, out_ptr, n, alpha, FLAG: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    value = tl.load(x_ptr + offs, mask=mask) * alpha
    if FLAG:
        value = value + 1.0
    tl.store(out_ptr + offs, value, mask=mask)


class _Fn:
    """Stands in for a JITFunction where only the key is under test."""

    arg_names = ["x_ptr", "out_ptr", "n", "alpha", "FLAG", "BLOCK"]
    pre_run_hooks = []


def key_of(*args, **kwargs):
    keyed = launch_cache.Launcher(_Fn())._key(args, kwargs)
    return None if keyed is None else keyed[0]


@pytest.fixture
def cpu_device_index(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_key_tells_apart_what_selects_a_kernel(cpu_device_index):
    x, out = torch.zeros(64), torch.zeros(64)
    base = key_of(x, out, 64, 2.0, FLAG=True, BLOCK=32, num_warps=4)
    assert base == key_of(torch.ones(64), torch.ones(64), 64, 2.0, FLAG=True, BLOCK=32, num_warps=4)
    assert base != key_of(x[1:], out, 64, 2.0, FLAG=True, BLOCK=32, num_warps=4)  # alignment
    assert base != key_of(x.double(), out, 64, 2.0, FLAG=True, BLOCK=32, num_warps=4)  # dtype
    assert base != key_of(x, out, 65, 2.0, FLAG=True, BLOCK=32, num_warps=4)  # an int's value
    assert base != key_of(x, out, 64, 2.0, FLAG=1, BLOCK=32, num_warps=4)  # True vs 1
    assert base != key_of(x, out, 64, 2, FLAG=True, BLOCK=32, num_warps=4)  # float vs int
    assert base != key_of(x, out, 64, 2.0, FLAG=True, BLOCK=32, num_warps=8)  # an option
    assert base != key_of(x, out, 64, 2.0, FLAG=True, BLOCK=64, num_warps=4)  # a constexpr


def test_a_parameter_left_to_its_default_goes_through_triton(cpu_device_index):
    assert key_of(torch.zeros(4), torch.zeros(4), 4, 1.0, FLAG=True) is None


def test_flag_parsing(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    for value, expected in (("", True), ("1", True), ("0", False)):
        monkeypatch.setenv(launch_cache.LAUNCH_CACHE_ENV, value)
        assert launch_cache.enabled() is expected
    monkeypatch.setenv(launch_cache.LAUNCH_CACHE_ENV, "yes")
    with pytest.raises(ValueError, match=launch_cache.LAUNCH_CACHE_ENV):
        launch_cache.enabled()
    monkeypatch.setenv(launch_cache.LAUNCH_CACHE_ENV, "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert launch_cache.enabled() is False  # the interpreter has no compiled kernel to reuse


def run(launcher, x, alpha, flag):
    out = torch.empty_like(x)
    launcher[(triton.cdiv(x.numel(), 32),)](x, out, x.numel(), alpha, FLAG=flag, BLOCK=32)
    return out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter path (CPU)")
def test_interpreter_launches_through_triton():
    launcher = launch_cache.Launcher(_axpy_kernel)
    x = torch.randn(100)
    torch.testing.assert_close(run(launcher, x, 2.0, True), x * 2.0 + 1.0, rtol=0, atol=0)
    assert not launcher.kernels


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_cached_launches_match_and_respecialize(monkeypatch):
    monkeypatch.setenv(launch_cache.LAUNCH_CACHE_ENV, "1")
    launcher = launch_cache.Launcher(_axpy_kernel)
    x = torch.randn(1000, device="cuda")
    for _ in range(3):  # first call through Triton, then cached
        torch.testing.assert_close(run(launcher, x, 2.0, True), x * 2.0 + 1.0, rtol=0, atol=0)
    assert len(launcher.kernels) == 1
    # Another alignment, flag and length: new keys, still right.
    xs = x[1:]
    torch.testing.assert_close(run(launcher, xs, 3.0, False), xs * 3.0, rtol=0, atol=0)
    torch.testing.assert_close(run(launcher, xs, 3.0, False), xs * 3.0, rtol=0, atol=0)
    short = x[:17]
    torch.testing.assert_close(run(launcher, short, 0.5, True), short * 0.5 + 1.0, rtol=0, atol=0)
    assert len(launcher.kernels) == 3
    monkeypatch.setenv(launch_cache.LAUNCH_CACHE_ENV, "0")
    torch.testing.assert_close(run(launcher, x, 2.0, True), x * 2.0 + 1.0, rtol=0, atol=0)
