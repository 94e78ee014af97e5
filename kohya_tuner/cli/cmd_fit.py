"""`kohya-tuner fit`: change the fewest, cheapest settings until a config fits a GPU."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kohya_tuner.cli.argtypes import gpu_size, out_path, positive_int

if TYPE_CHECKING:
    from kohya_tuner import ladder

DESCRIPTION = ("Write a copy of CONFIG changed just enough to fit the GPU, and say what each change costs. "
               "Exit 0 when it fits, 1 when nothing fits, 2 for bad input.")
POLICIES = ("default", "roadmap")

def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except (OSError, RuntimeError):  # Python before 3.13 raises RuntimeError on a symbolic link loop
        return False


def _dataset_out_path(out: Path) -> Path:
    return out.with_name(out.stem + ".dataset.toml")


def _gui_path(given: Path | None, out: Path, taken: list[Path | None]) -> Path | None:
    """Where `--gui-json` goes: beside --out, never onto an input or another output."""
    if given is None:
        return None
    from kohya_tuner import outpaths
    from kohya_tuner.errors import UserError

    path = outpaths.extra_file(given, out.absolute().parent, "--gui-json")
    if not path.name.endswith(".json"):
        raise UserError(f"--gui-json {given} does not end in .json; the kohya_ss GUI opens .json files only.")
    if any(p is not None and (_same_file(path, p) or path.absolute() == p.absolute()) for p in taken):
        raise UserError(f"--gui-json {given} is the input, the dataset or another output of this fit; choose "
                        "another name.")
    return path


def _refuse_existing(files: list[tuple[Path, str, bool]]) -> None:
    """Before anything is written: a file that exists with other content is the user's."""
    from kohya_tuner.errors import UserError
    from kohya_tuner.fileio import holds_exactly

    for path, body, _secret in files:
        if (path.exists() or path.is_symlink()) and not holds_exactly(path, body):
            raise UserError(f"{path} already exists; kohya-tuner never overwrites your files.",
                            "Choose another --out, or pass --force (the old file is kept as .bak).")


def _prompts_text(path: str, gui_input: Path | None) -> str | None:
    """The prompts for the GUI's prompts field: from a GUI file given as input, its own prompts
    field (the GUI writes the file sample_prompts names from it at each start); else the text of
    the prompt file; None when neither can be read."""
    import json

    from kohya_tuner import safeio
    from kohya_tuner.errors import UserError

    try:
        if gui_input is not None:
            text = json.loads(safeio.read_text(gui_input, "The kohya_ss file")).get("sample_prompts")
            if isinstance(text, str) and text:
                return text
        return safeio.read_text(path, "The sample prompt file")
    except (UserError, OSError, ValueError, AttributeError):
        return None


def step_json(st: ladder.Step) -> dict[str, Any]:
    return {
        "move": st.move,
        "changes": [{"key": k, "old": o, "new": n} for k, o, n in st.changes],
        "saved_gib": st.saved_gib,
        "speed_cost": st.speed_cost,
        "quality_cost": st.quality_cost,
        "resume_safe": st.resume_safe,
        "reason": st.reason,
    }


def saves_text(st: ladder.Step) -> str:
    """A step of a pair that frees nothing alone says why it is there instead of "0.00"."""
    return "nothing alone (the next change needs it)" if st.saved_gib < 0.005 else f"{st.saved_gib:.2f} GiB"


# Below this width six columns cut values to "Prod… → Adaf…": one entry per change instead.
STEPS_TABLE_MIN_WIDTH = 120


def _render_steps_list(steps: list[ladder.Step]) -> None:
    """The fit's changes as a list wrapped at words: each change whole, its costs below it."""
    from rich.padding import Padding
    from rich.text import Text

    from kohya_tuner.cli.common import console
    from kohya_tuner.config_io import show_value

    console.print(Text("Changes", style="bold"))
    for st in steps:
        for key, old, new in st.changes:
            console.print(Padding(Text.assemble("• ", (key, "cyan"), f": {show_value(old)} → {show_value(new)}"),
                                  (0, 0, 0, 2), expand=False))
        resume = "resume-safe" if st.resume_safe else "not resume-safe"
        console.print(Padding(Text(f"saves {saves_text(st)}; speed: {st.speed_cost}; quality: "
                                   f"{st.quality_cost}; {resume}"), (0, 0, 0, 4), expand=False))


def render_steps(steps: list[ladder.Step]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from kohya_tuner.cli.common import console
    from kohya_tuner.config_io import show_value

    if console.width < STEPS_TABLE_MIN_WIDTH:
        _render_steps_list(steps)
        return
    table = Table(title="Changes")
    table.add_column("setting", style="cyan", no_wrap=True)
    table.add_column("old → new")
    table.add_column("saves GiB", justify="right")
    table.add_column("speed")
    table.add_column("quality")
    table.add_column("resume", justify="center")
    for st in steps:
        first = True
        for key, old, new in st.changes:
            table.add_row(escape(key), escape(f"{show_value(old)} → {show_value(new)}"), (f"{st.saved_gib:.2f}" if st.saved_gib >= 0.005 else "0 (enables next)") if first else "",
                          st.speed_cost if first else "", st.quality_cost if first else "",
                          ("[green]safe[/green]" if st.resume_safe else "[yellow]no[/yellow]") if first else "")
            first = False
    console.print(table)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path, metavar="CONFIG",
                   help="sd-scripts config TOML, kohya_ss GUI JSON, or a command-line file.")
    p.add_argument("--gpu", "-g", type=gpu_size, required=True, metavar="GB|auto",
                   help="Card size in GB (e.g. 12) or 'auto' (NVML; subtracts memory other processes hold).")
    p.add_argument("--out", "-o", type=out_path, required=True, metavar="FILE",
                   help="Where to write the fitted config TOML (never the input).")
    p.add_argument("--dataset", "-d", type=Path, metavar="FILE", help="The --dataset_config file.")
    p.add_argument("--model", "-m", help="Model family (sd15, sdxl, flux, sd2, sd3, sd35m, sd35l, chroma, lumina2, hunyuan21, anima), "
                                         "when the file does not say.")
    p.add_argument("--gpus", type=positive_int, default=1, metavar="N",
                   help="Number of GPUs it trains on (data parallel): the fit is for each card, which holds the "
                        "whole model and DDP's gradient buckets.")
    p.add_argument("--policy", choices=POLICIES, default="default",
                   help="default: most GiB per cost, quality-keeping moves first; roadmap: the guides' fixed "
                        "order.")
    p.add_argument("--gui-json", type=out_path, metavar="FILE",
                   help="Also write the fitted config as a kohya_ss GUI file (LoRA tab) that launches the same "
                        "training; a bare name goes beside --out. docs/kohya-gui.md.")
    p.add_argument("--force", action="store_true", help="Replace an existing --out (the old file is kept as .bak).")
    p.add_argument("--no-history", action="store_true", help="Ignore measured peaks of earlier runs.")
    p.add_argument("--json", action="store_true", help="Print one JSON object.")


def run(args: argparse.Namespace) -> int:
    from kohya_tuner import config_io, history, ladder
    from kohya_tuner.cli.cmd_estimate import load_inputs, resolve_gpu
    from kohya_tuner.cli.common import console, gpu_json, print_json, say, warn
    from kohya_tuner.config_io import show_value
    from kohya_tuner.errors import UserError
    from kohya_tuner.memory import budget_gib

    config, gpu, out, dataset, model = args.config, args.gpu, args.out, args.dataset, args.model
    policy, force, no_history, as_json = args.policy, args.force, args.no_history, args.json
    if _same_file(config, out):
        raise UserError(f"--out {out} is the input file; kohya-tuner never writes over your config.",
                        "Choose another --out.")
    if dataset is not None and _same_file(dataset, out):
        raise UserError(f"--out {out} is the dataset file; choose another --out.")
    loaded, family, ds, notes = load_inputs(config, model, dataset)
    from kohya_tuner import outpaths

    outpaths.config_file_name(out)
    gui_path = _gui_path(args.gui_json, out, [config, dataset, out, _dataset_out_path(out)])
    outpaths.confine(loaded.config, None, what=f"{config}")
    choice, gpu_name = resolve_gpu(gpu)
    assert choice is not None
    others = choice.others_gib
    budget = budget_gib(choice.gb, other_processes_gib=others, driver=choice.driver)
    if budget <= 0:
        raise UserError(f"Other processes hold {others:.2f} GiB of the {choice.gb} GB card; nothing is left.")
    hist = [] if no_history or not gpu_name else history.load()
    from kohya_tuner.dataset.caches import done_phases

    result = ladder.fit(loaded.config, family, budget, policy=policy, dataset=ds, history=hist,
                        gpu_name=gpu_name, gpu_gb=choice.gb, bf16=choice.bf16 is not False,
                        caches_done=done_phases(family.name, loaded.config, ds), driver=choice.driver,
                        gpus=args.gpus)
    corrected = [a for a in result.after.assumptions if a.startswith("scaled by")]

    written: Path | None = None
    dataset_written: Path | None = None
    backups: list[Path] = []  # where --force kept the files it replaced
    gui_written: dict | None = None
    if result.fits:
        from kohya_tuner.assumed import unmerge

        # What the input only assumed stays an assumption in the fitted file, not a setting.
        new_config = unmerge(dict(result.config), loaded.assumed)
        pending: list[tuple[Path, str, bool]] = []  # written once every refusal has had its say
        dataset_changed = any(k.startswith("dataset:") for st in result.steps for k, _, _ in st.changes)
        if dataset_changed and result.dataset is not None:
            dpath = _dataset_out_path(out)
            if any(_same_file(dpath, p) for p in [config] + ([dataset] if dataset else [])):
                raise UserError(f"{dpath} would overwrite an input file; choose another --out.")
            pending.append((dpath, config_io.dumps_dataset(
                result.dataset, header=f"Fitted by kohya-tuner for {choice.gb} GB"), False))
            dataset_written = dpath
            new_config["dataset_config"] = str(dpath.absolute())
        why = {}
        for st in result.steps:
            for key, old, new in st.changes:
                if not key.startswith("dataset:"):
                    why[key] = (f"kohya-tuner fit for {choice.gb} GB: was {show_value(old)}; saves "
                                f"{st.saved_gib:.2f} GiB; speed: {st.speed_cost}; quality: {st.quality_cost}")
        header = (f"Fitted by kohya-tuner for a {choice.gb} GB GPU from {config.name}.\n"
                  f"Predicted peak {result.after.peak_gib:.2f} GiB ({result.after.peak_phase}) of a "
                  f"{budget:.2f} GiB budget.")
        from kohya_tuner.check import gate

        gate(new_config, family.script, dataset=result.dataset if result.dataset is not None else ds,
             what="The fitted config", family=family.name)
        text = config_io.dumps_config(new_config, why=why, script=family.script, header=header,
                                      assumed=loaded.assumed, family=family)
        from kohya_tuner import redact

        gui = None
        if gui_path is not None:  # made before anything is written, so a refusal leaves no file behind
            from kohya_tuner import gui_export

            gui = gui_export.for_config(new_config, family.script, dataset_config=new_config.get("dataset_config") or (
                str(dataset.absolute()) if dataset else None), launch=loaded.launch,
                read_prompts=lambda path: _prompts_text(path, config if loaded.fmt == "kohya_gui_json" else None))
        # A config holding a wandb or Hugging Face token is readable by its owner only.
        private = bool(redact.split(new_config)[1])
        pending.append((out, text, private))
        if gui is not None:
            pending.append((gui_path, gui.dumps(), private))
            gui_written = {"path": str(gui_path), "additional_parameters": gui.additional, "notes": gui.notes}
        if not force:
            _refuse_existing(pending)
        for path, body, secret in pending:
            kept = config_io.write_new(path, body, force=force, private=secret)
            if kept is not None:
                backups.append(kept)
        written = out

    if as_json:
        print_json({
            "fits": result.fits,
            "message": result.message,
            "model": family.name,
            "gpu_gb": choice.gb,
            "gpu_name": gpu_name,
            "others_gib": round(others, 3),
            "budget_gib": round(budget, 3),
            "policy": policy,
            "before": result.before.to_json(),
            "after": result.after.to_json(),
            "steps": [step_json(s) for s in result.steps],
            "resume_safe": result.resume_safe,
            "hints": result.hints,
            "gpu": gpu_json(choice.gb, gpu_name, others, budget, result.fits, choice.describe()),
            "history_notes": corrected,
            "out": str(written) if written else None,
            "dataset_out": str(dataset_written) if dataset_written else None,
            "backups": [str(b) for b in backups],
            "input": {"path": str(config), "format": loaded.fmt, "script": loaded.script, "notes": notes},
            "assumptions": list(getattr(loaded, "assumptions", []) or []) + list(result.after.assumptions),
            "cautions": list(result.cautions),
            "gui_json": gui_written,
        })
    else:
        for n in notes:
            warn(n)
        console.print(f"Before: {result.before.peak_gib:.2f} GiB ({result.before.peak_phase}); budget "
                      f"{budget:.2f} GiB for {choice.gb} GB"
                      + (f" minus {others:.2f} GiB held by other processes" if others else "") + ".")
        for line in corrected:
            say(f"History: {line}.")
        if result.steps:
            render_steps(result.steps)
        say(result.message, "green" if result.fits else "red")
        from kohya_tuner.cli.cmd_estimate import monitor_line

        say(monitor_line(result.after))
        for h in result.hints:
            say(f"hint: {h}")
        if not result.resume_safe:
            console.print("[yellow]A state saved with the old config cannot be resumed under the new one "
                          "(rank, alpha, network_args, optimizer or text-encoder training changed).[/yellow]")
        for c in result.cautions:
            say(f"caution: {c}", "yellow")
        for a in getattr(loaded, "assumptions", []) or []:
            say(f"assumed: {a}")
        if written:
            say(f"Wrote {written}" + (f" and {dataset_written}" if dataset_written else "") + ".", wrap=False)
        if gui_written:
            say(f"Wrote the kohya_ss GUI file {gui_written['path']}.", wrap=False)
            for note in gui_written["notes"]:
                say(f"  kohya_ss GUI file: {note}")
        for b in backups:
            say(f"The old file is kept as {b}.", wrap=False)
    if not result.fits:
        return 1
    return 0
