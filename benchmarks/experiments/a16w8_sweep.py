"""Sweep the A16W8 per-token prequant GEMM's launch configs at decode M (its sm90 table,
`gemm_a16w8`, held first guesses), or with --kind a8w8 the rowwise A8W8 GEMM's (table `gemm_fp8`,
whose earlier sweep had no 128-wide or 16-way split tiles), against `torch._scaled_mm`. CUDA
graphs, weights rotated through more than L2. Each candidate's output is checked against the table
config's (≤ 1e-2 relative; split-K changes only the fp32 summation order) before it is timed.

    PYTHONPATH=. python benchmarks/experiments/a16w8_sweep.py [--kind a8w8 --m 16,64] --out $OUT
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
A8W8_SHAPES = [(2112, 7168), (3072, 1536), (7168, 2048), (24576, 1536)]
L2_BYTES = 60 * 2**20


def candidates(m: int, k: int, block_ms=(16, 32), swap: int = 0) -> list[dict]:
    """Tiles to try; swap = 1: swapped tiles only (the weight rows fill the MMA's M slot), with
    one token tile of the bucket's M."""
    out = []
    if swap:
        block_ms = (16 if m <= 16 else 32,)
    for bm, bn, bk, sk in itertools.product(block_ms, (64, 128), (128, 256), (1, 2, 4, 8, 16)):
        if bm > max(16, m) or k // bk < sk or (sk == 1 and k > 2048):
            continue
        stages = 4 if bn * bk <= 16384 else 3
        out.append({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 1, "SPLIT_K": sk,
                    "num_warps": 4, "num_stages": stages, "SWAP_AB": swap})  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--m", default="16,32")
    parser.add_argument("--out", default=None)
    parser.add_argument("--kind", choices=("a16w8", "a8w8"), default="a16w8")
    parser.add_argument("--swap", action="store_true", help="only swapped (SWAP_AB) tiles")
    args = parser.parse_args()
    dev = torch.device("cuda")
    rows = []
    a8w8 = args.kind == "a8w8"
    table_name = gemm_fp8.KERNEL_NAME if a8w8 else gemm_fp8.PREQUANT_TABLE
    for n, k in A8W8_SHAPES if a8w8 else SHAPES:
        sets = max(2, min(8, 3 * L2_BYTES // (n * k) + 1))
        weights = [(torch.randn(n, k, device=dev) / 4).to(torch.float8_e4m3fn) for _ in range(sets)]
        scales = [torch.rand(n, device=dev) + 0.5 for _ in range(sets)]
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            q = (x / 8).to(torch.float8_e4m3fn)
            q_scale = torch.rand(m, 1, device=dev) + 0.5
            state = {"i": 0}

            def gemm(i, config=None):
                if a8w8:
                    return gemm_fp8.gemm_fp8(q, q_scale, weights[i], scales[i], config=config)
                return gemm_fp8.gemm_a16w8(x, weights[i], scales[i], config=config)

            def call(config):
                def fn():
                    i = state["i"] = (state["i"] + 1) % sets
                    return gemm(i, config)

                return fn

            ref = gemm(0).float()
            table = gemm_fp8.launch_config(table_name, "sm90", m, n, k, None)
            timings = []
            vendor_us = None
            if a8w8:

                def vendor():
                    i = state["i"] = (state["i"] + 1) % sets
                    return torch._scaled_mm(q, weights[i].t(), q_scale, scales[i][None],
                                            out_dtype=torch.bfloat16)  # fmt: skip

                vendor()
                torch.cuda.synchronize()
                vendor_us = round(1e3 * triton.testing.do_bench_cudagraph(vendor, rep=20), 2)
            block_ms = (16, 64) if a8w8 and m > 16 else (16, 32)
            for config in [None] + candidates(m, k, block_ms, int(args.swap)):
                try:
                    got = gemm(0, config).float()
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
            rows.append({"m": m, "n": n, "k": k, "table_us": table_us, "scaled_mm_us": vendor_us,
                         "top5": timings[:5]})  # fmt: skip
            print(f"m={m:3d} n={n:5d} k={k:5d} table {table_us} us, _scaled_mm {vendor_us}, "
                  f"best {timings[0]}", flush=True)  # fmt: skip
            if args.out:
                name = f"{args.kind}{'_swap' if args.swap else ''}_sweep.json"
                with open(os.path.join(args.out, name), "w") as f:
                    json.dump({"table": table_name, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
