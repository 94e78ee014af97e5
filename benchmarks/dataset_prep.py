"""How fast `dataset check` and `dataset prep` get through a folder of 4K photos.

Generates --count synthetic 3840x2160 JPEGs (a solid colour plus noise, so they compress
and decode like photos rather than like flat fills) with a caption each, then times, on
--workers processes: check (decode + hash every file), prep (the first, full run), and prep again
(the idempotent rerun that only hashes and skips). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

_NOISE = None


def _make(args: tuple[str, int, int, int]) -> int:
    """Write one synthetic photo and its caption; returns the file size."""
    global _NOISE
    from PIL import Image

    path, i, width, height = args
    if _NOISE is None or _NOISE.size != (width, height):
        # One noise field per worker, recoloured per image: cheap, and still photo-like to JPEG.
        _NOISE = Image.merge("RGB", [Image.effect_noise((width, height), 40 + 10 * c) for c in range(3)])
    colour = ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256)
    img = Image.blend(Image.new("RGB", (width, height), colour), _NOISE, 0.2)
    img.save(path, "JPEG", quality=90)
    Path(path).with_suffix(".txt").write_text(f"a photo number {i}, colour {colour}", encoding="utf-8")
    return os.path.getsize(path)


DISTINCT = 48


def generate(folder: Path, count: int, width: int, height: int, workers: int) -> float:
    """Render up to DISTINCT photos, then fill the set with copies carrying a unique
    trailer after the JPEG end marker: every file decodes exactly like a rendered one
    and has its own hash, at a fraction of the rendering time."""
    folder.mkdir(parents=True, exist_ok=True)
    names = [folder / f"photo_{i:05d}.jpg" for i in range(count)]
    todo = [(str(names[i]), i, width, height) for i in range(min(count, DISTINCT)) if not names[i].exists()]
    if todo:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            list(pool.map(_make, todo, chunksize=4))
    for i in range(DISTINCT, count):
        if names[i].exists():
            continue
        base = names[i % DISTINCT].read_bytes()
        names[i].write_bytes(base + f"copy {i}".encode())
        names[i].with_suffix(".txt").write_text(f"a photo number {i}", encoding="utf-8")
    return sum(p.stat().st_size for p in names) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--count", type=int, default=1000, help="synthetic images (default 1000)")
    ap.add_argument("--size", default="3840x2160", help="WxH of each image (default 3840x2160, 4K UHD)")
    ap.add_argument("--model", default="sdxl", help="family whose largest bucket sets the prep size")
    ap.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    ap.add_argument("--dir", type=Path, default=None, help="keep the generated set here and reuse it next time")
    args = ap.parse_args()

    from kohya_tuner import dataset
    from kohya_tuner.dataset.parallel import default_workers

    width, height = (int(x) for x in args.size.lower().split("x"))
    workers = args.workers or default_workers()
    tmp = Path(tempfile.mkdtemp(prefix="kt-bench-"))
    src = args.dir or tmp / "photos"
    out = tmp / "photos.prepared"
    os.environ.setdefault("KOHYA_TUNER_HOME", str(tmp / "home"))
    try:
        t0 = time.perf_counter()
        megabytes = generate(src, args.count, width, height, workers)
        gen_s = time.perf_counter() - t0
        print(f"generated   {args.count} images {width}x{height}, {megabytes:.0f} MB of JPEG in {gen_s:.1f} s "
              f"({workers} processes, {os.cpu_count()} cores)")

        t0 = time.perf_counter()
        report = dataset.check(src, "style", args.model, workers=workers)
        check_s = time.perf_counter() - t0
        huge = sum(1 for i in report.images if "huge" in i.problems)
        print(f"check       {len(report.images)} images in {check_s:.1f} s = {len(report.images) / check_s:.1f} images/s "
              f"({huge} flagged as far above the training size)")

        t0 = time.perf_counter()
        first = dataset.prepare(src, out, args.model, workers=workers)
        prep_s = time.perf_counter() - t0
        print(f"prep        {first.count('written')} written, {first.count('failed')} failed in {prep_s:.1f} s = "
              f"{args.count / prep_s:.1f} images/s (long side {width} -> {first.max_side} px, Lanczos)")

        t0 = time.perf_counter()
        again = dataset.prepare(src, out, args.model, workers=workers)
        rerun_s = time.perf_counter() - t0
        print(f"prep again  {again.count('skipped')} skipped in {rerun_s:.1f} s = {args.count / rerun_s:.1f} images/s "
              "(hash and skip)")
        out_mb = sum(p.stat().st_size for p in out.glob("*.jpg")) / 1e6
        print(f"result      {out_mb:.0f} MB prepared from {megabytes:.0f} MB "
              f"({out_mb / megabytes * 100:.0f}% of the originals)")
    finally:
        if args.dir is None:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
