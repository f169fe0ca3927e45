"""Functional API: ``gemm_bn_softmax(x, weight, ...)`` = softmax(scale * BatchNorm1d(x @ W^T + b), dim=1).

Thin over ``torch.ops.fused.gemm_bn_softmax`` (the kernels are in C++/CUDA); adds the
float-scale convenience, ``momentum=None`` via ``num_batches_tracked``, and the backward.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from . import _library  # noqa: F401  (registers torch.ops.fused)

_op = torch.ops.fused.gemm_bn_softmax.default

ScaleLike = Union[float, int, torch.Tensor]


def _as_scale_tensor(scale: ScaleLike, like: torch.Tensor) -> torch.Tensor:
    if isinstance(scale, torch.Tensor):
        return scale
    if isinstance(scale, bool) or not isinstance(scale, (float, int)):
        raise TypeError(f"scale must be a float or a tensor, got {type(scale).__name__}")
    # torch.full is a device fill: no host-to-device copy, safe under CUDA graph capture.
    return torch.full((1,), float(scale), dtype=torch.float32, device=like.device)


def _batch_stats_used(training: bool, running_mean: Optional[torch.Tensor]) -> bool:
    return training or running_mean is None


class _GemmBnSoftmax(torch.autograd.Function):
    """Forward through the fused op; backward in plain torch from the saved y, mean, invstd."""

    @staticmethod
    def forward(ctx, x, weight, bias, bn_weight, bn_bias, scale, running_mean, running_var, num_batches_tracked,
                training, momentum, eps, precision, path):
        out, save_mean, save_invstd, y = _op(x, weight, bias, bn_weight, bn_bias, running_mean, running_var,
                                             num_batches_tracked, scale, training, momentum, eps, precision, path)
        ctx.batch_stats = _batch_stats_used(training, running_mean)
        ctx.has_bias = bias is not None
        ctx.affine = bn_weight is not None
        ctx.save_for_backward(x, weight, bn_weight, bn_bias, scale, out, save_mean, save_invstd, y)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, bn_weight, bn_bias, scale, out, mean, invstd, y = ctx.saved_tensors
        f32 = torch.float32
        out32, g32 = out.to(f32), grad_out.to(f32)
        xhat = (y - mean) * invstd
        gamma = bn_weight.to(f32) if ctx.affine else None
        beta = bn_bias.to(f32) if ctx.affine else None
        bn = xhat * gamma + beta if ctx.affine else xhat
        s = scale.to(f32).reshape(-1)
        # softmax backward
        dz = out32 * (g32 - (g32 * out32).sum(dim=1, keepdim=True))
        d_scale = None
        if ctx.needs_input_grad[5]:
            d_scale = (dz * bn).sum() if s.numel() == 1 else (dz * bn).sum(dim=0)
            d_scale = d_scale.reshape(scale.shape).to(scale.dtype)
        dbn = dz * s
        d_gamma = (dbn * xhat).sum(dim=0).to(bn_weight.dtype) if ctx.affine and ctx.needs_input_grad[3] else None
        d_beta = dbn.sum(dim=0).to(bn_bias.dtype) if ctx.affine and ctx.needs_input_grad[4] else None
        dxhat = dbn * gamma if ctx.affine else dbn
        if ctx.batch_stats:
            dy = invstd * (dxhat - dxhat.mean(dim=0) - xhat * (dxhat * xhat).mean(dim=0))
        else:
            dy = dxhat * invstd
        dx = (dy @ weight.to(f32)).to(x.dtype) if ctx.needs_input_grad[0] else None
        dw = (dy.t() @ x.to(f32)).to(weight.dtype) if ctx.needs_input_grad[1] else None
        db = dy.sum(dim=0).to(weight.dtype) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db, d_gamma, d_beta, d_scale, None, None, None, None, None, None, None, None


def gemm_bn_softmax(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    bn_weight: Optional[torch.Tensor] = None,
    bn_bias: Optional[torch.Tensor] = None,
    running_mean: Optional[torch.Tensor] = None,
    running_var: Optional[torch.Tensor] = None,
    scale: ScaleLike = 1.0,
    training: bool = True,
    momentum: Optional[float] = 0.1,
    eps: float = 1e-5,
    *,
    num_batches_tracked: Optional[torch.Tensor] = None,
    precision: Optional[str] = None,
    path: Optional[str] = None,
) -> torch.Tensor:
    """softmax(scale * batch_norm(x @ weight.T + bias), dim=1), as Linear -> BatchNorm1d -> scale -> Softmax(1).

    Args:
        x: (M, K) input; float32, bfloat16 or float16. The output has x's dtype.
        weight: (N, K) nn.Linear weight, same dtype as x. bias: (N,) or None.
        bn_weight, bn_bias: BatchNorm affine (N,) or None (affine=False).
        running_mean, running_var: (N,) running statistics, updated in place when batch
            statistics are used (training, as nn.BatchNorm1d); None = track_running_stats=False.
        scale: a float, a 1-element tensor or an (N,) tensor.
        momentum: running-stat momentum; None = cumulative average (needs num_batches_tracked).
        num_batches_tracked: int64 one-element tensor, incremented in training like nn.BatchNorm1d.
        precision: float32 inputs only: None follows torch.get_float32_matmul_precision();
            "highest" is fp32-exact, "high"/"medium"/"tf32" allow TF32 tensor cores.
        path: None/"auto", "sm90" or "generic" to force a CUDA path (also GEMM_BN_SOFTMAX_PATH).
    """
    scale_t = _as_scale_tensor(scale, x)
    args = (x, weight, bias, bn_weight, bn_bias, scale_t)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in args):
        return _GemmBnSoftmax.apply(x, weight, bias, bn_weight, bn_bias, scale_t, running_mean, running_var,
                                    num_batches_tracked, training, momentum, eps, precision, path)
    return _op(x, weight, bias, bn_weight, bn_bias, running_mean, running_var, num_batches_tracked, scale_t,
               training, momentum, eps, precision, path)[0]


def dispatch_path(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                  precision: Optional[str] = None, path: Optional[str] = None) -> str:
    """Which implementation gemm_bn_softmax would run for these operands: "cpu", "sm90" or "generic"."""
    return torch.ops.fused.dispatch_path(x, weight, bias, precision, path)
