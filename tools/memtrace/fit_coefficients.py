"""Turn tracer results (JSON lines from run_trace.py) into kohya_tuner/data/memory_coefficients.json.

Standard library only, so it runs in any Python (no torch needed):

    python tools/memtrace/fit_coefficients.py RESULTS.jsonl [MORE.jsonl ...] \
        --out kohya_tuner/data/memory_coefficients.json

What it fits:

* activations: for each (arch, impl, precision, ckpt, fp8, attn="flash") group, a least-squares line
  act_GiB = mib_per_token * tokens * batch / 1024 + intercept_gib, where act = peak - weights
  (base + LoRA) at the moment of the peak.  Every point and its residual are kept in the output.
* attention_math_extra: what plain (math) attention adds over flash, as an analytic function of the
  attention layout (sum of fp32 L^2 matrices, largest single matrix, fp32 q/k/v copies) with three
  shared constants fitted to the traced math-vs-flash pairs.
* architectures: parameter counts, LoRA module/parameter counts at the traced rank.
* optimizer_checks: bytes of optimizer state per LoRA parameter seen in traced full steps.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import configs  # noqa: E402

GiB = 2 ** 30

# Which traced implementation the estimator takes for an arch that has both (kohya_tuner.memory.data
# otherwise prefers sd-scripts' own classes). Chosen by benchmarks/estimator_accuracy.py --prefer-impl
# against the published SD 1.x / SDXL figures; see docs/memory-tracer.md.
# SD 1.5: diffusers, closer on the one measured SD 1.x figure (DreamBooth, about 12 GB: -14.3 % against
# -15.1 %); SDXL: sd-scripts, a tie on the measured SDXL figure (the fp32 row both use is diffusers'), so
# the class sd-scripts runs.
IMPL_PREFERENCE: dict[str, str] = {"sd15": "diffusers", "sdxl": "sd-scripts"}



def load_rows(paths: list[str]) -> list[dict]:
    rows = []
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                line = line.strip()
                if not line:
                    continue
                row = json.loads(line)
                if "failed" in row or "error" in row:
                    continue
                row["_src"] = f"{os.path.basename(path)}:{lineno}"
                rows.append(row)
    return rows


def is_multistep(row: dict) -> bool:
    """Rows whose peak may include optimizer states (second step onwards)."""
    return any(k.startswith(("fwd2", "bwd2", "opt2")) for k in row.get("phase_peak_GiB", {}))


def row_tokens(row: dict) -> int:
    h = row.get("res_h", row["res"])
    w = row.get("res_w", row["res"])
    return configs.tokens(row["arch"], h, w, row.get("t5tokens") or None)


def linfit(points: list[tuple[float, float]]) -> tuple[float, float]:
    n = len(points)
    if n == 1:
        x, y = points[0]
        return (y / x if x else 0.0), 0.0
    sx = sum(p[0] for p in points)
    sy = sum(p[1] for p in points)
    sxx = sum(p[0] * p[0] for p in points)
    sxy = sum(p[0] * p[1] for p in points)
    den = n * sxx - sx * sx
    if den == 0:
        return 0.0, sy / n
    slope = (n * sxy - sx * sy) / den
    return slope, (sy - slope * sx) / n


def act_of(row: dict) -> float:
    if row.get("_fused"):
        return row["act_without_grads_peak_GiB"]
    return row["peak_minus_weights_GiB"]


def group_key(row: dict) -> tuple:
    mode = row.get("mode", "lora")
    if mode == "full" and row.get("_fused"):
        mode = "full_fused"
    return (row["arch"], row.get("impl", "diffusers"), row["precision"], bool(row["ckpt"]), bool(row["fp8"]),
            row["attn"], bool(row.get("cpu_offload_ckpt", False)), mode)


def with_fused_views(rows: list[dict]) -> list[dict]:
    """A full fine-tune trace gives two lines: activations at the step's peak (gradients of every
    weight alive, counted apart) and the peak without gradients (fused_backward_pass frees each)."""
    out = list(rows)
    for row in rows:
        if row.get("mode") == "full" and "act_without_grads_peak_GiB" in row:
            out.append({**row, "_fused": True})
    return out


def fit_activations(rows: list[dict]) -> list[dict]:
    groups: dict[tuple, dict[tuple, dict]] = defaultdict(dict)
    for row in with_fused_views(rows):
        if is_multistep(row) or row["attn"] != "flash" or "network" in row:
            continue
        # one point per (tokens, batch); meta and fake devices agree to 0.1 %, the first row wins
        pkey = (row_tokens(row), row["batch"], row.get("rank", 16))
        groups[group_key(row)].setdefault(pkey, row)
    out = []
    for key in sorted(groups):
        arch, impl, precision, ckpt, fp8, attn, offload, mode = key
        pts_rows = sorted(groups[key].items())
        points = [(tok * batch, act_of(r)) for (tok, batch, _rank), r in pts_rows]
        slope_gib, icpt = linfit(points)
        residuals = [y - (slope_gib * x + icpt) for x, y in points]
        max_rel = max(abs(res) / y if y > 0 else 0.0 for res, (_x, y) in zip(residuals, points))
        entry = {
            "arch": arch,
            "impl": impl,
            "precision": precision,
            "ckpt": ckpt,
            "fp8": fp8,
            "attn": attn,
            "mib_per_token": round(slope_gib * 1024, 5),
            "intercept_gib": round(icpt, 4),
            "max_rel_residual": round(max_rel, 4),
            "max_abs_residual_gib": round(max(abs(r) for r in residuals), 4),
            "n_points": len(points),
            "points": [[x, round(y, 4)] for x, y in points],
            "residuals_gib": [round(r, 4) for r in residuals],
            "peak_phases": sorted({r.get("peak_phase") or "?" for _k, r in pts_rows}),
            "source": ", ".join(r["_src"] for _k, r in pts_rows),
        }
        if offload:
            entry["cpu_offload_checkpointing"] = True
        if mode != "lora":
            entry["mode"] = mode
        out.append(entry)
    return out


def fit_networks(rows: list[dict]) -> list[dict]:
    """Activations of the network modules other than the family's LoRA (network_traces.py), as what they
    add to the LoRA traced beside them at the same size: a line in tokens x batch when two sizes were
    traced, a constant from one size."""
    base: dict[tuple, float] = {}
    base_rank: dict[tuple, int] = {}
    rows = [r for r in rows if not r.get("rank_sweep")]
    for row in rows:
        if row.get("network") == "lora":
            base[(row["arch"], row["precision"], bool(row["ckpt"]), row_tokens(row) * row["batch"])] = act_of(row)
            base_rank[(row["arch"], row["precision"], bool(row["ckpt"]))] = int(row["rank"])
    groups: dict[tuple, list[tuple[float, float, str]]] = defaultdict(list)
    for row in rows:
        net = row.get("network")
        if net in (None, "lora"):
            continue
        x = row_tokens(row) * row["batch"]
        ref = base.get((row["arch"], row["precision"], bool(row["ckpt"]), x))
        if ref is None:
            continue
        algo = dict(kv.split("=", 1) for kv in row.get("network_args", "").split(",") if kv).get("algo", "")
        groups[(row["arch"], row["precision"], bool(row["ckpt"]), net, algo)].append((x, act_of(row) - ref,
                                                                                    row["_src"]))
    out = []
    for (arch, precision, ckpt, net, algo), pts in sorted(groups.items()):
        pts.sort()
        if len(pts) == 1:
            # One size: a constant. Where two sizes were traced (SD 1.5 without checkpointing) the extra hardly
            # grows with the tokens: it is the modules' weight-sized tensors, not saved inputs.
            slope, icpt = 0.0, pts[0][1]
        else:
            slope, icpt = linfit([(x, y) for x, y, _s in pts])
        # The LoRA it was traced beside ran at this rank: the extra sits on the LoRA's activations at it.
        out.append({"arch": arch, "precision": precision, "ckpt": ckpt, "network": net, "algo": algo,
                    "lora_rank": base_rank[(arch, precision, ckpt)],
                    "mib_per_token": round(slope * 1024, 5), "intercept_gib": round(icpt, 4),
                    "points": [[x, round(y, 4)] for x, y, _s in pts], "source": ", ".join(s for *_xy, s in pts)})
    return out


def fit_ranks(rows: list[dict]) -> dict:
    """What a higher rank of the family's own LoRA adds to the activations (rank_traces.py: the same size traced
    at two ranks). Only pairs whose peak is at the end of the forward, where no gradient exists yet: with
    checkpointing the peak is in backward, where the LoRA's gradients (growing with the rank) move it. The
    difference is autocast's 16-bit copies of the fp32 LoRA weights, saved for backward (2 bytes per LoRA
    parameter, whatever the batch), and the down-projections' outputs (rank values per token)."""
    pairs: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for row in rows:
        if row.get("rank_sweep") and row.get("peak_phase") == "fwd":
            key = (row["arch"], row["precision"], bool(row["ckpt"]), row_tokens(row) * row["batch"])
            pairs[key][int(row["rank"])] = row
    lines = []
    for (arch, precision, ckpt, x), by_rank in sorted(pairs.items()):
        if len(by_rank) < 2:
            continue
        lo, hi = by_rank[min(by_rank)], by_rank[max(by_rank)]
        copies = 2 * (hi["lora_params"] - lo["lora_params"]) / GiB
        per_token = (act_of(hi) - act_of(lo) - copies) / (hi["rank"] - lo["rank"]) * 1024 / x
        lines.append({"arch": arch, "precision": precision, "ckpt": ckpt, "ranks": [lo["rank"], hi["rank"]],
                      "tokens": x, "weight_copy_bytes_per_param": 2, "mib_per_token_per_rank": round(per_token, 8),
                      "source": f"{lo['_src']}, {hi['_src']}"})
    # The rows the activation lines are fitted from (an allocator replay is a check, not one of them).
    traced = sorted({int(r["rank"]) for r in rows if "network" not in r and r.get("mode", "lora") == "lora"
                     and r.get("rank") and "allocator" not in r})
    return {"lines": lines, "activation_lines_rank": traced[0] if len(traced) == 1 else traced}


def fit_math_attention(rows: list[dict]) -> dict:
    """Fit extra(math) - extra(flash) = sum_l2 + k_transient*max_l2 + k_qkv*sum_qkv (no checkpointing)
    and = k_ckpt*max_l2 (checkpointing: one recomputed block holds its probabilities while backward
    makes two more matrices of the same size)."""
    flash = {}
    math = {}
    for row in rows:
        if is_multistep(row) or row.get("impl", "diffusers") != "diffusers":
            continue
        key = (row["arch"], row["precision"], bool(row["ckpt"]), bool(row["fp8"]), row_tokens(row), row["batch"])
        (math if row["attn"] == "math" else flash).setdefault(key, row)
    pairs_nc, pairs_c = [], []
    for key, mrow in sorted(math.items()):
        frow = flash.get(key)
        if frow is None:
            continue
        arch, _prec, ckpt, _fp8, tok, batch = key
        b = configs.math_attention_bytes(configs.attention_layout(arch), tok, batch)
        extra = act_of(mrow) - act_of(frow)
        rec = dict(arch=arch, precision=key[1], tokens=tok, batch=batch, extra_gib=round(extra, 4),
                   sum_l2_gib=b["sum_l2"] / GiB, max_l2_gib=b["max_l2"] / GiB, sum_qkv_gib=b["sum_qkv_fp32"] / GiB,
                   source=f'{mrow["_src"]} - {frow["_src"]}')
        (pairs_c if ckpt else pairs_nc).append(rec)

    result: dict = {}
    if pairs_nc:
        # two unknowns (k_transient, k_qkv): normal equations of y = a*u + b*v, no intercept
        ys = [p["extra_gib"] - p["sum_l2_gib"] for p in pairs_nc]
        us = [p["max_l2_gib"] for p in pairs_nc]
        vs = [p["sum_qkv_gib"] for p in pairs_nc]
        suu = sum(u * u for u in us)
        svv = sum(v * v for v in vs)
        suv = sum(u * v for u, v in zip(us, vs))
        suy = sum(u * y for u, y in zip(us, ys))
        svy = sum(v * y for v, y in zip(vs, ys))
        det = suu * svv - suv * suv
        if len(pairs_nc) >= 2 and det > 1e-12:
            k_tr = (suy * svv - svy * suv) / det
            k_qkv = (svy * suu - suy * suv) / det
        else:
            k_tr, k_qkv = 2.0, 0.0
        for p in pairs_nc:
            pred = p["sum_l2_gib"] + k_tr * p["max_l2_gib"] + k_qkv * p["sum_qkv_gib"]
            p["predicted_gib"] = round(pred, 4)
            p["rel_error"] = round((pred - p["extra_gib"]) / p["extra_gib"], 4) if p["extra_gib"] else 0.0
        result["no_ckpt"] = {
            "formula": "extra_gib = sum_l2 + k_transient * max_l2 + k_qkv * sum_qkv",
            "k_transient": round(k_tr, 4),
            "k_qkv": round(k_qkv, 4),
            "max_rel_error": round(max(abs(p["rel_error"]) for p in pairs_nc), 4),
            "pairs": pairs_nc,
        }
    if pairs_c:
        k = sum(p["extra_gib"] * p["max_l2_gib"] for p in pairs_c) / sum(p["max_l2_gib"] ** 2 for p in pairs_c)
        for p in pairs_c:
            pred = k * p["max_l2_gib"]
            p["predicted_gib"] = round(pred, 4)
            p["rel_error"] = round((pred - p["extra_gib"]) / p["extra_gib"], 4) if p["extra_gib"] else 0.0
        result["ckpt"] = {
            "formula": "extra_gib = k_ckpt * max_l2",
            "k_ckpt": round(k, 4),
            "max_rel_error": round(max(abs(p["rel_error"]) for p in pairs_c), 4),
            "pairs": pairs_c,
        }
    for grp in result.values():
        for p in grp["pairs"]:
            for f in ("sum_l2_gib", "max_l2_gib", "sum_qkv_gib"):
                p[f] = round(p[f], 4)
    return result


def architectures(rows: list[dict]) -> dict:
    out: dict = {}
    for row in rows:
        if row.get("mode") == "full" or "network" in row:
            continue  # no network, or another one: nothing to compare with the LoRA targets
        impl = row.get("impl", "diffusers")
        key = row["arch"] if impl == "diffusers" else f'{row["arch"]}:{impl}'
        ent = out.setdefault(key, {"arch": row["arch"], "impl": impl, "n_params": row["n_params"], "lora": {}})
        rank = row.get("rank", 16)
        ent["lora"].setdefault(str(rank), {"modules": row["lora_modules"], "params": row["lora_params"]})
        if not row["fp8"] and row["precision"] == "bf16":
            ent.setdefault("base_bf16_gib", round(row["peak_by_cat"].get("param_base", 0.0), 4))
        if row["fp8"]:
            ent.setdefault("base_fp8_traced_gib", round(row["peak_by_cat"].get("param_base", 0.0), 4))
    return out


def optimizer_checks(rows: list[dict]) -> list[dict]:
    """Optimizer state bytes per LoRA parameter in traced multi-step runs (AdamW: exp_avg + exp_avg_sq in fp32
    = 8 B; the tracer keeps LoRA in fp32 under amp)."""
    out = []
    for row in rows:
        if not is_multistep(row):
            continue
        opt = row["peak_by_cat"].get("opt", 0.0)
        pp = row["phase_peak_GiB"]
        step1 = max(pp.get("fwd", 0.0), pp.get("bwd", 0.0), pp.get("opt", 0.0))
        out.append(dict(
            arch=row["arch"], impl=row.get("impl", "diffusers"), optimizer=row.get("optimizer", "AdamW"),
            res=row["res"], ckpt=row["ckpt"], fp8=row["fp8"], precision=row["precision"],
            lora_params=row["lora_params"], state_gib=opt,
            bytes_per_param=round(opt * GiB / row["lora_params"], 3) if row["lora_params"] else None,
            step1_peak_gib=step1, steady_peak_gib=row["peak_GiB"],
            steady_minus_step1_gib=round(row["peak_GiB"] - step1, 4),
            source=row["_src"],
        ))
    return out


def allocator_checks(rows: list[dict]) -> list[dict]:
    """Traces replayed through the caching-allocator model (run_trace.py --allocator): how much the
    allocator reserves above the live peak (what a GPU monitor shows beyond max_memory_allocated)."""
    out = []
    for row in rows:
        al = row.get("allocator")
        if not al:
            continue
        out.append(dict(arch=row["arch"], impl=row.get("impl", "diffusers"), res=row["res"], batch=row["batch"],
                        ckpt=row["ckpt"], fp8=row["fp8"], rank=row.get("rank"), steps=row.get("steps", 1),
                        optimizer=row.get("optimizer"), live_peak_gib=row["peak_GiB"],
                        allocated_peak_gib=al["peak_allocated"], reserved_peak_gib=al["peak_reserved"],
                        reserve_gib=round(al["peak_reserved"] - row["peak_GiB"], 3),
                        events=al.get("n_events"), source=row["_src"]))
    return out


def expected_calls(arch: str, n_tokens: int, batch: int) -> list[list[int]]:
    out = {}
    for lay in configs.attention_layout(arch):
        lq = int(round(lay["q_frac"] * n_tokens))
        lk = lay["kv_fixed"] if lay["kv_fixed"] is not None else int(round(lay["kv_frac"] * n_tokens))
        key = (batch, lay["heads"], lq, lk, lay["head_dim"])
        out[key] = out.get(key, 0) + lay["count"]
    return sorted(list(k) + [n] for k, n in out.items())


def layout_checks(rows: list[dict]) -> list[dict]:
    """Compare the analytic attention layout with the SDPA calls a trace recorded (one row per arch/impl)."""
    done = set()
    out = []
    for row in rows:
        calls = row.get("attn_calls")
        key = (row["arch"], row.get("impl", "diffusers"))
        if not calls or key in done or row["arch"] not in configs.CONFIGS:
            continue
        done.add(key)
        traced = sorted(list(c) for c in calls)
        expected = expected_calls(row["arch"], row_tokens(row), row["batch"])
        out.append(dict(arch=key[0], impl=key[1], tokens=row_tokens(row), batch=row["batch"],
                        matches=traced == expected, traced=traced, expected=expected, source=row["_src"]))
    return out


def collect_versions(rows: list[dict], assumed: dict) -> dict:
    seen: dict[str, set] = defaultdict(set)
    for row in rows:
        for k, v in (row.get("versions") or {}).items():
            seen[k].add(v)
    versions = {k: ", ".join(sorted(v)) for k, v in seen.items()}
    for k, v in assumed.items():
        versions.setdefault(k, v)
    return versions


def _repo_relative(path: str) -> str:
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    full = os.path.abspath(path)
    return os.path.relpath(full, repo) if full.startswith(repo + os.sep) else path


def build(paths: list[str], assumed_versions: dict, generated_by: str) -> dict:
    rows = load_rows(paths)
    if not rows:
        raise SystemExit("no usable rows in " + ", ".join(paths))
    acts = fit_activations(rows)
    layouts = {arch: configs.attention_layout(arch) for arch in configs.CONFIGS}
    impls = sorted({r.get("impl", "diffusers") for r in rows})
    return {
        "format": 1,
        "generated_by": generated_by,
        "generated_at": _dt.date.today().isoformat(),
        "method": (
            "Each row is one LoRA training step of the real model architecture (diffusers classes, or the "
            "pinned sd-scripts classes where impl='sd-scripts') run on fake/meta tensors under a "
            "TorchDispatchMode that tracks every storage's lifetime; act = peak live bytes minus base and LoRA "
            "weights, i.e. what torch.cuda.max_memory_allocated() would add on top of the weights. 'amp' = bf16 "
            "base, fp32 LoRA, CUDA autocast policy emulated on CPU autocast; 'bf16' = everything bf16, no "
            "autocast (full_bf16). Flash attention = the CPU flash SDPA kernel, which saves what CUDA "
            "flash/xformers save. Lines are least-squares fits over all traced sizes and batches."
        ),
        "versions": collect_versions(rows, assumed_versions),
        "inputs": [_repo_relative(p) for p in paths],
        "implementations": impls,
        "impl_preference": dict(IMPL_PREFERENCE),
        "token_units": dict(configs.TOKEN_UNITS),
        "activation_units": "act_gib = mib_per_token * tokens * batch / 1024 + intercept_gib",
        "activations": acts,
        "attention_math_extra": {
            "note": (
                "Plain attention (no xformers/sdpa/mem_eff_attn) saves the fp32 softmax probabilities of every "
                "call for backward.  Per call: L2 = batch*heads*Lq*Lk*4 bytes; qkv = batch*heads*(Lq+2*Lk)*head_dim*4. "
                "Lq = q_frac*tokens; Lk = kv_frac*tokens or kv_fixed (CLIP tokens for cross-attention). "
                "Add the extra to the flash activation line of the same config. Constants fitted on bf16 "
                "(no autocast) diffusers traces; applied as-is to amp."
            ),
            "layouts": layouts,
            **fit_math_attention(rows),
            "layout_checks": layout_checks(rows),
        },
        "architectures": architectures(rows),
        "optimizer_checks": optimizer_checks(rows),
        "allocator_checks": allocator_checks(rows),
        "network_activations": {
            "note": ("What a network module adds to the activations of the family's LoRA traced at the same size "
                     "(network_traces.py): LyCORIS algorithms (network 'lycoris.kohya', by algo) and sd-scripts' "
                     "networks.oft. extra_gib = mib_per_token * tokens * batch / 1024 + intercept_gib; one traced size "
                     "gives a constant (where two were traced the extra hardly grows with the tokens)."),
            "lines": fit_networks(rows),
        },
        "lora_rank_activations": {
            "note": ("What the family's own LoRA module adds to the activations above the rank the activation "
                     "lines were traced at, without checkpointing (rank_traces.py: one size at two ranks, peak at the "
                     "end of the forward): autocast's 16-bit copies of the fp32 LoRA weights, saved for backward, and "
                     "each layer's down-projection output. extra_gib = weight_copy_bytes_per_param * (lora_params - "
                     "lora_params at activation_lines_rank) / 2**30 + (rank - activation_lines_rank) * "
                     "mib_per_token_per_rank * tokens * batch / 1024."),
            **fit_ranks(rows),
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="results JSONL files written by run_trace.py / regenerate.py")
    ap.add_argument("--out", default="kohya_tuner/data/memory_coefficients.json")
    ap.add_argument("--assume-version", action="append", default=[], metavar="PKG=VER",
                    help="version to record when the rows themselves do not say (older result files)")
    ap.add_argument("--generated-by", default=None, help="command line to record as the regenerating command")
    args = ap.parse_args(argv)
    assumed = dict(kv.split("=", 1) for kv in args.assume_version)
    gen = args.generated_by or "python tools/memtrace/fit_coefficients.py " + " ".join(sys.argv[1:])
    data = build(args.inputs, assumed, gen)
    text = json.dumps(data, indent=1, sort_keys=False) + "\n"
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, args.out)
    print(f"wrote {args.out}: {len(data['activations'])} activation lines from {len(args.inputs)} file(s)")
    for a in data["activations"]:
        print(f"  {a['arch']:5} {a['impl']:10} {a['precision']:4} ckpt={int(a['ckpt'])} fp8={int(a['fp8'])} "
              f"offload={int(a.get('cpu_offload_checkpointing', False))} {a['mib_per_token']:9.4f} MiB/token + {a['intercept_gib']:7.3f} GiB  "
              f"(n={a['n_points']}, max rel residual {a['max_rel_residual']:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
