"""One LoRA training step (forward + MSE loss + backward [+ AdamW]) of a real architecture on fake or
meta tensors; prints one JSON line with the peak of live tensor bytes and its breakdown.

    python tools/memtrace/run_trace.py --arch flux --res 1024 --precision amp --ckpt
    python tools/memtrace/run_trace.py --arch flux --impl sd-scripts --sdscripts /path/to/sd-scripts \
        --res 1024 --precision amp --ckpt --cpu-offload-ckpt

Devices: "fake" (FakeTensorMode on cpu: SDPA takes the CPU flash kernel, CPU autocast runs, so "amp"
works) and "meta" (1.6-2x faster; SDPA rerouted to the same flash op; meta tensors skip autocast, so
only "bf16" precision is allowed there).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import sys
import time

t_start = time.time()
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
from tracer import LiveMem, SavedCounter, ShadowInts, install_attn_flag  # noqa: E402

t_import = time.time() - t_start
GiB = 2 ** 30


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", required=True, choices=["sd15", "sdxl", "flux", "sd2", "sd3", "sd35m", "sd35l", "chroma",
                                                      "lumina2", "hunyuan21", "anima"])
    ap.add_argument("--impl", choices=["diffusers", "sd-scripts"], default="diffusers")
    ap.add_argument("--sdscripts", help="sd-scripts checkout to import the model classes from (with --impl sd-scripts)")
    ap.add_argument("--res", type=int, default=512, help="square resolution in pixels")
    ap.add_argument("--res-w", type=int, default=None, help="width, for a non-square bucket (default: --res)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--ckpt", action="store_true", help="gradient checkpointing as the implementation does it")
    ap.add_argument("--cpu-offload-ckpt", action="store_true", help="sd-scripts' cpu_offload_checkpointing (FLUX)")
    ap.add_argument("--attn", choices=["flash", "math"], default="flash")
    ap.add_argument("--device", choices=["fake", "meta"], default="fake")
    ap.add_argument("--precision", choices=["bf16", "amp"], default="amp",
                    help="amp: bf16 base, fp32 LoRA, CUDA autocast policy emulated; bf16: everything bf16, no autocast")
    ap.add_argument("--fp8", action="store_true", help="fp8 base weights (as --fp8_base)")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--grads-apart", action="store_true",
                    help="count the LoRA's gradients apart from the activations (as --full does), for a peak in backward")
    ap.add_argument("--network", default=None,
                    help="network module in place of the family's LoRA (lycoris.kohya, networks.oft, networks.oft_flux); "
                         "sd-scripts classes only")
    ap.add_argument("--network-args", default="", help="its network_args, as key=value,key=value (e.g. algo=loha)")
    ap.add_argument("--opt", action="store_true", help="also run AdamW.step() on the LoRA parameters")
    ap.add_argument("--full", action="store_true",
                    help="a full fine-tune: every weight of the denoiser trains (fp32 master weights under amp), no LoRA")
    ap.add_argument("--steps", type=int, default=1, help="with --opt: training steps to trace (2 = steady state)")
    ap.add_argument("--allocator", action="store_true",
                    help="also replay the allocations through a model of the CUDA caching allocator (reserved peak)")
    ap.add_argument("--t5", type=int, default=None,
                    help="text tokens (FLUX/Chroma/SD3 T5, Lumina Gemma2, ...; default: the trainer's default length)")
    args = ap.parse_args(argv)
    if args.precision == "amp" and args.device == "meta":
        ap.error("meta tensors bypass autocast: --precision amp needs --device fake")
    if args.cpu_offload_ckpt:
        args.ckpt = True
    if args.impl == "diffusers" and args.arch not in ("sd15", "sdxl", "flux"):
        ap.error(f"{args.arch} is traced from sd-scripts' classes only: --impl sd-scripts")
    if args.t5 is None:
        import configs
        args.t5 = configs.TEXT_TOKENS.get(args.arch, 512)
    return args


def versions() -> dict:
    out = {"torch": torch.__version__}
    for name in ("diffusers", "transformers"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            pass
    return out


def main(argv=None) -> int:
    args = parse(argv)
    res_h, res_w = args.res, args.res_w or args.res
    if args.device == "fake":
        from torch._subclasses.fake_tensor import FakeTensorMode
        mode_ctx = FakeTensorMode(allow_non_fake_inputs=True)
        dev = "cpu"
    else:
        mode_ctx = contextlib.nullcontext()
        dev = "meta"

    timings = {"import_s": round(t_import, 2)}
    t0 = time.time()
    net_kw = dict(kv.split("=", 1) for kv in args.network_args.split(",") if kv)
    setup = models.build(args.arch, args.impl, args.rank, args.precision, args.fp8, args.sdscripts, full=args.full,
                         network=args.network, network_args=net_kw)
    timings["build_s"] = round(time.time() - t0, 2)
    sd_commit = None
    if args.impl == "sd-scripts":
        import sdscripts_import
        sd_commit = sdscripts_import.add_checkout(args.sdscripts)["commit"]

    # Real copies of masks and lengths, for the models that read them back (see ShadowInts).
    shadow_ctx = ShadowInts() if args.device == "fake" else contextlib.nullcontext()
    with mode_ctx, shadow_ctx:
        if args.device == "fake":
            for m in setup.modules:
                m.to_empty(device="cpu")
        tracker = LiveMem(log_events=args.allocator)
        if args.ckpt:
            setup.enable_ckpt(args.cpu_offload_ckpt)
            if args.cpu_offload_ckpt and setup.offload_hooks:
                setup.offload_hooks(tracker)
        inputs = setup.make_inputs(res_h, res_w, args.batch, dev, t5_tokens=args.t5, ckpt=args.ckpt)

        weights = list(setup.parameters()) + list(setup.buffers())
        for p in setup.parameters():
            tracker.track(p, "param_lora" if p.requires_grad else "param_base")
        for b in setup.buffers():
            tracker.track(b, "param_base")
        for t in torch.utils._pytree.tree_flatten(inputs)[0]:
            tracker.track(t, "input")
        if args.full or args.grads_apart:
            # Gradients are what a full fine-tune adds besides activations (and the estimate counts a LoRA's
            # gradients on their own): count them apart.
            for p in setup.parameters():
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(lambda q: tracker.recategorize(q.grad, "grad"))
        attn_calls: list = []
        install_attn_flag(tracker, flash_on_meta=(args.device == "meta" and args.attn == "flash"), calls=attn_calls)
        saved = SavedCounter(weights, tracker)

        from torch.nn.attention import SDPBackend, sdpa_kernel
        attn_ctx = sdpa_kernel([SDPBackend.MATH]) if args.attn == "math" else contextlib.nullcontext()
        amp_ctx = contextlib.nullcontext()
        fp32_ops = contextlib.nullcontext()
        if args.precision == "amp":
            from cuda_amp import CudaAutocastFp32Ops
            amp_ctx = torch.autocast("cpu", dtype=torch.bfloat16)
            fp32_ops = CudaAutocastFp32Ops()

        t0 = time.time()
        t_fwd = t_bwd = t_opt = 0.0
        # the fp32-op emulation stays on through backward: checkpoint recomputation re-enters autocast
        with tracker, attn_ctx, fp32_ops:
            tracker.phase = "fwd"
            with saved.hooks(), amp_ctx:
                out = setup.forward(inputs)
                target = torch.randn_like(out, dtype=torch.float32)
                loss = F.mse_loss(out.float(), target)
            t_fwd = time.time() - t0
            live_after_fwd = tracker.live
            tracker.phase = "bwd"
            loss.backward()
            del out, loss, target
            t_bwd = time.time() - t0 - t_fwd
            live_after_bwd = tracker.live
            if args.opt:
                tracker.phase = "opt"
                t1 = time.time()
                opt = torch.optim.AdamW([p for p in setup.parameters() if p.requires_grad], lr=1e-4)
                opt.step()
                t_opt = time.time() - t1
                for step in range(2, args.steps + 1):
                    opt.zero_grad(set_to_none=True)
                    tracker.phase = f"fwd{step}"
                    with amp_ctx:
                        out = setup.forward(inputs)
                        loss = F.mse_loss(out.float(), torch.randn_like(out, dtype=torch.float32))
                    tracker.phase = f"bwd{step}"
                    loss.backward()
                    del out, loss
                    tracker.phase = f"opt{step}"
                    opt.step()
        timings.update(fwd_s=round(t_fwd, 2), bwd_s=round(t_bwd, 2), opt_s=round(t_opt, 2),
                       trace_total_s=round(time.time() - t0, 2))

    pb = tracker.peak_snapshot.get("by_cat", {})
    res = dict(
        arch=args.arch, impl=args.impl, res=res_h, res_w=res_w, batch=args.batch, ckpt=args.ckpt,
        cpu_offload_ckpt=args.cpu_offload_ckpt, attn=args.attn, device=args.device, precision=args.precision,
        fp8=args.fp8, rank=args.rank, t5tokens=args.t5, steps=args.steps if args.opt else 1,
        optimizer="AdamW" if args.opt else None,
        versions=versions() | ({"sd-scripts": sd_commit} if sd_commit else {}),
        notes=setup.notes,
        n_params=setup.n_params, lora_modules=setup.lora_modules, lora_params=setup.lora_params,
        weights_GiB=round(sum(p.untyped_storage().nbytes() for p in setup.parameters()) / GiB, 3),
        saved_GiB=round(saved.bytes / GiB, 3),
        saved_by_dtype={k: round(v / GiB, 3) for k, v in saved.by_dtype.items()},
        live_after_fwd_GiB=round(live_after_fwd / GiB, 3),
        live_after_bwd_GiB=round(live_after_bwd / GiB, 3),
        host_offloaded_GiB=round(tracker.host_bytes / GiB, 3),
        peak_GiB=round(tracker.peak / GiB, 3),
        peak_rounded512_GiB=round(tracker.peak_rounded / GiB, 3),
        peak_phase=tracker.peak_snapshot.get("phase"),
        peak_by_cat={k: round(v / GiB, 3) for k, v in pb.items() if v},
        phase_peak_GiB={k: round(v / GiB, 3) for k, v in tracker.phase_peak.items()},
        peak_minus_weights_GiB=round((tracker.peak - pb.get("param_base", 0) - pb.get("param_lora", 0)
                                      - pb.get("grad", 0)) / GiB, 3),
        grads_at_peak_GiB=round(pb.get("grad", 0) / GiB, 3),
        act_without_grads_peak_GiB=round((tracker.peak_nograd - pb.get("param_base", 0) - pb.get("param_lora", 0))
                                         / GiB, 3),
        mode="full" if args.full else "lora",
        attn_calls=sorted({c: attn_calls.count(c) for c in set(attn_calls)}.items()),
        n_ops=tracker.n_ops, n_allocs=tracker.n_allocs,
        top_alloc_ops={k: round(v / GiB, 2) for k, v in tracker.op_alloc_bytes.most_common(8)},
        timings=timings,
        wall_s=round(time.time() - t_start, 2),
        maxrss_MiB=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    )
    res["attn_calls"] = [list(k) + [n] for k, n in res["attn_calls"]]
    if tracker.events is not None:
        import allocsim
        sim = allocsim.replay(tracker.events)
        res["allocator"] = {k: round(v / GiB, 3) for k, v in sim.items()}
        res["allocator"]["n_events"] = len(tracker.events)
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
