"""torch.library.opcheck (schema, fake/Meta kernel, mutation annotations) and torch.compile."""
import os
import re

import pytest
import torch

from conftest import DEVICES, IS_HOPPER, ROOT
from helpers import assert_cancelled_bias_grad, make_models, op_args, rel_err

import gemm_bn_softmax as gbs

op = torch.ops.fused.gemm_bn_softmax.default


VARIANTS = {"train": {}, "eval": {"training": False}, "momentum_none": {"momentum": None},
            "per_column_scale": {"scale_n": True}, "no_bias_no_affine": {"bias": False, "affine": False}}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "requires_grad"])
def test_opcheck(device, dtype, variant, requires_grad):
    """Schema, fake kernel, autograd registration and AOT dispatch; with requires_grad samples the
    op's Autograd kernel and its backward op are exercised too."""
    torch.library.opcheck(op, op_args(device, dtype=dtype, requires_grad=requires_grad, **VARIANTS[variant]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "requires_grad"])
def test_opcheck_3xtf32(device, requires_grad):
    """precision="3xtf32" (the CPU computes it exactly; CUDA runs the sm90 3xTF32 kernels, forward and
    backward GEMMs), N = 12 so that the sm90 path takes it."""
    if device == "cuda" and not IS_HOPPER:
        pytest.skip("3xtf32 runs on Hopper's sm90 kernels only")
    torch.library.opcheck(op, (*op_args(device, requires_grad=requires_grad, n=12), "3xtf32"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("variant", ["train", "eval", "per_column_scale", "no_bias_no_affine"])
def test_opcheck_backward_op(device, dtype, variant):
    x, w, b, gamma, beta, rm, rv, nbt, scale, training, momentum, eps = op_args(device, dtype=dtype, **VARIANTS[variant])
    out, mean, invstd, y, lse = op(x, w, b, gamma, beta, rm, rv, nbt, scale, training, momentum, eps)
    affine = gamma is not None
    mask = [True, True, b is not None, affine, affine, True]
    torch.library.opcheck(torch.ops.fused.gemm_bn_softmax_backward.default,
                          (torch.randn_like(out), y, mean, invstd, lse, x, w, gamma, beta, scale, training, mask))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_module(device):
    ref, ref64, fused = make_models(16, 10, torch.float32, device)
    compiled = torch.compile(fused, fullgraph=True, backend="inductor")
    for step in range(2):
        x = torch.rand(12, 16, device=device)
        with torch.no_grad():
            got = compiled(x)
            want = ref64(x.double())
        assert rel_err(got, want) <= 1e-5
        assert rel_err(fused.bn.running_var, ref64.bn.running_var) <= 2e-6  # mutation survives compile
        assert fused.bn.num_batches_tracked.item() == step + 1


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_functional_float_scale(device):
    def f(x, w, b):
        return gbs.gemm_bn_softmax(x, w, b, scale=2.0) * 3.0

    x, w, b = torch.rand(9, 7, device=device), torch.randn(5, 7, device=device), torch.randn(5, device=device)
    got = torch.compile(f, fullgraph=True)(x, w, b)
    assert torch.allclose(got, f(x, w, b), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_training_step_with_backward(device):
    """A compiled training step: forward (running stats mutated) and backward match the reference."""
    from gemm_bn_softmax.reference import ReferenceModel

    torch.manual_seed(0)
    ref = ReferenceModel(16, 10).to(device)
    fused = gbs.FusedGemmBNSoftmax(16, 10).to(device)
    fused.load_state_dict(ref.state_dict())
    compiled = torch.compile(fused, fullgraph=True)
    x, g = torch.rand(12, 16, device=device), torch.randn(12, 10, device=device)
    (compiled(x) * g).sum().backward()
    (ref(x) * g).sum().backward()
    for (name, a), (_, b) in zip(fused.named_parameters(), ref.named_parameters()):
        if a is fused.gemm.bias:
            assert_cancelled_bias_grad(a.grad, b.grad, name)
        else:
            assert torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-5), name
    assert torch.allclose(fused.bn.running_var, ref.bn.running_var, rtol=1e-6, atol=1e-7)
    assert fused.bn.num_batches_tracked.item() == ref.bn.num_batches_tracked.item() == 1


README = os.path.join(ROOT, "README.md")


def _readme_signature(op_name):
    """The README's "`torch.ops.fused.<op_name>(args) -> (returns)`": argument and return names, in order."""
    with open(README, encoding="utf-8") as f:
        text = f.read()
    found = re.search(r"`torch\.ops\.fused\." + op_name + r"\(([^`]*?)\)\s*->\s*\(([^`]*?)\)`", text, re.S)
    assert found, f"README states no signature for torch.ops.fused.{op_name}"
    def names(listed):
        return [part.split("=")[0].strip().rstrip("!") for part in listed.split(",")]
    return names(found.group(1)), names(found.group(2))


@pytest.mark.parametrize("op_name", ["gemm_bn_softmax", "gemm_bn_softmax_backward"])
def test_readme_states_the_registered_schema(op_name):
    """The API section's signatures are the registered ones: every argument, in order, and the outputs."""
    schema = getattr(torch.ops.fused, op_name).default._schema
    arguments, returns = _readme_signature(op_name)
    assert arguments == [a.name for a in schema.arguments]
    assert returns == [r.name for r in schema.returns]
