"""What an sd-scripts config means for memory: every setting the estimator needs, resolved the
way sd-scripts resolves it (defaults, implied flags, dataset precedence), with a note for each
thing the input left unsaid."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from kohya_tuner.families import Family
from kohya_tuner.memory import finetune
from kohya_tuner.memory.data import FamilyFacts, family_facts, lora_targets
from kohya_tuner.memory.oft import MODULES as OFT_MODULES
from kohya_tuner.optimizers import ResolvedOptimizer, lookup
from kohya_tuner.prompts import MAX_SIDE

BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0}

# Sanity caps for values no run could use (they keep the arithmetic and the ladder finite).
MAX_BATCH = 4096

# Not an sd-scripts key: the preview size ("768x768") a plan writes into its own prompt file,
# carried in the config dict while the planner and the ladder weigh it; never written out.
SAMPLE_SIZE_KEY = "kohya_tuner_sample_size"


def _prompt_file_size(path: str, side: int) -> tuple[tuple[int, int] | None, str]:
    """The largest preview of a prompt file (.txt, .toml or .json), read as sd-scripts reads it
    (kohya_tuner/prompts.py), and how it was found."""
    from kohya_tuner import prompts

    return prompts.largest(path, side)


@lru_cache(maxsize=64)
def _prompt_file_size_cached(path: str, side: int, stamp) -> tuple[tuple[int, int] | None, str]:
    return _prompt_file_size(path, side)


def _sample_resolution(c: dict[str, Any], family: Family) -> tuple[tuple[int, int] | None, str]:
    """The size sample images are drawn at: the plan's own (SAMPLE_SIZE_KEY), else the prompt
    file's; None (the training resolution) when neither can be known."""
    planned = _res_pair(str(c.get(SAMPLE_SIZE_KEY) or "").replace("x", ","))
    if planned:
        return planned, f"sample images at {planned[0]}x{planned[1]}, the size the plan writes into its prompt file"
    path = str(c.get("sample_prompts"))
    try:
        st = os.stat(path)
        stamp = (st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = None
    # The ladder estimates a config many times: the file is read once per version of it.
    from kohya_tuner.prompts import default_side

    size, how = _prompt_file_size_cached(path, default_side(family.name), stamp)
    if size:
        return size, f"sample images counted at {size[0]}x{size[1]}: {how}"
    return None, f"sample images counted at the training resolution ({how})"


def network_args(config: dict[str, Any]) -> dict[str, str]:
    """`network_args` as a dict, tolerating a value that is not a list of "key=value"."""
    raw = config.get("network_args")
    items = raw if isinstance(raw, (list, tuple)) else ([raw] if isinstance(raw, str) else [])
    out: dict[str, str] = {}
    for item in items:
        if isinstance(item, str) and "=" in item:
            k, v = item.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def _true(config: dict[str, Any], key: str) -> bool:
    return bool(config.get(key))


def _int(value: Any, default: int) -> int:
    if value is None or isinstance(value, bool):
        return default
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        try:
            return int(float(value))
        except (TypeError, ValueError, OverflowError):
            return default


def _res_pair(v: Any) -> tuple[int, int] | None:
    if v is None:
        return None
    try:
        if isinstance(v, (list, tuple)) and len(v) == 2:
            pair = int(v[0]), int(v[1])
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            pair = int(v), int(v)
        else:
            nums = [int(float(x)) for x in str(v).replace(" ", "").split(",") if x]
            pair = (nums[0], nums[0]) if len(nums) == 1 else ((nums[0], nums[1]) if len(nums) >= 2 else None)
    except (TypeError, ValueError, OverflowError):
        return None
    # Under 64 px per side is no training resolution; treat it as unreadable.
    if pair is None or min(pair) < 64:
        return None
    return pair


def _dataset_levels(dataset: dict[str, Any] | None):
    """(general, [datasets]) of a dataset config, tolerating junk."""
    if not isinstance(dataset, dict):
        return {}, []
    general = dataset.get("general") if isinstance(dataset.get("general"), dict) else {}
    dss = [d for d in (dataset.get("datasets") or []) if isinstance(d, dict)]
    return general, dss


def dataset_batch_and_area(config: dict[str, Any], dataset: dict[str, Any] | None
                           ) -> tuple[int, tuple[int, int] | None, bool]:
    """The most demanding (batch, resolution) pair sd-scripts will train with, after the
    dataset file's precedence (dataset > general > training argument), and whether the
    dataset file decided either value."""
    base_batch = _int(config.get("train_batch_size"), 1)
    base_res = _res_pair(config.get("resolution"))
    general, dss = _dataset_levels(dataset)
    if not dss:
        b = _int(general.get("batch_size"), base_batch) if "batch_size" in general else base_batch
        r = _res_pair(general.get("resolution")) or base_res
        return b, r, bool(general.get("batch_size") is not None or general.get("resolution") is not None)
    best: tuple[int, tuple[int, int] | None] | None = None
    from_dataset = False
    for ds in dss:
        b, r = base_batch, base_res
        for level in (general, ds):
            if level.get("batch_size") is not None:
                b = _int(level["batch_size"], b)
                from_dataset = True
            if level.get("resolution") is not None:
                r = _res_pair(level["resolution"]) or r
                from_dataset = True
        area = (r[0] * r[1]) if r else 0
        if best is None or b * area > best[0] * ((best[1][0] * best[1][1]) if best[1] else 0):
            best = (b, r)
    assert best is not None
    return best[0], best[1], from_dataset


def _dataset_any(dataset: dict[str, Any] | None, key: str) -> bool:
    general, dss = _dataset_levels(dataset)
    if general.get(key):
        return True
    for ds in dss:
        if ds.get(key):
            return True
        for sub in ds.get("subsets") or []:
            if isinstance(sub, dict) and sub.get(key):
                return True
    return False


@dataclass
class Setup:
    family: Family
    variant: str
    mixed_precision: str
    weight_dtype: str
    lora_dtype: str
    unet_dtype: str
    te_dtypes: tuple[str, ...]
    vae_dtype: str
    t5_cache_dtype: str  # T5 while caching text-encoder outputs (FLUX)
    t5_load_dtype: str
    checkpointing: bool
    cpu_offload_checkpointing: bool
    attention: str  # "flash" (sdpa/xformers/mem_eff_attn, always for FLUX) or "math"
    attention_flag: str
    batch: int
    resolution: tuple[int, int]
    t5_tokens: int
    text_tokens: int
    cache_latents: bool
    cache_te: bool
    train_unet: bool
    te_trained: tuple[bool, ...]
    blocks_to_swap: int
    lowram: bool
    highvram: bool
    vae_batch: int
    te_batch: int
    sampling: bool
    rank: int
    conv_rank: int | None
    network_args: dict[str, str]
    optimizer: ResolvedOptimizer
    gpus: int
    assumptions: list[str] = field(default_factory=list)
    # Text encoders run on the CPU (family.te_cpu_flag) / encode in fp8 (family.te_fp8_flags).
    te_on_cpu: bool = False
    te_cache_fp8: frozenset[str] = frozenset()
    facts: FamilyFacts | None = None
    # "lora" or "full" (a full fine-tune script: every weight of the trained models trains).
    mode: str = "lora"
    # SD 1.x/2.x/SDXL encode a caption longer than 75 tokens in 77-token chunks.
    te_chunks: int = 1
    fused_backward: bool = False
    fused_groups: int = 0  # fused_optimizer_groups N; -1 = blockwise_fused_optimizers (one per block)
    network_module: str = ""
    # The size sample images are drawn at, when it is not the training resolution.
    sample_resolution: tuple[int, int] | None = None
    # Caching phases whose files are all on disk already: they encode nothing.
    caches_done: frozenset[str] = frozenset()

    @property
    def area(self) -> int:
        return self.resolution[0] * self.resolution[1]

    @property
    def latent_tokens(self) -> float:
        """Tokens the activation coefficients are counted in (data/memory_families.toml):
        latent pixels for the U-Nets, image patches plus the text tokens attended jointly for
        the transformers (Anima cross-attends to a fixed text length: patches only)."""
        w, h = self.resolution
        ds = self.family.latent_downscale
        f = self.facts or family_facts(self.family.name)
        tokens = (w / ds) * (h / ds)
        if f.tokens == "patches+text":
            tokens += self.t5_tokens + f.text_tokens_extra
        return tokens


def resolve(config: dict[str, Any], family: Family, dataset: dict[str, Any] | None = None, gpus: int = 1,
            caches_done: frozenset[str] = frozenset()) -> Setup:
    a: list[str] = []
    c = config
    fname = family.name

    mp = c.get("mixed_precision")
    if mp not in ("no", "fp16", "bf16"):
        if mp is None:
            a.append("mixed_precision unset: sd-scripts' default \"no\" trains in fp32 (weights and activations "
                     "twice the size of bf16)")
        else:
            a.append(f"mixed_precision {mp!r} is not one sd-scripts knows; counted as \"no\" (fp32)")
        mp = "no"
    weight_dtype = {"no": "fp32", "fp16": "fp16", "bf16": "bf16"}[mp]
    lora_dtype = weight_dtype if (_true(c, "full_bf16") or _true(c, "full_fp16")) and mp != "no" else "fp32"

    # The flags that really store this family's base in fp8 (families.py: fp8_flags); the others
    # the script turns off (HunyuanImage without fp8_scaled, Anima always).
    fp8_keys = family.fp8_flags + (("fp8_base_unet",) if "fp8_base" in family.fp8_flags else ())
    fp8_asked = any(_true(c, k) for k in fp8_keys)
    ignored = [k for k in ("fp8_base", "fp8_base_unet", "fp8_scaled") if _true(c, k) and k not in fp8_keys]
    if ignored:
        a.append(f"{', '.join(ignored)}: {family.label} does not take it (the script turns it off or ignores it); "
                 f"counted without it")
    facts = family_facts(fname)
    full = finetune.is_finetune(family)
    fp8_unet = fp8_asked and mp != "no" and not full
    if fp8_asked and full:
        a.append("fp8 base weights do not apply to a full fine-tune (the trained weights are kept in the training "
                 "dtype); counted without fp8")
    elif fp8_asked and mp == "no":
        a.append("fp8_base needs mixed_precision bf16 or fp16 (sd-scripts asserts); counted without fp8")
    # fp8_base_unet keeps the text encoders in the training dtype; fp8_base casts them too.
    fp8_te = fp8_unet and "fp8_base" in family.fp8_flags and _true(c, "fp8_base") and not _true(c, "fp8_base_unet")
    unet_dtype = "fp8" if fp8_unet else weight_dtype
    te_fp8 = {name for name, flag in family.te_fp8_flags.items() if _true(c, flag)}
    te_dtypes = tuple("fp8" if fp8_te or t.name in te_fp8 else weight_dtype for t in family.text_encoders)
    te_on_cpu = bool(family.te_cpu_flag) and _true(c, family.te_cpu_flag)
    vae_dtype = "fp32" if (_true(c, "no_half_vae") or mp == "no") else weight_dtype

    variant = "dev"
    if fname == "flux":
        name = str(c.get("pretrained_model_name_or_path") or "").lower()
        variant = "schnell" if "schnell" in name else "dev"
        if not name:
            a.append("FLUX.1 variant not visible from the model path; dev assumed (T5 length 512)")
    has_t5 = any(t.name == "t5xxl" for t in family.text_encoders)
    t5_file = str(c.get("t5xxl") or "").lower()
    if has_t5 and not t5_file:
        a.append("no t5xxl file named: a 16-bit T5-XXL assumed (an fp8 file with fp8_base takes 4.4 GiB less "
                 "while caching text-encoder outputs)")
    t5_file_fp8 = "fp8" in t5_file or "e4m3" in t5_file
    # With fp8_base, sd-scripts loads T5 as the file stores it; otherwise in the training dtype.
    t5_load = ("fp8" if t5_file_fp8 else "fp16") if _true(c, "fp8_base") else weight_dtype
    t5_cache = "fp8" if (_true(c, "fp8_base") and not _true(c, "fp8_base_unet") and t5_file_fp8) else weight_dtype

    ckpt = _true(c, "gradient_checkpointing")
    cpu_off = ckpt and _true(c, "cpu_offload_checkpointing") and fname == "flux"

    attention, flag = "flash", "sdpa"
    if family.attention_flags_apply:
        for key in ("mem_eff_attn", "xformers", "sdpa"):
            if _true(c, key):
                flag = key
                break
        else:
            attention, flag = "math", "none"
            a.append("no attention option (sdpa / xformers / mem_eff_attn) set: sd-scripts uses plain attention, "
                     "which keeps every attention matrix in fp32")

    batch, res, _ = dataset_batch_and_area(c, dataset)
    if batch < 1:
        batch = 1
    if batch > MAX_BATCH:
        a.append(f"batch size {batch} is beyond any GPU; counted as {MAX_BATCH}")
        batch = MAX_BATCH
    if res is not None and max(res) > MAX_SIDE:
        a.append(f"resolution {res[0]}x{res[1]} is beyond what sd-scripts trains; counted as at most {MAX_SIDE} px")
        res = (min(res[0], MAX_SIDE), min(res[1], MAX_SIDE))
    if res is None:
        res = (family.native_resolution, family.native_resolution)
        a.append(f"no resolution in the config{' or dataset' if dataset is not None else ''}: "
                 f"{family.native_resolution}x{family.native_resolution} assumed")
    # Buckets never exceed the resolution's area, so the largest bucket is the resolution itself.
    if dataset is None and c.get("dataset_config"):
        a.append("the dataset file named by dataset_config was not read (pass --dataset): its batch_size and "
                 "resolution, which win over the config's, are not known")

    t5_tokens = 0
    if facts.text_tokens_arg:
        default = family.default_t5_tokens.get(variant, facts.text_tokens)
        t5_tokens = max(1, _int(c.get(facts.text_tokens_arg), default))
    elif facts.tokens != "latent":
        t5_tokens = facts.text_tokens
    # max_token_length 150/225: the U-Nets' trainers encode the caption in 77-token chunks and
    # concatenate them (the U-Net attends to all); the transformers ignore it.
    max_tok = max(75, _int(c.get("max_token_length"), 75)) if facts.tokens == "latent" else 75
    text_tokens = max_tok + 2
    te_chunks = -(-max_tok // 75)

    cache_latents = _true(c, "cache_latents") or _true(c, "cache_latents_to_disk")
    cache_te = family.has_te_cache and (_true(c, "cache_text_encoder_outputs")
                                       or _true(c, "cache_text_encoder_outputs_to_disk"))
    unet_only = _true(c, "network_train_unet_only")
    te_only = _true(c, "network_train_text_encoder_only") and not full
    net_args = network_args(c)
    te_names = [t.name for t in family.text_encoders]
    if full:
        te_trained = finetune.te_trained(family, c)
    else:
        comps = lora_targets()["archs"].get(fname, {}).get("components", {})
        # A text encoder trains when the family's LoRA module wraps layers of it (none for
        # HunyuanImage's); T5-XXL only with train_t5xxl=True (lora_flux, lora_sd3).
        te_trained = tuple(
            not unet_only and (net_args.get("train_t5xxl") == "True" if n == "t5xxl"
                               else comps.get(n, {}).get("modules", 1) > 0)
            for n in te_names)
    if not full and str(c.get("network_module") or "") in OFT_MODULES and any(te_trained):
        # sd-scripts' OFT networks wrap only the denoiser's layers.
        a.append(f"{c.get('network_module')} wraps only the denoiser: the text encoders are not trained")
        te_trained = tuple(False for _ in te_trained)
    if fname == "sdxl" and cache_te and any(te_trained):
        a.append("SDXL refuses text-encoder output caching while the text encoders are trained "
                 "(set network_train_unet_only); counted as not cached")
        cache_te = False

    swap = 0
    if family.blocks_to_swap_max:
        swap = _int(c.get("blocks_to_swap"), 0)
        if not swap and fname == "flux" and _true(c, "split_mode"):
            swap = 18
            a.append("split_mode is deprecated; sd-scripts turns it into blocks_to_swap = 18")
        if swap and family.blocks_to_swap_max:
            swap = max(0, min(swap, family.blocks_to_swap_max))
        if swap and cpu_off:
            cpu_off = False

    rank_raw = c.get("network_dim")
    rank = max(1, _int(rank_raw, 4))
    if rank_raw is None and not full:
        a.append("network_dim unset: the LoRA module's default rank 4")
    conv_rank = max(0, _int(net_args.get("conv_dim"), 0)) or None
    nm = str(c.get("network_module") or family.network_module)
    if not full and nm not in (family.network_module, "lycoris.kohya", *OFT_MODULES):
        a.append(f"network_module {nm!r} is not {family.network_module}; trainable parameters counted as a LoRA "
                 f"of the same rank")
    script = family.script
    fused_backward = full and _true(c, "fused_backward_pass") and script in finetune.FUSED_BACKWARD_SCRIPTS
    fused_groups = 0
    if full and _int(c.get("fused_optimizer_groups"), 0) > 1 and script in finetune.OPTIMIZER_GROUP_SCRIPTS:
        fused_groups = _int(c.get("fused_optimizer_groups"), 0)
    elif full and _true(c, "blockwise_fused_optimizers") and script in finetune.BLOCKWISE_SCRIPTS:
        fused_groups = -1
    ignored_fused = [k for k in ("fused_backward_pass", "fused_optimizer_groups", "blockwise_fused_optimizers")
                     if c.get(k) and not (k == "fused_backward_pass" and fused_backward)
                     and not (k != "fused_backward_pass" and fused_groups)]
    if ignored_fused:
        a.append(f"{', '.join(ignored_fused)}: {script} takes the argument but does not act on it at the pinned "
                 f"commit; counted without it")

    opt = lookup(c.get("optimizer_type"), c.get("optimizer_args"), use_8bit_adam=_true(c, "use_8bit_adam"),
                 use_lion_optimizer=_true(c, "use_lion_optimizer"))
    if not opt.known:
        a.append(f"optimizer {opt.written!r} is not in kohya-tuner's table: its states are counted as AdamW's "
                 f"(two full moments)")
    if opt.spec.paged:
        a.append(f"{opt.spec.name} pages its states to CPU RAM under pressure; counted as resident on the GPU")

    sampling = bool(c.get("sample_prompts")) and bool(
        _int(c.get("sample_every_n_steps"), 0) or _int(c.get("sample_every_n_epochs"), 0) or _true(c, "sample_at_first"))
    sample_res = None
    if sampling:
        sample_res, said = _sample_resolution(c, family)
        a.append(said)

    if _true(c, "highvram"):
        a.append("highvram changes no placement: sd-scripts only skips emptying the CUDA cache between latent-caching "
                 "batches (train_util / strategy_*: clean_memory_on_device), so the peak is the same; nvidia-smi and "
                 "Task Manager also show what the allocator keeps cached, which the peak does not include")
    vae_batch = max(1, _int(c.get("vae_batch_size"), 1))
    te_batch = max(1, _int(c.get("text_encoder_batch_size"), batch))

    if _dataset_any(dataset, "color_aug") or _dataset_any(dataset, "random_crop"):
        if cache_latents:
            a.append("color_aug / random_crop make sd-scripts refuse latent caching")

    return Setup(
        family=family, variant=variant, mixed_precision=mp, weight_dtype=weight_dtype, lora_dtype=lora_dtype,
        unet_dtype=unet_dtype, te_dtypes=te_dtypes, vae_dtype=vae_dtype, t5_cache_dtype=t5_cache,
        t5_load_dtype=t5_load, checkpointing=ckpt, cpu_offload_checkpointing=cpu_off, attention=attention,
        attention_flag=flag, batch=batch, resolution=res, t5_tokens=t5_tokens, text_tokens=text_tokens,
        cache_latents=cache_latents, cache_te=cache_te, train_unet=not te_only, te_trained=te_trained,
        blocks_to_swap=swap, lowram=_true(c, "lowram"), highvram=_true(c, "highvram"), vae_batch=vae_batch,
        te_batch=te_batch, sampling=sampling, rank=rank, conv_rank=conv_rank, network_args=net_args,
        optimizer=opt, gpus=max(1, int(gpus or 1)), assumptions=a, te_on_cpu=te_on_cpu,
        te_cache_fp8=frozenset(te_fp8), facts=facts, mode="full" if full else "lora", te_chunks=te_chunks,
        fused_backward=fused_backward, fused_groups=fused_groups, network_module=nm, sample_resolution=sample_res,
        caches_done=_caches_done(caches_done, cache_latents, cache_te, a),
    )


def _caches_done(done: frozenset[str], cache_latents: bool, cache_te: bool, a: list[str]) -> frozenset[str]:
    out = frozenset(p for p, on in (("cache_latents", cache_latents), ("cache_text_encoder", cache_te))
                    if on and p in done)
    if "cache_latents" in out:
        a.append("every image already has its latent cache file on disk: caching latents encodes nothing "
                 "(the VAE still moves to the GPU while the files are checked)")
    if "cache_text_encoder" in out:
        a.append("every image already has its text-encoder cache file on disk: caching encodes no captions "
                 "(the text encoders still move to the GPU first, as the script does before it checks the files)")
    return out
