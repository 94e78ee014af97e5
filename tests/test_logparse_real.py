"""Every shared log is a test: 17 logs users posted (with labels.json) and the complete
transcripts of the pinned sd-scripts running on a CPU (with exit codes in .meta)."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from tests.refdata import shared_path
from kohya_tuner.logparse import (
    Exited, Failure, Finished, LogParser, ModelFamily, Oom, Progress, Resumed, Saved, TotalSteps, Wrapper, diagnose,
    is_oom, parse_text,
)
from kohya_tuner.logparse.events import JOB_RECORD

REAL = ["001", "002", "004", "006", "010", "012", "013", "016", "019", "022", "025", "029", "030", "037", "040",
        "041", "043"]
SDS = ["cpu-success", "cpu-success-simple", "cpu-resume", "cpu-oom-injected", "cpu-resume-after-oom"]

# labels.json speaks of phases as "training_step_N"; the diagnose enum calls that "training".
LABEL_PHASE = {"training_step_N": "training", "first_step": "first_step", "model_load": "model_load",
               "saving": "saving", "unknown": "unknown", "sampling": "sampling",
               "cache_latents": "cache_latents", "cache_text_encoder": "cache_text_encoder"}
# labels.json has one kind for every non-memory failure ("other_error"); diagnose names the cause.
# What each of those logs shows, read by hand:
OTHER_ERROR_KIND = {
    "010": "bad_argument",   # train_network.py: error: unrecognized arguments
    "012": "nan_loss",       # avr_loss=nan from epoch 1 on, no exception
    "013": "xformers",       # No module named 'xformers'
    "016": "bitsandbytes",   # no kernel image ... bitsandbytes\csrc\ops.cu
    "019": "other",          # the launcher's traceback after `model saved.`; the error line is cut
    "030": "truncated",      # cut inside init_process_group, after c10d's client-socket warning
    # SimpleTuner's own ERROR record ("[ERROR] (collate_fn) … Some images were not correctly cached")
    # names the failure; the traceback after it is cut before its error line.
    "043": "missing_file",
}
# For the cut-off ones: what the lines before the cut point to.
SUSPECTED = {"030": "distributed"}


def _labels() -> dict:
    return json.loads(shared_path("real-world", "logs", "labels.json").read_text(encoding="utf-8"))


def _read(path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def _meta(name: str) -> dict[str, str]:
    meta = {}
    for line in shared_path("sd-scripts", "logs", f"{name}.log.meta").read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition(":")
        meta[key.strip()] = value.strip()
    return meta


def test_every_shared_log_is_covered():
    on_disk = sorted(p.stem for p in shared_path("real-world", "logs").glob("*.log"))
    assert on_disk == REAL
    assert sorted(_labels()) == [f"{n}.log" for n in REAL]
    sds = sorted(p.name[:-4] for p in shared_path("sd-scripts", "logs").glob("*.log"))
    assert sds == sorted(SDS)


@pytest.mark.parametrize("name", REAL)
def test_real_world_log_matches_its_label(name):
    label = _labels()[f"{name}.log"]
    path = shared_path("real-world", "logs", f"{name}.log")
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == label["sha256"]
    d = diagnose(parse_text(data.decode("utf-8", errors="replace")))

    assert (d.outcome == "oom") == label["is_oom"]
    kind = label["kind"]
    if kind == "cuda_oom":
        assert d.outcome == "oom" and d.error is None and d.oom is not None
    elif kind == "cpu_oom":
        assert d.outcome == "cpu_oom" and d.error.kind == "cpu_oom" and d.oom is None
    elif kind == "other_error":
        assert d.outcome == "error" and d.oom is None
        assert d.error.kind == OTHER_ERROR_KIND[name]
        if name in SUSPECTED:
            assert d.details.suspected == SUSPECTED[name]
            assert not any("not a memory problem" in a for a in d.advice)
    elif kind == "success":
        assert d.outcome == "success" and d.error is None and d.oom is None
    else:  # pragma: no cover - a label kind this table does not know
        pytest.fail(f"unknown label kind {kind}")

    assert d.phase == LABEL_PHASE[label["phase"]]
    if label["step"] is not None:
        assert d.step == label["step"]
    if label["total_steps"] is not None:
        assert d.total_steps == label["total_steps"]
    if label["is_oom"]:
        if label["tried_to_allocate_mib"] is not None:
            assert d.oom.tried_gib * 1024 == pytest.approx(label["tried_to_allocate_mib"], abs=0.1)
        if label["gpu_total_capacity_gib"] is not None:
            assert d.oom.capacity_gib == pytest.approx(label["gpu_total_capacity_gib"], abs=0.01)
    assert bool(d.advice) == (d.outcome != "success"), "every failure gets advice"


@pytest.mark.parametrize("name", REAL)
def test_real_world_log_parses_the_same_in_any_chunking(name):
    text = _read(shared_path("real-world", "logs", f"{name}.log"))
    whole = parse_text(text)
    for size in (1, 3, 64, 1000):
        parser = LogParser()
        events = []
        for i in range(0, len(text), size):
            events.extend(parser.feed(text[i:i + size]))
        events.extend(parser.finish())
        # repr, not ==: a NaN loss is never equal to itself.
        assert list(map(repr, events)) == list(map(repr, whole)), f"chunk size {size}"


def test_real_world_oom_texts_agree_with_is_oom():
    labels = _labels()
    for name in REAL:
        text = _read(shared_path("real-world", "logs", f"{name}.log"))
        oom_lines = [ev for ev in parse_text(text) if isinstance(ev, Oom)]
        assert bool(oom_lines) == labels[f"{name}.log"]["is_oom"], name
        for ev in oom_lines:
            assert is_oom(ev.figures.message), name


def test_real_world_figures_in_full():
    """All six figures where the message has them, in both PyTorch wordings."""
    text = _read(shared_path("real-world", "logs", "040.log"))
    d = diagnose(parse_text(text))
    assert d.oom.model_dump() == {"tried_gib": pytest.approx(80 / 1024, abs=1e-4), "capacity_gib": 23.64,
                                  "free_gib": pytest.approx(80.25 / 1024, abs=1e-4), "process_in_use_gib": 4.53,
                                  "allocated_gib": 4.0,
                                  "reserved_unallocated_gib": pytest.approx(14.5 / 1024, abs=1e-4)}
    assert d.details.other_processes == ((17653, 19.03),)
    assert any("17653" in a and "19.03 GiB" in a for a in d.advice)

    legacy = diagnose(parse_text(_read(shared_path("real-world", "logs", "004.log"))))
    assert legacy.oom.allocated_gib == 10.92
    assert legacy.oom.free_gib == pytest.approx(56.25 / 1024, abs=1e-4)
    assert legacy.oom.reserved_unallocated_gib == pytest.approx(0.05, abs=1e-4)
    assert legacy.oom.process_in_use_gib is None


def test_model_saved_then_crash_is_an_error_that_says_so():
    d = diagnose(parse_text(_read(shared_path("real-world", "logs", "019.log"))))
    assert d.outcome == "error" and d.phase == "saving"
    assert "model saved." in d.error.message
    assert d.details.model_saved and d.details.last_checkpoint == "/home/1.safetensors"
    assert any("usable" in a for a in d.advice)


@pytest.mark.parametrize("name", SDS)
def test_sd_scripts_transcript(name):
    meta = _meta(name)
    code = int(meta["exit_code"])
    text = _read(shared_path("sd-scripts", "logs", f"{name}.log"))
    events = parse_text(text)
    d = diagnose(events, code)
    progress = [e for e in events if isinstance(e, Progress)]
    assert progress and all(p.total in (3, 6, 12) for p in progress)
    assert any(isinstance(e, TotalSteps) for e in events)
    if code == 0:
        assert d.outcome == "success" and d.phase == "saving"
        assert isinstance([e for e in events if not isinstance(e, Progress)][-1], Finished)
        assert d.step == d.total_steps
    else:
        assert d.outcome == "oom"
    # The same diagnosis without the exit code: the log alone says it.
    assert diagnose(events).outcome == d.outcome


def test_injected_oom_transcript_in_detail():
    events = parse_text(_read(shared_path("sd-scripts", "logs", "cpu-oom-injected.log")))
    d = diagnose(events, 1)
    assert (d.outcome, d.phase, d.step, d.total_steps, d.last_loss) == ("oom", "training", 3, 6, 1.15)
    assert d.oom.model_dump() == {"tried_gib": 2.0, "capacity_gib": 7.75, "free_gib": 1.12,
                                  "process_in_use_gib": 6.62, "allocated_gib": 5.91,
                                  "reserved_unallocated_gib": pytest.approx(498.27 / 1024, abs=1e-4)}
    oom = next(e for e in events if isinstance(e, Oom))
    assert oom.where == "training"  # accelerator.backward(loss) in the frames
    assert [e.status for e in events if isinstance(e, Exited)] == [1]
    assert [(e.what, e.path) for e in events if isinstance(e, Saved)] == [
        ("checkpoint", "/data/runs/out-oom/cpu_lora-step00000003.safetensors"),
        ("state", "/data/runs/out-oom/cpu_lora-step00000003-state"),
    ]
    assert d.details.last_state == "/data/runs/out-oom/cpu_lora-step00000003-state"
    assert not any(isinstance(e, Failure) for e in events)


def test_resume_after_oom_transcript():
    events = parse_text(_read(shared_path("sd-scripts", "logs", "cpu-resume-after-oom.log")))
    resumed = [e for e in events if isinstance(e, Resumed)]
    assert [(r.path, r.skipped) for r in resumed] == [("/data/runs/out-oom/cpu_lora-step00000003-state", None),
                                                      (None, 3)]
    bar = [e for e in events if isinstance(e, Progress)]
    assert bar[0].total == 3 and bar[-1].step == 3  # the bar counts from the resume point
    d = diagnose(events, 0)
    assert (d.step, d.total_steps) == (6, 6)  # absolute: 3 skipped + 3 run
    assert d.details.resumed_from == "/data/runs/out-oom/cpu_lora-step00000003-state"


def _layout() -> dict[str, set[str]]:
    text = shared_path("sd-scripts", "artifacts", "output-dir-layout.txt").read_text(encoding="utf-8")
    roots: dict[str, set[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            roots[current] = set()
        elif current and re.match(r"\s*\d+\s+\S", line):
            rel = line.split(None, 1)[1].strip()
            roots[current].add(current.rsplit("/", 1)[0] + "/" + rel)
    return roots


@pytest.mark.parametrize("name", ["cpu-success", "cpu-resume", "cpu-oom-injected", "cpu-resume-after-oom"])
def test_saved_paths_rejoined_from_wrapped_records_exist(name):
    """Rich folds long paths mid-word at 80 columns; every path the parser rebuilds must be a
    file or state folder the run really left behind."""
    files = set().union(*_layout().values())
    events = parse_text(_read(shared_path("sd-scripts", "logs", f"{name}.log")))
    saved = [e for e in events if isinstance(e, Saved)]
    assert saved
    for ev in saved:
        if ev.what == "checkpoint":
            assert ev.path in files, ev.path
        else:
            assert f"{ev.path}/train_state.json" in files, ev.path
    for ev in events:
        if isinstance(ev, Resumed) and ev.path:
            assert f"{ev.path}/train_state.json" in files


def test_simple_and_rich_transcripts_give_the_same_story():
    rich = parse_text(_read(shared_path("sd-scripts", "logs", "cpu-success.log")))
    simple = parse_text(_read(shared_path("sd-scripts", "logs", "cpu-success-simple.log")))

    def story(events):
        # Rich's source-file column names the scripts too; the simple format has no such column, so
        # the first record no rule reads (JOB_RECORD, a marker and no step of the story) differs.
        return [(type(e).__name__, getattr(e, "name", None), getattr(e, "what", None)) for e in events
                if not isinstance(e, (Progress, ModelFamily, Wrapper)) and getattr(e, "name", None) != JOB_RECORD]

    def paths(events):
        return [e.path.replace("/out-simple/", "/out/") for e in events if isinstance(e, Saved)]

    assert story(rich) == story(simple)
    assert paths(rich) == paths(simple)
