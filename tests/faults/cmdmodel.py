"""A model of how cmd.exe runs the lines of launch.bat, for machines without cmd.exe.

It covers the subset of batch syntax launch.bat uses and refuses anything else, so a
generated line the model does not understand fails the test instead of passing it.
The rules modelled (cmd.exe with command extensions on, delayed expansion off, as
the script's own `setlocal` line sets):

1. Percent expansion, per line, before anything else looks at the line (quotes do not
   protect from it): `%%` -> `%`; `%*` -> the script's arguments; `%0`..`%9` -> one
   argument; `%NAME%` -> the variable, or nothing when it is undefined; a lone `%` is
   dropped. `%~` modifiers are not modelled (refused).
2. Special characters: a `"` toggles quoting; outside quotes `^` escapes the next
   character and `& | < > ( )` are operators (a second command, a pipe, a redirection,
   a block); inside quotes all of them are literal. A line ending in an unquoted `^`
   continues on the next line (refused). Any operator outside quotes is reported, so
   a value that smuggles one in is caught.
3. Commands: `@echo off`, `rem`, `setlocal`, `chcp N >nul`, `if not defined NAME cmd`,
   `set "NAME=value"` (the value runs to the last `"`, the name ends at the first `=`),
   and an external program, whose command line (carets removed, quotes kept) is split
   by the Microsoft C runtime rules: whitespace outside quotes separates arguments; 2n
   backslashes before a `"` give n backslashes and toggle quoting; 2n+1 give n and a
   literal `"`; other backslashes are literal; `""` inside quotes is a literal `"`.
"""

from __future__ import annotations

import re


class Unmodelled(AssertionError):
    """The line uses batch syntax this model does not cover (or an operator leaked)."""


def expand_percent(line: str, env: dict[str, str], args: list[str]) -> str:
    out, i = [], 0
    while i < len(line):
        c = line[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        nxt = line[i + 1] if i + 1 < len(line) else ""
        if nxt == "%":
            out.append("%")
            i += 2
        elif nxt == "*":
            out.append(" ".join(args))
            i += 2
        elif nxt.isdigit():
            n = int(nxt)
            out.append(args[n - 1] if 0 < n <= len(args) else "")
            i += 2
        elif nxt == "~":
            raise Unmodelled(f"%~ modifier in {line!r}")
        else:
            end = line.find("%", i + 1)
            if end == -1:
                i += 1  # a lone % is dropped
                continue
            name = line[i + 1:end]
            out.append(next((v for k, v in env.items() if k.upper() == name.upper()), ""))
            i = end + 1
    return "".join(out)


def special_chars(line: str) -> tuple[str, list[str]]:
    """The line with carets consumed, and the operators found outside quotes."""
    out, ops, quoted, i = [], [], False, 0
    while i < len(line):
        c = line[i]
        if c == '"':
            quoted = not quoted
            out.append(c)
        elif quoted:
            out.append(c)
        elif c == "^":
            if i + 1 >= len(line):
                raise Unmodelled(f"line continuation in {line!r}")
            out.append(line[i + 1])
            i += 1
        elif c in "&|<>()":
            ops.append(c)
            out.append(c)
        else:
            out.append(c)
        i += 1
    return "".join(out), ops


def crt_split(cmdline: str) -> list[str]:
    args: list[str] = []
    cur: list[str] = []
    in_arg = quoted = False
    i = 0
    while i < len(cmdline):
        c = cmdline[i]
        if c in " \t" and not quoted:
            if in_arg:
                args.append("".join(cur))
                cur, in_arg = [], False
            i += 1
            continue
        in_arg = True
        if c == "\\":
            j = i
            while j < len(cmdline) and cmdline[j] == "\\":
                j += 1
            n = j - i
            if j < len(cmdline) and cmdline[j] == '"':
                cur.append("\\" * (n // 2))
                if n % 2:
                    cur.append('"')
                    i = j + 1
                else:
                    i = j
            else:
                cur.append("\\" * n)
                i = j
            continue
        if c == '"':
            if quoted and i + 1 < len(cmdline) and cmdline[i + 1] == '"':
                cur.append('"')
                i += 2
                continue
            quoted = not quoted
            i += 1
            continue
        cur.append(c)
        i += 1
    if in_arg:
        args.append("".join(cur))
    return args


def run_batch(text: str, env: dict[str, str], args: list[str],
              envs: list[dict[str, str]] | None = None) -> list[list[str]]:
    """Run launch.bat's lines; returns the argv of every external program started (and
    appends the environment each one starts with to `envs`)."""
    env = dict(env)
    started: list[list[str]] = []
    if "\r\n" not in text or re.search(r"(?<!\r)\n", text):
        raise Unmodelled("a batch file's lines end in CRLF")
    delayed_off = False
    for raw in text.split("\r\n"):
        if not raw.strip():
            continue
        line = expand_percent(raw, env, args)
        if re.match(r"rem(\s|$)", line, re.I):
            continue
        line, ops = special_chars(line)
        cmd = line.strip()
        if re.fullmatch(r"chcp \d+ >nul", cmd, re.I):
            continue
        if ops:
            raise Unmodelled(f"operators {ops} outside quotes in {raw!r}")
        if cmd.lower() == "@echo off":
            continue
        if cmd.lower().startswith("setlocal"):
            delayed_off = "disabledelayedexpansion" in cmd.lower()
            continue
        m = re.match(r"if not defined ([A-Za-z_][A-Za-z0-9_]*) (.*)$", cmd, re.I)
        if m:
            if any(k.upper() == m.group(1).upper() for k in env):
                continue
            cmd = m.group(2)
        m = re.match(r'set "(.*)"[^"]*$', cmd, re.I)
        if m:
            name, _, value = m.group(1).partition("=")
            env[name] = value
            continue
        if not delayed_off:
            raise Unmodelled("delayed expansion is not switched off before a command runs")
        started.append(crt_split(cmd))
        if envs is not None:
            envs.append(dict(env))
    return started
