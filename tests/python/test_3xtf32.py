"""precision="3xtf32": fp32-grade GEMMs on Hopper's TF32 tensor cores, in the forward and in the
backward's GEMMs; refused with the reason wherever the sm90 kernels cannot run it; exact on the CPU.
Errors are against float64 on fresh random data, next to exact fp32's on the same problem."""
import pytest
import torch

from conftest import HAS_CUDA, IS_HOPPER, requires_hopper
from helpers import functional_ref64, rel_err

import gemm_bn_softmax as gbs


def _problem(m, n, k, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) / k ** 0.5
    b = torch.randn(n, generator=g)
    gamma, beta = 1 + 0.1 * torch.randn(n, generator=g), 0.1 * torch.randn(n, generator=g)
    return [t.to(device) for t in (x, w, b, gamma, beta)]


def _grads(x, w, b, gamma, beta, grad_out, precision):
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b, gamma, beta)]
    out = gbs.gemm_bn_softmax(*leaves[:3], bn_weight=leaves[3], bn_bias=leaves[4], scale=2.0, precision=precision)
    out.backward(grad_out)
    return out.detach(), [t.grad for t in leaves]


def _grads64(x, w, b, gamma, beta, grad_out):
    leaves = [t.detach().cpu().double().requires_grad_() for t in (x, w, b, gamma, beta)]
    out, _ = functional_ref64(*leaves[:3], gamma=leaves[3], beta=leaves[4], scale=2.0)
    out.backward(grad_out.cpu().double())
    return out.detach(), [t.grad for t in leaves]


def test_cpu_computes_3xtf32_exactly():
    x, w, b, gamma, beta = _problem(64, 48, 40, "cpu")
    grad_out = torch.randn(64, 48)
    three, three_grads = _grads(x, w, b, gamma, beta, grad_out, "3xtf32")
    exact, exact_grads = _grads(x, w, b, gamma, beta, grad_out, "highest")
    assert torch.equal(three, exact)
    for g3, g in zip(three_grads, exact_grads):
        assert torch.equal(g3, g)


def test_unknown_precision_lists_3xtf32():
    x, w, b, _, _ = _problem(8, 8, 8, "cpu")
    with pytest.raises(RuntimeError, match="'3xtf32'"):
        gbs.gemm_bn_softmax(x, w, b, precision="4xtf32")


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_generic_path_refuses_3xtf32():
    x, w, b, _, _ = _problem(64, 64, 64, "cuda")
    with pytest.raises(RuntimeError, match="precision '3xtf32' runs on the sm90 path only, and path 'generic'"):
        gbs.gemm_bn_softmax(x, w, b, precision="3xtf32", path="generic")


@pytest.mark.skipif(not HAS_CUDA or IS_HOPPER, reason="needs a CUDA GPU that is not a Hopper")
def test_non_hopper_gpu_refuses_3xtf32():
    x, w, b, _, _ = _problem(64, 64, 64, "cuda")
    with pytest.raises(RuntimeError, match="precision '3xtf32' runs on the sm90 path only.*compute capability 9"):
        gbs.gemm_bn_softmax(x, w, b, precision="3xtf32")


@requires_hopper
def test_unaligned_operands_refuse_3xtf32():
    x, w, b, _, _ = _problem(64, 64, 30, "cuda")  # K = 30: rows of 120 bytes, not TMA's 16-byte multiple
    with pytest.raises(RuntimeError, match="precision '3xtf32' runs on the sm90 path only.*K and the row strides"):
        gbs.gemm_bn_softmax(x, w, b, precision="3xtf32")
    assert gbs.dispatch_path(x, w, b, precision="highest") == "generic"  # exact fp32 still runs there


@requires_hopper
@pytest.mark.parametrize("m,n,k", [(512, 1024, 4096), (256, 512, 16384)])
def test_forward_gemm_as_accurate_as_exact_fp32(m, n, k):
    x, w, b, gamma, beta = _problem(m, n, k, "cuda", seed=k)
    assert gbs.dispatch_path(x, w, b, precision="3xtf32") == "sm90"
    scale = torch.tensor([2.0], device="cuda")
    run = {p: torch.ops.fused.gemm_bn_softmax(x, w, b, gamma, beta, None, None, None, scale, True, 0.1, 1e-5, p, None)
           for p in ("3xtf32", "highest", "tf32")}
    want, y64 = functional_ref64(x.cpu(), w.cpu(), b.cpu(), gamma.cpu(), beta.cpu(), scale=2.0)
    y_err = {p: rel_err(r[3], y64) for p, r in run.items()}
    out_err = {p: rel_err(r[0], want) for p, r in run.items()}
    print(f"\n{m}x{n}x{k}: y rel err {y_err}; out rel err {out_err}")
    assert y_err["3xtf32"] <= y_err["highest"]           # the GEMM: no worse than exact fp32
    assert y_err["3xtf32"] * 100 <= y_err["tf32"]
    assert out_err["3xtf32"] <= 1e-5                      # the fp32 accuracy contract of the whole op


@requires_hopper
@pytest.mark.parametrize("m", [1024, 1022, 1001])  # dW reduces over m: 1022 and 1001 are not multiples of 4 or 32
def test_gradients_as_accurate_as_exact_fp32(m):
    n, k = 1024, 512
    x, w, b, gamma, beta = _problem(m, n, k, "cuda", seed=m)
    grad_out = torch.randn(m, n, device="cuda")
    _, want = _grads64(x, w, b, gamma, beta, grad_out)
    _, three = _grads(x, w, b, gamma, beta, grad_out, "3xtf32")
    _, exact = _grads(x, w, b, gamma, beta, grad_out, "highest")
    _, tf32 = _grads(x, w, b, gamma, beta, grad_out, "tf32")
    for name, i in (("x", 0), ("weight", 1)):
        e3, e32, e1 = (rel_err(g[i], want[i]) for g in (three, exact, tf32))
        print(f"\ngrad {name} (M={m}): 3xtf32 {e3:.2e}, exact fp32 {e32:.2e}, tf32 {e1:.2e}")
        # dy is the same in both runs (the same kernels); the GEMMs differ: 3xTF32's sums are at
        # least as accurate, so the gradient is within exact fp32's error (1 % for noise in dy's share)
        assert e3 <= 1.01 * e32, name
        assert e3 * 20 <= e1, name


@requires_hopper
def test_3xtf32_is_deterministic():
    x, w, b, gamma, beta = _problem(512, 768, 2048, "cuda", seed=9)
    grad_out = torch.randn(512, 768, device="cuda")
    out1, g1 = _grads(x, w, b, gamma, beta, grad_out, "3xtf32")
    out2, g2 = _grads(x, w, b, gamma, beta, grad_out, "3xtf32")
    assert torch.equal(out1, out2)
    for a, c in zip(g1, g2):
        assert torch.equal(a, c)


@requires_hopper
def test_module_training_step_in_3xtf32():
    torch.manual_seed(3)
    mod = gbs.FusedGemmBNSoftmax(1024, 512, precision="3xtf32").cuda().train()
    opt = torch.optim.SGD(mod.parameters(), lr=0.1)
    x = torch.randn(256, 1024, device="cuda")
    out = mod(x)
    out.log().mean().backward()
    opt.step()
    assert torch.isfinite(out).all()
    assert all(torch.isfinite(p).all() for p in mod.parameters())
    assert int(mod.bn.num_batches_tracked) == 1


@requires_hopper
def test_backward_copies_no_operand_but_dy():
    # The backward's 3xTF32 GEMMs read W and x as stored. Their workspace holds dy's small parts (dx), or
    # dy^T and its small parts (dW), one GEMM at a time: 2 dy at most. A copy of W (64 MiB here) or of x
    # (4 MiB) on top would show in the peak: allowed are the gradients themselves, dy and that workspace.
    m, n, k = 256, 4096, 4096
    torch.manual_seed(5)
    mod = gbs.FusedGemmBNSoftmax(k, n, precision="3xtf32").cuda().train()
    x = torch.randn(m, k, device="cuda", requires_grad=True)
    out = mod(x)
    grad_out = torch.randn_like(out)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out.backward(grad_out)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    gradients = sum(p.numel() * 4 for p in mod.parameters()) + x.numel() * 4
    mib = 1 << 20
    print(f"\nbackward peak above its inputs: {extra / mib:.1f} MiB, of which gradients {gradients / mib:.1f} MiB")
    assert extra <= gradients + 3 * m * n * 4 + 2 * mib
