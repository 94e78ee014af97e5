"""A stand-in for sd-scripts' LoRA trainers, for tests that need no GPU and no model.

It takes the same command line and config files as the real entry scripts (checked
against the pinned argument schema), prints the same log dialect (progress bar on
stderr with carriage returns, saving/state/resume lines), writes real output files
(LoRA `.safetensors`, state directories with `train_state.json`), honours `resume` /
`skip_until_initial_step` / `initial_step`, and fails with a CUDA-style out-of-memory
error where its own memory model exceeds a budget.

Its memory model is deliberately NOT kohya-tuner's estimator: different constants,
fewer terms. The supervisor must recover from what the trainer reports, not from
agreeing with itself.

Environment knobs:
  STANDIN_VRAM_GB          memory budget in GiB (unset: unlimited)
  KOHYA_TUNER_EMULATE_VRAM_GB  a cap set by `run --emulate-vram`; the lower of the two wins
  STANDIN_RAM_GB           host-RAM budget in GiB; above it the process is killed with SIGKILL
  STANDIN_PEAK_STEP        the step at which the largest bucket arrives (default 1): a
                           training OOM strikes there, earlier steps fit
  STANDIN_ERROR_AT_STEP    raise a non-memory error at this step
  STANDIN_HANG_AT_STEP     stop printing and sleep forever at this step
  STANDIN_NAN_AT_STEP      from this step the loss is NaN (a diverged run: `avr_loss=nan`)
  STANDIN_STEP_SECONDS     sleep per optimizer step (default 0.01)
  STANDIN_REPORT           print the memory model's figures as JSON and exit 0
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import struct
import sys
import textwrap
import time
from datetime import datetime
from pathlib import Path
from typing import Any

GIB = 1024**3
IMAGE_EXTS = {".png", ".jpg", ".jpeg", ".webp", ".bmp"}

# Billions of parameters: (diffusion model, text encoders, VAE). Rounded on purpose.
_PARAMS_B = {"sd15": (0.86, 0.12, 0.08), "sdxl": (2.6, 0.82, 0.08), "flux": (11.9, 4.9, 0.08)}
# GiB of activations for one image at the family's native side, without checkpointing.
_ACT_GIB = {"sd15": 2.6, "sdxl": 7.0, "flux": 16.0}
_NATIVE = {"sd15": 512, "sdxl": 1024, "flux": 1024}
# GiB for one sample image at native size (denoising + VAE decode).
_SAMPLE_GIB = {"sd15": 1.2, "sdxl": 3.0, "flux": 4.5}
# LoRA parameters per unit of rank, in millions.
_LORA_M_PER_RANK = {"sd15": 0.8, "sdxl": 2.9, "flux": 4.6}
_SWAPPABLE = 57  # 19 double + 38 single blocks


# ---- logging in sd-scripts' two styles -------------------------------------------------

class Log:
    """Rich-style records on stderr (wrapped at COLUMNS, 80 when unset, like Rich on a pipe),
    or message-only lines on stdout with console_log_simple."""

    def __init__(self, simple: bool = False):
        self.simple = simple
        self._last_time = ""

    def __call__(self, message: str, level: str = "INFO", where: str = "train_network.py:1") -> None:
        if self.simple:
            print(message, flush=True)
            return
        width = int(os.environ.get("COLUMNS") or 80)
        now = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        stamp = now if now != self._last_time else " " * len(now)
        self._last_time = now
        body_width = max(10, width - 30 - len(where) - 1)
        lines = []
        for para in message.split("\n"):
            lines.extend(textwrap.wrap(para, body_width, break_long_words=True, break_on_hyphens=False) or [""])
        first = f"{stamp} {level:<8} {lines[0]:<{body_width}} {where}"
        out = [first] + [" " * 29 + ln for ln in lines[1:]]
        sys.stderr.write("\n".join(out) + "\n")
        sys.stderr.flush()


def _fmt_time(seconds: float) -> str:
    seconds = int(seconds)
    m, s = divmod(seconds, 60)
    h, m = divmod(m, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def progress_line(desc: str, n: int, total: int, elapsed: float, postfix: str = "") -> str:
    """One tqdm-style status in the default layout sd-scripts' bars render to a pipe."""
    frac = n / total if total else 0.0
    full = int(frac * 10)
    partial = int((frac * 10 - full) * 8)
    bar = "█" * full + (" ▏▎▍▌▋▊▉"[partial] if full < 10 else "")
    bar = bar.ljust(10)
    if n and elapsed > 0:
        rate = n / elapsed
        rate_s = f"{rate:5.2f}it/s" if rate >= 1 else f"{1 / rate:5.2f}s/it"
        remaining = _fmt_time((total - n) / rate)
    else:
        rate_s, remaining = "?it/s", "?"
    tail = f", {postfix}" if postfix else ""
    label = f"{desc}: " if desc else ""
    return f"{label}{frac * 100:3.0f}%|{bar}| {n}/{total} [{_fmt_time(elapsed)}<{remaining}, {rate_s}{tail}]"


class Bar:
    def __init__(self, desc: str, total: int):
        self.desc, self.total, self.n = desc, total, 0
        self.t0 = time.monotonic()
        self.postfix = ""
        self._draw()

    def _draw(self) -> None:
        sys.stderr.write("\r" + progress_line(self.desc, self.n, self.total, time.monotonic() - self.t0, self.postfix))
        sys.stderr.flush()

    def update(self, k: int = 1) -> None:
        self.n += k
        self._draw()

    def set_postfix(self, **kw: Any) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in kw.items())
        self._draw()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()


# ---- command line and config files, as sd-scripts reads them ------------------------------

def _arg_parser(script: str):
    from kohya_tuner.schema import script_args

    parser = argparse.ArgumentParser(prog=script)
    specs = script_args(script)
    for name, spec in specs.items():
        flag = f"--{name}"
        if spec.type == "bool-store_true":
            parser.add_argument(flag, action="store_true", default=argparse.SUPPRESS)
        elif spec.type == "list":
            conv = float if spec.item_type == "float" else str
            parser.add_argument(flag, nargs="*", type=conv, default=argparse.SUPPRESS)
        elif spec.type == "int":
            parser.add_argument(flag, type=int, default=argparse.SUPPRESS, choices=spec.choices)
        elif spec.type == "float":
            parser.add_argument(flag, type=float, default=argparse.SUPPRESS)
        elif spec.type == "int_or_float":
            parser.add_argument(flag, type=lambda v: float(v) if "." in v else int(v), default=argparse.SUPPRESS)
        else:
            choices = [c for c in spec.choices if c is not None] if spec.choices else None
            parser.add_argument(flag, type=str, default=argparse.SUPPRESS, choices=choices)
    return parser, specs


def load_args(script: str, argv: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(flat config as the trainer would see it, dataset config or {}). CLI > TOML > default."""
    import toml

    parser, specs = _arg_parser(script)
    cli = vars(parser.parse_args(argv))
    config: dict[str, Any] = {}
    cfg_path = cli.pop("config_file", None)
    if cfg_path:
        path = cfg_path if cfg_path.endswith(".toml") else cfg_path + ".toml"
        Log()(f"Loading settings from {path}...", where="train_util.py:4744")
        if not os.path.exists(path):
            Log()(f"{path} not found.", level="ERROR", where="train_util.py:4741")
            sys.exit(1)
        doc = toml.load(path)
        for key, value in doc.items():
            if isinstance(value, dict):
                config.update(value)
            else:
                config[key] = value
    config.update(cli)
    dataset: dict[str, Any] = {}
    ds_path = config.get("dataset_config")
    if ds_path:
        ds_path = str(ds_path)
        if not ds_path.endswith((".toml", ".json")):
            raise ValueError(f"not supported dataset config file extension: {ds_path}")
        with open(ds_path, encoding="utf-8") as fh:
            dataset = json.load(fh) if ds_path.endswith(".json") else toml.load(fh)
    return config, dataset


def validate(script: str, family: str, config: dict[str, Any], dataset: dict[str, Any]) -> None:
    from kohya_tuner.families import get_family
    from kohya_tuner.schema import errors_only, validate_config, validate_dataset

    fam = get_family(family)
    cfg = {k: v for k, v in config.items() if k not in ("dataset_config",)}
    problems = errors_only(validate_config(cfg, script, dataset=dataset or None, family=fam))
    if problems:
        # The real scripts do not validate TOML values; they crash later. This is that crash.
        raise ValueError("invalid argument value: " + "; ".join(str(p) for p in problems))
    if dataset:
        ds_problems = errors_only(validate_dataset(dataset, fam))
        if ds_problems:
            print("Invalid user config / ユーザ設定の形式が正しくないようです", file=sys.stderr)
            raise ValueError("; ".join(str(p) for p in ds_problems))


# ---- the stand-in's own memory model -----------------------------------------------------

def _resolution(config: dict[str, Any], dataset: dict[str, Any], family: str) -> tuple[int, int]:
    res = None
    for level in [config] + [dataset.get("general") or {}] + list(dataset.get("datasets") or []):
        v = level.get("resolution")
        if v is not None:
            res = v
    if res is None:
        return _NATIVE[family], _NATIVE[family]
    if isinstance(res, (list, tuple)):
        return int(res[0]), int(res[1])
    if isinstance(res, int):
        return res, res
    parts = [int(p) for p in str(res).split(",") if p.strip()]
    return (parts[0], parts[-1])


def _batch(config: dict[str, Any], dataset: dict[str, Any]) -> int:
    b = config.get("train_batch_size", 1)
    for level in [dataset.get("general") or {}] + list(dataset.get("datasets") or []):
        if level.get("batch_size") is not None:
            b = level["batch_size"]
    return int(b or 1)


def _sample_size(config: dict[str, Any], family: str) -> tuple[int, int]:
    w = h = _NATIVE[family]
    path = config.get("sample_prompts")
    if path and os.path.exists(path):
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            parts = line.split(" --")
            for p in parts[1:]:
                if p.startswith("w "):
                    w = int(p[2:].split()[0])
                if p.startswith("h "):
                    h = int(p[2:].split()[0])
    return w, h


def memory_model(family: str, config: dict[str, Any], dataset: dict[str, Any]) -> dict[str, float]:
    """GiB needed on the device in each phase: load, train, sample."""
    diff_b, te_b, vae_b = _PARAMS_B[family]
    mp = config.get("mixed_precision", "no")
    half = mp in ("fp16", "bf16")
    fp8 = bool(config.get("fp8_base") or config.get("fp8_base_unet"))
    diff_bytes = 1 if fp8 and half else (2 if half else 4)
    te_bytes = 1 if config.get("fp8_base") and half else (2 if half else 4)
    diff = diff_b * 1e9 * diff_bytes / GIB
    swap = int(config.get("blocks_to_swap") or 0)
    if family == "flux" and swap:
        diff *= 1 - 0.92 * swap / _SWAPPABLE
    te = te_b * 1e9 * te_bytes / GIB
    vae = vae_b * 1e9 * 2 / GIB
    te_cached = bool(config.get("cache_text_encoder_outputs") or config.get("cache_text_encoder_outputs_to_disk"))
    if config.get("lowram"):
        load = diff + te + vae
    else:
        # Components move to the device one after another; the largest pair decides.
        load = diff + max(te, vae)
    rank = int(config.get("network_dim") or 4)
    lora_params = rank * _LORA_M_PER_RANK[family] * 1e6
    if config.get("network_train_unet_only"):
        lora_params *= 0.85
    opt = str(config.get("optimizer_type") or "AdamW").lower()
    per_param = 4 + (4 if "8bit" not in opt and "adafactor" not in opt else 1) + (8 if "adafactor" not in opt and "8bit" not in opt else 2)
    lora = lora_params * per_param / GIB
    w, h = _resolution(config, dataset, family)
    area = (w * h) / (_NATIVE[family] ** 2)
    act = _batch(config, dataset) * area * _ACT_GIB[family]
    if config.get("gradient_checkpointing"):
        act *= 0.22
        if config.get("cpu_offload_checkpointing"):
            act *= 0.8
    if family != "flux" and not (config.get("sdpa") or config.get("xformers") or config.get("mem_eff_attn")):
        act *= 1.6
    resident_te = 0.0 if te_cached and (config.get("network_train_unet_only") or family == "sd15") else te
    train = diff + resident_te + lora + act + 0.35
    sw, sh = _sample_size(config, family)
    sample = diff + te + lora + _SAMPLE_GIB[family] * (sw * sh) / (_NATIVE[family] ** 2) + 0.35
    ram = 1.5 + 0.45 * int(config.get("max_data_loader_n_workers", 8) if config.get("max_data_loader_n_workers") is not None else 8)
    ram += (diff_b + te_b) * 1e9 * 2 / GIB * (0.2 if config.get("lowram") else 1.0)
    return {"load": round(load, 3), "train": round(train, 3), "sample": round(sample, 3), "ram": round(ram, 3)}


def _budget() -> float | None:
    vals = []
    for key in ("STANDIN_VRAM_GB", "KOHYA_TUNER_EMULATE_VRAM_GB"):
        v = os.environ.get(key)
        if v:
            vals.append(float(v))
    return min(vals) if vals else None


def _fmt_size(gib: float) -> str:
    if gib >= 1:
        return f"{gib:.2f} GiB"
    return f"{gib * 1024:.2f} MiB"


def _out_of_memory(need: float, budget: float) -> None:
    """Raise what PyTorch raises when an allocation does not fit, figures included."""
    in_use = min(need * 0.8, budget * 0.92)
    reserved = min(0.3, max(0.0, budget - in_use) * 0.3)
    allocated = max(0.0, in_use - reserved - 0.25)
    free = max(0.0, budget - in_use)
    tried = max(need - in_use, free + 0.02)
    message = (
        f"CUDA out of memory. Tried to allocate {_fmt_size(tried)}. GPU 0 has a total capacity of "
        f"{_fmt_size(budget)} of which {_fmt_size(free)} is free. Including non-PyTorch memory, this process has "
        f"{_fmt_size(in_use)} memory in use. Of the allocated memory {_fmt_size(allocated)} is allocated by "
        f"PyTorch, and {_fmt_size(reserved)} is reserved by PyTorch but unallocated. If reserved but unallocated "
        "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
        "See documentation for Memory Management  "
        "(https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
    )
    try:
        import torch

        exc_type = torch.OutOfMemoryError
    except Exception:  # no torch in this environment: the same name and text
        exc_type = type("OutOfMemoryError", (RuntimeError,), {"__module__": "torch"})
    raise exc_type(message)


# ---- output files ---------------------------------------------------------------------------

def write_safetensors(path: Path, rank: int, metadata: dict[str, str]) -> None:
    """A small but valid safetensors file (header length, JSON header, raw tensors)."""
    tensors = {"lora_unet_standin.lora_down.weight": [rank, 8], "lora_unet_standin.lora_up.weight": [8, rank]}
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    blobs = []
    for name, shape in tensors.items():
        count = shape[0] * shape[1]
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + 4 * count]}
        blobs.append(struct.pack(f"<{count}f", *([0.01] * count)))
        offset += 4 * count
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for b in blobs:
            fh.write(b)
    os.replace(tmp, path)


def read_safetensors_metadata(path: Path) -> dict[str, str]:
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n)).get("__metadata__", {})


def _image_count(dataset: dict[str, Any], config: dict[str, Any]) -> int:
    total = 0
    for ds in dataset.get("datasets") or []:
        for sub in ds.get("subsets") or []:
            if sub.get("is_reg"):
                continue
            d = Path(sub.get("image_dir", ""))
            n = sum(1 for p in d.iterdir() if p.suffix.lower() in IMAGE_EXTS) if d.is_dir() else 0
            repeats = sub.get("num_repeats", ds.get("num_repeats", (dataset.get("general") or {}).get(
                "num_repeats", config.get("dataset_repeats", 1))))
            total += n * int(repeats or 1)
    return total


# ---- the run ------------------------------------------------------------------------------------

def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    return int(v) if v else None


def main(script: str, family: str) -> None:
    config, dataset = load_args(script, sys.argv[1:])
    log = Log(simple=bool(config.get("console_log_simple")))
    validate(script, family, config, dataset)
    need = memory_model(family, config, dataset)
    if os.environ.get("STANDIN_REPORT"):
        print(json.dumps(need))
        return
    budget = _budget()
    if os.environ.get("KOHYA_TUNER_EMULATE_VRAM_GB"):
        hook = sys.modules.get("sitecustomize")
        log(f"emulated card: {os.environ['KOHYA_TUNER_EMULATE_VRAM_GB']} GB, VRAM budget {budget} GiB, "
            f"sitecustomize {getattr(hook, '__file__', None)}", where="standin_trainer.py:1")
    ram_budget = float(os.environ["STANDIN_RAM_GB"]) if os.environ.get("STANDIN_RAM_GB") else None
    step_s = float(os.environ.get("STANDIN_STEP_SECONDS", "0.01"))

    log("Using DreamBooth method.", where="train_network.py:530")
    log("prepare images.", where="train_util.py:2112")
    images = _image_count(dataset, config)
    log(f"{images} train images with repeats.", where="train_util.py:2158")
    if images == 0:
        log("No data found. Please verify arguments (train_data_dir must be the parent of folders with images) / "
            "画像がありません。引数指定を確認してください（train_data_dirには画像があるフォルダではなく、画像があるフォルダの親フォルダを指定する必要があります）",
            level="ERROR", where="train_network.py:560")
        return
    log("preparing accelerator", where="train_network.py:593")
    device = "cpu" if os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("true", "1") else "cuda:0"
    print("accelerator device:", device, flush=True)
    if ram_budget is not None and need["ram"] > ram_budget:
        # What the kernel's OOM killer does: no traceback, signal 9.
        os.kill(os.getpid(), 9)
    log("loading model for process 0/1", where="train_util.py:5574")
    log(f"load StableDiffusion checkpoint: {config.get('pretrained_model_name_or_path')}", where="train_util.py:5530")
    if budget is not None and need["load"] > budget:
        _out_of_memory(need["load"], budget)
    if config.get("cache_latents") or config.get("cache_latents_to_disk"):
        log("caching latents with caching strategy.", where="train_util.py:1120")
        log("caching latents...", where="train_util.py:1170")
    print(f"import network module: {config.get('network_module')}", flush=True)
    print("prepare optimizer, data loader etc.", flush=True)

    batch = _batch(config, dataset)
    accum = int(config.get("gradient_accumulation_steps") or 1)
    per_epoch = max(1, math.ceil(images / batch / accum))
    max_steps = int(config.get("max_train_steps") or 1600)
    if config.get("max_train_epochs"):
        max_steps = int(config["max_train_epochs"]) * per_epoch
        print(f"override steps. steps for {config['max_train_epochs']} epochs is / 指定エポックまでのステップ数: {max_steps}")
    epochs = math.ceil(max_steps / per_epoch)

    trained = 0  # optimizer steps behind the weights, carried through states
    initial_step = 0
    start_epoch = 0
    if config.get("resume"):
        state_dir = Path(config["resume"])
        log(f"resume training from local state: {state_dir}", where="train_util.py:4777")
        ts_file = state_dir / "train_state.json"
        if not ts_file.is_file():
            raise FileNotFoundError(f"[Errno 2] No such file or directory: '{ts_file}'")
        ts = json.loads(ts_file.read_text(encoding="utf-8"))
        log(f"load train state from {ts_file}: {ts}", where="train_network.py:969")
        trained = int(read_safetensors_metadata(state_dir / "model.safetensors").get("standin_trained", "0"))
        stored = int(ts.get("current_step", 0))
        if config.get("initial_step") is not None:
            stored = int(config["initial_step"])
        initial_step = stored
    elif config.get("initial_step") is not None:
        initial_step = int(config["initial_step"])
    if config.get("network_weights") and not config.get("resume"):
        weights = Path(config["network_weights"])
        log(f"load network weights from {weights}", where="train_network.py:680")
        trained = int(read_safetensors_metadata(weights).get("standin_trained", "0"))
    if initial_step > 0:
        assert initial_step < max_steps, "initial_step must be less than max_train_steps"
    # The pinned trainer's arithmetic (train_network.py ~1257-1344, measured on the real one):
    # the step is multiplied by the accumulation, the start epoch divides that by the
    # optimizer steps per epoch, whole epochs of micro-batches are taken off, and the counter
    # starts from what remains (so past an epoch boundary it restarts low).
    batches = math.ceil(images / batch)  # micro-batches per epoch
    if initial_step > 0 and config.get("skip_until_initial_step"):
        initial_step *= accum
        start_epoch = initial_step // per_epoch
        initial_step -= start_epoch * batches
    elif initial_step > 0:
        start_epoch = initial_step // per_epoch
        initial_step = 0

    print("running training / 学習開始")
    print(f"  num train images * repeats / 学習画像の数×繰り返し回数: {images}")
    print(f"  num batches per epoch / 1epochのバッチ数: {batches}")
    print(f"  num epochs / epoch数: {epochs}")
    print(f"  batch size per device / バッチサイズ: {batch}")
    print(f"  gradient accumulation steps / 勾配を合計するステップ数 = {accum}")
    print(f"  total optimization steps / 学習ステップ数: {max_steps}", flush=True)
    if initial_step:
        log(f"skipping {initial_step} steps / {initial_step}ステップをスキップします", where="train_network.py:1265")

    out_dir = Path(config.get("output_dir") or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    name = config.get("output_name") or "last"
    ext = "." + (config.get("save_model_as") or "safetensors")
    rank = int(config.get("network_dim") or 4)
    every = int(config.get("save_every_n_steps") or 0)
    keep_state = config.get("save_last_n_steps_state") or config.get("save_last_n_steps")
    sample_every = int(config.get("sample_every_n_steps") or 0) if config.get("sample_prompts") else 0
    peak_step = _env_int("STANDIN_PEAK_STEP") or 1
    error_at = _env_int("STANDIN_ERROR_AT_STEP")
    hang_at = _env_int("STANDIN_HANG_AT_STEP")
    nan_at = _env_int("STANDIN_NAN_AT_STEP")

    def sample(step: int) -> None:
        log(f"generating sample images at step / サンプル画像生成 ステップ: {step}", where="train_util.py:6261")
        log(f"prompt: {Path(config['sample_prompts']).read_text(encoding='utf-8').splitlines()[0] if config.get('sample_prompts') else ''}",
            where="train_util.py:6372")
        if budget is not None and need["sample"] > budget:
            _out_of_memory(need["sample"], budget)
        (out_dir / "sample").mkdir(exist_ok=True)
        (out_dir / "sample" / f"{name}_{step:06d}_00.png").write_bytes(b"\x89PNG\r\n\x1a\n")

    def save_model(path: Path, steps_done: int) -> None:
        write_safetensors(path, rank, {"ss_network_dim": str(rank), "ss_steps": str(steps_done),
                                       "standin_trained": str(trained)})

    def save_state(state: Path, epoch: int, step: int) -> None:
        log(f"Saving current state to {state}", where="accelerator.py:3241")
        state.mkdir(parents=True, exist_ok=True)
        save_model(state / "model.safetensors", step)
        (state / "optimizer.bin").write_bytes(os.urandom(256))
        (state / "scheduler.bin").write_bytes(b"\0" * 16)
        (state / "random_states_0.pkl").write_bytes(b"\0" * 16)
        log(f"save train state to {state / 'train_state.json'} at epoch {epoch} step {step}", where="train_network.py:946")
        (state / "train_state.json").write_text(json.dumps({"current_epoch": epoch, "current_step": step}),
                                                encoding="utf-8")

    done = {"step": initial_step, "epoch": start_epoch + 1}
    if os.environ.get("KOHYA_TUNER_SAVE_AT_OOM") and config.get("save_state"):
        # What kohya-tuner's hook does in the real trainer: once the traceback is printed, an
        # out-of-memory error saves the state of the steps completed (run/emulate/).
        previous = sys.excepthook

        def save_at_failure(et, ev, tb):
            previous(et, ev, tb)
            if et.__name__ != "OutOfMemoryError" or done["step"] < 1:
                return
            state = out_dir / f"{name}-step{done['step']:08d}-state"
            if (state / "train_state.json").is_file():
                return
            print(f"kohya-tuner: out of memory after step {done['step']}: saving the state of step "
                  f"{done['step']} to {state}", file=sys.stderr, flush=True)
            save_state(state, done["epoch"], done["step"])
            print(f"kohya-tuner: state saved at the failure, step {done['step']}: {state}", file=sys.stderr,
                  flush=True)

        sys.excepthook = save_at_failure
    if config.get("sample_at_first") and sample_every:
        sample(0)
    bar = Bar("steps", max_steps - max(0, initial_step))
    global_step = initial_step
    losses: list[float] = []
    skipped = max(0, initial_step)
    for epoch in range(start_epoch, epochs):
        print(f"\nepoch {epoch + 1}/{epochs}\n", flush=True)
        for _ in range(per_epoch):
            if skipped:
                skipped -= 1
                continue
            step = global_step + 1
            if hang_at is not None and step == hang_at:
                while True:
                    time.sleep(60)
            if error_at is not None and step == error_at:
                raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, cpu and meta!")
            if budget is not None and need["train"] > budget and step >= peak_step:
                _out_of_memory(need["train"], budget)
            time.sleep(step_s)
            global_step = step
            trained += 1
            done["step"], done["epoch"] = global_step, epoch + 1
            losses.append(math.nan if nan_at is not None and step >= nan_at
                          else 0.12 + 0.1 / math.sqrt(step) + 0.01 * ((step * 7919) % 13) / 13)
            # sd-scripts' order: bar update, sample images, save, then the loss postfix
            # redraws the bar.
            bar.update(1)
            if sample_every and global_step % sample_every == 0:
                sample(global_step)
            if every and global_step % every == 0 and global_step < max_steps:
                ckpt = out_dir / f"{name}-step{global_step:08d}{ext}"
                print(f"\nsaving checkpoint: {ckpt}", flush=True)
                save_model(ckpt, global_step)
                if config.get("save_state"):
                    log(f"saving state at step {global_step}", where="train_util.py:5964")
                    save_state(out_dir / f"{name}-step{global_step:08d}-state", epoch + 1, global_step)
                    if keep_state:
                        old = global_step - int(keep_state) - 1
                        old -= old % every
                        old_dir = out_dir / f"{name}-step{old:08d}-state"
                        if old > 0 and old_dir.is_dir():
                            log(f"removing old state: {old_dir}", where="train_util.py:5979")
                            shutil.rmtree(old_dir)
            bar.set_postfix(avr_loss=f"{sum(losses) / len(losses):.3g}")
            if global_step >= max_steps:
                break
        if global_step >= max_steps:
            break
    if config.get("save_state") or config.get("save_state_on_train_end"):
        log("saving last state.", where="train_util.py:5990")
        save_state(out_dir / f"{name}-state", epochs, global_step)
    final = out_dir / f"{name}{ext}"
    print(f"\nsaving checkpoint: {final}", flush=True)
    save_model(final, global_step)
    log("model saved.", where="train_network.py:1729")
    bar.close()
