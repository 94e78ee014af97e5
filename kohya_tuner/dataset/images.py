"""Looking at one image file with Pillow the way sd-scripts will load it.

sd-scripts opens each image with Pillow and calls `convert("RGB")` when the mode is not
RGB; it does not apply the EXIF orientation and reads only the first frame. So a
truncated file crashes latent caching, a phone photo stored sideways trains sideways,
transparent pixels become whatever colour sits under them, a 16-bit grey PNG is clipped
to near-white, and a CMYK JPEG is converted without its colour profile. These functions
find such files; they run in worker processes, so they take and return plain values.
"""

from __future__ import annotations

import hashlib
import os
import stat
import warnings
from typing import Any

from PIL import Image, UnidentifiedImageError

# What sd-scripts globs for (train_util IMAGE_EXTENSIONS at the pinned commit): these
# suffixes in lower or upper case only, so "photo.Jpg" is invisible to it on a
# case-sensitive file system. .avif and .jxl are added only when optional Pillow plugins
# are installed in the trainer's environment, so they are treated as convertible.
TRAINER_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
# Pictures Pillow can usually read but sd-scripts does not pick up; prep converts them.
CONVERTIBLE_EXTENSIONS = (".gif", ".tif", ".tiff", ".avif", ".jxl", ".heic", ".heif", ".jfif", ".ppm", ".tga")
CAPTION_EXTENSIONS = (".txt", ".caption")

SIXTEEN_BIT_MODES = {"I;16", "I;16B", "I;16L", "I;16N", "I", "F"}

# EXIF orientations 5-8 swap width and height when applied.
TRANSPOSING = {5, 6, 7, 8}

_HASH_CHUNK = 1 << 20


def trainer_sees_suffix(name: str) -> bool:
    suffix = os.path.splitext(name)[1]
    return suffix.lower() in TRAINER_EXTENSIONS and suffix in (suffix.lower(), suffix.upper())


def sha256_file(path: str) -> str:
    """The file's SHA-256; OSError for what is not a regular file (a pipe or device would
    block or never end), opened without waiting should it have become a FIFO since."""
    import errno

    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise OSError(errno.EINVAL, not_a_file(mode), path)
    with os.fdopen(fd, "rb") as fh:
        while True:
            chunk = fh.read(_HASH_CHUNK)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def _alpha_used(img: Image.Image) -> bool:
    """True when some pixel is not fully opaque (an opaque RGBA image is harmless)."""
    try:
        if img.mode in ("RGBA", "LA", "PA"):
            lo, _ = img.getchannel("A").getextrema()
            return lo < 255
        if img.mode == "P" and "transparency" in img.info:
            lo, _ = img.convert("RGBA").getchannel("A").getextrema()
            return lo < 255
        if "transparency" in img.info:  # RGB/L with a transparent colour key
            return True
    except Exception:
        return True
    return False


def _looks_cut(path: str) -> bool:
    """A JPEG without its end-of-image marker was cut off (an interrupted download or copy)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
            fh.seek(-2, os.SEEK_END)
            return head == b"\xff\xd8" and fh.read(2) != b"\xff\xd9"
    except OSError:
        return False


def inspect_image(path: str, want_hash: bool = True) -> dict[str, Any]:
    """Everything check() needs to know about one image file; never raises.

    Returns a dict of ImageInfo fields (without path/caption) plus "problems"."""
    info: dict[str, Any] = {"problems": [], "loadable": False}
    try:
        st = os.stat(path)
    except OSError as exc:
        info["problems"].append("unreadable")
        info["error"] = _os_reason(exc)
        return info
    if not stat.S_ISREG(st.st_mode):
        # A FIFO or a device named like a picture: opening it would block or never end.
        info["problems"].append("unreadable")
        info["error"] = not_a_file(st.st_mode)
        return info
    info["size_bytes"] = st.st_size
    if want_hash:
        try:
            info["sha256"] = sha256_file(path)
        except OSError as exc:
            info["problems"].append("unreadable")
            info["error"] = _os_reason(exc)
            return info
    with warnings.catch_warnings():
        # A DecompressionBombWarning is reported as "huge", not printed.
        warnings.simplefilter("ignore")
        try:
            img = Image.open(path)
        except Image.DecompressionBombError:
            info["problems"].append("too_many_pixels")
            info["error"] = "more pixels than Pillow agrees to open by default"
            _header_only(path, info)
            return info
        except UnidentifiedImageError:
            info["problems"].append("not_an_image")
            info["error"] = "Pillow does not recognise this file as an image"
            return info
        except OSError as exc:
            # Pillow raises a bare OSError (no errno) for a file it can read but not parse, such
            # as a JPEG cut off inside its headers: that is a damaged file, not a permission problem.
            if exc.errno is None:
                text = str(exc)
                info["problems"].append("truncated" if "truncated" in text or _looks_cut(path) else "corrupt")
                info["error"] = text or type(exc).__name__
            else:
                info["problems"].append("unreadable")
                info["error"] = _os_reason(exc)
            return info
        try:
            with img:
                _describe(img, info)
                try:
                    # Decoding at a reduced JPEG scale still reads every byte, so a
                    # truncated or damaged file is caught at a fraction of the cost.
                    if img.format == "JPEG":
                        img.draft(img.mode, (max(1, img.width // 8), max(1, img.height // 8)))
                    img.load()
                except Exception as exc:
                    text = str(exc)
                    info["problems"].append("truncated" if "truncated" in text else "corrupt")
                    info["error"] = text or type(exc).__name__
                    return info
                info["has_alpha"] = _alpha_used(img)
        except Exception as exc:  # anything Pillow throws while reading headers
            info["problems"].append("corrupt")
            info["error"] = str(exc) or type(exc).__name__
            return info
    info["loadable"] = True
    mode = info.get("mode")
    if mode == "CMYK":
        info["problems"].append("cmyk")
    if mode in SIXTEEN_BIT_MODES:
        info["problems"].append("sixteen_bit")
    if info.get("frames", 1) > 1:
        info["problems"].append("animated")
    if info.get("has_alpha"):
        info["problems"].append("alpha")
    if info.get("orientation", 1) not in (0, 1):
        info["problems"].append("exif_rotated")
    return info


def _describe(img: Image.Image, info: dict[str, Any]) -> None:
    info["format"] = img.format
    info["mode"] = img.mode
    w, h = img.size
    orientation = 1
    try:
        orientation = int(img.getexif().get(0x0112, 1) or 1)
    except Exception:
        orientation = 1
    if orientation in TRANSPOSING:
        w, h = h, w
    info["width"], info["height"] = w, h
    info["orientation"] = orientation
    info["frames"] = int(getattr(img, "n_frames", 1) or 1)


def _header_only(path: str, info: dict[str, Any]) -> None:
    """Size and mode of an image too large for Pillow's default limit."""
    saved = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        with Image.open(path) as img:
            _describe(img, info)
    except Exception:
        pass
    finally:
        Image.MAX_IMAGE_PIXELS = saved


def not_a_file(mode: int) -> str:
    """Why a picture's name that is no regular file is left out, in words."""
    if stat.S_ISDIR(mode):
        return "a folder, not a file"
    return f"{special_kind(mode)}, not a file (reading it would wait or never end)"


def special_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket or other special file"


def _os_reason(exc: OSError) -> str:
    import errno

    if exc.errno == errno.ELOOP:
        return "a symbolic link that points back to itself (symlink loop)"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if exc.errno == errno.ENOENT:
        return "a broken symbolic link or a file that vanished"
    return exc.strerror or str(exc)
