"""Canonicalization of RMSNorm spellings into `torch.ops.fxfuse.rms_norm` / `add_rms_norm`.

Each spelling records where it rounds (SPEC §3) so the canonical op, and every fused kernel built
on it, gives the spelled bytes:
- Llama / DeepSeek: `w * (h32 * rsqrt(mean(h32², -1) + eps)).to(h.dtype)`  (round, then weight)
- mul-then-cast:    `(h32 * rsqrt(...) * w).to(dtype)`, F.rms_norm / aten.rms_norm
- Gemma:            `(h32 * rsqrt(...) * (1 + w.float())).to(dtype)`
with `x*x` or `square` for `pow(2)`, `1/sqrt` (recorded: it rounds differently) for `rsqrt`, sum/N
for mean, and h itself (promoted) for the cast h in `h · inv` (T5 / older HF).
A residual add feeding the norm becomes `add_rms_norm`, whose second output is the sum.
"""

from __future__ import annotations

import torch

from fxfuse.patterns.common import (
    ADD,
    DIV,
    FLOAT_DTYPES,
    MUL,
    as_float,
    aten,
    is_last_dim,
    literal_wanted,
    maybe_cast,
    mean_spelling,
    same_size,
    static_int,
    tensor_of,
)
from fxfuse.patterns.matcher import Alt, Any, Cast, Getitem, Lit, Match, Op
from fxfuse.patterns.rule import Inserter, Rule, val

fxfuse = torch.ops.fxfuse
REPORT_AS = "rmsnorm_quant"

# --- spellings ----------------------------------------------------------------------------------

h32 = maybe_cast(Any("h"), torch.float32, name="h32")
square = Alt(
    Op(aten.pow.Tensor_Scalar, h32, 2), Op(MUL, h32, h32), Op(aten.square.default, h32)
)
# eps as a graph value: torch.compile(dynamic=True) passes a Python float argument (a norm
# function's `eps`) as a graph input; matched to say so (a near-miss), as quant.py does FP8_MAX.
eps = Alt(Lit("eps"), Any("eps_input"))
var_eps = Op(ADD, mean_spelling(square), eps, commutative=True)
inv_rms = Alt(
    Op(aten.rsqrt.default, var_eps),
    Op(aten.reciprocal.default, Op(aten.sqrt.default, var_eps), name="reciprocal_sqrt"),
    Op(DIV, Lit(value=1.0), Op(aten.sqrt.default, var_eps), name="reciprocal_sqrt"),
)
# h itself may multiply the fp32 inverse (T5 / older HF: `h * rsqrt(var + eps)`, promoted to
# fp32, the same product as the cast h's); the guard checks the product is fp32.
normed = Op(MUL, Alt(h32, Any("h")), inv_rms, commutative=True, name="normed")
weight = Any("w")


def _spellings() -> dict[str, object]:
    weight32 = maybe_cast(weight, torch.float32)
    return {
        # w * normed.to(dtype)
        "llama": Op(MUL, weight, Cast(normed, "round_dtype"), commutative=True),
        # (normed * w).to(dtype)
        "mul_then_cast": Cast(Op(MUL, normed, weight32, commutative=True), "out_dtype"),
        # (normed * (1 + w.float())).to(dtype)
        "gemma": Cast(
            Op(
                MUL,
                normed,
                Op(ADD, Lit("offset"), weight32, commutative=True),
                commutative=True,
            ),
            "out_dtype",
        ),
        # all fp32: normed * w
        "fp32": Op(MUL, normed, weight, commutative=True, name="fp32_out"),
        # aten.rms_norm (export keeps it; F.rms_norm)
        "aten": Op(
            aten.rms_norm.default,
            Any("h"),
            Lit("normalized_shape"),
            Any("w"),
            eps,
            name="aten_rms_norm",
        ),
    }


# --- guards -------------------------------------------------------------------------------------


def _mean_rounding(m: Match, n, target: str) -> str | None:
    """The canonical op's mean rounds as torch's `mean` on the target: sum / N on the CPU,
    sum · fp32(1 / N) on a GPU (kernels/rms_norm_quant.py). The other spelling rounds
    differently unless 1 / N is exact (N a power of 2)."""
    n = static_int(n)
    if n is not None and n > 0 and not n & (n - 1):
        return None
    if m.get("mean_recip_n") is not None and target == "cpu":
        return f"sum · (1/{n}) on the CPU target, where the op's mean is sum / {n}"
    if m.get("mean_n") is not None and target != "cpu":
        return f"sum / {n} on a GPU target ({target}), where the op's mean is sum · (1/{n})"
    return None


def _guard(style: str):
    def guard(m: Match, ctx) -> str | None:
        h, why = tensor_of(m["h"], "norm input")
        if why:
            return why
        if h.dtype not in FLOAT_DTYPES:
            return f"norm input dtype {h.dtype} is not bf16/fp16/fp32"
        out = val(m.root)
        if isinstance(out, torch.Tensor) and not out.is_contiguous():
            # a permuted dense input: eager's elementwise outputs keep its layout, the op's do not
            return f"the norm's output has strides {tuple(out.stride())}; the op's are contiguous"
        n = h.shape[-1]
        w, why = tensor_of(m["w"], "norm weight")
        if why:
            return why
        if w.dim() != 1 or not same_size(w.shape[0], n):
            return f"weight shape {tuple(w.shape)} is not per-column ({n},)"
        if w.dtype not in FLOAT_DTYPES:
            return f"weight dtype {w.dtype} is not a float dtype"
        if m.get("eps_input") is not None:
            return literal_wanted(m["eps_input"], "eps")
        if style == "aten":
            shape = m["normalized_shape"]
            if len(shape) != 1 or not same_size(shape[0], n):
                return f"aten.rms_norm over {list(shape)}, not the last dim"
            return None
        if not is_last_dim(m["dim"], h.dim()):
            return f"mean over dim {m['dim']}, not the last dim"
        if m.get("mean_n") is not None and not same_size(m["mean_n"], n):
            return f"sum divided by {m['mean_n']}, not the row length {n}"
        if m.get("mean_recip_n") is not None and as_float(m["mean_recip_n"]) != 1.0 / n:
            return f"sum scaled by {m['mean_recip_n']}, not 1/{n}"
        reason = _mean_rounding(m, n, ctx.target)
        if reason:
            return reason
        eps = as_float(m["eps"])
        if eps is None or eps < 0:
            return f"eps {m['eps']!r} is not a non-negative literal"
        if val(m["h32"]).dtype != torch.float32:
            return "statistics are not computed in fp32"
        if val(m["normed"]).dtype != torch.float32:
            return f"h · inv is computed in {val(m['normed']).dtype}, not fp32"
        if style == "llama" and m["round_dtype"] != h.dtype:
            return f"normed value rounded to {m['round_dtype']}, not the input dtype {h.dtype}"
        if style == "gemma" and as_float(m["offset"]) is None:
            return f"weight offset {m['offset']!r} is not a literal"
        if style == "fp32" and (h.dtype != torch.float32 or w.dtype != torch.float32):
            return "uncast normed * weight needs fp32 input and weight"
        return None

    return guard


# --- replacement --------------------------------------------------------------------------------


def _replace(style: str):
    def replace(m: Match, ctx, insert: Inserter):
        out_dtype = val(m.root).dtype
        if style == "aten":
            # aten.rms_norm computes in fp32 and rounds once, after the weight; eps None means
            # the fp32 machine epsilon.
            eps = m["eps"] if m["eps"] is not None else torch.finfo(torch.float32).eps
            args = (float(eps), 0.0, False, out_dtype, False)
        else:
            offset = float(m["offset"]) if style == "gemma" else 0.0
            round_first = style == "llama"
            args = (float(m["eps"]), offset, round_first, out_dtype, "reciprocal_sqrt" in m.bindings)
        return [insert.call(fxfuse.rms_norm.default, (m["h"], m["w"], *args))]

    return replace


def _norm_rule(style: str, pattern) -> Rule:
    return Rule(
        name=f"rms_norm[{style}]",
        pattern=pattern,
        outputs=lambda m: [m.root],
        guard=_guard(style),
        replace=_replace(style),
        report_as=REPORT_AS,
        canonical=True,
    )


NORM_RULES = [_norm_rule(style, pattern) for style, pattern in _spellings().items()]


# --- residual absorption: rms_norm(x + r) -> add_rms_norm(x, r) ----------------------------------

_residual_add = Op(aten.add.Tensor, Any("x"), Any("residual"), name="sum")
_norm_of_sum = Op(
    fxfuse.rms_norm.default,
    _residual_add,
    Any("w"),
    Lit("eps"),
    Lit("offset"),
    Lit("round_before_weight"),
    Lit("out_dtype"),
    Lit("reciprocal_sqrt"),
)


def _residual_guard(m: Match, ctx) -> str | None:
    x, r, s = val(m["x"]), val(m["residual"]), val(m["sum"])
    if not (isinstance(x, torch.Tensor) and isinstance(r, torch.Tensor)):
        return "residual add of a non-tensor"
    if x.shape != r.shape or x.dtype != r.dtype or s.dtype != x.dtype:
        return "residual add broadcasts or promotes"
    return None


def _residual_replace(m: Match, ctx, insert: Inserter):
    args = (m["eps"], m["offset"], m["round_before_weight"], m["out_dtype"], m["reciprocal_sqrt"])
    fused = insert.call(fxfuse.add_rms_norm.default, (m["x"], m["residual"], m["w"], *args))
    y, h = insert.outputs(fused, 2)
    return [y, h]


RESIDUAL_RULES = [
    Rule(
        name="add_rms_norm",
        pattern=_norm_of_sum,
        outputs=lambda m: [m.root, m["sum"]],
        guard=_residual_guard,
        replace=_residual_replace,
        report_as=REPORT_AS,
        canonical=True,
    )
]

RULES = NORM_RULES + RESIDUAL_RULES

# The canonical norm values fusion rules consume: y of rms_norm, or y of add_rms_norm.
canonical_norm = Alt(
    Op(fxfuse.rms_norm.default, Any("x"), Any("w"), Lit("eps"), Lit("weight_offset"),
       Lit("round_before_weight"), Lit("norm_dtype"), Lit("reciprocal_sqrt"), name="norm"),
    Getitem(
        Op(fxfuse.add_rms_norm.default, Any("x"), Any("residual"), Any("w"), Lit("eps"),
           Lit("weight_offset"), Lit("round_before_weight"), Lit("norm_dtype"),
           Lit("reciprocal_sqrt"), name="norm"),
        0,
    ),
    name="normed_out",
)
