"""Facts about each model family kohya-tuner supports.

Everything here is a fact about sd-scripts at the pinned commit or about the public
model architectures (parameter counts were counted from the real modules); nothing
is tuned. Presets, the memory model and the launcher all read from this one table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    # Names a user may type for the family besides `name` (compared without case, '-', '.', '_').
    aliases: tuple[str, ...] = ()
    # Config values that mark this family among those sharing an entry script (chroma:
    # model_type = "chroma" in flux_train_network.py; SD 2.x: v2 in train_network.py).
    selects: dict[str, Any] = field(default_factory=dict)
    # The flags that store the frozen base in fp8 ("fp8_base" for most; HunyuanImage-2.1 takes
    # only fp8_scaled; Anima forces every fp8 option off).
    fp8_flags: tuple[str, ...] = ("fp8_base",)
    # The VAE overflows in fp16 (the SD KL-f8 VAE): fp16 training needs no_half_vae.
    fp16_vae_overflows: bool = False
    # Where the family's facts come from, for docs/families.md and the assumptions.
    source: str = ""
    # Image pixels per side of one activation token: 8 for the U-Nets (latent pixels), 16 for
    # the DiTs on an /8 VAE with 2x2 patches, 32 for HunyuanImage's /32 VAE with 1x1 patches.
    latent_downscale: int = 8
    # How `blocks_to_swap` = n is split (the scripts' enable_block_swap): "uniform" swaps n
    # blocks of one list; "double_single" swaps n//2 double and (n - n//2)*2 single blocks.
    swap_layout: str = ""
    # Until the family's activations are traced: the traced family whose per-token line is
    # borrowed, and the factor it is scaled by (hidden width x blocks, relative to that family).
    activation_proxy: tuple[str, float] | None = None
    # Per text encoder: the flag that stores it in fp8 while it encodes (HunyuanImage: fp8_vl).
    te_fp8_flags: dict[str, str] = field(default_factory=dict)
    # The flag that runs the text encoders on the CPU (HunyuanImage: text_encoder_cpu).
    te_cpu_flag: str | None = None
    # sample_sampler picks the sampler of sample images (the U-Net trainers); the DiT
    # scripts' samplers are fixed (their sample_sampler lines are commented out).
    uses_sample_sampler: bool = True
    # Among families sharing a script and network module (SD3 Medium / 3.5 Medium / 3.5 Large),
    # a model file name matching this pattern (lower case) names this one.
    path_pattern: str | None = None

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
        fp16_vae_overflows=True,
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
        fp16_vae_overflows=True,
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
        latent_downscale=16,
        swap_layout="double_single",
        uses_sample_sampler=False,
        default_t5_tokens={"dev": 512, "schnell": 256},
    ),
    # ---- families added from the pinned sd-scripts' other LoRA entry scripts. Parameter counts:
    # tools/memtrace/family_targets.py (sd-scripts' own model classes on the meta device, with the
    # configurations their loaders use; the LoRA targets are in data/lora_targets.json).
    "sd2": Family(
        name="sd2",
        label="Stable Diffusion 2.x",
        script="train_network.py",
        network_module="networks.lora",
        required_files={"pretrained_model_name_or_path": "--base"},
        # train_network.py's NetworkTrainer.assert_extra_args: verify_bucket_reso_steps(64).
        bucket_step=64,
        native_resolution=768,
        resolution_floor=384,
        blocks_to_swap_max=None,
        components=(
            # library.original_unet with model_util's v2 config (head dims 5/10/20/20, 1024-wide
            # context, linear projections, as train_network.py loads it).
            Component("unet", "diffusion", 865_910_724, "U-Net (SD 2.x)"),
            # model_util's v2 CLIPTextConfig: OpenCLIP ViT-H/14 text tower, 23 of its 24 layers.
            Component("openclip_h", "text_encoder", 340_387_840, "OpenCLIP ViT-H/14 text encoder"),
            _SD_VAE,
        ),
        # 768-v: SD 2.0/2.1 768 px v-prediction; 512-base: the 512 px epsilon checkpoints.
        variants=("768-v", "512-base"),
        has_te_cache=False,
        aliases=("sd2x", "sd20", "sd21", "sd21768", "sd2768", "sd21512", "sd2512", "sdv2", "stablediffusion2"),
        selects={"v2": True},
        fp16_vae_overflows=True,
        source="train_network.py --v2 (--v_parameterization for 768-v)",
        # The SD 1.5 U-Net with wider attention: its traced line per latent pixel.
        activation_proxy=("sd15", 1.0),
    ),
    "sd3": Family(
        name="sd3",
        label="Stable Diffusion 3 Medium",
        script="sd3_train_network.py",
        network_module="networks.lora_sd3",
        required_files={"pretrained_model_name_or_path": "--base", "clip_l": "--clip-l", "clip_g": "--clip-g",
                        "t5xxl": "--t5xxl"},
        # sd3_train_network.py:64 verify_bucket_reso_steps(32); it does not call the SD trainer's check.
        bucket_step=32,
        native_resolution=1024,
        resolution_floor=384,
        # sd3_models.MMDiT.enable_block_swap asserts blocks_to_swap <= num_blocks - 2 (24 joint blocks).
        blocks_to_swap_max=22,
        components=(
            Component("mmdit", "diffusion", 2_028_328_000, "SD3 Medium MMDiT (24 joint blocks)"),
            Component("clip_l", "text_encoder", 123_650_304, "CLIP ViT-L/14 text encoder (with projection)"),
            Component("clip_g", "text_encoder", 694_659_840, "OpenCLIP ViT-bigG/14 text encoder"),
            Component("t5xxl", "text_encoder", 4_762_310_656, "T5-XXL encoder"),
            Component("vae", "vae", 83_819_683, "SD3 VAE (16 channels)"),
        ),
        attention_flags_apply=False,
        # sd3_train_utils: --t5xxl_max_token_length defaults to 256.
        aliases=("sd3m", "sd3medium", "stablediffusion3"),
        source="sd3_train_network.py",
        latent_downscale=16,
        swap_layout="uniform",
        activation_proxy=("flux", 0.211),
        uses_sample_sampler=False,
    ),
    "sd35m": Family(
        name="sd35m",
        label="Stable Diffusion 3.5 Medium",
        script="sd3_train_network.py",
        network_module="networks.lora_sd3",
        required_files={"pretrained_model_name_or_path": "--base", "clip_l": "--clip-l", "clip_g": "--clip-g",
                        "t5xxl": "--t5xxl"},
        bucket_step=32,
        native_resolution=1024,
        resolution_floor=384,
        blocks_to_swap_max=22,
        components=(
            Component("mmdit", "diffusion", 2_243_171_520, "SD3.5 Medium MMDiT (24 joint blocks, MMDiT-X)"),
            Component("clip_l", "text_encoder", 123_650_304, "CLIP ViT-L/14 text encoder (with projection)"),
            Component("clip_g", "text_encoder", 694_659_840, "OpenCLIP ViT-bigG/14 text encoder"),
            Component("t5xxl", "text_encoder", 4_762_310_656, "T5-XXL encoder"),
            Component("vae", "vae", 83_819_683, "SD3 VAE (16 channels)"),
        ),
        attention_flags_apply=False,
        aliases=("sd35medium", "sd35mediumx", "sd3.5m", "sd35mid"),
        path_pattern=r"3[._-]?5[._-]?m(edium)?\b|35m",
        source="sd3_train_network.py",
        latent_downscale=16,
        swap_layout="uniform",
        activation_proxy=("flux", 0.325),
        uses_sample_sampler=False,
    ),
    "sd35l": Family(
        name="sd35l",
        label="Stable Diffusion 3.5 Large",
        script="sd3_train_network.py",
        network_module="networks.lora_sd3",
        required_files={"pretrained_model_name_or_path": "--base", "clip_l": "--clip-l", "clip_g": "--clip-g",
                        "t5xxl": "--t5xxl"},
        bucket_step=32,
        native_resolution=1024,
        resolution_floor=384,
        # 38 joint blocks.
        blocks_to_swap_max=36,
        components=(
            Component("mmdit", "diffusion", 8_056_627_520, "SD3.5 Large MMDiT (38 joint blocks)"),
            Component("clip_l", "text_encoder", 123_650_304, "CLIP ViT-L/14 text encoder (with projection)"),
            Component("clip_g", "text_encoder", 694_659_840, "OpenCLIP ViT-bigG/14 text encoder"),
            Component("t5xxl", "text_encoder", 4_762_310_656, "T5-XXL encoder"),
            Component("vae", "vae", 83_819_683, "SD3 VAE (16 channels)"),
        ),
        attention_flags_apply=False,
        aliases=("sd35", "sd35large", "sd3.5", "sd3.5l", "sd35largeturbo", "sd35turbo"),
        path_pattern=r"3[._-]?5[._-]?l(arge)?\b|35l",
        source="sd3_train_network.py",
        latent_downscale=16,
        swap_layout="uniform",
        activation_proxy=("flux", 0.528),
        uses_sample_sampler=False,
    ),
    "chroma": Family(
        name="chroma",
        label="Chroma",
        script="flux_train_network.py",
        network_module="networks.lora_flux",
        # No CLIP-L: flux_train_network.py puts a dummy in its place for model_type chroma.
        required_files={"pretrained_model_name_or_path": "--base", "t5xxl": "--t5xxl", "ae": "--ae"},
        # flux_train_network.py calls the SD trainer's check (64) before its own (32).
        bucket_step=64,
        native_resolution=1024,
        resolution_floor=384,
        # Chroma keeps FLUX's 19 double + 38 single blocks and its enable_block_swap assert.
        blocks_to_swap_max=35,
        components=(
            Component("dit", "diffusion", 8_899_983_424, "Chroma transformer (FLUX layout, no guidance/vector inputs)"),
            Component("t5xxl", "text_encoder", 4_762_310_656, "T5-XXL encoder"),
            Component("ae", "vae", 83_819_683, "autoencoder (16 channels)"),
        ),
        attention_flags_apply=False,
        aliases=("chroma1", "chroma1hd", "chromahd", "chroma1base"),
        selects={"model_type": "chroma"},
        source="flux_train_network.py --model_type chroma",
        latent_downscale=16,
        swap_layout="double_single",
        activation_proxy=("flux", 1.000),
        uses_sample_sampler=False,
    ),
    "lumina2": Family(
        name="lumina2",
        label="Lumina Image 2.0",
        script="lumina_train_network.py",
        network_module="networks.lora_lumina",
        required_files={"pretrained_model_name_or_path": "--base", "gemma2": "--gemma2", "ae": "--ae"},
        # lumina_train_network.py calls the SD trainer's check (64), then verify_bucket_reso_steps(16).
        bucket_step=64,
        native_resolution=1024,
        resolution_floor=384,
        # lumina_models.NextDiT.enable_block_swap asserts <= len(layers) - 2 (26 layers).
        blocks_to_swap_max=24,
        components=(
            Component("dit", "diffusion", 2_609_771_456, "Lumina 2 NextDiT 2B"),
            Component("gemma2", "text_encoder", 2_614_341_888, "Gemma-2 2B text encoder"),
            Component("ae", "vae", 83_819_683, "autoencoder (FLUX AE, 16 channels)"),
        ),
        attention_flags_apply=False,
        aliases=("lumina", "lumina2", "luminaimage2", "luminaimage20", "lumina20", "netalumina"),
        source="lumina_train_network.py",
        latent_downscale=16,
        swap_layout="uniform",
        activation_proxy=("flux", 0.395),
        uses_sample_sampler=False,
    ),
    "hunyuan21": Family(
        name="hunyuan21",
        label="HunyuanImage-2.1",
        script="hunyuan_image_train_network.py",
        network_module="networks.lora_hunyuan_image",
        required_files={"pretrained_model_name_or_path": "--base", "text_encoder": "--qwen-vl", "byt5": "--byt5",
                        "vae": "--vae"},
        # hunyuan_image_train_network.py calls the SD trainer's check (64), then its own (32).
        bucket_step=64,
        native_resolution=2048,
        resolution_floor=512,
        # 20 double + 40 single blocks; enable_block_swap splits n into n//2 double and
        # (n - n//2)*2 single and asserts each <= count - 2: at most 37 (the doc's "up to 37").
        blocks_to_swap_max=37,
        components=(
            Component("dit", "diffusion", 17_425_795_520, "HunyuanImage-2.1 DiT (20 double + 40 single blocks)"),
            Component("qwen25vl", "text_encoder", 8_292_166_656, "Qwen2.5-VL 7B text encoder (whole VLM as loaded)"),
            Component("byt5", "text_encoder", 217_657_472, "ByT5-small glyph encoder"),
            Component("vae", "vae", 405_575_491, "HunyuanImage VAE (32x downsampling)"),
        ),
        attention_flags_apply=False,
        aliases=("hunyuan", "hunyuanimage", "hunyuanimage21", "hunyuan2", "hyimage", "hunyuan21image", "hy21"),
        fp8_flags=("fp8_scaled",),
        te_fp8_flags={"qwen25vl": "fp8_vl"},
        te_cpu_flag="text_encoder_cpu",
        source="hunyuan_image_train_network.py",
        latent_downscale=32,
        swap_layout="double_single",
        activation_proxy=("flux", 1.228),
        uses_sample_sampler=False,
    ),
    "anima": Family(
        name="anima",
        label="Anima",
        script="anima_train_network.py",
        network_module="networks.lora_anima",
        required_files={"pretrained_model_name_or_path": "--base", "qwen3": "--qwen3", "vae": "--vae"},
        # anima_train_network.py:77 verify_bucket_reso_steps(16) (VAE /8, patch 2); no SD trainer check.
        bucket_step=16,
        native_resolution=1024,
        resolution_floor=384,
        # anima_models enable_block_swap asserts <= num_blocks - 2 (28 blocks in load_anima_model).
        blocks_to_swap_max=26,
        components=(
            Component("dit", "diffusion", 2_091_068_928, "Anima DiT (28 blocks, with the LLM adapter)"),
            Component("qwen3", "text_encoder", 596_049_920, "Qwen3 0.6B text encoder"),
            Component("vae", "vae", 126_892_531, "Qwen-Image VAE (16 channels)"),
        ),
        attention_flags_apply=False,
        aliases=("animapreview", "cosmosanima"),
        # assert_extra_args turns fp8_base / fp8_base_unet off and sets fp8_scaled False.
        fp8_flags=(),
        source="anima_train_network.py",
        latent_downscale=16,
        swap_layout="uniform",
        activation_proxy=("flux", 0.327),
        uses_sample_sampler=False,
    ),
}

# The first family listed for a script is the one a bare script name means (train_network.py:
# SD 1.5, flux_train_network.py: FLUX.1, sd3_train_network.py: SD3 Medium).
_SCRIPT_TO_FAMILY: dict[str, str] = {}
for _f in FAMILIES.values():
    _SCRIPT_TO_FAMILY.setdefault(_f.script, _f.name)


def _key(name: str) -> str:
    return name.strip().lower().replace("-", "").replace(".", "").replace("_", "").replace(" ", "")


def get_family(name: str) -> Family:
    key = _key(name)
    aliases = {"sd15": "sd15", "sd1": "sd15", "sd": "sd15", "sdxl": "sdxl", "xl": "sdxl",
               "flux": "flux", "flux1": "flux", "fluxdev": "flux", "flux1dev": "flux",
               "fluxschnell": "flux", "flux1schnell": "flux"}
    for fam in FAMILIES.values():
        aliases.setdefault(_key(fam.name), fam.name)
        for alias in fam.aliases:
            aliases.setdefault(_key(alias), fam.name)
    if key in aliases:
        return FAMILIES[aliases[key]]
    raise UserError(
        f"Unknown model family {name!r}.",
        f"Choose one of: {', '.join(FAMILIES)} (FLUX.1 schnell is the flux family with variant schnell; "
        "SD 2.x 512 px is sd2 with variant 512-base).",
    )


def _select(candidates: list[Family], config: dict[str, Any] | None) -> Family | None:
    """The candidate a config's own values (selects) or model file name (path_pattern) name."""
    import re

    if not config:
        return None
    for fam in candidates:
        if fam.selects and all(config.get(k) == v for k, v in fam.selects.items()):
            return fam
    path = str(config.get("pretrained_model_name_or_path") or "").replace("\\", "/").rsplit("/", 1)[-1].lower()
    for fam in candidates:
        if fam.path_pattern and path and re.search(fam.path_pattern, path):
            return fam
    return None


def family_for_script(script: str, config: dict[str, Any] | None = None) -> Family | None:
    """The family whose entry script is `script` (a path or a bare name), if any. With the
    config, a family that shares the script and that the config names wins: by `selects`
    (model_type = "chroma" is Chroma, v2 = true is SD 2.x) or by the model file name."""
    base = script.replace("\\", "/").rsplit("/", 1)[-1]
    name = _SCRIPT_TO_FAMILY.get(base)
    if name is None:
        return None
    chosen = _select([f for f in FAMILIES.values() if f.script == base], config)
    return chosen or FAMILIES[name]


def family_for_config(config: dict[str, Any], *, settled_only: bool = False) -> Family | None:
    """The family a script-less config names through its network_module, when that settles it:
    the module of one family only (lora_lumina, lora_hunyuan_image, lora_anima), or one that
    `selects` / the model file name picks out (lora_flux + model_type chroma; networks.lora +
    v2; lora_sd3 + an SD3.5 file name), else the first family of that module's script (lora_sd3:
    SD3 Medium). networks.lora alone (SD 1.5 or SDXL) is left to the caller."""
    nm = str(config.get("network_module") or "")
    candidates = [f for f in FAMILIES.values() if f.network_module == nm]
    if not candidates:
        return None
    chosen = _select(candidates, config)
    if chosen:
        return chosen
    if settled_only:  # the first family of the script is a default, not what the keys say
        return candidates[0] if len(candidates) == 1 else None
    scripts = {f.script for f in candidates}
    if len(scripts) == 1:
        return FAMILIES[_SCRIPT_TO_FAMILY[scripts.pop()]]
    return None


# What sd-scripts' loaders read as a file, whatever the rest of the name looks like.
MODEL_SUFFIXES = (".safetensors", ".ckpt", ".pt", ".pth", ".bin", ".sft", ".gguf")


def looks_like_hub_id(value: str) -> bool:
    """`stabilityai/stable-diffusion-xl-base-1.0`: a name diffusers' from_pretrained downloads
    (sd-scripts passes a base that is not a file to it), not a path on this machine."""
    return (value.count("/") == 1 and "\\" not in value and ":" not in value
            and not value.startswith((".", "/", "~")) and not value.lower().endswith(MODEL_SUFFIXES))
