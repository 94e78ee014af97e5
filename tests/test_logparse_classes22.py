"""Classes behind batches 29 and 30's first-read misses: a launch command a Windows console echoes
after its prompt, with `launch` quoted; a host printing only the training script it runs; a job's
`start_training` entry checking its settings; an object's constructor refusing an argument; DeepSpeed's
progress record at step 0, printed as its engine is built. Several forms of each, and text that must
not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from tests.logparse_texts import HEAD, OOM, frame, phase


@pytest.mark.parametrize("line", [
    '(ST) C:\\Users\\me\\StableTuner>accelerate "launch" "--mixed_precision=fp16" "scripts/trainer.py" "--seed=1"',
    "(venv) D:\\kohya>accelerate launch --num_cpu_threads_per_process=2 train_network.py --config_file x.toml",
    'C:\\sd>python "train.py" --resolution=768',
])
def test_a_command_echoed_after_a_windows_prompt_starts_the_job(line):
    assert phase(line + "\n" + OOM) == "model_load"
    assert phase(line + "\n") == "model_load"


@pytest.mark.parametrize("line", [
    "/home/user/ComfyUI/custom_nodes/Lora-Training-in-Comfy/sd-scripts/train_network.py",
    "train_network.py",
    "D:\\ComfyUI\\custom_nodes\\trainer\\sdxl_train_network.py",
])
def test_a_host_printing_the_training_script_it_runs(line):
    assert phase("got prompt\n" + line + "\nTrain finished\nPrompt executed in 17.67 seconds\n") == "model_load"


@pytest.mark.parametrize("line", ["/home/user/ComfyUI/custom_nodes/x/nodes.py", "utils.py", "see train_network.py for"])
def test_other_script_paths_are_not(line):
    assert phase(line + "\n" + OOM) == "unknown"


@pytest.mark.parametrize("source", ["if config.resolution <= 0:", "model_dir = get_model_dir(config)"])
def test_a_jobs_start_training_entry_is_start_up(source):
    text = (HEAD + frame("/webui/extensions/sd_dreambooth_extension/dreambooth/ui_functions.py", 697,
                         "start_training", source) + "TypeError: '<=' not supported between 'str' and 'int'\n")
    assert phase(text) == "model_load"


def test_start_training_gives_way_to_the_loop_it_calls():
    text = (HEAD + frame("/ext/dreambooth/ui_functions.py", 720, "start_training", "result = main(use_txt2img)")
            + frame("/ext/dreambooth/train_dreambooth.py", 1500, "inner_loop", "accelerator.backward(loss)") + OOM)
    assert phase(text) in ("first_step", "training")


@pytest.mark.parametrize("line", [
    "TypeError: Accelerator.__init__() got an unexpected keyword argument 'logging_dir'",
    "TypeError: LoRANetwork.__init__() missing 1 required positional argument: 'unet'",
])
def test_a_constructor_refusing_its_arguments_is_start_up(line):
    assert phase("Traceback (most recent call last):\n" + line + "\n") == "model_load"


@pytest.mark.parametrize("prefix", ["[2025-03-16 19:15:34,349] [INFO] [logging.py:128:log_dist] [Rank 0] ", ""])
def test_deepspeeds_step_0_record_is_its_engine_built(prefix):
    d = diagnose(parse_text(prefix + "step=0, skipped=0, lr=[0.0001], mom=[0.0]\n" + OOM))
    assert (d.phase, d.step) == ("model_load", None)


def test_deepspeeds_later_records_count_steps():
    d = diagnose(parse_text("[Rank 0] step=10, skipped=0, lr=[0.0001], mom=[0.0]\n" + OOM))
    assert (d.phase, d.step) == ("training", 10)
