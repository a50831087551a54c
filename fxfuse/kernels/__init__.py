"""Triton kernels, their host launchers and torch reference implementations (no torch.fx)."""

import os as _os

if _os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    try:
        from fxfuse.kernels import _interpreter_compat

        _interpreter_compat.apply()
    except ImportError:  # no triton: the references run instead
        pass
