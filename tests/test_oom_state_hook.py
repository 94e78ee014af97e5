"""The trainer-side save at an out-of-memory failure (run/emulate/kohya_tuner_oom_state.py),
driven with a stand-in for sd-scripts' training loop: its locals, its save hook's `+ 1`,
accelerate's micro-step counter. The real trainer is in tests/integration."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kohya_tuner.run import launcher

HOOK = launcher.emulate_dir() / "kohya_tuner_oom_state.py"


@pytest.fixture()
def hook():
    spec = importlib.util.spec_from_file_location("kt_oom_state_under_test", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class OutOfMemoryError(RuntimeError):
    pass


class Accelerator:
    """What the hook uses of accelerate's Accelerator: save_state running the registered
    pre-hook (sd-scripts' writes current_step + 1), `step`, `_optimizers`."""

    def __init__(self, counter, fail: Exception | None = None):
        self.step = 0
        self.counter = counter
        self.fail = fail
        self.saved_step = None
        self._optimizers = [SimpleNamespace(optimizer=SimpleNamespace(zero_grad=self._zero))]
        self.zeroed = False

    def _zero(self, set_to_none=True):
        self.zeroed = set_to_none

    def save_state(self, out):
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "train_state.json"), "w") as f:
            json.dump({"current_epoch": 1, "current_step": self.counter.value + 1}, f)
        if self.fail is not None:
            raise self.fail
        self.saved_step = self.step
        Path(out, "random_states_0.pkl").write_bytes(b"x")


def _train(accelerator, args, current_step, fail_at_micro: int, accumulation: int = 1, sampling_oom_at: int = 0,
           optimizer_state: dict | None = None):
    """sd-scripts' loop shape: current_step set at each micro-batch, global_step after the sync."""
    global_step = 0
    big = bytearray(1024)  # a tensor of the failed step, held by this frame  # noqa: F841
    micro = 0
    while True:
        current_step.value = global_step
        micro += 1
        accelerator.step += 1
        if micro == fail_at_micro:
            if optimizer_state is not None:
                optimizer_state["in"] = True
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        if accelerator.step % accumulation == 0:
            global_step += 1
            if global_step == sampling_oom_at:
                raise OutOfMemoryError("CUDA out of memory while sampling")


def _fail(hook, tmp_path, **kw):
    counter = SimpleNamespace(value=0)
    acc = Accelerator(counter, kw.pop("save_error", None))
    args = SimpleNamespace(output_dir=str(tmp_path), output_name="lora", save_state=kw.pop("save_state", True))
    accumulation = kw.get("accumulation", 1)
    # The hook learns the boundary from the wrapped accumulate; here: the last multiple.
    try:
        _train(acc, args, counter, **kw)
    except OutOfMemoryError as exc:
        tb = exc.__traceback__
    done = [f for f in _frames(tb) if f.f_code.co_name == "_train"][0].f_locals["global_step"]
    hook._watch.boundary = done * accumulation
    return hook.save_at_failure(tb), acc


def _frames(tb):
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def _state(path) -> int:
    return json.loads(Path(path, "train_state.json").read_text())["current_step"]


def test_oom_inside_a_step_saves_the_steps_completed_not_one_more(hook, tmp_path):
    saved, acc = _fail(hook, tmp_path, fail_at_micro=6, accumulation=1)
    assert saved == str(tmp_path / "lora-step00000005-state")
    assert _state(saved) == 5  # sd-scripts' hook alone would write 6
    assert acc.zeroed is True and acc.saved_step == 5


def test_oom_mid_accumulation_counts_optimizer_steps_and_rewinds_the_micro_counter(hook, tmp_path):
    # accumulation 4, the 6th micro-batch fails: 1 optimizer step done, 1 micro-batch of the 2nd
    saved, acc = _fail(hook, tmp_path, fail_at_micro=6, accumulation=4)
    assert _state(saved) == 1 and Path(saved).name == "lora-step00000001-state"
    assert acc.saved_step == 4  # not 6: the relaunch's first step sums all 4 micro-batches


def test_oom_while_sampling_after_a_step_keeps_that_step(hook, tmp_path):
    saved, _ = _fail(hook, tmp_path, fail_at_micro=99, accumulation=2, sampling_oom_at=3)
    assert _state(saved) == 3


def test_a_failed_save_leaves_nothing_behind(hook, tmp_path):
    with pytest.raises(OSError):
        _fail(hook, tmp_path, fail_at_micro=4, save_error=OSError(28, "No space left on device"))
    assert not list(tmp_path.iterdir())


def test_nothing_is_saved_before_the_first_step_or_inside_the_optimizer(hook, tmp_path):
    saved, _ = _fail(hook, tmp_path, fail_at_micro=1)
    assert saved is None
    hook._watch.in_optimizer_step = True
    saved, _ = _fail(hook, tmp_path, fail_at_micro=3)
    assert saved is None and not list(tmp_path.iterdir())


def test_a_run_that_keeps_no_states_gets_none_at_the_failure(hook, tmp_path):
    saved, _ = _fail(hook, tmp_path, fail_at_micro=4, save_state=False)
    assert saved is None and not list(tmp_path.iterdir())


def test_a_state_already_saved_at_that_step_is_left_as_it_is(hook, tmp_path):
    done = tmp_path / "lora-step00000003-state"
    done.mkdir()
    (done / "train_state.json").write_text('{"current_step": 3}')
    (done / "random_states_0.pkl").write_bytes(b"kept")
    saved, acc = _fail(hook, tmp_path, fail_at_micro=4)
    assert saved == str(done) and acc.saved_step is None
    assert (done / "random_states_0.pkl").read_bytes() == b"kept"


def test_only_out_of_memory_errors_count(hook):
    assert hook._is_oom(OutOfMemoryError("x"))
    assert hook._is_oom(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"))
    assert not hook._is_oom(RuntimeError("Expected all tensors to be on the same device"))
    try:
        try:
            raise OutOfMemoryError("x")
        except OutOfMemoryError:
            raise RuntimeError("during handling")
    except RuntimeError as exc:
        assert hook._is_oom(exc)


def test_env_turns_it_on_and_puts_the_hook_folder_first_once():
    env = launcher.build_env({"PYTHONPATH": os.pathsep.join(["/a", str(launcher.emulate_dir())])}, save_at_oom=True)
    assert env[launcher.SAVE_AT_OOM_ENV] == "1"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(launcher.emulate_dir()), "/a"]
    assert launcher.SAVE_AT_OOM_ENV not in launcher.build_env({})


def test_sitecustomize_installs_it_lazily_and_only_when_asked(tmp_path):
    """A process that never imports accelerate is untouched: no import of torch, no excepthook."""
    code = "import sys; print('torch' in sys.modules, 'accelerate' in sys.modules, sys.excepthook is sys.__excepthook__)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env["PYTHONPATH"] = str(launcher.emulate_dir())
    env[launcher.SAVE_AT_OOM_ENV] = "1"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "False", "True"]
