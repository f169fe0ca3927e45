"""The benchmark tooling that needs no GPU: results -> markdown/plots, ncu report -> summary."""
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench")

import ncu_summary  # noqa: E402
import plot_results  # noqa: E402

RESULT = os.path.join(BENCH, "results", "h200-2026-11-29.json")
NCU = os.path.join(BENCH, "results", "ncu-h200-2026-11-29-bf16-sm90.txt")


def test_markdown_and_stage_plot(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "r.json"
    shutil.copy(RESULT, path)
    assert plot_results.main([str(path)]) == 0
    md = (tmp_path / "r.md").read_text()
    data = json.load(open(RESULT))
    n_cases = {(r["case"], r["mode"]) for r in data["records"] if r["impl"] in ("sm90", "generic")}
    assert md.count("\n| headline") + md.count("\n| eval") == len(n_cases)
    assert (tmp_path / "r-stages.png").stat().st_size > 10_000


def test_ncu_summary_reads_every_kernel():
    kernels = ncu_summary.parse(open(NCU).read())
    names = [ncu_summary.short_name(k) for k, _ in kernels]
    assert names == ["sm90 GEMM + column statistics", "finalize_kernel", "softmax_rows_in_registers"]
    gemm = kernels[0][1]
    assert gemm["Duration"][0] == "us" and gemm["Duration"][1] > 100
    table = ncu_summary.summarize(kernels, 1024, 8192, 8192, "bf16")
    assert "TFLOP/s" in table and "TB/s" in table


def test_bench_cli_help():
    out = subprocess.run([sys.executable, os.path.join(BENCH, "bench_forward.py"), "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "--quick" in out and "m-sweep" in out


def test_bench_plan_covers_the_cases():
    import argparse

    import bench_forward

    args = argparse.Namespace(size="1024x8192x8192", quick=False, no_compile=False, modes=list(bench_forward.MODES),
                              cases=list(bench_forward.CASES))
    todo = bench_forward.plan(args)
    cases = {t[0] for t in todo}
    assert cases == set(bench_forward.CASES)
    assert {t[4] for t in todo if t[0] == "headline"} == {"fp32", "tf32", "bf16", "fp16"}
    assert sorted({t[1] for t in todo if t[0] == "m-sweep"}) == [256, 1024, 4096, 16384, 65536]
    assert sorted({t[2] for t in todo if t[0] == "n-sweep"}) == [512, 2048, 8192, 32768, 131072]
    assert all(t[6] == ("default", "max-autotune") for t in todo if t[0] == "headline")
    args.quick, args.no_compile = True, True
    assert all(t[6] == () for t in bench_forward.plan(args))


def test_resume_skips_exactly_the_measured_cases():
    import argparse

    import bench_forward

    args = argparse.Namespace(size="1024x8192x8192", quick=True, no_compile=True, modes=["bf16", "tf32"],
                              cases=["headline", "eval"])
    todo = bench_forward.plan(args)
    done = {bench_forward.case_key(r) for r in json.load(open(RESULT))["records"]}
    left = [t for t in todo if bench_forward.case_key(t) not in done]
    # that run measured headline + eval in bf16 and tf32: nothing left of this plan
    assert left == []
    args.cases = ["headline", "small-k"]
    left = [t for t in bench_forward.plan(args) if bench_forward.case_key(t) not in done]
    assert {t[0] for t in left} == {"small-k"} and len(left) == 2


def test_ncu_summary_of_the_generic_path():
    report = os.path.join(BENCH, "results", "ncu-h200-2026-11-29-bf16-generic.txt")
    kernels = ncu_summary.parse(open(report).read())
    names = [ncu_summary.short_name(k) for k, _ in kernels]
    assert names == ["bias_rows_kernel", "cuBLAS GEMM", "column_partials_kernel", "finalize_kernel",
                     "softmax_rows_in_registers"]
    table = ncu_summary.summarize(kernels, 1024, 8192, 8192, "bf16")
    gemm_row = next(line for line in table.splitlines() if line.startswith("| cuBLAS GEMM"))
    assert "TFLOP/s" in gemm_row
