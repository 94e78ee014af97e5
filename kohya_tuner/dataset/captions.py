"""Caption files as sd-scripts reads them, trigger words, and near-duplicate captions.

sd-scripts opens `<image stem><caption_extension>` as UTF-8 and trains on its first line,
stripped (all non-empty lines only with enable_wildcard). A file that is not UTF-8 or
has no line at all stops the run; a byte-order mark stays inside the caption; a missing
file falls back to the subset's class tokens, or to an empty caption.
"""

from __future__ import annotations

import os

import re
from dataclasses import dataclass


_CAPTION_LIMIT = 1 << 20  # a caption is a line of text; a megabyte is no caption


@dataclass(frozen=True)
class CaptionRead:
    text: str | None  # what sd-scripts trains on; None when it cannot read the file
    # "caption_unreadable", "caption_encoding", "caption_no_lines" stop the run;
    # "caption_empty", "caption_bom", "caption_multiline" train, but not as meant.
    problems: tuple[str, ...] = ()
    error: str | None = None


def read_caption(path: str) -> CaptionRead:
    import stat

    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            # A FIFO or device named like a caption: reading it would block or never end.
            return CaptionRead(None, ("caption_unreadable",), "not a regular file (a pipe, device or folder)")
        with open(path, "rb") as fh:
            raw = fh.read(_CAPTION_LIMIT + 1)
    except OSError as exc:
        return CaptionRead(None, ("caption_unreadable",), exc.strerror or str(exc))
    if len(raw) > _CAPTION_LIMIT:
        return CaptionRead(None, ("caption_unreadable",), f"larger than {_CAPTION_LIMIT:,} bytes: not a caption")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return CaptionRead(None, ("caption_encoding",), f"not UTF-8 (byte {exc.start})")
    if not text:
        return CaptionRead(None, ("caption_no_lines",), "the file is empty")
    problems: list[str] = []
    if text.startswith("\ufeff"):
        problems.append("caption_bom")
        text = text[1:]
    lines = text.splitlines()
    first = lines[0].strip() if lines else ""
    if sum(1 for line in lines if line.strip()) > 1:
        problems.append("caption_multiline")
    if not first:
        problems.append("caption_empty")
    return CaptionRead(first, tuple(problems))


def decode_caption_bytes(raw: bytes) -> str:
    """Best-effort text of a caption for the prepared copy: UTF-8 (BOM dropped), else
    the common Windows code page, so a user's caption is kept rather than lost."""
    for enc in ("utf-8-sig", "cp1252", "latin-1"):
        try:
            return raw.decode(enc).strip()
        except UnicodeDecodeError:
            continue
    return raw.decode("utf-8", errors="replace").strip()


def _trigger_pattern(trigger: str) -> re.Pattern[str]:
    return re.compile(r"(?<!\w)" + re.escape(trigger.strip()) + r"(?!\w)", re.IGNORECASE)


def has_trigger(caption: str, trigger: str) -> bool:
    return bool(_trigger_pattern(trigger).search(caption))


def add_trigger(caption: str | None, trigger: str) -> str:
    """The caption with the trigger first (kept once), as sd-scripts' keep_tokens expects."""
    trigger = trigger.strip()
    if not caption:
        return trigger
    if has_trigger(caption, trigger):
        return caption
    return f"{trigger}, {caption}"


_WORD = re.compile(r"\w+", re.UNICODE)


def _tokens(caption: str, trigger: str | None) -> frozenset[str]:
    text = caption.lower()
    if trigger:
        text = _trigger_pattern(trigger).sub(" ", text)
    return frozenset(_WORD.findall(text))


def near_duplicate_groups(captions: dict[str, str], trigger: str | None = None,
                          threshold: float = 0.85, pairwise_limit: int = 3000) -> list[list[str]]:
    """Groups (of two or more files) whose captions say nearly the same thing.

    Two captions are near-duplicates when the word sets, trigger removed, overlap by at
    least `threshold` (Jaccard). Identical word sets are grouped first; the pairwise
    comparison runs over distinct word sets only, and is skipped above `pairwise_limit`
    of them (then only identical captions are grouped)."""
    by_tokens: dict[frozenset[str], list[str]] = {}
    for name, text in captions.items():
        if text:
            by_tokens.setdefault(_tokens(text, trigger), []).append(name)
    keys = list(by_tokens)
    parent = list(range(len(keys)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    if len(keys) <= pairwise_limit:
        sizes = [len(k) for k in keys]
        for i in range(len(keys)):
            a = keys[i]
            for j in range(i + 1, len(keys)):
                b = keys[j]
                # |a∩b|/|a∪b| >= t needs min/max size >= t; skip pairs that cannot reach it.
                small, large = sorted((sizes[i], sizes[j]))
                if large == 0 or small < threshold * large:
                    continue
                inter = len(a & b)
                union = sizes[i] + sizes[j] - inter
                if union and inter / union >= threshold:
                    parent[find(i)] = find(j)
    groups: dict[int, list[str]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(find(i), []).extend(by_tokens[k])
    return sorted((sorted(g) for g in groups.values() if len(g) > 1), key=lambda g: (-len(g), g))
