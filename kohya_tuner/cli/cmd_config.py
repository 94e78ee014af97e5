"""`kohya-tuner config`: write sd-scripts config files for a GPU, job and model."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from kohya_tuner import planfiles, planning, presets, schema, sdscripts
from kohya_tuner.cli import plan_options as po
from kohya_tuner.cli.common import console, print_json, user_errors, warn
from kohya_tuner.errors import UserError
from kohya_tuner.families import get_family
from kohya_tuner.gpu import choose

def plan_to_json(plan: presets.Plan, dataset: dict, files: dict[str, Path] | None, extra: dict) -> dict:
    return {
        "model": plan.family.name,
        "variant": plan.variant,
        "job": plan.job,
        "gpu_gb": plan.gpu_gb,
        "gpu_class": plan.gpu_class,
        "script": plan.family.script,
        "config": plan.config,
        "dataset": dataset,
        "files": {k: str(v) for k, v in (files or {}).items()},
        "provenance": {k: {"layer": s.layer, "why": s.why} for k, s in plan.provenance.items()},
        **extra,
    }


def render_plan_table(plan: presets.Plan, title: str) -> Table:
    table = Table(title=title, show_lines=False, expand=False)
    table.add_column("setting", style="cyan", no_wrap=True)
    table.add_column("value", no_wrap=False, max_width=40)
    table.add_column("layer", style="magenta", no_wrap=True)
    table.add_column("why", max_width=70)
    for key in sorted(plan.config):
        src = plan.provenance.get(key)
        value = plan.config[key]
        shown = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
        table.add_row(key, shown, src.layer if src else "", src.why if src else "")
    return table


def register(app: typer.Typer) -> None:
    @app.command("config")
    @user_errors
    def config_cmd(
        model: str = typer.Option(..., "--model", "-m", help="Model family: sd15, sdxl or flux."),
        job: str = typer.Option(..., "--job", "-j", help="What you train: character, style or concept."),
        gpu: str = typer.Option(..., "--gpu", "-g", help="GPU memory in GB (e.g. 12), or 'auto' to read it through NVML."),
        out: Path = typer.Option(..., "--out", "-o", help="Folder for config.toml, dataset.toml, launch.sh and launch.bat."),
        base: po.Base = None,
        clip_l: po.ClipL = None,
        t5xxl: po.T5xxl = None,
        ae: po.Ae = None,
        data: po.Data = None,
        name: po.Name = "lora",
        trigger: po.Trigger = None,
        steps: po.Steps = None,
        variant: po.Variant = None,
        preset: po.Preset = None,
        set_: po.Sets = [],
        sd_scripts: Optional[Path] = typer.Option(None, "--sd-scripts", help="sd-scripts checkout written into launch.sh/.bat."),
        no_fit: bool = typer.Option(False, "--no-fit", help="Write the composed presets as they are, without the memory fit."),
        force: bool = typer.Option(False, "--force", help="Replace existing files (the old ones are kept as .bak)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    ):
        """Write sd-scripts config files tuned to your GPU, job and model, with every choice explained."""
        family = get_family(model)
        choice = choose(gpu)
        if data is not None and not data.is_dir():
            raise UserError(f"--data {data} is not a folder." if data.exists() else f"--data {data} does not exist.",
                            "Point --data at the folder that holds your training images.")
        inputs, missing = planning.model_inputs(family, base=base, clip_l=clip_l, t5xxl=t5xxl, ae=ae, name=name, out=out,
                                       steps=steps)
        plan = presets.compose(family.name, job, choice.gb, preset_file=preset, sets=set_, variant=variant,
                               inputs=inputs, bf16=choice.bf16)
        dataset = presets.build_dataset(plan, data if data is not None else Path(out) / "images", trigger)
        fitted = planning.fit_plan(plan, dataset, choice.gb, others_gib=choice.others_gib,
                                   gpu_name=choice.info.name if choice.info else None, bf16=choice.bf16,
                                   do_fit=not no_fit)
        dataset = fitted.dataset
        est = fitted.estimate
        if not fitted.fits and not no_fit:
            raise UserError(f"No {family.label} {job} config fits {choice.gb} GB: {fitted.fit.message}.",
                            "Try a smaller --set network_dim or resolution, or --no-fit to write the preset anyway.")
        schema.raise_if_invalid(presets.validate_plan(plan, dataset), "The composed config")
        schema.raise_if_invalid(schema.validate_dataset(dataset, family), "The dataset config")
        checkout = sdscripts.locate(sd_scripts)
        sd_path = checkout.path if checkout else sdscripts.default_dir()
        files = planfiles.render(plan, dataset, out, sd_scripts=Path(sd_path).absolute())
        written = planfiles.write(files, out, force=force)
        warnings = []
        if missing:
            warnings.append(f"Model files not given: {', '.join(missing)}. Add them before training "
                            f"(config.toml has no path for them yet).")
        if data is None:
            warnings.append(f"No --data folder given: dataset.toml points at {Path(out).absolute() / 'images'}; "
                            "put your images there or edit image_dir.")
        if choice.info and choice.info.processes:
            others = ", ".join(f"{p.name} ({p.used_gib or 0:.1f} GiB)" for p in choice.info.processes)
            warnings.append(f"Other processes hold GPU memory: {others}.")
        if checkout is None:
            warnings.append(f"No sd-scripts checkout found; launch.sh expects one at {sd_path} "
                            "(run `kohya-tuner setup`, or set SD_SCRIPTS).")
        if as_json:
            print_json(plan_to_json(plan, dataset, written, {
                "gpu": choice.describe(), "warnings": warnings, "budget_gib": round(fitted.budget_gib, 3),
                "estimate": est.to_json(),
                "fit": [s.model_dump() for s in fitted.fit.steps] if fitted.fit else None,
                "fit_message": fitted.fit.message if fitted.fit else None, "assumed": fitted.assumed}))
            return
        console.print(f"[bold]{family.label}[/bold] LoRA, job [bold]{job}[/bold], GPU {choice.describe()} "
                      f"→ preset class {plan.gpu_class} GB")
        console.print(render_plan_table(plan, "config.toml"))
        share = est.peak_gib / fitted.budget_gib if fitted.budget_gib > 0 else float("inf")
        console.print(f"Estimated peak: [bold]{est.peak_gib:.2f} GiB[/bold] ({est.peak_phase}), "
                      f"{share:.0%} of the {fitted.budget_gib:.2f} GiB a {choice.gb} GB card leaves for training"
                      + (" — [red]does not fit[/red]" if not fitted.fits else "") + ".")
        for note in fitted.notes:
            console.print(f"  {note}")
        for w in warnings:
            warn(w)
        console.print("Wrote:")
        for p in written.values():
            console.print(f"  {p}")
        console.print(f"Train with: [bold]sh {written['launch.sh']}[/bold] (or launch.bat on Windows)")
