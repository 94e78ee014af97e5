"""tune gives speed back where the budget allows; next_step picks one move after a real OOM."""

from __future__ import annotations

import copy
from typing import Any, Iterable

from kohya_tuner.errors import UserError
from kohya_tuner.families import Family
from kohya_tuner.memory.setup import resolve
from kohya_tuner.optimizers import lookup

from kohya_tuner.ladder.data import POLICIES, MIN_SAVING_GIB, STEPPED_KINDS, Ladder, load_ladder
from kohya_tuner.ladder.moves import (
    Candidate, facts, FitResult, Step, _applies, _best_candidate, _choose, _Ctx, _dataset_any,
    _describe_budget, _phase_value, _set, _valid,
)
from kohya_tuner.ladder.fit import PHASE_WORDS, card_share, cautions, fit
from kohya_tuner.memory.monitor import context_gib


# ---- tune: speed back where the budget allows ---------------------------------------------


def tune(config: dict[str, Any], family: Family, budget_gib: float, *, dataset: dict[str, Any] | None = None,
         history: list | None = None, gpu_name: str | None = None, gpu_gb: float | None = None,
         bf16: bool = True, ladder: Ladder | None = None, cpu: bool = False,
         keep: Iterable[str] = frozenset(), driver: str | None = None, gpus: int = 1) -> FitResult:
    """Fit, then remove speed costs (block swap, gradient checkpointing, checkpoint offload,
    8-bit states) as long as the peak stays within the upper target share of the budget.
    Keys in `keep` (the user's own) are never relaxed, and the fit moves them last."""
    keep = frozenset(keep)
    lad = ladder or load_ladder()
    if cpu:
        lad = lad.for_cpu()
    # The target shares are of the card (the allocator's budget and the fixed CUDA context): the
    # peak that fills `share` of it.
    ctx_gib = context_gib(driver)

    def ceiling(share: float) -> float:
        return share * (budget_gib + ctx_gib) - ctx_gib

    high = ceiling(lad.tune_high)
    # Aim at the upper target first (headroom for a late large bucket); settle for the whole
    # budget when the target cannot be reached.
    result = fit(config, family, high, dataset=dataset, history=history, gpu_name=gpu_name, gpu_gb=gpu_gb,
                 bf16=bf16, ladder=lad, keep=keep, driver=driver, gpus=gpus)
    if not result.fits:
        result = fit(config, family, budget_gib, dataset=dataset, history=history, gpu_name=gpu_name,
                     gpu_gb=gpu_gb, bf16=bf16, ladder=lad, keep=keep, driver=driver, gpus=gpus)
    if not result.fits:
        return result
    ctx = _Ctx(family, history, gpu_name, bf16, lad, driver=driver, gpus=gpus)
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
            if keep and {str(c[0]) for c in ch} & keep:
                continue
            if not ch or not _valid(ncfg, ds, family):
                continue
            e = ctx.est(ncfg, ds)
            if e.peak_gib <= ceiling(share):
                steps.append(Step(move=r.name, changes=ch, saved_gib=round(current.peak_gib - e.peak_gib, 3),
                                  speed_cost=r.speed_note, quality_cost="none", resume_safe=True,
                                  reason=f"the budget allows it: {e.peak_gib:.2f} GiB stays within "
                                         f"{ceiling(share):.2f} GiB ({share:.0%} of the card, the CUDA "
                                         f"context included)"))
                cfg, current = ncfg, e
                break
    share = card_share(current.peak_gib, budget_gib, driver) if budget_gib > 0 else 0.0
    where = _describe_budget(budget_gib, gpu_gb)
    msg = (f"fits in {where}: {current.peak_gib:.2f} GiB of a {budget_gib:.2f} GiB budget ({share:.0%})")
    if share < lad.tune_low:
        msg += "; the card has room to spare"
    return FitResult(config=cfg, dataset=ds, steps=steps, before=result.before, after=current, fits=True,
                     budget_gib=budget_gib, message=msg, policy="default", hints=result.hints,
                     applied_order=result.applied_order + [st.move for st in steps[len(result.steps):]],
                     cautions=cautions(current.peak_gib, budget_gib, gpu_gb, lad, driver))


# ---- next_step: one move after a real OOM ------------------------------------------------


def next_step(config: dict[str, Any], family: Family, *, phase: str, deficit_gib: float | None,
              policy: str = "default", dataset: dict[str, Any] | None = None, tried: Iterable[str] = frozenset(),
              require_resume_safe: bool = False, history: list | None = None, gpu_name: str | None = None,
              bf16: bool = True, ladder: Ladder | None = None, cpu: bool = False,
              keep: Iterable[str] = frozenset(), one_at_a_time: bool = False,
              only: Iterable[str] | None = None, never_keep: bool = False, gpus: int = 1) -> Step | None:
    """The next move for a run that ran out of memory in `phase`, or None at the floor.

    Only moves listed for that phase are considered; moves in `tried` (but a stepped move, whose
    next value is still open: blocks_to_swap 8 that fell short goes on to 16) and, with
    `require_resume_safe`, moves a saved state cannot resume across are skipped; with `cpu`,
    moves a CPU cannot run. When no single move saves `deficit_gib`, moves are combined in
    policy order until they do (or nothing is left); the returned Step then lists every
    change. `one_at_a_time` never combines (the estimate has already been wrong once).
    A move that changes a key in `keep` (the user's own settings) is taken only when no other
    move is left, and the Step's note says so. `only`: consider these moves alone (a phase
    rule's next move). `never_keep`: moves that change a key in `keep` are not taken at all (the
    step may then save less than `deficit_gib`)."""
    if policy not in POLICIES:
        raise UserError(f"Unknown policy {policy!r}.", f"Choose one of: {', '.join(POLICIES)}.")
    lad = ladder or load_ladder()
    ctx = _Ctx(family, history, gpu_name, bf16, lad.for_cpu() if cpu else lad, gpus=gpus)
    if phase not in PHASE_WORDS:
        phase = "training"  # a log that cannot place the failure: the training step is the usual culprit
    # A combined step is named "a+b"; each of its moves counts as tried.
    tried = {part for name in tried for part in str(name).split("+") if part}
    keep = frozenset(keep)
    only = frozenset(only) if only is not None else None
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
            if phase not in m.phases or any(c.move.name == m.name for c in chosen):
                continue
            if m.name in tried and m.kind not in STEPPED_KINDS:
                continue
            if only is not None and m.name not in only:
                continue
            if require_resume_safe and not m.resume_safe:
                continue
            if not _applies(m, family, cfg, f):
                continue
            c = _best_candidate(ctx, m, cfg, ds, s, _phase_value(current, phase), target, phase)
            if c is not None:
                cands.append(c)
        # The user's own keys only when nothing else is left.
        free = [c for c in cands if not _touches(c, keep)]
        cands = free or ([] if never_keep else cands)
        if not cands:
            break
        c = _choose(cands, _phase_value(current, phase), target, phase, policy)
        chosen.append(c)
        cfg, ds, current = c.config, c.dataset, c.est
        if _phase_value(current, phase) <= target or one_at_a_time:
            break
    if not chosen:
        return None
    changes = [ch for c in chosen for ch in c.changes]
    moves = [c.move for c in chosen]
    saved = base - _phase_value(current, phase)
    reason = (f"out of memory while {phase.replace('_', ' ')}"
              + (f" (about {deficit_gib:.2f} GiB short)" if deficit_gib else "")
              + f"; this saves {saved:.2f} GiB there")
    notes = []
    yours = sorted({k for c in chosen for k in _touched(c) if k in keep})
    if yours:
        notes.append(f"changes {', '.join(yours)}, which you set yourself: no other move is left for this phase")
    if one_at_a_time:
        notes.append("one move at a time: the estimate already said an earlier move would be enough")
    return Step(move="+".join(m.name for m in moves), changes=changes, saved_gib=round(saved, 3),
                speed_cost="; ".join(m.speed_note for m in moves if m.speed_note),
                quality_cost="; ".join(m.quality_text for m in moves),
                resume_safe=all(m.resume_safe for m in moves), reason=reason, phase=phase, note="; ".join(notes))


def _touched(c: Candidate) -> set[str]:
    """The config keys a candidate changes (a dataset-file key counts as the key it sets)."""
    return {str(k).rsplit(".", 1)[-1] if str(k).startswith("dataset:") else str(k) for k, _o, _n in c.changes}


def _touches(c: Candidate, keep: frozenset[str]) -> bool:
    return bool(keep) and bool(_touched(c) & keep)
