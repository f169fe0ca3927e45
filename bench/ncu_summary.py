"""Turns the text report of bench/profile_ncu.sh (ncu --print details) into a markdown summary:
per kernel its duration, SM / DRAM throughput, registers and occupancy, and the figure that
matters for it: achieved % of the tensor-core ceiling for the GEMM, % of the copy bandwidth for
the memory-bound kernels (bytes counted from the problem shape).

    python bench/ncu_summary.py report.txt --size 1024x8192x8192 --dtype bf16 > bench/results/ncu-summary.md
"""
from __future__ import annotations

import argparse
import re
import sys

# Ceilings measured on the H200 (bench/NOTES.md): TFLOP/s of a bare GEMM, and copy bandwidth.
# 3xtf32: the useful fp32 rate at the TF32 ceiling, three TF32 products per multiply-add.
TENSOR_TFLOPS = {"bf16": 786.0, "fp16": 786.0, "tf32": 429.0, "3xtf32": 429.0 / 3}
COPY_TBPS = 4.17
METRIC = re.compile(r"^ {4}(\S.*?\S)\s{2,}(?:(\S+(?: \S+)?)\s{2,})?(\S+)\s*$")


def parse(text: str):
    """[(kernel name, {metric: (unit, value)})] in report order."""
    kernels, current = [], None
    for line in text.splitlines():
        if line.startswith("  ") and not line.startswith("   ") and line.strip() and not line.startswith("  =="):
            current = (line.strip(), {})
            kernels.append(current)
            continue
        if current is None:
            continue
        m = METRIC.match(line)
        if m and not set(m.group(1)) <= set("-"):
            name, unit, value = m.group(1), m.group(2) or "", m.group(3)
            try:
                current[1].setdefault(name, (unit, float(value.replace(",", ""))))
            except ValueError:
                pass
    return kernels


# Substrings that mark a GEMM kernel in profiler and Nsight Compute names: cuBLAS's (nvjet, xmma, gemm)
# and CUTLASS's, ours included (cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<...>>).
GEMM_TAGS = ("nvjet", "gemm", "xmma", "cutlass")


def is_one_kernel_forward(name: str) -> bool:
    """The sm90 path's whole forward in one kernel (small grids): not a GEMM, though its name holds CUTLASS's types."""
    return "one_kernel_forward" in name


def is_gemm_kernel(name: str) -> bool:
    lower = name.lower()
    return not is_one_kernel_forward(name) and any(tag in lower for tag in GEMM_TAGS)


def short_name(name: str) -> str:
    if is_one_kernel_forward(name):
        return "sm90 one-kernel forward (GEMM + statistics + softmax)"
    if "GemmUniversal" in name:
        return "sm90 GEMM + column statistics"
    m = re.search(r"(finalize_kernel|softmax_rows_\w+|column_partials_\w*kernel|bias_rows_kernel)", name)
    if m:
        return m.group(1)
    if any(tag in name for tag in GEMM_TAGS):
        return "cuBLAS GEMM"
    m = re.search(r"(\w+_kernel)", name)
    return m.group(1) if m else name[:60]


def summarize(kernels, m: int, n: int, k: int, dtype: str) -> str:
    out_bytes = 4 if dtype in ("tf32", "3xtf32") else 2   # out, bias: the input dtype
    generic = any("column_partials" in name for name, _ in kernels)
    # partial-statistics row tiles: 128 rows on the generic path and in the 3xTF32 kernel, else 256
    tiles = (m + 127) // 128 if generic or dtype == "3xtf32" else (m + 255) // 256
    rows = ["| kernel | duration µs | SM clock GHz | SM throughput % | DRAM throughput % | registers | achieved occupancy % | vs ceiling |",
            "|---|---|---|---|---|---|---|---|"]
    for name, met in kernels:
        dur = met.get("Duration", ("", float("nan")))
        dur_us = dur[1] / 1000.0 if dur[0] == "ns" else (dur[1] * 1000.0 if dur[0] == "ms" else dur[1])
        sname = short_name(name)
        if "GEMM" in sname:
            tflops = 2.0 * m * n * k / (dur_us * 1e-6) / 1e12
            ceiling = f"{tflops:.0f} TFLOP/s = {100 * tflops / TENSOR_TFLOPS[dtype]:.0f} % of {TENSOR_TFLOPS[dtype]:.0f}"
        else:
            if "softmax" in sname:
                nbytes = m * n * 4 + m * n * out_bytes + 3 * n * 4   # y read, out written, per-column map
            elif "finalize" in sname:
                nbytes = 2 * tiles * n * 4 + 5 * n * 4               # partials read; a, c, mean, invstd, stats
            elif "column_partials" in sname:
                nbytes = m * n * 4 + 2 * tiles * n * 4
            elif "bias_rows" in sname:
                nbytes = m * n * 4 + n * out_bytes
            else:
                nbytes = 0
            tbps = nbytes / (dur_us * 1e-6) / 1e12 if nbytes else float("nan")
            ceiling = f"{tbps:.2f} TB/s = {100 * tbps / COPY_TBPS:.0f} % of {COPY_TBPS}" if nbytes else "-"
        get = lambda key: met.get(key, ("", float("nan")))[1]  # noqa: E731
        rows.append(f"| {sname} | {dur_us:.1f} | {get('SM Frequency'):.2f} | {get('Compute (SM) Throughput'):.1f} | "
                    f"{get('DRAM Throughput'):.1f} | {get('Registers Per Thread'):.0f} | "
                    f"{get('Achieved Occupancy'):.1f} | {ceiling} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("report", help="text output of bench/profile_ncu.sh")
    p.add_argument("--size", default="1024x8192x8192")
    p.add_argument("--dtype", choices=sorted(TENSOR_TFLOPS), default="bf16")
    a = p.parse_args(argv)
    m, n, k = (int(v) for v in a.size.split("x"))
    with open(a.report) as f:
        kernels = parse(f.read())
    if not kernels:
        print("no kernels found in the report", file=sys.stderr)
        return 1
    print(summarize(kernels, m, n, k, a.dtype))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
