"""Charts of benchmarks/results/*.json as SVG (plain Python strings, no plotting library).

    python benchmarks/plot_results.py [--results benchmarks/results] [--out docs/img]

Per suite: `bench_<suite>.svg`, a bar per row of fxfuse's speed-up over its best peer (the
fastest peer's time ÷ fxfuse's, so above 1 is faster), on a log scale around 1; and, where a case
runs at three or more token counts, `bench_<suite>_by_m.svg`, the same ratio against M, a line per
case and fixed shape. "Best peer" is the fastest of `peers_us`, leaving out floors that compute
less than the fused op (`gemm_alone`). Rows with no fxfuse time or no peer are skipped and counted.
Files in the older flat layout (`{"M", "N", "K", "fxfuse", "inductor", "eager"}` rows) are read too.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from xml.sax.saxutils import escape

FLOORS = {"gemm_alone"}  # the GEMM without the split / cat: a bound, not an alternative
LEGACY_PEERS = ("inductor", "eager", "scaled_mm", "bf16_linear", "torch_eager")
PALETTE = ("#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2",
           "#97bbf5", "#9c6b4e", "#9498a0")  # fmt: skip
FONT = 'font-family="sans-serif"'


# --- rows ---------------------------------------------------------------------------------------


def _number(value) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) and value > 0 else None


def normalize(row: dict) -> dict | None:
    """{"case", "shape", "fxfuse", "peer", "peer_us", "ratio"} of a results row, else None."""
    if "fxfuse_us" in row:
        fxfuse, peers = _number(row["fxfuse_us"]), row.get("peers_us") or {}
        shape = {str(k).lower(): v for k, v in (row.get("shape") or {}).items()}
    else:  # the flat layout (chain.json)
        fxfuse = _number(row.get("fxfuse"))
        peers = {name: row[name] for name in LEGACY_PEERS if name in row}
        shape = {k.lower(): v for k, v in row.items() if k in ("M", "N", "K", "m", "n", "k")}
    timed = {name: _number(us) for name, us in peers.items() if name not in FLOORS}
    timed = {name: us for name, us in timed.items() if us is not None}
    if fxfuse is None or not timed:
        return None
    peer = min(timed, key=timed.__getitem__)
    return {"case": str(row.get("case", "chain")), "shape": shape, "fxfuse": fxfuse,
            "peer": peer, "peer_us": timed[peer], "ratio": timed[peer] / fxfuse}  # fmt: skip


def load(path: Path) -> tuple[dict, list[dict], int]:
    """(file header, normalized rows sorted by case and shape, rows skipped)."""
    data = json.loads(path.read_text())
    raw = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(raw, list):
        raise ValueError(f"{path}: no 'rows' list")
    rows = [r for r in (normalize(row) for row in raw if isinstance(row, dict)) if r]
    rows.sort(key=lambda r: (r["case"], sorted((k, str(v)) for k, v in r["shape"].items()
                                               if k != "m"), r["shape"].get("m", 0)))  # fmt: skip
    return {k: v for k, v in data.items() if k != "rows"}, rows, len(raw) - len(rows)


def _shape_text(shape: dict, skip=()) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items() if k not in skip)


# --- SVG helpers --------------------------------------------------------------------------------


def _text(x, y, s, size=11, anchor="start", extra="") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" {FONT}'
            f"{' ' + extra if extra else ''}>{escape(str(s))}</text>")  # fmt: skip


def _log_axis(lo: float, hi: float):
    """Power-of-2 bounds around [lo, hi] (always including 1) and the ticks between."""
    lo2 = math.floor(math.log2(min(lo, 1.0)))
    hi2 = math.ceil(math.log2(max(hi, 1.0)))
    if hi2 == lo2:
        hi2 += 1
    return lo2, hi2, [2.0**e for e in range(lo2, hi2 + 1)]


def _ratio_label(v: float) -> str:
    return f"×{v:g}" if v >= 1 else f"×1/{1 / v:g}"


def _legend(series: list[str], x: float, y: float) -> list[str]:
    parts = []
    for i, name in enumerate(series):
        yy = y + 16 * i
        color = PALETTE[i % len(PALETTE)]
        parts.append(f'<rect x="{x:.1f}" y="{yy - 9:.1f}" width="10" height="10" fill="{color}"/>')
        parts.append(_text(x + 15, yy, name))
    return parts


def _svg(width: float, height: float, body: list[str]) -> str:
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}">')  # fmt: skip
    background = f'<rect width="{width:.0f}" height="{height:.0f}" fill="white"/>'
    return "\n".join([head, background, *body, "</svg>"]) + "\n"


def _title(suite: str, header: dict, what: str) -> str:
    facts = ", ".join(str(header[k]) for k in ("device", "torch", "date") if header.get(k))
    return f"{suite}: {what}" + (f" ({facts})" if facts else "")


# --- charts -------------------------------------------------------------------------------------


def _ratio_axis(suite, header, what, rows, left, top, plot_w, plot_h):
    """(y_of, body): the log2 ratio axis over rows' ratios, its gridlines and the chart title."""
    lo2, hi2, ticks = _log_axis(min(r["ratio"] for r in rows), max(r["ratio"] for r in rows))

    def y_of(v: float) -> float:
        return top + plot_h * (hi2 - math.log2(v)) / (hi2 - lo2)

    body = [_text(left, 22, _title(suite, header, what), 14, extra='font-weight="bold"')]
    for t in ticks:
        y = y_of(t)
        stroke = 'stroke="#333" stroke-width="1.5"' if t == 1 else 'stroke="#ddd"'
        body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" {stroke}/>')
        body.append(_text(left - 6, y + 4, _ratio_label(t), 10, "end"))
    return y_of, body


def bar_chart(suite: str, header: dict, rows: list[dict]) -> str:
    """A bar per row from 1 to its ratio, log2 scale, coloured by case."""
    cases = list(dict.fromkeys(r["case"] for r in rows))
    bar, gap, left, top, plot_h = 14, 4, 70, 50, 320
    label_h = 8 + 6 * max(len(_shape_text(r["shape"])) for r in rows)
    legend_w = 20 + 7 * max(len(c) for c in cases)
    plot_w = len(rows) * (bar + gap) + gap
    width = left + plot_w + 30 + legend_w
    height = top + plot_h + label_h + 20
    y_of, body = _ratio_axis(suite, header, "fxfuse speed-up over the best peer", rows, left, top,
                             plot_w, plot_h)
    base = y_of(1.0)
    for i, r in enumerate(rows):
        x = left + gap + i * (bar + gap)
        y = y_of(r["ratio"])
        color = PALETTE[cases.index(r["case"]) % len(PALETTE)]
        tip = (f"{r['case']} {_shape_text(r['shape'])}: fxfuse {r['fxfuse']:.2f} us, "
               f"{r['peer']} {r['peer_us']:.2f} us, x{r['ratio']:.3f}")  # fmt: skip
        body.append(
            f'<rect x="{x:.1f}" y="{min(y, base):.1f}" width="{bar}" '
            f'height="{max(abs(base - y), 0.5):.1f}" fill="{color}"><title>{escape(tip)}</title>'
            "</rect>"
        )
        lx, ly = x + bar / 2 + 3, top + plot_h + 8
        body.append(_text(lx, ly, _shape_text(r["shape"]), 9, "end",
                          f'transform="rotate(-60 {lx:.1f} {ly:.1f})"'))  # fmt: skip
    body.append(_text(14, top + plot_h / 2, "best peer ÷ fxfuse", 11, "middle",
                      f'transform="rotate(-90 14 {top + plot_h / 2:.1f})"'))  # fmt: skip
    body += _legend(cases, left + plot_w + 30, top + 10)
    return _svg(width, height, body)


def _series(rows: list[dict]) -> dict[str, list[dict]]:
    """Rows with an `m`, by case and the rest of their shape; only series of 3+ token counts."""
    series: dict[str, list[dict]] = {}
    for r in rows:
        if _number(r["shape"].get("m")) is None:
            continue
        rest = _shape_text(r["shape"], skip=("m", "batch", "seq"))
        series.setdefault(f"{r['case']} {rest}".strip(), []).append(r)
    return {name: sorted(rs, key=lambda r: r["shape"]["m"]) for name, rs in series.items()
            if len({r["shape"]["m"] for r in rs}) >= 3}  # fmt: skip


def line_chart(suite: str, header: dict, rows: list[dict]) -> str | None:
    """Ratio against M (both log2), a line per case and fixed shape; None without such series."""
    series = _series(rows)
    if not series:
        return None
    left, top, plot_w, plot_h = 70, 50, 560, 320
    names = list(series)
    width = left + plot_w + 30 + 20 + 7 * max(len(n) for n in names)
    height = max(top + plot_h + 50, top + 16 * len(names) + 20)
    points = [r for rs in series.values() for r in rs]
    ms = sorted({r["shape"]["m"] for r in points})
    m_lo, m_hi = math.log2(ms[0]), math.log2(ms[-1]) if ms[-1] > ms[0] else math.log2(ms[0]) + 1

    def x_of(m: float) -> float:
        return left + plot_w * (math.log2(m) - m_lo) / (m_hi - m_lo)

    y_of, body = _ratio_axis(suite, header, "fxfuse speed-up over the best peer by M", points,
                             left, top, plot_w, plot_h)
    for m in ms:
        x = x_of(m)
        body.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" stroke="#eee"/>')
        body.append(_text(x, top + plot_h + 16, m, 10, "middle"))
    body.append(_text(left + plot_w / 2, top + plot_h + 36, "M (tokens)", 11, "middle"))
    for i, name in enumerate(names):
        color = PALETTE[i % len(PALETTE)]
        coords = [(x_of(r["shape"]["m"]), y_of(r["ratio"]), r) for r in series[name]]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in coords)
        body.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y, r in coords:
            tip = f"{name} m={r['shape']['m']}: x{r['ratio']:.3f} vs {r['peer']}"
            body.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}">'
                        f"<title>{escape(tip)}</title></circle>")  # fmt: skip
    body += _legend(names, left + plot_w + 30, top + 10)
    return _svg(width, height, body)


def main(argv=None) -> int:
    root = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=root / "results")
    parser.add_argument("--out", type=Path, default=root.parent / "docs" / "img")
    args = parser.parse_args(argv)
    paths = sorted(args.results.glob("*.json"))
    if not paths:
        parser.error(f"--results: no *.json in {args.results}")
    args.out.mkdir(parents=True, exist_ok=True)
    for path in paths:
        suite = path.stem
        try:
            header, rows, skipped = load(path)
        except (ValueError, json.JSONDecodeError) as err:
            print(f"{suite}: skipped ({err})")
            continue
        if not rows:
            print(f"{suite}: no row with an fxfuse time and a peer ({skipped} skipped)")
            continue
        written = []
        charts = {f"bench_{suite}.svg": bar_chart(suite, header, rows),
                  f"bench_{suite}_by_m.svg": line_chart(suite, header, rows)}  # fmt: skip
        for name, svg in charts.items():
            if svg is not None:
                (args.out / name).write_text(svg)
                written.append(name)
        print(f"{suite}: {len(rows)} row(s) ({skipped} skipped) -> {', '.join(written)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
