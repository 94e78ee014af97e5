"""The downgrade ladder: moves as data, the two policies, floors, tune and next_step."""

from __future__ import annotations

import re

import pytest

from kohya_tuner import ladder, presets, schema
from kohya_tuner.ladder import moves as ladder_moves
from kohya_tuner.ladder.data import STEPPED_KINDS
from kohya_tuner.memory.setup import resolve
from kohya_tuner.errors import UserError
from kohya_tuner.families import FAMILIES
from kohya_tuner.memory import budget_gib, estimate
from kohya_tuner.resources import presets_dir

FLUX = FAMILIES["flux"]
SDXL = FAMILIES["sdxl"]
SD15 = FAMILIES["sd15"]

HEAVY_FLUX = dict(mixed_precision="bf16", network_module="networks.lora_flux", network_dim=32, network_alpha=16.0,
                  optimizer_type="AdamW", resolution="1024", train_batch_size=4, gradient_accumulation_steps=2,
                  pretrained_model_name_or_path="flux1-dev.safetensors", t5xxl="t5xxl_fp8_e4m3fn.safetensors")
HEAVY_SDXL = dict(mixed_precision="bf16", network_module="networks.lora", network_dim=64, network_alpha=32.0,
                  optimizer_type="AdamW", resolution="1024", train_batch_size=4, sdpa=True)
SD15_FP32 = dict(network_module="networks.lora", network_dim=32, network_alpha=16.0, resolution="768",
                 train_batch_size=2)


def valid(cfg, family, ds=None):
    return schema.errors_only(schema.validate_config(cfg, family.script, dataset=ds, family=family))


def effective_batch(cfg, ds=None):
    b = cfg.get("train_batch_size", 1)
    if ds and ds.get("general", {}).get("batch_size"):
        b = ds["general"]["batch_size"]
    return b * cfg.get("gradient_accumulation_steps", 1)


# ---- the data -----------------------------------------------------------------------


def test_ladder_file_loads_and_every_move_is_complete():
    lad = ladder.load_ladder()
    names = [m.name for m in lad.moves]
    assert len(names) == len(set(names))
    for m in lad.moves:
        assert m.description and m.speed_note and m.quality_note, m.name
        assert set(m.phases) <= {"model_load", "cache_latents", "cache_text_encoder", "training", "sampling",
                                 "saving"}, m.name
    assert lad.rank_floor == 4 and 0 < lad.tune_low < lad.tune_high < 1


@pytest.mark.parametrize("name,safe", [
    ("network_dim", False), ("optimizer_8bit", False), ("optimizer_adafactor", False), ("train_unet_only", False),
    ("train_single_blocks", False), ("mixed_precision_fp16", False),
    ("batch_to_accumulation", True), ("resolution", True), ("gradient_checkpointing", True),
    ("blocks_to_swap", True), ("fp8_base", True), ("cache_latents", True), ("cache_text_encoder_outputs", True),
    ("cpu_offload_checkpointing", True), ("mixed_precision", True),
])
def test_resume_safety_flags(name, safe):
    assert ladder.load_ladder().move(name).resume_safe is safe


def test_resume_unsafe_moves_are_exactly_those_touching_what_a_state_depends_on():
    # sd-scripts: rank, alpha, network_args, optimizer type, text-encoder training (and switching to fp16).
    state_keys = {"network_dim", "network_alpha", "network_args", "optimizer_type", "optimizer_args",
                  "network_train_unet_only", "mixed_precision",
                  # full fine-tunes: accelerate saves one optimizer state per fused group / block
                  "fused_optimizer_groups", "blockwise_fused_optimizers", "fused_backward_pass"}
    for m in ladder.load_ladder().moves:
        touched = set(m.set) | set(m.unset) | ({m.key} if m.key else set()) | (
            {"network_args"} if m.network_args else set()) | (
            {"network_dim"} if m.kind == "rank" else set()) | ({"optimizer_type"} if m.kind == "optimizer_map" else set())
        if not m.resume_safe:
            assert touched & state_keys, m.name
        elif m.name != "mixed_precision":  # to bf16 is safe; only a switch to fp16 needs a scaler state
            assert not touched & state_keys, m.name


def test_bad_ladder_file_is_a_user_error():
    with pytest.raises(UserError):
        ladder.parse_ladder({"move": [{"name": "x", "kind": "set", "bogus": 1}]})
    with pytest.raises(UserError):
        ladder.parse_ladder({"move": [{"name": "x", "kind": "teleport"}]})


# ---- fit --------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg,family,gb", [(HEAVY_FLUX, FLUX, 24), (HEAVY_FLUX, FLUX, 12), (HEAVY_SDXL, SDXL, 8),
                                           (HEAVY_SDXL, SDXL, 12), (SD15_FP32, SD15, 6)])
def test_fit_reaches_the_budget_with_valid_configs(cfg, family, gb):
    original = dict(cfg)
    r = ladder.fit(cfg, family, budget_gib(gb), gpu_gb=gb)
    assert cfg == original  # the input is never modified
    assert r.fits and r.after.peak_gib <= budget_gib(gb)
    assert r.after.peak_gib == pytest.approx(estimate(r.config, family, dataset=r.dataset).peak_gib)
    assert not valid(r.config, family)
    assert r.steps and all(s.saved_gib > 0 for s in r.steps)
    assert effective_batch(r.config) == effective_batch(cfg)


def test_fit_leaves_a_fitting_config_alone():
    cfg = dict(HEAVY_SDXL, train_batch_size=1, gradient_checkpointing=True, cache_latents=True)
    r = ladder.fit(cfg, SDXL, budget_gib(24), gpu_gb=24)
    assert r.fits and r.steps == [] and r.config == cfg and "as it is" in r.message


def test_default_policy_keeps_quality_when_it_can():
    r = ladder.fit(HEAVY_SDXL, SDXL, budget_gib(12), gpu_gb=12)
    moves = {s.move for s in r.steps}
    assert not moves & {"network_dim", "resolution", "train_unet_only", "optimizer_adafactor"}
    assert r.config["network_dim"] == 64 and r.config["resolution"] == "1024"


def test_quality_moves_only_after_quality_keeping_ones_run_out():
    lad = ladder.load_ladder()
    r = ladder.fit(HEAVY_SDXL, SDXL, budget_gib(6), gpu_gb=6)
    quality = [i for i, s in enumerate(r.steps) if lad.move(s.move).quality_cost > 0]
    if quality:
        first = quality[0]
        later_free = [s.move for s in r.steps[first:] if lad.move(s.move).quality_cost == 0]
        # After the first quality move, a quality-free move may only follow if it became possible
        # because of it (e.g. caching once the text encoder is no longer trained).
        assert set(later_free) <= {"cache_text_encoder_outputs", "blocks_to_swap", "batch_to_accumulation"}


def test_batch_to_accumulation_keeps_the_effective_batch():
    move = ladder.load_ladder().move("batch_to_accumulation")
    cfg = dict(HEAVY_SDXL, gradient_accumulation_steps=3)
    s = resolve(cfg, SDXL)
    variants = ladder_moves._variants(move, SDXL, cfg, None, s, 4)
    assert variants
    for new, _ds, changes in variants:
        assert effective_batch(new) == 4 * 3
        assert {k for k, _, _ in changes} == {"train_batch_size", "gradient_accumulation_steps"}


def test_batch_in_the_dataset_file_is_changed_there():
    ds = {"general": {"batch_size": 4, "resolution": 1024},
          "datasets": [{"subsets": [{"image_dir": "imgs", "num_repeats": 1}]}]}
    cfg = dict(HEAVY_SDXL, train_batch_size=1, gradient_checkpointing=True)
    r = ladder.fit(cfg, SDXL, budget_gib(8), dataset=ds, gpu_gb=8)
    assert r.fits
    changed = [k for s in r.steps for k, _, _ in s.changes]
    assert "dataset:general.batch_size" in changed
    assert r.dataset["general"]["batch_size"] * r.config["gradient_accumulation_steps"] == 4
    assert ds["general"]["batch_size"] == 4  # the caller's dataset is untouched
    assert not schema.errors_only(schema.validate_dataset(r.dataset, SDXL))


def test_roadmap_policy_follows_the_guides_order():
    lad = ladder.load_ladder()
    r = ladder.fit(SD15_FP32, SD15, budget_gib(6) - 1.5, policy="roadmap", gpu_gb=6)
    taken = r.applied_order
    stages = [lad.move(n).roadmap or 99 for n in taken]
    # Each stage is entered in the guides' order. A move of an earlier stage that only starts
    # to save memory after a later one (fp8 base once checkpointing is on) is taken then.
    assert first_appearances(stages) == sorted(first_appearances(stages))
    assert taken[:3] == ["batch_to_accumulation", "mixed_precision", "network_dim"]
    assert taken.index("gradient_checkpointing") < taken.index("resolution")
    # The result keeps only what the budget needs, in the order taken.
    final = [s.move for s in r.steps]
    assert [n for n in taken if n in final] == final


def first_appearances(seq):
    out = []
    for x in seq:
        if x not in out:
            out.append(x)
    return out


def test_roadmap_uses_rank_before_checkpointing():
    lad = ladder.load_ladder()
    cfg = dict(HEAVY_SDXL, train_batch_size=1)
    r = ladder.fit(cfg, SDXL, budget_gib(10), policy="roadmap", gpu_gb=10)
    names = r.applied_order
    if "network_dim" in names and "gradient_checkpointing" in names:
        assert names.index("network_dim") < names.index("gradient_checkpointing")
    stages = [lad.move(n).roadmap or 99 for n in names]
    assert first_appearances(stages) == sorted(first_appearances(stages))


def test_floors_end_the_ladder_with_a_clear_message():
    r = ladder.fit(HEAVY_FLUX, FLUX, 3.0, gpu_gb=4)
    assert not r.fits
    assert re.match(r"cannot fit in 4 GB; the smallest config needs \d+\.\d\d GiB", r.message)
    assert r.config["network_dim"] >= 4
    s = resolve(r.config, FLUX)
    assert min(s.resolution) >= FLUX.resolution_floor
    assert r.after.peak_gib > 3.0
    assert not valid(r.config, FLUX)
    # The message's figure is the smallest config reached.
    assert f"{r.after.peak_gib:.2f} GiB" in r.message


def test_sd15_resolution_floor_is_256():
    r = ladder.fit(SD15_FP32, SD15, 0.5, gpu_gb=1)
    assert not r.fits
    assert min(resolve(r.config, SD15).resolution) == 256


def test_flux_hint_for_16_bit_t5():
    cfg = dict(HEAVY_FLUX, t5xxl="t5xxl_fp16.safetensors")
    r = ladder.fit(cfg, FLUX, budget_gib(8), gpu_gb=8)
    assert not r.fits and r.after.peak_phase == "cache_text_encoder"
    assert any("fp8 T5-XXL" in h for h in r.hints)


def test_every_variant_of_every_applicable_move_validates():
    lad = ladder.load_ladder()
    for cfg, fam in ((HEAVY_FLUX, FLUX), (HEAVY_SDXL, SDXL), (SD15_FP32, SD15)):
        s = resolve(cfg, fam)
        f = ladder.facts(cfg, fam, None, s)
        produced = 0
        for m in lad.moves:
            if not ladder_moves._applies(m, fam, cfg, f):
                continue
            for new, ds, _ in ladder_moves._variants(m, fam, cfg, None, s, lad.rank_floor):
                produced += 1
                problems = valid(new, fam, ds)
                # fit only uses variants that validate; those it uses must be all of them here.
                assert not problems, (m.name, problems)
        assert produced > 5


# ---- tune and presets -----------------------------------------------------------------------


def test_tune_gives_speed_back_when_the_budget_allows():
    cfg = dict(HEAVY_FLUX, fp8_base=True, gradient_checkpointing=True, cache_latents=True,
               cache_text_encoder_outputs=True, network_train_unet_only=True, train_batch_size=1,
               blocks_to_swap=28, optimizer_type="AdamW8bit")
    r = ladder.tune(cfg, FLUX, budget_gib(24), gpu_gb=24)
    assert r.fits
    assert "blocks_to_swap" not in r.config  # 24 GB needs no block swap for this
    assert r.config["optimizer_type"] == "AdamW"
    assert r.config["gradient_checkpointing"] is True  # without it FLUX needs far more than 24 GB
    assert r.after.peak_gib <= 0.92 * budget_gib(24)


def test_tune_keeps_what_the_budget_needs():
    cfg = dict(HEAVY_FLUX, fp8_base=True, gradient_checkpointing=True, cache_latents=True,
               cache_text_encoder_outputs=True, network_train_unet_only=True, train_batch_size=1,
               blocks_to_swap=28, network_dim=4)
    r = ladder.tune(cfg, FLUX, budget_gib(8), gpu_gb=8)
    assert r.fits and r.config.get("blocks_to_swap", 0) >= 16


@pytest.mark.parametrize("model", ["sd15", "sdxl", "flux"])
def test_every_preset_tunes_to_a_valid_config(model):
    fam = FAMILIES[model]
    for job in presets.JOBS:
        for gb in presets.GPU_CLASSES:
            plan = presets.compose(model, job, gb, inputs={"t5xxl": "/m/t5xxl_fp8_e4m3fn.safetensors"}
                                   if model == "flux" else None)
            r = ladder.tune(plan.config, fam, budget_gib(gb), gpu_gb=gb)
            assert not valid(r.config, fam), (model, job, gb)
            if r.fits:
                assert r.after.peak_gib <= budget_gib(gb)
            else:
                assert r.message.startswith(f"cannot fit in {gb} GB")


# ---- next_step --------------------------------------------------------------------------


def test_next_step_sampling_oom_touches_only_sampling():
    cfg = dict(HEAVY_SDXL, train_batch_size=1, gradient_checkpointing=True, cache_latents=True,
               network_train_unet_only=True, cache_text_encoder_outputs=True, sample_prompts="p.txt",
               sample_every_n_steps=100, no_half_vae=True)
    st = ladder.next_step(cfg, SDXL, phase="sampling", deficit_gib=0.1)
    assert st is not None
    moves = set(st.move.split("+"))
    assert moves <= {m.name for m in ladder.load_ladder().moves if "sampling" in m.phases}
    assert "network_dim" not in moves and "resolution" not in moves


def test_next_step_caching_oom_lowers_vae_batch():
    cfg = dict(HEAVY_SDXL, cache_latents=True, vae_batch_size=8)
    st = ladder.next_step(cfg, SDXL, phase="cache_latents", deficit_gib=0.5)
    assert st is not None and st.move == "vae_batch_size"
    assert st.changes[0][0] == "vae_batch_size" and st.changes[0][2] < 8


def test_next_step_respects_tried_and_resume_safety():
    cfg = dict(HEAVY_SDXL)
    first = ladder.next_step(cfg, SDXL, phase="training", deficit_gib=1.0)
    assert first is not None
    second = ladder.next_step(cfg, SDXL, phase="training", deficit_gib=1.0, tried={first.move})
    assert second is not None and first.move not in second.move.split("+")
    safe = ladder.next_step(cfg, SDXL, phase="training", deficit_gib=100.0, require_resume_safe=True)
    assert safe is not None and safe.resume_safe
    unsafe_names = {m.name for m in ladder.load_ladder().moves if not m.resume_safe}
    assert not set(safe.move.split("+")) & unsafe_names


def test_next_step_combines_moves_for_a_big_deficit():
    cfg = dict(HEAVY_SDXL)
    base = estimate(cfg, SDXL).phases_gib["training"]
    st = ladder.next_step(cfg, SDXL, phase="training", deficit_gib=base * 0.6)
    assert st is not None and "+" in st.move
    new, _ = ladder.apply_step(cfg, st)
    assert base - estimate(new, SDXL).phases_gib["training"] >= base * 0.6 - 1e-6
    assert not valid(new, SDXL)


def test_next_step_prefers_a_small_sufficient_move():
    cfg = dict(HEAVY_SDXL, gradient_checkpointing=True, cache_latents=True, train_batch_size=1)
    st = ladder.next_step(cfg, SDXL, phase="training", deficit_gib=0.05)
    assert st is not None and "+" not in st.move
    assert st.saved_gib >= 0.05


def test_next_step_runs_out_at_the_floor():
    cfg = dict(HEAVY_FLUX)
    tried: set[str] = set()
    for _ in range(40):
        st = ladder.next_step(cfg, FLUX, phase="training", deficit_gib=50.0, tried=tried)
        if st is None:
            break
        cfg, _ = ladder.apply_step(cfg, st)
        assert not valid(cfg, FLUX)
    else:
        pytest.fail("the ladder never reached its floor")
    s = resolve(cfg, FLUX)
    assert s.rank == 4 and min(s.resolution) == FLUX.resolution_floor
    assert cfg["blocks_to_swap"] == FLUX.blocks_to_swap_max


@pytest.mark.parametrize("model", list(FAMILIES))
@pytest.mark.parametrize("gb", [6, 12, 24, 48])
def test_tune_keeps_the_effective_batch(model, gb):
    plan = presets.compose(model, "style", gb)
    before = (plan.config.get("train_batch_size") or 1) * (plan.config.get("gradient_accumulation_steps") or 1)
    result = ladder.tune(plan.config, plan.family, budget_gib(gb))
    cfg = result.config
    assert (cfg.get("train_batch_size") or 1) * (cfg.get("gradient_accumulation_steps") or 1) == before


def test_accumulation_becomes_batch_only_up_to_the_lower_target():
    fam = FAMILIES["flux"]
    cfg = presets.compose("flux", "style", 24).config
    lad = ladder.load_ladder()
    budget = budget_gib(24)
    result = ladder.tune(cfg, fam, budget)
    moved = [s for s in result.steps if s.move == "accumulation_to_batch"]
    assert moved, "a 24 GB card has room for a larger FLUX batch at 512 px"
    assert result.after.peak_gib <= lad.tune_low * budget
    assert result.config["train_batch_size"] > cfg["train_batch_size"]
    # One step further would pass the lower target, which is why it stopped there.
    bigger = dict(result.config, train_batch_size=result.config["train_batch_size"] * 2,
                  gradient_accumulation_steps=None)
    assert estimate(bigger, fam).peak_gib > lad.tune_low * budget


def test_unknown_relax_kind_is_refused():
    with pytest.raises(UserError, match="unknown kind"):
        ladder.parse_ladder({"relax": [{"name": "x", "kind": "teleport"}]})


# ---- the user's keys, the CPU, one move at a time -------------------------------------


CPU_SD15 = dict(network_module="networks.lora", network_dim=32, network_alpha=16.0, resolution="512",
                train_batch_size=1, gradient_accumulation_steps=4, mixed_precision="bf16", sdpa=True,
                cache_latents=True, optimizer_type="AdamW")


def _names(step):
    return set(step.move.split("+")) if step else set()


def test_cpu_runs_are_never_offered_what_a_cpu_cannot_run():
    no_cpu = {m.name for m in ladder.load_ladder().moves if not m.cpu}
    assert {"fp8_base", "optimizer_8bit", "mixed_precision_fp16"} <= no_cpu
    gpu = ladder.next_step(dict(CPU_SD15), SD15, phase="training", deficit_gib=50.0)
    assert _names(gpu) & no_cpu  # on a GPU the big deficit reaches for them
    cpu = ladder.next_step(dict(CPU_SD15), SD15, phase="training", deficit_gib=50.0, cpu=True)
    assert cpu is not None and not _names(cpu) & no_cpu
    fitted = ladder.fit(dict(CPU_SD15, network_dim=128), SD15, 1.0, cpu=True)
    assert not {st.move for st in fitted.steps} & no_cpu


def test_a_key_the_user_set_moves_only_when_nothing_else_is_left():
    cfg = dict(SD15_FP32, sdpa=True, cache_latents=True, mixed_precision="no")
    free = ladder.next_step(dict(cfg), SD15, phase="training", deficit_gib=0.05)
    assert free is not None and "mixed_precision" in {c[0] for c in free.changes}
    kept = ladder.next_step(dict(cfg), SD15, phase="training", deficit_gib=0.05, keep={"mixed_precision"})
    assert kept is not None and "mixed_precision" not in {c[0] for c in kept.changes}
    assert "you set yourself" not in kept.note
    # Everything else tried (a stepped move is never used up by a try: only the one-value moves are
    # looked at here): the user's key is the one left, and the note says so.
    others = {m.name for m in ladder.load_ladder().moves
              if m.name != "mixed_precision" and m.kind not in STEPPED_KINDS}
    last = ladder.next_step(dict(cfg), SD15, phase="training", deficit_gib=0.05, keep={"mixed_precision"},
                            tried=others, only=others | {"mixed_precision"})
    assert last is not None and last.move == "mixed_precision"
    assert "mixed_precision, which you set yourself" in last.note


def test_one_move_at_a_time_after_an_estimate_that_was_wrong():
    combined = ladder.next_step(dict(HEAVY_SDXL), SDXL, phase="training", deficit_gib=100.0)
    assert combined is not None and len(_names(combined)) > 1
    single = ladder.next_step(dict(HEAVY_SDXL), SDXL, phase="training", deficit_gib=100.0, one_at_a_time=True)
    assert single is not None and len(_names(single)) == 1 and "one move at a time" in single.note


def test_tune_never_relaxes_a_key_the_user_set():
    cfg = dict(CPU_SD15, mixed_precision="no", resolution="64,64")
    free = ladder.tune(dict(cfg), SD15, 20.0)
    assert free.config.get("train_batch_size") == 4 and not free.config.get("gradient_accumulation_steps")
    kept = ladder.tune(dict(cfg), SD15, 20.0, keep={"train_batch_size", "gradient_accumulation_steps"})
    assert kept.config["train_batch_size"] == 1 and kept.config["gradient_accumulation_steps"] == 4


def test_a_stepped_move_that_fell_short_goes_on_to_its_next_value():
    # The run tried blocks_to_swap (now 8) and still ran out: the next value is a move, not the floor.
    flux = FAMILIES["flux"]
    cfg = presets.compose("flux", "character", 24).config
    cfg = dict(cfg, blocks_to_swap=8)
    stepped = [m for m in ladder.load_ladder().moves if m.kind in STEPPED_KINDS]
    assert {m.kind for m in stepped} == set(STEPPED_KINDS)
    step = ladder.next_step(dict(cfg), flux, phase="training", deficit_gib=0.5, tried={"blocks_to_swap"},
                            only={"blocks_to_swap"})
    assert step is not None
    (key, old, new), = [c for c in step.changes if c[0] == "blocks_to_swap"]
    assert old == 8 and new > 8
    # At the family's last value nothing is left of it.
    top = dict(cfg, blocks_to_swap=flux.blocks_to_swap_max)
    assert ladder.next_step(top, flux, phase="training", deficit_gib=0.5, tried={"blocks_to_swap"},
                            only={"blocks_to_swap"}) is None


def test_fp8_storage_is_offered_when_text_encoder_caching_sets_the_peak():
    # SD3's 24 GB plan with an fp8 T5-XXL file: on 8 GB caching the captions is what does not fit, and
    # storing the weights in fp8 is the move that makes it (the 8 GB preset's own choice).
    cfg = dict(presets.compose("sd3", "style", 24).config, t5xxl="t5xxl_fp8_e4m3fn.safetensors")
    fam = FAMILIES["sd3"]
    assert estimate(cfg, fam).peak_phase == "cache_text_encoder"
    fitted = ladder.fit(dict(cfg), fam, budget_gib(8))
    assert fitted.fits and "fp8_base" in {st.move for st in fitted.steps}


PRESET_FAMILIES = sorted(f for f in FAMILIES if (presets_dir() / "models" / f"{f}.toml").is_file())


@pytest.mark.parametrize("family", PRESET_FAMILIES)
@pytest.mark.parametrize("gb", presets.GPU_CLASSES)
def test_a_config_that_trains_the_text_encoder_fits_where_the_preset_does(family, gb):
    """The preset for the card is a witness that the text-encoder cache with the diffusion model
    trained alone reaches the budget. The same config with the text encoder trained and nothing
    cached must fit too, even where neither switch alone lowers the peak (Lumina 2 keeps Gemma-2 on
    the card while it is trained, cache or not)."""
    fam = FAMILIES[family]
    plan = presets.compose(family, "character", gb)
    ds = presets.build_dataset(plan, None)
    cfg = dict(plan.config)
    budget = budget_gib(gb)
    if not (cfg.get("network_train_unet_only") and cfg.get("cache_text_encoder_outputs")):
        pytest.skip("the preset does not cache the text encoder")
    if not ladder.fit(cfg, fam, budget, dataset=ds, gpu_gb=gb).fits:
        pytest.skip("the preset itself does not fit")
    user = {**cfg, "network_train_unet_only": False, "cache_text_encoder_outputs": False,
            "cache_text_encoder_outputs_to_disk": False}
    if valid(user, fam, ds):
        pytest.skip("training this family's text encoder is not a valid config")
    r = ladder.fit(user, fam, budget, dataset=ds, gpu_gb=gb)
    assert r.fits, r.message
    assert not valid(r.config, fam, r.dataset)
    assert r.after.peak_gib == pytest.approx(estimate(r.config, fam, dataset=r.dataset).peak_gib)
