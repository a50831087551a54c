"""Sweep the A16W8 per-token prequant GEMM's launch configs at decode M (its sm90 table,
`gemm_a16w8`, holds first guesses). CUDA graphs, weights rotated through more than L2. Each
candidate's output is checked against the table config's (≤ 1e-2 relative; split-K changes only
the fp32 summation order) before it is timed.

    PYTHONPATH=. python benchmarks/experiments/a16w8_sweep.py --out $OUT
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

import torch
import triton.testing

from fxfuse.kernels import gemm_fp8

# (N, K): the chain bench's DeepSeek-R1 shapes, then the deepseek_v32 layer's per-token ones.
SHAPES = [(2112, 7168), (4096, 7168), (3072, 1536), (7168, 2048), (4608, 7168)]
L2_BYTES = 60 * 2**20


def candidates(m: int, k: int) -> list[dict]:
    out = []
    for bm, bn, bk, sk in itertools.product((16, 32), (64, 128), (128, 256), (1, 2, 4, 8, 16)):
        if bm > max(16, m) or k // bk < sk or (sk == 1 and k > 2048):
            continue
        stages = 4 if bn * bk <= 16384 else 3
        out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "SPLIT_K": sk,
                    "num_warps": 4, "num_stages": stages, "SWAP_AB": 0})  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--m", default="16,32")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dev = torch.device("cuda")
    rows = []
    for n, k in SHAPES:
        sets = max(2, min(8, 3 * L2_BYTES // (n * k) + 1))
        weights = [(torch.randn(n, k, device=dev) / 4).to(torch.float8_e4m3fn) for _ in range(sets)]
        scales = [torch.rand(n, device=dev) + 0.5 for _ in range(sets)]
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            state = {"i": 0}

            def call(config):
                def fn():
                    i = state["i"] = (state["i"] + 1) % sets
                    return gemm_fp8.gemm_a16w8(x, weights[i], scales[i], config=config)

                return fn

            ref = gemm_fp8.gemm_a16w8(x, weights[0], scales[0]).float()
            table = gemm_fp8.launch_config(gemm_fp8.PREQUANT_TABLE, "sm90", m, n, k, None)
            timings = []
            for config in [None] + candidates(m, k):
                try:
                    got = gemm_fp8.gemm_a16w8(x, weights[0], scales[0], config=config).float()
                    err = ((got - ref).norm() / ref.norm()).item()
                    if not err <= 1e-2:
                        raise RuntimeError(f"rel err {err:.2e}")
                    fn = call(config)
                    fn()
                    torch.cuda.synchronize()
                    us = 1e3 * triton.testing.do_bench_cudagraph(fn, rep=20)
                except Exception as exc:  # noqa: BLE001 - configs the compiler rejects (smem)
                    print(f"  skip {config}: {str(exc).splitlines()[0][:120]}", flush=True)
                    continue
                timings.append((round(us, 2), config or {"table": table}))
            table_us = timings[0][0] if timings and "table" in timings[0][1] else None
            timings.sort(key=lambda t: t[0])
            rows.append({"m": m, "n": n, "k": k, "table_us": table_us, "top5": timings[:5]})
            print(f"m={m:3d} n={n:5d} k={k:5d} table {table_us} us, best {timings[0]}", flush=True)
            if args.out:
                with open(os.path.join(args.out, "a16w8_sweep.json"), "w") as f:
                    json.dump({"table": "gemm_a16w8", "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
