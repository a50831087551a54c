"""The A8W8 and AFP4WFP4 GEMM kernels with gemm_split_cat's split epilogue (the quantized
producers): each piece equals the same kernel's plain (M, N) output split and concatenated by
torch, bit for bit, and y's slice is y (interpreter on CPU; compiled on a GPU)."""

import pytest
import torch

from fxfuse.kernels import gemm_fp8, gemm_mxfp4, gemm_ref
from fxfuse.kernels.gemm_split_cat import cat_pieces
from fxfuse.kernels.gemm_split_cat_ref import split_cat_c2, split_cat_of, split_of
from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref, quant_mxfp4_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16


def _config(block_m, block_n, block_k, split_k=1, swap=0):
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": 2,
            "SPLIT_K": split_k, "num_warps": 4, "num_stages": 2, "SWAP_AB": swap}  # fmt: skip


def _y(m, d, s3, kind, dtype):
    if kind == "expand":  # DeepSeek k_pe broadcast over heads: stride 0 along d
        return torch.randn(m, 1, s3, device=DEVICE).to(dtype).expand(m, d, s3)
    if kind == "permuted":  # no unit stride anywhere
        return torch.randn(s3, m, d, device=DEVICE).to(dtype).permute(1, 2, 0)
    return torch.randn(m, d, s3, device=DEVICE).to(dtype)


def _fp8_operands(m, n, k, blockwise):
    x = torch.randn(m, k, device=DEVICE)
    q, x_scale = quant_fp8_ref(x, 128 if blockwise else 0, FP8, 1e-10, False, False)
    w, w_scale = quant_fp8_ref(torch.randn(n, k, device=DEVICE), 0, FP8, 1e-10, False, False)
    if blockwise:
        w_scale = torch.rand(-(-n // 128), k // 128, device=DEVICE) + 0.5
    else:
        w_scale = w_scale.view(-1)
    return q, x_scale, w, w_scale


def _check(plain, d, widths, y, got_cat, got_split):
    """got_cat = (out, c2) of widths (s1, s2); got_split = the pieces of widths."""
    if got_cat is not None:
        want_out, want_c2 = split_cat_of(plain, d, widths[0], widths[1], y)
        out, c2 = got_cat
        assert out.is_contiguous() and torch.equal(out, want_out) and torch.equal(c2, want_c2)
        # c2 laid out as the unfused graph's: the tail of each head of an (M, d, s1 + s2) buffer
        assert c2.stride() == split_cat_c2(plain, d, *widths).stride()
    want = split_of(plain, d, widths)
    assert len(got_split) == len(want)
    assert all(p.is_contiguous() and torch.equal(p, w) for p, w in zip(got_split, want))


# (m, d, widths, s3, y kind, config): odd M, widths not multiples of the tile (column scatter),
# heads narrower than a tile (several y copies a tile), split-K, swapped tiles, three pieces.
FP8_CASES = [
    (5, 4, (32, 32), 16, "expand", None),
    (7, 3, (16, 48), 20, "permuted", _config(16, 32, 64, split_k=2, swap=1)),
    (33, 4, (24, 40), 8, "dense", _config(16, 32, 64)),
    (9, 8, (8, 8), 12, "expand", _config(16, 64, 64)),  # four heads start in each tile
    (3, 2, (64, 64), 130, "dense", _config(32, 64, 128, split_k=2)),  # y wider than a block
    (6, 3, (16, 8, 24), 0, "dense", _config(16, 32, 64)),
]


@pytest.mark.parametrize("m, d, widths, s3, y_kind, config", FP8_CASES)
@pytest.mark.parametrize("blockwise", [False, True], ids=["rowwise", "blockscale"])
def test_fp8_split_epilogue_equals_the_plain_kernel(m, d, widths, s3, y_kind, config, blockwise):
    k = 256
    q, x_scale, w, w_scale = _fp8_operands(m, d * sum(widths), k, blockwise)
    plain = gemm_fp8.gemm_fp8(q, x_scale, w, w_scale, BF16, config=config)
    y = _y(m, d, s3, y_kind, BF16)
    got_cat = None
    if len(widths) == 2:
        got_cat = gemm_fp8.gemm_fp8_split_cat(q, x_scale, w, w_scale, d, *widths, y, config=config)
    pieces = gemm_fp8.gemm_fp8_split(q, x_scale, w, w_scale, d, list(widths), BF16, config=config)
    _check(plain, d, list(widths), y, got_cat, pieces)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_fp8_split_epilogue_other_out_dtypes(dtype):
    m, d, widths = 5, 3, [24, 40]
    q, x_scale, w, w_scale = _fp8_operands(m, d * 64, 128, False)
    y = _y(m, d, 16, "expand", dtype)
    plain = gemm_fp8.gemm_fp8(q, x_scale, w, w_scale, dtype)
    got = gemm_fp8.gemm_fp8_split_cat(q, x_scale, w, w_scale, d, *widths, y)
    assert got[0].dtype == dtype
    _check(
        plain, d, widths, y, got, gemm_fp8.gemm_fp8_split(q, x_scale, w, w_scale, d, widths, dtype)
    )


MXFP4_CASES = [
    (5, 4, (32, 32), 16, "expand", None, False),
    (7, 3, (24, 40), 20, "permuted", _config(16, 32, 64, split_k=2, swap=1), False),
    (17, 2, (64, 64), 32, "expand", _config(16, 64, 128), True),  # preshuffled weights
]


@pytest.mark.parametrize("m, d, widths, s3, y_kind, config, preshuffled", MXFP4_CASES)
def test_mxfp4_split_epilogue_equals_the_plain_kernel(
    m, d, widths, s3, y_kind, config, preshuffled
):
    n, k = d * sum(widths), 256
    q, x_scale = quant_mxfp4_ref(torch.randn(m, k, device=DEVICE), "even")
    w, w_scale = quant_mxfp4_ref(torch.randn(n, k, device=DEVICE), "even")
    plain = gemm_mxfp4.gemm_mxfp4(q, x_scale, w, w_scale, BF16, config=config)
    layout = {}
    if preshuffled:
        w, w_scale = gemm_ref.preshuffle_weight_fp4(w), gemm_ref.preshuffle_scale_e8m0(w_scale)
        layout = {"preshuffled": True, "n": n}
    y = _y(m, d, s3, y_kind, BF16)
    got_cat = gemm_mxfp4.gemm_mxfp4_split_cat(
        q, x_scale, w, w_scale, d, *widths, y, config=config, **layout
    )
    pieces = gemm_mxfp4.gemm_mxfp4_split(
        q, x_scale, w, w_scale, d, list(widths), BF16, config=config, **layout
    )
    _check(plain, d, list(widths), y, got_cat, pieces)


@pytest.mark.parametrize("m, d, s1, s2, s3, y_kind", [(5, 4, 32, 32, 16, "expand"),
                                                     (7, 3, 24, 40, 300, "permuted"),
                                                     (1, 16, 128, 128, 64, "expand"),
                                                     (3, 2, 520, 8, 40, "dense"),
                                                     (4, 2, 0, 24, 8, "expand"),  # no c1
                                                     (4, 2, 16, 8, 0, "dense")])  # fmt: skip
def test_cat_pieces_equals_torch_cat(m, d, s1, s2, s3, y_kind):
    """The one-kernel cat the ops run after a vendor GEMM."""
    c = torch.randn(m, d * (s1 + s2), device=DEVICE).to(BF16)
    y = _y(m, d, s3, y_kind, BF16)
    out = cat_pieces(c, d, s1, s2, y)
    assert out.is_contiguous() and torch.equal(out, split_cat_of(c, d, s1, s2, y)[0])


def test_zero_rows():
    q, x_scale, w, w_scale = _fp8_operands(0, 2 * 64, 128, False)
    out, c2 = gemm_fp8.gemm_fp8_split_cat(
        q, x_scale, w, w_scale, 2, 32, 32, _y(0, 2, 8, "dense", BF16)
    )
    assert out.shape == (0, 2, 40) and c2.shape == (0, 2, 32)


@pytest.mark.parametrize(
    "change, argument",
    [
        ({"d": 3}, "w"),  # d·(s1 + s2) != N
        ({"d": 0}, "d"),
        ({"s1": -1}, "s1"),
        ({"y": "wrong_rows"}, "y"),
        ({"y": "not_a_tensor"}, "y"),
    ],
)
def test_bad_arguments_are_named(change, argument):
    m, d, s1, s2 = 4, 2, 32, 32
    q, x_scale, w, w_scale = _fp8_operands(m, d * (s1 + s2), 128, False)
    args = {"d": d, "s1": s1, "s2": s2, "y": _y(m, d, 8, "dense", BF16)}
    ys = {
        "wrong_rows": _y(m + 1, d, 8, "dense", BF16),
        "not_a_tensor": 3,
    }
    args.update({k: ys.get(v, v) if k == "y" else v for k, v in change.items()})
    with pytest.raises(ValueError, match=f"^{argument}:"):
        gemm_fp8.gemm_fp8_split_cat(q, x_scale, w, w_scale, **args)


@pytest.mark.parametrize("sizes", [[0, 0], [8] * 5, [16, 16]], ids=["empty", "five", "sum"])
def test_bad_sizes_are_named(sizes):
    q, x_scale = quant_mxfp4_ref(torch.randn(3, 64, device=DEVICE), "even")
    w, w_scale = quant_mxfp4_ref(torch.randn(2 * 40, 64, device=DEVICE), "even")
    with pytest.raises(ValueError, match="^(sizes|w):"):
        gemm_mxfp4.gemm_mxfp4_split(q, x_scale, w, w_scale, 2, sizes, BF16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("m", [1, 32, 300, 4100])
@pytest.mark.parametrize("kind", ["rowwise", "blockscale", "mxfp4"])
def test_deepseek_kv_b_on_gpu(m, kind):
    """kv_b at TP8: K 512, 16 heads of (128 | 128), y the 64-wide k_pe broadcast over heads."""
    torch.manual_seed(m)
    d, widths, k = 16, [128, 128], 512
    y = _y(m, d, 64, "expand", BF16)
    if kind == "mxfp4":
        q, x_scale = quant_mxfp4_ref(torch.randn(m, k, device=DEVICE), "even")
        w, w_scale = quant_mxfp4_ref(torch.randn(d * 256, k, device=DEVICE), "even")
        plain = gemm_mxfp4.gemm_mxfp4(q, x_scale, w, w_scale, BF16)
        got = gemm_mxfp4.gemm_mxfp4_split_cat(q, x_scale, w, w_scale, d, *widths, y)
        pieces = gemm_mxfp4.gemm_mxfp4_split(q, x_scale, w, w_scale, d, widths, BF16)
    else:
        q, x_scale, w, w_scale = _fp8_operands(m, d * 256, k, kind == "blockscale")
        plain = gemm_fp8.gemm_fp8(q, x_scale, w, w_scale, BF16)
        got = gemm_fp8.gemm_fp8_split_cat(q, x_scale, w, w_scale, d, *widths, y)
        pieces = gemm_fp8.gemm_fp8_split(q, x_scale, w, w_scale, d, widths, BF16)
    _check(plain, d, widths, y, got, pieces)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("m", [1, 300, 4100, 8200])
@pytest.mark.parametrize("kind", ["rowwise", "blockscale", "mxfp4"])
def test_ops_on_gpu_match_the_unfused_spelling(m, kind):
    """The ops as a rewritten graph calls them: the Triton epilogue, or (where the A8W8 table
    picks `_scaled_mm`) the vendor GEMM then cat_pieces, or (rowwise, M 8200 on sm90) the FP8
    head tiles; each against the unfused spelling over the same GEMM op."""
    torch.manual_seed(m)
    d, s1, s2, k = 16, 128, 128, 512
    y = _y(m, d, 64, "expand", BF16)
    if kind == "mxfp4":
        q, x_scale = quant_mxfp4_ref(torch.randn(m, k, device=DEVICE), "even")
        w, w_scale = quant_mxfp4_ref(torch.randn(d * 256, k, device=DEVICE), "even")
        ops = (torch.ops.fxfuse.gemm_mxfp4_split_cat, torch.ops.fxfuse.gemm_mxfp4)
    else:
        q, x_scale, w, w_scale = _fp8_operands(m, d * 256, k, kind == "blockscale")
        ops = (torch.ops.fxfuse.gemm_fp8_split_cat, torch.ops.fxfuse.gemm_fp8)
    out, c2 = ops[0](q, x_scale, w, w_scale, BF16, d, s1, s2, y)
    c = ops[1](q, x_scale, w, w_scale, BF16)
    want_out, want_c2 = split_cat_of(c, d, s1, s2, y)
    assert torch.equal(out[..., s1:], want_out[..., s1:])
    for got, want in ((out[..., :s1], want_out[..., :s1]), (c2, want_c2)):
        rel = ((got.double() - want.double()).norm() / want.double().norm()).item()
        assert rel <= 1e-2  # equal where both run the same GEMM; Triton vs vendor otherwise
    assert c2.stride() == split_cat_c2(c, d, s1, s2).stride()


# (m, d, s, s3, scales, config): the FP8 rowwise head-tile kernel (s1 = s2 = s, a tile a head)
HEAD_TILE_CASES = [
    (5, 2, 32, 16, "rowwise", {"BLOCK_M": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}),
    (70, 3, 32, 16, "tensorwise", {"BLOCK_M": 32, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}),
    (33, 2, 64, 32, "rowwise", {"BLOCK_M": 16, "BLOCK_K": 128, "num_warps": 4, "num_stages": 2}),
    (9, 2, 32, 16, "blockscale", {"BLOCK_M": 16, "num_warps": 4, "num_stages": 2}),
    (40, 3, 64, 32, "blockscale", {"BLOCK_M": 32, "num_warps": 4, "num_stages": 2}),
]


@pytest.mark.parametrize("m, d, s, s3, scales, config", HEAD_TILE_CASES)
def test_fp8_head_tiles_equal_the_plain_kernel(m, d, s, s3, scales, config):
    from fxfuse.kernels.gemm_split_cat import fp8_head_tiles

    q, x_scale, w, w_scale = _fp8_operands(m, d * 2 * s, 256, scales == "blockscale")
    if scales == "tensorwise":
        x_scale = torch.tensor(0.01, device=DEVICE)
        w_scale = torch.tensor([0.02], device=DEVICE)
    y = _y(m, d, s3, "expand", BF16)
    got = fp8_head_tiles(q, x_scale, w, w_scale, d, s, s, y, config=config)
    assert got is not None
    pieces = [got[0][..., :s].contiguous(), got[1].contiguous()]
    _check(gemm_fp8.gemm_fp8(q, x_scale, w, w_scale, BF16), d, [s, s], y, got, pieces)


def test_fp8_head_tiles_decline_what_tma_cannot_take():
    from fxfuse.kernels.gemm_split_cat import fp8_head_tiles

    q, x_scale, w, w_scale = _fp8_operands(4, 3 * 64, 128, False)
    y = _y(4, 3, 8, "expand", BF16)  # out rows of 3 · (32 + 8) bf16: not 16-byte multiples
    assert fp8_head_tiles(q, x_scale, w, w_scale, 3, 32, 32, y) is None
    y = _y(4, 3, 16, "expand", torch.float16)
    assert fp8_head_tiles(q, x_scale, w, w_scale, 3, 32, 32, y) is None  # bf16 out only


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("m", [128, 300, 4100])
@pytest.mark.parametrize("blockwise", [False, True], ids=["rowwise", "blockscale"])
def test_fp8_head_tiles_on_gpu(m, blockwise):
    from fxfuse.kernels.gemm_split_cat import fp8_head_tiles

    torch.manual_seed(m)
    d, s, k = 16, 128, 512
    q, x_scale, w, w_scale = _fp8_operands(m, d * 2 * s, k, blockwise)
    y = _y(m, d, 64, "expand", BF16)
    out, c2 = fp8_head_tiles(q, x_scale, w, w_scale, d, s, s, y)
    want_out, want_c2 = split_cat_of(gemm_fp8.gemm_fp8(q, x_scale, w, w_scale, BF16), d, s, s, y)
    assert torch.equal(out[..., s:], want_out[..., s:])
    for got, want in ((out[..., :s], want_out[..., :s]), (c2, want_c2)):
        assert ((got.double() - want.double()).norm() / want.double().norm()).item() <= 1e-2
