"""`kohya-tuner dataset check|prep`: judge an image folder, or write a trainable copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from kohya_tuner import dataset
from kohya_tuner.cli.common import console, err_console, print_json, user_errors
from kohya_tuner.families import Family, get_family

_MARK = {"pass": "[green]pass[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[bold red]fail[/bold red]"}


def register(app: typer.Typer) -> None:
    sub = typer.Typer(
        name="dataset",
        help="Check an image folder for what makes LoRAs fail or run out of memory, and prepare a clean copy.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode="rich",
    )
    sub.command(
        "check",
        help=(
            "Read every image and caption the way sd-scripts will, and report: broken, rotated, CMYK, 16-bit, "
            "transparent or animated images, sizes against the training resolution and buckets, missing captions "
            "or trigger word, near-identical captions, and the image count for the job. Exit 0 with warnings; "
            "2 when nothing in the folder can be trained."
        ),
    )(check_command)
    sub.command(
        "prep",
        help=(
            "Write a prepared copy of the folder (the originals are never changed): images rotated upright, "
            "8-bit RGB, downscaled (Lanczos) to the largest bucket; captions copied, the trigger added with "
            "--trigger; a manifest of sources and hashes. Run it again to pick up changes; Ctrl-C is safe."
        ),
    )(prep_command)
    app.add_typer(sub, name="dataset")


def _progress(transient: bool = True) -> Progress:
    # No refresh thread (auto_refresh off; each update redraws): with no other thread
    # alive the worker pool can fork, which is the fastest start.
    return Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeRemainingColumn(), console=console, transient=transient, auto_refresh=False)


@user_errors
def check_command(
    path: Path = typer.Argument(..., help="The folder with the training images (and caption .txt files)."),
    model: str = typer.Option(..., "--model", "-m", help="Model family: sd15, sdxl or flux."),
    job: Optional[str] = typer.Option(None, "--job", "-j", help="character, style or concept: sets the image-count guide."),
    trigger: Optional[str] = typer.Option(None, "--trigger", help="Trigger word every caption should contain."),
    resolution: Optional[int] = typer.Option(None, "--resolution", help="Training resolution (default: the model preset's)."),
    max_bucket: Optional[int] = typer.Option(None, "--max-bucket", help="max_bucket_reso (default: the model preset's)."),
    min_bucket: Optional[int] = typer.Option(None, "--min-bucket", help="min_bucket_reso (default: the model preset's)."),
    caption_ext: Optional[str] = typer.Option(None, "--caption-ext", help="Caption extension (default: .txt, or .caption when the folder uses it)."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Processes reading images (default: all cores)."),
    all_files: bool = typer.Option(False, "--all", help="List every file of each finding, not the first few."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    family = get_family(model)
    if job is not None:
        dataset.get_job(job)
    try:
        report = _run_check(path, job, family, trigger, resolution, min_bucket, max_bucket, _ext(caption_ext), workers,
                            json_out)
    except KeyboardInterrupt:
        err_console.print("[yellow]Interrupted.[/yellow] Nothing was changed.", soft_wrap=True)
        raise typer.Exit(130)
    if json_out:
        print_json(report.to_json())
    else:
        _render_check(report, all_files)
    if not report.trainable:
        raise typer.Exit(2)


def _run_check(path: Path, job: Optional[str], family: Family, trigger: Optional[str], resolution: Optional[int],
               min_bucket: Optional[int], max_bucket: Optional[int], caption_ext: Optional[str],
               workers: Optional[int], quiet: bool) -> dataset.DatasetReport:
    kwargs: dict[str, Any] = dict(min_bucket_reso=min_bucket, max_bucket_reso=max_bucket, caption_extension=caption_ext,
                  workers=workers)
    if quiet:
        return dataset.check(path, job, family, trigger, resolution, **kwargs)
    with _progress() as bar:
        task = bar.add_task("reading images", total=None)
        return dataset.check(path, job, family, trigger, resolution, **kwargs,
                             progress=lambda done, total, _name: bar.update(task, completed=done, total=total, refresh=True))


def _ext(value: Optional[str]) -> Optional[str]:
    if value is None:
        return None
    value = value.strip()
    return value if value.startswith(".") else "." + value


def _render_check(report: dataset.DatasetReport, all_files: bool) -> None:
    out = lambda text="": console.print(text, soft_wrap=True)  # noqa: E731 - paths must not be wrapped
    counts = report.counts()
    fam = get_family(report.family).label if report.family else "no model given"
    out(f"[bold]{escape(report.root)}[/bold]")
    out(f"  {counts['images']} picture files, {counts['trainable']} trainable ({counts['unique_trainable']} distinct), "
        f"{counts['captioned']} captioned ({report.caption_extension})")
    upscale = ", no upscale" if report.bucket_no_upscale else ""
    out(f"  judged for {report.job or 'any job'} on {fam} at {report.resolution} px "
        f"(buckets {report.min_bucket_reso}-{report.max_bucket_reso}{upscale})"
        + (f", trigger \"{escape(report.trigger)}\"" if report.trigger else ""))
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
        verdict = "[green]ready to train[/green]" if not (w or fl) else (
            f"{fl} failure(s), {w} warning(s)" + ("; `kohya-tuner dataset prep` fixes the file problems it names"
                                                  if any("dataset prep" in (f.fix or "") for f in report.findings
                                                         if f.severity != "pass") else ""))
        out(verdict)


@user_errors
def prep_command(
    path: Path = typer.Argument(..., help="The folder with the original images; it is only read."),
    out_dir: Optional[Path] = typer.Option(None, "--out", "-o", help="Where to write the copy (default: <folder>.prepared beside it)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model family (sets the default --max-side)."),
    max_side: Optional[int] = typer.Option(None, "--max-side", help="Longest side of the prepared images (default: the largest bucket the model's presets use)."),
    trigger: Optional[str] = typer.Option(None, "--trigger", help="Add this trigger word to every caption (and caption uncaptioned images with it)."),
    caption_ext: Optional[str] = typer.Option(None, "--caption-ext", help="Caption extension of the originals (default: .txt, or .caption when the folder uses it)."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Processes (default: all cores)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    family = get_family(model) if model else None
    out = out_dir if out_dir is not None else path.expanduser().absolute().with_name(path.expanduser().absolute().name + ".prepared")
    try:
        if json_out:
            result = dataset.prepare(path, out, family, max_side, trigger, workers, caption_extension=_ext(caption_ext))
        else:
            with _progress(transient=False) as bar:
                task = bar.add_task("preparing", total=None)
                result = dataset.prepare(path, out, family, max_side, trigger, workers,
                                         progress=lambda done, total, _n: bar.update(task, completed=done, total=total, refresh=True),
                                         caption_extension=_ext(caption_ext))
    except KeyboardInterrupt:
        err_console.print("[yellow]Interrupted.[/yellow] Every image written so far is complete and recorded; run "
                          "the same command again to continue where it stopped.", soft_wrap=True)
        raise typer.Exit(130)
    if json_out:
        print_json(result.to_json())
    else:
        _render_prep(result)
    if result.count("failed") and not any(i.outcome != "failed" for i in result.items):
        raise typer.Exit(2)


def _render_prep(result: dataset.PrepResult) -> None:
    out = lambda text="": console.print(text, soft_wrap=True)  # noqa: E731
    c = {k: result.count(k) for k in ("written", "copied", "skipped", "failed")}
    out(f"[bold]{escape(result.out)}[/bold] ← {escape(result.source)}")
    out(f"  {c['written']} converted or resized, {c['copied']} copied unchanged, {c['skipped']} already done, "
        f"{c['failed']} left out; long side at most {result.max_side} px; "
        f"{result.images_per_s:.1f} images/s on {result.workers} process(es)")
    out(f"  captions: {result.captions_written} written"
        + (f", trigger \"{escape(result.trigger)}\" added to {result.trigger_added}" if result.trigger else ""))
    changed: dict[str, int] = {}
    for item in result.items:
        for action in item.actions:
            key = action.split(" ")[0] if action.startswith("resized") else action
            changed[key] = changed.get(key, 0) + 1
    for action, n in sorted(changed.items(), key=lambda kv: -kv[1]):
        out(f"    {n} × {escape(action)}")
    for item in result.items:
        if item.outcome == "failed":
            out(f"  [red]left out[/red] {escape(item.source)}: {escape(item.reason or '')}")
    for name in result.captions_kept:
        out(f"  [yellow]kept[/yellow] your edit of {escape(name)} in the copy (its source caption was not copied over it)")
    for name in result.removed:
        out(f"  removed {escape(name)} (its original is gone)")
    out(f"Manifest: {escape(result.manifest)}")
    out(f"Train from [bold]{escape(result.out)}[/bold] (`config`/`run` use it automatically when it is beside the "
        "originals or was written by prep).")
