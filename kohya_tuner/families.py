"""Facts about each model family kohya-tuner supports.

Everything here is a fact about sd-scripts at the pinned commit or about the public
model architectures (parameter counts were counted from the real modules); nothing
is tuned. Presets, the memory model and the launcher all read from this one table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kohya_tuner.errors import UserError


@dataclass(frozen=True)
class Component:
    """One network of a model family, as it sits in memory."""

    name: str
    role: str  # "diffusion", "text_encoder" or "vae"
    params: int
    label: str


@dataclass(frozen=True)
class Family:
    name: str
    label: str
    script: str
    network_module: str
    # sd-scripts key -> the kohya-tuner CLI flag that fills it.
    required_files: dict[str, str]
    bucket_step: int
    native_resolution: int
    # The ladder never goes below this side length: smaller trains visibly worse.
    resolution_floor: int
    blocks_to_swap_max: int | None
    components: tuple[Component, ...]
    variants: tuple[str, ...] = ()
    has_te_cache: bool = True
    # Attention-kernel flags only matter for the U-Net families; FLUX always calls SDPA.
    attention_flags_apply: bool = True
    default_t5_tokens: dict[str, int] = field(default_factory=dict)

    @property
    def diffusion(self) -> Component:
        return next(c for c in self.components if c.role == "diffusion")

    @property
    def text_encoders(self) -> tuple[Component, ...]:
        return tuple(c for c in self.components if c.role == "text_encoder")

    @property
    def vae(self) -> Component:
        return next(c for c in self.components if c.role == "vae")

    def blocks_to_swap_ok(self, n: int) -> bool:
        return self.blocks_to_swap_max is not None and 1 <= n <= self.blocks_to_swap_max


_CLIP_L = Component("clip_l", "text_encoder", 123_060_480, "CLIP ViT-L/14 text encoder")
_SD_VAE = Component("vae", "vae", 83_653_863, "VAE (KL-f8, 4 channels)")

FAMILIES: dict[str, Family] = {
    "sd15": Family(
        name="sd15",
        label="Stable Diffusion 1.5",
        script="train_network.py",
        network_module="networks.lora",
        required_files={"pretrained_model_name_or_path": "--base"},
        bucket_step=64,
        native_resolution=512,
        resolution_floor=256,
        blocks_to_swap_max=None,
        components=(
            Component("unet", "diffusion", 859_520_964, "U-Net"),
            _CLIP_L,
            _SD_VAE,
        ),
        has_te_cache=False,
    ),
    "sdxl": Family(
        name="sdxl",
        label="Stable Diffusion XL",
        script="sdxl_train_network.py",
        network_module="networks.lora",
        required_files={"pretrained_model_name_or_path": "--base"},
        bucket_step=32,
        native_resolution=1024,
        resolution_floor=384,
        blocks_to_swap_max=None,
        components=(
            Component("unet", "diffusion", 2_567_463_684, "U-Net"),
            _CLIP_L,
            Component("clip_g", "text_encoder", 694_659_841, "OpenCLIP ViT-bigG/14 text encoder"),
            _SD_VAE,
        ),
    ),
    "flux": Family(
        name="flux",
        label="FLUX.1",
        script="flux_train_network.py",
        network_module="networks.lora_flux",
        required_files={
            "pretrained_model_name_or_path": "--base",
            "clip_l": "--clip-l",
            "t5xxl": "--t5xxl",
            "ae": "--ae",
        },
        # flux_train_network.py asserts multiples of 32 after calling the SD trainer's check (64).
        bucket_step=64,
        native_resolution=1024,
        resolution_floor=384,
        # 19 double + 38 single blocks; sd-scripts asserts at most double-2 / single-2.
        blocks_to_swap_max=35,
        components=(
            Component("dit", "diffusion", 11_901_408_320, "FLUX.1 transformer (DiT)"),
            _CLIP_L,
            Component("t5xxl", "text_encoder", 4_762_310_656, "T5-XXL encoder"),
            Component("ae", "vae", 83_819_683, "autoencoder (16 channels)"),
        ),
        variants=("dev", "schnell"),
        attention_flags_apply=False,
        default_t5_tokens={"dev": 512, "schnell": 256},
    ),
}

_SCRIPT_TO_FAMILY = {f.script: f.name for f in FAMILIES.values()}


def get_family(name: str) -> Family:
    key = name.strip().lower().replace("-", "").replace(".", "").replace("_", "")
    aliases = {"sd15": "sd15", "sd1": "sd15", "sd": "sd15", "sdxl": "sdxl", "xl": "sdxl",
               "flux": "flux", "flux1": "flux", "fluxdev": "flux", "flux1dev": "flux",
               "fluxschnell": "flux", "flux1schnell": "flux"}
    if key in aliases:
        return FAMILIES[aliases[key]]
    raise UserError(
        f"Unknown model family {name!r}.",
        f"Choose one of: {', '.join(FAMILIES)} (FLUX.1 schnell is the flux family with variant schnell).",
    )


def family_for_script(script: str) -> Family | None:
    """The family whose entry script is `script` (a path or a bare name), if any."""
    base = script.replace("\\", "/").rsplit("/", 1)[-1]
    name = _SCRIPT_TO_FAMILY.get(base)
    return FAMILIES[name] if name else None
