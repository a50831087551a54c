"""Fused residual + RMSNorm + quant vs the unfused torch spelling, eager and under Inductor.

    PYTHONPATH=. python benchmarks/bench_rms_norm_quant.py --out $OUT            # table + JSON
    PYTHONPATH=. python benchmarks/bench_rms_norm_quant.py --out $OUT --sweep    # sm90 launch table
    TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/bench_rms_norm_quant.py --cpu-smoke

Cases: residual + RMSNorm + {FP8 per-token, FP8 1x128 group, MXFP4 (even)}, bf16, DeepSeek-R1
N in {1536, 7168}. Each (case, N) is checked for correctness before it is timed. Roofline: bytes
the fused kernel must move (x, residual, weight read; h, q, scales written) / 4.25 TB/s. Rows
whose kernel is under ~50 us are timed with do_bench_cudagraph over inputs rotated through enough
buffers to defeat the 60 MB L2; so are rows whose inputs are over 3x L2 (nothing to rotate; do_bench's
flush would charge the kernel for writing back its dirty lines); the rest with do_bench. Inductor
compiles once per (case, N) with M marked dynamic (one compile per shape would not fit the time
budget); M = 1 gets its own specialised compile.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

import torch
import triton

from fxfuse.kernels import formats
from fxfuse.kernels.rms_norm_quant import rms_norm_quant
from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref, quant_mxfp4_ref, rms_norm_ref
from fxfuse.runtime import launch_tables

SUITE = "rmsnorm_quant"
COPY_BYTES_PER_US = 4.25e12 / 1e6  # measured copy ceiling of the H200 (PERFORMANCE.md)
L2_BYTES = 60 * 2**20
GRAPH_BELOW_US = 50.0
EPS = 1e-6
FP8_MAX = 448.0
N_LIST = (1536, 7168)
M_LIST = (1, 4, 16, 32, 64, 128, 1024, 4096, 8192, 16384)
CASES = {
    "residual_rmsnorm_fp8_per_token": {"quant": "fp8", "group_size": 0},
    "residual_rmsnorm_fp8_group128": {"quant": "fp8", "group_size": 128},
    "residual_rmsnorm_mxfp4": {"quant": "mxfp4", "rounding": "even"},
}
SWEEP_M = (1, 16, 128, 1024, 4096, 16384)
SWEEP_WARPS = (2, 4, 8, 16)
SWEEP_ROWS = {1536: (1, 2, 4, 8), 7168: (1, 2)}


# ---------------------------------------------------------------------------------------------
# the unfused spelling, as model code writes it


def residual_rms_norm(x, residual, weight, eps=EPS):
    """Llama / DeepSeek RMSNorm with the residual add in front."""
    h = x + residual
    hidden = h.to(torch.float32)
    variance = hidden.pow(2).mean(-1, keepdim=True)
    hidden = hidden * torch.rsqrt(variance + eps)
    return weight * hidden.to(h.dtype), h


def quant_fp8_per_token(y):
    y32 = y.to(torch.float32)
    amax = y32.abs().amax(dim=-1, keepdim=True)
    scale = amax.clamp(min=1e-10) / FP8_MAX
    q = (y32 / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def quant_fp8_group(y, group_size=128):
    m, n = y.shape
    yg = y.to(torch.float32).view(m, n // group_size, group_size)
    amax = yg.abs().amax(dim=-1, keepdim=True)
    scale = amax.clamp(min=1e-10) / FP8_MAX
    q = (yg / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(m, n), scale.view(m, n // group_size)


def unfused(case: str):
    quant = {
        "residual_rmsnorm_fp8_per_token": quant_fp8_per_token,
        "residual_rmsnorm_fp8_group128": quant_fp8_group,
        "residual_rmsnorm_mxfp4": quant_mxfp4_ref,  # the bit-level torch spelling (formats.py)
    }[case]

    def residual_rms_norm_quant(x, residual, weight):
        y, h = residual_rms_norm(x, residual, weight)
        q, scale = quant(y)
        return q, scale, h

    return residual_rms_norm_quant


def fused(case: str, config=None):
    kwargs = CASES[case]

    def call(x, residual, weight):
        q, scale, h, _ = rms_norm_quant(x, weight, EPS, residual, config=config, **kwargs)
        return q, scale, h

    return call


# ---------------------------------------------------------------------------------------------
# sizes, inputs, timing


def quant_out_bytes(kw: dict, m: int, n: int) -> int:
    """Bytes of q and its scales for (m, n) rows quantized as `kw` ("quant", "group_size")."""
    if kw["quant"] == "mxfp4":
        return m * n // 2 + m * n // 32
    if kw["group_size"]:
        return m * n + 4 * m * (n // kw["group_size"])
    return m * n + 4 * m


def bytes_moved(case: str, m: int, n: int, elem: int = 2) -> int:
    out = quant_out_bytes(CASES[case], m, n)
    return 3 * m * n * elem + n * elem + out  # x, residual read; h written; weight; q + scales


def make_inputs(m, n, device, seed, copies=1):
    g = torch.Generator(device=device).manual_seed(seed)
    sets = []
    for _ in range(copies):
        x = torch.randn(m, n, device=device, generator=g).to(torch.bfloat16)
        r = torch.randn(m, n, device=device, generator=g).to(torch.bfloat16)
        sets.append((x, r))
    w = (1.0 + 0.1 * torch.randn(n, device=device, generator=g)).to(torch.bfloat16)
    return [(x, r, w) for x, r in sets]


class Rotating:
    """Calls fn on the next input set each time; keeps each set's outputs alive until its next
    turn so outputs rotate too (a graph pool would otherwise hand back the same, L2-hot, memory)."""

    def __init__(self, fn, input_sets):
        self.fn, self.input_sets = fn, input_sets
        self.outputs = [None] * len(input_sets)
        self.i = 0

    def __call__(self):
        i = self.i
        self.i = (i + 1) % len(self.input_sets)
        self.outputs[i] = None
        self.outputs[i] = self.fn(*self.input_sets[i])


def time_us(fn, graph: bool, rep_ms: int = 10) -> float:
    """Median microseconds per call (a graph of ~rep_ms of back-to-back calls, or do_bench)."""
    if graph:
        return triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median") * 1e3
    return triton.testing.do_bench(fn, warmup=10, rep=3 * rep_ms, return_mode="median") * 1e3


def use_graph(roofline_us: float, footprint: int) -> bool:
    """Time in a CUDA graph when one launch is short (launch overhead would hide it) or when the
    inputs cannot sit in L2 anyway (no rotation needed): do_bench's L2 flush leaves 256 MB of
    dirty lines that the timed kernel then writes back, ~10 us at M = 4096 (H200 probe, NOTES)."""
    return roofline_us / 0.9 < GRAPH_BELOW_US or footprint >= 3 * L2_BYTES


def copies_for(footprint: int, graph: bool) -> int:
    # Enough sets that one pass over them is ~3x L2; do_bench flushes L2 itself.
    if not graph or footprint >= 3 * L2_BYTES:
        return 1
    return min(64, math.ceil(3 * L2_BYTES / footprint))


# ---------------------------------------------------------------------------------------------
# correctness


def _bits(t):
    t = t.contiguous()
    if t.dtype in formats.FP8_DTYPES:
        return t.view(torch.uint8)
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    return t.view(ints[t.dtype]) if t.dtype in ints else t


def _ordered(t):
    i = _bits(t).to(torch.int64)
    sign_mask = 0x7FFFFFFF if t.dtype == torch.float32 else 0x7FFF
    return torch.where(i < 0, -(i & sign_mask), i)


def max_ulps(a, b) -> int:
    """The largest distance in ulps between two float tensors of one dtype (±0 coincide)."""
    return int((_ordered(a) - _ordered(b)).abs().max().item())


def _quant_on(y, kw):
    if kw["quant"] == "mxfp4":
        return quant_mxfp4_ref(y, kw["rounding"])
    return quant_fp8_ref(y, kw["group_size"])


def check_case(case: str, m: int, n: int, device) -> tuple[bool, str]:
    """Contract of SPEC §5 on one (case, m, n), plus agreement with the eager spelling."""
    kw = CASES[case]
    ((x, r, w),) = make_inputs(m, n, device, seed=1234 + m + n)
    q, scale, h, y = rms_norm_quant(x, w, EPS, r, write_norm=True, **kw)
    # The quant references run where the kernel ran: torch divides by a constant differently on
    # CUDA (a multiply by the fp32 reciprocal) than on the CPU, and the kernel follows its device.
    own_q, own_scale = (t.cpu() for t in _quant_on(y, kw))
    spelled_q, spelled_scale, _ = (t.cpu() for t in unfused(case)(x, r, w))
    cpu = [t.cpu() for t in (x, r, w, q, scale, h, y)]
    x, r, w, q, scale, h, y = cpu
    ref_y, ref_h = rms_norm_ref(x, w, EPS, r)
    problems = []
    if not torch.equal(_bits(h), _bits(ref_h)):
        problems.append("h differs from x + residual")
    ulps = (_ordered(y) - _ordered(ref_y)).abs()
    if ulps.max().item() > 1:
        problems.append(f"y off by {ulps.max().item()} ulp")
    if not torch.equal(_bits(q), _bits(own_q)) or not torch.equal(_bits(scale), _bits(own_scale)):
        problems.append("q/scale differ from the reference quant of the kernel's own y")
    q_rows = (_bits(q) == _bits(spelled_q)).all(-1) & (_bits(scale) == _bits(spelled_scale)).all(-1)
    y_rows = (ulps == 0).all(-1)
    rate = q_rows.float().mean().item()
    if rate < 0.99:
        problems.append(f"q equals the eager spelling on only {rate:.1%} of rows")
    detail = (
        f"y exact on {y_rows.float().mean().item():.1%} rows, q equals eager spelling on "
        f"{rate:.1%} rows"
    )
    return not problems, "; ".join(problems) or detail


# ---------------------------------------------------------------------------------------------
# main table


def run_table(args, device):
    rows, checks, failed = [], [], False
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    for case in CASES:
        for n in N_LIST:
            ok, detail = check_case(case, 257, n, device)
            ok1, detail1 = check_case(case, 1, n, device)
            ok, detail = ok and ok1, f"M=257: {detail}; M=1: {detail1}"
            checks.append({"case": case, "n": n, "ok": ok, "detail": detail})
            print(f"check {case} N={n}: {'ok' if ok else 'FAIL'} ({detail})", flush=True)
            failed |= not ok
            compiled = torch.compile(unfused(case))
            t0 = time.time()
            warm = make_inputs(4096, n, device, seed=7)[0]
            torch._dynamo.mark_dynamic(warm[0], 0)
            torch._dynamo.mark_dynamic(warm[1], 0)
            compiled(*warm)
            print(f"  inductor compile {time.time() - t0:.1f}s", flush=True)
            for m in args.m:
                rows.append(time_row(case, m, n, device, compiled))
                print_row(rows[-1])
    return rows, checks, failed


def time_row(case, m, n, device, compiled):
    moved = bytes_moved(case, m, n)
    roofline_us = moved / COPY_BYTES_PER_US
    footprint = moved + m * n * 2  # plus the spelled path's bf16 intermediate
    graph = use_graph(roofline_us, footprint)
    sets = make_inputs(m, n, device, seed=m * 31 + n, copies=copies_for(footprint, graph))
    if m > 1:
        for x, r, _ in sets:
            torch._dynamo.mark_dynamic(x, 0)
            torch._dynamo.mark_dynamic(r, 0)
    fns = {
        "fxfuse": Rotating(fused(case), sets),
        "eager": Rotating(unfused(case), sets),
        "inductor": Rotating(compiled, sets),
    }
    for fn in fns.values():  # compile / autotune outside the timed region
        for _ in range(len(sets)):
            fn()
    torch.cuda.synchronize()
    first = time_us(fns["fxfuse"], graph)
    peers = {name: time_us(fn, graph) for name, fn in fns.items() if name != "fxfuse"}
    again = time_us(fns["fxfuse"], graph)
    return {
        "case": case,
        "shape": {"m": m, "n": n},
        "fxfuse_us": round(min(first, again), 3),
        "fxfuse_spread_us": round(abs(first - again), 3),
        "peers_us": {k: round(v, 3) for k, v in peers.items()},
        "roofline_us": round(roofline_us, 3),
        "timing": "cudagraph" if graph else "do_bench",
    }


def print_row(row):
    fx, peers, roof = row["fxfuse_us"], row["peers_us"], row["roofline_us"]
    print(
        f"{row['case']:<32} N={row['shape']['n']:<5} M={row['shape']['m']:<6} "
        f"fxfuse {fx:8.2f} us (±{row['fxfuse_spread_us']:.2f})  eager {peers['eager']:8.2f}  "
        f"inductor {peers['inductor']:8.2f}  roofline {roof:7.2f}  "
        f"{roof / fx:6.1%} of roofline  {peers['inductor'] / fx:5.2f}x inductor  "
        f"[{row['timing']}]",
        flush=True,
    )


# ---------------------------------------------------------------------------------------------
# launch-config sweep


def run_sweep(args, device):
    """Time every config per (M, N) over the three cases; print the best as an sm90 table."""
    best = {}
    for n in N_LIST:
        # 2 warps at N = 7168 would hold 128+ fp32 values per tensor per thread: certain spills.
        warps = [w for w in SWEEP_WARPS if not (n > 4096 and w < 4)]
        configs = [
            {"BLOCK_N_MAX": 8192, "ROWS_PER_PROGRAM": r, "num_warps": w}
            for w in warps
            for r in SWEEP_ROWS.get(n, (1, 2))
        ]
        for m in args.sweep_m:
            totals = [0.0] * len(configs)
            for case in CASES:
                moved = bytes_moved(case, m, n)
                graph = use_graph(moved / COPY_BYTES_PER_US, moved)
                sets = make_inputs(m, n, device, seed=m + n, copies=copies_for(moved, graph))
                for i, cfg in enumerate(configs):
                    if totals[i] == math.inf:
                        continue
                    fn = Rotating(fused(case, cfg), sets)
                    try:
                        fn()
                        totals[i] += time_us(fn, graph)
                    # A config that cannot compile or launch simply loses.
                    except Exception as exc:  # noqa: BLE001
                        print(f"  {cfg} {case}: {type(exc).__name__}: {exc}", flush=True)
                        totals[i] = math.inf
                del sets
            results = list(zip(totals, configs))
            results.sort(key=lambda item: item[0])
            best[(m, n)] = results[0][1]
            line = ", ".join(
                f"{c['num_warps']}w/{c['ROWS_PER_PROGRAM']}r {t:.2f}" for t, c in results[:4]
            )
            print(
                f"sweep N={n} M={m}: best {results[0][1]}  (sum over cases, us: {line})", flush=True
            )
    return best


def sweep_table(best: dict, source: str) -> dict:
    """The sm90 target block of rms_norm_quant.json from the per-(M, N) winners."""
    entries = []
    for n_bound, n in zip((2048, 8192), N_LIST):
        ms = sorted(m for m, nn in best if nn == n)
        for i, m in enumerate(ms):
            cfg = best[(m, n)]
            # Bucket edge halfway (geometrically) to the next swept M; the last is open.
            when = {"n_max": n_bound}
            if i + 1 < len(ms):
                when["m_max"] = int(math.sqrt(m * ms[i + 1]))
            if entries and entries[-1]["config"] == cfg and entries[-1]["when"]["n_max"] == n_bound:
                entries[-1]["when"] = when  # merge equal neighbours
            else:
                entries.append({"when": when, "config": dict(cfg)})
    last = (
        dict(entries[-1]["config"])
        if entries
        else {"BLOCK_N_MAX": 8192, "ROWS_PER_PROGRAM": 1, "num_warps": 16}
    )
    entries.append({"when": {}, "config": last})
    return {"timed": True, "source": source, "entries": entries}


# ---------------------------------------------------------------------------------------------


def cpu_smoke():
    """Correctness half on tiny shapes in Triton's interpreter (no timing, nothing written)."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    device = torch.device("cpu")
    for case in CASES:
        for m, n in ((1, 256), (5, 256)):
            ok, detail = check_case(case, m, n, device)
            print(f"check {case} M={m} N={n}: {'ok' if ok else 'FAIL'} ({detail})")
            if not ok:
                return 1
        print(f"  roofline bytes at M=4096 N=7168: {bytes_moved(case, 4096, 7168) / 1e6:.1f} MB")
    fake = {
        (m, n): {"BLOCK_N_MAX": 8192, "ROWS_PER_PROGRAM": 1 + (m > 128), "num_warps": 4}
        for m in SWEEP_M
        for n in N_LIST
    }
    table = json.loads(json.dumps(launch_tables.load_table("rms_norm_quant")))
    table["targets"]["sm90"] = sweep_table(fake, "smoke")
    launch_tables._validate(table, "rms_norm_quant")  # what --sweep prints must load
    print(json.dumps(table["targets"]["sm90"])[:300], "...")
    print("cpu smoke ok")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results", help="folder for <suite>.json")
    parser.add_argument("--sweep", action="store_true", help="sweep launch configs instead")
    parser.add_argument("--cpu-smoke", action="store_true", help="correctness only, interpreter")
    parser.add_argument("--m", type=int, nargs="+", default=list(M_LIST))
    parser.add_argument("--sweep-m", type=int, nargs="+", default=list(SWEEP_M))
    args = parser.parse_args()
    if args.cpu_smoke:
        return cpu_smoke()
    if not torch.cuda.is_available():
        print("needs a GPU (or --cpu-smoke)")
        return 2
    device = torch.device("cuda")
    start = time.time()
    meta = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.date.today().isoformat(),
        "command": "python " + " ".join(sys.argv),
    }
    os.makedirs(args.out, exist_ok=True)
    if args.sweep:
        best = run_sweep(args, device)
        source = f"benchmarks/bench_rms_norm_quant.py --sweep, {meta['date']}, {meta['device']}"
        table = sweep_table(best, source)
        print(json.dumps({"sm90": table}, indent=2))
        with open(os.path.join(args.out, "rms_norm_quant_sweep.json"), "w") as f:
            json.dump({**meta, "sm90": table}, f, indent=2)
        print(f"sweep done in {time.time() - start:.0f}s")
        return 0
    rows, checks, failed = run_table(args, device)
    with open(os.path.join(args.out, f"{SUITE}.json"), "w") as f:
        json.dump({**meta, "checks": checks, "rows": rows}, f, indent=2)
    print(f"done in {time.time() - start:.0f}s; wrote {args.out}/{SUITE}.json")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
