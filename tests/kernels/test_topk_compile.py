"""The multi-program top-k's compiled path, which cannot run here: the collect and finish
kernels compiled for sm90 (no device needed), with and without the walk storing the
candidates' scores (KEYS), and with the interpolated finishing select, at the catch-all entry's
geometry. The launches the shipped tables make, over each score dtype and on the row path too,
are compiled by test_launch_compile.py."""

from __future__ import annotations

import textwrap

from tests.helpers import compile_in_subprocess

_COMPILE = textwrap.dedent(
    """
    import json
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from fxfuse.kernels import topk

    SM90 = GPUTarget("cuda", 90, 32)
    names = ("scores_ptr", "lengths_ptr", "starts_ptr", "row_to_batch_ptr", "page_table_ptr",
             "out_ptr", "state_ptr", "keys_ptr", "idx_ptr", "gmax_ptr")
    pointers = {a: "*fp32" if a == "scores_ptr" else "*i32" for a in names}

    def compile_one(kernel, consts, num_warps, options):
        signature = {a: pointers.get(a, "i32") for a in kernel.arg_names}
        signature.update({a: "constexpr" for a in consts})
        compiled = triton.compile(ASTSource(kernel, signature, constexprs=consts), target=SM90,
                                  options={"num_warps": num_warps, "num_stages": 3, **options})
        return len(compiled.asm["cubin"]) > 0

    meta = dict(LENGTHS=topk.LEN_ARRAY.value, HAS_STARTS=False, HAS_ROW_TO_BATCH=False,
                EPILOGUE=topk.EPI_PAGES.value, SORT=topk.SORT_NONE.value, LOG2_PAGE=6,
                ESTIMATE=True, ROWS=1, BLOCK=2048, CHUNKS=16, CAP=4096, AREA=8192, K_PAD=2048,
                FB_BLOCK=topk.FALLBACK_BLOCK.value, RADIX_BITS=topk.SELECT_BITS.value,
                SELECT=topk.SELECT_BISECT.value, PAIRS=False)
    found = {}
    for keys in (False, True):
        found[f"collect:{keys}"] = compile_one(
            topk._topk_multi_kernel, {**meta, "PREFETCH": 3, "FINISH": False, "KEYS": keys}, 8,
            {"maxnreg": 80})
        found[f"finish:{keys}"] = compile_one(topk._topk_finish_kernel, {**meta, "KEYS": keys},
                                              8, {})
    # the finishing select at interpolated points (MULTI_INTERP), in either kernel
    interp = {**meta, "SELECT": topk.SELECT_INTERP.value, "KEYS": True}
    found["collect:interp"] = compile_one(
        topk._topk_multi_kernel, {**interp, "PREFETCH": 3, "FINISH": True}, 8, {"maxnreg": 80})
    found["finish:interp"] = compile_one(topk._topk_finish_kernel, interp, 8, {})
    # the sample estimate by interpolated counts (MULTI_INTERP 2)
    sample = dict(LENGTHS=topk.LEN_FULL.value, HAS_STARTS=False, SAMPLE=8192, SECTOR=16,
                  MIN_RANK=64, RADIX_BITS=topk.SELECT_BITS.value, PAIRS=False,
                  SELECT=topk.SELECT_INTERP_SAMPLE.value)
    found["sample:interp"] = compile_one(topk._topk_sample_kernel, sample, 8, {})
    print(json.dumps(found))
    """
)


def test_multi_path_kernels_compile_for_sm90():
    found = compile_in_subprocess(_COMPILE)
    assert len(found) == 7 and all(found.values()), found
