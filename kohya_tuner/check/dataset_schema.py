"""sd-scripts' `--dataset_config` schema, as strict as its own voluptuous validator.

pydantic builds the models on first use only: importing this module costs nothing.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from kohya_tuner.check.argschema import closest_key, raw_schema
from kohya_tuner.check.result import Problem


@lru_cache(maxsize=None)
def _dataset_models():
    from typing import Annotated, Optional, Union

    from pydantic import BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr
    from pydantic import create_model

    def float_literal(v: Any) -> Any:
        # sd-scripts' voluptuous schema rejects `0` where it wants `0.0`; pydantic would coerce.
        if isinstance(v, int):
            raise ValueError("needs a float literal with a decimal point (write 0.0, not 0)")
        return v

    toml_float = Annotated[StrictFloat, BeforeValidator(float_literal)]
    accept_types: dict[str, Any] = {
        "str": StrictStr,
        "bool": StrictBool,
        # voluptuous tests `int` with isinstance, and a bool is an int: `num_repeats = true` is 1.
        "int": Union[StrictInt, StrictBool],
        "float": toml_float,
        "table": dict[str, Any],
        "array[int,int]": Annotated[list[StrictInt], Field(min_length=2, max_length=2)],
        "array[float,float]": Annotated[list[toml_float], Field(min_length=2, max_length=2)],
    }

    def field_type(accepts: list[str]):
        types = [accept_types[a] for a in accepts]
        return types[0] if len(types) == 1 else Union[tuple(types)]  # type: ignore[return-value]

    keys = raw_schema()["dataset_config"]["keys"]
    strict = ConfigDict(extra="forbid", strict=True)

    def fields(level: str) -> dict[str, Any]:
        return {k: (Optional[field_type(v["accepts"])], None) for k, v in keys.items() if level in v["levels"]}

    subset = create_model("Subset", __config__=strict, **fields("subsets"))
    dataset = create_model("Dataset", __config__=strict, subsets=(list[subset], ...), **fields("datasets"))
    general = create_model("General", __config__=strict, **fields("general"))
    top = create_model("DatasetConfig", __config__=strict, general=(Optional[general], None),
                       datasets=(list[dataset], ...))
    return top


def _loc(loc: tuple) -> str:
    """A readable path like datasets[0].subsets[1].num_repeats; pydantic's union and
    type tags inside `loc` are dropped because they are not keys the user wrote."""
    names = set(raw_schema()["dataset_config"]["keys"]) | {"general", "datasets", "subsets"}
    out = ""
    last_was_key = False
    for part in loc:
        if isinstance(part, int):
            if last_was_key and out.endswith(("datasets", "subsets")):
                out += f"[{part}]"
            continue
        if part in names or not last_was_key:
            out += ("." if out else "") + str(part)
            last_was_key = True
        else:
            break
    return out or "(top level)"


def validate_dataset(dataset: dict[str, Any]) -> list[Problem]:
    """Problems with the structure and types of a `--dataset_config` dict, as strict as
    sd-scripts' own validator (config_util.ConfigSanitizer)."""
    from pydantic import ValidationError

    problems: list[Problem] = []
    try:
        _dataset_models().model_validate(dataset)
    except ValidationError as exc:
        seen = set()
        for err in exc.errors():
            where = _loc(err["loc"])
            if where in seen:
                continue
            seen.add(where)
            if err["type"] == "extra_forbidden":
                key = str(err["loc"][-1])
                where = f"{where}.{key}" if where != "(top level)" and not where.endswith(key) else key
                known = raw_schema()["dataset_config"]["keys"]
                near = closest_key(key, known)
                hint = f"; did you mean {near!r}?" if near else ""
                problems.append(Problem(where, f"is not allowed here (sd-scripts' dataset schema is strict){hint}"))
            elif err["type"] == "missing":
                problems.append(Problem(where, "is required"))
            else:
                problems.append(Problem(where, f"{err['msg'].lower()} (got {err.get('input')!r})"))
    for i, ds in enumerate(dataset.get("datasets") or []):
        if not isinstance(ds, dict):
            continue
        subs = [s for s in ds.get("subsets") or [] if isinstance(s, dict)]
        for j, s in enumerate(subs):
            if "metadata_file" not in s and "image_dir" not in s:
                problems.append(Problem(f"datasets[{i}].subsets[{j}]", "needs image_dir"))
    return [Problem(p.key, p.message, p.severity, where="library/config_util.py:ConfigSanitizer.sanitize_user_config",
                    rule="dataset_schema") for p in problems]
