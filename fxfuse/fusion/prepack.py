"""The weight-prepack pass: MXFP4 GEMM weights stored in gfx950's preshuffled layouts (SPEC §2).

Runs after the fusions, on a GraphModule whose weights are its own constants (`apply_fusions`:
torch.export makes them get_attr nodes). Each MXFP4 GEMM op's (w, w_scale), when both are
module constants in the plain layouts, is replaced by a preshuffled copy registered on the
module (`preshuffle_weight_fp4`, `preshuffle_scale_e8m0`); the ops tell the layouts apart by
shape, so no op changes. A plain weight no longer read is deleted from the module. Weights
that are graph inputs (Inductor's post-grad graph) or whose shape the layout cannot take
(N % 16, K/2 % 32) stay as they were; the report lists both, with the reason.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from fxfuse.fusion.report import FusionReport
from fxfuse.kernels.gemm_ref import preshuffle_scale_e8m0, preshuffle_weight_fp4

fxfuse = torch.ops.fxfuse
# The ops whose (w, w_scale) can be MXFP4 weights (uint8; FP8 weights are float8 dtypes).
WEIGHT_OPS = (
    fxfuse.gemm_mxfp4.default,
    fxfuse.quant_gemm.default,
    fxfuse.rms_norm_quant_gemm.default,
    fxfuse.add_rms_norm_quant_gemm.default,
    fxfuse.allreduce_rms_norm_quant_gemm.default,
    fxfuse.rms_norm_quant_gemm_with_norm.default,
    fxfuse.add_rms_norm_quant_gemm_with_norm.default,
    fxfuse.allreduce_rms_norm_quant_gemm_with_norm.default,
    fxfuse.gemm_mxfp4_split_cat.default,
    fxfuse.gemm_mxfp4_split.default,
)
PREFIX = "_fxfuse_prepacked_"


def _arg_index(op, name: str) -> int:
    return [a.name for a in op._schema.arguments].index(name)


def _constant(gm: fx.GraphModule | None, node) -> torch.Tensor | None:
    """The tensor a get_attr node of `gm` reads, else None."""
    if gm is None or not isinstance(node, fx.Node) or node.op != "get_attr":
        return None
    value = gm
    for part in node.target.split("."):
        value = getattr(value, part, None)
    return value if isinstance(value, torch.Tensor) else None


def _is_mxfp4(node) -> bool:
    """Whether a weight argument is MXFP4 bytes (uint8), by its value or fake value."""
    value = node.meta.get("val") if isinstance(node, fx.Node) else node
    return isinstance(value, torch.Tensor) and value.dtype == torch.uint8


def _why_not(w, w_scale) -> str:
    """'' where the plain (w, w_scale) can be preshuffled, else the reason."""
    if w is None or w_scale is None:
        return "w / w_scale are graph inputs (torch.compile's graphs), not module constants"
    if w.dim() != 2 or w_scale.dim() != 2:
        return "w / w_scale are not 2-D"
    n, kb = w.shape
    if tuple(w_scale.shape) != (n, 2 * kb // 32):
        return f"w_scale {tuple(w_scale.shape)} is not the plain (N, K/32) of w {tuple(w.shape)}"
    if n % 16 or kb % 32:
        return f"the layout needs N % 16 == 0 and K/2 % 32 == 0, w is {tuple(w.shape)}"
    return ""


def _free_name(gm: fx.GraphModule, stem: str) -> str:
    """`stem`, or stem_1, stem_2, ...: the first that names neither attribute it will take."""
    name, i = stem, 0
    while hasattr(gm, name) or hasattr(gm, name + "_scale"):
        i += 1
        name = f"{stem}_{i}"
    return name


def _register(gm: fx.GraphModule, graph: fx.Graph, anchor: fx.Node, name: str, tensor):
    """A get_attr node for a new module constant `name`, inserted before `anchor`."""
    gm.register_buffer(name, tensor)
    with graph.inserting_before(anchor):
        node = graph.get_attr(name)
    fake = anchor.args[0].meta.get("val") if anchor.args else None
    mode = getattr(fake, "fake_mode", None)
    node.meta["val"] = mode.from_tensor(tensor) if mode is not None else tensor
    return node


def prepack_weights(module: fx.GraphModule | fx.Graph, report: FusionReport) -> None:
    """Store every MXFP4 GEMM's constant weights in the preshuffled layouts (see the module
    docstring); the graph lints after. A bare Graph (Inductor's post-grad graph) has no module
    constants: its MXFP4 GEMMs are only reported."""
    gm = module if isinstance(module, fx.GraphModule) else None
    graph = module.graph if gm is not None else module
    done: dict[tuple[str, str], tuple[fx.Node, fx.Node]] = {}
    replaced: list[fx.Node] = []
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in WEIGHT_OPS:
            continue
        iw, iws = _arg_index(node.target, "w"), _arg_index(node.target, "w_scale")
        args = list(node.args)
        if len(args) <= iws:
            if _is_mxfp4(node.kwargs.get("w")):
                report.prepack_skipped.append((node.name, "w / w_scale passed by keyword"))
            continue
        if not _is_mxfp4(args[iw]):  # FP8 weights: not this pass's
            continue
        w, w_scale = _constant(gm, args[iw]), _constant(gm, args[iws])
        reason = _why_not(w, w_scale)
        if reason:
            report.prepack_skipped.append((node.name, reason))
            continue
        key = (args[iw].target, args[iws].target)
        if key not in done:
            stem = _free_name(gm, PREFIX + args[iw].target.replace(".", "_"))
            done[key] = (
                _register(gm, graph, node, stem, preshuffle_weight_fp4(w)),
                _register(gm, graph, node, stem + "_scale", preshuffle_scale_e8m0(w_scale)),
            )
        replaced.extend((args[iw], args[iws]))
        args[iw], args[iws] = done[key]
        node.args = tuple(args)
        report.prepacked.append((node.name, args[iw].target))
    for old in dict.fromkeys(replaced):
        if not old.users:
            target = old.target
            graph.erase_node(old)
            if not any(n.op == "get_attr" and n.target == target for n in graph.nodes):
                _delete(gm, target)
    graph.lint()


def _delete(gm: fx.GraphModule, target: str) -> None:
    """Drop a module constant no node reads any more."""
    *path, name = target.split(".")
    owner = gm
    for part in path:
        owner = getattr(owner, part)
    if name in getattr(owner, "_buffers", {}):
        del owner._buffers[name]
    elif name in getattr(owner, "_parameters", {}):
        del owner._parameters[name]
    elif hasattr(owner, name):
        delattr(owner, name)
