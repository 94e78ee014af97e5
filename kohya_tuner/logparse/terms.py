"""Advice in the terms of the trainer that wrote the log.

The advice names sd-scripts settings (`gradient_checkpointing = true`). When the log shows
another trainer (ai-toolkit, OneTrainer, SimpleTuner, musubi-tuner, a diffusers training
script, the web UI's Dreambooth extension, ComfyUI's nodes), a setting that trainer
has is shown under its own name (trainer_terms.toml, data); a line that still names settings
the table does not know says they are sd-scripts' names. sd-scripts and the wrappers that run
it (kohya_ss, FluxGym) keep the advice as it is.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

_TABLE = Path(__file__).with_name("trainer_terms.toml")
_NAMES = {"ai-toolkit": "ai-toolkit", "onetrainer": "OneTrainer", "simpletuner": "SimpleTuner",
          "musubi-tuner": "musubi-tuner", "comfyui": "ComfyUI's trainer nodes",
          "diffusers": "the diffusers training script", "a1111-dreambooth": "the web UI's Dreambooth extension"}
# `key` or `key = value`, the form the advice writes sd-scripts settings in.
_SETTING_RE = re.compile(r"`([a-z][a-z0-9_]*)( = [^`]*)?`")


@lru_cache(maxsize=1)
def table() -> dict[str, dict[str, str]]:
    return tomllib.loads(_TABLE.read_text(encoding="utf-8"))


def in_trainer_terms(advice: list[str], wrapper: str | None) -> list[str]:
    """`advice` rewritten for `wrapper`'s users; unchanged for sd-scripts and its wrappers."""
    if wrapper not in _NAMES:
        return advice
    terms = table().get(wrapper, {})
    name = _NAMES[wrapper]
    out = []
    for line in advice:
        unknown = False

        def swap(m: re.Match) -> str:
            nonlocal unknown
            key, value = m.group(1), m.group(2) or ""
            theirs = terms.get(key)
            if theirs is None:
                unknown = True
                return m.group(0)
            return f"`{theirs}` ({name}; sd-scripts' `{key}{value}`)"

        text = _SETTING_RE.sub(swap, line)
        if unknown:
            text += f" [sd-scripts setting; in {name}, look {terms.get('where', 'in its own options')}]"
        out.append(text)
    return out
