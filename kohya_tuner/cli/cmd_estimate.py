"""`kohya-tuner estimate`: predict the peak VRAM of a config and explain it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kohya_tuner.cli.argtypes import gpu_size, positive_int

if TYPE_CHECKING:
    from kohya_tuner import config_io
    from kohya_tuner.families import Family
    from kohya_tuner.gpu import GpuChoice
    from kohya_tuner.memory import Estimate

DESCRIPTION = "Predict the peak VRAM of a LoRA config and show where it goes."

PHASE_LABELS = {
    "model_load": "loading the models",
    "cache_latents": "caching latents",
    "cache_text_encoder": "caching text-encoder outputs",
    "training": "training step",
    "sampling": "sample images",
    "saving": "saving",
}


def load_inputs(config_path: Path, model: str | None, dataset_path: Path | None
                ) -> tuple[config_io.LoadedConfig, Family, dict[str, Any] | None, list[str]]:
    """The config, its family and its dataset (when readable), plus notes for the user.
    Shared with `fit`."""
    from kohya_tuner import config_io
    from kohya_tuner.errors import UserError

    loaded = config_io.read_config(config_path, model)
    from kohya_tuner.check import not_lora, not_lora_message

    from kohya_tuner.memory.finetune import family_for as fine_tune_family

    if not_lora(loaded.script) and not fine_tune_family(loaded.script):
        raise UserError(not_lora_message(loaded.script))
    if loaded.family is None:
        raise UserError(f"Cannot tell which model {config_path} trains (no script name, network module or model "
                        f"path gives it away).", "Say it with --model (sd15, sdxl, flux, sd2, sd3, sd35m, sd35l, chroma, lumina2, hunyuan21 or anima).")
    notes = list(loaded.notes)
    dataset = None
    if dataset_path is not None:
        dataset = config_io.read_dataset(dataset_path)
    elif loaded.dataset_path:
        candidate = Path(loaded.dataset_path).expanduser()
        if not candidate.is_absolute():
            candidate = Path(config_path).parent / candidate
        if candidate.is_file():
            try:
                dataset = config_io.read_dataset(candidate)
                notes.append(f"read the dataset file {candidate}")
            except UserError as exc:
                notes.append(f"could not read the dataset file {candidate}: {exc.message}")
        else:
            from kohya_tuner import safeio

            notes.append(f"the dataset file {candidate} is {safeio.describe(candidate)}, not a file: estimated "
                         "without it (batch size and resolution from the config)")
    # The one gate: what sd-scripts would refuse at start-up is refused here too (exit 2).
    from kohya_tuner.check import gate

    result = gate(loaded.config, loaded.family.script, dataset=dataset, what=f"{config_path}", **loaded.check_args())
    notes.extend(str(w) for w in result.warnings)
    return loaded, loaded.family, dataset, notes


def resolve_gpu(gpu: str | None) -> tuple[GpuChoice | None, str | None]:
    from kohya_tuner.gpu import choose

    if gpu is None:
        return None, None
    choice = choose(gpu)
    return choice, (choice.info.name if choice.info else None)


def monitor_line(est: Estimate) -> str:
    from kohya_tuner.memory.monitor import context_gib, loading_mode

    driver = f"driver {est.driver}" if est.driver else "driver not known"
    return (f"PyTorch allocates {est.allocated_gib:.2f} GiB at most and its allocator reserves "
            f"{est.reserved_gib:.2f} GiB (the peak: what decides an out-of-memory); a GPU monitor (nvidia-smi) "
            f"shows about {est.monitor_gib:.2f} GiB for the process, with the CUDA context's "
            f"{context_gib(est.driver):.2f} GiB ({loading_mode(est.driver)} module loading, {driver}).")


def render_estimate(est: Estimate, *, gpu_gb: int | None = None, others_gib: float = 0.0,
                    assumptions: list[str] | None = None, cautions: list[str] = ()) -> None:
    from rich.padding import Padding
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from kohya_tuner.cli.common import console
    from kohya_tuner.memory import GPU_SIZES, budget_gib

    console.print(f"[bold]{est.model}[/bold]: peak [bold]{est.peak_gib:.2f} GiB[/bold] while "
                  f"{PHASE_LABELS.get(est.peak_phase, est.peak_phase)}")
    console.print(monitor_line(est))
    table = Table(title=f"Where the memory goes ({PHASE_LABELS.get(est.peak_phase, est.peak_phase)})")
    table.add_column("part", style="cyan", no_wrap=True)
    table.add_column("GiB", justify="right")
    table.add_column("", no_wrap=True)
    table.add_column("what", max_width=70)
    total = max(est.peak_gib, 1e-9)
    for key, value in sorted(est.components_gib.items(), key=lambda kv: -kv[1]):
        if value <= 0.0005 and key not in est.component_notes:
            continue
        bar = "█" * int(round(30 * value / total))
        table.add_row(key.replace("_", " "), f"{value:.2f}", Text(bar, style="green"),
                      escape(est.component_notes.get(key, "")))
    table.add_row("[bold]peak[/bold]", f"[bold]{est.peak_gib:.2f}[/bold]", "", "")
    console.print(table)
    phases = Table(title="Phases")
    phases.add_column("phase", no_wrap=True)
    phases.add_column("GiB", justify="right")
    for name, value in est.phases_gib.items():
        mark = " ◀ peak" if name == est.peak_phase else ""
        phases.add_row(PHASE_LABELS.get(name, name), f"{value:.2f}{mark}")
    console.print(phases)
    fits = Table(title="Fits a card of")
    for g in GPU_SIZES:
        fits.add_column(f"{g} GB", justify="center")
    fits.add_row(*[("[green]yes[/green]" if est.fits(g, other_gib=others_gib) else "[red]no[/red]")
                   for g in GPU_SIZES])
    console.print(fits)
    if gpu_gb is not None:
        b = budget_gib(gpu_gb, other_processes_gib=others_gib, driver=est.driver)
        verdict = "fits" if est.peak_gib <= b else "does NOT fit"
        console.print(f"On your {gpu_gb} GB card: budget {b:.2f} GiB"
                      + (f" (after {others_gib:.2f} GiB held by other processes)" if others_gib else "")
                      + f" — {verdict}.")
    for c in cautions:
        console.print(Text.assemble(("caution: ", "bold yellow"), c))
    assumptions = list(est.assumptions) if assumptions is None else assumptions
    if assumptions:
        console.print("[bold]Assumed[/bold] (the input left these unsaid):")
        for line in assumptions:
            # Wrapped at words, continuation lines under the text (never read as markup).
            console.print(Padding(Text(f"• {line}"), (0, 0, 0, 2), expand=False))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path, metavar="CONFIG",
                   help="sd-scripts config TOML, kohya_ss GUI JSON, or a file holding the accelerate launch / "
                        "python command line.")
    p.add_argument("--dataset", "-d", type=Path, metavar="FILE",
                   help="The --dataset_config file (its batch size and resolution win).")
    p.add_argument("--model", "-m", help="Model family (sd15, sdxl, flux, sd2, sd3, sd35m, sd35l, chroma, lumina2, hunyuan21, anima), "
                                         "when the file does not say.")
    p.add_argument("--gpu", "-g", type=gpu_size, metavar="GB|auto",
                   help="Your card in GB (e.g. 12) or 'auto' (NVML: also subtracts other processes).")
    p.add_argument("--gpus", type=positive_int, default=1, metavar="N",
                   help="Number of GPUs (data parallel); the estimate is per GPU.")
    p.add_argument("--no-history", action="store_true", help="Ignore measured peaks of earlier runs.")
    p.add_argument("--json", action="store_true", help="Print one JSON object.")


def run(args: argparse.Namespace) -> int:
    from kohya_tuner import history
    from kohya_tuner.cli.common import gpu_json, print_json, warn
    from kohya_tuner.memory import budget_gib, estimate

    loaded, family, ds, notes = load_inputs(args.config, args.model, args.dataset)
    choice, gpu_name = resolve_gpu(args.gpu)
    hist = [] if args.no_history or not gpu_name else history.load()
    from kohya_tuner.dataset.caches import done_phases

    est = estimate(loaded.config, family, dataset=ds, gpus=args.gpus, history=hist, gpu_name=gpu_name,
                   caches_done=done_phases(family.name, loaded.config, ds), driver=choice.driver if choice else None)
    others = choice.others_gib if choice else 0.0
    # What the reader guessed (a family read from a truncated GUI file) comes first: it
    # changes everything below it.
    assumptions = list(getattr(loaded, "assumptions", []) or []) + list(est.assumptions)
    cautions: list[str] = []
    if choice is not None:
        from kohya_tuner.ladder import cautions as budget_cautions

        budget = budget_gib(choice.gb, other_processes_gib=others, driver=choice.driver)
        # Cautions are for a config that fits; one that does not gets the plain verdict.
        if est.peak_gib <= budget:
            cautions = budget_cautions(est.peak_gib, budget, choice.gb, driver=choice.driver)
    if args.json:
        out = est.to_json()
        out["assumptions"] = assumptions
        out["cautions"] = cautions
        out["input"] = {"path": str(args.config), "format": loaded.fmt, "script": loaded.script, "notes": notes}
        if choice is not None:
            b = budget_gib(choice.gb, other_processes_gib=others, driver=choice.driver)
            out["gpu"] = gpu_json(choice.gb, gpu_name, others, b, est.peak_gib <= b, choice.describe())
        print_json(out)
        return 0
    for n in notes:
        warn(n)
    render_estimate(est, gpu_gb=choice.gb if choice else None, others_gib=others, assumptions=assumptions,
                    cautions=cautions)
    return 0
