"""FLUX.1 dev on the real pinned `flux_train_network.py` (CPU, random weights, 64 px): the user's path.

`config --model flux` writes the plan, `check` accepts it, `run --cpu` trains it through an
injected OOM and a resume, and the final LoRA holds the planned steps. The model files are those
tools/realmodels/build_flux_random.py builds with sd-scripts' own classes: the FLUX.1 dev
transformer with one double and one single block (the loader builds the depth the checkpoint
has), the full CLIP-L, autoencoder and T5-XXL (fp8 e4m3 file). .ci/run builds them into the
cache and exports the KOHYA_TUNER_REAL_FLUX_* variables; without them the scenario is skipped
with that reason.

The only settings added to what `config` writes are the CPU harness's (harness.CPU_SETS: 64 px,
no buckets, SDPA, no workers, no sampling, accumulation 1) less its float32 precision, 16 T5
tokens instead of 512 (T5-XXL encodes every caption once at 4.8 B parameters, and at 512 tokens
that alone would take minutes on two cores), and `disable_mmap_load_safetensors`, sd-scripts' own
switch for a short host RAM: the fp8 T5-XXL is read and cast to bf16 tensor by tensor instead of
mapped and copied whole, which keeps the load peak near the 9.5 GB the bf16 T5-XXL itself needs
(13.8 GiB with the mapping, measured). The 12 GB preset trains in fp16 with fp8_base and
block swap, none of which the CPU runs: `run --cpu` switches them (fp16 to bf16, the other two
left out) and says so, which the scenario checks. A float32 FLUX is not an option here: the
T5-XXL would take 19 GB of host RAM.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from harness import (
    check_accounting,
    config_check_run,
    explain,
    lora_metadata,
    model_scenario,
    Real,
)
from realtrainer_launch import PEAK_GIB

pytestmark = pytest.mark.realtrainer
# Its jobs are whole scenarios, several launches each: conftest submits them first.
LONG_JOBS = True

FLUX_VARS = ("KOHYA_TUNER_REAL_FLUX_MODEL", "KOHYA_TUNER_REAL_FLUX_CLIP_L", "KOHYA_TUNER_REAL_FLUX_T5XXL",
             "KOHYA_TUNER_REAL_FLUX_AE", "KOHYA_TUNER_REAL_FLUX_TOKCACHE")
HARNESS = ("t5xxl_max_token_length=16", "disable_mmap_load_safetensors=true")


def _flux_missing() -> list[str]:
    return [v for v in FLUX_VARS if not os.environ.get(v)]


def prelaunch(pool, cases, tmp_path_factory) -> dict[str, tuple]:
    """Submits the scenario's CLI calls as one job (conftest's `prelaunched`) unless the model is
    missing: "flux" -> (its Run, the folder `config` writes, the planned steps)."""
    if not cases or _flux_missing():
        return {}
    real = Real.from_env()
    flux = {v.rsplit("_FLUX_", 1)[1].lower(): Path(os.environ[v]) for v in FLUX_VARS}
    # What a user gets for FLUX.1 dev on a 12 GB card, checked, then run through an OOM and a resume.
    return config_check_run(pool, "flux", PEAK_GIB["flux"], tmp_path_factory.mktemp("flux_config_check_run"), real,
                            base=flux["model"], tokcache=flux["tokcache"], harness=HARNESS,
                            files=["--clip-l", str(flux["clip_l"]), "--t5xxl", str(flux["t5xxl"]), "--ae",
                                   str(flux["ae"])])


@pytest.fixture(scope="module")
def launched(prelaunched):
    return model_scenario(prelaunched, __name__, _flux_missing(), "FLUX.1", "build_flux_random.py")


def test_flux_config_check_run_oom_resume(launched):
    pool, made = launched
    run, cfg, planned = made["flux"]
    results = pool.result("flux")

    # 1. config
    res = results[0]
    assert res.returncode == 0, explain(res)
    written = (cfg / "config.toml").read_text(encoding="utf-8")
    for line in ("cache_text_encoder_outputs = true", "network_train_unet_only = true", "fp8_base = true",
                 'network_module = "networks.lora_flux"', 'resolution = "64,64"'):
        assert line in written, line

    # 2. check
    res = results[1]
    assert res.returncode == 0, explain(res)
    verdict = json.loads(res.stdout)
    assert verdict["ok"] and verdict["script"] == "flux_train_network.py", verdict

    # 3. run
    res = results[2]
    assert res.returncode == 0, explain(res)
    # What the CPU cannot run is switched, and said: fp16 runs as bf16, fp8 weights and block swap are left out.
    said = res.stdout
    assert re.search(r"mixed_precision\s+bf16\s+\(--cpu\)", said), said[:3000]
    assert "--cpu: fp8_base = True left out" in said and "--cpu: blocks_to_swap = " in said, said[:3000]
    attempts = run.attempts()
    assert [a["outcome"] for a in attempts] == ["oom", "success"], attempts
    assert attempts[1]["start_step"] == 1 and attempts[1]["resume_from"].endswith("lora-step00000001-state")
    log1 = (run.out / "attempt-1.log").read_text(encoding="utf-8", errors="replace")
    assert "flux_train_network.py" in log1 and "Loaded T5xxl: <All keys matched successfully>" in log1, log1[-3000:]
    plan = (run.out / "attempt-1.config.toml").read_text(encoding="utf-8")
    assert "cache_text_encoder_outputs = true" in plan and 'mixed_precision = "bf16"' in plan
    assert "fp8_base" not in plan and "blocks_to_swap" not in plan, plan

    summary = check_accounting(run, "FLUX.1: config, check, run, OOM at backward 2", planned)
    assert summary["status"] == "success"
    assert len(run.ledger.read_text(encoding="utf-8").splitlines()) == summary["steps_done"]  # one pass a step
    meta = lora_metadata(Path(summary["lora"]))
    assert meta.get("ss_base_model_version", "").startswith("flux"), meta
