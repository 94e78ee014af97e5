"""Checks before `kohya-tuner run` launches anything.

A run that dies after an hour because the disk filled, the host ran out of RAM
while loading FLUX, or the trainer's environment lacks bitsandbytes wastes more
than an OOM does. `evaluate()` is pure: it takes what was measured (`Facts`) and
returns the checks and any config changes (xformers → sdpa, 8-bit AdamW →
Adafactor when the library is missing). `gather()` measures: NVML, psutil, the
disk, the sd-scripts checkout, the trainer's Python.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from kohya_tuner.families import Family
from kohya_tuner.gpu import GpuInfo

GIB = 1024**3
ADAFACTOR_ARGS = ["relative_step=False", "scale_parameter=False", "warmup_init=False"]

# What a run on the CPU (`--cpu`) cannot execute: (key, the value it applies to, or None for any
# value that is set and not false, the value the CPU runs instead, or None to leave the key out,
# why). 8-bit optimizers are not here: the trainer's environment decides (`evaluate`).
CPU_SWITCHES: tuple[tuple[str, Any, Any, str], ...] = (
    ("mixed_precision", "fp16", "bf16", "accelerate refuses fp16 on the CPU."),
    ("full_fp16", None, None, "full_fp16 trains in fp16, which accelerate refuses on the CPU."),
    ("fp8_base", None, None, "fp8 weights are a GPU storage format; the CPU trains the base in its own precision."),
    ("fp8_base_unet", None, None, "fp8 weights are a GPU storage format."),
    ("fp8_scaled", None, None, "fp8 weights are a GPU storage format."),
    ("fp8_vl", None, None, "fp8 weights are a GPU storage format."),
    ("blocks_to_swap", None, None, "block swap moves blocks between GPU and host memory with CUDA streams; on the "
                                   "CPU every block is in host memory already."),
    ("cpu_offload_checkpointing", None, None, "it moves checkpointed activations back with .cuda() (FLUX at the "
                                              "pin: flux_models.py:487), which fails without CUDA; on the CPU "
                                              "they are in host memory already."),
)


def cpu_switches(config: Mapping[str, Any]) -> list[tuple[str, Any, Any, str]]:
    """(key, old, new, why) for each setting of `config` a CPU run cannot execute; new None
    means the key is left out. Pure: the caller applies them and says so."""
    out = []
    for key, when, new, why in CPU_SWITCHES:
        old = config.get(key)
        if old is None or old is False or old == 0:
            continue
        if when is None or old == when:
            out.append((key, old, new, why))
    return out


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok, warn, fail
    message: str
    hint: str | None = None


@dataclass
class Facts:
    """Everything measured about the machine, as plain values."""

    gpus: list[GpuInfo] = field(default_factory=list)
    nvml_reason: str | None = None
    ram_available_gib: float | None = None
    swap_free_gib: float | None = None
    disk_free_gib: float | None = None
    checkout_path: str | None = None
    checkout_scripts: tuple[str, ...] = ()
    pin_matches: bool | None = None
    pin_differences: tuple[str, ...] = ()
    pin_commit: str | None = None
    pin_unchecked: bool = False
    # The pinned commit itself, with these work-tree files changed (git status).
    pin_at_commit: bool = False
    pin_local_changes: tuple[str, ...] = ()
    pin_changes_unknown: str = ""
    python: str = ""
    python_probe: dict[str, Any] = field(default_factory=dict)
    own_pids: frozenset[int] = frozenset()


@dataclass
class Report:
    checks: list[Check]
    changes: list[tuple[str, Any, Any, str]]  # key, old, new, why

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == "warn"]


def host_ram_need_gib(config: Mapping[str, Any], family: Family, num_processes: int = 1) -> float:
    """RAM the run needs on the host. sd-scripts reads every model file into RAM before
    moving it to the GPU (FLUX: the DiT, T5 and CLIP together), casts fp8 on the CPU, keeps
    swapped blocks in RAM, and each data-loader worker is a Python process of its own."""
    half = str(config.get("mixed_precision") or "no") in ("fp16", "bf16")
    load_bytes = 2 if half else 4
    weights = sum(c.params for c in family.components) * load_bytes / GIB
    swap = int(config.get("blocks_to_swap") or 0)
    swapped = 0.0
    if swap and family.blocks_to_swap_max:
        per_block = family.diffusion.params / (family.blocks_to_swap_max + 22)
        swapped = swap * per_block * (1 if config.get("fp8_base") or config.get("fp8_base_unet") else load_bytes) / GIB
    workers = config.get("max_data_loader_n_workers")
    workers = 8 if workers is None else int(workers)
    # Processes load one after another, so the peak is one copy plus what each keeps.
    per_process = 2.5 + 0.4 * workers + swapped
    if config.get("lowram"):
        weights *= 0.5
    return round(weights + per_process * max(1, num_processes), 2)


def disk_need_gib(config: Mapping[str, Any], lora_params: int, total_steps: int, images: int = 0,
                  family: Family | None = None) -> float:
    """Disk for LoRA files, resumable states and on-disk caches over the whole run."""
    lora_file = lora_params * 2 / GIB  # saved in half precision
    state = lora_params * (4 + 8) / GIB  # fp32 weights + two optimizer moments
    every = int(config.get("save_every_n_steps") or total_steps or 1)
    saves = max(1, total_steps // max(1, every)) + 1
    if config.get("save_last_n_steps"):
        saves = min(saves, int(config["save_last_n_steps"]) // max(1, every) + 2)
    keep_states = 2
    if config.get("save_last_n_steps_state"):
        keep_states = int(config["save_last_n_steps_state"]) // max(1, every) + 2
    caches = 0.0
    if images and config.get("cache_latents_to_disk"):
        caches += images * 0.004
    if images and config.get("cache_text_encoder_outputs_to_disk") and family is not None and family.name == "flux":
        caches += images * 0.008
    return round(lora_file * saves + state * keep_states + caches + 0.5, 2)


# Where the checkout goes in a dry run's command when there is none yet.
PLACEHOLDER = "SD_SCRIPTS_DIR"


def _command(argv: list[str]) -> str:
    from kohya_tuner.run.launcher import format_command

    return format_command([str(a) for a in argv])


def evaluate(config: Mapping[str, Any], family: Family, facts: Facts, *, gpu_index: int = 0,
             gpu_ids: tuple[int, ...] = (), num_processes: int = 1, predicted_gib: float | None = None,
             lora_params: int = 0, total_steps: int = 0, images: int = 0, strict: bool = False,
             strict_pin: bool = False, cpu: bool = False, dry_run: bool = False) -> Report:
    checks: list[Check] = []
    changes: list[tuple[str, Any, Any, str]] = []

    # GPU
    wanted = list(gpu_ids) or [gpu_index]
    if cpu:
        checks.append(Check("gpu", "ok", "CPU run (--cpu): the GPU is not used"))
    elif not facts.gpus:
        checks.append(Check("gpu", "warn",
                            f"NVML finds no GPU ({facts.nvml_reason or 'no devices'}); going on: the trainer "
                            "runs on whatever accelerate finds, and VRAM is not measured"))
    else:
        by_index = {g.index: g for g in facts.gpus}
        for idx in wanted:
            card = by_index.get(idx)
            if card is None:
                checks.append(Check("gpu", "fail", f"there is no GPU {idx}; NVML sees {len(facts.gpus)}",
                                    "Pick another with --gpus."))
                continue
            others = [p for p in card.processes if p.pid not in facts.own_pids]
            held = sum(p.used_gib or 0.0 for p in others)
            if others:
                names = ", ".join(f"{p.name} (pid {p.pid}, {p.used_gib or 0:.1f} GiB)" for p in others)
                checks.append(Check("gpu-processes", "fail" if strict else "warn",
                                    f"other processes hold memory on GPU {idx}: {names}",
                                    "Close them, or run without --strict to go on with less memory."))
            if predicted_gib is not None and card.free_gib < predicted_gib:
                checks.append(Check("gpu-free", "warn",
                                    f"GPU {idx} has {card.free_gib:.1f} GiB free; the plan is predicted to peak at "
                                    f"{predicted_gib:.1f} GiB" + (f" ({held:.1f} GiB held by others)" if held else "")))
            else:
                checks.append(Check("gpu", "ok", f"GPU {idx}: {card.name}, {card.free_gib:.1f} of "
                                                 f"{card.total_gib:.1f} GiB free"))

    # host RAM
    need = host_ram_need_gib(config, family, num_processes)
    if facts.ram_available_gib is not None:
        swap = facts.swap_free_gib or 0.0
        if need > facts.ram_available_gib + swap:
            checks.append(Check("ram", "warn",
                                f"the run needs about {need:.0f} GiB of host RAM while loading; {facts.ram_available_gib:.0f} "
                                f"GiB is available and {swap:.0f} GiB of swap: the kernel may kill the trainer",
                                "Close programs, add swap, or set max_data_loader_n_workers=0; run retries with "
                                "RAM-saving settings if it is killed."))
        elif need > facts.ram_available_gib:
            checks.append(Check("ram", "warn", f"about {need:.0f} GiB of host RAM needed, {facts.ram_available_gib:.0f} "
                                               f"GiB available: loading will lean on swap ({swap:.0f} GiB free) and be slow"))
        else:
            checks.append(Check("ram", "ok", f"host RAM: about {need:.0f} GiB needed, "
                                             f"{facts.ram_available_gib:.0f} GiB available"))

    # disk
    disk = disk_need_gib(config, lora_params, total_steps, images, family)
    if facts.disk_free_gib is not None:
        if facts.disk_free_gib < disk:
            checks.append(Check("disk", "fail", f"the output folder's disk has {facts.disk_free_gib:.1f} GiB free; "
                                                f"LoRA files, states and caches need about {disk:.1f} GiB",
                                "Free some space, choose another --out, or lower save_every_n_steps' frequency."))
        elif facts.disk_free_gib < 2 * disk:
            checks.append(Check("disk", "warn", f"{facts.disk_free_gib:.1f} GiB free on the output disk; the run "
                                                f"writes about {disk:.1f} GiB"))
        else:
            checks.append(Check("disk", "ok", f"disk: about {disk:.1f} GiB needed, {facts.disk_free_gib:.0f} GiB free"))

    # sd-scripts
    if facts.checkout_path is None and dry_run:
        # A dry run only plans: the command is printed with a placeholder where the checkout goes.
        checks.append(Check("sd-scripts", "warn", f"no sd-scripts checkout found: the command names {PLACEHOLDER} "
                            "where it goes",
                            "Run `kohya-tuner setup` (or pass --sd-scripts PATH) before training."))
    elif facts.checkout_path is None:
        checks.append(Check("sd-scripts", "fail", "no sd-scripts checkout found",
                            "Run `kohya-tuner setup` to clone the pinned release, or pass --sd-scripts PATH."))
    elif family.script not in facts.checkout_scripts:
        checks.append(Check("sd-scripts", "fail", f"{facts.checkout_path} has no {family.script}",
                            "FLUX.1 needs sd-scripts 0.10 or later; run `kohya-tuner setup`."))
    elif facts.pin_matches:
        checks.append(Check("sd-scripts", "ok", f"sd-scripts at {facts.checkout_path} is the pinned commit"))
    elif facts.pin_at_commit:
        # The commit is the pin; only the work tree differs. Edits that change the argument set
        # (or delete an entry script) are named, but the commit is not called another one.
        n = len(facts.pin_local_changes)
        shown = ", ".join(facts.pin_local_changes[:4]) + (f" (+{n - 4} more)" if n > 4 else "")
        diffs = "; ".join(facts.pin_differences[:4])
        more = f" (+{len(facts.pin_differences) - 4} more)" if len(facts.pin_differences) > 4 else ""
        edits = (f"with local changes to {n} file{'s' if n != 1 else ''}" + (f": {shown}" if shown else "")
                 if not facts.pin_changes_unknown else
                 f"but its files could not be compared with the commit ({facts.pin_changes_unknown})")
        checks.append(Check("sd-scripts", "fail" if strict_pin else "warn",
                            f"sd-scripts at {facts.checkout_path} is the pinned commit {edits}"
                            + (f"; its arguments differ from the pin's: {diffs}{more}" if diffs
                               else "; its arguments match the pin's" if facts.pin_changes_unknown else ""),
                            "Going on; --strict-pin refuses this, `git -C <checkout> stash` (or checkout --) puts the "
                            "files back." if not facts.pin_changes_unknown else
                            "Going on; --strict-pin refuses this until git can read the checkout (for a folder "
                            "another user owns: `git config --global --add safe.directory <checkout>`)."))
    else:
        what = f"commit {facts.pin_commit[:10]}" if facts.pin_commit else "not a git checkout"
        diffs = "; ".join(facts.pin_differences[:4]) or (
            "its arguments could not be read" if facts.pin_unchecked else "its arguments match the pin")
        more = f" (+{len(facts.pin_differences) - 4} more)" if len(facts.pin_differences) > 4 else ""
        checks.append(Check("sd-scripts", "fail" if strict_pin else "warn",
                            f"sd-scripts at {facts.checkout_path} is not the pinned commit ({what}): {diffs}{more}",
                            "Going on; --strict-pin refuses this, `kohya-tuner setup` moves to the pin."))

    # the trainer's Python
    probe = facts.python_probe or {}
    mods = probe.get("modules") or {}
    if probe.get("error"):
        checks.append(Check("python", "fail", f"cannot use the trainer's Python: {probe['error']}",
                            "Pass --python with the interpreter of the environment sd-scripts is installed in "
                            "(a kohya_ss install has its own venv)."))
    else:
        missing = [m for m in ("torch", "accelerate") if not mods.get(m)]
        if missing:
            checks.append(Check("python", "fail", f"{facts.python} lacks {', '.join(missing)}",
                                f"Install them: {_command([facts.python, '-m', 'pip', 'install', *missing])} (for CUDA, torch "
                                "from https://pytorch.org/get-started/locally/), or pass --python of sd-scripts' venv."))
        elif facts.gpus and not cpu and probe.get("cuda") is False:
            build = "a CPU-only build" if not probe.get("torch_cuda") else f"built for CUDA {probe['torch_cuda']}"
            checks.append(Check("python", "fail",
                                f"the GPU is there, but torch {mods.get('torch')} in {facts.python} cannot use it "
                                f"({build}); training would run on the CPU",
                                "Install a CUDA build of torch (https://pytorch.org/get-started/locally/) in that "
                                "environment, or pass --python of the environment that has one."))
        else:
            checks.append(Check("python", "ok", f"{facts.python}: torch {mods.get('torch')}, "
                                                f"accelerate {mods.get('accelerate')}"
                                + (", CUDA available" if probe.get("cuda") else "")))
        changes += environment_changes(config, family, mods, python=facts.python)
    for key, old, new, why in changes:
        checks.append(Check("config", "warn", f"{key}: {old!r} → {new!r}: {why}"))
    return Report(checks=checks, changes=changes)


def environment_changes(config: Mapping[str, Any], family: Family, modules: Mapping[str, Any], *,
                        python: str = "python") -> list[tuple[str, Any, Any, str]]:
    """Settings the trainer's environment cannot run, swapped for ones it can (xformers for
    SDPA, an 8-bit optimizer for Adafactor when bitsandbytes is missing): at pre-flight and
    for every setting a retry's move brings in. `modules` maps a module name to its version
    (falsy when it is missing)."""
    mods = modules
    changes: list[tuple[str, Any, Any, str]] = []
    if config.get("xformers") and not mods.get("xformers"):
        if family.attention_flags_apply:
            changes.append(("xformers", config.get("xformers"), None,
                            "xformers is not installed in the trainer's environment; PyTorch's SDPA instead "
                            "(about the same memory)"))
            changes.append(("sdpa", config.get("sdpa"), True, "replaces xformers"))
        else:
            changes.append(("xformers", config.get("xformers"), None, f"{family.label} ignores xformers"))
    opt = str(config.get("optimizer_type") or "")
    wants_bnb = "8bit" in opt.lower() or opt.lower().startswith("bitsandbytes.") or bool(config.get("use_8bit_adam"))
    if wants_bnb and not mods.get("bitsandbytes"):
        changes.append(("optimizer_type", config.get("optimizer_type"), "Adafactor",
                        f"bitsandbytes is not installed in the trainer's environment, so {opt or 'AdamW8bit'} "
                        f"cannot run; Adafactor uses even less memory (or install it: {python} -m pip "
                        "install bitsandbytes)"))
        changes.append(("optimizer_args", config.get("optimizer_args"), list(ADAFACTOR_ARGS),
                        "Adafactor with a fixed learning rate, as sd-scripts' docs suggest"))
        if config.get("use_8bit_adam"):
            changes.append(("use_8bit_adam", True, None, "replaced by Adafactor"))
    return changes


def apply(config: Mapping[str, Any], report: Report) -> dict[str, Any]:
    out = dict(config)
    for key, _old, new, _why in report.changes:
        if new is None:
            out.pop(key, None)
        else:
            out[key] = new
    return out


def gather(*, out_dir: Path, python: str, sd_scripts: str | Path | None, cpu: bool = False) -> Facts:
    """Measure the machine. Never raises for a missing GPU; a --sd-scripts path that is
    not usable is the user's error (UserError from sdscripts.locate)."""
    import os

    import psutil

    from kohya_tuner import gpu, sdscripts
    from kohya_tuner.run.launcher import probe_modules

    facts = Facts(python=python, own_pids=frozenset({os.getpid()}))
    if not cpu:
        facts.gpus = gpu.list_gpus()
        facts.nvml_reason = gpu.nvml_status()
    vm = psutil.virtual_memory()
    facts.ram_available_gib = vm.available / GIB
    try:
        facts.swap_free_gib = psutil.swap_memory().free / GIB
    except Exception:
        facts.swap_free_gib = 0.0
    p = Path(out_dir)
    while not p.exists() and p.parent != p:
        p = p.parent
    try:
        facts.disk_free_gib = shutil.disk_usage(p).free / GIB
    except OSError:
        facts.disk_free_gib = None
    checkout = sdscripts.locate(sd_scripts)
    if checkout is not None:
        facts.checkout_path = str(checkout.path)
        facts.checkout_scripts = tuple(checkout.scripts)
        pin = sdscripts.verify(checkout)
        facts.pin_matches = pin.matches
        facts.pin_differences = tuple(pin.differences) + tuple(f"missing {s}" for s in pin.missing_scripts)
        facts.pin_commit = pin.commit
        facts.pin_unchecked = bool(pin.unchecked)
        facts.pin_at_commit = pin.commit == pin.pinned_commit
        facts.pin_local_changes = tuple(pin.local_changes)
        facts.pin_changes_unknown = pin.changes_unknown
    found = probe_modules(python, ["torch", "accelerate", "xformers", "bitsandbytes"])
    facts.python_probe = dict(found)
    if facts.gpus and not found.get("error") and (found.get("modules") or {}).get("torch"):
        # Only with a GPU present does it matter whether torch can use it; finding out
        # imports torch and starts CUDA in a child, which takes seconds.
        from kohya_tuner.doctor import probe_python

        probe = probe_python(python, test_kernels=False)
        if probe.error is None:
            facts.python_probe["cuda"] = probe.cuda_available
            facts.python_probe["torch_cuda"] = probe.torch_cuda or probe.torch_hip
    return facts
