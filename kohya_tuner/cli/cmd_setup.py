"""`kohya-tuner setup`: get the pinned sd-scripts, or check the one already there."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

DESCRIPTION = ("Clone the sd-scripts release kohya-tuner is pinned to (into the data directory, or --dir), or "
               "verify an existing checkout with --sd-scripts / $KOHYA_SD_SCRIPTS, and report how it differs "
               "from the pin.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", dest="dest_dir", type=Path, metavar="DIR",
                   help="Clone into this folder instead of the data directory.")
    p.add_argument("--sd-scripts", type=Path, metavar="DIR",
                   help="Verify this existing checkout (or kohya_ss install) instead of cloning.")
    p.add_argument("--repo-url", metavar="URL", help="Clone from this address (a mirror) instead of upstream.")
    p.add_argument("--install-requirements", action="store_true",
                   help="Also run pip install -r requirements.txt with --python.")
    p.add_argument("--python", metavar="PATH",
                   help="Python of the trainer environment for --install-requirements (default: this one).")
    p.add_argument("--json", action="store_true", help="Print one JSON object.")


def run(args: argparse.Namespace) -> int:
    from kohya_tuner import sdscripts
    from kohya_tuner.cli.common import print_json
    from kohya_tuner.errors import UserError

    dest_dir, sd_scripts, repo_url = args.dest_dir, args.sd_scripts, args.repo_url
    install_requirements, python, json_out = args.install_requirements, args.python, args.json
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
    installed: int | None = None
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
        return 0
    _render(checkout, action, report, pip_cmd, installed, found_by_default)
    return 0


def _render(checkout, action: str, report, pip_cmd: list[str], installed: int | None,
            found_by_default: bool) -> None:
    from rich.markup import escape

    from kohya_tuner import sdscripts
    from kohya_tuner.cli.common import console, paragraph

    # Paths and source lines are printed as they are (escaped); only our own words carry style.
    out = lambda text="": console.print(escape(text), soft_wrap=True)  # noqa: E731 - paths must not be wrapped
    styled = lambda text: console.print(text, soft_wrap=True)  # noqa: E731

    def copy_line(text: str) -> None:
        # A line to paste into a shell goes out as it is: the console turns a tab in a path into spaces.
        console.file.flush()
        console.file.write(text + "\n")
        console.file.flush()
    pinned = report.pinned_commit[:12]
    styled(f"sd-scripts: {escape(action)}: [bold]{escape(str(checkout.path))}[/bold]")
    commit = report.commit[:12] if report.commit else "unknown (not a git checkout)"
    out(f"  commit:         {commit} (pinned: {pinned})")
    paragraph(f"entry scripts:  {', '.join(sorted(checkout.scripts)) or 'none'}", indent="  ")
    if report.matches:
        styled("  [green]matches the pin[/green]")
    else:
        reasons = []
        if report.commit != report.pinned_commit:
            reasons.append("another commit" if report.commit else "commit unknown")
        if report.local_changes:
            reasons.append(f"local changes in {len(report.local_changes)} file(s)")
        if report.changes_unknown:
            reasons.append(f"its files could not be compared with the commit ({report.changes_unknown})")
        if report.missing_scripts:
            reasons.append("missing " + ", ".join(report.missing_scripts))
        paragraph(f"{'; '.join(reasons)}. kohya-tuner will use it with a warning; `run --strict-pin` refuses it.",
                  indent="  ", lead="differs from the pin:", lead_style="yellow")
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
        out("  Other commands find it with either of these (each a line to copy):")
        copy_line(f"    --sd-scripts {shlex.quote(str(checkout.path))}")
        copy_line(f"    export {sdscripts.ENV_VAR}={shlex.quote(str(checkout.path))}")
    if installed is None:
        env = sdscripts.pin()["environment"]
        out()
        paragraph(f"Trainer environment: install torch >= {env['torch_min']} first (upstream tests Python "
                  f"{env['python']}), then its requirements with the Python that will run training (`run --python`; "
                  "by default the install's own venv where it has one, else this one):")
        copy_line(f"  cd {shlex.quote(str(checkout.path))} && {shlex.join(pip_cmd)}")
    else:
        styled("[green]requirements installed[/green]")
