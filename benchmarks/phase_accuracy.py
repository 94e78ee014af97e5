"""Phase accuracy of `diagnose` over every labelled real log, old and new.

Reads the public set (tests/data/public_logs, labels citing their threads) and the older
shared set (../shared/real-world/logs), diagnoses each file the way `kohya-tuner diagnose`
does, and prints one line per log (its phase against the label's, and what decided it), then
the accuracy per set (the public logs the rules were developed with, the held-out public logs
collected and labelled after the rules were written, and the older shared set) and overall, how
often the outcome and error kind agree with the label's kind (tests/logparse_labels.kind_matches), each
held-out batch apart with the figure it gave the first time the parser read it
(tests/data/public_logs/first_runs.json), and how often the wrapper and the model family were named
when the label names one. A label that cannot tell the first step from a later one accepts
either.

    python benchmarks/phase_accuracy.py [--quiet]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _first_runs() -> dict:
    """Each held-out batch's figure the first time the parser read it (recorded, not recomputed)."""
    import json

    path = Path(__file__).resolve().parent.parent / "tests" / "data" / "public_logs" / "first_runs.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _print_first_runs(first_runs: dict) -> None:
    """The figure that measures the parser on logs nobody here had seen: each held-out batch the
    first time the parser read it, the latest batch apart (recorded figures, never recomputed)."""
    batches = sorted((int(k), v) for k, v in first_runs.items() if k.isdigit())
    if not batches:
        return
    print("first runs (each held-out batch read by the parser for the first time, labels committed before):")
    for batch, first in batches:
        r, n = first["right"], first["count"]
        missed = first.get("missed")
        print(f"  batch {batch}: {r}/{n} = {r / n:.0%} (parser at {first['parser_commit']})"
              + (f" missed: {', '.join(missed)}" if missed else ""))
    batch, first = batches[-1]
    r = sum(f["right"] for _, f in batches)
    n = sum(f["count"] for _, f in batches)
    print(f"phase accuracy, latest held-out batch ({batch}) at its first run: {first['right']}/{first['count']} = "
          f"{first['right'] / first['count']:.0%}; all first runs: {r}/{n} = {r / n:.0%}")


# The trainers the tool is for: sd-scripts, musubi-tuner and the programs that run them, as a label's
# wrapper names them (tests/logparse_labels.WRAPPER_WORDS).
_KOHYA = frozenset({"sd-scripts", "kohya_ss", "fluxgym", "musubi-tuner", "lora-scripts"})


def _print_first_runs_by_trainer(first_runs: dict, fixtures: list) -> None:
    """The first reads apart for the trainers the tool is for and for the others: each held-out log's
    first read is right unless its batch's recorded misses name it (batches that recorded them)."""
    split = {True: [0, 0], False: [0, 0]}
    for fx in fixtures:
        first = first_runs.get(str(fx.label.get("batch", 1))) if fx.held_out else None
        if not first or "missed" not in first:
            continue
        t = split[bool(fx.wrappers_named & _KOHYA)]
        t[0] += fx.name not in first["missed"]
        t[1] += 1
    for kohya, what in ((True, "sd-scripts, musubi-tuner and the programs that run them"),
                        (False, "other trainers")):
        r, n = split[kohya]
        if n:
            print(f"first runs, {what}: {r}/{n} = {r / n:.0%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quiet", action="store_true", help="print the totals only")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.logparse_labels import all_fixtures, diagnose_fixture, kind_matches

    totals: dict[str, list[int]] = {}
    named = {"wrapper": [0, 0], "family": [0, 0]}
    misses = []
    kinds = [0, 0]
    kind_misses = []
    batches: dict[int, list[int]] = {}
    for fx in all_fixtures():
        d = diagnose_fixture(fx)
        ok = d.phase in fx.phases
        group = fx.group
        t = totals.setdefault(group, [0, 0])
        t[0] += ok
        t[1] += 1
        for key, want, got in (("wrapper", fx.wrapper, d.wrapper), ("family", fx.family, d.family)):
            if want is not None:
                named[key][0] += got == want
                named[key][1] += 1
        if fx.held_out:
            b = batches.setdefault(fx.label.get("batch", 1), [0, 0])
            b[0] += ok
            b[1] += 1
        if not ok:
            misses.append(fx.name)
        kinds[0] += kind_matches(fx.kind, d)
        kinds[1] += 1
        if not kind_matches(fx.kind, d):
            kind_misses.append(fx.name)
        if not args.quiet:
            evidence = d.details.phase_evidence or "-"
            if d.details.frame:
                evidence += f" ({d.details.frame})"
            print(f"{fx.name:12s} {'ok  ' if ok else 'MISS'} {d.phase:18s} label {'|'.join(sorted(fx.phases)):22s} "
                  f"{d.outcome}/{d.error.kind if d.error else '-'}  by {evidence}")
    first_runs = _first_runs()
    for batch, (r, n) in sorted(batches.items()):
        line = f"phase accuracy, held-out batch {batch}: {r}/{n} = {r / n:.0%}"
        first = first_runs.get(str(batch))
        if first:
            line += (f" (first run, before any rule saw it: {first['right']}/{first['count']} = "
                     f"{first['right'] / first['count']:.0%}, parser at {first['parser_commit']})")
        print(line)
    _print_first_runs(first_runs)
    _print_first_runs_by_trainer(first_runs, all_fixtures())
    right = sum(t[0] for t in totals.values())
    count = sum(t[1] for t in totals.values())
    for group, (r, n) in sorted(totals.items()):
        what = {"held-out": "held-out logs (collected after the rules)"}.get(group, f"{group} logs")
        print(f"phase accuracy, {what}: {r}/{n} = {r / n:.0%}")
    print(f"phase accuracy, all labelled logs: {right}/{count} = {right / count:.0%}"
          + (f" (missed: {', '.join(misses)})" if misses else ""))
    print(f"outcome and kind as the label's kind says (truncated: a cut traceback; incomplete: cut before any "
          f"error): {kinds[0]}/{kinds[1]}" + (f" (missed: {', '.join(kind_misses)})" if kind_misses else ""))
    for key, (r, n) in named.items():
        if n:
            print(f"{key} named where the label names one: {r}/{n}")


if __name__ == "__main__":
    main()
