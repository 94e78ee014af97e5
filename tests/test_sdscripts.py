"""The sd-scripts pin, locating and verifying checkouts, and `setup` cloning.

Every repository here is made in a tmp folder: a fake sd-scripts whose helper
functions add exactly the arguments args.json lists, built from args.json itself.
Nothing touches the network.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import toml
from tests.clihelp import invoke as _invoke_cli

from kohya_tuner import schema, sdscripts
from kohya_tuner.errors import UserError
from kohya_tuner.families import FAMILIES

LORA_SCRIPTS = ["train_network.py", "sdxl_train_network.py", "flux_train_network.py"]


# ---- fixtures ----------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("KOHYA_TUNER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(sdscripts.ENV_VAR, raising=False)
    for var, value in {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
                       "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid",
                       "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}.items():
        monkeypatch.setenv(var, value)


def git(cwd: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _by_source() -> dict[str, dict[str, list[str]]]:
    """file -> function -> argument names, for the LoRA scripts at the pin."""
    files: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for script in dict.fromkeys(LORA_SCRIPTS + sdscripts.entry_scripts()):
        for arg in schema.raw_schema()["scripts"][script]["args"]:
            file, func = arg["source"].split(":")
            if arg["name"] not in files[file][func]:
                files[file][func].append(arg["name"])
    return files


def _adds(names: list[str], indent: str = "    ") -> str:
    return "".join(f'{indent}parser.add_argument("--{n}", default=None, help="x")\n' for n in names)


def make_fake_sd_scripts(root: Path, *, entry_only: bool = False) -> Path:
    """A checkout-shaped folder whose setup_parser() chains add args.json's arguments."""
    root.mkdir(parents=True, exist_ok=True)
    files = _by_source()
    tn_chain = schema.raw_schema()["scripts"]["train_network.py"]["setup_parser_chain"]
    if not entry_only:
        (root / "library").mkdir(exist_ok=True)
        (root / "library" / "__init__.py").write_text("")
        for file, funcs in files.items():
            if not file.startswith("library/"):
                continue
            body = "".join(f"def {func}(parser, *flags):\n{_adds(names)}\n\n" for func, names in funcs.items())
            (root / file).write_text(body)
        (root / "requirements.txt").write_text("toml==0.10.2\n-e .\n")
    # train_network.py: helpers called both as module attributes and as imported names.
    calls = []
    for link in tn_chain[:-1]:
        file, func = link.split(":")
        module = file[len("library/"):-3]
        calls.append(f"    {module}.{func}(parser, True)\n" if module != "utils" else f"    {func}(parser)\n")
    modules = sorted({link.split(":")[0][len("library/"):-3] for link in tn_chain[:-1]} - {"utils"})
    (root / "train_network.py").write_text(
        "import argparse\n"
        + "".join(f"import library.{m} as {m}\n" for m in modules)
        + "from library.utils import add_logging_arguments\n\n\n"
        + "def setup_parser():\n    parser = argparse.ArgumentParser()\n" + "".join(calls)
        + _adds(files["train_network.py"]["setup_parser"]) + "    return parser\n"
    )
    (root / "sdxl_train_network.py").write_text(
        "import train_network\nfrom library import sdxl_train_util\n\n\n"
        "def setup_parser():\n    parser = train_network.setup_parser()\n"
        "    sdxl_train_util.add_sdxl_training_arguments(parser, True)\n    return parser\n"
    )
    (root / "flux_train_network.py").write_text(
        "import train_network\nfrom library import flux_train_utils, train_util\n\n\n"
        "def setup_parser():\n    parser = train_network.setup_parser()\n"
        "    train_util.add_dit_training_arguments(parser)\n"
        "    flux_train_utils.add_flux_train_arguments(parser)\n"
        + _adds(files["flux_train_network.py"]["setup_parser"]) + "    return parser\n"
    )
    # The other entry scripts: train_network's parser, then their own helpers, as args.json records.
    for script in sdscripts.entry_scripts():
        if script in LORA_SCRIPTS:
            continue
        chain = schema.raw_schema()["scripts"][script]["setup_parser_chain"]
        own = chain[chain.index("train_network.py:setup_parser") + 1:]
        helpers = [link.split(":") for link in own if link.startswith("library/")]
        (root / script).write_text(
            "import train_network\n"
            + "".join(f"from library import {file[len('library/'):-3]}\n" for file, _ in helpers)
            + "\n\ndef setup_parser():\n    parser = train_network.setup_parser()\n"
            + "".join(f"    {file[len('library/'):-3]}.{func}(parser)\n" for file, func in helpers)
            + _adds(files[script]["setup_parser"]) + "    return parser\n"
        )
    return root


def make_repo(root: Path) -> tuple[Path, str, str]:
    """A git repository with two commits; returns (path, first, second)."""
    make_fake_sd_scripts(root)
    git(root, "init", "--quiet", "-b", "main")
    git(root, "add", ".")
    git(root, "commit", "--quiet", "-m", "first")
    first = git(root, "rev-parse", "HEAD")
    (root / "README.md").write_text("later\n")
    git(root, "add", "README.md")
    git(root, "commit", "--quiet", "-m", "second")
    return root, first, git(root, "rev-parse", "HEAD")


@pytest.fixture
def upstream(tmp_path, monkeypatch):
    """A local 'upstream' whose first commit plays the part of the pinned commit."""
    path, first, second = make_repo(tmp_path / "upstream")
    monkeypatch.setattr(sdscripts, "pinned_commit", lambda: first)
    return path, first, second


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


# ---- the pin -----------------------------------------------------------------------


def test_pin_agrees_with_args_json_and_families():
    pin = toml.load(sdscripts.vendor_file("sd-scripts", "pin.toml"))
    assert pin["upstream"]["commit"] == schema.pinned_commit() == "48d368fa557731ad0488c07304dfeba8c07910eb"
    assert pin["upstream"]["repo"] == "https://github.com/kohya-ss/sd-scripts"
    assert sorted(sdscripts.entry_scripts()) == sorted({f.script for f in FAMILIES.values()})
    assert all(s in schema.raw_schema()["scripts"] for s in sdscripts.entry_scripts())


def test_requirement_pins_drop_extras_and_keep_open_versions():
    pins = sdscripts.requirement_pins()
    assert pins["accelerate"] == "1.6.0"
    assert pins["diffusers"] == "0.32.1" and "diffusers[torch]" not in pins
    assert pins["toml"] == "0.10.2"
    assert pins["bitsandbytes"] == ""
    specs = sdscripts.requirement_specs()
    assert "diffusers[torch]==0.32.1" in specs and "bitsandbytes" in specs
    assert "torch" not in pins


# ---- static argument reading -------------------------------------------------------


def test_faithful_fake_has_no_differences(tmp_path):
    root = make_fake_sd_scripts(tmp_path / "sd")
    diffs, unchecked = sdscripts.compare_arguments(root, LORA_SCRIPTS)
    assert diffs == [] and unchecked == []


def test_differences_are_reported_by_name(tmp_path):
    root = make_fake_sd_scripts(tmp_path / "sd")
    # A new option in a shared helper, one dropped from train_network, one dropped from FLUX only.
    edit(root / "library" / "train_util.py", "def add_optimizer_arguments(parser, *flags):\n",
         'def add_optimizer_arguments(parser, *flags):\n    parser.add_argument("--brand_new_option", type=int)\n')
    edit(root / "train_network.py", '    parser.add_argument("--network_dim", default=None, help="x")\n', "")
    edit(root / "library" / "flux_train_utils.py", '    parser.add_argument("--t5xxl_max_token_length", default=None, help="x")\n', "")
    report = sdscripts.verify(sdscripts.inspect(root))
    assert report.checked_by == "arguments"
    assert report.differences == [
        "added: --brand_new_option",
        "removed: --network_dim",
        "removed: --t5xxl_max_token_length (in flux_train_network.py)",
    ]
    assert not report.compatible and not report.matches


def test_dest_keyword_dashes_and_conditionals(tmp_path):
    root = make_fake_sd_scripts(tmp_path / "sd")
    edit(root / "library" / "train_util.py", "def add_training_arguments(parser, *flags):\n",
         "def add_training_arguments(parser, *flags):\n"
         '    parser.add_argument("-o", "--output-dir-x", dest="output_dir")\n'
         "    if flags and flags[0]:\n"
         # Known elsewhere in args.json (a DreamBooth-style option): fine when conditional.
         '        parser.add_argument("--prior_loss_weight", type=float)\n'
         '        parser.add_argument("--only_sometimes_new")\n')
    edit(root / "library" / "train_util.py", '    parser.add_argument("--output_dir", default=None, help="x")\n', "")
    diffs, _ = sdscripts.compare_arguments(root, ["train_network.py"])
    assert diffs == ["added: --only_sometimes_new"]
    edit(root / "library" / "train_util.py", 'dest="output_dir"', 'dest="output_dir2"')
    diffs, _ = sdscripts.compare_arguments(root, ["train_network.py"])
    assert diffs == ["added: --only_sometimes_new", "added: --output_dir2", "removed: --output_dir"]


def test_computed_names_are_counted_as_unchecked(tmp_path):
    root = make_fake_sd_scripts(tmp_path / "sd")
    edit(root / "train_network.py", "    return parser\n",
         '    for n in ["a", "b"]:\n        parser.add_argument(f"--{n}")\n    return parser\n')
    diffs, unchecked = sdscripts.compare_arguments(root, ["train_network.py"])
    assert diffs == []
    assert unchecked == ["train_network.py: 1 add_argument call(s) with computed names"]


def test_new_helper_called_from_setup_parser_is_followed(tmp_path):
    root = make_fake_sd_scripts(tmp_path / "sd")
    (root / "library" / "extra_util.py").write_text(
        'def add_extra_arguments(parser):\n    parser.add_argument("--from_new_helper")\n')
    edit(root / "flux_train_network.py", "import train_network\n", "import train_network\nimport library.extra_util as extra_util\n")
    edit(root / "flux_train_network.py", "    return parser\n", "    extra_util.add_extra_arguments(parser)\n    return parser\n")
    diffs, _ = sdscripts.compare_arguments(root, LORA_SCRIPTS)
    assert diffs == ["added: --from_new_helper (in flux_train_network.py)"]


def test_entry_scripts_only_folder_reports_unchecked_not_a_flood_of_removals(tmp_path):
    root = make_fake_sd_scripts(tmp_path / "sd", entry_only=True)
    (root / "sdxl_train_network.py").unlink()
    checkout = sdscripts.locate(root)
    assert checkout is not None and not checkout.is_git and checkout.commit is None
    report = sdscripts.verify(checkout)
    assert report.missing_scripts == ["sdxl_train_network.py"]
    assert report.differences == []
    assert "library/train_util.py:add_dataset_arguments" in report.unchecked
    assert "library/flux_train_utils.py:add_flux_train_arguments" in report.unchecked
    assert not report.matches and not report.compatible


@pytest.mark.parametrize("text", ["def setup_parser(:\n",
                                  # nested past the parser's recursion limit, and past its stack
                                  "def setup_parser():\n    x = " + "1+" * 200_000 + "1\n",
                                  "def setup_parser():\n    x = " + "-" * 100_000 + "1\n"],
                         ids=["syntax", "long-expression", "deep-unary"])
def test_unparsable_entry_script_is_unchecked(tmp_path, text):
    root = make_fake_sd_scripts(tmp_path / "sd")
    (root / "sdxl_train_network.py").write_text(text)
    report = sdscripts.verify(sdscripts.inspect(root))
    assert "sdxl_train_network.py:setup_parser" in report.unchecked
    assert report.differences == []


# ---- locate ------------------------------------------------------------------------


def test_locate_precedence_explicit_env_data_dir(tmp_path, monkeypatch):
    assert sdscripts.locate() is None
    data = make_fake_sd_scripts(sdscripts.default_dir())
    assert sdscripts.locate().path == data.resolve()
    env = make_fake_sd_scripts(tmp_path / "env")
    monkeypatch.setenv(sdscripts.ENV_VAR, str(env))
    assert sdscripts.locate().path == env.resolve()
    explicit = make_fake_sd_scripts(tmp_path / "explicit")
    assert sdscripts.locate(explicit).path == explicit.resolve()
    assert sorted(sdscripts.locate(explicit).scripts) == sorted(sdscripts.entry_scripts())


def test_locate_ignores_an_empty_data_dir(tmp_path):
    sdscripts.default_dir().mkdir(parents=True)
    assert sdscripts.locate() is None


def test_locate_accepts_a_kohya_ss_gui_root(tmp_path):
    gui = tmp_path / "kohya_ss"
    make_fake_sd_scripts(gui / "sd-scripts")
    (gui / "kohya_gui.py").write_text("")
    assert sdscripts.locate(gui).path == (gui / "sd-scripts").resolve()


@pytest.mark.parametrize("kind", ["missing", "file", "empty"])
def test_locate_bad_paths_are_user_errors(tmp_path, kind, monkeypatch):
    bad = tmp_path / "bad"
    if kind == "file":
        bad.write_text("x")
    elif kind == "empty":
        bad.mkdir()
    with pytest.raises(UserError) as exc:
        sdscripts.locate(bad)
    assert str(bad) in exc.value.message
    monkeypatch.setenv(sdscripts.ENV_VAR, str(bad))
    with pytest.raises(UserError) as exc:
        sdscripts.locate()
    assert sdscripts.ENV_VAR in exc.value.message


# ---- commits -----------------------------------------------------------------------


def test_head_commit_without_git_reads_loose_and_packed_refs(tmp_path, monkeypatch):
    root, _, second = make_repo(tmp_path / "r")
    assert sdscripts.head_commit(root) == second
    assert sdscripts._read_head_files(root) == second
    git(root, "pack-refs", "--all")
    assert not (root / ".git" / "refs" / "heads" / "main").exists()
    assert sdscripts._read_head_files(root) == second
    monkeypatch.setattr(sdscripts.shutil, "which", lambda name: None)
    assert sdscripts.head_commit(root) == second


def test_verify_pinned_checkout_matches_and_local_edits_do_not(upstream):
    path, first, _ = upstream
    git(path, "checkout", "--quiet", "--detach", first)
    report = sdscripts.verify(sdscripts.inspect(path))
    assert report.matches and report.compatible and report.checked_by == "commit"
    edit(path / "train_network.py", '    parser.add_argument("--network_dim", default=None, help="x")\n', "")
    report = sdscripts.verify(sdscripts.inspect(path))
    assert not report.matches
    assert report.local_changes == ["train_network.py"]
    assert report.differences == ["removed: --network_dim"]


@pytest.mark.parametrize("why", ["no git", "another owner", "no answer"])
def test_an_edited_pinned_checkout_git_cannot_read_is_not_called_a_match(upstream, monkeypatch, why):
    """The commit from the .git files proves nothing about the files: without git's view of the
    work tree the arguments are read from the source, and the edit is named."""
    path, first, _ = upstream
    git(path, "checkout", "--quiet", "--detach", first)
    edit(path / "train_network.py", '    parser.add_argument("--network_dim", default=None, help="x")\n', "")
    real_git = sdscripts._git
    if why == "no git":
        monkeypatch.setattr(sdscripts.shutil, "which", lambda name: None)
    else:
        said = {"another owner": (128, "fatal: detected dubious ownership in repository at '/x'\n"
                                       "To add an exception for this directory, call: git config --global "
                                       "--add safe.directory /x"),
                "no answer": (124, "git did not answer within 3 s")}[why]

        def refusing(args, cwd=None, **kw):
            if "status" in args:
                return subprocess.CompletedProcess(args, said[0], "", said[1])
            return real_git(args, cwd, **kw)

        monkeypatch.setattr(sdscripts, "_git", refusing)
    report = sdscripts.verify(sdscripts.inspect(path))
    assert report.commit == first
    assert not report.matches and report.changes_unknown
    assert report.checked_by == "arguments" and report.differences == ["removed: --network_dim"]
    if why == "another owner":
        assert "safe.directory" in report.changes_unknown


def test_verify_runs_no_hook_of_the_checkout_and_leaves_its_index_alone(upstream, tmp_path):
    """A look at a checkout: its .git/config's fsmonitor command is not run, and git's index
    refresh is not written back."""
    path, first, _ = upstream
    git(path, "checkout", "--quiet", "--detach", first)
    marker = tmp_path / "hook-ran"
    git(path, "config", "core.fsmonitor", f"echo ran >> '{marker}'; false")
    (path / "train_network.py").touch()
    os.utime(path / "train_network.py", (1, 1))
    index = (path / ".git" / "index").read_bytes()
    report = sdscripts.verify(sdscripts.inspect(path))
    assert report.matches, report
    assert not marker.exists()
    assert (path / ".git" / "index").read_bytes() == index


def test_verify_other_commit_with_same_arguments_is_compatible_not_matching(upstream):
    path, _, second = upstream
    report = sdscripts.verify(sdscripts.inspect(path))
    assert report.commit == second and not report.matches
    assert report.compatible and report.checked_by == "arguments"


# ---- setup -------------------------------------------------------------------------


def test_setup_clones_the_pin_into_the_data_dir_and_is_idempotent(upstream):
    path, first, _ = upstream
    result = sdscripts.setup_checkout(repo_url=str(path))
    assert result.action == "cloned"
    assert result.checkout.path == sdscripts.default_dir().resolve()
    assert result.checkout.commit == first
    assert not (result.checkout.path / "README.md").exists()  # the second commit's file
    assert sdscripts.verify(result.checkout).matches
    assert sdscripts.locate().path == result.checkout.path
    again = sdscripts.setup_checkout(repo_url=str(path))
    assert again.action == "already at the pin" and again.checkout.commit == first
    # No staging folders left beside it.
    assert [p.name for p in result.checkout.path.parent.iterdir()] == ["sd-scripts"]


def test_setup_moves_an_existing_clone_to_the_pin(upstream, tmp_path):
    path, first, second = upstream
    dest = tmp_path / "mine"
    subprocess.run(["git", "clone", "--quiet", str(path), str(dest)], check=True)
    assert git(dest, "rev-parse", "HEAD") == second
    result = sdscripts.setup_checkout(dest, repo_url=str(path))
    assert result.action == "moved to the pin" and result.checkout.commit == first


def test_setup_refuses_a_clone_with_local_changes(upstream, tmp_path):
    path, _, second = upstream
    dest = tmp_path / "mine"
    subprocess.run(["git", "clone", "--quiet", str(path), str(dest)], check=True)
    (dest / "README.md").write_text("my notes\n")
    with pytest.raises(UserError, match="local changes"):
        sdscripts.setup_checkout(dest, repo_url=str(path))
    assert (dest / "README.md").read_text() == "my notes\n"
    assert git(dest, "rev-parse", "HEAD") == second


def test_setup_refuses_non_empty_folders_that_are_not_the_repo(upstream, tmp_path):
    path, _, _ = upstream
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="not a git checkout"):
        sdscripts.setup_checkout(plain, repo_url=str(path))
    assert [p.name for p in plain.iterdir()] == ["keep.txt"]
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "--quiet")
    (other / "a.txt").write_text("a")
    git(other, "add", "a.txt")
    git(other, "commit", "--quiet", "-m", "other")
    with pytest.raises(UserError, match="another repository"):
        sdscripts.setup_checkout(other, repo_url=str(path))
    a_file = tmp_path / "f"
    a_file.write_text("x")
    with pytest.raises(UserError, match="is a file"):
        sdscripts.setup_checkout(a_file, repo_url=str(path))


def test_setup_into_an_empty_existing_folder(upstream, tmp_path):
    path, first, _ = upstream
    dest = tmp_path / "empty"
    dest.mkdir()
    assert sdscripts.setup(dest, repo_url=str(path)).commit == first


def test_setup_cleans_up_when_the_pin_is_missing(tmp_path, monkeypatch):
    path, _, _ = make_repo(tmp_path / "upstream")
    monkeypatch.setattr(sdscripts, "pinned_commit", lambda: "0" * 40)
    dest = tmp_path / "out" / "sd"
    with pytest.raises(UserError, match="does not contain the pinned"):
        sdscripts.setup(dest, repo_url=str(path))
    assert not dest.exists() and list((tmp_path / "out").iterdir()) == []
    with pytest.raises(UserError, match="could not clone"):
        sdscripts.setup(dest, repo_url=str(tmp_path / "nowhere"))
    assert list((tmp_path / "out").iterdir()) == []


def test_setup_without_git_is_a_user_error(monkeypatch, tmp_path):
    monkeypatch.setattr(sdscripts.shutil, "which", lambda name: None)
    with pytest.raises(UserError, match="git is not installed"):
        sdscripts.setup(tmp_path / "x", repo_url=str(tmp_path))


def test_same_repo_url_forms():
    up = "https://github.com/kohya-ss/sd-scripts"
    assert sdscripts._same_repo("https://github.com/kohya-ss/sd-scripts.git", up)
    assert sdscripts._same_repo("git@github.com:kohya-ss/sd-scripts.git", up)
    assert sdscripts._same_repo("https://github.com/Kohya-SS/sd-scripts/", up)
    assert not sdscripts._same_repo("https://github.com/bmaltais/kohya_ss", up)
    assert sdscripts._is_remote(up) and sdscripts._is_remote("git@github.com:a/b.git")
    assert not sdscripts._is_remote("/srv/mirror/sd-scripts") and not sdscripts._is_remote("file:///srv/x")


# ---- CLI ---------------------------------------------------------------------------


def _cli(args: list[str]):
    from tests.clihelp import invoke

    return invoke(*args)


def test_cli_setup_clones_and_reports_json(upstream, tmp_path):
    path, first, _ = upstream
    dest = tmp_path / "clone"
    res = _cli(["setup", "--dir", str(dest), "--repo-url", str(path), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["action"] == "cloned" and data["path"] == str(dest.resolve())
    assert data["report"]["matches"] is True and data["report"]["commit"] == first
    assert data["requirements_command"][-2:] == ["-r", "requirements.txt"]
    assert data["requirements_installed"] is None


def test_cli_setup_verifies_existing_checkout_and_lists_differences(tmp_path):
    root = make_fake_sd_scripts(tmp_path / "sd")
    edit(root / "train_network.py", '    parser.add_argument("--network_dim", default=None, help="x")\n', "")
    res = _cli(["setup", "--sd-scripts", str(root)])
    assert res.exit_code == 0, res.output
    assert "removed: --network_dim" in res.output
    assert "pip install -r requirements.txt" in res.output
    res = _cli(["setup", "--sd-scripts", str(root), "--json"])
    data = json.loads(res.stdout)
    assert data["report"]["differences"] == ["removed: --network_dim"]
    assert data["report"]["compatible"] is False and data["is_git"] is False


def test_cli_setup_uses_the_environment_variable(tmp_path, monkeypatch):
    root = make_fake_sd_scripts(tmp_path / "sd")
    monkeypatch.setenv(sdscripts.ENV_VAR, str(root))
    data = json.loads(_cli(["setup", "--json"]).stdout)
    assert data["path"] == str(root.resolve()) and "KOHYA_SD_SCRIPTS" in data["action"]


def test_cli_setup_bad_input_is_one_paragraph_exit_2(tmp_path):
    res = _cli(["setup", "--sd-scripts", str(tmp_path / "missing")])
    assert res.exit_code == 2
    assert "does not exist" in res.output and "Traceback" not in res.output
    res = _cli(["setup", "--dir", str(tmp_path), "--sd-scripts", str(tmp_path)])
    assert res.exit_code == 2 and "exclude each other" in res.output


def test_cli_install_requirements_runs_pip_in_the_checkout(tmp_path):
    root = make_fake_sd_scripts(tmp_path / "sd")
    record = tmp_path / "pip-args.json"
    fake_python = tmp_path / "fakepython"
    fake_python.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'cwd': os.getcwd()}}, open({str(record)!r}, 'w'))\n"
    )
    fake_python.chmod(0o755)
    res = _cli(["setup", "--sd-scripts", str(root), "--install-requirements", "--python", str(fake_python), "--json"])
    assert res.exit_code == 0, res.output
    seen = json.loads(record.read_text())
    assert seen["argv"] == ["-m", "pip", "install", "-r", "requirements.txt"]
    assert Path(seen["cwd"]).resolve() == root.resolve()
    assert json.loads(res.stdout)["requirements_installed"] is True
    fake_python.write_text(f"#!{sys.executable}\nraise SystemExit(3)\n")
    res = _cli(["setup", "--sd-scripts", str(root), "--install-requirements", "--python", str(fake_python)])
    assert res.exit_code == 2 and "status 3" in res.output


def test_preflight_calls_an_edited_checkout_at_the_pin_the_pinned_commit(upstream, tmp_path):
    """A real checkout at the pinned commit with work-tree edits: pre-flight names the edits
    (and the arguments they change) and never says the commit is another one."""
    import sys

    from kohya_tuner.families import get_family
    from kohya_tuner.run import preflight

    path, first, _ = upstream
    git(path, "checkout", "--quiet", "--detach", first)
    edit(path / "train_network.py", '    parser.add_argument("--network_dim", default=None, help="x")\n', "")

    def sd_check():
        facts = preflight.gather(out_dir=tmp_path / "out", python=sys.executable, sd_scripts=path, cpu=True)
        assert facts.pin_at_commit
        return next(c for c in preflight.evaluate({}, get_family("sd15"), facts, cpu=True).checks
                    if c.name == "sd-scripts")

    check = sd_check()
    assert check.status == "warn" and "not the pinned commit" not in check.message
    assert "pinned commit with local changes to 1 file: train_network.py" in check.message
    assert "removed: --network_dim" in check.message
    git(path, "checkout", "--quiet", "--", "train_network.py")
    (path / "requirements.txt").write_text("toml==0.10.2\n")
    check = sd_check()
    assert "not the pinned commit" not in check.message and "requirements.txt" in check.message
    assert "change its arguments" not in check.message


@pytest.mark.parametrize("url,secret", [
    ("https://user:S3cretPW999@127.0.0.1:9/kohya/sd-scripts.git", "S3cretPW999"),
    ("https://ghp_tok3nTOKENtoken@127.0.0.1:9/kohya/sd-scripts.git", "ghp_tok3nTOKENtoken"),
    ("http://me:p%40ss:word@127.0.0.1:9/x.git", "p%40ss:word"),
])
def test_a_clone_that_fails_never_prints_the_urls_password(tmp_path, url, secret):
    res = _cli(["setup", "--dir", str(tmp_path / "clone"), "--repo-url", url, "--json"])
    assert res.exit_code == 2, res.output
    assert secret not in res.output
    assert "127.0.0.1:9/" in res.output


def test_url_credentials_hides_passwords_and_tokens_only():
    from kohya_tuner.redact import url_credentials

    assert url_credentials("git clone https://u:pw@h/x and ssh://git@h/y") == \
        "git clone https://u:<hidden>@h/x and ssh://<hidden>@h/y"
    assert url_credentials("no url here: user@example.com") == "no url here: user@example.com"
    assert url_credentials("https://example.com/a@b") == "https://example.com/a@b"
