"""Launch configurations per target, loaded from JSON and validated on load.

One file per kernel, `runtime/tables/<kernel>.json`:

    {"kernel": "rms_norm_quant",
     "fields": ["BLOCK_N", "num_warps"],
     "targets": {
        "sm90":   {"timed": true,  "source": "benchmarks/bench_rms_norm_quant.py, 2026-12-02",
                   "entries": [{"when": {"n_max": 2048}, "config": {"BLOCK_N": 2048, "num_warps": 4}},
                               {"when": {}, "config": {...}}]},
        "gfx950": {"timed": false, "source": "CDNA4 ISA: ...", "entries": [...]},
        "gfx942": {...}}}

Entries are tried in order; `when` holds upper bounds `<shape key>_max` (inclusive) over the
lower-case shape keys of PERFORMANCE.md; the last entry of every target must match everything.
The CPU (interpreter) uses the sm90 table.
"""

from __future__ import annotations

import functools
import json
from importlib import resources

SHAPE_KEYS = ("m", "n", "k", "rows", "length", "topk", "d", "group")
POWER_OF_TWO_PREFIXES = ("BLOCK_", "GROUP_")
NUM_WARPS = (1, 2, 4, 8, 16)
TABLE_TARGETS = ("sm90", "gfx950", "gfx942")
FLAG_FIELDS = ("SWAP_AB", "PERSISTENT")  # 0 / 1 switches; every other field is a positive int
# Fields where 0 means "none": compiler caps (registers a thread: Triton's maxnreg, CUDA only),
# the top-k finish kernel's warps (0: no second kernel).
CAP_FIELDS = ("MULTI_MAXNREG", "MULTI_FINISH_WARPS")


class LaunchTableError(ValueError):
    pass


def _validate(table: dict, name: str) -> dict:
    where = f"launch table {name!r}"
    if table.get("kernel") != name:
        raise LaunchTableError(f"{where}: 'kernel' must be {name!r}, got {table.get('kernel')!r}")
    fields = table.get("fields")
    if not isinstance(fields, list) or not fields:
        raise LaunchTableError(f"{where}: 'fields' must be a non-empty list")
    targets = table.get("targets", {})
    missing = [t for t in TABLE_TARGETS if t not in targets]
    if missing:
        raise LaunchTableError(f"{where}: missing targets {missing}")
    for target, spec in targets.items():
        at = f"{where}, target {target!r}"
        if not isinstance(spec.get("timed"), bool) or not spec.get("source"):
            raise LaunchTableError(f"{at}: needs 'timed' (bool) and 'source' (str)")
        entries = spec.get("entries")
        if not entries:
            raise LaunchTableError(f"{at}: 'entries' is empty")
        for i, entry in enumerate(entries):
            for key, bound in entry.get("when", {}).items():
                if not key.endswith("_max") or key[: -len("_max")] not in SHAPE_KEYS:
                    raise LaunchTableError(f"{at}, entry {i}: unknown bound {key!r}")
                if not isinstance(bound, int) or bound < 1:
                    raise LaunchTableError(f"{at}, entry {i}: bound {key} must be a positive int")
            config = entry.get("config", {})
            if sorted(config) != sorted(fields):
                raise LaunchTableError(f"{at}, entry {i}: config keys {sorted(config)} != {fields}")
            for key, value in config.items():
                if key in FLAG_FIELDS:
                    if value not in (0, 1) or isinstance(value, bool):
                        raise LaunchTableError(f"{at}, entry {i}: {key} must be 0 or 1")
                    continue
                if key in CAP_FIELDS:
                    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                        raise LaunchTableError(f"{at}, entry {i}: {key} must be an int >= 0")
                    continue
                if not isinstance(value, int) or value < 1:
                    raise LaunchTableError(f"{at}, entry {i}: {key} must be a positive int")
                if key.startswith(POWER_OF_TWO_PREFIXES) and value & (value - 1):
                    raise LaunchTableError(f"{at}, entry {i}: {key}={value} is not a power of 2")
                if key == "num_warps" and value not in NUM_WARPS:
                    raise LaunchTableError(f"{at}, entry {i}: num_warps={value} not in {NUM_WARPS}")
        if entries[-1].get("when"):
            raise LaunchTableError(f"{at}: the last entry must have an empty 'when' (catch-all)")
    return table


@functools.cache
def load_table(name: str) -> dict:
    """The validated launch table of kernel `name`."""
    path = resources.files("fxfuse.runtime") / "tables" / f"{name}.json"
    if not path.is_file():
        raise LaunchTableError(f"launch table {name!r}: no file {name}.json")
    return _validate(json.loads(path.read_text()), name)


def lookup(name: str, target: str, **shape: int) -> dict:
    """The first config of `name`'s table for `target` whose bounds hold for `shape`."""
    table = load_table(name)
    spec = table["targets"]["sm90" if target == "cpu" else target]
    for key in shape:
        if key not in SHAPE_KEYS:
            raise ValueError(f"shape: unknown key {key!r}; expected one of {SHAPE_KEYS}")
    for entry in spec["entries"]:
        if all(shape.get(k[: -len("_max")], 0) <= v for k, v in entry.get("when", {}).items()):
            return dict(entry["config"])
    raise AssertionError("unreachable: validated tables end in a catch-all entry")
