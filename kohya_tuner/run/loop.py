"""The attempt loop of `kohya-tuner run`: launch, watch, decide, relaunch.

`Supervisor` is the impure loop around `policy.decide()`: it writes attempt configs,
starts the trainer through `launcher`, feeds its output to the log parser, samples VRAM,
writes the journal and the report, and appends the measured peak to the history.
"""

from __future__ import annotations

import math
import os
import re
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from kohya_tuner.run import durable
from kohya_tuner.run import journal as jr
from kohya_tuner.run.journal import AttemptRecord, Change, Journal, StateRecord
from kohya_tuner.prompts import resizable_size
from kohya_tuner.run.policy import AttemptFacts, Retry, RunState, Stop, _get, decide
from kohya_tuner.run.progress import Progress
from kohya_tuner.run.settings import RunSettings, command_for, probe_config, read_config_file
from kohya_tuner.run.states import (AttemptOutput, attempt_config, attempt_outputs, base_name,
                                    fresh_schedule_note, lineage, lineage_weights, newest_resumable,
                                    publish_lora, settle_unfinished, states_on_disk)

# A process killed with signal 9 by someone other than kohya-tuner (the kernel's OOM killer), as Python,
# a shell, and torchrun's record of a failed rank say it. On several ranks the peers' collective errors
# ("Connection reset by peer") may come first; the kill is still the cause.
_KILLED = re.compile(r"(died with <Signals\.SIGKILL: 9>|exit status -9\b|exit status 137\b|Killed\s*$|\b\d+ Killed\s+\S"
                     r"|^\s*exitcode\s*:\s*-9\b|Signal 9 \(SIGKILL\) received by PID)")


@dataclass(frozen=True)
class RunEvent:
    """One thing that happened, for the live display and --json-events."""

    kind: str  # attempt_start, progress, saved, milestone, oom, nan_loss, attempt_end, decision, finished, line
    data: dict[str, Any]


@dataclass
class Outcome:
    status: str  # success, failed, interrupted
    reason: str
    summary: dict[str, Any]
    attempts: list[AttemptRecord]
    exit_code: int


class Supervisor:
    """Runs attempts until success, a non-OOM failure, the ladder's floor or --max-attempts."""

    def __init__(self, settings: RunSettings, *, on_event: Callable[[RunEvent], None] | None = None,
                 events_file: Path | None = None, stop: threading.Event | None = None,
                 base_env: Mapping[str, str] | None = None, sampler_factory: Callable[[int], Any] | None = None,
                 next_step: Callable[..., Any] | None = None):
        self.s = settings
        self.journal = Journal(settings.out_dir)
        self.on_event = on_event or (lambda e: None)
        self.events_file = events_file
        self.stop = stop or threading.Event()
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.sampler_factory = sampler_factory
        self.next_step = next_step
        self._events_fh = None
        self._modules: dict[str, Any] | None = None  # the trainer's optional modules, probed when a move needs one
        self.dataset = settings.dataset
        self.dataset_file = settings.dataset_file
        self._adopt_changed_dataset()

    # -- events --

    def emit(self, kind: str, /, **data: Any) -> None:
        ev = RunEvent(kind, data)
        if self._events_fh is not None:
            from kohya_tuner import jsontext

            try:
                self._events_fh.write(jsontext.dumps({"event": kind, "time": jr.now_iso(), **data}) + "\n")
                self._events_fh.flush()
            except OSError:
                self._events_fh = None  # a full disk ends the event stream, not the run
        self.on_event(ev)

    # -- files --

    def write_attempt_config(self, attempt: int, config: Mapping[str, Any], why: str) -> Path:
        from kohya_tuner import config_io

        path = self.journal.config_path(attempt)
        header = (f"Attempt {attempt} of a kohya-tuner run ({self.s.family.script}).\n{why}\n"
                  "Written by the supervisor; your own config files are never edited.")
        text = config_io.dumps_config(dict(config), script=self.s.family.script, header=header)
        config_io.write_new(path, text, force=True)
        return path

    # -- the loop --

    def run(self, first: Retry, *, first_attempt: int = 1, probe_first: bool = False) -> Outcome:
        """Run from `first` (the first attempt's settings) until a Stop."""
        if self.events_file is not None:
            self.events_file.parent.mkdir(parents=True, exist_ok=True)
            self._events_fh = open(self.events_file, "a", encoding="utf-8")
        durable.make_reserve(self.s.out_dir)
        try:
            return self._loop(first, first_attempt, probe_first)
        finally:
            durable.free_reserve(self.s.out_dir)
            if self._events_fh is not None:
                self._events_fh.close()
                self._events_fh = None

    def _loop(self, first: Retry, attempt: int, probing: bool) -> Outcome:
        from kohya_tuner.run.continuation import recovered_records

        history = recovered_records(self.s, settle_unfinished(self.journal.attempts(), self.s.plan_config,
                                                              self.s.total_steps))
        launched = 0
        plan = self._fit_environment(replace(first, config=dict(first.config), changes=list(first.changes)))
        tried = {a.move for a in history if a.move}
        stop: Stop | None = None
        while True:
            launched += 1
            plan = self._smaller_previews(plan, attempt)
            record, diagnosis, facts = self._attempt(attempt, plan, probing)
            history.append(record)
            if not probing and record.start_step == 0:
                self._adopt_reported_total(record)
            newest = None if probing else self._newest_state(history)
            state = RunState(attempt=attempt, attempts_left=self.s.max_attempts - launched,
                             total_steps=self.s.probe_steps if probing else self.s.total_steps,
                             plan_config=self.s.plan_config, tried=frozenset(tried), newest_state=newest,
                             probe=probing, policy=self.s.policy, cpu=self.s.cpu,
                             user_keys=frozenset(self.s.user_keys), last_move_phase=_answered_phase(history),
                             weights=None if probing or newest else lineage_weights(history),
                             processes=self.s.num_processes,
                             sample_size=resizable_size(plan.config, self.s.family.name))
            action = decide(diagnosis, plan.config, self.s.family, state, facts, dataset=self.dataset,
                            next_step=self.next_step)
            if isinstance(action, Stop):
                stop = action
                self.emit("decision", action="stop", status=action.status, reason=action.reason,
                          advice=list(action.advice))
                break
            if probing and facts.exit_status == 0:
                probing = False
                action = Retry(config=dict(action.config), resume_from=None, changes=[], reason=action.reason,
                               start_step=0, note="the full run starts from step 0 with the settings the probe proved")
            elif action.move:
                tried.add(action.move)
            if "max_train_epochs" in action.config:
                # Steps, not epochs, stay fixed across retries: a batch or resolution move
                # changes how many steps an epoch has.
                cfg = {k: v for k, v in action.config.items() if k != "max_train_epochs"}
                cfg["max_train_steps"] = self.s.total_steps
                action = replace(action, config=cfg)
            self.emit("decision", action="retry", reason=action.reason, move=action.move,
                      changes=[c.__dict__ for c in action.changes], resume_from=action.resume_from, note=action.note)
            plan = self._fit_environment(action)
            attempt += 1
        return self._finish(history, stop)

    def _smaller_previews(self, plan: Retry, attempt: int) -> Retry:
        """A move to smaller previews: the attempt draws them from a copy of the prompt file with
        the new --w/--h (the user's own file is never edited), and says which."""
        if not plan.sample_size or not plan.config.get("sample_prompts"):
            return plan
        from kohya_tuner import prompts

        old = str(plan.config["sample_prompts"])
        dest = self.s.out_dir / prompts.copy_name(old, attempt)
        prompts.write_smaller(old, plan.sample_size, self.s.family.name, dest)
        config = {**plan.config, "sample_prompts": str(dest)}
        return replace(plan, config=config, sample_size=None,
                       changes=list(plan.changes) + [Change("sample_prompts", old, str(dest))])

    def _fit_environment(self, plan: Retry) -> Retry:
        """A move may bring in what the trainer's environment lacks (an 8-bit optimizer without
        bitsandbytes, xformers): swap it as pre-flight does, and say so in the attempt's note."""
        from kohya_tuner.run.preflight import environment_changes

        wants = str(plan.config.get("optimizer_type") or "").lower()
        if not (plan.config.get("xformers") or "8bit" in wants or wants.startswith("bitsandbytes.")
                or plan.config.get("use_8bit_adam")):
            return plan
        if self._modules is None:
            from kohya_tuner.run.launcher import probe_modules

            self._modules = probe_modules(self.s.python, ["xformers", "bitsandbytes"]).get("modules") or {}
        subs = environment_changes(plan.config, self.s.family, self._modules, python=self.s.python)
        if not subs:
            return plan
        config = dict(plan.config)
        for key, _old, new, _why in subs:
            if new is None:
                config.pop(key, None)
            else:
                config[key] = new
        why = "; ".join(f"{key} → {new!r}: {w}" for key, _old, new, w in subs if new is not None)
        before = {c.key: c.old for c in plan.changes}  # against the previous attempt, not the move
        swapped = {s[0] for s in subs}
        changes = [c for c in plan.changes if c.key not in swapped]
        changes += [Change(k, before.get(k, o), n) for k, o, n, _w in subs if before.get(k, o) != n]
        return replace(plan, config=config, note=f"{plan.note}; {why}" if plan.note else why, changes=changes)

    def _adopt_changed_dataset(self) -> None:
        """A continued run keeps the dataset file a move wrote in an earlier attempt."""
        found = []
        for p in self.s.out_dir.glob("attempt-*.dataset.toml"):
            m = re.match(r"attempt-(\d+)\.dataset\.toml$", p.name)
            if m:
                found.append((int(m.group(1)), p))
        if not found:
            return
        from kohya_tuner import config_io

        path = max(found)[1]
        self.dataset = config_io.read_dataset(path)
        self.dataset_file = path

    def _adopt_reported_total(self, record: AttemptRecord) -> None:
        """With max_train_epochs the trainer decides the step count; its report wins."""
        reported = record.total_steps
        if reported and reported != self.s.total_steps:
            self.s.total_steps = int(reported)
            cfg = {k: v for k, v in self.s.plan_config.items() if k != "max_train_epochs"}
            cfg["max_train_steps"] = int(reported)
            self.s.plan_config = cfg
            self.journal.write_run(self.s.to_json())

    def _newest_state(self, attempts: list[AttemptRecord]) -> StateRecord | None:
        """The newest complete state on disk that an attempt of the current lineage wrote."""
        return newest_resumable(self.s.plan_config.get("output_dir"),
                                attempt_outputs(lineage(attempts), base_name(self.s.plan_config)), self.s.total_steps)

    def _attempt(self, attempt: int, plan: Retry, probing: bool) -> tuple[AttemptRecord, Any, AttemptFacts]:
        from kohya_tuner import logparse
        from kohya_tuner.run import launcher

        out = self.s.out_dir
        total = self.s.probe_steps if probing else self.s.total_steps
        config = probe_config(plan.config, total, out) if probing else plan.config
        run_config = attempt_config(config, resume_from=plan.resume_from, resume_step=plan.start_step,
                                    total_steps=total, attempt=None if probing else attempt,
                                    weights_from=None if probing else plan.weights_from)
        if plan.weights_from and not probing:
            why = fresh_schedule_note(config)
            if why:
                plan = replace(plan, note=f"{plan.note}; {why}" if plan.note else why)
        # The one gate: never launch what sd-scripts would refuse at start-up (after a ladder move too).
        from kohya_tuner.check import run_gate

        run_gate(run_config, self.s.family.script, dataset=plan.dataset if plan.dataset is not None else self.dataset,
                 family=self.s.family.name)
        cfg_path = self.write_attempt_config(attempt, run_config, plan.reason)
        if plan.dataset is not None and plan.dataset != self.dataset:
            from kohya_tuner import config_io

            self.dataset = dict(plan.dataset)
            self.dataset_file = self.s.out_dir / f"attempt-{attempt}.dataset.toml"
            config_io.write_new(self.dataset_file, config_io.dumps_dataset(
                self.dataset, header=f"Dataset config from attempt {attempt} on (a move changed it)."), force=True)
        argv, env = command_for(self.s, cfg_path, run_config, self.base_env, dataset_file=self.dataset_file)
        log_path = self.journal.log_path(attempt)
        if log_path.exists():
            log_path.unlink()  # a stale log of an attempt that never got journaled
        record = AttemptRecord(attempt=attempt, started=jr.now_iso(), config_file=str(cfg_path),
                               log_file=str(log_path), reason=plan.reason, changes=list(plan.changes),
                               move=plan.move, resume_from=plan.resume_from, probe=probing,
                               start_step=plan.start_step, end_step=plan.start_step, total_steps=total,
                               note=plan.note)
        durable.write_pending(self.s.out_dir, durable.snapshot(record, None, "running"))
        self.emit("attempt_start", attempt=attempt, reason=plan.reason, note=plan.note, probe=probing,
                  changes=[c.__dict__ for c in plan.changes], resume_from=plan.resume_from,
                  start_step=plan.start_step, total_steps=total, command=launcher.format_command(argv),
                  config_file=str(cfg_path), log_file=str(log_path))
        progress = Progress(start_step=plan.start_step, total_steps=total, attempt=attempt)
        # One parser per pipe: a traceback (stderr) stays contiguous even when a stdout
        # line such as an epoch header lands between two of its lines.
        parsers = {"stdout": logparse.LogParser(), "stderr": logparse.LogParser()}
        events: list[Any] = []
        killed = {"seen": False}
        # A loss that is not a number ends the attempt at once: training on only spends time on
        # weights that are diverging, and would end in a "success".
        halt = threading.Event()
        nan_step: dict[str, int] = {}
        sampler = self._sampler()

        def handle(ev: Any) -> None:
            events.append(ev)
            kind = type(ev).__name__
            if kind == "Progress":
                progress.on_progress(ev.step, getattr(ev, "total", None), getattr(ev, "loss", None),
                                     getattr(ev, "rate", None))
                loss = getattr(ev, "loss", None)
                if loss is not None and not math.isfinite(loss) and "step" not in nan_step:
                    nan_step["step"] = progress.step
                    halt.set()
                    self.emit("nan_loss", attempt=attempt, step=progress.step)
                self.emit("progress", attempt=attempt, step=progress.step, total=total, loss=progress.loss,
                          rate=progress.rate, eta_s=progress.eta_s, vram_gib=_now(sampler),
                          peak_gib=_peak(sampler))
            elif kind == "Saved":
                rec = progress.on_saved(ev.what, str(ev.path))
                self.emit("saved", attempt=attempt, what=ev.what, path=str(ev.path),
                          step=rec.step if rec else progress.step)
            elif kind == "Oom":
                self.emit("oom", attempt=attempt, step=progress.step, figures=_as_dict(ev.figures), rank=ev.rank)
            elif kind in _PASSED_ON:
                data = _as_dict(ev)
                if kind == "TotalSteps":
                    progress.reported_total = data.get("total")
                if kind == "Failure":
                    data["error_kind"] = data.pop("kind", None)
                self.emit(_PASSED_ON[kind], attempt=attempt, **data)

        def on_line(stream: str, line: str) -> None:
            if _KILLED.search(line):
                killed["seen"] = True
            for ev in parsers.get(stream, parsers["stdout"]).feed(line + "\n"):
                handle(ev)

        def tick() -> None:
            if sampler is not None and sampler.samples:
                self.emit("vram", attempt=attempt, vram_gib=_now(sampler), peak_gib=_peak(sampler))

        if sampler is not None:
            sampler.start()
        try:
            result = launcher.run_process(
                argv, env, on_line=on_line, log_path=log_path, hang_timeout_s=self.s.hang_minutes * 60,
                stop=self.stop, tick=tick, tick_s=1.0,
                on_interrupt=lambda: durable.write_pending(self.s.out_dir,
                                                           durable.snapshot(record, progress, "interrupted")),
                halt=halt)
        finally:
            if sampler is not None:
                sampler.stop()
        for p in parsers.values():
            for ev in p.finish():
                handle(ev)
        exit_status = result.exit_status
        # A trainer kohya-tuner stopped itself (a hang, Ctrl-C) ends on the signal it was sent: that status
        # says nothing of the run (SIGKILL is no host-RAM kill here).
        ours = result.hung or result.interrupted
        diagnosis = logparse.diagnose(events, exit_status=None if ours else exit_status, family=self.s.family.name)
        final = progress.final_model
        if final is None:
            guess = Path(run_config.get("output_dir") or ".") / (
                f"{run_config.get('output_name') or 'last'}.{run_config.get('save_model_as') or 'safetensors'}")
            final = str(guess)
        final_exists = Path(final).is_file()
        if not probing:
            # The states on disk are the truth; the log's save lines only fed the display.
            on_disk = states_on_disk(config.get("output_dir"),
                                     [AttemptOutput(attempt, str(run_config.get("output_name")), plan.start_step)])
            progress.states = on_disk
            if on_disk:
                progress.run_step = max(progress.run_step, max(s.step for s in on_disk) - plan.start_step)
        facts = AttemptFacts(exit_status=exit_status, end_step=progress.step, hung=result.hung,
                             interrupted=result.interrupted,
                             killed=not ours and (killed["seen"] or exit_status in (137, -9)),
                             final_model=final if final_exists and exit_status == 0 else None,
                             hang_minutes=self.s.hang_minutes, failure=result.failure,
                             nan_loss_step=nan_step.get("step"))
        if progress.reported_total and not probing and not plan.resume_from and not plan.weights_from:
            record.total_steps = int(progress.reported_total)
        record.duration_s = round(result.duration_s, 2)
        record.exit_status = exit_status
        record.end_step = progress.step
        record.states = progress.states
        record.loss = jr.thin(progress.losses)
        if sampler is not None:
            record.vram = jr.thin([[round(t, 2), round(v, 3)] for t, v in sampler.samples])
            record.peak_vram_gib = round(sampler.peak_gib, 3) if sampler.peak_gib is not None else None
        outcome = _get(diagnosis, "outcome") or "incomplete"
        if result.failure:
            outcome = "error"
        elif result.interrupted:
            outcome = "interrupted"
        elif result.hung:
            outcome = "hang"
        elif facts.nan_loss_step is not None:
            outcome = "nan_loss"
        elif outcome != "oom" and (facts.killed or _get(_get(diagnosis, "error"), "kind") == "cpu_oom"):
            outcome = "cpu_oom"
        elif exit_status == 0 and facts.final_model:
            outcome = "success"
        elif exit_status == 0:
            outcome = "incomplete"
        record.outcome = outcome
        record.phase = _get(diagnosis, "phase")
        record.oom = _as_dict(_get(diagnosis, "oom")) or None
        failed_rank = getattr(getattr(diagnosis, "details", None), "failed_rank", None)
        if record.oom is not None and failed_rank is not None:
            record.oom["rank"] = failed_rank  # which of several ranks ran out
        record.error = _as_dict(_get(diagnosis, "error")) or None
        if result.failure:
            record.error = {"kind": "supervision", "message": result.failure}
        from kohya_tuner.run.policy import advice_for

        # The log's advice is written for any config: drop what this attempt's config already does.
        record.advice = advice_for(_get(diagnosis, "advice") or [], config)
        if outcome in ("interrupted", "hang") and record.oom is None:
            # What the stop itself caused (a peer's "Connection reset" once a rank was signalled, the
            # KeyboardInterrupt, a log that ends early) is not the attempt's error: the record keeps it
            # as what was logged, without advice for it.
            if record.error is not None:
                record.error = {**record.error, "after_stop": True}
            record.advice = []
        if outcome == "nan_loss":
            from kohya_tuner.run.policy import nan_advice, nan_reason

            record.error = {"kind": "nan_loss", "message": nan_reason(facts.nan_loss_step)}
            record.advice = list(nan_advice(config, self.s.family))
        record.final_model = facts.final_model
        self.journal.append(record)
        self.emit("attempt_end", attempt=attempt, outcome=outcome, phase=record.phase, exit_status=exit_status,
                  steps=f"{record.start_step}->{record.end_step}", peak_gib=record.peak_vram_gib,
                  duration_s=record.duration_s, error=record.error, oom=record.oom)
        return record, diagnosis, facts

    def _sampler(self):
        if self.sampler_factory is not None:
            return self.sampler_factory(self.s.gpu_index)
        if self.s.cpu:
            return None
        from kohya_tuner.gpu import VramSampler, list_gpus

        if not list_gpus():
            return None
        return VramSampler(index=self.s.gpu_ids[0] if self.s.gpu_ids else self.s.gpu_index, interval=1.0)

    def _finish(self, attempts: list[AttemptRecord], stop: Stop | None) -> Outcome:
        from kohya_tuner.run import report

        stop = stop or Stop("stopped")
        last = attempts[-1] if attempts else None
        final_config = None
        if last is not None:
            final_config = read_config_file(last.config_file, self.s.plan_config)
        lora = None
        lora_note = None
        if last is not None and stop.status == "success" and last.final_model:
            # The last attempt's trainer counted only its own steps; the file says the run's.
            stamp = ({"ss_steps": str(self.s.total_steps), "ss_max_train_steps": str(self.s.total_steps)}
                     if last.start_step else None)
            lora, lora_note = publish_lora(last.final_model, base_name(self.s.plan_config), stamp)
        cont = (f"kohya-tuner run --continue {_quote(self.s.out_dir)}"
                if stop.status != "success" and stop.can_continue else None)
        history_note = None
        if stop.status == "success" and last is not None:
            history_note = self._append_history(last, final_config or {})
        summary = jr.summarize([a for a in attempts], status=stop.status, reason=stop.reason,
                               total_steps=self.s.total_steps, final_config=final_config,
                               plan_config=self.s.plan_config, lora_path=lora, gpu=self.s.gpu,
                               continue_command=cont, history_note=history_note)
        summary["advice"] = list(stop.advice)
        if lora_note:
            summary["lora_note"] = lora_note
        summary["predicted_gib"] = self.s.predicted_gib
        summary["report"] = str(self.journal.report_path)
        self.journal.write_summary(summary)
        self.journal.write_report(report.render(summary, attempts, title=f"kohya-tuner run: {self.s.out_dir.name}"))
        code = {"success": 0, "interrupted": 130}.get(stop.status, 1)
        self.emit("finished", **{k: summary[k] for k in ("status", "reason", "lora", "attempts", "failed_attempts",
                                                         "time_lost_s", "steps_done", "steps_redone",
                                                         "steps_lost", "total_steps", "peak_vram_gib",
                                                         "continue_command", "report")})
        return Outcome(status=stop.status, reason=stop.reason, summary=summary, attempts=attempts, exit_code=code)

    def _append_history(self, last: AttemptRecord, config: dict[str, Any]) -> str | None:
        gpu = self.s.gpu or {}
        if last.peak_vram_gib is None or not gpu.get("name"):
            return "not recorded: no VRAM measurement (NVML unavailable)"
        if self.s.emulate_vram_gb is not None:
            return "not recorded: the card was emulated (--emulate-vram)"
        if self.s.predicted_gib is None:
            return "not recorded: there was no prediction to compare with"
        from kohya_tuner import history, memory

        # The prediction for the settings that actually ran (after any downgrades), made
        # without the history correction, so the history never corrects itself; the figure a
        # monitor shows, as NVML measured it (the CUDA context included).
        predicted = memory.estimate(config, self.s.family, dataset=self.s.dataset,
                                    gpus=max(1, self.s.num_processes), driver=gpu.get("driver")).monitor_gib
        entry = {
            "gpu_name": gpu.get("name"), "gpu_total_gib": gpu.get("total_gib"), "model": self.s.family.name,
            "fingerprint": history.fingerprint(config, self.s.family, self.s.dataset),
            "predicted_gib": round(predicted, 3), "measured_peak_gib": last.peak_vram_gib,
        }
        history.append(entry)
        return f"measured peak {last.peak_vram_gib:.2f} GiB recorded for {gpu.get('name')}"


# Parser events passed on to the display and --json-events, by the names they go out as.
# The trainer's `model saved.` is "model_saved": "finished" is the whole run's last event.
_PASSED_ON = {"Milestone": "milestone", "Resumed": "resumed", "Failure": "failure", "TotalSteps": "total_steps",
              "EpochStart": "epoch", "Finished": "model_saved", "Exited": "exited"}



def _answered_phase(history: list[AttemptRecord]) -> str | None:
    """The OOM phase the move that started the last attempt answered, if a ladder move did."""
    if len(history) < 2 or not history[-1].move or history[-2].outcome != "oom":
        return None
    return history[-2].phase or "training"


def _quote(path: Path) -> str:
    from kohya_tuner.run.launcher import format_command

    return format_command([str(path)])


def _now(sampler) -> float | None:
    return getattr(sampler, "now_gib", None) if sampler is not None else None


def _peak(sampler) -> float | None:
    return getattr(sampler, "peak_gib", None) if sampler is not None else None


def _as_dict(obj: Any) -> dict[str, Any]:
    if obj is None:
        return {}
    if isinstance(obj, Mapping):
        return dict(obj)
    if hasattr(obj, "to_json"):
        try:
            return dict(obj.to_json())
        except Exception:
            pass
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    if hasattr(obj, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(obj)
    return {"value": str(obj)}

