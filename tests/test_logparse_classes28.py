"""Classes behind batch 39's first-read misses: a job reading its TOML configuration (sd-scripts'
read_config_from_file, a TOML parser's own frame, a tracker's config); the optimizer class being chosen;
the job's arguments declared or parsed, and sd-scripts' network trainer setting its network up; the step
encoding its batch's captions; a Rich box's rows of source around the line that ran (code shown, not run);
a Rich record whose source column was cut, its level padded to Rich's width. Several forms of each, and
text that must not be read so."""
from __future__ import annotations

import pytest

from kohya_tuner.logparse import diagnose, parse_text
from tests.logparse_texts import BAR, CACHING, HEAD, OOM, box_row, frame, phase

_ERR = "TypeError: bad\n"
_MODULE = frame("E:\\lora-scripts\\sd-scripts\\sdxl_train_network.py", 182, "<module>",
                "args = train_util.read_config_from_file(args, parser)")


@pytest.mark.parametrize("below", [
    "",
    frame("E:\\lora-scripts\\sd-scripts\\library\\train_util.py", 3746, "read_config_from_file",
          "config_dict = toml.load(f)"),
    frame("/sd/library/train_util.py", 3746, "read_config_from_file", "config_dict = toml.load(f)")
    + frame("/venv/lib/python3.10/site-packages/toml/decoder.py", 156, "load",
            "return loads(f.read(), _dict, decoder)"),
])
def test_reading_the_config_file_is_start_up(below):
    text = HEAD + _MODULE + below + "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xd7 in position 36\n"
    assert phase(text) == "model_load"


@pytest.mark.parametrize("frames", [
    frame("/w/x.py", 10, "main", "cfg = load_cfg(p)")
    + frame("/venv/lib/python3.11/site-packages/toml/decoder.py", 511, "loads", "raise TomlDecodeError(str(e))"),
    frame("/w/x.py", 10, "main", "cfg = load_cfg(p)")
    + frame("/usr/lib/python3.11/tomllib/_parser.py", 102, "loads", "pos = key_value_rule(src, pos)"),
    frame("/sd/train_db.py", 257, "train", "init_kwargs = toml.load(args.log_tracker_config)"),
])
def test_a_toml_parser_or_a_trackers_config_is_the_configuration_read(frames):
    assert phase(HEAD + frames + "toml.decoder.TomlDecodeError: bad\n") == "model_load"


def test_a_toml_prompt_file_read_while_sampling_is_the_sample():
    text = (BAR + HEAD + frame("/sd/train_network.py", 1300, "train", "self.sample_images(accelerator, args)")
            + frame("/sd/library/train_util.py", 6337, "load_prompts", "data = toml.load(f)")
            + frame("/venv/lib/site-packages/toml/decoder.py", 156, "load", "return loads(f.read())")
            + "toml.decoder.TomlDecodeError: bad\n")
    assert phase(text) == "sampling"


@pytest.mark.parametrize("source", ["optimizer_class = bnb.optim.AdamW8bit",
                                    "optimizer_class = torch.optim.AdamW",
                                    "optimizer = optimizer_class(trainable_params, lr=args.learning_rate)"])
def test_choosing_the_optimizer_class_is_start_up(source):
    text = HEAD + frame("/k/train_db.py", 346, "<module>", "train(args)") + frame("/k/train_db.py", 126, "train",
                                                                                 source)
    assert phase(text + "AttributeError: module 'bitsandbytes' has no attribute 'optim'\n") == "model_load"


@pytest.mark.parametrize("frames", [
    frame("/s/lora_train_popup.py", 108, "main", "setup_args(parser)")
    + frame("/s/lora_train_popup.py", 343, "setup_args", "util.add_dataset_arguments(parser, True, True, True)"),
    frame("/s/train.py", 20, "main", "parser = setup_parser()"),
    frame("/s/train.py", 20, "<module>", "args = parser.parse_args()"),
    frame("/s/train.py", 20, "<module>", "args = cli()")
    + frame("/usr/lib/python3.10/argparse.py", 1826, "parse_args", "args, argv = self.parse_known_args(args)"),
    frame("/sd/train_network.py", 441, "train", "self.post_process_network(args, accelerator, network, te, unet)")
    + frame("/sd/flux_train_network.py", 170, "post_process_network", "self.train_t5xxl = network.train_t5xxl"),
    frame("/sd/train_network.py", 500, "train", "unet = self.prepare_unet_with_accelerator(args, accelerator, unet)"),
])
def test_the_arguments_and_the_networks_set_up_are_start_up(frames):
    assert phase(HEAD + frames + _ERR) == "model_load"


@pytest.mark.parametrize("source", [
    "encoded_text_encoder_conds = text_encoding_strategy.encode_tokens(",
    "encoded_text_encoder_conds = text_encoding_strategy.encode_tokens_with_weights(",
    "encoder_hidden_states = train_util.get_hidden_states(args, input_ids, tokenizer, text_encoder, weight_dtype)",
    "text_encoder_conds = self.get_text_cond(",
])
def test_the_step_encoding_its_captions_is_the_step(source):
    frames = frame("/sd/sd3_train_network.py", 426, "<module>", "trainer.train(args)") + frame(
        "/sd/train_network.py", 1161, "train", source) + frame("/sd/library/strategy_sd3.py", 70, "encode_tokens",
                                                               "clip_l, clip_g, t5xxl = models")
    err = "ValueError: not enough values to unpack (expected 3, got 2)\n"
    assert phase(HEAD + frames + err) == "first_step"
    assert phase(BAR + HEAD + frames + err) == "training"


def test_caching_that_encodes_through_the_same_strategy_is_still_caching():
    text = (HEAD + frame("/sd/train_network.py", 402, "train", "self.cache_text_encoder_outputs_if_needed(args)")
            + frame("/sd/library/strategy_sd3.py", 300, "cache_batch_outputs",
                    "tokens = text_encoding_strategy.encode_tokens(tokenize_strategy, models, tokens)") + OOM)
    assert phase(text) == "cache_text_encoder"


_BOX_HEAD = "╭──────────────────── Traceback (most recent call last) ─────────────────────╮\n"
_BOX_END = "╰──────────────────────────────────────────────────────────────────────────────╯\n"


def test_a_rich_boxs_rows_around_the_line_that_ran_are_not_evidence():
    # The <module> frame shows its argument parsing around the ❱ row; the frame that ran was sampling.
    text = (BAR + _BOX_HEAD + box_row("/sd/train_network.py:480 in <module>") + box_row("")
            + box_row("  477 │   args = parser.parse_args()") + box_row("  478 │   args = train_util.read_config_from_file(args, p)")
            + box_row("❱ 480 │   trainer.train(args)") + box_row("  481") + box_row("")
            + box_row("/sd/train_network.py:1300 in train") + box_row("")
            + box_row("❱ 1300 │   self.sample_images(accelerator, args, epoch)") + box_row("") + _BOX_END + _ERR)
    assert phase(text) == "sampling"


def test_where_the_paste_cut_a_frames_run_row_its_rows_are_kept():
    text = (box_row("  1144 │   │") + box_row("  1145 │   │   return self._apply(convert)") + box_row("  1146") + _BOX_END
            + OOM)
    assert phase(text) == "model_load"


@pytest.mark.parametrize("line, outcome", [(" \t\t    INFO     Building VAE", "incomplete"),
                                           ("   INFO     Building VAE", "incomplete"),
                                           ("\tWARNING  Building VAE", "incomplete"),
                                           # A CRITICAL record that ends the log is its failure.
                                           ("    CRITICAL Building VAE", "error")])
def test_a_rich_record_with_its_source_column_cut_is_a_record(line, outcome):
    d = diagnose(parse_text(CACHING + line + "\n"))
    assert (d.outcome, d.phase) == (outcome, "model_load")


@pytest.mark.parametrize("line", ["   INFO Building VAE", "   INFO      Building VAE", "   INFORMATION Building VAE"])
def test_a_level_not_in_richs_column_is_not_a_record(line):
    assert phase(CACHING + line + "\n") == "cache_latents"
