"""`kohya-tuner run` end to end: the real CLI, the real `accelerate launch` (on the CPU),
the stand-in trainer in tests/standin. No GPU, no model weights.

The stand-in's memory model differs from kohya-tuner's estimator on purpose, so these
tests show the supervisor recovering from what the trainer reports. Budgets are taken
from the stand-in's own figures (STANDIN_REPORT) for the config `run` plans, so the
tests do not depend on the preset numbers of the day.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "standin"
PY = sys.executable

sys.path.insert(0, str(STANDIN))
from standin_trainer import read_safetensors_metadata  # noqa: E402


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    from PIL import Image

    d = tmp_path_factory.mktemp("images")
    for i in range(6):
        Image.new("RGB", (512, 512), (40 * i, 120, 200 - 20 * i)).save(d / f"img{i}.png")
        (d / f"img{i}.txt").write_text(f"mystyle, a picture number {i}", encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("models")
    out = {}
    for name in ("base", "clip_l", "t5xxl", "ae"):
        p = d / f"{name} file.safetensors"
        p.write_bytes(b"\0" * 64)
        out[name] = p
    return out


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STANDIN_", "ACCELERATE_"))}
    env["KOHYA_TUNER_HOME"] = str(tmp_path / "home")
    env["STANDIN_STEP_SECONDS"] = "0.005"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _args(model: str, out: Path, images: Path, models: dict[str, Path], *extra: str, steps: int = 12,
          cpu: bool = True) -> list[str]:
    # cpu=False: the stand-in plays a GPU trainer (fp8, block swap) on a machine without one, where
    # accelerate runs on the CPU anyway; --cpu would keep the ladder to what a CPU runs.
    args = ["run", "--model", model, "--job", "style", "--gpu", "24" if model == "flux" else "8"] + (
        ["--cpu"] if cpu else []) + [
            "--data", str(images), "--out", str(out), "--sd-scripts", str(STANDIN), "--steps", str(steps),
            "--base", str(models["base"])]
    if model == "flux":
        args += ["--clip-l", str(models["clip_l"]), "--t5xxl", str(models["t5xxl"]), "--ae", str(models["ae"])]
    return args + list(extra)


def _cli(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "kohya_tuner", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, encoding="utf-8")


def _attempts(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "attempts.jsonl").read_text(encoding="utf-8").splitlines() if line]


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text(encoding="utf-8"))


_NEEDS: dict[tuple, dict] = {}


def _need(tmp_path: Path, model: str, images: Path, models: dict[str, Path], *extra: str, steps: int = 12,
          cpu: bool = True) -> dict:
    """The stand-in's own memory figures for the config `run` would launch first (with --cpu
    or without it, as the run it measures for: --cpu leaves fp8 storage and block swap out)."""
    key = (model, extra, steps, str(images), cpu)
    if key in _NEEDS:
        return _NEEDS[key]
    out = tmp_path / "plan"
    res = _cli(_args(model, out, images, models, "--dry-run", "--json", *extra, steps=steps, cpu=cpu), _env(tmp_path))
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    script = STANDIN / {"sd15": "train_network.py", "flux": "flux_train_network.py"}[model]
    rep = subprocess.run([PY, str(script), "--config_file", plan["attempt_config"], "--dataset_config",
                          plan["files"]["dataset.toml"]], env=_env(tmp_path, STANDIN_REPORT="1"),
                         capture_output=True, text=True, timeout=60)
    assert rep.returncode == 0, rep.stderr
    _NEEDS[key] = json.loads(rep.stdout.strip().splitlines()[-1])
    return _NEEDS[key]


def _trained_steps(lora: str | Path) -> int:
    return int(read_safetensors_metadata(Path(lora))["standin_trained"])


def test_oom_mid_training_resumes_and_keeps_the_total_step_count(tmp_path, images, models):
    need = _need(tmp_path, "sd15", images, models)
    out = tmp_path / "my run ü; x"  # argument lists, never a shell: any path works
    env = _env(tmp_path, STANDIN_VRAM_GB=round(need["train"] * 0.85, 3), STANDIN_PEAK_STEP=6)
    res = _cli(_args("sd15", out, images, models, "--max-attempts", "6"), env)
    assert res.returncode == 0, res.stdout + res.stderr
    attempts = _attempts(out)
    assert len(attempts) >= 2
    first, last = attempts[0], attempts[-1]
    assert first["outcome"] == "oom" and first["phase"] in ("training", "first_step")
    assert first["end_step"] == 5  # steps 1-5 fit; the large bucket at step 6 did not
    assert first["states"], "states were saved before the OOM"
    resumed = attempts[1]
    assert resumed["resume_from"] is not None and resumed["start_step"] > 0
    assert resumed["changes"], "the retry changed settings"
    cfg = (out / "attempt-2.config.toml").read_text(encoding="utf-8")
    # A resumed attempt is a run of the steps left, under a name of its own.
    assert "resume = " in cfg and "initial_step = 0" in cfg and "skip_until_initial_step" not in cfg
    assert "max_train_steps = 7" in cfg and 'output_name = "lora-attempt2"' in cfg
    assert last["outcome"] == "success"
    summary = _summary(out)
    assert summary["status"] == "success" and summary["steps_done"] == 12
    # The weights saw exactly the planned number of optimizer steps across attempts.
    assert _trained_steps(summary["lora"]) == 12
    assert Path(summary["lora"]) == out / "output" / "lora.safetensors"
    for a in attempts:
        assert Path(a["log_file"]).is_file()
    page = (out / "report.html").read_text(encoding="utf-8")
    assert 'class="oom"' in page and "<script" not in page
    assert "SUCCESS" in res.stdout and "LoRA:" in res.stdout


def test_oom_at_model_load_is_fixed_before_training(tmp_path, images, models):
    need = _need(tmp_path, "flux", images, models, cpu=False)
    assert need["load"] > need["train"] * 0.8, need  # FLUX: loading is the tight moment
    budget = round(need["load"] - 0.6, 3)
    out = tmp_path / "run"
    res = _cli(_args("flux", out, images, models, "--max-attempts", "6", cpu=False),
               _env(tmp_path, STANDIN_VRAM_GB=budget))
    attempts = _attempts(out)
    assert attempts[0]["outcome"] == "oom" and attempts[0]["phase"] == "model_load"
    assert attempts[0]["end_step"] == 0 and not attempts[0]["states"]
    assert attempts[1]["resume_from"] is None  # nothing was saved yet
    assert res.returncode == 0, res.stdout + res.stderr
    summary = _summary(out)
    assert summary["status"] == "success" and _trained_steps(summary["lora"]) == 12


def test_oom_while_sampling_draws_smaller_previews_first(tmp_path, images, models):
    """A sampling OOM changes the previews, smaller first (ladder data, [[phase_rule]]): the next
    attempt draws from a copy of the prompt file with a smaller --w/--h, sampling stays on, your
    own prompt file is untouched, and nothing is redone."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("mystyle, a lighthouse --w 1024 --h 1024\n", encoding="utf-8")
    # --no-fit: the preset's batch 1, so sampling (not the training step) is what overflows.
    extra = ("--set", "sample_every_n_steps=4", "--set", f"sample_prompts={prompts}", "--no-fit")
    need = _need(tmp_path, "sd15", images, models, *extra)
    assert need["sample"] > need["train"], need
    budget = round((need["sample"] + need["train"]) / 2, 3)
    out = tmp_path / "run"
    res = _cli(_args("sd15", out, images, models, *extra), _env(tmp_path, STANDIN_VRAM_GB=budget))
    assert res.returncode == 0, res.stdout + res.stderr
    attempts = _attempts(out)
    assert len(attempts) == 2
    assert attempts[0]["outcome"] == "oom" and attempts[0]["phase"] == "sampling"
    assert attempts[0]["end_step"] == 4
    changes = {c["key"]: c for c in attempts[1]["changes"]}
    assert set(changes) == {"previews (--w/--h)", "sample_prompts"} and attempts[1]["move"] == "sample_smaller"
    size = changes["previews (--w/--h)"]
    assert size["old"] == "1024x1024" and size["new"] in ("768x768", "512x512")
    copy = Path(changes["sample_prompts"]["new"])
    assert copy == out / "attempt-2.sample_prompts.txt"
    side = size["new"].split("x")[0]
    assert copy.read_text(encoding="utf-8") == f"mystyle, a lighthouse --w {side} --h {side}\n"
    assert prompts.read_text(encoding="utf-8") == "mystyle, a lighthouse --w 1024 --h 1024\n"
    cfg = (out / "attempt-2.config.toml").read_text(encoding="utf-8")
    assert "sample_every_n_steps = 4" in cfg and str(copy) in cfg
    samples = sorted(p.name for p in (out / "output" / "sample").iterdir())
    # The resumed attempt counts its own 8 steps: it sampled at its steps 4 and 8 (run steps 8 and 12).
    assert [n for n in samples if n.startswith("lora-attempt2_")] == ["lora-attempt2_000004_00.png",
                                                                       "lora-attempt2_000008_00.png"], samples
    # sd-scripts samples before it saves its state of step 4; the state saved at the failure
    # holds step 4, so nothing is redone.
    assert attempts[1]["resume_from"].endswith("lora-step00000004-state") and attempts[1]["start_step"] == 4
    summary = _summary(out)
    assert summary["steps_lost"] == 0 and _trained_steps(summary["lora"]) == 12


def test_non_oom_error_is_diagnosed_and_not_retried(tmp_path, images, models):
    out = tmp_path / "run"
    res = _cli(_args("sd15", out, images, models), _env(tmp_path, STANDIN_ERROR_AT_STEP=3))
    assert res.returncode == 1
    attempts = _attempts(out)
    assert len(attempts) == 1 and attempts[0]["outcome"] == "error"
    assert "not retried" in res.stdout
    assert "Expected all tensors to be on the same device" in res.stdout
    assert _summary(out)["status"] == "failed"


def test_floor_reached_is_a_clear_failure(tmp_path, images, models):
    out = tmp_path / "run"
    res = _cli(_args("sd15", out, images, models, "--max-attempts", "12"), _env(tmp_path, STANDIN_VRAM_GB=0.4))
    assert res.returncode == 1
    summary = _summary(out)
    assert summary["status"] == "failed" and "floor" in summary["reason"]
    assert "floor" in res.stdout
    assert all(a["outcome"] == "oom" for a in _attempts(out))
    assert summary["attempts"] < 12


def test_host_ram_kill_is_answered_with_ram_moves(tmp_path, images, models):
    need = _need(tmp_path, "sd15", images, models)
    out = tmp_path / "run"
    env = _env(tmp_path, STANDIN_RAM_GB=round(need["ram"] - 0.3, 3))
    res = _cli(_args("sd15", out, images, models), env)
    assert res.returncode == 0, res.stdout + res.stderr
    attempts = _attempts(out)
    assert attempts[0]["outcome"] == "cpu_oom"
    assert attempts[1]["move"] == "ram_workers"
    assert {c["key"] for c in attempts[1]["changes"]} >= {"max_data_loader_n_workers"}


def test_hang_watchdog_stops_the_attempt(tmp_path, images, models):
    out = tmp_path / "run"
    t0 = time.monotonic()
    res = _cli(_args("sd15", out, images, models, "--hang-timeout", "0.05"), _env(tmp_path, STANDIN_HANG_AT_STEP=3))
    assert res.returncode == 1
    assert time.monotonic() - t0 < 60
    attempts = _attempts(out)
    assert len(attempts) == 1 and attempts[0]["outcome"] == "hang"
    assert "printed nothing" in res.stdout


def test_a_hang_only_sigkill_ends_is_no_ram_kill_and_continue_loads_in_process(tmp_path, images, models):
    # The launcher and the trainer deaf to SIGINT and SIGTERM (a rank wedged in a driver call keeps
    # accelerate waiting on it): kohya-tuner ends the hang with SIGKILL, and that status is its own doing.
    deaf = tmp_path / "deaf"
    deaf.mkdir()
    (deaf / "sitecustomize.py").write_text(
        "import os, signal, sys\n"
        "import time\n"
        "if os.environ.get('DEAF_HANG') and any('train_network.py' in a for a in sys.argv):\n"
        "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    while True:\n"
        "        time.sleep(1)\n", encoding="utf-8")
    out = tmp_path / "run"
    res = _cli(_args("sd15", out, images, models, "--hang-timeout", "0.05", "--set", "max_data_loader_n_workers=2"),
               _env(tmp_path, DEAF_HANG=1, PYTHONPATH=str(deaf)))
    assert res.returncode == 1
    first, = _attempts(out)
    assert first["exit_status"] in (-9, 137), first
    assert first["outcome"] == "hang" and (first.get("error") or {}).get("kind") != "cpu_oom"
    assert "out of RAM" not in res.stdout and "SIGKILL" not in res.stdout
    assert "--continue" in res.stdout and "max_data_loader_n_workers = 0" in res.stdout
    res = _cli(["run", "--continue", str(out)], _env(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    second = _attempts(out)[-1]
    assert second["outcome"] == "success"
    assert {c["key"]: c["new"] for c in second["changes"]}["max_data_loader_n_workers"] == 0
    assert "max_data_loader_n_workers = 0" in Path(second["config_file"]).read_text(encoding="utf-8")


def _descendants_gone(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for p in pids:
            try:
                if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT delivery is POSIX here")
def test_ctrl_c_leaves_no_orphans_and_continue_finishes_the_run(tmp_path, images, models):
    out = tmp_path / "run"
    events = tmp_path / "events.jsonl"
    env = _env(tmp_path, STANDIN_STEP_SECONDS="0.3")
    proc = subprocess.Popen([PY, "-m", "kohya_tuner", *_args("sd15", out, images, models, "--json-events",
                                                             str(events))],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        seen_state = False
        while time.monotonic() < deadline and not seen_state:
            time.sleep(0.2)
            if events.exists():
                seen_state = any(json.loads(line).get("event") == "saved" and json.loads(line).get("what") == "state"
                                 for line in events.read_text(encoding="utf-8").splitlines() if line)
        assert seen_state, "no state was saved in time"
        children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        assert children, "accelerate and the trainer should be running"
        # What a terminal's Ctrl-C does: SIGINT to the foreground process (the trainer lives
        # in its own session, so only kohya-tuner receives it).
        os.kill(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stdout + stderr
    assert _descendants_gone(children), "the trainer or accelerate outlived kohya-tuner"
    assert "--continue" in stdout + stderr
    summary = _summary(out)
    assert summary["status"] == "interrupted"
    interrupted = _attempts(out)[-1]
    assert interrupted["outcome"] == "interrupted" and interrupted["states"]
    # What the stop itself made the trainer print is no error of the attempt, and gets no advice.
    assert interrupted["advice"] == []
    assert interrupted["error"] is None or interrupted["error"].get("after_stop") is True
    kinds = [json.loads(line)["event"] for line in events.read_text(encoding="utf-8").splitlines() if line]
    assert kinds[0] == "attempt_start" and "progress" in kinds and kinds[-1] == "finished"

    res = _cli(["run", "--continue", str(out)], _env(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    attempts = _attempts(out)
    assert attempts[-1]["outcome"] == "success"
    assert attempts[-1]["resume_from"] is not None and attempts[-1]["start_step"] > 0
    summary = _summary(out)
    assert summary["status"] == "success" and _trained_steps(summary["lora"]) == 12
    # A finished run stays finished.
    again = _cli(["run", "--continue", str(out)], _env(tmp_path))
    assert again.returncode == 0 and "already finished" in again.stdout


def test_dry_run_prints_a_command_the_trainer_runs_to_success(tmp_path, images, models):
    out = tmp_path / "run"
    res = _cli(_args("sd15", out, images, models, "--dry-run"), _env(tmp_path))
    assert res.returncode == 0, res.stderr
    assert not (out / "attempts.jsonl").exists() and not (out / "output").exists()
    line = next(ln for ln in res.stdout.splitlines() if "accelerate.commands.launch" in ln)
    argv = shlex.split(line)
    assert argv[0] == PY or Path(argv[0]).resolve() == Path(PY).resolve()
    done = subprocess.run(argv, env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "output" / "lora.safetensors").is_file()
    # The same folder cannot be started over as a new run once it has output.
    again = _cli(_args("sd15", out, images, models), _env(tmp_path))
    assert again.returncode == 2 and "already holds files" in again.stderr


def test_probe_run_meets_the_oom_early_then_the_full_run_starts_fresh(tmp_path, images, models):
    need = _need(tmp_path, "sd15", images, models)
    out = tmp_path / "run"
    env = _env(tmp_path, STANDIN_VRAM_GB=round(need["train"] * 0.85, 3), STANDIN_PEAK_STEP=3)
    res = _cli(_args("sd15", out, images, models, "--probe-steps", "4"), env)
    assert res.returncode == 0, res.stdout + res.stderr
    attempts = _attempts(out)
    probes = [a for a in attempts if a["probe"]]
    assert probes[0]["outcome"] == "oom" and probes[0]["total_steps"] == 4
    assert probes[-1]["outcome"] == "success"
    full = [a for a in attempts if not a["probe"]]
    assert len(full) == 1 and full[0]["start_step"] == 0 and full[0]["resume_from"] is None
    # The full run met no OOM: the probe had already found settings that fit.
    assert full[0]["outcome"] == "success"
    assert _trained_steps(_summary(out)["lora"]) == 12
    assert (out / "probe" / "probe.safetensors").is_file()


def test_emulate_vram_plans_for_the_smaller_card_and_caps_the_trainer(tmp_path, images, models):
    out = tmp_path / "run"
    res = _cli(_args("sd15", out, images, models, "--emulate-vram", "6", "--json"), _env(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    log = (out / "attempt-1.log").read_text(encoding="utf-8")
    # The cap reached the trainer, and the sitecustomize came first on its PYTHONPATH.
    assert "emulated card: 6 GB" in log
    assert str(REPO / "kohya_tuner" / "run" / "emulate" / "sitecustomize.py") in log
    assert "6 GB" in (out / "config.toml").read_text(encoding="utf-8")  # the 6 GB preset class
    assert json.loads(res.stdout)["status"] == "success"


def test_success_records_measured_peak_in_history(tmp_path, images, models):
    """The supervisor in-process, with a VRAM sampler standing in for NVML."""
    from kohya_tuner import history
    from kohya_tuner.run.continuation import continuation
    from kohya_tuner.run.journal import Journal
    from kohya_tuner.run.loop import Supervisor
    from kohya_tuner.run.settings import RunSettings

    out = tmp_path / "run"
    env = _env(tmp_path)
    res = _cli(_args("sd15", out, images, models, "--dry-run", "--json"), env)
    assert res.returncode == 0, res.stderr
    settings = RunSettings.from_json(out, Journal(out).read_run())
    settings.gpu = {"name": "Fake RTX 3060", "total_gib": 11.76, "index": 0}
    settings.predicted_gib = 5.0

    class Sampler:
        def __init__(self, index):
            self.samples = []

        def start(self):
            self.samples += [(0.0, 0.4), (0.5, 4.8), (1.0, 5.6)]

        def stop(self):
            pass

        @property
        def peak_gib(self):
            return max(v for _, v in self.samples)

        @property
        def now_gib(self):
            return self.samples[-1][1]

    import os as _os

    old = dict(_os.environ)
    _os.environ.update({"KOHYA_TUNER_HOME": env["KOHYA_TUNER_HOME"], "STANDIN_STEP_SECONDS": "0.005"})
    try:
        sup = Supervisor(settings, sampler_factory=Sampler, base_env=env)
        outcome = sup.run(continuation([], settings))
        entries = history.load()
    finally:
        _os.environ.clear()
        _os.environ.update(old)
    assert outcome.status == "success", outcome.reason
    assert outcome.summary["peak_vram_gib"] == 5.6
    assert len(entries) == 1
    e = entries[0]
    assert e.gpu_name == "Fake RTX 3060" and e.model == "sd15"
    from kohya_tuner import memory

    # The uncorrected prediction for the settings that ran, not the plan-time figure: the monitor figure,
    # the CUDA context included, as NVML measures the process.
    expected = round(memory.estimate(settings.plan_config, settings.family, dataset=settings.dataset).monitor_gib, 3)
    assert e.measured_peak_gib == 5.6 and e.predicted_gib == expected != 5.0 and e.fingerprint
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.count("<svg") == 2 and "card 11.8 GiB" in page


def test_epoch_based_run_keeps_the_step_count_the_trainer_reported(tmp_path, images, models):
    extra = ("--set", "max_train_epochs=4")
    need = _need(tmp_path, "sd15", images, models, *extra)
    out = tmp_path / "run"
    env = _env(tmp_path, STANDIN_VRAM_GB=round(need["train"] * 0.85, 3), STANDIN_PEAK_STEP=5)
    res = _cli(_args("sd15", out, images, models, *extra), env)
    assert res.returncode == 0, res.stdout + res.stderr
    attempts = _attempts(out)
    reported = attempts[0]["total_steps"]
    assert reported != 12  # the epochs decided, not --steps
    cfg2 = (out / "attempt-2.config.toml").read_text(encoding="utf-8")
    left = reported - attempts[1]["start_step"]
    assert "max_train_epochs" not in cfg2 and f"max_train_steps = {left}" in cfg2
    summary = _summary(out)
    assert summary["total_steps"] == reported and _trained_steps(summary["lora"]) == reported


def test_untrainable_dataset_stops_before_anything_is_written(tmp_path, models):
    bad = tmp_path / "images"
    bad.mkdir()
    (bad / "a.png").write_bytes(b"not a png")
    (bad / "a.txt").write_text("caption", encoding="utf-8")
    out = tmp_path / "run"
    res = _cli(_args("sd15", out, bad, models), _env(tmp_path))
    assert res.returncode == 2
    assert "cannot be trained on" in res.stderr and "Traceback" not in res.stderr
    assert not out.exists()


def test_a_nan_loss_stops_the_trainer_and_the_run_fails_with_advice(tmp_path, images, models):
    """From the step the progress shows `avr_loss=nan`, training on would only end in a
    "success" with diverged weights: the trainer's process group is stopped there, the run
    fails with the outcome nan_loss and the causes to change, and --continue is refused."""
    out = tmp_path / "run"
    env = _env(tmp_path, STANDIN_NAN_AT_STEP=3, STANDIN_STEP_SECONDS=0.15)
    res = _cli(_args("sd15", out, images, models, steps=40), env)
    assert res.returncode == 1, res.stdout + res.stderr
    attempts = _attempts(out)
    assert len(attempts) == 1
    a = attempts[0]
    assert a["outcome"] == "nan_loss" and a["error"]["kind"] == "nan_loss"
    assert 3 <= a["end_step"] < 40, "the trainer was stopped at the NaN, not run to its end"
    summary = _summary(out)
    assert (summary["status"], summary["outcome"]) == ("failed", "nan_loss")
    assert summary["lora"] is None and summary["continue_command"] is None
    assert not (out / "output" / "lora.safetensors").exists()
    assert "became NaN at step" in summary["reason"]
    advice = " ".join(summary["advice"])
    assert "learning_rate" in advice and "--set" in advice
    shown = " ".join(res.stdout.split())
    assert "FAILED" in shown and "became NaN at step" in shown and "learning rate" in shown
    assert "stopping the trainer" in shown  # said live, as it happens
    left = [p for p in psutil.process_iter(["cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])]
    assert not left, "the trainer's process group was stopped"
    again = _cli(["run", "--continue", str(out)], env)
    assert again.returncode == 2 and "became NaN" in " ".join(again.stderr.split()), again.stderr


@pytest.mark.parametrize("encoding", ["ascii", "cp1252"])
def test_a_user_console_encoding_does_not_reach_the_trainer(encoding, tmp_path, images, models):
    # sd-scripts prints "running training / 学習開始": under the user's ascii or cp1252 the trainer would stop
    # there with UnicodeEncodeError; kohya-tuner reads its output as UTF-8 and has it written so.
    out = tmp_path / "run"
    res = subprocess.run([PY, "-m", "kohya_tuner", *_args("sd15", out, images, models, steps=4)],
                         env=_env(tmp_path, PYTHONIOENCODING=encoding), capture_output=True, timeout=120)
    assert res.returncode == 0, (res.stdout + res.stderr).decode(encoding, "replace")
    assert _summary(out)["status"] == "success"
    assert "学習開始" in (out / "attempt-1.log").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", ["report.html", "summary.json", "run.json", "attempts.jsonl", "events.jsonl",
                                  "attempt-1.dataset.toml", "attempt-2.config.toml"])
def test_a_users_file_named_like_a_run_record_is_never_written_over(name, tmp_path, images, models):
    out = tmp_path / "run"
    out.mkdir()
    (out / name).write_text("USERDATA\n", encoding="utf-8")
    res = _cli(_args("sd15", out, images, models, steps=2), _env(tmp_path))
    assert res.returncode == 2 and "never overwrites" in res.stderr and name in res.stderr
    assert (out / name).read_text(encoding="utf-8") == "USERDATA\n"
    assert sorted(p.name for p in out.iterdir()) == [name]  # nothing else written either


def test_a_dry_runs_plan_is_replaced_by_a_new_run(tmp_path, images, models):
    out = tmp_path / "run"
    assert _cli(_args("sd15", out, images, models, "--dry-run", steps=2), _env(tmp_path)).returncode == 0
    assert (out / "run.json").is_file()
    res = _cli(_args("sd15", out, images, models, steps=2), _env(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("how", ["copied", "moved"])
def test_a_run_folder_copied_or_moved_is_not_continued_into_the_old_place(how, tmp_path, images, models):
    import shutil

    out = tmp_path / "run"
    res = _cli(_args("sd15", out, images, models, steps=6), _env(tmp_path, STANDIN_ERROR_AT_STEP=3))
    assert res.returncode == 1
    there = tmp_path / "elsewhere"
    (shutil.copytree if how == "copied" else shutil.move)(str(out), str(there))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    res = _cli(["run", "--continue", str(there)], _env(tmp_path))
    assert res.returncode == 2 and "was planned in" in res.stderr and "Traceback" not in res.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written anywhere
    # The folder reached through a link to it is the same folder.
    if how == "copied":
        link = tmp_path / "link"
        link.symlink_to(out, target_is_directory=True)
        res = _cli(["run", "--continue", str(link), "--dry-run"], _env(tmp_path))
        assert res.returncode == 0, res.stdout + res.stderr


def test_an_out_that_is_the_image_folder_is_said(tmp_path, images, models):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(images, data)
    res = _cli(_args("sd15", data, data, models, "--dry-run", "--json", steps=2), _env(tmp_path))
    assert res.returncode == 0, res.stderr
    assert any("--out is the image folder" in c["message"] for c in json.loads(res.stdout)["checks"])
    res = _cli(["config", "--model", "sd15", "--job", "style", "--gpu", "8", "--data", str(data), "--out",
                str(tmp_path / "data2"), "--json"], _env(tmp_path))
    assert not any("image folder" in w for w in json.loads(res.stdout)["warnings"])
    res = _cli(["config", "--model", "sd15", "--job", "style", "--gpu", "8", "--data", str(data), "--out",
                str(data), "--json", "--force"], _env(tmp_path))
    assert any("--out is the image folder" in w for w in json.loads(res.stdout)["warnings"])
