import torch, traceback
from fxfuse.kernels.gemm_split_cat import fp8_head_tiles
from fxfuse.kernels.rms_norm_quant_ref import quant_fp8_ref
m, d, s, k = 4096, 16, 128, 512
q, xs = quant_fp8_ref(torch.randn(m, k, device="cuda"), 0, torch.float8_e4m3fn, 1e-10, False, False)
w, ws = quant_fp8_ref(torch.randn(d*2*s, k, device="cuda"), 0, torch.float8_e4m3fn, 1e-10, False, False)
y = torch.randn(m, 1, 64, device="cuda").bfloat16().expand(m, d, 64)
fp8_head_tiles(q, xs, w, ws, d, s, s, y); torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g):
        fp8_head_tiles(q, xs, w, ws, d, s, s, y)
    g.replay(); torch.cuda.synchronize(); print("capture ok")
except Exception:
    traceback.print_exc()
