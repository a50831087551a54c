"""Quantized GEMMs: the `torch._scaled_mm` spelling becomes the canonical `fxfuse.gemm_fp8`, and
patterns `rmsnorm_quant_gemm` / `quant_gemm` replace the chains that end in a canonical GEMM
with one op that picks its kernels by token count at run time (runtime/gemm_ops.py).

Spellings:  out = torch._scaled_mm(q, w.t(), scale_a=s (M, 1), scale_b=ws (1, N), out_dtype=...)
            (rowwise; tensorwise with scalar scales), and fxfuse.ops.gemm_fp8 / gemm_mxfp4.
Chains:     rmsnorm_quant_gemm: fused [residual +] RMSNorm → quant (the `rmsnorm_quant` rule's
            op) whose q and scale feed only this GEMM; its with-norm op (y also read elsewhere)
            gives the op that keeps y; quant_gemm: a canonical quant whose q and scale feed only
            this GEMM.
"""

from __future__ import annotations

import torch

from fxfuse.kernels import gemm_ref
from fxfuse.kernels.formats import FP8_DTYPES
from fxfuse.patterns.common import MUL
from fxfuse.patterns.matcher import Alt, Any, Cast, Getitem, Lit, Match, Maybe, Op
from fxfuse.patterns.quant import VIEWS
from fxfuse.patterns.rule import Inserter, Rule, val
from fxfuse.runtime import gemm_ops  # noqa: F401 - registers torch.ops.fxfuse.gemm_*

fxfuse = torch.ops.fxfuse
aten = torch.ops.aten
TRANSPOSES = (aten.t.default, aten.permute.default, aten.transpose.int)
GEMMS = (fxfuse.gemm_fp8.default, fxfuse.gemm_mxfp4.default)
REPEAT = aten.repeat_interleave.self_int
NORM_QUANT_ARGS = (
    "weight_offset", "round_before_weight", "norm_dtype", "reciprocal_sqrt", "quant",
    "group_size", "fp8_dtype", "quant_eps", "eps_on_scale", "apply_reciprocal",
    "scale_col_major", "rounding",
)
# The prequant GEMM quantizes per token or in 1×128 groups (gemm_a16w8), or MXFP4.
PREQUANT_FP8_GROUPS = (0, 128)


# --- torch._scaled_mm → fxfuse.gemm_fp8 -----------------------------------------------------------

scaled_mm = Op(
    aten._scaled_mm.default,
    Any("q"),
    Any("wt"),
    Any("scale_a"),
    Any("scale_b"),
    bias=Any("bias"),
    scale_result=Any("scale_result"),
    out_dtype=Lit("out_dtype"),
)


def _is_transpose(node) -> bool:
    if not (hasattr(node, "target") and node.target in TRANSPOSES):
        return False
    if node.target is aten.permute.default:
        return list(node.args[1]) == [1, 0]
    if node.target is aten.transpose.int:
        return sorted(d % 2 for d in node.args[1:3]) == [0, 1]
    return True


def _scaled_mm_guard(m: Match, ctx) -> str | None:
    if m["bias"] is not None or m["scale_result"] is not None:
        return "_scaled_mm with a bias or scale_result"
    if m["out_dtype"] not in (torch.bfloat16, torch.float16, torch.float32):
        return f"_scaled_mm out_dtype {m['out_dtype']}, not bf16/fp16/fp32"
    q, wt, sa, sb = (val(m[k]) for k in ("q", "wt", "scale_a", "scale_b"))
    if q.dim() != 2 or wt.dim() != 2 or q.dtype != wt.dtype:
        return "operands are not 2-D FP8 of one dtype"
    n = wt.shape[1]
    tensorwise = sa.numel() == 1 and sb.numel() == 1
    rowwise = tuple(sa.shape) == (q.shape[0], 1) and tuple(sb.shape) == (1, n)
    if not (tensorwise or rowwise):
        return f"scales {tuple(sa.shape)} × {tuple(sb.shape)} are neither rowwise nor tensorwise"
    return None


def _scaled_mm_replace(m: Match, ctx, insert: Inserter):
    wt = m["wt"]
    # (permute, not t: Inductor decomposes t and cannot lower it in a post-grad graph)
    w = wt.args[0] if _is_transpose(wt) else insert.call(aten.permute.default, (wt, [1, 0]))
    sa, sb = m["scale_a"], m["scale_b"]
    # Tensorwise: both scalars. A (1, 1) weight scale beside (M, 1) token scales is rowwise of a
    # one-column weight (Qwen2-MoE's shared-expert gate, N = 1).
    if val(sa).numel() == 1 and val(sb).numel() == 1:
        sa = insert.call(aten.reshape.default, (sa, [1]))
        sb = insert.call(aten.reshape.default, (sb, [1]))
    else:
        sb = insert.call(aten.reshape.default, (sb, [val(sb).shape[1], 1]))
    return [insert.call(fxfuse.gemm_fp8.default, (m["q"], sa, w, sb, m["out_dtype"]))]


# --- dequantize-then-matmul in torch → fxfuse.gemm_fp8 -------------------------------------------
#   x_deq = (q.float() * s)[.view(-1, K)]         s (M, 1) per token, or (M, K/128, 1) per group
#   w_deq = w.float() * ws                         ws (N, 1) per channel, or the 128×128 blocks
#                                                  ws.repeat_interleave(128, 0).repeat_interleave(128, 1)
#   out   = (x_deq @ w_deq.t())[.to(out_dtype)], or F.linear(x_deq, w_deq)[.to(out_dtype)]
# After Inductor's decompositions (torch.compile's post-grad graph) x.repeat_interleave(r, d) of a
# static r reads x.unsqueeze(d + 1).expand(..., r, ...).clone().reshape(...).

_x_deq = Op(MUL, Cast(Any("q"), torch.float32), Any("x_scale"), commutative=True, name="x_deq")


def _repeated(inner, i: int):
    """inner.repeat_interleave(rep{i}, dim{i}), either spelling; the result bound to repeat{i}."""
    decomposed = Op(aten.unsqueeze.default, inner, Lit(f"unsqueeze{i}"))
    decomposed = Op(aten.clone.default, Op(aten.expand.default, decomposed, Lit(f"expand{i}")))
    return Alt(
        Op(REPEAT, inner, Lit(f"rep{i}"), Lit(f"dim{i}"), name=f"repeat{i}"),
        Op(VIEWS, decomposed, Lit(f"shape{i}"), name=f"repeat{i}"),
    )


_w_scale = Alt(_repeated(_repeated(Any("w_scale"), 0), 1), Any("w_scale"))


def _repeat_args(m: Match, i: int, source) -> tuple[int, int] | None:
    """(repeats, dim) of stage i (source: its input node), or None when the decomposed spelling
    is not a repeat_interleave (the reshape must fold the inserted dim into the one before)."""
    if m.get(f"unsqueeze{i}") is None:
        return m[f"rep{i}"], m[f"dim{i}"]
    src, out = tuple(val(source).shape), tuple(val(m[f"repeat{i}"]).shape)
    dim = m[f"unsqueeze{i}"] % (len(src) + 1) - 1
    sizes = list(m[f"expand{i}"])
    if dim < 0 or len(sizes) != len(src) + 1:
        return None
    rep = sizes[dim + 1]
    if sizes[: dim + 1] + sizes[dim + 2 :] != list(src):
        return None
    if out != src[:dim] + (src[dim] * rep,) + src[dim + 1 :]:
        return None
    return rep, dim
_w_deq = Op(MUL, Cast(Any("w"), torch.float32), _w_scale, commutative=True)
_matmul = Op(
    (aten.matmul.default, aten.mm.default),
    Maybe(lambda p: Op(VIEWS, p, Lit("rows")), _x_deq),
    Alt(Op(aten.t.default, _w_deq), Op(aten.permute.default, _w_deq, Lit("perm"))),
    name="matmul",
)
# F.linear(x_deq, w_deq) without a bias: export keeps aten.linear (the post-grad graph has the
# permute + mm above).
_linear = Op(
    aten.linear.default,
    Maybe(lambda p: Op(VIEWS, p, Lit("rows")), _x_deq),
    _w_deq,
    None,
    name="matmul",
)
dequant_matmul = Alt(Cast(_matmul, "out_dtype"), _matmul, Cast(_linear, "out_dtype"), _linear)


def _dequant_guard(m: Match, ctx) -> str | None:
    q, s, w, ws = (val(m[k]) for k in ("q", "x_scale", "w", "w_scale"))
    if q.dtype not in FP8_DTYPES or w.dtype != q.dtype:
        return "dequantized operands are not FP8 of one dtype"
    if m.get("perm") is not None and list(m["perm"]) != [1, 0]:
        return f"weight permuted by {m['perm']}, not transposed"
    if m.get("out_dtype", torch.float32) not in (torch.bfloat16, torch.float16, torch.float32):
        return f"output cast to {m['out_dtype']}"
    if val(m["matmul"]).dim() != 2:
        return f"the GEMM's output is {val(m['matmul']).dim()}-D, not (M, N)"
    n, k = w.shape
    if m.get("repeat1") is not None:
        inner = _repeat_args(m, 0, m["w_scale"])
        outer = _repeat_args(m, 1, m["repeat0"])
        if inner is None or outer is None:
            return "weight scales expanded other than by repeat_interleave"
        if (inner[0], outer[0]) != (128, 128) or {inner[1] % 2, outer[1] % 2} != {0, 1}:
            return "weight scales expanded to other than 128×128 blocks"
        if q.dim() != 3 or tuple(q.shape[-2:]) != (k // 128, 128) or tuple(s.shape) != (
            q.shape[0], k // 128, 1
        ):
            return "activation scales are not per 1×128 group of the weight's blocks"
        if tuple(ws.shape) != (-(-n // 128), k // 128):
            return f"block scales {tuple(ws.shape)} for a {n}×{k} weight"
        return None
    if q.dim() != 2 or tuple(s.shape) != (q.shape[0], 1) or tuple(ws.shape) != (n, 1):
        return "scales are not per token × per channel"
    return None


def _dequant_replace(m: Match, ctx, insert: Inserter):
    q, s, ws = m["q"], m["x_scale"], m["w_scale"]
    k = val(m["w"]).shape[1]
    if m.get("repeat1") is not None:
        q = insert.call(aten.reshape.default, (q, [-1, k]))
        s = insert.call(aten.reshape.default, (s, [-1, k // 128]))
    out_dtype = m.get("out_dtype", torch.float32)
    return [insert.call(fxfuse.gemm_fp8.default, (q, s, m["w"], ws, out_dtype))]


CANONICAL_RULES = [
    Rule(
        name="gemm_fp8",
        pattern=scaled_mm,
        outputs=lambda m: [m.root],
        guard=_scaled_mm_guard,
        replace=_scaled_mm_replace,
        report_as="quant_gemm",
        canonical=True,
    ),
    Rule(
        name="gemm_fp8[dequant]",
        pattern=dequant_matmul,
        outputs=lambda m: [m.root],
        guard=_dequant_guard,
        replace=_dequant_replace,
        report_as="quant_gemm",
        canonical=True,
    ),
]


# --- chains ending in the canonical GEMM ---------------------------------------------------------


def _viewed(pat, name):
    """`pat`, or a view of it (the rmsnorm_quant rule views q / scale back to the graph's rows)."""
    return Maybe(lambda p: Op(VIEWS, p, Lit(name)), pat)


def _gemm_of(q_pat, scale_pat):
    return Op(GEMMS, q_pat, scale_pat, Any("w"), Any("w_scale"), Lit("out_dtype"), name="gemm")


_nq_lits = [Lit(a) for a in NORM_QUANT_ARGS]
ADD_NORM_QUANTS = (fxfuse.add_rms_norm_quant.default, fxfuse.add_rms_norm_quant_with_norm.default)
NORM_QUANTS = (fxfuse.rms_norm_quant.default, fxfuse.rms_norm_quant_with_norm.default)
WITH_NORM = (fxfuse.add_rms_norm_quant_with_norm.default, fxfuse.rms_norm_quant_with_norm.default)
_fused_norm_quant = Alt(
    Op(ADD_NORM_QUANTS, Any("x"), Any("residual"), Any("norm_w"), Lit("eps"), *_nq_lits,
       name="fused"),
    Op(NORM_QUANTS, Any("x"), Any("norm_w"), Lit("eps"), *_nq_lits, name="fused"),
)
NORM_CHAIN = _gemm_of(
    _viewed(Getitem(_fused_norm_quant, 0), "q_view"),
    _viewed(Getitem(_fused_norm_quant, 1), "s_view"),
)

_canonical_quant = Alt(
    Op(fxfuse.quant_fp8.default, Any("x"), Lit("group_size"), Lit("fp8_dtype"), Lit("quant_eps"),
       Lit("eps_on_scale"), Lit("apply_reciprocal"), Lit("scale_col_major"), name="quant"),
    Op(fxfuse.quant_mxfp4.default, Any("x"), Lit("rounding"), name="quant"),
)
QUANT_CHAIN = _gemm_of(
    _viewed(Getitem(_canonical_quant, 0), "q_view"),
    _viewed(Getitem(_canonical_quant, 1), "s_view"),
)


def _quant_kind(m: Match) -> str:
    node = m["fused"] if "fused" in m.bindings else m["quant"]
    if node.target is fxfuse.quant_mxfp4.default:
        return "mxfp4"
    if node.target is fxfuse.quant_fp8.default:
        return "fp8"
    return m["quant"]


def _chain_guard(m: Match, ctx) -> str | None:
    kind = _quant_kind(m)
    gemm_kind = "mxfp4" if m.root.target is fxfuse.gemm_mxfp4.default else "fp8"
    if kind != gemm_kind:
        return f"{kind} activations feed an {gemm_kind} GEMM"
    q = val(m.root.args[0])
    if q.dim() != 2:
        return "the GEMM's activation is not 2-D"
    if kind == "fp8":
        if m["group_size"] not in PREQUANT_FP8_GROUPS:
            return f"FP8 group size {m['group_size']}: the GEMMs take per-token or 1×128"
        if val(m["w"]).dtype != m["fp8_dtype"]:
            return f"weight {val(m['w']).dtype} and activation {m['fp8_dtype']} differ"
        if m["scale_col_major"]:
            return "column-major activation scales"
        ws, n = val(m["w_scale"]), val(m["w"]).shape[0]
        w_rowwise = gemm_ref.is_rowwise_w_scale(ws, n)
        if w_rowwise == bool(m["group_size"]):
            # valid for the GEMM where K is one 128 group, but not a pairing the fused ops take
            return (
                f"FP8 group size {m['group_size']} with a {tuple(ws.shape)} weight scale: the fused "
                "ops pair per-token with per-channel / tensorwise, 1×128 with 128×128 blocks"
            )
    x = val(m["x"])
    if x.shape[-1] != q.shape[-1] * (2 if kind == "mxfp4" else 1):
        return "the quantized activation is reshaped across its rows"
    return None


def _dispatch_args(m: Match, ctx):
    return (m["w"], m["w_scale"], m["out_dtype"], int(ctx.config.prologue_quant_max_m))


def _norm_chain_outputs(m: Match):
    """The GEMM, and the fused op where its h or y (getitems 2 / 3) are read."""
    fused = m["fused"]
    keeps = fused.target in ADD_NORM_QUANTS or fused.target in WITH_NORM
    return [m.root, fused] if keeps else [m.root]


def _norm_chain_replace(m: Match, ctx, insert: Inserter):
    nq = tuple(m[a] for a in NORM_QUANT_ARGS)
    fused = m["fused"]
    keep_y = fused.target in WITH_NORM
    if fused.target in ADD_NORM_QUANTS:
        op = fxfuse.add_rms_norm_quant_gemm_with_norm if keep_y else fxfuse.add_rms_norm_quant_gemm
        node = insert.call(
            op.default,
            (m["x"], m["residual"], m["norm_w"], m["eps"], *nq, *_dispatch_args(m, ctx)),
        )
        out, *kept = insert.outputs(node, 3 if keep_y else 2)  # h[, y]
        return [out, [None, None, *kept]]
    op = fxfuse.rms_norm_quant_gemm_with_norm if keep_y else fxfuse.rms_norm_quant_gemm
    node = insert.call(op.default, (m["x"], m["norm_w"], m["eps"], *nq, *_dispatch_args(m, ctx)))
    if not keep_y:
        return [node]
    out, y = insert.outputs(node, 2)
    return [out, [None, None, y]]


def _quant_chain_replace(m: Match, ctx, insert: Inserter):
    if m["quant"].target is fxfuse.quant_mxfp4.default:
        quant = ("mxfp4", 0, torch.float8_e4m3fn, 0.0, False, False, m["rounding"])
    else:
        quant = ("fp8", m["group_size"], m["fp8_dtype"], m["quant_eps"], m["eps_on_scale"],
                 m["apply_reciprocal"], "even")
    return [insert.call(fxfuse.quant_gemm.default, (m["x"], *quant, *_dispatch_args(m, ctx)))]


FUSION_RULES = [
    Rule(
        name="rmsnorm_quant_gemm",
        pattern=NORM_CHAIN,
        outputs=_norm_chain_outputs,
        guard=_chain_guard,
        replace=_norm_chain_replace,
    ),
    Rule(
        name="quant_gemm",
        pattern=QUANT_CHAIN,
        outputs=lambda m: [m.root],
        guard=_chain_guard,
        replace=_quant_chain_replace,
    ),
]
