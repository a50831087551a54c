"""`merge_pure_duplicates`: the chains a model spells twice on one top-k merge, with the equal
constants Inductor makes for each (`full`) compared by value; different ones stay apart."""

import operator

import torch
from torch import fx

from fxfuse.fusion import cleanup

aten = torch.ops.aten


def _two_masks(fill_one: bool, fill_two: bool) -> fx.Graph:
    """topk → two scatters of its indices into a `full` each (Inductor's post-grad form)."""
    graph = fx.Graph()
    scores = graph.placeholder("scores")
    topk = graph.call_function(aten.topk.default, (scores, 4))
    idx = graph.call_function(operator.getitem, (topk, 1))
    masks = []
    for fill in (fill_one, fill_two):
        base = graph.call_function(aten.full.default, ([2, 40], fill), {"dtype": torch.bool})
        masks.append(graph.call_function(aten.scatter.value, (base, -1, idx, False)))
    graph.output(graph.call_function(aten.logical_and.default, tuple(masks)))
    return graph


def _calls(graph: fx.Graph, target) -> int:
    return sum(n.target is target for n in graph.nodes)


def test_equal_constants_merge_their_scatters_and_go():
    graph = _two_masks(True, True)
    assert cleanup.merge_pure_duplicates(graph, (aten.topk.default,)) == 1
    graph.lint()
    assert _calls(graph, aten.scatter.value) == 1
    assert _calls(graph, aten.full.default) == 1  # the second one, unread, erased


def test_different_constants_stay_apart():
    graph = _two_masks(True, False)
    assert cleanup.merge_pure_duplicates(graph, (aten.topk.default,)) == 0
    assert _calls(graph, aten.scatter.value) == 2 and _calls(graph, aten.full.default) == 2


def test_a_constant_written_in_place_is_not_compared_by_value():
    graph = _two_masks(True, True)
    base = next(n for n in graph.nodes if n.target is aten.full.default)
    scatter = next(iter(base.users))
    with graph.inserting_before(scatter):
        graph.call_function(aten.fill_.Scalar, (base, False))
    assert cleanup.merge_pure_duplicates(graph, (aten.topk.default,)) == 0
