"""Log intelligence: read sd-scripts output like an expert and say what to do.

`LogParser` (streaming) and `parse_text` turn the trainer's output into typed events;
`diagnose` turns events into a `Diagnosis` (outcome, phase, step, OOM figures, error kind,
ranked advice). `is_oom` is the small predicate for one error text. All of it is pure:
no I/O, no printing, no torch. `read_log` (in `reader`) is the one file-reading helper.
"""

from __future__ import annotations

from kohya_tuner.logparse.diagnosis import Diagnosis, DiagnosisDetails, ErrorInfo, OomInfo, diagnose
from kohya_tuner.logparse.events import (
    ERROR_KINDS, PHASES, EpochStart, Event, Exited, Failure, Finished, Milestone, ModelFamily, Oom, OomFigures,
    Progress, Resumed, Saved, TotalSteps, Wrapper,
)
from kohya_tuner.logparse.parser import LogParser, parse_text
from kohya_tuner.logparse.oomfigures import oom_figures
from kohya_tuner.logparse.patterns import is_oom

__all__ = [
    "Diagnosis", "DiagnosisDetails", "ERROR_KINDS", "EpochStart", "ErrorInfo", "Event", "Exited", "Failure",
    "Finished", "LogParser", "Milestone", "ModelFamily", "Oom", "OomFigures", "OomInfo", "PHASES", "Progress",
    "Resumed", "Saved", "TotalSteps", "Wrapper", "diagnose", "is_oom", "oom_figures", "parse_text",
]
