"""Stands in front of the trainer's Python (`run --python` points at a script that runs
this): before each `accelerate launch` it records a SHA-256 of every file under the run's
output folder, then hands over to the real interpreter with the same arguments. The
snapshot taken when attempt N starts holds everything the earlier attempts left; a test
then checks that all of it is still there, byte for byte, when the run is over.

Environment: SNAPSHOT_REAL_PYTHON (the interpreter to hand over to), SNAPSHOT_OUTPUT_DIR,
SNAPSHOT_DIR (where snapshots go, one JSON file per launch, named after its config file).
"""

import hashlib
import json
import os
import sys
from pathlib import Path


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def snapshot(output_dir: Path) -> dict:
    if not output_dir.is_dir():
        return {}
    return {str(p.relative_to(output_dir)): digest(p) for p in sorted(output_dir.rglob("*")) if p.is_file()}


def main() -> None:
    real = os.environ["SNAPSHOT_REAL_PYTHON"]
    args = sys.argv[1:]
    if args[:2] == ["-m", "accelerate.commands.launch"] and "--config_file" in args:
        # The trainer's --config_file is the last one; accelerate's own comes before the script.
        config = Path([args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config_file"][-1])
        out = Path(os.environ["SNAPSHOT_DIR"]) / (config.name + ".json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(snapshot(Path(os.environ["SNAPSHOT_OUTPUT_DIR"]))), encoding="utf-8")
    os.execv(real, [real] + args)


if __name__ == "__main__":
    main()
