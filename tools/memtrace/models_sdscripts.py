"""Builders for the pinned sd-scripts' own denoisers beyond FLUX: the SD 1.x/2.x and SDXL U-Nets of
`library.original_unet` / `library.sdxl_original_unet`, SD3 / SD3.5 (`library.sd3_models.MMDiT`), Chroma
(`library.chroma_models.Chroma`), Lumina Image 2.0 (`library.lumina_models.NextDiT`), HunyuanImage-2.1
(`library.hunyuan_image_models.HYImageDiffusionTransformer`) and Anima (`library.anima_models.Anima`),
each with the family's own LoRA network module (`networks.lora`, `lora_sd3`, `lora_flux`, `lora_lumina`,
`lora_hunyuan_image`, `lora_anima`) created by its `create_network`.

Inputs have the shapes each `*_train_network.py` feeds: latents at the family's VAE factor, the text
encoder hidden states at their default token lengths (`configs.TEXT_TOKENS`), masks all ones (captions as
long as the padding; Chroma, Lumina and HunyuanImage trim to the mask length, so this is their worst case).
Those models read lengths back from the masks (`.item()`, `.tolist()`); `run_trace.ShadowInts` keeps small
integer and boolean tensors real beside their fake twins so those reads work on fake tensors.
"""
from __future__ import annotations

import contextlib
import logging
import os

import torch

import configs
from models import Setup

# SD3 checkpoints as sd3_utils.analyze_state_dict_state reads them: (depth, pos_embed_max_size, qk_norm,
# x_block_self_attn_layers, model_type) of the public SD3 Medium, SD3.5 Medium and SD3.5 Large files.
SD3_PARAMS = {
    "sd3": (24, 192, None, [], "medium"),
    "sd35m": (24, 384, "rms", list(range(13)), "5-medium"),
    "sd35l": (38, 192, "rms", [], "5-large"),
}

NEW_ARCHS = ("sd15", "sdxl", "sd2", "sd3", "sd35m", "sd35l", "chroma", "lumina2", "hunyuan21", "anima")


def _literal_in_function(path: str, func: str, var: str):
    """A dict literal assigned inside one of sd-scripts' loader functions (read, not copied)."""
    import ast
    import json
    tree = ast.parse(open(path, encoding="utf-8").read())
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == func:
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == var for t in node.targets):
                    class _Names(ast.NodeTransformer):
                        def visit_Name(self, n):  # noqa: N802
                            return ast.copy_location(ast.Constant(None), n)
                    val = ast.literal_eval(_Names().visit(node.value))
                    return json.loads(val) if isinstance(val, str) else val
    raise SystemExit(f"{var} not found in {func} of {path}")


def _lumina_sdpa_by_name(den) -> None:
    """Lumina's attention keeps a reference to F.scaled_dot_product_attention from construction time and
    passes the caption mask.  Look SDPA up at call time instead (so the tracer's SDPA hook sees it) and
    leave out the mask, which is all ones here: on CUDA a boolean mask sends SDPA to the memory-efficient
    kernel, which saves what the flash kernel saves plus the broadcast mask (no L^2 buffer)."""
    import torch.nn.functional as F

    def sdpa(q, k, v, attn_mask=None, scale=None, **kw):
        return F.scaled_dot_product_attention(q, k, v, scale=scale)

    for m in den.modules():
        if hasattr(m, "attention_processor"):
            m.attention_processor = sdpa


def _net(netmod, rank, vae, tes, den, alpha=None, meta=True, **kw):
    # LyCORIS' modules read their initial values back (which meta tensors cannot): they are made on the CPU,
    # a few MB at the ranks traced; the tracer moves every module to its device afterwards.
    with torch.device("meta") if meta else contextlib.nullcontext():
        net = netmod.create_network(1.0, rank, rank if alpha is None else alpha, vae, tes, den, **kw)
    net.apply_to(tes, den, apply_text_encoder=False, apply_unet=True)
    return net


def _lycoris_preset_without_timestep_embedding() -> None:
    """As lycoris_targets.py: LyCORIS' default preset lists TimestepEmbedding (for Anima), which the SD
    U-Nets also reach through its time_embedding.linear_* names; the wrapper asserts on the duplicate."""
    import copy

    from lycoris import config as lyco_config
    from lycoris import kohya

    preset = copy.deepcopy(lyco_config.PRESET["full"])
    preset["unet_target_module"] = [m for m in preset["unet_target_module"] if m != "TimestepEmbedding"]
    lyco_config.PRESET["full"] = preset
    if hasattr(kohya, "PRESET"):
        kohya.PRESET["full"] = preset


def _wrapped(net) -> list:
    return list(getattr(net, "unet_ofts", None) or getattr(net, "unet_loras", []))


def _params(net) -> list:
    # sd-scripts' OFT networks keep their modules in a plain list, not as submodules.
    if hasattr(net, "unet_ofts"):
        return [p for m in net.unet_ofts for p in m.parameters()]
    return list(net.parameters())


def build(arch: str, rank: int, precision: str, fp8: bool, checkout: str, full: bool = False,
          network: str | None = None, network_args: dict | None = None) -> Setup:
    import sdscripts_import

    sdscripts_import.add_checkout(checkout)
    logging.disable(logging.WARNING)
    cwd = os.getcwd()
    os.chdir(checkout)  # Anima's adapter reads configs/ relative to the checkout
    try:
        return _build(arch, rank, precision, fp8, checkout, full, network, network_args or {})
    finally:
        os.chdir(cwd)


def _build(arch: str, rank: int, precision: str, fp8: bool, checkout: str, full: bool = False,
           network: str | None = None, network_args: dict | None = None) -> Setup:
    imp = __import__("importlib").import_module
    bf16 = torch.bfloat16
    text_len = configs.TEXT_TOKENS.get(arch, 0)
    net_kw: dict = {}
    with torch.device("meta"):
        if arch in ("sd15", "sd2"):
            ou = imp("library.original_unet")
            if arch == "sd2":
                mu = imp("library.model_util")
                den = ou.UNet2DConditionModel(**mu.create_unet_diffusers_config(True, True))
            else:
                den = ou.UNet2DConditionModel(sample_size=64, attention_head_dim=8, cross_attention_dim=768,
                                              use_linear_projection=False, upcast_attention=False)
            den.set_use_sdpa(True)
            netmod, cls = imp("networks.lora"), "library.original_unet.UNet2DConditionModel"
        elif arch == "flux":
            fm = imp("library.flux_models")
            den = fm.Flux(fm.configs["dev"].params)
            netmod, cls = imp("networks.lora_flux"), "library.flux_models.Flux (configs['dev'])"
        elif arch == "sdxl":
            den = imp("library.sdxl_original_unet").SdxlUNet2DConditionModel()
            den.set_use_sdpa(True)
            netmod, cls = imp("networks.lora"), "library.sdxl_original_unet.SdxlUNet2DConditionModel"
        elif arch in SD3_PARAMS:
            sm = imp("library.sd3_models")
            depth, pos, qk, xsa, mtype = SD3_PARAMS[arch]
            params = sm.SD3Params(patch_size=2, depth=depth, num_patches=pos * pos, pos_embed_max_size=pos,
                                  adm_in_channels=2048, qk_norm=qk, x_block_self_attn_layers=xsa,
                                  context_embedder_in_features=4096, context_embedder_out_features=64 * depth,
                                  model_type=mtype)
            den = sm.create_sd3_mmdit(params, attn_mode="torch")
            netmod, cls = imp("networks.lora_sd3"), f"library.sd3_models.MMDiT (depth {depth}, {mtype})"
        elif arch == "chroma":
            cm = imp("library.chroma_models")
            den = cm.Chroma(cm.chroma_params)
            netmod, cls = imp("networks.lora_flux"), "library.chroma_models.Chroma (chroma_params)"
        elif arch == "lumina2":
            den = imp("library.lumina_models").NextDiT_2B_GQA_patch2_Adaln_Refiner()
            _lumina_sdpa_by_name(den)
            netmod, cls = imp("networks.lora_lumina"), "library.lumina_models.NextDiT_2B_GQA_patch2_Adaln_Refiner"
        elif arch == "hunyuan21":
            den = imp("library.hunyuan_image_models").HYImageDiffusionTransformer(attn_mode="torch", split_attn=False)
            netmod, cls = imp("networks.lora_hunyuan_image"), "library.hunyuan_image_models.HYImageDiffusionTransformer"
        elif arch == "anima":
            am = imp("library.anima_models")
            cfg = _literal_in_function(os.path.join(checkout, "library", "anima_utils.py"), "load_anima_model",
                                       "dit_config")
            den = am.Anima(**{k: v for k, v in cfg.items() if v is not None}, attn_mode="torch")
            netmod, cls = imp("networks.lora_anima"), "library.anima_models.Anima (load_anima_model's dit_config)"
            net_kw = {"train_llm_adapter": "false"}
        else:
            raise SystemExit(f"--impl sd-scripts has no builder for {arch}")
    n_params = sum(p.numel() for p in den.parameters())
    if full:
        # A full fine-tune: every weight trains, kept as fp32 master weights under mixed precision
        # (bf16 with --full_bf16); no network.
        den.to(torch.float32 if precision == "amp" else bf16)
        den.requires_grad_(True)
        den.train()
        return _setup(arch, den, None, n_params, precision, fp8, text_len, cls + " (full fine-tune)")
    # As train_network does it: the denoiser in the weight dtype (fp8 with --fp8_base), frozen.
    den.to(torch.float8_e4m3fn if fp8 else bf16)
    den.requires_grad_(False)
    # The denoiser alone is wrapped (text encoders are not traced): empty stand-ins where a network
    # module insists on indexing its text-encoder list.
    tes = [None, None] if arch == "chroma" else ([torch.nn.Module()] if arch == "lumina2" else [])
    alpha, meta = None, True
    if network:
        netmod, net_kw = imp(network), dict(network_args or {})
        if network == "lycoris.kohya" and arch != "anima":
            _lycoris_preset_without_timestep_embedding()
        # OFT keeps its identity blocks as plain tensors, which the tracer could not move off the meta device;
        # LyCORIS' modules read their initial values back. (Its "full" algorithm copies the wrapped weights,
        # which meta tensors do not have, either way: it is not traced.)
        meta = False
        alpha = 1e-3 if network.startswith("networks.oft") else 1.0
    net = _net(netmod, rank, None, tes, den, alpha=alpha, meta=meta, **net_kw)
    for p in _params(net):
        p.data = p.data.to(torch.float32 if precision == "amp" else bf16)
        p.requires_grad_(True)
    den.train()
    net.train()
    return _setup(arch, den, net, n_params, precision, fp8, text_len,
                  f"{cls} + {netmod.__name__} {net_kw or ''} ({len(_wrapped(net))} modules)")


def _setup(arch, den, net, n_params, precision, fp8, text_len, desc) -> Setup:
    bf16 = torch.bfloat16
    n_lora = sum(p.numel() for p in (_params(net) if net is not None else den.parameters()))

    def make_inputs(res_h, res_w, batch, device, t5_tokens=None, ckpt=False):
        kw = dict(dtype=bf16, device=device)
        L = t5_tokens or text_len
        ones = dict(dtype=torch.int64, device=device)
        if arch == "flux":
            n = (res_h // 16) * (res_w // 16)
            d = dict(img=torch.randn(batch, n, 64, **kw), img_ids=torch.zeros(batch, n, 3, **kw),
                     txt=torch.randn(batch, L, 4096, **kw), txt_ids=torch.zeros(batch, L, 3, **kw),
                     y=torch.randn(batch, 768, **kw), timesteps=torch.rand(batch, **kw),
                     guidance=torch.full((batch,), 3.5, **kw))
        elif arch in ("sd15", "sd2", "sdxl"):
            ctx = {"sd15": 768, "sd2": 1024, "sdxl": 2048}[arch]
            d = dict(x=torch.randn(batch, 4, res_h // 8, res_w // 8, **kw),
                     t=torch.randint(0, 1000, (batch,), device=device),
                     ctx=torch.randn(batch, configs.CLIP_TOKENS, ctx, **kw))
            if arch == "sdxl":
                d["y"] = torch.randn(batch, 2816, **kw)
        elif arch in SD3_PARAMS:
            d = dict(x=torch.randn(batch, 16, res_h // 8, res_w // 8, **kw), t=torch.rand(batch, **kw),
                     ctx=torch.randn(batch, 77 + L, 4096, **kw), y=torch.randn(batch, 2048, **kw))
        elif arch == "chroma":
            n = (res_h // 16) * (res_w // 16)
            d = dict(img=torch.randn(batch, n, 64, **kw), img_ids=torch.zeros(batch, n, 3, **kw),
                     txt=torch.randn(batch, L, 4096, **kw), txt_ids=torch.zeros(batch, L, 3, **kw),
                     y=torch.zeros(batch, 768, **kw), timesteps=torch.rand(batch, **kw),
                     guidance=torch.zeros(batch, **kw), mask=torch.ones(batch, L, **ones))
        elif arch == "lumina2":
            d = dict(x=torch.randn(batch, 16, res_h // 8, res_w // 8, **kw), t=torch.rand(batch, **kw),
                     cap=torch.randn(batch, L, 2304, **kw), mask=torch.ones(batch, L, dtype=torch.int32, device=device))
        elif arch == "hunyuan21":
            lb = configs.BYT5_TOKENS
            d = dict(x=torch.randn(batch, 64, res_h // 32, res_w // 32, **kw), t=torch.rand(batch, **kw) * 1000,
                     txt=torch.randn(batch, L, 3584, **kw), mask=torch.ones(batch, L, **ones),
                     byt5=torch.randn(batch, lb, 1472, **kw), byt5_mask=torch.ones(batch, lb, **ones))
        else:  # anima
            d = dict(x=torch.randn(batch, 16, 1, res_h // 8, res_w // 8, **kw), t=torch.rand(batch, **kw),
                     ctx=torch.randn(batch, L, 1024, **kw), pad=torch.zeros(batch, 1, res_h // 8, res_w // 8, **kw),
                     ids=torch.zeros(batch, configs.ANIMA_T5_TOKENS, **ones),
                     tmask=torch.ones(batch, configs.ANIMA_T5_TOKENS, **ones), smask=torch.ones(batch, L, **ones))
        if ckpt:
            # The DiT trainers mark the noisy input and text conditions as requiring grad when checkpointing.
            for t in d.values():
                if t.dtype.is_floating_point:
                    t.requires_grad_(True)
        return d

    def forward(i):
        if arch in ("sd15", "sd2"):
            return den(i["x"], i["t"], i["ctx"]).sample
        if arch == "sdxl":
            return den(i["x"], i["t"], i["ctx"], i["y"])
        if arch in SD3_PARAMS:
            return den(i["x"], i["t"], context=i["ctx"], y=i["y"])
        if arch == "chroma":
            return den(img=i["img"], img_ids=i["img_ids"], txt=i["txt"], txt_ids=i["txt_ids"], y=i["y"],
                       timesteps=i["timesteps"], guidance=i["guidance"], txt_attention_mask=i["mask"])
        if arch == "flux":
            return den(img=i["img"], img_ids=i["img_ids"], txt=i["txt"], txt_ids=i["txt_ids"], y=i["y"],
                       timesteps=i["timesteps"], guidance=i["guidance"])
        if arch == "lumina2":
            return den(i["x"], i["t"], cap_feats=i["cap"], cap_mask=i["mask"])
        if arch == "hunyuan21":
            out = den(i["x"], i["t"], i["txt"], i["mask"], i["byt5"], i["byt5_mask"])
            return out[0] if isinstance(out, (tuple, list)) else out
        return den(i["x"], i["t"], i["ctx"], padding_mask=i["pad"], target_input_ids=i["ids"],
                   target_attention_mask=i["tmask"], source_attention_mask=i["smask"])

    def enable_ckpt(cpu_offload: bool):
        if cpu_offload:
            den.enable_gradient_checkpointing(cpu_offload=True)
        else:
            den.enable_gradient_checkpointing()

    notes = [f"sd-scripts classes: {desc}"]
    if fp8:
        notes.append("fp8: whole denoiser cast to float8_e4m3fn (as --fp8_base), autocast upcasts per call")
    modules = [den] + ((list(net.unet_ofts) if hasattr(net, "unet_ofts") else [net]) if net is not None else [])
    n_wrapped = len(_wrapped(net)) if net is not None else 0
    return Setup(arch, "sd-scripts", modules, forward, make_inputs, enable_ckpt, n_params, n_wrapped, n_lora, notes)
