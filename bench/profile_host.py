"""Where the host time of one training step goes (one GPU): the host time to issue each part of the
step (zero_grad, forward, loss, backward, SGD step) onto an idle GPU, for FusedGemmBNSoftmax and the
eager reference block, then torch.profiler's host time per op for a few fused steps.

A training loop is bound by the host when issuing a step takes longer than the GPU runs it; this
says which part to make cheaper.

    python bench/profile_host.py                          # bf16, 1024x8192x8192
    python bench/profile_host.py --dtype tf32 --size 256x8192x8192
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
import gemm_bn_softmax as gbs  # noqa: E402
from gemm_bn_softmax.reference import ReferenceModel  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32}


def issue_ms(part, before=None, reps=30):
    """Median host time (ms) of part() with the GPU drained first; before() (untimed) sets it up."""
    times = []
    for _ in range(reps):
        state = before() if before else None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        part(state)
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def parts(model, x, g, opt):
    """Each part of the step as (name, part, setup)."""
    def forward(_):
        return model(x)

    def loss_setup():
        return model(x)

    def backward_setup():
        model.zero_grad(set_to_none=True)
        return (model(x) * g).sum()

    return [
        ("zero_grad", lambda _: model.zero_grad(set_to_none=True), None),
        ("forward", forward, None),
        ("loss (out * g).sum()", lambda out: (out * g).sum(), loss_setup),
        ("backward", lambda loss: loss.backward(), backward_setup),
        ("SGD step", lambda _: opt.step(), None),
        ("whole step", lambda _: step(model, x, g, opt), None),
    ]


def backward_op_ms(model, x, g):
    """The host time of torch.ops.fused.gemm_bn_softmax_backward alone (no autograd engine), with
    every gradient asked for: what the Autograd kernel's backward calls."""
    ops = torch.ops.fused
    lin, bn = model.gemm, model.bn
    with torch.no_grad():
        out, mean, invstd, y, lse = ops.gemm_bn_softmax(x, lin.weight, lin.bias, bn.weight, bn.bias, None, None, None,
                                                        model.scale, True, 0.1, bn.eps)
    def backward(_):
        with torch.no_grad():  # as in the autograd engine's backward pass
            ops.gemm_bn_softmax_backward(g, y, mean, invstd, lse, x, lin.weight, bn.weight, bn.bias, model.scale, True,
                                         [True] * 6)

    return issue_ms(backward)


def step(model, x, g, opt):
    model.zero_grad(set_to_none=True)
    (model(x) * g).sum().backward()
    opt.step()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", default="1024x8192x8192")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    a = p.parse_args(argv)
    m, n, k = (int(v) for v in a.size.split("x"))
    dtype = DTYPES[a.dtype]
    torch.backends.cuda.matmul.allow_tf32 = a.dtype == "tf32"
    x = torch.rand(m, k, device="cuda", dtype=dtype, requires_grad=True)
    g = torch.randn(m, n, device="cuda", dtype=dtype)
    models = {"fused": gbs.FusedGemmBNSoftmax(k, n), "eager": ReferenceModel(k, n)}
    print(f"host time to issue each part onto an idle GPU, ms (median of 30), {a.dtype} {a.size}")
    for name, model in models.items():
        model = model.cuda().to(dtype)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4, foreach=True)
        for _ in range(5):
            step(model, x, g, opt)
        for part_name, part, setup in parts(model, x, g, opt):
            print(f"  {name:6s} {part_name:22s} {issue_ms(part, setup):.4f}", flush=True)
        if name == "fused":
            print(f"  {name:6s} {'backward op alone':22s} {backward_op_ms(model, x, g):.4f}", flush=True)
            from torch.profiler import ProfilerActivity, profile

            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(5):
                    step(model, x, g, opt)
                torch.cuda.synchronize()
            print("--- fused, 5 steps: host time per op (torch.profiler; its own overhead included) ---")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    sys.exit(main())
