"""A host model of the 3xTF32 kernel's accumulation, to compare orders of its wgmma products (CPU only).

The 3xTF32 mainloop (src/kernels/sm90/mainloop_3xtf32.hpp) adds, per 32-element k-tile, the small-part
products (small_x * big_w and big_x * small_w, interleaved per k-block of 8) and then big_x * big_w into
a freshly zeroed wgmma accumulator, and promotes that into an fp32 accumulator. The tensor cores do not
add like fp32: within one wgmma k-step the products and the accumulator are aligned to the largest
exponent among them and the bits below a fixed width are dropped, then the sum is truncated to fp32.
This script models that (products exact, `--bits` bits kept below the largest term's leading bit,
`--step` products per aligned sum, truncation to fp32) and compares, against float64:
  - exact fp32 (one fused multiply-add accumulator in K order);
  - 1xTF32 with one accumulator (inputs rounded to TF32; the calibration: a TF32 GEMM over K = 8192 of
    TF32-exact N(0, 1) inputs measured 1.9e-5 on the H200, against 1.6e-6 for cuBLAS's SIMT fp32);
  - "k-tile 32": the kernel's order, promoted every 32 K-elements;
  - "2 k-tiles interleaved": the same order for two k-tiles into one accumulator, promoted every 64
    (measured on the H200, design study section 7c: 1.95e-7 at K = 1024 over 16 decades, against the
    kernel's 1.58e-7);
  - "k-tile 64, small first": the small-part products of 64 K-elements first, then their 8 big * big
    steps, promoted every 64 (the design study's section 9, item 5: not built);
  - with --intervals: the kernel's order promoted every 1, 2 and 4 k-tiles, against exact fp32 summed
    in K order and summed as 16 K ranges added in fp32 (the form of cuBLAS's split-K kernels, whose
    exact fp32 at 256x512x16384 measured 4.1e-7 where the sequential sum gives about 2.4e-6). Longer
    intervals beat the sequential sum from K = 4096 but not the split one: the reason the kernel promotes
    every k-tile at every K (design study section 7j).
Inputs as the kernel's gtest draws them: N(0, 1) * 10^U(-d, d).

The defaults (26 bits, 8 products a step) are the ones that reproduce the calibration figure (1.92e-5),
and with them the model lands within about 20 % of every error the H200 measured for the kernel's order
(K = 64 / 1024 / 8192, d = 3: model 1.16e-7 / 1.65e-7 / 3.16e-7, kernel 1.40e-7 / 1.72e-7 / 3.21e-7;
d = 8: 1.01e-7 / 1.71e-7 / 3.35e-7 against 1.21e-7 / 1.58e-7 / 3.08e-7) and for the interleaved
promotion every 64 (K = 64, d = 3: 2.88e-7 against 3.2e-7; K = 1024, d = 8: 2.12e-7 against 1.95e-7).
4 products a step at 25 bits (calibration 2.6e-5) lands about as near the kernel's figures and ranks the
orders the same way; it predicts "k-tile 64, small first" 9-44 % above "k-tile 32" at K <= 1024.

    python bench/tensor_core_accumulation_model.py                       # d = 3 and 8, K = 64 ... 8192
    python bench/tensor_core_accumulation_model.py --bits 25 --calibrate
    python bench/tensor_core_accumulation_model.py --intervals --ks 4096 8192 16384 --decades 0 3 8
"""
from __future__ import annotations

import argparse

import numpy as np

DROPPED = np.uint32(0x1FFF)  # TF32 keeps 10 of fp32's 23 fraction bits


def tf32_nearest_away(x: np.ndarray) -> np.ndarray:
    """fp32 -> TF32, to nearest, ties away (tf32::round_nearest_away_bits)."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + np.uint32(0x1000)) & ~DROPPED).view(np.float32)


def tf32_truncate(x: np.ndarray) -> np.ndarray:
    """fp32 -> TF32 toward zero (what the tensor cores read from a raw fp32 word)."""
    return (x.astype(np.float32).view(np.uint32) & ~DROPPED).view(np.float32)


def split_x(a: np.ndarray):
    """The kernel's split of x (the register operand): both parts to nearest."""
    big = tf32_nearest_away(a)
    return big, tf32_nearest_away(a - big)


def split_w(b: np.ndarray):
    """The kernel's split of W (the shared-memory operand): the truncated word, its rounded remainder."""
    big = tf32_truncate(b)
    return big, tf32_nearest_away(b - big)


def to_fp32_toward_zero(s: np.ndarray) -> np.ndarray:
    m, e = np.frexp(s)
    return np.ldexp(np.trunc(m * 2.0**24), e - 24)


class TensorCoreSum:
    """One wgmma k-step: acc (fp32 values) + the exact products, aligned to the largest exponent."""

    def __init__(self, bits: int):
        self.bits = bits

    def __call__(self, acc: np.ndarray, products: np.ndarray) -> np.ndarray:
        # acc: (outputs,), products: (outputs, step); all exactly representable in float64
        terms = np.concatenate([acc[:, None], products], axis=1)
        _, e = np.frexp(np.max(np.abs(terms), axis=1))
        quantum = np.ldexp(1.0, e - self.bits)[:, None]
        s = np.sum(np.trunc(terms / quantum) * quantum, axis=1)
        return to_fp32_toward_zero(s)


def fp32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32).astype(np.float64)


def exact_fp32(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    r = np.zeros(x.shape[0])
    for k in range(x.shape[1]):
        r = fp32(x[:, k].astype(np.float64) * w[:, k] + r)  # one rounding a term, as an FMA
    return r


def products(xa, wb, k0: int, k1: int) -> np.ndarray:
    return xa[:, k0:k1].astype(np.float64) * wb[:, k0:k1].astype(np.float64)


def one_accumulator_tf32(x, w, add: TensorCoreSum, step: int) -> np.ndarray:
    xt, wt = tf32_nearest_away(x), tf32_nearest_away(w)
    acc = np.zeros(x.shape[0])
    for k in range(0, x.shape[1], step):
        acc = add(acc, products(xt, wt, k, k + step))
    return acc


def three_tf32(x, w, add: TensorCoreSum, step: int, order: str, interval: int = 1) -> np.ndarray:
    """The 3xTF32 sum of each pair of rows of x and w (outputs = rows), in the given order; "tile32"
    promoted every `interval` k-tiles."""
    xb, xs = split_x(x)
    wb, ws = split_w(w)
    outputs, K = x.shape
    tile = 64 if order in ("interleaved64", "small_first64") else 32 * interval
    accum = np.zeros(outputs, dtype=np.float32).astype(np.float64)
    for t0 in range(0, K, tile):
        t1 = min(t0 + tile, K)
        partial = np.zeros(outputs)
        blocks = [(k, min(k + 8, t1)) for k in range(t0, t1, 8)]

        def small_then_big(span):
            """The small parts' products of each k-block of span (small x * big w, big x * small w),
            then its big * big products, added into partial."""
            nonlocal partial
            pairs = [pair for k0, k1 in span for pair in ((xs, wb, k0, k1), (xb, ws, k0, k1))]
            pairs += [(xb, wb, k0, k1) for k0, k1 in span]
            for xa, wbb, k0, k1 in pairs:
                p = products(xa, wbb, k0, k1)
                for s in range(0, p.shape[1], step):
                    partial = add(partial, p[:, s:s + step])

        if order in ("tile32", "interleaved64"):  # per 32-element k-tile
            for q0 in range(t0, t1, 32):
                small_then_big([b for b in blocks if q0 <= b[0] < q0 + 32])
        elif order == "small_first64":
            small_then_big(blocks)
        else:
            raise ValueError(order)
        accum = fp32(accum + partial)  # the promotion: an fp32 add
    return accum


def rel(got: np.ndarray, want: np.ndarray) -> float:
    """The benchmark's error measure (bench_forward.rel_err), in numpy: this script needs no torch."""
    return float(np.sqrt(np.sum((got - want) ** 2) / np.sum(want ** 2)))


def draw(rng, shape, decades: float) -> np.ndarray:
    return (rng.standard_normal(shape) * 10.0 ** rng.uniform(-decades, decades, shape)).astype(np.float32)


def calibration(outputs: int, add: TensorCoreSum, step: int, rng) -> tuple[float, float]:
    """One TF32 accumulator and exact fp32 over K = 8192 of TF32-exact N(0, 1) inputs: relative errors."""
    K = 8192
    x = tf32_nearest_away(rng.standard_normal((outputs, K)).astype(np.float32))
    w = tf32_nearest_away(rng.standard_normal((outputs, K)).astype(np.float32))
    want = np.sum(x.astype(np.float64) * w, axis=1)
    return rel(one_accumulator_tf32(x, w, add, step), want), rel(exact_fp32(x, w), want)


def draw_case(K: int, decades: float, outputs: int, rng):
    """One draw of the gtest's inputs, x and w (outputs, K), and their dot products in float64."""
    x, w = draw(rng, (outputs, K), decades), draw(rng, (outputs, K), decades)
    return x, w, np.sum(x.astype(np.float64) * w.astype(np.float64), axis=1)


def case_errors(K: int, decades: float, outputs: int, add: TensorCoreSum, step: int, rng) -> dict:
    """Relative errors of exact fp32 and of each 3xTF32 order on one draw of the gtest's inputs."""
    x, w, want = draw_case(K, decades, outputs, rng)
    errors = {"exact fp32": rel(exact_fp32(x, w), want)}
    for order, _ in ORDERS:
        errors[order] = rel(three_tf32(x, w, add, step, order), want)
    return errors


INTERVALS = (1, 2, 4)


def exact_fp32_split_k(x: np.ndarray, w: np.ndarray, ranges: int) -> np.ndarray:
    """Exact fp32 over `ranges` equal K ranges, each summed in K order, then added in order in fp32."""
    K = x.shape[1]
    r = np.zeros(x.shape[0])
    for i in range(ranges):
        k0, k1 = i * K // ranges, (i + 1) * K // ranges
        r = fp32(r + exact_fp32(x[:, k0:k1], w[:, k0:k1]))
    return r


def interval_errors(K: int, decades: float, outputs: int, add: TensorCoreSum, step: int, rng) -> dict:
    """Relative errors of exact fp32 (in K order, and as 16 K ranges) and of the kernel's order promoted
    every 1, 2 and 4 k-tiles."""
    x, w, want = draw_case(K, decades, outputs, rng)
    errors = {"exact fp32": rel(exact_fp32(x, w), want), "exact fp32, split K": rel(exact_fp32_split_k(x, w, 16), want)}
    for p in INTERVALS:
        errors[p] = rel(three_tf32(x, w, add, step, "tile32", p), want)
    return errors


ORDERS = [("tile32", "k-tile 32"), ("interleaved64", "2 k-tiles interleaved"), ("small_first64", "k-tile 64, small first")]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bits", type=int, default=26, help="bits kept from the largest term's leading bit down")
    ap.add_argument("--step", type=int, default=8, help="products per aligned sum (a wgmma k-step)")
    ap.add_argument("--outputs", type=int, default=1024, help="dot products per case")
    ap.add_argument("--ks", type=int, nargs="+", default=[64, 1024, 8192])
    ap.add_argument("--decades", type=float, nargs="+", default=[3, 8])
    ap.add_argument("--calibrate", action="store_true", help="only the 1xTF32 calibration point")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--intervals", action="store_true",
                    help="the kernel's order promoted every 1, 2, 4 k-tiles, against exact fp32 in K order and split K")
    args = ap.parse_args(argv)
    add = TensorCoreSum(args.bits)
    rng = np.random.default_rng(args.seed)
    one, exact = calibration(args.outputs, add, args.step, rng)
    print(f"calibration, TF32-exact N(0,1), K = 8192: one tensor-core accumulator {one:.3g} (H200: 1.9e-5), "
          f"exact fp32 {exact:.3g} (cuBLAS SIMT: 1.6e-6)")
    if args.calibrate:
        return
    print(f"bits {args.bits}, step {args.step}, {args.outputs} outputs a case; relative error against float64")
    if args.intervals:
        print("| K | decades | exact fp32 | exact fp32, 16 K ranges | every k-tile | every 2 | every 4 |")
        print("|---|---|---|---|---|---|---|")
        for d in args.decades:
            for K in args.ks:
                e = interval_errors(K, d, args.outputs, add, args.step, rng)
                print(f"| {K} | {d:g} | {e['exact fp32']:.3g} | {e['exact fp32, split K']:.3g} | "
                      + " | ".join(f"{e[p]:.3g}" for p in INTERVALS) + " |")
        return
    print("| K | decades | exact fp32 | " + " | ".join(name for _, name in ORDERS) + " |")
    print("|---|---|---|" + "---|" * len(ORDERS))
    for d in args.decades:
        for K in args.ks:
            e = case_errors(K, d, args.outputs, add, args.step, rng)
            print(f"| {K} | {d:g} | {e['exact fp32']:.3g} | " + " | ".join(f"{e[o]:.3g}" for o, _ in ORDERS) + " |")


if __name__ == "__main__":
    main()
