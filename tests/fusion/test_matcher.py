"""The declarative matcher's rule for the arguments a pattern does not name: those with a schema
default must hold it, unless they only say how the result is stored (or, for a factory op, its
dtype, which the node's meta value shows)."""

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from fxfuse.patterns.matcher import Any, Lit, Op, match_at

aten = torch.ops.aten


def _node(fn, *args, target):
    gm = make_fx(fn)(*args)
    return next(n for n in gm.graph.nodes if n.target is target)


def test_an_unnamed_argument_off_its_default_refuses_the_match():
    x = torch.randn(4, 8)
    low = _node(lambda t: torch.clamp(t, min=0.5), x, target=aten.clamp.default)
    both = _node(lambda t: torch.clamp(t, 0.5, 1.0), x, target=aten.clamp.default)
    pattern = Op(aten.clamp.default, Any("x"), Lit("lo"))
    assert match_at(pattern, low)["lo"] == 0.5
    assert match_at(pattern, both) is None  # max = 1.0 would be ignored
    named = Op(aten.clamp.default, Any("x"), Lit("lo"), max=Lit("hi"))
    assert match_at(named, both)["hi"] == 1.0


def test_add_with_alpha_and_a_reduction_dtype_refuse():
    x = torch.randn(4, 8)
    add = Op(aten.add.Tensor, Any(), Any())
    assert match_at(add, _node(lambda t: t + t, x, target=aten.add.Tensor)) is not None
    scaled = _node(lambda t: torch.add(t, t, alpha=2), x, target=aten.add.Tensor)
    assert match_at(add, scaled) is None
    total = Op(aten.sum.dim_IntList, Any(), Lit(), Lit())
    plain = _node(lambda t: t.sum(-1, keepdim=True), x, target=aten.sum.dim_IntList)
    wide = _node(lambda t: t.sum(-1, True, dtype=torch.float64), x, target=aten.sum.dim_IntList)
    assert match_at(total, plain) is not None
    assert match_at(total, wide) is None


def test_storage_arguments_and_a_factory_dtype_do_not_refuse():
    x = torch.randn(4, 8)
    clone = _node(
        lambda t: t.clone(memory_format=torch.contiguous_format), x, target=aten.clone.default
    )
    assert match_at(Op(aten.clone.default, Any()), clone) is not None
    full = _node(
        lambda t: t + torch.full((8,), 2.0, dtype=torch.float64), x, target=aten.full.default
    )
    assert match_at(Op(aten.full.default, Lit(), Lit("value")), full)["value"] == 2.0
