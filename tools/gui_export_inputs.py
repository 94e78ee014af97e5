#!/usr/bin/env python3
"""Write our presets as kohya_ss GUI files (what `kohya-tuner config --gui-json` writes) into
tests/data/kohya_gui/exports/, for tools/gui_oracle.py --exports to run through the GUI's own code.

Run from the repository root with kohya-tuner's venv:

    PYTHONPATH=.:tests python tools/gui_export_inputs.py --out tests/data/kohya_gui/exports

Each file is named <model>-<job>-<gb>-<network>.json; the plan it comes from is composed as
tests/gui_export_cases.py composes it (model files under /models, run folder /runs/<name>).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gui_export_cases import oracle_cases, plan_case  # noqa: E402

from kohya_tuner import gui_export  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (model, job, gb, network, sets) in oracle_cases().items():
        plan, ds_path, prompts, _toml = plan_case(model, job, gb, network, out=Path("/runs") / name, sets=sets)
        (args.out / f"{name}.json").write_text(gui_export.for_plan(plan, ds_path, prompts).dumps(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
