"""Fit a composed plan to a GPU: the step between presets and the files.

`config` and `run` both call `fit_plan`, so a plan written by one is the plan the other
would train."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kohya_tuner import history, ladder, memory
from kohya_tuner.errors import UserError
from kohya_tuner.families import FAMILIES, looks_like_hub_id
from kohya_tuner.presets import SAMPLE_PROMPTS_NAME, Plan, precision_caution, preview_size, writes_prompt_file

# How the fit's change of the preview size is shown: it goes into the prompt file, not the config.
SAMPLE_SIZE_LABEL = f"{SAMPLE_PROMPTS_NAME} --w/--h"


def sample_size_key(plan: Plan) -> dict[str, str]:
    """The preview size of a plan that writes its own prompt file, for the estimator (which
    otherwise reads the prompt file, not written yet while planning)."""
    from kohya_tuner.memory.setup import SAMPLE_SIZE_KEY

    if not writes_prompt_file(plan):
        return {}
    w, h = preview_size(plan)
    return {SAMPLE_SIZE_KEY: f"{w}x{h}"}


@dataclass
class FittedPlan:
    plan: Plan
    dataset: dict[str, Any]
    estimate: memory.Estimate
    budget_gib: float
    fit: ladder.FitResult | None = None
    notes: list[str] = field(default_factory=list)
    # Inputs the fit had to assume because the user has not given them yet.
    assumed: dict[str, Any] = field(default_factory=dict)
    # What to know before training: the plan's own (precision chosen without knowing the card)
    # and the fit's (a card filled to the brim, a card below the presets). JSON key "cautions".
    cautions: list[str] = field(default_factory=list)
    # Plan-level assumptions in words (JSON key "assumptions"), e.g. the file the fit planned for.
    assumptions: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.estimate.peak_gib <= self.budget_gib

    @property
    def refusal_hint(self) -> str:
        """What to try when the plan does not fit: a file to swap first when one would make it
        fit (no setting can), else the settings."""
        offer = self.fit.offer if self.fit is not None else None
        if offer:
            flag = "--" + str(offer["key"]).replace("_", "-")
            return (f"Use {offer['label']} ({offer['value']}) with {flag}: then the plan fits "
                    f"({offer['peak_gib']:.2f} GiB of {self.budget_gib:.2f}).")
        peak = self.estimate.peak_gib
        phase = self.estimate.peak_phase
        # Rank, batch and resolution only move the training step; say so when another phase is
        # the limit, instead of sending the user after settings that cannot help.
        if phase == "cache_text_encoder":
            return (f"The peak ({peak:.2f} GiB) is the text encoders encoding the captions, which no LoRA setting "
                    "changes: give a smaller (fp8) text-encoder file where the model has one, or plan for a card "
                    "with more memory; --no-fit writes the preset anyway.")
        if phase == "model_load":
            return (f"The peak ({peak:.2f} GiB) is loading the models, before any LoRA setting counts: plan for a "
                    "card with more memory, or --no-fit to write the preset anyway.")
        if phase == "cache_latents":
            return (f"The peak ({peak:.2f} GiB) is the VAE encoding latents: a lower --set resolution helps, rank "
                    "and batch do not; --no-fit writes the preset anyway.")
        return f"Try a smaller {self._rank_words()} or resolution, or --no-fit to write the preset anyway."

    def _rank_words(self) -> str:
        """LyCORIS BOFT builds only at a rank that splits every layer width, so "smaller" names
        the ranks that do."""
        from kohya_tuner.memory import lycoris

        cfg = self.plan.config
        if not lycoris.is_boft(cfg):
            return "--set network_dim"
        try:
            rank = int(cfg.get("network_dim") or 4)
        except (TypeError, ValueError):
            return "--set network_dim"
        # Each width needs some even block size up to the rank whose cofactor is a power of two,
        # so the ranks that build are every rank from the smallest one that does.
        low = next((r for r in range(1, rank)
                    if not lycoris.unsplittable(self.plan.family.name, {**cfg, "network_dim": r})), None)
        if low is None:
            return "resolution (no smaller LyCORIS BOFT rank splits this model's layers)"
        return f"--set network_dim (LyCORIS BOFT builds on this model down to {low})"


# sd-scripts' docs recommend this T5-XXL file below 10 GB; with fp8_base sd-scripts keeps
# T5 in the file's dtype while it encodes the captions.
FP8_T5_FILE = "t5xxl_fp8_e4m3fn.safetensors"


def fit_plan(plan: Plan, dataset: dict[str, Any], gpu_gb: float, *, others_gib: float = 0.0,
             gpu_name: str | None = None, bf16: bool | None = None, gpus: int = 1, do_fit: bool = True,
             use_history: bool = True, cpu: bool = False, driver: str | None = None) -> FittedPlan:
    """Run the plan through `ladder.tune` (downgrade what does not fit, remove speed
    costs the card does not need) and record every change as the layer `fit`.

    A FLUX plan that names no T5-XXL file yet is first fitted for a 16-bit file; when
    that cannot fit, for the fp8 file, and the notes say which file the plan needs."""
    hist = history.load() if use_history else []
    budget = memory.budget_gib(gpu_gb, other_processes_gib=others_gib, driver=driver)
    result = None
    notes: list[str] = []
    assumed: dict[str, Any] = {}
    # What the user asked for by name: a fit that changes it says so (never silently).
    asked = {k: (plan.config.get(k), src.layer) for k, src in plan.provenance.items()
             if src.layer == "--set" or src.layer.startswith("preset:")}
    if do_fit:
        def tune(extra):
            return ladder.tune({**plan.config, **sample_size_key(plan), **extra}, plan.family, budget,
                               dataset=dataset, history=hist,
                               gpu_name=gpu_name, gpu_gb=gpu_gb, bf16=bf16 is not False, cpu=cpu,
                               keep=user_keys(plan), driver=driver, gpus=gpus)

        result = tune({})
        offer = result.offer
        if not result.fits and offer and offer["key"] not in plan.config:
            # No file given yet: plan for the one the card needs and say so.
            swapped = tune({offer["key"]: offer["value"]})
            if swapped.fits:
                result, assumed = swapped, {offer["key"]: offer["value"]}
                notes.append(f"A 16-bit {offer['key']} file does not fit {gpu_gb:g} GB: use {offer['label']} "
                             f"({offer['value']}) with --{offer['key'].replace('_', '-')}.")
        from kohya_tuner.memory.setup import SAMPLE_SIZE_KEY, _res_pair

        for step in result.steps:
            step.changes = [(SAMPLE_SIZE_LABEL if k == SAMPLE_SIZE_KEY else k, o, n) for k, o, n in step.changes]
            for key, _old, new in step.changes:
                if key == SAMPLE_SIZE_LABEL:
                    plan.sample_size = _res_pair(str(new).replace("x", ","))
                elif not str(key).startswith("dataset:"):
                    plan.set(key, new, "fit", f"{step.reason} ({step.move})")
        if result.dataset is not None:
            dataset = result.dataset
        notes.append(result.message)
        notes.extend(result.hints)
        for key, (value, layer) in asked.items():
            if plan.config.get(key) != value:
                notes.append(f"{key} = {value!r} from {layer} was changed to {plan.config.get(key)!r} by the fit "
                             f"for {gpu_gb:g} GB; --no-fit keeps it as you set it.")
    # The steps follow the effective batch the fit left (and the number of GPUs): the job's
    # length is its image passes.
    from kohya_tuner.presets import settle_length

    settle_length(plan, ranks=gpus)
    # The one gate (kohya_tuner.check): a plan sd-scripts would refuse at start-up is never handed on.
    from kohya_tuner.check import gate

    gate({**plan.config, **assumed}, plan.family.script, dataset=dataset, what="The planned config",
         family=plan.family.name)
    est = memory.estimate({**plan.config, **assumed, **sample_size_key(plan)}, plan.family, dataset=dataset,
                          gpus=gpus, history=hist, gpu_name=gpu_name, driver=driver)
    cautions = list(plan.cautions) + [c for c in [precision_caution(plan)] if c]
    if est.peak_gib <= budget:
        cautions += ladder.cautions(est.peak_gib, budget, gpu_gb, driver=driver)
    return FittedPlan(plan=plan, dataset=dataset, estimate=est, budget_gib=budget, fit=result, notes=notes,
                      assumed=assumed, cautions=cautions)


def user_keys(plan: Plan) -> frozenset[str]:
    """The keys the user set (--set, their --preset file): the ladder moves them last."""
    return frozenset(k for k, src in plan.provenance.items()
                     if src.layer == "--set" or src.layer.startswith("preset:"))


def model_inputs(family, *, base, clip_l, t5xxl, ae, name, out, steps,
                 files: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """The plan's input layer, and the model files still missing. `files`: sd-scripts key ->
    path for the other model files (clip_g, gemma2, text_encoder, byt5, qwen3, vae)."""
    given = {"pretrained_model_name_or_path": base, "clip_l": clip_l, "t5xxl": t5xxl, "ae": ae, **(files or {})}
    inputs: dict[str, Any] = {}
    missing = []
    from kohya_tuner import safeio

    for key, flag in family.required_files.items():
        value = given.get(key)
        if value and (kind := safeio.special_kind(str(value))):
            # The trainer would open it and wait on a pipe, or read a device without end.
            raise UserError(f"{flag} {value} is {kind}, not a model file or folder.",
                            f"Give {flag} the model file itself.")
        if value and re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", str(value)) and not os.path.exists(value):
            # sd-scripts opens a file or asks the Hugging Face hub for a repo id; an address is neither,
            # and written into the plan it would carry any password in it into every file.
            from kohya_tuner.redact import url_credentials

            raise UserError(f"{flag} {url_credentials(str(value))} is a web address; sd-scripts reads a model file "
                            "on this machine (or a Hugging Face repo id).",
                            f"Download the file first and give {flag} its path.")
        if value:
            hub = looks_like_hub_id(value) and not os.path.exists(value)
            inputs[key] = value if hub else str(Path(value).expanduser().absolute())
        else:
            missing.append(flag)
    extra = [k for k, v in given.items() if v and k not in family.required_files]
    if extra:
        flags = {k: f for fam in FAMILIES.values() for k, f in fam.required_files.items()}
        raise UserError(f"{family.label} does not use "
                        f"{', '.join(flags.get(k, '--' + k.replace('_', '-')) for k in extra)}.")
    inputs["output_dir"] = str((Path(out) / "output").absolute())
    # The prompt file config writes beside config.toml; sampling happens only where the job sets a cadence.
    inputs["sample_prompts"] = str((Path(out) / SAMPLE_PROMPTS_NAME).absolute())
    # sd-scripts joins output_dir and output_name: a name with a path in it writes outside --out.
    if not name or name in (".", "..") or any(c in name for c in "/\\\0") or name != name.strip():
        raise UserError(f"--name {name!r} must be a plain file name (no folders, no '..'); "
                        f"the LoRA is written inside --out {out}.")
    inputs["output_name"] = name
    if steps is not None:
        if steps < 1:
            raise UserError(f"--steps {steps} must be at least 1.")
        inputs["max_train_steps"] = steps
    return inputs, missing


# Model inputs sd-scripts opens besides the family's own files: --vae of the U-Net scripts, and
# a LoRA to start from.
_OTHER_MODEL_KEYS = ("vae", "network_weights")

# The entry scripts whose base model may be a Hugging Face id (train_util._load_target_model
# hands a base that is not a file to diffusers' from_pretrained).
_HUB_SCRIPTS = ("train_network.py", "sdxl_train_network.py")


@dataclass(frozen=True)
class AbsentFile:
    key: str  # the sd-scripts key
    value: str
    flag: str | None = None  # the flag that gave it (--base), when one did
    layer: str | None = None  # else where it came from (--set, --preset FILE, the config)

    def shown(self) -> str:
        if self.flag:
            return f"{self.flag} {self.value}"
        return f"{self.key} = {self.value}" + (f" (from {self.layer})" if self.layer else "")


def absent_model_files(config: dict[str, Any], family, layers: dict[str, str] | None = None) -> list[AbsentFile]:
    """The model files and folders the plan names that are not on this machine. A Hugging Face
    id (`runwayml/stable-diffusion-v1-5`, which diffusers downloads) is not a path and never
    counted; a Diffusers folder that exists is. `layers`: key -> the plan layer that set it
    (a value of the layer "input" came from the model flags)."""
    keys = list(family.required_files) + [k for k in _OTHER_MODEL_KEYS if k not in family.required_files]
    out = []
    for key in keys:
        value = config.get(key)
        if not isinstance(value, str) or not value or looks_like_hub_id(value):
            continue
        if os.path.exists(os.path.expanduser(value)):
            continue
        layer = (layers or {}).get(key, "input")
        flag = family.required_files.get(key) if layer == "input" else None
        out.append(AbsentFile(key, value, flag, None if flag else layer))
    return out


def missing_model_files(inputs: dict[str, Any], family) -> list[str]:
    """A warning per model file the plan names that is not on this machine (a Hugging Face id,
    which sd-scripts downloads, is not a file)."""
    return [f"{a.shown()} does not exist on this machine: sd-scripts will fail to load it. Fix the path "
            "before training (or plan here for a file that lives on another machine)."
            for a in absent_model_files(inputs, family) if a.key in family.required_files]


def absent_files_refusal(absent: list[AbsentFile], family) -> UserError:
    """One paragraph for `run`: which model paths do not exist, and what sd-scripts accepts."""
    listed = "; ".join(a.shown() for a in absent)
    many = len(absent) > 1
    hub = any(a.key == "pretrained_model_name_or_path" for a in absent) and family.script in _HUB_SCRIPTS
    return UserError(f"{listed}: {'these do' if many else 'it does'} not exist on this machine, so sd-scripts would "
                     f"stop while loading {'them' if many else 'it'}; nothing was launched.",
                     "Give the path of a model file that exists (check the spelling and the folder)"
                     + (", a Diffusers folder, or a Hugging Face id such as runwayml/stable-diffusion-v1-5"
                        if hub else "") + ".")


def check_data(data: str | Path, family, job: str, trigger: str | None, config: dict[str, Any]):
    """`dataset check` of the folder a plan trains from, judged at the plan's own resolution
    and buckets (so `--set resolution=...` counts); a failing dataset is refused here, the
    same way for `config --data` and `run --data`. Returns (report, the folder checked)."""
    import math

    from kohya_tuner import dataset as ds_mod
    from kohya_tuner.memory.setup import _res_pair

    prepared = ds_mod.find_prepared(data)
    checked = Path(prepared) if prepared is not None else Path(data)
    pair = _res_pair(config.get("resolution"))
    res = int(round(math.sqrt(pair[0] * pair[1]))) if pair else None

    def side(key):
        v = config.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and 64 <= v <= 16384 else None

    no_upscale = config.get("bucket_no_upscale")
    report = ds_mod.check(checked, job, family, trigger, res if res and 64 <= res <= 16384 else None,
                          min_bucket_reso=side("min_bucket_reso"), max_bucket_reso=side("max_bucket_reso"),
                          bucket_no_upscale=bool(no_upscale) if no_upscale is not None else None)
    errors = [f for f in report.findings if f.severity == "fail"]
    if errors:
        listed = "; ".join(f.message.rstrip(".") + (f" ({f.fix.rstrip('.')})" if f.fix else "") for f in errors[:5])
        raise UserError(f"The dataset in {checked} cannot be trained on: {listed}.",
                        "`kohya-tuner dataset check` lists every problem; `kohya-tuner dataset prep` makes a "
                        "fixed copy.")
    return report, checked
