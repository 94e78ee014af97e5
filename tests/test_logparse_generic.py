"""Generic rules from what trainers print: other trainers' bars and milestones, process-group
start-up, CUDA's "unknown error", the entry script's family, the figures behind "other programs",
Windows exit codes, small sizes, multi-GPU runs, cut Rich boxes and unreadable inputs. Each text
here is written for the rule it tests (none is a labelled log)."""

from __future__ import annotations

import re

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from kohya_tuner.logparse.advice import size_text
from kohya_tuner.logparse.events import Milestone, Processes, Progress
from tests.clihelp import invoke

OOM_NEW = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried}. GPU 0 has a total capacity of "
           "23.65 GiB of which {free} is free. Including non-PyTorch memory, this process has 20.00 GiB memory in "
           "use. Of the allocated memory 19.00 GiB is allocated by PyTorch, and 0.50 GiB is reserved by PyTorch but "
           "unallocated.\n")


def _of(events, cls):
    return [e for e in events if isinstance(e, cls)]


# ---- other trainers' progress and milestones --------------------------------------------------

def test_ai_toolkit_bar_named_after_the_job_gives_the_step_and_loss():
    text = ("my_first_lora:   3%|3         | 1021/30000 [12:01<5:41:10,  1.41it/s, lr: 1.0e-04 loss: 4.112e-01]\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.\n")
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase, d.step, d.total_steps) == ("oom", "training", 1021, 30000)
    assert d.last_loss == pytest.approx(0.4112)


def test_a_bar_without_a_loss_postfix_and_another_name_is_not_the_training_bar():
    text = "Caching text embeddings to disk:  40%|####      | 40/100 [00:01<00:01, 30.00it/s]\n"
    assert _of(parse_text(text), Progress) == []


@pytest.mark.parametrize("line", ["Saving at step 300", "Saving workspace/run/save/my_lora-2024-01-01.safetensors",
                                  "Saving C:\\loras\\out\\char_v2.safetensors"])
def test_other_trainers_saving_lines_are_the_saving_phase(line):
    text = "steps:  10%|█         | 300/3000 [01:00<09:00,  5.00it/s, avr_loss=0.1]\n" + line + "\nKilled\n"
    d = diagnose(parse_text(text))
    assert d.phase == "saving" and d.error.kind == "cpu_oom"


def test_saving_words_without_a_path_or_step_are_not_a_milestone():
    assert _of(parse_text("Saving is disabled for this run\n"), Milestone) == []


@pytest.mark.parametrize("line", ["[MyWrapper] Loading the T5-XXL text encoder in bf16",
                                  "INFO:some_wrapper.models:Loading Qwen2.5-VL text encoder from /models/te",
                                  "Model 3/4: loading text_encoder_2 (CLIP-G)"])
def test_an_unknown_wrappers_text_encoder_loading_is_model_load(line):
    d = diagnose(parse_text(line + "\n" + OOM_NEW.format(tried="20.00 MiB", free="10.00 MiB")))
    assert d.phase == "model_load"


def test_loading_cached_text_encoder_outputs_is_not_loading_the_text_encoder():
    events = parse_text("[w] loading text encoder outputs from cache: 12 files\n")
    assert not [m for m in _of(events, Milestone) if m.name == "loading the text encoder"]


def test_sample_step_counts_as_steps_done():
    text = ("generating sample images at step / サンプル画像生成 ステップ: 250\n"
            + OOM_NEW.format(tried="1.00 GiB", free="0.10 GiB"))
    d = diagnose(parse_text(text))
    assert (d.phase, d.step) == ("sampling", 250)


def test_python_logging_records_are_read_without_their_logger_prefix():
    events = parse_text("INFO:dataset.config_utils:caching latents...\n")
    assert [m.phase for m in _of(events, Milestone)] == ["cache_latents"]


# ---- process-group start-up ------------------------------------------------------------------

def test_a_frameless_nccl_failure_is_start_up():
    text = ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275, unhandled "
            "system error, NCCL version 2.18.1\n")
    d = diagnose(parse_text(text))
    assert (d.outcome, d.error.kind, d.phase) == ("error", "distributed", "model_load")


def test_process_group_frames_in_a_cut_rich_box_are_start_up():
    text = ("│ ❱ 140 │   │   │   torch.distributed.init_process_group(backend=\"nccl\", **kwargs)    │\n"
            "│ C:\\venv\\lib\\site-packages\\torch\\distributed\\distributed_c10d.py:900 in       │\n"
            "│ init_process_group                                                            │\n")
    d = diagnose(parse_text(text))
    assert (d.outcome, d.error.kind, d.phase) == ("error", "truncated", "model_load")
    assert d.details.frame.startswith("starting the process group")


# ---- CUDA errors -----------------------------------------------------------------------------

def test_cuda_unknown_error_is_a_cuda_error_with_its_guidance():
    text = ("steps:  50%|█████     | 5/10 [00:05<00:05,  1.00it/s, avr_loss=0.1]\n"
            "RuntimeError: CUDA error: unknown error\n"
            "CUDA kernel errors might be asynchronously reported at some other API call.\n")
    d = diagnose(parse_text(text))
    assert (d.outcome, d.error.kind) == ("error", "cuda_error")
    assert any("CUDA_LAUNCH_BLOCKING=1" in a for a in d.advice) and any("driver" in a for a in d.advice)


# ---- the family from the entry script -------------------------------------------------------

def test_the_entry_script_decides_the_family_over_the_modules_it_calls():
    text = ("Traceback (most recent call last):\n"
            '  File "/w/musubi-tuner/wan_train_network.py", line 447, in <module>\n    trainer.train(args)\n'
            '  File "/w/musubi-tuner/hv_train_network.py", line 1915, in train\n    accelerator.backward(loss)\n'
            "RuntimeError: boom\n")
    assert diagnose(parse_text(text)).family == "wan"
    hv = text.replace("wan_train_network.py", "hv_train_network.py")
    assert diagnose(parse_text(hv)).family == "hunyuan_video"


# ---- whose memory ------------------------------------------------------------------------------

def test_old_format_message_leaves_the_context_unexplained_instead_of_blaming_other_programs():
    text = ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 8.00 GiB total capacity; "
            "5.00 GiB already allocated; 0 bytes free; 5.20 GiB reserved in total by PyTorch)\n")
    d = diagnose(parse_text(text))
    assert not any(a.startswith("Free the GPU first") for a in d.advice)
    assert any("unexplained" in a and "does not say whose" in a for a in d.advice)


def test_a_message_that_shows_the_request_would_fit_in_free_memory_blames_no_other_program():
    text = ("RuntimeError: CUDA out of memory. Tried to allocate 1.00 GiB (GPU 0; 24.00 GiB total capacity; "
            "10.00 GiB already allocated; 8.57 GiB free; 10.20 GiB reserved in total by PyTorch)\n")
    d = diagnose(parse_text(text))
    assert not any("other program" in a.lower() and "held" in a for a in d.advice)
    assert not any(a.startswith("Free the GPU first") for a in d.advice)


def test_a_named_other_process_is_still_blamed():
    text = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
            "24.00 GiB of which 10.00 MiB is free. Process 4242 has 12.00 GiB memory in use. Including non-PyTorch "
            "memory, this process has 11.90 GiB memory in use. Of the allocated memory 11.00 GiB is allocated by "
            "PyTorch, and 0.40 GiB is reserved by PyTorch but unallocated.\n")
    d = diagnose(parse_text(text))
    assert d.advice[0].startswith("Free the GPU first") and "4242" in d.advice[0]


# ---- exits, sizes, ranks, frames ----------------------------------------------------------------

@pytest.mark.parametrize("tail", ["returned non-zero exit status 3221225477.",
                                  "returned non-zero exit\nstatus 3221225477."])
def test_windows_access_violation_is_named_and_not_given_the_exit_137_hint(tail):
    text = "subprocess.CalledProcessError: Command '['python', 'train_network.py']' " + tail + "\n"
    d = diagnose(parse_text(text))
    assert d.details.exit_status == 3221225477
    assert "0xC0000005" in d.error.message and "access violation" in d.error.message
    assert not any("137" in a for a in d.advice) and any("0xC0000005" in a for a in d.advice)


def test_small_sizes_are_not_zero_gib():
    assert size_text(2 / 1024) == "2.0 MiB" and size_text(20 / 1024) == "20 MiB"
    assert size_text(1.5) == "1.50 GiB"


def test_diagnose_table_shows_a_2_mib_request_as_mib(tmp_path):
    log = tmp_path / "t.log"
    log.write_text(OOM_NEW.format(tried="2.00 MiB", free="1.06 MiB"), encoding="utf-8")
    res = invoke("diagnose", str(log))
    assert res.exit_code == 0
    assert "2.0 MiB" in res.stdout and not re.search(r"(?<![\d.])0\.00 GiB", res.stdout)


@pytest.mark.parametrize("text", [
    "loading model for process 0/2\n",
    "accelerate launch --num_processes 2 train_network.py\n",
    "[rank1]: steps:   0%|          | 0/100 [00:00<?, ?it/s]\n",
])
def test_a_multi_gpu_oom_notes_each_rank_holds_a_full_copy(text):
    events = parse_text(text + OOM_NEW.format(tried="20.00 MiB", free="10.00 MiB"))
    assert _of(events, Processes)
    d = diagnose(events)
    assert any("each rank holds a full copy of the model" in a for a in d.advice)


def test_a_single_gpu_oom_says_nothing_of_ranks():
    d = diagnose(parse_text("loading model for process 0/1\n" + OOM_NEW.format(tried="20.00 MiB", free="1.00 MiB")))
    assert not any("rank" in a for a in d.advice)


def test_a_frame_moving_tensors_to_the_cpu_is_not_called_moving_them_to_the_gpu():
    text = ("Traceback (most recent call last):\n"
            '  File "/x/quantize_helper.py", line 30, in offload\n    block.to("cpu", non_blocking=True)\n'
            '  File "/venv/torch/nn/modules/module.py", line 1371, in to\n    return self._apply(convert)\n')
    d = diagnose(parse_text(text))
    assert d.details.frame == "moving tensors to the CPU"


def test_a_cut_rich_box_names_its_last_frame_not_a_source_line_number():
    text = ("╭─────────────────────────────── Traceback (most recent call last) ────────────────────────────────╮\n"
            "│ /sd/train_network.py:250 in train                                                                │\n"
            "│                                                                                                  │\n"
            "│   249 │   │   with torch.no_grad():                                                              │\n"
            "│ ❱ 250 │   │   │   train_dataset_group.cache_latents(vae, args.vae_batch_size)                    │\n"
            "│    79 │                                                                                          │\n")
    d = diagnose(parse_text(text))
    assert "last frame: /sd/train_network.py:250 in train" in d.error.message
    assert "last frame: 79" not in d.error.message


def test_a_log_cut_off_while_saving_puts_host_ram_first():
    text = ("steps: 100%|██████████| 10/10 [00:10<00:00,  1.00it/s, avr_loss=0.1]\n"
            "saving checkpoint: /out/x.safetensors\n"
            "Traceback (most recent call last):\n"
            '  File "/sd/train_network.py", line 900, in train\n    save_model(ckpt_name, network)\n')
    d = diagnose(parse_text(text))
    assert (d.error.kind, d.phase) == ("truncated", "saving")
    assert "system RAM" in d.advice[1]
    stopped = diagnose(parse_text("steps: 100%|██████████| 10/10 [00:10<00:00,  1.00it/s]\n"
                                  "saving checkpoint: /out/x.safetensors\n"))
    assert stopped.outcome == "incomplete" and any("system RAM" in a for a in stopped.advice)


# ---- unreadable input --------------------------------------------------------------------------

@pytest.mark.parametrize("data", [b"", b"\n\n   \n", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + b"\x00" * 50,
                                  b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":{}}" + b"\x00" * 4,
                                  b"PK\x03\x04\x14\x00\x00\x00\x08\x00" + bytes(range(200))])
def test_diagnose_on_an_empty_or_binary_file_exits_2(tmp_path, data):
    path = tmp_path / "in.log"
    path.write_bytes(data)
    res = invoke("diagnose", str(path))
    assert res.exit_code == 2
    assert "Traceback" not in res.output and res.output.count("error:") == 1


# ---- advice in the trainer's own terms ---------------------------------------------------------

def _onetrainer_oom():
    text = ('  File "/ot/modules/trainer/GenericTrainer.py", line 129, in start\n'
            + OOM_NEW.format(tried="20.00 MiB", free="10.00 MiB"))
    return diagnose(parse_text("Traceback (most recent call last):\n" + text))


def test_another_trainers_log_gets_advice_in_its_option_names():
    d = _onetrainer_oom()
    assert d.wrapper == "onetrainer"
    joined = "\n".join(d.advice)
    assert "`gradient_checkpointing` (OneTrainer" in joined or "`batch_size` (OneTrainer" in joined \
        or "`weight_dtype` (OneTrainer" in joined
    # A setting OneTrainer's table does not know is labelled as sd-scripts'.
    for line in d.advice:
        if "`" in line and "(OneTrainer;" not in line:
            assert "[sd-scripts setting; in OneTrainer" in line


def test_sd_scripts_logs_keep_the_sd_scripts_names():
    d = diagnose(parse_text('  File "/sd/sdxl_train_network.py", line 9, in <module>\n'
                            + OOM_NEW.format(tried="20.00 MiB", free="10.00 MiB")))
    assert not any("sd-scripts setting;" in a or "(OneTrainer" in a for a in d.advice)


def test_every_trainer_table_maps_real_sd_scripts_settings():
    from kohya_tuner.logparse.terms import table
    from kohya_tuner.schema import raw_schema

    known = {a["name"] for s in raw_schema()["scripts"].values() for a in s["args"]}
    known |= set(raw_schema()["dataset_config"]["keys"])
    for trainer, terms in table().items():
        for key in terms:
            if key != "where":
                assert key in known, (trainer, key)


def test_the_docs_agree_that_host_ram_is_its_own_outcome():
    from pathlib import Path

    docs = Path(__file__).resolve().parent.parent / "docs"
    logs, json_doc = (docs / "logs.md").read_text(encoding="utf-8"), (docs / "json.md").read_text(encoding="utf-8")
    assert '"outcome": "oom | cpu_oom | error' in logs
    assert "| `cpu_oom` | host RAM" in json_doc
    assert "host-RAM exhaustion included" not in logs  # the old wording that filed it under `error`
    d = diagnose(parse_text("MemoryError\n"))
    assert (d.outcome, d.error.kind) == ("cpu_oom", "cpu_oom")


def test_a_diffusers_script_gets_its_flags_and_the_dreambooth_extension_gets_labelled_names():
    oom = OOM_NEW.format(tried="20.00 MiB", free="10.00 MiB")
    diffusers = diagnose(parse_text("steps:  10%|█         | 10/100 [00:10<01:30,  1.00it/s, loss=0.1]\n"
                                    '  File "/d/examples/dreambooth/train_dreambooth_lora_sdxl.py", line 1, in main\n'
                                    + oom))
    assert diffusers.wrapper == "diffusers"
    assert any("`--gradient_checkpointing` (the diffusers training script" in a
               or "`--train_batch_size` (the diffusers training script" in a for a in diffusers.advice)
    ext = diagnose(parse_text('  File "C:\\sd\\extensions\\sd_dreambooth_extension\\dreambooth\\train.py", line 9, '
                              "in main\n" + oom))
    assert ext.wrapper == "a1111-dreambooth"
    with_settings = [a for a in ext.advice if "`" in a]
    assert with_settings and all("[sd-scripts setting; in the web UI's Dreambooth extension" in a
                                 for a in with_settings)


# ---- general evidence the held-out misses showed was read nowhere ---------------------------

@pytest.mark.parametrize("bar, phase", [
    ("Loading pipeline components...: 100%|██████████| 6/6 [00:01<00:00,  4.20it/s]", "model_load"),
    ("Loading checkpoint shards:  50%|#####     | 1/2 [00:03<00:03,  3.10s/it]", "model_load"),
    ("Caching latents to disk:  12%|#2        | 12/100 [00:04<00:30,  2.90it/s]", "cache_latents"),
    ("Caching text embeddings to disk:  40%|####      | 40/100 [00:01<00:01, 30.00it/s]", "cache_text_encoder"),
])
def test_a_named_side_bar_is_the_milestone_its_description_names(bar, phase):
    d = diagnose(parse_text(bar + "\nKilled\n"))
    assert d.phase == phase and d.error.kind == "cpu_oom"


def test_a_side_bar_is_one_milestone_per_appearance_not_one_per_refresh():
    refreshes = "".join(f"Caching latents:  {i}%|#| {i}/100 [00:01<00:01, 9.00it/s]\r" for i in range(0, 100, 10))
    ms = _of(parse_text(refreshes + "\n"), Milestone)
    assert [m.phase for m in ms] == ["cache_latents"]
    ms = _of(parse_text(refreshes + "\n" + refreshes + "\n"), Milestone)
    assert [m.phase for m in ms] == ["cache_latents", "cache_latents"]


@pytest.mark.parametrize("line,phase", [("Start training...", "model_load"), ("Starting training", "model_load"),
                                        ("Epoch 0/1", "first_step")])
def test_a_start_of_training_line_is_the_header_and_an_epoch_header_is_training(line, phase):
    # A header is start-up's end until the loop shows (the convention's training-header clause); an
    # epoch line shows the loop.
    d = diagnose(parse_text("Loading model\n" + line + "\nlr = 1.00e-05\nKilled\n"))
    assert d.phase == phase and d.error.kind == "cpu_oom"


@pytest.mark.parametrize("header", ["epoch 5/100", "Epoch 2/10"])
def test_a_later_epochs_header_without_a_bar_is_past_the_first_step(header):
    text = "Loading model\nepoch 1/100\n" + header + "\nINFO:x:epoch is incremented\nKilled\n"
    d = diagnose(parse_text(text))
    assert d.phase == "training" and d.error.kind == "cpu_oom"


def test_a_resumed_runs_later_epoch_header_is_still_its_first_step():
    text = "Loading model\nresume training from local state: /out/x-state\nepoch 5/100\nKilled\n"
    d = diagnose(parse_text(text))
    assert d.phase == "first_step" and d.error.kind == "cpu_oom"


def test_a_trainers_starting_step_counter_is_the_steps_done():
    text = ("Starting training step (361/7200)\n"
            "2025-01-01 10:00:00,000 - mytrainer - ERROR - Error during training: Expected all tensors to be on "
            "the same device, but found at least two devices, cpu and cuda:0!\n")
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase, d.step, d.total_steps) == ("error", "training", 360, 7200)


@pytest.mark.parametrize("line, phase", [
    ("ERROR:trainer:Error during training: something broke", "first_step"),
    ("2025-01-01 10:00:00,000 - x - ERROR - Exception while saving the model: disk full", "saving"),
    ("ERROR:trainer:Error in sampling: bad prompt", "sampling"),
    ("ERROR:trainer:Text encoder caching failed: bad caption", "cache_text_encoder"),
])
def test_an_error_record_naming_its_phase_is_the_failure_there(line, phase):
    d = diagnose(parse_text("Loading model\n" + line + "\n"))
    assert d.outcome == "error" and d.phase == phase


def test_a_trainers_oom_banner_is_an_oom_in_the_phase_it_names():
    text = ("SS:   0%|          | 0/5000 [00:00<?, ?it/s]\n"
            "################################################\n"
            "# OOM during training step, skipping batch 1/3 #\n"
            "################################################\n"
            "Error running job: something else\n")
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase) == ("oom", "first_step")


def test_a_logged_failure_report_places_the_oom_printed_before_it():
    text = ("RuntimeError: MPS backend out of memory (MPS allocated: 45.18 GiB, other allocations: 719.81 MiB, "
            "max allowed: 45.90 GiB). Tried to allocate 23.44 MiB on private pool.\n"
            "2026-01-01 19:33:57.629 | INFO     | app.ui.handlers:start:642 - Step 0: Training failed: MPS backend "
            "out of memory\n")
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase) == ("oom", "first_step")


@pytest.mark.parametrize("line", ["Training completed without errors", "Saving is disabled for this run",
                                  "INFO: no error in training data found"])
def test_words_about_phases_without_a_failure_are_no_failure(line):
    d = diagnose(parse_text(line + "\n"))
    assert d.error is None and d.oom is None


# ---- general evidence the third held-out batch's misses showed -------------------------------

def test_the_no_grad_decorator_is_not_the_backward_pass():
    text = ("Traceback (most recent call last):\n"
            '  File "gen.py", line 10, in <module>\n'
            '    images = pipeline(batch["prompt"]).images\n'
            '  File "/usr/lib/python3/site-packages/torch/autograd/grad_mode.py", line 27, in decorate_context\n'
            '    return func(*args, **kwargs)\n'
            '  File "/usr/lib/python3/site-packages/diffusers/pipelines/stable_diffusion/pipeline_x.py", line 5, '
            'in __call__\n'
            '    noise_pred = self.unet(x)\n'
            "RuntimeError: boom\n")
    assert diagnose(parse_text(text)).phase == "sampling"


def test_a_trainers_init_step_at_start_up_is_model_load():
    text = ("Traceback (most recent call last):\n"
            '  File "/x/train.py", line 51, in <module>\n'
            "    trainer.init_something_new()\n"
            '  File "/x/trainer.py", line 9, in init_something_new\n'
            "    raise e\n"
            "AttributeError: 'Namespace' object has no attribute 'x'\n")
    assert diagnose(parse_text(text)).phase == "model_load"


def test_caching_code_reached_after_training_steps_is_the_training_step():
    frames = ("Traceback (most recent call last):\n"
              '  File "/x/helpers/caching/text_embeds.py", line 1110, in compute_embeddings_for_prompts\n'
              "    embed = self.load_from_cache(filename)\n"
              "RuntimeError: corrupt file\n")
    bar = "Epoch 1/9, Steps:   0%|   | 15/10000 [00:52<10:02:57,  3.62s/it, lr=7.5e-7, step_loss=0.521]\n"
    d = diagnose(parse_text(bar + frames))
    assert (d.phase, d.step) == ("training", 15)
    # Before any step, or after a caching milestone, it is caching.
    assert diagnose(parse_text(frames)).phase == "cache_text_encoder"
    assert diagnose(parse_text(bar + "caching text embeddings\n" + frames)).phase == "cache_text_encoder"


def test_a_nameless_bar_after_training_starts_is_the_training_bar():
    text = ("INFO     | 2024-01-01 06:16:28 | pkg.trainers.common:on_train_begin:230 - Starting to train...\n"
            "  0%|          | 3/47840 [00:02<9:15:06,  1.44it/s]\n"
            "  0%|          | 1/20 [00:02<00:06,  1.44it/s]\n"
            "Killed\n")
    d = diagnose(parse_text(text))
    assert (d.phase, d.step, d.total_steps) == ("training", 3, 47840)
    # Without the milestone a nameless bar is no training bar.
    assert _of(parse_text(text.split("\n", 1)[1]), Progress) == []


def test_the_tail_of_a_save_line_naming_a_model_file_is_saving():
    text = ("model as StableDiffusion checkpoint to ./output/my_model.safetensors\n"
            "Traceback (most recent call last):\n"
            '  File "/x/bin/accelerate", line 8, in <module>\n'
            "    sys.exit(main())\n")
    assert diagnose(parse_text(text)).phase == "saving"
    assert diagnose(parse_text("loading checkpoint to ./output/my_model.safetensors\nKilled\n")).phase != "saving"


def test_torchrun_stopping_the_other_ranks_is_a_failed_run():
    text = ("Steps:   0%|          | 0/900 [02:06<?, ?it/s]\n"
            "W0908 17:08:01.837000 3889263 site-packages/torch/distributed/elastic/multiprocessing/api.py:900] "
            "Sending process 3889428 closing signal SIGTERM\n")
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase) == ("error", "first_step")
    assert diagnose(parse_text(text.split("\n", 1)[0] + "\n")).outcome == "incomplete"


@pytest.mark.parametrize("frame, wrapper, name", [
    ("/app/ai-toolkit/jobs/process/BaseSDTrainProcess.py", "ai-toolkit", "ai-toolkit"),
    ("/w/SimpleTuner/helpers/training/trainer.py", "simpletuner", "SimpleTuner"),
    ("/w/musubi-tuner/hv_train_network.py", "musubi-tuner", "musubi-tuner"),
    ("/c/ComfyUI/custom_nodes/ComfyUI-FluxTrainer/nodes.py", "comfyui", "ComfyUI's trainer nodes"),
])
def test_every_other_trainers_advice_names_its_settings_in_its_terms_or_labels_them(frame, wrapper, name):
    text = (f'Traceback (most recent call last):\n  File "{frame}", line 9, in train\n    x = step()\n'
            + OOM_NEW.format(tried="20.00 MiB", free="10.00 MiB"))
    d = diagnose(parse_text(text))
    assert d.wrapper == wrapper
    with_settings = [a for a in d.advice if "`" in a]
    assert with_settings
    for line in with_settings:
        assert f"({name};" in line or f"[sd-scripts setting; in {name}" in line, line


# ---- general evidence the fourth held-out batch's misses showed ------------------------------

def test_the_same_traceback_header_twice_is_one_traceback():
    text = ("Traceback (most recent call last):\nTraceback (most recent call last):\n"
            '  File "/x/trainer.py", line 9, in run\n  File "/x/trainer.py", line 9, in run\n'
            "        loss = self.hook_train_loop(batch)loss = self.hook_train_loop(batch)\n")
    d = diagnose(parse_text(text))
    assert (d.error.kind, d.phase) == ("truncated", "first_step")


def test_a_forward_under_gradient_checkpointing_is_the_training_step():
    text = ("│    642 │   │   │   │   return custom_forward                                        │\n"
            "│ /x/library/unet.py:630 in forward_body                                           │\n")
    assert diagnose(parse_text(text)).phase == "first_step"


@pytest.mark.parametrize("node, phase", [("FluxTrainLoop", "first_step"), ("FluxTrainValidate", "sampling"),
                                         ("SomeImageNode", "unknown")])
def test_comfyuis_error_report_names_the_node_that_ran(node, phase):
    text = (f"## Error Details\n- **Node Type:** {node}\n- **Exception Type:** torch.OutOfMemoryError\n"
            "- **Exception Message:** Allocation on device \n")
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase) == ("oom", phase)


def test_generating_with_a_model_is_inference():
    text = ("Traceback (most recent call last):\n"
            '  File "/x/model.py", line 1006, in predict\n    outputs = self.model.generate(\n'
            '  File "/venv/site-packages/transformers/generation/utils.py", line 1500, in generate\n')
    assert diagnose(parse_text(text)).phase == "sampling"


# ---- general evidence the fifth held-out batch's misses showed -------------------------------

def test_a_process_that_failed_with_an_exit_code_names_no_phase():
    text = ("!!! Exception during processing !!! Some Tuner training failed with code 1\n"
            "Traceback (most recent call last):\n"
            '  File "/c/ComfyUI/execution.py", line 515, in execute\n    output = get_output_data(obj)\n'
            "RuntimeError: Some Tuner training failed with code 1\n")
    assert diagnose(parse_text(text)).phase == "unknown"
    # The training job failing names no phase of it; its step failing does.
    assert diagnose(parse_text("ERROR:trainer:Training failed: boom\n")).phase == "unknown"
    assert diagnose(parse_text("ERROR:trainer:Training step failed: boom\n")).phase == "first_step"
    assert diagnose(parse_text("ERROR:trainer:Step 0: Training failed: boom\n")).phase == "first_step"


def test_a_log_pasted_as_a_markdown_quote_is_read_through_the_quote():
    text = ("> generating sample images at step / サンプル画像生成 ステップ: 50\n"
            "> steps:   1%|▋         | 50/9000 [00:19<59:23,  2.51it/s, loss=0.13]\n"
            "> generating sample images at step / サンプル画像生成 ステップ: 50\n"
            "> Traceback (most recent call last):\n"
            '>   File "/x/train_network.py", line 804, in train\n'
            ">     x = f()\n")
    d = diagnose(parse_text(text))
    assert (d.error.kind, d.phase, d.step) == ("truncated", "sampling", 50)


# ---- general evidence the sixth held-out batch's misses showed -------------------------------

def test_sd_scripts_argument_checks_are_start_up():
    text = ("Traceback (most recent call last):\n"
            '  File "/x/flux_train_network.py", line 409, in <module>\n    trainer.train(args)\n'
            '  File "/x/train_network.py", line 330, in train\n    self.assert_extra_args(args, group)\n'
            '  File "/x/flux_train_network.py", line 43, in assert_extra_args\n    assert (\n'
            "AssertionError: these options cannot be used together\n")
    assert diagnose(parse_text(text)).phase == "model_load"


def test_a_process_output_re_logged_by_a_logger_is_read_as_written():
    rows = ["│ /venv/site-packages/transformers/models/auto/auto_factory.py:484 in from_pretrained          │",
            "│ ❱ 484 │   │   │   return model_class.from_pretrained(                                  │"]
    text = "".join(f"2023-07-12 02:50:34 | ERROR | stderr | {r}\n" for r in rows)
    d = diagnose(parse_text(text))
    assert (d.error.kind, d.phase) == ("truncated", "model_load")


@pytest.mark.parametrize("line,outcome,kind", [
    ("RuntimeError: CUDA error: operation not supported\n", "error", "cuda_error"),
    ("RuntimeError: HIP error: hipErrorNoBinaryForGpu: Unable to find code object for all current devices!\n",
     "error", "cuda_unavailable"),
    ("RuntimeError: CUDA error: no kernel image is available for execution on the device\n", "error",
     "cuda_unavailable"),
    ("RuntimeError: CUDA error: out of memory\n", "oom", None),
])
def test_any_cuda_or_hip_error_that_is_not_memory_is_a_kernel_failure(line, outcome, kind):
    d = diagnose(parse_text(line))
    assert d.outcome == outcome
    assert (d.error.kind if d.error else None) == kind


def test_a_wrappers_exit_code_report_is_the_trainers_exit_status():
    d = diagnose(parse_text("RuntimeError: Command failed with exit code 3221225477\n"))
    assert d.outcome == "error"
    assert "access violation" in " ".join(d.advice)
    d = diagnose(parse_text("Training failed with exit code 137\n"))
    assert d.outcome == "cpu_oom"
