"""The one-shot all-reduce kernel on a real GPU (skipped without one or under the interpreter)."""

from __future__ import annotations

import os
import time

import pytest
import torch

from tests.helpers import bytes_equal

# --- GPU: two ranks on one device ---------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
    reason="needs a GPU and compiled kernels running concurrently (TRITON_INTERPRET=0)",
)
@pytest.mark.parametrize("quant", ["fp8", "mxfp4"])
def test_gpu_one_shot_two_ranks_on_one_device(quant):
    """Two ranks on one GPU, one stream each, no host sync between calls: the compiled barriers
    meet for real and back-to-back calls reuse the buffers. h equals the fp32 rank-order sum; q
    and scale equal the standalone rms_norm_quant kernel run on that h."""
    from fxfuse.kernels import allreduce_oneshot as oneshot
    from fxfuse.kernels import rms_norm_quant as norm_quant

    world, m, n, calls, pad_bytes = 2, 16, 7168, 4, 2048
    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(7)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).mul(2).to(torch.bfloat16).to(device)

    xs = [[rand(m, n) for _ in range(world)] for _ in range(calls)]
    res, w = rand(m, n), (1 + 0.05 * rand(n).float()).to(torch.bfloat16)
    buffers = [torch.empty(m * n * 2, dtype=torch.uint8, device=device) for _ in range(world)]
    pads = [torch.zeros(pad_bytes // 4, dtype=torch.int32, device=device) for _ in range(world)]
    buffer_ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64, device=device)
    pad_ptrs = torch.tensor([p.data_ptr() for p in pads], dtype=torch.int64, device=device)
    streams = [torch.cuda.Stream() for _ in range(world)]
    torch.cuda.synchronize()
    outs, done = [], []
    for call in range(calls):
        outs.append([])
        for rank, stream in enumerate(streams):
            peers = oneshot.Peers(buffer_ptrs, pad_ptrs, rank, m * n * 2, pad_bytes)
            with torch.cuda.stream(stream):
                outs[-1].append(
                    oneshot.allreduce_rms_norm_quant(
                        xs[call][rank], w, 1e-6, res, peers=peers, quant=quant
                    )
                )
    for stream in streams:
        done.append(torch.cuda.Event())
        done[-1].record(stream)
    deadline = time.monotonic() + 60
    while not all(event.query() for event in done):
        if time.monotonic() > deadline:
            pytest.fail("the ranks' barriers never met (are both grids co-resident?)")
        time.sleep(0.01)
    for call in range(calls):
        _, _, want_h, _ = oneshot.allreduce_rms_norm_quant_ref(
            [x.cpu() for x in xs[call]], w.cpu(), 1e-6, res.cpu(), quant=None
        )
        for rank in range(world):
            q, scale, h, _ = outs[call][rank]
            assert bytes_equal(h.cpu(), want_h), f"call {call}, rank {rank}: h"
            own_q, own_scale, _, _ = norm_quant.rms_norm_quant(h, w, 1e-6, quant=quant)
            assert bytes_equal(q, own_q) and bytes_equal(scale, own_scale), (call, rank)
    assert all(int(pad.count_nonzero()) == 0 for pad in pads)  # every flag consumed
