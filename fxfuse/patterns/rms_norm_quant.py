"""Pattern `rmsnorm_quant`: canonical [residual add →] RMSNorm → quant (FP8 per token, FP8 1×G
group, MXFP4) → one `fxfuse.rms_norm_quant` / `add_rms_norm_quant` kernel.

The norm's output must feed only the quant (duplicate quants were merged before this runs); the
residual sum, when there is one, stays an output of the fused op.
"""

from __future__ import annotations

import torch

from fxfuse.patterns.rule import Inserter, Rule, val
from fxfuse.patterns.matcher import Alt, Match, Op
from fxfuse.patterns.quant import canonical_fp8, canonical_mxfp4
from fxfuse.patterns.rms_norm import canonical_norm

fxfuse = torch.ops.fxfuse
NAME = "rmsnorm_quant"
# Group sizes the kernel's (N / G, G) tiling handles.
KERNEL_GROUP_SIZES = (0, 32, 64, 128, 256)


def _quant_of_norm(quant: Op) -> Op:
    """The canonical quant pattern with its input required to be a canonical norm's output."""
    return Op(quant.targets, canonical_norm, *quant.args[1:], name="quant")


PATTERN = Alt(_quant_of_norm(canonical_fp8), _quant_of_norm(canonical_mxfp4))


def _outputs(m: Match):
    norm = m["norm"]
    return [m.root, norm] if norm.target is fxfuse.add_rms_norm.default else [m.root]


def guard(m: Match, ctx) -> str | None:
    x = val(m["x"])
    if x.dim() < 1:
        return "norm input is a scalar"
    if m.root.target is fxfuse.quant_fp8.default:
        if m["group_size"] not in KERNEL_GROUP_SIZES:
            return f"group size {m['group_size']} not in the kernel's {KERNEL_GROUP_SIZES}"
        if m["scale_col_major"] and x.dim() != 2:
            return "column-major group scales need a 2-D activation"
    return None


def replace(m: Match, ctx, insert: Inserter):
    norm_args = (m["eps"], m["weight_offset"], m["round_before_weight"], m["norm_dtype"],
                 m["reciprocal_sqrt"])
    if m.root.target is fxfuse.quant_fp8.default:
        quant_args = ("fp8", m["group_size"], m["fp8_dtype"], m["quant_eps"], m["eps_on_scale"],
                      m["apply_reciprocal"], m["scale_col_major"], "even")
    else:
        quant_args = ("mxfp4", 0, torch.float8_e4m3fn, 0.0, False, False, False, m["rounding"])
    if m.get("residual") is not None:
        fused = insert.call(
            fxfuse.add_rms_norm_quant.default,
            (m["x"], m["residual"], m["w"], *norm_args, *quant_args),
        )
        q, scale, h = insert.outputs(fused, 3)
        return [[q, scale], [None, h]]
    fused = insert.call(fxfuse.rms_norm_quant.default, (m["x"], m["w"], *norm_args, *quant_args))
    q, scale = insert.outputs(fused, 2)
    return [[q, scale]]


RULES = [Rule(name=NAME, pattern=PATTERN, outputs=_outputs, guard=guard, replace=replace)]
