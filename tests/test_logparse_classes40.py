"""Classes behind batches 74 to 81's first-read misses: the step count worked out before a loop; a training bar
redrawn past 0 % with its counts cut; a backward pass through a gradient scaler or of a named loss; a loop computing
its loss; importing the network module; a dataset read from disk or fetched by `datasets`; a Rich box cut in a
training script's imports; the launcher failing as it starts (its imports, its settings) and a script working out
its epochs; a printed training configuration; the ranks' first barrier; a model built with random weights or a
perceptual loss; a saved state; a validation video or image written; training images prepared; a model library
loading its models; the web UI's loop setting its learning rate. Several forms of each, and text that must not be
read so."""
from __future__ import annotations

import pytest

from tests.logparse_texts import BAR, HEAD, box_row, frame, phase

CUT_HEAD = "Traceback (most recent call last):\n"


@pytest.mark.parametrize("lines", [
    ["10/23/2024 20:48:13 - INFO - __main__ -   Num examples = 10",
     "10/23/2024 20:48:13 - INFO - __main__ -   Total optimization steps = 100"],
    ["override steps. steps for 10 epochs is / 指定エポックまでのステップ数: 60", "enable full bf16 training."],
    ["total optimization steps / 学習ステップ数: 1500"],
])
def test_the_step_count_before_a_loop_is_start_up(lines):
    text = "\n".join(lines) + "\n"
    assert phase(text) == "model_load"
    assert phase(text + CUT_HEAD) == "model_load"


def test_a_step_count_after_the_bar_moved_leaves_the_step():
    assert phase(BAR + "Total optimization steps = 100\n") == "training"


def test_the_bar_after_the_step_count_is_the_loop():
    assert phase("Total optimization steps = 100\n" + BAR) == "training"


@pytest.mark.parametrize("bar", ["step:  99%|███████████████████████████████████",
                                 "steps:  50%|█████     ",
                                 "Steps:   3%|▎"])
def test_a_training_bar_past_zero_with_its_counts_cut_is_a_later_step(bar):
    assert phase(bar + "\n") == "training"


def test_a_bar_cut_at_zero_is_no_later_step():
    assert phase("steps:   0%|          \n") != "training"


@pytest.mark.parametrize("source", ["scaler.scale(loss).backward()", "self.scaler.scale(loss / accum).backward()",
                                    "total_loss.backward()", "loss_mean.backward(retain_graph=True)"])
def test_a_backward_pass_through_a_scaler_or_of_a_named_loss_is_the_step(source):
    text = (HEAD + frame("C:\\sd\\modules\\textual_inversion\\textual_inversion.py", 503, "train_embedding", source)
            + frame("C:\\sd\\venv\\lib\\site-packages\\torch\\cuda\\amp\\grad_scaler.py", 164, "scale",
                    "assert outputs.is_cuda or outputs.device.type == 'xla'")
            + "AssertionError\n")
    assert phase(text) in ("first_step", "training")


@pytest.mark.parametrize("source", ["scaled = scaler.scale(loss)", "losses.append(loss.item())"])
def test_other_lines_about_a_loss_are_not_a_backward_pass(source):
    text = HEAD + frame("/w/train.py", 10, "helper", source) + "RuntimeError: x\n"
    assert phase(text) == "unknown"


@pytest.mark.parametrize("source", ["loss = self.model_setup.calculate_loss(self.model, batch, out, self.args)",
                                    "loss = compute_loss(model, batch)",
                                    "train_loss, logs = self.get_train_loss(batch)"])
def test_a_loop_computing_its_loss_is_the_step(source):
    text = (HEAD + frame("M:\\OneTrainer\\modules\\trainer\\GenericTrainer.py", 505, "train", source)
            + frame("M:\\OneTrainer\\modules\\modelSetup\\mixin\\LossMixin.py", 76, "_diffusion_loss",
                    "clamped = torch.clamp(batch['latent_mask'], 0, 1)")
            + "KeyError: 'latent_mask'\n")
    assert phase(text) in ("first_step", "training")


@pytest.mark.parametrize("path, source", [
    ("/v/lib/python3.10/site-packages/pkg/losses.py", "loss = compute_loss(model, batch)"),
    ("/w/train.py", "loss_fn = get_loss_fn(args)"),
])
def test_a_loss_in_a_library_or_a_loss_function_chosen_is_not(path, source):
    text = HEAD + frame(path, 10, "f", source) + "KeyError: 'x'\n"
    assert phase(text) == "unknown"


def test_importing_the_network_module_is_start_up():
    text = (HEAD + frame("/w/train_network.py", 990, "<module>", "trainer.train(args)")
            + frame("/w/train_network.py", 227, "train", "network_module = importlib.import_module(args.network_module)")
            + frame("/usr/lib/python3.10/importlib/__init__.py", 126, "import_module",
                    "return _bootstrap._gcd_import(name[level:], package, level)")
            + "ModuleNotFoundError: No module named 'lycoris'\n")
    assert phase(text) == "model_load"


@pytest.mark.parametrize("source", ["dataset = datasets.load_from_disk(", "ds = load_from_disk(args.data_dir)"])
def test_a_dataset_read_from_disk_is_start_up(source):
    text = (HEAD + frame("/w/train_text_to_image.py", 305, "train", source)
            + frame("/opt/conda/lib/python3.8/site-packages/datasets/load.py", 1886, "load_from_disk",
                    'raise FileNotFoundError(f"Directory {dataset_path} not found")')
            + "FileNotFoundError: Directory lambdalabs/pokemon-blip-captions not found\n")
    assert phase(text) == "model_load"


@pytest.mark.parametrize("line", [
    "Downloading data files: 100%|██████████████████████████",
    "Downloading data: 100%|███████████████████████████████| 467M/467M [00:26<00:00, 17.4MB/s]",
    "Generating train split: 2 examples [00:00, 40.20 examples/s]",
    "Extracting data files: 100%|██████████| 1/1 [00:00<00:00, 1.00it/s]",
])
def test_the_datasets_library_fetching_a_dataset_is_start_up(line):
    assert phase(line + "\n") == "model_load"


@pytest.mark.parametrize("line", ["Downloading data to the cache is slow", "Generating train images for fun"])
def test_other_downloads_and_generations_are_not(line):
    assert phase(line + "\n") != "model_load"


def _box(rows: list[str]) -> str:
    top = "╭" + "─" * 31 + " Traceback (most recent call last) " + "─" * 32 + "╮\n"
    return top + "".join(box_row(r) for r in rows)


@pytest.mark.parametrize("script", ["/content/kohya-trainer/train_network.py", "C:\\lora\\sdxl_train.py"])
def test_a_rich_box_cut_in_a_training_scripts_imports_is_start_up(script):
    text = _box([f"{script}:17 in <module>", "", "   16", "❱  17 import library.train_util as train_util",
                 "   18 from library.train_util import (", "",
                 "/content/kohya-trainer/library/train_util.py:1861 in <module>", ""])
    assert phase(text) == "model_load"


def test_a_rich_box_cut_in_a_guis_imports_is_not():
    text = _box(["/w/kohya_gui.py:5 in <module>", "", "❱   5 import gradio as gr", "",
                 "/v/lib/python3.10/site-packages/gradio/__init__.py:3 in <module>", ""])
    assert phase(text) != "model_load"


def test_a_rich_box_at_a_training_scripts_call_is_not_its_imports():
    text = _box(["/w/train_network.py:990 in <module>", "", "❱ 990 │   trainer.train(args)", "",
                 "/v/lib/python3.10/site-packages/torch/nn/modules/module.py:1501 in _call_impl", ""])
    assert phase(text) != "model_load"


@pytest.mark.parametrize("entry", ["E:\\k\\venv\\Scripts\\accelerate.exe\\__main__.py", "/usr/local/bin/accelerate",
                                   "/opt/venv/bin/torchrun"])
def test_the_launcher_failing_at_its_imports_is_start_up(entry):
    text = (HEAD + frame(entry, 4, "<module>")
            + frame("E:\\k\\venv\\lib\\site-packages\\accelerate\\__init__.py", 7, "<module>",
                    "from .accelerator import Accelerator")
            + frame("E:\\k\\venv\\lib\\site-packages\\torch\\__init__.py", 129, "<module>", "raise err")
            + 'OSError: [WinError 127] The specified procedure could not be found. Error loading "E:\\k\\venv\\'
              'lib\\site-packages\\torch\\lib\\cudnn_adv_infer64_8.dll" or one of its dependencies.\n')
    assert phase(text) == "model_load"


@pytest.mark.parametrize("func, source", [
    ("simple_launcher", "mixed_precision = PrecisionType(args.mixed_precision.lower())"),
    ("_validate_launch_command", "if args.num_processes is None:"),
])
def test_the_launcher_reading_its_settings_is_start_up(func, source):
    text = (HEAD + frame("/usr/local/bin/accelerate-launch", 8, "<module>", "sys.exit(main())")
            + frame("/usr/local/lib/python3.7/dist-packages/accelerate/commands/launch.py", 684, "launch_command",
                    "simple_launcher(args)")
            + frame("/usr/local/lib/python3.7/dist-packages/accelerate/commands/launch.py", 280, func, source)
            + "AttributeError: 'NoneType' object has no attribute 'lower'\n")
    assert phase(text) == "model_load"


@pytest.mark.parametrize("source", [
    "num_train_epochs = math.ceil(config.run.max_train_steps / num_update_steps_per_epoch)",
    "[rank0]:     num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)",
    "args.num_train_epochs = math.ceil(args.max_train_steps / num_update_steps_per_epoch)",
])
def test_a_script_working_out_its_epochs_is_start_up(source):
    text = (HEAD + frame("/w/scripts/train_unet.py", 518, "<module>", "main(config)")
            + frame("/w/scripts/train_unet.py", 235, "main", source) + "ZeroDivisionError: division by zero\n")
    assert phase(text) == "model_load"


def test_an_epoch_count_read_from_the_arguments_is_not_that():
    text = HEAD + frame("/w/lib/util.py", 20, "helper", "num_train_epochs = args.epochs") + "KeyError: 'e'\n"
    assert phase(text) == "unknown"


@pytest.mark.parametrize("line", ["[2024-11-21 08:39:44] Training configuration:", "Training Configuration",
                                  "[21:28:22] [train]                               Training Configuration",
                                  "Training arguments:"])
def test_a_printed_training_configuration_is_start_up(line):
    assert phase(line + "\n") == "model_load"


@pytest.mark.parametrize("line", ["Training configuration saved to out/config.json",
                                  "training settings are wrong, see above"])
def test_other_words_about_a_configuration_are_not(line):
    assert phase(line + "\n") != "model_load"


@pytest.mark.parametrize("rank", [0, 3])
def test_the_ranks_first_barrier_is_start_up(rank):
    line = (f"[rank{rank}]:[W1211 15:03:01.691333399 ProcessGroupNCCL.cpp:4115] [PG ID 0 PG GUID 0 Rank {rank}]  "
            f"using GPU {rank} to perform barrier as devices used by this process are currently unknown. This can "
            "potentially cause a hang if this rank to GPU mapping is incorrect.")
    assert phase(line + "\n") == "model_load"


@pytest.mark.parametrize("line", ["Initializing model with random weights",
                                  "Setting up [LPIPS] perceptual loss: trunk [vgg], v[0.1], spatial [off]"])
def test_a_model_built_before_training_is_start_up(line):
    assert phase(line + "\n") == "model_load"


@pytest.mark.parametrize("line", ["Initializing model parallel groups done", "LPIPS loss: 0.123"])
def test_other_words_about_models_and_lpips_are_not(line):
    assert phase(line + "\n") != "model_load"


@pytest.mark.parametrize("line", ["2023-04-17 13:21:24.842 | INFO     | __main__:save_model:507 - Saved state, step: 600",
                                  "Saved training state to out/state-600", "saved accelerator state"])
def test_a_saved_state_is_saving(line):
    assert phase(BAR + line + "\n") == "saving"


@pytest.mark.parametrize("line", ["Saved state_dict keys: 12", "Saved statements: 3"])
def test_other_saved_words_are_not(line):
    assert phase(BAR + line + "\n") != "saving"


@pytest.mark.parametrize("line", ["Saved validation video output to /out/val_video_10000.mp4",
                                  "Saving validation images to /out/val",
                                  "Moviepy - Building video ./exp_output/stage2/validation/1_1_1.mp4.",
                                  "MoviePy - Writing video out/valid/3.mp4"])
def test_a_validation_video_or_image_written_is_sampling(line):
    assert phase(BAR + line + "\n") == "sampling"


@pytest.mark.parametrize("line", ["Moviepy - Building video ./exp_output/final.mp4.", "Saved validation loss 0.3"])
def test_other_videos_and_validation_records_are_not(line):
    assert phase(BAR + line + "\n") != "sampling"


@pytest.mark.parametrize("line", [
    "save processed image to D:\\sd\\outputs/easyphoto-user-id-infos\\a\\processed_images\\train\\3.jpg",
    "INFO     | 2024-11-25 22:46:05 | autotrain.preprocessor.dreambooth:_save_concept_images:87 - Saving concept "
    "images",
    "Saving preprocessed images to /data/pre",
])
def test_training_images_prepared_are_start_up(line):
    assert phase(line + "\n") == "model_load"


@pytest.mark.parametrize("line", [
    "2023-09-04 22:06:27,428 - modelscope - INFO - initiate model from C:\\Users\\f\\.cache\\modelscope\\hub\\damo",
    "find model: E:\\sd\\models\\buffalo_l\\det_10g.onnx detection [1, 3, '?', '?'] 127.5 128.0",
])
def test_a_model_library_loading_its_models_is_start_up(line):
    assert phase(line + "\n") == "model_load"


@pytest.mark.parametrize("line", ["find model: none found", "initiate modelling later"])
def test_other_find_and_initiate_lines_are_not(line):
    assert phase(line + "\n") != "model_load"


@pytest.mark.parametrize("source", ["scheduler.apply(optimizer, embedding.step)",
                                    "scheduler.apply(optimizer, hypernetwork.step)"])
def test_the_web_uis_loop_setting_its_learning_rate_is_the_step(source):
    text = (HEAD + frame("C:\\sd\\modules\\textual_inversion\\textual_inversion.py", 315, "train_embedding", source)
            + frame("C:\\sd\\modules\\textual_inversion\\learn_schedule.py", 62, "apply",
                    "if step_number < self.end_step:")
            + "TypeError: '<' not supported between instances of 'NoneType' and 'int'\n")
    assert phase(text) in ("first_step", "training")
