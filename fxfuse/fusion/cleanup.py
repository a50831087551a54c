"""Graph hygiene around the passes: identities the spellings leave, duplicate canonical ops, DCE,
and the lint that runs after every pass."""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from fxfuse.patterns.rule import alias_base, val

aten = torch.ops.aten
VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)


def simplify(graph: fx.Graph) -> None:
    """Drops metadata asserts, unused getitems (max.dim's indices) and other unused pure nodes
    (vLLM's `mask = full_like(...)` before `mask = lo & hi`: a reader that would block a
    rewrite), `x * 1` (`1 / t` traces as `reciprocal(t) * 1`) and view chains."""
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and not node.users and _pure(node):
            graph.erase_node(node)
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten._assert_tensor_metadata.default or (
            node.target is operator.getitem and not node.users
        ):
            graph.erase_node(node)
        elif node.target is aten.mul.Tensor and _is_identity_mul(node):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
        elif node.target in VIEWS:
            src = node.args[0]
            if isinstance(src, fx.Node) and _foldable_view(src):
                node.args = (src.args[0], *node.args[1:])
                graph.erase_node(src)
                src = node.args[0]
            if _same_shape(val(src), val(node)):
                node.replace_all_uses_with(src)
                graph.erase_node(node)


def _foldable_view(src: fx.Node) -> bool:
    """A view / reshape whose one user views it again may be skipped (the user views src's input
    directly) when it never copies: a view, or a reshape of a contiguous tensor (a reshape of a
    transposed one copies, and a view of that input would not run)."""
    if src.target not in VIEWS or len(src.users) != 1:
        return False
    if src.target is not aten.reshape.default:
        return True
    source = val(src.args[0]) if isinstance(src.args[0], fx.Node) else None
    return isinstance(source, torch.Tensor) and source.is_contiguous()


def _is_identity_mul(node: fx.Node) -> bool:
    """`a * 1` that may become `a`: the same dtype, and the product is a copy nobody can tell
    from a: not an output (a caller could write to it) and no write to a or any alias of it."""
    a, b = node.args[0], node.args[1]
    if not isinstance(a, fx.Node) or isinstance(b, fx.Node) or isinstance(b, bool) or b != 1:
        return False
    va, vo = val(a), val(node)
    if not (isinstance(va, torch.Tensor) and vo is not None and va.dtype == vo.dtype):
        return False
    if any(user.op == "output" for user in node.users):
        return False
    return not _written(alias_base(a))


def _same_shape(a, b) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and tuple(a.shape) == tuple(b.shape)
        and a.dtype == b.dtype
        and a.is_contiguous() == b.is_contiguous()
    )


def merge_duplicates(graph: fx.Graph, targets: tuple, into: dict[str, str] | None = None) -> int:
    """Replaces later calls of `targets` with identical arguments by the first (Llama's q, k and v
    projections each quantizing the same normed input). Returns how many were merged; `into`
    gets each merged node's name -> the name of the node it was merged into."""
    calls = [
        n
        for n in graph.nodes
        if n.op == "call_function" and n.target in targets and not _written_around(n)
    ]
    return _merge_into_first(graph, calls, into)


def _written_around(node: fx.Node) -> bool:
    """Whether a merge could tell two equal calls apart: the call's outputs are written in place
    (through any view), or memory one of its tensor inputs views is written anywhere. (Two equal
    results the graph returns become one tensor returned twice.)"""
    if _written(node, outputs_write=False):
        return True
    return any(_written(alias_base(arg), outputs_write=False) for arg in node.all_input_nodes)


def merge_pure_duplicates(graph: fx.Graph, sources: tuple) -> int:
    """Merges later calls of a pure ATen op with the same arguments into the first (CSE), for
    the nodes computed from a call of `sources` (the top-k ops): a chain a model spells twice on
    one top-k is then one chain with two readers (HF GLM-5's "shared" indexer layers each build
    the mask from the same indices). Only there: elsewhere two equal chains may each fuse with
    their own consumer, and merged they would be one chain with two. Pure: no mutable or random
    schema, not an `empty` (undefined contents), never written in place (nor any view of it),
    not a graph output. Returns how many were merged."""
    downstream: set[fx.Node] = set()
    for node in graph.nodes:
        if node.target in sources or any(n in downstream for n in node.all_input_nodes):
            downstream.add(node)
    pure = [n for n in graph.nodes if n in downstream and _pure(n) and not _written(n)]
    return _merge_into_first(graph, pure, constants=True)


def _merge_into_first(
    graph: fx.Graph, nodes: list[fx.Node], into: dict | None = None, constants: bool = False
) -> int:
    """Each of `nodes` (in graph order) whose target and arguments equal an earlier one's is
    replaced by that one; arguments are compared as they are when the node's turn comes, so a
    chain of duplicates merges whole. constants: an argument made by a pure call of no tensor
    input (`full`: Inductor's post-grad form of `new_ones`) is compared by its call, not its
    node, and dropped when the merge leaves it unread."""
    seen: dict[tuple, fx.Node] = {}
    merged = 0
    for node in nodes:
        key = (
            node.target,
            _key(node.args, constants),
            _key(tuple(sorted(node.kwargs.items())), constants),
        )
        first = seen.setdefault(key, node)
        if first is not node:
            inputs = node.all_input_nodes
            node.replace_all_uses_with(first)
            graph.erase_node(node)
            for unread in inputs:
                if constants and not unread.users and _constant(unread):
                    graph.erase_node(unread)
            merged += 1
            if into is not None:
                into[node.name] = first.name
    if merged:
        _merge_getitems(graph)
    return merged


def _constant(node: fx.Node) -> bool:
    """A pure call with no node among its inputs, never written in place."""
    return not node.all_input_nodes and _pure(node) and not _written(node)


def _pure(node: fx.Node) -> bool:
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    schema = target._schema
    return not (
        schema.is_mutable
        or torch.Tag.nondeterministic_seeded in target.tags
        or "empty" in schema.name
        or node.is_impure()
        or any(user.op == "output" for user in node.users)
    )


def _written(node: fx.Node, outputs_write: bool = True) -> bool:
    """Whether any user writes to node, or to a view of it (conservative for calls it cannot
    read the schema of; for the graph's output too unless `outputs_write` is False)."""
    for user in node.users:
        if user.target is operator.getitem:
            if _written(user, outputs_write):  # an item of a list of views (split)
                return True
            continue
        if user.op == "output" and not outputs_write:
            continue
        if user.op != "call_function" or not isinstance(user.target, torch._ops.OpOverload):
            return True
        schema = user.target._schema
        rest = schema.arguments[len(user.args) :]
        values = list(user.args) + [user.kwargs.get(a.name) for a in rest]
        for arg, value in zip(schema.arguments, values):
            if not _holds(value, node) or arg.alias_info is None:
                continue
            if arg.alias_info.is_write:
                return True
            if any(r.alias_info is not None for r in schema.returns) and _written(
                user, outputs_write
            ):
                return True  # the user returns a view of node that is written
    return False


def _holds(value, node: fx.Node) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_holds(v, node) for v in value)
    return value is node


def _merge_getitems(graph: fx.Graph) -> None:
    seen: dict[tuple, fx.Node] = {}
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is operator.getitem:
            key = (node.args[0], node.args[1])
            first = seen.setdefault(key, node)
            if first is not node:
                node.replace_all_uses_with(first)
                graph.erase_node(node)


def _key(value, constants: bool = False):
    if isinstance(value, (list, tuple)):
        return tuple(_key(v, constants) for v in value)
    if isinstance(value, fx.Node):
        if constants and _constant(value):
            kwargs = tuple(sorted(value.kwargs.items()))
            return ("constant", value.target, _key(value.args), _key(kwargs))
        return ("node", id(value))
    return ("lit", type(value).__name__, repr(value))


def finish(module: fx.GraphModule | fx.Graph) -> None:
    """Lint and recompile: a pass never leaves a broken graph. (The rewrites erase what they
    made dead themselves; a global DCE would also drop export's input-guard module call.)"""
    if isinstance(module, fx.GraphModule):
        module.graph.lint()
        module.recompile()
    else:
        module.lint()
