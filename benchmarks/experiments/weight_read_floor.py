"""How fast one GPU reads a decode GEMM's weights and nothing else: the practical floor under
the FP8 GEMMs at M <= 128 (issue 3's bar: >= 70 % of the weight-read roofline).

    PYTHONPATH=. python benchmarks/experiments/weight_read_floor.py --out RESULTS   # GPU, ~20 s

Per DeepSeek-R1 weight (N x K FP8 bytes): a Triton kernel that reads the bytes once (16 B a
thread a load, a grid of one wave of programs, each summing its slice into one int32 it stores)
and torch.amax over the same bytes viewed as int32, both in CUDA graphs over copies rotated past
L2, µs per call, against the roofline of bench_gemm_fp8 (4.25 TB/s). Writes
weight_read_floor.json under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

SHAPES = [(2112, 7168), (3072, 1536), (4096, 512), (7168, 2048), (24576, 1536)]


@triton.jit
def _read_kernel(src_ptr, out_ptr, n_words, words_per_program, BLOCK: tl.constexpr):
    """Sum program p's run of int32 words (BLOCK a step, 4 a thread) into out[p]."""
    pid = tl.program_id(0)
    start = pid * words_per_program
    acc = tl.zeros((BLOCK,), tl.int32)
    for off in range(start, tl.minimum(start + words_per_program, n_words), BLOCK):
        offs = off + tl.arange(0, BLOCK)
        acc += tl.load(src_ptr + offs, mask=offs < n_words, other=0)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


def read_once(words: torch.Tensor, out: torch.Tensor, block: int, warps: int) -> None:
    n = words.numel()
    programs = out.numel()
    per = triton.cdiv(triton.cdiv(n, programs), block) * block
    _read_kernel[(programs,)](words, out, n, per, BLOCK=block, num_warps=warps)


def main(argv=None) -> None:
    import bench_gemm_fp8 as bench

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = bench.header("PYTHONPATH=. python benchmarks/experiments/weight_read_floor.py")
    for n, k in SHAPES:
        nbytes = n * k
        copies = bench.copies_for(nbytes)
        # small words: a program's int32 sum cannot overflow, so the read is checked exactly
        weights = [torch.randint(0, 4, (nbytes // 4,), dtype=torch.int32, device="cuda")
                   for _ in range(copies)]
        row = {"n": n, "k": k, "bytes": nbytes,
               "roofline_us": round(bench.roofline_us(nbytes, 0, 1.0), 2), "us": {}}
        row["us"]["torch.amax"] = round(bench.time_us(
            [lambda w=w: torch.amax(w) for w in weights], use_graph=True), 2)
        for per_sm, block, warps in ((4, 1024, 4), (8, 1024, 4), (4, 2048, 8), (16, 512, 4)):
            out = torch.empty(per_sm * sms, dtype=torch.int32, device="cuda")
            read_once(weights[0], out, block, warps)
            if int(out.sum()) != int(weights[0].sum()):
                raise AssertionError(f"{n}x{k}: the read kernel's sums are wrong")
            name = f"triton {per_sm}/SM b{block} w{warps}"
            row["us"][name] = round(bench.time_us(
                [lambda w=w: read_once(w, out, block, warps) for w in weights],
                use_graph=True), 2)
        best = min(row["us"].values())
        row["best_tbps"] = round(nbytes / best / 1e6, 2)
        results["rows"].append(row)
        print(f"{n}x{k} ({nbytes / 2**20:.1f} MiB): roofline {row['roofline_us']} us | "
              + " | ".join(f"{name} {us}" for name, us in row["us"].items())
              + f" | best {row['best_tbps']} TB/s", flush=True)
        del weights
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "weight_read_floor.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
