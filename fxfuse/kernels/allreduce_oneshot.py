"""One-shot all-reduce → [residual add →] RMSNorm [→ FP8 / MXFP4 quant] in one Triton kernel over
torch symmetric memory (CUDA / ROCm; CPU only as a simulation under Triton's interpreter).

Every rank launches the same grid (same M, N, configuration), and program p of every rank owns the
same rows R_p = [p·ROWS, (p + 1)·ROWS). Program p of rank r:
  1. publish:  buffer[r][row, :] = x[row, :] for row in R_p   (its own symmetric buffer, M × N
               row-major in x's dtype)
  2. barrier, channel 0: program p of every rank has published R_p
  3. reduce:   s = fp32(buffer[0][row]) + fp32(buffer[1][row]) + … + fp32(buffer[W-1][row]),
               in rank order on every rank, so every rank gets identical bytes;
               h = round_x(s) (the all-reduce's dtype), then h = round_x(h + residual); h is stored
  4. barrier, channel 1: no rank still reads R_p of any buffer, so the next call may overwrite it
  5. RMSNorm (+ quant) of its rows of h: the rms_norm_quant kernel's own code, inlined, so the bytes
     are those of the two-kernel path run on the same h.
Barriers pair program p with its namesake on every rank. Rank r's flag to rank q is
signal_pad[q][(p·2 + channel)·W + r] (int32): the sender swaps it 0 → 1 (release, system scope),
the receiver 1 → 0 (acquire). Pads are therefore zero between uses: no host reset, safe under CUDA
graph replay, and a flag cannot be raised twice (the sender waits for 0). Because programs wait on
namesakes, the grid must be co-resident: it is capped by MAX_PROGRAMS and by the signal pad size.

Numerics: the sum is fp32 in rank order. NCCL / RCCL ring sums of bf16 round between steps, so h can
differ from the collective path by an ulp when W > 2 (at W = 2 both round one fp32 sum, except
where that sum itself rounds in fp32); the quantized bytes then follow h.

Layouts: x, residual (M, N) with any strides; weight (N,); h, y (M, N) contiguous; q and scale as in
rms_norm_quant.py. Peers: int64 tables (W,) of every rank's buffer and signal pad address, on the
kernel's device.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from fxfuse.kernels import formats
from fxfuse.kernels import rms_norm_quant as norm_quant
from fxfuse.kernels.rms_norm_quant import (
    _load_f32,
    _rms_norm_quant_kernel,
    _rms_norm_quant_rows_kernel,
    _round_to,
    _store_as,
)
from fxfuse.kernels.rms_norm_quant_ref import rms_norm_quant_ref, rms_norm_ref
from fxfuse.runtime import launch_tables
from fxfuse.runtime.target import TARGETS, detect_target, interpreting

# fmt: off
# (Kernel arguments stay grouped by role, as in the Triton tutorials.)


# ---------------------------------------------------------------------------------------------
# barrier


@triton.jit
def _swap_flags(flags, expect: tl.constexpr, new: tl.constexpr, done, SEM: tl.constexpr):
    """Swap every flag not yet `done` from `expect` to `new`, spinning until each has swapped.
    Done lanes issue CAS(new → new), which never changes memory (atomics have no mask)."""
    while tl.min(done.to(tl.int32), axis=0) == 0:
        compare = tl.where(done, new, expect)
        old = tl.atomic_cas(flags, compare, tl.zeros_like(compare) + new, sem=SEM, scope="sys")
        done = done | (old == expect)


@triton.jit
def _peer_barrier(
    signal_pad_ptrs, program, channel,
    RANK: tl.constexpr, WORLD_SIZE: tl.constexpr, PEERS_POW2: tl.constexpr,
):
    """Program `program` of every rank arrives before any leaves; this program's earlier memory
    accesses are ordered before every namesake's later ones (release / acquire, system scope)."""
    tl.debug_barrier()  # every thread of this program is done with the buffers
    peers = tl.arange(0, PEERS_POW2)
    live = peers < WORLD_SIZE
    base = (program * 2 + channel) * WORLD_SIZE
    own_pad = tl.load(signal_pad_ptrs + RANK)
    peer_pads = tl.load(signal_pad_ptrs + peers, mask=live, other=0)
    # Lanes past WORLD_SIZE (W not a power of 2) aim at this rank's own flag and start done.
    send = tl.where(live, peer_pads, own_pad).to(tl.pointer_type(tl.int32)) + base + RANK
    receive = own_pad.to(tl.pointer_type(tl.int32)) + base + tl.where(live, peers, RANK)
    _swap_flags(send, 0, 1, peers >= WORLD_SIZE, "release")
    _swap_flags(receive, 1, 0, peers >= WORLD_SIZE, "acquire")
    tl.debug_barrier()  # every thread of this program sees what the namesakes wrote


# ---------------------------------------------------------------------------------------------
# kernel


# M varies per call: specializing on it would only multiply compiles.
@triton.jit(do_not_specialize=["M"])
def _allreduce_rms_norm_quant_kernel(
    # pointers
    x_ptr, residual_ptr, weight_ptr, h_ptr, y_ptr, q_ptr, scale_ptr,
    # peers: (W,) int64 tables of every rank's symmetric buffer and signal pad
    buffer_ptrs, signal_pad_ptrs,
    # sizes and scalars
    M, N, eps, weight_offset, quant_eps,
    # strides, in elements of each tensor's own dtype (q: bytes)
    stride_xm, stride_xn, stride_rm, stride_rn, stride_w, stride_hm, stride_ym, stride_qm,
    stride_sm, stride_sg,
    # process group
    RANK: tl.constexpr, WORLD_SIZE: tl.constexpr, PEERS_POW2: tl.constexpr,
    # dtypes and switches (those of _rms_norm_quant_kernel)
    X_DTYPE: tl.constexpr, NORM_DTYPE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT_OFFSET: tl.constexpr, ROUND_BEFORE_WEIGHT: tl.constexpr, WRITE_NORM: tl.constexpr,
    QUANT: tl.constexpr, FP8_MAX: tl.constexpr, FP8_FNUZ: tl.constexpr, FP8_NATIVE: tl.constexpr,
    EPS_ON_SCALE: tl.constexpr, APPLY_RECIPROCAL: tl.constexpr, MX_ROUNDING: tl.constexpr,
    EXACT_CASTS: tl.constexpr, CONST_DIV_AS_MUL: tl.constexpr,
    # meta-parameters: BLOCK_N × COL_TILES for the publish and reduce phases; the norm's tiling
    # as rms_norm_quant's launcher picks it: ROW_TILE (one (NG, G) tile per row) or chunked tiles
    BLOCK_N: tl.constexpr, COL_TILES: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr,
    ROW_TILE: tl.constexpr, NG: tl.constexpr, G: tl.constexpr,
    GROUP: tl.constexpr, CHUNK: tl.constexpr, VEC: tl.constexpr, TILE_CHUNKS: tl.constexpr,
    NUM_TILES: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_n = tl.arange(0, BLOCK_N)
    # Symmetric buffers are allocation-aligned: 16-byte vector accesses when N allows.
    own_buffer = tl.multiple_of(tl.load(buffer_ptrs + RANK).to(tl.pointer_type(X_DTYPE)), 16)

    # 1. publish this program's rows of x in this rank's buffer
    for i in tl.static_range(ROWS_PER_PROGRAM):
        row_i32 = pid * ROWS_PER_PROGRAM + i
        row = row_i32.to(tl.int64)
        for t in range(COL_TILES):
            cols = t * BLOCK_N + offs_n
            mask = (cols < N) & (row_i32 < M)
            x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=mask)
            tl.store(own_buffer + row * N + cols, x, mask=mask)

    # 2. every rank has published these rows
    _peer_barrier(signal_pad_ptrs, pid, 0, RANK, WORLD_SIZE, PEERS_POW2)

    # 3. h = round(Σ_rank buffer[rank][row]) (+ residual), the sum in fp32 in rank order
    first_buffer = tl.multiple_of(tl.load(buffer_ptrs).to(tl.pointer_type(X_DTYPE)), 16)
    for i in tl.static_range(ROWS_PER_PROGRAM):
        row_i32 = pid * ROWS_PER_PROGRAM + i
        row = row_i32.to(tl.int64)
        for t in range(COL_TILES):
            cols = t * BLOCK_N + offs_n
            mask = (cols < N) & (row_i32 < M)
            total = _load_f32(first_buffer + row * N + cols, mask, EXACT_CASTS)  # -0 stays -0
            for peer in tl.static_range(1, WORLD_SIZE):
                peer_buffer = tl.multiple_of(
                    tl.load(buffer_ptrs + peer).to(tl.pointer_type(X_DTYPE)), 16
                )
                total += _load_f32(peer_buffer + row * N + cols, mask, EXACT_CASTS)
            h = _round_to(total, X_DTYPE, EXACT_CASTS)
            if HAS_RESIDUAL:
                r = _load_f32(
                    residual_ptr + row * stride_rm + cols * stride_rn, mask, EXACT_CASTS
                )
                h = _round_to(h + r, X_DTYPE, EXACT_CASTS)
            _store_as(h_ptr + row * stride_hm + cols, h, mask, EXACT_CASTS)

    # 4. no rank reads these rows of any buffer any more (and h is visible to this program)
    _peer_barrier(signal_pad_ptrs, pid, 1, RANK, WORLD_SIZE, PEERS_POW2)

    # 5. RMSNorm (+ quant) of the same rows of h: the two-kernel path's own code
    if ROW_TILE:
        _rms_norm_quant_rows_kernel(
            x_ptr=h_ptr, residual_ptr=h_ptr, weight_ptr=weight_ptr, h_ptr=h_ptr, y_ptr=y_ptr,
            q_ptr=q_ptr, scale_ptr=scale_ptr,
            M=M, N=N, eps=eps, weight_offset=weight_offset, quant_eps=quant_eps,
            stride_xm=stride_hm, stride_xn=1, stride_rm=stride_hm, stride_rn=1,
            stride_w=stride_w, stride_hm=stride_hm, stride_ym=stride_ym, stride_qm=stride_qm,
            stride_sm=stride_sm, stride_sg=stride_sg,
            X_DTYPE=X_DTYPE, NORM_DTYPE=NORM_DTYPE, HAS_RESIDUAL=False,
            HAS_WEIGHT_OFFSET=HAS_WEIGHT_OFFSET, ROUND_BEFORE_WEIGHT=ROUND_BEFORE_WEIGHT,
            WRITE_NORM=WRITE_NORM, QUANT=QUANT, FP8_MAX=FP8_MAX, FP8_FNUZ=FP8_FNUZ,
            FP8_NATIVE=FP8_NATIVE, EPS_ON_SCALE=EPS_ON_SCALE, APPLY_RECIPROCAL=APPLY_RECIPROCAL,
            MX_ROUNDING=MX_ROUNDING, EXACT_CASTS=EXACT_CASTS, CONST_DIV_AS_MUL=CONST_DIV_AS_MUL,
            NG=NG, G=G, ROWS_PER_PROGRAM=ROWS_PER_PROGRAM,
        )
    else:
        _rms_norm_quant_kernel(
            x_ptr=h_ptr, residual_ptr=h_ptr, weight_ptr=weight_ptr, h_ptr=h_ptr, y_ptr=y_ptr,
            q_ptr=q_ptr, scale_ptr=scale_ptr,
            M=M, N=N, eps=eps, weight_offset=weight_offset, quant_eps=quant_eps,
            stride_xm=stride_hm, stride_xn=1, stride_rm=stride_hm, stride_rn=1,
            stride_w=stride_w, stride_hm=stride_hm, stride_ym=stride_ym, stride_qm=stride_qm,
            stride_sm=stride_sm, stride_sg=stride_sg,
            X_DTYPE=X_DTYPE, NORM_DTYPE=NORM_DTYPE, HAS_RESIDUAL=False,
            HAS_WEIGHT_OFFSET=HAS_WEIGHT_OFFSET, ROUND_BEFORE_WEIGHT=ROUND_BEFORE_WEIGHT,
            WRITE_NORM=WRITE_NORM, QUANT=QUANT, FP8_MAX=FP8_MAX, FP8_FNUZ=FP8_FNUZ,
            FP8_NATIVE=FP8_NATIVE, EPS_ON_SCALE=EPS_ON_SCALE, APPLY_RECIPROCAL=APPLY_RECIPROCAL,
            MX_ROUNDING=MX_ROUNDING, EXACT_CASTS=EXACT_CASTS, CONST_DIV_AS_MUL=CONST_DIV_AS_MUL,
            GROUP=GROUP, CHUNK=CHUNK, VEC=VEC, TILE_CHUNKS=TILE_CHUNKS, NUM_TILES=NUM_TILES,
            ROWS_PER_PROGRAM=ROWS_PER_PROGRAM,
        )


# fmt: on
# ---------------------------------------------------------------------------------------------
# launch settings

KERNEL_NAME = "allreduce_oneshot"
CONFIG_FIELDS = ("MAX_BYTES", "MAX_PROGRAMS", "BLOCK_N")
FLAG_BYTES = 4  # one int32 flag per (program, channel, rank)
CHANNELS = 2


def max_message_bytes(target: str, m: int, n: int) -> int:
    """The launch table's largest message (per rank, bytes) for the one-shot kernel."""
    return launch_tables.lookup(KERNEL_NAME, target, m=m, n=n)["MAX_BYTES"]


def buffer_bytes_for(target: str) -> int:
    """Per-rank symmetric buffer size: the largest MAX_BYTES of the target's table."""
    spec = launch_tables.load_table(KERNEL_NAME)["targets"]["sm90" if target == "cpu" else target]
    return max(entry["config"]["MAX_BYTES"] for entry in spec["entries"])


def max_programs(signal_pad_bytes: int, world_size: int) -> int:
    """Programs whose flags fit the signal pad: CHANNELS flags per (program, rank)."""
    return signal_pad_bytes // (FLAG_BYTES * CHANNELS * world_size)


# ---------------------------------------------------------------------------------------------
# launcher


@dataclasses.dataclass(frozen=True)
class Peers:
    """Every rank's symmetric buffer and signal pad, as (W,) int64 address tables on the kernel's
    device; buffer_bytes and signal_pad_bytes are each rank's sizes."""

    buffer_ptrs: torch.Tensor
    signal_pad_ptrs: torch.Tensor
    rank: int
    buffer_bytes: int
    signal_pad_bytes: int

    @property
    def world_size(self) -> int:
        return self.buffer_ptrs.numel()


def _check_peers(peers: Peers, device: torch.device):
    if not isinstance(peers, Peers):
        raise ValueError(f"peers: expected a Peers, got {type(peers).__name__}")  # noqa: TRY004
    for name in ("buffer_ptrs", "signal_pad_ptrs"):
        table = getattr(peers, name)
        if table.dtype != torch.int64 or table.dim() != 1 or table.device != device:
            raise ValueError(
                f"peers: {name} must be a 1-D int64 tensor on {device}, got {table.dtype} "
                f"{tuple(table.shape)} on {table.device}"
            )
    if peers.signal_pad_ptrs.numel() != peers.world_size or peers.world_size < 1:
        raise ValueError(
            f"peers: {peers.world_size} buffers but {peers.signal_pad_ptrs.numel()} signal pads"
        )
    if not 0 <= peers.rank < peers.world_size:
        raise ValueError(f"peers: rank {peers.rank} outside the group of {peers.world_size}")


def _launch_config(target, device, m, n, world_size, signal_pad_bytes, config) -> dict:
    target = detect_target(device) if target is None else target
    if target not in TARGETS:
        raise ValueError(f"target: unknown {target!r}; expected one of {TARGETS}")
    config = dict(config or {})
    unknown = sorted(set(config) - set(CONFIG_FIELDS) - set(norm_quant.CONFIG_FIELDS))
    if unknown:
        raise ValueError(
            f"config: unknown keys {unknown}; expected a subset of "
            f"{CONFIG_FIELDS + norm_quant.CONFIG_FIELDS}"
        )
    resolved = launch_tables.lookup(KERNEL_NAME, target, m=m, n=n)
    resolved.update({k: v for k, v in config.items() if k in CONFIG_FIELDS})
    norm_config = {k: v for k, v in config.items() if k in norm_quant.CONFIG_FIELDS}
    resolved.update(norm_quant._launch_config(target, device, m, n, norm_config))
    block, programs = resolved["BLOCK_N"], resolved["MAX_PROGRAMS"]
    if not isinstance(block, int) or block < 16 or block & (block - 1):
        raise ValueError(f"config: BLOCK_N must be a power of 2 >= 16, got {block!r}")
    if not isinstance(programs, int) or programs < 1:
        raise ValueError(f"config: MAX_PROGRAMS must be a positive int, got {programs!r}")
    cap = min(programs, max_programs(signal_pad_bytes, world_size))
    if cap < 1:
        raise ValueError(
            f"config: no program's flags fit a {signal_pad_bytes}-byte signal pad for "
            f"{world_size} ranks"
        )
    # Rows per program: the norm table's, doubled until the grid fits the cap (a power of 2, so
    # token counts share compiles).
    rows = resolved["ROWS_PER_PROGRAM"]
    while triton.cdiv(m, rows) > cap:
        rows *= 2
    resolved["ROWS_PER_PROGRAM"] = rows
    return resolved


def _norm_tiling(quant_kind, group, chunk, n, element_size, block_n_max) -> dict:
    """The norm phase's tiling, chosen as rms_norm_quant's launcher chooses it: one (NG, G) tile
    per row when the padded row fits BLOCK_N_MAX, else the chunked tiles."""
    grouped = quant_kind.value in (norm_quant.QUANT_FP8_GROUP.value, norm_quant.QUANT_MXFP4.value)
    g = group if grouped else triton.next_power_of_2(n)
    ng = triton.next_power_of_2(triton.cdiv(n, g))
    num_groups = triton.cdiv(n, group)
    tile_chunks = max(1, block_n_max // chunk)
    return {
        "ROW_TILE": g & (g - 1) == 0 and ng * g <= block_n_max,
        "NG": ng,
        "G": g,
        "GROUP": group,
        "CHUNK": chunk,
        "VEC": min(chunk, 16 // element_size),
        "TILE_CHUNKS": min(tile_chunks, triton.next_power_of_2(num_groups)),
        "NUM_TILES": triton.cdiv(num_groups, tile_chunks),
    }


def allreduce_rms_norm_quant(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    peers: Peers,
    weight_offset: float = 0.0,
    round_before_weight: bool = True,
    norm_dtype: torch.dtype | None = None,
    quant: str | None = "fp8",
    group_size: int = 0,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn,
    quant_eps: float = 1e-10,
    eps_on_scale: bool = False,
    apply_reciprocal: bool = False,
    scale_col_major: bool = False,
    rounding: str = "even",
    write_norm: bool = False,
    config: dict | None = None,
    target: str | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """Sum of x over the ranks of `peers` [+ residual] → RMSNorm [→ quant], in one launch that
    every rank of the group must make with the same shapes and arguments.

    Returns (q, scale, h, y): h the reduced (+ residual) value; quant None → (None, None, h, y)
    with y the normed output in norm_dtype; otherwise y is that output when write_norm, else None.
    """
    norm_quant._check_inputs(x, weight, residual, norm_dtype)
    _check_peers(peers, x.device)
    if quant is not None and quant not in norm_quant.QUANT_KINDS:
        raise ValueError(f"quant: expected None or one of {norm_quant.QUANT_KINDS}, got {quant!r}")
    m, n = x.shape
    if m * n * x.element_size() > peers.buffer_bytes:
        raise ValueError(
            f"x: {m} x {n} {x.dtype} does not fit the {peers.buffer_bytes}-byte symmetric buffer"
        )
    device = x.device
    norm_dtype = norm_dtype or x.dtype
    y = None
    if quant is None:
        formats.check_rounding(rounding)
        if fp8_dtype not in formats.FP8_DTYPES:
            raise ValueError(f"fp8_dtype: expected one of {formats.FP8_DTYPES}, got {fp8_dtype}")
        q = scale = None
        quant_kind = norm_quant.QUANT_NONE
        group = chunk = min(norm_quant.ROW_CHUNK, triton.next_power_of_2(n))
        y = torch.empty((m, n), dtype=norm_dtype, device=device)
    else:  # the norm-quant launcher's own checks and q / scale buffers
        quant_kind, group, chunk, q, scale = norm_quant._quant_outputs(
            x, quant, group_size, fp8_dtype, scale_col_major, rounding
        )
        if write_norm:
            y = torch.empty((m, n), dtype=norm_dtype, device=device)
    h = torch.empty((m, n), dtype=x.dtype, device=device)
    if m == 0:
        return q, scale, h, y
    world = peers.world_size
    cfg = _launch_config(target, device, m, n, world, peers.signal_pad_bytes, config)
    tiling = _norm_tiling(quant_kind, group, chunk, n, x.element_size(), cfg["BLOCK_N_MAX"])
    rows = cfg["ROWS_PER_PROGRAM"]
    block_n = min(cfg["BLOCK_N"], triton.next_power_of_2(n))
    residual_t = x if residual is None else residual
    y_t = h if y is None else y
    q_t = h if q is None else q.view(torch.uint8)
    scale_t = h if scale is None else scale
    scale_strides = (0, 0) if scale is None else scale.stride()
    _allreduce_rms_norm_quant_kernel[(triton.cdiv(m, rows),)](
        x,
        residual_t,
        weight,
        h,
        y_t,
        q_t,
        scale_t,
        peers.buffer_ptrs,
        peers.signal_pad_ptrs,
        m,
        n,
        float(eps),
        float(weight_offset),
        float(quant_eps),
        x.stride(0),
        x.stride(1),
        residual_t.stride(0),
        residual_t.stride(1),
        weight.stride(0),
        h.stride(0),
        y_t.stride(0),
        q_t.stride(0),
        scale_strides[0],
        scale_strides[1],
        RANK=peers.rank,
        WORLD_SIZE=world,
        PEERS_POW2=triton.next_power_of_2(world),
        X_DTYPE=norm_quant._TL_DTYPES[x.dtype],
        NORM_DTYPE=norm_quant._TL_DTYPES[norm_dtype],
        HAS_RESIDUAL=residual is not None,
        HAS_WEIGHT_OFFSET=weight_offset != 0,
        ROUND_BEFORE_WEIGHT=bool(round_before_weight),
        WRITE_NORM=y is not None,
        QUANT=quant_kind.value,
        FP8_MAX=formats.fp8_max(fp8_dtype),
        FP8_FNUZ=fp8_dtype == torch.float8_e4m3fnuz,
        FP8_NATIVE=norm_quant._fp8_native(fp8_dtype, device),
        EPS_ON_SCALE=bool(eps_on_scale),
        APPLY_RECIPROCAL=bool(apply_reciprocal),
        MX_ROUNDING=formats.MXFP4_ROUNDINGS.index(rounding),
        EXACT_CASTS=interpreting(),
        CONST_DIV_AS_MUL=device.type != "cpu",
        BLOCK_N=block_n,
        COL_TILES=triton.cdiv(n, block_n),
        ROWS_PER_PROGRAM=rows,
        **tiling,
        num_warps=cfg["num_warps"],
    )
    return q, scale, h, y


# ---------------------------------------------------------------------------------------------
# torch reference


def allreduce_rms_norm_quant_ref(
    xs: list[torch.Tensor],
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    weight_offset: float = 0.0,
    round_before_weight: bool = True,
    norm_dtype: torch.dtype | None = None,
    reciprocal_sqrt: bool = False,
    quant: str | None = "fp8",
    **quant_args,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """The kernel's semantics given every rank's x (in rank order): (q, scale, h, y) as the
    launcher returns them; quant_args as rms_norm_quant_ref takes them."""
    if not xs:
        raise ValueError("xs: expected every rank's tensor, got none")
    total = xs[0].float()
    for x in xs[1:]:
        total = total + x.float()
    reduced = total.to(xs[0].dtype)
    h = reduced if residual is None else reduced + residual
    norm_args = (weight_offset, round_before_weight, norm_dtype, reciprocal_sqrt)
    if quant is None:
        y, _ = rms_norm_ref(h, weight, eps, None, *norm_args)
        return None, None, h, y
    q, scale, _ = rms_norm_quant_ref(
        h, weight, eps, None, **dict(zip(_NORM_ARGS, norm_args)), quant=quant, **quant_args
    )
    return q, scale, h, None


_NORM_ARGS = ("weight_offset", "round_before_weight", "norm_dtype", "reciprocal_sqrt")
