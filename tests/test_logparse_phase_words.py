"""The phase words of trainers other than sd-scripts (phase_words.toml), the names of what
logged a record, and the log formats that hid them. Each text here is written for the rule it
tests (none is a labelled log)."""

from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from kohya_tuner.logparse import phase_words as PW

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of "
       "11.60 GiB of which 0.50 GiB is free.\n")
HIP_OOM = ("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           "15.98 GiB of which 0 bytes is free.\n")
MPS_OOM = ("RuntimeError: MPS backend out of memory (MPS allocated: 17.80 GB, other allocations: 1.19 MB, max allowed: "
           "18.13 GB). Tried to allocate 512.00 MB on private pool.\n")
TRAIN_BAR = "steps:  10%|#         | 100/1000 [01:00<10:00,  1.00s/it, avr_loss=0.1]\n"


def _phase(text: str) -> str:
    return diagnose(parse_text(text)).phase


@pytest.mark.parametrize("line,phase", [
    # latents
    ("Processing bucket 1.0:  10%|#         | 5/50 [00:10<00:20,  2.20it/s]\n", "cache_latents"),
    ("Encoding images:  10%|#         | 5/50 [00:10<00:20,  2.20it/s]\n", "cache_latents"),
    ("Checking cache validity...\n", "cache_latents"),
    ("Pre-computing latents for 40 images\n", "cache_latents"),
    # text-encoder outputs
    ("Write embeds to disk\n", "cache_text_encoder"),
    ("Encoding prompts:  10%|#         | 2/20 [00:01<00:20,  1.00s/it]\n", "cache_text_encoder"),
    ("Caching embeddings for 12 captions\n", "cache_text_encoder"),
    ("Encoding with T5\n", "cache_text_encoder"),
    # sampling
    ("Generating Images:   0%|          | 0/4 [00:00<?, ?it/s]\n", "sampling"),
    ("sampling:  20%|##        | 4/20 [00:01<00:05,  3.20it/s]\n", "sampling"),
    ("Running validation...\n", "sampling"),
    ("sample_sampler: euler_a\n", "sampling"),
    ("Generating class images:   0%|          | 0/13 [00:00<?, ?it/s]\n", "sampling"),
    # saving
    ("Saving model weights\n", "saving"),
    ("Saving LoRA weights\n", "saving"),
])
def test_other_trainers_phase_words_place_an_oom_with_no_frames(line, phase):
    assert _phase(line + OOM) == phase


def test_a_phase_word_after_training_steps_outranks_the_training_bar():
    assert _phase(TRAIN_BAR + "Generating Images:   0%|          | 0/4 [00:00<?, ?it/s]\n" + OOM) == "sampling"
    # and the next refresh of the training bar means training went on
    assert _phase(TRAIN_BAR + "Running validation...\n" + TRAIN_BAR.replace("100/", "101/") + OOM) == "training"


def test_sd_scripts_words_still_come_first():
    # "Loading settings from" starts a run (model_load), not the generic "loading " of other trainers.
    events = parse_text("Loading settings from /x/config.toml...\n" + OOM)
    names = [getattr(e, "name", None) for e in events]
    assert "start" in names
    assert PW.prefixes() and all(p == p.lower() for p, _, _ in PW.prefixes())


@pytest.mark.parametrize("line,phase", [
    ("INFO:musubi_tuner.cache_latents:Encoding batch of 1 items\n", "cache_latents"),
    ("INFO:musubi_tuner.wan_cache_text_encoder_outputs:Encoding batch of 4 items\n", "cache_text_encoder"),
    ("2025-01-01 10:00:00,000 [INFO] (VAECache) (Rank: 0) Bucket 1.0 has 20 images\n", "cache_latents"),
    ("2025-01-01 10:00:00,000 [INFO] (TextEmbeddingCache) (Rank: 0) Got 12 prompts\n", "cache_text_encoder"),
    ("2024-06-30 23:45:34 INFO     encoding 12 images                 cache_latents.py:120\n", "cache_latents"),
])
def test_a_logger_or_tag_that_names_a_cache_gives_the_phase(line, phase):
    assert _phase(line + OOM) == phase


def test_a_logger_of_the_trainer_itself_says_no_phase():
    assert PW.source_phase("musubi_tuner.hv_train_network") is None
    assert PW.source_phase("train_util") is None
    # Its record places a failure nothing else places as start-up (the job had not stepped: the
    # start-up convention), not as any phase its name might suggest; after a step it places nothing.
    assert _phase("INFO:musubi_tuner.hv_train_network:Prepare training\n" + OOM) == "model_load"
    assert _phase("INFO:musubi_tuner.hv_train_network:Prepare training\n"
                  "steps:  10%|█         | 10/100 [00:10<00:50,  1.00it/s, avr_loss=0.1]\n" + OOM) == "training"


@pytest.mark.parametrize("cmd,phase", [
    ("python src/musubi_tuner/wan_cache_latents.py --dataset_config d.toml --vae v.safetensors\n", "cache_latents"),
    ("accelerate launch tools/cache_text_encoder_outputs.py --dataset_config d.toml\n", "cache_text_encoder"),
])
def test_a_command_line_that_runs_a_caching_script(cmd, phase):
    assert _phase(cmd + OOM) == phase


def test_a_training_command_line_is_start_up():
    # A trainer's launch starts the job: start-up from it on (what came before is the host's).
    assert PW.command_phase("accelerate launch sdxl_train_network.py --config_file c.toml") == (
        "model_load", "launching the trainer")
    assert PW.command_phase("wan_cache_latents.py is missing") is None  # not a command


def test_accelerate_logger_format_with_date_and_logger_after_the_level():
    text = ("08/08/2024 04:37:22 - INFO - __main__ - ***** Running training *****\n"
            "08/08/2024 04:37:22 - INFO - __main__ -   Num examples = 10\n" + OOM)
    # the header and its figures: start-up's end (the convention's training-header clause)
    assert _phase(text) == "model_load"
    text = ("Steps:  50%|#####     | 500/1000 [10:00<10:00,  1.20s/it, loss=0.05, lr=0.0001]\n"
            "01/01/2025 10:00:00 - INFO - accelerate.accelerator - Saving current state to out/checkpoint-500\n"
            "Killed\n")
    assert _phase(text) == "saving"


def test_onetrainer_step_bar_is_the_training_bar():
    text = ("epoch:   0%|          | 0/100 [00:00<?, ?it/s]\n"
            "step:  40%|####      | 8/20 [00:10<00:15,  1.20s/it, loss=0.123, smooth loss=0.1]\n" + OOM)
    d = diagnose(parse_text(text))
    assert (d.phase, d.step) == ("training", 8)


def test_a_loss_postfix_makes_a_training_bar_but_a_validation_loss_does_not():
    assert diagnose(parse_text("train:  10%|#  | 3/30 [00:01<00:09, 3.0it/s, loss=0.2]\n" + OOM)).step == 3
    assert diagnose(parse_text("eval:  10%|#  | 3/30 [00:01<00:09, 3.0it/s, val_loss=0.2]\n" + OOM)).step is None


@pytest.mark.parametrize("frame,phase", [
    ("    instance_prompt_hidden_states = compute_text_embeddings(\n", "cache_text_encoder"),
    ("    images = log_validation(\n", "sampling"),
])
def test_diffusers_script_frames(frame, phase):
    text = ('Traceback (most recent call last):\n  File "/x/train_dreambooth_lora_flux.py", line 1800, in main\n'
            + frame + OOM)
    assert _phase(text) == phase


@pytest.mark.parametrize("oom", [HIP_OOM, MPS_OOM])
def test_rocm_and_mps_ooms_are_placed_like_cuda_ones(oom):
    d = diagnose(parse_text("caching latents.\n  3%|3         | 1/30 [00:05<02:30,  5.20s/it]\n" + oom))
    assert (d.outcome, d.phase) == ("oom", "cache_latents")
    d = diagnose(parse_text(TRAIN_BAR + oom))
    assert (d.outcome, d.phase, d.step) == ("oom", "training", 100)


def test_unfinished_logs_keep_the_phase_they_stopped_in():
    d = diagnose(parse_text("INFO:musubi_tuner.cache_latents:Encoding batch of 1 items\n"))
    assert (d.outcome, d.phase) == ("incomplete", "cache_latents")
    d = diagnose(parse_text(TRAIN_BAR))
    assert (d.outcome, d.phase) == ("incomplete", "training")


# ---- rules written after the eighth held-out batch's first run ------------------------------------

def test_a_titled_box_that_is_not_a_traceback_is_read_as_lines():
    text = ("Loading model from /m/checkpoint\n"
            "╭──────────── Training Progress ────────────╮\n"
            "│   Epoch 0 / 20    Step 0  |  ETA --        │\n"
            "│   <Bar 0 of 100>  0%                       │\n"
            "╰────────────────────────────────────────────╯\n")
    assert _phase(text) == "first_step"
    # a Rich traceback box is still a traceback
    box = ("╭──────── Traceback (most recent call last) ────────╮\n"
           "│ /sd/train_network.py:900 in train                 │\n"
           "│ ❱ 900 │   accelerator.backward(loss)              │\n"
           "╰───────────────────────────────────────────────────╯\n" + OOM)
    assert _phase(TRAIN_BAR + box) == "training"


def test_an_epoch_header_with_spaces_and_text_after_it():
    assert _phase("Epoch 3 / 20  Step 40  |  ETA 00:10\n" + OOM) == "training"
    assert _phase("epoch 1/10\n" + OOM) == "first_step"


def test_bracketed_tags_before_a_milestone():
    text = ("[2024-02-26 15:59:51,908] [INFO] [logging.py:96:log_dist] [Rank 0] Saving model checkpoint: "
            "/out/global_step10/model_states.pt\n")
    assert _phase(text) == "saving"
    # a lone tag is left alone ("[Dataset 0]" is a dataset record, not a phase)
    assert _phase("[Dataset 0]\n") == "unknown"


def test_a_record_that_names_its_logger_and_function():
    text = ("INFO     __main__ | height: 360 (sample_image_inference)              hv_train_network.py:988\n"
            "INFO     __main__ | sample steps: 20 (sample_image_inference)         hv_train_network.py:991\n" + OOM)
    assert _phase(text) == "sampling"
    text = "INFO     musubi.cache_text | Encoding batch (encode_batch)       cache_text.py:40\n" + OOM
    assert _phase(text) == "cache_text_encoder"
    # a function no frame rule knows says nothing of its own: the record is the job logging before
    # any step (start-up by the convention), and after a step it places nothing
    assert _phase("INFO     __main__ | height: 360 (print_settings)      x.py:1\n" + OOM) == "model_load"
    assert _phase("INFO     __main__ | height: 360 (print_settings)      x.py:1\n"
                  "steps:  10%|█         | 10/100 [00:10<00:50,  1.00it/s, avr_loss=0.1]\n" + OOM) == "training"


@pytest.mark.parametrize("name,phase", [
    ("fizgig.scripts.cache_text", "cache_text_encoder"),
    ("tools.precache_latents", "cache_latents"),
    ("src/cache_latents", "cache_latents"),
    ("musubi_tuner.hv_train_network", None),
    ("my_cache_textures", None),
])
def test_names_of_caching_modules(name, phase):
    found = PW.source_phase(name)
    assert (found[0] if found else None) == phase


def test_ddp_wrapping_frames_are_multi_gpu_start_up():
    text = ('  File "/venv/lib/python3.12/site-packages/torch/distributed/utils.py", line 322, in '
            '_sync_params_and_buffers\n    dist._broadcast_coalesced(\n'
            "RuntimeError: HIP error: invalid device function\n")
    d = diagnose(parse_text(text))
    assert (d.phase, d.error.kind) == ("model_load", "cuda_error")


def test_a_plain_exception_line_is_a_failure():
    d = diagnose(parse_text("Exception: (id=ds) Some images were not cached.\n"))
    assert d.outcome == "error"
    # a word merely ending the same way is not an exception line
    assert diagnose(parse_text("NoException here\n")).outcome != "error"


def test_a_panel_cut_before_its_bottom_does_not_swallow_what_follows():
    text = ("╭──────────── Training Progress ────────────╮\n"
            "│   Epoch 0 / 20    Step 0  |  ETA --        │\n" + OOM)
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase) == ("oom", "first_step")


@pytest.mark.parametrize("prefix", ["mpi-x1y2-launcher: ", "node01: ", "worker-0: ", "10.0.0.5: ", "kohya-1  | ",
                                    "trainer_1 | "])
def test_a_launchers_host_prefix_before_every_line(prefix):
    text = "".join(prefix + line for line in (
        "Traceback (most recent call last):\n",
        '  File "train.py", line 9, in <module>\n',
        "    loss.backward()\n",
        OOM))
    d = diagnose(parse_text(text))
    assert d.outcome == "oom"
    assert d.phase == "first_step"


def test_an_exception_name_or_script_is_not_a_host_prefix():
    (fail,) = [e for e in parse_text("train_network.py: error: unrecognized arguments: --foo\n")
               if type(e).__name__ == "Failure"]
    assert fail.kind == "bad_argument"
    assert diagnose(parse_text("RuntimeError: Expected all tensors to be on the same device\n")).outcome == "error"


@pytest.mark.parametrize("head", ["[E ProcessGroupNCCL.cpp:1414] ", "[E1003 04:22:11.123456789 ProcessGroupNCCL.cpp:616] "])
def test_an_nccl_allreduce_timeout_in_a_c10_error_record(head):
    text = (TRAIN_BAR + "[rank1]:" + head + "[PG 0 Rank 1] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=90, OpType=ALLREDUCE, NumelIn=10, NumelOut=10, Timeout(ms)=600000) ran for 600010 "
            "milliseconds before timing out.\n")
    d = diagnose(parse_text(text))
    assert d.outcome == "error" and d.error.kind == "distributed"
    assert d.phase == "training"


def test_a_c10_warning_record_is_not_a_failure():
    text = "[W socket.cpp:663] [c10d] The client socket has failed to connect to [localhost]:29500.\n"
    assert diagnose(parse_text(text)).outcome == "incomplete"


@pytest.mark.parametrize("line,phase", [
    ("(id=my-set) Bucket 0.75 caching results: {'cached': 3, 'total': 9}\n", "cache_latents"),
    ("Aspect bucket 1.0 encoding 40 images\n", "cache_latents"),
    # A bucket made from the dataset's image sizes, before any model: start-up.
    ("bucket 0: resolution (512, 512), count: 10\n", "model_load"),
])
def test_a_bucket_being_cached_is_the_vae_pass(line, phase):
    assert _phase(line) == phase


@pytest.mark.parametrize("text,phase", [
    # huggingface_hub's and transformers' download bars come before the model is loaded.
    ("Starting UI...\nFetching 4 files: 100%|##########| 4/4 [00:00<00:00, 100.00it/s]\n", "model_load"),
    ("08/01/2024 10:00:00 - INFO - __main__ - Distributed environment: NO\n"
     "Downloading shards: 100%|##########| 2/2 [00:10<00:00,  5.00s/it]\n", "model_load"),
    ("Downloading shards:  50%|#####", "model_load"),
])
def test_download_bars_are_model_loading(text, phase):
    assert _phase(text) == phase


def test_the_web_uis_safe_unpickler_is_loading_weights():
    text = ('Traceback (most recent call last):\n'
            '  File "/ui/modules/safe.py", line 131, in load_with_extra\n'
            '    check_pt(filename, extra_handler)\n'
            'Exception: bad file inside /models/x/unet/model.bin: data.pkl\n')
    d = diagnose(parse_text(text))
    assert d.outcome == "error" and d.phase == "model_load"


@pytest.mark.parametrize("loading,phase", [
    ("INFO:trainer.utils:Loading state dict from /models/text_encoders/umt5_xxl.safetensors\n", "cache_text_encoder"),
    ("INFO:trainer.utils:Loading tokenizer from google/byt5-small\n", "cache_text_encoder"),
    # The DiT loaded after the caching is model loading again.
    ("INFO:trainer.utils:Loading tokenizer from google/byt5-small\n"
     "INFO:trainer.main:Loading DiT model from /models/dit.safetensors\n", "model_load"),
])
def test_a_text_encoder_loaded_to_cache_its_outputs_is_part_of_the_caching(loading, phase):
    text = "INFO:trainer.main:cache Text Encoder outputs for sample prompt: /data/prompts.txt\n" + loading
    assert _phase(text) == phase


def test_a_text_encoder_loaded_before_any_caching_is_model_loading():
    assert _phase("INFO:trainer.utils:Loading tokenizer from google/byt5-small\n") == "model_load"


@pytest.mark.parametrize("line,phase", [
    ("2025-03-01T09:15:02.114205 -                     INFO     caching latents with caching strategy.   "
     "train_util.py:989\n", "cache_latents"),
    ("2025-03-01T09:15:02.114205 - 2025-03-01 09:15:02 INFO     caching Text Encoder outputs...          "
     "train_util.py:1164\n", "cache_text_encoder"),
])
def test_comfyuis_iso_time_prefix_is_stripped(line, phase):
    """ComfyUI's console puts "<isoformat time> - " before every line a node's trainer prints."""
    assert _phase("2025-03-01T09:15:01.000001 - loading model\n" + line) == phase


def test_comfyuis_prefix_leaves_the_message_and_a_records_own_time():
    from kohya_tuner.logparse.cleaning import clean
    assert clean("2025-03-01T09:15:02.114205 - caching latents.") == "caching latents."
    # The record's own Rich time column after the prefix is how sd-scripts records start: kept.
    assert clean("2025-03-01T09:15:02.114205 - 2025-03-01 09:15:02 INFO     x") == "2025-03-01 09:15:02 INFO     x"


@pytest.mark.parametrize("line", [
    "[2025-05-05 11:00:00,001] [INFO] [logging.py:107:log_dist] [Rank 0] DeepSpeed Final Optimizer = AdamW\n",
    "[2025-05-05 11:00:00,001] [INFO] [logging.py:107:log_dist] [Rank 0] Using client callable to create basic "
    "optimizer\n",
    "[2025-05-05 11:00:00,001] [INFO] [config.py:1001:print]   gradient_accumulation_steps  4\n"
    "[2025-05-05 11:00:00,001] [INFO] [config.py:1001:print]   zero_enabled ................. False\n",
])
def test_deepspeeds_engine_start_up_is_model_loading(line):
    assert _phase(line) == "model_load"


def test_deepspeeds_engine_start_up_then_a_step_is_the_training_step():
    text = ("[2025-05-05 11:00:00,001] [INFO] [logging.py:107:log_dist] [Rank 0] DeepSpeed Final Optimizer = AdamW\n"
            + TRAIN_BAR + OOM)
    assert _phase(text) == "training"


def test_deepspeeds_process_group_start_up_is_model_loading():
    text = ("Traceback (most recent call last):\n"
            '  File "/srv/trainer/train.py", line 90, in <module>\n'
            "    deepspeed.init_distributed()\n"
            '  File "/srv/venv/site-packages/deepspeed/comm/comm.py", line 800, in init_distributed\n'
            "    cdb = TorchBackend(dist_backend, timeout, init_method, rank, world_size)\n"
            "RuntimeError: the process group could not be made\n")
    d = diagnose(parse_text(text))
    assert (d.phase, d.details.phase_evidence) == ("model_load", "frames")


def test_a_wrappers_bracketed_tool_name_before_every_line_is_stripped():
    text = ("[sd-scripts]                     INFO     caching latents...              train_util.py:1094\n"
            "[sd-scripts]   0%|          | 0/4 [00:00<?, ?it/s]\n"
            "[sd-scripts] Traceback (most recent call last):\n"
            '[sd-scripts]   File "/opt/sd-scripts/sdxl_train_network.py", line 184, in <module>\n'
            "[sd-scripts]     trainer.train(args)\n")
    d = diagnose(parse_text(text))
    assert (d.phase, d.outcome, d.error.kind) == ("cache_latents", "error", "truncated")


def test_a_bracketed_tag_without_a_hyphen_is_not_a_tool_name():
    from kohya_tuner.logparse.cleaning import clean
    assert clean("[sd-scripts] caching latents...") == "caching latents..."
    assert clean("[Dataset 0]") == "[Dataset 0]"
    assert clean("[VAECache] x") == "[VAECache] x"
