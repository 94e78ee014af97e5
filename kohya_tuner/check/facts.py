"""The values sd-scripts would see: the config with argparse defaults, every dataset
and subset after the dataset file's precedence, and a few derived facts.

Rules (rules.toml) only compare values; whatever needs parsing (network_args items,
the effective optimizer, a resolution string) is derived here once, under a name that
starts with `@`, so the rule data stays declarative.
"""

from __future__ import annotations

import sys

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kohya_tuner.check import argschema
from kohya_tuner.families import FAMILIES, family_for_script, looks_like_hub_id

MISSING = object()

# argparse names that feed a dataset-file key of another name (config_util's map).
ARG_FOR_DATASET_KEY = {"batch_size": "train_batch_size", "num_repeats": "dataset_repeats"}

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".avif", ".jxl")


def parse_resolution(v: Any) -> tuple[int, int] | None:
    """Resolution as sd-scripts ends with it: "512" -> (512, 512), [w, h] -> (w, h)."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return (v, v)
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return (v[0], v[1])
    if isinstance(v, str):
        try:
            parts = [int(p) for p in v.split(",")]
        except ValueError:
            return None
        if len(parts) == 1:
            return (parts[0], parts[0])
        if len(parts) == 2:
            return (parts[0], parts[1])
    return None


def split_kv(items: Any, *, at_first: bool) -> tuple[dict[str, str], str | None]:
    """`key=value` items as sd-scripts splits them, and the first item it cannot split.
    network_args split at the first `=`; optimizer and scheduler args need exactly one."""
    out: dict[str, str] = {}
    bad = None
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, str):
            continue
        n = item.count("=")
        if n == 0 or (n > 1 and not at_first):
            bad = bad or item
            continue
        k, v = item.split("=", 1)
        out[k.strip() if at_first else k] = v.strip() if at_first else v
    return out, bad


def _literal_ok(text: str) -> bool:
    import ast

    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    return True


def _literal(text: str) -> Any:
    import ast

    return ast.literal_eval(text)


def _optimizer(cfg: dict[str, Any]) -> str:
    """The lower-case optimizer name get_optimizer ends with."""
    if cfg.get("use_8bit_adam"):
        return "adamw8bit"
    if cfg.get("use_lion_optimizer"):
        return "lion"
    name = cfg.get("optimizer_type")
    if not isinstance(name, str) or not name:
        return "adamw"
    return name.lower()


@dataclass
class Subset:
    values: dict[str, Any]


@dataclass
class Dataset:
    values: dict[str, Any]
    subsets: list[Subset] = field(default_factory=list)


# Settings sd-scripts hands to diffusers' from_pretrained when they are not a local file, so a
# Hugging Face id is no missing file: the base everywhere (_load_target_model), and the VAE where
# SD 1.x/2.x and SDXL load it through model_util.load_vae (library/model_util.py:1271); the other
# families load their VAE from a file with their own loaders.
_SD_SCRIPTS_NETWORKS = ("lora", "dylora", "lora_fa", "lora_flux", "lora_sd3", "lora_lumina", "lora_anima",
                        "lora_hunyuan_image", "oft", "oft_flux")
_SKIPS_ZERO_LR = ("networks.lora", "networks.lora_flux", "networks.lora_sd3", "networks.lora_lumina",
                  "networks.lora_anima", "networks.dylora")
_SD_VAE = ("pretrained_model_name_or_path", "vae")
_HUB_LOADED = {s: _SD_VAE for s in ("train_network.py", "sdxl_train_network.py", "train_db.py", "fine_tune.py",
                                    "sdxl_train.py")}


def _lycoris_unsplittable(family: str | None, c: dict[str, Any]) -> str | None:
    """The layer widths LyCORIS BOFT cannot build at this rank (memory.lycoris.unsplittable, the
    ladder's own test), as text; None when it can or the family is not known."""
    if not family or c.get("network_module") != "lycoris.kohya":
        return None
    from kohya_tuner.memory import lycoris

    return ", ".join(map(str, lycoris.unsplittable(family, c))) or None


def _swap_limit(script: str, family: str | None) -> int:
    fam = FAMILIES.get(family or "")
    if fam is not None and fam.script == script and fam.blocks_to_swap_max:
        return fam.blocks_to_swap_max
    return max(f.blocks_to_swap_max or 0 for f in FAMILIES.values() if f.script == script)
def _model_files(script: str, config: dict[str, Any]) -> tuple[str, ...]:
    """The model files the script's load_target_model hands to a loader that opens the path, with no
    default and no fallback (a path of None stops the run while the models load): the family's
    required files but the base, as `family_for_script` picks the family (Chroma by model_type, which
    uses no CLIP-L). SD3's loaders would take the encoders from an all-in-one base file, but strip
    only part of their key prefix at the pin (sd3_utils.py:113), so the weights stay unplaced."""
    fam = family_for_script(script, config)
    if fam is None:
        return ()
    return tuple(k for k in fam.required_files if k != "pretrained_model_name_or_path")


class Context:
    """Everything a rule may read, for one config (and its dataset file) and one script."""

    def __init__(self, config: dict[str, Any], script: str, *, dataset: dict[str, Any] | None = None,
                 family_name: str | None = None, filesystem: bool = False, base_dir: str | Path | None = None):
        self.script = script
        self.family = family_name
        self.user = dict(config)
        self.cfg = {**argschema.defaults(script), **config}
        self.dataset_doc = dataset if isinstance(dataset, dict) else None
        self.filesystem = filesystem
        self.base_dir = Path(base_dir) if base_dir else None
        self.ds_keys = argschema.raw_schema()["dataset_config"]["keys"]
        self.general = dict((self.dataset_doc or {}).get("general") or {}) if self.dataset_doc else {}
        if not isinstance(self.general, dict):
            self.general = {}
        self.datasets = self._datasets()
        self.derived = self._derive()

    # ---- datasets ------------------------------------------------------------------

    def _datasets(self) -> list[Dataset]:
        doc = self.dataset_doc
        if doc is not None:
            out = []
            for ds in doc.get("datasets") or []:
                if not isinstance(ds, dict):
                    continue
                subs = [Subset(dict(s)) for s in ds.get("subsets") or [] if isinstance(s, dict)]
                out.append(Dataset({k: v for k, v in ds.items() if k != "subsets"}, subs))
            return out
        # Without a dataset file sd-scripts builds one DreamBooth dataset from train_data_dir's
        # `N_name` folders (config_util.generate_dreambooth_subsets_config_by_subdirs).
        subs = []
        tdd = self.cfg.get("train_data_dir")
        if self.cfg.get("in_json") is not None:
            return [Dataset({}, [Subset({"image_dir": tdd, "metadata_file": self.cfg["in_json"]})])]
        if self.filesystem and isinstance(tdd, str) and self.cfg.get("in_json") is None:
            root = self._path(tdd)
            if root.is_dir():
                for sub in sorted(root.iterdir()):
                    head = sub.name.split("_", 1)[0]
                    if sub.is_dir() and head.isdigit() and int(head) >= 1:
                        subs.append(Subset({"image_dir": str(sub), "num_repeats": int(head)}))
        if not subs:
            subs = [Subset({})]
        return [Dataset({}, subs)]

    def _path(self, p: str) -> Path:
        path = Path(p).expanduser()
        if not path.is_absolute() and self.base_dir is not None:
            path = self.base_dir / path
        return path

    def lookup(self, key: str, ds: Dataset | None = None, sub: Subset | None = None) -> Any:
        """The value of `key` as the dataset (and subset) in scope sees it."""
        if key.startswith("@"):
            if ds is not None:
                v = self._scoped_fact(key, ds, sub)
                if v is not MISSING:
                    return v
            return self.derived.get(key)
        spec = self.ds_keys.get(key)
        if spec is not None and ds is not None:
            if sub is not None and key in sub.values and "subsets" in spec["levels"]:
                return sub.values[key]
            if key in ds.values and "datasets" in spec["levels"]:
                return ds.values[key]
            if key in self.general:
                return self.general[key]
            arg = ARG_FOR_DATASET_KEY.get(key, key)
            if self.cfg.get(arg) is not None:
                v = self.cfg[arg]
                return parse_resolution(v) if key == "resolution" else v
            return spec.get("effective_default")
        if key in ARG_FOR_DATASET_KEY.values() and ds is not None:
            return self.lookup(next(k for k, a in ARG_FOR_DATASET_KEY.items() if a == key), ds, sub)
        return self.cfg.get(key)

    def _scoped_fact(self, key: str, ds: Dataset, sub: Subset | None) -> Any:
        if key in ("@res_min", "@res_max", "@res_w", "@res_h"):
            res = parse_resolution(self.lookup("resolution", ds, sub))
            if res is None:
                return None
            return {"@res_min": min(res), "@res_max": max(res), "@res_w": res[0], "@res_h": res[1]}[key]
        if key in ("@min_bucket_adjusted", "@max_bucket_adjusted"):
            step = self.lookup("bucket_reso_steps", ds, sub)
            lo, hi = self.lookup("min_bucket_reso", ds, sub), self.lookup("max_bucket_reso", ds, sub)
            if not all(isinstance(x, int) and not isinstance(x, bool) for x in (step, lo, hi)) or step <= 0:
                return None
            if key == "@min_bucket_adjusted":
                return lo - lo % step
            return hi if hi % step == 0 else hi + step - hi % step
        if key == "@subset_dir_missing":
            d = sub.values.get("image_dir") if sub else None
            return self.filesystem and isinstance(d, str) and not self._path(d).is_dir()
        if key == "@subset_has_no_images":
            d = sub.values.get("image_dir") if sub else None
            if not (self.filesystem and isinstance(d, str) and self._path(d).is_dir()):
                return False
            return not any(p.suffix.lower() in IMAGE_SUFFIXES for p in self._path(d).iterdir())
        if key == "@empty_caption":
            return self._empty_caption(ds, sub)
        if key in ("@image_too_large", "@image_too_small"):
            return self._fixed_size_image(key, ds, sub)
        if key == "@image_below_bucket_step":
            return self._below_bucket_step(ds, sub)
        if key in ("@finetune_dataset", "@mixed_subsets"):
            meta = [("metadata_file" in s.values) for s in ds.subsets if s.values]
            if key == "@finetune_dataset":
                return bool(meta) and all(meta)
            return any(meta) and not all(meta)
        return MISSING

    def _fixed_size_image(self, key: str, ds: Dataset, sub: Subset | None) -> str | None:
        """Without buckets (and without cached latents) every image must come out exactly at
        the resolution: a larger one only with random_crop, a smaller one never."""
        d = sub.values.get("image_dir") if sub else None
        res = parse_resolution(self.lookup("resolution", ds, sub))
        if not (self.filesystem and isinstance(d, str) and res and self._path(d).is_dir()):
            return None
        from PIL import Image  # only when files are checked

        from kohya_tuner.printable import printable

        width, height = res
        for img in sorted(self._path(d).iterdir()):
            if img.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            try:
                if not img.is_file():  # a pipe or device named like a picture would block the read
                    continue
                with Image.open(img) as im:
                    w, h = im.size
            except (OSError, ValueError):
                continue  # unreadable images are the dataset command's business
            if key == "@image_too_large" and (w > width or h > height):
                return f"{printable(str(img))} ({w}x{h})"
            if key == "@image_too_small" and (w < width or h < height):
                return f"{printable(str(img))} ({w}x{h})"
        return None

    def _below_bucket_step(self, ds: Dataset, sub: Subset | None) -> str | None:
        """The first image with a side shorter than the bucket step: sd-scripts rounds each
        side down to the step and, with bucket_no_upscale, never scales the image up first."""
        d = sub.values.get("image_dir") if sub else None
        step = self.lookup("bucket_reso_steps", ds, sub)
        if not (self.filesystem and isinstance(d, str) and isinstance(step, int) and step > 0
                and self._path(d).is_dir()):
            return None
        from PIL import Image  # only when files are checked

        for img in sorted(self._path(d).iterdir()):
            if img.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            try:
                with Image.open(img) as im:
                    w, h = im.size
            except (OSError, ValueError):
                continue
            if min(w, h) < step:
                return f"{img} ({w}x{h})"
        return None

    def _empty_caption(self, ds: Dataset, sub: Subset | None) -> str | None:
        d = sub.values.get("image_dir") if sub else None
        if not (self.filesystem and isinstance(d, str) and self._path(d).is_dir()):
            return None
        ext = self.lookup("caption_extension", ds, sub)
        ext = self.cfg.get("caption_extension") or ".caption" if ext is None else ext
        if not isinstance(ext, str):
            return None
        for img in self._path(d).iterdir():
            if img.suffix.lower() in IMAGE_SUFFIXES:
                cap = img.with_suffix(ext) if ext.startswith(".") else Path(str(img.with_suffix("")) + ext)
                if cap.is_file() and cap.stat().st_size == 0:
                    return str(cap)
        return None

    def scopes(self, scope: str):
        """(dataset, subset) pairs a rule of `scope` is evaluated over."""
        if scope == "config":
            yield None, None
        elif scope == "dataset":
            for ds in self.datasets:
                yield ds, None
        else:
            for ds in self.datasets:
                for sub in ds.subsets or [Subset({})]:
                    yield ds, sub

    # ---- derived facts ---------------------------------------------------------------

    def _derive(self) -> dict[str, Any]:
        c = self.cfg
        d: dict[str, Any] = {}
        d["@script"] = self.script
        d["@optimizer"] = _optimizer(c)
        # A standard-library module is never a network module (no create_network).
        mod = c.get("network_module")
        d["@network_module_stdlib"] = (isinstance(mod, str) and mod.split(".")[0] in sys.stdlib_module_names)
        # importlib.import_module needs a dotted name, and sd-scripts' own `networks` package holds
        # only these modules with a create_network at the pin; any other package may be installed.
        d["@network_module_unimportable"] = isinstance(mod, str) and (
            not all(part.isidentifier() for part in mod.split("."))
            or mod.startswith("networks.") and mod[len("networks."):] not in _SD_SCRIPTS_NETWORKS)
        opt_kw, d["@bad_optimizer_arg"] = split_kv(c.get("optimizer_args"), at_first=False)
        d["@optimizer_arg_not_literal"] = next((f"{k}={v}" for k, v in opt_kw.items() if not _literal_ok(v)), None)
        sch_kw, d["@bad_lr_scheduler_arg"] = split_kv(c.get("lr_scheduler_args"), at_first=False)
        d["@lr_scheduler_arg_not_literal"] = next((f"{k}={v}" for k, v in sch_kw.items() if not _literal_ok(v)),
                                                  None)
        d["@lr_scheduler_arg_keys"] = sorted(sch_kw)
        net, d["@bad_network_arg"] = split_kv(c.get("network_args"), at_first=True)
        for k, v in net.items():
            d[f"@net:{k}"] = v
        d["@lycoris_unsplittable"] = _lycoris_unsplittable(self.family, c)
        for k in ("block_dims", "block_alphas", "conv_block_dims", "conv_block_alphas", "in_dims"):
            d[f"@net_count:{k}"] = len(net[k].split(",")) if k in net else None
        relative = True
        raw_rel = opt_kw.get("relative_step")
        if raw_rel is not None and _literal_ok(raw_rel):
            relative = bool(_literal(raw_rel))
        if not relative and opt_kw.get("warmup_init") and _literal_ok(opt_kw["warmup_init"]) \
                and _literal(opt_kw["warmup_init"]):
            relative = True
        d["@adafactor_relative_step"] = d["@optimizer"] == "adafactor" and relative
        d["@optimizer_has_momentum"] = "momentum" in opt_kw
        # get_optimizer rewrites lr_scheduler to "adafactor:<lr>" for a relative-step Adafactor.
        sched = c.get("lr_scheduler")
        d["@scheduler"] = "adafactor" if d["@adafactor_relative_step"] else sched
        d["@warmup_steps"] = self._steps_of(c.get("lr_warmup_steps"))
        warm = c.get("lr_warmup_steps")
        d["@warmup_fraction_of_epochs"] = (isinstance(warm, float) and 0 < warm < 1
                                           and c.get("max_train_epochs") is not None)
        d["@no_lr_anywhere"] = self._no_lr_anywhere(net)
        # initial_epoch N starts at (N - 1) x the steps per epoch (train_network.py:1243), at least 1 each.
        ie = c.get("initial_epoch")
        d["@epochs_skipped"] = ie - 1 if isinstance(ie, int) and not isinstance(ie, bool) and ie > 1 else None
        d["@cache_latents"] = bool(c.get("cache_latents") or c.get("cache_latents_to_disk"))
        d["@te_cache"] = bool(c.get("cache_text_encoder_outputs") or c.get("cache_text_encoder_outputs_to_disk"))
        d["@fp8"] = bool(c.get("fp8_base") or c.get("fp8_base_unet"))
        swap = c.get("blocks_to_swap")
        if c.get("split_mode") and swap is None and self.script == "flux_train_network.py":
            swap = 18
        d["@blocks_to_swap"] = swap
        # The MMDiT swaps at most depth - 2 blocks (sd3_models.py:1078): the family's blocks_to_swap_max.
        # Without the family, only the largest of the script's families is certain.
        limit = _swap_limit("sd3_train_network.py", self.family)
        d["@sd3_swap_limit"] = limit
        d["@sd3_swap_over"] = (isinstance(swap, int) and not isinstance(swap, bool) and swap > limit) or None
        needs = _model_files(self.script, c)
        d["@model_files_unset"] = ", ".join(k for k in needs if not c.get(k)) or None
        d["@train_t5xxl"] = net.get("train_t5xxl") == "True"
        res = c.get("resolution")
        d["@resolution_parts"] = len(res.split(",")) if isinstance(res, str) else None
        face = c.get("face_crop_aug_range")
        d["@face_crop_ok"] = True
        if isinstance(face, str):
            try:
                lo_hi = [float(x) for x in face.split(",")]
                d["@face_crop_ok"] = len(lo_hi) == 2 and lo_hi[0] <= lo_hi[1]
            except ValueError:
                d["@face_crop_ok"] = False
        ds_path = c.get("dataset_config")
        d["@dataset_config_missing"] = bool(self.filesystem and isinstance(ds_path, str)
                                            and not self._path(ds_path).is_file())
        if d["@dataset_config_missing"]:
            from kohya_tuner import safeio

            d["@dataset_config_is"] = safeio.describe(self._path(ds_path))
        d["@dataset_config_suffix"] = (Path(ds_path).suffix.lower() if isinstance(ds_path, str) else None)
        for key in ("resume", "network_weights", "pretrained_model_name_or_path", "train_data_dir", "vae",
                    *needs):
            v = c.get(key)
            exists = not self.filesystem or not isinstance(v, str) or self._path(v).exists()
            if key in _HUB_LOADED.get(self.script, ("pretrained_model_name_or_path",)) and isinstance(v, str) \
                    and looks_like_hub_id(v):
                exists = True
            d[f"@missing:{key}"] = not exists
        d["@model_files_missing"] = "; ".join(f"{k} {c.get(k)}" for k in needs
                                              if k != "vae" and d.get(f"@missing:{k}") and c.get(k)) or None
        d["@no_training_data"] = self._no_training_data()
        return d

    def _no_lr_anywhere(self, net: dict[str, str]) -> bool:
        """Every parameter group the LoRA trains has learning rate 0: the network drops each one
        ("NO LR skipping!", networks/lora.py:1187 and its FLUX, SD3, Lumina, Anima and DyLoRA
        twins) and the optimizer gets an empty list. A ratio (LoRA+, block weights) times 0 stays 0;
        FLUX's per-module network_reg_lrs may give some modules a rate of their own."""
        c = self.cfg
        mod = c.get("network_module")
        if mod not in _SKIPS_ZERO_LR or "network_reg_lrs" in net:
            return False
        if c.get("network_train_unet_only") and c.get("network_train_text_encoder_only"):
            return False  # nothing is trained at all: nothing_to_train says so
        base = c.get("learning_rate")

        def zero(v: Any) -> bool:
            return argschema.is_number(v) and v == 0

        unet = c.get("unet_lr")
        te = c.get("text_encoder_lr")
        te_values = te if isinstance(te, list) and te else [te]
        no_unet = bool(c.get("network_train_text_encoder_only")) or zero(unet if unet is not None else base)
        no_te = bool(c.get("network_train_unet_only")) or all(zero(v if v is not None else base) for v in te_values)
        return no_unet and no_te

    def _steps_of(self, v: Any) -> Any:
        steps = self.cfg.get("max_train_steps")
        if isinstance(v, float) and self.cfg.get("max_train_epochs") is not None:
            # max_train_epochs replaces max_train_steps with a count of the dataset's batches
            # (train_network.py:799) before the fraction is taken: not known here.
            return None
        if isinstance(v, float) and math.isfinite(v) and isinstance(steps, int):
            # A ratio of the run's steps; a product too large for a float (1e305 × 1000) is no step
            # count, and the range rules judge the value as written.
            product = v * steps
            if math.isfinite(product):
                return int(product)
        return v

    def _no_training_data(self) -> bool:
        """sd-scripts logs "No data found" and exits without training (exit 0) when no
        subset yields an image; only decidable when the folders can be read."""
        if not self.filesystem:
            return False
        if self.dataset_doc is None:
            if self.cfg.get("in_json") is not None or self.cfg.get("dataset_class") is not None:
                return False
            if self.cfg.get("dataset_config") is not None:
                return False  # a dataset file that could not be read: dataset_config_missing says so
            if not isinstance(self.cfg.get("train_data_dir"), str):
                return True
        for ds in self.datasets:
            for sub in ds.subsets:
                d = sub.values.get("image_dir")
                if "metadata_file" in sub.values:
                    return False  # fine-tuning subsets list their images in the metadata file
                if not isinstance(d, str):
                    continue
                p = self._path(d)
                reps = self.lookup("num_repeats", ds, sub)
                # The training split keeps ceil(n * (1 - split)) images (train_util.py:173): none at
                # exactly 1, none from 2 up (a negative slice end as long as the list).
                split = self.lookup("validation_split", ds, sub)
                if argschema.is_number(split) and (split == 1 or split >= 2):
                    continue
                if p.is_dir() and (not isinstance(reps, int) or reps >= 1) and not sub.values.get("is_reg") and any(
                        f.suffix.lower() in IMAGE_SUFFIXES for f in p.iterdir()):
                    return False
        return True
