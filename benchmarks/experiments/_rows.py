"""Result rows of an experiment script: each printed as a JSON line and, given a path, the whole
file rewritten after every row, so a run cut short keeps what it measured."""

from __future__ import annotations

import json


def row_writer(path: str | None, header: dict):
    """emit(row): print the row; with a path, write {**header, "rows": [every row so far]}."""
    rows: list[dict] = []

    def emit(row: dict) -> None:
        rows.append(row)
        print(json.dumps(row), flush=True)
        if path:
            with open(path, "w") as f:
                json.dump({**header, "rows": rows}, f, indent=1)

    return emit
