"""What stays fixed across the attempts of a run (run.json) and how one is launched."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from kohya_tuner.families import Family
from kohya_tuner.run.policy import BOOKKEEPING, DEFAULT_HANG_MINUTES, DEFAULT_MAX_ATTEMPTS


@dataclass
class RunSettings:
    """Everything the loop needs that does not change between attempts (run.json)."""

    out_dir: Path
    family: Family
    script: Path
    dataset_file: Path | None
    plan_config: dict[str, Any]
    total_steps: int
    python: str
    num_processes: int = 1
    gpu_ids: tuple[int, ...] = ()
    gpu_index: int = 0
    accelerate_config: Path | None = None
    cpu: bool = False
    emulate_vram_gb: float | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    hang_minutes: float = DEFAULT_HANG_MINUTES
    probe_steps: int | None = None
    policy: str = "default"
    gpu: dict[str, Any] | None = None
    predicted_gib: float | None = None
    dataset: dict[str, Any] | None = None
    model: str = ""
    job: str = ""
    # Keys the user set (--set, --preset): the ladder moves them last.
    user_keys: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1, "model": self.model or self.family.name, "family": self.family.name, "job": self.job,
            "script": str(self.script), "dataset_file": str(self.dataset_file) if self.dataset_file else None,
            "plan_config": self.plan_config, "total_steps": self.total_steps, "python": self.python,
            "num_processes": self.num_processes, "gpu_ids": list(self.gpu_ids), "gpu_index": self.gpu_index,
            "accelerate_config": str(self.accelerate_config) if self.accelerate_config else None, "cpu": self.cpu,
            "emulate_vram_gb": self.emulate_vram_gb, "max_attempts": self.max_attempts,
            "hang_minutes": self.hang_minutes, "probe_steps": self.probe_steps, "policy": self.policy,
            "gpu": self.gpu, "predicted_gib": self.predicted_gib, "dataset": self.dataset,
            "user_keys": list(self.user_keys),
        }

    @classmethod
    def from_json(cls, out_dir: Path, data: dict[str, Any]) -> "RunSettings":
        from kohya_tuner.families import get_family

        return cls(
            out_dir=out_dir, family=get_family(data["family"]), script=Path(data["script"]),
            dataset_file=Path(data["dataset_file"]) if data.get("dataset_file") else None,
            plan_config=data["plan_config"], total_steps=int(data["total_steps"]), python=data["python"],
            num_processes=int(data.get("num_processes") or 1), gpu_ids=tuple(data.get("gpu_ids") or ()),
            gpu_index=int(data.get("gpu_index") or 0),
            accelerate_config=Path(data["accelerate_config"]) if data.get("accelerate_config") else None,
            cpu=bool(data.get("cpu")), emulate_vram_gb=data.get("emulate_vram_gb"),
            max_attempts=int(data.get("max_attempts") or DEFAULT_MAX_ATTEMPTS),
            hang_minutes=float(data.get("hang_minutes") or DEFAULT_HANG_MINUTES),
            probe_steps=data.get("probe_steps"), policy=data.get("policy") or "default", gpu=data.get("gpu"),
            predicted_gib=data.get("predicted_gib"), dataset=data.get("dataset"), model=data.get("model") or "",
            job=data.get("job") or "", user_keys=tuple(data.get("user_keys") or ()),
        )



def launch_spec(settings: RunSettings, config_file: Path, mixed_precision: str, dataset_file: Path | None = None):
    from kohya_tuner.run.launcher import LaunchSpec

    return LaunchSpec(script=settings.script, config_file=config_file,
                      dataset_config=dataset_file or settings.dataset_file,
                      python=settings.python, mixed_precision=mixed_precision or "no",
                      num_processes=settings.num_processes, gpu_ids=settings.gpu_ids,
                      accelerate_config=settings.accelerate_config, cpu=settings.cpu)


def command_for(settings: RunSettings, config_file: Path, config: Mapping[str, Any],
                base_env: Mapping[str, str] | None = None, dataset_file: Path | None = None
                ) -> tuple[list[str], dict[str, str]]:
    from kohya_tuner.run import launcher

    argv = launcher.build_argv(launch_spec(settings, config_file, str(config.get("mixed_precision") or "no"),
                                           dataset_file))
    single = settings.num_processes <= 1
    # One process: pin the card through CUDA_VISIBLE_DEVICES. Several: accelerate's
    # --gpu_ids does it for each process.
    env = launcher.build_env(os.environ if base_env is None else base_env,
                             gpu_ids=settings.gpu_ids if single else (),
                             emulate_vram_gb=settings.emulate_vram_gb)
    if settings.gpu_ids and not single:
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    return argv, env


def probe_config(config: Mapping[str, Any], steps: int, out_dir: Path) -> dict[str, Any]:
    """A short trial run: same memory settings, its own output folder, no states."""
    out = {k: v for k, v in config.items() if k not in BOOKKEEPING}
    out["max_train_steps"] = steps
    out.pop("max_train_epochs", None)
    out["output_dir"] = str(out_dir / "probe")
    out["output_name"] = "probe"
    for key in ("save_state", "save_every_n_steps", "save_last_n_steps_state", "save_every_n_epochs",
                "save_last_n_steps"):
        out.pop(key, None)
    return out



def read_config_file(path: str, plan_config: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The settings an attempt ran with (its resume and per-attempt keys taken out)."""
    import toml

    from kohya_tuner.config_io import flatten

    try:
        cfg = flatten(toml.load(path))
    except (OSError, toml.TomlDecodeError):
        return None
    if plan_config is not None:
        from kohya_tuner.run.states import settings_of

        return settings_of(cfg, plan_config)
    return {k: v for k, v in cfg.items() if k not in BOOKKEEPING}

