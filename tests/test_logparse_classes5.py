"""Classes of input a fifth round of pastes showed: a caching bar as the last thing in the text, a
dataset prepared with caching, a trainer's launch command line, a host starting a job, a traceback
printed twice with its lines interleaved, an error message naming weights being loaded, gradient
work in a train loop, chained tracebacks, a job runner's failure record behind nested quotes, and
lora-scripts' vendored sd-scripts. Every line is built from the printing library's or trainer's
format, never copied from a labelled log; the negatives are lines that look alike and must not be
read so."""

from __future__ import annotations

import pytest

from kohya_tuner.logparse import LogParser, diagnose, parse_text
from kohya_tuner.logparse import frames as F
from kohya_tuner.logparse.events import Failure
from kohya_tuner.logparse.terms import in_trainer_terms
from tests.logparse_texts import HEAD, frame as _frame, phase as _phase

LOADING = "loading model\n"


# ---- a caching bar at its total, and a bar cut before its counts -----------------------------------

_BAR_AT_TOTAL = [
    "Caching latents: 100%|██████████| 41/41 [00:05<00:00,  7.21it/s]",
    "Caching latents: 100%|██████████| 41/41 [00:05<00:00,  7.21i",  # cut inside its rate
    "caching latents to disk: 100%|██████████| 12/12 [00:01<00:00, 9.50it/s]",
]


@pytest.mark.parametrize("bar", _BAR_AT_TOTAL)
def test_a_caching_bar_at_its_total_that_ends_the_text_leaves_the_run_caching(bar):
    assert _phase(LOADING + bar) == "cache_latents"
    assert _phase(LOADING + bar + "\n") == "cache_latents"
    # The same update printed twice (a refresh written on its own line) is still the last thing.
    assert _phase(LOADING + bar + "\n" + bar + "\n") == "cache_latents"


@pytest.mark.parametrize("bar", _BAR_AT_TOTAL)
def test_something_printed_after_a_caching_bar_at_its_total_ends_the_caching(bar):
    assert _phase(LOADING + bar + "\nprepare optimizer, data loader etc.\n") == "model_load"
    assert _phase(LOADING + bar + "\nsome line no rule knows\n") == "model_load"


def test_training_bar_updates_after_a_caching_bar_at_its_total_come_after_its_end():
    """Folded bar updates (coalescing) reach the parser without a line of their own in between."""
    def steps(*ns: int) -> str:
        return "".join(f"steps:  {n}0%|█         | {n}/10 [00:0{n}<00:09,  1.00it/s, avr_loss=0.1]\n" for n in ns)
    text = (LOADING + steps(1, 1) + "caching latents\n" + _BAR_AT_TOTAL[0] + "\n" + steps(2, 3, 4)
            + "some other line\n")
    parser = LogParser(coalesce_progress=True)
    events = parser.feed(text) + parser.finish()
    assert diagnose(events).phase == "training"
    assert _phase(text) == "training"


@pytest.mark.parametrize("bar, rich", [
    ("Caching latents: 100%|████", "Caching latents ━━━━━━━━━━━━━━━━ 100% 0:00:05"),
    ("Caching latents:  37%|███▋      ", "Caching latents ━━━━━━          37% 0:00:03"),
    ("caching latents to disk:   5%|▌", "caching latents to disk ━        5% 0:01:10"),
])
def test_a_named_bar_cut_before_its_counts_is_still_read_by_its_name(bar, rich):
    assert _phase(LOADING + bar) == "cache_latents"
    # Rich's bar shows a percentage and a time, no counts: its name still says what runs.
    assert _phase(LOADING + rich) == "cache_latents"


@pytest.mark.parametrize("bar", ["100%|████", " 37%|███▋      ", "steps:   5%|▌"])
def test_a_nameless_or_training_bar_cut_before_its_counts_says_no_caching(bar):
    assert _phase(LOADING + bar) != "cache_latents"


# ---- a dataset prepared with caching ---------------------------------------------------------------

@pytest.mark.parametrize("line", [
    "Preparing Dataset (With Caching)",
    "preparing the dataset with caching",
    "Preparing dataset: caching latents",
    "Preparing training dataset (with caching)...",
    "Caching dataset",
    "Caching images",
])
def test_preparing_a_dataset_with_caching_is_the_latent_caching(line):
    assert _phase(f"Starting training run...\n{line}\n") == "cache_latents"
    # The nameless bar right after it is that caching's: cut inside its blocks, still caching ...
    assert _phase(f"Starting training run...\n{line}\n100%|█████████████") == "cache_latents"
    # ... and at its total, with something after it, the caching is over.
    assert _phase(f"{line}\n100%|████| 26/26 [00:05<00:00,  5.00it/s]\nprepare optimizer\n") == "model_load"


@pytest.mark.parametrize("line", [
    "Preparing dataset",
    "Preparing dataset (caching disabled)",
    "Preparing dataset, caching off",
    "Preparing the optimizer with caching allocator",
])
def test_preparing_a_dataset_without_caching_words_is_not_caching(line):
    assert _phase(f"Initializing dreambooth training...\n{line}\n") != "cache_latents"


# ---- a command line that launches a trainer ---------------------------------------------------------

_GUI = "Loading config...\nFolder 100_x: 2400 steps\nmax_train_steps = 2400\n"


@pytest.mark.parametrize("command", [
    'accelerate launch --num_cpu_threads_per_process=2 "train_network.py" --pretrained_model_name_or_path="m"',
    'Executing command: "C:/x/venv/Scripts/accelerate.exe" launch --num_processes=1 "C:/x/sdxl_train_network.py"',
    "python train.py --config_file config.toml",
    "$ python3 -u flux_train_network.py --dataset_config d.toml",
    "/venv/bin/python -m accelerate.commands.launch train_network.py --x",
])
def test_a_launch_command_line_is_the_jobs_start_up(command):
    d = diagnose(parse_text(_GUI + command + "\nprepare tokeni"))
    assert (d.phase, d.details.last_milestone) == ("model_load", "launching the trainer")
    # What the trainer it starts says next is read as usual.
    assert _phase(_GUI + command + "\nloading model for process 0/1\n") == "model_load"


@pytest.mark.parametrize("command", [
    "python src/musubi_tuner/wan_cache_latents.py --dataset_config d.toml",
    "accelerate launch cache_latents.py --vae v.safetensors",
])
def test_a_command_line_of_a_caching_script_says_its_caching(command):
    assert _phase(_GUI + command + "\n") == "cache_latents"


@pytest.mark.parametrize("line", [
    "the python script train.py failed earlier, retrying",
    "Loading weights from python_model.py",
])
def test_prose_naming_a_script_is_not_a_launch(line):
    assert _phase(_GUI + line + "\n") == "model_load"


# ---- the host starting a job -------------------------------------------------------------------------

@pytest.mark.parametrize("frames", [
    _frame("/w/modules/ui.py", 185, "f", "res = list(func(*args, **kwargs))")
    + _frame("/w/webui.py", 51, "f", "shared.state.begin()") + '  File "/w/modules/shared.py", line',
    _frame("/app/server.py", 40, "handle", "job.start()") + _frame("/app/jobs.py", 12, "start", "self.lock()"),
    _frame("/tk/run.py", 95, "main", "job = get_job(config_file, args.name)")
    + _frame("/tk/toolkit/job.py", 29, "get_job", "from jobs import ExtensionJob"),
    _frame("/q/worker.py", 7, "loop", "start_job(task)") + _frame("/q/worker.py", 30, "start_job", "x = 1"),
])
def test_a_host_starting_the_job_is_start_up(frames):
    assert _phase("Error completing request\n" + HEAD + frames) == "model_load"
    assert _phase(HEAD + frames + "ImportError: cannot import name 'X' from 'y'\n") == "model_load"


@pytest.mark.parametrize("source", ["shared.state.end()", "job.run()", "state.interrupted = True", "run_job(cfg)"])
def test_running_or_ending_a_job_is_not_its_start(source):
    assert F.frame_evidence([f"    {source}"]) is None


# ---- one traceback printed twice, interleaved ----------------------------------------------------------

def test_a_traceback_printed_twice_line_by_line_is_read_as_one():
    text = ("Running 1 job\n" + HEAD + HEAD
            + '  File "/tk/run.py", line 120, in <module>\n' * 2 + "        main()main()\n"
            + '  File "/tk/run.py", line 95, in main\n' * 2
            + "        job = get_job(config_file, args.name)job = get_job(config_file, args.name)\n"
            + '  File "/tk/toolkit/job.py", line 29, in get_job\n  File "/tk/too')
    events = parse_text(text)
    assert len([e for e in events if isinstance(e, Failure)]) == 1
    d = diagnose(events)
    assert (d.outcome, d.error.kind, d.phase) == ("error", "truncated", "model_load")


# ---- an error message that names weights being loaded -------------------------------------------------

@pytest.mark.parametrize("line", [
    "RuntimeError: Error(s) in loading state_dict for QwenTextEncoder:",
    "RuntimeError: Error(s) in loading state_dict for UNet2DConditionModel:\n\tMissing key(s) in state_dict: "
    '"conv_in.weight".',
    'RuntimeError: Unexpected key(s) in state_dict: "lora_up.weight".',
    "RuntimeError: size mismatch for conv_in.weight: copying a param with shape torch.Size([320, 4]) from checkpoint, the "
    "shape in current model is torch.Size([320, 8]).",
    "safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge",
])
def test_an_error_naming_weights_being_loaded_is_model_loading(line):
    assert _phase(line + "\n") == "model_load"


def test_frames_that_say_otherwise_decide_over_the_message():
    text = (HEAD + _frame("/s/train_network.py", 900, "train", "accelerator.backward(loss)")
            + "RuntimeError: Error(s) in loading state_dict for Net:\n")
    assert _phase(text) == "first_step"


@pytest.mark.parametrize("line", [
    "RuntimeError: The size of tensor a (64) must match the size of tensor b (32) at non-singleton dimension 1",
    "KeyError: 'state_dict'",
    "ValueError: invalid literal for int() with base 10: 'x'",
])
def test_errors_that_do_not_name_loading_weights_say_no_phase(line):
    assert _phase(line + "\n") == "unknown"


# ---- gradient work in the train loop --------------------------------------------------------------------

@pytest.mark.parametrize("source", [
    "gradient_stats = analyze_gradient_norms(params_to_analyze)",
    "accelerator.clip_grad_value_(params_to_clip, 1.0)",
    "grad_norm = compute_grad_norm(network)",
    "self.log_gradient_statistics(model)",
    "norms = get_gradient_norms(params)",
])
def test_a_call_working_on_gradients_in_the_train_loop_is_the_step(source):
    text = (HEAD + _frame("/s/sdxl_train_network.py", 213, "<module>", "trainer.train(args)")
            + _frame("/s/train_network.py", 2194, "train", source) + '  File "/venv/lib/site-packages/torc')
    assert _phase(text) == "first_step"


@pytest.mark.parametrize("source", [
    "unet.enable_gradient_checkpointing()",
    "get_gradient_checkpointing_policy(args)",
    "torch.set_grad_enabled(False)",
    "with torch.no_grad():",
])
def test_gradient_checkpointing_and_grad_mode_are_not_gradient_work(source):
    ev = F.frame_evidence([f"    {source}"])
    assert ev is None or ev.phase != F.STEP


# ---- chained tracebacks ----------------------------------------------------------------------------------

_FIRST = HEAD + _frame("/m/cache_latents.py", 5, "<module>", "from diffusers.loaders import X") \
    + "ImportError: cannot import name 'X' from 'diffusers.loaders'\n"
_SECOND = HEAD + _frame("/m/cache_latents.py", 9, "<module>", "from diffusers.loaders.single_file import X") \
    + '  File "/venv/lib/site-packages/diffu'


@pytest.mark.parametrize("chain", [
    "\nDuring handling of the above exception, another exception occurred:\n\n",
    "\nThe above exception was the direct cause of the following exception:\n\n",
    "During handling of the above exception, another exception occurred:\n",
])
def test_a_chained_traceback_cut_before_its_error_line_is_the_outcome(chain):
    d = diagnose(parse_text(_FIRST + chain + _SECOND))
    assert (d.outcome, d.error.kind) == ("error", "truncated")
    assert "ImportError" in d.error.message  # the first error is named, not the outcome


def test_a_traceback_that_is_not_chained_does_not_replace_the_error_before_it():
    d = diagnose(parse_text(_FIRST + "\nsome other output\n" + _SECOND))
    assert d.error.kind != "truncated"


def test_an_oom_before_a_chained_cut_traceback_stays_the_outcome():
    text = (HEAD + _frame("/s/train_network.py", 9, "train", "accelerator.backward(loss)")
            + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total "
              "capacity of 23.65 GiB of which 10.00 MiB is free.\n"
            + "\nDuring handling of the above exception, another exception occurred:\n\n" + _SECOND)
    assert diagnose(parse_text(text)).outcome == "oom"


# ---- a job runner's failure record, nested quotes --------------------------------------------------------

_JOB_BAR = "my-job-v1:   0%|          | 0/10000 [00:00<?, ?it/s]"


@pytest.mark.parametrize("record", [
    "Error running job: tuple index out of range",
    "Error running task 'train': list index out of range",
    "Job 'x' failed with error: list index out of range",
])
def test_a_job_runners_failure_record_is_the_error(record):
    text = "Generating baseline samples before training\n" + _JOB_BAR + record + "\n"
    d = diagnose(parse_text(text))
    assert (d.outcome, d.error.kind, d.step, d.total_steps) == ("error", "other", 0, 10000)
    quoted = "".join(f"> > {line}\n" for line in (text + "\n" + HEAD
                                                  + _frame("/tk/run.py", 96, "main", "job.run()")).splitlines())
    d = diagnose(parse_text(quoted))
    assert (d.outcome, d.error.kind, d.step) == ("error", "other", 0)


def test_a_job_runners_record_takes_the_frames_of_the_cut_traceback_after_it():
    text = ("Running 1 job\nError running job: cannot import name 'X' from 'diffusers.loaders'\n" + HEAD
            + _frame("/tk/run.py", 95, "main", "job = get_job(config_file, args.name)")
            + '  File "/tk/toolkit/job.py", line 29, in get_job\n  File "/tk/too')
    d = diagnose(parse_text(text))
    assert (d.error.kind, d.phase) == ("other", "model_load")


@pytest.mark.parametrize("line", [
    "Error running on_error: cannot access local variable 'job'",
    "No error running job 3",
    "error running jobs is disabled in this mode",
])
def test_lines_that_only_mention_a_job_and_an_error_are_not_the_record(line):
    # Not the job runner's record of its job failing; an error notice ending the log is still held as one
    # (Failure.tentative).
    events = parse_text(f"loading model\n{line}\n")
    assert not [e for e in events if isinstance(e, Failure) and not e.tentative]


def test_a_traceback_behind_nested_quotes_is_read():
    text = "".join(f"> > {line}\n" for line in (HEAD + _frame("/s/train_network.py", 9, "train",
                                                              "accelerator.backward(loss)")).splitlines())
    d = diagnose(parse_text(text))
    assert (d.error.kind, d.phase) == ("truncated", "first_step")


@pytest.mark.parametrize("bar", ["my-job-v1:   0%|          | 0/100 [00:00<?, ?it/s]",
                                 "job2509: 100%|██████████| 100/100 [01:00<00:00, 1.6it/s]"])
def test_a_bar_named_like_a_host_keeps_its_name(bar):
    from kohya_tuner.logparse.cleaning import host_prefix_end
    assert host_prefix_end(bar) == 0
    assert host_prefix_end("node-1: " + bar) == len("node-1: ")


# ---- lora-scripts' vendored sd-scripts ----------------------------------------------------------------

@pytest.mark.parametrize("line", [
    r'  File "C:\AI\lora-scripts-v1.12.0\scripts\stable\sdxl_train_network.py", line 185, in <module>',
    '  File "/root/autodl-tmp/lora-scripts/./scripts/stable/sdxl_train_network.py", line 185, in <module>',
    r'  File "E:\SD-Trainer-v2.7.0\SD-Trainer\scripts\dev\flux_train_network.py", line 9, in <module>',
    '  File "/opt/trainer/scripts/dev/library/train_util.py", line 2080, in cache_latents',
    '  File "/opt/app/mikazuki/launch_utils.py", line 12, in run',
])
def test_lora_scripts_is_named_from_its_paths(line):
    assert F.names_in(line)[0] == "lora-scripts"


@pytest.mark.parametrize("line", [
    '  File "/x/sd-scripts/library/train_util.py", line 2080, in cache_latents',
    '  File "/x/myscripts/stable/train.py", line 1, in <module>',
    "python scripts/stable_diffusion_helper.py",
])
def test_other_scripts_folders_are_not_lora_scripts(line):
    assert F.names_in(line)[0] != "lora-scripts"


def test_lora_scripts_advice_stays_in_sd_scripts_terms():
    advice = ["set `gradient_checkpointing = true`"]
    assert in_trainer_terms(advice, "lora-scripts") == advice
    text = (HEAD + _frame("/l/lora-scripts/scripts/stable/train_network.py", 9, "train",
                          "accelerator.backward(loss)") + "torch.OutOfMemoryError: CUDA out of memory.\n")
    assert diagnose(parse_text(text)).wrapper == "lora-scripts"
