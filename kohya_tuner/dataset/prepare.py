"""prepare(): a trainable copy of a dataset folder, never touching the original.

Each image is decoded once, rotated by its EXIF orientation, brought to 8-bit RGB (CMYK
and wide-gamut pictures through their ICC profile, transparency flattened onto white),
and scaled down with Lanczos so its long side is at most the largest bucket; an image
that needs none of this is copied byte for byte. Captions are copied (as UTF-8, one line)
with the trigger word added on request. A manifest records, per output, its source, the
source's SHA-256 and the output's size, so a second run skips what is done and a
changed source is redone. Every file is written under a temporary name and renamed into
place, so an interrupted run leaves no half-written image.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from kohya_tuner import fileio
from kohya_tuner.dataset import guidance
from kohya_tuner.dataset.captions import add_trigger, decode_caption_bytes
from kohya_tuner.dataset.convert import OUTPUT_ERRNOS, OutputUnwritable, output_suffix, prepare_one, tmp_name
from kohya_tuner.dataset.images import sha256_file
from kohya_tuner.dataset.models import PrepItem, PrepResult
from kohya_tuner.dataset.parallel import default_workers, parallel_map
from kohya_tuner.dataset.walk import (MANIFEST_NAME, TMP_SUFFIX, Entry, check_folder, display, guess_caption_extension,
                                      list_dataset)
from kohya_tuner.errors import UserError
from kohya_tuner.families import Family, get_family
from kohya_tuner.resources import user_data_dir

MANIFEST_VERSION = 1
# Bump when the image pipeline changes, so earlier outputs are redone.
PIPELINE_VERSION = 1
OUTPUT_CAPTION_EXTENSION = ".txt"
REGISTRY_NAME = "prepared.json"

ProgressFn = Callable[[int, int, str], None]


def default_max_side(family: Family | str, resolution: int | None = None, max_bucket_reso: int | None = None) -> int:
    """The longest side a bucket can have: for an explicit resolution/bucket range, that
    plan's; otherwise the largest any preset for the family trains at, so the prepared
    copy keeps every pixel a plan could use and drops only what none can."""
    fam = family if isinstance(family, Family) else get_family(family)
    if resolution is None and max_bucket_reso is None:
        return guidance.largest_planned_side(fam)
    return guidance.planned_buckets(fam, resolution, None, max_bucket_reso).largest_side


# ---- the whole folder ----------------------------------------------------------------


def _within(child: Path, parent: Path) -> bool:
    try:
        child.relative_to(parent)
        return True
    except ValueError:
        return False


def _read_json(path: Path) -> dict[str, Any] | None:
    from kohya_tuner import safeio

    try:
        data = json.loads(safeio.read_regular(path, safeio.JOURNAL_BYTES).decode("utf-8"))
        return data if isinstance(data, dict) else None
    except (OSError, ValueError, RecursionError):  # a FIFO or device named like the manifest included
        return None


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(path)
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            # ensure_ascii keeps file names that are not valid UTF-8 as \udcxx escapes.
            json.dump(data, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _check_out(root: Path, out: str | os.PathLike) -> Path:
    out_path = Path(out).expanduser()
    try:
        out_abs = out_path.resolve()
    except (OSError, RuntimeError):
        raise UserError(f"--out {display(str(out))} cannot be resolved (a symbolic link loop?).") from None
    if out_abs == root:
        raise UserError("--out is the source folder itself.",
                        "prep never changes the originals; give a new folder, e.g. "
                        f"{display(str(root))}.prepared")
    if _within(out_abs, root):
        raise UserError(f"--out {display(str(out_abs))} is inside the source folder, which prep never changes.",
                        f"Put it beside the source, e.g. {display(str(root))}.prepared")
    if _within(root, out_abs):
        raise UserError(f"--out {display(str(out_abs))} contains the source folder.",
                        f"Give a new folder beside it, e.g. {display(str(root))}.prepared")
    if os.path.lexists(out_path) and not out_path.is_dir():
        # A link to nothing too: prep never creates a folder where a link points.
        from kohya_tuner.safeio import describe

        raise UserError(f"--out {display(str(out_path))} is {describe(out_path)}, not a folder.")
    if out_abs.exists():
        manifest = _read_json(out_abs / MANIFEST_NAME)
        if manifest is None:
            try:
                has_files = any(out_abs.iterdir())
            except OSError as exc:
                raise UserError(f"--out {display(str(out_abs))} cannot be read: {exc.strerror or exc}.") from None
            if has_files:
                raise UserError(f"--out {display(str(out_abs))} already holds files that kohya-tuner did not write.",
                                "Choose an empty or new folder; nothing there is overwritten.")
        elif manifest.get("source") != str(root):
            raise UserError(f"--out {display(str(out_abs))} is the prepared copy of another folder "
                            f"({display(str(manifest.get('source')))}).", "Choose another --out.")
    return out_abs


def _remove_temp_files(out: Path) -> None:
    if not out.is_dir():
        return
    for dirpath, _dirs, files in os.walk(out):
        for name in files:
            if name.endswith(TMP_SUFFIX):
                try:
                    os.unlink(os.path.join(dirpath, name))
                except OSError:
                    pass


def _plan_outputs(pictures: list[Entry]) -> dict[str, str]:
    """Output path (relative) per source, unique even when two sources share a stem
    ("a.png" and "a.gif"), compared case-insensitively for Windows' sake."""
    taken: set[str] = set()
    out: dict[str, str] = {}
    for e in sorted(pictures, key=lambda e: e.rel):
        stem = os.path.splitext(e.rel)[0]
        suffix = output_suffix(e.rel)
        name = stem + suffix
        if name.lower() in taken or (stem + OUTPUT_CAPTION_EXTENSION).lower() in taken:
            stem = f"{stem}-{hashlib.sha1(e.rel.encode('utf-8', 'surrogateescape')).hexdigest()[:6]}"
            name = stem + suffix
        taken.add(name.lower())
        taken.add((stem + OUTPUT_CAPTION_EXTENSION).lower())
        out[e.rel] = name
    return out


@dataclass
class _Run:
    root: Path
    out: Path
    manifest: dict[str, Any]
    last_write: float = 0.0

    @property
    def path(self) -> Path:
        return self.out / MANIFEST_NAME

    def save(self, complete: bool) -> None:
        self.manifest["complete"] = complete
        self.manifest["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        _write_json_atomic(self.path, self.manifest)
        self.last_write = time.monotonic()


def prepare(src: str | os.PathLike, out: str | os.PathLike, family: Family | str | None = None,
            max_side: int | None = None, trigger: str | None = None, workers: int | None = None,
            progress: ProgressFn | None = None, *, caption_extension: str | None = None) -> PrepResult:
    """Write a prepared copy of `src` into `out` (see the module docstring).

    `max_side` defaults to the largest bucket side for `family`. Raises UserError for a
    source or destination that cannot be used; pictures that cannot be read are left out
    and reported in the result."""
    try:
        return _prepare(src, out, family, max_side, trigger, workers, progress, caption_extension)
    except OSError as exc:
        where = display(str(Path(out).expanduser().absolute()))
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        raise UserError(f"Cannot write the prepared copy in {where}: {fileio.why(exc)}.",
                        f"The originals are untouched; {'free some space' if full else 'choose a writable --out'} "
                        "and run prep again: what was prepared is kept and the rest continues.") from None


def _prepare(src, out, family, max_side, trigger, workers, progress, caption_extension) -> PrepResult:
    t0 = time.monotonic()
    root = check_folder(src)
    if max_side is None:
        if family is None:
            raise UserError("prep needs --model (to know the largest bucket) or --max-side.")
        max_side = default_max_side(family)
    elif family is not None and not isinstance(family, Family):
        get_family(family)
    if int(max_side) < 64:
        raise UserError(f"--max-side {max_side} is too small to train on; sd-scripts buckets start at 256 px.")
    max_side = int(max_side)
    trigger = trigger.strip() if trigger and trigger.strip() else None
    out_abs = _check_out(root, out)
    listing = list_dataset(root)

    cap_ext = caption_extension or guess_caption_extension(listing.entries)
    pictures = [e for e in listing.entries if e.kind in ("image", "convertible")]
    if not pictures:
        raise UserError(f"{display(str(root))} holds no images to prepare.")
    out_abs.mkdir(parents=True, exist_ok=True)
    _remove_temp_files(out_abs)

    old = _read_json(out_abs / MANIFEST_NAME) or {}
    prev_entries: dict[str, Any] = old.get("entries") or {}
    pipeline = {"version": PIPELINE_VERSION, "max_side": max_side}
    run = _Run(root, out_abs, {
        "tool": "kohya-tuner", "manifest_version": MANIFEST_VERSION, "source": str(root),
        "settings": {"max_side": max_side, "trigger": trigger, "caption_extension": cap_ext},
        "caption_extension": OUTPUT_CAPTION_EXTENSION, "entries": dict(prev_entries), "failed": {},
        "complete": False,
    })
    run.save(complete=False)  # a read-only or full --out fails here, before any image is written
    targets = _plan_outputs(pictures)
    tasks = [{"src": str(root / e.rel), "rel": e.rel, "out_rel": targets[e.rel], "dst": str(out_abs / targets[e.rel]),
              "max_side": max_side, "pipeline": pipeline, "prev": prev_entries.get(e.rel)} for e in pictures]

    items: list[PrepItem | None] = [None] * len(tasks)

    def on_result(i: int, res: dict[str, Any]) -> None:
        rel = tasks[i]["rel"]
        outcome = res.pop("outcome")
        if outcome == "failed" and res.get("errno") in OUTPUT_ERRNOS:
            raise OutputUnwritable(res["errno"], res.get("reason"))
        if outcome == "failed":
            run.manifest["failed"][rel] = res.get("reason")
            run.manifest["entries"].pop(rel, None)
            items[i] = PrepItem(source=display(rel), outcome="failed", reason=res.get("reason"))
        else:
            run.manifest["entries"][rel] = res
            run.manifest["failed"].pop(rel, None)
            items[i] = PrepItem(source=display(rel), output=display(res["output"]), outcome=outcome,
                                actions=res.get("actions") if outcome != "skipped" else [])
        if time.monotonic() - run.last_write > 2.0:
            run.save(complete=False)

    n_workers = min(workers or default_workers(), len(tasks))
    try:
        parallel_map(prepare_one, tasks, workers=n_workers,
                     progress=(lambda d, t, i: progress(d, t, display(tasks[i]["rel"]))) if progress else None,
                     on_result=on_result)
    except BaseException:
        _save_quietly(run)
        _remove_temp_files(out_abs)
        raise

    result = PrepResult(source=display(str(root)), out=display(str(out_abs)), manifest=display(str(run.path)),
                        max_side=max_side, trigger=trigger, items=[i for i in items if i is not None],
                        workers=n_workers)
    current = {e.rel for e in pictures}
    try:
        _copy_captions(run, current, cap_ext, trigger, prev_entries, result)
        _remove_gone(run, current, result)
    except BaseException:
        _save_quietly(run)
        raise
    run.save(complete=True)
    _register(root, out_abs)
    result.elapsed_s = time.monotonic() - t0
    return result


def _save_quietly(run: _Run) -> None:
    """Record progress on the way out of a failure; on a full disk that may fail too, and
    the failure being reported matters more."""
    try:
        run.save(complete=False)
    except OSError:
        pass


def _caption_text(path: Path) -> str | None:
    """The caption's text; OSError (with why) when a caption is there but cannot be read."""
    from kohya_tuner import safeio
    from kohya_tuner.dataset.captions import _CAPTION_LIMIT

    # A pipe or device named like a caption would block the read or never end: read_regular refuses it.
    raw = safeio.read_regular(path, _CAPTION_LIMIT)
    text = decode_caption_bytes(raw)
    # sd-scripts trains on the first line only; keep everything the user wrote.
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def _copy_captions(run: _Run, current: set[str], cap_ext: str, trigger: str | None, prev_entries: dict[str, Any],
                   result: PrepResult) -> None:
    for rel, entry in run.manifest["entries"].items():
        if rel not in current or not entry.get("output"):
            continue
        src_cap = run.root / (os.path.splitext(rel)[0] + cap_ext)
        out_cap_rel = os.path.splitext(entry["output"])[0] + OUTPUT_CAPTION_EXTENSION
        out_cap = run.out / out_cap_rel
        text: str | None = None
        try:
            cst = src_cap.stat()
            entry["caption_source_size"], entry["caption_source_mtime_ns"] = cst.st_size, cst.st_mtime_ns
            text = _caption_text(src_cap)
        except OSError as exc:
            entry.pop("caption_source_size", None)
            entry.pop("caption_source_mtime_ns", None)
            if os.path.lexists(src_cap):  # there, but not readable: say so instead of dropping it quietly
                from kohya_tuner import safeio

                why = exc.strerror or str(exc)
                why = f"too large for a caption ({why})" if isinstance(exc, safeio.TooLarge) else why
                result.captions_unreadable.append(f"{display(os.path.splitext(rel)[0] + cap_ext)}: {why}")
                entry["caption_unreadable"] = why
            else:
                entry.pop("caption_unreadable", None)
        if trigger:
            new = add_trigger(text, trigger)
            if new != (text or None):
                result.trigger_added += 1
            text = new
        recorded = (prev_entries.get(rel) or {}).get("caption_sha256")
        existing = sha256_file(str(out_cap)) if out_cap.is_file() else None
        # A caption in the copy that differs from what the last run wrote (or that the
        # last run did not write at all) was edited there by hand: that edit wins.
        edited = existing is not None and (existing != recorded if recorded else rel in prev_entries)
        if edited:
            result.captions_kept.append(display(out_cap_rel))
            entry["caption_output"], entry["caption_sha256"] = out_cap_rel, existing
            continue
        if not text:
            if existing is not None:
                out_cap.unlink()
            entry.pop("caption_output", None)
            entry.pop("caption_sha256", None)
            continue
        data = (text + "\n").encode("utf-8")
        digest = hashlib.sha256(data).hexdigest()
        if existing != digest:
            tmp = tmp_name(out_cap)
            try:
                tmp.write_bytes(data)
                # The copy is readable by no one the caption (or a link's target) was not.
                os.chmod(tmp, fileio.copied_mode(src_cap))
                os.replace(tmp, out_cap)
            finally:
                if tmp.exists():
                    tmp.unlink()
            result.captions_written += 1
        entry["caption_output"], entry["caption_sha256"] = out_cap_rel, digest


def _remove_gone(run: _Run, current: set[str], result: PrepResult) -> None:
    """Drop outputs whose source was deleted, unless they were edited in the copy."""
    for rel in list(run.manifest["entries"]):
        if rel in current:
            continue
        entry = run.manifest["entries"].pop(rel)
        out_img = run.out / entry.get("output", "")
        if entry.get("output") and out_img.is_file():
            if sha256_file(str(out_img)) == entry.get("output_sha256"):
                out_img.unlink()
                result.removed.append(display(entry["output"]))
        cap = entry.get("caption_output")
        if cap and (run.out / cap).is_file() and sha256_file(str(run.out / cap)) == entry.get("caption_sha256"):
            (run.out / cap).unlink()
    for rel in list(run.manifest["failed"]):
        if rel not in current:
            run.manifest["failed"].pop(rel)


# ---- finding a prepared copy -----------------------------------------------------------


@dataclass(frozen=True)
class PreparedCopy:
    path: Path
    complete: bool
    # The source still matches what was prepared (same files, sizes, times).
    fresh: bool
    stale: tuple[str, ...] = ()


def _registry_path() -> Path:
    return user_data_dir() / REGISTRY_NAME


def _register(root: Path, out: Path) -> None:
    try:
        reg = _read_json(_registry_path()) or {}
        reg[str(root)] = str(out)
        _write_json_atomic(_registry_path(), reg)
    except OSError:
        pass  # the sibling-folder convention still finds the usual case


def prepared_copy(src: str | os.PathLike) -> PreparedCopy | None:
    """The prepared copy of `src`, if one exists: the folder last written by prepare()
    for it, or `<src>.prepared` beside it."""
    try:
        root = Path(src).expanduser().resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    candidates = []
    reg = _read_json(_registry_path()) or {}
    if isinstance(reg.get(str(root)), str):
        candidates.append(Path(reg[str(root)]))
    candidates.append(root.with_name(root.name + ".prepared"))
    for cand in candidates:
        manifest = _read_json(cand / MANIFEST_NAME)
        if not manifest or manifest.get("source") != str(root):
            continue
        complete = bool(manifest.get("complete"))
        stale = _staleness(root, manifest) if complete else ("the last prep run did not finish",)
        return PreparedCopy(cand, complete, complete and not stale, tuple(stale))
    return None


def find_prepared(src: str | os.PathLike) -> Path | None:
    """The prepared copy to train from instead of `src`: complete and up to date with the
    source, else None."""
    copy = prepared_copy(src)
    return copy.path if copy and copy.fresh else None


def _staleness(root: Path, manifest: dict[str, Any]) -> list[str]:
    try:
        listing = list_dataset(root)
    except UserError as exc:
        return [exc.message]
    entries = manifest.get("entries") or {}
    failed = manifest.get("failed") or {}
    cap_ext = (manifest.get("settings") or {}).get("caption_extension", ".txt")
    reasons: list[str] = []
    pictures = [e for e in listing.entries if e.kind in ("image", "convertible")]
    names = {e.rel for e in pictures}
    new = [e.rel for e in pictures if e.rel not in entries and e.rel not in failed]
    if new:
        reasons.append(f"{len(new)} new image(s) in the source")
    gone = [r for r in entries if r not in names]
    if gone:
        reasons.append(f"{len(gone)} image(s) removed from the source")
    changed = 0
    captions_changed = 0
    for rel, entry in entries.items():
        if rel not in names:
            continue
        try:
            st = (root / rel).stat()
        except OSError:
            changed += 1
            continue
        if st.st_size != entry.get("source_size") or st.st_mtime_ns != entry.get("source_mtime_ns"):
            changed += 1
        cap = root / (os.path.splitext(rel)[0] + cap_ext)
        try:
            cst = cap.stat()
            now = (cst.st_size, cst.st_mtime_ns)
        except OSError:
            now = None
        then = (entry["caption_source_size"], entry["caption_source_mtime_ns"]) \
            if "caption_source_size" in entry else None
        if now != then:
            captions_changed += 1
    if changed:
        reasons.append(f"{changed} image(s) changed since prep")
    if captions_changed:
        reasons.append(f"{captions_changed} caption(s) changed since prep")
    return reasons
