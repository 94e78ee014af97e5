"""`kohya-tuner run`: plan, check, launch sd-scripts, watch it, recover from OOM.

Parsing and printing only: the flags become a request; run/start.py plans, checks, writes
and launches; cli/run_render.py shows what comes back.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from kohya_tuner.cli import plan_options
from kohya_tuner.cli.argtypes import finite_float, int_range, positive_int, out_path

if TYPE_CHECKING:
    from kohya_tuner.run.request import ContinueRequest, Launch, RunRequest

DESCRIPTION = ("Train a LoRA with sd-scripts, watch it live, and recover from CUDA out-of-memory by downgrading "
               "settings and resuming from the last saved state.")


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
                   help="Interpreter of the environment sd-scripts is installed in (default: a venv in the checkout, "
                        "or the kohya_ss GUI's venv beside it, else this one).")
    p.add_argument("--dry-run", action="store_true",
                   help="Plan, check and write the files, print the command, launch nothing.")
    p.add_argument("--max-attempts", type=int_range(1, 100), metavar="N",
                   help="Launches at most, retries included (default 6).")
    p.add_argument("--probe-steps", type=positive_int, metavar="N",
                   help="A short trial run of N steps first, to meet an OOM early (the guides suggest 100-200).")
    p.add_argument("--emulate-vram", type=finite_float(1.0, 1024.0), metavar="GB",
                   help="Cap the trainer's CUDA memory at GB, to prove a smaller card's preset on a bigger one.")
    plan_options.add_gpus(p)
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


def _new_request(a: argparse.Namespace) -> RunRequest:
    from kohya_tuner.run.request import RunRequest

    return RunRequest(
        model=a.model, job=a.job, gpu=a.gpu, out=a.out, data=a.data, base=a.base, clip_l=a.clip_l, t5xxl=a.t5xxl,
        ae=a.ae, trigger=a.trigger, name=a.name, steps=a.steps, variant=a.variant, preset=a.preset,
        sets=tuple(a.sets or ()), files=plan_options.model_files(a), network=a.network, gpu_arch=a.gpu_arch,
        sd_scripts=a.sd_scripts, python=a.python, dry_run=a.dry_run, max_attempts=a.max_attempts,
        probe_steps=a.probe_steps, emulate_vram=a.emulate_vram, gpus=a.gpus, accelerate_config=a.accelerate_config,
        json_events=a.json_events, strict=a.strict, strict_pin=a.strict_pin, hang_timeout=a.hang_timeout, cpu=a.cpu,
        policy=a.policy, no_fit=a.no_fit, force=a.force)


def _continue_request(a: argparse.Namespace, out: Path) -> ContinueRequest:
    from kohya_tuner.run.request import ContinueRequest

    return ContinueRequest(out=out, max_attempts=a.max_attempts, hang_timeout=a.hang_timeout,
                           json_events=a.json_events, python=a.python, cpu=a.cpu, dry_run=a.dry_run)


def run(args: argparse.Namespace) -> int:
    from kohya_tuner.cli.common import warn
    from kohya_tuner.errors import UserError
    from kohya_tuner.run import guards
    from kohya_tuner.run.lock import RunLock

    a = args
    if a.continue_ is not None:
        guards.refuse_plan_flags_with_continue(a, add_arguments)
        out = guards.continue_folder(a.continue_)
        if a.json_events is not None:
            guards.events_file(a.json_events)
        with RunLock(out, "run --continue") as lock:
            if lock.stale_note():
                warn(lock.stale_note())
            return _continue(_continue_request(a, out), as_json=a.json)
    missing = [flag for flag, v in (("--model", a.model), ("--job", a.job), ("--out", a.out), ("--data", a.data))
               if v is None]
    if missing:
        raise UserError(f"run needs {', '.join(missing)} (or --continue OUT).",
                        "Example: kohya-tuner run --model sdxl --job style --base sdxl.safetensors "
                        "--data ./images --out runs/mystyle")
    guards.writable_folder(Path(a.out))
    if a.json_events is not None:
        guards.events_file(a.json_events)
    with RunLock(Path(a.out).absolute(), "run") as lock:
        if lock.stale_note():
            warn(lock.stale_note())
        return _new_run(_new_request(a), as_json=a.json)


def _new_run(request: RunRequest, *, as_json: bool) -> int:
    from kohya_tuner.cli import run_render
    from kohya_tuner.cli.common import console, print_json, warn
    from kohya_tuner.run import start
    from kohya_tuner.run.request import PreflightFailed

    try:
        prepared = start.prepare(request, warn=warn)
    except PreflightFailed as exc:
        if not as_json:
            console.print(run_render.checks_table(exc.report))
        raise
    if not as_json:
        run_render.print_plan(prepared)
    if not prepared.dry_run:
        return _supervise(prepared.launch, as_json=as_json)
    if as_json:
        print_json({"dry_run": True, **prepared.summary})
    else:
        run_render.print_dry_run(prepared)
    return 0


def _continue(request: ContinueRequest, *, as_json: bool) -> int:
    from kohya_tuner.cli import run_render
    from kohya_tuner.cli.common import console, print_json
    from kohya_tuner.run import start

    where = start.prepare_continue(request)
    if where.finished is not None:
        if as_json:
            print_json(where.finished)
        else:
            console.print(f"This run already finished: {where.finished.get('lora')}")
        return 0
    if where.preview is not None:
        if as_json:
            print_json(where.preview)
        else:
            run_render.print_preview(where.preview)
        return 0
    assert where.launch is not None
    return _supervise(where.launch, as_json=as_json)


def _supervise(launch: Launch, *, as_json: bool) -> int:
    from kohya_tuner.cli import run_render
    from kohya_tuner.cli.common import err_console, print_json
    from kohya_tuner.run import start

    display = run_render.LiveDisplay(quiet=as_json)
    try:
        outcome = start.supervise(launch, on_event=display.handle)
    except KeyboardInterrupt:
        display.close()
        err_console.print(f"\nInterrupted. States are kept; continue with: kohya-tuner run --continue "
                          f"{launch.settings.out_dir}")
        return 130
    finally:
        display.close()
    if as_json:
        print_json(outcome.summary)
    else:
        run_render.print_outcome(outcome.summary)
    return outcome.exit_code
