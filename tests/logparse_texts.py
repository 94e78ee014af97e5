"""Log text built from the printing libraries' formats, shared by the tests of the parser's classes of
input: Python's traceback header and frame lines, PyTorch's OOM line, and the phase a text reads as."""
from __future__ import annotations

from kohya_tuner.logparse import diagnose, parse_text

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
       "23.65 GiB of which 10.00 MiB is free.\n")
HEAD = "Traceback (most recent call last):\n"


def frame(path: str, line: int, func: str, source: str | None = None) -> str:
    """One frame as Python prints it; without `source` the frame has no source line (a cut paste, a
    frozen module)."""
    return f'  File "{path}", line {line}, in {func}\n' + (f"    {source}\n" if source else "")


def phase(text: str) -> str:
    return diagnose(parse_text(text)).phase
