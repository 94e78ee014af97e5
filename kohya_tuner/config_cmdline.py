"""Reading a pasted command line (`accelerate launch … train_network.py --key value …`) the way
sd-scripts reads it: with argparse (check/cmdline.py), after undoing shell continuations."""

from __future__ import annotations

import re
from typing import Any

from kohya_tuner import safeio, schema
from kohya_tuner.config_loaded import LoadedConfig, coerce_checked, guess_family
from kohya_tuner.errors import UserError
from kohya_tuner.families import FAMILIES, family_for_script, get_family


def _join_wrapped_lines(text: str) -> str:
    """Undo the ways a command line gets split: shell continuations (`\\`, `^`, PowerShell
    backtick) and console wrapping that breaks a token in the middle (a line that starts
    without indentation right after a line that ended without a space)."""
    lines = [ln.rstrip("\r") for ln in text.split("\n")]
    out = ""
    for ln in lines:
        stripped = ln.strip()
        if not stripped or stripped.startswith(("#", "REM ", "rem ", "::")):
            continue
        if not out:
            out = ln.rstrip()
        elif out.endswith(("\\", "^", "`")):
            out = out[:-1].rstrip() + " " + stripped
        elif ln[:1].isspace() or stripped.startswith("--"):
            out += " " + stripped
        else:
            out += stripped
        out = out.rstrip()
    return out


# shlex's splitting (posix, whitespace only, no escape: a backslash is a Windows path
# separator, never an escape) without shlex's cost, which grows with the square of a
# token's length. A quoted part is taken whole; quotes join the parts around them.
_TOKEN_RE = re.compile(r"""(?:[^ \t\r\n'"]|'[^']*'|"[^"]*")+""")
_GAP_RE = re.compile(r"[ \t\r\n]*")
_QUOTED_RE = re.compile(r"'([^']*)'|\"([^\"]*)\"")


def _tokens(command: str) -> list[str]:
    out: list[str] = []
    pos = _GAP_RE.match(command).end()
    while pos < len(command):
        m = _TOKEN_RE.match(command, pos)
        if m is None or (m.end() < len(command) and command[m.end()] not in " \t\r\n"):
            raise UserError("Cannot split the command line: No closing quotation (an unclosed quote?).")
        out.append(_QUOTED_RE.sub(lambda q: q.group(1) if q.group(1) is not None else q.group(2), m.group()))
        pos = _GAP_RE.match(command, m.end()).end()
    return out


_EXEC_RE = re.compile(r"Executing command:[ \t]*(.*)")
_LOG_LINE_RE = re.compile(r"^\S")  # a new log record starts at the left margin
_SHELL_NOTE_RE = re.compile(r"\s+with shell=(?:True|False)\s*$")
_LIST_START_RE = re.compile(r"\[\s*(?=['\"])")
_MAX_LIST_TRIES = 64


def _argv_list(text: str) -> list[str] | None:
    """The first Python list of strings holding a `.py` item: `subprocess.run([...])`, or the
    `CalledProcessError: Command '[...]'` line accelerate and the kohya_ss GUI print on failure
    (item text as Python's repr writes it, so `\\\\` is one backslash)."""
    import ast

    tries = 0
    for m in _LIST_START_RE.finditer(text):
        end = m.start()
        while tries < _MAX_LIST_TRIES:
            end = text.find("]", end + 1)
            if end < 0:
                break
            tries += 1
            try:
                value = ast.literal_eval(text[m.start():end + 1])
            except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
                continue
            if isinstance(value, list) and value and all(isinstance(v, str) for v in value) and \
                    any(v.replace("\\", "/").endswith(".py") for v in value):
                return value
            break
    return None


def _executing_command(text: str) -> str | None:
    """The command of a kohya_ss GUI log's `Executing command:` record: its continuation lines are
    indented under the message, and the GUI appends ` with shell=True` to the command."""
    lines = text.split("\n")
    for n, line in enumerate(lines):
        m = _EXEC_RE.search(line)
        if not m:
            continue
        parts = [m.group(1).strip()]
        for cont in lines[n + 1:]:
            if not cont.strip() or _LOG_LINE_RE.match(cont):
                break
            parts.append(cont.strip())
        return _SHELL_NOTE_RE.sub("", " ".join(parts))
    return None


def command_tokens(text: str) -> list[str]:
    """The argv a pasted command stands for, whichever form it came in: a shell, .bat or .ps1
    command (with its continuations), a GUI log's `Executing command:` record, or a Python list."""
    executing = _executing_command(text)
    if executing is not None:
        return _tokens(executing)
    joined = _join_wrapped_lines(text)
    try:
        tokens = _tokens(joined)
    except UserError:
        tokens = []
    if any(t.replace("\\", "/").endswith(".py") and not t.startswith(("[", "'[")) for t in tokens):
        return tokens
    listed = _argv_list(text)
    if listed is not None:
        return listed
    if not tokens:
        _tokens(joined)  # raises the reason it cannot be split
    return tokens


def parse_command_line(text: str, model: str | None = None) -> LoadedConfig:
    return parse_argv(command_tokens(text), model)


def parse_argv(tokens: list[str], model: str | None = None) -> LoadedConfig:
    """A command's argv (launcher, script, the script's arguments) as sd-scripts receives it."""
    script_idx = next((i for i, t in enumerate(tokens) if t.replace("\\", "/").endswith(".py")), None)
    if script_idx is None:
        raise UserError("No sd-scripts entry script (…_train_network.py) found in the command line.")
    script_path = tokens[script_idx]
    script_name = script_path.replace("\\", "/").rsplit("/", 1)[-1]
    notes: list[str] = []
    from kohya_tuner.check import not_lora

    from kohya_tuner.memory.finetune import family_for as fine_tune_family

    fine_tune = fine_tune_family(script_name, None, model)
    if not_lora(script_name) and fine_tune is None:
        # Not LoRA training: the check names it; nothing here is parsed as LoRA settings.
        return LoadedConfig({}, None, script_name, "command_line", None, [f"{script_name} is {not_lora(script_name)}"])
    fam = fine_tune or family_for_script(script_name)
    if model and fine_tune is None:
        fam = get_family(model)
    script = fam.script if fam else script_name
    try:
        specs = schema.script_args(script)
    except UserError:
        raise UserError(f"{script_name} is not an sd-scripts LoRA entry script kohya-tuner knows "
                        f"({', '.join(f.script for f in FAMILIES.values())}).") from None
    launcher_opts = tokens[:script_idx]
    if "--mixed_precision" in " ".join(launcher_opts):
        notes.append("accelerate's own --mixed_precision is ignored by sd-scripts; only the script's setting counts")
    args = tokens[script_idx + 1:]
    from kohya_tuner.check import cmdline

    parsed = cmdline.parse(script, args)
    problems: list = []
    if parsed.refusal is None:
        config = dict(parsed.values)
        if config.pop("config_file", None) is not None:
            notes.append("the command line names a --config_file; its values count where the command line "
                         "does not set them: read that file for the full picture")
        for short, full in parsed.abbreviations.items():
            notes.append(f"{short} is argparse's abbreviation of --{full} (a unique prefix), read as --{full}")
        safeio.check_values(config, "the command line")
        dataset_path = config.get("dataset_config")
        if fam is None:
            fam = guess_family(config, script, model)
        if fine_tune is not None:
            fam = fine_tune_family(script_name, config, model)
        return LoadedConfig(config, fam, script, "command_line", dataset_path, notes, problems=problems)
    from kohya_tuner.check import Problem

    problems.append(Problem("command line", f"argparse refuses it: {parsed.refusal}", "error", ("command line",),
                            f"{script}: parser.parse_args (argparse exits 2 before any sd-scripts code runs)",
                            "argparse", "command_line"))
    # What argparse refused stops the launch; the rest is still read, to judge it too.
    config: dict[str, Any] = {}
    dataset_path = None
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if not tok.startswith("--"):
            notes.append(f"ignored stray token {tok!r}")
            continue
        name, eq, inline = tok[2:].partition("=")
        values: list[str] = [inline] if eq else []
        if not eq:
            while i < len(args) and not args[i].startswith("--"):
                values.append(args[i])
                i += 1
        spec = specs.get(name)
        if spec is None:
            near = schema.closest_key(name, specs)
            notes.append(f"--{name} is not an argument of {script}" + (f" (did you mean --{near}?)" if near else "")
                         + "; ignored")
            continue
        if name == "config_file":
            notes.append("the command line names a --config_file; read that file for the full picture")
            continue
        if name == "dataset_config":
            dataset_path = values[0] if values else None
            config[name] = dataset_path
            continue
        try:
            if spec.type == "bool-store_true":
                config[name] = True if not values else coerce_checked(name, spec, values[0], "the command line")
            elif spec.type == "list":
                config[name] = coerce_checked(name, spec, values, "the command line")
            else:
                if not values:
                    notes.append(f"--{name} has no value; ignored")
                    continue
                config[name] = coerce_checked(name, spec, values[0], "the command line")
        except ValueError:
            notes.append(f"--{name} {' '.join(values)!r} is not a valid {spec.type}; ignored")
    if fam is None:
        fam = guess_family(config, script, model)
    if fine_tune is not None:
        fam = fine_tune_family(script_name, config, model)  # train_db.py / fine_tune.py --v2: SD 2.x
    return LoadedConfig(config, fam, script, "command_line", dataset_path, notes, problems=problems)
