"""Which trainer lines say a process was killed with signal 9 by someone else (the kernel's OOM killer):
Python's, a shell's and torchrun's words for it, and lines that look alike but are not."""

from __future__ import annotations

import pytest

from kohya_tuner.run.loop import _KILLED

KILLED = [
    "subprocess.CalledProcessError: Command '['python', 'train_network.py']' died with <Signals.SIGKILL: 9>.",
    "ERROR: exit status -9",
    "train.sh: line 3: 4242 Killed                  python train_network.py",
    # torchrun's record of a failed rank (torch.distributed.elastic), as a rank killed by the OOM killer
    "  exitcode  : -9 (pid: 12478)",
    "  traceback : Signal 9 (SIGKILL) received by PID 12478",
]
NOT_KILLED = [
    "  exitcode  : 1 (pid: 12478)",
    "  exitcode  : -15 (pid: 12478)",
    "  traceback : Signal 15 (SIGTERM) received by PID 12478",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer",
    "steps:  40%|████      | 4/10 [00:09<00:13,  2.19s/it, avr_loss=0.0909]",
    "exitcode of the last run was -90",
]


@pytest.mark.parametrize("line", KILLED)
def test_a_kill_with_signal_9_is_seen(line):
    assert _KILLED.search(line)


@pytest.mark.parametrize("line", NOT_KILLED)
def test_other_ends_are_not_a_kill(line):
    assert not _KILLED.search(line)
