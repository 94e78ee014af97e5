"""The sd-scripts argument schema at the pinned commit, and validation against it.

sd-scripts reads `--config_file` with no type conversion, no choices check and no
unknown-key check, and a wrong value fails hours later or silently misbehaves. So
every config kohya-tuner writes or reads goes through `validate_config`, and every
dataset file through `validate_dataset`. Both are the `check` subpackage's evaluation
(schema, ranges, the start-up rules in check/rules.toml); this module keeps the names
the rest of the code uses, with unknown keys refused (kohya-tuner's own strictness).
"""

from __future__ import annotations

from typing import Any

from kohya_tuner.check.argschema import (ArgSpec, closest_key, pinned_commit, raw_schema,  # noqa: F401
                                         script_args)
from kohya_tuner.check.engine import key_problems, range_problems, rule_findings
from kohya_tuner.check.facts import split_kv
from kohya_tuner.check.result import Problem
from kohya_tuner.errors import UserError
from kohya_tuner.families import FAMILIES, Family


def network_args_dict(config: dict[str, Any]) -> dict[str, str]:
    return split_kv(config.get("network_args"), at_first=True)[0]


def _script_for(script: str, family: Family | None) -> str:
    return script if script else family.script if family else "train_network.py"


def validate_config(config: dict[str, Any], script: str, *, dataset: dict[str, Any] | None = None,
                    family: Family | None = None, complete: bool = False, unknown_keys: str = "error"
                    ) -> list[Problem]:
    """Every problem with a flat `--config_file` dict for `script` (errors and warnings).
    `complete=False` (a fragment being composed) skips the rules that need a whole config;
    `unknown_keys="warning"` judges a user's own file as `check` does (sd-scripts ignores such a key)."""
    script = _script_for(script, family)
    problems = key_problems(config, script, unknown_severity=unknown_keys)
    problems += range_problems(config, script, dataset)
    problems += rule_findings(config, script, dataset=dataset, complete=complete)
    return problems


def validate_dataset(dataset: dict[str, Any], family: Family | None = None) -> list[Problem]:
    """Problems with a `--dataset_config` dict: sd-scripts' strict schema, the ranges of
    its numbers and, given the family, the rules its script applies to the dataset alone
    (with an otherwise default config)."""
    from kohya_tuner.check.dataset_schema import validate_dataset as structure

    problems = structure(dataset)
    script = family.script if family else None
    problems += [p for p in range_problems({}, script or "train_network.py", dataset)]
    if script:
        problems += [p for p in rule_findings({}, script, dataset=dataset) if p.severity == "error"]
    return problems


def errors_only(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity == "error"]


def raise_if_invalid(problems: list[Problem], what: str) -> None:
    errs = errors_only(problems)
    if errs:
        listed = "; ".join(f"{p}" + (f" ({p.where})" if p.where and p.rule not in ("unknown_key", "type") else "")
                           for p in errs)
        raise UserError(f"{what} is not valid for sd-scripts: {listed}.")


__all__ = ["ArgSpec", "FAMILIES", "Problem", "closest_key", "errors_only", "network_args_dict", "pinned_commit",
           "raise_if_invalid", "raw_schema", "script_args", "validate_config", "validate_dataset"]
