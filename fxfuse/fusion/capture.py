"""`apply_fusions`: capture a model with torch.export (non-strict), rewrite, return a module."""

from __future__ import annotations

import operator
import warnings

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from fxfuse.fusion.config import FusionConfig
from fxfuse.fusion.passes import run_passes


def apply_fusions(
    model: torch.nn.Module,
    example_inputs,
    config: FusionConfig | None = None,
    dynamic_shapes=None,
) -> fx.GraphModule:
    """Returns a callable module equivalent to `model` with fused kernels; its `fxfuse_report`
    says what was rewritten and which near-misses were left (with reasons).

    An nn.Module is captured with `torch.export.export(..., strict=False)`; `dynamic_shapes` is
    passed through. A GraphModule is rewritten in place (its nodes get fake values from
    `example_inputs` first when they have none).
    """
    if config is not None and not isinstance(config, FusionConfig):
        raise ValueError(f"config: expected a FusionConfig or None, got {type(config).__name__}")
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)):
        raise ValueError(
            f"example_inputs: expected a tuple of inputs, got {type(example_inputs).__name__}"
        )
    example_inputs = tuple(example_inputs)
    if isinstance(model, fx.GraphModule) and _is_aten_graph(model):
        gm = model
        _ensure_fake_values(gm, example_inputs)
    elif isinstance(model, torch.nn.Module):
        _warn_aliased(example_inputs)
        exported = torch.export.export(
            model, example_inputs, dynamic_shapes=dynamic_shapes, strict=False
        )
        gm = exported.module()
    else:
        raise ValueError(f"model: expected an nn.Module or fx.GraphModule, got {type(model).__name__}")
    inline_no_grad_regions(gm)
    gm.fxfuse_report = run_passes(gm, config)
    _assert_input_dtypes(gm)
    _warn_no_backward(gm, example_inputs)
    return gm


def _warn_no_backward(gm: fx.GraphModule, example_inputs: tuple) -> None:
    """fxfuse's ops have no backward (the fused graph serves inference): where the capture ran
    with grad enabled over something that requires grad and a rewrite happened, say so now,
    rather than let a later backward leave the fused regions' gradients out (torch only warns
    then, and the gradients are silently missing)."""
    if not gm.fxfuse_report.rewrites or not torch.is_grad_enabled():
        return
    needs_grad = any(p.requires_grad for p in gm.parameters()) or any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs
    )
    if needs_grad:
        warnings.warn(
            f"apply_fusions: {len(gm.fxfuse_report.rewrites)} fused region(s) have no backward: "
            "gradients do not flow through them. The fused module is for inference; capture and "
            "run it under torch.no_grad() or torch.inference_mode(), or with parameters that do "
            "not require grad.",
            stacklevel=3,
        )


def _assert_input_dtypes(gm: fx.GraphModule) -> None:
    """Checks the inputs first: export's shape guards (`_guards_fn`, which a replacement placed
    after its last input may have come to follow), then each tensor input's dtype against the
    example's. export checks dtypes only where a cast reads an input (asserts the passes drop
    with the casts they guard), and the fused ops were chosen for these dtypes: fed others, a
    fused graph would refuse them deep inside or compute something else."""
    graph = gm.graph
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    tensors = [n for n in inputs if isinstance(n.meta.get("val"), torch.Tensor)]
    if not inputs:
        return
    anchor = inputs[-1]
    for node in graph.nodes:
        if node.op == "call_module" and node.target == "_guards_fn":
            anchor.append(node)  # it reads only inputs
            anchor = node
            break
    for node in reversed(tensors):
        with graph.inserting_after(anchor):
            graph.call_function(
                torch.ops.aten._assert_tensor_metadata.default, (node,),
                {"dtype": node.meta["val"].dtype},
            )  # fmt: skip
    graph.lint()
    gm.recompile()


def inline_no_grad_regions(gm: fx.GraphModule) -> int:
    """Inlines the `wrap_with_set_grad_enabled(False, body, ...)` calls of an exported graph and
    returns how many. torch.export wraps the code a model runs under `torch.no_grad()` (HF's
    DeepSeek-V3.2 indexer, say: its top-k) in such a call when the export itself runs with grad
    enabled, and the patterns would not see across it. Inlined, the region's values are the
    same; only autograd, which fused graphs do not serve, would record it. Regions that enable
    grad, and bodies holding attributes of their own, stay as they are."""
    hop = getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None)
    if hop is None:
        return 0
    graph, inlined = gm.graph, 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not hop:
            continue
        enabled, body_attr, *operands = node.args
        if enabled is not False or node.kwargs or body_attr.op != "get_attr":
            continue
        body = getattr(gm, body_attr.target)
        inline_no_grad_regions(body)  # nested regions first
        inputs = [n for n in body.graph.nodes if n.op == "placeholder"]
        if (
            len(inputs) != len(operands)
            or any(n.op in ("get_attr", "call_module") for n in body.graph.nodes)
            or any(u.target is not operator.getitem for u in node.users)
        ):
            continue
        with graph.inserting_before(node):
            outputs = graph.graph_copy(body.graph, dict(zip(inputs, operands)))
        for user in list(node.users):
            user.replace_all_uses_with(outputs[user.args[1]])
            graph.erase_node(user)
        graph.erase_node(node)
        if not body_attr.users:
            graph.erase_node(body_attr)
            gm.delete_submodule(body_attr.target)
        inlined += 1
    if inlined:
        gm.recompile()
    return inlined


def _warn_aliased(example_inputs: tuple) -> None:
    """torch.export traces example tensors that share memory as aliases of one another: a model
    exported with (x, x) computes with one input for both, whatever it is later called with."""
    seen: dict[int, int] = {}
    for i, t in enumerate(example_inputs):
        if isinstance(t, torch.Tensor) and t.numel() and t.device.type != "meta":
            ptr = t.untyped_storage().data_ptr()
            if ptr in seen:
                warnings.warn(
                    f"example_inputs: inputs {seen[ptr]} and {i} share memory; torch.export "
                    "traces them as aliases, so the captured graph treats them as one tensor. "
                    "Pass distinct tensors.",
                    stacklevel=3,
                )
            seen.setdefault(ptr, i)


def _is_aten_graph(gm: fx.GraphModule) -> bool:
    """Export / compile graphs call aten ops only; symbolic_trace graphs call torch functions."""
    return all(
        n.op not in ("call_method", "call_module")
        and (n.op != "call_function" or isinstance(n.target, torch._ops.OpOverload)
             or n.target.__module__ in ("_operator", "operator"))
        for n in gm.graph.nodes
        if not (n.op == "call_module" and n.target == "_guards_fn")
    )


def _ensure_fake_values(gm: fx.GraphModule, example_inputs: tuple) -> None:
    """Gives every node a fake value from the example inputs, unless all have fake values of one
    fake mode already (export's; make_fx in real mode leaves each value a mode of its own)."""
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    if all("val" in n.meta for n in nodes) and len(_fake_modes(nodes)) <= 1:
        return
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_inputs = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fake_inputs)


def _fake_modes(nodes: list[fx.Node]) -> set:
    """The fake modes of the nodes' tensor values (a real tensor counts as a mode of its own)."""
    modes: set = set()

    def note(value):
        if isinstance(value, torch.Tensor):
            modes.add(id(getattr(value, "fake_mode", value)))
        return value

    for node in nodes:
        fx.node.map_aggregate(node.meta.get("val"), note)
    return modes
