"""Build a denoiser with LoRA for one trace, from diffusers' classes or from a user's sd-scripts checkout.

Everything is constructed on the meta device (no weights); dtype casts and LoRA wrapping happen there,
because Module._apply cannot swap FakeTensor parameters ("Cannot swap t1 because it has weakref
associated with it").  The caller materialises with `to_empty` inside FakeTensorMode when tracing on the
fake CPU device.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

import configs


@dataclass
class Setup:
    arch: str
    impl: str
    modules: list[nn.Module]  # everything that holds parameters (denoiser, LoRA network)
    forward: Callable[[dict], torch.Tensor]
    make_inputs: Callable[..., dict]
    enable_ckpt: Callable[[bool], None]
    n_params: int
    lora_modules: int
    lora_params: int
    notes: list[str] = field(default_factory=list)
    offload_hooks: Callable[[object], None] | None = None  # installs host/device hooks for cpu offload

    def parameters(self):
        for m in self.modules:
            yield from m.parameters()

    def buffers(self):
        for m in self.modules:
            yield from m.buffers()


def _flux_inputs(res_h, res_w, batch, device, t5_tokens, dtype, with_batch_ids: bool, ckpt_grad: bool):
    kw = dict(dtype=dtype, device=device)
    n = (res_h // 16) * (res_w // 16)
    ids_shape = (batch, n, 3) if with_batch_ids else (n, 3)
    tids_shape = (batch, t5_tokens, 3) if with_batch_ids else (t5_tokens, 3)
    d = dict(
        img=torch.randn(batch, n, 64, **kw),
        txt=torch.randn(batch, t5_tokens, 4096, **kw),
        y=torch.randn(batch, 768, **kw),
        timesteps=torch.rand(batch, **kw),
        img_ids=torch.zeros(*ids_shape, **kw),
        txt_ids=torch.zeros(*tids_shape, **kw),
        guidance=torch.full((batch,), 3.5, **kw),
    )
    if ckpt_grad:
        # sd-scripts' FLUX trainer marks every floating input as requiring grad when checkpointing
        for t in d.values():
            t.requires_grad_(True)
    return d


def _sd_inputs(arch, res_h, res_w, batch, device, dtype):
    kw = dict(dtype=dtype, device=device)
    ctx = 768 if arch == "sd15" else 2048
    d = dict(
        sample=torch.randn(batch, 4, res_h // 8, res_w // 8, **kw),
        timestep=torch.randint(0, 1000, (batch,), device=device),
        encoder_hidden_states=torch.randn(batch, configs.CLIP_TOKENS, ctx, **kw),
    )
    if arch == "sdxl":
        d["text_embeds"] = torch.randn(batch, 1280, **kw)
        d["time_ids"] = torch.randn(batch, 6, **kw)
        d["adm"] = torch.randn(batch, 2816, **kw)
    return d


def build_diffusers(arch: str, rank: int, precision: str, fp8: bool) -> Setup:
    import diffusers
    from lora import add_lora

    with torch.device("meta"):
        if arch == "flux":
            model = diffusers.FluxTransformer2DModel(**configs.FLUX_DEV)
        else:
            model = diffusers.UNet2DConditionModel(**(configs.SD15_UNET if arch == "sd15" else configs.SDXL_UNET))
    n_params = sum(p.numel() for p in model.parameters())
    model = model.to(torch.bfloat16)
    lora_dtype = torch.float32 if precision == "amp" else torch.bfloat16
    with torch.device("meta"):
        n_wrapped, n_lora = add_lora(model, arch, rank=rank, lora_dtype=lora_dtype, fp8_base=fp8)
    model.train()

    def make_inputs(res_h, res_w, batch, device, t5_tokens=512, ckpt=False):
        if arch == "flux":
            d = _flux_inputs(res_h, res_w, batch, device, t5_tokens, torch.bfloat16, False, False)
            return dict(hidden_states=d["img"], encoder_hidden_states=d["txt"], pooled_projections=d["y"],
                        timestep=d["timesteps"], img_ids=d["img_ids"], txt_ids=d["txt_ids"], guidance=d["guidance"])
        d = _sd_inputs(arch, res_h, res_w, batch, device, torch.bfloat16)
        out = dict(sample=d["sample"], timestep=d["timestep"], encoder_hidden_states=d["encoder_hidden_states"])
        if arch == "sdxl":
            out["added_cond_kwargs"] = dict(text_embeds=d["text_embeds"], time_ids=d["time_ids"])
        return out

    def forward(inputs):
        out = model(**inputs, return_dict=False)
        return out[0]

    def enable_ckpt(cpu_offload: bool):
        if cpu_offload:
            raise SystemExit("cpu_offload_checkpointing exists only in sd-scripts' FLUX model; use --impl sd-scripts")
        import torch.utils.checkpoint as cp
        model.enable_gradient_checkpointing(
            gradient_checkpointing_func=lambda module, *a: cp.checkpoint(module.__call__, *a, use_reentrant=False))

    notes = ["diffusers classes; LoRA by the tracer's own kohya-style wrapper"]
    if fp8:
        notes.append("fp8: LoRA-target Linear weights stored as float8_e4m3fn, upcast per call; other layers bf16")
    return Setup(arch, "diffusers", [model], forward, make_inputs, enable_ckpt, n_params, n_wrapped, n_lora, notes)


def build_sdscripts(arch: str, rank: int, precision: str, fp8: bool, checkout: str) -> Setup:
    import logging

    import sdscripts_import

    sdscripts_import.add_checkout(checkout)
    if arch != "flux":
        raise SystemExit("--impl sd-scripts is wired for FLUX (library.flux_models + networks.lora_flux) only")
    fm = sdscripts_import.module("library.flux_models")
    lf = sdscripts_import.module("networks.lora_flux")
    logging.disable(logging.INFO)

    with torch.device("meta"):
        flux = fm.Flux(fm.configs["dev"].params)
    n_params = sum(p.numel() for p in flux.parameters())
    # as flux_train_network + train_network do it: the whole model in fp8 with fp8_base, else bf16
    flux.to(torch.float8_e4m3fn if fp8 else torch.bfloat16)
    flux.requires_grad_(False)
    with torch.device("meta"):
        net = lf.create_network(1.0, rank, rank, None, [None, None], flux)
    net.apply_to([None, None], flux, apply_text_encoder=False, apply_unet=True)
    # LoRA stays fp32 under mixed precision; full_bf16 casts the network too
    net.to(torch.float32 if precision == "amp" else torch.bfloat16)
    net.requires_grad_(True)
    flux.train()
    net.train()
    n_lora = sum(p.numel() for p in net.parameters())
    n_wrapped = len(net.unet_loras)
    state = {"ckpt": False}

    def make_inputs(res_h, res_w, batch, device, t5_tokens=512, ckpt=False):
        return _flux_inputs(res_h, res_w, batch, device, t5_tokens, torch.bfloat16, True, ckpt)

    def forward(inputs):
        return flux(img=inputs["img"], img_ids=inputs["img_ids"], txt=inputs["txt"], txt_ids=inputs["txt_ids"],
                    timesteps=inputs["timesteps"], y=inputs["y"], guidance=inputs["guidance"])

    def enable_ckpt(cpu_offload: bool):
        state["ckpt"] = True
        flux.enable_gradient_checkpointing(cpu_offload=cpu_offload)

    def offload_hooks(tracker):
        """cpu_offload_checkpointing moves each block's inputs to the GPU and its outputs back to the
        CPU.  Emulated as copies whose host side is taken out of the device count."""
        def to_cuda(x):
            if isinstance(x, torch.Tensor):
                return x.clone()
            if isinstance(x, (list, tuple)):
                return [to_cuda(e) for e in x]
            if isinstance(x, dict):
                return {k: to_cuda(v) for k, v in x.items()}
            return x

        def to_cpu(x):
            if isinstance(x, torch.Tensor):
                y = x.clone()
                tracker.to_host(y)
                return y
            if isinstance(x, (list, tuple)):
                return [to_cpu(e) for e in x]
            if isinstance(x, dict):
                return {k: to_cpu(v) for k, v in x.items()}
            return x

        fm.to_cuda = to_cuda
        fm.to_cpu = to_cpu

    notes = ["sd-scripts classes: library.flux_models.Flux + networks.lora_flux (fused qkv, 304 LoRA modules)"]
    if fp8:
        notes.append("fp8: whole FLUX model cast to float8_e4m3fn (as --fp8_base), autocast upcasts per call")
    return Setup(arch, "sd-scripts", [flux, net], forward, make_inputs, enable_ckpt, n_params, n_wrapped, n_lora,
                 notes, offload_hooks)


def build(arch: str, impl: str, rank: int, precision: str, fp8: bool, checkout: str | None,
          full: bool = False, network: str | None = None, network_args: dict | None = None) -> Setup:
    if network and impl != "sd-scripts":
        raise SystemExit("--network traces sd-scripts' own classes: --impl sd-scripts")
    if impl == "sd-scripts":
        if not checkout:
            raise SystemExit("--impl sd-scripts needs --sdscripts PATH (a checkout of the pinned sd-scripts commit)")
        if arch != "flux" or full or network:
            import models_sdscripts
            return models_sdscripts.build(arch, rank, precision, fp8, checkout, full=full, network=network,
                                          network_args=network_args)
        return build_sdscripts(arch, rank, precision, fp8, checkout)
    if full:
        raise SystemExit("--full traces sd-scripts' own classes: --impl sd-scripts")
    return build_diffusers(arch, rank, precision, fp8)
