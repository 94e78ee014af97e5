#!/usr/bin/env python3
"""Record the max_train_steps the kohya_ss GUI itself passes for files that say 0, on real folders.

Never imported by kohya_tuner. The cases (tests/data/kohya_gui/steps_cases.json) each name a tab, a
folder layout (relative path -> "file" or "dir") and the file's fields, with @ROOT@ for the folder
the layout is built in. Each layout is built under --root, its GUI JSON written, and the GUI's own
load and "Print training command" code run on it through tools/gui_oracle.py (same venv, same
GUI tree; see that file's docstring). What the GUI wrote is recorded with @ROOT@ put back:

    /work/gui-venv/bin/python tools/gui_steps_oracle.py --gui /tmp/kohya_ss --commit <commit> \\
        --root /tmp/kt-steps --out tests/data/kohya_gui/steps_records.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gui_oracle as go  # noqa: E402

CASES = Path(__file__).resolve().parents[1] / "tests" / "data" / "kohya_gui" / "steps_cases.json"


def build(root: Path, layout: dict[str, str]) -> None:
    for rel, kind in sorted(layout.items()):
        path = root / rel
        if kind == "dir":
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gui", required=True, type=Path)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--root", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    out = args.out.resolve()
    cases = json.loads(CASES.read_text(encoding="utf-8"))
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    scratch = Path(tempfile.mkdtemp(prefix="gui-steps-"))
    built, state = go.build_tabs(args.gui.resolve(), scratch)
    records = []
    for case in cases:
        root = args.root.resolve() / case["name"]
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        build(root, case["layout"])
        fields = json.loads(json.dumps(case["fields"]).replace("@ROOT@", str(root)))
        path = root.parent / f"{case['name']}.json"
        path.write_text(json.dumps(fields), encoding="utf-8")
        rec = go.run_one(built, state, case["tab"], path, scratch, fill=False)
        toml = rec.get("toml") or {}
        records.append({"name": case["name"], "refused": rec["refused"],
                        "max_train_steps": toml.get("max_train_steps"), "gui_log": rec.get("gui_log")})
        print(case["name"], records[-1]["max_train_steps"], file=sys.stderr)
    out.write_text(json.dumps({"source": f"bmaltais/kohya_ss {args.commit}, tools/gui_steps_oracle.py",
                               "records": records}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
