"""Every option of every command that names a file or folder, read from the commands' own
parsers (so an option added later is covered without editing a list), and a working
command line for each command to put one such option into.

An option names a file when its metavar is one of FILE_METAVARS; `test_fault_file_options`
checks that every option typed as a path carries one, so the rule cannot drift."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"
FILE_METAVARS = {"FILE", "DIR", "CONFIG", "LOG", "PATH"}
# Where the command writes (the user's own choice); every other file option is only read.
OUTPUTS = {"--out", "--json-events", "--dir"}
COMMANDS = [("run", None), ("config", None), ("estimate", None), ("fit", None), ("check", None),
            ("diagnose", None), ("dataset", "check"), ("dataset", "prep"), ("doctor", None), ("setup", None)]


@dataclass(frozen=True)
class FileOption:
    command: tuple[str, ...]  # ("dataset", "prep")
    flag: str | None  # None for a positional
    position: int  # index among the positionals, for a positional
    metavar: str
    dest: str

    @property
    def name(self) -> str:
        return " ".join(self.command) + " " + (self.flag or f"<{self.metavar}>")

    @property
    def is_dir(self) -> bool:
        return self.metavar == "DIR"

    @property
    def writes(self) -> bool:
        return self.flag in OUTPUTS


def parser_actions(name: str, sub: str | None) -> list[argparse.Action]:
    from kohya_tuner.cli.app import build_command_parser

    parser, _module = build_command_parser(name)
    actions = parser._actions
    if sub is not None:
        subs = next(a for a in actions if isinstance(a, argparse._SubParsersAction))
        actions = subs.choices[sub]._actions
    return [a for a in actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def file_options() -> list[FileOption]:
    found = []
    for name, sub in COMMANDS:
        command = (name,) + ((sub,) if sub else ())
        position = 0
        for a in parser_actions(name, sub):
            if not a.option_strings:
                if a.metavar in FILE_METAVARS:
                    found.append(FileOption(command, None, position, a.metavar, a.dest))
                position += 1
            elif a.metavar in FILE_METAVARS:
                long = next((s for s in a.option_strings if s.startswith("--")), a.option_strings[0])
                found.append(FileOption(command, long, 0, a.metavar, a.dest))
    return found


# ---- the user's files ---------------------------------------------------------------------

CONFIG_TEXT = ('pretrained_model_name_or_path = "/models/sd15.safetensors"\nnetwork_module = "networks.lora"\n'
               'network_dim = 8\nnetwork_alpha = 4\nresolution = "512,512"\ntrain_batch_size = 1\n'
               'mixed_precision = "fp16"\nlearning_rate = 1e-4\nmax_train_steps = 100\n')


def make_world(root: Path) -> dict[str, Path]:
    """Valid targets for every file option, each one on its own so a test can watch it."""
    root.mkdir(parents=True, exist_ok=True)
    w = {}
    w["config"] = root / "cfg.toml"
    w["config"].write_text(CONFIG_TEXT, encoding="utf-8")
    w["dataset"] = root / "dataset.toml"
    w["images"] = root / "imgs"
    w["images"].mkdir()
    for i in range(3):
        Image.new("RGB", (512, 512), (40 * i, 90, 10)).save(w["images"] / f"p{i}.png")
        (w["images"] / f"p{i}.txt").write_text(f"ohwx, picture {i}\n", encoding="utf-8")
    w["dataset"].write_text(f'[[datasets]]\nresolution = 512\nbatch_size = 1\n[[datasets.subsets]]\n'
                            f'image_dir = "{w["images"]}"\nnum_repeats = 2\n', encoding="utf-8")
    w["preset"] = root / "preset.toml"
    w["preset"].write_text('[settings]\nnetwork_dim = 8\n', encoding="utf-8")
    w["log"] = root / "train.log"
    w["log"].write_text("steps:  10%|#   | 10/100 [00:10<01:30, 1.00it/s]\ntorch.OutOfMemoryError: CUDA out of "
                        "memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 11.76 GiB of which "
                        "1.02 GiB is free.\n", encoding="utf-8")
    w["model"] = root / "model.safetensors"
    w["model"].write_bytes(b"\0" * 64)
    w["config"].write_text(CONFIG_TEXT.replace("/models/sd15.safetensors", str(w["model"])), encoding="utf-8")
    w["accelerate"] = root / "accelerate.yaml"
    w["accelerate"].write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_processes: 1\n",
                               encoding="utf-8")
    w["sd_scripts"] = root / "sd-scripts"
    shutil.copytree(STANDIN, w["sd_scripts"], ignore=shutil.ignore_patterns("__pycache__"))
    from kohya_tuner.families import FAMILIES

    for fam in FAMILIES.values():  # every family's entry script, so `run` plans each one
        script = w["sd_scripts"] / fam.script
        if not script.exists():
            script.write_text(f"from standin_trainer import main\n\nif __name__ == '__main__':\n"
                              f"    main({fam.script!r}, 'flux')\n", encoding="utf-8")
    git = w["sd_scripts"] / ".git"  # what sdscripts reads of a checkout without git's help
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n", encoding="utf-8")
    (git / "refs" / "heads" / "main").write_text("48d368fa" + "0" * 32 + "\n", encoding="utf-8")
    w["python"] = Path(sys.executable)
    w["run"] = root / "failed_run"  # a run folder for --continue: see make_run
    return w


def make_run(world: dict[str, Path], env: dict[str, str]) -> None:
    """world["run"]: a real run on the stand-in that failed at step 6 of 8, with states at
    2 and 4, its journal, log, summary and report, a secrets file and a stale lock."""
    argv = ["run", "-m", "sd15", "-j", "style", "-g", "8", "--cpu", "--data", str(world["images"]), "--out",
            str(world["run"]), "--sd-scripts", str(world["sd_scripts"]), "--steps", "8", "--base",
            str(world["model"]), "--set", "save_every_n_steps=2", "--set", "wandb_api_key=not-a-real-key"]
    res = subprocess.run([sys.executable, "-m", "kohya_tuner", *argv], timeout=300, capture_output=True, text=True,
                         env={**os.environ, **env, "PYTHONPATH": str(REPO), "STANDIN_ERROR_AT_STEP": "6"})
    assert res.returncode == 1 and (world["run"] / "attempts.jsonl").is_file(), res.stdout + res.stderr
    assert len(list((world["run"] / "output").glob("*-state"))) == 2, res.stdout
    # An attempt that was launched but whose journal line was lost (its log and config on
    # disk): `--continue` reads its config to place it, so that reader is reached too.
    shutil.copy(world["run"] / "attempt-1.config.toml", world["run"] / "attempt-2.config.toml")
    (world["run"] / "attempt-2.log").write_text("steps:   0%|          | 0/8\n", encoding="utf-8")
    (world["run"] / ".kohya-tuner.lock").write_text(json.dumps({"pid": 2**22 + 7, "start_time": 1, "host": socket.gethostname(),
                                                                 "since": "then", "command": "run"}))


def valid_value(opt: FileOption, world: dict[str, Path], out: Path) -> str:
    """A value the option takes on a working command line; a new option with none fails here."""
    key = {
        "config": "config", "log": "log", "path": "images", "dataset": "dataset", "dataset_config": "dataset",
        "preset": "preset", "data": "images", "sd_scripts": "sd_scripts", "python": "python",
        "accelerate_config": "accelerate",
    }.get(opt.dest)
    if opt.flag == "--continue":  # the run folder is this command's --out: a copy of its own
        copy = out / "run"
        if not copy.exists():
            shutil.copytree(world["run"], copy, symlinks=True)
            # Its records name their own folder, as if planned there (a plain copy is refused).
            for name in ("run.json", "attempts.jsonl"):
                f = copy / name
                if f.is_file():
                    f.write_text(f.read_text(encoding="utf-8").replace(str(world["run"]), str(copy)),
                                 encoding="utf-8")
        return str(copy)
    if opt.flag == "--out":
        return str(out / ("fitted.toml" if opt.command == ("fit",) else "out"))
    if opt.flag == "--gui-json":  # an output: a bare name goes into --out (beside it for fit)
        return "gui.json"
    if opt.flag == "--json-events":
        return str(out / "events.jsonl")
    if opt.flag == "--dir":
        return str(out / "sd-scripts")
    if key is None and opt.metavar == "FILE" and opt.command[0] in ("run", "config"):
        key = "model"  # --base, --clip-l, --t5xxl, ...: model files, read by the trainer only
    if key is None:
        raise AssertionError(f"{opt.name}: no valid value known; add one to fileoptions.valid_value")
    return str(world[key])


def family_for(opt: FileOption):
    """The first model family that takes `opt` (a model file only some families use), else SD 1.5."""
    from kohya_tuner.families import FAMILIES

    for fam in FAMILIES.values():
        if opt.flag in fam.required_files.values():
            return fam
    return FAMILIES["sd15"]


def base_line(command: tuple[str, ...], world: dict[str, Path], out: Path, family=None) -> tuple[list[str], list[str]]:
    """(positionals, options) of a command line that works, for one file option to go into;
    `run` and `config` plan `family` with every model file it needs."""
    from kohya_tuner.families import FAMILIES

    w = {k: str(v) for k, v in world.items()}
    family = family or FAMILIES["sd15"]
    models = [a for flag in family.required_files.values() for a in (flag, w["model"])]
    return {
        ("run",): ([], ["-m", family.name, "-j", "style", "-g", "24", "--cpu", "--dry-run", "--data", w["images"],
                        "--out", str(out / "out"), "--sd-scripts", w["sd_scripts"], "--steps", "8", *models]),
        ("config",): ([], ["-m", family.name, "-j", "style", "-g", "24", "--data", w["images"], "--out",
                           str(out / "out"), "--sd-scripts", w["sd_scripts"], *models]),
        ("estimate",): ([w["config"]], ["-m", "sd15", "-g", "8"]),
        ("fit",): ([w["config"]], ["-g", "8", "--out", str(out / "fitted.toml")]),
        ("check",): ([w["config"]], ["-m", "sd15", "--dataset-config", w["dataset"]]),
        ("diagnose",): ([w["log"]], []),
        ("dataset", "check"): ([w["images"]], ["-m", "sd15"]),
        ("dataset", "prep"): ([w["images"]], ["-m", "sd15", "--out", str(out / "out")]),
        # The probe of the trainer's Python imports torch: seconds on a slow machine, bounded here.
        ("doctor",): ([], ["--timeout", "4"]),
        # A clone that fails at once (no network is ever used): the file options are judged first.
        ("setup",): ([], ["--dir", str(out / "sd-scripts"), "--repo-url", str(out / "no-such-repo")]),
    }[command]


def with_value(opt: FileOption, value: str, world: dict[str, Path], out: Path) -> list[str]:
    """The working command line with `opt` set to `value` (replacing the base line's own)."""
    if opt.flag == "--continue":
        return ["run", "--continue", value, "--dry-run"]
    positionals, options = base_line(opt.command, world, out, family_for(opt))
    positionals, options = list(positionals), list(options)
    if opt.flag is None:
        positionals[opt.position] = value
    else:
        aliases = _aliases(opt) | EXCLUDES.get((opt.command, opt.flag), set())
        kept = []
        skip = False
        for a in options:
            if skip:
                skip = False
                continue
            if a in aliases:
                skip = True
                continue
            kept.append(a)
        options = kept + [f"{opt.flag}={value}" if value.startswith("-") else opt.flag] + (
            [] if value.startswith("-") else [value])
    return [*opt.command, *positionals, *options]


# Options a file option cannot be given with (the base line's are dropped for it).
EXCLUDES = {(("setup",), "--sd-scripts"): {"--dir", "--repo-url"}}


def _aliases(opt: FileOption) -> set[str]:
    name, sub = opt.command[0], (opt.command[1] if len(opt.command) > 1 else None)
    for a in parser_actions(name, sub):
        if a.dest == opt.dest:
            return set(a.option_strings)
    return {opt.flag}


def run_batch(cases: list[dict], scratch: Path, timeout: float) -> list[dict]:
    """Run `cases` through batchrun.py in one child; a case that hangs the child is reported
    as "hung" (the child killed) and the rest are run in a new child."""
    results: list[dict] = []
    pending = list(enumerate(cases))
    while pending:
        todo = pending
        spec = scratch / "cases.json"
        spec.write_text(json.dumps([c for _, c in todo]), encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "100"}
        try:
            proc = subprocess.run([sys.executable, str(Path(__file__).with_name("batchrun.py")), str(spec)], env=env,
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
            lines, killed = proc.stdout.splitlines(), False
        except subprocess.TimeoutExpired as exc:
            lines, killed = (exc.stdout or b"").decode("utf-8", "replace").splitlines(), True
        done = [json.loads(line) for line in lines if line.startswith("{")]
        finished = {d["i"] for d in done if "i" in d}
        started = [d["start"] for d in done if "start" in d]
        for d in done:
            if "i" in d:
                results.append({**todo[d["i"]][1], **d, "i": todo[d["i"]][0]})
        if killed or (started and started[-1] not in finished):
            stuck = started[-1] if started else 0
            results.append({**todo[stuck][1], "i": todo[stuck][0], "rc": "hung" if killed else "child died",
                            "elapsed": None, "output": ""})
            pending = todo[stuck + 1:]
        else:
            pending = []
    return sorted(results, key=lambda r: r["i"])


# ---- special files ---------------------------------------------------------------------

SPECIAL_KINDS = ["fifo", "/dev/zero", "link to /dev/zero", "dangling link", "wrong kind", "folder of fifos",
                 "folder of device links"]


def special_value(opt: FileOption, kind: str, world: dict[str, Path], root: Path) -> str | None:
    """`kind` made for `opt` under `root`, named like the option's valid value (a FIFO called
    `fitted.toml` for fit --out); None where the kind does not apply."""
    root.mkdir(parents=True, exist_ok=True)
    if kind == "/dev/zero":
        return "/dev/zero"
    if kind.startswith("folder of") and (not opt.is_dir or opt.writes):
        return None
    name = Path(valid_value(opt, world, root / "valid")).name
    where = root / "special"
    where.mkdir(parents=True, exist_ok=True)
    p = where / name
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "link to /dev/zero":
        p.symlink_to("/dev/zero")
    elif kind == "dangling link":
        p.symlink_to(where / "nowhere")
    elif kind == "wrong kind":  # a folder where a file belongs, a file where a folder belongs
        if opt.is_dir:
            p.write_text("x\n")
        else:
            p.mkdir()
    else:  # the option's own valid folder, every file in it a FIFO or a link to a device
        shutil.copytree(valid_value(opt, world, root / "valid"), p, symlinks=True, dirs_exist_ok=True)
        for f in folder_files(p):
            replace_with(f, "fifo" if kind == "folder of fifos" else "device link")
    return str(p)


def folder_files(folder: Path) -> list[Path]:
    """Every regular file under `folder`, deepest first."""
    return sorted((f for f in folder.rglob("*") if f.is_file() and not f.is_symlink()), reverse=True)


def replace_with(f: Path, kind: str) -> None:
    f.unlink()
    if kind == "fifo":
        os.mkfifo(f)
    else:
        f.symlink_to("/dev/zero")
