"""How fast the memory model answers: one estimate, and fit + tune on every composed preset.

    python benchmarks/memory_speed.py

Targets: an estimate well under 5 ms (fit evaluates it hundreds of times); fit + tune on a
preset well under 100 ms; importing the ladder (what `kohya-tuner config` adds) a small part
of the one-second budget of that command.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", "import time; t=time.perf_counter(); import kohya_tuner.ladder; "
                          "print(time.perf_counter()-t)"], capture_output=True, text=True, cwd=ROOT)
    import_s = float(out.stdout.strip() or "nan")
    wall = time.perf_counter() - t0

    from kohya_tuner import ladder, presets
    from kohya_tuner.families import FAMILIES
    from kohya_tuner.memory import budget_gib, estimate

    cfg = presets.compose("flux", "character", 12).config
    estimate(cfg, FAMILIES["flux"])
    n = 2000
    t = time.perf_counter()
    for _ in range(n):
        estimate(cfg, FAMILIES["flux"])
    per_est_ms = (time.perf_counter() - t) / n * 1000

    times = []
    worst = ("", 0.0)
    for model in ("sd15", "sdxl", "flux"):
        for job in presets.JOBS:
            for gb in presets.GPU_CLASSES:
                plan = presets.compose(model, job, gb)
                t = time.perf_counter()
                ladder.tune(plan.config, FAMILIES[model], budget_gib(gb), gpu_gb=gb)
                dt = (time.perf_counter() - t) * 1000
                times.append(dt)
                if dt > worst[1]:
                    worst = (f"{model}/{job}/{gb} GB", dt)
    print(f"import kohya_tuner.ladder: {import_s * 1000:.0f} ms (python start + import {wall * 1000:.0f} ms)")
    print(f"estimate: {per_est_ms:.3f} ms each ({n} runs)")
    print(f"fit + tune per preset: median {statistics.median(times):.1f} ms, max {worst[1]:.1f} ms ({worst[0]}), "
          f"{len(times)} presets")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
