"""`kohya-tuner config`: write sd-scripts config files for a GPU, job and model."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kohya_tuner.cli import plan_options
from kohya_tuner.cli.argtypes import out_path

if TYPE_CHECKING:
    from rich.table import Table

    from kohya_tuner import presets

DESCRIPTION = ("Write sd-scripts config files (config.toml, dataset.toml, launch.sh, launch.bat) tuned to your "
               "GPU, job and model, with every choice explained in the files. --verbose prints the full table of "
               "settings and why each was chosen.")

# The settings a Kohya user reads first; the compact summary shows these (when set) and the
# fit's changes. Everything else is in config.toml with its reason, and behind --verbose.
KEY_SETTINGS = (
    "network_dim", "network_alpha", "network_args", "optimizer_type", "learning_rate", "unet_lr", "text_encoder_lr",
    "lr_scheduler", "max_train_steps", "train_batch_size", "gradient_accumulation_steps", "resolution",
    "mixed_precision", "full_bf16", "full_fp16", "fp8_base", "blocks_to_swap", "gradient_checkpointing",
    "cache_latents", "cache_text_encoder_outputs", "network_train_unet_only", "sdpa", "xformers",
    "sample_every_n_steps", "save_every_n_steps",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", required=True,
                   help="Model family: sd15, sdxl, flux, sd2, sd3, sd35m, sd35l, chroma, lumina2, hunyuan21 or anima.")
    p.add_argument("--job", "-j", required=True, help="What you train: character, style or concept.")
    plan_options.add_gpu(p, required=True, arch=True)
    plan_options.add_gpus(p)
    p.add_argument("--out", "-o", type=out_path, required=True, metavar="DIR",
                   help="Folder for config.toml, dataset.toml, launch.sh and launch.bat.")
    plan_options.add_plan_options(p)
    p.add_argument("--sd-scripts", type=Path, metavar="DIR", help="sd-scripts checkout written into launch.sh/.bat.")
    p.add_argument("--no-fit", action="store_true",
                   help="Write the composed presets as they are, without the memory fit.")
    p.add_argument("--gui-json", type=out_path, metavar="FILE",
                   help="Also write the plan as a kohya_ss GUI file (LoRA tab: Configuration > Open) that launches "
                        "the same training; a bare name goes into --out. docs/kohya-gui.md.")
    p.add_argument("--force", action="store_true", help="Replace existing files (the old ones are kept as .bak).")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="Print every setting with the layer that set it and why.")
    p.add_argument("--json", action="store_true", help="Print one JSON object instead of tables.")


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


def gui_json(gui, written) -> dict | None:
    """The `gui_json` object of --json (docs/json.md): where the GUI file went and what it says."""
    if gui is None:
        return None
    return {"path": str(written[gui.name]), "additional_parameters": gui.export.additional,
            "notes": gui.export.notes}


def render_plan_table(plan: presets.Plan, title: str) -> Table:
    """Every setting with its layer and reason: wide by nature, so values and keys never wrap
    and the reason takes what is left."""
    from rich.table import Table
    from rich.text import Text

    from kohya_tuner.config_io import show_value

    table = Table(title=title, show_lines=False, expand=False)
    table.add_column("setting", style="cyan", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_column("layer", style="magenta", no_wrap=True)
    table.add_column("why", ratio=1, min_width=20)
    for key in sorted(plan.config):
        src = plan.provenance.get(key)
        # Values are paths and user text: cells are plain Text, never parsed as markup.
        table.add_row(*(Text(c) for c in (key, show_value(plan.config[key]), src.layer if src else "",
                                          src.why if src else "")))
    return table


# Below this width four columns leave the reasons a word a line: the list form reads better.
TABLE_MIN_WIDTH = 140


def print_provenance(plan: presets.Plan, title: str) -> None:
    """Every setting, the layer that set it and why: a table on a wide terminal, else one
    entry per setting (key = value [layer], the reason indented below it), wrapped at words."""
    from rich.padding import Padding
    from rich.text import Text

    from kohya_tuner.cli.common import console
    from kohya_tuner.config_io import show_value

    if console.width >= TABLE_MIN_WIDTH:
        console.print(render_plan_table(plan, title))
        return
    console.print(Text(f"{title}: every setting, the layer that set it and why", style="bold"))
    for key in sorted(plan.config):
        src = plan.provenance.get(key)
        console.print(Text.assemble((key, "cyan"), " = ", show_value(plan.config[key]),
                                    (f"  [{src.layer}]" if src else "", "magenta")))
        if src and src.why:
            console.print(Padding(Text(src.why), (0, 0, 0, 4), expand=False))


def render_summary(plan: presets.Plan, fitted, *, keys=KEY_SETTINGS) -> list[str]:
    """The compact view: lines that fit 80 columns without cutting a value (long values wrap
    at word boundaries on their own line, never get an ellipsis)."""
    from kohya_tuner.config_io import show_value

    lines = []
    shown = [k for k in keys if k in plan.config and plan.config[k] not in (None, False)]
    width = max((len(k) for k in shown), default=0)
    changed = {k for st in (fitted.fit.steps if fitted.fit else []) for k, _o, _n in st.changes}
    for key in shown:
        src = plan.provenance.get(key)
        mark = "*" if key in changed else " "
        layer = f"  ({src.layer})" if src and src.layer not in ("model", "job") else ""
        lines.append(f" {mark}{key.ljust(width)}  {show_value(plan.config[key])}{layer}")
    return lines


def run(args: argparse.Namespace) -> int:
    from rich.markup import escape
    from rich.text import Text

    from kohya_tuner import planfiles, planning, presets, schema, sdscripts
    from kohya_tuner.cli.cmd_fit import step_json
    from kohya_tuner.cli.common import console, gpu_json, print_json, say, warn
    from kohya_tuner.config_io import show_value
    from kohya_tuner.errors import UserError
    from kohya_tuner.families import get_family
    from kohya_tuner.gpu import choose_among, parse_gpus

    family = get_family(args.model)
    gpu_ids = parse_gpus(args.gpus)
    choice, cards_note = choose_among(args.gpu, gpu_ids or (0,), arch=args.gpu_arch)
    if cards_note:
        warn(cards_note)
    data, out = args.data, args.out
    if os.path.lexists(out) and not Path(out).is_dir():
        from kohya_tuner.safeio import describe

        raise UserError(f"--out {out} is {describe(out)}, not a folder.", "Give a folder for the plan's files.")
    if data is not None and not data.is_dir():
        raise UserError(f"--data {data} is not a folder." if data.exists() else f"--data {data} does not exist.",
                        "Point --data at the folder that holds your training images.")
    inputs, missing = planning.model_inputs(family, base=args.base, clip_l=args.clip_l, t5xxl=args.t5xxl,
                                            ae=args.ae, name=args.name, out=out, steps=args.steps,
                                            files=plan_options.model_files(args))
    plan = presets.compose(family.name, args.job, choice.gb, preset_file=args.preset, sets=args.sets or [],
                           variant=args.variant, inputs=inputs, bf16=choice.bf16, network=args.network)
    # The dataset check `run --data` makes; a folder still empty is one to fill later (warned below).
    data_empty = data is not None and not any(data.iterdir())
    data_warnings: list[str] = []
    if data is not None and not data_empty:
        report, _checked = planning.check_data(data, family, args.job, args.trigger, plan.config)
        # What `run --data` shows in its pre-flight (captions without the trigger, tiny images, ...).
        data_warnings = [f.message + (f" {f.fix}" if f.fix else "") for f in report.findings if f.severity == "warn"]
    images_dir = data if data is not None else Path(out) / "images"
    dataset = presets.build_dataset(plan, images_dir, args.trigger)
    fitted = planning.fit_plan(plan, dataset, choice.gb, others_gib=choice.others_gib,
                               gpu_name=choice.info.name if choice.info else None, bf16=choice.bf16,
                               gpus=max(1, len(gpu_ids)), do_fit=not args.no_fit, driver=choice.driver)
    dataset = fitted.dataset
    est = fitted.estimate
    if not fitted.fits and not args.no_fit:
        raise UserError(f"No {family.label} {args.job} config fits {choice.gb} GB: {fitted.fit.message}.",
                        fitted.refusal_hint)
    schema.raise_if_invalid(presets.validate_plan(plan, dataset), "The composed config")
    schema.raise_if_invalid(schema.validate_dataset(dataset, family), "The dataset config")
    checkout = sdscripts.locate(args.sd_scripts)
    sd_path = checkout.path if checkout else sdscripts.default_dir()
    from kohya_tuner import outpaths

    outpaths.confine(plan.config, out, what="The plan")  # nothing written outside --out
    files = planfiles.render(plan, dataset, out, sd_scripts=Path(sd_path).absolute(), assumed=fitted.assumed,
                             gpu_ids=gpu_ids)
    gui = planfiles.add_gui_json(files, plan, out, args.gui_json) if args.gui_json else None
    written = planfiles.write(files, out, force=args.force)
    warnings = list(files.left_out.values()) + data_warnings
    if data is not None and Path(out).resolve() == data.resolve():
        warnings.append(f"--out is the image folder {data}: config.toml and the files beside it, and later the "
                        "run's output/, go among the training images. Give --out a folder of its own.")
    if missing:
        warnings.append(f"Model files not given: {', '.join(missing)}. Add them before training "
                        f"(config.toml has no path for them yet).")
    warnings += planning.missing_model_files(inputs, family)
    if data_empty:
        warnings.append(f"--data {data} is empty: put the training images (and captions) in it before training.")
    if data is None:
        warnings.append(f"No --data folder given: dataset.toml points at {Path(out).absolute() / 'images'}; "
                        "put your images there or edit image_dir.")
    if choice.info and choice.info.processes:
        others = ", ".join(f"{p.name} ({p.used_gib or 0:.1f} GiB)" for p in choice.info.processes)
        warnings.append(f"Other processes hold GPU memory: {others}.")
    if checkout is None:
        warnings.append(f"No sd-scripts checkout found; launch.sh expects one at {sd_path} "
                        "(run `kohya-tuner setup`, or give --sd-scripts DIR or set KOHYA_SD_SCRIPTS).")
    cautions = list(getattr(fitted, "cautions", []) or [])
    from kohya_tuner.assumed import sentences

    assumptions = sentences(fitted.assumed)
    assumptions += [a for a in getattr(fitted, "assumptions", []) or [] if a not in assumptions]
    share = est.peak_gib / fitted.budget_gib if fitted.budget_gib > 0 else float("inf")
    if args.json:
        print_json(plan_to_json(plan, dataset, written, {
            "gpu": gpu_json(choice.gb, choice.info.name if choice.info else None, choice.others_gib,
                            fitted.budget_gib, fitted.fits, choice.describe()),
            "warnings": warnings, "cautions": cautions,
            "budget_gib": round(fitted.budget_gib, 3), "share_of_budget": round(share, 4),
            "estimate": est.to_json(), "fits": fitted.fits,
            "steps": [step_json(s) for s in fitted.fit.steps] if fitted.fit else [],
            "message": fitted.fit.message if fitted.fit else None, "assumptions": assumptions,
            "notes": list(plan.notes),
            "gui_json": gui_json(gui, written)}))
        return 0
    console.print(f"[bold]{escape(family.label)}[/bold] LoRA, job [bold]{escape(args.job)}[/bold], GPU "
                  f"{escape(choice.describe())} → preset class {plan.gpu_class} GB")
    if args.verbose:
        print_provenance(plan, "config.toml")
    else:
        say("Settings (* = changed by the fit; all, with reasons: config.toml, --verbose):")
        for line in render_summary(plan, fitted):
            say(line)
    steps = fitted.fit.steps if fitted.fit else []
    if steps:
        say("The fit changed:")
        for st in steps:
            for key, old, new in st.changes:
                say(f"  {key}: {show_value(old)} → {show_value(new)}")
            say(f"    why: {st.reason}")
    verdict = "" if fitted.fits else " — does not fit"
    console.print(Text.assemble("Estimated peak: ", (f"{est.peak_gib:.2f} GiB", "bold"),
                                f" ({est.peak_phase}), {share:.0%} of the {fitted.budget_gib:.2f} GiB a "
                                f"{choice.gb} GB card leaves for training", (verdict, "red"), "."))
    from kohya_tuner.cli.cmd_estimate import monitor_line

    say(f"  {monitor_line(est)}")
    for note in fitted.notes:
        if note and (not steps or note != fitted.fit.message):
            say(f"  {note}")
    for note in plan.notes:
        say(f"  {note}")
    for line in assumptions:
        say(f"  assumed: {line}")
    for c in cautions:
        console.print(Text.assemble(("caution: ", "bold yellow"), str(c)), soft_wrap=False)
    for w in warnings:
        warn(w)
    for note in gui.export.notes if gui else []:
        say(f"  kohya_ss GUI file: {note}")
    same = getattr(written, "unchanged", set())
    if any(p not in same for p in written.values()):
        say("Wrote:")
    for p in written.values():
        if p not in same:
            say(f"  {p}", wrap=False)
    if same:
        say("Unchanged (they already held exactly this content):")
    for p in written.values():
        if p in same:
            say(f"  {p}", wrap=False)
    for p, b in getattr(written, "backups", {}).items():
        say(f"  (the old {p.name} is kept as {b})", wrap=False)
    from kohya_tuner.shellquote import display_word

    # One unbroken line: it is a command to copy.
    console.print(Text.assemble("Train with: ", (f"sh {display_word(str(written['launch.sh']))}", "bold"),
                                "" if "launch.bat" in files.left_out else " (or launch.bat on Windows)"),
                   soft_wrap=True)
    return 0
