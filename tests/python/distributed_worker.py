"""One rank of test_distributed's multi-process tests (torch.multiprocessing.spawn target).

Every rank draws the same global batch, takes its slice (sizes[rank] rows), runs the fused block
in data-parallel form and checks it against the float64 full-batch reference (what
nn.SyncBatchNorm computes), and that the statistics are the same bits on every rank. A failed
assertion in any rank fails the spawn, hence the test.
"""
import copy
import datetime
import gc
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers import assert_cancelled_bias_grad, functional_ref64, rel_err

import gemm_bn_softmax as gbs
from gemm_bn_softmax.reference import ReferenceModel

K, N = 12, 10
TOL = 1e-5  # float32 against float64 (the accuracy contract)


def randomized(model, seed=0):
    """Every parameter and buffer drawn from `seed` alone: the same model on every rank."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) / m.in_features ** 0.5)
                if m.bias is not None:
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.weight.copy_(0.5 + torch.rand(m.weight.shape, generator=g))
                m.bias.copy_(0.3 * torch.randn(m.bias.shape, generator=g))
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
        if hasattr(model, "scale"):
            model.scale.copy_(1 + torch.rand(model.scale.shape, generator=g))
    return model


def global_batch(sizes, seed=1):
    g = torch.Generator().manual_seed(seed)
    M = sum(sizes)
    return torch.rand(M, K, generator=g) * 2 - 0.5, torch.randn(M, N, generator=g)


def my_rows(t, sizes, rank):
    start = sum(sizes[:rank])
    return t[start:start + sizes[rank]]


def same_on_every_rank(t, what):
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    for r, p in enumerate(parts):
        assert torch.equal(p, parts[0]), f"{what}: rank {r} differs from rank 0"


def reference_step(model, x, g):
    """float64 full batch: the output, x's gradient and the parameters' gradients of sum(out * g)."""
    ref = copy.deepcopy(model).double()
    x64 = x.double().requires_grad_()
    out = ref(x64)
    (out * g.double()).sum().backward()
    return ref, out.detach(), x64.grad


def check_module_under_ddp(sizes, rank, device):
    """FusedGemmBNSoftmax(process_group=WORLD) wrapped in DDP (GPUs: also with its bn made an
    nn.SyncBatchNorm by convert_sync_batchnorm, which DDP refuses on the CPU): out, dx, DDP-averaged
    parameter gradients, running statistics; the statistics bitwise equal on every rank."""
    check_fused_under_ddp(sizes, rank, device, lambda: gbs.FusedGemmBNSoftmax(K, N, scale_shape=(N,),
                                                                             process_group=dist.group.WORLD))
    if device.type == "cuda":
        check_fused_under_ddp(sizes, rank, device, lambda: nn.SyncBatchNorm.convert_sync_batchnorm(
            gbs.FusedGemmBNSoftmax(K, N, scale_shape=(N,))))


def check_fused_under_ddp(sizes, rank, device, make):
    world = len(sizes)
    ref_model = randomized(ReferenceModel(K, N, scale_shape=(N,)))
    x, g = global_batch(sizes)
    ref, out64, dx64 = reference_step(ref_model, x, g)

    fused = make().to(device)
    fused.load_state_dict(ref_model.state_dict())
    ddp = DDP(fused, device_ids=[device.index] if device.type == "cuda" else None)
    xl = my_rows(x, sizes, rank).to(device).requires_grad_()
    out = ddp(xl)
    (out * my_rows(g, sizes, rank).to(device)).sum().backward()

    assert rel_err(out, my_rows(out64, sizes, rank)) <= TOL if sizes[rank] else out.shape == (0, N)
    assert rel_err(xl.grad, my_rows(dx64, sizes, rank)) <= TOL if sizes[rank] else xl.grad.shape == (0, K)
    for (name, p), q in zip(fused.named_parameters(), ref.parameters()):
        total = p.grad.double() * world  # DDP averages; the reference gradient is the sum over ranks
        if name == "gemm.bias":
            assert_cancelled_bias_grad(total, q.grad, name)
        else:
            assert rel_err(total, q.grad) <= TOL, (name, rel_err(total, q.grad))
    assert rel_err(fused.bn.running_mean, ref.bn.running_mean) <= 1e-6
    assert rel_err(fused.bn.running_var, ref.bn.running_var) <= 1e-6
    assert fused.bn.num_batches_tracked.item() == 1
    for name in ("running_mean", "running_var"):
        same_on_every_rank(getattr(fused.bn, name), name)
    for name, p in fused.named_parameters():
        same_on_every_rank(p.grad, f"{name}.grad")  # DDP's average


def check_run_to_run(sizes, rank, device):
    """Two training steps of the same data-parallel module on the same data, from the same state:
    the same bits (output, dx, DDP-averaged gradients, running statistics), on every rank."""
    ref_model = randomized(ReferenceModel(K, N))
    x, g = global_batch(sizes, seed=7)
    runs = []
    for _ in range(2):
        fused = gbs.FusedGemmBNSoftmax(K, N, process_group=dist.group.WORLD).to(device)
        fused.load_state_dict(ref_model.state_dict())
        ddp = DDP(fused, device_ids=[device.index] if device.type == "cuda" else None)
        xl = my_rows(x, sizes, rank).to(device).requires_grad_()
        out = ddp(xl)
        (out * my_rows(g, sizes, rank).to(device)).sum().backward()
        runs.append([out.detach(), xl.grad, *(p.grad for p in fused.parameters()), fused.bn.running_mean,
                     fused.bn.running_var])
        del ddp
    for i, (first, second) in enumerate(zip(*runs)):
        assert torch.equal(first, second), f"tensor {i} differs between two identical runs"


def check_subgroup(rank, device):
    """A process group of some ranks (global ranks 0 and 2 of three, in that order): the statistics
    are those of its ranks' rows only, the same bits on both, and the other rank takes no part."""
    members = [0, 2]
    sub = dist.new_group(members)  # every rank takes part in creating it
    sizes = [3, 5, 4]  # the rank outside the group holds rows too: they must not count
    x, _ = global_batch(sizes, seed=8)
    gen = torch.Generator().manual_seed(9)
    w, b = torch.randn(N, K, generator=gen) / K ** 0.5, 0.1 * torch.randn(N, generator=gen)
    group_rows = torch.cat([my_rows(x, sizes, r) for r in members])
    want, y = functional_ref64(group_rows, w, b, scale=1.3)
    if rank not in members:
        return
    rm, rv = torch.zeros(N, device=device), torch.ones(N, device=device)
    xl = my_rows(x, sizes, rank).to(device)
    out = gbs.gemm_bn_softmax(xl, w.to(device), b.to(device), None, None, rm, rv, 1.3, momentum=1.0,
                              process_group=sub)
    start = sum(sizes[r] for r in members[:members.index(rank)])
    if sizes[rank]:
        assert rel_err(out, want[start:start + sizes[rank]]) <= TOL
    assert rel_err(rm, y.mean(0)) <= 1e-6 and rel_err(rv, y.var(0)) <= 1e-6  # momentum 1: this batch's
    parts = [torch.empty_like(rv) for _ in members]
    dist.all_gather(parts, rv, group=sub)
    assert torch.equal(parts[0], parts[1]), "running_var differs between the subgroup's ranks"


def check_functional(sizes, rank, device):
    """gemm_bn_softmax(..., process_group=WORLD): momentum=None, no affine, scalar float scale."""
    x, g = global_batch(sizes, seed=2)
    gen = torch.Generator().manual_seed(3)
    w, b = torch.randn(N, K, generator=gen) / K ** 0.5, 0.1 * torch.randn(N, generator=gen)
    want, _ = functional_ref64(x, w, b, scale=1.7)
    rm, rv, nbt = torch.zeros(N, device=device), torch.ones(N, device=device), torch.zeros((), dtype=torch.long,
                                                                                             device=device)
    xl = my_rows(x, sizes, rank).to(device).requires_grad_()
    versions = rm._version, rv._version
    out = gbs.gemm_bn_softmax(xl, w.to(device), b.to(device), None, None, rm, rv, 1.7, momentum=None,
                              num_batches_tracked=nbt, process_group=dist.group.WORLD)
    assert rm._version > versions[0] and rv._version > versions[1]  # written in place, as autograd is told
    if sizes[rank]:
        assert rel_err(out, my_rows(want, sizes, rank)) <= TOL
    y = x.double() @ w.double().t() + b.double()
    assert rel_err(rm, y.mean(0)) <= 1e-6 and rel_err(rv, y.var(0)) <= 1e-6  # momentum=None, first batch
    assert nbt.item() == 1
    same_on_every_rank(rv, "running_var")
    (out * my_rows(g, sizes, rank).to(device)).sum().backward()
    assert xl.grad.shape == xl.shape and not torch.isnan(xl.grad).any()

    # autocast: the dtypes the single-device op gives there (the Linear in bf16), the same values
    # as the whole batch on one device up to bf16 rounding
    kind = device.type
    with torch.autocast(kind, dtype=torch.bfloat16):
        out_ac = gbs.gemm_bn_softmax(xl.detach(), w.to(device), b.to(device), None, None, None, None, 1.7,
                                     process_group=dist.group.WORLD)
        whole = gbs.gemm_bn_softmax(x.to(device), w.to(device), b.to(device), None, None, None, None, 1.7)
    assert out_ac.dtype == whole.dtype, (out_ac.dtype, whole.dtype)
    if sizes[rank]:
        assert rel_err(out_ac, my_rows(whole, sizes, rank)) <= 1e-2

    # the op itself with the group's name: the same bits as through the functional API; its backward
    # op makes the exchange, so it refuses sums given with a group (on every rank, before any collective)
    name = dist.group.WORLD.group_name
    xd, wd, bd = xl.detach(), w.to(device), b.to(device)
    scale = torch.full((), 1.7, device=device)
    out_f = gbs.gemm_bn_softmax(xd, wd, bd, None, None, None, None, scale, process_group=dist.group.WORLD)
    out_op, mean, invstd, y, lse = torch.ops.fused.gemm_bn_softmax(xd, wd, bd, None, None, None, None, None, scale,
                                                                   True, 0.1, 1e-5, group_name=name)
    assert torch.equal(out_op, out_f)
    same_on_every_rank(mean, "mean")
    sums = torch.zeros(2 * N + 1, dtype=torch.float64, device=device)
    with pytest.raises(RuntimeError, match="row_sums, local_sums and rank_sums must be None"):
        torch.ops.fused.gemm_bn_softmax_backward(torch.ones_like(out_op), y, mean, invstd, lse, xd, wd, None, None,
                                                 scale, True, [True] * 3 + [False] * 3, None, None,
                                                 torch.zeros_like(lse), sums, sums[None], group_name=name)

    # the schema, the fake kernel and the mutations of the op with a group (every rank runs the same
    # sequence of calls, so the collectives inside pair up), requires_grad samples included; on the
    # CPU processes (the GPU runs check the op with a group through DDP, torch.compile and CUDA graphs)
    if device.type == "cpu":
        rm_c, rv_c, nbt_c = torch.zeros(N), torch.ones(N), torch.zeros((), dtype=torch.long)
        sample = (xd.clone().requires_grad_(), wd.clone().requires_grad_(), bd.clone().requires_grad_(), None, None,
                  rm_c, rv_c, nbt_c, scale.clone().requires_grad_(), True, 0.1, 1e-5)
        torch.library.opcheck(torch.ops.fused.gemm_bn_softmax.default, sample, {"group_name": name})

    # eval: the running statistics, no exchange (a rank may call it alone)
    out_eval = gbs.gemm_bn_softmax(xl.detach(), w.to(device), b.to(device), None, None, rm, rv, 1.7,
                                   training=False, process_group=dist.group.WORLD)
    local = gbs.gemm_bn_softmax(xl.detach(), w.to(device), b.to(device), None, None, rm, rv, 1.7, training=False)
    assert torch.equal(out_eval, local)


def check_conversions(sizes, rank, device):
    """nn.SyncBatchNorm.convert_sync_batchnorm on the fused module, and convert() on a Linear ->
    nn.SyncBatchNorm -> softmax model: both run the fused data-parallel block."""
    x, _ = global_batch(sizes, seed=4)
    ref_model = randomized(ReferenceModel(K, N))
    fused = gbs.FusedGemmBNSoftmax(K, N)
    fused.load_state_dict(ref_model.state_dict())
    fused = nn.SyncBatchNorm.convert_sync_batchnorm(fused).to(device)
    assert isinstance(fused.bn, nn.SyncBatchNorm)
    want = copy.deepcopy(ref_model).double()(x.double())
    out = fused(my_rows(x, sizes, rank).to(device))
    if sizes[rank]:
        assert rel_err(out, my_rows(want, sizes, rank)) <= TOL

    seq = randomized(nn.Sequential(nn.Linear(K, N), nn.BatchNorm1d(N), nn.Softmax(dim=1)))
    want = copy.deepcopy(seq).double()(x.double())
    sync_seq = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(seq))
    gbs.convert(sync_seq)
    assert len(sync_seq.gemm_bn_softmax_report.replaced) == 1, str(sync_seq.gemm_bn_softmax_report)
    sync_seq = sync_seq.to(device)
    out = sync_seq(my_rows(x, sizes, rank).to(device))  # nn.SyncBatchNorm itself refuses CPU tensors
    if sizes[rank]:
        assert rel_err(out, my_rows(want, sizes, rank)) <= TOL
    same_on_every_rank(sync_seq[1].running_var, "converted running_var")


def check_against_sync_batchnorm(sizes, rank, device):
    """The eager peer itself (GPU only: nn.SyncBatchNorm refuses CPU tensors): Linear ->
    nn.SyncBatchNorm -> scale -> softmax under DDP. Ours is at least as close to float64."""
    world = len(sizes)
    ref_model = randomized(ReferenceModel(K, N))
    x, g = global_batch(sizes, seed=5)
    ref, out64, dx64 = reference_step(ref_model, x, g)
    eager = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(ref_model)).to(device)
    fused = nn.SyncBatchNorm.convert_sync_batchnorm(gbs.FusedGemmBNSoftmax(K, N)).to(device)
    fused.load_state_dict(ref_model.state_dict())
    results = {}
    for name, model in (("eager", eager), ("fused", fused)):
        ddp = DDP(model, device_ids=[device.index])
        xl = my_rows(x, sizes, rank).to(device).requires_grad_()
        out = ddp(xl)
        (out * my_rows(g, sizes, rank).to(device)).sum().backward()
        results[name] = (out, xl.grad, {n: p.grad * world for n, p in model.named_parameters()}, model)
    pairs = [("out", lambda r: r[0], my_rows(out64, sizes, rank)), ("dx", lambda r: r[1], my_rows(dx64, sizes, rank))]
    pairs += [(n, (lambda r, n=n: r[2][n]), q.grad) for n, q in ref.named_parameters() if n != "gemm.bias"]
    for what, get, want in pairs:
        e_err, f_err = rel_err(get(results["eager"]), want), rel_err(get(results["fused"]), want)
        assert f_err <= max(2 * e_err, TOL), (what, f_err, e_err)
    assert_cancelled_bias_grad(results["fused"][2]["gemm.bias"], results["eager"][2]["gemm.bias"])
    for name in ("running_mean", "running_var"):
        e, f = getattr(eager.bn, name), getattr(fused.bn, name)
        assert rel_err(f, getattr(ref.bn, name)) <= max(2 * rel_err(e, getattr(ref.bn, name)), 1e-6), name
        same_on_every_rank(f, name)


def check_compiled(sizes, rank, device):
    """torch.compile(fullgraph=True) of the data-parallel module and of the column-parallel one: the
    collectives trace into the graph; output, dx, parameter gradients and running statistics equal
    eager's."""
    ref_model = randomized(ReferenceModel(K, N))
    x, g = global_batch(sizes, seed=6)
    results = []
    for compiled in (False, True):
        model = gbs.FusedGemmBNSoftmax(K, N, process_group=dist.group.WORLD).to(device)
        model.load_state_dict(ref_model.state_dict())
        run_model = torch.compile(model, fullgraph=True) if compiled else model
        xl = my_rows(x, sizes, rank).to(device).requires_grad_()
        out = run_model(xl)
        (out * my_rows(g, sizes, rank).to(device)).sum().backward()
        results.append([out, xl.grad, *(p.grad for p in model.parameters()), model.bn.running_var])
    for eager_t, compiled_t in zip(*results):
        torch.testing.assert_close(compiled_t, eager_t, rtol=1e-6, atol=1e-7)

    from gemm_bn_softmax.distributed import ColumnParallelFusedGemmBNSoftmax, column_split

    cols = column_split(N, len(sizes), rank)
    results = []
    for compiled in (False, True):
        shard = ColumnParallelFusedGemmBNSoftmax.from_full(ref_model, dist.group.WORLD).to(device)
        run_model = torch.compile(shard, fullgraph=True) if compiled else shard
        xl = x.to(device).detach().clone().requires_grad_()
        out = run_model(xl)
        (out * g[:, cols].to(device)).sum().backward()
        results.append([out, xl.grad, *(p.grad for p in shard.parameters()), shard.bn.running_var])
    for eager_t, compiled_t in zip(*results):
        torch.testing.assert_close(compiled_t, eager_t, rtol=1e-6, atol=1e-7)


def check_column_parallel(rank, world, device):
    """ColumnParallelFusedGemmBNSoftmax.from_full over the ranks: this rank's output columns, dx,
    its shard's parameter gradients and running statistics equal the unsharded block's (float64
    reference), in training and eval, with a shared scalar scale and a per-column one; N columns
    (several per rank), world + 1 (a rank holding one column, whose per-column scale has one
    element) and, with three ranks, world - 1 (a rank holding none; with two ranks that would be a
    softmax over one column, whose gradients are 0 and leave nothing to compare)."""
    from gemm_bn_softmax.distributed import column_split

    for n in (N, world + 1) + ((world - 1,) if world > 2 else ()):
        check_column_parallel_block(rank, world, device, n, column_split(n, world, rank))


def check_column_parallel_block(rank, world, device, n, cols):
    from gemm_bn_softmax.distributed import ColumnParallelFusedGemmBNSoftmax

    x, g = global_batch([9], seed=7)  # every rank: the same input
    g = g[:, :n]
    for scale_shape in ((1,), (n,)):
        for training in (True, False):
            full = randomized(ReferenceModel(K, n, scale_shape=scale_shape), seed=8)
            ref = copy.deepcopy(full).double().train(training)
            x64 = x.double().requires_grad_()
            out64 = ref(x64)
            (out64 * g.double()).sum().backward()

            shard = ColumnParallelFusedGemmBNSoftmax.from_full(full, dist.group.WORLD).to(device).train(training)
            xl = x.to(device).detach().clone().requires_grad_()
            out = shard(xl)
            (out * g[:, cols].to(device)).sum().backward()
            what = f"N {n}, columns {cols}, scale {scale_shape}, {'training' if training else 'eval'}"
            assert out.shape == (9, cols.stop - cols.start), what
            assert rel_err(out, out64[:, cols]) <= TOL, (what, "out")
            assert rel_err(xl.grad, x64.grad) <= TOL, (what, "dx")
            same_on_every_rank(xl.grad, "dx")
            pairs = [(shard.gemm.weight.grad, ref.gemm.weight.grad[cols], "weight"),
                     (shard.bn.weight.grad, ref.bn.weight.grad[cols], "bn.weight"),
                     (shard.bn.bias.grad, ref.bn.bias.grad[cols], "bn.bias"),
                     (shard.scale.grad, ref.scale.grad if scale_shape == (1,) else ref.scale.grad[cols], "scale")]
            if not training:
                pairs.append((shard.gemm.bias.grad, ref.gemm.bias.grad[cols], "bias"))
            else:
                assert_cancelled_bias_grad(shard.gemm.bias.grad, ref.gemm.bias.grad[cols], what)
            for got, want, name in pairs:
                assert rel_err(got, want) <= TOL, (what, name, rel_err(got, want))
            assert rel_err(shard.bn.running_var, ref.bn.running_var[cols]) <= 1e-6, what


def check_cuda_graph(sizes, rank, device):
    """A data-parallel forward + backward captured in one CUDA graph (NCCL collectives included),
    replayed on new data, against the same step run eagerly: output, dx, gradients, running stats."""
    ref_model = randomized(ReferenceModel(K, N))

    def make():
        model = gbs.FusedGemmBNSoftmax(K, N, process_group=dist.group.WORLD).to(device)
        model.load_state_dict(ref_model.state_dict())
        return model

    model, twin = make(), make()
    m = max(sizes[rank], 2)
    static_x = torch.rand(m, K, device=device, requires_grad=True)
    static_g = torch.randn(m, N, device=device)

    def step(mod, x, g):
        out = mod(x)
        (out * g).sum().backward()
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up outside the capture (allocations, NCCL communicators)
            model.zero_grad(set_to_none=True)
            static_x.grad = None
            step(model, static_x, static_g)
            twin.zero_grad(set_to_none=True)
            step(twin, static_x.detach().clone().requires_grad_(), static_g)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    model.zero_grad(set_to_none=True)
    static_x.grad = None
    with torch.cuda.graph(graph):
        static_out = step(model, static_x, static_g)
    for _ in range(3):
        x, g = torch.rand(m, K, device=device), torch.randn(m, N, device=device)
        with torch.no_grad():
            static_x.copy_(x)
        static_g.copy_(g)
        graph.replay()
        twin.zero_grad(set_to_none=True)
        xt = x.clone().requires_grad_()
        out = step(twin, xt, g)
        torch.testing.assert_close(static_out, out, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(static_x.grad, xt.grad, rtol=1e-5, atol=1e-7)
        for (name, a), b in zip(model.named_parameters(), twin.parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=lambda msg: f"{name}: {msg}")
    torch.testing.assert_close(model.bn.running_var, twin.bn.running_var, rtol=1e-5, atol=1e-7)


def run(rank, sizes, port, backend, device_type):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.manual_seed(0)
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 in the comparisons
    # A collective that one rank misses fails the test in minutes instead of the default half hour.
    dist.init_process_group(backend, rank=rank, world_size=len(sizes), timeout=datetime.timedelta(seconds=300))
    try:
        check_module_under_ddp(sizes, rank, device)
        check_run_to_run(sizes, rank, device)
        check_functional(sizes, rank, device)
        check_conversions(sizes, rank, device)
        if len(sizes) == 2:  # compiling costs seconds per process: one world size is enough
            check_compiled(sizes, rank, device)
        else:
            check_subgroup(rank, device)
        check_column_parallel(rank, len(sizes), device)
        if device.type == "cuda":
            check_against_sync_batchnorm(sizes, rank, device)
            check_cuda_graph(sizes, rank, device)
    finally:
        gc.collect()  # DDP objects hold the process group: gone before it is destroyed
        dist.destroy_process_group()
