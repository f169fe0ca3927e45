"""Where the forward's GPU time goes: the op (sm90 path unless --paths says otherwise, training mode)
replayed from a CUDA graph of 20 calls, its time per call (median of 30 replays, with the range), and
each kernel's time per call from torch.profiler over the same replays. With programmatic dependent
launch (the default) a kernel's profiled time includes the time it waits for its predecessor, so
compare totals; set FUSED_DISABLE_PDL=1 for each kernel's own time (then "total - sum" is the launch
gaps).

--copy-reference adds, per case, the time of a copy that moves the softmax's bytes: y (M, N) fp32
read once and written once in the output's dtype (`out.copy_(y)`, replayed and profiled the same
way), and the softmax kernel's share of that copy's bandwidth.

Each case also prints the op's critical path over the same profiled replays ("path"): kernels in issue
order, the interval from the end of one kernel to the end of the next charged to the next one (its
"own" part from when it starts or its predecessor ends, whichever is later, and a "gap" where nothing
of the op ran). With PDL a kernel starts while its predecessor runs and waits; only the part after
the predecessor ends counts. These intervals add up to the replays' span, so they attribute one run's
time without mixing runs whose clocks differ. The first kernel of each replay has no predecessor in
it (the graph launch comes between); it counts its whole duration.

--gemm-reference adds, per case, F.linear on the same x, W and bias (cuBLAS; TF32 allowed in tf32
mode), replayed and profiled the same way, against the op's GEMM kernel: the two GEMMs on the same
data in the same process (the data moves the clocks of a power-limited GEMM by several per cent)."""
import argparse
import collections
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_forward  # noqa: E402  (its CUDA-graph capture and CUDA-event timer)
import ncu_summary  # noqa: E402  (which kernel names are GEMMs)
import gemm_bn_softmax as gbs  # noqa: E402

CALLS = 20


def graph_of(fn):
    """CALLS calls of fn captured in one CUDA graph (after warm-up calls on a side stream)."""
    return bench_forward.capture(lambda: [fn() for _ in range(CALLS)])


def per_call_us(graph, replays=30):
    """Median, min and max µs per call over `replays` replays of a graph of CALLS calls."""
    med, lo, hi = bench_forward.time_ms(graph.replay, replays)
    return tuple(ms / CALLS * 1e3 for ms in (med, lo, hi))


def kernel_group(name):
    """The forward's stage a kernel belongs to, from its (demangled) name; other kernels keep theirs."""
    if ncu_summary.is_one_kernel_forward(name):
        return "one kernel"
    if ncu_summary.is_gemm_kernel(name):
        return "gemm"
    if "finalize" in name:
        return "finalize"
    if "softmax" in name:
        return "softmax"
    return name[:40]


MODES = ("bf16", "tf32", "3xtf32")


def parse_case(case):
    """"mode:MxNxK" (mode one of MODES) -> (mode, m, n, k); ValueError otherwise."""
    mode, _, size = case.partition(":")
    dims = size.split("x")
    if mode not in MODES or len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
        raise ValueError(f"case {case!r}: expected bf16:MxNxK, tf32:MxNxK or 3xtf32:MxNxK")
    return (mode, *(int(d) for d in dims))


def mode_module(mode, k, n):
    """The fused module of a case's mode on the GPU, and its dtype: bench_forward's dtype and precision
    for that mode."""
    spec = bench_forward.TRAIN_MODES[mode]
    return gbs.FusedGemmBNSoftmax(k, n, precision=spec.precision).cuda().to(spec.dtype), spec.dtype


def critical_path(kernels, replays, calls_per_replay=CALLS):
    """kernels: (group, start, end) per kernel, in µs, of `replays` replays of one graph, any order.
    Returns {group: own µs}, gap µs and span µs, each per call (calls_per_replay calls a replay):
    kernels sorted by start; in each
    replay (an equal share of them) the first counts end - start, every other one end - max(start,
    previous end) as its own and max(0, start - previous end) as gap. Own and gap add up to the
    replays' spans (their kernels' first start to last end)."""
    ordered = sorted(kernels, key=lambda k: k[1])
    if not ordered or len(ordered) % replays:
        raise ValueError(f"{len(ordered)} kernels do not split into {replays} replays")
    per_replay = len(ordered) // replays
    own = collections.defaultdict(float)
    gap = span = 0.0
    for r in range(replays):
        run = ordered[r * per_replay:(r + 1) * per_replay]
        prev_end = None
        for group, start, end in run:
            if prev_end is None:
                own[group] += end - start
            else:
                own[group] += end - max(start, prev_end)
                gap += max(0.0, start - prev_end)
            prev_end = end if prev_end is None else max(prev_end, end)
        span += prev_end - run[0][1]
    calls = replays * calls_per_replay
    return {k: v / calls for k, v in own.items()}, gap / calls, span / calls


def kernel_us(graph, replays=5, path=None):
    """Each kernel group's profiled time per call; with path (a dict), also fills it with the
    critical path of the same replays (critical_path's own, gap and span)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    total = collections.defaultdict(float)
    timeline = []
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        group = kernel_group(e.name)
        total[group] += e.device_time_total
        timeline.append((group, e.time_range.start, e.time_range.end))
    if path is not None:
        own, gap, span = critical_path(timeline, replays)
        path.update(own=own, gap=gap, span=span)
    return {k: v / (replays * CALLS) for k, v in total.items()}


def path_line(path):
    """One line of a critical path: each group's own µs per call, the gaps, the span."""
    return ("path " + " ".join(f"{k} {v:.1f}" for k, v in sorted(path["own"].items()))
            + f" gaps {path['gap']:.1f} | span {path['span']:.1f} us per call")


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cases", nargs="+", default=["bf16:1024x8192x8192", "tf32:1024x8192x8192",
                                                   "bf16:4096x8192x8192"],
                   help="mode:MxNxK, mode bf16, tf32 or 3xtf32")
    p.add_argument("--copy-reference", action="store_true",
                   help="also time a copy of y into the output's dtype (the softmax's bytes)")
    p.add_argument("--gemm-reference", action="store_true",
                   help="also time F.linear on the same data (the bare GEMM the op is compared with)")
    p.add_argument("--paths", nargs="+", default=["sm90"], choices=["sm90", "generic", "auto"],
                   help="the op's path(s), each timed on the same data (auto: the library's own choice)")
    a = p.parse_args()
    pdl = os.environ.get("FUSED_DISABLE_PDL", "0") in ("", "0")
    try:
        cases = [parse_case(c) for c in a.cases]
    except ValueError as e:
        p.error(str(e))
    for mode, m, n, k in cases:
        size = f"{m}x{n}x{k}"
        torch.manual_seed(0)
        mod, dtype = mode_module(mode, k, n)
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        bn = mod.bn
        per_path = {}  # path -> (µs per call, kernel µs per group)
        for path in a.paths:
            call = lambda: gbs.gemm_bn_softmax(x, mod.gemm.weight, mod.gemm.bias, bn.weight, bn.bias,  # noqa: E731
                                               bn.running_mean, bn.running_var, mod.scale, training=True,
                                               precision=mod.precision, path=path)
            with torch.no_grad():
                graph = graph_of(call)
                med, lo, hi = per_call_us(graph)
                crit = {}
                kernels = kernel_us(graph, path=crit)
                med2, _, _ = per_call_us(graph)
            per_path[path] = (med, kernels, crit)
            ksum = sum(kernels.values())
            label = "" if a.paths == ["sm90"] else f" {path}"
            print(f"pdl={int(pdl)} {mode} {size}{label}: op {med:.1f} us ({lo:.1f}-{hi:.1f}; again {med2:.1f}) | "
                  "kernels " + " ".join(f"{k} {v:.1f}" for k, v in sorted(kernels.items()))
                  + f" | sum {ksum:.1f} | total - sum {med - ksum:+.1f}", flush=True)
            print(f"    {path_line(crit)}", flush=True)
        if a.gemm_reference:
            saved = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
            try:
                with torch.no_grad():
                    linear = graph_of(lambda: torch.nn.functional.linear(x, mod.gemm.weight, mod.gemm.bias))
                    lin_med, lin_lo, lin_hi = per_call_us(linear)
                    lin_crit = {}
                    lin_kernels = kernel_us(linear, path=lin_crit)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = saved
            lin_sum = sum(lin_kernels.values())
            print(f"    F.linear {lin_med:.1f} us ({lin_lo:.1f}-{lin_hi:.1f}), kernels {lin_sum:.1f} us; "
                  f"{path_line(lin_crit)}", flush=True)
            for path, (op_med, op_kernels, op_crit) in per_path.items():
                what = "one kernel (the whole op)" if "one kernel" in op_kernels else "GEMM kernel"
                ours = op_kernels.get("one kernel", op_kernels.get("gemm", float("nan")))
                print(f"    {path}: the op's {what} {ours:.1f} us = {ours / lin_sum:.3f}x F.linear's kernels; "
                      f"op / F.linear {op_med / lin_med:.3f}; profiled spans {op_crit['span'] / lin_crit['span']:.3f}",
                      flush=True)
        if a.copy_reference:
            y = torch.randn(m, n, device="cuda", dtype=torch.float32)
            out = torch.empty(m, n, device="cuda", dtype=dtype)
            copy_kernels = kernel_us(graph_of(lambda: out.copy_(y)))
            copy = sum(copy_kernels.values())
            moved = m * n * (4 + out.element_size())
            softmax = per_path[a.paths[0]][1].get("softmax", float("nan"))
            print(f"    copy of y to {str(dtype).replace('torch.', '')} ({moved / 2**20:.0f} MiB moved): {copy:.1f} us "
                  f"= {moved / copy / 1e6:.2f} TB/s; softmax {softmax:.1f} us = {moved / softmax / 1e6:.2f} TB/s, "
                  f"{100 * copy / softmax:.0f} % of the copy's bandwidth", flush=True)


if __name__ == "__main__":
    main()
