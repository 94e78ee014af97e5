"""Classes behind long-standing held-out misses: records whose level ends in a colon ("INFO: message");
a compose service's name before each line; the model's prediction named `noise_pred` in the job's own code
(and a project's own `scripts/` folder read as the job's); a model or pipeline failing to load in a program's
own words; a bar cut right after its counts; a bar named only "caching", and named bars cut before their
counts; torch's report of a parameter it could not copy; a script constructing its trainer; a program's
report of an error followed by the error's own traceback; a logger given a formatted traceback. Several forms
of each, and text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from kohya_tuner.logparse.cleaning import clean
from tests.logparse_texts import BAR, CACHING, HEAD, frame, phase


@pytest.mark.parametrize("line", [
    "2025-12-21 14:23:56,344 INFO: Loading shcuganclass model from /w/net.pth",
    "INFO: Loading the model from /w/net.pth",
    "INFO:  Loading weights",
])
def test_a_record_whose_level_ends_in_a_colon_is_read_by_its_message(line):
    assert phase(line + "\n") == "model_load"


@pytest.mark.parametrize("line", [
    "INFO:root:Loading the model from /w/net.pth",  # logging's own format: the logger is "root"
    "INFORMATION: Loading the model",  # no level
])
def test_other_colon_forms_are_not_read_as_that_record(line):
    d = diagnose(parse_text(line + "\n"))
    assert d.phase in ("model_load", "unknown")
    if line.startswith("INFORMATION"):
        assert d.phase == "unknown"


@pytest.mark.parametrize("name", ["trainer", "kohya", "app"])
def test_a_compose_service_name_padded_before_its_bar_is_taken_off(name):
    assert clean(f"{name}  | [rank0]:   File \"/w/x.py\", line 3, in f") == '  File "/w/x.py", line 3, in f'
    text = "".join(f"{name}  | [rank0]: {row}" for row in (
        HEAD, frame("/app/train_db.py", 125, "train", "text_encoder, vae, unet, _ = train_util.load_target_model("
                    "args, weight_dtype, accelerator)")))
    assert phase(text) == "model_load"


@pytest.mark.parametrize("line", [
    "Name | value",  # one space before the bar: a table's row
    "INFO     | 2024-01-01 06:16:28 | pkg.mod:f:230 - hello",  # a level, padded: a record's head
])
def test_a_bar_after_other_words_is_kept(line):
    assert clean(line) == line


@pytest.mark.parametrize("folder", ["/w/VideoX-Fun/scripts", "/w/lora-scripts/scripts/stable", "C:\\w\\job"])
@pytest.mark.parametrize("source", ["noise_pred = transformer3d(", "noise_pred = unet(noisy_latents, timesteps, emb)",
                                    "noise_pred = self.dit(noisy_model_input, t)"])
def test_the_jobs_own_noise_pred_on_noised_latents_is_the_step(folder, source):
    sep = "\\" if "\\" in folder else "/"
    text = (HEAD + frame(f"{folder}{sep}train.py", 1706, "<module>", "main()")
            + frame(f"{folder}{sep}train.py", 1559, "main", source)
            + frame("/v/lib/python3.10/site-packages/torch/nn/modules/module.py", 1511, "_wrapped_call_impl",
                    "return self._call_impl(*args, **kwargs)")
            + "RuntimeError: Given groups=1, expected input to have 33 channels\n")
    assert phase(text) == "first_step"


@pytest.mark.parametrize("path, source", [
    # A pipeline's denoising loop, in the job's folder: the model input, not the noised latents.
    ("/w/library/lpw_stable_diffusion.py", "noise_pred = self.unet(latent_model_input, t, encoder_hidden_states=e)"),
    # An installed pipeline breaking the call's arguments: not the job's code.
    ("/v/lib/python3.10/site-packages/diffusers/pipelines/flux/pipeline_flux.py", "noise_pred = self.transformer("),
])
def test_a_pipelines_noise_pred_is_not_the_step(path, source):
    text = HEAD + frame(path, 800, "__call__", source) + "RuntimeError: bad\n"
    assert phase(text) != "first_step"


def test_a_venvs_scripts_folder_is_still_not_the_jobs_code():
    text = (HEAD + frame("C:\\k\\venv\\Scripts\\accelerate.exe\\__main__.py", 7, "<module>", "sys.exit(main())")
            + frame("C:\\k\\venv\\lib\\site-packages\\x\\m.py", 3, "f", "noise_pred = model(")
            + "RuntimeError: bad\n")
    assert phase(text) != "first_step"


@pytest.mark.parametrize("line", [
    "Error loading pipeline: Target modules {'to_q', 'to_k'} not found in the base model.",
    "Error while loading the checkpoint: unexpected EOF",
    "Exception when loading model: out of range",
])
def test_a_model_failing_to_load_in_the_programs_words_is_start_up(line):
    assert phase(line + "\n") == "model_load"


@pytest.mark.parametrize("line", ["Error loading image /d/1.png: truncated", "Error loading caption file"])
def test_other_loading_errors_are_not_the_model(line):
    assert phase(BAR + line + "\n") != "model_load"


@pytest.mark.parametrize("line", ["Epoch 0:   0%|          | 1/133740", "steps:  40%|████      | 40/100"])
def test_a_bar_cut_right_after_its_counts_counts_its_step(line):
    d = diagnose(parse_text(line + "\n"))
    assert d.phase == "training"
    assert (d.step, d.total_steps) == tuple(int(x) for x in line.rsplit(" ", 1)[1].split("/"))


@pytest.mark.parametrize("line", ["accuracy 50% 1/2", "memory used 80% 3/4"])
def test_counts_after_a_percentage_with_no_bar_are_no_bar(line):
    assert diagnose(parse_text(line + "\n")).step is None


@pytest.mark.parametrize("line", ["caching: 100%|██████████| 33/33 [00:04<00:00,  7.50it/s]", "caching:   0%|",
                                  "caching: 100%|█████"])
def test_a_bar_named_caching_is_the_latent_cache(line):
    assert phase(BAR + line + "\n") == "cache_latents"


@pytest.mark.parametrize("line", ["Loading pipeline components:  40%|███", "Loading checkpoint shards:   0%|"])
def test_a_named_bar_cut_before_its_counts_says_its_stage(line):
    assert phase(line + "\n") == "model_load"


@pytest.mark.parametrize("line", ["caching disabled", "Caching is off for this dataset", "100%|█████"])
def test_other_caching_words_and_nameless_cut_bars_are_not_the_cache(line):
    assert phase(BAR + line + "\n") == "training"


@pytest.mark.parametrize("param", ["text_model.encoder.layers.11.self_attn.v_proj.weight", "lora_unet_down.alpha"])
def test_a_parameter_torch_could_not_copy_is_the_model_loading(param):
    line = (f'        While copying the parameter named "{param}", whose dimensions in the model are '
            "torch.Size([768]) and whose dimensions in the checkpoint are torch.Size([768]), an exception "
            "occurred : ('Cannot copy out of meta tensor; no data!',).\n")
    d = diagnose(parse_text(line))
    assert (d.outcome, d.phase) == ("error", "model_load")


def test_copying_in_other_words_is_no_failure():
    d = diagnose(parse_text(BAR + "copying the parameters named in the config to the output folder\n"))
    assert (d.outcome, d.phase) == ("incomplete", "training")


@pytest.mark.parametrize("source", ["trainer = Trainer(args)", "trainer = SDXLTrainer(config)",
                                    "trainer = finetrainers.Trainer(args)"])
def test_a_script_constructing_its_trainer_is_start_up(source):
    text = (HEAD + frame("/w/train.py", 26, "main", source)
            + frame("/w/pkg/trainer.py", 91, "__init__", "self.cfg = get_config(self.args.model_name)")
            + "ValueError: Training type lora_i2v not supported\n")
    assert phase(text) == "model_load"


def test_a_trainer_running_is_not_constructing_it():
    text = (BAR + HEAD + frame("/w/train.py", 26, "main", "trainer.train(args)")
            + frame("/w/pkg/trainer.py", 91, "train", "x = y") + "ValueError: bad\n")
    assert phase(text) != "model_load"


_ERR = "Training type lora_i2v not supported for model ltx_video. Supported: ['lora']"


@pytest.mark.parametrize("prefix", ["ERROR:finetrainers:", "ERROR: ", ""])
def test_a_reported_error_then_its_traceback_is_placed_by_the_frames(prefix):
    text = (f"{prefix}An error occurred during training: {_ERR}\n" + f"{prefix}{HEAD}"
            + frame("/w/train.py", 26, "main", "trainer = Trainer(args)")
            + frame("/w/pkg/models.py", 23, "get_config", "raise ValueError(") + f"ValueError: {_ERR}\n")
    assert phase(text) == "model_load"


def test_a_report_of_another_error_keeps_its_own_words():
    text = (f"ERROR:finetrainers:An error occurred during training: {_ERR}\n" + HEAD
            + frame("/w/train.py", 26, "main", "trainer = Trainer(args)")
            + "ValueError: some other message that is long enough\n")
    assert phase(text) == "first_step"


def test_a_logger_given_a_formatted_traceback_reads_its_frames():
    text = ("ERROR:myjob:Traceback (most recent call last):\n"
            + frame("/w/train.py", 26, "main", "trainer = Trainer(args)") + "ValueError: bad config value\n")
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase) == ("error", "model_load")
