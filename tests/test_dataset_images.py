"""Small image sets for the dataset tests, built with Pillow in a temporary folder."""

from __future__ import annotations

import hashlib
import os
import random
import struct
from pathlib import Path

from PIL import Image

BAD_NAME = os.fsdecode(b"caf\xe9 latin1.png")  # a name that is not valid UTF-8


def jpeg(path: Path, size=(640, 480), colour=(120, 80, 40), **kw) -> Path:
    Image.new("RGB", size, colour).save(path, "JPEG", quality=90, **kw)
    return path


def png(path: Path, size=(640, 480), colour=(10, 120, 200), mode="RGB") -> Path:
    Image.new(mode, size, colour).save(path, "PNG")
    return path


def caption(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return path


def hashes(root: Path) -> dict[str, str]:
    """SHA-256 of every file under root (links are not followed), by relative path."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            if p.is_symlink():
                out[str(p.relative_to(root))] = "link:" + os.readlink(p)
                continue
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def good_set(root: Path, n: int = 12, trigger: str = "ohwx", size=(1024, 768)) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        jpeg(root / f"img{i:02d}.jpg", size=size, colour=(i * 20 % 256, 100, 50))
        caption(root / f"img{i:02d}.txt", f"{trigger} woman, photo number {i}, {'red' if i % 2 else 'blue'} "
                                          f"dress, scene {i * 7}")
    return root


def problem_set(root: Path) -> Path:
    """One file per problem check() must find, plus good images around them."""
    good_set(root, n=10)
    # corrupt: random bytes with an image name; truncated: half a JPEG. The bytes are seeded: about 3
    # draws in 1,000 happen to form a chunk header Pillow reads on, and then fail as truncated instead.
    (root / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + random.Random(0).randbytes(200))
    (root / "garbage.jpg").write_bytes(b"this is not a picture at all")
    full = jpeg(root / "tmp_full.jpg", size=(800, 600)).read_bytes()
    (root / "tmp_full.jpg").unlink()
    (root / "truncated.jpg").write_bytes(full[: len(full) // 2])
    jpeg(root / "huge.jpg", size=(4000, 3000))
    caption(root / "huge.txt", "ohwx woman, a huge photo taken outdoors in summer")
    png(root / "tiny.png", size=(120, 100))
    caption(root / "tiny.txt", "ohwx woman, tiny thumbnail of a face")
    png(root / "wide.png", size=(2400, 300))
    caption(root / "wide.txt", "ohwx woman, wide panorama of a beach at dusk")
    Image.new("CMYK", (400, 300), (0, 200, 200, 0)).save(root / "cmyk.jpg", "JPEG")
    caption(root / "cmyk.txt", "ohwx woman, printed magazine scan in cmyk colours")
    Image.frombytes("I;16", (64, 48), struct.pack("<H", 32768) * 64 * 48).save(root / "grey16.png")
    caption(root / "grey16.txt", "ohwx woman, medical style greyscale image in sixteen bits")
    frames = [Image.new("RGB", (300, 300), (i * 80, 10, 10)) for i in range(3)]
    frames[0].save(root / "anim.png", save_all=True, append_images=frames[1:])
    caption(root / "anim.txt", "ohwx woman, animated sticker with three frames")
    alpha = Image.new("RGBA", (400, 400), (255, 0, 0, 255))
    alpha.paste((0, 0, 0, 0), (0, 0, 200, 400))
    alpha.save(root / "alpha.png")
    caption(root / "alpha.txt", "ohwx woman, cut-out portrait with a transparent background")
    Image.new("RGBA", (1024, 1024), (0, 255, 0, 255)).save(root / "opaque_rgba.png")
    caption(root / "opaque_rgba.txt", "ohwx woman, green screen image that is fully opaque")
    im = Image.new("RGB", (600, 400), (200, 30, 30))
    im.paste((30, 30, 200), (0, 0, 300, 400))  # left half blue: shows which way it turned
    exif = im.getexif()
    exif[0x0112] = 6  # stored sideways; viewers turn it 90 degrees clockwise
    im.save(root / "rotated.jpg", "JPEG", exif=exif, quality=95)
    caption(root / "rotated.txt", "ohwx woman, phone photo held upright when it was taken")
    jpeg(root / "nocaption.jpg", colour=(5, 5, 5))
    jpeg(root / "emptycap.jpg", colour=(6, 6, 6))
    caption(root / "emptycap.txt", b"")
    jpeg(root / "blankcap.jpg", colour=(7, 7, 7))
    caption(root / "blankcap.txt", "   \n")
    jpeg(root / "bomcap.jpg", colour=(8, 8, 8))
    caption(root / "bomcap.txt", b"\xef\xbb\xbfohwx woman, caption saved by notepad with a bom")
    jpeg(root / "cp1252cap.jpg", colour=(9, 9, 9))
    caption(root / "cp1252cap.txt", "ohwx woman, caf\xe9 terrace in the old town".encode("cp1252"))
    jpeg(root / "multiline.jpg", colour=(11, 11, 11))
    caption(root / "multiline.txt", "ohwx woman\nstanding in a field of sunflowers at noon")
    jpeg(root / "notrigger.jpg", colour=(12, 12, 12))
    caption(root / "notrigger.txt", "a woman reading a book in a library with tall shelves")
    jpeg(root / "Mixed.Jpg", colour=(13, 13, 13))
    caption(root / "Mixed.txt", "ohwx woman, mixed case file extension from a camera")
    Image.new("RGB", (320, 240), (1, 200, 1)).save(root / "clip.gif")
    caption(root / "clip.txt", "ohwx woman, a gif that sd-scripts would never read")
    Image.new("RGB", (320, 240), (1, 1, 200)).save(root / "scan.tiff")
    (root / "copy of img00.jpg").write_bytes((root / "img00.jpg").read_bytes())
    caption(root / "copy of img00.txt", "ohwx woman, the very same picture saved twice under two names")
    (root / "notes.md").write_text("shot list")
    caption(root / "orphan.txt", "ohwx woman, caption of a picture that was deleted")
    jpeg(root / "fóto ünicode 1.jpg", colour=(14, 14, 14))
    caption(root / "fóto ünicode 1.txt", "ohwx woman, file name with spaces and accents")
    jpeg(root / BAD_NAME, colour=(15, 15, 15))
    (root / ".DS_Store").write_bytes(b"\x00\x00")
    os.symlink("loop.png", root / "loop.png")  # points at itself
    os.symlink("missing-target.jpg", root / "broken.jpg")
    (root / "extras").mkdir()
    jpeg(root / "extras" / "nested.jpg")
    os.symlink("..", root / "extras" / "up")  # a folder loop
    return root


def test_problem_set_is_what_it_claims(tmp_path):
    """The builders above must really produce the broken files the other tests rely on."""
    root = problem_set(tmp_path / "set")
    import pytest

    with pytest.raises(OSError):
        with Image.open(root / "truncated.jpg") as im:
            im.load()
    with Image.open(root / "grey16.png") as im:
        assert im.mode == "I;16"
    with Image.open(root / "anim.png") as im:
        assert im.n_frames == 3
    with Image.open(root / "rotated.jpg") as im:
        assert im.getexif().get(0x0112) == 6 and im.size == (600, 400)
    with pytest.raises(OSError):
        (root / "loop.png").stat()
