"""From a request to a launch: `prepare` plans a new run (dataset check, presets, fit,
pre-flight, files, run.json); `prepare_continue` finds where `--continue` picks up; `supervise`
runs the attempt loop. Nothing here prints: warnings go to the caller's `warn`, and what
there is to show comes back as the data objects of run/request.py."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from kohya_tuner import gpu as gpu_mod
from kohya_tuner import history, memory, outpaths, planfiles, planning, presets, schema
from kohya_tuner.errors import UserError
from kohya_tuner.families import Family, get_family
from kohya_tuner.gpu import GpuChoice, GpuInfo, parse_gpus
from kohya_tuner.planfiles import Written
from kohya_tuner.planning import FittedPlan
from kohya_tuner.presets import Plan
from kohya_tuner.run import launcher, preflight, secretstore
from kohya_tuner.run.journal import Journal
from kohya_tuner.run.policy import DEFAULT_HANG_MINUTES, DEFAULT_MAX_ATTEMPTS, Retry
from kohya_tuner.run.settings import RunSettings, command_for, probe_config
from kohya_tuner.run.states import attempt_config, ensure_resumable
from kohya_tuner.run.request import Continuation, ContinueRequest, Launch, PreflightFailed, PreparedRun, RunRequest

if TYPE_CHECKING:
    from kohya_tuner.dataset.models import DatasetReport
    from kohya_tuner.memory import Estimate
    from kohya_tuner.run.loop import Outcome, RunEvent


def check_out_dir(out: Path) -> None:
    """A new run never writes over another run's results."""
    j = Journal(out)
    if j.attempts() or j.numbers_on_disk():  # a launched attempt's log counts even without its record
        raise UserError(f"{out} already holds a kohya-tuner run with "
                        f"{len({a.attempt for a in j.attempts()} | j.numbers_on_disk())} attempt(s).",
                        f"Continue it with `kohya-tuner run --continue {out}`, or choose another --out.")
    # The run's own records: a file of that name in a fresh --out is the user's (or another tool's).
    from kohya_tuner.run.journal import ATTEMPTS_FILE, EVENTS_FILE, REPORT_FILE, RUN_FILE, SUMMARY_FILE

    theirs = [name for name in (ATTEMPTS_FILE, SUMMARY_FILE, REPORT_FILE, EVENTS_FILE) if os.path.lexists(out / name)]
    planned = os.path.lexists(out / RUN_FILE) and _planned_run(j)
    if os.path.lexists(out / RUN_FILE) and not planned:
        theirs.insert(0, RUN_FILE)
    if not planned:  # a dry run writes its first attempt's config beside its run.json
        try:
            # An attempt's own files (attempt-2.config.toml, attempt-1.dataset.toml): written at its launch.
            theirs += sorted(n for n in os.listdir(out) if _ATTEMPT_NAME.match(n))[:5]
        except OSError:
            pass
    if theirs:
        raise UserError(f"{out} already holds {', '.join(theirs)}, which a new run writes its own records to; "
                        "kohya-tuner never overwrites your files.",
                        "Choose another --out (an empty folder, or one `kohya-tuner config` wrote).")
    output = out / "output"
    if output.is_dir() and any(output.iterdir()):
        raise UserError(f"{output} already holds files; a new run would overwrite LoRA files and states there.",
                        "Choose another --out.")


_ATTEMPT_NAME = re.compile(r"attempt-\d+\.")


def _planned_run(j: Journal) -> bool:
    """run.json of a run planned and never launched (a dry run wrote it for `--continue`): a new
    plan in the same folder replaces it."""
    try:
        j.read_run()
    except UserError:
        return False
    return True


@dataclass
class _Target:
    """The card (or CPU) and folder a new run plans for."""

    family: Family
    out: Path
    gpu_ids: tuple[int, ...]
    index: int
    card: GpuInfo | None
    choice: GpuChoice
    plan_gb: int
    python: str
    note: str | None = None  # cards of different sizes: which one the plan is for

    @property
    def num_processes(self) -> int:
        return max(1, len(self.gpu_ids))


@dataclass
class _Planned:
    """The composed and fitted plan with what was learnt on the way."""

    plan: Plan
    dataset: dict[str, Any]
    data_report: DatasetReport  # its warnings join the pre-flight's
    checked: Path  # the folder the images were checked in (a fresh `dataset prep` copy when there is one)
    images: int
    user_keys: frozenset[str]
    fitted: FittedPlan
    fit_lines: list[str]
    total: int
    est: Estimate
    absent: list[planning.AbsentFile]  # model paths not on this machine (a dry run only warns)


def _target(req: RunRequest) -> _Target:
    family = get_family(req.model)
    out = Path(req.out).absolute()
    emulate_vram, cpu = req.emulate_vram, req.cpu
    if emulate_vram is not None and emulate_vram < gpu_mod.MIN_GPU_GB:
        raise UserError(f"--emulate-vram {emulate_vram:g} is below {gpu_mod.MIN_GPU_GB} GB.")
    if req.accelerate_config is not None:
        from kohya_tuner import safeio

        safeio.require_regular(req.accelerate_config, "--accelerate-config")
    data = req.data
    if not data.is_dir():
        raise UserError(f"--data {data} is not a folder." if data.exists() else f"--data {data} does not exist.",
                        "Point --data at the folder that holds your training images.")
    check_out_dir(out)
    gpu_ids = parse_gpus(req.gpus)
    index = gpu_ids[0] if gpu_ids else 0
    cards = [] if cpu else gpu_mod.list_gpus()
    card = next((c for c in cards if c.index == index), None)
    note = None
    if str(req.gpu).strip().lower() == "auto":
        if cpu:
            raise UserError("--cpu needs the card size to plan for: give --gpu N (e.g. --gpu 12).")
        choice, note = gpu_mod.choose_among("auto", gpu_ids or (index,), arch=req.gpu_arch)
        if choice.info is not None:
            index, card = choice.info.index, choice.info
    else:
        choice = gpu_mod.GpuChoice(gb=gpu_mod.parse_gb(req.gpu), info=card, arch_given=req.gpu_arch)
    plan_gb = int(emulate_vram) if emulate_vram is not None else choice.gb
    return _Target(family=family, out=out, gpu_ids=gpu_ids, index=index, card=card, choice=choice, plan_gb=plan_gb,
                   python=req.python or _trainer_python(req.sd_scripts), note=note)


def _trainer_python(sd_scripts: Path | None) -> str:
    """`sdscripts.trainer_python` of the checkout `run` will use (the install's own venv, as `doctor`
    finds it; a broken one is still named, so the pre-flight says it cannot run)."""
    from kohya_tuner import sdscripts

    try:
        checkout = sdscripts.locate(sd_scripts)
    except UserError:
        checkout = None  # the pre-flight says what is wrong with the folder
    return sdscripts.trainer_python(checkout) if checkout is not None else sys.executable


def _plan(req: RunRequest, t: _Target, warn: Callable[[str], None]) -> _Planned:
    family, choice, card, emulate_vram, cpu = t.family, t.choice, t.card, req.emulate_vram, req.cpu
    sets = list(req.sets)
    # The images first: a broken dataset is the cheapest thing to find out about. A fresh
    # `dataset prep` copy is what training reads (build_dataset picks it the same way), so it
    # is what gets checked.
    # Judged at the resolution the plan trains at: --preset / --set may change it.
    sized = presets.compose(family.name, req.job, t.plan_gb, preset_file=req.preset, sets=sets, variant=req.variant)
    report, checked = planning.check_data(req.data, family, req.job, req.trigger, sized.config)

    inputs, missing_files = planning.model_inputs(family, base=req.base, clip_l=req.clip_l, t5xxl=req.t5xxl,
                                                  ae=req.ae, name=req.name, out=t.out, steps=req.steps,
                                                  files=dict(req.files))
    if missing_files:
        raise UserError(f"{family.label} needs {', '.join(missing_files)}.",
                        f"Give the model file{'s' if len(missing_files) > 1 else ''}, e.g. {missing_files[0]} "
                        "/models/file.safetensors.")
    plan = presets.compose(family.name, req.job, t.plan_gb, preset_file=req.preset, sets=sets, variant=req.variant,
                           inputs=inputs, bf16=None if emulate_vram is not None and choice.info is None else choice.bf16,
                           network=req.network)
    absent = planning.absent_model_files(plan.config, family, {k: src.layer for k, src in plan.provenance.items()})
    if absent and not req.dry_run:
        # sd-scripts would find out only after starting Python, torch and accelerate.
        raise planning.absent_files_refusal(absent, family)
    ds = presets.build_dataset(plan, req.data, req.trigger)
    gpu_name = choice.info.name if choice.info else (card.name if card else None)
    driver = choice.driver or (card.driver or None if card else None)
    others = choice.others_gib if choice.info else 0.0
    user_keys = planning.user_keys(plan)  # before the fit writes its own layer over any of them
    fitted = planning.fit_plan(plan, ds, t.plan_gb, others_gib=0.0 if emulate_vram is not None else others,
                               gpu_name=gpu_name, bf16=choice.bf16, gpus=t.num_processes, do_fit=not req.no_fit,
                               cpu=cpu, driver=driver)
    ds, hist = fitted.dataset, history.load()
    fit_lines: list[str] = []
    if fitted.fit is not None:
        fit_lines = [f"{st.move}: {st.reason}" for st in fitted.fit.steps] + fitted.notes
        if not fitted.fit.fits:
            warn(f"{fitted.fit.message}; launching anyway: the supervisor downgrades further after a real OOM.")
    total = int(plan.config.get("max_train_steps") or 1600)
    probe_steps = req.probe_steps
    if probe_steps is not None and not (1 <= probe_steps < total):
        raise UserError(f"--probe-steps {probe_steps} must be between 1 and the run's {total} steps.")
    for key, value in ensure_resumable(plan.config, total).items():
        if plan.config.get(key) != value:
            plan.set(key, value, "run", "Resumable states so an OOM costs minutes, not the run.")
    est = memory.estimate({**fitted.assumed, **plan.config, **planning.sample_size_key(plan)}, family, dataset=ds,
                          gpus=t.num_processes, history=hist, gpu_name=gpu_name, driver=driver)
    # A CPU run stands in for the card's: the fit and the estimate are the card's plan (fp8 weights
    # and block swap included, without which a FLUX plan cannot fit 12 GB and the fit would spend
    # the whole ladder before the first launch); only then is what the CPU cannot execute switched.
    for key, old, new, why in preflight.cpu_switches(plan.config) if cpu else ():
        plan.set(key, new, "--cpu", why)
        if new is None:  # a key left out has no provenance to show it: said here instead
            plan.notes.append(f"--cpu: {key} = {old} left out: {why}")
    return _Planned(plan=plan, dataset=ds, data_report=report, checked=checked, images=len(report.trainable),
                    user_keys=user_keys, fitted=fitted, fit_lines=fit_lines, total=total, est=est, absent=absent)


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except (OSError, RuntimeError):
        return False


def _preflight(req: RunRequest, t: _Target, p: _Planned) -> tuple[preflight.Facts, preflight.Report]:
    """The checks before any file is written; the switches they make go into the plan."""
    facts = preflight.gather(out_dir=t.out, python=t.python, sd_scripts=req.sd_scripts, cpu=req.cpu)
    checks = preflight.evaluate(p.plan.config, t.family, facts, gpu_index=t.index, gpu_ids=t.gpu_ids,
                                num_processes=t.num_processes, predicted_gib=p.est.monitor_gib,
                                lora_params=p.est.lora_params, total_steps=p.total, images=p.images,
                                strict=req.strict, strict_pin=req.strict_pin, cpu=req.cpu, dry_run=req.dry_run)
    for key, _old, new, why in checks.changes:
        p.plan.set(key, new, "pre-flight", why)
    for a in p.absent:
        checks.checks.append(preflight.Check("model", "warn", f"{a.shown()} does not exist on this machine",
                                             "A run refuses to launch until the path is right."))
    if _same_folder(t.out, p.checked):
        checks.checks.append(preflight.Check(
            "dataset", "warn", f"--out is the image folder {p.checked}: config.toml, the logs and output/ (LoRA "
            "files, states, previews) go among the training images", "Give --out a folder of its own."))
    for f in p.data_report.findings:
        if f.severity == "warn":
            checks.checks.append(preflight.Check("dataset", "warn", f.message))
    if checks.failures:
        listed = "; ".join(c.message + (f" ({c.hint})" if c.hint else "") for c in checks.failures)
        raise PreflightFailed(f"Pre-flight checks failed: {listed}.", checks)
    return facts, checks


def _write(req: RunRequest, t: _Target, p: _Planned, facts: preflight.Facts) -> tuple[Written, RunSettings, list[str]]:
    """The plan files and run.json, once the plan is valid and confined to --out."""
    plan, out = p.plan, t.out
    schema.raise_if_invalid(presets.validate_plan(plan, p.dataset), "The planned config")
    outpaths.confine(plan.config, out, what="The plan")  # nothing written outside --out
    secretstore.withhold(plan, out)  # the trainer gets them through its environment

    checkout = Path(facts.checkout_path or preflight.PLACEHOLDER)
    files = planfiles.render(plan, p.dataset, out, sd_scripts=checkout, assumed=p.fitted.assumed,
                             gpu_ids=t.gpu_ids)
    written = planfiles.write(files, out, force=req.force)
    gpu_info = None
    info = t.choice.info or t.card
    if info is not None:
        gpu_info = {"name": info.name, "total_gib": round(info.total_gib, 3), "index": info.index,
                    "driver": info.driver or None}
    acc = req.accelerate_config
    settings = RunSettings(
        out_dir=out, family=t.family, script=checkout / t.family.script, dataset_file=written["dataset.toml"],
        plan_config=dict(plan.config), total_steps=p.total, python=t.python, num_processes=t.num_processes,
        gpu_ids=t.gpu_ids, gpu_index=t.index, accelerate_config=acc.absolute() if acc else None,
        cpu=req.cpu, emulate_vram_gb=req.emulate_vram, max_attempts=req.max_attempts or DEFAULT_MAX_ATTEMPTS,
        hang_minutes=req.hang_timeout or DEFAULT_HANG_MINUTES, probe_steps=req.probe_steps, policy=req.policy,
        gpu=gpu_info, predicted_gib=round(p.est.monitor_gib, 3), dataset=p.dataset, model=req.model, job=req.job,
        user_keys=tuple(sorted(p.user_keys)))
    Journal(out).write_run(settings.to_json())
    return written, settings, list(files.left_out.values())


def prepare(req: RunRequest, *, warn: Callable[[str], None]) -> PreparedRun:
    """Plan, check and write a new run's files and run.json; with `dry_run`, its first
    attempt's config too. Raises UserError (PreflightFailed with the report) on refusal."""
    t = _target(req)
    if t.note:
        warn(t.note)
    p = _plan(req, t, warn)
    _facts, checks = _preflight(req, t, p)
    written, settings, left_out = _write(req, t, p, _facts)
    plan, out, probe_steps, est = p.plan, t.out, req.probe_steps, p.est
    first = Retry(config=dict(plan.config), resume_from=None, changes=[],
                  reason=(f"a {probe_steps}-step probe before the full run" if probe_steps else "the fitted plan"),
                  start_step=0)
    first_config = probe_config(plan.config, probe_steps, out) if probe_steps else plan.config
    cfg_path = Journal(out).config_path(1)
    if req.dry_run:
        from kohya_tuner.run.loop import Supervisor

        cfg_path = Supervisor(settings).write_attempt_config(
            1, attempt_config(first_config, resume_from=None, resume_step=0, stored_step=None), first.reason)
    argv, env = command_for(settings, cfg_path, first_config)
    env_added = launcher.env_changes(env, os.environ)
    described = t.choice.describe() if not req.cpu else "CPU (--cpu)"
    budget = p.fitted.budget_gib
    summary = {
        "gpu": described, "plan_gb": t.plan_gb, "budget_gib": round(budget, 3),
        "predicted_peak_gib": round(est.peak_gib, 3), "predicted_phase": est.peak_phase,
        "history_correction": est.correction, "fit": p.fit_lines, "files": {k: str(v) for k, v in written.items()},
        "checks": [c.__dict__ for c in checks.checks], "command": argv, "environment": env_added,
        "attempt_config": str(cfg_path), "data": str(p.checked), "notes": list(plan.notes) + left_out,
    }
    return PreparedRun(
        family_label=t.family.label, job=req.job, cpu=req.cpu, gpu_described=described, emulate_vram=req.emulate_vram,
        plan=plan, fitted=p.fitted, fit_lines=p.fit_lines, peak_gib=est.peak_gib, peak_phase=est.peak_phase,
        correction=est.correction, budget_gib=budget, checks=checks, written=written, argv=argv, env_added=env_added,
        summary=summary, out=out, dry_run=req.dry_run,
        launch=Launch(settings=settings, first=first, first_attempt=1, probe=bool(probe_steps),
                      events_file=req.json_events))


def prepare_continue(req: ContinueRequest) -> Continuation:
    """Where the run in `req.out` picks up, with the flags --continue may change applied."""
    from kohya_tuner.run.continuation import continuation
    from kohya_tuner.run.policy import Stop

    out = req.out
    j = Journal(out)
    run_data = j.read_run()
    _refuse_moved_run(out, run_data)
    settings = RunSettings.from_json(out.absolute(), run_data)
    if req.max_attempts is not None:
        settings.max_attempts = req.max_attempts
    if req.hang_timeout is not None:
        settings.hang_minutes = req.hang_timeout
    if req.python:
        settings.python = req.python
    if req.cpu:
        settings.cpu = True
    summary = j.read_summary()
    if summary and summary.get("status") == "success":
        return Continuation(finished=summary)
    attempts = j.attempts()
    action = continuation(attempts, settings)
    if isinstance(action, Stop):
        raise UserError(f"Cannot continue {out}: {action.reason}.", " ".join(action.advice) or None)
    if not req.dry_run:
        config = getattr(action, "config", None) or settings.plan_config
        absent = planning.absent_model_files(config, settings.family, {k: "the run's plan" for k in config})
        if absent:
            raise planning.absent_files_refusal(absent, settings.family)
    # A run planned with --dry-run --probe-steps starts with its probe.
    probe = not attempts and bool(settings.probe_steps)
    if req.dry_run:
        from kohya_tuner.run.dryrun import continuation_preview

        return Continuation(preview=continuation_preview(j, settings, action, probe=probe))
    return Continuation(launch=Launch(settings=settings, first=action, first_attempt=j.next_attempt_number(),
                                      probe=probe, events_file=req.json_events))


def _refuse_moved_run(out: Path, run_data: dict[str, Any]) -> None:
    """run.json names the folder the run was planned in (its dataset.toml and output/ there): a
    folder moved or copied since would be continued into the old one, outside this --out."""
    planned = run_data.get("dataset_file")
    output = (run_data.get("plan_config") or {}).get("output_dir")
    if not isinstance(planned, str) or not isinstance(output, str):
        return
    home = Path(planned).parent
    here = out.absolute()
    try:
        same = home.resolve() == here.resolve()
    except (OSError, RuntimeError):
        same = False
    if same:
        return
    raise UserError(f"{out} was planned in {home}: its run.json names the files there (dataset.toml, the "
                    f"output folder {output}), so --continue here would read and write in {home}, not in {out}.",
                    f"Continue it where it was planned (`kohya-tuner run --continue {home}`, moving the folder "
                    "back first if it was moved), or start a new run in this folder's place.")


def supervise(launch: Launch, *, on_event: Callable[[RunEvent], None] | None = None) -> Outcome:
    """The attempt loop from the launch's first attempt to its outcome (run/loop.py)."""
    from kohya_tuner.run.loop import Supervisor

    sup = Supervisor(launch.settings, on_event=on_event, events_file=launch.events_file)
    return sup.run(launch.first, first_attempt=launch.first_attempt, probe_first=launch.probe)
