"""Start-up and run time of `kohya-tuner check`, next to `import pydantic, rich`.

Prints figures only (median of a few fresh interpreters); no pass/fail.
    python benchmarks/check_startup.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNS = 5


def wall(code: str) -> float:
    times = []
    for _ in range(RUNS):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, capture_output=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    base = wall("import pydantic, rich")
    help_ = wall("from kohya_tuner.cli.app import run; run(['check', '--help'])")
    imp = wall("import kohya_tuner.cli.cmd_check, kohya_tuner.check")
    cfg = REPO / "tests" / "data" / "refused_configs" / "persistent_workers.toml"
    full = wall(f"from kohya_tuner.cli.app import run; run(['check', {str(cfg)!r}, '--model', 'sd15', '--json'])")
    print(f"import pydantic, rich            {base * 1000:7.1f} ms")
    print(f"kohya-tuner check --help          {help_ * 1000:7.1f} ms  ({help_ / base:.2f}x)")
    print(f"import cmd_check + check          {imp * 1000:7.1f} ms  ({imp / base:.2f}x)")
    print(f"kohya-tuner check CONFIG --json   {full * 1000:7.1f} ms  ({full / base:.2f}x; reads args.json, rules)")
    sys.path.insert(0, str(REPO))
    from kohya_tuner.check import argschema, engine

    t = time.perf_counter()
    argschema.raw_schema()
    t_schema = time.perf_counter() - t
    t = time.perf_counter()
    engine.rules(), engine.ranges()
    t_rules = time.perf_counter() - t
    cfg_d = {"pretrained_model_name_or_path": "m", "network_module": "networks.lora", "resolution": "512"}
    t = time.perf_counter()
    for _ in range(100):
        engine.check(cfg_d, "train_network.py", complete=True)
    t_eval = (time.perf_counter() - t) / 100
    print(f"args.json parse (once)            {t_schema * 1000:7.1f} ms")
    print(f"rules.toml + ranges.toml (once)   {t_rules * 1000:7.1f} ms")
    print(f"one evaluation (warm)             {t_eval * 1000:7.2f} ms  (the ladder calls it per candidate)")


if __name__ == "__main__":
    main()
