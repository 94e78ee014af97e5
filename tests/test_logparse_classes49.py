"""Round 49, behind batches 122 to 129's misses: research code's own builders of its model and data, its options
parsed by its own parser, a constructor in IPython's frame form, a syntax error in a module the script imports, a
loss from a model's forward method, a validation step of the job's own loop, SimpleTuner resuming before its first
step, a Rich box's frame row read by rules written for the plain form, a model file downloaded before it is
loaded, and a GUI's "Executing command:" record. Several forms each, and text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text


def _tb(*frames: tuple[str, str, str], error: str = "ValueError: bad value") -> str:
    rows = ["Traceback (most recent call last):"]
    for path, func, source in frames:
        rows.append(f'  File "{path}", line 42, in {func}')
        rows.append(f"    {source}")
    rows.append(error)
    return "\n".join(rows) + "\n"


_MAIN = ("/home/u/proj/run.py", "main", "main(args)")


@pytest.mark.parametrize("frame", [
    ("/home/u/proj/guided_diffusion/script_util.py", "create_model_and_diffusion", "**kwargs,"),
    ("/home/u/proj/models/__init__.py", "create_model", "net = init_net(opt)"),
    ("/home/u/proj/run.py", "main_worker", "model = create_model("),
    ("/home/u/proj/run.py", "main_worker", "phase_loader, val_loader = define_dataloader(phase_logger, opt)"),
    ("/home/u/proj/main.py", "<module>", "model = instantiate_from_config(config.model)"),
    ("/home/u/proj/train.py", "main", "train_set = make_dataset(cfg.data)"),
    ("/home/u/proj/train.py", "main", "net = init_network(cfg)"),
])
def test_the_jobs_builder_of_its_model_or_data_is_start_up(frame):
    d = diagnose(parse_text(_tb(_MAIN, frame)))
    assert d.outcome == "error" and d.phase == "model_load"


@pytest.mark.parametrize("frame", [
    ("/home/u/proj/train.py", "main", "create_model_card(repo_id, images=images)"),
    ("/home/u/proj/train.py", "main", "model_output = model.get_model(x)"),
    ("/home/u/proj/train.py", "main", "pretty = create_model_summary_text(x)"),
])
def test_other_calls_that_name_a_model_are_not_a_builder(frame):
    d = diagnose(parse_text(_tb(_MAIN, frame)))
    assert d.phase != "model_load"


@pytest.mark.parametrize("source", [
    "opt = Logger.parse(args)",
    "opts = parse(args)",
    "config = parse_config()",
    "cfg = options.parse_options(opts)",
])
def test_options_parsed_by_the_jobs_own_parser_are_start_up(source):
    d = diagnose(parse_text(_tb(("/home/u/proj/sr.py", "<module>", source), error="KeyError: 'val'")))
    assert d.outcome == "error" and d.phase == "model_load"


@pytest.mark.parametrize("source", [
    "result = parser.parse(text)",
    "opt = Logger.parse(args, strict=True, extra=model(x))",
])
def test_other_parse_calls_are_not_the_options(source):
    d = diagnose(parse_text(_tb(("/home/u/proj/sr.py", "step", source), error="KeyError: 'val'")))
    assert d.phase != "model_load"


@pytest.mark.parametrize("frame_row", [
    "[/usr/local/lib/python3.7/dist-packages/dalle2_pytorch/trainer.py](https://localhost:8080/#) in "
    "__init__(self, diffusion_prior, use_ema, lr)",
    "/usr/local/lib/python3.10/dist-packages/mylib/trainer.py in __init__(self, model, device)",
])
def test_a_constructor_in_ipythons_frame_form_is_start_up(frame_row):
    text = ("AssertionError                            Traceback (most recent call last)\n"
            "<ipython-input-6-3754abe97b33> in <module>()\n"
            "---> 45     ema_update_every = 10,\n\n"
            f"{frame_row}\n"
            "--> 176         assert exists(accelerator) or exists(device), 'no device'\n\n"
            "AssertionError: no device\n")
    d = diagnose(parse_text(text))
    assert d.outcome == "error" and d.phase == "model_load"


def test_a_function_named_after_a_constructor_is_not_one():
    text = ("AssertionError                            Traceback (most recent call last)\n"
            "/usr/lib/python3/dist-packages/mylib/trainer.py in not__init__helper(self)\n"
            "AssertionError: no device\n")
    assert diagnose(parse_text(text)).phase != "model_load"


@pytest.mark.parametrize("error", [
    "SyntaxError: invalid syntax",
    "IndentationError: unexpected indent",
    "TabError: inconsistent use of tabs and spaces in indentation",
])
def test_a_syntax_error_in_a_module_the_training_script_imports_is_start_up(error):
    text = ("Traceback (most recent call last):\n"
            '  File "scripts/generation_train.py", line 19, in <module>\n'
            "    from guided_diffusion.script_util import (model_and_diffusion_defaults,\n"
            '  File "/home/u/guided_diffusion/script_util.py", line 7\n'
            "    (channel_mult=)\n"
            "                 ^\n"
            f"{error}\n")
    d = diagnose(parse_text(text))
    assert d.outcome == "error" and d.phase == "model_load"


def test_a_syntax_error_raised_by_the_jobs_own_call_is_not_an_import():
    text = _tb(("scripts/generation_train.py", "<module>", "main()"),
               ("scripts/generation_train.py", "main", "ast.literal_eval(args.channel_mult)"),
               error="SyntaxError: invalid syntax")
    assert diagnose(parse_text(text)).phase != "model_load"


@pytest.mark.parametrize("source", [
    "loss = shared.sd_model.weighted_forward(x, cond, w)[0] / gradient_step",
    "loss = self.model.forward(batch)",
    "train_loss = pipe.unet_forward(latents, t)",
])
def test_a_loss_from_a_models_forward_method_is_the_step(source):
    d = diagnose(parse_text(_tb(("/home/u/proj/train.py", "train", source),
                                error="AttributeError: 'X' object has no attribute 'get_loss'")))
    assert d.phase in ("first_step", "training")


def test_a_loss_value_read_from_a_forward_result_is_not_a_call():
    d = diagnose(parse_text(_tb(("/home/u/proj/report.py", "summarise", "loss = forward_results['loss']"),
                                error="KeyError: 'loss'")))
    assert d.phase not in ("first_step", "training")


@pytest.mark.parametrize("frame", [
    ("/home/u/Palette/core/base_model.py", "train", "val_log = self.val_step()"),
    ("/home/u/Palette/models/model.py", "val_step", "self.writer.save_images(self.save_current_results())"),
])
def test_a_validation_step_of_the_jobs_loop_is_sampling(frame):
    d = diagnose(parse_text(_tb(("/home/u/Palette/run.py", "main_worker", "model.train()"), frame,
                                error="FileNotFoundError: [Errno 2] No such file or directory: 'x.jpg'")))
    assert d.phase == "sampling"


def test_a_validation_split_is_not_a_validation_step():
    d = diagnose(parse_text(_tb(("/home/u/proj/train.py", "main", "image_val_items = interval_step(items)"),
                                error="ValueError: empty")))
    assert d.phase != "sampling"


def test_simpletuner_resuming_and_preparing_is_start_up():
    text = _tb(("/home/u/SimpleTuner/train.py", "<module>", "trainer.resume_and_prepare()"),
               ("/home/u/SimpleTuner/helpers/training/trainer.py", "resume_and_prepare", "self.init_resume_checkpoint()"),
               error="RuntimeError: checkpoint not found")
    assert diagnose(parse_text(text)).phase == "model_load"


def test_a_rich_box_frame_row_is_read_by_a_rule_for_the_plain_form():
    # Rules written as ", in load_state_dict" read the box's "…:419 in load_state_dict" row too.
    text = ("╭──────────────────── Traceback (most recent call last) ────────────────────╮\n"
            "│ C:\\kohya_ss\\venv\\lib\\site-packages\\transformers\\modeling_utils.py:419 in load_state_dict │\n"
            "│                                                                             │\n"
            "│    418 │   │   │   with open(checkpoint_file) as f:                          │\n"
            "│ ❱  419 │   │   │   │   if f.read(7) == 'version':                            │\n"
            "╰─────────────────────────────────────────────────────────────────────────────╯\n"
            "UnicodeDecodeError: 'charmap' codec can't decode byte 0x81 in position 1\n")
    d = diagnose(parse_text(text))
    assert d.outcome == "error" and d.phase == "model_load"


def test_a_rich_box_row_of_another_function_is_not_read_as_loading():
    text = ("╭──────────────────── Traceback (most recent call last) ────────────────────╮\n"
            "│ C:\\kohya_ss\\venv\\lib\\site-packages\\mylib\\util.py:419 in load_state_dictionary_text │\n"
            "╰─────────────────────────────────────────────────────────────────────────────╯\n"
            "UnicodeDecodeError: 'charmap' codec can't decode byte 0x81 in position 1\n")
    assert diagnose(parse_text(text)).phase != "model_load"


@pytest.mark.parametrize("line", [
    "Downloading sd_v1-5_vae.ckpt from panopstor/EveryDream",
    "Downloading flux1-dev.safetensors from black-forest-labs/FLUX.1-dev",
    "Downloaded sd_v1-5_vae to /home/u/hfcache/models--panopstor--EveryDream/snapshots/1a46c",
])
def test_a_model_file_downloaded_before_it_is_loaded_is_start_up(line):
    d = diagnose(parse_text(line + "\n"))
    assert d.outcome == "incomplete" and d.phase == "model_load"


@pytest.mark.parametrize("line", [
    "Downloading the results from the server",
    "Downloaded: 3 files",
])
def test_other_downloads_are_not_a_model_file(line):
    assert diagnose(parse_text(line + "\n")).phase != "model_load"


def test_a_guis_executing_command_record_is_the_launch():
    text = ("14:05:31-383833 INFO     Executing command:                                    \n"
            "                         E:\\kohya_ss\\venv\\Scripts\\accelerate.EXE launch --dynamo_backend no\n"
            "14:05:31-390902 INFO     Command executed.                                     \n")
    d = diagnose(parse_text(text))
    assert d.outcome == "incomplete" and d.phase == "model_load"


def test_a_record_that_merely_mentions_a_command_is_not_the_launch():
    text = "14:05:31-383833 INFO     Executing command: none configured, skipping the post hook\n"
    assert diagnose(parse_text(text)).phase != "model_load"


@pytest.mark.parametrize("line", [
    "Segmentation fault (core dumped)",
    "Segmentation fault",
    "Aborted (core dumped)",
    "Bus error (core dumped)",
    "./lib.include.sh: line 130: 50376 Segmentation fault      (core dumped) \"$@\"",
    "/bin/bash: line 1:   713 Illegal instruction     (core dumped) python3 train_network.py",
    "Fatal Python error: Segmentation fault",
])
def test_a_crash_of_native_code_is_the_failure(line):
    d = diagnose(parse_text("steps:  10%|█         | 10/100 [00:10<01:30,  1.00it/s]\n" + line + "\n"))
    assert d.outcome == "error" and d.error.kind == "other" and "crashed" in d.error.message
    assert d.phase == "training" and d.step == 10
    assert any("native" in a for a in d.advice) and not any("not a memory problem" in a for a in d.advice)


@pytest.mark.parametrize("line", [
    "/bin/bash: line 1:   713 Killed                  python3 train_network.py --config_file x.toml",
    "train.sh: line 12:  4242 Killed    accelerate launch train.py",
])
def test_the_shells_report_of_a_killed_child_is_host_memory(line):
    d = diagnose(parse_text("loading model\n" + line + "\n"))
    assert d.outcome == "cpu_oom" and d.error.kind == "cpu_oom"


@pytest.mark.parametrize("line", [
    "Segmentation fault detected in layer 3 weights, skipping",
    "Aborted by user",
    "./train.sh: line 4: cd: /data: No such file or directory",
    "Fatal Python error: none, just a test string about Segmentation faults",
    "INFO Bus error counters reset",
])
def test_lines_that_merely_name_a_crash_are_not_one(line):
    d = diagnose(parse_text("loading model\n" + line + "\n"))
    assert not (d.error is not None and "crashed" in d.error.message)
