"""launch.sh / launch.bat carry hostile paths as data, never as commands.

launch.sh is executed for real by every POSIX shell on this machine against a fake
`accelerate` that records its argv; launch.bat runs through the model of cmd.exe's
rules in cmdmodel.py (no cmd.exe here) and its text is checked for the escapes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cmdmodel import run_batch
from kohya_tuner import planfiles, presets
from kohya_tuner.errors import UserError

HOSTILE = [
    "$(touch CANARY)",
    "`touch CANARY`",
    "a;touch CANARY;b",
    "x' ; touch CANARY ; '",
    'say "hi" there',
    "%PATH%",
    "%SD_SCRIPTS%x",
    "100%",
    "!bang!",
    "!",
    "two\nlines; touch CANARY",
    "with space  and\ttab",
    "ünïcødé 日本 🎨",
    "$HOME ${IFS} ~ * ?",
    "& | < > ^ ( )",
    "trailing\\",
    "-n",
    "'",
    "\\$(touch CANARY)",
]
SHELLS = [s for s in ("sh", "dash", "bash", "busybox") if shutil.which(s)]
CMD_CANNOT = ('"', "\n", "\r")


def _plan(tmp_path, mixed_precision=None):
    plan = presets.compose("sd15", "character", 8, inputs={"output_dir": str(tmp_path / "o"), "output_name": "x"})
    if mixed_precision is not None:
        plan.config["mixed_precision"] = mixed_precision
    return plan


@pytest.fixture()
def fake_accelerate(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "accelerate"
    exe.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                   "json.dump(sys.argv[1:], open(os.environ['ARGV_OUT'], 'w'))\n")
    exe.chmod(0o755)
    return bindir


def _run_sh(shell, script: Path, bindir: Path, cwd: Path, args=(), env_extra=None):
    record = cwd.parent / "argv.json"
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "ARGV_OUT": str(record), "HOME": str(cwd)}
    env.update(env_extra or {})
    before = sorted(p.name for p in cwd.iterdir())
    res = subprocess.run([shell, str(script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in cwd.iterdir()) == before, "the script created files: a command ran"
    return json.loads(record.read_text())


def _expected(plan, sd, out_dir, extra=()):
    acc = planfiles.accelerate_args(plan.config.get("mixed_precision", "no"))
    return ["launch", *acc, f"{sd}/{plan.family.script}", "--config_file", str(out_dir / "config.toml"),
            "--dataset_config", str(out_dir / "dataset.toml"), *extra]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("hostile", HOSTILE)
def test_launch_sh_passes_hostile_paths_as_exact_argv(shell, hostile, tmp_path, fake_accelerate):
    """The sd-scripts path, the output folder and the user's own arguments arrive in
    accelerate's argv byte for byte, and nothing they contain is executed."""
    sd = f"/opt/{hostile}/sd-scripts"
    out_dir = Path(f"/runs/{hostile}/out")
    plan = _plan(tmp_path)
    files = planfiles.render(plan, {"datasets": []}, out_dir, sd_scripts=sd)
    assert ("launch.bat" in files.left_out) == any(c in hostile for c in CMD_CANNOT)
    text = files.texts["launch.sh"]
    script = tmp_path / "launch.sh"
    script.write_text(text)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    argv = _run_sh(shell, script, fake_accelerate, cwd, args=[hostile, "--x"])
    assert argv == _expected(plan, sd, out_dir, extra=[hostile, "--x"])


@pytest.mark.parametrize("shell", SHELLS)
def test_launch_sh_prefers_the_users_sd_scripts_variable(shell, tmp_path, fake_accelerate):
    plan = _plan(tmp_path)
    files = planfiles.render(plan, {"datasets": []}, tmp_path / "o", sd_scripts="/default/$(touch CANARY)")
    script = tmp_path / "launch.sh"
    script.write_text(files.texts["launch.sh"])
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    mine = "/mine/`touch CANARY`"
    argv = _run_sh(shell, script, fake_accelerate, cwd, env_extra={"SD_SCRIPTS": mine})
    assert argv == _expected(plan, mine, (tmp_path / "o").absolute())


@pytest.mark.parametrize("shell", SHELLS)
def test_launch_sh_quotes_settings_too(shell, tmp_path, fake_accelerate):
    """mixed_precision comes from --set; a hostile value is an argument, not a command."""
    plan = _plan(tmp_path, mixed_precision="fp16 $(touch CANARY); touch CANARY")
    files = planfiles.render(plan, {"datasets": []}, tmp_path / "o", sd_scripts="/sd")
    script = tmp_path / "launch.sh"
    script.write_text(files.texts["launch.sh"])
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    assert _run_sh(shell, script, fake_accelerate, cwd) == _expected(plan, "/sd", (tmp_path / "o").absolute())


@pytest.mark.parametrize("shell", SHELLS[:1])
def test_written_launch_sh_in_a_hostile_folder_runs(shell, tmp_path, fake_accelerate):
    """End to end on disk: the folder itself is named hostilely, launch.sh is written
    there by planfiles.write, made executable, and runs as `sh launch.sh`."""
    out_dir = tmp_path / "$(touch CANARY) `touch CANARY` it's %TEMP% !x!"
    out_dir.mkdir()
    plan = _plan(tmp_path)
    written = planfiles.write(planfiles.render(plan, {"datasets": []}, out_dir, sd_scripts="/sd;touch CANARY"),
                              out_dir)
    assert os.access(written["launch.sh"], os.X_OK)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    argv = _run_sh(shell, written["launch.sh"], fake_accelerate, cwd)
    assert argv == _expected(plan, "/sd;touch CANARY", out_dir)
    assert not list(tmp_path.rglob("CANARY"))


def _win(hostile: str) -> tuple[str, Path]:
    from pathlib import PureWindowsPath

    return f"C:\\sd\\{hostile}\\sd-scripts", PureWindowsPath(f"D:\\runs\\{hostile}\\out")


@pytest.mark.parametrize("hostile", [h for h in HOSTILE if not any(c in h for c in CMD_CANNOT)])
def test_launch_bat_carries_hostile_paths_under_cmd_rules(hostile, tmp_path):
    """Through cmd.exe's percent expansion, operators, carets and the C runtime's
    argv splitting (cmdmodel), every path reaches accelerate exactly and no operator
    (`&`, `|`, `<`, `>`) ends up outside quotes."""
    sd, out_dir = _win(hostile)
    plan = _plan(tmp_path)
    text = planfiles._bat_script(plan, sd, out_dir / "config.toml", out_dir / "dataset.toml")
    started = run_batch(text, env={"PATH": "C:\\Windows", "TEMP": "C:\\Temp"}, args=[])
    acc = planfiles.accelerate_args(plan.config["mixed_precision"])
    assert started == [["accelerate", "launch", *acc, f"{sd}\\{plan.family.script}",
                        "--config_file", str(out_dir / "config.toml"),
                        "--dataset_config", str(out_dir / "dataset.toml")]]
    # The escapes themselves: each % of the value doubled; ! left to the setlocal line.
    line = next(ln for ln in text.split("\r\n") if "set \"SD_SCRIPTS=" in ln)
    assert line.count("%") == 2 * sd.count("%")
    assert "DisableDelayedExpansion" in text.split("\r\n")[1]
    if not hostile.isascii():
        assert "chcp 65001" in text


def test_launch_bat_prefers_the_users_variable(tmp_path):
    plan = _plan(tmp_path)
    text = planfiles._bat_script(plan, "C:\\default", Path("D:/o/config.toml"), Path("D:/o/dataset.toml"))
    started = run_batch(text, env={"sd_scripts": "E:\\mine & calc"}, args=["--seed", "1"])
    script_at = 2 + len(planfiles.accelerate_args(plan.config["mixed_precision"]))
    assert started[0][script_at] == f"E:\\mine & calc\\{plan.family.script}"
    assert started[0][-2:] == ["--seed", "1"]


@pytest.mark.parametrize("bad", CMD_CANNOT)
def test_launch_bat_refuses_what_cmd_cannot_carry(bad, tmp_path):
    plan = _plan(tmp_path)
    with pytest.raises(UserError) as err:
        planfiles._bat_script(plan, f"/sd/a{bad}b", Path("/o/config.toml"), Path("/o/dataset.toml"))
    assert "launch.bat cannot carry the sd-scripts path" in err.value.message
    assert "cmd.exe has no way to quote" in err.value.message


@pytest.mark.parametrize("where", ["sd_scripts", "out"])
@pytest.mark.parametrize("bad", CMD_CANNOT)
def test_a_path_windows_cannot_have_leaves_launch_bat_out_not_the_plan(bad, where, tmp_path, fake_accelerate):
    """Such a path exists only on a POSIX system, where launch.sh carries it: the plan is
    written, launch.bat is left out with the reason, never a half-quoted one."""
    plan = _plan(tmp_path)
    out = tmp_path / (f"o{bad}x" if where == "out" else "o")
    sd = f"/sd/a{bad}b" if where == "sd_scripts" else "/sd"
    files = planfiles.render(plan, {"datasets": []}, out, sd_scripts=sd)
    assert "launch.bat" not in files.texts and "launch.sh" in files.texts
    assert "cmd.exe cannot quote" in files.left_out["launch.bat"]
    written = planfiles.write(files, out)
    assert not (out / "launch.bat").exists()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    assert _run_sh("sh", written["launch.sh"], fake_accelerate, cwd) == _expected(plan, sd, out)


def test_setting_values_are_quoted_in_launch_bat(tmp_path):
    plan = _plan(tmp_path, mixed_precision="fp16 & calc %PATH% ^x")
    text = planfiles._bat_script(plan, "C:\\sd", Path("D:/o/config.toml"), Path("D:/o/dataset.toml"))
    started = run_batch(text, env={"PATH": "C:\\Windows"}, args=[])
    assert "fp16 & calc %PATH% ^x" in started[0]


# ---- the cards of --gpus: the launch scripts start what `run` starts ----------------------

GPU_SETS = [(), (0,), (1,), (0, 1), (2, 0, 3)]
_DEVICE_NAMES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def _run_command(plan, sd: str, out_dir: Path, gpu_ids):
    """What `kohya-tuner run --gpus ...` launches for this plan: its accelerate options and the
    device variables it adds to a bare environment."""
    from kohya_tuner.families import get_family
    from kohya_tuner.run.settings import RunSettings, command_for

    settings = RunSettings(out_dir=out_dir, family=get_family("sd15"), script=Path(sd) / plan.family.script,
                           dataset_file=out_dir / "dataset.toml", plan_config=dict(plan.config), total_steps=4,
                           python="python", num_processes=max(1, len(gpu_ids)), gpu_ids=tuple(gpu_ids))
    argv, env = command_for(settings, out_dir / "config.toml", plan.config, base_env={})
    assert argv[1:3] == ["-m", "accelerate.commands.launch"]
    return ["launch", *argv[3:]], {k: env[k] for k in _DEVICE_NAMES if k in env}


@pytest.mark.parametrize("gpu_ids", GPU_SETS)
def test_launch_sh_starts_the_ranks_and_cards_run_starts(gpu_ids, tmp_path):
    """launch.sh, executed, gives accelerate the argv and the device variables `run` gives it
    (several cards: --multi_gpu --num_processes N --gpu_ids; one: CUDA_VISIBLE_DEVICES)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "accelerate"
    exe.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                   f"json.dump([sys.argv[1:], {{k: os.environ[k] for k in {_DEVICE_NAMES!r} if k in os.environ}}],"
                   " open(os.environ['ARGV_OUT'], 'w'))\n")
    exe.chmod(0o755)
    out_dir = (tmp_path / "o").absolute()
    plan = _plan(tmp_path)
    script = tmp_path / "launch.sh"
    script.write_text(planfiles.render(plan, {"datasets": []}, out_dir, sd_scripts="/sd",
                                       gpu_ids=gpu_ids).texts["launch.sh"])
    record = tmp_path / "rec.json"
    want = _run_command(plan, "/sd", out_dir, gpu_ids)
    for shell in SHELLS:
        res = subprocess.run([shell, str(script)], env={"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
                                                        "ARGV_OUT": str(record)},
                             capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, res.stderr
        assert json.loads(record.read_text()) == [want[0], want[1]], shell
    if len(gpu_ids) > 1:
        assert want[0][want[0].index("--num_processes") + 1] == str(len(gpu_ids)) and "--multi_gpu" in want[0]


@pytest.mark.parametrize("gpu_ids", GPU_SETS)
def test_launch_bat_starts_the_ranks_and_cards_run_starts(gpu_ids, tmp_path):
    out_dir = Path("D:/runs/o")
    plan = _plan(tmp_path)
    text = planfiles._bat_script(plan, "C:\\sd", out_dir / "config.toml", out_dir / "dataset.toml", gpu_ids)
    envs: list[dict[str, str]] = []
    started = run_batch(text, env={}, args=[], envs=envs)
    argv, env = _run_command(plan, "C:\\sd", out_dir, gpu_ids)
    script_at = argv.index(str(Path("C:\\sd") / plan.family.script))
    assert started[0][:script_at + 2] == ["accelerate", *argv[:script_at], f"C:\\sd\\{plan.family.script}"]
    assert {k: envs[0][k] for k in _DEVICE_NAMES if k in envs[0]} == env


def test_the_users_card_order_wins_in_launch_scripts_as_in_run(tmp_path):
    plan = _plan(tmp_path)
    text = planfiles._bat_script(plan, "C:\\sd", Path("D:/o/config.toml"), Path("D:/o/dataset.toml"), (1,))
    envs: list[dict[str, str]] = []
    run_batch(text, env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, args=[], envs=envs)
    assert envs[0]["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST" and envs[0]["CUDA_VISIBLE_DEVICES"] == "1"


def test_config_and_run_write_multi_gpu_launch_scripts(tmp_path):
    """`config --gpus 0,1` and `run --gpus 0,1` write launch scripts that start both ranks."""
    from tests.clihelp import invoke

    cfg = invoke("config", "--model", "sd15", "--job", "style", "--gpu", "12", "--gpus", "0,1",
                 "--out", tmp_path / "cfg", "--json")
    assert cfg.exit_code == 0, cfg.output
    one = invoke("config", "--model", "sd15", "--job", "style", "--gpu", "12", "--out", tmp_path / "one", "--json")
    steps = {json.loads(r.stdout)["config"]["max_train_steps"] for r in (cfg, one)}
    assert len(steps) == 2, "two ranks train the same image passes in fewer steps"
    for name in ("launch.sh", "launch.bat"):
        text = (tmp_path / "cfg" / name).read_text(encoding="utf-8")
        assert "--multi_gpu --num_processes 2 --gpu_ids" in text, name
    base = tmp_path / "base.safetensors"
    base.write_bytes(b"\0" * 64)
    data = tmp_path / "imgs"
    data.mkdir()
    from PIL import Image

    for i in range(4):
        Image.new("RGB", (512, 512), (40 * i, 120, 200)).save(data / f"i{i}.png")
        (data / f"i{i}.txt").write_text("a picture", encoding="utf-8")
    standin = Path(__file__).resolve().parents[1] / "standin"
    run = invoke("run", "--model", "sd15", "--job", "style", "--gpu", "12", "--cpu", "--gpus", "0,1", "--data", data,
                 "--out", tmp_path / "run", "--sd-scripts", standin, "--steps", "4", "--base", base, "--dry-run",
                 "--json")
    assert run.exit_code == 0, run.output
    assert "--multi_gpu --num_processes 2 --gpu_ids 0,1" in (tmp_path / "run" / "launch.sh").read_text()
