"""Forward benchmark of the fused op against its peers, all timed in one process.

For each case and mode: eager PyTorch (the reference model), torch.compile (default and
max-autotune-no-cudagraphs; compile time reported separately), the bare GEMM of the same precision
(F.linear), and the op on its generic and sm90 paths. CUDA events, warm-up, median/min/max of
--iters runs, fresh random inputs (x ~ U[0,1), default init), peak memory, rel error of every impl
vs a float64 reference. Writes bench/results/<gpu>-<date>.json (+ .md and .png via plot_results.py).

Cases: headline (1024x8192x8192) in fp32 / tf32 / bf16 / fp16; eval mode; an M sweep (256..65536
at N = K = 8192); an N sweep (512..131072 at M = 1024, K = 4096); a small-K case.

    python bench/bench_forward.py --quick          # about a minute: a subset, fewer iterations
    python bench/bench_forward.py                  # everything (several minutes)
    python bench/bench_forward.py --cases headline --modes bf16 --profile
    python bench/bench_forward.py --time-budget 400; python bench/bench_forward.py --resume <json>
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemm_bn_softmax as gbs  # noqa: E402
from gemm_bn_softmax.reference import ReferenceModel  # noqa: E402

MODES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
CASES = ("headline", "eval", "m-sweep", "n-sweep", "small-k")
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


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


def bench_case(case, m, n, k, mode, iters, compile_modes=(), training=True, profile=False, dynamic=False):
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
        del ref64
        w, b = fused.gemm.weight, fused.gemm.bias

        def op(path):
            return lambda: gbs.gemm_bn_softmax(xd, w, b, fused.bn.weight, fused.bn.bias, fused.bn.running_mean,
                                               fused.bn.running_var, fused.scale, training=training,
                                               momentum=0.1, eps=1e-5, precision=precision, path=path)

        impls = {"eager": lambda: ref(xd), "gemm": lambda: F.linear(xd, w, b), "generic": op("generic")}
        auto_path = gbs.dispatch_path(xd, w, b, precision=precision)  # what a user of the op gets
        try:
            gbs.dispatch_path(xd, w, b, precision=precision, path="sm90")  # raises where sm90 cannot run
            impls["sm90"] = op("sm90")
        except RuntimeError:
            pass
        for cmode in compile_modes:
            name = "compile" if cmode == "default" else "compile-max-autotune"
            impls[name] = compiled_peer(ref, xd, cmode, dynamic)
        for name, fn in impls.items():
            try:
                if name.startswith("compile"):
                    # Every case builds a new model: without a reset the recompilations pile up
                    # until dynamo's recompile limit silently falls back to eager.
                    torch._dynamo.reset()
                t0 = time.perf_counter()
                out = fn()  # first call: compiles the torch.compile peers
                torch.cuda.synchronize()
                first_s = time.perf_counter() - t0
                err = rel_err(out, want) if name != "gemm" else None
                del out
                memory = measure_memory(fn)
                if training and not name.startswith("compile"):  # compiled peers would recompile for grad
                    memory.update({f"{key}_autograd": v for key, v in measure_memory(fn, grad=True).items()})
                med, lo, hi = time_ms(fn, iters)
            except Exception as exc:  # report, keep benchmarking the others
                print(f"  {case} {mode} {name}: FAILED {type(exc).__name__}: {exc}", file=sys.stderr)
                continue
            rec = {"case": case, "M": m, "N": n, "K": k, "mode": mode, "impl": name,
                   "training": training, "ms": med, "ms_min": lo, "ms_max": hi,
                   "tflops": 2.0 * m * n * k / (med * 1e-3) / 1e12, "rel_err": err, **memory}
            if name in ("generic", "sm90"):
                rec["auto_path"] = auto_path
            if name.startswith("compile"):
                rec["compile_s"] = first_s
            if profile and name in ("sm90", "generic"):
                rec["kernels"] = profile_kernels(fn)
            records.append(rec)
    torch.backends.cuda.matmul.allow_tf32 = False
    return records


def compiled_peer(model, x, cmode, dynamic):
    """torch.compile of the reference model; it compiles on its first call (timed as compile_s)."""
    compiled = torch.compile(model, mode=None if cmode == "default" else "max-autotune-no-cudagraphs",
                             dynamic=dynamic)
    return lambda: compiled(x)


def measure_memory(fn, grad: bool = False):
    """Device memory of one call, in MiB above what was allocated before it.

    peak_mib: the high-water mark during the call. large_allocs: allocations from the caching
    allocator's large pool (> 1 MiB: on the headline shape, the (M, N) tensors a call creates).
    With grad=True the parameters record an autograd graph, as in a training step, and
    retained_mib is what the graph keeps alive for the backward after the forward returns.
    """
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    allocs = torch.cuda.memory_stats().get("allocation.large_pool.allocated", 0)
    with torch.set_grad_enabled(grad):
        out = fn()
    torch.cuda.synchronize()
    result = {"peak_mib": (torch.cuda.max_memory_allocated() - base) / 2**20,
              "large_allocs": torch.cuda.memory_stats().get("allocation.large_pool.allocated", 0) - allocs}
    if grad:
        result["retained_mib"] = (torch.cuda.memory_allocated() - base) / 2**20
    del out
    return result


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


def plan(a):
    """(case, M, N, K, mode, training, compile_modes, dynamic) for the chosen cases."""
    hm, hn, hk = (int(v) for v in a.size.split("x"))
    quick = a.quick
    compile_modes = () if a.no_compile else (("default",) if quick else ("default", "max-autotune"))
    sweep_modes = [md for md in a.modes if md in ("bf16", "tf32")] or a.modes[:1]
    out = []
    if "headline" in a.cases:
        out += [("headline", hm, hn, hk, md, True, compile_modes, False) for md in a.modes]
    if "eval" in a.cases:
        out += [("eval", hm, hn, hk, md, False, (), False) for md in sweep_modes]
    sweep_compile = () if a.no_compile else ("default",)
    if "m-sweep" in a.cases:
        ms = (256, 4096, 16384) if quick else (256, 1024, 4096, 16384, 65536)
        out += [("m-sweep", m, 8192, 8192, md, True, sweep_compile, True) for md in sweep_modes for m in ms]
    if "n-sweep" in a.cases:
        ns = (512, 8192, 131072) if quick else (512, 2048, 8192, 32768, 131072)
        out += [("n-sweep", 1024, n, 4096, md, True, sweep_compile, True) for md in sweep_modes for n in ns]
    if "small-k" in a.cases:
        out += [("small-k", 4096, 8192, 64, md, True, sweep_compile, False) for md in sweep_modes]
    return out


def gpu_info():
    info = {}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.limit",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=10).stdout.strip()
        info["clocks"] = q
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def case_key(item):
    """(case, M, N, K, mode, training) of a plan item or a record: what --resume matches on."""
    if isinstance(item, dict):
        return item["case"], item["M"], item["N"], item["K"], item["mode"], item["training"]
    return tuple(item[:6])


def new_result(iters, now):
    try:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
    except OSError:
        git = "unknown"
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "git": os.environ.get("GIT_REV", git), "date": now.isoformat(timespec="seconds"),
            "gpu": gpu_info(), "iters": iters, "command": " ".join(sys.argv[1:]), "complete": False, "records": []}


def write_json(result, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--size", default="1024x8192x8192", help="MxNxK of the headline case")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--quick", action="store_true", help="a one-minute subset: fewer sizes and iterations")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peers (slow to compile)")
    p.add_argument("--profile", action="store_true", help="per-kernel GPU times of the op (torch.profiler)")
    p.add_argument("--json", default=None, help="output path (default bench/results/<gpu>-<date>.json)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--resume", default=None, metavar="JSON",
                   help="continue an interrupted run: skip the cases this JSON already holds, append to it")
    p.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="start no new case after S seconds (the JSON is written after every case)")
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_forward.py needs a CUDA GPU")
    iters = 30 if a.quick else max(a.iters, 30)
    todo = plan(a)
    now = dt.datetime.now(dt.timezone.utc)
    path = a.json or a.resume or os.path.join(
        RESULTS, f"{torch.cuda.get_device_name().split()[-1].lower()}-{now:%Y-%m-%d}.json")
    result = new_result(iters, now)
    if a.resume:  # keep what an earlier, interrupted run of the same plan measured
        with open(a.resume) as f:
            earlier = json.load(f)
        if earlier.get("git") != result["git"]:
            sys.exit(f"--resume: {a.resume} was measured at git {earlier.get('git')}, this is {result['git']}")
        result = earlier
        done = {case_key(r) for r in result["records"]}
        todo = [t for t in todo if case_key(t) not in done]
        print(f"resuming {a.resume}: {len(done)} cases done, {len(todo)} to go", flush=True)
    started = time.perf_counter()
    try:
        from tqdm import tqdm
        todo_iter = tqdm(todo, desc="bench", unit="case")
    except ImportError:
        todo_iter = todo
    for i, (case, m, n, k, mode, training, cmodes, dynamic) in enumerate(todo_iter):
        if a.time_budget and time.perf_counter() - started > a.time_budget:
            print(f"time budget of {a.time_budget} s spent: {len(todo) - i} cases left; "
                  f"continue with --resume {path}", flush=True)
            break
        if todo_iter is todo:
            print(f"[{i}/{len(todo)}] {case} {mode} {m}x{n}x{k}", flush=True)
        result["records"] += bench_case(case, m, n, k, mode, iters, cmodes, training,
                                        a.profile and case == "headline", dynamic)
        result["complete"] = i + 1 == len(todo)
        write_json(result, path)  # after every case: an interrupted run keeps what it measured
        torch.cuda.empty_cache()
    else:
        result["complete"] = True
        write_json(result, path)
    print(table(result["records"]))
    print(f"wrote {path}" + ("" if result["complete"] else " (incomplete)"))
    if not a.no_plots:
        import plot_results

        plot_results.main([path])


if __name__ == "__main__":
    main()
