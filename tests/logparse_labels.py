"""The labelled real logs, both sets, read the same way for the tests and for
benchmarks/phase_accuracy.py.

- tests/data/public_logs/: logs users posted in public issue threads, `labels.json` a list of
  objects (file, url, wrapper, family, oom, kind, phase, first_step, step, total_steps, figures,
  process_is_trainer, …; see its README.md);
- ../shared/real-world/logs/: the older set, `labels.json` an object per file (is_oom, kind,
  phase as `training_step_N`, step, total_steps, tool, model_family, …).

Only the label's own words are mapped here (its phase names to the diagnose enum, its free-text
wrapper to the names the parser reports); what a log should give is never written here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = ROOT / "tests" / "data" / "public_logs"
SHARED = ROOT.parent / "shared" / "real-world" / "logs"

# The wrapper names the parser reports, most specific first (frames.toml's order), and how a
# label's free text spells them. The web UI's Dreambooth trainer is the extension's code before it
# left the web UI's pull requests for its own repository: both are "a1111-dreambooth".
WRAPPER_WORDS = (("kohya_ss", ("kohya_ss",)), ("fluxgym", ("fluxgym",)), ("ai-toolkit", ("ai-toolkit",)),
                 ("onetrainer", ("onetrainer",)), ("simpletuner", ("simpletuner",)),
                 ("musubi-tuner", ("musubi",)), ("comfyui", ("comfyui",)),
                 ("a1111-dreambooth", ("sd_dreambooth_extension", "web ui dreambooth")), ("diffusers", ("diffusers",)),
                 ("lora-scripts", ("lora-scripts",)), ("sd-scripts", ("sd-scripts", "sd_scripts")))
# Families the parser can name.
FAMILIES = ("sd15", "sdxl", "flux", "sd3", "hunyuan_video", "wan", "lumina", "hunyuan_image")
_SHARED_PHASE = {"training_step_N": "training"}


@dataclass
class Fixture:
    name: str  # "public/001" or "shared/001"
    path: Path
    url: str | None
    phases: frozenset[str]  # the diagnose phases the label allows (two when it cannot tell the step)
    kind: str  # cuda_oom, cpu_oom, cuda_error, truncated, incomplete, other, success (the label's word)
    step: int | None = None
    total_steps: int | None = None
    wrapper: str | None = None  # a name the parser reports, when the label names one
    wrappers_named: frozenset[str] = frozenset()  # every such name the label mentions
    family: str | None = None  # a family the parser can name, when the label names one
    label: dict = field(default_factory=dict)

    @property
    def held_out(self) -> bool:
        """Collected and labelled after the parser's rules were written (never tuned on)."""
        return self.label.get("collected") == "after_rules"

    @property
    def group(self) -> str:
        """`shared`, `public` (the logs the rules were developed with) or `held-out`."""
        return "held-out" if self.held_out else self.name.split("/")[0]


def label_wrapper(text: str | None) -> tuple[str | None, frozenset[str]]:
    low = (text or "").lower()
    named = [name for name, words in WRAPPER_WORDS if any(w in low for w in words)]
    return (named[0] if named else None), frozenset(named)


def _public_phases(label: dict) -> frozenset[str]:
    phase = label["phase"]
    if phase != "training":
        return frozenset({phase})
    first = label.get("first_step")
    if first is None:
        return frozenset({"first_step", "training"})
    return frozenset({"first_step" if first else "training"})


def public_fixtures() -> list[Fixture]:
    path = PUBLIC / "labels.json"
    if not path.exists():
        return []
    out = []
    for label in json.loads(path.read_text(encoding="utf-8")):
        wrapper, named = label_wrapper(label.get("wrapper"))
        family = label.get("family")
        out.append(Fixture(
            name=f"public/{label['file'][:-4]}", path=PUBLIC / label["file"], url=label.get("url"),
            phases=_public_phases(label), kind=label["kind"], step=label.get("step"),
            total_steps=label.get("total_steps"), wrapper=wrapper, wrappers_named=named,
            family=family if family in FAMILIES else None, label=label))
    return out


def shared_fixtures() -> list[Fixture]:
    path = SHARED / "labels.json"
    if not path.exists():
        return []
    out = []
    for file, label in sorted(json.loads(path.read_text(encoding="utf-8")).items()):
        wrapper, named = label_wrapper(label.get("tool"))
        family = label.get("model_family")
        kind = {"other_error": "other"}.get(label["kind"], label["kind"])
        out.append(Fixture(
            name=f"shared/{file[:-4]}", path=SHARED / file, url=(label.get("source") or {}).get("url"),
            phases=frozenset({_SHARED_PHASE.get(label["phase"], label["phase"])}), kind=kind,
            step=label.get("step"), total_steps=label.get("total_steps"), wrapper=wrapper, wrappers_named=named,
            family=family if family in FAMILIES else None, label=label))
    return out


def all_fixtures() -> list[Fixture]:
    return shared_fixtures() + public_fixtures()


def kind_matches(kind: str, d) -> bool:
    """Whether a diagnosis gives the outcome and error kind a label's `kind` names: `truncated` is a
    cut traceback (an error of that kind), `incomplete` a text cut before any traceback or error
    line (an unfinished run, no error)."""
    if kind == "cuda_oom":
        return d.outcome == "oom" and d.error is None
    if kind == "cpu_oom":
        return d.outcome == "cpu_oom" and d.error is not None and d.error.kind == "cpu_oom"
    if kind in ("cuda_error", "truncated"):
        return d.outcome == "error" and d.error is not None and d.error.kind == kind
    if kind == "other":
        return d.outcome == "error" and d.error is not None and d.error.kind not in ("cpu_oom", "cuda_error")
    if kind == "incomplete":
        return d.outcome == "incomplete" and d.error is None
    if kind == "success":
        return d.outcome == "success"
    raise ValueError(f"unknown label kind {kind!r}")


def diagnose_fixture(fx: Fixture):
    """The diagnosis `kohya-tuner diagnose` gives: the file read from disk, bar runs coalesced."""
    from kohya_tuner.logparse import diagnose
    from kohya_tuner.logparse.reader import iter_events, open_log

    return diagnose(iter_events(open_log(fx.path), coalesce_progress=True))
