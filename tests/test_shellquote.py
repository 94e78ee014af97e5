"""What kohya-tuner shows as a command to copy is POSIX sh: each word, executed by every POSIX
shell here (dash first), gives back exactly the argument, for inputs built from every class
of awkward character; and the text never carries a terminal control character raw."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kohya_tuner.printable import CONTROL
from kohya_tuner.run.launcher import format_command
from kohya_tuner.shellquote import display_word, sh_quote

# dash is the plain POSIX sh of Debian and Ubuntu; `sh` may be bash in POSIX mode elsewhere.
SHELLS = [s for s in ("dash", "sh", "bash", "busybox") if shutil.which(s)]
if not SHELLS:  # pragma: no cover - every CI machine has a POSIX shell
    pytest.skip("no POSIX shell here", allow_module_level=True)

CLASSES = {
    "apostrophe": "'", "double quote": '"', "space": " ", "two spaces": "  ", "tab": "\t", "newline": "\n",
    "carriage return": "\r", "dollar": "$", "variable": "$HOME${IFS}", "command substitution": "$(touch CANARY)",
    "backtick": "`touch CANARY`", "backslash": "\\", "escaped quote": "\\'", "glob": "*?[a]", "tilde": "~",
    "hash": "#", "operators": ";&|<>(){}", "bang": "!", "percent": "%PATH%", "unicode": "ü日本🎨",
    "combining": "e\u0301", "terminal escape": "\x1b]0;PWNED\x07\x1b[2J", "C1 CSI": "\x9b", "DEL": "\x7f",
    "bidi override": "\u202e", "zero width": "\u200b", "leading dash": "-n", "equals": "--x=y",
    "undecodable byte": "\udcff", "printf format": "%s%d\\n\\033", "empty": "",
}


def _run(shell: str, words: list[str], cwd) -> bytes:
    text = " ".join(display_word(w) for w in words)
    argv = [shell, "-c", 'printf "%s\\0" ' + text] if shell != "busybox" else \
        [shell, "sh", "-c", 'printf "%s\\0" ' + text]
    res = subprocess.run([os.fsencode(a) for a in argv], cwd=cwd, capture_output=True, timeout=30,
                         env={"PATH": os.environ["PATH"], "HOME": "/home/nobody", "LC_ALL": "C.UTF-8"})
    assert res.returncode == 0, (shell, text, res.stderr)
    return res.stdout


def _expect(words: list[str]) -> bytes:
    return b"".join(os.fsencode(w) + b"\0" for w in words)


def _shown_safely(words: list[str]) -> None:
    text = " ".join(display_word(w) for w in words)
    assert not [c for c in CONTROL.findall(text) if c != "\n"], f"a control character is shown raw: {text!r}"
    text.encode("utf-8")  # nothing the terminal cannot be sent (no lone surrogates)


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("name", list(CLASSES))
def test_every_class_alone_at_either_end_and_inside(name, shell, tmp_path):
    c = CLASSES[name]
    words = [c, f"a{c}b", f"{c}z", f"z{c}", c * 3]
    assert _run(shell, words, tmp_path) == _expect(words), name
    _shown_safely(words)
    assert not list(tmp_path.iterdir()), "a command inside a value ran"


_WORDS = st.lists(st.one_of(st.sampled_from(list(CLASSES.values())), st.text(min_size=1, max_size=4)),
                  max_size=6).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(_WORDS.filter(lambda w: "\x00" not in w), min_size=1, max_size=4))
def test_mixed_classes_execute_back_to_the_same_argv(words, tmp_path):
    for shell in SHELLS[:2]:
        assert _run(shell, words, tmp_path) == _expect(words), (shell, words)
    _shown_safely(words)
    assert not list(tmp_path.iterdir())


def test_format_command_is_the_posix_form(tmp_path):
    argv = ["python", "-m", "accelerate.commands.launch", "/runs/it's \x1b[2J/ü\n/x.py", "--config_file", "$(x)"]
    text = format_command(argv)
    for shell in SHELLS:
        assert _run(shell, argv, tmp_path) == _expect(argv)
    assert "\x1b" not in text


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("name", [n for n in CLASSES if CLASSES[n] and "\x00" not in CLASSES[n]])
def test_the_written_launch_words_execute_back_too(name, shell, tmp_path):
    """sh_quote (launch.sh) carries every byte literally inside single quotes."""
    c = CLASSES[name]
    if "\udcff" in c:
        pytest.skip("a written script is UTF-8 text; undecodable bytes are never in a plan's paths")
    words = [c, f"a{c}b"]
    text = " ".join(sh_quote(w) for w in words)
    res = subprocess.run([shell, "-c", 'printf "%s\\0" ' + text] if shell != "busybox"
                         else [shell, "sh", "-c", 'printf "%s\\0" ' + text], cwd=tmp_path, capture_output=True,
                         timeout=30)
    assert res.returncode == 0 and res.stdout == _expect(words)
