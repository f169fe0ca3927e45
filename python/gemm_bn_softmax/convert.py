"""``convert(model)``: runs every Linear -> BatchNorm1d -> (scale) -> softmax(dim=1) block of a model
with the fused op, found by dataflow, in place, keeping the model's parameters, buffers and
state_dict keys.

How: each module that holds both a Linear and a BatchNorm is traced by torch.fx one level deep (its
own forward; every submodule call is one node). Where the trace provably computes
``softmax(scale * bn(linear(x)), dim=1)`` — see ``convert`` for the exact rules — those nodes become
one call that runs the fused op with the original modules' own parameters and buffers, and the
module's ``forward`` is replaced on that instance by the rewritten trace. Nothing else changes: no
module is added, removed or renamed, so a checkpoint loads either way.
"""
from __future__ import annotations

import inspect
import linecache
import logging
import operator
import types
import warnings
from collections import Counter
from dataclasses import dataclass, field
from functools import reduce
from itertools import count
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
from torch.fx import Node
from torch.nn.modules.batchnorm import _BatchNorm

from ._patterns import OP_DTYPES, is_number, mul_operands, scale_shape_supported, softmax_call, softmax_dim_problem
from .functional import ScaleLike
from .module import FusedGemmBNSoftmax, has_hooks, run_block

logger = logging.getLogger("gemm_bn_softmax")

ScaleSource = Union[None, float, str]  # no scale (1), a constant, or the path of a tensor attribute


class Scale(nn.Module):
    """Multiplies by a learnable scale (a scalar or per-column): the scale step of
    ``nn.Sequential(nn.Linear, nn.BatchNorm1d, Scale(), nn.Softmax(dim=1))``."""

    def __init__(self, scale_shape=(1,), device=None, dtype=None):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(tuple(scale_shape), device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class ConversionWarning(UserWarning):
    """A block that ``convert`` left unfused, or a converted block that ran unfused."""


@dataclass(frozen=True)
class Block:
    """One block ``convert`` found. ``module``: the qualified name of the module whose forward holds
    it ("" is the model itself); ``chain``: its calls; ``reason``: why it was left unfused ("" when
    it was replaced)."""

    module: str
    chain: str
    reason: str = ""

    def __str__(self) -> str:
        text = f"{self.module or '<model>'}: {self.chain}"
        return f"{text}  -- {self.reason}" if self.reason else text


@dataclass
class ConversionReport:
    """What ``convert`` did; also ``model.gemm_bn_softmax_report`` after the call."""

    replaced: List[Block] = field(default_factory=list)
    skipped: List[Block] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"replaced {len(self.replaced)} block(s), left {len(self.skipped)} unfused"]
        lines += [f"  fused:   {b}" for b in self.replaced]
        lines += [f"  skipped: {b}" for b in self.skipped]
        return "\n".join(lines)


# ---- what a converted block runs ----------------------------------------------------------------

def _op_cannot_run(x: Any, linear: nn.Linear, bn: nn.BatchNorm1d, scale: Optional[ScaleLike]) -> Optional[str]:
    """Why the fused op would not compute exactly what the modules compute for this call, or None."""
    if not isinstance(x, torch.Tensor):
        return f"the input is a {type(x).__name__}, not a tensor"
    if x.dim() != 2:  # also where softmax(dim=-1) would be another axis than dim 1
        return f"the input is {x.dim()}-D; the op takes (batch, in_features)"
    if x.device.type not in ("cpu", "cuda", "meta"):
        return f"the input is on {x.device.type}; the op runs on CPU and CUDA"
    tensors = [linear.weight, linear.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var]
    if isinstance(scale, torch.Tensor):
        if not scale_shape_supported(scale.shape, linear.out_features):
            return f"the scale has shape {tuple(scale.shape)}"
        tensors.append(scale)  # a scale of another dtype would promote the output's dtype
    dtypes = {t.dtype for t in tensors if t is not None}
    if len(dtypes) != 1 or not dtypes <= set(OP_DTYPES):
        names = ", ".join(sorted(map(str, dtypes)))
        return f"parameters of dtype {names}; the op needs one of float32, bfloat16, float16"
    dtype = dtypes.pop()
    if x.dtype != dtype and not (x.dtype in OP_DTYPES and torch.is_autocast_enabled(x.device.type)):
        return f"the input is {x.dtype} and the parameters {dtype}"
    # States nn.BatchNorm1d handles in its own way (the op would differ in what it updates)
    if (bn.running_mean is None) != (bn.running_var is None):
        return "only one of running_mean / running_var is set"
    if bn.track_running_stats and bn.running_mean is None:
        return "track_running_stats is True but the running statistics are None"
    if bn.training and bn.track_running_stats and bn.momentum is None and bn.num_batches_tracked is None:
        return "momentum=None without num_batches_tracked"
    return None


def _fused_block(x: torch.Tensor, linear: nn.Linear, bn: nn.BatchNorm1d, scale: Optional[ScaleLike],
                 scale_first: bool, softmax_dim: int, precision: Optional[str]) -> torch.Tensor:
    """A converted block: softmax(scale * bn(linear(x)), softmax_dim) by the fused op, with the
    modules' live parameters, buffers and training flag. A call the op cannot compute exactly
    (a float64 model, a 3-D input, ...) runs the modules themselves instead, with a warning."""
    problem = _op_cannot_run(x, linear, bn, scale)
    if problem is None:
        return run_block(x, linear, bn, 1.0 if scale is None else scale, training=bn.training, precision=precision)
    warnings.warn(f"gemm_bn_softmax: a converted block ran unfused: {problem}", ConversionWarning, stacklevel=3)
    z = bn(linear(x))
    if scale is not None:
        z = scale * z if scale_first else z * scale
    return torch.softmax(z, softmax_dim)


# ---- tracing one module -------------------------------------------------------------------------

class _Untraceable(Exception):
    pass


class _OneLevelTracer(torch.fx.Tracer):
    """Traces one module's own forward: each submodule call stays one call_module node (every
    module is converted on its own)."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return True

    def create_arg(self, a: Any):
        # A tensor made in forward from constants (torch.randn(3), torch.tensor(2.0)) would be
        # frozen into the trace as one fixed value: refuse instead.
        if (isinstance(a, torch.Tensor) and not isinstance(a, nn.Parameter) and a not in self.tensor_attrs
                and not any(a is b for b in self.root.buffers())):
            raise _Untraceable("forward creates a tensor from constants (a trace would freeze its value)")
        return super().create_arg(a)


def _trace(module: nn.Module, training: bool, concrete_args: Dict[str, Any]) -> torch.fx.Graph:
    """The module's forward traced with ``module.training`` set to ``training`` (Python branches on
    it are resolved by the trace; its submodules read their own flags when they run)."""
    saved = module.training
    module.training = training
    try:
        return _OneLevelTracer().trace(module, concrete_args)
    finally:
        module.training = saved


def _forward_signature(module: nn.Module) -> Tuple[Optional[str], int, Dict[str, Any]]:
    """(problem, number of required positional arguments, defaults of the optional ones)."""
    params = list(inspect.signature(type(module).forward).parameters.values())[1:]
    kinds = inspect.Parameter
    if any(p.kind in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD) for p in params):
        return "forward takes *args or **kwargs", 0, {}
    if any(p.kind is kinds.KEYWORD_ONLY and p.default is kinds.empty for p in params):
        return "forward has a required keyword-only argument", 0, {}
    defaults = {p.name: p.default for p in params if p.default is not kinds.empty}
    return None, len(params) - len(defaults), defaults


_MARK = "_gemm_bn_softmax_converted"
_source_ids = count()


def _compile(graph: torch.fx.Graph, label: str) -> Callable:
    """The graph as a plain ``forward(self, ...)`` function (source kept in linecache for tracebacks)."""
    code = graph.python_code(root_module="self")
    filename = f"<gemm_bn_softmax.convert {label} #{next(_source_ids)}>"
    linecache.cache[filename] = (len(code.src), None, code.src.splitlines(True), filename)
    namespace = dict(code.globals)
    exec(compile(code.src, filename, "exec"), namespace)
    return namespace["forward"]


def _is_replaceable_forward(module: nn.Module) -> bool:
    """True unless something other than ``convert`` put a forward on this instance. (A bound class
    forward is what unpickling a converted model leaves there.)"""
    forward = module.__dict__.get("forward")
    func = getattr(forward, "__func__", None)
    return forward is None or getattr(func, _MARK, False) or (
        func is type(module).forward and forward.__self__ is module)


def _install(module: nn.Module, functions: Dict[Optional[bool], Callable], required: int, optional: bool) -> None:
    """Sets ``module.forward`` to the rewritten trace(s): one per training mode when the trace
    depended on it; calls that pass optional arguments run the original forward (the traces
    assumed their defaults)."""
    if list(functions) == [None] and not optional:
        forward = functions[None]
    else:
        original = type(module).forward
        in_training = functions.get(True, functions.get(None))
        in_eval = functions.get(False, functions.get(None))

        def forward(self, *args, **kwargs):
            if optional and (kwargs or len(args) != required):
                return original(self, *args, **kwargs)
            return (in_training if self.training else in_eval)(self, *args, **kwargs)

    setattr(forward, _MARK, True)
    module.forward = types.MethodType(forward, module)


# ---- finding blocks in a trace ------------------------------------------------------------------

@dataclass
class _Match:
    x: Node
    linear: Node
    bn: Node
    mul: Optional[Node]
    softmax: Node
    scale: ScaleSource
    scale_first: bool
    dim: int


def _behaves_as(module: Optional[nn.Module], cls: type) -> bool:
    """An instance of cls whose forward is cls's own (a subclass overriding it computes something else)."""
    return isinstance(module, cls) and type(module).forward is cls.forward


class _BlockFinder:
    """Finds blocks in one traced forward of ``module`` (named ``prefix`` in the model)."""

    def __init__(self, graph: torch.fx.Graph, module: nn.Module, prefix: str):
        self.graph, self.module, self.prefix = graph, module, prefix
        self.order = {node: i for i, node in enumerate(graph.nodes)}

    def submodule(self, node: Any) -> Optional[nn.Module]:
        if isinstance(node, Node) and node.op == "call_module":
            return self.module.get_submodule(node.target)
        return None

    def attribute(self, path: str) -> Any:
        owner, _, name = path.rpartition(".")
        return getattr(self.module.get_submodule(owner), name)

    def name(self, target: str) -> str:
        return f"{self.prefix}.{target}" if self.prefix else target

    def describe(self, node: Any) -> str:
        if not isinstance(node, Node):
            return repr(node)
        if node.op == "call_module":
            return f"{type(self.submodule(node)).__name__} {self.name(node.target)}"
        if node.op == "call_function":
            return f"{getattr(node.target, '__name__', node.target)}()"
        if node.op == "call_method":
            return f".{node.target}()"
        if node.op == "get_attr":
            return self.name(node.target)
        if node.op == "placeholder":
            return f"input {node.target}"
        return "the forward's output"

    def candidates(self) -> List[Node]:
        """BatchNorm calls worth a report: fed by a Linear or leading to a softmax (near misses
        included; a BatchNorm2d between convolutions is not one)."""
        def is_bn(node: Node) -> bool:
            functional = node.op == "call_function" and node.target in (F.batch_norm, torch.batch_norm)
            return functional or isinstance(self.submodule(node), _BatchNorm)

        def leads_to_softmax(node: Node, steps: int = 2) -> bool:
            return any(self.softmax_args(user, node) is not None or (steps > 1 and leads_to_softmax(user, steps - 1))
                       for user in node.users)

        return [n for n in self.graph.nodes if is_bn(n) and (
            (n.args and isinstance(self.submodule(n.args[0]), nn.Linear)) or leads_to_softmax(n))]

    def softmax_args(self, node: Node, source: Node) -> Optional[Tuple[Any, Any]]:
        """(dim, dtype) if node is a softmax of ``source``."""
        module = self.submodule(node)
        if module is not None:
            ok = _behaves_as(module, nn.Softmax) and node.args == (source,) and not node.kwargs
            return (module.dim, None) if ok else None
        call = softmax_call(node)
        return call[1:] if call is not None and call[0] is source else None

    def scale_of(self, node: Node, bn: Node, out_features: int) -> Union[None, str, Tuple[ScaleSource, bool]]:
        """(scale, scale_first) if node multiplies bn's output by a supported scale; a reason if it
        multiplies by something else; None if it is no multiplication."""
        module = self.submodule(node)
        if module is not None:
            if not (_behaves_as(module, Scale) and node.args == (bn,) and not node.kwargs):
                return None
            path, scale_first = f"{node.target}.scale", True
        else:
            operands = mul_operands(node)
            if operands is None:
                return None
            if (operands[0] is bn) == (operands[1] is bn):
                return "the BatchNorm1d output is multiplied by itself"
            scale_first = operands[1] is bn
            other = operands[0] if scale_first else operands[1]
            if is_number(other):
                return float(other), scale_first
            if not (isinstance(other, Node) and other.op == "get_attr"):
                return f"the multiplier {self.describe(other)} is not a parameter, a buffer or a constant"
            path = other.target
        value = self.attribute(path)
        if not isinstance(value, torch.Tensor):
            return f"the multiplier {self.name(path)} is a {type(value).__name__}"
        if not scale_shape_supported(value.shape, out_features):
            return (f"the scale {self.name(path)} has shape {tuple(value.shape)}; the op takes (), (1,), "
                    f"({out_features},) or (1, {out_features})")
        return path, scale_first

    def match(self, bn: Node) -> Union[_Match, Block]:
        """The block around this BatchNorm call, or a Block saying why it is not one."""
        lin = bn.args[0] if bn.args else None
        walked = [n for n in (lin, bn) if isinstance(n, Node)]

        def skip(reason: str) -> Block:
            return Block(self.prefix, " -> ".join(self.describe(n) for n in walked), reason)

        bn_module = self.submodule(bn)
        if bn_module is None:
            return skip("batch_norm is called as a function; only nn.BatchNorm1d modules are converted "
                        "(a trace would fix a functional call's training flag)")
        if not (_behaves_as(bn_module, nn.BatchNorm1d) or _behaves_as(bn_module, nn.SyncBatchNorm)):
            return skip(f"{type(bn_module).__name__} is not nn.BatchNorm1d or nn.SyncBatchNorm")
        linear = self.submodule(lin)
        if not _behaves_as(linear, nn.Linear):
            return skip(f"the BatchNorm1d input is {self.describe(lin)}, not an nn.Linear output")
        if bn.args != (lin,) or bn.kwargs or len(lin.args) != 1 or lin.kwargs or not isinstance(lin.args[0], Node):
            return skip("the Linear or the BatchNorm1d is called with extra arguments")
        if any(isinstance(p, nn.parameter.UninitializedParameter) for p in linear.parameters()):
            return skip("the Linear is an uninitialized lazy module")
        if bn_module.num_features != linear.out_features:
            return skip(f"BatchNorm1d({bn_module.num_features}) after Linear(out_features={linear.out_features})")
        for node, what in ((lin, "Linear"), (bn, "BatchNorm1d")):
            if len(node.users) != 1:
                return skip(f"the {what} output is also used by "
                            + ", ".join(self.describe(u) for u in node.users if u not in walked))
        node = next(iter(bn.users))
        walked.append(node)
        mul, scale, scale_first = None, None, True
        if self.softmax_args(node, bn) is None:
            found = self.scale_of(node, bn, linear.out_features)
            if found is None:
                return skip(f"the BatchNorm1d output goes to {self.describe(node)}, not a multiply or a softmax")
            if isinstance(found, str):
                return skip(found)
            (scale, scale_first), mul = found, node
            if len(mul.users) != 1:
                return skip("the scaled output is also used by " + ", ".join(self.describe(u) for u in mul.users))
            node = next(iter(mul.users))
            walked.append(node)
        softmax = self.softmax_args(node, mul or bn)
        if softmax is None:
            return skip(f"the {'scaled' if mul else 'BatchNorm1d'} output goes to {self.describe(node)}, not a softmax")
        problem = softmax_dim_problem(*softmax)
        if problem:
            return skip(problem)
        hooked = [n for n in walked if self.submodule(n) is not None and has_hooks(self.submodule(n))]
        if hooked:
            return skip(f"{self.describe(hooked[0])} has hooks (the fused op would not run them)")
        # The fused op runs where the softmax was: only reads of attributes may sit in between.
        between = [n for n in self.graph.nodes if self.order[lin] < self.order[n] < self.order[node]]
        others = [n for n in between if n not in (bn, mul) and n.op != "get_attr"]
        if others:
            return skip(f"{self.describe(others[0])} runs between the Linear and the softmax (fusing would reorder it)")
        return _Match(lin.args[0], lin, bn, mul, node, scale, scale_first, softmax[0])

    def chain(self, m: _Match) -> str:
        parts = [self.describe(m.linear), self.describe(m.bn)]
        if m.mul is not None:
            parts.append(f"* {m.scale!r}" if isinstance(m.scale, float) else f"* {self.name(m.scale)}")
        softmax = self.describe(m.softmax)
        parts.append(softmax.replace("()", f"(dim={m.dim})") if softmax.endswith("()") else f"{softmax} (dim={m.dim})")
        return " -> ".join(parts)


def _rewrite(graph: torch.fx.Graph, m: _Match, precision: Optional[str], fused_calls: Dict[Node, Node]) -> None:
    """Replaces the block's nodes by one ``_fused_block`` call that reads the same modules.
    ``fused_calls`` maps each replaced softmax to its call: a block stacked on another reads the call
    (the matches were found before any rewrite, so its input may be the erased softmax)."""
    old_attributes = [] if m.mul is None else [a for a in m.mul.all_input_nodes if a.op == "get_attr"]
    with graph.inserting_before(m.softmax):
        scale = graph.get_attr(m.scale) if isinstance(m.scale, str) else m.scale
        fused = graph.call_function(_fused_block, (
            fused_calls.get(m.x, m.x), graph.get_attr(m.linear.target), graph.get_attr(m.bn.target), scale,
            m.scale_first, m.dim, precision))
    fused_calls[m.softmax] = fused
    m.softmax.replace_all_uses_with(fused)
    for node in (m.softmax, m.mul, m.bn, m.linear):
        if node is not None:
            graph.erase_node(node)
    for node in old_attributes:
        if not node.users:
            graph.erase_node(node)


# ---- convert ------------------------------------------------------------------------------------

def _may_hold_block(module: nn.Module) -> bool:
    """Has a forward of its own (not a ModuleList/ModuleDict) and a Linear and a BatchNorm below it."""
    if isinstance(module, FusedGemmBNSoftmax) or type(module).forward is nn.Module.forward:
        return False
    kinds = [m for m in module.modules() if m is not module]
    return any(isinstance(m, nn.Linear) for m in kinds) and any(isinstance(m, _BatchNorm) for m in kinds)


def _split(blocks: List[Block], counts: Counter) -> Tuple[List[Block], List[Block]]:
    """(the blocks that counts holds, as many times as it holds them; the others), each in order."""
    left, held, others = Counter(counts), [], []
    for b in blocks:
        (held if left[b] > 0 else others).append(b)
        left[b] -= 1
    return held, others


def _convert_module(module: nn.Module, prefix: str, precision: Optional[str], report: ConversionReport) -> None:
    def skip_forward(reason: str) -> None:
        report.skipped.append(Block(prefix, f"{type(module).__name__}.forward", reason))

    if not _is_replaceable_forward(module):
        return skip_forward("this instance's forward was replaced by something else; it is left alone")
    problem, required, defaults = _forward_signature(module)
    if problem:
        return skip_forward(f"not traced: {problem}")
    try:
        traces = {mode: _trace(module, mode, defaults) for mode in (True, False)}
    except Exception as error:  # noqa: BLE001  (any tracing failure is reported, never raised)
        message = str(error).strip().splitlines()
        return skip_forward(f"torch.fx cannot trace it ({type(error).__name__}: {message[0] if message else ''})")
    if traces[True].python_code("self").src == traces[False].python_code("self").src:
        traces = {None: traces[True]}

    functions, found, label = {}, {}, f"{prefix or type(module).__name__}.forward"
    for mode, graph in traces.items():
        finder = _BlockFinder(graph, module, prefix)
        results = [finder.match(bn) for bn in finder.candidates()]
        matches = [r for r in results if isinstance(r, _Match)]
        found[mode] = ([Block(prefix, finder.chain(m)) for m in matches], [r for r in results if isinstance(r, Block)])
        fused_calls: Dict[Node, Node] = {}
        for m in matches:
            _rewrite(graph, m, precision, fused_calls)
        if matches:
            graph.lint()
            functions[mode] = _compile(graph, label)

    for i, entries in enumerate((report.replaced, report.skipped)):
        per_mode = {mode: blocks[i] for mode, blocks in found.items()}
        # Counted, not as sets: one block may run twice in a forward (the same modules, the same chain).
        in_every_mode = reduce(operator.and_, map(Counter, per_mode.values()))
        entries.extend(_split(next(iter(per_mode.values())), in_every_mode)[0])
        for mode, blocks in per_mode.items():  # the forward branches on self.training
            where = "in training mode" if mode else "in eval mode"
            entries.extend(Block(b.module, f"{b.chain} ({where})", b.reason) for b in _split(blocks, in_every_mode)[1])

    if functions:
        for mode in set(traces) - set(functions):  # a mode without a block runs its trace as it was
            functions[mode] = _compile(traces[mode], label)
        _install(module, functions, required, bool(defaults))
    elif "forward" in module.__dict__:  # converted before (or unpickled): back to the class's forward
        del module.forward


def convert(model: nn.Module, precision: Optional[str] = None) -> nn.Module:
    """Runs every Linear -> BatchNorm1d -> (scale) -> softmax(dim=1) block of ``model`` with the fused
    op. In place: returns ``model`` itself, so ``convert(model)`` alone is enough.

    Found by dataflow, in any module: each module holding a Linear and a BatchNorm has its own
    forward traced by torch.fx (every submodule call one node), in training and in eval mode. A
    block is the chain ``nn.Linear`` call -> ``nn.BatchNorm1d`` call -> optionally a multiplication
    (``*``, ``torch.mul``, ``.mul``, either operand order, or a ``Scale`` module) by a Python number,
    a parameter, a buffer or a tensor attribute of shape (), (1,), (N,) or (1, N) -> softmax over
    dim 1 or -1 (``nn.Softmax``, ``torch.softmax``, ``F.softmax``, ``Tensor.softmax``; no ``dtype=``).
    Every intermediate must have that one use, the modules no hooks and unmodified forwards, and
    nothing but attribute reads may run between the Linear and the softmax. A near miss (a
    BatchNorm fed by a Linear or leading to a softmax, a forward torch.fx cannot trace) is reported
    with the reason and a ``ConversionWarning``; nothing else is touched.

    What changes: on each module with a block, ``forward`` is replaced on that instance (not its
    class) by its trace with the block as one call of the fused op. That call reads the original
    Linear, BatchNorm1d and scale objects at every call (their current values, training flag,
    momentum and eps), so parameters, buffers, state_dict keys and ``named_parameters`` stay
    exactly as they were: old checkpoints load with strict=True, optimizers keep working, and no
    parameter is added (a block without a scale multiplies by a constant 1). nn.BatchNorm1d's
    rules hold (running statistics, num_batches_tracked, momentum=None, eval,
    track_running_stats=False, affine=False). A call the op cannot compute exactly (input not 2-D,
    not one float32/bfloat16/float16 dtype for input and parameters outside autocast, a device
    other than CPU/CUDA) runs the original modules instead, with a ``ConversionWarning``.

    What a trace fixes: Python control flow in a converted forward, and Python numbers it reads
    (``self.temperature = 2.0``), are resolved at conversion (a branch on ``self.training`` is kept:
    the forward is traced in both modes), as are the block's softmax module and its dim (unlike the
    Linear, BatchNorm1d and scale, read at every call); tensors made from constants in forward are
    refused; a call that passes a forward's optional arguments runs the original forward. Convert
    again after changing such settings or replacing a submodule; converting twice is harmless.
    Hooks added to the block's modules after conversion, and global module hooks
    (``register_module_forward_hook``), do not run on the fused path.
    ``torch.save(model)`` (pickling the whole model) stores it unconverted; convert after loading.

    Returns ``model``, with the report (``ConversionReport``: ``replaced`` and ``skipped`` blocks,
    each with its module, chain and reason) as ``model.gemm_bn_softmax_report``.
    ``precision``: passed to the op (see ``gemm_bn_softmax``).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert expects an nn.Module, got {type(model).__name__}")
    report = ConversionReport()
    for prefix, module in model.named_modules():
        if _may_hold_block(module):
            _convert_module(module, prefix, precision, report)
    for block in report.replaced:
        logger.info("gemm_bn_softmax.convert: fused %s", block)
    for block in report.skipped:
        warnings.warn(f"gemm_bn_softmax.convert: left unfused: {block}", ConversionWarning, stacklevel=2)
    if not report.replaced and not report.skipped:
        warnings.warn(f"gemm_bn_softmax.convert: no Linear -> BatchNorm1d -> softmax(dim=1) block in "
                      f"{type(model).__name__}; nothing changed", ConversionWarning, stacklevel=2)
    model.gemm_bn_softmax_report = report
    return model
