"""Two workarounds for Triton's CPU interpreter, applied when TRITON_INTERPRET=1 (no effect on
compiled kernels).

Splat: triton 3.9's interpreter splats a comparison's result with the comparison's operand type: the
boolean data of `pid == 0` or `n > 3` becomes int32 when broadcast, so `mask & (pid == 0)` hands
an int32 mask to load / store, which reject it ("mask has unsupported dtype"). Earlier versions
kept the boolean data. The patch keeps a boolean source boolean through splat.

Index: triton 3.6's interpreter turns a scalar tensor into a Python int (a loop bound, as in
`range(0, n)` or `tl.range(tl.program_id(0), ...)`) by `int()` of its one-element 1-D data,
which NumPy 2.4 refuses ("only 0-dimensional arrays can be converted"); triton 3.9 squeezes it
first. The patch squeezes it on every version.

This module is the only place fxfuse touches Triton internals; tests/kernels/
test_interpreter_compat.py checks both patterns on whatever Triton is installed.
"""

from __future__ import annotations

_PATCHED = False


def apply() -> None:
    global _PATCHED
    if _PATCHED:
        return
    import numpy as np
    from triton.runtime import interpreter

    _mend_index(interpreter, np)
    builder = getattr(interpreter, "InterpreterBuilder", None)
    handle = getattr(interpreter, "TensorHandle", None)
    original = getattr(builder, "create_splat", None)
    if builder is None or handle is None or original is None:
        _PATCHED = True  # an interpreter without these internals: nothing to mend
        return

    def create_splat(self, ret_ty, arg):
        out = original(self, ret_ty, arg)
        data = getattr(arg, "data", None)
        if isinstance(data, np.ndarray) and data.dtype == np.bool_ and out.data.dtype != np.bool_:
            return handle(out.data.astype(np.bool_), out.dtype)
        return out

    builder.create_splat = create_splat
    _PATCHED = True


def _mend_index(interpreter, np) -> None:
    """After the interpreter patches `tl.tensor` for a launch, its `__index__` squeezes the data
    (set through the launch's own patch scope, so that the scope restores it)."""
    patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    if patch_tensor is None:
        return

    def index(self):
        return int(np.asarray(self.handle.data).squeeze())

    def patch_lang_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", index)

    interpreter._patch_lang_tensor = patch_lang_tensor
