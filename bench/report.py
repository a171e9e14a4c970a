"""Turn benchmark JSON into the tables and plot of docs/PERFORMANCE.md (runs anywhere; no GPU).

Usage: python3 bench/report.py PYTHON_BENCH.json RUST_BENCH.json OUT_DIR
Writes OUT_DIR/table.md, OUT_DIR/summary.md and OUT_DIR/pct_copy.png.
"""

import json
import statistics
import sys
from pathlib import Path

SHORT = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}


def main():
    py = json.loads(Path(sys.argv[1]).read_text())
    rust = json.loads(Path(sys.argv[2]).read_text())
    out = Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    rust_by = {(r["dtype"], r["T"], r["H"], r["D"], r["threshold"]): r for r in rust["rows"]}
    rows = py["rows"]

    lines = ["| dtype | T | H | D | threshold | MB moved | mla-gen µs | mla-gen GB/s | % of copy | "
             "Rust runtime GB/s | copy GB/s | PyTorch GB/s | Triton GB/s | × Triton |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        dt = SHORT[r["dtype"]]
        rr = rust_by.get((dt, r["T"], r["H"], r["D"], r["threshold"]))
        lines.append(
            f"| {dt} | {r['T']} | {r['H']} | {r['D']} | {r['threshold']} | {r['bytes'] / 1e6:.1f} | "
            f"{r['mla-gen_us']:.1f} | {r['mla-gen_gbs']:.0f} | {r['pct_copy']:.1f} | "
            f"{rr['gbs']:.0f} | " if rr else "| – | ")
        lines[-1] += (f"{r['copy_gbs']:.0f} | {r['torch_gbs']:.0f} | {r['triton_gbs']:.0f} | "
                      f"{r['x_triton']:.2f} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")

    big = [r for r in rows if r["bytes"] >= 256e6]
    d128 = [r for r in rows if r["D"] == 128 and 65536 <= r["T"] * r["H"] <= 524288]
    t4k = [r for r in rows if r["T"] >= 4096]
    by_d = {}
    for r in t4k:
        by_d.setdefault((SHORT[r["dtype"]], r["D"]), []).append(r["x_triton"])
    host = py["host_cost_us"]
    mg = host["mla-gen (Python drop-in)"]
    tr = host["triton baseline"]
    summary = [
        f"- ≥ 256 MB moved ({len(big)} shapes): % of copy min {min(r['pct_copy'] for r in big):.1f}, "
        f"median {statistics.median(r['pct_copy'] for r in big):.1f}, "
        f"{sum(r['pct_copy'] >= 95 for r in big)} of {len(big)} at ≥ 95%.",
        f"- D = 128 at 64K–512K rows ({len(d128)} shapes): % of copy min "
        f"{min(r['pct_copy'] for r in d128):.1f}.",
        "- × Triton at T ≥ 4096, min / max per (dtype, D): " + ", ".join(
            f"{dt} d{d} {min(v):.2f}/{max(v):.2f}" for (dt, d), v in sorted(by_d.items())) + ".",
        f"- Host cost per call: Rust runtime {rust['host_us_per_launch']:.2f} µs"
        + (f" (argument checks alone {rust['host_us_validation_only']:.2f} µs)"
           if "host_us_validation_only" in rust else "")
        + (f"; cuLaunchKernel alone, same kernel and arguments: {rust['host_us_bare_cu_launch_kernel']:.2f} µs"
           if "host_us_bare_cu_launch_kernel" in rust else "") + "; Python drop-in "
        f"{mg['min']:.1f} µs (median {mg['median']:.1f}); Triton baseline {tr['min']:.1f} µs "
        f"(median {tr['median']:.1f}); ratio {mg['min'] / tr['min']:.2f} (min), "
        f"{mg['median'] / tr['median']:.2f} (median).",
        f"- A new threshold value: drop-in {py['new_threshold_ms']['mla-gen'] * 1e3:.0f} µs per call "
        f"including a synchronize; Triton baseline {py['new_threshold_ms']['triton baseline']:.0f} ms "
        "(it compiles a kernel).",
    ]
    (out / "summary.md").write_text("\n".join(summary) + "\n")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for key, label, marker in (("mla-gen_gbs", "mla-gen (generated kernel)", "o"),
                               ("triton_gbs", "Triton baseline (constexpr threshold)", "s"),
                               ("torch_gbs", "PyTorch eager composite", "^")):
        xs = [r["bytes"] / 1e6 for r in rows]
        ys = [100 * r[key] / r["copy_gbs"] for r in rows]
        ax.scatter(xs, ys, s=12, marker=marker, label=label, alpha=0.7)
    ax.axhline(100, color="k", lw=0.8, ls="--", label="device-to-device copy of the same bytes")
    ax.set_xscale("log")
    ax.set_xlabel("bytes moved per call (MB)")
    ax.set_ylabel("% of copy bandwidth (same run)")
    ax.set_ylim(0, 115)
    ax.set_title(f"merge_attn_states on {py['device']} ({len(rows)} shapes, median of 100 launches, L2 flushed)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "pct_copy.png", dpi=110)


if __name__ == "__main__":
    main()
