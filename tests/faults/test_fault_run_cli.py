"""`run` refuses what it cannot do before it does anything: --continue with a dry run
never trains, flags --continue cannot apply are named, a file is not a run folder,
--json-events and --out must be writable, and one run folder holds one live run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from PIL import Image

from kohya_tuner.run.lock import LOCK_NAME, RunLock
from tests.clihelp import invoke

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"


@pytest.fixture()
def planned(tmp_path):
    """A run folder as `run --dry-run` leaves it (planned, never launched)."""
    data = tmp_path / "imgs"
    data.mkdir()
    for i in range(4):
        Image.new("RGB", (512, 512), (30 * i, 90, 10)).save(data / f"i{i}.png")
        (data / f"i{i}.txt").write_text(f"ohwx {i}\n")
    base = tmp_path / "base.safetensors"
    base.write_bytes(b"\0" * 64)
    out = tmp_path / "run"
    args = ["run", "--model", "sd15", "--job", "style", "--gpu", "8", "--cpu", "--data", data, "--out", out,
            "--sd-scripts", STANDIN, "--steps", "12", "--base", base]
    res = invoke(*args, "--dry-run")
    assert res.exit_code == 0, res.output
    return {"out": out, "args": args}


def _files(folder: Path) -> dict[str, float]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def test_continue_dry_run_never_trains_and_writes_nothing(planned):
    out = planned["out"]
    before = _files(out)
    res = invoke("run", "--continue", out, "--dry-run")
    assert res.exit_code == 0, res.output
    assert "nothing launched" in res.output and "accelerate.commands.launch" in res.output
    assert _files(out) == before  # no attempts.jsonl, no log, no state, no new config
    res = invoke("run", "--continue", out, "--dry-run", "--json")
    data = json.loads(res.stdout)
    assert data["dry_run"] is True and data["attempt"] == 1 and "--config_file" in data["command"]
    assert _files(out) == before


@pytest.mark.parametrize("extra, named", [
    (["--set", "learning_rate=1e-4"], "--set"), (["--gpu", "12"], "--gpu"), (["--model", "sdxl"], "--model"),
    (["--force"], "--force"), (["--steps", "5", "--job", "style"], "--job, --steps"),
])
def test_continue_refuses_flags_it_cannot_apply(planned, extra, named):
    res = invoke("run", "--continue", planned["out"], *extra)
    assert res.exit_code == 2 and "Traceback" not in res.output
    text = " ".join(res.output.split())
    assert "cannot be applied" in text and all(f in text for f in named.split(", "))


def test_continue_on_a_file_says_it_is_not_a_run_folder(planned):
    res = invoke("run", "--continue", planned["out"] / "run.json")
    assert res.exit_code == 2 and "is a file, not a run folder" in res.output and "Traceback" not in res.output
    res = invoke("run", "--continue", planned["out"] / "nothing-here")
    assert res.exit_code == 2 and "does not exist" in res.output


@pytest.mark.parametrize("dry", [True, False])
def test_json_events_into_a_folder_is_refused_at_start(planned, tmp_path, dry):
    flags = ["--dry-run"] if dry else []
    res = invoke("run", "--continue", planned["out"], "--json-events", tmp_path, *flags)
    assert res.exit_code == 2 and "is a folder; it needs a file name" in " ".join(res.output.split())
    new_out = tmp_path / "other"
    res = invoke(*[a if a != planned["out"] else new_out for a in planned["args"]], "--json-events", tmp_path, *flags)
    assert res.exit_code == 2 and "is a folder" in res.output
    assert not new_out.exists()  # refused before anything was written


def test_json_events_in_a_read_only_place_is_refused_at_start(planned, tmp_path, make_readonly):
    ro = make_readonly(tmp_path / "ro")
    for target in (ro / "events.jsonl", ro / "sub" / "events.jsonl"):
        res = invoke("run", "--continue", planned["out"], "--json-events", target, "--dry-run")
        assert res.exit_code == 2 and "cannot be written" in res.output and "read-only" in res.output


def test_out_on_a_read_only_folder_says_read_only(planned, tmp_path, make_readonly):
    ro = make_readonly(tmp_path / "ro")
    args = [a if a != planned["out"] else ro / "run" for a in planned["args"]]
    res = invoke(*args, "--dry-run")
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "read-only" in res.output and "GiB free" not in res.output


def _holder(cmd: str = "import time; time.sleep(120)") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", cmd])


def _write_lock(out: Path, pid: int, start_time: float | None) -> None:
    import socket

    (out / LOCK_NAME).write_text(json.dumps({"pid": pid, "start_time": start_time, "host": socket.gethostname(),
                                             "since": "earlier", "command": "run"}))


def test_a_live_run_locks_its_folder_against_continue_and_a_new_run(planned):
    out = planned["out"]
    proc = _holder()
    try:
        _write_lock(out, proc.pid, psutil.Process(proc.pid).create_time())
        res = invoke("run", "--continue", out, "--dry-run")
        assert res.exit_code == 2 and f"A kohya-tuner run is live in {out}" in " ".join(res.output.split())
        assert f"process {proc.pid}" in res.output
        res = invoke(*planned["args"], "--dry-run")
        assert res.exit_code == 2 and "is live" in res.output
    finally:
        proc.kill()
        proc.wait()
    res = invoke("run", "--continue", out, "--dry-run")
    assert res.exit_code == 0, res.output
    assert "stale run lock" in " ".join(res.output.split()) and str(proc.pid) in res.output
    assert not (out / LOCK_NAME).exists()  # released when the command ended


def test_a_reused_pid_is_not_a_live_lock(tmp_path):
    """Same pid, another start time: the process that held the lock is gone (the pid now
    belongs to something else), so the lock is stale."""
    me = psutil.Process(os.getpid())
    _write_lock(tmp_path, me.pid, me.create_time() - 3600)
    with RunLock(tmp_path) as lock:
        assert lock.stale is not None and lock.stale.pid == me.pid
        held = json.loads((tmp_path / LOCK_NAME).read_text())
        assert held["pid"] == os.getpid() and abs(held["start_time"] - me.create_time()) < 1
    assert not (tmp_path / LOCK_NAME).exists()


def test_two_concurrent_takers_get_one_lock(tmp_path):
    """Race for a fresh folder (O_EXCL via a hard link): of two processes exactly one
    holds the lock; the other is told who."""
    code = ("import sys, time; from kohya_tuner.run.lock import RunLock; from kohya_tuner.errors import UserError\n"
            "try:\n    l = RunLock(sys.argv[1]).acquire()\nexcept UserError as e:\n    print('refused'); sys.exit(0)\n"
            "print('held', flush=True); time.sleep(3); l.release()")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              cwd=REPO) for _ in range(2)]
    outs = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert outs == ["held", "refused"]


def test_lock_is_released_and_refused_runs_leave_no_folder(tmp_path):
    res = invoke("run", "--model", "sd15", "--job", "style", "--gpu", "8", "--data", tmp_path / "missing",
                 "--out", tmp_path / "new")
    assert res.exit_code == 2
    assert not (tmp_path / "new").exists()


def test_continue_dry_run_says_it_continues_from_saved_weights(planned):
    """The last attempt continued from the LoRA weights of step 4 with a fresh optimizer (an
    optimizer move) and was interrupted before it saved a state: continuing starts from those
    weights again, not from step 0, and the dry run says so."""
    from kohya_tuner import config_io
    from kohya_tuner.run.journal import AttemptRecord, Journal
    from kohya_tuner.run.settings import RunSettings
    from kohya_tuner.run.states import attempt_config

    out = planned["out"]
    j = Journal(out)
    settings = RunSettings.from_json(out.absolute(), j.read_run())
    weights = Path(settings.plan_config["output_dir"]) / "lora-step00000004-state" / "model.safetensors"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"\0" * 64)
    second = attempt_config(settings.plan_config, resume_from=None, resume_step=4, total_steps=12, attempt=2,
                            weights_from=str(weights))
    config_io.write_new(j.config_path(2), config_io.dumps_config(second, script=settings.family.script), force=True)
    j.append(AttemptRecord(attempt=1, started="t", config_file=str(j.config_path(1)), log_file=str(j.log_path(1)),
                           reason="the fitted plan", end_step=5, total_steps=12, outcome="oom", exit_status=1))
    j.append(AttemptRecord(attempt=2, started="t", config_file=str(j.config_path(2)), log_file=str(j.log_path(2)),
                           reason="out of memory: optimizer move", move="optimizer", start_step=4, end_step=5,
                           total_steps=12, outcome="interrupted", exit_status=130))
    res = invoke("run", "--continue", out, "--dry-run", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert (data["weights_from"], data["start_step"], data["resume_from"]) == (str(weights), 4, None)
    res = invoke("run", "--continue", out, "--dry-run")
    text = " ".join(res.output.split())
    assert "starts from step 0" not in text
    assert f"continues from the LoRA weights {weights} of step 4 with a fresh optimizer" in text
    assert "trains the 8 steps left" in text
