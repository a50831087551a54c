"""Which implementation runs fxfuse::gemm_fp8: the `gemm_fp8_backend` launch table, the
FXFUSE_GEMM_BACKEND override, and the vendor path (torch._scaled_mm) held to SPEC §5 on a GPU."""

from __future__ import annotations

import pytest
import torch

import fxfuse  # noqa: F401  (registers the fxfuse ops)
from fxfuse.kernels.gemm_ref import gemm_fp8_ref
from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref
from fxfuse.runtime import gemm_ops, launch_tables

FN = torch.float8_e4m3fn


def _rowwise(m, n, k, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    wf = torch.randn(n, k, generator=g).to(torch.bfloat16)
    q, x_scale = quant_fp8_ref(x, 0, FN)
    w, w_scale = quant_fp8_ref(wf, 0, FN)
    return [t.to(device) for t in (q, x_scale, w, w_scale.reshape(-1))]


def _rel(out, ref):
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("value", ["auto", "triton", "vendor", " vendor "])
def test_override_accepts_the_documented_values(monkeypatch, value):
    monkeypatch.setenv(gemm_ops.GEMM_BACKEND_ENV, value)
    assert gemm_ops.gemm_backend_override() == value.strip()


def test_override_defaults_to_auto(monkeypatch):
    monkeypatch.delenv(gemm_ops.GEMM_BACKEND_ENV, raising=False)
    assert gemm_ops.gemm_backend_override() == "auto"


@pytest.mark.parametrize("value", ["cublas", "Triton", "1"])
def test_override_rejects_other_values_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(gemm_ops.GEMM_BACKEND_ENV, value)
    with pytest.raises(ValueError, match="FXFUSE_GEMM_BACKEND"):
        gemm_ops.gemm_backend_override()


def test_cpu_never_goes_to_the_vendor(monkeypatch):
    monkeypatch.setenv(gemm_ops.GEMM_BACKEND_ENV, "vendor")
    q, xs, w, ws = _rowwise(4, 32, 64)
    assert not gemm_ops._use_vendor(q, xs, w, ws, torch.bfloat16)
    out = torch.ops.fxfuse.gemm_fp8(q, xs, w, ws, torch.bfloat16)
    ref = gemm_fp8_ref(q, xs, w, ws, torch.float64, torch.float64)
    assert _rel(out, ref) <= 1e-2


@pytest.mark.parametrize(
    "target, m, backend",
    [("sm90", 1, 1), ("sm90", 64, 1), ("sm90", 65, 2), ("sm90", 8192, 2),
     ("gfx950", 8192, 1), ("gfx942", 8192, 1)],
)
def test_table_sends_large_m_to_the_vendor_on_sm90_only(target, m, backend):
    config = launch_tables.lookup("gemm_fp8_backend", target, m=m, n=2112, k=7168)
    assert config["BACKEND"] == backend


def test_vendor_shape_rules():
    q, xs, w, ws = _rowwise(8, 32, 64)
    assert gemm_ops._vendor_rowwise_ok(q, xs, w, ws, torch.bfloat16)
    assert not gemm_ops._vendor_rowwise_ok(q, xs, w, ws, torch.float32)  # rowwise needs bf16 out
    assert not gemm_ops._vendor_rowwise_ok(q.t().contiguous().t(), xs, w, ws, torch.bfloat16)
    q2, xs2, w2, ws2 = _rowwise(8, 24, 64)  # N not a multiple of 16
    assert not gemm_ops._vendor_rowwise_ok(q2, xs2, w2, ws2, torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("choice", ["triton", "vendor", "auto"])
@pytest.mark.parametrize("m", [16, 256])
def test_gpu_every_backend_meets_the_tolerance(monkeypatch, choice, m):
    if torch.version.hip:
        pytest.skip("e4m3fn rowwise _scaled_mm is the CUDA path")
    monkeypatch.setenv(gemm_ops.GEMM_BACKEND_ENV, choice)
    q, xs, w, ws = _rowwise(m, 2112, 7168, device="cuda", seed=3)
    expect_vendor = choice == "vendor" or (choice == "auto" and m > 64)
    assert gemm_ops._use_vendor(q, xs, w, ws, torch.bfloat16) == expect_vendor
    out = torch.ops.fxfuse.gemm_fp8(q, xs, w, ws, torch.bfloat16)
    ref = gemm_fp8_ref(*(t.cpu() for t in (q, xs, w, ws)), torch.float64, torch.float64)
    assert out.dtype == torch.bfloat16 and out.shape == (m, 2112)
    assert _rel(out.cpu(), ref) <= 1e-2
