"""Markdown table and PNG plots from a bench_forward.py JSON (no GPU needed).

    python bench/plot_results.py bench/results/h200-2026-11-29.json      # writes .md and .png beside it

Plots: speedup of the op over eager / torch.compile / the bare GEMM against M and against N (one
line per mode, from the sweep cases), and the time of each stage of the op (GEMM + statistics,
finalize, softmax) against the bare GEMM (from the per-kernel profile of the headline case).
"""
from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict

PEERS = ("eager", "compile", "compile-max-autotune", "gemm")


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
    return next((x for x in records if (x["case"], x["M"], x["N"], x["K"], x["mode"], x["impl"]) ==
                 (r["case"], r["M"], r["N"], r["K"], r["mode"], other)), None)


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
    lines = [head, "",
             "| case | M | N | K | mode | op path (auto) | op ms | other path ms | TFLOP/s | vs eager | vs compile "
             "| vs max-autotune | op / GEMM | peak MiB, no grad (op / eager) | peak MiB, autograd (op / eager) "
             "| rel err (op / eager) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, r in best.items():
        case, m, n, k, mode = key
        e, c, ma, g = (peers.get(key + (p,)) for p in ("eager", "compile", "compile-max-autotune", "gemm"))
        other = other_path(records, r)
        eager_rec = next((x for x in records if (x["case"], x["M"], x["N"], x["K"], x["mode"], x["impl"]) == key + ("eager",)), {})
        fmt = lambda v, f: (f % v) if v is not None else "-"  # noqa: E731
        peak = f"{fmt(r.get('peak_mib'), '%.0f')} / {fmt(eager_rec.get('peak_mib'), '%.0f')}"
        peak_ag = f"{fmt(r.get('peak_mib_autograd'), '%.0f')} / {fmt(eager_rec.get('peak_mib_autograd'), '%.0f')}"
        err = f"{fmt(r.get('rel_err'), '%.1e')} / {fmt(eager_rec.get('rel_err'), '%.1e')}"
        lines.append(f"| {case} | {m} | {n} | {k} | {mode} | {r['impl']} | {r['ms']:.4f} | "
                     f"{fmt(other['ms'] if other else None, '%.4f')} | {r['tflops']:.0f} | "
                     f"{fmt(e / r['ms'] if e else None, '%.2f×')} | {fmt(c / r['ms'] if c else None, '%.2f×')} | "
                     f"{fmt(ma / r['ms'] if ma else None, '%.2f×')} | "
                     f"{fmt(r['ms'] / g if g else None, '%.3f')} | {peak} | {peak_ag} | {err} |")
    return "\n".join(lines)


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
                elif any(tag in name for tag in ("GemmUniversal", "nvjet", "column_partials", "bias_rows")) \
                        or "gemm" in name.lower():
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
    a = p.parse_args(argv)
    with open(a.json) as f:
        data = json.load(f)
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
