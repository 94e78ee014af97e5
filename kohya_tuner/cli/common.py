"""Helpers shared by the command modules: consoles, JSON output, user errors."""

from __future__ import annotations

import json
import sys
from functools import wraps
from typing import Any, Callable

import typer
from rich.console import Console

from kohya_tuner.errors import UserError

# Tables and progress go to stdout; warnings and the one-paragraph errors to stderr.
console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def print_json(data: Any) -> None:
    """One JSON object on stdout, nothing else, so other tools can read it."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def fail(message: str, hint: str | None = None) -> None:
    raise UserError(message, hint)


def warn(message: str) -> None:
    err_console.print(f"[yellow]warning:[/yellow] {message}", soft_wrap=True)


def user_errors(fn: Callable) -> Callable:
    """Turn a UserError raised anywhere below a command into one paragraph and exit 2."""

    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            err_console.print(f"[bold red]error:[/bold red] {exc.paragraph()}", soft_wrap=True, markup=True,
                              highlight=False)
            raise typer.Exit(2)

    return wrapper
