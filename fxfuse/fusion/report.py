"""FusionReport: what a pass run rewrote and which near-misses it left, with reasons."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Rewrite:
    pattern: str
    node: str  # the root node that was replaced
    replacement: str  # the fused op
    detail: str = ""
    # Names of the nodes the match covered and of the nodes the replacement created (for
    # `fxfuse explain`); covered nodes made by an earlier rewrite are traced through `sources`.
    replaced: tuple[str, ...] = ()
    created: tuple[str, ...] = ()


@dataclasses.dataclass
class FusionReport:
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    rejected: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    rewrites: list[Rewrite] = dataclasses.field(default_factory=list)
    canonicalized: dict[str, int] = dataclasses.field(default_factory=dict)
    target: str = "cpu"
    # Node made by a rewrite (canonicalization or fusion) -> names of the nodes its match covered.
    sources: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # The weight-prepack pass (not a pattern: no count): (GEMM node, weight attribute) stored in
    # gfx950's preshuffled layouts, and (GEMM node, reason) for MXFP4 weights left as they were.
    prepacked: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    prepack_skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def add_rewrite(
        self,
        pattern: str,
        node: str,
        replacement: str,
        detail: str = "",
        replaced: tuple[str, ...] = (),
        created: tuple[str, ...] = (),
    ) -> None:
        self.counts[pattern] = self.counts.get(pattern, 0) + 1
        self.rewrites.append(Rewrite(pattern, node, replacement, detail, replaced, created))

    def reject(self, pattern: str, node: str, reason: str) -> None:
        entry = (pattern, node, reason)
        if entry not in self.rejected:
            self.rejected.append(entry)

    def merge(self, other: FusionReport) -> None:
        for name, count in other.counts.items():
            self.counts[name] = self.counts.get(name, 0) + count
        for name, count in other.canonicalized.items():
            self.canonicalized[name] = self.canonicalized.get(name, 0) + count
        self.rejected.extend(r for r in other.rejected if r not in self.rejected)
        self.rewrites.extend(other.rewrites)
        self.sources.update(other.sources)
        self.prepacked.extend(other.prepacked)
        self.prepack_skipped.extend(other.prepack_skipped)
        self.target = other.target

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __str__(self) -> str:
        lines = [f"fxfuse report (target {self.target}): {self.total} rewrite(s)"]
        width = max([len(n) for n in self.counts] + [7])
        lines.append(f"  {'pattern':<{width}}  rewrites")
        for name, count in self.counts.items():
            lines.append(f"  {name:<{width}}  {count:>8}")
        if self.canonicalized:
            spelled = ", ".join(f"{k} {v}" for k, v in self.canonicalized.items())
            lines.append(f"  canonicalized spellings: {spelled}")
        if self.rewrites:
            lines.append("  rewrites:")
            lines.extend(
                f"    {r.pattern}: {r.node} -> {r.replacement}" + (f" ({r.detail})" if r.detail else "")
                for r in self.rewrites
            )
        if self.rejected:
            lines.append("  near-misses:")
            lines.extend(f"    {p}: {n}: {why}" for p, n, why in self.rejected)
        if self.prepacked:
            lines.append("  weights prepacked (gfx950 preshuffled layouts):")
            lines.extend(f"    {n}: {w}" for n, w in self.prepacked)
        if self.prepack_skipped:
            lines.append("  weights not prepacked:")
            lines.extend(f"    {n}: {why}" for n, why in self.prepack_skipped)
        return "\n".join(lines)

    __repr__ = __str__
