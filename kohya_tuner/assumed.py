"""The one record of what a plan assumes but the user has not given yet (a T5-XXL file named
before the user has one, say).

`config` plans for such a value, writes it into config.toml as TOML comments (sd-scripts'
parser, toml 0.10.2, drops comments, so the file still means exactly the config to it) and
`estimate`, `fit` and `run` read it back: all of them then count the same file. A value the
config itself sets always wins over the assumed one.
"""

from __future__ import annotations

import re
from typing import Any

MARK = "kohya-tuner assumes:"
# Not an sd-scripts key: the model family the plan is for, recorded while no model file names it.
MODEL_KEY = "kohya_tuner_model"
# Not an sd-scripts key either: the entry script the plan is for, recorded when the file's own keys
# would not tell a reader (a full fine-tune TOML without a key only the fine-tune script takes reads
# as its family's LoRA script).
SCRIPT_KEY = "kohya_tuner_script"
_LINE = re.compile(r"^#\s*" + re.escape(MARK) + r"\s*(.+?)\s*$")
HEADER = ("Not given yet; kohya-tuner planned for the values below (sd-scripts ignores these comments; "
          "kohya-tuner estimate and fit read them back). Setting the key in this file replaces them.")


def _value(value: Any) -> str:
    import tomli_w

    return tomli_w.dumps({"v": value}).split("=", 1)[1].strip()


def comment_block(assumed: dict[str, Any]) -> str:
    """The comment lines written at the top of a config; empty when nothing is assumed."""
    if not assumed:
        return ""
    lines = [f"# {HEADER}\n"] + [f"# {MARK} {k} = {_value(v)}\n" for k, v in sorted(assumed.items())]
    return "".join(lines) + "\n"


def parse(text: str) -> dict[str, Any]:
    """The assumed values recorded in a config's comments (a malformed line is skipped: it is
    only a comment to sd-scripts, and the estimate then simply does not assume it)."""
    import toml

    out: dict[str, Any] = {}
    for raw in text.splitlines():
        m = _LINE.match(raw.strip())
        if not m:
            continue
        try:
            doc = toml.loads(m.group(1))
        except Exception:  # toml 0.10.2 raises several types on junk
            continue
        for k, v in doc.items():
            if not isinstance(v, dict):
                out[k] = v
    return out


def describe(key: str, value: Any) -> str:
    """The sentence every command prints for one assumed value."""
    return f"{key} = {_value(value)}: not given yet; the plan assumes it (recorded in the config as a comment)"


def merge(config: dict[str, Any], assumed: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`config` with the assumed values it does not set itself, and those values."""
    used = {k: v for k, v in assumed.items() if config.get(k) in (None, "")}
    return {**config, **used}, used


def sentences(used: dict[str, Any]) -> list[str]:
    return [describe(k, v) for k, v in sorted(used.items())]


def unmerge(config: dict[str, Any], assumed: dict[str, Any]) -> dict[str, Any]:
    """`config` without the assumed values merge() put in (they stay assumptions, not settings)."""
    return {k: v for k, v in config.items() if not (k in assumed and assumed[k] == v)}
