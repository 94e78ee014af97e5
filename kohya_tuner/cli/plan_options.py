"""Options that describe a training plan, shared by `config` and `run` so both read the
same flags the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

Base = Annotated[Optional[str], typer.Option(
    "--base", help="Base model file (or a Diffusers folder / hub id for SD 1.5 and SDXL).")]
ClipL = Annotated[Optional[str], typer.Option("--clip-l", help="FLUX: CLIP-L text encoder file.")]
T5xxl = Annotated[Optional[str], typer.Option("--t5xxl", help="FLUX: T5-XXL text encoder file.")]
Ae = Annotated[Optional[str], typer.Option("--ae", help="FLUX: autoencoder file.")]
Data = Annotated[Optional[Path], typer.Option("--data", help="Folder of training images with .txt captions.")]
Name = Annotated[str, typer.Option("--name", help="Name of the LoRA file (output_name).")]
Trigger = Annotated[Optional[str], typer.Option("--trigger", help="Trigger word, set as class_tokens.")]
Steps = Annotated[Optional[int], typer.Option("--steps", help="Total optimizer steps (max_train_steps).")]
Variant = Annotated[Optional[str], typer.Option("--variant", help="FLUX.1 variant: dev (default) or schnell.")]
Preset = Annotated[Optional[Path], typer.Option(
    "--preset", help="Your own preset TOML, applied after the built-in layers.")]
Sets = Annotated[list[str], typer.Option(
    "--set", help="key=value for any sd-scripts argument; repeatable; applied last.")]
