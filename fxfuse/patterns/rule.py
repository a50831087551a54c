"""Rules as data: what a pattern module declares (SPEC's name, spellings, guard, replacement),
and the Inserter its replacement builds new nodes with."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode

from fxfuse.patterns.matcher import Match, Pat
from fxfuse.runtime import norm_quant_ops  # noqa: F401 - registers torch.ops.fxfuse.*

Guard = Callable[[Match, "Context"], "str | None"]


@dataclasses.dataclass
class Context:
    graph: fx.Graph
    report: object  # fusion.report.FusionReport
    config: object  # FusionConfig
    target: str
    fake_mode: FakeTensorMode
    # Each canonical op a canonicalization made (node name) -> the root of the spelling it replaced.
    canonical_roots: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Rule:
    """name: report key; pattern: the spellings; outputs(match) -> the matched nodes whose values
    leave the match (in order); guard(match, ctx) -> None or the reason it does not apply;
    replace(match, ctx, insert) -> one new value per output, built with `insert`."""

    name: str
    pattern: Pat
    outputs: Callable[[Match], Sequence[fx.Node]]
    replace: Callable[[Match, Context, Inserter], Sequence[fx.Node]]
    guard: Guard | None = None
    report_as: str | None = None  # near-misses are filed under this pattern name
    canonical: bool = False  # a canonicalization: counted apart from the fusions
    # In-place nodes of the match whose effect the replacement reproduces (the `copy_`s into a
    # `new_empty` buffer): the engine erases them with the match although they are impure.
    mutations: Callable[[Match], Sequence[fx.Node]] | None = None

    @property
    def report_name(self) -> str:
        return self.report_as or self.name


def val(node) -> torch.Tensor | None:
    """The fake value of a node (None for literals or nodes without one)."""
    return node.meta.get("val") if isinstance(node, fx.Node) else None


class Inserter:
    """Creates call_function nodes at one place in the graph, with their fake values."""

    def __init__(self, ctx: Context, before: fx.Node):
        self.ctx, self.before = ctx, before
        self.created: list[fx.Node] = []

    def call(self, target, args: tuple, kwargs: dict | None = None) -> fx.Node:
        kwargs = kwargs or {}
        # The fake value first: a call its fake refuses (ValueError) leaves no node behind.
        value = _fake_result(self.ctx.fake_mode, target, args, kwargs)
        with self.ctx.graph.inserting_before(self.before):
            node = self.ctx.graph.call_function(target, args, kwargs)
        node.meta["val"] = value
        self.created.append(node)
        return node

    def outputs(self, node: fx.Node, count: int) -> list[fx.Node]:
        """getitem nodes for a multi-output op."""
        return [self.call(operator.getitem, (node, i)) for i in range(count)]


def _fake_result(fake_mode: FakeTensorMode, target, args, kwargs):
    def to_fake(a):
        return a.meta["val"] if isinstance(a, fx.Node) else a

    fargs = fx.node.map_aggregate(args, to_fake)
    fkwargs = fx.node.map_aggregate(kwargs, to_fake)
    if target is operator.getitem:
        return fargs[0][fargs[1]]
    with fake_mode:
        return target(*fargs, **fkwargs)


def alias_base(node: fx.Node) -> fx.Node:
    """The node whose memory `node` views: back through ops whose result aliases their first
    argument (view, reshape, slice, transpose, ...; in-place ops, which return it) and getitems
    of the lists of views they return (split)."""
    while node.op == "call_function":
        if node.target is operator.getitem:
            producer = node.args[0]
            returns = getattr(getattr(producer, "target", None), "_schema", None)
            if returns is None or not returns.returns or returns.returns[0].alias_info is None:
                break  # an item of a call that returns new tensors (topk's values, say)
            node = producer
            continue
        schema = getattr(node.target, "_schema", None)
        first = schema.arguments[0] if schema is not None and schema.arguments else None
        if first is None or first.alias_info is None or not schema.returns:
            break
        if schema.returns[0].alias_info is None or not isinstance(node.args[0], fx.Node):
            break
        node = node.args[0]
    return node
