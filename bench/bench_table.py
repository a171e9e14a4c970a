"""The benchmark table's text, without torch (bench.py prints it; python/tests checks it on any
machine): shape lists, the derived ratios, the header, one row, the summary lines, and the hot
mode's iterations per graph (hot_l2.py)."""

from __future__ import annotations


def iterations(nbytes):
    """Iterations per graph for an X moving `nbytes`: 20 for small X, fewer for large ones so that
    a replay stays near 0.5 ms (at least 2); the rule of `mla-gen bench` (graph_iterations)."""
    iteration_us = 2.0 * (nbytes / 3e6 + 2.0)
    return max(2, min(20, int(500.0 / iteration_us)))


def parse_shapes(text):
    """`bf16:613x16x128,f16:4096x16x128/2` -> [(T, H, D, dtype name, threshold_half)]; ValueError
    naming the item otherwise."""
    shapes = []
    for item in filter(None, (i.strip() for i in text.split(","))):
        try:
            dt, dims = item.split(":")
            half = dims.endswith("/2")
            T, H, D = (int(x) for x in dims.removesuffix("/2").split("x"))
            if dt not in ("bf16", "f16", "f32") or min(T, H, D) < 1:
                raise ValueError
        except ValueError:
            raise ValueError(f"shape `{item}`: write dtype:TxHxD or dtype:TxHxD/2 (dtype bf16, f16 or f32)") from None
        shapes.append((T, H, D, dt, half))
    if not shapes:
        raise ValueError("no shapes given")
    return shapes


def ratios(r):
    """The derived columns: % of copy and x Triton, per mode, where both sides were timed."""
    for pre in ("", "hot_"):
        if f"{pre}mla-gen_us" not in r:
            continue
        if f"{pre}copy_us" in r:
            r[f"{pre}pct_copy"] = 100 * r[f"{pre}copy_us"] / r[f"{pre}mla-gen_us"]
        if f"{pre}triton_us" in r:
            r[f"{pre}x_triton"] = r[f"{pre}triton_us"] / r[f"{pre}mla-gen_us"]


def _g(r, key, fmt):
    return format(r[key], fmt) if key in r else "-".rjust(int(fmt.lstrip(">").split(".")[0]))


def header(l2):
    head = f"{'dtype':>8} {'T':>6} {'H':>4} {'D':>4} {'thr':>4} {'MB':>8}"
    cold = (f" | {'mla-gen us':>10} {'GB/s':>6} {'%copy':>6} | {'copy GB/s':>9} | {'torch GB/s':>10} | "
            f"{'triton GB/s':>11} {'x triton':>8}")
    hot = f" || {'hot us':>8} {'%hotcopy':>8} {'hot copy us':>11} {'x triton':>8}"
    return head + (cold if l2 != "hot" else "") + (hot if l2 != "cold" else "")


def line(r, l2):
    """One table row: the cold columns as this script always printed them, then the hot ones."""
    out = (f"{r['dtype']:>8} {r['T']:>6} {r['H']:>4} {r['D']:>4} {r['threshold']:>4} "
           f"{r['bytes'] / 1e6:>8.1f}")
    if l2 != "hot":
        out += (f" | {_g(r, 'mla-gen_us', '>10.1f')} {_g(r, 'mla-gen_gbs', '>6.0f')} {_g(r, 'pct_copy', '>5.1f')}% | "
                f"{_g(r, 'copy_gbs', '>9.0f')} | {_g(r, 'torch_gbs', '>10.0f')} | {_g(r, 'triton_gbs', '>11.0f')} "
                f"{_g(r, 'x_triton', '>7.2f')}x")
    if l2 != "cold":
        out += (f" || {_g(r, 'hot_mla-gen_us', '>8.2f')} {_g(r, 'hot_pct_copy', '>7.1f')}% "
                f"{_g(r, 'hot_copy_us', '>11.2f')} {_g(r, 'hot_x_triton', '>7.2f')}x")
    return out


def summary(rows):
    """Cold % of copy at shapes moving >= 8 MB (target 95), hot % of hot copy."""
    lines = []
    big = sorted(((r["pct_copy"], r) for r in rows if "pct_copy" in r and r["bytes"] >= 8e6), key=lambda x: x[0])
    if big:
        ok = sum(p >= 95 for p, _ in big)
        p, r = big[0]
        lines.append(f"cold, shapes moving >= 8 MB ({len(big)}): % of copy min {p:.1f} ({r['dtype']} T={r['T']} "
                     f"H={r['H']} D={r['D']} thr={r['threshold']}), median {big[len(big) // 2][0]:.1f}; "
                     f"{ok} of {len(big)} >= 95%")
    hot = sorted(((r["hot_pct_copy"], r) for r in rows if "hot_pct_copy" in r), key=lambda x: x[0])
    if hot:
        p, r = hot[0]
        lines.append(f"hot ({len(hot)} shapes): % of hot copy min {p:.1f} ({r['dtype']} T={r['T']} H={r['H']} "
                     f"D={r['D']} thr={r['threshold']}), median {hot[len(hot) // 2][0]:.1f}, max {hot[-1][0]:.1f}")
    return lines
