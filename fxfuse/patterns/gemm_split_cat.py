"""Pattern `gemm_split_cat`: GEMM → [views / transposes →] split → cat (SPEC §3) → one
`fxfuse.gemm_split_cat`, and GEMM → split with no cat → `fxfuse.gemm_split` where a piece is
copied anyway (DeepSeek kv_a's `kv_a.contiguous()`).

Spellings, in export's ATen IR and Inductor's post-grad graph:
    c      = F.linear(x, w)  |  mm(x, wᵀ)  |  matmul(x, wᵀ)                   (see PRODUCERS)
    t      = c.view(*rows, D, W) [.transpose(i, j) | .permute(..)]*      rows: the tokens, any shape
    c1, c2 = split(t, [S1, S2], -1)  |  split(t, S, -1)  |  t[..., :S1], t[..., S1:]
    out    = cat([c1, y], -1)
           | buf = t.new_empty(..); buf[..., :S1].copy_(c1); buf[..., S1:].copy_(y)   (HF, export)
           | slice_scatter(slice_scatter(empty, copy(.., c1), -1, 0, S1), copy(.., y), -1, S1)
                                                   (the same, functionalized: post-grad graphs)
The kernel writes out and c2 in (tokens, D, ·) order; the replacement views them back into the
graph's shape (the chain's view and transposes with the last dim changed) and turns y the other
way (a view, never a copy: y is often an expand with stride 0). Where that changes an output's
strides (HF's key is (B, H, S, ·) but rows run (B, S)), the guard re-runs the consumers on fake
values and declines if one of them cannot take the new layout.

GEMM producers: `PRODUCERS` lists, per GEMM spelling, the pattern of the node whose output is c,
its guard, its operands and the two fused ops that take those operands followed by the split
arguments (runtime/gemm_split_cat_ops.py):
- dense: bf16 / fp16 F.linear, mm, matmul → gemm_split_cat / gemm_split (x, w);
- FP8 and MXFP4: fxfuse's canonical `gemm_fp8` / `gemm_mxfp4` (what `torch._scaled_mm`, the
  dequantize-then-matmul spelling and fxfuse.ops.gemm_* become) → gemm_{fp8,mxfp4}_split_cat /
  _split (q, x_scale, w, w_scale, out_dtype): the A8W8 / AFP4WFP4 kernels with the split
  epilogue. These rules run before the quant → GEMM chain fusions, so such a GEMM keeps its
  quant (fused with the RMSNorm before it by `rmsnorm_quant`) and takes the split epilogue
  instead of the chain's M ≤ prologue_quant_max_m prequant dispatch: at those M both sides are
  two launches, and the fused one no longer copies the pieces.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
from collections.abc import Callable

import torch
from torch import fx

from fxfuse.patterns.common import same_size, sizes_of, static_int
from fxfuse.patterns.matcher import Alt, Any, Lit, Match, Op, Pat, normalized_args
from fxfuse.patterns.rule import Rule, val
from fxfuse.runtime import gemm_split_cat_ops, launch_tables

aten = torch.ops.aten
fxfuse = torch.ops.fxfuse
NAME = "gemm_split_cat"

VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
PERMUTES = (aten.transpose.int, aten.permute.default)
SPLITS = (aten.split_with_sizes.default, aten.split.Tensor)
# A piece consumed only by one of these is copied anyway: the fused op's contiguous piece is it.
COPIES = (aten.contiguous.default, aten.clone.default)
# Buffers whose every element the two slice copies overwrite.
EMPTIES = (
    aten.empty.memory_format,
    aten.new_empty.default,
    aten.empty_like.default,
    aten.zeros.default,
    aten.new_zeros.default,
    aten.zeros_like.default,
)
WEIGHT_TRANSPOSES = (aten.permute.default, aten.t.default, aten.transpose.int)
MAX_CHAIN = 6  # views / transposes followed between the GEMM and the split
MAX_CONSUMER_DEPTH = 6  # consumers followed while a changed layout propagates
# GEMM → split with no cat saves only the pieces' copies. At DeepSeek kv_a (K 7168, N 576) the
# unfused GEMM + copies beat both of the op's backends at every M from 1 to 8192 on the H200
# (bench_gemm_split_cat.py kv_a rows, 2026-12-03: 7.1 / 21.2 / 110.6 µs at M 1 / 1024 / 8192
# against 12.1 / 22.5 / 119.8 for the vendor path and 15.8 / 68.0 / 163.2 for the kernel), so
# such a split stays unfused. Measured split-cat rows at K 512 and 1024 do win.
SPLIT_ONLY_MAX_K = 4096


# --- matcher pieces: patterns that look at a node's users -----------------------------------------


def _match_seq(pairs: list, state):
    if not pairs:
        yield state
        return
    (pat, value), rest = pairs[0], pairs[1:]
    for result in pat.match(value, state):
        yield from _match_seq(rest, result)


class Items(Pat):
    """A list argument (cat's tensors) of exactly these patterns, in order."""

    def __init__(self, *pats: Pat):
        self.pats = list(pats)

    def match(self, value, state):
        if isinstance(value, (list, tuple)) and len(value) == len(self.pats):
            yield from _match_seq(list(zip(self.pats, value)), state)


class ViewChain(Pat):
    """`inner` followed by up to MAX_CHAIN views and transposes; binds `chain` (in graph order)."""

    def __init__(self, inner: Pat):
        self.inner = inner

    def match(self, value, state):
        chain, node = [], value
        while _calls(node, VIEWS + PERMUTES) and len(chain) < MAX_CHAIN:
            chain.append(node)
            node = node.args[0]
        state = state.copy()
        state.bindings["chain"] = chain[::-1]
        state.nodes.extend(chain)
        yield from self.inner.match(node, state)


class SplitPieces(Pat):
    """A split of `inner`'s output, entered from one piece (`root="piece"`: a getitem of split /
    split_with_sizes, or one of the slices that tile a dim) or from the split node (`root="split"`).

    Binds split_input, split_dim, sizes, pieces (each piece's node, None where unused),
    piece_index, and piece_outputs: the node that carries each piece out, a contiguous() / clone()
    when that is the piece's only user. Covers the split, every piece and those copies."""

    def __init__(self, inner: Pat, root: str = "piece"):
        self.inner, self.root = inner, root

    def match(self, value, state):
        found = _split_of(value) if self.root == "split" else _piece_of(value)
        if found is None:
            return
        source, dim, sizes, pieces, covered = found
        outputs = [_sole_copy(p) or p if p is not None else None for p in pieces]
        for result in self.inner.match(source, state.copy()):
            result.bindings.update(
                split_input=source, split_dim=dim, sizes=sizes, pieces=pieces,
                piece_index=pieces.index(value) if value in pieces else None,
                piece_outputs=outputs,
            )  # fmt: skip
            result.nodes.extend(covered + [o for o in outputs if o is not None])
            yield result


class SliceCopies(Pat):
    """`buf = t.new_empty(..); buf[..., :S1].copy_(lo); buf[..., S1:].copy_(hi)` entered at buf
    (export keeps the in-place copies). Binds `copies` (for the engine to erase), `copy_split`
    (S1, where hi's slice starts: the guard checks it is the piece's width, since copy_
    broadcasts), and `tag` when given; covers buf, both slices and both copies. Every other
    reader of buf must come after the copies, and nothing else may mutate in between."""

    def __init__(self, lo: Pat, hi: Pat, tag: str | None = None):
        self.lo, self.hi, self.tag = lo, hi, tag

    def match(self, value, state):
        if not _calls(value, EMPTIES) or not isinstance(val(value), torch.Tensor):
            return
        if val(value).dim() == 0:
            return
        ndim, width = val(value).dim(), static_int(val(value).shape[-1])
        ranges = {u: _slice_range(u, value, ndim, width) for u in value.users}
        slices = sorted((u for u in ranges if ranges[u] is not None), key=ranges.__getitem__)
        copies = [_sole_user(s, aten.copy_.default) for s in slices]
        if (
            len(slices) != 2
            or None in copies
            or any(c.args[0] is not s for c, s in zip(copies, slices))
        ):
            return
        (lo_start, lo_end), (hi_start, hi_end) = ranges[slices[0]], ranges[slices[1]]
        if (lo_start, lo_end, hi_end) != (0, hi_start, width):
            return
        readers = set(value.users) - set(slices)
        if not _copies_first(value, copies, readers):
            return
        for result in _match_seq(
            [(self.lo, copies[0].args[1]), (self.hi, copies[1].args[1])], state
        ):
            result.bindings["copies"] = copies
            result.bindings["copy_split"] = hi_start
            if self.tag:
                result.bindings[self.tag] = True
            result.nodes.extend([value, *slices, *copies])
            yield result


def _calls(node, targets) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _sole_user(node: fx.Node, target) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 and users[0].target is target else None


def _sole_copy(piece: fx.Node) -> fx.Node | None:
    users = list(piece.users)
    if len(users) != 1 or not _calls(users[0], COPIES):
        return None
    copy = users[0]
    layout = copy.kwargs.get("memory_format", copy.args[1] if len(copy.args) > 1 else None)
    return copy if layout in (None, torch.contiguous_format, torch.preserve_format) else None


def _norm_dim(dim, ndim: int) -> int | None:
    return dim % ndim if isinstance(dim, int) and ndim and -ndim <= dim < ndim else None


def _norm_range(start, end, size: int) -> tuple[int, int] | None:
    start = 0 if start is None else static_int(start)
    end = size if end is None else static_int(end)
    if start is None or end is None:
        return None
    start, end = (s + size if s < 0 else s for s in (start, end))
    return max(0, min(start, size)), max(0, min(end, size))


def _slice_range(node, source, ndim: int, width: int | None) -> tuple[int, int] | None:
    """[start, end) of a step-1 slice of `source`'s last dim (an alias of source: all of it, as
    export writes `buf[..., :S1]` when S1 is buf's whole width), else None."""
    if width is not None and _calls(node, (aten.alias.default,)) and node.args[0] is source:
        return 0, width
    if width is None or not _calls(node, (aten.slice.Tensor,)) or node.args[0] is not source:
        return None
    args = normalized_args(node)
    if _norm_dim(args["dim"], ndim) != ndim - 1 or args.get("step", 1) != 1:
        return None
    return _norm_range(args.get("start"), args.get("end"), width)


def _copies_first(buffer: fx.Node, copies: list[fx.Node], readers: set[fx.Node]) -> bool:
    """Both copies run before any reader of buffer, and no other node mutates in between."""
    pending, node = set(copies), buffer.next
    while pending and node.op != "root":
        if node in pending:
            pending.discard(node)
        elif node in readers or _mutates(node):
            return False
        node = node.next
    return not pending


def _mutates(node: fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable


def _split_of(split: fx.Node):
    """(input, dim, sizes, pieces, covered nodes) of a split / split_with_sizes node."""
    if not _calls(split, SPLITS) or not isinstance(val(split.args[0]), torch.Tensor):
        return None
    args = normalized_args(split)
    source = args["input"]
    shape = val(source).shape
    dim = _norm_dim(args["dim"], len(shape))
    if dim is None:
        return None
    if split.target is aten.split_with_sizes.default:
        sizes = [static_int(s) for s in args["split_sizes"]]
    else:
        size, total = static_int(args["split_size"]), static_int(shape[dim])
        if not size or total is None:
            return None
        sizes = [size] * (total // size) + ([total % size] if total % size else [])
    if None in sizes:
        return None
    pieces: list = [None] * len(sizes)
    for user in split.users:
        index = user.args[1] if user.target is operator.getitem else None
        if not isinstance(index, int) or not 0 <= index < len(sizes) or pieces[index] is not None:
            return None
        pieces[index] = user
    return source, dim, sizes, pieces, [split, *(p for p in pieces if p is not None)]


def _piece_of(piece: fx.Node):
    """The split that `piece` (a getitem of a split, or one of several tiling slices) belongs to."""
    if _calls(piece, (operator.getitem,)):
        return _split_of(piece.args[0])
    if not _calls(piece, (aten.slice.Tensor,)) or not isinstance(val(piece.args[0]), torch.Tensor):
        return None
    source = piece.args[0]
    shape = val(source).shape
    dim = _norm_dim(normalized_args(piece)["dim"], len(shape))
    size = static_int(shape[dim]) if dim is not None else None
    if size is None:
        return None
    ranges = {}
    for user in source.users:
        args = normalized_args(user) if _calls(user, (aten.slice.Tensor,)) else None
        if args and _norm_dim(args["dim"], len(shape)) == dim and args.get("step", 1) == 1:
            ranges[user] = _norm_range(args.get("start"), args.get("end"), size)
    pieces = sorted(ranges, key=lambda s: ranges[s] or (-1, -1))
    bounds = [ranges[p] for p in pieces]
    if None in bounds or bounds[0][0] != 0 or bounds[-1][1] != size:
        return None
    if any(a[1] != b[0] for a, b in itertools.pairwise(bounds)) or any(s == e for s, e in bounds):
        return None
    return source, dim, [e - s for s, e in bounds], pieces, list(pieces)


# --- GEMM producers -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Producer:
    """A GEMM spelling that can feed the fused kernels.

    pattern binds "gemm" (the node whose output is c) and "x" (its activation, whose leading
    dims are the rows); guard(m) -> None or a reason; operands(m, build) -> the GEMM operands of
    the fused ops (built with `build.call`); split_cat / split: fused ops called as
    (*operands, d, s1, s2, y) and (*operands, d, sizes); reduction(m) -> the GEMM's K.
    Every split_cat op returns c2 laid out as the unfused graph's c2 (a view of an
    (M, d, s1 + s2) buffer)."""

    name: str
    pattern: Pat
    guard: Callable[[Match], str | None]
    operands: Callable[[Match, object], tuple]
    split_cat: object
    split: object
    reduction: Callable[[Match], int | None]

    @property
    def targets(self) -> tuple:
        pats = self.pattern.pats if isinstance(self.pattern, Alt) else [self.pattern]
        return tuple(t for p in pats for t in p.targets)


_dense_gemm = Alt(
    Op(aten.linear.default, Any("x"), Any("w"), Any("bias"), name="gemm"),
    Op(aten.mm.default, Any("x"), Any("w_kn"), name="gemm"),
    Op(aten.matmul.default, Any("x"), Any("w_kn"), name="gemm"),
    Op(aten.addmm.default, Any("bias"), Any("x"), Any("w_kn"), name="gemm"),
)


def _dense_guard(m: Match) -> str | None:
    if m.get("bias") is not None:
        return "the GEMM adds a bias; the kernel has no bias epilogue"
    x = val(m["x"])
    w = val(m["w"]) if m.get("w") is not None else val(m["w_kn"])
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor) or x.dim() < 2:
        return "the GEMM is not (rows, K) x (K, N)"
    if w.dim() != 2:
        return f"the GEMM's weight is {w.dim()}-D, not a (N, K) matrix"
    if x.dtype != w.dtype or x.dtype not in gemm_split_cat_ops.KERNEL_DTYPES:
        return f"GEMM in {x.dtype} x {w.dtype}; the kernel takes bf16 / fp16"
    if static_int(w.shape[0]) is None or static_int(w.shape[1]) is None:
        return "the GEMM's K or N is symbolic"
    return None


def _untransposed(build, w_kn: fx.Node):
    """(N, K) from mm's (K, N) operand: the transposed weight itself, else a transposed view."""
    if _calls(w_kn, WEIGHT_TRANSPOSES) and val(w_kn.args[0]).dim() == 2:
        args = list(normalized_args(w_kn).values())[1:]
        swaps = {
            aten.t.default: True,
            aten.transpose.int: len(args) == 2 and _norm_dim(args[0], 2) != _norm_dim(args[1], 2),
            aten.permute.default: bool(args) and [_norm_dim(i, 2) for i in args[0]] == [1, 0],
        }
        if swaps[w_kn.target]:
            return w_kn.args[0]
    return build.call(aten.permute.default, (w_kn, [1, 0]))


def _dense_operands(m: Match, build) -> tuple:
    x = m["x"]
    if val(x).dim() != 2:
        x = build.call(aten.reshape.default, (x, [-1, static_int(val(x).shape[-1])]))
    w = m["w"] if m.get("w") is not None else _untransposed(build, m["w_kn"])
    return x, w


def _k_of_x(m: Match) -> int | None:
    return static_int(val(m["x"]).shape[-1])


def _k_of_packed(m: Match) -> int | None:
    """K of an MXFP4 GEMM: its q holds two e2m1 codes a byte."""
    k = _k_of_x(m)
    return None if k is None else 2 * k


DENSE = Producer(
    name="dense",
    pattern=_dense_gemm,
    guard=_dense_guard,
    operands=_dense_operands,
    split_cat=fxfuse.gemm_split_cat.default,
    split=fxfuse.gemm_split.default,
    reduction=_k_of_x,
)


def _quantized_gemm(target) -> Op:
    """fxfuse's canonical quantized GEMM (what _scaled_mm, dequantize-then-matmul and
    fxfuse.ops.gemm_* become), x being the quantized activation q."""
    return Op(target, Any("x"), Any("x_scale"), Any("w"), Any("w_scale"), Lit("out_dtype"),
              name="gemm")  # fmt: skip


def _quantized_guard(m: Match) -> str | None:
    q, w = val(m["x"]), val(m["w"])
    if not isinstance(q, torch.Tensor) or q.dim() != 2:
        return "the quantized GEMM's activation is not (rows, K)"
    if m["out_dtype"] not in gemm_split_cat_ops.QUANTIZED_OUT_DTYPES:
        return f"the quantized GEMM writes {m['out_dtype']}"
    n = static_int(val(m["gemm"]).shape[-1])
    if n is None or static_int(q.shape[-1]) is None or w.dim() != 2:
        return "the GEMM's K or N is symbolic"
    return None


def _quantized_operands(m: Match, build) -> tuple:
    return m["x"], m["x_scale"], m["w"], m["w_scale"], m["out_dtype"]


FP8 = Producer(
    name="fp8",
    pattern=_quantized_gemm(fxfuse.gemm_fp8.default),
    guard=_quantized_guard,
    operands=_quantized_operands,
    split_cat=fxfuse.gemm_fp8_split_cat.default,
    split=fxfuse.gemm_fp8_split.default,
    reduction=_k_of_x,
)
MXFP4 = Producer(
    name="mxfp4",
    pattern=_quantized_gemm(fxfuse.gemm_mxfp4.default),
    guard=_quantized_guard,
    operands=_quantized_operands,
    split_cat=fxfuse.gemm_mxfp4_split_cat.default,
    split=fxfuse.gemm_mxfp4_split.default,
    reduction=_k_of_packed,
)
# Most specific first (see the module docstring).
PRODUCERS = [DENSE, FP8, MXFP4]
GEMM = Alt(*(p.pattern for p in PRODUCERS))


def _producer(m: Match) -> Producer:
    return next(p for p in PRODUCERS if m["gemm"].target in p.targets)


# --- spellings ----------------------------------------------------------------------------------

PIECE = SplitPieces(ViewChain(GEMM), root="piece")
y = Any("y")


def _scatter(base: Pat, src: Pat, name: str) -> Op:
    """slice_scatter(base, [copy(slice(..), src) | src], dim, start, end, step)."""
    # (the slice only gives the copy its shape, which the guard checks with the scatter's range)
    window = Op(aten.slice.Tensor, Any(), dim=Any(), start=Any(), end=Any(), step=Any())
    copied = Alt(Op(aten.copy.default, window, src), src)
    ranges = (Lit(f"{name}_dim"), Lit(f"{name}_start"), Lit(f"{name}_end"), Lit(f"{name}_step"))
    return Op(aten.slice_scatter.default, base, copied, *ranges, name=name)


_buffer = Alt(Op(EMPTIES, Any()), Any())
SPLIT_CAT = Alt(
    # cat([c1, y], -1)
    Op(aten.cat.default, Items(PIECE, y), Lit("cat_dim")),
    # cat([y, c1], -1): a near-miss, reported
    Op(aten.cat.default, Items(y, PIECE), Lit("cat_dim"), name="y_first"),
    # buf = new_empty(..); buf[..., :S1].copy_(c1); buf[..., S1:].copy_(y)
    SliceCopies(PIECE, y),
    SliceCopies(y, PIECE, tag="y_first"),
    # the same, functionalized (either order of the two scatters)
    _scatter(_scatter(_buffer, PIECE, "piece_scatter"), y, "y_scatter"),
    _scatter(_scatter(_buffer, y, "y_scatter"), PIECE, "piece_scatter"),
    # y 0 wide (no rope part): the piece's copy is the whole buffer
    _scatter(Op(aten.copy.default, _buffer, PIECE), y, "y_scatter"),
)
SPLIT_ONLY = SplitPieces(ViewChain(GEMM), root="split")


# --- layout: how the chain between the GEMM and the split maps rows and columns ------------------


@dataclasses.dataclass(frozen=True)
class Layout:
    d: int  # heads: the GEMM's N = d · width
    width: int  # the split dim
    view: fx.Node | None  # the chain's (last) view; None: the split sees the GEMM's own shape
    perm: list[int] | None  # the transposes composed; None: none


def _layout(m: Match) -> Layout | str:
    gemm = val(m["gemm"])
    n = static_int(gemm.shape[-1])
    views = [node for node in m["chain"] if node.target in VIEWS]
    perms = [node for node in m["chain"] if node.target in PERMUTES]
    if views and perms and m["chain"].index(views[-1]) > m["chain"].index(perms[0]):
        return "a view after a transpose between the GEMM and the split"
    shape = val(views[-1]).shape if views else gemm.shape
    ndim, width = len(shape), static_int(shape[-1])
    if width is None or n is None:
        return "the split dim is symbolic"
    if width == n:
        d = 1
    elif ndim >= 2 and n % width == 0 and static_int(shape[-2]) == n // width:
        d = n // width
    else:
        return f"the view to {tuple(shape)} does not split the GEMM's {n} columns as (heads, width)"
    perm = list(range(ndim))
    for node in perms:
        args = list(normalized_args(node).values())
        if node.target is aten.transpose.int:
            i, j = _norm_dim(args[1], ndim), _norm_dim(args[2], ndim)
            perm[i], perm[j] = perm[j], perm[i]
        else:
            perm = [perm[_norm_dim(i, ndim)] for i in args[1]]
    if perm[-1] != ndim - 1:
        return "a transpose moves the GEMM's columns off the last dim"
    if m["split_dim"] != ndim - 1:
        return f"split along dim {m['split_dim']}, not the last"
    return Layout(d, width, views[-1] if views else None, None if perm == sorted(perm) else perm)


def _present(build, t, width: int, layout: Layout, m: Match):
    """The fused op's (M, d, width) output in the graph's shape: the chain's view with the last
    dim set to `width`, then its transposes."""
    if layout.view is not None:
        shape = list(list(normalized_args(layout.view).values())[1])
        shape[-1] = width
    else:
        shape = [*sizes_of(build, m["x"], val(m["gemm"]).dim() - 1), width]
    t = build.call(aten.view.default, (t, shape))
    return build.call(aten.permute.default, (t, layout.perm)) if layout.perm else t


def _prepare_y(build, m: Match, layout: Layout, s3: int):
    """y in the kernel's (M, d, S3) order: broadcast as the copy did, transposes undone, viewed."""
    target = list(val(m["split_input"]).shape[:-1]) + [s3]
    y_node, shape = m["y"], list(val(m["y"]).shape)
    if len(shape) != len(target):
        raise ValueError(f"y has {len(shape)} dims, the output {len(target)}")
    if not all(same_size(a, b) for a, b in zip(shape, target)):
        sizes = [-1 if same_size(a, b) else static_int(b) for a, b in zip(shape, target)]
        if None in sizes or any(s != -1 and static_int(a) != 1 for a, s in zip(shape, sizes)):
            raise ValueError(f"y {tuple(shape)} does not broadcast to {tuple(target)}")
        y_node = build.call(aten.expand.default, (y_node, sizes))
    if layout.perm:
        inverse = sorted(range(len(layout.perm)), key=layout.perm.__getitem__)
        y_node = build.call(aten.permute.default, (y_node, inverse))
    rows = static_int(math.prod(val(m["gemm"]).shape[:-1]))
    return build.call(aten.view.default, (y_node, [-1 if rows is None else rows, layout.d, s3]))


def _carried(build, output: fx.Node, piece, same: bool):
    """The value of a piece's output node: the piece itself, or (when the graph copied the piece
    and the fused one is not already what that copy makes: `same` False) the same copy of it."""
    if _calls(output, COPIES) and not same:
        return build.call(output.target, (piece,), dict(output.kwargs))
    return piece


def _dense_piece_copied(output: fx.Node, layout: Layout) -> bool:
    """For a piece the fused op writes densely ((M, d, size) contiguous, shown through the chain's
    view and transposes): whether `output`'s copy would make that same tensor. Without transposes
    the piece is contiguous; with them only a clone in preserve_format (its default) keeps the
    transposed strides (Inductor turns `cat([c1, <0 wide>])` into such a clone)."""
    if not layout.perm:
        return True
    memory_format = output.kwargs.get("memory_format", torch.preserve_format)
    return output.target is aten.clone.default and memory_format is torch.preserve_format


def _copy_saved(output: fx.Node | None, layout: Layout) -> bool:
    """The graph copies this piece (`.contiguous()` / `clone()`) into exactly what the fused op
    writes: the fused split saves that copy."""
    return _calls(output, COPIES) and _dense_piece_copied(output, layout)


# --- rules --------------------------------------------------------------------------------------


def _outputs(m: Match) -> list[fx.Node]:
    others = [
        o for i, o in enumerate(m["piece_outputs"]) if o is not None and i != m["piece_index"]
    ]
    return others if m["piece_index"] is None else [m.root, *others]


def _graph_output_layouts(replace):
    """`replace`, with a value whose node the graph returns given back the graph's layout where
    the fused one differs: a contiguous copy (the caller may view it), else refused."""

    def wrapped(m: Match, ctx, build):
        values = list(replace(m, ctx, build))
        for i, (old, new) in enumerate(zip(_outputs(m), values)):
            if not any(user.op == "output" for user in old.users):
                continue
            new_val = new.meta["val"] if isinstance(new, fx.Node) else new
            if _same_layout(val(old), new_val):
                continue
            if not val(old).is_contiguous():
                raise ValueError(f"the graph returns {old.name} with strides the fused op lacks")
            copy = (new,), {"memory_format": torch.contiguous_format}
            values[i] = build.call(aten.clone.default, *copy)
        return values

    return wrapped


def _replace_split_cat(m: Match, ctx, build):
    layout, producer = _layout(m), _producer(m)
    sizes = m["sizes"]
    s1, s2 = sizes[0], sum(sizes[1:])
    s3 = static_int(val(m.root).shape[-1]) - s1
    if _appends_nothing(m):
        # Nothing to append (GLM-5.3-Flash's MLA has no rope part: the cat is a copy of c1): the
        # split's pieces. The first piece's output node is the piece itself (the cat or copy
        # reads it), so the split's replacement shows it as the output.
        return _replace_split(m, ctx, build)
    y_rows = _prepare_y(build, m, layout, s3)
    fused = build.call(producer.split_cat, (*producer.operands(m, build), layout.d, s1, s2, y_rows))
    out, c2 = build.outputs(fused, 2)
    values = [_present(build, out, s1 + s3, layout, m)]
    # Pieces after the first are c2 itself, or slices of it (views, as they were of c).
    rest, start = _present(build, c2, s2, layout, m), s1
    for size, output in zip(sizes[1:], m["piece_outputs"][1:]):
        if output is not None:
            piece = rest
            if len(sizes) > 2:
                piece = build.call(aten.slice.Tensor, (rest, -1, start - s1, start - s1 + size))
            values.append(_carried(build, output, piece, False))
        start += size
    return values


def _replace_split(m: Match, ctx, build):
    layout, producer = _layout(m), _producer(m)
    sizes = m["sizes"]
    args = (*producer.operands(m, build), layout.d, list(sizes), _view_piece(m, layout))
    fused = build.call(producer.split, args)
    values = []
    for size, piece, output in zip(sizes, build.outputs(fused, len(sizes)), m["piece_outputs"]):
        if output is not None:
            shown = _present(build, piece, size, layout, m)
            values.append(_carried(build, output, shown, _dense_piece_copied(output, layout)))
    return values


def _view_piece(m: Match, layout: Layout) -> int:
    """The piece the fused split returns as the graph's own view of the GEMM output (-1: none):
    the widest piece the graph reads in place or copies into another layout, so that no backend
    copies more than the graph did (the unfused backend runs the graph's chain byte for byte).
    Never the piece a cat (or the 0-wide-y copy) reads: the fused piece replaces that copy. At
    most one: two views would share the op's buffer, and a custom op's outputs may not."""
    kept = [
        (size, -i)
        for i, (size, output) in enumerate(zip(m["sizes"], m["piece_outputs"]))
        if output is not None
        and i != m["piece_index"]
        and not _copy_saved(output, layout)
    ]
    return -max(kept)[1] if kept else -1


def _common_guard(m: Match, ctx) -> str | None:
    reason = _producer(m).guard(m)
    if reason:
        return reason
    layout = _layout(m)
    if isinstance(layout, str):
        return layout
    sizes = m["sizes"]
    if len(sizes) > gemm_split_cat_ops.MAX_PIECES:
        return f"split into {len(sizes)} pieces; the kernel writes at most 4"
    try:  # the launch table names the targets the kernel has settings for
        launch_tables.lookup("gemm_split_cat", ctx.target, n=layout.d * layout.width)
    except (KeyError, launch_tables.LaunchTableError):
        return f"no gemm_split_cat launch settings for target {ctx.target}"
    return None


def _cat_guard(m: Match) -> str | None:
    """The cat / copies / scatters put the first split piece at [0, S1) of the output's last dim
    and y after it; dtypes agree."""
    if m.get("y_first") is not None:
        return "y comes before the GEMM piece in the concatenation"
    if m["piece_index"] != 0:
        return f"the concatenation takes split piece {m['piece_index']}, not the first"
    out, piece, y_val = val(m.root), val(m["pieces"][0]), val(m["y"])
    ndim, s1 = out.dim(), m["sizes"][0]
    width = static_int(out.shape[-1])
    if "cat_dim" in m.bindings and _norm_dim(m["cat_dim"], ndim) != ndim - 1:
        return f"cat along dim {m['cat_dim']}, not the split dim"
    if "copy_split" in m.bindings and m["copy_split"] != s1:
        # copy_ broadcasts: a narrower piece would fill the whole slice
        return f"the copies write the {s1} wide piece into {m['copy_split']} columns"
    for name, want in (("piece_scatter", (0, s1)), ("y_scatter", (s1, width))):
        if name in m.bindings:
            if _norm_dim(m[f"{name}_dim"], ndim) != ndim - 1 or m[f"{name}_step"] != 1:
                return "the scatters do not write along the split dim"
            if width is None or _norm_range(m[f"{name}_start"], m[f"{name}_end"], width) != want:
                return f"the scatters do not write the piece at [0, {s1}) and y after it"
    if (
        width is None
        or width < s1
        or not all(
            same_size(a, b) for a, b in zip(out.shape[:-1], val(m["split_input"]).shape[:-1])
        )
    ):
        return f"output {tuple(out.shape)} is not the split input's rows with y appended"
    if not isinstance(y_val, torch.Tensor) or not (out.dtype == piece.dtype == y_val.dtype):
        return "the output, the GEMM piece and y differ in dtype"
    if _depends_on(m["y"], m["gemm"]):
        return "y is computed from the GEMM's own output"
    return None


def _depends_on(node, ancestor: fx.Node) -> bool:
    order = {n: i for i, n in enumerate(ancestor.graph.nodes)}
    pending, seen = [node], set()
    while pending:
        current = pending.pop()
        if current is ancestor:
            return True
        if current in seen or order.get(current, -1) < order[ancestor]:
            continue
        seen.add(current)
        pending.extend(current.all_input_nodes)
    return False


class _FakeBuild:
    """Builds the replacement on fake values instead of graph nodes (what guards check)."""

    def __init__(self, fake_mode):
        self.fake_mode = fake_mode

    def call(self, target, args, kwargs=None):
        def fake(a):
            return a.meta["val"] if isinstance(a, fx.Node) else a

        args, kwargs = fx.node.map_aggregate(args, fake), fx.node.map_aggregate(kwargs or {}, fake)
        if target is operator.getitem:
            return args[0][args[1]]
        with self.fake_mode:
            return target(*args, **kwargs)

    def outputs(self, value, count: int) -> list:
        return [value[i] for i in range(count)]


def _same_layout(old, new) -> bool:
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        return len(old) == len(new) and all(_same_layout(a, b) for a, b in zip(old, new))
    if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
        return old.dtype == new.dtype and all(
            same_size(a, b)
            for a, b in zip((*old.shape, *old.stride()), (*new.shape, *new.stride()))
        )
    return not isinstance(old, torch.Tensor) and not isinstance(new, torch.Tensor)


def _consumers_take(node: fx.Node, new, inside: set, fake_mode, depth: int = 0) -> str | None:
    """None when every consumer of node runs on `new` (node's replacement, maybe with other
    strides) as on the old value, re-run on fake values as far as the strides differ."""
    if _same_layout(val(node), new):
        return None
    if depth >= MAX_CONSUMER_DEPTH:
        return f"the changed layout of {node.name} reaches past {MAX_CONSUMER_DEPTH} consumers"
    for user in node.users:
        if user in inside or user.op == "output":
            continue
        target = user.target
        if user.op != "call_function" or (
            target is not operator.getitem and not isinstance(target, torch._ops.OpOverload)
        ):
            return f"{user.name} may need {node.name}'s old strides"
        if _mutates(user):
            return f"{user.name} ({target}) mutates {node.name} in place"

        def swap(a):
            return new if a is node else (a.meta.get("val") if isinstance(a, fx.Node) else a)

        args, kwargs = (
            fx.node.map_aggregate(user.args, swap),
            fx.node.map_aggregate(user.kwargs, swap),
        )
        try:
            if target is operator.getitem:
                result = args[0][args[1]]
            else:
                with fake_mode:
                    result = target(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - any failure means "declines the layout"
            return f"{user.name} ({target}) cannot take the fused output's strides: {err}"
        reason = _consumers_take(user, result, inside, fake_mode, depth + 1)
        if reason:
            return reason
    return None


def _simulated(m: Match, ctx, replace) -> str | None:
    """Builds the replacement on fake values and checks every consumer of the outputs with it."""
    try:
        values = replace(m, ctx, _FakeBuild(ctx.fake_mode))
    except Exception as err:  # noqa: BLE001 - a guard never raises: a failure is the reason
        return f"the fused outputs cannot be viewed into the graph's layout: {err}"
    inside = set(m.nodes)
    for old, new in zip(_outputs(m), values):
        reason = _consumers_take(old, new, inside, ctx.fake_mode)
        if reason:
            return reason
    return None


def split_cat_guard(m: Match, ctx) -> str | None:
    split_only = _appends_nothing(m)
    return (
        _common_guard(m, ctx)
        or _cat_guard(m)
        or (_split_k_guard(m) if split_only else None)
        or _unfused_guard(m, ctx, split_only)
        or _simulated(m, ctx, _replace_split_cat)
    )


def _unfused_guard(m: Match, ctx, split_only: bool) -> str | None:
    """A dense GEMM of static M where the target's backend table runs the graph's own chain: the
    fused op would only run that chain (gemm_split_cat_ops.unfused_at), so leave it unfused."""
    if _producer(m) is not DENSE:
        return None  # the quantized ops' tables are the GEMMs' own
    rows = [static_int(r) for r in val(m["x"]).shape[:-1]]
    if None in rows:
        return None  # M known at run time only: the op dispatches per call
    m_rows = math.prod(rows)
    layout = _layout(m)
    n, k = layout.d * layout.width, _producer(m).reduction(m)
    if k is not None and gemm_split_cat_ops.unfused_at(ctx.target, m_rows, n, k, split_only):
        table = "split" if split_only else "split-cat"
        return (
            f"at M = {m_rows} (N {n}, K {k}) the {ctx.target} {table} backend table runs the "
            "unfused chain: the fused kernel measured slower there"
        )
    return None


def _appends_nothing(m: Match) -> bool:
    """y is 0 wide: the replacement is `gemm_split` (`_replace_split_cat`)."""
    return static_int(val(m.root).shape[-1]) == m["sizes"][0]


def _split_k_guard(m: Match) -> str | None:
    k = _producer(m).reduction(m)
    if k is None or k > SPLIT_ONLY_MAX_K:
        return (
            f"K = {k} > {SPLIT_ONLY_MAX_K}: the unfused GEMM and copies are faster for a split "
            "with no cat (measured at DeepSeek kv_a, K 7168)"
        )
    return None


def split_guard(m: Match, ctx) -> str | None:
    reason = _common_guard(m, ctx)
    if reason:
        return reason
    layout = _layout(m)
    if not any(_copy_saved(o, layout) for o in m["piece_outputs"]):
        return "no copy to save: every split piece is read in place as a view of the GEMM output"
    return (
        _split_k_guard(m)
        or _unfused_guard(m, ctx, split_only=True)
        or _simulated(m, ctx, _replace_split)
    )


RULES = [
    Rule(
        name=NAME,
        pattern=SPLIT_CAT,
        outputs=_outputs,
        guard=split_cat_guard,
        replace=_graph_output_layouts(_replace_split_cat),
        mutations=lambda m: m.get("copies") or [],
    ),
    Rule(
        name=NAME,
        pattern=SPLIT_ONLY,
        outputs=_outputs,
        guard=split_guard,
        replace=_graph_output_layouts(_replace_split),
    ),
]
