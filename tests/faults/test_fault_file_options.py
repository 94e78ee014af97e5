"""Every option of every command that names a file or a folder (read from the parsers by
fileoptions.file_options, so a new option is covered without editing this file):

* given a special file — a FIFO, /dev/zero, a link to it, a dangling link, a folder where a
  file belongs or a file where a folder belongs, a folder whose files are all FIFOs or
  device links — the command returns within 10 s, with no exception, exit 0, 1 or 2, and a
  paragraph when it refuses; an input file that is not a regular file is refused (exit 2);
* every file the option's valid folder holds (a dataset, an sd-scripts checkout, a failed
  run with its journal, states, secrets file and a stale lock) replaced, one at a time, by
  a FIFO: the same bound;
* given a valid value, nothing is written outside --out: the user's files, the working
  folder and every other folder are unchanged, whatever the option.

The commands run in one child process (batchrun.py: 10 s per command, address space
capped), a few hundred in about a minute."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from fileoptions import (FILE_METAVARS, SPECIAL_KINDS, file_options, folder_files, make_run, make_world,
                         parser_actions, replace_with, run_batch, special_value, valid_value, with_value, COMMANDS)

LIMIT = 10


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("fileopts")
    env = {"KOHYA_TUNER_HOME": str(root / "home")}  # the autouse home is per test; this is set up once
    w = make_world(root / "world")
    make_run(w, env)
    return root, w


def _report(results: list[dict]) -> None:
    """Printed under `pytest -s`: how many ran and the slowest, for docs/faults.md."""
    timed = sorted((r for r in results if r.get("elapsed") is not None), key=lambda r: -r["elapsed"])
    slow = ", ".join(f"{r['name']} [{r.get('kind', 'valid')}] {r['elapsed']:.2f} s" for r in timed[:3])
    print(f"\n{len(results)} command lines, {sum(r['elapsed'] for r in timed):.1f} s in all; slowest: {slow}")


def _failures(results: list[dict], expect_refusal) -> list[str]:
    bad = []
    for r in results:
        where = f"{r['name']} [{r.get('kind', 'valid')}]"
        out = r.get("output", "")
        if r["rc"] not in (0, 1, 2):
            bad.append(f"{where}: {r['rc']} after {r.get('elapsed')} s\n{out[-1500:]}")
        elif r["elapsed"] is not None and r["elapsed"] >= LIMIT:
            bad.append(f"{where}: took {r['elapsed']} s")
        elif r["rc"] == 2 and not out.strip():
            bad.append(f"{where}: exit 2 without a word")
        elif expect_refusal(r) and r["rc"] != 2:
            bad.append(f"{where}: exit {r['rc']}, not refused\n{out[-800:]}")
        elif "Traceback (most recent call last)" in out:
            bad.append(f"{where}: a traceback\n{out[-1500:]}")
    return bad


def test_every_option_typed_as_a_path_names_its_kind():
    """The enumeration's rule: an option whose value is a path says so in its metavar."""
    untagged = []
    for name, sub in COMMANDS:
        for a in parser_actions(name, sub):
            typed_path = a.type is Path or getattr(a.type, "__name__", "") == "out_path"
            if typed_path and a.metavar not in FILE_METAVARS:
                untagged.append(f"{name} {sub or ''} {a.option_strings or a.dest}")
    assert not untagged, untagged
    names = {o.name for o in file_options()}
    # The ones people use most, so a broken enumeration cannot pass by finding nothing.
    assert {"run --data", "config --preset", "estimate <CONFIG>", "run --continue", "dataset prep --out"} <= names


def test_special_files_in_every_file_option(world, tmp_path):
    root, w = world
    cases = []
    for k, opt in enumerate(file_options()):
        for j, kind in enumerate(SPECIAL_KINDS):
            case_root = tmp_path / f"c{k}-{j}"
            value = special_value(opt, kind, w, case_root)
            if value is None:
                continue
            cases.append({"argv": with_value(opt, value, w, case_root / "out"), "name": opt.name, "kind": kind,
                          "dest": opt.dest,
                          "cwd": str(case_root)})
    results = run_batch(cases, tmp_path, timeout=LIMIT * len(cases) + 120)
    assert len(results) == len(cases)
    # Refused (exit 2) unless the kind is one the option takes: a model may be a folder (a
    # Diffusers model, Qwen3's folder) or not exist here yet (config warns; the trainer says).
    bad = _failures(results, lambda r: not (r["dest"] in MODELS and r["kind"] in ("wrong kind", "dangling link")))
    assert not bad, f"{len(bad)} of {len(results)}:\n" + "\n\n".join(bad)
    _report(results)


MODELS = {"base", "clip_l", "t5xxl", "ae", "clip_g", "gemma2", "qwen_vl", "byt5", "qwen3", "vae"}


@pytest.mark.parametrize("kind", ["fifo", "device link"])
def test_each_file_inside_every_folder_option_replaced_by_a_special_file(world, tmp_path, kind):
    """One file at a time, so a reader behind the first refusal is reached too (a run whose
    run.json is fine but whose third state's train_state.json is a FIFO)."""
    root, w = world
    cases = []
    for k, opt in enumerate(o for o in file_options() if o.is_dir and not o.writes):
        template = Path(valid_value(opt, w, tmp_path / f"v{k}"))
        rels = [f.relative_to(template) for f in folder_files(template)]
        if kind == "device link" and opt.flag != "--continue":
            rels = rels[:3]  # the same check refuses both kinds; the run folder gets all of them
        for j, rel in enumerate(rels):
            case_root = tmp_path / f"c{k}-{j}"
            folder = case_root / template.name
            shutil.copytree(template, folder, symlinks=True)
            replace_with(folder / rel, kind)
            cases.append({"argv": with_value(opt, str(folder), w, case_root / "out"), "name": opt.name,
                          "kind": f"{kind} at {rel}", "cwd": str(case_root)})
    results = run_batch(cases, tmp_path, timeout=LIMIT * len(cases) + 120)
    bad = _failures(results, lambda r: False)
    assert not bad, f"{len(bad)} of {len(results)}:\n" + "\n\n".join(bad)
    _report(results)


def test_nothing_is_written_outside_out_for_every_file_option(world, tmp_path):
    """Each option with a valid value on a working command line: the only paths created or
    changed are under the command's own --out (the run folder for --continue, the events
    file for --json-events). Watched: the user's files, the working folder, and the rest of
    the test's folders. The user data folder (history, caches) is the program's own."""
    root, w = world
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    cases = []
    for k, opt in enumerate(file_options()):
        out = tmp_path / f"o{k}"
        argv = with_value(opt, valid_value(opt, w, out), w, out)
        cases.append({"argv": argv, "name": opt.name, "cwd": str(cwd), "watch": [str(root), str(tmp_path)],
                      "allow": [str(out)], "env": {"STANDIN_STEP_SECONDS": "0"}, "limit": 60})
    (tmp_path / "batch").mkdir()
    results = run_batch(cases, tmp_path / "batch", timeout=60 * len(cases) + 120)
    # The 10 s bound is for special files; these are ordinary lines, timed only for the report.
    bad = _failures([{**r, "elapsed": None} for r in results], lambda r: False)
    assert not bad, "\n\n".join(bad)
    # Each line really works (a refusal would prove nothing about where it writes); doctor
    # reports this machine's missing GPU with 1, setup's clone from a missing URL fails with 2.
    failing = {r["name"]: r["output"][-600:] for r in results
               if r["rc"] != 0 and not r["name"].startswith(("doctor", "setup"))}
    assert not failing, failing
    _report(results)
    escaped = {r["name"]: r["outside"] for r in results if r["outside"]}
    assert not escaped, escaped
    assert not os.listdir(cwd)
