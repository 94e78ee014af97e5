"""Text whose newlines were lost (joined log records, repeated `[rankN]:` prefixes, a traceback on
one line), a traceback logged one record per line, and the phases read from what comes before or
after a bar: the inference after the last training step, a pipeline's own generation loop, a
training bar named after the job. Each text is written for its rule, from the formats Python's
`logging` and `traceback` modules, torchrun and the trainers print (none is a labelled log)."""

from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from kohya_tuner.logparse.unflatten import unflatten

TB = ('Traceback (most recent call last): File "/opt/app/train.py", line 412, in <module> main(args) '
      'File "/opt/app/train.py", line 388, in main loss = trainer.train_step(batch) '
      'File "/opt/app/trainer.py", line 90, in train_step out = self.unet(noisy_latents, t) '
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.")


# ---- a traceback on one line ---------------------------------------------------------------------

def test_a_one_line_traceback_comes_back_in_pythons_layout():
    lines = unflatten(TB)
    assert lines == [
        "Traceback (most recent call last):",
        '  File "/opt/app/train.py", line 412, in <module>', "    main(args)",
        '  File "/opt/app/train.py", line 388, in main', "    loss = trainer.train_step(batch)",
        '  File "/opt/app/trainer.py", line 90, in train_step', "    out = self.unet(noisy_latents, t)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.",
    ]


def test_a_one_line_traceback_is_read_for_its_error_and_frames():
    d = diagnose(parse_text("> " + TB + "\n"))
    assert (d.outcome, d.phase, d.details.phase_evidence) == ("oom", "first_step", "frames")


def test_a_cut_one_line_traceback_is_truncated_with_its_frames_phase():
    text = ('Traceback (most recent call last): File "/opt/app/train.py", line 412, in <module> main(args) '
            'File "/opt/app/train.py", line 300, in main unet = UNet2DConditionModel.from_pretrained(path)\n')
    d = diagnose(parse_text(text))
    assert (d.outcome, d.error.kind, d.phase) == ("error", "truncated", "model_load")


def test_chained_exceptions_on_one_line_keep_each_exception_line():
    text = ('Traceback (most recent call last): File "/a/x.py", line 3, in load f = open(p) '
            "FileNotFoundError: [Errno 2] No such file or directory: 'w.safetensors' "
            "During handling of the above exception, another exception occurred: Traceback (most recent call last): "
            'File "/a/x.py", line 9, in <module> load() RuntimeError: cannot load weights')
    lines = unflatten(text)
    assert "FileNotFoundError: [Errno 2] No such file or directory: 'w.safetensors'" in lines
    assert "During handling of the above exception, another exception occurred:" in lines
    assert lines[-1] == "RuntimeError: cannot load weights"


def test_carets_under_a_source_line_are_dropped():
    text = ('Traceback (most recent call last): File "/a/x.py", line 3, in f y = g(x) ^^^^ '
            'File "/a/y.py", line 7, in g return 1 / x ~~^~~ ZeroDivisionError: division by zero')
    assert unflatten(text) == ["Traceback (most recent call last):", '  File "/a/x.py", line 3, in f', "    y = g(x)",
                               '  File "/a/y.py", line 7, in g', "    return 1 / x",
                               "ZeroDivisionError: division by zero"]


@pytest.mark.parametrize("line", [
    '  File "/opt/app/train.py", line 412, in <module>' + " " * 60,                 # one frame, as printed
    "Traceback (most recent call last):" + " " * 80,                                # the header alone
    'The docs mention File "config.toml", line 3 of the example, and nothing else about it at all.',
    "raise RuntimeError(msg) is how the script reports a bad argument, see the File menu for more help",
    "x" * 200,
])
def test_a_line_that_is_one_line_is_left_alone(line):
    assert unflatten(line) is None


# ---- records and rank prefixes joined on one line --------------------------------------------------

def test_joined_records_are_split_at_each_records_head():
    text = ("2024-05-01 10:00:00,001 - trainer - INFO - loading model  "
            "2024-05-01 10:00:05,002 - trainer - INFO - caching latents  "
            "[2024-05-01 10:00:09,003] [WARNING] [engine.py:12:init] something else")
    assert unflatten(text) == ["2024-05-01 10:00:00,001 - trainer - INFO - loading model",
                               "2024-05-01 10:00:05,002 - trainer - INFO - caching latents",
                               "[2024-05-01 10:00:09,003] [WARNING] [engine.py:12:init] something else"]


def test_a_time_in_a_message_is_not_a_records_head():
    text = "2024-05-01 10:00:00,001 - trainer - INFO - resuming the run saved at 2024-04-30 22:10:00 from disk now"
    assert unflatten(text) is None


def test_repeated_rank_prefixes_are_lines_and_their_traceback_is_read():
    text = ('[rank0]: Traceback (most recent call last): [rank0]: File "/w/train.py", line 854, in <module> '
            "[rank0]: loss = model_engine.train_batch(iterator)\n")
    lines = unflatten(text.strip())
    assert lines == ["[rank0]: Traceback (most recent call last):", '[rank0]:   File "/w/train.py", line 854, in <module>',
                     "[rank0]:     loss = model_engine.train_batch(iterator)"]
    d = diagnose(parse_text(text))
    assert (d.error.kind, d.phase) == ("truncated", "first_step")


def test_a_traceback_logged_one_record_per_line_is_one_traceback():
    head = "2024-05-01 10:00:00,001 - trainer - INFO - "
    text = "".join(head + x + "\n" for x in (
        "Traceback (most recent call last):", '  File "/w/train.py", line 40, in <module>', "    trainer.train()",
        '  File "/w/trainer.py", line 300, in train', "    self.optimizer.step()"))
    d = diagnose(parse_text(text))
    assert (d.outcome, d.error.kind, d.phase) == ("error", "truncated", "first_step")
    assert d.details.phase_evidence == "frames"


def test_a_record_of_another_level_still_ends_a_logged_traceback():
    text = ("2024-05-01 10:00:00,001 - trainer - ERROR - Traceback (most recent call last):\n"
            '2024-05-01 10:00:00,001 - trainer - ERROR -   File "/w/train.py", line 40, in <module>\n'
            "2024-05-01 10:00:01,000 - trainer - INFO - caching latents\n"
            "2024-05-01 10:00:02,000 - trainer - INFO - still caching\n")
    events = parse_text(text)
    assert diagnose(events).phase == "cache_latents"


# ---- what comes before or after a bar -------------------------------------------------------------

DONE = "".join(f"Steps: {p:3d}%|#####| {n}/400 [01:00<00:00,  1.00it/s, loss=0.3]\n" for p, n in ((99, 399), (100, 400)))


def test_loading_a_model_after_the_last_step_is_the_final_inference():
    text = (DONE + "Model weights saved in /out/pytorch_lora_weights.safetensors\n"
            'Traceback (most recent call last):\n  File "/w/train.py", line 1900, in main\n'
            "    pipeline = FluxPipeline.from_pretrained(\n")
    d = diagnose(parse_text(text))
    assert d.phase == "sampling"


def test_loading_a_model_before_the_last_step_is_still_model_loading():
    text = ("Steps:  50%|##   | 200/400 [01:00<01:00,  1.00it/s, loss=0.3]\n"
            'Traceback (most recent call last):\n  File "/w/train.py", line 1900, in main\n'
            "    pipeline = FluxPipeline.from_pretrained(\n")
    assert diagnose(parse_text(text)).phase == "model_load"


def test_saving_after_the_last_step_stays_saving():
    text = DONE + 'Traceback (most recent call last):\n  File "/w/train.py", line 1800, in main\n    save_file(sd, path)\n'
    assert diagnose(parse_text(text)).phase == "saving"


def test_a_nameless_bar_after_a_pipeline_is_built_is_its_generation():
    text = ("Loading pipeline components...: 100%|#####| 7/7 [00:02<00:00,  3.37it/s]\n"
            "100%|#####| 25/25 [00:05<00:00,  5.00it/s]\n" + "RuntimeError: expected scalar type Half but found Float\n")
    assert diagnose(parse_text(text)).phase == "sampling"


def test_a_nameless_bar_after_another_named_bar_says_nothing():
    text = ("Loading checkpoint shards: 100%|#####| 2/2 [00:02<00:00,  1.00it/s]\n"
            "100%|#####| 25/25 [00:05<00:00,  5.00it/s]\n" + "RuntimeError: expected scalar type Half but found Float\n")
    assert diagnose(parse_text(text)).phase == "model_load"


@pytest.mark.parametrize("announce", ["Generating baseline samples before training", "Skipping first sample due to config setting"])
def test_after_the_pass_before_training_a_bar_of_unknown_name_is_the_training_bar(announce):
    text = (announce + "\nGenerating Images:   0%|          | 0/4 [00:00<?, ?it/s]\n"
            "my job:   0%|          | 0/3000 [00:00<?, ?it/s]\n"
            "my job:   0%|          | 1/3000 [00:03<2:30:00,  3.00s/it]\n"
            "RuntimeError: boom\n")
    d = diagnose(parse_text(text))
    assert (d.phase, d.step, d.total_steps) == ("training", 1, 3000)


def test_without_that_announcement_a_bar_of_unknown_name_is_not_the_training_bar():
    text = ("Generating Images:   0%|          | 0/4 [00:00<?, ?it/s]\n"
            "my job:   0%|          | 0/3000 [00:00<?, ?it/s]\nRuntimeError: boom\n")
    d = diagnose(parse_text(text))
    assert (d.phase, d.step) == ("sampling", None)


def test_after_the_announcement_a_bar_a_phase_word_knows_is_still_that_phase():
    text = ("Generating baseline samples before training\n"
            "Caching latents to disk:   0%|          | 0/30 [00:00<?, ?it/s]\nRuntimeError: boom\n")
    d = diagnose(parse_text(text))
    assert (d.phase, d.step) == ("cache_latents", None)


# ---- a wrapper's prefix before the output it relays -------------------------------------------------

@pytest.mark.parametrize("prefix", ["[My Trainer Node] TRAINER: ", "[Trainer] ", "stderr: ", "[node] out: "])
def test_a_prefix_before_a_relayed_traceback_is_stripped_from_its_lines(prefix):
    text = "".join(prefix + x + "\n" for x in (
        "Traceback (most recent call last):", '  File "/w/train.py", line 300, in main', "    optimizer.step()",
        "ValueError: bad value"))
    d = diagnose(parse_text("steps:  10%|█         | 30/300 [01:00<09:00,  2.00it/s, avr_loss=0.1]\n" + text))
    assert (d.outcome, d.error.kind, d.phase, d.details.phase_evidence) == ("error", "other", "training", "frames")
    assert d.error.message == "ValueError: bad value"


def test_a_prefix_seen_before_a_traceback_leaves_other_lines_alone():
    text = ("[Node] Traceback (most recent call last):\n[Node]   File \"/w/a.py\", line 3, in f\n"
            "[Node] KeyError: 'x'\nsteps:  10%|█         | 30/300 [01:00<09:00,  2.00it/s, avr_loss=0.1]\n")
    events = parse_text(text)
    d = diagnose(events)
    assert d.error.message == "KeyError: 'x'" and d.step == 30


@pytest.mark.parametrize("line", ["[INFO] loading model", "Note: Traceback printing is disabled",
                                  "[a] b: c: Traceback (most recent call last):"])
def test_what_is_no_relay_prefix_is_not_stripped(line):
    from kohya_tuner.logparse.cleaning import strip_relay

    assert strip_relay(line, None) == (line, None)


def test_a_tools_time_and_level_before_a_record_are_one_lines_prefixes():
    line = "[2024-09-18 08:19:00] [INFO] 2024-09-18 08:19:00,040 - trainer - INFO - step 2040: lr 1.0e-04, grad norm 0.28"
    assert unflatten(line) is None


def test_sd_scripts_rich_records_joined_on_one_line_are_split():
    line = ("2024-06-30 23:45:34 INFO     loading model for process 0/1                  train_util.py:5000 "
            "2024-06-30 23:45:40 INFO     caching latents...                             train_util.py:1000")
    assert len(unflatten(line)) == 2


# ---- a traceback's tail without its header ------------------------------------------------------------

def test_a_paste_starting_at_a_repeated_frame_line_is_a_cut_traceback():
    text = "loading\n  [Previous line repeated 4 more times]\n  File \"/env/lib/python3.12/site-packages/tor"
    d = diagnose(parse_text(text))
    assert (d.outcome, d.error.kind) == ("error", "truncated")


def test_a_repeated_frame_line_with_its_error_line_is_that_error():
    text = ('  [Previous line repeated 996 more times]\n  File "/w/model.py", line 12, in forward\n'
            "    return self.forward(x)\nRecursionError: maximum recursion depth exceeded\n")
    d = diagnose(parse_text(text))
    assert (d.outcome, d.error.kind) == ("error", "other")
    assert d.error.message.startswith("RecursionError")


def test_words_about_repeated_lines_are_no_traceback():
    d = diagnose(parse_text("Note: [Previous line repeated] is what Python prints for recursion\n"))
    assert d.outcome == "incomplete" and d.error is None


def test_caching_announced_before_training_does_not_make_the_next_bar_the_training_bar():
    text = ("Caching latents before training\nEncoding batch:   0%|          | 0/300 [00:00<?, ?it/s]\n"
            "RuntimeError: boom\n")
    d = diagnose(parse_text(text))
    assert (d.phase, d.step) == ("cache_latents", None)
