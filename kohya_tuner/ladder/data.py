"""Ladder data: the moves, relaxations and file swaps of data/ladder.toml, parsed and checked."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from kohya_tuner.errors import UserError
from kohya_tuner.families import Family

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib



LADDER_FILE = Path(__file__).resolve().parent.parent / "data" / "ladder.toml"

QUALITY_WORDS = {0: "none", 1: "small", 2: "noticeable", 3: "large"}
POLICIES = ("default", "roadmap")
# A move must save at least this much to count as a move.
MIN_SAVING_GIB = 0.01


# ---- data --------------------------------------------------------------------------


@dataclass(frozen=True)
class Move:
    name: str
    label: str
    description: str
    kind: str
    set: dict[str, Any] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    network_args: dict[str, str] = field(default_factory=dict)
    key: str = ""
    values: tuple[Any, ...] = ()
    map: dict[str, str] = field(default_factory=dict)
    families: tuple[str, ...] = ()
    facts: dict[str, Any] = field(default_factory=dict)
    config_when: dict[str, dict[str, Any]] = field(default_factory=dict)
    speed_cost: float = 0.0
    speed_note: str = ""
    quality_cost: int = 0
    quality_note: str = ""
    resume_safe: bool = True
    phases: tuple[str, ...] = ("training",)
    roadmap: int | None = None
    # False for what a CPU run cannot execute (fp8 weights, bitsandbytes, CUDA streams): `--cpu` skips it.
    cpu: bool = True
    # A cost that is neither speed nor the LoRA's quality (the previews a move takes away): it
    # orders moves that otherwise cost the same.
    cost_bias: float = 0.0

    @property
    def quality_text(self) -> str:
        word = QUALITY_WORDS.get(self.quality_cost, str(self.quality_cost))
        return self.quality_note if self.quality_note.startswith(word) else f"{word}: {self.quality_note}"


@dataclass(frozen=True)
class Relax:
    name: str
    label: str
    kind: str
    key: str = ""
    unset: tuple[str, ...] = ()
    map: dict[str, str] = field(default_factory=dict)
    speed_note: str = ""
    # How full the card may get through this relax: "target_high" (default) or "target_low".
    ceiling: str = "target_high"


@dataclass(frozen=True)
class FileSwap:
    """A file the user can swap and the fit cannot (it never rewrites a path the user gave)."""

    name: str
    key: str
    value: str
    label: str
    note: str = ""
    families: tuple[str, ...] = ()
    phases: tuple[str, ...] = ()
    # A current value containing one of these already is the cheaper file.
    unless_contains: tuple[str, ...] = ()

    def applies(self, config: dict[str, Any], family: Family, phase: str) -> bool:
        if self.families and family.name not in self.families:
            return False
        if self.phases and phase not in self.phases:
            return False
        current = str(config.get(self.key) or "").lower()
        return not any(m in current for m in self.unless_contains)


@dataclass(frozen=True)
class Ladder:
    moves: tuple[Move, ...]
    relaxes: tuple[Relax, ...]
    rank_floor: int
    tune_low: float
    tune_high: float
    file_swaps: tuple[FileSwap, ...] = ()
    caution_share: float = 0.95
    small_card_gb: float = 6.0
    # phase -> the moves `run` tries first, in order, after an OOM in that phase ([[phase_rule]]).
    phase_first: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def for_cpu(self) -> "Ladder":
        """The ladder without the moves a CPU cannot run."""
        from dataclasses import replace

        return replace(self, moves=tuple(m for m in self.moves if m.cpu))

    def move(self, name: str) -> Move:
        for m in self.moves:
            if m.name == name:
                return m
        raise KeyError(name)


_MOVE_KEYS = {"name", "label", "description", "kind", "set", "unset", "network_args", "key", "values", "map", "when",
              "speed_cost", "speed_note", "quality_cost", "quality_note", "resume_safe", "phases", "roadmap", "cpu",
              "cost_bias"}
_KINDS = {"set", "steps", "batch_to_accumulation", "rank", "resolution", "optimizer_map", "sample_size"}
# Kinds whose variants go on from the config's current value: after one value fell short, the next is
# still a move of its own.
STEPPED_KINDS = frozenset({"steps", "batch_to_accumulation", "rank", "resolution", "sample_size"})
_RELAX_KINDS = {"steps_down", "unset", "optimizer_map", "accumulation_to_batch"}


def parse_ladder(doc: dict[str, Any], where: str = "ladder") -> Ladder:
    moves = []
    for i, raw in enumerate(doc.get("move") or []):
        unknown = set(raw) - _MOVE_KEYS
        if unknown:
            raise UserError(f"{where}: move {raw.get('name', i)!r} has unknown field(s) {sorted(unknown)}.")
        kind = raw.get("kind", "set")
        if kind not in _KINDS:
            raise UserError(f"{where}: move {raw.get('name', i)!r} has unknown kind {kind!r}.")
        when = raw.get("when") or {}
        moves.append(Move(
            name=raw["name"], label=raw.get("label", raw["name"]), description=raw.get("description", ""), kind=kind,
            set=dict(raw.get("set") or {}), unset=tuple(raw.get("unset") or ()),
            network_args={k: str(v) for k, v in (raw.get("network_args") or {}).items()},
            key=raw.get("key", ""), values=tuple(raw.get("values") or ()), map=dict(raw.get("map") or {}),
            families=tuple(when.get("families") or ()), facts=dict(when.get("facts") or {}),
            config_when=dict(when.get("config") or {}), speed_cost=float(raw.get("speed_cost", 0.0)),
            speed_note=raw.get("speed_note", ""), quality_cost=int(raw.get("quality_cost", 0)),
            quality_note=raw.get("quality_note", ""), resume_safe=bool(raw.get("resume_safe", True)),
            phases=tuple(raw.get("phases") or ("training",)), roadmap=raw.get("roadmap"),
            cpu=bool(raw.get("cpu", True)), cost_bias=float(raw.get("cost_bias", 0.0)),
        ))
    for r in doc.get("relax") or []:
        if r.get("kind") not in _RELAX_KINDS:
            raise UserError(f"{where}: relax {r.get('name')!r} has unknown kind {r.get('kind')!r}.")
        if r.get("ceiling", "target_high") not in ("target_high", "target_low"):
            raise UserError(f"{where}: relax {r.get('name')!r}: ceiling must be target_high or target_low.")
    relaxes = tuple(Relax(name=r["name"], label=r.get("label", r["name"]), kind=r["kind"], key=r.get("key", ""),
                          unset=tuple(r.get("unset") or ()), map=dict(r.get("map") or {}),
                          speed_note=r.get("speed_note", ""), ceiling=r.get("ceiling", "target_high"))
                    for r in doc.get("relax") or [])
    floors = doc.get("floors") or {}
    tune = doc.get("tune") or {}
    swaps = tuple(FileSwap(name=f["name"], key=f["key"], value=str(f["value"]), label=f.get("label", f["name"]),
                           note=f.get("note", ""), families=tuple(f.get("families") or ()),
                           phases=tuple(f.get("phases") or ()),
                           unless_contains=tuple(str(m).lower() for m in f.get("unless_contains") or ()))
                  for f in doc.get("file_swap") or [])
    caution = doc.get("caution") or {}
    names = {m.name for m in moves}
    phase_first: dict[str, tuple[str, ...]] = {}
    for rule in doc.get("phase_rule") or []:
        first = tuple(rule.get("first") or ())
        unknown = [n for n in first if n not in names]
        if unknown or not isinstance(rule.get("phase"), str):
            raise UserError(f"{where}: phase_rule {rule.get('phase')!r} names no phase or unknown move(s) {unknown}.")
        phase_first[rule["phase"]] = first
    return Ladder(tuple(moves), relaxes, int(floors.get("network_dim", 4)), float(tune.get("target_low", 0.75)),
                  float(tune.get("target_high", 0.92)), swaps, float(caution.get("budget_share", 0.95)),
                  float(caution.get("small_card_gb", 6)), phase_first)


@lru_cache(maxsize=None)
def load_ladder(path: str | None = None) -> Ladder:
    p = Path(path) if path else LADDER_FILE
    try:
        with open(p, "rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        raise UserError(f"Ladder file {p} does not exist.") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"Ladder file {p} is not valid TOML: {exc}.") from None
    return parse_ladder(doc, str(p))


