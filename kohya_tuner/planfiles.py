"""The files a plan becomes: config.toml, dataset.toml, launch.sh, launch.bat."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kohya_tuner import config_io, fileio
from kohya_tuner.presets import SAMPLE_PROMPTS_NAME, Plan, sample_prompts_text
from kohya_tuner.shellquote import cmd_percent, cmd_quote, cmd_set, cmd_uncarriable, comment_text, sh_quote

CONFIG_NAME = "config.toml"
DATASET_NAME = "dataset.toml"
CONFIG_HEADER_MARK = "written by kohya-tuner"  # on the first line of every config.toml written


@dataclass
class PlanFiles:
    texts: dict[str, str]  # file name -> content
    private: frozenset[str] = frozenset()  # written 0600: they hold a secret (redact.secret_keys)
    left_out: dict[str, str] = field(default_factory=dict)  # file name -> why it is not written
    gpu_ids: tuple[int, ...] = ()  # the cards the launch scripts train on (--gpus)

    def paths(self, out_dir: Path) -> dict[str, Path]:
        return {name: out_dir / name for name in self.texts}


_SCRIPT_MARK = "@SCRIPT@"


def accelerate_args(mixed_precision: str, gpu_ids: tuple[int, ...] = ()) -> list[str]:
    """accelerate's own options, exactly as `kohya-tuner run` passes them for the cards of
    `--gpus` (the launcher builds both, so a hand-run launch.sh trains like `run` does)."""
    from kohya_tuner.run.launcher import LaunchSpec, build_argv

    argv = build_argv(LaunchSpec(script=Path(_SCRIPT_MARK), config_file=Path("c"), dataset_config=Path("d"),
                                 mixed_precision=mixed_precision, num_processes=max(1, len(gpu_ids)),
                                 gpu_ids=tuple(gpu_ids)))
    return argv[3:argv.index(_SCRIPT_MARK)]


def _device_vars(gpu_ids: tuple[int, ...]):
    from kohya_tuner.run.launcher import device_vars

    return device_vars(tuple(gpu_ids), max(1, len(gpu_ids)))


def _sh_devices(gpu_ids: tuple[int, ...]) -> str:
    lines = []
    for var in _device_vars(gpu_ids):
        if var.default_only:
            lines.append(f'if [ -z "${{{var.name}:-}}" ]; then\n  {var.name}={sh_quote(var.value)}\nfi\n'
                         f"export {var.name}\n")
        else:
            lines.append(f"export {var.name}={sh_quote(var.value)}\n")
    return ("# The cards of --gpus, numbered as nvidia-smi numbers them.\n" + "".join(lines)) if lines else ""


def _sh_script(plan: Plan, sd_scripts: str, config_path: Path, dataset_path: Path,
               gpu_ids: tuple[int, ...] = ()) -> str:
    acc = " ".join(sh_quote(a) for a in accelerate_args(plan.config.get("mixed_precision", "no"), gpu_ids))
    return (
        "#!/usr/bin/env sh\n"
        f"# {comment_text(_purpose(plan))}\n"
        "# Set SD_SCRIPTS to your sd-scripts checkout if it is not the one below.\n"
        'if [ -z "${SD_SCRIPTS:-}" ]; then\n'
        f"  SD_SCRIPTS={sh_quote(sd_scripts)}\n"
        "fi\n"
        "# Lets PyTorch grow memory segments instead of fragmenting them (fewer OOMs late in a run).\n"
        "export PYTORCH_CUDA_ALLOC_CONF=\"${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}\"\n"
        f"{_sh_devices(gpu_ids)}"
        f"exec accelerate launch {acc} \"$SD_SCRIPTS\"/{sh_quote(plan.family.script)} \\\n"
        f"  --config_file {sh_quote(str(config_path))} \\\n"
        f"  --dataset_config {sh_quote(str(dataset_path))} \"$@\"\n"
    )


def _purpose(plan: Plan) -> str:
    return f"Trains a {plan.family.label} LoRA ({plan.job}, {plan.gpu_class} GB class) with sd-scripts."


def _bat_script(plan: Plan, sd_scripts: str, config_path: Path, dataset_path: Path,
                gpu_ids: tuple[int, ...] = ()) -> str:
    acc = " ".join(cmd_quote(a, "the accelerate option") for a in
                   accelerate_args(plan.config.get("mixed_precision", "no"), gpu_ids))
    devices = [(f"if not defined {v.name} " if v.default_only else "") + cmd_set(v.name, v.value)
               for v in _device_vars(gpu_ids)]
    body = [
        f"rem {comment_text(_purpose(plan))}",
        "rem Set SD_SCRIPTS to your sd-scripts checkout if it is not the one below.",
        f"if not defined SD_SCRIPTS {cmd_set('SD_SCRIPTS', sd_scripts, 'the sd-scripts path')}",
        *(["rem The cards of --gpus, numbered as nvidia-smi numbers them."] + devices if devices else []),
        f'accelerate launch {acc} "%SD_SCRIPTS%\\{cmd_percent(plan.family.script)}" '
        f"--config_file {cmd_quote(str(config_path), 'the config path')} "
        f"--dataset_config {cmd_quote(str(dataset_path), 'the dataset config path')} %*",
    ]
    # `!` stays literal only with delayed expansion off, whatever the machine's default.
    head = ["@echo off", "setlocal EnableExtensions DisableDelayedExpansion"]
    if not all(line.isascii() for line in body):
        # cmd.exe decodes each line in the console code page as it reads it; the file is UTF-8.
        head.append("chcp 65001 >nul")
    return "\r\n".join(head + body + [""])


def render(plan: Plan, dataset: dict[str, Any], out_dir: Path, sd_scripts: str | os.PathLike | None = None,
           assumed: dict[str, Any] | None = None, gpu_ids: tuple[int, ...] = ()) -> PlanFiles:
    """The plan's files; `assumed` (values the fit planned for that the user has not given) is
    recorded in config.toml as comments, so estimate and fit read the same plan back. The
    launch scripts train on the cards `gpu_ids` (`--gpus`; several: one process each)."""
    gpu_ids = tuple(gpu_ids)
    out_dir = Path(out_dir).absolute()
    config_path = out_dir / CONFIG_NAME
    dataset_path = out_dir / DATASET_NAME
    sd = str(sd_scripts) if sd_scripts else str(Path.home() / "sd-scripts")
    header = (f"sd-scripts --config_file for {plan.family.script}, {CONFIG_HEADER_MARK}.\n"
              f"Model {plan.family.label}, job {plan.job}, GPU class {plan.gpu_class} GB.\n"
              "Each comment says which preset layer set the value below it, and why.")
    texts = {
        CONFIG_NAME: config_io.dumps_config(plan.config, plan.why(), script=plan.family.script, header=header,
                                            assumed=assumed, family=plan.family),
        DATASET_NAME: config_io.dumps_dataset(dataset, header="sd-scripts --dataset_config, written by kohya-tuner."),
        "launch.sh": _sh_script(plan, sd, config_path, dataset_path, gpu_ids),
    }
    left_out: dict[str, str] = {}
    if bad := _bat_uncarriable(sd, config_path, dataset_path):
        # A path holding `"`, CR or LF cannot exist on Windows, so this plan can only run from a
        # POSIX shell: launch.sh carries it, and the plan is not refused for the other script's sake.
        left_out["launch.bat"] = (f"launch.bat not written: {bad}, which cmd.exe cannot quote and Windows does "
                                  "not allow in a file name; train with launch.sh")
    else:
        texts["launch.bat"] = _bat_script(plan, sd, config_path, dataset_path, gpu_ids)
    prompts = sample_prompts_text(plan, dataset)
    if prompts is not None:
        texts[SAMPLE_PROMPTS_NAME] = prompts
    from kohya_tuner import redact

    return PlanFiles(texts, frozenset({CONFIG_NAME}) if redact.split(plan.config)[1] else frozenset(), left_out,
                     gpu_ids)


def _bat_uncarriable(sd: str, config_path: Path, dataset_path: Path) -> str | None:
    """Why launch.bat cannot hold one of its paths, in words, or None."""
    for what, value in (("the sd-scripts path", sd), ("the config path", config_path),
                        ("the dataset config path", dataset_path)):
        if bad := cmd_uncarriable(str(value)):
            return f"{what} {str(value)!r} contains {bad}"
    return None


class Written(dict):
    """file name -> path written, plus `backups`: path -> where its old content went, and
    `unchanged`: the paths that already held exactly this content (left as they were)."""

    backups: dict[Path, Path]
    unchanged: set[Path]


def write(files: PlanFiles, out_dir: Path, force: bool = False) -> Written:
    """Write every file or none: existing files are checked before anything is written,
    and when one write fails (disk full, read-only) the ones already written are put
    back as they were."""
    from kohya_tuner.errors import UserError

    out_dir = Path(out_dir)
    paths = files.paths(out_dir)
    if not force:
        clash = [p for name, p in paths.items()
                 if p.exists() and (not p.is_file() or
                                    p.read_bytes() != files.texts[name].encode("utf-8", "surrogateescape"))]
        if clash:
            names = ", ".join(str(p) for p in clash)
            raise UserError(f"{names} already exist{'s' if len(clash) == 1 else ''}; kohya-tuner never overwrites "
                            "your files.", "Choose another --out, or pass --force (old files are kept as .bak).")
    done: list[tuple[Path, Path | None, bool]] = []  # path, its backup, whether it existed
    written = Written(paths)
    written.backups = {}
    written.unchanged = set()
    for name, path in paths.items():
        existed = path.exists()
        try:
            backup = fileio.write_new(path, files.texts[name], force=force, executable=name.endswith(".sh"),
                                      private=name in files.private)
        except UserError as exc:
            undone = _undo(done)
            raise UserError(exc.message + (f" The files written before it were put back: {undone}." if undone
                                           else ""), exc.hint) from None
        done.append((path, backup, existed))
        if backup is not None:
            written.backups[path] = backup
        elif existed:  # write_new leaves a file alone only when it already holds this content
            written.unchanged.add(path)
    return written


def _undo(done: list[tuple[Path, Path | None, bool]]) -> str:
    names = []
    for path, backup, existed in reversed(done):
        try:
            if backup is not None:
                os.replace(backup, path)
            elif not existed:
                path.unlink()
            else:
                continue  # it already held this content; nothing was changed
            names.append(path.name)
        except OSError:
            pass
    return ", ".join(reversed(names))


@dataclass
class GuiFile:
    name: str  # the file's path under --out, as PlanFiles names its files
    export: Any  # gui_export.GuiExport


def add_gui_json(files: PlanFiles, plan: Plan, out_dir: Path, path: Path) -> GuiFile:
    """Add the plan as a kohya_ss GUI file (`config --gui-json`) to the files written together:
    it points the GUI at the plan's dataset.toml and holds the prompt file's text."""
    from kohya_tuner import gui_export, outpaths, redact
    from kohya_tuner.errors import UserError

    root = Path(out_dir).absolute()
    target = outpaths.extra_file(path, root, "--gui-json").absolute()
    name = Path(os.path.relpath(os.path.normpath(target), os.path.normpath(root))).as_posix()
    if name in files.texts:
        raise UserError(f"--gui-json {path} is the plan's own {name}; choose another name.",
                        "e.g. --gui-json kohya_gui.json")
    if not name.endswith(".json"):
        raise UserError(f"--gui-json {path} does not end in .json; the kohya_ss GUI opens .json files only.",
                        f"Name it {Path(name).stem or 'kohya_gui'}.json.")
    export = gui_export.for_plan(plan, str(root / DATASET_NAME), files.texts.get(SAMPLE_PROMPTS_NAME),
                                 gpu_ids=files.gpu_ids)
    files.texts[name] = export.dumps()
    if redact.split(plan.config)[1]:
        files.private = files.private | {name}
    return GuiFile(name, export)
