"""Classes behind batches 37 and 38's first-read misses: a network or a trainer building its optimizer;
accelerate's prepare on a source line the paste cut; a dataset mapped through a text-embedding function;
a job reading its configuration file (OmegaConf's frame, a configuration file not found); NVIDIA's
container banner; a logger named for the argument parser; records with a bracketed level and a logger
in parentheses; a model's script the family table does not know, run through another's trainer. Several
forms of each, and text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from tests.logparse_texts import BAR, CACHING, HEAD, OOM, frame, phase

_ERR = "TypeError: bad\n"


@pytest.mark.parametrize("frames", [
    frame("/mt/src/musubi_tuner/hv_train_network.py", 2220, "train",
          "trainable_params, lr_descriptions = network.prepare_optimizer_params("),
    frame("/mt/src/musubi_tuner/hv_train_network.py", 2220, "train", "params = self.prepare_params()")
    + frame("/mt/networks/lora.py", 900, "prepare_optimizer_params", "params.extend(enumerate_params(m))"),
    frame("/ot/modules/trainer/GenericTrainer.py", 120, "start", "self.model.optimizer = create_optimizer("),
    frame("/t/trainer.py", 300, "train", "self.setup()") + frame("/t/trainer.py", 320, "create_optimizer"),
    "│ /mt/networks/lora.py:900 in prepare_optimizer_params                │\n",
])
def test_building_the_optimizer_is_start_up(frames):
    assert phase(HEAD + frames + _ERR) == "model_load"


def test_the_optimizer_step_is_still_the_step():
    text = BAR + HEAD + frame("/sd/train_network.py", 1000, "train", "optimizer.step()") + OOM
    assert phase(text) == "training"


@pytest.mark.parametrize("source", [
    "unet, optimizer, train_dataloader, lr_scheduler = accelerator.prepare",
    "unet, optimizer = accelerator.prepare   ",
    "unet, optimizer = accelerator.prepare(unet, optimizer)",
])
def test_accelerates_prepare_on_a_cut_source_line_is_start_up(source):
    text = HEAD + frame("train_instruct_pix2pix.py", 706, "main", source) + "Exception: Could not find the layer\n"
    assert phase(text) == "model_load"


@pytest.mark.parametrize("source", ["dl = accelerator.prepare_data_loader_fast", "n = accelerator.prepared_count"])
def test_other_names_beginning_with_prepare_are_not_it(source):
    text = CACHING + HEAD + frame("/t/train.py", 706, "main", source) + OOM
    assert phase(text) == "cache_latents"


@pytest.mark.parametrize("source", [
    "train_dataset = train_dataset.map(compute_embeddings_fn, batched=True, new_fingerprint=new_fingerprint)",
    "ds = ds.map( compute_text_embeddings_batch, batched=True)",
    "out = compute_embeddings_fn(batch)",
])
def test_a_dataset_mapped_through_its_text_embeddings_is_caching_them(source):
    text = "Map:   0% 0/1511 [00:44<?, ? examples/s]\n" + HEAD + frame("/d/train_text_to_image_sdxl.py", 891, "main",
                                                                       source) + OOM
    assert phase(text) == "cache_text_encoder"


def test_a_dataset_mapped_through_anything_else_is_not():
    text = HEAD + frame("/d/train_text_to_image.py", 891, "main", "ds = ds.map(preprocess_train, batched=True)") + OOM
    assert phase(text) != "cache_text_encoder"


def test_omegaconfs_load_is_the_job_reading_its_configuration():
    text = (HEAD + frame("main.py", 656, "<module>", "configs = [OmegaConf.load(cfg) for cfg in opt.base]")
            + frame("/opt/conda/lib/python3.7/site-packages/omegaconf/omegaconf.py", 189, "load",
                    'with io.open(os.path.abspath(file_), "r", encoding="utf-8") as f:')
            + "PermissionError: [Errno 13] Permission denied: '/w/configs/x.yaml'\n")
    assert phase(text) == "model_load"


def test_a_caller_passing_the_loaded_configuration_on_is_not():
    # The loaded file passed straight to the job's main: the frames under it say what it was doing.
    text = (CACHING + HEAD + frame("/c/train.py", 915, "<module>", "main(**OmegaConf.load(args.config))")
            + frame("/c/train.py", 604, "main", "cached = handle_cache_latents(") + OOM)
    assert phase(text) == "cache_latents"


@pytest.mark.parametrize("error", [
    "FileNotFoundError: [Errno 2] No such file or directory: '/w/configs/v1-finetune.yaml'",
    "FileNotFoundError: [Errno 2] No such file or directory: 'training_presets/#.json'",
    "FileNotFoundError: [Errno 2] No such file or directory: \"/w/dataset.toml\"",
    "FileNotFoundError: [WinError 2] The system cannot find the file specified: 'C:\\\\k\\\\cfg\\\\lora.yml'",
    "FileNotFoundError: [WinError 3] The system cannot find the path specified: 'D:\\\\x\\\\accelerate.ini'",
])
def test_a_configuration_file_not_found_is_start_up(error):
    text = HEAD + frame("/w/ui/TopBar.py", 192, "__load_current_config", 'with open(filename, "r") as f:') + error + "\n"
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase) == ("error", "model_load")


@pytest.mark.parametrize("error", [
    "FileNotFoundError: [Errno 2] No such file or directory: '/w/img/cat.png'",
    "FileNotFoundError: [Errno 2] No such file or directory: '/w/configs/x.yaml.bak'",
])
def test_other_files_not_found_are_not_read_so(error):
    text = CACHING + HEAD + frame("/w/x.py", 1, "f", "open(p)") + error + "\n"
    assert phase(text) == "cache_latents"


def test_what_the_lines_before_show_comes_first():
    text = BAR + HEAD + frame("/w/x.py", 1, "f", "open(p)") + (
        "FileNotFoundError: [Errno 2] No such file or directory: '/w/prompts.json'\n")
    assert phase(text) == "training"


_BANNER = "==========\n== CUDA ==\n==========\n\nCUDA Version 12.1.1\n\nContainer image Copyright (c) 2016-2023.\n"


@pytest.mark.parametrize("prefix", ["", "autotrain-1  | ", "lora-trainer-1  | "])
def test_nvidias_container_banner_is_the_job_being_started(prefix):
    text = "".join(prefix + line + "\n" for line in _BANNER.splitlines())
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase) == ("incomplete", "model_load")


@pytest.mark.parametrize("line", ["CUDA Version 12.1.1 is too old for this build", "cuda version: 12.1",
                                  "== CUDA OOM =="])
def test_other_lines_naming_a_cuda_version_are_not_the_banner(line):
    assert phase(CACHING + line + "\n") == "cache_latents"


@pytest.mark.parametrize("name", ["ArgsParser", "args_parser", "helpers.configuration.argparser"])
def test_a_logger_named_for_the_argument_parser_is_start_up(name):
    text = f"2024-08-06 17:09:09,490 [INFO] ({name}) VAE Model: black-forest-labs/FLUX.1-schnell\n"
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase) == ("incomplete", "model_load")


@pytest.mark.parametrize("name", ["DataParser", "LogParser", "ArgsParserCache"])
def test_other_loggers_are_not_the_argument_parser(name):
    text = CACHING + f"2024-08-06 17:09:09,490 [INFO] ({name}) read 4 items\n"
    assert phase(text) == "cache_latents"


@pytest.mark.parametrize("time", ["2024-06-30 23:45:34,053 ", "[2024-06-30 23:45:34] ", ""])
def test_a_bracketed_level_with_a_logger_is_a_record(time):
    # Its level says it: an ERROR record names the failure where the traceback after it is cut.
    text = (f"{time}[ERROR] (collate_fn) (id=ds) Error while computing latents: (id=ds) Some images were not "
            "correctly cached during the VAE Cache operations.\n"
            + HEAD + frame("/st/helpers/data_backend/factory.py", 923, "random_dataloader_iterator",
                           "yield (step, next(chosen_iter))"))
    d = diagnose(parse_text(text))
    assert d.error is not None and d.error.kind == "missing_file"


def test_an_info_record_before_a_failure_nothing_places_is_start_up():
    text = "2024-08-06 17:09:09,490 [INFO] (__main__) Loaded 4 files\n" + OOM
    assert phase(text) == "model_load"


def test_a_bracketed_level_alone_is_a_relay_of_the_trainers_output():
    # A wrapper tagging every line it relays: the traceback still reads as one.
    text = "".join(f"[2024-09-09 17:43:57] [INFO] {line}\n" for line in (
        HEAD + frame("F:\\fg\\sd-scripts\\train_network.py", 402, "train",
                     "self.cache_text_encoder_outputs_if_needed(args, accelerator)") + OOM).splitlines())
    assert phase(text) == "cache_text_encoder"


def _family(entry: str) -> str | None:
    text = (HEAD + frame(f"/mt/{entry}", 4, "<module>", "main()")
            + frame("/mt/src/musubi_tuner/hv_train_network.py", 2220, "train", "network.prepare_optimizer_params(")
            + _ERR)
    return diagnose(parse_text(text)).family


@pytest.mark.parametrize("entry, family", [
    ("ltx2_train_network.py", None),
    ("qwen_image_train_network.py", None),
    ("wan_train_network.py", "wan"),
    ("hv_train_network.py", "hunyuan_video"),
    ("train.py", "hunyuan_video"),
])
def test_a_script_the_family_table_does_not_know_names_no_family_through_anothers_trainer(entry, family):
    assert _family(entry) == family


# ---- older misses of the same kinds (batches 25, 27 and 32) ------------------------------------------------------

@pytest.mark.parametrize("prompt", ["root@autodl-container-7f54:~/autodl-tmp/musubi-tuner# ", "(qwen) me@box:/w$ ",
                                    "(venv) user@host-1:~ $ "])
def test_a_launch_after_a_unix_prompt_is_the_trainer_launched(prompt):
    text = prompt + "python src/musubi_tuner/qwen_image_train_network.py --dit /m/dit.safetensors --sdpa\n"
    d = diagnose(parse_text(CACHING + text + "Trying to import sageattention\n"))
    assert (d.outcome, d.phase) == ("incomplete", "model_load")


@pytest.mark.parametrize("line", ["root@host:~# ls /w/train", "user@host:~$ cat train.toml"])
def test_a_prompt_before_other_commands_is_not_a_launch(line):
    assert phase(CACHING + line + "\n") == "cache_latents"


@pytest.mark.parametrize("name", ["BaseMetadataBackend", "ParquetMetadataBackend", "DataBackendFactory"])
def test_simpletuners_metadata_backends_are_the_dataset_read(name):
    text = CACHING + f"2024-08-06 17:09:09,490 [INFO] ({name}) Enforcing minimum image size of 0.0.\n"
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase) == ("incomplete", "model_load")


@pytest.mark.parametrize("name", ["BackendMetadata", "MetadataBackendCache2"])
def test_other_names_are_not_the_metadata_backend(name):
    assert phase(CACHING + f"2024-08-06 17:09:09,490 [INFO] ({name}) read 4 items\n") == "cache_latents"


@pytest.mark.parametrize("line, expected", [
    ("Starting text encoder output caching...", "cache_text_encoder"),
    ("Starting text-encoder caching", "cache_text_encoder"),
    ("Starting latent caching...", "cache_latents"),
    ("Starting VAE caching", "cache_latents"),
])
def test_a_host_announcing_a_caching_pass_counts_its_start_up_as_the_pass(line, expected):
    text = (line + "\nTrying to import sageattention\nINFO:__main__:Load dataset config from /w/dataset.toml\n"
            "INFO:musubi_tuner.dataset.image_video_dataset:glob images in /w/img\n")
    assert phase(text) == expected


@pytest.mark.parametrize("line", ["Starting training...", "Starting caching of nothing", "Not starting latent caching"])
def test_other_starting_lines_are_not_a_caching_pass(line):
    text = line + "\nINFO:__main__:Load dataset config from /w/dataset.toml\n"
    assert phase(text) not in ("cache_latents", "cache_text_encoder")
