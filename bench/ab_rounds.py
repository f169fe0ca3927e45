"""A/B of settings given by environment variables: runs one command once per setting per round,
the settings alternating inside each round, so a slow drift of the GPU's clocks (which moves the
headline op between about 203 and 235 us from process to process on the H200) hits every setting
alike. Each run's output is parsed for (key, value) pairs; the table gives, per key, each setting's
median over the rounds, its values round by round, and whether every round ordered the settings the
same way against the first one.

  python bench/ab_rounds.py --rounds 3 \\
      --setting early=FUSED_SOFTMAX_EARLY_Y=1 --setting late=FUSED_SOFTMAX_EARLY_Y=0 \\
      -- python3 bench/pipeline_breakdown.py --cases bf16:1024x8192x8192

The default pattern reads bench/pipeline_breakdown.py's lines ("pdl=1 bf16 1024x8192x8192: op 233.0
us ..."): the key is the mode and shape, the value the op's median. --pattern takes any regular
expression with two groups (key, value)."""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys

PIPELINE_OP = r"^pdl=\d (\S+ \S+(?: \S+)?): op ([0-9.]+) us"  # mode, size and, with --paths, the path


def parse_setting(text):
    """"label=VAR=value[,VAR=value...]" -> (label, {VAR: value})."""
    label, sep, rest = text.partition("=")
    if not sep or not label or not rest:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL=VAR=VALUE[,VAR=VALUE...]")
    env = {}
    for item in rest.split(","):
        var, sep, value = item.partition("=")
        if not sep or not var:
            raise argparse.ArgumentTypeError(f"{text!r}: {item!r} is not VAR=VALUE")
        env[var] = value
    return label, env


def values_of(output, pattern):
    """{key: value} from every line of output the pattern matches (the last match of a key wins)."""
    found = {}
    for line in output.splitlines():
        m = re.search(pattern, line)
        if m:
            found[m.group(1)] = float(m.group(2))
    return found


def summarise(rounds, labels):
    """rounds: [{label: {key: value}}] -> {key: {"median": {label: v}, "rounds": {label: [v...]},
    "same_order_every_round": {label: bool}}}, keys in first-seen order. A key a run did not print
    counts as missing in that round (so it cannot look consistent by absence)."""
    keys = []
    for r in rounds:
        for label in labels:
            keys.extend(k for k in r.get(label, {}) if k not in keys)
    table = {}
    base = labels[0]
    for key in keys:
        per = {label: [r.get(label, {}).get(key) for r in rounds] for label in labels}
        row = {"rounds": per, "median": {}, "same_order_every_round": {}}
        for label in labels:
            got = [v for v in per[label] if v is not None]
            row["median"][label] = statistics.median(got) if got else None
        for label in labels[1:]:
            signs = set()
            for a, b in zip(per[base], per[label]):
                signs.add(None if a is None or b is None else (b > a) - (b < a))
            row["same_order_every_round"][label] = len(signs) == 1 and None not in signs and 0 not in signs
        table[key] = row
    return table


def format_table(table, labels):
    lines = [f"{'key':<28}" + "".join(f"{label:>14}" for label in labels) + "   rounds"]
    for key, row in table.items():
        medians = "".join(f"{row['median'][label]:>14.1f}" if row["median"][label] is not None else f"{'-':>14}"
                          for label in labels)
        rounds = " | ".join(" ".join("-" if v is None else f"{v:g}" for v in row["rounds"][label]) for label in labels)
        same = ", ".join(f"{label} vs {labels[0]}: {'every round' if ok else 'mixed'}"
                         for label, ok in row["same_order_every_round"].items())
        lines.append(f"{key:<28}{medians}   {rounds}   ({same})")
    return "\n".join(lines)


def stop_on_signal(signum, frame):
    """SIGTERM (what `timeout` sends) ends the runs as Ctrl-C does."""
    raise KeyboardInterrupt


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--setting", action="append", type=parse_setting, required=True,
                   help="LABEL=VAR=VALUE[,VAR=VALUE...]; give two or more, the first is the baseline")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pattern", default=PIPELINE_OP, help="regular expression with two groups: key, value")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds allowed for one run")
    p.add_argument("--out", help="write the raw values and the table as JSON here")
    p.add_argument("--log", help="a folder: each run's whole output is kept there as round<N>-<label>.log")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    a = p.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        p.error("no command: give it after --")
    if len(a.setting) < 2:
        p.error("an A/B needs two or more --setting")
    labels = [label for label, _ in a.setting]
    if len(set(labels)) != len(labels):
        p.error("two settings have the same label")
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    if a.log:
        os.makedirs(a.log, exist_ok=True)
    # A time limit (`timeout`, SIGTERM) or Ctrl-C ends the runs early: the table and --out then cover the
    # rounds so far, the unfinished one included (a setting it did not reach counts as missing there).
    signal.signal(signal.SIGTERM, stop_on_signal)
    rounds = []
    stopped = None
    try:
        for r in range(a.rounds):
            got = {}
            rounds.append(got)
            for label, env in a.setting:
                run = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True,
                                     timeout=a.timeout)
                if run.returncode != 0:
                    sys.stderr.write(run.stdout[-2000:] + run.stderr[-2000:])
                    raise SystemExit(f"round {r + 1}, setting {label}: the command failed (rc {run.returncode})")
                if a.log:
                    with open(os.path.join(a.log, f"round{r + 1}-{label}.log"), "w") as f:
                        f.write(run.stdout + run.stderr)
                values = values_of(run.stdout, a.pattern)
                if not values:
                    raise SystemExit(f"round {r + 1}, setting {label}: no line matched {a.pattern!r}")
                got[label] = values
                print(f"round {r + 1} {label}: " + " ".join(f"{k}={v:g}" for k, v in values.items()), flush=True)
    except KeyboardInterrupt:
        stopped = f"stopped in round {len(rounds)} of {a.rounds}"
        print(f"{stopped}: the table covers the runs finished so far", flush=True)
        if rounds and not rounds[-1]:
            rounds.pop()
    table = summarise(rounds, labels)
    print(format_table(table, labels))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"command": command, "settings": dict(a.setting), "rounds": rounds, "table": table,
                       "stopped": stopped}, f, indent=1)


if __name__ == "__main__":
    main()
