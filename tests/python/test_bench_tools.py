"""The benchmark tooling that needs no GPU: results -> markdown/plots, ncu report -> summary."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT
BENCH = os.path.join(ROOT, "bench")

import ab_rounds  # noqa: E402
import ncu_summary  # noqa: E402
import pipeline_breakdown  # noqa: E402
import plot_results  # noqa: E402
import round_positions  # noqa: E402
import train_step_breakdown  # noqa: E402

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
    # 3xtf32: the GEMM against the useful fp32 rate (a third of TF32's ceiling)
    assert "% of 143 |" in ncu_summary.summarize(kernels, 1024, 8192, 8192, "3xtf32")


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
    assert cases == set(bench_forward.CASES) - {"train"} | set(bench_forward.TRAIN_CASES)
    assert {t[4] for t in todo if t[0] == "headline"} == {"fp32", "tf32", "3xtf32", "bf16", "fp16"}
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
    assert {t[0] for t in left} == {"small-k"} and len(left) == 4  # K = 64 and 128, bf16 and tf32


def test_results_name_the_tree_they_measured(tmp_path):
    import bench_forward

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=tmp_path,
                       check=True, capture_output=True)

    assert bench_forward.tree_revision(str(tmp_path)) == "unknown"  # not a repository
    git("init", "-q")
    (tmp_path / "kernel.cu").write_text("one\n")
    git("add", "kernel.cu")
    git("commit", "-q", "-m", "first")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, capture_output=True, text=True,
                          check=True).stdout.strip()
    assert bench_forward.tree_revision(str(tmp_path)) == head
    (tmp_path / "notes.txt").write_text("untracked files do not count\n")
    assert bench_forward.tree_revision(str(tmp_path)) == head
    # a tracked file that differs from HEAD (as on a GPU machine whose .git is older than its files)
    (tmp_path / "kernel.cu").write_text("two\n")
    assert bench_forward.tree_revision(str(tmp_path)) == head + "+changes"


def test_ncu_summary_of_the_generic_path():
    report = os.path.join(BENCH, "results", "ncu-h200-2026-11-29-bf16-generic.txt")
    kernels = ncu_summary.parse(open(report).read())
    names = [ncu_summary.short_name(k) for k, _ in kernels]
    assert names == ["bias_rows_kernel", "cuBLAS GEMM", "column_partials_kernel", "finalize_kernel",
                     "softmax_rows_in_registers"]
    table = ncu_summary.summarize(kernels, 1024, 8192, 8192, "bf16")
    gemm_row = next(line for line in table.splitlines() if line.startswith("| cuBLAS GEMM"))
    assert "TFLOP/s" in gemm_row


def plan_args(**overrides):
    import argparse

    import bench_forward

    args = dict(size="1024x8192x8192", quick=False, no_compile=False, modes=list(bench_forward.TRAIN_MODES),
                cases=list(bench_forward.CASES))
    return argparse.Namespace(**{**args, **overrides})


def test_bench_plan_train_cases():
    import bench_forward

    todo = bench_forward.plan(plan_args())
    train = [t for t in todo if t[0] in bench_forward.TRAIN_CASES]
    assert "autocast-bf16" not in {t[4] for t in todo if t[0] not in bench_forward.TRAIN_CASES}
    headline = [t for t in train if t[0] == "train-step" and t[1:4] == (1024, 8192, 8192)]
    assert [t[4] for t in headline] == ["fp32", "tf32", "3xtf32", "bf16", "fp16", "autocast-bf16"]
    sgd = [t for t in train if t[0] == "train-step-sgd"]
    assert {t[4] for t in sgd} == {"bf16", "autocast-bf16"} and all(t[1:4] == (1024, 8192, 8192) for t in sgd)
    for mode in ("bf16", "tf32"):  # the M sweep, whose M = 1024 is the headline record
        assert sorted(t[1] for t in train if t[0] == "train-step" and t[4] == mode) == [256, 1024, 4096, 16384]
    assert {t[4] for t in train if t[0] == "train-step" and t[1] != 1024} == {"bf16", "tf32"}
    assert all(t[2:4] == (8192, 8192) and t[5] and t[6] == ("default",) for t in train)
    keys = [bench_forward.case_key(t) for t in todo]
    assert len(set(keys)) == len(keys)

    quick = bench_forward.plan(plan_args(quick=True, cases=["train"]))
    sweep = [t for t in quick if t[0] == "train-step" and t[1] != 1024]
    assert sorted({t[1] for t in sweep}) == [256, 4096] and all(t[6] == () for t in sweep)
    assert all(t[6] == ("default",) for t in quick if t not in sweep)  # the headline keeps its compile peer
    assert all(t[6] == () for t in bench_forward.plan(plan_args(no_compile=True, cases=["train"])))


def test_forward_cases_skip_train_only_modes():
    import bench_forward

    todo = bench_forward.plan(plan_args(modes=["autocast-bf16"]))
    assert {t[0] for t in todo} == set(bench_forward.TRAIN_CASES)
    assert {t[4] for t in todo} == {"autocast-bf16"}
    todo = bench_forward.plan(plan_args(modes=["autocast-bf16", "fp16"]))
    assert {t[4] for t in todo if t[0] == "m-sweep"} == {"fp16"}


def test_resume_keys_tell_train_records_apart():
    import bench_forward

    todo = bench_forward.plan(plan_args(cases=["headline", "train"], modes=["bf16", "autocast-bf16"]))
    measured = {"case": "train-step", "M": 1024, "N": 8192, "K": 8192, "mode": "bf16", "impl": "fused",
                "training": True, "ms": 1.0}
    left = [t for t in todo if bench_forward.case_key(t) != bench_forward.case_key(measured)]
    assert len(left) == len(todo) - 1
    assert ("train-step-sgd", 1024, 8192, 8192, "bf16", True) in {bench_forward.case_key(t) for t in left}
    assert ("headline", 1024, 8192, 8192, "bf16", True) in {bench_forward.case_key(t) for t in left}


def train_record(case, mode, impl, ms, m=1024, **extra):
    return {"case": case, "M": m, "N": 8192, "K": 8192, "mode": mode, "impl": impl, "training": True, "ms": ms,
            "ms_min": ms * 0.9, "ms_max": ms * 1.1, "tflops": 6 * m * 8192 * 8192 / (ms * 1e-3) / 1e12,
            "peak_mib": 100.0, "large_allocs": 6, "rel_err": 1e-3, "out_dtype": "bfloat16",
            "grad_err": {"x": 2e-3, "weight": 3e-3, "gamma": 1e-3, "beta": 1e-3, "scale": 1e-3,
                         "bias_abs": 1e-6, "bias_abs_ref64": 1e-15}, **extra}


TRAIN_RECORDS = [
    train_record("train-step", "bf16", "fused", 0.60, kernels=[
        {"kernel": "_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalIN4cute", "calls_per_iter": 1.0,
         "us": 180.0},
        {"kernel": "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "calls_per_iter": 2.0, "us": 170.0},
        {"kernel": "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, "
                   "float, at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3ul> >(int, "
                   "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> >, "
                   "std::array<char*, 3ul>)", "calls_per_iter": 3.0, "us": 10.0},
        {"kernel": "fused::cuda::(anonymous namespace)::finalize_kernel(fused::ColumnStatsPartials, long)",
         "calls_per_iter": 1.0, "us": 6.0}]),
    train_record("train-step", "bf16", "eager", 0.90),
    train_record("train-step", "bf16", "compile", 0.62, ms_repeats=[0.60, 0.62, 0.66], ms_range=[0.60, 0.66],
                 compile_s=12.0, compile_s_repeats=[12.0, 3.0, 3.0]),
    train_record("train-step", "tf32", "fused", 1.20, m=256),
    train_record("train-step", "tf32", "eager", 1.80, m=256),
    train_record("train-step-sgd", "autocast-bf16", "fused", 0.80),
    train_record("train-step-sgd", "autocast-bf16", "eager", 1.00),
]


def test_markdown_of_train_records(tmp_path):
    import bench_forward

    assert plot_results.TRAIN_CASES == bench_forward.TRAIN_CASES
    data = {"device": "NVIDIA H200", "torch": "2.14.1", "cuda": "13.0", "git": "abc1234", "date": "2026-12-01",
            "command": "--cases train --profile", "complete": True, "records": TRAIN_RECORDS}
    path = tmp_path / "train.json"
    path.write_text(json.dumps(data))
    assert plot_results.main([str(path), "--no-plots"]) == 0
    md = (tmp_path / "train.md").read_text()
    assert "op path (auto)" not in md  # no forward records: no empty forward table
    rows = [line for line in md.splitlines() if line.startswith("| train-step")]
    assert len(rows) == 3
    headline = next(row for row in rows if "| bf16 |" in row)
    assert "| 0.600 | 0.900 | 0.620 (0.600–0.660) | 1.50× | 1.03× | - / - | - / - | 100 / 100 / 100 " \
           "| 2.0e-03 / 2.0e-03 | 3.0e-03 / 3.0e-03 |" in headline
    sgd = next(row for row in rows if row.startswith("| train-step-sgd"))
    assert "| - | 1.25× | - |" in sgd  # no compile peer
    # the per-kernel table of the profiled fused step: 180 + 340 us of GEMMs, 30 + 6 us of the rest
    assert "| sm90 GEMM + column statistics | 1 | 180.0 | 32.4% |" in md
    assert "| cuBLAS GEMM nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT | 2 | 340.0 |" in md
    assert "| vectorized_elementwise_kernel (MulFunctor) | 3 | 30.0 |" in md
    assert "| **all GEMMs** | | 520.0 | 93.5% |" in md and "| **total** | | 556.0 | 100% |" in md

    text = bench_forward.table(TRAIN_RECORDS)
    fused = next(line for line in text.splitlines() if line.startswith("train-step") and " bf16 " in line
                 and " fused " in line)
    assert "1.50" in fused and "1.03" in fused


def test_forward_markdown_unchanged_by_train_records():
    data = json.load(open(RESULT))
    forward_only = plot_results.markdown(data)
    data["records"] = data["records"] + TRAIN_RECORDS
    with_train = plot_results.markdown(data)
    assert with_train.startswith(forward_only + "\n\nTraining step")


def test_train_step_and_its_float64_check_on_cpu():
    """The step and error helpers the train case times (device-agnostic; here on the CPU, tiny shape)."""
    import torch

    import bench_forward
    import gemm_bn_softmax as gbs
    from gemm_bn_softmax.reference import ReferenceModel

    m, n, k = 64, 32, 48
    init_state = ReferenceModel(k, n).state_dict()
    x = torch.rand(m, k).requires_grad_()
    g = torch.randn(m, n)
    want_out, want_grads = bench_forward.float64_step(init_state, x, g)
    assert want_out.dtype == torch.float64 and want_grads["x"].shape == (m, k)
    for make in (lambda: ReferenceModel(k, n), lambda: gbs.FusedGemmBNSoftmax(k, n, precision="highest")):
        model = bench_forward.fresh_model(make, init_state, torch.float32, "cpu")
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        weight = model.gemm.weight.detach().clone()
        out = bench_forward.train_step(model, x, g, optimizer=optimizer)
        assert bench_forward.rel_err(out.detach(), want_out) < 1e-5
        errors = bench_forward.grad_errors(bench_forward.grads_of(model, x), want_grads)
        assert all(errors[name] < 1e-4 for name in ("x", "weight", "gamma", "beta", "scale"))
        assert errors["bias_abs"] < 1e-4 and errors["bias_abs_ref64"] < 1e-10  # ~0 under batch statistics
        assert not torch.equal(model.gemm.weight, weight)  # the SGD step ran
        assert int(model.bn.num_batches_tracked) == 1
    # AMP: forward under autocast, so the eager Linear runs in bf16 (CPU autocast here, CUDA in the bench)
    model = bench_forward.fresh_model(lambda: ReferenceModel(k, n), init_state, torch.float32, "cpu")
    bench_forward.train_step(model, x, g.bfloat16(), autocast_dtype=torch.bfloat16)
    errors = bench_forward.grad_errors(bench_forward.grads_of(model, x), want_grads)
    assert 1e-4 < errors["weight"] < 5e-2 and x.grad.dtype == torch.float32


def test_distributed_benchmark_smoke_run_on_cpu_processes(tmp_path):
    """bench_distributed.py end to end on two gloo processes at a tiny size: every case and impl
    recorded, with world_size (the timings themselves mean nothing here)."""
    import bench_distributed

    out = tmp_path / "d.json"
    assert bench_distributed.main(["--device", "cpu", "--world", "2", "--size", "16x24x8", "--column-n", "40",
                                   "--iters", "2", "--mode", "fp32", "--profile", "--out", str(out)]) == 0
    data = json.load(open(out))
    got = {(r["case"], r["impl"]) for r in data["records"]}
    assert got == {("sync-forward", "fused"), ("sync-forward", "fused-1gpu"), ("sync-train-step", "fused"),
                   ("sync-train-step", "fused-1gpu"), ("column-forward", "fused"), ("column-forward", "fused-1gpu"),
                   ("column-train-step", "fused"), ("column-train-step", "fused-1gpu"),
                   ("sync-train-step-local-grads", "fused"), ("collectives", "all_gather-moments"),
                   ("collectives", "all_gather-moments-direct"), ("collectives", "all_reduce-grads")}
    assert all(r["world_size"] == 2 and r["ms"] > 0 for r in data["records"])


def test_distributed_benchmark_passes_ddp_options_to_every_ddp_wrapper(tmp_path):
    """--ddp NAME=VALUE reaches the DDP wrapper (its gradient_as_bucket_view attribute, on gloo
    processes) and every record names the options; a name DDP does not take, or a value that is not a
    bool or number, is refused before any process starts."""
    import bench_distributed

    assert bench_distributed.ddp_options(["gradient_as_bucket_view=True", "bucket_cap_mb=50",
                                          "broadcast_buffers=False"]) == {
        "gradient_as_bucket_view": True, "bucket_cap_mb": 50, "broadcast_buffers": False}
    for bad in (["no_such_option=1"], ["bucket_cap_mb"], ["bucket_cap_mb=lots"]):
        with pytest.raises(ValueError):
            bench_distributed.ddp_options(bad)
    with pytest.raises(SystemExit):
        bench_distributed.main(["--device", "cpu", "--ddp", "no_such_option=1"])
    out = tmp_path / "d.json"
    assert bench_distributed.main(["--device", "cpu", "--world", "2", "--size", "16x24x8", "--iters", "2",
                                   "--mode", "fp32", "--cases", "sync-train-step", "--ddp",
                                   "gradient_as_bucket_view=True", "--out", str(out)]) == 0
    records = json.load(open(out))["records"]
    assert {r["impl"] for r in records} == {"fused", "fused-1gpu"}
    assert all(r["ddp_options"] == {"gradient_as_bucket_view": True} for r in records)
    ddp_step = [r for r in records if r["case"] == "sync-train-step" and r["impl"] == "fused"]
    assert [r["ddp_applied"] for r in ddp_step] == [{"gradient_as_bucket_view": True}]


def test_narrow_y_emulation_loses_accuracy_where_columns_sit_far_from_zero():
    """bench/narrow_y_accuracy.py: y rounded to 16 bits is less accurate than fp32 y, by a little on
    the benchmark's data and by more than 10x when every column's mean is far from zero against its
    spread; the fp32-y error does not depend on the shift, nor does that of a 16-bit y stored less a shift
    per tile or per 32 rows."""
    import narrow_y_accuracy

    plain = narrow_y_accuracy.errors(64, 32, 256)
    shifted = narrow_y_accuracy.errors(64, 32, 256, bias_shift=10.0)
    for dt in ("bf16", "fp16"):
        assert plain[f"{dt}, fp32 y"] < plain[f"{dt}, {dt} y"] < 2 * plain[f"{dt}, fp32 y"]
        assert shifted[f"{dt}, {dt} y"] > 10 * shifted[f"{dt}, fp32 y"]
        assert shifted[f"{dt}, fp32 y"] == pytest.approx(plain[f"{dt}, fp32 y"], rel=1e-3)
        # y less a shift per tile or per 32 rows keeps y - mean: the far-from-zero means cost nothing
        for how in ("tile shift", "group shift"):
            assert shifted[f"{dt}, {dt} y - {how}"] == pytest.approx(plain[f"{dt}, {dt} y - {how}"], rel=0.05)
            assert shifted[f"{dt}, {dt} y - {how}"] < 2 * shifted[f"{dt}, fp32 y"]
    assert plain["bf16, fp32 y"] < 5e-3 and plain["fp16, fp32 y"] < 1e-3


def test_forward_table_compares_each_shape_with_its_own_peers():
    """A sweep case holds several shapes: "vs gemm" / "vs eager" divide by the peers of the same M, N, K."""
    import bench_forward

    def rec(m, impl, ms):
        return {"case": "m-sweep", "M": m, "N": 8192, "K": 8192, "mode": "bf16", "impl": impl, "ms": ms,
                "tflops": 1.0, "rel_err": None}

    text = bench_forward.forward_table([rec(256, "gemm", 0.05), rec(256, "eager", 0.12), rec(256, "sm90", 0.07),
                                        rec(4096, "gemm", 0.70), rec(4096, "eager", 1.05), rec(4096, "sm90", 0.84)])
    rows = {(line.split()[1], line.split()[5]): line.split() for line in text.splitlines()[1:]}
    assert float(rows[("256", "sm90")][8]) == pytest.approx(0.07 / 0.05, abs=1e-3)
    assert float(rows[("4096", "sm90")][8]) == pytest.approx(0.84 / 0.70, abs=1e-3)
    assert float(rows[("4096", "sm90")][9]) == pytest.approx(1.05 / 0.84, abs=1e-2)
    # GPU time alone (graph_ms), where measured, against the GEMM's own graph_ms; nan where absent.
    with_graph = [dict(rec(256, "gemm", 0.05), graph_ms=0.02), dict(rec(256, "sm90", 0.07), graph_ms=0.03),
                  rec(256, "eager", 0.12)]
    rows = {line.split()[5]: line.split() for line in bench_forward.forward_table(with_graph).splitlines()[1:]}
    assert float(rows["sm90"][11]) == pytest.approx(0.03) and float(rows["sm90"][12]) == pytest.approx(1.5)
    assert rows["eager"][11] == "nan" and rows["eager"][12] == "nan"


def test_compile_repeats_merge_into_median_and_range():
    """The torch.compile peers (forward and train) compiled afresh several times: one record whose ms is
    the median of the compiles' medians, with their range, and the forward table shows that range."""
    import bench_forward

    repeats = [({"ms": 0.30, "ms_min": 0.29, "ms_max": 0.33, "rel_err": 6e-3}, 41.0),
               ({"ms": 0.22, "ms_min": 0.21, "ms_max": 0.24, "rel_err": 6e-3}, 12.0),
               ({"ms": 0.25, "ms_min": 0.24, "ms_max": 0.26, "rel_err": 6e-3}, 13.0)]
    rec = bench_forward.merged_compile_repeats(repeats)
    assert rec["ms"] == 0.25 and rec["ms_range"] == [0.22, 0.30] and rec["ms_repeats"] == [0.30, 0.22, 0.25]
    assert (rec["ms_min"], rec["ms_max"]) == (0.21, 0.33)
    assert rec["compile_s"] == 41.0 and rec["compile_s_repeats"] == [41.0, 12.0, 13.0] and rec["rel_err"] == 6e-3

    def fwd(impl, ms, **extra):
        return {"case": "headline", "M": 1024, "N": 8192, "K": 8192, "mode": "bf16", "impl": impl, "ms": ms,
                "tflops": 1.0, "rel_err": None, **extra}

    records = [fwd("sm90", 0.20), fwd("eager", 0.27), fwd("gemm", 0.16), fwd("compile", 0.25, **{
        k: rec[k] for k in ("ms_range", "ms_repeats")})]
    row = next(line for line in plot_results.markdown({"records": records, "device": "d", "torch": "t", "cuda": "c",
                                                       "git": "g", "date": "x"}).splitlines()
               if line.startswith("| headline"))
    assert "| 1.25× (1.10–1.50) |" in row
    once = [r if r["impl"] != "compile" else fwd("compile", 0.25) for r in records]  # one compile: no range
    row = next(line for line in plot_results.markdown({"records": once, "device": "d", "torch": "t", "cuda": "c",
                                                       "git": "g", "date": "x"}).splitlines()
               if line.startswith("| headline"))
    assert "| 1.25× |" in row
    # op / GEMM on the GPU alone, where both carry graph_ms; "-" where not
    assert "| 1.250 | - |" in row
    timed = [dict(r, graph_ms=0.15) if r["impl"] == "sm90" else dict(r, graph_ms=0.12) if r["impl"] == "gemm" else r
             for r in once]
    row = next(line for line in plot_results.markdown({"records": timed, "device": "d", "torch": "t", "cuda": "c",
                                                       "git": "g", "date": "x"}).splitlines()
               if line.startswith("| headline"))
    assert "| 1.250 | 1.250 |" in row


def test_bench_cli_refuses_zero_compile_repeats():
    run = subprocess.run([sys.executable, os.path.join(BENCH, "bench_forward.py"), "--compile-repeats", "0"],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "--compile-repeats must be at least 1" in run.stderr


def test_pipeline_breakdown_groups_the_forward_kernels():
    # Names as torch.profiler reports them on the H200 (the GEMM's shortened).
    names = {
        "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<...> >(...)": "gemm",
        "fused::cuda::(anonymous namespace)::finalize_kernel(fused::ColumnStatsPartials, ...)": "finalize",
        "void fused::cuda::(anonymous namespace)::softmax_rows_in_registers<512, 4>(...)": "softmax",
        "Memset (Device)": "Memset (Device)",
        "nvjet_sm90_tss_64x64_64x13_2x1_v_bz_bias": "gemm",  # cuBLAS's, on the generic path
        # the whole op in one kernel (sm90, small grids): not a GEMM, though its name holds cutlass's types
        "void fused::sm90::detail::one_kernel_forward_kernel<fused::sm90::detail::OneKernelForward<"
        "cutlass::bfloat16_t> >(...)": "one kernel",
    }
    for name, group in names.items():
        assert pipeline_breakdown.kernel_group(name) == group
        assert ncu_summary.is_gemm_kernel(name) == (group == "gemm")
    run = subprocess.run([sys.executable, os.path.join(BENCH, "pipeline_breakdown.py"), "--help"],
                         capture_output=True, text=True)
    assert run.returncode == 0 and "FUSED_DISABLE_PDL" in run.stdout
    run = subprocess.run([sys.executable, os.path.join(BENCH, "pipeline_breakdown.py"), "--cases", "fp16:8x8x8"],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "expected bf16:MxNxK, tf32:MxNxK or 3xtf32:MxNxK" in run.stderr


def test_pipeline_critical_path_charges_each_interval_once():
    calls = pipeline_breakdown.CALLS
    # Two replays of `calls` calls, each call gemm -> finalize -> softmax. Replay r starts at 10000 r.
    # gemm starts 5 us before the previous softmax ends (PDL: it waits), so its own part is 90 of its 95;
    # finalize starts 1 us after the gemm ends (a gap) and runs 4; softmax starts 2 us before finalize
    # ends and runs until 20 after it.
    kernels = []
    for r in range(2):
        t = 10000.0 * r
        for c in range(calls):
            g_start = t - 5 if c else t
            kernels.append(("gemm", g_start, t + 90))
            kernels.append(("finalize", t + 91, t + 95))
            kernels.append(("softmax", t + 93, t + 115))
            t += 115
    shuffled = kernels[1::2] + kernels[0::2]  # the profiler's order is not the issue order
    own, gap, span = pipeline_breakdown.critical_path(shuffled, replays=2)
    # (the first gemm of a replay starts at the replay's start, so it too counts 90)
    assert own == pytest.approx({"gemm": 90.0, "finalize": 4.0, "softmax": 20.0})
    assert gap == pytest.approx(1.0)
    assert span == pytest.approx(115.0)
    assert sum(own.values()) + gap == pytest.approx(span)
    with pytest.raises(ValueError, match="do not split into 2 replays"):
        pipeline_breakdown.critical_path(kernels[:-1], replays=2)
    line = pipeline_breakdown.path_line({"own": own, "gap": gap, "span": span})
    assert line == "path finalize 4.0 gemm 90.0 softmax 20.0 gaps 1.0 | span 115.0 us per call"


def test_train_step_breakdown_cases_and_lines():
    # the case rule is pipeline_breakdown's, shared by both scripts
    assert pipeline_breakdown.parse_case("bf16:1024x8192x8192") == ("bf16", 1024, 8192, 8192)
    assert pipeline_breakdown.parse_case("tf32:8x16x32") == ("tf32", 8, 16, 32)
    assert pipeline_breakdown.parse_case("3xtf32:8x16x32") == ("3xtf32", 8, 16, 32)
    for bad in ("fp16:8x8x8", "bf16:8x8", "bf16:0x8x8", "bf16:8xax8", "fp32:8x8x8"):
        with pytest.raises(ValueError, match="expected bf16:MxNxK, tf32:MxNxK or 3xtf32:MxNxK"):
            pipeline_breakdown.parse_case(bad)
    # the backward's kernel names as torch.profiler reports them
    name = "void fused::cuda::backward_steps::(anonymous namespace)::dy_kernel<true, __nv_bfloat16, __nv_bfloat16>(...)"
    assert train_step_breakdown.step_group(name) == "dy_kernel"
    assert train_step_breakdown.step_group("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT") == "gemm"
    # its step line is one ab_rounds reads
    line = "pdl=1 step bf16 1024x8192x8192: op 667.5 us (660.1-670.2; again 668.0)"
    assert ab_rounds.values_of(line, ab_rounds.PIPELINE_OP) == {"step bf16 1024x8192x8192": 667.5}
    # per step: a replay holds one step
    own, gap, span = pipeline_breakdown.critical_path([("a", 0.0, 5.0), ("b", 6.0, 9.0)], 1, calls_per_replay=1)
    assert own == {"a": 5.0, "b": 3.0} and gap == 1.0 and span == 9.0
    # --kernels: the first replay's kernels in launch order, times from its first kernel
    kernels = [("dy_kernel<true>", 30.0, 34.0), ("nvjet_tst", 10.0, 20.0), ("softmax_rows", 20.5, 29.0),
               ("nvjet_tst", 110.0, 120.0), ("softmax_rows", 120.5, 129.0), ("dy_kernel<true>", 130.0, 134.0)]
    assert train_step_breakdown.kernel_listing(kernels, 2) == [
        "      0.0     10.0  gemm: nvjet_tst", "     10.5      8.5  softmax: softmax_rows",
        "     20.0      4.0  dy_kernel: dy_kernel<true>"]
    with pytest.raises(ValueError, match="do not split into 4 replays"):
        train_step_breakdown.kernel_listing(kernels, 4)
    run = subprocess.run([sys.executable, os.path.join(BENCH, "train_step_breakdown.py"), "--cases", "fp16:8x8x8"],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "expected bf16:MxNxK, tf32:MxNxK or 3xtf32:MxNxK" in run.stderr


# A stand-in for bench/pipeline_breakdown.py: prints op lines whose values depend on AB_OP (the
# setting), AB_ROUND_FILE (a counter of runs, so the rounds differ) and AB_MIXED (one key whose order
# flips between rounds).
FAKE_PIPELINE = """
import os
path = os.environ["AB_ROUND_FILE"]
n = int(open(path).read()) if os.path.exists(path) else 0
open(path, "w").write(str(n + 1))
base = 100.0 + n
op = base - (2.0 if os.environ.get("AB_OP") == "fast" else 0.0)
print(f"pdl=1 bf16 1024x8192x8192: op {op:.1f} us (1-2; again 3) | kernels x")
mixed = base + (1.0 if (os.environ.get("AB_OP") == "fast") == (n % 4 < 2) else -1.0)
print(f"pdl=1 tf32 1024x8192x8192: op {mixed:.1f} us (1-2; again 3) | kernels x")
print("a line the pattern ignores")
"""


def test_ab_rounds_alternates_settings_and_reports_medians(tmp_path):
    fake = tmp_path / "fake_pipeline.py"
    fake.write_text(FAKE_PIPELINE)
    out = tmp_path / "ab.json"
    env = {**os.environ, "AB_ROUND_FILE": str(tmp_path / "count")}
    run = subprocess.run([sys.executable, os.path.join(BENCH, "ab_rounds.py"), "--rounds", "3",
                          "--setting", "slow=AB_OP=slow", "--setting", "fast=AB_OP=fast", "--out", str(out),
                          "--log", str(tmp_path / "logs"), "--", sys.executable, str(fake)],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    # --log keeps each run's whole output, the lines the pattern ignores included
    assert sorted(os.listdir(tmp_path / "logs")) == [f"round{r}-{label}.log" for r in (1, 2, 3)
                                                     for label in ("fast", "slow")]
    assert "a line the pattern ignores" in (tmp_path / "logs" / "round2-fast.log").read_text()
    record = json.loads(out.read_text())
    # Runs 0..5 alternate slow, fast: slow gets runs 0, 2, 4 and fast 1, 3, 5.
    head = record["table"]["bf16 1024x8192x8192"]
    assert head["rounds"] == {"slow": [100.0, 102.0, 104.0], "fast": [99.0, 101.0, 103.0]}
    assert head["median"] == {"slow": 102.0, "fast": 101.0}
    assert head["same_order_every_round"] == {"fast": True}
    assert record["table"]["tf32 1024x8192x8192"]["same_order_every_round"] == {"fast": False}
    assert "every round" in run.stdout and "mixed" in run.stdout


def test_ab_rounds_stopped_by_a_time_limit_keeps_the_rounds_so_far(tmp_path):
    # The fifth run (round 3, first setting) hangs; SIGTERM, as `timeout` sends it, must still give the
    # table and the JSON of rounds 1-2 and of round 3's finished runs (none), not nothing.
    fake = tmp_path / "fake_pipeline.py"
    fake.write_text(FAKE_PIPELINE.replace('print("a line the pattern ignores")',
                                          'print("a line the pattern ignores")\nimport time\n'
                                          'time.sleep(60) if n == 4 else None'))
    out = tmp_path / "ab.json"
    env = {**os.environ, "AB_ROUND_FILE": str(tmp_path / "count")}
    proc = subprocess.Popen([sys.executable, os.path.join(BENCH, "ab_rounds.py"), "--rounds", "3",
                             "--setting", "slow=AB_OP=slow", "--setting", "fast=AB_OP=fast", "--out", str(out),
                             "--", sys.executable, str(fake)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    deadline = time.monotonic() + 60
    while not (tmp_path / "count").exists() or (tmp_path / "count").read_text() != "5":
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    time.sleep(0.3)  # the fifth run is in its sleep now
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "stopped in round 3 of 3" in stdout
    record = json.loads(out.read_text())
    assert record["stopped"] == "stopped in round 3 of 3"
    head = record["table"]["bf16 1024x8192x8192"]
    assert head["rounds"] == {"slow": [100.0, 102.0], "fast": [99.0, 101.0]}
    assert head["same_order_every_round"] == {"fast": True}


def test_ab_rounds_refuses_what_it_cannot_compare(tmp_path):
    script = os.path.join(BENCH, "ab_rounds.py")
    one = subprocess.run([sys.executable, script, "--setting", "a=X=1", "--", "true"], capture_output=True, text=True)
    assert one.returncode == 2 and "two or more --setting" in one.stderr
    bad = subprocess.run([sys.executable, script, "--setting", "a", "--setting", "b=X=1", "--", "true"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "expected LABEL=VAR=VALUE" in bad.stderr
    silent = subprocess.run([sys.executable, script, "--setting", "a=X=1", "--setting", "b=X=2", "--rounds", "1",
                             "--", sys.executable, "-c", "print('nothing to parse')"], capture_output=True, text=True)
    assert silent.returncode != 0 and "no line matched" in silent.stderr
    failing = subprocess.run([sys.executable, script, "--setting", "a=X=1", "--setting", "b=X=2", "--",
                              sys.executable, "-c", "raise SystemExit(3)"], capture_output=True, text=True)
    assert failing.returncode != 0 and "the command failed (rc 3)" in failing.stderr
    assert ab_rounds.parse_setting("x=A=1,B=2") == ("x", {"A": "1", "B": "2"})


def test_ab_rounds_default_pattern_reads_pipeline_breakdown_lines():
    # Lines as bench/pipeline_breakdown.py printed them on the H200 (a committed raw record).
    with open(os.path.join(BENCH, "results", "h200-x2-2026-11-30-forward-pipeline-9746710.txt")) as f:
        found = ab_rounds.values_of(f.read(), ab_rounds.PIPELINE_OP)
    assert found == {"bf16 1024x8192x8192": 232.6, "tf32 1024x8192x8192": 416.7, "bf16 4096x8192x8192": 936.1}
    # With --paths, each line names its path too.
    with open(os.path.join(BENCH, "results", "h200-2026-12-01-splitk-pdl-off-d5c1172.txt")) as f:
        found = ab_rounds.values_of(f.read(), ab_rounds.PIPELINE_OP)
    assert found["bf16 1024x512x4096 sm90"] == 31.4 and found["tf32 2048x512x8192 generic"] == 79.3
    assert len(found) == 8


def test_timing_rounds_merge_to_the_median_of_the_rounds():
    import bench_forward

    rounds = [{"ms": 2.0, "ms_min": 1.9, "ms_max": 2.6, "graph_ms": 1.8},
              {"ms": 1.0, "ms_min": 0.8, "ms_max": 1.2, "graph_ms": None},  # a failed capture
              {"ms": 3.0, "ms_min": 2.9, "ms_max": 3.1, "graph_ms": 2.2}]
    rec = bench_forward.merged_rounds(rounds)
    assert rec["ms"] == 2.0 and rec["ms_rounds"] == [2.0, 1.0, 3.0]
    assert (rec["ms_min"], rec["ms_max"]) == (0.8, 3.1)
    assert rec["graph_ms"] == 2.0 and rec["graph_ms_rounds"] == [1.8, None, 2.2]
    # impls timed without graphs (1 ms and slower) carry no graph fields
    assert "graph_ms" not in bench_forward.merged_rounds([{"ms": 4.0, "ms_min": 3.9, "ms_max": 4.2}])


def test_partials_rounding_emulation_orders_the_shift_choices():
    """bench/partials_rounding.py: the statistics epilogue's reduction order in float32. Typical columns
    are within a few roundings of M2 whatever the shift; a column whose variance sits in row 0 is what
    separates them: the median of three rows keeps it, the warp's first row as the shift loses about
    ten times more, one shift for the whole tile more still."""
    import numpy as np

    import partials_rounding as pr

    rng = np.random.default_rng(7)

    def worst(scheme, make, columns=20):
        return max(pr.m2_rel_error(scheme, make().astype(np.float32)) for _ in range(columns))

    def typical():
        return rng.uniform(-1, 1, 256)

    def outlier():
        return np.r_[1000 * rng.uniform(0.5, 1), rng.uniform(-1, 1, 255)]

    assert worst(pr.warp_shift, typical) < 1e-6
    assert worst(pr.per_thread_chan, typical) < 1e-6
    adopted = worst(pr.warp_shift, outlier)
    first_row = worst(lambda c: pr.warp_shift(c, True), outlier)
    assert adopted < 1e-6
    assert first_row > 5 * adopted
    assert worst(pr.one_shift, outlier) > 3 * first_row


def test_alternating_rounds_reverse_the_order_and_spread_the_compiles():
    """The timing order of the forward and train cases: the impls in order, then reversed, one compile job
    after each round (more jobs than rounds run after the last); an impl that raises is reported each
    round and the others go on."""
    import bench_forward

    calls, failures = [], []

    def timed(name, fn):
        calls.append(name)
        fn()
        return {"ms": len(calls)}

    def compile_one(name, factory):
        calls.append(f"{name} {factory}")
        return factory

    def broken():
        raise RuntimeError("no kernel")

    plain = {"fused": lambda: None, "broken": broken, "eager": lambda: None}
    timings, compiled = bench_forward.alternating_rounds(
        plain, timed, 3, [("compile", 1), ("compile", 2), ("compile", 3), ("compile", 4)], compile_one,
        lambda name, exc: failures.append((name, str(exc))))
    assert calls == ["fused", "broken", "eager", "compile 1", "eager", "broken", "fused", "compile 2",
                     "fused", "broken", "eager", "compile 3", "compile 4"]
    assert [t["ms"] for t in timings["fused"]] == [1, 7, 9]
    assert [t["ms"] for t in timings["eager"]] == [3, 5, 11]
    assert timings["broken"] == [] and failures == [("broken", "no kernel")] * 3
    assert compiled == {"compile": [1, 2, 3, 4]}


def test_readme_table_puts_the_module_against_the_compiles_range():
    """plot_results --readme: one row per shape and mode with the op, the module, the peers and the
    compiles' range; "module vs compile" is faster below the range, slower above it, inside within it."""
    def fwd(m, impl, ms, **extra):
        return {"case": "m-sweep", "M": m, "N": 8192, "K": 8192, "mode": "bf16", "impl": impl, "ms": ms,
                "tflops": 1.0, "rel_err": None, **extra}

    comp = {"ms_range": [0.24, 0.26], "ms_repeats": [0.24, 0.26]}
    records = []
    for m, module_ms in ((256, 0.23), (1024, 0.25), (4096, 0.27)):
        records += [fwd(m, "sm90", 0.20, graph_ms=0.15), fwd(m, "module", module_ms), fwd(m, "gemm", 0.16, graph_ms=0.12),
                    fwd(m, "eager", 0.27), fwd(m, "compile", 0.25, **comp)]
    records.append({"case": "train-step", "M": 1024, "N": 8192, "K": 8192, "mode": "bf16", "impl": "fused", "ms": 0.7})
    lines = plot_results.readme_table(records)
    assert len(lines) == 2 + 3  # header, rule, one row per shape; the train record is not a forward row
    assert lines[2] == ("| 256×8192×8192 | bf16 | 0.200 | 0.230 | 0.160 | 0.270 | 0.250 (0.240–0.260) | 1.25 | 1.25 "
                        "| faster |")
    assert lines[3].endswith("| inside |") and lines[4].endswith("| slower |")
    once = [dict(r, ms_range=None, ms_repeats=[0.25]) if r["impl"] == "compile" else r for r in records]
    assert "| 0.250 |" in plot_results.readme_table(once)[2]  # one compile: its median, no range
    assert plot_results.readme_table(once)[3].endswith("| inside |")  # 0.25 against 0.25 alone


def _rounds_json(path, points):
    """A bench_forward-like JSON: points {(M, impl): ms_rounds}."""
    records = [{"case": "m-sweep", "M": m, "N": 8192, "K": 8192, "mode": "bf16", "impl": impl, "ms": min(ms),
                "ms_rounds": ms} for (m, impl), ms in points.items()]
    path.write_text(json.dumps({"records": records}))
    return str(path)


def test_round_positions_finds_the_slow_rounds_two_runs_share(tmp_path, capsys):
    # 'module' slow in rounds 3-4 in both runs (a position effect), 'gemm' in different rounds (noise),
    # 'sm90' never slow; a point only one run timed is left out.
    a = _rounds_json(tmp_path / "a.json", {(4096, "module"): [1.66, 1.67, 1.86, 1.80],
                                           (4096, "gemm"): [1.60, 1.52, 1.52, 1.53],
                                           (4096, "sm90"): [1.66, 1.67, 1.67, 1.66],
                                           (256, "module"): [0.10, 0.20, 0.10, 0.10]})
    b = _rounds_json(tmp_path / "b.json", {(4096, "module"): [1.66, 1.65, 1.80, 1.82],
                                           (4096, "gemm"): [1.53, 1.53, 1.53, 1.70],
                                           (4096, "sm90"): [1.66, 1.63, 1.70, 1.65]})
    rows = round_positions.compare(round_positions.rounds_of(a), round_positions.rounds_of(b), 0.05)
    verdicts = {key[4]: verdict for key, _, _, verdict in rows}
    assert verdicts == {"module": "same rounds", "gemm": ""}
    module = next(row for row in rows if row[0][4] == "module")
    assert module[1][0] == 0.0 and abs(module[1][2] - (1.86 / 1.66 - 1)) < 1e-12
    # Shuffled, b's module rounds put both slow ones on rounds 3-4 in 1 of 6 shuffles, and its gemm's slow
    # round lands on a's (round 1) in 1 of 4: 5/12 "same rounds" per shuffle on average.
    counts = round_positions.shuffled_same_rounds(round_positions.rounds_of(a), round_positions.rounds_of(b),
                                                  0.05, 600)
    assert 0.33 < sum(counts) / len(counts) < 0.50 and set(counts) <= {0, 1, 2}
    round_positions.main([a, b, "--shuffles", "50"])
    out = capsys.readouterr().out
    assert "2 impl-points with a slow round (> 5%); the same rounds in both runs at 1" in out
    assert "shuffled 50 times" in out


def test_tensor_core_model_sums_exactly_what_fits():
    import numpy as np

    import tensor_core_accumulation_model as model

    add = model.TensorCoreSum(26)
    acc = np.array([3.0, -5.0])
    products = np.array([[1.0, 2.0, 4.0, 8.0], [0.5, 0.25, -1.0, 16.0]])
    assert list(add(acc, products)) == [18.0, 10.75]
    # an fp32 value far below the largest term is dropped, toward zero
    assert add(np.array([2.0**30]), np.array([[1.0, -2.0**-10]]))[0] == 2.0**30


def test_tensor_core_model_reproduces_the_h200_figures():
    import numpy as np

    import tensor_core_accumulation_model as model

    rng = np.random.default_rng(0)
    one, exact = model.calibration(256, model.TensorCoreSum(26), 8, rng)
    assert 1.2e-5 < one < 2.8e-5  # the H200's TF32 GEMM over K = 8192: 1.9e-5
    assert 1.0e-6 < exact < 2.5e-6  # cuBLAS's SIMT fp32: 1.6e-6
    # the kernel's order against promoting every 64 K-elements (measured: 1.40e-7 against 3.2e-7)
    e = model.case_errors(64, 3, 512, model.TensorCoreSum(26), 8, rng)
    assert e["tile32"] < 0.7 * e["interleaved64"]
    assert e["tile32"] < 3 * e["exact fp32"]


def test_tensor_core_model_on_longer_promotion_intervals():
    """Why the kernel promotes every k-tile at every K: promoting every 4 k-tiles beats exact fp32 summed in
    K order at K = 8192, but not exact fp32 summed as 16 K ranges (cuBLAS's split-K form), which every k-tile
    does (N(0, 1) operands)."""
    import numpy as np

    import tensor_core_accumulation_model as model

    e = model.interval_errors(8192, 0, 128, model.TensorCoreSum(26), 8, np.random.default_rng(0))
    assert e[4] < 0.7 * e["exact fp32"]
    assert e["exact fp32, split K"] < 0.5 * e["exact fp32"]
    assert e[4] > 1.5 * e["exact fp32, split K"]
    assert e[1] < e["exact fp32, split K"]


def test_backward_precision_emulation_orders_its_variants():
    """bench/backward_precision.py: the kernels' arithmetic at large logits (the large-logit test's
    problem with beta ~ N(0, 10^2)). Dividing the recomputed rows by their sums cuts scale's error by
    more than 10x; float64 row sums, dz and column sums bring it below eager's fp32 error, and the
    exponent's offset in float64 too (the kernels for fp32 gradients) brings every gradient below
    eager's, where the fp32 map leaves beta's above it."""
    import backward_precision as bp
    errs = bp.run((256, 1000, 64), 10.0, 10.0)
    assert errs["before normalisation"]["scale"] > 10 * errs["fp32"]["scale"]
    assert errs["row sums and dz in float64"]["scale"] < errs["eager fp32"]["scale"] < errs["fp32"]["scale"]
    assert errs["fp32"]["beta"] > errs["eager fp32"]["beta"]
    for key in bp.GRADS:
        assert errs["wide"][key] < errs["eager fp32"][key] / 2, key