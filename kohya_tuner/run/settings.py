"""What stays fixed across the attempts of a run (run.json) and how one is launched."""

from __future__ import annotations

import math
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
        """The settings of run.json; a UserError naming the file when a field is damaged."""
        from kohya_tuner.errors import UserError
        from kohya_tuner.run.journal import RUN_FILE, run_file_problem

        problem = run_file_problem(data)
        if problem is None:
            try:
                return cls._from_json(out_dir, data)
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
                problem = f"a field cannot be read ({type(exc).__name__}: {exc})"
        raise UserError(f"{Path(out_dir) / RUN_FILE} is damaged: {problem}; the run cannot be continued from it.",
                        "Start a new run in another --out.")

    @classmethod
    def _from_json(cls, out_dir: Path, data: dict[str, Any]) -> "RunSettings":
        from kohya_tuner.families import get_family

        def opt(key: str, kind: str, default: Any = None) -> Any:
            """data[key] when it is of `kind` (or absent/null: `default`); ValueError otherwise."""
            v = data.get(key)
            if v is None:
                return default
            ok = {"int": isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 10**6,
                  "num": isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0,
                  "str": isinstance(v, str), "dict": isinstance(v, dict), "bool": isinstance(v, bool),
                  "ints": isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1024
                                                      for i in v)}[kind]
            if not ok:
                raise ValueError(f"{key} is {str(v)[:40]!r}")
            return v

        def _strings(v: Any) -> tuple[str, ...]:
            if v is None:
                return ()
            if not isinstance(v, list) or not all(isinstance(i, str) for i in v):
                raise ValueError(f"user_keys is {str(v)[:40]!r}")
            return tuple(v)

        policy = opt("policy", "str", "default")
        if policy not in ("default", "roadmap"):
            raise ValueError(f"policy is {policy[:40]!r}")
        return cls(
            out_dir=out_dir, family=get_family(data["family"]), script=Path(data["script"]),
            dataset_file=Path(opt("dataset_file", "str")) if opt("dataset_file", "str") else None,
            plan_config=data["plan_config"], total_steps=int(data["total_steps"]), python=data["python"],
            num_processes=max(1, opt("num_processes", "int", 1)), gpu_ids=tuple(opt("gpu_ids", "ints", [])),
            gpu_index=opt("gpu_index", "int", 0),
            accelerate_config=Path(opt("accelerate_config", "str")) if opt("accelerate_config", "str") else None,
            cpu=opt("cpu", "bool", False), emulate_vram_gb=opt("emulate_vram_gb", "num"),
            max_attempts=opt("max_attempts", "int", 0) or DEFAULT_MAX_ATTEMPTS,
            hang_minutes=opt("hang_minutes", "num", 0) or DEFAULT_HANG_MINUTES,
            probe_steps=opt("probe_steps", "int") or None, policy=policy, gpu=opt("gpu", "dict"),
            predicted_gib=opt("predicted_gib", "num"), dataset=opt("dataset", "dict"), model=opt("model", "str", ""),
            job=opt("job", "str", ""), user_keys=_strings(data.get("user_keys")),
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
    from kohya_tuner.run import secretstore

    env = launcher.build_env(os.environ if base_env is None else base_env,
                             gpu_ids=settings.gpu_ids, num_processes=settings.num_processes,
                             emulate_vram_gb=settings.emulate_vram_gb,
                             extra=secretstore.environment(settings.out_dir) or None, save_at_oom=single,
                             cpu=settings.cpu and not single)
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
    from kohya_tuner import safeio
    from kohya_tuner.config_io import flatten

    try:
        cfg = flatten(safeio.load_toml_file(path))
    except (OSError, ValueError, TypeError, IndexError, RecursionError):  # damaged: as if absent
        return None
    if plan_config is not None:
        from kohya_tuner.run.states import settings_of

        return settings_of(cfg, plan_config)
    return {k: v for k, v in cfg.items() if k not in BOOKKEEPING}

