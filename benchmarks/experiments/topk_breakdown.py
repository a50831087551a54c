"""Where a top-k page transform call spends its device time, kernel by kernel (issue 5).

Runs the launch table's path (or --path) on bench_topk's page inputs, rotated past L2, under
torch.profiler (`topk_probe.kernel_times`), and prints each kernel's mean device time per call
(kernels launched eagerly: the gaps between them are not counted, so the sum is below a
CUDA-graph timing of the call), and how many rows of each input set the multi path retried.

    PYTHONPATH=. python benchmarks/experiments/topk_breakdown.py [--out DIR]
        [--shapes 256x131072,64x131072] [--topks 2048,512] [--calls 20] [--config '{"K": v}']
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import bench_topk as bt  # noqa: E402
from topk_probe import kernel_times  # noqa: E402

from fxfuse.kernels import topk  # noqa: E402


def _shapes(text: str) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in item.split("x")) for item in text.split(",")]


def breakdown(rows, length, k, calls, config, path, device) -> dict:
    sets = bt.page_inputs(rows, length, device, seed=rows + k,
                          copies=bt.copies_for(rows * length * 4, True))  # fmt: skip
    fn = bt.Rotating(
        lambda s, lens, t: topk.topk_page_transform(
            s, k, lens, t, bt.PAGE_SIZE, config=config, path=path
        ),
        sets,
    )
    per_kernel = kernel_times(fn, calls)
    total = sum(per_kernel.values())
    # Rows whose estimate missed (retried in the collect kernel), over the input sets, read
    # from the per-row state of an index call with the same scores and lengths.
    retried = []
    for s, lens, _ in sets:
        out = torch.empty((rows, k), dtype=torch.int32, device=device)
        state = topk._launch(
            s, k, out, epilogue=topk.EPI_INDICES.value, sort=topk.SORT_NONE.value,
            lengths=lens, row_starts=None, pad=-1, config=config, path=path,
        )  # fmt: skip
        if state is not None:
            retried.append(int((state[:, topk.ST_RETRY.value] != 0).sum()))
    return {
        "rows": rows, "length": length, "k": k, "path": path, "config": config,
        "kernels_us": dict(sorted(per_kernel.items(), key=lambda x: -x[1])),
        "sum_us": round(total, 2), "graph_us": round(bt.time_us(fn, graph=True), 2),
        "retried_rows": retried,
    }  # fmt: skip


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="/tmp/fxfuse_results")
    p.add_argument("--shapes", type=_shapes, default=[(256, 131072)], help="rows x length list")
    p.add_argument("--topks", default="2048,512")
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--path", default="auto", choices=topk.PATHS)
    p.add_argument("--config", type=json.loads, default=None, help="launch overrides, JSON")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    device = torch.device("cuda")
    out = os.path.join(args.out, "topk_breakdown.jsonl")
    for rows, length in args.shapes:
        for k in [int(v) for v in args.topks.split(",")]:
            row = breakdown(rows, length, k, args.calls, args.config, args.path, device)
            print(json.dumps(row), flush=True)
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
