"""A small declarative matcher over torch.fx graphs.

A pattern is a tree of `Pat` objects matched from a root node towards its inputs:

    Op(aten.rsqrt.default, Op(aten.add.Tensor, ms, Lit("eps"), commutative=True))

- `Op(targets, *args, commutative=False, name=None, **kwargs)`: a call_function node whose target is
  one of `targets`; positional patterns match the node's arguments as normalized by the op schema
  (defaults filled), keyword patterns match named arguments. An argument with a schema default
  that the pattern names neither way must hold that default (clamp's `max`, add's `alpha`), except
  the few that only say where or how the result is stored (`STORAGE_ARGS`): a pattern never
  matches an op whose unnamed arguments change its values.
- `Any(name)`: anything (a node or a literal), bound to `name`.
- `Lit(name, value=...)`: a non-node literal (optionally equal to `value`), bound to `name`.
- `Alt(*pats, name=None)`: the first alternative that matches (with backtracking).
- `Cast(inner, dtype=None)`: any dtype conversion (aten.to, _to_copy, convert_element_type,
  type_as); binds the target dtype to `dtype` if given as a string.
- `Maybe(wrap, inner)`: `wrap(inner)` or `inner` itself (an optional cast, say).

A name bound twice must see the same value; two casts of the same node to the same dtype count as
the same value (models write `x.float()` twice). Matching yields `Match` objects: the bindings and
the nodes the pattern covered.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import operator
from collections.abc import Callable, Iterator
from typing import Any as AnyType

import torch
from torch import fx
from torch.fx.operator_schemas import normalize_function

aten = torch.ops.aten
prims = torch.ops.prims

CAST_TARGETS = (
    aten.to.dtype,
    aten.to.dtype_layout,
    aten._to_copy.default,
    prims.convert_element_type.default,
    aten.type_as.default,
)
# Schema arguments that say where or how a result is stored, not what its values are: an Op
# pattern that does not name them matches whatever they hold.
STORAGE_ARGS = frozenset({"memory_format", "non_blocking", "layout", "pin_memory", "device"})


@dataclasses.dataclass
class Match:
    root: fx.Node
    bindings: dict[str, AnyType]
    nodes: list[fx.Node]  # every node the pattern covered, root included

    def __getitem__(self, name: str) -> AnyType:
        return self.bindings[name]

    def get(self, name: str, default: AnyType = None) -> AnyType:
        return self.bindings.get(name, default)


class _State:
    __slots__ = ("bindings", "nodes")

    def __init__(self, bindings: dict, nodes: list):
        self.bindings = bindings
        self.nodes = nodes

    def copy(self) -> _State:
        return _State(dict(self.bindings), list(self.nodes))


def cast_source(node: AnyType) -> tuple[AnyType, torch.dtype | None]:
    """(input, target dtype) of a cast node, else (node, None)."""
    if isinstance(node, fx.Node) and node.op == "call_function" and node.target in CAST_TARGETS:
        if node.target is aten.type_as.default:
            other = node.args[1]
            return node.args[0], other.meta["val"].dtype if "val" in other.meta else None
        args = normalized_args(node)
        return next(iter(args.values())), args.get("dtype")
    return node, None


def same_value(a: AnyType, b: AnyType) -> bool:
    if a is b:
        return True
    if isinstance(a, fx.Node) and isinstance(b, fx.Node):
        (sa, da), (sb, db) = cast_source(a), cast_source(b)
        return da is not None and da == db and same_value(sa, sb)
    if isinstance(a, fx.Node) or isinstance(b, fx.Node):
        return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - tensors and odd literals compare as different
        return False


def normalized_args(node: fx.Node) -> dict[str, AnyType]:
    """The node's arguments by schema name, defaults filled (cached on the node)."""
    cached = node.meta.get("_fxfuse_args")
    if cached is not None and cached[0] == (node.args, tuple(node.kwargs.items())):
        return cached[1]
    args: dict[str, AnyType] | None = None
    if isinstance(node.target, torch._ops.OpOverload):
        pair = normalize_function(
            node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True
        )
        if pair is not None:
            args = _schema_dtypes(node.target, dict(pair.kwargs))
    if args is None:
        args = {f"arg{i}": a for i, a in enumerate(node.args)} | dict(node.kwargs)
    node.meta["_fxfuse_args"] = ((node.args, tuple(node.kwargs.items())), args)
    return args


def _schema_dtypes(target: torch._ops.OpOverload, args: dict[str, AnyType]) -> dict[str, AnyType]:
    """Schema defaults fill a ScalarType argument the graph left out with its enum int (24 for
    float8_e4m3fn); patterns compare torch.dtypes, so those become dtypes."""
    for arg in target._schema.arguments:
        value = args.get(arg.name)
        scalar_type = "ScalarType" in str(arg.real_type)
        if scalar_type and isinstance(value, int) and not isinstance(value, bool):
            args[arg.name] = _dtype_of_enum(value)
    return args


@functools.cache
def _dtype_of_enum(value: int) -> torch.dtype:
    # torch exposes no enum -> dtype table; an op that takes a ScalarType converts it.
    return aten.scalar_tensor.default(0, dtype=value, device="cpu").dtype


class Pat(abc.ABC):
    name: str | None = None

    @abc.abstractmethod
    def match(self, value: AnyType, state: _State) -> Iterator[_State]:
        """Every way `value` matches this pattern, as states extending `state`."""

    def _bind(self, value: AnyType, state: _State) -> bool:
        if self.name is None:
            return True
        if self.name in state.bindings:
            return same_value(state.bindings[self.name], value)
        state.bindings[self.name] = value
        return True


class Any(Pat):
    def __init__(self, name: str | None = None):
        self.name = name

    def match(self, value, state):
        state = state.copy()
        if self._bind(value, state):
            yield state


class Lit(Pat):
    _UNSET = object()

    def __init__(self, name: str | None = None, value: AnyType = _UNSET):
        self.name, self.value = name, value

    def match(self, value, state):
        if isinstance(value, fx.Node):
            return
        if self.value is not Lit._UNSET and not same_value(value, self.value):
            return
        state = state.copy()
        if self._bind(value, state):
            yield state


class Op(Pat):
    def __init__(
        self,
        targets: AnyType,
        *args: Pat | AnyType,
        commutative: bool = False,
        name: str | None = None,
        where: Callable[[fx.Node], bool] | None = None,
        **kwargs: Pat | AnyType,
    ):
        self.targets = tuple(targets) if isinstance(targets, (tuple, list)) else (targets,)
        self.args = [_as_pat(a) for a in args]
        self.kwargs = {k: _as_pat(v) for k, v in kwargs.items()}
        self.commutative = commutative
        self.name = name
        self.where = where

    def match(self, value, state):
        if not (isinstance(value, fx.Node) and value.op == "call_function"):
            return
        if value.target not in self.targets or (self.where and not self.where(value)):
            return
        named = normalized_args(value)
        positional = list(named.values())
        if len(positional) < len(self.args):
            return
        if not _unnamed_at_defaults(value, named, len(self.args), self.kwargs):
            return
        orders = [positional[: len(self.args)]]
        if self.commutative and len(self.args) == 2:
            orders.append(orders[0][::-1])
        for order in orders:
            start = state.copy()
            if not self._bind(value, start):
                continue
            start.nodes.append(value)
            pairs = list(zip(self.args, order)) + [
                (p, named.get(k)) for k, p in self.kwargs.items()
            ]
            yield from _match_all(pairs, start)


class Alt(Pat):
    def __init__(self, *pats: Pat, name: str | None = None):
        self.pats = [_as_pat(p) for p in pats]
        self.name = name

    def match(self, value, state):
        for pat in self.pats:
            for result in pat.match(value, state):
                if self._bind(value, result):
                    yield result


class Cast(Pat):
    def __init__(self, inner: Pat | AnyType, dtype: str | torch.dtype | None = None, name=None):
        self.inner = _as_pat(inner)
        self.dtype = dtype
        self.name = name

    def match(self, value, state):
        source, dtype = cast_source(value)
        if dtype is None:
            return
        state = state.copy()
        if isinstance(self.dtype, torch.dtype):
            if dtype != self.dtype:
                return
        elif isinstance(self.dtype, str):
            if self.dtype in state.bindings and state.bindings[self.dtype] != dtype:
                return
            state.bindings[self.dtype] = dtype
        if not self._bind(value, state):
            return
        state.nodes.append(value)
        yield from self.inner.match(source, state)


def Maybe(wrap: Callable[[Pat], Pat], inner: Pat | AnyType, name: str | None = None) -> Pat:
    """`wrap(inner)` or `inner` alone (an optional cast or view)."""
    inner = _as_pat(inner)
    return Alt(wrap(inner), inner, name=name)


def Getitem(inner: Pat, index: int) -> Op:
    return Op(operator.getitem, inner, Lit(value=index))


def _as_pat(value: Pat | AnyType) -> Pat:
    return value if isinstance(value, Pat) else Lit(value=value)


def _unnamed_at_defaults(node: fx.Node, named: dict, listed: int, kwargs: dict) -> bool:
    """Whether every schema argument with a default past the first `listed`, not in `kwargs` nor
    in STORAGE_ARGS, holds its default: the pattern did not look at it, so it must not matter.
    Arguments without a default are the pattern's (or its guard's) to check."""
    if not isinstance(node.target, torch._ops.OpOverload):
        return True
    schema = node.target._schema.arguments
    factory = any(arg.name == "layout" for arg in schema)
    for arg in schema[listed:]:
        if arg.name in kwargs or arg.name in STORAGE_ARGS or not arg.has_default_value():
            continue
        if factory and arg.name == "dtype":
            # a factory op's (full, empty, new_ones ...: it takes a layout) dtype is that of the
            # tensor it makes, which its meta value shows and the guards read there
            continue
        if arg.name in named and not _is_default(named[arg.name], arg.default_value):
            return False
    return True


def _is_default(value: AnyType, default: AnyType) -> bool:
    if isinstance(value, fx.Node):
        return False
    if isinstance(default, (list, tuple)) or isinstance(value, (list, tuple)):
        return list(value or []) == list(default or [])
    if isinstance(value, torch.dtype) and isinstance(default, int):
        return value == _dtype_of_enum(default)
    return same_value(value, default)


def _match_all(pairs: list, state: _State) -> Iterator[_State]:
    if not pairs:
        yield state
        return
    (pat, value), rest = pairs[0], pairs[1:]
    for result in pat.match(value, state):
        yield from _match_all(rest, result)


def match_at(pattern: Pat, node: fx.Node) -> Match | None:
    """The first match of `pattern` rooted at `node`, or None."""
    for state in pattern.match(node, _State({}, [])):
        nodes = list(dict.fromkeys(state.nodes))
        return Match(node, state.bindings, nodes)
    return None
