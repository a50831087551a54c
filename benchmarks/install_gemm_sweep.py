"""Install a `bench_gemm_fp8.py --sweep` / `bench_gemm_mxfp4.py --sweep` result as the sm90
entries of that kernel's launch table.

    python benchmarks/install_gemm_sweep.py gemm_fp8 RESULTS/gemm_fp8_sweep.json
    python benchmarks/install_gemm_sweep.py gemm_mxfp4 RESULTS/gemm_mxfp4_sweep.json
    python benchmarks/install_gemm_sweep.py gemm_a16wfp4 RESULTS/gemm_a16wfp4_sweep.json

Per swept M (each the top of an M bucket: the bucket runs up to it) and per DeepSeek-R1 (N, K),
the fastest config becomes an entry `{"m_max": M, "n_max": N, "k_max": K}`, tried in order of M
then N; a last catch-all per bucket uses the widest shape's config, and the table's existing
large-M entries (above the largest swept M) stay.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TABLES = Path(__file__).resolve().parents[1] / "fxfuse" / "runtime" / "tables"
KERNELS = ("gemm_fp8", "gemm_mxfp4", "gemm_a16wfp4")
LARGE_M_NOTE = {
    "gemm_fp8": "earlier entries, the vendor GEMM there for rowwise A8W8 (gemm_fp8_backend)",
    "gemm_mxfp4": "earlier entries",
    "gemm_a16wfp4": "earlier entries",
}


def main(kernel: str, path: str) -> None:
    if kernel not in KERNELS:
        raise SystemExit(f"kernel: expected one of {KERNELS}, got {kernel!r}")
    table_path = TABLES / f"{kernel}.json"
    sweep = json.loads(Path(path).read_text())
    rows = sweep["sweep"]
    table = json.loads(table_path.read_text())
    spec = table["targets"]["sm90"]
    if "SWAP_AB" not in table["fields"]:
        # The sweep tries swapped tiles; every target's entries (not only sm90's) need the field.
        table["fields"] = list(table["fields"]) + ["SWAP_AB"]
        for other in table["targets"].values():
            for entry in other["entries"]:
                entry["config"].setdefault("SWAP_AB", 0)
    swept_m = sorted({r["m"] for r in rows})
    entries = []
    for m in swept_m:
        shapes = sorted((r for r in rows if r["m"] == m), key=lambda r: (r["n"], r["k"]))
        for r in shapes:
            config = {key: r["best"].get(key, 0) for key in table["fields"]}
            entries.append({"when": {"m_max": m, "n_max": r["n"], "k_max": r["k"]}, "config": config})
        widest = max(shapes, key=lambda r: r["n"] * r["k"])
        entries.append({"when": {"m_max": m},
                        "config": {key: widest["best"].get(key, 0) for key in table["fields"]}})
    largest = swept_m[-1]
    kept = [e for e in spec["entries"] if e.get("when", {}).get("m_max", 1 << 62) > largest]
    spec["entries"] = entries + kept
    spec["timed"] = True
    spec["source"] = (f"benchmarks/bench_{kernel}.py --sweep, {sweep['device']}, {sweep['date']}, "
                      f"torch {sweep['torch']}, triton {sweep['triton']} (M <= {largest}); larger M: "
                      f"{LARGE_M_NOTE[kernel]}")
    table_path.write_text(json.dumps(table, indent=1) + "\n")
    # Fail here, not at the first launch, when the result does not validate.
    from fxfuse.runtime.launch_tables import _validate

    _validate(json.loads(table_path.read_text()), kernel)
    print(f"installed {len(entries)} swept entries + {len(kept)} kept into {table_path}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
