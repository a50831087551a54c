"""Launching compiled Triton kernels without re-deriving their specialization on every call.

`kernel[grid](*args)` binds and specializes every argument in Python before it finds the
compiled kernel. On the H200 machine's host the FP8 GEMM's launcher (~50 kernel arguments) took
164 µs a call, a bare 3-argument launch 24 µs, and fxfuse's own checks before the launch about a
fifth of that (benchmarks/experiments/host_overhead.py), so a layer of fused ops was host-bound
at prefill. A `Launcher` keys each call on everything that
can select a different compiled kernel — the current device, each tensor's dtype and 16-byte
alignment, every other argument's type and value (a refinement of Triton's own key, which looks
at ints only for == 1 and % 16), the launch options — and sends a known key straight to that
kernel's launcher (`CompiledKernel[grid](*args)`). A new key goes through `kernel[grid]`, which
compiles if needed and returns the kernel to remember. Every call goes through Triton under the
interpreter, for a callable grid, when the kernel has pre-run hooks, or with
FXFUSE_LAUNCH_CACHE=0.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

LAUNCH_CACHE_ENV = "FXFUSE_LAUNCH_CACHE"
MAX_KEYS = 512  # per kernel: a dynamic M adds one key per distinct M; past this, no new entries


def enabled() -> bool:
    """FXFUSE_LAUNCH_CACHE: "1" (default) or "0"; anything else is an error."""
    value = os.environ.get(LAUNCH_CACHE_ENV, "").strip() or "1"
    if value not in ("0", "1"):
        raise ValueError(f"{LAUNCH_CACHE_ENV}: expected 0 or 1, got {value!r}")
    return value == "1" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")


class Launcher:
    """`Launcher(jit_fn)[grid](*args, **kwargs)` does what `jit_fn[grid](...)` does."""

    def __init__(self, fn):
        self.fn = fn
        self.names = tuple(getattr(fn, "arg_names", ()))
        self.params = frozenset(self.names)
        self.kernels: dict = {}

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launch(grid, args, kwargs)

    def _key(self, args, kwargs):
        """(key, every parameter's value in order), or None when a call must go through Triton."""
        try:
            values = args + tuple(kwargs[name] for name in self.names[len(args) :])
        except KeyError:  # a parameter left to its default: Triton binds it
            return None
        options = tuple((k, v) for k, v in kwargs.items() if k not in self.params)
        # A value's type too: True == 1 and they hash alike, but Triton compiles them apart.
        features = tuple(
            (v.dtype, v.data_ptr() % 16 == 0) if isinstance(v, Tensor) else (type(v), v)
            for v in values
        )
        return (torch.cuda.current_device(), options, features), values

    def _launch(self, grid, args, kwargs):
        if not enabled() or callable(grid) or getattr(self.fn, "pre_run_hooks", None):
            return self.fn[grid](*args, **kwargs)
        keyed = self._key(args, kwargs)
        try:
            kernel = None if keyed is None else self.kernels.get(keyed[0])
        except TypeError:  # an unhashable argument
            keyed = kernel = None
        if kernel is None:
            kernel = self.fn[grid](*args, **kwargs)
            if keyed is not None and kernel is not None and len(self.kernels) < MAX_KEYS:
                self.kernels[keyed[0]] = kernel
            return kernel
        grid = (*grid, 1, 1)[:3] if len(grid) < 3 else grid
        kernel[grid](*keyed[1])
        return kernel


_LAUNCHERS: dict = {}


def launcher(fn) -> Launcher:
    """The one Launcher of the @triton.jit kernel `fn`: `launcher(fn)[grid](...)`."""
    found = _LAUNCHERS.get(fn)
    if found is None:
        found = _LAUNCHERS[fn] = Launcher(fn)
    return found
