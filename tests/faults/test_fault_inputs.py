"""Input files by class, as a user's shell runs the CLI (subprocesses with a timeout):

* special files in every file argument — a FIFO, /dev/zero, a folder, a dangling link —
  answer within 10 s with exit 2 and one paragraph, never a hang or a traceback;
* files at the edges: 5,000-deep nesting, 1e400 / inf / a 5,000-digit integer, sections of
  the wrong type, a UTF-8 BOM before a comment, a 30 MB one-line comment, a 2 MB token;
* output encodings other than UTF-8 (cp1252 as a redirected Windows stdout, ASCII under
  LANG=C) and a path argument holding bytes that are not UTF-8: no UnicodeEncodeError;
* file names holding terminal escapes are never printed raw.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
LIMIT = 10  # seconds: every command answers within this on any input


def kt(*args, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "100", **(env or {})}
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "kohya_tuner", *map(os.fsencode, args)], env=e, cwd=cwd,
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=LIMIT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"kohya-tuner {' '.join(map(str, args))} did not return within {LIMIT} s")
    proc.elapsed = time.monotonic() - started
    return proc


def _no_traceback(proc) -> None:
    out = proc.stdout + proc.stderr
    assert b"Traceback (most recent call last)" not in out, out.decode("utf-8", "replace")[-3000:]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("inputs")
    os.mkfifo(root / "fifo")
    (root / "dangling").symlink_to(root / "nowhere")
    (root / "folder").mkdir()
    cfg = root / "cfg.toml"
    cfg.write_text('pretrained_model_name_or_path = "/m/sd15.safetensors"\nnetwork_module = "networks.lora"\n'
                   'network_dim = 8\nresolution = "512,512"\ntrain_batch_size = 1\n')
    imgs = root / "imgs"
    imgs.mkdir()
    for i in range(2):
        Image.new("RGB", (512, 512), (i, 2, 3)).save(imgs / f"{i}.png")
    (root / "log.txt").write_text("epoch 1/1\n")
    return root


SPECIALS = ["fifo", "/dev/zero", "folder", "dangling"]


def _file_arguments(root: Path, special: str) -> list[list[str]]:
    """Every command's file argument, with `special` in it and the rest valid."""
    cfg, imgs, out = str(root / "cfg.toml"), str(root / "imgs"), str(root / "out")
    plan = ["-m", "sd15", "-j", "style", "-g", "8"]
    return [
        ["estimate", special, "-m", "sd15"],
        ["estimate", cfg, "--dataset", special],
        ["fit", special, "-g", "8", "--out", out + "/f.toml"],
        ["fit", cfg, "-g", "8", "--dataset", special, "--out", out + "/g.toml"],
        ["check", special],
        ["check", cfg, "--dataset-config", special],
        ["diagnose", special],
        ["config", *plan, "--out", out + "/c", "--preset", special],
        ["config", *plan, "--out", out + "/d", "--data", special],
        ["dataset", "check", special, "-m", "sd15"],
        ["dataset", "prep", special, "-m", "sd15", "--out", out + "/p"],
        ["run", *plan, "--cpu", "--dry-run", "--out", out + "/r", "--data", imgs, "--preset", special],
    ]


@pytest.mark.parametrize("special", SPECIALS)
def test_special_files_in_every_file_argument(files, special):
    path = special if special.startswith("/") else str(files / special)
    cases = _file_arguments(files, path)
    if special == "folder":  # a folder is right for --data and dataset check/prep; only file arguments here
        cases = [c for c in cases if "--data" not in c and c[0] != "dataset"]
    with ThreadPoolExecutor(max_workers=3) as pool:
        procs = list(pool.map(lambda argv: (argv, kt(*argv)), cases))
    for argv, proc in procs:
        _no_traceback(proc)
        assert proc.returncode == 2, (argv, proc.returncode, proc.stderr.decode()[-800:])
        assert proc.stderr.strip(), (argv, "exit 2 without a word")


def test_special_files_inside_a_dataset_folder(files, tmp_path):
    ds = tmp_path / "ds"
    ds.mkdir()
    Image.new("RGB", (512, 512)).save(ds / "ok.png")
    os.mkfifo(ds / "x.png")
    os.mkfifo(ds / "ok.txt")
    (ds / "y.png").symlink_to("/dev/zero")
    (ds / "z.png").symlink_to(ds / "gone.png")
    for argv in (["dataset", "check", str(ds), "-m", "sd15"],
                 ["dataset", "prep", str(ds), "-m", "sd15", "--out", str(tmp_path / "prep")],
                 ["config", "-m", "sd15", "-j", "style", "-g", "8", "--data", str(ds), "--out", str(tmp_path / "c")]):
        proc = kt(*argv)
        _no_traceback(proc)
        assert proc.returncode in (0, 1, 2), (argv, proc.stderr.decode()[-800:])
    prep = tmp_path / "prep"
    assert (prep / "ok.png").is_file()
    assert not (prep / "x.png").exists() and not (prep / "y.png").exists()


def _edge_files(root: Path) -> dict[str, tuple[str, bytes]]:
    return {
        "deep toml": ("deep.toml", ("a = " + "[" * 5000 + "]" * 5000 + "\n").encode()),
        "deep json": ("deep.json", ('{"a": ' * 5000 + "1" + "}" * 5000).encode()),
        "1e400 json": ("e.json", b'{"LoRA_type": "Standard", "network_dim": 8, "learning_rate": 1e400}'),
        "inf string json": ("s.json", b'{"LoRA_type": "Standard", "network_dim": 8, "max_train_steps": "1e400"}'),
        "5000 digits json": ("d.json", b'{"LoRA_type": "Standard", "network_dim": ' + b"9" * 5000 + b"}"),
        "inf toml": ("i.toml", b"network_dim = 8\nlearning_rate = inf\n"),
        "huge int toml": ("h.toml", b"network_dim = " + b"9" * 40 + b"\n"),
        "bom comment": ("b.toml", b"\xef\xbb\xbf# saved by Notepad\nnetwork_dim = 8\n"),
        "30 MB comment": ("c.toml", b"#" + b"x" * 30_000_000 + b"\nnetwork_dim = 8\n"),
        "2 MB token": ("t.sh", b"accelerate launch sdxl_train_network.py --output_name " + b"x" * 2_000_000 + b"\n"),
        "900 KB token": ("u.sh", b"accelerate launch sdxl_train_network.py --output_name " + b"x" * 900_000 + b"\n"),
        "cmdline 1e400": ("n.sh", b"accelerate launch sdxl_train_network.py --max_train_steps 1e400\n"),
    }


@pytest.mark.parametrize("case", list(_edge_files(Path("."))))
def test_config_files_at_the_edges(files, case):
    name, data = _edge_files(files)[case]
    path = files / name
    path.write_bytes(data)
    for command in (["estimate", str(path), "-m", "sdxl"], ["check", str(path), "-m", "sdxl"]):
        proc = kt(*command)
        _no_traceback(proc)
        assert proc.returncode in (0, 1, 2), (case, proc.stderr.decode()[-800:])
        assert proc.elapsed < LIMIT
        # The kohya_ss GUI reads a number field's text with int() and takes 0 (unset) when it fails
        # (common_gui.update_my_data; tests/data/kohya_gui): "1e400" steps is the GUI's "count the images".
        if case not in ("900 KB token", "inf string json"):
            assert proc.returncode == 2, (case, command, proc.stdout.decode()[-500:])


@pytest.mark.parametrize("text, key", [
    ("[[datasets]]\nsubsets = 5\n", "subsets"), ("datasets = 5\n", "datasets"), ("general = 5\n", "general"),
    ("[[datasets]]\n[[datasets.subsets]]\nnum_repeats = 1e400\n", "num_repeats"),
])
def test_wrong_typed_dataset_sections_name_the_key(files, text, key):
    path = files / "ds_bad.toml"
    path.write_text(text)
    proc = kt("estimate", str(files / "cfg.toml"), "--dataset", str(path))
    _no_traceback(proc)
    assert proc.returncode == 2 and key in proc.stderr.decode(), proc.stderr.decode()


@pytest.mark.parametrize("text, key", [("settings = 5\n", "settings"), ("[settings]\nnetwork_dim = inf\n", "network_dim"),
                                       ("why = [1]\n[settings]\nnetwork_dim = 4\n", "why")])
def test_wrong_typed_preset_sections_name_the_key(files, text, key):
    path = files / "preset_bad.toml"
    path.write_text(text)
    proc = kt("config", "-m", "sd15", "-j", "style", "-g", "8", "--out", str(files / "pc"), "--preset", str(path))
    _no_traceback(proc)
    assert proc.returncode == 2 and key in proc.stderr.decode(), proc.stderr.decode()


@pytest.mark.parametrize("value", ["1e400", "inf", "9" * 5000, "nan"])
def test_set_values_at_the_edges(files, value):
    proc = kt("config", "-m", "sd15", "-j", "style", "-g", "8", "--out", str(files / "sc"), "--set",
              f"learning_rate={value}")
    _no_traceback(proc)
    assert proc.returncode == 2 and "learning_rate" in proc.stderr.decode(), proc.stderr.decode()


DIGITS = "9" * 5000  # past Python's int() digit limit (4,300): every parser fails with a message about Python


@pytest.mark.parametrize("kind", ["toml config", "gui json", "command line", "dataset toml", "dataset json",
                                  "preset", "--set"])
def test_an_integer_past_the_digit_limit_names_its_key_in_every_file_kind(files, kind):
    cfg = str(files / "cfg.toml")
    plan = ["config", "-m", "sd15", "-j", "style", "-g", "8", "--out", str(files / "dl")]
    key, name, text, argv = {
        "toml config": ("learning_rate", "l.toml", f"# c\nnetwork_dim = 8\nlearning_rate = {DIGITS}\n", None),
        "gui json": ("train_batch_size", "l.json", '{"LoRA_type": "Standard", "train_batch_size": %s}' % DIGITS, None),
        "command line": ("network_dim", "l.sh", f"accelerate launch train_network.py --network_dim {DIGITS}\n", None),
        "dataset toml": ("num_repeats", "ds.toml", f"[[datasets]]\n[[datasets.subsets]]\nnum_repeats = {DIGITS}\n",
                         ["estimate", cfg, "--dataset"]),
        "dataset json": ("num_repeats", "ds.json", '{"datasets": [{"subsets": [{"num_repeats": %s}]}]}' % DIGITS,
                         ["estimate", cfg, "--dataset"]),
        "preset": ("network_dim", "p.toml", f"[settings]\nnetwork_dim = {DIGITS}\n", [*plan, "--preset"]),
        "--set": ("network_dim", None, None, [*plan, "--set", f"network_dim={DIGITS}"]),
    }[kind]
    if name is not None:
        (files / name).write_text(text)
        argv = (argv or ["estimate"]) + [str(files / name)]
    proc = kt(*argv)
    _no_traceback(proc)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and key in err, err
    assert "set_int_max_str_digits" not in err and DIGITS[:200] not in err, err  # said for people, not Python


# ---- output encodings -----------------------------------------------------------------

ENCODINGS = [{"PYTHONIOENCODING": "cp1252"}, {"PYTHONIOENCODING": "ascii", "LANG": "C", "LC_ALL": "C"},
             {"LANG": "C", "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}]


def _common_paths(root: Path) -> list[list[str]]:
    """Each command's ordinary use, with unicode in the paths and the output."""
    imgs = root / "imgs é日本"
    if not imgs.exists():
        imgs.mkdir()
        for i in range(2):
            Image.new("RGB", (512, 512), (i, 5, 5)).save(imgs / f"é{i}.png")
    cfg, out = str(root / "cfg.toml"), root / "out é🎨"
    return [
        ["config", "-m", "sdxl", "-j", "character", "-g", "12", "--data", str(imgs), "--out", str(out / "c"),
         "--trigger", "ohwx 日本"],
        ["config", "-m", "sdxl", "-j", "character", "-g", "12", "--out", str(out / "j"), "--json"],
        ["estimate", cfg, "-m", "sd15", "-g", "8"], ["estimate", cfg, "-m", "sd15", "--json"],
        ["fit", cfg, "-g", "4", "--out", str(out / "fit.toml")],
        ["check", cfg], ["check", cfg, "--json"],
        ["diagnose", str(root / "log.txt")], ["diagnose", str(root / "log.txt"), "--json"],
        ["dataset", "check", str(imgs), "-m", "sdxl"],
        ["dataset", "prep", str(imgs), "-m", "sdxl", "--out", str(out / "prep")],
        ["run", "-m", "sd15", "-j", "style", "-g", "8", "--cpu", "--dry-run", "--data", str(imgs), "--out",
         str(out / "run")],
        ["doctor", "--json"], ["--help"], ["nope-é"],
    ]


@pytest.mark.parametrize("env", ENCODINGS, ids=["cp1252", "ascii", "LANG=C"])
def test_every_command_on_a_non_utf8_stream(files, env):
    with ThreadPoolExecutor(max_workers=3) as pool:
        procs = list(pool.map(lambda argv: (argv, kt(*argv, env=env)), _common_paths(files)))
    for argv, proc in procs:
        err = (proc.stdout + proc.stderr).decode("latin-1")
        if "Traceback" in err:
            pytest.fail(f"{argv}: {err[-2500:]}")
        assert proc.returncode in (0, 1, 2), (argv, proc.returncode, err[-800:])
        if "--json" in argv and proc.stdout.strip():
            import json

            json.loads(proc.stdout.decode(env.get("PYTHONIOENCODING") or "ascii"))  # still exact JSON


def test_non_utf8_bytes_in_a_path_argument(files, tmp_path):
    bad = os.fsencode(tmp_path) + b"/caf\xe9-\xff"
    os.mkdir(bad)
    for i in range(2):
        Image.new("RGB", (512, 512)).save(os.fsdecode(bad + b"/%d.png" % i))
    for env in ({}, {"PYTHONIOENCODING": "cp1252"}):
        for argv in (["dataset", "check", os.fsdecode(bad), "-m", "sd15"],
                     ["estimate", os.fsdecode(bad + b"/missing.toml")],
                     ["config", "-m", "sd15", "-j", "style", "-g", "8", "--data", os.fsdecode(bad), "--out",
                      os.fsdecode(bad + b"/out")]):
            proc = kt(*argv, env=env)
            _no_traceback(proc)
            assert proc.returncode in (0, 1, 2), (argv, proc.stderr.decode("latin-1")[-800:])


# ---- printed names --------------------------------------------------------------------

HOSTILE = ["\x1b]0;PWNED\x07", "\x1b[2J\x1b[H", "\x9b31m", "a\rb", "\u202egnp.exe", "\x07bell"]


def test_hostile_file_names_are_never_printed_raw(tmp_path):
    ds = tmp_path / "ds"
    ds.mkdir()
    for i, name in enumerate(HOSTILE):
        Image.new("RGB", (64 + i, 64), (i, 0, 0)).save(ds / f"{name}{i}.png")
        (ds / f"{name}{i}.txt").write_bytes(b"\xff\xfe caption")
    for argv in (["dataset", "check", str(ds), "-m", "sdxl"], ["dataset", "check", str(ds), "-m", "sdxl", "--json"],
                 ["dataset", "prep", str(ds), "-m", "sdxl", "--out", str(tmp_path / "prep")],
                 ["estimate", str(ds / (HOSTILE[0] + ".toml"))],
                 ["config", "-m", "sd15", "-j", "style", "-g", "8", "--data", str(ds), "--out", str(tmp_path / "c")]):
        proc = kt(*argv)
        _no_traceback(proc)
        out = (proc.stdout + proc.stderr).decode("utf-8", "replace")
        for ch in ("\x1b", "\x07", "\x9b", "\u202e", "\r"):
            assert ch not in out, (argv, repr(ch), out[-1500:])


def test_what_the_hunting_pass_found(files, tmp_path):
    """A 400-digit exit status was accepted; a trigger holding non-UTF-8 bytes crashed prep;
    a caption extension of `[/red]` crashed dataset check's listing (its class, markup and
    escapes in every option: test_fault_text_options.py)."""
    proc = kt("dataset", "check", str(files / "imgs"), "-m", "sd15", "--caption-ext", "[red]")
    _no_traceback(proc)
    assert proc.returncode in (0, 1) and b"[red]" in proc.stdout, proc.stdout + proc.stderr
    # A slash is in no file's suffix: refused, and the markup printed as written.
    proc = kt("dataset", "check", str(files / "imgs"), "-m", "sd15", "--caption-ext", "[/red]")
    _no_traceback(proc)
    assert proc.returncode == 2 and b"'[/red]'" in proc.stderr, proc.stdout + proc.stderr
    proc = kt("diagnose", str(files / "log.txt"), "--exit-code=-" + "9" * 400)
    _no_traceback(proc)
    assert proc.returncode == 2 and b"--exit-code" in proc.stderr
    trigger = os.fsdecode(b"\xff\xfe")
    for argv in (["dataset", "prep", str(files / "imgs"), "-m", "sd15", "--out", str(tmp_path / "p"), "--trigger",
                  trigger],
                 ["config", "-m", "sd15", "-j", "style", "-g", "8", "--out", str(tmp_path / "c"), "--trigger", trigger]):
        proc = kt(*argv)
        _no_traceback(proc)
        assert proc.returncode == 2 and b"--trigger" in proc.stderr, proc.stderr
    assert not (tmp_path / "p").exists() and not (tmp_path / "c").exists()
