"""Where the vendor GEMM → split → cat path's time goes at kv_b (K 512, D 16, S 128/128/64): each
of its three kernels alone, against the same batched GEMM into a contiguous buffer and the flat
GEMM alone (CUDA graphs, µs).

    PYTHONPATH=. python benchmarks/experiments/split_cat_parts.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.nn.functional as F
import triton.testing

from fxfuse.runtime import gemm_split_cat_ops


def us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=30)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--m", default="4096,8192,32768")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    d, s1, s2, s3, k = 16, 128, 128, 64, 512
    rows = []
    for m in (int(v) for v in args.m.split(",")):
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(d * (s1 + s2), k, dtype=torch.bfloat16, device="cuda") / k**0.5
        y = torch.randn(m, 1, s3, dtype=torch.bfloat16, device="cuda").expand(m, d, s3)
        out = torch.empty(m, d, s1 + s3, dtype=torch.bfloat16, device="cuda")
        c2 = torch.empty(m, d, s2, dtype=torch.bfloat16, device="cuda")
        flat = torch.empty(d, m, s1, dtype=torch.bfloat16, device="cuda")
        wh = w.unflatten(0, (d, s1 + s2))
        xb = x.expand(d, m, k)
        parts = {
            "gemm alone (F.linear)": lambda: F.linear(x, w),
            "vendor op path": lambda: gemm_split_cat_ops._vendor_split_cat(x, w, d, s1, s2, y),
            "bmm c1 -> out slice": lambda: torch.bmm(
                xb, wh[:, :s1].transpose(1, 2), out=out[:, :, :s1].transpose(0, 1)
            ),
            "bmm c2 -> c2": lambda: torch.bmm(
                xb, wh[:, s1:].transpose(1, 2), out=c2.transpose(0, 1)
            ),
            "bmm c1 -> contiguous": lambda: torch.bmm(xb, wh[:, :s1].transpose(1, 2), out=flat),
            "y copy": lambda: out[:, :, s1:].copy_(y),
        }
        for name, fn in parts.items():
            t = us(fn)
            rows.append({"m": m, "part": name, "us": round(t, 2)})
            print(f"M={m:6d} {name:24s} {t:8.2f} us", flush=True)
    if args.out:
        with open(os.path.join(args.out, "split_cat_parts.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "rows": rows}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
