"""Install a `bench_gemm_fp8.py --sweep` result as the sm90 entries of the gemm_fp8 launch table.

    python benchmarks/install_gemm_fp8_sweep.py RESULTS/gemm_fp8_sweep.json

Per swept M (each the top of an M bucket: the bucket runs up to it) and per DeepSeek-R1 (N, K),
the fastest config becomes an entry `{"m_max": M, "n_max": N, "k_max": K}`, tried in order of M
then N; a last catch-all per bucket uses the widest shape's config, and the table's existing
large-M entries (above the largest swept M) stay.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TABLE = Path(__file__).resolve().parents[1] / "fxfuse" / "runtime" / "tables" / "gemm_fp8.json"
FIELDS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "num_warps", "num_stages")


def main(path: str) -> None:
    sweep = json.loads(Path(path).read_text())
    rows = sweep["sweep"]
    table = json.loads(TABLE.read_text())
    spec = table["targets"]["sm90"]
    if "SWAP_AB" not in table["fields"]:
        table["fields"] = list(FIELDS) + ["SWAP_AB"]
        for entry in spec["entries"]:
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
    spec["source"] = (f"benchmarks/bench_gemm_fp8.py --sweep, {sweep['device']}, {sweep['date']}, "
                      f"torch {sweep['torch']}, triton {sweep['triton']} (M <= {largest}); larger M: "
                      "earlier entries, the vendor GEMM there (gemm_fp8_backend)")
    TABLE.write_text(json.dumps(table, indent=1) + "\n")
    print(f"installed {len(entries)} swept entries + {len(kept)} kept into {TABLE}")


if __name__ == "__main__":
    main(sys.argv[1])
