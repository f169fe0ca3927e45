"""Multi-GPU benchmark: the fused block's data-parallel and column-parallel forms against their peers,
all timed in the same processes (one per GPU, NCCL; or CPU processes with gloo for a smoke run).

Cases (per-GPU batch M; "ms" is rank 0's median per call, "ms_slowest_rank" the largest median over
ranks; calls run back to back as in a training loop, each timed by CUDA events with no host sync in
between, so launch overheads hide behind the kernels as they do in a loop):
  sync-forward      training forward with global batch statistics: "fused" (FusedGemmBNSoftmax with
                    its bn an nn.SyncBatchNorm), "eager" (the reference block with nn.SyncBatchNorm),
                    and "fused-1gpu" (the single-device op at the same per-GPU batch, no exchange)
  sync-train-step   one training step under DDP: zero_grad + forward + (out * g).sum() + backward
                    (DDP's gradient all-reduce included) + SGD step; same three impls ("fused-1gpu":
                    the single-GPU step, no DDP)
  sync-train-step-local-grads
                    the same step inside DDP's no_sync(): the block with its statistics exchanges,
                    without DDP's gradient all-reduce, which is the same for every impl (see below)
  column-forward    column parallelism, N split over the ranks: "fused" (ColumnParallelFusedGemmBNSoftmax)
                    against "fused-1gpu" (the whole N on one GPU)
  column-train-step the same, one training step (forward + backward + SGD step)
  sync-forward *-cuda-graph
                    the forward captured in a CUDA graph and replayed: the GPU time without the host
  collectives       what the collectives cost alone: "all_gather-moments" (2N + 1 float64 a rank, the
                    forward's exchange) and "all_reduce-grads" (every parameter's gradient in the model
                    dtype, what DDP reduces in each step)
Every record carries "world_size", "ddp_options" (what --ddp passed to every DDP wrapper, fused and
eager alike), and "host_ms": the host time to issue one call onto an idle GPU; a DDP training step's
record also "ddp_applied", those options as the DDP object holds them.
Writes bench/results/<gpu>-x<world>-<date>-distributed.json.
--profile prints rank 0's kernels and host time per op (torch.profiler) for a fused forward and step.

    python bench/bench_distributed.py                      # all GPUs of the machine, headline sizes
    python bench/bench_distributed.py --device cpu --world 2 --size 64x96x80 --iters 3   # smoke run
    python bench/bench_distributed.py --cases sync-train-step --ddp gradient_as_bucket_view=True
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_forward  # noqa: E402  (its CUDA-event timer)
import gemm_bn_softmax as gbs  # noqa: E402
from gemm_bn_softmax.distributed import ColumnParallelFusedGemmBNSoftmax, exchange_records  # noqa: E402
from gemm_bn_softmax.reference import ReferenceModel  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
CASES = ("sync-forward", "sync-train-step", "column-forward", "column-train-step", "collectives")


def time_ms(fn, device, iters, warmup):
    """(median, min) ms per call of fn, called back to back. On a GPU each call sits between two CUDA
    events and the host never waits in between (it runs ahead as in a training loop); on the CPU
    the host clock. A barrier first, so that no rank starts while another is still warming up."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        dist.barrier()
        median, lo, _ = bench_forward.time_ms(fn, iters, warmup=0)  # events around each call
        return median, lo
    dist.barrier()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def train_step(model, x, g, optimizer, local_grads=False):
    """zero_grad, forward, loss, backward, SGD step; local_grads: inside DDP's no_sync() (the
    statistics exchanges still run, DDP's gradient all-reduce does not)."""
    model.zero_grad(set_to_none=True)
    with model.no_sync() if local_grads else contextlib.nullcontext():
        out = model(x)
        (out * g).sum().backward()
    optimizer.step()


def sync_models(k, n, dtype, device):
    eager = nn.SyncBatchNorm.convert_sync_batchnorm(ReferenceModel(k, n)).to(device, dtype)
    fused = nn.SyncBatchNorm.convert_sync_batchnorm(gbs.FusedGemmBNSoftmax(k, n)).to(device, dtype)
    if device.type == "cpu":  # nn.SyncBatchNorm refuses CPU tensors: name the group instead
        fused = gbs.FusedGemmBNSoftmax(k, n, process_group=dist.group.WORLD).to(device, dtype)
        eager = None
    one_gpu = gbs.FusedGemmBNSoftmax(k, n).to(device, dtype)
    fused.load_state_dict(one_gpu.state_dict())
    return {"fused": fused, "eager": eager, "fused-1gpu": one_gpu}


def host_ms(fn, device, iters=20):
    """Median host time to issue one call onto an idle device (the GPU drained before each call; every
    rank calls together). When it is not well below "ms", the loop is bound by the host (Python,
    dispatch, launches, the collectives' bookkeeping), not by the kernels."""
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return statistics.median(times)


def graph_ms(fn, device, iters):
    """fn captured once in a CUDA graph (its NCCL collectives included) and replayed back to back:
    the GPU time with no host overhead (static shapes). Median ms per replay."""
    graph = bench_forward.capture(fn)
    return time_ms(graph.replay, device, iters, warmup=3)


def ddp_options(specs):
    """--ddp's NAME=VALUE pairs as DDP keyword arguments (values True/False, ints, floats). A name DDP
    does not take, or a value of another kind, is refused here, before any process starts."""
    import inspect

    known = set(inspect.signature(DDP.__init__).parameters) - {"self", "module", "device_ids"}
    options = {}
    for spec in specs:
        name, sep, text = spec.partition("=")
        if not sep or name not in known:
            raise ValueError(f"--ddp takes NAME=VALUE with NAME one of DDP's arguments, got {spec!r}")
        value = {"True": True, "False": False}.get(text)
        for parse in (int, float):
            if value is None:
                try:
                    value = parse(text)
                except ValueError:
                    pass
        if value is None:
            raise ValueError(f"--ddp {name}: {text!r} is not True, False or a number")
        options[name] = value
    return options


def measure(case, impl, fn, a, device, m, n, k, world, graph=False):
    ms, lo = graph_ms(fn, device, a.iters) if graph else time_ms(fn, device, a.iters, warmup=5)
    host = None if graph else host_ms(fn, device)
    medians = [None] * world
    dist.all_gather_object(medians, ms)
    return {"case": case, "impl": impl + ("-cuda-graph" if graph else ""), "world_size": world, "M": m, "N": n,
            "K": k, "mode": a.mode, "ddp_options": a.ddp_options, "ms": ms, "min": lo,
            "ms_slowest_rank": max(medians), "host_ms": host}


def run(rank, a, port, out_path):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    device = torch.device("cuda", rank) if a.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)  # processes share the cores: no oversubscription
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=a.world)
    try:
        records = measure_all(rank, a, device)
        if rank == 0:
            write_result(a, device, records, out_path)
        # No rank tears the group down while rank 0 still writes: once, on a loaded 2-core machine, rank 0
        # aborted ("terminate called without an active exception") after its peer had destroyed the group.
        dist.barrier()
    finally:
        gc.collect()  # DDP objects hold the process group: gone before it is destroyed
        dist.destroy_process_group()


def warm_up(device, seconds=1.0):
    """GEMMs for about a second before the first timing, so that the GPU has left its idle clocks (the
    first case of a fresh process measured up to 1.6x slow without it)."""
    if device.type != "cuda":
        return
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            a @ a
        torch.cuda.synchronize()


def measure_all(rank, a, device):
    world = a.world
    m, n, k = (int(v) for v in a.size.split("x"))
    dtype = DTYPES[a.mode]
    torch.manual_seed(rank)
    x = torch.rand(m, k, device=device, dtype=dtype)
    g = torch.randn(m, n, device=device, dtype=dtype)
    records = []
    warm_up(device)

    def record(case, impl, fn, n_cols=n, graph=False):
        records.append(measure(case, impl, fn, a, device, m, n_cols, k, world, graph))

    if {"sync-forward", "sync-train-step"} & set(a.cases):
        for impl, model in sync_models(k, n, dtype, device).items():
            if model is None:
                continue
            if "sync-forward" in a.cases:
                record("sync-forward", impl, lambda: model(x))
                if device.type == "cuda" and impl != "eager":  # the GPU floor, without the host
                    record("sync-forward", impl, lambda: model(x), graph=True)
            if "sync-train-step" in a.cases:
                wrapped = model if impl == "fused-1gpu" else DDP(model, device_ids=[rank] if device.type == "cuda"
                                                                 else None, **a.ddp_options)
                sgd = torch.optim.SGD(model.parameters(), lr=1e-4, foreach=True)
                xg = x.clone().requires_grad_()
                record("sync-train-step", impl, lambda: train_step(wrapped, xg, g, sgd))
                if impl != "fused-1gpu":
                    # What the DDP object holds of --ddp's options (those it keeps as attributes of the
                    # same name): evidence that they reached it.
                    records[-1]["ddp_applied"] = {name: getattr(wrapped, name) for name in a.ddp_options
                                                  if hasattr(wrapped, name)}
                    record("sync-train-step-local-grads", impl, lambda: train_step(wrapped, xg, g, sgd, True))
                if a.profile and impl == "fused":  # every rank runs it (collectives), rank 0 prints
                    profile("fused forward", lambda: model(x), device, rank)
                    profile("fused DDP train step", lambda: train_step(wrapped, xg, g, sgd), device, rank)
                del wrapped, sgd
    if "collectives" in a.cases:
        moments = torch.randn(2 * n + 1, device=device, dtype=torch.float64)
        gathered = moments.new_empty(world, moments.numel())
        record("collectives", "all_gather-moments",
               lambda: dist.all_gather_into_tensor(gathered, moments) if device.type == "cuda"
               else dist.all_gather(list(gathered.unbind()), moments))
        # The process group's own call, without torch.distributed's Python wrappers (what the
        # column-parallel exchanges make; the data-parallel op makes its exchange in C++): an A/B in
        # one process of what the wrappers cost.
        record("collectives", "all_gather-moments-direct", lambda: exchange_records(moments, dist.group.WORLD))
        grads = torch.randn(n * k + 4 * n + 1, device=device, dtype=dtype)  # W, b, gamma, beta, scale
        record("collectives", "all_reduce-grads", lambda: dist.all_reduce(grads))
    if {"column-forward", "column-train-step"} & set(a.cases):
        n_total = a.column_n or n
        full = gbs.FusedGemmBNSoftmax(k, n_total).to(device, dtype)
        shard = ColumnParallelFusedGemmBNSoftmax.from_full(full, dist.group.WORLD)
        g_shard = torch.randn(m, shard.columns.stop - shard.columns.start, device=device, dtype=dtype)
        g_full = torch.randn(m, n_total, device=device, dtype=dtype)
        xg = x.clone().requires_grad_()
        for impl, model, grad in (("fused", shard, g_shard), ("fused-1gpu", full, g_full)):
            sgd = torch.optim.SGD(model.parameters(), lr=1e-4, foreach=True)
            if "column-forward" in a.cases:
                record("column-forward", impl, lambda: model(x), n_total)
            if "column-train-step" in a.cases:
                record("column-train-step", impl, lambda: train_step(model, xg, grad, sgd), n_total)
    return records


def profile(what, fn, device, rank, steps=3):
    """The kernels of `steps` calls of fn after a warm-up (name, calls, total GPU time); every rank
    runs them, as the collectives need, and rank 0 prints."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    fn()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        for _ in range(steps):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    if rank != 0:
        return
    table = prof.key_averages().table
    if device.type == "cuda":
        print(f"--- profile: {what}, {steps} calls (rank 0), by GPU time ---\n"
              + table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70), flush=True)
    # Where the host time goes (the loop is bound by it when host_ms is not well below ms).
    print(f"--- profile: {what}, {steps} calls (rank 0), by host time of each op itself ---\n"
          + table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70), flush=True)


def write_result(a, device, records, out_path):
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    result = {"device": name, "torch": torch.__version__, "git": os.environ.get("GIT_REV", "unknown"),
              "date": dt.datetime.now().isoformat(timespec="seconds"), "world_size": a.world,
              "command": " ".join(sys.argv[1:]), "records": records}
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    for r in records:
        print(f"{r['case']:27s} {r['impl']:18s} x{a.world} M={r['M']} N={r['N']} K={r['K']} {r['mode']}: "
              f"{r['ms']:.4f} ms (slowest rank {r['ms_slowest_rank']:.4f}; host "
              f"{'-' if r['host_ms'] is None else format(r['host_ms'], '.4f')})", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--world", type=int, default=None, help="processes (default: the GPU count)")
    p.add_argument("--size", default="1024x8192x8192", help="per-GPU batch x out_features x in_features")
    p.add_argument("--column-n", type=int, default=131072, help="total out_features of the column cases")
    p.add_argument("--mode", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--ddp", nargs="+", default=[], metavar="NAME=VALUE",
                   help="DDP options for every wrapped block, e.g. gradient_as_bucket_view=True broadcast_buffers=False")
    p.add_argument("--profile", action="store_true", help="print rank 0's kernels of one fused forward and step")
    p.add_argument("--out", default=None, help="JSON path (default: bench/results/<gpu>-x<world>-<date>-distributed.json)")
    a = p.parse_args(argv)
    try:
        a.ddp_options = ddp_options(a.ddp)
    except ValueError as e:
        p.error(str(e))
    if a.world is None:
        a.world = torch.cuda.device_count() if a.device == "cuda" else 2
    if a.world < 2 or (a.device == "cuda" and torch.cuda.device_count() < a.world):
        p.error(f"needs at least 2 processes and as many GPUs (world {a.world}, "
                f"{torch.cuda.device_count()} GPUs)")
    date = dt.date.today().isoformat()
    tag = "h200" if a.device == "cuda" and "H200" in torch.cuda.get_device_name(0) else a.device
    out = a.out or os.path.join(ROOT, "bench", "results", f"{tag}-x{a.world}-{date}-distributed.json")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(a, port, out), nprocs=a.world, join=True)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
