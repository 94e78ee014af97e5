"""One live run per run folder.

Two trainers writing into one output folder overwrite each other's states and LoRA,
and their journals interleave. `run` (new or `--continue`) holds `.kohya-tuner.lock` in
the folder while it works. The lock names its holder by process id and the process's
start time: a pid alone can be reused by an unrelated program after a crash or a
reboot, so a lock is live only while a process with that pid *and* that start time
exists. A stale lock (its holder gone: SIGKILL, a power cut) is taken over and said so.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from kohya_tuner import safeio
from kohya_tuner.errors import UserError

LOCK_NAME = ".kohya-tuner.lock"
# create_time() comes from the kernel's boot-relative clock; it wobbles by a few ms.
_START_SLACK_S = 1.0


def _start_time(pid: int) -> float | None:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # no such process, or not allowed to look
        return None


@dataclass(frozen=True)
class Holder:
    pid: int
    start_time: float | None
    host: str
    since: str
    command: str = ""

    def describe(self) -> str:
        return f"process {self.pid} on {self.host}, running since {self.since}"


def _me(command: str) -> Holder:
    return Holder(pid=os.getpid(), start_time=_start_time(os.getpid()), host=socket.gethostname(),
                  since=time.strftime("%Y-%m-%d %H:%M:%S"), command=command)


def read_holder(path: Path) -> Holder | None:
    try:
        data = json.loads(safeio.read_regular(path, safeio.JOURNAL_BYTES).decode("utf-8"))
        return Holder(pid=int(data["pid"]), start_time=data.get("start_time"), host=str(data.get("host", "?")),
                      since=str(data.get("since", "?")), command=str(data.get("command", "")))
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def is_live(holder: Holder) -> bool:
    if holder.host != socket.gethostname():
        return True  # a run on another machine sharing this folder: cannot be checked, so assume it lives
    started = _start_time(holder.pid)
    if started is None:
        return False
    if holder.start_time is None:
        return True
    return abs(started - float(holder.start_time)) <= _START_SLACK_S


class RunLock:
    """`with RunLock(out_dir, "run --continue"):` — refuses while another live run holds
    the folder; `stale` says whose stale lock was taken over."""

    def __init__(self, out_dir: str | os.PathLike, command: str = "run"):
        self.out = Path(out_dir)
        self.path = self.out / LOCK_NAME
        self.command = command
        self.stale: Holder | None = None
        self._made_dir = False
        self._held = False

    def acquire(self) -> "RunLock":
        try:
            return self._acquire()
        except OSError as exc:
            self.release()
            from kohya_tuner.fileio import why

            raise UserError(f"Cannot write the run lock in {self.out}: {why(exc)}.") from None

    def _acquire(self) -> "RunLock":
        if not self.out.exists():
            self.out.mkdir(parents=True)
            self._made_dir = True
        me = _me(self.command)
        text = json.dumps(me.__dict__) + "\n"
        # The lock appears under its name complete or not at all (a hard link of a
        # written file), so an empty lock is never mistaken for a stale one.
        tmp = self.path.with_name(f"{LOCK_NAME}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        try:
            for _ in range(3):
                try:
                    os.link(tmp, self.path)
                except FileExistsError:
                    self._clear_stale()
                    continue
                except OSError:  # a filesystem without hard links
                    try:
                        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    except FileExistsError:
                        self._clear_stale()
                        continue
                    with os.fdopen(fd, "w", encoding="utf-8") as fh:
                        fh.write(text)
                self._held = True
                return self
        finally:
            try:
                tmp.unlink()
            except OSError:
                pass
        raise UserError(f"Cannot take the run lock {self.path}: another kohya-tuner keeps taking it.")

    def _clear_stale(self) -> None:
        holder = read_holder(self.path)
        if holder is not None and is_live(holder):
            raise UserError(f"A kohya-tuner run is live in {self.out}: {holder.describe()} "
                            f"(`{holder.command}`). A second one would train into the same folder.",
                            "Wait for it to finish or stop it (Ctrl-C in its terminal), then `kohya-tuner run "
                            "--continue` this folder.")
        # Stale (or unreadable: a lock cut short by a crash). Rename it away rather than
        # delete it: of two processes clearing the same stale lock only one rename
        # succeeds, and a file renamed that is not the one we read goes back.
        aside = self.path.with_name(f"{LOCK_NAME}.stale.{os.getpid()}")
        try:
            os.replace(self.path, aside)
        except FileNotFoundError:
            return
        moved = read_holder(aside)
        if holder is not None and moved is not None and moved != holder:
            os.replace(aside, self.path)  # someone else's fresh lock: put it back, it is live
            raise UserError(f"A kohya-tuner run is live in {self.out}: {moved.describe()}.",
                            "Wait for it to finish, then `kohya-tuner run --continue` this folder.")
        self.stale = holder or Holder(pid=-1, start_time=None, host="?", since="?")
        try:
            os.unlink(aside)
        except OSError:
            pass

    def release(self) -> None:
        if self._held:
            holder = read_holder(self.path)
            if holder is not None and holder.pid == os.getpid():
                try:
                    os.unlink(self.path)
                except OSError:
                    pass
            self._held = False
        if self._made_dir:
            try:
                self.out.rmdir()  # only if nothing else was written: a refused run leaves no folder
            except OSError:
                pass

    def stale_note(self) -> str | None:
        if self.stale is None:
            return None
        who = self.stale.describe() if self.stale.pid >= 0 else "an unreadable lock file"
        return f"Took over a stale run lock in {self.out}: {who} is no longer running."

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
