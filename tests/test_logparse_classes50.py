"""Round 50, behind batches 130 to 137's misses: sd-scripts creating and applying its network's modules, a
notebook starting one model's training, errors that only a training step raises, latent-diffusion's loss, and the
web UI creating the embedding or hypernetwork it will train. Several forms each, and text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text


@pytest.mark.parametrize("line", [
    "INFO     create LoRA for Text Encoder 1: 72 modules.   lora_flux.py:946",
    "create LoRA for U-Net: 192 modules.",
    "INFO     enable LoRA for U-Net: 304 modules   lora_flux.py:1147",
    "enable LoRA for text encoder",
])
def test_sd_scripts_creating_its_network_is_start_up(line):
    d = diagnose(parse_text(line + "\n"))
    assert d.outcome == "incomplete" and d.phase == "model_load"


@pytest.mark.parametrize("line", [
    "Training the UNet...",
    "Training the text encoder...",
    "Training the U-Net with 8bit Adam",
])
def test_a_notebook_starting_one_models_training_is_its_header(line):
    # The training-header clause: a header with no sign of the loop after it is still start-up; a bar after it
    # is the loop's.
    assert diagnose(parse_text(line + "\n")).phase == "model_load"
    d = diagnose(parse_text(line + "\nsteps:   5%|▌         | 5/100 [00:05<01:35,  1.00it/s]\n"))
    assert d.phase == "training" and d.step == 5


@pytest.mark.parametrize("line", [
    "Training the model took 3 hours last time, so be patient.",
    "training theory notes",
])
def test_other_lines_about_training_are_no_header(line):
    d = diagnose(parse_text(line + "\n"))
    assert not (d.details.last_milestone == "running training")


@pytest.mark.parametrize("error", [
    "RuntimeError: Trying to backward through the graph a second time (or directly access saved tensors after they "
    "have already been freed).",
    "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one. This error "
    "indicates that your module has parameters that were not used in producing loss.",
])
def test_an_error_only_a_training_step_raises_names_the_step(error):
    d = diagnose(parse_text(error + "\n"))
    assert d.outcome == "error" and d.phase in ("first_step", "training")


def test_the_same_words_in_another_error_are_not_the_step():
    d = diagnose(parse_text("RuntimeError: Expected to have finished loading the dataset\n"))
    assert d.phase not in ("first_step", "training")


@pytest.mark.parametrize("frame", [
    ('  File "/home/u/ldm/models/diffusion/ddpm.py", line 885, in p_losses\n'
     "    x_noisy = self.q_sample(x_start=x_start, t=t, noise=noise)\n"),
    ('  File "/home/u/ldm/models/diffusion/ddpm.py", line 360, in forward\n'
     "    return self.p_losses(x, t, *args, **kwargs)\n"),
])
def test_latent_diffusions_loss_is_the_step(frame):
    text = ("Traceback (most recent call last):\n" + frame +
            '  File "/home/u/ldm/models/diffusion/ddpm.py", line 420, in q_sample\n'
            "    return (extract_into_tensor(self.sqrt_alphas_cumprod, t, x_start.shape) * x_start)\n"
            "RuntimeError: The size of tensor a (64) must match the size of tensor b (32)\n")
    assert diagnose(parse_text(text)).phase in ("first_step", "training")


def test_a_function_that_merely_ends_in_p_losses_is_not_it():
    text = ("Traceback (most recent call last):\n"
            '  File "/home/u/tool/report.py", line 10, in <module>\n'
            "    print(summarise_dp_losses(history))\n"
            "KeyError: 'loss'\n")
    assert diagnose(parse_text(text)).phase not in ("first_step", "training")


@pytest.mark.parametrize("func", ["create_embedding", "create_hypernetwork"])
def test_the_web_ui_creating_what_it_will_train_is_start_up(func):
    folder = "textual_inversion" if func == "create_embedding" else "hypernetworks"
    text = ("Traceback (most recent call last):\n"
            '  File "/content/stable-diffusion-webui/modules/call_queue.py", line 57, in f\n'
            "    res = list(func(*args, **kwargs))\n"
            f'  File "/content/stable-diffusion-webui/modules/{folder}/ui.py", line 11, in {func}\n'
            f"    filename = modules.{folder}.{func}(name, nvpt, overwrite_old)\n"
            "RuntimeError: shape mismatch\n")
    d = diagnose(parse_text(text))
    assert d.outcome == "error" and d.phase == "model_load"


def test_a_function_creating_something_else_in_the_ui_is_not_it():
    text = ("Traceback (most recent call last):\n"
            '  File "/content/stable-diffusion-webui/modules/textual_inversion/ui.py", line 11, in create_preview\n'
            "    image = make_grid(images)\n"
            "RuntimeError: shape mismatch\n")
    assert diagnose(parse_text(text)).phase != "model_load"


@pytest.mark.parametrize("frames", [
    ('  File "<ipython-input-3-1b2c>", line 219, in install_dependencies\n'
     "    from accelerate.utils import write_basic_config\n"),
    ('  File "/content/notebook.py", line 300, in main\n'
     "    install_requirements(args)\n"),
    ("│ /content/setup_job.py:42 in check_dependencies                                      │\n"),
])
def test_a_notebook_installing_the_jobs_dependencies_is_start_up(frames):
    text = "Traceback (most recent call last):\n" + frames + "ModuleNotFoundError: No module named 'accelerate'\n"
    d = diagnose(parse_text(text))
    assert d.outcome == "error" and d.phase == "model_load"


def test_a_function_that_merely_names_dependencies_is_not_an_install():
    text = ("Traceback (most recent call last):\n"
            '  File "/home/u/proj/train.py", line 50, in step\n'
            "    graph = check_dependencies_graph(model)\n"
            "KeyError: 'x'\n")
    assert diagnose(parse_text(text)).phase != "model_load"
