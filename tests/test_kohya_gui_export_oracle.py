"""`--gui-json` files through the kohya_ss GUI's own code: tools/gui_oracle.py --exports loaded each
of tests/data/kohya_gui/exports/*.json (our presets as `config --gui-json` writes them) in the GUI's
LoRA tab and recorded the TOML and `accelerate launch` command its "print training command" path
made (tests/data/kohya_gui/export_records.json; see the NOTICE there). Each must be the training our
config.toml describes: same entry script, same keys and values as sd-scripts receives them (the
equivalences of tests/gui_export_cases.py), the same prompts, the same accelerate options."""

import json
from pathlib import Path

import pytest
from gui_export_cases import EQUIVALENT, differences, launch_pairs, oracle_cases, plan_case

from kohya_tuner import gui_export, schema
from kohya_tuner.config_cmdline import parse_command_line
from kohya_tuner.config_gui import GUI_COMMIT
from kohya_tuner.planfiles import accelerate_args

DATA = Path(__file__).parent / "data" / "kohya_gui"
RECORDS = json.loads((DATA / "export_records.json").read_text(encoding="utf-8"))
CASES = oracle_cases()
# Keys of the GUI's TOML that are no argument of the entry script: sd-scripts sets them on its
# namespace from --config_file and never reads them.
NOT_ARGUMENTS = {"epoch", "noise_offset_type"}


def gui_training(rec):
    """The flat config the GUI's command gives sd-scripts: its TOML, then what follows --config_file."""
    argv = rec["argv"]
    tail = argv[argv.index("<CONFIG_TOML>") + 1:]
    config = dict(rec["toml"])
    if "sample_prompts" in config:
        config["sample_prompts"] = config["sample_prompts"].replace("<OUTPUT_DIR>", config["output_dir"])
    if tail:
        config.update(parse_command_line(" ".join([rec["script"], *tail]), model=None).config)
    specs = schema.script_args(rec["script"])
    extra = {k for k in config if k not in specs}
    return {k: v for k, v in config.items() if k in specs}, extra


def test_the_records_cover_the_cases_and_the_pinned_gui():
    assert sorted(r["source"] for r in RECORDS) == sorted(f"{n}.json" for n in CASES)
    assert {r["gui_commit"] for r in RECORDS} == {GUI_COMMIT}
    families = {CASES[r["source"][:-5]][0] for r in RECORDS}
    assert {"sd15", "sdxl", "flux", "sd3"} <= families
    assert any(CASES[r["source"][:-5]][3].startswith("lycoris") for r in RECORDS)
    # The GUI's additional_parameters path is proven too: some exports use it.
    assert sum(bool(r["argv"][r["argv"].index("<CONFIG_TOML>") + 1:]) for r in RECORDS if not r["refused"]) >= 3


@pytest.mark.parametrize("rec", RECORDS, ids=lambda r: r["source"])
def test_the_gui_launches_our_training(rec):
    name = rec["source"][:-5]
    model, job, gb, network, sets = CASES[name]
    plan, ds_path, prompts, _toml = plan_case(model, job, gb, network, out=Path("/runs") / name, sets=sets)
    exported = gui_export.for_plan(plan, ds_path, prompts).dumps()
    assert (DATA / "exports" / rec["source"]).read_text(encoding="utf-8") == exported, (
        "the export changed since the GUI ran it: rerun tools/gui_export_inputs.py and tools/gui_oracle.py --exports")
    assert not rec["refused"], rec.get("gui_log") or rec.get("gui_error")
    assert rec["component_errors"] == {}, "a field value the GUI's form would refuse"
    assert rec["script"] == plan.family.script
    gui, extra = gui_training(rec)
    assert extra <= NOT_ARGUMENTS, extra
    ours = {**plan.config, "dataset_config": ds_path}
    diff = differences(ours, gui, plan.family.script, ours_prompts=prompts, gui_prompts=rec.get("prompt_text"),
                       schnell=plan.variant == "schnell")
    assert not diff, diff
    argv = rec["argv"]
    at = next(i for i, a in enumerate(argv) if a.endswith(".py"))
    assert launch_pairs(argv[2:at]) == launch_pairs(accelerate_args(plan.config.get("mixed_precision", "no")))


def test_every_equivalence_has_its_reason():
    assert all(len(why) > 30 for why in EQUIVALENT.values())
