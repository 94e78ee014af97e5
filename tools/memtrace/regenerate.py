"""Regenerate the shipped memory tables with one command: run the trace matrix, fit, write the JSON.

    python tools/memtrace/regenerate.py --sdscripts /path/to/sd-scripts \
        --out kohya_tuner/data/memory_coefficients.json

Each configuration runs in its own process (clean peak RSS, no state carried between traces) and
appends one JSON line to tools/memtrace/results/<group>.jsonl; the group's file is replaced only when
the whole group succeeded.  Then fit_coefficients.py fits every results file in the folder, and (with
--sdscripts) lora_targets.py rewrites kohya_tuner/data/lora_targets.json.

Groups (--groups, default: all that can run):
  diffusers_matrix  diffusers SD1.5 / SDXL / FLUX: 512/1024, amp and bf16, checkpointing on/off, flash and
                    math attention, FLUX fp8, token and batch scaling        (66 traces, ~20-40 min on 2 cores)
  diffusers_steps   two full steps with AdamW (steady state with optimizer states)   (6 traces)
  sdscripts_flux    the pinned sd-scripts FLUX model + networks.lora_flux: 512/768/1024, checkpointing
                    off/on/cpu_offload, fp8 base, batch 2, full_bf16, AdamW steps  (needs --sdscripts)
  sdscripts_families  the other sd-scripts families from their own classes and LoRA modules (SD 1.x/2.x and
                    SDXL U-Nets, SD3 / SD3.5 M / L, Chroma, Lumina 2, HunyuanImage-2.1, Anima): two sizes,
                    checkpointing off/on, batch 2, fp8 base                  (62 traces, needs --sdscripts)
  sdscripts_full    full fine-tunes of the SD 1.x and SDXL U-Nets and FLUX.1: two sizes, checkpointing off/on
                                                                             (10 traces, needs --sdscripts)
--quick runs a reduced version of each selected group (2 sizes, no scaling sweeps) into a scratch folder.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import fit_coefficients  # noqa: E402


def diffusers_matrix(quick: bool) -> list[list[str]]:
    runs = []
    sizes = [512, 1024]
    for arch in ("sd15", "sdxl", "flux"):
        for res in sizes:
            for ck in ([], ["--ckpt"]):
                runs.append(["--arch", arch, "--res", str(res), "--precision", "amp", *ck])
                runs.append(["--arch", arch, "--res", str(res), "--precision", "bf16", "--device", "meta", *ck])
                if not quick:
                    runs.append(["--arch", arch, "--res", str(res), "--precision", "bf16", "--attn", "math", *ck])
    for res in sizes:
        for ck in ([], ["--ckpt"]):
            runs.append(["--arch", "flux", "--res", str(res), "--fp8", "--precision", "amp", *ck])
            if not quick:
                runs.append(["--arch", "flux", "--res", str(res), "--fp8", "--precision", "bf16", *ck])
    if not quick:
        for res in (256, 768, 1536):
            for ck in ([], ["--ckpt"]):
                for arch in ("flux", "sdxl"):
                    runs.append(["--arch", arch, "--res", str(res), "--precision", "bf16", "--device", "meta", *ck])
        for b in ("2", "4"):
            for ck in ([], ["--ckpt"]):
                runs.append(["--arch", "flux", "--res", "512", "--batch", b, "--precision", "bf16", "--device", "meta", *ck])
                runs.append(["--arch", "sdxl", "--res", "1024", "--batch", b, "--precision", "bf16", "--device", "meta", *ck])
        for ck in ([], ["--ckpt"]):
            runs.append(["--arch", "flux", "--res", "512", "--t5", "256", "--precision", "bf16", "--device", "meta", *ck])
    return runs


def diffusers_steps(quick: bool) -> list[list[str]]:
    base = ["--precision", "amp", "--opt", "--steps", "2"]
    runs = [["--arch", "flux", "--res", "512", "--fp8", "--ckpt", *base],
            ["--arch", "sdxl", "--res", "1024", "--ckpt", *base],
            ["--arch", "sd15", "--res", "512", *base]]
    if not quick:
        runs += [["--arch", "flux", "--res", "1024", "--fp8", "--ckpt", *base],
                 ["--arch", "flux", "--res", "512", "--ckpt", *base],
                 ["--arch", "flux", "--res", "1024", "--ckpt", *base]]
    return runs


def sdscripts_flux(quick: bool) -> list[list[str]]:
    base = ["--arch", "flux", "--impl", "sd-scripts"]
    runs = []
    sizes = [512, 1024] if quick else [512, 768, 1024]
    for res in sizes:
        for ck in ([], ["--ckpt"], ["--cpu-offload-ckpt"]):
            for fp8 in ([], ["--fp8"]):
                if quick and not ck and fp8:
                    continue
                runs.append([*base, "--res", str(res), "--precision", "amp", *ck, *fp8])
    if not quick:
        for ck in ([], ["--ckpt"]):
            runs.append([*base, "--res", "512", "--batch", "2", "--precision", "amp", *ck])
            for res in ("512", "1024"):
                runs.append([*base, "--res", res, "--precision", "bf16", *ck])
        runs.append([*base, "--res", "1024", "--precision", "amp", "--ckpt", "--fp8", "--opt", "--steps", "2"])
    runs.append([*base, "--res", "512", "--precision", "amp", "--ckpt", "--fp8", "--opt", "--steps", "2"])
    return runs


# The other families sd-scripts trains, each from its own model class (tools/memtrace/models_sdscripts.py),
# and sd-scripts' own SD 1.x/2.x and SDXL U-Nets beside the diffusers ones.  Sizes: the family's
# native resolution and half of it (HunyuanImage-2.1 is a 2048 px model).
FAMILY_SIZES = {"sd15": (512, 768), "sd2": (512, 768), "sdxl": (512, 1024), "sd3": (512, 1024),
                "sd35m": (512, 1024), "sd35l": (512, 1024), "chroma": (512, 1024), "lumina2": (512, 1024),
                "hunyuan21": (1024, 2048), "anima": (512, 1024)}


def sdscripts_families(quick: bool) -> list[list[str]]:
    runs = []
    for arch, sizes in FAMILY_SIZES.items():
        base = ["--arch", arch, "--impl", "sd-scripts", "--precision", "amp"]
        for res in sizes[:1] if quick else sizes:
            for ck in ([], ["--ckpt"]):
                runs.append([*base, "--res", str(res), *ck])
        if not quick:
            runs.append([*base, "--res", str(sizes[0]), "--batch", "2", "--ckpt"])
            # Anima's trainer turns every fp8 option off (anima_train_network.py assert_extra_args).
            if arch not in ("sd15", "sd2", "sdxl", "anima"):
                runs.append([*base, "--res", str(sizes[1]), "--ckpt", "--fp8"])
                runs.append([*base, "--res", str(sizes[0]), "--ckpt", "--fp8"])
    return runs


def sdscripts_full(quick: bool) -> list[list[str]]:
    """Full fine-tunes (every weight trains, fp32 master weights) of the U-Nets and FLUX.1."""
    runs = []
    for arch, sizes, cks in (("sd15", (512, 768), ([], ["--ckpt"])), ("sdxl", (512, 1024), ([], ["--ckpt"])),
                             ("flux", (512, 1024), (["--ckpt"],))):
        for res in sizes[:1] if quick else sizes:
            for ck in cks:
                runs.append(["--arch", arch, "--impl", "sd-scripts", "--precision", "amp", "--full", "--res",
                             str(res), *ck])
    return runs


GROUPS = {"diffusers_matrix": diffusers_matrix, "diffusers_steps": diffusers_steps, "sdscripts_flux": sdscripts_flux,
          "sdscripts_families": sdscripts_families, "sdscripts_full": sdscripts_full}
NEEDS_SDSCRIPTS = {"sdscripts_flux", "sdscripts_families", "sdscripts_full"}


def run_one(python: str, argv: list[str], sdscripts: str | None, timeout: int) -> dict:
    cmd = [python, os.path.join(HERE, "run_trace.py"), *argv]
    if "--impl" in argv and sdscripts:
        cmd += ["--sdscripts", sdscripts]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"failed": " ".join(argv), "err": f"timeout after {timeout}s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"failed": " ".join(argv), "err": proc.stderr.strip().splitlines()[-3:]}
    return json.loads(lines[-1])


def run_group(name: str, runs: list[list[str]], args) -> tuple[str, int]:
    dest_dir = args.results_dir
    os.makedirs(dest_dir, exist_ok=True)
    dest = os.path.join(dest_dir, f"{name}.jsonl")
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda a: run_one(args.python, a, args.sdscripts, args.timeout), runs))
    failed = [r for r in results if "failed" in r]
    for r in results:
        tag = "ERR" if "failed" in r else "ok "
        desc = r.get("failed") or f'{r["arch"]} {r["impl"]} {r.get("mode", "lora")} {r["res"]} b{r["batch"]} {r["precision"]} ' \
            f'ckpt={int(r["ckpt"])} offload={int(r["cpu_offload_ckpt"])} fp8={int(r["fp8"])} {r["attn"]} ' \
            f'-> peak {r["peak_GiB"]} GiB, act {r["peak_minus_weights_GiB"]} ({r["wall_s"]} s)'
        print(f"  {tag} {desc}", flush=True)
        if "failed" in r:
            print(f"      {r['err']}", flush=True)
    if failed:
        print(f"{name}: {len(failed)} of {len(runs)} traces failed; {dest} left unchanged", flush=True)
        return dest, len(failed)
    tmp = dest + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        for r in results:
            fh.write(json.dumps(r) + "\n")
    os.replace(tmp, dest)
    print(f"{name}: {len(runs)} traces in {time.time() - t0:.0f} s -> {dest}", flush=True)
    return dest, 0


def _record_last_run(out: str, argv: list[str]) -> None:
    with open(out, encoding="utf-8") as fh:
        data = json.load(fh)
    shown = ["PATH_TO_SD_SCRIPTS" if i > 0 and argv[i - 1] == "--sdscripts" else a for i, a in enumerate(argv)]
    data["last_run"] = "python tools/memtrace/regenerate.py " + " ".join(shlex.quote(a) for a in shown)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", default=os.path.join(REPO, "kohya_tuner", "data", "memory_coefficients.json"))
    ap.add_argument("--lora-targets-out", default=os.path.join(REPO, "kohya_tuner", "data", "lora_targets.json"))
    ap.add_argument("--sdscripts", help="checkout of the pinned sd-scripts commit (enables the sd-scripts groups)")
    ap.add_argument("--groups", default=None, help="comma-separated groups to trace (default: all that can run)")
    ap.add_argument("--quick", action="store_true", help="reduced matrices, results in a scratch folder")
    ap.add_argument("--results-dir", default=None, help="where results JSONL live (default tools/memtrace/results)")
    ap.add_argument("--fit-only", action="store_true", help="skip tracing; refit the existing results")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="traces run in parallel (each needs ~0.5 GB RAM)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per trace")
    ap.add_argument("--python", default=sys.executable, help="interpreter with torch + diffusers (the 'trace' extra)")
    args = ap.parse_args(argv)

    if args.results_dir is None:
        args.results_dir = tempfile.mkdtemp(prefix="memtrace-quick-") if args.quick else os.path.join(HERE, "results")
    if args.sdscripts:
        args.sdscripts = os.path.abspath(args.sdscripts)
    groups = args.groups.split(",") if args.groups else [g for g in GROUPS if g not in NEEDS_SDSCRIPTS or args.sdscripts]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        ap.error(f"unknown group(s) {unknown}; choose from {sorted(GROUPS)}")
    if any(g in NEEDS_SDSCRIPTS for g in groups) and not args.sdscripts:
        ap.error("the sd-scripts groups need --sdscripts PATH")

    failures = 0
    if not args.fit_only:
        for g in groups:
            runs = GROUPS[g](args.quick)
            print(f"{g}: {len(runs)} traces", flush=True)
            failures += run_group(g, runs, args)[1]

    inputs = sorted(os.path.join(args.results_dir, f) for f in os.listdir(args.results_dir) if f.endswith(".jsonl"))
    if not inputs:
        print("no results to fit", file=sys.stderr)
        return 1
    rel = [os.path.relpath(p, REPO) if p.startswith(REPO) else p for p in inputs]
    # the canonical command that rebuilds the whole table; how this particular run was invoked goes beside it
    gen = ("python tools/memtrace/regenerate.py --sdscripts PATH_TO_SD_SCRIPTS_AT_PINNED_COMMIT "
           "--out kohya_tuner/data/memory_coefficients.json  (refit without tracing: "
           f"python tools/memtrace/fit_coefficients.py {' '.join(shlex.quote(p) for p in rel)})")
    fit_args = [*inputs, "--out", args.out, "--generated-by", gen,
                # result files written before rows carried versions were traced with these
                "--assume-version", "torch=2.13.0+cpu", "--assume-version", "diffusers=0.42.1"]
    fit_coefficients.main(fit_args)
    _record_last_run(args.out, argv if argv is not None else sys.argv[1:])
    if args.sdscripts and not args.quick:
        subprocess.run([args.python, os.path.join(HERE, "lora_targets.py"), "--sdscripts", args.sdscripts,
                        "--out", args.lora_targets_out, "--generated-by",
                        "python tools/memtrace/lora_targets.py --sdscripts PATH_TO_SD_SCRIPTS --out "
                        + os.path.relpath(args.lora_targets_out, REPO)], check=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
