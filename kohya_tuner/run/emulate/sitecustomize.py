"""kohya-tuner's hooks inside the training process: the CUDA memory cap of
`kohya-tuner run --emulate-vram GB`, and the state saved when an out-of-memory error ends a
step (kohya_tuner_oom_state.py, on when KOHYA_TUNER_SAVE_AT_OOM is set).

`kohya-tuner run` puts this folder first on PYTHONPATH for that launch only, so Python
imports this module at start-up in every process of the launch. Only the training
processes act: accelerate marks them with ACCELERATE_MIXED_PRECISION (and torchrun with
LOCAL_RANK), while the `accelerate launch` process itself has neither, so it never
creates a CUDA context of its own.

The cap is PyTorch's per-process memory fraction, so an 8 GB preset can be proven on a
24 GB card. The CUDA context lives outside PyTorch's allocator; what the card already
holds when the cap is set is subtracted, so the emulation errs on the tight side.

This runs inside the trainer's environment, never in kohya-tuner's core. Whatever
`sitecustomize` the environment had before is run afterwards.
"""

from __future__ import annotations

import os
import sys

_ENV = "KOHYA_TUNER_EMULATE_VRAM_GB"
_GIB = 1024**3


def _is_training_process() -> bool:
    return "ACCELERATE_MIXED_PRECISION" in os.environ or "LOCAL_RANK" in os.environ


def _cap() -> None:
    raw = os.environ.get(_ENV)
    if not raw or not _is_training_process():
        return
    try:
        want_gib = float(raw)
    except ValueError:
        print(f"kohya-tuner: ignoring {_ENV}={raw!r} (not a number)", file=sys.stderr)
        return
    try:
        import torch
    except Exception:
        return
    if not torch.cuda.is_available():
        return  # nothing to cap on a CPU-only machine
    device = int(os.environ.get("LOCAL_RANK", "0") or 0)
    if device >= torch.cuda.device_count():
        device = 0
    free, total = torch.cuda.mem_get_info(device)
    held = total - free
    # A context is a few hundred MiB; much more means other processes share the card,
    # and their memory would not be on the emulated card.
    outside = held if held <= 1.5 * _GIB else 0.5 * _GIB
    allowed = want_gib * _GIB - outside
    if want_gib * _GIB >= total:
        print(f"kohya-tuner: --emulate-vram {want_gib:g} is not below this card's "
              f"{total / _GIB:.1f} GiB; no cap set", file=sys.stderr)
        return
    fraction = max(0.01, min(1.0, allowed / total))
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    print(f"kohya-tuner: emulating a {want_gib:g} GB card on cuda:{device}: PyTorch may allocate "
          f"{fraction * total / _GIB:.2f} GiB of {total / _GIB:.1f} GiB", file=sys.stderr, flush=True)


def _chain() -> None:
    """Run the sitecustomize this one shadows, if the environment has one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or not spec.origin or os.path.abspath(spec.origin) == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


try:
    _cap()
except Exception as exc:  # a failed cap must not stop training; it is reported instead
    print(f"kohya-tuner: could not emulate the VRAM cap: {exc}", file=sys.stderr)
try:
    if os.environ.get("KOHYA_TUNER_SAVE_AT_OOM"):
        # The sibling file, by its top-level name: this folder is what is on the trainer's
        # PYTHONPATH, and kohya_tuner itself is often not installed in the trainer's venv.
        import kohya_tuner_oom_state

        kohya_tuner_oom_state.install()
except Exception as exc:  # training goes on without it; the cadence states are still there
    print(f"kohya-tuner: save-at-failure is off: {exc}", file=sys.stderr)
_chain()
