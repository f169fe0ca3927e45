"""Reference computations for the tests: the reference model (gemm_bn_softmax.reference,
nn.Linear -> nn.BatchNorm1d -> scale -> nn.Softmax(1) semantics) run in float64 on the same (rounded) parameters and inputs."""
import copy

import torch

from gemm_bn_softmax.reference import ReferenceModel

# Norm-wise relative error bounds vs float64: the accuracy contract (README, "Accuracy").
TOL = {torch.float32: 1e-5, "tf32": 5e-4, torch.bfloat16: 7e-3, torch.float16: 1e-3}
# Running statistics are stored in the module's dtype.
STAT_TOL = {torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}


def functional_ref64(x, w, b=None, gamma=None, beta=None, scale=1.0, eps=1e-5):
    """softmax(scale * batch_norm(x W^T + b)) in float64 with batch statistics; returns (out, y)."""
    y = x.double() @ w.double().t() + (b.double() if b is not None else 0)
    z = (y - y.mean(0)) / torch.sqrt(y.var(0, unbiased=False) + eps)
    if gamma is not None:
        z = z * gamma.double() + beta.double()
    s = scale.double() if isinstance(scale, torch.Tensor) else scale
    return torch.softmax(s * z, 1), y


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| in float64, on the CPU (the float64 references live there)."""
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    assert not torch.isnan(got).any(), "NaN in output (unwritten element?)"
    return ((got - want).norm() / want.norm().clamp_min(1e-300)).item()


def assert_cancelled_bias_grad(ours: torch.Tensor, eager: torch.Tensor, context=None):
    """The Linear bias's gradient in training. Batch statistics subtract any bias again, so its true
    gradient is 0 and eager's value is rounding noise (up to ~1e-5 in float32 where gamma/sigma is
    large); the op writes exactly 0. Ours may be at most twice eager's noise, or 1e-6."""
    assert ours.shape == eager.shape, (context, "bias", ours.shape, eager.shape)
    if eager.numel() == 0:  # a column-parallel rank without columns
        return
    bound = max(2 * eager.double().abs().max().item(), 1e-6)
    assert ours.double().abs().max().item() <= bound, (context, "bias", ours, eager)


def assert_batch_sum_grad_close(ours, eager, exact, term_magnitude, tol, context=None):
    """A gradient that is one sum over the whole batch, such as a one-element scale's (the sum of
    dlogit * z over every logit). Its terms cancel (each row's dlogits sum to 0), so the value can be
    far smaller than its terms and its relative error says little. Its error is measured against
    term_magnitude, the sum of the terms' magnitudes in float64 (what a float32 sum's rounding grows
    with): at most twice eager's error, or tol * term_magnitude."""
    err = abs(ours.double().item() - exact.double().item())
    err_eager = abs(eager.double().item() - exact.double().item())
    assert err <= max(2 * err_eager, tol * term_magnitude), (context, ours, eager, exact, term_magnitude)


def make_models(k, n, dtype, device, momentum=0.1, scale_shape=(1,), seed=0, randomize=True):
    """A reference model with non-trivial BN/scale parameters, its float64 twin and a fused copy."""
    from gemm_bn_softmax import FusedGemmBNSoftmax

    g = torch.Generator().manual_seed(seed)
    ref = ReferenceModel(k, n, bn_momentum=momentum, scale_shape=scale_shape)
    if randomize:
        with torch.no_grad():
            ref.bn.weight.copy_(0.5 + torch.rand(n, generator=g))
            ref.bn.bias.copy_(torch.randn(n, generator=g) * 0.1)
            ref.bn.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            ref.bn.running_var.copy_(0.5 + torch.rand(n, generator=g))
            ref.scale.copy_(1.0 + torch.rand(scale_shape, generator=g))
    fused = FusedGemmBNSoftmax(k, n, bn_momentum=momentum, scale_shape=scale_shape)
    fused.load_state_dict(ref.state_dict())
    ref, fused = ref.to(device=device, dtype=dtype), fused.to(device=device, dtype=dtype)
    ref64 = copy.deepcopy(ref).double()
    return ref, ref64, fused


def op_args(device, m=12, n=10, k=16, dtype=torch.float32, training=True, momentum=0.1, scale_n=False, bias=True,
            affine=True, requires_grad=False, weight_scale=1.0):
    """Fresh random positional arguments of torch.ops.fused.gemm_bn_softmax up to eps: x, weight,
    bias, bn_weight, bn_bias, running_mean, running_var, num_batches_tracked, scale, training,
    momentum, eps. requires_grad marks the differentiable ones (x, weight, bias, bn_weight, bn_bias,
    scale)."""
    f = dict(device=device)

    def param(t):
        return t.requires_grad_(requires_grad)

    return (param(torch.rand(m, k, dtype=dtype, **f)), param(torch.randn(n, k, dtype=dtype, **f) * weight_scale),
            param(torch.randn(n, dtype=dtype, **f)) if bias else None,
            param(torch.rand(n, **f) + 0.5) if affine else None, param(torch.randn(n, **f)) if affine else None,
            torch.randn(n, **f), torch.rand(n, **f) + 0.5, torch.zeros((), dtype=torch.long, **f),
            param(torch.rand(n if scale_n else 1, **f) + 0.5), training, momentum, 1e-5)
