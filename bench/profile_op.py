"""Runs the fused op on the headline shape a few times and opens the CUDA profiler window around
exactly one call, for `ncu --profile-from-start off` (see bench/profile_ncu.sh)."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import gemm_bn_softmax as gbs  # noqa: E402

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--size", default="1024x8192x8192")
p.add_argument("--dtype", choices=["bf16", "fp16", "tf32", "3xtf32"], default="bf16",
               help="3xtf32: fp32 operands, precision='3xtf32' (the sm90 3xTF32 kernel)")
p.add_argument("--path", choices=["sm90", "generic", "recompute"], default="sm90")
a = p.parse_args()
m, n, k = (int(v) for v in a.size.split("x"))
dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "3xtf32": torch.float32}[a.dtype]
precision = {"tf32": "tf32", "3xtf32": "3xtf32"}.get(a.dtype)
mod = gbs.FusedGemmBNSoftmax(k, n, precision=precision).cuda().to(dtype)
x = torch.rand(m, k, device="cuda").to(dtype)
with torch.no_grad():
    for _ in range(3):
        gbs.gemm_bn_softmax(x, mod.gemm.weight, mod.gemm.bias, mod.bn.weight, mod.bn.bias, mod.bn.running_mean,
                            mod.bn.running_var, mod.scale, precision=precision, path=a.path)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    gbs.gemm_bn_softmax(x, mod.gemm.weight, mod.gemm.bias, mod.bn.weight, mod.bn.bias, mod.bn.running_mean,
                        mod.bn.running_var, mod.scale, precision=precision, path=a.path)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
