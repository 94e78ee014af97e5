"""Classes behind batches 46 to 49's first-read misses: a shell that cannot find the launcher; what a run does
between two caching passes (models moved off the GPU, the next model's state dict checked); a run resuming a
saved state; a dataset check that finds nothing; torchrun's launch notice, and glog's prefix before it; a
wrapper's tag in capitals; frames that set the job up (a network created, gradient checkpointing, a dataset's
metadata, a Lightning script's trainer settings) or save it (`self.save(`); torch.save refusing a missing
folder; a rank before a record's level, and accelerate's prepare in diffusers' words. Several forms of each,
and text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from kohya_tuner.logparse.cleaning import clean
from tests.logparse_texts import BAR, CACHED, CACHING, HEAD, frame, phase


@pytest.mark.parametrize("line", [
    "sh: 2: accelerate: not found",
    "/bin/sh: 1: accelerate: not found",
    "bash: accelerate: command not found",
    "bash: line 1: python3: command not found",
    "'accelerate' is not recognized as an internal or external command,",
    "'python' is not recognized as an internal or external command,",
])
def test_a_shell_that_cannot_find_the_launcher_is_the_launch_failing(line):
    d = diagnose(parse_text("Start training LoRA Standard ...\n" + line + "\n"))
    assert (d.outcome, d.error.kind, d.phase) == ("error", "other", "model_load")


@pytest.mark.parametrize("line", ["sh: 1: nvidia-smi: not found", "bash: git: command not found",
                                  "'wget' is not recognized as an internal or external command,"])
def test_another_program_not_found_is_no_launch_failure(line):
    d = diagnose(parse_text(BAR + line + "\n"))
    assert d.phase == "training"


@pytest.mark.parametrize("line", [
    "move vae and unet to cpu to save memory",
    "Moving text encoders back to CPU, to save VRAM.",
    "Offloading the VAE to CPU",
    "Moving text encoder 1 to cpu from cuda:0",
    "Checking the state dict: Diffusers or BFL, dev or schnell",
])
def test_between_two_caching_passes_the_run_is_starting_again(line):
    assert phase(CACHED + line + "\n") == "model_load"


@pytest.mark.parametrize("line", ["Moving text encoder to GPU", "Moving text encoder 1 to cuda from cpu"])
def test_text_encoders_moved_to_the_gpu_start_their_caching(line):
    assert phase(CACHED + line + "\n") == "cache_text_encoder"


@pytest.mark.parametrize("line", ["Resuming from checkpoint backup-checkpoint-3000",
                                  "Resume training from step 400", "Resuming from the latest state"])
def test_a_run_resuming_a_saved_state_is_start_up(line):
    assert phase(line + "\n") == "model_load"


@pytest.mark.parametrize("line", ["Resuming is disabled for this run", "resume_from_checkpoint: None"])
def test_other_words_about_resuming_are_not(line):
    assert phase(BAR + line + "\n") == "training"


@pytest.mark.parametrize("line", ["Found 0 images", "-  Found 0 images", "no images found in /d/_1",
                                  "Error: no training images were found"])
def test_a_dataset_check_that_finds_nothing_is_the_dataset_read(line):
    assert phase(line + "\n") == "model_load"


@pytest.mark.parametrize("line", ["images found: 12", "No images were skipped"])
def test_a_dataset_that_has_images_says_nothing_here(line):
    assert phase(BAR + line + "\n") == "training"


@pytest.mark.parametrize("line", [
    "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system",
    "W0902 00:40:01.940000 133343758611968 torch/distributed/run.py:779] Setting OMP_NUM_THREADS environment "
    "variable for each process to be 1 in default",
])
def test_torchruns_launch_notice_is_the_launch(line):
    assert phase(line + "\n") == "model_load"


def test_glogs_prefix_is_taken_off():
    assert clean("E1003 04:22:11.123456 7 torch/csrc/x.cpp:616] boom") == "boom"
    assert clean("W0902 00:40:01.940000 133343758611968 run.py:779] hi") == "hi"
    for line in ("W0902 is a word", "E1 thing", "Epoch 3 done"):
        assert clean(line) == line


@pytest.mark.parametrize("tag", ["TRAIN", "WORKER", "SD_SCRIPTS"])
def test_a_wrappers_tag_in_capitals_is_taken_off(tag):
    text = f"[{tag}] 2026-08-11 15:26:45 INFO epoch is incremented. train_util.py:787\n"
    assert clean(text.rstrip("\n")).startswith("2026-08-11")
    assert phase(text) in ("first_step", "training")


@pytest.mark.parametrize("line", ["[VAECache] x", "[Dataset 0]", "[LoRA] Step 1/3", "[W] x"])
def test_other_bracketed_tags_are_kept(line):
    assert clean(line) == line


@pytest.mark.parametrize("path, func, source", [
    ("/v/lib/site-packages/lycoris/kohya.py", "create_network", "dropout = float(kwargs.get('dropout', 0.))"),
    ("/w/train.py", "main", "unet.enable_gradient_checkpointing()"),
    ("/w/modules/trainer/GenericTrainer.py", "start", "self.model_setup.setup_optimizations(self.model, self.config)"),
    ("/w/utils/dataset.py", "cache_metadata", "metadata_dataset = metadata_dataset.map("),
    ("/w/main.py", "<module>", "ngpu = len(lightning_config.trainer.gpus.strip(',').split(','))"),
])
def test_frames_that_set_the_job_up_are_start_up(path, func, source):
    text = HEAD + frame(path, 10, func, source) + "TypeError: bad\n"
    assert phase(text) == "model_load"


@pytest.mark.parametrize("source", ["self.save(cur_kfiou)", "model.save(path)", "trainer.save(args.output_dir)"])
def test_a_job_calling_save_is_the_save(source):
    text = BAR + HEAD + frame("/w/src/trainer.py", 128, "train", source) + "UnboundLocalError: x\n"
    assert phase(text) == "saving"


@pytest.mark.parametrize("source", ["ctx.save_for_backward(x)", "x = self.saved_tensors", "self.saver = Saver()"])
def test_other_calls_named_save_are_not(source):
    text = BAR + HEAD + frame("/w/src/trainer.py", 128, "train", source) + "RuntimeError: x\n"
    assert phase(text) != "saving"


@pytest.mark.parametrize("folder", ["F:", "/mnt/out/run 1", "C:\\Users\\a b\\out"])
def test_torch_save_refusing_a_missing_folder_is_the_save(folder):
    d = diagnose(parse_text(BAR + f"RuntimeError: Parent directory {folder} does not exist.\n"))
    assert d.phase == "saving"


def test_a_missing_folder_in_other_words_is_not_the_save():
    d = diagnose(parse_text(BAR + "RuntimeError: Directory /d/x does not exist.\n"))
    assert d.phase != "saving"


@pytest.mark.parametrize("line", ["04/11/2023 16:59:12 0:INFO: Prepare everything with our accelerator.",
                                  "1:INFO: Prepare everything with our accelerator.",
                                  "Prepare everything with our accelerator."])
def test_accelerates_prepare_in_diffusers_words_is_start_up(line):
    assert phase(CACHING + line + "\n") == "model_load"
