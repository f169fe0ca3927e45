"""The demo CLI (python -m gemm_bn_softmax), in-process: bad arguments end in one argparse error
(exit code 2, a message on stderr, no traceback); a tiny CPU run succeeds."""
import pytest
import torch

import gemm_bn_softmax
from gemm_bn_softmax.__main__ import main


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_version(capsys):
    code, out, _ = run_cli(["--version"], capsys)
    assert code == 0
    assert gemm_bn_softmax.__version__ in out


@pytest.mark.parametrize("args, message", [
    (["--iters", "0"], "--iters: must be >= 1"),
    (["--iters", "-3"], "--iters: must be >= 1"),
    (["--iters", "many"], "--iters: must be a positive integer"),
    (["--size", "1x8x8", "--device", "cpu"], "a batch of 1 in training mode cannot compute batch statistics"),
    (["--size", "8x8"], "--size: must look like MxNxK"),
    (["--size", "8x8x8x8"], "--size: must look like MxNxK"),
    (["--size", "axbxc"], "--size: must look like MxNxK"),
    (["--size", "8x8x"], "--size: must look like MxNxK"),
    (["--size", "0x8x8"], "--size: every dimension must be >= 1"),
    (["--size=-2x8x8"], "--size: every dimension must be >= 1"),
    (["--size", "1000000x1000000x1000000", "--device", "cpu"], "use a smaller --size"),
    (["--seed", str(2**64)], "--seed: must be in"),
    (["--dtype", "int8"], "--dtype: invalid choice"),
    (["--device", "tpu"], "--device: invalid choice"),
    (["--bogus"], "unrecognized arguments"),
])
def test_bad_arguments(args, message, capsys):
    code, _, err = run_cli(args, capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_cuda_without_gpu(capsys):
    code, _, err = run_cli(["--device", "cuda"], capsys)
    assert code == 2
    assert "torch.cuda.is_available() is False" in err


def test_batch_of_one_in_eval_mode_runs(capsys):
    assert main(["--size", "1x8x8", "--eval", "--iters", "1", "--device", "cpu"]) == 0
    assert "eval" in capsys.readouterr().out


def test_tiny_cpu_run(capsys):
    assert main(["--size", "8x16x16", "--iters", "1", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "M=8 N=16 K=16" in out
    assert "fused" in out and "eager" in out and "speedup vs eager" in out
    assert "note: the CPU path is for correctness" in out  # says why a CPU run is slower than eager
