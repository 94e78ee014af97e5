"""Classes behind batches 50 to 53's first-read misses: IPython's traceback header with the exception's name
first; OneTrainer's model loaders and their mixins; a launcher run from a prompt, cut before its script; a
command wrapped with backslashes; a model's weight file the error says is missing; the scheduler built; sample
images logged to a tracker; a dataset built by the datasets library or attached by Lightning; a function given
the batch and the step, and Lightning's per-batch hook; a header naming the kind of training; a class name in
mixed case before its figures; an installed library's `start_training`; the web UI's training tab in a Rich
box. Several forms of each, and text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from kohya_tuner.logparse.cleaning import clean
from tests.logparse_texts import BAR, CACHING, HEAD, box_row, frame, phase


@pytest.mark.parametrize("exc", ["AttributeError", "torch.OutOfMemoryError", "RuntimeError"])
def test_ipythons_header_with_the_exception_first_opens_a_traceback(exc):
    text = (f"{exc}                            Traceback (most recent call last)\n"
            "<ipython-input-20-325883ee7544> in training_function(text_encoder, vae, unet)\n"
            "     61             with accelerator.accumulate(text_encoder):\n"
            '---> 63                 latents = vae.encode(batch["pixel_values"]).sample().detach()\n'
            "     64                 latents = latents * 0.18215\n\n"
            f"{exc.rsplit('.', 1)[-1]}: bad\n")
    assert phase(text) == "first_step"


def test_the_header_named_in_a_sentence_opens_nothing():
    text = BAR + "see the Traceback (most recent call last) above\n" + 'latents = vae.encode(batch["x"])\n'
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase) == ("incomplete", "training")


@pytest.mark.parametrize("path", ["modules\\modelLoader\\IdeogramModelLoader.py",
                                  "modules/modelLoader/mixin/HFModelLoaderMixin.py",
                                  "modules/modelLoader/flux/FluxModelLoader.py"])
def test_onetrainers_model_loaders_are_start_up(path):
    text = HEAD + frame(f"F:\\OneTrainer\\{path}" if "\\" in path else f"/w/OneTrainer/{path}", 74, "load",
                        "text_encoder = self._load_sub_module(")
    assert phase(text) == "model_load"


@pytest.mark.parametrize("line", [
    "(musubi-tuner) root@89cf584b1fa1:~/musubi-tuner# accelerate launch --mixed_precision bf16 wan_",
    "user@host:~/sd$ torchrun --nproc_per_node 2 flu",
    "(venv) C:\\kohya>accelerate launch --num_cpu_threads_per_process 1 sdxl_",
])
def test_a_launcher_run_from_a_prompt_and_cut_is_the_launch(line):
    assert phase(CACHING + line + "\n") == "model_load"


@pytest.mark.parametrize("line", ["I ran accelerate launch yesterday and it worked",
                                  "the launcher (torchrun) restarted the worker"])
def test_a_launcher_named_in_words_is_no_launch(line):
    assert phase(BAR + line + "\n") == "training"


@pytest.mark.parametrize("script, expected", [("ltx2_cache_text_encoder_outputs.py", "cache_text_encoder"),
                                              ("wan_cache_latents.py", "cache_latents"),
                                              ("flux_train_network.py", "model_load")])
def test_a_command_wrapped_with_backslashes_names_its_script(script, expected):
    text = f"accelerate launch \\\n        ~/musubi-tuner/{script} \\\n        --dataset_config d.toml\n"
    assert phase(text) == expected


@pytest.mark.parametrize("line", [
    "OSError: CompVis/stable-diffusion-v1-4 does not appear to have a file named flax_model.msgpack or pytorch_model.bin.",
    "EnvironmentError: /m/unet does not appear to have a file named diffusion_pytorch_model.bin",
])
def test_a_weight_file_the_error_says_is_missing_is_the_model_loading(line):
    assert phase(line + "\n") == "model_load"


@pytest.mark.parametrize("source", ["lr_scheduler = train_util.get_scheduler_fix(args, optimizer, n)",
                                    "lr_scheduler = get_scheduler(args.lr_scheduler, optimizer=optimizer)"])
def test_the_scheduler_being_built_is_start_up(source):
    text = HEAD + frame("/w/train_network.py", 376, "train", source) + "IndexError: list index out of range\n"
    assert phase(text) == "model_load"


def test_the_scheduler_stepping_is_not_built():
    text = BAR + HEAD + frame("/w/train_network.py", 900, "train", "lr_scheduler.step()") + "RuntimeError: x\n"
    assert phase(text) != "model_load"


@pytest.mark.parametrize("source, func", [("accelerator.trackers[0].writer.add_images(", "main"),
                                          ("images = pl_module.log_images(batch, split=split)", "log_img"),
                                          ("samples_cfg, _ = self.sample_log(cond=c)", "log_images")])
def test_sample_images_logged_to_a_tracker_are_sampling(source, func):
    text = BAR + HEAD + frame("/w/train.py", 174, func, source) + "TypeError: x\n"
    assert phase(text) == "sampling"


def test_logging_the_loss_is_not_sampling():
    text = BAR + HEAD + frame("/w/train.py", 174, "training_step", 'self.log("loss", loss)') + "TypeError: x\n"
    assert phase(text) != "sampling"


@pytest.mark.parametrize("rows", [
    [("/w/train.py", 500, "main", 'dataset = load_dataset("imagefolder", data_dir=args.train_data_dir)')],
    [("/v/lib/site-packages/datasets/builder.py", 1000, "_prepare_split", "for key, record in gen:")],
    [("/w/main.py", 729, "<module>", "trainer.fit(model, data)"),
     ("/v/lib/site-packages/pytorch_lightning/trainer/connectors/data_connector.py", 80, "attach_datamodule",
      "if is_overridden('val_dataloader', datamodule):")],
])
def test_a_dataset_built_or_attached_is_start_up(rows):
    text = HEAD + "".join(frame(*r) for r in rows) + "ValueError: x\n"
    assert phase(text) == "model_load"


@pytest.mark.parametrize("source", ["loss_spatial, latents = finetune_unet(batch, step, mask=None)",
                                    "out = self.train_on(batch, global_step)"])
def test_a_function_given_the_batch_and_the_step_is_the_step(source):
    text = HEAD + frame("/w/MotionDirector_train.py", 912, "main", source) + "ValueError: No lora injected.\n"
    assert phase(text) == "first_step"


def test_lightnings_per_batch_hook_named_by_the_error_is_the_step():
    line = ("TypeError: ControlLDM.on_train_batch_start() missing 1 required positional argument: "
            "'dataloader_idx'\n")
    assert phase(line) == "first_step"


@pytest.mark.parametrize("source", ["x = resize(batch, stepsize)", "print(batch_size, step)"])
def test_other_calls_with_a_batch_are_not(source):
    assert phase(HEAD + frame("/w/train.py", 9, "main", source) + "ValueError: x\n") != "first_step"


@pytest.mark.parametrize("line", ["Starting Dreambooth training...", "Start LoRA training", "Beginning fine-tune training"])
def test_a_header_naming_the_kind_of_training_is_the_header(line):
    assert phase(line + "\n") == "model_load"  # nothing after it: the loop had not begun
    assert phase(line + "\n" + BAR) == "training"


@pytest.mark.parametrize("line", ["Starting training data preparation", "Start LoRA training config check"])
def test_a_header_followed_by_other_words_is_not(line):
    d = diagnose(parse_text(BAR + line + "\n"))
    assert d.phase == "training"  # nothing moved the run back to its start


def test_a_class_named_in_mixed_case_before_its_figures_is_no_host():
    assert clean("UNet2DConditionModel: 64, 8, 768, False, False") == "UNet2DConditionModel: 64, 8, 768, False, False"
    assert clean("node01: hello") == "hello"
    assert clean("worker-0: hello") == "hello"
    assert phase("INFO     UNet2DConditionModel: 64, 8, 768\n") == "model_load"


def test_an_installed_librarys_start_training_is_the_fit_not_the_jobs_entry():
    lib = "/v/lib/site-packages/pytorch_lightning"
    text = (HEAD + frame("main.py", 719, "<module>", "trainer.fit(model, data)")
            + frame(f"{lib}/accelerators/accelerator.py", 92, "start_training", "self.plugin.start_training(t)")
            + frame(f"{lib}/trainer/trainer.py", 1045, "_run_train", "self.fit_loop.run()")
            + frame(f"{lib}/loops/base.py", 111, "run", "self.advance(*args, **kwargs)") + "RuntimeError: x\n")
    assert phase(text) == "first_step"
    own = HEAD + frame("/w/extensions/db/dreambooth/ui_functions.py", 700, "start_training", "x = y") + "KeyError: k\n"
    assert phase(own) == "model_load"


def test_the_web_uis_training_tab_in_a_rich_box_is_start_up():
    text = ("ERROR    gradio call: KeyError\n╭──── Traceback (most recent call last) ────╮\n"
            + box_row("/app/modules/call_queue.py:33 in f") + box_row("❱ 33 │ res = func(*args, **kwargs)")
            + box_row("/app/modules/hypernetworks/ui.py:27 in train_hypernetwork")
            + box_row("  26 │ def train_hypernetwork(*args):"))
    assert phase(text) == "model_load"
