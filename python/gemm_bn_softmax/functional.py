"""Functional API: ``gemm_bn_softmax(x, weight, ...)`` = softmax(scale * BatchNorm1d(x @ W^T + b), dim=1).

Thin over ``torch.ops.fused.gemm_bn_softmax``, which is itself differentiable (its backward is
``torch.ops.fused.gemm_bn_softmax_backward``) and autocast-aware; this adds the float-scale
convenience and keyword arguments.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import torch

from . import _library  # noqa: F401  (registers torch.ops.fused)

_op = torch.ops.fused.gemm_bn_softmax.default

ScaleLike = Union[float, int, torch.Tensor]


def _as_scale_tensor(scale: ScaleLike, like: torch.Tensor) -> torch.Tensor:
    if isinstance(scale, torch.Tensor):
        return scale
    if isinstance(scale, bool) or not isinstance(scale, (float, int)):
        raise TypeError(f"scale must be a float or a tensor, got {type(scale).__name__}")
    # A 0-dim tensor promotes like the Python number it stands for (CPU autocast keeps bf16 for
    # `2.0 * bf16`). torch.full is a device fill: no host-to-device copy, safe under CUDA graph capture.
    return torch.full((), float(scale), dtype=torch.float32, device=like.device)


def _group_name(process_group) -> Optional[str]:
    """The name torch.distributed registered ``process_group`` under, which the op takes
    (``group_name=``) to exchange statistics over it; None for None."""
    return None if process_group is None else process_group.group_name


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
    compute_dtype: Optional[torch.dtype] = None,
    out_dtype: Optional[torch.dtype] = None,
    process_group: Optional[Any] = None,
) -> torch.Tensor:
    """softmax(scale * batch_norm(x @ weight.T + bias), dim=1), as Linear -> BatchNorm1d -> scale -> Softmax(1).

    Differentiable with respect to x, weight, bias, bn_weight, bn_bias and a tensor scale (fused
    backward kernels; the backward's GEMMs run in the forward's precision). Under torch.autocast the
    Linear part runs in the autocast dtype and the output has the dtype the eager block gives.

    Args:
        x: (M, K) input; float32, bfloat16 or float16. The output has x's dtype (see out_dtype).
        weight: (N, K) nn.Linear weight, same dtype as x (see compute_dtype). bias: (N,) or None.
        bn_weight, bn_bias: BatchNorm affine (N,) or None (affine=False).
        running_mean, running_var: (N,) running statistics, updated in place when batch
            statistics are used (training, as nn.BatchNorm1d); None = track_running_stats=False.
        scale: a float, a 1-element tensor or an (N,) tensor.
        momentum: running-stat momentum; None = cumulative average (needs num_batches_tracked).
        num_batches_tracked: int64 one-element tensor, incremented in training like nn.BatchNorm1d.
        precision: float32 inputs only: None follows torch.get_float32_matmul_precision();
            "highest" is fp32-exact, "high"/"medium"/"tf32" allow TF32 tensor cores, "3xtf32" is
            fp32-grade on TF32 tensor cores (three TF32 products per multiply, partial sums added in
            fp32 every 32 K-elements; forward and backward GEMMs), asked for by name only. 3xtf32
            runs on Hopper's sm90 kernels only (aligned operands: K and N multiples of 4): elsewhere it
            raises rather than run less accurately. On the CPU every precision computes exactly.
        path: None/"auto", "sm90", "generic" or "recompute" to force a CUDA path (also
            GEMM_BN_SOFTMAX_PATH). "recompute" (by name only; K <= 128 in bf16/fp16, K <= 64 in
            tf32; no gradient may be asked for) never allocates the (M, N) fp32 y: it recomputes
            the small-K GEMM in each of three passes instead. It saves that memory, not time
            (about 1.3x slower than "sm90" at 4096 x 8192 x 64 on an H200).
        compute_dtype: the dtype the Linear part runs in (x, weight, bias rounded to it; their
            gradients come back in their own dtypes); None: x's dtype. Autocast sets it.
        out_dtype: dtype of the output; None: the compute dtype. Autocast sets it (fp32 on CUDA).
        process_group: a ``torch.distributed`` process group (e.g. ``torch.distributed.group.WORLD``)
            to normalise over the whole data-parallel batch, as nn.SyncBatchNorm: in training, with
            more than one rank, the batch statistics are those of every rank's rows (one all_gather
            in the forward and one in the backward, made by the op itself; see
            gemm_bn_softmax.distributed). None: this call's rows only.
    """
    scale_t = _as_scale_tensor(scale, x)
    # y is not returned, so the op need not keep it (it still does when a backward may read it).
    return _op(x, weight, bias, bn_weight, bn_bias, running_mean, running_var, num_batches_tracked,
               scale_t, training, momentum, eps, precision, path, compute_dtype, out_dtype, False,
               _group_name(process_group))[0]


def dispatch_path(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                  precision: Optional[str] = None, path: Optional[str] = None, differentiable: bool = True) -> str:
    """Which implementation gemm_bn_softmax would run for these operands: "cpu", "sm90", "generic"
    or "recompute". ``differentiable=False`` asks for a call no gradient can be asked of (inference,
    ``torch.no_grad()``), where y need not be kept."""
    return torch.ops.fused.dispatch_path(x, weight, bias, precision, path, differentiable)
