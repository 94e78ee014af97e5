"""A random-weight, depth-reduced FLUX.1 dev that the pinned sd-scripts trains, for tests on a CPU.

Run it with the real trainer's interpreter (the realtrainer venv: torch, transformers,
tokenizers, accelerate at sd-scripts' pins):

    python tools/realmodels/build_flux_random.py DEST --sd-scripts SD_SCRIPTS --tokcache TOKCACHE

DEST gets the four files `flux_train_network.py` loads, under the key names of sd-scripts' own
model classes:
- `flux1-dev-d1s1.safetensors`: the FLUX.1 dev transformer with one double and one single block
  (bf16). `flux_utils.load_flow_model` counts the blocks in the checkpoint and builds a model of
  that depth, so this is a real FLUX for the trainer, about 0.5 B parameters instead of 12 B;
- `clip_l.safetensors` (bf16) and `ae.safetensors` (bf16), the full CLIP-L text model and
  autoencoder of the configs sd-scripts builds;
- `t5xxl_fp8_e4m3fn.safetensors`: the full T5-XXL encoder, stored in fp8 e4m3 like the fp8 file
  users train FLUX with. Its config is fixed in `flux_utils.load_t5xxl` (4.76 B parameters) and
  the loader assigns every tensor of the file (`load_state_dict(..., assign=True)`), so nothing
  smaller loads: a missing tensor stays on the meta device and a smaller shape is refused. fp8 is
  the cheapest file the pinned code reads (4.8 GB; bf16 would be 9.5 GB, and safetensors' loader
  holds the mapped file and its copy at once, twice the file in resident memory);
- `tokcache/`: the CLIP tokenizer of TOKCACHE under sd-scripts' CLIP-L name, and a T5 tokenizer
  of T5's vocabulary size (32,000 pieces and 100 sentinel tokens) built here with the `tokenizers`
  library, under sd-scripts' T5-XXL name, so nothing asks the hub.
Then the `export` lines to use them. Idempotent: a finished build (its `build.json` says what
it is) is kept as it is.

Built lean: every model exists only on the meta device, and each tensor is made, written and
dropped in turn, so the build's resident memory is one tensor at a time. The fp8 T5-XXL values
are random bytes with the top exponent bits cleared (magnitudes below 0.03, about 1/sqrt(4096)
like the other weights' scale), drawn as bytes because a normal draw of 4.8 billion values
takes a minute and a half on two cores.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
import time
from pathlib import Path

# What a finished build is; a change here rebuilds.
BUILD = {"builder": "flux-random", "version": 1, "variant": "dev", "double_blocks": 1, "single_blocks": 1,
         "dtype": "bf16", "t5xxl_dtype": "fp8_e4m3fn", "seed": 0}
FILES = {"model": "flux1-dev-d1s1.safetensors", "clip_l": "clip_l.safetensors",
         "t5xxl": "t5xxl_fp8_e4m3fn.safetensors", "ae": "ae.safetensors"}
CLIP_TOKENIZER = "openai_clip-vit-large-patch14"
T5_TOKENIZER = "google_t5-v1_1-xxl"
T5_PIECES = 32000  # T5 v1.1's sentencepiece vocabulary; 100 sentinel tokens follow (32,100 < 32,128 rows)
T5_SENTINELS = 100

_SAFETENSORS_DTYPE = {"float16": "F16", "bfloat16": "BF16", "float32": "F32", "float8_e4m3fn": "F8_E4M3"}
# e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits. Keeping the sign, the lowest exponent
# bit and the mantissa gives 0 and magnitudes from 2^-9 up to 1.875 * 2^-6 (never NaN, 0x7f/0xff).
_FP8_SMALL_MASK = 0b1000_1111
_FP8_ONE = 0x38  # 1.0 in e4m3fn


def _specs(model) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor the model's state dict holds (it lives on the meta device)."""
    return [(name, tuple(t.shape)) for name, t in model.state_dict().items()]


def _is_scale(name: str) -> bool:
    return name.endswith(("weight", "scale"))


def _make_tensor(name: str, shape: tuple[int, ...], dtype, gen, rng):
    """A random tensor for one state-dict entry. Vectors are norm scales (1) or biases (0), what
    every layer starts from; matrices and kernels are drawn at 1/sqrt(fan_in)."""
    import numpy as np
    import torch

    numel = math.prod(shape)
    if dtype == torch.float8_e4m3fn:
        if len(shape) <= 1:
            raw = np.full(numel, _FP8_ONE if _is_scale(name) else 0, dtype=np.uint8)
        else:
            raw = np.frombuffer(bytearray(rng.bytes(numel)), dtype=np.uint8)
            raw &= _FP8_SMALL_MASK
        return torch.from_numpy(raw).view(torch.float8_e4m3fn).reshape(shape)
    if len(shape) <= 1:
        return torch.full(shape, 1.0 if _is_scale(name) else 0.0, dtype=dtype)
    t = torch.empty(shape, dtype=torch.float32)
    t.normal_(0.0, 1.0 / math.sqrt(numel // shape[0]), generator=gen)
    return t.to(dtype)


def stream_write(specs, dtype, filename: Path, seed: int, metadata: dict | None = None) -> int:
    """A safetensors file written one tensor at a time: the 8-byte little-endian header length,
    the JSON header (names, dtypes, shapes, byte offsets), then each tensor's bytes as it is
    made. Returns the number of tensors."""
    import numpy as np
    import torch

    itemsize = torch.empty((), dtype=dtype).element_size()
    code = _SAFETENSORS_DTYPE[str(dtype).split(".")[-1]]
    header: dict = {}
    offset = 0
    for name, shape in specs:
        size = math.prod(shape) * itemsize
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    partial = filename.with_name(f"partial-{filename.name}")
    with open(partial, "wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        for name, shape in specs:
            t = _make_tensor(name, shape, dtype, gen, rng).contiguous()
            if t.numel():
                f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
            del t
    os.replace(partial, filename)
    return len(specs)


def build(dest: Path, sd_scripts: Path) -> dict:
    import torch

    sys.path.insert(0, str(sd_scripts))
    from dataclasses import replace

    from library import flux_models, flux_utils

    bf16 = torch.bfloat16
    t0 = time.monotonic()
    spec = flux_models.configs[flux_utils.MODEL_NAME_DEV]
    params = replace(spec.params, depth=BUILD["double_blocks"], depth_single_blocks=BUILD["single_blocks"])
    with torch.device("meta"):
        flux = flux_models.Flux(params)
        ae = flux_models.AutoEncoder(spec.ae_params)
    # The text encoders of the configs sd-scripts' own loaders build, with nothing loaded (meta);
    # their log would list every key as missing.
    quiet = logging.getLogger(flux_utils.__name__)
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        clip_l = flux_utils.load_clip_l(None, bf16, "cpu", state_dict={})
        t5xxl = flux_utils.load_t5xxl(None, None, "cpu", state_dict={})
    finally:
        quiet.setLevel(level)
    parts = (("model", flux, bf16), ("clip_l", clip_l, bf16), ("ae", ae, bf16), ("t5xxl", t5xxl, torch.float8_e4m3fn))
    record: dict = {**BUILD, "files": {}}
    for i, (key, model, dtype) in enumerate(parts):
        specs = _specs(model)
        t1 = time.monotonic()
        n = stream_write(specs, dtype, dest / FILES[key], BUILD["seed"] + i, {"kohya_tuner_random": "1"})
        record["files"][key] = {"file": FILES[key], "keys": n, "params": sum(math.prod(s) for _, s in specs),
                                "bytes": (dest / FILES[key]).stat().st_size,
                                "seconds": round(time.monotonic() - t1, 1)}
        del model
    record["seconds"] = round(time.monotonic() - t0, 1)
    return record


def _t5_tokenizer(out: Path) -> None:
    """A T5 tokenizer of T5 v1.1's size: a unigram model over single characters and filler pieces
    (the ids, not the words, are what a random-weight encoder needs), `</s>` appended to every
    text as T5 does, the 100 `<extra_id_N>` sentinels after the pieces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import T5TokenizerFast

    specials = ["<pad>", "</s>", "<unk>"]
    chars = [chr(c) for c in range(33, 127)]
    pieces = [(s, 0.0) for s in specials] + [("\u2581", -2.0)]
    pieces += [(c, -5.0) for c in chars] + [("\u2581" + c, -4.0) for c in chars]
    pieces += [(f"\u2581w{i}", -20.0) for i in range(T5_PIECES - len(pieces))]
    tok = Tokenizer(models.Unigram(pieces, unk_id=2))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", 1)])
    fast = T5TokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                           extra_ids=T5_SENTINELS)
    if len(fast) != T5_PIECES + T5_SENTINELS:
        raise SystemExit(f"the T5 tokenizer has {len(fast)} tokens, not {T5_PIECES + T5_SENTINELS}")
    partial = out.with_name(f"partial-{out.name}")
    shutil.rmtree(partial, ignore_errors=True)
    fast.save_pretrained(str(partial))
    os.replace(partial, out)


def tokenizers(dest: Path, tokcache: Path, clip_names: tuple[str, ...] = (CLIP_TOKENIZER,)) -> Path:
    """The names sd-scripts' strategy looks up under tokenizer_cache_dir: the CLIP tokenizer under each
    of `clip_names` (FLUX's one; SD3 adds CLIP-G's, which shares its vocabulary), and T5's."""
    src = next((d for d in sorted(tokcache.iterdir()) if (d / "vocab.json").is_file()), None)
    if src is None:
        raise SystemExit(f"{tokcache} holds no tokenizer folder (vocab.json)")
    out = dest / "tokcache"
    for name in clip_names:
        if not (out / name / "vocab.json").is_file():
            shutil.copytree(src, out / name, dirs_exist_ok=True)
    if not (out / T5_TOKENIZER / "tokenizer.json").is_file():
        _t5_tokenizer(out / T5_TOKENIZER)
    return out


def _finished(dest: Path, build: dict | None = None, keys=None) -> dict | None:
    """The build.json of a finished build of `build` (this builder's by default) holding each of `keys`
    at its recorded size, else None. An entry's `file` is relative to DEST, or absolute for a file
    another build made (the SD3 builder records the T5-XXL it reuses from here)."""
    build = BUILD if build is None else build
    try:
        done = json.loads((dest / "build.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not all(done.get(k) == v for k, v in build.items()):
        return None
    for key in (FILES if keys is None else keys):
        entry = done.get("files", {}).get(key)
        if not entry or "file" not in entry:
            return None
        f = dest / entry["file"]
        if not f.is_file() or entry.get("bytes") != f.stat().st_size:
            return None
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest", type=Path)
    ap.add_argument("--sd-scripts", type=Path, required=True)
    ap.add_argument("--tokcache", type=Path, required=True, help="the realtrainer's tokenizer cache")
    a = ap.parse_args(argv)
    dest = a.dest.absolute()
    dest.mkdir(parents=True, exist_ok=True)
    done = _finished(dest)
    total = lambda d: sum(f["bytes"] for f in d["files"].values()) / 1e9  # noqa: E731
    if done:
        print(f"kept: {dest} ({total(done):.2f} GB)")
    else:
        (dest / "build.json").unlink(missing_ok=True)
        done = build(dest, a.sd_scripts.absolute())
        (dest / "build.json").write_text(json.dumps(done, indent=1), encoding="utf-8")
        for key, f in done["files"].items():
            print(f"built: {dest / f['file']} ({f['keys']} keys, {f['params'] / 1e6:.1f} M params, "
                  f"{f['bytes'] / 1e9:.2f} GB, {f['seconds']} s)")
        print(f"built: {dest} ({total(done):.2f} GB, {done['seconds']} s)")
    tok = tokenizers(dest, a.tokcache.absolute())
    print(f"  export KOHYA_TUNER_REAL_FLUX_MODEL={dest / FILES['model']}")
    print(f"  export KOHYA_TUNER_REAL_FLUX_CLIP_L={dest / FILES['clip_l']}")
    print(f"  export KOHYA_TUNER_REAL_FLUX_T5XXL={dest / FILES['t5xxl']}")
    print(f"  export KOHYA_TUNER_REAL_FLUX_AE={dest / FILES['ae']}")
    print(f"  export KOHYA_TUNER_REAL_FLUX_TOKCACHE={tok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
