"""Who runs fxfuse::gemm_split_cat / gemm_split: the backend table and the vendor (torch.bmm) path.

The vendor path writes each piece through strided-batched GEMMs straight into its destination;
forced with FXFUSE_GEMM_BACKEND=vendor it runs on the CPU too, which checks its strides here.
"""

import pytest
import torch

from fxfuse.runtime import dispatch, gemm_split_cat_ops, launch_tables

RTOL = 1e-2
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def make_case(m, k, d, s1, s2, s3, y_kind="expand", x_kind="contiguous"):
    x = torch.randn(m, k + (3 if x_kind == "strided_rows" else 0), dtype=torch.bfloat16)
    x = x[:, :k].to(DEVICE)
    w = (torch.randn(d * (s1 + s2), k, dtype=torch.bfloat16) / k**0.5).to(DEVICE)
    if y_kind == "expand":
        y = torch.randn(m, 1, s3, dtype=torch.bfloat16, device=DEVICE).expand(m, d, s3)
    else:  # no unit stride anywhere
        y = torch.randn(s3, m, d, dtype=torch.bfloat16, device=DEVICE).permute(1, 2, 0)
    return x, w, y


# (m, k, d, s1, s2, s3, y kind, x kind)
CASES = [
    (33, 64, 4, 48, 40, 24, "expand", "contiguous"),  # kv_b's form, widths no power of two
    (1, 32, 3, 16, 16, 8, "permuted", "strided_rows"),
    (17, 40, 2, 0, 24, 8, "expand", "contiguous"),  # no c1: out is y alone
    (5, 40, 2, 24, 0, 8, "expand", "contiguous"),  # no c2
]


@pytest.mark.parametrize("m, k, d, s1, s2, s3, y_kind, x_kind", CASES)
def test_forced_vendor_split_cat_matches(monkeypatch, m, k, d, s1, s2, s3, y_kind, x_kind):
    monkeypatch.setenv(dispatch.GEMM_BACKEND_ENV, "vendor")
    x, w, y = make_case(m, k, d, s1, s2, s3, y_kind, x_kind)
    assert gemm_split_cat_ops._use_vendor(x, w, d, (s1, s2), y)
    out, c2 = torch.ops.fxfuse.gemm_split_cat(x, w, d, s1, s2, y)
    assert out.shape == (m, d, s1 + s3) and c2.shape == (m, d, s2)
    # c2 as the unfused graph has it: the last s2 columns of each head of the (M, d, s1 + s2) GEMM
    assert out.is_contiguous() and c2.stride() == (d * (s1 + s2), s1 + s2, 1)
    c = (x.double() @ w.double().T).view(m, d, s1 + s2)
    if s1:
        assert rel_err(out[..., :s1], c[..., :s1]) <= RTOL
    if s2:
        assert rel_err(c2, c[..., s1:]) <= RTOL
    assert torch.equal(out[..., s1:], y)


@pytest.mark.parametrize("m, k, d, s1, s2, s3, y_kind, x_kind", CASES)
def test_unfused_backend_runs_the_graphs_chain(monkeypatch, m, k, d, s1, s2, s3, y_kind, x_kind):
    """BACKEND_UNFUSED: F.linear, then the cat kernel; the bytes of the unfused spelling (the
    same GEMM), c2 a view of that GEMM's output, and fxfuse's GEMM kernel never runs."""
    monkeypatch.delenv(dispatch.GEMM_BACKEND_ENV, raising=False)
    monkeypatch.setattr(gemm_split_cat_ops, "_table_choice", lambda *a: dispatch.BACKEND_UNFUSED)
    kernels = gemm_split_cat_ops._kernels()

    def no_kernel(*args, **kwargs):
        raise AssertionError("the fused GEMM kernel ran under BACKEND_UNFUSED")

    monkeypatch.setattr(kernels, "gemm_split_cat", no_kernel)
    x, w, y = make_case(m, k, d, s1, s2, s3, y_kind, x_kind)
    out, c2 = torch.ops.fxfuse.gemm_split_cat(x, w, d, s1, s2, y)
    c = torch.nn.functional.linear(x, w).view(m, d, s1 + s2)
    assert out.is_contiguous() and torch.equal(out, torch.cat([c[..., :s1], y], dim=-1))
    assert c2.stride() == (d * (s1 + s2), s1 + s2, 1) and torch.equal(c2, c[..., s1:])
    if s2:
        assert c2.untyped_storage().nbytes() == m * d * (s1 + s2) * 2  # the GEMM's own output


def test_sm90_table_runs_the_unfused_chain_where_the_kernel_lost():
    """Kimi-Linear's width (N 8192, K 512) up to M 128 takes the unfused chain; narrower heads
    counts (kv_b N 4096, MiniCPM3 N 5120) and M above 128 keep the kernel."""
    table = gemm_split_cat_ops.BACKEND_TABLE
    kimi = {"n": 8192, "k": 512}
    assert launch_tables.lookup(table, "sm90", m=128, **kimi)["BACKEND"] == dispatch.BACKEND_UNFUSED
    assert launch_tables.lookup(table, "sm90", m=1, **kimi)["BACKEND"] == dispatch.BACKEND_UNFUSED
    assert launch_tables.lookup(table, "sm90", m=129, **kimi)["BACKEND"] == dispatch.BACKEND_TRITON
    for n in (2048, 4096, 5120):
        got = launch_tables.lookup(table, "sm90", m=128, n=n, k=512)["BACKEND"]
        assert got == dispatch.BACKEND_TRITON
    for target in ("gfx950", "gfx942"):  # untimed: the kernel everywhere
        got = launch_tables.lookup(table, target, m=128, **kimi)["BACKEND"]
        assert got == dispatch.BACKEND_TRITON


def test_unfused_at_static_m(monkeypatch):
    monkeypatch.delenv(dispatch.GEMM_BACKEND_ENV, raising=False)
    assert gemm_split_cat_ops.unfused_at("sm90", 128, 8192, 512, split_only=False)
    assert not gemm_split_cat_ops.unfused_at("sm90", 129, 8192, 512, split_only=False)
    assert not gemm_split_cat_ops.unfused_at("gfx950", 128, 8192, 512, split_only=False)
    assert not gemm_split_cat_ops.unfused_at("cpu", 128, 8192, 512, split_only=False)
    # gemm_split's own table: the unfused chain up to M 2048 on sm90
    assert gemm_split_cat_ops.unfused_at("sm90", 2048, 576, 7168, split_only=True)
    assert not gemm_split_cat_ops.unfused_at("sm90", 4096, 576, 512, split_only=True)
    monkeypatch.setenv(dispatch.GEMM_BACKEND_ENV, "triton")  # a forced backend never runs it
    assert not gemm_split_cat_ops.unfused_at("sm90", 128, 8192, 512, split_only=False)


def test_forced_vendor_gemm_split_matches(monkeypatch):
    monkeypatch.setenv(dispatch.GEMM_BACKEND_ENV, "vendor")
    x, w, _ = make_case(9, 48, 3, 24, 16, 1)
    w = torch.cat([w, w[:24]])  # three pieces: 24 | 16 | 8 per head
    pieces = torch.ops.fxfuse.gemm_split(x, w, 3, [24, 16, 8])
    c = (x.double() @ w.double().T).view(9, 3, 48)
    for piece, ref in zip(pieces, torch.split(c, [24, 16, 8], dim=-1)):
        assert piece.is_contiguous() and piece.shape == ref.shape
        assert rel_err(piece, ref) <= RTOL


def test_forced_triton_never_takes_the_vendor(monkeypatch):
    monkeypatch.setenv(dispatch.GEMM_BACKEND_ENV, "triton")
    x, w, y = make_case(8, 32, 2, 16, 16, 4)
    assert not gemm_split_cat_ops._use_vendor(x, w, 2, (16, 16), y)


def test_auto_on_cpu_keeps_the_kernel(monkeypatch):
    monkeypatch.delenv(dispatch.GEMM_BACKEND_ENV, raising=False)
    x = torch.randn(8192, 512, dtype=torch.bfloat16)
    w = torch.randn(4096, 512, dtype=torch.bfloat16)
    assert not gemm_split_cat_ops._use_vendor(x, w, 16, (128, 128))


def test_backend_table_covers_every_target():
    table = launch_tables.load_table(gemm_split_cat_ops.BACKEND_TABLE)
    for target in ("sm90", "gfx950", "gfx942", "cpu"):
        for m in (1, 32, 1024, 4096, 8192, 32768):
            config = launch_tables.lookup(table["kernel"], target, m=m, n=4096, k=512)
            assert config["BACKEND"] in (dispatch.BACKEND_TRITON, dispatch.BACKEND_VENDOR)
    for target in ("gfx950", "gfx942"):
        assert table["targets"][target]["timed"] is False
        assert launch_tables.lookup(table["kernel"], target, m=8192, n=4096, k=512) == {
            "BACKEND": dispatch.BACKEND_TRITON
        }


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("choice", ["auto", "triton", "vendor"])
@pytest.mark.parametrize("m", [32, 4096])
def test_gpu_kv_b_every_backend_meets_the_tolerance(monkeypatch, choice, m):
    monkeypatch.setenv(dispatch.GEMM_BACKEND_ENV, choice)
    x, w, y = make_case(m, 512, 16, 128, 128, 64)
    out, c2 = torch.ops.fxfuse.gemm_split_cat(x, w, 16, 128, 128, y)
    c = (x.double() @ w.double().T).view(m, 16, 256)
    assert rel_err(out[..., :128], c[..., :128]) <= RTOL
    assert rel_err(c2, c[..., 128:]) <= RTOL
    assert torch.equal(out[..., 128:], y)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize(
    "m, backend", [(128, dispatch.BACKEND_UNFUSED), (256, dispatch.BACKEND_TRITON)]
)
def test_gpu_kimi_linear_runs_the_tables_backend(monkeypatch, m, backend):
    """Kimi-Linear's kv_b (32 heads, N 8192, K 512): the unfused chain at M 128, the kernel above;
    both within the tolerance, c2 the unfused graph's view either way."""
    monkeypatch.delenv(dispatch.GEMM_BACKEND_ENV, raising=False)
    x, w, y = make_case(m, 512, 32, 128, 128, 64)
    assert gemm_split_cat_ops._backend(x, w, 32, (128, 128), y) == backend
    out, c2 = torch.ops.fxfuse.gemm_split_cat(x, w, 32, 128, 128, y)
    c = (x.double() @ w.double().T).view(m, 32, 256)
    assert rel_err(out[..., :128], c[..., :128]) <= RTOL and rel_err(c2, c[..., 128:]) <= RTOL
    assert torch.equal(out[..., 128:], y) and c2.stride() == (32 * 256, 256, 1)


def test_split_backend_table_runs_the_unfused_chain_where_it_was_faster():
    """sm90 (H100 2026-12-07): GLM-5.3's 16-head kv_b (n 8192, K 512) unfused at M <= 128, the
    vendor path above and at 64 heads; kv_a-like K above 512 unfused up to M 2048."""
    table = launch_tables.load_table(gemm_split_cat_ops.SPLIT_BACKEND_TABLE)

    def backend(**shape):
        return launch_tables.lookup(table["kernel"], "sm90", **shape)["BACKEND"]

    for m in (1, 128):
        assert backend(m=m, n=8192, k=512) == dispatch.BACKEND_UNFUSED
    for m, n in ((1024, 8192), (2048, 8192), (8192, 8192), (128, 32768)):
        assert backend(m=m, n=n, k=512) == dispatch.BACKEND_VENDOR, (m, n)
    for m in (1, 1024, 2048):
        assert backend(m=m, n=576, k=4096) == dispatch.BACKEND_UNFUSED
    for target in ("gfx950", "gfx942"):
        assert table["targets"][target]["timed"] is False


def test_split_unfused_choice_runs_the_reference(monkeypatch):
    """Where the table says BACKEND_UNFUSED, gemm_split is the unfused chain's bytes and no kernel
    runs (the table is read on CUDA only: the choice is forced here)."""
    monkeypatch.delenv(dispatch.GEMM_BACKEND_ENV, raising=False)
    monkeypatch.setattr(
        gemm_split_cat_ops,
        "_table_choice",
        lambda x, w, table: dispatch.BACKEND_UNFUSED
        if table == gemm_split_cat_ops.SPLIT_BACKEND_TABLE
        else None,
    )

    def no_kernel():
        raise AssertionError("the kernel ran")

    monkeypatch.setattr(gemm_split_cat_ops, "_kernels", no_kernel)
    monkeypatch.setattr(gemm_split_cat_ops, "_on_kernel", lambda *tensors: True)
    x, w, _ = make_case(9, 48, 3, 24, 16, 1)
    pieces = torch.ops.fxfuse.gemm_split(x, w, 3, [24, 16])
    want = torch.split(torch.nn.functional.linear(x, w).view(9, 3, 40), [24, 16], dim=-1)
    for piece, ref in zip(pieces, want):
        assert piece.is_contiguous() and torch.equal(piece, ref)
    # With a view piece it is the graph's own chain: that piece is the GEMM output's view, not
    # a copy (its storage is the whole (M, N) result).
    first, second = torch.ops.fxfuse.gemm_split(x, w, 3, [24, 16], 1)
    assert first.is_contiguous() and torch.equal(first, want[0])
    assert second.stride() == want[1].stride() and torch.equal(second, want[1])
    assert second.untyped_storage().nbytes() == 9 * 120 * x.element_size()


@pytest.mark.parametrize("view_piece", [0, 1, 2])
def test_forced_vendor_gemm_split_view_piece(monkeypatch, view_piece):
    """The vendor path writes the view piece into the split view's strides (its bmm takes any
    row stride), the others contiguous; fake and real outputs agree."""
    monkeypatch.setenv(dispatch.GEMM_BACKEND_ENV, "vendor")
    x, w, _ = make_case(9, 48, 3, 24, 16, 1)
    w = torch.cat([w, w[:24]])
    pieces = torch.ops.fxfuse.gemm_split(x, w, 3, [24, 16, 8], view_piece)
    c = (x.double() @ w.double().T).view(9, 3, 48)
    refs = torch.split(c, [24, 16, 8], dim=-1)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fakes = torch.ops.fxfuse.gemm_split(
            mode.from_tensor(x), mode.from_tensor(w), 3, [24, 16, 8], view_piece
        )
    for i, (piece, ref, fake) in enumerate(zip(pieces, refs, fakes)):
        assert piece.stride() == fake.stride() and piece.shape == ref.shape
        assert piece.is_contiguous() == (i != view_piece)
        assert rel_err(piece, ref) <= RTOL


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("choice", ["auto", "triton", "vendor"])
@pytest.mark.parametrize("m", [32, 4096])
def test_gpu_glm53_split_view_piece_every_backend(monkeypatch, choice, m):
    """GLM-5.3-Flash's kv_b as the pattern calls it (the value its view piece): every backend,
    the unfused chain at M 32 under auto included, gives the split view's strides and values."""
    monkeypatch.setenv(dispatch.GEMM_BACKEND_ENV, choice)
    x, w, _ = make_case(m, 512, 16, 256, 256, 1)
    key, value = torch.ops.fxfuse.gemm_split(x, w, 16, [256, 256], 1)
    c = (x.double() @ w.double().T).view(m, 16, 512)
    assert key.is_contiguous() and value.stride() == (16 * 512, 512, 1)
    assert rel_err(key, c[..., :256]) <= RTOL and rel_err(value, c[..., 256:]) <= RTOL
