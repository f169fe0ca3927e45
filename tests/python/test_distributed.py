"""Data parallelism with nn.SyncBatchNorm's semantics (gemm_bn_softmax.distributed).

1. The ops' math without processes: a batch split into "virtual ranks" whose records are stacked
   by hand gives the full batch's statistics, outputs and gradients (CPU, and CUDA where present).
2. The wiring with real processes (torch.multiprocessing, gloo on the CPU; 2 and 3 ranks, uneven
   batches, a rank with no rows): DDP + the fused module against the float64 full-batch reference,
   statistics bitwise identical on every rank (distributed_worker.py).
3. On two GPUs (NCCL): against nn.SyncBatchNorm + DDP itself (skipped without two GPUs).
"""
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from conftest import DEVICES
from helpers import assert_cancelled_bias_grad, rel_err

import gemm_bn_softmax as gbs  # noqa: F401  (registers the ops)
import distributed_worker

ops = torch.ops.fused
K, N = 12, 10


def make_block(device, dtype=torch.float32, affine=True, bias=True, column_scale=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = {"weight": torch.randn(N, K, generator=g) / K ** 0.5,
         "bias": 0.1 * torch.randn(N, generator=g) if bias else None,
         "bn_weight": 0.5 + torch.rand(N, generator=g) if affine else None,
         "bn_bias": 0.3 * torch.randn(N, generator=g) if affine else None,
         "scale": 1 + torch.rand(N if column_scale else 1, generator=g),
         "rm": 0.1 * torch.randn(N, generator=g), "rv": 0.5 + torch.rand(N, generator=g)}
    cast = {"weight": dtype, "bias": dtype}
    return {k: None if v is None else v.to(device=device, dtype=cast.get(k, torch.float32)) for k, v in t.items()}


def full_batch_op(x, t):
    """The single-device op over the whole batch: out, save_mean, save_invstd, y, row_lse and the
    running statistics after the update."""
    rm, rv = t["rm"].clone(), t["rv"].clone()
    outs = ops.gemm_bn_softmax(x, t["weight"], t["bias"], t["bn_weight"], t["bn_bias"], rm, rv, None, t["scale"],
                               True, 0.1, 1e-5)
    return outs, rm, rv


def split_forward(x, t, sizes):
    """The data-parallel forward with the collective done by hand: per slice, the moments record;
    stacked in rank order; then every slice's BatchNorm + softmax."""
    slices = list(torch.split(x, sizes))
    steps = [ops.gemm_column_moments(s, t["weight"], t["bias"]) for s in slices]
    rank_moments = torch.stack([m for _, m in steps])
    results = []
    for (y, _), s in zip(steps, slices):
        rm, rv = t["rm"].clone(), t["rv"].clone()
        out, mean, invstd, lse = ops.bn_softmax_from_moments(y, rank_moments, t["bn_weight"], t["bn_bias"], rm, rv,
                                                            None, t["scale"], 0.1, 1e-5, s.dtype, s.dtype)
        results.append({"out": out, "mean": mean, "invstd": invstd, "lse": lse, "y": y, "rm": rm, "rv": rv})
    return results


@pytest.mark.parametrize("device", DEVICES)
def test_one_rank_is_the_single_device_op_bit_for_bit(device):
    t = make_block(device)
    x = torch.rand(37, K, device=device)
    (out, mean, invstd, y, lse), rm, rv = full_batch_op(x, t)
    [r] = split_forward(x, t, [37])
    for name, want in [("out", out), ("mean", mean), ("invstd", invstd), ("y", y), ("lse", lse), ("rm", rm),
                       ("rv", rv)]:
        assert torch.equal(r[name], want), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sizes", [[5, 3], [1, 0, 6, 2], [0, 9]], ids=str)
@pytest.mark.parametrize("variant", ["default", "column_scale", "no_affine", "no_bias"])
def test_virtual_ranks_match_the_full_batch(device, sizes, variant):
    """Forward and backward of a batch split over ranks equal the full batch's (to rounding): the
    statistics, every rank's output rows, dx rows, and the sum over ranks of the parameter gradients."""
    t = make_block(device, **{"default": {}, "column_scale": {"column_scale": True}, "no_affine": {"affine": False},
                              "no_bias": {"bias": False}}[variant])
    M = sum(sizes)
    x = torch.rand(M, K, device=device) * 2 - 0.5
    g = torch.randn(M, N, device=device)
    (out, mean, invstd, y, lse), rm, rv = full_batch_op(x, t)
    parts = split_forward(x, t, sizes)
    for r in parts:  # every rank: the same statistics, bit for bit
        for name in ("mean", "invstd", "rm", "rv"):
            assert torch.equal(r[name], parts[0][name]), name
    assert rel_err(parts[0]["mean"], mean) < 1e-6 and rel_err(parts[0]["invstd"], invstd) < 1e-5
    assert rel_err(parts[0]["rm"], rm) < 1e-6 and rel_err(parts[0]["rv"], rv) < 1e-6
    assert rel_err(torch.cat([r["out"] for r in parts]), out) < 1e-5

    mask = [True, True, t["bias"] is not None, t["bn_weight"] is not None, t["bn_weight"] is not None, True]
    want = ops.gemm_bn_softmax_backward(g, y, mean, invstd, lse, x, t["weight"], t["bn_weight"], t["bn_bias"],
                                        t["scale"], True, mask)
    g_parts = torch.split(g, sizes)
    x_parts = torch.split(x, sizes)
    sums = [ops.gemm_bn_softmax_backward_sums(gp, r["y"], r["mean"], r["invstd"], r["lse"], t["bn_weight"],
                                              t["bn_bias"], t["scale"]) for gp, r in zip(g_parts, parts)]
    assert all(s[0][0].item() == m for s, m in zip(sums, sizes))  # each record counts its rows
    rank_sums = torch.stack([s for s, _ in sums])
    got = [ops.gemm_bn_softmax_backward(gp, r["y"], r["mean"], r["invstd"], r["lse"], xp, t["weight"], t["bn_weight"],
                                        t["bn_bias"], t["scale"], True, mask, None, None, row_sums, s, rank_sums)
           for gp, xp, r, (s, row_sums) in zip(g_parts, x_parts, parts, sums)]
    assert rel_err(torch.cat([gr[0] for gr in got]), want[0]) < 1e-5, "dx"
    for i, name in enumerate(["weight", "bias", "bn_weight", "bn_bias", "scale"], start=1):
        if want[i] is None:
            assert all(gr[i] is None for gr in got), name
            continue
        total = sum(gr[i] for gr in got)  # what DDP's average times world_size is
        if name == "bias":
            assert_cancelled_bias_grad(total, want[i], name)
        else:
            assert rel_err(total, want[i]) < 1e-5, name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("column_scale", [False, True], ids=["scalar_scale", "column_scale"])
def test_virtual_column_ranks_match_the_whole_block(device, column_scale):
    """Column parallelism's steps without processes: W's rows split into two "ranks" of columns
    (4 + 6), each rank's forward renormalised to the row's log-normaliser over both, each rank's
    row sums ([2, M]: sum g * out, sum out) added over the ranks and given back to the sums op and
    the backward (the path that places given row sums as the only strip). Its outputs and gradients
    equal the whole block's: dx summed over ranks, dW, the BN parameters and a per-column scale
    concatenated, a scalar scale's summed."""
    t = make_block(device, column_scale=column_scale, seed=3)
    M, cols = 9, [4, 6]
    x = torch.rand(M, K, device=device) * 2 - 0.5
    g = torch.randn(M, N, device=device)
    (out, mean, invstd, y, lse), _, _ = full_batch_op(x, t)
    mask = [True, True, True, True, True, True]
    want = ops.gemm_bn_softmax_backward(g, y, mean, invstd, lse, x, t["weight"], t["bn_weight"], t["bn_bias"],
                                        t["scale"], True, mask)

    def shard(name, part):
        v = t[name]
        return v if name == "scale" and not column_scale else torch.split(v, cols)[part]

    ranks = []
    for part in range(len(cols)):
        p = {name: shard(name, part) for name in ("weight", "bias", "bn_weight", "bn_bias", "scale", "rm", "rv")}
        o, m, s, yr, lr = ops.gemm_bn_softmax(x, p["weight"], p["bias"], p["bn_weight"], p["bn_bias"], p["rm"].clone(),
                                             p["rv"].clone(), None, p["scale"], True, 0.1, 1e-5)
        ranks.append({"p": p, "out": o, "mean": m, "invstd": s, "y": yr, "lse": lr,
                      "g": torch.split(g, cols, dim=1)[part].contiguous()})
    row_lse = torch.logsumexp(torch.stack([r["lse"] for r in ranks]), dim=0)
    got_out = torch.cat([r["out"] * torch.exp(r["lse"] - row_lse)[:, None] for r in ranks], dim=1)
    assert rel_err(got_out, out) < 1e-5
    for r in ranks:  # the backward sees the whole row's log-normaliser, as the column-parallel Function saves it
        r["args"] = (r["g"], r["y"], r["mean"], r["invstd"], row_lse, r["p"]["bn_weight"], r["p"]["bn_bias"],
                     r["p"]["scale"])
    local = [ops.gemm_bn_softmax_backward_sums(*r["args"])[1] for r in ranks]
    assert all(rs.shape == (2, M) for rs in local)
    row_sums = sum(local)
    got = []
    for r in ranks:
        sums, row_sums_out = ops.gemm_bn_softmax_backward_sums(*r["args"], row_sums)
        assert torch.equal(row_sums_out, row_sums)  # the given sums come back as they were
        got.append(ops.gemm_bn_softmax_backward(r["g"], r["y"], r["mean"], r["invstd"], row_lse, x,
                                                r["p"]["weight"], r["p"]["bn_weight"], r["p"]["bn_bias"],
                                                r["p"]["scale"], True, mask, None, None, row_sums, sums, sums[None]))
    assert rel_err(sum(gr[0] for gr in got), want[0]) < 1e-5, "dx"
    for i, name in enumerate(["weight", "bias", "bn_weight", "bn_bias", "scale"], start=1):
        total = sum(gr[i] for gr in got) if name == "scale" and not column_scale else torch.cat([gr[i] for gr in got])
        if name == "bias":
            assert_cancelled_bias_grad(total, want[i], name)
        else:
            assert rel_err(total, want[i]) < 1e-5, name


@pytest.mark.parametrize("device", DEVICES)
def test_bad_records_are_refused(device):
    t = make_block(device)
    x = torch.rand(6, K, device=device)
    y, moments = ops.gemm_column_moments(x, t["weight"], t["bias"])
    assert moments.shape == (2 * N + 1,) and moments.dtype == torch.float64 and moments[0].item() == 6
    args = (t["bn_weight"], t["bn_bias"], t["rm"].clone(), t["rv"].clone(), None, t["scale"], 0.1, 1e-5)
    with pytest.raises(RuntimeError, match=r"rank_moments must be float64 of shape \[world_size, 2 \* out_features"):
        ops.bn_softmax_from_moments(y, moments, *args)  # one record, not a table
    with pytest.raises(RuntimeError, match="rank_moments must be float64"):
        ops.bn_softmax_from_moments(y, moments[None].float(), *args)
    with pytest.raises(RuntimeError, match="rank_moments must be float64"):
        ops.bn_softmax_from_moments(y, torch.zeros(2, 2 * N, dtype=torch.float64, device=device), *args)
    out, mean, invstd, lse = ops.bn_softmax_from_moments(y, moments[None], *args)
    g = torch.randn_like(out)
    sums, row_sums = ops.gemm_bn_softmax_backward_sums(g, y, mean, invstd, lse, t["bn_weight"], t["bn_bias"], t["scale"])
    mask = [True, False, False, False, False, False]
    base = (g, y, mean, invstd, lse, x, t["weight"], t["bn_weight"], t["bn_bias"], t["scale"])
    with pytest.raises(RuntimeError, match="must be given together"):
        ops.gemm_bn_softmax_backward(*base, True, mask, None, None, None, None, sums[None])
    assert row_sums.dtype == torch.float64  # row sums in fp32 would lose what the backward's dz needs
    with pytest.raises(RuntimeError, match="row_sums must be"):  # a given row_sums (column parallelism)
        ops.gemm_bn_softmax_backward_sums(g, y, mean, invstd, lse, t["bn_weight"], t["bn_bias"], t["scale"],
                                          row_sums.float())
    with pytest.raises(RuntimeError, match="local_sums must be float64"):
        ops.gemm_bn_softmax_backward(*base, True, mask, None, None, row_sums, sums[:-1], sums[None])
    with pytest.raises(RuntimeError, match="row_sums must be"):
        ops.gemm_bn_softmax_backward(*base, True, mask, None, None, row_sums[:, :-1], sums, sums[None])
    with pytest.raises(RuntimeError, match=r"row_sums must be \[2, batch\]"):  # the row dots alone
        ops.gemm_bn_softmax_backward_sums(g, y, mean, invstd, lse, t["bn_weight"], t["bn_bias"], t["scale"],
                                          row_sums[0])


@pytest.mark.parametrize("device", DEVICES)
def test_an_unknown_group_name_is_refused(device):
    """The op resolves group_name through torch.distributed's registry: a name no group was
    registered under raises, naming it (in training, where the statistics would be exchanged)."""
    t = make_block(device)
    x = torch.rand(6, K, device=device)
    args = (x, t["weight"], t["bias"], t["bn_weight"], t["bn_bias"], t["rm"].clone(), t["rv"].clone(), None,
            t["scale"])
    with pytest.raises(RuntimeError, match="no-such-group"):
        ops.gemm_bn_softmax(*args, True, 0.1, 1e-5, group_name="no-such-group")
    # evaluation mode never exchanges statistics: the name is not looked up
    out = ops.gemm_bn_softmax(*args, False, 0.1, 1e-5, group_name="no-such-group")[0]
    assert torch.equal(out, ops.gemm_bn_softmax(*args, False, 0.1, 1e-5)[0])


def test_column_parallel_one_column_needs_the_scale_kind():
    """A rank holding one column cannot tell a one-element per-column scale from the shared scalar (whose
    gradient is summed over ranks): the functional form asks, before any collective."""
    from gemm_bn_softmax.distributed import column_parallel_gemm_bn_softmax

    x, w = torch.rand(6, K), torch.randn(1, K)
    with pytest.raises(ValueError, match="pass per_column_scale=True or False"):
        column_parallel_gemm_bn_softmax(x, w, scale=torch.ones(1), process_group=None)


def test_backward_gemms_keep_the_forwards_precision():
    """The column-parallel Function fixes the backward GEMMs' precision at the forward, as the op does:
    "3xtf32" stays 3xTF32 (a tf32 backward would be silently less accurate)."""
    from gemm_bn_softmax.distributed import _resolved_precision

    assert _resolved_precision(torch.float32, "3xtf32") == "3xtf32"
    assert _resolved_precision(torch.float32, "highest") == "highest"
    assert all(_resolved_precision(torch.float32, p) == "tf32" for p in ("high", "medium", "tf32"))
    assert _resolved_precision(torch.bfloat16, "3xtf32") is None


def test_ops_pass_opcheck():
    """Schemas, fake (Meta) kernels and mutation annotations of the three data-parallel ops."""
    t = make_block("cpu")
    x = torch.rand(7, K)
    y, moments = ops.gemm_column_moments(x, t["weight"], t["bias"])
    torch.library.opcheck(ops.gemm_column_moments.default, (x, t["weight"], t["bias"]))
    args = (y, torch.stack([moments, moments]), t["bn_weight"], t["bn_bias"], t["rm"].clone(), t["rv"].clone(),
            torch.zeros((), dtype=torch.long), t["scale"], None, 1e-5, torch.float32, torch.float32)
    torch.library.opcheck(ops.bn_softmax_from_moments.default, args)
    out, mean, invstd, lse = ops.bn_softmax_from_moments(*args)
    torch.library.opcheck(ops.gemm_bn_softmax_backward_sums.default,
                          (torch.randn_like(out), y, mean, invstd, lse, t["bn_weight"], t["bn_bias"], t["scale"]))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("sizes", [[6, 3], [1, 0, 7]], ids=["2-ranks", "3-ranks-one-empty"])
def test_gloo_processes_match_the_full_batch_and_agree_bitwise(sizes):
    """Real processes: FusedGemmBNSoftmax(process_group=WORLD) under DDP, the functional API with a
    process group, nn.SyncBatchNorm.convert_sync_batchnorm and convert() on a Linear ->
    nn.SyncBatchNorm -> softmax model, each against the float64 full-batch reference; two identical
    training steps give the same bits (run to run) on every rank; with three ranks a subgroup of two
    (ranks 0 and 2) normalises over its own rows only; with two
    ranks also torch.compile(fullgraph=True) against eager. Then the column-parallel block (W's rows
    split over the ranks) against the unsharded one in float64."""
    port = free_port()
    mp.spawn(distributed_worker.run, args=(sizes, port, "gloo", "cpu"), nprocs=len(sizes), join=True)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
@pytest.mark.parametrize("sizes", [[64, 64], [48, 17]], ids=["even", "uneven"])
def test_nccl_two_gpus_match_sync_batchnorm_under_ddp(sizes):
    port = free_port()
    mp.spawn(distributed_worker.run, args=(sizes, port, "nccl", "cuda"), nprocs=len(sizes), join=True)
