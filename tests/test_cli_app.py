"""The argparse front door: lazy command modules, flags as flags, errors as one paragraph or JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kohya_tuner.cli.app import COMMANDS
from tests.clihelp import invoke


def _modules_after(code: str) -> set[str]:
    probe = f"import sys, contextlib, io\n{code}\nprint('\\n'.join(sorted(sys.modules)))"
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(res.stdout.split())


def test_top_help_lists_every_command_without_importing_any():
    res = invoke("--help")
    assert res.exit_code == 0
    for name in COMMANDS:
        assert f"  {name} " in res.stdout
    mods = _modules_after("from kohya_tuner.cli.app import run\n"
                          "with contextlib.redirect_stdout(io.StringIO()): run(['--help'])")
    assert not any(m.startswith("kohya_tuner.cli.cmd_") for m in mods)
    assert "rich" not in mods and "pydantic" not in mods


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_help_imports_only_that_command(name):
    mods = _modules_after("from kohya_tuner.cli.app import run\n"
                          f"with contextlib.redirect_stdout(io.StringIO()): run([{name!r}, '--help'])")
    loaded = {m for m in mods if m.startswith("kohya_tuner.cli.cmd_")}
    # fit's help is fit's alone; a command may reuse a sibling's helpers only when it runs.
    assert loaded == {f"kohya_tuner.cli.{COMMANDS[name][0]}"}
    assert not {"torch", "pydantic", "accelerate"} & {m.split(".")[0] for m in mods}


def test_help_renders_flags_as_flags():
    res = invoke("config", "--help")
    assert res.exit_code == 0
    assert "--json" in res.stdout and "--set KEY=VALUE" in res.stdout and "--gpu GB|auto" in res.stdout
    assert "<bool>" not in res.stdout and "list[str]" not in res.stdout


def test_unknown_command_suggests_the_closest():
    res = invoke("estimat", "x.toml")
    assert res.exit_code == 2 and "estimate" in res.stderr and "Traceback" not in res.output


@pytest.mark.parametrize("argv", [
    ["config", "--model", "sdxl", "--job", "style", "--gpu", "nan", "--out", "o"],
    ["config", "--model", "sdxl", "--job", "style", "--gpu", "inf", "--out", "o"],
    ["config", "--model", "sdxl", "--job", "style", "--gpu", "1e400", "--out", "o"],
    ["config", "--model", "sdxl", "--job", "style", "--gpu", "12", "--out", "o", "--steps", "0"],
    ["config", "--model", "sdxl", "--job", "style", "--gpu", "12", "--out", "o", "--steps", str(2**63)],
    ["run", "--emulate-vram", "nan", "--continue", "x"],
    ["run", "--hang-timeout", "inf", "--continue", "x"],
    ["estimate", "x.toml", "--gpus", "0"],
    ["dataset", "check", "imgs", "--model", "sd15", "--resolution", "-512"],
    ["doctor", "--timeout", "nan"],
])
def test_non_finite_and_out_of_range_flags_are_refused(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = invoke(*argv)
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1  # one paragraph
    assert not (tmp_path / "o").exists()


def test_json_errors_are_an_object_on_stdout(tmp_path):
    parse_error = invoke("estimate", "--json")  # the CONFIG argument is missing
    assert parse_error.exit_code == 2
    assert set(json.loads(parse_error.stdout)["error"]) == {"message", "hint"}
    user_error = invoke("estimate", tmp_path / "missing.toml", "--json")
    assert user_error.exit_code == 2
    err = json.loads(user_error.stdout)["error"]
    assert "missing.toml" in err["message"]


def test_error_text_is_never_read_as_markup(tmp_path):
    odd = tmp_path / "[bold]x[/red].toml"
    res = invoke("estimate", odd)
    assert res.exit_code == 2
    assert "[bold]x[/red].toml" in res.stderr and "Traceback" not in res.output


@pytest.mark.parametrize("columns", ["80", "100", "160"])
@pytest.mark.parametrize("verbose", [False, True])
def test_config_output_cuts_no_value_at_any_width(columns, verbose, tmp_path):
    import os

    out = tmp_path / "o"
    argv = [sys.executable, "-m", "kohya_tuner", "config", "--model", "flux", "--job", "style", "--gpu", "24",
            "--out", str(out)] + (["--verbose"] if verbose else [])
    res = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "COLUMNS": columns})
    assert res.returncode == 0, res.stderr
    assert "…" not in res.stdout  # rich's mark for a cut cell
    data = json.loads(invoke("config", "--model", "flux", "--job", "style", "--gpu", "24", "--out",
                             tmp_path / "j", "--json").stdout)
    text = " ".join(res.stdout.split())
    for key in ("lr_scheduler", "optimizer_type", "network_dim", "mixed_precision"):
        assert str(data["config"][key]) in text, key
    if not verbose:
        assert len(res.stdout.splitlines()) < 60  # a summary, not the 250-line table
