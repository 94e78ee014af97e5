"""benchmarks/estimator_accuracy.py groups its records by family and by what trains (LoRA, a LyCORIS
algorithm, OFT, full fine-tune) and counts each group's measured figures within ±10 % and verdicts."""

import importlib.util
from pathlib import Path

from kohya_tuner.families import FAMILIES
from kohya_tuner.memory import estimate

_SPEC = importlib.util.spec_from_file_location(
    "estimator_accuracy", Path(__file__).resolve().parent.parent / "benchmarks" / "estimator_accuracy.py")
acc = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(acc)


def _e(cfg, fam="sdxl"):
    return estimate(cfg, FAMILIES[fam])


def test_mode_names_what_trains():
    base = {"mixed_precision": "bf16"}
    assert acc._mode(base | {"network_module": "networks.lora"}, _e(base)) == "lora"
    ly = base | {"network_module": "lycoris.kohya", "network_args": ["preset=full", "algo=loha"]}
    assert acc._mode(ly, _e(ly)) == "lycoris:loha"
    oft = base | {"network_module": "networks.oft"}
    assert acc._mode(oft, _e(oft)) == "oft"


def test_groups_count_their_rows():
    rows = [
        {"family": "sdxl", "mode": "lora", "kind": "measured", "holds": True},
        {"family": "sdxl", "mode": "lora", "kind": "measured", "holds": False},
        {"family": "sdxl", "mode": "lora", "kind": "exceeds", "holds": True},
        {"family": "flux", "mode": "oft", "kind": "fits-within", "holds": False},
        {"family": "flux", "mode": "oft", "kind": "explained", "holds": None},
    ]
    g = {(x["family"], x["mode"]): x for x in acc.by_family_and_mode(rows)}
    assert g[("sdxl", "lora")] == {"family": "sdxl", "mode": "lora", "measured": 2, "measured_within_10pct": 1,
                                   "verdicts": 1, "verdicts_right": 1}
    assert g[("flux", "oft")]["verdicts"] == 1 and g[("flux", "oft")]["verdicts_right"] == 0
    assert g[("flux", "oft")]["measured"] == 0


def test_a_kohya_ss_record_leaves_unsaid_what_the_gui_form_held():
    # the GUI's DreamBooth tab fills in AdamW8bit, cached latents, uncached SDXL text-encoder outputs and xformers;
    # an sd-scripts record keeps sd-scripts' own defaults, and a stated value always wins
    rec = {"model_family": "sdxl", "training_type": "full_finetune", "script": "sdxl_train.py", "resolution": 1024,
           "batch_size": 1, "mixed_precision": "fp16 + --full_fp16", "vram_kind": "reported_usage", "vram_gb": 19}
    cfg, _fam, assumed = acc.record_config(rec | {"tool": "kohya_ss"})
    assert cfg["optimizer_type"] == "AdamW8bit" and cfg["cache_latents"] and cfg["xformers"]
    assert not cfg.get("cache_text_encoder_outputs") and cfg["mixed_precision"] == "fp16"
    assert any("kohya_ss GUI's default" in a for a in assumed)
    cfg, _fam, assumed = acc.record_config(rec | {"tool": "sd-scripts"})
    assert cfg["optimizer_type"] == "AdamW" and not cfg.get("cache_latents") and cfg.get("sdpa")
    cfg, _fam, _a = acc.record_config(rec | {"tool": "kohya_ss", "optimizer": "adafactor"})
    assert cfg["optimizer_type"] == "Adafactor"


def test_a_setting_the_source_implies_is_taken_with_its_reason_and_a_stated_one_wins():
    rec = {"model_family": "sdxl", "training_type": "full_finetune", "script": "sdxl_train.py", "resolution": 1024,
           "mixed_precision": "bf16 + --full_bf16", "optimizer": "prodigy", "vram_kind": "reported_usage",
           "vram_gb": 33, "tool": "sd-scripts",
           "implied": {"gradient_checkpointing": {"value": True, "why": "its sibling run could not fit otherwise"}}}
    cfg, _fam, assumed = acc.record_config(rec)
    assert cfg.get("gradient_checkpointing") is True
    assert any("implied by the source: its sibling run" in a for a in assumed)
    cfg, _fam, assumed = acc.record_config(rec | {"gradient_checkpointing": False})
    assert not cfg.get("gradient_checkpointing") and not any("implied" in a for a in assumed)
