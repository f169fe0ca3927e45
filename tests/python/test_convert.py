"""convert() by dataflow, and torch.compile auto-fusion (CPU).

Every converted model is checked against its unconverted copy step for step: outputs (and against
float64), gradients, parameters after SGD, running statistics and num_batches_tracked; and its
state_dict keys, parameter names and parameter objects must be unchanged, so a checkpoint saved
before conversion loads with strict=True. Models that are not exactly the block must stay as they
were and say why.
"""
import contextlib
import copy
import os
import pickle
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers import TOL, assert_batch_sum_grad_close, assert_cancelled_bias_grad, rel_err

import gemm_bn_softmax as gbs
from gemm_bn_softmax import ConversionWarning
from gemm_bn_softmax.reference import ReferenceModel

K, N = 12, 10
OP = "fused::gemm_bn_softmax"


def op_calls(fn):
    """(fn's result, how many times it ran the fused op)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        result = fn()
    return result, sum(e.count for e in prof.key_averages() if e.key == OP)


def randomize(model, seed=0):
    """Non-trivial BatchNorm parameters, running statistics and scales."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                if m.affine:
                    m.weight.copy_(0.5 + torch.rand(m.weight.shape, generator=g))
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
                if m.running_mean is not None:
                    m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                    m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if name.rpartition(".")[2] in ("scale", "temperature"):
                t.copy_(1.0 + torch.rand(t.shape, generator=g))
    return model


def convert_quietly(model, expect_replaced):
    """convert(); checks it is in place and replaced `expect_replaced` blocks without a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConversionWarning)
        assert gbs.convert(model) is model
    report = model.gemm_bn_softmax_report
    assert len(report.replaced) == expect_replaced and not report.skipped, str(report)
    return report


def check_converted(model, make_input, expect_replaced=1, steps=3):
    """Converts `model` and checks it against an unconverted copy, in training (forward, backward,
    SGD with momentum) and then in eval."""
    baseline = copy.deepcopy(model)
    checkpoint = copy.deepcopy(model.state_dict())
    keys = list(model.state_dict())
    params = [(name, id(p)) for name, p in model.named_parameters()]

    report = convert_quietly(model, expect_replaced)

    assert list(model.state_dict()) == keys
    assert [(name, id(p)) for name, p in model.named_parameters()] == params  # same objects, none added
    model.load_state_dict(checkpoint, strict=True)

    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt_base = torch.optim.SGD(baseline.parameters(), lr=0.1, momentum=0.9)
    for step, training in enumerate([True] * steps + [False]):
        model.train(training)
        baseline.train(training)
        x = make_input()
        exact = copy.deepcopy(baseline).double()
        exact.load_state_dict(model.state_dict())  # float64 on the converted model's parameters
        with torch.no_grad():
            want64 = exact(x.double())
        with warnings.catch_warnings():
            warnings.simplefilter("error", ConversionWarning)  # no unfused fallback
            out, calls = op_calls(lambda: model(x))
        assert calls == expect_replaced
        want = baseline(x)
        assert out.dtype == want.dtype and out.shape == want.shape
        assert rel_err(out, want64) <= 2e-6  # as accurate as eager fp32 (about 2e-7 here)
        assert rel_err(out, want) <= 2e-5, step  # the two models drift apart by rounding only
        if training:
            g = torch.randn(out.shape, generator=torch.Generator().manual_seed(step))
            (out * g).sum().backward()
            (want * g).sum().backward()
            total = torch.cat([q.grad.flatten() for q in baseline.parameters()]).norm()
            for (name, p), q in zip(model.named_parameters(), baseline.parameters()):
                # against the whole gradient's norm: the Linear bias's gradient is 0 in exact
                # arithmetic (BatchNorm removes the mean), eager's is rounding noise
                assert (p.grad - q.grad).norm() <= 1e-4 * total, (step, name)
            opt.step(), opt_base.step()
            opt.zero_grad(), opt_base.zero_grad()
        for (name, a), b in zip(model.state_dict().items(), baseline.state_dict().values()):
            if a.dtype == torch.int64:
                assert torch.equal(a, b), name  # num_batches_tracked
            else:
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"step {step}, {name}: {m}")
    return report


def check_left_alone(model, make_input, reason):
    """convert() must leave the model as it was and say why, with a ConversionWarning."""
    baseline = copy.deepcopy(model)
    with pytest.warns(ConversionWarning, match="left unfused"):
        assert gbs.convert(model) is model
    report = model.gemm_bn_softmax_report
    assert not report.replaced, str(report)
    assert any(reason in block.reason for block in report.skipped), str(report)
    assert "forward" not in vars(model)
    assert list(model.state_dict()) == list(baseline.state_dict())
    for training in (True, False):
        model.train(training), baseline.train(training)
        x = make_input()
        out, calls = op_calls(lambda: model(x))
        assert calls == 0
        want = baseline(x)
        for a, b in zip(as_tuple(out), as_tuple(want)):
            assert torch.equal(a, b)
    return report


def rand(*shape):
    return lambda: torch.rand(*shape)


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


# ---- models -------------------------------------------------------------------------------------

class Head(nn.Module):
    """A classifier head written out in its forward, with its own child names."""

    def __init__(self, softmax="torch.softmax", scale="scale*z", bias=True, affine=True, track=True, momentum=0.1):
        super().__init__()
        self.proj = nn.Linear(K, N, bias=bias)
        self.norm = nn.BatchNorm1d(N, affine=affine, track_running_stats=track, momentum=momentum)
        self.softmax_kind, self.scale_kind = softmax, scale
        if scale in ("scale*z", "z*scale", "torch.mul"):
            self.temperature = nn.Parameter(torch.ones(1))
        elif scale == "per-column":
            self.temperature = nn.Parameter(torch.ones(N))
        elif scale == "(1, N)":
            self.temperature = nn.Parameter(torch.ones(1, N))
        elif scale == "buffer":
            self.register_buffer("temperature", torch.ones(N))
        if softmax == "nn.Softmax":
            self.probs = nn.Softmax(dim=1)

    def forward(self, x):
        z = self.norm(self.proj(x))
        s = self.scale_kind
        if s in ("scale*z", "per-column", "(1, N)", "buffer"):
            z = self.temperature * z
        elif s == "z*scale":
            z = z * self.temperature
        elif s == "torch.mul":
            z = torch.mul(z, self.temperature)
        elif s == "float":
            z = 2.5 * z
        kind = self.softmax_kind
        if kind == "torch.softmax":
            return torch.softmax(z, 1)
        if kind == "F.softmax":
            return F.softmax(z, dim=1)
        if kind == "Tensor.softmax":
            return z.softmax(dim=-1)
        return self.probs(z)


class ReluBeforeSoftmax(ReferenceModel):
    """The reference model's children and scale, but its forward adds a ReLU."""

    def forward(self, x):
        return self.softmax(torch.relu(self.scale * self.bn(self.gemm(x))))


class ScaleBeforeBN(ReferenceModel):
    def forward(self, x):
        return self.softmax(self.bn(self.scale * self.gemm(x)))


class SoftmaxDim0(ReferenceModel):
    def forward(self, x):
        return torch.softmax(self.scale * self.bn(self.gemm(x)), 0)


class ReturnsBN(ReferenceModel):
    def forward(self, x):
        z = self.bn(self.gemm(x))
        return self.softmax(self.scale * z), z


class ReturnsLinear(ReferenceModel):
    def forward(self, x):
        y = self.gemm(x)
        return self.softmax(self.scale * self.bn(y)), y


class BatchNorm2dHead(nn.Module):
    """Linear over the last axis of (B, C, H, K), then BatchNorm2d over C, softmax over C."""

    def __init__(self):
        super().__init__()
        self.fc, self.bn = nn.Linear(K, N), nn.BatchNorm2d(3)

    def forward(self, x):
        return torch.softmax(self.bn(self.fc(x)), 1)


class ComputedScale(ReferenceModel):
    def forward(self, x):
        return self.softmax(self.scale.exp() * self.bn(self.gemm(x)))


class ConstantTensorScale(ReferenceModel):
    def forward(self, x):
        return self.softmax(torch.tensor(2.0) * self.bn(self.gemm(x)))


class DataDependent(ReferenceModel):
    def forward(self, x):
        if x.sum() > 0:
            x = x * 2
        return super().forward(x)


class LogSoftmax(ReferenceModel):
    def forward(self, x):
        return torch.log_softmax(self.scale * self.bn(self.gemm(x)), 1)


class TrainingBranch(ReferenceModel):
    """A forward that branches on self.training (as F.dropout(training=self.training) does)."""

    def forward(self, x):
        if self.training:
            x = x * 0.5
        return super().forward(x)


class OptionalArgument(ReferenceModel):
    def forward(self, x, temperature=None):
        z = self.scale * self.bn(self.gemm(x))
        if temperature is not None:
            z = z / temperature
        return self.softmax(z)


class FunctionalHead(nn.Module):
    """The block written with functions on the module's own tensors: F.linear with keywords, then
    torch.batch_norm (its own argument order) or F.batch_norm with keywords, torch.mul, torch.softmax."""

    def __init__(self, batch_norm="torch.batch_norm", bias_shape=(N,), bn_bias=True):
        super().__init__()
        self.batch_norm = batch_norm
        self.weight = nn.Parameter(torch.randn(N, K) / K ** 0.5)
        self.bias = nn.Parameter(0.1 * torch.randn(bias_shape))  # (1,) or (1, N): broadcast, not the op's
        self.gamma = nn.Parameter(torch.ones(N))
        self.beta = nn.Parameter(torch.zeros(N)) if bn_bias else None  # weight without bias: not the op's
        self.scale = nn.Parameter(torch.ones(1))
        self.register_buffer("mean", torch.zeros(N))
        self.register_buffer("var", torch.ones(N))

    def forward(self, x):
        y = F.linear(x, self.weight, bias=self.bias)
        if self.batch_norm == "torch.batch_norm":
            z = torch.batch_norm(y, self.gamma, self.beta, self.mean, self.var, self.training, 0.1, 1e-5, False)
        else:
            z = F.batch_norm(y, self.mean, self.var, weight=self.gamma, bias=self.beta, training=self.training,
                             momentum=0.1, eps=1e-5)
        return torch.softmax(torch.mul(z, self.scale), dim=1)


# ---- convert: blocks that are replaced ----------------------------------------------------------

def test_sequential_linear_batchnorm_softmax():
    model = randomize(nn.Sequential(nn.Linear(K, N), nn.BatchNorm1d(N), nn.Softmax(1)))
    report = check_converted(model, rand(16, K))
    assert [b.chain for b in report.replaced] == ["Linear 0 -> BatchNorm1d 1 -> Softmax 2 (dim=1)"]
    assert isinstance(model[0], nn.Linear) and len(model) == 3  # the Sequential's children are untouched


@pytest.mark.parametrize("scale_shape", [(1,), (N,), (1, N)], ids=str)
def test_reference_model(scale_shape):
    report = check_converted(randomize(ReferenceModel(K, N, scale_shape=scale_shape)), rand(16, K))
    assert report.replaced[0].chain == "Linear gemm -> BatchNorm1d bn -> * scale -> Softmax softmax (dim=1)"


@pytest.mark.parametrize("softmax", ["torch.softmax", "F.softmax", "Tensor.softmax", "nn.Softmax"])
def test_softmax_spellings(softmax):
    report = check_converted(randomize(Head(softmax=softmax)), rand(16, K))
    assert report.replaced[0].chain.startswith("Linear proj -> BatchNorm1d norm -> * temperature")


@pytest.mark.parametrize("scale", ["scale*z", "z*scale", "torch.mul", "float", "per-column", "(1, N)", "buffer", None])
def test_scale_spellings(scale):
    check_converted(randomize(Head(scale=scale)), rand(16, K))


@pytest.mark.parametrize("variant", [dict(affine=False), dict(bias=False), dict(track=False), dict(momentum=None)],
                         ids=lambda v: "-".join(f"{k}={a}" for k, a in v.items()))
def test_module_options(variant):
    check_converted(randomize(Head(**variant)), rand(16, K), steps=4)


def test_converted_in_eval_mode_then_trained():
    model = randomize(ReferenceModel(K, N)).eval()
    baseline = copy.deepcopy(model)
    convert_quietly(model, 1)
    x = torch.rand(5, K)
    with torch.no_grad():
        torch.testing.assert_close(op_calls(lambda: model(x))[0], baseline(x), rtol=1e-4, atol=1e-6)
    model.train(), baseline.train()
    torch.testing.assert_close(model(x), baseline(x), rtol=1e-4, atol=1e-6)
    assert torch.equal(model.bn.num_batches_tracked, baseline.bn.num_batches_tracked)
    torch.testing.assert_close(model.bn.running_var, baseline.bn.running_var)


def test_nested_blocks_and_scale_module():
    model = randomize(nn.Sequential(
        nn.Linear(K, K), nn.ReLU(),
        ReferenceModel(K, 16),
        nn.Sequential(nn.Linear(16, N), nn.BatchNorm1d(N), gbs.Scale(), nn.Softmax(dim=1)),
    ))
    report = check_converted(model, rand(16, K), expect_replaced=2)
    assert [b.module for b in report.replaced] == ["2", "3"]
    assert report.replaced[1].chain == "Linear 3.0 -> BatchNorm1d 3.1 -> * 3.2.scale -> Softmax 3.3 (dim=1)"


def test_stacked_blocks_in_one_forward():
    """One block's softmax feeds the next block's Linear (the second match's input is a node the first
    rewrite replaces)."""
    model = randomize(nn.Sequential(nn.Linear(K, 16), nn.BatchNorm1d(16), nn.Softmax(1),
                                    nn.Linear(16, N), nn.BatchNorm1d(N), nn.Softmax(1)))
    report = check_converted(model, rand(16, K), expect_replaced=2)
    assert [b.chain for b in report.replaced] == ["Linear 0 -> BatchNorm1d 1 -> Softmax 2 (dim=1)",
                                                 "Linear 3 -> BatchNorm1d 4 -> Softmax 5 (dim=1)"]


def test_forward_branching_on_training_keeps_both_branches():
    check_converted(randomize(TrainingBranch(K, N)), rand(16, K))


class SecondCallInTraining(nn.Module):
    """The same block called once in eval and twice in training."""

    def __init__(self):
        super().__init__()
        self.gemm, self.bn = nn.Linear(K, N), nn.BatchNorm1d(N)

    def forward(self, x):
        out = torch.softmax(self.bn(self.gemm(x)), 1)
        if self.training:
            out = out + torch.softmax(self.bn(self.gemm(2 * x)), 1)
        return out


def test_report_tags_the_second_call_that_only_training_runs():
    model = randomize(SecondCallInTraining())
    baseline = copy.deepcopy(model)
    report = gbs.convert(model).gemm_bn_softmax_report
    chain = "Linear gemm -> BatchNorm1d bn -> softmax(dim=1)"
    assert [b.chain for b in report.replaced] == [chain, chain + " (in training mode)"]
    x = torch.rand(16, K)
    for training, calls in ((True, 2), (False, 1)):
        model.train(training), baseline.train(training)
        out, n = op_calls(lambda: model(x))
        assert n == calls
        torch.testing.assert_close(out, baseline(x), rtol=1e-4, atol=1e-6)


def test_optional_arguments_run_the_original_forward():
    model = randomize(OptionalArgument(K, N))
    baseline = copy.deepcopy(model)
    check_converted(model, rand(16, K))
    model.load_state_dict(baseline.state_dict())
    model.train(), baseline.train()
    x = torch.rand(16, K)
    out, calls = op_calls(lambda: model(x, temperature=2.0))  # not the traced call: runs unfused
    assert calls == 0 and torch.equal(out, baseline(x, temperature=2.0))


def test_bfloat16_and_autocast():
    model = randomize(ReferenceModel(K, N, scale_shape=(N,)))
    baseline = copy.deepcopy(model)
    convert_quietly(model, 1)
    x = torch.rand(32, K)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, calls = op_calls(lambda: model(x))
        want = baseline(x)
    assert calls >= 1 and out.dtype == want.dtype  # (the profiler counts the autocast re-dispatch too)
    assert rel_err(out, want) <= 1e-2
    model.bfloat16(), baseline.bfloat16()
    out, calls = op_calls(lambda: model(x.bfloat16()))
    want = baseline(x.bfloat16())
    assert calls == 1 and out.dtype == torch.bfloat16 and rel_err(out, want) <= 1e-2


def test_unsupported_call_runs_the_modules_with_a_warning():
    """A converted block given what the op cannot compute runs the original modules: same result."""
    model = randomize(nn.Sequential(nn.Linear(K, N), nn.BatchNorm1d(N), nn.Softmax(1)))
    baseline = copy.deepcopy(model)
    convert_quietly(model, 1)
    x3 = torch.rand(4, N, K)  # 3-D: BatchNorm1d normalizes axis 1, the op does not apply
    with pytest.warns(ConversionWarning, match="3-D"):
        assert torch.equal(model(x3), baseline(x3))
    model.double(), baseline.double()
    x = torch.rand(16, K, dtype=torch.float64)
    with pytest.warns(ConversionWarning, match="float64"):
        out, calls = op_calls(lambda: model(x))
    assert calls == 0 and torch.equal(out, baseline(x))
    assert torch.equal(model[1].running_mean, baseline[1].running_mean)


def test_convert_twice_deepcopy_and_pickle():
    model = randomize(ReferenceModel(K, N))
    baseline = copy.deepcopy(model)
    convert_quietly(model, 1)
    convert_quietly(model, 1)  # converting again is harmless
    x = torch.rand(16, K)
    model.eval(), baseline.eval()
    want = baseline(x)

    twin = copy.deepcopy(model)  # a deep copy stays converted, on its own parameters
    out, calls = op_calls(lambda: twin(x))
    assert calls == 1 and twin.forward.__self__ is twin
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-6)

    loaded = pickle.loads(pickle.dumps(model))  # pickled whole: comes back unconverted, same result
    out, calls = op_calls(lambda: loaded(x))
    assert calls == 0 and torch.equal(out, want)
    convert_quietly(loaded, 1)
    assert op_calls(lambda: loaded(x))[1] == 1


def test_no_block_warns():
    with pytest.warns(ConversionWarning, match="no Linear -> BatchNorm1d"):
        gbs.convert(nn.Sequential(nn.Linear(K, N), nn.ReLU()))


# ---- convert: blocks that must not be replaced --------------------------------------------------

@pytest.mark.parametrize("model, make_input, reason", [
    (ReluBeforeSoftmax(K, N), rand(16, K), "goes to relu(), not a softmax"),
    (ScaleBeforeBN(K, N), rand(16, K), "the BatchNorm1d input is mul(), not an nn.Linear output"),
    (SoftmaxDim0(K, N), rand(16, K), "over dim 0"),
    (ReturnsBN(K, N), rand(16, K), "the BatchNorm1d output is also used by"),
    (ReturnsLinear(K, N), rand(16, K), "the Linear output is also used by the forward's output"),
    (BatchNorm2dHead(), rand(4, 3, 5, K), "BatchNorm2d is not nn.BatchNorm1d"),
    (ComputedScale(K, N), rand(16, K), "is not a parameter, a buffer or a constant"),
    (ConstantTensorScale(K, N), rand(16, K), "creates a tensor from constants"),
    (DataDependent(K, N), rand(16, K), "torch.fx cannot trace it"),
    (LogSoftmax(K, N), rand(16, K), "goes to log_softmax(), not a softmax"),
], ids=lambda v: type(v).__name__ if isinstance(v, nn.Module) else "")
def test_not_the_block_is_left_alone(model, make_input, reason):
    check_left_alone(randomize(model), make_input, reason)


def test_module_with_hooks_is_left_alone():
    model = randomize(ReferenceModel(K, N))
    model.gemm.register_forward_hook(lambda m, i, o: o * 2)
    check_left_alone(model, rand(16, K), "has hooks")


def test_report_lists_replaced_and_skipped():
    # a ModuleDict has no forward of its own: not traced, not reported
    model = nn.ModuleDict({"good": ReferenceModel(K, N), "bad": ReluBeforeSoftmax(K, N)})
    with pytest.warns(ConversionWarning, match=r"bad: Linear bad\.gemm"):
        gbs.convert(model)
    report = model.gemm_bn_softmax_report
    assert [b.module for b in report.replaced] == ["good"] and [b.module for b in report.skipped] == ["bad"]
    assert "replaced 1 block(s), left 1 unfused" in str(report)


# ---- torch.compile ------------------------------------------------------------------------------

@contextlib.contextmanager
def fresh_compile():
    from torch._inductor.utils import fresh_cache

    torch._dynamo.reset()
    with fresh_cache():  # no cache hit may hide the generated code
        yield
    torch._dynamo.reset()


@pytest.fixture
def compile_fusion():
    gbs.enable_compile_fusion()
    yield
    gbs.disable_compile_fusion()


def compiled_code(fn):
    """(fn's result, Inductor's generated code for everything fn compiled)."""
    from torch._inductor.utils import run_and_get_code

    with fresh_compile():
        out, code = run_and_get_code(fn)
    return out, "\n".join(code)


def train_step(model, x, g):
    out = model(x)
    (out * g).sum().backward()
    return out


def scalar_scale_grad_terms(model64, scale_name, x64, g64):
    """The magnitude of the terms that a one-element scale's gradient sums, in float64: sum over
    every logit of |dlogit * z|, z the tensor the model multiplies the scale by (taken from one
    forward of a copy of model64)."""
    model64 = copy.deepcopy(model64)
    scale, z = model64.get_parameter(scale_name), []

    class TakeTheScaledTensor(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in ("mul", "__mul__", "__rmul__") and len(args) == 2:
                if args[0] is scale or args[1] is scale:
                    z.append(args[1] if args[0] is scale else args[0])
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), TakeTheScaledTensor():
        out = model64(x64)
    assert len(z) == 1, f"{scale_name} multiplies {len(z)} tensors"
    dlogit = out * (g64 - (out * g64).sum(1, keepdim=True))
    return (dlogit * z[0]).abs().sum().item()


@pytest.mark.parametrize("model", [
    ReferenceModel(K, N, scale_shape=(N,)),
    Head(softmax="Tensor.softmax", scale="z*scale"),
    Head(softmax="F.softmax", scale="float"),
    nn.Sequential(nn.Linear(K, N), nn.BatchNorm1d(N), nn.Softmax(-1)),
    FunctionalHead("torch.batch_norm"),
    FunctionalHead("F.batch_norm"),
], ids=["reference", "Tensor.softmax-z*scale", "F.softmax-float", "sequential", "torch.batch_norm", "F.batch_norm"])
def test_compile_runs_the_fused_op_in_training_and_eval(compile_fusion, model):
    model = randomize(model)
    baseline = copy.deepcopy(model)
    exact = copy.deepcopy(model).double()
    compiled = torch.compile(model, fullgraph=True)
    x, g = torch.rand(16, K), torch.randn(16, N)

    out, code = compiled_code(lambda: train_step(compiled, x, g))
    assert "torch.ops.fused.gemm_bn_softmax.default" in code
    assert "torch.ops.fused.gemm_bn_softmax_backward" in code  # the op's own backward
    torch.testing.assert_close(out, train_step(baseline, x, g), rtol=1e-4, atol=1e-6)
    train_step(exact, x.double(), g.double())
    linear_bias = model.bias if isinstance(model, FunctionalHead) else next(
        m.bias for m in model.modules() if isinstance(m, nn.Linear))
    for (name, p), q, r in zip(model.named_parameters(), baseline.parameters(), exact.parameters()):
        if p is linear_bias:
            assert_cancelled_bias_grad(p.grad, q.grad, name)
        elif p.numel() == 1:
            # a scalar temperature: one sum over the batch whose terms cancel
            terms = scalar_scale_grad_terms(exact, name, x.double(), g.double())
            assert_batch_sum_grad_close(p.grad, q.grad, r.grad, terms, TOL[torch.float32], name)
        else:
            # Against float64, as accurate as eager fp32 (within 2x) or the fp32 contract (1e-5). Not
            # element by element against eager: BatchNorm's backward cancels terms of the gradient's
            # size, so an element near 0 carries both implementations' rounding (up to ~1e-5 here)
            # at a relative size of 1e-3.
            assert rel_err(p.grad, r.grad) <= max(2 * rel_err(q.grad, r.grad), TOL[torch.float32]), name
    for (name, a), b in zip(model.state_dict().items(), baseline.state_dict().values()):
        # running statistics, num_batches_tracked
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")

    model.eval(), baseline.eval()
    with torch.no_grad():
        out, code = compiled_code(lambda: compiled(x))
        assert "torch.ops.fused.gemm_bn_softmax.default" in code
        torch.testing.assert_close(out, baseline(x), rtol=1e-4, atol=1e-6)


def test_compile_of_a_converted_model():
    model = randomize(ReferenceModel(K, N))
    baseline = copy.deepcopy(model)
    convert_quietly(model, 1)
    x = torch.rand(16, K)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConversionWarning)
        out, code = compiled_code(lambda: torch.compile(model, fullgraph=True)(x))
    assert "torch.ops.fused.gemm_bn_softmax.default" in code
    torch.testing.assert_close(out, baseline(x), rtol=1e-4, atol=1e-6)


def test_compile_without_the_hook_does_not_fuse():
    """The control: the same compile with the pass not installed has no fused op."""
    assert not gbs.compile_fusion_enabled()
    model = randomize(ReferenceModel(K, N))
    out, code = compiled_code(lambda: torch.compile(model, fullgraph=True)(torch.rand(16, K)))
    assert "gemm_bn_softmax" not in code


@pytest.mark.parametrize("model, x_shape", [
    (ReluBeforeSoftmax(K, N), (16, K)), (ReturnsBN(K, N), (16, K)), (ReturnsLinear(K, N), (16, K)),
    (SoftmaxDim0(K, N), (16, K)), (BatchNorm2dHead(), (4, 3, 5, K)),
    (FunctionalHead("F.batch_norm", bias_shape=(1,)), (16, K)),
    (FunctionalHead("F.batch_norm", bias_shape=(1, N)), (16, K)),
    (FunctionalHead("F.batch_norm", bn_bias=False), (16, K)),
], ids=["ReluBeforeSoftmax", "ReturnsBN", "ReturnsLinear", "SoftmaxDim0", "BatchNorm2dHead", "linear-bias-(1,)",
        "linear-bias-(1,N)", "batch_norm-weight-without-bias"])
def test_compile_leaves_other_models_unchanged(compile_fusion, model, x_shape):
    model = randomize(model)
    baseline = copy.deepcopy(model)
    x = torch.rand(x_shape)
    out, code = compiled_code(lambda: torch.compile(model, fullgraph=True)(x))
    assert "gemm_bn_softmax" not in code
    # The model's own function, in float64: Inductor's fp32 kernels (other reduction orders than
    # eager's) are held to the accuracy contract, not to eager's rounding element by element.
    want = baseline.double()(x.double())
    for a, b in zip(as_tuple(out), as_tuple(want)):
        assert rel_err(a, b) <= TOL[torch.float32], rel_err(a, b)


def test_compile_hook_chains_with_an_existing_pass_and_is_cacheable():
    from torch._inductor import config
    from torch._inductor.custom_graph_pass import CustomGraphPass

    from gemm_bn_softmax.compile_fusion import FusionPass

    class Existing(CustomGraphPass):
        calls = 0

        def __call__(self, graph):
            Existing.calls += 1

        def uuid(self):
            return "existing"

    existing = Existing()
    with config.patch(pre_grad_custom_pass=existing):
        gbs.enable_compile_fusion()
        gbs.enable_compile_fusion()  # idempotent
        installed = config.pre_grad_custom_pass
        assert isinstance(installed, FusionPass) and installed.previous is existing
        assert installed.uuid() is not None  # Inductor's FX graph cache stays on
        model = randomize(ReferenceModel(K, N))
        out, code = compiled_code(lambda: torch.compile(model)(torch.rand(16, K)))
        assert Existing.calls >= 1 and "torch.ops.fused.gemm_bn_softmax.default" in code
        gbs.disable_compile_fusion()
        assert config.pre_grad_custom_pass is existing and not gbs.compile_fusion_enabled()
    assert FusionPass(lambda graph: None).uuid() is None  # a pass without uuid keeps the chain uncacheable


@pytest.mark.parametrize("env, enabled", [("1", True), ("", False)])
def test_compile_hook_opt_in_by_environment(env, enabled):
    """Off unless asked for: importing the package neither installs the pass nor loads Inductor."""
    code = ("import sys, gemm_bn_softmax as g; loaded = 'torch._inductor' in sys.modules; "
            "print(g.compile_fusion_enabled(), loaded)")
    python_dir = os.path.dirname(os.path.dirname(gbs.__file__))
    env_vars = {**os.environ, "GEMM_BN_SOFTMAX_COMPILE_FUSION": env,
                "PYTHONPATH": os.pathsep.join([python_dir, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env_vars, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(enabled), str(enabled)]
