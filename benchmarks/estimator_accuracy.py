"""How well the memory model agrees with what people published.

Reads `real-world/vram_reports.json` (sd-scripts doc statements, FluxGym tier targets,
measured peaks from an sd-scripts pull request) and `benchmarks/data/vram_figures_extra.json`
(the newer families, full fine-tunes, and two real-world readings to explain), turns each
usable record into an sd-scripts config, and prints per record: the prediction, the published
figure, its kind (measured / fits-within / exceeds / explained) and whether it holds. Then the
summary lines: constraints satisfied, median relative error on measured figures, and the
explained records with the figure each explanation computes.

    python benchmarks/estimator_accuracy.py [path/to/vram_reports.json] [--extra PATH] [--json]

A fits-within statement ("works on a 16 GB card") holds when the estimate fits that card by
the same rule `fit` uses (peak within budget_gib). A measured figure is compared as GiB: the
tools people read GPU memory from (nvidia-smi, Task Manager, nvitop) count in binary units; it is
compared with the estimate's monitor figure (the CUDA context included) unless the record's
`figure_is` says it is PyTorch's `allocated` or `reserved` peak.
Settings a record leaves unsaid are filled in by the rules in UNSTATED below, the same for
every record, and printed with it; a record made with the kohya_ss GUI first takes the GUI's own
defaults (GUI_TOOL), which is what its user got.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kohya_tuner.families import FAMILIES  # noqa: E402
from kohya_tuner.memory import budget_gib, estimate  # noqa: E402
from kohya_tuner.memory.finetune import family_for as fine_tune_family  # noqa: E402

DEFAULT_REPORTS = ROOT.parent / "shared" / "real-world" / "vram_reports.json"
DEFAULT_EXTRA = ROOT / "benchmarks" / "data" / "vram_figures_extra.json"
REAL_CONFIGS = ROOT.parent / "shared" / "real-world" / "configs"

FAMILY_OF = {"flux-dev": "flux", "flux-schnell": "flux", "sdxl": "sdxl", "sd1.5": "sd15", "sd15": "sd15",
             "sd2": "sd2", "sd3": "sd3", "sd3.5-medium": "sd35m", "sd3.5-large": "sd35l", "chroma": "chroma",
             "lumina2": "lumina2", "hunyuan21": "hunyuan21", "anima": "anima"}
KIND_OF = {"doc_fits_within": "fits-within", "doc_preset_target": "fits-within", "reported_usage": "measured",
           "doc_approx_usage": "measured", "doc_exceeds": "exceeds", "reported_oom": "exceeds",
           "monitor_reading": "explained", "reported_oom_old_code": "explained"}

# What an unstated setting becomes. sd-scripts' own defaults where it has one (AdamW, no caching,
# text-encoder LoRA trained, batch 1); the family's native resolution; bf16 mixed precision
# where a doc statement leaves precision open (sd-scripts' default fp32 is not what any of
# its memory statements is about). Gradient checkpointing is never assumed: a record without
# it is left without it.
# A measured record comes from a run that happened on a known card. When an unstated memory
# saver left at sd-scripts' default (off) would make that run impossible on that card, the
# saver is taken as on: the smallest departure from the defaults that explains the figure.
# Tried in this order, one at a time, until the run fits.
FEASIBILITY_SAVERS = ("gradient_checkpointing", "cache_text_encoder_outputs", "cache_latents")

UNSTATED = {
    "resolution": "the family's native resolution",
    "batch_size": "1 (sd-scripts' default)",
    "optimizer": "AdamW (sd-scripts' default)",
    "mixed_precision": "bf16",
    "network_rank": "4 (the LoRA module's default)",
    "cache_latents": "off (sd-scripts' default)",
    "cache_text_encoder_outputs": "off (sd-scripts' default)",
    "unet_only": "off: text-encoder LoRA trained (sd-scripts' default)",
    "gradient_checkpointing": "off (sd-scripts' default)",
}


# A record made with the kohya_ss GUI leaves unsaid what the GUI's form held: its own defaults, not
# sd-scripts' (the tab's fields as recorded in kohya_tuner/data/kohya_gui_fields.json; the same
# defaults in the GUI of May 2024, bmaltais/kohya_ss 31e5f75: optimizer AdamW8bit, cache latents on,
# SDXL text-encoder outputs not cached, xformers). Only the memory settings below are taken from it.
GUI_TOOL = "kohya_ss"
_GUI_TE_CACHE = {"sdxl": "sdxl_cache_text_encoder_outputs", "flux": "flux1_cache_text_encoder_outputs",
                 "sd3": "sd3_cache_text_encoder_outputs", "sd35m": "sd3_cache_text_encoder_outputs",
                 "sd35l": "sd3_cache_text_encoder_outputs"}


def gui_defaults(r: dict[str, Any], fam: str) -> dict[str, Any]:
    """The kohya_ss GUI's defaults for a record's unstated memory settings ({} for other tools)."""
    if str(r.get("tool") or "").split(" ")[0] != GUI_TOOL:
        return {}
    fields = json.loads((ROOT / "kohya_tuner" / "data" / "kohya_gui_fields.json").read_text(encoding="utf-8"))
    tab = fields["tabs"]["dreambooth" if r.get("training_type") == "full_finetune" else "lora"]
    value = {k: v[1] for k, v in tab.items() if isinstance(v, list) and len(v) == 2}
    out = {"optimizer": value.get("optimizer"), "mixed_precision": value.get("mixed_precision"),
           "cache_latents": value.get("cache_latents"), "attention": value.get("xformers")}
    if fam in _GUI_TE_CACHE:
        out["cache_text_encoder_outputs"] = value.get(_GUI_TE_CACHE[fam])
    return {k: v for k, v in out.items() if v is not None}


def _optimizer(text: str | None) -> tuple[str, list[str] | None, str | None]:
    if not text:
        return "AdamW", None, UNSTATED["optimizer"]
    t = text.lower()
    # "8bit optimizer or adafactor": the statement must hold for both; the 8-bit one keeps more state.
    if "lion8bit" in t:
        return "Lion8bit", None, ("'Adafactor or Lion8bit': Lion8bit, the larger of the two" if "adafactor" in t else None)
    if "8bit" in t or "8-bit" in t:
        return "AdamW8bit", None, ("'8bit optimizer or adafactor': AdamW8bit, the larger of the two"
                                   if "adafactor" in t else None)
    if "adafactor" in t:
        return "Adafactor", ["relative_step=False", "scale_parameter=False", "warmup_init=False"], None
    if "prodigy" in t:
        return "Prodigy", None, None
    return "AdamW", None, None


def record_config(r: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None, list[str]]:
    """(config, family name, assumptions) for a record, or (None, reason, []) if unusable."""
    fam = FAMILY_OF.get(str(r.get("model_family", "")).lower())
    if fam is None:
        return None, f"{r.get('model_family')} is not a model family kohya-tuner supports", []
    if r.get("training_type") not in ("lora", "full_finetune"):
        return None, f"{r.get('training_type')} is not LoRA or full fine-tune training", []
    if KIND_OF.get(r.get("vram_kind", "")) is None:
        return None, f"unknown figure kind {r.get('vram_kind')!r}", []
    family = FAMILIES[fam]
    a: list[str] = []
    r = dict(r)
    # A setting the record's own source implies without naming it (its other figures from the same runs
    # could not have happened otherwise): the record says which, and why, in `implied`.
    filled = [(k, v["value"], f"implied by the source: {v['why']}") for k, v in (r.get("implied") or {}).items()]
    filled += [(k, v, "the kohya_ss GUI's default") for k, v in gui_defaults(r, fam).items()]
    for key, value, why in filled:
        if r.get(key) is None:
            r[key] = value
            shown = {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
            a.append(f"{key.replace('_', ' ')}: {shown} ({why})")
    c: dict[str, Any] = {"network_module": r.get("network_module") or family.network_module}
    if r.get("network_args"):
        c["network_args"] = list(r["network_args"])
    if r.get("training_type") == "full_finetune":
        c = {}
    mp_text = str(r.get("mixed_precision") or "")
    if not mp_text:
        c["mixed_precision"] = "bf16"
        a.append(f"mixed precision: {UNSTATED['mixed_precision']}")
    else:
        c["mixed_precision"] = "fp16" if mp_text.startswith("fp16") else ("no" if mp_text.startswith("no") else "bf16")
        if "full_bf16" in mp_text:
            c["full_bf16"] = True
        if "full_fp16" in mp_text:
            c["full_fp16"] = True
    res = r.get("resolution")
    if res is None:
        res = family.native_resolution
        a.append(f"resolution: {res} ({UNSTATED['resolution']})")
    c["resolution"] = str(res)
    batch = r.get("batch_size")
    if batch is None:
        batch = 1
        a.append(f"batch size: {UNSTATED['batch_size']}")
    c["train_batch_size"] = int(batch)
    rank = r.get("network_rank")
    if r.get("training_type") == "full_finetune":
        rank = 0
    elif rank is None:
        rank = 4
        a.append(f"rank: {UNSTATED['network_rank']}")
    elif isinstance(rank, str):
        nums = [int(x) for x in re.findall(r"\d+", rank)]
        rank = max(nums) if nums else 4
        a.append(f"rank {r['network_rank']!r}: {rank}, the larger")
    if rank:
        c["network_dim"] = int(rank)
    opt, args, note = _optimizer(r.get("optimizer"))
    if "fused_backward_pass" in str(r.get("optimizer") or ""):
        c["fused_backward_pass"] = True
    c["optimizer_type"] = opt
    if args:
        c["optimizer_args"] = args
    if note:
        a.append(f"optimizer: {note}")
    for key, ck in (("gradient_checkpointing", "gradient_checkpointing"), ("cache_latents", "cache_latents"),
                    ("cache_text_encoder_outputs", "cache_text_encoder_outputs"), ("fp8_base", "fp8_base"),
                    ("fp8_scaled", "fp8_scaled"), ("fp8_vl", "fp8_vl"), ("text_encoder_cpu", "text_encoder_cpu")):
        v = r.get(key)
        if v is None and key in UNSTATED:
            a.append(f"{key.replace('_', ' ')}: {UNSTATED[key]}")
        if v:
            c[ck] = True
    unet_only = r.get("unet_only")
    if r.get("training_type") == "full_finetune":
        pass
    elif unet_only is None:
        a.append(f"text encoder: {UNSTATED['unet_only']}")
    elif unet_only:
        c["network_train_unet_only"] = True
    if r.get("blocks_to_swap"):
        c["blocks_to_swap"] = int(r["blocks_to_swap"])
    off = str(r.get("offloading") or "") + " " + str(r.get("notes") or "")
    if "split_mode" in off and not r.get("blocks_to_swap"):
        c["split_mode"] = True
    if "train_blocks=single" in off:
        c["network_args"] = ["train_blocks=single"]
    if family.attention_flags_apply:
        att = str(r.get("attention") or "sdpa").lower()
        c["xformers" if "xformers" in att else "sdpa"] = True
        if not r.get("attention"):
            a.append("attention: sdpa (every memory statement assumes a memory-efficient kernel)")
    quant = str(r.get("quantization") or "")
    if fam == "flux":
        c["t5xxl"] = r.get("t5xxl") or (
            "t5xxl_fp8_e4m3fn.safetensors" if "t5xxl" in quant.lower() else "t5xxl_fp16.safetensors")
        c["pretrained_model_name_or_path"] = "flux1-dev.safetensors"
    excerpt = str(r.get("command_excerpt") or "") + " " + str(r.get("notes") or "")
    if "--highvram" in excerpt or "highvram" in excerpt or r.get("highvram"):
        c["highvram"] = True
    return c, fam, a


def record_family(r: dict[str, Any], cfg: dict[str, Any], fam: str):
    """The family a record trains: a full fine-tune is the family trained by its own script."""
    if r.get("training_type") == "full_finetune":
        return fine_tune_family(r.get("script"), cfg, fam)
    return FAMILIES[fam]


def _gpu_gb(r: dict[str, Any]) -> float | None:
    m = re.search(r"(\d+)\s*GB", str(r.get("gpu") or ""))
    if m:
        return float(m.group(1))
    if KIND_OF.get(r.get("vram_kind", "")) == "measured" and r.get("vram_gb"):
        # A figure measured on an unnamed card: the run happened on one at least that large; the
        # smallest card size sold above the figure is the weakest such assumption.
        from kohya_tuner.memory import GPU_SIZES

        return float(next((g for g in GPU_SIZES if g > float(r["vram_gb"])), GPU_SIZES[-1]))
    return None


def make_feasible(cfg: dict[str, Any], family, r: dict[str, Any], assumed: list[str]) -> dict[str, Any]:
    """Apply FEASIBILITY_SAVERS to a measured record whose run could not have happened
    with them off."""
    gb = _gpu_gb(r)
    if gb is None or KIND_OF.get(r.get("vram_kind", "")) != "measured":
        return cfg
    cfg = dict(cfg)
    for key in FEASIBILITY_SAVERS:
        if estimate(cfg, family).fits(gb):
            break
        given = key in (r.get("implied") or {}) or key in gui_defaults(r, family.name)
        if r.get(key) is None and not given and not cfg.get(key):
            cfg[key] = True
            assumed[:] = [x for x in assumed if not x.startswith(key.replace("_", " "))]
            assumed.append(f"{key.replace('_', ' ')}: on (off would not fit the {gb:g} GB card the figure "
                           f"was measured on)")
    return cfg


GIB = float(1024 ** 3)


def _explain(r: dict[str, Any], e, family, row: dict[str, Any]) -> None:
    """The figure an explained record's explanation computes, and whether it accounts for it."""
    if r["vram_kind"] == "reported_oom_old_code":
        # The code of the time moved the models to the GPU in fp32 (accelerator.prepare of the U-Net and
        # the trained text encoders) and cast them to the training dtype only afterwards.
        trained = [t for t, on in zip(family.text_encoders, e.settings.get("text_encoders_trained", [])) if on]
        names = set(e.settings.get("text_encoders_trained", []))
        params = family.diffusion.params + sum(t.params for t in family.text_encoders if t.name in names)
        # what the card must hold: the allocator's load peak and the CUDA context (the OOM's "total capacity")
        load = params * 4 / GIB + e.phases_gib["model_load"] - sum(
            v for k, v in e.phase_components_gib["model_load"].items() if k.endswith("_weights")) + (
            e.monitor_gib - e.reserved_gib)
        row["explained_gib"] = round(load, 2)
        row["explanation"] = (f"pinned code: peak {e.peak_gib:.2f} GiB fits; code of the time moved the fp32 U-Net "
                              f"and {len(trained) or len(names)} trained text encoder(s) before casting: model load "
                              f"{load:.2f} GiB > {row['figure']:.2f} GiB")
        row["holds"] = load > row["figure"]
    else:
        # What the caching allocator reserves above the live peak for the same step (memtrace allocsim).
        from kohya_tuner.memory import data

        checks = [c for c in data.coefficients().get("allocator_checks", []) if c["arch"] == family.name]
        reserve = max((c["reserve_gib"] for c in checks), default=0.0)
        shown = e.monitor_gib + reserve
        row["explained_gib"] = round(shown, 2)
        row["rel_error"] = round((shown - row["figure"]) / row["figure"], 4)
        row["explanation"] = (f"highvram places nothing differently (it only skips emptying the cache while latents "
                              f"are cached); the allocator's reserve on the traced step adds {reserve:.2f} GiB: "
                              f"{shown:.2f} GiB; {row['figure'] - shown:.1f} of the monitor's reading stay unaccounted "
                              f"(no tensor of the traced step; a GPU run must tell context, driver and other "
                              f"processes apart)")
        row["holds"] = None


def _records(paths: list[Path]) -> list[dict[str, Any]]:
    out = []
    for path in paths:
        doc = json.loads(path.read_text(encoding="utf-8"))
        out += doc["records"] if isinstance(doc, dict) else doc
    return out


def _mode(cfg: dict[str, Any], e) -> str:
    """What trains: full, LoRA, a LyCORIS algorithm or OFT (the module the record's config names)."""
    if e.settings.get("trained") == "full":
        return "full"
    module = str(cfg.get("network_module") or "")
    if module == "lycoris.kohya":
        args = cfg.get("network_args") or []
        algo = next((str(a).split("=", 1)[1] for a in args if str(a).startswith("algo=")), "lora")
        return f"lycoris:{algo}"
    return "oft" if module.startswith("networks.oft") else "lora"


def by_family_and_mode(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if r["kind"] != "explained":
            groups.setdefault((r["family"], r["mode"]), []).append(r)
    out = []
    for (fam, mode), rs in sorted(groups.items()):
        meas = [r for r in rs if r["kind"] == "measured"]
        verd = [r for r in rs if r["kind"] in ("fits-within", "exceeds")]
        out.append({"family": fam, "mode": mode, "measured": len(meas),
                    "measured_within_10pct": sum(bool(r["holds"]) for r in meas),
                    "verdicts": len(verd), "verdicts_right": sum(bool(r["holds"]) for r in verd)})
    return out


def run(path: Path | list[Path]) -> dict[str, Any]:
    records = _records(path if isinstance(path, list) else [path])
    rows = []
    skipped = []
    for r in records:
        if r.get("config_file"):
            from kohya_tuner import config_io

            loaded = config_io.read_config(REAL_CONFIGS / r["config_file"])
            cfg, fam, assumed = loaded.config, loaded.family.name, ["the user's own config file"]
            family = loaded.family
        else:
            cfg, fam, assumed = record_config(r)
            if cfg is None:
                skipped.append({"id": r.get("id"), "why": fam})
                continue
            family = record_family(r, cfg, fam)
        cfg = make_feasible(cfg, family, r, assumed)
        t0 = time.perf_counter()
        e = estimate(cfg, family)
        ms = (time.perf_counter() - t0) * 1000
        kind = KIND_OF[r["vram_kind"]]
        figure = float(r["vram_gb"])
        model = fam if family.script == FAMILIES[fam].script else f"{fam}:{family.script.split('.')[0]}"
        row = {"id": r.get("id"), "source": r.get("source", {}).get("repo", ""), "model": model, "kind": kind,
               "family": fam, "mode": _mode(cfg, e),
               "figure": figure, "predicted_gib": round(e.peak_gib, 2), "peak_phase": e.peak_phase,
               "assumed": assumed, "ms": round(ms, 2)}
        if kind == "explained":
            _explain(r, e, family, row)
        elif kind == "fits-within":
            b = budget_gib(figure)
            row["budget_gib"] = round(b, 2)
            row["holds"] = e.fits(figure)
        elif kind == "exceeds":
            row["holds"] = not e.fits(figure)
        else:
            shown = {"allocated": e.allocated_gib, "reserved": e.reserved_gib}.get(r.get("figure_is"), e.monitor_gib)
            row["predicted_gib"] = round(shown, 2)
            rel = (shown - figure) / figure
            row["rel_error"] = round(rel, 4)
            row["holds"] = abs(rel) <= 0.10
        rows.append(row)
    constraints = [r for r in rows if r["kind"] in ("fits-within", "exceeds")]
    measured = [r for r in rows if r["kind"] == "measured"]
    explained = [r for r in rows if r["kind"] == "explained"]
    new = [r for r in constraints + measured if r["model"].split(":")[0] not in ("sd15", "sdxl", "flux")
           or ":" in r["model"]]
    docs = [r for r in constraints if r["source"] == "kohya-ss/sd-scripts"]
    med = statistics.median(abs(r["rel_error"]) for r in measured) if measured else None
    return {"rows": rows, "skipped": skipped, "by_family_and_mode": by_family_and_mode(rows),
            "summary": {"constraints": len(constraints), "constraints_ok": sum(r["holds"] for r in constraints),
                        "sd_scripts_docs": len(docs), "sd_scripts_docs_ok": sum(r["holds"] for r in docs),
                        "measured": len(measured), "measured_within_10pct": sum(r["holds"] for r in measured),
                        "median_abs_rel_error": med,
                        "new_families_and_full_finetunes": len(new),
                        "new_families_and_full_finetunes_ok": sum(bool(r["holds"]) for r in new),
                        "explained": [{"id": r["id"], "figure": r["figure"], "predicted_gib": r["predicted_gib"],
                                       "explanation": r["explanation"], "accounts": r["holds"]} for r in explained]}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="?", default=os.environ.get("KOHYA_TUNER_VRAM_REPORTS", str(DEFAULT_REPORTS)))
    ap.add_argument("--extra", default=str(DEFAULT_EXTRA),
                    help="more records in the same form (default benchmarks/data/vram_figures_extra.json; '' for none)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--prefer-impl", choices=["sd-scripts", "diffusers"], default=None,
                    help="take the SD 1.5 / SD 2.x / SDXL activation lines from this traced implementation (to "
                         "compare the two; the shipped choice is memory_coefficients.json's impl_preference)")
    args = ap.parse_args(argv)
    if args.prefer_impl:
        from kohya_tuner.memory import data

        data.coefficients()["impl_preference"] = {a: args.prefer_impl for a in ("sd15", "sd2", "sdxl")}
        data._lines.cache_clear()
    path = Path(args.reports)
    if not path.is_file():
        print(f"error: {path} not found (give the path to vram_reports.json)", file=sys.stderr)
        return 2
    paths = [path] + ([Path(args.extra)] if args.extra else [])
    res = run(paths)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"{'id':5} {'model':16} {'kind':11} {'figure':>7} {'predicted':>9} {'budget':>7} {'error':>7}  holds  "
          f"peak phase / assumed")
    for r in res["rows"]:
        err = f"{r['rel_error'] * 100:+.1f}%" if "rel_error" in r else ""
        bud = f"{r['budget_gib']:.2f}" if "budget_gib" in r else ""
        holds = "-" if r["holds"] is None else ("yes" if r["holds"] else "NO ")
        print(f"{r['id']:5} {r['model']:16} {r['kind']:11} {r['figure']:7.2f} {r['predicted_gib']:9.2f} {bud:>7} "
              f"{err:>7}  {holds:5}  {r['peak_phase']}"
              + (f"; {r['explanation']}" if r.get("explanation") else "")
              + (f"; assumed: {'; '.join(r['assumed'])}" if r["assumed"] else ""))
    for s in res["skipped"]:
        print(f"{s['id']:5} skipped: {s['why']}")
    s = res["summary"]
    med = f"{s['median_abs_rel_error'] * 100:.1f} %" if s["median_abs_rel_error"] is not None else "n/a"
    print(f"summary: constraints satisfied {s['constraints_ok']}/{s['constraints']} (sd-scripts docs "
          f"{s['sd_scripts_docs_ok']}/{s['sd_scripts_docs']}); median relative error on measured figures {med} "
          f"({s['measured_within_10pct']}/{s['measured']} within ±10 %)")
    print(f"summary: new families and full fine-tunes {s['new_families_and_full_finetunes_ok']}/"
          f"{s['new_families_and_full_finetunes']} hold")
    for g in res["by_family_and_mode"]:
        share = (f"{g['measured_within_10pct']}/{g['measured']} measured within ±10 %" if g["measured"]
                 else "no measured figure")
        print(f"by family and mode: {g['family']:9} {g['mode']:14} {share}; "
              f"{g['verdicts_right']}/{g['verdicts']} fits / OOM verdicts right")
    for x in s["explained"]:
        print(f"explained: {x['id']} figure {x['figure']:.2f} predicted {x['predicted_gib']:.2f} GiB: "
              f"{x['explanation']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
