"""Saves the training state at the step a GPU out-of-memory error ended, inside the trainer.

`kohya-tuner run` sets KOHYA_TUNER_SAVE_AT_OOM for every launch, and the `sitecustomize`
of this folder (first on PYTHONPATH) calls `install()`. Without the variable, or in a
launch of several processes (the other ranks would wait in a collective), or in a run that
keeps no states (`save_state` off, as in a probe), nothing happens.

What it does, measured on the pinned sd-scripts (docs/run.md, "Save at the failing step"):

* It wraps `accelerate.Accelerator.accumulate`, the context every sd-scripts trainer runs a
  micro-batch in, to know accelerate's micro-step counter at the last completed optimizer
  step, and whether the optimizer was inside `step()` when the error came (then the weights
  may be half updated, and nothing is saved).
* From the first micro-batch on, `sys.excepthook` is chained: once the trainer's own
  traceback is printed (the log reader needs it as it always was), an out-of-memory error
  leads to the save. The trainer's `train()` frame, still held by the traceback, gives
  sd-scripts' own `accelerator`, `args`, `global_step` (optimizer steps completed) and
  `current_step`. The frames are then cleared (the failed step's activations and graph
  go with them), gradients dropped, the CUDA cache emptied, and the state saved with
  `accelerator.save_state`, so sd-scripts' registered save hook writes the LoRA weights and
  `train_state.json`. That hook writes `current_step + 1` because sd-scripts saves before
  `current_step` catches up with `global_step`; it is set to `global_step - 1` first, so
  the file says the steps really completed, whether the error came inside a step
  (mid-accumulation included) or after it (while sampling).
* The state goes to a temporary folder, renamed to sd-scripts' own name for a state of that
  step once it is whole; if anything fails, the temporary folder is removed and the last
  state sd-scripts saved on its cadence is what is left, as without this hook.

It runs in the trainer's environment: standard library plus what the trainer imports.
"""

from __future__ import annotations

import os
import sys

ENV = "KOHYA_TUNER_SAVE_AT_OOM"
_PREFIX = "kohya-tuner:"


class _Watch:
    """What the wrapped `accumulate` has seen in this process."""

    def __init__(self) -> None:
        self.accelerator = None
        # accelerate's micro-step counter at the last optimizer-step boundary
        self.boundary: int | None = None
        self.in_optimizer_step = False
        self.hooked = False


_watch = _Watch()


def _is_oom(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 8:
        if type(exc).__name__ == "OutOfMemoryError":
            return True
        text = str(exc)
        if "CUDA out of memory" in text or "CUDA error: out of memory" in text:
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _say(message: str) -> None:
    try:
        print(f"{_PREFIX} {message}", file=sys.stderr, flush=True)
    except Exception:
        pass


def _wrap_accumulate(accelerator_module) -> None:
    cls = getattr(accelerator_module, "Accelerator", None)
    real = getattr(cls, "accumulate", None)
    if real is None or getattr(real, "_kohya_tuner", False):
        return

    class _Step:
        def __init__(self, acc, inner) -> None:
            self.acc, self.inner = acc, inner

        def __enter__(self):
            _watch.accelerator = self.acc
            if _watch.boundary is None:
                _watch.boundary = int(getattr(self.acc, "step", 0) or 0)
            if not _watch.hooked:
                _hook_excepthook()
            return self.inner.__enter__()

        def __exit__(self, et, ev, tb):
            out = self.inner.__exit__(et, ev, tb)
            if et is None and getattr(self.acc, "sync_gradients", False):
                _watch.boundary = int(getattr(self.acc, "step", 0) or 0)
            return out

    def accumulate(self, *models):
        return _Step(self, real(self, *models))

    accumulate._kohya_tuner = True  # type: ignore[attr-defined]
    cls.accumulate = accumulate


def _watch_optimizer(torch) -> None:
    import importlib

    try:
        opt = importlib.import_module("torch.optim.optimizer")

        def before(_o, _a, _k):
            _watch.in_optimizer_step = True

        def after(_o, _a, _k):
            _watch.in_optimizer_step = False

        opt.register_optimizer_step_pre_hook(before)
        opt.register_optimizer_step_post_hook(after)
    except Exception:
        pass


def _hook_excepthook() -> None:
    _watch.hooked = True
    previous = sys.excepthook

    def excepthook(et, ev, tb):
        try:
            previous(et, ev, tb)
        finally:
            if _is_oom(ev):
                try:
                    save_at_failure(tb)
                except BaseException as exc:  # noqa: BLE001 - never worse than without the hook
                    _say(f"could not save the state at the failure ({type(exc).__name__}: {exc}); "
                         "the last saved state is used")

    sys.excepthook = excepthook


def _train_frame(tb):
    """The deepest frame of the traceback that is sd-scripts' training loop."""
    found = None
    while tb is not None:
        loc = tb.tb_frame.f_locals
        if all(k in loc for k in ("accelerator", "args", "global_step", "current_step")):
            found = tb.tb_frame
        tb = tb.tb_next
    return found


def save_at_failure(tb) -> str | None:
    """Save the state after the optimizer steps completed; returns the folder or None."""
    import gc
    import shutil
    import traceback

    frame = _train_frame(tb)
    if frame is None:
        return None
    loc = frame.f_locals
    acc, args, done, counter = loc["accelerator"], loc["args"], loc["global_step"], loc["current_step"]
    train_fn = loc.get("optimizer_train_fn")
    del loc, frame
    if not getattr(args, "save_state", False):
        return None  # a run that keeps no states (a probe) gets none at the failure either
    if not isinstance(done, int) or done < 1:
        _say("out of memory before the first optimizer step: there is no progress to save")
        return None
    if _watch.in_optimizer_step:
        _say("out of memory inside the optimizer's step: the weights may be half updated, so no state is saved "
             "at the failure; the last saved state is used")
        return None
    train_util = sys.modules.get("library.train_util")
    pattern = getattr(train_util, "STEP_STATE_NAME", "{}-step{:08d}-state")
    name = args.output_name if getattr(args, "output_name", None) else getattr(train_util, "DEFAULT_STEP_NAME", "at")
    target = os.path.join(args.output_dir, pattern.format(name, done))
    if os.path.exists(os.path.join(target, "train_state.json")) and any(
            n.startswith("random_states") for n in os.listdir(target)):
        _say(f"out of memory after step {done}; its state is already saved: {target}")
        return target
    # The traceback holds the failed step's tensors through the frames' locals.
    traceback.clear_frames(tb)
    for opt in getattr(acc, "_optimizers", []) or []:
        inner = getattr(opt, "optimizer", opt)
        try:
            inner.zero_grad(set_to_none=True)
        except Exception:
            pass
    if callable(train_fn):
        train_fn()  # a schedule-free optimizer sampled in eval mode; its weights are saved in train mode
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
    if _watch.boundary is not None:
        # Mid-accumulation the counter is ahead by the micro-batches of the failed step;
        # restored as it is, the relaunch's first step would sum fewer of them.
        acc.step = _watch.boundary
    counter.value = done - 1  # sd-scripts' save hook writes current_step + 1
    partial = target + ".saving"
    shutil.rmtree(partial, ignore_errors=True)
    _say(f"out of memory after step {done}: saving the state of step {done} to {target}")
    import time

    import logging

    # accelerate's "Saving current state to <folder>" would name the temporary folder as a
    # state in the log; the two lines of this hook say what was saved and where.
    quiet = logging.getLogger("accelerate.accelerator")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    t0 = time.monotonic()
    try:
        acc.save_state(partial)
        with open(os.path.join(partial, "train_state.json"), encoding="utf-8") as f:
            import json

            written = json.load(f).get("current_step")
        if written != done:
            raise RuntimeError(f"train_state.json says step {written}, not {done}")
        if os.path.isdir(target):
            shutil.rmtree(target)  # an incomplete folder of the same step (its save was cut short)
        os.rename(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    finally:
        quiet.setLevel(level)
    size = sum(os.path.getsize(os.path.join(target, n)) for n in os.listdir(target))
    _say(f"state saved at the failure, step {done}: {target} ({size / 2**20:.1f} MiB in "
         f"{time.monotonic() - t0:.2f} s)")
    return target


class _AfterImport:
    """Meta-path finder that patches a module right after its import finishes."""

    def __init__(self, name, patch):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        real_exec = spec.loader.exec_module
        patch = self.patch

        def exec_module(module):
            real_exec(module)
            try:
                patch(module)
            except Exception as exc:  # noqa: BLE001 - training goes on without the hook
                _say(f"save-at-failure is off ({type(exc).__name__}: {exc})")

        spec.loader.exec_module = exec_module
        return spec


def _when_imported(name: str, patch) -> None:
    if name in sys.modules:
        patch(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, patch))


def install() -> None:
    if not os.environ.get(ENV):
        return
    try:
        if int(os.environ.get("WORLD_SIZE") or 1) > 1:
            return
    except ValueError:
        return
    _when_imported("accelerate.accelerator", _wrap_accumulate)
    _when_imported("torch", _watch_optimizer)
