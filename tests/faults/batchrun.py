"""Run many kohya-tuner command lines in one child process, each in-process with a time
limit, and print one JSON line per command.

Tests that drive hundreds of command lines cannot afford an interpreter start for each
(about a second on two cores), nor run them in pytest's own process: a regression that
reads /dev/zero without a bound would eat the machine's memory. Here the address space is
capped (RLIMIT_AS), each command has `LIMIT` seconds (a SIGALRM that raises an exception
`app.run` does not catch, unlike TimeoutError, which is an OSError), and a `start` line is
printed before each command, so the test can name the command that never returned even if
the whole child must be killed.

With "watch" (folders) and "allow" (folders under them a command may write in), each
result lists under "outside" every path under a watched folder that the command created,
changed or removed outside the allowed ones.

Usage: python batchrun.py CASES.json
  (a list of {"argv": [...], "cwd": "...", "env": {...}, "watch": [...], "allow": [...],
   "limit": seconds, LIMIT when not given})
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import signal
import sys
import time
import traceback
from pathlib import Path

LIMIT = 10  # seconds per command: the bound docs/faults.md promises on any special file
MEMORY = 6 << 30  # address space: far above any command's need, far below the machine's RAM


class Hung(BaseException):
    """Raised by the alarm; a BaseException so that no handler of the CLI swallows it."""


def _fire(signum, frame):
    raise Hung()


def snapshot(folders: list[str]) -> dict[str, tuple]:
    """path -> (kind, size, mtime) of everything under `folders`, links not followed."""
    seen: dict[str, tuple] = {}
    for top in folders:
        for dirpath, dirnames, filenames in os.walk(top):
            for name in dirnames + filenames:
                p = os.path.join(dirpath, name)
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                seen[p] = (st.st_mode, st.st_size if not os.path.isdir(p) else 0,
                           st.st_mtime_ns if not os.path.isdir(p) else 0)
    return seen


def outside(before: dict, after: dict, allow: list[str]) -> list[str]:
    allowed = tuple(os.path.join(a, "") for a in allow)
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    return sorted(p for p in changed if not (p + os.sep).startswith(allowed))


def main(cases_file: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
    from kohya_tuner.cli.app import run

    cases = json.loads(Path(cases_file).read_text(encoding="utf-8"))
    signal.signal(signal.SIGALRM, _fire)
    real_out = sys.stdout
    home = os.getcwd()
    for i, case in enumerate(cases):
        real_out.write(json.dumps({"start": i}) + "\n")
        real_out.flush()
        saved_env = {k: os.environ.get(k) for k in case.get("env", {})}
        os.environ.update(case.get("env", {}))
        os.chdir(case.get("cwd") or home)  # a missing folder is the test's mistake: the child stops here
        buf = io.StringIO()
        started = time.monotonic()
        result = {"i": i}
        watched = snapshot(case["watch"]) if case.get("watch") else None
        signal.alarm(case.get("limit", LIMIT))
        try:
            with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
                try:
                    result["rc"] = run([os.fsdecode(a) if isinstance(a, bytes) else a for a in case["argv"]])
                except SystemExit as exc:
                    result["rc"] = exc.code if isinstance(exc.code, int) else 1
        except Hung:
            result["rc"] = "hung"
        except MemoryError:
            result["rc"] = "memory"
        except BaseException:  # an exception escaped the CLI: the traceback is the finding
            result["rc"] = "exception"
            buf.write(traceback.format_exc())
        finally:
            signal.alarm(0)
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        result["elapsed"] = round(time.monotonic() - started, 3)
        if watched is not None:
            result["outside"] = outside(watched, snapshot(case["watch"]), case.get("allow", []))
        result["output"] = buf.getvalue()[-4000:]
        real_out.write(json.dumps(result) + "\n")
        real_out.flush()
    os.chdir(home)


if __name__ == "__main__":
    main(sys.argv[1])
