"""Helpers shared by the command modules: consoles, JSON output, warnings."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console

from kohya_tuner import jsontext

# Tables and progress go to stdout; warnings go to stderr. The consoles look up sys.stdout and
# sys.stderr when they print, so a caller that redirects them (tests) sees the output.
console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def print_json(data: Any) -> None:
    """One JSON object on stdout, nothing else, so other tools can read it."""
    from kohya_tuner.cli.streams import json_ascii

    sys.stdout.write(jsontext.dumps(data, indent=2, ensure_ascii=json_ascii()) + "\n")
    sys.stdout.flush()


def gpu_json(gb: int | None, name: str | None, others_gib: float, budget_gib: float | None,
             fits: bool | None, described: str | None = None) -> dict[str, Any]:
    """The `gpu` object every command's JSON shares (docs/json.md)."""
    return {"gb": gb, "name": name, "others_gib": round(others_gib, 3),
            "budget_gib": None if budget_gib is None else round(budget_gib, 3), "fits": fits,
            "described": described}


def warn(message: str) -> None:
    """A warning on stderr, wrapped at word boundaries; never read as markup."""
    from rich.text import Text

    from kohya_tuner.printable import printable

    err_console.print(Text.assemble(("warning:", "yellow"), " ", printable(message, keep_lines=True)))


def say(text: str, style: str | None = None, *, wrap: bool = True) -> None:
    """A plain line on stdout (user text inside is never read as markup). wrap=False for a
    line that must stay whole to be copied, such as a path."""
    from rich.text import Text

    from kohya_tuner.printable import printable

    console.print(Text(printable(text, keep_lines=True), style=style or ""), soft_wrap=not wrap)


def paragraph(text: str, *, indent: str = "", lead: str = "", lead_style: str = "", style: str = "",
              err: bool = False) -> None:
    """One paragraph wrapped at words to the terminal; a word longer than a line (a path, a
    key=value) stays whole on its own line, so it can still be copied. `lead` starts the first
    line in `lead_style` ("refused", "warning:")."""
    import textwrap

    from rich.text import Text

    from kohya_tuner.printable import printable

    con = err_console if err else console
    full = f"{lead} {printable(text)}" if lead else printable(text)
    lines = textwrap.wrap(full, max(20, con.width), initial_indent=indent, subsequent_indent=indent + "  ",
                          break_long_words=False, break_on_hyphens=False) or [indent]
    for i, line in enumerate(lines):
        t = Text(line, style=style)
        if i == 0 and lead:
            t.stylize(lead_style, len(indent), len(indent) + len(lead))
        con.print(t, soft_wrap=True)
