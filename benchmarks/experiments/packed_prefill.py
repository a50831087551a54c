"""vLLM's DSA prefill top-k over packed rows (tests/patterns/test_topk.py `vllm_prefill`): the
spelled chain eager, Inductor's compile of it, and `apply_fusions` of it (one
`fxfuse.topk_page_transform` with no page table, then the start shift). Checks the fused
output against the eager chain (the same scores up to equal ones), times all three in CUDA
graphs, writes `packed_prefill.json`.

    PYTHONPATH=. python benchmarks/experiments/packed_prefill.py --out $OUT

Rows: `seqs` sequences of `seq_len` tokens packed into one key range; each query row of a
sequence ranks the keys [ks, ke) = [start of its sequence, its own position + 1) (causal), as
vLLM's `cu_seqlen_ks` / `cu_seqlen_ke` give them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch
import triton

import fxfuse

NEG_INF = float("-inf")


def vllm_prefill(logits, ks, ke, k: int):
    seq_len_kv = logits.shape[-1]
    cols = torch.arange(0, seq_len_kv, device=logits.device)
    mask = (cols[None, :] >= ks[:, None]) & (cols[None, :] < ke[:, None])
    logits = logits.masked_fill(~mask, NEG_INF)
    topk_indices = logits.topk(min(k, logits.shape[-1]), dim=-1)[1]
    topk_indices -= ks[:, None]
    mask = (topk_indices >= 0) & (topk_indices - (ke - ks)[:, None] < 0)
    return topk_indices.masked_fill(~mask, -1).to(dtype=torch.int32)


class Chain(torch.nn.Module):
    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, logits, ks, ke):
        return vllm_prefill(logits, ks, ke, self.k)


def packed_rows(seqs: int, seq_len: int, queries: int, device):
    """ks, ke for `queries` query rows per sequence (its last ones: the longest windows)."""
    ks, ke = [], []
    for s in range(seqs):
        for q in range(seq_len - queries, seq_len):
            ks.append(s * seq_len)
            ke.append(s * seq_len + q + 1)
    as_tensor = lambda v: torch.tensor(v, dtype=torch.int32, device=device)  # noqa: E731
    return as_tensor(ks), as_tensor(ke)


def same_up_to_ties(scores, ks, a, b) -> bool:
    def chosen(idx):
        cols = torch.where(idx >= 0, idx.long() + ks[:, None].long(), 0)
        got = scores.gather(1, cols)
        return torch.where(idx >= 0, got, NEG_INF).sort(1).values

    return torch.equal(chosen(a), chosen(b))


def time_us(fn) -> float:
    return triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--k", type=int, default=2048)
    parser.add_argument(
        "--cases", default="4x8192x1024,8x16384x512,1x65536x256",
        help="seqs x seq_len x queries per seq, comma-separated",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a GPU")
    device = torch.device("cuda")
    torch.manual_seed(0)
    rows = []
    for case in args.cases.split(","):
        seqs, seq_len, queries = (int(v) for v in case.split("x"))
        ks, ke = packed_rows(seqs, seq_len, queries, device)
        logits = torch.randn(ks.shape[0], seqs * seq_len, device=device)
        inputs = (logits, ks, ke)
        model = Chain(args.k)
        with torch.no_grad():
            fused = fxfuse.apply_fusions(model, inputs)
            assert fused.fxfuse_report.counts["topk_page_transform"] == 1, fused.fxfuse_report
            compiled = torch.compile(model, dynamic=False)
            want, got, ind = model(*inputs), fused(*inputs), compiled(*inputs)
            ok = same_up_to_ties(logits, ks, got, want) and same_up_to_ties(logits, ks, ind, want)
            times = {
                "eager": time_us(lambda: model(*inputs)),
                "inductor": time_us(lambda: compiled(*inputs)),
                "fxfuse": time_us(lambda: fused(*inputs)),
            }
            times["fxfuse_repeat"] = time_us(lambda: fused(*inputs))
        row = {
            "case": case, "rows": ks.shape[0], "length": seqs * seq_len, "k": args.k,
            "us": {key: round(us, 2) for key, us in times.items()}, "exact_up_to_ties": ok,
            "vs_eager": round(times["eager"] / times["fxfuse"], 2),
            "vs_inductor": round(times["inductor"] / times["fxfuse"], 2),
        }  # fmt: skip
        print(json.dumps(row))
        rows.append(row)
    result = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "triton": triton.__version__, "date": datetime.date.today().isoformat(),
        "command": "PYTHONPATH=. python " + " ".join(sys.argv), "timing": "cudagraph", "rows": rows,
    }  # fmt: skip
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "packed_prefill.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
