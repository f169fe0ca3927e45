"""keep_y and the recompute path: a forward whose y no backward will read need not keep y, and for
small K (bf16/fp16 K <= 128, tf32 K <= 64) path="recompute" then recomputes the GEMM in each pass
instead of writing y (asked for by name only: it saves y's memory, not time). The CPU cases run
everywhere; the CUDA cases skip without a GPU."""
import pytest
import torch

from conftest import DEVICES, requires_cuda
from helpers import STAT_TOL, TOL, make_models, op_args, rel_err

import gemm_bn_softmax as gbs

op = torch.ops.fused.gemm_bn_softmax.default


def _args(device, m=40, n=24, k=16, dtype=torch.float32, requires_grad=False, training=True):
    return op_args(device, m=m, n=n, k=k, dtype=dtype, training=training, requires_grad=requires_grad,
                   weight_scale=k ** -0.5)


def _clone(args):
    return tuple(a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                 for a in args)


@pytest.mark.parametrize("device", DEVICES)
def test_keep_y_false_returns_no_y_and_the_same_results(device):
    args = _args(device)
    kept = op(*_clone(args))
    dropped_args = _clone(args)
    dropped = op(*dropped_args, keep_y=False)
    assert kept[3].shape == (40, 24) and dropped[3].numel() == 0
    for name, a, b in zip(("out", "save_mean", "save_invstd", "row_lse"), (kept[0], kept[1], kept[2], kept[4]),
                          (dropped[0], dropped[1], dropped[2], dropped[4])):
        assert rel_err(b, a) <= 1e-6, name  # exact fp32: the generic path both times on CUDA
    assert rel_err(dropped_args[6], args[6]) > 0  # the running statistics moved


@pytest.mark.parametrize("device", DEVICES)
def test_autograd_keeps_y_when_a_gradient_can_be_asked_for(device):
    args = _args(device, requires_grad=True)
    out, _, _, y, _ = op(*args, keep_y=False)
    assert y.shape == (40, 24)  # kept: the backward reads it
    out.square().sum().backward()
    assert args[0].grad is not None and args[1].grad is not None
    with torch.no_grad():
        assert op(*_args(device, requires_grad=True), keep_y=False)[3].numel() == 0
    assert op(*_args(device), keep_y=False)[3].numel() == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad", "requires_grad"])
def test_opcheck_keep_y_false(device, requires_grad):
    torch.library.opcheck(op, _args(device, requires_grad=requires_grad), {"keep_y": False})


def test_recompute_path_is_a_cuda_path():
    with pytest.raises(RuntimeError, match="forces a CUDA path"):
        gbs.gemm_bn_softmax(torch.rand(4, 8), torch.rand(3, 8), path="recompute")
    assert gbs.dispatch_path(torch.rand(4, 8), torch.rand(3, 8), differentiable=False) == "cpu"


# ---- CUDA -------------------------------------------------------------------------------------

MODES = {"bf16": (torch.bfloat16, None), "fp16": (torch.float16, None), "tf32": (torch.float32, "tf32")}


@requires_cuda
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("shape", [(300, 200, 64), (1024, 1000, 32), (257, 136, 128), (64, 96, 8)],
                         ids=lambda s: "x".join(map(str, s)))
def test_recompute_matches_float64_over_steps(mode, shape):
    m, n, k = shape
    dtype, precision = MODES[mode]
    if mode == "tf32" and k > 64:
        pytest.skip("tf32 recomputes up to K = 64")
    ref, ref64, fused = make_models(k, n, dtype, "cuda")
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    try:
        for training in (True, True, False):
            for mod in (ref, ref64, fused):
                mod.train(training)
            x = torch.rand(m, k, device="cuda").to(dtype)
            # Never the automatic choice; asked for by name under no_grad.
            assert gbs.dispatch_path(x, fused.gemm.weight, fused.gemm.bias, precision=precision,
                                     differentiable=False) != "recompute"
            assert gbs.dispatch_path(x, fused.gemm.weight, fused.gemm.bias, precision=precision, path="recompute",
                                     differentiable=False) == "recompute"
            with torch.no_grad():
                want = ref64(x.double())
                bn = fused.bn
                got = gbs.gemm_bn_softmax(x, fused.gemm.weight, fused.gemm.bias, bn.weight, bn.bias, bn.running_mean,
                                          bn.running_var, fused.scale, training=training, momentum=0.1, eps=bn.eps,
                                          num_batches_tracked=bn.num_batches_tracked if training else None,
                                          precision=precision, path="recompute")
                eager = ref(x)
            bound = TOL[dtype] if mode != "tf32" else max(TOL["tf32"], 1.25 * rel_err(eager, want))
            assert rel_err(got, want) <= bound, (training, rel_err(got, want), rel_err(eager, want))
            assert rel_err(fused.bn.running_var, ref64.bn.running_var) <= max(STAT_TOL[dtype], 2e-3 if mode == "tf32"
                                                                               else 0)
            assert rel_err(fused.bn.running_mean, ref64.bn.running_mean) <= max(STAT_TOL[dtype],
                                                                                 2e-3 if mode == "tf32" else 0)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_recompute_matches_the_paths_that_write_y(dtype):
    """Same problem, y kept (sm90 or generic) and not (recompute): outputs within rounding, row_lse too."""
    precision = "tf32" if dtype == torch.float32 else None
    args = _args("cuda", m=513, n=520, k=64, dtype=dtype)
    kept = op(*_clone(args), precision)
    dropped = op(*_clone(args), precision, "recompute", keep_y=False)
    tol = 3e-3 if dtype == torch.float32 else 2e-5  # TF32 rounding differs between the GEMMs
    assert rel_err(dropped[0].float(), kept[0].float()) <= max(tol, 8e-3 if dtype == torch.bfloat16 else 0)
    assert rel_err(dropped[1], kept[1]) <= tol and rel_err(dropped[2], kept[2]) <= tol
    assert rel_err(dropped[4], kept[4]) <= tol


@requires_cuda
def test_recompute_is_deterministic():
    args = _args("cuda", m=700, n=900, k=128, dtype=torch.bfloat16)
    first = op(*_clone(args), None, "recompute", keep_y=False)
    second = op(*_clone(args), None, "recompute", keep_y=False)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@requires_cuda
def test_training_at_small_k_keeps_y_and_trains():
    """With gradients the op keeps y (the sm90 or generic path), and the step matches float64."""
    ref, ref64, fused = make_models(64, 256, torch.bfloat16, "cuda")
    x = torch.rand(512, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    x64 = x.detach().double().requires_grad_()
    out, out64 = fused(x), ref64(x64)
    g = torch.randn_like(out64)
    out.backward(g.to(out.dtype))
    out64.backward(g)
    assert rel_err(out, out64) <= TOL[torch.bfloat16]
    assert rel_err(fused.gemm.weight.grad, ref64.gemm.weight.grad) <= 2e-2
    assert gbs.dispatch_path(x, fused.gemm.weight, fused.gemm.bias) != "recompute"


@requires_cuda
def test_forced_recompute_refusals_say_why():
    x = torch.rand(64, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.rand(32, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(RuntimeError, match="never writes y, and y is kept"):
        gbs.gemm_bn_softmax(x, w, path="recompute")  # a gradient can be asked for: y is kept
    with torch.no_grad():
        with pytest.raises(RuntimeError, match="K must be at most 128"):
            gbs.gemm_bn_softmax(torch.rand(8, 256, device="cuda", dtype=torch.bfloat16),
                                torch.rand(16, 256, device="cuda", dtype=torch.bfloat16), path="recompute")
        with pytest.raises(RuntimeError, match="bf16, fp16 and tf32 only"):
            gbs.gemm_bn_softmax(torch.rand(8, 64, device="cuda"), torch.rand(16, 64, device="cuda"),
                                precision="highest", path="recompute")
        x_odd = torch.rand(8, 72, device="cuda", dtype=torch.bfloat16)[:, 1:65]  # 2 bytes off alignment
        w_odd = torch.rand(16, 64, device="cuda", dtype=torch.bfloat16)
        assert gbs.dispatch_path(x_odd.contiguous(), w_odd, path="recompute", differentiable=False) == "recompute"
        with pytest.raises(RuntimeError, match="16-byte aligned"):
            gbs.gemm_bn_softmax(x_odd, w_odd, path="recompute")
        assert torch.isfinite(gbs.gemm_bn_softmax(x_odd, w_odd)).all()  # the automatic path runs it


@requires_cuda
@pytest.mark.parametrize("training", [True, False], ids=["training", "eval"])
def test_a_column_tile_of_nan_makes_its_rows_nan_like_eager(training):
    """NaN in W's first 128 rows: every logit of one 128-column tile is NaN. The tile's row max must
    keep the NaN (a max that skipped it would leave -inf, the tile would add 0 to the row's sum, and
    the row would come out NaN at those columns only); torch.softmax gives NaN across the row."""
    args = list(_args("cuda", m=64, n=256, k=32, dtype=torch.bfloat16, training=training))
    args[1][0:128, 5] = float("nan")
    x, w, b, gamma, beta, rm, rv, _, scale, _, momentum, eps = args
    with torch.no_grad():
        got = op(*_clone(args), None, "recompute", keep_y=False)[0]
        y = torch.nn.functional.linear(x.float(), w.float(), b.float())
        eager = torch.softmax(torch.nn.functional.batch_norm(y, rm.clone(), rv.clone(), gamma, beta, training,
                                                             momentum, eps) * scale, 1)
    assert torch.isnan(eager).all()  # the premise
    assert torch.isnan(got).all(), f"{(~torch.isnan(got)).sum().item()} finite outputs"
