"""Every string kohya-tuner writes into a TOML file reads back unchanged through the
pinned parser sd-scripts uses (toml 0.10.2), or is refused with the key named — never an
AssertionError, never a file that means something else. Ordinary paths with quotes work."""

from __future__ import annotations

import os

from pathlib import Path

import pytest
import toml
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from kohya_tuner import config_io, tomlwrite
from kohya_tuner.errors import UserError
from tests.clihelp import invoke

assert toml.__version__ == "0.10.2"  # the pin sd-scripts reads with; the test means nothing for another

HOSTILE = st.text(alphabet=st.sampled_from(list("'\"\\ ,[]{}#=\t\n\r\x00\x01\x1b\x7f aé日🎨\u2028")), max_size=12)
TEXT = st.one_of(HOSTILE, st.text(max_size=20))
FAST = settings(max_examples=int(os.environ.get("KT_TOML_EXAMPLES", "300")), deadline=None,
                derandomize=not os.environ.get("KT_FUZZ_RANDOM"), database=None)


def _written_or_refused(fn):
    try:
        return fn()
    except UserError as exc:
        assert "toml 0.10.2" in exc.message or "cannot" in exc.message
        return None


@FAST
@given(TEXT)
def test_scalar_strings_read_back(s):
    text = _written_or_refused(lambda: tomlwrite.dumps_pair("k", s))
    # A lone string always has a form the pinned parser reads exactly.
    assert text is not None
    assert toml.loads(text) == {"k": s}


@FAST
@given(st.lists(TEXT, max_size=3))
def test_string_lists_read_back_or_refused(items):
    text = _written_or_refused(lambda: tomlwrite.dumps_pair("k", items))
    if text is not None:
        assert toml.loads(text) == {"k": items}
    else:
        assert any("," in x for x in items)  # the parser's one known limit inside lists


@FAST
@given(TEXT, TEXT, TEXT)
def test_dataset_files_read_back(folder, trigger, ext):
    ds = {"general": {"caption_extension": ext or ".txt"},
          "datasets": [{"subsets": [{"image_dir": folder, "class_tokens": trigger, "num_repeats": 2},
                                    {"image_dir": folder + "2", "num_repeats": 1}]}]}
    text = config_io.dumps_dataset(ds, header="written by a test")
    assert toml.loads(text) == ds


@FAST
@given(st.dictionaries(st.sampled_from(["output_dir", "output_name", "pretrained_model_name_or_path", "logging_dir",
                                        "learning_rate", "max_train_steps", "xformers"]),
                       st.one_of(TEXT, st.integers(-10**30, 10**30), st.floats(allow_nan=False, allow_infinity=False),
                                 st.booleans()), max_size=6))
def test_config_files_read_back(cfg):
    text = config_io.dumps_config(cfg, why={k: "because ' \" \\ \n" for k in cfg})
    assert config_io.flatten(toml.loads(text)) == cfg


def test_non_finite_float_refused_with_key():
    with pytest.raises(UserError, match="learning_rate"):
        config_io.dumps_config({"learning_rate": float("inf")})


NAMES = ["Bob's images", 'say "hi"', "back\\slash'\"", "日本 'é'"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("command", ["config", "run"])
def test_quoted_data_out_and_trigger_write_and_read_back(tmp_path, name, command):
    """The same quotes in --data, --out and --trigger at once, for config and for run
    (--dry-run: it writes the plan and the attempt config). A `"` in --out leaves only
    launch.bat out (no Windows path holds one), never the plan."""
    data = tmp_path / name
    data.mkdir()
    for i in range(2):
        Image.new("RGB", (512, 512), (i, 0, 0)).save(data / f"{i}.png")
    out = tmp_path / ("out " + name)
    argv = [command, "-m", "sd15" if command == "run" else "sdxl", "-j", "character", "-g", "12", "--data",
            str(data), "--out", str(out), "--trigger", name]
    if command == "run":
        base = data / f"{name}.safetensors"
        base.write_bytes(b"\0" * 64)
        argv += ["--cpu", "--dry-run", "--steps", "4", "--base", str(base), "--sd-scripts",
                 str(Path(__file__).resolve().parents[1] / "standin")]
    r = invoke(*argv)
    assert r.exit_code == 0, r.output
    assert (out / "launch.bat").exists() == ('"' not in name)
    if '"' in name:
        assert "launch.bat not written" in r.output
    ds = toml.load(out / "dataset.toml")
    subsets = [s for d in ds["datasets"] for s in d["subsets"]]
    assert any(s.get("image_dir") == str(data) for s in subsets)
    assert any(s.get("class_tokens") == name for s in subsets)
    for cfg_path in [out / "config.toml", *out.glob("attempt-*.toml")]:
        cfg = config_io.flatten(toml.load(cfg_path))
        assert cfg["output_dir"].startswith(str(out)), cfg_path
