"""Helpers shared by the command modules: consoles, JSON output, warnings."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console

from kohya_tuner import jsontext


class SafeConsole(Console):
    """A Console that never lets text from the outside world act on the terminal or break
    the output: every string it renders (a print's argument, a table cell) has its control
    characters shown as escapes (printable), and a Text with one is rebuilt the same way, so
    a path, trigger or caption extension holding ESC cannot retitle or clear the terminal;
    a string whose markup does not parse (a user's `[/red]` inside our own `[bold]`) is
    printed as plain text instead of raising. Rich's own styling is added later, at render,
    and is untouched."""

    def render_str(self, text: str, **kwargs: Any):
        from rich.errors import MarkupError

        from kohya_tuner.printable import printable

        text = printable(text, keep_lines=True)
        try:
            return super().render_str(text, **kwargs)
        except MarkupError:
            return super().render_str(text, **{**kwargs, "markup": False})

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(*(_safe_text(o) for o in objects), **kwargs)


def _safe_text(obj: Any) -> Any:
    from rich.text import Text

    from kohya_tuner.printable import printable

    if isinstance(obj, Text) and printable(obj.plain, keep_lines=True) != obj.plain:
        # Escapes are longer than what they replace, so the spans cannot be kept: the
        # hostile text is shown plainly in the Text's base style.
        return Text(printable(obj.plain, keep_lines=True), style=obj.style, justify=obj.justify)
    return obj


# Tables and progress go to stdout; warnings go to stderr. The consoles look up sys.stdout and
# sys.stderr when they print, so a caller that redirects them (tests) sees the output.
console = SafeConsole(highlight=False)
err_console = SafeConsole(stderr=True, highlight=False)


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
