"""``FusedGemmBNSoftmax``: a drop-in nn.Module for Linear -> BatchNorm1d -> scale -> Softmax(dim=1)."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from .functional import ScaleLike, gemm_bn_softmax


_MISSING = object()


def _tensor_attr(module: nn.Module, name: str, registry: str):
    """``getattr(module, name)`` for a parameter (registry "_parameters") or buffer ("_buffers"),
    looked up in the module's own dict first: nn.Module.__getattr__ costs about 0.7 us a call, and
    the block's forward reads ten of them. A name that is not registered there (a parametrization's
    property, a plain attribute) takes the ordinary lookup."""
    value = getattr(module, registry).get(name, _MISSING)
    return getattr(module, name) if value is _MISSING else value


def has_hooks(module: nn.Module) -> bool:
    """Whether hooks are registered on the module itself (the fused op would not run them)."""
    return any(getattr(module, name, None) for name in (
        "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"))


def bn_buffers(bn: nn.BatchNorm1d, training: bool):
    """(running_mean, running_var, num_batches_tracked) as the op takes them under nn.BatchNorm1d's
    rules: running statistics unless training without tracking them; num_batches_tracked only when
    training with them (the op then increments it, and momentum=None averages cumulatively)."""
    track = bn.track_running_stats
    stats = not training or track
    return (_tensor_attr(bn, "running_mean", "_buffers") if stats else None,
            _tensor_attr(bn, "running_var", "_buffers") if stats else None,
            _tensor_attr(bn, "num_batches_tracked", "_buffers") if (training and track) else None)


def run_block(x: torch.Tensor, linear: nn.Linear, bn: nn.BatchNorm1d, scale: ScaleLike, training: bool,
              precision: Optional[str] = None, process_group: Optional[Any] = None) -> torch.Tensor:
    """softmax(scale * bn(linear(x)), dim=1) by the fused op, with the modules' own parameters and
    buffers (``bn_buffers``: nn.BatchNorm1d's rules for them in this training mode). In training,
    statistics over every rank of `process_group`, or of an nn.SyncBatchNorm's own group (None
    there: the default group), as nn.SyncBatchNorm computes."""
    group = process_group
    if group is None and isinstance(bn, nn.SyncBatchNorm) and dist.is_available():
        group = bn.process_group if bn.process_group is not None else dist.group.WORLD
    running_mean, running_var, num_batches_tracked = bn_buffers(bn, training)
    return gemm_bn_softmax(
        x, _tensor_attr(linear, "weight", "_parameters"), _tensor_attr(linear, "bias", "_parameters"),
        _tensor_attr(bn, "weight", "_parameters"), _tensor_attr(bn, "bias", "_parameters"), running_mean, running_var,
        scale, training=training, momentum=bn.momentum, eps=bn.eps,
        num_batches_tracked=num_batches_tracked, precision=precision, process_group=group)


class FusedGemmBNSoftmax(nn.Module):
    """Same constructor, parameters, buffers and state_dict keys as the reference model
    (``gemm.*``, ``bn.*``, ``scale``), so a reference state_dict loads unchanged.

    The submodules only hold state; forward runs the fused op. So hooks belong on this module: a
    forward with hooks on ``gemm`` or ``bn`` raises rather than skip them.

    Data-parallel training with statistics over the global batch (nn.SyncBatchNorm's semantics):
    ``nn.SyncBatchNorm.convert_sync_batchnorm(model)`` as for any model (``bn`` becomes an
    nn.SyncBatchNorm, whose process group is used; what DDP accepts on GPUs), or
    ``process_group=torch.distributed.group.WORLD`` (or any group; set after
    ``init_process_group``), which keeps ``bn`` an nn.BatchNorm1d and also works for CPU processes
    (DDP refuses nn.SyncBatchNorm on the CPU).
    """

    def __init__(self, in_features: int, out_features: int, bn_eps: float = 1e-5,
                 bn_momentum: Optional[float] = 0.1, scale_shape: Sequence[int] = (1,), *, bias: bool = True,
                 affine: bool = True, track_running_stats: bool = True, precision: Optional[str] = None,
                 process_group: Optional[Any] = None, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.gemm = nn.Linear(in_features, out_features, bias=bias, **factory)
        self.bn = nn.BatchNorm1d(out_features, eps=bn_eps, momentum=bn_momentum, affine=affine,
                                 track_running_stats=track_running_stats, **factory)
        self.scale = nn.Parameter(torch.ones(tuple(scale_shape), **factory))
        self.precision = precision
        self.process_group = process_group

    @classmethod
    def from_modules(cls, linear: nn.Linear, bn: nn.BatchNorm1d, scale=None,
                     precision: Optional[str] = None) -> "FusedGemmBNSoftmax":
        """Wraps existing modules (sharing their parameters and buffers). ``scale``: a Parameter,
        a tensor, a float, or None (1.0)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear must be nn.Linear, got {type(linear).__name__}")
        if not isinstance(bn, (nn.BatchNorm1d, nn.SyncBatchNorm)):
            raise TypeError(f"bn must be nn.BatchNorm1d or nn.SyncBatchNorm, got {type(bn).__name__}")
        if bn.num_features != linear.out_features:
            raise ValueError(f"bn.num_features ({bn.num_features}) != linear.out_features ({linear.out_features})")
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.gemm, self.bn, self.precision, self.process_group = linear, bn, precision, None
        w = linear.weight
        if scale is None or isinstance(scale, (int, float)):
            value = 1.0 if scale is None else float(scale)
            self.scale = nn.Parameter(torch.full((1,), value, device=w.device, dtype=w.dtype))
        elif isinstance(scale, nn.Parameter):
            self.scale = scale
        else:
            self.scale = nn.Parameter(scale.detach().clone())
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        modules = self._modules  # (not self.bn: nn.Module.__getattr__ is slow, see _tensor_attr)
        bn, gemm = modules["bn"], modules["gemm"]
        if has_hooks(gemm) or has_hooks(bn):
            raise RuntimeError("FusedGemmBNSoftmax runs gemm, bn and scale as one fused op, so hooks on its gemm or bn "
                               "submodule would not run; register them on the FusedGemmBNSoftmax module itself, or "
                               "use the unfused block")
        if bn.track_running_stats and (_tensor_attr(bn, "running_mean", "_buffers") is None
                                       or _tensor_attr(bn, "running_var", "_buffers") is None):
            # nn.BatchNorm1d would silently fall back to batch statistics here
            raise ValueError("FusedGemmBNSoftmax: bn.track_running_stats is True but bn.running_mean / "
                             "bn.running_var is None; restore them or set track_running_stats=False")
        return run_block(x, gemm, bn, _tensor_attr(self, "scale", "_parameters"), training=self.training,
                         precision=self.precision, process_group=self.process_group)

    def extra_repr(self) -> str:
        return (f"in_features={self.gemm.in_features}, out_features={self.gemm.out_features}, "
                f"eps={self.bn.eps}, momentum={self.bn.momentum}, scale_shape={tuple(self.scale.shape)}")
