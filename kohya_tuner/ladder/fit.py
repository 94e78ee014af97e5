"""fit: apply the cheapest moves until the estimate is under the budget; cautions and hints."""

from __future__ import annotations

import copy
from typing import Any

from kohya_tuner.errors import UserError
from kohya_tuner.families import Family
from kohya_tuner.memory import Estimate
from kohya_tuner.memory.setup import resolve

from kohya_tuner.ladder.data import POLICIES, Ladder, load_ladder
from kohya_tuner.ladder.moves import (
    Candidate, facts, FitResult, Step, _applies, _best_candidate, _choose, _Ctx, _describe_budget, _move_cost,
    _step, _valid, _variants,
)


def fit(config: dict[str, Any], family: Family, budget_gib: float, *, policy: str = "default",
        dataset: dict[str, Any] | None = None, history: list | None = None, gpu_name: str | None = None,
        gpu_gb: float | None = None, bf16: bool = True, ladder: Ladder | None = None, cpu: bool = False,
        keep=frozenset(), caches_done: frozenset[str] = frozenset(), driver: str | None = None,
        refit: bool = True, gpus: int = 1) -> FitResult:
    """Apply the fewest, cheapest moves until the estimate is within `budget_gib`.
    With `cpu`, moves a CPU cannot run are left out; a move that changes a key in `keep` (the
    user's own) is taken only when no other move is left. With `refit`, a plan whose pruning
    dropped moves is fitted once more without them, and the cheaper plan is kept."""
    keep = frozenset(keep)
    if policy not in POLICIES:
        raise UserError(f"Unknown policy {policy!r}.", f"Choose one of: {', '.join(POLICIES)}.")
    lad = ladder or load_ladder()
    ctx = _Ctx(family, history, gpu_name, bf16, lad.for_cpu() if cpu else lad, frozenset(caches_done), driver,
               gpus=gpus)
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
        free = [c for c in cands if not {str(k) for k, _o, _n in c.changes} & keep]
        cands = free or cands
        if not cands:
            pair = _enabling_pair(ctx, cfg, ds, f, current, budget_gib, used, keep)
            if pair is None:
                break
            first, second = pair
            steps.append(_step(first, current.peak_gib, None,
                               f"saves nothing alone at the {current.peak_phase} peak, but lets the next change, "
                               f"{second.move.label}, lower it"))
            steps.append(_step(second, first.est.peak_gib, None,
                               f"peak {current.peak_gib:.2f} GiB ({current.peak_phase}) is over the "
                               f"{budget_gib:.2f} GiB budget"))
            applied += [first, second]
            used.update((first.move.name, second.move.name))
            cfg, ds, current = second.config, second.dataset, second.est
            continue
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
        dropped = set(order) - {st.move for st in steps}
        if refit and dropped and policy == "default":
            # A move the final plan does not need may have shut out a cheaper one on the way
            # (accumulation rules out the fused backward pass): fit again without it.
            from dataclasses import replace

            alt = fit(config, family, budget_gib, policy=policy, dataset=dataset, history=history,
                      gpu_name=gpu_name, gpu_gb=gpu_gb, bf16=bf16, keep=keep, caches_done=caches_done,
                      driver=driver, refit=False, gpus=gpus,
                      ladder=replace(ctx.ladder, moves=tuple(m for m in ctx.ladder.moves if m.name not in dropped)))
            if alt.fits and _plan_cost(ctx, alt.steps) < _plan_cost(ctx, steps) - 1e-9:
                cfg, ds, current, steps = alt.config, alt.dataset, alt.after, alt.steps
                order = alt.applied_order
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
    hints = _hints(cfg, family, current, fits, ctx.ladder) + _preview_hint(ctx, config, cfg, ds, steps, budget_gib)
    offer = None
    if not fits:
        # A file the user can swap comes before any setting: when it is what sets the peak, no
        # smaller rank or resolution helps.
        for swap in ctx.ladder.file_swaps:
            if not swap.applies(config, family, current.peak_phase):
                continue
            alt = fit({**config, swap.key: swap.value}, family, budget_gib, policy=policy, dataset=dataset,
                      history=history, gpu_name=gpu_name, gpu_gb=gpu_gb, bf16=bf16, ladder=ctx.ladder,
                      driver=driver, gpus=gpus)
            if alt.fits:
                offer = {"key": swap.key, "value": swap.value, "label": swap.label,
                         "peak_gib": round(alt.after.peak_gib, 3)}
                msg += (f" with the {swap.key} file given; {swap.label} ({swap.value}) makes it fit: "
                        f"{alt.after.peak_gib:.2f} GiB")
                break
    return FitResult(config=cfg, dataset=ds, steps=steps, before=before, after=current, fits=fits,
                     budget_gib=budget_gib, message=msg, policy=policy, hints=hints,
                     applied_order=order, offer=offer,
                     cautions=cautions(current.peak_gib, budget_gib, gpu_gb, ctx.ladder, driver) if fits else [])


def _enabling_pair(ctx: _Ctx, cfg, ds, f, current: Estimate, target: float, used: set[str],
                   keep: frozenset[str]) -> tuple[Candidate, Candidate] | None:
    """Two moves that lower the peak together where no single move does: a switch that frees
    nothing alone but lets another move work. Lumina 2 with its text encoder trained keeps Gemma-2
    on the card whether or not the captions are cached, and stopping the training frees nothing
    while the cache is off: only both together take Gemma-2 off. Only switches (kind "set", one
    variant) lead a pair, which keeps the search to a few hundred estimates; it runs only when the
    greedy loop is stuck."""
    s = resolve(cfg, ctx.family, ds)
    best: tuple[tuple, Candidate, Candidate] | None = None
    for m1 in ctx.ladder.moves:
        if m1.kind != "set" or m1.name in used or not _applies(m1, ctx.family, cfg, f):
            continue
        for cfg1, ds1, ch1 in _variants(m1, ctx.family, cfg, ds, s, ctx.ladder.rank_floor):
            if not _valid(cfg1, ds1, ctx.family):
                continue
            e1 = ctx.est(cfg1, ds1)
            if e1.peak_gib > current.peak_gib + 1e-9:
                continue
            first = Candidate(m1, cfg1, ds1, ch1, e1, _move_cost(m1, ch1))
            s1 = resolve(cfg1, ctx.family, ds1)
            f1 = facts(cfg1, ctx.family, ds1, s1, ctx.bf16)
            for m2 in ctx.ladder.moves:
                if m2.name == m1.name or (m2.name in used and m2.kind == "set"):
                    continue
                if not _applies(m2, ctx.family, cfg1, f1) or e1.peak_phase not in m2.phases:
                    continue
                second = _best_candidate(ctx, m2, cfg1, ds1, s1, current.peak_gib, target, None)
                if second is None:
                    continue
                touched = {str(k) for c in (first, second) for k, _o, _n in c.changes}
                saving = current.peak_gib - second.est.peak_gib
                cost = first.cost + second.cost
                # The user's own keys last, then quality-keeping pairs, then GiB per unit of cost.
                rank = (bool(touched & keep), max(m1.quality_cost, m2.quality_cost) > 0,
                        second.est.peak_gib > target, -saving / (0.05 + max(cost, 0.0)))
                if best is None or rank < best[0]:
                    best = (rank, first, second)
    return None if best is None else (best[1], best[2])


PHASE_WORDS = {
    "model_load": "while loading the models",
    "cache_latents": "while caching latents",
    "cache_text_encoder": "while caching text-encoder outputs",
    "training": "while training",
    "sampling": "while generating sample images",
    "saving": "while saving",
}


def card_share(peak_gib: float, budget_gib: float, driver: str | None = None) -> float:
    """How full the card is: what the run holds on it (the allocator's peak and the fixed CUDA
    context, as a monitor counts it) over what the budget leaves the run on it."""
    from kohya_tuner.memory.monitor import context_gib

    ctx = context_gib(driver)
    return (peak_gib + ctx) / (budget_gib + ctx) if budget_gib > 0 else float("inf")


def cautions(peak_gib: float, budget_gib: float, gpu_gb: float | None, ladder: Ladder | None = None,
             driver: str | None = None) -> list[str]:
    """What a user should hear about a config that fits: a card filled to the brim, or a card
    below the smallest preset class (its plan is a larger card's preset cut down)."""
    lad = ladder or load_ladder()
    out = []
    share = card_share(peak_gib, budget_gib, driver)
    if share > lad.caution_share:
        out.append(f"The estimate fills {share:.0%} of the card ({peak_gib:.2f} of a {budget_gib:.2f} GiB budget, "
                   f"the CUDA context aside): "
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


def _preview_hint(ctx: _Ctx, config, cfg, ds, steps: list[Step], budget: float) -> list[str]:
    """Where the fit turned sampling off in a config whose prompt file it cannot rewrite (the
    user's own), the preview size that would have kept it on, if one fits."""
    from kohya_tuner.memory.setup import SAMPLE_SIZE_KEY

    if cfg.get(SAMPLE_SIZE_KEY) or not any(st.move == "sample_less" for st in steps):
        return []
    try:
        move = ctx.ladder.move("sample_smaller")
    except KeyError:
        return []
    keys = ("sample_every_n_steps", "sample_every_n_epochs", "sample_at_first")
    back = {**cfg, **{k: config[k] for k in keys if k in config}}
    for ncfg, nds, _ch in _variants(move, ctx.family, back, ds, resolve(back, ctx.family, ds), 0):
        est = ctx.est(ncfg, nds)
        if est.peak_gib <= budget:
            size = str(ncfg[SAMPLE_SIZE_KEY])
            w, h = size.split("x")
            return [f"previews at {size} (--w {w} --h {h} on each line of {config.get('sample_prompts')}) would keep "
                    f"sampling on: {est.peak_gib:.2f} GiB fits"]
    return []


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
        if move.kind not in ("steps", "rank", "resolution", "batch_to_accumulation", "sample_size"):
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


def _plan_cost(ctx: _Ctx, steps: list[Step]) -> float:
    return sum(_cost_of(ctx, st.move) for st in steps)


def _cost_of(ctx: _Ctx, name: str) -> float:
    try:
        m = ctx.ladder.move(name)
    except KeyError:
        return 0.0
    return max(m.speed_cost, 0.0) + 2 * m.quality_cost


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
