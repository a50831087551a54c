"""Launch-table validation (runtime/launch_tables.py): what an entry may hold."""

from __future__ import annotations

import copy

import pytest

from fxfuse.runtime import launch_tables

TABLE = {
    "kernel": "t",
    "fields": ["BLOCK_N", "num_warps", "SWAP_AB", "MULTI_MAXNREG"],
    "targets": {
        target: {
            "timed": False,
            "source": "test",
            "entries": [
                {"when": {"n_max": 64}, "config": {"BLOCK_N": 64, "num_warps": 4, "SWAP_AB": 1,
                                                   "MULTI_MAXNREG": 80}},
                {"when": {}, "config": {"BLOCK_N": 128, "num_warps": 8, "SWAP_AB": 0,
                                        "MULTI_MAXNREG": 0}},
            ],
        }
        for target in launch_tables.TABLE_TARGETS
    },
}  # fmt: skip


def _with(field, value):
    table = copy.deepcopy(TABLE)
    table["targets"]["sm90"]["entries"][0]["config"][field] = value
    return table


def test_a_valid_table_loads():
    assert launch_tables._validate(copy.deepcopy(TABLE), "t")["kernel"] == "t"


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("MULTI_MAXNREG", -1, "MULTI_MAXNREG must be an int >= 0"),
        ("MULTI_MAXNREG", True, "MULTI_MAXNREG must be an int >= 0"),
        ("MULTI_MAXNREG", 64.0, "MULTI_MAXNREG must be an int >= 0"),
        ("SWAP_AB", 2, "SWAP_AB must be 0 or 1"),
        ("BLOCK_N", 0, "BLOCK_N must be a positive int"),
        ("BLOCK_N", 96, "BLOCK_N=96 is not a power of 2"),
        ("num_warps", 32, "num_warps=32 not in"),
    ],
)
def test_bad_entries_are_refused(field, value, message):
    with pytest.raises(launch_tables.LaunchTableError, match=message):
        launch_tables._validate(_with(field, value), "t")


def test_a_cap_of_zero_means_none():
    # 0 is valid only for the compiler caps (no cap); other fields must be positive.
    launch_tables._validate(_with("MULTI_MAXNREG", 0), "t")
    with pytest.raises(launch_tables.LaunchTableError, match="must be a positive int"):
        launch_tables._validate(_with("num_warps", 0), "t")
