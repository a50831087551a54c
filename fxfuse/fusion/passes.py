"""The pass manager: simplify → canonicalize → merge duplicates → fuse (most-fused first) →
[prepack weights] → lint."""

from __future__ import annotations

import torch
import torch.fx as fx

from fxfuse import patterns
from fxfuse.fusion.cleanup import (
    VIEWS,
    finish,
    merge_duplicates,
    merge_pure_duplicates,
    simplify,
)
from fxfuse.fusion.config import PATTERN_NAMES, FusionConfig
from fxfuse.fusion.engine import fake_mode_of, is_fxfuse_op, run_rule
from fxfuse.fusion.prepack import prepack_weights
from fxfuse.fusion.report import FusionReport
from fxfuse.patterns.rule import Context

# The ops whose duplicate consumer chains are merged before fusing (`merge_pure_duplicates`).
TOPK_SOURCES = (
    torch.ops.aten.topk.default, torch.ops.aten.sort.default, torch.ops.aten.sort.stable,
    torch.ops.aten.argsort.default, torch.ops.aten.argsort.stable,
)  # fmt: skip
# Fusions that consume canonical norms / quants: canonicalization runs only when one is enabled.
NORM_CONSUMERS = ("allreduce_rmsnorm", "rmsnorm_quant_gemm", "rmsnorm_quant", "quant_gemm")


def run_passes(
    module: fx.GraphModule | fx.Graph,
    config: FusionConfig | None = None,
    unfused_as_spelled: bool = False,
) -> FusionReport:
    """Rewrites a GraphModule (recompiled after) or a bare Graph (Inductor's post-grad graph) in
    place; returns what was done. The graph lints after every pass.

    unfused_as_spelled (the torch.compile backend): a norm or quant spelling that no fusion
    consumes stays as the graph spelled it, for Inductor to compile as it would without fxfuse,
    instead of becoming a canonical op that runs fxfuse's kernel on its own. A trial run on a
    copy of the graph finds the spellings the fusions consume; only those are canonicalized.
    The report's near-misses are the trial's (every canonical norm and quant was there)."""
    config = config or FusionConfig()
    graph = module.graph if isinstance(module, fx.GraphModule) else module
    target = config.resolved_target(_graph_device(graph))
    consumed = trial = None
    if unfused_as_spelled:
        copy = fx.Graph(owning_module=graph.owning_module)
        copy.output(copy.graph_copy(graph, {}))
        trial, made, merged = _fuse(copy, config, target)
        consumed = _consumed(made, merged, trial.sources, {n.name for n in copy.nodes})
    report, _, _ = _fuse(graph, config, target, consumed)
    if trial is not None:
        report.rejected = trial.rejected
    if config.prepacks(target):
        prepack_weights(module, report)
    finish(module)
    return report


def _graph_device(graph: fx.Graph) -> torch.device | None:
    """The device of the graph's first tensor input (None: no tensor input, or a meta one)."""
    for node in graph.find_nodes(op="placeholder"):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and value.device.type != "meta":
            return value.device
    return None


def _consumed(made: dict[str, str], merged: dict[str, str], sources: dict, alive: set[str]):
    """The spelling roots whose canonical op a fusion consumed. A canonical op that another
    canonicalization replaced (`rms_norm` → `add_rms_norm`) or that was merged into a duplicate
    shares the fate of the op that took it over."""
    taken_by = {src: op for op in made for src in sources.get(op, ()) if src in made}
    taken_by.update(merged)

    def fused(name: str) -> bool:
        while name not in alive:
            if name not in taken_by:
                return True
            name = taken_by[name]
        return False

    return {root for op, root in made.items() if fused(op)}


def _fuse(
    graph: fx.Graph, config: FusionConfig, target: str, spellings: set[str] | None = None
) -> tuple[FusionReport, dict[str, str], dict[str, str]]:
    """simplify → canonicalize → merge duplicates → fuse. spellings: the names of the only
    norm / quant spelling roots to canonicalize (None: all). Returns the report, per canonical
    op made the name of the spelling's root it replaced, and per merged canonical op the name
    of the one it was merged into."""
    spelling_rules = {id(rule) for rule in patterns.SPELLING_RULES}
    merged: dict[str, str] = {}
    report = FusionReport(counts={n: 0 for n in PATTERN_NAMES if config.enabled(n)}, target=target)
    ctx = Context(graph, report, config, target, fake_mode_of(graph))
    simplify(graph)
    graph.lint()
    if any(config.enabled(n) for n in NORM_CONSUMERS):
        for rule in patterns.CANONICAL_RULES:
            only = None
            if spellings is not None and id(rule) in spelling_rules:
                # A spelling's root, or a canonical op made from one (names of made nodes
                # differ from the trial's, which made more of them).
                only = lambda node: node.name in spellings or is_fxfuse_op(node)  # noqa: E731
            run_rule(rule, ctx, only)
            graph.lint()
        # Views first: Llama's q/k/v each flatten the same normed tensor before quantizing it.
        merge_duplicates(graph, VIEWS)
        merge_duplicates(graph, patterns.CANONICAL_TARGETS, merged)
        simplify(graph)
    merge_pure_duplicates(graph, TOPK_SOURCES)
    for rule in patterns.FUSION_RULES:
        if config.enabled(rule.name):
            run_rule(rule, ctx)
            graph.lint()
    return report, ctx.canonical_roots, merged
