"""The quant-only mode of the norm-quant kernel (`rms_norm_quant.quant`, HAS_NORM off) and the
canonical quant ops it backs (`fxfuse.quant_fp8`, `fxfuse.quant_mxfp4`), against the torch
references (SPEC §5: q bytes and scale bytes equal, bit for bit, on every row).

Without a norm there is no sum-order effect: every case must equal `quant_fp8_ref` /
`quant_mxfp4_ref` of the same x exactly, adversarial rows included (zeros, -0.0, a huge value,
e4m3 / e2m1 rounding ties, subnormals, ±inf). NaN inputs are not in the contract (the kernel's
amax reductions drop NaN; torch's propagate it).
"""

from __future__ import annotations

import math

import pytest
import torch

import fxfuse.runtime.norm_quant_ops  # noqa: F401  (registers torch.ops.fxfuse.*)
from fxfuse.kernels import rms_norm_quant as kernels
from fxfuse.kernels.rms_norm_quant import quant
from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref, quant_mxfp4_ref
from fxfuse.runtime.target import interpreting
from tests.helpers import bytes_equal

FN, FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
QUANTS = [
    pytest.param({"quant": "fp8"}, id="fp8-row"),
    pytest.param({"quant": "fp8", "group_size": 128}, id="fp8-g128"),
    pytest.param({"quant": "fp8", "group_size": 128, "scale_col_major": True}, id="fp8-g128-col"),
    pytest.param({"quant": "fp8", "group_size": 64}, id="fp8-g64"),
    pytest.param({"quant": "mxfp4", "rounding": "even"}, id="mxfp4-even"),
    pytest.param({"quant": "mxfp4", "rounding": "floor"}, id="mxfp4-floor"),
    pytest.param({"quant": "mxfp4", "rounding": "ceil"}, id="mxfp4-ceil"),
]
# numpy warns on the reference's own inf / inf and 0 / 0 under the interpreter.
quiet_fp_warnings = pytest.mark.filterwarnings(
    "ignore:invalid value encountered:RuntimeWarning",
    "ignore:divide by zero encountered:RuntimeWarning",
    "ignore:overflow encountered:RuntimeWarning",
)


def _inputs(m, n, dtype=torch.bfloat16, seed=0, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    # Log-normal magnitudes give rows with outliers, so amax and e8m0 exponents vary.
    x = torch.randn(m, n, generator=g) * torch.exp(spread * torch.randn(m, n, generator=g))
    return x.to(dtype)


def _reference(x, quant="fp8", rounding="even", **kw):
    if quant == "mxfp4":
        return quant_mxfp4_ref(x, rounding)
    return quant_fp8_ref(
        x,
        kw.get("group_size", 0),
        kw.get("fp8_dtype", FN),
        kw.get("quant_eps", 1e-10),
        kw.get("eps_on_scale", False),
        kw.get("apply_reciprocal", False),
        kw.get("scale_col_major", False),
    )


def _layout(t):
    """Strides of the dims that have them (a size-1 dim's stride is arbitrary in torch)."""
    return tuple(stride for stride, size in zip(t.stride(), t.shape) if size > 1)


def _scales_equal(a, b):
    # flatten: bytes_equal's .contiguous() keeps an (M, 1) scale with strides (1, M) as it is,
    # and viewing that as bytes fails.
    return a.shape == b.shape and bytes_equal(a.flatten(), b.flatten())


def check(x, config=None, **kw):
    """Kernel and reference on the same x: q and scale equal bit for bit, same strides."""
    q, scale = quant(x, config=config, **kw)
    ref_q, ref_scale = _reference(x, **kw)
    assert q.shape == ref_q.shape and scale.shape == ref_scale.shape
    assert _layout(scale) == _layout(ref_scale)
    bad_rows = (q.view(torch.uint8) != ref_q.view(torch.uint8)).any(-1).nonzero().flatten()
    assert bytes_equal(q, ref_q), f"q differs on rows {bad_rows.tolist()}"
    assert _scales_equal(scale, ref_scale)


def _e4m3_ties(fp8_dtype=FN):
    """Every finite positive e4m3 value and every midpoint between neighbours (normal and
    subnormal): exact ties for round-to-nearest-even once the scale is 1."""
    values = torch.arange(1, 127 if fp8_dtype == FN else 128, dtype=torch.uint8)
    values = values.view(fp8_dtype).float().sort().values
    return torch.cat([values, (values[1:] + values[:-1]) / 2])


def _adversarial_rows(n, dtype, fp8_dtype=FN):
    """Rows whose bytes are easy to get wrong; n a multiple of 128."""
    finfo = torch.finfo(dtype)
    fp8_max = torch.finfo(fp8_dtype).max
    rows = torch.randn(12, n).to(dtype).float()
    rows[0] = 0.0
    rows[1] = -0.0
    rows[2, 17] = finfo.max  # one huge value: the rest quantizes to (signed) zero
    rows[3] = torch.where(torch.arange(n) % 2 == 0, finfo.max, -finfo.max)
    # e4m3 ties after the scale (amax = FP8_MAX: scale 1 on CPU), random signs, both groups.
    ties = _e4m3_ties(fp8_dtype)
    signs = torch.where(torch.rand(n) < 0.5, -1.0, 1.0)
    rows[4] = signs * ties[torch.randint(0, len(ties), (n,))]
    rows[4, ::128] = fp8_max
    # One representable step either side of each tie.
    above = rows[4].to(dtype)
    rows[5] = torch.nextafter(above, torch.full_like(above, torch.inf)).float()
    rows[6] = torch.nextafter(above, torch.zeros_like(above)).float()
    rows[5, ::128] = rows[6, ::128] = fp8_max
    # e2m1 ties at every e8m0 exponent the three roundings pick differently: block amaxes at
    # powers of two, 6 · 2^k (ceil's exact quotient) and 1.75 · 2^k (even's mantissa carry).
    e2m1_ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.5, 1.0, 3.0, 4.0])
    blocks = n // 32
    block_amax = torch.tensor([1.0, 6.0, 1.75, 1.5, 7.0, 0.75, 12.0, 3.5])[
        torch.arange(blocks) % 8
    ] * torch.exp2(torch.arange(blocks) % 5 - 2.0)
    elems = e2m1_ties[torch.randint(0, len(e2m1_ties), (blocks, 32))]
    elems = elems * torch.exp2(torch.floor(torch.log2(block_amax)) - 2)[:, None]
    elems[:, 0] = block_amax
    rows[7] = (signs.reshape(blocks, 32) * elems).flatten()
    rows[8] = torch.randn(n) * finfo.tiny * 0.5  # subnormal inputs: amax below the eps clamp
    rows[8, ::3] = finfo.tiny * finfo.eps  # the smallest subnormal
    rows[9, 5] = torch.inf
    rows[10, 200 % n] = -torch.inf
    rows[11, 3] = torch.inf
    rows[11, 4] = -torch.inf
    return rows.to(dtype)


# --- the kernel ---------------------------------------------------------------------------------


@pytest.mark.parametrize("quant_kw", QUANTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_reference(quant_kw, dtype):
    check(_inputs(5, 256, dtype, seed=1), **quant_kw)


@quiet_fp_warnings
@pytest.mark.parametrize("quant_kw", QUANTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_adversarial_rows(quant_kw, dtype):
    check(_adversarial_rows(256, dtype), **quant_kw)


@quiet_fp_warnings
@pytest.mark.parametrize("group_size", [0, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_e4m3fnuz(group_size, dtype):
    x = torch.cat([_inputs(3, 256, dtype, seed=2), _adversarial_rows(256, dtype, FNUZ)])
    check(x, quant="fp8", group_size=group_size, fp8_dtype=FNUZ)


@quiet_fp_warnings
@pytest.mark.parametrize(
    "variant",
    [
        {"eps_on_scale": True},
        {"apply_reciprocal": True},
        {"quant_eps": 1e-12, "apply_reciprocal": True, "eps_on_scale": True},
        {"quant_eps": 0.0},  # an all-zero row: 0 / 0, NaN bytes as torch gives them
    ],
    ids=["eps-on-scale", "reciprocal", "eps1e-12-both", "eps0"],
)
@pytest.mark.parametrize("group_size", [0, 128])
def test_scale_spellings(variant, group_size):
    x = torch.cat([_inputs(3, 256, seed=3), _adversarial_rows(256, torch.bfloat16)])
    check(x, quant="fp8", group_size=group_size, **variant)


@pytest.mark.parametrize("rows_per_program", [1, 2, 4])
@pytest.mark.parametrize("quant_kw", [QUANTS[0], QUANTS[2], QUANTS[4]])
def test_odd_m_and_rows_per_program(rows_per_program, quant_kw):
    check(_inputs(7, 128, seed=4), config={"ROWS_PER_PROGRAM": rows_per_program}, **quant_kw)


@quiet_fp_warnings
@pytest.mark.parametrize("quant_kw", [QUANTS[0], QUANTS[2], QUANTS[4], QUANTS[6]])
@pytest.mark.parametrize("block", [64, 128])
def test_looped_wide_row_variant(quant_kw, block):
    # BLOCK_N_MAX below the row width forces the chunked kernel's multi-pass loop (N > 8192).
    x = torch.cat([_inputs(3, 384, seed=5), _adversarial_rows(384, torch.bfloat16)])
    check(x, config={"BLOCK_N_MAX": block, "ROWS_PER_PROGRAM": 2}, **quant_kw)


@pytest.mark.parametrize("config", [None, {"BLOCK_N_MAX": 64}])
def test_group_size_not_a_power_of_two(config):
    check(_inputs(3, 384, seed=6), quant="fp8", group_size=48, config=config)
    check(_inputs(3, 384, seed=6), quant="fp8", group_size=96, config=config)


@pytest.mark.parametrize("quant_kw", [QUANTS[0], QUANTS[1], QUANTS[4]])
def test_deepseek_rows(quant_kw):
    # 7168 fits one register tile; 18432 (the MLP width) takes the looped chunked kernel.
    check(_inputs(2, 7168, seed=7), **quant_kw)
    check(_inputs(1, 18432, seed=8), **quant_kw)


@pytest.mark.parametrize("quant_kw", [QUANTS[0], QUANTS[2], QUANTS[5]])
def test_strided_rows(quant_kw):
    x = _inputs(4, 320, seed=9)[:, 64:]  # row stride 320, offset start
    assert x.stride(0) == 320 and not x.is_contiguous()
    check(x, **quant_kw)
    check(_inputs(256, 5, seed=10).t(), **quant_kw)  # column-major rows: stride_xn = 5


def test_m_is_one_and_zero():
    check(_inputs(1, 256, seed=11), quant="fp8", group_size=128)
    q, scale = quant(_inputs(0, 256), quant="mxfp4")
    assert q.shape == (0, 128) and scale.shape == (0, 8)
    q, scale = quant(_inputs(0, 256), quant="fp8", group_size=128, scale_col_major=True)
    assert q.shape == (0, 256) and scale.shape == (0, 2)


@pytest.mark.parametrize(
    "x, kwargs, name",
    [
        (torch.ones(64), {}, "x"),
        (torch.ones(2, 64, dtype=torch.int32), {}, "x"),
        (torch.ones(2, 64, dtype=torch.float64), {}, "x"),
        (torch.ones(2, 0), {}, "x"),
        (torch.ones(2, 48), {"quant": "mxfp4"}, "x"),
        (torch.ones(2, 192), {"group_size": 128}, "group_size"),
        (torch.ones(2, 64), {"group_size": -1}, "group_size"),
        (torch.ones(2, 64), {"quant": "int8"}, "quant"),
        (torch.ones(2, 64), {"quant": "mxfp4", "rounding": "up"}, "rounding"),
        (torch.ones(2, 64), {"fp8_dtype": torch.float8_e5m2}, "fp8_dtype"),
        (torch.ones(2, 64), {"config": {"num_warps": 3}}, "config"),
        (torch.ones(2, 64), {"target": "sm80"}, "target"),
    ],
)
def test_bad_inputs_name_the_argument(x, kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        quant(x, **kwargs)


# --- the canonical ops --------------------------------------------------------------------------


@pytest.fixture
def kernel_calls(monkeypatch):
    """Counts the op's calls into the quant-only kernel launcher."""
    calls = []
    real = kernels.quant

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(kernels, "quant", spy)
    return calls


def _op_reference(x, op, args):
    if op == "quant_mxfp4":
        return quant_mxfp4_ref(x, *args)
    q, scale = quant_fp8_ref(x, *args)
    col_major = len(args) > 5 and args[5]
    return q, scale if col_major and x.dim() == 2 else scale.contiguous()


OP_CASES = [
    pytest.param("quant_fp8", (), id="fp8-row"),
    pytest.param("quant_fp8", (128,), id="fp8-g128"),
    pytest.param("quant_fp8", (128, FN, 1e-10, False, False, True), id="fp8-g128-col"),
    pytest.param("quant_fp8", (0, FNUZ, 1e-12, True, True), id="fp8-fnuz-spelled"),
    pytest.param("quant_mxfp4", ("even",), id="mxfp4-even"),
    pytest.param("quant_mxfp4", ("ceil",), id="mxfp4-ceil"),
]


@pytest.mark.parametrize("op, args", OP_CASES)
@pytest.mark.parametrize(
    "shape, make",
    [
        ((5, 256), lambda x: x),
        ((2, 3, 256), lambda x: x),  # leading dims
        ((3, 2, 256), lambda x: x.transpose(0, 1)),  # non-contiguous: reshaped (a copy) to rows
        ((4, 512), lambda x: x[:, ::2]),  # element stride 2, as the kernel reads it
        ((0, 3, 256), lambda x: x),  # no rows
    ],
    ids=["2d", "3d", "3d-transposed", "strided", "empty"],
)
def test_op_runs_the_kernel_and_matches(op, args, shape, make, kernel_calls):
    x = make(_inputs(math.prod(shape[:-1]), shape[-1], seed=12).reshape(shape))
    q, scale = getattr(torch.ops.fxfuse, op)(x, *args)
    ref_q, ref_scale = _op_reference(x, op, args)
    assert len(kernel_calls) == 1
    assert bytes_equal(q, ref_q) and _scales_equal(scale, ref_scale)
    assert _layout(scale) == _layout(ref_scale) or scale.numel() == 0


def test_op_keeps_the_reference_where_the_kernel_does_not_run(kernel_calls, monkeypatch):
    x = _inputs(4, 256, torch.float32, seed=13)
    q, _ = torch.ops.fxfuse.quant_fp8(x.double(), 128)  # a dtype the kernel does not read
    assert bytes_equal(q, quant_fp8_ref(x.double(), 128)[0]) and not kernel_calls
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # CPU without the interpreter
    q, _ = torch.ops.fxfuse.quant_mxfp4(x)
    assert bytes_equal(q, quant_mxfp4_ref(x)[0]) and not kernel_calls
    with pytest.raises(ValueError, match="group_size"):
        torch.ops.fxfuse.quant_fp8(x, 96)


@pytest.mark.parametrize("op, args", OP_CASES)
def test_ops_pass_opcheck_through_the_kernel(op, args, kernel_calls):
    x = _inputs(4, 256, seed=14)
    torch.library.opcheck(getattr(torch.ops.fxfuse, op).default, (x, *args))
    torch.library.opcheck(getattr(torch.ops.fxfuse, op).default, (x.reshape(2, 2, 256), *args))
    assert kernel_calls


# --- GPU ----------------------------------------------------------------------------------------

needs_compiled_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or interpreting(), reason="needs a GPU, TRITON_INTERPRET=0"
)
GPU_QUANTS = QUANTS + [
    pytest.param({"quant": "fp8", "apply_reciprocal": True}, id="fp8-row-reciprocal"),
    pytest.param({"quant": "fp8", "group_size": 128, "eps_on_scale": True}, id="fp8-g128-eps"),
    pytest.param({"quant": "fp8", "fp8_dtype": FNUZ}, id="fp8-row-fnuz"),
]


@pytest.mark.gpu
@needs_compiled_gpu
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("quant_kw", GPU_QUANTS)
@pytest.mark.parametrize("m, k", [(64, 7168), (64, 2048), (64, 18432), (1, 7168), (257, 7168)])
def test_gpu_matches_cuda_reference(m, k, quant_kw):
    # Compiled (hardware converts, CUDA's reciprocal-multiply for `/ FP8_MAX`) against the torch
    # reference run on the same device, adversarial rows included.
    x = torch.cat([_inputs(m, k, seed=15), _adversarial_rows(k, torch.bfloat16)]).cuda()
    # fp32 and fp16 inputs at one shape: each dtype is another compile per case.
    wider = (x.float(), x.half()) if (m, k) == (64, 7168) else ()
    for rows in (x[:m], x, *wider):
        q, scale = quant(rows, **quant_kw)
        ref_q, ref_scale = _reference(rows, **quant_kw)
        assert bytes_equal(q, ref_q), quant_kw
        assert _scales_equal(scale, ref_scale), quant_kw
    # Through the op as gemm_ops' quant_gemm calls it.
    if quant_kw["quant"] == "fp8" and "fp8_dtype" not in quant_kw:
        group_size = quant_kw.get("group_size", 0)
        q, scale = torch.ops.fxfuse.quant_fp8(x, group_size)
        ref_q, ref_scale = quant_fp8_ref(x, group_size)
        assert bytes_equal(q, ref_q) and _scales_equal(scale, ref_scale)
