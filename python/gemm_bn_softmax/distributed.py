"""Multi-GPU training of the fused block: data parallelism with nn.SyncBatchNorm's semantics, and
column (vocab) parallelism.

Data parallelism: each rank holds part of the batch; nn.SyncBatchNorm normalises with the statistics
of the whole (global) batch. The op does the same when given a process group
(``gemm_bn_softmax(..., process_group=)``, ``FusedGemmBNSoftmax`` with an nn.SyncBatchNorm or a
``process_group``): it passes the group's registered name (``group_name``) to
``torch.ops.fused.gemm_bn_softmax``, which makes one collective each way itself, in C++
(``torch.distributed``'s process group, any backend: NCCL on GPUs, gloo on CPUs):

forward   y = x W^T + b and this rank's column moments [count, mean (N), M2 (N)] (float64) from the
          GEMM's statistics epilogue -> ``all_gather`` of the moments (2N + 1 doubles per rank) ->
          every rank merges the records in rank order (Chan's formula), so all ranks get the same
          bits; running statistics move with the global count; BatchNorm and softmax
backward  this rank's column sums [count, S1 (N), S2 (N)] -> ``all_gather`` of the sums, added in
          rank order -> dy normalised over the global batch; the parameter gradients are this
          rank's own, which the data-parallel wrapper (DDP) then averages over ranks as it does
          every gradient: what nn.SyncBatchNorm + DDP produce.

The steps are ops of their own (``gemm_column_moments``, ``bn_softmax_from_moments``,
``gemm_bn_softmax_backward_sums`` and the backward's ``row_sums`` / ``local_sums`` / ``rank_sums``)
for callers that make the exchange themselves. Uneven batches and ranks with no rows behave as in
nn.SyncBatchNorm. Evaluation mode and a group of one rank make no exchange.

Column parallelism (``column_parallel_gemm_bn_softmax``, ``ColumnParallelFusedGemmBNSoftmax``):
W's rows (the out_features, e.g. a classifier over 100k+ classes) split over ranks, each rank
computing its columns; BatchNorm is per column, so local; the softmax spans all columns: an
all_gather of each row's log-normaliser in the forward and of the row sums in the backward, and
an all_reduce of dx.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from . import _library  # noqa: F401  (registers torch.ops.fused)
from .functional import _as_scale_tensor
from .module import bn_buffers

_ops = torch.ops.fused


@functools.lru_cache(maxsize=None)
def _blocking_allgather_options():
    """What all_gather_into_tensor(async_op=False) passes to the process group: on recent torch,
    NCCL then runs the collective on the current stream instead of its own."""
    from torch.distributed.distributed_c10d import AllgatherOptions

    opts = AllgatherOptions()
    if hasattr(opts, "asyncOp"):
        opts.asyncOp = False
    return opts


def exchange_records(record: torch.Tensor, group) -> torch.Tensor:
    """(world_size, record.numel()): every rank's record, flattened, in rank order (column
    parallelism's exchanges). Gathered into one flat buffer (NCCL and gloo both do that) and viewed
    as rows; torch.compile (2.11) refuses a 2-D buffer."""
    world = group.size()
    record = record.reshape(-1)  # gloo wants the input shaped as one chunk of the flat output
    out = record.new_empty(world * record.numel())
    if torch.compiler.is_compiling():  # the call torch.compile knows how to trace
        dist.all_gather_into_tensor(out, record.contiguous(), group=group)
    else:
        # The process group's own call, which all_gather_into_tensor makes after its Python checks
        # (about 60 us of host time per call on the H200 pair). NCCL (asyncOp=False) runs it on the
        # current stream and returns no Work; a backend that returns one (gloo) is waited on.
        work = group._allgather_base(out, record.contiguous(), _blocking_allgather_options())
        if work is not None:
            work.wait()
    return out.view(world, record.numel())


def _resolved_precision(linear_dtype: torch.dtype, precision: Optional[str]) -> Optional[str]:
    """The float32 GEMM precision fixed at the forward, for the backward's GEMMs (the op's own rule:
    "highest" and "3xtf32" as named, "high" / "medium" / "tf32" as "tf32", None from torch's flag)."""
    if linear_dtype != torch.float32:
        return None
    if precision is not None:
        return precision if precision in ("highest", "3xtf32") else "tf32"
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


def _autocast_off(device_type: str):
    """Autocast switched off for the Function (which takes its dtypes from _autocast_dtypes); a
    no-op context where it is off already: entering torch.autocast costs host time."""
    return torch.autocast(device_type, enabled=False) if torch.is_autocast_enabled(device_type) \
        else contextlib.nullcontext()


def _linear_operands(x, weight, bias, linear: torch.dtype):
    """x, weight and bias in the Linear's compute dtype, rounded once in the forward so that the
    backward's GEMMs reuse the copies."""
    return x.to(linear), weight.to(linear), bias.to(linear) if bias is not None else None


def _save_for_backward(ctx, y, mean, invstd, row_lse, xc, wc, linear_inputs, bn_weight, bn_bias, scale, linear,
                       precision, group):
    """What the Function's backward reads: the op's saved outputs, x (compute dtype) only when the
    weight needs a gradient, the weight only when x does, the BN parameters and scale."""
    wants_w, wants_x = ctx.needs_input_grad[1], ctx.needs_input_grad[0]
    ctx.save_for_backward(y, mean, invstd, row_lse, xc if wants_w else None, wc if wants_x else None, bn_weight,
                          bn_bias, scale)
    ctx.group = group
    ctx.precision = _resolved_precision(linear, precision)
    # The op's autograd rule: the gradients of x, weight and bias in the widest of their dtypes, which
    # autograd rounds to each input's own.
    ctx.linear_grad_dtype = functools.reduce(torch.promote_types, (t.dtype for t in linear_inputs if t is not None))


def _grad_mask(ctx, bn_weight, bn_bias):
    """The backward op's output_mask, from the Function's argument order x, weight, bias, bn_weight,
    bn_bias, scale."""
    needs = ctx.needs_input_grad
    return [needs[0], needs[1], needs[2], bn_weight is not None and needs[3], bn_bias is not None and needs[4],
            needs[5]]


# ---- column parallelism (W's rows split over ranks: Megatron's vocab-parallel layout) -----------------

def _all_gather_sum(t: torch.Tensor, group) -> torch.Tensor:
    """Sum over ranks, added in rank order: the same bits on every rank; t's shape."""
    return exchange_records(t, group).sum(0).view(t.shape)


class _ColumnParallelGemmBnSoftmax(torch.autograd.Function):
    """Each rank holds out_features / world_size rows of W (and the matching bias, BatchNorm
    vectors and per-column scale) and computes those columns of the output. BatchNorm is per
    column, so each rank's statistics are its own; the softmax spans every rank's columns: each
    row's log-normaliser is combined over ranks (one all_gather of M floats), and in the backward
    each row's sums of g * out and of out (one more, 2M doubles: the backward divides each
    recomputed row by its sum). dx sums every rank's share (all_reduce), as the
    input of a column-parallel Linear does."""

    @staticmethod
    def forward(ctx, x, weight, bias, bn_weight, bn_bias, scale, running_mean, running_var, num_batches_tracked,
                training, momentum, eps, precision, path, compute_dtype, out_dtype, group, per_column_scale):
        linear = compute_dtype or x.dtype
        xc, wc, bc = _linear_operands(x, weight, bias, linear)
        out, mean, invstd, y, row_lse = _ops.gemm_bn_softmax(
            xc, wc, bc, bn_weight, bn_bias, running_mean, running_var, num_batches_tracked, scale, training, momentum,
            eps, precision, path, None, out_dtype or linear)
        # The whole row's log-normaliser, and this rank's columns renormalised to it: float32 math,
        # rounded once to out's dtype.
        lse = torch.logsumexp(exchange_records(row_lse, group), dim=0)
        factor = torch.exp(row_lse - lse)[:, None]
        if torch.compiler.is_compiling():
            # torch 2.11's torch.compile returns wrong outputs when this Function mutates its own
            # output, and traces the backward with zero gradients after a no-op .to() on it.
            scaled = out * factor
            out = scaled if scaled.dtype == out.dtype else scaled.to(out.dtype)
        else:
            # In place: the same bits as (out * factor).to(out.dtype), without writing an (M, N_r)
            # float32 temporary and reading it back. out is this Function's own, never saved.
            out.mul_(factor)
        _save_for_backward(ctx, y, mean, invstd, lse, xc, wc, (x, weight, bias), bn_weight, bn_bias, scale, linear,
                           precision, group)
        ctx.batch_stats = training or running_mean is None
        ctx.per_column_scale = per_column_scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        y, mean, invstd, lse, xc, wc, bn_weight, bn_bias, scale = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        args = (grad_out, y, mean, invstd, lse, bn_weight, bn_bias, scale)
        _, local_row_sums = _ops.gemm_bn_softmax_backward_sums(*args)
        row_sums = _all_gather_sum(local_row_sums, ctx.group)  # over every rank's columns
        sums, _ = _ops.gemm_bn_softmax_backward_sums(*args, row_sums)
        grads = list(_ops.gemm_bn_softmax_backward(grad_out, y, mean, invstd, lse, xc, wc, bn_weight, bn_bias, scale,
                                                   ctx.batch_stats, _grad_mask(ctx, bn_weight, bn_bias), ctx.precision,
                                                   ctx.linear_grad_dtype, row_sums, sums, sums[None]))
        if grads[0] is not None:  # x is every rank's input: its gradient sums every rank's columns
            dist.all_reduce(grads[0], group=ctx.group)
        if grads[5] is not None and not ctx.per_column_scale:  # a shared scale: every rank's columns
            grads[5] = _all_gather_sum(grads[5], ctx.group)
        return (*grads, *([None] * 12))


def column_parallel_gemm_bn_softmax(x, weight, bias=None, bn_weight=None, bn_bias=None, running_mean=None,
                                    running_var=None, scale=1.0, training=True, momentum=0.1, eps=1e-5, *,
                                    process_group, num_batches_tracked=None, precision=None, path=None,
                                    compute_dtype=None, out_dtype=None,
                                    per_column_scale: Optional[bool] = None) -> torch.Tensor:
    """This rank's columns of softmax(scale * batch_norm(x @ W^T + b), dim=1) where W's rows (the
    out_features) are split over the ranks of ``process_group``, in rank order: ``weight`` is this
    rank's (N_r, K) block, ``bias``, the BatchNorm vectors and a per-column ``scale`` its N_r
    entries; a scalar scale is shared by all ranks. ``x`` is the same on every rank. The result is
    the unsharded block's output columns of this rank; gradients likewise (x's summed over ranks).
    ``per_column_scale``: whether ``scale`` holds this rank's columns' entries (True) or the one value
    all ranks share (False); None infers it from the size, which a rank holding one column cannot do
    for a one-element tensor: there it must be given (every rank must agree, since a shared scale's
    gradient is summed over the ranks)."""
    scale_t = _as_scale_tensor(scale, x)
    if per_column_scale is None:
        if isinstance(scale, torch.Tensor) and scale.numel() == 1 and weight.shape[0] == 1:
            raise ValueError("column_parallel_gemm_bn_softmax: this rank holds one column, so a one-element scale "
                             "may be its per-column entry or the shared scalar; pass per_column_scale=True or False")
        per_column_scale = scale_t.numel() != 1  # (a rank without columns: no entries)
    compute_dtype, out_dtype = _autocast_dtypes(x, scale_t, compute_dtype, out_dtype)
    with _autocast_off(x.device.type):
        return _ColumnParallelGemmBnSoftmax.apply(x, weight, bias, bn_weight, bn_bias, scale_t, running_mean,
                                                  running_var, num_batches_tracked, training, momentum, eps,
                                                  precision, path, compute_dtype, out_dtype, process_group,
                                                  per_column_scale)


def column_split(out_features: int, world_size: int, rank: int) -> slice:
    """The columns of rank ``rank``: contiguous blocks in rank order, the first ``out_features %
    world_size`` ranks one column more."""
    base, extra = divmod(out_features, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


class ColumnParallelFusedGemmBNSoftmax(nn.Module):
    """Linear -> BatchNorm1d -> scale -> Softmax(dim=1) with out_features split over the ranks of
    ``process_group`` (``column_split``): this rank holds its rows of W and its columns' bias,
    BatchNorm parameters and statistics and (per-column) scale, and returns its columns of the
    output. Build it directly, or from an unsharded block with ``from_full``."""

    def __init__(self, in_features: int, out_features: int, process_group, bn_eps: float = 1e-5,
                 bn_momentum: Optional[float] = 0.1, scale_shape=(1,), *, bias: bool = True, affine: bool = True,
                 track_running_stats: bool = True, precision: Optional[str] = None, device=None, dtype=None):
        super().__init__()
        if tuple(scale_shape) not in ((1,), (out_features,)):
            raise ValueError(f"scale_shape must be (1,) or (out_features,) = ({out_features},), got {scale_shape}")
        self.process_group = process_group
        self.in_features, self.out_features = in_features, out_features
        self.columns = column_split(out_features, dist.get_world_size(process_group), dist.get_rank(process_group))
        local = self.columns.stop - self.columns.start
        factory = {"device": device, "dtype": dtype}
        self.gemm = nn.Linear(in_features, local, bias=bias, **factory)
        self.bn = nn.BatchNorm1d(local, eps=bn_eps, momentum=bn_momentum, affine=affine,
                                 track_running_stats=track_running_stats, **factory)
        # Per column unless (1,): a rank holding one column has a one-element scale either way.
        self.per_column_scale = tuple(scale_shape) != (1,)
        self.scale = nn.Parameter(torch.ones(local if self.per_column_scale else 1, **factory))
        self.precision = precision

    @classmethod
    def from_full(cls, full: nn.Module, process_group, precision: Optional[str] = None):
        """This rank's share of an unsharded block (a FusedGemmBNSoftmax or anything with the same
        ``gemm`` / ``bn`` / ``scale`` members), copied."""
        linear, bn, scale = full.gemm, full.bn, full.scale
        self = cls(linear.in_features, linear.out_features, process_group, bn.eps, bn.momentum,
                   tuple(scale.shape) if scale.numel() > 1 else (1,), bias=linear.bias is not None,
                   affine=bn.affine, track_running_stats=bn.track_running_stats, precision=precision,
                   device=linear.weight.device, dtype=linear.weight.dtype)
        cols = self.columns
        with torch.no_grad():
            self.gemm.weight.copy_(linear.weight[cols])
            if linear.bias is not None:
                self.gemm.bias.copy_(linear.bias[cols])
            if bn.affine:
                self.bn.weight.copy_(bn.weight[cols])
                self.bn.bias.copy_(bn.bias[cols])
            if bn.track_running_stats:
                self.bn.running_mean.copy_(bn.running_mean[cols])
                self.bn.running_var.copy_(bn.running_var[cols])
                self.bn.num_batches_tracked.copy_(bn.num_batches_tracked)
            self.scale.copy_(scale if scale.numel() == 1 else scale.reshape(-1)[cols])
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bn, training = self.bn, self.training
        running_mean, running_var, num_batches_tracked = bn_buffers(bn, training)
        return column_parallel_gemm_bn_softmax(
            x, self.gemm.weight, self.gemm.bias, bn.weight, bn.bias, running_mean, running_var,
            self.scale, training=training, momentum=bn.momentum, eps=bn.eps, process_group=self.process_group,
            num_batches_tracked=num_batches_tracked, precision=self.precision,
            per_column_scale=self.per_column_scale)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"columns=[{self.columns.start}, {self.columns.stop})")
