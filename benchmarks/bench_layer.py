"""The bundled DeepSeek-style block on a GPU: fused vs unfused numerics, and timings of
unfused eager, apply_fusions, torch.compile(inductor) and torch.compile(fxfuse).

    PYTHONPATH=. python benchmarks/bench_layer.py --out $OUT
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os

import torch
import triton
import triton.testing

import fxfuse
from fxfuse.models import deepseek_block


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _bench(fn):
    fn()
    torch.cuda.synchronize()
    try:
        return 1e3 * triton.testing.do_bench_cudagraph(fn), "cudagraph"
    except Exception:  # noqa: BLE001 - some callables cannot be captured; say which timing it was
        return 1e3 * triton.testing.do_bench(fn), "do_bench"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=".")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    rows = []
    for quant in ("fp8_rowwise", "fp8_block", "mxfp4"):
        cfg = deepseek_block.BlockConfig(
            hidden=args.hidden, q_lora_rank=args.hidden // 2, kv_lora_rank=args.hidden // 4,
            heads=args.hidden // 128, head_dim=64, intermediate=2 * args.hidden,
            layers=args.layers, quant=quant,
        )
        model = deepseek_block.build(cfg, device="cuda")
        for batch, seq in ((1, 16), (4, 1024)):
            (x,) = deepseek_block.example_inputs(cfg, batch=batch, seq=seq, device="cuda")
            with torch.no_grad():
                fused = fxfuse.apply_fusions(model, (x,))
                want, got = model(x), fused(x)
                torch._dynamo.reset()
                inductor = torch.compile(model, backend="inductor")
                ind_out = inductor(x)
                torch._dynamo.reset()
                fxc = torch.compile(model, backend="fxfuse")
                fx_out = fxc(x)
                fx_report = fxfuse.last_report()
                t_eager, how = _bench(functools.partial(model, x))
                t_fused, _ = _bench(functools.partial(fused, x))
                t_ind, _ = _bench(functools.partial(inductor, x))
                t_fxc, _ = _bench(functools.partial(fxc, x))
            row = {
                "case": f"block_{quant}", "shape": {"m": batch * seq, "n": cfg.hidden},
                "fxfuse_us": t_fxc, "apply_fusions_us": t_fused,
                "peers_us": {"eager": t_eager, "inductor": t_ind},
                "rewrites_apply": dict(fused.fxfuse_report.counts),
                "rewrites_compile": dict(fx_report.counts),
                "rel_err_fused": _rel(got, want), "rel_err_compile": _rel(fx_out, want),
                "rel_err_inductor": _rel(ind_out, want), "timing": how,
            }
            rows.append(row)
            print(f"{quant:12s} M={batch*seq:5d} eager {t_eager:8.1f} applied {t_fused:8.1f} "
                  f"inductor {t_ind:8.1f} fxfuse-compile {t_fxc:8.1f} us  "
                  f"rewrites {sum(row['rewrites_apply'].values())}/{sum(row['rewrites_compile'].values())}  "
                  f"err {row['rel_err_fused']:.1e}/{row['rel_err_compile']:.1e}")
    result = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "triton": triton.__version__, "date": datetime.date.today().isoformat(),
        "command": "PYTHONPATH=. python benchmarks/bench_layer.py --out $OUT", "rows": rows,
    }
    with open(os.path.join(args.out, "layer.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
