"""`kohya-tuner run`: plan, check, launch sd-scripts, watch it, recover from OOM.

Parsing and printing only: planning comes from presets/ladder/memory, checks from
preflight, the attempt loop from run/.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from kohya_tuner.cli import plan_options
from kohya_tuner.cli.argtypes import finite_float, int_range, positive_int, out_path
from rich.markup import escape

from kohya_tuner.cli.common import console, err_console, print_json, warn
from kohya_tuner.errors import UserError

DESCRIPTION = ("Train a LoRA with sd-scripts, watch it live, and recover from CUDA out-of-memory by downgrading "
               "settings and resuming from the last saved state.")


def show_value(value):
    from kohya_tuner.config_io import show_value as show

    return show(value)


def phase_words(phase):
    from kohya_tuner.run.policy import phase_words as words

    return words(phase)


def _parse_gpus(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        ids = tuple(int(p) for p in text.replace(" ", "").split(",") if p != "")
    except ValueError:
        raise UserError(f"--gpus {text!r} must list GPU numbers, e.g. --gpus 0,1.") from None
    if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise UserError(f"--gpus {text!r} must list distinct GPU numbers, e.g. --gpus 0,1.")
    return ids


def _check_out_dir(out: Path) -> None:
    """A new run never writes over another run's results."""
    from kohya_tuner.run.journal import Journal

    j = Journal(out)
    if j.attempts() or j.numbers_on_disk():  # a launched attempt's log counts even without its record
        raise UserError(f"{out} already holds a kohya-tuner run with "
                        f"{len({a.attempt for a in j.attempts()} | j.numbers_on_disk())} attempt(s).",
                        f"Continue it with `kohya-tuner run --continue {out}`, or choose another --out.")
    output = out / "output"
    if output.is_dir() and any(output.iterdir()):
        raise UserError(f"{output} already holds files; a new run would overwrite LoRA files and states there.",
                        "Choose another --out.")


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


def _print_outcome(summary: dict[str, Any]) -> None:
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


def _checks_table(report):
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="pre-flight")
    table.add_column("check", style="cyan", no_wrap=True)
    table.add_column("", no_wrap=True)
    table.add_column("result")
    marks = {"ok": "[green]ok[/green]", "warn": "[yellow]warn[/yellow]", "fail": "[red]FAIL[/red]"}
    for c in report.checks:
        table.add_row(escape(c.name), marks.get(c.status, c.status), escape(c.message))
    return table


def _run_supervisor(settings, first, *, first_attempt: int, probe: bool, json_events: Path | None,
                    as_json: bool) -> int:
    from kohya_tuner.run.loop import Supervisor

    display = LiveDisplay(quiet=as_json)
    sup = Supervisor(settings, on_event=display.handle, events_file=json_events)
    try:
        outcome = sup.run(first, first_attempt=first_attempt, probe_first=probe)
    except KeyboardInterrupt:
        display.close()
        err_console.print(f"\nInterrupted. States are kept; continue with: kohya-tuner run --continue "
                          f"{settings.out_dir}")
        return 130
    finally:
        display.close()
    if as_json:
        print_json(outcome.summary)
    else:
        _print_outcome(outcome.summary)
    return outcome.exit_code


def _continue(out: Path, *, max_attempts: int | None, hang_timeout: float | None, json_events: Path | None,
              python: str | None, cpu: bool, as_json: bool, dry_run: bool = False) -> int:
    from kohya_tuner.run.journal import Journal
    from kohya_tuner.run.continuation import continuation
    from kohya_tuner.run.policy import Stop
    from kohya_tuner.run.settings import RunSettings

    j = Journal(out)
    settings = RunSettings.from_json(out.absolute(), j.read_run())
    if max_attempts is not None:
        settings.max_attempts = max_attempts
    if hang_timeout is not None:
        settings.hang_minutes = hang_timeout
    if python:
        settings.python = python
    if cpu:
        settings.cpu = True
    summary = j.read_summary()
    if summary and summary.get("status") == "success":
        if as_json:
            print_json(summary)
        else:
            console.print(f"This run already finished: {summary.get('lora')}")
        return 0
    attempts = j.attempts()
    action = continuation(attempts, settings)
    if isinstance(action, Stop):
        raise UserError(f"Cannot continue {out}: {action.reason}.", " ".join(action.advice) or None)
    # A run planned with --dry-run --probe-steps starts with its probe.
    probe = not attempts and bool(settings.probe_steps)
    if dry_run:
        from kohya_tuner.run.dryrun import continuation_preview

        preview = continuation_preview(j, settings, action, probe=probe)
        if as_json:
            print_json(preview)
            return 0
        where = (f"resumes from {preview['resume_from']} (step {preview['start_step']})" if preview["resume_from"]
                 else "starts from step 0")
        console.print(f"Dry run: attempt {preview['attempt']} would start ({preview['reason']}); it {where}.",
                      markup=False, soft_wrap=True)
        console.print("Command (nothing launched, nothing written):", markup=False)
        sys.stdout.flush()
        sys.stdout.write(preview["command_line"] + "\n")
        return 0
    return _run_supervisor(settings, action, first_attempt=j.next_attempt_number(), probe=probe,
                           json_events=json_events, as_json=as_json)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m",
                   help="Model family: sd15, sdxl, flux, sd2, sd3, sd35m, sd35l, chroma, lumina2, hunyuan21 or anima.")
    p.add_argument("--job", "-j", help="What you train: character, style or concept.")
    plan_options.add_gpu(p, required=False, default="auto", arch=True)
    p.add_argument("--out", "-o", type=out_path, metavar="DIR", help="Run folder: configs, logs, states, LoRA, report.")
    plan_options.add_plan_options(p)
    p.add_argument("--sd-scripts", type=Path, metavar="DIR",
                   help="sd-scripts checkout (default: the one `kohya-tuner setup` made).")
    p.add_argument("--python", metavar="PATH",
                   help="Interpreter of the environment sd-scripts is installed in (default: this one).")
    p.add_argument("--dry-run", action="store_true",
                   help="Plan, check and write the files, print the command, launch nothing.")
    p.add_argument("--max-attempts", type=int_range(1, 100), metavar="N",
                   help="Launches at most, retries included (default 6).")
    p.add_argument("--probe-steps", type=positive_int, metavar="N",
                   help="A short trial run of N steps first, to meet an OOM early (the guides suggest 100-200).")
    p.add_argument("--emulate-vram", type=finite_float(1.0, 1024.0), metavar="GB",
                   help="Cap the trainer's CUDA memory at GB, to prove a smaller card's preset on a bigger one.")
    p.add_argument("--gpus", metavar="LIST", help="GPUs to train on, e.g. 0,1 (multi-GPU through accelerate).")
    p.add_argument("--accelerate-config", type=Path, metavar="FILE",
                   help="accelerate config file, passed through (multi-node).")
    p.add_argument("--json-events", type=Path, metavar="FILE", help="Append one JSON object per event to FILE.")
    p.add_argument("--strict", action="store_true", help="Refuse to start while other processes hold GPU memory.")
    p.add_argument("--strict-pin", action="store_true",
                   help="Refuse an sd-scripts checkout that is not the pinned commit.")
    p.add_argument("--hang-timeout", type=finite_float(0.05, 10080.0), metavar="MIN",
                   help="Minutes without output before an attempt counts as hung (default 30; at least 0.05, "
                        "3 s: a trainer is silent while Python starts).")
    p.add_argument("--continue", dest="continue_", type=Path, metavar="DIR",
                   help="Continue the run in this folder from its journal.")
    p.add_argument("--cpu", action="store_true", help="Train on the CPU (accelerate --cpu): for smoke tests and CI.")
    p.add_argument("--policy", choices=("default", "roadmap"), default="default",
                   help="How OOM moves are chosen: default, or roadmap (the guides' fixed order).")
    p.add_argument("--no-fit", action="store_true",
                   help="Launch the presets as composed, without fitting them to the card first.")
    p.add_argument("--force", action="store_true", help="Replace plan files in --out (old ones kept as .bak).")
    p.add_argument("--json", action="store_true", help="No live display; print one JSON object at the end.")


def run(args: argparse.Namespace) -> int:
    a = args
    model, job, gpu, out, data = a.model, a.job, a.gpu, a.out, a.data
    base, clip_l, t5xxl, ae, trigger, name = a.base, a.clip_l, a.t5xxl, a.ae, a.trigger, a.name
    steps, variant, preset, set_ = a.steps, a.variant, a.preset, a.sets or []
    sd_scripts, python, dry_run, max_attempts, probe_steps = a.sd_scripts, a.python, a.dry_run, a.max_attempts, a.probe_steps
    emulate_vram, gpus, accelerate_config, json_events = a.emulate_vram, a.gpus, a.accelerate_config, a.json_events
    strict, strict_pin, hang_timeout, continue_, cpu = a.strict, a.strict_pin, a.hang_timeout, a.continue_, a.cpu
    policy, no_fit, force, as_json = a.policy, a.no_fit, a.force, a.json
    from kohya_tuner.run import guards
    from kohya_tuner.run.lock import RunLock

    if continue_ is not None:
        guards.refuse_plan_flags_with_continue(a, add_arguments)
        continue_ = guards.continue_folder(continue_)
        if json_events is not None:
            guards.events_file(json_events)
        with RunLock(continue_, "run --continue") as lock:
            if lock.stale_note():
                warn(lock.stale_note())
            code = _continue(continue_, max_attempts=max_attempts, hang_timeout=hang_timeout,
                             json_events=json_events, python=python, cpu=cpu, as_json=as_json, dry_run=dry_run)
        return code
    missing = [flag for flag, v in (("--model", model), ("--job", job), ("--out", out), ("--data", data))
               if v is None]
    if missing:
        raise UserError(f"run needs {', '.join(missing)} (or --continue OUT).",
                        "Example: kohya-tuner run --model sdxl --job style --base sdxl.safetensors "
                        "--data ./images --out runs/mystyle")
    guards.writable_folder(Path(out))
    if json_events is not None:
        guards.events_file(json_events)
    with RunLock(Path(out).absolute(), "run") as lock:
        if lock.stale_note():
            warn(lock.stale_note())
        code = _new_run(
            model=model, job=job, gpu=gpu, out=out, data=data, base=base, clip_l=clip_l, t5xxl=t5xxl, ae=ae,
            trigger=trigger, name=name, steps=steps, variant=variant, preset=preset, sets=set_,
            sd_scripts=sd_scripts, python=python, dry_run=dry_run, max_attempts=max_attempts,
            probe_steps=probe_steps, emulate_vram=emulate_vram, gpus=gpus, accelerate_config=accelerate_config,
            json_events=json_events, strict=strict, strict_pin=strict_pin, hang_timeout=hang_timeout, cpu=cpu,
            policy=policy, no_fit=no_fit, force=force, as_json=as_json,
            files=plan_options.model_files(a), network=a.network, gpu_arch=a.gpu_arch)
    return code


def _new_run(*, model, job, gpu, out, data, base, clip_l, t5xxl, ae, trigger, name, steps, variant, preset, sets,
             sd_scripts, python, dry_run, max_attempts, probe_steps, emulate_vram, gpus, accelerate_config,
             json_events, strict, strict_pin, hang_timeout, cpu, policy, no_fit, force, as_json,
             files=None, network=None, gpu_arch=None) -> int:
    from kohya_tuner import gpu as gpu_mod
    from kohya_tuner import history, memory, planfiles, planning, presets, schema
    from kohya_tuner.run import launcher, preflight
    from kohya_tuner.cli.cmd_config import render_summary
    from kohya_tuner.families import get_family
    from kohya_tuner.run.journal import Journal
    from kohya_tuner.run.policy import DEFAULT_HANG_MINUTES, DEFAULT_MAX_ATTEMPTS, Retry
    from kohya_tuner.run.settings import RunSettings, command_for, probe_config
    from kohya_tuner.run.states import attempt_config, ensure_resumable

    family = get_family(model)
    out = Path(out).absolute()
    if emulate_vram is not None and emulate_vram < gpu_mod.MIN_GPU_GB:
        raise UserError(f"--emulate-vram {emulate_vram:g} is below {gpu_mod.MIN_GPU_GB} GB.")
    if accelerate_config is not None and not accelerate_config.is_file():
        raise UserError(f"--accelerate-config {accelerate_config} does not exist.")
    if not data.is_dir():
        raise UserError(f"--data {data} is not a folder." if data.exists() else f"--data {data} does not exist.",
                        "Point --data at the folder that holds your training images.")
    _check_out_dir(out)
    gpu_ids = _parse_gpus(gpus)
    index = gpu_ids[0] if gpu_ids else 0
    cards = [] if cpu else gpu_mod.list_gpus()
    card = next((c for c in cards if c.index == index), None)
    if str(gpu).strip().lower() == "auto":
        if cpu:
            raise UserError("--cpu needs the card size to plan for: give --gpu N (e.g. --gpu 12).")
        choice = gpu_mod.choose("auto", index, arch=gpu_arch)
    else:
        choice = gpu_mod.GpuChoice(gb=gpu_mod.parse_gb(gpu), info=card, arch_given=gpu_arch)
    plan_gb = int(emulate_vram) if emulate_vram is not None else choice.gb
    python = python or sys.executable

    # The images first: a broken dataset is the cheapest thing to find out about. A fresh
    # `dataset prep` copy is what training reads (build_dataset picks it the same way), so it
    # is what gets checked.
    # Judged at the resolution the plan trains at: --preset / --set may change it.
    sized = presets.compose(family.name, job, plan_gb, preset_file=preset, sets=sets, variant=variant)
    report, checked = planning.check_data(data, family, job, trigger, sized.config)
    images = len(report.trainable)

    inputs, missing_files = planning.model_inputs(family, base=base, clip_l=clip_l, t5xxl=t5xxl, ae=ae, name=name, out=out,
                                         steps=steps, files=files)
    if missing_files:
        raise UserError(f"{family.label} needs {', '.join(missing_files)}.",
                        f"Give the model file{'s' if len(missing_files) > 1 else ''}, e.g. {missing_files[0]} "
                        "/models/file.safetensors.")
    plan = presets.compose(family.name, job, plan_gb, preset_file=preset, sets=sets, variant=variant,
                           inputs=inputs, bf16=None if emulate_vram is not None and choice.info is None else choice.bf16,
                           network=network)
    for key, old, new, why in preflight.cpu_switches(plan.config) if cpu else ():
        plan.set(key, new, "--cpu", why)
        if new is None:  # a key left out has no provenance to show it: said here instead
            plan.notes.append(f"--cpu: {key} = {old} left out: {why}")
    ds = presets.build_dataset(plan, data, trigger)
    gpu_name = choice.info.name if choice.info else (card.name if card else None)
    others = choice.others_gib if choice.info else 0.0
    user_keys = planning.user_keys(plan)  # before the fit writes its own layer over any of them
    fitted = planning.fit_plan(plan, ds, plan_gb, others_gib=0.0 if emulate_vram is not None else others,
                               gpu_name=gpu_name, bf16=choice.bf16, gpus=max(1, len(gpu_ids)), do_fit=not no_fit,
                               cpu=cpu)
    ds, budget, hist = fitted.dataset, fitted.budget_gib, history.load()
    fit_lines: list[str] = []
    if fitted.fit is not None:
        fit_lines = [f"{st.move}: {st.reason}" for st in fitted.fit.steps] + fitted.notes
        if not fitted.fit.fits:
            warn(f"{fitted.fit.message}; launching anyway: the supervisor downgrades further after a real OOM.")
    total = int(plan.config.get("max_train_steps") or 1600)
    if probe_steps is not None and not (1 <= probe_steps < total):
        raise UserError(f"--probe-steps {probe_steps} must be between 1 and the run's {total} steps.")
    for key, value in ensure_resumable(plan.config, total).items():
        if plan.config.get(key) != value:
            plan.set(key, value, "run", "Resumable states so an OOM costs minutes, not the run.")
    est = memory.estimate({**fitted.assumed, **plan.config}, family, dataset=ds, gpus=max(1, len(gpu_ids)), history=hist,
                          gpu_name=gpu_name)

    facts = preflight.gather(out_dir=out, python=python, sd_scripts=sd_scripts, cpu=cpu)
    checks = preflight.evaluate(plan.config, family, facts, gpu_index=index, gpu_ids=gpu_ids,
                                num_processes=max(1, len(gpu_ids)), predicted_gib=est.peak_gib,
                                lora_params=est.lora_params, total_steps=total, images=images, strict=strict,
                                strict_pin=strict_pin, cpu=cpu, dry_run=dry_run)
    for key, _old, new, why in checks.changes:
        plan.set(key, new, "pre-flight", why)
    for f in report.findings:
        if f.severity == "warn":
            checks.checks.append(preflight.Check("dataset", "warn", f.message))
    if checks.failures:
        if not as_json:
            console.print(_checks_table(checks))
        listed = "; ".join(c.message + (f" ({c.hint})" if c.hint else "") for c in checks.failures)
        raise UserError(f"Pre-flight checks failed: {listed}.")
    schema.raise_if_invalid(presets.validate_plan(plan, ds), "The planned config")
    from kohya_tuner import outpaths
    from kohya_tuner.run import secretstore

    outpaths.confine(plan.config, out, what="The plan")  # nothing written outside --out
    secretstore.withhold(plan, out)  # the trainer gets them through its environment

    checkout = Path(facts.checkout_path or preflight.PLACEHOLDER)
    files = planfiles.render(plan, ds, out, sd_scripts=checkout, assumed=fitted.assumed)
    written = planfiles.write(files, out, force=force)
    num_processes = max(1, len(gpu_ids))
    gpu_info = None
    info = choice.info or card
    if info is not None:
        gpu_info = {"name": info.name, "total_gib": round(info.total_gib, 3), "index": info.index}
    settings = RunSettings(
        out_dir=out, family=family, script=checkout / family.script, dataset_file=written["dataset.toml"],
        plan_config=dict(plan.config), total_steps=total, python=python, num_processes=num_processes,
        gpu_ids=gpu_ids, gpu_index=index, accelerate_config=accelerate_config.absolute() if accelerate_config else None,
        cpu=cpu, emulate_vram_gb=emulate_vram, max_attempts=max_attempts or DEFAULT_MAX_ATTEMPTS,
        hang_minutes=hang_timeout or DEFAULT_HANG_MINUTES, probe_steps=probe_steps, policy=policy, gpu=gpu_info,
        predicted_gib=round(est.peak_gib, 3), dataset=ds, model=model, job=job,
        user_keys=tuple(sorted(user_keys)))
    journal = Journal(out)
    journal.write_run(settings.to_json())
    first = Retry(config=dict(plan.config), resume_from=None, changes=[],
                  reason=(f"a {probe_steps}-step probe before the full run" if probe_steps else "the fitted plan"),
                  start_step=0)

    first_config = probe_config(plan.config, probe_steps, out) if probe_steps else plan.config
    cfg_path = journal.config_path(1)
    if dry_run:
        from kohya_tuner.run.loop import Supervisor

        cfg_path = Supervisor(settings).write_attempt_config(
            1, attempt_config(first_config, resume_from=None, resume_step=0, stored_step=None), first.reason)
    argv, env = command_for(settings, cfg_path, first_config)
    env_added = launcher.env_changes(env, os.environ)
    summary = {
        "gpu": choice.describe() if not cpu else "CPU (--cpu)", "plan_gb": plan_gb, "budget_gib": round(budget, 3),
        "predicted_peak_gib": round(est.peak_gib, 3), "predicted_phase": est.peak_phase,
        "history_correction": est.correction, "fit": fit_lines, "files": {k: str(v) for k, v in written.items()},
        "checks": [c.__dict__ for c in checks.checks], "command": argv, "environment": env_added,
        "attempt_config": str(cfg_path), "data": str(checked), "notes": list(plan.notes),
    }
    if not as_json:
        console.print(f"[bold]{family.label}[/bold] LoRA, job [bold]{job}[/bold], "
                      f"{'CPU run' if cpu else 'GPU ' + choice.describe()}"
                      + (f", emulating a {emulate_vram:g} GB card" if emulate_vram is not None else "")
                      + f" → preset class {plan.gpu_class} GB")
        # The settings that matter; every setting with its reason is in config.toml.
        console.print("  plan (every setting and its reason: config.toml):", markup=False)
        for line in render_summary(plan, fitted):
            console.print(line, markup=False, soft_wrap=True)
        for note in plan.notes:
            console.print(f"  {note}", markup=False, soft_wrap=True)
        for line in fit_lines:
            console.print(f"  fit: {line}")
        console.print(f"  estimate: peak {est.peak_gib:.2f} GiB{phase_words(est.peak_phase)}, "
                      f"budget {budget:.2f} GiB" + (f" (corrected ×{est.correction:.3f} from your history)"
                                                    if est.correction != 1.0 else ""))
        console.print(_checks_table(checks))
        console.print("Files: " + ", ".join(str(p) for p in written.values()), markup=False)
        for p, b in getattr(written, "backups", {}).items():
            console.print(f"  (the old {p.name} is kept as {b})", markup=False)
    if dry_run:
        if as_json:
            print_json({"dry_run": True, **summary})
        else:
            console.print("\n[bold]Command[/bold] (dry run; nothing launched):")
            if env_added:
                console.print("  environment: " + " ".join(f"{k}={v}" for k, v in sorted(env_added.items())),
                              soft_wrap=True, markup=False)
            sys.stdout.flush()
            # The command alone on its own line, exactly as a shell needs it.
            sys.stdout.write(launcher.format_command(argv) + "\n")
            sys.stdout.flush()
            console.print(f"Start it supervised with: kohya-tuner run --continue {launcher.format_command([str(out)])}")
        return 0
    return _run_supervisor(settings, first, first_attempt=1, probe=bool(probe_steps), json_events=json_events,
                           as_json=as_json)
