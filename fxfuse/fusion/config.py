"""FusionConfig and the FXFUSE_* environment flags, parsed strictly."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable

import torch

from fxfuse.runtime.target import TARGETS, detect_target, parse_target

PATTERN_NAMES = (
    "allreduce_rmsnorm",
    "rmsnorm_quant_gemm",
    "rmsnorm_quant",
    "quant_gemm",
    "gemm_split_cat",
    "topk_page_transform",
    "topk_block_table",
    "topk_mask",
)


def _check_names(names: Iterable[str], source: str) -> tuple[str, ...]:
    names = tuple(names)
    unknown = [n for n in names if n not in PATTERN_NAMES]
    if unknown:
        raise ValueError(
            f"{source}: unknown pattern name(s) {unknown}; expected some of {', '.join(PATTERN_NAMES)}"
        )
    return names


def parse_disable_env(value: str | None) -> tuple[str, ...]:
    """FXFUSE_DISABLE=name,name (blank entries ignored, unknown names an error)."""
    if not value:
        return ()
    return _check_names([n.strip() for n in value.split(",") if n.strip()], "FXFUSE_DISABLE")


@dataclasses.dataclass(frozen=True)
class FusionConfig:
    """Which patterns run, and run-time dispatch settings.

    enable: pattern names to run (None: all); disable: names not to run (FXFUSE_DISABLE adds to
    it); prologue_quant_max_m: token counts up to this use the GEMM that quantizes in its
    prologue; target: gfx950 | gfx942 | sm90 | cpu (None: FXFUSE_TARGET, else the target of the
    device of the graph's inputs);
    prepack_weights: after fusing, store the MXFP4 GEMMs' constant weights in gfx950's
    preshuffled layouts (SPEC §2) — None: where the target is gfx950, True / False: always /
    never (every target's kernels read both layouts).
    """

    enable: tuple[str, ...] | None = None
    disable: tuple[str, ...] = ()
    prologue_quant_max_m: int = 32
    target: str | None = None
    prepack_weights: bool | None = None

    def __post_init__(self):
        if self.enable is not None:
            if isinstance(self.enable, str):
                raise ValueError("enable: expected a sequence of pattern names, got a str")
            object.__setattr__(self, "enable", _check_names(self.enable, "enable"))
        if isinstance(self.disable, str):
            raise ValueError("disable: expected a sequence of pattern names, got a str")
        object.__setattr__(self, "disable", _check_names(self.disable, "disable"))
        m = self.prologue_quant_max_m
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ValueError(f"prologue_quant_max_m: expected an int >= 0, got {m!r}")
        if self.target is not None and self.target not in TARGETS:
            raise ValueError(f"target: expected one of {TARGETS}, got {self.target!r}")
        if self.prepack_weights is not None and not isinstance(self.prepack_weights, bool):
            raise ValueError(
                f"prepack_weights: expected None, True or False, got {self.prepack_weights!r}"
            )

    def prepacks(self, target: str) -> bool:
        """Whether the weight-prepack pass runs for `target`."""
        return target == "gfx950" if self.prepack_weights is None else self.prepack_weights

    def enabled(self, name: str) -> bool:
        disabled = set(self.disable) | set(parse_disable_env(os.environ.get("FXFUSE_DISABLE")))
        return name not in disabled and (self.enable is None or name in self.enable)

    def resolved_target(self, device: torch.device | None = None) -> str:
        """`target`, else FXFUSE_TARGET, else the target of `device` (the graph's tensors':
        a CPU model on a GPU machine targets the CPU), else of the current accelerator."""
        if self.target is not None:
            return self.target
        env = os.environ.get("FXFUSE_TARGET")
        return parse_target(env) if env else detect_target(device)
