"""Lines printed for pasting into a shell are run by a shell here: whatever the folder name (spaces, a tab,
quotes, `$`, unicode, longer than the terminal), the shell gets back the path the user gave."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

EXE = [sys.executable, "-m", "kohya_tuner"]
NAMES = ["My LoRA projects/character training run number one/out", "tab\there", "it's \"quoted\" $HOME `x`",
         "ünïcödé 日本語 folder"]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or sys.platform == "win32", reason="needs bash")


def _run(*args, cols: int = 80):
    return subprocess.run([*EXE, *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": str(cols), "PYTHONIOENCODING": "utf-8"})


def _argv_of(line: str, program: str) -> list[str]:
    """The words a shell makes of a printed command line, with `program` swapped for printf."""
    assert line.startswith(program + " "), line
    got = subprocess.run(["bash", "-c", "printf '%s\\0' " + line[len(program) + 1:]], capture_output=True,
                         check=True)
    return got.stdout.decode("utf-8").split("\0")[:-1]


@pytest.mark.parametrize("name", NAMES)
def test_the_continue_command_of_a_dry_run_gives_back_the_folder(tmp_path, name):
    from PIL import Image

    data = tmp_path / "d"
    data.mkdir()
    for i in range(2):
        Image.new("RGB", (512, 512), (i * 90, 40, 40)).save(data / f"{i}.png")
    out = tmp_path / name
    res = _run("run", "--dry-run", "--model", "sd15", "--job", "character", "--gpu", "12", "--data", data,
               "--base", tmp_path / "missing.safetensors", "--out", out)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    at = lines.index("Start it supervised with:")
    assert _argv_of(lines[at + 1], "kohya-tuner") == ["run", "--continue", str(out)]


@pytest.mark.parametrize("name", NAMES)
def test_setup_lines_to_copy_give_back_the_checkout(tmp_path, name):
    from tests.test_sdscripts import make_fake_sd_scripts

    checkout = make_fake_sd_scripts(tmp_path / name / "sd-scripts")
    res = subprocess.run([*EXE, "setup", "--sd-scripts", str(checkout)], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "80", "PYTHONIOENCODING": "utf-8",
                              "KOHYA_TUNER_HOME": str(tmp_path / "home")})
    assert res.returncode == 0, res.stderr
    lines = [ln.strip() for ln in res.stdout.splitlines()]
    export = next(ln for ln in lines if ln.startswith("export KOHYA_SD_SCRIPTS="))
    got = subprocess.run(["bash", "-c", export + '\nprintf "%s" "$KOHYA_SD_SCRIPTS"'], capture_output=True,
                         check=True).stdout.decode("utf-8")
    assert got == str(checkout.resolve())
    flag = next(ln for ln in lines if ln.startswith("--sd-scripts "))
    assert _argv_of("x " + flag, "x") == ["--sd-scripts", str(checkout.resolve())]
