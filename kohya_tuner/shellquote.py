"""Quoting values into shell scripts: one helper per shell, used for every value.

Paths in launch.sh / launch.bat come from the user (`--sd-scripts`, `KOHYA_SD_SCRIPTS`,
`--out`, the data folder) and from settings (`--set mixed_precision=...`). A value
that reaches a script unquoted is a command the user runs without knowing it, so
nothing is interpolated into script text except through these functions.

POSIX sh: a single-quoted word carries every byte but NUL literally (no expansion of
`$`, backticks, `\\`, `!` or newlines inside); an embedded `'` closes the quote, adds an
escaped quote and reopens it.

cmd.exe (a .bat file, delayed expansion switched off by the script itself): percent
expansion runs before quotes are looked at, so `%` is written `%%`; inside double
quotes `& | < > ^ ( )` are literal; `!` is literal while delayed expansion is off. A
`"`, CR, LF or NUL cannot be carried through cmd.exe's parser at all (no escape works
inside a quoted argument, and a line break ends the command), so such a value is
refused (a plan whose paths hold one is written without launch.bat). The program receiving the line splits it by the Microsoft C runtime rules,
under which backslashes are literal except before a `"`: trailing backslashes are
doubled so the closing quote stays a quote.
"""

from __future__ import annotations

import re

from kohya_tuner.errors import UserError

_SH_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_CMD_SAFE = re.compile(r"[A-Za-z0-9_+:./\\-]+")
_CMD_UNCARRIABLE = re.compile(r'["\r\n\x00]')
_COMMENT_SAFE = re.compile(r"[^A-Za-z0-9 _.,:+/()-]")


def sh_quote(value: str) -> str:
    """`value` as one POSIX sh word that expands to exactly `value`."""
    value = str(value)
    if "\x00" in value:
        raise UserError(f"{value!r} contains a NUL byte, which no shell script can carry.")
    if _SH_SAFE.fullmatch(value):
        return value
    return "'" + value.replace("'", "'\\''") + "'"


# What a shown command must not carry raw: control characters (a line break aside: harmless to a
# terminal, and POSIX has no escape for it that survives command substitution), bidi overrides,
# and the lone surrogates that stand for a file name's undecodable bytes.
_UNSHOWABLE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\udc80-\udcff]+")


def display_word(value: str) -> str:
    """`value` as one word of a command shown to be copied, in plain POSIX sh (dash reads it as
    bash and zsh do): shlex's quoting, except that characters a terminal must not be sent
    (ESC, BEL, CR, C1, bidi overrides, undecodable bytes) come from printf's octal escapes,
    `"$(printf '\\033')"`, next to the quoted rest, so showing the command never sends them.
    A line break stays itself inside single quotes."""
    import os
    import shlex

    value = str(value)
    if not _UNSHOWABLE.search(value):
        return shlex.quote(value)
    out, at = [], 0
    for m in _UNSHOWABLE.finditer(value):
        if m.start() > at:
            out.append(shlex.quote(value[at:m.start()]))
        # The bytes the argument really holds (UTF-8, undecodable ones as they were); a command
        # substitution drops only trailing line breaks, and none is printed here.
        octal = "".join(f"\\{b:03o}" for b in os.fsencode(m.group()))
        out.append(f"\"$(printf '{octal}')\"")
        at = m.end()
    if at < len(value):
        out.append(shlex.quote(value[at:]))
    return "".join(out)


def cmd_uncarriable(value: str) -> str | None:
    """What in `value` cmd.exe cannot carry, in words, or None when it can."""
    found = _CMD_UNCARRIABLE.search(str(value))
    if found is None:
        return None
    return {'"': "a double quote", "\r": "a carriage return", "\n": "a line break",
            "\x00": "a NUL byte"}[found.group()]


def _refuse_cmd(value: str, what: str) -> None:
    bad = cmd_uncarriable(value)
    if bad:
        raise UserError(f"launch.bat cannot carry {what} {value!r}: it contains {bad}, which cmd.exe has no way "
                        "to quote.", "Use a folder whose path has no double quotes or line breaks "
                        "(Windows itself does not allow them in file names).")


def cmd_percent(value: str) -> str:
    """`value` safe from percent expansion in a .bat file (no quotes added)."""
    return str(value).replace("%", "%%")


def cmd_quote(value: str, what: str = "the value") -> str:
    """`value` as one argument on a .bat command line, read back exactly by programs
    that split their command line by the C runtime rules (Python, accelerate.exe)."""
    value = str(value)
    _refuse_cmd(value, what)
    if value and _CMD_SAFE.fullmatch(value) and not value.endswith("\\"):
        return value
    trailing = len(value) - len(value.rstrip("\\"))
    return '"' + cmd_percent(value) + "\\" * trailing + '"'


def cmd_set(name: str, value: str, what: str = "the value") -> str:
    """A `set "NAME=value"` command that stores exactly `value` in NAME."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"not a variable name: {name!r}")
    value = str(value)
    _refuse_cmd(value, what)
    return f'set "{name}={cmd_percent(value)}"'


def comment_text(text: str) -> str:
    """Text for a `#` or `rem` comment line: only characters that mean nothing to either
    shell (a `%` expands even inside `rem`, a trailing `^` joins the next line)."""
    return _COMMENT_SAFE.sub("?", str(text))
