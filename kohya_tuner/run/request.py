"""What `run` is asked to do, and what planning it hands back to be shown and launched.

The CLI fills a request from its flags; `run/start.py` turns it into these objects. They
carry data only: how each is shown (rich or `--json`) is the CLI's business."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from kohya_tuner.errors import UserError

if TYPE_CHECKING:
    from kohya_tuner.planfiles import Written
    from kohya_tuner.planning import FittedPlan
    from kohya_tuner.presets import Plan
    from kohya_tuner.run.policy import Retry
    from kohya_tuner.run.preflight import Report
    from kohya_tuner.run.settings import RunSettings


@dataclass(frozen=True)
class RunRequest:
    """A new run, as the user asked for it (flags, unresolved: `gpu` may be 'auto')."""

    model: str
    job: str
    gpu: str
    out: Path
    data: Path
    base: str | None = None
    clip_l: str | None = None
    t5xxl: str | None = None
    ae: str | None = None
    trigger: str | None = None
    name: str = "lora"
    steps: int | None = None
    variant: str | None = None
    preset: Path | None = None
    sets: tuple[str, ...] = ()
    files: Mapping[str, str | None] = field(default_factory=dict)  # the newer families' model-file flags
    network: str | None = None
    gpu_arch: str | None = None
    sd_scripts: Path | None = None
    python: str | None = None
    dry_run: bool = False
    max_attempts: int | None = None
    probe_steps: int | None = None
    emulate_vram: float | None = None
    gpus: str | None = None
    accelerate_config: Path | None = None
    json_events: Path | None = None
    strict: bool = False
    strict_pin: bool = False
    hang_timeout: float | None = None
    cpu: bool = False
    policy: str = "default"
    no_fit: bool = False
    force: bool = False


@dataclass(frozen=True)
class ContinueRequest:
    """`run --continue OUT`: only how the run is watched may change, not what it trains."""

    out: Path
    max_attempts: int | None = None
    hang_timeout: float | None = None
    json_events: Path | None = None
    python: str | None = None
    cpu: bool = False
    dry_run: bool = False


@dataclass(frozen=True)
class Launch:
    """What the supervisor needs to start: the run's fixed settings and its first attempt."""

    settings: RunSettings
    first: Retry
    first_attempt: int
    probe: bool
    events_file: Path | None


@dataclass(frozen=True)
class PreparedRun:
    """A new run planned, checked and written: what to show, and what to launch."""

    family_label: str
    job: str
    cpu: bool
    gpu_described: str
    emulate_vram: float | None
    plan: Plan
    fitted: FittedPlan
    fit_lines: list[str]
    peak_gib: float
    peak_phase: str | None
    correction: float
    budget_gib: float
    checks: Report
    written: Written
    argv: list[str]
    env_added: dict[str, str]
    summary: dict[str, Any]  # the --json object (docs/json.md), without "dry_run"
    out: Path
    dry_run: bool
    launch: Launch


@dataclass(frozen=True)
class Continuation:
    """Where `run --continue` stands: finished already, a preview (--dry-run), or a launch."""

    finished: dict[str, Any] | None = None  # summary.json of a run that already succeeded
    preview: dict[str, Any] | None = None
    launch: Launch | None = None


class PreflightFailed(UserError):
    """Pre-flight refused the launch; the whole report comes along so it can be shown."""

    def __init__(self, message: str, report: Report):
        super().__init__(message)
        self.report = report
