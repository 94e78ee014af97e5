"""The families added from the pinned sd-scripts' other LoRA scripts (issue 14): SD 2.x, SD3 Medium,
SD3.5 Medium / Large, Chroma, Lumina Image 2.0, HunyuanImage-2.1 and Anima.

The matrix test runs `config` for every new family x job x GPU class (6-80 GB), then `check` on what
it wrote, and reads both files back with toml 0.10.2 (the reader sd-scripts uses). Tests marked
with the pinned source (KOHYA_TUNER_REAL_SDSCRIPTS) compare the data with sd-scripts itself.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from math import gcd
from pathlib import Path

import pytest
import toml

from clihelp import invoke
from kohya_tuner import config_io, ladder, networks, presets, schema, sdscripts
from kohya_tuner.check import engine
from kohya_tuner.families import FAMILIES, family_for_config, family_for_script, get_family
from kohya_tuner.memory.data import lora_targets

NEW = ("sd2", "sd3", "sd35m", "sd35l", "chroma", "lumina2", "hunyuan21", "anima")
NEW_SCRIPTS = ("lumina_train_network.py", "hunyuan_image_train_network.py", "anima_train_network.py")
REPO = Path(__file__).resolve().parent.parent

# SD3 / SD3.5 cache their captions with CLIP-L, CLIP-G and T5-XXL on the GPU together
# (sd3_train_network.py moves all three to the device): 6.4 GiB with the fp8 T5-XXL file, over the
# 5.5 GiB a 6 GB card leaves. `config` refuses those with the phase named instead of writing a plan
# that stops at caching.
REFUSED = {("sd3", 6), ("sd35m", 6), ("sd35l", 6)}


def _pinned_source() -> Path:
    path = os.environ.get("KOHYA_TUNER_REAL_SDSCRIPTS")
    if not path or not (Path(path) / "anima_train_network.py").is_file():
        pytest.skip("the pinned sd-scripts source (KOHYA_TUNER_REAL_SDSCRIPTS) is not available")
    return Path(path)


# ---- the facts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NEW)
def test_component_counts_are_the_ones_counted_from_sd_scripts(name):
    """families.py carries the counts tools/memtrace/family_targets.py took from the model classes."""
    fam = FAMILIES[name]
    arch = lora_targets()["archs"][name]
    comps = arch["components"]
    assert fam.diffusion.params == comps[arch["denoiser"]]["n_params"]
    assert [t.params for t in fam.text_encoders] == [comps[k]["n_params"] for k in comps if k != arch["denoiser"]]
    assert fam.vae.params == arch["vae"]["n_params"]
    assert arch["network_module"] == fam.network_module


def _max_swap(blocks: dict, layout: str) -> int:
    """The largest n the scripts' enable_block_swap asserts accept."""
    if layout == "double_single":
        d, s = blocks["double"]["count"], blocks["single"]["count"]
        return max(n for n in range(0, d + s) if n // 2 <= d - 2 and (n - n // 2) * 2 <= s - 2)
    return next(iter(blocks.values()))["count"] - 2


@pytest.mark.parametrize("name", [n for n in NEW if FAMILIES[n].blocks_to_swap_max])
def test_block_swap_range_follows_the_block_counts(name):
    fam = FAMILIES[name]
    arch = lora_targets()["archs"][name]
    blocks = arch["components"][arch["denoiser"]]["blocks"]
    assert fam.blocks_to_swap_max == _max_swap(blocks, fam.swap_layout)


def test_hunyuan_swap_limit_is_the_guides_37():
    # docs/hunyuan_image_train_network.md: "Up to 37 blocks can be swapped".
    assert FAMILIES["hunyuan21"].blocks_to_swap_max == 37


@pytest.mark.parametrize("name", NEW)
def test_required_files_are_arguments_of_the_script(name):
    fam = FAMILIES[name]
    specs = schema.script_args(fam.script)
    for key, flag in fam.required_files.items():
        assert key in specs, (name, key)
        assert flag.startswith("--")


@pytest.mark.parametrize("typed,name", [
    ("sd2", "sd2"), ("SD-2.1", "sd2"), ("sd3", "sd3"), ("sd3-medium", "sd3"), ("SD3.5 Medium", "sd35m"),
    ("sd3.5-large", "sd35l"), ("sd35", "sd35l"), ("chroma", "chroma"), ("Lumina-2", "lumina2"),
    ("lumina", "lumina2"), ("hunyuan-image-2.1", "hunyuan21"), ("hunyuan", "hunyuan21"), ("anima", "anima"),
    ("sd15", "sd15"), ("SDXL", "sdxl"), ("flux1-dev", "flux"),
])
def test_names_a_user_types(typed, name):
    assert get_family(typed).name == name


def test_a_config_names_its_family():
    assert family_for_config({"network_module": "networks.lora_hunyuan_image"}).name == "hunyuan21"
    assert family_for_config({"network_module": "networks.lora_anima"}).name == "anima"
    assert family_for_config({"network_module": "networks.lora_lumina"}).name == "lumina2"
    assert family_for_config({"network_module": "networks.lora_flux", "model_type": "chroma"}).name == "chroma"
    assert family_for_config({"network_module": "networks.lora", "v2": True}).name == "sd2"
    assert family_for_config({"network_module": "networks.lora"}) is None  # SD 1.5 or SDXL: not settled
    sd3 = {"network_module": "networks.lora_sd3"}
    assert family_for_config({**sd3, "pretrained_model_name_or_path": "/m/sd3.5_large.safetensors"}).name == "sd35l"
    assert family_for_config({**sd3, "pretrained_model_name_or_path": "/m/sd3.5_medium.safetensors"}).name == "sd35m"
    assert family_for_config({**sd3, "pretrained_model_name_or_path": "/m/sd3_medium.safetensors"}).name == "sd3"
    # The bare script name keeps meaning the first family of the script.
    assert family_for_script("train_network.py").name == "sd15"
    assert family_for_script("flux_train_network.py").name == "flux"
    assert family_for_script("flux_train_network.py", {"model_type": "chroma"}).name == "chroma"


# ---- against the pinned source ------------------------------------------------------------------


@pytest.mark.parametrize("script", NEW_SCRIPTS)
def test_args_json_matches_the_ast_reader_on_the_pinned_source(script):
    """args.json's entries for the three scripts came from their setup_parser(); the ast reader
    `setup` verifies checkouts with must find exactly the same arguments."""
    root = _pinned_source()
    diffs, unchecked = sdscripts.compare_arguments(root, [script])
    assert diffs == [] and unchecked == []
    names = {a["name"] for a in schema.raw_schema()["scripts"][script]["args"]}
    found = sdscripts.static_arguments(root, script)
    assert names == found.always | found.sometimes


def _bucket_multiple(source: str) -> int:
    """What a trainer's assert_extra_args needs bucket_reso_steps to divide by: its own
    verify_bucket_reso_steps and, when it calls super(), the SD trainer's 64."""
    m = re.search(r"def assert_extra_args\(.*?(?=\n    def )", source, re.S)
    body = m.group(0)
    steps = [int(n) for n in re.findall(r"train_dataset_group\.verify_bucket_reso_steps\((\d+)\)", body)]
    if re.search(r"^\s+super\(\)\.assert_extra_args", body, re.M):
        steps.append(64)
    out = 1
    for s in steps:
        out = out * s // gcd(out, s)
    return out


@pytest.mark.parametrize("name", NEW)
def test_bucket_step_is_what_the_script_checks(name):
    root = _pinned_source()
    fam = FAMILIES[name]
    source = (root / fam.script).read_text(encoding="utf-8")
    if name == "sd2":  # train_network.py is the SD trainer itself: its own check is the 64
        assert re.search(r"verify_bucket_reso_steps\(64\)", source)
        assert fam.bucket_step == 64
        return
    assert fam.bucket_step == _bucket_multiple(source)


@pytest.mark.parametrize("rule", [r for r in engine.rules() if set(r.scripts) <= set(NEW_SCRIPTS)],
                         ids=lambda r: f"{r.id}@{r.line}")
def test_new_script_rules_cite_a_line_that_enforces_them(rule):
    """Each rule of the three scripts points at the line of the pinned source that asserts, warns
    or fixes the value up, and that line is about one of the rule's settings."""
    root = _pinned_source()
    path, _, line = rule.line.partition(":")
    text = (root / path).read_text(encoding="utf-8").splitlines()
    window = " ".join(text[int(line) - 2:int(line) + 1])
    assert re.search(r"\b(assert|if|logger\.warning|logger\.info|verify_bucket_reso_steps)\b", window), window
    words = {k for k in rule.keys} | {"blocks_to_swap", "cacheable", "bucket_reso_steps", "fp8", "mixed_precision"}
    assert any(w in window for w in words), window


@pytest.mark.realtrainer
def test_family_targets_tool_reproduces_the_shipped_counts(tmp_path):
    """Rebuild the counts from the pinned model classes (meta device) and compare."""
    root = _pinned_source()
    python = os.environ.get("KOHYA_TUNER_REAL_PYTHON")
    if not python:
        pytest.skip("KOHYA_TUNER_REAL_PYTHON is not set")
    out = tmp_path / "lora_targets.json"
    out.write_text(json.dumps({"archs": {}}))
    proc = subprocess.run([python, str(REPO / "tools" / "memtrace" / "family_targets.py"), "--sdscripts", str(root),
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    fresh = json.loads(out.read_text())["archs"]
    shipped = lora_targets()["archs"]
    for name in NEW:
        for comp, entry in fresh[name]["components"].items():
            assert entry["n_params"] == shipped[name]["components"][comp]["n_params"], (name, comp)
            assert entry["params_per_rank"] == shipped[name]["components"][comp]["params_per_rank"], (name, comp)


# ---- presets -----------------------------------------------------------------------------------


@pytest.mark.parametrize("gb,swap", [(24, 9), (12, 32), (8, 37)])
def test_hunyuan_presets_reproduce_the_guides_vram_table(gb, swap):
    """docs/hunyuan_image_train_network.md: 24 GB --fp8_scaled --blocks_to_swap 9, 12 GB 32, 8 GB 37."""
    for job in presets.JOBS:
        plan = presets.compose("hunyuan21", job, gb, bf16=True)
        assert plan.config["fp8_scaled"] is True and plan.config["blocks_to_swap"] == swap
        assert plan.provenance["blocks_to_swap"].layer == f"gpu:{gb}GB"
        assert "fp8_base" not in plan.config
    big = presets.compose("hunyuan21", "style", 48, bf16=True)  # 40 GB+: standard settings
    assert "fp8_scaled" not in big.config and "blocks_to_swap" not in big.config


@pytest.mark.parametrize("name", NEW)
def test_every_class_stays_inside_the_swap_range(name):
    fam = FAMILIES[name]
    for gb in presets.GPU_CLASSES:
        swap = presets.compose(name, "style", gb, bf16=True).config.get("blocks_to_swap")
        if swap is not None:
            assert fam.blocks_to_swap_ok(swap), (name, gb, swap)


def test_sd2_variants():
    v = presets.compose("sd2", "style", 12, bf16=True)
    assert v.variant == "768-v" and v.config["v2"] and v.config["v_parameterization"] and v.config["resolution"] == "768"
    b = presets.compose("sd2", "style", 12, bf16=True, variant="512-base")
    assert b.config["v2"] and not b.config["v_parameterization"] and b.config["resolution"] == "512"
    assert b.provenance["resolution"].layer == "variant:512-base"


def test_anima_and_hunyuan_never_get_fp8_base():
    """anima_train_network.py turns fp8_base off; HunyuanImage takes fp8_scaled only."""
    moves = {m.name: m for m in ladder.load_ladder().moves}
    assert "anima" not in moves["fp8_base"].families and "hunyuan21" not in moves["fp8_base"].families
    assert moves["fp8_scaled"].families == ("hunyuan21",)
    for name in ("anima", "hunyuan21"):
        for gb in presets.GPU_CLASSES:
            assert "fp8_base" not in presets.compose(name, "style", gb, bf16=True).config


def test_the_fit_swaps_hunyuan_blocks_within_range_and_drops_fp8_base():
    fam = FAMILIES["hunyuan21"]
    cfg = dict(presets.compose("hunyuan21", "style", 48, bf16=True).config)
    res = ladder.fit(cfg, fam, 7.0)
    assert res.fits, res.message
    moved = {s.move for s in res.steps}
    assert "fp8_scaled" in moved and res.config.get("fp8_scaled") is True
    assert fam.blocks_to_swap_ok(int(res.config.get("blocks_to_swap") or 1))
    assert schema.errors_only(schema.validate_config(res.config, fam.script, family=fam)) == []


# ---- the matrix: config, then check, then toml 0.10.2 --------------------------------------------


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    files = {}
    for fam in FAMILIES.values():
        for key, flag in fam.required_files.items():
            # The fp8 T5-XXL file: what sd-scripts' docs advise below 10 GB, and what the fit asks for.
            # The base is named like the family's own file (sd3.5_large...), which is how a config
            # file alone tells SD3 Medium from SD3.5 Medium and Large.
            name = ("t5xxl_fp8_e4m3fn.safetensors" if key == "t5xxl" else
                    f"{fam.name}.safetensors" if key == "pretrained_model_name_or_path" else f"{key}.safetensors")
            path = root / name
            path.write_bytes(b"\0")
            files[(fam.name, flag)] = path
    data = root / "images"
    data.mkdir()
    from PIL import Image

    Image.new("RGB", (1024, 1024), (90, 120, 200)).save(data / "a.png")
    (data / "a.txt").write_text("a blue square")
    return files, data


def _config_args(name, job, gb, out, files, data, *extra):
    fam = FAMILIES[name]
    args = ["config", "--model", name, "--job", job, "--gpu", str(gb), "--gpu-arch", "ampere", "--out", str(out),
            "--data", str(data), "--json", *extra]
    for flag in fam.required_files.values():
        args += [flag, str(files[(name, flag)])]
    return args


MATRIX = [(n, j, g, v) for n in NEW for j in presets.JOBS for g in presets.GPU_CLASSES
          for v in (FAMILIES[n].variants or (None,))]


@pytest.mark.parametrize("name,job,gb,variant", MATRIX, ids=lambda x: str(x))
def test_config_writes_what_check_passes_and_toml_reads(name, job, gb, variant, model_files, tmp_path):
    files, data = model_files
    out = tmp_path / "plan"
    extra = ["--variant", variant] if variant else []
    res = invoke(*_config_args(name, job, gb, out, files, data, *extra))
    if (name, gb) in REFUSED:
        assert res.exit_code == 2 and "Traceback" not in res.output
        assert "caching text-encoder outputs" in json.loads(res.stdout)["error"]["message"]
        return
    assert res.exit_code == 0, res.output[-3000:]
    written = json.loads(res.stdout)
    fam = FAMILIES[name]
    assert written["script"] == fam.script
    cfg_path, ds_path = out / "config.toml", out / "dataset.toml"
    # toml 0.10.2 reads both back, value for value.
    assert toml.__version__ == "0.10.2"
    read = config_io.flatten(toml.load(cfg_path))
    for key, value in written["config"].items():
        assert read[key] == value, (key, read.get(key), value)
    assert toml.load(ds_path)["datasets"][0]["subsets"][0]["image_dir"]
    # check: the pinned sd-scripts would start training with it (files and folders looked at too).
    chk = invoke("check", cfg_path, "--dataset", ds_path, "--json")
    result = json.loads(chk.stdout)
    assert chk.exit_code == 0 and result["ok"] and result["script"] == fam.script, result["problems"]
    # The family is read back from the file alone.
    assert config_io.read_config(cfg_path).family.name == name


def test_matrix_size():
    """8 families x 3 jobs x 10 GPU classes, SD 2.x in both variants."""
    assert len(MATRIX) == 8 * 3 * 10 + 3 * 10


# ---- LyCORIS ------------------------------------------------------------------------------------


ALGOS = tuple(networks._doc("lycoris")["algo"])
FULL_REFUSED = {"flux", "sd35l"}


@pytest.mark.parametrize("name", ["sdxl", "sd2", "flux", "sd35l"])
@pytest.mark.parametrize("algo", ALGOS)
def test_network_lycoris_writes_a_valid_config(name, algo, model_files, tmp_path):
    files, data = model_files
    out = tmp_path / "plan"
    res = invoke(*_config_args(name, "style", 24, out, files, data, "--network", f"lycoris:{algo}"))
    if algo == "full" and name in FULL_REFUSED and res.exit_code == 2:
        # algo=full trains a full-size difference of every wrapped layer (8-12B trainable parameters):
        # where the estimate counts them so, no 24 GB plan exists and the refusal names training.
        assert "(while training)" in json.loads(res.stdout)["error"]["message"]
        return
    assert res.exit_code == 0, res.output[-3000:]
    cfg = config_io.flatten(toml.load(out / "config.toml"))
    assert cfg["network_module"] == "lycoris.kohya"
    assert f"algo={algo}" in cfg["network_args"]
    chk = invoke("check", out / "config.toml", "--dataset", out / "dataset.toml", "--model", name, "--json")
    assert chk.exit_code == 0, chk.stdout
    cautions = json.loads(res.stdout).get("cautions", [])
    assert any("lycoris-lora" in c for c in cautions)
    assert any("class names" in c for c in cautions) == (name not in ("sdxl", "sd2", "sd15"))


@pytest.mark.parametrize("spec", ["lycoris", "lycoris:lorb", "loha", "lycoris:"])
def test_an_unknown_network_is_one_paragraph(spec, tmp_path):
    res = invoke("config", "--model", "sdxl", "--job", "style", "--gpu", "12", "--out", tmp_path / "o",
                 "--network", spec)
    assert res.exit_code == 2 and "Traceback" not in res.output and "lycoris:" in res.output


def test_network_lora_is_the_familys_module():
    plan = presets.compose("anima", "style", 12, bf16=True, network="lora")
    assert plan.config["network_module"] == "networks.lora_anima"
    plan = presets.compose("sdxl", "style", 12, bf16=True, network="lycoris:locon",
                           sets=["network_args=[\"algo=loha\", \"preset=attn-mlp\"]"])
    # --set is applied after the network layer and wins.
    assert plan.config["network_args"] == ["algo=loha", "preset=attn-mlp"]


def test_a_new_family_refuses_another_familys_file_flag(tmp_path):
    res = invoke("config", "--model", "anima", "--job", "style", "--gpu", "12", "--out", tmp_path / "o",
                 "--clip-g", "g.safetensors")
    assert res.exit_code == 2 and "--clip-g" in res.output


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


# ---- logs ---------------------------------------------------------------------------------------


def test_logs_name_anima_and_chroma():
    """anima_train_network.py logs its DiT load; flux_train_network.py's loader logs "Building Chroma
    model" after the script line, and the later evidence of equal strength names the family."""
    from kohya_tuner.logparse.diagnosis import diagnose
    from kohya_tuner.logparse.parser import parse_text

    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity "
           "of 11.76 GiB of which 1.00 MiB is free.\n")
    anima = ("2026-01-01 12:00:00 INFO     Loading Anima DiT model with attn_mode=torch, split_attn: False...   "
             "anima_train_network.py:107\n")
    assert diagnose(parse_text(anima + oom)).family == "anima"
    chroma = ('  File "/sd/flux_train_network.py", line 1, in <module>\n'
              "2026-01-01 12:00:00 INFO     Building Chroma model                  flux_utils.py:150\n")
    assert diagnose(parse_text(chroma + oom)).family == "chroma"
    flux = '  File "/sd/flux_train_network.py", line 1, in <module>\n'
    assert diagnose(parse_text(flux + oom)).family == "flux"
