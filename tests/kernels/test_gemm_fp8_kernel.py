"""The FP8 GEMM kernels (A8W8 `gemm_fp8`, prequant A16W8 `gemm_a16w8`) against fp64 references.

What is asserted (SPEC §5):
- outputs ≤ 1e-2 relative (‖out − ref‖ / ‖ref‖) against a float64 GEMM of the same quantized
  inputs, for every scale layout, both FP8 flavours, split-K on and off, odd shapes; fp32 outputs
  are held to 1e-5 (only the fp32 summation order differs);
- the prequant kernels' in-register q and scales equal `quant_fp8_ref`'s bit for bit, and their
  output equals gemm_fp8 of those bytes;
- bad inputs raise ValueError naming the argument.
"""

from __future__ import annotations

import pytest
import torch

from fxfuse.kernels import gemm_fp8 as kernels
from fxfuse.kernels.gemm_fp8 import gemm_a16w8, gemm_fp8, split_k_plan
from fxfuse.kernels.gemm_ref import gemm_a16w8_ref, gemm_fp8_ref
from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref
from fxfuse.runtime import launch_tables

FN, FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz
# Small tiles so that the tiny shapes still cover several tiles, masks and K-loops.
SMALL = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 2, "SPLIT_K": 1}
TOL = {torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float32: 1e-5}


def _rel(out, ref):
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def _activations(m, k, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    # Log-normal magnitudes: rows and groups with outliers, so scales differ.
    x = torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, k, generator=g))
    return x.to(dtype)


def _weights(n, k, fp8_dtype, block=False, seed=1):
    wf = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    if block:
        nb, kb = -(-n // 128), -(-k // 128)
        scale = torch.rand(nb, kb, generator=torch.Generator().manual_seed(seed + 1)) * 0.01
        w = (wf / scale.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]).clamp(
            -200, 200
        )
        return w.to(fp8_dtype), scale
    w, scale = quant_fp8_ref(wf, 0, fp8_dtype)
    return w, scale.reshape(n)


def _check(out, q, x_scale, w, w_scale):
    ref = gemm_fp8_ref(q, x_scale, w, w_scale, torch.float64, torch.float64)
    assert out.shape == ref.shape
    assert _rel(out, ref) <= TOL[out.dtype], _rel(out, ref)


# --- A8W8 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fp8_dtype", [FN, FNUZ])
@pytest.mark.parametrize(
    "x_layout,w_layout",
    [
        ("token", "channel"),
        ("token", "channel2d"),
        ("tensor0d", "tensor1d"),
        ("tensor1d", "channel"),
    ],
)
def test_rowwise_scale_layouts(fp8_dtype, x_layout, w_layout):
    m, n, k = 17, 48, 256
    x = _activations(m, k)
    w, w_scale = _weights(n, k, fp8_dtype)
    q, x_scale = quant_fp8_ref(x, 0, fp8_dtype)
    if x_layout == "tensor0d":
        q, x_scale = (x.float() / 0.05).clamp(-200, 200).to(fp8_dtype), torch.tensor(0.05)
    elif x_layout == "tensor1d":
        q, x_scale = (x.float() / 0.05).clamp(-200, 200).to(fp8_dtype), torch.tensor([0.05])
    if w_layout == "channel2d":
        w_scale = w_scale.reshape(n, 1)
    elif w_layout == "tensor1d":
        w_scale = w_scale[:1].clone()
    for out_dtype in (torch.bfloat16, torch.float32):
        out = gemm_fp8(q, x_scale, w, w_scale, out_dtype, config=SMALL)
        assert out.dtype == out_dtype
        _check(out, q, x_scale, w, w_scale)


@pytest.mark.parametrize("fp8_dtype", [FN, FNUZ])
@pytest.mark.parametrize("col_major", [False, True])
@pytest.mark.parametrize("m,n", [(1, 64), (33, 48), (5, 136)])
def test_blockscale(fp8_dtype, col_major, m, n):
    k = 256
    x = _activations(m, k, seed=2)
    q, x_scale = quant_fp8_ref(x, 128, fp8_dtype, scale_col_major=col_major)
    w, w_scale = _weights(n, k, fp8_dtype, block=True)
    assert w_scale.shape == (-(-n // 128), 2)
    out = gemm_fp8(q, x_scale, w, w_scale, torch.float32, config=SMALL)
    _check(out, q, x_scale, w, w_scale)


@pytest.mark.parametrize("split_k", [1, 2, 4])
@pytest.mark.parametrize("scales", ["rowwise", "blockscale"])
def test_split_k(split_k, scales):
    m, n, k = 9, 64, 512
    x = _activations(m, k, seed=3)
    block = scales == "blockscale"
    q, x_scale = quant_fp8_ref(x, 128 if block else 0, FN)
    w, w_scale = _weights(n, k, FN, block=block)
    config = {**SMALL, "SPLIT_K": split_k}
    out = gemm_fp8(q, x_scale, w, w_scale, torch.float32, config=config)
    _check(out, q, x_scale, w, w_scale)
    # The last split of every tile resets its counter, so the next launch starts from zero.
    for locks in kernels._LOCKS.values():
        assert int(locks.count_nonzero()) == 0
    again = gemm_fp8(q, x_scale, w, w_scale, torch.float32, config=config)
    assert torch.equal(out, again), "split-K must be deterministic"


@pytest.mark.parametrize("m,n,k", [(1, 64, 256), (17, 40, 384), (32, 96, 512)])
@pytest.mark.parametrize("scales", ["rowwise", "blockscale"])
@pytest.mark.parametrize("split_k", [1, 2])
def test_swap_ab(m, n, k, scales, split_k):
    """The skinny-M transposed tile (SWAP_AB) gives the same GEMM, masks and split-K included."""
    x = _activations(m, k, seed=11)
    block = scales == "blockscale"
    q, x_scale = quant_fp8_ref(x, 128 if block else 0, FN)
    w, w_scale = _weights(n, k, FN, block=block)
    config = {**SMALL, "BLOCK_K": 128, "SPLIT_K": split_k, "SWAP_AB": 1}
    out = gemm_fp8(q, x_scale, w, w_scale, torch.float32, config=config)
    _check(out, q, x_scale, w, w_scale)
    plain = gemm_fp8(q, x_scale, w, w_scale, torch.float32, config={**config, "SWAP_AB": 0})
    assert _rel(out, plain) <= 1e-6


@pytest.mark.parametrize("group_size,row_amax", [(0, "kernel"), (0, "prepass"), (128, "auto")])
def test_swap_ab_prequant_bytes(group_size, row_amax):
    m, n, k = 5, 48, 256
    x = _activations(m, k, seed=12)
    w, w_scale = _weights(n, k, FN, block=bool(group_size))
    config = {**SMALL, "BLOCK_K": 128, "SPLIT_K": 2, "SWAP_AB": 1}
    out, q, scale = gemm_a16w8(
        x, w, w_scale, group_size=group_size, row_amax=row_amax, return_quant=True, config=config
    )
    ref_q, ref_scale = quant_fp8_ref(x, group_size, FN)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    assert torch.equal(scale, ref_scale)
    ref = gemm_fp8_ref(ref_q, ref_scale, w, w_scale, torch.float64, torch.float64)
    assert _rel(out, ref) <= 1e-2


@pytest.mark.parametrize("m,floor", [(1, 1), (2, 1), (3, 1), (9, 1), (1, 4), (5, 4)])
@pytest.mark.parametrize("swap_ab", [0, 1])
@pytest.mark.parametrize("group_size,row_amax", [(0, "kernel"), (0, "prepass"), (128, "auto")])
def test_prequant_decode_rows(m, floor, swap_ab, group_size, row_amax, monkeypatch):
    """M below half the tile: the program quantizes quant_rows(M) rows of x and repeats them
    over the tile's rows (forced here for every kind, whatever the shipped policy picks); bytes,
    scales and the product must not change."""
    seen = []
    real_launch = kernels.launch

    def spy(kernel, grid, *args, **kwargs):
        if kernel is kernels._gemm_fp8_kernel:  # not the prepass's row-scale kernel
            seen.append(kwargs["QUANT_ROWS"])
        return real_launch(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(kernels, "launch", spy)
    monkeypatch.setattr(
        kernels, "prequant_rows", lambda kind, m, bm: kernels.quant_rows(m, bm, floor)
    )
    n, k = 48, 256
    x = _activations(m, k, seed=20 + m)
    w, w_scale = _weights(n, k, FN, block=bool(group_size))
    config = {**SMALL, "BLOCK_K": 128, "SPLIT_K": 2, "SWAP_AB": swap_ab}
    out, q, scale = gemm_a16w8(
        x, w, w_scale, group_size=group_size, row_amax=row_amax, return_quant=True,
        out_dtype=torch.float32, config=config,
    )  # fmt: skip
    assert seen[-1] == kernels.quant_rows(m, 16, floor)
    assert (seen[-1] < 16) == (m <= 8)  # M = 9 is the unspread case
    assert seen[-1] >= m
    ref_q, ref_scale = quant_fp8_ref(x, group_size, FN)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    assert torch.equal(scale, ref_scale)
    a8w8 = gemm_fp8(ref_q, ref_scale, w, w_scale, torch.float32, config=config)
    torch.testing.assert_close(out, a8w8, rtol=1e-6, atol=1e-6)


def test_quant_rows():
    assert [kernels.quant_rows(m, 16) for m in (1, 2, 3, 4, 5, 8, 9, 16, 17, 40)] == [
        1, 2, 4, 4, 8, 8, 16, 16, 16, 16,
    ]  # fmt: skip
    assert kernels.quant_rows(3, 64) == 4
    assert [kernels.quant_rows(m, 16, 4) for m in (1, 2, 4, 5, 9)] == [4, 4, 4, 8, 16]


def test_prequant_rows_policy():
    """Per-token kinds quantize at least 4 rows at decode M; 1x128 groups the whole tile."""
    for kind in (kernels.A_ROW_AMAX, kernels.A_ROW_PRESCALED):
        assert [kernels.prequant_rows(kind, m, 16) for m in (1, 3, 4, 7, 9)] == [4, 4, 4, 8, 16]
    assert [kernels.prequant_rows(kernels.A_GROUP, m, 16) for m in (1, 4, 16)] == [16, 16, 16]


def test_swap_ab_must_be_a_flag():
    q, x_scale, w, w_scale = _good()
    with pytest.raises(ValueError, match="SWAP_AB"):
        gemm_fp8(q, x_scale, w, w_scale, config={"SWAP_AB": 2})


def test_split_k_plan_divides_k_tiles():
    assert split_k_plan(7168, 128, 8) == (8, 7)
    assert split_k_plan(1536, 128, 8) == (6, 2)
    assert split_k_plan(384, 128, 2) == (1, 3)  # 3 K-tiles: no even split of 2
    assert split_k_plan(100, 128, 4) == (1, 1)


@pytest.mark.parametrize("m,n,k", [(1, 64, 96), (33, 40, 160), (2, 17, 48)])
def test_odd_shapes(m, n, k):
    x = _activations(m, k, seed=4)
    q, x_scale = quant_fp8_ref(x, 0, FN)
    w, w_scale = _weights(n, k, FN)
    out = gemm_fp8(q, x_scale, w, w_scale, config=SMALL)
    _check(out, q, x_scale, w, w_scale)


def test_strided_inputs_and_default_config():
    m, n, k = 6, 32, 256
    x = _activations(m, 2 * k, seed=5)[:, ::2]
    q, x_scale = quant_fp8_ref(x, 0, FN)
    q = torch.cat([q.view(torch.uint8), q.view(torch.uint8)], 1).view(FN)[:, :k]  # row stride 2K
    w, w_scale = _weights(n, k, FN)
    _check(gemm_fp8(q, x_scale, w, w_scale), q, x_scale, w, w_scale)


def test_empty_m():
    w, w_scale = _weights(32, 128, FN)
    q, x_scale = quant_fp8_ref(torch.zeros(0, 128), 0, FN)
    assert gemm_fp8(q, x_scale, w, w_scale).shape == (0, 32)


# --- A16W8 (prequant) -------------------------------------------------------------------------


@pytest.mark.parametrize("fp8_dtype", [FN, FNUZ])
@pytest.mark.parametrize("group_size", [0, 128])
@pytest.mark.parametrize("row_amax", ["kernel", "prepass"])
def test_prequant_matches_quant_then_gemm(fp8_dtype, group_size, row_amax):
    if group_size and row_amax == "prepass":
        pytest.skip("the row amax applies to per-token quant only")
    m, n, k = 7, 48, 256
    x = _activations(m, k, seed=6)
    x[3] = 0  # an all-zero row: the eps clamp decides its scale
    w, w_scale = _weights(n, k, fp8_dtype, block=bool(group_size))
    out, q, scale = gemm_a16w8(
        x,
        w,
        w_scale,
        group_size=group_size,
        row_amax=row_amax,
        return_quant=True,
        out_dtype=torch.float32,
        config=SMALL,
    )
    ref_q, ref_scale = quant_fp8_ref(x, group_size, fp8_dtype)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    assert torch.equal(scale, ref_scale)
    a8w8 = gemm_fp8(ref_q, ref_scale, w, w_scale, torch.float32, config=SMALL)
    torch.testing.assert_close(out, a8w8, rtol=1e-6, atol=1e-6)
    ref = gemm_a16w8_ref(
        x, w, w_scale, group_size, out_dtype=torch.float64, compute_dtype=torch.float64
    )
    assert _rel(out, ref) <= 1e-5


@pytest.mark.parametrize(
    "spelling",
    [
        {"eps_on_scale": True},
        {"apply_reciprocal": True},
        {"quant_eps": 1e-12, "apply_reciprocal": True, "eps_on_scale": True},
    ],
    ids=["eps-on-scale", "reciprocal", "eps1e-12-both"],
)
@pytest.mark.parametrize("group_size", [0, 128])
def test_prequant_scale_spellings(spelling, group_size):
    m, n, k = 5, 32, 256
    x = _activations(m, k, seed=7)
    x[1] = 0
    w, w_scale = _weights(n, k, FN, block=bool(group_size))
    out, q, scale = gemm_a16w8(
        x, w, w_scale, group_size=group_size, return_quant=True, config=SMALL, **spelling
    )
    ref_q, ref_scale = quant_fp8_ref(
        x,
        group_size,
        FN,
        spelling.get("quant_eps", 1e-10),
        spelling.get("eps_on_scale", False),
        spelling.get("apply_reciprocal", False),
    )
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    assert torch.equal(scale, ref_scale)
    ref = gemm_fp8_ref(ref_q, ref_scale, w, w_scale, torch.float64, torch.float64)
    assert _rel(out, ref) <= 1e-2


@pytest.mark.parametrize("x_dtype", [torch.float16, torch.float32])
def test_prequant_input_dtypes_and_split_k(x_dtype):
    m, n, k = 3, 64, 512
    x = _activations(m, k, seed=8, dtype=x_dtype)
    w, w_scale = _weights(n, k, FN)
    out = gemm_a16w8(x, w, w_scale, config={**SMALL, "SPLIT_K": 4})
    ref = gemm_a16w8_ref(x, w, w_scale, out_dtype=torch.float64, compute_dtype=torch.float64)
    assert _rel(out, ref) <= 1e-2


# --- bad inputs ---------------------------------------------------------------------------------


def _good():
    x = _activations(4, 256)
    q, x_scale = quant_fp8_ref(x, 0, FN)
    w, w_scale = _weights(32, 256, FN)
    return q, x_scale, w, w_scale


@pytest.mark.parametrize(
    "change,name",
    [
        (lambda a: {**a, "w": a["w"].view(torch.uint8).view(FNUZ)}, "w"),
        (lambda a: {**a, "q": a["q"].float()}, "q"),
        (lambda a: {**a, "w": a["w"][:, :128]}, "w"),
        (lambda a: {**a, "w_scale": a["w_scale"][:7]}, "w_scale"),
        (lambda a: {**a, "w_scale": torch.ones(1, 3)}, "w_scale"),
        (lambda a: {**a, "x_scale": a["x_scale"][:2]}, "x_scale"),
        (lambda a: {**a, "x_scale": a["x_scale"].double()}, "x_scale"),
        (lambda a: {**a, "x_scale": torch.ones(4, 2)}, "x_scale"),  # blockscale x, per-channel w
        (lambda a: {**a, "w_scale": torch.ones(1, 2)}, "x_scale"),  # per-token x, blockscale w
        (lambda a: {**a, "out_dtype": torch.int8}, "out_dtype"),
    ],
)
def test_bad_inputs_name_the_argument(change, name):
    q, x_scale, w, w_scale = _good()
    args = change(
        {"q": q, "x_scale": x_scale, "w": w, "w_scale": w_scale, "out_dtype": torch.bfloat16}
    )
    with pytest.raises(ValueError, match=rf"^{name}:"):
        gemm_fp8(args["q"], args["x_scale"], args["w"], args["w_scale"], args["out_dtype"])


def test_blockscale_needs_k_multiple_of_128():
    x = _activations(4, 192)
    q = x.float().clamp(-400, 400).to(FN)
    w = torch.randn(32, 192).to(FN)
    with pytest.raises(ValueError, match=r"^q: K must be a multiple of 128"):
        gemm_fp8(q, torch.ones(4, 2), w, torch.ones(1, 2))
    with pytest.raises(ValueError, match=r"^x: K must be a multiple of 128"):
        gemm_a16w8(x, w, torch.ones(1, 2), group_size=128)


def test_prequant_bad_inputs():
    x = _activations(4, 256)
    w, w_scale = _weights(32, 256, FN)
    with pytest.raises(ValueError, match=r"^group_size:"):
        gemm_a16w8(x, w, w_scale, group_size=64)
    with pytest.raises(ValueError, match=r"^w_scale:"):
        gemm_a16w8(x, w, w_scale, group_size=128)  # per-channel weights with 1×128 activations
    with pytest.raises(ValueError, match=r"^x:"):
        gemm_a16w8(x.to(torch.int32), w, w_scale)
    with pytest.raises(ValueError, match=r"^row_amax:"):
        gemm_a16w8(x, w, w_scale, row_amax="sometimes")
    with pytest.raises(ValueError, match=r"^config:"):
        gemm_a16w8(x, w, w_scale, config={"BLOCK_Q": 4})
    with pytest.raises(ValueError, match=r"^target:"):
        gemm_fp8(*quant_fp8_ref(x, 0, FN), w, w_scale, target="sm100")


# --- launch tables ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", kernels.TABLES)
@pytest.mark.parametrize("target", ["sm90", "gfx950", "gfx942"])
def test_table_covers_deepseek_shapes(target, name):
    table = launch_tables.load_table(name)
    assert table["targets"][target]["timed"] is False or target == "sm90"
    for n, k in [(2112, 7168), (3072, 1536), (4096, 512), (7168, 2048), (24576, 1536)]:
        for m in (1, 16, 32, 64, 128, 1024, 16384):
            config = kernels.launch_config(name, target, m, n, k, None)
            split, per_split = split_k_plan(k, config["BLOCK_K"], config["SPLIT_K"])
            assert split * per_split * config["BLOCK_K"] >= k
            if m > 128:
                assert config["SPLIT_K"] == 1


def test_each_variant_reads_its_table():
    assert kernels.table_name(kernels.A_FP8, False) == "gemm_fp8"
    assert kernels.table_name(kernels.A_FP8, True) == "gemm_fp8_block"
    for kind in (kernels.A_GROUP, kernels.A_ROW_AMAX, kernels.A_ROW_PRESCALED):
        assert kernels.table_name(kind, False) == "gemm_a16w8"


# --- GPU ----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("m", [1, 16, 128, 1024])
@pytest.mark.parametrize("group_size", [0, 128])
def test_gpu_deepseek_shape(m, group_size):
    n, k = 2112, 7168
    x = _activations(m, k, seed=9).cuda()
    fp8 = FNUZ if torch.version.hip and "gfx942" in torch.cuda.get_device_name() else FN
    w, w_scale = _weights(n, k, fp8, block=bool(group_size))
    w, w_scale = w.cuda(), w_scale.cuda()
    q, x_scale = quant_fp8_ref(x, group_size, fp8)
    out = gemm_fp8(q, x_scale, w, w_scale)
    _check(out.cpu(), q.cpu(), x_scale.cpu(), w.cpu(), w_scale.cpu())
    for _ in range(3):  # split-K counters reset between launches
        assert torch.equal(gemm_fp8(q, x_scale, w, w_scale), out)
    pre, pre_q, pre_scale = gemm_a16w8(x, w, w_scale, group_size=group_size, return_quant=True)
    # The in-register quant equals the torch spelling run on the same device (on CUDA torch
    # computes `amax / 448.0` as amax · fp32(1 / 448), and so must the kernel).
    ref_q, ref_scale = quant_fp8_ref(x, group_size, fp8)
    assert torch.equal(pre_q.view(torch.uint8), ref_q.view(torch.uint8))
    assert torch.equal(pre_scale, ref_scale)
    ref_q, ref_scale = ref_q.cpu(), ref_scale.cpu()
    ref = gemm_fp8_ref(ref_q, ref_scale, w.cpu(), w_scale.cpu(), torch.float64, torch.float64)
    assert _rel(pre.cpu(), ref) <= 1e-2
