"""Pattern families, one module each; every module exports RULES, most-fused first.

CANONICAL_RULES turn spellings into canonical ops; FUSION_RULES (in order) replace chains of
canonical ops with fused kernels. Adding a spelling is an edit to one family's module.
"""

from fxfuse.patterns import (
    allreduce,
    gemm,
    gemm_split_cat,
    quant,
    rms_norm,
    rms_norm_quant,
    topk,
)

# The norm and quant spellings: under torch.compile those no fusion consumes stay as spelled.
SPELLING_RULES = rms_norm.RULES + quant.RULES
CANONICAL_RULES = SPELLING_RULES + gemm.CANONICAL_RULES
CANONICAL_TARGETS = quant.CANONICAL_TARGETS
# gemm_split_cat before the quant → GEMM chains: it takes their FP8 / MXFP4 GEMMs as producers.
FUSION_RULES = (
    allreduce.RULES + rms_norm_quant.RULES + gemm_split_cat.RULES + gemm.FUSION_RULES
    + topk.RULES
)
