"""The GEMM kernels' compiled path, which cannot run here: compiled for sm90 (no device needed).

Triton's interpreter runs kernels as Python, so a kernel can pass every CPU test and still fail
to compile (a `return` inside a compile-time `if` is followed by the code after it, say). These
compile the prequant kernels with the decode-row spread (QUANT_ROWS below BLOCK_M) and without,
in both tile orientations, A16WFP4's e2m1 decode with its tables as operands and written in, and
the A8W8 / AFP4WFP4 kernels with the split epilogue (gemm_split_cat's quantized producers).
"""

from __future__ import annotations

import textwrap

from tests.helpers import compile_in_subprocess

_COMPILE = textwrap.dedent(
    """
    import json
    import triton, triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from fxfuse.kernels import gemm_fp8, gemm_mxfp4

    SM90 = GPUTarget("cuda", 90, 32)

    def compile_one(kernel, pointers, floats, consts, num_warps=4):
        signature = {a: pointers.get(a, "fp32" if a in floats else "i32") for a in kernel.arg_names}
        signature.update({a: "constexpr" for a in consts})
        source = ASTSource(kernel, signature, constexprs=consts)
        compiled = triton.compile(source, target=SM90, options={"num_warps": num_warps,
                                                                 "num_stages": 3})
        return len(compiled.asm["ptx"]) > 0

    found = {}
    split_pointers = {"p1_ptr": "*bf16", "p2_ptr": "*bf16", "p3_ptr": "*bf16", "y_ptr": "*bf16"}
    plain = dict(NUM_PIECES=0, EPILOGUE_SUBTILES=0, Y_HEADS=0, BLOCK_S3=16, Y_COL_ITERS=0)
    # out = cat([c1, y]) and c2 (gemm_split_cat's epilogue): block stores, and column scatter
    split_cat = {1: dict(NUM_PIECES=2, EPILOGUE_SUBTILES=1, Y_HEADS=1, BLOCK_S3=64,
                         Y_COL_ITERS=1),
                 0: dict(NUM_PIECES=3, EPILOGUE_SUBTILES=0, Y_HEADS=2, BLOCK_S3=16,
                         Y_COL_ITERS=2)}
    fp8_pointers = {"a_ptr": "*bf16", "a_scale_ptr": "*fp32", "w_ptr": "*u8",
                    "w_scale_ptr": "*fp32", "out_ptr": "*bf16", "partial_ptr": "*fp32",
                    "lock_ptr": "*i32", "q_out_ptr": "*u8", "q_scale_out_ptr": "*fp32",
                    **split_pointers}
    for a_kind, blockwise in ((gemm_fp8.A_GROUP.value, True), (gemm_fp8.A_ROW_AMAX.value, False),
                              (gemm_fp8.A_ROW_PRESCALED.value, False)):
        for swap, quant_rows in ((0, 1), (1, 1), (0, 2), (1, 4), (1, 16)):
            consts = dict(A_KIND=a_kind, SCALE_BLOCKWISE=blockwise, DOT_DTYPE=tl.float8e4nv,
                          FP8_MAX=448.0, FP8_FNUZ=False, FP8_NATIVE=True, EPS_ON_SCALE=False,
                          APPLY_RECIPROCAL=False, WRITE_QUANT=swap == 1, EVEN_K=True,
                          EXACT_CASTS=False, CONST_DIV_AS_MUL=True, BLOCK_M=16,
                          BLOCK_N=64 if swap else 32, BLOCK_K=128, GROUP_M=1, SPLIT_K=2,
                          NUM_K_TILES=8, TILES_PER_SPLIT=4, SWAP_AB=swap, QUANT_ROWS=quant_rows,
                          **plain)
            found[f"fp8:{a_kind}:{swap}:{quant_rows}"] = compile_one(
                gemm_fp8._gemm_fp8_kernel, fp8_pointers, ("quant_eps",), consts)
    for blockwise, swap in ((False, 1), (True, 0)):  # A8W8 into split pieces
        consts = dict(A_KIND=gemm_fp8.A_FP8.value, SCALE_BLOCKWISE=blockwise,
                      DOT_DTYPE=tl.float8e4nv, FP8_MAX=448.0, FP8_FNUZ=False, FP8_NATIVE=True,
                      EPS_ON_SCALE=False, APPLY_RECIPROCAL=False, WRITE_QUANT=False, EVEN_K=True,
                      EXACT_CASTS=False, CONST_DIV_AS_MUL=True, BLOCK_M=64, BLOCK_N=128,
                      BLOCK_K=128, GROUP_M=8, SPLIT_K=2, NUM_K_TILES=4, TILES_PER_SPLIT=2,
                      SWAP_AB=swap, QUANT_ROWS=64, **split_cat[swap])
        found[f"fp8:split:{blockwise}"] = compile_one(
            gemm_fp8._gemm_fp8_kernel, {**fp8_pointers, "a_ptr": "*u8"}, ("quant_eps",), consts)
    mx_pointers = {"a_ptr": "*bf16", "a_scale_ptr": "*bf16", "w_ptr": "*u8", "w_scale_ptr": "*u8",
                   "out_ptr": "*bf16", "partial_ptr": "*fp32", "lock_ptr": "*i32",
                   "q_out_ptr": "*u8", "q_scale_out_ptr": "*u8", "table_ptr": "*i32",
                   **split_pointers}
    for swap, quant_rows, write, tables in ((1, 1, False, True), (0, 2, True, True),
                                           (1, 16, False, True), (0, 16, False, False)):
        consts = dict(A_BF16=True, ROUNDING=0, USE_DOT_SCALED=False, PRESHUFFLED=False,
                      WRITE_QUANT=write, DOT_DTYPE=tl.bfloat16, DECODE_PTX=4,
                      PTX_TABLES=tables, EXACT_CASTS=False,
                      BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, SPLIT_K=2,
                      TILES_PER_SPLIT=2, SWAP_AB=swap, QUANT_ROWS=quant_rows, **plain)
        found[f"mxfp4:{swap}:{quant_rows}:{tables}"] = compile_one(
            gemm_mxfp4._gemm_mxfp4_kernel, mx_pointers, (), consts)
    for swap in (0, 1):  # AFP4WFP4 into split pieces
        consts = dict(A_BF16=False, ROUNDING=0, USE_DOT_SCALED=False, PRESHUFFLED=False,
                      WRITE_QUANT=False, DOT_DTYPE=tl.bfloat16, DECODE_PTX=2, PTX_TABLES=False,
                      EXACT_CASTS=False, BLOCK_M=32, BLOCK_N=128, BLOCK_K=128, GROUP_M=8,
                      SPLIT_K=1, TILES_PER_SPLIT=4, SWAP_AB=swap, QUANT_ROWS=32,
                      **split_cat[swap])
        found[f"mxfp4:split:{swap}"] = compile_one(
            gemm_mxfp4._gemm_mxfp4_kernel, {**mx_pointers, "a_ptr": "*u8", "a_scale_ptr": "*u8"},
            (), consts)
    print(json.dumps(found))
    """
)


def test_prequant_gemms_compile_for_sm90():
    found = compile_in_subprocess(_COMPILE)
    assert len(found) == 23 and all(found.values()), found
