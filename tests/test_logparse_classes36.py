"""Classes behind older held-out misses that recur: a callback run as training begins (an extension's
`on_train_begin_cli`, Lightning's `on_train_start`) and a job runner starting the job it was given ("Running 1
job", "Starting job … on GPU(s) 0"). Several forms of each, and text that must not be read so."""
from __future__ import annotations

import pytest

from tests.logparse_texts import BAR, CACHING, HEAD, frame, phase


@pytest.mark.parametrize("path, func, source", [
    ("/w/extensions/sd-webui-train-tools/train_ui.py", "on_train_begin_cli", None),
    ("/w/extensions/sd-webui-train-tools/train_ui.py", "start", "on_train_begin_cli(ck)"),
    ("/w/cldm/logger.py", "on_train_start", "self.prepare(pl_module)"),
])
def test_a_callback_run_as_training_begins_is_start_up(path, func, source):
    text = (HEAD + frame("D:\\w\\modules\\call_queue.py", 58, "f", "res = list(func(*args, **kwargs))")
            + frame(path, 147, func, source) + "KeyError: 'x'\n")
    assert phase(text) == "model_load"


@pytest.mark.parametrize("func", ["on_train_batch_end", "on_train_epoch_end", "on_training_step"])
def test_callbacks_run_later_are_not(func):
    text = BAR + HEAD + frame("/w/cldm/logger.py", 12, func, "self.log_img(pl_module, batch)") + "KeyError: 'x'\n"
    assert phase(text) != "model_load"


@pytest.mark.parametrize("line", ["Running 1 job", "[WORKER] Starting job 7ef25440-6d2e-4aa1 on GPU(s) 0",
                                  "Launching job my_lora_v1"])
def test_a_job_runner_starting_its_job_is_the_launch(line):
    assert phase(CACHING + line + "\n") == "model_load"


@pytest.mark.parametrize("line", ["Running job finished", "Starting jobs completed: 3", "Running jobless mode"])
def test_a_job_runner_reporting_the_end_is_not(line):
    assert phase(BAR + line + "\n") == "training"
