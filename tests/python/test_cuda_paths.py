"""CUDA paths (sm90 and generic) against the reference model, the accuracy contract (README),
determinism and dispatch. Skips without a GPU; sm90 cases skip without a Hopper GPU."""
import pytest
import torch

from conftest import HAS_CUDA, IS_HOPPER, requires_cuda, requires_hopper
from helpers import STAT_TOL, TOL, functional_ref64, make_models, rel_err

import gemm_bn_softmax as gbs
from gemm_bn_softmax.reference import ReferenceModel

pytestmark = requires_cuda

PATHS = ["generic", pytest.param("sm90", marks=requires_hopper)]
# mode -> (dtype, precision)
MODES = {"fp32": (torch.float32, "highest"), "tf32": (torch.float32, "tf32"),
         "bf16": (torch.bfloat16, None), "fp16": (torch.float16, None)}
# sm90 needs K % 8 (16-byte rows) and N % 4; these shapes fit both paths. Partial M tiles, partial N tiles;
# wide rows (the softmax's clusters of 3 and of 16 CTAs a row at 20000 and 131072 columns); a grid of six
# 128x128 tiles whose K loop sm90 splits over 4 CTAs in 16-bit modes, 8 in tf32 (200x264x4096); 128 tiles of
# 64x64 with ragged M, N and K, which sm90 runs as one kernel (1000x508x1000, on a Hopper GPU of 64 to 512 SMs);
# rows enough for the 16-bit softmax's CTAs to keep their coefficients in shared memory (2000x5000x64, on a GPU
# of up to 166 SMs).
SHAPES = [(2, 8, 16), (257, 136, 64), (300, 200, 264), (1000, 1028, 512), (64, 2048, 1024), (300, 20000, 64),
          (24, 131072, 32), (200, 264, 4096), (1000, 508, 1000), (2000, 5000, 64)]


def _tol(mode):
    dtype, precision = MODES[mode]
    return TOL["tf32"] if mode == "tf32" else TOL[dtype]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", ["tf32", "bf16", "fp16", "fp32"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_paths_match_reference_over_steps(path, mode, shape):
    dtype, precision = MODES[mode]
    if path == "sm90" and mode == "fp32":
        pytest.skip("exact fp32 is the generic path's job")
    m, n, k = shape
    ref, ref64, fused = make_models(k, n, dtype, "cuda")
    for step, training in enumerate((True, True, True, False)):
        for mod in (ref, ref64, fused):
            mod.train(training)
        x = torch.rand(m, k, device="cuda").to(dtype)
        assert gbs.dispatch_path(x, fused.gemm.weight, fused.gemm.bias, precision=precision, path=path) == path
        with torch.no_grad():
            want = ref64(x.double())
            got = gbs.gemm_bn_softmax(x, fused.gemm.weight, fused.gemm.bias, fused.bn.weight, fused.bn.bias,
                                      fused.bn.running_mean, fused.bn.running_var, fused.scale, training=training,
                                      momentum=0.1, eps=fused.bn.eps, num_batches_tracked=fused.bn.num_batches_tracked
                                      if training else None, precision=precision, path=path)
        err = rel_err(got, want)
        err_var = rel_err(fused.bn.running_var, ref64.bn.running_var)
        err_mean = rel_err(fused.bn.running_mean, ref64.bn.running_mean)
        bound, bound_var, bound_mean = _tol(mode), STAT_TOL[dtype], STAT_TOL[dtype]
        if dtype in (torch.bfloat16, torch.float16):
            # No output in this format beats the exact result rounded to it: at 131072 columns most
            # fp16 probabilities are subnormal, and that rounding alone is 1.6e-3 off in eval mode.
            bound = max(bound, 1.25 * rel_err(want.to(dtype), want))
        if mode == "tf32":
            # TF32 rounds the GEMM inputs: the bound is the contract's or eager TF32's own error on
            # this problem (eager steps its own copy of the running stats), whichever is larger.
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                with torch.no_grad():
                    eager_out = ref(x)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = False
            bound = max(bound, 1.25 * rel_err(eager_out, want))
            bound_var = max(bound_var, 1.25 * rel_err(ref.bn.running_var, ref64.bn.running_var))
            bound_mean = max(bound_mean, 1.25 * rel_err(ref.bn.running_mean, ref64.bn.running_mean))
        info = (f"step {step} training {training}: out {err:.2e} (bound {bound:.2e}) running_var {err_var:.2e} "
                f"(bound {bound_var:.2e}) running_mean {err_mean:.2e} (bound {bound_mean:.2e})")
        assert err <= bound and err_var <= bound_var and err_mean <= bound_mean, info


@pytest.mark.parametrize("path", PATHS)
def test_no_bias_affine_off_per_column_scale(path):
    torch.manual_seed(3)
    m, n, k = 130, 72, 96
    x, w = torch.rand(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    scale = torch.rand(n, device="cuda") + 0.5
    got = gbs.gemm_bn_softmax(x, w, None, None, None, None, None, scale, path=path)
    assert rel_err(got, functional_ref64(x, w, scale=scale)[0]) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("mode", list(MODES))
def test_accuracy_table_headline(mode):
    """The accuracy contract: rel error vs float64 on the headline shape, x ~ U[0,1), default init."""
    dtype, precision = MODES[mode]
    torch.manual_seed(0)
    m, n, k = 1024, 8192, 8192
    ref = ReferenceModel(k, n).cuda()
    fused = gbs.FusedGemmBNSoftmax(k, n, precision=precision).cuda()
    fused.load_state_dict(ref.state_dict())
    ref64 = ref.double()
    fused = fused.to(dtype)
    x = torch.rand(m, k, device="cuda")
    with torch.no_grad():
        want = ref64(x.double())
        got = fused(x.to(dtype))
    err = rel_err(got, want)
    print(f"{mode}: rel err {err:.3e} path {gbs.dispatch_path(x.to(dtype), fused.gemm.weight, precision=precision)}")
    assert err <= _tol(mode)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", ["bf16", "tf32", "fp32"])
def test_bitwise_deterministic(path, mode):
    dtype, precision = MODES[mode]
    if path == "sm90" and mode == "fp32":
        pytest.skip("exact fp32 is the generic path's job")
    torch.manual_seed(1)
    m, n, k = 1000, 1028, 512
    x, w = torch.rand(m, k, device="cuda").to(dtype), (torch.randn(n, k, device="cuda") * 0.05).to(dtype)
    b = torch.randn(n, device="cuda").to(dtype)
    results = []
    for _ in range(5):
        rm, rv = torch.zeros(n, device="cuda"), torch.ones(n, device="cuda")
        out = gbs.gemm_bn_softmax(x, w, b, running_mean=rm, running_var=rv, precision=precision, path=path)
        results.append((out, rm, rv))
    for out, rm, rv in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(rm, results[0][1]) and torch.equal(rv, results[0][2])


@pytest.mark.parametrize("path", PATHS)
def test_variance_accurate_at_large_mean_over_std(path):
    """|mean|/std ~ 1e3 per column: the batch variance of the y the op computed (returned as its 4th
    output) is as accurate as eager BatchNorm's on that same y, both against float64."""
    torch.manual_seed(2)
    m, n, k = 2048, 256, 128
    x = torch.randn(m, k, device="cuda")
    w = torch.randn(n, k, device="cuda") / k ** 0.5
    b = 1e3 * (1 + torch.rand(n, device="cuda")) * torch.sign(torch.randn(n, device="cuda"))
    rm, rv, nbt = torch.zeros(n, device="cuda"), torch.ones(n, device="cuda"), torch.zeros((), dtype=torch.long, device="cuda")
    precision = "tf32" if path == "sm90" else "highest"
    eps = 1e-30  # the smallest kind (batch statistics refuse 0, as torch does): invstd measures the variance
    out, mean, invstd, y, _ = torch.ops.fused.gemm_bn_softmax(x, w, b, None, None, rm, rv, nbt, torch.ones(1, device="cuda"),
                                                           True, 1.0, eps, precision, path)
    y64 = y.double()
    ours = rel_err(rv, y64.var(0, unbiased=True))
    ours_invstd = rel_err(invstd, (y64.var(0, unbiased=False) + eps).rsqrt())
    bn = torch.nn.BatchNorm1d(n, momentum=1.0, affine=False).cuda()  # eps does not enter running_var
    bn(y)
    eager = rel_err(bn.running_var, y64.var(0, unbiased=True))
    print(f"{path}: running_var rel err ours {ours:.2e} eager {eager:.2e}; invstd {ours_invstd:.2e}")
    info = f"running_var rel err ours {ours:.2e} eager {eager:.2e}; invstd {ours_invstd:.2e}"
    assert ours <= max(eager, 2e-5), info
    assert ours_invstd <= max(eager, 2e-5), info


@pytest.mark.skipif(not IS_HOPPER, reason="dispatch to sm90 needs a Hopper GPU")
def test_dispatch_rules():
    dev = "cuda"
    xb, wb = torch.rand(64, 64, device=dev, dtype=torch.bfloat16), torch.rand(32, 64, device=dev, dtype=torch.bfloat16)
    assert gbs.dispatch_path(xb, wb) == "sm90"
    xf, wf = xb.float(), wb.float()
    assert gbs.dispatch_path(xf, wf, precision="highest") == "generic"
    assert gbs.dispatch_path(xf, wf, precision="tf32") == "sm90"
    prev = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert gbs.dispatch_path(xf, wf) == "sm90"
        torch.set_float32_matmul_precision("highest")
        assert gbs.dispatch_path(xf, wf) == "generic"
    finally:
        torch.set_float32_matmul_precision(prev)
    odd = torch.rand(64, 63, device=dev, dtype=torch.bfloat16), torch.rand(32, 63, device=dev, dtype=torch.bfloat16)
    assert gbs.dispatch_path(*odd) == "generic"
    with pytest.raises(RuntimeError, match="sm90 kernel cannot run this problem"):
        gbs.gemm_bn_softmax(*odd, path="sm90")
    assert gbs.dispatch_path(xb, wb, path="generic") == "generic"


@pytest.mark.skipif(not IS_HOPPER, reason="dispatch to sm90 needs a Hopper GPU")
def test_auto_dispatch_runs_underfilled_grids_on_the_small_sm90_tile():
    # Grids that 256x128 tiles leave under one wave run the 128x128 ping-pong kernel, or where the
    # 128x128 grid fills at most half the SMs, the 128x128 kernel with K split over CTAs; auto dispatch
    # picks sm90 for them too, except where the 128x128 grid fills at most half the SMs with K >= 8192
    # (cuBLASLt is faster there), in every dtype. Rule: fused::cuda::sm90_preferred. Results stay
    # correct on every tile and both paths.
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert sms >= 2 * 64  # the shapes below assume an H100/H200-sized GPU

    def operands(m, n, k, dtype):
        return (torch.rand(m, k, device="cuda").to(dtype), (torch.randn(n, k, device="cuda") * 0.02).to(dtype))

    assert gbs.dispatch_path(*operands(128, 8192, 8192, torch.bfloat16)) == "generic"      # 64 128x128 tiles, K 8192
    assert gbs.dispatch_path(*operands(128, 8192, 8192, torch.float32), precision="tf32") == "generic"
    assert gbs.dispatch_path(*operands(2048, 512, 8192, torch.float16)) == "generic"       # 64 tiles
    assert gbs.dispatch_path(*operands(256, 8192, 8192, torch.bfloat16)) == "sm90"         # 128 tiles
    assert gbs.dispatch_path(*operands(256, 8192, 8192, torch.float32), precision="tf32") == "sm90"
    assert gbs.dispatch_path(*operands(128, 8192, 4096, torch.bfloat16)) == "sm90"         # 64 tiles, K 4096
    assert gbs.dispatch_path(*operands(1024, 8192, 8192, torch.bfloat16)) == "sm90"        # 512 tiles
    assert gbs.dispatch_path(*operands(1024, 2048, 4096, torch.bfloat16)) == "sm90"        # 128 tiles
    assert gbs.dispatch_path(*operands(1024, 2048, 4096, torch.float32), precision="tf32") == "sm90"
    assert gbs.dispatch_path(*operands(1024, 512, 4096, torch.bfloat16)) == "sm90"         # 32 tiles: K split
    for m, n, k, dtype, precision in ((256, 8192, 2048, torch.bfloat16, None), (1000, 2048, 512, torch.float32, "tf32"),
                                      (300, 1028, 256, torch.float16, None), (1000, 512, 3072, torch.float32, "tf32"),
                                      (130, 1028, 2048, torch.bfloat16, None)):
        x, w = operands(m, n, k, dtype)
        want, _ = functional_ref64(x, w)
        for path in ("sm90", "generic", None):
            got = gbs.gemm_bn_softmax(x, w, None, precision=precision, path=path)
            assert rel_err(got, want) <= TOL["tf32" if precision else dtype], (m, n, k, path)


@pytest.mark.skipif(HAS_CUDA and IS_HOPPER, reason="checks non-Hopper behaviour")
def test_non_hopper_uses_generic():
    x, w = torch.rand(8, 16, device="cuda", dtype=torch.bfloat16), torch.rand(8, 16, device="cuda", dtype=torch.bfloat16)
    assert gbs.dispatch_path(x, w) == "generic"


@pytest.mark.skipif(not IS_HOPPER, reason="dispatch to sm90 needs a Hopper GPU")
def test_tiny_tf32_batches_run_exact_fp32_on_the_generic_path():
    """M <= 16 in tf32: the generic path in exact fp32 (W-bound GEMM: TF32 buys no time, and BatchNorm
    amplifies its rounding at tiny batches). Rule: fused::cuda::choose_path."""
    n, k = 2048, 4096
    w = torch.randn(n, k, device="cuda") / k ** 0.5
    b = torch.randn(n, device="cuda")
    for m in (2, 5, 10, 16):
        x = torch.rand(m, k, device="cuda")
        assert gbs.dispatch_path(x, w, b, precision="tf32") == "generic", m
        want, y64 = functional_ref64(x, w, b)
        out, _, _, y, _ = torch.ops.fused.gemm_bn_softmax(x, w, b, None, None, None, None, None,
                                                          torch.ones(1, device="cuda"), True, 0.1, 1e-5, "tf32", None)
        exact, _, _, y_exact, _ = torch.ops.fused.gemm_bn_softmax(x, w, b, None, None, None, None, None,
                                                                  torch.ones(1, device="cuda"), True, 0.1, 1e-5,
                                                                  "highest", None)
        # exact fp32 accuracy: y as close to float64 as the "highest" run's (TF32 would be ~5e-4 off)
        assert rel_err(y, y64) <= max(2 * rel_err(y_exact, y64), 2e-6), m
        assert rel_err(out, want) <= max(2 * rel_err(exact, want), 1e-5), m
    x17 = torch.rand(17, k, device="cuda")
    assert gbs.dispatch_path(x17, w, b, precision="tf32") == "sm90"
    assert gbs.dispatch_path(torch.rand(8, k, device="cuda"), w, b, precision="tf32", path="sm90") == "sm90"


@pytest.mark.parametrize("layout", ["contiguous", "transposed_weight", "bf16", "offset_view"])
def test_dispatch_path_allocates_nothing(layout):
    """dispatch_path answers from the operands alone: no output, workspace or stand-in is allocated."""
    dtype = torch.bfloat16 if layout == "bf16" else torch.float32
    x, w = torch.rand(64, 256, device="cuda", dtype=dtype), torch.randn(128, 256, device="cuda", dtype=dtype)
    if layout == "transposed_weight":
        w = torch.randn(256, 128, device="cuda").t()  # the op would copy it: counts as a fresh allocation
    if layout == "offset_view":
        x = torch.rand(64 * 256 + 1, device="cuda")[1:].view(64, 256)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    paths = [gbs.dispatch_path(x, w, None, precision=p) for p in ("tf32", "highest")]
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before
    assert dtype == torch.bfloat16 or paths[1] == "generic"
    if IS_HOPPER:
        assert paths[0] == ("generic" if layout == "offset_view" else "sm90")


def test_zero_in_features_gives_the_bias():
    """K = 0: y = b (no product to run), then BatchNorm and softmax as usual."""
    for bias in (True, False):
        x, w = torch.rand(6, 0, device="cuda"), torch.rand(5, 0, device="cuda")
        b = torch.randn(5, device="cuda") if bias else None
        out, _, _, y, _ = torch.ops.fused.gemm_bn_softmax(x, w, b, None, None, None, None, None,
                                                          torch.ones(1, device="cuda"), False, 0.1, 1e-5, None,
                                                          "generic")
        assert torch.equal(y, (b if bias else torch.zeros(5, device="cuda")).expand(6, 5))
        assert torch.allclose(out, torch.full((6, 5), 0.2, device="cuda"))
