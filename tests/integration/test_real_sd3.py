"""SD3 Medium on the real pinned `sd3_train_network.py` (CPU, random weights, 64 px): the user's path.

`config --model sd3` writes the plan, `check` accepts it, `run --cpu` trains it through an
injected OOM and a resume, and the final LoRA holds the planned steps. The model files are those
tools/realmodels/build_sd3_random.py builds with sd-scripts' own classes: the SD3 Medium MMDiT
with 4 joint blocks and the full SD3 autoencoder in one base file (the loader builds the depth the
checkpoint has), the full CLIP-L and CLIP-G, and the full T5-XXL (fp8 e4m3 file, the FLUX build's
where there is one). Without the KOHYA_TUNER_REAL_SD3_* variables the builder prints, the scenario
is skipped with that reason.

Heavy, so opt-in: it runs only with KOHYA_TUNER_REAL_ALL=1. Each launch holds 11.5 GiB of host
RAM at its peak (the bf16 T5-XXL, 9.5 GB, and both CLIPs while the captions are encoded), the
scenario takes over two minutes on two cores, and CI's suite already trains FLUX.1 with the same
T5-XXL; a plain run skips it.

The settings added to what `config` writes are FLUX's (test_real_flux.py): the CPU harness's
(harness.CPU_SETS) less its float32 precision, 16 T5 tokens instead of the default 256, and
`disable_mmap_load_safetensors`, for the same reasons: a float32 T5-XXL would need 19 GB of host
RAM, and the mapped file on top of its bf16 copy would push the peak past what two launches on a
24 GB host leave. The two 12 GB plans differ, and the scenario checks each as it is: `config`'s
fit budgets 10.02 GiB, finds the 64 px plan's peak (10.40 GiB, caching the text encoders' outputs)
over it and adds fp8_base; `run --cpu`'s fit budgets 10.93 GiB for the same card and keeps the
bf16 base, and switches fp16 to bf16 and says so.
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

SD3_VARS = ("KOHYA_TUNER_REAL_SD3_MODEL", "KOHYA_TUNER_REAL_SD3_CLIP_L", "KOHYA_TUNER_REAL_SD3_CLIP_G",
            "KOHYA_TUNER_REAL_SD3_T5XXL", "KOHYA_TUNER_REAL_SD3_TOKCACHE")
HARNESS = ("t5xxl_max_token_length=16", "disable_mmap_load_safetensors=true")
LAUNCH_ALL = os.environ.get("KOHYA_TUNER_REAL_ALL", "").strip() == "1"
SD3_PEAK_GIB = PEAK_GIB["sd3"]


def _sd3_missing() -> list[str]:
    return [v for v in SD3_VARS if not os.environ.get(v)]


def prelaunch(pool, cases, tmp_path_factory) -> dict[str, tuple]:
    """Submits the scenario's CLI calls as one job (conftest's `prelaunched`) unless the model is
    missing or KOHYA_TUNER_REAL_ALL is not 1: "sd3" -> (its Run, the folder `config` writes, the
    planned steps)."""
    if not cases or not LAUNCH_ALL or _sd3_missing():
        return {}
    real = Real.from_env()
    sd3 = {v.rsplit("_SD3_", 1)[1].lower(): Path(os.environ[v]) for v in SD3_VARS}
    # What a user gets for SD3 Medium on a 12 GB card, checked, then run through an OOM and a resume.
    return config_check_run(pool, "sd3", SD3_PEAK_GIB, tmp_path_factory.mktemp("sd3_config_check_run"), real,
                            base=sd3["model"], tokcache=sd3["tokcache"], harness=HARNESS,
                            files=["--clip-l", str(sd3["clip_l"]), "--clip-g", str(sd3["clip_g"]), "--t5xxl",
                                   str(sd3["t5xxl"])])


@pytest.fixture(scope="module")
def launched(prelaunched):
    missing = _sd3_missing()
    if not missing and not LAUNCH_ALL:
        pytest.skip("SD3 Medium on the real trainer runs only with KOHYA_TUNER_REAL_ALL=1 (11.5 GiB of host RAM "
                    "for two minutes; a plain run trains FLUX.1 with the same T5-XXL instead)")
    return model_scenario(prelaunched, __name__, missing, "SD3 Medium", "build_sd3_random.py")


def test_sd3_config_check_run_oom_resume(launched):
    pool, made = launched
    run, cfg, planned = made["sd3"]
    results = pool.result("sd3")

    # 1. config
    res = results[0]
    assert res.returncode == 0, explain(res)
    written = (cfg / "config.toml").read_text(encoding="utf-8")
    for line in ("cache_text_encoder_outputs = true", "network_train_unet_only = true", "fp8_base = true",
                 'network_module = "networks.lora_sd3"', 'mixed_precision = "fp16"', 'resolution = "64,64"'):
        assert line in written, line

    # 2. check
    res = results[1]
    assert res.returncode == 0, explain(res)
    verdict = json.loads(res.stdout)
    assert verdict["ok"] and verdict["script"] == "sd3_train_network.py", verdict

    # 3. run
    res = results[2]
    assert res.returncode == 0, explain(res)
    # What the CPU cannot run is switched, and said: fp16 runs as bf16.
    said = res.stdout
    assert re.search(r"mixed_precision\s+bf16\s+\(--cpu\)", said), said[:3000]
    attempts = run.attempts()
    assert [a["outcome"] for a in attempts] == ["oom", "success"], attempts
    # The OOM is the 2nd backward's, in training, after the state of step 1 was saved.
    assert attempts[0]["phase"] == "training" and attempts[0]["end_step"] == 1, attempts[0]
    assert attempts[1]["start_step"] == 1 and attempts[1]["resume_from"].endswith("lora-step00000001-state")
    log1 = (run.out / "attempt-1.log").read_text(encoding="utf-8", errors="replace")
    assert "sd3_train_network.py" in log1, log1[-3000:]
    for loaded in ("MMDiT", "CLIP-L", "CLIP-G", "T5xxl", "VAE"):
        assert f"Loaded {loaded}: <All keys matched successfully>" in log1, (loaded, log1[-3000:])
    plan = (run.out / "attempt-1.config.toml").read_text(encoding="utf-8")
    assert "cache_text_encoder_outputs = true" in plan and 'mixed_precision = "bf16"' in plan
    assert "fp8_base" not in plan and "blocks_to_swap" not in plan, plan

    summary = check_accounting(run, "SD3 Medium: config, check, run, OOM at backward 2", planned)
    assert summary["status"] == "success"
    assert len(run.ledger.read_text(encoding="utf-8").splitlines()) == summary["steps_done"]  # one pass a step
    meta = lora_metadata(Path(summary["lora"]))
    assert meta.get("ss_base_model_version") == "medium" and meta.get("ss_network_module") == "networks.lora_sd3", meta
