"""`kohya-tuner check`: would the pinned sd-scripts start training with this config?"""

from __future__ import annotations

import argparse
from pathlib import Path

DESCRIPTION = ("Check a config against every start-up rule of the pinned sd-scripts (asserts, refusals, value "
               "ranges, silent adjustments). Exit 0 when sd-scripts would start training, 2 when it would refuse.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path, metavar="CONFIG",
                   help="sd-scripts config TOML, kohya_ss GUI JSON, or a file holding the accelerate launch / "
                        "python command line.")
    p.add_argument("--dataset-config", "--dataset", "-d", dest="dataset", type=Path, metavar="FILE",
                   help="The --dataset_config file (default: the one the config names).")
    p.add_argument("--model", "-m", help="Model family (sd15, sdxl, flux, sd2, sd3, sd35m, sd35l, chroma, lumina2, hunyuan21, anima), "
                                         "when the file does not say.")
    p.add_argument("--json", action="store_true",
                   help='Print {"ok", "script", "problems", "warnings"} as one JSON object.')


def _dataset(args: argparse.Namespace, named: str | None):
    from kohya_tuner import config_io

    if args.dataset is not None:
        return config_io.read_dataset(args.dataset)
    if not named:
        beside = _written_beside(args.config)
        return config_io.read_dataset(beside) if beside else None
    path = Path(named).expanduser()
    for candidate in ([path] if path.is_absolute() else [path, args.config.parent / path]):
        if candidate.is_file():
            return config_io.read_dataset(candidate)
    return None  # the dataset_config_missing rule names it


def _written_beside(config: Path) -> Path | None:
    """The dataset file kohya-tuner wrote beside its own config.toml: its launch scripts pass
    that pair, so checking the config without it would report no images the launch has."""
    from kohya_tuner.planfiles import CONFIG_HEADER_MARK, DATASET_NAME

    beside = config.parent / DATASET_NAME
    try:
        with config.open("rb") as f:  # read_config has already found it a regular file
            first = f.read(200).split(b"\n", 1)[0]
    except OSError:
        return None
    return beside if CONFIG_HEADER_MARK.encode() in first and beside.is_file() else None


_VIA = {"config_file": "--config_file", "command_line": "the command line", "dataset_config": "--dataset_config"}


def _via(path: str) -> str:
    return f" [via {_VIA[path]}]" if path in _VIA else ""


# A file of thousands of unknown keys (a dump of some other tool's settings) would otherwise bury the
# one finding that matters under a screenful per key; the first few of a rule show what it is about.
_SHOWN_PER_RULE = 5


def _collapse(findings: list) -> tuple[list, list[tuple[str, list[str]]]]:
    """The findings to print one by one, and per rule the keys of the rest. A rule's findings are
    cut only where the cut saves more than one line."""
    total: dict[str, int] = {}
    for f in findings:
        total[f.rule] = total.get(f.rule, 0) + 1
    seen: dict[str, int] = {}
    shown, rest = [], {}
    for f in findings:
        seen[f.rule] = seen.get(f.rule, 0) + 1
        if total[f.rule] <= _SHOWN_PER_RULE + 1 or seen[f.rule] <= _SHOWN_PER_RULE:
            shown.append(f)
        else:
            rest.setdefault(f.rule, []).append(f.key)
    return shown, list(rest.items())


def _key_list(keys: list[str], limit: int = 8) -> str:
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} others" if len(keys) > limit else "")


def run(args: argparse.Namespace) -> int:
    from kohya_tuner import config_io
    from kohya_tuner.check import check, not_lora
    from kohya_tuner.errors import UserError

    loaded = config_io.read_config(args.config, args.model)
    script = loaded.script if not_lora(loaded.script) else (loaded.family.script if loaded.family else None)
    if script is None:
        raise UserError(f"Cannot tell which model {args.config} trains (no script name, network module or model "
                        f"path gives it away).", "Say it with --model (sd15, sdxl, flux, sd2, sd3, sd35m, sd35l, chroma, lumina2, hunyuan21 or anima).")
    dataset = None if not_lora(script) else _dataset(args, loaded.dataset_path)
    result = check(loaded.config, script, dataset=dataset, complete=True, filesystem=True, **loaded.check_args())
    if args.json:
        import sys

        # Written directly: a script reading this JSON should not wait for rich to import.
        sys.stdout.write(result.to_json() + "\n")
        sys.stdout.flush()
        return 0 if result.ok else 2

    from kohya_tuner.check.argschema import pinned_commit
    from kohya_tuner.cli.common import paragraph, warn

    for note in loaded.notes:
        warn(note)
    if args.dataset is None and not loaded.config.get("dataset_config") and dataset is not None:
        paragraph(f"dataset: {args.config.parent / 'dataset.toml'} (written beside this config; its launch "
                  "scripts pass it as --dataset_config)")
    shown_w, more_w = _collapse(result.warnings)
    for w in shown_w:
        warn(f"{', '.join(w.keys)}: {w.message} ({w.where}){_via(w.path)}")
    for rule, keys in more_w:
        warn(f"and {len(keys)} more [{rule}] like those: {_key_list(keys)} (--json lists each)")
    shown_p, more_p = _collapse(result.problems)
    for p in shown_p:
        paragraph(f"{', '.join(p.keys)}: {p.message} [{p.rule}] ({p.where}){_via(p.path)}", lead="refused",
                  lead_style="bold red")
    for rule, keys in more_p:
        paragraph(f"and {len(keys)} more [{rule}] like those: {_key_list(keys)} (--json lists each)",
                  lead="refused", lead_style="bold red")
    pin = pinned_commit()[:8]
    if result.ok:
        paragraph(f"ok: {script} at sd-scripts {pin} would start training with this config"
                  + (f" ({len(result.warnings)} adjustment(s) above)." if result.warnings else "."), style="green")
        return 0
    paragraph(f"{script} at sd-scripts {pin} would refuse this config: {len(result.problems)} problem(s).",
              style="red")
    return 2
