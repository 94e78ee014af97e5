"""`run` end to end on the stand-in trainer, under faults: a double Ctrl-C, a supervisor
killed mid-stop, a disk that fills mid-run, and a second run started into a live one.
The real CLI in a subprocess, the real `accelerate launch` on the CPU."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")]

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"
PY = sys.executable


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    from PIL import Image

    d = tmp_path_factory.mktemp("images")
    for i in range(6):
        Image.new("RGB", (512, 512), (40 * i, 120, 200 - 20 * i)).save(d / f"img{i}.png")
        (d / f"img{i}.txt").write_text(f"mystyle, picture {i}", encoding="utf-8")
    base = tmp_path_factory.mktemp("models") / "base.safetensors"
    base.write_bytes(b"\0" * 64)
    return {"images": d, "base": base}


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STANDIN_", "ACCELERATE_"))}
    env["KOHYA_TUNER_HOME"] = str(tmp_path / "home")
    env["STANDIN_STEP_SECONDS"] = "0.005"
    env["COLUMNS"] = "400"  # paths printed whole, so the assertions can find them
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _args(out: Path, inputs: dict, *extra: str, steps: int = 12) -> list[str]:
    return ["run", "--model", "sd15", "--job", "style", "--gpu", "8", "--cpu", "--data", str(inputs["images"]),
            "--out", str(out), "--sd-scripts", str(STANDIN), "--steps", str(steps), "--base", str(inputs["base"]),
            *extra]


def _cli(args: list[str], env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "kohya_tuner", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, encoding="utf-8", cwd=REPO)


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "kohya_tuner", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=REPO)


def _events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def _wait_for_state(events: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e.get("event") == "saved" and e.get("what") == "state" for e in _events(events)):
            return
        if proc.poll() is not None:
            raise AssertionError("the run ended before a state was saved: " + proc.stderr.read())
        time.sleep(0.1)
    raise AssertionError("no state was saved in time")


def _descendants(proc: subprocess.Popen) -> list[psutil.Process]:
    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _all_gone(procs: list[psutil.Process], within: float = 30) -> bool:
    gone, alive = psutil.wait_procs(procs, timeout=within)
    return not alive


def _attempt_lines(out: Path) -> list[dict]:
    p = out / "attempts.jsonl"
    return [json.loads(x) for x in p.read_text(encoding="utf-8").splitlines() if x.strip()] if p.exists() else []


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("second", ["SIGINT", "SIGKILL"])
def test_second_signal_keeps_the_record_and_continue_resumes(second, tmp_path, inputs):
    """Ctrl-C, then 0.2 s later a second Ctrl-C (or a SIGKILL of kohya-tuner itself):
    attempt 1 is in the journal with its state, and --continue resumes from the newest
    state as attempt 2, leaving attempt-1.log as it was."""
    out, events = tmp_path / "run", tmp_path / "events.jsonl"
    proc = _start(_args(out, inputs, "--json-events", str(events)), _env(tmp_path, STANDIN_STEP_SECONDS="0.3"))
    try:
        _wait_for_state(events, proc)
        kids = _descendants(proc)
        os.kill(proc.pid, signal.SIGINT)
        time.sleep(0.2)
        os.kill(proc.pid, getattr(signal, second))
        proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert _all_gone(kids), "the trainer outlived the stop"
    if second == "SIGINT":
        assert proc.returncode == 130
        assert [a["attempt"] for a in _attempt_lines(out)] == [1]
        assert _attempt_lines(out)[0]["outcome"] == "interrupted"
    else:
        pending = json.loads((out / "attempt-1.pending.json").read_text())
        assert pending["outcome"] == "interrupted" and pending["attempt"] == 1
    log1 = out / "attempt-1.log"
    before = _sha(log1)
    res = _cli(["run", "--continue", str(out)], _env(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    attempts = _attempt_lines(out)
    assert [a["attempt"] for a in attempts] == [1, 2] if second == "SIGINT" else [a["attempt"] for a in attempts] == [2]
    assert attempts[-1]["outcome"] == "success"
    assert attempts[-1]["resume_from"] and attempts[-1]["start_step"] > 0, "resumed from the newest state"
    assert _sha(log1) == before and (out / "attempt-2.log").exists()
    assert not (out / "attempt-1.pending.json").exists() or second == "SIGKILL"


def test_a_disk_that_fills_mid_run_ends_it_with_the_reason(tmp_path, inputs, tiny_disk):
    """The run folder on a tmpfs just big enough for pre-flight's 1.8 GiB, filled once a
    state is saved: the log write fails, the trainer is stopped, the run ends (no hang)
    saying the disk is full, the journal and summary are still written (the reserve),
    and after freeing space --continue finishes from the state."""
    if psutil.virtual_memory().available < 6 * 1024**3:
        pytest.skip("filling a 1.9 GiB tmpfs needs the memory")
    big = tiny_disk.parent / "big"
    big.mkdir()
    subprocess.run(["umount", "-l", str(tiny_disk)], check=False)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1900m", "tmpfs", str(big)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs")
    try:
        out, events = big / "run", tmp_path / "events.jsonl"
        proc = _start(_args(out, inputs, "--json-events", str(events), steps=40),
                      _env(tmp_path, STANDIN_STEP_SECONDS="0.2"))
        try:
            _wait_for_state(events, proc)
            from tests.faults.conftest import fill

            # The trainer is paused while the disk fills: on a loaded machine filling 1.9 GiB
            # can outlast the whole run, and the test is about a disk that is full mid-run.
            kids = _descendants(proc)
            for kid in kids:
                kid.suspend()
            try:
                fill(big, leave=0)
                st = os.statvfs(big)
                if st.f_bavail * st.f_frsize > 1 << 20:
                    pytest.skip("the tmpfs could not be filled (memory limits here)")
            finally:
                for kid in kids:
                    try:
                        kid.resume()
                    except psutil.NoSuchProcess:
                        pass
            stdout, stderr = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        text = " ".join((stdout + stderr).split())
        (tmp_path / "output.txt").write_text(stdout + "\n----\n" + stderr)
        assert proc.returncode == 1, text
        assert "Traceback" not in text
        # Whoever writes first meets the full disk: our log writer, or the trainer saving a
        # state or sample. Either way the run ends at once with the reason on record.
        ours = "cannot write the trainer's log" in text
        assert "attempt-1.log: the disk is full" in text if ours else "the disk is full: the trainer could not" in text
        summary = json.loads((out / "summary.json").read_text())  # written thanks to the reserve
        assert summary["status"] == "failed" and "the disk is full" in summary["reason"]
        assert "--continue" in " ".join(summary["advice"])
        assert _attempt_lines(out)[-1]["outcome"] == "error"
        (big / ".filler").unlink()
        res = _cli(["run", "--continue", str(out)], _env(tmp_path))
        assert res.returncode == 0, res.stdout + res.stderr
        assert _attempt_lines(out)[-1]["start_step"] > 0
    finally:
        subprocess.run(["umount", "-l", str(big)], check=False)


def test_a_live_run_refuses_a_second_one_into_its_folder(tmp_path, inputs):
    out, events = tmp_path / "run", tmp_path / "events.jsonl"
    proc = _start(_args(out, inputs, "--json-events", str(events)), _env(tmp_path, STANDIN_STEP_SECONDS="0.3"))
    try:
        _wait_for_state(events, proc)
        res = _cli(["run", "--continue", str(out)], _env(tmp_path))
        assert res.returncode == 2 and "is live" in res.stderr and str(proc.pid) in res.stderr
        res = _cli(_args(out, inputs), _env(tmp_path))
        assert res.returncode == 2 and "is live" in res.stderr
        os.kill(proc.pid, signal.SIGINT)
        proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert [a["attempt"] for a in _attempt_lines(out)] == [1]  # one attempt 1, not two
