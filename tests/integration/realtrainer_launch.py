"""Filling a test config's @NAME@ placeholders and launching the real pinned sd-scripts on the CPU.

Shared by test_check_real.py (configs the trainer refuses) and test_accepted_real.py (configs it
trains). The variables are those ../shared/realtrainer/build.sh prints; `configured()` says
whether they are all set.

A config in a folder named after a family (`sdxl/`, `flux/`) is for that family's script and its
random-weight model, named by the variables tools/realmodels/ prints (`family_missing()` says which
are unset). A FLUX config the trainer refuses before it reads any weight runs on `flux_standin()`.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

ENV = {k: os.environ.get(f"KOHYA_TUNER_REAL_{k}") for k in ("SDSCRIPTS", "PYTHON", "MODEL", "TOKCACHE", "DATA")}
INJECT = Path(__file__).resolve().parents[3] / "shared" / "realtrainer" / "inject"


@dataclass(frozen=True)
class Family:
    script: str
    model: str  # check's --model
    # placeholder -> the variable that names its file (the family's own model and tokenizers)
    files: dict[str, str]


FAMILIES = {
    "sd15": Family("train_network.py", "sd15", {"@MODEL@": "KOHYA_TUNER_REAL_MODEL",
                                                "@TOKCACHE@": "KOHYA_TUNER_REAL_TOKCACHE"}),
    "sdxl": Family("sdxl_train_network.py", "sdxl", {"@MODEL@": "KOHYA_TUNER_REAL_SDXL_MODEL",
                                                     "@TOKCACHE@": "KOHYA_TUNER_REAL_SDXL_TOKCACHE"}),
    "flux": Family("flux_train_network.py", "flux", {
        "@MODEL@": "KOHYA_TUNER_REAL_FLUX_MODEL", "@CLIP_L@": "KOHYA_TUNER_REAL_FLUX_CLIP_L",
        "@T5XXL@": "KOHYA_TUNER_REAL_FLUX_T5XXL", "@AE@": "KOHYA_TUNER_REAL_FLUX_AE",
        "@TOKCACHE@": "KOHYA_TUNER_REAL_FLUX_TOKCACHE"}),
}


def family_of(config: Path) -> str:
    """The family a test config is for: the name of its folder when that is one, else SD 1.5."""
    return config.parent.name if config.parent.name in FAMILIES else "sd15"


def family_missing(family: str) -> list[str]:
    return [v for v in FAMILIES[family].files.values() if not os.environ.get(v)]


def configured() -> bool:
    return all(ENV.values())


def fill(text: str, out_dir: Path, config_dir: Path | None = None, *, files: dict[str, str] | None = None,
         data: Path | None = None) -> str:
    """The text with @MODEL@, @DATA@, @TOKCACHE@, @OUT@ (out_dir/output) and @CONFIGDIR@ filled in;
    `files` gives the model placeholders of another family (default: the SD 1.5 harness's)."""
    values = {"@MODEL@": ENV["MODEL"], "@TOKCACHE@": ENV["TOKCACHE"], **(files or {}),
              "@DATA@": str(data or ENV["DATA"]), "@OUT@": str(out_dir / "output")}
    if config_dir is not None:
        values["@CONFIGDIR@"] = str(config_dir)
    for key, value in values.items():
        text = text.replace(key, value)
    return text


def filled(src: Path, dest_dir: Path, name: str = "config.toml", *, standin: bool = False) -> Path:
    """src filled in as dest_dir/name. A family config gets its family's files (or, with
    `standin`, FLUX stand-ins) and its own copy of the images (so a cache written to disk
    stays in the test's folder)."""
    family = family_of(src)
    files = data = None
    if family != "sd15":
        files = flux_standin(dest_dir / "standin") if standin else {
            k: os.environ[v] for k, v in FAMILIES[family].files.items()}
        data = dest_dir / "data"
        shutil.copytree(ENV["DATA"], data)
    dest = dest_dir / name
    dest.write_text(fill(src.read_text(), dest_dir, src.parent, files=files, data=data))
    return dest


# The keys flux_utils.analyze_checkpoint_state reads (library/flux_utils.py:55-71): a double and a
# single block, and the guidance embedding of a dev model.
_FLUX_KEYS = ("double_blocks.0.img_attn.proj.bias", "single_blocks.0.modulation.lin.bias", "guidance_in.in_layer.bias")


def flux_standin(dest: Path) -> dict[str, str]:
    """Files for a FLUX config the trainer refuses before reading any weight, as placeholder ->
    path. flux_train_network.py opens two things first: the checkpoint's key names (in
    get_tokenize_strategy, before assert_extra_args) and the CLIP-L and T5 tokenizers. So the
    model is a safetensors file holding those keys as 1-element tensors (the U-Net loader would
    fail on it), CLIP-L, T5-XXL and the AE are empty files, and the tokenizer cache holds the
    harness's CLIP tokenizer and the T5 tokenizer files sd-scripts ships in configs/t5_old."""
    dest.mkdir(parents=True, exist_ok=True)
    head = {k: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i, k in enumerate(_FLUX_KEYS)}
    raw = json.dumps(head).encode()
    raw += b" " * (-len(raw) % 8)
    model = dest / "flux-standin.safetensors"
    model.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(4 * len(_FLUX_KEYS)))
    files = {"@MODEL@": str(model)}
    for name in ("clip_l", "t5xxl", "ae"):
        (dest / f"{name}.safetensors").write_bytes(b"")
        files[f"@{name.upper()}@"] = str(dest / f"{name}.safetensors")
    tok = dest / "tokcache"
    tok.mkdir(exist_ok=True)
    (tok / "openai_clip-vit-large-patch14").symlink_to(Path(ENV["TOKCACHE"]) / "openai_clip-vit-large-patch14")
    (tok / "google_t5-v1_1-xxl").symlink_to(Path(ENV["SDSCRIPTS"]) / "configs" / "t5_old")
    files["@TOKCACHE@"] = str(tok)
    return files


def accelerate() -> Path:
    return Path(ENV["PYTHON"]).parent / "accelerate"


def train_script(script: str = "train_network.py") -> Path:
    return Path(ENV["SDSCRIPTS"]) / script


def launch_argv(argv: list[str], cwd: Path, timeout: int = 420,
                extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run argv as it is (under nice), with the harness's environment, in cwd."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE", "PYTHONUNBUFFERED": "1",
           **(extra_env or {})}
    if INJECT.is_dir():
        env["PYTHONPATH"] = os.pathsep.join([str(INJECT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["SDS_BACKWARD_LEDGER"] = str(cwd / "backward.ledger")
    return subprocess.run(["nice", "-n", "5", *argv], cwd=cwd, env=env, capture_output=True, text=True, check=False,
                          timeout=timeout)


def launch(cfg: Path, timeout: int = 420, script: str = "train_network.py",
           extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`accelerate launch --cpu … SCRIPT --config_file cfg`, in cfg's folder."""
    cmd = [str(accelerate()), "launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", str(train_script(script)), "--config_file", str(cfg)]
    return launch_argv(cmd, cfg.parent, timeout, extra_env)


# Peak RSS of one launch with the CLI around it, GiB, as measured on the harness at 64 px: SD 1.5 6.3
# (test_accepted_real), the random FLUX.1 with its fp8 T5-XXL 11.1 (test_real_flux), SD 1.5 on two CPU ranks
# 10.8 (test_real_ranks); "standin" is any launch that stops before any weight is read (the FLUX stand-in, a
# start-up refusal). The random SDXL in float32 is the host's memory in use at its peak, 15.0-15.4 GB measured
# (`free`): its tree's summed RSS, 21 GiB, also counts the mapped checkpoint's pages, which the kernel can drop.
# At 15.5 on a 24 GB host only a launch that stops before reading weights ("standin") runs beside it. The random
# SD3 Medium (test_real_sd3, KOHYA_TUNER_REAL_ALL only) 11.5 on two runs, its bf16 T5-XXL most of it.
PEAK_GIB = {"sd15": 6.5, "sdxl": 15.5, "flux": 11.5, "sd3": 12.0, "sd15_two_ranks": 11.0, "standin": 2.0}


def workers() -> int:
    """How many launches may run at once: KOHYA_TUNER_REAL_WORKERS, else 2 where the machine has two
    cores, else 1 (`Prelaunched` also keeps their summed peak RSS inside the free memory).

    A launch spends most of its wall time in one thread (imports, reading the checkpoint, building the
    models), so two at once on two cores finish the suites sooner."""
    given = os.environ.get("KOHYA_TUNER_REAL_WORKERS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    return 2 if (os.cpu_count() or 1) >= 2 else 1


def job_name(key) -> str:
    """A job's key as one short line: its module's own name, its test, its config."""
    def parts(key):
        for part in key if isinstance(key, tuple) else (key,):
            if isinstance(part, tuple):
                yield from parts(part)
            else:
                yield str(part).removeprefix("tests.integration.")
    return "/".join(parts(key))


class Prelaunched:
    """Launches started ahead of the tests that read them, `workers()` at a time, and only as many at
    once as the free memory holds (each job names its peak GiB; one runs alone whatever its size). A
    free worker takes the first job, in submission order, that fits beside the ones running: a large
    job that must wait for room does not hold back the small ones behind it.

    The session has one (conftest's `prelaunched`): the first test that needs the trainer submits
    every module's launches and each test then waits only for its own, so the suite's order and
    per-test reports are unchanged while the trainer runs two jobs at a time across module
    boundaries."""

    def __init__(self) -> None:
        import threading

        import psutil

        self.n = workers()
        self._jobs: dict[object, Future] = {}
        self._waiting: list[tuple[Future, float, object, tuple, dict, str]] = []
        self._room = threading.Condition()
        self._held = 0.0
        self._running = 0
        self._closed = False
        self._budget = psutil.virtual_memory().available / 2**30 - 2.0
        # (job name, wall seconds, torch threads) of every launch run, in the order they ended: what each
        # launch cost, for conftest's summary (the suite's time is CI's to watch).
        self.times: list[tuple[str, float, int]] = []
        self._workers = [threading.Thread(target=self._work, name=f"realtrainer-{i}", daemon=True)
                         for i in range(self.n)]
        for t in self._workers:
            t.start()

    def _fits(self, gib: float) -> bool:
        return self._running == 0 or self._held + gib <= self._budget

    def _work(self) -> None:
        while True:
            with self._room:
                self._room.wait_for(lambda: self._closed or any(self._fits(j[1]) for j in self._waiting))
                job = next((j for j in self._waiting if self._fits(j[1])), None)
                if job is None:  # closed, and nothing left that may start
                    return
                self._waiting.remove(job)
                future, gib, fn, args, kwargs, name = job
                self._held += gib
                self._running += 1
                # torch's threads: the cores shared among the launches running now (a launch that runs
                # alone, as a large one often must, gets them all).
                threads = max(1, (os.cpu_count() or 1) // self._running)
            env = {**(kwargs.pop("extra_env", None) or {}), "OMP_NUM_THREADS": str(threads)}
            try:
                if future.set_running_or_notify_cancel():
                    started = time.monotonic()
                    try:
                        future.set_result(fn(*args, extra_env=env, **kwargs))
                    except BaseException as exc:  # the test that reads it raises it
                        future.set_exception(exc)
                    self.times.append((name, time.monotonic() - started, threads))
            finally:
                with self._room:
                    self._held -= gib
                    self._running -= 1
                    self._room.notify_all()

    def submit(self, key, gib: float, fn, *args, **kwargs) -> None:
        if key not in self._jobs:
            self._jobs[key] = future = Future()
            with self._room:
                self._waiting.append((future, gib, fn, args, kwargs, job_name(key)))
                self._room.notify_all()

    def result(self, key) -> subprocess.CompletedProcess:
        return self._jobs[key].result()

    def close(self) -> None:
        """Drops the jobs not started and waits for the running ones."""
        with self._room:
            for future, *_ in self._waiting:
                future.cancel()
            self._waiting.clear()
            self._closed = True
            self._room.notify_all()
        for t in self._workers:
            t.join()


class Queue:
    """One module's view of the session's Prelaunched pool: its keys cannot meet another module's."""

    def __init__(self, pool: Prelaunched, module: str) -> None:
        self._pool, self._module = pool, module

    def submit(self, key, gib: float, fn, *args, **kwargs) -> None:
        self._pool.submit((self._module, key), gib, fn, *args, **kwargs)

    def result(self, key):
        return self._pool.result((self._module, key))


def session_modules(session) -> dict[object, list[tuple[str, Path | None]]]:
    """For each module of the session's selected tests, in order, that defines `prelaunch`: (test
    function, its `path` parameter or None) for each of its tests, in order, so a module starts
    only what `-k` selects."""
    out: dict[object, list[tuple[str, Path | None]]] = {}
    for item in session.items:
        module = getattr(item, "module", None)
        if module is None or not hasattr(module, "prelaunch"):
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        out.setdefault(module, []).append((getattr(item, "originalname", item.name), params.get("path")))
    return out
