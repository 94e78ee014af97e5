"""What sd-scripts, PyTorch, accelerate and the tools around them print, as patterns.

Pure functions over one string: cleaning a physical line, recognising OOM and other
failures, reading OOM figures, guessing a phase from traceback frames. The format
strings come from sd-scripts at the pinned commit (see shared NOTES §d) and from the
PyTorch/accelerate messages users post; nothing here is copied code.
"""

from __future__ import annotations

import re
from functools import lru_cache

from kohya_tuner.logparse import phase_words
# Cleaning a line lives in cleaning.py; the parser reaches it through this module.
from kohya_tuner.logparse.cleaning import (  # noqa: F401
    ascii_box_row, cell_len, clean, host_prefix_end, may_have_prefix, strip_ansi, strip_relay)

# ---- Rich log records ---------------------------------------------------------------------

# Rich's layout when sd-scripts logs to a pipe: a 19-character time (or as many spaces when it
# repeats), a space, the level padded to 8, a space, the message, the source file at the right.
RICH_MESSAGE_COLUMN = 29
RICH_HEAD_RE = re.compile(r"(?:\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}| {19}) (DEBUG|INFO|WARNING|ERROR|CRITICAL)(?: +(.*))?$")
# The same record after a tool stripped the leading blanks.
# The level may end in a colon ("INFO: Loading …", basicsr's and uvicorn's "LEVEL: message").
LOOSE_HEAD_RE = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL)(?: +|: +)(\S.*)?$")
RICH_PATH_RE = re.compile(r"\s([\w.\-]+\.py:\d+)\s*$")
# Rich's level column: the level padded to eight characters, and a space.
RICH_LEVEL_WIDTH = 9
# "- INFO - message" (Python logging's common format once the time is cut), with an optional
# logger name before the level ("- root - INFO - message", in brackets in Sana's "- [Sana] - INFO - …")
# or after it (accelerate's get_logger: "- INFO - __main__ - message").
DASH_LEVEL_RE = re.compile(
    r"- (?:(?:[\w.]+|\[[\w.\-]+\]) - )?(DEBUG|INFO|WARNING|ERROR|CRITICAL) - (?:(?P<logger>[\w.]+) - )?(.*)$")

# ---- progress bars --------------------------------------------------------------------------

# "steps:  17%|█▋        | 1/6 [00:01<00:09,  1.91s/it, avr_loss=1.2]", and the same without the
# bar ("steps:   0% 0/2300 [00:01<?, ?it/s]") where tqdm writes to a notebook or Colab cell.
# With tqdm's unit_scale the counts carry SI prefixes ("1.02k/30.0k", "5.00/100"; progress.py).
# The closing bracket may be missing: a paste cut inside the postfix, or another message printed
# onto the bar's line before tqdm closed it (the rest of the line is then read as postfix); a paste
# cut right after the counts has no bracket at all ("Epoch 0:   0%|          | 1/133740").
BAR_RE = re.compile(
    r"(?P<desc>[^|\r\n]*?)\s*(?P<pct>\d{1,3})%(?:\|[^|]*\||(?= ))\s*"
    r"(?P<n>\d+(?:\.\d+)?[kMGTPEZY]?)/(?P<total>\d+(?:\.\d+)?[kMGTPEZY]?)\s*"
    r"(?:\[(?:[^<\],]*<[^,\]]*,\s*(?P<rate>[\d.]+|\?)\s*(?P<scale>[kMGTPEZY]?)(?P<unit>it/s|s/it))?(?P<inner>[^\]]*)(?:\]|$)|$)"
)
# A bar cut right after it started ("Steps:   0%|" at the end of a paste): step 0, total unknown.
BAR_START_RE = re.compile(r"(?P<desc>[^|\r\n]*?)\s*0%\|\s*$")
# A bar refresh cut inside its bar, before its count ("steps:  25%|███▌" at the end of a paste): the
# bar went on, at a step it does not show.
BAR_CUT_RE = re.compile(r"(?P<desc>[^|\r\n]*?)\s*(?P<pct>\d{1,3})%\|[^|\r\n]*$")
# vLLM's and glog-style records: "ERROR 07-30 18:15:55 engine.py:400] <text>", after the level.
GLOG_REST_RE = re.compile(r"\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? [\w.\-]+:\d+\] ?")
# PyTorch's C++ log records (c10, NCCL's watchdog): "[E ProcessGroupNCCL.cpp:577] …", newer with
# date, time and thread: "[E1003 04:22:11.123456789 ProcessGroupNCCL.cpp:616] …". The letter is
# the level.
C10_LOG_RE = re.compile(r"\[([EWIF])(?:\d{4} \d\d:\d\d:\d\d(?:\.\d+)?(?: \d+)?)? ?[\w.\-]+\.(?:cpp|cc|cu|h|hpp):\d+\] ?")
C10_LEVELS = {"E": "ERROR", "W": "WARNING", "I": "INFO", "F": "CRITICAL"}
# A collective that timed out in NCCL's watchdog: an all-reduce is the gradient sync of a
# training step (the process group was up long before), whatever the job.
NCCL_ALLREDUCE_TIMEOUT_RE = re.compile(r"optype=allreduce\b.*\btim(?:ed|ing) out|watchdog.*optype=allreduce")


_DESC_LOSS_RE = re.compile(r"\bloss\b")
_DESC_LR_RE = re.compile(r"\blr\b|\blearning[ _]rate\b")


# A description that is the loss alone (the web UI's embedding and hypernetwork training: "loss: 0.0903499:",
# "[Epoch 12: 5/10]loss: 0.0903").
_DESC_LOSS_VALUE_RE = re.compile(r"\s*(?:\[[^\]]*\]\s*)?loss\s*[:=]\s*-?(?:\d[\d.]*(?:e-?\d+)?|nan|inf)\s*:?\s*$")


def trainer_description(desc: str) -> bool:
    """A bar whose description reports the loss and the learning rate, or the loss alone, is a training
    bar (traintrain's "Loss EMA * 1000: 30.6680, …, Current LR: 1.99e-04, Epoch: 1:")."""
    low = desc.lower()
    return "loss" in low and bool(_DESC_LOSS_RE.search(low) and _DESC_LR_RE.search(low)
                                  or _DESC_LOSS_VALUE_RE.match(low))


def trainer_postfix(inner: str) -> bool:
    """A bar whose postfix reports the learning rate and the loss is a training bar, whatever
    its description (ai-toolkit names it after the job: "my_lora:  3%|…| 1021/30000 [… lr: … loss: …]";
    OneTrainer's postfix is "loss=0.12, smooth loss=0.1")."""
    return (("lr" in inner and "loss" in inner) or "avr_loss=" in inner or "step_loss=" in inner
            or " loss=" in inner or ",loss=" in inner or inner.startswith("loss="))


@lru_cache(maxsize=256)
def sampling_bar(desc: str) -> bool:
    """A bar whose description the milestone words read as sampling ("Generating Samples:",
    "Generating images", "Sampling"): its name says what it counts, whatever training postfix a
    trainer carries over onto it (loss, lr)."""
    low = desc.strip().rstrip(":").strip().lower()
    if not low:
        return False
    phase = next((ph for prefix, ph, _ in MILESTONE_PREFIXES if low.startswith(prefix)), None)
    if phase is None:
        found = phase_words.phrase_phase(low[:120])
        phase = found[0] if found else None
    return phase == "sampling"


_MAIN_BAR: dict[str, bool] = {}
_NOT_TRAINING_STEPS = ("validation", "denois", "inference", "sampl", "generat", "diffusion")
# The web UI's embedding and hypernetwork training bars count the training steps under a description that
# goes on with the epoch and the loss ("Training textual inversion [Epoch 5: 30/34] loss: 0.1").
_MAIN_BAR_HEADS = ("training textual inversion", "training hypernetwork")


_NUMBERED_EPOCH_RE = re.compile(r"epoch (\d{1,6})\s*:?\s*$")


def numbered_epoch(desc: str) -> int | None:
    """The 0-based epoch a bar named for it counts the batches of (Lightning's `Epoch 3:`), else None."""
    m = _NUMBERED_EPOCH_RE.match(desc.strip().lower())
    return int(m.group(1)) if m else None


def is_main_bar(desc: str) -> bool:
    """sd-scripts' optimizer-step bar is `steps`; ComfyUI's trainer writes `Epoch 1/9 - steps`."""
    known = _MAIN_BAR.get(desc)
    if known is not None:
        return known
    d = desc.rstrip(": ").lower()
    # OneTrainer's is `step` (with an `epoch` bar above it). PyTorch Lightning's counts the batches of
    # the epoch its description numbers (`Epoch 0:`); a bar of epochs has no number in its name.
    # A sampler's or a validation pass's own steps ("Denoising steps", "Inference steps") are not it.
    result = ((d in ("steps", "step") or d.endswith(" steps")) and not any(w in d for w in _NOT_TRAINING_STEPS)) \
        or numbered_epoch(desc) is not None or d.startswith(_MAIN_BAR_HEADS)
    if len(_MAIN_BAR) < 256:
        _MAIN_BAR[desc] = result
    return result


# ---- milestones ------------------------------------------------------------------------------

# (lower-case message prefix, phase, milestone name), checked with str.startswith.
# Other trainers' words follow from phase_words.toml.
MILESTONE_PREFIXES: tuple[tuple[str, str, str], ...] = (
    ("loading settings from", "model_load", "start"),
    ("preparing accelerator", "model_load", "preparing accelerator"),
    ("loading model for process", "model_load", "loading model"),
    ("load stablediffusion checkpoint", "model_load", "loading model"),
    ("load diffusers pretrained models", "model_load", "loading model"),
    ("loading u-net", "model_load", "loading model"),
    ("loading unet", "model_load", "loading model"),
    ("loading vae", "model_load", "loading model"),
    ("loading text encoder", "model_load", "loading model"),
    ("loading state dict from", "model_load", "loading model"),
    ("building flux model", "model_load", "loading model"),
    ("building u-net", "model_load", "loading model"),
    ("building text encoder", "model_load", "loading model"),
    ("building vae", "model_load", "loading model"),
    ("building clip", "model_load", "loading model"),
    ("building t5", "model_load", "loading model"),
    ("building autoencoder", "model_load", "loading model"),
    ("loaded flux", "model_load", "loading model"),
    ("loaded ae", "model_load", "loading model"),
    ("loaded clip", "model_load", "loading model"),
    ("loaded t5", "model_load", "loading model"),
    ("enable sdpa", "model_load", "attention"),
    ("enable xformers", "model_load", "attention"),
    ("enable memory efficient attention", "model_load", "attention"),
    ("import network module", "model_load", "creating network"),
    ("create lora network", "model_load", "creating network"),
    # The network's modules created and applied ("create LoRA for Text Encoder: 72 modules.", "enable LoRA for U-Net").
    ("create lora for", "model_load", "creating network"),
    ("enable lora for", "model_load", "creating network"),
    ("enable fp8 training", "model_load", "fp8"),
    ("enable block swap", "model_load", "block swap"),
    ("flux: block swap enabled", "model_load", "block swap"),
    ("prepare optimizer, data loader", "model_load", "prepare optimizer"),
    ("move vae and unet back to original device", "model_load", "moving models"),
    ("caching latents", "cache_latents", "caching latents"),
    ("caching text encoder outputs", "cache_text_encoder", "caching text encoder outputs"),
    ("cache text encoder outputs", "cache_text_encoder", "caching text encoder outputs"),
    ("move vae and unet to cpu to save memory", "model_load", "moving models"),
    ("move text encoders to gpu", "cache_text_encoder", "caching text encoder outputs"),
    ("running training", "training", "running training"),
    ("start training", "training", "running training"),
    ("starting training", "training", "running training"),
    ("begin training", "training", "running training"),
    ("starting to train", "training", "running training"),
    # The dataset's record as the training loop starts an epoch (before its first step too).
    ("epoch is incremented", "training", "an epoch starting"),
    ("generating sample images", "sampling", "generating sample images"),
    ("saving state at", "saving", "saving state"),
    ("saving last state", "saving", "saving state"),
) + phase_words.prefixes()
MILESTONE_HEADS = tuple(p for p, _, _ in MILESTONE_PREFIXES)

# Words that name a text encoder or its tokenizer in a loading line (not the DiT or the VAE).
TEXT_ENCODER_WORDS_RE = re.compile(
    r"text[_ ]?encoder|tokenizer|\bclip|\bt5|umt5|byt5|\bllm\b|_vl_|-vl\b|qwen2|qwen3|gemma|llama|llava|mistral")

# How many training processes a run has: sd-scripts' "loading model for process 0/2",
# accelerate's "--num_processes 2" / "Num processes: 2", torchrun's "--nproc_per_node 2".
PROCESSES_RE = re.compile(r"(?:for process \d+/|num[_ ]processes\W{1,3}|nproc_per_node\W{1,3})(\d+)\b", re.I)
RANK_PREFIX_RE = re.compile(r"\[(?:rank|default)(\d+)\]:")
ACCEL_DEVICE_RE = re.compile(r"accelerator device:\s*(\S+)")
TOTAL_STEPS_RE = re.compile(
    r"(?:total optimization steps(?:\s*/.*?)?\s*[:：=]|override steps\. steps for \d+ epochs is\s*/.*?[:：])\s*(\d+)\s*$")
# "epoch 1/10" (sd-scripts), "Epoch 0 / 500    Step 0 | ETA --" (a trainer's progress panel).
EPOCH_RE = re.compile(r"epoch\s+(\d+)\s*/\s*(\d+)(?:\s|$)", re.I)
GLOBAL_STEP_RE = re.compile(r"Epoch \d+, global step (\d+):", re.I)
# "saving checkpoint: <path>" (sd-scripts), "Saved checkpoint: <path>" (a trainer reporting the file written).
SAVING_CKPT_RE = re.compile(r"sav(?:ing|ed) checkpoint:\s*(.+?)\s*$", re.I)
SAVE_TRAINED_RE = re.compile(r"save trained model as .*? to\s+(.+?)\s*$")
SAVING_STATE_RE = re.compile(r"Saving current state to\s+(.+?)\s*$")
RESUME_RE = re.compile(r"resume training from (?:local|huggingface) state:\s*(.+?)\s*$")
SKIPPING_RE = re.compile(r"skipping (\d+) steps\b")
SAMPLE_STEP_RE = re.compile(r"generating sample images at step\D{0,40}?(\d+)\s*$", re.I)
# "Saving at step 300", "Saving model at step 300", "Saving workspace/save/x.safetensors",
# "Saving C:\\out\\x" — a step, or something with a path separator or a model file's suffix.
SAVING_GENERIC_RE = re.compile(
    r"saving (?:\w+ )?(?:at|after) (?:step|epoch) \d+|saving (?:\w+ )?(?:to )?\S*[\\/]\S*"
    r"|saving (?:\w+ )?(?:to )?\S+\.(?:safetensors|ckpt|pt|pth|bin)\b", re.I)
LOADING_TEXT_ENCODER_RE = re.compile(
    r"\bloading\b(?:(?!output|cache|embed)[^.:;]){0,60}?\btext[ _-]?encoders?(?![a-z])(?![ _-]*(?:outputs?|cache|embed))")
# loguru's default format once the time is cut: "| INFO     | package.module:function:42 - message".
LOGURU_RE = re.compile(r"\|\s*(DEBUG|INFO|WARNING|ERROR|CRITICAL|SUCCESS|TRACE)\s*\|\s*[\w.<>\-]+:[\w.<>\-]+:\d+ - (.*)$")
LOGURU_LEVELS = {"SUCCESS": "INFO", "TRACE": "DEBUG"}
# A logger that re-logs a process's own output line by line: "| ERROR | stderr | <the line>".
REDIRECTED_RE = re.compile(r"(?:\d{4}-\d\d-\d\d[ T][\d:.,]+\s*)?\|\s*(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*\|\s*std(?:out|err)\s*\| ?")
# The same with the level first (a custom loguru format): "INFO     | 2024-08-29 06:16:28 |
# package.module:function:42 - message", read once the level is taken off.
LOGURU_AFTER_LEVEL_RE = re.compile(r"\|\s*\d{4}-\d\d-\d\d[ T][\d:.,]+\s*\|\s*[\w.<>\-]+:[\w.<>\-]+:\d+ - (.*)$")
# A record's logger before a bar ("__main__ | message") and the function that logged it after the
# message ("… (sample_image_inference)"), as musubi-tuner's Rich handler prints them.
LOGGER_BAR_RE = re.compile(r"([\w.<>]+) \| (.*)$")
FUNC_SUFFIX_RE = re.compile(r"\s\(([a-z_]\w*)\)\s*$")
# Python logging's default format, "INFO:module.name:message" (musubi-tuner, diffusers scripts).
PYLOG_RE = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL):([\w.\-]+):(.*)$")
# Records in forms whose level cleaning would cut as a prefix, read before the line is cleaned:
# - the level in brackets and the logger in parentheses after it (SimpleTuner's "2024-08-06
#   17:09:09,490 [INFO] (ArgsParser) message"; the tag stays for the milestone rules). A bracketed
#   level alone is no record: a wrapper relaying its trainer's output tags every line so ("[INFO]
#   Traceback (most recent call last):");
# - time, level and logger each in brackets ("[2023-10-09 00:29:27,796][DEBUG][dreambooth.train_dreambooth]
#   - message", the Dreambooth extension's);
# - time, level and logger between bars ("2024-05-25 13:51:03,724 | INFO | /w/kohya_gui/common_gui.py |
#   message", the kohya_ss GUI's log file);
# - time and a level padded to eight inside brackets, then a dash ("[2023-07-19 14:47:55,500] [    INFO] -
#   message", PaddleNLP's and ppdiffusers' logger).
# - month, day and time, the level and the logging file, line and function inside one pair of brackets
#   ("[06-24 17:12:25|INFO|cosmos_predict2/checkpointer.py:205:load] message", NVIDIA's imaginaire logger in
#   the Cosmos trainers); the file is the record's logger.
_TIME = r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?"
_LEVEL = r"(DEBUG|INFO|WARNING|ERROR|CRITICAL)"
BRACKET_RECORD_RE = re.compile(rf"(?:\[?{_TIME}\]? )?\[{_LEVEL}\] (?=\([\w.]+\) )")
BRACKET_LOGGER_RE = re.compile(rf"\[{_TIME}\]\[{_LEVEL}\]\[([\w.\-]+)\] -? ?")
PIPE_RECORD_RE = re.compile(rf"{_TIME} \| {_LEVEL} +\| ([^|]{{1,200}}?) +\| ")
PADDED_LEVEL_RE = re.compile(rf"\[?{_TIME}\] \[ *{_LEVEL}\] - ?")
PIPED_BRACKET_RE = re.compile(
    r"\[\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?\|(DEBUG|INFO|WARNING|ERROR|CRITICAL|SUCCESS|TRACE)\|"
    r"([^|\]\s]{1,200}?)(?::\d+)?(?::\w+)?\] ?")


def record_head(line: str) -> tuple[str, str | None, int] | None:
    """(level, logger or None, where the rest starts) of a record in one of the forms above."""
    head = line[:48]
    if "] (" in head:
        m = BRACKET_RECORD_RE.match(line)
        if m:
            return m.group(1), None, m.end()
    if "][" in head:
        m = BRACKET_LOGGER_RE.match(line)
        if m:
            return m.group(1), m.group(2), m.end()
    if "] [" in head:
        m = PADDED_LEVEL_RE.match(line)
        if m:
            return m.group(1), None, m.end()
    if "|" in head and line[:1] == "[":
        m = PIPED_BRACKET_RE.match(line)
        if m:
            return LOGURU_LEVELS.get(m.group(1), m.group(1)), m.group(2), m.end()
    if " | " in head:
        m = PIPE_RECORD_RE.match(line)
        if m and m.group(2) not in ("stdout", "stderr"):
            # (A logger re-logging the process's own output is read as that output: REDIRECTED_RE.)
            return m.group(1), m.group(2), m.end()
    return None


def clean_record(line: str) -> tuple[str, tuple[str, str | None] | None]:
    """The line cleaned, and (level, logger) where it is a record in one of the forms above (its head cut)."""
    line = strip_ansi(line)  # a coloured level ("[\x1b[33mWARNING\x1b[0m]") hides the head from its pattern
    head = record_head(line)
    if head is None:
        return clean(line), None
    return line[head[2]:], (head[0], head[1])


# ---- tracebacks and exceptions ------------------------------------------------------------

TRACEBACK_HEAD = "Traceback (most recent call last)"
# IPython's header names the exception before it ("AttributeError                Traceback (most recent call last)").
_IPYTHON_HEAD_RE = re.compile(r"[A-Za-z_][\w.]*\s{2,}Traceback \(most recent call last\)")


def traceback_head(s: str) -> bool:
    """Whether a (cleaned, non-empty) line opens a traceback: Python's header, a Rich box's title, or
    IPython's header with the exception's name first."""
    if s.startswith(TRACEBACK_HEAD):
        return True
    if TRACEBACK_HEAD not in s:
        return False
    return s[0] in "╭┏" or _IPYTHON_HEAD_RE.match(s) is not None

# A line naming an exception: `torch.OutOfMemoryError: CUDA out of memory...`, a bare `MemoryError`,
# Python's plain `Exception: message`.
EXC_LINE_RE = re.compile(
    r"(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Failure|Fault)|Exception(?=:))(?::\s?(.*))?$"
    # Any module-qualified class, e.g. voluptuous.error.MultipleInvalid: ...
    r"|(?:[a-z_]\w*\.)+([A-Z]\w*):\s(.*)$"
)
LAUNCHER_WRAPPERS = ("CalledProcessError", "ChildFailedError")
# A frame line that can open a traceback whose header was cut off: Python's `File "…", line N,
# in f`, IPython's `File ~/…:N, in f`, `Cell In[3], line 5` and `--> 520 code`.
FRAME_LINE_RE = re.compile(r'File "[^"]+", line \d+|File [~/\\\w.:-]+:\d+, in |Cell In\[\d+\], line \d+|--> \d+ ')
# The top-level frame of a model's training script ("…/ltx2_train_network.py", line 4, in <module>"):
# the script that ran, whose name may say a family the frames under it do not.
ENTRY_SCRIPT_RE = re.compile(r'[\\/"]\w+_train(?:_network)?\.py", line \d+, in <module>')
BOX_CHARS = "│╭╰┃┏┗"
BOX_CLOSE = "╰┗"

# ---- exit status ----------------------------------------------------------------------------

_EXIT_PATTERNS = (
    (re.compile(r"returned non-zero exit status (-?\d+)"), 1),
    (re.compile(r"died with <Signals\.\w+: (\d+)>"), -1),
    (re.compile(r"failed \(exitcode: (-?\d+)\)"), 1),
    (re.compile(r"Signals\.SIG\w+: (\d+)"), -1),
    # torch elastic's error record of a worker killed by a signal: "traceback : Signal 9 (SIGKILL)
    # received by PID 4923".
    (re.compile(r"\bSignal (\d+) \(SIG\w+\) received by PID\b"), -1),
    (re.compile(r"^\s*exitcode\s*:\s*(-?\d+)"), 1),
    # A GUI's or node's own report of the trainer process: "Command failed with exit code 3221225477";
    # a launcher's record of a worker process: DeepSpeed's "[…] exits with return code = 1".
    (re.compile(r"(?:failed|exit(?:s|ed)?|terminated) with (?:exit |return )?(?:code|status)\s*[:=]?\s*(-?\d+)"), 1),
)


# Windows reports a crash as an NTSTATUS code, printed unsigned (3221225477) or signed.
WINDOWS_STATUS = {
    0xC0000005: "0xC0000005, a Windows access violation: the process crashed inside native code",
    0xC00000FD: "0xC00000FD, a Windows stack overflow",
    0xC0000409: "0xC0000409, a Windows stack-buffer overrun (a native library aborted)",
    0xC0000135: "0xC0000135, a Windows DLL that could not be found",
    0xC000001D: "0xC000001D, an illegal CPU instruction (a library built for a newer CPU)",
}


def windows_status(status: int | None) -> str | None:
    """What a Windows NTSTATUS exit code means, or None when `status` is not one."""
    if status is None:
        return None
    return WINDOWS_STATUS.get(status & 0xFFFFFFFF if status < 0 else status)


EXIT_TAIL_RE = re.compile(r"(?:status )?(-?\d+)\.?\s*$")


def exit_status(text: str) -> int | None:
    """The trainer's exit status as a launcher reports it (a signal as its negative)."""
    if "exit" not in text and "Signal" not in text:
        return None
    for rx, sign in _EXIT_PATTERNS:
        m = rx.search(text)
        if m:
            return sign * int(m.group(1))
    return None


# ---- OOM recognition --------------------------------------------------------------------------

# Every pattern below is matched against the lower-cased text: users retype messages ("cuda out
# of memory. tried to allocate 30.00 mib"), and a case-folding regex is ten times slower than
# lowering the line once.

# Host memory running out. Checked before the GPU patterns: newer PyTorch raises
# OutOfMemoryError for the CPU allocator too, and "out of memory" alone says nothing.
CPU_OOM_RE = re.compile(
    r"defaultcpuallocator|can't allocate memory|not enough memory: you tried to allocate"
    r"|(?<!\w)memoryerror\b|unable to allocate [\d.]+ ?[kmgtp]?i?b"
    r"|paging file is too small|os error 1455|winerror 1455|cannot allocate memory|std::bad_alloc"
    r"|out of memory: kill|oom-kill|java heap space",
)
GPU_OOM_RE = re.compile(
    r"cuda out of memory|cuda error: out of memory|outofmemoryerror|cublas_status_alloc_failed"
    r"|cudnn_status_alloc_failed|cudnn_status_not_enough_workspace|allocation on device"
    r"|cudaerrormemoryallocation|cuda_error_out_of_memory|hip out of memory|hiperroroutofmemory"
    r"|hip error: out of memory|mps backend out of memory|xpu out of memory|out of memory on device"
    r"|cuda driver error: out of memory"
    r"|oom when allocating|resourceexhaustederror"
)
# CUDA failures that are not a lack of memory, though their wording mentions memory or looks
# like an argument error; cuDNN failing inside a kernel or finding no kernel for an op ("cuDNN Frontend
# error: … No execution plans support the graph.") is one too.
CUDA_ERROR_RE = re.compile(
    r"illegal memory access|device-side assert|cuda error: invalid argument|cuda error: an illegal"
    r"|cuda error: misaligned address|cuda error: unspecified launch failure|cudaerrorillegaladdress"
    r"|cuda error: invalid configuration argument|cuda error: operation not permitted"
    r"|cublas_status_execution_failed|cublas_status_internal_error|cudnn_status_execution_failed"
    r"|cudnn_status_internal_error|cudnn_status_mapping_error|hip error: invalid argument"
    r"|hip error: an illegal memory access|cuda error: unknown error|hip error: unknown error|cudaerrorunknown"
    r"|cuda error: invalid device function|hip error: invalid device function|cudnn frontend error"
)
# A plain line (no exception name) counts as an OOM only when the signature starts it or
# comes with PyTorch's figures, so a warning that merely mentions OOM is not one.
_GPU_OOM_LEAD_RE = re.compile(r"^\W*(?:" + GPU_OOM_RE.pattern + r")")


def is_oom(text: str) -> bool:
    """Whether an error text is a GPU out-of-memory (and not the host running out of RAM)."""
    low = text.lower()
    return bool(GPU_OOM_RE.search(low)) and not CPU_OOM_RE.search(low)


def plain_line_is_oom(text: str) -> bool:
    low = text.lower()
    m = GPU_OOM_RE.search(low)
    if not m or CPU_OOM_RE.search(low):
        return False
    if _GPU_OOM_LEAD_RE.match(low) or "tried to allocate" in low:
        return True
    before = low[: m.start()]
    return "error" in before or "exception" in before


# ---- the end of an OOM message ------------------------------------------------------------------

OOM_DONE_RE = re.compile(r"Memory Management\s*(?:and PYTORCH_CUDA_ALLOC_CONF|\(\S*\))|PyTorch limit \(set by"
                         r"|may cause system failure\)", re.I)
OOM_STAT_LINE_RE = re.compile(r"\s*(?:Currently allocated|Requested|Device limit|Free \(according|PyTorch limit|:)")
# The figures an OOM message holds are read in oomfigures.py.


# ---- failure kinds ------------------------------------------------------------------------------

# Messages after which sd-scripts returns without raising (it logs them at ERROR): the run's failure
# even where a wrapper relaying the output dropped the level (lower-case prefixes).
FATAL_WITHOUT_LEVEL = ("no data found. please verify", "画像がありません")
# torch's load_state_dict report of the keys it lacks or has too many, of a parameter it could not
# copy from the checkpoint, or of one whose shape differs from the model's (lower-cased, its indent kept).
STATE_DICT_REPORT_RE = re.compile(
    r"\s*(?:(?:missing|unexpected) key\(s\) in state_dict: [\"']|while copying the parameter named [\"']"
    r"|size mismatch for \S+: copying a param with shape )")
# A shell that cannot find the launcher or the interpreter it was told to run ("sh: 2: accelerate: not
# found", "bash: accelerate: command not found", "'accelerate' is not recognized as an internal or external
# command"), lower-cased: the job never started.
LAUNCHER_NOT_FOUND_RE = re.compile(
    r"(?:[\w/.\-]*(?:sh|bash|zsh)(?:\.exe)?: (?:line )?(?:\d+: )?|['\"]?)"
    r"(?:accelerate|launch|torchrun|deepspeed|python[\d.]*|py|pip[\d.]*)(?:\.exe)?['\"]?"
    r"(?:: (?:command )?not found\s*$| is not recognized as an internal or external command)"
    # PowerShell's wording: "accelerate : The term 'accelerate' is not recognized as the name of a cmdlet, …".
    r"|(?:\S+ : )?the term '(?:accelerate|torchrun|deepspeed|python[\d.]*|py|pip[\d.]*)(?:\.exe)?'"
    r" is not recognized as the name of a cmdlet")
# Lines that are a failure whatever their kind: Python's `-m` finding no module to run, behind the
# interpreter's name or not ("…\\python.exe: Error while finding module specification for …").
FATAL_OTHER_RE = re.compile(r"(?:^|python[\w.]*(?:\.exe)?: )error while finding module specification")
# A job runner's record of a job that failed, with the error's message (lower-cased): "Error running
# job: tuple index out of range", "error running task 'x': …", "Job failed with error: …".
JOB_FAILED_RE = re.compile(r"\s*!!!\s*exception during processing\s*!!!\s*\S"  # ComfyUI's report of a node's error
                           r"|\s*(?:error|exception) (?:while )?running (?:the )?(?:job|task)\b[^:]{0,60}: \S"
                           r"|\s*(?:the )?(?:job|task)\b[^:]{0,60} failed with (?:an? )?(?:error|exception)\b[^:]{0,20}: \S")
# A program's own notice of an error, no level and no exception name before it ("Error loading pipeline: …",
# "Exception initializing accelerator: …", "Fatal error in launcher: …", "Error executing the command: …",
# "* Failed to load checkpoint *", "failed validation"): words and then a colon, so that prose mentioning an error
# ("errors are logged below") is not one. Other "Failed to …" notices are mostly warnings a run survives ("Failed to
# quantize …", "Failed to load ZLUDA: …").
ERROR_NOTICE_RE = re.compile(
    r"\W{0,3}(?:(?:error|exception|fatal error)\b[^:.!?]{0,60}:\s*\S|failed validation\b"
    r"|failed to load (?:the )?(?:checkpoint|model|pipeline)\b)")
# Lines worth classifying at all: the rest of a log never names a failure. Lower-cased text.
SUSPECT_RE = re.compile(
    r"error|fail|warn|cannot|can't|unable|not found|no module|killed|memory|nan\b|invalid|(?:un|not )recogni[sz]ed"
    r"|exception|abort|no such file|does not exist|not exist|no kernel|not compiled|no cuda|nccl|c10d|xformers"
    r"|bitsandbytes|cublas|cudnn|alloc|expected|mismatch|dtype|not implemented|not supported|paging file"
    r"|no data found|not correctly cached|exit|signal|device-side assert|\boom\b"
)


# (kind, pattern over the lower-cased text), first match wins.
_KIND_RULES: tuple[tuple[str, re.Pattern], ...] = (
    ("xformers", re.compile(r"xformers|memory_efficient_attention|no operator found for")),
    ("bitsandbytes", re.compile(
        r"bitsandbytes|libbitsandbytes|cget_col_row_stats|cadam32bit|cuda setup failed|compiled without gpu support"
        r"|bnb\.optim")),
    ("cuda_error", CUDA_ERROR_RE),
    ("cuda_unavailable", re.compile(
        r"torch not compiled with cuda|no cuda gpus are available|found no nvidia driver|nvidia driver on your system"
        r"|cuda driver version is insufficient|no cuda-capable device|torch\.cuda\.is_available\(\) is false"
        r"|cuda unknown error|cudagetdevicecount|no kernel image is available|requires a gpu|invalid device ordinal"
        r"|is not compatible with the current pytorch installation|cuda initialization"
        r"|hiperrornobinaryforgpu|unable to find code object")),
    # Any other "CUDA error: …" (or HIP's) that is not out of memory is a kernel or driver failure.
    ("cuda_error", re.compile(r"\b(?:cuda|hip) error: (?!out of memory)")),
    ("distributed", re.compile(
        r"nccl|c10d|rendezvous|init_process_group|diststoreerror|distbackenderror|distnetworkerror|processgroup"
        r"|use_libuv|address already in use|eaddrinuse|master_addr|master_port|torch\.distributed\.\w*error"
        r"|watchdog caught collective")),
    ("dtype", re.compile(
        r"expected scalar type|must have the same dtype|not implemented for '(?:half|bfloat16|float8\w*)'"
        r"|unsupported scalartype|dtype mismatch|(?:half|bfloat16|bf16|fp16)\w*\) and weight type|and weight type "
        r"\(\S*(?:half|bfloat16)|bfloat16 is only supported|does not support bfloat16|bf16 is not supported"
        r"|promotion for float8 types is not supported|mixed_precision.*(?:not supported|requires)")),
    # argparse's "train.py: error: argument --x: …", never an exception's own words ("TypeError: argument of
    # type 'NoneType' is not iterable", "TypeError: argument 'metadata': …").
    ("bad_argument", re.compile(
        r"error: unrecognized arguments|unrecognized arguments:|(?<![a-z])error: argument "
        r"|error: the following arguments"
        r"|error: ambiguous option|invalid choice:|invalid user config|ユーザ設定|extra keys not allowed"
        r"|required key not provided|invalid argument|\.py: error:")),
    ("missing_file", re.compile(
        r"filenotfounderror|no such file or directory|\[errno 2\]|does not exist|not found\.?\s*$"
        r"|cannot find the (?:file|path)|the system cannot find|not correctly cached|can't load tokenizer"
        r"|is not a local folder|no data found|画像がありません|no image files? found|headertoolarge")),
    ("nan_loss", re.compile(r"loss is nan|nan loss|nan detected|non-finite loss|avr_loss=nan")),
)


@lru_cache(maxsize=1)
def arg_names() -> frozenset[str]:
    """Every sd-scripts argument name at the pinned commit (multi-word ones only)."""
    try:
        from kohya_tuner.schema import raw_schema

        scripts = raw_schema()["scripts"]
        return frozenset(a["name"] for s in scripts.values() for a in s["args"] if "_" in a["name"])
    except Exception:  # packaged data missing in a broken install: classification still works
        return frozenset()


_WORD_RE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+")


def error_kind(text: str, exc_type: str | None = None) -> str:
    """The diagnose error.kind for a non-GPU-OOM error text (cpu_oom, …, other)."""
    low = text.lower()
    if CPU_OOM_RE.search(low) or exc_type == "MemoryError":
        return "cpu_oom"
    for kind, rx in _KIND_RULES:
        if rx.search(low):
            return kind
    if exc_type in ("FileNotFoundError", "IsADirectoryError", "NotADirectoryError"):
        return "missing_file"
    if exc_type in ("AssertionError", "ValueError"):
        # sd-scripts checks its arguments with assert/ValueError naming them.
        names = arg_names()
        if any(w in names for w in _WORD_RE.findall(text)):
            return "bad_argument"
    return "other"


# A warning or error line that explains a later, otherwise unexplained failure. Lower-cased text.
HINT_WORDS_RE = re.compile(r"error|fail|warn|can't|cannot|unable|not found|no module|invalid|not correctly")


def hint_kind(text: str) -> str | None:
    if not HINT_WORDS_RE.search(text.lower()):
        return None
    kind = error_kind(text)
    return None if kind in ("other", "cpu_oom") else kind


# ---- launcher frames ---------------------------------------------------------------------------

_LAUNCHER_FRAME_RE = re.compile(
    r"accelerate[\\/]commands|accelerate_cli|simple_launcher|multi_gpu_launcher|[\\/]bin[\\/]accelerate"
    r"|accelerate\.exe|Scripts[\\/]accelerate|torch[\\/]distributed[\\/](?:run\.py|launcher[\\/])|torchrun|elastic[\\/]"
)
_GENERIC_FRAME_RE = re.compile(r"runpy\.py|sys\.exit\(main\(\)\)|_run_module_as_main|_run_code|exec\(code|^\^+$")


def launcher_only(frames: list[str]) -> bool:
    """Whether a traceback holds only the launcher's own frames (accelerate / torchrun). A source
    line is its frame's; a last frame cut inside its path (a paste's end) is the launcher's too, as
    nothing runs the trainer in the launcher's process."""
    saw_launcher = False
    in_ours = False
    rows = [f.strip() for f in frames if f.strip()]
    for i, line in enumerate(rows):
        if line.startswith('File "'):
            in_ours = bool(_LAUNCHER_FRAME_RE.search(line) or _GENERIC_FRAME_RE.search(line))
            if _LAUNCHER_FRAME_RE.search(line):
                saw_launcher = True
            elif not in_ours and i == len(rows) - 1 and '", line ' not in line and saw_launcher:
                in_ours = True
            if not in_ours:
                return False
            continue
        if _LAUNCHER_FRAME_RE.search(line):
            saw_launcher = True
            continue
        if in_ours or _GENERIC_FRAME_RE.search(line) or line.startswith(("args.func(", "raise subprocess",
                                                                           "return _run_code", "main()")):
            continue
        return False
    return saw_launcher
