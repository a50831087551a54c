"""Canonicalization of dynamic FP8 quant spellings into `torch.ops.fxfuse.quant_fp8`, and the
merge of duplicate quants of one tensor.

Per token:  amax = x.abs().amax(-1, keepdim=True).float()      (or .max(-1, keepdim=True)[0])
            s = amax.clamp(min=eps) / FP8_MAX                  (or (amax / FP8_MAX).clamp(min=eps))
            q = (x / s).clamp(-FP8_MAX, FP8_MAX).to(fp8)       (or x * s.reciprocal(), x * (1 / s))
1×G group:  the same over x.view(..., K / G, G), q viewed back to (..., K), s (..., K / G, 1).
The literal FP8_MAX must be the dtype's max; eps is taken from the graph.
"""

from __future__ import annotations

import torch

from fxfuse.kernels.formats import FP8_DTYPES
from fxfuse.patterns.common import (
    DIV,
    FLOAT_DTYPES,
    MUL,
    as_float,
    aten,
    is_last_dim,
    literal_wanted,
    maybe_cast,
    sizes_of,
)
from fxfuse.patterns.matcher import Alt, Any, Cast, Getitem, Lit, Match, Op, cast_source
from fxfuse.patterns.rule import Inserter, Rule, val

fxfuse = torch.ops.fxfuse
REPORT_AS = "rmsnorm_quant"
# The group view x.view(..., K / G, G), also spelled x.unflatten(-1, (-1, G)) (export keeps it).
VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.unflatten.int)

# --- spellings ----------------------------------------------------------------------------------

x32 = maybe_cast(Any("x"), torch.float32)
abs_x = Op(aten.abs.default, x32)
amax = maybe_cast(
    Alt(
        Op(aten.amax.default, abs_x, Lit("amax_dim"), True),
        Getitem(Op(aten.max.dim, abs_x, Lit("amax_dim"), True), 0),
    ),
    torch.float32,
)
clamp_eps = (aten.clamp.default, aten.clamp_min.default)
# FP8_MAX as a graph value: torch.compile(dynamic=True) passes Python floats as graph inputs
# (they are not specialized), so the literal is unknown here; matched to say so (a near-miss).
fp8_max = Alt(Lit("fp8_max"), Any("fp8_max_input"))
scale = Alt(
    Op(DIV, Op(clamp_eps, amax, Lit("eps")), fp8_max),
    Op(clamp_eps, Op(DIV, amax, fp8_max), Lit("eps"), name="eps_on_scale"),
    name="scale",
)
scaled = Alt(
    Op(DIV, x32, scale),
    Op(MUL, x32, Op(aten.reciprocal.default, scale, name="reciprocal"), commutative=True),
)
clamped = Alt(
    Op(aten.clamp.default, scaled, Lit("lo"), Lit("hi")),
    Op(aten.clamp_max.default, Op(aten.clamp_min.default, scaled, Lit("lo")), Lit("hi")),
    Op(aten.clamp_min.default, Op(aten.clamp_max.default, scaled, Lit("hi")), Lit("lo")),
)
fp8_quant = Cast(clamped, "fp8_dtype")


# --- guard --------------------------------------------------------------------------------------


def _group_source(x_node) -> tuple[object, int] | None:
    """(2-D-or-more source, group size) when x is `src.view(..., K / G, G)`."""
    if not (hasattr(x_node, "target") and x_node.target in VIEWS):
        return None
    src, v = x_node.args[0], val(x_node)
    sv = val(src)
    if sv is None or v.dim() != sv.dim() + 1 or tuple(v.shape[:-2]) != tuple(sv.shape[:-1]):
        return None
    if v.shape[-2] * v.shape[-1] != sv.shape[-1]:
        return None
    return src, int(v.shape[-1])


def _guard(m: Match, ctx) -> str | None:
    if m["fp8_dtype"] not in FP8_DTYPES:
        return f"amax-scaled value cast to {m['fp8_dtype']}, not an FP8 dtype"
    x = val(m["x"])
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOAT_DTYPES:
        return "quant input is not a float tensor"
    if not is_last_dim(m["amax_dim"], x.dim()):
        return f"amax over dim {m['amax_dim']}, not the last dim"
    q = val(m.root)
    if isinstance(q, torch.Tensor) and not q.is_contiguous():
        return f"the quantized value has strides {tuple(q.stride())}; the op's are contiguous"
    scale_dtype = getattr(val(m["scale"]), "dtype", None)
    clamped_dtype = getattr(val(m.root.args[0]), "dtype", None)
    if scale_dtype != torch.float32 or clamped_dtype != torch.float32:
        # the canonical op computes the scale and the scaled values in fp32
        return f"the scale is computed in {scale_dtype} (scaled values {clamped_dtype}), not fp32"
    if m.get("fp8_max_input") is not None:
        return literal_wanted(m["fp8_max_input"], "the scale's divisor (FP8_MAX)")
    fp8_max = float(torch.finfo(m["fp8_dtype"]).max)
    if as_float(m["fp8_max"]) != fp8_max:
        return f"scale divides by {m['fp8_max']}, not {m['fp8_dtype']}'s max {fp8_max}"
    if as_float(m["lo"]) != -fp8_max or as_float(m["hi"]) != fp8_max:
        return f"clamp to [{m['lo']}, {m['hi']}], not ±{fp8_max}"
    eps = as_float(m["eps"])
    if eps is None or eps < 0:
        return f"scale eps {m['eps']!r} is not a non-negative literal"
    return None


def _replace(m: Match, ctx, insert: Inserter):
    group = _group_source(m["x"])
    source, group_size = group if group else (m["x"], 0)
    # x.float() of a bf16/fp16 tensor is exact and the canonical op upcasts itself: quantize the
    # narrower tensor, so the fusion rules see the norm that produced it.
    inner, dtype = cast_source(source)
    if dtype == torch.float32 and getattr(val(inner), "dtype", None) in (torch.bfloat16, torch.float16):
        source = inner
    args = (
        group_size,
        m["fp8_dtype"],
        float(m["eps"]),
        "eps_on_scale" in m.bindings,
        "reciprocal" in m.bindings,
        False,
    )
    node = insert.call(fxfuse.quant_fp8.default, (source, *args))
    q, s = insert.outputs(node, 2)
    if group:
        # Back to the graph's shapes: q (..., K) and s (..., K / G, 1), the leading dims those of
        # the source (sym_size nodes where symbolic, never the capture's symbols as literals).
        lead = val(source).dim() - 1
        q_shape = [*sizes_of(insert, source, lead), *list(val(m.root).shape)[lead:]]
        s_shape = [*sizes_of(insert, source, lead), *list(val(m["scale"]).shape)[lead:]]
        q = insert.call(aten.view.default, (q, q_shape))
        s = insert.call(aten.view.default, (s, s_shape))
    return [q, s]


QUANT_RULES = [
    Rule(
        name="quant_fp8",
        pattern=fp8_quant,
        outputs=lambda m: [m.root, m["scale"]],
        guard=_guard,
        replace=_replace,
        report_as=REPORT_AS,
        canonical=True,
    )
]

RULES = QUANT_RULES

# The canonical quant nodes fusion rules consume.
canonical_fp8 = Op(
    fxfuse.quant_fp8.default,
    Any("normed"),
    Lit("group_size"),
    Lit("fp8_dtype"),
    Lit("quant_eps"),
    Lit("eps_on_scale"),
    Lit("apply_reciprocal"),
    Lit("scale_col_major"),
    name="quant",
)
canonical_mxfp4 = Op(fxfuse.quant_mxfp4.default, Any("normed"), Lit("rounding"), name="quant")

CANONICAL_TARGETS = (
    fxfuse.rms_norm.default,
    fxfuse.add_rms_norm.default,
    fxfuse.quant_fp8.default,
    fxfuse.quant_mxfp4.default,
)
