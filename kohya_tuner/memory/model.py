"""The peak-VRAM model of one sd-scripts LoRA run, phase by phase.

Each phase sd-scripts goes through is summed from its parts:

* model_load: the weights on the GPU right after the models are moved there (text encoders
  arrive in 16-bit before an fp8 cast);
* cache_latents: the VAE encoding `vae_batch_size` images at the largest bucket;
* cache_text_encoder: the text encoders encoding captions (DiT and VAE parked on the CPU);
* training: resident weights + LoRA weights + gradients + optimizer states + activations
  (traced coefficients, linear in tokens x batch) + batch data;
* sampling: weights + LoRA + optimizer states + the text encoders and VAE sampling needs +
  the larger of a denoising step (with CFG for the U-Nets) and the VAE decode;
* saving: the training state plus a copy of the LoRA weights.

Every phase adds cuBLAS/cuDNN workspaces and allocator fragmentation (a share of what is
allocated and freed every step). The peak is the largest phase: what PyTorch's caching
allocator must hold, which decides an out-of-memory. The CUDA context lies outside the
allocator: the budget leaves room for it, and the monitor figure adds it (memory/monitor.py).
Parameter counts come from `families.py` (real architectures), LoRA counts from
`data/lora_targets.json`, activations from `data/memory_coefficients.json`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel, Field

from kohya_tuner.families import Family
from kohya_tuner.memory import data, finetune, monitor
from kohya_tuner.memory.lora import flux_block_weight_params, flux_grad_input_weight_params, swapped_block_weight_params
from kohya_tuner.memory.setup import BYTES, Setup, resolve
from kohya_tuner.memory.trainable import activation_extra, network
from kohya_tuner.optimizers import state_bytes_per_param

GIB = float(1024**3)
MIB = float(1024**2)

# The sizes people buy: the table `estimate` prints fits / does not fit for.
GPU_SIZES = (6, 8, 10, 12, 16, 20, 24, 32, 48, 80)

# cuBLAS keeps a small workspace per stream (from PyTorch's allocator).
CUBLAS_WORKSPACE_GIB = 0.03
# cuDNN picks convolution algorithms with workspaces that grow with the feature maps; the
# U-Nets are convolution-heavy, FLUX is not. Per megapixel of batch, capped.
CUDNN_WORKSPACE_GIB_PER_MPIX = 0.15
CUDNN_WORKSPACE_CAP_GIB = 1.0
# The caching allocator reserves more than it hands out: blocks freed every step leave
# holes. A share of what is allocated and freed every step (activations, gradients, batch).
FRAGMENTATION = 0.08

# A card sold as N GB shows about 2 % less to CUDA (driver reservations): a 12 GB RTX 3060
# reports 11.76 GiB of total capacity in PyTorch's OOM messages. The CUDA context takes its
# share of that before the allocator reserves anything (memory/monitor.py, by driver).
USABLE_FRACTION = 0.98
# Headroom the fit leaves on top of the model: run-to-run variation, the display (on a
# desktop), a larger bucket arriving late.
SAFETY_GIB = 0.25
SAFETY_FRACTION = 0.015

# VAE (both the SD KL-f8 VAE and the FLUX autoencoder: channels 128/256/512/512). Without
# gradients only a few feature maps are alive at once; the widest at full resolution are the
# 128-channel maps of the first encoder level (about four alive: input to the residual
# block, its normalised and activated copies, the conv output) and, when decoding, the
# 256-channel maps the last up-sampling produces (about three).
VAE_ENCODE_ELEMS_PER_PIXEL = 4 * 128
VAE_DECODE_ELEMS_PER_PIXEL = 3 * 256

# Text encoders: (width, MLP width, layers, heads, token-embedding params).
TE_DIMS = {
    "clip_l": (768, 3072, 12, 12, 49408 * 768),
    "clip_g": (1280, 5120, 32, 20, 49408 * 1280),
    "t5xxl": (4096, 10240, 24, 64, 32128 * 4096),
}

# FLUX transformer: hidden width and number of blocks (19 double + 38 single).
FLUX_HIDDEN = 3072
FLUX_BLOCKS = 57

PHASES = ("model_load", "cache_latents", "cache_text_encoder", "training", "sampling", "saving")


class Estimate(BaseModel):
    """A prediction of the peak GPU memory of one run, with its parts. Data only.

    `peak_gib` is what PyTorch's caching allocator holds at the peak: the tensors alive plus the
    fragmentation it cannot hand out (`reserved_gib`). A run runs out of memory when that no
    longer fits the card less the CUDA context, so it decides the fit; `monitor_gib` adds the
    context, as nvidia-smi shows the process."""

    model: str
    peak_gib: float
    peak_phase: str
    components_gib: dict[str, float]
    phases_gib: dict[str, float]
    assumptions: list[str] = Field(default_factory=list)
    component_notes: dict[str, str] = Field(default_factory=dict)
    phase_components_gib: dict[str, dict[str, float]] = Field(default_factory=dict)
    lora_params: int = 0
    settings: dict[str, Any] = Field(default_factory=dict)
    correction: float = 1.0
    # memory/monitor.py: what PyTorch allocates, what its allocator reserves, what a monitor shows.
    allocated_gib: float = 0.0
    reserved_gib: float = 0.0
    monitor_gib: float = 0.0
    # The NVIDIA driver version the CUDA context is sized for (None: lazy module loading assumed).
    driver: str | None = None

    @property
    def uncorrected_peak_gib(self) -> float:
        """The peak before any history correction: what history.jsonl must record as
        `predicted_gib`, or the correction would feed on itself."""
        return self.peak_gib / self.correction if self.correction else self.peak_gib

    def fits(self, gb: float, *, other_gib: float = 0.0) -> bool:
        return self.peak_gib <= budget_gib(gb, other_processes_gib=other_gib, driver=self.driver)

    def fits_table(self, other_gib: float = 0.0) -> dict[str, bool]:
        return {str(g): self.fits(g, other_gib=other_gib) for g in GPU_SIZES}

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "peak_gib": round(self.peak_gib, 3),
            "peak_phase": self.peak_phase,
            "allocated_gib": round(self.allocated_gib, 3),
            "reserved_gib": round(self.reserved_gib, 3),
            "monitor_gib": round(self.monitor_gib, 3),
            "components_gib": {k: round(v, 3) for k, v in self.components_gib.items()},
            "phases_gib": {k: round(v, 3) for k, v in self.phases_gib.items()},
            "fits_cards": self.fits_table(),
            "assumptions": list(self.assumptions),
            "component_notes": dict(self.component_notes),
            # Parameters with a gradient; `lora_params` (the same number) only for a network.
            "trainable_params": self.lora_params,
            **({} if self.settings.get("trained") == "full" else {"lora_params": self.lora_params}),
            "settings": dict(self.settings),
            "history_correction": round(self.correction, 4),
            "uncorrected_peak_gib": round(self.uncorrected_peak_gib, 3),
        }


def budget_gib(gpu_gb: float, *, other_processes_gib: float = 0.0, driver: str | None = None) -> float:
    """What PyTorch's allocator may hold on a card sold as `gpu_gb` GB: what CUDA sees, minus
    the CUDA context (sized for `driver`), the safety margin and memory other processes hold."""
    usable = float(gpu_gb) * USABLE_FRACTION - monitor.context_gib(driver)
    return usable - SAFETY_GIB - SAFETY_FRACTION * float(gpu_gb) - max(0.0, float(other_processes_gib))


# ---- terms ---------------------------------------------------------------------------


def _te_weight_gib(name: str, params: int, dtype: str) -> float:
    """sd-scripts keeps a text encoder's token embedding in the training dtype when the rest
    is fp8 (nn.Embedding has no fp8 kernels)."""
    if dtype != "fp8":
        return params * BYTES[dtype] / GIB
    emb = data.te_dims(name)[4]
    return ((params - emb) * 1.0 + emb * 2.0) / GIB


def _te_tokens(s: Setup, name: str) -> tuple[int, int]:
    """(sequence length, sequences per sample) a text encoder runs on: the CLIPs of the U-Net
    families encode 77-token chunks (three for max_token_length 225); the others the trainer's
    text length."""
    if s.facts is not None and s.facts.tokens == "latent":
        return 77, s.te_chunks
    if name in ("clip_l", "clip_g"):
        return 77, 1
    if name == "byt5":
        return 128, 1
    return max(1, s.t5_tokens), 1


def _te_activation_gib(name: str, tokens: int, batch: int, *, trained: bool, ckpt: bool) -> float:
    d, ff, layers, heads, _ = data.te_dims(name)
    # Per layer and token: what a transformer layer saves for backward in 16-bit (q, k, v,
    # attention output, projections, two norms, MLP input/hidden/activation) plus the fp32
    # attention probabilities of eager attention.
    per_layer_token = (8 * d + 3 * ff) * 2 + heads * tokens * 4
    if trained:
        live_layers = 2 if ckpt else layers
        extra = layers * d * 2 if ckpt else 0
        return (per_layer_token * live_layers + extra) * tokens * batch / GIB
    return per_layer_token * tokens * batch / GIB


def _math_attention_extra_gib(s: Setup, batch: int, *, training: bool, ckpt: bool) -> float:
    """The fp32 attention matrices plain attention keeps (memory_coefficients.json:
    attention_math_extra), on top of the flash-attention line."""
    spec = data.math_attention()
    layouts = spec.get("layouts", {}).get(s.family.name)
    if not layouts:
        return 0.0
    tokens = s.latent_tokens
    sum_l2 = max_l2 = sum_qkv = 0.0
    for row in layouts:
        lq = row["q_frac"] * tokens
        lk = row["kv_frac"] * tokens if row.get("kv_frac") else float(s.text_tokens if row.get("kv_fixed") else 0)
        l2 = batch * row["heads"] * lq * lk * 4 / GIB
        qkv = batch * row["heads"] * (lq + 2 * lk) * row["head_dim"] * 4 / GIB
        sum_l2 += l2 * row["count"]
        sum_qkv += qkv * row["count"]
        max_l2 = max(max_l2, l2)
    if not training:
        return max_l2
    if ckpt:
        return spec.get("ckpt", {}).get("k_ckpt", 3.0) * max_l2
    nc = spec.get("no_ckpt", {})
    return sum_l2 + nc.get("k_transient", 2.0) * max_l2 + nc.get("k_qkv", 0.36) * sum_qkv


def _activation_line(s: Setup, ckpt: bool, notes: list[str], offload: bool = False) -> tuple[float, float, bool]:
    """(MiB per token per sample, intercept GiB, whether the line already has the checkpoints
    on the CPU) of the diffusion model's training step."""
    arch = s.family.name
    fp8 = s.unet_dtype == "fp8"
    if offload and s.mixed_precision != "no":
        line = data.activation_line(arch, "amp", ckpt, fp8, cpu_offload=True)
        if line is not None:
            _note_impl(line, notes)
            return line.mib_per_token, line.intercept_gib, True
    slope, intercept = _plain_line(s, ckpt, notes, fp8)
    return slope, intercept, False


def _note_impl(line: data.ActivationLine, notes: list[str]) -> None:
    if line.impl != "sd-scripts":
        msg = (f"{line.arch} activations come from the {line.impl} model classes (sd-scripts' own were not traced "
               f"for this combination); expect up to 10-30 % difference")
        if msg not in notes:
            notes.append(msg)


def _plain_line(s: Setup, ckpt: bool, notes: list[str], fp8: bool) -> tuple[float, float]:
    proxy = s.family.activation_proxy
    if proxy and not any(data.activation_line(s.family.name, "amp", k, False) for k in (True, False)):
        # Not traced yet: the proxy family's line per token, scaled by width x depth.
        arch, scale = proxy
        msg = (f"{s.family.label} activations are not traced yet: {arch}'s traced line per token scaled by "
               f"{scale:.2f} (hidden width x blocks) stands in; expect tens of per cent error")
        if msg not in notes:
            notes.append(msg)
        slope, intercept = _arch_line(s, ckpt, notes, fp8, arch)
        return slope * scale, intercept * scale
    if s.mode == "full":
        msg = f"full fine-tune ({s.family.script}): activations counted with the traced LoRA step of the same model"
        if msg not in notes:
            notes.append(msg)
    return _arch_line(s, ckpt, notes, fp8, s.family.name)


def _arch_line(s: Setup, ckpt: bool, notes: list[str], fp8: bool, arch: str) -> tuple[float, float]:
    if s.mixed_precision == "no":
        # fp32 training: every saved tensor is twice its bf16 size (the bf16 rows were traced
        # without autocast, i.e. with all tensors in one dtype).
        line = data.activation_line(arch, "bf16", ckpt, False) or data.activation_line(arch, "amp", ckpt, False)
        if line is None:
            return 0.0, 0.0
        _note_impl(line, notes)
        return 2 * line.mib_per_token, 2 * line.intercept_gib
    line = data.activation_line(arch, "amp", ckpt, fp8)
    if line is not None:
        _note_impl(line, notes)
        return line.mib_per_token, line.intercept_gib
    base = data.activation_line(arch, "amp", ckpt, False)
    if base is None:
        return 0.0, 0.0
    _note_impl(base, notes)
    extra = 0.0
    if fp8:
        # fp8 weights are upcast to bf16 on every call and autograd keeps the copy of every
        # layer whose input needs a gradient: all of them without checkpointing, one
        # checkpointed block's with it.
        if arch == "flux":
            extra = flux_grad_input_weight_params() * 2 / GIB
            extra = extra / FLUX_BLOCKS if ckpt else extra
        else:
            params = s.family.diffusion.params
            extra = params * 2 * (1 / 25 if ckpt else 0.98) / GIB
            notes.append(f"fp8 base {'with' if ckpt else 'without'} checkpointing is not traced for {arch}: upcast weight "
                         f"copies estimated from the parameter count")
    return base.mib_per_token, base.intercept_gib + extra


def _training_activations(s: Setup, notes: list[str]) -> float:
    slope, intercept, offloaded = _activation_line(s, s.checkpointing, notes, s.cpu_offload_checkpointing)
    act = slope * s.latent_tokens * s.batch / 1024.0 + intercept
    if s.attention == "math":
        act += _math_attention_extra_gib(s, s.batch, training=True, ckpt=s.checkpointing)
    if s.cpu_offload_checkpointing and not offloaded:
        # The checkpointed block inputs (one hidden-width bf16 vector per token per block)
        # move to the CPU.
        act -= FLUX_BLOCKS * FLUX_HIDDEN * 2 * s.latent_tokens * s.batch / GIB
    return max(act, 0.0)


def _inference_activations(s: Setup, batch: int) -> float:
    """A no-grad denoising step: only a block's working set is alive, about half of what a
    checkpointed training step needs per token (the other half are the saved block inputs)."""
    slope, _, _ = _activation_line(s, True, [])
    act = 0.5 * slope * s.latent_tokens * batch / 1024.0
    if s.attention == "math":
        act += _math_attention_extra_gib(s, batch, training=False, ckpt=True)
    return act


def _vae_gib(elems_per_pixel: int, s: Setup, batch: int) -> float:
    w, h = s.resolution
    return (elems_per_pixel + 3) * w * h * batch * BYTES[s.vae_dtype] / GIB


def _swapped_weight_params(s: Setup) -> int:
    if not s.blocks_to_swap:
        return 0
    if s.family.name != "flux":
        return swapped_block_weight_params(s.family.name, s.family.swap_layout, s.blocks_to_swap)
    d, si, n_d, n_s = flux_block_weight_params()
    n_double = s.blocks_to_swap // 2
    n_single = (s.blocks_to_swap - n_double) * 2
    return min(n_double, n_d) * d + min(n_single, n_s) * si


def _workspaces(s: Setup, batch: int) -> float:
    ws = CUBLAS_WORKSPACE_GIB
    if (s.facts or data.family_facts(s.family.name)).convolutional:
        ws += min(CUDNN_WORKSPACE_CAP_GIB, CUDNN_WORKSPACE_GIB_PER_MPIX * batch * s.area / 1e6)
    return ws


def _finish(parts: dict[str, float], dynamic: float, s: Setup, batch: int, *, workspaces: bool = True) -> dict[str, float]:
    parts = {k: v for k, v in parts.items()}
    if workspaces:
        parts["workspaces"] = _workspaces(s, batch)
    parts["fragmentation"] = FRAGMENTATION * max(dynamic, 0.0)
    return parts


# ---- the estimate --------------------------------------------------------------------


def _phases(s: Setup) -> tuple[dict[str, dict[str, float]], dict[str, str], int, list[str]]:
    fam = s.family
    notes: list[str] = []
    cnotes: dict[str, str] = {}
    diff = fam.diffusion
    tes = fam.text_encoders
    vae = fam.vae

    full = s.mode == "full"
    lora_b = BYTES[s.lora_dtype]
    grad_note = ""
    if full:
        # Every weight of the trained models trains: they are kept in the master dtype (fp32
        # unless full_bf16 / full_fp16 cast them), with a gradient and optimizer states each.
        n_lora = (diff.params if s.train_unet else 0) + sum(
            te.params for te, t in zip(tes, s.te_trained) if t)
        lora_gib = 0.0
        live, grad_note = finetune.gradient_params(fam.name, n_lora, fused_backward=s.fused_backward,
                                                   groups=s.fused_groups)
        grads_gib = live * lora_b / GIB * (2 if s.gpus > 1 else 1)
        width = 3072 if fam.latent_downscale > 8 else 1280
        opt_gib = n_lora * state_bytes_per_param(s.optimizer, lora_b, width, width) / GIB
        if s.optimizer.spec.factored and s.train_unet:
            opt_gib += finetune.conv3x3_params(fam.name) * s.optimizer.spec.factored * 4.0 * (2 / 3) / GIB
    else:
        net = network(s)
        notes.extend(net.notes)
        n_lora = net.params
        if net.label:
            cnotes["lora_weights"] = net.label
        lora_gib = n_lora * lora_b / GIB
        grads_gib = n_lora * lora_b / GIB * (2 if s.gpus > 1 else 1)
        opt_gib = n_lora * state_bytes_per_param(s.optimizer, lora_b, s.rank, net.typical_width) / GIB

    swapped = _swapped_weight_params(s)
    diff_dt = s.lora_dtype if full and s.train_unet else s.unet_dtype
    diff_gib = (diff.params - swapped) * BYTES[diff_dt] / GIB
    diff_key = f"{diff.name}_weights"
    cnotes[diff_key] = f"{diff.label}, {diff_dt}" + (
        f", {s.blocks_to_swap} blocks swapped to CPU ({swapped * BYTES[diff_dt] / GIB:.2f} GiB off the GPU)"
        if swapped else "")

    # Text encoders during training.
    te_train: dict[str, float] = {}
    te_act = 0.0
    for te, dt, trained in zip(tes, s.te_dtypes, s.te_trained):
        key = f"{te.name}_weights"
        resident = (trained or not s.cache_te) and not s.te_on_cpu
        if fam.name == "flux" and te.name == "t5xxl" and s.cache_te and not trained:
            resident = False
        if full and trained:
            dt = s.lora_dtype
        if resident:
            te_train[key] = _te_weight_gib(te.name, te.params, dt)
            tokens, seqs = _te_tokens(s, te.name)
            te_act += _te_activation_gib(te.name, tokens, s.batch * seqs, trained=trained, ckpt=s.checkpointing)
            cnotes[key] = f"{te.label}, {dt}, on the GPU" + (
                (" (trained)" if full else " (LoRA trained)") if trained else " (encodes every step)")
        else:
            te_train[key] = 0.0
            cnotes[key] = f"{te.label}: not on the GPU (outputs cached)"
    vae_key = f"{vae.name}_weights"
    vae_w = vae.params * BYTES[s.vae_dtype] / GIB
    if s.cache_latents:
        vae_train = 0.0
        cnotes[vae_key] = f"{vae.label}: not on the GPU while training (latents cached)"
    else:
        vae_train = vae_w
        cnotes[vae_key] = f"{vae.label}, {s.vae_dtype}, on the GPU (encodes every batch)"

    act = _training_activations(s, notes) + te_act
    if not full:
        extra, why = activation_extra(s, net, s.latent_tokens * s.batch)
        act = max(act + extra, 0.0)
        notes.extend([why] if why else [])
    if full and (s.fused_backward or s.fused_groups) and s.mixed_precision != "no" and s.lora_dtype == "fp32":
        # fp32 master weights under autocast: autocast keeps a 16-bit cast of every weight that
        # requires grad for the whole forward (its weight cache). The traced full fine-tunes show it
        # as the peak without gradients (memory_coefficients.json, mode full_fused: intercepts equal
        # to the 16-bit weights). Without a fused step the gradients of every weight outweigh it.
        copies = (diff.params if s.train_unet else 0) * 2 / GIB
        act += copies
        notes.append(f"autocast keeps a 16-bit copy of the fp32 master weights during the forward "
                     f"({copies:.2f} GiB); full_bf16 / full_fp16 store the weights in 16 bit and avoid it")
    vae_step = 0.0 if s.cache_latents else _vae_gib(VAE_ENCODE_ELEMS_PER_PIXEL, s, s.batch)
    act_peak = max(act, vae_step)
    w, h = s.resolution
    facts = s.facts or data.family_facts(fam.name)
    vf = facts.vae_factor
    latents = s.batch * facts.latent_channels * (w / vf) * (h / vf) * 4 * 6 / GIB
    text_len = s.text_tokens if facts.tokens == "latent" else s.t5_tokens + facts.text_tokens_extra
    text_out = s.batch * text_len * facts.te_output_width * 4 / GIB
    images = 0.0 if s.cache_latents else s.batch * 3 * w * h * 4 / GIB
    batch_gib = latents + text_out + images

    training = {diff_key: diff_gib, **te_train, vae_key: vae_train, "lora_weights": lora_gib,
                "gradients": grads_gib, "optimizer_states": opt_gib, "activations": act_peak,
                "batch_data": batch_gib}
    phases: dict[str, dict[str, float]] = {}
    # Notes above describe the training step; a caching phase that sets the peak gets its own.
    phase_notes: dict[str, dict[str, str]] = {}
    phases["training"] = _finish(training, act_peak + grads_gib + batch_gib, s, s.batch)

    # model_load: weights as they arrive, before fp8 casts of the text encoders.
    load = {diff_key: diff_gib, vae_key: vae_train}
    for te, trained in zip(tes, s.te_trained):
        key = f"{te.name}_weights"
        if te_train.get(key, 0.0) > 0:
            dt = s.t5_load_dtype if te.name == "t5xxl" else s.weight_dtype
            load[key] = te.params * BYTES[dt] / GIB
    if s.lowram and fam.name != "flux":
        for te in tes:
            load[f"{te.name}_weights"] = te.params * BYTES[s.weight_dtype] / GIB
        load[vae_key] = vae_w
    phases["model_load"] = _finish(load, 0.0, s, 1, workspaces=False)

    # Models sd-scripts loads straight onto the GPU with lowram stay there while caching.
    lowram_resident: dict[str, float] = {}
    if s.lowram and fam.name != "flux":
        lowram_resident[diff_key] = diff.params * BYTES[s.weight_dtype] / GIB
        for te in tes:
            lowram_resident[f"{te.name}_weights"] = te.params * BYTES[s.weight_dtype] / GIB

    if s.cache_latents:
        enc = 0.0 if "cache_latents" in s.caches_done else _vae_gib(VAE_ENCODE_ELEMS_PER_PIXEL, s, s.vae_batch)
        parts = {**lowram_resident, vae_key: vae_w, "activations": enc}
        phase_notes["cache_latents"] = {
            vae_key: f"{vae.label}, {s.vae_dtype}, on the GPU while it encodes the images",
            "activations": f"VAE encode at vae_batch_size {s.vae_batch}"}
        phases["cache_latents"] = _finish(parts, enc, s, s.vae_batch)

    if s.cache_te:
        phase_notes["cache_text_encoder"] = {"activations": "text-encoder forward passes, no gradients"}
        parts = dict(lowram_resident)
        if s.lowram and fam.name != "flux":
            parts[vae_key] = vae_w
        te_act_cache = 0.0
        for te in tes:
            dt = s.t5_cache_dtype if te.name == "t5xxl" else ("fp8" if te.name in s.te_cache_fp8 else s.weight_dtype)
            if s.te_on_cpu:
                parts[f"{te.name}_weights"] = 0.0
                phase_notes["cache_text_encoder"][f"{te.name}_weights"] = f"{te.label}: encodes on the CPU"
                continue
            parts[f"{te.name}_weights"] = te.params * BYTES[dt] / GIB
            phase_notes["cache_text_encoder"][f"{te.name}_weights"] = (
                f"{te.label}, {dt}, on the GPU while it encodes the captions")
            tokens, seqs = _te_tokens(s, te.name)
            if "cache_text_encoder" in s.caches_done:
                continue
            te_act_cache = max(te_act_cache, _te_activation_gib(te.name, tokens, s.te_batch * seqs, trained=False,
                                                                ckpt=False))
        parts["activations"] = te_act_cache
        phases["cache_text_encoder"] = _finish(parts, te_act_cache, s, 1, workspaces=False)

    if s.sampling:
        cfg = facts.cfg
        parts = {diff_key: diff_gib, "lora_weights": lora_gib, "optimizer_states": opt_gib, vae_key: vae_w}
        for te, dt, trained in zip(tes, s.te_dtypes, s.te_trained):
            key = f"{te.name}_weights"
            if te_train.get(key, 0.0) > 0:
                parts[key] = te_train[key]
            elif facts.te_cache == "cpu_fp32" and s.cache_te:
                # SDXL parks its cached text encoders on the CPU in fp32; the sampling
                # pipeline brings them back to the GPU as they are.
                parts[key] = te.params * 4 / GIB
                cnotes[key] = cnotes.get(key, "") + "; back on the GPU in fp32 while sampling"
        # Denoising and decoding run at the preview size, which the prompt file sets.
        ss = dataclasses.replace(s, resolution=s.sample_resolution) if s.sample_resolution else s
        den = _inference_activations(ss, cfg)
        dec = _vae_gib(VAE_DECODE_ELEMS_PER_PIXEL, ss, 1)
        parts["activations"] = max(den, dec)
        phases["sampling"] = _finish(parts, max(den, dec), ss, cfg)

    saving = {diff_key: diff_gib, **te_train, vae_key: vae_train, "lora_weights": 2 * lora_gib,
              "optimizer_states": opt_gib}
    phases["saving"] = _finish(saving, 0.0, s, 1, workspaces=False)

    lyco = cnotes.get("lora_weights", "")
    cnotes["lora_weights"] = (f"none: a full fine-tune trains the model's own {n_lora / 1e6:.0f}M weights ({s.lora_dtype})"
                              if full else f"{(lyco + ': ') if lyco else ''}{n_lora / 1e6:.1f}M trainable parameters, "
                                           f"{s.lora_dtype}")
    cnotes["gradients"] = (grad_note if full else "one per trainable parameter") + f", {s.lora_dtype}" + (
        "; plus DDP gradient buckets (multi-GPU)" if s.gpus > 1 else "")
    cnotes["optimizer_states"] = f"{s.optimizer.spec.name}: {s.optimizer.spec.note}"
    act_note = (f"{s.batch} x {w}x{h}"
                + (f" + {s.t5_tokens + facts.text_tokens_extra} text tokens" if facts.tokens == "patches+text" else "")
                + (", gradient checkpointing" if s.checkpointing else ", no gradient checkpointing")
                + (" (checkpoints on CPU)" if s.cpu_offload_checkpointing else "")
                + (f", {s.attention_flag} attention" if fam.attention_flags_apply else "")
                + (", fp8 base" if s.unet_dtype == "fp8" else ""))
    cnotes["activations"] = act_note
    cnotes["fragmentation"] = f"{int(FRAGMENTATION * 100)} % of what is allocated and freed every step"
    cnotes["workspaces"] = "cuBLAS / cuDNN workspaces"
    cnotes["batch_data"] = "latents, noise, targets and text-encoder outputs of one batch"
    return phases, cnotes, n_lora, notes, phase_notes


def estimate(config: dict, family: Family, *, dataset: dict | None = None, gpus: int = 1,
             history: list | None = None, gpu_name: str | None = None,
             caches_done: frozenset[str] = frozenset(), driver: str | None = None) -> Estimate:
    """Predict the peak VRAM of `config` (a flat sd-scripts dict) for `family`. Pure and
    fast: no I/O beyond the packaged data, read once. `caches_done`: the caching phases whose
    files are already on disk (kohya_tuner.dataset.caches reads the folders); `driver`: the
    NVIDIA driver version (NVML's), which sizes the CUDA context of the monitor figure."""
    s = resolve(config, family, dataset, gpus, caches_done)
    phases, cnotes, n_lora, notes, phase_notes = _phases(s)
    totals = {name: sum(parts.values()) for name, parts in phases.items()}
    assumptions = list(s.assumptions) + [n for n in notes if n not in s.assumptions]

    factor = 1.0
    if history:
        from kohya_tuner.history import correction, fingerprint

        factor, n = correction(history, gpu_name, family.name, fingerprint=fingerprint(config, family, dataset))
        if n and abs(factor - 1.0) > 1e-6:
            assumptions.append(f"scaled by {factor:.3f} from {n} measured run(s) on "
                               f"{gpu_name or 'this GPU'} (measured peak / predicted)")
            for name in totals:
                extra = totals[name] * (factor - 1.0)
                phases[name]["history_correction"] = extra
                totals[name] += extra
        else:
            factor = 1.0

    ordered = [p for p in PHASES if p in totals]
    peak_phase = max(ordered, key=lambda p: totals[p])
    cnotes.update(phase_notes.get(peak_phase, {}))
    settings = {
        "batch": s.batch, "resolution": f"{s.resolution[0]}x{s.resolution[1]}", "tokens": round(s.latent_tokens),
        "mixed_precision": s.mixed_precision, "base_dtype": s.unet_dtype, "lora_dtype": s.lora_dtype,
        "rank": s.rank, "optimizer": s.optimizer.spec.name, "gradient_checkpointing": s.checkpointing,
        "blocks_to_swap": s.blocks_to_swap, "attention": s.attention_flag, "cache_latents": s.cache_latents,
        "cache_text_encoder_outputs": s.cache_te, "text_encoders_trained": [
            te.name for te, t in zip(family.text_encoders, s.te_trained) if t],
        "sampling": s.sampling, "gpus": s.gpus, "trained": s.mode,
    }
    if s.mode == "full":
        # A full fine-tune has no rank: it trains the model's own weights.
        del settings["rank"]
        settings["fused_step"] = ("fused_backward_pass" if s.fused_backward else "blockwise_fused_optimizers"
                                  if s.fused_groups == -1 else f"fused_optimizer_groups {s.fused_groups}"
                                  if s.fused_groups else None)
    shown = monitor.figures(phases[peak_phase], factor, driver)
    return Estimate.model_construct(
        **shown,
        model=family.name,
        peak_gib=totals[peak_phase],
        peak_phase=peak_phase,
        components_gib=dict(phases[peak_phase]),
        phases_gib={p: totals[p] for p in ordered},
        assumptions=assumptions,
        component_notes=cnotes,
        phase_components_gib=phases,
        lora_params=n_lora,
        settings=settings,
        correction=factor,
        driver=driver,
    )
