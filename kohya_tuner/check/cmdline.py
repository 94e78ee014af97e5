"""What sd-scripts' argparse makes of a command line, with argparse itself.

An entry script's parser is rebuilt from the pinned schema (vendor/sd-scripts/args.json): every
argument is a single `--name` option, a `store_true` flag or a typed value (`int`, `float`, `str`,
sd-scripts' int-or-float, lists with `nargs="*"`), with its `choices`; the parser has argparse's
defaults (`allow_abbrev=True`, `-h/--help`). Parsing the user's tokens with it gives argparse's
own verdict: the values as the script receives them, or the message it would exit 2 with.
Values from `--config_file` never pass here (see docs/check.md, Two paths).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from kohya_tuner.check import argschema


class Refused(Exception):
    """argparse's error (it would print usage and exit 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse calls this instead of raising
        raise Refused(message)

    def exit(self, status: int = 0, message: str | None = None):
        raise Refused(message or "the command line asks for the help text (-h/--help) and trains nothing")

    def print_help(self, file=None) -> None:
        raise Refused("the command line asks for the help text (-h/--help) and trains nothing")


def _int_or_float(value: str) -> int | float:
    # sd-scripts' converter for lr_warmup_steps / lr_decay_steps: "N%" is a fraction, a number
    # of 1 or more must be written as an int (int("1.5") fails), anything below 1 is a float.
    if value.endswith("%"):
        try:
            return float(value[:-1]) / 100.0
        except ValueError:
            raise argparse.ArgumentTypeError(f"Value '{value}' is not a valid percentage") from None
    try:
        return int(value) if float(value) >= 1 else float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{value}' is not an int or float") from None


_TYPES = {"int": int, "float": float, "str": str, "int_or_float": _int_or_float}


@lru_cache(maxsize=None)
def parser_for(script: str) -> _Parser:
    p = _Parser(prog=script, argument_default=argparse.SUPPRESS)
    for name, spec in argschema.script_args(script).items():
        kw: dict[str, Any] = {"dest": name}
        if spec.is_flag:
            kw["action"] = "store_true"
        elif spec.type == "list":
            kw["nargs"] = spec.nargs or "*"
            kw["type"] = float if spec.item_type == "float" else str
        else:
            kw["type"] = _TYPES.get(spec.type, str)
            if spec.nargs:
                kw["nargs"] = spec.nargs
        if spec.choices:
            kw["choices"] = list(spec.choices)
        p.add_argument(f"--{name}", **kw)
    return p


@dataclass
class Parsed:
    values: dict[str, Any]
    refusal: str | None = None
    # "--network_di" -> "network_dim": prefixes argparse resolved to a full option name.
    abbreviations: dict[str, str] = field(default_factory=dict)


def parse(script: str, tokens: list[str]) -> Parsed:
    """argparse's reading of the tokens after the script name."""
    names = argschema.script_args(script)
    try:
        ns = parser_for(script).parse_args(tokens)
    except Refused as e:
        return Parsed({}, str(e).strip())
    abbreviations: dict[str, str] = {}
    for tok in tokens:
        if tok.startswith("--") and len(tok) > 2:
            given = tok[2:].partition("=")[0]
            if given not in names and given != "help":
                full = [n for n in names if n.startswith(given)]
                if len(full) == 1:
                    abbreviations[f"--{given}"] = full[0]
    return Parsed(dict(vars(ns)), None, abbreviations)
