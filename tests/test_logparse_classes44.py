"""Classes behind older held-out misses. Round 44: a web front end up and serving, a record naming the function
the job enters, a finished bar printed after the save, a trainer reporting the checkpoint it wrote, a step record
numbered with '#'. Round 45: a collate function handed to a loader being built, a training dataset object being
built. Several forms of each, and text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from kohya_tuner.logparse.events import Saved
from tests.logparse_texts import BAR, HEAD, frame, phase


@pytest.mark.parametrize("lines", [
    ["Running on local URL:  http://127.0.0.1:7860"],
    ["Running on local URL:  http://0.0.0.0:7860", "", "To create a public link, set `share=True` in `launch()`."],
    ["Running on public URL: https://e513ef000398c54e0d.gradio.live"],
    ["Startup time: 31.0s (prepare environment: 24.6s, initialize shared: 0.3s, other imports: 0.9s)."],
    ["15:51:17-823260 INFO     Load CSS...", "Running on local URL:  http://127.0.0.1:7860"],
])
def test_a_front_end_up_and_serving_is_start_up(lines):
    assert phase("\n".join(lines) + "\n") == "model_load"


@pytest.mark.parametrize("line", [
    "The server is running on local hardware",
    "Running on CPU",
    "Startup time was long",
    "running on local url",
])
def test_other_words_about_running_or_startup_say_no_stage(line):
    assert phase(line + "\n") == "unknown"


def test_a_front_end_then_a_training_bar_is_the_loop():
    assert phase("Running on local URL:  http://127.0.0.1:7860\n" + BAR) == "training"


@pytest.mark.parametrize("line, expected", [
    ("08/02/2023 01:31:48 - DEBUG - __main__ - Beginning compute_embeddings_for_prompts: ['a photo']",
     "cache_text_encoder"),
    ("2024-05-01 10:00:00 - INFO - __main__ - Calling cache_latents()", "cache_latents"),
    ("INFO: entering sample_images...", "sampling"),
    ("Starting log_validation:", "sampling"),
])
def test_a_record_naming_the_function_entered_says_its_phase(line, expected):
    assert phase(line + "\n") == expected


@pytest.mark.parametrize("line", [
    "Beginning training_loop_setup: done",  # a name no frame rule knows
    "Beginning compute embeddings for prompts",  # words, not a function's name
    "Starting something_else: now",
])
def test_a_record_naming_an_unknown_function_says_no_stage(line):
    assert phase(line + "\n") == "unknown"


@pytest.mark.parametrize("save", ["Saving weights:   0%|          | 0/4 [00:00<?, ?it/s]",
                                  "saving checkpoint: /out/last.safetensors"])
def test_a_finished_bar_printed_after_the_save_stays_in_the_save(save):
    text = (save + "\nSteps: 100%|██████████| 96/96 [02:38<00:00,  1.65s/it, loss=0.0148]\n"
            "Duration: 00:02:42\n")
    assert phase(text) == "saving"


@pytest.mark.parametrize("save", ["Saving weights:   0%|          | 0/4 [00:00<?, ?it/s]",
                                  "saving checkpoint: /out/e1.safetensors"])
def test_a_bar_that_moves_on_after_the_save_is_training_again(save):
    text = ("steps:  10%|█         | 10/100 [00:10<00:50,  1.00it/s, avr_loss=0.1]\n" + save
            + "\nsteps:  11%|█         | 11/100 [00:11<00:50,  1.00it/s, avr_loss=0.1]\n")
    assert phase(text) == "training"


@pytest.mark.parametrize("line, path", [
    ("[LoRA] Saved checkpoint: /tmp/quicktest_3_lora_f", "/tmp/quicktest_3_lora_f"),
    ("Saved checkpoint: out/step-300.safetensors", "out/step-300.safetensors"),
    ("saving checkpoint: out/last.safetensors", "out/last.safetensors"),
])
def test_a_checkpoint_reported_written_is_a_save(line, path):
    events = parse_text("Step 3/3 | Loss: 0.08\n" + line + "\n")
    saved = [e for e in events if isinstance(e, Saved)]
    assert [s.path for s in saved] == [path]
    assert diagnose(events).phase == "saving"


@pytest.mark.parametrize("line", ["Saved checkpoints are kept for 3 days", "saved checkpoint"])
def test_words_about_saved_checkpoints_are_no_save(line):
    assert not [e for e in parse_text(line + "\n") if isinstance(e, Saved)]


@pytest.mark.parametrize("lines, step", [
    (["Step #0, loss: 0.29, prior_loss: 0.28", "Step #1, loss: 0.20, prior_loss: 0.13"], 1),
    (["step #41 loss 0.12"], 41),
    (["Global step #7 | loss 0.5"], 7),
])
def test_a_step_record_numbered_with_a_hash_is_a_step(lines, step):
    d = diagnose(parse_text("\n".join(lines) + "\n" + HEAD + frame("/w/train.py", 9, "main", "loss.backward()")
                            + "RuntimeError: boom\n"))
    assert d.step == step
    assert d.phase == "training"


@pytest.mark.parametrize("line", ["See issue #12, loss of data", "Step #3 of the guide: set the loss"])
def test_a_hash_in_prose_is_no_step(line):
    assert diagnose(parse_text(line + "\n")).step is None


# A data loader being built with a collate function handed to it, and a training dataset object being built:
# start-up, not a batch being fetched.
@pytest.mark.parametrize("source", [
    "train_dataset, batch_size=args.train_batch_size, shuffle=True, collate_fn=collate_fn",
    "train_dataloader = torch.utils.data.DataLoader(train_dataset, collate_fn = collate_fn)",
])
def test_a_collate_function_handed_to_a_loader_being_built_is_start_up(source):
    text = (HEAD + frame("/w/train_dreambooth.py", 521, "main", source)
            + frame("/env/lib/python3.10/site-packages/torch/utils/data/dataloader.py", 353, "__init__",
                    "sampler = RandomSampler(dataset, generator=generator)")
            + frame("/env/lib/python3.10/site-packages/torch/utils/data/sampler.py", 108, "__init__")
            + "ValueError: num_samples should be a positive integer value, but got num_samples=0\n")
    assert phase(text) == "model_load"


@pytest.mark.parametrize("source", ["return self.collate_fn(data)", "batch = collate_fn(examples)"])
def test_a_collate_function_running_is_the_step(source):
    text = (HEAD + frame("/w/train.py", 900, "main", "for step, batch in enumerate(train_dataloader):")
            + frame("/w/data.py", 40, "fetch", source) + "KeyError: 'pixel_values'\n")
    assert phase(text) == "first_step"


@pytest.mark.parametrize("source", [
    "ds = modules.textual_inversion.dataset.PersonalizedBase(data_root=data_root, width=512)",
    "train_dataset = DreamBoothDataset(",
    "self.train_dataset = data.MyImageDatasetV2(cfg)",
])
def test_building_the_training_dataset_is_start_up(source):
    text = ("Training at rate of 0.9 until step 1000\nPreparing dataset...\n 50% 10/20 [00:05<00:05,  1.89it/s]\n"
            + HEAD + frame("/w/train.py", 413, "train_embedding", source)
            + "FileNotFoundError: [Errno 2] No such file or directory: 'x.txt'\n")
    assert phase(text) == "model_load"


def test_a_dataset_that_caches_as_it_is_built_names_its_caching_call():
    text = (HEAD + frame("/w/toolkit/data_loader.py", 709, "get_dataloader_from_datasets",
                         "dataset = AiToolkitDataset(config, batch_size=1, sd=sd)")
            + frame("/w/toolkit/dataloader_mixins.py", 2402, "cache_text_embeddings")
            + "RuntimeError: boom\n")
    assert phase(text) == "cache_text_encoder"


@pytest.mark.parametrize("source", ["if isinstance(ds, DreamBoothDataset):", "dataset_cls = DreamBoothDataset"])
def test_a_dataset_class_named_but_not_built_is_not_start_up(source):
    text = HEAD + frame("/w/train.py", 10, "helper", source) + "RuntimeError: boom\n"
    assert phase(text) != "model_load"
