"""How kohya-tuner fares with the kohya_ss GUI's files, both ways, and on configs the real trainer
trains. Prints figures; asserts nothing. Run: PYTHONPATH=. python benchmarks/gui_files.py [--real]

  * GUI files read / total, and recorded GUI commands matched key for key
    (tests/data/kohya_gui/records.json, the GUI's own output for its shipped files);
  * the accepted suite (tests/data/accepted_configs): its size, and how many `check` passes on a
    stand-in tree; with --real also the real-trainer launches (tests/integration/test_accepted_real.py,
    needs the KOHYA_TUNER_REAL_* variables; about 8 minutes);
  * the export (`config --gui-json`): family x job x 8/12/24 GB presets exported, round-tripped
    through our GUI reader to the same training, and confirmed by the GUI's own code
    (tests/data/kohya_gui/export_records.json).
"""

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from kohya_tuner import config_io  # noqa: E402
from kohya_tuner.errors import UserError  # noqa: E402
from test_kohya_gui_oracle import DATA, RECORDS, expected  # noqa: E402


def gui_files() -> None:
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


def accepted(real: bool) -> None:
    from test_accepted_real import CONFIGS, test_check_passes_every_accepted_config_without_the_trainer as check

    start = time.perf_counter()
    passed = 0
    for path in CONFIGS:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                check(path, Path(tmp))
                passed += 1
            except AssertionError as exc:
                print(f"  false refusal: {path.name}: {str(exc)[:200]}")
    print(f"accepted suite: {len(CONFIGS)} configs "
          f"({sum(p.suffix == '.toml' for p in CONFIGS)} TOML, {sum(p.suffix == '.sh' for p in CONFIGS)} command lines); "
          f"check passes {passed}/{len(CONFIGS)} on a stand-in tree ({time.perf_counter() - start:.1f} s)")
    if not real:
        print("accepted suite on the real trainer: not run (give --real; tests/integration/test_accepted_real.py)")
        return
    res = subprocess.run(["flock", "/tmp/kt-heavy.lock", sys.executable, "-m", "pytest", "-q", "-m", "realtrainer",
                          "-k", "what_the_real_trainer_trains", str(ROOT / "tests/integration/test_accepted_real.py")],
                         capture_output=True, text=True, cwd=ROOT)
    out = res.stdout.strip()
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|error)", out)}
    if not counts:  # the project's addopts make -q quieter still: no summary line, only the progress marks
        marks = "".join(re.findall(r"^([.FEsx]+)\s+\[", out, re.MULTILINE))
        counts = {"passed": marks.count("."), "failed": marks.count("F") + marks.count("E"),
                  "skipped": marks.count("s")}
    print(f"accepted suite on the real trainer: {counts.get('passed', 0)}/{len(CONFIGS)} trained and passed check "
          f"({counts.get('failed', 0)} failed, {counts.get('skipped', 0)} skipped)")


def export() -> None:
    from gui_export_cases import NOT_EXPORTED, GPUS, cases, oracle_cases
    from test_gui_export import round_trip
    from test_kohya_gui_export_oracle import RECORDS as GUI_RECORDS
    from test_kohya_gui_export_oracle import test_the_gui_launches_our_training as gui_confirms

    from kohya_tuner import presets

    start = time.perf_counter()
    total = len(list(cases())) + len(NOT_EXPORTED) * len(presets.JOBS) * len(GPUS)
    exported = same = 0
    for model, job, gb, _net in cases():
        exported += 1
        same += not round_trip(model, job, gb)[-1]
    by_case = {r["source"][:-5]: r for r in GUI_RECORDS}
    confirmed = 0
    preset_names = [n for n, c in oracle_cases().items() if c[3] == "lora" and not c[4]]
    for name in preset_names:
        try:
            gui_confirms(by_case[name])
            confirmed += 1
        except (AssertionError, KeyError):
            pass
    lyco = [n for n, c in oracle_cases().items() if c[3] != "lora" or c[4]]
    lyco_ok = 0
    for name in lyco:
        try:
            gui_confirms(by_case[name])
            lyco_ok += 1
        except (AssertionError, KeyError):
            pass
    print(f"export (config --gui-json), family x job x 8/12/24 GB presets: {exported}/{total} exported"
          + (f" ({', '.join(NOT_EXPORTED)} refused by name), " if NOT_EXPORTED else ", ")
          + f"{same}/{exported} round-tripped through our GUI reader, "
          f"{confirmed}/{exported} confirmed by the GUI's own code; LyCORIS on SD 1.5/SDXL/FLUX.1 and plans "
          f"with --set values: {lyco_ok}/{len(lyco)} confirmed ({time.perf_counter() - start:.1f} s)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", action="store_true", help="also launch the accepted suite on the real trainer")
    args = ap.parse_args()
    gui_files()
    accepted(args.real)
    export()
    return 0


if __name__ == "__main__":
    sys.exit(main())
