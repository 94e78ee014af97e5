"""`kohya-tuner setup`: get the pinned sd-scripts, or check the one already there."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Optional

import typer

from kohya_tuner import sdscripts
from kohya_tuner.cli.common import console, print_json, user_errors
from kohya_tuner.errors import UserError


def register(app: typer.Typer) -> None:
    app.command(
        "setup",
        short_help="Clone sd-scripts at the pinned commit, or verify an existing checkout against the pin.",
        help=(
            "Clone the sd-scripts release kohya-tuner is pinned to (into the data directory, or --dir), "
            "or verify an existing checkout with --sd-scripts / $KOHYA_SD_SCRIPTS, and report how it "
            "differs from the pin."
        ),
    )(setup_command)


@user_errors
def setup_command(
    dest_dir: Optional[Path] = typer.Option(None, "--dir", help="Clone into this folder instead of the data directory."),
    sd_scripts: Optional[Path] = typer.Option(
        None, "--sd-scripts", help="Verify this existing checkout (or kohya_ss install) instead of cloning."),
    repo_url: Optional[str] = typer.Option(None, "--repo-url", help="Clone from this address (a mirror) instead of upstream."),
    install_requirements: bool = typer.Option(
        False, "--install-requirements", help="Also run pip install -r requirements.txt with --python."),
    python: Optional[str] = typer.Option(
        None, "--python", help="Python of the trainer environment for --install-requirements (default: this one)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    if dest_dir is not None and sd_scripts is not None:
        raise UserError("--dir and --sd-scripts exclude each other: --dir clones, --sd-scripts verifies a checkout.")
    if sd_scripts is not None or (dest_dir is None and os.environ.get(sdscripts.ENV_VAR)):
        checkout = sdscripts.locate(sd_scripts)
        assert checkout is not None  # an explicit path or the variable either resolves or raises
        source = "--sd-scripts" if sd_scripts is not None else f"${sdscripts.ENV_VAR}"
        action = f"verified the existing checkout given by {source}"
    else:
        result = sdscripts.setup_checkout(dest_dir, repo_url=repo_url, progress=not json_out)
        checkout, action = result.checkout, result.action
    report = sdscripts.verify(checkout)
    pip_cmd = sdscripts.requirements_command(checkout, python)
    installed: Optional[int] = None
    if install_requirements:
        installed = sdscripts.install_requirements(checkout, python)
        if installed != 0:
            raise UserError(f"pip exited with status {installed} while installing sd-scripts' requirements.",
                            "Its output above says which package failed.")

    found_by_default = checkout.path == sdscripts.default_dir().expanduser().resolve()
    if json_out:
        print_json({
            "action": action,
            "path": str(checkout.path),
            "is_git": checkout.is_git,
            "scripts": sorted(checkout.scripts),
            "found_without_flags": found_by_default or bool(os.environ.get(sdscripts.ENV_VAR)),
            "report": report.to_dict(),
            "requirements_command": pip_cmd,
            "requirements_installed": None if installed is None else installed == 0,
        })
        return
    _render(checkout, action, report, pip_cmd, installed, found_by_default)


def _render(checkout: sdscripts.Checkout, action: str, report: sdscripts.PinReport, pip_cmd: list[str],
            installed: Optional[int], found_by_default: bool) -> None:
    out = lambda text="": console.print(text, soft_wrap=True)  # noqa: E731 - paths must not be wrapped
    pinned = report.pinned_commit[:12]
    out(f"sd-scripts: {action}: [bold]{checkout.path}[/bold]")
    commit = report.commit[:12] if report.commit else "unknown (not a git checkout)"
    out(f"  commit:         {commit} (pinned: {pinned})")
    out(f"  entry scripts:  {', '.join(sorted(checkout.scripts)) or 'none'}")
    if report.matches:
        out("  [green]matches the pin[/green]")
    else:
        reasons = []
        if report.commit != report.pinned_commit:
            reasons.append("another commit" if report.commit else "commit unknown")
        if report.local_changes:
            reasons.append(f"local changes in {len(report.local_changes)} file(s)")
        if report.missing_scripts:
            reasons.append("missing " + ", ".join(report.missing_scripts))
        out(f"  [yellow]differs from the pin[/yellow]: {'; '.join(reasons)}. kohya-tuner will use it with a "
            "warning; `run --strict-pin` refuses it.")
        for path in report.local_changes[:10]:
            out(f"    changed: {path}")
        if report.differences:
            out(f"  {len(report.differences)} argument difference(s) from the pin (read from its source):")
            for line in report.differences:
                out(f"    {line}")
        elif report.checked_by == "arguments":
            out("  its arguments are the same as the pin's (read from its source)")
        for item in report.unchecked:
            out(f"    not checked (could not read): {item}")
    if not found_by_default and not os.environ.get(sdscripts.ENV_VAR):
        out(f"  Other commands find it with --sd-scripts {shlex.quote(str(checkout.path))} "
            f"or `export {sdscripts.ENV_VAR}={shlex.quote(str(checkout.path))}`.")
    if installed is None:
        env = sdscripts.pin()["environment"]
        out()
        out(f"Trainer environment: install torch >= {env['torch_min']} first (upstream tests Python {env['python']}), "
            "then its requirements with the Python that will run training (`run --python`, default this one):")
        out(f"  cd {shlex.quote(str(checkout.path))} && {shlex.join(pip_cmd)}")
    else:
        out("[green]requirements installed[/green]")
