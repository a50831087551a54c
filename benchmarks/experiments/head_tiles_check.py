"""GPU accuracy of the FP8 head tiles against float64, beside fxfuse's Triton A8W8 kernel and
`_scaled_mm` on the same quantized operands (relative error of the norm, rows off by > 5 %, y).

    PYTHONPATH=. python benchmarks/experiments/head_tiles_check.py
"""

import torch

from fxfuse.kernels import gemm_fp8, gemm_ref
from fxfuse.kernels import gemm_split_cat as G
from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref

torch.manual_seed(0)
for m, d, s, s3, k in ((2048, 4, 64, 32, 256), (4100, 16, 128, 64, 512)):
    x = torch.randn(m, k, device="cuda")
    q, xs = quant_fp8_ref(x, 0, torch.float8_e4m3fn, 1e-10, False, False)
    w, ws = quant_fp8_ref(
        torch.randn(d * 2 * s, k, device="cuda"), 0, torch.float8_e4m3fn, 1e-10, False, False
    )
    ws = ws.view(-1)
    y = torch.randn(m, 1, s3, device="cuda").bfloat16().expand(m, d, s3)
    ref = gemm_ref.gemm_fp8_ref(q, xs, w, ws, torch.float64).view(m, d, 2 * s)
    out, c2 = G.fp8_head_tiles(q, xs, w, ws, d, s, s, y)
    tri = gemm_fp8.gemm_fp8(q, xs, w, ws, torch.bfloat16).view(m, d, 2 * s)
    ven = torch._scaled_mm(
        q, w.t(), scale_a=xs, scale_b=ws.view(1, -1), out_dtype=torch.bfloat16
    ).view(m, d, 2 * s)

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm()).item()

    print(
        m,
        d,
        s,
        "head c1",
        rel(out[..., :s], ref[..., :s]),
        "c2",
        rel(c2, ref[..., s:]),
        "triton",
        rel(tri, ref),
        "vendor",
        rel(ven, ref),
        "| y ok",
        torch.equal(out[..., s:], y),
        "| rows bad",
        (
            (torch.cat([out[..., :s], c2], -1).double() - ref).abs().amax((1, 2))
            > 0.05 * ref.abs().amax((1, 2))
        )
        .sum()
        .item(),
    )
