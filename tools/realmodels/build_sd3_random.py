"""A random-weight, depth-reduced SD3 Medium that the pinned sd-scripts trains, for tests on a CPU.

Run it with the real trainer's interpreter (the realtrainer venv: torch, transformers,
tokenizers, accelerate at sd-scripts' pins):

    python tools/realmodels/build_sd3_random.py DEST --sd-scripts SD_SCRIPTS --tokcache TOKCACHE [--flux FLUX_DEST]

DEST gets the files `sd3_train_network.py` loads, under the key names of sd-scripts' own model
classes:
- `sd3_medium-d4.safetensors`: the SD3 Medium MMDiT (patch 2, no QK norm, no MMDiT-X attention,
  192 x 192 position grid, 2048-wide pooled vector, 4096-wide context) with 4 joint blocks under
  `model.diffusion_model.`, and the full SD3 autoencoder under `first_stage_model.` (bf16), as
  one base file like the released SD3 Medium without text encoders. `sd3_utils` reads the depth
  from x_embedder's width (64 per block) and builds a model of that depth, so this is a real
  SD3 for the trainer: 4 blocks are a 256-wide MMDiT of 4 heads instead of 24 blocks 1536 wide;
- `clip_l.safetensors` and `clip_g.safetensors` (bf16): the full CLIP-L (with its projection)
  and CLIP-G text models of the configs `sd3_utils` builds;
- `t5xxl_fp8_e4m3fn.safetensors`: the full T5-XXL in fp8 e4m3. SD3's loader hands the file to
  FLUX's (`flux_utils.load_t5xxl`, the same fixed config and key names), so a finished FLUX
  build's T5-XXL (tools/realmodels/build_flux_random.py, FLUX_DEST, by default the sibling
  `flux-random` folder) is the same file and is used where it is, saving 4.9 GB of disk and ten
  seconds; without one it is built here the same way. It must be full size: the loader assigns
  every tensor of the file and the trainer moves the model as a whole;
- `tokcache/`: the CLIP tokenizer of TOKCACHE under the CLIP-L and CLIP-G names sd-scripts'
  SD3 strategy asks for, and the FLUX builder's T5 tokenizer under T5-XXL's name, so nothing asks
  the hub.
Then the `export` lines to use them. Idempotent: a finished build (its `build.json` says what
it is) is kept as it is.

Built lean the FLUX builder's way, with its writer: every model exists only on the meta device
and each tensor is made, written and dropped in turn.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_flux_random as flux_builder  # noqa: E402  (its streaming writer, fp8 draw and T5 tokenizer)

# What a finished build is; a change here rebuilds.
BUILD = {"builder": "sd3-random", "version": 1, "variant": "medium", "depth": 4, "dtype": "bf16",
         "t5xxl_dtype": "fp8_e4m3fn", "seed": 0}
FILES = {"model": f"sd3_medium-d{BUILD['depth']}.safetensors", "clip_l": "clip_l.safetensors",
         "clip_g": "clip_g.safetensors", "t5xxl": "t5xxl_fp8_e4m3fn.safetensors"}
CLIP_TOKENIZERS = ("openai_clip-vit-large-patch14", "laion_CLIP-ViT-bigG-14-laion2B-39B-b160k")
MMDIT_PREFIX = "model.diffusion_model."
VAE_PREFIX = "first_stage_model."


def _specs(model, prefix: str = "") -> list[tuple[str, tuple[int, ...]]]:
    return [(prefix + name, shape) for name, shape in flux_builder._specs(model)]


def flux_t5xxl(flux_dest: Path) -> Path | None:
    """The T5-XXL of a finished FLUX build in the same dtype, or None."""
    done = flux_builder._finished(flux_dest)
    if not done or done.get("t5xxl_dtype") != BUILD["t5xxl_dtype"]:
        return None
    return flux_dest / flux_builder.FILES["t5xxl"]


def _text_encoders(sd3_utils, flux_utils, bf16):
    """CLIP-L, CLIP-G and T5-XXL as sd-scripts' SD3 loaders build them, with nothing loaded."""
    quiet = [logging.getLogger(m.__name__) for m in (sd3_utils, flux_utils)]
    levels = [q.level for q in quiet]
    for q in quiet:  # their log would list every key as missing
        q.setLevel(logging.WARNING)
    try:
        # sd3_utils' CLIP loaders build their fixed configs only on the way to reading weights from a
        # file; an empty file leaves every weight on the meta device.
        with tempfile.TemporaryDirectory() as tmp:
            empty = Path(tmp) / "empty.safetensors"
            head = b"{}" + b" " * 6
            empty.write_bytes(len(head).to_bytes(8, "little") + head)
            clip_l = sd3_utils.load_clip_l(str(empty), bf16, "cpu")
            clip_g = sd3_utils.load_clip_g(str(empty), bf16, "cpu")
        t5xxl = flux_utils.load_t5xxl(None, None, "cpu", state_dict={})
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
    return clip_l, clip_g, t5xxl


def build(dest: Path, sd_scripts: Path, t5xxl: Path | None) -> dict:
    import torch

    sys.path.insert(0, str(sd_scripts))
    from library import flux_utils, sd3_models, sd3_utils

    bf16 = torch.bfloat16
    t0 = time.monotonic()
    depth = BUILD["depth"]
    params = sd3_models.SD3Params(patch_size=2, depth=depth, num_patches=192 * 192, pos_embed_max_size=192,
                                  adm_in_channels=2048, qk_norm=None, x_block_self_attn_layers=[],
                                  context_embedder_in_features=4096, context_embedder_out_features=64 * depth,
                                  model_type="medium")
    with torch.device("meta"):
        mmdit = sd3_models.create_sd3_mmdit(params)
        vae = sd3_models.SDVAE(dtype=bf16, device="meta")
    clip_l, clip_g, t5 = _text_encoders(sd3_utils, flux_utils, bf16)
    parts = [("model", _specs(mmdit, MMDIT_PREFIX) + _specs(vae, VAE_PREFIX), bf16),
             ("clip_l", _specs(clip_l), bf16), ("clip_g", _specs(clip_g), bf16)]
    if t5xxl is None:
        parts.append(("t5xxl", _specs(t5), torch.float8_e4m3fn))
    del mmdit, vae, clip_l, clip_g, t5
    record: dict = {**BUILD, "files": {}}
    for i, (key, specs, dtype) in enumerate(parts):
        t1 = time.monotonic()
        n = flux_builder.stream_write(specs, dtype, dest / FILES[key], BUILD["seed"] + i, {"kohya_tuner_random": "1"})
        record["files"][key] = {"file": FILES[key], "keys": n, "params": sum(math.prod(s) for _, s in specs),
                                "bytes": (dest / FILES[key]).stat().st_size,
                                "seconds": round(time.monotonic() - t1, 1)}
    if t5xxl is not None:
        # An absolute path: the file is the FLUX build's, not DEST's.
        record["files"]["t5xxl"] = {"file": str(t5xxl), "reused": True, "bytes": t5xxl.stat().st_size}
    record["seconds"] = round(time.monotonic() - t0, 1)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest", type=Path)
    ap.add_argument("--sd-scripts", type=Path, required=True)
    ap.add_argument("--tokcache", type=Path, required=True, help="the realtrainer's tokenizer cache")
    ap.add_argument("--flux", type=Path, default=None,
                    help="a finished build_flux_random.py folder whose T5-XXL to use "
                         "(default: DEST's sibling flux-random)")
    a = ap.parse_args(argv)
    dest = a.dest.absolute()
    dest.mkdir(parents=True, exist_ok=True)
    done = flux_builder._finished(dest, BUILD, FILES)
    total = lambda d: sum(f["bytes"] for f in d["files"].values() if not f.get("reused")) / 1e9  # noqa: E731
    if done:
        print(f"kept: {dest} ({total(done):.2f} GB)")
    else:
        (dest / "build.json").unlink(missing_ok=True)
        t5xxl = flux_t5xxl((a.flux or dest.parent / "flux-random").absolute())
        done = build(dest, a.sd_scripts.absolute(), t5xxl)
        (dest / "build.json").write_text(json.dumps(done, indent=1), encoding="utf-8")
        for key, f in done["files"].items():
            if f.get("reused"):
                print(f"reused: {f['file']} ({f['bytes'] / 1e9:.2f} GB, the FLUX build's T5-XXL)")
            else:
                print(f"built: {dest / f['file']} ({f['keys']} keys, {f['params'] / 1e6:.1f} M params, "
                      f"{f['bytes'] / 1e9:.2f} GB, {f['seconds']} s)")
        print(f"built: {dest} ({total(done):.2f} GB, {done['seconds']} s)")
    tok = flux_builder.tokenizers(dest, a.tokcache.absolute(), CLIP_TOKENIZERS)
    # An absolute `file` (a reused T5-XXL) stays itself under DEST.
    files = {key: dest / done["files"][key]["file"] for key in FILES}
    print(f"  export KOHYA_TUNER_REAL_SD3_MODEL={files['model']}")
    print(f"  export KOHYA_TUNER_REAL_SD3_CLIP_L={files['clip_l']}")
    print(f"  export KOHYA_TUNER_REAL_SD3_CLIP_G={files['clip_g']}")
    print(f"  export KOHYA_TUNER_REAL_SD3_T5XXL={files['t5xxl']}")
    print(f"  export KOHYA_TUNER_REAL_SD3_TOKCACHE={tok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
