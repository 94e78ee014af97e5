"""One image of `dataset prep`, in a worker process: decode once, rotate upright, 8-bit
sRGB, flatten transparency, scale the long side down with Lanczos; or copy the bytes
when nothing needs doing. Written under a temporary name and renamed into place."""

from __future__ import annotations

import errno
import io
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

from PIL import Image, ImageOps

from kohya_tuner.fileio import copied_mode
from kohya_tuner.dataset.images import SIXTEEN_BIT_MODES, TRAINER_EXTENSIONS, TRANSPOSING, sha256_file
from kohya_tuner.dataset.walk import TMP_SUFFIX

# Prep is for the user's own pictures: allow large originals (Pillow's default refuses
# anything over ~179 MP as a decompression-bomb guard), within reason.
PREP_MAX_PIXELS = 1_000_000_000


def output_suffix(rel: str) -> str:
    suffix = os.path.splitext(rel)[1].lower()
    return suffix if suffix in TRAINER_EXTENSIONS else ".png"


_SAVE_OPTIONS = {
    ".jpg": ("JPEG", {"quality": 95, "subsampling": 0}),
    ".jpeg": ("JPEG", {"quality": 95, "subsampling": 0}),
    ".png": ("PNG", {"compress_level": 4}),
    ".webp": ("WEBP", {"quality": 95, "method": 4}),
    ".bmp": ("BMP", {}),
}


def _is_srgb(icc: bytes) -> bool:
    try:
        from PIL import ImageCms

        desc = ImageCms.getProfileDescription(ImageCms.ImageCmsProfile(io.BytesIO(icc)))
        return "srgb" in desc.lower().replace(" ", "")
    except Exception:
        return True  # unreadable profile: leave the pixels as they are


def _to_srgb(img: Image.Image, icc: bytes, mode: str) -> Image.Image | None:
    try:
        from PIL import ImageCms

        src = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        dst = ImageCms.createProfile("sRGB")
        return ImageCms.profileToProfile(img, src, dst, outputMode=mode)
    except Exception:
        return None


def _has_transparency(img: Image.Image) -> bool:
    if img.mode in ("RGBA", "LA", "PA"):
        return img.getchannel("A").getextrema()[0] < 255
    return "transparency" in img.info


# The shortest side a prepared image keeps (the presets' largest bucket step), and the most
# an image is blown up to reach it; a smaller one is left out, as the manifest says.
MIN_SIDE = 64
MAX_UPSCALE = 4.0


def _convert(img: Image.Image, max_side: int) -> tuple[Image.Image, list[str]]:
    """The picture as it should be trained, and what was done to get it."""
    actions: list[str] = []
    if getattr(img, "n_frames", 1) > 1:
        img.seek(0)
        actions.append("first frame of an animation")
    icc = img.info.get("icc_profile")
    orientation = 1
    try:
        orientation = int(img.getexif().get(0x0112, 1) or 1)
    except Exception:
        pass
    original = img.size
    if img.format == "JPEG":
        stored_long = max(img.size)
        if stored_long > max_side:
            # libjpeg decodes straight at 1/2, 1/4 or 1/8 scale, never below the request.
            scale = max_side / stored_long
            img.draft(img.mode, (max(1, int(img.width * scale)), max(1, int(img.height * scale))))
    img.load()
    if orientation not in (0, 1):
        img = ImageOps.exif_transpose(img)
        actions.append(f"rotated by EXIF orientation {orientation}")
    if img.mode == "CMYK":
        converted = _to_srgb(img, icc, "RGB") if icc else None
        img = converted if converted is not None else img.convert("RGB")
        actions.append("CMYK to RGB" + (" via ICC profile" if converted is not None else ""))
        icc = None
    elif img.mode in SIXTEEN_BIT_MODES:
        if img.mode == "F":
            img = img.convert("L")
        else:
            img = img.convert("I").point(lambda v: v * (1 / 257)).convert("L")
        actions.append("16-bit to 8-bit")
    elif _has_transparency(img):
        rgba = img.convert("RGBA")
        flat = Image.new("RGB", rgba.size, (255, 255, 255))
        flat.paste(rgba, mask=rgba.getchannel("A"))
        img = flat
        actions.append("transparency flattened onto white")
    elif img.mode not in ("RGB", "L"):
        actions.append(f"{img.mode} to RGB")
        img = img.convert("RGB")
    if icc and img.mode == "RGB" and not _is_srgb(icc):
        converted = _to_srgb(img, icc, "RGB")
        if converted is not None:
            img = converted
            actions.append("colour profile converted to sRGB")
    long_side = max(img.size)
    if long_side > max_side:
        scale = max_side / long_side
        size = (max(1, round(img.width * scale)), max(1, round(img.height * scale)))
        shown = original if orientation not in TRANSPOSING else original[::-1]
        actions.append(f"resized {shown[0]}x{shown[1]} to {size[0]}x{size[1]}")
        img = img.resize(size, Image.Resampling.LANCZOS)
    short = min(img.size)
    if short < MIN_SIDE:
        # sd-scripts rounds a bucket side down to its step (64 in the presets); with
        # bucket_no_upscale a shorter side becomes a 0 px bucket and a division by zero.
        scale = MIN_SIDE / short
        size = (max(MIN_SIDE, round(img.width * scale)), max(MIN_SIDE, round(img.height * scale)))
        if scale > MAX_UPSCALE or max(size) > max_side:
            raise ValueError(f"left out: {img.width}x{img.height} has a side under {MIN_SIDE} px, too small to "
                             f"upscale (more than {MAX_UPSCALE:g}x) for training")
        actions.append(f"upscaled {img.width}x{img.height} to {size[0]}x{size[1]} (a side under {MIN_SIDE} px "
                       "makes a 0 px bucket in sd-scripts)")
        img = img.resize(size, Image.Resampling.LANCZOS)
    return img, actions


# Write errors that are the output folder's, not the picture's: prep stops and says so
# instead of listing every remaining image as failed.
OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO})


class OutputUnwritable(OSError):
    pass


def tmp_name(final: Path) -> Path:
    return final.with_name(f".{final.name}.{os.getpid()}{TMP_SUFFIX}")


def prepare_one(task: dict[str, Any]) -> dict[str, Any]:
    """Prepare one image; returns the manifest entry (with "outcome"). Never raises for a
    bad picture: it comes back as outcome "failed" with the reason."""
    src = task["src"]
    final = Path(task["dst"])
    prev = task.get("prev")
    try:
        st = os.stat(src)
        digest = sha256_file(src)
    except OSError as exc:
        return {"outcome": "failed", "reason": exc.strerror or str(exc)}
    entry = {
        "source": task["rel"], "source_sha256": digest, "source_size": st.st_size, "source_mtime_ns": st.st_mtime_ns,
        "output": task["out_rel"], "pipeline": task["pipeline"],
    }
    if prev and prev.get("source_sha256") == digest and prev.get("pipeline") == task["pipeline"] \
            and prev.get("output") == task["out_rel"]:
        try:
            if final.stat().st_size == prev.get("output_size"):
                return {**prev, "source_size": st.st_size, "source_mtime_ns": st.st_mtime_ns, "outcome": "skipped"}
        except OSError:
            pass
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return {"outcome": "failed", "reason": f"cannot create the output folder: {exc.strerror or exc}",
                "errno": exc.errno}
    saved_limit = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = PREP_MAX_PIXELS
    tmp = tmp_name(final)
    writing = False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(src) as opened:
                fmt = opened.format
                img, actions = _convert(opened, task["max_side"])
                width, height = img.size
                save_fmt, options = _SAVE_OPTIONS[final.suffix.lower()]
                writing = True
                if not actions and save_fmt == fmt:
                    # Already right: keep the exact bytes (no re-encoding loss).
                    shutil.copyfile(src, tmp)
                    outcome = "copied"
                else:
                    if save_fmt == "JPEG" and img.mode not in ("RGB", "L"):
                        img = img.convert("RGB")
                    if not actions:
                        actions.append(f"re-encoded from {fmt} to {save_fmt}")
                    img.save(tmp, save_fmt, **options)
                    outcome = "written"
        os.chmod(tmp, copied_mode(src))
        os.replace(tmp, final)
    except (Exception, KeyboardInterrupt) as exc:
        try:
            tmp.unlink()
        except OSError:
            pass
        if isinstance(exc, KeyboardInterrupt):
            raise
        reason = str(exc) or type(exc).__name__
        if isinstance(exc, Image.DecompressionBombError):
            reason = (f"too many pixels to open safely (prep opens up to {PREP_MAX_PIXELS // 1_000_000:,} megapixels): "
                      "downscale it in an image editor first")
        if writing and isinstance(exc, OSError):
            reason = f"cannot write the output: {exc.strerror or exc}"
            if exc.errno in OUTPUT_ERRNOS:
                return {"outcome": "failed", "reason": reason, "source": task["rel"], "errno": exc.errno}
        return {"outcome": "failed", "reason": reason, "source": task["rel"]}
    finally:
        Image.MAX_IMAGE_PIXELS = saved_limit
    entry.update({"output_size": final.stat().st_size, "output_sha256": sha256_file(str(final)),
                  "width": width, "height": height, "actions": actions, "outcome": outcome})
    return entry
