"""An error record or a program's own error notice with no exception after it ("ERROR No image folders found",
"Error loading pipeline: …", "* Failed to load checkpoint *"): the run's failure when the log ends with it (maybe
then the launcher's exit), and nothing when a line after it shows the run going on."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import Failure, diagnose, parse_text

START = "prepare tokenizer\nloading model for process 0/1\n"


@pytest.mark.parametrize("tail", [
    "16:35:37-593454 ERROR    No image folders found in /data/img",
    "2024-05-01 10:00:00,000 - ERROR - trainer - No prompt file",
    "Error loading pipeline: Target modules {'to_q'} not found in the base model.",
    "Exception initializing accelerator: Accelerator.__init__() got an unexpected keyword argument 'project_dir'",
    "Fatal error in launcher: Unable to create process using '\"C:\\py\\python.exe\"'",
    "06/29/2023 03:28:28 AM  * Failed to load checkpoint *",
    "failed validation",
    "Error executing the command: Command ['python', 'preprocess.py'] returned non-zero",
])
def test_an_error_notice_that_ends_the_log_is_the_failure(tail):
    d = diagnose(parse_text(START + tail + "\n"))
    assert d.outcome == "error" and d.error is not None
    assert d.error.message.strip()


@pytest.mark.parametrize("after", [
    "\n\nsubprocess.CalledProcessError: Command '['accelerate', 'launch']' returned non-zero exit status 1.",
    "\n  * VAELoader 75:\n    - Value not in list: vae_name: 'ae.sft'",
])
def test_detail_rows_or_the_launchers_exit_after_it_keep_it_the_failure(after):
    d = diagnose(parse_text(START + "ERROR: Error loading pipeline: no such model\n" + after + "\n"))
    assert d.outcome == "error"


@pytest.mark.parametrize("after", [
    "INFO     loading VAE from checkpoint",
    "retry with subfolder='vae'",
    "steps:   1%|          | 1/100 [00:01<01:39,  1.00it/s, avr_loss=0.1]",
    "epoch 1/10",
    "Some ordinary line the job printed",
])
def test_a_line_after_it_that_shows_the_run_going_on_cancels_it(after):
    text = START + "16:35:37-593454 ERROR    Error during Git operation: exit status 128\n" + after + "\n"
    d = diagnose(parse_text(text))
    assert d.outcome != "error"


@pytest.mark.parametrize("line", [
    "Failed to quantize feed_forward.w2: tuple index out of range",
    "Failed to load ZLUDA: Could not find module 'hiprtc0507.dll'",
    "errors are logged below",
    "Error caught was No module named 'triton'",
])
def test_notices_a_run_survives_are_no_failure(line):
    assert diagnose(parse_text(START + line + "\n")).outcome != "error"


def test_the_first_of_several_error_records_is_the_cause():
    events = parse_text(START + "ERROR: Error loading pipeline: A\nERROR: Error while caching: B\n")
    failures = [e for e in events if isinstance(e, Failure)]
    assert len(failures) == 1 and "A" in failures[0].message and failures[0].tentative


def test_an_exception_after_the_record_is_the_failure_not_the_record():
    text = (START + "ERROR: Error loading pipeline: A\nTraceback (most recent call last):\n"
            '  File "/w/train.py", line 9, in main\n    load()\nValueError: the real cause\n')
    d = diagnose(parse_text(text))
    assert d.outcome == "error" and "the real cause" in d.error.message


def test_an_error_record_with_a_specific_kind_is_read_as_that_failure_once():
    events = parse_text(START + "ERROR: CUDA error: an illegal memory access was encountered\n")
    failures = [e for e in events if isinstance(e, Failure)]
    assert [f.kind for f in failures] == ["cuda_error"] and not failures[0].tentative
