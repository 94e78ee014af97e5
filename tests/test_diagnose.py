"""diagnose: phase from context, outcome rules, advice that names real sd-scripts keys, and the CLI."""

from __future__ import annotations

import io
import json
import re

import pytest
from tests.clihelp import invoke as _invoke_cli

from kohya_tuner.logparse import (
    Exited, Failure, Finished, Milestone, Oom, OomFigures, Progress, Saved, TotalSteps, diagnose,
    parse_text,
)
from kohya_tuner.logparse.reader import events_from_stream


OOM_TEXT = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of "
            "11.99 GiB of which 512.00 MiB is free. Including non-PyTorch memory, this process has 11.40 GiB memory in "
            "use. Of the allocated memory 10.20 GiB is allocated by PyTorch, and 700.00 MiB is reserved by PyTorch "
            "but unallocated. See documentation for Memory Management  (https://pytorch.org/docs)\n")
SETUP = ("Loading settings from /cfg.toml...\npreparing accelerator\naccelerator device: cuda:0\n"
         "loading model for process 0/1\n")
TRAINING = ("running training / 学習開始\n  total optimization steps / 学習ステップ数: 100\n"
            "steps:   0%|          | 0/100 [00:00<?, ?it/s]\nepoch 1/1\n")


def steps(*ns: int, total: int = 100) -> str:
    return "".join(f"\rsteps:  {n}%|█         | {n}/{total} [00:10<01:00,  1.50s/it, avr_loss=0.1{n % 10}]"
                   for n in ns) + "\n"


@pytest.mark.parametrize("text,phase", [
    (SETUP + OOM_TEXT, "model_load"),
    (SETUP + "caching latents with caching strategy.\ncaching latents...\n" + OOM_TEXT, "cache_latents"),
    (SETUP + "caching Text Encoder outputs with caching strategy.\n" + OOM_TEXT, "cache_text_encoder"),
    (SETUP + "caching latents...\nimport network module: networks.lora\nprepare optimizer, data loader etc.\n"
     + OOM_TEXT, "model_load"),
    (SETUP + TRAINING + OOM_TEXT, "first_step"),
    (SETUP + TRAINING + steps(1, 2, 3) + OOM_TEXT, "training"),
    (SETUP + TRAINING + steps(1, 2) + "generating sample images at step / サンプル画像生成 ステップ: 2\n"
     "prompt: a cat\n" + OOM_TEXT, "sampling"),
    (SETUP + TRAINING + steps(1, 2) + "generating sample images at step / サンプル画像生成 ステップ: 2\n"
     + steps(2) + OOM_TEXT, "training"),
    (SETUP + TRAINING + steps(1, 2) + "saving checkpoint: /o/x-step00000002.safetensors\n" + steps(2) + OOM_TEXT,
     "training"),
    (SETUP + "generating sample images at step / サンプル画像生成 ステップ: 0\n" + OOM_TEXT, "sampling"),
    (OOM_TEXT, "unknown"),
])
def test_phase_comes_from_what_happened_before_the_failure(text, phase):
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase) == ("oom", phase)


def test_a_gpu_oom_after_a_save_began_is_the_next_steps_unless_the_frames_say_saving():
    saving = SETUP + TRAINING + steps(1, 2) + "saving checkpoint: /o/x-step00000002.safetensors\n"
    assert diagnose(parse_text(saving + OOM_TEXT)).phase == "training"
    save_frames = ("Traceback (most recent call last):\n  File \"/sd/train_network.py\", line 1, in train\n"
                   "    save_model(ckpt_name, accelerator.unwrap_model(network), global_step, epoch)\n")
    assert diagnose(parse_text(saving + save_frames + OOM_TEXT)).phase == "saving"
    # Host RAM is what saving does use.
    host = diagnose(parse_text(saving + "MemoryError\n"))
    assert (host.phase, host.error.kind) == ("saving", "cpu_oom")


def test_the_trainers_own_frames_outrank_milestones_and_generic_frames_do_not():
    tb = ("Traceback (most recent call last):\n  File \"/sd/train_network.py\", line 1913, in <module>\n"
          "    trainer.train(args)\n  File \"/sd/train_network.py\", line 1500, in train\n"
          "    self.sample_images(accelerator, args, None, global_step)\n  File \"/sd/library/train_util.py\", "
          "line 6000, in sample_images\n    image = pipeline(prompt)\n")
    assert diagnose(parse_text(tb + OOM_TEXT)).phase == "sampling"
    assert diagnose(parse_text(SETUP + TRAINING + steps(1, 2) + tb + OOM_TEXT)).phase == "sampling"
    # sample_at_first: sampling before any step, after the model loaded.
    d = diagnose(parse_text(SETUP + tb + OOM_TEXT))
    assert (d.phase, d.details.phase_evidence, d.details.frame) == ("sampling", "frames", "generating sample images")
    # A module's forward says nothing of its own: the milestone before it decides.
    generic = ("Traceback (most recent call last):\n  File \"/x/torch/nn/modules/module.py\", line 1553, in "
               "_wrapped_call_impl\n    return self._call_impl(*args, **kwargs)\n")
    d = diagnose(parse_text(SETUP + "caching latents...\n" + generic + OOM_TEXT))
    assert (d.phase, d.details.phase_evidence) == ("cache_latents", "context")
    assert diagnose(parse_text(generic + OOM_TEXT)).phase == "first_step"  # no context: the frames


def test_steps_count_from_the_resume_point():
    text = (SETUP + "resume training from local state: /o/x-step00000040-state\n" + TRAINING.replace("100", "100")
            + "skipping 40 steps / 40ステップをスキップします\n" + steps(0, 5, total=60) + OOM_TEXT)
    d = diagnose(parse_text(text))
    assert (d.step, d.total_steps, d.phase) == (45, 100, "training")
    assert d.details.resumed_from == "/o/x-step00000040-state"


def test_success_and_incomplete():
    ok = SETUP + TRAINING + steps(100) + "saving checkpoint: /o/x.safetensors\nmodel saved.\n" + steps(100)
    d = diagnose(parse_text(ok), 0)
    assert (d.outcome, d.phase, d.step, d.error, d.oom, d.advice) == ("success", "saving", 100, None, None, [])
    assert d.details.last_checkpoint == "/o/x.safetensors" and d.details.model_saved
    cut = diagnose(parse_text(SETUP + TRAINING + steps(1, 2, 3)))
    assert (cut.outcome, cut.phase, cut.step, cut.total_steps) == ("incomplete", "training", 3, 100)
    assert "step 3 of 100" in cut.advice[0]
    empty = diagnose([])
    assert (empty.outcome, empty.phase, empty.step) == ("incomplete", "unknown", None)
    assert "no training output" in empty.advice[0]


def test_model_saved_then_a_crash_is_still_an_error():
    text = (SETUP + TRAINING + steps(100) + "saving checkpoint: /o/x.safetensors\nmodel saved.\n"
            "Traceback (most recent call last):\n  File \"/usr/bin/accelerate\", line 8, in <module>\n"
            "    sys.exit(main())\n")
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase, d.error.kind) == ("error", "saving", "other")
    assert "model saved." in d.error.message
    assert diagnose(parse_text(SETUP + TRAINING + steps(100) + "model saved.\n"), 1).outcome == "error"


def test_exit_status_137_without_a_traceback_is_host_ram():
    text = SETUP + TRAINING + steps(1, 2)
    for status in (137, -9):
        d = diagnose(parse_text(text), status)
        assert (d.outcome, d.error.kind, d.oom) == ("cpu_oom", "cpu_oom", None)
        assert any("max_data_loader_n_workers" in a for a in d.advice)
    logged = parse_text(SETUP + "subprocess.CalledProcessError: Command '['python']' died with <Signals.SIGKILL: "
                                "9>.\n")
    assert diagnose(logged, 1).error.kind == "cpu_oom"
    plain = diagnose(parse_text(text), 1)
    assert (plain.outcome, plain.error.kind) == ("error", "other")
    assert "status 1" in plain.error.message


def test_ctrl_c_is_incomplete_not_an_error():
    d = diagnose(parse_text(SETUP + TRAINING + steps(1) + "Traceback (most recent call last):\n"
                            "  File \"/sd/train_network.py\", line 1, in x\nKeyboardInterrupt\n"))
    assert (d.outcome, d.error) == ("incomplete", None)


def test_the_root_cause_outranks_its_aftermath():
    # An OOM on one rank makes NCCL fail on the others; the OOM explains the run.
    text = (SETUP + "[rank1]: " + OOM_TEXT + "[rank0]: torch.distributed.DistBackendError: NCCL error in: "
            "ProcessGroupNCCL.cpp:1970, unhandled cuda error\n")
    assert diagnose(parse_text(text)).outcome == "oom"
    chained = ("Traceback (most recent call last):\nModuleNotFoundError: No module named 'xformers'\n\n"
               "During handling of the above exception, another exception occurred:\n\n"
               "Traceback (most recent call last):\nValueError: something else\n")
    assert diagnose(parse_text(chained)).error.kind == "xformers"


def test_a_file_with_several_runs_is_read_as_its_last_run():
    first = SETUP + TRAINING + steps(1, 2) + OOM_TEXT
    second = SETUP + TRAINING + steps(50, 100) + "model saved.\n"
    assert diagnose(parse_text(first + second)).outcome == "success"
    assert diagnose(parse_text(second + first)).outcome == "oom"


def test_nan_loss_spoils_a_finished_run():
    nan = SETUP + TRAINING + "".join(f"\rsteps:  5%|▌  | {i}/100 [00:10<01:00, 1.50s/it, avr_loss=nan]"
                                     for i in (1, 2, 3)) + "\nmodel saved.\n"
    d = diagnose(parse_text(nan), 0)
    assert (d.outcome, d.error.kind, d.last_loss) == ("error", "nan_loss", None)
    json.dumps(d.to_json(), allow_nan=False)


def test_a_hint_before_an_unexplained_crash_names_it():
    text = ("WARNING[XFORMERS]: xFormers can't load C++/CUDA extensions. xFormers was built for PyTorch 2.1.0\n"
            + SETUP + "Traceback (most recent call last):\n  File \"/sd/train_network.py\", line 1, in x\n"
            "RuntimeError: something obscure happened\n")
    assert diagnose(parse_text(text)).error.kind == "xformers"


def test_figures_drive_the_advice():
    frag = OomFigures(tried_gib=0.5, capacity_gib=24.0, free_gib=0.2, process_in_use_gib=23.7, allocated_gib=19.0,
                      reserved_unallocated_gib=4.0)
    events = [Milestone(phase="training", name="running training"), Progress(step=0, total=10),
              Progress(step=7, total=10), Oom(figures=frag)]
    d = diagnose(events)
    assert d.phase == "training" and d.details.fragmented
    assert d.advice[0].startswith("Set the environment variable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert "4.00 GiB was reserved" in d.advice[0]
    crowded = OomFigures(tried_gib=0.1, capacity_gib=24.0, free_gib=0.1, process_in_use_gib=4.5, allocated_gib=4.0,
                         reserved_unallocated_gib=0.01)
    d = diagnose([Milestone(phase="model_load", name="loading model"), Oom(figures=crowded)], family="flux")
    assert d.advice[0].startswith("Free the GPU first") and "19.40 GiB" in d.advice[0]
    assert any("`fp8_base = true`" in a for a in d.advice) and any("`blocks_to_swap" in a for a in d.advice)


def test_json_is_exactly_the_schema():
    d = diagnose(parse_text(SETUP + TRAINING + steps(1, 2) + OOM_TEXT))
    data = d.to_json()
    assert list(data) == ["outcome", "phase", "step", "total_steps", "last_loss", "oom", "error", "family",
                          "wrapper", "advice"]
    assert list(data["oom"]) == ["tried_gib", "capacity_gib", "free_gib", "process_in_use_gib", "allocated_gib",
                                 "reserved_unallocated_gib"]
    err = diagnose(parse_text("MemoryError\n")).to_json()
    assert list(err["error"]) == ["kind", "message"] and err["oom"] is None
    json.dumps(data, allow_nan=False)


# ---- advice names real keys ---------------------------------------------------------------------

_KEY_RE = re.compile(r"`([a-z][a-z0-9_]*)(?: = [^`]*)?`")


def _valid_keys(family: str | None) -> set[str]:
    from kohya_tuner.families import FAMILIES
    from kohya_tuner.schema import raw_schema, script_args

    scripts = [FAMILIES[family].script] if family else [f.script for f in FAMILIES.values()]
    keys: set[str] = set()
    for script in scripts:
        keys |= set(script_args(script))
    keys |= set(raw_schema()["dataset_config"]["keys"])
    return keys


def _all_diagnoses(family):
    fig = OomFigures(tried_gib=1.0, capacity_gib=12.0, free_gib=0.1, process_in_use_gib=11.6, allocated_gib=9.5,
                     reserved_unallocated_gib=1.5)
    contexts = {
        "model_load": [Milestone(phase="model_load", name="loading model")],
        "cache_latents": [Milestone(phase="cache_latents", name="caching latents")],
        "cache_text_encoder": [Milestone(phase="cache_text_encoder", name="caching text encoder outputs")],
        "first_step": [Milestone(phase="training", name="running training"), Progress(step=0, total=9)],
        "training": [Saved(what="state", path="/o/s-state"), Progress(step=4, total=9)],
        "sampling": [Progress(step=4, total=9), Milestone(phase="sampling", name="generating sample images")],
        "saving": [Progress(step=4, total=9), Saved(what="checkpoint", path="/o/x.safetensors")],
        "unknown": [],
    }
    for phase, ctx in contexts.items():
        yield phase, diagnose(ctx + [Oom(figures=fig, where="saving" if phase == "saving" else None)],
                              family=family)
        for kind in ("cpu_oom", "missing_file", "bad_argument", "nan_loss", "xformers", "bitsandbytes",
                     "cuda_error", "cuda_unavailable", "distributed", "dtype", "truncated", "other"):
            msg = "error: unrecognized arguments: --learning-rate 1e-4 /x/config.toml" if kind == "bad_argument" \
                else "x"
            yield phase, diagnose(ctx + [Failure(kind=kind, message=msg)], family=family)
    yield "killed", diagnose([Progress(step=1, total=9)], 137, family=family)
    yield "after save", diagnose([Finished(), Exited(status=None)], family=family)


@pytest.mark.parametrize("family", [None, "sd15", "sdxl", "flux"])
def test_every_key_named_in_advice_exists_in_sd_scripts(family):
    valid = _valid_keys(family)
    named = set()
    for phase, d in _all_diagnoses(family):
        assert d.advice, (phase, d.outcome)
        for line in d.advice:
            for key in _KEY_RE.findall(line):
                named.add(key)
                assert key in valid, f"{key!r} in advice for {family}/{phase}: {line}"
    assert {"gradient_checkpointing", "train_batch_size", "max_bucket_reso", "vae_batch_size",
            "sample_every_n_steps", "max_data_loader_n_workers"} <= named


def test_unrecognised_argument_advice_suggests_the_real_key():
    d = diagnose([Failure(kind="bad_argument", message="train_network.py: error: unrecognized arguments: "
                                                        "--learning-rate 1e-4")])
    assert any("`learning_rate`" in a for a in d.advice)


def test_advice_follows_the_guides_roadmap_per_phase():
    got = {phase: d.advice for phase, d in _all_diagnoses("flux") if d.outcome == "oom"}
    first = {phase: advice[0] for phase, advice in got.items()}
    assert "fp8_base" in first["model_load"]
    assert "vae_batch_size" in first["cache_latents"]
    assert "text_encoder_batch_size" in first["cache_text_encoder"]
    assert "train_batch_size" in first["first_step"]
    assert "PYTORCH_CUDA_ALLOC_CONF" in first["training"] and "max_bucket_reso" in got["training"][1]
    assert "sample_every_n_steps" in first["sampling"]
    assert "RAM" in " ".join(got["saving"])
    assert any("resume = \"/o/s-state\"" in a for a in got["training"])


# ---- reading files --------------------------------------------------------------------------------

class _Recorder(io.BytesIO):
    def __init__(self, data: bytes):
        super().__init__(data)
        self.reads = 0

    def read(self, n=-1):
        self.reads += 1
        return super().read(n)


def test_files_are_read_in_chunks_and_events_come_before_the_end():
    data = (SETUP + TRAINING + steps(*range(1, 100)) * 50 + "model saved.\n").encode()
    fh = _Recorder(data)
    stream = events_from_stream(fh, "utf-8", chunk_size=4096)
    first = next(stream)
    assert isinstance(first, Milestone) and fh.tell() <= 4096
    assert sum(1 for _ in stream) > 1000
    assert fh.reads > len(data) // 4096


def test_multibyte_characters_split_between_reads_survive():
    text = "total optimization steps / 学習ステップ数: 77\n"
    events = list(events_from_stream(io.BytesIO(text.encode()), chunk_size=1))
    assert [e.total for e in events if isinstance(e, TotalSteps)] == [77]


def _write(tmp_path, name, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_cli_diagnose_json(tmp_path):
    log = _write(tmp_path, "train.log", (SETUP + TRAINING + steps(1, 2, 3) + OOM_TEXT).replace("\n", "\r\n").encode())
    res = _invoke_cli(*["diagnose", str(log), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert (data["outcome"], data["phase"], data["step"], data["total_steps"]) == ("oom", "training", 3, 100)
    assert data["oom"]["capacity_gib"] == 11.99


def test_cli_diagnose_renders_for_people(tmp_path):
    log = _write(tmp_path, "train.log", (SETUP + TRAINING + steps(1, 2, 3) + OOM_TEXT).encode())
    res = _invoke_cli(*["diagnose", str(log), "--model", "sdxl"])
    assert res.exit_code == 0, res.output
    assert "Outcome: oom" in res.stdout and "Step:    3 of 100" in res.stdout
    assert "tried to allocate" in res.stdout and "1." in res.stdout


def test_cli_reads_utf16_logs_from_powershell(tmp_path):
    text = SETUP + "MemoryError\n"
    for data in (text.encode("utf-16"), text.encode("utf-16-le")):
        res = _invoke_cli(*["diagnose", str(_write(tmp_path, "ps.log", data)), "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["error"]["kind"] == "cpu_oom"


def test_cli_empty_file_cannot_be_read_as_a_log_exit_2(tmp_path):
    # README: diagnose exits 2 only when the file cannot be read as a log; an empty one cannot.
    for data in (b"", b"\n  \r\n"):
        res = _invoke_cli(*["diagnose", str(_write(tmp_path, "empty.log", data)), "--json"])
        assert res.exit_code == 2
        assert "is empty" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("make", ["missing", "folder", "binary"])
def test_cli_unreadable_input_is_exit_2_with_one_paragraph(tmp_path, make):
    if make == "missing":
        target = tmp_path / "nope.log"
    elif make == "folder":
        target = tmp_path
    else:
        target = _write(tmp_path, "model.safetensors", bytes(range(256)) * 64)
    res = _invoke_cli(*["diagnose", str(target)])
    assert res.exit_code == 2
    assert "Traceback" not in res.output and res.output.count("error:") == 1


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="named pipes are POSIX")
def test_cli_refuses_a_named_pipe_instead_of_waiting_on_it(tmp_path):
    import os

    fifo = tmp_path / "live.log"
    os.mkfifo(fifo)
    res = _invoke_cli(*["diagnose", str(fifo)])  # would block forever if it opened the pipe
    assert res.exit_code == 2 and "named pipe" in res.output and "Traceback" not in res.output
    res = _invoke_cli(*["diagnose", "/dev/null", "--json"])
    assert res.exit_code == 2 and json.loads(res.stdout)["error"]["message"].startswith("/dev/null is a device")


def test_cli_prints_log_text_as_it_is_never_as_markup(tmp_path):
    text = (SETUP + "Traceback (most recent call last):\n  File \"/sd/train_network.py\", line 1, in train\n"
            "    x = load('[bold]ignored[/bold]')\n"
            "RuntimeError: [red]not markup[/red] happened in [bold]x[/bold]\n")
    log = _write(tmp_path, "[red]train[bold].log", text.encode())
    res = _invoke_cli(*["diagnose", str(log)])
    assert res.exit_code == 0, res.output
    assert "[red]not markup[/red] happened in [bold]x[/bold]" in res.stdout
    assert "[red]train[bold].log" in res.stdout
    assert "Error:   other" in res.stdout  # the kind itself styled, not shown as "[bold]other[/bold]"


def test_cli_says_when_the_error_line_is_cut_off(tmp_path):
    text = (SETUP + "caching latents...\nTraceback (most recent call last):\n"
            "  File \"/sd/train_network.py\", line 500, in train\n"
            "    train_dataset_group.new_cache_latents(vae, accelerator)\n")
    res = _invoke_cli(*["diagnose", str(_write(tmp_path, "cut.log", text.encode()))])
    assert res.exit_code == 0, res.output
    assert "Error:   truncated" in res.stdout and "error line is missing" in res.stdout
    assert "not a memory problem" not in res.stdout
    data = json.loads(_invoke_cli(*["diagnose", str(tmp_path / "cut.log"), "--json"]).stdout)
    assert (data["outcome"], data["phase"], data["error"]["kind"]) == ("error", "cache_latents", "truncated")


def test_cli_bad_model_name_is_exit_2(tmp_path):
    res = _invoke_cli(*["diagnose", str(_write(tmp_path, "a.log", b"x\n")), "--model", "sd9"])
    assert res.exit_code == 2 and "Traceback" not in res.output


def test_cli_events_and_exit_code(tmp_path):
    log = _write(tmp_path, "a.log", (SETUP + TRAINING + steps(1)).encode())
    res = _invoke_cli(*["diagnose", str(log), "--events", "--exit-code", "137", "--json"])
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    first = json.loads(lines[0])
    assert first["event"] == "milestone" and first["name"] == "start"
    diagnosis = json.loads("\n".join(lines[[i for i, l in enumerate(lines) if l == "{"][-1]:]))
    assert diagnosis["error"]["kind"] == "cpu_oom"


def test_cli_streams_a_large_log(tmp_path):
    block = (steps(*range(1, 100)) + "                    INFO     epoch is incremented.             "
             "train_util.py:784\n")
    path = tmp_path / "big.log"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(SETUP + TRAINING)
        for _ in range(1500):
            fh.write(block)
        fh.write(OOM_TEXT)
    assert path.stat().st_size > 8_000_000
    res = _invoke_cli(*["diagnose", str(path), "--json"])
    assert res.exit_code == 0
    assert json.loads(res.stdout)["step"] == 99


@pytest.mark.skipif(not hasattr(__import__("os"), "symlink"), reason="needs symbolic links")
@pytest.mark.parametrize("kind", ["dangling", "loop"])
@pytest.mark.parametrize("command", ["diagnose", "check", "estimate"])
def test_a_link_that_leads_to_no_file_is_named_as_such(tmp_path, kind, command):
    import os

    target = tmp_path / "run's log.toml"
    if kind == "dangling":
        os.symlink(tmp_path / "moved-away.toml", target)
    else:
        os.symlink(tmp_path / "other", target)
        os.symlink(target, tmp_path / "other")
    res = _invoke_cli(*[command, str(target)])
    assert res.exit_code == 2, res.output
    assert "a link that leads to no file" in res.output and "does not exist" not in res.output
    assert "Traceback" not in res.output and res.output.count("error:") == 1
