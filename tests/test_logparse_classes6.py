"""Classes of input a sixth round of pastes showed: a training script failing before it did
anything (in its imports, its own first lines, or not found by the interpreter), a save building
its pipeline after steps were counted, frames calling a function named for saving, an autograd
Function's `apply` in a forward, and a launcher's traceback after torch elastic's record of a
killed worker. Every line is built from the printing library's or trainer's format, never copied
from a labelled log; the negatives are lines that look alike and must not be read so."""

from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from tests.logparse_texts import HEAD, frame as _frame, phase as _phase

LOADING = "loading model\n"


# ---- a training script failing before it did anything: start-up --------------------------------

_DLL = (HEAD + _frame(r"C:\ot\scripts\train_ui.py", 5, "<module>", "from modules.ui.TrainUI import TrainUI")
        + _frame(r"C:\ot\modules\util\enum\DataType.py", 3, "<module>", "import torch")
        + _frame(r"C:\ot\venv\Lib\site-packages\torch\__init__.py", 270, "<module>", "_load_dll_libraries()")
        + _frame(r"C:\ot\venv\Lib\site-packages\torch\__init__.py", 250, "_load_dll_libraries", "raise err")
        + 'OSError: [WinError 126] The specified module could not be found. Error loading "c10.dll" or one '
          "of its dependencies.\n")
_NO_TORCH = (HEAD + _frame("/home/u/sd-scripts/sdxl_train_network.py", 3, "<module>", "import torch")
             + "ModuleNotFoundError: No module named 'torch'\n")
_IN_MAIN = (HEAD + _frame("/work/diffusers/examples/dreambooth/train_dreambooth_lora.py", 1200, "<module>", "main(args)")
            + _frame("/work/diffusers/examples/dreambooth/train_dreambooth_lora.py", 640, "main",
                     "import bitsandbytes as bnb")
            + "ImportError: libcudart.so.11.0: cannot open shared object file: No such file or directory\n")
_TOP_LEVEL = (HEAD + _frame("/srv/trainer/run_lora_training.py", 16, "<module>")
              + "NameError: name 'log_level' is not defined\n")
_CHAINED = (HEAD + _frame("/content/train_text_to_image.py", 500, "main", "import bitsandbytes as bnb")
            + "ModuleNotFoundError: No module named 'bitsandbytes'\n\n"
            + "During handling of the above exception, another exception occurred:\n\n" + HEAD
            + _frame("/content/train_text_to_image.py", 900, "<module>", "main()")
            + '  File "/content/train_text_to_image.py", line 50')


@pytest.mark.parametrize("text", [_DLL, _NO_TORCH, _IN_MAIN, _TOP_LEVEL, _CHAINED],
                         ids=["dll", "no-torch", "import-in-main", "top-level", "chained-cut"])
def test_a_training_script_failing_in_its_imports_or_first_lines_is_start_up(text):
    assert _phase(text) == "model_load"
    assert _phase("Starting UI...\n" + text) == "model_load"


def test_a_relayed_training_script_failing_at_import_is_start_up():
    relay = "[LoraNode] TRAINER: "
    text = "".join(relay + line + "\n" for line in _NO_TORCH.splitlines())
    assert _phase(text) == "model_load"


@pytest.mark.parametrize("python", ["python", "python3.10", r"C:\Python310\python.exe", "/usr/bin/python3"])
def test_the_interpreter_not_finding_the_training_script_is_start_up(python):
    line = f"{python}: can't open file '/opt/kohya/sd-scripts/train_network.py': [Errno 2] No such file or directory\n"
    launcher = HEAD + _frame("/usr/bin/accelerate", 8, "<module>", "sys.exit(main())")
    d = diagnose(parse_text(line + launcher))
    assert (d.outcome, d.phase) == ("error", "model_load")


def test_the_interpreter_not_finding_another_script_says_no_phase():
    line = "python: can't open file '/srv/app/webui.py': [Errno 2] No such file or directory\n"
    assert _phase(line) != "model_load"


_APP = (HEAD + _frame(r"D:\gym\app.py", 17, "<module>", "import train_network")
        + "ModuleNotFoundError: No module named 'train_network'\n")
_SPAWNED = (HEAD + _frame("<string>", 1, "<module>")
            + _frame(r"C:\Python310\lib\multiprocessing\spawn.py", 116, "spawn_main", "exitcode = _main(fd, parent_sentinel)")
            + _frame(r"C:\Python310\lib\multiprocessing\spawn.py", 236, "prepare",
                     "_fixup_main_from_path(data['init_main_from_path'])")
            + _frame(r"C:\Python310\lib\multiprocessing\spawn.py", 287, "_fixup_main_from_path",
                     "main_content = runpy.run_path(main_path,")
            + _frame(r"C:\kohya\train_network.py", 8, "<module>", "import torch")
            + "ImportError: DLL load failed while importing _C: The paging file is too small\n")
_IMPORT_IN_A_STEP = (HEAD + _frame("/x/train_network.py", 1000, "<module>", "trainer.train(args)")
                     + _frame("/x/train_network.py", 800, "train", "self.sample(accelerator)")
                     + _frame("/x/library/util.py", 40, "helper", "import wandb")
                     + "ModuleNotFoundError: No module named 'wandb'\n")
_ERROR_BELOW_TOP_LEVEL = (HEAD + _frame("/x/train_network.py", 900, "<module>", "main()")
                          + _frame("/x/train_network.py", 880, "main", "cfg = read_config(path)")
                          + _frame("/x/library/config.py", 12, "read_config", "raise ValueError(path)")
                          + "ValueError: /x/cfg.toml\n")


@pytest.mark.parametrize("text", [_APP, _SPAWNED, _IMPORT_IN_A_STEP, _ERROR_BELOW_TOP_LEVEL],
                         ids=["gui-app", "spawned-child", "import-under-a-call", "error-below-main"])
def test_failures_that_are_not_a_training_script_starting_are_not_start_up(text):
    assert _phase(text) != "model_load"


# ---- a save building its pipeline after steps were counted -------------------------------------

_PIPELINE = (HEAD + _frame("/c/train_dreambooth.py", 788, "<module>", "main()")
             + _frame("/c/train_dreambooth.py", 734, "main", "text_encoder=accelerator.unwrap_model(text_encoder),")
             + _frame("/usr/lib/diffusers/pipeline_utils.py", 660, "from_pretrained", "raise ValueError(")
             + "ValueError: Pipeline expected {'unet', 'vae'}, but only {'unet'} were passed.\n")
_BAR = "steps:  33%|███▎      | 999/3000 [16:27<32:42,  1.02it/s, loss=0.02]"


@pytest.mark.parametrize("save", [
    _BAR + " SAVING CHECKPOINT: /out/run_step_1000.ckpt\n",
    _BAR + "\nSaving checkpoint: /out/run_step_1000.ckpt\n",
    _BAR + "\nsaving model to /out/run_step_1000\n",
    "Progress:|████████        | 33% 999/3000 [16:27<32:42,  1.02it/s, loss=0.02] SAVING CHECKPOINT: /o/a.ckpt\n",
], ids=["on-the-bar", "own-line", "phase-word", "bar-before-percentage"])
def test_model_loading_after_steps_and_a_save_is_the_save(save):
    d = diagnose(parse_text(save + _PIPELINE))
    assert (d.phase, d.step, d.total_steps) == ("saving", 999, 3000)


def test_model_loading_before_any_step_stays_model_loading():
    assert _phase("Saving checkpoint: /out/base.ckpt\n" + _PIPELINE) == "model_load"


def test_model_loading_after_steps_without_a_save_is_not_the_save():
    assert _phase(_BAR + "\n" + _PIPELINE) != "saving"


def test_a_bar_drawn_before_its_percentage_counts_its_steps():
    d = diagnose(parse_text("Progress:|███▏      | 31% 313/1000 [05:00<11:00,  1.04it/s, loss=0.1]\n"))
    assert (d.step, d.total_steps) == (313, 1000)
    # Without the times it is a table row, not a bar.
    assert diagnose(parse_text("Progress:| x | 31% 313/1000 [ok]\n")).step is None


# ---- frames calling a function named for saving ------------------------------------------------

_TRAIN = _frame("/opt/lora/cli_lora_pti.py", 1012, "train", "perform_tuning(")


@pytest.mark.parametrize("frames", [
    _frame("/opt/lora/cli_lora_pti.py", 685, "perform_tuning", "save_all(")
    + _frame("/opt/lora/lora.py", 1110, "save_all", "save_safeloras_with_embeds(loras, embeds, path)")
    + '  File "/opt/conda',
    _frame("/opt/lora/cli_lora_pti.py", 700, "perform_tuning", "save_safeloras(modelmap, path)") + '  File "/opt/x',
    _frame("/opt/lora/lora.py", 1110, "save_all"),
], ids=["save_all-safeloras", "save_safeloras", "in-save_all"])
def test_frames_calling_a_save_function_are_saving(frames):
    assert _phase("Current embedding: 0.1\n" + HEAD + _TRAIN + frames) == "saving"


@pytest.mark.parametrize("source", ["ctx.save_for_backward(q, k, v)", "with torch.autograd.graph.save_on_cpu():"])
def test_autograd_saving_tensors_is_not_saving(source):
    text = HEAD + _frame("/opt/model/attention.py", 40, "attn", source) + '  File "/opt/x'
    assert _phase(text) != "saving"


# ---- an autograd Function's apply is a forward call ---------------------------------------------

_APPLY = _frame("/venv/torch/autograd/function.py", 506, "apply", "return super().apply(*args, **kwargs)")


def test_an_attention_forward_through_a_function_apply_gives_no_phase():
    text = (_frame("/k/library/train_util.py", 1790, "forward_xformers", "out = xops.memory_efficient_attention(q, k, v)")
            + _frame("/venv/xformers/ops/fmha/__init__.py", 299, "_memory_efficient_attention", "return _fMHA.apply(")
            + _APPLY.rstrip("\n").rsplit("\n", 1)[0][:60])
    assert _phase(HEAD + text) == "unknown"


@pytest.mark.parametrize("frames", [
    _frame("/venv/torch/_tensor.py", 487, "backward", "torch.autograd.backward(") + _frame(
        "/venv/torch/autograd/__init__.py", 200, "backward", "_engine_run_backward(") + _APPLY,
    _frame("/venv/torch/utils/checkpoint.py", 249, "checkpoint", "return CheckpointFunction.apply(function, *args)")
    + _APPLY,
], ids=["engine-then-apply", "checkpoint-apply"])
def test_the_backward_engine_and_gradient_checkpointing_still_say_the_step(frames):
    assert _phase(LOADING + HEAD + frames + "RuntimeError: boom\n") == "first_step"


# ---- a launcher's traceback after torch elastic's record of a killed worker ----------------------

_ELASTIC = ("E0101 10:00:00.000000 1 torch/distributed/elastic/multiprocessing/api.py:833] failed (exitcode: -9) "
            "local_rank: 0 (pid: 42) of binary: /venv/bin/python3\n")
_LAUNCH = (HEAD + _frame("/venv/bin/accelerate", 8, "<module>", "sys.exit(main())")
           + _frame("/venv/accelerate/commands/accelerate_cli.py", 46, "main", "args.func(args)")
           + _frame("/venv/accelerate/commands/launch.py", 1067, "launch_command", "deepspeed_launcher(args)")
           + _frame("/venv/accelerate/commands/launch.py", 771, "deepspeed_launcher", "distrib_run.run(args)")
           + _frame("/venv/torch/distributed/run.py", 892, "run", "elastic_launch(")
           + _frame("/venv/torch/distributed/launcher/api.py", 133, "__call__",
                    "return launch_agent(self._config, self._entrypoint, list(args))"))


@pytest.mark.parametrize("cut", ['  File "/venv/lib/python3.12/site-package', "", '  File "/venv/torch/distributed/l'],
                         ids=["cut-in-a-path", "cut-after-a-frame", "cut-in-the-launcher's-path"])
def test_a_killed_worker_then_the_launchers_cut_traceback_is_the_kill(cut):
    d = diagnose(parse_text(LOADING + _ELASTIC + _LAUNCH + cut))
    assert (d.outcome, d.error.kind) == ("cpu_oom", "cpu_oom")


def test_a_cut_traceback_reaching_the_trainer_after_the_launcher_is_not_the_launchers():
    tb = _LAUNCH + _frame("/x/train_network.py", 900, "train", "loss.backward()") + '  File "/venv/lib/x'
    assert diagnose(parse_text(LOADING + tb)).error.kind == "truncated"
