"""Ranked advice in plain words for a diagnosed run.

The order follows the two guides the project started from: a failure at once means the
loading configuration is wrong (quantised base, block swap, other programs on the GPU);
caching needs a smaller VAE batch and disk caches; the first step needs a smaller batch,
gradient checkpointing and a lower resolution; a failure after many good steps is
fragmentation, then the largest bucket, then activations; sampling needs sampling less or
smaller; saving needs host RAM. Every sd-scripts key is written exactly as sd-scripts
spells it, in backticks, so it can be pasted into the config file. Settings only one family
has (block swap and T5-XXL for FLUX, SDPA for SD 1.5/SDXL, …) are advised only when the log
or the caller names that family; the same advice is never given twice.
"""

from __future__ import annotations

import re

from kohya_tuner.logparse import patterns as P
from kohya_tuner.logparse.failures import CRASH_PREFIX
from kohya_tuner.logparse.result import Diagnosis, DiagnosisDetails

FRAG_ENV = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
_PHASE_WORDS = {"model_load": "loading the model", "cache_latents": "caching latents",
                "cache_text_encoder": "caching text-encoder outputs", "first_step": "running the first training step",
                "training": "training", "sampling": "generating sample images", "saving": "saving",
                "unknown": "running"}


def size_text(x: float) -> str:
    """A memory size as people read it: small requests in MiB (a 2 MiB request is not "0.00 GiB")."""
    if 0 < abs(x) < 0.1:
        mib = x * 1024
        return f"{mib:.0f} MiB" if abs(mib) >= 10 else f"{mib:.1f} MiB"
    return f"{x:.2f} GiB"


_gib = size_text


def _other_programs(details: DiagnosisDetails) -> str | None:
    held = details.held_elsewhere_gib
    fig = details.oom_figures
    if held is None or fig is None:
        return None
    cap = fig.capacity_gib or 0.0
    # A CUDA context and the desktop take a few hundred MiB; more than that is another program.
    if not details.other_processes and held < max(1.0, 0.1 * cap):
        return None
    gpu = f"GPU {fig.device}" if fig.device is not None else "the GPU"
    if not details.other_processes:
        if fig.free_gib is not None and fig.tried_gib is not None and (
                fig.free_gib >= max(2 * fig.tried_gib, fig.tried_gib + 0.5)):
            # The message itself says the request would have fit in what was free: other
            # programs are not why it failed.
            return None
        if fig.process_in_use_gib is None:
            # The older message has no per-process line: what is neither free nor PyTorch's
            # may be the CUDA context, libraries outside PyTorch's allocator or other programs.
            return (f"PyTorch's figures leave {_gib(held)} of {gpu} unexplained (neither free nor reserved by "
                    "PyTorch), and this message format does not say whose it is: the CUDA context and libraries "
                    "outside PyTorch's allocator take some. Check with nvidia-smi whether another program holds "
                    "the rest before closing anything.")
    if len(details.other_processes) == 1:
        pid, g = details.other_processes[0]
        who = f"process {pid} held {_gib(g)} of {gpu}"
    elif details.other_processes:
        named = ", ".join(f"process {pid} ({_gib(g)})" for pid, g in details.other_processes)
        who = f"{named} held {_gib(held)} of {gpu}"
    else:
        who = f"other programs held about {_gib(held)} of {gpu}"
    mine = fig.process_in_use_gib
    tail = f" while training itself held only {_gib(mine)}" if mine is not None and mine < held else ""
    return (f"Free the GPU first: {who}{tail}. Close other programs on it (nvidia-smi lists them), or choose a "
            "card nobody else uses; on a multi-GPU machine, check which GPU the training was given.")


def _fp8(family: str | None) -> str:
    size = {"flux": " (the FLUX transformer drops from about 22 GiB to 11 GiB)",
            "sdxl": " (the SDXL U-Net drops from about 4.8 GiB to 2.4 GiB)",
            "sd15": " (the SD 1.5 U-Net drops from about 1.6 GiB to 0.8 GiB)"}.get(family or "", "")
    return (f"Store the frozen base model in 8 bits: `fp8_base = true` with `mixed_precision = \"bf16\"`{size}. "
            "It is free to switch on when resuming.")


def _block_swap(family: str | None, n: int = 18) -> str | None:
    if family != "flux":
        return None
    return (f"Swap transformer blocks to system RAM: `blocks_to_swap = {n}` (1 to 35; each block frees "
            "about 0.6 GiB and slows every step a little).")


def _model_load(family: str | None, details: DiagnosisDetails) -> list[str]:
    out = [_fp8(family)]
    swap = _block_swap(family)
    if swap:
        out.append(swap)
    if family in ("flux", "sdxl"):
        out.append("Keep the text encoders off the GPU during training: `cache_text_encoder_outputs = "
                   "true` with `network_train_unet_only = true`.")
    if family == "flux":
        out.append("Use an fp8 T5-XXL file (t5xxl_fp8_e4m3fn.safetensors) for `t5xxl`.")
    out.append("If `lowram = true` is set, remove it: it loads every model straight onto the GPU at once.")
    return out


def _first_step(family: str | None) -> list[str]:
    out = [
        "Train one image at a time: `train_batch_size = 1` (and `batch_size = 1` in the dataset file, which "
        "overrides it); `gradient_accumulation_steps = 4` keeps the effective batch.",
        "Recompute activations instead of storing them: `gradient_checkpointing = true` (about 20% slower, "
        "a large saving).",
        "Lower the training size: `resolution` and `max_bucket_reso` (memory grows with the pixel count; 768 to 512 "
        "saves more than half of the activations).",
    ]
    swap = _block_swap(family, 16)
    if swap:
        out.append(swap)
    if family in ("sd15", "sdxl"):
        out.append("Use memory-efficient attention: `sdpa = true`.")
    out.append("Make the optimizer state smaller: `optimizer_type = \"AdamW8bit\"` or \"Adafactor\", and a smaller "
               "`network_dim`.")
    out.append(_fp8(family))
    return out


def _training(fig_fragmented: bool, details: DiagnosisDetails, diagnosis: Diagnosis) -> list[str]:
    ru = details.oom_figures.reserved_unallocated_gib if details.oom_figures else None
    frag = (f"Set the environment variable {FRAG_ENV} before launching: "
            + (f"{_gib(ru)} was reserved but could not be used (fragmentation)." if fig_fragmented and ru
               else "memory fragments over a long run and this lets PyTorch reuse it."))
    bucket = ("The largest bucket can come late because buckets are shuffled every epoch: lower `max_bucket_reso` "
              "(or `resolution`) so the biggest image of the dataset fits, or `bucket_no_upscale = true`.")
    acts = ("Then save activation memory: `gradient_checkpointing = true` and `train_batch_size = 1`.")
    return [frag, bucket, acts]


def _sampling(family: str | None) -> list[str]:
    out = [
        "Sample less often: raise `sample_every_n_steps` or use `sample_every_n_epochs`; sampling adds "
        "inference memory on top of training.",
        "Sample smaller: add `--w 512 --h 512` (and fewer `--s` steps) to each line of the `sample_prompts` file.",
        "Or do not sample during training: remove `sample_prompts` (and `sample_at_first`) and test the LoRA "
        "afterwards.",
    ]
    if family == "flux":
        out.append("With `blocks_to_swap` set, sampling is very slow too: another reason to sample rarely.")
    return out


def _saving(family: str | None, swap: bool = True) -> list[str]:
    ram = ("Saving works in system RAM: close other programs, and add swap (Linux) or enlarge the page file "
           "(Windows) to at least the size of RAM." if swap else
           "Saving gathers the weights in system RAM before writing them: close other programs while it saves.")
    return [ram, "Save smaller files: `save_precision = \"fp16\"` (or \"bf16\")."]


def _unknown(family: str | None) -> list[str]:
    # The guides' roadmap, for an OOM whose moment the log does not show.
    out = [
        "The log does not show when memory ran out; work down this list: first `train_batch_size = 1`.",
        "Make sure `mixed_precision = \"bf16\"` (or \"fp16\" on cards older than RTX 30) is set: sd-scripts "
        "defaults to full precision.",
        "A lower rank and a quantised base: smaller `network_dim`, `fp8_base = true`.",
        "`gradient_checkpointing = true`.",
        "Then a lower `resolution` / `max_bucket_reso`, or an 8-bit optimizer (`optimizer_type = \"AdamW8bit\"`).",
    ]
    swap = _block_swap(family)
    if swap:
        out.append(swap)
    return out


def _oom_advice(diagnosis: Diagnosis, details: DiagnosisDetails, phase: str | None = None) -> list[str]:
    family = details.advised_family
    phase = phase or diagnosis.phase
    out: list[str] = []
    others = _other_programs(details)
    if others:
        out.append(others)
    if phase == "model_load":
        out += _model_load(family, details)
    elif phase == "cache_latents":
        out += [
            "Encode one image at a time while caching: `vae_batch_size = 1`.",
            "Cache to disk: `cache_latents_to_disk = true` — a retry then skips this phase for the images already "
            "done.",
            "Very large images cost memory here too: lower `max_bucket_reso` / `resolution`.",
        ]
    elif phase == "cache_text_encoder" and family == "sd15":
        # SD 1.5 has no text-encoder cache in sd-scripts: this is a text-encoder pass gone wrong.
        out += _unknown(family)
    elif phase == "cache_text_encoder":
        if family == "flux":
            out.append("Encode captions one at a time: `text_encoder_batch_size = 1`.")
        out.append("Cache to disk: `cache_text_encoder_outputs_to_disk = true`, so a retry reuses what is done.")
        if family == "flux":
            out.append("Use an fp8 T5-XXL file for `t5xxl` and a shorter `t5xxl_max_token_length` (256 instead of "
                       "512).")
    elif phase == "first_step":
        out += _first_step(family)
    elif phase == "training":
        out += _training(details.fragmented, details, diagnosis)
    elif phase == "sampling":
        out += _sampling(family)
    elif phase == "saving":
        out.append(f"Saving ran out of GPU memory: set {FRAG_ENV} and keep `save_every_n_steps` rare.")
        out += _saving(family)
    else:
        out += _unknown(family)
    if details.fragmented and phase != "training":
        out.append(f"{_gib(details.oom_figures.reserved_unallocated_gib)} was reserved but unusable "
                   f"(fragmentation): set {FRAG_ENV}.")
    if details.processes and details.processes > 1:
        first = f"; rank {details.failed_rank} ran out first" if details.failed_rank is not None else ""
        out.append(f"This run trains on {details.processes} processes (one per GPU){first}, and each rank holds a full copy "
                   "of the model: more GPUs add no memory to any one of them, so every change above must fit a "
                   "single card; for a test, launch one process (`accelerate launch --num_processes 1`).")
    if details.last_state and phase in ("training", "sampling", "saving"):
        out.append(f"Nothing is lost: resume from the last saved state with `resume = \"{details.last_state}\"` "
                   "after the change (batch, resolution, checkpointing, block swap and fp8 may change on resume).")
    return out


def _cpu_oom_advice(diagnosis: Diagnosis, details: DiagnosisDetails) -> list[str]:
    family = details.advised_family
    out: list[str] = []
    if diagnosis.phase == "saving":
        out += _saving(family, swap=False)
    out += [
        "This is system RAM, not the GPU: fewer data-loader processes, each holding its own copy — "
        "`max_data_loader_n_workers = 1` (or 0) and no `persistent_data_loader_workers`.",
        "Keep caches on disk instead of in RAM: `cache_latents_to_disk = true`" +
        (" and `cache_text_encoder_outputs_to_disk = true`" if family in ("sdxl", "flux") else "") + ".",
        "Add swap (Linux) or enlarge the Windows page file (WinError 1455 means it is too small) to at least the "
        "size of RAM, and close other programs while the models load.",
        "`lowram = true` loads models straight to the GPU instead of staging them in RAM: it helps only when the "
        "GPU has more memory than the computer; otherwise leave `lowram` off.",
    ]
    if family == "flux" and diagnosis.phase in ("model_load", "unknown"):
        out.append("Use fp8 model files (FLUX transformer and T5-XXL) so less has to pass through RAM.")
    return out


_UNRECOGNISED_RE = re.compile(r"unrecognized arguments:\s*(.+)$")


def _bad_argument_advice(message: str, family: str | None) -> list[str]:
    from kohya_tuner.families import FAMILIES
    from kohya_tuner.schema import closest_key, script_args

    out: list[str] = []
    m = _UNRECOGNISED_RE.search(message)
    if m:
        script = FAMILIES[family].script if family in FAMILIES else "train_network.py"
        names = script_args(script)
        for token in m.group(1).split()[:5]:
            if token.startswith("--"):
                key = token[2:]
                guess = closest_key(key, names)
                if guess and guess != key:
                    out.append(f"sd-scripts has no `--{key}`: did you mean `{guess}`?")
                else:
                    out.append(f"sd-scripts has no `--{key}` at the pinned commit: remove it.")
            elif "/" in token or "\\" in token or "." in token:
                out.append(f"A value was given without its option: `{token}`. A config file goes after "
                           "`--config_file`.")
                break
    out.append("Check the config against the pinned sd-scripts: every key must be an sd-scripts argument, written "
               "with underscores, with the value type it expects (`resolution` is a string such as \"1024,1024\").")
    return out


# What a crash of native code (an access violation, a segmentation fault) most often comes from, and what to try.
_NATIVE_CRASH_CAUSES = ("most often a broken native build (xformers, bitsandbytes, a CUDA or PyTorch wheel that does not "
                        "match), the NVIDIA driver, or unstable RAM or overclocking.")
_NATIVE_CRASH_FIX = ("Update the NVIDIA driver, reinstall PyTorch and the extensions for one CUDA version, try `sdpa = true` "
                     "instead of `xformers` and a plain optimizer (`optimizer_type = \"AdamW\"`); the console above the "
                     "crash may name the library that crashed.")


def _error_advice(diagnosis: Diagnosis, details: DiagnosisDetails) -> list[str]:
    kind = diagnosis.error.kind
    message = diagnosis.error.message
    family = details.advised_family
    if kind == "truncated":
        return _truncated_advice(diagnosis, details)
    if kind == "cpu_oom":
        return _cpu_oom_advice(diagnosis, details)
    if kind == "bad_argument":
        return _bad_argument_advice(message, family)
    if kind == "missing_file":
        if "cached" in message or "cache" in message.lower():
            return ["A cache file is missing or stale: delete the `*.npz` cache files next to the images and let "
                    "the run cache again (`cache_latents_to_disk = true` writes them once)."]
        flux_files = {"flux": ", `clip_l`, `t5xxl`, `ae`"}
        return ["A file or folder the run needs is missing: check every path in the config "
                "(`pretrained_model_name_or_path`, `train_data_dir` or `dataset_config`, `output_dir`, "
                f"`sample_prompts`{flux_files.get(family, '')}).",
                "Relative paths are read from the folder the training is started in: prefer absolute paths."]
    if kind == "nan_loss":
        if "exactly 0" in message:
            return ["The loss stays at 0, so nothing is learned: check that captions and images are found, that "
                    "`learning_rate` is not 0, and that the base model loads correctly."]
        if "latent" in message.lower():
            return ["The VAE produced NaN while encoding an image, before any training: a VAE run in fp16 overflows "
                    "(`no_half_vae = true`, or a fixed fp16 VAE for `vae`), or the image named in the message is "
                    "damaged — open it, or re-save it, and delete its cached `.npz` file."]
        return ["The loss became NaN: the weights are now useless. Use `mixed_precision = \"bf16\"` instead of "
                "fp16 where the card supports it (RTX 30 and newer); with fp16, do not use `full_fp16`.",
                "Lower `learning_rate` (and `unet_lr`), and keep `max_grad_norm = 1.0`."] + (
                ["For SDXL in fp16 add `no_half_vae = true`: the fp16 SDXL VAE overflows."] if family == "sdxl" else [])
    if kind == "xformers":
        if family == "flux":
            return ["FLUX always uses PyTorch's own attention: remove `xformers` from the config."]
        return ["xformers is missing or was built for another PyTorch/CUDA: use `sdpa = true` instead (built into "
                "PyTorch, about as frugal) and remove `xformers`, or install the xformers wheel matching your "
                "PyTorch."]
    if kind == "bitsandbytes":
        return ["bitsandbytes cannot run on this card or CUDA setup: pick an optimizer without it — "
                "`optimizer_type = \"AdamW\"` or \"Adafactor\" — or install a bitsandbytes build for your GPU "
                "and CUDA."]
    if kind == "cuda_error":
        return ["This is a CUDA error, not a lack of memory: a GPU kernel failed. Most often an extension built "
                "for another PyTorch or CUDA (xformers, bitsandbytes, flash-attn) or the driver; `device-side "
                "assert` usually means a bad index inside the model (a caption or token problem).",
                "Rerun with the environment variable CUDA_LAUNCH_BLOCKING=1 to see the call that really failed; try "
                "`sdpa = true` instead of `xformers` and a plain optimizer (`optimizer_type = \"AdamW\"`), and "
                "update the NVIDIA driver."]
    if kind == "cuda_unavailable":
        return ["PyTorch cannot use the GPU: install a CUDA build of PyTorch that matches the driver (and, for "
                "RTX 50-series cards, PyTorch 2.7 or newer built for CUDA 12.8); check that nvidia-smi sees the "
                "card."]
    if kind == "distributed":
        return ["Multi-GPU setup failed (NCCL or rendezvous): for one GPU launch with `accelerate launch "
                "--num_processes 1`; otherwise check the main process address and port (29500), and on Windows "
                "use a single process — NCCL is not available there."]
    if kind == "dtype":
        return ["Mismatched number formats: `mixed_precision`, `full_fp16` / `full_bf16`, `fp8_base` and "
                "`save_precision` must agree; bf16 needs an RTX 30-series or newer card (use fp16 with "
                "`no_half_vae = true` on older ones)."]
    if details.model_saved:
        where = f" ({details.last_checkpoint})" if details.last_checkpoint else ""
        return [f"The final model was saved before the crash{where}: the result is usable. The crash came while "
                "the trainer was shutting down; if it repeats, update sd-scripts' dependencies."]
    windows = P.windows_status(details.exit_status)
    if windows is not None and not details.error_line:
        return [f"Exit status {details.exit_status} is {windows}, not a lack of memory and not a kill for lack of "
                f"RAM: {_NATIVE_CRASH_CAUSES}", _NATIVE_CRASH_FIX]
    if message.startswith(CRASH_PREFIX):
        return [f"A crash in native code, not a Python error: {_NATIVE_CRASH_CAUSES}", _NATIVE_CRASH_FIX]
    if not details.error_line:
        return ["The log holds no error message, so the cause cannot be read from it: pass the whole log with both "
                "streams (`… > train.log 2>&1`). A process that vanishes without a message was usually killed "
                "for lack of system RAM (exit status 137)."]
    return ["This is not a memory problem: read the error above; changing memory settings will not fix it."]


_SAVING_RAM = ("It stopped while saving: saving copies the weights into system RAM (and hashes them for the "
               "metadata), so the likeliest cause is running out of RAM, which kills the process without an error "
               "line — close other programs, enlarge the swap or Windows page file, and keep `save_precision` at "
               "\"fp16\" or \"bf16\"; a GPU OOM is unlikely there.")


def _truncated_advice(diagnosis: Diagnosis, details: DiagnosisDetails) -> list[str]:
    """Hedged: the error line is missing, so nothing here is certain."""
    out = ["The log is cut off inside a traceback, before its error line (the last lines of the traceback name "
           "the error): look at the end of the full log, or pass all of it."]
    suspected = details.suspected
    if suspected == "oom":
        hedged = _oom_advice(diagnosis, details)
        if hedged:
            out.append("The wording suggests it ran out of GPU memory; if the full log confirms that: " + hedged[0])
            out += hedged[1:3]
    elif suspected:
        from kohya_tuner.logparse.result import ErrorInfo

        probe = diagnosis.model_copy(update={"error": ErrorInfo(kind=suspected, message="")})
        hedged = _error_advice(probe, details)
        if hedged:
            out.append(f"A warning before it points to {suspected.replace('_', ' ')}: " + hedged[0])
            out += hedged[1:2]
    elif diagnosis.phase == "saving":
        out.append(_SAVING_RAM)
    elif diagnosis.phase != "unknown":
        hedged = _oom_advice(diagnosis, details)
        if hedged:
            out.append(f"If the missing error was out of GPU memory (while {_PHASE_WORDS[diagnosis.phase]}, as the "
                       "frames show): " + hedged[0])
    return out


def advise(diagnosis: Diagnosis, details: DiagnosisDetails) -> list[str]:
    out: list[str] = []
    if diagnosis.outcome == "oom":
        out += _oom_advice(diagnosis, details)
    elif diagnosis.outcome in ("error", "cpu_oom") and diagnosis.error is not None:
        out += _error_advice(diagnosis, details)
    elif diagnosis.outcome == "incomplete":
        if details.events == 0:
            out.append("The log holds no training output: capture both streams, e.g. `accelerate launch … > "
                       "train.log 2>&1`, and pass that file.")
        else:
            where = (f" at step {diagnosis.step} of {diagnosis.total_steps}"
                     if diagnosis.step is not None and diagnosis.total_steps else "")
            out.append(f"The log stops{where} without an error or `model saved.`: the run was stopped, is still "
                       "running, or the log is cut.")
            if diagnosis.phase == "saving":
                out.append(_SAVING_RAM)
            out.append("If the process vanished without a message, it was probably killed for lack of system RAM "
                       "(exit status 137): pass the exit code with --exit-code to check.")
    if details.survived and diagnosis.outcome == "success":
        out.append("An error was logged during the run but it went on and saved the model: "
                   + details.survived[0][:200])
    if details.on_cpu and diagnosis.outcome != "success":
        out.append("The trainer ran on the CPU (`accelerator device: cpu`): PyTorch did not see a GPU.")
    # The same line can come from two rules (a phase's list and the kind's); say it once.
    from kohya_tuner.logparse.terms import in_trainer_terms

    return in_trainer_terms(list(dict.fromkeys(out)), diagnosis.wrapper)
