"""Round 48, behind batch 117's misses: the shell not finding the launcher in PowerShell's words, and a GUI's command
whose launcher path was empty ("'launch' is not recognized …"). Several forms, and text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text


@pytest.mark.parametrize("line", [
    "accelerate : The term 'accelerate' is not recognized as the name of a cmdlet, function, script file, or "
    "operable program.",
    "The term 'python.exe' is not recognized as the name of a cmdlet, function, script file, or operable progra",
    "torchrun : The term 'torchrun' is not recognized as the name of a cmdlet",
    "'launch' is not recognized as an internal or external command,",
    "'accelerate' is not recognized as an internal or external command,",
])
def test_the_launcher_not_found_is_a_failure_at_start_up(line):
    d = diagnose(parse_text("Start training LoRA Standard ...\n" + line + "\n"))
    assert d.outcome == "error" and d.phase == "model_load"


@pytest.mark.parametrize("line", [
    "The term 'foo' is not recognized as the name of a cmdlet, function, script file, or operable program.",
    "'.' is not recognized as an internal or external command,",
    "the launch term is not recognized by the scheduler",
])
def test_other_programs_not_found_are_not_the_launcher(line):
    d = diagnose(parse_text(line + "\n"))
    assert not (d.outcome == "error" and d.phase == "model_load")
