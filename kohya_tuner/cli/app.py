"""The `kohya-tuner` command: argparse, one module per command, each imported only when it runs.

`kohya-tuner --help` lists the commands from the table below without importing any of
them, and `kohya-tuner CMD ...` imports `cmd_CMD` alone; a command imports its domain
modules inside `run()`. That keeps every command's start-up near a bare interpreter's.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import Sequence

# name -> (module under kohya_tuner.cli, one-line summary). Order is the order shown in --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("cmd_run", "Train a LoRA with sd-scripts; on out-of-memory downgrade and resume."),
    "config": ("cmd_config", "Write sd-scripts config files tuned to your GPU, job and model."),
    "estimate": ("cmd_estimate", "Predict the peak VRAM of a LoRA config and show where it goes."),
    "fit": ("cmd_fit", "Change the fewest, cheapest settings until a config fits a GPU."),
    "check": ("cmd_check", "Would the pinned sd-scripts start training with this config? Every start-up rule."),
    "diagnose": ("cmd_diagnose", "Read a training log: outcome, phase, step, OOM figures, what to change."),
    "dataset": ("cmd_dataset", "Check an image folder, or write a clean copy to train from."),
    "doctor": ("cmd_doctor", "Check GPU, driver, RAM, disk, torch, xformers, bitsandbytes, sd-scripts."),
    "setup": ("cmd_setup", "Clone sd-scripts at the pinned commit, or verify an existing checkout."),
}

DESCRIPTION = ("End CUDA out-of-memory for LoRA training with Kohya's sd-scripts: configs that fit your GPU, "
               "their predicted VRAM, start-up checks, log diagnosis, and training with automatic OOM recovery.")


class ArgumentError(Exception):
    """A command line argparse could not take; turned into one paragraph and exit 2."""

    def __init__(self, message: str, prog: str):
        super().__init__(message)
        self.message = message
        self.prog = prog


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing and exiting, so errors take the same path as
    every other user error (one paragraph, or the JSON error object under --json)."""

    def error(self, message: str):  # type: ignore[override]
        raise ArgumentError(message, self.prog)


def formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(prog, max_help_position=30, width=_help_width())


def _help_width() -> int:
    import shutil

    return max(60, min(shutil.get_terminal_size((80, 24)).columns, 100))


def new_parser(prog: str, description: str | None) -> Parser:
    return Parser(prog=prog, description=description, formatter_class=formatter, allow_abbrev=False)


def _wrap_columns(stream) -> int:
    """The width to wrap plain text at: the terminal's, or COLUMNS; output piped to another
    program (no COLUMNS) is not wrapped, so it can be searched line by line."""
    import os
    import shutil

    if os.environ.get("COLUMNS", "").isdigit() or (hasattr(stream, "isatty") and stream.isatty()):
        return max(40, shutil.get_terminal_size((80, 24)).columns)
    return 10**6


def _top_help() -> str:
    from kohya_tuner import __version__

    import textwrap

    # Wrapped at words to the terminal (80 columns when it cannot be told), summaries
    # indented under their command name.
    cols = _wrap_columns(sys.stdout)
    width = max(len(n) for n in COMMANDS)
    lines = ["usage: kohya-tuner [--version] COMMAND [ARGS] ...", "", *textwrap.wrap(DESCRIPTION, cols), "",
             "commands:"]
    indent = " " * (width + 4)
    for name, (_m, summary) in COMMANDS.items():
        lines += textwrap.wrap(summary, cols, initial_indent=f"  {name.ljust(width)}  ", subsequent_indent=indent,
                               break_long_words=False, break_on_hyphens=False)
    lines += ["", "`kohya-tuner COMMAND --help` describes a command's options.", f"kohya-tuner {__version__}"]
    return "\n".join(lines) + "\n"


def build_command_parser(name: str):
    """The parser and the module of one command."""
    import importlib

    module_name, summary = COMMANDS[name]
    module = importlib.import_module(f"kohya_tuner.cli.{module_name}")
    parser = new_parser(f"kohya-tuner {name}", getattr(module, "DESCRIPTION", summary))
    module.add_arguments(parser)
    return parser, module


def run(argv: Sequence[str] | None = None) -> int:
    """Parse and run one command line; returns the exit status (never raises for user errors)."""
    from kohya_tuner.cli import streams

    streams.apply()
    args_in = list(sys.argv[1:] if argv is None else argv)
    if not args_in or args_in[0] in ("-h", "--help", "help"):
        sys.stdout.write(_top_help())
        return 0 if args_in else 2
    if args_in[0] == "--version":
        from kohya_tuner import __version__

        sys.stdout.write(f"kohya-tuner {__version__}\n")
        return 0
    name, rest = args_in[0], args_in[1:]
    want_json = "--json" in rest
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, list(COMMANDS), n=1)
        return _report_error(f"'{name}' is not a kohya-tuner command.",
                             (f"Did you mean '{close[0]}'? " if close else "")
                             + "`kohya-tuner --help` lists the commands.", want_json)
    from kohya_tuner.errors import UserError

    try:
        parser, module = build_command_parser(name)
        try:
            args = parser.parse_args(rest)
        except SystemExit as exc:  # --help, which argparse ends with exit 0
            return int(exc.code or 0)
        code = module.run(args)
    except ArgumentError as exc:
        return _report_error(exc.message.rstrip(".") + ".", f"`{exc.prog} --help` lists the options.", want_json)
    except UserError as exc:
        return _report_error(exc.message, exc.hint, want_json)
    except OSError as exc:
        # The filesystem refusing a path the user gave (a name too long, a device gone):
        # their input or their machine, said in one line rather than a traceback.
        from kohya_tuner.fileio import why

        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        return _report_error(f"{where}{why(exc)}.", None, want_json)
    except KeyboardInterrupt:
        sys.stderr.write("Interrupted.\n")
        return 130
    return int(code or 0)


def _report_error(message: str, hint: str | None, want_json: bool) -> int:
    if want_json:
        import json

        from kohya_tuner.cli.streams import json_ascii

        sys.stdout.write(json.dumps({"error": {"message": message, "hint": hint}}, ensure_ascii=json_ascii()) + "\n")
        sys.stdout.flush()
    # Plain text on purpose: messages carry paths and log text, which must never be read as markup,
    # nor reach the terminal as escape sequences.
    import textwrap

    from kohya_tuner.printable import printable

    text = printable(message.rstrip() + (" " + hint.strip() if hint else ""), keep_lines=True)
    # One paragraph wrapped at words to the terminal; a path or command longer than a line
    # stays whole so it can be copied.
    cols = _wrap_columns(sys.stderr)
    wrapped = "\n".join("\n".join(textwrap.wrap(part, cols, break_long_words=False, break_on_hyphens=False)
                                  or [""]) for part in f"error: {text}".split("\n"))
    sys.stderr.write(wrapped + "\n")
    sys.stderr.flush()
    return 2


def main() -> None:
    raise SystemExit(run())


if __name__ == "__main__":
    main()
