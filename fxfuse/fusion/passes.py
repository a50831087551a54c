"""The pass manager: simplify → canonicalize → merge duplicates → fuse (most-fused first) →
[prepack weights] → lint."""

from __future__ import annotations

import torch.fx as fx

from fxfuse import patterns
from fxfuse.fusion.cleanup import VIEWS, finish, merge_duplicates, simplify
from fxfuse.fusion.config import PATTERN_NAMES, FusionConfig
from fxfuse.fusion.engine import fake_mode_of, run_rule
from fxfuse.fusion.prepack import prepack_weights
from fxfuse.fusion.report import FusionReport
from fxfuse.patterns.rule import Context

# Fusions that consume canonical norms / quants: canonicalization runs only when one is enabled.
NORM_CONSUMERS = ("allreduce_rmsnorm", "rmsnorm_quant_gemm", "rmsnorm_quant", "quant_gemm")


def run_passes(module: fx.GraphModule | fx.Graph, config: FusionConfig | None = None) -> FusionReport:
    """Rewrites a GraphModule (recompiled after) or a bare Graph (Inductor's post-grad graph) in
    place; returns what was done. The graph lints after every pass."""
    config = config or FusionConfig()
    target = config.resolved_target()
    report = FusionReport(counts={n: 0 for n in PATTERN_NAMES if config.enabled(n)}, target=target)
    graph = module.graph if isinstance(module, fx.GraphModule) else module
    ctx = Context(graph, report, config, target, fake_mode_of(graph))
    simplify(graph)
    graph.lint()
    if any(config.enabled(n) for n in NORM_CONSUMERS):
        for rule in patterns.CANONICAL_RULES:
            run_rule(rule, ctx)
            graph.lint()
        # Views first: Llama's q/k/v each flatten the same normed tensor before quantizing it.
        merge_duplicates(graph, VIEWS)
        merge_duplicates(graph, patterns.CANONICAL_TARGETS)
        simplify(graph)
    for rule in patterns.FUSION_RULES:
        if config.enabled(rule.name):
            run_rule(rule, ctx)
            graph.lint()
    if config.prepacks(target):
        prepack_weights(module, report)
    finish(module)
    return report
