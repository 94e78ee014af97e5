"""Compose a training plan from the preset layers in `presets/`.

Layers, in order: model → job (and the job's per-model table) → GPU class → what the
user gave on the command line (files, name, steps) → `--preset FILE` → `--set k=v`.
Each key remembers the layer that set it last and why, so every value can be explained.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from kohya_tuner import schema
from kohya_tuner.errors import UserError
from kohya_tuner.families import Family, get_family
from kohya_tuner.gpu import MIN_GPU_GB, cards_without_bf16
from kohya_tuner.resources import presets_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

JOBS = ("character", "style", "concept")
GPU_CLASSES = (6, 8, 10, 12, 16, 20, 24, 32, 48, 80)
# The prompt file `config` writes beside config.toml when the job samples during training.
SAMPLE_PROMPTS_NAME = "sample_prompts.txt"


@dataclass(frozen=True)
class Source:
    layer: str
    why: str = ""


@dataclass
class Plan:
    family: Family
    job: str
    gpu_gb: int
    gpu_class: int
    variant: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Source] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # What the user should know before training (printed and in JSON as "cautions").
    cautions: list[str] = field(default_factory=list)
    # The job's sample prompts ({trigger} marks the trigger word), written as SAMPLE_PROMPTS_NAME,
    # each followed by the model's sample options ({w}, {h}, {seed} filled in).
    sample_prompts: list[str] = field(default_factory=list)
    sample_options: str = ""
    # The job's length in image passes (images x repeats x epochs) when max_train_steps is
    # derived from it (None when the user gave the steps); see settle_length.
    image_passes: int | None = None
    passes_why: str = ""
    # The preview size (w, h) the fit chose for the plan's own prompt file; None: the training resolution.
    sample_size: tuple[int, int] | None = None

    def set(self, key: str, value: Any, layer: str, why: str = "") -> None:
        if value is None:
            self.config.pop(key, None)
            self.provenance.pop(key, None)
            return
        self.config[key] = value
        self.provenance[key] = Source(layer, why)

    def apply(self, settings: dict[str, Any], why: dict[str, str], layer: str) -> None:
        for key, value in settings.items():
            self.set(key, value, layer, why.get(key, ""))

    def why(self) -> dict[str, str]:
        return {k: f"[{s.layer}] {s.why}".strip() for k, s in self.provenance.items()}


def preset_models() -> tuple[str, ...]:
    """The families with a preset file (the estimator and the checker know more families)."""
    return tuple(sorted(p.stem for p in (presets_dir() / "models").glob("*.toml")))


def gpu_class_for(gb: int) -> int:
    """The largest preset class not above `gb`."""
    if gb < MIN_GPU_GB:
        raise UserError(f"--gpu {gb} is below {MIN_GPU_GB} GB; no sd-scripts LoRA training fits such a card.")
    fitting = [c for c in GPU_CLASSES if c <= gb]
    return fitting[-1] if fitting else GPU_CLASSES[0]


def _load_toml(path: Path, what: str) -> dict[str, Any]:
    from kohya_tuner import safeio

    text = safeio.read_text(path, what)
    if text.startswith("\ufeff"):
        text = text[1:]  # presets are read by kohya-tuner alone (tomllib), never by sd-scripts
    try:
        doc = safeio.parse_guard(tomllib.loads, text, f"{what} {path}")
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{what} {path} is not valid TOML: {exc}.") from None
    except ValueError as exc:  # an integer beyond Python's digit limit
        raise UserError(f"{what} {path} holds a value that cannot be read: {exc}.") from None
    safeio.check_values(doc, f"{what} {path}")
    return doc


def _layer(doc: Any, where: str = "preset") -> tuple[dict[str, Any], dict[str, str]]:
    from kohya_tuner import safeio

    doc = safeio.table(doc, "the layer", where)
    return (dict(safeio.table(doc.get("settings") or {}, "settings", where)),
            dict(safeio.table(doc.get("why") or {}, "why", where)))


def load_layers(family: Family, job: str, gpu_class: int) -> list[tuple[str, dict, dict]]:
    root = presets_dir()
    model_doc = _load_toml(root / "models" / f"{family.name}.toml", "Preset")
    job_doc = _load_toml(root / "jobs" / f"{job}.toml", "Preset")
    gpu_doc = _load_toml(root / "gpu" / f"{family.name}.toml", "Preset")
    layers = [(f"model:{family.name}", *_layer(model_doc)), (f"job:{job}", *_layer(job_doc))]
    if family.name in job_doc:
        layers.append((f"job:{job}:{family.name}", *_layer(job_doc[family.name])))
    layers.append((f"gpu:{gpu_class}GB", *_layer(gpu_doc.get(str(gpu_class), {}))))
    return layers


def _job_doc(job: str) -> dict[str, Any]:
    return _load_toml(presets_dir() / "jobs" / f"{job}.toml", "Preset")


# Cards that cannot train a bf16-only family at speed, named in its caution.
PRE_AMPERE = "cards before Ampere (compute capability below 8.0: GTX 10xx, RTX 20xx, Tesla T4, V100)"


def required_precision(model_doc: dict[str, Any]) -> tuple[str, str] | None:
    """A model preset's `[precision] requires` (and why): the family trains in that precision only."""
    table = model_doc.get("precision") or {}
    need = table.get("requires")
    return (str(need), str(table.get("why", ""))) if need else None


def _precision(plan: Plan, bf16: bool | None, required: tuple[str, str] | None = None) -> None:
    """fp16 where the card has no fast bf16, or where only a size was given and cards of that
    size without it exist: fp16 takes the same memory and runs as fast on newer cards, while
    bf16 on a GTX 10xx / RTX 20xx is emulated and many times slower. A family whose scripts
    train in bf16 only keeps bf16, and the plan's caution names the cards that cannot run it."""
    if plan.config.get("mixed_precision") != "bf16" or bf16 is True:
        return
    if required and required[0] == "bf16":
        label = plan.family.label
        if bf16 is False:
            plan.cautions.append(f"{label} trains in bf16 only, and this GPU has no fast bf16 (compute capability "
                                 f"below 8.0): expect it to be many times slower, or fail, as on all {PRE_AMPERE}.")
        elif cards_without_bf16(plan.gpu_gb):
            plan.cautions.append(f"Trains in bf16, which {label} needs: {PRE_AMPERE} cannot run it at speed "
                                 f"(at {plan.gpu_gb} GB: {', '.join(cards_without_bf16(plan.gpu_gb)[:3])}).")
        return
    if bf16 is False:
        layer, why = "gpu:detected", "This GPU has no bf16 support (compute capability below 8.0); fp16 instead."
    else:
        cards = cards_without_bf16(plan.gpu_gb)
        if not cards:
            return
        named = ", ".join(cards[:3])
        layer = "gpu:unknown"
        why = (f"--gpu {plan.gpu_gb} does not say which card, and {plan.gpu_gb} GB cards such as {named} have no "
               "fast bf16; fp16 trains on every card in the same memory.")
    plan.set("mixed_precision", "fp16", layer, why)
    if getattr(plan.family, "fp16_vae_overflows", plan.family.name in ("sd15", "sdxl")):
        plan.set("no_half_vae", True, layer, "The VAE overflows in fp16 and produces black latents.")
    if plan.config.get("save_precision") == "bf16":
        plan.set("save_precision", "fp16", layer, "Matches fp16 training.")


def precision_caution(plan: Plan) -> str | None:
    """The caution for a plan whose precision was chosen without knowing the card (none once
    a later layer, such as --set or --cpu, decided it)."""
    src = plan.provenance.get("mixed_precision")
    if src is None or src.layer != "gpu:unknown" or plan.config.get("mixed_precision") != "fp16":
        return None
    named = ", ".join(cards_without_bf16(plan.gpu_gb)[:3])
    return (f"Trains in fp16: --gpu {plan.gpu_gb} does not name the card, and {named} have no fast bf16. On an "
            "RTX 30xx or newer add --gpu-arch ampere (or ada, hopper, blackwell) for bf16, or use --gpu auto.")


def parse_set(item: str) -> tuple[str, Any]:
    """`key=value` with the value read as a TOML value (so 32, 1e-4, true, ["a=1"]
    work), falling back to a plain string."""
    if "=" not in item:
        raise UserError(f"--set {item!r} needs the form key=value (e.g. --set network_dim=32).")
    key, raw = item.split("=", 1)
    key, raw = key.strip(), raw.strip()
    if not key:
        raise UserError(f"--set {item!r} has no key.")
    from kohya_tuner import safeio

    safeio.long_integer(f"{key} = {raw}", "--set")
    try:
        value = safeio.parse_guard(tomllib.loads, f"v = {raw}", f"--set {key}")["v"]
    except (tomllib.TOMLDecodeError, ValueError):  # ValueError: past Python's integer digit limit
        value = raw
    safeio.check_values({key: value}, "--set")
    return key, value


_FLAG_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def _conform(spec: schema.ArgSpec, value: Any) -> Any:
    """Make a user value the TOML type sd-scripts needs where the intent is unambiguous."""
    if spec.is_flag and not isinstance(value, bool):
        # Written as given, "False" would be a non-empty string that sd-scripts tests for truth: on.
        word = str(value).strip().lower() if isinstance(value, (str, int)) else None
        if word not in _FLAG_WORDS:
            raise UserError(f"{spec.name} = {value!r}: {spec.name} is a switch; give true or false.")
        return _FLAG_WORDS[word]
    if spec.type == "str" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if spec.type == "str" and spec.name == "resolution" and isinstance(value, list):
        return ",".join(str(v) for v in value)
    if spec.type == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if spec.type == "list" and not isinstance(value, list):
        return [value]
    return value


def _user_settings(script: str, pairs: Iterable[tuple[str, Any]], what: str) -> dict[str, Any]:
    specs = schema.script_args(script)
    out = {}
    for key, value in pairs:
        spec = specs.get(key)
        if spec is None:
            near = schema.closest_key(key, specs)
            raise UserError(f"{what}: {key!r} is not an argument of {script} at the pinned sd-scripts commit"
                            + (f"; did you mean {near!r}?" if near else "."))
        value = _conform(spec, value)
        # Only what the value alone breaks: a rule between keys (full_bf16 needs mixed_precision
        # bf16) is judged on the composed plan, where the other keys have their real values.
        problems = [p for p in schema.validate_config({key: value}, script)
                    if p.severity == "error" and len(p.keys or (key,)) <= 1]
        if problems:
            raise UserError(f"{what}: {problems[0]}.")
        out[key] = value
    return out


def save_cadence(steps: int) -> int:
    """Save a resumable state about ten times per run, on round numbers."""
    raw = max(1, steps // 10)
    for unit in (500, 100, 50, 10, 5, 1):
        if raw >= unit * 2 or unit == 1:
            return max(unit, raw // unit * unit)
    return raw


def compose(
    model: str,
    job: str,
    gpu_gb: int,
    *,
    preset_file: str | Path | None = None,
    sets: Iterable[str] = (),
    variant: str | None = None,
    inputs: dict[str, Any] | None = None,
    bf16: bool | None = None,
    network: str | None = None,
) -> Plan:
    family = get_family(model)
    if family.name not in preset_models():
        raise UserError(f"kohya-tuner has no presets for the model family {family.label} ({family.name}) yet, so it "
                        "cannot write a config for it.",
                        f"Presets exist for: {', '.join(preset_models())}. `estimate`, `fit` and `check` still "
                        f"read {family.label} configs you wrote.")
    if job not in JOBS:
        near = schema.closest_key(job, JOBS)
        raise UserError(f"Unknown job {job!r}.", f"Choose one of: {', '.join(JOBS)}"
                        + (f" (did you mean {near!r}?)" if near else "") + ".")
    if variant is None and family.variants:
        variant = family.variants[0]
    if variant is not None and variant not in family.variants:
        raise UserError(f"{family.label} has no variant {variant!r}; choose from {', '.join(family.variants) or 'none'}.")
    gpu_class = gpu_class_for(gpu_gb)
    plan = Plan(family=family, job=job, gpu_gb=gpu_gb, gpu_class=gpu_class, variant=variant)
    for name, settings, why in load_layers(family, job, gpu_class):
        plan.apply(settings, why, name)

    # A variant's own settings live in its model preset ([variant.<name>.settings]).
    model_doc = _load_toml(presets_dir() / "models" / f"{family.name}.toml", "Preset")
    variant_doc = (model_doc.get("variant") or {}).get(variant or "") or {}
    if variant_doc:
        plan.apply(*_layer(variant_doc), f"variant:{variant}")
    if network:
        from kohya_tuner import networks

        networks.apply(plan, networks.parse(network, family))
    if variant == "schnell":
        plan.set("guidance_scale", 0.0, "variant:schnell",
                 "schnell is step-distilled and has no guidance input (sd-scripts tells it by the missing "
                 "guidance_in), so the value is not used; 0 says so.")
        if "discrete_flow_shift" in plan.config:
            plan.set("discrete_flow_shift", plan.config["discrete_flow_shift"], "variant:schnell",
                     "The shift sd-scripts' FLUX.1 guide gives; the guide uses it for dev and schnell alike.")
        plan.set("t5xxl_max_token_length", 256, "variant:schnell", "FLUX.1 schnell uses 256 T5 tokens.")
    _precision(plan, bf16, required_precision(model_doc))
    plan.sample_prompts = [str(p) for p in (_job_doc(job).get("sample") or {}).get("prompts", [])]
    plan.sample_options = str({**(model_doc.get("sample") or {}), **(variant_doc.get("sample") or {})}
                              .get("options", ""))

    for key, value in (inputs or {}).items():
        plan.set(key, value, "input", "From your command line.")

    if preset_file is not None:
        doc = _load_toml(Path(preset_file), "--preset")
        settings, why = _layer(doc, f"--preset {preset_file}") if "settings" in doc else (
            {k: v for k, v in doc.items() if not isinstance(v, dict)} |
            {k2: v2 for v in doc.values() if isinstance(v, dict) for k2, v2 in v.items()}, {})
        settings = _user_settings(family.script, settings.items(), f"--preset {preset_file}")
        plan.apply(settings, why, f"preset:{Path(preset_file).name}")

    user_sets = _user_settings(family.script, (parse_set(s) for s in sets), "--set")
    for key, value in user_sets.items():
        plan.set(key, value, "--set", "You asked for this.")
    _follow_resolution(plan, user_sets)

    length = _job_doc(job).get("length") or {}
    if "max_train_steps" not in plan.config and length.get("image_passes"):
        plan.image_passes = int(length["image_passes"])
        plan.passes_why = str(length.get("why", ""))
    settle_length(plan)
    return plan


def _follow_resolution(plan: Plan, user_sets: dict[str, Any]) -> None:
    """A resolution the user set below the preset's smallest bucket: the bucket bound follows it (as
    the fit's resolution move does), since sd-scripts refuses min_bucket_reso above the smaller side.
    A min_bucket_reso the user set is theirs, and `check` names the clash."""
    if "resolution" not in user_sets or "min_bucket_reso" in user_sets:
        return
    low = plan.config.get("min_bucket_reso")
    try:
        sides = [int(float(x)) for x in str(plan.config.get("resolution")).split(",")]
    except ValueError:
        return
    step = plan.config.get("bucket_reso_steps")
    step = step if isinstance(step, int) and not isinstance(step, bool) and step > 0 else 64
    # Below two bucket steps an image of another aspect ratio rounds a side to no pixels at all
    # (sd-scripts divides by it): there the preset's bound stays, and the gate names the clash.
    if isinstance(low, int) and not isinstance(low, bool) and sides and low > min(sides) >= 2 * step:
        plan.set("min_bucket_reso", min(sides), "--set",
                 f"Follows your resolution: sd-scripts needs the smallest bucket at most its smaller side "
                 f"({min(sides)}), not the preset's {low}.")


def effective_batch(config: dict[str, Any], ranks: int = 1) -> tuple[int, int, int]:
    """(train_batch_size, gradient_accumulation_steps, their product with the ranks): the
    samples one optimizer step consumes."""
    def whole(key):
        v = config.get(key)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 1 else 1

    b, a = whole("train_batch_size"), whole("gradient_accumulation_steps")
    return b, a, b * a * max(1, int(ranks))


def settle_length(plan: Plan, ranks: int = 1) -> None:
    """max_train_steps from the job's image passes and the effective batch (when the user did
    not give the steps), and what follows from the step count: save and sample cadence, the
    warmup. Called when the plan is composed and again after the fit, which may change the
    batch or the accumulation; only values the plan itself set are recomputed."""
    b, a, eff = effective_batch(plan.config, ranks)
    how = f"train_batch_size {b} x gradient_accumulation_steps {a}" + (f" x {ranks} GPUs" if ranks > 1 else "")
    src = plan.provenance.get("max_train_steps")
    derived = bool(plan.image_passes) and (src is None or src.layer == "plan")
    if derived:
        steps = max(1, -(-plan.image_passes // eff))
        plan.set("max_train_steps", steps, "plan",
                 f"{plan.image_passes:,} image passes / effective batch {eff} ({how}) = {steps:,} optimizer "
                 f"steps. {plan.passes_why}".strip())
        note = (f"Length: {plan.image_passes:,} image passes (images x repeats x epochs) = {steps:,} optimizer "
                f"steps at effective batch {eff} ({how}).")
    elif src is not None:
        steps = int(plan.config["max_train_steps"])
        given = {"input": "--steps"}.get(src.layer, src.layer)
        note = (f"Length: max_train_steps {steps:,} (from {given}) at effective batch {eff} ({how}) = "
                f"{steps * eff:,} image passes (images x repeats x epochs).")
    else:
        steps, note = 1600, None  # sd-scripts' own default
    epochs = plan.config.get("max_train_epochs")
    if isinstance(epochs, int) and not isinstance(epochs, bool) and epochs > 0:
        # sd-scripts recomputes max_train_steps from max_train_epochs when both are given.
        note = (f"Length: max_train_epochs {epochs} (from {plan.provenance['max_train_epochs'].layer}) sets it; "
                "sd-scripts works out the steps from the epochs and ignores max_train_steps.")
    plan.notes[:] = [n for n in plan.notes if not n.startswith("Length: ")] + ([note] if note else [])

    def planned(key):
        src = plan.provenance.get(key)
        return src is not None and src.layer.startswith(("model:", "job:", "gpu:", "plan"))

    if "save_every_n_steps" not in plan.config or planned("save_every_n_steps"):
        cadence = save_cadence(steps)
        plan.set("save_every_n_steps", cadence, "plan",
                 f"A LoRA and a resumable state every {cadence} steps (about ten per run).")
        plan.set("save_last_n_steps_state", cadence * 2, "plan",
                 "Keep the last three states (sd-scripts removes the one older than this many steps at each save): "
                 "each holds the optimizer and costs disk.")
    if planned("sample_every_n_steps"):
        cadence = int(plan.config["save_every_n_steps"])
        plan.set("sample_every_n_steps", cadence, "plan",
                 f"Sample images every {cadence} steps, with each saved LoRA, to see when it starts to overfit.")
    plan.config.setdefault("save_state", True)
    warmup = plan.config.get("lr_warmup_steps")
    # A preset's warmup stays short: at most a tenth of the run (a fraction or a user's value is kept).
    if isinstance(warmup, int) and not isinstance(warmup, bool) and (
            warmup >= steps or (planned("lr_warmup_steps") and warmup > steps // 10)):
        plan.set("lr_warmup_steps", max(0, steps // 10), "plan", "Warmup shortened to a tenth of the run.")


def _trigger_of(dataset: dict[str, Any] | None) -> str:
    for ds in (dataset or {}).get("datasets") or []:
        for sub in ds.get("subsets") or []:
            if isinstance(sub, dict) and sub.get("class_tokens"):
                return str(sub["class_tokens"])
    return ""


def fill_trigger(template: str, trigger: str) -> str:
    """A job prompt with its trigger word. Without one, the comma-separated part that names it
    goes ("at sunset, {trigger} style" reads "at sunset"); where that part is the whole prompt,
    only the `{trigger}` and its own spacing go. Never a double space or a stray comma."""
    import re

    if trigger:
        text = template.replace("{trigger}", trigger)
    else:
        parts = [p for p in template.split(",") if "{trigger}" not in p and p.strip()]
        text = ",".join(parts) if parts else re.sub(r"\s*\{trigger\}", "", template)
    text = re.sub(r"\s+", " ", text)
    text = re.sub(r"\s+,", ",", text)
    text = re.sub(r",(\s*,)+", ",", text)
    return text.strip(" ,")


def writes_prompt_file(plan: Plan) -> bool:
    """Whether the plan's `sample_prompts` is the prompt file it writes itself (not the user's)."""
    path = plan.config.get("sample_prompts")
    src = plan.provenance.get("sample_prompts")
    return bool(plan.sample_prompts and path and Path(str(path)).name == SAMPLE_PROMPTS_NAME
                and (src is None or src.layer == "input"))


def preview_size(plan: Plan) -> tuple[int, int]:
    """The size the plan's previews are drawn at: the fit's choice, else the training resolution."""
    from kohya_tuner.memory.setup import _res_pair

    return plan.sample_size or _res_pair(plan.config.get("resolution")) or (plan.family.native_resolution,) * 2


def sample_prompts_text(plan: Plan, dataset: dict[str, Any] | None) -> str | None:
    """The prompt file for `sample_prompts`, when the plan points it at SAMPLE_PROMPTS_NAME.

    Images are drawn at the training resolution, or smaller where the fit chose smaller previews
    (the size the estimator counted for the sampling phase). The options come from the model
    preset's [sample] table; a model without one gets a negative prompt and a guidance scale
    only where its sampling runs classifier-free guidance (the estimator's batch of two), as
    FLUX.1's distilled guidance does not."""
    if not writes_prompt_file(plan):
        return None
    w, h = preview_size(plan)
    trigger = _trigger_of(dataset)
    seed = int(plan.config.get("seed") or 42)
    template = plan.sample_options
    if not template:
        from kohya_tuner.memory.data import family_facts

        try:
            cfg = family_facts(plan.family.name).cfg
        except KeyError:
            cfg = 2
        template = "--w {w} --h {h} --d {seed}" if cfg == 1 else "--n lowres, blurry --w {w} --h {h} --l 5 --d {seed}"
    opts = template.format(w=w, h=h, seed=seed)
    lines = ["# Sample prompts for sd-scripts: one per line, options after the prompt (--w/--h size, --s steps, "
             "--d seed, --n negative prompt, --l guidance scale)."]
    for template in plan.sample_prompts:
        prompt = fill_trigger(template, trigger)
        lines.append(f"{prompt} {opts}")
    return "\n".join(lines) + "\n"


def validate_plan(plan: Plan, dataset: dict[str, Any] | None = None) -> list[schema.Problem]:
    return schema.validate_config(plan.config, plan.family.script, dataset=dataset, family=plan.family)


def build_dataset(plan: Plan, data_dir: str | Path | None, trigger: str | None = None,
                  num_repeats: int | None = None) -> dict[str, Any]:
    """The `--dataset_config` for a plan. Resolution, batch and buckets stay in
    config.toml (the dataset file falls back to them), so `fit` changes one file only.

    The images come from the prepared copy when `dataset prep` made an up-to-date one; a
    kohya_ss folder layout (`10_ohwx woman/`) becomes one subset per folder with its own
    repeats and class tokens; otherwise one subset whose repeats cut the job's image passes
    into its usual number of epochs."""
    general: dict[str, Any] = {
        "caption_extension": plan.config.get("caption_extension", ".txt"),
        "shuffle_caption": bool(plan.config.get("shuffle_caption", False)),
    }
    if trigger and general["shuffle_caption"]:
        general["keep_tokens"] = 1
    root = Path(data_dir).absolute() if data_dir else Path("images")
    subsets: list[dict[str, Any]] = []
    if data_dir is not None and root.is_dir():
        from kohya_tuner import dataset as ds_mod  # Pillow and the scanners only when there is data

        prepared = ds_mod.find_prepared(root)
        if prepared is not None:
            root = Path(prepared).absolute()
            general["caption_extension"] = ".txt"
            plan.notes.append(f"Training from the prepared copy {root}.")
        try:
            layout = ds_mod.layout(root)
        except UserError as exc:
            layout = []
            plan.notes.append(f"{exc.message} num_repeats left at 1.")
        # Repeats cut the job's image passes into its usual number of epochs; the batch does not
        # enter (sd-scripts' epoch is images x repeats samples, whatever the batch).
        passes = plan.image_passes or int(plan.config.get("max_train_steps") or 1) * effective_batch(plan.config)[2]
        for sub in layout:
            if not sub.images:
                continue
            entry: dict[str, Any] = {"image_dir": str(root / sub.dir) if sub.dir else str(root)}
            if num_repeats is not None:
                entry["num_repeats"] = int(num_repeats)
            elif sub.repeats:
                entry["num_repeats"] = int(sub.repeats)
            else:
                entry["num_repeats"] = ds_mod.suggest_repeats(sub.images, plan.job, passes, 1)
            tokens = trigger or sub.class_tokens
            if tokens:
                entry["class_tokens"] = tokens
            subsets.append(entry)
    if not subsets:
        entry = {"image_dir": str(root), "num_repeats": int(num_repeats or 1)}
        if trigger:
            entry["class_tokens"] = trigger
        subsets.append(entry)
    return {"general": general, "datasets": [{"subsets": subsets}]}
