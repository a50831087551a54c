"""Why is the FP8 path of rms_norm_quant slower than its MXFP4 path at N = 7168? Times the
production kernel's variants next to a plain 2-D kernel. H200 only; prints a table.

    PYTHONPATH=. python benchmarks/experiments/rms_fp8_probe.py
"""

import torch
import triton
import triton.language as tl

from fxfuse.kernels.rms_norm_quant import _div_by_scale, rms_norm, rms_norm_quant
from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref


@triton.jit
def _plain_kernel(x_ptr, r_ptr, w_ptr, h_ptr, q_ptr, s_ptr, M, N, eps, qeps, stride,
                  BLOCK_N: tl.constexpr, ROWS: tl.constexpr, MODE: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    mask = rmask[:, None] & (cols < N)[None, :]
    offs = rows[:, None].to(tl.int64) * stride + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    h = (x + r).to(tl.bfloat16)
    tl.store(h_ptr + offs, h, mask=mask)
    hf = h.to(tl.float32)
    ss = tl.sum(hf * hf, axis=1)
    inv = tl.math.div_rn(1.0, tl.sqrt_rn(ss * tl.math.div_rn(1.0, N.to(tl.float32)) + eps))
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    y = (hf * inv[:, None]).to(tl.bfloat16).to(tl.float32) * w[None, :]
    y = y.to(tl.bfloat16).to(tl.float32)
    amax = tl.max(tl.abs(y), axis=1)
    scale = tl.maximum(amax, qeps) * (1.0 / 448.0)
    tl.store(s_ptr + rows, scale, mask=rmask)
    rcp = tl.math.div_rn(1.0, scale)
    if MODE == 0:
        qv = _div_by_scale(y, scale[:, None], rcp[:, None])
    elif MODE == 1:
        qv = y * rcp[:, None]
    else:
        qv = tl.math.div_rn(y, scale[:, None])
    q = qv.to(tl.float8e4nv, fp_downcast_rounding="rtne")
    tl.store(q_ptr + offs, q, mask=mask)


def plain(x, r, w, mode, rows, warps):
    m, n = x.shape
    h = torch.empty_like(x)
    q = torch.empty(m, n, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    _plain_kernel[(triton.cdiv(m, rows),)](
        x, r, w, h, q, s, m, n, 1e-6, 1e-10, x.stride(0),
        BLOCK_N=triton.next_power_of_2(n), ROWS=rows, MODE=mode, num_warps=warps)
    return q, s, h


def main():
    torch.manual_seed(0)
    print(f"{'variant':44s} {'N':>5s} {'M':>6s} {'us':>8s} {'%roof':>6s}")
    for n in (7168, 1536):
        for m in (4096, 16384):
            x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
            roof = (3 * m * n * 2 + m * n + m * 4 + n * 2) / 4.25e6
            variants = {
                "prod fp8 row": lambda: rms_norm_quant(x, w, 1e-6, r, quant="fp8"),
                "prod fp8 row apply_reciprocal": lambda: rms_norm_quant(
                    x, w, 1e-6, r, quant="fp8", apply_reciprocal=True),
                "prod fp8 g128": lambda: rms_norm_quant(x, w, 1e-6, r, quant="fp8", group_size=128),
                "prod mxfp4": lambda: rms_norm_quant(x, w, 1e-6, r, quant="mxfp4"),
                "prod norm only (y bf16 + h)": lambda: rms_norm(x, w, 1e-6, r),
            }
            for rows in (1, 2, 4):
                for warps in (4, 8, 16):
                    for mode, name in ((0, "fma"), (1, "mulrcp"), (2, "div_rn")):
                        if mode and (rows, warps) != (1, 8):
                            continue
                        variants[f"plain {name} rows={rows} warps={warps}"] = (
                            lambda mode=mode, rows=rows, warps=warps: plain(x, r, w, mode, rows, warps))
            qp, sp, _ = plain(x, r, w, 0, 1, 8)
            qk, sk, _, _ = rms_norm_quant(x, w, 1e-6, r, quant="fp8")
            print("plain == prod bytes:", torch.equal(qp.view(torch.uint8), qk.view(torch.uint8)),
                  torch.equal(sp, sk))
            for name, fn in variants.items():
                try:
                    us = triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median") * 1e3
                    print(f"{name:44s} {n:5d} {m:6d} {us:8.1f} {100 * roof / us:6.1f}")
                except Exception as e:  # noqa: BLE001
                    print(f"{name:44s} {n:5d} {m:6d} failed: {type(e).__name__}: {str(e)[:100]}")


if __name__ == "__main__":
    main()
