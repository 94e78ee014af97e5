"""The GPUs of this machine, read through NVML (nvidia-ml-py).

The only module that talks to NVML. Every function degrades to "no GPU" rather than
raising, because kohya-tuner must work on machines without an NVIDIA driver (a CPU box,
CI, a user preparing configs for another machine).
"""

from __future__ import annotations

import math

import threading
import time
from dataclasses import dataclass, field

from kohya_tuner.errors import UserError

GIB = 1024**3


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_gib: float | None


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    total_gib: float
    free_gib: float
    used_gib: float
    compute_capability: tuple[int, int]
    driver: str = ""
    processes: tuple[GpuProcess, ...] = field(default_factory=tuple)

    @property
    def bf16(self) -> bool:
        # bf16 kernels exist from Ampere (8.0) on; older cards emulate it slowly or not at all.
        return self.compute_capability >= (8, 0)

    @property
    def total_gb_class(self) -> int:
        """The card's size as people name it: NVML reports 12288 MiB for a "12 GB" RTX 3060."""
        return int(round(self.total_gib))

    def others_gib(self, own_pids: set[int] = frozenset()) -> float:
        return sum(p.used_gib or 0.0 for p in self.processes if p.pid not in own_pids)


_lock = threading.Lock()
_init_error: str | None = None
_initialised = False


def _nvml():
    """Initialise NVML once; return the module, or None with the reason kept."""
    global _initialised, _init_error
    with _lock:
        if _initialised:
            return None if _init_error else __import__("pynvml")
        _initialised = True
        try:
            import pynvml

            pynvml.nvmlInit()
            return pynvml
        except Exception as exc:  # library missing, driver missing, no permission
            _init_error = _describe(exc)
            return None


def _describe(exc: Exception) -> str:
    name = type(exc).__name__
    if "LibraryNotFound" in name:
        return "the NVIDIA driver library (NVML) was not found: no NVIDIA driver on this machine"
    if "DriverNotLoaded" in name:
        return "the NVIDIA driver is installed but not loaded"
    if isinstance(exc, ImportError):
        return "nvidia-ml-py is not installed"
    return f"NVML failed: {exc}"


def nvml_status() -> str | None:
    """None when NVML works; otherwise why it does not."""
    _nvml()
    return _init_error


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _processes(nv, handle) -> tuple[GpuProcess, ...]:
    import psutil

    procs = []
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            running = getattr(nv, getter)(handle)
        except Exception:
            continue
        for p in running:
            try:
                name = psutil.Process(p.pid).name()
            except Exception:
                name = "?"
            used = getattr(p, "usedGpuMemory", None)
            procs.append(GpuProcess(p.pid, name, used / GIB if isinstance(used, int) and used >= 0 else None))
    seen: dict[int, GpuProcess] = {}
    for p in procs:
        seen.setdefault(p.pid, p)
    return tuple(seen.values())


def list_gpus() -> list[GpuInfo]:
    nv = _nvml()
    if nv is None:
        return []
    out = []
    try:
        count = nv.nvmlDeviceGetCount()
        driver = _text(nv.nvmlSystemGetDriverVersion())
    except Exception:
        return []
    for i in range(count):
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            try:
                cc = tuple(nv.nvmlDeviceGetCudaComputeCapability(h))
            except Exception:
                cc = (0, 0)
            out.append(GpuInfo(
                index=i,
                name=_text(nv.nvmlDeviceGetName(h)),
                total_gib=mem.total / GIB,
                free_gib=mem.free / GIB,
                used_gib=mem.used / GIB,
                compute_capability=(int(cc[0]), int(cc[1])),
                driver=driver,
                processes=_processes(nv, h),
            ))
        except Exception:
            continue
    return out


def detect(index: int = 0) -> GpuInfo:
    gpus = list_gpus()
    if not gpus:
        raise UserError(
            f"--gpu auto found no NVIDIA GPU: {nvml_status() or 'NVML reports no devices'}.",
            "Give the card's memory instead, e.g. --gpu 12 for a 12 GB card.",
        )
    for g in gpus:
        if g.index == index:
            return g
    raise UserError(f"There is no GPU {index}; NVML sees {len(gpus)} (0..{len(gpus) - 1}).")


def used_gib(index: int = 0) -> float | None:
    nv = _nvml()
    if nv is None:
        return None
    try:
        return nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(index)).used / GIB
    except Exception:
        return None


class VramSampler(threading.Thread):
    """Samples the card's used memory every `interval` seconds until stopped.

    Whole-card usage (what nvidia-smi shows) is what decides an OOM, so that is what is
    recorded; without NVML it records nothing and `peak_gib` stays None."""

    def __init__(self, index: int = 0, interval: float = 1.0, reader=used_gib):
        super().__init__(name="vram-sampler", daemon=True)
        self.index = index
        self.interval = interval
        self._reader = reader
        self._stop_event = threading.Event()
        self._t0 = time.monotonic()
        self.samples: list[tuple[float, float]] = []

    @property
    def peak_gib(self) -> float | None:
        return max((v for _, v in self.samples), default=None)

    @property
    def now_gib(self) -> float | None:
        return self.samples[-1][1] if self.samples else None

    def run(self) -> None:
        while not self._stop_event.is_set():
            value = self._reader(self.index)
            if value is None:
                return
            self.samples.append((time.monotonic() - self._t0, value))
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=2 * self.interval + 1)


MIN_GPU_GB = 4
# Above any card that exists (the largest are under 300 GB); keeps 1e400-style input out of int().
MAX_GPU_GB = 1024


# GPU architectures by the lowest compute capability NVML reports for them. bf16 tensor
# cores arrived with Ampere (8.0); older cards run bf16 emulated, many times slower than fp16.
ARCHITECTURES: dict[str, tuple[int, int]] = {
    "maxwell": (5, 0),
    "pascal": (6, 0),
    "volta": (7, 0),
    "turing": (7, 5),
    "ampere": (8, 0),
    "ada": (8, 9),
    "hopper": (9, 0),
    "blackwell": (10, 0),
}
BF16_FROM = (8, 0)

# Cards without fast bf16 sold with each memory size (GB, the largest size not above the card's):
# facts about the hardware, so that `--gpu N` alone can say which cards it may mean.
NO_BF16_CARDS: dict[int, tuple[str, ...]] = {
    4: ("GTX 1050 Ti", "GTX 1650"),
    6: ("GTX 1060 6GB", "GTX 1660", "RTX 2060"),
    8: ("GTX 1070", "GTX 1080", "RTX 2070", "RTX 2080"),
    10: ("GTX 1080 Ti", "RTX 2080 Ti"),
    12: ("RTX 2060 12GB", "TITAN Xp", "TITAN V"),
    16: ("Tesla T4", "Tesla V100 16GB", "Tesla P100", "Quadro RTX 5000"),
    20: (),
    24: ("TITAN RTX", "Quadro RTX 6000", "Tesla P40"),
    32: ("Tesla V100 32GB", "Quadro GV100"),
    48: ("Quadro RTX 8000",),
    80: (),
}


def arch_for_capability(cc: tuple[int, int]) -> str | None:
    """The architecture of a compute capability: the newest whose first capability is not above it."""
    known = [name for name, first in ARCHITECTURES.items() if first <= tuple(cc)]
    return max(known, key=lambda n: ARCHITECTURES[n]) if known and tuple(cc) > (0, 0) else None


def parse_arch(text: str) -> str:
    key = str(text).strip().lower().replace(" ", "")
    key = {"lovelace": "ada", "adalovelace": "ada", "rtx40": "ada", "rtx30": "ampere", "rtx20": "turing",
           "gtx16": "turing", "gtx10": "pascal", "rtx50": "blackwell"}.get(key, key)
    if key in ARCHITECTURES:
        return key
    raise UserError(f"--gpu-arch {text!r} is not a GPU architecture kohya-tuner knows.",
                    f"Choose one of: {', '.join(ARCHITECTURES)} (GTX 10xx is pascal, RTX 20xx and GTX 16xx turing, "
                    "RTX 30xx ampere, RTX 40xx ada, RTX 50xx blackwell).")


def arch_has_bf16(arch: str) -> bool:
    return ARCHITECTURES[arch] >= BF16_FROM


def cards_without_bf16(gb: float) -> tuple[str, ...]:
    """Cards of about `gb` GB that have no fast bf16 (empty when every such card has it)."""
    sizes = [s for s in NO_BF16_CARDS if s <= gb]
    return NO_BF16_CARDS[max(sizes)] if sizes else NO_BF16_CARDS[min(NO_BF16_CARDS)]


@dataclass(frozen=True)
class GpuChoice:
    """What `--gpu` resolved to: a size in GB and, with `auto`, the card behind it; `arch`
    from NVML or from `--gpu-arch` (which wins: the user may plan for another machine)."""

    gb: int
    info: GpuInfo | None = None
    arch_given: str | None = None

    @property
    def others_gib(self) -> float:
        return self.info.others_gib() if self.info else 0.0

    @property
    def driver(self) -> str | None:
        """The NVIDIA driver version NVML reported (None for a size given by hand): it sizes the
        CUDA context the budget leaves out and the monitor figure adds (memory/monitor.py)."""
        return (self.info.driver or None) if self.info else None

    @property
    def arch(self) -> str | None:
        if self.arch_given:
            return self.arch_given
        return arch_for_capability(self.info.compute_capability) if self.info else None

    @property
    def bf16(self) -> bool | None:
        """True / False when the architecture is known, None when only a size was given."""
        if self.arch_given:
            return arch_has_bf16(self.arch_given)
        return self.info.bf16 if self.info else None

    def describe(self) -> str:
        if self.info is None:
            arch = f", {self.arch_given} ({'bf16' if self.bf16 else 'no bf16'})" if self.arch_given else ""
            return f"{self.gb} GB (given){arch}"
        i = self.info
        text = (f"{i.name}: {i.total_gib:.1f} GiB, {i.free_gib:.1f} GiB free, compute {i.compute_capability[0]}."
                f"{i.compute_capability[1]} ({'bf16' if i.bf16 else 'no bf16'})")
        if self.arch_given:
            text += f"; planned as {self.arch_given} ({'bf16' if self.bf16 else 'no bf16'}, --gpu-arch)"
        return text


def parse_gpus(text: str | None) -> tuple[int, ...]:
    """`--gpus 0,1` as card numbers (NVML order); () when not given."""
    if not text:
        return ()
    try:
        ids = tuple(int(p) for p in text.replace(" ", "").split(",") if p != "")
    except ValueError:
        raise UserError(f"--gpus {text!r} must list GPU numbers, e.g. --gpus 0,1.") from None
    if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise UserError(f"--gpus {text!r} must list distinct GPU numbers, e.g. --gpus 0,1.")
    return ids


def parse_gb(text: str) -> int:
    s = str(text).strip().lower().removesuffix("gb").strip()
    try:
        value = float(s)
    except ValueError:
        raise UserError(f"--gpu {text!r} is neither 'auto' nor a number of GB.",
                        "Give the card's memory as a whole number (e.g. --gpu 12) or --gpu auto.") from None
    if not math.isfinite(value) or value > MAX_GPU_GB:
        raise UserError(f"--gpu {text!r} is not a card size: give a whole number of GB from {MIN_GPU_GB} to "
                        f"{MAX_GPU_GB} (e.g. --gpu 12) or --gpu auto.")
    if value != int(value):
        raise UserError(f"--gpu {text!r}: give a whole number of GB (e.g. --gpu 12).")
    gb = int(value)
    if gb < MIN_GPU_GB:
        raise UserError(f"--gpu {gb} is below {MIN_GPU_GB} GB; no sd-scripts LoRA training fits such a card.")
    return gb


def choose_among(text: str, gpu_ids: tuple[int, ...] | list[int], arch: str | None = None
                 ) -> tuple[GpuChoice, str | None]:
    """`--gpu auto` for a run on the cards `gpu_ids`: every rank holds the whole model, so the
    smallest card (the least free memory, then one without bf16) sets the plan. Returns the choice
    and, when the cards differ, a sentence that says so."""
    ids = list(gpu_ids) or [0]
    choices = [choose(text, i, arch=arch) for i in ids]
    if len(choices) == 1 or str(text).strip().lower() != "auto":
        return choices[0], None

    def room(c: GpuChoice) -> tuple:
        free = c.info.total_gib - c.info.others_gib() if c.info else float(c.gb)
        return (c.gb, free, c.bf16 is not False)

    pick = min(choices, key=room)
    sizes = {(c.gb, c.bf16) for c in choices}
    if len(sizes) == 1:
        return pick, None
    also = ""
    oldest = next((c for c in choices if c.bf16 is False), None)
    if oldest is not None:
        if pick.bf16 and oldest.arch:
            # The precision must run on every card: plan as for the one without bf16.
            from dataclasses import replace

            pick = replace(pick, arch_given=oldest.arch)
        also = f", in a precision GPU {oldest.info.index if oldest.info else '?'} can run (it has no bf16)"
    listed = ", ".join(f"GPU {c.info.index} {c.info.name} ({c.gb} GB class)" for c in choices if c.info)
    return pick, (f"The cards differ ({listed}); every rank holds the whole model, so the plan is for the "
                  f"smallest, GPU {pick.info.index if pick.info else ids[0]}{also}.")


def choose(text: str, index: int = 0, arch: str | None = None) -> GpuChoice:
    """Resolve `--gpu auto` (through NVML) or `--gpu N`, with `--gpu-arch` when given."""
    given = parse_arch(arch) if arch else None
    if str(text).strip().lower() == "auto":
        info = detect(index)
        return GpuChoice(gb=max(MIN_GPU_GB, info.total_gb_class), info=info, arch_given=given)
    return GpuChoice(gb=parse_gb(text), arch_given=given)
