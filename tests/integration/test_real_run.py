"""`kohya-tuner run` on the real pinned sd-scripts (CPU, random-weight SD 1.5, 64 px).

Each scenario goes through the installed CLI and the real `accelerate launch`, with faults
injected by tests/integration/inject/sitecustomize.py and the backward passes each launch
really completed counted in a ledger. What is checked everywhere: optimizer steps really
trained = planned + the steps an OOM threw away after the last state (and summary.json
says so), the final LoRA is where summary.json says, and no file an earlier attempt left
was removed or written over (hashed at every launch).

The scenarios start ahead of the tests that read them, two at a time where the machine has the
cores and the memory (realtrainer_launch.Prelaunched, one pool for the session); each has its own
folder and its own copy of the images (the trainer caches latents beside them), and its launches
follow one another as `run` makes them.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from typing import Callable

import pytest
from harness import SCENARIOS, Real, check_accounting, cli, explain, image_folder, new_run, run_args
from realtrainer_launch import PEAK_GIB


pytestmark = pytest.mark.realtrainer
# Its jobs are whole scenarios, several launches each: conftest submits them first.
LONG_JOBS = True

SMALL_OOM = ("CUDA out of memory. Tried to allocate 40.00 MiB. GPU 0 has a total capacity of 7.75 GiB of which "
             "20.00 MiB is free. Including non-PyTorch memory, this process has 7.71 GiB memory in use. Of the "
             "allocated memory 7.20 GiB is allocated by PyTorch, and 310.00 MiB is reserved by PyTorch but "
             "unallocated.")


@pytest.fixture(scope="module")
def real() -> Real:
    return Real.from_env()


# test -> what starts its scenario: (real, its folder) -> (the Run, the job that drives the CLI).
STARTS: dict[str, Callable] = {}


def starts(test: str):
    def register(fn):
        STARTS[test] = fn
        return fn
    return register


def _cli_job(run, args):
    """The job a simple scenario is: one `kohya-tuner run` to its end (the trainer's threads are
    what `run --cpu` gives accelerate, not the pool's)."""
    def job(extra_env=None):
        return cli(run, args)
    return job


def prelaunch(pool, cases, tmp_path_factory) -> dict[str, tuple]:
    """Submits every scenario this session runs from this module (conftest's `prelaunched`, in test
    order): test -> (its Run, its folder)."""
    real, runs = Real.from_env(), {}
    for test, _ in cases:
        if test in STARTS and test not in runs:
            folder = tmp_path_factory.mktemp(test.removeprefix("test_")[:40])
            run, job = STARTS[test](real, folder)
            runs[test] = (run, folder)
            pool.submit(test, PEAK_GIB["sd15"], job)
    return runs


@pytest.fixture(scope="module")
def launched(prelaunched):
    """(the queue the scenarios run in, test -> (its Run, its folder))."""
    return prelaunched[__name__]


def scenario(launched, test: str):
    """(the Run, the job's result, its folder) of a prelaunched scenario."""
    pool, runs = launched
    run, folder = runs[test]
    return run, pool.result(test), folder


SMALL_OOM_10GB = ("CUDA out of memory. Tried to allocate 40.00 MiB. GPU 0 has a total capacity of 9.75 GiB of which "
                  "20.00 MiB is free. Including non-PyTorch memory, this process has 9.71 GiB memory in use. Of the "
                  "allocated memory 9.20 GiB is allocated by PyTorch, and 310.00 MiB is reserved by PyTorch but "
                  "unallocated.")


@starts("test_users_run_oom_at_the_6th_backward_trains_exactly_8_steps")
def _users_run(real, tmp_path):
    run = new_run(tmp_path, real, SDS_INJECT_OOM_AT_BACKWARD=6, SDS_INJECT_ONCE_MARKER=tmp_path / "once")
    twelve = image_folder(real, tmp_path / "img", 12)
    return run, _cli_job(run, run_args(run, real, twelve, steps=8, extra=("--set", "save_every_n_steps=3")))


def test_users_run_oom_at_the_6th_backward_trains_exactly_8_steps(launched):
    """The reported case: 12 images, batch 4 (3 batches an epoch), OOM at the 6th backward,
    between two cadence saves (every 3 steps): the trainer saves the state of step 5 as the
    error ends step 6, and the relaunch resumes from it, past an epoch boundary, 0 redone."""
    run, res, _ = scenario(launched, "test_users_run_oom_at_the_6th_backward_trains_exactly_8_steps")
    assert res.returncode == 0, explain(res)
    attempts = run.attempts()
    assert [a["outcome"] for a in attempts] == ["oom", "success"]
    assert attempts[1]["start_step"] == 5 and attempts[1]["resume_from"].endswith("lora-step00000005-state")
    # The cadence saved at 3 only; the state at 5 is the one saved at the failure, and says 5.
    assert (run.output / "lora-step00000003.safetensors").is_file()
    assert not (run.output / "lora-step00000004-state").exists()
    state = json.loads((run.output / "lora-step00000005-state" / "train_state.json").read_text(encoding="utf-8"))
    assert state["current_step"] == 5
    log1 = (run.out / "attempt-1.log").read_text(encoding="utf-8", errors="replace")
    assert "state saved at the failure, step 5" in log1
    summary = check_accounting(run, "user: --steps 8, OOM at backward 6, saved at 5", 8)
    assert summary["steps_done"] == 8 and summary["steps_redone"] == 0
    assert "steps: 8 of 8" in res.stdout


@starts("test_oom_in_the_first_epoch_with_quiet_logs_resumes_from_the_state_on_disk")
def _quiet_logs(real, tmp_path):
    run = new_run(tmp_path, real, SDS_INJECT_OOM_AT_BACKWARD=3, SDS_INJECT_ONCE_MARKER=tmp_path / "once")
    twelve = image_folder(real, tmp_path / "img", 12)
    return run, _cli_job(run, run_args(run, real, twelve, steps=6, extra=("--set", "console_log_level=WARNING")))


def test_oom_in_the_first_epoch_with_quiet_logs_resumes_from_the_state_on_disk(launched):
    """console_log_level = WARNING: no state line reaches the log; the states on disk decide."""
    run, res, _ = scenario(launched, "test_oom_in_the_first_epoch_with_quiet_logs_resumes_from_the_state_on_disk")
    assert res.returncode == 0, explain(res)
    log1 = (run.out / "attempt-1.log").read_text(encoding="utf-8", errors="replace")
    assert "saving state" not in log1 and "Saving current state" not in log1
    attempts = run.attempts()
    assert [a["outcome"] for a in attempts] == ["oom", "success"]
    assert attempts[1]["start_step"] == 2 and attempts[1]["resume_from"].endswith("lora-step00000002-state")
    summary = check_accounting(run, "first epoch, console_log_level WARNING", 6)
    assert summary["steps_redone"] == 0


@starts("test_oom_at_load_then_a_save_at_the_failure_that_fails_falls_back_to_the_cadence_state")
def _load_then_save_fails(real, tmp_path):
    data = image_folder(real, tmp_path / "img", 4)
    # A small shortfall each time, so the ladder's cheapest moves answer it (the scenario is
    # about where the run restarts, not about which move).
    run = new_run(tmp_path, real, SDS_INJECT_OOM_AT_LOAD=1, SDS_INJECT_LOAD_ONCE_MARKER=tmp_path / "once-load",
                  SDS_INJECT_OOM_AT_BACKWARD=4, SDS_INJECT_ONCE_MARKER=tmp_path / "once",
                  SDS_INJECT_OOM_MESSAGE=SMALL_OOM, SDS_INJECT_SAVE_FAILS=1)
    return run, _cli_job(run, run_args(run, real, data, steps=4, extra=("--set", "train_batch_size=2",
                                                                        "--set", "save_every_n_steps=2")))


def test_oom_at_load_then_a_save_at_the_failure_that_fails_falls_back_to_the_cadence_state(launched):
    """Attempt 1 runs out of memory reading the checkpoint; attempt 2 at the 4th backward (step 3
    of 4, states every 2), and the state it tries to save at the failure cannot be written (the
    disk is full): the trainer says so, leaves no half-written folder, and the relaunch resumes
    from the cadence state at step 2, as it would without the save at the failure."""
    run, res, _ = scenario(
        launched, "test_oom_at_load_then_a_save_at_the_failure_that_fails_falls_back_to_the_cadence_state")
    assert res.returncode == 0, explain(res)
    attempts = run.attempts()
    assert [a["outcome"] for a in attempts] == ["oom", "oom", "success"]
    assert attempts[0]["phase"] == "model_load" and attempts[0]["end_step"] == 0
    assert attempts[1]["end_step"] == 3
    assert attempts[2]["start_step"] == 2 and attempts[2]["resume_from"].endswith("lora-attempt2-step00000002-state")
    log2 = (run.out / "attempt-2.log").read_text(encoding="utf-8", errors="replace")
    assert "could not save the state at the failure" in log2 and "No space left on device" in log2
    assert not [p for p in run.output.iterdir() if "step00000003" in p.name], sorted(run.output.iterdir())
    assert "step 3 is redone" in (attempts[2]["note"] or "")
    summary = check_accounting(run, "OOM at load, then the save at the failure fails", 4)
    assert summary["steps_redone"] == 1


@starts("test_oom_while_sampling_continues_from_the_step_it_sampled_at")
def _sampling(real, tmp_path):
    data = image_folder(real, tmp_path / "img", 4)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("mytoken, a picture --w 64 --h 64 --s 2 --d 1\n", encoding="utf-8")
    run = new_run(tmp_path, real, SDS_INJECT_OOM_AT_CALL="library.train_util:sample_image_inference:1",
                  SDS_INJECT_ONCE_MARKER=tmp_path / "once", SDS_INJECT_OOM_MESSAGE=SMALL_OOM)
    return run, _cli_job(run, run_args(run, real, data, steps=3, extra=(
        "--set", "train_batch_size=2", "--set", "save_every_n_steps=2", "--set", "sample_every_n_steps=2",
        "--set", "sample_at_first=false", "--set", f"sample_prompts={prompts}")))


def test_oom_while_sampling_continues_from_the_step_it_sampled_at(launched):
    """Sampling on (every 2 steps, 64 px, 2 sampler steps), states every 2: sd-scripts samples
    before it saves, so the first sample image runs out of memory after step 2 with no state of
    step 2 yet. The trainer saves it at the failure, and the relaunch turns sampling off and
    trains the 1 step left from there: nothing redone."""
    run, res, _ = scenario(launched, "test_oom_while_sampling_continues_from_the_step_it_sampled_at")
    assert res.returncode == 0, explain(res)
    attempts = run.attempts()
    assert [a["outcome"] for a in attempts] == ["oom", "success"]
    assert attempts[0]["phase"] == "sampling" and attempts[1]["move"] == "sample_less"
    assert attempts[1]["start_step"] == 2 and attempts[1]["resume_from"].endswith("lora-step00000002-state")
    summary = check_accounting(run, "OOM while sampling at step 2", 3)
    assert summary["steps_redone"] == 0


@starts("test_gradient_accumulation_past_an_epoch_boundary")
def _accumulation(real, tmp_path):
    twelve = image_folder(real, tmp_path / "img", 12)
    (tmp_path / "run-real").mkdir()
    run = new_run(tmp_path / "run-real", real, SDS_INJECT_OOM_AT_BACKWARD=9,
                  SDS_INJECT_ONCE_MARKER=tmp_path / "once", SDS_INJECT_OOM_MESSAGE=SMALL_OOM_10GB)
    args = run_args(run, real, twelve, steps=5, gpu="10", drop=("gradient_accumulation_steps=1",),
                    extra=("--no-fit", "--set", "network_train_unet_only=true"))
    return run, _cli_job(run, args)


def test_gradient_accumulation_past_an_epoch_boundary(launched):
    """Batch 2 x accumulation 2 (3 optimizer steps an epoch): the pinned trainer's skip mixes
    micro-batches and optimizer steps here even before an epoch boundary; the relaunch as a
    run of the steps left does not depend on it. OOM at the 9th backward: 4 steps done.
    Batch and accumulation come from the 10 GB preset, not from --set: the ladder moves the keys a
    user set last, and this scenario needs the resume-safe batch move to come first. The text
    encoder is left out of training from the start, and the OOM is a 10 GB card's (the small one's
    7.75 GiB total makes the ladder shrink a 10 GB plan by more than one move)."""
    run, res, _ = scenario(launched, "test_gradient_accumulation_past_an_epoch_boundary")
    assert res.returncode == 0, explain(res)
    attempts = run.attempts()
    assert [a["outcome"] for a in attempts] == ["oom", "success"]
    first = (run.out / "attempt-1.config.toml").read_text(encoding="utf-8")
    assert "train_batch_size = 2" in first and "gradient_accumulation_steps = 2" in first
    assert attempts[1]["resume_from"] and attempts[1]["resume_from"].endswith("step00000004-state"), attempts[1]
    assert attempts[0]["end_step"] == 4 and attempts[1]["start_step"] == 4
    summary = check_accounting(run, "accumulation 2, resume past an epoch", 5)
    assert summary["steps_redone"] == 0


@starts("test_a_crash_that_is_not_oom_is_not_retried")
def _crash(real, tmp_path):
    data = image_folder(real, tmp_path / "img", 4)
    run = new_run(tmp_path, real, SDS_INJECT_ERROR_AT_BACKWARD=2, SDS_INJECT_ONCE_MARKER=tmp_path / "once")
    return run, _cli_job(run, run_args(run, real, data, steps=4, extra=("--set", "train_batch_size=2")))


def test_a_crash_that_is_not_oom_is_not_retried(launched):
    run, res, _ = scenario(launched, "test_a_crash_that_is_not_oom_is_not_retried")
    assert res.returncode == 1, explain(res)
    attempts = run.attempts()
    assert len(attempts) == 1 and attempts[0]["outcome"] == "error"
    assert "not retried" in run.summary()["reason"]
    assert run.trained()[1] == 1
    SCENARIOS.append({"scenario": "non-OOM crash at backward 2", "planned": 4, "trained": sum(run.trained().values()),
                      "redone": 0, "attempts": 1, "wall_s": round(run.wall_s, 1), "files_hashed": 0,
                      "peak_rss_gib": round(run.peak_rss / 2**30, 2)})


@starts("test_ctrl_c_then_continue_finishes_the_run")
def _ctrl_c(real, tmp_path):
    from kohya_tuner.run.states import state_complete

    twelve = image_folder(real, tmp_path / "img", 12)
    run = new_run(tmp_path, real)
    args = run_args(run, real, twelve, steps=6)

    def job(extra_env=None):
        """Ctrl-C once a complete state is on disk, then (only after exit 130) `run --continue`:
        (whether the run ended first, the interrupted CLI's exit status, stdout, stderr, the
        continued CLI's result or None)."""
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "kohya_tuner", *args], env=run.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, encoding="utf-8")
        try:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and proc.poll() is None:
                states = [d for d in run.output.glob("lora-step*-state")] if run.output.is_dir() else []
                if any(state_complete(d) for d in states):
                    break
                time.sleep(0.5)
            ended = proc.poll() is not None
            if not ended:
                proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
        run.wall_s += time.monotonic() - t0
        done = proc.returncode == 130 and "--continue" in out
        return ended, proc.returncode, out, err, cli(run, ["run", "--continue", str(run.out)]) if done else None
    return run, job


def test_ctrl_c_then_continue_finishes_the_run(launched):
    run, (ended, code, out, err, res), _ = scenario(launched, "test_ctrl_c_then_continue_finishes_the_run")
    assert not ended, "the run ended before a state was saved"
    assert code == 130, out[-3000:] + err[-3000:]
    assert "--continue" in out
    assert res.returncode == 0, explain(res)
    attempts = run.attempts()
    assert [a["outcome"] for a in attempts] == ["interrupted", "success"]
    assert attempts[1]["start_step"] >= 1 and attempts[1]["resume_from"]
    check_accounting(run, "Ctrl-C, then run --continue", 6)


@starts("test_cpu_run_with_accumulation_4_survives_two_ooms_in_a_row")
def _two_ooms(real, tmp_path):
    data = image_folder(real, tmp_path / "img", 4)
    run = new_run(tmp_path, real, SDS_INJECT_OOM_AT_BACKWARD=6, SDS_INJECT_ONCE_MARKER=tmp_path / "once",
                  SDS_INJECT_LAUNCHES=2, SDS_INJECT_OOM_MESSAGE=SMALL_OOM)
    return run, _cli_job(run, run_args(run, real, data, steps=3, extra=("--set", "train_batch_size=1",
                                                                        "--set", "gradient_accumulation_steps=4",
                                                                        "--set", "save_every_n_steps=2")))


def test_cpu_run_with_accumulation_4_survives_two_ooms_in_a_row(real, launched):
    """`run --cpu` at batch 1 x accumulation 4 runs out of memory in two launches in a row, at
    the 6th backward each time (mid-accumulation, states every 2 steps). The ladder must offer
    only what a CPU runs (no fp8_base), leave the mixed_precision the user set alone, and answer
    the second OOM of the same phase with one move. Each failure saves the state of the step it
    ended (1, then 2) with accelerate's micro-step counter at the step's start, and the move the
    state cannot follow (another optimizer) continues from that state's LoRA weights: the run
    finishes with the planned steps and nothing redone."""
    run, res, _ = scenario(launched, "test_cpu_run_with_accumulation_4_survives_two_ooms_in_a_row")
    assert res.returncode == 0, explain(res)
    attempts = run.attempts()
    assert [a["outcome"] for a in attempts] == ["oom", "oom", "success"]
    no_cpu = {"fp8_base", "optimizer_8bit", "mixed_precision_fp16"}
    for a in attempts[1:]:
        assert not set(a["move"].split("+")) & no_cpu, a
        assert "+" not in a["move"] or a is attempts[1], a
        assert "mixed_precision" not in {c["key"] for c in a["changes"]}, a
    assert "one move at a time" in (attempts[2]["note"] or "")
    first = run.output / "lora-step00000001-state"
    assert attempts[1]["start_step"] == 1 and attempts[1]["resume_from"] == str(first)
    assert json.loads((first / "train_state.json").read_text(encoding="utf-8"))["current_step"] == 1
    # The 6th micro-batch failed 2 into step 2; the counter saved is the step's start (the epoch
    # of 4 micro-batches reset it to 0), so the relaunch's first step sums all 4.
    counter = subprocess.run([str(real.python), "-c", "import sys, torch; print(torch.load(sys.argv[1], "
                              "weights_only=False)['step'])", str(first / "random_states_0.pkl")],
                             capture_output=True, text=True, timeout=120)
    assert counter.stdout.strip() == "0", counter.stderr
    assert attempts[2]["start_step"] == 2
    third = (run.out / "attempt-3.config.toml").read_text(encoding="utf-8")
    if attempts[2]["resume_from"] is None:  # a move the state cannot follow
        assert "lora-attempt2-step00000001-state/model.safetensors" in third and "network_weights" in third
        assert "continues from the LoRA weights of the state at step 2" in attempts[2]["note"]
    summary = check_accounting(run, "--cpu, accumulation 4, two OOMs in a row", 3)
    assert summary["steps_redone"] == 0
