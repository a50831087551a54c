"""The weight-prepack pass (`fxfuse/fusion/prepack.py`): MXFP4 GEMM weights that are module
constants are stored in gfx950's preshuffled layouts after fusing, where the target is gfx950
(or when asked), and the fused module's results do not change. Kernels run in Triton's
interpreter (tests/conftest.py); `reference_path` runs the ops' torch references."""

from __future__ import annotations

import pytest
import torch

import fxfuse
from fxfuse.fusion.passes import run_passes
from fxfuse.fusion.prepack import PREFIX
from fxfuse.kernels.gemm_ref import (
    preshuffle_scale_e8m0,
    preshuffle_weight_fp4,
    preshuffled_shapes,
)
from fxfuse.kernels.rms_norm_quant_ref import quant_mxfp4_ref

K = 64


def _weights(n, k=K, seed=1):
    g = torch.Generator().manual_seed(seed)
    return quant_mxfp4_ref(torch.randn(n, k, generator=g), "even")


class MxLinear(torch.nn.Module):
    """quant_mxfp4 → gemm_mxfp4 with buffer weights (quant_gemm fuses the two)."""

    def __init__(self, n, k=K):
        super().__init__()
        w, w_scale = _weights(n, k)
        self.register_buffer("w", w)
        self.register_buffer("w_scale", w_scale)

    def forward(self, x):
        q, s = fxfuse.ops.quant_mxfp4(x)
        return fxfuse.ops.gemm_mxfp4(q, s, self.w, self.w_scale, torch.float32)


class MxLinearInputs(torch.nn.Module):
    """The same GEMM with the weights passed in: nothing to prepack."""

    def forward(self, x, w, w_scale):
        q, s = fxfuse.ops.quant_mxfp4(x)
        return fxfuse.ops.gemm_mxfp4(q, s, w, w_scale, torch.float32)


def _x(m, k=K, seed=2):
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _gemm_node(gm):
    (node,) = [n for n in gm.graph.nodes if n.target is torch.ops.fxfuse.quant_gemm.default]
    return node


def _attr(gm, node):
    return getattr(gm, node.target)


def _fuse(model, **config):
    """apply_fusions for target gfx950 with a dynamic token count, captured at M = 40."""
    dims = {"x": {0: torch.export.Dim("m", min=2, max=256)}}
    return fxfuse.apply_fusions(
        model, (_x(40),), config=fxfuse.FusionConfig(target="gfx950", **config),
        dynamic_shapes=dims,
    )  # fmt: skip


@pytest.mark.parametrize("n", [32, 48])
def test_gfx950_prepacks_and_results_stay(n):
    model = MxLinear(n)
    packed, plain = _fuse(model), _fuse(MxLinear(n), prepack_weights=False)
    report = packed.fxfuse_report
    assert report.counts["quant_gemm"] == 1
    assert [w for _, w in report.prepacked] == [PREFIX + "w"]
    assert not plain.fxfuse_report.prepacked
    node = _gemm_node(packed)
    w_node, ws_node = node.args[-4], node.args[-3]
    w_shape, s_shape = preshuffled_shapes(n, K)
    assert tuple(_attr(packed, w_node).shape) == w_shape
    assert tuple(_attr(packed, ws_node).shape) == s_shape
    assert torch.equal(_attr(packed, w_node), preshuffle_weight_fp4(model.w))
    assert torch.equal(_attr(packed, ws_node), preshuffle_scale_e8m0(model.w_scale))
    names = dict(packed.named_buffers())
    assert "w" not in names and "w_scale" not in names  # the plain copies are dropped
    assert "weights prepacked" in str(report)
    for m in (3, 40):  # both sides of the prologue-quant dispatch (32)
        xm = _x(m, seed=m)
        out = packed(xm)
        torch.testing.assert_close(out, plain(xm), rtol=0, atol=0)
        torch.testing.assert_close(out, model(xm), rtol=1e-5, atol=1e-5)


def test_reference_path_reads_preshuffled_weights(reference_path):
    model = MxLinear(32)
    x = _x(5)
    packed = fxfuse.apply_fusions(model, (x,), config=fxfuse.FusionConfig(prepack_weights=True))
    assert len(packed.fxfuse_report.prepacked) == 1
    torch.testing.assert_close(packed(x), model(x), rtol=1e-5, atol=1e-5)


def test_not_on_other_targets_unless_asked():
    x = _x(4)
    for target in ("sm90", "gfx942", "cpu"):
        fused = fxfuse.apply_fusions(MxLinear(32), (x,), config=fxfuse.FusionConfig(target=target))
        assert not fused.fxfuse_report.prepacked and not fused.fxfuse_report.prepack_skipped
    asked = fxfuse.FusionConfig(target="sm90", prepack_weights=True)
    assert len(fxfuse.apply_fusions(MxLinear(32), (x,), config=asked).fxfuse_report.prepacked) == 1


def test_shapes_the_layout_cannot_take_stay_plain():
    model = MxLinear(24)  # N % 16 != 0
    x = _x(4)
    fused = fxfuse.apply_fusions(model, (x,), config=fxfuse.FusionConfig(target="gfx950"))
    report = fused.fxfuse_report
    assert not report.prepacked
    assert len(report.prepack_skipped) == 1 and "N % 16" in report.prepack_skipped[0][1]
    assert torch.equal(dict(fused.named_buffers())["w"], model.w)
    torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-5)


def test_weights_passed_in_are_not_prepacked():
    w, w_scale = _weights(32)
    x = _x(4)
    fused = fxfuse.apply_fusions(
        MxLinearInputs(), (x, w, w_scale), config=fxfuse.FusionConfig(target="gfx950")
    )
    report = fused.fxfuse_report
    assert report.counts["quant_gemm"] == 1 and not report.prepacked
    assert "graph inputs" in report.prepack_skipped[0][1]
    torch.testing.assert_close(fused(x, w, w_scale), MxLinearInputs()(x, w, w_scale))


def test_a_bare_graph_says_why():
    """Inductor's post-grad graph is a bare Graph whose weights are inputs: reported, kept."""
    w, w_scale = _weights(32)
    x = _x(4)
    gm = fxfuse.apply_fusions(
        MxLinearInputs(), (x, w, w_scale), config=fxfuse.FusionConfig(prepack_weights=False)
    )
    report = run_passes(gm.graph, fxfuse.FusionConfig(target="gfx950"))
    assert not report.prepacked
    assert len(report.prepack_skipped) == 1 and "torch.compile" in report.prepack_skipped[0][1]
    plain = torch.fx.symbolic_trace(torch.nn.Linear(4, 4))  # no MXFP4 GEMM: nothing to say
    assert not run_passes(plain.graph, fxfuse.FusionConfig(target="gfx950")).prepack_skipped


def test_ops_take_either_layout():
    """The MXFP4 GEMM op and the prequant chain read preshuffled weights (told by shape)."""
    w, w_scale = _weights(32)
    w_sh, s_sh = preshuffle_weight_fp4(w), preshuffle_scale_e8m0(w_scale)
    x = _x(5)
    q, s = quant_mxfp4_ref(x.float(), "even")
    plain = torch.ops.fxfuse.gemm_mxfp4(q, s, w, w_scale, torch.float32)
    torch.testing.assert_close(
        torch.ops.fxfuse.gemm_mxfp4(q, s, w_sh, s_sh, torch.float32), plain, rtol=0, atol=0
    )
    torch.library.opcheck(torch.ops.fxfuse.gemm_mxfp4.default, (q, s, w_sh, s_sh, torch.float32))
    for m, max_m in ((5, 32), (5, 0)):  # the prequant and the quantize-first side
        args = (_x(m), "mxfp4", 0, torch.float8_e4m3fn, 1e-10, False, False, "even")
        out = torch.ops.fxfuse.quant_gemm(*args, w_sh, s_sh, torch.float32, max_m)
        ref = torch.ops.fxfuse.quant_gemm(*args, w, w_scale, torch.float32, max_m)
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        torch.library.opcheck(
            torch.ops.fxfuse.quant_gemm.default, (*args, w_sh, s_sh, torch.float32, max_m)
        )


def test_prepack_weights_must_be_a_bool():
    with pytest.raises(ValueError, match="prepack_weights"):
        fxfuse.FusionConfig(prepack_weights="yes")


class Fp8Linear(torch.nn.Module):
    def __init__(self, n=32, k=K):
        super().__init__()
        from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref

        w, s = quant_fp8_ref(torch.randn(n, k), 0, torch.float8_e4m3fn)
        self.register_buffer("w", w)
        self.register_buffer("w_scale", s.reshape(n))

    def forward(self, x):
        q, s = fxfuse.ops.quant_fp8(x)
        return fxfuse.ops.gemm_fp8(q, s, self.w, self.w_scale, torch.float32)


def test_fp8_weights_are_left_alone():
    fused = fxfuse.apply_fusions(
        Fp8Linear(), (_x(4),), config=fxfuse.FusionConfig(target="sm90", prepack_weights=True)
    )
    report = fused.fxfuse_report
    assert report.counts["quant_gemm"] == 1
    assert not report.prepacked and not report.prepack_skipped
    assert dict(fused.named_buffers())["w"].dtype == torch.float8_e4m3fn


class NormMxLinear(torch.nn.Module):
    """RMSNorm → MXFP4 quant → GEMM (rmsnorm_quant_gemm). With `two`, a second GEMM of the same
    quant (then rmsnorm_quant + two standalone GEMMs) whose weight's prepacked name would
    collide with the first's: `a.w` and a top-level `a_w`."""

    def __init__(self, two: bool, n=32, k=K, keep_y=False):
        super().__init__()
        self.two, self.keep_y = two, keep_y
        self.norm_w = torch.nn.Parameter(torch.rand(k) + 0.5, requires_grad=False)
        self.a = MxLinear(n, k)
        w, w_scale = _weights(n, k, seed=5)
        self.register_buffer("a_w", w)
        self.register_buffer("a_w_scale", w_scale)

    def forward(self, x):
        y = fxfuse.ops.rms_norm(x, self.norm_w, 1e-6)
        q, s = fxfuse.ops.quant_mxfp4(y)
        first = fxfuse.ops.gemm_mxfp4(q, s, self.a.w, self.a.w_scale, torch.float32)
        if self.keep_y:  # y read elsewhere too: rms_norm_quant_gemm_with_norm
            return first, y * 2
        if not self.two:
            return (first,)
        return first, fxfuse.ops.gemm_mxfp4(q, s, self.a_w, self.a_w_scale, torch.float32)


@pytest.mark.parametrize("two, keep_y", [(False, False), (True, False), (False, True)])
def test_norm_chains_and_name_clash(two, keep_y):
    model = NormMxLinear(two, keep_y=keep_y)
    packed = _fuse(model)
    report = packed.fxfuse_report
    names = [w for _, w in report.prepacked]
    if keep_y:
        targets = [str(n.target) for n in packed.graph.nodes]
        assert "fxfuse.rms_norm_quant_gemm_with_norm.default" in targets
    if two:  # the shared quant keeps the GEMMs apart; each standalone GEMM is prepacked
        assert report.counts["rmsnorm_quant"] == 1
        assert names == [PREFIX + "a_w", PREFIX + "a_w_1"]
    else:
        assert report.counts["rmsnorm_quant_gemm"] == 1
        assert names == [PREFIX + "a_w"]
    for m in (3, 40):
        xm = _x(m, seed=m)
        for out, ref in zip(packed(xm), model(xm)):
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


class MxSplitCat(torch.nn.Module):
    """An MXFP4 GEMM → view → split → cat (gemm_split_cat's MXFP4 producer): 2 heads of 32 | 16."""

    def __init__(self):
        super().__init__()
        w, w_scale = _weights(2 * 48)
        self.register_buffer("w", w)
        self.register_buffer("w_scale", w_scale)

    def forward(self, x):
        q, s = fxfuse.ops.quant_mxfp4(x)
        c = fxfuse.ops.gemm_mxfp4(q, s, self.w, self.w_scale, torch.bfloat16)
        c1, c2 = torch.split(c.view(x.shape[0], 2, 48), [32, 16], dim=-1)
        y = x[:, None, :8].expand(-1, 2, -1)
        return torch.cat([c1, y], dim=-1), c2


def test_split_cat_producer_is_prepacked():
    model = MxSplitCat()
    packed, plain = _fuse(model), _fuse(MxSplitCat(), prepack_weights=False)
    assert packed.fxfuse_report.counts["gemm_split_cat"] == 1
    assert [w for _, w in packed.fxfuse_report.prepacked] == [PREFIX + "w"]
    (node,) = [
        n for n in packed.graph.nodes if n.target is torch.ops.fxfuse.gemm_mxfp4_split_cat.default
    ]
    assert tuple(_attr(packed, node.args[2]).shape) == preshuffled_shapes(96, K)[0]
    for m in (3, 40):
        xm = _x(m, seed=m)
        got, want = packed(xm), plain(xm)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
