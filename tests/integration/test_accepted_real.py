"""Configs the real pinned sd-scripts trains (CPU, random-weight SD 1.5): check must pass them.

Each file in tests/data/accepted_configs is a variant of tests/data/realtrainer_harness.toml whose
`# why:` header names what it proves: a TOML (launched with --config_file, so argparse's `choices`
and `type` never see its values) or a `.sh` command line (launched as its own argv, so argparse
does). For every one, `kohya-tuner check FILE --model sd15` exits 0 (warnings allowed) and the real
trainer exits 0 and writes the files its `# writes:` header names (default `probe.safetensors`),
under the output folder; `# lora has:` (a tensor name part) and `# lora rank:` are read back from
the LoRA file. A false refusal (check exit 2 on a config that trains) fails here.

The launches need the KOHYA_TUNER_REAL_* variables of ../shared/realtrainer/README.md (marker
`realtrainer`, skipped without them by conftest); they start ahead of the tests that read them, two
at a time where the machine has the cores and the memory (realtrainer_launch.Prelaunched, one pool for
the session), each in its own folder.

The TOMLs in `sdxl/` and `flux/` are for sdxl_train_network.py and flux_train_network.py on their
random-weight models (tools/realmodels/; skipped while the family's variables are unset), checked
with `--model sdxl` / `--model flux`, each with its own copy of the images: `# caches:` names files
the trainer must have written beside them. For these the launch must also have run a backward pass
(the ledger of ../shared/realtrainer/inject): the trainer got past start-up and trained a step.

Each of those launches builds a multi-GB model and runs alone: a plain run launches only the config
headed `# launched by default: yes` (SDXL's, about a minute in float32) and checks the rest without
the trainer. No FLUX.1 config is launched by default: its launches run in bf16, which a CPU without
bf16 instructions computes slowly (about 5 minutes each), and the FLUX.1 scenario (test_real_flux.py)
already trains a plan on flux_train_network.py. KOHYA_TUNER_REAL_ALL=1 launches every one
(docs/check.md gives the last full run).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import struct
import zlib
from pathlib import Path

import pytest
from realtrainer_launch import (
    FAMILIES,
    INJECT,
    PEAK_GIB,
    accelerate,
    family_missing,
    family_of,
    filled,
    launch,
    launch_argv,
    train_script,
)

from tests.clihelp import invoke

ACCEPTED = Path(__file__).resolve().parent.parent / "data" / "accepted_configs"
CONFIGS = sorted([*ACCEPTED.glob("*.toml"), *ACCEPTED.glob("*.sh")])
FAMILY_CONFIGS = sorted(ACCEPTED.glob("*/*.toml"))
REFUSED = ACCEPTED.parent / "refused_configs"
LAUNCH_ALL = os.environ.get("KOHYA_TUNER_REAL_ALL", "").strip() == "1"


def config_id(path: Path) -> str:
    return path.name if family_of(path) == "sd15" else f"{path.parent.name}-{path.name}"


def header(path: Path, field: str) -> str | None:
    m = re.search(rf"^# {field}: (.+)$", path.read_text(encoding="utf-8"), re.MULTILINE)
    return m.group(1).strip() if m else None


def command_argv(sh: Path) -> list[str]:
    """The argv of a filled .sh file: comments dropped, backslash continuations joined, then
    split as a POSIX shell would (shlex), with the real accelerate and train_network.py."""
    lines = [ln for ln in sh.read_text(encoding="utf-8").splitlines() if not ln.lstrip().startswith("#")]
    argv = shlex.split(re.sub(r"\\\s*\n", " ", "\n".join(lines)))
    assert argv[:2] == ["accelerate", "launch"], argv[:3]
    scripts = [i for i, tok in enumerate(argv) if Path(tok).name == "train_network.py"]
    assert len(scripts) == 1, argv
    argv[0] = str(accelerate())
    argv[scripts[0]] = str(train_script())
    return argv


def launches(path: Path) -> bool:
    """Whether this run launches a family config on its script (module docstring)."""
    return LAUNCH_ALL or header(path, "launched by default") == "yes"


def lora_tensors(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape, from a .safetensors file's JSON header."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        head = json.loads(f.read(size))
    return {k: v["shape"] for k, v in head.items() if k != "__metadata__"}


def test_the_suite_has_its_configs():
    tomls = [p for p in CONFIGS if p.suffix == ".toml"]
    shs = [p for p in CONFIGS if p.suffix == ".sh"]
    assert len(tomls) >= 11 and len(shs) >= 4, (len(tomls), len(shs))
    for p in CONFIGS:
        assert header(p, "why"), f"{p.name} has no '# why:' header"
        assert "@MODEL@" in p.read_text(encoding="utf-8") and "@OUT@" in p.read_text(encoding="utf-8"), p.name
        assert "max_train_steps" in p.read_text(encoding="utf-8"), f"{p.name}: keep the launch at 1 step"


DEFAULT_LAUNCHES = {"sdxl": 1, "flux": 0}


@pytest.mark.parametrize("family", ["sdxl", "flux"])
def test_each_family_has_five_accepted_and_five_refused_configs(family):
    accepted = sorted((ACCEPTED / family).glob("*.toml"))
    refused = sorted((REFUSED / family).glob("*.toml"))
    assert len(accepted) >= 5 and len(refused) >= 5, (len(accepted), len(refused))
    for p in accepted:
        text = p.read_text(encoding="utf-8")
        assert header(p, "why") and "max_train_steps = 1\n" in text and "sample_every_n" not in text, p.name
    # A plain run launches SDXL's one on its script, and no FLUX.1 config (module docstring).
    assert [header(p, "launched by default") for p in accepted].count("yes") == DEFAULT_LAUNCHES[family], family
    for p in refused:  # one rule each, with what sd-scripts says and where
        assert all(header(p, f) for f in ("offending", "rule", "sd-scripts says", "line")), p.name


def _png(path: Path, side: int) -> None:
    """A grey side x side PNG (what the harness's images are: 128 px), written without Pillow."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + b"\x80" * (3 * side) for _ in range(side))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("path", CONFIGS + FAMILY_CONFIGS, ids=config_id)
def test_check_passes_every_accepted_config_without_the_trainer(path, tmp_path):
    """The check half on a stand-in tree shaped like the harness's (a model file, 128 px images in a
    `2_mytoken style` folder with captions, a tokenizer folder), so a false refusal shows without the
    real trainer too."""
    img = tmp_path / "data" / "2_mytoken style"
    img.mkdir(parents=True)
    for i in range(4):
        _png(img / f"{i}.png", 128)
        (img / f"{i}.txt").write_text("mytoken style, a picture\n", encoding="utf-8")
    (tmp_path / "model.safetensors").write_bytes(b"0")
    (tmp_path / "tokcache").mkdir()
    text = path.read_text(encoding="utf-8")
    for name in ("clip_l", "t5xxl", "ae"):
        (tmp_path / f"{name}.safetensors").write_bytes(b"0")
    for key, value in {"@MODEL@": tmp_path / "model.safetensors", "@DATA@": tmp_path / "data",
                       "@TOKCACHE@": tmp_path / "tokcache", "@OUT@": tmp_path / "output", "@CONFIGDIR@": path.parent,
                       "@CLIP_L@": tmp_path / "clip_l.safetensors", "@T5XXL@": tmp_path / "t5xxl.safetensors",
                       "@AE@": tmp_path / "ae.safetensors"}.items():
        text = text.replace(key, str(value))
    cfg = tmp_path / ("command.sh" if path.suffix == ".sh" else "config.toml")
    cfg.write_text(text, encoding="utf-8")
    res = invoke("check", str(cfg), "--model", FAMILIES[family_of(path)].model, "--json")
    data = json.loads(res.stdout)
    assert res.exit_code == 0 and data["ok"], f"false refusal of {path.name}: {data['problems']}"


def prelaunch(pool, cases, tmp_path_factory) -> dict[str, Path]:
    """Submits every real launch this session runs from this module (conftest's `prelaunched`, in
    test order): config name -> its folder."""
    folders = {}
    for test, path in cases:
        if test == "test_check_passes_what_the_real_trainer_trains":
            folders[path.name] = folder = tmp_path_factory.mktemp(path.stem)
            cfg = filled(path, folder, "command.sh" if path.suffix == ".sh" else "config.toml")
            if path.suffix == ".sh":
                pool.submit(path.name, PEAK_GIB["sd15"], launch_argv, command_argv(cfg), folder)
            else:
                pool.submit(path.name, PEAK_GIB["sd15"], launch, cfg)
        elif test == "test_check_passes_what_the_real_family_script_trains" and not family_missing(family_of(path)) \
                and launches(path):
            key = f"{family_of(path)}/{path.name}"
            folders[key] = folder = tmp_path_factory.mktemp(path.stem)
            pool.submit(key, PEAK_GIB[family_of(path)], launch, filled(path, folder), timeout=600,
                        script=FAMILIES[family_of(path)].script)
    return folders


@pytest.fixture(scope="module")
def launched(prelaunched):
    """(the queue the launches run in, config name -> its folder)."""
    return prelaunched[__name__]


@pytest.mark.realtrainer
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_check_passes_what_the_real_trainer_trains(path, launched):
    pool, folders = launched
    tmp_path = folders[path.name]
    cfg = tmp_path / ("command.sh" if path.suffix == ".sh" else "config.toml")
    res = invoke("check", str(cfg), "--model", "sd15", "--json")
    data = json.loads(res.stdout)
    assert res.exit_code == 0 and data["ok"], f"false refusal of {path.name}: {data['problems']}"
    run = pool.result(path.name)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    for pattern in (header(path, "writes") or "probe.safetensors").split():
        found = list((tmp_path / "output").glob(pattern))
        assert found and all(f.stat().st_size > 0 for f in found), f"{pattern} not written; {out[-2000:]}"
    has, rank = header(path, "lora has"), header(path, "lora rank")
    if has or rank:
        tensors = lora_tensors(tmp_path / "output" / "probe.safetensors")
        assert not has or any(has in k for k in tensors), f"no LoRA tensor named like {has!r}"
        downs = [shape[0] for k, shape in tensors.items() if k.endswith("lora_down.weight")]
        assert not rank or (downs and set(downs) == {int(rank)}), f"LoRA ranks {sorted(set(downs))}, expected {rank}"
    if INJECT.is_dir() and path.suffix == ".toml":  # the ledger names the --config_file of each backward pass
        assert (tmp_path / "backward.ledger").read_text().strip(), "no backward pass ran"


@pytest.mark.realtrainer
@pytest.mark.parametrize("path", FAMILY_CONFIGS, ids=config_id)
def test_check_passes_what_the_real_family_script_trains(path, launched):
    family = FAMILIES[family_of(path)]
    missing = family_missing(family_of(path))
    if missing:
        pytest.skip(f"no random-weight {family.model} ({', '.join(missing)} unset): build it with tools/realmodels/")
    if not launches(path):
        pytest.skip(f"{config_id(path)} is launched only with KOHYA_TUNER_REAL_ALL=1 (a plain run launches SDXL's "
                    "headed '# launched by default: yes' and no FLUX.1 one; the check half runs in "
                    "test_check_passes_every_accepted_config_without_the_trainer)")
    pool, folders = launched
    key = f"{family_of(path)}/{path.name}"
    tmp_path = folders[key]
    cfg = tmp_path / "config.toml"
    res = invoke("check", str(cfg), "--model", family.model, "--json")
    data = json.loads(res.stdout)
    assert res.exit_code == 0 and data["ok"], f"false refusal of {path.name}: {data['problems']}"
    run = pool.result(key)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    lora = tmp_path / "output" / "probe.safetensors"
    assert lora.is_file() and lora.stat().st_size > 0, out[-2000:]
    for pattern in (header(path, "caches") or "").split():
        assert list((tmp_path / "data").glob(pattern)), f"no {pattern} cached; {out[-2000:]}"
    has = header(path, "lora has")
    assert not has or any(has in k for k in lora_tensors(lora)), f"no LoRA tensor named like {has!r}"
    if INJECT.is_dir():  # a step really trained, not only a start-up passed
        assert (tmp_path / "backward.ledger").read_text().strip(), "no backward pass ran"
