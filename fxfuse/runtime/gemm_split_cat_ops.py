"""torch.library custom ops for GEMM → split → cat (`torch.ops.fxfuse.gemm_split_cat`, `gemm_split`).

    gemm_split_cat(x, w, d, s1, s2, y) -> (out, c2)
        c = (x @ wᵀ).view(M, d, s1 + s2);  c1, c2 = split(c, [s1, s2], -1);  out = cat([c1, y], -1)
        x (M, K), w (N, K) (F.linear layout, any strides), y (M, d, S3) any strides (an expand too);
        out (M, d, s1 + S3) contiguous; c2 (M, d, s2) laid out as the unfused graph's c2, the last
        s2 columns of each head of an (M, d, s1 + s2) buffer (`gemm_split_cat_ref.split_cat_c2`),
        so that no backend copies it where the graph did not.
    gemm_split(x, w, d, sizes, view_piece=-1) -> [pieces]
        the pieces of split((x @ wᵀ).view(M, d, sum(sizes)), sizes, -1), each (M, d, size)
        contiguous, except piece `view_piece` (-1: none): laid out as the split's view of the GEMM
        output (its columns of each head of an (M, d, sum(sizes)) buffer holding it alone), for a
        piece the graph reads in place, so that no backend copies it where the graph did not.

bf16 / fp16 calls on CUDA/ROCm and in the interpreter have two implementations, picked per shape
by the launch table `gemm_split_cat_backend` (FXFUSE_GEMM_BACKEND=triton|vendor overrides it):
- fxfuse's Triton kernel (kernels/gemm_split_cat.py), one launch that also copies y (its head-tile
  path, where it applies, is always taken over the vendor path);
- the vendor GEMM through `torch.bmm`: per piece, one strided-batched GEMM over the d heads whose
  C matrices are that piece's slices of the destination (ld = d · row width, batch stride = row
  width), so no tile goes through a temporary; then y's slice is copied (a second kernel);
- the unfused chain: the vendor GEMM (F.linear), then the cat in one kernel (`cat_pieces`), c2
  a view of the GEMM's output: the graph's own chain, which the sm90 table takes at Kimi-Linear's
  width at M ≤ 128, where the kernel measured 0.85× Inductor's compile of that chain.
`gemm_split` has its own table, `gemm_split_backend`, with the same three choices; it takes the
unfused chain (the vendor GEMM, then each piece but `view_piece` copied) up to M 2048 on sm90,
where the kernel lost to the unfused graph on every measured shape. Where a graph's M is static
and the table picks the unfused chain for it, the pattern does not fire at all
(`unfused_at`).
Every other case runs the torch reference (kernels/gemm_split_cat_ref.py), which is the unfused
spelling itself, so an fp32 call or a CPU run without the interpreter keeps its bytes.
"""

from __future__ import annotations

import functools

import torch

from fxfuse.kernels import gemm_ref
from fxfuse.kernels import gemm_split_cat_ref as ref
from fxfuse.runtime import gemm_ops, launch_tables
from fxfuse.runtime.dispatch import (
    BACKEND_TRITON,
    BACKEND_UNFUSED,
    BACKEND_VENDOR,
    gemm_backend_override,
    use_triton,
)
from fxfuse.runtime.registry import fused_op
from fxfuse.runtime.target import detect_target

# The kernel's dtypes (kernels/gemm_split_cat.py DTYPES; tests check the two agree) and its
# number of output pieces, kept here so that guards need not import triton.
KERNEL_DTYPES = (torch.bfloat16, torch.float16)
# What the quantized producers' kernels write.
QUANTIZED_OUT_DTYPES = gemm_ref.OUT_DTYPES
MAX_PIECES = ref.MAX_PIECES
BACKEND_TABLE = "gemm_split_cat_backend"
# gemm_split's own: up to M 2048 the unfused chain (the kernel lost there on every measured shape)
SPLIT_BACKEND_TABLE = "gemm_split_backend"


def _kernels():
    from fxfuse.kernels import gemm_split_cat as kernels  # imports triton: only when used

    return kernels


def _check_gemm(x: torch.Tensor, w: torch.Tensor, d: int) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x: expected a 2-D (M, K) tensor, got {getattr(x, 'shape', type(x))}")
    if not x.dtype.is_floating_point:
        raise ValueError(f"x: expected a floating-point tensor, got {x.dtype}")
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise ValueError(f"w: expected a 2-D (N, K) tensor, got {getattr(w, 'shape', type(w))}")
    if w.dtype != x.dtype:
        raise ValueError(f"w: dtype {w.dtype} differs from x's {x.dtype}")
    if w.device != x.device:
        raise ValueError(f"w: on {w.device}, x on {x.device}")
    if w.shape[1] != x.shape[1]:
        raise ValueError(f"w: K = {w.shape[1]} differs from x's K = {x.shape[1]}")
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"d: expected a positive int, got {d!r}")


def _check_split_cat(x, w, d, s1, s2, y) -> None:
    _check_gemm(x, w, d)
    ref.check_cat_args(x.shape[0], w.shape[0], x.dtype, x.device, d, s1, s2, y, "x")


def _check_split(x, w, d, sizes, view_piece=-1) -> None:
    _check_gemm(x, w, d)
    ref.check_sizes(w.shape[0], d, sizes, view_piece)


def _on_kernel(*tensors: torch.Tensor) -> bool:
    return tensors[0].dtype in KERNEL_DTYPES and use_triton(*tensors)


def _backend(
    x: torch.Tensor, w: torch.Tensor, d: int, widths, y=None, table: str = BACKEND_TABLE
) -> int:
    """Who runs this call (BACKEND_*): FXFUSE_GEMM_BACKEND when set (on any device: torch.bmm
    runs everywhere), else, on CUDA/ROCm, the backend table for this (M, N, K), except that the
    kernel's head-tile path takes a call the table gives the vendor (it beats the vendor path
    wherever it applies); the kernel otherwise."""
    choice = gemm_backend_override()
    if choice != "auto":
        return BACKEND_VENDOR if choice == "vendor" else BACKEND_TRITON
    backend = _table_choice(x, w, table)
    if backend == BACKEND_VENDOR and _kernels().takes_head_tiles(x, w, d, widths, y):
        return BACKEND_TRITON
    return BACKEND_TRITON if backend is None else backend


def _use_vendor(x: torch.Tensor, w: torch.Tensor, d: int, widths, y=None) -> bool:
    """The vendor GEMM runs this gemm_split_cat call (`_backend`)."""
    return _backend(x, w, d, widths, y) == BACKEND_VENDOR


def _table_choice(x: torch.Tensor, w: torch.Tensor, table: str) -> int | None:
    """The backend table's BACKEND for this call on CUDA/ROCm, None elsewhere."""
    if x.device.type != "cuda":
        return None
    m, k = x.shape
    return _table_backend(table, detect_target(x.device), max(m, 1), w.shape[0], k)


def unfused_at(target: str, m: int, n: int, k: int, split_only: bool) -> bool:
    """Whether a call of static M on `target` would run the unfused chain (the backend table's
    choice; FXFUSE_GEMM_BACKEND unset): the pattern then leaves the graph's chain as it is.
    Never on the CPU, whose ops run the reference (the pattern fires there for its tests)."""
    if target == "cpu" or gemm_backend_override() != "auto":
        return False
    table = SPLIT_BACKEND_TABLE if split_only else BACKEND_TABLE
    return _table_backend(table, target, max(m, 1), n, k) == BACKEND_UNFUSED


@functools.lru_cache(maxsize=4096)
def _table_backend(table: str, target: str, m: int, n: int, k: int) -> int:
    return launch_tables.lookup(table, target, m=m, n=n, k=k)["BACKEND"]


def _vendor_gemm_into(x, w, d: int, widths, dests) -> None:
    """c = (x @ wᵀ).view(M, d, sum(widths)) split along its last dim into `dests` (each an
    (M, d, width) view, any row strides), one strided-batched GEMM per piece: batch = the d heads,
    A = x shared by every head (batch stride 0), B = that piece's rows of each head's weight."""
    m, k = x.shape
    w_heads = w.unflatten(0, (d, sum(widths)))
    x_heads = x.expand(d, m, k)
    lo = 0
    for width, dest in zip(widths, dests):
        if width:
            b = w_heads[:, lo : lo + width].transpose(1, 2)
            torch.bmm(x_heads, b, out=dest.transpose(0, 1))
        lo += width


def _split_cat_outputs(x, d, s1, s2, y):
    return ref.split_cat_buffers(x.shape[0], d, s1, s2, y.shape[2], x.dtype, x.device)


def _vendor_split_cat(x, w, d, s1, s2, y):
    out, c2 = _split_cat_outputs(x, d, s1, s2, y)
    _vendor_gemm_into(x, w, d, (s1, s2), (out[:, :, :s1], c2))
    out[:, :, s1:].copy_(y)
    return out, c2


def _unfused_split_cat(x, w, d, s1, s2, y):
    """The graph's own chain: F.linear, then the cat in one kernel; c2 a view of the GEMM output."""
    c = torch.nn.functional.linear(x, w)
    return _kernels().cat_pieces(c, d, s1, s2, y), ref.split_cat_c2(c, d, s1, s2)


def _vendor_split(x, w, d, sizes, view_piece):
    pieces = ref.piece_buffers(x.shape[0], d, sizes, view_piece, x.dtype, x.device)
    _vendor_gemm_into(x, w, d, sizes, pieces)
    return pieces


@fused_op("fxfuse::gemm_split_cat", mutates_args=())
def gemm_split_cat(
    x: torch.Tensor, w: torch.Tensor, d: int, s1: int, s2: int, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cat([c1, y], -1), c2) of c1, c2 = split((x @ wᵀ).view(M, d, s1 + s2), [s1, s2], -1)."""
    _check_split_cat(x, w, d, s1, s2, y)
    if _on_kernel(x, w, y):
        backend = _backend(x, w, d, (s1, s2), y)
        if backend == BACKEND_VENDOR:
            return _vendor_split_cat(x, w, d, s1, s2, y)
        if backend == BACKEND_UNFUSED:
            return _unfused_split_cat(x, w, d, s1, s2, y)
        return _kernels().gemm_split_cat(x, w, d, s1, s2, y)
    return ref.gemm_split_cat_ref(x, w, d, s1, s2, y)


@gemm_split_cat.register_fake
def _(x, w, d, s1, s2, y):
    _check_split_cat(x, w, d, s1, s2, y)
    return _split_cat_outputs(x, d, s1, s2, y)


@fused_op("fxfuse::gemm_split", mutates_args=())
def gemm_split(
    x: torch.Tensor, w: torch.Tensor, d: int, sizes: list[int], view_piece: int = -1
) -> list[torch.Tensor]:
    """The pieces of split((x @ wᵀ).view(M, d, sum(sizes)), sizes, -1), each contiguous except
    `view_piece` (the split's view, `gemm_split_cat_ref.piece_buffers`)."""
    _check_split(x, w, d, sizes, view_piece)
    sizes = list(sizes)
    # Off the kernel path (fp32, CPU without the interpreter) the reference: the unfused chain.
    on_kernel = _on_kernel(x, w)
    backend = _backend(x, w, d, sizes, table=SPLIT_BACKEND_TABLE) if on_kernel else BACKEND_UNFUSED
    if backend == BACKEND_UNFUSED:
        return list(ref.gemm_split_ref(x, w, d, sizes, view_piece))
    if backend == BACKEND_VENDOR:
        return _vendor_split(x, w, d, sizes, view_piece)
    return list(_kernels().gemm_split(x, w, d, sizes, view_piece))


@gemm_split.register_fake
def _(x, w, d, sizes, view_piece=-1):
    _check_split(x, w, d, sizes, view_piece)
    return ref.piece_buffers(x.shape[0], d, list(sizes), view_piece, x.dtype, x.device)


# --- quantized producers: the A8W8 and AFP4WFP4 GEMMs with the same split epilogue ---------------
#
#   gemm_fp8_split_cat(q, x_scale, w, w_scale, out_dtype, d, s1, s2, y) -> (out, c2)
#   gemm_fp8_split(q, x_scale, w, w_scale, out_dtype, d, sizes, view_piece=-1) -> [pieces]
#   gemm_mxfp4_split_cat / gemm_mxfp4_split: the same over gemm_mxfp4's operands
# c is gemm_fp8(q, x_scale, w, w_scale, out_dtype) (gemm_mxfp4 ...); the rest as above, with y in
# out_dtype, except that c2 is laid out as in the unfused graph: the last s2 columns of each head
# of an (M, d, s1 + s2) buffer, not copied (`gemm_split_cat_ref.split_cat_c2`). On CUDA/ROCm and
# in the interpreter the Triton GEMM writes out and c2 and copies y
# (kernels/gemm_split_cat.split_epilogue), except where gemm_fp8 runs the vendor GEMM for this
# shape (the A8W8 backend tables; on the H100 it takes kv_b from M 128 in a third of the time of
# fxfuse's kernel): then, for rowwise scales from M 256 on sm90, the persistent TMA head-tile
# kernel with FP8 operands (`fp8_head_tiles`); otherwise `_scaled_mm` runs and one kernel copies
# the cat out of its result (`cat_pieces`), c2 being a view of it. Without Triton every op runs
# the unfused spelling over the torch reference GEMM.


def _quantized_n(kind: str, q, x_scale, w, w_scale, out_dtype) -> tuple[int, str]:
    """(N, scale kind) of a quantized GEMM's arguments, validated (MXFP4 weights plain or
    preshuffled; its kind is "mxfp4")."""
    if kind == "fp8":
        return w.shape[0], gemm_ref.check_gemm_fp8_args(q, x_scale, w, w_scale, out_dtype)
    n, preshuffled = gemm_ref.mxfp4_weight_layout(w, w_scale, 2 * q.shape[1])
    if not preshuffled:
        gemm_ref.check_gemm_mxfp4_args(q, x_scale, w, w_scale, out_dtype)
    return n, kind


def _check_quantized(
    kind: str, gemm: tuple, out_dtype, d: int, widths: list, y, view_piece=-1
):
    """(N, scale kind) of a quantized split-cat (y given) or split (y None, piece `view_piece`
    returned as the split's view), every argument checked (the ops and their fakes alike)."""
    q = gemm[0]
    n, scales = _quantized_n(kind, *gemm, out_dtype)
    if y is None:
        ref.check_sizes(n, d, widths, view_piece)
    else:
        ref.check_cat_args(q.shape[0], n, out_dtype, q.device, d, *widths, y, "q")
    return n, scales


def _quantized(kind: str, gemm: tuple, out_dtype, d: int, widths: list, y, view_piece=-1):
    """(out, c2) of the split-cat (y given) or the pieces of the split (y None; piece `view_piece`
    laid out as the split's view)."""
    q, w = gemm[0], gemm[2]
    _, scales = _check_quantized(kind, gemm, out_dtype, d, widths, y, view_piece)
    kernels, layout = None, {}
    if kind == "mxfp4" and use_triton(q, w):
        kernels, layout = (
            gemm_ops._mxfp4_kernels(),
            gemm_ops._mxfp4_layout(*gemm[2:], 2 * q.shape[1]),
        )
    elif kind == "fp8" and use_triton(q, w) and gemm_ops._vendor_kind(*gemm, out_dtype) is None:
        kernels = gemm_ops._fp8_kernels()
    if kernels is not None:
        if y is None:
            split = getattr(kernels, f"gemm_{kind}_split")
            return list(split(*gemm, d, widths, out_dtype, view_piece, **layout))
        return getattr(kernels, f"gemm_{kind}_split_cat")(*gemm, d, *widths, y, **layout)
    if scales == gemm_ref.SCALE_ROWWISE and y is not None and _fp8_head_tiles_take(q):
        got = _kernels().fp8_head_tiles(*gemm, d, *widths, y)
        if got is not None:
            return got
    # The vendor GEMM (or the reference), then the pieces copied out of its result; c2 (the
    # split's view_piece) stays a view of it, as in the unfused graph.
    c = (gemm_ops._gemm_fp8 if kind == "fp8" else gemm_ops._gemm_mxfp4)(*gemm, out_dtype)
    if y is None:
        return list(ref.split_of(c, d, widths, view_piece))
    if use_triton(c, y):  # the cat in one kernel (torch.cat of these views is several times slower)
        out = _kernels().cat_pieces(c, d, *widths, y)
    else:
        out = ref.split_cat_of(c, d, *widths, y)[0]
    return out, ref.split_cat_c2(c, d, *widths)


def _fp8_head_tiles_take(q: torch.Tensor) -> bool:
    """Where the vendor GEMM would run an FP8 rowwise / tensorwise split-cat: the head-tile
    kernel instead from its measured M on (kernels/gemm_split_cat.FP8_HEAD_TILES_MIN_M); it
    declines shapes TMA cannot take."""
    if q.device.type != "cuda" or gemm_backend_override() != "auto":
        return False
    min_m = _kernels().FP8_HEAD_TILES_MIN_M.get(detect_target(q.device))
    return min_m is not None and q.shape[0] >= min_m


def _quantized_fake(kind: str, gemm: tuple, out_dtype, d: int, widths: list, y, view_piece=-1):
    q = gemm[0]
    _check_quantized(kind, gemm, out_dtype, d, widths, y, view_piece)
    if y is None:
        return ref.piece_buffers(q.shape[0], d, widths, view_piece, out_dtype, q.device)
    return ref.split_cat_buffers(q.shape[0], d, *widths, y.shape[2], out_dtype, q.device)


def _quantized_ops(kind: str):
    """Registers fxfuse::gemm_<kind>_split_cat and gemm_<kind>_split (kind "fp8" or "mxfp4")."""

    @fused_op(f"fxfuse::gemm_{kind}_split_cat", mutates_args=())
    def split_cat(
        q: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
        out_dtype: torch.dtype, d: int, s1: int, s2: int, y: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return _quantized(kind, (q, x_scale, w, w_scale), out_dtype, d, [s1, s2], y)

    @split_cat.register_fake
    def _(q, x_scale, w, w_scale, out_dtype, d, s1, s2, y):
        return _quantized_fake(kind, (q, x_scale, w, w_scale), out_dtype, d, [s1, s2], y)

    @fused_op(f"fxfuse::gemm_{kind}_split", mutates_args=())
    def split(
        q: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
        out_dtype: torch.dtype, d: int, sizes: list[int], view_piece: int = -1,
    ) -> list[torch.Tensor]:
        gemm = (q, x_scale, w, w_scale)
        return _quantized(kind, gemm, out_dtype, d, list(sizes), None, view_piece)

    @split.register_fake
    def _(q, x_scale, w, w_scale, out_dtype, d, sizes, view_piece=-1):
        gemm = (q, x_scale, w, w_scale)
        return _quantized_fake(kind, gemm, out_dtype, d, list(sizes), None, view_piece)

    return split_cat, split


gemm_fp8_split_cat, gemm_fp8_split = _quantized_ops("fp8")
gemm_mxfp4_split_cat, gemm_mxfp4_split = _quantized_ops("mxfp4")
