"""Log text built from the printing libraries' formats, shared by the tests of the parser's classes of
input: Python's traceback header and frame lines, PyTorch's OOM line, and the phase a text reads as."""
from __future__ import annotations

from kohya_tuner.logparse import diagnose, parse_text

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
       "23.65 GiB of which 10.00 MiB is free.\n")
HEAD = "Traceback (most recent call last):\n"
# A latent-caching pass that finished: what follows before the first step is start-up again.
CACHED = "caching latents.\n100%|██████████| 4/4 [00:01<00:00,  3.00it/s]\n"
# A latent-caching pass still running: only what follows it can make a text start-up.
CACHING = "caching latents.\ncaching latents:  48%|████▊     | 10/21 [00:01<00:01, 7.00it/s]\n"
# The training bar at step 10: steps are counted.
BAR = "steps:  10%|█         | 10/100 [00:10<00:50,  1.00it/s, avr_loss=0.1]\n"


def frame(path: str, line: int, func: str, source: str | None = None) -> str:
    """One frame as Python prints it; without `source` the frame has no source line (a cut paste, a
    frozen module)."""
    return f'  File "{path}", line {line}, in {func}\n' + (f"    {source}\n" if source else "")


def phase(text: str) -> str:
    return diagnose(parse_text(text)).phase


def box_row(text: str) -> str:
    """One row of a Rich traceback box, 80 columns wide."""
    return "│ " + text.ljust(78) + " │\n"
