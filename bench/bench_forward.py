"""Forward benchmark of the fused op against its peers, all timed in one process.

For each case and mode: eager PyTorch (the reference model), torch.compile (optional), the bare
GEMM of the same precision (F.linear), and the op on the generic and sm90 paths. CUDA events,
warm-up, median/min/max of --iters runs, fresh random inputs (x ~ U[0,1), default init), rel
error of every impl vs a float64 reference. Writes the JSON format bench/results/*.json uses.

    python bench/bench_forward.py --quick                # headline shape, every mode
    python bench/bench_forward.py --modes bf16 tf32 --compile --json out.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import gemm_bn_softmax as gbs  # noqa: E402
from gemm_bn_softmax.reference import ReferenceModel  # noqa: E402

MODES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def time_ms(fn, iters: int, warmup: int = 10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    t = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    return statistics.median(t), min(t), max(t)


def rel_err(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


def bench_case(case, m, n, k, mode, iters, do_compile, training=True, profile=False):
    dtype = MODES[mode]
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    precision = "tf32" if mode == "tf32" else ("highest" if mode == "fp32" else None)
    torch.manual_seed(0)
    ref = ReferenceModel(k, n).cuda()
    ref64 = ReferenceModel(k, n).cuda().double()
    ref64.load_state_dict(ref.state_dict())
    fused = gbs.FusedGemmBNSoftmax(k, n, precision=precision).cuda()
    fused.load_state_dict(ref.state_dict())
    ref, fused = ref.to(dtype), fused.to(dtype)
    for mod in (ref, ref64, fused):
        mod.train(training)
    x = torch.rand(m, k, device="cuda")
    xd = x.to(dtype)
    records = []
    with torch.no_grad():
        want = ref64(x.double())
        w, b = fused.gemm.weight, fused.gemm.bias

        def op(path):
            return lambda: gbs.gemm_bn_softmax(xd, w, b, fused.bn.weight, fused.bn.bias, fused.bn.running_mean,
                                               fused.bn.running_var, fused.scale, training=training,
                                               momentum=0.1, eps=1e-5, precision=precision, path=path)

        impls = {"eager": lambda: ref(xd), "gemm": lambda: F.linear(xd, w, b)}
        impls["generic"] = op("generic")
        sm90_ok = gbs.dispatch_path(xd, w, b, precision=precision) == "sm90"
        if sm90_ok:
            impls["sm90"] = op("sm90")
        if do_compile:
            impls["compile"] = torch.compile(ref)
            impls["compile-max-autotune"] = torch.compile(ref, mode="max-autotune-no-cudagraphs")
        for name, fn in impls.items():
            try:
                # error first, on the stats state the timing loop starts from
                out = fn()
                err = rel_err(out, want) if name != "gemm" else None
                med, lo, hi = time_ms(fn, iters)
            except Exception as exc:  # report, keep benchmarking the others
                print(f"  {mode} {name}: FAILED {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            rec = {"case": case, "M": m, "N": n, "K": k, "mode": mode, "impl": name,
                   "training": training, "ms": med, "ms_min": lo, "ms_max": hi,
                   "tflops": 2.0 * m * n * k / (med * 1e-3) / 1e12, "rel_err": err}
            if profile and name in ("sm90", "generic"):
                rec["kernels"] = profile_kernels(fn)
                for row in rec["kernels"]:
                    print(f"  {mode} {name}: {row['us']:8.1f} us x{row['calls_per_iter']:.0f}  {row['kernel'][:90]}")
            records.append(rec)
    torch.backends.cuda.matmul.allow_tf32 = False
    return records


def profile_kernels(fn, iters: int = 20):
    """Per-kernel GPU time of fn (torch.profiler / CUPTI): where the op's time goes."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    rows = []
    for evt in prof.key_averages():
        total = getattr(evt, "device_time_total", None)
        if total is None:
            total = getattr(evt, "cuda_time_total", 0)
        if total > 0:
            rows.append((evt.key, evt.count, total / max(evt.count, 1)))
    rows.sort(key=lambda r: -r[1] * r[2])
    return [{"kernel": k, "calls_per_iter": c / iters, "us": us} for k, c, us in rows]


def table(records):
    lines = [f"{'case':<10}{'mode':<6}{'impl':<22}{'ms':>9}{'TFLOP/s':>9}{'vs gemm':>9}{'vs eager':>9}{'rel err':>10}"]
    base = {(r["case"], r["mode"], r["impl"]): r["ms"] for r in records}
    for r in records:
        g = base.get((r["case"], r["mode"], "gemm"))
        e = base.get((r["case"], r["mode"], "eager"))
        err = f"{r['rel_err']:.2e}" if r["rel_err"] is not None else "-"
        lines.append(f"{r['case']:<10}{r['mode']:<6}{r['impl']:<22}{r['ms']:>9.4f}{r['tflops']:>9.1f}"
                     f"{r['ms'] / g if g else float('nan'):>9.3f}{e / r['ms'] if e else float('nan'):>9.2f}{err:>10}")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    p.add_argument("--size", default="1024x8192x8192", help="MxNxK of the headline case")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--quick", action="store_true", help="fewer iterations")
    p.add_argument("--compile", action="store_true", help="also time torch.compile (slow to compile)")
    p.add_argument("--eval", action="store_true", help="also time eval mode")
    p.add_argument("--profile", action="store_true", help="per-kernel GPU times of the op (torch.profiler)")
    p.add_argument("--json", default=None, help="write results here")
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_forward.py needs a CUDA GPU")
    m, n, k = (int(v) for v in a.size.split("x"))
    iters = 30 if a.quick else a.iters
    records = []
    for mode in a.modes:
        records += bench_case("headline", m, n, k, mode, iters, a.compile, profile=a.profile)
        if a.eval:
            records += bench_case("eval", m, n, k, mode, iters, False, training=False)
    try:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
    except OSError:
        git = "unknown"
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "git": os.environ.get("GIT_REV", git), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "records": records}
    print(table(records))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
