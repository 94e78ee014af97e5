"""Starting sd-scripts under `accelerate launch`, watching it, and stopping it.

The only module that starts processes. The command line and the environment are
built by pure functions (tested without a process); `run_process` spawns the
launcher in its own process group, streams both pipes line by line (sd-scripts'
progress bars rewrite one line with carriage returns, so a line ends at `\\r` or
`\\n`), keeps the raw bytes in a log file, watches for hangs and, on Ctrl-C,
SIGTERM or a hang, ends the whole group: accelerate starts the trainer as a child,
and a trainer left behind keeps its GPU memory.
"""

from __future__ import annotations

import codecs
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

# Rich wraps sd-scripts' log records at 80 columns when stderr is a pipe; a wide
# COLUMNS keeps each record on one line for the parser.
WIDE_COLUMNS = "250"
EMULATE_ENV = "KOHYA_TUNER_EMULATE_VRAM_GB"
SAVE_AT_OOM_ENV = "KOHYA_TUNER_SAVE_AT_OOM"
_IS_WINDOWS = sys.platform == "win32"
_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class LaunchSpec:
    """Everything that decides the trainer's command line."""

    script: Path
    config_file: Path
    dataset_config: Path | None = None
    python: str = sys.executable
    mixed_precision: str = "no"
    num_processes: int = 1
    gpu_ids: tuple[int, ...] = ()
    accelerate_config: Path | None = None
    # Tests and smoke runs on machines without CUDA; never set for a real GPU run.
    cpu: bool = False
    num_cpu_threads_per_process: int = 2


def build_argv(spec: LaunchSpec) -> list[str]:
    """The argument list (never a shell string) that launches one attempt."""
    cpu_ranks = spec.cpu and spec.num_processes > 1
    # Ranks on the CPU share its cores: more threads than cores makes every rank wait.
    threads = max(1, spec.num_cpu_threads_per_process // spec.num_processes) if cpu_ranks \
        else spec.num_cpu_threads_per_process
    argv = [
        spec.python, "-m", "accelerate.commands.launch",
        "--num_cpu_threads_per_process", str(threads),
        "--mixed_precision", str(spec.mixed_precision or "no"),
    ]
    if spec.accelerate_config is not None:
        argv += ["--config_file", str(spec.accelerate_config)]
    else:
        # Explicit values so a stale `accelerate config` default file cannot change
        # how many processes train, and accelerate does not warn about defaults.
        argv += ["--num_machines", "1", "--dynamo_backend", "no"]
    if spec.num_processes > 1:
        # accelerate 1.6 sends `--cpu` to its one-process launcher whatever --num_processes says, and
        # refuses `--cpu` with `--multi_gpu`: several CPU ranks are the torchrun launcher of
        # --multi_gpu with ACCELERATE_USE_CPU in the environment (build_env), which the ranks read.
        argv += ["--multi_gpu", "--num_processes", str(spec.num_processes)]
        if spec.gpu_ids and not spec.cpu:
            argv += ["--gpu_ids", ",".join(str(i) for i in spec.gpu_ids)]
    elif spec.accelerate_config is None:
        argv += ["--num_processes", "1"]
    if spec.cpu and not cpu_ranks:
        argv.append("--cpu")
    argv += [str(spec.script), "--config_file", str(spec.config_file)]
    if spec.dataset_config is not None:
        argv += ["--dataset_config", str(spec.dataset_config)]
    return argv


@dataclass(frozen=True)
class DeviceVar:
    """One environment variable that chooses the cards; `default_only`: a value the user
    already set wins."""

    name: str
    value: str
    default_only: bool


def device_vars(gpu_ids: tuple[int, ...], num_processes: int = 1, cpu: bool = False) -> tuple[DeviceVar, ...]:
    """How the cards of `--gpus` are chosen in the environment, for `run` and the launch
    scripts alike. One process is pinned through CUDA_VISIBLE_DEVICES; several get accelerate's
    --gpu_ids (build_argv); ranks on the CPU use no card."""
    if not gpu_ids or (cpu and num_processes > 1):
        return ()
    # NVML numbers cards in PCI order; CUDA's default order differs on mixed machines.
    out = [DeviceVar("CUDA_DEVICE_ORDER", "PCI_BUS_ID", True)]
    if num_processes <= 1:
        out.append(DeviceVar("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in gpu_ids), False))
    return tuple(out)


def emulate_dir() -> Path:
    """The folder holding kohya-tuner's `sitecustomize` for the trainer: the CUDA memory cap
    of --emulate-vram and the state saved at an out-of-memory failure."""
    return Path(__file__).resolve().parent / "emulate"


def build_env(base: Mapping[str, str], *, gpu_ids: tuple[int, ...] = (), emulate_vram_gb: float | None = None,
              extra: Mapping[str, str] | None = None, save_at_oom: bool = False,
              cpu: bool = False, num_processes: int = 1) -> dict[str, str]:
    """The trainer's environment: the user's own, plus what supervision needs.

    Values the user set win (their allocator settings, their COLUMNS if already wide);
    PYTHONPATH is extended, never replaced. `save_at_oom`: the trainer saves its state at
    the step an out-of-memory error ends (one process only). `gpu_ids` and `num_processes`
    choose the cards (device_vars)."""
    env = dict(base)
    if "PYTORCH_CUDA_ALLOC_CONF" not in env and "PYTORCH_ALLOC_CONF" not in env:
        # Fragmentation turns a fitting run into an OOM hours in; PyTorch's own message advises this.
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    env["PYTHONUNBUFFERED"] = "1"
    # The trainer's output is read as UTF-8, and sd-scripts prints Japanese ("running training / 学習開始"):
    # a user's ascii or cp1252 would stop it at that line with UnicodeEncodeError. Their error handler stays.
    errors = env.get("PYTHONIOENCODING", "").partition(":")[2]
    env["PYTHONIOENCODING"] = "utf-8" + (f":{errors}" if errors else "")
    try:
        wide = int(env.get("COLUMNS", "0")) >= int(WIDE_COLUMNS)
    except ValueError:
        wide = False
    if not wide:
        env["COLUMNS"] = WIDE_COLUMNS
    for var in device_vars(gpu_ids, num_processes, cpu):
        if not (var.default_only and var.name in env):
            env[var.name] = var.value
    if cpu:
        # What accelerate's one-process launcher sets for --cpu; its multi-process launcher
        # passes it on to every rank (build_argv).
        env["ACCELERATE_USE_CPU"] = "true"
    if emulate_vram_gb is not None:
        env[EMULATE_ENV] = f"{float(emulate_vram_gb):g}"
    if save_at_oom:
        env[SAVE_AT_OOM_ENV] = "1"
    if emulate_vram_gb is not None or save_at_oom:
        hook = str(emulate_dir())
        parts = [hook] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != hook]
        env["PYTHONPATH"] = os.pathsep.join(parts)
    if extra:
        env.update(extra)
    return env


def format_command(argv: list[str]) -> str:
    """The command as the user's shell would need it typed."""
    if _IS_WINDOWS:
        return subprocess.list2cmdline(argv)
    from kohya_tuner.shellquote import display_word

    return " ".join(display_word(a) for a in argv)


def env_changes(env: Mapping[str, str], base: Mapping[str, str]) -> dict[str, str]:
    """Only what `build_env` added or changed, for printing next to the command; a secret's
    value is shown as <hidden> (this is printed and put in --json output)."""
    from kohya_tuner.redact import HIDDEN, secret_env_names

    hidden = secret_env_names()
    return {k: (HIDDEN if k in hidden else v) for k, v in env.items() if base.get(k) != v}


# ---- the trainer's environment -----------------------------------------------------------

_PROBE = r"""
import json, sys
from importlib import metadata, util
out = {"python": sys.version.split()[0], "modules": {}}
for name in sys.argv[1:]:
    dist = {"bitsandbytes": "bitsandbytes", "xformers": "xformers"}.get(name, name)
    try:
        found = util.find_spec(name) is not None
    except Exception:
        found = False
    version = None
    if found:
        try:
            version = metadata.version(dist)
        except Exception:
            version = "unknown"
    out["modules"][name] = version
print(json.dumps(out))
"""


def probe_modules(python: str, modules: list[str], timeout_s: float = 60.0) -> dict:
    """Which of `modules` the trainer's interpreter can import, and their versions,
    without importing them (importing torch would start CUDA and take seconds).
    Returns {"python": version, "modules": {name: version or None}} or {"error": why}."""
    import json

    try:
        from kohya_tuner.child import run_bounded

        proc = run_bounded([python, "-c", _PROBE, *modules], text=True, timeout_s=timeout_s)
    except FileNotFoundError:
        return {"error": f"{python} does not exist"}
    except PermissionError:
        return {"error": f"{python} is not executable"}
    except subprocess.TimeoutExpired:
        return {"error": f"{python} did not answer within {timeout_s:g} s"}
    except OSError as exc:
        return {"error": f"{python} cannot be run: {exc.strerror or exc}"}
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"{python} failed: {tail[0]}"}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return {"error": f"{python} printed something unexpected"}


# ---- streaming ------------------------------------------------------------------------


class LineSplitter:
    """Incremental decoder + splitter: bytes in, complete lines out, on `\\r` or `\\n`.

    A `\\r\\n` pair ends one line, not two. Decoding is incremental so a UTF-8 character
    cut between two reads is not mangled."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buf = ""
        self._pending_cr = False

    def feed(self, data: bytes) -> list[str]:
        return self._split(self._decoder.decode(data))

    def finish(self) -> list[str]:
        lines = self._split(self._decoder.decode(b"", final=True))
        if self._buf:
            lines.append(self._buf)
            self._buf = ""
        return lines

    def _split(self, text: str) -> list[str]:
        if self._pending_cr and text.startswith("\n"):
            text = text[1:]
        if not text:
            return []
        self._pending_cr = text.endswith("\r")
        parts = _LINE_END.split(text)
        parts[0] = self._buf + parts[0]
        self._buf = parts.pop()
        return parts


@dataclass
class ProcessResult:
    exit_status: int | None
    duration_s: float
    pid: int
    hung: bool = False
    interrupted: bool = False
    # What ended it when we did: "interrupt", "terminate", "hang", "halt", "log_error", "reader_error".
    stopped_by: str | None = None
    signals_sent: list[str] = field(default_factory=list)
    # Why supervision itself failed (the log could not be written, a pipe was lost): the
    # trainer was stopped for it, and the run must end saying so.
    failure: str | None = None


class Interrupted(Exception):
    """The user pressed Ctrl-C or the supervisor got SIGTERM."""


def _popen_kwargs() -> dict:
    if _IS_WINDOWS:
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}  # type: ignore[attr-defined]
    return {"start_new_session": True}


def spawn(argv: list[str], env: Mapping[str, str], cwd: str | os.PathLike | None = None) -> subprocess.Popen:
    """Start `argv` in its own process group with both pipes captured (binary)."""
    try:
        return subprocess.Popen(
            argv, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, bufsize=0, **_popen_kwargs(),
        )
    except FileNotFoundError as exc:
        from kohya_tuner.errors import UserError

        raise UserError(f"Cannot start {argv[0]}: {exc.strerror}.",
                        "Check --python: it must be the interpreter of the environment sd-scripts is installed in.") from None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(proc: subprocess.Popen, grace_s: float = 10.0, first: str = "SIGINT",
               hurry: threading.Event | None = None) -> list[str]:
    """End `proc` and everything in its process group: SIGINT (so the trainer can finish
    what it is writing), then SIGTERM, then SIGKILL. Returns the signals sent. When
    `hurry` is set (a second Ctrl-C), each wait is cut short and the next signal follows."""
    sent: list[str] = []
    if _IS_WINDOWS:
        try:
            proc.send_signal(signal.CTRL_BREAK_EVENT)  # type: ignore[attr-defined]
            sent.append("CTRL_BREAK")
            proc.wait(timeout=grace_s)
        except (subprocess.TimeoutExpired, OSError):
            subprocess.run(["taskkill", "/F", "/T", "/PID", str(proc.pid)], capture_output=True)
            sent.append("taskkill")
        return sent
    pgid = proc.pid  # start_new_session makes the child the leader of its own group
    # torchrun starts each rank in a session of its own, out of reach of the group's signals: the
    # ranks are tracked as descendants while the launcher lives (afterwards they belong to init),
    # left to the launcher's own forwarding of SIGINT and SIGTERM, and killed with the group.
    others = _Descendants(proc.pid, pgid)
    order = ["SIGINT", "SIGTERM", "SIGKILL"]
    order = order[order.index(first):]
    for name in order:
        others.refresh()
        if not _group_alive(pgid) and not others.alive():
            break
        try:
            os.killpg(pgid, getattr(signal, name))
        except ProcessLookupError:
            pass
        if name == "SIGKILL":
            others.kill()
        sent.append(name)
        deadline = time.monotonic() + (grace_s if name != "SIGKILL" else 5.0)
        while time.monotonic() < deadline:
            others.refresh()
            if proc.poll() is not None and not _group_alive(pgid) and not others.alive():
                break
            if hurry is not None and hurry.is_set() and name != "SIGKILL":
                break
            time.sleep(0.05)
    # Whatever outlived the escalation (a rank deaf to signals whose launcher died first).
    if others.alive():
        others.kill()
        if "SIGKILL" not in sent:
            sent.append("SIGKILL")
    proc.poll()
    return sent


class _Descendants:
    """The processes below the launcher that left its process group (psutil objects, so a
    reused pid is never signalled)."""

    def __init__(self, root_pid: int, pgid: int):
        self.root_pid = root_pid
        self.pgid = pgid
        self.seen: dict[int, Any] = {}

    def refresh(self) -> None:
        import psutil

        try:
            found = psutil.Process(self.root_pid).children(recursive=True)
        except psutil.Error:
            return
        for p in found:
            try:
                if os.getpgid(p.pid) != self.pgid:
                    self.seen.setdefault(p.pid, p)
            except OSError:
                pass

    def alive(self) -> bool:
        import psutil

        def running(p) -> bool:
            try:
                return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                return False

        return any(running(p) for p in self.seen.values())

    def kill(self) -> None:
        import psutil

        for p in self.seen.values():
            try:
                p.kill()
            except psutil.Error:
                pass


def _reader(stream, name: str, out: queue.Queue, log, log_lock: threading.Lock) -> None:
    """Pump one pipe into the queue. It never dies silently: a failed log write (disk
    full) is reported and the pipe is still drained, so the trainer never blocks on it;
    whatever happens, the queue gets this pipe's "eof"."""
    splitter = LineSplitter()
    logging = log is not None
    try:
        fd = stream.fileno()
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            if not data:
                break
            if logging:
                try:
                    with log_lock:
                        log.write(data)
                        log.flush()
                except (OSError, ValueError) as exc:
                    logging = False
                    out.put(("log_error", name, exc))
            out.put(("data", name, None))
            for line in splitter.feed(data):
                out.put(("line", name, line))
        for line in splitter.finish():
            out.put(("line", name, line))
    except BaseException as exc:  # noqa: BLE001 - reported to the loop, which stops the trainer
        out.put(("reader_error", name, exc))
    finally:
        out.put(("eof", name, None))


class _SecondSignal:
    """From the first stop signal on, further SIGINT/SIGTERM/SIGHUP only hurry the stop
    (next signal to the trainer at once) instead of unwinding the supervisor before it
    has written down what happened."""

    def __init__(self) -> None:
        self.hurry = threading.Event()
        self._saved: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        names = ["SIGINT"] if _IS_WINDOWS else ["SIGINT", "SIGTERM", "SIGHUP"]
        for name in names:
            sig = getattr(signal, name)
            self._saved[sig] = signal.signal(sig, lambda signum, frame: self.hurry.set())

    @property
    def active(self) -> bool:
        return bool(self._saved)

    def restore(self, originals: Mapping[int, Any]) -> None:
        """Put back the handlers from before run_process (`originals`), not the ones it
        had installed itself."""
        for sig, handler in self._saved.items():
            signal.signal(sig, originals.get(sig, handler))
        self._saved.clear()


def _log_failure(log_path, exc: BaseException) -> str:
    from kohya_tuner.fileio import why

    reason = why(exc) if isinstance(exc, OSError) else str(exc) or type(exc).__name__
    return (f"cannot write the trainer's log {log_path}: {reason}; the trainer was stopped so that nothing runs "
            "unrecorded")


def run_process(argv: list[str], env: Mapping[str, str], *, on_line: Callable[[str, str], None],
                log_path: str | os.PathLike | None = None, hang_timeout_s: float | None = None,
                stop: threading.Event | None = None, cwd: str | os.PathLike | None = None,
                grace_s: float = 10.0, on_start: Callable[[subprocess.Popen], None] | None = None,
                tick: Callable[[], None] | None = None, tick_s: float = 0.5,
                on_interrupt: Callable[[], None] | None = None, eof_grace_s: float = 10.0,
                halt: threading.Event | None = None) -> ProcessResult:
    """Run one attempt to its end, calling `on_line(stream, line)` for every line.

    Ends early (and ends the whole process group) when `stop` is set, on Ctrl-C or
    SIGTERM (`interrupted`), when nothing was printed for `hang_timeout_s` (`hung`), or
    when the log cannot be written (`failure`). The raw output of both pipes goes to
    `log_path` byte for byte.

    Three watchdogs, each on its own: output (silence for `hang_timeout_s`, whether the
    launcher still lives or not), EOF (both pipes closed) and the child (once it exited,
    pipes that stay open and silent for `eof_grace_s` belong to leftovers, which are
    stopped). `on_interrupt` runs first thing on Ctrl-C/SIGTERM, before the trainer is
    stopped, so a record written there survives a second signal. `halt`: the supervisor
    saw something in the output that ends the attempt (a loss that became NaN); the group
    is stopped as for `stop`, but the attempt is not an interruption."""
    stop = stop or threading.Event()
    log = open(log_path, "ab") if log_path is not None else None
    log_lock = threading.Lock()
    t0 = time.monotonic()
    proc = spawn(argv, env, cwd)
    if on_start is not None:
        on_start(proc)
    q: queue.Queue = queue.Queue()
    readers = [
        threading.Thread(target=_reader, args=(proc.stdout, "stdout", q, log, log_lock), daemon=True),
        threading.Thread(target=_reader, args=(proc.stderr, "stderr", q, log, log_lock), daemon=True),
    ]
    for r in readers:
        r.start()

    previous: dict[int, Any] = {}
    in_main = threading.current_thread() is threading.main_thread()
    if in_main and not _IS_WINDOWS:
        def _on_term(signum, frame):  # noqa: ARG001
            raise Interrupted()

        # SIGHUP: the terminal closed. The trainer runs in its own session and would go
        # on unsupervised; it is stopped like on Ctrl-C and the journal is written.
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, _on_term)

    result = ProcessResult(exit_status=None, duration_s=0.0, pid=proc.pid)
    open_streams = 2
    last_output = time.monotonic()
    last_tick = 0.0
    exited_at: float | None = None
    second = _SecondSignal()
    try:
        while open_streams or proc.poll() is None:
            if stop.is_set():
                result.stopped_by = "terminate"
                result.interrupted = True
                result.signals_sent = stop_group(proc, grace_s)
                break
            if halt is not None and halt.is_set():
                result.stopped_by = "halt"
                result.signals_sent = stop_group(proc, grace_s)
                break
            try:
                kind, name, line = q.get(timeout=0.1)
            except queue.Empty:
                kind = None
            if kind == "data":
                last_output = time.monotonic()
            elif kind == "line":
                on_line(name, line)
            elif kind == "eof":
                open_streams -= 1
            elif kind in ("log_error", "reader_error"):
                result.stopped_by = kind
                result.failure = (_log_failure(log_path, line) if kind == "log_error"
                                  else f"lost the trainer's {name}: {line}; the trainer was stopped")
                result.signals_sent = stop_group(proc, grace_s)
                break
            now = time.monotonic()
            if tick is not None and now - last_tick >= tick_s:
                last_tick = now
                tick()
            if proc.poll() is not None and exited_at is None:
                exited_at = now
            if not open_streams and exited_at is not None:
                break
            if hang_timeout_s is not None and now - last_output > hang_timeout_s:
                result.hung = True
                result.stopped_by = "hang"
                result.signals_sent = stop_group(proc, grace_s)
                break
            if exited_at is not None and now - max(exited_at, last_output) > eof_grace_s:
                # The launcher is gone but something it started still holds the pipes.
                result.signals_sent = stop_group(proc, grace_s, first="SIGTERM")
                break
    except (KeyboardInterrupt, Interrupted):
        second.install()
        result.interrupted = True
        result.stopped_by = "interrupt"
        if on_interrupt is not None:
            try:
                on_interrupt()
            except Exception:  # noqa: BLE001 - stopping the trainer matters more than the record
                pass
        result.signals_sent = stop_group(proc, grace_s, hurry=second.hurry)
    finally:
        if not second.active:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if proc.poll() is None:
            result.signals_sent += stop_group(proc, grace_s, first="SIGKILL")
        # Whatever the readers still hold is part of the record.
        for r in readers:
            r.join(timeout=2.0)
        while True:
            try:
                kind, name, line = q.get_nowait()
            except queue.Empty:
                break
            if kind == "line":
                try:
                    on_line(name, line)
                except Exception:
                    pass
        if log is not None:
            try:
                log.close()
            except OSError:
                pass  # already reported as the failure
        second.restore(previous)
    result.exit_status = proc.returncode
    result.duration_s = time.monotonic() - t0
    return result
