"""Drives `kohya-tuner run` against the real trainer and reads back what really happened."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent

# One row per finished scenario, printed by conftest at the end of the session.
SCENARIOS: list[dict] = []
INJECT = HERE / "inject"
# A 20 MiB shortfall on the 12 GB card the plan is for: the ladder's cheapest move answers it.
SMALL_OOM_12GB = ("CUDA out of memory. Tried to allocate 40.00 MiB. GPU 0 has a total capacity of 11.75 GiB of which "
                  "20.00 MiB is free. Including non-PyTorch memory, this process has 11.71 GiB memory in use. Of the "
                  "allocated memory 11.20 GiB is allocated by PyTorch, and 310.00 MiB is reserved by PyTorch but "
                  "unallocated.")
# The same shortfall on a 16 GB card (a 4060 Ti 16 GB reports 15.59 GiB).
SMALL_OOM_16GB = ("CUDA out of memory. Tried to allocate 40.00 MiB. GPU 0 has a total capacity of 15.59 GiB of which "
                  "20.00 MiB is free. Including non-PyTorch memory, this process has 15.55 GiB memory in use. Of the "
                  "allocated memory 15.04 GiB is allocated by PyTorch, and 310.00 MiB is reserved by PyTorch but "
                  "unallocated.")


@dataclass
class Real:
    sd_scripts: Path
    python: Path
    model: Path
    tokcache: Path
    data: Path

    @classmethod
    def from_env(cls) -> "Real":
        e = os.environ
        return cls(Path(e["KOHYA_TUNER_REAL_SDSCRIPTS"]), Path(e["KOHYA_TUNER_REAL_PYTHON"]),
                   Path(e["KOHYA_TUNER_REAL_MODEL"]), Path(e["KOHYA_TUNER_REAL_TOKCACHE"]),
                   Path(e["KOHYA_TUNER_REAL_DATA"]))

    def images(self) -> list[Path]:
        return sorted(p for p in self.data.rglob("*.png"))


def lora_metadata(path: Path) -> dict:
    """The __metadata__ of a safetensors file (ss_steps and the rest sd-scripts writes)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n)).get("__metadata__") or {}


def image_folder(real: Real, dest: Path, count: int) -> Path:
    """`count` images with captions in one folder (no repeats prefix), cycling the harness's."""
    dest.mkdir(parents=True, exist_ok=True)
    src = real.images()
    for i in range(count):
        shutil.copyfile(src[i % len(src)], dest / f"img_{i:02d}.png")
        (dest / f"img_{i:02d}.txt").write_text(f"mytoken, picture {i}", encoding="utf-8")
    return dest


# What a CPU run of the real trainer needs at 64 px (see the harness README): a fixed
# resolution without buckets, SDPA, the local tokenizer, fp32 (bf16 autocast is slow on a
# CPU), no data-loader workers, and no sampling (28 sampler steps per image would dominate).
# Accumulation 1 because the SD 1.5 8 GB preset accumulates 4 and the scenarios count their OOMs in
# backward passes; a scenario about accumulation sets its own after these (a later --set wins).
CPU_SETS = ("gradient_accumulation_steps=1", "resolution=64,64", "enable_bucket=false", "sdpa=true", "mixed_precision=no",
            "sample_every_n_steps=1000", "max_data_loader_n_workers=0", "persistent_data_loader_workers=false")


@dataclass
class Run:
    out: Path
    tmp: Path
    ledger: Path
    steps_ledger: Path
    snapshots: Path
    env: dict[str, str]
    python_wrapper: Path
    results: list[subprocess.CompletedProcess] = field(default_factory=list)
    wall_s: float = 0.0
    peak_rss: int = 0  # bytes, the most the CLI and every trainer process under it held together

    @property
    def output(self) -> Path:
        return self.out / "output"

    def summary(self) -> dict:
        return json.loads((self.out / "summary.json").read_text(encoding="utf-8"))

    def attempts(self) -> list[dict]:
        return [json.loads(line) for line in (self.out / "attempts.jsonl").read_text(encoding="utf-8").splitlines()
                if line.strip()]

    def trained_per_process(self) -> dict[int, Counter]:
        """Optimizer steps per attempt number and per trainer process (pid): with several ranks
        every rank steps once per optimizer step, so each rank's count is the run's count."""
        steps: dict[int, Counter] = {}
        if not self.steps_ledger.exists():
            return steps
        for line in self.steps_ledger.read_text(encoding="utf-8").splitlines():
            pid, _, config = line.partition(" ")
            name = Path(config).name
            if name.startswith("attempt-") and name.endswith(".config.toml"):
                steps.setdefault(int(name[len("attempt-"):-len(".config.toml")]), Counter())[int(pid)] += 1
        return steps

    def trained(self) -> Counter:
        """Optimizer steps really trained, per attempt number: the optimizer steps the step ledger
        counted for that attempt's config. Counted at the optimizer, not derived from backward
        passes: a resumed attempt whose accumulation differs from the saved one's restarts
        accelerate's micro-step counter from the state, so its first step may sum fewer passes."""
        steps: Counter = Counter()
        if not self.steps_ledger.exists():
            return steps
        for line in self.steps_ledger.read_text(encoding="utf-8").splitlines():
            _pid, _, config = line.partition(" ")
            name = Path(config).name  # attempt-N.config.toml
            if name.startswith("attempt-") and name.endswith(".config.toml"):
                steps[int(name[len("attempt-"):-len(".config.toml")])] += 1
        return steps

    def earlier_files_untouched(self) -> int:
        """Every file an earlier attempt left (snapshot at each launch) is still there, unchanged.
        Returns how many files were checked."""
        sys.path.insert(0, str(HERE))
        from snapshot_python import snapshot

        now = snapshot(self.output)
        checked = 0
        for snap in sorted(self.snapshots.glob("*.json")):
            before = json.loads(snap.read_text(encoding="utf-8"))
            for rel, digest in before.items():
                assert rel in now, f"{rel} (there when {snap.stem} started) is gone"
                assert now[rel] == digest, f"{rel} (there when {snap.stem} started) was written over"
                checked += 1
        return checked


def new_run(tmp: Path, real: Real, **inject: str) -> Run:
    out = tmp / "run"
    ledger = tmp / "ledger.txt"
    steps_ledger = tmp / "steps.txt"
    snapshots = tmp / "snapshots"
    wrapper = tmp / "python"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE / 'snapshot_python.py'} \"$@\"\n", encoding="utf-8")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SDS_", "ACCELERATE_"))}
    env.update({
        "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE", "KOHYA_TUNER_HOME": str(tmp / "home"),
        "COLUMNS": "400",  # kohya-tuner's own lines unwrapped, for the assertions on them
        "PYTHONPATH": os.pathsep.join([str(INJECT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]),
        "SDS_BACKWARD_LEDGER": str(ledger), "SDS_STEP_LEDGER": str(steps_ledger),
        "SNAPSHOT_REAL_PYTHON": str(real.python),
        "SNAPSHOT_OUTPUT_DIR": str(out / "output"), "SNAPSHOT_DIR": str(snapshots),
    })
    env.update({k: str(v) for k, v in inject.items()})
    return Run(out=out, tmp=tmp, ledger=ledger, steps_ledger=steps_ledger, snapshots=snapshots, env=env, python_wrapper=wrapper)


def run_args(run: Run, real: Real, data: Path, *, steps: int, job: str = "character", extra: tuple = (),
             drop: tuple = (), gpu: str = "8", model: str = "sd15", base: Path | None = None,
             tokcache: Path | None = None) -> list[str]:
    args = ["run", "--gpu", gpu, "--model", model, "--job", job, "--steps", str(steps), "--cpu",
            "--data", str(data), "--out", str(run.out), "--sd-scripts", str(real.sd_scripts),
            "--python", str(run.python_wrapper), "--base", str(base or real.model),
            "--set", f"tokenizer_cache_dir={tokcache or real.tokcache}"]
    for s in CPU_SETS:
        if s not in drop:
            args += ["--set", s]
    return args + list(extra)


def tree_rss(proc: psutil.Process) -> int:
    """Resident bytes of a process and all its descendants now (several ranks add up)."""
    total = 0
    try:
        family = [proc] + proc.children(recursive=True)
    except psutil.Error:
        return 0
    for p in family:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


class PeakRss:
    """Samples a process tree's summed RSS twice a second until stopped; `peak` in bytes."""

    def __init__(self, pid: int) -> None:
        self.peak = 0
        self._proc = psutil.Process(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss(self._proc))
            self._stop.wait(0.5)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def cli(run: Run, args: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    argv = [sys.executable, "-m", "kohya_tuner", *args]
    proc = subprocess.Popen(argv, env=run.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            encoding="utf-8")
    rss = PeakRss(proc.pid)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise
    finally:
        run.peak_rss = max(run.peak_rss, rss.stop())
        run.wall_s += time.monotonic() - t0
    res = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    run.results.append(res)
    return res


def cli_steps(run: Run, steps: list[list[str]]):
    """A Prelaunched job: `cli` with each argument list in turn, stopping after the first that
    fails; returns their results (the trainer's threads are what `run --cpu` gives accelerate)."""
    def job(extra_env=None) -> list[subprocess.CompletedProcess]:
        results = []
        for args in steps:
            results.append(cli(run, args))
            if results[-1].returncode != 0:
                break
        return results
    return job


def config_check_run(pool, name: str, peak_gib: float, tmp_path: Path, real: Real, *, base: Path, files: list[str],
                     tokcache: Path, harness: tuple[str, ...], planned: int = 3) -> dict[str, tuple]:
    """Submit the user's path for a family that needs its own model files as one job: `config` for a
    12 GB card, `check` of what it wrote (with the dataset file launch.sh passes), then `run --cpu` of
    the same plan with an OOM at the 2nd backward and the resume. The family's `harness` settings
    join the CPU harness's, less its float32 precision (the plan's own 16-bit one, which a CPU runs
    as bf16). Returns {name: (its Run, the folder `config` writes, the planned steps)}."""
    data = image_folder(real, tmp_path / "img", 4)
    run = new_run(tmp_path, real, SDS_INJECT_OOM_AT_BACKWARD=2, SDS_INJECT_ONCE_MARKER=tmp_path / "once",
                  SDS_INJECT_OOM_MESSAGE=SMALL_OOM_12GB)
    common = ["--set", f"tokenizer_cache_dir={tokcache}", "--set", "save_every_n_steps=1"]
    for s in harness:
        common += ["--set", s]
    cfg = tmp_path / "cfg"
    steps = [
        ["config", "--model", name, "--job", "character", "--gpu", "12", "--out", str(cfg), "--base", str(base),
         *files, "--data", str(data), "--steps", str(planned), *common,
         *[a for s in CPU_SETS if not s.startswith("mixed_precision=") for a in ("--set", s)]],
        ["check", str(cfg / "config.toml"), "--dataset-config", str(cfg / "dataset.toml"), "--json"],
        run_args(run, real, data, steps=planned, gpu="12", model=name, base=base, tokcache=tokcache,
                 drop=("mixed_precision=no",), extra=(*files, *common)),
    ]
    pool.submit(name, peak_gib, cli_steps(run, steps))
    return {name: (run, cfg, planned)}


def model_scenario(prelaunched, module: str, missing: list[str], what: str, builder: str):
    """The module's prelaunched scenario, or a skip that says how to build the random-weight model."""
    if missing:
        import pytest

        pytest.skip(f"no random-weight {what} ({', '.join(missing)} unset): build it with "
                    f"tools/realmodels/{builder} (.ci/run does) and export what it prints")
    return prelaunched[module]


def explain(res: subprocess.CompletedProcess) -> str:
    return f"exit {res.returncode}\n--- stdout ---\n{res.stdout[-6000:]}\n--- stderr ---\n{res.stderr[-4000:]}"


def check_accounting(run, name: str, planned: int) -> dict:
    """The invariants of every finished scenario; returns the summary."""
    summary = run.summary()
    attempts = run.attempts()
    trained = run.trained()
    # Each attempt's own count of steps agrees with the ledger's.
    for a in attempts:
        assert trained.get(a["attempt"], 0) == a["end_step"] - a["start_step"], (a["attempt"], trained, a)
    total = sum(trained.values())
    redone = summary["steps_redone"]
    assert total == planned + redone, (trained, summary)
    assert summary["steps_done"] == total and summary["total_steps"] == planned
    if summary["status"] == "success":
        assert summary["reached_step"] == planned
        lora = Path(summary["lora"])
        assert lora.is_file() and lora.name == "lora.safetensors" and lora.parent == run.output
        assert lora_metadata(lora)["ss_steps"] == str(planned)
        page = (run.out / "report.html").read_text(encoding="utf-8")
        assert f"{planned} of {planned} planned; {total} trained, {redone} of them redone" in page
    checked = run.earlier_files_untouched()
    SCENARIOS.append({"scenario": name, "planned": planned, "trained": total, "redone": redone,
                      "attempts": len(attempts), "wall_s": round(run.wall_s, 1), "files_hashed": checked,
                      "peak_rss_gib": round(run.peak_rss / 2**30, 2)})
    return summary
