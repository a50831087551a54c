"""One workaround for Triton's CPU interpreter, applied when TRITON_INTERPRET=1 (no effect on
compiled kernels).

triton 3.9's interpreter splats a comparison's result with the comparison's operand type: the
boolean data of `pid == 0` or `n > 3` becomes int32 when broadcast, so `mask & (pid == 0)` hands
an int32 mask to load / store, which reject it ("mask has unsupported dtype"). Earlier versions
kept the boolean data. The patch keeps a boolean source boolean through splat. It is the only
place fxfuse touches Triton internals; tests/kernels/test_interpreter_compat.py checks the
pattern on whatever Triton is installed.
"""

from __future__ import annotations

_PATCHED = False


def apply() -> None:
    global _PATCHED
    if _PATCHED:
        return
    import numpy as np
    from triton.runtime import interpreter

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
