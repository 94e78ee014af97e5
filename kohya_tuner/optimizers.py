"""Optimizer state memory per trainable parameter, for every optimizer sd-scripts can build.

sd-scripts' `optimizer_type` takes one of its own names (AdamW, AdamW8bit, Lion, Adafactor,
DAdapt*, Prodigy, *ScheduleFree, ...), a bare `torch.optim` class name, or a full class path
(`bitsandbytes.optim.AdEMAMix8bit`, `pytorch_optimizer.CAME`, ...). Each entry below counts
the per-parameter tensors the optimizer keeps between steps, from the optimizer's own
algorithm: Adam keeps two moments, Lion one, SGD with momentum one, and so on.

Two kinds of state exist:
* full states: one tensor shaped like the parameter, in the parameter's dtype (fp32 for a
  LoRA network unless `full_bf16`/`full_fp16` casts it), so bytes = count x param bytes;
* quantised states (bitsandbytes 8-bit): one byte per element plus block-wise statistics,
  whatever the parameter dtype.
Factored optimizers (Adafactor, CAME) keep a row and a column vector per matrix instead of a
full second moment; for a LoRA matrix of shape (rank, n) that is (rank + n) floats, which per
parameter is about 1/rank + 1/n floats — not negligible at rank 4.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# bitsandbytes keeps one fp32 absmax per 256-element block (dynamic block-wise quantisation)
# for each 8-bit state: 4/256 bytes per element per state.
_BNB_BLOCK_OVERHEAD = 4 / 256


@dataclass(frozen=True)
class OptimizerSpec:
    name: str
    full_states: float  # tensors shaped like the parameter, in its dtype
    int8_states: int = 0  # bitsandbytes 8-bit states
    factored: int = 0  # factored second moments (row + column vectors, fp32)
    paged: bool = False  # bitsandbytes paged memory: evicted to CPU RAM under pressure
    note: str = ""

    def bytes_per_param(self, param_bytes: float = 4.0, rank: int = 16, width: int = 3072) -> float:
        """State bytes per trainable parameter. `rank`/`width` size the factored vectors of a
        (rank x width) LoRA matrix."""
        b = self.full_states * param_bytes
        b += self.int8_states * (1.0 + _BNB_BLOCK_OVERHEAD)
        if self.factored:
            b += self.factored * 4.0 * (1.0 / max(rank, 1) + 1.0 / max(width, 1))
        return b


def _s(name, full, int8=0, factored=0, paged=False, note=""):
    return OptimizerSpec(name, full, int8, factored, paged, note)


# Keyed by the lower-case class name (the last part of a class path).
OPTIMIZERS: dict[str, OptimizerSpec] = {
    # sd-scripts' own names
    "adamw": _s("AdamW", 2, note="torch.optim.AdamW: exp_avg + exp_avg_sq"),
    "adamw8bit": _s("AdamW8bit", 0, 2, note="bitsandbytes: two 8-bit moments + block statistics"),
    "pagedadamw": _s("PagedAdamW", 2, paged=True, note="bitsandbytes paged, 32-bit moments; pages spill to CPU RAM"),
    "pagedadamw8bit": _s("PagedAdamW8bit", 0, 2, paged=True, note="bitsandbytes paged 8-bit; pages spill to CPU RAM"),
    "pagedadamw32bit": _s("PagedAdamW32bit", 2, paged=True, note="bitsandbytes paged 32-bit"),
    "lion": _s("Lion", 1, note="lion-pytorch: one momentum"),
    "lion8bit": _s("Lion8bit", 0, 1, note="bitsandbytes 8-bit momentum"),
    "pagedlion8bit": _s("PagedLion8bit", 0, 1, paged=True, note="bitsandbytes paged 8-bit momentum"),
    "sgdnesterov": _s("SGDNesterov", 1, note="torch SGD with Nesterov momentum buffer"),
    "sgdnesterov8bit": _s("SGDNesterov8bit", 0, 1, note="bitsandbytes SGD8bit momentum"),
    "dadaptation": _s("DAdaptation", 3, note="DAdaptAdamPreprint: exp_avg, exp_avg_sq, s"),
    "dadaptadampreprint": _s("DAdaptAdamPreprint", 3, note="exp_avg, exp_avg_sq, s"),
    "dadaptadagrad": _s("DAdaptAdaGrad", 3, note="alpha_k, sk, x0"),
    "dadaptadam": _s("DAdaptAdam", 3, note="exp_avg, exp_avg_sq, s"),
    "dadaptadan": _s("DAdaptAdan", 5, note="exp_avg, exp_avg_sq, exp_avg_diff, s, previous grad"),
    "dadaptadanip": _s("DAdaptAdanIP", 5, note="as DAdaptAdan"),
    "dadaptlion": _s("DAdaptLion", 2, note="exp_avg, s"),
    "dadaptsgd": _s("DAdaptSGD", 3, note="z, s, x0"),
    "prodigy": _s("Prodigy", 4, note="prodigyopt: exp_avg, exp_avg_sq, s, p0 (a copy of the initial weights)"),
    "adafactor": _s("Adafactor", 0, factored=1,
                    note="transformers Adafactor, factored second moment; beta1 in optimizer_args adds a full momentum"),
    "adamwschedulefree": _s("AdamWScheduleFree", 2, note="schedulefree: z + exp_avg_sq (the weights hold y)"),
    "radamschedulefree": _s("RAdamScheduleFree", 2, note="schedulefree: z + exp_avg_sq"),
    "sgdschedulefree": _s("SGDScheduleFree", 1, note="schedulefree: z"),
    # bare torch.optim names (sd-scripts falls back to torch.optim for a name without a dot)
    "adam": _s("Adam", 2, note="torch.optim.Adam"),
    "nadam": _s("NAdam", 2, note="torch.optim.NAdam"),
    "radam": _s("RAdam", 2, note="torch.optim.RAdam"),
    "adamax": _s("Adamax", 2, note="torch.optim.Adamax: exp_avg + exp_inf"),
    "adagrad": _s("Adagrad", 1, note="torch.optim.Adagrad: sum"),
    "adadelta": _s("Adadelta", 2, note="torch.optim.Adadelta: square_avg + acc_delta"),
    "rmsprop": _s("RMSprop", 1, note="torch.optim.RMSprop: square_avg (momentum/centered add one each)"),
    "sgd": _s("SGD", 0, note="torch.optim.SGD without momentum keeps nothing; momentum adds one buffer"),
    "asgd": _s("ASGD", 1, note="torch.optim.ASGD: ax"),
    "rprop": _s("Rprop", 2, note="torch.optim.Rprop: prev + step_size"),
    "adamw32bit": _s("AdamW32bit", 2, note="bitsandbytes 32-bit AdamW"),
    # bitsandbytes class paths
    "adam8bit": _s("Adam8bit", 0, 2, note="bitsandbytes"),
    "ademamix8bit": _s("AdEMAMix8bit", 0, 3, note="bitsandbytes: fast EMA, slow EMA, second moment, 8-bit"),
    "pagedademamix8bit": _s("PagedAdEMAMix8bit", 0, 3, paged=True, note="bitsandbytes paged"),
    "ademamix": _s("AdEMAMix", 3, note="fast EMA, slow EMA, second moment"),
    "lamb8bit": _s("LAMB8bit", 0, 2, note="bitsandbytes"),
    "lars8bit": _s("LARS8bit", 0, 1, note="bitsandbytes"),
    "rmsprop8bit": _s("RMSprop8bit", 0, 1, note="bitsandbytes"),
    "adagrad8bit": _s("Adagrad8bit", 0, 1, note="bitsandbytes"),
    "sgd8bit": _s("SGD8bit", 0, 1, note="bitsandbytes, momentum buffer"),
    # other libraries sd-scripts installs (pytorch-optimizer, prodigy-plus-schedule-free, came)
    "came": _s("CAME", 1, factored=2, note="exp_avg + factored second moment and factored residual"),
    "prodigyplusschedulefree": _s("ProdigyPlusScheduleFree", 2, factored=1,
                                  note="z + p0, factored second moment by default"),
    "adabelief": _s("AdaBelief", 2, note="pytorch-optimizer"),
    "lamb": _s("Lamb", 2, note="pytorch-optimizer"),
    "ranger": _s("Ranger", 3, note="RAdam moments + lookahead slow weights"),
    "ranger21": _s("Ranger21", 4, note="moments, lookahead, positive-negative momentum"),
    "adan": _s("Adan", 3, note="exp_avg, exp_avg_sq, exp_avg_diff (+ previous grad)"),
    "sophiah": _s("SophiaH", 2, note="momentum + hessian estimate"),
    "lion_pytorch": _s("Lion", 1, note="lion-pytorch"),
    "adopt": _s("ADOPT", 2, note="pytorch-optimizer"),
    "schedulefreeadamw": _s("ScheduleFreeAdamW", 2, note="pytorch-optimizer schedule-free"),
    "muon": _s("Muon", 1, note="momentum buffer"),
}

DEFAULT = OPTIMIZERS["adamw"]


@dataclass(frozen=True)
class ResolvedOptimizer:
    spec: OptimizerSpec
    known: bool
    written: str
    extra_full_states: float = 0.0  # e.g. Adafactor with beta1, SGD with momentum


def _args_dict(optimizer_args: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    if not isinstance(optimizer_args, (list, tuple)):
        optimizer_args = [optimizer_args] if isinstance(optimizer_args, str) else []
    for item in optimizer_args:
        if isinstance(item, str) and "=" in item:
            k, v = item.split("=", 1)
            out[k.strip().lower()] = v.strip()
    return out


def _truthy_number(v: str | None) -> bool:
    if v is None:
        return False
    s = v.strip().lower()
    if s in ("none", "false", "0", "0.0", ""):
        return False
    try:
        return float(s) != 0.0
    except ValueError:
        return s not in ("none",)


def lookup(optimizer_type: str | None, optimizer_args: Any = None, *, use_8bit_adam: bool = False,
           use_lion_optimizer: bool = False) -> ResolvedOptimizer:
    """Resolve what sd-scripts would build. Case-insensitive; a class path is matched on its
    last part. Unknown names resolve to AdamW with `known=False` so the caller can say so."""
    written = optimizer_type.strip() if isinstance(optimizer_type, str) else ""
    if not written:
        # sd-scripts' legacy flags stand in for optimizer_type when it is empty.
        if use_8bit_adam:
            written = "AdamW8bit"
        elif use_lion_optimizer:
            written = "Lion"
        else:
            written = "AdamW"
    key = written.rsplit(".", 1)[-1].lower()
    if written.lower().startswith("lion_pytorch."):
        key = "lion_pytorch"
    spec = OPTIMIZERS.get(key)
    known = spec is not None
    if spec is None:
        spec = DEFAULT
    args = _args_dict(optimizer_args)
    extra = 0.0
    if spec.name == "Adafactor" and _truthy_number(args.get("beta1")):
        extra = 1.0
    if spec.name in ("SGD",) and _truthy_number(args.get("momentum")):
        extra = 1.0
    if spec.name == "RMSprop":
        extra = float(_truthy_number(args.get("momentum"))) + float(args.get("centered", "").lower() == "true")
    if spec.name in ("AdamW", "Adam") and args.get("amsgrad", "").lower() == "true":
        extra = 1.0
    return ResolvedOptimizer(spec, known, written, extra)


def state_bytes_per_param(resolved: ResolvedOptimizer, param_bytes: float, rank: int, width: int = 3072) -> float:
    return resolved.spec.bytes_per_param(param_bytes, rank, width) + resolved.extra_full_states * param_bytes
