"""Typed events read from sd-scripts output.

Every event is a frozen dataclass with a `kind` (its type; for Failure, the error kind)
and the cleaned text it came from in `line`. The parser emits them in the order the trainer printed them;
`diagnose` turns a sequence of them into one Diagnosis.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

# The phases a failure can belong to, in the order a run goes through them.
PHASES = ("model_load", "cache_latents", "cache_text_encoder", "first_step", "training", "sampling", "saving",
          "unknown")
# Phases a Milestone can name (first_step is decided from the step count). A milestone saying
# `unknown` is a run doing what belongs to no phase yet (reading its dataset, a host application
# setting a training run up): what was printed before it no longer says where the run is.
# The caching passes.
CACHE_PHASES = ("cache_latents", "cache_text_encoder")
MILESTONE_PHASES = ("model_load", "cache_latents", "cache_text_encoder", "training", "sampling", "saving",
                    "unknown")
# error.kind values of the diagnose JSON, and Failure.kind values. `truncated`: the log stops
# inside a traceback, so the error line that would name the failure is missing.
ERROR_KINDS = ("cpu_oom", "missing_file", "bad_argument", "nan_loss", "xformers", "bitsandbytes",
               "cuda_error", "cuda_unavailable", "distributed", "dtype", "truncated", "other")


@dataclass(frozen=True, kw_only=True)
class Event:
    kind: ClassVar[str] = "event"
    line: str = ""

    @property
    def event_type(self) -> str:
        """The event's type name; equal to `kind` except for Failure, whose `kind` is the error kind."""
        return "failure" if isinstance(self, Failure) else self.kind

    def to_dict(self) -> dict[str, Any]:
        data = {"event": self.event_type, "kind": self.kind}
        data.update(asdict(self))
        return data


@dataclass(frozen=True, kw_only=True)
class Progress(Event):
    """One refresh of the main `steps` bar. `step` and `total` are the bar's own numbers,
    which restart after a resume; `rate` is in optimizer steps per second."""

    kind: ClassVar[str] = "progress"
    step: int
    total: int
    loss: float | None = None
    rate: float | None = None


@dataclass(frozen=True, kw_only=True)
class EpochStart(Event):
    kind: ClassVar[str] = "epoch"
    epoch: int
    total: int | None = None


@dataclass(frozen=True, kw_only=True)
class Milestone(Event):
    kind: ClassVar[str] = "milestone"
    phase: str
    name: str
    # The phase names the whole process: a command line that runs a script, or a record of a
    # caching script's own logger. A caching script's start-up (its model, its dataset) is its pass.
    process: bool = False


# A cache's record that an entry was not found or could not be read ("(TextEmbeddingCache) Failed
# retrieving prompt from cache"): while steps are counted it is the training step reading its
# cache, and says no caching phase (diagnosis.py).
CACHE_READ = "an entry missing from a cache"
# The training bar redrawn but cut before its count ("steps:  25%|███▌"): training went on, at a step
# the text does not show.
BAR_REDRAWN = "the training bar redrawn"
# A dataset looking up its cache files ("Text encoder output cache file not found: …"): start-up as
# the dataset is read; inside a caching pass or a step, that pass's or step's own work (diagnosis.py).
CACHE_LOOKUP = "cache files looked up"
# The job's settings or parsed arguments printed by name: printed as it starts; once steps are
# counted, a summary (on the way out, say) and no phase (diagnosis.py).
SETTINGS_PRINTED = "the job's settings printed"
# A trainer's header announcing its training loop ("running training / 学習開始", "***** Running training
# *****", "Start training", a bare "training..."): printed before the first step, so start-up until a
# bar, an epoch line, a step or a frame of the step shows the loop began.
TRAINING_HEADER = "running training"
# sd-scripts' "checking cache validity...": the caching pass under way, whichever it is (latents
# when none is named before it).
CACHE_CHECK = "checking a cache's validity"
# A record (INFO, DEBUG or WARNING) that no rule reads: the job, or whatever runs it, was logging.
# It places nothing by itself; a failure nothing else places, with no step counted, was in start-up
# (the start-up convention: everything before the first step but a caching pass or a sample).
JOB_RECORD = "a record that names no stage"


@dataclass(frozen=True, kw_only=True)
class TotalSteps(Event):
    kind: ClassVar[str] = "total_steps"
    total: int


@dataclass(frozen=True, kw_only=True)
class Saved(Event):
    """A model file ("checkpoint") or an accelerate state directory ("state") being written."""

    kind: ClassVar[str] = "saved"
    what: str
    path: str


@dataclass(frozen=True, kw_only=True)
class Resumed(Event):
    """`resume training from local state: PATH` (path) or `skipping N steps` (skipped)."""

    kind: ClassVar[str] = "resumed"
    path: str | None = None
    skipped: int | None = None


@dataclass(frozen=True, kw_only=True)
class OomFigures:
    """What PyTorch said about the failed allocation, in GiB. None where the message lacks it."""

    tried_gib: float | None = None
    capacity_gib: float | None = None
    free_gib: float | None = None
    process_in_use_gib: float | None = None
    allocated_gib: float | None = None
    reserved_unallocated_gib: float | None = None
    message: str = ""
    device: int | None = None
    # Other processes PyTorch named as holding memory on the same GPU: (pid, GiB).
    other_processes: tuple[tuple[int, float], ...] = ()
    # The pid PyTorch listed as "Process N has X GiB" that is the trainer itself (in a container
    # PyTorch cannot tell its own pid); its X is then process_in_use_gib.
    trainer_pid: int | None = None

    def schema_dict(self) -> dict[str, float | None]:
        return {
            "tried_gib": self.tried_gib,
            "capacity_gib": self.capacity_gib,
            "free_gib": self.free_gib,
            "process_in_use_gib": self.process_in_use_gib,
            "allocated_gib": self.allocated_gib,
            "reserved_unallocated_gib": self.reserved_unallocated_gib,
        }

    @property
    def held_elsewhere_gib(self) -> float | None:
        """GPU memory neither free nor held by this process: other programs and drivers."""
        if self.other_processes:
            return sum(g for _, g in self.other_processes)
        if self.capacity_gib is None or self.free_gib is None:
            return None
        mine = self.process_in_use_gib
        if mine is None and self.allocated_gib is not None:
            # Older messages give only PyTorch's own share; the CUDA context is extra.
            mine = self.allocated_gib + (self.reserved_unallocated_gib or 0.0)
        if mine is None:
            return None
        return max(0.0, self.capacity_gib - self.free_gib - mine)

    @property
    def fragmented(self) -> bool:
        """Reserved-but-unallocated memory large enough that the request should have fit."""
        ru = self.reserved_unallocated_gib
        if ru is None or ru < 0.25:
            return False
        reserved = (self.allocated_gib or 0.0) + ru
        return (self.tried_gib is not None and ru >= self.tried_gib) or (reserved > 0 and ru >= 0.1 * reserved)


@dataclass(frozen=True, kw_only=True)
class Oom(Event):
    """A GPU out-of-memory. `where` is the phase the traceback frames point at, if any; `frame`
    the evidence in words and `frame_level` how telling it is (see frames.toml)."""

    kind: ClassVar[str] = "oom"
    figures: OomFigures = field(default_factory=OomFigures)
    where: str | None = None
    frame: str | None = None
    frame_level: int | None = None
    # The rank that ran out (the `[rankN]:` prefix torchrun puts on each rank's lines).
    rank: int | None = None


# A Failure's `frame` where the program's own report of the error named the phase ("An error occurred
# during training: …"), not its frames.
REPORTED_WHERE = "the trainer's own report of where it failed"


@dataclass(frozen=True, kw_only=True)
class Failure(Event):
    """Anything else that stops or spoils a run; `kind` is one of ERROR_KINDS."""

    # Unlike the other events, `kind` here is the error kind (the diagnose JSON's error.kind).
    kind: str
    message: str
    where: str | None = None
    frame: str | None = None
    frame_level: int | None = None
    # For a `truncated` failure: what the wording around it suggests ("oom", or an error kind
    # named by a warning shortly before), None when nothing does.
    suspected: str | None = None
    # A traceback cut before its error line that was raised while handling the error logged before
    # it ("During handling of the above exception…"): the run ended in this one, not in that.
    chained: bool = False
    # An error record whose words name no specific kind ("ERROR No image folders found", "Error loading pipeline:
    # …"), no exception after it: a run survives many such records, so the parser gives it only where nothing
    # after it shows the run going on (the log ends with it, or with the launcher's exit).
    tentative: bool = False


@dataclass(frozen=True, kw_only=True)
class Finished(Event):
    """sd-scripts' last log record, `model saved.`: the final model file is written."""

    kind: ClassVar[str] = "finished"


@dataclass(frozen=True, kw_only=True)
class Exited(Event):
    """The launcher reported how the trainer ended: a status (negative = signal), or
    None when a launcher traceback shows a failure without the number."""

    kind: ClassVar[str] = "exited"
    status: int | None = None


@dataclass(frozen=True, kw_only=True)
class ModelFamily(Event):
    """The log names a model family (an entry script, a class or a model file only it has);
    `strength` 1 is an entry script or class, 3 an ambiguous hint (frames.toml)."""

    kind: ClassVar[str] = "family"
    family: str
    strength: int = 1


@dataclass(frozen=True, kw_only=True)
class Processes(Event):
    """The run trains on this many processes (one per GPU): a `[rank1]:` prefix, sd-scripts'
    "loading model for process 0/2", accelerate's `--num_processes 2` or "Num processes: 2"."""

    kind: ClassVar[str] = "processes"
    count: int


@dataclass(frozen=True, kw_only=True)
class Restart(Event):
    """The log's opening lines again, word for word: a second copy of the output (a log pasted twice,
    a file appended to by a relaunch that prints the same). What follows is read as a run of its own."""

    kind: ClassVar[str] = "restart"


@dataclass(frozen=True, kw_only=True)
class Wrapper(Event):
    """The log shows which tool ran the trainer (kohya_ss, fluxgym, lora-scripts, ai-toolkit, onetrainer,
    simpletuner, musubi-tuner, comfyui, or sd-scripts itself)."""

    kind: ClassVar[str] = "wrapper"
    wrapper: str
