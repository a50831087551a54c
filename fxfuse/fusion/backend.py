"""`torch.compile(model, backend="fxfuse")`: Inductor with the fxfuse passes as its post-grad
custom pass (with a uuid, so Inductor's FX graph cache keys on fxfuse's code and config)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import torch
import torch.fx as fx
from torch._inductor.custom_graph_pass import CustomGraphPass

from fxfuse.fusion.config import FusionConfig
from fxfuse.fusion.passes import run_passes
from fxfuse.fusion.report import FusionReport

_REPORTS: list[FusionReport] = []


@functools.cache
def _source_hash() -> str:
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")) + sorted(root.rglob("*.json")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


class FxfusePostGradPass(CustomGraphPass):
    def __init__(self, config: FusionConfig, report: FusionReport):
        self.config, self.report = config, report

    def __call__(self, graph: fx.Graph) -> None:
        self.report.merge(run_passes(graph, self.config, unfused_as_spelled=True))

    def uuid(self) -> bytes:
        return hashlib.sha256((_source_hash() + repr(self.config)).encode()).digest()


def fxfuse_backend(
    gm: fx.GraphModule,
    example_inputs,
    config: FusionConfig | None = None,
    mode: str | None = None,
    options: dict | None = None,
):
    """The registered `fxfuse` torch.compile backend. torch.compile's `mode` and `options` reach
    Inductor as they would with backend="inductor" (`options` may also carry "config", a
    FusionConfig, as `make_backend(config)` binds one)."""
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    inductor_options = dict(options or {})
    if "config" in inductor_options:
        if config is not None:
            raise ValueError("options: a FusionConfig is given both as config and in options")
        config = inductor_options.pop("config")
    if config is not None and not isinstance(config, FusionConfig):
        raise ValueError(f"config: expected a FusionConfig, got {type(config).__name__}")
    if mode is not None and mode != "default":
        inductor_options = {**list_mode_options(mode), **inductor_options}
    config = config or FusionConfig()
    device = next((t.device for t in example_inputs if hasattr(t, "device")), None)
    report = FusionReport(target=config.resolved_target(device))
    _REPORTS.append(report)
    custom_pass = FxfusePostGradPass(config, report)
    # A graph-cache hit skips the post-grad pass and would leave the report empty; until the
    # report is stored with the cache entry, compile afresh. As config_patches (not a patch
    # around the call) the settings also reach the backward, which AOTAutograd compiles later.
    patches = {**inductor_options, "post_grad_custom_post_pass": custom_pass,
               "fx_graph_cache": False}  # fmt: skip
    return compile_fx(gm, example_inputs, config_patches=patches)


def make_backend(config: FusionConfig):
    """A backend callable bound to `config`: torch.compile(model, backend=make_backend(cfg))."""
    return functools.partial(fxfuse_backend, config=config)


def last_report() -> FusionReport:
    """The FusionReport of the most recent graph(s) compiled with backend="fxfuse" (one backend
    call: its forward, and its backward when compiled; an empty report before any)."""
    return _REPORTS[-1] if _REPORTS else FusionReport()


def register() -> None:
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if "fxfuse" not in _COMPILER_FNS:
        register_backend(name="fxfuse")(fxfuse_backend)


del torch
