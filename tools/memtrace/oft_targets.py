"""Derive kohya_tuner/data/oft_targets.json: the layers sd-scripts' OFT networks wrap
(`networks.oft` for the SD U-Nets, `networks.oft_flux` for FLUX) and their own trainable-parameter
counts, to check kohya_tuner.memory.oft's formula against.

The denoisers are sd-scripts' own classes on the meta device (lycoris_targets.denoiser); the OFT
networks are the pinned checkout's, imported at run time (nothing of them is copied here). Each
network is built per mode (attention only, `enable_all_linear`, `enable_conv`, both) and the layers
it wrapped are recorded as rows [in, out, kernel, count, splits]; then it is built again at several
`network_dim` values and its `oft_blocks` parameters are counted: `reference` in the output.

    $KOHYA/venv/bin/python tools/memtrace/oft_targets.py --sdscripts $KOHYA/sd-scripts \
        --out kohya_tuner/data/oft_targets.json
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

DIMS = (4, 8, 16, 32, 64, 128)
# network_args as sd-scripts passes them: strings. networks.oft turns each with bool(), so any value given
# (even "False") switches the option on; the modes below give "True".
MODES = {
    "attn": {},
    "all_linear": {"enable_all_linear": "True"},
    "conv": {"enable_conv": "True"},
    "all_linear_conv": {"enable_all_linear": "True", "enable_conv": "True"},
}
MODULES = {"sd15": "networks.oft", "sdxl": "networks.oft", "flux": "networks.oft_flux"}


def _shape(mod) -> tuple[int, int, int]:
    if mod.__class__.__name__.startswith("Conv"):
        k = mod.kernel_size[0] if isinstance(mod.kernel_size, tuple) else mod.kernel_size
        return mod.in_channels // mod.groups, mod.out_channels, int(k)
    return mod.in_features, mod.out_features, 1


def _rows(ofts) -> list[list]:
    counts: "OrderedDict[tuple, int]" = OrderedDict()
    for m in ofts:
        splits = tuple(getattr(m, "split_dims", None) or ())
        key = (*_shape(m.org_module[0]), splits)
        counts[key] = counts.get(key, 0) + 1
    return [[a, b, k, n, list(sp)] for (a, b, k, sp), n in counts.items()]


def _params(net) -> int:
    # The network keeps its modules in a plain list: count each module's own parameters.
    return sum(p.numel() for m in net.unet_ofts for p in m.parameters() if p.requires_grad)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdscripts", required=True)
    ap.add_argument("--out", default="kohya_tuner/data/oft_targets.json")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    import importlib

    import torch

    import lycoris_targets
    import sdscripts_import

    checkout = os.path.abspath(args.sdscripts)
    sdscripts_import.add_checkout(checkout)
    out = {"format": 1, "generated_by": "python tools/memtrace/oft_targets.py --sdscripts PATH_TO_SD_SCRIPTS",
           "rows": "[in, out, kernel, count, splits]: the layers each mode wraps; splits: the output slices "
                   "oft_flux gives their own blocks (empty: one)", "archs": {}}
    for arch, modname in MODULES.items():
        mod = importlib.import_module(modname)
        cls = mod.OFTNetwork
        # create_network extends the class's own target list in place (`+=`) when enable_conv is given:
        # restore the lists before each build so one mode does not leak into the next.
        saved = {k: list(v) for k, v in vars(cls).items() if k.endswith("_MODULE_ALL_LINEAR")
                 or k.endswith("_MODULE_ATTN_ONLY") or k.endswith("_CONV2D_3X3")}
        den = lycoris_targets.denoiser(arch, checkout)
        ent = {"module": modname, "modes": {}, "reference": {}}
        modes = MODES if arch != "flux" else {k: v for k, v in MODES.items() if "conv" not in k}
        for mode, kw in modes.items():
            ent["reference"][mode] = {}
            for dim in DIMS:
                for k, v in saved.items():
                    setattr(cls, k, list(v))
                try:
                    # On the meta device: at small dims the blocks add up to gigabytes (out^2 / dim each).
                    with torch.device("meta"):
                        net = mod.create_network(1.0, dim, 1e-3, None, [], den, **kw)
                except Exception as exc:  # a width the module refuses at this dim: said, not counted
                    ent["reference"][mode][str(dim)] = f"{type(exc).__name__}: {exc}"
                    continue
                if mode not in ent["modes"]:
                    ent["modes"][mode] = _rows(net.unet_ofts)
                ent["reference"][mode][str(dim)] = _params(net)
        for k, v in saved.items():
            setattr(cls, k, list(v))
        out["archs"][arch] = ent
        print(arch, {m: len(r) for m, r in ent["modes"].items()}, ent["reference"].get("attn"), flush=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
