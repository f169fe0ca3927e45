"""Hard numerics against float64 and eager PyTorch, on every device (and both CUDA paths)."""
import pytest
import torch

from conftest import HAS_CUDA, IS_HOPPER
from helpers import functional_ref64, rel_err

import gemm_bn_softmax as gbs

# (device, path): CPU, and on a GPU both CUDA paths (sm90 only on Hopper).
TARGETS = [("cpu", None),
           pytest.param("cuda", "generic", marks=pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")),
           pytest.param("cuda", "sm90", marks=pytest.mark.skipif(not IS_HOPPER, reason="needs a Hopper GPU"))]
IDS = ["cpu", "cuda-generic", "cuda-sm90"]


def _precision(device, path, dtype):
    return "tf32" if (path == "sm90" and dtype == torch.float32) else None


@pytest.mark.parametrize("device,path", TARGETS, ids=IDS)
def test_large_mean_over_std_variance_as_good_as_eager(device, path):
    torch.manual_seed(0)
    m, n, k = 1024, 64, 32
    x = torch.randn(m, k, device=device)
    w = torch.randn(n, k, device=device) / k ** 0.5
    b = 1e3 * torch.sign(torch.randn(n, device=device))  # |mean| / std ~ 1e3
    rm, rv, nbt = torch.zeros(n, device=device), torch.ones(n, device=device), torch.zeros((), dtype=torch.long, device=device)
    out, mean, invstd, y, _ = torch.ops.fused.gemm_bn_softmax(x, w, b, None, None, rm, rv, nbt, torch.ones(1, device=device),
                                                           True, 1.0, 1e-5, _precision(device, path, x.dtype), path)
    var64 = y.double().var(0, unbiased=True)  # statistics of the y the op computed
    bn = torch.nn.BatchNorm1d(n, momentum=1.0, affine=False).to(device)
    bn(y)
    ours, eager = rel_err(rv, var64), rel_err(bn.running_var, var64)
    assert ours <= max(eager, 2e-5), f"ours {ours:.2e} eager {eager:.2e}"
    assert rel_err(mean, y.double().mean(0)) <= 1e-7


@pytest.mark.parametrize("device,path", TARGETS, ids=IDS)
def test_large_scale_logits(device, path):
    """scale 1e4: logits up to ~1e4, no overflow / NaN, and as accurate as eager."""
    torch.manual_seed(1)
    m, n, k = 64, 40, 24
    x, w, b = torch.rand(m, k, device=device), torch.randn(n, k, device=device), torch.randn(n, device=device)
    got = gbs.gemm_bn_softmax(x, w, b, scale=1e4, precision=_precision(device, path, x.dtype), path=path)
    want, _ = functional_ref64(x, w, b, scale=1e4)
    assert torch.isfinite(got).all()
    y = torch.nn.functional.linear(x, w, b)
    eager = torch.softmax(1e4 * torch.nn.functional.batch_norm(y, None, None, training=True), 1)
    limit = 1e-3 if path == "sm90" else max(1e-5, 2 * rel_err(eager, want))
    assert rel_err(got, want) <= limit


@pytest.mark.parametrize("device,path", TARGETS, ids=IDS)
def test_constant_columns_and_rows_take_the_eps_path(device, path):
    torch.manual_seed(2)
    m, n, k = 33, 16, 8
    x = torch.rand(m, k, device=device)
    w = torch.randn(n, k, device=device)
    w[3] = 0.0  # column 3 of y is the constant bias
    b = torch.randn(n, device=device)
    gamma, beta = torch.rand(n, device=device) + 0.5, torch.randn(n, device=device)
    got = gbs.gemm_bn_softmax(x, w, b, gamma, beta, precision=_precision(device, path, x.dtype), path=path)
    want, _ = functional_ref64(x, w, b, gamma, beta)
    assert rel_err(got, want) <= 1e-3 if path == "sm90" else rel_err(got, want) <= 1e-5
    # constant rows: every column has zero variance, every row is softmax(beta)
    xc = x[:1].expand(m, k).contiguous()
    got = gbs.gemm_bn_softmax(xc, w, b, gamma, beta, precision=_precision(device, path, x.dtype), path=path)
    assert torch.allclose(got, torch.softmax(beta, 0).expand(m, n), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device,path", TARGETS, ids=IDS)
def test_zero_variance_columns_stay_exact_where_the_shift_is_folded(device, path):
    """For 16-bit outputs the CUDA softmax takes the BatchNorm map as z = a y + (c - a mean) (one
    coefficient fewer to load). For a zero-variance column, a = gamma / sqrt(eps), that fold would put
    up to 1e-2 on every logit at means near 1000 (half an fp32 ulp of a mean, 3e5), twenty fp16
    half-ulps of the output; such columns are folded as a = 0, z = c, exactly. Every row equal: every
    column has zero variance, so out is softmax(beta) in every row, rounded to fp16. 512 x 4096, which
    runs the softmax after the GEMM (not the sm90 path's one-kernel form)."""
    torch.manual_seed(7)
    m, n, k = 512, 4096, 16
    x = torch.rand(1, k, device=device).expand(m, k).contiguous().half()
    w = torch.randn(n, k, device=device).half()
    b = (1000 + torch.randn(n, device=device)).half()
    gamma, beta = (torch.rand(n, device=device) + 0.5).half(), torch.randn(n, device=device).half()
    got = gbs.gemm_bn_softmax(x, w, b, gamma, beta, path=path)
    want = torch.softmax(beta.double(), 0).expand(m, n)
    assert rel_err(got, want) <= 4e-4  # fp16's rounding of the exact result: about 2.4e-4


# (1024, 512, 64): 128 tiles of 64x64, which the sm90 path runs as one kernel (on a Hopper GPU of 64 to 512 SMs).
@pytest.mark.parametrize("device,path", TARGETS, ids=IDS)
@pytest.mark.parametrize("where", ["x", "w"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("m, n, k", [(12, 8, 16), (1024, 512, 64)], ids=["12x8x16", "one_kernel"])
def test_non_finite_inputs_propagate_like_eager(device, path, where, value, m, n, k):
    torch.manual_seed(3)
    x, w, b = torch.rand(m, k, device=device), torch.randn(n, k, device=device), torch.randn(n, device=device)
    (x if where == "x" else w)[2, 5] = value
    precision = _precision(device, path, x.dtype)
    got = gbs.gemm_bn_softmax(x, w, b, precision=precision, path=path)
    y = torch.nn.functional.linear(x, w, b)
    eager = torch.softmax(torch.nn.functional.batch_norm(y, None, None, training=True), 1)
    assert torch.equal(torch.isnan(got), torch.isnan(eager))
    assert torch.equal(torch.isinf(got), torch.isinf(eager))
    finite = torch.isfinite(eager)
    assert torch.allclose(got[finite], eager[finite], rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("device,path", TARGETS, ids=IDS)
def test_fp16_inputs_whose_product_overflows_fp16(device, path):
    """y ~ 1e6 does not fit fp16: the fp32 intermediate keeps the result finite and right."""
    torch.manual_seed(4)
    m, n, k = 64, 32, 1024
    x = (torch.rand(m, k, device=device) * 100 + 100).half()
    w = (torch.rand(n, k, device=device) * 10).half()
    got = gbs.gemm_bn_softmax(x, w, None, path=path)
    want, y64 = functional_ref64(x, w, None)
    assert y64.abs().max() > 65504  # it really would overflow fp16
    assert torch.isfinite(got).all()
    assert rel_err(got, want) <= 1e-3


@pytest.mark.parametrize("device,path", TARGETS, ids=IDS)
@pytest.mark.parametrize("m", [2, 3])
def test_tiny_batches(device, path, m):
    torch.manual_seed(5)
    n, k = 24, 16
    x, w, b = torch.rand(m, k, device=device), torch.randn(n, k, device=device), torch.randn(n, device=device)
    got = gbs.gemm_bn_softmax(x, w, b, precision=_precision(device, path, x.dtype), path=path)
    want, _ = functional_ref64(x, w, b)
    assert rel_err(got, want) <= (5e-4 if path == "sm90" else 1e-5)


@pytest.mark.parametrize("device,path", TARGETS, ids=IDS)
def test_very_wide_rows(device, path):
    torch.manual_seed(6)
    m, n, k = 4, 1 << 20, 8
    x = torch.rand(m, k, device=device).to(torch.bfloat16)
    w = torch.randn(n, k, device=device).to(torch.bfloat16)
    got = gbs.gemm_bn_softmax(x, w, None, scale=3.0, path=path)
    want, _ = functional_ref64(x, w, None, scale=3.0)
    assert rel_err(got, want) <= 7e-3


@pytest.mark.parametrize("device,path", TARGETS, ids=IDS)
def test_nan_in_the_first_columns_of_very_wide_rows_propagates_like_eager(device, path):
    """N > 131072 (the streaming softmax on CUDA): four adjacent NaN columns of y (a NaN in four rows
    of W) are the first values one of that kernel's threads reads in every row; each row is NaN
    everywhere, as in eager, not only at those columns."""
    torch.manual_seed(7)
    m, n, k = 4, 131076, 8
    x, w, b = torch.rand(m, k, device=device), torch.randn(n, k, device=device), torch.randn(n, device=device)
    w[0:4, 3] = float("nan")
    got = gbs.gemm_bn_softmax(x, w, b, precision=_precision(device, path, x.dtype), path=path)
    eager = torch.softmax(torch.nn.functional.batch_norm(torch.nn.functional.linear(x, w, b), None, None,
                                                         training=True), 1)
    assert torch.isnan(eager).all()
    assert torch.isnan(got).all(), f"{(~torch.isnan(got)).sum().item()} elements are not NaN"
