"""What a network run trains: the parameter count of the network module the config names
(sd-scripts' LoRA modules, LyCORIS' algorithms, sd-scripts' OFT modules), each from the layers
the module wraps in the family's models."""

from __future__ import annotations

from dataclasses import dataclass, field

from kohya_tuner.memory import lycoris, oft
from kohya_tuner.memory.data import coefficients
from kohya_tuner.memory.lora import count as lora_count
from kohya_tuner.memory.setup import Setup


@dataclass
class Network:
    params: int
    # The widest layer input, to size factored optimizer vectors.
    typical_width: int
    notes: list[str] = field(default_factory=list)
    # What the component note calls the network ("LyCORIS loha", "OFT"); empty for a LoRA.
    label: str = ""
    # Weight elements of the layers an OFT network rotates (it rebuilds each rotated weight every step).
    rotated_weight_params: int = 0
    # (network module, LyCORIS algo) its traced activation line is keyed by; None for the family's LoRA.
    traced_as: tuple[str, str] | None = None


def network(s: Setup) -> Network:
    fam = s.family
    lc = lora_count(fam.name, rank=s.rank, conv_rank=s.conv_rank, net_args=s.network_args,
                    train_unet=s.train_unet, te_trained=s.te_trained)
    out = Network(lc.total, lc.typical_width, list(lc.notes))
    if s.network_module == "lycoris.kohya":
        lyc = lycoris.count(fam.name, s.rank, s.network_args, train_unet=s.train_unet, train_te=any(s.te_trained))
        out.notes.extend(lyc.notes)
        if lyc.known:
            out.params = lyc.total
            algo = lycoris.options(s.rank, s.network_args).algo
            out.label = f"LyCORIS {algo}"
            out.traced_as = ("lycoris.kohya", "locon" if algo == "lora" else algo)
        else:
            out.notes.append(f"LyCORIS' layers in {fam.label} are not listed (data/lycoris_targets.json); its "
                             f"parameters are counted as a LoRA of the same rank")
    elif s.network_module in oft.MODULES:
        o = oft.count(fam.name, s.rank, s.network_args, train_unet=s.train_unet)
        out.notes = list(o.notes)
        if o.known and oft.targets()["archs"][fam.name]["module"] == s.network_module:
            out.params = o.denoiser
            out.label = f"OFT, {s.rank} blocks per layer"
            out.rotated_weight_params = o.wrapped_weight_params
            out.traced_as = (s.network_module, "")
        else:
            out.notes.append(f"{s.network_module} on {fam.label} is not listed (data/oft_targets.json); its "
                             f"parameters are counted as a LoRA of rank network_dim")
    return out


def activation_extra(s: Setup, net: Network, tokens_x_batch: float) -> tuple[float, str | None]:
    """What the network adds to the activations of the family's LoRA (memory_coefficients.json,
    network_activations: each module traced beside the LoRA at the same size), and a note when the
    module was not traced for this family."""
    if net.traced_as is None:
        return _rank_extra(s, tokens_x_batch), None
    module, algo = net.traced_as
    lines = [ln for ln in coefficients().get("network_activations", {}).get("lines", [])
             if ln["network"] == module and ln["algo"] == algo and ln["ckpt"] == s.checkpointing]
    line = next((ln for ln in lines if ln["arch"] == s.family.name), None)
    what = f"{net.label} ({module})" if module != "lycoris.kohya" else net.label
    if line is None:
        return 0.0, (f"{what}: its activations are not traced for {s.family.label} "
                     f"{'with' if s.checkpointing else 'without'} gradient checkpointing; counted as the LoRA's")
    extra = line["mib_per_token"] * tokens_x_batch / 1024.0 + line["intercept_gib"]
    # A line through two sizes is not carried below what was traced (with checkpointing the extra shrinks
    # between 512 and 768 px, and would turn negative far beyond); negative only where a trace was.
    floor = min([0.0] + [y for _x, y in line.get("points", [])])
    # The extra was traced beside the family's LoRA at line["lora_rank"]: it sits on that LoRA's activations.
    return max(extra, floor) + _rank_extra(s, tokens_x_batch, rank=line.get("lora_rank")), None


def _rank_extra(s: Setup, tokens_x_batch: float, rank: int | None = None) -> float:
    """What the family's own LoRA at `rank` (default network_dim) keeps above the rank its activation line was
    traced at, without checkpointing (memory_coefficients.json, lora_rank_activations): autocast's 16-bit copies
    of the fp32 LoRA weights, saved for backward, and each layer's down-projection output (rank values per
    token). Negative below that rank; 0 where no pair was traced (with checkpointing the peak is in backward,
    where the traces cannot tell these apart from the gradients)."""
    if rank is None and s.network_module != s.family.network_module:
        return 0.0
    spec = coefficients().get("lora_rank_activations") or {}
    base = spec.get("activation_lines_rank")
    line = next((ln for ln in spec.get("lines", []) if ln["arch"] == s.family.name and ln["ckpt"] == s.checkpointing),
                None)
    if line is None or not isinstance(base, int):
        return 0.0
    rank = s.rank if rank is None else rank
    # fp32 training keeps the outputs in fp32: twice the traced (autocast, 16-bit) size, as the activation lines.
    width = 2.0 if s.mixed_precision == "no" else 1.0
    extra = (rank - base) * line["mib_per_token_per_rank"] * tokens_x_batch / 1024.0 * width
    if s.mixed_precision != "no" and s.lora_dtype == "fp32":
        def params(r: int) -> int:
            return lora_count(s.family.name, rank=r, conv_rank=None, net_args=s.network_args,
                              train_unet=s.train_unet, te_trained=s.te_trained).total

        extra += line["weight_copy_bytes_per_param"] * (params(rank) - params(base)) / 1024.0**3
    return extra
