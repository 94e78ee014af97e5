"""Property-based fuzz of the whole CLI: every command's options, and the contents of
configs (TOML), kohya_ss GUI JSON, command-line files, dataset folders and logs.

For every example: no exception escapes and no frame of kohya-tuner's code is printed
(a traceback), the exit status is one the
command documents (0, 1 for fit's "does not fit" / doctor's failures, 2 for refusals),
a value no numeric flag can take (NaN, inf, 1e400, text) is exit 2, and no file that
existed before the command has different content after it (hashes).

Never launched: training (`run` always gets --dry-run), `setup` (it clones from the
network; only its option errors are fuzzed). `--force` is left out because replacing a
file is then what the user asked for. Example counts are kept small so the file runs
in well under a minute on two cores; EXAMPLES records how many ran."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections import Counter
from pathlib import Path

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from tests.clihelp import invoke

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"
EXAMPLES: Counter = Counter()
# KT_FUZZ_RANDOM=1 draws new examples each run and KT_FUZZ_SCALE=N runs N times as many:
# for hunting; the suite's own run is fixed and small.
_SCALE = max(1, int(os.environ.get("KT_FUZZ_SCALE", "1") or 1))
FUZZ = settings(deadline=None, derandomize=not os.environ.get("KT_FUZZ_RANDOM"), database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.filter_too_much, HealthCheck.data_too_large])

NEVER_NUMBERS = ["nan", "NaN", "inf", "-inf", "1e400", "-1e400", "abc", "", "1,5", "0x10", "12GB!", "9" * 5000,
                 "1e999999", "-" + "9" * 400]
NUMBERS = ["0", "-1", "1", "2", "4", "6", "8", "12", "16", "24", "64", "80", "256", "512", "768", "1024", "3.5",
           "1e-4", "1e3", "999999999999999999999", " 12 "]
WORDS = ["", "x", "sd15", "sdxl", "flux", "character", "style", "concept", "dev", "schnell", "auto", "default",
         "roadmap", "[/red]", "[bold]x", "$(touch PWNED)", "`touch PWNED`", "a;b", "'\"", "é日本🎨", "-", "../..",
         "%PATH%", "a" * 300, "learning_rate=1e-4", "network_dim=nan", "train_batch_size=0", "=", "x=",
         "resolution=-512", "mixed_precision=fp16; rm -rf /", "optimizer_type=\"AdamW8bit", "0,1", "0,0", "-1",
         # quotes, escapes and unicode in every string option (names, triggers, paths)
         "Bob's images", 'say "hi"', "back\\slash\\", "\x1b]0;PWNED\x07\x1b[2J", "日本 'é' \"🎨\"", "a\tb",
         "learning_rate=1e400", "network_dim=" + "9" * 5000, "learning_rate=inf", "max_train_steps=1e308",
         "output_name=Bob's", 'output_name=say "hi"', "\udcff\udcfe"]
# Edge numbers for every numeric field inside files (GUI JSON, TOML, command lines).
EDGE_NUMBERS = [float("inf"), float("-inf"), float("nan"), 1e308, -0.0, 5e-324, 2**63, -2**63 - 1, 10**30, 0, -1]


class Hung(BaseException):
    """Raised by the alarm. Not TimeoutError: that is an OSError, which the CLI turns into an
    exit-2 paragraph, so a hang would pass as a refusal."""


def _alarm(seconds: int):
    """Every example must return in `seconds`: a blocked read (a FIFO, a device) fails the
    example instead of hanging the suite."""
    import signal

    def fire(signum, frame):
        raise Hung(f"the command did not return within {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    return lambda: (signal.alarm(0), signal.signal(signal.SIGALRM, old))


@pytest.fixture(scope="module", autouse=True)
def _count_examples(tmp_path_factory):
    """Runs the module in a scratch working folder (relative paths among the values land
    there, not in the checkout) and prints how many examples ran (pytest -s)."""
    cwd = os.getcwd()
    watched = [REPO, STANDIN]  # nothing of the checkout may receive files
    before = {d: sorted(os.listdir(d)) for d in watched}
    os.chdir(tmp_path_factory.mktemp("cwd"))
    try:
        yield
    finally:
        os.chdir(cwd)
    after = {d: sorted(os.listdir(d)) for d in watched}
    assert after == before, "the fuzz wrote into the checkout"
    counts = {k: v for k, v in sorted(EXAMPLES.items()) if k not in ("dataset-folders", "outs")}
    print(f"\nfuzz examples run: {sum(counts.values())} — " + ", ".join(f"{k} {v}" for k, v in counts.items()))


def _numeric(action: argparse.Action) -> bool:
    t = action.type
    return t in (int, float) or getattr(t, "__name__", "") in ("number", "whole number", "gpu_size", "_pixels")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The user's files: configs of every form, a dataset, logs, odd files and folders."""
    root = tmp_path_factory.mktemp("userfiles")
    (root / "cfg.toml").write_text(tomli_w.dumps({
        "pretrained_model_name_or_path": "/models/sd15.safetensors", "network_module": "networks.lora",
        "network_dim": 16, "network_alpha": 8, "resolution": "512,512", "train_batch_size": 2,
        "mixed_precision": "fp16", "optimizer_type": "AdamW8bit", "learning_rate": 1e-4, "max_train_steps": 100,
        "output_dir": str(root / "lora_out"), "output_name": "x", "gradient_checkpointing": True}))
    (root / "bad.toml").write_text("network_dim = [\n")
    (root / "gui.json").write_text(json.dumps({"pretrained_model_name_or_path": "/m/sdxl.safetensors",
                                               "sdxl": True, "network_dim": 32, "train_batch_size": 1,
                                               "max_resolution": "1024,1024", "optimizer": "Adafactor"}))
    (root / "trunc.json").write_text('{"network_dim": 32, "train_batch_si')
    (root / "cmd.sh").write_text("accelerate launch --mixed_precision bf16 sdxl_train_network.py \\\n"
                                 "  --network_dim 64 --resolution 1024,1024 --train_batch_size 4 --xformers\n")
    (root / "empty.txt").write_text("")
    (root / "binary.bin").write_bytes(bytes(range(256)) * 8)
    (root / "oom.log").write_text("steps:  10%|#         | 10/100 [00:10<01:30, 1.00it/s]\n"
                                  "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
                                  "has a total capacity of 11.76 GiB of which 1.02 GiB is free.\n")
    data = root / "imgs"
    data.mkdir()
    for i in range(3):
        Image.new("RGB", (640, 512), (60 * i, 30, 90)).save(data / f"p{i}.png")
        (data / f"p{i}.txt").write_text(f"ohwx, picture {i}\n")
    (root / "empty_dir").mkdir()
    (root / "dir[bold]").mkdir()
    (root / "base.safetensors").write_bytes(b"\0" * 64)
    # Special files in every file argument: a FIFO, a dangling link, a link to a device.
    os.mkfifo(root / "fifo")
    (root / "dangling").symlink_to(root / "nowhere")
    (root / "zero").symlink_to("/dev/zero")
    # Ordinary names with quotes and unicode, and a dataset folder holding special files
    # named like pictures and captions, and a name holding terminal escapes.
    quoted = root / "Bob's \"imgs\" é"
    quoted.mkdir()
    for i in range(2):
        Image.new("RGB", (512, 512), (9, 9, 9 * i)).save(quoted / f"q{i}.png")
    special = root / "special_ds"
    special.mkdir()
    Image.new("RGB", (512, 512)).save(special / "ok.png")
    Image.new("RGB", (512, 512), (1, 1, 1)).save(special / "\x1b]0;PWNED\x07\x1b[2J.png")
    os.mkfifo(special / "x.png")
    os.mkfifo(special / "ok.txt")
    (special / "y.png").symlink_to("/dev/zero")
    (special / "gone.png").symlink_to(special / "nowhere.png")
    (root / "nested.toml").write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    (root / "nested.json").write_text('{"a": ' * 5000 + "1" + "}" * 5000)
    (root / "bom.toml").write_bytes(b"\xef\xbb\xbf# comment\nnetwork_dim = 4\n")
    (root / "ds_wrong.toml").write_text("[[datasets]]\nsubsets = 5\n")
    (root / "preset_wrong.toml").write_text("settings = 5\n")
    (root / "edges.json").write_text('{"LoRA_type": "Standard", "network_dim": 1e400, "learning_rate": "inf", '
                                     '"max_train_steps": ' + "9" * 5000 + "}")
    # The stand-in trainer, copied: a path among the values can be anyone's --out, and the
    # checkout's own tests/standin must never receive plan files.
    import shutil

    shutil.copytree(STANDIN, root / "standin", ignore=shutil.ignore_patterns("__pycache__"))
    planned = root / "planned_run"
    res = invoke("run", "--model", "sd15", "--job", "style", "--gpu", "8", "--cpu", "--data", data, "--out",
                 planned, "--sd-scripts", root / "standin", "--steps", "12", "--base", root / "base.safetensors", "--dry-run")
    assert res.exit_code == 0, res.output
    ORIGINAL.update(_hashes(root))
    return root


def _hashes(root: Path) -> dict[str, str]:
    out = {}
    for p in root.rglob("*"):
        if not p.is_symlink() and p.is_file():
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _paths(world: Path, scratch: Path) -> list[str]:
    names = ["cfg.toml", "bad.toml", "gui.json", "trunc.json", "cmd.sh", "empty.txt", "binary.bin", "oom.log",
             "imgs", "empty_dir", "dir[bold]", "base.safetensors", "planned_run", "missing.toml", "planned_run/run.json",
             "standin", "fifo", "dangling", "zero", "Bob's \"imgs\" é", "special_ds", "nested.toml", "nested.json",
             "bom.toml", "ds_wrong.toml", "preset_wrong.toml", "edges.json"]
    return [str(world / n) for n in names] + [str(scratch / "out"), str(scratch / "new" / "deep"), "/proc/nope",
                                              "/dev/null", "/dev/zero", "", str(scratch / "o'ut \"q\" é")]


def _options(name: str, sub: str | None = None) -> list[argparse.Action]:
    from kohya_tuner.cli.app import build_command_parser

    parser, _module = build_command_parser(name)
    actions = parser._actions
    if sub is not None:
        subs = next(a for a in actions if isinstance(a, argparse._SubParsersAction))
        actions = subs.choices[sub]._actions
    return [a for a in actions if a.option_strings and not isinstance(a, argparse._HelpAction)
            and "--force" not in a.option_strings]


def _positionals(name: str, sub: str | None = None) -> int:
    from kohya_tuner.cli.app import build_command_parser

    parser, _module = build_command_parser(name)
    actions = parser._actions
    if sub is not None:
        subs = next(a for a in actions if isinstance(a, argparse._SubParsersAction))
        actions = subs.choices[sub]._actions
    return sum(1 for a in actions if not a.option_strings and not isinstance(a, argparse._SubParsersAction))


def _accepted(action: argparse.Action) -> list[str]:
    """The NUMBERS this flag's own type takes."""
    out = []
    for v in NUMBERS:
        try:
            action.type(v)
        except (argparse.ArgumentTypeError, ValueError, TypeError):
            continue
        out.append(v)
    return out


def _base(name: str, sub: str | None, world: Path, out: Path) -> list[str]:
    """A command line that works, for mutations to start from (deep code is reached only
    when the rest of the line is valid)."""
    base = {
        "config": ["--model", "sd15", "--job", "character", "--gpu", "8", "--out", str(out)],
        "estimate": [str(world / "cfg.toml"), "--model", "sd15"],
        "fit": [str(world / "cfg.toml"), "--gpu", "8", "--out", str(out / "fitted.toml")],
        "check": [str(world / "cfg.toml")],
        "diagnose": [str(world / "oom.log")],
        "dataset check": [str(world / "imgs"), "--model", "sd15"],
        "dataset prep": [str(world / "imgs"), "--model", "sd15", "--out", str(out / "prep")],
        "run": ["--model", "sd15", "--job", "style", "--gpu", "8", "--cpu", "--data", str(world / "imgs"),
                "--out", str(out / "run"), "--sd-scripts", str(world / "standin"), "--steps", "12", "--base",
                str(world / "base.safetensors")],
        "doctor": [],
    }
    return base[name + (f" {sub}" if sub else "")]


@st.composite
def command_lines(draw, name: str, sub: str | None, world: Path, scratch: Path):
    actions = _options(name, sub)
    paths = _paths(world, scratch)
    EXAMPLES["outs"] += 1
    argv: list[str] = [name] + ([sub] if sub else [])
    if draw(st.integers(0, 3)):  # mostly a working line, mutated below
        argv += _base(name, sub, world, scratch / f"o{EXAMPLES['outs']}")
    else:
        argv += [draw(st.sampled_from(paths + WORDS)) for _ in range(_positionals(name, sub))]
    never = False
    for action in draw(st.lists(st.sampled_from(actions), max_size=4, unique_by=lambda a: a.dest)):
        flag = draw(st.sampled_from(action.option_strings))
        if action.nargs == 0:
            argv.append(flag)
            continue
        if _numeric(action):
            accepted = _accepted(action)
            if accepted and draw(st.integers(0, 2)):  # mostly a value the flag takes, to get past it
                value = draw(st.sampled_from(accepted))
            else:
                value = draw(st.sampled_from(NUMBERS + NEVER_NUMBERS))
            never = never or value in NEVER_NUMBERS
        elif action.choices:
            value = draw(st.sampled_from(list(action.choices) + WORDS[:12]))
        else:
            value = draw(st.sampled_from(paths + WORDS))
        argv += [flag, value] if not value.startswith("-") else [f"{flag}={value}"]
    if name == "run" and "--dry-run" not in argv:
        argv.append("--dry-run")  # never trains
    return argv, never


# The user's files as the fixture made them. An earlier example's output inside the world
# (a folder `dataset prep` filled, then given to it again) is the program's to update.
ORIGINAL: dict[str, str] = {}


def _check(argv: list[str], never: bool, world: Path) -> None:
    before = {p: h for p, h in _hashes(world).items() if p in ORIGINAL}
    done = _alarm(10)
    try:
        res = invoke(*argv, env={"COLUMNS": "100"})
    finally:
        done()
    EXAMPLES[argv[0] + (f" {argv[1]}" if argv[0] == "dataset" else "")] += 1
    # A frame of our own code in the output is a traceback (diagnose quotes the log's own).
    assert f'File "{REPO / "kohya_tuner"}' not in res.output, (argv, res.output)
    assert res.exit_code in (0, 1, 2), (argv, res.exit_code, res.output)
    if never:
        assert res.exit_code == 2, (argv, res.output)
    if res.exit_code == 2:
        assert res.output.strip(), (argv, "exit 2 without a word")
    after = _hashes(world)
    changed = [p for p, h in before.items() if after.get(p, h) != h]
    assert not changed, (argv, changed)
    gone = [p for p in before if p not in after]
    assert not gone, (argv, gone)


COMMANDS = [("config", None, 60), ("estimate", None, 60), ("fit", None, 60), ("check", None, 60),
            ("diagnose", None, 40), ("dataset", "check", 30), ("dataset", "prep", 20), ("run", None, 40),
            ("doctor", None, 6), ("setup", None, 0)]


@pytest.mark.parametrize("name, sub, n", [c for c in COMMANDS if c[2]], ids=lambda v: str(v))
def test_fuzz_command_options(name, sub, n, world, tmp_path_factory):
    scratch = tmp_path_factory.mktemp("scratch")

    @settings(FUZZ, max_examples=n * _SCALE)
    @given(data=st.data())
    def prop(data):
        argv, never = data.draw(command_lines(name, sub, world, scratch))
        if name == "doctor":
            argv = [a for a in argv if a not in ("--python",)]  # a real probe of a real python is slow
        _check(argv, never, world)

    prop()


def test_fuzz_setup_option_errors_only(world):
    """setup clones from the network when its options are valid; only refusals are fuzzed."""
    for argv in (["setup", "--dir", str(world / "cfg.toml")], ["setup", "--sd-scripts", str(world / "imgs")],
                 ["setup", "--sd-scripts", str(world / "missing")], ["setup", "--nope"],
                 ["setup", "--dir", str(world / "empty_dir"), "--sd-scripts", str(world / "imgs")]):
        _check(argv, False, world)


# ---- file contents ------------------------------------------------------------------------

_VALUES = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                    st.sampled_from(EDGE_NUMBERS), st.sampled_from(WORDS),
                    st.text(max_size=40), st.lists(st.integers(-5, 5000), max_size=3),
                    st.sampled_from(["512,512", "1024", "fp16", "bf16", "AdamW8bit", "networks.lora", "cosine",
                                     "sd3", "lycoris.kohya", "[/red]", "-1", "nan"]))
_KEYS = st.sampled_from(["network_dim", "network_alpha", "train_batch_size", "resolution", "max_train_steps",
                         "learning_rate", "mixed_precision", "optimizer_type", "gradient_checkpointing",
                         "network_module", "pretrained_model_name_or_path", "cache_latents", "blocks_to_swap",
                         "fp8_base", "max_bucket_reso", "min_bucket_reso", "network_args", "sdxl", "xformers",
                         "gradient_accumulation_steps", "max_data_loader_n_workers", "persistent_data_loader_workers",
                         "save_every_n_steps", "lr_scheduler", "max_resolution", "optimizer", "LoRA_type",
                         "train_data_dir", "unknown_key", "output_dir"])
CONFIGS = st.dictionaries(_KEYS, _VALUES, max_size=10)


def _toml_text(doc: dict) -> str:
    try:
        return tomli_w.dumps(doc)
    except (TypeError, ValueError):
        return "\n".join(f"{k} = {json.dumps(v)}" for k, v in doc.items())


@st.composite
def config_files(draw):
    doc = draw(CONFIGS)
    form = draw(st.sampled_from(["toml", "json", "sh", "raw", "nested", "wrong"]))
    if form == "nested":  # nesting deeper than any parser's recursion
        depth = draw(st.sampled_from([50, 1000, 5000]))
        suffix = draw(st.sampled_from([".toml", ".json"]))
        text = ("a = " + "[" * depth + "]" * depth + "\n" if suffix == ".toml"
                else '{"a": ' * depth + "1" + "}" * depth)
    elif form == "wrong":  # sections of the wrong type, a byte-order mark before a comment
        text = draw(st.sampled_from(["model = 5\n", "[model]\nnetwork_dim = {a = 1}\n", "\ufeff# c\nnetwork_dim = 4\n",
                                     "\ufeffnetwork_dim = 4\n", "network_args = [[1], [2]]\n", "x = 1e400\n",
                                     # past Python's int() digit limit, in each syntax that carries one
                                     "# c\nnetwork_dim = " + "9" * 5000 + "\n", '{"network_dim": ' + "9" * 5000 + "}",
                                     "accelerate launch train_network.py --network_dim " + "9" * 5000 + "\n"]))
        suffix = {"{": ".json", "a": ".sh"}.get(text[0], ".toml")
    elif form == "toml":
        text = _toml_text({**doc, **({"section": draw(CONFIGS)} if draw(st.booleans()) else {})})
        suffix = ".toml"
    elif form == "json":
        text = json.dumps(doc, default=str)
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] if draw(st.booleans()) else text
        suffix = ".json"
    elif form == "sh":
        script = draw(st.sampled_from(["train_network.py", "sdxl_train_network.py", "flux_train_network.py",
                                       "sdxl_train.py", "unknown.py"]))
        args = " ".join(f"--{k} {json.dumps(v) if not isinstance(v, str) else v}" for k, v in doc.items())
        quote = draw(st.sampled_from(["", "'", '"', "\\"]))
        text = f"accelerate launch {script} {args} {quote}\n"
        suffix = draw(st.sampled_from([".sh", ".bat", ".txt"]))
    else:
        text = draw(st.text(max_size=300))
        suffix = draw(st.sampled_from([".toml", ".json", ".txt", ""]))
    return text, suffix


def test_fuzz_config_contents(world, tmp_path_factory):
    scratch = tmp_path_factory.mktemp("configs")

    @settings(FUZZ, max_examples=80 * _SCALE)
    @given(cfg=config_files(), model=st.sampled_from([None, "sd15", "sdxl", "flux"]),
           command=st.sampled_from(["estimate", "fit", "check"]))
    def prop(cfg, model, command):
        text, suffix = cfg
        path = scratch / f"user_config{suffix}"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        argv = [command, str(path)] + (["--model", model] if model else []) + ["--json"]
        if command == "fit":
            argv += ["--gpu", "8", "--out", str(scratch / "fitted.toml")]
        _check(argv, False, world)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, "the input config was changed"
        (scratch / "fitted.toml").unlink(missing_ok=True)
        (scratch / "fitted.dataset.toml").unlink(missing_ok=True)

    prop()


@st.composite
def dataset_files(draw, images: str):
    """--dataset files: well formed, wrong-typed sections, edge numbers, nesting."""
    sub = {"image_dir": draw(st.sampled_from([images, images + "'\"", "é日本"])),
           "num_repeats": draw(st.sampled_from([1, 10, 0, -1, 2**63, 10**30, 1.5, "x"]))}
    doc = draw(st.sampled_from([
        {"datasets": [{"subsets": [sub]}]},
        {"general": {"resolution": draw(st.sampled_from([512, "1024,1024", 1e400, -1, 2**70]))},
         "datasets": [{"batch_size": draw(st.sampled_from([1, 0, 10**30, float("inf")])), "subsets": [sub]}]},
        {"datasets": 5}, {"datasets": [{"subsets": 5}]}, {"general": 5}, {"datasets": [5]},
        {"datasets": [{"subsets": [5]}]}]))
    suffix = draw(st.sampled_from([".toml", ".json"]))
    if suffix == ".json":
        return json.dumps(doc, allow_nan=True), suffix
    return _toml_text(doc), suffix


def test_fuzz_dataset_files(world, tmp_path_factory):
    scratch = tmp_path_factory.mktemp("dsfiles")

    @settings(FUZZ, max_examples=40 * _SCALE)
    @given(ds=dataset_files(str(world / "imgs")), command=st.sampled_from(["estimate", "fit", "check"]))
    def prop(ds, command):
        text, suffix = ds
        path = scratch / f"dataset{suffix}"
        path.write_text(text, encoding="utf-8")
        argv = [command, str(world / "cfg.toml"), "--json", "--dataset-config" if command == "check" else "--dataset",
                str(path)]
        if command == "fit":
            argv += ["--gpu", "8", "--out", str(scratch / "fitted.toml")]
        _check(argv, False, world)
        (scratch / "fitted.toml").unlink(missing_ok=True)
        (scratch / "fitted.dataset.toml").unlink(missing_ok=True)

    prop()


@st.composite
def dataset_folders(draw, base: Path):
    folder = base / f"ds{EXAMPLES['dataset-folders']}"
    EXAMPLES["dataset-folders"] += 1
    folder.mkdir(parents=True)
    for i in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["png", "jpg", "garbage", "truncated", "rgba", "cmyk", "tiny", "caption-only"]))
        w, h = draw(st.integers(1, 700)), draw(st.integers(1, 700))
        name = draw(st.sampled_from([f"i{i}", f"é {i}", f".h{i}", f"[bold]{i}", f"{i}.Png", f"Bob's \"{i}\"",
                                     f"\x1b[2J\x1b]0;T{i}\x07", f"\u202e{i}gnp"]))
        p = folder / f"{name}.{'jpg' if kind in ('jpg', 'cmyk') else 'png'}"
        if kind == "garbage":
            p.write_bytes(draw(st.binary(max_size=64)))
        elif kind == "truncated":
            Image.new("RGB", (w, h), (1, 2, 3)).save(p, "PNG")
            p.write_bytes(p.read_bytes()[: max(8, len(p.read_bytes()) // 2)])
        elif kind == "caption-only":
            pass
        else:
            mode = {"rgba": "RGBA", "cmyk": "CMYK"}.get(kind, "RGB")
            size = (1, 1) if kind == "tiny" else (w, h)
            Image.new(mode, size).save(p, "JPEG" if p.suffix == ".jpg" else "PNG")
        if draw(st.booleans()):
            cap = draw(st.one_of(st.binary(max_size=40), st.text(max_size=40).map(lambda t: t.encode("utf-8",
                                                                                                      "replace"))))
            (folder / f"{name}.txt").write_bytes(cap)
    # Special files named like pictures and captions: must never be opened (they block).
    for j in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["fifo", "device", "dangling", "dir"]))
        p = folder / draw(st.sampled_from([f"s{j}.png", f"s{j}.txt", f"s{j}.jpg"]))
        if p.exists() or p.is_symlink():
            continue
        if kind == "fifo":
            os.mkfifo(p)
        elif kind == "device":
            p.symlink_to("/dev/zero")
        elif kind == "dangling":
            p.symlink_to(folder / "nowhere")
        else:
            p.mkdir()
    return folder


def test_fuzz_dataset_folders(world, tmp_path_factory):
    base = tmp_path_factory.mktemp("datasets")

    @settings(FUZZ, max_examples=40 * _SCALE)
    @given(data=st.data(), command=st.sampled_from(["check", "prep"]),
           model=st.sampled_from(["sd15", "sdxl", "flux"]))
    def prop(data, command, model):
        folder = data.draw(dataset_folders(base))
        before = _hashes(folder)
        argv = ["dataset", command, str(folder), "--model", model, "--json", "--workers", "1"]
        if command == "prep":
            argv += ["--out", str(folder) + ".prepared", "--max-side", "256"]
        _check(argv, False, world)
        assert _hashes(folder) == before, "the originals were changed"

    prop()


@st.composite
def logs(draw):
    parts = [
        "steps:  45%|####5     | 9/20 [00:09<00:11,  1.00s/it, avr_loss=0.123]\r",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
        "7.75 GiB of which 3.06 MiB is free.\n", "Traceback (most recent call last):\n",
        '  File "/sd-scripts/train_network.py", line 1234, in train\n', "caching latents...\n",
        "RuntimeError: CUDA error: an illegal memory access was encountered\n", "Killed\n", "\x1b[31m[/red]\x1b[0m\n",
        "saving state at step 6\n", "epoch 1/3\n", "\x00\xff", "cuda out of memory. tried to allocate 30.00 mib\n",
    ]
    chunks = draw(st.lists(st.one_of(st.sampled_from(parts), st.text(max_size=60)), max_size=25))
    cut = draw(st.booleans())
    text = "".join(chunks)
    return text[: draw(st.integers(0, len(text)))] if cut else text


def test_fuzz_log_contents(world, tmp_path_factory):
    scratch = tmp_path_factory.mktemp("logs")

    @settings(FUZZ, max_examples=50 * _SCALE)
    @given(text=logs(), json_out=st.booleans(), model=st.sampled_from([None, "sd15", "flux", "nope"]))
    def prop(text, json_out, model):
        path = scratch / "train.log"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        argv = ["diagnose", str(path)] + (["--json"] if json_out else []) + (["--model", model] if model else [])
        _check(argv, False, world)

    prop()
