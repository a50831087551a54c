"""The fused [residual add →] RMSNorm → quant kernel against its torch reference (SPEC §5).

What is asserted for every case:
- h (the residual sum) equals the reference bit for bit;
- y (the normed output) is within 1 ulp of the reference everywhere (the sum order of mean(h²)
  differs, which can move inv by an fp32 ulp across a rounding boundary);
- q and scale equal the reference quant applied to the kernel's own y, bit for bit, every row;
- on rows where y equals the reference, q and scale equal the full reference too.
`test_full_reference_agreement_rate` measures how often rows differ from the full reference.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from fxfuse.kernels import formats
from fxfuse.kernels.rms_norm_quant import _div_by_scale, _fp8_bits, rms_norm, rms_norm_quant
from fxfuse.kernels.rms_norm_quant_ref import (
    quant_fp8_ref,
    quant_mxfp4_ref,
    rms_norm_quant_ref,
    rms_norm_ref,
)
from fxfuse.runtime.target import interpreting

EPS = 1e-6
# bf16 / fp16 outputs hide inv's fp32 sum-order error except at a rounding boundary (1 ulp);
# fp32 outputs show it directly (a few fp32 ulps of inv).
MAX_ULPS = {torch.bfloat16: 1, torch.float16: 1, torch.float32: 16}
QUANTS = [
    pytest.param({"quant": "fp8"}, id="fp8-row"),
    pytest.param({"quant": "fp8", "group_size": 128}, id="fp8-g128"),
    pytest.param({"quant": "fp8", "group_size": 64}, id="fp8-g64"),
    pytest.param({"quant": "mxfp4", "rounding": "even"}, id="mxfp4-even"),
    pytest.param({"quant": "mxfp4", "rounding": "floor"}, id="mxfp4-floor"),
    pytest.param({"quant": "mxfp4", "rounding": "ceil"}, id="mxfp4-ceil"),
]
NORM_KEYS = ("weight_offset", "round_before_weight", "norm_dtype")
QUANT_KEYS = (
    "group_size",
    "fp8_dtype",
    "quant_eps",
    "eps_on_scale",
    "apply_reciprocal",
    "scale_col_major",
)


def _inputs(m, n, dtype=torch.bfloat16, residual=True, seed=0, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    # Log-normal magnitudes give rows with outliers, so amax and e8m0 exponents vary.
    x = torch.randn(m, n, generator=g) * torch.exp(spread * torch.randn(m, n, generator=g))
    r = torch.randn(m, n, generator=g) if residual else None
    w = 1.0 + 0.5 * torch.randn(n, generator=g)
    return x.to(dtype), (None if r is None else r.to(dtype)), w.to(dtype)


def _ordered(t):
    """Float bits mapped to integers whose difference counts ulps (±0 coincide)."""
    if t.dtype == torch.float32:
        i = t.view(torch.int32).to(torch.int64)
        return torch.where(i < 0, -(i & 0x7FFFFFFF), i)
    i = t.view(torch.int16).to(torch.int64)
    return torch.where(i < 0, -(i & 0x7FFF), i)


def _quant_of(y, quant="fp8", rounding="even", **kw):
    if quant == "mxfp4":
        return quant_mxfp4_ref(y, rounding)
    return quant_fp8_ref(
        y,
        kw.get("group_size", 0),
        kw.get("fp8_dtype", torch.float8_e4m3fn),
        kw.get("quant_eps", 1e-10),
        kw.get("eps_on_scale", False),
        kw.get("apply_reciprocal", False),
        kw.get("scale_col_major", False),
    )


def _bits(t):
    """An integer view for exact comparison (±0 distinct, NaN equal to itself)."""
    t = t.contiguous()
    if t.dtype in formats.FP8_DTYPES:
        return t.view(torch.uint8)
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    return t.view(ints[t.dtype]) if t.dtype in ints else t


def _row_equal(a, b):
    return (_bits(a) == _bits(b)).all(-1)


def check(x, w, residual=None, eps=EPS, config=None, **kw):
    """Run kernel and reference and assert the contract.

    Returns (rows whose y differs from the reference, rows whose q / scale differ)."""
    q, scale, h, y = rms_norm_quant(x, w, eps, residual, write_norm=True, config=config, **kw)
    ref_q, ref_scale, ref_h = rms_norm_quant_ref(x, w, eps, residual, **kw)
    norm_kw = {k: kw[k] for k in NORM_KEYS if k in kw}
    ref_y, _ = rms_norm_ref(
        x,
        w,
        eps,
        residual,
        norm_kw.get("weight_offset", 0.0),
        norm_kw.get("round_before_weight", True),
        norm_kw.get("norm_dtype"),
    )
    if residual is None:
        assert h is x
    else:
        assert torch.equal(_bits(h), _bits(ref_h))
    assert y.dtype == ref_y.dtype and y.shape == ref_y.shape
    ulps = (_ordered(y) - _ordered(ref_y)).abs()
    assert ulps.max().item() <= MAX_ULPS[y.dtype], f"y differs by {ulps.max().item()} ulp"
    # Quant on the kernel's own y: bit for bit, every row.
    quant_kw = {k: kw[k] for k in QUANT_KEYS if k in kw}
    own_q, own_scale = _quant_of(y, kw.get("quant", "fp8"), kw.get("rounding", "even"), **quant_kw)
    assert q.dtype == ref_q.dtype and q.shape == ref_q.shape
    assert scale.dtype == ref_scale.dtype and scale.shape == ref_scale.shape
    assert scale.stride() == ref_scale.stride()
    assert torch.equal(_bits(q), _bits(own_q))
    assert torch.equal(_bits(scale), _bits(own_scale))
    y_rows = (ulps == 0).all(-1)
    q_rows = _row_equal(q, ref_q) & _row_equal(scale, ref_scale)
    assert bool(q_rows[y_rows].all()), "rows with identical y must quantize identically"
    return int((~y_rows).sum()), int((~q_rows).sum())


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_residual", [True, False])
def test_matches_reference(quant, dtype, with_residual):
    x, r, w = _inputs(5, 256, dtype, with_residual, seed=1)
    check(x, w, r, **quant)


@pytest.mark.parametrize("quant", QUANTS[:2] + QUANTS[3:4])
@pytest.mark.parametrize("round_before_weight", [True, False])
@pytest.mark.parametrize("weight_offset", [0.0, 1.0])
def test_gemma_offset_and_rounding_point(quant, round_before_weight, weight_offset):
    x, r, w = _inputs(3, 256, seed=2)
    if weight_offset:
        w = (0.1 * w.float()).to(w.dtype)  # Gemma stores w - 1
    check(x, w, r, weight_offset=weight_offset, round_before_weight=round_before_weight, **quant)


def test_negative_zero_weight_keeps_sign_without_offset():
    x, r, w = _inputs(2, 128, seed=3)
    w[::3] = -0.0
    check(x, w, r, quant="fp8", group_size=64)


@pytest.mark.parametrize("norm_dtype", [torch.float32, torch.bfloat16])
def test_norm_dtype_differs_from_input(norm_dtype):
    x, r, w = _inputs(3, 256, torch.float16, seed=4)
    check(x, w, r, norm_dtype=norm_dtype, quant="fp8", group_size=128)
    check(x, w.float(), r, norm_dtype=norm_dtype, quant="mxfp4")


def test_fp32_input():
    x, r, w = _inputs(3, 256, torch.float32, seed=5)
    check(x, w, r, quant="fp8")
    check(x, w, r, quant="mxfp4", rounding="ceil")


@pytest.mark.parametrize("group_size", [0, 128])
@pytest.mark.parametrize("col_major", [False, True])
def test_scale_layouts(group_size, col_major):
    x, r, w = _inputs(6, 512, seed=6)
    check(x, w, r, quant="fp8", group_size=group_size, scale_col_major=col_major)
    _, scale, _, _ = rms_norm_quant(x, w, EPS, r, group_size=group_size, scale_col_major=col_major)
    if col_major and group_size:
        assert scale.stride() == (1, 6)  # a (N/g, M) buffer viewed transposed


@pytest.mark.parametrize("group_size", [0, 128])
def test_e4m3fnuz(group_size):
    x, r, w = _inputs(4, 256, seed=7)
    check(x, w, r, quant="fp8", group_size=group_size, fp8_dtype=torch.float8_e4m3fnuz)


@pytest.mark.parametrize(
    "variant",
    [
        {"eps_on_scale": True},
        {"apply_reciprocal": True},
        {"quant_eps": 1e-12, "apply_reciprocal": True, "eps_on_scale": True},
    ],
    ids=["eps-on-scale", "reciprocal", "eps1e-12-both"],
)
@pytest.mark.parametrize("group_size", [0, 128])
def test_scale_spellings(variant, group_size):
    x, _, w = _inputs(4, 256, seed=8)
    x[1] = 0  # an all-zero row makes the eps clamp decide the scale
    check(x, w, None, quant="fp8", group_size=group_size, **variant)


@pytest.mark.parametrize("quant", QUANTS)
def test_zero_rows_and_groups(quant):
    x, r, w = _inputs(4, 256, seed=9)
    r[0] = -x[0]  # h = x + r is exactly zero: inv = 1/sqrt(eps), y = 0
    x[2, :128] = 0
    r[2, :128] = 0  # a zero group beside a live one
    check(x, w, r, **quant)
    check(torch.zeros_like(x), w, None, **quant)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("quant", QUANTS)
def test_huge_and_tiny_values(quant):
    x, _, w = _inputs(4, 256, torch.float32, residual=False, seed=10, spread=3.0)
    x[0] *= 1e30  # h² overflows fp32: inv = 0, y = 0 (as in the reference)
    x[1] *= 1e15  # large but finite squares
    x[2] *= 1e-20
    check(x, w, None, **quant)
    xb, _, wb = _inputs(4, 256, seed=11)
    check(xb, wb * 1e4, None, **quant)  # large normed outputs: large scales / exponents
    check(xb, (wb.float() * 1e-38).to(torch.bfloat16), None, **quant)  # subnormal y, e = -127


@pytest.mark.parametrize("rows_per_program", [1, 2, 4])
@pytest.mark.parametrize("quant", [QUANTS[0], QUANTS[1], QUANTS[3]])
def test_odd_m_and_rows_per_program(rows_per_program, quant):
    x, r, w = _inputs(7, 128, seed=12)
    check(x, w, r, config={"ROWS_PER_PROGRAM": rows_per_program}, **quant)


def test_m_is_one_and_zero():
    x, r, w = _inputs(1, 256, seed=13)
    check(x, w, r, quant="fp8", group_size=128)
    q, scale, h, y = rms_norm_quant(x[:0], w, EPS, r[:0], quant="mxfp4", write_norm=True)
    assert q.shape == (0, 128) and scale.shape == (0, 8) and h.shape == (0, 256)
    assert y.shape == (0, 256)


@pytest.mark.parametrize("quant", [QUANTS[0], QUANTS[1], QUANTS[4]])
def test_row_stride_larger_than_n(quant):
    x, r, w = _inputs(4, 320, seed=14)
    xs, rs = x[:, :256], r[:, 64:]  # row stride 320, and an offset start for the residual
    assert xs.stride(0) == 320 and not xs.is_contiguous()
    check(xs, w[:256].contiguous(), rs, **quant)


def test_transposed_input():
    x, r, w = _inputs(128, 4, seed=15)
    check(x.t(), w.new_ones(128), r.t().contiguous(), quant="fp8", group_size=64)


@pytest.mark.parametrize("quant", QUANTS[:1] + QUANTS[1:2] + QUANTS[3:4])
@pytest.mark.parametrize("block", [64, 128])
def test_looped_wide_row_variant(quant, block):
    # BLOCK_N_MAX below the row width forces the multi-pass loop (the path for N > 8192).
    x, r, w = _inputs(3, 384, seed=16)
    check(x, w, r, config={"BLOCK_N_MAX": block, "ROWS_PER_PROGRAM": 2}, **quant)
    check(x, w, None, config={"BLOCK_N_MAX": block}, **quant)


@pytest.mark.parametrize("config", [None, {"BLOCK_N_MAX": 64}])
def test_group_size_not_a_power_of_two(config):
    # 48-column groups sit in 64-wide chunks; 1536 = 12 groups of 128 pads to 16 chunks.
    x, r, w = _inputs(3, 384, seed=17)
    check(x, w, r, quant="fp8", group_size=48, config=config)
    check(x, w, r, quant="fp8", group_size=96, config=config)
    x, r, w = _inputs(2, 1536, seed=18)
    check(x, w, r, quant="fp8", group_size=128, config=config)


@pytest.mark.parametrize("quant", [QUANTS[0], QUANTS[1], QUANTS[3]])
def test_deepseek_hidden_row(quant):
    x, r, w = _inputs(2, 7168, seed=19)
    check(x, w, r, **quant)


@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("config", [None, {"BLOCK_N_MAX": 64}])
def test_rms_norm_only(with_residual, config):
    x, r, w = _inputs(5, 256, seed=20, residual=with_residual)
    for kw in (
        {},
        {"weight_offset": 1.0, "round_before_weight": False},
        {"norm_dtype": torch.float32},
    ):
        y, h = rms_norm(x, w, EPS, r, config=config, **kw)
        ref_y, ref_h = rms_norm_ref(
            x,
            w,
            EPS,
            r,
            kw.get("weight_offset", 0.0),
            kw.get("round_before_weight", True),
            kw.get("norm_dtype"),
        )
        assert h is x if r is None else torch.equal(_bits(h), _bits(ref_h))
        assert y.dtype == ref_y.dtype
        assert (_ordered(y) - _ordered(ref_y)).abs().max().item() <= MAX_ULPS[y.dtype]


def test_full_reference_agreement_rate(capsys):
    """How often the kernel's rows differ from the full reference (the 1-ulp sum-order effect)."""
    m, n = 64, 1024
    x, r, w = _inputs(m, n, seed=21)
    lines = []
    for quant in ({"quant": "fp8"}, {"quant": "fp8", "group_size": 128}, {"quant": "mxfp4"}):
        y_rows, q_rows = check(x, w, r, config={"ROWS_PER_PROGRAM": 8}, **quant)
        assert q_rows <= 0.01 * m, f"{quant}: q differs from the reference on {q_rows}/{m} rows"
        lines.append(f"{quant}: y rows off by 1 ulp {y_rows}/{m}, q rows differing {q_rows}/{m}")
    with capsys.disabled():
        print("\n" + "\n".join(lines))


@pytest.mark.parametrize(
    "args, kwargs, name",
    [
        ((torch.ones(2, 64), torch.ones(32), EPS), {}, "weight"),
        ((torch.ones(2, 64), torch.ones(64, 1), EPS), {}, "weight"),
        ((torch.ones(64), torch.ones(64), EPS), {}, "x"),
        ((torch.ones(2, 64, dtype=torch.int32), torch.ones(64), EPS), {}, "x"),
        ((torch.ones(2, 48), torch.ones(48), EPS), {"quant": "mxfp4"}, "x"),
        ((torch.ones(2, 192), torch.ones(192), EPS), {"group_size": 128}, "group_size"),
        ((torch.ones(2, 64), torch.ones(64), EPS), {"group_size": -1}, "group_size"),
        ((torch.ones(2, 64), torch.ones(64), EPS), {"quant": "int8"}, "quant"),
        (
            (torch.ones(2, 64), torch.ones(64), EPS),
            {"quant": "mxfp4", "rounding": "up"},
            "rounding",
        ),
        ((torch.ones(2, 64), torch.ones(64), EPS), {"fp8_dtype": torch.float8_e5m2}, "fp8_dtype"),
        ((torch.ones(2, 64), torch.ones(64), EPS), {"norm_dtype": torch.int8}, "norm_dtype"),
        ((torch.ones(2, 64), torch.ones(64), EPS, torch.ones(2, 32)), {}, "residual"),
        (
            (torch.ones(2, 64), torch.ones(64), EPS, torch.ones(2, 64, dtype=torch.float16)),
            {},
            "residual",
        ),
        ((torch.ones(2, 64), torch.ones(64), EPS), {"config": {"BLOCK_M": 4}}, "config"),
        ((torch.ones(2, 64), torch.ones(64), EPS), {"config": {"num_warps": 3}}, "config"),
        ((torch.ones(2, 64), torch.ones(64), EPS), {"config": {"BLOCK_N_MAX": 100}}, "config"),
        ((torch.ones(2, 64), torch.ones(64), EPS), {"target": "sm80"}, "target"),
    ],
)
def test_bad_inputs_name_the_argument(args, kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        rms_norm_quant(*args, **kwargs)


def test_rms_norm_bad_inputs():
    with pytest.raises(ValueError, match=r"^weight\b"):
        rms_norm(torch.ones(2, 64), torch.ones(63), EPS)
    with pytest.raises(ValueError, match=r"^residual\b"):
        rms_norm(torch.ones(2, 64), torch.ones(64), EPS, torch.ones(3, 64))


_no_compiled_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or interpreting(), reason="needs a GPU, TRITON_INTERPRET=0"
)


def needs_compiled_gpu(test):
    """Marked `gpu` (so `pytest -m gpu` selects it) and skipped without a compiled GPU."""
    return pytest.mark.gpu(_no_compiled_gpu(test))


@needs_compiled_gpu
@pytest.mark.parametrize("n", [1536, 7168])
@pytest.mark.parametrize("quant", [QUANTS[0], QUANTS[1], QUANTS[3], QUANTS[5]])
def test_gpu_matches_cpu_reference(n, quant):
    # Compiled path (hardware converts): quant bytes on the kernel's y equal the CPU reference.
    x, r, w = _inputs(256, n, seed=22)
    q, scale, h, y = rms_norm_quant(x.cuda(), w.cuda(), EPS, r.cuda(), write_norm=True, **quant)
    ref_y, ref_h = rms_norm_ref(x, w, EPS, r)
    assert torch.equal(_bits(h.cpu()), _bits(ref_h))
    assert (_ordered(y.cpu()) - _ordered(ref_y)).abs().max().item() <= 1
    # Quant bytes equal the torch spelling run on the GPU over the kernel's own y (device
    # semantics: CUDA divides by a constant as a multiply by its fp32 reciprocal).
    own_q, own_scale = _quant_of(
        y,
        quant["quant"],
        quant.get("rounding", "even"),
        group_size=quant.get("group_size", 0),
    )
    assert torch.equal(_bits(q.cpu()), _bits(own_q.cpu()))
    assert torch.equal(_bits(scale.cpu()), _bits(own_scale.cpu()))


@needs_compiled_gpu
@pytest.mark.parametrize("config", [None, {"ROWS_PER_PROGRAM": 4}, {"BLOCK_N_MAX": 256}])
@pytest.mark.parametrize("quant", QUANTS)
def test_gpu_full_contract_small_rows(quant, config):
    # The CPU tests' contract on the compiled path: odd M, multi-row programs (with the next
    # row's prefetch) and the looped wide-row variant.
    x, r, w = _inputs(63, 1024, seed=23)
    x, r, w = x.cuda(), r.cuda(), w.cuda()
    q, scale, h, y = rms_norm_quant(x, w, EPS, r, write_norm=True, config=config, **quant)
    ref_y, ref_h = rms_norm_ref(x.cpu(), w.cpu(), EPS, r.cpu())
    assert torch.equal(_bits(h.cpu()), _bits(ref_h))
    assert (_ordered(y.cpu()) - _ordered(ref_y)).abs().max().item() <= 1
    quant_kw = {k: quant[k] for k in QUANT_KEYS if k in quant}
    own_q, own_scale = _quant_of(y, quant["quant"], quant.get("rounding", "even"), **quant_kw)
    assert torch.equal(_bits(q.cpu()), _bits(own_q.cpu()))
    assert torch.equal(_bits(scale.cpu()), _bits(own_scale.cpu()))


@needs_compiled_gpu
@pytest.mark.parametrize("quant", [QUANTS[0], QUANTS[3], QUANTS[5]])
def test_gpu_subnormal_outputs(quant):
    # Subnormal normed outputs (tiny weights): exact unless the compiled code flushes denormals.
    x, _, w = _inputs(8, 512, seed=24, residual=False)
    w = (w.float() * 1e-38).to(torch.bfloat16)
    q, scale, _, y = rms_norm_quant(x.cuda(), w.cuda(), EPS, write_norm=True, **quant)
    ref_y, _ = rms_norm_ref(x, w, EPS)
    assert (_ordered(y.cpu()) - _ordered(ref_y)).abs().max().item() <= 1
    own_q, own_scale = _quant_of(y, quant["quant"], quant.get("rounding", "even"))
    assert torch.equal(_bits(q.cpu()), _bits(own_q.cpu()))
    assert torch.equal(_bits(scale.cpu()), _bits(own_scale.cpu()))


@triton.jit
def _division_probe(
    y_ptr, scale_ptr, quotient_ptr, byte_ptr, ref_ptr, ref_byte_ptr, n, BLOCK: tl.constexpr
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(y_ptr + offs, mask=mask, other=1.0)
    scale = tl.load(scale_ptr + offs, mask=mask, other=1.0)
    quotient = _div_by_scale(y, scale, tl.math.div_rn(1.0, scale))
    ref = tl.math.div_rn(y, scale)
    tl.store(quotient_ptr + offs, quotient, mask=mask)
    tl.store(ref_ptr + offs, ref, mask=mask)
    tl.store(byte_ptr + offs, _fp8_bits(quotient, False, True), mask=mask)
    clamped = tl.minimum(tl.maximum(ref, -448.0), 448.0)
    tl.store(ref_byte_ptr + offs, _fp8_bits(clamped, False, False), mask=mask)


@needs_compiled_gpu
@pytest.mark.parametrize("y_kind", ["bf16", "fp32"])
def test_gpu_division_by_scale_is_correctly_rounded(y_kind):
    # The kernel divides by a row / group scale with a reciprocal and one FMA remainder step:
    # it must equal div.rn on the kernel's domain (scale >= |y| / 448, scale normal).
    n = 1 << 24
    g = torch.Generator(device="cuda").manual_seed(25)
    if y_kind == "bf16":
        bits = torch.randint(-(1 << 15), 1 << 15, (n,), device="cuda", generator=g)
        y = bits.to(torch.int16).view(torch.bfloat16).float()
    else:
        bits = torch.randint(-(1 << 31), 1 << 31, (n,), device="cuda", generator=g)
        y = bits.to(torch.int32).view(torch.float32)
    y = torch.where(torch.isfinite(y), y, 1.0)
    # scale = |y| / 448 times a log-uniform factor in [1, 2^40], kept normal.
    factor = torch.exp2(40 * torch.rand(n, device="cuda", generator=g))
    scale = (y.abs() * factor / 448.0).clamp(min=2.0**-43, max=2.0**119)
    outs = [torch.empty_like(y), torch.empty(n, dtype=torch.uint8, device="cuda")]
    refs = [torch.empty_like(y), torch.empty(n, dtype=torch.uint8, device="cuda")]
    _division_probe[(triton.cdiv(n, 1024),)](
        y, scale, outs[0], outs[1], refs[0], refs[1], n, BLOCK=1024
    )
    normal = refs[0].abs() >= 2.0**-126
    assert torch.equal(outs[0][normal].view(torch.int32), refs[0][normal].view(torch.int32))
    assert torch.equal(outs[1], refs[1])  # e4m3 bytes everywhere, underflowing quotients too
