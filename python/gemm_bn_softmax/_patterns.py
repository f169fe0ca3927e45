"""Recognising the pieces of Linear -> BatchNorm1d -> scale -> softmax(dim=1) in torch.fx graphs.

Shared by ``convert()`` (a module's own forward, traced by torch.fx) and the torch.compile pass
(Dynamo's torch-level graph). Calls are recognised with every argument spelling (positional or
keyword, function or method form) and anything unusual is rejected, never guessed.
"""
from __future__ import annotations

import operator
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
import torch.fx
import torch.nn.functional as F

# dtypes the op computes in; x, weight and the BatchNorm tensors must share one of them.
OP_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Parameter names of each spelling, in positional order ("self" for a method's tensor).
_SOFTMAX_SIGNATURES: Dict[Any, Sequence[str]] = {
    F.softmax: ("input", "dim", "_stacklevel", "dtype"),
    torch.softmax: ("input", "dim", "dtype"),
    torch.special.softmax: ("input", "dim", "dtype"),
    "softmax": ("input", "dim", "dtype"),
}
_MUL_SIGNATURES: Dict[Any, Sequence[str]] = {
    operator.mul: ("input", "other"),
    torch.mul: ("input", "other"),
    "mul": ("input", "other"),
}


def _signature(node: torch.fx.Node, table: Dict[Any, Sequence[str]]) -> Optional[Sequence[str]]:
    if node.op == "call_function":
        return table.get(node.target)
    if node.op == "call_method" and isinstance(node.target, str):
        return table.get(node.target)
    return None


def bind(node: torch.fx.Node, names: Sequence[str]) -> Optional[Dict[str, Any]]:
    """The node's arguments by parameter name, or None when they do not fit ``names``
    (too many, unknown keywords such as ``out=``, or one given twice)."""
    if len(node.args) > len(names):
        return None
    bound = dict(zip(names, node.args))
    for key, value in node.kwargs.items():
        if key not in names or key in bound:
            return None
        bound[key] = value
    return bound


def softmax_call(node: torch.fx.Node) -> Optional[Tuple[Any, Any, Any]]:
    """(input, dim, dtype) of a softmax written as F.softmax, torch.softmax, torch.special.softmax or
    Tensor.softmax; None for any other node."""
    names = _signature(node, _SOFTMAX_SIGNATURES)
    bound = bind(node, names) if names else None
    if bound is None or "input" not in bound:
        return None
    return bound["input"], bound.get("dim"), bound.get("dtype")


def mul_operands(node: torch.fx.Node) -> Optional[Tuple[Any, Any]]:
    """(a, b) of ``a * b``, torch.mul(a, b) or a.mul(b); None for any other node."""
    names = _signature(node, _MUL_SIGNATURES)
    bound = bind(node, names) if names else None
    if bound is None or set(bound) != {"input", "other"}:
        return None
    return bound["input"], bound["other"]


def is_number(value: Any) -> bool:
    """A Python float or int, the constant-scale spellings (bool is excluded: ``x * True`` is no scale)."""
    return isinstance(value, (float, int)) and not isinstance(value, bool)


def softmax_dim_problem(dim: Any, dtype: Any) -> Optional[str]:
    """Why a softmax with these arguments is not the block's softmax(dim=1) of a 2-D tensor, or None.
    dim=-1 is the same axis for the op's 2-D input (checked where the rank is known)."""
    if dtype is not None:
        return f"the softmax converts to dtype={dtype}"
    if dim is None:
        return "the softmax has an implicit dim (dim=None)"
    if dim not in (1, -1):
        return f"the softmax is over dim {dim}, not dim 1"
    return None


def scale_shape_supported(shape: Sequence[int], out_features: int) -> bool:
    """The scale shapes the op takes: a scalar, one element, or per column ((N,) or (1, N))."""
    return tuple(shape) in {(), (1,), (out_features,), (1, out_features)}
