"""Hostile text in every option of every command that takes a value (read from the
parsers, as test_fault_file_options does for files): rich markup that does not balance
(`[/red]`), markup that does, terminal escapes and both quotes. Each on a working command
line: no exception (a MarkupError is a traceback), exit 0, 1 or 2, and no escape
sequence reaches the terminal raw.

The hunting pass found `dataset check --caption-ext "[/red]"` crashing the listing's
markup; this covers the class, for every option."""

from __future__ import annotations

import argparse

import pytest

from fileoptions import COMMANDS, FileOption, make_world, parser_actions, run_batch, with_value

VALUES = ["[/red]", "[bold]x[/bold]", "[link=file:///etc/passwd]x[/link]", "\x1b]0;PWNED\x07\x1b[2J", "Bob's \"q\" é"]
RAW = ("\x1b", "\x07")


def text_options() -> list[FileOption]:
    found = []
    for name, sub in COMMANDS:
        command = (name,) + ((sub,) if sub else ())
        position = 0
        for a in parser_actions(name, sub):
            if not a.option_strings:
                found.append(FileOption(command, None, position, a.metavar or a.dest, a.dest))
                position += 1
            elif a.nargs != 0 and not a.choices and not isinstance(a, argparse._CountAction):
                long = next((s for s in a.option_strings if s.startswith("--")), a.option_strings[0])
                found.append(FileOption(command, long, 0, a.metavar or "", a.dest))
    return found


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("textopts") / "world")


def test_hostile_text_in_every_option(world, tmp_path):
    cases = []
    opts = text_options()
    assert {"--caption-ext", "--trigger", "--name", "--set", "--job"} <= {o.flag for o in opts}
    for k, opt in enumerate(opts):
        for j, value in enumerate(VALUES):
            case = tmp_path / f"c{k}-{j}"
            case.mkdir()
            argv = with_value(opt, value, world, case / "out")
            if opt.flag == "--set":
                argv[-1] = f"output_name={value}"
            cases.append({"argv": argv, "name": f"{' '.join(opt.command)} {opt.flag or opt.metavar}",
                          "value": value, "cwd": str(case)})
    results = run_batch(cases, tmp_path, timeout=10 * len(cases) + 120)
    bad = []
    for r in results:
        out = r.get("output", "")
        where = f"{r['name']} = {r['value']!r}"
        if r["rc"] not in (0, 1, 2) or "Traceback (most recent call last)" in out:
            bad.append(f"{where}: {r['rc']}\n{out[-1500:]}")
        elif any(c in out for c in RAW):
            bad.append(f"{where}: printed an escape sequence raw\n{out[-600:]!r}")
    assert not bad, f"{len(bad)} of {len(results)}:\n" + "\n\n".join(bad)
    print(f"\n{len(results)} command lines, {len(opts)} options x {len(VALUES)} values")
