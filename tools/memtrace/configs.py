"""Public architecture configs (no torch needed) and the attention layout derived from them.

The configs are the published diffusers configs of the SD1.5 UNet, the SDXL base UNet and the
FLUX.1-dev transformer.  `attention_layout` lists every attention call one training step makes,
so a torch-free estimator can add the fp32 L^2 probability matrix that plain ("math") attention
keeps; the tracer cross-checks this list against the SDPA calls it actually sees.
"""
from __future__ import annotations

SD15_UNET = dict(
    act_fn="silu",
    attention_head_dim=8,
    block_out_channels=[320, 640, 1280, 1280],
    center_input_sample=False,
    cross_attention_dim=768,
    down_block_types=["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    downsample_padding=1,
    flip_sin_to_cos=True,
    freq_shift=0,
    in_channels=4,
    layers_per_block=2,
    mid_block_scale_factor=1,
    norm_eps=1e-5,
    norm_num_groups=32,
    out_channels=4,
    sample_size=64,
    up_block_types=["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
)

SDXL_UNET = dict(
    act_fn="silu",
    addition_embed_type="text_time",
    addition_embed_type_num_heads=64,
    addition_time_embed_dim=256,
    attention_head_dim=[5, 10, 20],
    block_out_channels=[320, 640, 1280],
    center_input_sample=False,
    cross_attention_dim=2048,
    down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
    downsample_padding=1,
    flip_sin_to_cos=True,
    freq_shift=0,
    in_channels=4,
    layers_per_block=2,
    mid_block_scale_factor=1,
    mid_block_type="UNetMidBlock2DCrossAttn",
    norm_eps=1e-5,
    norm_num_groups=32,
    out_channels=4,
    projection_class_embeddings_input_dim=2816,
    sample_size=128,
    transformer_layers_per_block=[1, 2, 10],
    up_block_types=["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    use_linear_projection=True,
)

FLUX_DEV = dict(
    attention_head_dim=128,
    guidance_embeds=True,
    in_channels=64,
    joint_attention_dim=4096,
    num_attention_heads=24,
    num_layers=19,
    num_single_layers=38,
    patch_size=1,
    pooled_projection_dim=768,
    axes_dims_rope=(16, 56, 56),
)

CONFIGS = {"sd15": SD15_UNET, "sdxl": SDXL_UNET, "flux": FLUX_DEV}

# Text context length the UNets attend to (CLIP: 75 tokens + BOS/EOS).
CLIP_TOKENS = 77

TOKEN_UNITS = {
    "sd15": "latent pixels (res/8)^2",
    "sdxl": "latent pixels (res/8)^2",
    "flux": "image tokens (res/16)^2 + T5 tokens",
    "sd2": "latent pixels (res/8)^2",
    "sd3": "image tokens (res/16)^2 + 77 CLIP + T5 tokens",
    "sd35m": "image tokens (res/16)^2 + 77 CLIP + T5 tokens",
    "sd35l": "image tokens (res/16)^2 + 77 CLIP + T5 tokens",
    "chroma": "image tokens (res/16)^2 + T5 tokens",
    "lumina2": "image tokens (res/16)^2 + Gemma2 tokens",
    "hunyuan21": "image tokens (res/32)^2 + text tokens (Qwen2.5-VL + ByT5)",
    "anima": "image tokens (res/16)^2 + the T5-length text tokens it cross-attends to",
}

# Text tokens each sd-scripts trainer feeds by default (its *_max_token_length arguments); the
# joint-attention models count them like image tokens.  HunyuanImage pads its Qwen2.5-VL captions
# to the longest in the batch (up to 1024) and ByT5 to 128; 256 + 128 is a long caption.
TEXT_TOKENS = {"flux": 512, "chroma": 512, "sd3": 256, "sd35m": 256, "sd35l": 256, "lumina2": 256,
               "hunyuan21": 256, "anima": 512}
BYT5_TOKENS = 128
ANIMA_T5_TOKENS = 512

# (latent factor, patch) of each arch's image tokens, and the text tokens added to them.
_PATCH = {"flux": 16, "chroma": 16, "sd3": 16, "sd35m": 16, "sd35l": 16, "lumina2": 16, "hunyuan21": 32, "anima": 16}


def text_tokens_in_unit(arch: str, text_tokens: int) -> int:
    if arch in ("sd3", "sd35m", "sd35l"):
        return 77 + text_tokens
    if arch == "hunyuan21":
        return text_tokens + BYT5_TOKENS
    if arch in ("flux", "chroma", "lumina2", "anima"):
        # Anima cross-attends instead of attending jointly, but its per-sample text work (the LLM
        # adapter, the cross-attention keys) makes the text length count like image tokens in the fit.
        return text_tokens
    return 0


def tokens(arch: str, res_h: int, res_w: int | None = None, t5_tokens: int | None = None) -> int:
    """Token count the activation coefficients are expressed in (per sample)."""
    res_w = res_h if res_w is None else res_w
    if arch in _PATCH:
        p = _PATCH[arch]
        txt = TEXT_TOKENS.get(arch, 0) if t5_tokens is None else t5_tokens
        return (res_h // p) * (res_w // p) + text_tokens_in_unit(arch, txt)
    return (res_h // 8) * (res_w // 8)


def _unet_layout(cfg: dict) -> list[dict]:
    """Attention calls of a diffusers UNet2DConditionModel, grouped by resolution level.

    Level l works on latent/(2^l)^2 pixels.  Each transformer block makes one self-attention
    (attn1) and one cross-attention (attn2, keys = CLIP tokens).  `attention_head_dim` in these
    configs is the number of heads (a historical misnomer in diffusers that the UNet honours).
    """
    n_levels = len(cfg["block_out_channels"])
    heads = cfg["attention_head_dim"]
    heads = heads if isinstance(heads, list) else [heads] * n_levels
    depth = cfg.get("transformer_layers_per_block", 1)
    depth = depth if isinstance(depth, list) else [depth] * n_levels
    blocks = [0] * n_levels  # transformer blocks per level
    lpb = cfg["layers_per_block"]
    for lvl, kind in enumerate(cfg["down_block_types"]):
        if kind.startswith("CrossAttn"):
            blocks[lvl] += lpb * depth[lvl]
    for i, kind in enumerate(cfg["up_block_types"]):
        lvl = n_levels - 1 - i
        if kind.startswith("CrossAttn"):
            blocks[lvl] += (lpb + 1) * depth[lvl]
    mid_lvl = n_levels - 1
    # the mid block always has one attention layer (of transformer depth) in these UNets
    mid_blocks = depth[mid_lvl]
    out = []
    for lvl in range(n_levels):
        n = blocks[lvl] + (mid_blocks if lvl == mid_lvl else 0)
        if not n:
            continue
        ch = cfg["block_out_channels"][lvl]
        h = heads[lvl]
        q_frac = 1.0 / (4 ** lvl)
        out.append(dict(level=lvl, count=n, heads=h, head_dim=ch // h, q_frac=q_frac, kv_frac=q_frac, kv_fixed=None,
                        kind="self"))
        out.append(dict(level=lvl, count=n, heads=h, head_dim=ch // h, q_frac=q_frac, kv_frac=None,
                        kv_fixed=CLIP_TOKENS, kind="cross"))
    return out


def attention_layout(arch: str) -> list[dict]:
    """Every attention call of one forward pass: query length = q_frac * tokens, key length =
    kv_frac * tokens or kv_fixed.  For FLUX, tokens already include the T5 tokens (joint attention)."""
    cfg = CONFIGS[arch]
    if arch == "flux":
        n = cfg["num_layers"] + cfg["num_single_layers"]
        return [dict(level=0, count=n, heads=cfg["num_attention_heads"], head_dim=cfg["attention_head_dim"],
                     q_frac=1.0, kv_frac=1.0, kv_fixed=None, kind="joint")]
    return _unet_layout(cfg)


def math_attention_bytes(layout: list[dict], n_tokens: int, batch: int = 1) -> dict:
    """Bytes the plain (math) attention path adds over flash, per its saved tensors.

    Per call it saves the fp32 softmax probabilities (B*H*Lq*Lk*4) and fp32 copies of q, k, v
    (the math path upcasts bf16 inputs).  Returns the sum over all calls and the largest single
    L^2 matrix (what one backward step of one layer adds transiently, or what one recomputed
    checkpointed block holds).
    """
    total_l2 = 0
    total_qkv = 0
    max_l2 = 0
    for lay in layout:
        lq = int(round(lay["q_frac"] * n_tokens))
        lk = lay["kv_fixed"] if lay["kv_fixed"] is not None else int(round(lay["kv_frac"] * n_tokens))
        l2 = batch * lay["heads"] * lq * lk * 4
        qkv = batch * lay["heads"] * (lq + 2 * lk) * lay["head_dim"] * 4
        total_l2 += lay["count"] * l2
        total_qkv += lay["count"] * qkv
        max_l2 = max(max_l2, l2)
    return dict(sum_l2=total_l2, sum_qkv_fp32=total_qkv, max_l2=max_l2)


# Structural fields of the text encoders (public configs: OpenAI CLIP ViT-L/14 text tower, OpenCLIP
# ViT-bigG/14 text tower as the transformers CLIPTextModelWithProjection, Google T5 v1.1 XXL encoder).
CLIP_L = dict(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
              num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu", projection_dim=768)
CLIP_BIGG = dict(vocab_size=49408, hidden_size=1280, intermediate_size=5120, num_hidden_layers=32,
                 num_attention_heads=20, max_position_embeddings=77, hidden_act="gelu", projection_dim=1280)
T5_XXL = dict(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
              feed_forward_proj="gated-gelu", relative_attention_num_buckets=32,
              relative_attention_max_distance=128, is_encoder_decoder=False, use_cache=False)

# Which text encoders each family's LoRA network can wrap, keyed by the component names the estimator uses.
TEXT_ENCODERS = {
    "sd15": {"text_encoder": ("clip", CLIP_L)},
    "sdxl": {"text_encoder_1": ("clip", CLIP_L), "text_encoder_2": ("clip_proj", CLIP_BIGG)},
    "flux": {"clip_l": ("clip", CLIP_L), "t5xxl": ("t5", T5_XXL)},
}
