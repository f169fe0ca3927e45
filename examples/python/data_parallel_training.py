"""Data-parallel training of a classifier whose head is the fused Linear -> BatchNorm1d -> Softmax
block, with the statistics of the global batch (nn.SyncBatchNorm's semantics), on two processes.

Runs on CPU processes with gloo in a few seconds (from a checkout:
``PYTHONPATH=python python examples/python/data_parallel_training.py``); with two or more GPUs,
``--device cuda`` runs one process per GPU with NCCL.

Each rank trains on its half of every batch under DistributedDataParallel. Because the head
normalises with the global batch's statistics, the two ranks together train exactly the model that
one process training on whole batches would: the example checks that against a single-process run
(losses, parameters, running statistics) and exits non-zero otherwise.
"""
import argparse
import copy
import gc
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import gemm_bn_softmax

STEPS = 20
BATCH = 48  # global batch; each of the ranks takes an equal share


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(2, 16), nn.ReLU(),                                # features
        nn.Linear(16, 3), nn.BatchNorm1d(3), nn.Softmax(dim=1),     # the head that convert() fuses
    )


def batches(steps: int):
    """Three Gaussian blobs, one per class: the same stream of (points, labels) on every rank."""
    g = torch.Generator().manual_seed(1)
    centers = torch.tensor([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])
    for _ in range(steps):
        labels = torch.randint(0, 3, (BATCH,), generator=g)
        yield centers[labels] + 0.6 * torch.randn(BATCH, 2, generator=g), labels


def train(model, data, rank=0, world=1, device="cpu"):
    """SGD on sum over the global batch of the cross-entropy / BATCH. Under DDP, which averages the
    ranks' gradients, each rank's share of the loss is scaled by world so that the average is the
    whole batch's gradient."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for points, labels in data:
        share = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
        probabilities = model(points[share].to(device))
        loss = F.nll_loss(torch.log(probabilities), labels[share].to(device), reduction="sum") * world / BATCH
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total = loss.detach() / world
        if world > 1:
            dist.all_reduce(total)
        losses.append(total.item())
    return losses


def run(rank: int, world: int, port: int, device_type: str, want) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", rank=rank, world_size=world)
    try:
        train_and_check(rank, world, device, want)
    finally:
        gc.collect()  # DDP objects hold the process group: gone before it is destroyed
        dist.destroy_process_group()


def train_and_check(rank: int, world: int, device: torch.device, want) -> None:
    model = make_model()
    # The usual data-parallel recipe: nn.SyncBatchNorm for global statistics, then the fused block.
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    gemm_bn_softmax.convert(model)
    assert len(model.gemm_bn_softmax_report.replaced) == 1, model.gemm_bn_softmax_report
    model = model.to(device)
    # DDP refuses nn.SyncBatchNorm modules on the CPU; the fused block does not need its forward.
    ddp = DDP(model, device_ids=[rank]) if device.type == "cuda" else _CpuDataParallel(model)
    losses = train(ddp, batches(STEPS), rank, world, device)
    want_losses, want_state = want
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-4, atol=1e-6)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value.cpu(), want_state[name], rtol=1e-4, atol=1e-5,
                                   msg=lambda m: f"{name}: {m}")
    if rank == 0:
        print(f"{world} ranks trained the same model as one process: loss {losses[0]:.4f} -> {losses[-1]:.4f}")


class _CpuDataParallel(nn.Module):
    """What DDP does to gradients (an average over ranks after backward), for CPU processes, where
    DDP refuses a model holding an nn.SyncBatchNorm."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        for p in module.parameters():
            p.register_post_accumulate_grad_hook(self._average)

    @staticmethod
    def _average(p):
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()

    def forward(self, x):
        return self.module(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    world = torch.cuda.device_count() if args.device == "cuda" else 2
    if world < 2:
        raise SystemExit("needs two processes: two GPUs with --device cuda")

    # The reference: one process, whole batches, the plain (unfused, non-distributed) model.
    reference = make_model()
    want_losses = train(reference, batches(STEPS))
    want_state = {k: v.clone() for k, v in copy.deepcopy(reference).state_dict().items()}

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(world, port, args.device, (want_losses, want_state)), nprocs=world, join=True)


if __name__ == "__main__":
    main()
