"""GLM-5.3-Flash's kv_b (no rope part): fxfuse.gemm_split against the unfused GEMM + key copy
and the GEMM alone, CUDA graphs (inputs not rotated), each output checked against float64. The
op is called as the pattern calls it: the value (read in place) is its view piece.

    PYTHONPATH=. python benchmarks/experiments/glm53_kv_b_split.py [--m 128,1024]
                                                        # writes $OUT/glm53.json
"""

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_gemm_split_cat import time_us  # noqa: E402

import fxfuse  # noqa: E402, F401  (registers the ops)

K, S = 512, 256  # kv_lora_rank; each head's qk_nope and v width


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", default="128,1024,8192,32768", help="tokens, comma-separated")
    parser.add_argument("--heads", default="16,64", help="head counts, comma-separated")
    parser.add_argument("--pairs", default=None,
                        help="heads:m pairs instead of heads × m, e.g. 16:256,64:32")
    args = parser.parse_args()
    if args.pairs:
        cases = [tuple(int(v) for v in p.split(":")) for p in args.pairs.split(",")]
    else:
        cases = [(h, int(m)) for h in args.heads.split(",") for m in args.m.split(",")]
    rows = []
    for heads, m in ((int(h), m) for h, m in cases):
        x = torch.randn(m, K, dtype=torch.bfloat16, device="cuda")
        w = torch.randn(heads * 2 * S, K, dtype=torch.bfloat16, device="cuda") / K**0.5
        ref = (x.double() @ w.double().T).view(m, heads, 2 * S)
        pieces = torch.ops.fxfuse.gemm_split(x, w, heads, [S, S], 1)
        err = max(
            ((got.double() - want).norm() / want.norm()).item()
            for got, want in zip(pieces, (ref[..., :S], ref[..., S:]))
        )
        assert err < 1e-2, err

        def fused(x=x, w=w, heads=heads):
            return torch.ops.fxfuse.gemm_split(x, w, heads, [S, S], 1)

        def unfused(x=x, w=w, heads=heads, m=m):
            c = F.linear(x, w).view(m, heads, 2 * S)
            return c[..., :S].contiguous(), c[..., S:]

        us = {
            "fused": time_us(fused, graph=True),
            "unfused": time_us(unfused, graph=True),
            "gemm_alone": time_us(lambda x=x, w=w: F.linear(x, w), graph=True),
            "fused_again": time_us(fused, graph=True),
        }
        cells = " ".join(f"{name} {t:8.2f}" for name, t in us.items())
        print(f"glm53 heads={heads} m={m:>6} err {err:.1e} {cells}", flush=True)
        rows.append({"heads": heads, "m": m, "k": K, "sizes": [S, S], "us": us,
                     "rel_err": err})  # fmt: skip
    out = os.path.join(os.environ.get("OUT", "/tmp"), "glm53.json")
    with open(out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   # "fused" runs the op's table choice unless this overrides it
                   "FXFUSE_GEMM_BACKEND": os.environ.get("FXFUSE_GEMM_BACKEND", "table"),
                   "argv": sys.argv[1:], "rows": rows}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
