"""What fraction of the 4.25 TB/s copy roofline plain memory-bound torch kernels reach at the
sizes of the rmsnorm_quant rows that miss issue 2's 90 % bar (N = 1536, M = 4096-16384).

For each (N, M): the bytes the fused residual + RMSNorm + FP8 quant kernel must move (x and the
residual read, their sum and the FP8 q written, one fp32 scale per row), then, in CUDA graphs over
inputs rotated through more than L2:
- `add`: torch.add(x, r, out=s) on bf16 (M, N): 2 reads + 1 write, 6 bytes an element;
- `copy`: a contiguous copy_ of a buffer sized so that read + write equal the fused kernel's bytes;
- `fused`: the residual + RMSNorm + FP8 per-token kernel itself (kernels/rms_norm_quant.py).
Each as µs and as % of bytes / 4.25 TB/s.

    PYTHONPATH=. python benchmarks/experiments/copy_ceiling.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton.testing

from fxfuse.kernels.rms_norm_quant import rms_norm_quant

CEILING = 4.25e12
L2_BYTES = 60 * 2**20


def us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=30)


def rotated(make, bytes_each):
    sets = [make() for _ in range(max(2, int(3 * L2_BYTES // max(bytes_each, 1)) + 1))]
    state = {"i": 0}

    def pick():
        state["i"] += 1
        return sets[state["i"] % len(sets)]

    return pick


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", default="1536,7168")
    parser.add_argument("--m", default="4096,8192,16384")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = []
    for n in (int(v) for v in args.n.split(",")):
        for m in (int(v) for v in args.m.split(",")):
            fused_bytes = m * n * (2 + 2 + 2 + 1) + m * 4 + n * 2
            bf16 = dict(dtype=torch.bfloat16, device="cuda")

            pick_add = rotated(
                lambda: tuple(torch.randn(m, n, **bf16) for _ in range(3)), 6 * m * n
            )
            half = fused_bytes // 2
            pick_copy = rotated(
                lambda: (torch.empty(half, dtype=torch.uint8, device="cuda").random_(0, 255),
                         torch.empty(half, dtype=torch.uint8, device="cuda")),
                fused_bytes,
            )  # fmt: skip
            weight = torch.randn(n, **bf16)
            pick_fused = rotated(
                lambda: (torch.randn(m, n, **bf16), torch.randn(m, n, **bf16)), 4 * m * n
            )

            def add():
                x, r, s = pick_add()
                torch.add(x, r, out=s)

            def copy():
                src, dst = pick_copy()
                dst.copy_(src)

            def fused():
                x, r = pick_fused()
                rms_norm_quant(x, weight, 1e-6, r, quant="fp8", group_size=0)

            row = {"n": n, "m": m, "fused_bytes": fused_bytes}
            for name, fn, nbytes in (
                ("add", add, 6 * m * n),
                ("copy", copy, fused_bytes),
                ("fused", fused, fused_bytes),
            ):
                try:
                    t = us(fn)
                except Exception as exc:  # noqa: BLE001 - a probe: record and go on
                    row[name] = str(exc).splitlines()[0][:200]
                    continue
                row[f"{name}_us"] = round(t, 2)
                row[f"{name}_pct_roofline"] = round(100 * nbytes / CEILING / (t * 1e-6), 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(os.path.join(args.out, "copy_ceiling.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
