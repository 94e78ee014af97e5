"""Reading a log file for the parser: streamed, any encoding a Windows or Linux shell writes.

The only module of the package that touches files. A log can be gigabytes (tqdm rewrites
its bar thousands of times per hour), so it is decoded and parsed chunk by chunk and
never held in memory whole.
"""

from __future__ import annotations

import codecs
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from kohya_tuner.errors import UserError
from kohya_tuner.logparse.events import Event
from kohya_tuner.logparse.inputform import FormFilter, InputForm, sniff_form
from kohya_tuner.logparse.parser import LogParser
from kohya_tuner.safeio import DEAD_LINK

CHUNK = 1 << 20
_SNIFF = 1 << 16
# Text logs carry these control characters; anything else in bulk means binary data.
_TEXT_CONTROLS = frozenset(b"\t\n\r\x1b\x08\x0c\x07")


@dataclass
class LogSource:
    path: Path
    size: int
    encoding: str
    # What a capture tool or a paste put on every line, taken off before parsing.
    form: InputForm | None = None


# File signatures of what users pass by mistake: a model (safetensors' 8-byte header length
# then JSON, a zip-packed .pt/.ckpt, a pickle), an image, an archive, a program.
_BINARY_MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"PK\x03\x04", b"\x1f\x8b", b"\x7fELF", b"MZ", b"GGUF",
                 b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05", b"RIFF", b"BM", b"%PDF", b"7z\xbc\xaf")


def _is_binary_format(head: bytes) -> bool:
    if head.startswith(_BINARY_MAGIC) and not head[:64].isascii():
        return True
    # safetensors: a little-endian u64 header size, then the JSON header.
    return len(head) > 10 and head[8:10] == b'{"' and head[5:8] == b"\x00\x00\x00"


def _sniff_encoding(head: bytes) -> str | None:
    """The encoding of a log from its first bytes, or None when it is not text."""
    if _is_binary_format(head):
        return None
    if head.startswith(codecs.BOM_UTF8):
        return "utf-8-sig"
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    if not head:
        return "utf-8"
    nul = head.count(0)
    if nul:
        # PowerShell's `>` writes UTF-16 without a BOM now and then: every other byte is NUL.
        half = len(head) // 2
        even = head[0::2].count(0)
        odd = head[1::2].count(0)
        if odd > 0.4 * half and even < 0.05 * half:
            return "utf-16-le"
        if even > 0.4 * half and odd < 0.05 * half:
            return "utf-16-be"
        # Characters beyond Latin-1 put NULs on the other side too (U+2500, Rich's box line, is
        # 00 25): whether the text decodes into readable characters decides.
        for encoding, zeros in (("utf-16-le", odd), ("utf-16-be", even)):
            if zeros > 0.05 * half and _readable(head[: half * 2].decode(encoding, errors="replace")):
                return encoding
        if nul > 0.01 * len(head):
            return None
    controls = sum(1 for b in head if b < 32 and b not in _TEXT_CONTROLS)
    if controls > 0.05 * len(head):
        return None
    text = head.decode("utf-8", errors="replace")
    bad = text.count("\ufffd")
    if bad <= 1 and _strict(head, "utf-8") is not None:
        return "utf-8"
    if bad < sum(1 for ch in text if ch > "\x7f") - bad:
        # Mostly UTF-8 with a few stray bytes (a console's message in another code page): the
        # UTF-8 (boxes, bars) is what the parser needs.
        return "utf-8"
    legacy = _legacy_cjk(head)
    if legacy:
        return legacy
    if bad > 0.2 * max(1, len(text)):
        return None
    # Python's output on a Western Windows console when it is not UTF-8.
    return "cp1252"


def _readable(text: str) -> bool:
    bad = sum(1 for ch in text if ch == "\ufffd" or "\ue000" <= ch <= "\uf8ff"
              or (ch < " " and ch not in "\t\n\r\x1b\x08\x0c\x07"))
    return bad <= 0.01 * len(text)


def _strict(head: bytes, encoding: str) -> str | None:
    """`head` decoded without a single error, but for a character cut by the head's end; else None."""
    try:
        return head.decode(encoding)
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:
            return None
        try:
            return head[: exc.start].decode(encoding)
        except UnicodeDecodeError:
            return None


_CJK_ENCODINGS = ("cp932", "gbk")


def _odd_chars(text: str) -> int:
    """Characters a Japanese or Chinese log rarely holds (half-width katakana, private use, control
    characters), and one or two wide characters inside an ASCII word ("Mü" + "ller": a Western
    accent read with the letter after it as one character): what a wrong code page makes of the bytes."""
    n = 0
    run = 0  # wide characters in a row so far
    for i, ch in enumerate(text):
        if ch < "\x80":
            if ch < " " and ch not in "\t\n\r\x1b\x08\x0c\x07":
                n += 1
            elif 0 < run <= 2 and ch.isalnum() and i > run and text[i - run - 1].isascii() \
                    and text[i - run - 1].isalnum():
                n += run
            run = 0
            continue
        run += 1
        o = ord(ch)
        if not (0x3000 <= o <= 0x30FF or 0x4E00 <= o <= 0x9FFF or 0xFF01 <= o <= 0xFF5E or 0x2010 <= o <= 0x259F
                or o in (0xA7, 0xB0, 0xB7, 0xD7)):
            n += 1
    return n


def _legacy_cjk(head: bytes) -> str | None:
    """cp932 or GBK (Python's locale encoding on a Japanese or a Chinese Windows) when one decodes
    the head cleanly into few odd characters; the one with fewer wins, cp932 on a tie."""
    best = None
    for encoding in _CJK_ENCODINGS:
        text = _strict(head, encoding)
        if text is None:
            continue
        wide = sum(1 for ch in text if ch > "\x7f")
        odd = _odd_chars(text)
        if wide and odd <= 0.1 * wide and (best is None or odd < best[0]):
            best = (odd, encoding)
    return best[1] if best else None


def open_log(path: str | os.PathLike) -> LogSource:
    """Check that `path` is a readable text log; UserError (exit 2) when it is not."""
    p = Path(path)
    if not p.exists():
        if p.is_symlink():
            raise UserError(f"{p} {DEAD_LINK}.",
                            "Pass the file the training output was saved to.")
        raise UserError(f"{p} does not exist.", "Pass the file the training output was saved to.")
    if p.is_dir():
        raise UserError(f"{p} is a folder, not a log file.",
                        "Pass the file the training output was saved to (for example train.log).")
    try:
        mode = p.stat().st_mode
    except OSError as exc:
        raise UserError(f"{p} cannot be read: {exc.strerror or exc}.") from None
    if not stat.S_ISREG(mode):
        # Reading a FIFO or a terminal would wait for a writer that may never come.
        what = "a named pipe" if stat.S_ISFIFO(mode) else "a device or socket"
        raise UserError(f"{p} is {what}, not a log file: reading it would wait for input instead of reading a log.",
                        "Save the training output to a file first (`accelerate launch … > train.log 2>&1`) and "
                        "pass that file.")
    try:
        with open(p, "rb") as fh:
            head = fh.read(_SNIFF)
        size = p.stat().st_size
    except OSError as exc:
        raise UserError(f"{p} cannot be read: {exc.strerror or exc}.") from None
    if not head.strip():
        raise UserError(f"{p} is empty: there is no training output to read.",
                        "Save the training output with both streams (`accelerate launch … > train.log 2>&1`) and "
                        "pass that file once the run has printed something.")
    encoding = _sniff_encoding(head)
    if encoding is None:
        raise UserError(f"{p} is not a text log: it holds binary data.",
                        "Pass the console output of the training (for example `accelerate launch … > train.log "
                        "2>&1`), not a model, cache or image file.")
    complete = size <= len(head)
    form = sniff_form(head.decode(encoding, errors="replace").replace("\x00", ""), complete)
    return LogSource(path=p, size=size, encoding=encoding, form=form)


def iter_events(source: LogSource, parser: LogParser | None = None, chunk_size: int = CHUNK, *,
                coalesce_progress: bool = False) -> Iterator[Event]:
    """Every event of the log, read and parsed one chunk at a time. `coalesce_progress` folds
    each run of bar updates into one or two events (the diagnosis is the same, several times
    faster on a long log); leave it off where every update is wanted (`--events`)."""
    parser = parser or LogParser(coalesce_progress=coalesce_progress)
    try:
        with open(source.path, "rb") as fh:
            yield from events_from_stream(fh, source.encoding, parser, chunk_size, source.form)
    except OSError as exc:
        raise UserError(f"{source.path} cannot be read: {exc.strerror or exc}.") from None


def events_from_stream(fh: BinaryIO, encoding: str = "utf-8", parser: LogParser | None = None,
                       chunk_size: int = CHUNK, form: InputForm | None = None) -> Iterator[Event]:
    """Events from a binary stream, decoded incrementally (a character split between two
    reads is kept whole); undecodable bytes become U+FFFD instead of an error. `form`: what
    to take off every line first (open_log finds it)."""
    parser = parser or LogParser()
    decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
    lines = FormFilter(form) if form else None
    while True:
        block = fh.read(chunk_size)
        if not block:
            break
        text = decoder.decode(block)
        if "\x00" in text:
            text = text.replace("\x00", "")
        if lines:
            text = lines.feed(text)
        yield from parser.feed(text)
    text = decoder.decode(b"", final=True)
    yield from parser.feed(lines.feed(text, final=True) if lines else text)
    yield from parser.finish()
