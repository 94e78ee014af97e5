"""The evidence table (frames.toml): traceback frames to phases, and the lines that name the
wrapper and the model family.

Pure lookups over strings; the table is data so that a frame seen in a new user's log is one
entry, not a branch. Loaded once, on first use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

_TABLE = Path(__file__).with_name("frames.toml")
# An option read from the parsed arguments (`args.cache_text_encoder_outputs`, `self.args.cache_latents`)
# names a setting, not a call: a phase's words in it say nothing of what ran, so the rules see it
# as `args.option`. A method called on the arguments is left as it is.
_ARG_READ_RE = re.compile(r"\bargs\.\w+\b(?!\s*\()")
# The phase a frame rule names for the training step; the progress evidence splits it into
# first_step and training.
STEP = "step"


@dataclass(frozen=True)
class FrameRule:
    phase: str
    what: str
    level: int
    rx: re.Pattern
    # The files a Python warning names that say this rule's phase (None: no warning does).
    warning: re.Pattern | None = None
    # A [[message]] rule read only for an error printed with no traceback frames at all.
    frameless: bool = False
    # Counts only in a traceback that holds a frame of the job's own code (`[[job_code]]`).
    job: bool = False


@dataclass(frozen=True)
class FrameEvidence:
    """What the frames of one traceback show: the phase (`step` for the training step), the
    evidence in words, how telling it is (1 = the trainer's own call, 3 = generic internals)
    and the frame line it came from."""

    phase: str
    what: str
    level: int
    line: str

    @property
    def diagnose_phase(self) -> str:
        return "training" if self.phase == STEP else self.phase


@dataclass(frozen=True)
class _Named:
    name: str
    strength: int
    rx: re.Pattern
    # Plain substrings one of which every match contains: the pattern runs only when one is in
    # the line.
    needles: tuple[str, ...]
    # The name says the family only as the script run, not as a module that logged.
    entry_only: bool = False

    def search(self, low: str) -> bool:
        for needle in self.needles:
            if needle in low:
                return self.rx.search(low) is not None
        return False


@dataclass(frozen=True)
class _Table:
    frames: tuple[FrameRule, ...]
    wrappers: tuple[_Named, ...]
    families: tuple[_Named, ...]
    # Every needle of every wrapper and family: a line without any is not looked at further.
    triggers: tuple[str, ...]
    # (pattern, the strongest family evidence a line it matches gives) (`[[weak_family]]`).
    weak: tuple[tuple[re.Pattern, int], ...]
    # A frame line from which on a traceback imports a script (`[[import]]`); None: no such rule.
    imports: re.Pattern | None
    # Error lines whose words say what failed (`[[message]]`).
    messages: tuple[FrameRule, ...] = ()
    # (script frame, import source line, import error, missing-script line) of `[[start_up]]`.
    start_up: tuple[re.Pattern, re.Pattern, re.Pattern, re.Pattern] | None = None
    # The `what` of [[frame]] rules marked `loop`: a loop that runs other phases inside it.
    loops: frozenset[str] = frozenset()
    # (a box's frame row -> file and function, files that are not the job's, a plain frame line ->
    # its file) of `[[job_code]]`.
    job_code: tuple[re.Pattern, re.Pattern, re.Pattern] | None = None


@lru_cache(maxsize=1)
def table() -> _Table:
    data = tomllib.loads(_TABLE.read_text(encoding="utf-8"))
    frames = tuple(FrameRule(r["phase"], r["what"], int(r["level"]), re.compile(r["match"]),
                             re.compile(r["warning"]) if r.get("warning") else None, job=bool(r.get("job", False)))
                   for r in data["frame"])
    # The list order is the specificity order for wrappers: sd-scripts (last) only when nothing else shows.
    wrappers = tuple(_Named(r["name"], i, re.compile(r["match"]), tuple(r["needles"]))
                     for i, r in enumerate(data["wrapper"]))
    families = tuple(_Named(r["name"], int(r["strength"]), re.compile(r["match"]), tuple(r["needles"]),
                            bool(r.get("entry_only", False)))
                     for r in data["family"])
    # Shortest first: a short needle ("xl", ".py"-free "flux") is the likeliest to be found.
    triggers = tuple(sorted({n for e in wrappers + families for n in e.needles}, key=len))
    # A needle that contains another is never the first found: drop it from the triggers.
    triggers = tuple(t for t in triggers if not any(o != t and o in t for o in triggers))
    weak = tuple((re.compile(r["match"]), int(r["strength"])) for r in data.get("weak_family", ()))
    imports = [r["match"] for r in data.get("import", ())]
    messages = tuple(FrameRule(r["phase"], r["what"], int(r["level"]), re.compile(r["match"]),
                               frameless=bool(r.get("frameless", False)))
                     for r in data.get("message", ()))
    jc = data.get("job_code", ())
    job_code = (re.compile("|".join(f"(?:{r['frame']})" for r in jc)),
                re.compile("|".join(f"(?:{r['library']})" for r in jc), re.IGNORECASE),
                re.compile("|".join(f"(?:{r['file']})" for r in jc))) if jc else None
    su = data.get("start_up", ())
    start_up = tuple(re.compile("|".join(f"(?:{r[k]})" for r in su)) for k in ("script", "source", "error", "line"))
    return _Table(frames, wrappers, families, triggers, weak,
                  re.compile("|".join(f"(?:{m})" for m in imports)) if imports else None, messages,
                  start_up if su else None,  # type: ignore[arg-type]
                  frozenset(r["what"] for r in data["frame"] if r.get("loop")), job_code)


def runs_other_phases(what: str | None) -> bool:
    """Whether frame evidence (its `what`) is a loop that also runs other phases inside it (a
    `loop` rule): a milestone of such a phase before the failure says more than the loop does."""
    return what is not None and what in table().loops


_BOX_FRAME_HEAD_RE = re.compile(r"\.py:\d+ in [\w<>.]+")


def _context_rows(frames: list[str] | tuple[str, ...]) -> frozenset[int]:
    """The rows of source a Rich box shows around the line that ran (marked ❱), in the frames whose
    ❱ row is there: code shown, not run. Where the paste cut a frame's ❱ row, its other rows are the
    nearest evidence left and are kept."""
    if not any(line[:1] == "❱" for line in frames):
        return frozenset()
    out: set[int] = set()
    group: list[int] = []
    marked = False
    for i, line in enumerate(frames):
        if _BOX_FRAME_HEAD_RE.search(line) and not line[:1].isdigit() and line[:1] != "❱":
            if marked:
                out.update(group)
            group, marked = [], False
        elif line[:1] == "❱":
            marked = True
        elif line[:1].isdigit() and _SOURCE_ROW_RE.match(line):
            group.append(i)
    if marked:
        out.update(group)
    return frozenset(out)


def frame_evidence(frames: list[str] | tuple[str, ...]) -> FrameEvidence | None:
    """The strongest evidence in a traceback's frames (outermost first within a level). The
    frames below a script's re-import (a spawned child's) are left out: they say no phase."""
    best: FrameEvidence | None = None
    t = table()
    rules = t.frames
    imports = t.imports
    job: bool | None = None  # whether a frame is the job's own code, looked up when a rule asks
    shown = _context_rows(frames)
    for i, line in enumerate(frames):
        if not line or line[0] == "^" or i in shown:
            continue
        if imports is not None and imports.search(line):
            break
        seen = _ARG_READ_RE.sub("args.option", line) if "args." in line else line
        # A Rich box's frame row read in the plain form too, so a rule written for either form
        # ("…, in load_state_dict", "…:419 in load_state_dict") reads both.
        box = _RICH_FRAME_RE.match(seen.strip()) if " in " in seen and ".py:" in seen else None
        plain = _plain_frame(box) if box is not None else None
        for rule in rules:
            if best is not None and rule.level >= best.level:
                continue
            if rule.rx.search(seen) or (plain is not None and rule.rx.search(plain)):
                if rule.job:
                    if job is None:
                        job = has_job_frame(frames)
                    if not job:
                        continue
                best = FrameEvidence(rule.phase, rule.what, rule.level, line.strip()[:300])
                if best.level == 1:
                    return best
    return best


def has_job_frame(frames: list[str] | tuple[str, ...]) -> bool:
    """Whether a traceback holds a frame of the job's own code (`[[job_code]]`): a file that is not
    an installed package's, Python's own or a launcher's, in either frame format."""
    t = table()
    if t.job_code is None:
        return True
    box_re, library, file_re = t.job_code
    for line in frames:
        m = file_re.search(line) or box_re.search(line)
        if m is not None and not library.search(m.group("path").strip()):
            return True
    return False


def message_evidence(line: str, *, framed: bool = False) -> FrameEvidence | None:
    """What an error line's own words say failed (`[[message]]`), for an error whose frames say
    nothing; `framed`: it came with frames (which `frameless` rules leave to them)."""
    for rule in table().messages:
        if not (framed and rule.frameless) and rule.rx.search(line):
            return FrameEvidence(rule.phase, rule.what, rule.level, line.strip()[:300])
    m = _CALL_ERROR_RE.search(line)
    if m is not None:
        # "FluxNetworkTrainer.sample_images() takes 4 positional arguments but 10 were given": the
        # call that failed is named, and a frame calling it would say the same.
        name = m.group(1)
        return frame_evidence([f"{name}(", f'File "?", line 0, in {name}'])
    return None


# A TypeError naming the function whose call failed.
_CALL_ERROR_RE = re.compile(r"\b([A-Za-z_]\w*)\(\) (?:takes \d|takes from|got an unexpected keyword|got multiple values"
                            r"|missing \d+ required)")


_START_UP = "the training script failing before it started (its imports or top-level code)"
_FRAME_COMPLETE_RE = re.compile(r'", line \d+, in \S')


# A Rich traceback box's frame row ("/content/kohya-trainer/train_network.py:17 in <module>") and the row of
# source it stopped at ("❱  17 import library.train_util as train_util", with the box's indent glyphs).
_RICH_FRAME_RE = re.compile(r"^(?P<path>[^\s│┃\"]+\.py):(?P<line>\d+) in (?P<func>[\w<>.]+)\s*$")
_RICH_AT_RE = re.compile(r"^❱\s*\d+\s*(?:│\s*)*(?P<code>.*)$")


def _plain_frame(m: re.Match) -> str:
    """A Rich box's frame row (a `_RICH_FRAME_RE` match) as a plain traceback's frame line."""
    return f'File "{m["path"]}", line {m["line"]}, in {m["func"]}'


def _plain_rows(rows: list[str]) -> list[str]:
    """A Rich box's rows as a plain traceback's: each frame row as `File "…", line N, in f`, followed by the
    row of source its `❱` marks (other rows of source dropped), so one reading serves both forms."""
    if not any(_RICH_FRAME_RE.match(r.strip()) for r in rows):
        return rows
    out: list[str] = []
    for r in rows:
        s = r.strip()
        m = _RICH_FRAME_RE.match(s)
        if m is not None:
            out.append(_plain_frame(m))
            continue
        m = _RICH_AT_RE.match(s)
        if m is not None and out and out[-1].startswith('File "'):
            out.append("    " + m.group("code").strip())
        elif s.startswith('File "'):
            out.append(r)
    return out


def start_up_evidence(frames: list[str] | tuple[str, ...], error: str, *, cut: bool = False) -> FrameEvidence | None:
    """Start-up (`[[start_up]]`) for a traceback no frame rule placed: the training script failing in
    its imports or its own top-level code, before it did anything. `cut`: the traceback ends before
    its error line, so only a script's frame whose source line is an import says so (its first frame
    alone is every traceback's)."""
    t = table()
    if t.start_up is None:
        return None
    script, source, import_error, _ = t.start_up
    rows = _plain_rows([f for f in frames if f.strip() and f.lstrip()[0] != "^"])
    if t.imports is not None and any(t.imports.search(r) for r in rows):
        return None
    found = None
    for i, row in enumerate(rows):
        if script.search(row):
            below = rows[i + 1] if i + 1 < len(rows) else ""
            if source.search(below) or (not cut and (below.lstrip().startswith('File "') or not below)):
                found = row
                break
    if found is None:
        return None
    framed = [r for r in rows if r.lstrip().startswith('File "')]
    if cut and framed and not _FRAME_COMPLETE_RE.search(framed[-1]):
        framed.pop()  # the paste stops inside its last frame line
    top_level = all(r.rstrip().endswith(", in <module>") for r in framed)
    if top_level or import_error.search(error.strip()):
        return FrameEvidence("model_load", _START_UP, 2, found.strip()[:300])
    return None


# Weaker than every [[frame]] rule: it places a failure only where nothing else does (diagnosis.py).
JOB_CODE_LEVEL = 4
_JOB_CODE = "the job's own code before its first step (a traceback box cut in it, no rule reads its rows)"
# A box's last row ending so is a statement the paste's end cut ("train_dataset_group.").
_CUT_STATEMENT = (".", "(", "[", "{", ",", "=", "+", "-", "*", "/", "\\", "│")
# A Rich box's source row: "210 │   vae_dtype = …", "❱ 167 │   trainer.train(args)", an empty "211".
_SOURCE_ROW_RE = re.compile(r"^(?:❱\s*)?\d+(?:\s*│(?P<code>.*))?$")


def job_code_evidence(rows: list[str] | tuple[str, ...]) -> FrameEvidence | None:
    """Start-up by the convention (`[[job_code]]`) for a cut Rich traceback box no other rule placed:
    its last frame is a function of the job's own code and at least one row of that function's
    source is shown whole (not the box's last row when the paste's end cut its statement)."""
    t = table()
    if t.job_code is None:
        return None
    frame_re, library, _ = t.job_code
    rows = [r.strip() for r in rows if r.strip()]
    if t.imports is not None and any(t.imports.search(r) for r in rows):
        return None
    last = next((i for i in range(len(rows) - 1, -1, -1) if frame_re.search(rows[i])), None)
    if last is None:
        return None
    m = frame_re.search(rows[last])
    if m.group("func") == "<module>" or library.search(m.group("path")):
        return None
    shown = False
    for i, row in enumerate(rows[last + 1:], start=last + 1):
        sm = _SOURCE_ROW_RE.match(row)
        if sm is None:
            return None  # not a box's source rows
        code = (sm.group("code") or "").strip()
        shown = shown or bool(code and not (i == len(rows) - 1 and code.endswith(_CUT_STATEMENT)))
    if not shown:
        return None
    return FrameEvidence("model_load", _JOB_CODE, JOB_CODE_LEVEL, rows[last][:300])


def start_up_line_evidence(line: str) -> FrameEvidence | None:
    """Start-up for the interpreter's message that the training script it was to run is not there."""
    t = table()
    if t.start_up is not None and t.start_up[3].search(line):
        return FrameEvidence("model_load", "the training script could not be opened", 2, line.strip()[:300])
    return None


def warning_evidence(path: str) -> FrameEvidence | None:
    """The phase the file a Python warning was raised in says, by the rules marked `warning`."""
    for rule in table().frames:
        if rule.warning is not None and rule.warning.search(path):
            return FrameEvidence(rule.phase, rule.what, rule.level, path.strip()[:300])
    return None


def names_in(line: str, low: str | None = None, *, module: bool = False) -> tuple[str | None, tuple[str, int] | None]:
    """(wrapper, (family, strength)) a line names, each None when it names none. The wrapper
    is the most specific one in the line; the family the strongest. `low`: the line lower-cased,
    when the caller has it. `module`: the line is the name of a module that logged, which names
    no family by an entry script's name."""
    if low is None:
        low = line.lower()
    t = table()
    for trigger in t.triggers:
        if trigger in low:
            break
    else:
        return None, None
    wrapper = next((w.name for w in t.wrappers if w.search(low)), None)
    family = None
    for f in t.families:
        if (family is None or f.strength < family[1]) and not (module and f.entry_only) and f.search(low):
            family = (f.name, f.strength)
    if family is not None:
        for rx, weakest in t.weak:
            if family[1] < weakest and rx.search(line):
                family = (family[0], weakest)
    return wrapper, family


def wrapper_rank(name: str | None) -> int:
    """Lower is more specific; None ranks last."""
    if name is None:
        return 1 << 30
    for w in table().wrappers:
        if w.name == name:
            return w.strength
    return 1 << 29
