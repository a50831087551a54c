"""Pattern `allreduce_rmsnorm` on CPU with gloo: one spawned session of 4 ranks runs the cases (on
the world, then on a pair of ranks) and the tests below check them: every spelling fires on every
rank and gives the unfused bytes, on every rank the same, the chain into a GEMM too (one graph with
a dynamic token count, run on both sides of prologue_quant_max_m); near-misses don't fire.
In-process: the fused ops without a group, the run-time path choice, and the one-shot kernel
simulated under Triton's interpreter (every rank's buffer and signal pad a CPU tensor; the ranks
run one after another, each finding its peers' flags already raised) plus a compile-only check of
it for sm90 / gfx942 / gfx950."""

from __future__ import annotations

import datetime
import hashlib
import multiprocessing
import os
import queue
import signal
import socket
import textwrap
import time
import traceback

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import _functional_collectives as funcol

import fxfuse
from fxfuse.models.quant_linear import QuantLinear
from fxfuse.runtime import allreduce_ops
from tests.helpers import bytes_equal, compile_in_subprocess, fused_targets, outputs_bytes_equal
from tests.patterns.test_rms_norm_quant import (
    fxfuse_quant_group,
    group_128,
    llama,
    mxfp4,
    per_token_div,
    reciprocal_sqrt,
)

N = 256
NAME = "allreduce_rmsnorm"
FUSED_QUANT = "fxfuse.allreduce_rms_norm_quant.default"
FUSED_QUANT_WITH_NORM = "fxfuse.allreduce_rms_norm_quant_with_norm.default"
FUSED_NORM = "fxfuse.allreduce_rms_norm.default"
FUSED_GEMM = "fxfuse.allreduce_rms_norm_quant_gemm.default"
FUSED_GEMM_WITH_NORM = "fxfuse.allreduce_rms_norm_quant_gemm_with_norm.default"
GEMMS = ("fxfuse.gemm_fp8.default", "fxfuse.gemm_mxfp4.default")
GEMM_N = 128  # the GEMM's output features (K = N)
M_VALUES = (1, 4, 31, 32, 33, 200)  # both sides of prologue_quant_max_m = 32
SESSION_TIMEOUT_S = 180  # a hang guard: the session takes ~25 s on two idle cores

# --- model pieces (built inside each rank) ------------------------------------------------------

GROUP = None  # the process group of the cases now running (set by the session; None: the world)


def functional(x):
    return funcol.all_reduce(x, "sum", GROUP or dist.group.WORLD)


def in_place(x):
    y = x * 2  # torch.distributed.all_reduce writes its argument
    dist.all_reduce(y, group=GROUP)
    return y


def fxfuse_op(x):
    return fxfuse.ops.all_reduce(x, GROUP)


def reduce_max(x):
    return funcol.all_reduce(x, "max", GROUP or dist.group.WORLD)


class ARChain(nn.Module):
    """all-reduce → [residual add] → RMSNorm → [quant]; outputs (q, scale | y)[, h][, reduced]."""

    def __init__(
        self, reduce, norm, quant, residual, residual_first=False, reduced_out=False,
        norm_out=False,
    ):  # fmt: skip
        super().__init__()
        self.reduce, self.norm, self.quant = reduce, norm, quant
        self.residual, self.residual_first, self.reduced_out = residual, residual_first, reduced_out
        self.norm_out = norm_out  # y read elsewhere too (an MoE router: y · 2 here)
        self.weight = nn.Parameter((1 + 0.1 * torch.randn(N)).to(torch.bfloat16))

    def forward(self, x, r):
        a = self.reduce(x)
        h = a if not self.residual else (r + a if self.residual_first else a + r)
        y = self.norm(h, self.weight)
        out = tuple(self.quant(y)) if self.quant else (y,)
        out = (*out, h) if self.residual else out
        out = (*out, y * 2) if self.norm_out else out
        return (*out, a) if self.reduced_out else out


def _inputs(rank: int, m: int = 8):
    """x differs per rank; the residual stream is the same on every rank (tensor parallel)."""
    torch.manual_seed(0)
    r = torch.randn(m, N).to(torch.bfloat16)
    torch.manual_seed(100 + rank)
    return torch.randn(m, N).mul(3).to(torch.bfloat16), r


def _digest(outputs) -> str:
    digest = hashlib.sha256()
    for t in outputs:
        digest.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _collectives_left(gm) -> int:
    return sum(
        "_c10d_functional" in str(n.target) or n.target is torch.ops.aten.copy_.default
        for n in gm.graph.nodes
    )


def _fuse_and_compare(model, rank, interpret=False, m=8, run_ms=None) -> dict:
    """Fuses the model (captured at m rows) and compares it with the unfused model; with run_ms,
    captured with a dynamic token count and compared at each of those row counts."""
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    torch.manual_seed(0)  # the same weight on every rank
    model = model()
    x, r = _inputs(rank, m)
    rows = torch.export.Dim("rows", min=1, max=4096)
    dynamic = ({0: rows}, {0: rows}) if run_ms else None
    got, unequal = [], []
    with torch.no_grad():
        fused = fxfuse.apply_fusions(model, (x.clone(), r), dynamic_shapes=dynamic)
        for rows_now in run_ms or (m,):
            x, r = _inputs(rank, rows_now)
            want, out = model(x.clone(), r), fused(x.clone(), r)
            got.extend(out)
            if not outputs_bytes_equal(out, want):
                unequal.append(rows_now)
    report = fused.fxfuse_report
    return {
        "count": report.counts[NAME],
        "rmsnorm_quant": report.counts["rmsnorm_quant"],
        "targets": fused_targets(fused),
        "reasons": " | ".join(why for _, _, why in report.rejected),
        "equal": not unequal,
        "unequal_rows": unequal,
        "digest": _digest(got),
        "collectives_left": _collectives_left(fused),
    }


# --- cases: each runs on every rank of a session and returns what the tests check ---------------


def case_functional_residual_fp8(rank, world):
    return _fuse_and_compare(lambda: ARChain(functional, llama, per_token_div, True), rank)


def case_functional_plain_mxfp4(rank, world):
    return _fuse_and_compare(lambda: ARChain(functional, llama, mxfp4("even"), False), rank)


def case_in_place_residual_group128(rank, world):
    return _fuse_and_compare(lambda: ARChain(in_place, llama, group_128, True), rank)


def case_fxfuse_op_residual_first_norm_only(rank, world):
    return _fuse_and_compare(
        lambda: ARChain(fxfuse_op, llama, None, True, residual_first=True), rank
    )


def case_functional_plain_norm_only(rank, world):
    return _fuse_and_compare(lambda: ARChain(functional, llama, None, False), rank)


def case_interpreted_kernels(rank, world):
    """The fused norm-quant Triton kernel itself (interpreter) after the collective; the `1/sqrt`
    spelling is the one it matches bit for bit (see test_rms_norm_quant)."""
    return _fuse_and_compare(
        lambda: ARChain(functional, reciprocal_sqrt, per_token_div, True), rank, interpret=True, m=4
    )


def case_reduced_used_elsewhere(rank, world):
    return _fuse_and_compare(
        lambda: ARChain(functional, llama, per_token_div, True, reduced_out=True), rank
    )


def case_norm_read_elsewhere_residual_fp8(rank, world):
    return _fuse_and_compare(
        lambda: ARChain(functional, llama, per_token_div, True, norm_out=True), rank
    )


def case_norm_read_elsewhere_plain_mxfp4(rank, world):
    return _fuse_and_compare(
        lambda: ARChain(functional, llama, mxfp4("floor"), False, norm_out=True), rank
    )


def case_reduce_max(rank, world):
    return _fuse_and_compare(lambda: ARChain(reduce_max, llama, per_token_div, True), rank)


def case_in_place_on_graph_input(rank, world):
    def reduce_input(x):
        dist.all_reduce(x, group=GROUP)
        return x

    return _fuse_and_compare(lambda: ARChain(reduce_input, llama, per_token_div, True), rank)


class AliasedInPlace(nn.Module):
    """A view of the buffer taken before the in-place all-reduce reads the reduced values."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter((1 + 0.1 * torch.randn(N)).to(torch.bfloat16))

    def forward(self, x, r):
        y = x * 2
        first_row = y[0]
        dist.all_reduce(y, group=GROUP)
        return (*per_token_div(llama(y + r, self.weight)), first_row)


def case_in_place_buffer_aliased(rank, world):
    return _fuse_and_compare(AliasedInPlace, rank)


class SliceInPlace(nn.Module):
    """The in-place all-reduce of a slice of a wider buffer, which the graph returns: the reduced
    columns must reach the buffer (found by a probe: the write-back was erased)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter((1 + 0.1 * torch.randn(N)).to(torch.bfloat16))

    def forward(self, x, r):
        t = torch.cat([x, r]) * 2
        u = t[: x.shape[0]]  # a contiguous view (eager gloo reduces those in place)
        dist.all_reduce(u, group=GROUP)
        return (*per_token_div(llama(u, self.weight)), t)


def case_in_place_slice(rank, world):
    return _fuse_and_compare(SliceInPlace, rank)


def case_group_of_one(rank, world):
    group, _ = dist.new_subgroups(1)  # every rank alone: the all-reduce is the identity

    def reduce_alone(x):
        return funcol.all_reduce(x, "sum", group)

    return _fuse_and_compare(lambda: ARChain(reduce_alone, llama, per_token_div, True), rank)


def case_torch_compile(rank, world):
    os.environ["TRITON_INTERPRET"] = "0"
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = ARChain(functional, llama, per_token_div, True)
    x, r = _inputs(rank)
    with torch.no_grad():
        want = model(x, r)
        got = torch.compile(model, backend="fxfuse")(x, r)
    report = fxfuse.last_report()
    return {
        "count": report.counts.get(NAME, 0),
        "targets": [rw.replacement for rw in report.rewrites],
        "equal": outputs_bytes_equal(got, want),
        "digest": _digest(got),
    }


OPCHECK_NO_SCHEMA = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def case_opcheck(rank, world):
    os.environ["TRITON_INTERPRET"] = "0"
    x, r = _inputs(rank, 4)
    w = torch.randn(N, dtype=torch.bfloat16)
    group = (GROUP or dist.group.WORLD).group_name
    norm = (0.0, True, None, False)
    quant = ("fp8", 128, torch.float8_e4m3fn, 1e-10, False, False, True, "even")
    torch.library.opcheck(torch.ops.fxfuse.allreduce_rms_norm.default, (x, r, w, group, 1e-6))
    torch.library.opcheck(
        torch.ops.fxfuse.allreduce_rms_norm_quant.default,
        (x, None, w, group, 1e-6, *norm, *quant),
    )
    # The GEMM chain on both sides of the dispatch (4 rows; prologue_quant_max_m 32, then 0).
    # FP8 skips test_schema: it compares the inputs with allclose, which CPU FP8 lacks.
    fp8, mx = (QuantLinear(torch.randn(GEMM_N, N) / N**0.5, k) for k in ("fp8_rowwise", "mxfp4"))
    per_token = ("fp8", 0, torch.float8_e4m3fn, 1e-10, False, False, False, "even")
    mxfp4_even = ("mxfp4", 0, torch.float8_e4m3fn, 0.0, False, False, False, "even")
    checks = [
        ((x, r), per_token, (fp8.weight, fp8.weight_scale.reshape(-1, 1)), OPCHECK_NO_SCHEMA),
        ((x, None), mxfp4_even, (mx.weight, mx.weight_scale), None),
    ]
    for (x_in, residual), quant_args, gemm_weights, test_utils in checks:
        for max_m in (32, 0):
            args = (x_in, residual, w, group, 1e-6, *norm, *quant_args, *gemm_weights,
                    torch.bfloat16, max_m)  # fmt: skip
            kwargs = {} if test_utils is None else {"test_utils": test_utils}
            torch.library.opcheck(
                torch.ops.fxfuse.allreduce_rms_norm_quant_gemm.default, args, **kwargs
            )
    # The collective path's h is the all-reduce itself.
    _, _, h = torch.ops.fxfuse.allreduce_rms_norm_quant(x, None, w, group, 1e-6, *norm, *quant)
    return {"h": h.contiguous().view(torch.uint8).numpy().tobytes()}


# --- cases: the chain into a GEMM ---------------------------------------------------------------


class ARChainGemm(nn.Module):
    """all-reduce → [residual add] → RMSNorm → quant → fxfuse.ops GEMM (the reference GEMMs, so
    the unfused bytes are the fused op's on both sides of the dispatch); outputs (out[, h][, q]).
    batched: x is (1, M, N), its normed rows viewed to (M, N) for the quant."""

    def __init__(
        self, reduce, quant, residual, kind="fp8_rowwise", q_out=False, batched=False,
        norm_out=False,
    ):  # fmt: skip
        super().__init__()
        self.reduce, self.quant, self.residual, self.kind = reduce, quant, residual, kind
        self.q_out, self.batched, self.norm_out = q_out, batched, norm_out
        self.weight = nn.Parameter((1 + 0.1 * torch.randn(N)).to(torch.bfloat16))
        self.proj = QuantLinear(torch.randn(GEMM_N, N) / N**0.5, kind)  # its quantized weights

    def forward(self, x, r):
        a = self.reduce(x.unsqueeze(0) if self.batched else x)
        h = a + r if self.residual else a
        y = llama(h, self.weight)
        q, scale = self.quant(y.reshape(-1, N))
        w, w_scale = self.proj.weight, self.proj.weight_scale
        if self.kind == "mxfp4":
            out = fxfuse.ops.gemm_mxfp4(q, scale, w, w_scale)
        else:
            w_scale = w_scale.reshape(-1, 1) if self.kind == "fp8_rowwise" else w_scale
            out = fxfuse.ops.gemm_fp8(q, scale, w, w_scale)
        outs = (out, h) if self.residual else (out,)
        outs = (*outs, y * 2) if self.norm_out else outs  # y read elsewhere (an MoE router)
        return (*outs, q) if self.q_out else outs


def col_major_group_128(y):
    return torch.ops.fxfuse.quant_fp8(y, 128, torch.float8_e4m3fn, 1e-10, False, False, True)


def case_gemm_fp8_per_token_residual(rank, world):
    return _fuse_and_compare(
        lambda: ARChainGemm(functional, per_token_div, True), rank, run_ms=M_VALUES
    )


def case_gemm_fp8_group128_in_place(rank, world):
    # fxfuse.ops.quant_fp8: the torch spelling's canonical view bakes the capture's symbolic M
    # into the graph (patterns/quant.py), which a dynamic-M graph cannot run.
    return _fuse_and_compare(
        lambda: ARChainGemm(in_place, fxfuse_quant_group, True, "fp8_block"), rank,
        run_ms=(1, 32, 33, 200),
    )  # fmt: skip


def case_gemm_mxfp4_plain(rank, world):
    return _fuse_and_compare(
        lambda: ARChainGemm(functional, mxfp4("even"), False, "mxfp4", batched=True), rank,
        run_ms=(4, 32, 33),
    )  # fmt: skip


def case_gemm_q_used_elsewhere(rank, world):
    return _fuse_and_compare(lambda: ARChainGemm(functional, per_token_div, True, q_out=True), rank)


def case_gemm_norm_read_elsewhere(rank, world):
    return _fuse_and_compare(
        lambda: ARChainGemm(functional, per_token_div, True, norm_out=True), rank, run_ms=M_VALUES
    )


def case_gemm_norm_read_elsewhere_plain_mxfp4(rank, world):
    return _fuse_and_compare(
        lambda: ARChainGemm(functional, mxfp4("even"), False, "mxfp4", batched=True, norm_out=True),
        rank, run_ms=M_VALUES,
    )  # fmt: skip


def case_gemm_col_major_scales(rank, world):
    return _fuse_and_compare(
        lambda: ARChainGemm(functional, col_major_group_128, True, "fp8_block"), rank
    )


# One spawned session of 4 ranks: the world's cases, then a pair's (ranks 0 and 1) while ranks 2
# and 3 wait; one start-up instead of two keeps the file well under a minute on two cores.
SESSION = {
    4: ["functional_residual_fp8", "in_place_residual_group128", "functional_plain_mxfp4",
        "interpreted_kernels", "group_of_one", "gemm_fp8_per_token_residual"],
    2: ["functional_residual_fp8", "functional_plain_mxfp4", "in_place_residual_group128",
        "fxfuse_op_residual_first_norm_only", "functional_plain_norm_only", "interpreted_kernels",
        "reduced_used_elsewhere", "reduce_max", "in_place_on_graph_input",
        "in_place_buffer_aliased", "in_place_slice", "torch_compile", "opcheck",
        "gemm_fp8_per_token_residual",
        "gemm_fp8_group128_in_place", "gemm_mxfp4_plain", "gemm_q_used_elsewhere",
        "gemm_norm_read_elsewhere", "gemm_norm_read_elsewhere_plain_mxfp4",
        "norm_read_elsewhere_residual_fp8", "norm_read_elsewhere_plain_mxfp4",
        "gemm_col_major_scales"],
}  # fmt: skip
WORLD = max(SESSION)


# --- spawning -----------------------------------------------------------------------------------


def _run_cases(world, rank, out):
    for name in SESSION[world]:
        try:
            out[f"{world}:{name}"] = globals()[f"case_{name}"](rank, world)
        except Exception:  # noqa: BLE001 - reported to the parent, which fails that case
            out[f"{world}:{name}"] = {"error": traceback.format_exc()}


def _rank_main(rank, port, results):
    global GROUP
    out = {}
    try:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
            timeout=datetime.timedelta(seconds=SESSION_TIMEOUT_S),
        )  # fmt: skip
        _run_cases(WORLD, rank, out)
        pair = dist.new_group([0, 1])  # collective: every rank creates it
        if rank < 2:
            GROUP = pair
            _run_cases(2, rank, out)
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        out["session"] = {"error": traceback.format_exc()}
    results.put((rank, out))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    """Every rank's results, {"<world>:<case>": {...}}, in rank order."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, results)) for r in range(WORLD)]
    for proc in procs:
        proc.start()
    collected, deadline = {}, time.monotonic() + SESSION_TIMEOUT_S
    try:
        while len(collected) < WORLD:
            rank, out = results.get(timeout=max(1.0, deadline - time.monotonic()))
            collected[rank] = out
    except queue.Empty:
        pytest.fail(f"the {WORLD}-rank session timed out after {SESSION_TIMEOUT_S} s")
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
    for rank in range(WORLD):
        if "session" in collected[rank]:
            pytest.fail(f"rank {rank}: {collected[rank]['session']['error']}")
    return [collected[r] for r in range(WORLD)]


def _case(ranks, world, name) -> list[dict]:
    per_rank = [out[f"{world}:{name}"] for out in ranks[:world]]
    for rank, out in enumerate(per_rank):
        assert "error" not in out, f"rank {rank}:\n{out.get('error')}"
    return per_rank


def _assert_fired(per_rank, op=FUSED_QUANT):
    for rank, out in enumerate(per_rank):
        assert out["count"] == 1, f"rank {rank}: {out}"
        assert op in out["targets"], f"rank {rank}: {out['targets']}"
        assert out.get("collectives_left", 0) == 0, f"rank {rank}: the all-reduce is still there"
        assert out["equal"], f"rank {rank}: fused bytes differ from the unfused model"
    assert len({out["digest"] for out in per_rank}) == 1, "ranks got different bytes"


def _assert_not_fired(per_rank, reason):
    for rank, out in enumerate(per_rank):
        assert out["count"] == 0, f"rank {rank}: {out}"
        assert not any("allreduce" in t for t in out["targets"]), out["targets"]
        assert reason in out["reasons"], out["reasons"]
        assert out["equal"], f"rank {rank}: bytes differ from the unfused model"


# --- 2 ranks ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, op",
    [
        ("functional_residual_fp8", FUSED_QUANT),
        ("functional_plain_mxfp4", FUSED_QUANT),
        ("in_place_residual_group128", FUSED_QUANT),
        ("fxfuse_op_residual_first_norm_only", FUSED_NORM),
        ("functional_plain_norm_only", FUSED_NORM),
        ("interpreted_kernels", FUSED_QUANT),
    ],
)
def test_two_ranks_spelling_fires_and_matches_bytes(ranks, name, op):
    _assert_fired(_case(ranks, 2, name), op)


def test_two_ranks_torch_compile_fires_and_matches_bytes(ranks):
    _assert_fired(_case(ranks, 2, "torch_compile"))


def test_reduced_value_used_elsewhere_does_not_fire(ranks):
    per_rank = _case(ranks, 2, "reduced_used_elsewhere")
    _assert_not_fired(per_rank, "has other users")
    assert all(out["rmsnorm_quant"] == 1 for out in per_rank)  # the norm-quant still fuses


@pytest.mark.parametrize(
    "name", ["norm_read_elsewhere_residual_fp8", "norm_read_elsewhere_plain_mxfp4"]
)
def test_two_ranks_norm_read_elsewhere_fuses_with_the_norm_kept(ranks, name):
    """y is also read outside the chain (an MoE router beside the quantized experts): the whole
    chain fuses, the op keeping y for that reader, and every rank gives the unfused bytes."""
    _assert_fired(_case(ranks, 2, name), FUSED_QUANT_WITH_NORM)


def test_reduce_op_other_than_sum_does_not_fire(ranks):
    _assert_not_fired(_case(ranks, 2, "reduce_max"), "all-reduce op 'max', not sum")


def test_in_place_all_reduce_of_a_graph_input_does_not_fire(ranks):
    _assert_not_fired(_case(ranks, 2, "in_place_on_graph_input"), "writes graph input")


def test_in_place_all_reduce_of_an_aliased_buffer_does_not_fire(ranks):
    _assert_not_fired(_case(ranks, 2, "in_place_buffer_aliased"), "has other users (select")


def test_in_place_all_reduce_of_a_slice_does_not_fire(ranks):
    _assert_not_fired(_case(ranks, 2, "in_place_slice"), "a view of")


def test_fused_ops_pass_opcheck_with_a_group(ranks):
    hs = [out["h"] for out in _case(ranks, 2, "opcheck")]
    want = (_inputs(0, 4)[0].float() + _inputs(1, 4)[0].float()).to(torch.bfloat16)
    assert all(h == want.view(torch.uint8).numpy().tobytes() for h in hs)


# --- 4 ranks ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in SESSION[4] if n != "group_of_one" and "gemm" not in n])
def test_four_ranks_spelling_fires_and_matches_bytes(ranks, name):
    _assert_fired(_case(ranks, 4, name))


def test_group_of_one_rank_fires_and_runs_locally(ranks):
    per_rank = _case(ranks, 4, "group_of_one")
    for out in per_rank:
        assert out["count"] == 1 and FUSED_QUANT in out["targets"] and out["equal"], out
    assert len({out["digest"] for out in per_rank}) == 4  # nothing was summed across ranks


# --- 2 and 4 ranks: the chain into a GEMM -------------------------------------------------------


GEMM_CHAIN_CASES = [
    (2, "gemm_fp8_per_token_residual"),
    (2, "gemm_fp8_group128_in_place"),
    (2, "gemm_mxfp4_plain"),
    (4, "gemm_fp8_per_token_residual"),
]


@pytest.mark.parametrize("world, name", GEMM_CHAIN_CASES)
def test_chain_into_the_gemm_fires_and_matches_bytes_at_every_m(ranks, world, name):
    per_rank = _case(ranks, world, name)
    for rank, out in enumerate(per_rank):
        assert not any(t in GEMMS for t in out["targets"]), f"rank {rank}: {out['targets']}"
        assert out["unequal_rows"] == [], f"rank {rank}: bytes differ at these M"
    _assert_fired(per_rank, FUSED_GEMM)


@pytest.mark.parametrize(
    "name, reason",
    [
        ("gemm_q_used_elsewhere", "has other users"),
        ("gemm_col_major_scales", "column-major activation scales"),
    ],
)
def test_chain_into_the_gemm_near_miss_ends_at_the_quant(ranks, name, reason):
    """The GEMM stays its own node; the all-reduce → norm → quant still fuses."""
    per_rank = _case(ranks, 2, name)
    for rank, out in enumerate(per_rank):
        assert FUSED_GEMM not in out["targets"], f"rank {rank}: {out['targets']}"
        assert "fxfuse.gemm_fp8.default" in out["targets"], f"rank {rank}: {out['targets']}"
        assert reason in out["reasons"], out["reasons"]
    _assert_fired(per_rank, FUSED_QUANT)


@pytest.mark.parametrize(
    "name", ["gemm_norm_read_elsewhere", "gemm_norm_read_elsewhere_plain_mxfp4"]
)
def test_chain_into_one_gemm_with_the_norm_read_elsewhere(ranks, name):
    """y also read elsewhere and the quant's only reader one GEMM: the whole chain becomes
    `allreduce_rms_norm_quant_gemm_with_norm` (its M dispatch; y from whichever kernel runs), and
    the bytes, y's included, are the unfused model's at every M."""
    per_rank = _case(ranks, 2, name)
    for rank, out in enumerate(per_rank):
        assert "fxfuse.quant_gemm.default" not in out["targets"], f"rank {rank}: {out['targets']}"
        assert not any(t in GEMMS for t in out["targets"]), f"rank {rank}: {out['targets']}"
        assert out["unequal_rows"] == [], f"rank {rank}: bytes differ at these M"
    _assert_fired(per_rank, FUSED_GEMM_WITH_NORM)


# --- in process: no group -----------------------------------------------------------------------


def _norm_quant_args(quant="fp8"):
    norm = (0.0, True, None, False)
    if quant == "fp8":
        return norm, ("fp8", 0, torch.float8_e4m3fn, 1e-10, False, False, False, "even")
    return norm, ("mxfp4", 0, torch.float8_e4m3fn, 0.0, False, False, False, "floor")


@pytest.mark.parametrize("quant", ["fp8", "mxfp4"])
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_without_a_group_the_ops_are_the_local_fused_norm(quant, with_residual, reference_path):
    x, r = _inputs(0, 4)
    r = r if with_residual else None
    w = torch.randn(N, dtype=torch.bfloat16)
    norm, quant_args = _norm_quant_args(quant)
    q, scale, h = torch.ops.fxfuse.allreduce_rms_norm_quant(x, r, w, None, 1e-6, *norm, *quant_args)
    if r is None:
        want = (*torch.ops.fxfuse.rms_norm_quant(x, w, 1e-6, *norm, *quant_args), x)
    else:
        want = torch.ops.fxfuse.add_rms_norm_quant(x, r, w, 1e-6, *norm, *quant_args)
    assert outputs_bytes_equal((q, scale, h), want)
    assert h.data_ptr() != x.data_ptr()
    # A group name with no torch.distributed behind it: the same local path.
    again = torch.ops.fxfuse.allreduce_rms_norm_quant(x, r, w, "0", 1e-6, *norm, *quant_args)
    assert outputs_bytes_equal(again, (q, scale, h))
    y, h = torch.ops.fxfuse.allreduce_rms_norm(x, r, w, None, 1e-6, *norm)
    want = fxfuse.ops.rms_norm(x, w, 1e-6, residual=r)
    assert outputs_bytes_equal((y, h), want if r is not None else (want, x))


@pytest.mark.parametrize("quant", ["fp8", "mxfp4"])
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_without_a_group_the_gemm_op_is_the_norm_quant_gemm(quant, with_residual, reference_path):
    kind = "mxfp4" if quant == "mxfp4" else "fp8_rowwise"
    proj = QuantLinear(torch.randn(GEMM_N, N) / N**0.5, kind)
    w_scale = proj.weight_scale if kind == "mxfp4" else proj.weight_scale.reshape(-1, 1)
    gemm = (proj.weight, w_scale, torch.bfloat16, 32)
    w = torch.randn(N, dtype=torch.bfloat16)
    norm, quant_args = _norm_quant_args(quant)
    ops = torch.ops.fxfuse
    for m in (4, 33):  # both sides of prologue_quant_max_m
        x, r = _inputs(0, m)
        r = r if with_residual else None
        got = ops.allreduce_rms_norm_quant_gemm(x, r, w, None, 1e-6, *norm, *quant_args, *gemm)
        if r is None:
            want = (ops.rms_norm_quant_gemm(x, w, 1e-6, *norm, *quant_args, *gemm), x)
        else:
            want = ops.add_rms_norm_quant_gemm(x, r, w, 1e-6, *norm, *quant_args, *gemm)
        assert outputs_bytes_equal(got, want), m
        # The with-norm op: the same (out, h) and y, the local norm's.
        args = (x, r, w, None, 1e-6, *norm, *quant_args, *gemm)
        kept = ops.allreduce_rms_norm_quant_gemm_with_norm(*args)
        y = fxfuse.ops.rms_norm(x, w, 1e-6, residual=r)
        assert outputs_bytes_equal(kept, (*want, y[0] if r is not None else y)), m
        utils = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
        torch.library.opcheck(
            ops.allreduce_rms_norm_quant_gemm_with_norm.default, args, test_utils=utils
        )


def test_ops_pass_opcheck_without_a_group(reference_path):
    x, r = _inputs(0, 4)
    w = torch.randn(N, dtype=torch.bfloat16)
    norm, quant_args = _norm_quant_args("mxfp4")
    ops = torch.ops.fxfuse
    torch.library.opcheck(ops.allreduce_rms_norm.default, (x, None, w, None, 1e-6))
    torch.library.opcheck(
        ops.allreduce_rms_norm_quant.default, (x, r, w, None, 1e-6, *norm, *quant_args)
    )


@pytest.mark.parametrize("residual", [True, False], ids=["residual", "plain"])
def test_with_norm_op_without_a_group_is_the_local_chain(residual, reference_path):
    """allreduce_rms_norm_quant_with_norm without a group: (q, scale, h, y) of the local
    norm-quant with y kept; it passes opcheck."""
    x, r = _inputs(0, 4)
    r = r if residual else None
    w = torch.randn(N, dtype=torch.bfloat16)
    norm, quant_args = _norm_quant_args("fp8")
    ops = torch.ops.fxfuse
    args = (x, r, w, None, 1e-6, *norm, *quant_args)
    # test_schema compares FP8 outputs with a multiply torch's CPU backend lacks for float8.
    utils = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic")
    torch.library.opcheck(ops.allreduce_rms_norm_quant_with_norm.default, args, test_utils=utils)
    got = ops.allreduce_rms_norm_quant_with_norm(*args)
    if residual:
        want = ops.add_rms_norm_quant_with_norm(x, r, w, 1e-6, *norm, *quant_args)
    else:
        q, scale, y = ops.rms_norm_quant_with_norm(x, w, 1e-6, *norm, *quant_args)
        want = (q, scale, x, y)
    assert outputs_bytes_equal(got, want)


def test_all_reduce_without_a_group_leaves_a_plain_norm_quant(reference_path):
    """fxfuse.ops.all_reduce without torch.distributed is a copy: nothing to fuse it with."""
    model = ARChain(fxfuse_op, llama, per_token_div, True)
    x, r = _inputs(0)
    with torch.no_grad():
        fused = fxfuse.apply_fusions(model, (x, r))
    assert fused.fxfuse_report.counts[NAME] == 0
    assert fused.fxfuse_report.counts["rmsnorm_quant"] == 1
    assert outputs_bytes_equal(fused(x, r), model(x, r))


def test_path_choice():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert allreduce_ops.choose_path(1, cuda, 1024, 1 << 20, True) == "local"
    assert allreduce_ops.choose_path(8, cuda, 1 << 20, 1 << 20, True) == "one_shot"
    assert allreduce_ops.choose_path(8, cuda, (1 << 20) + 2, 1 << 20, True) == "collective"
    assert allreduce_ops.choose_path(8, cuda, 1024, 1 << 20, False) == "collective"
    assert allreduce_ops.choose_path(2, cpu, 1024, 1 << 20, True) == "collective"
    assert allreduce_ops.choose_path(2, cuda, 0, 0, True) == "collective"  # 0: one-shot off


def test_one_shot_threshold_from_the_table_and_env(monkeypatch):
    monkeypatch.delenv(allreduce_ops.ONE_SHOT_MAX_BYTES_ENV, raising=False)
    from fxfuse.kernels import allreduce_oneshot
    from fxfuse.runtime import launch_tables

    table = launch_tables.load_table("allreduce_oneshot")
    for target in ("sm90", "gfx950", "gfx942"):
        assert table["targets"][target]["timed"] is False  # untimed until a device sweep
        want = launch_tables.lookup("allreduce_oneshot", target, m=64, n=7168)["MAX_BYTES"]
        # Off by default until verified on GPUs; the table's cap applies once it is.
        expected = want if allreduce_ops.ONE_SHOT_VERIFIED else 0
        assert allreduce_ops.one_shot_max_bytes(target, 64, 7168) == expected
        assert allreduce_oneshot.buffer_bytes_for(target) >= want
    monkeypatch.setenv(allreduce_ops.ONE_SHOT_MAX_BYTES_ENV, "1048576")
    assert allreduce_ops.one_shot_max_bytes("sm90", 1, 7168) == 1048576
    monkeypatch.setenv(allreduce_ops.ONE_SHOT_MAX_BYTES_ENV, "0")
    assert allreduce_ops.one_shot_max_bytes("sm90", 1, 7168) == 0
    monkeypatch.setenv(allreduce_ops.ONE_SHOT_MAX_BYTES_ENV, "lots")
    with pytest.raises(ValueError, match=allreduce_ops.ONE_SHOT_MAX_BYTES_ENV):
        allreduce_ops.one_shot_max_bytes("sm90", 1, 7168)


# --- in process: the one-shot kernel, simulated -------------------------------------------------


@pytest.fixture
def hang_guard():
    """A barrier bug would spin forever; the interpreter spins in Python, so an alarm can stop it
    with a test failure."""

    def spun_too_long(signum, frame):
        raise TimeoutError("the one-shot kernel's barrier spun for 60 s")

    previous = signal.signal(signal.SIGALRM, spun_too_long)
    signal.setitimer(signal.ITIMER_REAL, 60)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def _simulate(world, m, quant, residual=True, config=None, write_norm=False, **quant_args):
    """Runs the one-shot kernel for every rank in turn over CPU-tensor 'symmetric' buffers and
    signal pads. Before rank r runs, the flags its later peers would have raised are raised (and
    rank r's buffer is poisoned, so only its own publish phase can fill it). Returns each rank's
    outputs, the reference, and the buffers and pads afterwards with what they should hold."""
    from fxfuse.kernels import allreduce_oneshot as oneshot

    torch.manual_seed(world * 100 + m)
    xs = [torch.randn(m, N).mul(2).to(torch.bfloat16) for _ in range(world)]
    res = torch.randn(m, N).to(torch.bfloat16) if residual else None
    w = (1 + 0.1 * torch.randn(N)).to(torch.bfloat16)
    pad_bytes, buffer_bytes = 2048, m * N * 2 + 256
    buffers = [torch.full((buffer_bytes // 2,), float("nan"), dtype=torch.bfloat16) for _ in xs]
    for buffer, x in zip(buffers, xs):
        buffer[: m * N] = x.reshape(-1)  # as published by ranks that have not run yet
    pads = [torch.zeros(pad_bytes // 4, dtype=torch.int32) for _ in xs]
    buffer_ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64)
    pad_ptrs = torch.tensor([p.data_ptr() for p in pads], dtype=torch.int64)
    cfg = oneshot._launch_config("cpu", torch.device("cpu"), m, N, world, pad_bytes, config)
    programs = -(-m // cfg["ROWS_PER_PROGRAM"])

    def flags_from_later_peers(rank):
        flags = torch.zeros_like(pads[rank])
        for program in range(programs):
            for channel in range(oneshot.CHANNELS):
                base = (program * oneshot.CHANNELS + channel) * world
                flags[base + rank + 1 : base + world] = 1
        return flags

    outs = []
    for rank in range(world):
        pads[rank] += flags_from_later_peers(rank)
        buffers[rank][: m * N] = float("nan")
        peers = oneshot.Peers(buffer_ptrs, pad_ptrs, rank, buffer_bytes, pad_bytes)
        outs.append(
            oneshot.allreduce_rms_norm_quant(
                xs[rank], w, 1e-6, res, peers=peers, quant=quant, config=config,
                write_norm=write_norm, **quant_args,
            )
        )
    want = oneshot.allreduce_rms_norm_quant_ref(
        xs, w, 1e-6, res, quant=quant, reciprocal_sqrt=True, **quant_args
    )
    return outs, want, xs, buffers, pads, [flags_from_later_peers(r) for r in range(world)]


@pytest.mark.parametrize(
    "world, m, quant, quant_args, config",
    [
        (2, 5, "fp8", {}, None),
        (3, 5, "mxfp4", {"rounding": "even"}, {"MAX_PROGRAMS": 2}),  # W not a power of 2; 4 rows
        (2, 3, "fp8", {"group_size": 128}, {"BLOCK_N_MAX": 128, "BLOCK_N": 64}),  # tiled rows
        (4, 2, None, {}, None),  # norm only
    ],
    ids=["fp8_w2", "mxfp4_w3_rows", "fp8_group_w2_tiles", "norm_w4"],
)
def test_one_shot_kernel_simulated(world, m, quant, quant_args, config, hang_guard):
    outs, want, xs, buffers, pads, final_flags = _simulate(
        world, m, quant, True, config, **quant_args
    )
    for rank, out in enumerate(outs):
        for got, ref, what in zip(out, want, ("q", "scale", "h", "y")):
            assert (got is None) == (ref is None), what
            assert got is None or bytes_equal(got, ref), f"rank {rank}: {what} differs"
    for rank, (buffer, x) in enumerate(zip(buffers, xs)):
        assert bytes_equal(buffer[: x.numel()], x.reshape(-1)), f"rank {rank}: publish"
        assert torch.isnan(buffer[x.numel() :].float()).all(), f"rank {rank}: stray write"
        # Every flag raised was consumed, except those sent to ranks that had already run.
        assert torch.equal(pads[rank], final_flags[rank]), f"rank {rank}: signal pad"


def test_one_shot_kernel_without_residual_simulated(hang_guard):
    outs, want, *_ = _simulate(2, 2, "fp8", residual=False)
    for out in outs:
        assert out[3] is None and want[3] is None
        assert outputs_bytes_equal(out[:3], want[:3])


@pytest.mark.parametrize("quant, quant_args", [("fp8", {}), ("mxfp4", {"rounding": "even"})])
def test_one_shot_kernel_writes_the_norm_with_the_quant_simulated(quant, quant_args, hang_guard):
    """write_norm: the one launch also stores y (for the norm's other readers), the norm-only
    reference's bytes; q, scale and h are as without it."""
    outs, want, *_ = _simulate(2, 5, quant, write_norm=True, **quant_args)
    y_want = _simulate(2, 5, None)[1][3]  # the same inputs (seeded by world and m), norm only
    for out in outs:
        assert outputs_bytes_equal(out[:3], want[:3])
        assert bytes_equal(out[3], y_want)


def test_one_shot_launcher_rejects_bad_peers():
    from fxfuse.kernels import allreduce_oneshot as oneshot

    x, w = torch.randn(4, N, dtype=torch.bfloat16), torch.ones(N, dtype=torch.bfloat16)
    ptrs = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="peers"):
        oneshot.allreduce_rms_norm_quant(x, w, 1e-6, peers=None)
    with pytest.raises(ValueError, match="peers"):
        oneshot.allreduce_rms_norm_quant(
            x, w, 1e-6, peers=oneshot.Peers(ptrs, ptrs, 2, 1 << 20, 2048)
        )
    with pytest.raises(ValueError, match="x"):
        oneshot.allreduce_rms_norm_quant(x, w, 1e-6, peers=oneshot.Peers(ptrs, ptrs, 0, 1024, 2048))
    with pytest.raises(ValueError, match="config"):
        oneshot.allreduce_rms_norm_quant(
            x, w, 1e-6, peers=oneshot.Peers(ptrs, ptrs, 0, 1 << 20, 8), config=None
        )


_COMPILE_CHECK = textwrap.dedent(
    """
    import json
    import triton, triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from fxfuse.kernels import allreduce_oneshot as oneshot

    kernel = oneshot._allreduce_rms_norm_quant_kernel
    pointers = {"x_ptr": "*bf16", "residual_ptr": "*bf16", "weight_ptr": "*bf16", "h_ptr": "*bf16",
                "y_ptr": "*bf16", "q_ptr": "*u8", "scale_ptr": "*fp32", "buffer_ptrs": "*i64",
                "signal_pad_ptrs": "*i64"}
    floats = ("eps", "weight_offset", "quant_eps")
    # W = 6 (not a power of 2), FP8 per token, N = 1024, two rows per program.
    consts = dict(RANK=1, WORLD_SIZE=6, PEERS_POW2=8, X_DTYPE=tl.bfloat16, NORM_DTYPE=tl.bfloat16,
                  HAS_RESIDUAL=True, HAS_WEIGHT_OFFSET=False, ROUND_BEFORE_WEIGHT=True,
                  WRITE_NORM=False, QUANT=1, FP8_MAX=448.0, FP8_FNUZ=False, FP8_NATIVE=False,
                  EPS_ON_SCALE=False, APPLY_RECIPROCAL=False, MX_ROUNDING=1, EXACT_CASTS=False,
                  CONST_DIV_AS_MUL=True, BLOCK_N=512, COL_TILES=2, ROWS_PER_PROGRAM=2,
                  NG=1, G=1024, GROUP=128, CHUNK=128, VEC=8, TILE_CHUNKS=4, NUM_TILES=2,
                  stride_xn=1, stride_rn=1)
    signature = {a: pointers.get(a, "fp32" if a in floats else "i32") for a in kernel.arg_names}
    signature.update({a: "constexpr" for a in consts})
    signature["ROW_TILE"] = "constexpr"
    found = {}
    for target, row_tile in ((GPUTarget("cuda", 90, 32), True), (GPUTarget("cuda", 90, 32), False),
                             (GPUTarget("hip", "gfx942", 64), False),
                             (GPUTarget("hip", "gfx950", 64), True)):
        source = ASTSource(kernel, signature, constexprs=dict(consts, ROW_TILE=row_tile))
        asm = triton.compile(source, target=target).asm
        asm = asm.get("ptx") or asm["amdgcn"]
        found[f"{target.arch}:{row_tile}"] = [
            l.strip() for l in asm.splitlines() if ("atom" in l and "cas" in l) or "cmpswap" in l
        ]
    print(json.dumps(found))
    """
)


def test_one_shot_kernel_compiles_for_gpu_targets():
    """The compiled path cannot run here: compile it for sm90, gfx942 and gfx950 (no device
    needed) and check the barrier's atomics are system-scope release / acquire CAS."""
    found = compile_in_subprocess(_COMPILE_CHECK)
    assert len(found) == 4, found
    for key, atomics in found.items():
        assert len(atomics) == 4, (key, atomics)  # two barriers, each a send and a receive loop
        if key.startswith("90:"):
            assert sum("release.sys" in a for a in atomics) == 2, atomics
            assert sum("acquire.sys" in a for a in atomics) == 2, atomics
