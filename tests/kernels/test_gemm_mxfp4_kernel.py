"""The MXFP4 GEMM kernels (AFP4WFP4 `gemm_mxfp4`, prequant A16WFP4 `gemm_a16wfp4`) against fp64
references, and the gfx950 preshuffles.

What is asserted (SPEC §5):
- outputs ≤ 1e-2 relative against a float64 GEMM of the same quantized inputs (fp32 outputs 1e-5),
  split-K on and off, odd K, NaN scales propagating like the reference;
- the prequant kernel's in-register q and e8m0 scales equal `quant_mxfp4_ref`'s bit for bit for all
  three roundings, and its output equals gemm_mxfp4 of those bytes;
- preshuffle_weight_fp4 / preshuffle_scale_e8m0 match SPEC §2's view/permute spelling, invert
  exactly, and the kernel gives the same result on the shuffled layouts;
- bad inputs raise ValueError naming the argument.
"""

from __future__ import annotations

import pytest
import torch

from fxfuse.kernels import formats
from fxfuse.kernels import gemm_mxfp4 as mx_kernels
from fxfuse.kernels.gemm_fp8 import quant_rows
from fxfuse.kernels.gemm_mxfp4 import (
    E2M1_BF16_PTX2_TEXT,
    E2M1_BF16_PTX4_TABLES,
    E2M1_BF16_PTX4_TABLES_TEXT,
    E2M1_BF16_PTX4_TEXT,
    gemm_a16wfp4,
    gemm_mxfp4,
)
from fxfuse.kernels.gemm_ref import (
    gemm_a16wfp4_ref,
    gemm_mxfp4_ref,
    preshuffle_scale_e8m0,
    preshuffle_weight_fp4,
    unshuffle_scale_e8m0,
    unshuffle_weight_fp4,
)
from fxfuse.kernels.rms_norm_quant_ref import quant_mxfp4_ref
from fxfuse.runtime import launch_tables

SMALL = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 2, "SPLIT_K": 1}
TOL = {torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float32: 1e-5}


def _rel(out, ref):
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def _activations(m, k, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, k, generator=g))
    return x.to(dtype)


def _mx(rows, k, seed):
    return quant_mxfp4_ref(_activations(rows, k, seed))


def _check(out, q, x_scale, w, w_scale):
    ref = gemm_mxfp4_ref(q, x_scale, w, w_scale, torch.float64, torch.float64)
    assert out.shape == ref.shape
    assert _rel(out, ref) <= TOL[out.dtype], _rel(out, ref)


@pytest.mark.parametrize("m,n,k", [(1, 64, 256), (17, 48, 256), (33, 40, 96), (4, 64, 32)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_matches_reference(m, n, k, out_dtype):
    q, x_scale = _mx(m, k, 1)
    w, w_scale = _mx(n, k, 2)
    config = {**SMALL, "BLOCK_K": 64}
    out = gemm_mxfp4(q, x_scale, w, w_scale, out_dtype, config=config)
    assert out.dtype == out_dtype
    _check(out, q, x_scale, w, w_scale)


@pytest.mark.parametrize("split_k", [1, 2, 4])
def test_split_k(split_k):
    q, x_scale = _mx(9, 256, 3)
    w, w_scale = _mx(64, 256, 4)
    config = {**SMALL, "SPLIT_K": split_k}
    out = gemm_mxfp4(q, x_scale, w, w_scale, torch.float32, config=config)
    _check(out, q, x_scale, w, w_scale)
    assert torch.equal(out, gemm_mxfp4(q, x_scale, w, w_scale, torch.float32, config=config))


def test_default_config_and_strided_inputs():
    q, x_scale = _mx(6, 512, 5)
    w, w_scale = _mx(32, 512, 6)
    q_strided = torch.cat([q, q], 1)[:, :256]
    _check(gemm_mxfp4(q_strided, x_scale, w, w_scale), q_strided, x_scale, w, w_scale)


def test_extreme_and_nan_scales():
    q, x_scale = _mx(4, 128, 7)
    w, w_scale = _mx(32, 128, 8)
    x_scale[0, 0] = 0  # 2^-127: subnormal factors
    x_scale[1, 1] = 200
    w_scale[3, 2] = 255  # NaN: that output column is NaN in every row, as in the reference
    out = gemm_mxfp4(q, x_scale, w, w_scale, torch.float32, config=SMALL)
    ref = gemm_mxfp4_ref(q, x_scale, w, w_scale, torch.float32, torch.float64)
    assert torch.equal(out.isnan(), ref.isnan()) and out[:, 3].isnan().all()
    finite = ~ref.isnan()
    assert _rel(out[finite], ref[finite]) <= 1e-5


@pytest.mark.parametrize("rounding", formats.MXFP4_ROUNDINGS)
@pytest.mark.parametrize("m,k", [(7, 256), (33, 96)])
def test_prequant_matches_quant_then_gemm(rounding, m, k):
    n = 48
    x = _activations(m, k, seed=9)
    x[2] = 0  # an all-zero row: exponent clamps to -127
    w, w_scale = _mx(n, k, 10)
    out, q, scale = gemm_a16wfp4(
        x,
        w,
        w_scale,
        rounding=rounding,
        return_quant=True,
        out_dtype=torch.float32,
        config=SMALL,
    )
    ref_q, ref_scale = quant_mxfp4_ref(x, rounding)
    assert torch.equal(q, ref_q)
    assert torch.equal(scale, ref_scale)
    a4w4 = gemm_mxfp4(ref_q, ref_scale, w, w_scale, torch.float32, config=SMALL)
    torch.testing.assert_close(out, a4w4, rtol=1e-6, atol=1e-6)
    ref = gemm_a16wfp4_ref(x, w, w_scale, rounding, torch.float64, torch.float64)
    assert _rel(out, ref) <= 1e-5


@pytest.mark.parametrize("x_dtype", [torch.float16, torch.float32])
def test_prequant_input_dtypes_and_split_k(x_dtype):
    x = _activations(3, 512, seed=11, dtype=x_dtype)
    w, w_scale = _mx(64, 512, 12)
    out = gemm_a16wfp4(x, w, w_scale, config={**SMALL, "SPLIT_K": 4})
    ref = gemm_a16wfp4_ref(x, w, w_scale, "even", torch.float64, torch.float64)
    assert _rel(out, ref) <= 1e-2


@pytest.mark.parametrize("rounding", formats.MXFP4_ROUNDINGS)
def test_prequant_values_path_equals_codes_path(rounding):
    """Without return_quant the kernel rounds to e2m1 values (`_e2m1_round`) instead of forming
    codes: the output must equal the code path's (fp32 out, same summation) for every rounding."""
    x = _activations(5, 256, seed=13)
    x[1, :32] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0] * 4)  # e2m1 ties
    x[3, 32:64] = float("inf")
    w, w_scale = _mx(32, 256, 14)
    kwargs = dict(rounding=rounding, out_dtype=torch.float32, config=SMALL)
    fast = gemm_a16wfp4(x, w, w_scale, **kwargs)
    with_codes, _, _ = gemm_a16wfp4(x, w, w_scale, return_quant=True, **kwargs)
    torch.testing.assert_close(fast, with_codes, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("swap_ab", [0, 1])
@pytest.mark.parametrize("return_quant", [False, True])
def test_prequant_decode_rows(m, swap_ab, return_quant, monkeypatch):
    """M below half the tile: only quant_rows(M) rows of x are quantized, repeated over the
    tile's rows; the bytes and the product equal the quant-then-GEMM spelling's."""
    seen = []
    real_launch = mx_kernels.launch

    def spy(kernel, grid, *args, **kwargs):
        seen.append(kwargs["QUANT_ROWS"])
        return real_launch(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(mx_kernels, "launch", spy)
    # Forced for every M (the shipped policy spreads at M <= 2 only).
    monkeypatch.setattr(mx_kernels, "prequant_rows", lambda m, bm, swap: quant_rows(m, bm))
    x = _activations(m, 256, seed=30 + m)
    w, w_scale = _mx(48, 256, 31)
    config = {**SMALL, "SWAP_AB": swap_ab, "SPLIT_K": 2}
    res = gemm_a16wfp4(
        x, w, w_scale, return_quant=return_quant, out_dtype=torch.float32, config=config
    )
    assert seen[-1] == quant_rows(m, SMALL["BLOCK_M"]) < SMALL["BLOCK_M"]
    ref_q, ref_scale = quant_mxfp4_ref(x, "even")
    out = res[0] if return_quant else res
    if return_quant:
        assert torch.equal(res[1], ref_q)
        assert torch.equal(res[2], ref_scale)
    a4w4 = gemm_mxfp4(ref_q, ref_scale, w, w_scale, torch.float32, config=config)
    torch.testing.assert_close(out, a4w4, rtol=1e-6, atol=1e-6)


def test_decode_tables_words():
    """The table words the operand form loads: the ones the PTX model decodes with, as int32."""
    t = mx_kernels._decode_tables(torch.device("cpu"))
    assert t.dtype == torch.int32
    assert [w & 0xFFFFFFFF for w in t.tolist()] == [0xC0800000, 0x3F3F3F00, 0x00008000]
    assert mx_kernels._decode_tables(torch.device("cpu")) is t  # cached


def test_prequant_rows_policy():
    """One row at M = 1 (two in swapped tiles), two at M = 2, the whole tile from M = 3."""
    assert [mx_kernels.prequant_rows(m, 16, False) for m in (1, 2, 3, 8)] == [1, 2, 16, 16]
    assert [mx_kernels.prequant_rows(m, 32, True) for m in (1, 2, 3)] == [2, 2, 32]


@pytest.mark.parametrize("split_k", [1, 2])
def test_swapped_tiles(split_k):
    """SWAP_AB computes the transposed tile; same products, same result."""
    q, x_scale = _mx(5, 256, 15)
    w, w_scale = _mx(64, 256, 16)
    config = {**SMALL, "SWAP_AB": 1, "SPLIT_K": split_k}
    out = gemm_mxfp4(q, x_scale, w, w_scale, torch.float32, config=config)
    _check(out, q, x_scale, w, w_scale)
    x = _activations(5, 256, seed=17)
    pre = gemm_a16wfp4(x, w, w_scale, out_dtype=torch.float32, config=config)
    plain = gemm_a16wfp4(x, w, w_scale, out_dtype=torch.float32, config=SMALL)
    torch.testing.assert_close(pre, plain, rtol=1e-6, atol=1e-6)


def _run_ptx(asm: str, word: int, nbytes: int, tables: tuple = ()) -> list[int]:
    """A Python model of the PTX subset the decodes use (and/shr/or/mov .b32, cvt.u32.u16 and
    prmt's default mode, immediates in any operand): run `asm` on its input register (nbytes 2:
    the 16-bit $2; 4: $4) holding `word`, return its outputs ($0, $1 or $0..$3). tables: the
    table words the operand form takes, each in the first of its four operands ($5, $9, $13)."""
    outputs = nbytes
    regs = {f"${outputs}": word}
    for i, t in enumerate(tables):
        regs[f"${outputs + 1 + 4 * i}"] = t & 0xFFFFFFFF

    def val(tok):
        return regs[tok] if tok in regs else int(tok, 0)

    for line in asm.strip().strip("{}").strip().splitlines():
        line = line.strip().rstrip(";")
        if not line or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        dst, *src = [a.strip() for a in args.split(",")]
        v = [val(a) for a in src]
        if op == "and.b32":
            out = v[0] & v[1]
        elif op == "or.b32":
            out = v[0] | v[1]
        elif op == "shr.u32":
            out = v[0] >> v[1]
        elif op == "mov.b32":
            out = v[0]
        elif op == "cvt.u32.u16":
            out = v[0] & 0xFFFF
        elif op == "prmt.b32":  # d.byte[i] = {b, a}.byte[c.nibble[i] & 7] (sign mode unused)
            pool = (v[1] << 32) | v[0]
            assert all(not (v[2] >> (4 * i)) & 8 for i in range(4)), "sign-replicate mode"
            out = sum(((pool >> (8 * ((v[2] >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))
        else:
            raise AssertionError(f"unmodelled instruction {op}")
        regs[dst] = out & 0xFFFFFFFF
    return [regs[f"${i}"] for i in range(outputs)]


@pytest.mark.parametrize(
    "nbytes,asm,tables",
    [
        (2, E2M1_BF16_PTX2_TEXT, ()),
        (4, E2M1_BF16_PTX4_TEXT, ()),
        (4, E2M1_BF16_PTX4_TABLES_TEXT, E2M1_BF16_PTX4_TABLES),
    ],
)
def test_ptx_decode_model_gives_e2m1_as_bf16(nbytes, asm, tables):
    """Every byte value in every position of the input register decodes to bf16(e2m1(code)) of
    its low nibble in the first half of the outputs and of its high nibble in the second (bf16x2
    registers, byte i in register i // 2, half i % 2: the layout the kernel dots)."""
    e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]

    def bf16_bits(code):
        v = torch.tensor((-1.0 if code & 8 else 1.0) * e2m1[code & 7], dtype=torch.bfloat16)
        return v.view(torch.int16).item() & 0xFFFF

    for byte in range(256):
        for pos in range(nbytes):
            word = (byte << (8 * pos)) | (0x5A << (8 * ((pos + 1) % nbytes)))  # a neighbour byte
            regs = _run_ptx(asm, word, nbytes, tables)
            lo_regs, hi_regs = regs[: nbytes // 2], regs[nbytes // 2 :]
            lo = (lo_regs[pos // 2] >> (16 * (pos % 2))) & 0xFFFF
            hi = (hi_regs[pos // 2] >> (16 * (pos % 2))) & 0xFFFF
            assert lo == bf16_bits(byte & 0xF), (byte, pos, hex(lo))
            assert hi == bf16_bits(byte >> 4), (byte, pos, hex(hi))


# --- gfx950 preshuffled layouts ---------------------------------------------------------------


@pytest.mark.parametrize("n,kb", [(16, 32), (48, 64), (64, 128)])
def test_weight_shuffle_spelling_and_inverse(n, kb):
    w = torch.randint(0, 256, (n, kb), dtype=torch.uint8)
    shuffled = preshuffle_weight_fp4(w)
    spec = w.view(n // 16, 16, kb // 32, 2, 16).permute(0, 2, 3, 1, 4).reshape(n // 16, kb * 16)
    assert torch.equal(shuffled, spec)
    assert torch.equal(unshuffle_weight_fp4(shuffled), w)


@pytest.mark.parametrize("rows,cols", [(48, 3), (256, 8), (300, 20)])
def test_scale_shuffle_spelling_and_inverse(rows, cols):
    s = torch.randint(0, 256, (rows, cols), dtype=torch.uint8)
    shuffled = preshuffle_scale_e8m0(s)
    r, c = -(-rows // 256) * 256, -(-cols // 8) * 8
    padded = torch.full((r, c), 127, dtype=torch.uint8)
    padded[:rows, :cols] = s
    spec = padded.view(r // 32, 2, 16, c // 8, 2, 4).permute(0, 3, 5, 2, 4, 1).reshape(r // 32, -1)
    assert torch.equal(shuffled, spec)
    assert torch.equal(unshuffle_scale_e8m0(shuffled, rows, cols), s)


@pytest.mark.parametrize("n,k", [(64, 256), (48, 128)])
def test_kernel_reads_preshuffled_weights(n, k):
    q, x_scale = _mx(5, k, 13)
    w, w_scale = _mx(n, k, 14)
    plain = gemm_mxfp4(q, x_scale, w, w_scale, torch.float32, config=SMALL)
    w_sh, s_sh = preshuffle_weight_fp4(w), preshuffle_scale_e8m0(w_scale)
    shuffled = gemm_mxfp4(
        q, x_scale, w_sh, s_sh, torch.float32, preshuffled=True, n=n, config=SMALL
    )
    assert torch.equal(plain, shuffled)
    x = _activations(5, k, seed=15)
    torch.testing.assert_close(
        gemm_a16wfp4(x, w_sh, s_sh, preshuffled=True, n=n, config=SMALL),
        gemm_a16wfp4(x, w, w_scale, config=SMALL),
        rtol=0,
        atol=0,
    )


# --- bad inputs ---------------------------------------------------------------------------------


def _good():
    q, x_scale = _mx(4, 256, 16)
    w, w_scale = _mx(32, 256, 17)
    return {"q": q, "x_scale": x_scale, "w": w, "w_scale": w_scale, "out_dtype": torch.bfloat16}


@pytest.mark.parametrize(
    "change,name",
    [
        (lambda a: {**a, "q": a["q"][:, :20], "x_scale": a["x_scale"][:, :1]}, "q"),  # K = 40
        (lambda a: {**a, "q": a["q"].to(torch.int8)}, "q"),
        (lambda a: {**a, "w": a["w"][:, :64]}, "w"),
        (lambda a: {**a, "w": a["w"].float()}, "w"),
        (lambda a: {**a, "w_scale": a["w_scale"][:, :4]}, "w_scale"),
        (lambda a: {**a, "w_scale": a["w_scale"][:8]}, "w_scale"),
        (lambda a: {**a, "x_scale": a["x_scale"][:, :4]}, "x_scale"),
        (lambda a: {**a, "out_dtype": torch.uint8}, "out_dtype"),
    ],
)
def test_bad_inputs_name_the_argument(change, name):
    args = change(_good())
    with pytest.raises(ValueError, match=rf"^{name}:"):
        gemm_mxfp4(args["q"], args["x_scale"], args["w"], args["w_scale"], args["out_dtype"])


def test_prequant_and_preshuffle_bad_inputs():
    a = _good()
    x = _activations(4, 256)
    with pytest.raises(ValueError, match=r"^x: K must be a multiple of 32"):
        gemm_a16wfp4(x[:, :48], a["w"], a["w_scale"])
    with pytest.raises(ValueError, match=r"^rounding:"):
        gemm_a16wfp4(x, a["w"], a["w_scale"], rounding="up")
    with pytest.raises(ValueError, match=r"^w:"):
        gemm_a16wfp4(x, a["w"][:, :64], a["w_scale"])
    with pytest.raises(ValueError, match=r"^use_dot_scaled:"):
        gemm_mxfp4(a["q"], a["x_scale"], a["w"], a["w_scale"], use_dot_scaled=True)
    with pytest.raises(ValueError, match=r"^n:"):
        gemm_mxfp4(a["q"], a["x_scale"], a["w"], a["w_scale"], preshuffled=True)
    with pytest.raises(ValueError, match=r"^w:"):
        gemm_mxfp4(a["q"], a["x_scale"], a["w"], a["w_scale"], preshuffled=True, n=32)
    with pytest.raises(ValueError, match=r"^w_scale:"):
        w_sh = preshuffle_weight_fp4(a["w"])
        gemm_mxfp4(a["q"], a["x_scale"], w_sh, a["w_scale"], preshuffled=True, n=32)
    with pytest.raises(ValueError, match=r"^config: BLOCK_K must be >= 64"):
        gemm_mxfp4(a["q"], a["x_scale"], a["w"], a["w_scale"], config={"BLOCK_K": 32})


@pytest.mark.parametrize("target", ["sm90", "gfx950", "gfx942"])
def test_table_loads(target):
    spec = launch_tables.load_table("gemm_mxfp4")["targets"][target]
    assert spec["entries"][-1]["when"] == {}
    for entry in spec["entries"]:
        assert entry["config"]["BLOCK_K"] >= 64


# --- GPU ----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("m", [1, 32, 1024])
@pytest.mark.parametrize("use_dot_scaled", [False, True])
def test_gpu_deepseek_shape(m, use_dot_scaled):
    n, k = 2112, 7168
    q, x_scale = _mx(m, k, 18)
    w, w_scale = _mx(n, k, 19)
    out = gemm_mxfp4(
        q.cuda(), x_scale.cuda(), w.cuda(), w_scale.cuda(), use_dot_scaled=use_dot_scaled
    )
    _check(out.cpu(), q, x_scale, w, w_scale)
    x = _activations(m, k, seed=20).cuda()
    pre, pre_q, pre_scale = gemm_a16wfp4(
        x, w.cuda(), w_scale.cuda(), return_quant=True, use_dot_scaled=use_dot_scaled
    )
    ref_q, ref_scale = quant_mxfp4_ref(x.cpu())
    assert torch.equal(pre_q.cpu(), ref_q) and torch.equal(pre_scale.cpu(), ref_scale)
    ref = gemm_mxfp4_ref(ref_q, ref_scale, w, w_scale, torch.float64, torch.float64)
    assert _rel(pre.cpu(), ref) <= 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("m", [1, 16, 64])
@pytest.mark.parametrize("swap,bn,warps", [(0, 64, 4), (1, 64, 4), (1, 128, 4), (0, 32, 8)])
@pytest.mark.parametrize("table_operands", [False, True])
def test_gpu_decode_and_swap_configs(m, swap, bn, warps, table_operands, monkeypatch):
    """The inline-PTX decodes (2-byte calls for AFP4WFP4, 4-byte for A16WFP4, on where each
    thread holds that many bytes of a tile; the 4-byte one with its tables written in and as
    operands) and swapped tiles, at a DeepSeek shape."""
    from fxfuse.kernels import gemm_mxfp4 as mod

    monkeypatch.setattr(mod, "PTX_TABLE_OPERANDS", table_operands)

    n, k = 2112, 7168
    config = {
        "BLOCK_M": 16,
        "BLOCK_N": bn,
        "BLOCK_K": 256,
        "GROUP_M": 1,
        "SPLIT_K": 4,
        "num_warps": warps,
        "num_stages": 3,
        "SWAP_AB": swap,
    }
    q, x_scale = _mx(m, k, 21)
    w, w_scale = _mx(n, k, 22)
    wc, wsc = w.cuda(), w_scale.cuda()
    out = gemm_mxfp4(
        q.cuda(), x_scale.cuda(), wc, wsc, torch.float32, config=config, use_dot_scaled=False
    )
    ref = gemm_mxfp4_ref(q, x_scale, w, w_scale, torch.float64, torch.float64)
    assert _rel(out.cpu(), ref) <= 1e-5
    x = _activations(m, k, seed=23).cuda()
    pre = gemm_a16wfp4(x, wc, wsc, out_dtype=torch.float32, config=config, use_dot_scaled=False)
    ref_pre = gemm_a16wfp4_ref(x.cpu(), w, w_scale, "even", torch.float64, torch.float64)
    assert _rel(pre.cpu(), ref_pre) <= 1e-5
    cfg = mod.launch_config(mod.KERNEL_NAME, "sm90", m, n, k, config)
    for a_bf16, pack in ((True, 4), (False, 2)):
        rows = bn if a_bf16 else min(16, bn)
        expect = pack if rows * 128 >= pack * 32 * warps else 0
        assert mod._decode_ptx(x.device, False, a_bf16, cfg) == expect
