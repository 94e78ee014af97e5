"""Classes of input a third round of pastes showed: a model loader's own frames under per-rank
prefixes, a spawned child re-importing the training script, a bar with its description cut or
missing and an error run onto its end before a training step's traceback, a trainer's "starting
at step N/M" line, a launcher's record of a worker's return code, a quoted Rich traceback box with
folded rows, and a warning from another family's module. Every line is built from the printing
library's or trainer's format, never copied from a labelled log; the negatives are lines that look
alike and must not be read so."""

from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from kohya_tuner.logparse import frames as F
from kohya_tuner.logparse.events import Exited, Failure, Progress
from tests.logparse_texts import HEAD, OOM, frame as _frame


def _ranked(text: str, rank: int = 3) -> str:
    return "".join(f"[rank{rank}]: {line}\n" for line in text.splitlines())


# ---- a model loader's frames, under rank prefixes --------------------------------------------------

@pytest.mark.parametrize("frames", [
    # A pipeline's loader calling a library's loader, cut inside a tensor read.
    _frame("/env/site-packages/pkg/pipeline.py", 293, "download_and_load_models", "pool.auto_load_model(")
    + _frame("/env/site-packages/pkg/loader.py", 70, "auto_load_model", "m = self.load_model_file(cfg, path)")
    + _frame("/env/site-packages/pkg/disk.py", 62, "__getitem__", "return self.handle.get_tensor(name)"),
    # The loader as the frame's function only, the source line generic.
    _frame("/work/trainer/models.py", 40, "load_model", "sd = remap_keys(sd)")
    + _frame("/work/trainer/keys.py", 4, "remap_keys", "v = sd[k]"),
    # A family's loader called from the trainer's set-up.
    _frame("/work/trainer/setup.py", 12, "setup", "base = load_base_model(args.path, dtype)")
    + _frame("/work/trainer/te.py", 88, "build", "x = y"),
    # safetensors' lazy read alone.
    _frame("/work/trainer/util.py", 9, "read", "t = f.get_tensor(key)"),
])
def test_a_model_loaders_frames_under_rank_prefixes_are_model_loading(frames):
    d = diagnose(parse_text(_ranked(HEAD + frames) + "[rank3]: torch.Out"))
    assert (d.phase, d.error.kind) == ("model_load", "truncated")
    # The header cut as well: the frames alone.
    assert diagnose(parse_text(_ranked(frames))).phase == "model_load"
    # Frames that only move loaded models, or unload or reload them, are no model loader.
    for line in ("comfy.model_management.load_models_gpu([model])", "self.reload_model(path)",
                 "unload_model(pipe)", 'File "/x/hooks.py", line 3, in load_model_hook',
                 'File "/x/load_model.py", line 3, in <module>'):
        assert F.frame_evidence([line]) is None, line


# ---- a spawned child re-importing the training script ----------------------------------------------

def _spawn(root: str, sep: str, fixup: str, script_frames: str) -> str:
    mp = f"{root}{sep}lib{sep}multiprocessing{sep}spawn.py"
    rp = f"{root}{sep}lib{sep}runpy.py"
    main = "_fixup_main_from_path(data['init_main_from_path'])" if fixup == "path" else \
        "_fixup_main_from_name(data['init_main_from_name'])"
    run = "main_content = runpy.run_path(main_path," if fixup == "path" else \
        "main_content = runpy.run_module(mod_name,"
    return (HEAD + '  File "<string>", line 1, in <module>\n'
            + _frame(mp, 116, "spawn_main", "exitcode = _main(fd, parent_sentinel)")
            + _frame(mp, 125, "_main", "prepare(preparation_data)")
            + _frame(mp, 236, "prepare", main)
            + _frame(mp, 287, f"_fixup_main_from_{fixup}", run)
            + _frame(rp, 289, "run_path", "return _run_module_code(code, init_globals, run_name,")
            + _frame(rp, 86, "_run_code", "exec(code, run_globals)")
            + script_frames)


@pytest.mark.parametrize("child", [
    _spawn(r"C:\Python310", "\\", "path", _frame(r"D:\kohya\train_network.py", 8, "<module>", "import torch")),
    _spawn("/usr/lib/python3.11", "/", "path",
           _frame("/work/train.py", 20, "<module>", "model = load_model(args.path)")
           + _frame("/work/util.py", 5, "load_model", "return torch.load(path).to(device)")),
    _spawn("/usr/lib/python3.11", "/", "name",
           _frame("/work/trainer/__main__.py", 3, "<module>", "from trainer.loop import train")
           + _frame("/work/trainer/loop.py", 1, "<module>", "loss.backward()")),
])
def test_a_spawned_childs_reimport_says_no_phase(child):
    assert diagnose(parse_text(child)).phase == "unknown"
    # What the parent printed before still says where the run was.
    bar = "steps:   0%|          | 0/5 [00:00<?, ?it/s]\n"
    assert diagnose(parse_text(bar + child)).phase == "first_step"
    # A worker that got past the import and failed fetching a batch is the data loader's.
    worker = ['File "/usr/lib/python3.11/multiprocessing/spawn.py", line 125, in _main',
              'File "/env/torch/utils/data/_utils/worker.py", line 308, in _worker_loop',
              "data = fetcher.fetch(index)"]
    assert F.frame_evidence(worker).phase == F.STEP


# ---- a bar with no description, an error run onto its end, then a training step's traceback ------

_NOISY_FRAMES = [
    _frame("/work/trainer/train.py", 1818, "main", "noisy_latents = ("),
    _frame("/work/sd-scripts/flux_train_network.py", 400, "get_noise_pred_and_target",
           "noisy_model_input, timesteps, sigmas = flux_train_utils.get_noisy_model_input_and_timesteps(")
    .replace("get_noise_pred_and_target", "prepare_step"),
    _frame("/work/toolkit/train.py", 900, "hook", "noisy_latents = self.sd.add_noise(latents, noise, timesteps)"),
    _frame("/work/scripts/train_lora.py", 1100, "main",
           "noisy_model_input = noise_scheduler.add_noise(model_input, noise, timesteps)"),
]


@pytest.mark.parametrize("bar, step, total", [
    # The paste cut the bar's start: only its counts and times are left.
    ("| 0/30000 [00:02<?, ?it/s]", 0, 30000),
    # Cut inside the bar itself.
    ("█▌        | 17/400 [00:30<11:20,  1.80s/it]", 17, 400),
    # A bar drawn with no description.
    ("  0%|          | 0/500 [00:00<?, ?it/s]", 0, 500),
])
@pytest.mark.parametrize("noisy", _NOISY_FRAMES)
@pytest.mark.parametrize("run_on", ["The size of tensor a (10) must match the size of tensor b (16)\n", ""])
def test_a_bar_before_a_training_steps_traceback_is_the_training_bar(bar, step, total, noisy, run_on):
    text = bar + run_on + HEAD + noisy + "RuntimeError: The size of tensor a (10) must match\n"
    d = diagnose(parse_text(text))
    assert (d.phase, d.step, d.total_steps) == ("first_step" if step == 0 else "training", step, total)
    # The bar is not the training bar when the failure is elsewhere, or comes later.
    sampling = _frame("/env/diffusers/pipelines/flux/pipeline_flux.py", 700, "__call__", "x = self.vae.decode(z)")
    assert diagnose(parse_text(bar + run_on + HEAD + sampling + OOM)).step is None
    later = bar + "\nsome line\nanother line\nand another\n" + HEAD + noisy + "RuntimeError: x\n"
    assert diagnose(parse_text(later)).step is None
    # A table row with counts is no bar; an inference pipeline noising its input is no training step.
    assert not [e for e in parse_text("| 3/4 [done] | ok |\n") if isinstance(e, Progress)]
    assert F.frame_evidence(["latents = self.scheduler.add_noise(init_latents, noise, timestep)"]) is None


# ---- a trainer's "starting at step N/M" ---------------------------------------------------------------

@pytest.mark.parametrize("line, done, total", [
    ("STARTING AT STEP: 1/40000", 0, 40000),
    ("Starting at step 301/1000", 300, 1000),
    ("Starting from step 11/200", 10, 200),
    ("start training step (5/50)", 4, 50),
])
def test_a_starting_step_line_counts_the_steps_before_it(line, done, total):
    d = diagnose(parse_text(line + "\n" + OOM))
    assert (d.phase, d.step, d.total_steps) == ("first_step" if done == 0 else "training", done, total)
    # A bar with no description and the same total that follows is the training bar.
    bar = f"  2%|▏         | {done + 8}/{total} [00:10<08:00,  1.20s/it]\n"
    assert diagnose(parse_text(line + "\n" + bar + OOM)).step == done + 8
    for other in ("Starting at step 5 of 100", "restarting step 3/4", "Starting at step: loading model"):
        assert not [e for e in parse_text(other + "\n") if isinstance(e, Progress)], other


# ---- a launcher's record of a worker's return code -------------------------------------------------

@pytest.mark.parametrize("line, status", [
    ("[2025-03-14 23:55:27,166] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python', '-u', 'train.py', "
     "'--local_rank=1', '--deepspeed'] exits with return code = 1", 1),
    ("[launch.py:325:sigkill_handler] ['python', 'train.py'] exits with return code = 2", 2),
    ("worker-0: [launch.py:315:sigkill_handler] Main process exited with return code: 3", 3),
    ("Process 4411 exited with return code 1", 1),
])
def test_a_workers_return_code_is_the_launchers_exit(line, status):
    events = parse_text(line + "\n")
    assert [e.status for e in events if isinstance(e, Exited)] == [status]
    d = diagnose(events)
    assert (d.outcome, d.error.kind) == ("error", "other")
    for other in ("[launch.py:325:sigkill_handler] ['python', 'train.py'] exits with return code = 0",
                  "check the return code when the job exits"):
        assert diagnose(parse_text(other + "\n")).outcome == "incomplete", other


# ---- a quoted Rich traceback box with folded rows --------------------------------------------------

_BOX_ROWS = [
    "│ py:45 in main                                          │",
    "│                                                        │",
    "│   44 │   # Run                                        │",
    "│ ❱ 45 │   args.func(args)                              │",
    "│   46                                                   │",
    "│                                                        │",
    "│ C:\\Python310\\lib\\site-packages\\accelerate\\commands\\launch.py:1104 │",
    "│ in launch_command",
]


@pytest.mark.parametrize("quote", [
    lambda r: "> " + r,  # markdown's quote
    lambda r: ">" + r,  # without the space
    lambda r: ">" if not r.strip("│ ") else "> " + r,  # blank rows quoted as a bare ">"
    lambda r: r,  # unquoted
])
def test_a_quoted_rich_box_with_folded_rows_is_a_traceback(quote):
    text = "".join(quote(r) + "\n" for r in _BOX_ROWS)
    failures = [e for e in parse_text(text) if isinstance(e, Failure)]
    assert [f.kind for f in failures] == ["truncated"]
    assert "launch.py:1104" in failures[0].message
    # Quoted prose is no traceback.
    assert diagnose(parse_text("> the run stopped at step 3\n>\n> then nothing\n")).outcome == "incomplete"


# ---- a warning from another family's module ---------------------------------------------------------

@pytest.mark.parametrize("lines, family", [
    # A multi-family trainer imports every family's pipeline module: the warning names one.
    (["/opt/trainer/helpers/models/sd3/pipeline.py:74: FutureWarning: `torch.cuda.amp.autocast(args...)` is "
      "deprecated.", "--flux_lora_target=all+ffs", "--output_dir=output"], "flux"),
    (["Loading flux model from /models/flux1-dev.safetensors",
      "/opt/trainer/models/sdxl/unet.py:12: DeprecationWarning: the old scheduler API is deprecated"], "flux"),
    (["model_family=flux", "/opt/t/helpers/models/sd3/model.py:9: UserWarning: xformers is not available"], "flux"),
])
def test_a_warnings_module_is_weaker_than_the_runs_own_evidence(lines, family):
    assert diagnose(parse_text("\n".join(lines) + "\n")).family == family
    # Alone, the warning still names its family.
    assert diagnose(parse_text(lines[0 if "Warning" in lines[0] else 1] + "\n")).family in ("sd3", "sdxl")
    # A bare flag naming FLUX in another word is no evidence.
    assert diagnose(parse_text("--influx_host=db\n--use_flux_like_sampler\n")).family is None
