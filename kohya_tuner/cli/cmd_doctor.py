"""`kohya-tuner doctor`: check the machine and the trainer's environment."""

from __future__ import annotations

import argparse
from pathlib import Path

from kohya_tuner.cli.argtypes import finite_float

DESCRIPTION = (
    "Check everything training depends on: NVIDIA driver and GPUs (memory, compute capability, bf16), "
    "programs holding GPU memory, host RAM and swap, free disk, the trainer's Python, torch and its CUDA "
    "build, accelerate, xformers, bitsandbytes, the sd-scripts checkout and its pinned requirements, and "
    "PYTORCH_CUDA_ALLOC_CONF. Works without a GPU or torch. Exit 1 when a check fails (something present "
    "is broken), else 0."
)
_MARK = {"pass": "[green]pass[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[bold red]fail[/bold red]"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sd-scripts", type=Path, metavar="DIR",
                   help="The sd-scripts checkout (default: $KOHYA_SD_SCRIPTS or the one `setup` cloned).")
    p.add_argument("--python", metavar="PATH",
                   help="The Python that runs training (default: a venv inside the checkout, else this one).")
    p.add_argument("--model", "-m", help="Judge host RAM for this model family (sd15, sdxl, flux, sd3, chroma, …).")
    p.add_argument("--timeout", type=finite_float(1.0, 3600.0), default=None, metavar="S",
                   help="Seconds to wait for the trainer's Python to answer.")
    p.add_argument("--json", action="store_true", help="Print one JSON object.")


def run(args: argparse.Namespace) -> int:
    from kohya_tuner import doctor
    from kohya_tuner.cli.common import print_json

    timeout = args.timeout if args.timeout is not None else doctor.DEFAULT_TIMEOUT
    facts = doctor.gather(args.sd_scripts, args.python, args.model, timeout)
    checks = doctor.evaluate(facts)
    code = doctor.exit_code(checks)
    if args.json:
        print_json({
            "status": "fail" if code else ("warn" if any(c.status == "warn" for c in checks) else "pass"),
            "exit_code": code,
            "checks": [c.to_dict() for c in checks],
            "python": facts.probe.to_dict() if facts.probe else None,
        })
    else:
        _render(checks)
    return code


def _render(checks) -> None:
    from rich.markup import escape
    from rich.table import Table

    from kohya_tuner.cli.common import console

    table = Table(show_header=True, header_style="bold", show_lines=True)
    table.add_column("", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("finding")
    for c in checks:
        text = escape(c.detail) + (f"\n[dim]→ {escape(c.fix)}[/dim]" if c.fix and c.status != "pass" else "")
        table.add_row(_MARK[c.status], escape(c.name), text)
    console.print(table)
    fails = [c.name for c in checks if c.status == "fail"]
    warns = [c.name for c in checks if c.status == "warn"]
    from kohya_tuner.cli.common import paragraph

    if fails:
        lead = f"{len(fails)} problem(s) to fix before training:"
        paragraph(", ".join(fails), lead=lead, lead_style="bold red")
    elif warns:
        paragraph(f"No broken parts; {len(warns)} warning(s): {', '.join(warns)}")
    else:
        console.print("[green]Ready to train.[/green]")
