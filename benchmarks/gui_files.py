"""How many of the kohya_ss GUI's own JSON files kohya-tuner reads, and how many it reads as the GUI
launches them (tests/data/kohya_gui/records.json). Run: PYTHONPATH=. python benchmarks/gui_files.py"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from kohya_tuner import config_io  # noqa: E402
from kohya_tuner.errors import UserError  # noqa: E402
from test_kohya_gui_oracle import DATA, RECORDS, expected  # noqa: E402


def main() -> int:
    start = time.perf_counter()
    read = ti = other = wrong = matched = compared = 0
    for rec in RECORDS:
        try:
            loaded = config_io.read_config(DATA / "inputs" / rec["source"])
        except UserError as exc:
            if rec["kind"] == "textual_inversion" and "Textual Inversion" in exc.message:
                ti += 1
            elif rec["kind"] == "not_a_config" and "not a kohya_ss GUI settings file" in exc.message:
                other += 1
            else:
                wrong += 1
            continue
        read += 1
        if rec["kind"] not in ("lora", "dreambooth", "finetune") or not rec.get("toml"):
            wrong += 1
            continue
        compared += 1
        argv = rec["argv"]
        tail = argv[argv.index("<CONFIG_TOML>") + 1:]
        over = {t.split("=")[0][2:] for t in tail if t.startswith("--")}
        got = {**loaded.config, **loaded.ignored}
        exp = expected(rec)
        at = next(i for i, a in enumerate(argv) if a.endswith(".py"))
        same = loaded.script == rec["script"] and loaded.launch == argv[2:at] and all(
            got.get(k) == exp.get(k) for k in set(got) | set(exp) if k not in over)
        matched += same
    print(f"GUI files read: {read}/{len(RECORDS)} ({ti} textual inversion and {other} non-config refused by name)")
    print(f"recorded commands matched key for key: {matched}/{compared}")
    print(f"misread or refused wrongly: {wrong}; {1000 * (time.perf_counter() - start):.0f} ms in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
