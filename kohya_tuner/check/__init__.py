"""`check`: would the pinned sd-scripts start training with this config?

Pure functions over a flat `--config_file` dict and a `--dataset_config` dict; nothing
here imports torch, and the schema and rule files load on first use.

- `check(...)` -> CheckResult: problems (sd-scripts would stop) and warnings (it would
  silently change a value). The same evaluation backs `schema.validate_config`, which
  `config`, `fit`, `estimate`, the ladder and `run` pass through: one gate.
- `gate(...)` raises UserError when there is a problem (exit 2 at the CLI).
"""

from __future__ import annotations

from typing import Any

from kohya_tuner.check.engine import check, not_lora, not_lora_message, rules
from kohya_tuner.check.result import CheckResult, Problem

__all__ = ["CheckResult", "Problem", "check", "gate", "not_lora", "not_lora_message", "rules", "run_gate"]


def gate(config: dict[str, Any], script: str, *, dataset: dict[str, Any] | None = None, what: str = "The config",
         **kw: Any) -> CheckResult:
    """`check`, raising UserError naming every problem; returns the result for its warnings."""
    from kohya_tuner.errors import UserError

    result = check(config, script, dataset=dataset, **kw)
    if not result.ok:
        if any(p.rule == "not_lora" for p in result.problems):
            raise UserError(result.problems[0].message)
        raise UserError(f"{what} would be refused by sd-scripts at start-up: {result.summary()}.",
                        "Change the setting(s) named; `kohya-tuner check` lists every rule.")
    return result


def run_gate(config: dict[str, Any], script: str, *, dataset: dict[str, Any] | None = None,
             base_dir: str | None = None, what: str = "The config about to launch",
             family: str | None = None) -> CheckResult:
    """The check `run` calls before each launch (and after each ladder move): the full
    rule set, files and folders included, unknown keys refused."""
    return gate(config, script, dataset=dataset, complete=True, filesystem=True, base_dir=base_dir, what=what,
                unknown_keys="problem", family=family)
