"""Facts about a config, which moves apply, and the candidates each move offers."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from kohya_tuner import schema
from kohya_tuner.families import Family
from kohya_tuner.memory import Estimate, estimate, finetune, lycoris
from kohya_tuner.memory.setup import SAMPLE_SIZE_KEY, Setup, _dataset_levels, network_args

from kohya_tuner.ladder.data import MIN_SAVING_GIB, Move, Ladder


# ---- results -----------------------------------------------------------------------


class Step(BaseModel):
    move: str
    changes: list[tuple[str, Any, Any]]
    saved_gib: float
    speed_cost: str
    quality_cost: str
    resume_safe: bool
    reason: str
    phase: str = "training"
    # Why the step is what it is beyond its saving: a key you set was moved, one move at a time.
    note: str = ""


class FitResult(BaseModel):
    config: dict[str, Any]
    dataset: dict[str, Any] | None = None
    steps: list[Step] = Field(default_factory=list)
    before: Estimate
    after: Estimate
    fits: bool
    budget_gib: float
    message: str
    policy: str = "default"
    hints: list[str] = Field(default_factory=list)
    # Every move in the order the policy took it, including those the final pruning dropped.
    applied_order: list[str] = Field(default_factory=list)
    # What to know before training a config that fits (a nearly full card, a card below the presets).
    cautions: list[str] = Field(default_factory=list)
    # A file swap that makes a config fit that no setting can: {key, value, label, peak_gib}.
    offer: dict[str, Any] | None = None

    @property
    def resume_safe(self) -> bool:
        return all(s.resume_safe for s in self.steps)


# ---- facts and conditions -------------------------------------------------------------


def _dataset_any(dataset: dict[str, Any] | None, key: str, positive: bool = False) -> bool:
    general, dss = _dataset_levels(dataset)
    levels = [general] + dss + [s for d in dss for s in (d.get("subsets") or []) if isinstance(s, dict)]
    for lv in levels:
        v = lv.get(key)
        if positive:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                return True
        elif v:
            return True
    return False


def facts(config: dict[str, Any], family: Family, dataset: dict[str, Any] | None, s: Setup,
          bf16: bool = True) -> dict[str, Any]:
    """What the move conditions in ladder.toml can ask about a config."""

    def cfg_or_ds(key: str, positive: bool = False) -> bool:
        v = config.get(key)
        if positive:
            own = isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        else:
            own = bool(v)
        return own or _dataset_any(dataset, key, positive)

    te_cache_blocked = (cfg_or_ds("shuffle_caption") or cfg_or_ds("caption_dropout_rate", True)
                        or cfg_or_ds("caption_tag_dropout_rate", True) or cfg_or_ds("token_warmup_step", True)
                        or network_args(config).get("train_t5xxl") == "True")
    te_trained = any(s.te_trained)
    te_cache_allowed = family.has_te_cache and not s.cache_te and not te_cache_blocked and not (
        family.name == "sdxl" and te_trained)
    # For FLUX with a trained CLIP-L, caching still removes T5.
    spec = s.optimizer.spec
    return {
        "latent_cache_allowed": not s.cache_latents and not (cfg_or_ds("color_aug") or cfg_or_ds("random_crop")),
        "te_cache_allowed": te_cache_allowed,
        "attention_math": s.attention == "math",
        "mixed_precision": s.mixed_precision,
        "mixed_precision_set": s.mixed_precision != "no",
        "bf16": bool(bf16),
        "batch_gt_1": s.batch > 1,
        "checkpointing": s.checkpointing,
        "swapping": s.blocks_to_swap > 0,
        "fp8": s.unet_dtype == "fp8",
        "lora_fp32": s.lora_dtype == "fp32",
        "optimizer_has_state": spec.name != "Adafactor" and spec.bytes_per_param(4.0, s.rank) > 0.5,
        "t5_tokens_gt_256": s.t5_tokens > 256,
        "te_trained": te_trained,
        "sampling": s.sampling,
        # The plan writes its own prompt file, so the preview size is the plan's to choose.
        "sample_size_planned": bool(config.get(SAMPLE_SIZE_KEY)),
        "vae_batch_gt_1": s.vae_batch > 1,
        "te_batch_gt_1": s.te_batch > 1 and s.cache_te,
        # Full fine-tunes: which fused optimizer step the script implements (memory/finetune.py).
        "fused_backward_allowed": _fused_allowed(config, s, finetune.FUSED_BACKWARD_SCRIPTS) and not s.fused_backward,
        "optimizer_groups_allowed": _fused_allowed(config, s, finetune.OPTIMIZER_GROUP_SCRIPTS),
        "blockwise_allowed": _fused_allowed(config, s, finetune.BLOCKWISE_SCRIPTS) and not s.fused_groups,
        "optimizer_adafactor": spec.name == "Adafactor",
        # Set in the config, whatever the script (get_optimizer asserts for every script that takes it).
        "fused_backward_set": cfg_or_ds("fused_backward_pass"),
        # D-Adaptation and Prodigy estimate the learning rate from every weight they step.
        "optimizer_adapts_lr": spec.name.lower().startswith(("dadapt", "prodigy")),
    }


def _fused_allowed(config: dict[str, Any], s: Setup, scripts: frozenset) -> bool:
    ga = config.get("gradient_accumulation_steps")
    single_step = not (isinstance(ga, int) and not isinstance(ga, bool) and ga > 1)
    return s.mode == "full" and s.family.script in scripts and not s.fused_backward and single_step


def _config_ok(config: dict[str, Any], cond: dict[str, dict[str, Any]]) -> bool:
    for key, test in cond.items():
        v = config.get(key)
        for op, want in test.items():
            if op == "eq" and not (v == want or (want is False and not v)):
                return False
            if op == "ne" and (v == want or (want is False and not v)):
                return False
            if op == "in" and v not in want:
                return False
            if op == "not_in" and v in want:
                return False
            if op == "lt" and not (isinstance(v, (int, float)) and v < want):
                return False
            if op == "gt" and not (isinstance(v, (int, float)) and v > want):
                return False
    return True


def _applies(move: Move, family: Family, config: dict[str, Any], f: dict[str, Any]) -> bool:
    if move.families and family.name not in move.families:
        return False
    for k, want in move.facts.items():
        if f.get(k) != want:
            return False
    return _config_ok(config, move.config_when)


# ---- applying moves -------------------------------------------------------------------


@dataclass
class Candidate:
    move: Move
    config: dict[str, Any]
    dataset: dict[str, Any] | None
    changes: list[tuple[str, Any, Any]]
    est: Estimate | None = None
    cost: float = 0.0


def _set(config: dict[str, Any], changes: list, key: str, value: Any) -> None:
    old = config.get(key)
    if value is None:
        if key in config:
            del config[key]
            changes.append((key, old, None))
        return
    if old != value:
        config[key] = value
        changes.append((key, old, value))


def _set_dataset_key(dataset: dict[str, Any] | None, changes: list, key: str, value: Any) -> bool:
    """Set `key` wherever the dataset file defines it (it wins over the config there)."""
    if not isinstance(dataset, dict):
        return False
    touched = False
    general = dataset.get("general")
    if isinstance(general, dict) and general.get(key) is not None:
        if general[key] != value:
            changes.append((f"dataset:general.{key}", general[key], value))
            general[key] = value
        touched = True
    for i, ds in enumerate(dataset.get("datasets") or []):
        if isinstance(ds, dict) and ds.get(key) is not None:
            if ds[key] != value:
                changes.append((f"dataset:datasets[{i}].{key}", ds[key], value))
                ds[key] = value
            touched = True
    return touched


def _with_network_args(config: dict[str, Any], updates: dict[str, str]) -> list[str] | None:
    raw = config.get("network_args")
    items = list(raw) if isinstance(raw, (list, tuple)) else []
    current = network_args(config)
    if all(current.get(k) == v for k, v in updates.items()):
        return None
    kept = [it for it in items if not (isinstance(it, str) and it.split("=", 1)[0].strip() in updates)]
    return kept + [f"{k}={v}" for k, v in updates.items()]


def _variants(move: Move, family: Family, config: dict[str, Any], dataset: dict[str, Any] | None, s: Setup,
              rank_floor: int) -> list[tuple[dict, dict | None, list]]:
    """The configs a move can produce, least aggressive first."""
    out = []

    def fresh():
        return dict(config), copy.deepcopy(dataset) if dataset is not None else None, []

    if move.kind == "set":
        cfg, ds, ch = fresh()
        for k, v in move.set.items():
            _set(cfg, ch, k, v)
        for k in move.unset:
            _set(cfg, ch, k, None)
        if move.network_args:
            new_args = _with_network_args(cfg, move.network_args)
            if new_args is not None:
                _set(cfg, ch, "network_args", new_args)
        if ch:
            out.append((cfg, ds, ch))
    elif move.kind == "steps":
        current = config.get(move.key)
        cur = current if isinstance(current, (int, float)) and not isinstance(current, bool) else None
        if move.key == "text_encoder_batch_size" and cur is None:
            cur = s.te_batch
        if move.key == "vae_batch_size" and cur is None:
            cur = s.vae_batch
        if move.key == "t5xxl_max_token_length" and cur is None:
            cur = s.t5_tokens
        if move.key == "blocks_to_swap" and cur is None:
            cur = s.blocks_to_swap
        ascending = list(move.values) == sorted(move.values)
        for v in move.values:
            if cur is not None and ((ascending and v <= cur) or (not ascending and v >= cur)):
                continue
            if move.key == "blocks_to_swap" and family.blocks_to_swap_max and v > family.blocks_to_swap_max:
                continue
            cfg, ds, ch = fresh()
            _set(cfg, ch, move.key, v)
            if move.key == "blocks_to_swap":
                _set(cfg, ch, "split_mode", None)
            for k in move.unset:
                _set(cfg, ch, k, None)
            out.append((cfg, ds, ch))
    elif move.kind == "batch_to_accumulation":
        b = s.batch
        ga = config.get("gradient_accumulation_steps")
        ga = int(ga) if isinstance(ga, (int, float)) and not isinstance(ga, bool) and ga >= 1 else 1
        for nb in sorted((d for d in range(1, b) if b % d == 0), reverse=True):
            cfg, ds, ch = fresh()
            _set(cfg, ch, "train_batch_size", nb)
            _set_dataset_key(ds, ch, "batch_size", nb)
            _set(cfg, ch, "gradient_accumulation_steps", ga * (b // nb))
            out.append((cfg, ds, ch))
    elif move.kind == "rank":
        rank = s.rank
        alpha = config.get("network_alpha")
        for v in move.values:
            if v >= rank or v < rank_floor:
                continue
            cfg, ds, ch = fresh()
            _set(cfg, ch, "network_dim", int(v))
            if isinstance(alpha, (int, float)) and not isinstance(alpha, bool):
                _set(cfg, ch, "network_alpha", float(alpha) * v / rank)
            out.append((cfg, ds, ch))
    elif move.kind == "resolution":
        w, h = s.resolution
        side = max(w, h)
        step = family.bucket_step
        for v in move.values:
            if v >= side or v < family.resolution_floor:
                continue
            nw = max(step, int(round(w * v / side / step)) * step)
            nh = max(step, int(round(h * v / side / step)) * step)
            cfg, ds, ch = fresh()
            text = f"{nw}" if nw == nh else f"{nw},{nh}"
            in_ds = _set_dataset_key(ds, ch, "resolution", nw if nw == nh else [nw, nh])
            if "resolution" in cfg or not in_ds:
                _set(cfg, ch, "resolution", text)
            mn = cfg.get("min_bucket_reso")
            if isinstance(mn, int) and mn > min(nw, nh):
                _set(cfg, ch, "min_bucket_reso", min(nw, nh))
            out.append((cfg, ds, ch))
    elif move.kind == "sample_size":
        w, h = s.sample_resolution or s.resolution
        side = max(w, h)
        for v in move.values:
            if v >= side:
                continue
            # sd-scripts draws previews in multiples of 64 px.
            nw, nh = (max(64, int(round(x * v / side / 64)) * 64) for x in (w, h))
            cfg, ds, ch = fresh()
            _set(cfg, ch, SAMPLE_SIZE_KEY, f"{nw}x{nh}")
            out.append((cfg, ds, ch))
    elif move.kind == "optimizer_map":
        key = s.optimizer.spec.name.lower()
        target = move.map.get(key)
        if target and s.optimizer.known:
            cfg, ds, ch = fresh()
            _set(cfg, ch, "optimizer_type", target)
            _set(cfg, ch, "use_8bit_adam", None)
            _set(cfg, ch, "use_lion_optimizer", None)
            out.append((cfg, ds, ch))
    return out


def _valid(cfg: dict[str, Any], ds: dict[str, Any] | None, family: Family) -> bool:
    cfg = {k: v for k, v in cfg.items() if k != SAMPLE_SIZE_KEY}  # the plan's, not sd-scripts'
    # The user's file passed `check` before the fit began: a key sd-scripts ignores is no reason
    # to reject every variant of it.
    if lycoris.unsplittable(family.name, cfg):
        return False  # a rank LyCORIS BOFT cannot build the model's layers at
    return not schema.errors_only(schema.validate_config(cfg, family.script, dataset=ds, family=family,
                                                         unknown_keys="warning"))


def _move_cost(move: Move, changes: list) -> float:
    cost = move.speed_cost
    if move.kind == "steps" and move.values and move.key == "blocks_to_swap":
        v = next((new for k, _, new in changes if k == move.key), move.values[-1])
        cost = move.speed_cost * float(v) / float(max(move.values))
    return max(cost, 0.0) + move.quality_cost + move.cost_bias


class _Ctx:
    """Shared state of one fit: the family, dataset, history and the estimator calls."""

    def __init__(self, family: Family, history, gpu_name, bf16: bool, ladder: Ladder,
                 caches_done: frozenset[str] = frozenset(), driver: str | None = None, gpus: int = 1):
        self.family = family
        # Each rank holds the whole model and DDP's gradient buckets: the peak is per card.
        self.gpus = max(1, int(gpus))
        self.driver = driver
        self.history = history
        self.gpu_name = gpu_name
        self.bf16 = bf16
        self.ladder = ladder
        self.caches_done = caches_done

    def est(self, cfg, ds) -> Estimate:
        return estimate(cfg, self.family, dataset=ds, history=self.history, gpu_name=self.gpu_name,
                        caches_done=self.caches_done, driver=self.driver, gpus=self.gpus)


def _phase_value(e: Estimate, phase: str | None) -> float:
    if phase is None:
        return e.peak_gib
    return e.phases_gib.get(phase, 0.0)


def _best_candidate(ctx: _Ctx, move: Move, cfg, ds, s: Setup, base: float, target: float,
                    phase: str | None) -> Candidate | None:
    """The least aggressive variant of `move` that gets under `target`, else the variant
    that saves the most. None when no variant saves anything or all are invalid."""
    best: Candidate | None = None
    for ncfg, nds, ch in _variants(move, ctx.family, cfg, ds, s, ctx.ladder.rank_floor):
        if not _valid(ncfg, nds, ctx.family):
            continue
        e = ctx.est(ncfg, nds)
        value = _phase_value(e, phase)
        if base - value < MIN_SAVING_GIB:
            continue
        cand = Candidate(move, ncfg, nds, ch, e, _move_cost(move, ch))
        if value <= target:
            return cand
        if best is None or _phase_value(best.est, phase) > value:
            best = cand
    return best


def _choose(cands: list[Candidate], base: float, target: float, phase: str | None, policy: str) -> Candidate:
    if policy == "roadmap":
        def stage(c: Candidate) -> int:
            return c.move.roadmap if c.move.roadmap else 99
        first = min(stage(c) for c in cands)
        in_stage = [c for c in cands if stage(c) == first]
        return in_stage[0]  # the ladder file's order within a stage
    # Quality-keeping moves first.
    tier = min(1 if c.move.quality_cost else 0 for c in cands)
    pool = [c for c in cands if (1 if c.move.quality_cost else 0) == tier]
    best = max(pool, key=lambda c: (base - _phase_value(c.est, phase)) / (0.05 + c.cost))
    # A move that closes the gap on its own is preferred when it costs no more than the
    # move with the best saving per cost: one change instead of several.
    closers = [c for c in pool if _phase_value(c.est, phase) <= target and c.cost <= best.cost + 1e-9]
    if closers:
        return min(closers, key=lambda c: (c.cost, len(c.changes), _phase_value(c.est, phase)))
    return best


def _step(c: Candidate, before: float, phase: str | None, reason: str) -> Step:
    m = c.move
    return Step(move=m.name, changes=c.changes, saved_gib=round(before - _phase_value(c.est, phase), 3),
                speed_cost=m.speed_note, quality_cost=m.quality_text, resume_safe=m.resume_safe, reason=reason,
                phase=phase or "training")


def _describe_budget(budget: float, gpu_gb: float | None) -> str:
    return f"{gpu_gb:g} GB" if gpu_gb else f"a budget of {budget:.2f} GiB"


