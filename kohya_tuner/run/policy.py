"""What to do after an attempt: the pure `decide()` and its helpers.

From the diagnosis of one attempt, its config and what the run knows so far, `decide()`
returns `Retry(config, resume_from, changes, reason)` or `Stop(reason)`. Only an
out-of-memory failure (GPU or host RAM) is retried; anything else stops with its
diagnosis, because retrying a wrong path or a broken install with less memory only
wastes the user's time. Nothing here touches files or processes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from kohya_tuner.families import Family
from kohya_tuner.run.journal import Change, StateRecord

# Settings a state directory pins (loading fails or silently disagrees if they change):
# the network's shape and parameter groups, the optimizer's state format, the fp16 scaler.
RESUME_PINNED = frozenset({
    "network_module", "network_dim", "network_alpha", "network_args", "network_train_unet_only",
    "network_train_text_encoder_only", "optimizer_type", "use_8bit_adam", "use_lion_optimizer", "dim_from_weights",
    "conv_dim", "conv_alpha", "loraplus_lr_ratio", "loraplus_unet_lr_ratio", "loraplus_text_encoder_lr_ratio",
})
# Pinned keys whose change keeps the LoRA's shape: the optimizer and the precision it steps in.
# A state cannot follow them, but its LoRA weights can (`network_weights`, a fresh optimizer).
WEIGHTS_CARRY = frozenset({
    "optimizer_type", "optimizer_args", "use_8bit_adam", "use_lion_optimizer", "loraplus_lr_ratio",
    "loraplus_unet_lr_ratio", "loraplus_text_encoder_lr_ratio", "mixed_precision", "full_bf16", "full_fp16",
})
# How a change of the previews' size is shown (it goes into a copy of the prompt file).
PREVIEW_SIZE_LABEL = "previews (--w/--h)"
# Keys the supervisor owns on every attempt.
BOOKKEEPING = ("resume", "skip_until_initial_step", "initial_step")

DEFAULT_MAX_ATTEMPTS = 6
# When a move's estimate said "fits" and the same phase runs out again, the shortfall the
# message reports is one allocation at one moment of a run whose memory is still growing
# (fragmentation, a larger bucket later): the next move is asked to cover this much more, so
# a tiny shortfall hours in does not take one more attempt for the next tiny one
# (benchmarks/retry_policy.py: the most attempts of a finished scenario 4 -> 3).
REPEAT_MARGIN_GIB = 0.25
DEFAULT_HANG_MINUTES = 30.0



# ---- values -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Retry:
    config: dict[str, Any]
    resume_from: str | None
    changes: list[Change]
    reason: str
    move: str | None = None
    start_step: int = 0
    # Why it restarts from step 0 although states exist, or why it resumes.
    note: str | None = None
    # The dataset config when a move changed it (None: unchanged).
    dataset: dict[str, Any] | None = None
    # The LoRA weights it continues from with a fresh optimizer (a move the state cannot
    # follow, such as another optimizer); start_step is then the step of those weights.
    weights_from: str | None = None
    # Smaller previews ("512x512", the largest): the loop writes a copy of the prompt file
    # with them and points sample_prompts at it.
    sample_size: str | None = None


@dataclass(frozen=True)
class Stop:
    reason: str
    status: str = "failed"  # success, failed, interrupted
    advice: tuple[str, ...] = ()
    # False when continuing would only stop again (the ladder's floor).
    can_continue: bool = True


_DISK_FULL = re.compile(r"No space left on device|\[Errno 28\]|Disk quota exceeded|\[Errno 122\]")


@dataclass
class AttemptFacts:
    """What the loop observed about one attempt, beside the log diagnosis."""

    exit_status: int | None
    end_step: int = 0
    hung: bool = False
    interrupted: bool = False
    killed: bool = False  # SIGKILL without traceback: the kernel's OOM killer (host RAM)
    final_model: str | None = None
    hang_minutes: float | None = None
    # Supervision itself failed (the log could not be written): the trainer was stopped.
    failure: str | None = None
    # The absolute step at which the trainer's progress showed a loss that is not a number
    # (NaN or infinite); the supervisor stopped the trainer there.
    nan_loss_step: int | None = None


@dataclass
class RunState:
    """What `decide` may know about the run beyond the last attempt (all plain data)."""

    attempt: int  # number of the attempt just finished
    attempts_left: int  # how many more may be launched
    total_steps: int
    plan_config: dict[str, Any]
    tried: frozenset[str] = frozenset()
    newest_state: StateRecord | None = None
    probe: bool = False
    policy: str = "default"
    # A CPU run (--cpu): the ladder offers only what a CPU can run.
    cpu: bool = False
    # Keys the user set (--set, their --preset file): moved only when nothing else is left.
    user_keys: frozenset[str] = frozenset()
    # The phase the move that started this attempt answered; the same phase failing again
    # means the estimate was wrong, so the next move comes alone.
    last_move_phase: str | None = None
    # The LoRA weights the current lineage started from (a continuation with a fresh
    # optimizer), as path and absolute step: what is left when it has no state of its own.
    weights: StateRecord | None = None
    # With several processes (DDP) a state holds the wrapper's weights; loading them as
    # `network_weights` is unverified, so no continuation from weights then.
    processes: int = 1
    # The largest preview of the prompt file ("1024x1024") when kohya-tuner can write a copy of
    # it with smaller ones (prompts.resizable_size); None: the previews cannot be resized.
    sample_size: str | None = None


# ---- pure helpers ---------------------------------------------------------------------------


def diff_configs(old: Mapping[str, Any], new: Mapping[str, Any], ignore=BOOKKEEPING) -> list[Change]:
    keys = sorted(set(old) | set(new))
    return [Change(k, old.get(k), new.get(k)) for k in keys if k not in ignore and old.get(k) != new.get(k)]


def apply_changes(config: Mapping[str, Any], changes) -> dict[str, Any]:
    out = dict(config)
    for key, _old, new in changes:
        if new is None:
            out.pop(key, None)
        else:
            out[key] = new
    return out


def effective_batch(config: Mapping[str, Any]) -> int:
    return int(config.get("train_batch_size") or 1) * int(config.get("gradient_accumulation_steps") or 1)


def keep_effective_batch(config: dict[str, Any], target: int) -> tuple[dict[str, Any], str | None]:
    """Raise gradient accumulation after a batch cut so each optimizer step still sees
    `target` images: the plan's step count and learning rate stay meaningful."""
    batch = int(config.get("train_batch_size") or 1)
    if effective_batch(config) == target:
        return config, None
    if target % batch:
        return config, (f"effective batch {target} is not a multiple of batch {batch}; "
                        f"it is {effective_batch(config)} now")
    if config.get("fused_backward_pass"):
        return config, "fused_backward_pass needs gradient accumulation 1; the effective batch shrinks"
    out = dict(config)
    accum = target // batch
    if accum == 1:
        out.pop("gradient_accumulation_steps", None)
    else:
        out["gradient_accumulation_steps"] = accum
    return out, None


def resume_unsafe(changes) -> list[str]:
    """Changed keys a saved state cannot follow."""
    bad = []
    for c in changes:
        key, old, new = (c.key, c.old, c.new) if isinstance(c, Change) else c
        if key in RESUME_PINNED:
            bad.append(key)
        elif key == "mixed_precision" and new == "fp16" and old != "fp16":
            bad.append(key)  # the state has no fp16 grad-scaler to load
    return bad


def ram_changes(config: Mapping[str, Any], family: Family, tried: frozenset[str]) -> tuple[str, list, str] | None:
    """The next host-RAM move: (name, changes, why), cheapest first."""
    workers = config.get("max_data_loader_n_workers")
    if "ram_workers" not in tried and (workers is None or workers > 0):
        return ("ram_workers", [("max_data_loader_n_workers", workers, 0),
                                ("persistent_data_loader_workers", config.get("persistent_data_loader_workers"), None)],
                "each data-loader worker is a copy of the Python process; load in the main process instead")
    if "ram_disk_caches" not in tried:
        ch = []
        if config.get("cache_latents") and not config.get("cache_latents_to_disk"):
            ch.append(("cache_latents_to_disk", config.get("cache_latents_to_disk"), True))
        if family.has_te_cache and config.get("cache_text_encoder_outputs") and not config.get(
                "cache_text_encoder_outputs_to_disk"):
            ch.append(("cache_text_encoder_outputs_to_disk", None, True))
        if ch:
            return ("ram_disk_caches", ch, "caches on disk instead of in RAM")
    if "ram_lowram" not in tried and not config.get("lowram"):
        return ("ram_lowram", [("lowram", config.get("lowram"), True)],
                "load the models straight onto the GPU instead of staging them in RAM")
    return None


def deficit_gib(oom: Any) -> float | None:
    """How much more the failed allocation needed than the card had free."""
    if oom is None:
        return None
    tried = _get(oom, "tried_gib")
    free = _get(oom, "free_gib")
    if tried is None:
        return None
    return max(0.0, float(tried) - float(free or 0.0))


def _get(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _step_changes(step: Any) -> list[tuple[str, Any, Any]]:
    return [tuple(c) if not isinstance(c, Change) else (c.key, c.old, c.new) for c in _get(step, "changes") or []]


def _moves_yours(step: Any, keys: frozenset[str]) -> bool:
    return bool(keys) and any(str(k).rsplit(".", 1)[-1] in keys for k, _o, _n in _step_changes(step))


_PHASE_WORDS = {
    "model_load": "loading the model", "cache_latents": "caching latents",
    "cache_text_encoder": "caching text-encoder outputs", "first_step": "the first step", "training": "training",
    "sampling": "sampling", "saving": "saving",
}


def phase_words(phase: str | None) -> str:
    """" while loading the model" and the like; empty when the phase is unknown."""
    if not phase or phase == "unknown":
        return ""
    words = _PHASE_WORDS.get(str(phase), str(phase).replace("_", " "))
    return f" during {words}" if phase == "first_step" else f" while {words}"


def _when(step: int, where: str = "") -> str:
    """" after step N", " before the first step", or nothing where `where` already says the first step."""
    if step:
        return f" after step {step}"
    return "" if "first step" in where else " before the first step"


def ladder_phase(phase: str | None) -> str:
    """The ladder knows the phases of a run; the log reader also says "first_step" (the
    first optimizer step, which is training) and "unknown"."""
    if not phase or phase in ("first_step", "unknown"):
        return "training"
    return str(phase)


def decide(diagnosis: Any, config: Mapping[str, Any], family: Family, state: RunState, facts: AttemptFacts, *,
           dataset: Mapping[str, Any] | None = None, next_step: Callable[..., Any] | None = None) -> Retry | Stop:
    """What to do after an attempt ended. Pure: everything it needs comes in as values.

    `next_step` is the memory ladder's `next_step` (injectable for tests)."""
    outcome = _get(diagnosis, "outcome")
    phase = _get(diagnosis, "phase")
    error_kind = _get(_get(diagnosis, "error"), "kind")
    if facts.failure:
        return Stop(f"{facts.failure}; the saved states are kept",
                    advice=("Free some space (or fix the folder), then `kohya-tuner run --continue` resumes from "
                            "the newest state.",))
    if facts.interrupted:
        return Stop("interrupted; the saved states are kept", status="interrupted")
    if facts.nan_loss_step is not None:
        return Stop(nan_reason(facts.nan_loss_step), advice=nan_advice(config, family), can_continue=False)
    if facts.exit_status == 0 and facts.final_model and Path(facts.final_model).name:
        if state.probe:
            return Retry(config=dict(config), resume_from=None, changes=[],
                         reason=f"the {state.total_steps}-step probe fit; starting the full run", move=None,
                         start_step=0)
        return Stop("training finished", status="success")
    if facts.exit_status == 0:
        error = _get(diagnosis, "error") or {}
        why = _get(error, "message") or "no final model file was written"
        return Stop(f"the trainer exited normally but wrote no final model: {why}",
                    advice=tuple(_get(diagnosis, "advice") or ()))
    if facts.hung:
        return Stop(f"the trainer printed nothing for {facts.hang_minutes or DEFAULT_HANG_MINUTES:g} minutes "
                    f"(hang at step {facts.end_step}); it was stopped", advice=(hang_advice(config, state.processes),))
    ram = facts.killed or outcome == "cpu_oom" or error_kind in ("cpu_oom", "killed")
    if outcome != "oom" and not ram:
        error = _get(diagnosis, "error") or {}
        kind = _get(error, "kind") or "error"
        message = _get(error, "message") or f"exit status {facts.exit_status}"
        if _DISK_FULL.search(message):
            # Not the settings' fault and not retried blindly: once there is room the
            # run picks up from its newest state.
            return Stop(f"the disk is full: the trainer could not write ({message}); the saved states are kept",
                        advice=("Free some space on the --out disk, then `kohya-tuner run --continue` resumes "
                                "from the newest state.",))
        what = "an error" if kind in ("other", "error") else f"an error ({kind})"
        return Stop(f"the trainer failed with {what}, not out of memory: {message}; "
                    "this is not retried", advice=tuple(_get(diagnosis, "advice") or ()))
    if state.attempts_left <= 0:
        what = "host RAM ran out" if ram else "out of memory"
        return Stop(f"{what} again and no attempts are left (--max-attempts); every attempt is in the report")

    resumable = state.newest_state is not None and not state.probe
    target_batch = effective_batch(state.plan_config)

    if ram:
        move = ram_changes(config, family, state.tried)
        if move is None:
            return Stop("host RAM ran out (the process was killed with signal 9) and no RAM-saving setting is left",
                        advice=("Close other programs, add swap, or train on a machine with more RAM.",))
        name, changes, why = move
        return _retry(config, changes, name, f"host RAM ran out{_when(facts.end_step)}: {why}", state,
                      resume_ok=True, target_batch=target_batch, end_step=facts.end_step)

    if next_step is None:
        from kohya_tuner import ladder

        next_step = ladder.next_step
    need = deficit_gib(_get(diagnosis, "oom"))
    where = phase_words(phase)
    lphase = ladder_phase(phase)
    step = None
    again = state.last_move_phase is not None and ladder_phase(state.last_move_phase) == lphase
    short = need
    if again and need is not None:
        need += REPEAT_MARGIN_GIB
    extra = dict(cpu=state.cpu, keep=state.user_keys, one_at_a_time=again, gpus=state.processes)
    first = _phase_first(lphase, config, family, state, next_step, need, dataset, extra)
    if first is not None:
        name, step = first
        why = _PHASE_FIRST_WHY.get(name, "")
        return _retry(config, _step_changes(step), name, f"out of memory{where}{_when(facts.end_step, where)}: {why}",
                      state, resume_ok=bool(_get(step, "resume_safe")), target_batch=target_batch,
                      dataset=dataset, end_step=facts.end_step, step_note=_get(step, "note") or None)
    if resumable:
        step = next_step(dict(config), family, phase=lphase, deficit_gib=need, policy=state.policy,
                         dataset=dataset, tried=set(state.tried), require_resume_safe=True, **extra)
        if step is not None and resume_unsafe(_step_changes(step)):
            step = None
    near_note = None
    if step is None or _moves_yours(step, state.user_keys):
        # A move that restarts comes before a change to a key the user set.
        other = next_step(dict(config), family, phase=lphase, deficit_gib=need, policy=state.policy,
                          dataset=dataset, tried=set(state.tried), require_resume_safe=False, **extra)
        near = _near_resume(config, family, lphase, need, state, next_step, dataset, extra) \
            if resumable and (other is None or resume_unsafe(_step_changes(other))) else None
        if near is not None:
            # The shortfall is within the estimate's error of what the state-keeping moves save: a
            # restart would throw the trained steps away on the strength of a few MiB of estimate.
            step = near
            near_note = (f"keeps the saved state: it saves {_get(near, 'saved_gib'):.2f} GiB by the estimate against "
                         f"{need:.2f} GiB short, within the estimate's error ({REPEAT_MARGIN_GIB:g} GiB), while the "
                         "move that covers it all cannot resume; if it runs out again, the next move follows")
        elif other is not None and (step is None or not _moves_yours(other, state.user_keys)):
            step = other
    if step is None:
        return Stop(f"out of memory{where}{_when(facts.end_step, where)}, and the memory ladder has no cheaper setting "
                    "left for this model (its floor is reached)",
                    advice=(_FLOOR_ADVICE.get(lphase, _FLOOR_ADVICE["training"]),), can_continue=False)
    changes = _step_changes(step)
    figures = f", {short:.2f} GiB short" if short else ""
    saved = _get(step, "saved_gib")
    what = str(_get(step, "move")).replace("+", " + ")
    gain = f", which saves about {saved:.2f} GiB by the estimate" if isinstance(saved, (int, float)) and saved > 0 else ""
    reason = f"out of memory{where}{_when(facts.end_step, where)}{figures}: {what}{gain}"
    safe = bool(_get(step, "resume_safe")) and not resume_unsafe(changes)
    why = _join(_get(step, "note") or None, near_note) or ""
    if again:
        why = why.replace("the estimate already said an earlier move would be enough",
                          f"the estimate said the last move would be enough, and it ran out of memory{where} again")
        if short is not None:
            why = _join(why or None, f"asked to cover {REPEAT_MARGIN_GIB:g} GiB more than the {short:.2f} GiB "
                                     "shortfall, since the memory kept growing after the estimate")
    return _retry(config, changes, str(_get(step, "move")), reason, state, resume_ok=safe,
                  target_batch=target_batch, dataset=dataset, end_step=facts.end_step, step_note=why or None)


def _near_resume(config: Mapping[str, Any], family: Family, phase: str, need: float | None, state: RunState,
                 next_step, dataset, extra: dict[str, Any]):
    """The state-keeping step that leaves the user's keys alone, when it falls short of `need` by
    less than REPEAT_MARGIN_GIB; None otherwise (or without a shortfall figure)."""
    if need is None:
        return None
    near = next_step(dict(config), family, phase=phase, deficit_gib=need, policy=state.policy, dataset=dataset,
                     tried=set(state.tried), require_resume_safe=True, never_keep=True, **extra)
    if near is None or resume_unsafe(_step_changes(near)) or _moves_yours(near, state.user_keys):
        return None
    saved = _get(near, "saved_gib")
    if not isinstance(saved, (int, float)) or saved <= 0 or need - saved >= REPEAT_MARGIN_GIB:
        return None
    return near


# Why a phase rule's move answers the phase, for the attempt's reason.
_PHASE_FIRST_WHY = {
    "sample_smaller": "the previews are drawn smaller for the rest of the run (training itself fit)",
    "sample_less": "sampling is off for the rest of the run (training itself fit); make previews after training",
}


def _phase_first(phase: str, config: Mapping[str, Any], family: Family, state: RunState, next_step,
                 need: float | None, dataset, extra: dict[str, Any]):
    """The first move of the phase's rule (ladder data, [[phase_rule]]) that applies and was not
    tried, as (name, step); None when the rule has none left."""
    from kohya_tuner.ladder import load_ladder
    from kohya_tuner.memory.setup import SAMPLE_SIZE_KEY

    cfg = dict(config)
    if state.sample_size:
        cfg[SAMPLE_SIZE_KEY] = state.sample_size  # the previews are ours to resize (a copy of the file)
    for name in load_ladder().phase_first.get(phase, ()):
        if name in state.tried:
            continue
        step = next_step(cfg, family, phase=phase, deficit_gib=need, policy=state.policy, dataset=dataset,
                         tried=set(state.tried), require_resume_safe=False, only=frozenset({name}), **extra)
        if step is not None:
            return name, step
    return None


def _retry(config: Mapping[str, Any], changes, move: str, reason: str, state: RunState, *, resume_ok: bool,
           target_batch: int, dataset: Mapping[str, Any] | None = None, end_step: int = 0,
           step_note: str | None = None) -> Retry:
    from kohya_tuner.memory.setup import SAMPLE_SIZE_KEY

    ds_changes = [c for c in changes if str(c[0]).startswith("dataset:")]
    size_changes = [c for c in changes if c[0] == SAMPLE_SIZE_KEY]
    changes = [c for c in changes if not str(c[0]).startswith("dataset:") and c[0] != SAMPLE_SIZE_KEY]
    new_dataset = None
    if ds_changes and dataset is not None:
        from kohya_tuner.ladder import apply_step

        _, new_dataset = apply_step({}, _Changes(ds_changes), dict(dataset))
    new = apply_changes(config, changes)
    note = step_note
    if "train_batch_size" in {c[0] for c in changes} and "gradient_accumulation_steps" not in {c[0] for c in changes}:
        new, why = keep_effective_batch(new, target_batch)
        note = _join(note, why) if why else note
    new = {k: v for k, v in new.items() if k not in BOOKKEEPING}
    all_changes = diff_configs(config, new)
    resume_from = None
    weights_from = None
    start = 0
    if state.probe:
        pass
    elif (state.newest_state is None and state.weights is not None and state.processes <= 1
          and _keeps_shape(new, all_changes)):
        weights_from = state.weights.path
        start = state.weights.step
        note = _join(note, f"no state saved since it continued from the LoRA weights of step {start}, so it "
                           "continues from them again with a fresh optimizer" + _redone(start, end_step))
    elif state.newest_state is None:
        note = _join(note, "no saved state yet, so it starts from step 0" + _redone(0, end_step))
    elif (not resume_ok or resume_unsafe(all_changes)) and state.processes <= 1 and weights_carry(new, all_changes):
        keys = ", ".join(resume_unsafe(all_changes)) or "the optimizer"
        weights_from = str(Path(state.newest_state.path) / "model.safetensors")
        start = state.newest_state.step
        note = _join(note, f"continues from the LoRA weights of the state at step {start} with a fresh optimizer "
                           f"({keys} changed, which the optimizer's saved state cannot follow)"
                           + _redone(start, end_step))
    elif not resume_ok or resume_unsafe(all_changes):
        keys = ", ".join(resume_unsafe(all_changes)) or "a setting the saved state depends on"
        note = _join(note, f"restarts from step 0: {keys} changed, which a saved state cannot follow "
                           f"(the state at step {state.newest_state.step} is kept but not used)"
                           + _redone(0, end_step))
    else:
        resume_from = state.newest_state.path
        start = state.newest_state.step
        note = _join(note, f"resumes from the state at step {start}" + _redone(start, end_step))
    all_changes += [Change(str(k), old, v) for k, old, v in ds_changes]
    all_changes += [Change(PREVIEW_SIZE_LABEL, old, v) for _k, old, v in size_changes]
    return Retry(config=new, resume_from=resume_from, changes=all_changes, reason=reason, move=move,
                 start_step=start, note=note, dataset=new_dataset, weights_from=weights_from,
                 sample_size=str(size_changes[-1][2]) if size_changes else None)


# ---- a loss that is not a number ----------------------------------------------------------

def nan_reason(step: int) -> str:
    return (f"the training loss became NaN at step {step}, so kohya-tuner stopped the trainer: the weights are "
            "diverging (or have), and a LoRA saved after it is not one to use. sd-scripts' average loss stays NaN "
            "from the first NaN step on, so going on would not show a recovery either")


# What makes a LoRA's loss NaN, each with what to change: (applies to (config, family), advice).
# Checked in this order; the learning rate is always named, the precision causes only where they apply.
_NAN_CAUSES: tuple[tuple[Callable[[Mapping[str, Any], Family], bool], Callable[[Mapping[str, Any], Family], str]],
                   ...] = (
    (lambda c, f: f.fp16_vae_overflows and c.get("mixed_precision") == "fp16" and not c.get("no_half_vae"),
     lambda c, f: f"Likely: the {f.label} VAE overflows in fp16 (its latents turn NaN, then every loss does). "
                  "Add --set no_half_vae=true, or use a VAE fixed for fp16 (--set vae=FILE)."),
    (lambda c, f: c.get("mixed_precision") == "fp16",
     lambda c, f: "Likely: fp16 overflows (its largest value is 65504). Use --set mixed_precision=bf16 where the "
                  "card has bf16 (RTX 30 / A-series and newer)"
                  + ("; and leave full_fp16 off (--set full_fp16=false), which keeps the weights themselves in fp16"
                     if c.get("full_fp16") else "") + "."),
    (lambda c, f: True,
     lambda c, f: "A learning rate too high for this optimizer and rank also diverges: "
                  + _lr_text(c) + "."),
    (lambda c, f: c.get("max_grad_norm") == 0,
     lambda c, f: "max_grad_norm = 0 turns gradient clipping off: --set max_grad_norm=1.0 keeps one bad batch from "
                  "blowing up the weights."),
)


def _lr_text(config: Mapping[str, Any]) -> str:
    rates = [(k, config.get(k)) for k in ("learning_rate", "unet_lr", "text_encoder_lr")
             if isinstance(config.get(k), (int, float)) and not isinstance(config.get(k), bool) and config.get(k) > 0]
    if str(config.get("optimizer_type") or "").lower().startswith(("prodigy", "dadapt")):
        return ("with an adaptive optimizer (Prodigy, D-Adaptation) keep learning_rate = 1.0 and lower its step size "
                "instead: d_coef=0.5 in optimizer_args")
    if not rates:
        return "lower learning_rate (and unet_lr / text_encoder_lr)"
    return "halve it, e.g. " + ", ".join(f"--set {k}={v / 2:g}" for k, v in rates) + \
        f" (now {', '.join(f'{k} {v:g}' for k, v in rates)})"


def nan_advice(config: Mapping[str, Any], family: Family) -> tuple[str, ...]:
    """Why a LoRA's loss became NaN with this config, most likely first, and what to change."""
    out = [text(config, family) for applies, text in _NAN_CAUSES if applies(config, family)]
    out.append("Start a new run with the change (`kohya-tuner run ... --set KEY=VALUE`); continuing this one "
               "with the same settings diverges again. The states saved before the NaN step are kept.")
    return tuple(out)


def _keeps_shape(config: Mapping[str, Any], changes) -> bool:
    return bool(config.get("network_module")) and set(resume_unsafe(changes)) <= WEIGHTS_CARRY


def weights_carry(config: Mapping[str, Any], changes) -> bool:
    """A LoRA run whose pinned changes keep the network's shape: the relaunch can start from
    the saved LoRA weights with a fresh optimizer instead of from step 0. Full fine-tunes
    have no network to load; rank, alpha and module changes reshape it."""
    unsafe = resume_unsafe(changes)
    return bool(config.get("network_module")) and bool(unsafe) and set(unsafe) <= WEIGHTS_CARRY


@dataclass(frozen=True)
class _Changes:
    changes: list


def _redone(start: int, end: int) -> str:
    """The steps trained past the restart point, which the relaunch trains again."""
    if end <= start:
        return ""
    return f"; step {end} is redone" if end == start + 1 else f"; steps {start + 1}-{end} are redone"


# What is left at the ladder's floor, for the phase that ran out: a setting helps only where the
# phase depends on it (the text encoders encode the captions whatever the resolution).
_FLOOR_ADVICE = {
    "training": "A smaller model family, a card with more memory, or --set with settings outside the ladder "
                "(e.g. a lower resolution) are what is left.",
    "cache_text_encoder": "The text encoders set this peak, whatever the LoRA settings: a smaller (fp8) text-encoder "
                          "file where the model has one, or a card with more memory.",
    "model_load": "Loading the models sets this peak, before any LoRA setting counts: smaller (fp8) model files, "
                  "a smaller model family, or a card with more memory.",
    "cache_latents": "The VAE encoding the images sets this peak: a lower --set resolution (and max_bucket_reso), "
                     "or a card with more memory.",
}


def loader_in_process(config: dict[str, Any]) -> tuple[dict[str, Any], list[Change]]:
    """After a hang: data-loader worker processes are the usual thing stuck, and loading in the
    training process (slower, never stuck on a worker) changes nothing a state holds."""
    workers = config.get("max_data_loader_n_workers")
    if workers == 0:
        return config, []
    config = dict(config)
    config["max_data_loader_n_workers"] = 0
    changes = [Change("max_data_loader_n_workers", workers, 0)]
    if config.pop("persistent_data_loader_workers", None) is not None:
        changes.append(Change("persistent_data_loader_workers", True, None))
    return config, changes


def hang_advice(config: Mapping[str, Any], processes: int = 1) -> str:
    """What to try after a hang, given what the config already does."""
    ranks = ("On several ranks, one rank that stopped (an error, a kill, a stuck read) leaves the others "
             "waiting in a collective for good: look at each rank's last lines in the log. " if processes > 1 else "")
    if not loader_in_process(config)[1]:
        return (ranks + "The data loader already runs in the training process, so a stuck loader worker is not "
                "the cause: a slow or network disk, a driver or CUDA call that never returned"
                + (", or a deadlocked multi-GPU setup" if processes > 1 else "")
                + " are the usual others. `kohya-tuner run --continue` resumes from the newest state as it is.")
    return (ranks + "A stuck data-loader worker or a deadlocked multi-GPU setup are the usual causes. "
            "`kohya-tuner run --continue` resumes from the newest state with the data loader in the training "
            "process (max_data_loader_n_workers = 0), which a state does not depend on.")


def advice_for(advice: Iterable[str], config: Mapping[str, Any]) -> list[str]:
    """The log's advice without the items the config already follows: an item whose every
    `key = value` the config holds already, and the bucket-size item when bucketing is off."""
    out = []
    for item in advice:
        pairs = _ASSIGNMENT.findall(item)
        if pairs and all(_holds(config, k, v) for k, v in pairs):
            continue
        if "`max_bucket_reso`" in item and config.get("enable_bucket") is False:
            continue
        out.append(item)
    return out


_ASSIGNMENT = re.compile(r"`([a-z_][a-z0-9_]*)\s*=\s*([^`]+)`")


def _holds(config: Mapping[str, Any], key: str, text: str) -> bool:
    import tomllib

    try:
        want = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        return False
    have = config.get(key)
    if isinstance(want, bool) or isinstance(have, bool):
        return have is want
    return have == want


def _join(a: str | None, b: str | None) -> str:
    """Two clauses of a note, either of which may be missing (never the word "None")."""
    return "; ".join(x for x in (a, b) if x)


# ---- progress bookkeeping (pure, fed with parser events) -------------------------------------
