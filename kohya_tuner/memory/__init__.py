"""Peak-VRAM model of sd-scripts LoRA training: torch-free, pure, instant.

`estimate(config, family)` returns an `Estimate` (peak, the phase that sets it, the parts);
`budget_gib(gpu_gb)` is what a run may use on a card of that size. See docs/memory-model.md.
"""

from __future__ import annotations

from kohya_tuner.memory.model import GPU_SIZES, PHASES, Estimate, budget_gib, estimate
from kohya_tuner.memory.setup import Setup, resolve

__all__ = ["Estimate", "estimate", "budget_gib", "GPU_SIZES", "PHASES", "Setup", "resolve"]
