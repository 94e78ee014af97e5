"""A minimal kohya-style LoRA wrapper for the diffusers classes (lora_down -> lora_up, scale alpha/rank).

Targets follow sd-scripts' networks: every Linear and 1x1 Conv2d inside a Transformer2DModel for the
UNets (networks.lora), every Linear inside the double/single blocks for FLUX (networks.lora_flux; diffusers
keeps q, k, v separate, so it has 494 targets where sd-scripts' fused-qkv model has 304).  For sd-scripts'
own classes the tracer uses sd-scripts' networks directly instead (see models.py).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

TARGET_PARENTS = {
    "sd15": ("Transformer2DModel",),
    "sdxl": ("Transformer2DModel",),
    "flux": ("FluxTransformerBlock", "FluxSingleTransformerBlock"),
}


class LoRAWrap(nn.Module):
    def __init__(self, base, rank, alpha, lora_dtype, fp8_base=False, compute_dtype=torch.bfloat16):
        super().__init__()
        self.base = base
        self.is_conv = isinstance(base, nn.Conv2d)
        self.fp8_base = fp8_base
        self.compute_dtype = compute_dtype
        if self.is_conv:
            fin, fout = base.in_channels, base.out_channels
            self.lora_down = nn.Conv2d(fin, rank, 1, bias=False)
            self.lora_up = nn.Conv2d(rank, fout, 1, bias=False)
        else:
            fin, fout = base.in_features, base.out_features
            self.lora_down = nn.Linear(fin, rank, bias=False)
            self.lora_up = nn.Linear(rank, fout, bias=False)
        self.lora_down.to(lora_dtype)
        self.lora_up.to(lora_dtype)
        nn.init.zeros_(self.lora_up.weight)
        self.scale = alpha / rank

    def forward(self, x):
        if self.fp8_base:
            # fp8 storage, upcast per call: what --fp8_base amounts to under autocast
            w = self.base.weight.to(self.compute_dtype)
            b = None if self.base.bias is None else self.base.bias.to(self.compute_dtype)
            if self.is_conv:
                y = F.conv2d(x, w, b, self.base.stride, self.base.padding)
            else:
                y = F.linear(x, w, b)
        else:
            y = self.base(x)
        lx = self.lora_up(self.lora_down(x))
        if lx.dtype != y.dtype:
            lx = lx.to(y.dtype)
        return y + lx * self.scale


def add_lora(model, arch, rank=16, alpha=None, lora_dtype=torch.bfloat16, fp8_base=False):
    """Freeze the model and wrap target layers.  Returns (#wrapped, #LoRA params)."""
    alpha = rank if alpha is None else alpha
    model.requires_grad_(False)
    parents = TARGET_PARENTS[arch]
    todo = []
    for pname, parent in model.named_modules():
        if type(parent).__name__ not in parents:
            continue
        for cname, child in parent.named_modules():
            if isinstance(child, nn.Linear) or (isinstance(child, nn.Conv2d) and child.kernel_size == (1, 1)):
                todo.append((pname + "." + cname if cname else pname, child))
    seen = set()
    n_wrapped = 0
    for full, child in todo:
        if full in seen:
            continue
        seen.add(full)
        parent_name, _, attr = full.rpartition(".")
        parent = model.get_submodule(parent_name)
        if fp8_base:
            child.to(torch.float8_e4m3fn)
        setattr(parent, attr, LoRAWrap(child, rank, alpha, lora_dtype, fp8_base=fp8_base))
        n_wrapped += 1
    n_lora = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    for n, p in model.named_parameters():
        p.requires_grad_("lora_" in n)
    return n_wrapped, n_lora
