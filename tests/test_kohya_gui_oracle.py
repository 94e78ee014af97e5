"""kohya-tuner's reader against what the kohya_ss GUI itself launches for its own files
(tests/data/kohya_gui/records.json, recorded by tools/gui_oracle.py; see its NOTICE)."""

import json
from pathlib import Path

import pytest

from kohya_tuner import config_io
from kohya_tuner.errors import UserError

DATA = Path(__file__).parent / "data" / "kohya_gui"
RECORDS = json.loads((DATA / "records.json").read_text(encoding="utf-8"))

# Normalised differences, each for a path or number the GUI makes up outside the file:
#  * keys the oracle filled because a shipped preset leaves the folder empty (the GUI refuses to
#    print a command without output_dir / train_data_dir / image_folder): removed, and the
#    finetune tab's image_folder is its train_data_dir key;
#  * sample_prompts: the GUI writes the prompts to <output_dir>/sample/prompt.txt; the record
#    says <OUTPUT_DIR>, put back as the file's output_dir (dropped when the oracle filled it);
#  * max_train_steps where the file says 0 and the GUI counted images in a folder on its own disk
#    (test/img in the GUI's checkout): a file alone names no images, so the reader leaves it unset.


def expected(rec):
    exp = dict(rec["toml"])
    filled = rec.get("filled_by_oracle") or {}
    for key in filled:
        exp.pop("train_data_dir" if key == "image_folder" else key, None)
    if "output_dir" in filled:
        exp.pop("sample_prompts", None)
    elif "sample_prompts" in exp:
        exp["sample_prompts"] = exp["sample_prompts"].replace("<OUTPUT_DIR>", exp["output_dir"].rstrip("/\\"))
    data = json.loads((DATA / "inputs" / rec["source"]).read_text(encoding="utf-8"))
    if "max_train_steps" in data and int(data["max_train_steps"] or 0) == 0 and not data.get("dataset_config"):
        exp.pop("max_train_steps", None)
    return exp


READ = [r for r in RECORDS if r["kind"] in ("lora", "dreambooth", "finetune")]
REFUSED = [r for r in RECORDS if r["kind"] not in ("lora", "dreambooth", "finetune")]


@pytest.mark.parametrize("rec", READ, ids=[r["source"] for r in READ])
def test_reader_gives_the_gui_toml_key_for_key(rec):
    assert not rec["refused"] and rec["toml"] is not None
    loaded = config_io.read_config(DATA / "inputs" / rec["source"])
    argv = rec["argv"]
    at = next(i for i, a in enumerate(argv) if a.endswith(".py"))
    assert loaded.script == rec["script"]
    assert loaded.launch == argv[2:at]
    tail = argv[argv.index("<CONFIG_TOML>") + 1:]
    got = {**loaded.config, **loaded.ignored}
    exp = expected(rec)
    overridden = {t.split("=")[0][2:] for t in tail if t.startswith("--")}
    for key in sorted(set(got) | set(exp)):
        if key in overridden:
            assert key in got, key  # additional_parameters, read by argparse after the TOML
            continue
        assert got.get(key) == exp.get(key), (key, got.get(key), exp.get(key))


@pytest.mark.parametrize("rec", REFUSED, ids=[r["source"] for r in REFUSED])
def test_textual_inversion_and_non_configs_are_refused_by_name(rec):
    with pytest.raises(UserError) as err:
        config_io.read_config(DATA / "inputs" / rec["source"])
    word = "Textual Inversion" if rec["kind"] == "textual_inversion" else "not a kohya_ss GUI settings file"
    assert word in err.value.message
