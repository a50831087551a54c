"""fxfuse: graph fusion passes for PyTorch that replace hand-fused inference sequences
(RMSNorm → quant → GEMM, GEMM → split → cat, top-k → sparse blocks) with fused Triton kernels."""

from fxfuse import ops
from fxfuse.fusion.backend import fxfuse_backend, last_report, make_backend, register
from fxfuse.fusion.capture import apply_fusions
from fxfuse.fusion.config import PATTERN_NAMES, FusionConfig
from fxfuse.fusion.report import FusionReport

__all__ = [
    "PATTERN_NAMES",
    "FusionConfig",
    "FusionReport",
    "apply_fusions",
    "fxfuse_backend",
    "last_report",
    "make_backend",
    "ops",
]
__version__ = "0.1.0"

register()
