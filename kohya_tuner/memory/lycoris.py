"""Trainable parameters of a LyCORIS network (`network_module = "lycoris.kohya"`), per algorithm.

The layers LyCORIS' default preset wraps in each family are listed in `data/lycoris_targets.json`
(tools/memtrace/lycoris_targets.py, from the models on the meta device). Each algorithm's size per
wrapped layer follows from its published structure, for a layer in -> out with a k x k kernel
(k = 1 for a Linear); r is network_dim for Linears and 1x1 convs, conv_dim (default network_dim) for
larger kernels:

* lora / locon / dylora: a down (in*k*k -> r) and an up (r -> out) projection: r*(in*k^2 + out);
  with a Tucker core (use_tucker / use_cp) for k > 1: r*in + r^2*k^2 + r*out.
* loha: the Hadamard product of two such low-rank pairs: 2*r*(in*k^2 + out) (Tucker: 2*(r^2*k^2 +
  r*in + r*out)).
* lokr: the Kronecker product of w1 (out_l x in_m) and w2 (out_k x in_n*k^2), where out = out_l*out_k
  and in = in_m*in_n are split by `factor` (default -1: the divisor pair with the smallest sum, the
  smaller one first). w2 is itself a rank-r pair (r*out_k + r*in_n*k^2) unless r >= max(out_k, in_n)/2
  or full_matrix; w1 is a pair only with decompose_both (and r < max(out_l, in_m)/2).
* glora: W*A + B with A a rank-r pair in -> r -> in and B a pair in -> r -> out: r*(3*in + out) for a
  Linear; a k x k conv has its kernel in B's first projection: r*(2*in + in*k^2 + out) (Tucker: B's
  first projection 1x1 plus an r x r x k x k core).
* diag-oft: a block-diagonal rotation of the output features, block_num blocks of block_size^2 where
  (block_size, block_num) = factorization(out, r): out*block_size.
* boft: log2(n)+1 butterfly stages of n blocks of b x b, with b the largest even block size <= r such
  that n = out/b is a power of two: (log2(n)+1)*out*b; a width with no such b makes LyCORIS refuse the
  layer (ValueError).
* diag-oft / boft with `rescaled` add one scale per output feature.
* ia3: one learned scale per output feature: out.
* full: the wrapped weights themselves: in*out*k^2 (+ out for a bias).
* dora_wd adds one magnitude per output feature.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

_DATA = Path(__file__).resolve().parent.parent / "data" / "lycoris_targets.json"

ALGOS = ("lora", "locon", "loha", "lokr", "ia3", "dylora", "glora", "diag-oft", "boft", "full")


@lru_cache(maxsize=None)
def targets() -> dict[str, Any]:
    with open(_DATA, encoding="utf-8") as fh:
        return json.load(fh)


def factorization(dimension: int, factor: int = -1) -> tuple[int, int]:
    """(m, n) with m * n = dimension and m <= n: m = factor when it divides, else the divisor
    pair with the smallest sum whose smaller member does not exceed factor (any, for -1)."""
    if factor > 0 and dimension % factor == 0:
        m, n = factor, dimension // factor
        return (n, m) if m > n else (m, n)
    limit = dimension if factor < 0 else factor
    m, n = 1, dimension
    while m < n:
        cand = m + 1
        while dimension % cand:
            cand += 1
        if cand + dimension // cand > m + n or cand > limit:
            break
        m, n = cand, dimension // cand
    return (n, m) if m > n else (m, n)


def butterfly(dimension: int, factor: int) -> tuple[int, int]:
    """BOFT's (block size b, block count n): b the largest even divisor <= factor (any, for -1)
    whose cofactor n is a power of two; (0, 0) when there is none (LyCORIS refuses the layer)."""
    limit = dimension if factor < 0 else factor
    best = (0, 0)
    for b in range(2, min(limit, dimension) + 1, 2):
        if dimension % b == 0:
            n = dimension // b
            if n & (n - 1) == 0:
                best = (b, n)
    return best


class Refused(ValueError):
    """LyCORIS cannot build this algorithm on a wrapped width (the run stops at network creation)."""


@dataclass(frozen=True)
class Options:
    algo: str = "lora"
    rank: int = 4
    conv_rank: int = 4
    factor: int = -1
    tucker: bool = False
    decompose_both: bool = False
    full_matrix: bool = False
    dora: bool = False
    rescaled: bool = False


def layer_params(n_in: int, n_out: int, k: int, o: Options) -> int:
    r = o.rank if k == 1 else o.conv_rank
    if r <= 0 and o.algo not in ("ia3", "full"):
        return 0
    kk = k * k
    tucker = o.tucker and k > 1
    if o.algo in ("lora", "locon", "dylora"):
        n = r * n_in + r * r * kk + r * n_out if tucker else r * (n_in * kk + n_out)
    elif o.algo == "loha":
        n = 2 * (r * r * kk + r * n_in + r * n_out) if tucker else 2 * r * (n_in * kk + n_out)
    elif o.algo == "lokr":
        out_l, out_k = factorization(n_out, o.factor)
        in_m, in_n = factorization(n_in, o.factor)
        if o.decompose_both and r < max(out_l, in_m) / 2 and not o.full_matrix:
            w1 = r * (out_l + in_m)
        else:
            w1 = out_l * in_m
        if r >= max(out_k, in_n) / 2 or o.full_matrix:
            w2 = out_k * in_n * kk
        elif tucker:
            w2 = r * out_k + r * in_n + r * r * kk
        else:
            w2 = r * out_k + r * in_n * kk
        n = w1 + w2
    elif o.algo == "glora":
        if k == 1:
            n = r * (3 * n_in + n_out)
        elif tucker:
            n = r * (3 * n_in + n_out) + r * r * kk
        else:
            n = r * (2 * n_in + n_in * kk + n_out)
    elif o.algo == "diag-oft":
        block_size, _num = factorization(n_out, r)
        n = n_out * block_size + (n_out if o.rescaled else 0)
    elif o.algo == "boft":
        b, blocks = butterfly(n_out, r)
        if not b:
            raise Refused(f"BOFT cannot split a width of {n_out} into an even block size of at most {r} "
                          f"times a power of two")
        n = (blocks.bit_length()) * n_out * b + (n_out if o.rescaled else 0)
    elif o.algo == "ia3":
        n = n_out
    elif o.algo == "full":
        n = n_in * n_out * kk + n_out
    else:
        n = r * (n_in * kk + n_out)
    return n + (n_out if o.dora and o.algo not in ("ia3", "full", "diag-oft", "boft") else 0)


def _bool(v: str | None) -> bool:
    return str(v).strip().lower() in ("true", "1", "yes")


def _int(v: str | None, default: int) -> int:
    try:
        return int(float(v)) if v is not None else default
    except (TypeError, ValueError):
        return default


def options(rank: int, net_args: dict[str, str]) -> Options:
    algo = (net_args.get("algo") or "lora").strip().lower()
    return Options(
        algo=algo, rank=rank, conv_rank=_int(net_args.get("conv_dim"), rank) or rank,
        factor=_int(net_args.get("factor"), -1),
        tucker=any(_bool(net_args.get(k)) for k in ("use_tucker", "use_cp", "use_conv_cp"))
        or (net_args.get("disable_conv_cp") is not None and not _bool(net_args.get("disable_conv_cp"))),
        decompose_both=_bool(net_args.get("decompose_both")),
        full_matrix=_bool(net_args.get("full_matrix")) or (algo == "lokr" and rank >= 10000),
        dora=_bool(net_args.get("dora_wd")),
        rescaled=_bool(net_args.get("rescaled")),
    )


@dataclass
class Count:
    by_component: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    known: bool = True
    # Layer widths the algo cannot build at this rank (BOFT's butterfly blocks): LyCORIS stops there.
    refused: tuple[int, ...] = ()

    @property
    def total(self) -> int:
        return sum(self.by_component.values())


def _args(config: dict[str, Any]) -> dict[str, str]:
    return dict(str(a).split("=", 1) for a in config.get("network_args") or [] if "=" in str(a))


def is_boft(config: dict[str, Any]) -> bool:
    """LyCORIS BOFT: its network_dim must split every layer width it trains."""
    return (config.get("network_module") == "lycoris.kohya"
            and str(_args(config).get("algo", "")).strip().lower() == "boft")


def unsplittable(family_name: str, config: dict[str, Any]) -> tuple[int, ...]:
    """The layer widths a config's LyCORIS BOFT cannot split at its network_dim (LyCORIS stops there);
    () for any other network, or where the family's layers are not known."""
    if not is_boft(config):
        return ()
    args = _args(config)
    try:
        rank = max(1, int(config.get("network_dim") or 4))
    except (TypeError, ValueError):
        return ()
    got = count(family_name, rank, args, train_unet=not config.get("network_train_text_encoder_only"),
                train_te=not config.get("network_train_unet_only"))
    return got.refused if got.known else ()


def count(family_name: str, rank: int, net_args: dict[str, str], *, train_unet: bool,
          train_te: bool) -> Count:
    """LyCORIS' trainable parameters for a family, or known=False when the family's layers
    are not in lycoris_targets.json."""
    arch = targets()["archs"].get(family_name)
    out = Count()
    if arch is None or not arch.get("unet"):
        out.known = False
        return out
    o = options(rank, net_args)
    if o.algo not in ALGOS:
        out.notes.append(f"LyCORIS algo {o.algo!r} is not modelled; counted as LoCon of the same ranks")
        o = Options("locon", o.rank, o.conv_rank)
    if net_args.get("preset") not in (None, "full"):
        out.notes.append(f"LyCORIS preset {net_args.get('preset')!r} is not modelled; counted with the default "
                         f"preset's layers (full)")
    refused: set[int] = set()

    def rows(part: str) -> int:
        total = 0
        for a, b, k, n, _kind in arch[part]:
            try:
                total += layer_params(a, b, k, o) * n
            except Refused:
                refused.add(b)
        return total

    if train_unet:
        out.by_component["denoiser"] = rows("unet")
    if train_te and arch.get("text_encoder"):
        out.by_component["text_encoders"] = rows("text_encoder")
    out.refused = tuple(sorted(refused))
    if refused:
        out.notes.append(f"LyCORIS {o.algo} at rank {o.rank} cannot split the width(s) "
                         f"{', '.join(map(str, sorted(refused)))} into an even block size of at most the rank times a "
                         f"power of two: the trainer stops when it builds the network (a larger network_dim may work); "
                         f"those layers are not counted")
    return out
