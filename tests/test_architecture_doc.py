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


def test_only_the_cli_imports_the_cli():
    """The domain hands data back; rendering it is the CLI's (docs/architecture.md, Boundaries)."""
    import ast

    offenders = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        if rel.parts[0] == "cli" or rel.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "kohya_tuner.cli" or n.startswith("kohya_tuner.cli.") for n in names):
                offenders.append(str(rel))
    assert not offenders, f"modules outside cli/ that import it: {sorted(set(offenders))}"
