"""What a network run trains: the parameter count of the network module the config names
(sd-scripts' LoRA modules, LyCORIS' algorithms, sd-scripts' OFT modules), each from the layers
the module wraps in the family's models."""

from __future__ import annotations

from dataclasses import dataclass, field

from kohya_tuner.memory import lycoris, oft
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
            out.label = f"LyCORIS {lycoris.options(s.rank, s.network_args).algo}"
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
        else:
            out.notes.append(f"{s.network_module} on {fam.label} is not listed (data/oft_targets.json); its "
                             f"parameters are counted as a LoRA of rank network_dim")
    return out
