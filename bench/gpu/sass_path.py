"""SASS instructions one thread of a merge kernel issues on its blend path, from `cuobjdump -sass`
text: the static count says little for kernels with three row paths and slow-path subroutines.

Walk from the first instruction: a predicated EXIT and BRA.DIV (divergent-shuffle fallback) are not
taken; a conditional forward branch over a slow-path CALL (IEEE division's) is taken; any other
conditional branch is taken when the code it skips has no MUFU.EX2 or load and its target has
MUFU.EX2 somewhere after it (the blend), else not; an unconditional branch is taken; stop at the
first unpredicated EXIT. The lane that writes the lse is followed, as the warp issues its code.

Usage: python3 bench/gpu/sass_path.py KERNEL.sass ...
"""

import collections
import re
import sys


def parse(path):
    ins = []
    for line in open(path):
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    return ins


def blend_path(ins):
    at = {a: i for i, (a, _) in enumerate(ins)}
    i, ops = 0, collections.Counter()
    while i < len(ins) and sum(ops.values()) < 10000:
        a, text = ins[i]
        pred = re.match(r"@!?U?P[T0-9]\s+", text)
        body = text[pred.end():] if pred else text
        op = body.split()[0]
        ops[op.split(".")[0]] += 1
        if op == "EXIT" and not pred:
            break
        if op.startswith("BRA") and not op.startswith("BRA.DIV"):
            target = at[int(re.search(r"0x([0-9a-f]+)", body).group(1), 16)]
            if not pred:
                i = target
                continue
            skipped = [t for _, t in ins[i + 1:target]] if target > i else []
            if any("CALL" in t for t in skipped):
                i = target
                continue
            if target > i and not any("MUFU.EX2" in t or "LDG" in t for t in skipped) \
                    and any("MUFU.EX2" in t for _, t in ins[target:]):
                i = target
                continue
        i += 1
    return ops


for path in sys.argv[1:]:
    ins = parse(path)
    ops = blend_path(ins)
    name = path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    top = " ".join(f"{k}:{v}" for k, v in ops.most_common(8))
    print(f"{name:<50} static {len(ins):4d}  blend path {sum(ops.values()):4d}  ({top})")
