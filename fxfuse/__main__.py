"""`python -m fxfuse demo` / `fxfuse demo`: a bundled model (by default the DeepSeek-V3.2-style
layers, `--model deepseek_block` for the simpler block), fused, with its report, a numerics check
against the unfused model and, on a GPU, timings.

`python -m fxfuse explain [MODEL]`: the report as a table and, per rewrite, the subgraph before and
after as SVG (torch.fx's FxGraphDrawer, when pydot and Graphviz are installed) or as Graphviz .dot
text. MODEL is a bundled model (`deepseek_block`, the default, or `deepseek_v32`) or
`pkg.module:factory`, a callable returning `(model, example_inputs)`.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import re
import shutil
import sys
import time
from pathlib import Path

import torch
from torch import fx

import fxfuse
from fxfuse.models import deepseek_block, deepseek_v32
from fxfuse.models.quant_linear import QUANT_KINDS


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _time_us(fn, reps: int = 50) -> tuple[float, str]:
    """Median microseconds in a CUDA graph (what serving engines run), else do_bench."""
    import triton.testing

    try:
        return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=reps), "CUDA graph"
    except Exception:  # noqa: BLE001 - a callable that cannot be captured is timed without one
        return 1e3 * triton.testing.do_bench(fn, rep=reps), "do_bench"


# name -> (description, default quant kind)
BUNDLED_MODELS = {
    "deepseek_v32": ("DeepSeek-V3.2-style layers (MLA, DSA indexer top-k)", "fp8_block"),
    "deepseek_block": ("DeepSeek-style block", "fp8_rowwise"),
}
DEFAULT_DEMO_MODEL = "deepseek_v32"


def bundled_model(name: str, args: argparse.Namespace, device="cpu"):
    """(model, example_inputs, config) of a bundled model sized by --hidden / --layers /
    --batch / --seq, with --quant or the model's default kind."""
    quant = args.quant or BUNDLED_MODELS[name][1]
    if name == "deepseek_v32":
        cfg = deepseek_v32.V32Config(hidden=args.hidden, layers=args.layers, quant=quant)
        module = deepseek_v32
    else:
        cfg = deepseek_block.BlockConfig(
            hidden=args.hidden, q_lora_rank=args.hidden // 2, kv_lora_rank=args.hidden // 2,
            intermediate=2 * args.hidden, layers=args.layers, quant=quant,
        )
        module = deepseek_block
    model = module.build(cfg, device=device)
    return model, module.example_inputs(cfg, batch=args.batch, seq=args.seq, device=device), cfg


def demo(args: argparse.Namespace) -> int:
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    model, inputs, cfg = bundled_model(args.model, args, device)
    print(f"fxfuse demo: {BUNDLED_MODELS[args.model][0]}, {cfg.layers} layers, hidden "
          f"{cfg.hidden}, {cfg.quant} linears, input {tuple(inputs[0].shape)} on {device}")
    with torch.no_grad():
        start = time.perf_counter()
        fused = fxfuse.apply_fusions(model, inputs)
        print(f"captured and fused in {time.perf_counter() - start:.2f} s")
        print(fused.fxfuse_report)
        reference = model(*inputs)
        out = fused(*inputs)
    err = _relative_error(out, reference)
    same = torch.equal(out, reference)
    ok = err <= 1e-2
    verdict = "bit-identical" if same else "within 1e-2" if ok else None
    if not ok and device == "cuda":
        # On a GPU the fused GEMMs accumulate in another order than cuBLAS; FP8 re-quantization
        # of the next layer amplifies those last-bit differences in a random-weight block. The
        # floor is what an independent, legitimate compile of the same model shows: Inductor's.
        with torch.no_grad():
            floor = _relative_error(torch.compile(model, backend="inductor")(*inputs), reference)
        ok = err <= floor
        verdict = f"{'within' if ok else 'above'} Inductor's own error vs eager, {floor:.2e}"
    print(f"numerics: fused vs unfused relative error {err:.2e} ({verdict or 'FAILED'})")
    if device == "cuda":
        with torch.no_grad():
            eager_us, how_eager = _time_us(lambda: model(*inputs))
            fused_us, how_fused = _time_us(lambda: fused(*inputs))
        print(f"timing (median): unfused eager {eager_us:.1f} us ({how_eager}), "
              f"fused {fused_us:.1f} us ({how_fused})")
    if fused.fxfuse_report.total == 0:
        print("no rewrite was made", file=sys.stderr)
        return 1
    return 0 if ok else 1


# --- explain ------------------------------------------------------------------------------------

BUNDLED_MODEL = "deepseek_block"  # explain's default


def load_model(spec: str, args: argparse.Namespace) -> tuple[torch.nn.Module, tuple]:
    """(model, example_inputs) for MODEL: a bundled model, or `pkg.module:factory()`."""
    if spec in BUNDLED_MODELS:
        model, inputs, _ = bundled_model(spec, args)
        return model, inputs
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr.isidentifier():
        others = ", ".join(repr(name) for name in BUNDLED_MODELS if name != BUNDLED_MODEL)
        raise ValueError(
            f"MODEL: expected {BUNDLED_MODEL!r} or a dotted path 'pkg.module:factory' (also "
            f"bundled: {others}), got {spec!r}"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"MODEL: cannot import module {module_name!r} ({err})") from err
    factory = getattr(module, attr, None)
    if not callable(factory):
        # ValueError like every bad argument (the CLI reports it as a usage error on MODEL).
        raise ValueError(f"MODEL: {module_name!r} has no callable {attr!r}")  # noqa: TRY004
    result = factory(quant=args.quant) if args.quant else factory()
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        got = type(result).__name__
        raise ValueError(f"MODEL: {spec} must return (model, example_inputs), got {got}")
    model, inputs = result
    if not isinstance(model, torch.nn.Module):
        got = type(model).__name__
        raise ValueError(f"MODEL: {spec} returned a {got}, not an nn.Module")  # noqa: TRY004
    return model, (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)


def _closure(names, step: dict[str, tuple[str, ...]], keep: set[str]) -> set[str]:
    """The names in `keep` reached from `names` by following `step` through the others."""
    found, seen, pending = set(), set(), list(names)
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in keep:
            found.add(name)
        pending.extend(step.get(name, ()))
    return found


def subgraph(gm: fx.GraphModule, names: set[str]) -> fx.GraphModule:
    """The nodes of `gm` named in `names`, their outside inputs as placeholders, the values used
    outside (or not at all) as outputs."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    outputs = []
    for node in gm.graph.nodes:
        if node.name not in names or node.op in ("placeholder", "output"):
            continue
        for arg in node.all_input_nodes:
            if arg not in env:
                env[arg] = graph.placeholder(arg.name)
                env[arg].meta = dict(arg.meta)
        env[node] = graph.node_copy(node, lambda n: env[n])
        if not node.users or any(u.name not in names for u in node.users):
            outputs.append(env[node])
    graph.output(outputs[0] if len(outputs) == 1 else tuple(outputs))  # () when empty
    return fx.GraphModule(gm, graph)


def _label(node: fx.Node) -> str:
    what = node.op if node.op in ("placeholder", "output") else str(node.target)
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        what += f"\\n{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    return f"{node.name}\\n{what}".replace('"', "'")


def to_dot(gm: fx.GraphModule, title: str) -> str:
    """Graphviz text of a (small) graph: inputs dashed, ops boxed."""
    lines = [f'digraph "{title}" {{', "  rankdir=TB;", f'  label="{title}";',
             '  node [fontname="monospace", fontsize=10];']
    for node in gm.graph.nodes:
        shape = "box" if node.op == "call_function" else "ellipse"
        style = ', style="dashed"' if node.op == "placeholder" else ""
        lines.append(f'  "{node.name}" [label="{_label(node)}", shape={shape}{style}];')
        lines.extend(f'  "{arg.name}" -> "{node.name}";' for arg in node.all_input_nodes)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _can_render_svg() -> bool:
    try:
        import pydot  # noqa: F401
    except ImportError:
        return False
    return shutil.which("dot") is not None


def write_drawing(gm: fx.GraphModule, path: Path, svg: bool) -> Path:
    """`path`.svg through FxGraphDrawer when `svg`, else `path`.dot; returns the file written."""
    if svg:
        from torch.fx.passes.graph_drawer import FxGraphDrawer

        out = path.with_suffix(".svg")
        FxGraphDrawer(gm, path.stem).get_dot_graph().write_svg(str(out))
        return out
    out = path.with_suffix(".dot")
    out.write_text(to_dot(gm, path.stem))
    return out


def _table(rows: list[tuple], header: tuple) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt.format(*header), rule] + [fmt.format(*map(str, r)) for r in rows])


def explain(args: argparse.Namespace) -> int:
    model, inputs = load_model(args.model, args)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        gm = torch.export.export(model, inputs, strict=False).module()
        before = copy.deepcopy(gm)
        fused = fxfuse.apply_fusions(gm, inputs)
    report = fused.fxfuse_report
    svg = _can_render_svg()
    before_names = {n.name for n in before.graph.nodes}
    after_names = {n.name for n in fused.graph.nodes}
    # Backwards: a node a rewrite made -> what its match covered; forwards: a covered node -> what
    # replaced it, so a rewrite's nodes that a later fusion consumed are drawn as that fusion.
    replaced_by: dict[str, tuple[str, ...]] = {}
    for made, covered in report.sources.items():
        for name in covered:
            replaced_by[name] = replaced_by.get(name, ()) + (made,)
    rows = []
    for i, rewrite in enumerate(report.rewrites):
        stem = f"{i:02d}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', rewrite.pattern).strip('_')}"
        spelled = _closure(rewrite.replaced, report.sources, before_names)
        made = _closure(rewrite.created, replaced_by, after_names)
        files = [
            write_drawing(subgraph(before, spelled), out_dir / f"{stem}_before", svg).name,
            write_drawing(subgraph(fused, made), out_dir / f"{stem}_after", svg).name,
        ]
        rows.append((i, rewrite.pattern, rewrite.node, rewrite.replacement, len(spelled),
                     ", ".join(files)))
    print(f"fxfuse explain: {args.model}, target {report.target}: {report.total} rewrite(s), "
          f"{len(report.rejected)} near-miss(es)")
    header = ("#", "pattern", "root", "fused op", "nodes replaced", "files")
    print(_table(rows, header))
    if report.canonicalized:
        print("canonicalized spellings: "
              + ", ".join(f"{k} {v}" for k, v in report.canonicalized.items()))
    if report.rejected:
        print("near-misses:")
        print(_table(report.rejected, ("pattern", "node", "reason")))
    kind = "SVG" if svg else "Graphviz .dot (install pydot and Graphviz for SVG)"
    print(f"drawings ({kind}) in {out_dir}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fxfuse")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="fuse a bundled DeepSeek-style model and check it")
    p.add_argument("--model", choices=list(BUNDLED_MODELS), default=DEFAULT_DEMO_MODEL)
    p.add_argument("--quant", choices=QUANT_KINDS, default=None,
                   help="linear kind (default: fp8_block for deepseek_v32, fp8_rowwise for "
                        "deepseek_block)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--cpu", action="store_true", help="stay on the CPU even with a GPU present")
    p = sub.add_parser("explain", help="the report as a table, each rewrite drawn before/after")
    p.add_argument("model", nargs="?", default=BUNDLED_MODEL, metavar="MODEL",
                   help=f"{BUNDLED_MODEL!r} (default), 'deepseek_v32' or 'pkg.module:factory' "
                        "returning (model, example_inputs)")
    p.add_argument("--quant", choices=QUANT_KINDS, default=None,
                   help="linear kind (bundled models; passed as quant= to a factory)")
    p.add_argument("--out", default="fxfuse_explain", help="folder for the drawings")
    p.add_argument("--hidden", type=int, default=256, help="bundled models only")
    p.add_argument("--layers", type=int, default=1, help="bundled models only")
    p.add_argument("--batch", type=int, default=2, help="bundled models only")
    p.add_argument("--seq", type=int, default=16, help="bundled models only")
    args = parser.parse_args(argv)
    if args.hidden % 128:
        parser.error("--hidden: must be a multiple of 128 (1x128 block quant)")
    if args.command == "explain":
        try:
            return explain(args)
        except ValueError as err:
            if not str(err).startswith("MODEL:"):
                raise
            parser.error(str(err))
    return demo(args)


if __name__ == "__main__":
    raise SystemExit(main())
