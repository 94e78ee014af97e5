"""How fast `kohya-tuner config` answers: whole process (interpreter start + imports +
compose + fit + write) and the in-process part alone. Prints figures; asserts nothing."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=5, help="process launches per model")
    args = ap.parse_args()

    walls = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in ("sd15", "sdxl", "flux"):
            for i in range(args.runs):
                out = Path(tmp) / f"{model}-{i}"
                t0 = time.perf_counter()
                res = subprocess.run([sys.executable, "-m", "kohya_tuner", "config", "--model", model, "--job", "style",
                                      "--gpu", "12", "--out", str(out), "--json"], capture_output=True, text=True)
                walls.append(time.perf_counter() - t0)
                if res.returncode != 0:
                    print(res.stderr, file=sys.stderr)
                    raise SystemExit(f"config failed for {model}")
        base = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "pass"], check=True)
            base.append(time.perf_counter() - t0)

    from kohya_tuner import planfiles, presets

    t0 = time.perf_counter()
    n = 0
    for model in ("sd15", "sdxl", "flux"):
        for job in presets.JOBS:
            for gb in presets.GPU_CLASSES:
                plan = presets.compose(model, job, gb)
                planfiles.render(plan, presets.build_dataset(plan, "imgs"), Path("out"))
                n += 1
    per_plan_ms = (time.perf_counter() - t0) / n * 1000

    print(f"config end-to-end (process): median {statistics.median(walls):.3f} s, max {max(walls):.3f} s "
          f"over {len(walls)} runs (bare python start: {statistics.median(base):.3f} s)")
    print(f"compose + render in process: {per_plan_ms:.1f} ms per plan over {n} plans")


if __name__ == "__main__":
    main()
