"""Each term of the memory model, checked against the physics it claims to model."""

from __future__ import annotations

import pytest

from kohya_tuner.families import FAMILIES
from kohya_tuner.memory import GPU_SIZES, budget_gib, estimate
from kohya_tuner.memory.data import activation_line, lora_arch
from kohya_tuner.memory.lora import flux_block_weight_params

GIB = 1024**3
FLUX = FAMILIES["flux"]
SDXL = FAMILIES["sdxl"]
SD15 = FAMILIES["sd15"]


def flux_cfg(**kw):
    c = dict(mixed_precision="bf16", network_module="networks.lora_flux", network_dim=16, resolution="1024",
             gradient_checkpointing=True, cache_latents=True, cache_text_encoder_outputs=True,
             network_train_unet_only=True, optimizer_type="AdamW", sdpa=True,
             pretrained_model_name_or_path="flux1-dev.safetensors", t5xxl="t5xxl_fp16.safetensors")
    c.update(kw)
    return {k: v for k, v in c.items() if v is not None}


def sdxl_cfg(**kw):
    c = dict(mixed_precision="bf16", network_module="networks.lora", network_dim=16, resolution="1024",
             gradient_checkpointing=True, cache_latents=True, cache_text_encoder_outputs=True,
             network_train_unet_only=True, optimizer_type="AdamW", sdpa=True)
    c.update(kw)
    return {k: v for k, v in c.items() if v is not None}


def sd15_cfg(**kw):
    c = dict(mixed_precision="fp16", network_module="networks.lora", network_dim=16, resolution="512",
             cache_latents=True, optimizer_type="AdamW", xformers=True)
    c.update(kw)
    return {k: v for k, v in c.items() if v is not None}


def training(e, key):
    return e.phase_components_gib["training"][key]


# ---- activations -------------------------------------------------------------------------


@pytest.mark.parametrize("make,family", [(flux_cfg, FLUX), (sdxl_cfg, SDXL), (sd15_cfg, SD15)])
@pytest.mark.parametrize("ckpt", [True, None])
def test_activations_are_linear_in_batch(make, family, ckpt):
    a1, a2, a4 = (training(estimate(make(train_batch_size=b, gradient_checkpointing=ckpt), family), "activations")
                  for b in (1, 2, 4))
    # Linear: the step from 2 to 4 samples is twice the step from 1 to 2.
    assert a4 - a2 == pytest.approx(2 * (a2 - a1), rel=1e-6)
    assert a2 > a1 > 0


def test_doubling_batch_nearly_doubles_activations():
    a1 = training(estimate(flux_cfg(train_batch_size=1), FLUX), "activations")
    a2 = training(estimate(flux_cfg(train_batch_size=2), FLUX), "activations")
    assert 1.9 < a2 / a1 <= 2.0


@pytest.mark.parametrize("make,family,factor", [(flux_cfg, FLUX, 10), (sdxl_cfg, SDXL, 8), (sd15_cfg, SD15, 3)])
def test_checkpointing_cuts_activations(make, family, factor):
    on = training(estimate(make(gradient_checkpointing=True), family), "activations")
    off = training(estimate(make(gradient_checkpointing=None), family), "activations")
    assert off > factor * on


def test_activations_scale_with_resolution_area():
    a512 = training(estimate(sdxl_cfg(resolution="512", gradient_checkpointing=None), SDXL), "activations")
    a1024 = training(estimate(sdxl_cfg(resolution="1024", gradient_checkpointing=None), SDXL), "activations")
    assert 3.5 < a1024 / a512 < 4.0  # four times the latent pixels, minus the constant part


def test_dataset_resolution_and_batch_win_over_config():
    ds = {"general": {"resolution": 512, "batch_size": 3}, "datasets": [{"subsets": [{"image_dir": "x"}]}]}
    with_ds = estimate(sdxl_cfg(resolution="1024", train_batch_size=1), SDXL, dataset=ds)
    direct = estimate(sdxl_cfg(resolution="512", train_batch_size=3), SDXL)
    assert with_ds.peak_gib == pytest.approx(direct.peak_gib)
    assert with_ds.settings["batch"] == 3


def test_t5_token_length_costs_activation_memory():
    long = training(estimate(flux_cfg(t5xxl_max_token_length=512), FLUX), "activations")
    short = training(estimate(flux_cfg(t5xxl_max_token_length=256), FLUX), "activations")
    slope = activation_line("flux", "amp", True, False).mib_per_token
    assert long - short == pytest.approx(slope * 256 / 1024, rel=1e-6)


def test_schnell_defaults_to_256_t5_tokens():
    dev = estimate(flux_cfg(), FLUX)
    schnell = estimate(flux_cfg(pretrained_model_name_or_path="flux1-schnell.safetensors"), FLUX)
    assert dev.settings["tokens"] - schnell.settings["tokens"] == 256


def _rank_lines():
    from kohya_tuner.memory.data import coefficients

    return {(ln["arch"], ln["ckpt"]) for ln in coefficients()["lora_rank_activations"]["lines"]}


@pytest.mark.parametrize("make,family,ckpt", [(sd15_cfg, SD15, None), (sdxl_cfg, SDXL, None), (sdxl_cfg, SDXL, True),
                                              (flux_cfg, FLUX, None), (flux_cfg, FLUX, True)])
def test_a_higher_lora_rank_keeps_more_activations(make, family, ckpt):
    # traced at two ranks (tools/memtrace/rank_traces.py): autocast's 16-bit copies of the LoRA weights and each
    # layer's down-projection output are saved for backward, so without checkpointing the activations grow with
    # the rank from the rank the lines were traced at (16); with it no pair separates them from the gradients
    assert ("sd15", False) in _rank_lines()
    act = {r: training(estimate(make(network_dim=r, gradient_checkpointing=ckpt, train_batch_size=4), family),
                       "activations") for r in (4, 16, 128)}
    if (family.name, bool(ckpt)) not in _rank_lines():
        assert act[4] == act[16] == act[128]  # no traced pair: nothing is added
        return
    assert act[4] < act[16] < act[128]
    lyco = dict(network_module="lycoris.kohya", network_args=["algo=loha"], gradient_checkpointing=ckpt)
    if family is not FLUX:
        # LyCORIS' traced extra is its own: the LoRA module's rank term is not added to it
        low, high = (training(estimate(make(network_dim=r, **lyco), family), "activations") for r in (4, 128))
        assert low == high


def test_plain_attention_keeps_attention_matrices():
    flash = training(estimate(sd15_cfg(resolution="768"), SD15), "activations")
    math = training(estimate(sd15_cfg(resolution="768", xformers=None), SD15), "activations")
    assert math > 3 * flash
    assert any("plain attention" in a for a in estimate(sd15_cfg(xformers=None), SD15).assumptions)


def test_attention_flags_do_not_matter_for_flux():
    assert estimate(flux_cfg(sdpa=None), FLUX).peak_gib == pytest.approx(estimate(flux_cfg(), FLUX).peak_gib)


def test_fp8_without_checkpointing_keeps_bf16_weight_copies():
    # Traced: every upcast weight is saved for backward, so fp8 base costs more than bf16 base.
    fp8 = estimate(flux_cfg(fp8_base=True, gradient_checkpointing=None, resolution="512"), FLUX)
    bf16 = estimate(flux_cfg(gradient_checkpointing=None, resolution="512"), FLUX)
    assert training(fp8, "activations") - training(bf16, "activations") > 15
    assert fp8.peak_gib > bf16.peak_gib


def test_cpu_offload_checkpointing_moves_checkpoints_off_the_gpu():
    on = training(estimate(flux_cfg(cpu_offload_checkpointing=True), FLUX), "activations")
    off = training(estimate(flux_cfg(), FLUX), "activations")
    line = activation_line("flux", "amp", True, False, cpu_offload=True)
    if line is not None:  # traced from sd-scripts' own offloading
        assert on == pytest.approx(line.gib(4608, 1), rel=1e-6)
        assert 0.5 < off - on < 1.5
    else:  # 57 blocks x 3072 x 2 bytes per token x 4608 tokens of block inputs
        assert off - on == pytest.approx(57 * 3072 * 2 * 4608 / GIB, rel=1e-6)


def test_cpu_offload_checkpointing_is_ignored_with_block_swap():
    a = estimate(flux_cfg(blocks_to_swap=8, cpu_offload_checkpointing=True), FLUX)
    b = estimate(flux_cfg(blocks_to_swap=8), FLUX)
    assert a.peak_gib == pytest.approx(b.peak_gib)


# ---- weights -------------------------------------------------------------------------


def test_fp8_halves_base_weights():
    bf16 = training(estimate(flux_cfg(), FLUX), "dit_weights")
    fp8 = training(estimate(flux_cfg(fp8_base=True), FLUX), "dit_weights")
    assert fp8 == pytest.approx(bf16 / 2)
    assert bf16 == pytest.approx(FLUX.diffusion.params * 2 / GIB)


def test_fp32_training_doubles_base_weights():
    bf16 = training(estimate(sdxl_cfg(), SDXL), "unet_weights")
    fp32 = training(estimate(sdxl_cfg(mixed_precision=None), SDXL), "unet_weights")
    assert fp32 == pytest.approx(2 * bf16)


def test_block_swap_removes_swapped_blocks_weights():
    d, s, _, _ = flux_block_weight_params()
    base = training(estimate(flux_cfg(fp8_base=True), FLUX), "dit_weights")
    for n in (1, 16, 22, 35):
        swapped = training(estimate(flux_cfg(fp8_base=True, blocks_to_swap=n), FLUX), "dit_weights")
        n_double, n_single = n // 2, (n - n // 2) * 2
        assert base - swapped == pytest.approx((n_double * d + n_single * s) / GIB)  # fp8: one byte each
    assert d == 339_738_624 and s == 141_557_760  # 10 and 3 Linear weights of the real blocks


def test_split_mode_means_18_swapped_blocks():
    a = estimate(flux_cfg(fp8_base=True, split_mode=True), FLUX)
    b = estimate(flux_cfg(fp8_base=True, blocks_to_swap=18), FLUX)
    assert a.peak_gib == pytest.approx(b.peak_gib)


def test_caching_removes_encoders_and_vae_from_training():
    cached = estimate(flux_cfg(), FLUX)
    uncached = estimate(flux_cfg(cache_latents=None, cache_text_encoder_outputs=None), FLUX)
    assert training(cached, "t5xxl_weights") == 0 and training(cached, "ae_weights") == 0
    assert training(uncached, "t5xxl_weights") == pytest.approx(FAMILIES["flux"].text_encoders[1].params * 2 / GIB)
    assert training(uncached, "ae_weights") > 0


def test_fp8_base_casts_text_encoders_but_fp8_base_unet_does_not():
    base = estimate(flux_cfg(cache_text_encoder_outputs=None, fp8_base=True), FLUX)
    unet = estimate(flux_cfg(cache_text_encoder_outputs=None, fp8_base_unet=True), FLUX)
    assert training(base, "t5xxl_weights") < 0.6 * training(unet, "t5xxl_weights")
    assert training(base, "dit_weights") == pytest.approx(training(unet, "dit_weights"))


def test_text_encoder_caching_peak_depends_on_the_t5_file():
    fp16 = estimate(flux_cfg(fp8_base=True, t5xxl="t5xxl_fp16.safetensors"), FLUX)
    fp8 = estimate(flux_cfg(fp8_base=True, t5xxl="t5xxl_fp8_e4m3fn.safetensors"), FLUX)
    diff = fp16.phases_gib["cache_text_encoder"] - fp8.phases_gib["cache_text_encoder"]
    assert diff == pytest.approx(FAMILIES["flux"].text_encoders[1].params / GIB, rel=0.01)


def test_sd15_text_encoder_always_on_gpu():
    e = estimate(sd15_cfg(network_train_unet_only=True), SD15)
    assert training(e, "clip_l_weights") > 0


def test_lowram_loads_everything_onto_the_gpu_while_caching():
    normal = estimate(sdxl_cfg(), SDXL)
    low = estimate(sdxl_cfg(lowram=True), SDXL)
    assert low.phases_gib["cache_latents"] - normal.phases_gib["cache_latents"] > 4


# ---- trainable parameters, gradients, optimizer -----------------------------------------


def test_lora_params_follow_rank_and_wrapped_layers():
    per_rank = lora_arch("flux")["components"]["dit"]["params_per_rank"]
    for rank in (4, 16, 64):
        assert estimate(flux_cfg(network_dim=rank), FLUX).lora_params == per_rank * rank
    single = estimate(flux_cfg(network_dim=8, network_args=["train_blocks=single"]), FLUX).lora_params
    assert single == 38 * lora_arch("flux")["components"]["dit"]["blocks"]["single"]["params_per_rank_per_block"] * 8


def test_flux_type_dims_and_block_indices():
    full = estimate(flux_cfg(network_dim=8), FLUX).lora_params
    no_mod = estimate(flux_cfg(network_dim=8, network_args=["img_mod_dim=0", "txt_mod_dim=0", "single_mod_dim=0"]),
                      FLUX).lora_params
    assert no_mod == full - 8 * ((3072 + 18432) * 2 * 19 + (3072 + 9216) * 38)
    few = estimate(flux_cfg(network_dim=8, network_args=["train_double_block_indices=0-1",
                                                         "train_single_block_indices=none"]), FLUX).lora_params
    per_block = lora_arch("flux")["components"]["dit"]["blocks"]["double"]["params_per_rank_per_block"]
    assert few == 2 * 8 * per_block


def test_text_encoder_lora_adds_parameters():
    unet_only = estimate(sdxl_cfg(), SDXL).lora_params
    with_te = estimate(sdxl_cfg(network_train_unet_only=None, cache_text_encoder_outputs=None), SDXL).lora_params
    comps = lora_arch("sdxl")["components"]
    assert with_te - unet_only == 16 * (comps["text_encoder_1"]["params_per_rank"]
                                       + comps["text_encoder_2"]["params_per_rank"])


def test_conv_dim_adds_conv_layers():
    base = estimate(sd15_cfg(), SD15).lora_params
    conv = estimate(sd15_cfg(network_args=["conv_dim=8", "conv_alpha=1"]), SD15).lora_params
    adds = lora_arch("sd15")["components"]["unet"]["conv_dim_adds"]
    assert conv - base == 16 * adds["params_per_rank"] + 8 * adds["params_per_conv_rank"]


def test_gradients_match_trainable_weights_and_full_bf16_halves_both():
    e = estimate(flux_cfg(), FLUX)
    assert training(e, "gradients") == pytest.approx(training(e, "lora_weights"))
    assert training(e, "lora_weights") == pytest.approx(e.lora_params * 4 / GIB)
    h = estimate(flux_cfg(full_bf16=True), FLUX)
    assert training(h, "lora_weights") == pytest.approx(training(e, "lora_weights") / 2)
    assert training(h, "gradients") == pytest.approx(training(e, "gradients") / 2)


def test_adamw8bit_quarters_adamw_states():
    adamw = training(estimate(flux_cfg(optimizer_type="AdamW"), FLUX), "optimizer_states")
    eight = training(estimate(flux_cfg(optimizer_type="AdamW8bit"), FLUX), "optimizer_states")
    assert eight / adamw == pytest.approx(0.25, rel=0.03)


def test_optimizer_states_relative_sizes():
    def states(opt, **kw):
        return training(estimate(flux_cfg(optimizer_type=opt, **kw), FLUX), "optimizer_states")

    adamw = states("AdamW")
    assert adamw == pytest.approx(estimate(flux_cfg(), FLUX).lora_params * 8 / GIB)
    assert states("Lion") == pytest.approx(adamw / 2)
    assert states("Prodigy") == pytest.approx(2 * adamw)
    assert states("Adafactor") < adamw / 20
    assert states("Adafactor", optimizer_args=["beta1=0.9"]) > adamw / 2
    assert states("bitsandbytes.optim.AdEMAMix8bit") == pytest.approx(1.5 * states("AdamW8bit"), rel=0.01)


def test_unknown_optimizer_counts_as_adamw_and_says_so():
    e = estimate(flux_cfg(optimizer_type="mylib.FancyOpt"), FLUX)
    assert training(e, "optimizer_states") == pytest.approx(training(estimate(flux_cfg(), FLUX), "optimizer_states"))
    assert any("FancyOpt" in a for a in e.assumptions)


def test_multi_gpu_adds_gradient_buckets():
    one = estimate(flux_cfg(), FLUX)
    two = estimate(flux_cfg(), FLUX, gpus=2)
    assert training(two, "gradients") == pytest.approx(2 * training(one, "gradients"))


# ---- phases ------------------------------------------------------------------------------


def test_phases_present_only_when_they_happen():
    e = estimate(sdxl_cfg(), SDXL)
    assert {"model_load", "cache_latents", "cache_text_encoder", "training", "saving"} <= set(e.phases_gib)
    assert "sampling" not in e.phases_gib
    s = estimate(sdxl_cfg(sample_prompts="p.txt", sample_every_n_steps=100), SDXL)
    assert "sampling" in s.phases_gib
    no_cache = estimate(sdxl_cfg(cache_latents=None, cache_text_encoder_outputs=None, network_train_unet_only=None),
                        SDXL)
    assert "cache_latents" not in no_cache.phases_gib and "cache_text_encoder" not in no_cache.phases_gib


def test_sdxl_sampling_brings_cached_text_encoders_back_in_fp32():
    s = estimate(sdxl_cfg(sample_prompts="p.txt", sample_every_n_epochs=1), SDXL)
    parts = s.phase_components_gib["sampling"]
    assert parts["clip_g_weights"] == pytest.approx(SDXL.text_encoders[1].params * 4 / GIB)


def test_vae_batch_size_scales_latent_caching():
    one = estimate(sdxl_cfg(vae_batch_size=1), SDXL).phase_components_gib["cache_latents"]["activations"]
    four = estimate(sdxl_cfg(vae_batch_size=4), SDXL).phase_components_gib["cache_latents"]["activations"]
    assert four == pytest.approx(4 * one)


def test_peak_is_the_largest_phase_and_components_sum_to_it():
    for make, fam in ((flux_cfg, FLUX), (sdxl_cfg, SDXL), (sd15_cfg, SD15)):
        e = estimate(make(), fam)
        assert e.peak_gib == max(e.phases_gib.values())
        assert e.peak_gib == pytest.approx(e.phases_gib[e.peak_phase])
        assert sum(e.components_gib.values()) == pytest.approx(e.peak_gib)


# ---- output contract ------------------------------------------------------------------------


def test_to_json_contract():
    j = estimate(flux_cfg(), FLUX).to_json()
    for key in ("model", "peak_gib", "peak_phase", "components_gib", "phases_gib", "fits_cards", "assumptions"):
        assert key in j
    assert list(j["fits_cards"]) == [str(g) for g in GPU_SIZES]
    answers = list(j["fits_cards"].values())
    assert answers == sorted(answers)  # once it fits a size it fits every larger one
    assert j["model"] == "flux"


def test_assumptions_list_what_the_input_left_unsaid():
    e = estimate({}, SD15)
    text = " ".join(e.assumptions)
    for word in ("mixed_precision", "resolution", "network_dim", "attention"):
        assert word in text


def test_budget_subtracts_margin_and_other_processes():
    assert budget_gib(12) < 12
    assert budget_gib(24) > budget_gib(16) > budget_gib(12)
    assert budget_gib(12, other_processes_gib=1.5) == pytest.approx(budget_gib(12) - 1.5)
    e = estimate(flux_cfg(fp8_base=True), FLUX)
    assert e.fits(24) and not e.fits(24, other_gib=24)


def test_estimate_does_not_modify_its_input():
    cfg = flux_cfg(network_args=["train_blocks=single"])
    before = repr(cfg)
    estimate(cfg, FLUX)
    assert repr(cfg) == before


# ---- robustness -----------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-5, 5000), st.floats(allow_nan=False, width=32),
                    st.text(max_size=12), st.lists(st.text(max_size=12), max_size=3))
_KEYS = st.sampled_from(["mixed_precision", "network_dim", "train_batch_size", "resolution", "blocks_to_swap",
                         "gradient_checkpointing", "fp8_base", "optimizer_type", "network_args", "cache_latents",
                         "t5xxl_max_token_length", "vae_batch_size", "full_bf16", "sdpa", "optimizer_args",
                         "network_train_unet_only", "sample_prompts", "sample_every_n_steps", "lowram"])


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(_KEYS, _VALUES, max_size=8), st.sampled_from(["sd15", "sdxl", "flux"]))
def test_estimate_never_fails_on_odd_values(cfg, model):
    import json

    e = estimate(cfg, FAMILIES[model])
    assert e.peak_gib > 0 and e.peak_phase in e.phases_gib
    json.dumps(e.to_json())


def test_notes_describe_the_phase_that_sets_the_peak():
    from kohya_tuner.families import FAMILIES
    from kohya_tuner.memory import estimate

    cfg = {"network_module": "networks.lora_flux", "mixed_precision": "bf16", "fp8_base": True,
           "gradient_checkpointing": True, "blocks_to_swap": 28, "network_train_unet_only": True,
           "cache_text_encoder_outputs": True, "cache_latents": True, "resolution": "512", "network_dim": 4,
           "t5xxl": "t5xxl_fp16.safetensors"}
    est = estimate(cfg, FAMILIES["flux"])
    assert est.peak_phase == "cache_text_encoder"
    assert "encodes the captions" in est.component_notes["t5xxl_weights"]
    trained = estimate({**cfg, "blocks_to_swap": None, "network_dim": 64, "train_batch_size": 4}, FAMILIES["flux"])
    assert trained.peak_phase == "training"
    assert "outputs cached" in trained.component_notes["t5xxl_weights"]
