"""Derive kohya_tuner/data/lycoris_targets.json: the layers LyCORIS (`network_module = "lycoris.kohya"`)
wraps in each family's models, and reference parameter counts to check kohya-tuner's per-algorithm
formulas against.

The models are sd-scripts' own classes on the meta device (models_sdscripts.py, no LoRA applied) and the
text encoders transformers' classes from the public configs. LyCORIS itself is imported from a scratch
install (`pip install --target DIR lycoris-lora`; nothing of it is copied here): its kohya wrapper picks the
layers with its default preset, at rank 1 with algo=lora; each picked layer's shape is recorded as
[in, out, kernel, count, kind] rows. Then the wrapper is built again per algorithm at rank 8 and its trainable
parameters are counted: `reference` in the output, which tests/test_memory_lycoris.py compares with
kohya_tuner.memory.lycoris's formulas.

    PYTHONPATH=/tmp/lyco $KOHYA/venv/bin/python tools/memtrace/lycoris_targets.py --sdscripts $KOHYA/sd-scripts \
        --out kohya_tuner/data/lycoris_targets.json
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

REF_RANK = 8
# Algorithm -> extra network_args the reference build uses (LoKr: the default factor -1).
# "full" (native fine-tuning) copies the wrapped weights, which meta tensors do not have: its count (the
# wrapped weights and biases themselves) is not built here.
# BOFT needs every wrapped width to be an even block size (at most the rank) times a power of two: 320 and
# 640 (the SD U-Nets) are 10 x 2^k, which rank 8 cannot reach, so its reference build uses rank 16.
ALGOS = {"locon": {}, "loha": {}, "lokr": {}, "ia3": {}, "dylora": {}, "glora": {}, "diag-oft": {},
         "boft": {"rank": 16}}


def denoiser(arch: str, checkout: str):
    import torch

    import models_sdscripts as ms
    import sdscripts_import

    sdscripts_import.add_checkout(checkout)
    imp = __import__("importlib").import_module
    with torch.device("meta"):
        if arch == "sd15":
            return imp("library.original_unet").UNet2DConditionModel(
                sample_size=64, attention_head_dim=8, cross_attention_dim=768, use_linear_projection=False,
                upcast_attention=False)
        if arch == "sdxl":
            return imp("library.sdxl_original_unet").SdxlUNet2DConditionModel()
        if arch == "flux":
            fm = imp("library.flux_models")
            return fm.Flux(fm.configs["dev"].params)
        if arch in ms.SD3_PARAMS:
            sm = imp("library.sd3_models")
            depth, pos, qk, xsa, mtype = ms.SD3_PARAMS[arch]
            return sm.create_sd3_mmdit(sm.SD3Params(
                patch_size=2, depth=depth, num_patches=pos * pos, pos_embed_max_size=pos, adm_in_channels=2048,
                qk_norm=qk, x_block_self_attn_layers=xsa, context_embedder_in_features=4096,
                context_embedder_out_features=64 * depth, model_type=mtype), attn_mode="torch")
        if arch == "chroma":
            cm = imp("library.chroma_models")
            return cm.Chroma(cm.chroma_params)
        if arch == "lumina2":
            return imp("library.lumina_models").NextDiT_2B_GQA_patch2_Adaln_Refiner()
        if arch == "hunyuan21":
            return imp("library.hunyuan_image_models").HYImageDiffusionTransformer(attn_mode="torch", split_attn=False)
        if arch == "anima":
            cfg = ms._literal_in_function(os.path.join(checkout, "library", "anima_utils.py"), "load_anima_model",
                                          "dit_config")
            return imp("library.anima_models").Anima(**{k: v for k, v in cfg.items() if v is not None},
                                                     attn_mode="torch")
    raise SystemExit(f"no denoiser builder for {arch}")


def text_encoders(arch: str):
    import torch
    import transformers as tf

    import configs

    out = []
    with torch.device("meta"):
        for name, (kind, cfg) in configs.TEXT_ENCODERS.get(arch, {}).items():
            if kind == "t5":
                continue  # lycoris.kohya wraps T5 only with train_t5xxl
            cls = tf.CLIPTextModelWithProjection if kind == "clip_proj" else tf.CLIPTextModel
            out.append((name, cls(tf.CLIPTextConfig(**cfg))))
    return out


def org_shape(mod) -> tuple[int, int, int, str]:
    cls = mod.__class__.__name__
    if cls.startswith("Conv"):
        k = mod.kernel_size[0] if isinstance(mod.kernel_size, tuple) else mod.kernel_size
        return mod.in_channels // mod.groups, mod.out_channels, int(k), "conv"
    return mod.in_features, mod.out_features, 1, "linear"


def build_network(kohya, algo: str, rank: int, tes, den, **extra):
    kw = {"algo": algo, "conv_dim": str(rank), "conv_alpha": "1", **{k: str(v) for k, v in extra.items()}}
    # The wrapper's own weights are made on the CPU (a few MB at rank 8; some algorithms read their
    # initial values back, which meta tensors cannot); the models stay on the meta device.
    return kohya.create_network(1.0, rank, 1.0, None, [m for _n, m in tes], den, **kw)


def params_of(net) -> int:
    seen = set()
    total = 0
    for lo in list(net.text_encoder_loras) + list(net.unet_loras):
        for n, p in lo.named_parameters():
            if n.startswith("org_module") or id(p) in seen:
                continue
            seen.add(id(p))
            total += p.numel()
    return total


def rows_of(loras) -> list[list]:
    counts: "OrderedDict[tuple, int]" = OrderedDict()
    for lo in loras:
        org = lo.org_module[0] if isinstance(getattr(lo, "org_module", None), (list, tuple)) else lo.org_module
        key = org_shape(org)
        counts[key] = counts.get(key, 0) + 1
    return [[a, b, k, n, kind] for (a, b, k, kind), n in counts.items()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdscripts", required=True)
    ap.add_argument("--out", default="kohya_tuner/data/lycoris_targets.json")
    ap.add_argument("--archs", default="sd15,sdxl,flux,sd3,sd35m,sd35l,chroma,lumina2,hunyuan21,anima")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    from lycoris import kohya
    import lycoris

    out = {"format": 1, "generated_by": "python tools/memtrace/lycoris_targets.py --sdscripts PATH_TO_SD_SCRIPTS "
           "(PYTHONPATH with lycoris-lora)", "lycoris_version": getattr(lycoris, "__version__", None)
           or _dist_version(), "reference_rank": REF_RANK,
           "rows": "[in_features, out_features, kernel, count, kind]: the layers the default preset wraps",
           "archs": {}}
    import copy

    from lycoris import config as lyco_config
    full_preset = copy.deepcopy(lyco_config.PRESET["full"])
    for arch in args.archs.split(","):
        # The default preset lists TimestepEmbedding for Anima; in the SD U-Nets that class is also reached by
        # the preset's "time_embedding.linear_*" names, and the wrapper asserts on the duplicate name.
        preset = copy.deepcopy(full_preset)
        if arch != "anima":
            preset["unet_target_module"] = [m for m in preset["unet_target_module"] if m != "TimestepEmbedding"]
        lyco_config.PRESET["full"] = preset
        if hasattr(kohya, "PRESET"):
            kohya.PRESET["full"] = preset
        den = denoiser(arch, os.path.abspath(args.sdscripts))
        tes = text_encoders(arch)
        net = build_network(kohya, "lora", 1, tes, den)
        ent = {"unet": rows_of(net.unet_loras), "text_encoder": rows_of(net.text_encoder_loras), "reference": {}}
        for algo, extra in ALGOS.items():
            extra = dict(extra)
            rank = extra.pop("rank", REF_RANK)
            try:
                ref = build_network(kohya, algo, rank, tes, den, **extra)
            except Exception as exc:  # the algorithm refuses a width of this family: said, not counted
                ent.setdefault("refused", {})[algo] = f"rank {rank}: {type(exc).__name__}: {exc}"
                continue
            ent["reference"][algo] = {"rank": rank, "unet": params_of(type("N", (), {"text_encoder_loras": [],
                                                                        "unet_loras": ref.unet_loras})),
                                      "text_encoder": params_of(type("N", (), {"text_encoder_loras":
                                                                               ref.text_encoder_loras,
                                                                               "unet_loras": []}))}
        out["archs"][arch] = ent
        print(arch, len(net.unet_loras), "unet modules,", len(net.text_encoder_loras), "te modules;",
              {a: r["unet"] for a, r in ent["reference"].items()}, flush=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, args.out)
    return 0


def _dist_version():
    try:
        from importlib.metadata import version
        return version("lycoris-lora")
    except Exception:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
