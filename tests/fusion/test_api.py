"""The public contract of SPEC §1: apply_fusions, FusionConfig, env flags, the compile backend."""

import importlib.metadata
import warnings

import pytest
import torch
from torch import nn

import fxfuse
from fxfuse.fusion.config import parse_disable_env
from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref, rms_norm_ref
from fxfuse.runtime.target import detect_target
from tests.helpers import fused_targets, outputs_bytes_equal
from tests.patterns.test_rms_norm_quant import Chain, NearMiss, _inputs, llama, per_token_div


def test_config_rejects_unknown_names_and_bad_values():
    with pytest.raises(ValueError, match="disable"):
        fxfuse.FusionConfig(disable=("rmsnorm_qaunt",))
    with pytest.raises(ValueError, match="enable"):
        fxfuse.FusionConfig(enable=("nope",))
    with pytest.raises(ValueError, match="prologue_quant_max_m"):
        fxfuse.FusionConfig(prologue_quant_max_m=-1)
    with pytest.raises(ValueError, match="target"):
        fxfuse.FusionConfig(target="gfx1100")
    with pytest.raises(ValueError, match="disable"):
        fxfuse.FusionConfig(disable="rmsnorm_quant")


def test_env_flags_are_strict(monkeypatch):
    assert parse_disable_env("rmsnorm_quant, gemm_split_cat") == ("rmsnorm_quant", "gemm_split_cat")
    with pytest.raises(ValueError, match="FXFUSE_DISABLE"):
        parse_disable_env("rmsnorm_quant,bogus")
    monkeypatch.setenv("FXFUSE_TARGET", "gfx950")
    assert detect_target() == "gfx950"
    monkeypatch.setenv("FXFUSE_TARGET", "h100")
    with pytest.raises(ValueError, match="FXFUSE_TARGET"):
        detect_target()


def test_target_follows_the_graphs_device(monkeypatch):
    """A CPU model fused on a machine with a GPU targets the CPU (the ops run their CPU paths),
    not the GPU's tables; FXFUSE_TARGET and FusionConfig.target still win."""
    monkeypatch.delenv("FXFUSE_TARGET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "hip", None)
    assert detect_target() == "sm90"  # what a device-blind choice would take
    model, inputs = Chain(llama, per_token_div, False), _inputs()
    with torch.no_grad():
        assert fxfuse.apply_fusions(model, inputs).fxfuse_report.target == "cpu"
        config = fxfuse.FusionConfig(target="gfx950")
        assert fxfuse.apply_fusions(model, inputs, config).fxfuse_report.target == "gfx950"
        monkeypatch.setenv("FXFUSE_TARGET", "gfx942")
        assert fxfuse.apply_fusions(model, inputs).fxfuse_report.target == "gfx942"


def test_apply_fusions_rejects_bad_arguments():
    model = Chain(llama, per_token_div, False)
    with pytest.raises(ValueError, match="example_inputs"):
        fxfuse.apply_fusions(model, 3)
    with pytest.raises(ValueError, match="config"):
        fxfuse.apply_fusions(model, _inputs(), config={"disable": ()})
    with pytest.raises(ValueError, match="model"):
        fxfuse.apply_fusions(lambda x: x, _inputs())


def test_enable_limits_the_patterns(reference_path):
    model, inputs = Chain(llama, per_token_div, True), _inputs()
    fused = fxfuse.apply_fusions(model, inputs, config=fxfuse.FusionConfig(enable=("gemm_split_cat",)))
    assert fused.fxfuse_report.counts == {"gemm_split_cat": 0}
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


def test_report_prints_a_table(reference_path):
    fused = fxfuse.apply_fusions(Chain(llama, per_token_div, True), _inputs())
    text = str(fused.fxfuse_report)
    assert "rmsnorm_quant" in text and "1" in text and "rewrites" in text


def test_dynamic_shapes_pass_through(reference_path):
    model = Chain(llama, per_token_div, True)
    rows = torch.export.Dim("rows", min=2, max=1024)
    fused = fxfuse.apply_fusions(
        model, _inputs(m=8), dynamic_shapes=({0: rows}, {0: rows})
    )
    assert fused.fxfuse_report.counts["rmsnorm_quant"] == 1
    for m in (3, 33, 200):
        inputs = _inputs(m=m)
        assert outputs_bytes_equal(fused(*inputs), model(*inputs))


def test_inputs_of_another_dtype_are_refused_as_export_refuses_them(reference_path):
    """export checks the caller's dtypes against the example inputs'; the fused module keeps
    that check (a bf16-traced chain fed fp32 gave other bytes, silently)."""
    model, inputs = Chain(llama, per_token_div, True), _inputs()
    fused = fxfuse.apply_fusions(model, inputs)
    assert fused.fxfuse_report.counts["rmsnorm_quant"] == 1
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))
    with pytest.raises(RuntimeError, match="dtype mismatch"):
        fused(inputs[0].float(), inputs[1])


def test_graph_module_input_is_rewritten(reference_path):
    model, inputs = Chain(llama, per_token_div, True), _inputs()
    gm = torch.export.export(model, inputs, strict=False).module()
    fused = fxfuse.apply_fusions(gm, inputs)
    assert fused is gm  # aten graphs are rewritten in place
    assert fused.fxfuse_report.counts["rmsnorm_quant"] == 1
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


def test_capture_with_grad_warns_that_fused_regions_have_no_backward(reference_path):
    model, inputs = Chain(llama, per_token_div, True), _inputs()
    with pytest.warns(UserWarning, match="no backward"):
        fxfuse.apply_fusions(model, inputs)  # grad enabled, the weight requires grad
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            fxfuse.apply_fusions(model, inputs)
        fxfuse.apply_fusions(model.requires_grad_(False), inputs)


def test_make_fx_real_mode_graph_is_rewritten(reference_path):
    """make_fx's default (real) tracing gives each value a fake mode of its own: the values are
    propagated afresh from the example inputs, as for a graph without any."""
    from torch.fx.experimental.proxy_tensor import make_fx

    model, inputs = Chain(llama, per_token_div, True), _inputs()
    gm = make_fx(model)(*inputs)
    fused = fxfuse.apply_fusions(gm, inputs)
    assert fused.fxfuse_report.counts["rmsnorm_quant"] == 1
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


def test_symbolic_trace_graph_is_retraced_and_rewritten(reference_path):
    model, inputs = Chain(llama, per_token_div, True), _inputs()
    fused = fxfuse.apply_fusions(torch.fx.symbolic_trace(model), inputs)
    assert fused.fxfuse_report.counts["rmsnorm_quant"] == 1
    assert outputs_bytes_equal(fused(*inputs), model(*inputs))


def test_torch_compile_backend_on_cpu(reference_path):
    torch._dynamo.reset()
    model, inputs = Chain(llama, per_token_div, True), _inputs()
    with torch.no_grad():
        want = model(*inputs)
        got = torch.compile(model, backend="fxfuse")(*inputs)
    assert fxfuse.last_report().counts["rmsnorm_quant"] == 1
    assert outputs_bytes_equal(got, want)


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune-no-cudagraphs"])
def test_torch_compile_takes_mode_and_options(mode, reference_path):
    """torch.compile hands `mode` and `options` to the backend as keywords; they reach Inductor
    (an unknown option is its error), and options may carry the FusionConfig."""
    model, inputs = Chain(llama, per_token_div, True), _inputs()
    with torch.no_grad():
        want = model(*inputs)
        torch._dynamo.reset()
        got = torch.compile(model, backend="fxfuse", mode=mode)(*inputs)
        assert fxfuse.last_report().counts["rmsnorm_quant"] == 1
        assert outputs_bytes_equal(got, want)
        torch._dynamo.reset()
        off = fxfuse.FusionConfig(disable=("rmsnorm_quant",))
        got = torch.compile(model, backend="fxfuse", options={"config": off})(*inputs)
        assert "rmsnorm_quant" not in fxfuse.last_report().counts  # not run at all
        torch._dynamo.reset()
        assert outputs_bytes_equal(got, torch.compile(model, backend="inductor")(*inputs))
        torch._dynamo.reset()
        with pytest.raises(Exception, match="no_such_option"):
            torch.compile(model, backend="fxfuse", options={"no_such_option": 1})(*inputs)


def test_torch_compile_runs_the_passes_on_the_backward_too(reference_path, monkeypatch):
    """AOTAutograd compiles the backward at the first .backward(), after the backend returned:
    fxfuse's pass (and torch.compile's options) must still be Inductor's settings then."""
    from fxfuse.fusion import backend

    seen = []
    original = backend.FxfusePostGradPass.__call__

    def counting(self, graph):
        seen.append(len(graph.nodes))
        return original(self, graph)

    monkeypatch.setattr(backend.FxfusePostGradPass, "__call__", counting)
    model = nn.Linear(16, 16)
    x = torch.randn(4, 16, requires_grad=True)
    torch._dynamo.reset()
    out = torch.compile(model, backend="fxfuse")(x)
    assert len(seen) == 1  # the forward
    out.sum().backward()
    assert len(seen) == 2  # and the backward
    assert torch.allclose(x.grad, model.weight.sum(0).expand(4, 16))


class TwoNorms(nn.Module):
    """Two residual norms: the first feeds a spelled FP8 quant (fuses), the second a plain bf16
    linear (nothing to fuse it with)."""

    def __init__(self, n=256):
        super().__init__()
        self.w1 = nn.Parameter((1 + 0.1 * torch.randn(n)).to(torch.bfloat16))
        self.w2 = nn.Parameter((1 + 0.1 * torch.randn(n)).to(torch.bfloat16))
        self.proj = nn.Linear(n, n, bias=False).to(torch.bfloat16)

    def forward(self, x, r):
        h = x + r
        q, scale = per_token_div(llama(h, self.w1))
        h2 = h + q.to(torch.bfloat16) * scale.to(torch.bfloat16)
        return self.proj(llama(h2, self.w2)), h2


def _compiled(model, inputs, backend):
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    with torch.no_grad():
        out, code = run_and_get_code(torch.compile(model, backend=backend), *inputs)
    return out, " ".join(code)


def test_compile_leaves_unfused_spellings_to_inductor(reference_path):
    """Under torch.compile a norm no fusion consumes stays as spelled: Inductor compiles it as
    without fxfuse (the bytes of backend="inductor"), and no canonical norm op runs on its own.
    apply_fusions keeps the canonical op (on a GPU it runs fxfuse's norm kernel)."""
    model, inputs = TwoNorms(), _inputs(n=256)
    plain = lambda x, r: model.proj(llama(x + r, model.w2))  # noqa: E731
    want, _ = _compiled(plain, inputs, "inductor")
    got, code = _compiled(plain, inputs, "fxfuse")
    report = fxfuse.last_report()
    assert not report.canonicalized and "fxfuse." not in code, str(report)
    assert outputs_bytes_equal(got, want)
    with torch.no_grad():
        fused = fxfuse.apply_fusions(model, inputs)
    assert fused_targets(fused).count("fxfuse.add_rms_norm.default") == 1


def test_compile_fuses_what_fuses_and_no_more(reference_path):
    """One graph, two norms: the one a quant follows becomes `add_rms_norm_quant`, the other
    stays Inductor's; the report counts only the spellings the fusion consumed."""
    model, inputs = TwoNorms(), _inputs(n=256)
    got, code = _compiled(model, inputs, "fxfuse")
    report = fxfuse.last_report()
    assert report.counts["rmsnorm_quant"] == 1, str(report)
    assert code.count("fxfuse.add_rms_norm_quant.default(") == 1
    assert "fxfuse.rms_norm.default" not in code and "fxfuse.add_rms_norm.default" not in code
    assert report.canonicalized == {"rms_norm[llama]": 1, "add_rms_norm": 1, "quant_fp8": 1}
    with torch.no_grad():
        want = model(*inputs)
    for a, b in zip(got, want):  # bf16 rounding of the Inductor-compiled parts (SPEC §5)
        assert ((a.double() - b.double()).norm() / b.double().norm()).item() <= 1e-2


def test_compile_reports_near_misses_of_spellings_left_alone(reference_path):
    """A norm → quant in groups of 16 (no kernel tiling for them): nothing fuses, the graph
    Inductor compiles has no fxfuse op, and the report still says why."""

    def body(x, w):
        y = llama(x, w)
        yg = y.float().view(x.shape[0], -1, 16)
        scale = yg.abs().amax(-1, keepdim=True).clamp(min=1e-10) / 448.0
        return (yg / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(x.shape), scale

    model, inputs = NearMiss(body), _inputs()[:1]
    want, _ = _compiled(model, inputs, "inductor")
    got, code = _compiled(model, inputs, "fxfuse")
    report = fxfuse.last_report()
    assert report.counts["rmsnorm_quant"] == 0 and not report.canonicalized, str(report)
    assert "fxfuse." not in code
    assert any(p == "rmsnorm_quant" and "group size 16" in why for p, _, why in report.rejected)
    assert outputs_bytes_equal(got, want)


def test_backend_uuid_tracks_config():
    from fxfuse.fusion.backend import FxfusePostGradPass
    from fxfuse.fusion.report import FusionReport

    a = FxfusePostGradPass(fxfuse.FusionConfig(), FusionReport())
    b = FxfusePostGradPass(fxfuse.FusionConfig(disable=("rmsnorm_quant",)), FusionReport())
    assert a.uuid() != b.uuid() and a.uuid() == FxfusePostGradPass(fxfuse.FusionConfig(), None).uuid()


def test_entry_point_is_declared():
    try:
        eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover
        pytest.skip("fxfuse is not installed as a distribution")
    names = {ep.name: ep.value for ep in eps}
    if "fxfuse" not in names:
        pytest.skip("fxfuse is not installed (pip install -e .) in this environment")
    assert names["fxfuse"] == "fxfuse.fusion.backend:fxfuse_backend"


@pytest.mark.parametrize(
    "op, args",
    [
        ("rms_norm", lambda: (torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16), 1e-6)),
        ("add_rms_norm", lambda: (torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16), 1e-6)),
        ("quant_fp8", lambda: (torch.randn(4, 256, dtype=torch.bfloat16), 128)),
        ("quant_mxfp4", lambda: (torch.randn(4, 64, dtype=torch.bfloat16), "ceil")),
        ("rms_norm_quant", lambda: (torch.randn(4, 256, dtype=torch.bfloat16), torch.randn(256, dtype=torch.bfloat16), 1e-6, 0.0, True, None, False, "fp8", 128, torch.float8_e4m3fn, 1e-10, False, False, True, "even")),
        ("add_rms_norm_quant", lambda: (torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(64, dtype=torch.bfloat16), 1e-6, 1.0, False, None, True, "mxfp4", 0, torch.float8_e4m3fn, 0.0, False, False, False, "floor")),
    ],
)
def test_custom_ops_pass_opcheck(op, args, reference_path):
    torch.library.opcheck(getattr(torch.ops.fxfuse, op).default, args())


def test_public_ops_validate_arguments():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="weight"):
        fxfuse.ops.rms_norm(x, torch.ones(32), 1e-6)
    with pytest.raises(ValueError, match="group_size"):
        fxfuse.ops.quant_fp8(x, group_size=48)
    with pytest.raises(ValueError, match="rounding"):
        fxfuse.ops.quant_mxfp4(x, rounding="nearest")
    with pytest.raises(ValueError, match="x"):
        fxfuse.ops.quant_mxfp4(torch.randn(4, 48))
    with pytest.raises(ValueError, match="residual"):
        fxfuse.ops.rms_norm(x, torch.ones(64), 1e-6, residual=torch.ones(2, 64))


def test_public_ops_validate_dtypes():
    """Non-float inputs are refused by name on every path (the reference would return a wrong
    integer result); an out dtype likewise."""
    x, w = torch.randn(4, 64), torch.ones(64)
    for bad in (x.to(torch.int32), x.to(torch.float8_e4m3fn)):
        with pytest.raises(ValueError, match=r"^x: dtype"):
            fxfuse.ops.rms_norm(bad, w, 1e-6)
        with pytest.raises(ValueError, match=r"^x: dtype"):
            fxfuse.ops.quant_fp8(bad)
        with pytest.raises(ValueError, match=r"^x: dtype"):
            fxfuse.ops.quant_mxfp4(bad)
    with pytest.raises(ValueError, match=r"^weight: dtype"):
        fxfuse.ops.rms_norm(x, w.to(torch.int32), 1e-6)
    with pytest.raises(ValueError, match=r"^out_dtype: dtype"):
        torch.ops.fxfuse.rms_norm(x, w, 1e-6, 0.0, True, torch.int8)
    norm = (1e-6, 0.0, True, torch.int8, False)  # norm_dtype int8
    quant = ("fp8", 0, torch.float8_e4m3fn, 1e-10, False, False, False, "even")
    with pytest.raises(ValueError, match=r"^norm_dtype: dtype"):
        torch.ops.fxfuse.rms_norm_quant(x, w, *norm, *quant)


def test_float64_runs_the_reference_where_the_kernels_would_run():
    """fp64 (which the kernels do not read) takes the torch reference under the interpreter, as
    without Triton, instead of the kernel's dtype error."""
    x, w = torch.randn(4, 64, dtype=torch.float64), torch.rand(64, dtype=torch.float64)
    want_y, want_h = rms_norm_ref(x, w, 1e-6, x)
    y, h = fxfuse.ops.rms_norm(x, w, 1e-6, residual=x)
    assert torch.equal(y, want_y) and torch.equal(h, want_h)
    q, scale = torch.ops.fxfuse.rms_norm_quant(
        x, w, 1e-6, 0.0, True, None, False, "fp8", 0, torch.float8_e4m3fn, 1e-10, False, False,
        False, "even",
    )  # fmt: skip
    want_q, want_scale = quant_fp8_ref(rms_norm_ref(x, w, 1e-6)[0], 0, torch.float8_e4m3fn)
    assert torch.equal(q.float(), want_q.float()) and torch.equal(scale, want_scale)


def test_all_reduce_without_a_process_group_is_a_copy():
    x = torch.randn(4, 8)
    out = fxfuse.ops.all_reduce(x)
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()
    with pytest.raises(ValueError, match="x"):
        fxfuse.ops.all_reduce([1.0])


def test_aliased_example_inputs_warn(reference_path):
    class Add(torch.nn.Module):
        def forward(self, a, b):
            return a + b

    x = torch.randn(4, 8)
    with pytest.warns(UserWarning, match="example_inputs: inputs 0 and 1 share memory"):
        fxfuse.apply_fusions(Add(), (x, x))
