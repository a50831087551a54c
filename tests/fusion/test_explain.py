"""`fxfuse explain`: the report table, a before/after drawing per rewrite, clear MODEL errors."""

from __future__ import annotations

import re

import pytest
import torch

from fxfuse.__main__ import _can_render_svg, main
from fxfuse.models import deepseek_block

SMALL = ["--hidden", "128", "--layers", "1", "--batch", "1", "--seq", "4"]
FUSED_OPS = {
    "rmsnorm_quant": ("fxfuse.rms_norm_quant.default", "fxfuse.add_rms_norm_quant.default",
                      "fxfuse.rms_norm_quant_gemm.default"),
    "rmsnorm_quant_gemm": ("fxfuse.rms_norm_quant_gemm.default",),
    "quant_gemm": ("fxfuse.quant_gemm.default",),
}


def small_block(quant: str = "fp8_rowwise"):
    """A `pkg.module:factory` MODEL for the tests."""
    cfg = deepseek_block.BlockConfig(
        hidden=128, q_lora_rank=64, kv_lora_rank=64, intermediate=256, layers=1, quant=quant
    )
    return deepseek_block.build(cfg), deepseek_block.example_inputs(cfg, batch=1, seq=4)


def not_a_pair():
    return torch.nn.Linear(2, 2)


def _rows(out: str) -> list[list[str]]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("#  pattern")) + 2
    rows = []
    for line in lines[start:]:
        if not re.match(r"^\d+\s", line):
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def _check_drawings(out: str, out_dir, ext: str) -> set[str]:
    total = int(re.search(r"(\d+) rewrite\(s\)", out).group(1))
    rows = _rows(out)
    assert total > 0 and len(rows) == total, out
    for index, pattern, root, fused_op, replaced, files in rows:
        before, after = files.split(", ")
        assert before.endswith(f"_before.{ext}") and after.endswith(f"_after.{ext}")
        before_text = (out_dir / before).read_text()
        after_text = (out_dir / after).read_text()
        # Before: the spelled aten chain, no fused op; after: the fused op and fewer nodes.
        assert int(replaced) > 1, (pattern, before_text)
        assert fused_op not in before_text
        assert any(op in after_text for op in FUSED_OPS[pattern]), (pattern, after_text)
        if ext == "dot":
            ops_before, ops_after = before_text.count("shape=box"), after_text.count("shape=box")
            assert ops_before == int(replaced) and 0 < ops_after < ops_before, (pattern, after_text)
    assert len(list(out_dir.glob(f"*.{ext}"))) == 2 * total
    return {row[1] for row in rows}


def test_explain_bundled_block_writes_a_drawing_per_rewrite(tmp_path, capsys):
    out_dir = tmp_path / "drawings"
    assert main(["explain", "deepseek_block", *SMALL, "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    ext = "svg" if _can_render_svg() else "dot"
    patterns = _check_drawings(out, out_dir, ext)
    assert patterns == {"rmsnorm_quant", "rmsnorm_quant_gemm", "quant_gemm"}, out
    # The near-misses are listed with their reasons.
    assert "near-misses:" in out and "has other users" in out
    if ext == "dot":
        text = next(out_dir.glob("*_before.dot")).read_text()
        assert text.startswith("digraph ") and "->" in text and text.rstrip().endswith("}")


def test_explain_dotted_factory_and_quant(tmp_path, capsys, reference_path):
    """The weights are quantized through fxfuse.ops (reference path: the interpreter would take
    ~30 s on the CPU for what is a drawing test)."""
    spec = f"{__name__}:small_block"
    assert main(["explain", spec, "--quant", "mxfp4", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"fxfuse explain: {spec}")
    _check_drawings(out, tmp_path, "svg" if _can_render_svg() else "dot")
    assert "fxfuse.rms_norm_quant" in out


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("no_colon_here", "expected 'deepseek_block' or a dotted path"),
        ("fxfuse_no_such.models:build", "cannot import module 'fxfuse_no_such.models'"),
        (f"{__name__}:no_such_factory", "has no callable 'no_such_factory'"),
        (f"{__name__}:not_a_pair", "must return (model, example_inputs)"),
    ],
)
def test_explain_bad_model_names_the_argument(model, says, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["explain", model, "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "MODEL:" in err and says in err, err
    assert not list(tmp_path.iterdir())


def test_demo_still_parses():
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--hidden", "100"])
    assert exit_info.value.code == 2
