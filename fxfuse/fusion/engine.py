"""The rewrite engine: rules, the one place that checks extra users, and graph surgery.

A `Rule` is data: a report name, a spelling pattern, a guard and a replacement. `run_rules`
finds every match of every rule, drops matches whose interior values escape the match, asks each
guard (which returns a reason string on failure, recorded as a near-miss), and lets the
replacement build new nodes; the engine rewires the outputs, erases what became dead and lints.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from fxfuse.patterns.matcher import Match, match_at
from fxfuse.patterns.rule import Context, Inserter, Rule, alias_base


def fake_mode_of(graph: fx.Graph) -> FakeTensorMode:
    from torch._guards import detect_fake_mode

    vals = [n.meta.get("val") for n in graph.nodes if n.meta.get("val") is not None]
    flat = [v for v in fx.node.map_aggregate(vals, lambda x: x) if isinstance(v, torch.Tensor)]
    mode = detect_fake_mode(flat) if flat else None
    return mode or FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)


def is_fxfuse_op(node: fx.Node) -> bool:
    """A call of one of fxfuse's ops (`torch.ops.fxfuse.*`)."""
    return str(node.target).startswith("fxfuse.")


def _leaves(nodes: list[fx.Node]) -> list[fx.Node]:
    inside = set(nodes)
    found: dict[fx.Node, None] = {}
    for node in nodes:
        for arg in node.all_input_nodes:
            if arg not in inside:
                found[arg] = None
    return list(found)


def escaping_interior(match: Match, outputs: Sequence[fx.Node], allowed: set[fx.Node]) -> fx.Node | None:
    """An interior node (not an output) used outside the match and outside `allowed`, if any."""
    inside = set(match.nodes)
    outs = set(outputs)
    for node in match.nodes:
        if node in outs:
            continue
        for user in node.users:
            if user not in inside and user not in allowed:
                return node
    return None


def _position(graph: fx.Graph) -> dict[fx.Node, int]:
    return {n: i for i, n in enumerate(graph.nodes)}


def run_rule(rule: Rule, ctx: Context, roots: Callable[[fx.Node], bool] | None = None) -> int:
    """Applies `rule` everywhere it matches; returns the number of rewrites."""
    graph = ctx.graph
    candidates: list[tuple[Match, list[fx.Node]]] = []
    claimed: set[fx.Node] = set()
    for node in reversed(list(graph.nodes)):
        if node.op != "call_function" or node in claimed or (roots and not roots(node)):
            continue
        match = match_at(rule.pattern, node)
        if match is None:
            continue
        outputs = list(rule.outputs(match))
        candidates.append((match, outputs))
        claimed.update(match.nodes)
    # Interior values may be shared between two matches of the same rule (CSE merges the x² of two
    # norms of one input, say): those uses are covered by the other rewrite.
    # Fusions get no such allowance: a norm feeding two quants would be computed twice.
    shared = set().union(*(set(m.nodes) for m, _ in candidates)) if rule.canonical else set()
    done, erased = 0, set()
    for match, outputs in candidates:
        if any(n in erased for n in match.nodes):
            continue  # consumed by an earlier rewrite of this run
        if erased and _reads_any(match, erased):
            # An input an earlier rewrite replaced (the residual sum of two norms, say): match
            # again over the rewritten graph.
            match = match_at(rule.pattern, match.root)
            if match is None or _reads_any(match, erased):
                continue
            outputs = list(rule.outputs(match))
        escaped = escaping_interior(match, outputs, shared)
        if escaped is not None:
            users = ", ".join(u.name for u in escaped.users)
            ctx.report.reject(
                rule.report_name, match.root.name, f"intermediate {escaped.name} has other users ({users})"
            )
            continue
        reason = rule.guard(match, ctx) if rule.guard else None
        if reason:
            ctx.report.reject(rule.report_name, match.root.name, reason)
            continue
        removed = _rewrite(rule, match, outputs, ctx)
        if removed is not None:
            erased |= removed
            done += 1
    return done


def _reads_any(match: Match, nodes: set[fx.Node]) -> bool:
    """Whether the match's inputs or bindings include one of `nodes`."""
    found: list[fx.Node] = []
    fx.node.map_aggregate(
        list(match.bindings.values()), lambda v: found.append(v) if isinstance(v, fx.Node) else v
    )
    return any(n in nodes for n in [*found, *_leaves(match.nodes)])


def _rewrite(rule: Rule, match: Match, outputs: list[fx.Node], ctx: Context) -> set | None:
    """Replaces the match; returns the erased nodes, or None where it refused."""
    graph = ctx.graph
    pos = _position(graph)
    leaves = _leaves(match.nodes)
    inside = set(match.nodes)
    external_users = []
    for out in outputs:
        tuple_valued = isinstance(out.meta.get("val"), (tuple, list))
        for user in out.users:
            if user in inside:
                continue
            # A tuple's getitems are rewired, not kept: what counts is who reads them.
            if tuple_valued and user.target is operator.getitem:
                external_users.extend(u for u in user.users if u not in inside)
            else:
                external_users.append(user)
    first_user = min((pos[u] for u in external_users), default=len(pos))
    last_leaf = max((pos[leaf] for leaf in leaves), default=-1)
    if last_leaf >= first_user:
        if not _hoist(graph, leaves, first_user, pos):
            ctx.report.reject(
                rule.report_name, match.root.name, "inputs are defined after a consumer"
            )
            return None
        pos = _position(graph)
        last_leaf = max(pos[leaf] for leaf in leaves)
    written = _written_under(match, leaves, last_leaf, pos)
    if written is not None:
        ctx.report.reject(rule.report_name, match.root.name, written)
        return None
    # Insert right after the last input so every new node precedes every consumer.
    anchor = next(n for n in graph.nodes if pos[n] == last_leaf + 1) if last_leaf + 1 < len(pos) else None
    if anchor is None:
        return None
    inserter = Inserter(ctx, anchor)
    try:
        new_values = list(rule.replace(match, ctx, inserter))
    except ValueError as err:
        for node in reversed(inserter.created):
            graph.erase_node(node)
        ctx.report.reject(rule.report_name, match.root.name, f"replacement refused: {err}")
        return None
    if len(new_values) != len(outputs):
        raise AssertionError(f"rule {rule.name}: {len(new_values)} values for {len(outputs)} outputs")
    stale = [n for old, new in zip(outputs, new_values) for n in _rewire(old, new, inside)]
    mutations = set(rule.mutations(match)) if rule.mutations else set()
    erased = _erase_dead(graph, match.nodes + stale, mutations)
    # What the match covered, and what became dead with it (a cast only the match read, say).
    replaced = tuple(dict.fromkeys(n.name for n in [*match.nodes, *erased]))
    created_names = tuple(n.name for n in inserter.created)
    ctx.report.sources.update(dict.fromkeys(created_names, replaced))
    if rule.canonical:
        ctx.report.canonicalized[rule.name] = ctx.report.canonicalized.get(rule.name, 0) + 1
        for node in inserter.created:
            if is_fxfuse_op(node):
                ctx.canonical_roots[node.name] = match.root.name
    else:
        created = ", ".join(
            sorted({str(n.target) for n in inserter.created if is_fxfuse_op(n)})
        )
        ctx.report.add_rewrite(
            rule.name, match.root.name, created, replaced=replaced, created=created_names
        )
    return erased


def _written_under(
    match: Match, leaves: list[fx.Node], last_leaf: int, pos: dict[fx.Node, int]
) -> str | None:
    """Why the replacement, run just after the last input (position last_leaf + ½), would not
    read what the matched nodes read: an in-place write outside the match (through any view) to
    memory that a matched node reads, placed between that read and the replacement's (an input),
    or between the value's computation and its read (a matched intermediate: `h[0] = 2` between
    the residual add and the norm). None when there is none."""
    inside = set(match.nodes)
    spans: list[tuple[fx.Node, float, float]] = []  # (base memory, from, to) of each read
    replaced_at = last_leaf + 0.5
    for node in [*leaves, *match.nodes]:
        reads = [pos[u] for u in node.users if u in inside]
        if not reads:
            continue
        if node in inside:
            spans.append((alias_base(node), pos[node], max(reads)))
        else:
            spans.append((alias_base(node), min(replaced_at, *reads), max(replaced_at, *reads)))
    if not spans:
        return None
    start, end = min(s[1] for s in spans), max(s[2] for s in spans)
    for node in match.root.graph.nodes:
        at = pos[node]
        if at <= start or at >= end or node in inside:
            continue
        written = _written(node)
        hit = [b for b, lo, hi in spans if lo < at < hi and (written is None or b in written)]
        if hit:
            what = "may write anything" if written is None else f"writes {hit[0].name} in place"
            return f"{node.name} ({node.target}) {what} between reads the replacement would merge"
    return None


def _hoist(graph: fx.Graph, leaves: list[fx.Node], first_user: int, pos: dict) -> bool:
    """Moves the inputs defined at or after position `first_user` (a weight scale's reshape that
    the graph placed after an early reader of the match's outputs), with whatever they are computed
    from there, to just before it. Only pure computations move, and only where nothing in the
    span they cross may write memory they read (an MoE layer's in-place routing writes its own
    buffers, not the weights; an in-place copy into a weight stops the move). Returns whether
    every input now precedes first_user."""
    late: dict[fx.Node, None] = {}
    pending = [leaf for leaf in leaves if pos[leaf] >= first_user]
    while pending:
        node = pending.pop()
        if node in late or pos[node] < first_user:
            continue
        if node.op not in ("call_function", "get_attr") or node.is_impure() or _written(node):
            return False  # (None: unknown writes; a non-empty set: it writes)
        late[node] = None
        pending.extend(node.all_input_nodes)
    if not late:
        return True
    read = {alias_base(n) for node in late for n in node.all_input_nodes if n not in late}
    read |= {node for node in late if node.op == "get_attr"}
    nodes = list(graph.nodes)
    span = nodes[first_user : max(pos[n] for n in late) + 1]
    for node in span:
        written = set() if node in late else _written(node)
        if written is None or written & read:
            return False
    anchor = nodes[first_user]
    for node in sorted(late, key=pos.__getitem__):
        anchor.prepend(node)
    return True


def _written(node: fx.Node) -> set[fx.Node] | None:
    """The bases of the memory the node writes, from its schema's write annotations (empty when
    it writes none); None when that is unknown: an impure Python call, or a module call other
    than torch.export's input guards."""
    if node.op == "call_module":
        return set() if node.target == "_guards_fn" else None
    if node.op != "call_function":
        return set()
    schema = getattr(node.target, "_schema", None)
    if schema is None:  # a Python function: pure unless marked impure
        return None if node.is_impure() else set()
    out = set()
    for i, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
        values = value if isinstance(value, (list, tuple)) else [value]
        out |= {alias_base(v) for v in values if isinstance(v, fx.Node)}
    return out


def _rewire(old: fx.Node, new, inside: set[fx.Node]) -> list[fx.Node]:
    """Points the users of `old` at `new`: a node, or for a tuple-valued `old` a list with one
    value per index (None for an index only the match itself used). Returns getitems left dead."""
    if new is None:
        return []
    if isinstance(new, fx.Node):
        old.replace_all_uses_with(new)
        return []
    stale = []
    for user in list(old.users):
        if user in inside:
            continue
        if user.target is not operator.getitem:
            raise AssertionError(f"{old.name} is tuple-valued but {user.name} is not a getitem")
        value = new[user.args[1]]
        if value is None:
            raise AssertionError(f"{user.name} is used but its replacement is None")
        user.replace_all_uses_with(value)
        stale.append(user)
    return stale


def _erase_dead(
    graph: fx.Graph, nodes: list[fx.Node], mutations: set[fx.Node] = frozenset()
) -> set[fx.Node]:
    """Erases the given nodes, and inputs of theirs, once nothing uses them; impure nodes only
    when listed in `mutations` (in-place steps a replacement reproduces)."""
    pending, erased = list(nodes), set()
    while pending:
        node = pending.pop()
        if node in erased or node.users or node.op != "call_function":
            continue
        if node.is_impure() and node not in mutations:
            continue
        inputs = node.all_input_nodes
        graph.erase_node(node)
        erased.add(node)
        pending.extend(inputs)
    return erased
