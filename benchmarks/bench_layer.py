"""A bundled decoder layer under torch.compile(backend="inductor") vs backend="fxfuse": the same
inputs, the outputs compared (with each other and with eager), timed in one run.

    PYTHONPATH=. python benchmarks/bench_layer.py --out $OUT                    # H200: every row
    PYTHONPATH=. python benchmarks/bench_layer.py --quant fp8_block --m 1,64,8192 --out $OUT
    PYTHONPATH=. python benchmarks/bench_layer.py --model deepseek_block        # the older block
    PYTHONPATH=. python benchmarks/bench_layer.py --dry-run                     # CPU, tiny, no JSON

Shapes. deepseek_v32: one rank's shard of DeepSeek-V3.2 at TP8 (hidden 7168, 16 heads, dense MLP
2304, 64 index heads, top-2048), one layer, no all-reduce (one GPU). M ≤ 64 is a decode step:
M requests of one new token each, hidden (M, 1, hidden); the model has no KV cache, so each
query attends to itself (top-1 of 1 key) and the step is the linears' weight reads. M > 64 is a
prefill of one sequence, (1, M, hidden): causal MLA over the indexer's top-k of M keys.

Timing: decode rows in a CUDA graph (do_bench_cudagraph), prefill rows with do_bench; each
backend timed twice, interleaved. Roofline: the linears only (weight bytes ÷ 4.25 TB/s, or their
FLOPs ÷ the matrix rate when larger); attention and the indexer are left out, so it is a floor.
A row that fails prints its error and the run continues; failures are listed under "failed".
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback

import torch

import fxfuse
from fxfuse.models import deepseek_block, deepseek_v32
from fxfuse.models.quant_linear import QUANT_KINDS, QuantLinear

SUITE = "layer"
COPY_BYTES_PER_S = 4.25e12  # measured copy ceiling on the H200 (PERFORMANCE.md)
MATRIX_FLOPS_PER_S = {"fp8_rowwise": 1250e12, "fp8_block": 1250e12, "mxfp4": 680e12}  # no FP4 MMA
DECODE_MAX_M = 64
DEFAULT_MS = (1, 4, 16, 32, 64, 4096, 8192)
DRY_RUN_MS = (4, 128)
MODELS = ("deepseek_v32", "deepseek_block")


def model_config(name: str, quant: str, layers: int, dry_run: bool):
    if name == "deepseek_v32":
        if dry_run:
            return deepseek_v32.V32Config(quant=quant, layers=layers, hidden=128, heads=2,
                                          intermediate=256, index_topk=16)  # fmt: skip
        return deepseek_v32.V32Config.deepseek_v32_tp8(quant=quant, layers=layers)
    hidden = 512 if dry_run else 2048  # kv_lora_rank hidden / 4: a multiple of 128
    return deepseek_block.BlockConfig(
        hidden=hidden, q_lora_rank=hidden // 2, kv_lora_rank=hidden // 4, heads=hidden // 128,
        head_dim=64, intermediate=2 * hidden, layers=layers, quant=quant,
    )  # fmt: skip


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def time_us(fn, graph: bool) -> tuple[float, str]:
    """Median µs: a CUDA graph for decode (falls back to do_bench when capture fails)."""
    if not torch.cuda.is_available():  # --dry-run: wall clock, a smoke test of the plumbing
        fn()
        samples = []
        for _ in range(3):
            start = time.perf_counter()
            fn()
            samples.append(1e6 * (time.perf_counter() - start))
        return sorted(samples)[1], "cpu_perf_counter"
    import triton.testing

    fn()
    torch.cuda.synchronize()
    if graph:
        try:
            return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=50), "cudagraph"
        except Exception as err:  # noqa: BLE001 - say which timing the row used, and why
            print(f"    CUDA graph capture failed ({type(err).__name__}: {err}); do_bench")
    return 1e3 * triton.testing.do_bench(fn, warmup=10, rep=100), "do_bench"


def linear_costs(model: torch.nn.Module) -> tuple[int, int]:
    """(weight bytes, Σ N·K) over the model's linears (QuantLinear and dense kv_b)."""
    nbytes, nk = 0, 0
    for module in model.modules():
        if isinstance(module, QuantLinear):
            nbytes += module.weight.nbytes + module.weight_scale.nbytes
            nk += module.out_features * module.in_features
        elif isinstance(module, deepseek_v32.DequantizedLinear):
            nbytes += module.weight.nbytes
            nk += module.weight.numel()
    return nbytes, nk


def roofline_us(model, quant: str, m: int) -> float:
    nbytes, nk = linear_costs(model)
    return 1e6 * max(nbytes / COPY_BYTES_PER_S, 2 * m * nk / MATRIX_FLOPS_PER_S[quant])


def compiled(model, backend: str, x):
    torch._dynamo.reset()
    fn = torch.compile(model, backend=backend, dynamic=False)
    out = fn(x)
    return fn, out, (dict(fxfuse.last_report().counts) if backend == "fxfuse" else None)


def bench_row(name: str, model, cfg, quant: str, m: int, device) -> dict:
    decode = m <= DECODE_MAX_M
    batch, seq = (m, 1) if decode else (1, m)
    module = deepseek_v32 if name == "deepseek_v32" else deepseek_block
    (x,) = module.example_inputs(cfg, batch=batch, seq=seq, device=device, seed=m)
    with torch.no_grad():
        eager_out = model(x)
        ind_fn, ind_out, _ = compiled(model, "inductor", x)
        fx_fn, fx_out, rewrites = compiled(model, "fxfuse", x)
        times, how = {"fxfuse": [], "inductor": []}, {}
        for _ in range(2):  # the same thing twice, interleaved: the spread is the noise
            for backend, fn in (("fxfuse", fx_fn), ("inductor", ind_fn)):
                us, how[backend] = time_us(lambda fn=fn: fn(x), graph=decode)
                times[backend].append(us)
    fx_us, ind_us = times["fxfuse"][0], times["inductor"][0]
    return {
        "case": f"{name}_{quant}_{'decode' if decode else 'prefill'}",
        "shape": {"m": m, "batch": batch, "seq": seq, "n": cfg.hidden, "layers": cfg.layers},
        "fxfuse_us": round(fx_us, 3),
        "fxfuse_repeat_us": round(times["fxfuse"][1], 3),
        "peers_us": {"inductor": round(ind_us, 3)},
        "peers_repeat_us": {"inductor": round(times["inductor"][1], 3)},
        "speedup_vs_inductor": round(ind_us / fx_us, 4),
        "roofline_us": round(roofline_us(model, quant, m), 3),
        "timing": how["fxfuse"],
        "peers_timing": {"inductor": how["inductor"]},
        "rewrites": rewrites,
        "rel_err": {
            "fxfuse_vs_eager": rel_err(fx_out, eager_out),
            "inductor_vs_eager": rel_err(ind_out, eager_out),
            "fxfuse_vs_inductor": rel_err(fx_out, ind_out),
        },
    }


def _csv(kind, choices=None):
    def parse(text: str):
        values = [kind(v) for v in text.split(",") if v]
        if not values or (choices and any(v not in choices for v in values)):
            raise argparse.ArgumentTypeError(f"expected a comma list of {choices or kind.__name__}")
        return values

    return parse


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=_csv(str, MODELS), default=["deepseek_v32"],
                        help=f"comma list of {', '.join(MODELS)} (default deepseek_v32)")
    parser.add_argument("--quant", type=_csv(str, QUANT_KINDS), default=list(QUANT_KINDS),
                        help="comma list of linear kinds (default all)")
    parser.add_argument("--m", type=_csv(int), default=None,
                        help=f"comma list of token counts; ≤ {DECODE_MAX_M} decode, above it "
                             f"prefill (default {','.join(map(str, DEFAULT_MS))})")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--out", default=None, help=f"folder for {SUITE}.json (device runs)")
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny config on the CPU, wall-clock timing, no JSON written")
    args = parser.parse_args(argv)
    if any(m < 1 for m in args.m or ()):
        parser.error("--m: token counts must be positive")
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no GPU: run on the device, or pass --dry-run for a CPU smoke run")
    device = "cpu" if args.dry_run else "cuda"
    ms = args.m or (DRY_RUN_MS if args.dry_run else DEFAULT_MS)
    rows, failed = [], []

    def save() -> None:  # after every row: a run cut off by its time limit keeps what it timed
        if not args.out or args.dry_run:
            return
        import triton

        result = {
            "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton.__version__, "date": datetime.date.today().isoformat(),
            "command": "PYTHONPATH=. python benchmarks/bench_layer.py " + " ".join(sys.argv[1:]),
            "rows": rows, "failed": failed,
        }  # fmt: skip
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"{SUITE}.json"), "w") as f:
            json.dump(result, f, indent=1)

    for name in args.model:
        for quant in args.quant:
            try:
                cfg = model_config(name, quant, args.layers, args.dry_run)
                builder = deepseek_v32 if name == "deepseek_v32" else deepseek_block
                model = builder.build(cfg, device=device)
            except Exception as err:  # noqa: BLE001 - one failed model skips its rows only
                traceback.print_exc()
                failed.append({"case": f"{name}_{quant}", "m": None, "error": repr(err)})
                continue
            for m in ms:
                try:
                    row = bench_row(name, model, cfg, quant, m, device)
                except Exception as err:  # noqa: BLE001 - print it, go on with the next row
                    print(f"{name} {quant} M={m}: FAILED {type(err).__name__}: {err}",
                          file=sys.stderr)  # fmt: skip
                    traceback.print_exc()
                    failed.append({"case": f"{name}_{quant}", "m": m, "error": repr(err)})
                else:
                    rows.append(row)
                    err = row["rel_err"]
                    print(f"{row['case']:34s} M={m:5d}  fxfuse {row['fxfuse_us']:10.1f} "
                          f"(again {row['fxfuse_repeat_us']:.1f})  inductor "
                          f"{row['peers_us']['inductor']:10.1f} (again "
                          f"{row['peers_repeat_us']['inductor']:.1f}) us  "
                          f"x{row['speedup_vs_inductor']:.3f}  roofline {row['roofline_us']:.1f}  "
                          f"{row['timing']}  err fx/ind/fx-ind {err['fxfuse_vs_eager']:.1e}/"
                          f"{err['inductor_vs_eager']:.1e}/{err['fxfuse_vs_inductor']:.1e}  "
                          f"rewrites {sum((row['rewrites'] or {}).values())}")  # fmt: skip
                finally:
                    save()
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
            del model
    print(f"{len(rows)} row(s), {len(failed)} failed")
    save()
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
