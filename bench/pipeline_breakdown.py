"""Where the forward's GPU time goes: the op (sm90 path unless --paths says otherwise, training mode)
replayed from a CUDA graph of 20 calls, its time per call (median of 30 replays, with the range), and
each kernel's time per call from torch.profiler over the same replays. With programmatic dependent
launch (the default) a kernel's profiled time includes the time it waits for its predecessor, so
compare totals; set FUSED_DISABLE_PDL=1 for each kernel's own time (then "total - sum" is the launch
gaps).

--copy-reference adds, per case, the time of a copy that moves the softmax's bytes: y (M, N) fp32
read once and written once in the output's dtype (`out.copy_(y)`, replayed and profiled the same
way), and the softmax kernel's share of that copy's bandwidth.

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


def kernel_us(graph, replays=5):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    total = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        total[kernel_group(e.name)] += e.device_time_total
    return {k: v / (replays * CALLS) for k, v in total.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cases", nargs="+", default=["bf16:1024x8192x8192", "tf32:1024x8192x8192",
                                                   "bf16:4096x8192x8192"],
                   help="mode:MxNxK, mode bf16 or tf32")
    p.add_argument("--copy-reference", action="store_true",
                   help="also time a copy of y into the output's dtype (the softmax's bytes)")
    p.add_argument("--gemm-reference", action="store_true",
                   help="also time F.linear on the same data (the bare GEMM the op is compared with)")
    p.add_argument("--paths", nargs="+", default=["sm90"], choices=["sm90", "generic", "auto"],
                   help="the op's path(s), each timed on the same data (auto: the library's own choice)")
    a = p.parse_args()
    pdl = os.environ.get("FUSED_DISABLE_PDL", "0") in ("", "0")
    for case in a.cases:
        mode, _, size = case.partition(":")
        if mode not in ("bf16", "tf32") or len(size.split("x")) != 3:
            p.error(f"case {case!r}: expected bf16:MxNxK or tf32:MxNxK")
        m, n, k = (int(v) for v in size.split("x"))
        dtype = torch.bfloat16 if mode == "bf16" else torch.float32
        torch.manual_seed(0)
        mod = gbs.FusedGemmBNSoftmax(k, n, precision="tf32" if mode == "tf32" else None).cuda().to(dtype)
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
                kernels = kernel_us(graph)
                med2, _, _ = per_call_us(graph)
            per_path[path] = (med, kernels)
            ksum = sum(kernels.values())
            label = "" if a.paths == ["sm90"] else f" {path}"
            print(f"pdl={int(pdl)} {mode} {size}{label}: op {med:.1f} us ({lo:.1f}-{hi:.1f}; again {med2:.1f}) | "
                  "kernels " + " ".join(f"{k} {v:.1f}" for k, v in sorted(kernels.items()))
                  + f" | sum {ksum:.1f} | total - sum {med - ksum:+.1f}", flush=True)
        if a.gemm_reference:
            saved = torch.backends.cuda.matmul.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
            try:
                with torch.no_grad():
                    linear = graph_of(lambda: torch.nn.functional.linear(x, mod.gemm.weight, mod.gemm.bias))
                    lin_med, lin_lo, lin_hi = per_call_us(linear)
                    lin_kernels = kernel_us(linear)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = saved
            lin_sum = sum(lin_kernels.values())
            print(f"    F.linear {lin_med:.1f} us ({lin_lo:.1f}-{lin_hi:.1f}), kernels {lin_sum:.1f} us", flush=True)
            for path, (op_med, op_kernels) in per_path.items():
                what = "one kernel (the whole op)" if "one kernel" in op_kernels else "GEMM kernel"
                ours = op_kernels.get("one kernel", op_kernels.get("gemm", float("nan")))
                print(f"    {path}: the op's {what} {ours:.1f} us = {ours / lin_sum:.3f}x F.linear's kernels; "
                      f"op / F.linear {op_med / lin_med:.3f}", flush=True)
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
