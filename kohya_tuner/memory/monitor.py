"""Three figures of one peak: what PyTorch allocates, what its caching allocator reserves, and
what a GPU monitor (nvidia-smi, Task Manager, nvtop) shows for the process.

* allocated: the tensors alive at the peak (`torch.cuda.max_memory_allocated`), cuBLAS / cuDNN
  workspaces included (both are taken from PyTorch's allocator);
* reserved: allocated plus what the caching allocator holds free between the blocks it hands
  out (the estimate's `fragmentation` part): `torch.cuda.max_memory_reserved`;
* monitor: reserved plus the CUDA context (driver state and the kernels loaded into it), whose
  size depends on the module-loading mode (data/cuda_runtime.toml, with sources).

`peak_gib` is the reserved figure and decides the fit: a run runs out of memory when the
allocator cannot reserve another block, and what it can reserve is the card less the context,
so the budget (model.budget_gib) leaves the context out of the card for the driver at hand.
The monitor figure adds the same context back: lazy module loading (any driver from R515 on)
is assumed when the driver is not known; an older driver loads every kernel eagerly.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

_DATA = Path(__file__).resolve().parent.parent / "data" / "cuda_runtime.toml"
# Parts of a phase that are not tensors PyTorch allocates (a phase has no context part: the
# context is added here; "cuda_context" is still skipped should a caller pass one).
NOT_ALLOCATED = ("cuda_context", "fragmentation", "history_correction")


@lru_cache(maxsize=None)
def runtime() -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    with open(_DATA, "rb") as fh:
        return tomllib.load(fh)


def loading_mode(driver: str | None) -> str:
    """"lazy" unless the driver's major version is below the one lazy loading needs."""
    lazy = runtime()["context"]["lazy"]
    try:
        major = int(str(driver).split(".")[0])
    except (TypeError, ValueError):
        return "lazy"
    return "lazy" if major >= int(lazy["min_driver"]) else "eager"


def context_gib(driver: str | None = None) -> float:
    return float(runtime()["context"][loading_mode(driver)]["gib"])


def figures(parts: dict[str, float], correction: float = 1.0, driver: str | None = None) -> dict[str, float]:
    """allocated / reserved / monitor GiB of one phase's parts (the history correction, a
    measured / predicted ratio of monitor figures, scales them all)."""
    allocated = sum(v for k, v in parts.items() if k not in NOT_ALLOCATED)
    reserved = allocated + parts.get("fragmentation", 0.0)
    monitor = reserved + context_gib(driver)
    return {"allocated_gib": allocated * correction, "reserved_gib": reserved * correction,
            "monitor_gib": monitor * correction}
