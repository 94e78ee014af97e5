"""A log pasted twice (or a file a relaunch appended the same output to) reads as its last copy: the
log's opening lines met again word for word begin a run of its own (parser.Restart). Built from
classes of text, the real transcripts and the labelled logs, not from the cases that led to it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from kohya_tuner.logparse import LogParser, diagnose
from kohya_tuner.logparse.events import Restart
from kohya_tuner.logparse.reader import iter_events, open_log
from tests.logparse_labels import all_fixtures
from tests.logparse_texts import BAR, CACHED, HEAD, OOM, frame

TRANSCRIPTS = sorted((Path(__file__).parents[2] / "shared" / "sd-scripts" / "logs").glob("*.log"))

OPENING = ("2026-02-16 10:00:00 INFO     Loading settings from /data/cfg.toml...\n"
           "2026-02-16 10:00:00 INFO     prepare tokenizer\n"
           "2026-02-16 10:00:01 INFO     Using DreamBooth method.\n"
           "2026-02-16 10:00:01 INFO     prepare images.\n"
           "2026-02-16 10:00:01 INFO     found directory /data/img/2_ohwx contains 12 image files\n")
OOM_STEP = (OPENING + "2026-02-16 10:00:09 INFO     loading U-Net from checkpoint\n" + CACHED
            + "running training / 学習開始\n" + BAR + HEAD
            + frame("/sd-scripts/train_network.py", 1100, "train", "loss.backward()") + OOM)
LOAD_FAIL = (OPENING + "2026-02-16 10:00:09 INFO     loading U-Net from checkpoint\n" + HEAD
             + frame("/sd-scripts/library/model_util.py", 900, "load_models_from_stable_diffusion_checkpoint")
             + "FileNotFoundError: [Errno 2] No such file or directory: '/m/model.safetensors'\n")
FINISHED = OPENING + CACHED + "running training / 学習開始\n" + BAR + "model saved.\n"
# A run cut off mid-traceback (nothing after the frames): the second copy's opening ends it.
CUT = OPENING + "running training / 学習開始\n" + BAR + HEAD + frame("/sd-scripts/train_network.py", 1100, "train")
TEXTS = {"oom_step": OOM_STEP, "load_fail": LOAD_FAIL, "finished": FINISHED, "cut": CUT}


def reading(text: str, coalesce: bool = True, chunk: int | None = None):
    parser = LogParser(coalesce_progress=coalesce)
    events = []
    if chunk is None:
        events += parser.feed(text)
    else:
        for i in range(0, len(text), chunk):
            events += parser.feed(text[i:i + chunk])
    events += parser.finish()
    d = diagnose(events)
    return (d.outcome, d.phase, d.step, d.error.kind if d.error else None), events


def restarts(events) -> int:
    return sum(isinstance(e, Restart) for e in events)


@pytest.mark.parametrize("coalesce", [True, False])
@pytest.mark.parametrize("name", sorted(TEXTS))
@pytest.mark.parametrize("before", sorted(TEXTS))
def test_the_last_copy_is_read(before, name, coalesce):
    once, _ = reading(TEXTS[name], coalesce)
    for sep in ("", "\n", "\n\n"):
        got, events = reading(TEXTS[before] + sep + TEXTS[name], coalesce)
        assert got == once, (before, name, repr(sep))
        assert restarts(events) == 1


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
def test_chunks_do_not_change_the_reading(chunk):
    text = CUT + OOM_STEP
    whole = reading(text, coalesce=False)
    cut = reading(text, coalesce=False, chunk=chunk)
    assert cut[0] == whole[0] and [type(e) for e in cut[1]] == [type(e) for e in whole[1]]


def test_an_opening_that_starts_again_but_breaks_off_is_read_in_order():
    # The first three opening lines again, then an OOM: the held lines are read as they came.
    partial = "".join(OPENING.splitlines(keepends=True)[:3])
    text = FINISHED + partial + HEAD + frame("/sd-scripts/train_network.py", 1100, "train") + OOM
    got, events = reading(text)
    assert restarts(events) == 0
    assert got[0] == "oom"
    plain, _ = reading(FINISHED + partial.replace("INFO", "INFO ") + HEAD
                       + frame("/sd-scripts/train_network.py", 1100, "train") + OOM)
    assert got == plain


@pytest.mark.parametrize("opening", [
    # Another rank's traceback with the same frames is the same failure on another process.
    HEAD + frame("/sd-scripts/train_network.py", 1115, "<module>", "trainer.train(args)")
    + frame("/sd-scripts/train_network.py", 1100, "train", "loss.backward()"),
    "[rank0]: " + HEAD + "[rank0]: " + frame("/s/t.py", 1, "a") + "[rank0]: " + frame("/s/t.py", 2, "b"),
    # Too short to be sure of: five lines of a few characters.
    "ok\nA\nB\nC\nD\n",
    # The same line five times is one line repeated, not an opening.
    "warning: deprecated argument, see the docs\n" * 5,
])
def test_openings_that_recur_within_one_run_do_not_begin_a_copy(opening):
    text = opening + BAR + opening + HEAD + frame("/sd-scripts/train_network.py", 1100, "train") + OOM
    got, events = reading(text)
    assert restarts(events) == 0
    assert got[0] == "oom" and got[2] == 10  # the bar before the second block still counts


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=lambda p: p.name)
def test_the_real_transcripts_pasted_twice_read_as_once(path, tmp_path):
    data = path.read_bytes()
    twice = tmp_path / "twice.log"
    twice.write_bytes(data + (b"" if data.endswith(b"\n") else b"\n") + data)
    once = diagnose(iter_events(open_log(path), coalesce_progress=True))
    again = diagnose(iter_events(open_log(twice), coalesce_progress=True))
    assert (again.outcome, again.phase, again.step, again.error) == (once.outcome, once.phase, once.step, once.error)


# Labelled logs whose doubled text still reads otherwise, and why: their opening holds a bar that
# coalescing folds with the next copy's, or lines a traceback's frames take in.
DOUBLED_EXCEPTIONS = {"225.log", "928.log", "2812.log", "505.log"}


def _opening_is_a_traceback(data: bytes) -> bool:
    first = next((ln for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()), "")
    return first.lstrip().startswith(("Traceback (most", "File \"", "[rank")) or "Traceback (most" in first[:40]


def test_labelled_logs_pasted_twice_read_as_once(tmp_path):
    fixtures = [fx for fx in all_fixtures() if fx.path.suffix == ".log"]
    sample = random.Random(22).sample(fixtures, 500)
    differ = []
    for fx in sample:
        data = fx.path.read_bytes()
        if _opening_is_a_traceback(data) or fx.path.name in DOUBLED_EXCEPTIONS:
            continue
        twice = tmp_path / "twice.log"
        twice.write_bytes(data + (b"" if data.endswith(b"\n") else b"\n") + data)
        once = diagnose(iter_events(open_log(fx.path), coalesce_progress=True))
        again = diagnose(iter_events(open_log(twice), coalesce_progress=True))
        if (once.outcome, once.phase, once.step) != (again.outcome, again.phase, again.step):
            differ.append(fx.path.name)
    assert differ == []


# ---- accelerate re-raising the trainer's failure with the tail of its stderr ---------------------------

SAVES = "".join(f"2026-02-16 10:01:0{i} INFO     Saving current state to /out/lora-step0000000{i}-state\n"
                for i in range(1, 4))
TRAINER = (OPENING + CACHED + "running training / 学習開始\n" + SAVES + BAR + HEAD
           + frame("/sd-scripts/train_network.py", 1100, "train", "loss.backward()"))
LAUNCHER = ("\nThe above exception was the direct cause of the following exception:\n\n" + HEAD
            + frame("/venv/lib/python3.11/site-packages/accelerate/commands/launch.py", 1049, "_run_subprocess",
                    "raise subprocess.CalledProcessError(")
            + "subprocess.CalledProcessError: Command '['/venv/bin/python', 'train_network.py']' returned non-zero "
              "exit status 1.\n")
ERRORS = {"oom": OOM, "missing": "FileNotFoundError: [Errno 2] No such file or directory: '/m/vae.safetensors'\n"}


def _kinds(events) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in events:
        out[type(e).__name__] = out.get(type(e).__name__, 0) + 1
    return out


@pytest.mark.parametrize("coalesce", [True, False])
@pytest.mark.parametrize("cut", [0, 7, 300])  # the kept tail starts at a chunk boundary, mid-line or not
@pytest.mark.parametrize("error", sorted(ERRORS))
def test_the_launchers_copy_of_the_stderr_tail_is_read_once(error, cut, coalesce):
    trainer = TRAINER + ERRORS[error]
    alone, alone_events = reading(trainer + LAUNCHER, coalesce)
    relayed, events = reading(trainer + "RuntimeError: " + trainer[cut:] + LAUNCHER, coalesce)
    assert relayed == alone
    counts, alone_counts = _kinds(events), _kinds(alone_events)
    for kind in ("Saved", "Oom", "Failure", "Exited", "Milestone"):
        assert counts.get(kind, 0) == alone_counts.get(kind, 0), kind


def test_a_runtime_error_line_the_launcher_does_not_follow_is_read():
    # No "The above exception was the direct cause" after it: the held lines are the log's own.
    text = TRAINER + ERRORS["missing"] + "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    got, events = reading(text)
    assert any("illegal memory access" in getattr(e, "line", "") for e in events)
    assert got[0] == "error"
