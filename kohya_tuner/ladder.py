"""The downgrade ladder: moves that lower a config's peak VRAM, and the policies that pick them.

The moves are data (`data/ladder.toml`, editable by a person); what each saves is computed by
the estimator for the config at hand, never stored. `fit` applies moves until the estimate is
under the budget, `tune` then gives speed back where the budget allows, and `next_step` picks
one move for the phase a real run ran out of memory in. All three are pure functions.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from pydantic import BaseModel, Field

from kohya_tuner import schema
from kohya_tuner.errors import UserError
from kohya_tuner.families import Family
from kohya_tuner.memory import Estimate, estimate
from kohya_tuner.memory.setup import Setup, _dataset_levels, network_args, resolve
from kohya_tuner.optimizers import lookup

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LADDER_FILE = Path(__file__).resolve().parent / "data" / "ladder.toml"

QUALITY_WORDS = {0: "none", 1: "small", 2: "noticeable", 3: "large"}
POLICIES = ("default", "roadmap")
# A move must save at least this much to count as a move.
MIN_SAVING_GIB = 0.01


# ---- data --------------------------------------------------------------------------


@dataclass(frozen=True)
class Move:
    name: str
    label: str
    description: str
    kind: str
    set: dict[str, Any] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    network_args: dict[str, str] = field(default_factory=dict)
    key: str = ""
    values: tuple[Any, ...] = ()
    map: dict[str, str] = field(default_factory=dict)
    families: tuple[str, ...] = ()
    facts: dict[str, Any] = field(default_factory=dict)
    config_when: dict[str, dict[str, Any]] = field(default_factory=dict)
    speed_cost: float = 0.0
    speed_note: str = ""
    quality_cost: int = 0
    quality_note: str = ""
    resume_safe: bool = True
    phases: tuple[str, ...] = ("training",)
    roadmap: int | None = None

    @property
    def quality_text(self) -> str:
        word = QUALITY_WORDS.get(self.quality_cost, str(self.quality_cost))
        return self.quality_note if self.quality_note.startswith(word) else f"{word}: {self.quality_note}"


@dataclass(frozen=True)
class Relax:
    name: str
    label: str
    kind: str
    key: str = ""
    unset: tuple[str, ...] = ()
    map: dict[str, str] = field(default_factory=dict)
    speed_note: str = ""
    # How full the card may get through this relax: "target_high" (default) or "target_low".
    ceiling: str = "target_high"


@dataclass(frozen=True)
class FileSwap:
    """A file the user can swap and the fit cannot (it never rewrites a path the user gave)."""

    name: str
    key: str
    value: str
    label: str
    note: str = ""
    families: tuple[str, ...] = ()
    phases: tuple[str, ...] = ()
    # A current value containing one of these already is the cheaper file.
    unless_contains: tuple[str, ...] = ()

    def applies(self, config: dict[str, Any], family: Family, phase: str) -> bool:
        if self.families and family.name not in self.families:
            return False
        if self.phases and phase not in self.phases:
            return False
        current = str(config.get(self.key) or "").lower()
        return not any(m in current for m in self.unless_contains)


@dataclass(frozen=True)
class Ladder:
    moves: tuple[Move, ...]
    relaxes: tuple[Relax, ...]
    rank_floor: int
    tune_low: float
    tune_high: float
    file_swaps: tuple[FileSwap, ...] = ()
    caution_share: float = 0.95
    small_card_gb: float = 6.0

    def move(self, name: str) -> Move:
        for m in self.moves:
            if m.name == name:
                return m
        raise KeyError(name)


_MOVE_KEYS = {"name", "label", "description", "kind", "set", "unset", "network_args", "key", "values", "map", "when",
              "speed_cost", "speed_note", "quality_cost", "quality_note", "resume_safe", "phases", "roadmap"}
_KINDS = {"set", "steps", "batch_to_accumulation", "rank", "resolution", "optimizer_map"}
_RELAX_KINDS = {"steps_down", "unset", "optimizer_map", "accumulation_to_batch"}


def parse_ladder(doc: dict[str, Any], where: str = "ladder") -> Ladder:
    moves = []
    for i, raw in enumerate(doc.get("move") or []):
        unknown = set(raw) - _MOVE_KEYS
        if unknown:
            raise UserError(f"{where}: move {raw.get('name', i)!r} has unknown field(s) {sorted(unknown)}.")
        kind = raw.get("kind", "set")
        if kind not in _KINDS:
            raise UserError(f"{where}: move {raw.get('name', i)!r} has unknown kind {kind!r}.")
        when = raw.get("when") or {}
        moves.append(Move(
            name=raw["name"], label=raw.get("label", raw["name"]), description=raw.get("description", ""), kind=kind,
            set=dict(raw.get("set") or {}), unset=tuple(raw.get("unset") or ()),
            network_args={k: str(v) for k, v in (raw.get("network_args") or {}).items()},
            key=raw.get("key", ""), values=tuple(raw.get("values") or ()), map=dict(raw.get("map") or {}),
            families=tuple(when.get("families") or ()), facts=dict(when.get("facts") or {}),
            config_when=dict(when.get("config") or {}), speed_cost=float(raw.get("speed_cost", 0.0)),
            speed_note=raw.get("speed_note", ""), quality_cost=int(raw.get("quality_cost", 0)),
            quality_note=raw.get("quality_note", ""), resume_safe=bool(raw.get("resume_safe", True)),
            phases=tuple(raw.get("phases") or ("training",)), roadmap=raw.get("roadmap"),
        ))
    for r in doc.get("relax") or []:
        if r.get("kind") not in _RELAX_KINDS:
            raise UserError(f"{where}: relax {r.get('name')!r} has unknown kind {r.get('kind')!r}.")
        if r.get("ceiling", "target_high") not in ("target_high", "target_low"):
            raise UserError(f"{where}: relax {r.get('name')!r}: ceiling must be target_high or target_low.")
    relaxes = tuple(Relax(name=r["name"], label=r.get("label", r["name"]), kind=r["kind"], key=r.get("key", ""),
                          unset=tuple(r.get("unset") or ()), map=dict(r.get("map") or {}),
                          speed_note=r.get("speed_note", ""), ceiling=r.get("ceiling", "target_high"))
                    for r in doc.get("relax") or [])
    floors = doc.get("floors") or {}
    tune = doc.get("tune") or {}
    swaps = tuple(FileSwap(name=f["name"], key=f["key"], value=str(f["value"]), label=f.get("label", f["name"]),
                           note=f.get("note", ""), families=tuple(f.get("families") or ()),
                           phases=tuple(f.get("phases") or ()),
                           unless_contains=tuple(str(m).lower() for m in f.get("unless_contains") or ()))
                  for f in doc.get("file_swap") or [])
    caution = doc.get("caution") or {}
    return Ladder(tuple(moves), relaxes, int(floors.get("network_dim", 4)), float(tune.get("target_low", 0.75)),
                  float(tune.get("target_high", 0.92)), swaps, float(caution.get("budget_share", 0.95)),
                  float(caution.get("small_card_gb", 6)))


@lru_cache(maxsize=None)
def load_ladder(path: str | None = None) -> Ladder:
    p = Path(path) if path else LADDER_FILE
    try:
        with open(p, "rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        raise UserError(f"Ladder file {p} does not exist.") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"Ladder file {p} is not valid TOML: {exc}.") from None
    return parse_ladder(doc, str(p))


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
        "vae_batch_gt_1": s.vae_batch > 1,
        "te_batch_gt_1": s.te_batch > 1 and s.cache_te,
    }


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
    return not schema.errors_only(schema.validate_config(cfg, family.script, dataset=ds, family=family))


def _move_cost(move: Move, changes: list) -> float:
    cost = move.speed_cost
    if move.kind == "steps" and move.values and move.key == "blocks_to_swap":
        v = next((new for k, _, new in changes if k == move.key), move.values[-1])
        cost = move.speed_cost * float(v) / float(max(move.values))
    return max(cost, 0.0) + move.quality_cost


class _Ctx:
    """Shared state of one fit: the family, dataset, history and the estimator calls."""

    def __init__(self, family: Family, history, gpu_name, bf16: bool, ladder: Ladder):
        self.family = family
        self.history = history
        self.gpu_name = gpu_name
        self.bf16 = bf16
        self.ladder = ladder

    def est(self, cfg, ds) -> Estimate:
        return estimate(cfg, self.family, dataset=ds, history=self.history, gpu_name=self.gpu_name)


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


def fit(config: dict[str, Any], family: Family, budget_gib: float, *, policy: str = "default",
        dataset: dict[str, Any] | None = None, history: list | None = None, gpu_name: str | None = None,
        gpu_gb: float | None = None, bf16: bool = True, ladder: Ladder | None = None) -> FitResult:
    """Apply the fewest, cheapest moves until the estimate is within `budget_gib`."""
    if policy not in POLICIES:
        raise UserError(f"Unknown policy {policy!r}.", f"Choose one of: {', '.join(POLICIES)}.")
    ctx = _Ctx(family, history, gpu_name, bf16, ladder or load_ladder())
    cfg = dict(config)
    ds = copy.deepcopy(dataset) if dataset is not None else None
    before = ctx.est(cfg, ds)
    current = before
    steps: list[Step] = []
    applied: list[Candidate] = []
    used: set[str] = set()
    while current.peak_gib > budget_gib:
        s = resolve(cfg, family, ds)
        f = facts(cfg, family, ds, s, bf16)
        cands = []
        for m in ctx.ladder.moves:
            if m.name in used and m.kind == "set":
                continue
            if not _applies(m, family, cfg, f):
                continue
            # A move must lower the phase that sets the peak.
            if current.peak_phase not in m.phases:
                continue
            c = _best_candidate(ctx, m, cfg, ds, s, current.peak_gib, budget_gib, None)
            if c is not None:
                cands.append(c)
        if not cands:
            break
        c = _choose(cands, current.peak_gib, budget_gib, None, policy)
        reason = (f"peak {current.peak_gib:.2f} GiB ({current.peak_phase}) is over the "
                  f"{budget_gib:.2f} GiB budget")
        steps.append(_step(c, current.peak_gib, None, reason))
        applied.append(c)
        used.add(c.move.name)
        cfg, ds, current = c.config, c.dataset, c.est
    fits = current.peak_gib <= budget_gib
    order = [st.move for st in steps]
    if fits and steps:
        cfg, ds, current, steps = _prune(ctx, config, dataset, steps, budget_gib)
    where = _describe_budget(budget_gib, gpu_gb)
    if fits:
        if steps:
            msg = (f"fits in {where}: {current.peak_gib:.2f} GiB of a {budget_gib:.2f} GiB budget after "
                   f"{len(steps)} change{'s' if len(steps) != 1 else ''}")
        else:
            msg = f"fits in {where} as it is: {current.peak_gib:.2f} GiB of a {budget_gib:.2f} GiB budget"
    else:
        msg = (f"cannot fit in {where}; the smallest config needs {current.peak_gib:.2f} GiB "
               f"({PHASE_WORDS.get(current.peak_phase, current.peak_phase)}) against a budget of {budget_gib:.2f} GiB")
    hints = _hints(cfg, family, current, fits, ctx.ladder)
    offer = None
    if not fits:
        # A file the user can swap comes before any setting: when it is what sets the peak, no
        # smaller rank or resolution helps.
        for swap in ctx.ladder.file_swaps:
            if not swap.applies(config, family, current.peak_phase):
                continue
            alt = fit({**config, swap.key: swap.value}, family, budget_gib, policy=policy, dataset=dataset,
                      history=history, gpu_name=gpu_name, gpu_gb=gpu_gb, bf16=bf16, ladder=ctx.ladder)
            if alt.fits:
                offer = {"key": swap.key, "value": swap.value, "label": swap.label,
                         "peak_gib": round(alt.after.peak_gib, 3)}
                msg += (f" with the {swap.key} file given; {swap.label} ({swap.value}) makes it fit: "
                        f"{alt.after.peak_gib:.2f} GiB")
                break
    return FitResult(config=cfg, dataset=ds, steps=steps, before=before, after=current, fits=fits,
                     budget_gib=budget_gib, message=msg, policy=policy, hints=hints,
                     applied_order=order, offer=offer,
                     cautions=cautions(current.peak_gib, budget_gib, gpu_gb, ctx.ladder) if fits else [])


PHASE_WORDS = {
    "model_load": "while loading the models",
    "cache_latents": "while caching latents",
    "cache_text_encoder": "while caching text-encoder outputs",
    "training": "while training",
    "sampling": "while generating sample images",
    "saving": "while saving",
}


def cautions(peak_gib: float, budget_gib: float, gpu_gb: float | None, ladder: Ladder | None = None) -> list[str]:
    """What a user should hear about a config that fits: a card filled to the brim, or a card
    below the smallest preset class (its plan is a larger card's preset cut down)."""
    lad = ladder or load_ladder()
    out = []
    share = peak_gib / budget_gib if budget_gib > 0 else float("inf")
    if share > lad.caution_share:
        out.append(f"The estimate fills {share:.0%} of the budget ({peak_gib:.2f} of {budget_gib:.2f} GiB): "
                   "almost no room for a larger bucket, the desktop or the estimate's own error. Close other "
                   "programs that use the GPU; `kohya-tuner run` takes the next cheapest change if it runs out.")
    if gpu_gb is not None and gpu_gb < lad.small_card_gb:
        out.append(f"A {gpu_gb:g} GB card is below the smallest preset class ({lad.small_card_gb:g} GB): the plan is "
                   f"the {lad.small_card_gb:g} GB preset cut to a {budget_gib:.2f} GiB budget, so expect slow "
                   "training and little headroom.")
    return out


def _hints(cfg: dict[str, Any], family: Family, e: Estimate, fits: bool, ladder: Ladder | None = None) -> list[str]:
    """What no config key can change but the user can: files, other programs."""
    out = []
    for swap in (ladder or load_ladder()).file_swaps:
        if swap.applies(cfg, family, e.peak_phase) and swap.note:
            out.append(swap.note)
    if not fits:
        out.append("close other programs that use the GPU (a desktop, a browser) or train on a larger card")
    return out


def _replay(ctx: _Ctx, config, dataset, steps: list[Step]):
    cfg, ds = config, dataset
    for st in steps:
        cfg, ds = apply_step(cfg, st, ds)
    return cfg, ds


def _apply_dataset_change(ds: dict[str, Any] | None, path: str, value: Any) -> None:
    if ds is None:
        return
    if path.startswith("general."):
        ds.setdefault("general", {})[path.split(".", 1)[1]] = value
        return
    if path.startswith("datasets["):
        idx = int(path[len("datasets["):path.index("]")])
        key = path.split(".", 1)[1]
        ds["datasets"][idx][key] = value


def _prune(ctx: _Ctx, config, dataset, steps: list[Step], budget: float):
    """Make the greedy result minimal: drop steps the final config does not need (a later,
    bigger move can make an earlier one unnecessary), then back every stepped move (block
    swap, rank, resolution, batch) off to its least aggressive value that still fits."""

    def fits(seq: list[Step]) -> bool:
        cfg, ds = _replay(ctx, config, dataset, seq)
        return _valid(cfg, ds, ctx.family) and ctx.est(cfg, ds).peak_gib <= budget

    kept = list(steps)
    for name in sorted((st.move for st in steps), key=lambda n: -_cost_of(ctx, n)):
        idx = next((i for i, st in enumerate(kept) if st.move == name), None)
        if idx is None:
            continue
        trial = kept[:idx] + kept[idx + 1:]
        if fits(trial):
            kept = trial
    for i, st in enumerate(list(kept)):
        try:
            move = ctx.ladder.move(st.move)
        except KeyError:
            continue
        if move.kind not in ("steps", "rank", "resolution", "batch_to_accumulation"):
            continue
        pre_cfg, pre_ds = _replay(ctx, config, dataset, kept[:i])
        s = resolve(pre_cfg, ctx.family, pre_ds)
        variants = _variants(move, ctx.family, pre_cfg, pre_ds, s, ctx.ladder.rank_floor)
        if move.kind == "batch_to_accumulation":
            variants = list(reversed(variants))  # largest batch first
        for _cfg, _ds, ch in variants:
            if ch == st.changes:
                break
            trial = kept[:i] + [st.model_copy(update={"changes": ch})] + kept[i + 1:]
            if fits(trial):
                kept = trial
                break
    # Re-measure each step in the final sequence: what it changes from, what it saves.
    out: list[Step] = []
    cfg = dict(config)
    ds = copy.deepcopy(dataset) if dataset is not None else None
    prev = ctx.est(cfg, ds).peak_gib
    for st in kept:
        changes = []
        for key, _old, new in st.changes:
            if key.startswith("dataset:"):
                changes.append((key, _old, new))
                _apply_dataset_change(ds, key[len("dataset:"):], new)
                continue
            old = cfg.get(key)
            if old == new:
                continue
            changes.append((key, old, new))
            if new is None:
                cfg.pop(key, None)
            else:
                cfg[key] = new
        now = ctx.est(cfg, ds)
        out.append(st.model_copy(update={"changes": changes, "saved_gib": round(prev - now.peak_gib, 3)}))
        prev = now.peak_gib
    return cfg, ds, ctx.est(cfg, ds), out


def _cost_of(ctx: _Ctx, name: str) -> float:
    try:
        m = ctx.ladder.move(name)
    except KeyError:
        return 0.0
    return max(m.speed_cost, 0.0) + 2 * m.quality_cost


# ---- tune: speed back where the budget allows ---------------------------------------------


def tune(config: dict[str, Any], family: Family, budget_gib: float, *, dataset: dict[str, Any] | None = None,
         history: list | None = None, gpu_name: str | None = None, gpu_gb: float | None = None,
         bf16: bool = True, ladder: Ladder | None = None) -> FitResult:
    """Fit, then remove speed costs (block swap, gradient checkpointing, checkpoint offload,
    8-bit states) as long as the peak stays within the upper target share of the budget."""
    lad = ladder or load_ladder()
    high = lad.tune_high * budget_gib
    # Aim at the upper target first (headroom for a late large bucket); settle for the whole
    # budget when the target cannot be reached.
    result = fit(config, family, high, dataset=dataset, history=history, gpu_name=gpu_name, gpu_gb=gpu_gb,
                 bf16=bf16, ladder=lad)
    if not result.fits:
        result = fit(config, family, budget_gib, dataset=dataset, history=history, gpu_name=gpu_name,
                     gpu_gb=gpu_gb, bf16=bf16, ladder=lad)
    if not result.fits:
        return result
    ctx = _Ctx(family, history, gpu_name, bf16, lad)
    cfg, ds, current = dict(result.config), result.dataset, result.after
    steps = list(result.steps)
    for r in lad.relaxes:
        variants: list[tuple[dict, list]] = []
        if r.kind == "steps_down":
            cur = cfg.get(r.key)
            if not isinstance(cur, int) or isinstance(cur, bool) or cur <= 0:
                continue
            # Fewest swapped blocks first: the fastest config that still fits wins.
            for v in [None] + list(range(1, min(cur, (family.blocks_to_swap_max or 0) + 1))):
                ncfg = dict(cfg)
                ch: list = []
                _set(ncfg, ch, r.key, v)
                variants.append((ncfg, ch))
        elif r.kind == "unset":
            ncfg = dict(cfg)
            ch = []
            for k in r.unset:
                _set(ncfg, ch, k, None)
            if ch:
                variants.append((ncfg, ch))
        elif r.kind == "optimizer_map":
            spec = lookup(cfg.get("optimizer_type"), cfg.get("optimizer_args"),
                          use_8bit_adam=bool(cfg.get("use_8bit_adam"))).spec
            target = r.map.get(spec.name.lower())
            if target:
                ncfg = dict(cfg)
                ch = []
                _set(ncfg, ch, "optimizer_type", target)
                _set(ncfg, ch, "use_8bit_adam", None)
                variants.append((ncfg, ch))
        elif r.kind == "accumulation_to_batch" and not _dataset_any(ds, "batch_size"):
            b = cfg.get("train_batch_size") or 1
            ga = cfg.get("gradient_accumulation_steps") or 1
            if isinstance(b, int) and isinstance(ga, int) and not isinstance(ga, bool) and ga > 1:
                # Largest batch first; batch x accumulation (the effective batch) stays the same.
                for k in sorted((k for k in range(2, ga + 1) if ga % k == 0), reverse=True):
                    ncfg = dict(cfg)
                    ch = []
                    _set(ncfg, ch, "train_batch_size", b * k)
                    _set(ncfg, ch, "gradient_accumulation_steps", ga // k if ga // k > 1 else None)
                    variants.append((ncfg, ch))
        share = lad.tune_low if r.ceiling == "target_low" else lad.tune_high
        for ncfg, ch in variants:
            if not ch or not _valid(ncfg, ds, family):
                continue
            e = ctx.est(ncfg, ds)
            if e.peak_gib <= share * budget_gib:
                steps.append(Step(move=r.name, changes=ch, saved_gib=round(current.peak_gib - e.peak_gib, 3),
                                  speed_cost=r.speed_note, quality_cost="none", resume_safe=True,
                                  reason=f"the budget allows it: {e.peak_gib:.2f} GiB stays within "
                                         f"{share:.0%} of {budget_gib:.2f} GiB"))
                cfg, current = ncfg, e
                break
    share = current.peak_gib / budget_gib if budget_gib > 0 else 0.0
    where = _describe_budget(budget_gib, gpu_gb)
    msg = (f"fits in {where}: {current.peak_gib:.2f} GiB of a {budget_gib:.2f} GiB budget ({share:.0%})")
    if share < lad.tune_low:
        msg += "; the card has room to spare"
    return FitResult(config=cfg, dataset=ds, steps=steps, before=result.before, after=current, fits=True,
                     budget_gib=budget_gib, message=msg, policy="default", hints=result.hints,
                     applied_order=result.applied_order + [st.move for st in steps[len(result.steps):]],
                     cautions=cautions(current.peak_gib, budget_gib, gpu_gb, lad))


# ---- next_step: one move after a real OOM ------------------------------------------------


def next_step(config: dict[str, Any], family: Family, *, phase: str, deficit_gib: float | None,
              policy: str = "default", dataset: dict[str, Any] | None = None, tried: Iterable[str] = frozenset(),
              require_resume_safe: bool = False, history: list | None = None, gpu_name: str | None = None,
              bf16: bool = True, ladder: Ladder | None = None) -> Step | None:
    """The next move for a run that ran out of memory in `phase`, or None at the floor.

    Only moves listed for that phase are considered; moves in `tried` and, with
    `require_resume_safe`, moves a saved state cannot resume across are skipped. When no
    single move saves `deficit_gib`, moves are combined in policy order until they do (or
    nothing is left); the returned Step then lists every change."""
    if policy not in POLICIES:
        raise UserError(f"Unknown policy {policy!r}.", f"Choose one of: {', '.join(POLICIES)}.")
    ctx = _Ctx(family, history, gpu_name, bf16, ladder or load_ladder())
    if phase not in PHASE_WORDS:
        phase = "training"  # a log that cannot place the failure: the training step is the usual culprit
    # A combined step is named "a+b"; each of its moves counts as tried.
    tried = {part for name in tried for part in str(name).split("+") if part}
    cfg = dict(config)
    ds = copy.deepcopy(dataset) if dataset is not None else None
    start = ctx.est(cfg, ds)
    base = _phase_value(start, phase)
    need = max(deficit_gib or 0.0, MIN_SAVING_GIB)
    target = base - need
    chosen: list[Candidate] = []
    current = start
    while True:
        s = resolve(cfg, family, ds)
        f = facts(cfg, family, ds, s, bf16)
        cands = []
        for m in ctx.ladder.moves:
            if phase not in m.phases or m.name in tried or any(c.move.name == m.name for c in chosen):
                continue
            if require_resume_safe and not m.resume_safe:
                continue
            if not _applies(m, family, cfg, f):
                continue
            c = _best_candidate(ctx, m, cfg, ds, s, _phase_value(current, phase), target, phase)
            if c is not None:
                cands.append(c)
        if not cands:
            break
        c = _choose(cands, _phase_value(current, phase), target, phase, policy)
        chosen.append(c)
        cfg, ds, current = c.config, c.dataset, c.est
        if _phase_value(current, phase) <= target:
            break
    if not chosen:
        return None
    changes = [ch for c in chosen for ch in c.changes]
    moves = [c.move for c in chosen]
    saved = base - _phase_value(current, phase)
    reason = (f"out of memory while {phase.replace('_', ' ')}"
              + (f" (about {deficit_gib:.2f} GiB short)" if deficit_gib else "")
              + f"; this saves {saved:.2f} GiB there")
    return Step(move="+".join(m.name for m in moves), changes=changes, saved_gib=round(saved, 3),
                speed_cost="; ".join(m.speed_note for m in moves if m.speed_note),
                quality_cost="; ".join(m.quality_text for m in moves),
                resume_safe=all(m.resume_safe for m in moves), reason=reason, phase=phase)


def apply_step(config: dict[str, Any], step: Step, dataset: dict[str, Any] | None = None
               ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The config (and dataset) with a Step's changes applied; inputs are not modified."""
    cfg = dict(config)
    ds = copy.deepcopy(dataset) if dataset is not None else None
    for key, _old, new in step.changes:
        if key.startswith("dataset:"):
            _apply_dataset_change(ds, key[len("dataset:"):], new)
        elif new is None:
            cfg.pop(key, None)
        else:
            cfg[key] = new
    return cfg, ds


__all__ = ["Move", "Step", "FitResult", "Ladder", "FileSwap", "load_ladder", "parse_ladder", "fit", "tune",
           "next_step", "apply_step", "facts", "cautions", "POLICIES"]
