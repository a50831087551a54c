"""Every kernel launch of the shipped launch tables compiles for its GPU target (no device
needed): sm90, gfx950 and gfx942.

Triton's interpreter runs kernels as Python and checks none of the compiler's typing, so a
kernel can pass every CPU test and still fail to compile for a GPU: a constexpr reassigned inside
a run-time branch, say (the bf16 row path of the top-k kernel, 2026-12-07, caught only on the
device). Here the kernel wrappers run on meta tensors with target=<the target>: each launch they
make (`_plans.launch`) is recorded instead of run, with the target's table config for that shape
and dtype, and then compiled for the target from its own arguments, specialized as Triton's JIT
specializes them (ints equal to 1 as constants, 16-divisible pointers and ints marked): top-k
(indices, page transform, block table, mask; register-tile, streamed, segmented and
multi-program paths, the last forced where a table leaves it off; fp32, bf16, fp16 scores), the
RMSNorm + quant kernel (FP8 per token, FP8 1x128 with row- and column-major scales, MXFP4, the
norm and the quant alone) and GEMM -> split -> cat, over bf16 and fp16; the quantized GEMMs
(A8W8 per token and blockscale, A16W8, AFP4WFP4, A16WFP4, gfx950's preshuffled weights) at
decode and prefill M (test_gemm_compile.py compiles further GEMM variants by hand). Meta
tensors are not CUDA tensors, so a choice a wrapper makes on the device type takes its non-CUDA
branch here. The AMD targets skip where lld is missing.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.helpers import compile_in_subprocess

_SCRIPT = textwrap.dedent(
    """
    import json
    import multiprocessing
    import os

    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from fxfuse.kernels import _plans, gemm_fp8, gemm_mxfp4, gemm_ref, gemm_split_cat
    from fxfuse.kernels import rms_norm_quant, topk

    TARGET = "@TARGET@"
    GPU = {"sm90": GPUTarget("cuda", 90, 32), "gfx950": GPUTarget("hip", "gfx950", 64),
           "gfx942": GPUTarget("hip", "gfx942", 64)}[TARGET]
    TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
             torch.int32: "i32", torch.int64: "i64", torch.int16: "i16", torch.int8: "i8",
             torch.uint8: "u8", torch.bool: "i1", torch.float8_e4m3fn: "fp8e4nv",
             torch.float8_e5m2: "fp8e5"}
    launches = []


    def record(kernel, grid, *args, **kwargs):
        launches.append((kernel, args, kwargs))


    for module in (_plans, gemm_fp8, gemm_mxfp4, gemm_split_cat, rms_norm_quant, topk):
        module.launch = record


    def specialize(value, param):
        \"\"\"(signature type, attributes) as Triton's JIT specializes a run-time argument:
        ints equal to 1 become constexprs, pointers and ints divisible by 16 say so (the
        vectorized loads of the real launches depend on it); meta tensors have 16-aligned
        pointers, like the caching allocator's.\"\"\"
        try:
            from triton._C.libtriton import native_specialize_impl
            from triton.backends.compiler import BaseBackend
        except ImportError:  # an older Triton: plain types, no specialization
            if isinstance(value, torch.Tensor):
                return "*" + TYPES[value.dtype], None
            if isinstance(value, bool):
                return "i1", None
            if isinstance(value, int):
                return ("i64" if abs(value) >= 2**31 else "i32"), None
            return "fp32", None
        if isinstance(value, torch.Tensor) and value.dtype not in TYPES:
            raise TypeError(f"{param.name}: {value.dtype}")
        kind, key = native_specialize_impl(BaseBackend, value, False,
                                           not param.do_not_specialize,
                                           not param.do_not_specialize_on_alignment)
        return kind, key


    def signature(kernel, args, kwargs):
        \"\"\"(signature, constexprs, attributes, compile options) of one recorded launch.\"\"\"
        names = [p.name for p in kernel.params]
        values = {**dict(zip(names, args)), **{k: v for k, v in kwargs.items() if k in names}}
        options = {k: v for k, v in kwargs.items() if k not in names}
        sig, consts, attrs = {}, {}, {}
        for i, p in enumerate(kernel.params):
            v = values.get(p.name, p.default)
            if p.is_constexpr or v is None:
                sig[p.name], consts[p.name] = "constexpr", v
                continue
            if not isinstance(v, (torch.Tensor, bool, int, float)):
                raise TypeError(f"{kernel.__name__}.{p.name}: {type(v)}")
            kind, key = specialize(v, p)
            if kind == "constexpr":
                sig[p.name], consts[p.name] = "constexpr", key
            else:
                sig[p.name] = kind
                if key == "D":
                    attrs[(i,)] = [["tt.divisibility", 16]]
        return sig, consts, attrs, options


    ITEMS = []  # the distinct launches: (kernel, signature, constexprs, attributes, options)


    def compile_one(i):
        kernel, sig, consts, attrs, options = ITEMS[i]
        try:
            compiled = triton.compile(
                ASTSource(kernel, sig, constexprs=consts, attrs=attrs), target=GPU,
                options={"num_warps": 4, "num_stages": 3, **options})
            return bool(compiled.asm.get("cubin") or compiled.asm.get("hsaco"))
        except Exception as e:  # the failure, named, for the test's message
            return f"{type(e).__name__}: {str(e)[-600:]}"


    def compile_all():
        # each distinct launch compiled, in forked processes (one a core)
        unique = {}
        for kernel, args, kwargs in launches:
            sig, consts, attrs, options = signature(kernel, args, kwargs)
            key = json.dumps([kernel.__name__, sig, consts, str(attrs), options],
                             sort_keys=True, default=str)
            unique.setdefault(key, (kernel, sig, consts, attrs, options))
        ITEMS.extend(unique.values())
        with multiprocessing.get_context("fork").Pool(os.cpu_count() or 1) as pool:
            results = pool.map(compile_one, range(len(ITEMS)), chunksize=1)
        return {f"{item[0].__name__}#{i}": r for i, (item, r) in enumerate(zip(ITEMS, results))}


    meta = torch.device("meta")


    def empty(*shape, dtype=torch.float32):
        return torch.empty(*shape, dtype=dtype, device=meta)


    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        tile, long = empty(4, 3000, dtype=dtype), empty(4, 131072, dtype=dtype)
        lengths = empty(4, dtype=torch.int32)
        table = empty(4, 2048, dtype=torch.int32)
        for sorted in (False, True):
            topk.topk_indices(tile, 64, sorted=sorted, target=TARGET)  # the register tile
            topk.topk_indices(long, 2048, sorted=sorted, target=TARGET)  # multi-program
            topk.topk_indices(long, 2048, sorted=sorted, target=TARGET, path="row")  # segments
            topk.topk_page_transform(long, 2048, lengths, table, 64, sorted=sorted,
                                     target=TARGET)
        topk.topk_page_transform(long, 2048, lengths, table, 64, target=TARGET,
                                 path="multi")  # where the table leaves the multi path off
        topk.topk_page_transform(long, 512, lengths, table, 64, row_starts=lengths,
                                 row_to_batch=lengths, target=TARGET)  # packed prefill rows
        topk.topk_page_transform(empty(64, 17920, dtype=dtype), 2048,
                                 empty(64, dtype=torch.int32), empty(64, 280, dtype=torch.int32),
                                 64, target=TARGET)  # the 32K entry: the collect kernel finishes
        topk.topk_block_table(empty(16, 50, dtype=dtype), 8, empty(8, dtype=torch.int64), 128, 2,
                              2, 2, num_kv_heads=2, target=TARGET)
        for kind in ("bool", "additive"):
            topk.topk_mask(tile, 100, kind=kind, block_size=4, target=TARGET)
            topk.topk_mask(tile, 100, lengths, kind=kind, masked_tail=True, target=TARGET)
        if dtype == torch.float32:
            continue  # the norm kernels and the GEMM take bf16 / fp16
        x, w, r = empty(64, 1536, dtype=dtype), empty(1536, dtype=dtype), empty(64, 1536,
                                                                                dtype=dtype)
        for quant, group, col in (("fp8", 0, False), ("fp8", 128, False), ("fp8", 128, True),
                                  ("mxfp4", 32, False)):
            for residual in (None, r):
                rms_norm_quant.rms_norm_quant(x, w, 1e-6, residual, quant=quant,
                                              group_size=group, scale_col_major=col,
                                              target=TARGET)
        rms_norm_quant.rms_norm_quant(x, w, 1e-6, r, weight_offset=1.0, write_norm=True,
                                      target=TARGET)
        rms_norm_quant.rms_norm(x, w, 1e-6, r, target=TARGET)
        rms_norm_quant.quant(x, quant="mxfp4", group_size=32, rounding="floor", target=TARGET)
        rms_norm_quant.rms_norm_quant(empty(8192, 7168, dtype=dtype), empty(7168, dtype=dtype),
                                      1e-6, quant="fp8", target=TARGET)  # a large-M entry
        y = empty(128, 1, 64, dtype=dtype).expand(128, 16, 64)
        gemm_split_cat.gemm_split_cat(empty(128, 512, dtype=dtype), empty(4096, 512, dtype=dtype),
                                      16, 128, 128, y, target=TARGET)
        gemm_split_cat.gemm_split(empty(8192, 512, dtype=dtype), empty(4096, 512, dtype=dtype),
                                  16, [128, 128], 1, target=TARGET)
    # The quantized GEMMs at DeepSeek-R1's 2112 x 7168 (decode, split-K and large-M entries):
    # A8W8 per token and 1x128 blockscale, A16W8 prequant, AFP4WFP4 and A16WFP4 (also from the
    # gfx950 preshuffled layout).
    fp8, u8, bf16 = torch.float8_e4m3fn, torch.uint8, torch.bfloat16
    n, k = 2112, 7168
    w8, w4, s4 = empty(n, k, dtype=fp8), empty(n, k // 2, dtype=u8), empty(n, k // 32, dtype=u8)
    w4s, s4s = (empty(*shape, dtype=u8) for shape in gemm_ref.preshuffled_shapes(n, k))
    for m in (1, 32, 4096):
        q8, q4, x = empty(m, k, dtype=fp8), empty(m, k // 2, dtype=u8), empty(m, k, dtype=bf16)
        gemm_fp8.gemm_fp8(q8, empty(m, 1), w8, empty(n, 1), target=TARGET)
        gemm_fp8.gemm_fp8(q8, empty(m, k // 128), w8, empty(-(-n // 128), k // 128),
                          target=TARGET)
        gemm_fp8.gemm_a16w8(x, w8, empty(n, 1), target=TARGET)
        gemm_fp8.gemm_a16w8(x, w8, empty(-(-n // 128), k // 128), group_size=128, target=TARGET)
        gemm_mxfp4.gemm_mxfp4(q4, empty(m, k // 32, dtype=u8), w4, s4, target=TARGET)
        gemm_mxfp4.gemm_a16wfp4(x, w4, s4, target=TARGET)
        if TARGET == "gfx950":
            gemm_mxfp4.gemm_mxfp4(q4, empty(m, k // 32, dtype=u8), w4s, s4s, preshuffled=True,
                                  n=n, target=TARGET)
            gemm_mxfp4.gemm_a16wfp4(x, w4s, s4s, preshuffled=True, n=n, target=TARGET)
    print(json.dumps({"launches": len(launches), "compiled": compile_all()}))
    """
)

KERNELS = {"_topk_kernel", "_topk_sample_kernel", "_topk_multi_kernel",
           "_rms_norm_quant_rows_kernel", "_gemm_split_cat_kernel", "_gemm_fp8_kernel",
           "_gemm_mxfp4_kernel"}
# where the target's tables finish the multi path's long rows in a second kernel
FINISH_KERNEL = {"sm90": {"_topk_finish_kernel"}, "gfx950": set(), "gfx942": set()}


@pytest.mark.parametrize("target", ["sm90", "gfx950", "gfx942"])
def test_shipped_launches_compile(target):
    found = compile_in_subprocess(_SCRIPT.replace("@TARGET@", target))
    compiled = found["compiled"]
    failed = {name: why for name, why in compiled.items() if why is not True}
    assert not failed, failed
    # every wrapper above launched (a wrapper that took its torch reference records nothing)
    names = {name.split("#")[0] for name in compiled}
    assert names >= KERNELS | FINISH_KERNEL[target], names
    assert found["launches"] >= 70 and len(compiled) >= 60, (found["launches"], len(compiled))
