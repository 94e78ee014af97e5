"""`kohya-tuner run` on two ranks of the real pinned sd-scripts (CPU, SD 1.5, 64 px).

`--cpu --gpus 0,1` rehearses a two-GPU run on the CPU: accelerate's multi-process launcher
(torchrun) starts both ranks. accelerate 1.6 wraps frozen models in DDP on the CPU only, which
DDP refuses, so the trainer runs with the harness's SDS_CPU_DDP_SHIM (docs/run.md says what it
stands for). One rank runs out of memory (SDS_INJECT_RANK=1): every rank must end, the attempt
is that rank's OOM, the relaunch resumes on both ranks, and the steps count once.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from harness import SCENARIOS, Real, cli_steps, explain, image_folder, lora_metadata, new_run, run_args
from realtrainer_launch import PEAK_GIB
from test_real_run import SMALL_OOM

pytestmark = pytest.mark.realtrainer
# Its jobs are whole scenarios, several launches each: conftest submits them first.
LONG_JOBS = True


def _backward_per_process(run) -> dict[int, Counter]:
    out: dict[int, Counter] = {}
    for line in run.ledger.read_text(encoding="utf-8").splitlines():
        pid, _, config = line.partition(" ")
        name = Path(config).name
        out.setdefault(int(name[len("attempt-"):-len(".config.toml")]), Counter())[int(pid)] += 1
    return out


PLANNED = 3


def prelaunch(pool, cases, tmp_path_factory) -> dict[str, object]:
    """Submits the scenario (conftest's `prelaunched`): "ranks" -> its Run."""
    if not cases:
        return {}
    real = Real.from_env()
    tmp_path = tmp_path_factory.mktemp("two_cpu_ranks")
    data = image_folder(real, tmp_path / "img", 8)
    run = new_run(tmp_path, real, SDS_INJECT_OOM_AT_BACKWARD=2, SDS_INJECT_RANK=1,
                  SDS_INJECT_ONCE_MARKER=tmp_path / "once", SDS_INJECT_OOM_MESSAGE=SMALL_OOM, SDS_CPU_DDP_SHIM=1)
    pool.submit("ranks", PEAK_GIB["sd15_two_ranks"], cli_steps(run, [
        run_args(run, real, data, steps=PLANNED, extra=("--gpus", "0,1", "--set", "train_batch_size=1",
                                                        "--set", "save_every_n_steps=1"))]))
    return {"ranks": run}


@pytest.fixture(scope="module")
def launched(prelaunched):
    return prelaunched[__name__]


def test_two_cpu_ranks_one_ranks_oom_resumes_on_both_and_counts_steps_once(launched):
    """8 images, batch 1 on each of 2 ranks: 4 optimizer steps an epoch, each of 2 images.
    Rank 1 runs out of memory at its 2nd backward, after the step-1 state."""
    pool, made = launched
    run = made["ranks"]
    planned = PLANNED
    (res,) = pool.result("ranks")
    assert res.returncode == 0, explain(res)
    attempts = run.attempts()
    assert [a["outcome"] for a in attempts] == ["oom", "success"], attempts
    first, second = attempts
    assert first["oom"]["rank"] == 1, first["oom"]
    assert not any("Free the GPU" in a or "other programs" in a for a in first["advice"]), first["advice"]
    assert "CUDA out of memory on rank 1 after step 1" in res.stdout, res.stdout[-3000:]
    assert second["start_step"] == 1 and second["resume_from"].endswith("lora-step00000001-state"), second
    # Both ranks of the first attempt ended (torchrun stops the survivor), both of the second trained.
    log1 = (run.out / "attempt-1.log").read_text(encoding="utf-8", errors="replace")
    assert "ChildFailedError" in log1 and "[rank1]: torch.OutOfMemoryError" in log1
    steps = run.trained_per_process()
    backward = _backward_per_process(run)
    for a in attempts:
        n = a["end_step"] - a["start_step"]
        per_rank = steps.get(a["attempt"], Counter())
        assert len(per_rank) == 2 and set(per_rank.values()) == {n}, (a["attempt"], per_rank)
        passes = backward.get(a["attempt"], Counter())
        assert len(passes) == 2, passes
        # The rank that ran out did n passes; its peer may finish one more before its all-reduce fails.
        assert min(passes.values()) == n and max(passes.values()) <= n + (a["outcome"] == "oom"), passes
    summary = run.summary()
    trained = sum(a["end_step"] - a["start_step"] for a in attempts)
    assert summary["total_steps"] == planned and summary["steps_done"] == trained == planned + summary["steps_redone"]
    assert summary["steps_redone"] == 0 and summary["status"] == "success"
    meta = lora_metadata(Path(summary["lora"]))
    # Steps count once: each optimizer step is one batch on every rank (global batch 1 x 2 ranks x
    # accumulation 1 = 2 images), so 8 images make 4 steps an epoch, not 8.
    assert meta["ss_steps"] == str(planned) and meta["ss_num_batches_per_epoch"] == "4", meta
    checked = run.earlier_files_untouched()
    SCENARIOS.append({"scenario": "2 CPU ranks, rank 1 OOM at backward 2", "planned": planned, "trained": trained,
                      "redone": summary["steps_redone"], "attempts": len(attempts), "wall_s": round(run.wall_s, 1),
                      "files_hashed": checked, "peak_rss_gib": round(run.peak_rss / 2**30, 2)})
