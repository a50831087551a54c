"""The parts of the multi-program top-k path timed alone on the H200 (issue 5), to find what keeps
it ~8x above the read time (benchmarks/experiments/topk_probe.py):

- edge: the radix descent `_radix_edge` over one register tile per program (the sample estimate,
  the select), against two other ways to find the rank-r key: a bisection of 32 counting steps,
  and a 16-way search (16 thresholds counted per step, 8 steps);
- select: `_select_candidates` (the finishing select of each row) alone;
- collect: `_collect_segment` over 256 x 128K scores (1024 programs of 32K), streaming only, with
  the group maxima, and with the candidate append (one atomic per chunk), against an append into
  a private per-segment slice (no atomic).

Each variant's result is checked against torch before it is timed.

    PYTHONPATH=. python benchmarks/experiments/topk_parts.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import sys

import torch
import triton
import triton.language as tl
import triton.testing
from _rows import row_writer  # this folder: the script's own path entry

from fxfuse.kernels.topk import _collect_segment, _ordered_key, _radix_edge, _select_candidates


@triton.jit
def _edge_kernel(
    keys_ptr, out_ptr, rank, SIZE: tl.constexpr, RADIX_BITS: tl.constexpr, METHOD: tl.constexpr
):
    row = tl.program_id(0)
    offs = tl.arange(0, SIZE)
    key = tl.load(keys_ptr + row * SIZE + offs).to(tl.uint32, bitcast=True)
    valid = offs < SIZE
    if METHOD == 0:
        prefix, s, _, _ = _radix_edge(key, valid, rank, 32, RADIX_BITS)
        edge = prefix << s
    elif METHOD == 1:
        # Bisection: the largest t with #(key >= t) >= rank, one count per bit.
        edge = tl.full((), 0, tl.uint32)
        for b in range(32):
            trial = edge | (tl.full((), 1, tl.uint32) << (31 - b))
            cnt = tl.sum((key >= trial).to(tl.int32), 0)
            edge = tl.where(cnt >= rank, trial, edge)
    else:
        # 16-way: 4 bits per step, 16 thresholds counted at once.
        edge = tl.full((), 0, tl.uint32)
        digits = tl.arange(0, 16).to(tl.uint32)
        for step in range(8):
            shift = 28 - 4 * step
            trial = edge | (digits << shift)  # [16]
            cnt = tl.sum((key[None, :] >= trial[:, None]).to(tl.int32), 1)  # [16]
            best = tl.max(tl.where(cnt >= rank, digits, 0), 0)
            edge = edge | (best << shift)
    tl.store(out_ptr + row, edge.to(tl.int32, bitcast=True))


@triton.jit
def _select_kernel(
    scores_ptr,
    keys_ptr,
    idx_ptr,
    m,
    k,
    idx_bits,
    AREA: tl.constexpr,
    CAP: tl.constexpr,
    RADIX_BITS: tl.constexpr,
):
    row = tl.program_id(0)
    _select_candidates(
        scores_ptr, row.to(tl.int64) * m, 1, keys_ptr, idx_ptr, row * AREA, m, k,
        row * AREA + CAP, idx_bits, 0, CAP, RADIX_BITS,
        0,  # SELECT_RADIX: the select these 2026-12-03 figures measured
        False,
    )


@triton.jit
def _collect_kernel(
    scores_ptr,
    keys_ptr,
    idx_ptr,
    count_ptr,
    gmax_ptr,
    length,
    lo,
    SEGMENTS: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNKS: tl.constexpr,
    CAP: tl.constexpr,
    COLLECT: tl.constexpr,
    GROUP_MAX: tl.constexpr,
):
    pid = tl.program_id(0)
    row = pid // SEGMENTS
    seg = pid % SEGMENTS
    SEGMENT: tl.constexpr = BLOCK * CHUNKS
    off = row.to(tl.int64) * length + seg * SEGMENT
    _collect_segment(
        scores_ptr,
        off,
        1,
        SEGMENT,
        seg * SEGMENT,
        lo.to(tl.uint32, bitcast=True),
        idx_ptr,
        row * CAP,
        count_ptr + row,
        gmax_ptr,
        pid * BLOCK,
        COLLECT,
        GROUP_MAX,
        1,  # ROWS: 1-D chunks; since 2026-12-05 column masks (topk_lanes.py has the old append)
        BLOCK,
        CAP,
    )


@triton.jit
def _collect_private_kernel(
    scores_ptr,
    keys_ptr,
    idx_ptr,
    count_ptr,
    length,
    lo,
    SEGMENTS: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNKS: tl.constexpr,
    SEG_CAP: tl.constexpr,
):
    """Append into this segment's own slice: a running count instead of an atomic per chunk."""
    pid = tl.program_id(0)
    row = pid // SEGMENTS
    seg = pid % SEGMENTS
    SEGMENT: tl.constexpr = BLOCK * CHUNKS
    off = row.to(tl.int64) * length + seg * SEGMENT
    offs0 = tl.arange(0, BLOCK)
    base = pid * SEG_CAP
    count = 0
    x_next = tl.load(scores_ptr + off + offs0)
    for c in range(CHUNKS):
        x = x_next
        if c + 1 < CHUNKS:
            x_next = tl.load(scores_ptr + off + (c + 1) * BLOCK + offs0)
        key = _ordered_key(x, offs0 < BLOCK)
        cand = key >= lo.to(tl.uint32, bitcast=True)
        pos = count + tl.cumsum(cand.to(tl.int32), 0) - 1
        ok = cand & (pos < SEG_CAP)
        tl.store(keys_ptr + base + pos, key.to(tl.int32, bitcast=True), mask=ok)
        tl.store(idx_ptr + base + pos, seg * SEGMENT + c * BLOCK + offs0, mask=ok)
        count += tl.sum(cand.to(tl.int32), 0)
    tl.store(count_ptr + pid, count)


@triton.jit
def _collect_atomic_kernel(
    scores_ptr,
    keys_ptr,
    idx_ptr,
    count_ptr,
    length,
    lo,
    SEGMENTS: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNKS: tl.constexpr,
    CAP: tl.constexpr,
    GROUPED: tl.constexpr,
):
    """Append with one atomic per candidate (no scan); GROUPED: per group of 4 consecutive
    scores, the scan over the groups' counts only (in-thread prefix within a group)."""
    pid = tl.program_id(0)
    row = pid // SEGMENTS
    seg = pid % SEGMENTS
    SEGMENT: tl.constexpr = BLOCK * CHUNKS
    off = row.to(tl.int64) * length + seg * SEGMENT
    offs0 = tl.arange(0, BLOCK)
    cnt_ptr = count_ptr + row
    for c in range(CHUNKS):
        x = tl.load(scores_ptr + off + c * BLOCK + offs0)
        key = _ordered_key(x, offs0 < BLOCK)
        cand = key >= lo.to(tl.uint32, bitcast=True)
        idx = seg * SEGMENT + c * BLOCK + offs0
        if GROUPED:
            G: tl.constexpr = 4
            c2 = tl.reshape(cand.to(tl.int32), (BLOCK // G, G))
            per = tl.sum(c2, 1)
            total = tl.sum(per, 0)
            if total > 0:
                base = tl.atomic_add(cnt_ptr, total, sem="relaxed")
                start = base + tl.cumsum(per, 0) - per
                inner = tl.cumsum(c2, 1) - c2
                pos = tl.reshape(start[:, None] + inner, (BLOCK,))
                ok = cand & (pos < CAP)
                tl.store(keys_ptr + row * CAP + pos, key.to(tl.int32, bitcast=True), mask=ok)
                tl.store(idx_ptr + row * CAP + pos, idx, mask=ok)
        else:
            pos = tl.atomic_add(cnt_ptr + offs0 * 0, 1, mask=cand, sem="relaxed")
            ok = cand & (pos < CAP)
            tl.store(keys_ptr + row * CAP + pos, key.to(tl.int32, bitcast=True), mask=ok)
            tl.store(idx_ptr + row * CAP + pos, idx, mask=ok)


def ordered_keys(x):
    bits = x.float().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    neg = bits >> 31 != 0
    return torch.where(neg, bits ^ 0xFFFFFFFF, bits | 0x80000000)  # int64 holding uint32


def bench(fn):
    return triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--parts", default="edge,select,collect")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    dev = torch.device("cuda")
    emit = row_writer(args.out, {"device": torch.cuda.get_device_name()})

    # edge
    rows = 256
    for size, rank in () if "edge" not in parts else ((2048, 96), (4096, 2048), (8192, 192)):
        x = torch.randn(rows, size, device=dev)
        keys64 = ordered_keys(x)
        want = keys64.sort(1, descending=True).values[:, rank - 1]
        keys = (keys64 - (keys64 >= 2**31).long() * 2**32).to(torch.int32)
        out = torch.empty(rows, dtype=torch.int32, device=dev)
        for method, name in ((0, "radix"), (1, "bisect"), (2, "16way")):
            for bits in (4, 5, 6, 8) if method == 0 else (0,):
                for warps in (4, 8, 16):

                    def fn(m=method, b=max(bits, 4), w=warps):
                        _edge_kernel[(rows,)](
                            keys, out, rank, SIZE=size, RADIX_BITS=b, METHOD=m, num_warps=w
                        )

                    try:
                        fn()
                        got = out.to(torch.int64) & 0xFFFFFFFF
                        ok = bool(torch.equal(got, want)) if method else bool((got <= want).all())
                        us = bench(fn)
                    except Exception as e:  # noqa: BLE001
                        emit({"part": "edge", "size": size, "method": name, "error": repr(e)[:160]})
                        continue
                    emit(
                        {
                            "part": "edge",
                            "size": size,
                            "rank": rank,
                            "method": name,
                            "bits": bits,
                            "warps": warps,
                            "ok": ok,
                            "us": round(us, 2),
                        }
                    )

    # select: m candidates of k, CAP 4096
    for m, k in () if "select" not in parts else ((3072, 2048), (768, 512)):
        cap, area = 4096, 4096 + 2048
        x = torch.randn(rows, m, device=dev)
        keys = torch.zeros(rows, area, dtype=torch.int32, device=dev)
        # the candidates are the m scores of each row of x, by index (as _collect_segment stores)
        idx = torch.zeros(rows, area, dtype=torch.int32, device=dev)
        idx[:, :m] = torch.arange(m, device=dev, dtype=torch.int32)
        want = x.topk(k, dim=1).indices.sort(1).values
        for bits in (4, 5, 6, 8):
            for warps in (4, 8, 16):

                def fn(b=bits, w=warps, kk=keys.clone(), ii=idx.clone()):
                    _select_kernel[(rows,)](
                        x, kk, ii, m, k, 17, AREA=area, CAP=cap, RADIX_BITS=b, num_warps=w
                    )
                    return ii

                try:
                    ii = fn()
                    ok = bool(torch.equal(ii[:, cap : cap + k].long().sort(1).values, want))
                    us = bench(fn)
                except Exception as e:  # noqa: BLE001
                    emit({"part": "select", "m": m, "error": repr(e)[:160]})
                    continue
                emit(
                    {
                        "part": "select",
                        "m": m,
                        "k": k,
                        "bits": bits,
                        "warps": warps,
                        "ok": ok,
                        "us": round(us, 2),
                    }
                )

    # collect over 256 x 128K
    length = 131072
    x = torch.randn(rows, length, device=dev)
    lo = 0xC0000000 - 2**32  # key of 2.0 as int32: ~2.3 % of randn scores reach it
    expect = (x >= 2.0).sum(1)
    for block, chunks, warps in (
        (4096, 8, 16),
        (4096, 8, 4),
        (8192, 4, 8),
        (2048, 16, 4),
        (8192, 16, 8),
        (4096, 32, 4),
    ):
        segments = length // (block * chunks)
        cap = 8192
        keys = torch.empty(rows * cap, dtype=torch.int32, device=dev)
        idx = torch.empty(rows * cap, dtype=torch.int32, device=dev)
        count = torch.zeros(rows, dtype=torch.int32, device=dev)
        gmax = torch.empty(rows * segments * block, dtype=torch.int32, device=dev)
        for collect, gm, name in (
            (False, False, "stream"),
            (False, True, "gmax"),
            (True, True, "append+gmax"),
            (True, False, "append"),
        ):

            def fn(c=collect, g=gm):
                count.zero_()
                _collect_kernel[(rows * segments,)](
                    x,
                    keys,
                    idx,
                    count,
                    gmax,
                    length,
                    lo,
                    SEGMENTS=segments,
                    BLOCK=block,
                    CHUNKS=chunks,
                    CAP=cap,
                    COLLECT=c,
                    GROUP_MAX=g,
                    num_warps=warps,
                )

            fn()
            ok = bool(torch.equal(count.long(), expect)) if collect else True
            us = bench(fn)
            emit(
                {
                    "part": "collect",
                    "block": block,
                    "chunks": chunks,
                    "warps": warps,
                    "variant": name,
                    "ok": ok,
                    "us": round(us, 2),
                }
            )
        for grouped in (0, 1):

            def fna(gr=grouped):
                count.zero_()
                _collect_atomic_kernel[(rows * segments,)](
                    x,
                    keys,
                    idx,
                    count,
                    length,
                    lo,
                    SEGMENTS=segments,
                    BLOCK=block,
                    CHUNKS=chunks,
                    CAP=cap,
                    GROUPED=gr,
                    num_warps=warps,
                )

            try:
                fna()
                ok = bool(torch.equal(count.long(), expect))
                us = round(bench(fna), 2)
            except Exception as e:  # noqa: BLE001
                ok, us = repr(e)[:160], None
            emit(
                {
                    "part": "collect",
                    "block": block,
                    "chunks": chunks,
                    "warps": warps,
                    "variant": "grouped" if grouped else "atomic_each",
                    "ok": ok,
                    "us": us,
                }
            )
        seg_cap = 2048
        pcount = torch.zeros(rows * segments, dtype=torch.int32, device=dev)
        pkeys = torch.empty(rows * segments * seg_cap, dtype=torch.int32, device=dev)
        pidx = torch.empty_like(pkeys)

        def fnp():
            _collect_private_kernel[(rows * segments,)](
                x,
                pkeys,
                pidx,
                pcount,
                length,
                lo,
                SEGMENTS=segments,
                BLOCK=block,
                CHUNKS=chunks,
                SEG_CAP=seg_cap,
                num_warps=warps,
            )

        fnp()
        ok = bool(torch.equal(pcount.view(rows, segments).sum(1).long(), expect))
        emit(
            {
                "part": "collect",
                "block": block,
                "chunks": chunks,
                "warps": warps,
                "variant": "private",
                "ok": ok,
                "us": round(bench(fnp), 2),
            }
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
