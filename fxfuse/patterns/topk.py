"""Patterns `topk_page_transform`, `topk_block_table`, `topk_mask`: a top-k whose indices only feed
a page-table transform, a block table or a mask → one `fxfuse.topk_*` kernel (SPEC §3 "Top-k
families"; the exact contract is `kernels/topk_ref.py`).

Spellings (each chain also in its `where` / `masked_fill_` / `x[cond] = v` forms, with casts; a
`where`'s fill may also be a tensor of the value, `full_like(x, v)` / `full(shape, v)`, that
leaves x's shape; `topk(k).indices` may also be the first k of a descending sort,
`argsort(s, descending=True)[..., :k]` or `sort(s, descending=True).indices[..., :k]`):
- page transform (SGLang's DSA torch fallback): `scores.masked_fill(cols >= lengths[:, None],
  -inf)` → `topk(k).indices` [→ `masked_fill(idx >= lengths, -1)`] → `clamp(min=0)` →
  `page_table[row_to_batch]?.gather(1, i >> s) << s | (i & (ps - 1))` (or `// ps`, `* ps + % ps`,
  or a plain gather for page size 1) → `masked_fill(invalid, -1)`; packed prefill rows (vLLM's
  DSA prefill): `scores.masked_fill(~((cols >= ks) & (cols < ke)), -inf)` → `topk(k).indices`
  → `- ks` → `masked_fill(~((local >= 0) & (local - (ke - ks) < 0)), -1)`, no page table.
- block table (MiniMax-M3): `s.masked_fill(init | local, inf).masked_fill(blk > p // B, -inf)` →
  `topk(k).indices` → `where(idx <= last, idx, BIG)` → `sort()` → `masked_fill(== BIG, -1)`.
- mask: `ones(bool).scatter(-1, idx, False)` (DeepSeek-V3.2 in HF), `zeros(bool).scatter_(-1,
  idx, True)`, `full(-inf).scatter_(-1, idx, 0)` (MiniMax-M3 in HF), with −1-padded indices sent
  to a throwaway column then sliced off, optionally `repeat_interleave(B, -1)` (or
  `[..., None].expand(..., B).reshape`) to key level; the scores optionally length-masked.

Leaves such as the length test `cols >= lengths[:, None]`, the -inf fill or `p // 128` are read
by the guards, not matched: model code reuses them (MiniMax re-masks the future with the same
test), and a matched interior node with another user would block the rewrite.
NaN ranks as −inf (SPEC): torch.topk ranks it highest, the one place the fused op differs from
the spelled chain beyond the order of equal scores.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable

import torch
from torch import fx

from fxfuse.patterns.common import (
    ADD,
    FLOAT_DTYPES,
    MUL,
    SUB,
    is_last_dim,
    same_size,
    static_int,
)
from fxfuse.patterns.matcher import (
    Alt,
    Any,
    Cast,
    Getitem,
    Lit,
    Match,
    Op,
    Pat,
    cast_source,
    match_at,
    normalized_args,
    same_value,
)
from fxfuse.patterns.rule import Inserter, Rule, val
from fxfuse.runtime import topk_ops  # noqa: F401 - registers torch.ops.fxfuse.topk_*

fxfuse = torch.ops.fxfuse
aten = torch.ops.aten
prims = torch.ops.prims
MAX_K = 2048
INDEX_DTYPES = (torch.int32, torch.int64)

MASKED_FILL = (
    aten.masked_fill.Scalar,
    aten.masked_fill.Tensor,
    aten.masked_fill_.Scalar,
    aten.masked_fill_.Tensor,
)
WHERE_FILL_FIRST = (aten.where.self, aten.where.ScalarSelf)  # where(cond, fill, x)
WHERE_FILL_LAST = (aten.where.self, aten.where.ScalarOther)  # where(cond, x, fill)
INDEX_PUT = (aten.index_put.default, aten.index_put_.default)  # x[cond] = fill
NOT = (aten.bitwise_not.default, aten.logical_not.default)
OR = (aten.bitwise_or.Tensor, aten.__or__.Tensor, aten.logical_or.default)
AND = (aten.bitwise_and.Tensor, aten.__and__.Tensor, aten.logical_and.default)
COMPARE = {
    aten.ge.Tensor: "ge", aten.ge.Scalar: "ge", aten.gt.Tensor: "gt", aten.gt.Scalar: "gt",
    aten.le.Tensor: "le", aten.le.Scalar: "le", aten.lt.Tensor: "lt", aten.lt.Scalar: "lt",
    aten.eq.Tensor: "eq", aten.eq.Scalar: "eq", aten.ne.Tensor: "ne", aten.ne.Scalar: "ne",
}  # fmt: skip
SWAPPED = {"ge": "le", "gt": "lt", "le": "ge", "lt": "gt", "eq": "eq", "ne": "ne"}
NEGATED = {"ge": "lt", "gt": "le", "le": "gt", "lt": "ge", "eq": "ne", "ne": "eq"}
VIEWS = (
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.unsqueeze.default,
    aten.expand.default,
)
CASTS = (aten.to.dtype, aten._to_copy.default, prims.convert_element_type.default)
RSHIFT = (aten.__rshift__.Scalar, aten.bitwise_right_shift.Tensor_Scalar)
LSHIFT = (aten.__lshift__.Scalar, aten.bitwise_left_shift.Tensor_Scalar)
BIT_AND = (aten.__and__.Scalar, aten.bitwise_and.Scalar)
BIT_OR = (aten.__or__.Tensor, aten.bitwise_or.Tensor)
FLOOR_DIV = (aten.floor_divide.default, aten.floor_divide.Scalar)
REMAINDER = (aten.remainder.Scalar,)
SORT = (aten.sort.default, aten.sort.stable)


# --- reading leaves -----------------------------------------------------------------------------


def _attr(node: fx.Node):
    obj = node.graph.owning_module
    for part in str(node.target).split("."):
        obj = getattr(obj, part, None)
    return obj


def constant_value(value):
    """The number a literal or a scalar-constant node holds (`full([], v)`, `scalar_tensor(v)`,
    a lifted 0-d constant), else None."""
    if isinstance(value, (bool, int, float)):
        return value
    if not isinstance(value, fx.Node):
        return None
    if value.op == "get_attr":
        t = _attr(value)
        ok = isinstance(t, torch.Tensor) and t.dim() == 0 and not t.is_meta
        return t.item() if ok and not isinstance(t, torch._subclasses.FakeTensor) else None
    if value.op != "call_function":
        return None
    if value.target is aten.full.default and list(value.args[0]) == []:
        return value.args[1]
    if value.target is aten.scalar_tensor.default:
        return value.args[0]
    if value.target in (aten.lift_fresh_copy.default, aten.clone.default, aten.detach.default):
        return constant_value(value.args[0])
    return None


class Const(Pat):
    """A scalar constant (a literal or a constant node, left unmatched so it may be shared), bound
    to `name` as its number."""

    def __init__(self, name: str | None = None):
        self.name = name

    def match(self, value, state):
        number = constant_value(value)
        if number is None:
            return
        state = state.copy()
        if self._bind(number, state):
            yield state


class ListOf(Pat):
    """A list argument (index_put's indices) whose items match `pats`."""

    def __init__(self, *pats: Pat):
        self.pats, self.name = pats, None

    def match(self, value, state):
        if not isinstance(value, (list, tuple)) or len(value) != len(self.pats):
            return
        yield from _match_items(list(zip(self.pats, value)), state)


def _match_items(pairs, state):
    if not pairs:
        yield state
        return
    (pat, value), rest = pairs[0], pairs[1:]
    for result in pat.match(value, state):
        yield from _match_items(rest, result)


def _strip(node, targets=VIEWS + CASTS):
    """The node under a chain of views / casts; a cast that may change a value (to a narrower
    int: `lengths.to(torch.int8)`; between ints and floats) is not stripped."""
    while isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets:
        if node.target in CASTS and not _keeps_values(node.args[0], node):
            break
        node = node.args[0]
    return node


def _keeps_values(src, cast: fx.Node) -> bool:
    """Every value of src's dtype is one of the cast's dtype."""
    a, b = val(src), val(cast)
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return False
    if a.dtype == b.dtype:
        return True
    if a.dtype.is_floating_point and b.dtype.is_floating_point:
        # range and precision both (fp16 → bf16 widens the range but loses digits)
        fa, fb = torch.finfo(a.dtype), torch.finfo(b.dtype)
        return fb.max >= fa.max and fb.eps <= fa.eps and fb.tiny <= fa.tiny
    if a.dtype.is_floating_point or b.dtype.is_floating_point:
        return False
    if b.dtype == torch.bool:
        return a.dtype == torch.bool
    if a.dtype == torch.bool:
        return True
    ia, ib = torch.iinfo(a.dtype), torch.iinfo(b.dtype)
    return ib.min <= ia.min and ib.max >= ia.max


def _arange_length(node) -> int | None:
    """L when node is arange(L) (start 0, step 1) viewed to (1, .., 1, L)."""
    v = val(node)
    if not isinstance(v, torch.Tensor) or v.dim() < 1 or any(s != 1 for s in v.shape[:-1]):
        return None
    src = _strip(node)
    if not (isinstance(src, fx.Node) and src.op == "call_function"):
        return None
    args = list(src.args)
    kwargs = src.kwargs
    if src.target is aten.arange.default:
        start, end, step = 0, args[0], 1
    elif src.target is aten.arange.start:
        start, end, step = args[0], args[1], 1
    elif src.target is aten.arange.start_step:
        start, end, step = args[0], args[1], args[2]
    elif src.target is prims.iota.default:
        start, end, step = kwargs.get("start", 0), args[0], kwargs.get("step", 1)
    else:
        return None
    length = static_int(end)
    if start != 0 or step != 1 or length is None or static_int(v.shape[-1]) != length:
        return None
    return length


def _peel(node, and_true: bool = False) -> tuple[object, bool]:
    """(inner, negate): `node` under its NOTs (and, with and_true, `& True`s: Inductor's tril),
    negate when an odd number of NOTs wrapped it."""
    negate = False
    while isinstance(node, fx.Node) and node.op == "call_function":
        if node.target in NOT:
            node, negate = node.args[0], not negate
        elif and_true and node.target in (aten.logical_and.default, aten.bitwise_and.Tensor):
            a, b = node.args[:2]
            if _is_true(b):
                node = a
            elif _is_true(a):
                node = b
            else:
                break
        else:
            break
    return node, negate


def comparison(node, is_subject: Callable) -> tuple[str, object] | None:
    """(op, other) such that `node` is `subject op other` (negations folded), else None."""
    node, negate = _peel(node)
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target in COMPARE):
        return None
    op, (a, b) = COMPARE[node.target], node.args[:2]
    if is_subject(a):
        other = b
    elif is_subject(b):
        op, other = SWAPPED[op], a
    else:
        return None
    return (NEGATED[op] if negate else op), other


def affine(value) -> tuple[object, int] | None:
    """(base, c) with value = base + c for an int literal c (base None for a literal)."""
    number = constant_value(value)
    if isinstance(number, int) and not isinstance(number, bool):
        return None, number
    if not isinstance(value, fx.Node):
        return None
    if value.op == "call_function" and value.target in ADD + SUB and len(value.args) >= 2:
        alpha = value.kwargs.get("alpha", 1)
        c = constant_value(value.args[1])
        if isinstance(c, int) and not isinstance(c, bool) and alpha == 1:
            inner = affine(value.args[0])
            if inner is not None and inner[0] is not None:
                return inner[0], inner[1] + (c if value.target in ADD else -c)
    return value, 0


def length_test(node, is_subject) -> tuple[object, int, bool] | None:
    """A test `subject >= n` / `subject < n` (any spelling of either) on an index: (base, offset,
    past) with n = base + offset; past: the test holds for indices at or beyond n."""
    cmp = comparison(node, is_subject)
    if cmp is None or cmp[0] in ("eq", "ne"):
        return None
    op, other = cmp
    bound = affine(other)
    if bound is None:
        return None
    base, offset = bound
    offset += 1 if op in ("gt", "le") else 0
    return base, offset, op in ("ge", "gt")


def _filled_past(m: Match, prefix: str, is_subject) -> tuple[object, int] | str:
    """(base, offset) of n when the fill named `prefix` writes exactly the indices >= n."""
    bad, ok = m.get(f"{prefix}_bad"), m.get(f"{prefix}_ok")
    test = length_test(bad if bad is not None else ok, is_subject)
    if test is None:
        return "its condition is not a length test (index >= n)"
    base, offset, past = test
    if past != (bad is not None):
        return "it fills the indices below the length, not past it"
    return base, offset


def _index_of(length: int):
    return lambda node: _arange_length(node) == length


def _is_node(target):
    return lambda node: same_value(node, target)


def _lengths_rows(insert: Inserter, base, offset: int, lead) -> fx.Node:
    """A (rows,) tensor of base + offset broadcast over the leading dims `lead`."""
    if isinstance(base, _RowIndex):
        base = insert.call(aten.arange.default, (base.rows,),
                           {"dtype": torch.int64, "device": base.device})  # fmt: skip
        base = insert.call(aten.reshape.default, (base, [-1, 1]))
    bv = val(base)
    if bv.dim() == len(lead) + 1 and all(same_size(a, b) for a, b in zip(bv.shape[:-1], lead)):
        rows = insert.call(aten.reshape.default, (base, [-1]))
    else:
        rows = insert.call(aten.expand.default, (base, [*lead, 1]))
        rows = insert.call(aten.reshape.default, (rows, [-1]))
    if offset:
        rows = insert.call(aten.add.Tensor, (rows, offset))
    return rows


def _check_lengths_base(base, lead) -> str | None:
    bv = val(base)
    if not isinstance(bv, torch.Tensor) or bv.dtype not in INDEX_DTYPES:
        return "the row length is not an int32 / int64 tensor"
    if bv.dim() < 1 or bv.dim() > len(lead) + 1 or bv.shape[-1] != 1:
        return f"the row length {tuple(bv.shape)} is not a column over the rows"
    if bv.dim() == len(lead) + 1 and all(same_size(a, b) for a, b in zip(bv.shape[:-1], lead)):
        return None
    if any(static_int(s) is None for s in lead):
        return "the row length broadcasts over symbolic dims"
    try:
        torch.broadcast_shapes(tuple(bv.shape), (*lead, 1))
    except RuntimeError:
        return f"the row length {tuple(bv.shape)} does not broadcast over the rows {tuple(lead)}"
    return None


def _unclone(node):
    """`x.clone()` before an in-place masked_fill_ reads x (the clone feeds only the fill)."""
    if node.op == "call_function" and node.target is aten.clone.default and len(node.users) == 1:
        return node.args[0]
    return node


# --- pattern pieces -------------------------------------------------------------------------------


class _Full(Pat):
    """A tensor holding one value everywhere, `full_like(t, v)` or `full(shape, v)`, whose v
    matches `value` (a Const); the node belongs to the match."""

    def __init__(self, value: Pat):
        self.value, self.name = value, None

    def match(self, value, state):
        if (
            isinstance(value, fx.Node)
            and value.op == "call_function"
            and value.target in (aten.full_like.default, aten.full.default)
            and len(value.args) >= 2
        ):
            state = state.copy()
            state.nodes.append(value)  # part of the match: `full_like(idx, v)` reads idx
            yield from self.value.match(value.args[1], state)


class _KeepsShape(Pat):
    """`inner` (a where) only where its result has the shape of its argument `arg`, the tensor
    it fills: a filled tensor or a condition must not broadcast it to more elements."""

    def __init__(self, inner: Pat, arg: int):
        self.inner, self.arg, self.name = inner, arg, None

    def match(self, value, state):
        if not isinstance(value, fx.Node) or len(value.args) <= self.arg:
            return
        out, filled = val(value), val(value.args[self.arg])
        if not isinstance(out, torch.Tensor) or not isinstance(filled, torch.Tensor):
            return
        if out.dim() != filled.dim() or not all(map(same_size, out.shape, filled.shape)):
            return
        yield from self.inner.match(value, state)


def _fill(x: Pat, cond: Callable[[str], Pat], fill: Pat, prefix: str) -> Pat:
    """x with `fill` where cond holds: masked_fill(x, bad, v), where(bad, v, x), where(ok, x, v),
    x[bad] = v, the where's v also a tensor of v (`full_like(x, v)`) that leaves x's shape. The
    condition binds as `{prefix}_bad` or `{prefix}_ok`; the node as `prefix`."""
    bad, ok = cond(f"{prefix}_bad"), cond(f"{prefix}_ok")
    return Alt(
        Op(MASKED_FILL, x, bad, fill),
        Op(WHERE_FILL_FIRST, bad, fill, x),
        Op(WHERE_FILL_LAST, ok, x, fill),
        Op(INDEX_PUT, x, ListOf(bad), fill, False),
        _KeepsShape(Op(aten.where.self, bad, _Full(fill), x), 2),
        _KeepsShape(Op(aten.where.self, ok, x, _Full(fill)), 1),
        name=prefix,
    )


def _test_of(subject: str) -> Callable[[str], Pat]:
    """A comparison of the node bound as `subject` with anything (either side, maybe negated)."""

    def cmp(name):
        forward = Op(tuple(COMPARE), Any(subject), Any())
        backward = Op(tuple(COMPARE), Any(), Any(subject))
        return Alt(forward, backward, Op(NOT, Alt(forward, backward)), name=name)

    return cmp


def _leaf(name: str) -> Pat:
    return Any(name)


class _Sets(Pat):
    """`inner`, binding the names in `values` as well (what a spelling implies, not spells)."""

    def __init__(self, inner: Pat, **values):
        self.inner, self.values, self.name = inner, values, None

    def match(self, value, state):
        for result in self.inner.match(value, state):
            result = result.copy()
            if all(Lit(name, v)._bind(v, result) for name, v in self.values.items()):
                yield result


def _sorted_prefix(scores: Pat) -> Pat:
    """The first k indices of a descending sort, `argsort(s, descending=True)[..., :k]` or
    `sort(s, descending=True).indices[..., :k]`: a sorted top-k (the slice's dim binds as
    `prefix_dim`; the guard checks it is the sort's)."""
    descending = Lit(value=True)
    order = Alt(
        Getitem(Op(aten.sort.default, scores, Lit("dim"), descending), 1),
        Getitem(Op(aten.sort.stable, scores, Lit(), Lit("dim"), descending), 1),
        Op(aten.argsort.default, scores, Lit("dim"), descending),
        Op(aten.argsort.stable, scores, Lit(), Lit("dim"), descending),
    )
    start = Alt(Lit(value=0), Lit(value=None))
    prefix = Op(aten.slice.Tensor, order, Lit("prefix_dim"), start, Lit("k"), Lit(value=1))
    return _Sets(prefix, largest=True, sorted=True)


def _topk_indices(scores: Pat) -> Pat:
    topk = Op(aten.topk.default, scores, Lit("k"), Lit("dim"), Lit("largest"), Lit("sorted"),
              name="topk")  # fmt: skip
    indices = Alt(Getitem(topk, 1), _sorted_prefix(scores))
    # Up to two casts: HF's DeepSeek-V3.2 takes `.to(torch.int32)` and scatters `.long()` of it
    # (`_check_topk` rejects a cast that does not hold every index).
    return Alt(Cast(Cast(indices)), Cast(indices), indices, name="idx")


class _Checked(Pat):
    """`pat` where `check(bindings)` returns extra bindings (a dict); elsewhere no match, so an
    enclosing Alt goes on to its next alternative instead of failing the rule's guard."""

    def __init__(self, pat: Pat, check: Callable[[dict], dict | None]):
        self.pat, self.check, self.name = pat, check, None

    def match(self, value, state):
        for result in self.pat.match(value, state):
            extra = self.check(result.bindings)
            if extra is not None:
                result = result.copy()
                result.bindings.update(extra)
                yield result


def _is_true(node) -> bool:
    """A literal True or a tensor filled with True (`ones(..., dtype=bool)`, `full(.., True)`)."""
    if constant_value(node) is True:
        return True
    if not (isinstance(node, fx.Node) and node.op == "call_function"):
        return False
    if node.target is aten.full.default:
        return node.args[1] is True
    return node.target is aten.ones.default and node.kwargs.get("dtype") is torch.bool


@dataclasses.dataclass(frozen=True)
class _RowIndex:
    """The query row index q of a (rows, L) causal mask spelled as tril / triu: no node holds
    it, so the replacement makes arange(rows)."""

    rows: int
    device: torch.device


def _is_row_column(node, rows) -> bool:
    """An int tensor (rows, 1), maybe with leading 1s: one value per query row."""
    v = val(node)
    return (
        isinstance(v, torch.Tensor) and v.dtype in INDEX_DTYPES and v.dim() >= 2
        and v.shape[-1] == 1 and same_size(v.shape[-2], rows) and all(d == 1 for d in v.shape[:-2])
    )  # fmt: skip


def _causal_limit(cond, length: int, rows) -> tuple[object, int, bool] | None:
    """(base, offset, past) when `cond` tests `col >= base + offset` (past) or `col < base +
    offset` on the column index col (arange(L) over the last dim) against a per-row column base:
    `length_test`'s spellings, negated, anded with True (Inductor's tril), as a difference
    `col - base op c` / `base - col op c`, or `tril` / `triu` of a True tensor."""
    inner, negate = _peel(cond, and_true=True)
    if not (isinstance(inner, fx.Node) and inner.op == "call_function"):
        return None
    if inner.target in (aten.tril.default, aten.triu.default):
        # tril(ones, d): visible = col < q + d + 1; triu(ones, d): col >= q + d.
        v, rows_n = val(inner), static_int(rows)
        if not (_is_true(inner.args[0]) and v is not None and v.dim() == 2 and rows_n is not None
                and static_int(v.shape[0]) == rows_n and static_int(v.shape[1]) == length):
            return None  # fmt: skip
        d = inner.args[1] if len(inner.args) > 1 else inner.kwargs.get("diagonal", 0)
        if not isinstance(d, int) or isinstance(d, bool):
            return None
        tril = inner.target is aten.tril.default
        return _RowIndex(rows_n, v.device), d + 1 if tril else d, tril == negate
    # col against a row column (+ c)
    test = length_test(inner, _index_of(length))
    if test is not None:
        base, offset, past = test
        if base is None or not _is_row_column(base, rows):
            return None
        return base, offset, past != negate
    # (col - row) or (row - col) against a constant c
    for sign in (1, -1):
        rows_seen = []
        test = length_test(inner, _difference(length, rows, sign, rows_seen))
        if test is not None and test[0] is None:
            _, c, past = test
            if sign > 0:  # col - row >= c  <=>  col >= row + c
                return rows_seen[0], c, past != negate
            # row - col >= c  <=>  col < row - c + 1
            return rows_seen[0], 1 - c, past == negate
    return None


def _difference(length: int, rows, sign: int, found: list) -> Callable:
    """is_subject for `col - row` (sign 1) or `row - col` (sign -1); appends the row column."""
    is_col = _index_of(length)

    def is_diff(node) -> bool:
        if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target in SUB):
            return False
        x, y = node.args[:2]
        col, row = (x, y) if sign > 0 else (y, x)
        if node.kwargs.get("alpha", 1) != 1 or not is_col(col) or not _is_row_column(row, rows):
            return False
        found.append(row)
        return True

    return is_diff


def _causal_bias(b: dict) -> dict | None:
    """scores + bias, bias = 0 with -inf at the columns >= each row's limit (a causal mask added
    to the scores, as DeepSeek-V3.2's indexer spells it): the same top-k as the scores masked
    past that limit, so it binds the limit as the score masking's (`score_rows`, `score_offset`)."""
    if b.get("bias_alpha", 1) != 1:
        return None
    fill = b["bias_fill"]
    if not (isinstance(fill, float) and fill == -math.inf):
        return None
    zeros = b["bias_base"]
    if not (
        isinstance(zeros, fx.Node) and zeros.op == "call_function"
        and (
            (zeros.target is aten.full.default and zeros.args[1] in (0, 0.0))
            or zeros.target is aten.zeros.default
        )
    ):  # fmt: skip
        return None
    scores, add = val(b["scores"]), val(b["bias_add"])
    bias = val(b["causal"])
    if not all(isinstance(t, torch.Tensor) for t in (scores, add, bias)) or scores.dim() < 2:
        return None
    if tuple(add.shape) != tuple(scores.shape) or bias.dim() > scores.dim():
        return None
    length = static_int(scores.shape[-1])
    if length is None:
        return None
    bad, ok = b.get("causal_bad"), b.get("causal_ok")
    test = _causal_limit(bad if bad is not None else ok, length, scores.shape[-2])
    if test is None:
        return None
    base, offset, past = test
    if past != (bad is not None):  # the -inf must go past the limit, not before it
        return None
    return {"score_rows": base, "score_offset": offset}


# Scores, optionally masked past each row's length: masked_fill(scores, cols >= n, -inf), or a
# causal -inf bias added to them.
def _length_masked(b: dict) -> dict | None:
    """{} where the masking fill's condition is a length test (index >= n); else None, and the
    masked scores are plain scores (a causal or padding mask of any shape: the fill is a score
    like any other, what it ranks as is what the graph computes)."""
    scores = val(b["scores"])
    length = static_int(scores.shape[-1]) if isinstance(scores, torch.Tensor) else None
    if length is None or isinstance(_filled_past(b, "score_masking", _index_of(length)), str):
        return None
    return {}


_masked_scores = _Checked(
    _fill(Any("scores"), _leaf, Const("score_fill"), "score_masking"), _length_masked
)
_bias = _fill(Any("bias_base"), _leaf, Const("bias_fill"), "causal")
_biased_scores = _Checked(
    Op(aten.add.Tensor, Any("scores"), _bias, commutative=True, alpha=Lit("bias_alpha"),
       name="bias_add"),
    _causal_bias,
)  # fmt: skip
_scores = Alt(_masked_scores, _biased_scores, Any("scores"))
_idx = _topk_indices(_scores)
# Indices past the row's length replaced by a negative pad (`topk + masked_fill(-1)`).
_idx_checked = Alt(
    _fill(_idx, _test_of("idx"), Const("idx_fill"), "idx_masking"), _idx, name="idx_m"
)


def _check_topk(m: Match, scores, min_dims: int = 2, max_dims: int = 8) -> str | None:
    scores = val(scores)
    if not isinstance(scores, torch.Tensor) or scores.dtype not in FLOAT_DTYPES:
        return f"top-k over {getattr(scores, 'dtype', None)} scores, not fp32 / bf16 / fp16"
    if not min_dims <= scores.dim() <= max_dims:
        return f"top-k over {scores.dim()}-D scores"
    if not is_last_dim(m["dim"], scores.dim()):
        return f"top-k over dim {m['dim']}, not the last dim"
    if m.get("prefix_dim") is not None and not is_last_dim(m["prefix_dim"], scores.dim()):
        return f"the sorted indices are sliced along dim {m['prefix_dim']}, not the last dim"
    if m["largest"] is not True:
        return "top-k of the smallest (largest=False)"
    k = m["k"]
    if not isinstance(k, int) or not 1 <= k <= MAX_K:
        return f"k = {k} is not a static int in [1, {MAX_K}]"
    length = static_int(scores.shape[-1])
    if length is None:
        return "the row length L is symbolic"
    if k > length:
        return f"k = {k} exceeds the row length {length}"
    return _lossy_index_cast(m.get("idx"), length)


def _lossy_index_cast(idx, length: int) -> str | None:
    """Why a cast on the indices' way from the top-k changes them (a float, an unsigned or a too
    narrow integer: the padding is -1 and indices reach length - 1), or None."""
    node, dtype = cast_source(idx)
    while dtype is not None:
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool or (
            not torch.iinfo(dtype).min < 0 or torch.iinfo(dtype).max < length - 1
        ):
            return f"the indices are cast to {dtype}, which does not hold 0 .. {length - 1} and -1"
        node, dtype = cast_source(node)
    return None


def _score_lengths(m: Match) -> tuple[object, int] | str | None:
    """(base, offset) of each row's length when the scores are masked past it, None when they are
    not masked, or a reason."""
    if m.get("bias_add") is not None:  # a causal bias (`_causal_bias` checked its form)
        base, lead = m["score_rows"], tuple(val(m["scores"]).shape[:-1])
        if isinstance(base, _RowIndex):
            reason = None if all(static_int(d) is not None for d in lead) else (
                "the causal rows broadcast over symbolic dims")  # fmt: skip
        else:
            reason = _check_lengths_base(base, lead)
        return reason or (base, m["score_offset"])
    if m.get("score_masking") is None:
        return None
    fill = m["score_fill"]
    if not (isinstance(fill, float) and fill == -math.inf):
        return f"the scores are masked with {fill!r}, not -inf"
    scores = val(m["scores"])
    found = _filled_past(m, "score_masking", _index_of(static_int(scores.shape[-1])))
    if isinstance(found, str):
        return f"score masking: {found}"
    reason = (
        _check_lengths_base(found[0], tuple(scores.shape[:-1]))
        if found[0] is not None
        else ("the row length is a constant")
    )
    return reason or found


def _idx_lengths_agree(m: Match, lengths, prefix: str, subject: str) -> str | None:
    """The fill `prefix` on the indices drops exactly those at or past the scores' row length."""
    found = _filled_past(m, prefix, _is_node(m[subject]))
    if isinstance(found, str):
        return f"index check: {found}"
    if _strip(found[0]) is not _strip(lengths[0]) or found[1] != lengths[1]:
        return "the index check uses another length than the score masking"
    return None


def _negativity(m: Match, prefix: str, subject: str, pad) -> str | None:
    """The fill `prefix` on the padded indices tests exactly `index < 0` (padding is negative)."""
    bad, ok = m.get(f"{prefix}_bad"), m.get(f"{prefix}_ok")
    cmp = comparison(bad if bad is not None else ok, _is_node(m[subject]))
    if cmp is None:
        return "its condition is not a test of the padded index"
    op, other = cmp
    bound = constant_value(other)
    if bad is None:
        op = NEGATED[op]
    negative = {("lt", 0), ("le", -1), ("eq", pad)}
    if not isinstance(bound, int) or (op, bound) not in negative:
        return f"it tests index {op} {other!r}, not index < 0"
    return None


# --- topk_page_transform ------------------------------------------------------------------------

_safe = Alt(
    Op(aten.clamp.default, _idx_checked, Lit("clamp_lo"), Lit("clamp_hi")),
    Op(aten.clamp_min.default, _idx_checked, Lit("clamp_lo")),
    _fill(_idx_checked, _test_of("idx_m"), Const("safe_fill"), "safe_fill_op"),
    _fill(_idx_checked, _test_of("idx"), Const("safe_fill"), "safe_fill_op"),
    _idx_checked,
    name="safe",
)
_page_rows = Alt(
    Op(aten.index.Tensor, Any("page_table"), ListOf(Any("row_to_batch")), name="rows_of_batch"),
    Op(aten.index_select.default, Any("page_table"), 0, Any("row_to_batch"), name="rows_of_batch"),
    Any("page_table"),
)


def _gather(index: Pat) -> Pat:
    gather = Op(aten.gather.default, _page_rows, Lit("gather_dim"), index, name="gather")
    return Alt(Cast(gather), gather)


_page_of = Alt(
    Op(RSHIFT, _safe, Lit("shift")),
    Op(FLOOR_DIV, _safe, Lit("page_div")),
    Op(aten.div.Tensor_mode, _safe, Lit("page_div"), rounding_mode="floor"),
)
_offset_in_page = Alt(
    Op(BIT_AND, _safe, Lit("offset_mask")), Op(REMAINDER, _safe, Lit("offset_mod"))
)
_page_base = Alt(
    Op(LSHIFT, _gather(_page_of), Lit("shift_back")),
    Op(MUL, _gather(_page_of), Lit("page_mul"), commutative=True),
)
_transformed = Alt(
    Op(BIT_OR, _page_base, _offset_in_page, commutative=True, name="paged"),
    Op(ADD, _page_base, _offset_in_page, commutative=True, name="paged"),
    _gather(_safe),
)
_page_out = _fill(
    Alt(Cast(_transformed), _transformed),
    lambda name: Alt(_test_of("idx_m")(name), _test_of("idx")(name), name=name),
    Const("out_fill"),
    "out_masking",
)
PAGE_TRANSFORM = Alt(Cast(_page_out), _page_out)


def _page_size(m: Match) -> int | str:
    """The page size the transform spells, checked for consistency; a reason if not."""
    if m.get("paged") is None:
        return 1
    shifts = [m.get(n) for n in ("shift", "shift_back") if m.get(n) is not None]
    sizes = [1 << s for s in shifts if isinstance(s, int) and 0 <= s < 31]
    if len(sizes) != len(shifts):
        return f"shift by {shifts}"
    sizes += [m.get(n) for n in ("page_div", "page_mul", "offset_mod") if m.get(n) is not None]
    if m.get("offset_mask") is not None:
        mask = m["offset_mask"]
        sizes.append(mask + 1 if isinstance(mask, int) else mask)
    if (
        not all(isinstance(s, int) and not isinstance(s, bool) for s in sizes)
        or len(set(sizes)) != 1
    ):
        return f"the page size is spelled inconsistently: {sizes}"
    size = sizes[0]
    if size < 1 or size & (size - 1):
        return f"page size {size} is not a power of 2"
    return size


def page_transform_guard(m: Match, ctx) -> str | None:
    reason = _check_topk(m, m["scores"], 2, 2) or _inplace_reason(m)
    if reason:
        return reason
    rows = val(m["scores"]).shape[0]
    lengths = _score_lengths(m)
    if lengths is None:
        return "the scores are not masked past a row length before the top-k"
    if isinstance(lengths, str):
        return lengths
    # Validity: either the indices were padded (idx >= n -> negative) and the output tests the
    # pad, or the output tests idx >= n itself.
    pad = m["out_fill"]
    if not isinstance(pad, int) or isinstance(pad, bool) or not -(2**31) <= pad < 2**31:
        return f"the output is padded with {pad!r}, not an int32"
    if m.get("idx_masking") is not None:
        reason = _idx_lengths_agree(m, lengths, "idx_masking", "idx")
        idx_pad = m["idx_fill"]
        if not reason and not (isinstance(idx_pad, int) and idx_pad < 0):
            reason = f"invalid indices are set to {idx_pad!r}, not a negative pad"
        if reason:
            return reason
    reason = _tests_validity(m, lengths, "out_masking")
    if reason:
        return f"output padding: {reason}"
    if m.get("safe_fill_op") is not None:
        if not isinstance(m["safe_fill"], int):
            return f"invalid indices gather at {m['safe_fill']!r}"
        reason = _tests_validity(m, lengths, "safe_fill_op")
        if reason:  # the fill moves exactly the invalid indices (the output drops them)
            return f"the safe gather index: {reason}"
    if m.get("clamp_lo") is not None and (m["clamp_lo"] != 0 or m.get("clamp_hi") is not None):
        return f"indices clamped to [{m['clamp_lo']}, {m.get('clamp_hi')}], not min=0"
    if m["gather_dim"] not in (1, -1):
        return f"the page table is gathered along dim {m['gather_dim']}"
    size = _page_size(m)
    if isinstance(size, str):
        return size
    table = val(m["page_table"])
    if not isinstance(table, torch.Tensor) or table.dim() != 2 or table.dtype not in INDEX_DTYPES:
        return "the page table is not a 2-D int32 / int64 tensor"
    r2b = m.get("row_to_batch")
    if r2b is not None:
        rv = val(r2b)
        if not isinstance(rv, torch.Tensor) or rv.dim() != 1 or rv.dtype not in INDEX_DTYPES:
            return "row_to_batch is not a 1-D int tensor"
        if not same_size(rv.shape[0], rows):
            return "row_to_batch does not have a row per score row"
    elif not same_size(table.shape[0], rows):
        return "the page table does not have a row per score row"
    out = val(m.root)
    if out.dtype not in INDEX_DTYPES:
        return f"the output is {out.dtype}"
    if table.dtype == torch.int64 and out.dtype == torch.int64:
        # An int32 result wraps as the graph's would only where the graph narrows it too.
        return "int64 page table and int64 output: the fused op computes int32 token ids"
    return None


def _tests_validity(m: Match, lengths, prefix: str) -> str | None:
    """The fill `prefix` selects exactly the invalid indices: idx at or past the row length, or
    the padded idx_m below 0."""
    if _strip(_subject_of(m, prefix)) is _strip(m["idx"]):
        return _idx_lengths_agree(m, lengths, prefix, "idx")
    if m.get("idx_masking") is not None:
        return _negativity(m, prefix, "idx_m", m["idx_fill"])
    return "the output is not masked by the index's validity"


def _subject_of(m: Match, prefix: str):
    """The index node the fill `prefix`'s condition tests (idx or idx_m)."""
    cond = m.get(f"{prefix}_bad")
    cond = cond if cond is not None else m.get(f"{prefix}_ok")
    for name in ("idx_m", "idx"):
        if comparison(cond, _is_node(m[name])) is not None:
            return m[name]
    return None


def page_transform_replace(m: Match, ctx, insert: Inserter):
    scores = m["scores"]
    base, offset = _score_lengths(m)
    lengths = _lengths_rows(insert, base, offset, tuple(val(scores).shape[:-1]))
    out = insert.call(
        fxfuse.topk_page_transform.default,
        (_unclone(scores), m["k"], lengths, m["page_table"], _page_size(m), None,
         m.get("row_to_batch"), bool(m["sorted"]), m["out_fill"]),
    )  # fmt: skip
    return [_cast_to(insert, out, val(m.root).dtype)]


def _cast_to(insert: Inserter, node: fx.Node, dtype: torch.dtype) -> fx.Node:
    if val(node).dtype == dtype:
        return node
    return insert.call(prims.convert_element_type.default, (node, dtype))


# --- topk_page_transform, packed rows: the offset transform ------------------------------------
# vLLM / TensorRT-LLM DSA prefill (their torch path, with DeepGEMM's reference logits): each row
# ranks only its window [ks, ke) of the packed keys, and its indices are made row-local:
#   scores.masked_fill(~((cols >= ks[:, None]) & (cols < ke[:, None])), -inf) → topk(k).indices
#   → idx - ks[:, None] → masked_fill(~((idx >= 0) & (idx - (ke - ks)[:, None] < 0)), -1)
# (also `-=`, where, or-of-outside tests, `local < (ke - ks)[:, None]`, a cast at the end).

_window_scores = _fill(Any("scores"), _leaf, Const("score_fill"), "window_masking")
_local = Op(
    (aten.sub.Tensor, aten.sub_.Tensor), _topk_indices(Alt(_window_scores, Any("scores"))),
    Any("local_start"),
    alpha=Lit("local_alpha"), name="local",
)  # fmt: skip


class _WithTests(Pat):
    """`inner`, with the nodes of the fill `prefix`'s condition that read the node bound as
    `subject` (a tree of tests on it, which the guard checks) taken into the match."""

    def __init__(self, inner: Pat, prefix: str, subject: str):
        self.inner, self.prefix, self.subject, self.name = inner, prefix, subject, None

    def match(self, value, state):
        for result in self.inner.match(value, state):
            subject = result.bindings[self.subject]
            bad = result.bindings.get(f"{self.prefix}_bad")
            reads: list[fx.Node] = []

            def visit(node) -> bool:
                if isinstance(node, (list, tuple)):
                    return any([visit(item) for item in node])
                if node is subject:
                    return True
                if not (isinstance(node, fx.Node) and node.op == "call_function"):
                    return False
                if any([visit(arg) for arg in node.args]):
                    reads.append(node)
                    return True
                return False

            visit(bad if bad is not None else result.bindings.get(f"{self.prefix}_ok"))
            result = result.copy()
            result.nodes.extend(reads)
            yield result


_local_out = _WithTests(
    _fill(_local, _leaf, Const("out_fill"), "out_masking"), "out_masking", "local"
)
PACKED_ROWS = Alt(Cast(_local_out), _local_out)


def _inside(m: Match, prefix: str) -> list[tuple[object, bool]] | None:
    """The atoms (node, negated) whose conjunction is where the fill `prefix` keeps its input
    (the negation of a `_bad` condition, or the `_ok` one), or None for other shapes: nested
    ands (or ors of the outside tests, by De Morgan) of single tests."""
    bad, ok = m.get(f"{prefix}_bad"), m.get(f"{prefix}_ok")
    atoms: list[tuple[object, bool]] = []

    def walk(node, negate: bool) -> bool:
        node, flipped = _peel(node)
        negate ^= flipped
        if isinstance(node, fx.Node) and node.op == "call_function" and (
            (node.target in AND and not negate) or (node.target in OR and negate)
        ):
            return walk(node.args[0], negate) and walk(node.args[1], negate)
        atoms.append((node, negate))
        return len(atoms) <= 4

    return atoms if walk(bad if bad is not None else ok, bad is not None) else None


def _window(m: Match, length: int) -> tuple[tuple[object, int], tuple[object, int]] | str:
    """((ks, c_lo), (ke, c_hi)) when the score masking keeps exactly the columns in
    [ks + c_lo, ke + c_hi) (per-row columns), else a reason."""
    atoms = _inside(m, "window_masking")
    bounds: dict[bool, tuple[object, int]] = {}
    for node, negate in atoms or ():
        test = length_test(node, _index_of(length))
        if test is None or test[0] is None:
            return "its condition is not a window test (cols >= ks) & (cols < ke)"
        base, offset, past = test
        lower = past != negate  # kept where col >= n: the window's start
        if lower in bounds:
            return "its condition tests one end of the window twice"
        bounds[lower] = (base, offset)
    if len(bounds) != 2:
        return "its condition is not a window test (cols >= ks) & (cols < ke)"
    return bounds[True], bounds[False]


def _local_bound(node, negate: bool, local) -> tuple[str, object, int] | None:
    """("lo", None, c) for a kept `local >= c`; ("hi", x, c) for a kept `local < x + c` (also
    spelled `local - x < c`)."""
    test = length_test(node, _is_node(local))
    if test is None:
        seen: list = []

        def is_diff(n) -> bool:
            ok = (
                isinstance(n, fx.Node) and n.op == "call_function" and n.target in SUB
                and n.kwargs.get("alpha", 1) == 1 and same_value(n.args[0], local)
            )  # fmt: skip
            if ok:
                seen.append(n.args[1])
            return ok

        test = length_test(node, is_diff)
        if test is None or test[0] is not None:
            return None
        test = (seen[0], test[1], test[2])
    base, offset, past = test
    if past != negate:  # kept where local >= base + offset
        return ("lo", None, offset) if base is None else None
    return "hi", base, offset


def _is_width(x, ks, ke) -> bool:
    """x is ke - ks, per row (`(ke - ks)[:, None]` or `ke[:, None] - ks[:, None]`)."""
    x = _strip(x)
    return (
        isinstance(x, fx.Node) and x.op == "call_function" and x.target in SUB
        and x.kwargs.get("alpha", 1) == 1
        and _strip(x.args[0]) is _strip(ke) and _strip(x.args[1]) is _strip(ks)
    )  # fmt: skip


def packed_rows_guard(m: Match, ctx) -> str | None:
    reason = _check_topk(m, m["scores"], 2, 2) or _inplace_reason(m)
    if reason:
        return reason
    scores = val(m["scores"])
    length, lead = static_int(scores.shape[-1]), tuple(scores.shape[:-1])
    if m.get("window_masking") is None:
        return "the scores are not masked to the row's window [ks, ke) before the top-k"
    fill = m["score_fill"]
    if not (isinstance(fill, float) and fill == -math.inf):
        return f"the scores outside the window are masked with {fill!r}, not -inf"
    window = _window(m, length)
    if isinstance(window, str):
        return f"score masking: {window}"
    (ks, c_lo), (ke, c_hi) = window
    reason = _check_lengths_base(ks, lead) or _check_lengths_base(ke, lead)
    if reason:
        return f"the window bounds: {reason}"
    if m["local_alpha"] != 1 or _strip(m["local_start"]) is not _strip(ks) or c_lo != 0:
        return "the indices are not made local by subtracting the window's start"
    pad = m["out_fill"]
    if not isinstance(pad, int) or isinstance(pad, bool) or not -(2**31) <= pad < 0:
        return f"the output is padded with {pad!r}, not a negative int32"
    not_window = "output padding: its condition is not (local >= 0) & (local < ke - ks)"
    atoms = _inside(m, "out_masking")
    if atoms is None:
        return not_window
    kept = {}
    for node, negate in atoms:
        bound = _local_bound(node, negate, m["local"])
        if bound is None or bound[0] in kept:
            return not_window
        kept[bound[0]] = bound[1:]
    if kept.get("lo") != (None, 0) or "hi" not in kept:
        return "output padding: it does not keep exactly 0 <= local < the window's width"
    x, c = kept["hi"]
    if not (_is_width(x, ks, ke) and c == c_hi):
        return "output padding: its upper bound is not the window's width ke - ks"
    if val(m.root).dtype not in INDEX_DTYPES:
        return f"the output is {val(m.root).dtype}"
    return None


def packed_rows_replace(m: Match, ctx, insert: Inserter):
    """The op reads [clamp(ks, 0, L), ke) and gives indices from the clamped start; the shift
    start - ks (0 unless ks < 0) makes them local to ks itself, as the spelled chain does."""
    scores = m["scores"]
    length, lead = static_int(val(scores).shape[-1]), tuple(val(scores).shape[:-1])
    (ks, _), (ke, c_hi) = _window(m, length)
    ks = _lengths_rows(insert, ks, 0, lead)
    start = insert.call(aten.clamp_min.default, (ks, 0))  # no aten.clamp: Inductor's
    start = insert.call(aten.clamp_max.default, (start, length))  # post-grad graph lowers none
    lengths = insert.call(aten.sub.Tensor, (_lengths_rows(insert, ke, c_hi, lead), start))
    out = insert.call(
        fxfuse.topk_page_transform.default,
        (_unclone(scores), m["k"], lengths, None, 1, start, None, bool(m["sorted"]),
         m["out_fill"]),
    )  # fmt: skip
    shift = insert.call(aten.sub.Tensor, (start, ks))
    shift = insert.call(aten.unsqueeze.default, (_cast_to(insert, shift, torch.int32), 1))
    valid = insert.call(aten.ge.Scalar, (out, 0))
    out = insert.call(aten.where.self, (valid, insert.call(aten.add.Tensor, (out, shift)), out))
    return [_cast_to(insert, out, val(m.root).dtype)]


# --- topk_mask ----------------------------------------------------------------------------------

_mask_base = Alt(
    Op(aten.full.default, Lit("base_shape"), Const("masked_value"), name="base"),
    Op(aten.ones.default, Lit("base_shape"), name="base_ones"),
    Op(aten.zeros.default, Lit("base_shape"), name="base_zeros"),
    Op(aten.full_like.default, Any(), Const("masked_value"), name="base"),
    Op(aten.ones_like.default, Any(), name="base_ones"),
    Op(aten.zeros_like.default, Any(), name="base_zeros"),
    Op(aten.new_full.default, Any(), Lit("base_shape"), Const("masked_value"), name="base"),
    Op(aten.new_ones.default, Any(), Lit("base_shape"), name="base_ones"),
    Op(aten.new_zeros.default, Any(), Lit("base_shape"), name="base_zeros"),
)


def _scatter(indices: Pat) -> Pat:
    """The scatter into the mask; the indices maybe unsqueezed, into a base of one more (size 1)
    dim (HF DeepSeek-V4: `bias.scatter_(-1, safe.unsqueeze(1), 0.0)` on (B, 1, S, T + 1))."""
    indices = Alt(Op(aten.unsqueeze.default, indices, Lit("mask_dim"), name="unsqueezed"), indices)
    return Op((aten.scatter.value, aten.scatter_.value), _mask_base, Lit("scatter_dim"), indices,
              Const("selected_value"), name="scatter")  # fmt: skip


def _score_is_neg_inf(name: str) -> Pat:
    """`values == -inf` (or `values.isneginf()`) of the top-k's own values; the guard checks the
    top-k is the indices' and the value -inf."""
    values = Getitem(Any("topk"), 0)
    return Alt(
        Op((aten.eq.Scalar, aten.eq.Tensor), values, Const("pad_score"), commutative=True),
        Op(aten.isneginf.default, values),
        name=name,
    )  # fmt: skip


# The picks of -inf scores padded (MiniMax-M3 in HF: `idx.masked_fill(values == -inf, -1)`).
_mask_idx = Alt(
    _fill(_idx, _score_is_neg_inf, Const("idx_fill"), "value_masking"), _idx_checked, name="idx_v"
)
# Padding sent to a throwaway column L (where(idx < 0, L, idx)), which is then sliced off.
_to_throwaway = _fill(_mask_idx, _test_of("idx_v"), Const("throwaway"), "throwaway_op")
_sliced = Alt(
    Op(aten.slice.Tensor, _scatter(_to_throwaway), Lit("slice_dim"), Lit("slice_start"),
       Lit("slice_end"), Lit("slice_step"), name="drop_column"),
    _scatter(_idx_checked),
)  # fmt: skip


def _repeat_last(x: Pat) -> Pat:
    """x.repeat_interleave(r, -1), also as x[..., None].expand(..., r).reshape (what Inductor
    decomposes it into); binds `repeat`."""
    expanded = Op(aten.expand.default, Op(aten.unsqueeze.default, x, Lit("unsqueeze_dim")),
                  Lit("expand_sizes"))  # fmt: skip
    return Alt(
        Op(aten.repeat_interleave.self_int, x, Lit("repeats"), Lit("repeat_dim"), name="repeat"),
        Op(VIEWS[:3], Alt(Op(aten.clone.default, expanded), expanded), Lit("repeat_shape"),
           name="repeat"),
    )  # fmt: skip


# `mask == v` / `mask != v`: the mask's two values compared to a constant, a boolean mask (HF
# MiniMax-M3's `(bias == 0.0)` keep mask).
_compared = Alt(
    Op((aten.eq.Scalar, aten.ne.Scalar), _sliced, Const("compare_value"), name="compare"), _sliced
)
_repeated = Alt(_repeat_last(_compared), _compared)
MASK = Alt(Cast(_repeated, "out_dtype"), _repeated)


def _repeat_count(m: Match, before: tuple) -> int | str:
    """How often `_repeat_last` repeats each element of a tensor of shape `before` (1 without
    it)."""
    node = m.get("repeat")
    if node is None:
        return 1
    length = static_int(before[-1])
    mask_dims = len(before)
    if node.target is aten.repeat_interleave.self_int:
        if not is_last_dim(m["repeat_dim"], mask_dims):
            return f"repeat_interleave along dim {m['repeat_dim']}, not the last"
        repeats = m["repeats"]
    else:
        if m["unsqueeze_dim"] not in (-1, mask_dims):
            return f"the mask is expanded along dim {m['unsqueeze_dim']}, not a new last dim"
        sizes = list(m["expand_sizes"])
        repeats = sizes[-1]
        lead = [static_int(s) for s in before]
        if len(sizes) != mask_dims + 1 or any(s not in (-1, d) for s, d in zip(sizes[:-1], lead)):
            return f"the mask is expanded to {sizes}"
        out = val(node)
        if tuple(out.shape[:-1]) != tuple(before[:-1]) or static_int(out.shape[-1]) != (
            length * repeats if isinstance(repeats, int) else None
        ):
            return f"the expanded mask is reshaped to {tuple(out.shape)}"
    if not isinstance(repeats, int) or repeats < 1:
        return f"the mask is repeated {repeats!r} times"
    return repeats


def _mask_values(m: Match) -> tuple[torch.dtype, float, float] | str:
    base = m.get("base") or m.get("base_ones") or m.get("base_zeros")
    dtype = val(base).dtype
    if m.get("base_ones") is not None:
        masked = 1
    elif m.get("base_zeros") is not None:
        masked = 0
    else:
        masked = m["masked_value"]
    selected = m["selected_value"]
    out_dtype = m.get("out_dtype")
    compare = m.get("compare")
    values = []
    for v in (masked, selected):
        try:
            t = torch.tensor(v).to(dtype)
            if compare is not None:
                t = t == m["compare_value"] if compare.target is aten.eq.Scalar else (
                    t != m["compare_value"])  # fmt: skip
            if out_dtype is not None:
                t = t.to(out_dtype)
        except (RuntimeError, TypeError):
            return f"mask value {v!r}"
        values.append(float(t.float()))
    final = out_dtype or (torch.bool if compare is not None else dtype)
    if final != torch.bool and final not in FLOAT_DTYPES:
        return f"a {final} mask"
    return final, values[0], values[1]


def mask_guard(m: Match, ctx) -> str | None:
    reason = _check_topk(m, m["scores"], 1) or _inplace_reason(m)
    if reason:
        return reason
    scores = val(m["scores"])
    length = static_int(scores.shape[-1])
    frame = _mask_frame(m, scores)
    if isinstance(frame, str):
        return frame
    if not is_last_dim(m["scatter_dim"], len(frame)):
        return f"the indices are scattered along dim {m['scatter_dim']}, not the last"
    base = val(m.get("base") or m.get("base_ones") or m.get("base_zeros"))
    throwaway = m.get("throwaway_op") is not None
    width = length + 1 if throwaway else length
    if tuple(base.shape[:-1]) != frame[:-1] or static_int(base.shape[-1]) != width:
        return f"the mask {tuple(base.shape)} is not shaped like the scores (+ a throwaway column)"
    if throwaway:
        if m["throwaway"] != length:
            return f"padding goes to column {m['throwaway']}, not the throwaway column {length}"
        drop = m.get("drop_column")
        if drop is None or not is_last_dim(m["slice_dim"], base.dim()):
            return "the throwaway column is not sliced off"
        if m["slice_start"] not in (0, None) or m["slice_end"] != length or m["slice_step"] != 1:
            return "the throwaway column is not sliced off exactly"
        if m.get("idx_masking") is None and m.get("value_masking") is None:
            return "the indices carry no padding for the throwaway column"
        reason = _negativity(m, "throwaway_op", "idx_v", m["idx_fill"]) or _value_padding(m)
        if reason:
            return f"throwaway column: {reason}"
    lengths = _score_lengths(m)
    if isinstance(lengths, str):
        return lengths
    if m.get("idx_masking") is not None:
        if lengths is None:
            return "indices checked against a length the scores were not masked with"
        reason = _idx_lengths_agree(m, lengths, "idx_masking", "idx")
        if reason:
            return reason
        if not throwaway:
            return "padded indices scattered without a throwaway column"
    block = _repeat_count(m, frame)
    if isinstance(block, str):
        return block
    values = _mask_values(m)
    if isinstance(values, str):
        return values
    if values[0] == values[1]:
        return "the mask has one value"
    return None


def _unsqueeze_at(m: Match, dims: int) -> int | str | None:
    """Where an unsqueeze of the indices puts the mask's extra size-1 dim (scores of `dims`
    dims; it must come before the last, which the indices are scattered along), or None."""
    if m.get("unsqueezed") is None:
        return None
    dim = m["mask_dim"]
    at = dim + dims + 1 if isinstance(dim, int) and dim < 0 else dim
    if not isinstance(at, int) or not 0 <= at < dims:
        return f"the indices are unsqueezed at dim {dim}, not before the last"
    return at


def _mask_frame(m: Match, scores: torch.Tensor) -> tuple | str:
    """The mask's shape before the repeat: the scores', with `_unsqueeze_at`'s dim inserted."""
    shape = tuple(scores.shape)
    at = _unsqueeze_at(m, len(shape))
    if at is None or isinstance(at, str):
        return at or shape
    return shape[:at] + (1,) + shape[at:]


def _value_padding(m: Match) -> str | None:
    """Why the picks padded by their score are not exactly the -inf ones of this top-k, or None."""
    if m.get("value_masking") is None:
        return None
    topk = m["topk"]
    source = _strip(m["idx"], CASTS)
    own = (
        isinstance(topk, fx.Node)
        and topk.target is aten.topk.default
        and source.target is operator.getitem
        and source.args == (topk, 1)
    )
    if not own:
        return "the indices are padded by the values of another top-k"
    pad_score = m.get("pad_score", -math.inf)
    if not (isinstance(pad_score, float) and pad_score == -math.inf):
        return f"the indices are padded where the score is {pad_score!r}, not -inf"
    fill = m["idx_fill"]
    if not isinstance(fill, int) or isinstance(fill, bool) or fill >= 0:
        return f"the -inf picks are padded with {fill!r}, not a negative index"
    return None


def mask_replace(m: Match, ctx, insert: Inserter):
    scores = m["scores"]
    lengths = _score_lengths(m)
    lengths_rows = None
    if lengths is not None:
        lead = tuple(val(scores).shape[:-1])
        lengths_rows = _lengths_rows(insert, *lengths, lead)
    dtype, masked, selected = _mask_values(m)
    # Without a throwaway column the graph scatters k indices even past a row's length: those
    # columns rank as -inf candidates (masked_tail) rather than being absent.
    masked_tail = lengths is not None and m.get("throwaway_op") is None
    frame = _mask_frame(m, val(scores))
    args = (_unclone(scores), m["k"], lengths_rows, _repeat_count(m, frame), dtype, masked,
            selected, masked_tail)  # fmt: skip
    if m.get("value_masking") is not None:  # the -inf picks padded: finite_only
        args += (True,)
    out = insert.call(fxfuse.topk_mask.default, args)
    at = _unsqueeze_at(m, val(scores).dim())
    if at is not None:  # the mask of one more (size 1) dim
        out = insert.call(aten.unsqueeze.default, (out, at))
    return [out]


# --- topk_block_table ---------------------------------------------------------------------------

_forced = _fill(Any("block_scores"), _leaf, Const("forced_fill"), "forcing")
_eligible = _fill(Alt(_forced, Any("block_scores")), _leaf, Const("ineligible_fill"), "causal")
_block_checked = _fill(_topk_indices(_eligible), _test_of("idx"), Const("big"), "idx_masking")
# (the guard reads the sort's dim and order)
_block_sorted = Alt(
    Getitem(Op(SORT, _block_checked, name="sort", dim=Any(), descending=Any()), 0),
    name="sorted_idx",
)
_blocks = _fill(_block_sorted, _test_of("sorted_idx"), Const("block_pad"), "pad_masking")
BLOCK_TABLE = Alt(Cast(_blocks), _blocks)


def _floor_div(node) -> tuple[fx.Node, int] | None:
    """(positions, block) when node is positions // block (floor_divide, div floor, >> log2)."""
    node = _strip(node, VIEWS)
    if not (isinstance(node, fx.Node) and node.op == "call_function"):
        return None
    args = node.args
    if node.target in FLOOR_DIV or (
        node.target is aten.div.Tensor_mode and node.kwargs.get("rounding_mode") == "floor"
    ):
        block = constant_value(args[1])
    elif node.target in RSHIFT:
        shift = constant_value(args[1])
        block = 1 << shift if isinstance(shift, int) and 0 <= shift < 31 else None
    else:
        return None
    if not isinstance(block, int) or isinstance(block, bool) or not isinstance(args[0], fx.Node):
        return None
    return args[0], block


def _block_positions(m: Match, base) -> tuple[fx.Node, int, int] | str:
    """(positions (Q,), block size, kv heads) behind the causal limit's column `base`."""
    scores = val(m["block_scores"])
    found = _floor_div(base)
    if found is None:
        return "the causal limit is not positions // block_size"
    positions, block = found
    pv, bv = val(positions), val(base)
    if not isinstance(pv, torch.Tensor) or pv.dtype not in INDEX_DTYPES:
        return "positions are not an int tensor"
    if block < 1 or block & (block - 1):
        return f"block size {block} is not a power of 2"
    # (Q, NB) with a (Q, 1) limit, or (Q, Hkv, NB) with a (Q, 1, 1) limit; Q may be symbolic.
    lead = scores.shape[:-1]
    heads = static_int(lead[1]) if len(lead) == 2 else 1
    if heads is None:
        return "a symbolic kv-head dim"

    def per_query(shape) -> bool:
        return (
            len(shape) >= 1
            and same_size(shape[0], lead[0])
            and all(static_int(d) == 1 for d in shape[1:])
        )

    if bv.dim() != len(lead) + 1 or not per_query(bv.shape) or not per_query(pv.shape):
        return f"the causal limit {tuple(bv.shape)} is not one position per query row"
    return positions, block, heads


def _forced_blocks(m: Match, block_ok) -> tuple[int, int] | str:
    """(n_init, n_local) from the forced mask: blk < n_init | blk > last - n_local."""
    if m.get("forcing") is None:
        return 0, 0
    if m["forced_fill"] != math.inf:
        return f"forced blocks get {m['forced_fill']!r}, not inf"
    if m.get("forcing_bad") is None:
        return "the forced blocks are spelled as a keep mask"
    nb = static_int(val(m["block_scores"]).shape[-1])
    is_blk = _index_of(nb)
    parts, pending = [], [m["forcing_bad"]]
    while pending:  # the tests of a chain of ORs, nested either way
        cond = pending.pop()
        if isinstance(cond, fx.Node) and cond.op == "call_function" and cond.target in OR:
            pending.extend(cond.args[:2])
        else:
            parts.append(cond)
    n_init = n_local = 0
    for part in parts:
        test = length_test(part, is_blk)
        if test is None:
            return "the forced mask is not init / local block tests"
        base, offset, past = test
        # Tests of one kind OR together into the widest; one that forces no block (blk < 0,
        # blk > last + 1: the causal limit drops those) counts as none.
        if base is None and not past:
            n_init = max(n_init, offset)  # blk < n_init
        elif base is not None and past and block_ok(base):
            n_local = max(n_local, 1 - offset)  # blk >= last + offset
        else:
            return "the forced mask is not blk < n_init | blk > last - n_local"
    return n_init, n_local


def _block_analysis(m: Match) -> dict | str:
    """What the block-table chain spells (positions, block size, heads, forced blocks), or why
    it is not the fused op's block table."""
    scores = val(m["block_scores"])
    nb = static_int(scores.shape[-1])
    if m["ineligible_fill"] != -math.inf:
        return f"ineligible blocks get {m['ineligible_fill']!r}, not -inf"
    causal = _filled_past(m, "causal", _index_of(nb))
    if isinstance(causal, str):
        return f"causal limit: {causal}"
    base, offset = causal
    if base is None or offset != 1:
        return "the causal limit is not blk <= positions // block_size"
    found = _block_positions(m, base)
    if isinstance(found, str):
        return found
    positions, block, heads = found

    def same_limit(node):
        other = _floor_div(node)
        return other is not None and _strip(other[0]) is _strip(positions) and other[1] == block

    forced = _forced_blocks(m, same_limit)
    if isinstance(forced, str):
        return forced
    return {"positions": positions, "block": block, "heads": heads, "forced": forced,
            "same_limit": same_limit}  # fmt: skip


def block_table_guard(m: Match, ctx) -> str | None:
    reason = _check_topk(m, m["block_scores"], 2, 3) or _inplace_reason(m)
    if reason:
        return reason
    nb = static_int(val(m["block_scores"]).shape[-1])
    spelled = _block_analysis(m)
    if isinstance(spelled, str):
        return spelled
    if sum(spelled["forced"]) > m["k"]:
        return f"n_init + n_local = {sum(spelled['forced'])} exceeds k = {m['k']}"
    check = _filled_past(m, "idx_masking", _is_node(m["idx"]))
    if isinstance(check, str):
        return f"index check: {check}"
    if not spelled["same_limit"](check[0]) or check[1] != 1:
        return "the index check is not idx > positions // block_size"
    big = m["big"]
    if not isinstance(big, int) or isinstance(big, bool) or big < nb:
        return f"ineligible indices become {big!r}, not a value >= the block count {nb}"
    sort_args = normalized_args(m["sort"])
    dim, descending = sort_args.get("dim", -1), sort_args.get("descending", False)
    if not is_last_dim(dim, val(m["block_scores"]).dim()) or descending:
        return "the block ids are not sorted ascending along the last dim"
    if m["block_pad"] != -1:
        return f"the block table is padded with {m['block_pad']!r}, not -1"
    bad, ok = m.get("pad_masking_bad"), m.get("pad_masking_ok")
    cmp = comparison(bad if bad is not None else ok, _is_node(m["sorted_idx"]))
    op, other = cmp if cmp else (None, None)
    if bad is None and op is not None:
        op = NEGATED[op]
    bound = constant_value(other)
    padding = isinstance(bound, int) and (
        (op == "eq" and bound == big) or (op in ("ge", "gt") and nb <= bound + (op == "gt") <= big)
    )
    if not padding:
        return "the padding test does not pick exactly the ineligible indices"
    if val(m.root).dtype not in INDEX_DTYPES:
        return f"the block table is {val(m.root).dtype}"
    return None


def block_table_replace(m: Match, ctx, insert: Inserter):
    spelled = _block_analysis(m)
    positions = insert.call(aten.reshape.default, (spelled["positions"], [-1]))
    n_init, n_local = spelled["forced"]
    # A page expansion spelled on these blocks is computed by the same kernel (the rule below
    # then reads it from the op's second output).
    pages_per_block = _spelled_pages_per_block(m.root, spelled["heads"])
    table = insert.call(
        fxfuse.topk_block_table.default,
        (_unclone(m["block_scores"]), m["k"], positions, spelled["block"], n_init, n_local,
         pages_per_block, spelled["heads"]),
    )  # fmt: skip
    blocks = insert.call(operator.getitem, (table, 0))
    return [_cast_to(insert, blocks, val(m.root).dtype)]


# Page expansion of a block table: page = block·ppb·Hkv + j·Hkv + h at slot s·ppb + j, -1 for
# padding; `blocks.repeat_interleave(ppb, -1) * ppb + arange(ppb).repeat(k)` or
# `(blocks[..., None] * ppb + arange(ppb)).flatten(-2)`, masked where the block is -1. The j / h
# term is a constant tensor: the guard evaluates it.
_page_source = Alt(_repeat_last(Any("blocks")),
                   Op(aten.unsqueeze.default, Any("blocks"), Lit("slot_dim")), name="expanded")  # fmt: skip
_page_ids = Op(ADD, Op(MUL, _page_source, Lit("page_stride"), commutative=True), Any("page_term"),
               commutative=True, name="page_ids")  # fmt: skip


def _page_test(name: str) -> Pat:
    return Op(tuple(COMPARE), Any(f"{name}_subject"), Const(f"{name}_bound"), name=name)


_pages_masked = _fill(_page_ids, _page_test, Const("page_pad"), "page_masking")
PAGES = Alt(  # (a view: the guard reads its shape, flatten's dims included)
    Op((aten.flatten.using_ints, *VIEWS[:3]), _pages_masked, name="pages_view",
       start_dim=Any(), end_dim=Any()),
    _pages_masked,
)  # fmt: skip

CONST_OPS = (aten.arange.default, aten.arange.start, aten.arange.start_step, prims.iota.default,
             aten.repeat.default, aten.mul.Tensor, aten.mul.Scalar, aten.add.Tensor,
             aten.add.Scalar, aten.clone.default, aten.remainder.Scalar) + VIEWS + CASTS  # fmt: skip


def _evaluate(value):
    """The value of a constant subgraph (aranges, repeats, views, arithmetic with literals) on the
    CPU, else None: no input, no data dependency."""
    if not isinstance(value, fx.Node):
        return value
    if value.op != "call_function" or value.target not in CONST_OPS:
        return None
    args = [_evaluate(a) if isinstance(a, fx.Node) else a for a in value.args]
    if any(a is None for a, raw in zip(args, value.args) if isinstance(raw, fx.Node)):
        return None
    kwargs = {k: v for k, v in value.kwargs.items() if k not in ("device", "pin_memory")}
    if "device" in value.kwargs:
        kwargs["device"] = "cpu"
    try:
        return value.target(*args, **kwargs)
    except (RuntimeError, TypeError, ValueError):
        return None


def _table_of(blocks) -> fx.Node | None:
    """The fxfuse.topk_block_table node whose block ids `blocks` is (through casts)."""
    node = _strip(blocks, CASTS)
    if not (isinstance(node, fx.Node) and node.target is operator.getitem and node.args[1] == 0):
        return None
    table = node.args[0]
    return table if table.target is fxfuse.topk_block_table.default else None


def _page_analysis(m: Match, heads: int) -> int | str:
    """pages_per_block of a page expansion spelled on the (spelled or fused) block table."""
    blocks = val(m["blocks"])
    k = static_int(blocks.shape[-1])
    per_slot = m["expanded"].target is aten.unsqueeze.default  # (..., k, ppb), then flattened
    term = val(m["page_term"])
    if per_slot:
        if m["slot_dim"] not in (-1, blocks.dim()):
            return f"block ids unsqueezed at dim {m['slot_dim']}, not a new last dim"
        if m.get("pages_view") is None:
            return "per-slot page ids are not flattened"
        ppb = static_int(term.shape[-1]) if term is not None and term.dim() else None
    else:
        ppb = _repeat_count(m, tuple(blocks.shape))
        if isinstance(ppb, str):
            return ppb
    if not isinstance(ppb, int) or ppb < 1 or k is None:
        return "the pages per block are not static"
    if m["page_stride"] != ppb * heads:
        return f"block ids scaled by {m['page_stride']!r}, not pages per block x kv heads"
    # The constant term: j·Hkv + h at every (row, slot, page).
    term_value = _evaluate(m["page_term"])
    lead = [static_int(d) for d in blocks.shape[:-1]]
    if term_value is None or None in lead:
        return "the page offset term is not a constant"
    j = torch.arange(ppb) * heads
    if len(lead) == 2 and heads > 1:  # (Q, Hkv, k): h is the head dim
        h = torch.arange(heads).view(1, heads, 1, 1)
    else:
        h = 0
    want = (j.view(1, 1, ppb) if len(lead) == 1 else j.view(1, 1, 1, ppb)) + h
    want = want.expand(*lead, k, ppb)
    try:
        got = (
            term_value.expand(*lead, k, ppb)
            if per_slot
            else term_value.expand(*lead, k * ppb).reshape(*lead, k, ppb)
        )
    except RuntimeError:
        return "the page offset term does not broadcast over the pages"
    if not torch.equal(got.to(torch.int64), want.to(torch.int64)):
        return "the page offset term is not j·Hkv + h"
    # padding: -1 where the block is -1
    test = "page_masking_bad" if m.get("page_masking_bad") is not None else "page_masking_ok"
    op, bound = COMPARE[m[test].target], m[f"{test}_bound"]
    op = op if test.endswith("bad") else NEGATED[op]
    subject = _strip(m[f"{test}_subject"], (*VIEWS, *CASTS, aten.clone.default))
    if subject not in (_strip(m["blocks"]), m["expanded"]):
        return "the page padding tests another tensor than the block ids"
    if (op, bound) not in {("lt", 0), ("le", -1), ("eq", -1)} or m["page_pad"] != -1:
        return "pages are not -1 exactly where the block is -1"
    out = val(m.root)
    if tuple(out.shape) != (*blocks.shape[:-1], k * ppb):
        return f"the pages are shaped {tuple(out.shape)}"
    return ppb


def _spelled_pages_per_block(blocks: fx.Node, heads: int) -> int:
    """pages_per_block of a valid page expansion among the consumers of `blocks`, else 0."""
    seen, pending = set(), list(blocks.users)
    while pending:
        node = pending.pop()
        if node in seen or node.op != "call_function":
            continue
        seen.add(node)
        found = match_at(PAGES, node)
        if found is not None and _strip(found["blocks"]) is _strip(blocks):
            ppb = _page_analysis(found, heads)
            if isinstance(ppb, int):
                return ppb
        if len(seen) < 64:
            pending.extend(node.users)
    return 0


def pages_guard(m: Match, ctx) -> str | None:
    table = _table_of(m["blocks"])
    if table is None:
        return "page ids of a block table that is not fused"
    ppb = _page_analysis(m, table.args[7])
    if isinstance(ppb, str):
        return ppb
    if table.args[6] != ppb:
        return f"the fused block table computes {table.args[6]} pages per block, not {ppb}"
    return None


def pages_replace(m: Match, ctx, insert: Inserter):
    pages = insert.call(operator.getitem, (_table_of(m["blocks"]), 1))
    return [_cast_to(insert, pages, val(m.root).dtype)]


# ctx lengths: B·n_full + (p % B + 1) when the tail block `last = p // B` is kept, else B·n_sel:
# where((blocks == last).any(-1), (n_sel - 1) * B + p % B + 1, n_sel * B).
_n_sel = Op(aten.sum.dim_IntList, Op(tuple(COMPARE), Any("blocks"), Const("valid_bound"),
                                     name="valid_test"), Lit("sum_dims"), name="n_sel")  # fmt: skip
_tail_kept = Op(aten.any.dim, Op((aten.eq.Tensor,), Any("blocks"), Any("last_col"),
                                 commutative=True), Lit("any_dim"))  # fmt: skip
_in_tail = Op(ADD, Op(REMAINDER, Any("positions"), Lit("mod_block")), 1, commutative=True)
_full_blocks = Op(MUL, Op(SUB, _n_sel, 1), Lit("full_block"), commutative=True)
_with_tail = Alt(
    Op(ADD, Op(ADD, _full_blocks, Op(REMAINDER, Any("positions"), Lit("mod_block")),
               commutative=True), 1, commutative=True),
    Op(ADD, _full_blocks, _in_tail, commutative=True),
)  # fmt: skip
_ctx = Op(aten.where.self, _tail_kept, _with_tail, Op(MUL, _n_sel, Lit("sel_block"),
                                                       commutative=True))  # fmt: skip
CTX_LENS = Alt(Cast(_ctx), _ctx)


def ctx_guard(m: Match, ctx) -> str | None:
    table = _table_of(m["blocks"])
    if table is None:
        return "ctx lengths of a block table that is not fused"
    block, positions = table.args[3], _strip(table.args[2])
    valid = comparison(m["valid_test"], _is_node(m["blocks"]))
    if valid is None or valid not in (("ge", 0), ("gt", -1), ("ne", -1)):
        return "n_sel does not count the block ids >= 0"
    if list(m["sum_dims"]) not in ([-1], [val(m["blocks"]).dim() - 1]) or m["any_dim"] not in (
        -1, val(m["blocks"]).dim() - 1,
    ):  # fmt: skip
        return "the counts do not reduce the block slots"
    limit = _floor_div(m["last_col"])
    if limit is None or _strip(limit[0]) is not positions or limit[1] != block:
        return "the tail test is not blocks == positions // block_size"
    if _strip(m["positions"]) is not positions:
        return "the tail length reads other positions"
    if {m["mod_block"], m["full_block"], m["sel_block"]} != {block}:
        return f"ctx lengths use a block size other than {block}"
    if tuple(val(m.root).shape) != tuple(val(table)[2].shape):
        return "ctx lengths are not one per block-table row"
    return None


def ctx_replace(m: Match, ctx, insert: Inserter):
    lengths = insert.call(operator.getitem, (_table_of(m["blocks"]), 2))
    return [_cast_to(insert, lengths, val(m.root).dtype)]


INPLACE = (aten.masked_fill_.Scalar, aten.masked_fill_.Tensor, aten.index_put_.default,
           aten.scatter_.value, aten.sub_.Tensor)  # fmt: skip


def _mutations(m: Match) -> list[fx.Node]:
    """In-place steps of the match (`x[cond] = -1`, `masked_fill_`, `scatter_`): the fused op
    reproduces them, so the engine may erase them."""
    return [n for n in m.nodes if n.target in INPLACE]


def _inplace_reason(m: Match) -> str | None:
    """An in-place step must write a temporary of the match (or a clone only it reads)."""
    inside = set(m.nodes)
    for node in _mutations(m):
        target = node.args[0]
        fresh = target in inside or (
            target.op == "call_function"
            and target.target is aten.clone.default
            and set(target.users) == {node}
        )
        if not fresh:
            return f"{node.name} writes {target.name} in place, which the graph reads elsewhere"
    return None


def _outputs(m: Match):
    return [m.root]


RULES = [
    Rule(name="topk_page_transform", pattern=PAGE_TRANSFORM, outputs=_outputs,
         guard=page_transform_guard, replace=page_transform_replace, mutations=_mutations),
    Rule(name="topk_page_transform", pattern=PACKED_ROWS, outputs=_outputs,
         guard=packed_rows_guard, replace=packed_rows_replace, mutations=_mutations),
    Rule(name="topk_block_table", pattern=BLOCK_TABLE, outputs=_outputs,
         guard=block_table_guard, replace=block_table_replace, mutations=_mutations),
    # page ids and ctx lengths spelled on a fused block table: its other two outputs
    Rule(name="topk_block_table", pattern=PAGES, outputs=_outputs, guard=pages_guard,
         replace=pages_replace, canonical=True),
    Rule(name="topk_block_table", pattern=CTX_LENS, outputs=_outputs, guard=ctx_guard,
         replace=ctx_replace, canonical=True),
    Rule(name="topk_mask", pattern=MASK, outputs=_outputs, guard=mask_guard, replace=mask_replace,
         mutations=_mutations),
]  # fmt: skip
