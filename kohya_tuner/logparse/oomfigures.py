"""The figures of PyTorch's out-of-memory message, in every wording it has had: what was asked for,
the card's capacity and what was free, what this process and PyTorch held, the other processes it
named (CUDA, ROCm HIP, Apple MPS and cudaMallocAsync). Pure functions over the message's text."""

from __future__ import annotations

import re

from kohya_tuner.logparse.events import OomFigures

# A console that hard-wraps a paste can split a unit ("12.84 Gi" / "B already allocated"): the space the
# lines are joined with may stand inside it.
_SIZE = r"([\d.]+)\s*(bytes|[kmgt] ?i? ?b)"
_UNIT = {"bytes": 1 / 1024**3, "kib": 1 / 1024**2, "kb": 1 / 1024**2, "mib": 1 / 1024, "mb": 1 / 1024,
         "gib": 1.0, "gb": 1.0, "tib": 1024.0, "tb": 1024.0}
# Only ever run on an OOM message, so case folding costs nothing here.
_I = re.I
_TRIED_RE = re.compile(r"Tried to allocate\s+" + _SIZE, _I)
_DEVICE_RE = re.compile(r"\bGPU\s+(\d+)\b|Allocation on device\s+(\d+)", _I)
_CAPACITY_NEW_RE = re.compile(r"total capac(?:i)?ty of\s+" + _SIZE + r"\s+of which\s+" + _SIZE + r"\s+is free", _I)
_IN_USE_RE = re.compile(r"this process has\s+" + _SIZE + r"\s+memory in use", _I)
_OTHER_PROC_RE = re.compile(r"Process\s+(\d+)\s+has\s+" + _SIZE + r"\s+memory in use", _I)
_ALLOC_NEW_RE = re.compile(r"Of the allocated memory\s+" + _SIZE + r"\s+is allocated by PyTorch", _I)
_RESERVED_UNALLOC_RE = re.compile(_SIZE + r"\s+is reserved by PyTorch but unallocated", _I)
_CAPACITY_OLD_RE = re.compile(_SIZE + r"\s+total capacity", _I)
_ALLOC_OLD_RE = re.compile(_SIZE + r"\s+already allocated", _I)
_FREE_OLD_RE = re.compile(_SIZE + r"\s+free\b", _I)
_RESERVED_OLD_RE = re.compile(_SIZE + r"\s+(?:reserved in total by PyTorch|cached)", _I)
_ASYNC_RE = {
    "allocated": re.compile(r"Currently allocated\s*:\s*" + _SIZE, _I),
    "tried": re.compile(r"Requested\s*:\s*" + _SIZE, _I),
    "capacity": re.compile(r"Device limit\s*:\s*" + _SIZE, _I),
    "free": re.compile(r"Free \(according to CUDA\)\s*:\s*" + _SIZE, _I),
}
# Apple's wording: "MPS backend out of memory (MPS allocated: 17.80 GB, other allocations: 1.19 MB,
# max allowed: 18.13 GB). Tried to allocate 512.00 MB on private pool."
_MPS_ALLOC_RE = re.compile(r"MPS allocated:\s*" + _SIZE, _I)
_MPS_OTHER_RE = re.compile(r"other allocations:\s*" + _SIZE, _I)
_MPS_MAX_RE = re.compile(r"max allowed:\s*" + _SIZE, _I)
_WRAP_PAD_RE = re.compile(r" {8,}")


def _gib(m: re.Match, i: int = 1) -> float | None:
    try:
        return round(float(m.group(i)) * _UNIT[m.group(i + 1).lower().replace(" ", "")], 4)
    except (ValueError, KeyError):
        return None


def oom_figures(text: str) -> OomFigures:
    """Every figure PyTorch's message holds, in GiB, from any of its wordings."""
    # A terminal that hard-wrapped the message pads its continuation with a run of spaces, wherever in a
    # word the width fell ("Includi      ng", "reserved b      y PyTorch"); PyTorch's own text has none.
    text = " ".join(_WRAP_PAD_RE.sub("", text).split())
    tried = capacity = free = in_use = allocated = reserved_unalloc = None
    device = None
    m = _TRIED_RE.search(text)
    if m:
        tried = _gib(m)
    m = _DEVICE_RE.search(text)
    if m:
        device = int(m.group(1) or m.group(2))
    m = _CAPACITY_NEW_RE.search(text)
    if m:
        capacity, free = _gib(m, 1), _gib(m, 3)
    m = _IN_USE_RE.search(text)
    if m:
        in_use = _gib(m)
    m = _ALLOC_NEW_RE.search(text)
    if m:
        allocated = _gib(m)
    m = _RESERVED_UNALLOC_RE.search(text)
    if m:
        reserved_unalloc = _gib(m)
    others = tuple((int(p.group(1)), _gib(p, 2) or 0.0) for p in _OTHER_PROC_RE.finditer(text))
    if capacity is None:
        # PyTorch before 2.1: "(GPU 0; 6.00 GiB total capacity; 5.24 GiB already allocated; 0 bytes free;
        # 5.29 GiB reserved in total by PyTorch)".
        m = _CAPACITY_OLD_RE.search(text)
        if m:
            capacity = _gib(m)
            m = _ALLOC_OLD_RE.search(text)
            if m:
                allocated = _gib(m)
            m = _FREE_OLD_RE.search(text)
            if m:
                free = _gib(m)
            m = _RESERVED_OLD_RE.search(text)
            if m and allocated is not None:
                reserved = _gib(m)
                if reserved is not None:
                    reserved_unalloc = round(max(0.0, reserved - allocated), 4)
    if capacity is None and "mps allocated" in text.lower():
        m = _MPS_ALLOC_RE.search(text)
        if m:
            allocated = _gib(m)
        m = _MPS_MAX_RE.search(text)
        if m:
            capacity = _gib(m)
        m = _MPS_OTHER_RE.search(text)
        if m and capacity is not None and allocated is not None:
            in_use = round(allocated + (_gib(m) or 0.0), 4)
            free = round(max(0.0, capacity - in_use), 4)
    if "allocation on device" in text.lower():
        # cudaMallocAsync's wording: a small table instead of a sentence.
        for key, rx in _ASYNC_RE.items():
            m = rx.search(text)
            if not m:
                continue
            value = _gib(m)
            if key == "allocated" and allocated is None:
                allocated = value
            elif key == "tried" and tried is None:
                tried = value
            elif key == "capacity" and capacity is None:
                capacity = value
            elif key == "free" and free is None:
                free = value
    # Where NVML cannot see a process's memory (WSL, Windows' WDDM) it reports the all-ones value,
    # which PyTorch prints as 17179869184.00 GiB: that says nothing of what the process holds.
    others = tuple(o for o in others if o[1] < NVML_NOT_AVAILABLE_GIB)
    trainer_pid = None
    if in_use is None and others and allocated is not None:
        # In a container PyTorch cannot match NVML's pid to its own and lists itself as
        # "Process N has X GiB memory in use": the entry whose X is what PyTorch reserved
        # plus a CUDA context is the trainer, not another program.
        reserved = allocated + (reserved_unalloc or 0.0)
        fits = [(abs(g - reserved), pid, g) for pid, g in others if is_own_process(g, reserved)]
        if len(fits) > 1:
            # Several entries fit (the ranks of one job sharing a card each hold about as much): which
            # one is this process the figures cannot say.
            fits = []
        if not fits and capacity is not None and free is not None:
            # What PyTorch reserved is on the card too, so all other programs together hold at most
            # the card's used memory less that: an entry holding more than that includes the trainer.
            room = capacity - free - reserved + FIGURE_ROUNDING_GIB
            fits = [(0.0, pid, g) for pid, g in others if g > room]
            if len(fits) > 1:
                fits = []
        if fits:
            _, trainer_pid, in_use = min(fits)
            others = tuple(o for o in others if o[0] != trainer_pid)
    return OomFigures(tried_gib=tried, capacity_gib=capacity, free_gib=free, process_in_use_gib=in_use,
                      allocated_gib=allocated, reserved_unallocated_gib=reserved_unalloc, message=text[:2000],
                      device=device, other_processes=others, trainer_pid=trainer_pid)


# What a CUDA process holds beyond PyTorch's reserved memory: its context (0.3 to 0.6 GiB on
# current drivers) plus cuBLAS/cuDNN workspaces and NCCL buffers, which together stay under
# 1.5 GiB (or 5 % of a very large figure); the printed figures are rounded to 0.01 GiB.
OWN_PROCESS_BELOW_GIB = 0.05
OWN_PROCESS_ABOVE_GIB = 1.5
# Three printed figures, each rounded to 0.01 GiB, enter the sum that bounds the other programs.
FIGURE_ROUNDING_GIB = 0.03
# NVML_VALUE_NOT_AVAILABLE (2**64 - 1 bytes) as GiB is 2**34; anything near it is no reading.
NVML_NOT_AVAILABLE_GIB = 2.0**33


def is_own_process(process_gib: float, reserved_gib: float) -> bool:
    """Whether a "Process N has X GiB" figure is PyTorch's own reserved memory plus a context."""
    extra = process_gib - reserved_gib
    return -OWN_PROCESS_BELOW_GIB <= extra <= max(OWN_PROCESS_ABOVE_GIB, 0.05 * process_gib)
