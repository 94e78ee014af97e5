"""`kohya-tuner dataset check|prep`: judge an image folder, or write a trainable copy."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Optional

from kohya_tuner.cli.argtypes import int_range, positive_int, utf8_text

DESCRIPTION = "Check an image folder for what makes LoRAs fail or run out of memory, and prepare a clean copy."
CHECK_HELP = ("Read every image and caption the way sd-scripts will, and report: broken, rotated, CMYK, 16-bit, "
              "transparent or animated images, sizes against the training resolution and buckets, missing "
              "captions or trigger word, near-identical captions, and the image count for the job. Exit 0 with "
              "warnings; 2 when nothing in the folder can be trained.")
PREP_HELP = ("Write a prepared copy of the folder (the originals are never changed): images rotated upright, "
             "8-bit RGB, downscaled (Lanczos) to the largest bucket; captions copied, the trigger added with "
             "--trigger; a manifest of sources and hashes. Run it again to pick up changes; Ctrl-C is safe.")
_MARK = {"pass": "[green]pass[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[bold red]fail[/bold red]"}
# A side in pixels: sd-scripts' buckets live between 64 and a few thousand px.
_pixels = int_range(64, 16384)


def _caption_ext(value: str) -> str:
    """A caption suffix (".txt", "caption"): never a picture's, whose bytes would be read as text."""
    from kohya_tuner.dataset.images import CONVERTIBLE_EXTENSIONS, TRAINER_EXTENSIONS

    ext = value.strip()
    ext = ext if ext.startswith(".") else "." + ext
    if not ext.strip(".") or any(c in ext for c in "/\\*?"):
        raise argparse.ArgumentTypeError(f"{value!r} is no file extension; give one like .txt or .caption")
    if ext.lower() in TRAINER_EXTENSIONS + CONVERTIBLE_EXTENSIONS:
        raise argparse.ArgumentTypeError(f"{value!r} is a picture's extension; captions are text files "
                                         "beside the images, like .txt or .caption")
    return ext


def add_arguments(p: argparse.ArgumentParser) -> None:
    from kohya_tuner.cli.app import formatter

    sub = p.add_subparsers(dest="action", metavar="{check,prep}", required=True,
                           parser_class=type(p))
    c = sub.add_parser("check", help="Judge an image folder the way sd-scripts will read it.",
                       description=CHECK_HELP, formatter_class=formatter)
    c.add_argument("path", type=Path, metavar="DIR", help="The folder with the training images (and caption files).")
    c.add_argument("--model", "-m", required=True, help="Model family: sd15, sdxl, flux, sd2, sd3, sd35m, sd35l, chroma, lumina2, hunyuan21 or anima.")
    c.add_argument("--job", "-j", help="character, style or concept: sets the image-count guide.")
    c.add_argument("--trigger", type=utf8_text, metavar="WORD", help="Trigger word every caption should contain.")
    c.add_argument("--resolution", type=_pixels, metavar="PX", help="Training resolution (default: the model preset's).")
    c.add_argument("--max-bucket", type=_pixels, metavar="PX", help="max_bucket_reso (default: the model preset's).")
    c.add_argument("--min-bucket", type=_pixels, metavar="PX", help="min_bucket_reso (default: the model preset's).")
    c.add_argument("--caption-ext", type=_caption_ext, metavar="EXT",
                   help="Caption extension (default: .txt, or .caption when the folder uses it).")
    c.add_argument("--workers", type=positive_int, metavar="N", help="Processes reading images (default: all cores).")
    c.add_argument("--all", dest="all_files", action="store_true", help="List every file of each finding.")
    c.add_argument("--json", action="store_true", help="Print one JSON object.")
    r = sub.add_parser("prep", help="Write a clean, downscaled copy to train from.", description=PREP_HELP,
                       formatter_class=formatter)
    r.add_argument("path", type=Path, metavar="DIR", help="The folder with the original images; it is only read.")
    r.add_argument("--out", "-o", dest="out_dir", type=Path, metavar="DIR",
                   help="Where to write the copy (default: <folder>.prepared beside it).")
    r.add_argument("--model", "-m", help="Model family (sets the default --max-side).")
    r.add_argument("--max-side", type=_pixels, metavar="PX",
                   help="Longest side of the prepared images (default: the largest bucket the model's presets use).")
    r.add_argument("--trigger", type=utf8_text, metavar="WORD",
                   help="Add this trigger word to every caption (and caption uncaptioned images with it).")
    r.add_argument("--caption-ext", type=_caption_ext, metavar="EXT",
                   help="Caption extension of the originals (default: .txt, or .caption when the folder uses it).")
    r.add_argument("--workers", type=positive_int, metavar="N", help="Processes (default: all cores).")
    r.add_argument("--json", action="store_true", help="Print one JSON object.")


def run(args: argparse.Namespace) -> int:
    if args.action == "check":
        return check_command(args.path, args.model, args.job, args.trigger, args.resolution, args.max_bucket,
                             args.min_bucket, args.caption_ext, args.workers, args.all_files, args.json)
    return prep_command(args.path, args.out_dir, args.model, args.max_side, args.trigger, args.caption_ext,
                        args.workers, args.json)


def _progress(transient: bool = True):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from kohya_tuner.cli.common import console

    # No refresh thread (auto_refresh off; each update redraws): with no other thread
    # alive the worker pool can fork, which is the fastest start.
    return Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeRemainingColumn(), console=console, transient=transient, auto_refresh=False)


def check_command(path: Path, model: str, job: Optional[str], trigger: Optional[str], resolution: Optional[int],
                  max_bucket: Optional[int], min_bucket: Optional[int], caption_ext: Optional[str],
                  workers: Optional[int], all_files: bool, json_out: bool) -> int:
    from kohya_tuner import dataset
    from kohya_tuner.cli.common import err_console, print_json
    from kohya_tuner.families import get_family

    family = get_family(model)
    if job is not None:
        dataset.get_job(job)
    _bucket_flags_agree(family, resolution, min_bucket, max_bucket)
    try:
        report = _run_check(path, job, family, trigger, resolution, min_bucket, max_bucket, caption_ext, workers,
                            json_out)
    except KeyboardInterrupt:
        err_console.print("[yellow]Interrupted.[/yellow] Nothing was changed.", soft_wrap=True)
        return 130
    if json_out:
        print_json(report.to_json())
    else:
        _render_check(report, all_files)
    if not report.trainable:
        return 2
    return 0


def _bucket_flags_agree(family, resolution: Optional[int], min_bucket: Optional[int],
                        max_bucket: Optional[int]) -> None:
    """Bucket bounds given here that do not hold the training resolution are what sd-scripts
    refuses at start-up (min_bucket_reso_above_resolution, max_bucket_reso_below_resolution):
    judging the images against a range nobody will train at would only mislead."""
    from kohya_tuner.dataset.guidance import planned_buckets
    from kohya_tuner.errors import UserError

    res = planned_buckets(family, resolution).resolution
    if min_bucket is not None and max_bucket is not None and min_bucket > max_bucket:
        raise UserError(f"--min-bucket {min_bucket} is above --max-bucket {max_bucket}.", "Swap them.")
    for flag, value, side in (("--min-bucket", min_bucket, "above"), ("--max-bucket", max_bucket, "below")):
        if value is not None and (value > res if side == "above" else value < res):
            raise UserError(f"{flag} {value} is {side} the training resolution {res}; sd-scripts refuses a bucket "
                            f"range that does not hold the resolution.", "Give a range around it, or set --resolution.")


def _run_check(path: Path, job: Optional[str], family, trigger: Optional[str], resolution: Optional[int],
               min_bucket: Optional[int], max_bucket: Optional[int], caption_ext: Optional[str],
               workers: Optional[int], quiet: bool):
    from kohya_tuner import dataset

    kwargs: dict[str, Any] = dict(min_bucket_reso=min_bucket, max_bucket_reso=max_bucket, caption_extension=caption_ext,
                  workers=workers)
    if quiet:
        return dataset.check(path, job, family, trigger, resolution, **kwargs)
    with _progress() as bar:
        task = bar.add_task("reading images", total=None)
        return dataset.check(path, job, family, trigger, resolution, **kwargs,
                             progress=lambda done, total, _name: bar.update(task, completed=done, total=total, refresh=True))


def _render_check(report, all_files: bool) -> None:
    from rich.markup import escape
    from rich.table import Table

    from kohya_tuner.cli.common import console, err_console, paragraph
    from kohya_tuner.families import get_family

    out = lambda text="": console.print(text, soft_wrap=True)  # noqa: E731 - paths must not be wrapped
    counts = report.counts()
    fam = get_family(report.family).label if report.family else "no model given"
    out(f"[bold]{escape(report.root)}[/bold]")
    paragraph(f"{counts['images']} picture files, {counts['trainable']} trainable ({counts['unique_trainable']} "
              f"distinct), {counts['captioned']} captioned ({report.caption_extension})", indent="  ")
    upscale = ", no upscale" if report.bucket_no_upscale else ""
    paragraph(f"judged for {report.job or 'any job'} on {fam} at {report.resolution} px "
              f"(buckets {report.min_bucket_reso}-{report.max_bucket_reso}{upscale})"
              + (f", trigger \"{report.trigger}\"" if report.trigger else ""), indent="  ")
    table = Table(show_header=True, header_style="bold", expand=False, show_lines=True)
    table.add_column("", no_wrap=True)
    table.add_column("finding", ratio=3)
    table.add_column("files", ratio=1)
    limit = None if all_files else 3
    for f in report.findings:
        files = f.files if limit is None else f.files[:limit]
        shown = "\n".join(escape(x) for x in files)
        if limit is not None and len(f.files) > limit:
            shown += f"\n… and {len(f.files) - limit} more"
        text = escape(f.message) + (f"\n[dim]→ {escape(f.fix)}[/dim]" if f.fix else "")
        table.add_row(_MARK[f.severity], text, shown)
    console.print(table)
    if not report.trainable:
        err_console.print("[bold red]Nothing here can be trained.[/bold red]", soft_wrap=True)
    else:
        w, fl = counts["warnings"], counts["failures"]
        if not (w or fl):
            out("[green]ready to train[/green]")
        else:
            paragraph(f"{fl} failure(s), {w} warning(s)" + ("; `kohya-tuner dataset prep` fixes the file problems "
                                                             "it names" if any("dataset prep" in (f.fix or "")
                                                                               for f in report.findings
                                                                               if f.severity != "pass") else ""))


def prep_command(path: Path, out_dir: Optional[Path], model: Optional[str], max_side: Optional[int],
                 trigger: Optional[str], caption_ext: Optional[str], workers: Optional[int], json_out: bool) -> int:
    from kohya_tuner import dataset
    from kohya_tuner.cli.common import err_console, print_json
    from kohya_tuner.families import get_family

    family = get_family(model) if model else None
    out = out_dir if out_dir is not None else path.expanduser().absolute().with_name(path.expanduser().absolute().name + ".prepared")
    try:
        if json_out:
            result = dataset.prepare(path, out, family, max_side, trigger, workers, caption_extension=caption_ext)
        else:
            with _progress(transient=False) as bar:
                task = bar.add_task("preparing", total=None)
                result = dataset.prepare(path, out, family, max_side, trigger, workers,
                                         progress=lambda done, total, _n: bar.update(task, completed=done, total=total, refresh=True),
                                         caption_extension=caption_ext)
    except KeyboardInterrupt:
        err_console.print("[yellow]Interrupted.[/yellow] Every image written so far is complete and recorded; run "
                          "the same command again to continue where it stopped.", soft_wrap=True)
        return 130
    if json_out:
        print_json(result.to_json())
    else:
        _render_prep(result)
    if result.count("failed") and not any(i.outcome != "failed" for i in result.items):
        return 2
    return 0


def _render_prep(result) -> None:
    from rich.markup import escape

    from kohya_tuner.cli.common import console

    # Prose wraps at words; a line that is a path to copy stays whole.
    out = lambda text="": console.print(text, soft_wrap=False)  # noqa: E731
    whole = lambda text="": console.print(text, soft_wrap=True)  # noqa: E731
    c = {k: result.count(k) for k in ("written", "copied", "skipped", "failed")}
    whole(f"[bold]{escape(result.out)}[/bold] ← {escape(result.source)}")
    out(f"  {c['written']} converted or resized, {c['copied']} copied unchanged, {c['skipped']} already done, "
        f"{c['failed']} left out; long side at most {result.max_side} px; "
        f"{result.images_per_s:.1f} images/s on {result.workers} process(es)")
    out(f"  captions: {result.captions_written} written"
        + (f", trigger \"{escape(result.trigger)}\" added to {result.trigger_added}" if result.trigger else ""))
    changed: dict[str, int] = {}
    for item in result.items:
        for action in item.actions:
            key = action.split(" ")[0] if action.startswith(("resized", "upscaled")) else action
            changed[key] = changed.get(key, 0) + 1
    for action, n in sorted(changed.items(), key=lambda kv: -kv[1]):
        out(f"    {n} × {escape(action)}")
    for item in result.items:
        if item.outcome == "failed":
            out(f"  [red]left out[/red] {escape(item.source)}: {escape(item.reason or '')}")
    for line in result.captions_unreadable:
        out(f"  [yellow]caption not read[/yellow] {escape(line)}; its image was copied "
            + ("with the trigger word only" if result.trigger else "without a caption"))
    for name in result.captions_kept:
        out(f"  [yellow]kept[/yellow] your edit of {escape(name)} in the copy (its source caption was not copied over it)")
    for name in result.removed:
        out(f"  removed {escape(name)} (its original is gone)")
    whole(f"Manifest: {escape(result.manifest)}")
    out(f"Train from [bold]{escape(result.out)}[/bold] (`config`/`run` use it automatically when it is beside the "
        "originals or was written by prep).")
