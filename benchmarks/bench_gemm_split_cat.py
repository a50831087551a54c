"""Fused GEMM → split → cat against the unfused chain (eager and Inductor) and the GEMM alone.

    PYTHONPATH=. python benchmarks/bench_gemm_split_cat.py --out $OUT            # H200: table + JSON
    PYTHONPATH=. python benchmarks/bench_gemm_split_cat.py --out $OUT --sweep    # + sm90 launch table
    PYTHONPATH=. python benchmarks/bench_gemm_split_cat.py --cpu-smoke           # interpreter, tiny

Every case is checked first under each backend (≤ 1e-2 relative to a float64 GEMM, the y slice
bit-exact). "fxfuse" is the op a rewritten graph calls (`torch.ops.fxfuse.gemm_split_cat`, whose
backend table picks the Triton kernel or the vendor bmm path); "triton" and "vendor" are the same
op with FXFUSE_GEMM_BACKEND forcing one. The peers compute what the model spells: c2 stays a view
of the GEMM output, so the chain moves no byte more than the GEMM plus the cat. Bar
(PERFORMANCE.md): ≤ 1.1× the GEMM alone and ≥ 1.25× Inductor's chain at M ≥ 8192. The kv_a rows
(GEMM → split, no cat: `fxfuse.gemm_split`) time each backend against the GEMM alone.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time

if __name__ == "__main__" and "--cpu-smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch
import torch.nn.functional as F
import triton
import triton.testing

from fxfuse.kernels.gemm_split_cat import gemm_split, gemm_split_cat
from fxfuse.runtime import dispatch, gemm_split_cat_ops

SUITE = "gemm_split_cat"
COPY_BYTES_PER_S = 4.25e12  # measured copy ceiling on the H200 (PERFORMANCE.md)
BF16_FLOPS_PER_S = 680e12  # measured bf16 matrix rate (PERFORMANCE.md)
L2_BYTES = 60 * 2**20
GRAPH_BELOW_US = 50.0  # time with a CUDA graph when one launch is shorter than this
# --graph-all: every row in a CUDA graph. On the H200 host the op's Python issue (~50-100 us) is as
# long as the M >= 8192 kernels, so do_bench rows there measure the host (fxfuse_do_bench_us keeps
# that figure); a graph measures the GPU's time for all three peers alike.
BAR_MIN_M = 8192

# DeepSeek-R1 MLA kv_b at TP8: K 512, N 4096 = 16 heads × (128 qk_nope + 128 v), rope 64.
KV_B = {"k": 512, "d": 16, "s1": 128, "s2": 128, "s3": 64}
KV_B_MS = (32, 128, 1024, 4096, 8192, 16384, 32768)
# Not DeepSeek: widths that are no multiple of a tile (column-scatter epilogue).
OTHER = {"k": 1024, "d": 8, "s1": 96, "s2": 160, "s3": 32}
OTHER_MS = (128, 512, 8192)
# Not DeepSeek, a real model: MiniCPM3-4B's MLA kv_b (TP1): K 256 (kv_lora_rank), 40 heads ×
# (64 qk_nope + 64 v), rope 32.
MINICPM3 = {"k": 256, "d": 40, "s1": 64, "s2": 64, "s3": 32}
MINICPM3_MS = (128, 1024, 8192, 16384, 32768)
# Real models with DeepSeek's head layout (K 512, 128 + 128, rope 64) at other head counts, so
# other N: LongCat-Flash (64 heads) at TP8 → 8 heads, N 2048; Kimi-Linear (32 heads) at TP1,
# N 8192.
LONGCAT_TP8 = {"k": 512, "d": 8, "s1": 128, "s2": 128, "s3": 64}
KIMI_LINEAR = {"k": 512, "d": 32, "s1": 128, "s2": 128, "s3": 64}
HEADS_MS = (128, 1024, 8192, 16384, 32768)
CASES = {"kv_b": KV_B, "other": OTHER, "minicpm3": MINICPM3, "longcat_tp8": LONGCAT_TP8,
         "kimi_linear": KIMI_LINEAR}
SWEEP_BUCKETS = (32, 128, 1024, 4096, 8192, 16384, 32768)


def chain(x, w, d: int, s1: int, s2: int, y):
    """The unfused spelling (DeepSeek / HF MLA): linear → view → split → cat."""
    c = F.linear(x, w).view(x.shape[0], d, s1 + s2)
    c1, c2 = torch.split(c, [s1, s2], dim=-1)
    return torch.cat([c1, y], dim=-1), c2


def make_inputs(m: int, shape: dict, device, dtype=torch.bfloat16) -> dict:
    k, d, s1, s2, s3 = (shape[key] for key in ("k", "d", "s1", "s2", "s3"))
    x = torch.randn(m, k, dtype=dtype, device=device)
    w = torch.randn(d * (s1 + s2), k, dtype=dtype, device=device) / math.sqrt(k)
    # k_pe is one rope vector per token, broadcast over the heads: an expand, stride 0 along D.
    y = torch.randn(m, 1, s3, dtype=dtype, device=device).expand(m, d, s3)
    return {"x": x, "w": w, "d": d, "s1": s1, "s2": s2, "y": y}


def input_sets(m: int, shape: dict, device) -> list[dict]:
    """Several input sets when one fits in L2, so that rotating among them defeats the cache."""
    n = shape["d"] * (shape["s1"] + shape["s2"])
    set_bytes = 2 * (m * shape["k"] + n * shape["k"] + m * shape["s3"])
    count = max(1, min(16, math.ceil(2 * L2_BYTES / set_bytes)))
    return [make_inputs(m, shape, device) for _ in range(count)]


def rotating(sets: list[dict], call):
    state = {"i": 0}

    def fn():
        inputs = sets[state["i"] % len(sets)]
        state["i"] += 1
        return call(inputs)

    return fn


def check(inputs: dict, config: dict | None = None) -> float:
    """Relative error of the fused outputs against float64; raises if out of tolerance."""
    x, w, d, s1, s2, y = (inputs[key] for key in ("x", "w", "d", "s1", "s2", "y"))
    out, c2 = gemm_split_cat(x, w, d, s1, s2, y, config=config)
    c = (x.double() @ w.double().T).view(x.shape[0], d, s1 + s2)
    errors = [
        ((out[..., :s1].double() - c[..., :s1]).norm() / c[..., :s1].norm()).item(),
        ((c2.double() - c[..., s1:]).norm() / c[..., s1:].norm()).item(),
    ]
    if max(errors) > 1e-2 or not torch.equal(out[..., s1:], y):
        raise AssertionError(f"gemm_split_cat wrong: rel errors {errors}, config {config}")
    return max(errors)


def check_gemm_split(device) -> None:
    """DeepSeek kv_a spelling (D = 1, sizes [512, 64]), scaled down on the CPU."""
    k, sizes = (64, [48, 16]) if device.type == "cpu" else (7168, [512, 64])
    x = torch.randn(33, k, dtype=torch.bfloat16, device=device)
    w = torch.randn(sum(sizes), k, dtype=torch.bfloat16, device=device) / math.sqrt(k)
    pieces = gemm_split(x, w, 1, sizes)
    refs = torch.split((x.double() @ w.double().T).view(33, 1, -1), sizes, dim=-1)
    for piece, ref in zip(pieces, refs):
        error = ((piece.double() - ref).norm() / ref.norm()).item()
        if error > 1e-2:
            raise AssertionError(f"gemm_split wrong: rel error {error}")


def time_us(fn, graph: bool) -> float:
    if graph:
        return triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3


def roofline_us(m: int, shape: dict, inputs: dict) -> float:
    k, d, s1, s2, s3 = (shape[key] for key in ("k", "d", "s1", "s2", "s3"))
    n = d * (s1 + s2)
    y_bytes = inputs["y"].untyped_storage().nbytes()
    moved = 2 * (m * k + n * k + m * d * (s1 + s3 + s2)) + y_bytes
    return max(moved / COPY_BYTES_PER_S, 2 * m * n * k / BF16_FLOPS_PER_S) * 1e6


def fused_call(config=None):
    def call(i):
        return gemm_split_cat(i["x"], i["w"], i["d"], i["s1"], i["s2"], i["y"], config=config)

    return call


def op_call(i):
    """The op a rewritten graph calls: the backend table (or FXFUSE_GEMM_BACKEND) picks."""
    return torch.ops.fxfuse.gemm_split_cat(i["x"], i["w"], i["d"], i["s1"], i["s2"], i["y"])


def with_backend(choice: str | None, fn):
    """fn run with FXFUSE_GEMM_BACKEND=choice (None: unset), the environment restored after."""
    saved = os.environ.pop(dispatch.GEMM_BACKEND_ENV, None)
    if choice:
        os.environ[dispatch.GEMM_BACKEND_ENV] = choice
    try:
        return fn()
    finally:
        os.environ.pop(dispatch.GEMM_BACKEND_ENV, None)
        if saved is not None:
            os.environ[dispatch.GEMM_BACKEND_ENV] = saved


def check_op(inputs: dict, choice: str | None) -> float:
    """check() of the op under one backend choice ("unfused": that backend called directly)."""
    x, w, d, s1, s2, y = (inputs[key] for key in ("x", "w", "d", "s1", "s2", "y"))
    if choice == "unfused":
        out, c2 = unfused_call(inputs)
    else:
        out, c2 = with_backend(choice, lambda: op_call(inputs))
    c = (x.double() @ w.double().T).view(x.shape[0], d, s1 + s2)
    errors = [
        ((out[..., :s1].double() - c[..., :s1]).norm() / c[..., :s1].norm()).item(),
        ((c2.double() - c[..., s1:]).norm() / c[..., s1:].norm()).item(),
    ]
    if max(errors) > 1e-2 or not torch.equal(out[..., s1:], y):
        raise AssertionError(f"gemm_split_cat op wrong under {choice}: rel errors {errors}")
    return max(errors)


def unfused_call(i):
    """The op's unfused backend (F.linear, then the cat kernel), whatever the table says."""
    return gemm_split_cat_ops._unfused_split_cat(i["x"], i["w"], i["d"], i["s1"], i["s2"], i["y"])


def chosen_backend(inputs: dict) -> str:
    """What the table runs: "vendor", "unfused", "triton-head-tiles" (the persistent TMA kernel),
    "triton"."""
    x, w, d, s1, s2, y = (inputs[key] for key in ("x", "w", "d", "s1", "s2", "y"))
    backend = with_backend(None, lambda: gemm_split_cat_ops._backend(x, w, d, (s1, s2), y))
    if backend == dispatch.BACKEND_VENDOR:
        return "vendor"
    if backend == dispatch.BACKEND_UNFUSED:
        return "unfused"
    from fxfuse.kernels import gemm_split_cat as kernels

    return "triton-head-tiles" if kernels.takes_head_tiles(x, w, d, (s1, s2), y) else "triton"


def bench_case(
    name: str, m: int, shape: dict, compiled_chain, device, graph_all: bool = False
) -> dict:
    sets = input_sets(m, shape, device)
    error = max(check_op(sets[0], choice) for choice in (None, "triton", "vendor", "unfused"))
    fused = rotating(sets, op_call)
    peers = {
        "eager": rotating(sets, lambda i: chain(i["x"], i["w"], i["d"], i["s1"], i["s2"], i["y"])),
        "inductor": rotating(
            sets, lambda i: compiled_chain(i["x"], i["w"], i["d"], i["s1"], i["s2"], i["y"])
        ),
        "gemm_alone": rotating(sets, lambda i: F.linear(i["x"], i["w"])),
    }
    peers["inductor"]()  # compile outside the timing
    # The GEMM alone decides graph or not: the fused op's own do_bench time includes its host
    # overhead, which is what a graph takes away.
    fused_host_us = time_us(fused, graph=False)
    graph = graph_all or time_us(peers["gemm_alone"], graph=False) < GRAPH_BELOW_US
    fused_us = time_us(fused, graph)
    peers_us = {peer: time_us(fn, graph) for peer, fn in peers.items()}
    repeat_us = time_us(fused, graph)  # the same thing twice: the spread is the noise floor
    backends_us = {
        choice: with_backend(choice, lambda: time_us(fused, graph)) for choice in ("triton", "vendor")
    }
    backends_us["unfused"] = time_us(rotating(sets, unfused_call), graph)
    n = shape["d"] * (shape["s1"] + shape["s2"])
    return {
        "case": name,
        "shape": {"m": m, "n": n, **shape},
        "fxfuse_us": round(fused_us, 2),
        "fxfuse_repeat_us": round(repeat_us, 2),
        "peers_us": {peer: round(us, 2) for peer, us in peers_us.items()},
        # the op with each implementation forced (FXFUSE_GEMM_BACKEND; "unfused" called directly);
        # fxfuse_us is the table's
        "backends_us": {choice: round(us, 2) for choice, us in backends_us.items()},
        "backend_chosen": chosen_backend(sets[0]),
        "roofline_us": round(roofline_us(m, shape, sets[0]), 2),
        "timing": "cudagraph" if graph else "do_bench",
        "fxfuse_do_bench_us": round(fused_host_us, 2),  # with the host's launch overhead
        "max_rel_error": error,
    }


# DeepSeek-R1 MLA kv_a: 7168 → 576 = 512 (kv latent) | 64 (rope), D = 1, both pieces copied.
KV_A = {"k": 7168, "sizes": [512, 64]}
KV_A_MS = (1, 32, 1024, 8192)


def bench_split_case(m: int, device) -> dict:
    k, sizes = KV_A["k"], KV_A["sizes"]
    x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
    w = torch.randn(sum(sizes), k, dtype=torch.bfloat16, device=device) / math.sqrt(k)
    ref = torch.split((x.double() @ w.double().T).view(m, 1, -1), sizes, dim=-1)
    times = {}
    for choice in ("triton", "vendor"):
        pieces = with_backend(choice, lambda: torch.ops.fxfuse.gemm_split(x, w, 1, sizes))
        for piece, want in zip(pieces, ref):
            error = ((piece.double() - want).norm() / want.norm()).item()
            if error > 1e-2:
                raise AssertionError(f"gemm_split wrong under {choice}: rel error {error}")
        call = lambda: torch.ops.fxfuse.gemm_split(x, w, 1, sizes)  # noqa: E731
        times[choice] = with_backend(choice, lambda: time_us(call, graph=True))
    times["gemm_alone"] = time_us(lambda: F.linear(x, w), graph=True)
    times["eager"] = time_us(
        lambda: [p.contiguous() for p in torch.split(F.linear(x, w), sizes, dim=-1)], graph=True
    )
    print(f"kv_a m={m:>6}  " + "  ".join(f"{key} {us:8.2f}" for key, us in times.items()))
    return {"case": "kv_a_split", "shape": {"m": m, "k": k, "sizes": sizes},
            "us": {key: round(us, 2) for key, us in times.items()}, "timing": "cudagraph"}  # fmt: skip


def print_header() -> None:
    print(
        f"{'case':<8} {'m':>6} {'fxfuse':>9} {'again':>9} {'eager':>9} {'inductor':>9} "
        f"{'gemm':>9} {'roof':>8} {'/gemm':>6} {'ind/fx':>6} {'%roof':>6}  timing    "
        f"{'host':>8} {'triton':>9} {'vendor':>9} {'unfused':>9}  bar"
    )


def print_rows(rows: list[dict]) -> None:
    for row in rows:
        m, fx, peers = row["shape"]["m"], row["fxfuse_us"], row["peers_us"]
        vs_gemm, vs_inductor = fx / peers["gemm_alone"], peers["inductor"] / fx
        bar = ""
        if m >= BAR_MIN_M:
            bar = "PASS" if vs_gemm <= 1.1 and vs_inductor >= 1.25 else "FAIL"
        print(
            f"{row['case']:<8} {m:>6} {fx:>9.2f} {row['fxfuse_repeat_us']:>9.2f} "
            f"{peers['eager']:>9.2f} {peers['inductor']:>9.2f} {peers['gemm_alone']:>9.2f} "
            f"{row['roofline_us']:>8.2f} {vs_gemm:>6.3f} {vs_inductor:>6.3f} "
            f"{100 * row['roofline_us'] / fx:>5.1f}%  {row['timing']:<10}"
            f"{row.get('fxfuse_do_bench_us', float('nan')):>8.2f} "
            f"{row.get('backends_us', {}).get('triton', float('nan')):>9.2f} "
            f"{row.get('backends_us', {}).get('vendor', float('nan')):>9.2f} "
            f"{row.get('backends_us', {}).get('unfused', float('nan')):>9.2f}  {bar}"
        )


def sweep_configs(m: int) -> list[dict]:
    """Candidate sm90 configs for one M bucket (shared memory ≤ 227 KB a block)."""
    configs = []
    if m <= 128:
        space = [(bm, bn, bk, sk, 4, 3) for bm in (16, 32, 64, 128) for bn in (32, 64, 128)
                 for bk in (128, 256) for sk in (1, 2, 4)]  # fmt: skip
    else:
        space = [(bm, bn, bk, 1, nw, st) for bm in (64, 128) for bn in (128, 256)
                 for bk in (64, 128) for nw in (4, 8) for st in (3, 4)]  # fmt: skip
    for bm, bn, bk, sk, nw, st in space:
        if bm >= m * 2 and bm > 16:
            continue  # a row block much taller than M only wastes MMA work
        if (bm * bk + bk * bn) * 2 * st > 227 * 1024:
            continue
        if bm * bn > 128 * 128 and nw == 4:
            continue  # accumulator does not fit in 4 warps' registers
        configs.append(
            {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "SPLIT_K": sk,
             "num_warps": nw, "num_stages": st}
        )  # fmt: skip
    return configs


def run_sweep(device, out_dir: str, buckets=SWEEP_BUCKETS, case: str = "kv_b") -> None:
    today = datetime.date.today().isoformat()
    shape = CASES[case]
    best = []
    for m in buckets:
        sets = input_sets(m, shape, device)
        results = []
        configs = sweep_configs(m)
        if m >= 128:  # the persistent kernel too (head tiles where BLOCK_N is one head)
            configs += [{**config, "PERSISTENT": 1} for config in configs]
        for config in configs:
            try:
                check(sets[0], config)
                results.append((time_us(rotating(sets, fused_call(config)), graph=True), config))
            except Exception as error:  # noqa: BLE001 (a config the compiler rejects is skipped)
                print(f"  m={m} {config}: {type(error).__name__}: {str(error)[:120]}")
        results.sort(key=lambda r: r[0])
        for us, config in results[:5]:
            print(f"sweep m={m:>6} {us:8.2f} us  {config}")
        best.append((m, results[0][1]))
    entries = []
    for i, (m, config) in enumerate(best):
        if entries and entries[-1]["config"] == config:
            entries[-1]["when"] = {"m_max": m}
        else:
            entries.append({"when": {"m_max": m}, "config": config})
    entries[-1]["when"] = {}
    sm90 = {
        "timed": True,
        "source": f"benchmarks/bench_gemm_split_cat.py --sweep, {torch.cuda.get_device_name()}, "
        f"{case} {shape}, {today}",
        "entries": entries,
    }
    print("sm90 table:\n" + json.dumps(sm90, indent=1))
    suffix = "" if case == "kv_b" else f"_{case}"
    with open(os.path.join(out_dir, f"{SUITE}_sweep_sm90{suffix}.json"), "w") as f:
        json.dump(sm90, f, indent=1)


def cpu_smoke(out_dir: str | None) -> None:
    device = torch.device("cpu")
    shape = {"k": 64, "d": 4, "s1": 48, "s2": 40, "s3": 24}
    rows = []
    for m in (1, 33):
        inputs = make_inputs(m, shape, device)
        error = check(inputs)
        check(inputs, {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "SPLIT_K": 2})
        start = time.perf_counter()
        fused_call()(inputs)
        fused_us = (time.perf_counter() - start) * 1e6
        start = time.perf_counter()
        chain(inputs["x"], inputs["w"], 4, 48, 40, inputs["y"])
        eager_us = (time.perf_counter() - start) * 1e6
        rows.append({"case": "smoke", "m": m, "fxfuse_us": fused_us, "eager_us": eager_us,
                     "max_rel_error": error})  # fmt: skip
    check_gemm_split(device)
    for row in rows:
        print(f"cpu-smoke m={row['m']:>3}: ok (rel error {row['max_rel_error']:.2e}); interpreter "
              f"{row['fxfuse_us']:.0f} us vs eager {row['eager_us']:.0f} us (not a timing)")  # fmt: skip
    if out_dir:
        with open(os.path.join(out_dir, f"{SUITE}_cpu_smoke.json"), "w") as f:
            json.dump({"note": "interpreter, not a timing", "rows": rows}, f, indent=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder for <suite>.json (default: none)")
    parser.add_argument("--sweep", action="store_true", help="also sweep sm90 launch configs")
    parser.add_argument("--sweep-only", action="store_true", help="only the sweep")
    parser.add_argument("--sweep-m", type=int, nargs="+", default=list(SWEEP_BUCKETS),
                        help="M buckets of the sweep")
    parser.add_argument("--sweep-case", default="kv_b", choices=sorted(CASES))
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny shapes in the interpreter")
    parser.add_argument("--graph-all", action="store_true", help="every row in a CUDA graph")
    parser.add_argument("--m", default=None, help="M values of every case, comma-separated")
    parser.add_argument(
        "--cases", default=",".join(CASES), help="shapes, comma-separated (default: all)"
    )
    args = parser.parse_args()
    chosen_ms = tuple(int(v) for v in args.m.split(",")) if args.m else None
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    if args.cpu_smoke:
        cpu_smoke(args.out)
        return
    if not torch.cuda.is_available():
        sys.exit("needs a GPU (or --cpu-smoke)")
    device = torch.device("cuda")
    torch.manual_seed(0)
    if not args.sweep_only:
        # One compiled chain per shape (static shapes, Inductor's best case); room for them all.
        for limit in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, limit):
                setattr(torch._dynamo.config, limit, 64)
        compiled_chain = torch.compile(chain, dynamic=False)
        check_gemm_split(device)
        rows = []
        print_header()
        ms = {"kv_b": KV_B_MS, "other": OTHER_MS, "minicpm3": MINICPM3_MS,
              "longcat_tp8": HEADS_MS, "kimi_linear": HEADS_MS}
        cases = [(name, m, CASES[name]) for name in args.cases.split(",")
                 for m in chosen_ms or ms[name]]  # fmt: skip
        for name, m, shape in cases:
            rows.append(bench_case(name, m, shape, compiled_chain, device, args.graph_all))
            print_rows(rows[-1:])
        print()
        print_header()
        print_rows(rows)
        split_rows = [bench_split_case(m, device) for m in KV_A_MS]
        result = {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "date": datetime.date.today().isoformat(),
            "command": "PYTHONPATH=. python " + " ".join(sys.argv),
            "rows": rows,
            "split_rows": split_rows,
        }
        if args.out:
            with open(os.path.join(args.out, f"{SUITE}.json"), "w") as f:
                json.dump(result, f, indent=1)
    if args.sweep or args.sweep_only:
        run_sweep(device, args.out or ".", tuple(args.sweep_m), args.sweep_case)


if __name__ == "__main__":
    main()
