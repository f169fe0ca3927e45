"""Slow rounds that two benchmark runs share: for every impl and point that both bench_forward.py JSONs
timed in rounds (`ms_rounds`), each round's excess over that impl's fastest round, and whether the rounds
more than --threshold above it are the same ones in both runs. bench_forward times the impls in a fixed
sequence (the order reversed every other round, the compiled peers' cold compiles between rounds), so a
slowdown that belongs to a position in that sequence (the clocks after a given neighbour, or after a
compile) comes back in the same round in every run, whichever build is timed; noise does not.

    python bench/round_positions.py bench/results/<run a>.json bench/results/<run b>.json [--threshold 0.05]

--shuffles N adds what chance gives: the count of "same rounds" with run b's rounds shuffled within each
impl-point, N times (seeded), its mean and the share of shuffles that reach the observed count.
"""
import argparse
import json
import random


def rounds_of(path):
    """{(M, N, K, mode, impl): [ms per round]} of one JSON's records that have rounds."""
    with open(path) as f:
        records = json.load(f)["records"]
    return {(r["M"], r["N"], r["K"], r["mode"], r["impl"]): r["ms_rounds"] for r in records if r.get("ms_rounds")}


def excess(ms_rounds):
    """Each round's time over the fastest round's, as a fraction."""
    fastest = min(ms_rounds)
    return [ms / fastest - 1.0 for ms in ms_rounds]


def compare(a, b, threshold):
    """Rows (key, excess in a, excess in b, verdict) for the keys both runs timed with the same number of
    rounds and where either has a slow round; verdict "same rounds" when the slow rounds coincide, "some
    shared" when they overlap, "" otherwise."""
    rows = []
    for key in a:
        if key not in b or len(a[key]) != len(b[key]):
            continue
        ea, eb = excess(a[key]), excess(b[key])
        slow_a = {i for i, e in enumerate(ea) if e > threshold}
        slow_b = {i for i, e in enumerate(eb) if e > threshold}
        if not (slow_a or slow_b):
            continue
        verdict = "same rounds" if slow_a == slow_b else ("some shared" if slow_a & slow_b else "")
        rows.append((key, ea, eb, verdict))
    return rows


def shuffled_same_rounds(a, b, threshold, shuffles, seed=0):
    """The "same rounds" count of compare(a, b') over `shuffles` copies b' of b, each impl-point's rounds
    in a random order: [count per shuffle]."""
    rng = random.Random(seed)
    counts = []
    for _ in range(shuffles):
        shuffled = {key: rng.sample(ms, len(ms)) for key, ms in b.items()}
        counts.append(sum(1 for row in compare(a, shuffled, threshold) if row[3] == "same rounds"))
    return counts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--threshold", type=float, default=0.05, help="a round this far above the fastest is slow")
    p.add_argument("--shuffles", type=int, default=0, help="also the count that chance gives, over N shuffles")
    a = p.parse_args(argv)
    run_a, run_b = rounds_of(a.run_a), rounds_of(a.run_b)
    rows = compare(run_a, run_b, a.threshold)
    fmt = lambda es: " ".join(f"{e:+4.0%}" for e in es)  # noqa: E731
    for (m, n, k, mode, impl), ea, eb, verdict in rows:
        print(f"{m}x{n}x{k} {mode:5s} {impl:10s} {fmt(ea)} | {fmt(eb)}  {verdict}")
    same = sum(1 for row in rows if row[3] == "same rounds")
    print(f"{len(rows)} impl-points with a slow round (> {a.threshold:.0%}); the same rounds in both runs at {same}")
    if a.shuffles > 0:
        counts = shuffled_same_rounds(run_a, run_b, a.threshold, a.shuffles)
        reach = sum(1 for c in counts if c >= same) / len(counts)
        print(f"run b's rounds shuffled {a.shuffles} times: the same rounds at {sum(counts) / len(counts):.1f} on "
              f"average; {reach:.1%} of the shuffles reach {same}")


if __name__ == "__main__":
    main()
