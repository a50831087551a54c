"""Pattern pieces and guard helpers shared by the pattern modules."""

from __future__ import annotations

import sympy
import torch
from torch import fx

from fxfuse.patterns.matcher import Alt, Cast, Lit, Op, cast_source
from fxfuse.patterns.rule import val

aten = torch.ops.aten
FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

ADD = (aten.add.Tensor, aten.add.Scalar)
SUB = (aten.sub.Tensor, aten.sub.Scalar)
MUL = (aten.mul.Tensor, aten.mul.Scalar)
DIV = (aten.div.Tensor, aten.div.Scalar)


def maybe_cast(inner, dtype=None, name=None):
    """`inner` or any cast of it (to `dtype` when given)."""
    return Alt(Cast(inner, dtype), inner, name=name)


def is_last_dim(dims, ndim: int) -> bool:
    """`dims` names exactly the last dim (as -1 or ndim-1)."""
    if isinstance(dims, int):
        dims = [dims]
    return isinstance(dims, (list, tuple)) and len(dims) == 1 and dims[0] in (-1, ndim - 1)


def static_int(size) -> int | None:
    """A size as a Python int, or None when it is symbolic."""
    if isinstance(size, int):
        return size
    expr = getattr(getattr(size, "node", None), "expr", None)
    if isinstance(expr, sympy.Integer):
        return int(expr)
    return None


def sizes_of(build, node: fx.Node, dims: int) -> list:
    """The first `dims` sizes of node, for a view's shape argument: ints where static, -1 for a
    single symbolic one, else sym_size nodes (a capture's symbols never go into the graph as
    literals)."""
    shape = val(node).shape[:dims]
    symbolic = [i for i, s in enumerate(shape) if static_int(s) is None]
    if len(symbolic) == 1:
        return [-1 if i in symbolic else static_int(s) for i, s in enumerate(shape)]
    return [
        static_int(s) if i not in symbolic else build.call(aten.sym_size.int, (node, i))
        for i, s in enumerate(shape)
    ]


def same_size(a, b) -> bool:
    """Two sizes are provably equal (ints or sympy expressions)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    ea = getattr(getattr(a, "node", None), "expr", a)
    eb = getattr(getattr(b, "node", None), "expr", b)
    try:
        return sympy.simplify(sympy.sympify(ea) - sympy.sympify(eb)) == 0
    except (sympy.SympifyError, TypeError):
        return False


def as_float(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def literal_wanted(node: fx.Node, what: str) -> str:
    """Why a graph value stands where a literal (`what`: eps, FP8_MAX) must be. A graph input
    (a Python float torch.compile(dynamic=True) did not specialize: a SymFloat, or a 0-d tensor
    input, maybe cast) gets the reason and the two ways around it."""
    source, dtype = cast_source(node)
    while dtype is not None and isinstance(source, fx.Node):
        source, dtype = cast_source(source)
    value = val(source)
    if isinstance(source, fx.Node) and source.op == "placeholder" and (
        isinstance(value, (float, torch.SymFloat))
        or (isinstance(value, torch.Tensor) and value.dim() == 0)
    ):
        return (
            f"{what} is the graph input {source.name}, not a literal: torch.compile(dynamic=True) "
            "passes Python floats as graph inputs; mark the token dim dynamic instead "
            "(torch._dynamo.mark_dynamic) or set torch._dynamo.config.specialize_float = True"
        )
    return f"{what} is the graph value {node.name}, not a literal"


def tensor_of(node, what: str) -> tuple[torch.Tensor | None, str | None]:
    """(fake value, None) or (None, reason) for a node that should be a tensor."""
    v = val(node)
    if not isinstance(v, torch.Tensor):
        return None, f"{what} has no tensor metadata"
    return v, None


def last_dim_contiguous(v: torch.Tensor) -> bool:
    return v.dim() >= 1 and (v.shape[-1] == 1 or v.stride(-1) == 1)


def mean_spelling(sq):
    """mean(sq, -1, keepdim) spelled as mean, or sum / N, or sum * (1 / N)."""
    total = Op(aten.sum.dim_IntList, sq, name="reduce", dim=Lit("dim"), keepdim=True)
    return Alt(
        Op(aten.mean.dim, sq, name="reduce", dim=Lit("dim"), keepdim=True),
        Op(DIV, total, Lit("mean_n")),
        Op(MUL, total, Lit("mean_recip_n"), commutative=True),
    )
