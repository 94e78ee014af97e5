"""Add the entry scripts missing from vendor/sd-scripts/args.json, in its format, from the pinned source.

args.json was made by importing each entry module and calling its setup_parser() with argparse's
add_argument wrapped to record which helper added each argument (see its "extraction" block). This
does the same for the scripts given on the command line, under a venv that has sd-scripts'
requirements (the real-trainer venv):

    KOHYA=/root/.cache/kohya-tuner/realtrainer
    $KOHYA/venv/bin/python tools/sdscripts_args.py --sdscripts $KOHYA/sd-scripts \
        lumina_train_network.py hunyuan_image_train_network.py anima_train_network.py

An argument that another script in args.json already has, added by the same helper, keeps that
entry (its desc, toml kind and flags) after checking that type, default, choices and nargs agree;
the arguments no script had before get the descriptions in NEW_DESCS below (ours, in our words).
tests/test_families_new.py compares every new script's argument set with kohya_tuner.sdscripts'
ast reader (the one `setup` verifies a checkout with).
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import sys

PURPOSE = {
    "lumina_train_network.py": "LoRA training for Lumina Image 2.0",
    "hunyuan_image_train_network.py": "LoRA training for HunyuanImage-2.1",
    "anima_train_network.py": "LoRA training for Anima",
}

# One line per argument that no script in args.json had; what it does, from reading the code.
NEW_DESCS = {
    "gemma2": "Gemma-2 2B text encoder weights file",
    "ae": "autoencoder weights file",
    "gemma2_max_token_length": "Gemma-2 caption token length",
    "use_flash_attn": "use the flash-attn package for attention",
    "use_sage_attn": "use SageAttention for attention",
    "system_prompt": "system prompt put before every caption",
    "sample_batch_size": "batch size while sampling images",
    "renorm_cfg": "renormalise classifier-free guidance while sampling",
    "text_encoder": "Qwen2.5-VL text encoder weights file (bf16)",
    "byt5": "ByT5 glyph encoder weights file (fp16)",
    "fp8_scaled": "store the DiT in scaled fp8 (per-tensor scale)",
    "fp8_vl": "store the Qwen2.5-VL text encoder in fp8",
    "text_encoder_cpu": "run the text encoders on the CPU",
    "vae_chunk_size": "spatial chunk size for VAE encode/decode (None: no chunking)",
    "attn_mode": "attention implementation (torch, xformers, flash, sageattn)",
    "split_attn": "split the batch inside attention to save memory",
    "qwen3": "Qwen3 0.6B text encoder (safetensors file or folder)",
    "llm_adapter_path": "separate LLM adapter weights (default: from the DiT file)",
    "llm_adapter_lr": "learning rate of the LLM adapter (0 freezes it)",
    "self_attn_lr": "learning rate of self-attention layers (0 freezes them)",
    "cross_attn_lr": "learning rate of cross-attention layers (0 freezes them)",
    "mlp_lr": "learning rate of MLP layers (0 freezes them)",
    "mod_lr": "learning rate of AdaLN modulation layers (0 freezes them)",
    "t5_tokenizer_path": "T5 tokenizer folder (default: configs/t5_old)",
    "qwen3_max_token_length": "Qwen3 caption token length",
    "t5_max_token_length": "T5 token length for the LLM adapter",
    "vae_disable_cache": "turn off the VAE's internal cache (less memory)",
    "unsloth_offload_checkpointing": "offload checkpointed activations to CPU asynchronously",
    "timestep_sampling": "how training timesteps are drawn",
    "sigmoid_scale": "scale of sigmoid timestep sampling",
    "model_prediction_type": "how the model prediction is interpreted",
    "discrete_flow_shift": "shift of the flow-matching timestep schedule",
}


def _kind(action: argparse.Action) -> tuple[str, str | None, str]:
    """(type, item_type, toml) in args.json's vocabulary."""
    if isinstance(action, argparse._StoreTrueAction):
        return "bool-store_true", None, "boolean"
    if isinstance(action, argparse._StoreFalseAction):
        return "bool-store_false", None, "boolean"
    # Path and other converters of text are "str" in args.json (free string, also path-like).
    t = {int: "int", float: "float"}.get(action.type, "str")
    if action.nargs in ("*", "+"):
        return "list", t, f"array of {'string' if t == 'str' else t}"
    return t, None, {"str": "string", "int": "integer", "float": "float"}.get(t, "string")


def _jsonable(v):
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def collect(script: str, root: str) -> tuple[list[dict], list[str]]:
    calls: list[tuple[argparse.Action, str]] = []
    orig = argparse._ActionsContainer.add_argument

    def wrapped(self, *args, **kwargs):
        action = orig(self, *args, **kwargs)
        frame = inspect.currentframe().f_back
        rel = os.path.relpath(frame.f_code.co_filename, root).replace(os.sep, "/")
        calls.append((action, f"{rel}:{frame.f_code.co_name}"))
        return action

    argparse._ActionsContainer.add_argument = wrapped
    try:
        mod = importlib.import_module(script[:-3])
        mod.setup_parser()
    finally:
        argparse._ActionsContainer.add_argument = orig
    out, chain = [], []
    for action, source in calls:
        if action.dest == "help":
            continue
        typ, item, toml = _kind(action)
        ent = {"name": action.dest, "type": typ}
        if item:
            ent["item_type"] = item
        ent.update({"default": _jsonable(action.default), "choices": _jsonable(action.choices),
                    # argparse gives flags nargs=0; args.json writes null for them.
                    "nargs": None if typ.startswith("bool-") else action.nargs, "toml": toml, "source": source})
        out.append(ent)
        if source not in chain:
            chain.append(source)
    return out, chain


def merge(data: dict, script: str, fresh: list[dict], chain: list[str]) -> list[str]:
    known: dict[tuple[str, str], dict] = {}
    for spec in data["scripts"].values():
        for a in spec["args"]:
            known.setdefault((a["name"], a["source"]), a)
    args, notes = [], []
    for ent in fresh:
        old = known.get((ent["name"], ent["source"]))
        if old is not None:
            same = all(old.get(k) == ent.get(k) for k in ("default", "choices", "nargs"))
            same = same and (old["type"] == ent["type"] or old["type"] == "int_or_float")
            if same:
                args.append(dict(old))
                continue
            notes.append(f"{script}: {ent['name']} differs from the entry of another script; taken as read")
        desc = NEW_DESCS.get(ent["name"])
        if desc is None:
            raise SystemExit(f"{script}: no description for new argument {ent['name']!r} (add it to NEW_DESCS)")
        args.append({**ent, "desc": desc})
    data["scripts"][script] = {"tier": "primary", "purpose": PURPOSE.get(script, "LoRA training"),
                               "setup_parser_chain": chain, "arg_count": len(args), "args": args}
    data.setdefault("summary", {})[script] = len(args)
    return notes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdscripts", required=True)
    ap.add_argument("--out", default="vendor/sd-scripts/args.json")
    ap.add_argument("scripts", nargs="+")
    a = ap.parse_args(argv)
    out = os.path.abspath(a.out)
    root = os.path.abspath(a.sdscripts)
    sys.path.insert(0, root)
    os.chdir(root)
    import logging
    logging.disable(logging.WARNING)
    with open(out, encoding="utf-8") as fh:
        data = json.load(fh)
    for script in a.scripts:
        fresh, chain = collect(script, root)
        for note in merge(data, script, fresh, chain):
            print(note)
        print(f"{script}: {len(fresh)} arguments, chain {len(chain)} helpers")
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
