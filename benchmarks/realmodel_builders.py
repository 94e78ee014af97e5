"""Peak RSS and wall time of the random-weight model builders (tools/realmodels/).

Each builder runs once into a fresh temporary folder with the real trainer's interpreter; the
figures are the child's own (`resource.getrusage(RUSAGE_CHILDREN)` peak RSS, wall clock) and the
size of what it wrote. Prints figures only; no pass/fail. Needs the realtrainer harness
variables (KOHYA_TUNER_REAL_PYTHON, _SDSCRIPTS, _TOKCACHE) and about 7 GB of free disk per build
(SDXL 6.9 GB, FLUX.1 6.4 GB).

    python benchmarks/realmodel_builders.py [--keep DIR] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# name -> (builder, the folder it builds under the cache, as .ci/run names it)
BUILDERS = {"sdxl": (REPO / "tools" / "realmodels" / "build_sdxl_random.py", "sdxl-random"),
            "flux": (REPO / "tools" / "realmodels" / "build_flux_random.py", "flux-random")}


def measure(name: str, builder: Path, dest: Path) -> dict:
    env = os.environ
    argv = [env["KOHYA_TUNER_REAL_PYTHON"], str(builder), str(dest), "--sd-scripts", env["KOHYA_TUNER_REAL_SDSCRIPTS"],
            "--tokcache", env["KOHYA_TUNER_REAL_TOKCACHE"]]
    t0 = time.monotonic()
    # One child per process: RUSAGE_CHILDREN's peak is this builder's alone.
    pid = os.fork()
    if pid == 0:
        res = subprocess.run(argv, capture_output=True, text=True)
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        with open(dest / "bench.txt", "w", encoding="utf-8") as f:
            f.write(f"{res.returncode} {peak_kib}\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
        os._exit(0)
    os.waitpid(pid, 0)
    wall = time.monotonic() - t0
    head, output = (dest / "bench.txt").read_text(encoding="utf-8").split("\n", 1)
    (dest / "bench.txt").unlink()
    code, peak_kib = head.split()
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    return {"builder": name, "exit": int(code), "peak_rss_gib": int(peak_kib) / 2**20, "wall_s": wall,
            "written_gb": size / 1e9, "output": output}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="build into this cache folder and keep it (a finished build there is "
                                              "kept as it is and measures nothing); default: a temporary folder")
    ap.add_argument("--only", nargs="+", choices=sorted(BUILDERS), help="measure only these builders")
    a = ap.parse_args()
    missing = [v for v in ("KOHYA_TUNER_REAL_PYTHON", "KOHYA_TUNER_REAL_SDSCRIPTS", "KOHYA_TUNER_REAL_TOKCACHE")
               if not os.environ.get(v)]
    if missing:
        print(f"needs the realtrainer harness: {', '.join(missing)} unset")
        return 2
    for name, (builder, folder) in BUILDERS.items():
        if a.only and name not in a.only:
            continue
        root = a.keep or Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
        dest = root / folder
        dest.mkdir(parents=True, exist_ok=True)
        try:
            r = measure(name, builder, dest)
        finally:
            if a.keep is None:
                shutil.rmtree(root, ignore_errors=True)
        print(r["output"].rstrip())
        print(f"{r['builder']:<6} exit {r['exit']}  peak RSS {r['peak_rss_gib']:5.2f} GiB  "
              f"wall {r['wall_s']:6.1f} s  wrote {r['written_gb']:5.2f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
