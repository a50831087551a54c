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


# --- simplify: identities that would change what a graph computes ------------------------------

import fxfuse  # noqa: E402


def _fused_equal(model, *inputs):
    with torch.no_grad():
        fused = fxfuse.apply_fusions(model, inputs)
        got, want = fused(*(t.clone() for t in inputs)), model(*(t.clone() for t in inputs))
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    return all(torch.equal(g, w) for g, w in zip(got, want))


class _ViewOfTransposedReshape(torch.nn.Module):
    def forward(self, o):  # attention's o.transpose(1, 2).reshape(B, S, -1) then a view
        b, h, s, d = o.shape
        return o.transpose(1, 2).reshape(b, s, h * d).view(b * s, h * d) * 2


def test_a_view_of_a_copying_reshape_is_not_folded():
    """reshape of a transposed tensor copies; folding the view into it would not run."""
    assert _fused_equal(_ViewOfTransposedReshape(), torch.randn(2, 4, 3, 8))


class _TimesOneThenWrite(torch.nn.Module):
    def forward(self, a):
        x = a.clone()
        y = x * 1  # a copy of x, taken before the write
        x.add_(1)
        return y, x


class _TimesOneOfAViewThenWrite(torch.nn.Module):
    def forward(self, a):
        x = a.clone()
        y = x[1:] * 1
        x.add_(1)
        return y, x


class _TimesOneReturned(torch.nn.Module):
    def forward(self, a):
        return a * 1, a + 1


def test_times_one_stays_where_it_is_a_copy_someone_can_tell():
    for model in (_TimesOneThenWrite(), _TimesOneOfAViewThenWrite()):
        assert _fused_equal(model, torch.zeros(4))
    a = torch.zeros(4)
    with torch.no_grad():
        out = fxfuse.apply_fusions(_TimesOneReturned(), (a,))(a)[0]
    assert out.data_ptr() != a.data_ptr()  # the output is not the caller's input


def test_times_one_of_an_unwritten_value_still_goes():
    graph = fx.Graph()
    t = graph.placeholder("t")
    t.meta["val"] = torch.empty(4)
    r = graph.call_function(aten.reciprocal.default, (t,))
    r.meta["val"] = torch.empty(4)
    one = graph.call_function(aten.mul.Tensor, (r, 1))
    one.meta["val"] = torch.empty(4)
    graph.output(graph.call_function(aten.neg.default, (one,)))
    cleanup.simplify(graph)
    graph.lint()
    assert _calls(graph, aten.mul.Tensor) == 0
