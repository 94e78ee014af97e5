"""`--network`: which sd-scripts network module a plan trains with (the family's own LoRA, or
LyCORIS through its kohya wrapper). The choices are data (presets/networks/*.toml)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from kohya_tuner.errors import UserError
from kohya_tuner.resources import presets_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class NetworkChoice:
    kind: str  # "lora" or "lycoris"
    algo: str | None
    settings: dict[str, Any]
    why: dict[str, str]
    # What the user should know before training with it.
    cautions: tuple[str, ...] = ()
    # Each learning rate of the plan is multiplied by this (an algo that needs far larger rates).
    lr_scale: float | None = None

    @property
    def layer(self) -> str:
        return f"network:{self.kind}" + (f":{self.algo}" if self.algo else "")


def _doc(kind: str) -> dict[str, Any]:
    with open(presets_dir() / "networks" / f"{kind}.toml", "rb") as fh:
        return tomllib.load(fh)


def kinds() -> tuple[str, ...]:
    return ("lora",) + tuple(sorted(p.stem for p in (presets_dir() / "networks").glob("*.toml")))


def parse(spec: str, family) -> NetworkChoice:
    """`lora` (the family's own module), or `<kind>:<algo>` such as `lycoris:locon`."""
    text = spec.strip().lower()
    kind, _, algo = text.partition(":")
    if kind == "lora" and not algo:
        return NetworkChoice("lora", None, {"network_module": family.network_module},
                             {"network_module": f"{family.label}'s own LoRA module."})
    if kind not in kinds() or kind == "lora":
        raise UserError(f"--network {spec!r} is not a network kohya-tuner knows.",
                        "Use lora, or lycoris:<algo> (e.g. lycoris:locon, lycoris:loha, lycoris:lokr).")
    doc = _doc(kind)
    algos = doc.get("algo") or {}
    if algo not in algos:
        raise UserError(f"--network {spec!r}: {kind} has no algo {algo!r}." if algo else
                        f"--network {spec!r} needs an algo after the colon.",
                        f"Choose one of: {', '.join(f'{kind}:{a}' for a in algos)}.")
    entry = algos[algo]
    settings = dict(doc.get("settings") or {})
    why = dict(doc.get("why") or {})
    settings["network_args"] = [str(a) for a in entry.get("network_args", [])]
    lr_scale = entry.get("lr_scale")
    why["network_args"] = f"{entry.get('label', algo)}: {entry.get('why', '')}".strip()
    cautions = []
    known = (doc.get("support") or {}).get("known") or []
    if family.name not in known:
        cautions.append(f"{entry.get('label', algo)} on {family.label}: LyCORIS finds the layers to wrap by their "
                        "class names, and whether its version knows this model's is not checked here. Look for "
                        "its start-up line 'create LyCORIS for U-Net: N modules' with N above 0.")
    cautions.append("network_module lycoris.kohya needs the lycoris-lora package in sd-scripts' venv "
                    "(pip install lycoris-lora).")
    return NetworkChoice(kind, algo, settings, why, tuple(cautions), lr_scale)


_RATES = ("learning_rate", "unet_lr", "text_encoder_lr")


def _boft_rank(plan, choice: NetworkChoice) -> None:
    """BOFT splits each layer width into even blocks of at most network_dim times a power of two, and
    LyCORIS stops where a width does not split (FLUX.1's 3072 at 32, SD3.5 Large's 2432 below 38): the
    job's rank is raised, doubling, to the first that splits every width of the model."""
    from kohya_tuner.memory import lycoris

    rank = plan.config.get("network_dim")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        return
    r = rank
    while r <= 1024 and lycoris.unsplittable(plan.family.name, {**plan.config, "network_dim": r}):
        r *= 2
    if r != rank and r <= 1024:
        plan.set("network_dim", r, choice.layer,
                 f"BOFT at rank {rank} cannot split {plan.family.label}'s layer widths into butterfly blocks; "
                 f"{r} is the first doubling that does (LyCORIS stops on a width that does not split).")


def apply(plan, choice: NetworkChoice) -> None:
    """Set the choice as its own layer; network_args the plan already has are kept (the
    choice's keys win)."""
    for key, value in choice.settings.items():
        if key == "network_args":
            mine = {str(a).split("=", 1)[0] for a in value}
            kept = [a for a in (plan.config.get("network_args") or [])
                    if str(a).split("=", 1)[0] not in mine]
            value = kept + list(value)
        plan.set(key, value, choice.layer, choice.why.get(key, ""))
    if choice.lr_scale:
        for key in _RATES:
            rate = plan.config.get(key)
            if isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0:
                plan.set(key, float(f"{rate * choice.lr_scale:.3g}"), choice.layer,
                         f"{choice.algo} learns a few scaling vectors: {choice.lr_scale}x the LoRA rate of {rate:g}.")
    if choice.algo == "boft":
        _boft_rank(plan, choice)
    for c in choice.cautions:
        if c not in plan.cautions:
            plan.cautions.append(c)
