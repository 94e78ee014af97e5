"""Fault injection for the real sd-scripts on a CPU: a copy of the realtrainer harness's
inject/sitecustomize.py (same variables, same behaviour) with two more hooks.

Put this folder first on the trainer's PYTHONPATH. Without any SDS_* variable it does
nothing and imports nothing.

From the harness:
  SDS_INJECT_OOM_AT_BACKWARD=N   the N-th top-level torch.autograd.backward raises
                                 torch.OutOfMemoryError with the caching allocator's text
  SDS_INJECT_OOM_MESSAGE         overrides that text
  SDS_INJECT_ONCE_MARKER=FILE    inject only in a process that finds no FILE (it creates it)
  SDS_BACKWARD_LEDGER=FILE       one line "<pid> <config file>" per completed top-level backward
  SDS_INJECT_RANK=R              with several ranks, only the process whose RANK is R injects
                                 (one rank's OOM or error; the others keep their ledgers)
  SDS_CPU_DDP_SHIM=1             several ranks on the CPU: accelerate 1.6's MULTI_CPU branch of
                                 prepare_model wraps frozen models in DDP too, which DDP refuses
                                 ("...doesn't have any parameter that requires a gradient"); the
                                 shim gives such a model the GPU branch's treatment (not wrapped)
Added here:
  SDS_INJECT_OOM_AT_LOAD=1       safetensors.torch.load_file raises torch.OutOfMemoryError at
                                 its first call (sd-scripts reads the checkpoint with it)
  SDS_INJECT_LAUNCHES=K          with SDS_INJECT_ONCE_MARKER: inject in the first K processes
                                 (the marker file counts them, one line each), not only the first
  SDS_INJECT_LOAD_ONCE_MARKER=FILE  the once-marker of the load hook, apart from the other
  SDS_INJECT_ERROR_AT_BACKWARD=N the N-th backward raises a RuntimeError that is not about
                                 memory (a device mismatch), once per SDS_INJECT_ONCE_MARKER
  SDS_INJECT_OOM_AT_CALL=MODULE:FUNCTION:N  the N-th call of that module-level function raises
                                 torch.OutOfMemoryError (once per SDS_INJECT_ONCE_MARKER), e.g.
                                 library.train_util:sample_image_inference:1 for sampling
  SDS_INJECT_SAVE_FAILS=1        once this process injected an OOM, torch.save raises "No space
                                 left on device" (the state saved at the failure cannot be written)
  SDS_STEP_LEDGER=FILE           one line "<pid> <config file>" per completed optimizer step
                                 (a global post-step hook: accelerate's optimizer wrapper calls
                                 the real step only when gradients sync, so this counts the
                                 steps that changed the weights, whatever the accumulation)
"""

import os
import sys

_AT = os.environ.get("SDS_INJECT_OOM_AT_BACKWARD")
_ERR = os.environ.get("SDS_INJECT_ERROR_AT_BACKWARD")
_ONCE = os.environ.get("SDS_INJECT_ONCE_MARKER")
_LAUNCHES = int(os.environ.get("SDS_INJECT_LAUNCHES") or 1)


def _injected_before(path):
    try:
        with open(path) as f:
            return len(f.read().splitlines()) or 1  # an empty marker (older runs) counts as one
    except OSError:
        return 0


_CALL = os.environ.get("SDS_INJECT_OOM_AT_CALL")
_SAVE_FAILS = os.environ.get("SDS_INJECT_SAVE_FAILS")
_INJECTED = []  # an OOM was raised in this process
if _ONCE and _injected_before(_ONCE) >= _LAUNCHES:
    _AT = _ERR = _CALL = None
_RANK = os.environ.get("SDS_INJECT_RANK")
if _RANK is not None and os.environ.get("RANK", "0") != _RANK:
    _AT = _ERR = _CALL = None
_LOAD = os.environ.get("SDS_INJECT_OOM_AT_LOAD")
_LOAD_ONCE = os.environ.get("SDS_INJECT_LOAD_ONCE_MARKER")
if _LOAD and _LOAD_ONCE and os.path.exists(_LOAD_ONCE):
    _LOAD = None
_LEDGER = os.environ.get("SDS_BACKWARD_LEDGER")
_STEPS = os.environ.get("SDS_STEP_LEDGER")

DEFAULT_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 7.75 GiB of which "
    "1.12 GiB is free. Including non-PyTorch memory, this process has 6.62 GiB memory in use. Of the "
    "allocated memory 5.91 GiB is allocated by PyTorch, and 498.27 MiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
    "Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
)
ERROR_MESSAGE = "Expected all tensors to be on the same device, but found at least two devices, cpu and meta!"


def _config_file():
    argv = sys.argv
    for i, a in enumerate(argv):
        if a == "--config_file" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--config_file="):
            return a.split("=", 1)[1]
    return "-"


def _mark(path):
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")


def _patch_torch(torch):
    oom_at = int(_AT) if _AT else -1
    err_at = int(_ERR) if _ERR else -1
    message = os.environ.get("SDS_INJECT_OOM_MESSAGE", DEFAULT_MESSAGE)
    real_backward = torch.autograd.backward
    state = {"calls": 0, "depth": 0}

    def backward(*args, **kwargs):
        if state["depth"] == 0:  # nested calls (reentrant checkpointing) are not new steps
            state["calls"] += 1
            if state["calls"] == oom_at:
                _mark(_ONCE)
                _INJECTED.append("backward")
                raise torch.OutOfMemoryError(message)
            if state["calls"] == err_at:
                _mark(_ONCE)
                raise RuntimeError(ERROR_MESSAGE)
        state["depth"] += 1
        try:
            result = real_backward(*args, **kwargs)
        finally:
            state["depth"] -= 1
        if state["depth"] == 0 and _LEDGER:
            with open(_LEDGER, "a") as f:
                f.write(f"{os.getpid()} {_config_file()}\n")
        return result

    torch.autograd.backward = backward
    if _SAVE_FAILS:
        real_save = torch.save

        def save(*args, **kwargs):
            if _INJECTED:
                raise OSError(28, "No space left on device")
            return real_save(*args, **kwargs)

        torch.save = save
    if _STEPS:
        def after_step(_optimizer, _args, _kwargs):
            with open(_STEPS, "a") as f:
                f.write(f"{os.getpid()} {_config_file()}\n")

        import importlib

        # torch.optim drops its submodule names from its namespace: import the module itself.
        importlib.import_module("torch.optim.optimizer").register_optimizer_step_post_hook(after_step)


def _patch_safetensors(module):
    real_load = module.load_file

    def load_file(*args, **kwargs):
        global _LOAD
        if _LOAD:
            _LOAD = None
            _mark(_LOAD_ONCE)
            import torch

            raise torch.OutOfMemoryError(os.environ.get("SDS_INJECT_OOM_MESSAGE", DEFAULT_MESSAGE))
        return real_load(*args, **kwargs)

    module.load_file = load_file


def _patch_call(module, function, at):
    real = getattr(module, function)
    calls = [0]

    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == at:
            import torch

            _mark(_ONCE)
            _INJECTED.append(function)
            raise torch.OutOfMemoryError(os.environ.get("SDS_INJECT_OOM_MESSAGE", DEFAULT_MESSAGE))
        return real(*args, **kwargs)

    setattr(module, function, wrapped)


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
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


if _CALL:
    _mod, _fn, _n = _CALL.split(":")
    if _mod in sys.modules:
        _patch_call(sys.modules[_mod], _fn, int(_n))
    else:
        sys.meta_path.insert(0, _AfterImport(_mod, lambda m: _patch_call(m, _fn, int(_n))))
if _AT or _ERR or _LEDGER or _STEPS or _SAVE_FAILS:
    if "torch" in sys.modules:
        _patch_torch(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _AfterImport("torch", _patch_torch))
if _LOAD:
    if "safetensors.torch" in sys.modules:
        _patch_safetensors(sys.modules["safetensors.torch"])
    else:
        sys.meta_path.insert(0, _AfterImport("safetensors.torch", _patch_safetensors))


def _patch_accelerator(module):
    real_prepare = module.Accelerator.prepare_model

    def prepare_model(self, model, device_placement=None, evaluation_mode=False):
        from accelerate.utils import DistributedType

        if self.distributed_type == DistributedType.MULTI_CPU and not any(p.requires_grad for p in model.parameters()):
            evaluation_mode = True  # nothing to synchronise: what the GPU branch does
        return real_prepare(self, model, device_placement=device_placement, evaluation_mode=evaluation_mode)

    module.Accelerator.prepare_model = prepare_model


if os.environ.get("SDS_CPU_DDP_SHIM") == "1":
    if "accelerate.accelerator" in sys.modules:
        _patch_accelerator(sys.modules["accelerate.accelerator"])
    else:
        sys.meta_path.insert(0, _AfterImport("accelerate.accelerator", _patch_accelerator))
