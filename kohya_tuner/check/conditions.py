"""The small condition language of rules.toml.

A condition is a table or a list of tables (a list means all of them):
  { all = [...] }  { any = [...] }  { not = {...} }
  { key = "name", <op> = operand }   one operator per leaf
Operators: true (truthy when true, falsy when false), set (not None), eq, ne, in,
not_in (add icase = true to compare strings case-insensitively), prefix, gt, ge, lt,
le, not_multiple_of (numbers only: a value of the wrong type is the type check's
business, not a rule's), len_ne, not_int_text, not_float_text, contains.
An operand may be { key = "other" } to compare two values.
"""

from __future__ import annotations

from typing import Any, Callable

from kohya_tuner.check.argschema import is_number

Lookup = Callable[[str], Any]

_OPS = ("true", "set", "eq", "ne", "in", "not_in", "prefix", "gt", "ge", "lt", "le", "not_multiple_of",
        "len_ne", "not_int_text", "not_float_text", "contains")


def _fold(v: Any, icase: bool) -> Any:
    if icase and isinstance(v, str):
        return v.lower()
    if icase and isinstance(v, (list, tuple)):
        return [x.lower() if isinstance(x, str) else x for x in v]
    return v


def _int_text(v: Any) -> bool:
    try:
        int(v)
    except (TypeError, ValueError):
        return False
    return True


def _float_text(v: Any) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True


def validate(cond: Any, where: str) -> None:
    """Raise ValueError for a malformed condition, so a typo in the data fails a test, not a user."""
    if isinstance(cond, list):
        for c in cond:
            validate(c, where)
        return
    if not isinstance(cond, dict):
        raise ValueError(f"{where}: a condition must be a table or a list, not {cond!r}")
    if "all" in cond or "any" in cond:
        validate(cond.get("all", cond.get("any")), where)
        return
    if "not" in cond:
        validate(cond["not"], where)
        return
    if "key" not in cond:
        raise ValueError(f"{where}: leaf without key: {cond!r}")
    ops = [k for k in cond if k not in ("key", "icase")]
    if len(ops) != 1 or ops[0] not in _OPS:
        raise ValueError(f"{where}: a leaf needs exactly one operator of {_OPS}, got {ops}")


def holds(cond: Any, get: Lookup) -> bool:
    if isinstance(cond, list):
        return all(holds(c, get) for c in cond)
    if "all" in cond:
        return all(holds(c, get) for c in cond["all"])
    if "any" in cond:
        return any(holds(c, get) for c in cond["any"])
    if "not" in cond:
        return not holds(cond["not"], get)
    icase = bool(cond.get("icase"))
    value = _fold(get(cond["key"]), icase)
    op = next(k for k in cond if k not in ("key", "icase"))
    arg = cond[op]
    if isinstance(arg, dict) and "key" in arg:
        arg = get(arg["key"])
    arg = _fold(arg, icase)
    if op == "true":
        return bool(value) == bool(arg)
    if op == "set":
        return (value is not None) == bool(arg)
    if op == "eq":
        return value == arg and isinstance(value, bool) == isinstance(arg, bool)
    if op == "ne":
        return value != arg
    if op == "in":
        return value in arg
    if op == "not_in":
        return value not in arg
    if op == "prefix":
        return isinstance(value, str) and isinstance(arg, str) and value.startswith(arg)
    if op == "contains":
        return isinstance(value, (str, list, tuple)) and arg in value
    if op == "not_int_text":
        return value is not None and not _int_text(value)
    if op == "not_float_text":
        return value is not None and not _float_text(value)
    if op == "len_ne":
        return isinstance(value, int) and not isinstance(value, bool) and value != arg
    if not (is_number(value) and is_number(arg)):
        return False
    if op == "gt":
        return value > arg
    if op == "ge":
        return value >= arg
    if op == "lt":
        return value < arg
    if op == "le":
        return value <= arg
    if op == "not_multiple_of":
        return arg != 0 and isinstance(value, int) and isinstance(arg, int) and value % arg != 0
    raise AssertionError(op)
