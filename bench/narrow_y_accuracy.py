"""What a narrower y would cost in accuracy (CPU, float64 emulation; nothing is built for it).

The op keeps y = x Wᵀ + b in fp32 between the GEMM and the softmax. Writing it in the input's 16-bit
dtype would halve the bytes the GEMM writes and the softmax reads. This script emulates both choices
against the float64 reference block, with the benchmark's data (x ~ U[0, 1), nn.Linear's init):
- the Linear in the 16-bit dtype (x, W, b rounded; the products summed exactly, as fp32
  accumulation nearly is);
- BatchNorm statistics from the unrounded y, as the op's epilogue takes them;
- BatchNorm and softmax applied to y as stored: fp32, or rounded to the 16-bit dtype;
- the output rounded to the 16-bit dtype.

"- tile shift" stores y less a shift per 256-row tile and column (the tile's first row), rounded: the
shift, kept in fp32, would come back through per-tile softmax coefficients. "- group shift": the same per 32 rows,
the shift the statistics epilogue already takes (the median of the group's first three rows).
"eager-like" rounds y first and takes the statistics from the rounded y, as the eager block does.
--bias-shift adds a constant to every column of y, so that each column's mean is far from zero
against its spread (a rounded y then loses the difference y - mean).

    python bench/narrow_y_accuracy.py                  # 1024 x 1024 x 8192, as the headline's columns
    python bench/narrow_y_accuracy.py --bias-shift 10
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_forward import rel_err  # noqa: E402  (the benchmark's error measure)
from gemm_bn_softmax.reference import ReferenceModel  # noqa: E402


def softmax_of(y: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    z = (y - mean) / torch.sqrt(var + 1e-5)
    return torch.softmax(z.float(), 1).to(out_dtype).double()


def errors(m: int, n: int, k: int, bias_shift: float = 0.0, seed: int = 0) -> dict:
    """Relative error against float64 of each way to hold y, per 16-bit dtype."""
    torch.manual_seed(seed)
    ref = ReferenceModel(k, n).double()
    with torch.no_grad():
        ref.gemm.bias += bias_shift
        x = torch.rand(m, k, dtype=torch.float64)
        want = ref(x)
        result = {}
        for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
            def rounded(t):
                return t.to(dtype).double()

            y = rounded(x) @ rounded(ref.gemm.weight).T + rounded(ref.gemm.bias)
            mean, var = y.mean(0), y.var(0, unbiased=False)
            result[f"{name}, fp32 y"] = rel_err(softmax_of(y.float().double(), mean, var, dtype), want)
            result[f"{name}, {name} y"] = rel_err(softmax_of(rounded(y), mean, var, dtype), want)
            # 16-bit y less a shift per 256-row tile and column (the tile's first row of y, kept in
            # fp32 beside it): the softmax would add it back through its per-tile coefficients.
            shift = y[::256].float().double().repeat_interleave(256, 0)[:m]
            result[f"{name}, {name} y - tile shift"] = rel_err(
                softmax_of(rounded(y - shift) + shift, mean, var, dtype), want)
            # The same with the statistics epilogue's own shift: per 32 rows and column, the median of
            # the group's first three rows (kept in fp32, 1/16 of the 16-bit y's bytes).
            y32 = y.float().double()
            shift32 = torch.cat([y32[r:r + 32][:3].median(dim=0).values.expand(min(32, m - r), -1)
                                 for r in range(0, m, 32)])
            result[f"{name}, {name} y - group shift"] = rel_err(
                softmax_of(rounded(y - shift32) + shift32, mean, var, dtype), want)
            y16 = rounded(y)
            result[f"{name}, eager-like"] = rel_err(
                softmax_of(y16, y16.mean(0), y16.var(0, unbiased=False), dtype), want)
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="1024x1024x8192", help="M x N x K")
    p.add_argument("--bias-shift", type=float, default=0.0)
    a = p.parse_args(argv)
    m, n, k = (int(v) for v in a.size.split("x"))
    for name, err in errors(m, n, k, a.bias_shift).items():
        print(f"{name:18s} {err:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
