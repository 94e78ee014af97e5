"""`kohya-tuner diagnose`: read a training log and say what happened and what to change."""

from __future__ import annotations

import argparse
from pathlib import Path

from kohya_tuner import jsontext
from kohya_tuner.cli.argtypes import exit_status

DESCRIPTION = ("Read a training log: outcome, phase, step, OOM figures and what to change. Exit 0 whenever a "
               "diagnosis was made (also for a failed run); 2 when the file cannot be read as a log.")

_OUTCOME_STYLE = {"oom": ("red", "out of GPU memory"), "cpu_oom": ("red", "out of host RAM"),
                  "error": ("red", "failed"),
                  "success": ("green", "finished"), "incomplete": ("yellow", "did not finish")}
_PHASE_WORDS = {"model_load": "loading the model", "cache_latents": "caching latents",
                "cache_text_encoder": "caching text-encoder outputs", "first_step": "the first training step",
                "training": "training, after at least one completed step", "sampling": "generating sample images", "saving": "saving",
                "unknown": "unknown (the log does not show it)"}
_FIGURES = (("tried_gib", "tried to allocate"), ("capacity_gib", "GPU capacity"), ("free_gib", "free on the GPU"),
            ("process_in_use_gib", "held by this process"), ("allocated_gib", "allocated by PyTorch"),
            ("reserved_unallocated_gib", "reserved, unallocated"))


_EVIDENCE = {"frames": "from the traceback", "context": "from the lines before it", "after": "from the lines after it",
             "progress": "from the step bar"}


def _render(diagnosis, source: Path) -> None:
    # Every piece of user or log text goes in as a Text, never through markup: a path or a
    # message with "[bold]" in it is printed as it is.
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    from kohya_tuner.cli.common import console
    from kohya_tuner.logparse.advice import size_text
    from kohya_tuner.logparse.oomfigures import NVML_NOT_AVAILABLE_GIB

    def line(label: str, *parts) -> None:
        console.print(Text.assemble(f"{label:<9}", *parts))

    d = diagnosis
    details = d.details
    style, words = _OUTCOME_STYLE[d.outcome]
    console.print(Text(str(source), style="bold"), soft_wrap=True)
    line("Outcome:", (d.outcome, f"bold {style}"), f" — {words}")
    evidence = _EVIDENCE.get(details.phase_evidence or "")
    how = ""
    if evidence:
        how = f" ({evidence}: {details.frame})" if details.phase_evidence == "frames" and details.frame \
            else f" ({evidence})"
    line("Phase:", d.phase, f" — {_PHASE_WORDS.get(d.phase, d.phase)}{how}")
    if d.step is not None:
        total = f" of {d.total_steps}" if d.total_steps else ""
        line("Step:", f"{d.step}{total}")
    if d.last_loss is not None:
        line("Loss:", f"{d.last_loss:g} (last average)")
    if d.wrapper or d.family:
        shown = ", ".join(x for x in (d.wrapper, d.family) if x)
        source_note = " (as given)" if details.family_source == "given" else ""
        line("Run by:", f"{shown}{source_note}")
    if d.error is not None:
        line("Error:", (d.error.kind, "bold"), " — ", d.error.message)
    if d.oom is not None:
        table = Table(title="What PyTorch reported", show_header=True, expand=False)
        table.add_column("figure")
        table.add_column("size", justify="right")
        shown_any = False
        for key, label in _FIGURES:
            value = getattr(d.oom, key)
            if value is not None:
                if key == "process_in_use_gib" and details.trainer_pid is not None:
                    label = f"held by this process (PyTorch called it process {details.trainer_pid})"
                shown = size_text(value) if value < NVML_NOT_AVAILABLE_GIB else Text("no reading (NVML)")
                table.add_row(Text(label), shown)
                shown_any = True
        for pid, gib in details.other_processes:
            table.add_row(Text(f"held by another process, {pid}"), size_text(gib))
            shown_any = True
        if shown_any:
            console.print(table)
        else:
            console.print(Text("The out-of-memory message holds no figures."))
    if details.events == 0:
        console.print(Text("No training output in this log.", style="yellow"))
    if d.advice:
        console.print(Text("What to do", style="bold"))
        for i, advice in enumerate(d.advice, 1):
            # Wrapped at words, continuation lines under the advice's text.
            console.print(Padding(Text(f"{i}. {advice}"), (0, 0, 0, 2), expand=False))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("log", type=Path, metavar="LOG",
                   help="A training log: the console output of sd-scripts (stdout and stderr).")
    p.add_argument("--json", action="store_true",
                   help="Print one JSON object (outcome, phase, step, oom, error, advice).")
    p.add_argument("--model", "-m", help="Model family (sd15, sdxl, flux, sd3, chroma, lumina2, …) for sharper advice; read from the log "
                                         "when it names its script.")
    p.add_argument("--exit-code", type=exit_status, metavar="N",
                   help="The exit status the training ended with, if you know it (137 = killed for lack of RAM).")
    p.add_argument("--events", action="store_true",
                   help="Print every event read from the log, one JSON object per line, before the diagnosis.")


def run(args: argparse.Namespace) -> int:
    from kohya_tuner.cli.common import print_json
    from kohya_tuner.errors import UserError
    from kohya_tuner.families import get_family
    from kohya_tuner.logparse import diagnose
    from kohya_tuner.logparse.reader import iter_events, open_log

    log = args.log
    family = get_family(args.model).name if args.model else None
    source = open_log(log)
    # Without --events nobody sees single bar updates: fold them, which reads a long log
    # several times faster and gives the same diagnosis.
    stream = iter_events(source, coalesce_progress=not args.events)
    if args.events:
        stream = _echo(stream)
    try:
        diagnosis = diagnose(stream, args.exit_code, family=family)
    except UnicodeError as exc:  # a decoder that cannot go on despite replacement
        raise UserError(f"{log} cannot be decoded as text: {exc}.") from None
    if args.json:
        print_json(diagnosis.to_json())
        return 0
    _render(diagnosis, log)
    return 0


def _echo(stream):
    import sys

    for ev in stream:
        sys.stdout.write(jsontext.dumps(ev.to_dict()) + "\n")
        yield ev
