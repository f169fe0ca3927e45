"""torch.compile auto-fusion: an Inductor pre-grad graph pass that replaces
Linear -> BatchNorm1d -> (scale) -> softmax(dim=1) by ``torch.ops.fused.gemm_bn_softmax``.

Why pre-grad: Dynamo's torch-level graph still shows the block as ``linear`` -> ``batch_norm`` ->
``mul`` -> ``softmax``, and an op put there is traced by AOTAutograd like any other, so training
uses the op's own fused backward and its running-statistics updates are functionalized. (The
joint graph is already decomposed into var_mean / rsqrt / copy_, and post-grad passes see forward
and backward apart, which could only fuse inference.)

Opt-in, because it changes what torch.compile does for every model in the process:
``enable_compile_fusion()``, or the environment variable ``GEMM_BN_SOFTMAX_COMPILE_FUSION=1`` when
the package is imported. The pass goes into ``torch._inductor.config.pre_grad_custom_pass``
behind whatever pass was there (which keeps running first) and reports a ``uuid()``, so Inductor's
FX graph cache keeps working.
"""
from __future__ import annotations

import logging
import operator
from typing import Any, Dict, Optional, Tuple

import torch
import torch.fx
import torch.nn.functional as F
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch.fx.experimental.symbolic_shapes import statically_known_true

from . import _library  # noqa: F401  (registers torch.ops.fused)
from . import _patterns
from ._patterns import (OP_DTYPES, bind, is_number, mul_operands, scale_shape_supported, softmax_call,
                        softmax_dim_problem)

logger = logging.getLogger("gemm_bn_softmax")

ENV_VAR = "GEMM_BN_SOFTMAX_COMPILE_FUSION"

_BATCH_NORM_SIGNATURES = {
    F.batch_norm: ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"),
    torch.batch_norm: ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps",
                       "cudnn_enabled"),
}
_BATCH_NORM_DEFAULTS = {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5}


def _call_args(node: Any, signatures: Dict[Any, Tuple[str, ...]], defaults: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    if not (isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in signatures):
        return None
    bound = bind(node, signatures[node.target])
    return None if bound is None else {**defaults, **bound}


def _value(node: Any) -> Optional[torch.Tensor]:
    """Dynamo's example value (a fake tensor) of a node."""
    value = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _only_user_is(node: torch.fx.Node, user: torch.fx.Node) -> bool:
    return list(node.users) == [user]


def _is_batch_count_increment(node: torch.fx.Node) -> bool:
    """nn.BatchNorm's ``num_batches_tracked.add_(1)``: it stays (the op is given no num_batches_tracked)."""
    value = _value(node)
    return (node.op == "call_method" and node.target == "add_" and value is not None
            and value.dtype == torch.int64 and value.dim() == 0)


def _fuse_at(graph: torch.fx.Graph, softmax: torch.fx.Node) -> bool:
    """Replaces the block that ends in this node, if it is provably one; True if it did."""
    call = softmax_call(softmax)
    if call is None or softmax_dim_problem(call[1], call[2]):
        return False
    src = call[0]
    mul, bn, scale = None, src, 1.0
    operands = mul_operands(src) if isinstance(src, torch.fx.Node) else None
    if operands is not None:
        mul = src
        bn, scale = (operands[1], operands[0]) if _call_args(operands[1], _BATCH_NORM_SIGNATURES, {}) else operands
    bn_args = _call_args(bn, _BATCH_NORM_SIGNATURES, _BATCH_NORM_DEFAULTS)
    lin = bn_args["input"] if bn_args else None
    lin_args = _call_args(lin, {F.linear: ("input", "weight", "bias")}, {"bias": None})
    if lin_args is None or scale is bn:
        return False
    chain = [n for n in (lin, bn, mul, softmax) if n is not None]
    if not all(_only_user_is(a, b) for a, b in zip(chain, chain[1:])):
        return False
    training, momentum, eps = bn_args["training"], bn_args["momentum"], bn_args["eps"]
    stats = (bn_args["running_mean"], bn_args["running_var"])
    if not (isinstance(training, bool) and is_number(eps) and (is_number(momentum) or not training)):
        return False  # momentum=None's 1/num_batches_tracked is computed in the graph: not fused
    if (stats[0] is None) != (stats[1] is None) or (stats[0] is None and not training):
        return False

    x = lin_args["input"]
    tensors = [x, lin_args["weight"], lin_args["bias"], bn_args["weight"], bn_args["bias"], *stats]
    values = [_value(t) for t in tensors if t is not None] + [_value(n) for n in chain]
    if isinstance(scale, torch.fx.Node):
        values.append(_value(scale))
    elif not is_number(scale):
        return False
    if any(v is None for v in values):
        return False
    dtypes = {v.dtype for v in values}
    if len(dtypes) != 1 or not dtypes <= set(OP_DTYPES):
        return False  # one dtype throughout (autocast regions and promotions are left alone)
    x_value, weight_value = _value(x), _value(lin_args["weight"])
    if x_value.dim() != 2 or x_value.device.type not in ("cpu", "cuda") or weight_value.dim() != 2:
        return False
    bias_value = _value(lin_args["bias"]) if lin_args["bias"] is not None else None
    if bias_value is not None and not (bias_value.dim() == 1 and statically_known_true(
            bias_value.shape[0] == weight_value.shape[0])):
        return False  # a bias F.linear broadcasts ((1,), (1, N)): the op takes (N,)
    if (bn_args["weight"] is None) != (bn_args["bias"] is None):
        return False  # the op's affine BatchNorm takes both or neither
    if isinstance(scale, torch.fx.Node):
        shape, n = tuple(_value(scale).shape), weight_value.shape[0]
        if not all(isinstance(d, int) for d in (*shape, n)) or not scale_shape_supported(shape, n):
            return False
    # The op runs where the softmax was: only attribute reads and the batch count may sit in between.
    nodes = list(graph.nodes)
    between = nodes[nodes.index(lin) + 1:nodes.index(softmax)]
    if any(n not in chain and n.op != "get_attr" and not _is_batch_count_increment(n) for n in between):
        return False

    with graph.inserting_before(softmax):
        if not isinstance(scale, torch.fx.Node):  # the op takes the scale as a tensor
            scale = graph.call_function(torch.full, ((), float(scale)),
                                        {"dtype": torch.float32, "device": x_value.device})
        fused = graph.call_function(torch.ops.fused.gemm_bn_softmax.default, (
            x, lin_args["weight"], lin_args["bias"], bn_args["weight"], bn_args["bias"], *stats, None, scale,
            training, momentum, eps))
        out = graph.call_function(operator.getitem, (fused, 0))
    out.meta.update(softmax.meta)
    softmax.replace_all_uses_with(out)
    for node in reversed(chain):
        graph.erase_node(node)
    return True


def fuse_blocks(graph: torch.fx.Graph) -> int:
    """Replaces every Linear -> BatchNorm1d -> (scale) -> softmax(dim=1) block of a Dynamo graph by
    the fused op; returns how many. A block is fused only if it provably computes the same: one
    dtype (float32, bfloat16 or float16) throughout, a 2-D input, each intermediate used once,
    softmax over dim 1 or -1 without dtype=, a scale that is a number or a tensor of shape (),
    (1,), (N,) or (1, N), a Linear bias of shape (N,) if any, BatchNorm's weight and bias both given
    or neither, constant training/momentum/eps, nothing in between but attribute reads."""
    fused = sum(_fuse_at(graph, node) for node in list(graph.nodes) if softmax_call(node) is not None)
    if fused:
        logger.info("gemm_bn_softmax: torch.compile fused %d Linear -> BatchNorm1d -> softmax block(s)", fused)
    return fused


class FusionPass(CustomGraphPass):
    """The pre-grad pass: runs what was in the slot before it (a pass, a list of passes or None),
    then ``fuse_blocks``."""

    def __init__(self, previous: Any = None):
        self.previous = previous

    def _previous_passes(self) -> Tuple[Any, ...]:
        if self.previous is None:
            return ()
        return tuple(self.previous) if isinstance(self.previous, (list, tuple)) else (self.previous,)

    def __call__(self, graph: torch.fx.Graph) -> None:
        for previous in self._previous_passes():
            previous(graph)
        fuse_blocks(graph)

    def uuid(self) -> Optional[Any]:
        previous = [p.uuid() if isinstance(p, CustomGraphPass) else None for p in self._previous_passes()]
        if None in previous:  # an uncacheable pass before us keeps the chain uncacheable
            return None
        return get_hash_for_files((__file__, _patterns.__file__)), tuple(previous)


def compile_fusion_enabled() -> bool:
    """Whether torch.compile currently fuses the block (``enable_compile_fusion`` is in effect)."""
    return isinstance(inductor_config.pre_grad_custom_pass, FusionPass)


def enable_compile_fusion() -> None:
    """Makes ``torch.compile`` (Inductor) replace Linear -> BatchNorm1d -> (scale) -> softmax(dim=1) in
    unmodified models by ``torch.ops.fused.gemm_bn_softmax``, in training (the op's fused backward)
    and eval, for every compile that starts afterwards in this process. A pass already in
    ``torch._inductor.config.pre_grad_custom_pass`` keeps running, before this one. Idempotent."""
    if not compile_fusion_enabled():
        inductor_config.pre_grad_custom_pass = FusionPass(inductor_config.pre_grad_custom_pass)


def disable_compile_fusion() -> None:
    """Undoes ``enable_compile_fusion`` (the pass that was there before comes back). Models already
    compiled keep their compiled code: call ``torch._dynamo.reset()`` to recompile them."""
    installed = inductor_config.pre_grad_custom_pass
    if isinstance(installed, FusionPass):
        inductor_config.pre_grad_custom_pass = installed.previous
