"""Launch plans: a kernel wrapper's host work done once per input signature.

A fused op in a prefill graph is host-bound when its wrapper's Python (checks, table lookups,
argument building, Triton's binding of ~30 arguments) takes longer than its kernel. On the H200's
host the norm-quant wrapper took 149 µs per call, of which 10 µs is the compiled kernel's launch
itself (benchmarks/experiments/launch_overhead.py).

`@planned` memoizes a wrapper by the signature of its arguments: for every tensor its shape,
strides, dtype, device and 16-byte alignment (what Triton specializes on), which tensors alias
which, and every other argument's type and value. The first call with a signature runs the
wrapper as written while recording:
  - each Triton launch made through `launch()` (the compiled kernel, its grid and its arguments),
  - each device allocation (through a dispatch mode that also watches for any other device
    work).
If the wrapper did nothing on the device but allocate, make views and launch Triton kernels, and
every tensor argument of its launches is an input, a fresh allocation or a persistent buffer of
the module, the record becomes a plan. Later calls with the signature allocate the same buffers
and call the compiled kernels' launchers directly with the new pointers. Anything else (CPU or
interpreter tensors, unhashable arguments, device work that is not a launch, a grid that is a
function, launch hooks set, a call inside a CUDA graph capture, a call inside another plan's
recording) runs the wrapper as written: a plan changes nothing but host time.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading

import torch
import triton
from torch.utils._python_dispatch import TorchDispatchMode

from fxfuse.runtime.target import interpreting

_state = threading.local()
_ALLOCATIONS = {
    torch.ops.aten.empty.memory_format,
    torch.ops.aten.empty_strided.default,
    torch.ops.aten.empty_like.default,
    torch.ops.aten.new_empty.default,
    torch.ops.aten.new_empty_strided.default,
}
_MAX_PLANS = 512  # per wrapper; a full table is cleared (shapes beyond it rebuild their plans)

# Environment flags that steer a wrapper's choices: part of every key.
_ENV_KEYS = ("FXFUSE_TARGET", "FXFUSE_GEMM_BACKEND", "FXFUSE_TOPK_PATH")
PLANS_ENV = "FXFUSE_LAUNCH_PLANS"


def _parse_enabled() -> bool:
    value = os.environ.get(PLANS_ENV, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{PLANS_ENV}: expected 0 or 1, got {value!r}")
    return value != "0"


# FXFUSE_LAUNCH_PLANS=0 turns plans off; tests switch this to compare both paths.
enabled = _parse_enabled()


def launch(kernel, grid, *args, **kwargs):
    """`kernel[grid](*args, **kwargs)`, recorded when a plan is being built."""
    compiled = kernel[grid](*args, **kwargs)
    record = getattr(_state, "record", None)
    if record is not None:
        record.launches.append((kernel, grid, args, kwargs, compiled))
    return compiled


class _Record(TorchDispatchMode):
    """Watches a wrapper's first call: allocations kept, any other device op marks it impure."""

    def __init__(self):
        super().__init__()
        self.launches: list = []
        self.allocations: list[torch.Tensor] = []
        self.impure: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _ALLOCATIONS:
            if isinstance(out, torch.Tensor) and out.device.type in DEVICE_TYPES:
                self.allocations.append(out)
        elif self.impure is None and not func.is_view and _device_work(func, args, kwargs, out):
            self.impure = str(func)
        return out


def _on_device(values) -> list[torch.Tensor]:
    leaves = torch.utils._pytree.tree_leaves(values)
    return [t for t in leaves if isinstance(t, torch.Tensor) and t.device.type in DEVICE_TYPES]


def _device_work(func, args, kwargs, out) -> bool:
    """Whether an op does work a replay would skip: it writes a device tensor (a new one or one
    of its arguments), or reads one into the host (`.item()`). Meta and CPU work is host-only."""
    if _on_device(out):
        return True
    if not _on_device((args, kwargs or {})):
        return False
    return func._schema.is_mutable or not any(
        isinstance(t, torch.Tensor) for t in torch.utils._pytree.tree_leaves(out)
    )


class _LaunchCounter:
    """Counts every Triton launch while a record is open, through Triton's launch-enter hook, so
    that a launch not made through `launch()` (which a replay would miss) voids the plan."""

    def __init__(self):
        self.count = 0
        self.ok = True
        self._installed = None

    def __call__(self, metadata=None):
        self.count += 1

    def __enter__(self):
        runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
        hook = getattr(runtime, "launch_enter_hook", None) if runtime is not None else None
        if runtime is not None and hasattr(hook, "add"):  # triton >= 3.7: a hook chain
            hook.add(self)
            self._installed = "chain"
        elif runtime is not None and hook is None:  # triton 3.4 - 3.6: one hook slot
            runtime.launch_enter_hook = self
            self._installed = "slot"
        else:  # a hook of someone else's in the only slot, or no knobs: cannot count
            self.ok = False
        return self

    def __exit__(self, *exc):
        runtime = triton.knobs.runtime if self._installed else None
        if self._installed == "chain":
            runtime.launch_enter_hook.remove(self)
        elif self._installed == "slot":
            runtime.launch_enter_hook = None
        return False


# Device types whose calls are planned (tests add "cpu" to run the machinery with fake kernels).
DEVICE_TYPES = ("cuda",)
_ATTEMPTS = 2  # recordings of one signature before it is left to the wrapper for good
_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device)


def _signature(args, kwargs):
    """(key, tensors) of a call, or None when it cannot be planned."""
    key: list = []
    tensors: list[torch.Tensor] = []
    ptrs: list[int] = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            if value.device.type not in DEVICE_TYPES:
                return None
            ptr = value.data_ptr()
            key.append((tuple(value.shape), value.stride(), value.dtype, value.device.index,
                        ptr % 16 == 0, ptrs.index(ptr) if ptr in ptrs else -1))  # fmt: skip
            tensors.append(value)
            ptrs.append(ptr)
        elif isinstance(value, _SCALARS) or hasattr(value, "__members__"):
            if isinstance(value, float) and value != value:
                return None  # NaN never equals itself: no key could hit
            key.append((type(value), value))
        else:
            return None
    key.append(tuple(kwargs))
    key.extend(os.environ.get(name) for name in _ENV_KEYS)
    return tuple(key), tensors


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _current_stream(device_index: int):
    """The raw current stream Triton launches on (what JITFunction.run passes)."""
    return triton.runtime.driver.active.get_current_stream(device_index)


def _storage_span(t: torch.Tensor) -> tuple[int, int]:
    base = t.untyped_storage().data_ptr()
    return base, base + t.untyped_storage().nbytes()


class _Plan:
    """Replays a recorded call: allocations, then each compiled kernel's launcher."""

    def __init__(self, allocations, launches, outputs, structure):
        self.allocations = allocations  # (size, stride, dtype, device) per fresh buffer
        self.launches = launches  # (compiled, grid3, template values, slots)
        self.outputs = outputs  # per result leaf: ("src", i) | ("view", i, size, stride, offset)
        # | ("none",), i indexing the call's tensors then its allocations
        self.structure = structure  # "tensor" | "tuple" | "list"

    def run(self, tensors):
        fresh = [torch.empty_strided(size, stride, dtype=dtype, device=device)
                 for size, stride, dtype, device in self.allocations]  # fmt: skip
        sources = (*tensors, *fresh)
        if self.launches:
            stream = _current_stream(tensors[0].device.index)
            hooks = triton.knobs.runtime
            enter, leave = hooks.launch_enter_hook, hooks.launch_exit_hook
            for compiled, grid, template, slots in self.launches:
                values = list(template)
                for pos, src, delta in slots:
                    values[pos] = sources[src] if not delta else sources[src].data_ptr() + delta
                meta = compiled.launch_metadata(grid, stream, *values)
                compiled.run(grid[0], grid[1], grid[2], stream, compiled.function,
                             compiled.packed_metadata, meta, enter, leave, *values)  # fmt: skip
        leaves = [None if out[0] == "none" else sources[out[1]] if out[0] == "src"
                  else sources[out[1]].as_strided(*out[2:]) for out in self.outputs]  # fmt: skip
        if self.structure == "tensor":
            return leaves[0]
        return tuple(leaves) if self.structure == "tuple" else leaves


def _bound_values(kernel, args, kwargs) -> list | None:
    """The launch's arguments in the kernel's parameter order, defaults filled (what
    JITFunction.run hands the launcher), or None for a kernel it cannot take."""
    fn = getattr(kernel, "fn", None)
    if fn is None:
        return None
    params = list(inspect.signature(fn).parameters.values())
    if len(args) > len(params):
        return None
    values = list(args)
    for param in params[len(args):]:
        if param.name in kwargs:
            values.append(kwargs[param.name])
        elif param.default is not inspect.Parameter.empty:
            values.append(param.default)
        else:
            return None
    return values


def _locate(ptr: int, spans) -> tuple[int, int] | None:
    """(source index, byte offset) of the first source whose storage holds ptr."""
    for i, (base, start, end) in enumerate(spans):
        if base <= ptr < end or (ptr == base and start == end):
            return i, ptr - base
    return None


def _make_plan(record: _Record, tensors, result) -> _Plan | None:
    if record.impure is not None:
        return None
    sources = [*tensors, *record.allocations]
    spans = [(t.data_ptr(), *_storage_span(t)) for t in sources]
    allocations = [(tuple(t.shape), t.stride(), t.dtype, t.device) for t in record.allocations]
    for t in record.allocations:
        if t.storage_offset() != 0:
            return None
    launches = []
    for kernel, grid, args, kwargs, compiled in record.launches:
        if callable(grid) or not all(
            hasattr(compiled, a) for a in ("run", "function", "packed_metadata", "launch_metadata")
        ):
            return None
        grid3 = (*grid, 1, 1)[:3]
        values = _bound_values(kernel, args, kwargs)
        if values is None:
            return None
        slots = []
        for pos, value in enumerate(values):
            if isinstance(value, torch.Tensor):
                found = _locate(value.data_ptr(), spans)
                if found is None:
                    continue  # a persistent buffer of the module: kept as recorded
                src, delta = found
                slots.append((pos, src, delta))
                values[pos] = None  # filled at replay; the plan holds no caller tensor
            elif not isinstance(value, (*_SCALARS, triton.language.dtype)) and not hasattr(
                value, "value"
            ):
                return None  # e.g. a host TMA descriptor: its pointer lives inside it
        launches.append((compiled, grid3, values, slots))
    leaves = result if isinstance(result, (tuple, list)) else (result,)
    structure = "tensor" if isinstance(result, torch.Tensor) else type(result).__name__
    if structure not in ("tensor", "tuple", "list"):
        return None
    outputs = []
    for leaf in leaves:
        if leaf is None:
            outputs.append(("none",))
            continue
        if not isinstance(leaf, torch.Tensor):
            return None
        storage = leaf.untyped_storage().data_ptr()
        src = next((i for i, t in enumerate(sources)
                    if t.untyped_storage().data_ptr() == storage), None)  # fmt: skip
        if src is None or sources[src].dtype != leaf.dtype:
            return None  # not an input or an allocation of this call, or a dtype view of one
        geometry = (tuple(leaf.shape), leaf.stride(), leaf.storage_offset())
        source = sources[src]
        if geometry == (tuple(source.shape), source.stride(), source.storage_offset()):
            outputs.append(("src", src))
        else:
            outputs.append(("view", src, *geometry))
    return _Plan(allocations, launches, outputs, structure)


def planned(wrapper):
    """Memoize `wrapper`'s host work per argument signature (module docstring)."""
    plans: dict = {}

    @functools.wraps(wrapper)
    def call(*args, **kwargs):
        if not enabled or getattr(_state, "record", None) is not None or interpreting():
            return wrapper(*args, **kwargs)
        signature = _signature(args, kwargs)
        if signature is None:
            return wrapper(*args, **kwargs)
        if _capturing():
            # In a capture the wrapper's stream-keyed buffers (split-K counters) are the capture
            # stream's, and a recording's allocations would belong to the graph: run it as written.
            return wrapper(*args, **kwargs)
        key, tensors = signature
        plan = plans.get(key)
        if plan is not None:
            if isinstance(plan, _Plan):
                return plan.run(tensors)
            if plan >= _ATTEMPTS:
                return wrapper(*args, **kwargs)  # this signature does not plan
        record = _Record()
        _state.record = record
        try:
            with record, _LaunchCounter() as counter:
                result = wrapper(*args, **kwargs)
        finally:
            _state.record = None
        if len(plans) >= _MAX_PLANS:
            plans.clear()
        complete = counter.ok and counter.count == len(record.launches)
        made = _make_plan(record, tensors, result) if complete else None
        # A failed recording is retried once: a module's first call may build a persistent
        # buffer (device work), its later calls not.
        plans[key] = made if made is not None else (plan or 0) + 1
        return result

    call.plans = plans
    return call
