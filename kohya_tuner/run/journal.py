"""What a supervised run leaves behind in its output folder.

  run.json          the run's inputs, so `run --continue OUT` can pick it up again
  attempt-N.log     raw output of attempt N (written by the launcher)
  attempt-N.config.toml  the config attempt N ran with (the user's files are never edited)
  attempts.jsonl    one record per attempt: what changed and why, how it ended
  summary.json      the outcome: LoRA path, settings that worked, peak VRAM, time lost
  report.html       one self-contained page with loss and VRAM over time (see report.py)

Records are plain dataclasses written as JSON; nothing here prints.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kohya_tuner import jsontext, safeio
from kohya_tuner.config_io import atomic_write
from kohya_tuner.run import durable

# An attempt's pending record says "running" until it ends (run/durable.py).
UNFINISHED = ("running", "incomplete")
# How an attempt ended: cpu_oom is host RAM (the kernel's OOM killer or an allocator error on
# the CPU side), oom the GPU's.
OUTCOMES = ("success", "oom", "cpu_oom", "error", "hang", "interrupted", "incomplete", "nan_loss")

RUN_FILE = "run.json"
ATTEMPTS_FILE = "attempts.jsonl"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.html"
EVENTS_FILE = "events.jsonl"


def now_iso() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


@dataclass
class StateRecord:
    """A resumable state directory and the absolute optimizer step it holds."""

    path: str
    step: int
    attempt: int


@dataclass
class Change:
    key: str
    old: Any
    new: Any


@dataclass
class AttemptRecord:
    attempt: int
    started: str
    config_file: str
    log_file: str
    reason: str  # why this attempt exists: "first attempt", "OOM at step 40 ...", "continued"
    changes: list[Change] = field(default_factory=list)  # against the previous attempt
    move: str | None = None
    resume_from: str | None = None
    probe: bool = False
    start_step: int = 0  # absolute optimizer steps already behind the weights at launch
    end_step: int = 0  # absolute optimizer steps done when it ended
    total_steps: int | None = None
    duration_s: float = 0.0
    exit_status: int | None = None
    outcome: str = "incomplete"  # one of OUTCOMES
    phase: str | None = None
    oom: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    advice: list[str] = field(default_factory=list)
    peak_vram_gib: float | None = None
    # [seconds since launch, GiB] and [seconds, absolute step, loss]; thinned for the report.
    vram: list[list[float]] = field(default_factory=list)
    loss: list[list[float]] = field(default_factory=list)
    states: list[StateRecord] = field(default_factory=list)
    final_model: str | None = None
    note: str | None = None  # e.g. why it restarted instead of resuming

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "AttemptRecord":
        """A record from its JSON; ValueError when it is not one (a damaged or foreign line)."""
        if not isinstance(data, dict):
            raise ValueError("not a record")
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in known}
        for key in ("attempt", "started", "config_file", "log_file", "reason"):
            if key not in kw:
                raise ValueError(f"no {key}")
        if valid_step(kw["attempt"]) is None or kw["attempt"] < 1:
            raise ValueError("attempt is not a positive integer")
        for key in ("start_step", "end_step"):
            if key in kw and valid_step(kw[key]) is None:
                raise ValueError(f"{key} is not a step count")
        if not isinstance(kw.get("outcome", "incomplete"), str):
            raise ValueError("outcome is not a word")
        try:
            kw["changes"] = [Change(**c) for c in kw.get("changes") or []]
            kw["states"] = [StateRecord(**s) for s in kw.get("states") or []
                            if isinstance(s, dict) and valid_step(s.get("step")) is not None]
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        if not all(isinstance(kw.get(k), str) for k in ("config_file", "log_file")):
            raise ValueError("file names are not strings")
        return cls(**kw)

    @property
    def failed(self) -> bool:
        return self.outcome != "success"


# No run is planned past this; a larger count in a file is damage, not progress.
MAX_STEPS = 10**9


def valid_step(value: Any) -> int | None:
    """`value` as a step count, or None when it is not one (a float such as 1e23, a
    negative number, a bool, a string, or more steps than any run plans)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_STEPS:
        return None
    return value


def thin(points: list, limit: int = 600) -> list:
    """Keep at most `limit` points, evenly spread, always keeping the last one."""
    if len(points) <= limit:
        return list(points)
    stride = len(points) / limit
    out = [points[int(i * stride)] for i in range(limit)]
    if out[-1] is not points[-1]:
        out[-1] = points[-1]
    return out


class Journal:
    """The files of one run folder. Appends only; never rewrites an attempt."""

    def __init__(self, out_dir: str | os.PathLike):
        self.out = Path(out_dir)

    @property
    def attempts_path(self) -> Path:
        return self.out / ATTEMPTS_FILE

    @property
    def summary_path(self) -> Path:
        return self.out / SUMMARY_FILE

    @property
    def report_path(self) -> Path:
        return self.out / REPORT_FILE

    @property
    def run_path(self) -> Path:
        return self.out / RUN_FILE

    @property
    def events_path(self) -> Path:
        return self.out / EVENTS_FILE

    def log_path(self, attempt: int) -> Path:
        return self.out / f"attempt-{attempt}.log"

    def config_path(self, attempt: int) -> Path:
        return self.out / f"attempt-{attempt}.config.toml"

    def exists(self) -> bool:
        return self.run_path.is_file()

    # -- run inputs --

    def write_run(self, data: dict[str, Any]) -> None:
        atomic_write(self.run_path, jsontext.dumps(data, indent=2) + "\n")

    def read_run(self) -> dict[str, Any]:
        """run.json, checked for the shape `run --continue` needs; UserError when damaged."""
        from kohya_tuner.errors import UserError

        try:
            data = json.loads(safeio.read_regular(self.run_path, safeio.JOURNAL_BYTES).decode("utf-8"))
        except FileNotFoundError:
            raise UserError(f"{self.out} holds no kohya-tuner run ({RUN_FILE} is missing).",
                            "Give the --out folder of an earlier `kohya-tuner run`.") from None
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise UserError(f"{self.run_path} is damaged and cannot be read "
                            f"({getattr(exc, 'msg', None) or getattr(exc, 'strerror', None) or type(exc).__name__}); "
                            f"the run cannot be continued from it.", _DAMAGED_HINT) from None
        problem = run_file_problem(data)
        if problem:
            raise UserError(f"{self.run_path} is damaged: {problem}; the run cannot be continued from it.",
                            _DAMAGED_HINT)
        return data

    # -- attempts --

    def append(self, record: AttemptRecord) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        line = jsontext.dumps(record.to_json())
        durable.with_room(self.out, lambda: durable.append_line(self.attempts_path, line))
        durable.clear_pending(self.out, record.attempt)

    def attempts(self) -> list[AttemptRecord]:
        """Every attempt, including one whose final line never got written (its pending
        record: the supervisor was killed, or stopped by a second signal)."""
        out = self._journaled()
        return out + durable.pending_records(self.out, {a.attempt for a in out}, AttemptRecord.from_json)

    def _journaled(self) -> list[AttemptRecord]:
        try:
            raw = safeio.read_regular(self.attempts_path, safeio.JOURNAL_BYTES)
        except OSError:
            return []
        out: list[AttemptRecord] = []
        seen: set[int] = set()
        for line in raw.decode("utf-8", "replace").splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                rec = AttemptRecord.from_json(json.loads(line))
            except (ValueError, RecursionError):
                # A line cut short by a crash, or damage: every whole record still counts.
                continue
            if rec.attempt not in seen:
                seen.add(rec.attempt)
                out.append(rec)
        return out

    def numbers_on_disk(self) -> set[int]:
        """Attempt numbers that were launched: a log or a pending record names them."""
        try:
            names = os.listdir(self.out)
        except OSError:
            return set()
        found = set()
        for name in names:
            m = _ATTEMPT_FILE.match(name)
            if m and len(m.group(1)) < 10:
                found.add(int(m.group(1)))
        return found

    def next_attempt_number(self) -> int:
        """One past every attempt the journal or the folder knows of: an attempt whose
        record was lost still owns its log, config and states, never to be written over."""
        used = {a.attempt for a in self.attempts()} | self.numbers_on_disk()
        return max(used, default=0) + 1

    # -- outcome --

    def write_summary(self, summary: dict[str, Any]) -> None:
        text = jsontext.dumps(summary, indent=2) + "\n"
        durable.with_room(self.out, lambda: atomic_write(self.summary_path, text))

    def read_summary(self) -> dict[str, Any] | None:
        try:
            data = json.loads(safeio.read_regular(self.summary_path, safeio.JOURNAL_BYTES).decode("utf-8"))
        except (OSError, ValueError, RecursionError):  # absent or damaged: the run is not done
            return None
        return data if isinstance(data, dict) else None

    def write_report(self, html: str) -> None:
        durable.with_room(self.out, lambda: atomic_write(self.report_path, html))


# A config alone was prepared (a dry run), never launched: its number is free.
_ATTEMPT_FILE = re.compile(r"attempt-(\d+)\.(?:log|pending\.json)$")
_DAMAGED_HINT = ("Start a new run in another --out; the LoRA files and states already in this folder's "
                 "output/ stay where they are.")
_RUN_FIELDS = {"family": str, "script": str, "python": str, "plan_config": dict}


def run_file_problem(data: Any) -> str | None:
    """Why `data` is not a run.json `run --continue` can use, or None."""
    if not isinstance(data, dict):
        return f"it holds {type(data).__name__ if data is not None else 'null'}, not the run's settings"
    for key, kind in _RUN_FIELDS.items():
        if key not in data:
            return f"{key} is missing"
        if not isinstance(data[key], kind):
            return f"{key} is {json.dumps(data[key])[:40]}, not {'an object' if kind is dict else 'a string'}"
    if valid_step(data.get("total_steps")) is None or data["total_steps"] < 1:
        return "total_steps is not a positive step count"
    return None


def known_states(attempts: list[AttemptRecord]) -> list[StateRecord]:
    """Every state the journal recorded that still exists on disk, oldest step first."""
    seen: dict[str, StateRecord] = {}
    for a in attempts:
        for s in a.states:
            seen[s.path] = s
    alive = [s for s in seen.values() if (Path(s.path) / "train_state.json").is_file()]
    return sorted(alive, key=lambda s: (s.step, s.attempt))


def newest_state(attempts: list[AttemptRecord]) -> StateRecord | None:
    states = known_states(attempts)
    return states[-1] if states else None


def read_train_state(state_dir: str | os.PathLike) -> dict[str, Any] | None:
    """sd-scripts' `train_state.json` ({"current_epoch": e, "current_step": s}) or None."""
    try:
        data = json.loads(safeio.read_regular(Path(state_dir) / "train_state.json", safeio.JOURNAL_BYTES).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def summarize(attempts: list[AttemptRecord], *, status: str, reason: str, total_steps: int | None,
              final_config: dict[str, Any] | None, plan_config: dict[str, Any] | None,
              lora_path: str | None, gpu: dict[str, Any] | None = None,
              continue_command: str | None = None, history_note: str | None = None) -> dict[str, Any]:
    """The run's outcome in one dict (summary.json), computed from the attempt records.

    steps_done counts the optimizer steps really trained, over all attempts of the run (a
    probe's excluded); steps_redone the part of them an OOM threw away (trained after the
    state the next attempt resumed from, or all of them before a restart from step 0)."""
    probes = [a for a in attempts if a.probe]
    attempts = [a for a in attempts if not a.probe]
    failed = [a for a in attempts if a.failed]
    # Steps a failed attempt trained beyond the state the next attempt started from are
    # lost, and so is the share of its time they took; the rest carried over.
    lost_steps = 0
    lost_s = 0.0
    for i, a in enumerate(attempts):
        if not a.failed:
            continue
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        if nxt is None:
            kept_to = a.end_step  # nothing redone (yet)
        else:
            kept_to = nxt.start_step  # 0 for a restart; a state's or saved weights' step otherwise
        # A later restart from step 0 (or a resume from an earlier state) throws these away too.
        for b in attempts[i + 2:]:
            kept_to = min(kept_to, b.start_step)
        done = max(0, a.end_step - a.start_step)
        kept = max(0, min(kept_to, a.end_step) - a.start_step)
        lost_steps += done - kept
        if a.outcome != "interrupted":
            # A stop the user asked for is no time lost to a failure, though its unsaved steps are redone.
            lost_s += a.duration_s * (1 - kept / done) if done else a.duration_s
    peaks = [a.peak_vram_gib for a in attempts if a.peak_vram_gib is not None]
    worked = None
    if final_config is not None and plan_config is not None:
        worked = {k: {"plan": plan_config.get(k), "final": final_config.get(k)}
                  for k in sorted(set(plan_config) | set(final_config))
                  if plan_config.get(k) != final_config.get(k) and k not in _BOOKKEEPING}
    return {
        "status": status,
        # The last attempt's outcome (OUTCOMES): what `status` "failed" was, e.g. nan_loss.
        "outcome": attempts[-1].outcome if attempts else (probes[-1].outcome if probes else None),
        "reason": reason,
        "lora": lora_path,
        "attempts": len(attempts) + len(probes),
        "failed_attempts": len(failed) + len([a for a in probes if a.failed]),
        "time_lost_s": round(lost_s, 1),
        "steps_redone": lost_steps,
        "steps_lost": lost_steps,  # the earlier name of steps_redone
        "total_steps": total_steps,
        "steps_done": sum(max(0, a.end_step - a.start_step) for a in attempts),
        "reached_step": max((a.end_step for a in attempts), default=0),
        "probe_steps_done": sum(max(0, a.end_step - a.start_step) for a in probes),
        "peak_vram_gib": round(max(peaks), 3) if peaks else None,
        "peak_vram_gib_final_attempt": attempts[-1].peak_vram_gib if attempts else None,
        "changed_settings": worked,
        "final_config": final_config,
        "gpu": gpu,
        "continue_command": continue_command,
        "history": history_note,
        "finished": now_iso(),
    }


# Keys the supervisor sets on every resumed attempt; they are not "settings that changed".
_BOOKKEEPING = {"resume", "skip_until_initial_step", "initial_step", "console_log_simple"}
