"""Where a training step's GPU time goes: one step of the fused module (zero_grad, forward, the loss
(out * g).sum(), backward) captured in a CUDA graph and replayed; its GPU time per step (median of 50
replays, with the range, and again after profiling), each kernel group's profiled time per step, and
the step's critical path (pipeline_breakdown.critical_path: each kernel charged from its
predecessor's end); with --kernels, also every kernel of one step in launch order. The lines match
bench/ab_rounds.py's default pattern, so two builds compare with

  python bench/ab_rounds.py --rounds 3 --setting base=TREE=$PWD --setting v=TREE=/tmp/variant_v/tree \\
      -- bash -c 'exec python3 "$TREE/bench/train_step_breakdown.py" --cases bf16:1024x8192x8192'

(the script imports the extension of its own tree: bench/cpp/variants.sh with VARIANT_TORCH=1 makes one
per variant)."""
import argparse
import collections
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_forward  # noqa: E402  (its CUDA-graph capture and CUDA-event timer)
import pipeline_breakdown  # noqa: E402  (parse_case, critical_path)

# The backward's kernels by the names their sources give them; other kernels keep a short name.
BACKWARD_KERNELS = ("row_sums", "grad_partials", "column_finalize", "dy_kernel")


def step_group(name):
    for key in BACKWARD_KERNELS:
        if key in name:
            return key
    return pipeline_breakdown.kernel_group(name)


def kernel_listing(kernels, replays):
    """One step's kernels in launch order, from (name, start, end) of `replays` replays (µs): lines of
    the start from the step's first kernel, the duration, the group and the name's start."""
    kernels = sorted(kernels, key=lambda k: k[1])
    if replays <= 0 or len(kernels) % replays:
        raise ValueError(f"{len(kernels)} kernels do not split into {replays} replays")
    per_step = kernels[:len(kernels) // replays]
    t0 = per_step[0][1] if per_step else 0.0
    return [f"{start - t0:9.1f} {end - start:8.1f}  {step_group(name)}: {name[:60]}" for name, start, end in per_step]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", default=["bf16:1024x8192x8192"], help="mode:MxNxK, mode bf16, tf32 or 3xtf32")
    p.add_argument("--replays", type=int, default=50, help="timed replays of the step's graph")
    p.add_argument("--kernels", action="store_true", help="also list one step's kernels in launch order")
    a = p.parse_args()
    try:
        cases = [pipeline_breakdown.parse_case(c) for c in a.cases]
    except ValueError as e:
        p.error(str(e))
    from torch.profiler import ProfilerActivity, profile
    for mode, m, n, k in cases:
        torch.manual_seed(0)
        mod, dtype = pipeline_breakdown.mode_module(mode, k, n)
        x = torch.randn(m, k, device="cuda", dtype=dtype, requires_grad=True)
        g = torch.randn(m, n, device="cuda", dtype=dtype)

        graph = bench_forward.step_graph(mod, x, g)  # the train case's graph_ms step
        med, lo, hi = bench_forward.time_ms(graph.replay, a.replays)
        replays = 10
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(replays):
                graph.replay()
            torch.cuda.synchronize()
        total, kernels = collections.defaultdict(float), []
        for e in prof.events():
            if e.device_type != torch.autograd.DeviceType.CUDA:
                continue
            total[step_group(e.name)] += e.device_time_total / replays
            kernels.append((e.name, e.time_range.start, e.time_range.end))
        timeline = [(step_group(name), start, end) for name, start, end in kernels]
        own, gap, span = pipeline_breakdown.critical_path(timeline, replays, calls_per_replay=1)
        med2, _, _ = bench_forward.time_ms(graph.replay, a.replays)
        key = f"{mode} {m}x{n}x{k}"
        print(f"pdl=1 step {key}: op {med * 1e3:.1f} us ({lo * 1e3:.1f}-{hi * 1e3:.1f}; again {med2 * 1e3:.1f})",
              flush=True)
        for group in BACKWARD_KERNELS:
            if group in total:
                print(f"pdl=1 {group} {key}: op {total[group]:.1f} us", flush=True)
        print("    " + pipeline_breakdown.path_line({"own": own, "gap": gap, "span": span}).replace(
            "us per call", "us per step"), flush=True)
        if a.kernels:
            print("    one step's kernels: start us, duration us, group: name", flush=True)
            for line in kernel_listing(kernels, replays):
                print("    " + line, flush=True)
        del graph


if __name__ == "__main__":
    main()
