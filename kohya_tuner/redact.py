"""Secrets in settings: which keys hold one, and taking them out of what gets written.

The keys come from the pinned argument schema (vendor/sd-scripts/args.json marks them
`secret`; at 48d368fa: wandb_api_key and huggingface_token, the two sd-scripts itself
leaves out of the metadata it logs). `run` hands them to the trainer through the
environment, under the names the libraries that use them read when the argument is unset
(the pinned trainer passes `args.wandb_api_key` to `wandb.login` only when given, and
`args.huggingface_token` to huggingface_hub, which falls back to HF_TOKEN): then no
config, log, journal or report file ever holds them.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

# The environment variable each library reads in place of the argument.
SECRET_ENV = {"wandb_api_key": "WANDB_API_KEY", "huggingface_token": "HF_TOKEN"}

HIDDEN = "<hidden>"


@lru_cache(maxsize=None)
def secret_keys() -> frozenset[str]:
    from kohya_tuner.check.argschema import raw_schema

    return frozenset(a["name"] for script in raw_schema()["scripts"].values() for a in script["args"]
                     if a.get("secret"))


def secret_env_names() -> frozenset[str]:
    return frozenset(SECRET_ENV.values())


def split(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(config without its secrets, the secrets)."""
    keys = secret_keys()
    clean = {k: v for k, v in config.items() if k not in keys}
    found = {k: str(v) for k, v in config.items() if k in keys and v not in (None, "")}
    return clean, found


def scrub(data: Any, values: frozenset[str] | set[str] = frozenset()) -> Any:
    """`data` with the value of every secret key, and every occurrence of a known secret
    value inside any string, replaced by <hidden> (a copy; containers of any depth)."""
    keys = secret_keys() | secret_env_names()
    vals = sorted((v for v in values if v), key=len, reverse=True)

    def text(s: str) -> str:
        for v in vals:
            s = s.replace(v, HIDDEN)
        return s

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: (HIDDEN if k in keys and x[k] not in (None, "") else walk(x[k])) for k in x}
        if isinstance(x, (list, tuple)):
            return [walk(v) for v in x]
        if isinstance(x, str):
            return text(x) if vals else x
        return x

    return walk(data)


_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@\s:]*)(?::[^/@\s]*)?@")


def url_credentials(text: str) -> str:
    """`text` with the password of every URL (scheme://user:password@host) replaced by <hidden>; a
    lone token in the user part (https://TOKEN@host, as GitHub takes one) is hidden too."""
    def hide(m: re.Match) -> str:
        user = m.group("user")
        had_password = m.group(0).count(":") > 1
        shown = user if had_password and user else ""
        return f"{m.group('scheme')}{shown + ':' if shown else ''}{HIDDEN}@"

    return _URL_USERINFO.sub(hide, text)
