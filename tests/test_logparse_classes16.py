"""A record the parser has no rule for, logged before a failure nothing else places, with no step
counted: by the start-up convention (tests/data/public_logs/README.md) the job was starting. The
record places nothing by itself: a counted step, a caching pass, frames or a record after the failure
still decide, and a text with no record says no stage as before. Several record formats, each with a
message no rule reads."""
from __future__ import annotations

import pytest

from tests.logparse_texts import BAR, CACHING, HEAD, OOM, frame, phase

# Library frames alone: they say no stage of the job.
_LIBRARY = HEAD + frame("/venv/lib/python3.10/site-packages/somelib/tensors.py", 150, "make_room",
                        "buf = torch.empty(n, device=device)")
_RECORDS = [
    "INFO:my_trainer:the moon is full tonight\n",
    "2024-05-01 10:00:00,123 - INFO - my_trainer - the moon is full tonight\n",
    "2024-05-01 10:00:00 INFO     the moon is full tonight                         my_trainer.py:42\n",
    "2024-05-01 10:00:00.123 | INFO     | my_trainer:main:42 - the moon is full tonight\n",
    "WARNING:my_trainer:the moon is full tonight\n",
    "DEBUG:my_trainer:the moon is full tonight\n",
]


@pytest.mark.parametrize("record", _RECORDS)
def test_a_record_before_an_unplaced_failure_is_start_up(record):
    assert phase(record + _LIBRARY + OOM) == "model_load"
    assert phase(record + OOM) == "model_load"


@pytest.mark.parametrize("record", _RECORDS)
def test_the_record_places_nothing_that_something_else_places(record):
    # A counted step, a caching pass, and frames of a step keep their phase.
    assert phase(record + BAR + _LIBRARY + OOM) == "training"
    assert phase(record + CACHING + _LIBRARY + OOM) == "cache_latents"
    step = HEAD + frame("/sd/train_network.py", 900, "train", "accelerator.backward(loss)")
    assert phase(record + step + OOM) in ("first_step", "training")


@pytest.mark.parametrize("record", _RECORDS)
def test_a_record_after_the_failure_says_nothing_of_it(record):
    assert phase(_LIBRARY + OOM + record) == "unknown"


def test_without_a_record_library_frames_alone_say_no_stage():
    assert phase(_LIBRARY + OOM) == "unknown"
    assert phase(OOM) == "unknown"


def test_an_error_record_is_the_failure_not_the_job_logging():
    # An ERROR record is read as a failure line, never as the job going about its start-up.
    assert phase("ERROR:my_trainer:the moon is full tonight\n" + _LIBRARY + OOM) == "unknown"
