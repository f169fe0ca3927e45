"""Markdown table and PNG plots from a bench_forward.py JSON (no GPU needed).

    python bench/plot_results.py bench/results/h200-2026-11-29.json      # writes .md and .png beside it
    python bench/plot_results.py --readme <json>   # prints the README's forward table

Markdown: the forward cases (op vs peers), then the training steps (fused vs eager vs torch.compile:
time, peak memory, gradient errors) and, where the run had --profile, the fused step's GPU time per kernel.

Plots: speedup of the op over eager / torch.compile / the bare GEMM against M and against N (one
line per mode, from the sweep cases), and the time of each stage of the op (GEMM + statistics,
finalize, softmax) against the bare GEMM (from the per-kernel profile of the headline case).
"""
from __future__ import annotations

import argparse
import json
import os
import re
from collections import defaultdict

import ncu_summary

PEERS = ("eager", "compile", "compile-max-autotune", "gemm")
# bench_forward.TRAIN_CASES (not imported from there: that needs the compiled op)
TRAIN_CASES = ("train-step", "train-step-sgd")
TRAIN_IMPLS = ("fused", "eager", "compile")


def fmt(value, spec):
    return (spec % value) if value is not None else "-"


def kernel_label(name):
    """A short name for a profiler kernel name (CUTLASS and ATen kernels have long template names)."""
    label = ncu_summary.short_name(name)
    if label == "cuBLAS GEMM":  # keep the kernel's own name: a step runs several GEMMs
        return f"cuBLAS GEMM {name.replace('void ', '').split('(')[0].split('<')[0][:60]}"
    functors = re.findall(r"(\w+(?:Functor|_functor|_kernel_cuda))\b", name)
    if "at::native" in name and functors:  # ATen's elementwise / reduce kernels differ by their functor
        label = f"{label} ({functors[-1]})"
    return label.replace("|", "\\|")


def best_op(records):
    """The op's record per (case, M, N, K, mode): the path auto dispatch picks (what a user gets);
    for results without `auto_path` (older JSON), the faster of the two paths."""
    by_key = defaultdict(dict)
    for r in records:
        if r["impl"] in ("sm90", "generic"):
            by_key[(r["case"], r["M"], r["N"], r["K"], r["mode"])][r["impl"]] = r
    best = {}
    for key, paths in by_key.items():
        auto = next((r["auto_path"] for r in paths.values() if r.get("auto_path")), None)
        best[key] = paths[auto] if auto in paths else min(paths.values(), key=lambda r: r["ms"])
    return best


def other_path(records, r):
    """The op's record on its other path (sm90 <-> generic), or None."""
    other = "generic" if r["impl"] == "sm90" else "sm90"
    return record_of(records, (r["case"], r["M"], r["N"], r["K"], r["mode"], other)) or None


def record_of(records, key):
    """The record of (case, M, N, K, mode, impl), or {}."""
    return next((x for x in records if (x["case"], x["M"], x["N"], x["K"], x["mode"], x["impl"]) == key), {})


def peer_ms(records):
    out = {}
    for r in records:
        if r["impl"] in PEERS:
            out[(r["case"], r["M"], r["N"], r["K"], r["mode"], r["impl"])] = r["ms"]
    return out


def markdown(data) -> str:
    records = data["records"]
    best, peers = best_op(records), peer_ms(records)
    head = f"{data['device']}, torch {data['torch']}, CUDA {data['cuda']}, git {data['git']}, {data['date']}"
    if data.get("command") is not None:
        head += f"; `python bench/bench_forward.py {data['command']}`"
    if data.get("complete") is False:
        head += " (INCOMPLETE run: some cases are missing)"
    lines = [head]
    if best:
        lines += forward_table(records, best, peers)
    return "\n".join(lines + train_markdown(records))


def compile_range(compile_rec):
    """(lo, hi) ms over the torch.compile peer's compiles, or None where it was compiled once."""
    return tuple(compile_rec["ms_range"]) if len(compile_rec.get("ms_repeats", ())) > 1 else None


def compile_verdict(ms, compile_rec):
    """"faster", "slower" or "inside": ms against the range of the torch.compile peer's compiles (its
    median where it was compiled once); "-" without a peer."""
    if not compile_rec:
        return "-"
    lo, hi = compile_range(compile_rec) or (compile_rec["ms"], compile_rec["ms"])
    return "faster" if ms < lo else "slower" if ms > hi else "inside"


def readme_table(records):
    """Lines of the README's forward table: per shape and mode, the op on the sm90 path, the module in a
    loop, the bare GEMM, eager, torch.compile (median and range of its compiles), op / GEMM per call and
    on the GPU alone, and the module against the compiles' range."""
    lines = ["| shape (M×N×K) | mode | op, sm90 | module | bare GEMM | eager | torch.compile | op / GEMM "
             "| op / GEMM, GPU only | module vs compile |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    keys = list(dict.fromkeys((r["case"], r["M"], r["N"], r["K"], r["mode"]) for r in records
                              if r["case"] not in TRAIN_CASES))
    for key in keys:
        op, module, gemm, eager, comp = (record_of(records, key + (impl,))
                                         for impl in ("sm90", "module", "gemm", "eager", "compile"))
        if not op:
            continue
        comp_range = compile_range(comp) if comp else None
        comp_text = fmt(comp.get("ms"), "%.3f") + (" ({:.3f}–{:.3f})".format(*comp_range) if comp_range else "")
        gpu_only = (op["graph_ms"] / gemm["graph_ms"] if op.get("graph_ms") and gemm.get("graph_ms") else None)
        _, m, n, k, mode = key
        lines.append(f"| {m}×{n}×{k} | {mode} | {op['ms']:.3f} | {fmt(module.get('ms'), '%.3f')} | "
                     f"{fmt(gemm.get('ms'), '%.3f')} | {fmt(eager.get('ms'), '%.3f')} | {comp_text} | "
                     f"{fmt(op['ms'] / gemm['ms'] if gemm else None, '%.2f')} | {f'{gpu_only:.2f}' if gpu_only else '–'} | "
                     f"{compile_verdict(module['ms'], comp) if module else '-'} |")
    return lines


def forward_table(records, best, peers):
    """Lines of the forward table: the op on the path auto dispatch picks, against its peers."""
    lines = ["",
             "| case | M | N | K | mode | op path (auto) | op ms | other path ms | TFLOP/s | vs eager | vs compile "
             "| vs max-autotune | op / GEMM | op / GEMM, GPU only | peak MiB, no grad (op / eager) "
             "| peak MiB, autograd (op / eager) | rel err (op / eager) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, r in best.items():
        case, m, n, k, mode = key
        e, c, ma, g = (peers.get(key + (p,)) for p in ("eager", "compile", "compile-max-autotune", "gemm"))
        other = other_path(records, r)
        eager_rec, compile_rec, gemm_rec = (record_of(records, key + (impl,)) for impl in ("eager", "compile", "gemm"))
        # GPU time alone (CUDA graphs; bench_forward's graph_ms, measured for the smaller problems)
        gpu_only = (r["graph_ms"] / gemm_rec["graph_ms"] if r.get("graph_ms") and gemm_rec.get("graph_ms")
                    else None)
        vs_compile = fmt(c / r["ms"] if c else None, "%.2f×")
        compiles = compile_range(compile_rec)
        if compiles:  # the range over the compiles
            lo, hi = compiles
            vs_compile += f" ({lo / r['ms']:.2f}–{hi / r['ms']:.2f})"
        peak = f"{fmt(r.get('peak_mib'), '%.0f')} / {fmt(eager_rec.get('peak_mib'), '%.0f')}"
        peak_ag = f"{fmt(r.get('peak_mib_autograd'), '%.0f')} / {fmt(eager_rec.get('peak_mib_autograd'), '%.0f')}"
        err = f"{fmt(r.get('rel_err'), '%.1e')} / {fmt(eager_rec.get('rel_err'), '%.1e')}"
        lines.append(f"| {case} | {m} | {n} | {k} | {mode} | {r['impl']} | {r['ms']:.4f} | "
                     f"{fmt(other['ms'] if other else None, '%.4f')} | {r['tflops']:.0f} | "
                     f"{fmt(e / r['ms'] if e else None, '%.2f×')} | {vs_compile} | "
                     f"{fmt(ma / r['ms'] if ma else None, '%.2f×')} | "
                     f"{fmt(r['ms'] / g if g else None, '%.3f')} | {fmt(gpu_only, '%.3f')} | {peak} | {peak_ag} | "
                     f"{err} |")
    return lines


def train_markdown(records):
    """Lines of the training-step table, and of the fused step's per-kernel tables (--profile)."""
    by_key = defaultdict(dict)  # (case, M, N, K, mode) -> {impl: record}
    for r in records:
        if r["case"] in TRAIN_CASES:
            by_key[(r["case"], r["M"], r["N"], r["K"], r["mode"])][r["impl"]] = r
    if not by_key:
        return []
    mode_order = list(dict.fromkeys(key[4] for key in by_key))
    keys = sorted(by_key, key=lambda key: (TRAIN_CASES.index(key[0]), mode_order.index(key[4]), key[1:4]))
    lines = ["", "Training step: zero_grad, out = block(x), loss = (out * g).sum(), backward (train-step-sgd: "
             "+ SGD momentum step); x requires grad. Median ms of the timed steps; compile: median of the "
             "per-compile medians (range over the compiles). vs: peer ms / fused ms. grad err: "
             "‖grad − grad₆₄‖/‖grad₆₄‖. graph ms: the same step (no optimizer) replayed from one CUDA graph, "
             "no host overhead; host ms: the CPU time to issue one step.", "",
             "| case | M | N | K | mode | fused ms | eager ms | compile ms (range) | fused vs eager | fused vs compile "
             "| graph ms (fused / eager) | host ms (fused / eager) "
             "| peak MiB (fused / eager / compile) | grad err x (fused / eager) | grad err W (fused / eager) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in keys:
        impls = by_key[key]
        ms = {impl: r["ms"] for impl, r in impls.items()}
        compile_ms = fmt(ms.get("compile"), "%.3f")
        if impls.get("compile", {}).get("ms_range"):
            compile_ms += " ({:.3f}–{:.3f})".format(*impls["compile"]["ms_range"])
        fused_vs = [fmt(ms[peer] / ms["fused"] if peer in ms and "fused" in ms else None, "%.2f×")
                    for peer in ("eager", "compile")]
        peak = " / ".join(fmt(impls.get(impl, {}).get("peak_mib"), "%.0f") for impl in TRAIN_IMPLS)
        grad_err = {name: " / ".join(fmt((impls.get(impl, {}).get("grad_err") or {}).get(name), "%.1e")
                                     for impl in ("fused", "eager")) for name in ("x", "weight")}
        graph = " / ".join(fmt(impls.get(impl, {}).get("graph_ms"), "%.3f") for impl in ("fused", "eager"))
        host = " / ".join(fmt(impls.get(impl, {}).get("host_ms"), "%.3f") for impl in ("fused", "eager"))
        lines.append(f"| {' | '.join(map(str, key))} | {fmt(ms.get('fused'), '%.3f')} | "
                     f"{fmt(ms.get('eager'), '%.3f')} | {compile_ms} | {fused_vs[0]} | {fused_vs[1]} | {graph} | "
                     f"{host} | {peak} | {grad_err['x']} | {grad_err['weight']} |")
    for key in keys:
        fused = by_key[key].get("fused")
        if fused and fused.get("kernels"):
            lines += [""] + kernel_table(fused)
    return lines


def kernel_table(r):
    """Lines of a per-kernel table of one profiled training step: each kernel, then GEMMs vs the rest."""
    per_step = [(kern["kernel"], kern["calls_per_iter"], kern["us"] * kern["calls_per_iter"]) for kern in r["kernels"]]
    total = sum(us for _, _, us in per_step) or float("nan")
    gemm_us = sum(us for name, _, us in per_step if ncu_summary.is_gemm_kernel(name))
    lines = [f"Fused {r['case']}, {r['mode']}, {r['M']}×{r['N']}×{r['K']}: GPU time per kernel in one step "
             "(torch.profiler, averaged over the profiled steps; launch gaps excluded).", "",
             "| kernel | calls per step | µs per step | share |", "|---|---|---|---|"]
    lines += [f"| {kernel_label(name)} | {calls:g} | {us:.1f} | {us / total:.1%} |" for name, calls, us in per_step]
    lines += [f"| **all GEMMs** | | {gemm_us:.1f} | {gemm_us / total:.1%} |",
              f"| **all other kernels** | | {total - gemm_us:.1f} | {(total - gemm_us) / total:.1%} |",
              f"| **total** | | {total:.1f} | 100% |"]
    return lines


def plot(data, prefix: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = data["records"]
    best, peers = best_op(records), peer_ms(records)
    written = []
    for case, axis in (("m-sweep", 1), ("n-sweep", 2)):
        series = defaultdict(list)
        for key, r in best.items():
            if key[0] != case:
                continue
            for peer in ("eager", "compile", "gemm"):
                ms = peers.get(key + (peer,))
                if ms:
                    series[(key[4], peer)].append((key[axis], ms / r["ms"]))
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for (mode, peer), pts in sorted(series.items()):
            pts.sort()
            style = {"eager": "-o", "compile": "--s", "gemm": ":^"}[peer]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=f"{mode} vs {peer}")
        ax.set_xscale("log", base=2)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("M (batch)" if axis == 1 else "N (out_features)")
        ax.set_ylabel("speedup of the fused op (peer ms / op ms)")
        ax.set_title(f"{data['device']}: fused Linear+BN+scale+softmax, {case}")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        path = f"{prefix}-{case}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)

    stages = []  # (label, gemm+stats us, finalize us, softmax us, other us, bare gemm us)
    for r in records:
        if r.get("kernels") and r["case"] == "headline":
            t = defaultdict(float)
            for kern in r["kernels"]:
                name, us = kern["kernel"], kern["us"] * kern["calls_per_iter"]
                if "finalize" in name:
                    t["finalize"] += us
                elif "softmax" in name:
                    t["softmax"] += us
                elif ncu_summary.is_gemm_kernel(name) or "column_partials" in name or "bias_rows" in name:
                    t["gemm+stats"] += us  # generic path: bias into y, cuBLAS GEMM, column-partials pass
                else:
                    t["other"] += us
            g = peers.get((r["case"], r["M"], r["N"], r["K"], r["mode"], "gemm"))
            stages.append((f"{r['mode']} {r['impl']}", t, g * 1e3 if g else None))
    if stages:
        fig, ax = plt.subplots(figsize=(10, 4.5))
        names = ["gemm+stats", "finalize", "softmax", "other"]
        colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52"]
        stages = [s for s in stages if s[2]]  # relative to the bare GEMM of the same precision
        for i, (label, t, g) in enumerate(stages):
            left = 0.0
            for name, color in zip(names, colors):
                ax.barh(i, t[name] / g, left=left, color=color, label=name if i == 0 else None)
                left += t[name] / g
        ax.axvline(1.0, color="k", lw=1.5, label="bare GEMM (F.linear)")
        ax.axvline(1.05, color="k", lw=1, ls="--", label="goal: 1.05 x bare GEMM")
        ax.set_yticks(range(len(stages)), [s[0] for s in stages])
        ax.set_xlabel("GPU time per call / bare GEMM time (kernels only, launch gaps excluded)")
        ax.set_title(f"{data['device']}: time per stage, headline shape")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, not over them
        fig.tight_layout()
        path = f"{prefix}-stages.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--readme", action="store_true",
                   help="print the README's forward table for this JSON (nothing written)")
    a = p.parse_args(argv)
    with open(a.json) as f:
        data = json.load(f)
    if a.readme:
        print("\n".join(readme_table(data["records"])))
        return 0
    prefix = os.path.splitext(a.json)[0]
    with open(prefix + ".md", "w") as f:
        f.write(markdown(data) + "\n")
    written = [prefix + ".md"]
    if not a.no_plots:
        written += plot(data, prefix)
    print("\n".join(written))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
