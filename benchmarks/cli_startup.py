"""Start-up time of each command against `python -c "import pydantic, rich"`, measured side by side.

Two figures per command, both as a ratio to the baseline measured in the same loop (runs are
interleaved so machine load hits all of them alike):
- start: `kohya-tuner CMD --help`, i.e. interpreter, the CLI table, the command's module and its
  argument parser. The target is 1.5x.
- work:  the command doing a small real job (a config for a 12 GB card, an estimate, a fit, a
  check, a diagnosis of a short log): what a user waits for. Printed for information: most of it
  is pydantic building its models and rich's console, which the baseline imports only lazily.

    python benchmarks/cli_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _cli() -> list[str]:
    script = Path(sys.executable).with_name("kohya-tuner")
    return [str(script)] if script.exists() else [sys.executable, "-m", "kohya_tuner"]


def _time(argv: list[str]) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t0
    # 1: fit found nothing that fits; 2: check refused (the seed config names no model or images).
    if proc.returncode not in (0, 1, 2):
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-500:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    opts = ap.parse_args()
    cli = _cli()
    tmp = Path(tempfile.mkdtemp(prefix="kt-startup-"))
    try:
        subprocess.run(cli + ["config", "--model", "sdxl", "--job", "style", "--gpu", "12", "--out",
                              str(tmp / "seed")], check=True, capture_output=True)
        cfg = tmp / "seed" / "config.toml"
        log = tmp / "short.log"
        log.write_text("steps:  10%|█         | 10/100 [00:10<01:30,  1.00it/s, avr_loss=0.1]\n"
                       "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.\n")
        baseline = [sys.executable, "-c", "import pydantic, rich"]
        cases: dict[str, list[str]] = {"--help": cli + ["--help"]}
        commands = ["config", "estimate", "fit", "check", "diagnose"]
        from kohya_tuner.cli.app import COMMANDS

        commands = [c for c in commands if c in COMMANDS]
        # run's work needs a trainer; its start-up is measured alone.
        for c in commands + [c for c in ("run",) if c in COMMANDS]:
            cases[f"{c} (start)"] = cli + [c, "--help"]
        n = 0
        work = {
            "config": ["config", "--model", "sdxl", "--job", "style", "--gpu", "12", "--out"],
            "estimate": ["estimate", str(cfg)],
            "fit": ["fit", str(cfg), "--gpu", "8", "--out"],
            "check": ["check", str(cfg)],
            "diagnose": ["diagnose", str(log)],
        }
        samples: dict[str, list[float]] = {"baseline": []}
        for _ in range(opts.runs):
            samples["baseline"].append(_time(baseline))
            for name, argv in cases.items():
                samples.setdefault(name, []).append(_time(argv))
            for c in commands:
                argv = cli + work[c]
                if argv[-1] == "--out":
                    n += 1
                    argv = argv + [str(tmp / f"o{n}" / ("fit.toml" if c == "fit" else ""))]
                samples.setdefault(f"{c} (work)", []).append(_time(argv))
        base = statistics.median(samples["baseline"])
        if os.environ.get("PYTHONDONTWRITEBYTECODE"):
            # Every run then compiles kohya_tuner from source (an editable install has no .pyc files).
            print("note: PYTHONDONTWRITEBYTECODE is set: each run compiles the package from source; "
                  "unset it for what an installed copy does")
        print(f"baseline `python -c \"import pydantic, rich\"`: median {base * 1000:.0f} ms over {opts.runs} runs")
        for name, values in samples.items():
            if name == "baseline":
                continue
            med = statistics.median(values)
            target = "" if "(work)" in name else ("  ok" if med <= 1.5 * base else "  OVER 1.5x")
            print(f"{name:<18} median {med * 1000:6.0f} ms  ratio {med / base:4.2f}x{target}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
