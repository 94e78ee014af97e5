"""A pasted command line is read as sd-scripts' argparse reads it, in every form users paste it."""

from __future__ import annotations

import json
import subprocess

import pytest

from kohya_tuner.check import check, cmdline
from kohya_tuner.config_cmdline import command_tokens, parse_command_line
from tests.clihelp import invoke

SCRIPT = "/opt/sd-scripts/train_network.py"
ARGS = ["--pretrained_model_name_or_path", "/m/v1-5.safetensors", "--network_module", "networks.lora",
        "--network_dim", "16", "--resolution", "512,512", "--output_dir", "/o it's here", "--train_data_dir",
        "/data/img", "--network_args", "conv_dim=4", "conv_alpha=1", "--cache_latents"]
ARGV = ["/venv/bin/accelerate", "launch", "--num_processes", "1", SCRIPT, *ARGS]


def _expected(cfg):
    assert cfg["network_dim"] == 16 and cfg["resolution"] == "512,512" and cfg["cache_latents"] is True
    assert cfg["network_args"] == ["conv_dim=4", "conv_alpha=1"] and cfg["output_dir"] == "/o it's here"


def _posix(argv):
    import shlex

    return " ".join(shlex.quote(a) for a in argv)


FORMS = {
    "sh with continuations": " \\\n  ".join(_posix([a]) for a in ARGV),
    "bat with carets": " ^\n  ".join(f'"{a}"' if " " in a or "'" in a else a for a in ARGV),
    "ps1 with backticks": "& " + " `\n  ".join(f'"{a}"' if " " in a or "'" in a else a for a in ARGV),
    "python argv list": f"subprocess.run({ARGV!r}, check=True)",
    "CalledProcessError line": f"subprocess.CalledProcessError: Command '{ARGV!r}' returned non-zero exit status 1.",
    "GUI log Executing command": ("12:01:02-123456 INFO     Executing command: " + _posix(ARGV[:6]) + "\n"
                                  "                         " + _posix(ARGV[6:]) + " with shell=True\n"
                                  "12:01:02-223456 INFO     Command executed."),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_paste_form_gives_the_same_config(form):
    loaded = parse_command_line(FORMS[form])
    assert loaded.problems == [], loaded.problems
    _expected(loaded.config)
    assert loaded.script == "train_network.py" and loaded.origin == "command_line"


def test_the_posix_form_is_the_argv_a_real_shell_makes():
    # The shell form above is executed by a real shell: what it passes is what we read.
    text = FORMS["sh with continuations"].replace("/venv/bin/accelerate", "printf '%s\\n'", 1)
    out = subprocess.run(["sh", "-c", text], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ARGV[1:]
    assert command_tokens(FORMS["sh with continuations"]) == ARGV


def test_windows_backslashes_in_a_called_process_error_are_one_backslash():
    argv = ["E:\\kohya_ss\\venv\\Scripts\\python.exe", "E:/kohya_ss/sd-scripts/flux_train_network.py",
            "--config_file", "./test/output/config_lora-20240822-182849.toml"]
    text = f"CalledProcessError: Command '{argv!r}' returned non-zero exit status 1."
    assert command_tokens(text) == argv


@pytest.mark.parametrize("tokens,refusal", [
    (["--network_dim", "8.0"], "invalid int value: '8.0'"),
    (["--network_dimm", "8"], "unrecognized arguments: --network_dimm"),
    (["--network_d", "8"], "ambiguous option: --network_d"),
    (["--learning_rate"], "expected one argument"),
    (["--cache_latents", "true"], "unrecognized arguments: true"),
    (["--max_token_length", "75"], "invalid choice: 75"),
    (["--lr_warmup_steps", "1.5"], "is not an int or float"),
])
def test_argparse_refusals_on_the_command_line(tokens, refusal):
    parsed = cmdline.parse("train_network.py", tokens)
    assert parsed.refusal and refusal in parsed.refusal


def test_a_refusal_reaches_check_with_its_path_and_the_rest_is_still_judged(tmp_path):
    cmd = tmp_path / "train.sh"
    cmd.write_text(f"accelerate launch {SCRIPT} --network_dim 8.0 --pretrained_model_name_or_path m.safetensors "
                   "--network_module networks.lora --persistent_data_loader_workers --max_data_loader_n_workers 0\n",
                   encoding="utf-8")
    res = invoke("check", str(cmd), "--model", "sd15", "--json")
    data = json.loads(res.stdout)
    assert res.exit_code == 2
    assert any(p["path"] == "command_line" and "invalid int value" in p["message"] for p in data["problems"])
    assert any("persistent_data_loader_workers" in p["keys"] for p in data["problems"])
    est = invoke("estimate", str(cmd), "--model", "sd15")
    assert est.exit_code == 2 and "invalid int value" in est.output


def test_a_unique_prefix_is_what_argparse_reads_and_is_noted():
    loaded = parse_command_line(f"python {SCRIPT} --network_di 16 --network_module networks.lora")
    assert loaded.config["network_dim"] == 16 and loaded.problems == []
    assert any("abbreviation of --network_dim" in n for n in loaded.notes)


def test_the_same_value_is_refused_on_a_command_line_and_trains_from_a_config_file():
    # argparse applies choices only on the command line (read_config_from_file: the TOML is the namespace).
    cli = parse_command_line(f"python {SCRIPT} --max_token_length 75")
    assert not check(cli.config, cli.script, **cli.check_args()).ok
    toml_path = check({"max_token_length": 75}, "train_network.py")
    assert toml_path.ok and [w.rule for w in toml_path.warnings] == ["choices_not_applied"]


def test_argparse_model_matches_every_argument_of_the_schema():
    from kohya_tuner.check.argschema import script_args

    for script in ("train_network.py", "sdxl_train_network.py", "flux_train_network.py", "sdxl_train.py"):
        parser = cmdline.parser_for(script)
        dests = {a.dest for a in parser._actions} - {"help"}
        assert dests == set(script_args(script))


@pytest.mark.parametrize("junk", ["[", "['", "[']", "[" * 5000 + "'a.py'", "x = ['a', 'b']", "'['" * 300])
def test_list_like_junk_is_one_clear_error_or_a_reading(junk, tmp_path):
    f = tmp_path / "cmd.txt"
    f.write_text(junk, encoding="utf-8")
    res = invoke("check", str(f), "--model", "sd15")
    assert res.exit_code in (0, 2) and "Traceback" not in res.output


def test_python_argv_lists_are_read_without_evaluating_code(tmp_path):
    marker = tmp_path / "ran"
    text = f"subprocess.run([__import__('os').system('touch {marker}'), '{SCRIPT}'])"
    with pytest.raises(Exception):
        parse_command_line(text)
    assert not marker.exists()
