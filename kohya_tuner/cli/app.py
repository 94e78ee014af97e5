"""The `kohya-tuner` command: one typer app, one module per command."""

from __future__ import annotations

import importlib

import typer
import click

from kohya_tuner import __version__

app = typer.Typer(
    name="kohya-tuner",
    help=(
        "End CUDA out-of-memory for LoRA training with Kohya's sd-scripts (SD 1.5, SDXL, FLUX.1).\n\n"
        "Writes configs that fit your GPU, predicts their VRAM, reads training logs, and runs "
        "sd-scripts with automatic OOM recovery."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

# Each module defines register(app). Order is the order shown in --help.
COMMAND_MODULES = ["run", "config", "estimate", "fit", "diagnose", "dataset", "doctor", "setup"]


def _version(value: bool):
    if value:
        typer.echo(f"kohya-tuner {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version and exit."),
):
    pass


def _register_all() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(f"kohya_tuner.cli.cmd_{name}").register(app)


_register_all()


def main() -> None:
    try:
        app(standalone_mode=True)
    except click.exceptions.Abort:
        raise SystemExit(130)


if __name__ == "__main__":
    main()
