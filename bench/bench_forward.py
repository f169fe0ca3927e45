"""Forward and training-step benchmark of the fused op against its peers, all timed in one process.

Forward cases: eager PyTorch (the reference model), torch.compile (default, compiled afresh
--compile-repeats times: "ms" is the median of the compiles' medians, "ms_range" their range; and
max-autotune-no-cudagraphs, compiled once; compile time reported separately), the bare GEMM of the same precision
(F.linear), and the op on its generic and sm90 paths. CUDA events, warm-up, median/min/max of
--iters runs in each of --rounds rounds (default 4), each after 0.1 s of back-to-back calls (the order
of the impls reversed every other round, so that the GPU's clock drift hits them alike; the compiled
peers' cold compiles come between the rounds), fresh random inputs (x ~ U[0,1), default init), peak
memory, rel error of every impl vs a float64 reference; for impls under 1 ms per call (but the
torch.compile peers) also "graph_ms", the GPU time per call from CUDA-graph replays. Writes bench/results/<gpu>-<date>.json (+ .md and .png via plot_results.py).

Cases: headline (1024x8192x8192) in fp32 / tf32 / bf16 / fp16; eval mode; an M sweep (256..65536
at N = K = 8192); an N sweep (512..131072 at M = 1024, K = 4096); a small-K case; train.

The train case times what a user runs to train the block: one step = zero_grad(set_to_none),
out = model(x), loss = (out * g).sum() with a fixed random g, loss.backward() (x requires grad, as
for a head inside a network), for FusedGemmBNSoftmax ("fused"), the reference model ("eager") and
torch.compile of it ("compile", compiled afresh 3 times: "ms" is the median of the three medians).
fused and eager are timed as the forward impls are: in --rounds alternating rounds, each after 0.1 s of
steps, the peer's cold compiles between the rounds.
Modes: bf16, fp16, tf32, 3xtf32 (fp32-grade on TF32 tensor cores; its peers run exact fp32), fp32
and autocast-bf16 (fp32 model, forward + loss under
torch.autocast(bfloat16), backward outside it) at the headline shape; an M sweep (256..16384 at
N = K = 8192) in bf16 and tf32; "train-step-sgd" adds torch.optim.SGD(momentum=0.9).step() at the
headline in bf16 and autocast-bf16. Every train record holds the step's peak memory and the errors
of the output and of every gradient against a float64 step from the same state (grad_err); its
tflops counts the step's three GEMMs (6·M·N·K). --profile adds the fused step's per-kernel times.

    python bench/bench_forward.py --quick          # a subset, fewer iterations
    python bench/bench_forward.py                  # everything (several minutes)
    python bench/bench_forward.py --cases headline --modes bf16 --profile
    python bench/bench_forward.py --cases train --modes bf16 autocast-bf16 --profile
    python bench/bench_forward.py --time-budget 400; python bench/bench_forward.py --resume <json>
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemm_bn_softmax as gbs  # noqa: E402
from gemm_bn_softmax.reference import ReferenceModel  # noqa: E402

class TrainMode(NamedTuple):
    dtype: torch.dtype                 # of the parameters and of x
    precision: Optional[str]           # FusedGemmBNSoftmax(precision=...)
    allow_tf32: bool                   # torch.backends.cuda.matmul.allow_tf32, for the eager / compile peers
    autocast: Optional[torch.dtype]    # forward and loss under torch.autocast("cuda", dtype=autocast)


# The forward modes plus AMP; "autocast-bf16" exists only for the train case.
TRAIN_MODES = {
    "fp32": TrainMode(torch.float32, "highest", False, None),
    "tf32": TrainMode(torch.float32, "tf32", True, None),
    "3xtf32": TrainMode(torch.float32, "3xtf32", False, None),
    "bf16": TrainMode(torch.bfloat16, None, False, None),
    "fp16": TrainMode(torch.float16, None, False, None),
    "autocast-bf16": TrainMode(torch.float32, None, False, torch.bfloat16),
}
# The forward modes (the same without AMP): the dtype per mode; the op's precision argument is the
# train mode's (3xtf32's peers are exact fp32: eager, compile and cuBLAS).
MODES = {name: m.dtype for name, m in TRAIN_MODES.items() if m.autocast is None}
CASES = ("headline", "eval", "m-sweep", "n-sweep", "small-k", "train")
# The record cases of the CLI case "train", and how often each compiles its torch.compile peer afresh
# (compiled-code timings vary from compile to compile; the SGD step only needs one).
TRAIN_COMPILE_REPEATS = {"train-step": 3, "train-step-sgd": 1}
TRAIN_CASES = tuple(TRAIN_COMPILE_REPEATS)
TRAIN_IMPLS = ("fused", "eager", "compile")
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


# Seconds each timing first runs its impl back to back, so that what ran before it weighs less (the
# clocks follow the power draw with a lag): timed once each in a fixed order after ten warm-up calls, the
# module and the op it runs came out 5-10 % apart, and level when settled like this (H200, bench/NOTES.md).
SETTLE_S = 0.1


def time_ms(fn, iters: int, warmup: int = 10, settle_s: float = 0.0):
    """Median, min and max ms per call of fn over `iters` calls (CUDA events around each), after
    `warmup` calls and then at least `settle_s` seconds of calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < settle_s:
        for _ in range(4):
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


# Forward impls faster than this per call also get graph_ms: their GPU time alone, which a loop bound by the
# host (small problems) hides; above it event timing already measures the GPU.
GRAPH_MS_BELOW = 1.0


def graph_ms_per_call(fn, iters: int, ms_per_call: float):
    """GPU time per call of fn (ms): calls back to back captured in one CUDA graph (about 1 ms of work,
    at most 20 calls), the median of `iters` replays divided by the calls. Launch and host costs are out."""
    calls = max(1, min(20, round(1.0 / max(ms_per_call, 1e-3))))

    def body():
        for _ in range(calls):
            fn()  # outputs dropped at once: the graph's pool reuses their memory

    graph = capture(body)
    med, _, _ = time_ms(graph.replay, iters, warmup=3, settle_s=SETTLE_S)
    del graph
    return med / calls


def rel_err(got, want):
    return ((got.double() - want).norm() / want.norm()).item()


def settled_timing(fn, iters):
    """time_ms after SETTLE_S of calls, as a record's ms / ms_min / ms_max."""
    return dict(zip(("ms", "ms_min", "ms_max"), time_ms(fn, iters, settle_s=SETTLE_S)))


def alternating_rounds(plain, timed, rounds, compiles, compile_one, failed):
    """Times the impls of `plain` (name -> fn, in order) in `rounds` rounds, the order reversed every other
    round (an even count gives every impl both neighbours equally), against the GPU's clock drift
    (SETTLE_S); the compile jobs ((name, factory) pairs, for compile_one) run one after each round while
    they last, so the compiled peers' cold compiles spread between the rounds. An impl that raises is
    reported through failed(name, exc) and the rest go on. Returns ({name: [timed(name, fn) per round]},
    {name: [compile_one(name, factory) per job]})."""
    timings, compiled = {name: [] for name in plain}, {}
    names = list(plain)
    for r in range(max(rounds, len(compiles))):
        if r < rounds:
            for name in (names if r % 2 == 0 else names[::-1]):
                try:
                    timings[name].append(timed(name, plain[name]))
                except Exception as exc:
                    failed(name, exc)
        if r < len(compiles):
            name, factory = compiles[r]
            try:
                compiled.setdefault(name, []).append(compile_one(name, factory))
            except Exception as exc:
                failed(name, exc)
    return timings, compiled


def bench_case(case, m, n, k, mode, iters, compile_modes=(), training=True, profile=False, dynamic=False,
               compile_repeats=1, rounds=4):
    """The forward of one shape and mode: every impl's records. The impls but the compiled peers are
    timed in `rounds` alternating rounds (ms: the median of the rounds' medians; ms_rounds). The
    default-mode torch.compile peer is compiled afresh compile_repeats times, the compiles spread
    between the rounds (ms: the median of the compiles' medians; ms_range)."""
    dtype = MODES[mode]
    torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
    precision = TRAIN_MODES[mode].precision
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

        # "module": the nn.Module a user holds (auto path; running stats and num_batches_tracked as
        # nn.BatchNorm1d moves them), called back to back as a loop calls it.
        impls = {"eager": lambda: ref(xd), "gemm": lambda: F.linear(xd, w, b), "module": lambda: fused(xd)}
        if mode != "3xtf32":  # the generic path has no 3xTF32 GEMM (it refuses)
            impls["generic"] = op("generic")
        # What a user of the op gets here (no_grad: y is not kept).
        auto_path = gbs.dispatch_path(xd, w, b, precision=precision, differentiable=False)
        for forced in ("sm90", "recompute"):
            try:  # raises where that path cannot run (recompute: small K, y not kept, as here)
                gbs.dispatch_path(xd, w, b, precision=precision, path=forced, differentiable=False)
                impls[forced] = op(forced)
            except RuntimeError:
                pass
        for cmode in compile_modes:
            name = "compile" if cmode == "default" else "compile-max-autotune"
            impls[name] = functools.partial(compiled_peer, ref, xd, cmode, dynamic)  # a factory: a new compile per call

        def measure_once(name, fn):
            """rel error and memory of impl `name`'s fn, and the seconds of its first call (a compile for
            the peers)."""
            t0 = time.perf_counter()
            out = fn()  # first call: compiles the torch.compile peers
            torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            rec = {"rel_err": rel_err(out, want) if name != "gemm" else None}
            del out
            rec.update(measure_memory(fn))
            # (compiled peers would recompile for grad; the recompute path runs without gradients only)
            if training and not name.startswith("compile") and name != "recompute":
                rec.update({f"{key}_autograd": v for key, v in measure_memory(fn, grad=True).items()})
            return rec, first_s

        def timed(name, fn):
            """One timing of fn: median/min/max ms per call over iters calls, and its graph_ms."""
            t = settled_timing(fn, iters)
            if not name.startswith("compile") and t["ms"] < GRAPH_MS_BELOW:
                try:
                    t["graph_ms"] = graph_ms_per_call(fn, iters, t["ms"])
                except Exception as exc:  # report, keep the event-timed figure
                    t["graph_ms"] = None
                    print(f"  {case} {mode} {name}: graph capture failed: {type(exc).__name__}: {exc}",
                          file=sys.stderr)
            return t

        def compiled_record(name, cmode_fn):
            """A fresh cold compile of a torch.compile peer, measured and timed at once (the next reset of
            dynamo drops its code, so it cannot wait for a later round)."""
            for _ in cold_compiles(1):
                fn = cmode_fn()
                rec, first_s = measure_once(name, fn)
                rec.update(timed(name, fn))
            return rec, first_s

        def failed(name, exc):  # report, keep benchmarking the others
            print(f"  {case} {mode} {name}: FAILED {type(exc).__name__}: {exc}", file=sys.stderr)

        # Every impl but the compiled peers in alternating rounds, the peers' cold compiles between them.
        plain = {name: fn for name, fn in impls.items() if not name.startswith("compile")}
        compiles = [(name, fn) for name, fn in impls.items() if name.startswith("compile")
                    for _ in range(compile_repeats if name == "compile" else 1)]
        static = {}
        for name, fn in plain.items():
            try:
                static[name], _ = measure_once(name, fn)
            except Exception as exc:
                failed(name, exc)
        timings, compiled = alternating_rounds({name: plain[name] for name in static}, timed, rounds, compiles,
                                               compiled_record, failed)

        merged = {name: {**static[name], **merged_rounds(timings[name])} for name in static if timings[name]}
        merged.update({name: merged_compile_repeats(reps) for name, reps in compiled.items()})
        for name in impls:
            if name not in merged:
                continue
            rec = {"case": case, "M": m, "N": n, "K": k, "mode": mode, "impl": name, "training": training,
                   **merged[name]}
            rec["tflops"] = 2.0 * m * n * k / (rec["ms"] * 1e-3) / 1e12
            if name in ("generic", "sm90", "recompute", "module"):
                rec["auto_path"] = auto_path
            if profile and name in ("sm90", "generic", "recompute", "module"):
                rec["kernels"] = profile_kernels(impls[name])
            records.append(rec)
    torch.backends.cuda.matmul.allow_tf32 = False
    return records


def compiled_peer(model, x, cmode, dynamic):
    """torch.compile of the reference model; it compiles on its first call (timed as compile_s)."""
    compiled = torch.compile(model, mode=None if cmode == "default" else "max-autotune-no-cudagraphs",
                             dynamic=dynamic)
    return lambda: compiled(x)


def cold_compiles(repeats: int):
    """Yields `repeats` times, each time with dynamo's compiled code dropped and inductor's caches
    off, so that every torch.compile made inside is a cold compile (a cache hit would replay the
    first compile's kernels and autotuning picks); dynamo is reset once more at the end. Without a
    reset between cases, recompilations pile up until dynamo's limit silently falls back to eager."""
    with torch.compiler.config.patch(force_disable_caches=True):
        for _ in range(repeats):
            torch._dynamo.reset()
            yield
    torch._dynamo.reset()


def merged_compile_repeats(repeats):
    """One record from (record, first-call seconds) pairs of separately compiled peers: ms is the
    median of their medians, ms_range their range; min/max over every timed call; the first
    compile's other fields (errors, memory)."""
    medians = [r["ms"] for r, _ in repeats]
    return {**repeats[0][0], "ms": statistics.median(medians),
            "ms_min": min(r["ms_min"] for r, _ in repeats), "ms_max": max(r["ms_max"] for r, _ in repeats),
            "ms_repeats": medians, "ms_range": [min(medians), max(medians)],
            "compile_s": repeats[0][1], "compile_s_repeats": [s for _, s in repeats]}


def merged_rounds(timings):
    """One record's timing fields from an impl's rounds (each timed()'s dict): ms and graph_ms are the
    median of the rounds' medians, ms_rounds / graph_ms_rounds each round's, ms_min / ms_max over
    every timed call."""
    ms = [t["ms"] for t in timings]
    rec = {"ms": statistics.median(ms), "ms_min": min(t["ms_min"] for t in timings),
           "ms_max": max(t["ms_max"] for t in timings), "ms_rounds": ms}
    if any("graph_ms" in t for t in timings):
        graphs = [t.get("graph_ms") for t in timings]
        known = [g for g in graphs if g is not None]
        rec["graph_ms"] = statistics.median(known) if known else None
        rec["graph_ms_rounds"] = graphs
    return rec


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


def train_step(model, x, g, autocast_dtype=None, optimizer=None):
    """One training step of the block as users run it (AMP: forward and loss under autocast,
    backward outside it); returns the forward output."""
    model.zero_grad(set_to_none=True)
    x.grad = None
    amp = torch.autocast(x.device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
    with amp:
        out = model(x)
        loss = (out * g).sum()
    loss.backward()
    if optimizer is not None:
        optimizer.step()
    return out


def host_ms(step, iters: int = 10):
    """Median host time to issue one step onto an idle GPU: when it is not far below the step's GPU
    time ("ms"), the loop is bound by the CPU (Python, dispatch, launches), not by the kernels."""
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def capture(body, before_capture=None, warmup=3):
    """body() captured in a CUDA graph, after `warmup` calls on a side stream (allocations,
    communicators and lazy initialisation happen outside the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            body()
    torch.cuda.current_stream().wait_stream(side)
    if before_capture is not None:
        before_capture()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph


def step_graph(model, x, g, autocast_dtype=None):
    """One training step (forward, loss, backward into gradients set to None) captured in a CUDA graph.
    As in PyTorch's whole-network capture, the gradients are None before the capture, so its backward
    allocates them (static)."""
    def reset():
        model.zero_grad(set_to_none=True)
        x.grad = None

    def body():
        reset()
        # autocast's weight cache cannot live inside a capture
        amp = (torch.autocast("cuda", dtype=autocast_dtype, cache_enabled=False) if autocast_dtype
               else contextlib.nullcontext())
        with amp:
            loss = (model(x) * g).sum()
        loss.backward()

    return capture(body, before_capture=reset)


def graph_ms(model, x, g, autocast_dtype, iters):
    """The step of step_graph replayed: the GPU time with no host overhead and no launch gaps."""
    graph = step_graph(model, x, g, autocast_dtype)
    med, _, _ = time_ms(graph.replay, iters)
    del graph
    return med


def fresh_model(make, init_state, dtype, device):
    """make() with the shared initial state, in dtype: every impl starts from the same parameters and
    running statistics (a step mutates the latter). Built on the device: no host-side init of W."""
    with torch.device(device):
        module = make()
    module.load_state_dict(init_state)
    return module.to(dtype)


def grads_of(model, x):
    return {"x": x.grad, "weight": model.gemm.weight.grad, "bias": model.gemm.bias.grad,
            "gamma": model.bn.weight.grad, "beta": model.bn.bias.grad, "scale": model.scale.grad}


def float64_step(init_state, x, g):
    """Output and gradients of one step of a float64 copy of the reference model: what the impls are checked against."""
    k, n = x.shape[1], g.shape[1]
    ref64 = fresh_model(lambda: ReferenceModel(k, n), init_state, torch.float64, x.device)
    x64 = x.detach().double().requires_grad_()
    out = train_step(ref64, x64, g.double()).detach()
    return out, {name: grad.detach() for name, grad in grads_of(ref64, x64).items()}


def grad_errors(got, want):
    """rel error per gradient; the Linear bias's true gradient is ~0 under batch statistics (BN removes any
    per-column shift), so a relative error means nothing there: its absolute max instead, beside float64's."""
    errors = {name: rel_err(got[name], want[name]) if got[name] is not None else None
              for name in ("x", "weight", "gamma", "beta", "scale")}
    errors["bias_abs"] = got["bias"].abs().max().item() if got["bias"] is not None else None
    errors["bias_abs_ref64"] = want["bias"].abs().max().item()
    return errors


def prepare_train_step(model, x, g, spec, want, sgd=False):
    """One step of model checked against the float64 step (want), then its peak memory (after that first
    step: grads and optimizer state exist, as in a loop). Returns (step, record, seconds of the first step:
    the compile time of a torch.compile peer)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9) if sgd else None
    step = functools.partial(train_step, model, x, g, spec.autocast, optimizer)
    t0 = time.perf_counter()
    out = step()
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    want_out, want_grads = want
    rec = {"rel_err": rel_err(out.detach(), want_out), "out_dtype": str(out.dtype).replace("torch.", ""),
           "grad_err": grad_errors(grads_of(model, x), want_grads)}
    del out
    memory = measure_memory(step, grad=True)
    rec["peak_mib"], rec["large_allocs"] = memory["peak_mib"], memory["large_allocs"]
    return step, rec, first_s


def finish_train_step(rec, step, model, x, g, spec, iters, sgd=False, profile=False, graph=False):
    """The record's host time per step, GPU time alone (graph_ms, a CUDA graph of the step; not with an
    optimizer) and, with profile, per-kernel times."""
    rec["host_ms"] = host_ms(step)
    if graph and not sgd:
        try:
            rec["graph_ms"] = graph_ms(model, x, g, spec.autocast, iters)
        except Exception as exc:  # a peer that cannot be captured: say so, keep the rest
            rec["graph_ms"] = None
            print(f"  graph capture failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    if profile:
        rec["kernels"] = profile_kernels(step)
    return rec


def free_memory(x):
    x.grad = None
    gc.collect()
    torch.cuda.empty_cache()


def bench_train_case(case, m, n, k, mode, iters, compile_peer=True, profile=False, rounds=4):
    """Training step of the block: fused, eager and torch.compile, same x, g and initial state. fused and
    eager are timed in `rounds` alternating rounds (ms: the median of the rounds' medians; ms_rounds), the
    torch.compile peer's cold compiles (TRAIN_COMPILE_REPEATS) between the rounds."""
    spec = TRAIN_MODES[mode]
    sgd = case == "train-step-sgd"
    torch.backends.cuda.matmul.allow_tf32 = spec.allow_tf32
    torch.manual_seed(0)
    with torch.device("cuda"):
        init_state = ReferenceModel(k, n).state_dict()
    x = torch.rand(m, k, device="cuda").to(spec.dtype).requires_grad_()
    # The loss's weights in the dtype of the output a user gets (bf16 under bf16 autocast); the float64
    # reference uses exactly these values.
    g = torch.randn(m, n, device="cuda", dtype=spec.autocast or spec.dtype)
    want = float64_step(init_state, x, g)
    free_memory(x)

    makers = {"fused": lambda: gbs.FusedGemmBNSoftmax(k, n, precision=spec.precision),
              "eager": lambda: ReferenceModel(k, n)}  # the compile peer compiles an eager model

    def model(impl):
        return fresh_model(makers[impl], init_state, spec.dtype, "cuda")

    def failed(impl, exc):  # report, keep benchmarking the others
        print(f"  {case} {mode} {m}x{n}x{k} {impl}: FAILED {type(exc).__name__}: {exc}", file=sys.stderr)

    def compiled_record(impl, _):
        """A fresh cold compile of the eager model, checked, timed and finished at once (the next reset of
        dynamo drops its code)."""
        try:
            for _ in cold_compiles(1):  # compile_s is cold too
                compiled = torch.compile(model("eager"))
                step, rec, first_s = prepare_train_step(compiled, x, g, spec, want, sgd)
                rec.update(settled_timing(step, iters))
                finish_train_step(rec, step, compiled, x, g, spec, iters, sgd)
                del step, compiled
            return rec, first_s
        finally:
            free_memory(x)

    prepared = {}  # impl -> (model, step, record)
    for impl in ("fused", "eager"):
        try:
            mdl = model(impl)
            step, rec, _ = prepare_train_step(mdl, x, g, spec, want, sgd)
            prepared[impl] = (mdl, step, rec)
        except Exception as exc:
            failed(impl, exc)
        finally:
            x.grad = None
    compiles = [("compile", None)] * (TRAIN_COMPILE_REPEATS[case] if compile_peer else 0)
    timings, compiled = alternating_rounds({impl: p[1] for impl, p in prepared.items()},
                                           lambda impl, step: settled_timing(step, iters), rounds, compiles,
                                           compiled_record, failed)
    merged = {}
    for impl, (mdl, step, rec) in prepared.items():
        if not timings[impl]:
            continue
        try:
            rec.update(merged_rounds(timings[impl]))
            merged[impl] = finish_train_step(rec, step, mdl, x, g, spec, iters, sgd, profile and impl == "fused",
                                             graph=True)
        except Exception as exc:
            failed(impl, exc)
    if compiled.get("compile"):
        merged["compile"] = merged_compile_repeats(compiled["compile"])
    del prepared
    free_memory(x)
    records = []
    for impl in TRAIN_IMPLS:
        if impl not in merged:
            continue
        rec = merged[impl]
        # a step runs three GEMMs of the forward's size: y = x W^T, dx = dy W, dW = dy^T x
        records.append({"case": case, "M": m, "N": n, "K": k, "mode": mode, "impl": impl, "training": True,
                        "tflops": 6.0 * m * n * k / (rec["ms"] * 1e-3) / 1e12, **rec})
    torch.backends.cuda.matmul.allow_tf32 = False
    return records


def table(records):
    forward = [r for r in records if r["case"] not in TRAIN_CASES]
    train = [r for r in records if r["case"] in TRAIN_CASES]
    return "\n\n".join(([forward_table(forward)] if forward else []) + ([train_table(train)] if train else []))


def forward_table(records):
    """Forward records as text; the peers of a record are those of its own shape (case, M, N, K, mode)."""
    lines = [f"{'case':<10}{'M':>7}{'N':>8}{'K':>6} {'mode':<6}{'impl':<22}{'ms':>9}{'TFLOP/s':>9}{'vs gemm':>9}"
             f"{'vs eager':>9}{'rel err':>10}{'graph ms':>10}{'vs gemm':>9}"]
    base = {(r["case"], r["M"], r["N"], r["K"], r["mode"], r["impl"]): r for r in records}
    for r in records:
        key = (r["case"], r["M"], r["N"], r["K"], r["mode"])
        g, e = base.get(key + ("gemm",)), base.get(key + ("eager",))
        err = f"{r['rel_err']:.2e}" if r["rel_err"] is not None else "-"
        graph, g_graph = r.get("graph_ms"), (g or {}).get("graph_ms")
        lines.append(f"{r['case']:<10}{r['M']:>7}{r['N']:>8}{r['K']:>6} {r['mode']:<6}{r['impl']:<22}{r['ms']:>9.4f}"
                     f"{r['tflops']:>9.1f}{r['ms'] / g['ms'] if g else float('nan'):>9.3f}"
                     f"{e['ms'] / r['ms'] if e else float('nan'):>9.2f}{err:>10}"
                     f"{graph if graph else float('nan'):>10.4f}"
                     f"{graph / g_graph if graph and g_graph else float('nan'):>9.3f}")
    return "\n".join(lines)


def train_table(records):
    """Train records as text; vs eager / vs compile > 1: this impl's step is faster than that peer's."""
    lines = [f"{'case':<16}{'mode':<15}{'M':>7}  {'impl':<9}{'ms':>9}{'vs eager':>10}{'vs compile':>11}"
             f"{'graph ms':>10}{'host ms':>9}{'peak MiB':>10}{'err x':>10}{'err W':>10}"]
    base = {(r["case"], r["M"], r["N"], r["K"], r["mode"], r["impl"]): r["ms"] for r in records}
    for r in records:
        key = (r["case"], r["M"], r["N"], r["K"], r["mode"])
        e, c = base.get(key + ("eager",)), base.get(key + ("compile",))
        errs = r.get("grad_err") or {}
        err = [f"{errs[name]:.1e}" if errs.get(name) is not None else "-" for name in ("x", "weight")]
        lines.append(f"{r['case']:<16}{r['mode']:<15}{r['M']:>7}  {r['impl']:<9}{r['ms']:>9.4f}"
                     f"{e / r['ms'] if e else float('nan'):>10.2f}{c / r['ms'] if c else float('nan'):>11.2f}"
                     f"{r.get('graph_ms') or float('nan'):>10.4f}{r.get('host_ms') or float('nan'):>9.3f}"
                     f"{r['peak_mib']:>10.0f}{err[0]:>10}{err[1]:>10}")
    return "\n".join(lines)


def headline_size(a):
    return tuple(int(v) for v in a.size.split("x"))


def plan(a):
    """(case, M, N, K, mode, training, compile_modes, dynamic) for the chosen cases.

    Train items carry their record case ("train-step", "train-step-sgd"); their compile_modes is
    ("default",) or (): whether the torch.compile peer runs."""
    hm, hn, hk = headline_size(a)
    quick = a.quick
    modes = [md for md in a.modes if md in MODES]  # the forward cases ignore train-only modes
    compile_modes = () if a.no_compile else (("default",) if quick else ("default", "max-autotune"))
    sweep_modes = [md for md in modes if md in ("bf16", "tf32")] or modes[:1]
    out = []
    if "headline" in a.cases:
        out += [("headline", hm, hn, hk, md, True, compile_modes, False) for md in modes]
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
        ks = (64, 128) if quick else (64, 128, 256)
        out += [("small-k", 4096, 8192, k, md, True, sweep_compile, False) for md in sweep_modes for k in ks]
    if "train" in a.cases:
        out += train_plan(a, (hm, hn, hk))
    return out


def train_plan(a, headline):
    """The train case: headline in every train mode, the SGD step, then the M sweep (the case order
    is the priority order under --time-budget)."""
    modes = [md for md in a.modes if md in TRAIN_MODES]
    sweep_modes = [md for md in modes if md in ("bf16", "tf32")] or modes[:1]
    peer = () if a.no_compile else ("default",)
    sweep_peer = () if a.no_compile or a.quick else ("default",)
    ms = (256, 4096) if a.quick else (256, 1024, 4096, 16384)
    items = [("train-step", *headline, md, True, peer, False) for md in modes]
    items += [("train-step-sgd", *headline, md, True, peer, False) for md in modes if md in ("bf16", "autocast-bf16")]
    items += [("train-step", m, 8192, 8192, md, True, sweep_peer, False) for md in sweep_modes for m in ms]
    unique = {}  # the sweep's M = 1024 is the headline point (same record key): measured once, with its peer
    for item in items:
        unique.setdefault(case_key(item), item)
    return list(unique.values())


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


def tree_revision(directory):
    """The commit the tree at `directory` is, for the results' "git" field: HEAD's short hash, with
    "+changes" appended where tracked files differ from HEAD. A GPU machine's copy of the repository
    may carry an older .git than the files it builds; then the suffix says the hash is not the tree's
    (give the commit as GIT_REV there). "unknown" outside a repository."""
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=directory)
    try:
        head = git("rev-parse", "--short", "HEAD")
        if head.returncode != 0 or not head.stdout.strip():
            return "unknown"
        changed = git("diff", "--quiet", "HEAD", "--").returncode != 0
    except OSError:
        return "unknown"
    return head.stdout.strip() + ("+changes" if changed else "")


def new_result(iters, now):
    git = tree_revision(os.path.dirname(os.path.abspath(__file__)))
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
    p.add_argument("--modes", nargs="+", choices=list(TRAIN_MODES), default=list(TRAIN_MODES),
                   help="autocast-bf16 applies to the train case only; the forward cases skip it")
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--size", default="1024x8192x8192", help="MxNxK of the headline case")
    p.add_argument("--iters", type=int, default=50, help="timed calls per impl and round")
    p.add_argument("--rounds", type=int, default=4,
                   help="rounds in which each impl but the compiled peers (forward and train) is timed, the "
                        "order reversed every other round (default 4: one slow round does not move the median, as "
                        "it does the mean that the median of two is); ms is the median of the rounds' medians")
    p.add_argument("--train-iters", type=int, default=None, help="timed steps per train impl (default 30, --quick 20)")
    p.add_argument("--quick", action="store_true", help="a subset: fewer sizes and iterations")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peers (slow to compile)")
    p.add_argument("--compile-repeats", type=int, default=None, metavar="N",
                   help="cold compiles of each forward case's default-mode torch.compile peer (default 3, "
                        "--quick 1); its timings vary from compile to compile: the record keeps the median "
                        "and the range. max-autotune compiles once")
    p.add_argument("--profile", action="store_true",
                   help="per-kernel GPU times (torch.profiler) of the op and of the fused training step (headline)")
    p.add_argument("--json", default=None, help="output path (default bench/results/<gpu>-<date>.json)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--resume", default=None, metavar="JSON",
                   help="continue an interrupted run: skip the cases this JSON already holds, append to it")
    p.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="start no new case after S seconds (the JSON is written after every case)")
    a = p.parse_args()
    if a.compile_repeats is None:
        a.compile_repeats = 1 if a.quick else 3
    if a.compile_repeats < 1:
        p.error("--compile-repeats must be at least 1")
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    if not torch.cuda.is_available():
        sys.exit("bench_forward.py needs a CUDA GPU")
    iters = 30 if a.quick else max(a.iters, 30)
    train_iters = a.train_iters or (20 if a.quick else 30)
    todo = plan(a)
    headline = headline_size(a)
    now = dt.datetime.now(dt.timezone.utc)
    path = a.json or a.resume or os.path.join(
        RESULTS, f"{torch.cuda.get_device_name().split()[-1].lower()}-{now:%Y-%m-%d}.json")
    result = new_result(iters, now)
    result["train_iters"] = train_iters
    result["rounds"] = a.rounds
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
        if case in TRAIN_CASES:
            result["records"] += bench_train_case(case, m, n, k, mode, train_iters, bool(cmodes),
                                                  a.profile and case == "train-step" and (m, n, k) == headline,
                                                  a.rounds)
        else:
            result["records"] += bench_case(case, m, n, k, mode, iters, cmodes, training,
                                            a.profile and case in ("headline", "small-k"), dynamic,
                                            a.compile_repeats, a.rounds)
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
