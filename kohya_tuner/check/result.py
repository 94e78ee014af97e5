"""What a check found: problems (sd-scripts would refuse) and warnings (it would adjust)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Problem:
    key: str
    message: str
    severity: Literal["error", "warning"] = "error"
    # Every key the rule reads; `key` is the first, the one to change.
    keys: tuple[str, ...] = ()
    where: str = ""
    rule: str = ""
    # The way the value reaches sd-scripts: "config_file" (no argparse), "command_line" (argparse),
    # "dataset_config" (config_util's schema); "" while a finding is still being made.
    path: str = ""

    def __post_init__(self) -> None:
        if not self.keys:
            object.__setattr__(self, "keys", (self.key,))

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"

    def as_json(self) -> dict[str, Any]:
        return {"keys": list(self.keys), "message": self.message, "where": self.where, "path": self.path}


@dataclass
class CheckResult:
    script: str
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "script": self.script,
                "problems": [p.as_json() for p in self.problems],
                "warnings": [w.as_json() for w in self.warnings]}

    def to_json(self) -> str:
        from kohya_tuner import jsontext

        return jsontext.dumps(self.to_dict(), indent=2)

    def summary(self) -> str:
        """One sentence naming every problem, for an error paragraph."""
        return "; ".join(f"{', '.join(p.keys)}: {p.message} ({p.where})" if p.where else str(p)
                         for p in self.problems)
