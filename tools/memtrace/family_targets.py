"""Count the components and LoRA targets of the families added after SD1.5 / SDXL / FLUX.1, from the
pinned sd-scripts itself, and merge them into kohya_tuner/data/lora_targets.json.

Every model is built on the meta device from sd-scripts' own classes with the configuration its loader
uses (the config literals inside the loader functions are read with `ast`, never copied), and the LoRA
network is built with the family's own `networks/lora_*.py` `create_network` at rank 1 with text-encoder
training on, so the wrapped layers are exactly the ones that module selects (target classes, exclude
patterns, embedders).  Nothing is run; no weights exist.

    KOHYA=/root/.cache/kohya-tuner/realtrainer
    $KOHYA/venv/bin/python tools/memtrace/family_targets.py --sdscripts $KOHYA/sd-scripts \
        --out kohya_tuner/data/lora_targets.json

Each new arch gets the layout of the existing entries: components (denoiser first, then the text
encoders in the order the family lists them), each with class, impl, modules, targets rows
[in_features, out_features, count, kind], params_per_rank and n_params; VAEs are listed under "vae".
"""
from __future__ import annotations

import argparse
import ast
import json
import logging
import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lora_targets import kind_of, shape_of  # noqa: E402 - one definition of a LoRA target's kind and shape


def _literal(node: ast.AST):
    """A literal with every bare name (a variable such as attn_mode) read as None."""
    class _Names(ast.NodeTransformer):
        def visit_Name(self, n):  # noqa: N802
            return ast.copy_location(ast.Constant(None), n)
    return ast.literal_eval(_Names().visit(node))


def literal_in_function(path: str, func: str, var: str):
    """The literal assigned to `var` inside `func` of the file at `path` (a dict, or a JSON string)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == func:
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == var for t in node.targets):
                    val = _literal(node.value)
                    return json.loads(val) if isinstance(val, str) else val
    raise SystemExit(f"{var} not found in {func} of {path}")


def call_kwargs_in_function(path: str, func: str, callee: str, nth: int = 0) -> dict:
    """Keyword arguments (literals) of the nth call to `callee` inside `func`."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef) and fn.name == func:
            calls = [n for n in ast.walk(fn) if isinstance(n, ast.Call)
                     and getattr(n.func, "id", getattr(n.func, "attr", None)) == callee]
            calls.sort(key=lambda c: (c.lineno, c.col_offset))
            return {k.arg: _literal(k.value) for k in calls[nth].keywords if k.arg}
    raise SystemExit(f"{callee}() not found in {func} of {path}")


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


# ---- model builders (sd-scripts classes, the loaders' configurations) -------------------------------


def build(fam: str, sds: str):
    import torch
    import transformers as tf
    from accelerate import init_empty_weights
    lib = os.path.join(sds, "library")
    out: dict = {}
    with torch.device("meta"), init_empty_weights():
        if fam in ("sd2", "sd2_512"):
            from library import model_util, original_unet
            cfg = model_util.create_unet_diffusers_config(True, True)
            unet = original_unet.UNet2DConditionModel(**cfg)
            te_cfg = call_kwargs_in_function(os.path.join(lib, "model_util.py"),
                                             "load_models_from_stable_diffusion_checkpoint", "CLIPTextConfig", 0)
            te = tf.CLIPTextModel._from_config(tf.CLIPTextConfig(**te_cfg))
            from diffusers import AutoencoderKL
            vae = AutoencoderKL(**model_util.create_vae_diffusers_config())
            out = {"denoiser": ("unet", unet, "library.original_unet.UNet2DConditionModel (v2 config, linear projection)"),
                   "text_encoders": [("text_encoder", te)], "vae": vae, "network": "networks.lora"}
        elif fam in ("sd3", "sd35m", "sd35l"):
            from library import sd3_models
            # The checkpoint-derived parameters of sd3_utils.analyze_state_dict_state for the public
            # checkpoints: SD3 Medium (depth 24, pos_embed 192, no qk norm), SD3.5 Medium (depth 24,
            # pos_embed 384, rms qk norm, x-block self-attention in layers 0-12), SD3.5 Large (depth 38,
            # pos_embed 192, rms qk norm).
            depth, pos, qk, xsa, mtype = {
                "sd3": (24, 192, None, [], "medium"),
                "sd35m": (24, 384, "rms", list(range(13)), "5-medium"),
                "sd35l": (38, 192, "rms", [], "5-large"),
            }[fam]
            params = sd3_models.SD3Params(patch_size=2, depth=depth, num_patches=pos * pos, pos_embed_max_size=pos,
                                          adm_in_channels=2048, qk_norm=qk, x_block_self_attn_layers=xsa,
                                          context_embedder_in_features=4096,
                                          context_embedder_out_features=64 * depth, model_type=mtype)
            mmdit = sd3_models.create_sd3_mmdit(params)
            f = os.path.join(lib, "sd3_utils.py")
            clip_l = tf.CLIPTextModelWithProjection._from_config(
                tf.CLIPTextConfig(**call_kwargs_in_function(f, "load_clip_l", "CLIPTextConfig")))
            clip_g = tf.CLIPTextModelWithProjection._from_config(
                tf.CLIPTextConfig(**call_kwargs_in_function(f, "load_clip_g", "CLIPTextConfig")))
            t5 = _sd3_t5(f)
            vae = sd3_models.SDVAE()
            out = {"denoiser": ("mmdit", mmdit, f"library.sd3_models.MMDiT (depth {depth}, {mtype})"),
                   "text_encoders": [("clip_l", clip_l), ("clip_g", clip_g), ("t5xxl", t5)], "vae": vae,
                   "network": "networks.lora_sd3", "net_kwargs": {"train_t5xxl": "True"}}
        elif fam == "chroma":
            from library import chroma_models, flux_models, flux_utils
            dit = chroma_models.Chroma(chroma_models.chroma_params)
            t5 = _flux_t5(os.path.join(lib, "flux_utils.py"))
            ae = flux_models.AutoEncoder(flux_models.configs["dev"].ae_params)
            out = {"denoiser": ("dit", dit, "library.chroma_models.Chroma (chroma_params)"),
                   "text_encoders": [("t5xxl", t5)], "vae": ae, "network": "networks.lora_flux",
                   "net_kwargs": {"train_t5xxl": "True"}, "te_list": lambda tes: [flux_utils.dummy_clip_l(), tes[0]]}
        elif fam == "lumina2":
            from library import lumina_models, flux_models
            dit = lumina_models.NextDiT_2B_GQA_patch2_Adaln_Refiner()
            g = literal_in_function(os.path.join(lib, "lumina_util.py"), "load_gemma2", "GEMMA2_CONFIG")
            gemma = tf.Gemma2Model._from_config(tf.Gemma2Config(**g))
            ae = flux_models.AutoEncoder(flux_models.configs["dev"].ae_params)
            out = {"denoiser": ("dit", dit, "library.lumina_models.NextDiT_2B_GQA_patch2_Adaln_Refiner"),
                   "text_encoders": [("gemma2", gemma)], "vae": ae, "network": "networks.lora_lumina"}
        elif fam == "hunyuan21":
            from library import hunyuan_image_models, hunyuan_image_vae
            dit = hunyuan_image_models.HYImageDiffusionTransformer(attn_mode="torch", split_attn=False)
            f = os.path.join(lib, "hunyuan_image_text_encoder.py")
            q = literal_in_function(f, "load_qwen2_5_vl", "QWEN2_5_VL_CONFIG_JSON")
            qwen = tf.Qwen2_5_VLForConditionalGeneration._from_config(tf.Qwen2_5_VLConfig(**q))
            b = literal_in_function(f, "load_byt5", "BYT5_CONFIG_JSON")
            byt5 = tf.T5ForConditionalGeneration._from_config(tf.T5Config(**b)).get_encoder()
            vae = hunyuan_image_vae.HunyuanVAE2D()
            out = {"denoiser": ("dit", dit, "library.hunyuan_image_models.HYImageDiffusionTransformer"),
                   "text_encoders": [("qwen25vl", qwen), ("byt5", byt5)], "vae": vae,
                   "network": "networks.lora_hunyuan_image"}
        elif fam == "anima":
            from library import anima_models, qwen_image_autoencoder_kl
            cfg = literal_in_function(os.path.join(lib, "anima_utils.py"), "load_anima_model", "dit_config")
            dit = anima_models.Anima(**{k: v for k, v in cfg.items() if v is not None}, attn_mode="torch")
            qcfg = tf.Qwen3Config.from_pretrained(os.path.join(sds, "configs", "qwen3_06b"), local_files_only=True)
            qwen3 = tf.Qwen3ForCausalLM(qcfg).model
            vcfg = literal_in_function(os.path.join(lib, "qwen_image_autoencoder_kl.py"), "load_vae", "VAE_CONFIG_JSON")
            vae = _qwen_vae(qwen_image_autoencoder_kl, vcfg)
            out = {"denoiser": ("dit", dit, "library.anima_models.Anima (load_anima_model's dit_config)"),
                   "text_encoders": [("qwen3", qwen3)], "vae": vae, "network": "networks.lora_anima",
                   "net_kwargs": {"train_llm_adapter": "false"}}
        else:
            raise SystemExit(f"unknown family {fam}")
    return out


def _sd3_t5(sd3_utils_path: str):
    # sd3_utils.load_t5xxl hands over to flux_utils.load_t5xxl: the same T5-XXL encoder.
    return _flux_t5(os.path.join(os.path.dirname(sd3_utils_path), "flux_utils.py"))


def _flux_t5(flux_utils_path: str):
    import transformers as tf
    cfg = literal_in_function(flux_utils_path, "load_t5xxl", "T5_CONFIG_JSON")
    return tf.T5EncoderModel._from_config(tf.T5Config(**cfg))


def _qwen_vae(mod, cfg: dict):
    import inspect
    sig = inspect.signature(mod.AutoencoderKLQwenImage.__init__)
    return mod.AutoencoderKLQwenImage(**{k: v for k, v in cfg.items() if k in sig.parameters})


# ---- LoRA network --------------------------------------------------------------------------------


def lora_modules(spec: dict, with_conv: bool = False) -> list:
    import importlib
    netmod = importlib.import_module(spec["network"])
    tes = [m for _n, m in spec["text_encoders"]]
    te_arg = spec["te_list"](tes) if "te_list" in spec else (tes[0] if spec["network"] == "networks.lora" else tes)
    kwargs = dict(spec.get("net_kwargs", {}))
    if with_conv:
        kwargs["conv_dim"] = "1"
    import torch
    with torch.device("meta"):
        net = netmod.create_network(1.0, 1, 1.0, spec["vae"], te_arg, spec["denoiser"][1], **kwargs)
    return list(net.text_encoder_loras) + list(net.unet_loras)


def org_of(lora):
    org = getattr(lora, "org_module", None)
    if isinstance(org, (list, tuple)):
        org = org[0]
    return org


def rows_of(loras) -> tuple[list, int]:
    counts: "OrderedDict[tuple, int]" = OrderedDict()
    for lora in loras:
        org = org_of(lora)
        kind = kind_of(org)
        fin, fout = shape_of(org)
        counts[(fin, fout, kind)] = counts.get((fin, fout, kind), 0) + 1
    rows = [[fin, fout, n, kind] for (fin, fout, kind), n in counts.items()]
    return rows, sum(n * (fin + fout) for fin, fout, n, kind in rows if kind != "conv3x3")


def lora_params_rank1(loras) -> int:
    # A LoRAModule keeps the layer it wraps as a submodule until apply_to(); count only its own weights.
    return sum(p.numel() for lora in loras for n, p in lora.named_parameters() if not n.startswith("org_module"))


def te_index(lora_name: str, n_te: int) -> int | None:
    """Which text encoder a LoRA belongs to (sd-scripts prefixes: lora_te / lora_te1.. / lora_te3)."""
    if lora_name.startswith("lora_unet"):
        return None
    if n_te == 1:
        return 0
    for i in range(n_te, 0, -1):
        if lora_name.startswith(f"lora_te{i}"):
            return i - 1
    return 0


def arch_entry(fam: str, sds: str) -> dict:
    spec = build(fam, sds)
    den_name, den, den_cls = spec["denoiser"]
    loras = lora_modules(spec)
    n_te = len(spec["text_encoders"])
    # Chroma passes [dummy CLIP-L, T5]: lora_flux names T5 lora_te3 and the dummy has no targets.
    offset = 0
    if fam == "chroma":
        n_te, offset = 3, 2
    den_loras = [lo for lo in loras if lo.lora_name.startswith("lora_unet")]
    comps: dict = {}
    rows, ppr = rows_of(den_loras)
    comps[den_name] = {"class": type(den).__name__, "impl": "sd-scripts", "built_as": den_cls,
                       "modules": len(den_loras), "targets": rows, "params_per_rank": ppr,
                       "lora_params_at_rank_1": lora_params_rank1(den_loras), "n_params": n_params(den)}
    # What network_args conv_dim adds (an empty list where the wrapped modules hold no convolutions or
    # the module ignores the key): the estimator reads it for any conv_dim, LyCORIS' included.
    if True:
        conv = [lo for lo in lora_modules(spec, with_conv=True) if lo.lora_name.startswith("lora_unet")]
        base = {lo.lora_name for lo in den_loras}
        extra = [lo for lo in conv if lo.lora_name not in base]
        erows, eppr = rows_of(extra)
        conv_ppr = sum(n * (9 * a + b) for a, b, n, k in erows if k == "conv3x3")
        comps[den_name]["conv_dim_adds"] = {
            "modules": len(extra), "modules_conv3x3": sum(1 for lo in extra if kind_of(org_of(lo)) == "conv3x3"),
            "targets": erows, "params_per_rank": eppr, "params_per_conv_rank": conv_ppr,
            "note": "kind conv3x3 takes conv_dim (down: 3x3 in->r, up: 1x1 r->out); linear/conv1x1 take network_dim"}
    for i, (name, model) in enumerate(spec["text_encoders"]):
        mine = [lo for lo in loras if not lo.lora_name.startswith("lora_unet")
                and te_index(lo.lora_name, n_te) == i + offset]
        rows, ppr = rows_of(mine)
        comps[name] = {"class": type(model).__name__, "impl": "transformers", "modules": len(mine), "targets": rows,
                       "params_per_rank": ppr, "lora_params_at_rank_1": lora_params_rank1(mine),
                       "n_params": n_params(model)}
    vae = spec["vae"]
    entry = {"network_module": spec["network"], "denoiser": den_name, "components": comps,
             "vae": {"class": type(vae).__name__, "n_params": n_params(vae)}}
    blocks = block_layout(fam, den, den_loras)
    if blocks:
        comps[den_name]["blocks"] = blocks
    return entry


def block_layout(fam: str, den, den_loras) -> dict:
    """Weight parameters per swappable block (block swap moves a block's weights to the CPU)."""
    import re
    groups = {"sd3": [("joint_blocks", "joint")], "sd35m": [("joint_blocks", "joint")],
              "sd35l": [("joint_blocks", "joint")], "chroma": [("double_blocks", "double"), ("single_blocks", "single")],
              "hunyuan21": [("double_blocks", "double"), ("single_blocks", "single")],
              "lumina2": [("layers", "layers")], "anima": [("blocks", "blocks")]}.get(fam)
    if not groups:
        return {}
    out = {}
    for attr, label in groups:
        seq = getattr(den, attr)
        sizes = [n_params(b) for b in seq]
        lin = [sum(m.weight.numel() for m in b.modules() if kind_of(m) == "linear") for b in seq]
        wrapped = [lo for lo in den_loras if re.search(rf"lora_unet_{attr}_\d+_", lo.lora_name)]
        out[label] = {"attr": attr, "count": len(seq), "params_per_block": max(sizes),
                      "linear_weight_params_per_block": max(lin), "uniform": len(set(sizes)) == 1,
                      "lora_modules": len(wrapped)}
    return out


FAMILIES = ("sd2", "sd3", "sd35m", "sd35l", "chroma", "lumina2", "hunyuan21", "anima")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdscripts", required=True)
    ap.add_argument("--out", default="kohya_tuner/data/lora_targets.json")
    ap.add_argument("--only", nargs="*", default=list(FAMILIES))
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    import sdscripts_import
    args.out = os.path.abspath(args.out)
    prov = sdscripts_import.add_checkout(args.sdscripts)
    os.chdir(args.sdscripts)  # some modules read configs/ relative to the checkout
    logging.disable(logging.WARNING)
    data = json.load(open(args.out, encoding="utf-8")) if os.path.exists(args.out) else {"archs": {}}
    for fam in args.only:
        ent = arch_entry(fam, args.sdscripts)
        ent["generated_by"] = "python tools/memtrace/family_targets.py --sdscripts PATH_TO_SD_SCRIPTS"
        ent["sdscripts_commit"] = prov["commit"]
        data["archs"][fam] = ent
        comps = ", ".join(f"{k}: {v['n_params']:,} params, {v['modules']} LoRA modules, {v['params_per_rank']}/rank"
                          + (f" (rank-1 network {v['lora_params_at_rank_1']})" if "lora_params_at_rank_1" in v else "")
                          for k, v in ent["components"].items())
        print(f"{fam}: {comps}; vae {ent['vae']['class']} {ent['vae']['n_params']:,}")
        for k, v in ent["components"].items():
            for label, b in v.get("blocks", {}).items():
                print(f"    {label}: {b}")
    if not args.dry_run:
        tmp = args.out + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1)
            fh.write("\n")
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
