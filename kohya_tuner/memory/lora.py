"""Trainable parameter counts of a LoRA network, from the layers sd-scripts' network modules
actually wrap (`data/lora_targets.json`, counted from the pinned model classes).

A wrapped Linear (or 1x1 Conv2d) of shape in -> out at rank r adds r*(in + out) parameters
(lora_down in -> r, lora_up r -> out); a 3x3 conv at conv rank c adds c*(9*in + out).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kohya_tuner.memory.data import lora_arch

# lora_flux's per-type rank keys, in its own order, and the target groups they govern.
FLUX_TYPE_DIMS = {
    "img_attn_dim": "img_attn",
    "txt_attn_dim": "txt_attn",
    "img_mlp_dim": "img_mlp",
    "txt_mlp_dim": "txt_mlp",
    "img_mod_dim": "img_mod",
    "txt_mod_dim": "txt_mod",
    "single_dim": "single",
    "single_mod_dim": "single_mod",
}

# lora_flux in_dims order and the embedders they wrap (in -> out layers of each).
_FLUX_IN_LAYERS = [
    [(64, 3072)],  # img_in
    [(256, 3072), (3072, 3072)],  # time_in
    [(768, 3072), (3072, 3072)],  # vector_in
    [(256, 3072), (3072, 3072)],  # guidance_in
    [(4096, 3072)],  # txt_in
]


@dataclass
class LoraCount:
    by_component: dict[str, int] = field(default_factory=dict)
    # The widest layer input, to size factored optimizer vectors.
    typical_width: int = 3072
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.by_component.values())


def _rows_params(rows: list[list[Any]], rank: int, conv_rank: int | None = None) -> int:
    total = 0
    for row in rows:
        n_in, n_out, count, kind = row[0], row[1], row[2], row[3]
        if kind == "conv3x3":
            if conv_rank:
                total += conv_rank * (9 * n_in + n_out) * count
        else:
            total += rank * (n_in + n_out) * count
    return total


def _to_int(v: str | None) -> int | None:
    if v is None:
        return None
    try:
        return int(float(v))
    except (ValueError, OverflowError):
        return None


def parse_indices(spec: str | None, n: int) -> set[int] | None:
    """lora_flux's block index syntax: 'all', 'none', or '0,1,4-5'. None = not given."""
    if spec is None:
        return None
    s = spec.strip().lower()
    if s == "all":
        return set(range(n))
    if s == "none":
        return set()
    out: set[int] = set()
    for part in s.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            lo, hi = _to_int(a), _to_int(b)
            if lo is not None and hi is not None:
                out.update(i for i in range(lo, hi + 1) if 0 <= i < n)
        else:
            i = _to_int(part)
            if i is not None and 0 <= i < n:
                out.add(i)
    return out


def _flux_dit(rank: int, net_args: dict[str, str], notes: list[str]) -> int:
    dit = lora_arch("flux")["components"]["dit"]
    blocks = dit["blocks"]
    type_dims = {group: _to_int(net_args.get(key)) for key, group in FLUX_TYPE_DIMS.items()}
    train_blocks = net_args.get("train_blocks", "all").strip().lower() or "all"
    split_qkv = net_args.get("split_qkv") == "True"
    total = 0
    for kind in ("double", "single"):
        if train_blocks not in ("all", kind):
            continue
        info = blocks[kind]
        n = int(info["count"])
        chosen = parse_indices(net_args.get(f"train_{kind}_block_indices"), n)
        n_trained = n if chosen is None else len(chosen)
        per_block = 0
        for row in info["per_block"]:
            n_in, n_out, count, _kind, group, layer = row[:6]
            r = type_dims.get(group)
            r = rank if r is None else max(r, 0)
            if not r:
                continue
            inputs = n_in
            if split_qkv and (layer.endswith("qkv") or layer == "linear1"):
                # Split LoRA: one down-projection per part (3 for qkv, 4 for qkv + mlp).
                inputs = n_in * (3 if layer.endswith("qkv") else 4)
            per_block += r * (inputs + n_out) * count
        total += per_block * n_trained
    in_dims = net_args.get("in_dims")
    if in_dims:
        dims = [_to_int(x) for x in in_dims.strip().strip("[]").split(",")]
        for d, layers in zip(dims, _FLUX_IN_LAYERS):
            if d:
                total += sum(d * (a + b) for a, b in layers)
    if net_args.get("network_reg_dims"):
        notes.append("network_reg_dims (per-layer ranks by regex) is not modelled; LoRA size counted at network_dim")
    return total


def count(family_name: str, *, rank: int, conv_rank: int | None, net_args: dict[str, str],
          train_unet: bool, te_trained: tuple[bool, ...]) -> LoraCount:
    """Trainable LoRA parameters per component. `te_trained` follows the family's text
    encoders in order (SD1.5: CLIP-L; SDXL: CLIP-L, CLIP-G; FLUX: CLIP-L, T5-XXL)."""
    arch = lora_arch(family_name)
    comps = arch["components"]
    notes: list[str] = []
    out = LoraCount(notes=notes)
    denoiser = arch["denoiser"]
    if train_unet:
        if family_name == "flux":
            out.by_component[denoiser] = _flux_dit(rank, net_args, notes)
        else:
            unet = comps[denoiser]
            n = _rows_params(unet["targets"], rank)
            if conv_rank:
                n += _rows_params(unet["conv_dim_adds"]["targets"], rank, conv_rank)
            if any(k in net_args for k in ("block_dims", "conv_block_dims")):
                notes.append("block_dims (per-block ranks) is not modelled; LoRA size counted at network_dim")
            out.by_component[denoiser] = n
    te_names = [k for k in comps if k != denoiser]
    for name, trained in zip(te_names, te_trained):
        if trained:
            out.by_component[name] = _rows_params(comps[name]["targets"], rank)
    out.typical_width = 3072 if family_name == "flux" else (1280 if family_name == "sdxl" else 768)
    return out


def flux_block_weight_params() -> tuple[int, int, int, int]:
    """(double-block weight params, single-block weight params, n_double, n_single) of the
    FLUX transformer's blocks. Block swap moves only the `.weight` tensors of a block, which
    are exactly the wrapped Linear layers listed per block."""
    blocks = lora_arch("flux")["components"]["dit"]["blocks"]
    d = sum(r[0] * r[1] * r[2] for r in blocks["double"]["per_block"])
    s = sum(r[0] * r[1] * r[2] for r in blocks["single"]["per_block"])
    return d, s, int(blocks["double"]["count"]), int(blocks["single"]["count"])


def flux_grad_input_weight_params() -> int:
    """Weights whose input requires grad in a FLUX LoRA step: every block Linear except the
    modulation ones (their input, the conditioning vector, carries no gradient). fp8 storage
    makes each of them an upcast bf16 copy that autograd keeps for backward."""
    blocks = lora_arch("flux")["components"]["dit"]["blocks"]
    total = 0
    for kind in ("double", "single"):
        info = blocks[kind]
        per = sum(r[0] * r[1] * r[2] for r in info["per_block"] if not str(r[4]).endswith("mod"))
        total += per * int(info["count"])
    return total


def swapped_block_weight_params(family_name: str, layout: str, n: int) -> int:
    """Weights block swap moves off the GPU for the families counted by
    tools/memtrace/family_targets.py (their `blocks` entries): the Linear weights of n blocks
    of one list ("uniform"), or of n//2 double and (n - n//2)*2 single blocks ("double_single"),
    as the scripts' enable_block_swap split them."""
    comps = lora_arch(family_name)["components"]
    blocks = comps[lora_arch(family_name)["denoiser"]].get("blocks") or {}
    if not blocks or n <= 0:
        return 0
    if layout == "double_single" and "double" in blocks and "single" in blocks:
        d, si = blocks["double"], blocks["single"]
        n_d, n_s = n // 2, (n - n // 2) * 2
        return (min(n_d, int(d["count"])) * int(d["linear_weight_params_per_block"])
                + min(n_s, int(si["count"])) * int(si["linear_weight_params_per_block"]))
    only = next(iter(blocks.values()))
    return min(n, int(only["count"])) * int(only["linear_weight_params_per_block"])
