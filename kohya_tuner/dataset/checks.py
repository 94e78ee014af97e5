"""scan() a dataset folder and check() it against a job and a model family.

scan() looks at every file once (Pillow decode, hash, caption) and reports what is wrong
with the files themselves; check() adds what depends on the training plan: image count
for the job, sizes against the training resolution and bucket range, the trigger word.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from typing import Callable, Iterable

from kohya_tuner.dataset import guidance
from kohya_tuner.dataset.captions import has_trigger, near_duplicate_groups, read_caption
from kohya_tuner.dataset.images import inspect_image, trainer_sees_suffix
from kohya_tuner.dataset.models import DatasetReport, Finding, ImageInfo, Subset
from kohya_tuner.dataset.parallel import parallel_map
from kohya_tuner.dataset.walk import Entry, check_folder, display, guess_caption_extension, list_dataset
from kohya_tuner.families import Family, get_family

ProgressFn = Callable[[int, int, str], None]

# Per-file problems: code -> (severity, what it means, how to fix it).
PROBLEMS: dict[str, tuple[str, str, str]] = {
    "unreadable": ("fail", "cannot be read",
                   "Fix the permissions (or the broken link), or move the files out of the folder."),
    "not_an_image": ("fail", "have an image extension but are not images sd-scripts can open",
                     "Remove or replace them: sd-scripts stops at the first one. `dataset prep` leaves them out."),
    "corrupt": ("fail", "are damaged and fail to decode",
                "Re-export or remove them: sd-scripts stops at the first one. `dataset prep` leaves them out."),
    "truncated": ("fail", "are truncated (an interrupted download or copy)",
                  "Copy them again or remove them: sd-scripts stops at the first one. `dataset prep` leaves them out."),
    "too_many_pixels": ("fail", "have more pixels than Pillow opens by default (about 179 megapixels), so "
                        "sd-scripts refuses them", "Downscale them: `kohya-tuner dataset prep` does."),
    "caption_unreadable": ("fail", "have a caption file that cannot be read (no permission, a pipe or "
                           "device, or a file too large for a caption)",
                           "Make each one a readable text file of a few lines (`--all` lists them with why)."),
    "caption_encoding": ("fail", "have a caption file that is not UTF-8, which stops sd-scripts",
                         "Save the captions as UTF-8; `dataset prep` converts them."),
    "caption_no_lines": ("fail", "have a zero-byte caption file, which stops sd-scripts (\"caption file is empty\")",
                         "Write a caption or delete the empty file; `dataset prep` handles both."),
    "convertible": ("warn", "are in a format sd-scripts does not pick up (GIF, TIFF, AVIF, HEIC, ...)",
                    "`kohya-tuner dataset prep` converts them to PNG."),
    "extension_case": ("warn", "have a mixed-case extension (like .Jpg) that sd-scripts does not match on Linux",
                       "Rename them to lower case; `dataset prep` does."),
    "cmyk": ("warn", "are CMYK; sd-scripts converts them to RGB without the colour profile, so colours shift",
             "`dataset prep` converts them through their ICC profile."),
    "sixteen_bit": ("warn", "are 16-bit greyscale; sd-scripts' conversion to RGB clips them to near-white",
                    "`dataset prep` scales them to 8 bits."),
    "animated": ("warn", "are animated; only the first frame is trained", "Export the frames you want as images."),
    "alpha": ("warn", "have transparent pixels; sd-scripts drops the alpha channel, so transparent areas train as "
              "whatever colour is hidden there (often black)",
              "`dataset prep` flattens them onto white; or set alpha_mask = true in the dataset to leave transparent "
              "areas out of the loss."),
    "exif_rotated": ("warn", "are stored rotated with an EXIF orientation tag, which sd-scripts ignores: they train "
                     "sideways or upside down", "`dataset prep` applies the rotation."),
    # The three size problems get their numbers and consequences from check().
    "huge": ("warn", "are far larger than the training resolution",
             "`dataset prep` downscales them (Lanczos) to the largest bucket."),
    "too_small": ("fail", "have a side shorter than the bucket step",
                  "Replace them with larger originals, or train from `kohya-tuner dataset prep`'s copy, which "
                  "upscales them (or leaves them out when they are too small to upscale)."),
    "tiny": ("warn", "are well below the training resolution", "Replace them with larger originals if you have them."),
    "extreme_aspect": ("warn", "have an extreme aspect ratio",
                       "Crop them to the part that matters, or widen the bucket range (min/max_bucket_reso)."),
    "caption_missing": ("warn", "have no caption file; sd-scripts trains them on the subset's class_tokens, or on "
                        "an empty caption", "Write captions, or run `dataset prep --trigger WORD`, which captions "
                        "them with the trigger."),
    "caption_empty": ("warn", "have a caption file whose first line is blank: they train with an empty caption",
                      "Write the caption on the first line."),
    "caption_bom": ("warn", "have a caption starting with a byte-order mark, which sd-scripts keeps as part of "
                    "the first word", "Save without BOM; `dataset prep` strips it."),
    "caption_multiline": ("warn", "have captions on several lines; sd-scripts trains only the first line "
                          "(unless enable_wildcard = true)", "Put the caption on one line; `dataset prep` joins "
                          "the lines."),
    "trigger_missing": ("warn", "have captions without the trigger word, so the LoRA does not tie what it learns "
                        "from them to the trigger", "Add it, or run `dataset prep --trigger WORD`, which adds it."),
}

_ORDER = list(PROBLEMS)


def layout(path: str | os.PathLike) -> list[Subset]:
    """The subsets sd-scripts will read from a folder, with how many image files each
    holds, from file names alone (instant; nothing is decoded). One subset for a plain
    folder; one per `<repeats>_<class tokens>` folder in the kohya_ss layout, whose
    repeats and class tokens a dataset TOML must carry over."""
    root = check_folder(path)
    listing = list_dataset(root)
    counts: dict[str, int] = defaultdict(int)
    for e in listing.entries:
        if e.kind == "image" and trainer_sees_suffix(e.rel):
            counts[e.subset] += 1
    return [Subset(dir=display(s.rel), repeats=s.repeats, class_tokens=s.class_tokens, images=counts.get(s.rel, 0))
            for s in listing.subsets]


def count_images(path: str | os.PathLike) -> int:
    """Image files sd-scripts will pick up in the folder (by name; see layout())."""
    return sum(s.images for s in layout(path))


def _inspect_task(args: tuple[str, bool]) -> dict:
    path, want_hash = args
    return inspect_image(path, want_hash)


def scan(path: str | os.PathLike, *, caption_extension: str | None = None, workers: int | None = None,
         progress: ProgressFn | None = None) -> DatasetReport:
    """Every image and caption in a dataset folder, with what is wrong with each file.

    Raises UserError when the path is not a readable, non-empty folder."""
    root = check_folder(path)
    listing = list_dataset(root)
    entries = listing.entries
    cap_ext = caption_extension or guess_caption_extension(entries)
    by_rel = {e.rel: e for e in entries}

    pictures = [e for e in entries if e.kind in ("image", "convertible")]
    results = parallel_map(_inspect_task, [(str(root / e.rel), True) for e in pictures], workers=workers,
                           progress=(lambda done, total, i: progress(done, total, pictures[i].shown))
                           if progress else None)

    images: list[ImageInfo] = []
    used_captions: set[str] = set()
    for entry, res in zip(pictures, results):
        info = ImageInfo(path=entry.shown, **{k: v for k, v in res.items() if k in ImageInfo.model_fields})
        if entry.kind == "convertible":
            info.problems.insert(0, "convertible")
            info.seen_by_trainer = False
        elif not trainer_sees_suffix(entry.rel):
            info.problems.insert(0, "extension_case")
            info.seen_by_trainer = False
        cap_rel = os.path.splitext(entry.rel)[0] + cap_ext
        if cap_rel in by_rel:
            used_captions.add(cap_rel)
            info.caption_path = display(cap_rel)
            read = read_caption(str(root / cap_rel))
            info.caption = read.text
            info.problems.extend(read.problems)
        elif info.loadable:
            info.problems.append("caption_missing")
        images.append(info)

    other = [e.shown for e in entries if e.kind == "other"]
    orphans = [e.shown for e in entries if e.kind == "caption" and e.rel not in used_captions
               and e.rel.endswith(cap_ext)]
    other_ext_captions = [e for e in entries if e.kind == "caption" and not e.rel.endswith(cap_ext)]

    counts_by_subset: dict[str, int] = defaultdict(int)
    for e, info in zip(pictures, images):
        if info.trainable:
            counts_by_subset[e.subset] += 1
    report = DatasetReport(
        root=display(str(root)),
        images=images,
        other_files=other,
        orphan_captions=orphans,
        subsets=[Subset(dir=display(s.rel), repeats=s.repeats, class_tokens=s.class_tokens,
                        images=counts_by_subset.get(s.rel, 0)) for s in listing.subsets],
        caption_extension=cap_ext,
    )
    report.findings = _file_findings(report, listing, other_ext_captions)
    return report


def _problem_findings(images: Iterable[ImageInfo], codes: Iterable[str],
                      details: dict[str, str] | None = None) -> list[Finding]:
    by_code: dict[str, list[str]] = defaultdict(list)
    for info in images:
        for code in info.problems:
            by_code[code].append(info.path)
    out = []
    for code in codes:
        files = by_code.get(code)
        if not files:
            continue
        severity, what, fix = PROBLEMS[code]
        extra = (details or {}).get(code, "")
        message = f"{_files(len(files))} {_verb(what, len(files))}{extra}."
        out.append(Finding(code=code, severity=severity, message=message, fix=fix, files=files))
    return out


def _files(n: int) -> str:
    return f"{n} file" if n == 1 else f"{n} files"


def _verb(what: str, n: int) -> str:
    """The PROBLEMS texts are written for several files; fit the verb to one."""
    if n == 1:
        for plural, singular in (("have ", "has "), ("are ", "is ")):
            if what.startswith(plural):
                return singular + what[len(plural):]
    return what


# Judged by check() against the training plan; the rest are facts about the files.
_PLAN_CODES = ("too_small", "huge", "tiny", "extreme_aspect", "trigger_missing")
_FILE_CODES = [c for c in _ORDER if c not in _PLAN_CODES]


def _file_findings(report: DatasetReport, listing, other_ext_captions: list[Entry]) -> list[Finding]:
    findings = _problem_findings(report.images, _FILE_CODES)
    trainable = report.trainable
    if not trainable:
        findings.insert(0, Finding(
            code="no_trainable", severity="fail",
            message=f"Nothing here can be trained: none of the {len(report.images)} picture file(s) is an image "
                    "sd-scripts can load." if report.images else "Nothing here can be trained: no image files.",
            fix="Put .png/.jpg/.jpeg/.webp/.bmp images in the folder (or run `dataset prep` to convert other "
                "formats)."))
    else:
        broken = sum(1 for i in report.images if not i.loadable)
        findings.insert(0, Finding(
            code="images", severity="pass",
            message=f"{len(trainable)} image(s) load as sd-scripts will read them"
                    + (f" ({broken} other file(s) do not)." if broken else ".")))
        captioned = [i for i in trainable if i.caption]
        if len(captioned) == len(trainable):
            findings.append(Finding(code="captions", severity="pass",
                                    message=f"Every image has a {report.caption_extension} caption."))
    if len(report.subsets) > 1 or report.subsets and report.subsets[0].repeats is not None:
        parts = ", ".join(f"{s.dir} ({s.images} images)" for s in report.subsets)
        findings.append(Finding(code="layout", severity="pass",
                                message=f"kohya_ss folder layout (<repeats>_<class tokens>): {parts}."))

    dupes = _duplicates(trainable)
    if dupes:
        files = [p for group in dupes for p in group]
        findings.append(Finding(
            code="duplicate_images", severity="warn",
            message=f"{len(files)} files are byte-identical copies ({len(dupes)} group(s)); each copy trains that "
                    "image again.", fix="Delete the extra copies.", files=files))

    captions = {i.path: i.caption for i in trainable if i.caption}
    groups = near_duplicate_groups(captions)
    if groups and len(captions) >= 3:
        files = [p for g in groups for p in g]
        biggest = groups[0]
        findings.append(Finding(
            code="near_duplicate_captions", severity="warn",
            message=f"{len(files)} captions are (nearly) the same as another ({len(groups)} group(s); the largest has "
                    f"{len(biggest)}, e.g. \"{_short(captions[biggest[0]])}\"). Captions that never change cannot "
                    "tell the LoRA what varies between images and what the subject is.",
            fix="Describe what differs in each image (pose, clothes, background, lighting) and keep the trigger "
                "word the same.", files=files))
    if other_ext_captions:
        findings.append(Finding(
            code="caption_extension_mixed", severity="warn",
            message=f"{len(other_ext_captions)} caption file(s) use another extension than "
                    f"{report.caption_extension}; sd-scripts reads one caption_extension per subset.",
            fix="Rename them, or set caption_extension to the one you use.",
            files=[e.shown for e in other_ext_captions]))
    if report.orphan_captions:
        findings.append(Finding(
            code="orphan_captions", severity="warn",
            message=f"{len(report.orphan_captions)} caption file(s) have no image with the same name.",
            fix="An image was renamed or removed; rename the caption to match or delete it.",
            files=report.orphan_captions))
    if report.other_files:
        findings.append(Finding(
            code="other_files", severity="warn",
            message=(f"{len(report.other_files)} files are neither images nor captions" if len(report.other_files) > 1
                     else "1 file is neither an image nor a caption") + "; sd-scripts ignores them.",
            fix="Move them out of the dataset folder to keep it clear.", files=report.other_files))
    if listing.nested:
        findings.append(Finding(
            code="nested_ignored", severity="warn",
            message=f"{len(listing.nested)} image(s) sit in places sd-scripts does not read (it reads one folder "
                    "per subset, not subfolders).",
            fix="Move them into the dataset folder, or give each folder its own subset.",
            files=[display(p) for p in listing.nested]))
    if listing.linked_dirs:
        findings.append(Finding(
            code="linked_folder", severity="warn",
            message=f"{len(listing.linked_dirs)} link(s) to a folder are not followed: their images are not trained "
                    "(links to files are).",
            fix="Put the folder itself there instead of a link, or give the link's target as its own dataset.",
            files=[display(p) for p in listing.linked_dirs]))
    if listing.hidden:
        findings.append(Finding(
            code="hidden_ignored", severity="warn",
            message=f"{len(listing.hidden)} picture(s) have a name starting with a dot, which sd-scripts does not "
                    "read.", fix="Rename them without the leading dot if they should train.",
            files=[display(p) for p in listing.hidden]))
    if listing.unlistable:
        findings.append(Finding(
            code="unlistable", severity="warn",
            message=f"{len(listing.unlistable)} folder(s) could not be read: "
                    + "; ".join(f"{display(p)}: {why}" for p, why in listing.unlistable[:3]),
            fix="Fix their permissions or remove the looping links.",
            files=[display(p) for p, _ in listing.unlistable]))
    return findings


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _duplicates(images: list[ImageInfo]) -> list[list[str]]:
    by_hash: dict[str, list[str]] = defaultdict(list)
    for i in images:
        if i.sha256:
            by_hash[i.sha256].append(i.path)
    return [sorted(v) for v in by_hash.values() if len(v) > 1]


def _resolve_family(family: Family | str | None) -> Family | None:
    if family is None or isinstance(family, Family):
        return family
    return get_family(family)


def evaluate(report: DatasetReport, job: str | None, family: Family | str | None, trigger: str | None = None,
             resolution: int | None = None, min_bucket_reso: int | None = None,
             max_bucket_reso: int | None = None, bucket_no_upscale: bool | None = None) -> DatasetReport:
    """check()'s judgement of a scanned folder, as a new report. Pure.

    Sizes are judged against what the family's preset trains at (resolution, bucket
    range, bucket_no_upscale), unless the arguments say otherwise."""
    fam = _resolve_family(family)
    if job is not None:
        job = guidance.get_job(job).job
    plan = guidance.planned_buckets(fam, resolution, min_bucket_reso, max_bucket_reso, bucket_no_upscale)
    res = plan.resolution
    buckets = plan.buckets()
    limit = plan.max_aspect
    trigger = trigger.strip() if trigger and trigger.strip() else None

    images = []
    for info in report.images:
        info = info.model_copy(deep=True)
        info.problems = [p for p in info.problems if p not in _PLAN_CODES]
        if info.loadable and info.width and info.height:
            # Scale to reach the training area: with bucket_no_upscale sd-scripts only
            # ever shrinks, otherwise it scales to cover the closest-aspect bucket.
            area_scale = res / math.sqrt(info.width * info.height)
            if plan.no_upscale:
                scale = area_scale
            else:
                scale = guidance.bucket_scale(info.width, info.height,
                                              guidance.bucket_for(info.width, info.height, buckets))
            if plan.no_upscale and min(info.width, info.height) < plan.step:
                info.problems.append("too_small")
            elif scale < 0.5:
                info.problems.append("huge")
            elif scale > 1.5:
                info.problems.append("tiny")
            if info.aspect > limit * 1.001:
                info.problems.append("extreme_aspect")
        if trigger and info.trainable and info.caption and not has_trigger(info.caption, trigger):
            info.problems.append("trigger_missing")
        images.append(info)

    out = report.model_copy(update={
        "images": images, "job": job, "family": fam.name if fam else None, "resolution": res,
        "min_bucket_reso": plan.min_bucket, "max_bucket_reso": plan.max_bucket,
        "bucket_no_upscale": plan.no_upscale, "trigger": trigger,
    })
    findings = [f for f in report.findings if f.code not in _PLAN_CODES + ("count", "sizes", "trigger")]
    trainable = out.trainable
    unique = len({i.sha256 or i.path for i in trainable})
    if trainable:
        severity, message, fix = guidance.count_verdict(unique, job)
        findings.insert(1, Finding(code="count", severity=severity, message=message, fix=fix))
    bucket_text = f"buckets of {plan.min_bucket}-{plan.max_bucket} px at {res} px"
    plan_findings = _problem_findings(images, _PLAN_CODES, {
        # sd-scripts rounds a bucket side down to the step (library/train_util.py:337-338,
        # BucketManager.select_bucket), so a side below it gives a 0 px bucket and line 345 divides by it.
        "too_small": f" ({plan.step} px): with bucket_no_upscale sd-scripts rounds that side down to a 0 px bucket "
                     "and stops with a division by zero",
        "huge": f" (over twice the {res} px training size per side): slow to load and cache, heavy on host RAM, "
                "and no sharper once scaled down",
        "tiny": f" (over 1.5x smaller per side than {res} px)" + (
            ": with bucket_no_upscale they train at their own size, with less detail than the rest"
            if plan.no_upscale else ": sd-scripts upscales them, which blurs them"),
        "extreme_aspect": f" (beyond {limit:.2f}:1, the most {bucket_text} hold)" + (
            ": with bucket_no_upscale each trains alone in an odd-shaped bucket" if plan.no_upscale
            else ": sd-scripts crops them to the nearest bucket"),
    })
    findings.extend(plan_findings)
    if trainable and not any(f.code in ("too_small", "huge", "tiny", "extreme_aspect") for f in plan_findings):
        findings.append(Finding(code="sizes", severity="pass",
                                message=f"Image sizes suit training at {res} px ({bucket_text})."))
    if trigger and trainable:
        missing = sum(1 for i in images if "trigger_missing" in i.problems)
        uncaptioned = sum(1 for i in trainable if not i.caption)
        if not missing and uncaptioned < len(trainable):
            findings.append(Finding(code="trigger", severity="pass",
                                    message=f"Every caption contains the trigger word \"{trigger}\"."))
    out.findings = _sorted(findings)
    return out


def _sorted(findings: list[Finding]) -> list[Finding]:
    rank = {"fail": 0, "warn": 1, "pass": 2}
    return sorted(findings, key=lambda f: rank[f.severity])


def check(path: str | os.PathLike, job: str | None, family: Family | str | None, trigger: str | None = None,
          resolution: int | None = None, *, min_bucket_reso: int | None = None, max_bucket_reso: int | None = None,
          bucket_no_upscale: bool | None = None, caption_extension: str | None = None, workers: int | None = None,
          progress: ProgressFn | None = None) -> DatasetReport:
    """scan() the folder and judge it for `job` on `family` at `resolution` and bucket
    range (by default what the family's preset trains at)."""
    if job is not None:
        guidance.get_job(job)  # bad names fail before the slow part
    _resolve_family(family)
    report = scan(path, caption_extension=caption_extension, workers=workers, progress=progress)
    return evaluate(report, job, family, trigger, resolution, min_bucket_reso, max_bucket_reso, bucket_no_upscale)
