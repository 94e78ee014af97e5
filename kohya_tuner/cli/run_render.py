"""How `run` shows what run/ hands back: the plan, the dry-run command, the live attempts
and the outcome. Rendering only; every figure comes from run/'s data objects."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from kohya_tuner.cli.common import console, paragraph

if TYPE_CHECKING:
    from kohya_tuner.run.preflight import Report
    from kohya_tuner.run.request import PreparedRun


def show_value(value):
    from kohya_tuner.config_io import show_value as show

    return show(value)


def phase_words(phase):
    from kohya_tuner.run.policy import phase_words as words

    return words(phase)


def _duration(seconds: float | None) -> str:
    s = int(seconds or 0)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


def _gib(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f} GiB"


class LiveDisplay:
    """Renders supervisor events: a progress bar per attempt, decisions above it."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.progress = None
        self.task = None
        self.attempt = 0

    def _start_bar(self, attempt: int, total: int, start: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._stop_bar()
        self.progress = Progress(
            TextColumn("[bold]attempt {task.fields[attempt]}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[rate]}"),
            TextColumn("ETA {task.fields[eta]}"), TextColumn("VRAM {task.fields[vram]} (peak {task.fields[peak]})"),
            console=console, transient=False, auto_refresh=console.is_terminal,
        )
        self.task = self.progress.add_task("train", total=total, completed=start, attempt=attempt, loss="—",
                                           rate="—", eta="—", vram="—", peak="—")
        if console.is_terminal:
            self.progress.start()

    def _stop_bar(self) -> None:
        if self.progress is not None:
            if console.is_terminal:
                self.progress.stop()
            self.progress = None

    def _update(self, **kw: Any) -> None:
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, **kw)

    def handle(self, ev) -> None:
        d = ev.data
        k = ev.kind
        if self.quiet:
            return
        if k == "attempt_start":
            self.attempt = d["attempt"]
            label = "Probe" if d.get("probe") else "Attempt"
            console.print(f"\n[bold]{label} {d['attempt']}[/bold]: {d['reason']}")
            for c in d.get("changes") or []:
                console.print(f"  {c['key']}: {show_value(c['old'])} → [bold]{show_value(c['new'])}[/bold]")
            if d.get("note"):
                console.print(f"  [dim]{d['note']}[/dim]")
            console.print(f"  [dim]log: {d['log_file']}[/dim]")
            self._start_bar(d["attempt"], d["total_steps"], d.get("start_step") or 0)
        elif k == "progress":
            rate = d.get("rate")
            self._update(completed=d["step"], loss=f"{d['loss']:.4g}" if d.get("loss") is not None else "—",
                         rate=(f"{rate:.2f} it/s" if rate and rate >= 1 else f"{1 / rate:.2f} s/it") if rate else "—",
                         eta=_duration(d.get("eta_s")) if d.get("eta_s") is not None else "—",
                         vram=_gib(d.get("vram_gib")), peak=_gib(d.get("peak_gib")))
        elif k == "vram":
            self._update(vram=_gib(d.get("vram_gib")), peak=_gib(d.get("peak_gib")))
        elif k == "saved" and d.get("what") == "state":
            console.print(f"  [dim]state saved at step {d.get('step')}: {d.get('path')}[/dim]")
        elif k == "oom":
            f = d.get("figures") or {}
            fig = ""
            if f.get("tried_gib") is not None:
                fig = f": tried to allocate {f['tried_gib']:.2f} GiB"
                if f.get("free_gib") is not None:
                    fig += f" with {f['free_gib']:.2f} GiB free"
            when = f"after step {d.get('step')}" if d.get("step") else "before the first step"
            rank = f" on rank {d['rank']}" if d.get("rank") is not None else ""
            console.print(f"  [red]CUDA out of memory{rank} {when}{fig}[/red]")
        elif k == "nan_loss":
            console.print(f"  [red]the loss became NaN at step {d.get('step')}: stopping the trainer[/red]")
        elif k == "attempt_end":
            self._stop_bar()
            colour = "green" if d["outcome"] == "success" else "red"
            phase = phase_words(d.get("phase")) if d["outcome"] not in ("success", "interrupted") else ""
            console.print(f"  attempt {d['attempt']}: [{colour}]{d['outcome']}[/{colour}]{phase}, steps "
                          f"{d['steps']}, {_duration(d.get('duration_s'))}, peak VRAM {_gib(d.get('peak_gib'))}"
                          + (f", exit status {d['exit_status']}" if d.get("exit_status") not in (0, None) else ""))
            err = d.get("error") or {}
            if d["outcome"] not in ("success", "oom", "interrupted") and err.get("message"):
                console.print(f"  [red]{err.get('kind', 'error')}:[/red] {escape(err['message'])}")

    def close(self) -> None:
        self._stop_bar()


def print_outcome(summary: dict[str, Any]) -> None:
    status = summary["status"]
    colour = {"success": "green", "interrupted": "yellow"}.get(status, "red")
    console.print(f"\n[bold {colour}]{status.upper()}[/bold {colour}]: {escape(str(summary['reason']))}")
    for a in summary.get("advice") or []:
        console.print(f"  {escape(a)}")
    if summary.get("lora"):
        console.print(f"  LoRA: [bold]{escape(str(summary['lora']))}[/bold]")
    redone = summary.get("steps_redone", summary.get("steps_lost", 0)) or 0
    console.print(f"  attempts: {summary['attempts']} ({summary['failed_attempts']} failed), time lost to failures: "
                  f"{_duration(summary.get('time_lost_s'))}")
    # Reached is how far the weights got; trained counts every optimizer step run, redone ones too.
    console.print(f"  steps: {summary.get('reached_step', summary.get('steps_done'))} of {summary.get('total_steps')} "
                  f"planned; {summary.get('steps_done')} trained, {redone} of them redone; peak VRAM: "
                  f"{_gib(summary.get('peak_vram_gib')) if summary.get('peak_vram_gib') is not None else 'not measured'}")
    changed = summary.get("changed_settings") or {}
    if changed:
        title = ("settings that worked (changed from the plan)" if status == "success"
                 else "settings of the last attempt (changed from the plan)")
        from rich.table import Table

        table = Table(title=title)
        table.add_column("setting", style="cyan")
        table.add_column("plan")
        table.add_column("final", style="bold")
        for key, v in changed.items():
            table.add_row(key, show_value(v.get("plan")), show_value(v.get("final")))
        console.print(table)
    if summary.get("history"):
        console.print(f"  history: {summary['history']}")
    console.print(f"  report: {summary.get('report')}")
    if summary.get("continue_command"):
        console.print(f"  continue with: [bold]{summary['continue_command']}[/bold]")


def checks_table(report: Report):
    from rich.table import Table

    table = Table(title="pre-flight")
    table.add_column("check", style="cyan", no_wrap=True)
    table.add_column("", no_wrap=True)
    table.add_column("result")
    marks = {"ok": "[green]ok[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[red]FAIL[/red]"}
    for c in report.checks:
        table.add_row(escape(c.name), marks.get(c.status, c.status), escape(c.message))
    return table


def print_plan(p: PreparedRun) -> None:
    from kohya_tuner.cli.cmd_config import render_summary

    plan = p.plan
    console.print(f"[bold]{p.family_label}[/bold] LoRA, job [bold]{p.job}[/bold], "
                  f"{'CPU run' if p.cpu else 'GPU ' + p.gpu_described}"
                  + (f", emulating a {p.emulate_vram:g} GB card" if p.emulate_vram is not None else "")
                  + f" → preset class {plan.gpu_class} GB")
    # The settings that matter; every setting with its reason is in config.toml.
    console.print("  plan (every setting and its reason: config.toml):", markup=False)
    for line in render_summary(plan, p.fitted):
        console.print(line, markup=False, soft_wrap=True)
    for note in p.summary["notes"]:
        paragraph(note, indent="  ")
    for line in p.fit_lines:
        console.print(f"  fit: {line}")
    console.print(f"  estimate: peak {p.peak_gib:.2f} GiB{phase_words(p.peak_phase)}, "
                  f"budget {p.budget_gib:.2f} GiB" + (f" (corrected ×{p.correction:.3f} from your history)"
                                                      if p.correction != 1.0 else ""))
    console.print(checks_table(p.checks))
    console.print("Files: " + ", ".join(str(f) for f in p.written.values()), markup=False)
    for f, b in getattr(p.written, "backups", {}).items():
        console.print(f"  (the old {f.name} is kept as {b})", markup=False)


def print_dry_run(p: PreparedRun) -> None:
    from kohya_tuner.run.launcher import format_command

    console.print("\n[bold]Command[/bold] (dry run; nothing launched):")
    if p.env_added:
        paragraph("environment: " + " ".join(f"{k}={v}" for k, v in sorted(p.env_added.items())), indent="  ")
    sys.stdout.flush()
    # The command alone on its own line, exactly as a shell needs it.
    sys.stdout.write(format_command(p.argv) + "\n")
    sys.stdout.flush()
    console.print("Start it supervised with:", markup=False)
    sys.stdout.flush()
    # Raw, like the command above: the console would wrap a long folder inside its quotes.
    sys.stdout.write(f"kohya-tuner run --continue {format_command([str(p.out)])}\n")
    sys.stdout.flush()


def print_preview(preview: dict[str, Any]) -> None:
    console.print(f"Dry run: attempt {preview['attempt']} would start ({preview['reason']}); it {preview['starts']}.",
                  markup=False, soft_wrap=True)
    if preview.get("note"):
        console.print(f"  {preview['note']}", markup=False, soft_wrap=True)
    console.print("Command (nothing launched, nothing written):", markup=False)
    sys.stdout.flush()
    sys.stdout.write(preview["command_line"] + "\n")
