"""The environment checks: gather facts (impure), then judge them (pure).

Status means, for training with sd-scripts on this machine:
  pass - fine.
  warn - missing, not set up yet, or costs memory or speed; training may still work, or
         a later step (setup, install) provides it.
  fail - present but broken or wrong in a way that stops training or silently runs it
         on the CPU: fix before `run`.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from kohya_tuner.doctor.probe import DEFAULT_TIMEOUT, PythonProbe, probe_python, refuse_unusable_python
from kohya_tuner.families import FAMILIES, Family, get_family

Status = Literal["pass", "warn", "fail"]
GIB = 1024**3


@dataclass
class Check:
    name: str
    status: Status
    detail: str
    fix: str | None = None
    # Machine-readable facts behind the verdict (for --json and for `run`).
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DiskInfo:
    path: str
    free_gib: float
    total_gib: float


@dataclass
class Facts:
    """Everything the checks judge, gathered once."""

    gpus: list[Any] = field(default_factory=list)  # kohya_tuner.gpu.GpuInfo
    nvml_error: str | None = None
    cuda_visible_devices: str | None = None
    own_pid: int = 0
    ram_total_gib: float = 0.0
    ram_available_gib: float = 0.0
    swap_total_gib: float = 0.0
    disks: list[DiskInfo] = field(default_factory=list)
    os_name: str = ""
    probe: PythonProbe | None = None
    python_source: str = "this interpreter"
    sd_scripts: Any = None  # kohya_tuner.sdscripts.Checkout
    sd_scripts_error: str | None = None
    pin_report: Any = None  # kohya_tuner.sdscripts.PinReport
    requirement_pins: dict[str, str] = field(default_factory=dict)
    torch_min: str = "2.6.0"
    upstream_python: str = "3.10"
    alloc_conf: dict[str, str] = field(default_factory=dict)  # env var name -> value, for those set
    model: Family | None = None


# ---- gathering ------------------------------------------------------------------------


def _trainer_python(python: str | None, checkout: Any) -> tuple[str, str]:
    """The interpreter that will train, and how it was chosen: --python, else the install's own
    venv (sdscripts.install_python, the one `run` uses too), else this one."""
    if python:
        return python, "--python"
    if checkout is not None:
        from kohya_tuner.sdscripts import install_python

        found = install_python(checkout.path)
        if found is not None:
            # A broken venv is checked (and fails), never passed over for another interpreter.
            return str(found.path), f"{found.where} ({found.path})" + (f"; broken: {found.broken}" if found.broken
                                                                        else "")
    return sys.executable, "the one running kohya-tuner"


def _disk(path: Path) -> DiskInfo | None:
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None
    return DiskInfo(str(path), usage.free / GIB, usage.total / GIB)


def gather(sd_scripts: str | os.PathLike | None = None, python: str | None = None, model: str | None = None,
           timeout: float = DEFAULT_TIMEOUT) -> Facts:
    import psutil

    from kohya_tuner import gpu, sdscripts
    from kohya_tuner.errors import UserError
    from kohya_tuner.resources import user_data_dir

    facts = Facts(own_pid=os.getpid(), os_name=platform.system())
    facts.model = get_family(model) if model else None
    facts.gpus = gpu.list_gpus()
    facts.nvml_error = gpu.nvml_status()
    facts.cuda_visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    vm = psutil.virtual_memory()
    facts.ram_total_gib, facts.ram_available_gib = vm.total / GIB, vm.available / GIB
    try:
        facts.swap_total_gib = psutil.swap_memory().total / GIB
    except Exception:  # some containers hide swap accounting
        facts.swap_total_gib = 0.0
    if python:
        refuse_unusable_python(python)
    try:
        facts.sd_scripts = sdscripts.locate(sd_scripts)
    except UserError as exc:
        if sd_scripts is not None:
            raise  # a path the user just typed: bad input, not a finding
        facts.sd_scripts_error = exc.paragraph()
    if facts.sd_scripts is not None:
        try:
            facts.pin_report = sdscripts.verify(facts.sd_scripts)
        except UserError as exc:
            facts.sd_scripts_error = exc.paragraph()
    pins = sdscripts.pin()
    facts.requirement_pins = sdscripts.requirement_pins()
    facts.torch_min = str(pins.get("environment", {}).get("torch_min", facts.torch_min))
    facts.upstream_python = str(pins.get("environment", {}).get("python", facts.upstream_python))
    seen_devices: set[int] = set()
    for place in (Path.cwd(), user_data_dir(), Path(facts.sd_scripts.path) if facts.sd_scripts else None):
        if place is None:
            continue
        probe_at = place
        while not probe_at.exists() and probe_at.parent != probe_at:
            probe_at = probe_at.parent
        try:
            dev = probe_at.stat().st_dev
        except OSError:
            continue
        if dev in seen_devices:
            continue
        info = _disk(probe_at)
        if info:
            seen_devices.add(dev)
            facts.disks.append(info)
    facts.alloc_conf = {k: os.environ[k] for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") if k in os.environ}
    exe, source = _trainer_python(python, facts.sd_scripts)
    facts.python_source = source
    facts.probe = probe_python(exe, timeout=timeout, packages=sorted(facts.requirement_pins))
    return facts


def run_checks(sd_scripts: str | os.PathLike | None = None, python: str | None = None, model: str | None = None,
               timeout: float = DEFAULT_TIMEOUT) -> list[Check]:
    """Check the whole training environment. Never raises for what it finds; a bad
    --model or an --sd-scripts path that does not exist is a UserError."""
    return evaluate(gather(sd_scripts, python, model, timeout))


def exit_code(checks: list[Check]) -> int:
    """0 unless a check failed (1): something present is broken enough to stop training."""
    return 1 if any(c.status == "fail" for c in checks) else 0


# ---- judging --------------------------------------------------------------------------


def evaluate(f: Facts) -> list[Check]:
    checks: list[Check] = []
    checks += check_gpus(f)
    checks.append(check_ram(f))
    checks.append(check_disk(f))
    checks += check_python_env(f)
    checks += check_sd_scripts(f)
    checks.append(check_alloc_conf(f))
    return checks


def _vtuple(text: str | None) -> tuple[int, ...]:
    nums = re.findall(r"\d+", (text or "").split("+")[0])
    return tuple(int(n) for n in nums[:3])


def check_gpus(f: Facts) -> list[Check]:
    if not f.gpus:
        why = f.nvml_error or "the NVIDIA driver reports no GPU"
        extra = ""
        if f.cuda_visible_devices is not None and f.cuda_visible_devices.strip() in ("", "-1"):
            extra = f" CUDA_VISIBLE_DEVICES is set to {f.cuda_visible_devices!r}, which hides every GPU."
        return [Check("GPU", "warn", f"No NVIDIA GPU found: {why}.{extra}",
                      "Training needs an NVIDIA GPU with its driver installed. Without one kohya-tuner can still "
                      "write configs for another machine: `kohya-tuner config --gpu 12 ...`.",
                      {"gpus": [], "nvml": why})]
    driver = f.gpus[0].driver
    out = [Check("NVIDIA driver", "pass", f"driver {driver or 'unknown'}, {len(f.gpus)} GPU(s) through NVML",
                 data={"driver": driver, "count": len(f.gpus)})]
    for g in f.gpus:
        cc = f"{g.compute_capability[0]}.{g.compute_capability[1]}"
        detail = (f"GPU {g.index}: {g.name}, {g.total_gib:.1f} GiB ({g.free_gib:.1f} free), compute capability {cc}, "
                  f"bf16 {'yes' if g.bf16 else 'no (fp16 mixed precision instead)'}")
        status: Status = "pass"
        fix = None
        if g.compute_capability < (5, 0) and g.compute_capability != (0, 0):
            status, fix = "fail", "Current PyTorch CUDA builds have no kernels for this card; a newer GPU is needed."
        elif g.total_gib < 5.5:
            status, fix = "warn", "Below the 6 GB the presets start at; only SD 1.5 at low resolution may fit."
        out.append(Check(f"GPU {g.index}", status, detail, fix, {
            "name": g.name, "total_gib": round(g.total_gib, 2), "free_gib": round(g.free_gib, 2),
            "compute_capability": list(g.compute_capability), "bf16": g.bf16}))
    out.append(_gpu_processes(f))
    return out


def _gpu_processes(f: Facts) -> Check:
    holders = []
    unseen = []
    for g in f.gpus:
        others = [p for p in g.processes if p.pid != f.own_pid]
        for p in others:
            holders.append({"gpu": g.index, "pid": p.pid, "name": p.name,
                            "used_gib": None if p.used_gib is None else round(p.used_gib, 2)})
        # A container sees the card's memory in use but not the processes behind it.
        if not others and g.used_gib > 1.0:
            unseen.append((g.index, g.used_gib))
    big = [h for h in holders if (h["used_gib"] or 0) >= 0.25]
    pythons = [h for h in holders if "python" in h["name"].lower()]
    if not holders and not unseen:
        return Check("GPU memory users", "pass", "No other process holds GPU memory.", data={"processes": []})
    parts = [f"{h['name']} (pid {h['pid']}, GPU {h['gpu']}, "
             + (f"{h['used_gib']:.2f} GiB" if h["used_gib"] is not None else "size unknown") + ")" for h in holders]
    for index, used in unseen:
        parts.append(f"{used:.1f} GiB on GPU {index} held by processes not visible here")
    total = sum(h["used_gib"] or 0 for h in holders) + sum(u for _, u in unseen)
    status: Status = "warn" if (big or unseen or pythons) else "pass"
    fix = None
    if status == "warn":
        pids = " ".join(str(h["pid"]) for h in pythons)
        fix = ("Every GiB another program holds is a GiB training cannot use. Close them"
               + (f"; leftover Python processes from earlier runs can be ended with `kill {pids}`"
                  if pythons and os.name != "nt" else
                  "; end leftover Python processes in the Task Manager" if pythons else "")
               + ".")
    return Check("GPU memory users", status, f"{total:.2f} GiB held by: " + "; ".join(parts), fix,
                 {"processes": holders})


def ram_need_gib(family: Family) -> float:
    """Host RAM a LoRA run on `family` needs at least: the frozen weights pass through
    host memory in 16-bit while loading (FLUX's T5 and DiT together ~31 GiB), plus room
    for Python, CUDA context and data loading. A floor, not a comfortable amount."""
    weights = sum(c.params for c in family.components) * 2 / GIB
    return round(weights + 4.0, 1)


def check_ram(f: Facts) -> Check:
    total, swap = f.ram_total_gib, f.swap_total_gib
    needs = {name: ram_need_gib(fam) for name, fam in FAMILIES.items()}
    data = {"total_gib": round(total, 1), "available_gib": round(f.ram_available_gib, 1),
            "swap_gib": round(swap, 1), "needs_gib": needs}
    have = f"{total:.1f} GiB RAM ({f.ram_available_gib:.1f} available), {swap:.1f} GiB swap"
    if f.model is not None:
        need = needs[f.model.name]
        if total >= need:
            if f.ram_available_gib < need:
                return Check("Host RAM", "warn", f"{have}; {f.model.label} needs about {need:.0f} GiB and other "
                             "programs use part of it.", "Close memory-hungry programs before training.", data)
            return Check("Host RAM", "pass", f"{have}; enough for {f.model.label} (about {need:.0f} GiB).", data=data)
        if total + swap >= need:
            return Check("Host RAM", "warn", f"{have}; {f.model.label} needs about {need:.0f} GiB, so loading "
                         "will swap (slow).", _ram_fix(f.model), data)
        return Check("Host RAM", "fail", f"{have}; {f.model.label} needs about {need:.0f} GiB: the model will not "
                     "load (the system kills the process).", _ram_fix(f.model), data)
    fits = [FAMILIES[n].label for n, need in needs.items() if total + swap >= need]
    short = [(FAMILIES[n].label, need) for n, need in needs.items() if total + swap < need]
    if not short:
        return Check("Host RAM", "pass", f"{have}; enough for SD 1.5, SDXL and FLUX.1.", data=data)
    if not fits:
        return Check("Host RAM", "fail", f"{have}; even SD 1.5 needs about {needs['sd15']:.0f} GiB.",
                     "Add RAM or swap.", data)
    missing = ", ".join(f"{label} needs about {need:.0f} GiB" for label, need in short)
    return Check("Host RAM", "warn", f"{have}; enough for {', '.join(fits)}; {missing}.",
                 _ram_fix(get_family("flux")), data)


def _ram_fix(family: Family) -> str:
    if family.name == "flux":
        return ("Use fp8 checkpoints (DiT and T5-XXL) to halve what is loaded, add swap (1.5-2x RAM, on an SSD), or "
                "add RAM; 64 GB is comfortable for FLUX.1.")
    return "Add swap (1.5-2x RAM, on an SSD) or RAM, and close other programs while training."


def check_disk(f: Facts) -> Check:
    if not f.disks:
        return Check("Free disk", "warn", "Could not read free disk space.")
    worst = min(f.disks, key=lambda d: d.free_gib)
    where = "; ".join(f"{d.free_gib:.1f} GiB free at {d.path}" for d in f.disks)
    data = {"disks": [asdict(d) for d in f.disks]}
    if worst.free_gib < 5:
        return Check("Free disk", "fail", where, f"Free space on {worst.path}: saving a checkpoint or a latent cache "
                     "on a full disk fails the run.", data)
    if worst.free_gib < 30:
        return Check("Free disk", "warn", where, "Models (FLUX.1 alone ~34 GB), latent caches and saved states need "
                     "room; keep 30 GiB or more free where you train.", data)
    return Check("Free disk", "pass", where, data=data)


# ---- the trainer's Python -----------------------------------------------------------------

# Oldest NVIDIA driver (Linux, Windows) shipping each CUDA version (NVIDIA's CUDA toolkit
# release notes, "CUDA Toolkit and Corresponding Driver Versions").
_DRIVER_FOR_CUDA = {
    (11, 8): ((520, 61), (520, 6)), (12, 0): ((525, 60), (527, 41)), (12, 1): ((530, 30), (531, 14)),
    (12, 2): ((535, 54), (536, 25)), (12, 3): ((545, 23), (545, 84)), (12, 4): ((550, 54), (551, 61)),
    (12, 5): ((555, 42), (555, 85)), (12, 6): ((560, 28), (560, 76)), (12, 8): ((570, 26), (570, 65)),
    (12, 9): ((575, 51), (576, 2)), (13, 0): ((580, 65), (580, 88)),
}


def _driver_note(torch_cuda: str | None, driver: str, os_name: str) -> tuple[Status, str] | None:
    """How the driver compares with the CUDA version torch was built for."""
    cuda = _vtuple(torch_cuda)[:2]
    drv = _vtuple(driver)[:2]
    if len(cuda) < 2 or len(drv) < 2:
        return None
    col = 1 if os_name == "Windows" else 0
    exact = _DRIVER_FOR_CUDA.get(cuda)
    major_floor = _DRIVER_FOR_CUDA.get((cuda[0], 0))
    if major_floor and drv < major_floor[col]:
        need = ".".join(map(str, major_floor[col]))
        return "fail", f"driver {driver} is older than any CUDA {cuda[0]}.x needs ({need}); update the NVIDIA driver"
    if exact and drv < exact[col]:
        need = ".".join(map(str, exact[col]))
        return "warn", (f"driver {driver} predates CUDA {torch_cuda} (needs {need}); it runs through CUDA's "
                        "minor-version compatibility, but updating the driver avoids PTX/JIT errors")
    return None


def check_python_env(f: Facts) -> list[Check]:
    p = f.probe
    if p is None:
        return []
    if not p.ran:
        return [Check("Trainer Python", "fail", f"{p.error} (chosen: {f.python_source}).",
                      "Pass the Python of the environment that runs sd-scripts with --python.",
                      {"python": p.python})]
    out: list[Check] = []
    ver = _vtuple(p.python_version)
    detail = f"Python {p.python_version} at {p.executable} ({f.python_source})"
    up = _vtuple(f.upstream_python)
    if ver < (3, 10):
        out.append(Check("Trainer Python", "fail", detail + "; sd-scripts needs 3.10 or newer.",
                         f"Create the trainer venv with Python {f.upstream_python}.", {"version": p.python_version}))
    elif ver >= (3, 13):
        out.append(Check("Trainer Python", "warn", detail + f"; sd-scripts is tested on {f.upstream_python}, and "
                         "xformers/bitsandbytes wheels may be missing for this version.",
                         f"A Python {f.upstream_python}-3.12 venv is the safe choice.", {"version": p.python_version}))
    else:
        note = "" if ver[:2] == up[:2] else f" (sd-scripts is tested on {f.upstream_python}; 3.11/3.12 work)"
        out.append(Check("Trainer Python", "pass", detail + note, data={"version": p.python_version}))
    out.append(_torch_check(f, p))
    out.append(_cuda_check(f, p))
    out.append(_accelerate_check(f, p))
    out.append(_xformers_check(p))
    out.append(_bnb_check(f, p))
    return [c for c in out if c is not None]


def _install_torch_hint(f: Facts) -> str:
    return (f"In the trainer's environment: pip install \"torch>={f.torch_min}\" torchvision --index-url "
            "https://download.pytorch.org/whl/cu128 (pick the CUDA build your driver supports).")


def _torch_check(f: Facts, p: PythonProbe) -> Check:
    if "torch" in p.errors:
        return Check("torch", "fail", f"torch is installed but fails to import: {p.errors['torch']}",
                     "Reinstall torch in the trainer's environment. " + _install_torch_hint(f),
                     {"error": p.errors["torch"]})
    if not p.torch:
        return Check("torch", "warn", f"torch is not installed in {p.executable}.", _install_torch_hint(f),
                     {"version": None})
    if _vtuple(p.torch) < _vtuple(f.torch_min):
        return Check("torch", "warn", f"torch {p.torch}; sd-scripts at the pin requires {f.torch_min} or newer.",
                     _install_torch_hint(f), {"version": p.torch})
    return Check("torch", "pass", f"torch {p.torch}", data={"version": p.torch})


def _cuda_check(f: Facts, p: PythonProbe) -> Check | None:
    if not p.torch or "torch" in p.errors:
        return None
    data = {"torch_cuda": p.torch_cuda, "cuda_available": p.cuda_available, "devices": p.devices}
    have_gpu = bool(f.gpus)
    why = p.notes.get("cuda", "").strip()
    if p.torch_hip:
        return Check("torch CUDA", "warn", f"torch {p.torch} is a ROCm (AMD) build (HIP {p.torch_hip}).",
                     "kohya-tuner's memory model and NVML readings are for NVIDIA cards.", data)
    if not p.torch_cuda:
        if have_gpu:
            return Check("torch CUDA", "fail", f"torch {p.torch} is a CPU-only build: training would not use the "
                         "GPU.", _install_torch_hint(f), data)
        return Check("torch CUDA", "warn", f"torch {p.torch} is a CPU-only build and there is no GPU.",
                     "Install a CUDA build of torch on the machine with the GPU.", data)
    if not p.cuda_available:
        if have_gpu:
            reason = f": {why}" if why else ""
            return Check("torch CUDA", "fail", f"torch {p.torch} (CUDA {p.torch_cuda}) cannot use the GPU{reason}",
                         "Usually the driver is older than torch's CUDA build: update the NVIDIA driver, or install "
                         "torch built for an older CUDA.", data)
        return Check("torch CUDA", "warn", f"torch {p.torch} is built for CUDA {p.torch_cuda}, but no GPU is visible.",
                     None, data)
    missing = []
    for d in p.devices:
        cap = d.get("capability") or [0, 0]
        sm = f"sm_{cap[0]}{cap[1]}"
        ptx_ok = any(a.startswith("compute_") and _vtuple(a) <= (cap[0] * 10 + cap[1],) for a in p.arch_list)
        if p.arch_list and sm not in p.arch_list and not ptx_ok:
            missing.append(f"{d.get('name')} ({sm})")
    if missing:
        return Check("torch CUDA", "fail", f"torch {p.torch} has no kernels for {', '.join(missing)}; it was built "
                     f"for {' '.join(p.arch_list)}.", "Install a newer torch (RTX 50-series needs a CUDA 12.8 build, "
                     "torch 2.7 or newer).", data)
    detail = f"torch {p.torch} built for CUDA {p.torch_cuda} sees {len(p.devices)} GPU(s)"
    if have_gpu:
        note = _driver_note(p.torch_cuda, f.gpus[0].driver, f.os_name)
        if note:
            return Check("torch CUDA", note[0], detail + f"; {note[1]}.", None, data)
    return Check("torch CUDA", "pass", detail + ".", data=data)


def _accelerate_check(f: Facts, p: PythonProbe) -> Check:
    pin = f.requirement_pins.get("accelerate")
    if "accelerate" in p.errors:
        return Check("accelerate", "fail", f"accelerate is installed but fails to import: {p.errors['accelerate']}",
                     f"pip install accelerate=={pin or '1.6.0'} in the trainer's environment.")
    if not p.accelerate:
        return Check("accelerate", "warn", f"accelerate is not installed in {p.executable}; `run` launches through "
                     "`accelerate launch`.", "Install sd-scripts' requirements (`kohya-tuner setup` prints the "
                     "command).")
    cfg = p.accelerate_config
    data = {"version": p.accelerate, "config_path": p.accelerate_config_path, "config": cfg}
    version_note = f" (sd-scripts pins {pin})" if pin and p.accelerate != pin else ""
    if cfg is None:
        return Check("accelerate", "pass", f"accelerate {p.accelerate}{version_note}; no default config file, and "
                     "none is needed: kohya-tuner passes the launch options itself.", data=data)
    problems = []
    if cfg.get("use_cpu"):
        problems.append("use_cpu: true makes accelerate run training on the CPU")
    dist = str(cfg.get("distributed_type", "NO")).upper()
    if dist in ("DEEPSPEED", "FSDP", "MEGATRON_LM", "XLA", "TPU"):
        problems.append(f"distributed_type {dist} is not what sd-scripts LoRA training expects")
    if "gpu_ids" in cfg and str(cfg.get("gpu_ids")).lower() not in ("all", "none", ""):
        problems.append(f"gpu_ids {cfg.get('gpu_ids')} restricts which GPUs are used")
    where = p.accelerate_config_path or "its default config"
    if problems:
        status: Status = "fail" if cfg.get("use_cpu") else "warn"
        return Check("accelerate", status, f"accelerate {p.accelerate}{version_note}; {where}: " + "; ".join(problems)
                     + ".", f"Edit or delete {where} (or run `accelerate config` again and answer 'This machine', "
                     "'No distributed training').", data)
    return Check("accelerate", "pass", f"accelerate {p.accelerate}{version_note}; default config {where} is "
                 "harmless (kohya-tuner passes the launch options itself).", data=data)


def _xformers_check(p: PythonProbe) -> Check:
    if "xformers" in p.errors and not p.xformers:
        return Check("xformers", "warn", f"xformers is installed but fails to import: {p.errors['xformers']}",
                     "Uninstall it or install the build for your torch; presets use SDPA, so it is not needed.")
    if not p.xformers:
        return Check("xformers", "pass", "xformers not installed (optional: the presets use PyTorch's SDPA).")
    data = {"version": p.xformers, "built_for": p.xformers_built_for, "cpp": p.xformers_cpp}
    built = p.xformers_built_for or {}
    mismatch = built.get("torch") and p.torch and _vtuple(built["torch"])[:2] != _vtuple(p.torch)[:2]
    if p.xformers_cpp is False or mismatch or "xformers" in p.errors:
        what = (f"built for torch {built.get('torch')}, you have {p.torch}" if mismatch else
                p.errors.get("xformers") or "its compiled kernels do not load")
        return Check("xformers", "warn", f"xformers {p.xformers}: {what}. A config with xformers = true would fail.",
                     "`pip install xformers` matching your torch (or uninstall it; the presets use SDPA).", data)
    ran = " and ran on the GPU" if p.xformers_ran else ""
    return Check("xformers", "pass", f"xformers {p.xformers} loads{ran}.", data=data)


def _bnb_check(f: Facts, p: PythonProbe) -> Check:
    data = {"version": p.bitsandbytes, "ran": p.bitsandbytes_ran}
    if "bitsandbytes" in p.errors:
        # Without a usable GPU the failure may be nothing but the missing GPU.
        status: Status = "fail" if p.cuda_available else "warn"
        return Check("bitsandbytes", status, f"bitsandbytes{' ' + p.bitsandbytes if p.bitsandbytes else ''} fails: "
                     f"{p.errors['bitsandbytes']}. 8-bit optimizers (AdamW8bit, used by low-VRAM presets) would "
                     "crash.", "pip install -U bitsandbytes in the trainer's environment (a release with kernels for "
                     "your card and CUDA).", data)
    if not p.bitsandbytes:
        return Check("bitsandbytes", "warn", "bitsandbytes is not installed: no 8-bit optimizers (AdamW8bit), which "
                     "the low-VRAM presets use.", "pip install bitsandbytes in the trainer's environment.", data)
    if p.bitsandbytes_ran:
        return Check("bitsandbytes", "pass", f"bitsandbytes {p.bitsandbytes}: an 8-bit AdamW step ran on the GPU.",
                     data=data)
    return Check("bitsandbytes", "warn", f"bitsandbytes {p.bitsandbytes} imports, but its GPU kernels could not be "
                 "tried without a usable GPU.", None, data)


# ---- sd-scripts and allocator ---------------------------------------------------------------


def check_sd_scripts(f: Facts) -> list[Check]:
    if f.sd_scripts_error:
        return [Check("sd-scripts", "fail", f.sd_scripts_error), _requirements_check(f)]
    if f.sd_scripts is None:
        return [Check("sd-scripts", "warn", "No sd-scripts checkout found (--sd-scripts, $KOHYA_SD_SCRIPTS or the "
                      "one `kohya-tuner setup` clones).", "Run `kohya-tuner setup` to clone the pinned release, or "
                      "point at yours with --sd-scripts PATH."), _requirements_check(f)]
    r = f.pin_report
    data = r.to_dict() if r is not None else {}
    out: list[Check] = []
    if r is None:
        out.append(Check("sd-scripts", "warn", f"found at {f.sd_scripts.path}, not verified."))
    elif r.missing_scripts:
        out.append(Check("sd-scripts", "fail", f"{r.path} lacks {', '.join(r.missing_scripts)}.",
                         "Point at a complete sd-scripts checkout, or run `kohya-tuner setup`.", data))
    elif r.matches:
        out.append(Check("sd-scripts", "pass", f"{r.path} at the pinned commit {r.pinned_commit[:12]}.", data=data))
    else:
        reasons = []
        if r.commit != r.pinned_commit:
            reasons.append(f"commit {r.commit[:12] if r.commit else 'unknown'} (pinned {r.pinned_commit[:12]})")
        if r.local_changes:
            reasons.append(f"local changes in {len(r.local_changes)} file(s)")
        if r.changes_unknown:
            reasons.append(f"its files could not be compared with the commit ({r.changes_unknown})")
        if r.differences:
            reasons.append(f"{len(r.differences)} argument difference(s) from the pin")
        out.append(Check("sd-scripts", "warn", f"{r.path}: " + "; ".join(reasons) + ".",
                         "kohya-tuner validates configs against the pinned arguments; `kohya-tuner setup` shows the "
                         "differences, or moves its own checkout to the pin.", data))
    out.append(_requirements_check(f))
    return out


def _requirements_check(f: Facts) -> Check:
    p = f.probe
    if p is None or not p.ran:
        return Check("sd-scripts requirements", "warn", "Not checked: the trainer's Python could not be examined.")
    missing, different = [], []
    for name, pin in sorted(f.requirement_pins.items()):
        have = p.packages.get(name)
        if have is None:
            missing.append(name)
        elif pin and have != pin:
            different.append(f"{name} {have} (pinned {pin})")
    data = {"missing": missing, "different": different}
    if missing:
        return Check("sd-scripts requirements", "warn", f"{len(missing)} of {len(f.requirement_pins)} not installed in "
                     f"{p.executable}: {', '.join(missing)}.", "Install them from inside the checkout: "
                     "`pip install -r requirements.txt` (`kohya-tuner setup --install-requirements` does it).", data)
    if different:
        return Check("sd-scripts requirements", "warn", "Installed at other versions than pinned: "
                     + ", ".join(different) + ".", "`pip install -r requirements.txt` in the checkout restores the "
                     "tested versions.", data)
    return Check("sd-scripts requirements", "pass", f"All {len(f.requirement_pins)} pinned packages are installed at "
                 "their pinned versions.", data=data)


# Options the CUDA caching allocator understands (torch 2.6-2.9); newer torch adds some,
# so an unknown key is a warning, while a malformed entry stops every CUDA allocation.
_ALLOC_KEYS = {
    "max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold", "roundup_power2_divisions",
    "expandable_segments", "release_lock_on_cudamalloc", "pinned_use_cuda_host_register", "pinned_num_register_threads",
    "pinned_use_background_threads", "backend", "per_process_memory_fraction", "graph_capture_record_stream_reuse",
    "pinned_reserve_segment_size_mb",
}


def check_alloc_conf(f: Facts) -> Check:
    if not f.alloc_conf:
        windows = " (expandable segments are Linux-only; on Windows PyTorch ignores the setting)" \
            if f.os_name == "Windows" else ""
        return Check("PYTORCH_CUDA_ALLOC_CONF", "pass", "Not set; `kohya-tuner run` sets "
                     f"expandable_segments:True for its runs, which avoids OOM from fragmentation{windows}.",
                     "For runs you start by hand: export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                     {"value": None})
    name, value = next(iter(f.alloc_conf.items()))
    data = {"variable": name, "value": value}
    options: dict[str, str] = {}
    malformed = []
    for part in [x.strip() for x in value.split(",") if x.strip()]:
        if ":" not in part:
            malformed.append(part)
            continue
        k, v = part.split(":", 1)
        options[k.strip()] = v.strip()
    if malformed:
        return Check("PYTORCH_CUDA_ALLOC_CONF", "fail", f"{name}={value!r}: {', '.join(malformed)} is not key:value; "
                     "PyTorch refuses to allocate GPU memory with it.",
                     f"Fix or unset it, e.g. export {name}=expandable_segments:True", data)
    unknown = [k for k in options if k not in _ALLOC_KEYS]
    if unknown:
        return Check("PYTORCH_CUDA_ALLOC_CONF", "warn", f"{name}={value!r}: unknown option(s) {', '.join(unknown)}; "
                     "PyTorch stops at the first CUDA allocation on an option it does not know.",
                     "Check the spelling against your torch version's documentation.", data)
    if options.get("expandable_segments", "").lower() == "true":
        return Check("PYTORCH_CUDA_ALLOC_CONF", "pass", f"{name}={value} (expandable segments against "
                     "fragmentation).", data=data)
    return Check("PYTORCH_CUDA_ALLOC_CONF", "warn", f"{name}={value}: `run` keeps your value, so expandable segments "
                 "stay off and fragmentation can cause OOM with memory free.",
                 f"Add expandable_segments:True to {name}.", data)
