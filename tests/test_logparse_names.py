"""Names a log shows: the kohya_ss GUI by the plan lines it logs before it launches the trainer
(frames.toml `[[wrapper]]`), and the model family by file and script names that carry it as one
of their parts (`[[family]]`): other trainers' entry scripts, model modules, checkpoint, cache and
config file names. Each class is tried in several spellings (POSIX and Windows paths, `_`/`-`/`.`
separators, upper case, with and without the GUI's timestamp), and each class of look-alike is
tried the same way: an identifier, an option's key in an argument dump, FLUX.2, SimpleTuner's
launcher names, sd-scripts' own dataset lines, other programs' "Validating"/"Loading config"."""

from __future__ import annotations

import pytest

from kohya_tuner.logparse.frames import names_in
from kohya_tuner.logparse.parser import parse_text
from kohya_tuner.logparse.events import ModelFamily, Wrapper


def family(line: str) -> str | None:
    named = names_in(line)[1]
    return named[0] if named else None


ENTRY_SCRIPTS = {
    "flux": ['  File "/opt/diffusers/examples/dreambooth/train_dreambooth_lora_flux.py", line 12, in <module>',
             r'  File "D:\work\train_flux_lora_masked.py", line 9, in main',
             "accelerate launch train_text_to_image_flux.py --pretrained_model_name_or_path x"],
    "sdxl": ['  File "/home/u/train_controlnet_sdxl.py", line 77, in <module>',
             r'  File "C:\x\train_dreambooth_lora_sdxl_advanced.py", line 3, in main',
             "python sdxl_train_textual_inversion.py --config_file a.toml",
             "python sdxl_train_control_net_lllite.py --config_file a.toml"],
    "sd3": ['  File "/r/train_dreambooth_lora_sd3.py", line 1, in <module>',
            "torchrun train_text_to_image_lora_sd3_v2.py"],
    "wan": ["python wan_cache_latents.py --dataset_config d.toml",
            r'  File "E:\mt\wan_cache_text_encoder_outputs.py", line 5, in <module>',
            '  File "/w/train_wan_i2v.py", line 40, in <module>',
            '  File "/home/u/diffusion-pipe/models/wan.py", line 598, in enable_block_swap',
            "INFO:musubi_tuner.wan.modules.model:Detected DiT dtype: torch.bfloat16"],
}

FILE_NAMES = {
    "flux": ["--pretrained_model_name_or_path /models/flux_dev_fp8/fill",
             r"Saving checkpoint: D:\loras\flux-portrait-v2\x.safetensors",
             "loading cache /data/cache/text/0a1b2c-flux.pt",
             "python run.py config/flux-schnell-person.yaml",
             "model_type FLUX",
             "python run.py config/train_lora_flux_24gb.yaml",
             "FLUX: Gradient checkpointing enabled. CPU offload: False",
             "RuntimeError: Error(s) in loading state_dict for Flux:"],
    "sdxl": ["load StableDiffusion checkpoint: /content/sdxl_base.safetensors",
             r"validating C:\models\ponyRealismSDXL_v2.safetensors existence...",
             "Saving model as StableDiffusion checkpoint to ./output/sdxl_v1.safetensors"],
    "sd3": ["cache directory d:/datasets/sd35/workspace-cache", "loading /m/SD3.5_large.safetensors"],
    "sd15": ["saving current state to output/icons_sd15/checkpoint-50", "downloading sd_v1-5_vae.ckpt"],
    "wan": [r"'dit': 'C:\\models\\wan2.1_t2v_1.3B_bf16.safetensors'", "train.py --deepspeed --config examples/wan2_1.toml",
            "--config ./wanconfig.toml", "# running job: person_lora_wan2.2",
            '  File "/d/DiffSynth-Studio/examples/wanvideo/model_training/train.py", line 129, in <module>'],
    "hunyuan_video": ["--vae ckpts/hunyuan-video-t2v-720p/vae/pytorch_model.pt"],
}


@pytest.mark.parametrize("want,line", [(f, line) for f, lines in ENTRY_SCRIPTS.items() for line in lines])
def test_an_entry_script_or_model_module_names_its_family(want, line):
    assert family(line) == want


@pytest.mark.parametrize("want,line", [(f, line) for f, lines in FILE_NAMES.items() for line in lines])
def test_a_file_name_with_the_family_as_a_part_names_it(want, line):
    assert family(line) == want


NO_FAMILY = [
    # an option's key in an argument dump names an option, not the run's model
    "    flux_kontext_no_resize_control: False",
    "  flux_guidance_scale = 3.5",
    # an identifier in code or a message about it
    "UnboundLocalError: local variable 'update_flux_schedule_to_fast' referenced before assignment",
    "    compute_flux_shift(",
    # FLUX.2 is not the FLUX.1 the tool plans for
    r'  File "T:\mt\src\musubi_tuner\flux_2_train_network.py", line 359, in main',
    '  File "/s/helpers/models/flux2/model.py", line 364, in load_text_encoder',
    "Access to model black-forest-labs/FLUX.2-klein-base-9B is restricted",
    "RuntimeError: Error(s) in loading state_dict for Flux2:", "python run.py config/train_lora_flux_2_klein.yaml",
    # SimpleTuner's launcher and example environment carry "sdxl" whatever the model
    "(env) root@host:/SimpleTuner# bash train_sdxl.sh",
    "sdxl-env.sh.example: line 2: $'\\r': command not found",
    # words that contain the letters
    "wanted to train on a wand", "fluxion of the series", "influx of images",
]


@pytest.mark.parametrize("line", NO_FAMILY)
def test_look_alikes_name_no_family(line):
    assert family(line) is None


def test_a_flux_run_is_not_sdxl_for_sdxl_train_utils_argument_warning():
    # flux_train_network.py runs sdxl_train_util's argument checks: their warnings name that module.
    text = ("2025-01-01 10:00:00 WARNING  clip_skip will be unexpected           sdxl_train_util.py:352\n"
            "2025-01-01 10:00:01 INFO     Building Flux model dev from BFL checkpoint   flux_utils.py:54\n")
    assert [e.family for e in parse_text(text) if isinstance(e, ModelFamily)][-1:] == ["flux"]
    assert family("2025-01-01 10:00:00 WARNING  clip_skip will be unexpected  sdxl_train_util.py:352") is None


def test_the_script_outranks_a_file_name_of_another_family():
    # a Wan run whose caching script imports HunyuanVideo's VAE module and reads a model named for SDXL
    text = ("Traceback (most recent call last):\n"
            '  File "/mt/wan_cache_latents.py", line 21, in <module>\n'
            "    from hunyuan_model.autoencoder_kl_causal_3d import AutoencoderKLCausal3D\n"
            '  File "/mt/hunyuan_model/autoencoder_kl_causal_3d.py", line 43, in <module>\n'
            "ImportError: x\n")
    assert [e.family for e in parse_text(text) if isinstance(e, ModelFamily)][-1] == "wan"


def wrapper(line: str) -> str | None:
    return names_in(line)[0]


GUI_PLAN_LINES = [
    "14:01:57-327737 INFO     Start training LoRA Standard ...",
    "Start training Dreambooth...",
    "00:31:52-083848 INFO     Valid image folder names found in: F:/kohya tutorial files\\img",
    "22:10:03-000001 INFO     Folder 20_ohwx man: 13 images found",
    "Folder 10_my token: 170 steps",
    "12:00:00-123456 INFO     Regulatization factor: 1",
    "10:00:00-000000 INFO     max_train_steps (260 / 1 / 1.0 * 10 * 2) = 5200",
    "stop_text_encoder_training = 0",
    "09:09:09-090909 INFO     Checking for duplicate image filenames in training data directory...",
    "09:09:09-090909 INFO     Validating model file or folder path /m/x.safetensors existence...",
    "09:09:09-090909 INFO     Saving training config to /out/last_20240101-000000.json...",
]


@pytest.mark.parametrize("line", GUI_PLAN_LINES)
def test_the_kohya_ss_guis_plan_lines_name_the_gui(line):
    assert wrapper(line) == "kohya_ss"


NOT_THE_GUI = [
    # sd-scripts' own lines, which every wrapper passes through
    "  num train images * repeats / 学習画像の数×繰り返し回数: 870",
    "found directory /data/img/10_token contains 17 image files",
    # other programs' look-alikes
    "Loading config file config.yaml",
    "Validating dataset ...",
    "folder images: 3 images found",
    "Start training the model",
]


@pytest.mark.parametrize("line", NOT_THE_GUI)
def test_look_alikes_of_the_guis_lines_name_no_gui(line):
    assert wrapper(line) != "kohya_ss"


OTHER_WRAPPER_LINES = {
    "a1111-dreambooth": ["Starting Dreambooth training...", "Initializing dreambooth training...",
                         " Training settings: CPU: False Adam: True, Prec: fp16, Grad: True, TextTr: False EM: False",
                         "Injecting trainable lora...", "Restored system models.", " VRAM cleared.",
                         r"Model dir set to: C:\sd\models\dreambooth\person"],
    "simpletuner": ["2025-01-01 10:00:00,000 [INFO] (helpers.training.text_encoding) Loading CLIP-L text encoder",
                    "2024-08-23 17:51:47,784 [INFO] (DataBackendFactory) (id=camera) Collecting captions."],
    "ai-toolkit": ["# Running job: person_v1", "Running  1 process",
                   "person_v1:   1%|          | 19/3000 [05:35<14:36:19, 17.64s/it, lr: 1.0e-04 loss: 1.038e+00]"],
    "musubi-tuner": ["INFO:cache_latents:Encoding dataset [0]",
                     "INFO:musubi_tuner.wan.modules.model:Detected DiT dtype: torch.bfloat16"],
    "sd-scripts": ["load StableDiffusion checkpoint: C:/m/sd_xl_base_1.0.safetensors", "loading U-Net from checkpoint",
                   "2024-09-15 17:26:03 INFO     load StableDiffusion checkpoint: /m/x.ckpt",
                   "                        [--save_state_to_huggingface] [--resume_from_huggingface]"],
    "diffusers": ["root@box:/workspace/diffusers/examples/controlnet# accelerate launch train_controlnet_flux.py \\",
                  '  File "/home/u/train_controlnet_sdxl.py", line 1245, in <module>'],
}


@pytest.mark.parametrize("want,line", [(w, line) for w, lines in OTHER_WRAPPER_LINES.items() for line in lines])
def test_other_trainers_own_lines_name_them(want, line):
    assert wrapper(line) == want


@pytest.mark.parametrize("line", ["Starting training", "Settings: CPU: 4 cores", "model dir: /m",
                                  "INFO:root:loading model", "(helpers) done", "Running 3 tests",
                                  "epoch 1: lr: 0.0001 loss: 0.12",
                                  '  File "/r/training/train_controlnet.py", line 3, in main'])
def test_look_alikes_of_other_trainers_lines_name_none(line):
    assert wrapper(line) is None


def test_a_rich_record_behind_another_loggers_head_names_the_file_that_logged():
    # a front end that prefixes each line of sd-scripts' Rich output with its own time and level
    text = ("[2025-04-24 15:42:01] [INFO] INFO     set U-Net weight dtype to     train_network.py:826\n"
            "[2025-04-24 15:42:01] [INFO] INFO     prepare CLIP-L for fp8:  flux_train_network.py:482\n")
    assert [e.family for e in parse_text(text) if isinstance(e, ModelFamily)] == ["flux"]


def test_a_rich_record_from_sd_scripts_train_util_names_sd_scripts():
    text = "2025-06-29 12:14:41 INFO     epoch is incremented. current_epoch: 22, epoch: 23       train_util.py:779\n"
    assert [e.wrapper for e in parse_text(text) if isinstance(e, Wrapper)] == ["sd-scripts"]
    # a module of another program that merely ends the same way is not sd-scripts' file
    assert wrapper("my_train_util.py") is None
