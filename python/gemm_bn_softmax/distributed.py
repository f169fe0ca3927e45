"""Data-parallel training of the fused block with nn.SyncBatchNorm's semantics.

With data parallelism each rank holds part of the batch; nn.SyncBatchNorm normalises with the
statistics of the whole (global) batch. The fused op does the same in two halves around one
collective each way (``torch.distributed``, any backend: NCCL on GPUs, gloo on CPUs):

forward   ``gemm_column_moments``: y = x W^T + b and this rank's column moments
          [count, mean (N), M2 (N)] (float64) from the GEMM's statistics epilogue
          -> ``all_gather`` of the moments (2N + 1 doubles per rank)
          -> ``bn_softmax_from_moments``: every rank merges the records in rank order (Chan's
          formula), so all ranks get the same bits; running statistics move with the global count
backward  ``gemm_bn_softmax_backward_sums``: this rank's column sums [count, S1 (N), S2 (N)]
          -> ``all_gather`` of the sums, added in rank order
          -> ``gemm_bn_softmax_backward`` with them: dy normalises over the global batch; the
          parameter gradients are this rank's own, which the data-parallel wrapper (DDP) then
          averages over ranks as it does every gradient — what nn.SyncBatchNorm + DDP produce.

Uneven batches and ranks with no rows behave as in nn.SyncBatchNorm. Evaluation mode (running
statistics) and a group of one rank need no exchange and run the single-device op.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from . import _library  # noqa: F401  (registers torch.ops.fused)

_ops = torch.ops.fused


def needs_sync(process_group, training: bool) -> bool:
    """nn.SyncBatchNorm's rule: statistics are exchanged when training in an initialised process
    group of more than one rank."""
    if not training or not dist.is_available() or not dist.is_initialized():
        return False
    return dist.get_world_size(process_group) > 1


def _all_gather(record: torch.Tensor, group) -> torch.Tensor:
    """(world_size, len(record)): every rank's record in rank order."""
    world = dist.get_world_size(group)
    if dist.get_backend(group) == "nccl":  # one flat buffer, no list of tensors
        out = record.new_empty((world, record.numel()))
        dist.all_gather_into_tensor(out, record, group=group)
        return out
    parts = [torch.empty_like(record) for _ in range(world)]
    dist.all_gather(parts, record, group=group)
    return torch.stack(parts)


def _resolved_precision(linear_dtype: torch.dtype, precision: Optional[str]) -> Optional[str]:
    """The float32 GEMM precision fixed at the forward, for the backward's GEMMs."""
    if linear_dtype != torch.float32:
        return None
    if precision is not None:
        return "highest" if precision == "highest" else "tf32"
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "highest"


def _autocast_dtypes(x: torch.Tensor, scale: torch.Tensor, compute_dtype, out_dtype):
    """The dtypes the eager block runs in under torch.autocast (the op's autocast rule): the Linear in
    the autocast dtype; out fp32 on CUDA (softmax is on its fp32 list), else the promoted dtype."""
    device = x.device.type
    if not torch.is_autocast_enabled(device):
        return compute_dtype, out_dtype
    linear = compute_dtype or torch.get_autocast_dtype(device)
    if out_dtype is None:
        out_dtype = torch.float32 if device == "cuda" else torch.result_type(scale, torch.empty(0, dtype=linear))
    return linear, out_dtype


class _SyncGemmBnSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, bn_weight, bn_bias, scale, running_mean, running_var, num_batches_tracked,
                momentum, eps, precision, path, compute_dtype, out_dtype, group):
        linear = compute_dtype or x.dtype
        # Rounded once here, so that the backward's GEMMs reuse the copies.
        xc, wc = x.to(linear), weight.to(linear)
        bc = bias.to(linear) if bias is not None else None
        y, moments = _ops.gemm_column_moments(xc, wc, bc, precision, path, None)
        rank_moments = _all_gather(moments, group)
        out, mean, invstd, row_lse = _ops.bn_softmax_from_moments(
            y, rank_moments, bn_weight, bn_bias, running_mean, running_var, num_batches_tracked, scale, momentum,
            eps, linear, out_dtype or linear)
        wants_w, wants_x = ctx.needs_input_grad[1], ctx.needs_input_grad[0]
        ctx.save_for_backward(y, mean, invstd, row_lse, xc if wants_w else None, wc if wants_x else None, bn_weight,
                              bn_bias, scale)
        ctx.group = group
        ctx.precision = _resolved_precision(linear, precision)
        ctx.linear_grad_dtype = weight.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        y, mean, invstd, row_lse, xc, wc, bn_weight, bn_bias, scale = ctx.saved_tensors
        sums, row_dot = _ops.gemm_bn_softmax_backward_sums(grad_out, y, mean, invstd, row_lse, bn_weight, bn_bias,
                                                          scale)
        rank_sums = _all_gather(sums, ctx.group)
        needs = ctx.needs_input_grad
        mask = [needs[0], needs[1], needs[2], bn_weight is not None and needs[3],
                bn_bias is not None and needs[4], needs[5]]
        grads = _ops.gemm_bn_softmax_backward(grad_out, y, mean, invstd, row_lse, xc, wc, bn_weight, bn_bias, scale,
                                              True, mask, ctx.precision, ctx.linear_grad_dtype, row_dot, sums,
                                              rank_sums)
        return (*grads, *([None] * 10))


def sync_gemm_bn_softmax(x, weight, bias, bn_weight, bn_bias, running_mean, running_var, scale: torch.Tensor,
                         momentum, eps, num_batches_tracked, precision, path, compute_dtype, out_dtype,
                         process_group) -> torch.Tensor:
    """The training forward with statistics over every rank of ``process_group`` (see the module
    docstring); the functional API's ``gemm_bn_softmax(..., process_group=)`` calls this."""
    compute_dtype, out_dtype = _autocast_dtypes(x, scale, compute_dtype, out_dtype)
    with torch.autocast(x.device.type, enabled=False):
        return _SyncGemmBnSoftmax.apply(x, weight, bias, bn_weight, bn_bias, scale, running_mean, running_var,
                                        num_batches_tracked, momentum, eps, precision, path, compute_dtype,
                                        out_dtype, process_group)
