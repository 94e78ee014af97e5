"""SDXL on the real pinned `sdxl_train_network.py` (CPU, random-weight SDXL, 64 px): the user's path.

`config --model sdxl` writes the plan, `check` accepts it, `run --cpu` trains it through an
injected OOM and a resume, and the final LoRA holds the planned steps. The checkpoint is the
random-weight SDXL that tools/realmodels/build_sdxl_random.py builds with sd-scripts' own
classes and saver (.ci/run builds it into the cache and exports KOHYA_TUNER_REAL_SDXL_MODEL and
KOHYA_TUNER_REAL_SDXL_TOKCACHE); without them the scenario is skipped with that reason.

The plan is the one for a 16 GB card. The only settings added to what `config` writes are the CPU
harness's (harness.CPU_SETS: 64 px, no buckets, SDPA, float32, no workers, no sampling,
accumulation 1) and batch 1 (4 images, 3 steps: one epoch). Float32 because a CPU without bf16
instructions (AVX2 only, as on some machines this project's CI has run on) multiplies bf16
matrices about 50 times slower than float32 (with AVX-512 BF16 the two are close): a step took
193 s at 64 px in bf16 with `full_bf16`, and the scenario 9 minutes. The fit keeps float32
for 16 GB at 64 px (for 12 GB it moves to bf16), and the float32 SDXL with its text encoders
fits the host: about 15 GB at its peak, measured (the checkpoint is mapped, not read whole).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from harness import (
    CPU_SETS,
    SMALL_OOM_16GB,
    Real,
    check_accounting,
    cli_steps,
    explain,
    image_folder,
    lora_metadata,
    model_scenario,
    new_run,
    run_args,
)
from realtrainer_launch import PEAK_GIB

pytestmark = pytest.mark.realtrainer
# Its jobs are whole scenarios, several launches each: conftest submits them first.
LONG_JOBS = True

SDXL_VARS = ("KOHYA_TUNER_REAL_SDXL_MODEL", "KOHYA_TUNER_REAL_SDXL_TOKCACHE")


def _sdxl_missing() -> list[str]:
    return [v for v in SDXL_VARS if not os.environ.get(v)]


def prelaunch(pool, cases, tmp_path_factory) -> dict[str, tuple]:
    """Submits the scenario's CLI calls as one job (conftest's `prelaunched`) unless the model is
    missing: "sdxl" -> (its Run, the folder `config` writes, the planned steps)."""
    if not cases or _sdxl_missing():
        return {}
    real = Real.from_env()
    model, tokcache = Path(os.environ[SDXL_VARS[0]]), Path(os.environ[SDXL_VARS[1]])
    tmp_path = tmp_path_factory.mktemp("sdxl_config_check_run")
    data = image_folder(real, tmp_path / "img", 4)
    run = new_run(tmp_path, real, SDS_INJECT_OOM_AT_BACKWARD=2, SDS_INJECT_ONCE_MARKER=tmp_path / "once",
                  SDS_INJECT_OOM_MESSAGE=SMALL_OOM_16GB)
    planned = 3
    common = ["--set", f"tokenizer_cache_dir={tokcache}", "--set", "save_every_n_steps=1",
              *[a for s in CPU_SETS for a in ("--set", s)], "--set", "train_batch_size=1"]
    cfg = tmp_path / "cfg"
    steps = [
        # 1. config: what a user gets for SDXL on a 16 GB card.
        ["config", "--model", "sdxl", "--job", "character", "--gpu", "16", "--out", str(cfg),
         "--base", str(model), "--data", str(data), "--steps", str(planned), *common],
        # 2. check: the pinned sdxl_train_network.py would start it (with the dataset file launch.sh passes).
        ["check", str(cfg / "config.toml"), "--dataset-config", str(cfg / "dataset.toml"), "--json"],
        # 3. run: the same plan under supervision, an OOM at the 2nd backward, then the resume.
        run_args(run, real, data, steps=planned, gpu="16", model="sdxl", base=model, tokcache=tokcache,
                 drop=CPU_SETS, extra=tuple(common)),
    ]
    pool.submit("sdxl", PEAK_GIB["sdxl"], cli_steps(run, steps))
    return {"sdxl": (run, cfg, planned)}


@pytest.fixture(scope="module")
def launched(prelaunched):
    return model_scenario(prelaunched, __name__, _sdxl_missing(), "SDXL", "build_sdxl_random.py")


def test_sdxl_config_check_run_oom_resume(launched):
    pool, made = launched
    run, cfg, planned = made["sdxl"]
    results = pool.result("sdxl")

    # 1. config
    res = results[0]
    assert res.returncode == 0, explain(res)
    written = (cfg / "config.toml").read_text(encoding="utf-8")
    for line in ("cache_text_encoder_outputs = true", "network_train_unet_only = true",
                 'mixed_precision = "no"', 'resolution = "64,64"'):
        assert line in written, line

    # 2. check
    res = results[1]
    assert res.returncode == 0, explain(res)
    verdict = json.loads(res.stdout)
    assert verdict["ok"] and verdict["script"] == "sdxl_train_network.py", verdict

    # 3. run
    res = results[2]
    assert res.returncode == 0, explain(res)
    attempts = run.attempts()
    assert [a["outcome"] for a in attempts] == ["oom", "success"], attempts
    assert attempts[1]["start_step"] == 1 and attempts[1]["resume_from"].endswith("lora-step00000001-state")
    log1 = (run.out / "attempt-1.log").read_text(encoding="utf-8", errors="replace")
    assert "sdxl_train_network.py" in log1 and log1.count("All keys matched") >= 3, log1[-3000:]
    plan = (run.out / "attempt-1.config.toml").read_text(encoding="utf-8")
    assert "cache_text_encoder_outputs = true" in plan and 'mixed_precision = "no"' in plan

    summary = check_accounting(run, "SDXL: config, check, run, OOM at backward 2", planned)
    assert summary["status"] == "success"
    assert len(run.ledger.read_text(encoding="utf-8").splitlines()) == summary["steps_done"]  # one pass a step
    meta = lora_metadata(Path(summary["lora"]))
    assert meta.get("ss_base_model_version", "").startswith("sdxl"), meta
