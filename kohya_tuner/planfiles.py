"""The files a plan becomes: config.toml, dataset.toml, launch.sh, launch.bat."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kohya_tuner import config_io
from kohya_tuner.presets import Plan

CONFIG_NAME = "config.toml"
DATASET_NAME = "dataset.toml"


@dataclass
class PlanFiles:
    texts: dict[str, str]  # file name -> content

    def paths(self, out_dir: Path) -> dict[str, Path]:
        return {name: out_dir / name for name in self.texts}


_SCRIPT_MARK = "@SCRIPT@"


def accelerate_args(mixed_precision: str) -> list[str]:
    """accelerate's own options, exactly as `kohya-tuner run` passes them (the launcher
    builds both, so a hand-run launch.sh trains like `run` does)."""
    from kohya_tuner.launcher import LaunchSpec, build_argv

    argv = build_argv(LaunchSpec(script=Path(_SCRIPT_MARK), config_file=Path("c"), dataset_config=Path("d"),
                                 mixed_precision=mixed_precision))
    return argv[3:argv.index(_SCRIPT_MARK)]


def _sh_script(plan: Plan, sd_scripts: str, config_path: Path, dataset_path: Path) -> str:
    acc = " ".join(shlex.quote(a) for a in accelerate_args(plan.config.get("mixed_precision", "no")))
    return (
        "#!/usr/bin/env sh\n"
        f"# Trains a {plan.family.label} LoRA ({plan.job}, {plan.gpu_class} GB class) with sd-scripts.\n"
        "# Set SD_SCRIPTS to your sd-scripts checkout if it is not the one below.\n"
        f"SD_SCRIPTS=\"${{SD_SCRIPTS:-{sd_scripts}}}\"\n"
        "# Lets PyTorch grow memory segments instead of fragmenting them (fewer OOMs late in a run).\n"
        "export PYTORCH_CUDA_ALLOC_CONF=\"${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}\"\n"
        f"exec accelerate launch {acc} \"$SD_SCRIPTS/{plan.family.script}\" \\\n"
        f"  --config_file {shlex.quote(str(config_path))} \\\n"
        f"  --dataset_config {shlex.quote(str(dataset_path))} \"$@\"\n"
    )


def _bat_quote(path: str) -> str:
    return '"' + path.replace('"', '""') + '"'


def _bat_script(plan: Plan, sd_scripts: str, config_path: Path, dataset_path: Path) -> str:
    acc = " ".join(accelerate_args(plan.config.get("mixed_precision", "no")))
    return "\r\n".join([
        "@echo off",
        f"rem Trains a {plan.family.label} LoRA ({plan.job}, {plan.gpu_class} GB class) with sd-scripts.",
        "rem Set SD_SCRIPTS to your sd-scripts checkout if it is not the one below.",
        f'if "%SD_SCRIPTS%"=="" set "SD_SCRIPTS={sd_scripts}"',
        f'accelerate launch {acc} "%SD_SCRIPTS%\\{plan.family.script}" '
        f"--config_file {_bat_quote(str(config_path))} --dataset_config {_bat_quote(str(dataset_path))} %*",
        "",
    ])


def render(plan: Plan, dataset: dict[str, Any], out_dir: Path, sd_scripts: str | os.PathLike | None = None,
           ) -> PlanFiles:
    out_dir = Path(out_dir).absolute()
    config_path = out_dir / CONFIG_NAME
    dataset_path = out_dir / DATASET_NAME
    sd = str(sd_scripts) if sd_scripts else str(Path.home() / "sd-scripts")
    header = (f"sd-scripts --config_file for {plan.family.script}, written by kohya-tuner.\n"
              f"Model {plan.family.label}, job {plan.job}, GPU class {plan.gpu_class} GB.\n"
              "Each comment says which preset layer set the value below it, and why.")
    texts = {
        CONFIG_NAME: config_io.dumps_config(plan.config, plan.why(), script=plan.family.script, header=header),
        DATASET_NAME: config_io.dumps_dataset(dataset, header="sd-scripts --dataset_config, written by kohya-tuner."),
        "launch.sh": _sh_script(plan, sd, config_path, dataset_path),
        "launch.bat": _bat_script(plan, sd, config_path, dataset_path),
    }
    return PlanFiles(texts)


def write(files: PlanFiles, out_dir: Path, force: bool = False) -> dict[str, Path]:
    """Write every file or none: existing files are checked before anything is written."""
    out_dir = Path(out_dir)
    paths = files.paths(out_dir)
    if not force:
        clash = [p for name, p in paths.items() if p.exists() and p.read_bytes() != files.texts[name].encode()]
        if clash:
            from kohya_tuner.errors import UserError

            names = ", ".join(str(p) for p in clash)
            raise UserError(f"{names} already exist{'s' if len(clash) == 1 else ''}; kohya-tuner never overwrites "
                            "your files.", "Choose another --out, or pass --force (old files are kept as .bak).")
    for name, path in paths.items():
        config_io.write_new(path, files.texts[name], force=force)
        if name.endswith(".sh"):
            path.chmod(path.stat().st_mode | 0o111)
    return paths
