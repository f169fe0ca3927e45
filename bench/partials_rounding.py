"""Rounding of the sm90 statistics epilogue's column reduction, emulated in float32 on the CPU.

Follows the order of src/kernels/epilogue/sm90_column_partials.hpp for one column of a 256-row tile
(two warpgroups of four warps; a warp holds rows 16 i + {0..15} and 64 + 16 i + {0..15} of its
warpgroup's 128, a thread four of them): "warp shift" is the kernel's (a shift per warp and column,
the median of the warp's first three rows; plain sums across the lanes; the warps' sums moved to
warp 0's mean and added), "first row" the same with the warp's first row as its shift,
"per-thread Chan" the scheme it replaced (each thread's first value as its shift, Chan merges across
lanes and warps), "one shift" a single shift for the tile (row 0), for scale. Prints the relative
error of M2 against float64 for typical columns and for columns in which one or two rows hold nearly
all of the variance (outliers of D times the spread), the shifted sums' worst case when they sit where
the shifts come from.

    python bench/partials_rounding.py [--columns 2000]
"""
import argparse

import numpy as np

f = np.float32


def fma(a, b, c):
    return f(np.float64(a) * np.float64(b) + np.float64(c))  # one rounding, as fmaf


def warps_of(col):
    """(first row, the 8 threads' rows) of each warp, in warp order."""
    for g in range(2):
        for i in range(4):
            base = 128 * g + 16 * i
            yield base, [[base + m, base + m + 8, base + 64 + m, base + 64 + m + 8] for m in range(8)]


def median3(a, b, c):
    return max(min(a, b), min(max(a, b), c))


def warp_shift(col, first_row_only=False):
    S1w, S2w, Kw = [], [], []
    for first, threads in warps_of(col):
        K = col[first] if first_row_only else median3(col[first], col[first + 1], col[first + 2])
        sums = []
        for rows in threads:
            s1 = s2 = f(0)
            for r in rows:
                d = f(col[r] - K)
                s1, s2 = f(s1 + d), fma(d, d, s2)
            sums.append((s1, s2))
        while len(sums) > 1:  # the butterfly: pairwise sums
            sums = [(f(a[0] + b[0]), f(a[1] + b[1])) for a, b in zip(sums[::2], sums[1::2])]
        S1w.append(sums[0][0]), S2w.append(sums[0][1]), Kw.append(K)
    C = f(Kw[0] + f(S1w[0] / f(32)))
    S1 = S2 = f(0)
    for K, s1, s2 in zip(Kw, S1w, S2w):
        d = f(K - C)
        S2 = f(S2 + fma(d, fma(f(32), d, f(2) * s1), s2))
        S1 = f(S1 + fma(f(32), d, s1))
    return max(f(S2 - f(f(S1 * S1) * f(f(1) / f(256)))), f(0))


def chan(a, b):
    na, Ka, S1a, M2a = a
    nb, Kb, S1b, M2b = b
    n = na + nb
    dK = f(Kb - Ka)
    delta = f(dK + f(f(S1b * f(f(1) / f(nb))) - f(S1a * f(f(1) / f(na)))))
    M2 = f(f(M2a + M2b) + f(f(delta * delta) * f(f(na) * f(nb) / f(n))))
    return n, Ka, f(f(S1a + S1b) + f(f(nb) * dK)), M2


def per_thread_chan(col):
    warps = []
    for _, threads in warps_of(col):
        states = []
        for rows in threads:
            K = col[rows[0]]
            s1 = s2 = f(0)
            for r in rows[1:]:
                d = f(col[r] - K)
                s1, s2 = f(s1 + d), fma(d, d, s2)
            states.append((4, K, s1, max(f(s2 - f(f(s1 * s1) * f(0.25))), f(0))))
        while len(states) > 1:
            states = [chan(a, b) for a, b in zip(states[::2], states[1::2])]
        warps.append(states[0])
    while len(warps) > 1:
        warps = [chan(a, b) for a, b in zip(warps[::2], warps[1::2])]
    return warps[0][3]


def one_shift(col):
    d = (col - col[0]).astype(f)
    S1, S2 = f(d.sum(dtype=f)), f((d * d).sum(dtype=f))
    return f(S2 - S1 * S1 / f(256))


def m2_rel_error(scheme, col):
    """Relative error of scheme(col), a float32 column's M2, against the float64 M2 of the same values."""
    c64 = col.astype(np.float64)
    m2 = ((c64 - c64.mean()) ** 2).sum()
    return abs(float(scheme(col)) - m2) / m2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--columns", type=int, default=2000)
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    cases = [("U(-1,1)", lambda: rng.uniform(-1, 1, 256)),
             ("U(-1,1) + 1e3 (|mean| / std 1.7e3)", lambda: 1e3 + rng.uniform(-1, 1, 256))]
    for D in (30, 1000, 1e5):
        cases.append((f"row 0 an outlier of {D:g}", lambda D=D: np.r_[D * rng.uniform(-1, 1), rng.uniform(-1, 1, 255)]))
    cases.append(("rows 0, 1 outliers of 1000, one sign", lambda: np.r_[1000 * rng.uniform(0.5, 1, 2), rng.uniform(-1, 1, 254)]))
    schemes = [("warp shift", warp_shift), ("first row", lambda c: warp_shift(c, True)),
               ("per-thread Chan", per_thread_chan), ("one shift", one_shift)]
    print(f"relative error of M2 against float64, max (99th percentile) over {args.columns} columns")
    for name, gen in cases:
        errs = {s: [] for s, _ in schemes}
        for _ in range(args.columns):
            col = gen().astype(f)
            for s, fn in schemes:
                errs[s].append(m2_rel_error(fn, col))
        print(f"{name:38s} " + " | ".join(f"{s} {max(e):.1e} ({np.quantile(e, 0.99):.1e})" for s, e in errs.items()))


if __name__ == "__main__":
    main()
