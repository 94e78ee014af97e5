"""The start-up convention: everything a job does before its first step, other than a caching pass, is
start-up (`model_load`); `unknown` only where the text shows no stage of the job. Each class of line or
frame that shows a start-up stage, with lines that must not be read as one."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from kohya_tuner.logparse.events import Milestone
from tests.logparse_texts import BAR, CACHED, HEAD, OOM, frame, phase

_ERR = "RuntimeError: something broke\n"


def _milestone(text: str) -> str | None:
    names = [e.name for e in parse_text(text) if isinstance(e, Milestone)]
    return names[-1] if names else None


# ---- record formats: the kohya_ss GUI's time column, Rich's columns with their padding squeezed ------

@pytest.mark.parametrize("line, name", [
    ("09:55:45-597461 INFO     Loading settings from /cfg/x.toml...", "start"),
    ("00:31:52-092848 INFO     Saving training config to F:/out/x.json...", "writing the job's settings"),
    ("09:55:45-590319 WARNING  Validating lr scheduler arguments...", "checking the job's settings"),
    ("23:59:59-000001 ERROR    Loading settings from /cfg/y.toml", "start"),
])
def test_the_kohya_ss_gui_time_column_starts_a_record(line, name):
    assert _milestone(line + "\n") == name


@pytest.mark.parametrize("line", [
    "09:55:45-597461 Loading settings from /cfg/x.toml",  # no level after the time
    "09:55:45 INFO     Loading settings from /cfg/x.toml",  # no microseconds: not that column
])
def test_a_time_without_the_gui_column_is_not_stripped(line):
    assert _milestone(line + "\n") is None


@pytest.mark.parametrize("line", [
    "2025-06-12 20:27:51 INFO Loading settings from /w/config.toml... train_util.py:4651",
    " INFO Loading settings from /w/config.toml... train_util.py:4651",
    "2025-06-12 20:27:51 WARNING Loading settings from /w/config.toml train_util.py:4651",
])
def test_rich_records_with_squeezed_padding_are_read(line):
    assert _milestone(line + "\n") == "start"


@pytest.mark.parametrize("line", [
    " INFO prepare images.",  # no source column: not a Rich record, so not read past its level
    " WARNING prepare images.",
])
def test_an_indented_level_without_the_source_column_is_no_rich_record(line):
    assert _milestone(line + "\n") is None


# ---- lines that show a start-up stage ----------------------------------------------------------------

@pytest.mark.parametrize("line, name", [
    # the dataset being read
    ("prepare images.", "reading the dataset"),
    ("make buckets", "reading the dataset"),
    ("found directory /data/img/10_sks contains 24 image files", "reading the dataset"),
    ("240 train images with repeating.", "reading the dataset"),
    ("26 train images with repeats.", "reading the dataset"),
    ("Found 24 images", "reading the dataset"),
    ("loaded 1,200 training images", "reading the dataset"),
    ("Folder 10_sks: 24 images found", "reading the dataset"),
    ("bucket 0: resolution (512, 512), count: 24", "reading the dataset"),
    ("bucket: (1088, 960), count: 10", "reading the dataset"),
    # the arguments and the configuration
    ("prepare tokenizer", "reading the arguments"),
    ("update token length: 225", "reading the arguments"),
    ("Namespace(output_dir='out', learning_rate=0.0001)", "reading the arguments"),
    ("Loaded configuration from config/config.json", "reading the job's configuration"),
    ("[CONFIG.JSON] Loaded configuration from config/config.json", "reading the job's configuration"),
    ("Load dataset config from /w/dataset.toml", "reading the job's configuration"),
    ("Using json configuration backend.", "reading the job's configuration"),
    ("Reading config file settings.yaml", "reading the job's configuration"),
    # a GUI or a job runner starting the job
    ("Start training LoRA Standard ...", "the GUI starting the job"),
    ("Start training Dreambooth...", "the GUI starting the job"),
    ("Starting training textual inversion", "the GUI starting the job"),
    ("Validating lr scheduler arguments...", "checking the job's settings"),
    ("Validating that all required paths exist...", "checking the job's settings"),
    ("Regulatization factor: 2", "checking the job's settings"),
    ("max_train_steps (260 / 1 / 1.0 * 10 * 2) = 5200", "checking the job's settings"),
    ("Saving training config to /out/last.json...", "writing the job's settings"),
    ("Running 1 job", "starting the job"),
    ("Initializing dreambooth training...", "setting a training run up"),
    # a launcher starting its processes
    ("[launch.py:146:main] WORLD INFO DICT: {'localhost': [0]}", "the launcher starting its processes"),
    ("nnodes=1, num_local_procs=1, node_rank=0", "the launcher starting its processes"),
    ("cmd = /usr/bin/python3 -u -m deepspeed.launcher.launch --world_info=eyJsb2NhbGhvc3QiOiBbMF19 train.py",
     "the launcher starting its processes"),
])
def test_a_start_up_line_after_caching_is_start_up_again(line, name):
    text = CACHED + line + "\n"
    assert _milestone(text) == name
    d = diagnose(parse_text(text + _ERR))
    assert d.phase == "model_load"


@pytest.mark.parametrize("line, not_phase", [
    ("Generated 4 images", "model_load"),  # a count of images made, not found
    ("Validating at step 100", "model_load"),  # a validation pass names no settings
    ("Validating model on 4 prompts", "model_load"),
    ("Saving checkpoint to /out/x.safetensors", "model_load"),
    ("Aspect bucket 1.0 encoding 40 images", "model_load"),  # the VAE pass over a bucket
    ("Starting training...", "model_load"),  # a trainer's own start of its steps
    ("Start training", "model_load"),
    ("config saved", "model_load"),
])
def test_lines_of_other_stages_are_not_start_up(line, not_phase):
    assert phase(BAR + line + "\n" + OOM) != not_phase


def test_a_printed_argument_mapping_is_start_up():
    args = ("{'output_dir': 'out', 'output_name': 'x', 'save_every_n_epochs': 1, 'save_state': False, "
            "'network_dim': 16, 'learning_rate': 0.0001}")
    assert _milestone(CACHED + args + "\n") == "the job's settings printed"
    # The tail of one, the start cut off (a paste that starts mid-line).
    tail = "k_dropout': 0.0, 'network_args': None, 'training_comment': None, 'save_last_n_steps': None, 'metadata_title': None"
    assert _milestone(CACHED + tail + "\n") == "the job's settings printed"


@pytest.mark.parametrize("line", [
    "{'loss': 0.5, 'grad_norm': 1.2, 'learning_rate': 0.0001, 'epoch': 0.1}",  # a Trainer's metrics
    "{'a_b': 1, 'c_d': 2, 'e_f': 3, 'g_h': 4}",  # no argument's name
])
def test_a_mapping_of_other_keys_is_not_the_arguments(line):
    assert phase(BAR + line + "\n" + OOM) == "training"


# ---- an error alone that names a start-up stage --------------------------------------------------------

@pytest.mark.parametrize("line", [
    "ModuleNotFoundError: No module named 'library'",
    "ImportError: cannot import name 'Foo' from 'diffusers' (/venv/lib/diffusers/__init__.py)",
    "ModuleNotFoundError: No module named 'safetensors_rust'",
])
def test_a_module_missing_at_import_alone_is_start_up(line):
    assert phase(line + "\n") == "model_load"


def test_a_module_missing_after_steps_is_the_step():
    assert phase(BAR + "ModuleNotFoundError: No module named 'foo'\n") == "training"


def test_a_module_missing_in_a_gui_that_is_not_a_training_script_says_no_phase():
    text = HEAD + frame("D:\\gui\\app.py", 17, "<module>", "import train_network") + \
        "ModuleNotFoundError: No module named 'train_network'\n"
    assert phase(text) == "unknown"


def test_a_spawned_childs_failed_import_says_no_phase():
    text = (HEAD + frame("<string>", 1, "<module>")
            + frame("C:\\Python310\\lib\\multiprocessing\\spawn.py", 116, "spawn_main")
            + frame("C:\\Python310\\lib\\multiprocessing\\spawn.py", 289, "_fixup_main_from_path")
            + frame("C:\\sd\\train_network.py", 8, "<module>", "import torch")
            + "ImportError: DLL load failed while importing _C: The paging file is too small\n")
    assert phase(text) == "unknown"


@pytest.mark.parametrize("text", [
    _ERR,
    "subprocess.CalledProcessError: Command '['python', 'train.py']' returned non-zero exit status 1.\n",
    OOM,
])
def test_an_error_alone_that_names_no_stage_says_no_phase(text):
    assert phase(text) == "unknown"


# ---- a GUI's own frames: it trains in a child process ----------------------------------------------------

@pytest.mark.parametrize("frames", [
    frame("/app/fluxgym/app.py", 405, "gen_sh", "if len(sample_prompts) > 0 and sample_every_n_steps > 0:"),
    frame("/app/fluxgym/app.py", 360, "start_training", "sh = gen_sh(base_model, output_name)"),
    frame("C:\\kohya_ss\\kohya_gui\\lora_gui.py", 422, "train_model", "run_cmd = [...]"),
    frame("/kohya_ss/lora_gui.py", 700, "train_model"),
])
def test_a_gui_setting_the_job_up_is_start_up(frames):
    text = HEAD + frame("/venv/lib/gradio/routes.py", 300, "run_predict") + frames + \
        "TypeError: '>' not supported between instances of 'NoneType' and 'int'\n"
    assert phase(text) == "model_load"


def test_a_gui_named_file_that_is_not_kohya_ss_is_no_evidence():
    text = HEAD + frame("/apps/my_gui.py", 10, "render") + _ERR
    assert phase(text) == "unknown"


# ---- a caching script's own start-up is its pass ------------------------------------------------------------

@pytest.mark.parametrize("start", [
    "python src/musubi_tuner/wan_cache_latents.py --dataset_config d.toml --vae v.safetensors\n",
    "INFO:musubi_tuner.ltx2_cache_latents:Load dataset config from dataset.toml\n",
])
@pytest.mark.parametrize("then", [
    "Found 5 images\n",
    "prepare images.\n",
    "Loading VAE from v.safetensors\n",
])
def test_a_caching_scripts_dataset_and_model_are_its_pass(start, then):
    assert phase(start + then + _ERR) == "cache_latents"


def test_a_training_script_launched_after_a_caching_script_starts_afresh():
    text = ("python src/musubi_tuner/wan_cache_latents.py --dataset_config d.toml\n"
            "Found 5 images\n"
            "accelerate launch src/musubi_tuner/wan_train_network.py --dataset_config d.toml\n"
            "Found 5 images\n" + _ERR)
    assert phase(text) == "model_load"


def test_in_a_trainer_a_dataset_pass_after_caching_is_start_up():
    # Caching named by the trainer's own line, not by a caching script: what follows is its start-up.
    assert phase("caching latents.\nFound 5 images\n" + _ERR) == "model_load"


# ---- a launcher's report, then the GUI setting its next job up ---------------------------------------------

_LAUNCHER = (HEAD + frame("/venv/lib/accelerate/commands/launch.py", 637, "simple_launcher",
                          "raise subprocess.CalledProcessError(returncode=process.returncode, cmd=cmd)")
             + "subprocess.CalledProcessError: Command '['python', 'train_network.py']' returned non-zero exit "
               "status 1.\n")


@pytest.mark.parametrize("after", [
    "09:36:33-604009 INFO     Training has ended.\n09:45:57-633201 INFO     Start training LoRA Standard ...\n"
    "09:45:57-634197 INFO     Validating lr scheduler arguments...\n",
    "prepare tokenizer\nprepare images.\n",
])
def test_start_up_after_a_failed_exit_is_the_next_jobs(after):
    assert phase(_LAUNCHER + after) == "unknown"
    # What the run showed before the exit still decides.
    assert phase(BAR + _LAUNCHER + after) == "training"
