"""The one-shot all-reduce kernel on a real GPU (skipped without one or under the interpreter).

- World size 1 through the production path: an NCCL group of one rank, its symmetric-memory
  workspace from `collective_ops.symmetric_peers`, the kernel's barriers meeting themselves; run
  back to back and replayed in a CUDA graph (the flags must be consumed every time).
- Two ranks emulated on one GPU, one stream each: the barriers of two concurrently running grids
  meet for real. Each rank's kernel is first run alone with its peer's flags pre-raised (as the
  CPU simulation does), so that no module is loaded while the other grid spins: CUDA's lazy
  loading can block a launch until the device is idle, which a spinning grid never lets happen.

Both run in a subprocess with a deadline, so a barrier that never meets fails the test instead of
hanging the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

DEADLINE_S = 240

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
        reason="needs a GPU and compiled kernels running concurrently (TRITON_INTERPRET=0)",
    ),
]

_COMMON = """
import torch
from fxfuse.kernels import allreduce_oneshot as oneshot
from fxfuse.kernels import rms_norm_quant as norm_quant

def bytes_equal(a, b):
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))

gen = torch.Generator().manual_seed(7)
device = torch.device("cuda", 0)

def rand(*shape):
    return torch.randn(*shape, generator=gen).mul(2).to(torch.bfloat16).to(device)

def check_against_norm_kernel(out, want_h, w, quant, group_size, what):
    q, scale, h, y = out
    assert bytes_equal(h, want_h), f"{what}: h"
    if quant is None:
        own_y, _ = norm_quant.rms_norm(want_h, w, 1e-6)
        assert bytes_equal(y, own_y), f"{what}: y"
    else:
        own_q, own_scale, _, _ = norm_quant.rms_norm_quant(
            want_h, w, 1e-6, quant=quant, group_size=group_size)
        assert bytes_equal(q, own_q) and bytes_equal(scale, own_scale), f"{what}: q / scale"
"""

_WORLD_ONE = _COMMON + """
import os, tempfile
import torch.distributed as dist
from fxfuse.runtime import collective_ops

store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
torch.cuda.set_device(0)
dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=device)
name = collective_ops.group_name_of()
m, n = 64, 7168
peers = collective_ops.symmetric_peers(name, device, m * n * 2)
assert peers.world_size == 1 and peers.rank == 0
res, w = rand(m, n), (1 + 0.05 * rand(n).float()).to(torch.bfloat16)
for quant, group_size in ((None, 0), ("fp8", 0), ("fp8", 128), ("mxfp4", 0)):
    for rows in (1, 5, 64):
        for call in range(3):  # back to back: the pads are zero again after every call
            x = rand(rows, n)
            out = oneshot.allreduce_rms_norm_quant(
                x, w, 1e-6, res[:rows], peers=peers, quant=quant, group_size=group_size)
            want_h = (x.float() + res[:rows].float()).to(torch.bfloat16)  # round(round(x) + r)
            check_against_norm_kernel(out, want_h, w, quant, group_size,
                                      f"{quant}/{group_size} rows {rows} call {call}")
# CUDA graph: capture once, replay with new inputs; every replay must pass both barriers.
x_static = rand(16, n)
oneshot.allreduce_rms_norm_quant(x_static, w, 1e-6, res[:16], peers=peers, quant="fp8")
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    captured = oneshot.allreduce_rms_norm_quant(x_static, w, 1e-6, res[:16], peers=peers,
                                                quant="fp8")
for replay in range(5):
    x_static.copy_(rand(16, n))
    graph.replay()
    torch.cuda.synchronize()
    want_h = (x_static.float() + res[:16].float()).to(torch.bfloat16)
    check_against_norm_kernel(captured, want_h, w, "fp8", 0, f"graph replay {replay}")
dist.destroy_process_group()
print("OK world-one")
"""

_TWO_RANKS = _COMMON + """
import time
world, m, n, calls, pad_bytes = 2, 16, 7168, 4, 2048
pad_ints = pad_bytes // 4
for quant in ("fp8", "mxfp4"):
    xs = [[rand(m, n) for _ in range(world)] for _ in range(calls)]
    res, w = rand(m, n), (1 + 0.05 * rand(n).float()).to(torch.bfloat16)
    buffers = [torch.empty(m * n * 2, dtype=torch.uint8, device=device) for _ in range(world)]
    pads = [torch.zeros(pad_ints, dtype=torch.int32, device=device) for _ in range(world)]
    buffer_ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64, device=device)
    pad_ptrs = torch.tensor([p.data_ptr() for p in pads], dtype=torch.int64, device=device)
    streams = [torch.cuda.Stream() for _ in range(world)]

    def call(rank, x):
        peers = oneshot.Peers(buffer_ptrs, pad_ptrs, rank, m * n * 2, pad_bytes)
        return oneshot.allreduce_rms_norm_quant(x, w, 1e-6, res, peers=peers, quant=quant)

    # Warm-up: each rank alone, its peers' flags pre-raised (flag index (p*2 + c)*W + sender).
    for rank, stream in enumerate(streams):
        for p in pads:
            p.zero_()
        idx = torch.arange(pad_ints, device=device)
        pads[rank].copy_(((idx % world) != rank).to(torch.int32))
        with torch.cuda.stream(stream):
            call(rank, xs[0][rank])
        stream.synchronize()
    for p in pads:
        p.zero_()
    torch.cuda.synchronize()
    # Concurrent: no host sync between calls.
    outs = [[] for _ in range(calls)]
    for c in range(calls):
        for rank, stream in enumerate(streams):
            with torch.cuda.stream(stream):
                outs[c].append(call(rank, xs[c][rank]))
    done = []
    for stream in streams:
        done.append(torch.cuda.Event())
        done[-1].record(stream)
    deadline = time.monotonic() + 60
    while not all(e.query() for e in done):
        assert time.monotonic() < deadline, "the ranks' barriers never met"
        time.sleep(0.01)
    for c in range(calls):
        total = xs[c][0].float() + xs[c][1].float()  # the fp32 rank-order sum
        want_h = (total.to(torch.bfloat16).float() + res.float()).to(torch.bfloat16)
        for rank in range(world):
            check_against_norm_kernel(outs[c][rank], want_h, w, quant, 0,
                                      f"{quant} call {c} rank {rank}")
    assert all(int(p.count_nonzero()) == 0 for p in pads), "a flag was left raised"
print("OK two-ranks")
"""


def _run(script: str, marker: str):
    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=path)
    try:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(script)],
            check=False, capture_output=True, text=True, timeout=DEADLINE_S, env=env,
        )  # fmt: skip
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"did not finish in {DEADLINE_S} s (a barrier that never met?): {err.stdout}")
    assert done.returncode == 0 and marker in done.stdout, done.stdout + done.stderr[-4000:]


def test_gpu_one_shot_world_of_one_through_symmetric_memory():
    """h = round(x + residual); q / scale / y are the norm kernel's on that h, for every quant
    kind and row count, back to back and replayed in a CUDA graph."""
    _run(_WORLD_ONE, "OK world-one")


def test_gpu_one_shot_two_ranks_on_one_device():
    """Two concurrently running grids (one per emulated rank) meet at their barriers; back-to-back
    calls reuse the buffers; h is the fp32 rank-order sum and every flag ends consumed."""
    _run(_TWO_RANKS, "OK two-ranks")
