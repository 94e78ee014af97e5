"""Classes behind batches 27 and 28's first-read misses: a trainer's function that gets the model's
prediction and its target is the step, even where it encodes its batch with the VAE; `Saving
checkpoint at step N.` is a save; a cache job's text-embed function is text-encoder caching; PyTorch's
meta-tensor message is a model moved to its device as it loads; ComfyUI's older `Error occurred when
executing <node>:` names the node, and its `!!! Exception during processing !!!` is read without its
spaces; accelerate failing in its own argument and config checks is the launcher starting the job;
the DreamBooth extension announcing the class images it will generate is a sampling pass; a Python
warning run on after other text starts a line of its own. Several forms of each, and text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from tests.logparse_texts import CACHING, HEAD, OOM, frame, phase

_VAE = frame("/venv/lib/python3.10/site-packages/diffusers/models/vae.py", 566, "encode", "h = self.encoder(x)")


@pytest.mark.parametrize("func", ["get_model_prediction_and_target", "get_noise_pred_and_target",
                                  "get_model_pred_and_target"])
def test_the_steps_prediction_and_target_is_the_step(func):
    text = (HEAD + frame("/x/EveryDream2trainer/train.py", 854, "main", f"model_pred, target = {func}(batch)")
            + frame("/x/EveryDream2trainer/train.py", 779, func, "latents = vae.encode(pixel_values)") + _VAE + OOM)
    assert phase(text) == "first_step"


def test_a_vae_encode_alone_is_still_caching():
    text = HEAD + frame("/x/trainer/cache.py", 40, "encode_all", "latents = vae.encode(pixel_values)") + _VAE + OOM
    assert phase(text) == "cache_latents"


@pytest.mark.parametrize("line", ["Saving checkpoint at step 500.", "Saving checkpoint at epoch 3",
                                  "saving checkpoint after step 20"])
def test_saving_a_checkpoint_at_a_step(line):
    assert phase(line + "\n" + "AttributeError: 'Config' object has no attribute 'seed'\n") == "saving"


def test_sd_scripts_saving_checkpoint_line_still_names_its_file():
    events = parse_text("saving checkpoint: /out/x-step00000010.safetensors\n")
    assert [type(e).__name__ for e in events] == ["Saved"]


@pytest.mark.parametrize("func", ["_execute_text_embed_cache", "run_text_embeds_cache", "text_embed_cache_job"])
def test_a_text_embed_cache_jobs_function_is_text_encoder_caching(func):
    text = (HEAD + frame("/app/simpletuner/helpers/cache_job_service.py", 327, func, "model.load_text_encoder()")
            + frame("/venv/lib/python3.12/site-packages/transformers/modeling_utils.py", 3000, "from_pretrained")
            + "AttributeError: 'Stub' object has no attribute 'local_process_index'\n")
    assert phase(text) == "cache_text_encoder"


@pytest.mark.parametrize("message", [
    "NotImplementedError: Cannot copy out of meta tensor; no data!",
    "RuntimeError: Cannot copy out of meta tensor; no data! Please use torch.nn.Module.to_empty() instead of "
    "torch.nn.Module.to() when moving module from meta to a different device.",
])
def test_pytorchs_meta_tensor_message_is_a_model_loading(message):
    assert phase(message + "\n") == "model_load"
    assert phase("!!! Exception during processing!!! " + message.split(": ", 1)[1] + "\n") == "model_load"


@pytest.mark.parametrize("node,want", [("InitFluxLoRATraining", "model_load"), ("FluxTrainLoop", "first_step")])
def test_comfyuis_older_report_names_the_node(node, want):
    text = (f"Error occurred when executing {node}:\n\nsomething went wrong\n\n"
            + frame("/ComfyUI/execution.py", 316, "execute", "output_data = get_output_data(obj)"))
    assert phase(text) == want


def test_a_node_no_rule_knows_says_nothing():
    text = "Error occurred when executing SaveImage:\n\nsomething went wrong\n"
    assert phase(text) == "unknown"


_LAUNCHER = (HEAD + frame("C:\\venv\\lib\\site-packages\\accelerate\\commands\\launch.py", 985, "main",
                          "launch_command(args)")
             + frame("C:\\venv\\lib\\site-packages\\accelerate\\commands\\launch.py", 957, "launch_command",
                     "args, defaults, mp_from_config_flag = _validate_launch_command(args)"))


def test_accelerate_failing_in_its_own_checks_is_start_up():
    d = diagnose(parse_text(_LAUNCHER))
    assert (d.phase, d.error.kind) == ("model_load", "truncated")
    config = _LAUNCHER + frame("C:\\venv\\lib\\site-packages\\accelerate\\commands\\launch.py", 1000,
                               "_validate_launch_command", "defaults = load_config_from_file(args.config_file)")
    assert phase(config) == "model_load"


def test_accelerate_reporting_the_trainers_exit_is_not():
    text = (HEAD + frame("C:\\venv\\lib\\site-packages\\accelerate\\commands\\launch.py", 985, "main",
                         "launch_command(args)")
            + frame("C:\\venv\\lib\\site-packages\\accelerate\\commands\\launch.py", 941, "launch_command",
                    "simple_launcher(args)"))
    d = diagnose(parse_text(text))
    assert (d.phase, d.error.kind) == ("unknown", "other")


def test_the_dreambooth_extensions_class_images_are_a_sampling_pass():
    assert phase("Generating 270 class images for training...\n" + OOM) == "sampling"
    assert phase("Generating 270 class images\n" + OOM) == "sampling"
    assert phase("270 class images found\n" + OOM) != "sampling"


def test_a_python_warning_run_on_after_a_record_starts_a_line():
    record = ("                   INFO     epoch is incremented. current_epoch: 0, epoch: 1           "
              "train_util.py:779 C:\\venv\\Lib\\site-packages\\torch\\_dynamo\\eval_frame.py:838: UserWarning: "
              "torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly.\n")
    assert phase(record + "  return fn(*args, **kwargs)\n" + OOM) == "first_step"
    # the same record on a line of its own reads the same
    alone = record.split(" C:\\venv")[0] + "\n"
    assert phase(alone + OOM) == "first_step"


@pytest.mark.parametrize("prefix", [
    "2026-03-26T14:38:51.322526204Z [eef6d770-c7b4-4b56-aec7-053dc7c05b7e] [14:38:51] [STDERR] ",
    "2026-03-26T14:38:51.322526204Z [0ef6d770-c7b4-4b56-aec7-053dc7c05b7e] [14:38:51] [STDOUT] ",
    "[14:38:51] [STDERR] ",
])
def test_a_containers_line_prefixes_are_stripped(prefix):
    # (round 21) a pod's time, its job id, a bare time and the stream before every line
    text = HEAD + frame("/srv/trainer/train.py", 20, "main", "trainer.train()") + "ValueError: bad\n"
    d = diagnose(parse_text("".join(prefix + line + "\n" for line in text.splitlines())))
    assert (d.outcome, d.error.kind, d.error.message) == ("error", "other", "ValueError: bad")

