"""Pattern `rmsnorm_quant`: canonical [residual add →] RMSNorm → quant (FP8 per token, FP8 1×G
group, MXFP4) → one `fxfuse.rms_norm_quant` / `add_rms_norm_quant` kernel.

Duplicate quants of one norm were merged before this runs; the residual sum, when there is one,
stays an output of the fused op. Where the normed y is also read by something other than the
quant (an MoE layer's router reads the bf16 y, its experts or shared expert the quantized one),
the kernel writes y too: `rms_norm_quant_with_norm` / `add_rms_norm_quant_with_norm`, whose y
replaces the norm's for those readers. Where that quant feeds one GEMM, `rmsnorm_quant_gemm`
then takes the with-norm op and the GEMM as one chain that keeps y.
"""

from __future__ import annotations

import torch

from fxfuse.patterns.matcher import Alt, Lit, Match, Op
from fxfuse.patterns.quant import VIEWS, canonical_fp8, canonical_mxfp4
from fxfuse.patterns.rms_norm import canonical_norm
from fxfuse.patterns.rule import Inserter, Rule, val

fxfuse = torch.ops.fxfuse
aten = torch.ops.aten
NAME = "rmsnorm_quant"
# Group sizes the kernel's (N / G, G) tiling handles.
KERNEL_GROUP_SIZES = (0, 32, 64, 128, 256)


# Model code often flattens tokens before quantizing: norm(x).reshape(-1, K). RMSNorm is
# row-wise, so the fused op runs on the flattened rows instead.
_norm_rows = Alt(Op(VIEWS, canonical_norm, Lit("rows_shape"), name="rows_view"), canonical_norm)


def _quant_of_norm(quant: Op) -> Op:
    """The canonical quant pattern with its input required to be a canonical norm's output."""
    return Op(quant.targets, _norm_rows, *quant.args[1:], name="quant")


PATTERN = Alt(_quant_of_norm(canonical_fp8), _quant_of_norm(canonical_mxfp4))


def read_elsewhere(m: Match) -> list:
    """The normed values with readers outside the match: y itself (the norm node, or the add
    norm's getitem) and / or the rows view the quant reads (an MoE layer's router and its
    experts' gather read the flattened rows too), in that order."""
    inside = set(m.nodes)
    nodes = [m["normed_out"], m.get("rows_view")]
    return [n for n in nodes if n is not None and any(u not in inside for u in n.users)]


def _outputs(m: Match):
    norm = m["norm"]
    outputs = [m.root, norm] if norm.target is fxfuse.add_rms_norm.default else [m.root]
    return outputs + read_elsewhere(m)


def guard(m: Match, ctx) -> str | None:
    x = val(m["x"])
    if x.dim() < 1:
        return "norm input is a scalar"
    if m.get("rows_view") is not None:
        rows = val(m["rows_view"])
        if rows.dim() < 1 or rows.shape[-1] != x.shape[-1]:
            return f"the normed value is reshaped to {tuple(rows.shape)}, changing its rows"
        if m.root.target is fxfuse.quant_fp8.default and m["scale_col_major"]:
            return "column-major scales of a reshaped activation"
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
    x, residual = m["x"], m.get("residual")
    elsewhere = read_elsewhere(m)
    keep_y, y = bool(elsewhere), None
    if residual is not None:
        op = fxfuse.add_rms_norm_quant_with_norm if keep_y else fxfuse.add_rms_norm_quant
        fused = insert.call(op.default, (x, residual, m["w"], *norm_args, *quant_args))
        q, scale, h, *rest = insert.outputs(fused, 4 if keep_y else 3)
    else:
        op = fxfuse.rms_norm_quant_with_norm if keep_y else fxfuse.rms_norm_quant
        fused = insert.call(op.default, (x, m["w"], *norm_args, *quant_args))
        (q, scale, *rest), h = insert.outputs(fused, 3 if keep_y else 2), None
    if keep_y:
        (y,) = rest
    if m.get("rows_view") is not None:
        # The fused op keeps x's leading dims; view q and scale the way the graph viewed y.
        lead = list(m["rows_shape"])[:-1]
        q = insert.call(aten.reshape.default, (q, [*lead, val(q).shape[-1]]))
        scale = insert.call(aten.reshape.default, (scale, [*lead, val(scale).shape[-1]]))
    values = [[q, scale]] if h is None else [[q, scale], [None, h]]
    return values + kept_norm_values(insert, y, elsewhere, m)


def kept_norm_values(insert: Inserter, y, elsewhere: list, m: Match) -> list:
    """The replacements of the normed values read elsewhere (`read_elsewhere`): the fused op's
    y, or y viewed as the graph viewed it (the rows view)."""
    rows = list(m["rows_shape"]) if m.get("rows_view") is not None else None
    return [
        y if node is m["normed_out"] else insert.call(aten.reshape.default, (y, rows))
        for node in elsewhere
    ]


RULES = [Rule(name=NAME, pattern=PATTERN, outputs=_outputs, guard=guard, replace=replace)]
