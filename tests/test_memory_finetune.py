"""Full fine-tunes (train_db.py, fine_tune.py, sdxl_train.py, flux_train.py, sd3_train.py):
every weight of the trained models with its gradient and optimizer states, the fused
optimizer options, which text encoders each script trains; and highvram / text-encoder
training for LoRA."""

import json

import pytest

from kohya_tuner import config_io
from kohya_tuner.families import FAMILIES
from kohya_tuner.memory import budget_gib, estimate
from kohya_tuner.memory.finetune import SCRIPTS, family_for
from kohya_tuner.memory.setup import resolve
from tests.clihelp import invoke

GIB = 1024 ** 3

SDXL_FT = ("accelerate launch sdxl_train.py --pretrained_model_name_or_path=sd_xl_base_1.0.safetensors "
           "--resolution=1024,1024 --train_batch_size=1 --mixed_precision=bf16 --optimizer_type=AdamW8bit "
           "--gradient_checkpointing --cache_latents --cache_text_encoder_outputs --xformers --learning_rate=1e-5")


def test_every_script_is_its_familys_fine_tune():
    for script, name in SCRIPTS.items():
        fam = family_for(script)
        assert fam.name == name and fam.script == script and fam.components == FAMILIES[name].components
    assert family_for("train_db.py", {"v2": True}).name == "sd2"
    assert family_for("sd3_train.py", None, "sd35l").name == "sd35l"
    assert family_for("train_network.py") is None


def test_command_line_of_a_fine_tune_is_read_and_estimated():
    loaded = config_io.parse_command_line(SDXL_FT)
    assert loaded.family.script == "sdxl_train.py" and loaded.config["optimizer_type"] == "AdamW8bit"
    e = estimate(loaded.config, loaded.family)
    unet = FAMILIES["sdxl"].diffusion.params
    # fp32 master weights (no full_bf16), an fp32 gradient each, AdamW8bit's two 8-bit moments
    assert e.components_gib["unet_weights"] == pytest.approx(unet * 4 / GIB)
    assert e.components_gib["gradients"] == pytest.approx(unet * 4 / GIB)
    assert 2.0 * unet / GIB < e.components_gib["optimizer_states"] < 2.1 * unet / GIB
    assert e.lora_params == unet and e.components_gib["lora_weights"] == 0


def test_full_bf16_and_fused_optimizers_shrink_the_right_parts():
    loaded = config_io.parse_command_line(SDXL_FT)
    base = estimate(loaded.config, loaded.family)
    bf16 = estimate({**loaded.config, "full_bf16": True}, loaded.family)
    assert bf16.components_gib["unet_weights"] == pytest.approx(base.components_gib["unet_weights"] / 2)
    fused = estimate({**loaded.config, "fused_backward_pass": True}, loaded.family)
    # one weight's gradient at a time
    assert fused.components_gib["gradients"] < base.components_gib["gradients"] / 50
    groups = estimate({**loaded.config, "fused_optimizer_groups": 10}, loaded.family)
    assert groups.components_gib["gradients"] == pytest.approx(base.components_gib["gradients"] / 10, rel=1e-3)
    flux = family_for("flux_train.py")
    cfg = {"mixed_precision": "bf16", "full_bf16": True, "gradient_checkpointing": True, "cache_latents": True,
           "cache_text_encoder_outputs": True, "optimizer_type": "Adafactor"}
    plain = estimate(cfg, flux)
    blockwise = estimate({**cfg, "blockwise_fused_optimizers": True}, flux)
    assert blockwise.components_gib["gradients"] == pytest.approx(plain.components_gib["gradients"] / 57, rel=1e-2)


def test_which_text_encoders_each_script_trains():
    cfg = {"mixed_precision": "fp16", "cache_latents": True}
    assert resolve(cfg, family_for("train_db.py")).te_trained == (True,)
    assert resolve({**cfg, "stop_text_encoder_training": -1}, family_for("train_db.py")).te_trained == (False,)
    assert resolve(cfg, family_for("fine_tune.py")).te_trained == (False,)
    assert resolve({**cfg, "train_text_encoder": True}, family_for("fine_tune.py")).te_trained == (True,)
    sdxl = family_for("sdxl_train.py")
    assert resolve({**cfg, "train_text_encoder": True, "learning_rate_te2": 0}, sdxl).te_trained == (True, False)
    assert resolve({**cfg, "train_text_encoder": True}, family_for("flux_train.py")).te_trained == (False, False)
    sd3 = family_for("sd3_train.py")
    assert resolve({**cfg, "train_text_encoder": True}, sd3).te_trained == (True, True, False)
    # a trained text encoder is a trained model: its weights in the master dtype with states
    db = estimate(cfg, family_for("train_db.py"))
    frozen = estimate({**cfg, "stop_text_encoder_training": -1}, family_for("train_db.py"))
    te = FAMILIES["sd15"].text_encoders[0].params
    assert db.lora_params - frozen.lora_params == te
    assert db.components_gib["clip_l_weights"] == pytest.approx(te * 4 / GIB)


def test_doc_ladder_of_the_flux_fine_tune_holds():
    # docs: 24 GB with 8 blocks swapped, full_bf16, fused_backward_pass, Adafactor; ~12 GB with 28
    cfg = {"mixed_precision": "bf16", "full_bf16": True, "fused_backward_pass": True, "optimizer_type": "Adafactor",
           "optimizer_args": ["relative_step=False", "scale_parameter=False", "warmup_init=False"],
           "gradient_checkpointing": True, "cache_latents": True, "cache_text_encoder_outputs": True,
           "resolution": "1024", "blocks_to_swap": 8}
    fam = family_for("flux_train.py")
    assert estimate(cfg, fam).fits(24) and not estimate({**cfg, "blocks_to_swap": 0}, fam).fits(24)
    assert estimate({**cfg, "blocks_to_swap": 28}, fam).fits(12)


def test_estimate_and_fit_accept_a_fine_tune_command(tmp_path):
    p = tmp_path / "ft.sh"
    p.write_text(SDXL_FT + "\n")
    r = invoke("estimate", str(p), "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["input"]["script"] == "sdxl_train.py" and out["peak_gib"] > 20
    r = invoke("fit", str(p), "--gpu", "24", "--out", str(tmp_path / "ft.24gb.toml"), "--json")
    assert r.exit_code in (0, 2), r.output
    assert "Traceback" not in r.output


def test_highvram_moves_nothing():
    cfg = {"mixed_precision": "bf16", "fp8_base": True, "gradient_checkpointing": True, "cache_latents": True,
           "cache_text_encoder_outputs": True, "network_dim": 4, "optimizer_type": "AdamW8bit", "resolution": "512",
           "t5xxl": "t5xxl_fp16.safetensors", "pretrained_model_name_or_path": "flux1-dev.safetensors"}
    a = estimate(cfg, FAMILIES["flux"])
    b = estimate({**cfg, "highvram": True}, FAMILIES["flux"])
    assert a.phases_gib == b.phases_gib
    assert any("highvram" in x for x in b.assumptions) and not any("highvram" in x for x in a.assumptions)


def test_long_captions_multiply_the_text_encoder_work():
    # max_token_length 225: the CLIPs encode three 77-token chunks per caption
    cfg = {"mixed_precision": "fp16", "xformers": True, "resolution": "1024", "train_batch_size": 2,
           "network_dim": 16, "cache_latents": True}
    short = resolve(cfg, FAMILIES["sdxl"])
    long = resolve({**cfg, "max_token_length": 225}, FAMILIES["sdxl"])
    assert (short.te_chunks, long.te_chunks) == (1, 3)
    e_short, e_long = estimate(cfg, FAMILIES["sdxl"]), estimate({**cfg, "max_token_length": 225}, FAMILIES["sdxl"])
    assert e_long.components_gib["activations"] > e_short.components_gib["activations"]


def test_fused_step_with_fp32_master_weights_keeps_autocast_copies():
    # traced: the peak without gradients of a full fine-tune under autocast holds a 16-bit copy of
    # every fp32 weight; full_bf16 stores the weights in 16 bit and has none
    loaded = config_io.parse_command_line(SDXL_FT)
    cfg = {**loaded.config, "fused_backward_pass": True, "optimizer_type": "Adafactor"}
    mixed = estimate(cfg, loaded.family)
    bf16 = estimate({**cfg, "full_bf16": True}, loaded.family)
    copies = FAMILIES["sdxl"].diffusion.params * 2 / GIB
    assert mixed.components_gib["activations"] - bf16.components_gib["activations"] == pytest.approx(copies, rel=0.01)
    assert any("16-bit copy" in a for a in mixed.assumptions)
    plain = estimate({**cfg, "fused_backward_pass": False}, loaded.family)
    assert not any("16-bit copy" in a for a in plain.assumptions)


def test_fit_finds_a_fused_step_for_a_12gb_sdxl_full_fine_tune(tmp_path):
    p = tmp_path / "ft.sh"
    p.write_text(SDXL_FT + "\n")
    r = invoke("fit", str(p), "--gpu", "12", "--no-history", "--out", str(tmp_path / "ft.12gb.toml"), "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["fits"] and out["after"]["peak_gib"] <= out["budget_gib"]
    # the fused backward pass, with the Adafactor it needs: it frees more than grouped steps and, once the
    # optimizer must change anyway, costs nothing more (a grouped step taken on the way is dropped)
    assert out["after"]["settings"]["fused_step"] == "fused_backward_pass"
    moves = [s["move"] for s in out["steps"]]
    assert "fused_backward_pass_adafactor" in moves and "fused_optimizer_groups" not in moves
    written = (tmp_path / "ft.12gb.toml").read_text()
    assert "fused_backward_pass = true" in written and 'optimizer_type = "Adafactor"' in written
    assert "fused_optimizer_groups" not in written and "gradient_accumulation_steps" not in written
    # what is trained, in JSON: no rank, no LoRA parameters, the model's own weights
    assert "rank" not in out["after"]["settings"] and "lora_params" not in out["after"]
    assert out["after"]["trainable_params"] == FAMILIES["sdxl"].diffusion.params


def test_fused_backward_move_brings_adafactor_and_respects_the_script():
    from kohya_tuner import schema
    from kohya_tuner.ladder import fit

    loaded = config_io.parse_command_line(SDXL_FT)
    cfg = {**loaded.config, "optimizer_type": "Adafactor", "full_bf16": True}
    res = fit(cfg, loaded.family, 9.5)
    assert res.fits, res.message
    # Adafactor already: the fused backward pass changes no optimizer, so it is a quality-keeping move
    assert [s.move for s in res.steps] == ["fused_backward_pass"]
    assert res.steps[0].quality_cost.startswith("none")
    assert not schema.errors_only(schema.validate_config(res.config, "sdxl_train.py", family=loaded.family))
    # train_util asserts gradient_accumulation_steps 1 with it: no fused backward pass, and no Adafactor
    # switch either when another move can make the fit
    acc = fit({**cfg, "gradient_accumulation_steps": 2}, loaded.family, 9.5)
    assert not acc.config.get("fused_backward_pass")
    # ... nor accumulation after the fused backward pass (a batch of 4 that must come down on a small card)
    for gb in (8, 10):
        r = fit({**cfg, "train_batch_size": 4, "full_bf16": False}, loaded.family, budget_gib(gb), gpu_gb=gb)
        assert r.fits and r.config.get("fused_backward_pass")
        assert (r.config.get("gradient_accumulation_steps") or 1) == 1, [s.move for s in r.steps]
    # a batch of 4 that the greedy first turns into accumulation (then drops again) must not leave the plan on
    # Adafactor without the fused step it could then have: the fit is tried again without the dropped move
    batch4 = {**loaded.config, "train_batch_size": 4}
    once = fit(batch4, loaded.family, budget_gib(12), gpu_gb=12, refit=False)
    assert "batch_to_accumulation" in once.applied_order and not once.config.get("fused_backward_pass")
    r = fit(batch4, loaded.family, budget_gib(12), gpu_gb=12)
    assert r.fits and r.config.get("fused_backward_pass") and not r.config.get("fused_optimizer_groups")
    assert r.config["train_batch_size"] == 4 and not r.config.get("gradient_accumulation_steps")
    # PR #1319: grouped optimizers with any optimizer "except Prodigy or D-Adaptation"
    for opt in ("Prodigy", "DAdaptAdam"):
        r = fit({**loaded.config, "optimizer_type": opt}, loaded.family, budget_gib(12), gpu_gb=12)
        assert not r.config.get("fused_optimizer_groups"), opt
        assert not schema.errors_only(schema.validate_config(r.config, "sdxl_train.py", family=loaded.family))
    # train_db.py takes the flags but implements none: no fused move, and the estimate ignores them
    db = family_for("train_db.py")
    base = {"mixed_precision": "bf16", "cache_latents": True, "optimizer_type": "Adafactor"}
    a, b = estimate(base, db), estimate({**base, "fused_backward_pass": True}, db)
    assert a.peak_gib == b.peak_gib and any("does not act on it" in x for x in b.assumptions)
    assert not any(s.move in ("fused_backward_pass", "fused_optimizer_groups", "blockwise_fused_optimizers")
                   for s in fit(base, db, 6.0).steps)


def test_lora_json_keeps_rank_and_lora_params():
    e = estimate({"mixed_precision": "bf16", "network_dim": 8}, FAMILIES["sdxl"]).to_json()
    assert e["settings"]["rank"] == 8 and e["lora_params"] == e["trainable_params"] > 0
    assert e["settings"]["trained"] == "lora"
