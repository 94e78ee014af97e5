"""run/start.py plans a run from a request without the CLI: it prints nothing, hands its
warnings to the caller, and returns what `run --dry-run --json` shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kohya_tuner.run import start
from kohya_tuner.run.request import PreflightFailed, RunRequest
from tests.clihelp import invoke

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "standin"


@pytest.fixture
def inputs(tmp_path):
    from PIL import Image

    data = tmp_path / "imgs"
    data.mkdir()
    for i in range(6):
        Image.new("RGB", (512, 512), (40 * i, 120, 200 - 20 * i)).save(data / f"img{i}.png")
        (data / f"img{i}.txt").write_text(f"mystyle, a picture of thing {i}", encoding="utf-8")
    base = tmp_path / "base.safetensors"
    base.write_bytes(b"\0" * 64)
    return data, base


def _request(out: Path, data: Path, base: Path, **kw) -> RunRequest:
    fields = dict(model="sd15", job="style", gpu="8", out=out, data=data, base=str(base), steps=4, cpu=True,
                  sd_scripts=STANDIN, dry_run=True)
    fields.update(kw)
    return RunRequest(**fields)


def test_prepare_prints_nothing_and_returns_what_the_cli_shows(inputs, tmp_path, capsys):
    data, base = inputs
    warnings: list[str] = []
    prepared = start.prepare(_request(tmp_path / "a", data, base), warn=warnings.append)
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err == ""
    assert (tmp_path / "a" / "run.json").is_file() and (tmp_path / "a" / "attempt-1.config.toml").is_file()
    launch = prepared.launch
    assert launch.first_attempt == 1 and not launch.probe and launch.settings.total_steps == 4
    assert launch.settings.out_dir == tmp_path / "a"

    res = invoke("run", "--model", "sd15", "--job", "style", "--gpu", "8", "--cpu", "--data", data, "--out",
                 tmp_path / "b", "--sd-scripts", STANDIN, "--steps", "4", "--base", base, "--dry-run", "--json")
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout)
    assert shown.pop("dry_run") is True
    same = json.loads(json.dumps(prepared.summary).replace(str(tmp_path / "a"), str(tmp_path / "b")))
    # Pre-flight measures free RAM and disk each time; every other figure is the plan's.
    for summary in (shown, same):
        summary["checks"] = [c["name"] for c in summary["checks"]]
    assert shown == same


def test_a_plan_that_cannot_fit_is_a_warning_to_the_caller(inputs, tmp_path, capsys):
    data, base = inputs
    warnings: list[str] = []
    req = _request(tmp_path / "a", data, base, model="flux", gpu="4", clip_l=str(base), t5xxl=str(base), ae=str(base))
    prepared = start.prepare(req, warn=warnings.append)
    assert capsys.readouterr().err == ""
    assert len(warnings) == 1 and "cannot fit in 4 GB" in warnings[0] and "launching anyway" in warnings[0]
    assert prepared.fitted.fit is not None and not prepared.fitted.fit.fits


def test_a_failed_pre_flight_carries_its_report_and_writes_nothing(inputs, tmp_path):
    data, base = inputs
    with pytest.raises(PreflightFailed) as failed:
        start.prepare(_request(tmp_path / "a", data, base, python=str(tmp_path / "no-python")), warn=print)
    assert failed.value.report.failures
    assert failed.value.message.startswith("Pre-flight checks failed: ")
    assert not (tmp_path / "a" / "run.json").exists()


# ---- model paths that are not on this machine -----------------------------------------------

@pytest.mark.parametrize("how", ["absolute", "relative", "set", "preset", "several"])
def test_a_model_path_that_does_not_exist_is_refused_before_anything_is_written(how, inputs, tmp_path,
                                                                                monkeypatch):
    """sd-scripts would stop while loading it, after Python, torch and accelerate start: `run`
    refuses it first, in one paragraph, exit 2, with nothing written."""
    data, base = inputs
    monkeypatch.chdir(tmp_path)
    args = ["run", "--model", "sd15", "--job", "style", "--gpu", "8", "--cpu", "--data", data, "--out",
            tmp_path / "out", "--sd-scripts", STANDIN, "--steps", "4"]
    shown = {"absolute": "--base /nonexistent.safetensors",
             "relative": f"--base {tmp_path / 'models' / 'sd15.safetensors'}",
             "set": "pretrained_model_name_or_path = /nowhere/model.ckpt (from --set)",
             "preset": "pretrained_model_name_or_path = /nowhere/model.ckpt (from preset:mine.toml)",
             "several": "network_weights = /nowhere/start.safetensors (from --set)"}[how]
    if how == "absolute":
        args += ["--base", "/nonexistent.safetensors"]
    elif how == "relative":
        args += ["--base", "models/sd15.safetensors"]  # a path, not a hub id: it names a .safetensors file
    elif how == "set":
        args += ["--base", base, "--set", "pretrained_model_name_or_path=/nowhere/model.ckpt"]
    elif how == "preset":
        preset = tmp_path / "mine.toml"
        preset.write_text('[settings]\npretrained_model_name_or_path = "/nowhere/model.ckpt"\n', encoding="utf-8")
        args += ["--base", base, "--preset", preset]
    else:
        args += ["--base", "/nonexistent.safetensors", "--set", "network_weights=/nowhere/start.safetensors"]
    res = invoke(*args)
    assert res.exit_code == 2, res.output
    err = " ".join(res.stderr.split())
    assert shown in err and "not exist on this machine" in err and "nothing was launched" in err, err
    if how == "several":
        assert "--base /nonexistent.safetensors; network_weights" in err and "these do not exist" in err
    assert "Traceback" not in res.output and res.stderr.count("error:") == 1
    assert "\n\n" not in res.stderr.strip()
    assert not (tmp_path / "out").exists()


def _diffusers_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "sd15-diffusers"
    (folder / "unet").mkdir(parents=True)
    (folder / "model_index.json").write_text("{}", encoding="utf-8")
    return folder


@pytest.mark.parametrize("given", ["hub", "folder", "file"])
def test_what_sd_scripts_loads_is_not_refused(given, inputs, tmp_path):
    """A local file, a Diffusers folder and a Hugging Face id (which diffusers downloads) are
    all bases sd-scripts accepts: a real (not dry) run is prepared for each."""
    data, base = inputs
    value = {"hub": "runwayml/stable-diffusion-v1-5", "folder": str(_diffusers_folder(tmp_path)),
             "file": str(base)}[given]
    prepared = start.prepare(_request(tmp_path / "out", data, value, dry_run=False), warn=lambda _m: None)
    assert prepared.plan.config["pretrained_model_name_or_path"] == value
    assert not any(c.name == "model" for c in prepared.checks.checks)


def test_a_dry_run_plans_for_a_model_elsewhere_and_says_so(inputs, tmp_path):
    data, _base = inputs
    prepared = start.prepare(_request(tmp_path / "out", data, "/elsewhere/sd15.safetensors"), warn=lambda _m: None)
    warned = [c for c in prepared.checks.checks if c.name == "model"]
    assert len(warned) == 1 and warned[0].status == "warn"
    assert "--base /elsewhere/sd15.safetensors does not exist on this machine" in warned[0].message


def test_continue_refuses_a_model_file_gone_since_the_plan(inputs, tmp_path):
    data, base = inputs
    moved = tmp_path / "moved.safetensors"
    moved.write_bytes(base.read_bytes())
    res = invoke("run", "--model", "sd15", "--job", "style", "--gpu", "8", "--cpu", "--data", data, "--out",
                 tmp_path / "out", "--sd-scripts", STANDIN, "--steps", "4", "--base", moved, "--dry-run")
    assert res.exit_code == 0, res.output
    moved.unlink()
    res = invoke("run", "--continue", tmp_path / "out")
    assert res.exit_code == 2, res.output
    err = " ".join(res.stderr.split())
    assert f"pretrained_model_name_or_path = {moved} (from the run's plan)" in err and "nothing was launched" in err
    assert not list((tmp_path / "out").glob("attempt-*.log"))


def test_a_cpu_run_fits_the_cards_plan_then_switches_what_the_cpu_cannot_run(inputs, tmp_path):
    """FLUX.1 on 12 GB fits with fp8 weights and block swap. `--cpu` stands in for that card: the
    fit and the estimate are the card's plan, and only then are fp8_base and block swap left out
    (with a note each). Switched before the fit, the plan looked 22 GiB large, the fit spent
    every CPU-runnable move before the first launch and the first OOM found the ladder empty."""
    data, base = inputs
    t5 = tmp_path / "t5xxl_fp8_e4m3fn.safetensors"
    t5.write_bytes(b"\0" * 64)
    req = _request(tmp_path / "a", data, base, model="flux", gpu="12", clip_l=str(base), t5xxl=str(t5), ae=str(base))
    warnings: list[str] = []
    prepared = start.prepare(req, warn=warnings.append)
    assert warnings == []
    fit = prepared.fitted.fit
    assert fit is not None and fit.fits, fit.message
    assert prepared.summary["predicted_peak_gib"] <= prepared.fitted.budget_gib
    launched = (tmp_path / "a" / "attempt-1.config.toml").read_text(encoding="utf-8")
    assert "fp8_base" not in launched and "blocks_to_swap" not in launched, launched
    assert 'mixed_precision = "bf16"' in launched, launched
    # The card's plan needed no downgrade, so none was made: the LoRA is the preset's.
    changed = {str(c[0]) for st in fit.steps for c in st.changes}
    assert not changed & {"network_dim", "network_args", "full_bf16", "sample_every_n_steps"}, fit.steps
    notes = " ".join(prepared.plan.notes)
    assert "--cpu: fp8_base = True left out" in notes and "--cpu: blocks_to_swap" in notes, notes


def _link_python(where: Path, target: str) -> Path:
    where.parent.mkdir(parents=True, exist_ok=True)
    where.symlink_to(target)
    return where


def _venv_python(where: Path) -> Path:
    """A venv's python that is this interpreter with its packages (a link would lose them: a venv is
    found from the path it is started by)."""
    import shlex
    import sys

    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    where.chmod(0o755)
    return where


@pytest.mark.skipif(__import__("sys").platform == "win32", reason="a POSIX venv layout and shell wrapper")
def test_run_and_doctor_train_with_the_installs_own_venv(inputs, tmp_path):
    """A manual sd-scripts install with venv/ inside, and a kohya_ss GUI whose venv sits beside its
    sd-scripts/ submodule: `run` launches with that venv's python, the one `doctor` checks; a venv
    whose python points at nothing is named as broken, never passed over for another interpreter."""
    import shutil
    import sys

    from kohya_tuner import sdscripts
    from kohya_tuner.doctor.checks import _trainer_python

    data, base = inputs
    manual = tmp_path / "manual sd-scripts"
    shutil.copytree(STANDIN, manual)
    py = _venv_python(manual / "venv" / "bin" / "python")
    gui = tmp_path / "kohya_ss"
    shutil.copytree(STANDIN, gui / "sd-scripts")
    (gui / "kohya_gui.py").write_text("# the GUI's entry point\n")
    gui_py = _venv_python(gui / "venv" / "bin" / "python")
    for folder, expected, n in ((manual, py, "m"), (gui, gui_py, "g"), (gui / "sd-scripts", gui_py, "s")):
        prepared = start.prepare(_request(tmp_path / f"out-{n}", data, base, sd_scripts=folder), warn=lambda m: None)
        assert prepared.launch.settings.python == str(expected)
        assert Path(prepared.argv[0]) == expected
        checkout = sdscripts.locate(folder)
        assert _trainer_python(None, checkout)[0] == str(expected)
        assert sdscripts.requirements_command(checkout)[0] == str(expected)
    # Without a venv: this interpreter. With --python: that one.
    plain = start.prepare(_request(tmp_path / "out-p", data, base), warn=lambda m: None)
    assert plain.launch.settings.python == sys.executable
    given = start.prepare(_request(tmp_path / "out-q", data, base, sd_scripts=manual, python=sys.executable),
                          warn=lambda m: None)
    assert given.launch.settings.python == sys.executable
    # A broken venv is what both name, and the pre-flight refuses it.
    py.unlink()
    _link_python(py, str(tmp_path / "gone" / "python3.10"))
    found = sdscripts.install_python(manual)
    assert found is not None and found.path == py and "does not exist" in found.broken
    exe, source = _trainer_python(None, sdscripts.locate(manual))
    assert exe == str(py) and "broken" in source
    with pytest.raises(PreflightFailed):
        start.prepare(_request(tmp_path / "out-b", data, base, sd_scripts=manual, dry_run=False), warn=lambda m: None)


def test_a_gui_cloned_without_its_submodule_is_told_how_to_fetch_it(tmp_path):
    from kohya_tuner import sdscripts
    from kohya_tuner.errors import UserError

    gui = tmp_path / "kohya_ss"
    (gui / "sd-scripts").mkdir(parents=True)
    (gui / "kohya_gui.py").write_text("")
    with pytest.raises(UserError) as exc:
        sdscripts.locate(gui)
    assert "submodule update --init" in exc.value.hint
