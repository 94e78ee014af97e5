"""Sample prompt files as sd-scripts reads them (library/train_util.py load_prompts at the pin):
the size each preview is drawn at, and the same file with smaller previews.

Three forms: `.txt`, one prompt a line ('#' lines and blank lines skipped) with options after
` --` (`--w 512 --h 768`); `.toml`, a `[prompt]` table whose keys every `[[prompt.subset]]`
shares (a subset's own key beside the shared one is a duplicate keyword to sd-scripts);
`.json`, a list of prompt tables (`width`, `height`) or lines. A prompt without a size is
drawn at the script's default (512; Lumina 2: 1024). Files are read bounded (safeio)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from kohya_tuner.errors import UserError

FILE_LIMIT = 1 << 20
MAX_SIDE = 16384
# The size a prompt without one is drawn at: the sample functions' defaults (512; Lumina 2: 1024).
_DEFAULT_SIDE = {"lumina2": 1024}
_FALLBACK_SIDE = 512
# The keys that turn sampling on during training.
_SAMPLING_KEYS = ("sample_every_n_steps", "sample_every_n_epochs", "sample_at_first")
SUFFIXES = (".txt", ".toml", ".json")
_OPTION = re.compile(r"([wh]) (\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class PromptFile:
    """A prompt file's parsed content: `kind` (txt, toml, json) and what rewriting needs."""

    path: str
    kind: str
    doc: Any  # the lines (txt), the TOML document, the JSON list


def _kind(path: str) -> str | None:
    # sd-scripts picks the reader by the name's ending, case included.
    return next((s[1:] for s in SUFFIXES if path.endswith(s)), None)


def load(path: str) -> PromptFile:
    """The file at `path`, read bounded; UserError when it cannot be read or is not one of the
    three forms."""
    from kohya_tuner import safeio

    kind = _kind(path)
    if kind is None:
        raise UserError(f"the prompt file {path} does not end in .txt, .toml or .json, the forms sd-scripts reads")
    text = safeio.read_text(path, "The sample prompt file", FILE_LIMIT)
    if kind == "txt":
        return PromptFile(path, kind, text.splitlines())
    try:
        if kind == "toml":
            import toml

            safeio.check_lines(text, f"The sample prompt file {path}")
            doc = safeio.parse_guard(toml.loads, text, f"The sample prompt file {path}")
        else:
            doc = safeio.parse_guard(json.loads, text, f"The sample prompt file {path}")
    except (ValueError, TypeError, IndexError) as exc:
        raise UserError(f"the prompt file {path} cannot be parsed: {exc}") from None
    safeio.check_values(doc, f"The sample prompt file {path}")
    return PromptFile(path, kind, doc)


def default_side(family: str) -> int:
    return _DEFAULT_SIDE.get(family, _FALLBACK_SIDE)


def resizable_size(config: dict[str, Any], family: str) -> str | None:
    """The largest preview ("1024x768") of the config's prompt file when training samples and
    the file reads: `run` can then draw them smaller through a copy (write_smaller)."""
    path = config.get("sample_prompts")
    if not isinstance(path, str) or not any(config.get(k) for k in _SAMPLING_KEYS):
        return None
    size, _how = largest(path, default_side(family))
    return f"{size[0]}x{size[1]}" if size else None


def copy_name(path: str, attempt: int) -> str:
    """The name of the copy of prompt file `path` an attempt draws its smaller previews from."""
    return f"attempt-{attempt}.sample_prompts.{_kind(path) or 'txt'}"


def write_smaller(path: str, size: str, family: str, dest) -> None:
    """Write to `dest` the prompt file at `path` with no preview longer than `size`'s longer side."""
    from kohya_tuner import config_io

    w, h = (int(x) for x in size.lower().split("x"))
    text = smaller(load(path), max(w, h), default_side(family))
    config_io.write_new(dest, text, force=True)


def _side(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        v = int(value)
    except (ValueError, OverflowError):
        return None
    return min(v, MAX_SIDE) if v > 0 else None


def _line_size(line: str, side: int) -> tuple[int, int]:
    w = h = side
    for part in line.strip().split(" --")[1:]:
        m = _OPTION.match(part)
        if m:
            v = min(int(m.group(2)), MAX_SIDE)
            w, h = (v, h) if m.group(1).lower() == "w" else (w, v)
    return w, h


def _is_prompt_line(line: str) -> bool:
    return bool(line.strip()) and not line.startswith("#")


def _toml_prompts(doc: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    prompt = doc.get("prompt") if isinstance(doc, dict) else None
    if not isinstance(prompt, dict):
        return {}, []
    subsets = prompt.get("subset")
    return prompt, [s for s in subsets if isinstance(s, dict)] if isinstance(subsets, list) else []


def sizes(pf: PromptFile, side: int) -> list[tuple[int, int]]:
    """The (width, height) of every prompt, as the sample functions draw it."""
    if pf.kind == "txt":
        return [_line_size(line, side) for line in pf.doc if _is_prompt_line(line)]
    if pf.kind == "toml":
        shared, subsets = _toml_prompts(pf.doc)
        return [(_side(s.get("width", shared.get("width"))) or side, _side(s.get("height", shared.get("height")))
                 or side) for s in subsets]
    out = []
    for item in pf.doc if isinstance(pf.doc, list) else []:
        if isinstance(item, str):
            out.append(_line_size(item, side))
        elif isinstance(item, dict):
            out.append((_side(item.get("width")) or side, _side(item.get("height")) or side))
    return out


def largest(path: str, side: int) -> tuple[tuple[int, int] | None, str]:
    """The largest preview the prompt file at `path` draws, and how it was found (or why not)."""
    try:
        found = sizes(load(path), side)
    except UserError as exc:
        return None, exc.message.rstrip(".")
    if not found:
        return None, f"the prompt file {path} holds no prompt"
    w, h = max(found, key=lambda p: p[0] * p[1])
    return (max(64, w), max(64, h)), (f"the largest preview size in {path} (a prompt without one: {side} px, "
                                      "sd-scripts' default)")


def _fit(w: int, h: int, longest: int) -> tuple[int, int]:
    """(w, h) scaled so the longer side is at most `longest`, in multiples of 64 px (what every
    script's sampler accepts)."""
    if max(w, h) <= longest:
        return w, h
    scale = longest / max(w, h)
    return tuple(max(64, int(x * scale) // 64 * 64) for x in (w, h))  # type: ignore[return-value]


def _line_with(line: str, w: int, h: int) -> str:
    head, *opts = line.rstrip("\r\n").split(" --")
    kept = [o for o in opts if not _OPTION.fullmatch(o.strip())]
    return " --".join([head, *kept, f"w {w}", f"h {h}"])


def smaller(pf: PromptFile, longest: int, side: int) -> str:
    """The file's text with every preview whose longer side exceeds `longest` drawn at most that
    large (aspect kept); everything else as it was. For `.toml`, sizes the subsets share move
    into each subset, so no subset names a size twice."""
    if pf.kind == "txt":
        out = []
        for line in pf.doc:
            if _is_prompt_line(line):
                w, h = _line_size(line, side)
                nw, nh = _fit(w, h, longest)
                line = _line_with(line, nw, nh) if (nw, nh) != (w, h) else line
            out.append(line)
        return "\n".join(out) + "\n"
    if pf.kind == "toml":
        from kohya_tuner import tomlwrite

        doc = json.loads(json.dumps(pf.doc))  # a deep copy of plain data
        shared, subsets = _toml_prompts(doc)
        before = sizes(pf, side)
        shared.pop("width", None)
        shared.pop("height", None)
        for sub, (w, h) in zip(subsets, before):
            sub["width"], sub["height"] = _fit(w, h, longest)
        return tomlwrite.dumps(doc)
    items = []
    for item in pf.doc if isinstance(pf.doc, list) else []:
        if isinstance(item, str):
            w, h = _line_size(item, side)
            nw, nh = _fit(w, h, longest)
            items.append(_line_with(item, nw, nh) if (nw, nh) != (w, h) else item)
        elif isinstance(item, dict):
            w, h = _side(item.get("width")) or side, _side(item.get("height")) or side
            nw, nh = _fit(w, h, longest)
            items.append({**item, "width": nw, "height": nh} if (nw, nh) != (w, h) else item)
        else:
            items.append(item)
    return json.dumps(items, ensure_ascii=False, indent=2) + "\n"
