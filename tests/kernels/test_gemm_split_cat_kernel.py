"""GEMM → split → cat kernel against its torch reference (interpreter on CPU; tests/conftest.py sets
TRITON_INTERPRET=1). GEMM outputs ≤ 1e-2 relative to a float64 reference (SPEC §5); the copied y
slice bit-exact."""

import pytest
import torch

from fxfuse.kernels.gemm_split_cat import gemm_split, gemm_split_cat
from fxfuse.kernels.gemm_split_cat_ref import gemm_split_cat_ref, gemm_split_ref
from fxfuse.runtime import launch_tables

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
RTOL = 1e-2
# Small tiles so that tiny shapes still span several tiles, partial tiles and a K tail.
SMALL = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def gemm64(x: torch.Tensor, w: torch.Tensor, d: int) -> torch.Tensor:
    return (x.double() @ w.double().T).view(x.shape[0], d, -1)


def make_y(kind: str, m: int, d: int, s3: int, dtype: torch.dtype) -> torch.Tensor:
    if kind == "expand":  # DeepSeek k_pe broadcast over heads: stride 0 along D
        return torch.randn(m, 1, s3, dtype=dtype, device=DEVICE).expand(m, d, s3)
    if kind == "permuted":  # no unit stride anywhere
        return torch.randn(s3, m, d, dtype=dtype, device=DEVICE).permute(1, 2, 0)
    return torch.randn(m, d, s3, dtype=dtype, device=DEVICE)


def make_x(kind: str, m: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    if kind == "strided_rows":  # a slice of a wider buffer: row stride > K
        return torch.randn(m, k + 5, dtype=dtype, device=DEVICE)[:, :k]
    if kind == "transposed":  # K-stride != 1
        return torch.randn(k, m, dtype=dtype, device=DEVICE).T
    return torch.randn(m, k, dtype=dtype, device=DEVICE)


def check_split_cat(x, w, d, s1, s2, y, config=None):
    out, c2 = gemm_split_cat(x, w, d, s1, s2, y, config=config)
    m, s3 = x.shape[0], y.shape[-1]
    assert out.shape == (m, d, s1 + s3) and c2.shape == (m, d, s2)
    # c2 laid out as the unfused graph's: the last s2 columns of an (M, d, s1 + s2) buffer
    assert out.is_contiguous() and c2.stride() == (d * (s1 + s2), s1 + s2, 1)
    assert out.dtype == x.dtype and c2.dtype == x.dtype
    c = gemm64(x, w, d)
    if s1:
        assert rel_err(out[..., :s1], c[..., :s1]) <= RTOL
    if s2:
        assert rel_err(c2, c[..., s1:]) <= RTOL
    assert torch.equal(out[..., s1:], y)
    # And the x.dtype torch reference, within the same tolerance.
    out_ref, c2_ref = gemm_split_cat_ref(x, w, d, s1, s2, y)
    assert c2_ref.stride() == c2.stride()
    assert rel_err(out, out_ref.double()) <= RTOL and torch.equal(out[..., s1:], out_ref[..., s1:])
    if s2:
        assert rel_err(c2, c2_ref.double()) <= RTOL


# (m, k, d, s1, s2, s3, dtype, config, x kind, y kind)
CASES = [
    # S not powers of two (column scatter epilogue), odd M, table config.
    (33, 64, 4, 48, 40, 24, torch.bfloat16, None, "contiguous", "expand"),
    (33, 64, 4, 48, 40, 24, torch.bfloat16, SMALL, "strided_rows", "expand"),
    # D = 1 and a K tail (40 = 2·16 + 8).
    (17, 40, 1, 48, 40, 24, torch.float16, SMALL, "contiguous", "contiguous"),
    # Piece widths multiples of BLOCK_N (one block store per tile) / of BLOCK_N / 2 (two).
    (31, 48, 3, 32, 64, 8, torch.bfloat16, SMALL, "transposed", "permuted"),
    (31, 48, 3, 32, 64, 8, torch.float16, {**SMALL, "BLOCK_N": 64}, "contiguous", "expand"),
    # Split-K (small M): fp32 partials, then the reduce kernel scatters and copies y.
    (5, 64, 2, 48, 40, 24, torch.bfloat16, {**SMALL, "SPLIT_K": 3}, "strided_rows", "expand"),
    (
        9,
        40,
        3,
        32,
        32,
        8,
        torch.float16,
        {**SMALL, "BLOCK_N": 64, "SPLIT_K": 2},
        "contiguous",
        "permuted",
    ),
    # One row, y wider than c1.
    (1, 32, 4, 24, 8, 40, torch.bfloat16, SMALL, "contiguous", "expand"),
]


@pytest.mark.parametrize("m, k, d, s1, s2, s3, dtype, config, x_kind, y_kind", CASES)
def test_gemm_split_cat_matches_reference(m, k, d, s1, s2, s3, dtype, config, x_kind, y_kind):
    torch.manual_seed(m * 131 + k)
    x = make_x(x_kind, m, k, dtype)
    w = torch.randn(d * (s1 + s2), k, dtype=dtype, device=DEVICE)
    y = make_y(y_kind, m, d, s3, dtype)
    check_split_cat(x, w, d, s1, s2, y, config)


def test_empty_y_and_empty_second_piece():
    torch.manual_seed(1)
    x = torch.randn(7, 32, dtype=torch.bfloat16, device=DEVICE)
    w = torch.randn(2 * 40, 32, dtype=torch.bfloat16, device=DEVICE)
    check_split_cat(x, w, 2, 40, 0, make_y("contiguous", 7, 2, 0, x.dtype), SMALL)
    w = torch.randn(2 * 48, 32, dtype=torch.bfloat16, device=DEVICE)
    check_split_cat(x, w, 2, 24, 24, make_y("contiguous", 7, 2, 0, x.dtype), SMALL)


def test_zero_rows():
    x = torch.randn(0, 16, dtype=torch.bfloat16, device=DEVICE)
    w = torch.randn(2 * 24, 16, dtype=torch.bfloat16, device=DEVICE)
    out, c2 = gemm_split_cat(x, w, 2, 16, 8, make_y("contiguous", 0, 2, 8, x.dtype))
    assert out.shape == (0, 2, 24) and c2.shape == (0, 2, 8)


@pytest.mark.parametrize(
    "m, k, d, sizes, config",
    [
        (19, 64, 1, [48, 16], SMALL),  # DeepSeek kv_a (512 | 64) scaled down, D = 1
        (19, 64, 1, [48, 16], None),
        (11, 40, 2, [24, 40, 8], SMALL),  # three pieces (q_a | kv_a | k_pe style)
        (11, 40, 2, [32, 32, 32, 32], {**SMALL, "BLOCK_N": 64}),  # four, block stores
        (6, 32, 3, [40], SMALL),  # one piece: a plain GEMM into (M, D, S)
        (13, 64, 2, [48, 16], {**SMALL, "SPLIT_K": 2}),
    ],
)
def test_gemm_split_matches_reference(m, k, d, sizes, config):
    torch.manual_seed(m + k)
    x = make_x("strided_rows", m, k, torch.bfloat16)
    w = torch.randn(d * sum(sizes), k, dtype=torch.bfloat16, device=DEVICE)
    pieces = gemm_split(x, w, d, sizes, config=config)
    c = gemm64(x, w, d)
    refs = torch.split(c, sizes, dim=-1)
    ref_pieces = gemm_split_ref(x, w, d, sizes)
    assert len(pieces) == len(sizes)
    for piece, ref, ref_piece, size in zip(pieces, refs, ref_pieces, sizes):
        assert piece.shape == (m, d, size) and piece.is_contiguous()
        assert rel_err(piece, ref) <= RTOL
        assert rel_err(piece, ref_piece.double()) <= RTOL


def _inputs(m=4, k=32, d=2, s1=16, s2=8, s3=8, dtype=torch.bfloat16):
    x = torch.randn(m, k, dtype=dtype)
    w = torch.randn(d * (s1 + s2), k, dtype=dtype)
    y = torch.randn(m, d, s3, dtype=dtype)
    return x, w, d, s1, s2, y


@pytest.mark.parametrize(
    "mutate, argument",
    [
        (lambda a: {**a, "w": torch.randn(50, 32, dtype=torch.bfloat16)}, "w"),  # N != D·(S1+S2)
        (lambda a: {**a, "w": torch.randn(48, 24, dtype=torch.bfloat16)}, "w"),  # K mismatch
        (lambda a: {**a, "w": a["w"].half()}, "w"),  # dtype mismatch
        (lambda a: {**a, "y": torch.randn(4, 3, 8, dtype=torch.bfloat16)}, "y"),  # D mismatch
        (lambda a: {**a, "y": torch.randn(5, 2, 8, dtype=torch.bfloat16)}, "y"),  # M mismatch
        (lambda a: {**a, "y": torch.randn(4, 16, dtype=torch.bfloat16)}, "y"),  # not 3-D
        (lambda a: {**a, "y": a["y"].half()}, "y"),
        (lambda a: {**a, "x": a["x"].float(), "w": a["w"].float(), "y": a["y"].float()}, "x"),
        (lambda a: {**a, "x": a["x"][None]}, "x"),
        (lambda a: {**a, "d": 0}, "d"),
        (lambda a: {**a, "s1": -1, "s2": 25}, "s1"),
    ],
)
def test_bad_inputs_name_the_argument(mutate, argument):
    x, w, d, s1, s2, y = _inputs()
    args = mutate({"x": x, "w": w, "d": d, "s1": s1, "s2": s2, "y": y})
    with pytest.raises(ValueError, match=rf"^{argument}:"):
        gemm_split_cat(args["x"], args["w"], args["d"], args["s1"], args["s2"], args["y"])


@pytest.mark.parametrize(
    "view_piece, config", [(1, SMALL), (0, SMALL), (2, {**SMALL, "SPLIT_K": 2})]
)
def test_gemm_split_view_piece_has_the_split_views_strides(view_piece, config):
    """Piece `view_piece` is written where the unfused split's view has it: its columns of each
    head of an (M, d, sum(sizes)) buffer; the others stay contiguous; every value as before."""
    torch.manual_seed(view_piece)
    m, k, d, sizes = 13, 64, 2, [24, 40, 8]
    x = make_x("contiguous", m, k, torch.bfloat16)
    w = torch.randn(d * sum(sizes), k, dtype=torch.bfloat16, device=DEVICE)
    pieces = gemm_split(x, w, d, sizes, view_piece, config=config)
    plain = gemm_split(x, w, d, sizes, config=config)
    want = torch.split(torch.empty(m, d, sum(sizes)), sizes, dim=-1)
    for i, (piece, same) in enumerate(zip(pieces, plain)):
        assert piece.shape == same.shape and torch.equal(piece, same)
        if i == view_piece:
            assert piece.stride() == want[i].stride() and not piece.is_contiguous()
        else:
            assert piece.is_contiguous()
    # The view piece holds its buffer alone: no two outputs share storage.
    storages = {p.untyped_storage().data_ptr() for p in pieces}
    assert len(storages) == len(pieces)


def test_gemm_split_bad_inputs():
    x, w, d, _, _, _ = _inputs()
    with pytest.raises(ValueError, match=r"^w:"):
        gemm_split(x, w, d, [16, 16])
    with pytest.raises(ValueError, match=r"^sizes:"):
        gemm_split(x, torch.randn(2 * 5, 32, dtype=x.dtype), d, [1, 1, 1, 1, 1])
    with pytest.raises(ValueError, match=r"^config:"):
        gemm_split(x, w, d, [16, 8], config={"BLOCK_Q": 16})
    with pytest.raises(ValueError, match=r"^config:"):
        gemm_split(x, w, d, [16, 8], config={"BLOCK_N": 24})
    with pytest.raises(ValueError, match=r"^config: PERSISTENT"):
        gemm_split(x, w, d, [16, 8], config={"PERSISTENT": 2})
    for bad in (2, -2, True, 1.0):
        with pytest.raises(ValueError, match=r"^view_piece:"):
            gemm_split(x, w, d, [16, 8], bad)


HEAD = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 2, "PERSISTENT": 1}


@pytest.fixture
def head_tile_calls(monkeypatch):
    """Counts the head-tile kernel's launches."""
    from fxfuse.kernels import gemm_split_cat as kernel_module

    calls = []
    launch = kernel_module._launch_head_tiles

    def counting(*args, **kwargs):
        calls.append(args[0].shape[0])
        return launch(*args, **kwargs)

    monkeypatch.setattr(kernel_module, "_launch_head_tiles", counting)
    return calls


# (m, k, d, s3, dtype, x kind, y kind): s1 = s2 = 16, BLOCK_N = 32, so a tile is one head.
HEAD_CASES = [
    (33, 64, 3, 8, torch.bfloat16, "contiguous", "expand"),  # odd M: a partial last row block
    (17, 40, 2, 24, torch.bfloat16, "contiguous", "permuted"),  # K tail (TMA zero fill), S3 not 2^k
    (5, 48, 4, 8, torch.float16, "strided_rows_aligned", "contiguous"),  # row stride > K
    (1, 32, 1, 40, torch.bfloat16, "contiguous", "expand"),  # one row, y wider than a piece
]


@pytest.mark.parametrize("m, k, d, s3, dtype, x_kind, y_kind", HEAD_CASES)
def test_head_tile_kernel_matches_reference(m, k, d, s3, dtype, x_kind, y_kind, head_tile_calls):
    torch.manual_seed(m * 7 + k)
    if x_kind == "strided_rows_aligned":  # 16-byte rows: TMA can take it
        x = torch.randn(m, k + 8, dtype=dtype, device=DEVICE)[:, :k]
    else:
        x = make_x(x_kind, m, k, dtype)
    w = torch.randn(d * 32, k, dtype=dtype, device=DEVICE)
    y = make_y(y_kind, m, d, s3, dtype)
    check_split_cat(x, w, d, 16, 16, y, HEAD)
    assert head_tile_calls == [m]


def test_head_tile_persistent_loop(monkeypatch, head_tile_calls):
    """Three programs walk nine tiles (GROUP_M 2 over 3 row blocks: a partial last group)."""
    from fxfuse.kernels import gemm_split_cat as kernel_module

    monkeypatch.setattr(kernel_module, "INTERPRETER_PROGRAMS", 3)
    torch.manual_seed(5)
    x = make_x("contiguous", 40, 64, torch.bfloat16)
    w = torch.randn(3 * 32, 64, dtype=torch.bfloat16, device=DEVICE)
    y = make_y("expand", 40, 3, 8, torch.bfloat16)
    check_split_cat(x, w, 3, 16, 16, y, HEAD)
    assert head_tile_calls == [40]


@pytest.mark.parametrize(
    "why, k, s1, s2, x_kind",
    [
        ("pieces of different widths", 32, 24, 8, "contiguous"),
        ("BLOCK_N is not s1 + s2", 32, 32, 32, "contiguous"),
        ("x's K stride is not 1", 32, 16, 16, "transposed"),
        ("x's rows are not 16-byte aligned", 36, 16, 16, "contiguous"),
    ],
)
def test_head_tile_kernel_declines_what_it_cannot_take(why, k, s1, s2, x_kind, head_tile_calls):
    torch.manual_seed(k + s1)
    x = make_x(x_kind, 9, k, torch.bfloat16)
    w = torch.randn(2 * (s1 + s2), k, dtype=torch.bfloat16, device=DEVICE)
    y = make_y("expand", 9, 2, 8, torch.bfloat16)
    check_split_cat(x, w, 2, s1, s2, y, HEAD)  # the tile kernel runs it instead, just as well
    assert head_tile_calls == [], why


def test_head_tile_table_entries_fit_kv_b():
    """sm90's head-tile entries are kv_b's (s1 = s2 = 128): BLOCK_N = 256, and for K <= 256
    MiniCPM3's (64 + 64): 128; other targets: none."""
    table = launch_tables.load_table("gemm_split_cat")
    sm90 = table["targets"]["sm90"]["entries"]
    persistent = [e for e in sm90 if e["config"]["PERSISTENT"]]
    assert persistent and all(e["config"]["SPLIT_K"] == 1 for e in persistent)
    for entry in persistent:
        narrow = entry["when"].get("k_max") == 256
        assert entry["config"]["BLOCK_N"] == (128 if narrow else 256), entry
    for target in ("gfx950", "gfx942"):
        assert not any(e["config"]["PERSISTENT"] for e in table["targets"][target]["entries"])


def test_head_tiles_narrow_to_one_head():
    """A persistent entry tuned on kv_b's 256-wide heads takes MiniCPM3's 64 + 64 heads one a
    tile (BLOCK_N 128), so they run the head-tile kernel, not a column scatter."""
    from fxfuse.kernels.gemm_split_cat import _plan

    for m in (300, 4096):  # K 512: the kv_b entries (MiniCPM3's K 256 has entries of its own)
        table = launch_tables.lookup("gemm_split_cat", "sm90", m=m, n=5120, k=512)
        assert table["PERSISTENT"] == 1 and table["BLOCK_N"] == 256
        cfg = _plan(m, 5120, 512, 40, (64, 64), 32, None, "sm90", None)["cfg"]
        assert cfg["BLOCK_N"] == 128 and cfg["BLOCK_M"] == table["BLOCK_M"]
        kv_b = _plan(m, 4096, 512, 16, (128, 128), 64, None, "sm90", None)["cfg"]
        assert kv_b["BLOCK_N"] == 256
    # unequal pieces keep the table's tile
    assert _plan(4096, 4096, 512, 16, (96, 160), 32, None, "sm90", None)["cfg"]["BLOCK_N"] == 256


def test_narrowed_head_tiles_run_in_interpreter(head_tile_calls):
    """sm90's persistent entry (256-wide tiles; N > 2048) narrowed to 32 + 32 heads: the
    head-tile kernel itself, one head a tile, equals the reference."""
    torch.manual_seed(3)
    x = make_x("contiguous", 600, 64, torch.bfloat16)
    w = torch.randn(40 * 64, 64, dtype=torch.bfloat16, device=DEVICE)
    y = make_y("expand", 600, 40, 8, torch.bfloat16)
    out, c2 = gemm_split_cat(x, w, 40, 32, 32, y, target="sm90")
    assert head_tile_calls == [600]
    c = gemm64(x, w, 40)
    assert rel_err(out[..., :32], c[..., :32]) <= RTOL and rel_err(c2, c[..., 32:]) <= RTOL
    assert torch.equal(out[..., 32:], y)


def test_launch_table_covers_every_target():
    table = launch_tables.load_table("gemm_split_cat")
    for target in ("sm90", "gfx950", "gfx942", "cpu"):
        for m in (1, 32, 128, 1024, 8192, 32768):
            config = launch_tables.lookup("gemm_split_cat", target, m=m, n=4096, k=512)
            assert sorted(config) == sorted(table["fields"])
    for target in ("gfx950", "gfx942"):
        assert table["targets"][target]["timed"] is False


# (K, heads, s1 = s2, S3): DeepSeek's kv_b (128 + 128 heads: the table's 256-wide head tiles)
# and MiniCPM3's (K 256, 64 + 64 heads: its own entries, one head a tile).
KV_B_SHAPES = {"deepseek": (512, 16, 128, 64), "minicpm3": (256, 40, 64, 32)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("model", list(KV_B_SHAPES))
@pytest.mark.parametrize("m", [32, 300, 1000, 4100])
def test_kv_b_on_gpu(model, m, head_tile_calls):
    k, d, s, s3 = KV_B_SHAPES[model]
    torch.manual_seed(m)
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(d * 2 * s, k, dtype=torch.bfloat16, device="cuda") / 16
    y = make_y("expand", m, d, s3, torch.bfloat16)
    check_split_cat(x, w, d, s, s, y)
    # sm90's table sends M > 128 to the head-tile kernel (TMA: sm90 and later).
    if torch.cuda.get_device_capability()[0] >= 9 and torch.version.hip is None:
        assert head_tile_calls == ([m] if m > 128 else [])
