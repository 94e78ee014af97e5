"""Options that describe a training plan, shared by `config` and `run` so both read the
same flags the same way."""

from __future__ import annotations

import argparse
from pathlib import Path

from kohya_tuner.cli.argtypes import gpu_size, steps_int, utf8_text


def add_gpu(parser: argparse.ArgumentParser, *, required: bool, default: str | None = None,
            arch: bool = False) -> None:
    parser.add_argument("--gpu", "-g", type=gpu_size, required=required, default=default, metavar="GB|auto",
                        help="GPU memory in GB (e.g. 12), or 'auto' to read it through NVML"
                             + (f" (default: {default})" if default else "") + ".")
    if not arch:
        return
    parser.add_argument("--gpu-arch", type=_gpu_arch, metavar="ARCH",
                        help="The card's architecture when --gpu gives only a size: pascal, volta, turing, ampere, "
                             "ada, hopper or blackwell (bf16 from ampere on; otherwise fp16). Wins over NVML.")


def add_gpus(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", metavar="LIST", help="GPUs to train on, e.g. 0,1 (multi-GPU through accelerate).")


def _gpu_arch(text: str) -> str:
    from kohya_tuner.errors import UserError
    from kohya_tuner.gpu import parse_arch

    try:
        return parse_arch(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(exc.paragraph()) from None


def add_plan_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base", metavar="FILE",
                        help="Base model file (or a Diffusers folder / hub id for SD 1.5 and SDXL).")
    parser.add_argument("--clip-l", metavar="FILE", help="FLUX, SD3 / SD3.5: CLIP-L text encoder file.")
    parser.add_argument("--t5xxl", metavar="FILE", help="FLUX, Chroma, SD3 / SD3.5: T5-XXL text encoder file.")
    parser.add_argument("--ae", metavar="FILE", help="FLUX, Chroma, Lumina 2: autoencoder file.")
    parser.add_argument("--clip-g", metavar="FILE", help="SD3 / SD3.5: CLIP-G text encoder file.")
    parser.add_argument("--gemma2", metavar="FILE", help="Lumina Image 2.0: Gemma-2 2B text encoder file.")
    parser.add_argument("--qwen-vl", metavar="FILE", help="HunyuanImage-2.1: Qwen2.5-VL 7B text encoder file.")
    parser.add_argument("--byt5", metavar="FILE", help="HunyuanImage-2.1: ByT5 glyph encoder file.")
    parser.add_argument("--qwen3", metavar="FILE", help="Anima: Qwen3 0.6B text encoder (file or folder).")
    parser.add_argument("--vae", metavar="FILE", help="HunyuanImage-2.1, Anima: VAE file.")
    parser.add_argument("--network", metavar="KIND", default=None,
                        help="lora (the family's own LoRA module, the default) or lycoris:ALGO with ALGO one of "
                             "locon, loha, lokr, ia3, dylora, glora, diag-oft, boft, full (LyCORIS' kohya wrapper).")
    parser.add_argument("--data", type=Path, metavar="DIR", help="Folder of training images with .txt captions.")
    parser.add_argument("--name", default="lora", help="Name of the LoRA file (output_name; default: lora).")
    parser.add_argument("--trigger", type=utf8_text, metavar="WORD", help="Trigger word: the dataset's class_tokens, which sd-scripts uses as the caption of an image "
                             "without a caption file (captions that exist must contain it; `dataset prep "
                             "--trigger` adds it).")
    parser.add_argument("--steps", type=steps_int, metavar="N", help="Total optimizer steps (max_train_steps).")
    parser.add_argument("--variant", metavar="NAME",
                        help="FLUX.1: dev (default) or schnell; SD 2.x: 768-v (default) or 512-base.")
    parser.add_argument("--preset", type=Path, metavar="FILE",
                        help="Your own preset TOML, applied after the built-in layers.")
    parser.add_argument("--set", dest="sets", action="append", default=None, metavar="KEY=VALUE",
                        help="Any sd-scripts argument; repeatable; applied last.")


# The model-file flags beyond --base/--clip-l/--t5xxl/--ae, as families.py's required_files
# name them: their sd-scripts key by argparse dest.
_CLASSIC_FILES = ("base", "clip_l", "t5xxl", "ae")


def model_files(args: argparse.Namespace) -> dict[str, str | None]:
    """sd-scripts key -> the file given for it, for the flags of the newer families."""
    from kohya_tuner.families import FAMILIES

    out: dict[str, str | None] = {}
    for fam in FAMILIES.values():
        for key, flag in fam.required_files.items():
            dest = flag.lstrip("-").replace("-", "_")
            if dest not in _CLASSIC_FILES and hasattr(args, dest):
                out[key] = getattr(args, dest)
    return out
