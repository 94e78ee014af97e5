#!/usr/bin/env python3
"""Record what the bmaltais/kohya_ss GUI itself launches for each JSON file it ships.

Never imported by kohya_tuner. Run it with its own venv, from an exported GUI tree:

    python3 -m venv /work/gui-venv
    /work/gui-venv/bin/pip install gradio==6.17.3 toml==0.10.2 rich easygui==0.98.3 psutil safetensors
    git --git-dir=/work/.mirror/bmaltais+kohya_ss/repo archive <commit> | tar -x -C /tmp/kohya_ss
    /work/gui-venv/bin/python tools/gui_oracle.py --gui /tmp/kohya_ss --commit <commit> \
        --out tests/data/kohya_gui

With --exports DIR it loads kohya-tuner's own `--gui-json` files instead (written by
tools/gui_export_inputs.py into tests/data/kohya_gui/exports) through the same path in the LoRA
tab, fills no folder, and writes --out/export_records.json (the TOML, the argv and the prompt
file the GUI wrote):

    PYTHONPATH=.:tests python tools/gui_export_inputs.py --out tests/data/kohya_gui/exports
    /work/gui-venv/bin/python tools/gui_oracle.py --gui /tmp/kohya_ss --commit <commit> \
        --out tests/data/kohya_gui --exports tests/data/kohya_gui/exports

What runs is the GUI's own code, the way its "Print training command" button runs it:
the tab is built inside a gradio Blocks (lora_tab / dreambooth_tab / finetune_tab / ti_tab),
its `last_built_gui_entries["load_configuration"]` callable loads the JSON (open_configuration,
with update_my_data), the loaded values pass through each component's postprocess/preprocess
as the browser round trip does, and `last_built_gui_entries["print_command"]` calls
train_model(print_only=True). The TOML it writes and the argv it prints are recorded.

Nothing is stubbed out of the command-building code. What the tool changes, and why:
  * path validators (validate_file_path, validate_folder_path, validate_model_path,
    validate_toml_file, require_writable_directory, verify_image_folder_pattern) pass every
    non-empty path: the shipped files name paths of their authors' machines, and the record is
    about what the GUI makes of the values, which it keeps as they are. Empty values still go
    to the GUI's own validator.
  * the image folder (train_data_dir) is read as an empty folder, so the GUI counts no images
    (its max_train_steps arithmetic then gives 0 when the file says 0).
  * join_config_path keeps the GUI's own check but puts the TOML in a scratch folder, and
    create_prompt_file writes its prompt file there too; the tool records these two invented
    paths as <CONFIG_TOML> and <OUTPUT_DIR>/sample/prompt.txt.
  * get_executable_path("accelerate") returns "accelerate"; save_to_file (which keeps a log
    of printed commands in the GUI's folder) does nothing.
No module is stubbed: the GUI imports with gradio, toml, rich, easygui, psutil and safetensors.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

TABS = {
    "lora": ("lora_gui", "lora_tab"),
    "dreambooth": ("dreambooth_gui", "dreambooth_tab"),
    "finetune": ("finetune_gui", "finetune_tab"),
    "textual_inversion": ("textual_inversion_gui", "ti_tab"),
}

TI_KEYS = ("token_string", "init_word", "num_vectors_per_token")
FINETUNE_KEYS = ("train_dir", "image_folder", "dataset_repeats", "caption_metadata_filename",
                 "latent_metadata_filename", "full_path", "generate_caption_database")


def classify(rel: str, data) -> str:
    """Which GUI tab a shipped file belongs to: its presets/ folder says it; for test/config the
    file's own fields do (the same rule kohya_tuner.config_gui documents)."""
    if not isinstance(data, dict) or any(isinstance(v, dict) for v in data.values()):
        return "not_a_config"
    parts = Path(rel).parts
    if parts[0] == "presets":
        return {"lora": "lora", "dreambooth": "dreambooth", "finetune": "finetune"}[parts[1]]
    if any(k in data for k in TI_KEYS):
        return "textual_inversion"
    if "LoRA_type" in data or "network_dim" in data:
        return "lora"
    if any(k in data for k in FINETUNE_KEYS):
        return "finetune"
    # test/config/Standard-AdamW*.json and SDXL-Standard-AdamW.json are named for the LoRA tab's
    # "Standard" type but hold the very fields dreambooth-AdamW.json holds and no network field:
    # the content says DreamBooth.
    return "dreambooth"


class _EmptyDirOS:
    """The module's `os`, with listdir of a missing folder giving no entries."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def mkdir(self, path, *a, **kw):
        """The finetune tab makes its train_dir even when it only prints: not here."""

    def listdir(self, path="."):
        if not self._real.path.isdir(path):
            return []
        return self._real.listdir(path)


def build_tabs(gui: Path, scratch: Path):
    sys.path.insert(0, str(gui))
    os.chdir(gui)
    import gradio as gr
    from kohya_gui import common_gui, class_sample_images
    from kohya_gui.class_gui_config import KohyaSSGUIConfig
    import importlib

    built = {}
    state = {"cmd": None, "toml_path": None, "output_dir": None}

    def passes(original):
        def check(path="", *a, **kw):
            if isinstance(path, str) and path.strip():
                return True
            return original(path, *a, **kw)
        return check

    def join_config_path(base_dir, filename):
        common_gui.join_config_path(base_dir, filename)  # the GUI's own refusal of an empty folder
        state["output_dir"] = base_dir
        path = scratch / filename
        state["toml_path"] = str(path)
        return str(path)

    def create_prompt_file(sample_prompts, output_dir):
        state["output_dir"] = output_dir
        return class_sample_images.create_prompt_file(sample_prompts, str(scratch))

    def print_command_and_toml(run_cmd, tmpfilename):
        state["cmd"] = list(run_cmd)

    for kind, (modname, tabname) in TABS.items():
        mod = importlib.import_module(f"kohya_gui.{modname}")
        for name in ("validate_file_path", "validate_folder_path", "validate_model_path", "validate_toml_file",
                     "require_writable_directory", "verify_image_folder_pattern"):
            if hasattr(mod, name):
                setattr(mod, name, passes(getattr(common_gui, name)))
        mod.join_config_path = join_config_path
        mod.print_command_and_toml = print_command_and_toml
        mod.get_executable_path = lambda name=None: name or ""
        if hasattr(mod, "create_prompt_file"):
            mod.create_prompt_file = create_prompt_file
        mod.os = _EmptyDirOS(os)
        with gr.Blocks():
            getattr(mod, tabname)(headless=True, config=KohyaSSGUIConfig())
        registry = list(mod.last_built_field_registry)
        built[kind] = (mod, registry, dict(mod.last_built_gui_entries))
    common_gui.save_to_file = lambda content: None
    return built, state


def field_table(built) -> dict:
    """Each tab's fields as kohya_tuner reads them: the kind of component (what the browser round
    trip does to a value) and the value a fresh tab holds (what a field missing from a file gets)."""
    import gradio as gr

    tables = {}
    for kind, (mod, registry, entries) in built.items():
        fields = {}
        for name, comp in registry:
            if isinstance(comp, gr.Checkbox):
                what = "bool"
            elif isinstance(comp, gr.Textbox):
                what = "text"
            elif isinstance(comp, gr.Number) and comp.precision == 0:
                what = "int"
            elif isinstance(comp, (gr.Dropdown, gr.Radio)):
                what = "choice"
            else:
                what = "number"
            fields[name] = [what, roundtrip(comp, comp.value)]
        tables[kind] = fields
    return tables


def field_limits(built) -> dict:
    """What each tab's form refuses when the button is pressed (gradio's preprocess): a number
    below `min` or above `max`, a dropdown value outside `choices` (unless custom values are
    allowed). Only fields with a limit are listed."""
    import gradio as gr

    tables = {}
    for kind, (mod, registry, entries) in built.items():
        fields = {}
        for name, comp in registry:
            lim = {}
            if isinstance(comp, (gr.Number, gr.Slider)):
                if getattr(comp, "minimum", None) is not None:
                    lim["min"] = comp.minimum
                if getattr(comp, "maximum", None) is not None:
                    lim["max"] = comp.maximum
            elif isinstance(comp, (gr.Dropdown, gr.Radio)) and not getattr(comp, "allow_custom_value", False) \
                    and not getattr(comp, "multiselect", False):
                lim["choices"] = [c[1] if isinstance(c, (tuple, list)) else c for c in comp.choices]
            if lim:
                fields[name] = lim
        tables[kind] = fields
    return tables


def roundtrip(comp, value, errors=None, name=None):
    """What a value loaded into a component comes back as when the button is pressed: the
    browser shows a text box's None as empty and sends back "". A value the component's
    preprocess refuses (a dropdown value not among its choices, a slider value beyond its
    maximum) is kept as it is and the refusal listed in `errors`."""
    import gradio as gr

    try:
        value = comp.preprocess(comp.postprocess(value))
    except Exception as exc:
        if errors is not None:
            errors[name] = f"{type(exc).__name__}: {exc}"
    if value is None and isinstance(comp, gr.Textbox):
        return ""
    return value


def component_data(registry, entries, overrides=None):
    comps = entries["components"]
    data = {comp: roundtrip(comp, comp.value) for _, comp in registry}
    data.update({comps["dummy_headless"]: True, comps["dummy_db_true"]: True, comps["dummy_db_false"]: False})
    for key in ("config_file_name", "training_preset"):
        if key in comps:
            data[comps[key]] = comps[key].value
    if overrides:
        data.update(overrides)
    return data


PROMPT_FILE = "<OUTPUT_DIR>/sample/prompt.txt"
# What a user types into the folder fields a shipped preset leaves empty (the GUI refuses to
# print a command without them); the records list which ones were filled.
FILLED = {"output_dir": "/oracle/output", "train_data_dir": "/oracle/img", "image_folder": "/oracle/img"}


def run_one(built, state, kind, path: Path, scratch: Path, fill: bool = True):
    mod, registry, entries = built[kind]
    comps = entries["components"]
    data = component_data(registry, entries, {comps["config_file_name"]: str(path)})
    loaded = entries["load_configuration"](data)
    names = {comp: name for name, comp in registry}
    component_errors = {}
    for comp, value in loaded.items():
        if comp in names:
            data[comp] = roundtrip(comp, value, component_errors, names[comp])
    filled = {}
    for name, comp in registry:
        if fill and name in FILLED and data.get(comp) in ("", None):
            data[comp] = filled[name] = FILLED[name]
    for f in scratch.iterdir():
        if f.is_file():
            f.unlink()
        else:
            shutil.rmtree(f)
    state.update(cmd=None, toml_path=None, output_dir=None)
    logs = io.StringIO()
    handler = logging.StreamHandler(logs)
    handler.setLevel(logging.INFO)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            entries["print_command"](data)
    finally:
        root.removeHandler(handler)
    if state["cmd"] is None:
        errors = [ln for ln in logs.getvalue().splitlines() if ln.strip()]
        return {"refused": True, "filled_by_oracle": filled, "component_errors": component_errors, "gui_log": errors[-5:]}
    toml_text = Path(state["toml_path"]).read_text(encoding="utf-8")
    # The prompt file the GUI writes under output_dir (here: the scratch folder).
    toml_text = toml_text.replace(str(scratch / "sample" / "prompt.txt"), PROMPT_FILE)
    argv = ["<CONFIG_TOML>" if a == state["toml_path"] else a for a in state["cmd"]]
    import toml

    rec = {"refused": False, "filled_by_oracle": filled, "component_errors": component_errors, "argv": argv, "toml_text": toml_text}
    prompt_file = scratch / "sample" / "prompt.txt"
    if prompt_file.is_file():
        rec["prompt_text"] = prompt_file.read_text(encoding="utf-8")
    try:
        rec["toml"] = toml.loads(toml_text)
    except toml.TomlDecodeError as exc:
        # The GUI wrote a TOML that toml 0.10.2 (sd-scripts' parser too) cannot read back.
        rec["toml"] = None
        rec["toml_error"] = f"TomlDecodeError: {exc}"
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gui", required=True, type=Path)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--fields-out", type=Path, help="write the tabs' field table (kohya_tuner/data/kohya_gui_fields.json)")
    ap.add_argument("--exports", type=Path, metavar="DIR",
                    help="instead of the GUI's own files: load each JSON in DIR (kohya-tuner's --gui-json files, "
                         "tools/gui_export_inputs.py) in the LoRA tab and record into --out/export_records.json")
    args = ap.parse_args()
    if args.exports:
        return record_exports(args)
    gui = args.gui.resolve()
    fields_out = args.fields_out.resolve() if args.fields_out else None
    out = args.out.resolve()
    files = sorted([*gui.glob("presets/**/*.json"), *gui.glob("test/config/*.json")])
    scratch = Path(tempfile.mkdtemp(prefix="gui-oracle-"))
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    built, state = build_tabs(gui, scratch)
    if fields_out:
        table = {"source": f"bmaltais/kohya_ss {args.commit} (Apache-2.0), recorded by tools/gui_oracle.py",
                 "tabs": field_table(built), "limits": field_limits(built)}
        fields_out.write_text(json.dumps(table, indent=0, sort_keys=True) + "\n", encoding="utf-8")
    records = []
    (out / "inputs").mkdir(parents=True, exist_ok=True)
    for path in files:
        rel = path.relative_to(gui).as_posix()
        text = path.read_text(encoding="utf-8")
        (out / "inputs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / "inputs" / rel).write_text(text, encoding="utf-8")
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        kind = classify(rel, data)
        rec = {"source": rel, "gui_commit": args.commit, "kind": kind}
        if kind != "not_a_config":
            try:
                result = run_one(built, state, kind, path, scratch)
            except Exception as exc:
                result = {"refused": True, "gui_error": f"{type(exc).__name__}: {exc}",
                          "gui_traceback_tail": traceback.format_exc().splitlines()[-12:]}
            if not result["refused"]:
                argv = result["argv"]
                script = next((a for a in argv if a.endswith(".py")), None)
                result["script"] = Path(script).name if script else None
                result["argv"] = [a.replace(str(gui) + "/", "") for a in argv]
            rec.update(result)
        records.append(rec)
        print(f"{rel}: {kind} {'REFUSED' if rec.get('refused') else rec.get('script', '')}", file=sys.stderr)
    (out / "records.json").write_text(json.dumps(records, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


def record_exports(args) -> int:
    """Our exported files through the same load + print-command path as the GUI's own files, in
    the LoRA tab, with no folder filled in by the oracle (the files name their own)."""
    gui = args.gui.resolve()
    exports = args.exports.resolve()
    out = args.out.resolve()
    scratch = Path(tempfile.mkdtemp(prefix="gui-oracle-"))
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    built, state = build_tabs(gui, scratch)
    records = []
    for path in sorted(exports.glob("*.json")):
        rec = {"source": path.name, "gui_commit": args.commit, "kind": "lora"}
        try:
            result = run_one(built, state, "lora", path, scratch, fill=False)
        except Exception as exc:
            result = {"refused": True, "gui_error": f"{type(exc).__name__}: {exc}",
                      "gui_traceback_tail": traceback.format_exc().splitlines()[-12:]}
        if not result["refused"]:
            argv = result["argv"]
            script = next((a for a in argv if a.endswith(".py")), None)
            result["script"] = Path(script).name if script else None
            result["argv"] = [a.replace(str(gui) + "/", "") for a in argv]
            result.pop("toml_text", None)  # the parsed TOML is kept; its text adds nothing to compare
        rec.update(result)
        records.append(rec)
        print(f"{path.name}: {'REFUSED' if rec.get('refused') else rec.get('script', '')}", file=sys.stderr)
    (out / "export_records.json").write_text(json.dumps(records, indent=1, ensure_ascii=False) + "\n",
                                             encoding="utf-8")
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
