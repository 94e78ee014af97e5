"""Reading a kohya_ss GUI JSON file into the flat config the GUI's own code launches.

A GUI file means what the GUI's "Start training" / "Print training command" button makes of it:
the tab's form is filled from the file (a field the file lacks keeps the value a fresh tab
holds), each value passes the form component it sits in, and the tab's train_model turns the
form into a TOML for `--config_file` plus the `accelerate launch` options. This module does
the same, field by field, for the LoRA, DreamBooth and fine-tuning tabs; docs/kohya-gui.md
says which field becomes which key and where the GUI does it, and
tests/test_kohya_gui_oracle.py holds it to what the GUI itself produced
(tests/data/kohya_gui/records.json, recorded by tools/gui_oracle.py).

The form's field kinds and fresh-tab values are data recorded from the GUI
(kohya_tuner/data/kohya_gui_fields.json, bmaltais/kohya_ss, Apache-2.0).
"""

from __future__ import annotations

import json
import re
from typing import Any

from kohya_tuner import safeio, schema
from kohya_tuner.config_cmdline import parse_argv
from kohya_tuner.config_gui_form import _as_int, _fields, _form, _tail_args, launch_args
from kohya_tuner.config_gui_full import _dreambooth_toml, _finetune_toml
from kohya_tuner.config_gui_steps import as_read_back, counted_steps
from kohya_tuner.config_gui_lora import _OTHER_MODELS, _lora_toml
from kohya_tuner.config_loaded import LoadedConfig, guess_family
from kohya_tuner.errors import UserError
from kohya_tuner.families import FAMILIES, family_for_script, get_family

GUI_COMMIT = "45088f04af78e11cec5407ff4652ea3ed2c14422"

_GUI_PAIR_RE = re.compile(r'^\s*"([^"]+)"\s*:\s*(.+?)\s*,?\s*$')


def _salvage_json(text: str) -> tuple[dict[str, Any], bool]:
    """Parse JSON; when it is cut short (a truncated paste), keep every complete
    `"key": value` line rather than give up."""
    try:
        data = safeio.parse_guard(json.loads, text, "The JSON file")
        if not isinstance(data, dict):
            raise UserError("The JSON file does not hold an object of settings.")
        safeio.check_values(data, "The JSON file")
        return data, False
    except json.JSONDecodeError:
        pass
    except ValueError as exc:  # an integer beyond Python's digit limit
        raise UserError(f"The JSON file holds a value that cannot be read: {exc}.") from None
    data: dict[str, Any] = {}
    for line in text.splitlines():
        m = _GUI_PAIR_RE.match(line)
        if not m:
            continue
        try:
            data[m.group(1)] = json.loads(m.group(2).rstrip(","))
        except (ValueError, RecursionError):
            continue
    safeio.check_values(data, "The JSON file")
    if not data:
        raise UserError("The file is neither valid JSON nor a recognisable kohya_ss settings file.")
    return data, True


# ---- which tab a file belongs to -------------------------------------------------------

_TI_KEYS = ("token_string", "init_word", "num_vectors_per_token")
_FINETUNE_KEYS = ("train_dir", "image_folder", "dataset_repeats", "caption_metadata_filename",
                  "latent_metadata_filename", "full_path", "generate_caption_database")
_LORA_KEYS = ("LoRA_type", "network_dim")


def gui_tab(data: dict[str, Any]) -> str:
    """The GUI tab a saved file belongs to: "lora", "dreambooth" or "finetune". Files of the
    Textual Inversion tab and JSON that is no GUI settings file are refused by name."""
    if any(isinstance(v, dict) for v in data.values()):
        shown = ", ".join(list(data)[:3])
        raise UserError(f"The JSON is not a kohya_ss GUI settings file: its values are tables (keys: {shown}), "
                        "as in a dataset metadata file (meta_*.json), not the GUI's flat list of fields.",
                        "Give the JSON the GUI saves with its Configuration > Save button, an sd-scripts TOML, "
                        "or a file holding the training command line.")
    if any(k in data for k in _TI_KEYS):
        raise UserError("This kohya_ss file is a Textual Inversion config (it sets "
                        + ", ".join(k for k in _TI_KEYS if k in data)
                        + "): the GUI launches train_textual_inversion.py for it, which kohya-tuner does not read "
                          "or estimate.",
                        "kohya-tuner reads the GUI's LoRA, DreamBooth and Finetune tab files.")
    if any(k in data for k in _LORA_KEYS):
        return "lora"
    if any(k in data for k in _FINETUNE_KEYS):
        return "finetune"
    return "dreambooth"


_BUILDERS = {"lora": _lora_toml, "dreambooth": _dreambooth_toml, "finetune": _finetune_toml}


def gui_launch(data: dict[str, Any], notes: list[str] | None = None,
               broken: list[tuple[str, str]] | None = None) -> tuple[str, str, dict[str, Any], list[str], list[str]]:
    """What the GUI launches for a loaded file: (tab, entry script, the TOML's keys and values as
    sd-scripts reads them back, the `accelerate launch` options, the arguments after
    `--config_file`). `notes` gets what the GUI counted or changed; `broken` the (key, why) of a
    value the GUI's TOML cannot carry."""
    tab = gui_tab(data)
    form = _form(tab, data)
    others = [k for k in _OTHER_MODELS if form.get(k)] if tab != "lora" else []
    if others:
        raise UserError(f"This kohya_ss file trains with {others[0]} set (Anima, Lumina or HunyuanImage in the "
                        "GUI): kohya-tuner does not read those GUI tabs' settings yet.",
                        "Give the sd-scripts TOML the GUI prints with 'Print training command' instead.")
    try:
        if not form.get("dataset_config") and _as_int(form.get("max_train_steps"), 1) == 0:
            steps, said = counted_steps(tab, form)
            if steps is not None:
                form["max_train_steps"] = steps
            if notes is not None and said:
                notes.append(said)
        script, toml_data = _BUILDERS[tab](form)
        launch, tail = launch_args(form), _tail_args(form)
        toml_data, changed, unreadable = as_read_back(toml_data)
        if notes is not None:
            notes.extend(changed)
        if broken is not None:
            broken.extend(unreadable)
    except (TypeError, ValueError, OverflowError) as exc:
        # (OverflowError: a count given as "inf" or "1e400", which int() cannot take; the GUI fails there too.)
        raise UserError(f"The kohya_ss file holds a value the GUI cannot use: {exc}.") from None
    return tab, script, dict(sorted(toml_data.items())), launch, tail


# ---- into kohya-tuner's one form ------------------------------------------------------------

def read_gui_json(text: str, model: str | None = None) -> LoadedConfig:
    data, salvaged = _salvage_json(text)
    notes: list[str] = []
    if salvaged:
        notes.append("the JSON is incomplete (cut short?); read every complete setting line")
    known = set().union(*(_fields()[t] for t in ("lora", "dreambooth", "finetune"))) | set(_TI_KEYS)
    if not any(k in known for k in data) and not any(isinstance(v, dict) for v in data.values()):
        shown = ", ".join(list(data)[:5]) or "none"
        raise UserError(f"The JSON holds no kohya_ss or sd-scripts training setting (its keys: {shown}).",
                        "Give a kohya_ss GUI config (.json saved by the GUI), an sd-scripts TOML, or a file holding "
                        "the training command line.")
    broken: list[tuple[str, str]] = []
    tab, script, toml_data, launch, tail = gui_launch(data, notes, broken)
    from kohya_tuner.check import Problem
    from kohya_tuner.config_gui_form import unreadable_numbers

    notes.extend(unreadable_numbers(data))
    specs = schema.script_args(script)
    config = {k: v for k, v in toml_data.items() if k in specs}
    ignored = {k: v for k, v in toml_data.items() if k not in specs}
    if ignored:
        notes.append(f"the GUI's TOML also holds {', '.join(sorted(ignored))}, which {script} does not take "
                     "(sd-scripts ignores such keys)")
    if launch:
        notes.append("accelerate launch options from the file: " + " ".join(launch))
    problems: list = [Problem(key, why, "error", (key,), "kohya_gui: toml.dump, then library/train_util.py:"
                              "read_config_from_file (toml.load)", "gui_toml_unreadable", "config_file")
                      for key, why in broken]
    if tail:
        # additional_parameters follow --config_file on the command line: argparse reads them and
        # they win over the TOML's values. The GUI quotes each word (shlex.quote) and runs the list
        # with no shell, so a quote it adds is part of the value sd-scripts gets.
        extra = parse_argv([script, *tail], model=None)
        config.update(extra.config)
        notes.extend(extra.notes)
        problems.extend(extra.problems)
    assumptions: list[str] = []
    if tab == "lora":
        fam = get_family(model) if model else family_for_script(script, config)
        if fam is not None and fam.script != script and not model:
            fam = None
        if fam is None:
            weak: list[str] = []
            fam = guess_family(config, script, model, weak) or FAMILIES["sd15"]
        if not model and script == "train_network.py" and not data.get("v2") and "pretrained_model_name_or_path" \
                not in data:
            assumptions.append("model family SD 1.5: the kohya_ss file names no model and no sdxl / flux1_checkbox "
                               "field; the GUI then trains its default SD 1.5 model. Give --model to say otherwise")
        elif not model and script == "train_network.py" and "xl" in str(data.get("pretrained_model_name_or_path",
                                                                                 "")).lower():
            # The GUI picks the script from its SDXL tick box, never from the model's name.
            assumptions.append("model family SD 1.5: the kohya_ss file sets no sdxl field, so the GUI launches "
                               "train_network.py, though the model file's name contains 'xl'; if it is an SDXL model, "
                               "tick SDXL in the GUI (or give --model sdxl)")
    else:
        from kohya_tuner.memory.finetune import family_for as fine_tune_family

        fam = fine_tune_family(script, {"v2": bool(config.get("v2"))}, model)
        notes.append(f"the kohya_ss file is a {'DreamBooth' if tab == 'dreambooth' else 'Finetune'} tab config: "
                     f"a full fine-tune ({script})")
        if fam is None:
            return LoadedConfig(config, None, script, "kohya_gui_json", config.get("dataset_config"), notes,
                                launch=launch, ignored=ignored, problems=problems)
    return LoadedConfig(config, fam, script, "kohya_gui_json", config.get("dataset_config"), notes, assumptions,
                        problems=problems, launch=launch, ignored=ignored)
