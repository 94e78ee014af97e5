"""Run the CLI in-process with stdout and stderr captured, for tests."""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass


@dataclass
class Result:
    exit_code: int
    stdout: str
    stderr: str
    output: str  # stdout and stderr interleaved, as a terminal shows them


class _Tee(io.StringIO):
    def __init__(self, combined: io.StringIO):
        super().__init__()
        self._combined = combined

    def write(self, text: str) -> int:
        self._combined.write(text)
        return super().write(text)

    def isatty(self) -> bool:
        return False


def invoke(*args, env: dict[str, str] | None = None) -> Result:
    from kohya_tuner.cli.app import run

    combined = io.StringIO()
    out, err = _Tee(combined), _Tee(combined)
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = run([str(a) for a in args])
            except SystemExit as exc:  # a command that exits on its own
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return Result(code, out.getvalue(), err.getvalue(), combined.getvalue())
