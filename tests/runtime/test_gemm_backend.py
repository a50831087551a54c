"""Which implementation runs fxfuse::gemm_fp8: the `gemm_fp8_backend` (rowwise) and
`gemm_fp8_block_backend` (blockscale) launch tables, the FXFUSE_GEMM_BACKEND override, and the
vendor paths (torch._scaled_mm, rowwise and blockwise) held to SPEC §5 on a GPU."""

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


def _blockscale(m, n, k, device="cpu", seed=0):
    """1×128 activation scales and 128×128 weight scales, as the blockscale GEMM takes them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    wf = torch.randn(n, k, generator=g)
    q, x_scale = quant_fp8_ref(x, 128, FN)
    nb, kb = -(-n // 128), k // 128
    padded = torch.zeros(nb * 128, k)
    padded[:n] = wf
    blocks = padded.reshape(nb, 128, kb, 128)
    w_scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-10) / torch.finfo(FN).max
    w = (blocks / w_scale[:, None, :, None]).reshape(nb * 128, k)[:n].to(FN)
    return [t.to(device) for t in (q, x_scale, w, w_scale.float())]


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


@pytest.mark.parametrize(
    "target, m, backend",
    [("sm90", 1, 1), ("sm90", 16, 1), ("sm90", 64, 1), ("sm90", 65, 2), ("sm90", 4096, 2),
     ("gfx950", 4096, 1), ("gfx942", 4096, 1)],
)
def test_block_table_sends_m_above_64_to_the_vendor_on_sm90_only(target, m, backend):
    config = launch_tables.lookup("gemm_fp8_block_backend", target, m=m, n=7168, k=2048)
    assert config["BACKEND"] == backend


def test_cpu_blockscale_never_goes_to_the_vendor(monkeypatch):
    monkeypatch.setenv(gemm_ops.GEMM_BACKEND_ENV, "vendor")
    q, xs, w, ws = _blockscale(4, 256, 256)
    assert not gemm_ops._use_vendor(q, xs, w, ws, torch.bfloat16)
    out = torch.ops.fxfuse.gemm_fp8(q, xs, w, ws, torch.bfloat16)
    ref = gemm_fp8_ref(q, xs, w, ws, torch.float64, torch.float64)
    assert _rel(out, ref) <= 1e-2


def test_vendor_block_shape_rules(monkeypatch):
    q, xs, w, ws = _blockscale(8, 256, 512)
    monkeypatch.setattr(gemm_ops, "_VENDOR_BLOCK_LAYOUT", {})
    assert gemm_ops._vendor_block_ok(q, xs, w, ws, torch.bfloat16) != bool(torch.version.hip)
    q3, xs3, w3, ws3 = _blockscale(8, 256, 384)  # K / 128 = 3 (cuBLASLt was wrong at 18)
    assert not gemm_ops._vendor_block_ok(q3, xs3, w3, ws3, torch.bfloat16)
    assert not gemm_ops._vendor_block_ok(q, xs, w, ws, torch.float32)  # bf16 out only
    assert not gemm_ops._vendor_block_ok(q.t().contiguous().t(), xs, w, ws, torch.bfloat16)
    monkeypatch.setattr(gemm_ops, "_VENDOR_BLOCK_LAYOUT", {q.device.index: None})
    assert not gemm_ops._vendor_block_ok(q, xs, w, ws, torch.bfloat16)  # torch took no layout


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or bool(torch.version.hip), reason="needs CUDA")
@pytest.mark.parametrize("choice", ["triton", "vendor", "auto"])
@pytest.mark.parametrize("m, n, k", [(16, 2112, 7168), (256, 2112, 7168), (1024, 24576, 1536)])
def test_gpu_blockscale_every_backend_meets_the_tolerance(monkeypatch, choice, m, n, k):
    monkeypatch.setenv(gemm_ops.GEMM_BACKEND_ENV, choice)
    q, xs, w, ws = _blockscale(m, n, k, device="cuda", seed=5)
    expect_vendor = choice == "vendor" or (choice == "auto" and m > 64)
    assert gemm_ops._use_vendor(q, xs, w, ws, torch.bfloat16) == expect_vendor
    out = torch.ops.fxfuse.gemm_fp8(q, xs, w, ws, torch.bfloat16)
    # This torch build takes one of the layouts (else the vendor path is off for good).
    assert gemm_ops._VENDOR_BLOCK_LAYOUT.get(q.device.index, 0) is not None
    ref = gemm_fp8_ref(*(t.cpu() for t in (q, xs, w, ws)), torch.float64, torch.float64)
    assert out.dtype == torch.bfloat16 and out.shape == (m, n)
    assert _rel(out.cpu(), ref) <= 1e-2
    col = xs.t().contiguous().t()  # column-major activation scales take the vendor path too
    again = torch.ops.fxfuse.gemm_fp8(q, col, w, ws, torch.bfloat16)
    assert _rel(again.cpu(), ref) <= 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or bool(torch.version.hip), reason="needs CUDA")
def test_gpu_blockscale_k_of_18_blocks_stays_on_triton(monkeypatch):
    """DeepSeek-V3.2's TP8 down_proj (7168 × 2304): cuBLASLt's blockwise GEMM gave a relative
    error of 1.6e3 there on the H200, so even a forced vendor choice runs the Triton kernel."""
    monkeypatch.setenv(gemm_ops.GEMM_BACKEND_ENV, "vendor")
    q, xs, w, ws = _blockscale(256, 7168, 2304, device="cuda", seed=9)
    assert not gemm_ops._use_vendor(q, xs, w, ws, torch.bfloat16)
    out = torch.ops.fxfuse.gemm_fp8(q, xs, w, ws, torch.bfloat16)
    ref = gemm_fp8_ref(*(t.cpu() for t in (q, xs, w, ws)), torch.float64, torch.float64)
    assert _rel(out.cpu(), ref) <= 1e-2


def _with_norm_case(quant, m, device):
    """add_rms_norm_quant_gemm_with_norm: (out, h) the bytes of the op without y, and y the
    spelled norm's up to the sum order: the normed value before the weight multiply within 1 ulp
    of the spelled one (SPEC §5), y that value times the weight. (The multiply can carry the
    ulp on as 2 ulps of y: on an H100 at M 4096 / 16384 a few rows do, the norm kernel's too.)"""
    g = torch.Generator().manual_seed(5)
    n, k = 512, 1024
    x = (torch.randn(m, k, generator=g) * 3).to(torch.bfloat16).to(device)
    r = torch.randn(m, k, generator=g).to(torch.bfloat16).to(device)
    norm_w = (1 + 0.1 * torch.randn(k, generator=g)).to(torch.bfloat16).to(device)
    ops = torch.ops.fxfuse
    if quant == "mxfp4":
        wf = torch.randn(n, k, generator=g).to(torch.bfloat16).to(device) / k**0.5
        w, ws = ops.quant_mxfp4(wf, "even")
        q_args = ("mxfp4", 0, FN, 0.0, False, False, False, "even")
    elif quant == "fp8_group128":
        _, _, w, ws = _blockscale(1, n, k, device=device, seed=5)
        q_args = ("fp8", 128, FN, 1e-10, False, False, False, "even")
    else:
        _, _, w, ws = _rowwise(1, n, k, device=device, seed=5)
        q_args = ("fp8", 0, FN, 1e-10, False, False, False, "even")
    args = (x, r, norm_w, 1e-6, 0.0, True, None, False, *q_args, w, ws, torch.bfloat16, 32)
    out, h, y = ops.add_rms_norm_quant_gemm_with_norm(*args)
    base_out, base_h = ops.add_rms_norm_quant_gemm(*args)
    assert out.shape == (m, n)
    assert torch.equal(h, base_h) and torch.equal(out, base_out)
    hf = (x + r).float()
    normed = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()
    inf = torch.full_like(normed, float("inf"))
    admissible = [norm_w * a for a in (normed, torch.nextafter(normed, inf),
                                       torch.nextafter(normed, -inf))]  # fmt: skip
    assert bool(sum(torch.eq(y, a) for a in admissible).bool().all())


@pytest.mark.parametrize("quant", ["fp8", "fp8_group128", "mxfp4"])
def test_norm_quant_gemm_with_norm_is_the_chain_and_its_norm(quant, reference_path):
    for m in (4, 40):  # both sides of prologue_quant_max_m = 32
        _with_norm_case(quant, m, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("quant", ["fp8", "fp8_group128", "mxfp4"])
@pytest.mark.parametrize("m", [16, 1024, 8192])  # both sides of prologue_quant_max_m = 32
def test_gpu_norm_quant_gemm_with_norm_is_the_chain_and_its_norm(quant, m):
    _with_norm_case(quant, m, "cuda")
