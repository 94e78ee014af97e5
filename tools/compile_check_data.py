"""Write the parsed form of kohya_tuner/check/*.toml beside each file as <name>.json.

The checker reads these instead of parsing the TOML on every start (check/engine.py:_load). Each
copy carries the SHA-256 of the TOML it was made from; a copy that no longer matches is ignored
(the TOML is parsed instead) and tests/test_check_compiled.py fails until this script is run again.

    python tools/compile_check_data.py
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kohya_tuner.check.engine import parse_toml  # noqa: E402

NAMES = ("rules.toml", "ranges.toml", "choices.toml")


def compiled(name: str) -> str:
    raw = (ROOT / "kohya_tuner" / "check" / name).read_bytes()
    doc = {"source": name, "sha256": hashlib.sha256(raw).hexdigest(), "data": parse_toml(raw)}
    return json.dumps(doc, ensure_ascii=False, sort_keys=True, separators=(",", ":")) + "\n"


def main() -> None:
    for name in NAMES:
        out = ROOT / "kohya_tuner" / "check" / f"{name}.json"
        text = compiled(name)
        if not out.exists() or out.read_text(encoding="utf-8") != text:
            out.write_text(text, encoding="utf-8")
            print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
