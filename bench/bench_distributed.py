"""Multi-GPU benchmark: the fused block's data-parallel and column-parallel forms against their peers,
all timed in the same processes (one per GPU, NCCL; or CPU processes with gloo for a smoke run).

Cases (per-GPU batch M; "ms" is rank 0's median, "ms_slowest_rank" the largest median over ranks):
  sync-forward      training forward with global batch statistics: "fused" (FusedGemmBNSoftmax with
                    its bn an nn.SyncBatchNorm), "eager" (the reference block with nn.SyncBatchNorm),
                    and "fused-1gpu" (the single-device op at the same per-GPU batch, no exchange)
  sync-train-step   zero_grad + forward + (out * g).sum() + backward under DDP, same three impls
                    ("fused-1gpu" without DDP's all-reduce: the single-GPU step)
  column-forward    column parallelism, N split over the ranks: "fused" (ColumnParallelFusedGemmBNSoftmax)
                    against "fused-1gpu" (the whole N on one GPU)
  column-train-step the same, one training step (forward + backward, no optimizer)
Every record carries "world_size". Writes bench/results/<gpu>-x<world>-<date>-distributed.json.

    python bench/bench_distributed.py                      # all GPUs of the machine, headline sizes
    python bench/bench_distributed.py --device cpu --world 2 --size 64x96x80 --iters 3   # smoke run
"""
from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
import gemm_bn_softmax as gbs  # noqa: E402
from gemm_bn_softmax.__main__ import time_ms  # noqa: E402  (the CLI's timer: CUDA events, or the host clock)
from gemm_bn_softmax.distributed import ColumnParallelFusedGemmBNSoftmax  # noqa: E402
from gemm_bn_softmax.reference import ReferenceModel  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
CASES = ("sync-forward", "sync-train-step", "column-forward", "column-train-step")




def train_step(model, x, g):
    model.zero_grad(set_to_none=True)
    out = model(x)
    (out * g).sum().backward()


def sync_models(k, n, dtype, device):
    eager = nn.SyncBatchNorm.convert_sync_batchnorm(ReferenceModel(k, n)).to(device, dtype)
    fused = nn.SyncBatchNorm.convert_sync_batchnorm(gbs.FusedGemmBNSoftmax(k, n)).to(device, dtype)
    if device.type == "cpu":  # nn.SyncBatchNorm refuses CPU tensors: name the group instead
        fused = gbs.FusedGemmBNSoftmax(k, n, process_group=dist.group.WORLD).to(device, dtype)
        eager = None
    one_gpu = gbs.FusedGemmBNSoftmax(k, n).to(device, dtype)
    fused.load_state_dict(one_gpu.state_dict())
    return {"fused": fused, "eager": eager, "fused-1gpu": one_gpu}


def measure(case, impl, fn, a, device, m, n, k, world):
    ms, lo = time_ms(fn, device, a.iters, warmup=5)
    dist.barrier()
    medians = [None] * world
    dist.all_gather_object(medians, ms)
    return {"case": case, "impl": impl, "world_size": world, "M": m, "N": n, "K": k, "mode": a.mode,
            "ms": ms, "min": lo, "ms_slowest_rank": max(medians)}


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
    finally:
        gc.collect()  # DDP objects hold the process group: gone before it is destroyed
        dist.destroy_process_group()


def measure_all(rank, a, device):
    world = a.world
    m, n, k = (int(v) for v in a.size.split("x"))
    dtype = DTYPES[a.mode]
    torch.manual_seed(rank)
    x = torch.rand(m, k, device=device, dtype=dtype)
    g = torch.randn(m, n, device=device, dtype=dtype)
    records = []
    if {"sync-forward", "sync-train-step"} & set(a.cases):
        models = sync_models(k, n, dtype, device)
        for impl, model in models.items():
            if model is None:
                continue
            if "sync-forward" in a.cases:
                records.append(measure("sync-forward", impl, lambda: model(x), a, device, m, n, k, world))
            if "sync-train-step" in a.cases:
                wrapped = model if impl == "fused-1gpu" else DDP(model, device_ids=[rank] if device.type == "cuda"
                                                                 else None)
                xg = x.clone().requires_grad_()
                records.append(measure("sync-train-step", impl, lambda: train_step(wrapped, xg, g), a, device, m, n, k,
                                       world))
    if {"column-forward", "column-train-step"} & set(a.cases):
        n_total = a.column_n or n
        full = gbs.FusedGemmBNSoftmax(k, n_total).to(device, dtype)
        shard = ColumnParallelFusedGemmBNSoftmax.from_full(full, dist.group.WORLD)
        g_shard = torch.randn(m, shard.columns.stop - shard.columns.start, device=device, dtype=dtype)
        g_full = torch.randn(m, n_total, device=device, dtype=dtype)
        xg = x.clone().requires_grad_()
        for impl, model, grad in (("fused", shard, g_shard), ("fused-1gpu", full, g_full)):
            if "column-forward" in a.cases:
                records.append(measure("column-forward", impl, lambda: model(x), a, device, m, n_total, k, world))
            if "column-train-step" in a.cases:
                records.append(measure("column-train-step", impl, lambda: train_step(model, xg, grad), a, device, m,
                                       n_total, k, world))
    return records


def write_result(a, device, records, out_path):
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    result = {"device": name, "torch": torch.__version__, "git": os.environ.get("GIT_REV", "unknown"),
              "date": dt.datetime.now().isoformat(timespec="seconds"), "world_size": a.world,
              "command": " ".join(sys.argv[1:]), "records": records}
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    for r in records:
        print(f"{r['case']:18s} {r['impl']:11s} x{a.world} M={r['M']} N={r['N']} K={r['K']} {r['mode']}: "
              f"{r['ms']:.4f} ms (slowest rank {r['ms_slowest_rank']:.4f})", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--world", type=int, default=None, help="processes (default: the GPU count)")
    p.add_argument("--size", default="1024x8192x8192", help="per-GPU batch x out_features x in_features")
    p.add_argument("--column-n", type=int, default=131072, help="total out_features of the column cases")
    p.add_argument("--mode", choices=tuple(DTYPES), default="bf16")
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--out", default=None, help="JSON path (default: bench/results/<gpu>-x<world>-<date>-distributed.json)")
    a = p.parse_args(argv)
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
