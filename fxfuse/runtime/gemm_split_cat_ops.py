"""torch.library custom ops for GEMM → split → cat (`torch.ops.fxfuse.gemm_split_cat`, `gemm_split`).

    gemm_split_cat(x, w, d, s1, s2, y) -> (out, c2)
        c = (x @ wᵀ).view(M, d, s1 + s2);  c1, c2 = split(c, [s1, s2], -1);  out = cat([c1, y], -1)
        x (M, K), w (N, K) (F.linear layout, any strides), y (M, d, S3) any strides (an expand too);
        out (M, d, s1 + S3) and c2 (M, d, s2), both contiguous.
    gemm_split(x, w, d, sizes) -> [pieces]
        the pieces of split((x @ wᵀ).view(M, d, sum(sizes)), sizes, -1), each (M, d, size) contiguous.

bf16 / fp16 calls on CUDA/ROCm and in the interpreter have two implementations, picked per shape
by the launch table `gemm_split_cat_backend` (FXFUSE_GEMM_BACKEND=triton|vendor overrides it):
- fxfuse's Triton kernel (kernels/gemm_split_cat.py), one launch that also copies y (its head-tile
  path, where it applies, is always taken over the vendor path);
- the vendor GEMM through `torch.bmm`: per piece, one strided-batched GEMM over the d heads whose
  C matrices are that piece's slices of the destination (ld = d · row width, batch stride = row
  width), so no tile goes through a temporary; then y's slice is copied (a second kernel).
Every other case runs the torch reference (kernels/gemm_split_cat_ref.py), which is the unfused
spelling itself, so an fp32 call or a CPU run without the interpreter keeps its bytes.
"""

from __future__ import annotations

import functools

import torch

from fxfuse.kernels import gemm_ref
from fxfuse.kernels import gemm_split_cat_ref as ref
from fxfuse.runtime import gemm_ops, launch_tables
from fxfuse.runtime.dispatch import BACKEND_VENDOR, gemm_backend_override, use_triton
from fxfuse.runtime.registry import fused_op
from fxfuse.runtime.target import detect_target

# The kernel's dtypes (kernels/gemm_split_cat.py DTYPES; tests check the two agree) and its
# number of output pieces, kept here so that guards need not import triton.
KERNEL_DTYPES = (torch.bfloat16, torch.float16)
# What the quantized producers' kernels write.
QUANTIZED_OUT_DTYPES = gemm_ref.OUT_DTYPES
MAX_PIECES = 4
BACKEND_TABLE = "gemm_split_cat_backend"


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
    _check_cat_args(x.shape[0], w.shape[0], x.dtype, x.device, d, s1, s2, y, "x")


def _check_cat_args(m: int, n: int, dtype, device, d, s1, s2, y, first: str) -> None:
    """The split / cat arguments of a GEMM of m rows and n columns in dtype on device, whose
    first operand is called `first`."""
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"d: expected a positive int, got {d!r}")
    for name, value in (("s1", s1), ("s2", s2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}: expected a non-negative int, got {value!r}")
    if s1 + s2 == 0:
        raise ValueError("s1: s1 + s2 must be positive")
    if n != d * (s1 + s2):
        raise ValueError(f"w: has {n} output rows, expected d·(s1 + s2) = {d * (s1 + s2)}")
    if not isinstance(y, torch.Tensor) or y.dim() != 3:
        raise ValueError(f"y: expected a 3-D (M, d, S3) tensor, got {getattr(y, 'shape', type(y))}")
    if y.shape[0] != m or y.shape[1] != d:
        raise ValueError(f"y: expected shape ({m}, {d}, S3), got {tuple(y.shape)}")
    if y.dtype != dtype:
        raise ValueError(f"y: dtype {y.dtype} differs from the output's {dtype}")
    if y.device != device:
        raise ValueError(f"y: on {y.device}, {first} on {device}")


def _check_split(x, w, d, sizes) -> None:
    _check_gemm(x, w, d)
    _check_sizes(w.shape[0], d, sizes)


def _check_sizes(n: int, d, sizes) -> None:
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise ValueError(f"d: expected a positive int, got {d!r}")
    if not isinstance(sizes, (list, tuple)) or not 1 <= len(sizes) <= MAX_PIECES:
        raise ValueError(f"sizes: expected 1 to {MAX_PIECES} sizes, got {sizes!r}")
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in sizes) or not sum(sizes):
        raise ValueError(f"sizes: expected non-negative ints with a positive sum, got {sizes}")
    if n != d * sum(sizes):
        raise ValueError(f"w: has {n} output rows, expected d·sum(sizes) = {d * sum(sizes)}")


def _on_kernel(*tensors: torch.Tensor) -> bool:
    return tensors[0].dtype in KERNEL_DTYPES and use_triton(*tensors)


def _use_vendor(x: torch.Tensor, w: torch.Tensor, d: int, widths, y=None) -> bool:
    """The vendor GEMM runs this call: FXFUSE_GEMM_BACKEND says so (on any device: torch.bmm runs
    everywhere), or, on CUDA/ROCm, the backend table for this (M, N, K) unless the kernel's
    head-tile path takes the call (it beats the vendor path wherever it applies)."""
    choice = gemm_backend_override()
    if choice != "auto":
        return choice == "vendor"
    if x.device.type != "cuda":
        return False
    m, k = x.shape
    if _table_backend(detect_target(x.device), max(m, 1), w.shape[0], k) != BACKEND_VENDOR:
        return False
    return not _kernels().takes_head_tiles(x, w, d, widths, y)


@functools.lru_cache(maxsize=4096)
def _table_backend(target: str, m: int, n: int, k: int) -> int:
    return launch_tables.lookup(BACKEND_TABLE, target, m=m, n=n, k=k)["BACKEND"]


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


def _vendor_split_cat(x, w, d, s1, s2, y):
    m = x.shape[0]
    out = x.new_empty((m, d, s1 + y.shape[2]))
    c2 = x.new_empty((m, d, s2))
    _vendor_gemm_into(x, w, d, (s1, s2), (out[:, :, :s1], c2))
    out[:, :, s1:].copy_(y)
    return out, c2


def _vendor_split(x, w, d, sizes):
    pieces = [x.new_empty((x.shape[0], d, size)) for size in sizes]
    _vendor_gemm_into(x, w, d, sizes, pieces)
    return pieces


@fused_op("fxfuse::gemm_split_cat", mutates_args=())
def gemm_split_cat(
    x: torch.Tensor, w: torch.Tensor, d: int, s1: int, s2: int, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cat([c1, y], -1), c2) of c1, c2 = split((x @ wᵀ).view(M, d, s1 + s2), [s1, s2], -1)."""
    _check_split_cat(x, w, d, s1, s2, y)
    if _on_kernel(x, w, y):
        if _use_vendor(x, w, d, (s1, s2), y):
            return _vendor_split_cat(x, w, d, s1, s2, y)
        return _kernels().gemm_split_cat(x, w, d, s1, s2, y)
    return ref.gemm_split_cat_ref(x, w, d, s1, s2, y)


@gemm_split_cat.register_fake
def _(x, w, d, s1, s2, y):
    _check_split_cat(x, w, d, s1, s2, y)
    m = x.shape[0]
    return x.new_empty((m, d, s1 + y.shape[2])), x.new_empty((m, d, s2))


@fused_op("fxfuse::gemm_split", mutates_args=())
def gemm_split(x: torch.Tensor, w: torch.Tensor, d: int, sizes: list[int]) -> list[torch.Tensor]:
    """The pieces of split((x @ wᵀ).view(M, d, sum(sizes)), sizes, -1), each contiguous."""
    _check_split(x, w, d, sizes)
    if _on_kernel(x, w):
        if _use_vendor(x, w, d, sizes):
            return _vendor_split(x, w, d, list(sizes))
        return list(_kernels().gemm_split(x, w, d, list(sizes)))
    return list(ref.gemm_split_ref(x, w, d, list(sizes)))


@gemm_split.register_fake
def _(x, w, d, sizes):
    _check_split(x, w, d, sizes)
    return [x.new_empty((x.shape[0], d, size)) for size in sizes]


# --- quantized producers: the A8W8 and AFP4WFP4 GEMMs with the same split epilogue ---------------
#
#   gemm_fp8_split_cat(q, x_scale, w, w_scale, out_dtype, d, s1, s2, y) -> (out, c2)
#   gemm_fp8_split(q, x_scale, w, w_scale, out_dtype, d, sizes) -> [pieces]
#   gemm_mxfp4_split_cat / gemm_mxfp4_split: the same over gemm_mxfp4's operands
# c is gemm_fp8(q, x_scale, w, w_scale, out_dtype) (gemm_mxfp4 ...); the rest as above, with y in
# out_dtype. On CUDA/ROCm and in the interpreter the Triton GEMM writes the pieces and copies y
# (kernels/gemm_split_cat.split_epilogue), except where gemm_fp8 would run the vendor GEMM for
# this shape (the A8W8 backend tables: `_scaled_mm` is faster there than fxfuse's kernel, by more
# than the copies cost): then the vendor GEMM runs and the pieces are copied out of its result,
# the unfused spelling. Without Triton every op runs that spelling over the torch reference GEMM.


def _check_fp8(q, x_scale, w, w_scale, out_dtype) -> None:
    gemm_ref.check_gemm_fp8_args(q, x_scale, w, w_scale, out_dtype)


def _mxfp4_n(q, x_scale, w, w_scale, out_dtype) -> int:
    """N of an MXFP4 GEMM's weights, plain or preshuffled (gemm_ref.mxfp4_weight_layout)."""
    n, preshuffled = gemm_ref.mxfp4_weight_layout(w, w_scale, 2 * q.shape[1])
    if not preshuffled:
        gemm_ref.check_gemm_mxfp4_args(q, x_scale, w, w_scale, out_dtype)
    return n


def _fp8_kernel_runs(q, x_scale, w, w_scale, out_dtype) -> bool:
    return use_triton(q, w) and gemm_ops._vendor_kind(q, x_scale, w, w_scale, out_dtype) is None


@fused_op("fxfuse::gemm_fp8_split_cat", mutates_args=())
def gemm_fp8_split_cat(
    q: torch.Tensor,
    x_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype,
    d: int,
    s1: int,
    s2: int,
    y: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cat([c1, y], -1), c2) of c1, c2 = split(gemm_fp8(q, ..).view(M, d, s1 + s2), [s1, s2])."""
    _check_fp8(q, x_scale, w, w_scale, out_dtype)
    _check_cat_args(q.shape[0], w.shape[0], out_dtype, q.device, d, s1, s2, y, "q")
    if _fp8_kernel_runs(q, x_scale, w, w_scale, out_dtype):
        return gemm_ops._fp8_kernels().gemm_fp8_split_cat(q, x_scale, w, w_scale, d, s1, s2, y)
    c = gemm_ops._gemm_fp8(q, x_scale, w, w_scale, out_dtype)
    return ref.split_cat_of(c, d, s1, s2, y)


@gemm_fp8_split_cat.register_fake
def _(q, x_scale, w, w_scale, out_dtype, d, s1, s2, y):
    _check_fp8(q, x_scale, w, w_scale, out_dtype)
    _check_cat_args(q.shape[0], w.shape[0], out_dtype, q.device, d, s1, s2, y, "q")
    m = q.shape[0]
    return y.new_empty((m, d, s1 + y.shape[2])), y.new_empty((m, d, s2))


@fused_op("fxfuse::gemm_fp8_split", mutates_args=())
def gemm_fp8_split(
    q: torch.Tensor,
    x_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype,
    d: int,
    sizes: list[int],
) -> list[torch.Tensor]:
    """The pieces of split(gemm_fp8(q, ..).view(M, d, sum(sizes)), sizes, -1), each contiguous."""
    _check_fp8(q, x_scale, w, w_scale, out_dtype)
    _check_sizes(w.shape[0], d, sizes)
    if _fp8_kernel_runs(q, x_scale, w, w_scale, out_dtype):
        kernels = gemm_ops._fp8_kernels()
        return list(kernels.gemm_fp8_split(q, x_scale, w, w_scale, d, list(sizes), out_dtype))
    return list(ref.split_of(gemm_ops._gemm_fp8(q, x_scale, w, w_scale, out_dtype), d, sizes))


@gemm_fp8_split.register_fake
def _(q, x_scale, w, w_scale, out_dtype, d, sizes):
    _check_fp8(q, x_scale, w, w_scale, out_dtype)
    _check_sizes(w.shape[0], d, sizes)
    return [q.new_empty((q.shape[0], d, size), dtype=out_dtype) for size in sizes]


@fused_op("fxfuse::gemm_mxfp4_split_cat", mutates_args=())
def gemm_mxfp4_split_cat(
    q: torch.Tensor,
    x_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype,
    d: int,
    s1: int,
    s2: int,
    y: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cat([c1, y], -1), c2) of c1, c2 = split(gemm_mxfp4(q, ..).view(M, d, s1 + s2), [s1, s2])."""
    n = _mxfp4_n(q, x_scale, w, w_scale, out_dtype)
    _check_cat_args(q.shape[0], n, out_dtype, q.device, d, s1, s2, y, "q")
    if use_triton(q, w):
        layout = gemm_ops._mxfp4_layout(w, w_scale, 2 * q.shape[1])
        return gemm_ops._mxfp4_kernels().gemm_mxfp4_split_cat(
            q, x_scale, w, w_scale, d, s1, s2, y, **layout
        )
    c = gemm_ops._gemm_mxfp4(q, x_scale, w, w_scale, out_dtype)
    return ref.split_cat_of(c, d, s1, s2, y)


@gemm_mxfp4_split_cat.register_fake
def _(q, x_scale, w, w_scale, out_dtype, d, s1, s2, y):
    n = _mxfp4_n(q, x_scale, w, w_scale, out_dtype)
    _check_cat_args(q.shape[0], n, out_dtype, q.device, d, s1, s2, y, "q")
    m = q.shape[0]
    return y.new_empty((m, d, s1 + y.shape[2])), y.new_empty((m, d, s2))


@fused_op("fxfuse::gemm_mxfp4_split", mutates_args=())
def gemm_mxfp4_split(
    q: torch.Tensor,
    x_scale: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype,
    d: int,
    sizes: list[int],
) -> list[torch.Tensor]:
    """The pieces of split(gemm_mxfp4(q, ..).view(M, d, sum(sizes)), sizes, -1), each contiguous."""
    n = _mxfp4_n(q, x_scale, w, w_scale, out_dtype)
    _check_sizes(n, d, sizes)
    if use_triton(q, w):
        layout = gemm_ops._mxfp4_layout(w, w_scale, 2 * q.shape[1])
        kernels = gemm_ops._mxfp4_kernels()
        return list(
            kernels.gemm_mxfp4_split(q, x_scale, w, w_scale, d, list(sizes), out_dtype, **layout)
        )
    return list(ref.split_of(gemm_ops._gemm_mxfp4(q, x_scale, w, w_scale, out_dtype), d, sizes))


@gemm_mxfp4_split.register_fake
def _(q, x_scale, w, w_scale, out_dtype, d, sizes):
    n = _mxfp4_n(q, x_scale, w, w_scale, out_dtype)
    _check_sizes(n, d, sizes)
    return [q.new_empty((q.shape[0], d, size), dtype=out_dtype) for size in sizes]
