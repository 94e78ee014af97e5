"""docs/architecture.md names the modules of the tree as it is: every one it lists exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "kohya_tuner"


def _named_modules() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = text[text.index("## Modules"):text.index("## Boundaries")]
    names = []
    for line in table.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            names += re.findall(r"`([^`]+)`", first)
    return names


def test_the_module_table_lists_something():
    assert len(_named_modules()) >= 20


def test_every_module_the_architecture_names_exists():
    missing = []
    for name in _named_modules():
        if "*" in name:
            if not list(PKG.glob(name)):
                missing.append(name)
        elif not (PKG / name).exists():
            missing.append(name)
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_every_top_level_module_is_named():
    named = {n.rstrip("/").split("/")[0] for n in _named_modules()}
    own = {p.name for p in PKG.iterdir() if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))}
    unnamed = own - named - {"__init__.py", "__main__.py", "data"}
    assert not unnamed, f"top-level modules docs/architecture.md does not mention: {sorted(unnamed)}"
