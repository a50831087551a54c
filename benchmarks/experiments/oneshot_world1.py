"""What the one-shot all-reduce kernel costs on one GPU (world size 1, through an NCCL group of one
rank and its symmetric-memory workspace): the kernel against the residual RMSNorm → quant kernel
it inlines, in CUDA graphs, N = 7168. The gap is its publish copy, reduce read and two barriers
(system-scope atomics meeting themselves); it says nothing about a multi-GPU all-reduce.

    PYTHONPATH=. python benchmarks/experiments/oneshot_world1.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import torch
import torch.distributed as dist
import triton.testing

from fxfuse.kernels import allreduce_oneshot as oneshot
from fxfuse.kernels import rms_norm_quant as norm_quant
from fxfuse.runtime import collective_ops

N = 7168
ROWS = (1, 16, 64, 256)
QUANTS = ((None, 0), ("fp8", 0), ("fp8", 128), ("mxfp4", 0))


def _graph_us(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT"))
    args = parser.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=device)
    peers = collective_ops.symmetric_peers(collective_ops.group_name_of(), device, max(ROWS) * N * 2)
    w = torch.rand(N, device=device).add(0.5).to(torch.bfloat16)
    rows_out = []
    print(f"{'quant':>10} {'M':>5} {'one-shot us':>12} {'norm-quant us':>14} {'extra us':>9}")
    for quant, group in QUANTS:
        for m in ROWS:
            x = torch.randn(m, N, device=device, dtype=torch.bfloat16)
            r = torch.randn(m, N, device=device, dtype=torch.bfloat16)
            kw = {"quant": quant, "group_size": group}

            def one_shot(x=x, r=r, kw=kw):
                return oneshot.allreduce_rms_norm_quant(x, w, 1e-6, r, peers=peers, **kw)

            def two_step(x=x, r=r, quant=quant, group=group):
                if quant is None:
                    return norm_quant.rms_norm(x, w, 1e-6, r)
                return norm_quant.rms_norm_quant(x, w, 1e-6, r, quant=quant, group_size=group)

            a, b = _graph_us(one_shot), _graph_us(two_step)
            label = f"{quant or 'none'}{'/' + str(group) if group else ''}"
            print(f"{label:>10} {m:>5} {a:>12.2f} {b:>14.2f} {a - b:>9.2f}")
            rows_out.append({"quant": label, "m": m, "n": N, "one_shot_us": round(a, 2),
                             "norm_quant_us": round(b, 2)})  # fmt: skip
    dist.destroy_process_group()
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "triton": triton.__version__, "timing": "do_bench_cudagraph median"}  # fmt: skip
        with open(os.path.join(args.out, "oneshot_world1.json"), "w") as f:
            json.dump({**meta, "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
