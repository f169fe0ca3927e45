"""The op and module against the reference model (outputs and running-stat side effects)."""
import pytest
import torch

from conftest import DEVICES
from helpers import STAT_TOL, TOL, functional_ref64, make_models, rel_err

import gemm_bn_softmax as gbs
from gemm_bn_softmax.reference import ReferenceModel

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (M, N, K): odd, 1-off, primes, N >> K, K >> N
SHAPES = [(2, 3, 5), (31, 17, 13), (127, 129, 65), (257, 64, 1023), (64, 1031, 7), (33, 8, 2048), (128, 256, 128)]


def _step_and_compare(ref64, fused, x, dtype, training):
    ref64.train(training)
    fused.train(training)
    with torch.no_grad():
        want = ref64(x.double())
        got = fused(x)
    assert got.dtype == x.dtype and got.shape == want.shape
    assert rel_err(got, want) <= TOL[dtype]
    for name in ("running_mean", "running_var"):
        assert rel_err(getattr(fused.bn, name), getattr(ref64.bn, name)) <= STAT_TOL[dtype], name
    assert fused.bn.num_batches_tracked.item() == ref64.bn.num_batches_tracked.item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_training_steps_match_reference(device, dtype, shape):
    m, n, k = shape
    ref, ref64, fused = make_models(k, n, dtype, device)
    for _ in range(3):  # consecutive steps: running statistics accumulate
        x = torch.rand(m, k, device=device).to(dtype)
        _step_and_compare(ref64, fused, x, dtype, training=True)
    x = torch.rand(m, k, device=device).to(dtype)
    _step_and_compare(ref64, fused, x, dtype, training=False)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_eval_uses_running_stats(device, dtype):
    ref, ref64, fused = make_models(96, 80, dtype, device)
    x = torch.rand(1, 96, device=device).to(dtype)  # batch 1 is fine in eval
    _step_and_compare(ref64, fused, x, dtype, training=False)
    x = torch.rand(37, 96, device=device).to(dtype)
    _step_and_compare(ref64, fused, x, dtype, training=False)


@pytest.mark.parametrize("device", DEVICES)
def test_momentum_none_is_cumulative_average(device):
    ref, ref64, fused = make_models(40, 24, torch.float32, device, momentum=None)
    for _ in range(4):
        x = torch.rand(16, 40, device=device)
        _step_and_compare(ref64, fused, x, torch.float32, training=True)
    assert fused.bn.num_batches_tracked.item() == 4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale_shape", [(1,), (24,)], ids=["scalar", "per-column"])
def test_scale_shapes(device, scale_shape):
    ref, ref64, fused = make_models(40, 24, torch.float32, device, scale_shape=scale_shape)
    _step_and_compare(ref64, fused, torch.rand(9, 40, device=device), torch.float32, training=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale", [0.7, -2.0, 3])
def test_functional_float_scale(device, scale):
    m, n, k = 19, 21, 23
    x, w, b = torch.rand(m, k, device=device), torch.randn(n, k, device=device), torch.randn(n, device=device)
    got = gbs.gemm_bn_softmax(x, w, b, scale=scale)
    assert rel_err(got, functional_ref64(x, w, b, scale=scale)[0]) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("track", [True, False])
def test_module_variants(device, bias, affine, track):
    m, n, k = 33, 45, 27
    torch.manual_seed(5)
    ref = torch.nn.Sequential(torch.nn.Linear(k, n, bias=bias),
                              torch.nn.BatchNorm1d(n, affine=affine, track_running_stats=track),
                              torch.nn.Softmax(dim=1)).to(device).double()
    fused = gbs.FusedGemmBNSoftmax.from_modules(
        torch.nn.Linear(k, n, bias=bias), torch.nn.BatchNorm1d(n, affine=affine, track_running_stats=track)).to(device)
    with torch.no_grad():
        fused.gemm.load_state_dict({kk: v.float() for kk, v in ref[0].state_dict().items()})
        fused.bn.load_state_dict({kk: v.float() if v.is_floating_point() else v for kk, v in ref[1].state_dict().items()})
    for training in (True, True, False):
        ref.train(training)
        fused.train(training)
        x = torch.rand(m, k, device=device)
        with torch.no_grad():
            assert rel_err(fused(x), ref(x.double())) <= 1e-5
        if track:
            assert rel_err(fused.bn.running_var, ref[1].running_var) <= 2e-6
            assert fused.bn.num_batches_tracked.item() == ref[1].num_batches_tracked.item()


@pytest.mark.parametrize("device", DEVICES)
def test_state_dict_roundtrip_matches_reference_step_for_step(device):
    """FusedGemmBNSoftmax loaded from a reference model's state_dict matches it step for step."""
    torch.manual_seed(0)
    ref = ReferenceModel(64, 48).to(device)
    fused = gbs.FusedGemmBNSoftmax(64, 48).to(device)
    missing = fused.load_state_dict(ref.state_dict(), strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys
    assert set(fused.state_dict()) == set(ref.state_dict())
    for step in range(5):
        x = torch.rand(32, 64, device=device)
        with torch.no_grad():
            want, got = ref(x), fused(x)
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-6), step
        for key, value in ref.state_dict().items():
            assert torch.allclose(fused.state_dict()[key].double(), value.double(), rtol=1e-5, atol=1e-7), key


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch_and_zero_features(device):
    ref, ref64, fused = make_models(8, 6, torch.float32, device)
    rm = fused.bn.running_mean.clone()
    out = fused(torch.rand(0, 8, device=device))
    assert out.shape == (0, 6)
    assert torch.equal(fused.bn.running_mean, rm)  # eager leaves them alone too
    assert fused.bn.num_batches_tracked.item() == 1
    w = torch.randn(0, 8, device=device)
    out = gbs.gemm_bn_softmax(torch.rand(4, 8, device=device), w, None)
    assert out.shape == (4, 0)


@pytest.mark.parametrize("submodule", ["gemm", "bn"])
@pytest.mark.parametrize("hook", ["forward", "forward_pre", "full_backward"])
def test_hooks_on_a_submodule_raise_instead_of_being_skipped(submodule, hook):
    """The submodules hold state only; the fused op would skip their hooks (a drop-in user's activation
    capture or pruning hook), so the forward refuses; hooks on the module itself run."""
    _, _, fused = make_models(8, 6, torch.float32, "cpu")
    x = torch.rand(5, 8)
    calls = []
    fused(x)
    handle = getattr(getattr(fused, submodule), f"register_{hook}_hook")(lambda *args: calls.append(1))
    with pytest.raises(RuntimeError, match="hooks on its gemm or bn submodule would not run"):
        fused(x)
    handle.remove()
    fused.register_forward_hook(lambda *args: calls.append(1))
    fused(x)
    assert calls == [1]


@pytest.mark.parametrize("device", DEVICES + ["meta"])
def test_no_columns_give_each_row_an_empty_sum(device):
    """N = 0: each row's log-normaliser is log 0 = -inf (a column-parallel rank without columns adds
    nothing to the other ranks' rows), and an empty per-column scale is accepted."""
    x, w = torch.rand(4, 8, device=device), torch.randn(0, 8, device=device)
    empty = torch.empty(0, device=device)
    out, mean, invstd, y, row_lse = torch.ops.fused.gemm_bn_softmax(x, w, None, None, None, None, None, None, empty,
                                                                   True, 0.1, 1e-5)
    assert out.shape == (4, 0) and mean.shape == invstd.shape == (0,) and y.shape == (4, 0)
    assert row_lse.shape == (4,)
    if device != "meta":
        assert torch.equal(row_lse.cpu(), torch.full((4,), -torch.inf))


@pytest.mark.parametrize("device", DEVICES)
def test_noncontiguous_and_offset_views_are_correct(device):
    m, n, k = 24, 16, 40
    base_x = torch.rand(k + 3, m * 2, device=device)
    x = base_x[3:, ::2].t()  # transposed, strided, offset view: (m, k)
    w = torch.randn(k, n, device=device).t()  # transposed weight: (n, k)
    b = torch.randn(2 * n, device=device)[::2]
    got = gbs.gemm_bn_softmax(x, w, b)
    assert rel_err(got, functional_ref64(x, w, b)[0]) <= 1e-5


def test_convert_fuses_reference_blocks_and_sequentials_in_place():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.ReLU(),
        ReferenceModel(16, 12),
        torch.nn.Sequential(torch.nn.Linear(12, 10), torch.nn.BatchNorm1d(10), gbs.Scale(), torch.nn.Softmax(dim=1)),
    )
    model[2][2].scale.data.fill_(1.5)
    x = torch.rand(8, 16)
    import copy

    want = copy.deepcopy(model)(x)
    keys = list(model.state_dict())
    converted = gbs.convert(model)
    assert converted is model and list(model.state_dict()) == keys  # in place; same modules and keys
    assert [b.module for b in model.gemm_bn_softmax_report.replaced] == ["1", "2"]
    with torch.no_grad():
        got = model(x)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-6)


def test_backward_matches_reference():
    torch.manual_seed(0)
    m, n, k = 16, 12, 20
    ref64 = ReferenceModel(k, n, scale_shape=(n,)).double()
    with torch.no_grad():
        ref64.scale.uniform_(0.5, 2.0)
        ref64.bn.weight.uniform_(0.5, 1.5)
        ref64.bn.bias.normal_()
    fused = gbs.FusedGemmBNSoftmax(k, n, scale_shape=(n,))
    fused.load_state_dict({kk: v.float() if v.is_floating_point() else v for kk, v in ref64.state_dict().items()})
    x64 = torch.rand(m, k, dtype=torch.float64, requires_grad=True)
    x32 = x64.detach().float().requires_grad_()
    grad = torch.randn(m, n, dtype=torch.float64)
    for training in (True, False):
        ref64.train(training)
        fused.train(training)
        ref64.zero_grad()
        fused.zero_grad()
        x64.grad = x32.grad = None
        (ref64(x64) * grad).sum().backward()
        (fused(x32) * grad.float()).sum().backward()
        assert rel_err(x32.grad, x64.grad) <= 1e-4
        for (name, p64), (_, p32) in zip(ref64.named_parameters(), fused.named_parameters()):
            # the Linear bias gradient is ~0 in training (BatchNorm removes the mean): absolute floor
            assert torch.allclose(p32.grad.double(), p64.grad, rtol=1e-4, atol=1e-5), (training, name)


@pytest.mark.parametrize("device", DEVICES)
def test_mixed_bn_parameter_dtypes(device):
    """bf16 module whose BN affine is kept in fp32 and running stats in bf16: the fp32-copy path."""
    ref, ref64, fused = make_models(32, 24, torch.bfloat16, device)
    fused.bn.weight.data = fused.bn.weight.data.float()
    fused.bn.bias.data = fused.bn.bias.data.float()
    for training in (True, False):
        x = torch.rand(16, 32, device=device).to(torch.bfloat16)
        _step_and_compare(ref64, fused, x, torch.bfloat16, training)
    assert fused.bn.running_mean.dtype == torch.bfloat16


def test_module_refuses_missing_running_stats_with_tracking_on():
    fused = gbs.FusedGemmBNSoftmax(8, 4).eval()
    fused.bn.running_mean = None
    with pytest.raises(ValueError, match="track_running_stats is True but bn.running_mean"):
        fused(torch.rand(3, 8))


@pytest.mark.parametrize("device", DEVICES)
def test_module_reads_a_parametrized_weight(device):
    # The module reads its tensors from the modules' registries (fast); a parametrized weight is not
    # in the registry but a property, which must be what the op gets.
    from torch.nn.utils import parametrize

    class Doubled(torch.nn.Module):
        def forward(self, w):
            return 2 * w

    torch.manual_seed(4)
    fused = gbs.FusedGemmBNSoftmax(24, 16).to(device).eval()
    with torch.no_grad():
        fused.bn.running_mean.uniform_(-1, 1)
        fused.bn.running_var.uniform_(0.5, 2)
    x = torch.rand(5, 24, device=device)
    bn = fused.bn
    with torch.no_grad():
        want = gbs.gemm_bn_softmax(x, 2 * fused.gemm.weight, fused.gemm.bias, bn.weight, bn.bias, bn.running_mean,
                                   bn.running_var, fused.scale, training=False)
        parametrize.register_parametrization(fused.gemm, "weight", Doubled())
        got = fused(x)
    assert torch.equal(got, want)
