"""A random-weight SDXL base checkpoint that the pinned sd-scripts loads, for tests on a CPU.

Run it with the real trainer's interpreter (the realtrainer venv: torch, transformers,
diffusers, accelerate at sd-scripts' pins):

    python tools/realmodels/build_sdxl_random.py DEST --sd-scripts SD_SCRIPTS --tokcache TOKCACHE

DEST gets `sdxl-random.safetensors` (one file: U-Net, both text encoders, VAE, under the key
names of sd-scripts' own SDXL saver) and `tokcache/` (the local CLIP tokenizer of TOKCACHE
under both names sd-scripts' SDXL strategy asks for), then the `export` lines to use them.
Idempotent: a finished build (its `build.json` says what it is) is kept as it is.

Built lean so the machine's memory is not the limit: every model is created on the meta
device (accelerate's `init_empty_weights`), cast to the file's dtype there, and only then
given memory (`to_empty`) and random values, so no float32 copy ever exists; the checkpoint
is written by sd-scripts' `sdxl_model_util.save_stable_diffusion_checkpoint` with no
`save_dtype` (it would clone every tensor) through a writer that streams one tensor at a
time (safetensors' own `save_file` first copies the whole model into bytes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

# What a finished build is; a change here rebuilds.
BUILD = {"builder": "sdxl-random", "version": 1, "dtype": "bf16", "seed": 0}
MODEL_FILE = "sdxl-random.safetensors"
TOKENIZER_NAMES = ("openai_clip-vit-large-patch14", "laion_CLIP-ViT-bigG-14-laion2B-39B-b160k")

# The two SDXL text encoders as sd-scripts' loader configures them (figures only).
TEXT_ENCODER_1 = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
                      num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu",
                      layer_norm_eps=1e-05, projection_dim=768, pad_token_id=1, bos_token_id=0, eos_token_id=2)
TEXT_ENCODER_2 = dict(vocab_size=49408, hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                      num_attention_heads=20, max_position_embeddings=77, hidden_act="gelu",
                      layer_norm_eps=1e-05, projection_dim=1280, pad_token_id=1, bos_token_id=0, eos_token_id=2)

_SAFETENSORS_DTYPE = {"float16": "F16", "bfloat16": "BF16", "float32": "F32", "int64": "I64", "int32": "I32"}


def stream_save_file(tensors, filename, metadata=None) -> None:
    """The safetensors format written one tensor at a time: an 8-byte little-endian header
    length, the JSON header (names, dtypes, shapes, byte offsets), then the raw bytes."""
    import torch

    names = sorted(tensors)
    header: dict = {}
    offset = 0
    for name in names:
        t = tensors[name]
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _SAFETENSORS_DTYPE[str(t.dtype).split(".")[-1]], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned
    with open(filename, "wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        for name in names:
            t = tensors[name].detach().contiguous()
            if t.numel():
                f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))


def _randomise(model, seed: int) -> None:
    """Real storage and random values for a model built on the meta device (in place)."""
    import torch

    model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                # Norm scales 1, biases 0: what every layer starts from.
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            else:
                fan_in = p[0].numel()
                p.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=gen)
        for _name, b in model.named_buffers():
            b.zero_()


def build(dest: Path, sd_scripts: Path) -> dict:
    import torch

    sys.path.insert(0, str(sd_scripts))
    from accelerate import init_empty_weights
    from diffusers import AutoencoderKL
    from library import model_util, sdxl_model_util, sdxl_original_unet
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    dtype = getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[BUILD["dtype"]])
    t0 = time.monotonic()
    with init_empty_weights():
        unet = sdxl_original_unet.SdxlUNet2DConditionModel()
        te1 = CLIPTextModel._from_config(CLIPTextConfig(**TEXT_ENCODER_1))
        te2 = CLIPTextModelWithProjection(CLIPTextConfig(**TEXT_ENCODER_2))
        vae = AutoencoderKL(**model_util.create_vae_diffusers_config())
    counts = {}
    for i, (name, model) in enumerate((("unet", unet), ("text_encoder_1", te1), ("text_encoder_2", te2),
                                       ("vae", vae))):
        model.to(dtype)  # still on the meta device: costs nothing
        _randomise(model, BUILD["seed"] + i)
        counts[name] = sum(p.numel() for p in model.parameters())
    logit_scale = torch.tensor(math.log(100.0), dtype=dtype)
    partial = dest / f"partial-{MODEL_FILE}"
    real_save = sdxl_model_util.save_file
    sdxl_model_util.save_file = stream_save_file
    try:
        keys = sdxl_model_util.save_stable_diffusion_checkpoint(
            str(partial), te1, te2, unet, 0, 0, None, vae, logit_scale, {"kohya_tuner_random": "1"}, save_dtype=None)
    finally:
        sdxl_model_util.save_file = real_save
    os.replace(partial, dest / MODEL_FILE)
    return {**BUILD, "keys": keys, "params": counts, "bytes": (dest / MODEL_FILE).stat().st_size,
            "seconds": round(time.monotonic() - t0, 1)}


def tokenizers(dest: Path, tokcache: Path) -> Path:
    """Both names sd-scripts' SDXL strategy looks up under tokenizer_cache_dir, one local tokenizer."""
    src = next((d for d in sorted(tokcache.iterdir()) if (d / "vocab.json").is_file()), None)
    if src is None:
        raise SystemExit(f"{tokcache} holds no tokenizer folder (vocab.json)")
    out = dest / "tokcache"
    for name in TOKENIZER_NAMES:
        if not (out / name / "vocab.json").is_file():
            shutil.copytree(src, out / name, dirs_exist_ok=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest", type=Path)
    ap.add_argument("--sd-scripts", type=Path, required=True)
    ap.add_argument("--tokcache", type=Path, required=True, help="the realtrainer's tokenizer cache")
    a = ap.parse_args(argv)
    dest = a.dest.absolute()
    dest.mkdir(parents=True, exist_ok=True)
    record = dest / "build.json"
    done = None
    if record.is_file() and (dest / MODEL_FILE).is_file():
        try:
            done = json.loads(record.read_text(encoding="utf-8"))
        except ValueError:
            done = None
    if done and all(done.get(k) == v for k, v in BUILD.items()) and done.get("bytes") == (dest / MODEL_FILE).stat().st_size:
        print(f"kept: {dest / MODEL_FILE} ({done['keys']} keys, {done['bytes'] / 1e9:.2f} GB)")
    else:
        record.unlink(missing_ok=True)
        done = build(dest, a.sd_scripts.absolute())
        record.write_text(json.dumps(done, indent=1), encoding="utf-8")
        print(f"built: {dest / MODEL_FILE} ({done['keys']} keys, {done['bytes'] / 1e9:.2f} GB, {done['seconds']} s)")
    tok = tokenizers(dest, a.tokcache.absolute())
    print(f"  export KOHYA_TUNER_REAL_SDXL_MODEL={dest / MODEL_FILE}")
    print(f"  export KOHYA_TUNER_REAL_SDXL_TOKCACHE={tok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
