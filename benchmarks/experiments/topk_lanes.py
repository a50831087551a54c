"""The multi-program top-k's candidate append before and after its chunks became (ROWS, BLOCK)
tiles whose columns keep candidate bit masks (issue 5; benchmarks/NOTES.md 2026-12-05).

topk_parts.py found the append of the ~2.3 % candidates costing 100-230 us over the 38-46 us
stream at 256 x 128K. Its scatter stores took a one-score-per-thread layout while the loads were
vectorized, so every chunk's keys and flags crossed threads through shared memory (20-40
barriers per chunk in the sm90 SASS), and each chunk waited on a scan, a reduction and an
atomic. `_collect_segment` now streams with nothing but a per-column bit mask and count in
registers, places the columns' candidates once per segment (one scan, one atomic, a walk over
the masks that reloads those scores), and hides the stride from the compiler (kernels/topk.py).

Parts over rows x 128K randn fp32, threshold key(2.0) (~2.3 % candidates), each checked (the
count and the set of appended indices of sampled rows) before it is timed (CUDA graph, median):
- before: the previous `_collect_segment` (1-D chunk, vectorized loads, one scan), copied here;
- gmax: `_collect_segment` with the group maxima only (no append);
- tiles RxB cC wW: `_collect_segment` with the append and the group maxima;
- sample S wW select: `_topk_sample_kernel` (radix histograms or bisection) over the same rows.

    PYTHONPATH=. python benchmarks/experiments/topk_lanes.py [--out FILE.json] [--rows 256]
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton
import triton.language as tl
import triton.testing
from _rows import row_writer  # this folder: the script's own path entry

from fxfuse.kernels.topk import _collect_segment, _ordered_key, _topk_sample_kernel


@triton.jit
def _append_before(
    scores_ptr, keys_ptr, idx_ptr, count_ptr, length, lo,
    SEGMENTS: tl.constexpr, BLOCK: tl.constexpr, CHUNKS: tl.constexpr, CAP: tl.constexpr,
):  # fmt: skip
    """The append as it was (kernels/topk.py before 2026-12-05), without the group maxima."""
    pid = tl.program_id(0)
    row = pid // SEGMENTS
    seg = pid % SEGMENTS
    SEGMENT: tl.constexpr = BLOCK * CHUNKS
    row_off = row.to(tl.int64) * length + seg * SEGMENT
    offs0 = tl.arange(0, BLOCK)
    lo_u = lo.to(tl.uint32, bitcast=True)
    x_next = tl.load(scores_ptr + row_off + offs0)
    for c in range(CHUNKS):
        x = x_next
        x_next = tl.load(scores_ptr + row_off + offs0 + (c + 1) * BLOCK, mask=c + 1 < CHUNKS)
        key = _ordered_key(x, offs0 < BLOCK)
        cand = key >= lo_u
        n_cand = tl.sum(cand.to(tl.int32), 0)
        if n_cand > 0:
            base = tl.atomic_add(count_ptr + row, n_cand, sem="relaxed")
            pos = base + tl.cumsum(cand.to(tl.int32), 0) - 1
            ok = cand & (pos < CAP)
            tl.store(keys_ptr + row * CAP + pos, key.to(tl.int32, bitcast=True), mask=ok)
            tl.store(idx_ptr + row * CAP + pos, seg * SEGMENT + c * BLOCK + offs0, mask=ok)


@triton.jit(do_not_specialize=["stride"])
def _tiles(
    scores_ptr, keys_ptr, idx_ptr, count_ptr, gmax_ptr, length, lo, stride,
    SEGMENTS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, CHUNKS: tl.constexpr,
    CAP: tl.constexpr, COLLECT: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    row = pid // SEGMENTS
    seg = pid % SEGMENTS
    SEGMENT: tl.constexpr = ROWS * BLOCK * CHUNKS
    _collect_segment(
        scores_ptr, row.to(tl.int64) * length + seg * SEGMENT, stride, SEGMENT, seg * SEGMENT,
        lo.to(tl.uint32, bitcast=True), idx_ptr, row * CAP, count_ptr + row,
        gmax_ptr, pid * BLOCK, COLLECT, True, ROWS, BLOCK, CAP,
    )  # fmt: skip


def bench(fn):
    return triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--rows", type=int, default=256)
    args = parser.parse_args()
    dev = torch.device("cuda")
    emit = row_writer(args.out, {"device": torch.cuda.get_device_name(),
                                 "torch": torch.__version__, "triton": triton.__version__})

    rows, length, cap = args.rows, 131072, 8192
    torch.manual_seed(0)
    x = torch.randn(rows, length, device=dev)
    lo = 0xC0000000 - 2**32  # key(2.0) as int32
    hit = x >= 2.0
    expect = hit.sum(1)
    checked = range(0, rows, max(1, rows // 16))
    want = {r: torch.nonzero(hit[r]).flatten() for r in checked}
    keys = torch.empty(rows * cap, dtype=torch.int32, device=dev)
    idx = torch.empty(rows * cap, dtype=torch.int32, device=dev)
    count = torch.zeros(rows, dtype=torch.int32, device=dev)
    gmax = torch.empty(rows * length // 8, dtype=torch.int32, device=dev)

    def check():
        if not torch.equal(count.long(), expect):
            return False
        got = idx.view(rows, cap)
        return all(
            torch.equal(got[r, : int(expect[r])].long().sort().values, want[r]) for r in checked
        )

    def run(part, fn, collect=True):
        try:
            fn()
            ok = check() if collect else True
            us = round(bench(fn), 2)
        except Exception as e:  # noqa: BLE001 - a variant that cannot launch is reported
            ok, us = repr(e)[:200], None
        emit({**part, "ok": ok, "us": us})

    for block, chunks, warps in ((4096, 8, 16), (4096, 8, 4)):

        def before(b=block, c=chunks, w=warps):
            count.zero_()
            s = length // (b * c)
            _append_before[(rows * s,)](
                x, keys, idx, count, length, lo, SEGMENTS=s, BLOCK=b, CHUNKS=c, CAP=cap,
                num_warps=w,
            )  # fmt: skip

        run({"part": "collect", "variant": "before", "block": block, "chunks": chunks,
             "warps": warps}, before)  # fmt: skip
    for r_, block, chunks, warps in (
        (1, 4096, 8, 16), (2, 2048, 8, 16), (4, 2048, 4, 16), (8, 2048, 2, 16), (4, 2048, 4, 8),
        (2, 4096, 4, 16), (4, 4096, 2, 16), (4, 2048, 8, 16), (8, 1024, 4, 8), (8, 512, 8, 4),
        (16, 512, 4, 8),
    ):  # fmt: skip
        for collect in (True, False):
            if not collect and (r_, block) not in ((4, 2048), (1, 4096)):
                continue

            def tiles(r=r_, b=block, c=chunks, w=warps, co=collect):
                count.zero_()
                s = length // (r * b * c)
                _tiles[(rows * s,)](
                    x, keys, idx, count, gmax, length, lo, 1, SEGMENTS=s, ROWS=r, BLOCK=b,
                    CHUNKS=c, CAP=cap, COLLECT=co, num_warps=w,
                )  # fmt: skip

            name = "tiles" if collect else "gmax"
            run({"part": "collect", "variant": name, "rows": r_, "block": block,
                 "chunks": chunks, "warps": warps}, tiles, collect)  # fmt: skip

    state = torch.zeros(rows * 8, dtype=torch.int32, device=dev)
    for sample, warps in ((8192, 16), (8192, 8), (4096, 8), (4096, 4), (2048, 4)):
        for select in (0, 1):

            def fs(s=sample, w=warps, sel=select):
                _topk_sample_kernel[(rows,)](
                    x, state, state, state, length, 2048, 0, length, 1,
                    LENGTHS=0, HAS_STARTS=False, SAMPLE=s, SECTOR=16, MIN_RANK=max(1, s // 128),
                    RADIX_BITS=5, SELECT=sel, num_warps=w,
                )  # fmt: skip

            run({"part": "sample", "sample": sample, "warps": warps,
                 "select": ("radix", "bisect")[select]}, fs, False)  # fmt: skip
    emit({"part": "read", "variant": "torch.amax", "us": round(bench(lambda: x.amax(1)), 2)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
