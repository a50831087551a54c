"""Pattern `allreduce_rmsnorm`: all-reduce (sum) → [residual add →] canonical RMSNorm [→ canonical
quant [→ canonical GEMM]] → one `fxfuse.allreduce_rms_norm_quant_gemm` /
`allreduce_rms_norm_quant` / `allreduce_rms_norm` op, which picks the one-shot kernel or the
collective + fused norm-quant kernel at run time, and with the GEMM the token-count dispatch of
the `rmsnorm_quant_gemm` chain (runtime/allreduce_ops.py).

All-reduce spellings, as torch.export and torch.compile trace them:
- functional: `wait_tensor(_c10d_functional.all_reduce(x, "sum", group_name))`
  (`funcol.all_reduce`, `fxfuse.ops.all_reduce`);
- in place:   the same, then `copy_(x, reduced)` (`torch.distributed.all_reduce(x)`).
The reduced value must feed only the norm; the residual sum stays an output; a normed value also
read elsewhere (an MoE router) is kept by the `..._with_norm` ops, as in `rmsnorm_quant`. These
rules run before `rmsnorm_quant` so they take the whole chain, the GEMM included when q and scale
feed only it (the guards of `rmsnorm_quant_gemm`); otherwise the chain ends at the quant and the
GEMM stays.
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from fxfuse.patterns import gemm, rms_norm_quant
from fxfuse.patterns.matcher import Alt, Any, Getitem, Lit, Match, Op
from fxfuse.patterns.quant import VIEWS, canonical_fp8, canonical_mxfp4
from fxfuse.patterns.rule import Inserter, Rule, alias_base, val
from fxfuse.runtime import allreduce_ops  # noqa: F401 - registers torch.ops.fxfuse.allreduce_*

fxfuse = torch.ops.fxfuse
aten = torch.ops.aten
c10d = torch.ops._c10d_functional
NAME = "allreduce_rmsnorm"

# --- spellings ----------------------------------------------------------------------------------

_waited = Op(
    c10d.wait_tensor.default,
    Op(c10d.all_reduce.default, Any("local"), Lit("reduce_op"), Lit("group_name"),
       name="all_reduce"),
    name="waited",
)  # fmt: skip
# Bound as "x", the norm input, as rms_norm_quant's guard names it.
reduced = Alt(Op(aten.copy_.default, Any("local"), _waited, name="inplace_copy"), _waited, name="x")

# The norm weight is "norm_w": "w" is the GEMM's weight, as gemm's chain guard reads it.
_norm_args = (Any("norm_w"), Lit("eps"), Lit("weight_offset"), Lit("round_before_weight"),
              Lit("norm_dtype"), Lit("reciprocal_sqrt"))  # fmt: skip
plain_norm = Op(fxfuse.rms_norm.default, reduced, *_norm_args, name="norm")
# x + residual adds the same bytes either way round.
residual_norm = Alt(
    Op(fxfuse.add_rms_norm.default, reduced, Any("residual"), *_norm_args, name="norm"),
    Op(fxfuse.add_rms_norm.default, Any("residual"), reduced, *_norm_args, name="norm"),
)
_normed = Alt(plain_norm, Getitem(residual_norm, 0), name="normed_out")
_norm_rows = Alt(Op(VIEWS, _normed, Lit("rows_shape"), name="rows_view"), _normed)


def _quant_of_norm(quant: Op) -> Op:
    return Op(quant.targets, _norm_rows, *quant.args[1:], name="quant")


QUANT_PATTERN = Alt(_quant_of_norm(canonical_fp8), _quant_of_norm(canonical_mxfp4))
NORM_PATTERN = Alt(plain_norm, residual_norm)
# GEMM(q, scale, w, w_scale, out_dtype) of the quant's outputs, each possibly viewed.
GEMM_PATTERN = gemm._gemm_of(
    gemm._viewed(Getitem(QUANT_PATTERN, 0), "q_view"),
    gemm._viewed(Getitem(QUANT_PATTERN, 1), "s_view"),
)


# --- guards -------------------------------------------------------------------------------------


def _collective_guard(m: Match, ctx) -> str | None:
    op = m["reduce_op"]
    if not isinstance(op, str) or op.lower() != "sum":
        return f"all-reduce op {op!r}, not sum"
    if not isinstance(m["group_name"], str):
        return f"group {m['group_name']!r} is not a group name"
    local, out = val(m["local"]), val(m["x"])
    if not isinstance(local, torch.Tensor) or local.shape != out.shape or local.dtype != out.dtype:
        return "all-reduce input and output differ in shape or dtype"
    if m.get("inplace_copy") is not None:
        return _in_place_guard(m, ctx)
    return None


def _in_place_guard(m: Match, ctx) -> str | None:
    """The fused op reads the buffer unreduced and writes no buffer: nothing else may see it (a
    view taken before the all-reduce would read the reduced values after it)."""
    buffer = m["local"]
    if buffer.op == "placeholder":
        return f"the in-place all-reduce writes graph input {buffer.name}"
    # A view of another tensor (a slice of a wider buffer, a reshape of a GEMM's output): that
    # tensor and its other views would see the reduced values; fine where nothing else reads it.
    node = buffer
    while alias_base(node) is not node:
        base = node.args[0]
        if base.op == "placeholder":
            return f"the in-place all-reduce writes {buffer.name}, a view of input {base.name}"
        if len(base.users) != 1:
            readers = ", ".join(u.name for u in base.users if u is not node)
            return f"the in-place all-reduce writes {buffer.name}, a view of {base.name}: {readers}"
        node = base
    others = [u.name for u in buffer.users if u not in (m["all_reduce"], m["inplace_copy"])]
    if others:
        return f"the all-reduced buffer {buffer.name} has other users ({', '.join(others)})"
    return None


def _quant_guard(m: Match, ctx) -> str | None:
    return _collective_guard(m, ctx) or rms_norm_quant.guard(m, ctx)


def _gemm_guard(m: Match, ctx) -> str | None:
    return _quant_guard(m, ctx) or gemm._chain_guard(m, ctx)


# --- replacements -------------------------------------------------------------------------------


def _norm_args_of(m: Match) -> tuple:
    return (m["eps"], m["weight_offset"], m["round_before_weight"], m["norm_dtype"],
            m["reciprocal_sqrt"])  # fmt: skip


def _quant_args_of(m: Match) -> tuple:
    # As rms_norm_quant's replacement records them.
    if m["quant"].target is fxfuse.quant_fp8.default:
        return ("fp8", m["group_size"], m["fp8_dtype"], m["quant_eps"], m["eps_on_scale"],
                m["apply_reciprocal"], m["scale_col_major"], "even")  # fmt: skip
    return ("mxfp4", 0, torch.float8_e4m3fn, 0.0, False, False, False, m["rounding"])


def _replace_quant(m: Match, ctx, insert: Inserter):
    residual = m.get("residual")
    elsewhere = rms_norm_quant.read_elsewhere(m)  # y kept for its other readers
    op = fxfuse.allreduce_rms_norm_quant_with_norm if elsewhere else fxfuse.allreduce_rms_norm_quant
    fused = insert.call(
        op.default,
        (m["local"], residual, m["norm_w"], m["group_name"], *_norm_args_of(m), *_quant_args_of(m)),
    )
    q, scale, *h = insert.outputs(fused, 2 if residual is None else 3)  # no unused h
    if m.get("rows_view") is not None:
        # The fused op keeps x's leading dims; view q and scale the way the graph viewed y.
        lead = list(m["rows_shape"])[:-1]
        q = insert.call(aten.reshape.default, (q, [*lead, val(q).shape[-1]]))
        scale = insert.call(aten.reshape.default, (scale, [*lead, val(scale).shape[-1]]))
    values = [[q, scale]] if residual is None else [[q, scale], [None, h[0]]]
    if elsewhere:
        y = insert.call(operator.getitem, (fused, 3))
        values += rms_norm_quant.kept_norm_values(insert, y, elsewhere, m)
    return values


def _replace_norm(m: Match, ctx, insert: Inserter):
    residual = m.get("residual")
    fused = insert.call(
        fxfuse.allreduce_rms_norm.default,
        (m["local"], residual, m["norm_w"], m["group_name"], *_norm_args_of(m)),
    )
    y, *h = insert.outputs(fused, 1 if residual is None else 2)  # no unused h
    return [y] if residual is None else [[y, h[0]]]


def _replace_gemm(m: Match, ctx, insert: Inserter):
    residual = m.get("residual")
    elsewhere = rms_norm_quant.read_elsewhere(m)  # y kept for its other readers
    op = (fxfuse.allreduce_rms_norm_quant_gemm_with_norm if elsewhere
          else fxfuse.allreduce_rms_norm_quant_gemm)  # fmt: skip
    fused = insert.call(
        op.default,
        (m["local"], residual, m["norm_w"], m["group_name"], *_norm_args_of(m), *_quant_args_of(m),
         *gemm._dispatch_args(m, ctx)),
    )  # fmt: skip
    out = insert.call(operator.getitem, (fused, 0))
    values = [out] if residual is None else [out, [None, insert.call(operator.getitem, (fused, 1))]]
    if elsewhere:
        y = insert.call(operator.getitem, (fused, 2))
        values += rms_norm_quant.kept_norm_values(insert, y, elsewhere, m)
    return values


def _quant_outputs(m: Match) -> list[fx.Node]:
    return [m.root] if m.get("residual") is None else [m.root, m["norm"]]


def _quant_outputs_and_norm(m: Match) -> list[fx.Node]:
    """The quant chain's outputs, and the normed values read elsewhere (kept by the op)."""
    return _quant_outputs(m) + rms_norm_quant.read_elsewhere(m)


def _side_effects(m: Match) -> list[fx.Node]:
    """wait_tensor and the in-place copy_ are impure; the fused op does their work."""
    return [n for n in (m["waited"], m.get("inplace_copy")) if n is not None]


RULES = [
    # all-reduce → [residual add →] norm → quant → GEMM -> allreduce_rms_norm_quant_gemm
    # (matched down to the all-reduce, not from the next rule's op: one chain, one rewrite)
    Rule(name=NAME, pattern=GEMM_PATTERN, outputs=_quant_outputs_and_norm, guard=_gemm_guard,
         replace=_replace_gemm, mutations=_side_effects),
    # all-reduce → [residual add →] norm → quant -> allreduce_rms_norm_quant
    Rule(name=NAME, pattern=QUANT_PATTERN, outputs=_quant_outputs_and_norm, guard=_quant_guard,
         replace=_replace_quant, mutations=_side_effects),
    # all-reduce → [residual add →] norm -> allreduce_rms_norm
    Rule(name=NAME, pattern=NORM_PATTERN, outputs=lambda m: [m.root], guard=_collective_guard,
         replace=_replace_norm, mutations=_side_effects),
]  # fmt: skip
