"""``convert(model)``: swaps Linear -> BatchNorm1d -> scale -> Softmax(dim=1) blocks for the fused module."""
from __future__ import annotations

from typing import List, Optional

import torch
import torch.nn as nn

from .module import FusedGemmBNSoftmax


class Scale(nn.Module):
    """Multiplies by a learnable scale (a scalar or per-column); use it inside nn.Sequential so
    that ``convert`` can recognise Linear -> BatchNorm1d -> Scale -> Softmax(dim=1)."""

    def __init__(self, scale_shape=(1,), device=None, dtype=None):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(tuple(scale_shape), device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


def _is_softmax_dim1(m: nn.Module) -> bool:
    return isinstance(m, nn.Softmax) and m.dim in (1, -1)


def _is_reference_block(m: nn.Module) -> bool:
    """The reference model's structure: gemm (Linear), bn (BatchNorm1d), scale (Parameter),
    softmax (Softmax(dim=1)), and nothing else with state."""
    children = dict(m.named_children())
    return (
        set(children) == {"gemm", "bn", "softmax"}
        and isinstance(children["gemm"], nn.Linear)
        and type(children["bn"]) is nn.BatchNorm1d
        and _is_softmax_dim1(children["softmax"])
        and isinstance(getattr(m, "scale", None), nn.Parameter)
        and {n for n, _ in m.named_parameters(recurse=False)} == {"scale"}
        and children["bn"].num_features == children["gemm"].out_features
    )


def _sequential_window(mods: List[nn.Module], i: int) -> Optional[int]:
    """Length of a fusable window starting at i in a Sequential, or None."""
    if i + 2 >= len(mods):
        return None
    lin, bn = mods[i], mods[i + 1]
    if not (isinstance(lin, nn.Linear) and type(bn) is nn.BatchNorm1d and bn.num_features == lin.out_features):
        return None
    if _is_softmax_dim1(mods[i + 2]):
        return 3
    if i + 3 < len(mods) and isinstance(mods[i + 2], Scale) and _is_softmax_dim1(mods[i + 3]):
        return 4
    return None


def _convert_sequential(seq: nn.Sequential, precision: Optional[str]) -> nn.Module:
    mods = list(seq)
    out: List[nn.Module] = []
    i = 0
    changed = False
    while i < len(mods):
        n = _sequential_window(mods, i)
        if n is None:
            out.append(mods[i])
            i += 1
            continue
        scale = mods[i + 2].scale if n == 4 else None
        out.append(FusedGemmBNSoftmax.from_modules(mods[i], mods[i + 1], scale, precision=precision))
        i += n
        changed = True
    return nn.Sequential(*out) if changed else seq


def convert(model: nn.Module, precision: Optional[str] = None) -> nn.Module:
    """Returns ``model`` with every fusable block replaced (in place where possible):

    * a module shaped like the reference model (children ``gemm``/``bn``/``softmax``, parameter ``scale``),
    * inside an ``nn.Sequential``: ``Linear, BatchNorm1d, Softmax(dim=1)`` or
      ``Linear, BatchNorm1d, Scale, Softmax(dim=1)``.

    Parameters and buffers are shared with the original modules, so training state carries over.
    """
    if _is_reference_block(model):
        return _fuse_reference(model, precision)
    if isinstance(model, nn.Sequential):
        model = _convert_sequential(model, precision)
    for name, child in list(model.named_children()):
        if isinstance(child, FusedGemmBNSoftmax):
            continue
        new = convert(child, precision)
        if new is not child:
            setattr(model, name, new)
    return model


def _fuse_reference(block: nn.Module, precision: Optional[str]) -> FusedGemmBNSoftmax:
    fused = FusedGemmBNSoftmax.from_modules(block.gemm, block.bn, block.scale, precision=precision)
    fused.train(block.training)
    return fused
