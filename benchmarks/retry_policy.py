"""How three OOM-retry policies fare when the true memory differs from the estimate.

Scenarios: 3 models x GPU classes x jobs x true memory off from the estimate by -20 % ...
+30 %. Each scenario starts from what `run` launches (presets composed and fitted by the
estimator), then simulates attempts: the "true" memory of a config is the estimator's
figure for it times (1 + error); an attempt runs out of memory in the first phase whose
true figure is over what CUDA can allocate on the card. During training the largest bucket
comes up once per epoch (at a seeded random point), and the memory held grows slowly
over a run (fragmentation: +6 % by the last step, an assumption); an OOM strikes at the
first largest-bucket step whose figure no longer fits, which is often hours in.

Policies:
  (a) halve-batch   what in-process retry loops (accelerate's find_executable_batch_size)
                    do: halve the batch and start over; nothing else.
  (b) roadmap       `run`'s supervisor with the ladder in the guides' fixed order.
  (c) ours          `run`'s supervisor with the default policy (quality-keeping moves first,
                    the deficit measured from the OOM message, resume when the move allows).

The supervised policies model what `run` does now: the trainer saves its state at the step an
OOM ends (training and sampling; an OOM while saving leaves the cadence state before it), a
move the state can follow resumes from it, a move only the optimizer's state cannot follow
(optimizer type, its precision) continues from the saved LoRA weights with a fresh optimizer,
and a move that reshapes the network (rank, network arguments, text-encoder training)
restarts from step 0. `ours-cadence` is the default policy as it was before the save at the
failure and the continuation from weights: resuming only from cadence states.

Counted per policy: runs finished (within 6 attempts), attempts per finished run (and the
most), optimizer steps trained and then thrown away (those thrown away by a restart after a
network-reshaping move apart), and the quality cost of the final settings against the plan
(the ladder's quality scale: 0 none, 1 small, 2 noticeable, 3 large, summed over what
changed). Pure simulation: no process, no GPU. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kohya_tuner import ladder, memory, presets  # noqa: E402
from kohya_tuner.families import get_family  # noqa: E402
from kohya_tuner.run.journal import StateRecord  # noqa: E402
from kohya_tuner.memory.model import USABLE_FRACTION  # noqa: E402
from kohya_tuner.run.policy import AttemptFacts, Retry, RunState, Stop, decide, effective_batch  # noqa: E402

MODELS = {"sd15": (6, 8, 12), "sdxl": (8, 12, 16, 24), "flux": (12, 16, 24)}
JOBS = ("character", "style", "concept")
ERRORS = (-0.2, -0.1, 0.0, 0.1, 0.2, 0.3)
MAX_ATTEMPTS = 6
# Phases in the order a run meets them.
ORDER = ("model_load", "cache_latents", "cache_text_encoder", "training", "sampling", "saving")
DRIFT = 0.06


@dataclass
class Result:
    finished: bool
    attempts: int
    steps_lost: int
    quality: int
    why: str = ""
    moves: list[str] = field(default_factory=list)
    # the part of steps_lost a restart after a network-reshaping move (rank, ...) threw away
    reshape_lost: int = 0


def _quality(plan: dict[str, Any], final: dict[str, Any], lad) -> int:
    """The ladder's quality cost of what differs between the plan and the final config."""
    q = 0

    def cost(name: str) -> int:
        try:
            return int(lad.move(name).quality_cost)
        except KeyError:
            return 0

    if (final.get("network_dim") or 0) < (plan.get("network_dim") or 0):
        q += cost("network_dim")
    if str(final.get("resolution")) != str(plan.get("resolution")):
        q += cost("resolution")
    if final.get("optimizer_type") != plan.get("optimizer_type"):
        q += cost("optimizer_adafactor") if str(final.get("optimizer_type")).lower() == "adafactor" else cost(
            "optimizer_8bit")
    if final.get("network_train_unet_only") and not plan.get("network_train_unet_only"):
        q += cost("train_unet_only")
    if final.get("network_args") != plan.get("network_args"):
        q += cost("train_single_blocks")
    if (final.get("t5xxl_max_token_length") or 512) < (plan.get("t5xxl_max_token_length") or 512):
        q += cost("t5_tokens")
    if final.get("full_bf16") and not plan.get("full_bf16"):
        q += cost("full_bf16")
    if effective_batch(final) != effective_batch(plan):
        q += 1  # a different effective batch changes what the learning rate means
    return q


class Sim:
    def __init__(self, family, dataset, capacity: float, error: float, offset: int, epoch: int):
        self.family, self.dataset = family, dataset
        self.capacity, self.error = capacity, error
        self.offset, self.epoch = offset, epoch

    def true_phases(self, config: dict[str, Any]) -> dict[str, float]:
        e = memory.estimate(config, self.family, dataset=self.dataset)
        return {p: v * (1 + self.error) for p, v in e.phases_gib.items()}

    def first_oom(self, config: dict[str, Any], start: int, total: int,
                  every: int | None = None) -> tuple[str, int, float] | None:
        """(phase, last step completed, GiB short) of the attempt's OOM, or None if it finishes."""
        phases = self.true_phases(config)
        for p in ORDER:
            v = phases.get(p)
            if v is None or v * (1 + DRIFT) <= self.capacity:
                continue
            if p in ("model_load", "cache_latents", "cache_text_encoder"):
                if v > self.capacity:
                    return p, start, v - self.capacity
                continue
            # Steps where this phase peaks: the largest bucket (training), a save (saving).
            if p == "training":
                first = start + 1 + (self.offset - start - 1) % self.epoch
                stride = self.epoch
            else:
                stride = every or self.epoch
                first = (start // stride + 1) * stride
            for step in range(first, total + 1, stride):
                grown = v * (1 + DRIFT * step / total)
                if grown > self.capacity:
                    return p, step - 1 if p == "training" else step, grown - self.capacity
        return None


def run_halve(sim: Sim, plan: dict[str, Any], total: int, lad) -> Result:
    config = dict(plan)
    lost = 0
    for attempt in range(1, MAX_ATTEMPTS + 1):
        oom = sim.first_oom(config, 0, total, int(config.get("save_every_n_steps") or 0) or None)
        if oom is None:
            return Result(True, attempt, lost, _quality(plan, config, lad))
        _phase, done, _short = oom
        lost += done  # in-process retries start the training function over
        batch = int(config.get("train_batch_size") or 1)
        if batch <= 1:
            return Result(False, attempt, lost, _quality(plan, config, lad), "batch is already 1")
        config["train_batch_size"] = batch // 2
    return Result(False, MAX_ATTEMPTS, lost, _quality(plan, config, lad), "attempts")


def run_supervised(sim: Sim, plan: dict[str, Any], total: int, lad, policy: str,
                   save_at_failure: bool = True) -> Result:
    every = int(plan.get("save_every_n_steps") or max(1, total // 10))
    action = Retry(config=dict(plan), resume_from=None, changes=[], reason="plan")
    tried: set[str] = set()
    lost = reshape_lost = 0
    moves = []
    last_phase = None
    for attempt in range(1, MAX_ATTEMPTS + 1):
        start = action.start_step
        config = action.config
        from_weights = action.weights_from is not None
        oom = sim.first_oom(config, start, total, every)
        if oom is None:
            return Result(True, attempt, lost, _quality(plan, config, lad), moves=moves, reshape_lost=reshape_lost)
        phase, done, short = oom
        # The attempt's trainer counts from its start: its cadence states fall on start + k * every.
        cadence = start + ((done - 1 if phase == "saving" else done) - start) // every * every
        if save_at_failure and phase in ("training", "sampling") and done > start:
            saved = done  # the state saved as the OOM ended the step
        else:
            saved = cadence  # a save that ran out of memory left no state of its own
        newest = weights = None
        if saved > start:
            newest = StateRecord(path=f"state-{saved}", step=saved, attempt=attempt)
        elif start > 0 and not from_weights:
            newest = StateRecord(path=f"state-{start}", step=start, attempt=attempt)
        elif start > 0:
            weights = StateRecord(path=f"weights-{start}", step=start, attempt=attempt)
        diag = SimpleNamespace(outcome="oom", phase=phase, oom={"tried_gib": short + 0.05, "free_gib": 0.05},
                               error=None, advice=[])
        state = RunState(attempt=attempt, attempts_left=MAX_ATTEMPTS - attempt, total_steps=total,
                         plan_config=plan, tried=frozenset(tried), newest_state=newest, policy=policy,
                         weights=weights, last_move_phase=last_phase if action.move else None)
        facts = AttemptFacts(exit_status=1, end_step=done)
        nxt = decide(diag, config, sim.family, state, facts, dataset=sim.dataset)
        if isinstance(nxt, Stop):
            why = "floor" if "floor" in nxt.reason else "attempts"
            return Result(False, attempt, lost, _quality(plan, config, lad), why, moves, reshape_lost)
        if not save_at_failure and nxt.weights_from is not None:
            # before the continuation from weights, such a move restarted from step 0
            nxt = Retry(config=nxt.config, resume_from=None, changes=nxt.changes, reason=nxt.reason, move=nxt.move)
        thrown = max(0, done - nxt.start_step)
        lost += thrown
        if nxt.start_step == 0 and newest is not None:
            reshape_lost += thrown
        if nxt.move:
            tried.add(nxt.move)
            moves.append(nxt.move)
        action = nxt
        last_phase = phase
    return Result(False, MAX_ATTEMPTS, lost, _quality(plan, action.config, lad), "attempts", moves, reshape_lost)


def scenarios(seed: int):
    rng = random.Random(seed)
    for model, gpus in MODELS.items():
        family = get_family(model)
        for gb in gpus:
            for job in JOBS:
                plan = presets.compose(model, job, gb)
                dataset = presets.build_dataset(plan, "images")
                fit = ladder.tune(plan.config, family, memory.budget_gib(gb), dataset=dataset, gpu_gb=gb)
                config = dict(fit.config)
                ds = fit.dataset or dataset
                total = int(config.get("max_train_steps") or 1600)
                epoch = max(1, total // 10)
                for err in ERRORS:
                    offset = rng.randint(1, epoch)
                    yield (model, gb, job, err), family, ds, config, total, gb * USABLE_FRACTION, offset, epoch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--detail", action="store_true", help="one line per scenario and policy")
    args = ap.parse_args()
    lad = ladder.load_ladder()
    names = ("halve-batch", "roadmap", "ours", "ours-cadence")
    results: dict[str, list[tuple[tuple, Result]]] = {n: [] for n in names}
    for key, family, ds, config, total, capacity, offset, epoch in scenarios(args.seed):
        sim = Sim(family, ds, capacity, key[3], offset, epoch)
        for name in names:
            if name == "halve-batch":
                r = run_halve(sim, config, total, lad)
            else:
                r = run_supervised(sim, config, total, lad, "roadmap" if name == "roadmap" else "default",
                                   save_at_failure=name != "ours-cadence")
            results[name].append((key, r))
            if args.detail:
                model, gb, job, err = key
                print(f"{name:11s} {model:4s} {gb:2d}GB {job:9s} {err:+.0%}: "
                      f"{'finished' if r.finished else 'FAILED (' + r.why + ')'} in {r.attempts}, "
                      f"lost {r.steps_lost} steps ({r.reshape_lost} by a restart after a reshaping move), "
                      f"quality {r.quality} {'+'.join(r.moves)}")

    n = len(results["ours"])
    needing = sum(1 for _, r in results["ours"] if r.attempts > 1 or not r.finished)
    print(f"{n} scenarios (3 models x GPU classes x {len(JOBS)} jobs x true memory {ERRORS[0]:+.0%}..{ERRORS[-1]:+.0%} "
          f"of the estimate); {needing} of them meet at least one OOM")
    for name in names:
        rs = [r for _, r in results[name]]
        done = [r for r in rs if r.finished]
        hit = [r for (_, r), (_, o) in zip(results[name], results["ours"]) if o.attempts > 1 or not o.finished]
        hit_done = [r for r in hit if r.finished]
        fails = {}
        for r in rs:
            if not r.finished:
                fails[r.why] = fails.get(r.why, 0) + 1
        mean_attempts = statistics.mean(r.attempts for r in hit_done) if hit_done else 0.0
        reshape = sum(r.reshape_lost for r in rs)
        print(f"policy={name:12s} finished {len(done)}/{n} ({len(hit_done)}/{len(hit)} of those with an OOM); "
              f"attempts per finished OOM scenario {mean_attempts:.2f} (most {max((r.attempts for r in hit), default=0)}); "
              f"optimizer steps lost {sum(r.steps_lost for r in rs)} "
              f"(mean {statistics.mean(r.steps_lost for r in hit) if hit else 0:.0f} per OOM scenario; "
              f"{sum(r.steps_lost for r in rs) - reshape} outside restarts after rank/network moves, {reshape} in them); "
              f"quality cost of final settings mean {statistics.mean(r.quality for r in done) if done else 0:.2f}; "
              f"unfinished: {', '.join(f'{k} {v}' for k, v in sorted(fails.items())) or 'none'}")
    print("\nsteps discarded per OOM scenario, policy=ours (reshaping moves: rank, network arguments, "
          "text-encoder training, restart from step 0):")
    for key, r in results["ours"]:
        if r.attempts == 1 and r.finished:
            continue
        model, gb, job, err = key
        print(f"  {model:4s} {gb:2d}GB {job:9s} {err:+.0%}: {r.steps_lost - r.reshape_lost:4d} discarded, "
              f"{r.reshape_lost:4d} by reshaping restarts; {r.attempts} attempts, "
              f"{'finished' if r.finished else 'FAILED (' + r.why + ')'}; {'+'.join(r.moves) or '-'}")


if __name__ == "__main__":
    main()
