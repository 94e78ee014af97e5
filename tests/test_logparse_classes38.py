"""Classes behind batches 62 to 65's first-read misses: a state-dict report of mismatched shapes whose head
line was cut; the web UI's embedding and hypernetwork training bars, and a bar drawn with a colon after it; a
training script's imports failing inside a library's lazy import; a tokenizer's vocabulary that does not load,
and transformers' notice as a tokenizer is built; a dataset constructed; Python logging's whole-second time
with a logger name in brackets; the web UI's preview sampler set up during training; cuDNN finding no kernel.
Several forms of each, and text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from kohya_tuner.logparse.cleaning import clean
from kohya_tuner.logparse.events import Failure
from tests.logparse_texts import BAR, HEAD, frame, phase

ROW = ("size mismatch for up_blocks.1.attentions.2.proj_in.weight: copying a param with shape "
       "torch.Size([640, 640]) from checkpoint, the shape in current model is torch.Size([1280, 1280]).")


@pytest.mark.parametrize("indent", ["", "\t", "        "])
def test_size_mismatch_rows_with_their_head_cut_are_one_failure_loading_weights(indent):
    rows = "".join(indent + ROW.replace("proj_in", name) + "\n" for name in ("proj_in", "proj_out", "norm"))
    events = parse_text(rows)
    assert sum(isinstance(e, Failure) for e in events) == 1
    d = diagnose(events)
    assert (d.outcome, d.error.kind, d.phase) == ("error", "other", "model_load")


def test_size_mismatch_rows_apart_are_two_failures():
    text = ROW + "\nloading the other model\n" + ROW + "\n"
    assert sum(isinstance(e, Failure) for e in parse_text(text)) == 2


@pytest.mark.parametrize("line", ["the size mismatch for this layer is expected", "size mismatch: 3 vs 4",
                                  "WARNING: size mismatch for lora_unet_x, skipped"])
def test_other_words_about_a_size_mismatch_are_no_failure(line):
    d = diagnose(parse_text(BAR + line + "\n"))
    assert (d.outcome, d.phase) == ("incomplete", "training")


@pytest.mark.parametrize("line, step, total", [
    ("Training textual inversion [Epoch 5: 30/34] loss: nan:   0% 100/999901 [00:58<157:15:43,  1.77it/s]",
     100, 999901),
    ("Training hypernetwork [Epoch 2: 3/10]loss: 0.123:  1%|▏         | 30/5000 [00:10<20:00,  4.00it/s]", 30, 5000),
    ("Training textual inversion:  50%|█████     | 2500/5000 [10:00<10:00,  4.16it/s]", 2500, 5000),
])
def test_the_web_uis_embedding_and_hypernetwork_bars_count_the_training_steps(line, step, total):
    d = diagnose(parse_text(line + "\n"))
    assert (d.phase, d.step, d.total_steps) == ("training", step, total)


@pytest.mark.parametrize("line", ["Training data:   1% 30/5000 [00:10<20:00,  4.00it/s]",
                                  "Preparing textual inversion dataset:  50%|█████     | 5/10 [00:01<00:01, 4.0it/s]"])
def test_other_bars_named_for_training_are_not_the_step_bar(line):
    assert diagnose(parse_text(line + "\n")).step is None


@pytest.mark.parametrize("line, step, total", [
    ("Progress:|                         |:   0% 1/4700 [00:10<13:18:38, 10.20s/it, loss=0.0911, lr=2e-6]", 1, 4700),
    ("Progress:|█████                    |:  21% 999/4700 [16:27<60:00,  1.02it/s, loss=0.02, lr=2e-6]", 999, 4700),
    ("Progress:|████      | 33% 999/3000 [16:27<32:42,  1.02it/s, loss=0.02]", 999, 3000),
])
def test_a_bar_drawn_before_its_percentage_with_or_without_a_colon(line, step, total):
    d = diagnose(parse_text(line + "\n"))
    assert (d.step, d.total_steps) == (step, total)


def test_a_table_row_with_a_colon_after_its_bar_is_no_bar():
    assert diagnose(parse_text("| value |:  3% 1/2 done\n")).step is None


def _lazy_import(script: str, error: str) -> str:
    return (HEAD + frame(script, 20, "<module>", "from library import deepspeed_utils, sdxl_model_util")
            + frame("/k/sd-scripts/library/sdxl_model_util.py", 8, "<module>",
                    "from diffusers import AutoencoderKL, EulerDiscreteScheduler")
            + '  File "<frozen importlib._bootstrap>", line 1229, in _handle_fromlist\n'
            + frame("/k/venv/lib/python3.11/site-packages/diffusers/utils/import_utils.py", 910, "__getattr__",
                    "module = self._get_module(self._class_to_module[name])")
            + frame("/k/venv/lib/python3.11/site-packages/diffusers/utils/import_utils.py", 922, "_get_module",
                    "raise RuntimeError(")
            + error + "\n")


@pytest.mark.parametrize("error", [
    "RuntimeError: Failed to import diffusers.models.autoencoders.autoencoder_kl because of the following error "
    "(look up to see its traceback):",
    "RuntimeError: Failed to import transformers.models.clip.image_processing_clip because of the following error "
    "(look up to see its traceback):\nDLL load failed while importing _imaging",
])
def test_a_training_scripts_imports_failing_in_a_lazy_import_are_start_up(error):
    for script in ("/k/sd-scripts/sdxl_train.py", "C:\\k\\sd-scripts\\train_network.py"):
        d = diagnose(parse_text(_lazy_import(script, error)))
        assert (d.outcome, d.phase) == ("error", "model_load")


def test_a_lazy_import_failing_printed_alone_is_start_up():
    assert phase("RuntimeError: Failed to import diffusers.pipelines.pipeline_utils because of the following "
                 "error (look up to see its traceback):\nNo module named 'x'\n") == "model_load"


def test_a_guis_own_imports_failing_so_say_no_stage():
    error = "RuntimeError: Failed to import diffusers.models.autoencoder_kl because of the following error (…):"
    assert phase(_lazy_import("/k/kohya_gui.py", error)) == "unknown"


def test_another_runtime_error_in_a_training_scripts_imports_says_no_stage():
    error = "RuntimeError: Failed to initialise the lazy module table"
    assert phase(_lazy_import("/k/sd-scripts/sdxl_train.py", error)) == "unknown"


@pytest.mark.parametrize("text", [
    "OSError: Unable to load vocabulary from file. Please check that the provided vocabulary is accessible and "
    "not corrupted.\n",
    HEAD + frame("/v/lib/site-packages/transformers/tokenization_utils_base.py", 2300, "_from_pretrained",
                 "tokenizer = cls(*init_inputs, **init_kwargs)")
    + frame("/v/lib/site-packages/transformers/models/t5/tokenization_t5.py", 150, "__init__",
            "self.sp_model.Load(vocab_file)")
    + "OSError: Unable to load vocabulary from file.\n",
])
def test_a_tokenizers_vocabulary_that_does_not_load_is_start_up(text):
    d = diagnose(parse_text(text))
    assert (d.outcome, d.phase) == ("error", "model_load")


def test_a_vocabulary_named_in_other_words_says_no_stage():
    assert phase("ValueError: the vocabulary size 32000 is larger than expected\n") == "unknown"


@pytest.mark.parametrize("line", [
    "You are using the default legacy behaviour of the <class 'transformers.models.t5.tokenization_t5.T5Tokenizer'>. "
    "This is expected, and simply means that the legacy (previous) behavior will be used",
    "[2024-09-18 00:12:08] [INFO] You are using the default legacy behaviour of the <class "
    "'transformers.models.llama.tokenization_llama.LlamaTokenizer'>. This is expected",
])
def test_transformers_notice_as_a_tokenizer_is_built_is_start_up(line):
    assert phase(line + "\n") == "model_load"


def test_a_legacy_notice_about_something_else_says_no_stage():
    assert phase("You are using a legacy config format; please update it\n") == "unknown"


@pytest.mark.parametrize("line", ["Constructing dataset SanaWebDatasetMS...", "Creating dataset",
                                  "Building the training dataset", "constructing a dataset from /data/x"])
def test_a_dataset_constructed_is_start_up(line):
    assert phase(line + "\n") == "model_load"


@pytest.mark.parametrize("line", ["Dataset constructed in 3.2 s", "Building wheels for collected packages"])
def test_other_building_words_say_no_stage(line):
    assert phase(line + "\n") == "unknown"


@pytest.mark.parametrize("line, message", [
    ("2025-01-03 23:03:35 - [Sana] - INFO - Constructing dataset SanaWebDatasetMS...",
     "Constructing dataset SanaWebDatasetMS..."),
    ("2025-01-03 23:03:17 - [Sana] - WARNING - use pe: False", "use pe: False"),
    ("2025-01-03 23:03:17 - root - INFO - Loading the model", "Loading the model"),
])
def test_whole_second_times_and_a_bracketed_logger_are_a_records_head(line, message):
    d = diagnose(parse_text(line + "\n"))
    assert clean(line).endswith(message)
    if "Constructing" in line:
        assert d.phase == "model_load"


def test_richs_time_column_is_still_sd_scripts_record_head():
    # sd-scripts' Rich records begin with their time and level, no dash after the time.
    assert clean("2026-01-01 12:00:00 INFO     prepare tokenizer").startswith("2026-01-01 12:00:00")


@pytest.mark.parametrize("source", ["p.sampler_name = sd_samplers.samplers[preview_sampler_index].name",
                                    "sampler = sd_samplers.samplers[shared.opts.training_sampler].name"])
def test_the_web_uis_training_setting_up_its_preview_sampler_is_sampling(source):
    text = (HEAD + frame("/sd/webui/modules/hypernetworks/hypernetwork.py", 701, "train_hypernetwork", source)
            + "TypeError: list indices must be integers or slices, not str\n")
    assert phase(text) == "sampling"


def test_a_jobs_own_sampler_setting_is_not_sampling():
    text = (HEAD + frame("/w/train.py", 40, "main", "self.sampler_name = args.sampler_name")
            + "AttributeError: 'Namespace' object has no attribute 'sampler_name'\n")
    assert phase(text) != "sampling"


@pytest.mark.parametrize("line", [
    "RuntimeError: cuDNN Frontend error: [cudnn_frontend] Error: No execution plans support the graph.",
    "[2024-09-14 18:24:18] [INFO] RuntimeError: cuDNN Frontend error: [cudnn_frontend] Error: No valid engine",
])
def test_cudnn_finding_no_kernel_is_a_cuda_error(line):
    d = diagnose(parse_text(BAR + line + "\n"))
    assert (d.outcome, d.error.kind) == ("error", "cuda_error")


def test_a_warning_naming_cudnn_frontend_is_no_error():
    d = diagnose(parse_text(BAR + "UserWarning: cuDNN frontend is disabled; falling back\n"))
    assert d.outcome == "incomplete"
