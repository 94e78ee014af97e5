"""Issue 17's figures: configs as users have them.

Prints the kohya_ss GUI files read (benchmarks/gui_files.py does the work), the accepted-configs
suite (tests/data/accepted_configs: configs the real pinned sd-scripts trains, each confirmed by a
real launch in tests/integration/test_accepted_real.py) with `check`'s verdict on each, and the
refused suite with `check`'s verdict. Run: PYTHONPATH=. python benchmarks/configs_users_have.py
(the check verdicts need no real trainer: placeholders are filled with a scratch tree).
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


def _scratch(tmp: Path) -> dict[str, str]:
    img = tmp / "img" / "2_tok"
    img.mkdir(parents=True)
    import struct
    import zlib

    def png(w: int, h: int) -> bytes:
        raw = b"".join(b"\x00" + b"\x80" * (w * 3) for _ in range(h))
        chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))  # noqa: E731
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))

    for i in range(4):
        (img / f"{i}.png").write_bytes(png(128, 128))
        (img / f"{i}.txt").write_text("tok", encoding="utf-8")
    model = tmp / "model.safetensors"
    model.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    (tmp / "tok").mkdir()
    return {"@MODEL@": str(model), "@DATA@": str(tmp / "img"), "@TOKCACHE@": str(tmp / "tok"),
            "@OUT@": str(tmp / "out"), "@CONFIGDIR@": str(tmp), "@SDSCRIPTS@": str(tmp / "sd-scripts"),
            "@ACCELERATE@": "accelerate"}


def _verdicts(folder: Path, fill: dict[str, str], tmp: Path) -> list[int]:
    out = []
    for src in sorted(p for p in folder.iterdir() if p.suffix in (".toml", ".sh")):
        text = src.read_text(encoding="utf-8")
        for k, v in fill.items():
            text = text.replace(k, v)
        dest = tmp / src.name
        dest.write_text(text, encoding="utf-8")
        res = subprocess.run([sys.executable, "-m", "kohya_tuner", "check", str(dest), "--model", "sd15", "--json"],
                             capture_output=True, text=True, cwd=ROOT)
        out.append(res.returncode)
    return out


def main() -> int:
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gui_files.py")], check=False)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        fill = _scratch(tmp)
        accepted = _verdicts(DATA / "accepted_configs", fill, tmp)
        refused = _verdicts(DATA / "refused_configs", fill, tmp)
    print(f"accepted suite: {len(accepted)} configs the real trainer trains; check exit 0 on "
          f"{accepted.count(0)}/{len(accepted)} (false refusals: {len(accepted) - accepted.count(0)})")
    print(f"refused suite: {len(refused)} configs the real trainer refuses; check exit 2 on "
          f"{refused.count(2)}/{len(refused)}")
    print(json.dumps({"accepted": len(accepted), "accepted_pass": accepted.count(0), "refused": len(refused),
                      "refused_caught": refused.count(2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
