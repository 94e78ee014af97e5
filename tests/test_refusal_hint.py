"""A plan that cannot fit is answered for the phase that sets its peak: rank and batch are
only offered when the training step is the limit."""

from __future__ import annotations

from tests.clihelp import invoke


def test_text_encoder_caching_limit_does_not_send_the_user_after_rank(tmp_path):
    res = invoke("config", "--model", "sd3", "--job", "style", "--gpu", "6", "--out", tmp_path / "o")
    assert res.exit_code == 2
    assert "text encoders encoding the captions" in res.stderr
    assert "network_dim" not in res.stderr


def test_training_step_limit_still_names_rank_and_resolution(tmp_path):
    from kohya_tuner import planning, presets
    from kohya_tuner.gpu import GpuChoice

    choice = GpuChoice(gb=6)
    inputs, _ = planning.model_inputs(presets_family("sdxl"), base=None, clip_l=None, t5xxl=None, ae=None,
                                      name="lora", out=tmp_path, steps=None)
    plan = presets.compose("sdxl", "style", 6, sets=["resolution=1536,1536", "max_bucket_reso=2048", "train_batch_size=8"],
                           inputs=inputs, bf16=choice.bf16)
    ds = presets.build_dataset(plan, tmp_path / "images", None)
    fitted = planning.fit_plan(plan, ds, 6, do_fit=False)
    assert fitted.estimate.peak_phase == "training" and not fitted.fits
    assert "network_dim" in fitted.refusal_hint


def presets_family(name: str):
    from kohya_tuner.families import get_family

    return get_family(name)


def test_a_boft_plan_names_the_smallest_rank_that_still_builds(tmp_path):
    """LyCORIS BOFT stops at network creation below the rank that splits every layer width: the
    hint names that rank, and LyCORIS' own rule (memory.lycoris) agrees at it and one below."""
    import re

    from kohya_tuner.memory import lycoris

    res = invoke("config", "--model", "flux", "--network", "lycoris:boft", "--job", "style", "--gpu", "6",
                 "--out", tmp_path / "o")
    assert res.exit_code == 2
    hint = " ".join(res.stderr.split())
    m = re.search(r"BOFT builds on this model down to (\d+)", hint)
    assert m, hint
    low = int(m.group(1))
    cfg = {"network_module": "lycoris.kohya", "network_args": ["algo=boft"], "network_train_unet_only": True}
    assert not lycoris.unsplittable("flux", {**cfg, "network_dim": low})
    assert lycoris.unsplittable("flux", {**cfg, "network_dim": low - 1})


def test_a_web_address_for_a_model_file_is_refused_without_its_password(tmp_path):
    for flag, url in (("--base", "https://user:PW99secret@host/m.safetensors"), ("--base", "s3://bucket/m.ckpt")):
        res = invoke("config", "--model", "sd15", "--job", "style", "--gpu", "8", flag, url, "--out", tmp_path / "o")
        assert res.exit_code == 2 and "web address" in res.stderr
        assert "PW99secret" not in res.output
        assert not (tmp_path / "o").exists()
    # A Hugging Face repo id is not an address: it stays what sd-scripts asks the hub for.
    res = invoke("config", "--model", "sd15", "--job", "style", "--gpu", "8", "--base",
                 "runwayml/stable-diffusion-v1-5", "--out", tmp_path / "hub")
    assert res.exit_code == 0, res.output


def test_the_gui_settings_file_is_named_as_such_not_checked_as_a_training_config(tmp_path):
    """The kohya_ss GUI's config.toml at its root holds its form's defaults in tables of its own; a
    training config that happens to use one such table name is still read."""
    gui = tmp_path / "config.toml"
    gui.write_text('[settings]\nuse_shell = false\n[server]\nport = 7860\n[folders]\noutput_dir = "./outputs"\n'
                   '[accelerate_launch]\nmixed_precision = "fp16"\n[basic]\nlearning_rate = 0.0001\n')
    for cmd in (["check", gui], ["estimate", gui, "--gpu", "12"], ["fit", gui, "--gpu", "12", "--out", tmp_path / "f.toml"]):
        res = invoke(*cmd)
        assert res.exit_code == 2 and "GUI's own settings file" in " ".join(res.stderr.split()), res.output
    mine = tmp_path / "mine.toml"
    mine.write_text('[settings]\nnetwork_module = "networks.lora"\n[training]\nresolution = "512"\n'
                    'pretrained_model_name_or_path = "runwayml/stable-diffusion-v1-5"\n')
    res = invoke("estimate", mine, "--gpu", "12")
    assert res.exit_code == 0, res.output
