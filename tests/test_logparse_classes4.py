"""Classes of input a fourth round of pastes showed: model libraries' weight-loading records and a
trainer's "before training" prints, a data loader being built, DeepSpeed's step records, a bar's
tail from its counts on, a sampling bar carrying the training postfix, a caching bar at its total,
frames that only read an argument, a cache's record of an entry it lacks while steps run, torch
elastic's signal record, a bare "CUDA error:" message, and Rich's source column. Every line is built
from the printing library's or trainer's format, never copied from a labelled log; the negatives are
lines that look alike and must not be read so."""

from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from kohya_tuner.logparse import frames as F
from kohya_tuner.logparse import progress as PR
from kohya_tuner.logparse.events import Exited, Progress
from tests.logparse_texts import HEAD, OOM, frame as _frame, phase as _phase


# ---- weight-loading records and "before training" prints ------------------------------------------

_NOT_START_UP = [
    # Another phase's words on the line: that phase's own entries read it, or nothing does.
    "Caching latents before training",
    "Generating baseline samples before training",
    "Skipping first sample before training",
    "Running validation before training",
    "Validation loss before training: 0.31",
    "Saving the untrained LoRA before training",
    # Prose that only mentions weights, instantiation or "before".
    "Note that all the weights of the LoRA are trainable",
    "instantiating is slow on this machine",
    "before trainers were written, this was slow",
]


@pytest.mark.parametrize("line", [
    "All the weights of CLIPTextModel were initialized from the model checkpoint at /models/clip.",
    "All the weights of FluxTransformer2DModel were initialized from th",  # cut by the paste
    "Some weights of UNet2DConditionModel were not initialized from the model checkpoint at x and are newly "
    "initialized: ['conv_in.weight']",
    "Some weights of the model checkpoint at /m/t5 were not used when initializing T5EncoderModel: ['lm_head']",
    "Instantiating AutoencoderKL model under default dtype torch.float16.",
    "Instantiating a T5EncoderModel model",
    "Before training: Unet First Layer lora up tensor([[0., 0., 0.]])",
    "Parameters before training: 12,345,678",
    "Checking the dataset before the training starts",
])
def test_weight_loading_records_and_before_training_prints_are_start_up(line):
    assert _phase(line + "\n") == "model_load"
    # Words like them elsewhere say no start-up.
    for other in _NOT_START_UP:
        assert _phase(other + "\n") != "model_load", other


# ---- a data loader being built -----------------------------------------------------------------

_LOADER = "/env/lib/site-packages/torch/utils/data/dataloader.py"
_SAMPLER = "/env/lib/site-packages/torch/utils/data/sampler.py"
_FETCHING = [
    _frame(_LOADER, 630, "__next__", "data = self._next_data()") + _frame(_LOADER, 674, "_next_data", "x"),
    # An iterator built inside an iteration is still fetching.
    _frame(_LOADER, 440, "__iter__", "return self._get_iterator()")
    + _frame(_LOADER, 388, "_get_iterator", "return _MultiProcessingDataLoaderIter(self)")
    + _frame(_LOADER, 1040, "__init__", "w.start()"),
    _frame("/env/lib/site-packages/torch/utils/data/_utils/fetch.py", 51, "fetch", "data = [self.dataset[idx] for idx in idx]"),
]


@pytest.mark.parametrize("frames", [
    _frame("/work/trainer/train.py", 1277, "train", "train_dataloader = torch.utils.data.DataLoader(")
    + _frame(_LOADER, 376, "__init__", "sampler = RandomSampler(dataset, generator=generator)")
    + _frame(_SAMPLER, 164, "__init__", "raise ValueError("),
    _frame("C:\\t\\train.py", 40, "main", "loader = DataLoader(ds, batch_size=1, shuffle=True)"),
    # The library's frames alone.
    _frame(_LOADER, 376, "__init__", "sampler = RandomSampler(dataset, generator=generator)")
    + _frame(_SAMPLER, 164, "__init__", "raise ValueError("),
])
def test_building_a_data_loader_is_start_up(frames):
    text = HEAD + frames + "ValueError: num_samples should be a positive integer value, but got num_samples=0\n"
    assert _phase(text) == "model_load"
    # Iterating a loader from the job's code is still fetching a batch, an iterator built inside an
    # iteration as well. The library's frames alone are not read as the step (the labels' start-up
    # convention: a caching pass iterates a loader too).
    job = _frame("/work/trainer/train.py", 900, "train", "batch = next(batches)")
    for fetching in _FETCHING:
        assert F.frame_evidence((job + fetching).splitlines()).phase == F.STEP
        assert _phase(HEAD + job + fetching + OOM) == "first_step"
        alone = F.frame_evidence(fetching.splitlines())
        assert alone is None or alone.phase != F.STEP


# ---- DeepSpeed's step records ------------------------------------------------------------------

_NO_STEP_RECORDS = [
    "steps: 100 validation loss: 0.2",
    "step 5 takes 3 s, loss unknown",
    "steps: 5, val_loss: 0.3",
    "[Rank 0] step=3 started",
    "the step=3, skipped=0, lr=[1e-4] record",
]


@pytest.mark.parametrize("line, step", [
    ("steps: 2 loss: nan iter time (s): 8.385 samples/sec: 0.119", 2),
    ("steps: 40 loss: 0.1123 iter time (s): 2.1 samples/sec: 3.8", 40),
    ("[2025-05-06 07:38:00,969] [INFO] [logging.py:107:log_dist] [Rank 0] step=3, skipped=0, lr=[5.96e-07], "
     "mom=[0.0]", 3),
    ("[Rank 0] step=120, skipped=2, lr=[0.0001, 0.0001], mom=[(0.9, 0.999)]", 120),
])
def test_deepspeeds_step_records_count_the_steps_done(line, step):
    d = diagnose(parse_text(line + "\n"))
    assert (d.phase, d.step) == ("training", step)
    for other in _NO_STEP_RECORDS:
        assert not [e for e in parse_text(other + "\n") if isinstance(e, Progress)], other


# ---- a bar's tail from its counts on ----------------------------------------------------------

_NO_BARS = [
    "12/05/2024 10:00 started the run",  # a date
    "3/4 of the images [see below] were resized",  # a fraction in prose
    "1/2 [done] | ok |",  # a table row
    "5/10 [retry <later>, soon]",  # brackets without a bar's times
]


@pytest.mark.parametrize("line, step, total, phase", [
    ("5/1080 [19:43<70:40:10, 236.66s/it, avr_loss=0.133]", 5, 1080, "training"),
    ("120/1000 [02:00<14:40,  1.00it/s, loss=0.0812, lr=1e-4]", 120, 1000, "training"),
    ("0/500 [00:00<?, ?it/s, loss=0.2]", 0, 500, "first_step"),
])
def test_a_bars_tail_from_its_counts_on_is_a_bar(line, step, total, phase):
    bar = PR.match_bar(line)
    assert bar is not None and (bar.n, bar.total) == (step, total)
    d = diagnose(parse_text(line + "\n"))
    assert (d.phase, d.step, d.total_steps) == (phase, step, total)
    for other in _NO_BARS:
        assert PR.match_bar(other) is None, other
        assert not [e for e in parse_text(other + "\n") if isinstance(e, Progress)], other


# ---- a sampling bar carrying the training postfix -----------------------------------------------

_TRAINING_BARS = [
    "my_lora_job:  10%|█         | 100/1000 [01:00<09:00,  1.67it/s, lr: 1.0e-04 loss: 1.2e-01]",
    "steps:  10%|█         | 100/1000 [01:00<09:00,  1.67it/s, avr_loss=0.1]",
    "Epoch 1/10, Steps:   1%|          | 12/1000 [00:12<16:00,  1.02it/s, step_loss=0.15]",
]


@pytest.mark.parametrize("line", [
    "Generating Samples:   0% 0/4 [00:00<?, ?it/s, inst_loss=0, loss=0.00511, lr=0.0002, vram=8.7]",
    "Generating images:  50%|█████     | 2/4 [00:03<00:03,  1.50s/it, loss=0.1, lr=1e-4]",
    "Sampling:  25%|██▌       | 1/4 [00:01<00:03,  1.00it/s, avr_loss=0.2]",
])
def test_a_bar_named_for_sampling_is_sampling_whatever_its_postfix(line):
    d = diagnose(parse_text(line + "\n"))
    assert d.phase == "sampling" and d.step is None
    # After training steps as well.
    assert _phase("steps:  10%|█| 10/100 [00:10<01:30,  1.00it/s, avr_loss=0.1]\n" + line + "\n") == "sampling"
    # A training bar by any other name stays the training bar.
    for other in _TRAINING_BARS:
        assert _phase(other + "\n") == "training", other


# ---- a caching bar at its total ----------------------------------------------------------------

_DONE = "100%|██████████| 30/30 [00:15<00:00,  1.98it/s]\n"
_BUCKETS = "Bucket 0: Resolution (512, 512), Count: 30\nSched br"


@pytest.mark.parametrize("announce", [
    "Caching latents with buckets...\n",
    "caching latents.\n[Dataset 0]\n",
    "Caching text encoder outputs...\n",
])
def test_a_caching_bar_at_its_total_ends_the_caching(announce):
    assert _phase(announce + _DONE + _BUCKETS) == "model_load"
    # Still under way: caching.
    part = "  50%|█████     | 15/30 [00:07<00:07,  1.98it/s]\n"
    assert _phase(announce + part) != "model_load"
    # A nameless bar starting over right after it is the next dataset's caching.
    nxt = "[Dataset 1]\n  10%|█         | 2/20 [00:01<00:09,  1.98it/s]\n"
    assert _phase(announce + _DONE + nxt) == _phase(announce + part)
    # Training that follows is training; a failure in the caching call's frames is caching.
    assert _phase(announce + _DONE + "running training\nsteps:   0%|          | 0/9 [00:00<?, ?it/s]\n") == \
        "first_step"
    cache = HEAD + _frame("/w/train.py", 9, "train", "train_dataset_group.cache_latents(vae)") + OOM
    assert _phase(announce + _DONE + cache) == "cache_latents"
    # A bar at its total in another phase ends nothing.
    steps = "steps:  10%|█         | 10/100 [00:10<01:30,  1.00it/s, avr_loss=0.1]\n"
    assert _phase(steps + "generating sample images at step 10\n" + _DONE) == "sampling"
    assert _phase(announce + steps + _DONE) == "training"
    # A named caching bar seen only at its total ends the caching too; a model loaded after the
    # caching ended is no caching when a nameless bar follows.
    assert _phase("Caching latents: " + _DONE + _BUCKETS) == "model_load"
    assert _phase(announce + _DONE + "loading model\n" + nxt) == "model_load"
    # Caching, then a bar with no total.
    assert _phase(announce + "30it [00:15,  1.98it/s]\n") == _phase(announce + part)


# ---- frames that only read an argument -----------------------------------------------------------

@pytest.mark.parametrize("source", [
    "not args.train_text_encoder or not args.cache_text_encoder_outputs",
    "if args.cache_latents:",
    "assert args.cache_latents_to_disk, \"caching to disk needs (a path)\"",
    "elif self.args.cache_text_encoder_outputs is None and args.save_every_n_steps:",
])
def test_a_frame_that_only_reads_arguments_is_an_argument_check(source):
    frames = _frame("/w/sd3_train.py", 64, "train", source)
    ev = F.frame_evidence(frames.splitlines())
    assert ev is not None and ev.phase == "model_load"
    text = HEAD + frames + "AttributeError: 'Namespace' object has no attribute 'train_text_encoder'\n"
    assert _phase(text) == "model_load"
    # A call keeps its phase whatever arguments it is given.
    for call, phase in (("train_util.cache_text_encoder_outputs(args, accelerator, text_encoders)",
                         "cache_text_encoder"),
                        ("if args.cache_latents: train_dataset_group.cache_latents(vae)", "cache_latents"),
                        ("self.sample_images(accelerator, args, epoch, global_step)", "sampling")):
        assert F.frame_evidence([call]).diagnose_phase == phase
    # An option read with arithmetic (the training loop's checks) is no evidence at all.
    assert F.frame_evidence(["if args.sample_every_n_steps is not None and step % args.sample_every_n_steps == 0:"]) \
        is None


# ---- a cache's record of an entry it lacks, while steps run ------------------------------------------

_STEPS = "Epoch 1/9, Steps:   0%|          | 91/100000 [3:57:37<9:00:00, 1.00it/s, step_loss=0.149]\n"


@pytest.mark.parametrize("record, other", [
    ("2024-01-22 14:36:46,625 [WARNING] (TextEmbeddingCache) Failed retrieving prompt from cache:",
     "2024-01-22 14:36:46,625 [INFO] (TextEmbeddingCache) Writing embeds for 40 prompts"),
    ("(TextEmbeddingCache) (Rank: 0) /data/cache/ab12-sdxl.pt not found.",
     "(TextEmbeddingCache) (Rank: 0) Computing embeds for 40 prompts"),
    ("WARNING:trainer.latents_cache:cached latents for img_004.png not found, encoding it",
     "INFO:trainer.latents_cache:writing latents for 40 images"),
    ("WARNING:trainer.latents_cache:could not load cached latents for img_004.png",
     "INFO:trainer.latents_cache:encoding 40 images"),
])
def test_a_caches_missing_entry_while_steps_run_is_the_training_step(record, other):
    assert _phase(_STEPS + record + "\n") == "training"
    # Before any step it is the caching it names.
    assert _phase(record + "\n") in ("cache_text_encoder", "cache_latents")
    # A cache's other records during training still say caching (a trainer caching anew).
    assert _phase(_STEPS + other + "\n") in ("cache_text_encoder", "cache_latents")


# ---- torch elastic's signal record ---------------------------------------------------------------

@pytest.mark.parametrize("line", [
    "traceback : Signal 9 (SIGKILL) received by PID 492347",
    "  traceback  : Signal 9 (SIGKILL) received by PID 12",
    "[0]:  traceback : Signal 9 (SIGKILL) received by PID 7",
])
def test_a_workers_sigkill_reads_as_a_bare_killed(line):
    d = diagnose(parse_text(line + "\n"))
    for same in ("Killed", "exitcode  : -9 (pid: 4411)", "Signals.SIGKILL: 9"):
        other = diagnose(parse_text(same + "\n"))
        assert (d.outcome, d.error.kind) == (other.outcome, other.error.kind) == ("cpu_oom", "cpu_oom"), same
    # torch elastic's record gives the status twice (its exitcode, then the signal): one exit.
    record = "  exitcode  : -9 (pid: 1234)\n" + line + "\n"
    assert [e.status for e in parse_text(record) if isinstance(e, Exited)] == [-9]
    # Another signal is no memory kill; prose naming a signal is no record.
    d = diagnose(parse_text("traceback : Signal 15 (SIGTERM) received by PID 7\n"))
    assert d.error is not None and d.error.kind == "other"
    assert diagnose(parse_text("a Signal 9 (SIGKILL) was sent by the admin\n")).outcome == "incomplete"


# ---- a bare "CUDA error:" message ------------------------------------------------------------------

@pytest.mark.parametrize("line, kind", [
    (" CUDA error: unknown error CUDA kernel errors might be asynchronously reported at some other API call, so "
     "the stacktrace below might be incorrect. For debugging consider passing CUDA_LAUNCH_BLOCKING=1", "cuda_error"),
    ("CUDA error: misaligned address", "cuda_error"),
    ("HIP error: invalid device function", "cuda_error"),
    # The message's own kind where it says more than a kernel failure.
    ("CUDA error: no kernel image is available for execution on the device", "cuda_unavailable"),
])
def test_a_bare_cuda_error_message_is_the_error(line, kind):
    d = diagnose(parse_text(line + "\n"))
    assert (d.outcome, d.error.kind) == ("error", kind)
    for other, outcome in (("CUDA error: out of memory", "oom"),
                           ("the last run hit a CUDA error: unknown error", "incomplete"),
                           ("CUDA kernel errors might be asynchronously reported at some other API call", "incomplete")):
        assert diagnose(parse_text(other + "\n")).outcome == outcome, other


# ---- Rich's source column ----------------------------------------------------------------------

_RICH = ("2024-08-16 10:58:26 INFO     unet dtype: torch.float8_e4m3fn, device: cuda:0"
         "                       train_network.py:1004\n")


def test_richs_source_column_names_no_family_by_an_entry_scripts_name():
    d = diagnose(parse_text(_RICH))
    assert d.family is None
    # A module only one family's trainer has still says its family.
    for module, family in (("flux_train_network.py:412", "flux"), ("sdxl_model_util.py:60", "sdxl"),
                           ("flux_train.py:1890", "flux")):
        assert diagnose(parse_text(_RICH.replace("train_network.py:1004", module))).family == family, module
    # The column still names the wrapper.
    assert d.wrapper == "sd-scripts"
    # The script that ran names the family.
    assert diagnose(parse_text("accelerate launch flux_train_network.py --network_dim 4\n" + _RICH)).family == "flux"
    entry = HEAD + _frame("/w/sdxl_train_network.py", 9, "<module>", "trainer.train(args)")
    assert diagnose(parse_text(_RICH + entry + "ValueError: x\n")).family == "sdxl"
