"""Every invalid input raises a clear error naming the argument: CPU, Meta (what torch.compile traces
with) and FakeTensor; CUDA when present. A failing call changes no buffer."""
import pytest
import torch

from conftest import DEVICES, HAS_CUDA

import gemm_bn_softmax as gbs  # loads the extension

op = torch.ops.fused.gemm_bn_softmax.default


def _args(device="cpu", m=8, n=6, k=4, dtype=torch.float32):
    f = dict(device=device)
    return dict(
        x=torch.rand(m, k, dtype=dtype, **f), weight=torch.randn(n, k, dtype=dtype, **f),
        bias=torch.randn(n, dtype=dtype, **f), bn_weight=torch.ones(n, **f), bn_bias=torch.zeros(n, **f),
        running_mean=torch.zeros(n, **f), running_var=torch.ones(n, **f),
        num_batches_tracked=torch.zeros((), dtype=torch.long, **f), scale=torch.ones(1, **f),
        training=True, momentum=0.1, eps=1e-5)


def _call(a):
    return op(a["x"], a["weight"], a["bias"], a["bn_weight"], a["bn_bias"], a["running_mean"], a["running_var"],
              a["num_batches_tracked"], a["scale"], a["training"], a["momentum"], a["eps"])


CASES = [
    ("x 3-D", lambda a: a.update(x=a["x"][None]), "x must be 2-D"),
    ("weight 1-D", lambda a: a.update(weight=a["weight"][0]), "weight must be 2-D"),
    ("K mismatch", lambda a: a.update(weight=torch.randn(6, 5, device=a["x"].device)), "must equal weight.size(1)"),
    ("float64", lambda a: a.update(x=a["x"].double(), weight=a["weight"].double()), "unsupported dtype"),
    ("int", lambda a: a.update(x=a["x"].int(), weight=a["weight"].int()), "unsupported dtype"),
    ("dtype mix", lambda a: a.update(weight=a["weight"].half()), "weight dtype"),
    ("bias length", lambda a: a.update(bias=a["bias"][:-1]), "bias must have shape"),
    ("bias dtype", lambda a: a.update(bias=a["bias"].half()), "bias dtype"),
    ("bn_weight length", lambda a: a.update(bn_weight=a["bn_weight"][:3]), "bn_weight must have shape"),
    ("bn_bias alone", lambda a: a.update(bn_weight=None), "bn_weight and bn_bias"),
    ("running_var length", lambda a: a.update(running_var=torch.ones(7, device=a["x"].device)), "running_var must have shape"),
    ("running_var alone", lambda a: a.update(running_var=None), "running_mean and running_var"),
    ("running int", lambda a: a.update(running_mean=a["running_mean"].long()), "running_mean must be float32"),
    ("nbt dtype", lambda a: a.update(num_batches_tracked=torch.zeros((), device=a["x"].device)), "num_batches_tracked"),
    ("batch 1", lambda a: a.update(x=a["x"][:1]), "Expected more than 1 value per channel when training"),
    ("scale (2, N)", lambda a: a.update(scale=torch.ones(2, 6, device=a["x"].device)), "scale must be a scalar"),
    ("scale (M, N)", lambda a: a.update(scale=torch.ones(8, 6, device=a["x"].device)), "scale must be a scalar"),
    ("scale int", lambda a: a.update(scale=torch.ones(1, dtype=torch.long, device=a["x"].device)), "scale must be a floating"),
    ("eps nan", lambda a: a.update(eps=float("nan")), "eps must be finite"),
    ("eps negative", lambda a: a.update(eps=-1e-5), "eps must be finite and non-negative"),
    ("eps 0 training", lambda a: a.update(eps=0.0), "batch_norm eps must be positive during training"),
    ("eps 0 eval without running stats", lambda a: a.update(eps=0.0, training=False, running_mean=None,
                                                             running_var=None), "eps must be positive"),
    ("momentum > 1", lambda a: a.update(momentum=1.5), "momentum must be in [0, 1]"),
    ("momentum < 0", lambda a: a.update(momentum=-0.1), "momentum must be in [0, 1]"),
    ("momentum None w/o nbt", lambda a: a.update(momentum=None, num_batches_tracked=None), "needs num_batches_tracked"),
]


def _pattern(message):
    return message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")


@pytest.mark.parametrize("device", DEVICES + ["meta"])
@pytest.mark.parametrize("name,mutate,message", CASES, ids=[c[0] for c in CASES])
def test_invalid_input_raises(device, name, mutate, message):
    a = _args(device)
    mutate(a)
    with pytest.raises((RuntimeError, ValueError), match=_pattern(message)):
        _call(a)


@pytest.mark.parametrize("name,mutate,message", CASES, ids=[c[0] for c in CASES])
def test_invalid_input_raises_under_fake_tensors(name, mutate, message):
    """What torch.compile sees: the same errors from the Meta kernel on FakeTensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = _args("cpu")
        mutate(a)
        with pytest.raises((RuntimeError, ValueError), match=_pattern(message)):
            _call(a)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,mutate", [("batch 1", lambda a: a.update(x=a["x"][:1])),
                                         ("momentum None, batch 1", lambda a: a.update(x=a["x"][:1], momentum=None))])
def test_failing_forward_changes_no_buffer(device, name, mutate):
    """num_batches_tracked moves only when the forward succeeds, together with the running statistics."""
    a = _args(device)
    a["num_batches_tracked"].fill_(5)
    mutate(a)
    rm, rv = a["running_mean"].clone(), a["running_var"].clone()
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        _call(a)
    assert a["num_batches_tracked"].item() == 5
    assert torch.equal(a["running_mean"], rm) and torch.equal(a["running_var"], rv)


@pytest.mark.parametrize("device", DEVICES)
def test_successful_forward_counts_the_batch(device):
    a = _args(device)
    a["momentum"] = None  # the cumulative average reads the count after this batch: 1 / 1
    a["running_mean"].fill_(100.0)
    _call(a)
    assert a["num_batches_tracked"].item() == 1
    y = a["x"].double() @ a["weight"].double().t() + a["bias"].double()
    assert torch.allclose(a["running_mean"].double(), y.mean(0), rtol=1e-5, atol=1e-6)


# The refusals F.batch_norm raises as ValueError (code that catches it must catch the op's too).
BATCH_NORM_VALUE_ERRORS = [c for c in CASES if c[0] in ("batch 1", "eps negative", "eps 0 training")]


@pytest.mark.parametrize("device", DEVICES + ["meta"])
@pytest.mark.parametrize("name,mutate,message", BATCH_NORM_VALUE_ERRORS, ids=[c[0] for c in BATCH_NORM_VALUE_ERRORS])
def test_batch_norm_refusals_are_value_errors_like_pytorch(device, name, mutate, message):
    a = _args(device)
    mutate(a)
    y = a["x"] @ a["weight"].t() + a["bias"]
    try:  # eager on the same arguments: a ValueError, or (an older torch) no refusal at all
        torch.nn.functional.batch_norm(y, a["running_mean"].clone(), a["running_var"].clone(), a["bn_weight"],
                                       a["bn_bias"], a["training"], a["momentum"], a["eps"])
    except ValueError:
        pass
    with pytest.raises(ValueError, match=_pattern(message)):
        _call(a)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.float64, torch.float64), (torch.float64, torch.float32),
                                             (torch.int64, torch.float32)], ids=["fp64", "fp64-x", "int64-x"])
def test_autocast_leaves_float64_and_integer_inputs_alone(device, x_dtype, w_dtype):
    """Autocast casts only floating, non-float64 tensors: the eager block fails on these (mixed dtypes);
    the op must refuse them too, not round them to the autocast dtype."""
    a = _args(device)
    a["x"], a["weight"] = (a["x"] * 10).to(x_dtype), a["weight"].to(w_dtype)
    with torch.autocast(device, dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="x has unsupported dtype"):
            _call(a)


def test_module_refuses_eps_zero_as_eager_does():
    """What a user's training loop sees: the same exception type from the fused module as from the block."""
    from gemm_bn_softmax.reference import ReferenceModel

    ref = ReferenceModel(5, 4, bn_eps=0.0)
    fused = gbs.FusedGemmBNSoftmax(5, 4, bn_eps=0.0)
    fused.load_state_dict(ref.state_dict())
    x = torch.randn(8, 5)
    with pytest.raises(ValueError, match="eps must be positive during training"):
        fused(x)
    try:
        ref(x)
    except ValueError:
        pass  # torch 2.14 refuses too; older versions ran it


def test_batch_one_in_training_raises_under_torch_compile():
    """The Meta kernel's check is what a compiled model hits (the eager check alone would let the trace
    return a (1, N) output)."""
    a = _args()
    a["x"] = a["x"][:1]
    fn = torch.compile(lambda x: _call(dict(a, x=x))[0], backend="eager", fullgraph=True)
    with pytest.raises(Exception, match="Expected more than 1 value per channel"):
        fn(a["x"])


@pytest.mark.parametrize("device", DEVICES + ["meta"])
def test_eval_batch_one_is_fine(device):
    a = _args(device)
    a["x"], a["training"] = a["x"][:1], False
    assert _call(a)[0].shape == (1, 6)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_mixed_devices_raise():
    a = _args("cpu")
    a["weight"] = a["weight"].cuda()
    with pytest.raises(RuntimeError, match="weight is on cuda"):
        _call(a)
    a = _args("cuda")
    a["running_mean"] = a["running_mean"].cpu()
    with pytest.raises(RuntimeError, match="running_mean is on cpu"):
        _call(a)


def test_bad_precision_and_path_strings():
    a = _args()
    with pytest.raises(RuntimeError, match="precision must be"):
        op(*[a[k] for k in ("x", "weight", "bias", "bn_weight", "bn_bias", "running_mean", "running_var",
                            "num_batches_tracked", "scale", "training", "momentum", "eps")], "fast")
    with pytest.raises(RuntimeError, match="path must be"):
        gbs.gemm_bn_softmax(a["x"], a["weight"], path="turbo")


def test_functional_scale_type_error():
    with pytest.raises(TypeError, match="scale must be a float or a tensor"):
        gbs.gemm_bn_softmax(torch.rand(4, 3), torch.rand(2, 3), scale="2")


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU-only behaviour")
def test_dispatch_path_cpu():
    assert gbs.dispatch_path(torch.rand(4, 3), torch.rand(2, 3)) == "cpu"


@pytest.mark.parametrize("device", DEVICES)
def test_dispatch_path_takes_a_batch_of_one(device):
    """The path does not depend on the batch statistics rule: M = 1 (eval) has a path too."""
    assert gbs.dispatch_path(torch.rand(1, 8, device=device), torch.rand(4, 8, device=device)) in (
        "cpu", "sm90", "generic")


@pytest.mark.parametrize("path", ["sm90", "generic"])
def test_forcing_a_cuda_path_with_cpu_tensors_raises(path):
    with pytest.raises(RuntimeError, match="forces a CUDA path"):
        gbs.gemm_bn_softmax(torch.rand(4, 3), torch.rand(2, 3), path=path)
    with pytest.raises(RuntimeError, match="forces a CUDA path"):
        gbs.dispatch_path(torch.rand(4, 3), torch.rand(2, 3), path=path)
