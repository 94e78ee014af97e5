"""Derive kohya_tuner/data/lora_targets.json: the shapes of every layer sd-scripts' LoRA networks wrap.

The denoisers are built on the meta device (no weights, no memory) from the pinned sd-scripts model
classes when `--sdscripts PATH` points at a checkout, and always from the diffusers classes for
comparison; the text encoders come from transformers with the public configs in configs.py.  The
targets follow the selection rules of `networks.lora` (SD1.5/SDXL) and `networks.lora_flux` (FLUX):
every Linear / Conv2d found inside modules whose class name is in the network's target list.

    python tools/memtrace/lora_targets.py --sdscripts /path/to/sd-scripts --out kohya_tuner/data/lora_targets.json

LoRA parameters of one target at rank r: linear / conv1x1: r*(in+out); conv3x3 (conv_dim): r*(9*in+out).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import configs  # noqa: E402

# Class-name targets of the networks (facts of sd-scripts at the pinned commit).
LORA_UNET_TARGETS = ["Transformer2DModel"]
LORA_UNET_CONV_TARGETS = ["ResnetBlock2D", "Downsample2D", "Upsample2D"]  # added when conv_dim is set
LORA_TE_TARGETS = ["CLIPAttention", "CLIPSdpaAttention", "CLIPMLP"]
FLUX_DOUBLE = ["DoubleStreamBlock"]
FLUX_SINGLE = ["SingleStreamBlock"]
FLUX_TE_TARGETS = ["CLIPAttention", "CLIPSdpaAttention", "CLIPMLP", "T5Attention", "T5DenseGatedActDense"]
# diffusers' FLUX classes, for the comparison layout
DIFFUSERS_FLUX_DOUBLE = ["FluxTransformerBlock"]
DIFFUSERS_FLUX_SINGLE = ["FluxSingleTransformerBlock"]

# lora_flux `type_dims` identifiers, in its order: a module belongs to the first group whose words all
# occur in its LoRA name.
FLUX_TYPES = [("img_attn", ("img_attn",)), ("txt_attn", ("txt_attn",)), ("img_mlp", ("img_mlp",)),
              ("txt_mlp", ("txt_mlp",)), ("img_mod", ("img_mod",)), ("txt_mod", ("txt_mod",)),
              ("single", ("single_blocks", "linear")), ("single_mod", ("modulation",))]


def kind_of(mod) -> str | None:
    cls = mod.__class__.__name__
    if cls == "Linear":
        return "linear"
    if cls == "Conv2d":
        return "conv1x1" if tuple(mod.kernel_size) == (1, 1) else "conv3x3"
    return None


def shape_of(mod) -> tuple[int, int]:
    if mod.__class__.__name__ == "Conv2d":
        return mod.in_channels, mod.out_channels
    return mod.in_features, mod.out_features


def enumerate_targets(root, target_classes: list[str]) -> list[tuple[str, str, int, int]]:
    """(name, kind, in, out) of every Linear/Conv2d inside a module of a target class, in the order the
    networks visit them; a layer reachable from two nested targets is listed once."""
    seen = set()
    out = []
    for name, module in root.named_modules():
        if module.__class__.__name__ not in target_classes:
            continue
        for child_name, child in module.named_modules():
            kind = kind_of(child)
            if kind is None:
                continue
            full = f"{name}.{child_name}" if child_name else name
            if full in seen:
                continue
            seen.add(full)
            fin, fout = shape_of(child)
            out.append((full, kind, fin, fout))
    return out


def aggregate(targets) -> list[list]:
    counts: "OrderedDict[tuple, int]" = OrderedDict()
    for _name, kind, fin, fout in targets:
        counts[(fin, fout, kind)] = counts.get((fin, fout, kind), 0) + 1
    return [[fin, fout, n, kind] for (fin, fout, kind), n in counts.items()]


def params_per_rank(rows: list[list], conv_kinds=("conv3x3",)) -> tuple[int, int]:
    """(params per unit of network_dim, params per unit of conv_dim)."""
    lin = sum(n * (fin + fout) for fin, fout, n, kind in rows if kind not in conv_kinds)
    conv = sum(n * (9 * fin + fout) for fin, fout, n, kind in rows if kind in conv_kinds)
    return lin, conv


def component_entry(targets, cls_name: str, impl: str) -> dict:
    rows = aggregate(targets)
    lin, conv = params_per_rank(rows)
    return {"class": cls_name, "impl": impl, "modules": len(targets), "targets": rows,
            "params_per_rank": lin, **({"params_per_conv_rank": conv} if conv else {})}


def conv_extension(root, impl: str) -> dict:
    """What `conv_dim` adds to networks.lora: the ResBlock/Down/Upsample layers.  Their 3x3 convs take
    conv_dim; the Linear time-embedding projections and 1x1 shortcut convs inside them take network_dim."""
    base = {t[0] for t in enumerate_targets(root, LORA_UNET_TARGETS)}
    extra = [t for t in enumerate_targets(root, LORA_UNET_TARGETS + LORA_UNET_CONV_TARGETS) if t[0] not in base]
    rows = aggregate(extra)
    lin, conv = params_per_rank(rows)
    return {"modules": len(extra), "modules_conv3x3": sum(1 for t in extra if t[1] == "conv3x3"),
            "targets": rows, "params_per_rank": lin, "params_per_conv_rank": conv,
            "note": "kind conv3x3 takes conv_dim (down: 3x3 in->r, up: 1x1 r->out); linear/conv1x1 take network_dim"}


def flux_layout(root, double_cls, single_cls, impl: str, name_map=None) -> dict:
    """FLUX denoiser targets grouped the way lora_flux's type_dims / train_blocks / block indices see them."""
    dbl = enumerate_targets(root, double_cls)
    sgl = enumerate_targets(root, single_cls)

    def lora_name(full: str) -> str:
        return "lora_unet_" + (name_map(full) if name_map else full).replace(".", "_")

    def per_block(targets, prefix_re):
        blocks: dict[int, list] = {}
        for full, kind, fin, fout in targets:
            m = re.match(prefix_re, full)
            idx = int(m.group(1)) if m else -1
            blocks.setdefault(idx, []).append((full, kind, fin, fout))
        first = blocks[min(blocks)]
        rows = []
        for full, kind, fin, fout in first:
            ln = lora_name(full)
            typ = next((t for t, words in FLUX_TYPES if all(w in ln for w in words)), None)
            leaf = re.sub(prefix_re, "", full).lstrip(".")
            rows.append([fin, fout, 1, kind, typ, leaf])
        uniform = all(sorted((k, a, b) for _f, k, a, b in v) == sorted((k, a, b) for _f, k, a, b in first)
                      for v in blocks.values())
        return rows, len(blocks), uniform

    prefix_d = r"^(?:double_blocks|transformer_blocks)\.(\d+)"
    prefix_s = r"^(?:single_blocks|single_transformer_blocks)\.(\d+)"
    rows_d, n_d, uni_d = per_block(dbl, prefix_d)
    rows_s, n_s, uni_s = per_block(sgl, prefix_s)
    all_rows = aggregate(dbl + sgl)
    lin, _ = params_per_rank(all_rows)
    return {
        "class": type(root).__name__, "impl": impl, "modules": len(dbl) + len(sgl), "targets": all_rows,
        "params_per_rank": lin,
        "blocks": {
            "double": {"count": n_d, "indices": f"0-{n_d - 1}", "uniform": uni_d,
                       "per_block": rows_d, "params_per_rank_per_block": sum(r[0] + r[1] for r in rows_d)},
            "single": {"count": n_s, "indices": f"0-{n_s - 1}", "uniform": uni_s,
                       "per_block": rows_s, "params_per_rank_per_block": sum(r[0] + r[1] for r in rows_s)},
        },
        "per_block_columns": ["in_features", "out_features", "count", "kind", "type_dims group", "layer"],
    }


def build_text_encoder(kind: str, cfg: dict):
    import torch
    import transformers as tf
    with torch.device("meta"):
        if kind == "t5":
            return tf.T5EncoderModel(tf.T5Config(**cfg))
        if kind == "clip_proj":
            return tf.CLIPTextModelWithProjection(tf.CLIPTextConfig(**cfg))
        return tf.CLIPTextModel(tf.CLIPTextConfig(**cfg))


def text_encoders(arch: str, targets: list[str]) -> dict:
    out = {}
    for comp, (kind, cfg) in configs.TEXT_ENCODERS[arch].items():
        model = build_text_encoder(kind, cfg)
        t = enumerate_targets(model, targets)
        entry = component_entry(t, type(model).__name__, "transformers")
        entry["n_params"] = sum(p.numel() for p in model.parameters())
        out[comp] = entry
    return out


def sdscripts_denoisers(path: str) -> tuple[dict, dict]:
    import torch
    import sdscripts_import
    prov = sdscripts_import.add_checkout(path)
    ou = sdscripts_import.module("library.original_unet")
    sx = sdscripts_import.module("library.sdxl_original_unet")
    fm = sdscripts_import.module("library.flux_models")
    import logging
    logging.getLogger().setLevel(logging.WARNING)
    with torch.device("meta"):
        # SD1.5 as sd-scripts' model_util configures it: 64x64 latents, 8 heads, CLIP-L context
        sd15 = ou.UNet2DConditionModel(sample_size=64, attention_head_dim=8, cross_attention_dim=768,
                                       use_linear_projection=False, upcast_attention=False)
        sdxl = sx.SdxlUNet2DConditionModel()
        flux = fm.Flux(fm.configs["dev"].params)
    return {"sd15": sd15, "sdxl": sdxl, "flux": flux}, prov


def diffusers_denoisers() -> dict:
    import torch
    import diffusers
    with torch.device("meta"):
        return {
            "sd15": diffusers.UNet2DConditionModel(**configs.SD15_UNET),
            "sdxl": diffusers.UNet2DConditionModel(**configs.SDXL_UNET),
            "flux": diffusers.FluxTransformer2DModel(**configs.FLUX_DEV),
        }


def denoiser_entry(arch: str, model, impl: str) -> dict:
    if arch == "flux":
        if impl == "sd-scripts":
            ent = flux_layout(model, FLUX_DOUBLE, FLUX_SINGLE, impl)
        else:
            ent = flux_layout(model, DIFFUSERS_FLUX_DOUBLE, DIFFUSERS_FLUX_SINGLE, impl)
    else:
        ent = component_entry(enumerate_targets(model, LORA_UNET_TARGETS), type(model).__name__, impl)
        ent["conv_dim_adds"] = conv_extension(model, impl)
    ent["n_params"] = sum(p.numel() for p in model.parameters())
    return ent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdscripts", help="path of an sd-scripts checkout (pinned commit) to take the model classes from")
    ap.add_argument("--out", default="kohya_tuner/data/lora_targets.json")
    ap.add_argument("--generated-by", default=None)
    args = ap.parse_args(argv)

    import torch
    import diffusers
    import transformers

    versions = {"torch": torch.__version__, "diffusers": diffusers.__version__, "transformers": transformers.__version__}
    diff = diffusers_denoisers()
    sds, prov = (sdscripts_denoisers(args.sdscripts) if args.sdscripts else ({}, None))
    if prov:
        versions["sd-scripts"] = prov["commit"] or "unknown"

    archs = {}
    for arch in ("sd15", "sdxl", "flux"):
        primary_impl = "sd-scripts" if arch in sds else "diffusers"
        primary = denoiser_entry(arch, sds.get(arch, diff[arch]), primary_impl)
        den_name = "dit" if arch == "flux" else "unet"
        te_targets = FLUX_TE_TARGETS if arch == "flux" else LORA_TE_TARGETS
        comps = {den_name: primary, **text_encoders(arch, te_targets)}
        entry = {
            "network_module": "networks.lora_flux" if arch == "flux" else "networks.lora",
            "denoiser": den_name,
            "components": comps,
        }
        if primary_impl != "diffusers":
            alt = denoiser_entry(arch, diff[arch], "diffusers")
            entry["diffusers_layout"] = {k: alt[k] for k in ("class", "modules", "params_per_rank", "targets")}
        if arch == "flux":
            entry["notes"] = [
                "train_blocks=single keeps only blocks.single, =double only blocks.double (default all).",
                "The T5-XXL encoder is wrapped only with network_args train_t5xxl=True; CLIP-L with text-encoder training.",
                "split_qkv=True splits qkv / linear1 into separate LoRAs of the same total input (more params: "
                "r*(in*3+out) for qkv) - not modelled by params_per_rank.",
            ]
        else:
            entry["notes"] = ["conv_dim adds conv_dim_adds.targets: conv3x3 at conv_dim, the rest at network_dim."]
        archs[arch] = entry

    data = {
        "format": 1,
        "generated_by": args.generated_by or "python tools/memtrace/lora_targets.py " + " ".join(sys.argv[1:]),
        "method": (
            "Models built on the meta device; a target is every Linear/Conv2d inside a module whose class name is "
            "in the network's target list (networks.lora: Transformer2DModel, + ResnetBlock2D/Downsample2D/"
            "Upsample2D with conv_dim, CLIPAttention/CLIPSdpaAttention/CLIPMLP for text encoders; "
            "networks.lora_flux: DoubleStreamBlock, SingleStreamBlock, + T5Attention/T5DenseGatedActDense). "
            "targets rows: [in_features, out_features, count, kind]."
        ),
        "lora_params_formula": {"linear": "rank*(in+out)", "conv1x1": "rank*(in+out)", "conv3x3": "conv_rank*(9*in+out)"},
        "versions": versions,
        "archs": archs,
    }
    if prov:
        data["sdscripts"] = {"commit": prov["commit"], "classes": {
            "sd15": "library.original_unet.UNet2DConditionModel",
            "sdxl": "library.sdxl_original_unet.SdxlUNet2DConditionModel",
            "flux": "library.flux_models.Flux (configs['dev'])"}}
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, args.out)
    for arch, ent in archs.items():
        comps = ", ".join(f"{k}: {v['modules']} modules, {v['params_per_rank']}/rank" for k, v in ent["components"].items())
        print(f"{arch}: {comps}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
