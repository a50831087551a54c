"""torch.library custom ops for all-reduce → [residual add →] RMSNorm [→ quant [→ GEMM]]
(`torch.ops.fxfuse.allreduce_rms_norm` / `allreduce_rms_norm_quant` /
`allreduce_rms_norm_quant_gemm`).

The group travels by name, as in torch's functional collectives; each call picks its path at run
time from what every rank of the group shares (so all ranks take the same one):
- local: no group name, torch.distributed not initialised, or a group of one rank: the fused
  norm(-quant) ops of x itself;
- one-shot: CUDA / ROCm tensors, torch symmetric memory available, a message (rows × N × element
  size, per rank) of at most MAX_BYTES (runtime/tables/allreduce_oneshot.json, untimed; the env
  FXFUSE_ALLREDUCE_ONESHOT_MAX_BYTES overrides it, 0 turns the path off): one Triton kernel
  (kernels/allreduce_oneshot.py);
- collective: the functional all-reduce through the group's backend (NCCL / RCCL / gloo), then
  the fused norm(-quant) op: exactly the unfused graph's bytes.
The ops return h (the reduced value, + residual) and, with a quant, q and scale; with the GEMM,
its output. The GEMM op adds the token-count dispatch of the GEMM chain (runtime/gemm_ops.py):
M > prologue_quant_max_m: all-reduce + norm + quant, then the A8W8 / AFP4WFP4 GEMM; M <= it:
all-reduce + norm, then the prequant GEMM (A16W8 / A16WFP4). Explicit fakes; any leading dims.
"""

from __future__ import annotations

import os

import torch

from fxfuse.runtime import (
    collective_ops,
    gemm_ops,
    norm_quant_ops,  # noqa: F401 - registers the fused norm(-quant) ops
)
from fxfuse.runtime.dispatch import use_triton
from fxfuse.runtime.registry import fused_op, variant_schema
from fxfuse.runtime.target import detect_target

fxfuse = torch.ops.fxfuse
ONE_SHOT_MAX_BYTES_ENV = "FXFUSE_ALLREDUCE_ONESHOT_MAX_BYTES"
PATHS = ("local", "one_shot", "collective")


# --- dispatch -----------------------------------------------------------------------------------


def _env_max_bytes() -> int | None:
    value = os.environ.get(ONE_SHOT_MAX_BYTES_ENV, "").strip()
    if not value:
        return None
    try:
        parsed = int(value)
    except ValueError:
        parsed = -1
    if parsed < 0:
        raise ValueError(f"{ONE_SHOT_MAX_BYTES_ENV}: expected a byte count >= 0, got {value!r}")
    return parsed


# The one-shot kernel is opt-in until a multi-GPU run verifies it; only an explicit
# FXFUSE_ALLREDUCE_ONESHOT_MAX_BYTES turns it on. On one H200 (2026-12-03) it passes at world size
# 1 through an NCCL group's symmetric memory (back to back and under CUDA-graph replay) and with
# two ranks emulated on one GPU (tests/distributed/test_allreduce_gpu.py). The first emulated run
# (2026-12-02) hung because a rank's kernel module was loaded lazily while the other grid spun.
ONE_SHOT_VERIFIED = False


def one_shot_max_bytes(target: str, m: int, n: int) -> int:
    """Largest message (per rank, bytes) that takes the one-shot kernel: the env when set, else
    the table once the kernel is verified on the device, else 0 (off)."""
    env = _env_max_bytes()
    if env is not None:
        return env
    if not ONE_SHOT_VERIFIED:
        return 0
    from fxfuse.kernels import allreduce_oneshot

    return allreduce_oneshot.max_message_bytes(target, m, n)


def choose_path(
    world_size: int, device: torch.device, message_bytes: int, max_bytes: int, symmetric: bool
) -> str:
    """local | one_shot | collective, from facts every rank of the group shares (max_bytes 0:
    never one-shot)."""
    if world_size <= 1:
        return "local"
    if device.type == "cuda" and symmetric and 0 < max_bytes and message_bytes <= max_bytes:
        return "one_shot"
    return "collective"


def _path(x: torch.Tensor, group_name: str | None) -> str:
    world = collective_ops.world_size(group_name)
    if world <= 1:
        return "local"
    symmetric = use_triton(x) and collective_ops.symmetric_memory_available(x.device)
    max_bytes = 0
    if x.device.type == "cuda" and symmetric:
        n = x.shape[-1]
        max_bytes = one_shot_max_bytes(detect_target(x.device), x.numel() // max(n, 1), n)
    return choose_path(world, x.device, x.numel() * x.element_size(), max_bytes, symmetric)


QUANT_ARG_NAMES = (
    "quant", "group_size", "fp8_dtype", "quant_eps", "eps_on_scale", "apply_reciprocal",
    "scale_col_major", "rounding",
)  # fmt: skip


def run(x, residual, weight, group_name, eps, norm_args, quant_args=None, write_norm=False):
    """The fused ops' body: (y, h) when quant_args is None, else (q, scale, h), and y after them
    when write_norm. norm_args and quant_args are the ops' arguments after eps, in order.
    `allreduce_rms_norm_quant_gemm` calls it with or without quant_args (by token count); the
    path depends on x alone either way."""
    path = _path(x, group_name)
    if path == "one_shot":
        return _one_shot(x, residual, weight, group_name, eps, norm_args, quant_args, write_norm)
    reduced = collective_ops.all_reduce_sum(x, group_name) if path == "collective" else x
    args = (weight, eps, *norm_args, *(quant_args or ()))
    if residual is not None:
        if quant_args is None:
            return fxfuse.add_rms_norm(reduced, residual, *args)
        if write_norm:
            return fxfuse.add_rms_norm_quant_with_norm(reduced, residual, *args)
        return fxfuse.add_rms_norm_quant(reduced, residual, *args)
    h = reduced.clone() if reduced is x else reduced  # outputs never alias inputs
    if quant_args is None:
        return fxfuse.rms_norm(reduced, *args), h
    if write_norm:
        q, scale, y = fxfuse.rms_norm_quant_with_norm(reduced, *args)
        return q, scale, h, y
    return (*fxfuse.rms_norm_quant(reduced, *args), h)


def _one_shot(x, residual, weight, group_name, eps, norm_args, quant_args, write_norm=False):
    from fxfuse.kernels import allreduce_oneshot

    target = detect_target(x.device)
    env = _env_max_bytes()
    buffer_bytes = env if env is not None else allreduce_oneshot.buffer_bytes_for(target)
    peers = collective_ops.symmetric_peers(group_name, x.device, buffer_bytes)
    n = x.shape[-1]
    residual_rows = None if residual is None else residual.reshape(-1, n)
    weight_offset, round_before_weight, norm_dtype, _ = norm_args  # the kernel computes 1 / sqrt
    quant = {"quant": None} if quant_args is None else dict(zip(QUANT_ARG_NAMES, quant_args))
    q, scale, h, y = allreduce_oneshot.allreduce_rms_norm_quant(
        x.reshape(-1, n), weight, eps, residual_rows, peers=peers, weight_offset=weight_offset,
        round_before_weight=round_before_weight, norm_dtype=norm_dtype, **quant, target=target,
        write_norm=write_norm and quant_args is not None,
    )  # fmt: skip
    h = h.reshape(x.shape)
    if quant_args is None:
        return y.reshape(x.shape), h
    if not (quant["scale_col_major"] and x.dim() == 2):
        scale = scale.contiguous()
    lead = x.shape[:-1]
    fused = q.reshape(*lead, q.shape[-1]), scale.reshape(*lead, scale.shape[-1]), h
    return (*fused, y.reshape(x.shape)) if write_norm else fused


# --- all-reduce → [residual add →] RMSNorm ------------------------------------------------------


@fused_op("fxfuse::allreduce_rms_norm", mutates_args=())
def allreduce_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    group_name: str | None,
    eps: float,
    weight_offset: float = 0.0,
    round_before_weight: bool = True,
    norm_dtype: torch.dtype | None = None,
    reciprocal_sqrt: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """h = all_reduce_sum(x) (+ residual); returns (rms_norm(h), h) as `fxfuse.add_rms_norm`."""
    norm_args = (weight_offset, round_before_weight, norm_dtype, reciprocal_sqrt)
    return run(x, residual, weight, group_name, eps, norm_args)


@allreduce_rms_norm.register_fake
def _(x, residual, weight, group_name, eps, *norm_args):
    if residual is not None:
        return fxfuse.add_rms_norm(x, residual, weight, eps, *norm_args)
    return fxfuse.rms_norm(x, weight, eps, *norm_args), torch.empty_like(x)


# --- all-reduce → [residual add →] RMSNorm → quant ----------------------------------------------


@fused_op("fxfuse::allreduce_rms_norm_quant", mutates_args=())
def allreduce_rms_norm_quant(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    group_name: str | None,
    eps: float,
    weight_offset: float,
    round_before_weight: bool,
    norm_dtype: torch.dtype | None,
    reciprocal_sqrt: bool,
    quant: str,
    group_size: int,
    fp8_dtype: torch.dtype,
    quant_eps: float,
    eps_on_scale: bool,
    apply_reciprocal: bool,
    scale_col_major: bool,
    rounding: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h = all_reduce_sum(x) (+ residual); returns (q, scale, h) as `fxfuse.add_rms_norm_quant`."""
    norm_args = (weight_offset, round_before_weight, norm_dtype, reciprocal_sqrt)
    quant_args = (quant, group_size, fp8_dtype, quant_eps, eps_on_scale, apply_reciprocal,
                  scale_col_major, rounding)  # fmt: skip
    return run(x, residual, weight, group_name, eps, norm_args, quant_args)


@allreduce_rms_norm_quant.register_fake
def _(x, residual, weight, group_name, eps, *args):
    if residual is not None:
        return fxfuse.add_rms_norm_quant(x, residual, weight, eps, *args)
    q, scale = fxfuse.rms_norm_quant(x, weight, eps, *args)
    return q, scale, torch.empty_like(x)


@fused_op("fxfuse::allreduce_rms_norm_quant_with_norm",
          schema=variant_schema(allreduce_rms_norm_quant, "(Tensor, Tensor, Tensor, Tensor)"))
def allreduce_rms_norm_quant_with_norm(x, residual, weight, group_name, eps, *args):
    """allreduce_rms_norm_quant (the same arguments) that also returns the normed y (for the
    norm's other readers, an MoE router say): (q, scale, h, y)."""
    return run(x, residual, weight, group_name, eps, args[:4], args[4:], write_norm=True)


@allreduce_rms_norm_quant_with_norm.register_fake
def _(x, residual, weight, group_name, eps, *args):
    if residual is not None:
        return fxfuse.add_rms_norm_quant_with_norm(x, residual, weight, eps, *args)
    q, scale, y = fxfuse.rms_norm_quant_with_norm(x, weight, eps, *args)
    return q, scale, torch.empty_like(x), y


# --- all-reduce → [residual add →] RMSNorm → quant → GEMM ---------------------------------------


@fused_op("fxfuse::allreduce_rms_norm_quant_gemm", mutates_args=())
def allreduce_rms_norm_quant_gemm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    group_name: str | None,
    eps: float,
    weight_offset: float,
    round_before_weight: bool,
    norm_dtype: torch.dtype | None,
    reciprocal_sqrt: bool,
    quant: str,
    group_size: int,
    fp8_dtype: torch.dtype,
    quant_eps: float,
    eps_on_scale: bool,
    apply_reciprocal: bool,
    scale_col_major: bool,
    rounding: str,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    out_dtype: torch.dtype,
    prologue_quant_max_m: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """h = all_reduce_sum(x) (+ residual); returns (GEMM of quant(rms_norm(h)), h), out (M, N)
    for x (..., K). Above prologue_quant_max_m rows the norm kernel quantizes, then the quantized
    GEMM; at or below, the norm alone, then the prequant GEMM: the same quantized bytes. Every
    rank of the group has the same M, so all ranks take the same side (and the same path)."""
    return _gemm_chain(
        x, residual, weight, group_name, eps,
        (weight_offset, round_before_weight, norm_dtype, reciprocal_sqrt, quant, group_size,
         fp8_dtype, quant_eps, eps_on_scale, apply_reciprocal, scale_col_major, rounding),
        w, w_scale, out_dtype, prologue_quant_max_m,
    )  # fmt: skip


def _gemm_chain(x, residual, weight, group_name, eps, norm_quant, w, w_scale, out_dtype, max_m,
                keep_norm=False):
    """The GEMM ops' body: `run` with or without the quant (by token count) under
    `gemm_ops.dispatch_by_rows`; norm_quant: the ops' arguments after eps up to the GEMM's."""
    norm_args, quant_args = tuple(norm_quant[:4]), tuple(norm_quant[4:])
    return gemm_ops.dispatch_by_rows(
        x, w, w_scale, out_dtype, dict(zip(QUANT_ARG_NAMES, quant_args)), max_m,
        lambda: run(x, residual, weight, group_name, eps, norm_args, quant_args,
                    write_norm=keep_norm),
        lambda: run(x, residual, weight, group_name, eps, norm_args),
        keep_norm,
    )  # fmt: skip


@allreduce_rms_norm_quant_gemm.register_fake
def _(x, residual, weight, group_name, eps, *args):
    *norm_quant, w, _w_scale, out_dtype, max_m = args
    quant_dict = dict(zip(QUANT_ARG_NAMES, norm_quant[4:]))
    return gemm_ops._gemm_fake(x, w, quant_dict, out_dtype, max_m), torch.empty_like(x)


@fused_op("fxfuse::allreduce_rms_norm_quant_gemm_with_norm",
          schema=variant_schema(allreduce_rms_norm_quant_gemm, "(Tensor, Tensor, Tensor)"))
def allreduce_rms_norm_quant_gemm_with_norm(x, residual, weight, group_name, eps, *args):
    """allreduce_rms_norm_quant_gemm (the same arguments) that also returns the normed y:
    (out, h, y). y comes from the kernel that runs anyway on either side of the dispatch."""
    *norm_quant, w, w_scale, out_dtype, max_m = args
    return _gemm_chain(x, residual, weight, group_name, eps, norm_quant, w, w_scale, out_dtype,
                       max_m, keep_norm=True)


@allreduce_rms_norm_quant_gemm_with_norm.register_fake
def _(x, residual, weight, group_name, eps, *args):
    out, h = fxfuse.allreduce_rms_norm_quant_gemm(x, residual, weight, group_name, eps, *args)
    return out, h, gemm_ops._norm_fake(x, args)
