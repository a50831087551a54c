"""How fast a plain segment stream reads a (rows, length) fp32 matrix (issue 5's collect kernel
without its candidates): the question is whether the stream's load mechanism, not the top-k
work, holds the multi path's collect kernel at ~70 % of DRAM bandwidth (ncu, H100, 2026-12-07:
2.40 TB/s, 74 % of the stall samples waiting in the stream loop).

Each program streams one segment of SEGMENT scores of one row, CHUNK scores a step, and stores
the max of each of its columns (like `_collect_segment`'s group maxima: nothing else), so the
grid is the collect kernel's (rows x length / SEGMENT programs). Variants:
- ptr: pointer loads through Triton's pipeliner (`tl.range(num_stages=S)`: cp.async into shared
  memory), the collect kernel's mechanism;
- tma: the same chunks as tensor-descriptor loads (a host `TensorDescriptor` over the scores
  viewed as (rows x length / 256, 256), boxes of (CHUNK / 256, 256): the bulk-copy engine, one
  issuing thread, completion by mbarrier);
- torch.amax over each row, for scale.
Every variant is checked (each row's max from the stored maxima equals torch's) before it is
timed in CUDA graphs over inputs rotated past L2.

    PYTHONPATH=. python benchmarks/experiments/stream_read.py [--out DIR] [--shapes 256x131072]
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/experiments/stream_read.py --cpu-smoke
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl

try:  # tensor descriptors (triton >= 3.3)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton
    TensorDescriptor = None

WIDTH = 256  # the descriptor view's inner dimension (a TMA box is at most 256 wide)


@triton.jit
def _stream_ptr(x_ptr, out_ptr, length, SEGMENT: tl.constexpr, CHUNK: tl.constexpr,
                STAGES: tl.constexpr):  # fmt: skip
    segs = length // SEGMENT
    row = tl.program_id(0) // segs
    seg = tl.program_id(0) % segs
    base = x_ptr + row.to(tl.int64) * length + seg * SEGMENT
    offs = tl.arange(0, CHUNK)
    acc = tl.full((CHUNK,), float("-inf"), tl.float32)
    for c in tl.range(0, SEGMENT // CHUNK, num_stages=STAGES):
        acc = tl.maximum(acc, tl.load(base + c * CHUNK + offs))
    tl.store(out_ptr + tl.program_id(0).to(tl.int64) * CHUNK + offs, acc)


@triton.jit
def _stream_tma(desc, out_ptr, length, SEGMENT: tl.constexpr, CHUNK: tl.constexpr,
                STAGES: tl.constexpr):  # fmt: skip
    R: tl.constexpr = CHUNK // 256
    segs = length // SEGMENT
    row = tl.program_id(0) // segs
    seg = tl.program_id(0) % segs
    first = (row * length + seg * SEGMENT) // 256
    acc = tl.full((R, 256), float("-inf"), tl.float32)
    for c in tl.range(0, SEGMENT // CHUNK, num_stages=STAGES):
        acc = tl.maximum(acc, desc.load([first + c * R, 0]))
    out = out_ptr + tl.program_id(0).to(tl.int64) * CHUNK
    tl.store(out + tl.arange(0, R)[:, None] * 256 + tl.arange(0, 256)[None, :], acc)


def launch(kind, x, segment, chunk, stages, warps):
    rows, length = x.shape
    grid = (rows * (length // segment),)
    out = torch.empty(grid[0] * chunk, dtype=torch.float32, device=x.device)
    if kind == "ptr":
        _stream_ptr[grid](x, out, length, segment, chunk, stages, num_warps=warps)
    else:
        desc = TensorDescriptor.from_tensor(x.view(-1, WIDTH), [chunk // WIDTH, WIDTH])
        _stream_tma[grid](desc, out, length, segment, chunk, stages, num_warps=warps)
    return out


def row_max(out, rows):
    return out.view(rows, -1).amax(1)


VARIANTS = [  # kind, segment, chunk, stages, warps
    ("ptr", 32768, 2048, 3, 8),  # the collect kernel's geometry
    ("ptr", 32768, 2048, 4, 8),
    ("ptr", 32768, 4096, 3, 8),
    ("ptr", 32768, 4096, 3, 16),
    ("tma", 32768, 2048, 3, 8),
    ("tma", 32768, 2048, 4, 8),
    ("tma", 32768, 4096, 3, 8),
    ("tma", 32768, 4096, 4, 4),
    ("tma", 32768, 8192, 3, 8),
    ("tma", 65536, 4096, 4, 8),
]


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--shapes", default="256x131072,64x131072")
    p.add_argument("--cpu-smoke", action="store_true")
    args = p.parse_args(argv)
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    shapes = [(4, 65536)] if args.cpu_smoke else [
        tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")
    ]
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        print(props.name, "triton", triton.__version__, flush=True)
    rows_out = []
    for rows, length in shapes:
        nbytes = rows * length * 4
        copies = 1 if args.cpu_smoke else max(2, -(-3 * 60 * 2**20 // nbytes) + 1)
        sets = [torch.randn(rows, length, device=device) for _ in range(copies)]
        want = sets[0].amax(1)
        state = {"i": 0}

        def rotating(fn):
            def call():
                state["i"] += 1
                return fn(sets[state["i"] % copies])

            return call

        candidates = [("torch_amax", None)] + [(v, v) for v in VARIANTS]
        for name, v in candidates:
            if v is None:
                fn = rotating(lambda x: x.amax(1))
                label = "torch.amax"
            else:
                kind, segment, chunk, stages, warps = v
                label = f"{kind} seg{segment} chunk{chunk} st{stages} w{warps}"
                if kind == "tma" and TensorDescriptor is None:
                    print(label, "skipped: no TensorDescriptor", flush=True)
                    continue
                if args.cpu_smoke and segment > length:
                    continue
                try:
                    got = row_max(launch(kind, sets[0], segment, chunk, stages, warps), rows)
                except Exception as e:  # a variant this triton cannot build: noted
                    print(label, f"failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
                    continue
                if not torch.equal(got, want):
                    print(label, "WRONG", flush=True)
                    continue
                fn = rotating(lambda x, v=v: launch(x=x, kind=v[0], segment=v[1], chunk=v[2],
                                                    stages=v[3], warps=v[4]))  # fmt: skip
            if args.cpu_smoke:
                print(label, "ok", flush=True)
                continue
            fn()
            torch.cuda.synchronize()
            us = [triton.testing.do_bench_cudagraph(fn, rep=30) * 1e3 for _ in range(2)]
            row = {"rows": rows, "length": length, "variant": label,
                   "us": [round(u, 2) for u in us], "tb_s": round(nbytes / min(us) / 1e6, 3)}
            print(json.dumps(row), flush=True)
            rows_out.append(row)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "stream_read.json"), "w") as f:
            json.dump({"command": "python benchmarks/experiments/stream_read.py", "rows": rows_out},
                      f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
