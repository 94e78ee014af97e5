"""Trainable parameters of sd-scripts' OFT networks (`networks.oft` for the SD U-Nets,
`networks.oft_flux` for FLUX), from the layers they wrap (`data/oft_targets.json`, counted by
tools/memtrace/oft_targets.py on the pinned model classes, with the modules' own counts beside).

Each wrapped layer gets a block-diagonal rotation of its output features: `network_dim` is the
number of blocks, not a rank. networks.oft gives a layer with `out` outputs network_dim blocks of
(out // network_dim)^2; networks.oft_flux splits the fused qkv (and the single blocks' qkv + MLP)
outputs into their parts first and gives each part network_dim blocks of (part / network_dim)^2,
refusing a part network_dim does not divide. Either way the count is about out^2 / network_dim per
layer, a small fraction of a LoRA of "rank" network_dim at the usual values. Only the denoiser is
wrapped: the text encoders are never trained by these modules.

Which layers: attention only by default (SD: every Linear of CrossAttention; FLUX: SelfAttention's
qkv and proj), every Linear of the transformer blocks with `enable_all_linear`, plus the ResNet and
resampling convolutions with `enable_conv` (SD only). The modules turn these arguments with bool()
of the string they are given, so any value, "False" included, switches them on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

_DATA = Path(__file__).resolve().parent.parent / "data" / "oft_targets.json"

MODULES = ("networks.oft", "networks.oft_flux")


@lru_cache(maxsize=None)
def targets() -> dict[str, Any]:
    with open(_DATA, encoding="utf-8") as fh:
        return json.load(fh)


class Refused(ValueError):
    """networks.oft_flux asserts that network_dim divides every output part it rotates."""


def layer_params(n_out: int, splits: list[int], dim: int) -> int:
    if dim <= 0:
        return 0
    if not splits:
        # networks.oft: floor division, no check; a width below dim gives empty blocks.
        return dim * (n_out // dim) ** 2
    for part in splits:
        if part % dim:
            raise Refused(f"network_dim {dim} does not divide the output part {part}")
    return sum(part * part // dim for part in splits)


def mode_of(net_args: dict[str, str], *, flux: bool) -> tuple[str, list[str]]:
    notes: list[str] = []
    on = {}
    for key in ("enable_all_linear", "enable_conv"):
        v = net_args.get(key)
        on[key] = v is not None and v != ""
        if on[key] and str(v).strip().lower() in ("false", "0", "no"):
            notes.append(f"network_args {key}={v}: the OFT module reads any non-empty value as true, so it is on")
    if flux and on["enable_conv"]:
        notes.append("networks.oft_flux ignores enable_conv (FLUX has no convolutions to rotate)")
        on["enable_conv"] = False
    mode = ("all_linear" if on["enable_all_linear"] else "attn") + ("_conv" if on["enable_conv"] else "")
    return ("conv" if mode == "attn_conv" else mode), notes


@dataclass
class Count:
    denoiser: int = 0
    notes: list[str] = field(default_factory=list)
    known: bool = True
    # Weight elements of the wrapped layers: each step rebuilds every one of them rotated (fp32).
    wrapped_weight_params: int = 0


def count(family_name: str, dim: int, net_args: dict[str, str], *, train_unet: bool) -> Count:
    out = Count()
    arch = targets()["archs"].get(family_name)
    if arch is None:
        out.known = False
        return out
    mode, out.notes = mode_of(net_args, flux=family_name == "flux")
    rows = arch["modes"].get(mode)
    if rows is None:
        out.known = False
        return out
    if not train_unet:
        return out
    refused: set[int] = set()
    for n_in, n_out, k, n, splits in rows:
        try:
            out.denoiser += layer_params(n_out, splits, dim) * n
        except Refused:
            refused.update(p for p in splits if p % dim)
        out.wrapped_weight_params += n_in * n_out * k * k * n
    if refused:
        out.notes.append(f"{arch['module']} asserts that network_dim divides every part it rotates: {dim} does not "
                         f"divide {', '.join(map(str, sorted(refused)))}, so the trainer stops when it builds the "
                         f"network")
    return out
