"""`doctor`: is this machine ready to train LoRAs with sd-scripts?

    run_checks(sd_scripts=None, python=None, model=None) -> list[Check]
    probe_python(python=None) -> PythonProbe     (also used by `run` before it launches)
    exit_code(checks) -> 0 or 1

GPU facts come from NVML (kohya_tuner.gpu), never from torch; everything that needs
torch runs in a child process of the trainer's Python, so doctor starts instantly and a
broken CUDA install cannot crash it.
"""

from __future__ import annotations

from kohya_tuner.doctor.checks import Check, Facts, evaluate, exit_code, gather, ram_need_gib, run_checks
from kohya_tuner.doctor.probe import DEFAULT_TIMEOUT, PythonProbe, probe_python

__all__ = ["Check", "DEFAULT_TIMEOUT", "Facts", "PythonProbe", "evaluate", "exit_code", "gather", "probe_python",
           "ram_need_gib", "run_checks"]
