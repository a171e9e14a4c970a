"""The twin table (issue #34, item 2): each class of kernel twin of the default spec against the
kernel the same call runs without it, at engine shapes, hot and cold L2. A class stays in the
default only where it wins >= 2%.

  class      the twin a call runs with it        without it (the folder that lacks the class)
  dense      `_dense` (general kernel's twin)   the general kernel (spec key `dense = false`)
  nothr      `*_dense_nothr*` (threshold = T)   the same twin without `_nothr`
  flat       `*_flat` (fewer heads than a block) the same twin without `_flat`
  size_rule  the rule's kernel at any size:     --no-size-rule DIR: the default spec generated with
             a `_below<rows>` range below its     `size_rule = false`, whose kernel has the schedule
             bound, the named kernel above        of tuned.toml's [[schedule]] at every size (not the
                                                  rule's largest); without it: the named kernel

"Without" folders are otherwise the default folder's manifest with the class's kernels taken out
of it and out of every `specializations` list (and, for size_rule, every `size_rule`), the same
images: what `dense = false` generates for the kernels that stay (checked: its general kernels'
images are the default's byte for byte); the `_nothr` and `_flat` twins have no spec key of their
own (src/gen/variant/twin.rs, spec/expand.rs `offered_twins`). Each call goes through the Python
package (mla_gen.merge_attn_states with MLA_GEN_KERNELS set to the folder), so the host picks the
twin as an engine's call would.

  python3 bench/twins.py cases --kernels DIR [--no-size-rule DIR] --out CASES.json   (no GPU: which
      calls each class's twin serves, by the package's own selection on CPU tensors, driver stubbed)
  python3 bench/twins.py run --kernels DIR [--no-size-rule DIR] --cases CASES.json --out OUTDIR
      [--cap S]   (GPU)

The twins are timed at bf16, D 128 and 576; the size rules at each kernel that has one (with
--no-size-rule; without it, where a range has a schedule other than its named kernel's), a
decode and a prefill shape each, where the two kernels' schedules differ. `cases` also lists the
ranges with their named kernel's schedule: the same code under another name.

`run` checks that each folder launches the kernel CASES.json names, and that the two outputs
agree (NaN-poisoned first: every element written), then times both and a copy of the same bytes
(kway_peers.time_all: cold = L2 flushed before each graph replay, hot = right after a producer
rewrote the inputs). Ratio = time without / time with (> 1: the twin is faster). Per class: the
median ratio hot and cold, the worst shape, the shapes it wins >= 2% and loses > 2%, and the
verdict: keep when a median (hot or cold) is >= 1.02 and neither is below 0.98, else drop. JSON:
OUTDIR/twins.json.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import mla_gen  # noqa: E402
from mla_gen import _cuda, _torch  # noqa: E402
from hot_l2 import Arena  # noqa: E402

# The variant key a class's kernels have true (rows_below: set), as the manifest writes it.
CLASSES = {"dense": "dense", "nothr": "all_context", "flat": "flat_rows", "size_rule": "rows_below"}
# The flags a general kernel carries while it still has twins of a kind (twin.rs `has_key`).
HAS_FLAGS = {"dense": "dense_specialization", "flat_rows": "flat_twins"}
WIN, LOSS = 1.02, 0.98
BF16 = torch.bfloat16
# Engine shapes: decode T 1-256, prefill 2K-32K tokens; H 8-128, and 1-4 (tensor-parallel shards)
# for the flat twins only, which serve no more heads than that; D 128 and 576; bf16 in, bf16 or FP8
# (per tensor) out; threshold below T (T // 2) or every token with context (None, as vLLM passes it).
GRID_T = (1, 16, 64, 256, 2048, 8192, 32768)
GRID_H = (1, 2, 4, 8, 16, 32, 64, 128)
FEW_HEADS = 8  # below this, only the flat class's cases
GRID_D = (128, 576)
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
MAX_BYTES = 2.5e9
PER_CLASS = 16
PER_SIZE_RULE = 40  # one a (dtype, D) x decode/prefill x threshold, at the default's 10 size rules


def has_class(variant, cls):
    value = variant.get(CLASSES[cls])
    return value is not None and value is not False


def without(manifest, cls):
    """The manifest without the class's kernels: out of the list, of every `specializations`, and
    for size_rule of every `size_rule`; a general kernel left with no twin of a kind loses the
    flag that says it has them."""
    m = copy.deepcopy(manifest)
    drop = {k["name"] for k in m["kernels"] if has_class(k["variant"], cls)}
    m["kernels"] = [k for k in m["kernels"] if k["name"] not in drop]
    by_name = {k["name"]: k for k in manifest["kernels"]}
    for k in m["kernels"]:
        launch = k["launch"]
        if cls == "size_rule" and launch.get("size_rule"):
            del launch["size_rule"]
            k["variant"]["size_rule"] = []
        kept = [s for s in launch.get("specializations", ()) if s not in drop]
        if "specializations" in launch:
            launch["specializations"] = kept
            if not kept:
                del launch["specializations"]
        for kind, flag in HAS_FLAGS.items():
            if k["variant"].get(flag) and not any(by_name[s]["variant"].get(kind) for s in kept):
                del k["variant"][flag]
    return m


def derived_folder(src, dst, manifest):
    """A kernel folder at `dst` with `manifest` and src's images (its kernels/ linked, not copied)."""
    dst.mkdir(parents=True, exist_ok=True)
    link = dst / "kernels"
    if not link.exists():
        link.symlink_to(Path(src, "kernels").resolve(), target_is_directory=True)
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def class_folders(src, root, no_size_rule=None):
    """{"with": src, cls: folder without cls} under `root`; size_rule's is `no_size_rule` where
    given (the spec generated with `size_rule = false`)."""
    manifest = json.loads(Path(src, "manifest.json").read_text())
    folders = {"with": Path(src).resolve()}
    for cls in CLASSES:
        folders[cls] = derived_folder(src, Path(root, f"without-{cls}"), without(manifest, cls)).resolve()
    if no_size_rule:
        folders["size_rule"] = Path(no_size_rule).resolve()
    return folders


@contextlib.contextmanager
def launched_names():
    """The names of the kernels launched inside the block, in order (plans forgotten first, so
    the first call of each layout goes through the full check and its choice)."""
    names = []
    original = _cuda.launch

    def record(launcher, values, gx, gy, stream):
        names.append(launcher.name)
        return original(launcher, values, gx, gy, stream)
    _torch._forget_plans_after_fork()
    _cuda.launch = record
    try:
        yield names
    finally:
        _cuda.launch = original
        _torch._forget_plans_after_fork()


def in_folder(folder, fn):
    def call():
        os.environ["MLA_GEN_KERNELS"] = str(folder)
        fn()
    return call


class PairCall:
    """One merge_attn_states call: prefix/suffix [T, H, D] (bf16, or `dtype`) and lse [H, T] (base
    e) in one arena (the producer rewrites them all), output in the inputs' dtype or FP8
    (per-tensor scale), and lse."""

    def __init__(self, T, H, D, out="same", thr="all", device="cuda", seed=0, dtype=BF16):
        self.T, self.H, self.D, self.out_kind, self.thr, self.dtype = T, H, D, out, thr, dtype
        f32 = torch.float32
        specs = [((T, H, D), dtype), ((H, T), f32), ((T, H, D), dtype), ((H, T), f32), ((1,), f32)]
        if device == "cuda":
            self.inputs = Arena(specs)
            self.prefix, self.plse, self.suffix, self.slse, self.scale = self.inputs.views
            g = torch.Generator(device="cuda").manual_seed(seed)
            for x in (self.prefix, self.suffix):
                x.uniform_(-4, 4, generator=g)
            for x in (self.plse, self.slse):
                x.uniform_(-10, 10, generator=g)
            self.scale.fill_(0.25)
            self.inputs.seal()
        else:  # selection only: nothing is read, pages never touched
            self.inputs = None
            self.prefix, self.plse, self.suffix, self.slse, self.scale = (
                torch.empty(s, dtype=d, device=device) for s, d in specs)
        out_dtype = dtype if out == "same" else torch.float8_e4m3fn
        self.out = torch.empty(T, H, D, dtype=out_dtype, device=device)
        self.out_lse = torch.empty(H, T, dtype=f32, device=device)
        self.threshold = None if thr == "all" else T // 2
        elem = self.prefix.element_size()
        self.nbytes = T * H * (2 * elem * D + self.out.element_size() * D + 3 * 4)

    def __call__(self):
        mla_gen.merge_attn_states(self.out, self.prefix, self.plse, self.suffix, self.slse, self.out_lse,
                                  self.threshold, None if self.out_kind == "same" else self.scale)

    def result(self, fn):
        """fn's output (as float32) and lse after NaN poison (all bits set: NaN in bf16, f16 and f32;
        0x7F in e4m3); ValueError where an element stays NaN."""
        poison = {1: (torch.uint8, 0x7F), 2: (torch.int16, -1), 4: (torch.int32, -1)}[self.out.element_size()]
        self.out.view(poison[0]).fill_(poison[1])
        self.out_lse.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        if torch.isnan(self.out.float()).any() or torch.isnan(self.out_lse).any():
            raise ValueError("an output element was not written (still NaN)")
        return self.out.float(), self.out_lse.clone()


def agree(a, b, fp8):
    """Why two results of one call differ beyond one rounding of the output, or None."""
    (x, xl), (y, yl) = a, b
    step = 0.125 if fp8 else 2.0 ** -7  # relative spacing of e4m3 / bf16 values (at most)
    err = ((x - y).abs() / (y.abs() * step + 1e-2)).max().item()
    lse_err = (xl - yl).abs().max().item()
    if err > 1 or lse_err > 1e-4:
        return f"outputs differ: {err:.3g} steps, lse by {lse_err:.3g}"
    return None


# ---- cases: which calls each class serves (no GPU) ----

def stub_cpu():
    """The package on CPU tensors with nothing loaded or launched (as python/tests/conftest.py's
    cpu_launch and bench/host_cost_stub.py do); launched_names still sees each launch."""
    from host_cost_stub import stub_driver
    stub_driver()


def candidates(pairs, outs=("same", "fp8")):
    for dtype, D in pairs:
        for out in outs:
            for thr in ("part", "all"):
                for T in GRID_T:
                    for H in GRID_H:
                        if T * H * D * 2 * 3 <= MAX_BYTES:
                            yield {"dtype": dtype, "T": T, "H": H, "D": D, "out": out, "thr": thr}


def size_rules(manifest):
    """The size rules: the (dtype, head size) of every kernel with one, of those with a range
    whose schedule differs from the named kernel's, and the names of the ranges with the named
    kernel's schedule (the same code under another name)."""
    by_name = {k["name"]: k for k in manifest["kernels"]}
    every, differ, same = set(), set(), []
    for k in manifest["kernels"]:
        for r in (k["launch"].get("size_rule") or {}).get("ranges", ()):
            pair = (k["variant"]["dtype"], k["variant"]["head_size"])
            every.add(pair)
            if by_name[r["kernel"]]["variant"]["schedule"] == k["variant"]["schedule"]:
                same.append(r["kernel"])
            else:
                differ.add(pair)
    return sorted(every), sorted(differ), same


def pick(cases, n):
    """Up to n cases spread over the buckets (dtype, D, output, decode/prefill, threshold): from each,
    the shapes at evenly spaced places of its list by rows (inner ones first, not the extremes)."""
    buckets = {}
    for c in sorted(cases, key=lambda c: (c["T"] * c["H"], c["T"])):
        buckets.setdefault((c["dtype"], c["D"], c["out"], c["T"] >= 2048, c["thr"]), []).append(c)
    per = -(-n // max(len(buckets), 1))
    spread = []
    for b in buckets.values():
        k = min(per, len(b))
        spread.append([b[round((i + 1) * (len(b) - 1) / (k + 1))] if k < len(b) else b[i] for i in range(k)])
    out = []
    for i in range(per):
        out += [s[i] for s in spread if i < len(s)]
    return out[:n]


def make_cases(args):
    stub_cpu()
    with tempfile.TemporaryDirectory() as tmp:
        folders = class_folders(args.kernels, tmp, args.no_size_rule)
        variants = {label: {k["name"]: k["variant"] for k in json.loads((f / "manifest.json").read_text())["kernels"]}
                    for label, f in folders.items()}
        variant = variants["with"]
        every, differ, identical = size_rules(json.loads(Path(args.kernels, "manifest.json").read_text()))
        print(f"size rules: {len(identical)} ranges have their named kernel's schedule (the same code under "
              "another name): " + ", ".join(identical))
        found = {cls: [] for cls in CLASSES}
        # The twins at bf16 D 128 and 576; the size rules at every kernel with one against the spec
        # without them (--no-size-rule: its kernel has a schedule of its own at every size), else
        # where a range has a schedule other than the named kernel's (the ranges taken out).
        grid = [(c, [cls for cls in CLASSES if cls != "size_rule"]) for c in candidates(("bf16", D) for D in GRID_D)]
        grid += [(c, ["size_rule"]) for c in candidates(every if args.no_size_rule else differ, ("same",))]
        for c, classes in grid:
            call = PairCall(c["T"], c["H"], c["D"], c["out"], c["thr"], device="cpu", dtype=DTYPES[c["dtype"]])
            runs = {}
            for label in ["with"] + classes:
                with launched_names() as names:
                    in_folder(folders[label], call)()
                runs[label] = names[0]
            for cls in classes:
                if c["H"] < FEW_HEADS and cls != "flat":
                    continue
                twin, other = runs["with"], runs[cls]
                # dense alone: the plain `_dense` twin (removing it removes every twin)
                alone = cls != "dense" or not any(has_class(variant[twin], k) for k in ("nothr", "flat"))
                if cls == "size_rule":  # where the two folders' kernels differ in code
                    serves = variant[twin]["schedule"] != variants[cls][other]["schedule"]
                else:
                    serves = has_class(variant[twin], cls) and other != twin and alone
                if serves:
                    found[cls].append(c | {"class": cls, "with": twin, "without": other})
    cases = []
    for cls, found_cls in found.items():
        chosen = pick(found_cls, args.per_class if cls != "size_rule" else args.per_size_rule)
        print(f"{cls}: {len(found_cls)} calls of the grid run a twin of the class; timing {len(chosen)}")
        cases += chosen
    Path(args.out).write_text(json.dumps({"kernels": str(args.kernels), "no_size_rule": args.no_size_rule,
                                          "identical_ranges": identical, "cases": cases}, indent=1))
    print(f"{len(cases)} cases -> {args.out}")
    if any(not v for v in found.values()):
        sys.exit("a class serves no call of the grid: " + ", ".join(c for c, v in found.items() if not v))


# ---- run: time each case (GPU) ----

def bench_case(case, folders, args):
    from kway_peers import time_beside_copy
    call = PairCall(case["T"], case["H"], case["D"], case["out"], case["thr"], dtype=DTYPES[case["dtype"]],
                    seed=case["T"] * 3 + case["H"] * 5 + case["D"])
    row = dict(case, bytes=call.nbytes, errors=[])
    impls, results = {}, {}
    for side, folder, want in (("with", folders["with"], case["with"]), ("without", folders[case["class"]],
                                                                         case["without"])):
        fn = in_folder(folder, call)
        call.inputs.producer()
        with launched_names() as names:
            results[side] = call.result(fn)
        if names != [want]:
            row["errors"].append(f"{side}: launched {names}, cases file says {want}")
        impls[side] = (fn, call.inputs.producer, None)
    problem = agree(results["with"], results["without"], case["out"] != "same")
    if problem:
        row["errors"].append(problem)
    if row["errors"]:
        return row
    row["us"] = time_beside_copy(impls, call.nbytes, args)
    row["ratio"] = {mode: row["us"]["without"][mode] / row["us"]["with"][mode] for mode in ("cold", "hot")}
    return row


def shape_of(r):
    return f"{r['dtype']} T={r['T']} H={r['H']} D={r['D']} {r['out']} thr={r['thr']}"


def verdict(label, rs):
    """One row of the table: medians, the worst shape, wins and losses, keep or drop."""
    if not rs:
        return {"class": label, "shapes": 0, "verdict": "unmeasured"}
    med = {m: statistics.median(r["ratio"][m] for r in rs) for m in ("cold", "hot")}
    worst = min(rs, key=lambda r: min(r["ratio"].values()))
    keep = max(med.values()) >= WIN and min(med.values()) >= LOSS
    return {"class": label, "shapes": len(rs), "median_hot": med["hot"], "median_cold": med["cold"],
            "worst": shape_of(worst), "worst_hot": worst["ratio"]["hot"], "worst_cold": worst["ratio"]["cold"],
            "wins": [shape_of(r) for r in rs if min(r["ratio"].values()) >= WIN],
            "losses": [shape_of(r) for r in rs if min(r["ratio"].values()) < LOSS],
            "verdict": "keep" if keep else "drop"}


def table(rows):
    """One row per class; then one per kernel with a size rule (each rule is its own to keep)."""
    timed = [r for r in rows if "ratio" in r]
    out = [verdict(cls, [r for r in timed if r["class"] == cls]) for cls in CLASSES]
    rules = sorted({(r["dtype"], r["D"]) for r in timed if r["class"] == "size_rule"})
    out += [verdict(f"size_rule {dt} d{D}", [r for r in timed if r["class"] == "size_rule" and (r["dtype"], r["D"])
                                             == (dt, D)]) for dt, D in rules]
    return out


def print_table(summary):
    print("\n| class | shapes | median hot | median cold | worst (hot / cold) | wins >= 2% | loses > 2% | verdict |")
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: | --- |")
    for s in summary:
        if not s["shapes"]:
            print(f"| {s['class']} | 0 | | | | | | unmeasured |")
            continue
        print(f"| {s['class']} | {s['shapes']} | {s['median_hot']:.3f} | {s['median_cold']:.3f} | {s['worst']} "
              f"({s['worst_hot']:.3f} / {s['worst_cold']:.3f}) | {len(s['wins'])} | {len(s['losses'])} | "
              f"{s['verdict']} |")
    print("(ratio = time without the class / time with it; keep: a median >= 1.02 and neither below 0.98)")


def interleaved(cases):
    """Cases in round-robin order of class, so a run stopped by --cap has every class."""
    by = {}
    for c in cases:
        by.setdefault(c["class"], []).append(c)
    lists = list(by.values())
    return [lists[j][i] for i in range(max(map(len, lists))) for j in range(len(lists)) if i < len(lists[j])]


def run(args):
    data = json.loads(Path(args.cases).read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prop = torch.cuda.get_device_properties(0)
    print(f"# {prop.name}, torch {torch.__version__}; twins of {args.kernels}", flush=True)
    rows, start = [], time.monotonic()
    identical = data.get("identical_ranges", [])

    def save():  # after every case: a run cut short by its timeout keeps what it measured
        failures = [f"{r['class']} {shape_of(r)}: {e}" for r in rows for e in r["errors"]]
        (out / "twins.json").write_text(json.dumps({"device": prop.name, "kernels": args.kernels, "rule": {
            "ratio": "time without / time with", "keep": f"a median >= {WIN} and neither below {LOSS}"},
            "summary": table(rows), "identical_ranges": identical, "failures": failures, "rows": rows}, indent=1))
        return failures
    with tempfile.TemporaryDirectory() as tmp:
        if (args.no_size_rule is None) != (data.get("no_size_rule") is None):
            sys.exit("give --no-size-rule to run exactly when `cases` had it")
        folders = class_folders(args.kernels, tmp, args.no_size_rule)
        for case in interleaved(data["cases"]):
            if time.monotonic() - start > args.cap:
                print(f"# --cap {args.cap:.0f} s reached: stopped before {case['class']} {shape_of(case)}")
                break
            try:
                row = bench_case(case, folders, args)
            except torch.cuda.OutOfMemoryError:
                row = dict(case, errors=["out of memory"])
            except (ValueError, LookupError, RuntimeError) as e:  # a refused call, a driver error
                row = dict(case, errors=[f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"])
            rows.append(row)
            torch.cuda.empty_cache()
            save()
            if "ratio" in row:
                us = row["us"]
                print(f"{case['class']:>9} {shape_of(row):<38} {row['bytes'] / 1e6:>8.1f}MB | " + " | ".join(
                    f"{m} with {us['with'][m]:8.2f}us without {us['without'][m]:8.2f}us copy {us['copy'][m]:8.2f}us "
                    f"x {row['ratio'][m]:.3f}" for m in ("cold", "hot")), flush=True)
            else:
                print(f"{case['class']:>9} {shape_of(row)}: " + "; ".join(row["errors"]), flush=True)
    print_table(table(rows))
    if identical:
        print(f"(size rules: {len(identical)} ranges have their named kernel's schedule, the same code: "
              + ", ".join(identical) + ")")
    failures = save()
    if failures:
        print(f"# {len(failures)} checks failed:", *failures[:20], sep="\n# ", file=sys.stderr)
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("cases", help="which calls each class serves (no GPU)")
    c.add_argument("--kernels", required=True, help="the default spec's folder (generate --arch sm_90)")
    c.add_argument("--per-class", type=int, default=PER_CLASS)
    c.add_argument("--per-size-rule", type=int, default=PER_SIZE_RULE)
    c.add_argument("--no-size-rule", metavar="DIR", help="the default spec generated with size_rule = false "
                   "(its same-dtype unmasked tables suffice): the size rules' 'without'; else the ranges are "
                   "taken out of the default's manifest")
    c.add_argument("--out", required=True)
    r = sub.add_parser("run", help="time the cases (GPU)")
    r.add_argument("--kernels", required=True)
    r.add_argument("--cases", required=True)
    r.add_argument("--no-size-rule", metavar="DIR", help="as given to `cases`")
    r.add_argument("--reps", type=int, default=20)
    r.add_argument("--graph-reps", type=int, default=10)
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--cap", type=float, default=1e9, help="seconds: stop starting cases after this")
    r.add_argument("--out", default=".")
    args = ap.parse_args()
    make_cases(args) if args.cmd == "cases" else run(args)


if __name__ == "__main__":
    main()
