"""Demo CLI: runs the headline problem (Linear 8192 -> 8192, batch 1024, KernelBench L2/84) with the
fused op and with eager PyTorch, and prints time and error against a float64 reference.

    python -m gemm_bn_softmax                       # best device; 1024x8192x8192 on CUDA, smaller on CPU
    python -m gemm_bn_softmax --dtype bf16 --size 1024x8192x8192 --device cuda
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from . import FusedGemmBNSoftmax, __version__, dispatch_path
from .reference import ReferenceModel

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "3xtf32": torch.float32, "bf16": torch.bfloat16,
          "fp16": torch.float16}


def _parse_size(text: str):
    try:
        m, n, k = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must look like MxNxK (batch x out x in), e.g. 1024x8192x8192; got {text!r}")
    if min(m, n, k) < 1:
        raise argparse.ArgumentTypeError(f"every dimension must be >= 1; got {text!r}")
    return m, n, k


def _positive_int(text: str):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1; got {value}")
    return value


def _seed(text: str):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer; got {text!r}")
    if not -2**63 <= value < 2**64:  # torch.manual_seed's range
        raise argparse.ArgumentTypeError(f"must be in [-2**63, 2**64); got {value}")
    return value


def _free_bytes(device: torch.device):
    """Memory free for the run on `device`, or None when unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _bytes_needed(m: int, n: int, k: int, elem: int):
    """A rough upper bound of this CLI's peak memory: fp32 + fp64 + low-precision copies of W and x,
    and the float64 reference's (M, N) intermediates."""
    return n * k * (4 + 4 + 8 + elem) + m * k * (4 + 8 + elem) + m * n * 8 * 5


def _time_ms(fn, device: torch.device, iters: int, warmup: int):
    """(median, min) ms of fn: CUDA events on a GPU, the host clock on the CPU."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gemm_bn_softmax", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=_parse_size, default=None,
                   help="MxNxK: batch x out_features x in_features (default 1024x8192x8192 on CUDA, 256x1024x1024 on CPU)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16",
                   help="fp32 (exact), tf32 (fp32 inputs, TF32 tensor cores), 3xtf32 (fp32 inputs, fp32-grade "
                        "on TF32 tensor cores; Hopper only), bf16, fp16; default bf16")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--iters", type=_positive_int, default=30, help="timed calls per implementation (default 30)")
    p.add_argument("--eval", action="store_true", help="eval mode (running statistics) instead of training")
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--version", action="version", version=f"gemm_bn_softmax {__version__}")
    args = p.parse_args(argv)

    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda requested but torch.cuda.is_available() is False")
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    m, n, k = args.size or ((1024, 8192, 8192) if device.type == "cuda" else (256, 1024, 1024))
    if m == 1 and not args.eval:
        p.error(f"--size {m}x{n}x{k}: a batch of 1 in training mode cannot compute batch statistics "
                "(BatchNorm1d needs M >= 2); pass --eval or use M >= 2")
    dtype = DTYPES[args.dtype]
    need, free = _bytes_needed(m, n, k, dtype.itemsize), _free_bytes(device)
    if free is not None and need > free:
        p.error(f"--size {m}x{n}x{k} needs about {need / 2**30:.1f} GiB on {device.type}, "
                f"{free / 2**30:.1f} GiB are free; use a smaller --size")
    try:
        return _run(args, device, m, n, k, dtype)
    except torch.OutOfMemoryError:
        p.error(f"--size {m}x{n}x{k}: out of memory on {device.type}; use a smaller --size")


# Printed below a CPU run's figures, which are often below eager's: why.
CPU_PATH_NOTE = ("note: the CPU path is for correctness and portability, not speed (ATen's GEMM on operands upcast\n"
                 "      to fp32, y kept in fp32, then the library's C++ loops); the fast path runs on a Hopper GPU.")


def _run(args, device: torch.device, m: int, n: int, k: int, dtype: torch.dtype) -> int:
    precision = {"tf32": "tf32", "3xtf32": "3xtf32", "fp32": "highest"}.get(args.dtype)
    torch.manual_seed(args.seed)

    ref = ReferenceModel(k, n).to(device)
    fused = FusedGemmBNSoftmax(k, n, precision=precision).to(device)
    fused.load_state_dict(ref.state_dict())
    ref64 = copy.deepcopy(ref).double()
    ref, fused = ref.to(dtype), fused.to(dtype)
    for mod in (ref, fused, ref64):
        mod.train(not args.eval)
    x = torch.rand(m, k, device=device)  # KernelBench: x ~ U[0, 1)

    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = args.dtype == "tf32"
    try:
        with torch.no_grad():
            want = ref64(x.double())
            got = fused(x.to(dtype))
            eager = ref(x.to(dtype))
            err = ((got.double() - want).norm() / want.norm()).item()
            err_eager = ((eager.double() - want).norm() / want.norm()).item()
            stat_err = ((fused.bn.running_var.double() - ref64.bn.running_var).norm()
                        / ref64.bn.running_var.norm()).item()
            xd = x.to(dtype)
            t_fused = _time_ms(lambda: fused(xd), device, args.iters, 5)
            t_eager = _time_ms(lambda: ref(xd), device, args.iters, 5)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32

    # The forward above ran under no_grad: no gradient could be asked for.
    path = dispatch_path(xd, fused.gemm.weight, fused.gemm.bias, precision=precision, differentiable=False)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    flops = 2.0 * m * n * k
    print(f"device {name} | {args.dtype} | M={m} N={n} K={k} | {'eval' if args.eval else 'training'} | path {path}")
    print(f"{'impl':<8}{'median ms':>12}{'min ms':>10}{'TFLOP/s':>10}{'rel err vs fp64':>18}")
    print(f"{'fused':<8}{t_fused[0]:>12.4f}{t_fused[1]:>10.4f}{flops / t_fused[0] / 1e9:>10.3g}{err:>18.2e}")
    print(f"{'eager':<8}{t_eager[0]:>12.4f}{t_eager[1]:>10.4f}{flops / t_eager[0] / 1e9:>10.3g}{err_eager:>18.2e}")
    print(f"speedup vs eager: {t_eager[0] / t_fused[0]:.2f}x   running_var rel err: {stat_err:.2e}")
    if path == "cpu":
        print(CPU_PATH_NOTE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
