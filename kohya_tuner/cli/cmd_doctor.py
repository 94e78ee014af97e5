"""`kohya-tuner doctor`: check the machine and the trainer's environment."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from kohya_tuner import doctor
from kohya_tuner.cli.common import console, print_json, user_errors

_MARK = {"pass": "[green]pass[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[bold red]fail[/bold red]"}


def register(app: typer.Typer) -> None:
    app.command(
        "doctor",
        short_help="Check the whole training environment: GPU, driver, RAM, disk, torch, xformers, bitsandbytes, sd-scripts.",
        help=(
            "Check everything training depends on: NVIDIA driver and GPUs (memory, compute capability, bf16), "
            "programs holding GPU memory, host RAM and swap, free disk, the trainer's Python, torch and its CUDA "
            "build, accelerate, xformers, bitsandbytes, the sd-scripts checkout and its pinned requirements, and "
            "PYTORCH_CUDA_ALLOC_CONF. Works without a GPU or torch. Exit 1 when a check fails (something present "
            "is broken), else 0."
        ),
    )(doctor_command)


@user_errors
def doctor_command(
    sd_scripts: Optional[Path] = typer.Option(None, "--sd-scripts", help="The sd-scripts checkout (default: $KOHYA_SD_SCRIPTS or the one `setup` cloned)."),
    python: Optional[str] = typer.Option(None, "--python", help="The Python that runs training (default: a venv inside the checkout, else this one)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Judge host RAM for this model family (sd15, sdxl, flux)."),
    timeout: float = typer.Option(doctor.DEFAULT_TIMEOUT, "--timeout", min=1.0, help="Seconds to wait for the trainer's Python to answer."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    facts = doctor.gather(sd_scripts, python, model, timeout)
    checks = doctor.evaluate(facts)
    code = doctor.exit_code(checks)
    if json_out:
        print_json({
            "status": "fail" if code else ("warn" if any(c.status == "warn" for c in checks) else "pass"),
            "exit_code": code,
            "checks": [c.to_dict() for c in checks],
            "python": facts.probe.to_dict() if facts.probe else None,
        })
    else:
        _render(checks)
    raise typer.Exit(code)


def _render(checks: list[doctor.Check]) -> None:
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
    if fails:
        console.print(f"[bold red]{len(fails)} problem(s) to fix before training:[/bold red] {escape(', '.join(fails))}",
                      soft_wrap=True)
    elif warns:
        console.print(f"No broken parts; {len(warns)} warning(s): {escape(', '.join(warns))}", soft_wrap=True)
    else:
        console.print("[green]Ready to train.[/green]")
