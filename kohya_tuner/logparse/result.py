"""What `diagnose` returns: the JSON schema (Diagnosis) and what it knows beyond it (details).

Its own module so that the advice (which reads a Diagnosis) and the diagnosis (which asks for
advice) both import it and not each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, PrivateAttr

from kohya_tuner.logparse.events import OomFigures

# The outcome vocabulary shared with `run` (docs/json.md); a log cannot show a hang or an
# interruption by kohya-tuner, so diagnose never says those two.
Outcome = Literal["oom", "cpu_oom", "error", "success", "incomplete"]
Phase = Literal["model_load", "cache_latents", "cache_text_encoder", "first_step", "training", "sampling", "saving",
                "unknown"]
ErrorKind = Literal["cpu_oom", "missing_file", "bad_argument", "nan_loss", "xformers", "bitsandbytes", "cuda_error",
                    "cuda_unavailable", "distributed", "dtype", "truncated", "other"]
# Families the advice has specific settings for; any other family gets the general advice.
ADVISED_FAMILIES = ("sd15", "sdxl", "flux")


class OomInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    tried_gib: Optional[float] = None
    capacity_gib: Optional[float] = None
    free_gib: Optional[float] = None
    process_in_use_gib: Optional[float] = None
    allocated_gib: Optional[float] = None
    reserved_unallocated_gib: Optional[float] = None


class ErrorInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: ErrorKind
    message: str


@dataclass
class DiagnosisDetails:
    """What the diagnosis knows beyond the JSON schema: for rendering and for `run`."""

    family: str | None = None
    # Where the family came from: "log" (read from it), "given" (the caller's), None.
    family_source: str | None = None
    wrapper: str | None = None
    exit_status: int | None = None
    model_saved: bool = False
    last_checkpoint: str | None = None
    last_state: str | None = None
    resumed_from: str | None = None
    oom_figures: OomFigures | None = None
    held_elsewhere_gib: float | None = None
    other_processes: tuple[tuple[int, float], ...] = ()
    # The pid PyTorch listed among "other" processes that is the trainer itself.
    trainer_pid: int | None = None
    fragmented: bool = False
    on_cpu: bool = False
    # Training processes (one per GPU), when the log shows more than one.
    processes: int | None = None
    # The rank whose OOM explains the run (its `[rankN]:` prefix), when the log names one.
    failed_rank: int | None = None
    last_milestone: str | None = None
    # What decided the phase: "frames", "context" (a milestone before it), "after" (one right
    # after it), "progress" (a step seen), None.
    phase_evidence: str | None = None
    # The traceback evidence in words ("the optimizer step", "caching latents (VAE encode)").
    frame: str | None = None
    # For a cut-off traceback: "oom" when the wording around it says out of memory, or the kind
    # a warning before it names; None when nothing does.
    suspected: str | None = None
    # False when the failure has no error message of its own (killed, an exit status only, a
    # cut-off traceback): the advice must not claim what the cause was not.
    error_line: bool = True
    events: int = 0
    # Failures logged before `model saved.` that did not stop the run.
    survived: list[str] = field(default_factory=list)

    @property
    def advised_family(self) -> str | None:
        return self.family if self.family in ADVISED_FAMILIES else None


class Diagnosis(BaseModel):
    """Exactly the `diagnose --json` schema; `details` carries the rest."""

    outcome: Outcome
    phase: Phase
    step: Optional[int] = None
    total_steps: Optional[int] = None
    last_loss: Optional[float] = None
    oom: Optional[OomInfo] = None
    error: Optional[ErrorInfo] = None
    family: Optional[str] = None
    wrapper: Optional[str] = None
    advice: list[str] = []

    _details: DiagnosisDetails = PrivateAttr(default_factory=DiagnosisDetails)

    @property
    def details(self) -> DiagnosisDetails:
        return self._details

    def to_json(self) -> dict:
        return self.model_dump(mode="json")
