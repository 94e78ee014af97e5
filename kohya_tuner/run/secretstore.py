"""Where a run keeps its secrets: `secrets.json`, mode 0600, the one file in the run folder
that holds them. The plan loses them before anything is written (config.toml, run.json,
attempt configs, journal, summary, report, events); each launch gets them back as
environment variables (see kohya_tuner/redact.py for why that reaches the trainer), and
`run --continue` reads them from here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kohya_tuner import redact, safeio
from kohya_tuner.fileio import atomic_write

SECRETS_FILE = "secrets.json"


def withhold(plan: Any, out_dir: Path) -> dict[str, str]:
    """Take the secrets out of `plan` (its config, notes and reasons) and keep them in
    OUT/secrets.json (0600). Returns them."""
    _, found = redact.split(plan.config)
    if not found:
        return {}
    for key in found:
        plan.config.pop(key, None)
        plan.provenance.pop(key, None)
    plan.notes[:] = redact.scrub(list(plan.notes), set(found.values()))
    atomic_write(Path(out_dir) / SECRETS_FILE, json.dumps(found) + "\n", mode=0o600)
    return found


def load(out_dir: Path) -> dict[str, str]:
    try:
        data = json.loads(safeio.read_regular(Path(out_dir) / SECRETS_FILE, safeio.JOURNAL_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return {k: str(v) for k, v in data.items() if k in redact.secret_keys()} if isinstance(data, dict) else {}


def environment(out_dir: Path) -> dict[str, str]:
    """The variables that give the trainer this run's secrets."""
    return {redact.SECRET_ENV[k]: v for k, v in load(out_dir).items() if k in redact.SECRET_ENV}
