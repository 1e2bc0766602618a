"""Whether a change kept each kernel's instructions: compare the PTX that `python -m kernels.compile_check --ptx
DIR` wrote before it and after it.

    python -m kernels.ptx BEFORE_DIR AFTER_DIR

Two builds of the same kernel differ in more than their instructions: the debug sections (line tables, the
source's path), the labels those point at, and the numbering of parameters, which moves when a kernel's arguments
are grouped differently. Those are left out. What is left is compared line for line ("same"), else by the count of
each instruction ("same instructions, another order": the scheduler or the register numbering moved), else the
counts that changed are listed.
"""

import argparse
import collections
import re
import sys
from pathlib import Path


def instructions(ptx: str) -> list[str]:
    """The lines of a kernel's code: no debug sections, location directives, comments, debug labels or
    parameter numbers."""
    out = []
    for line in ptx.splitlines():
        if line.strip().startswith(".section") and "debug" in line:
            break
        text = line.split("//")[0].strip()
        if not text or text.startswith((".loc", ".file")) or re.fullmatch(r"\$L__tmp\d+:", text):
            continue
        out.append(re.sub(r"_param_\d+", "_param_N", text))
    return out


def counts(lines: list[str]) -> collections.Counter:
    """How many times each opcode (with its type suffixes) appears, predicates aside."""
    ops = collections.Counter()
    for text in lines:
        if text.startswith((".", "$", "{", "}")) or text.endswith(":"):
            continue
        words = text.split()
        op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        ops[op.rstrip(";")] += 1
    return ops


def compare(before: str, after: str) -> str:
    """One kernel's PTX before and after: "same", "same instructions, another order", or what changed."""
    a, b = instructions(before), instructions(after)
    if a == b:
        return "same"
    ca, cb = counts(a), counts(b)
    if ca == cb:
        return "same instructions, another order"
    changed = [f"{op} {ca[op]} -> {cb[op]}" for op in sorted(ca.keys() | cb.keys()) if ca[op] != cb[op]]
    return "changed: " + ", ".join(changed)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    args = parser.parse_args()
    for folder in (args.before, args.after):
        if not folder.is_dir():
            sys.exit(f"{folder} is not a folder: give two folders written by `python -m kernels.compile_check --ptx`")
    tally = collections.Counter()
    for path in sorted(args.before.rglob("*.ptx")):
        name = path.relative_to(args.before)
        other = args.after / name
        verdict = compare(path.read_text(), other.read_text()) if other.exists() else "missing after"
        tally[verdict.split(":")[0]] += 1
        if verdict != "same":
            print(f"{name}: {verdict}")
    print("; ".join(f"{n} {verdict}" for verdict, n in tally.most_common()) or "no PTX in " + str(args.before))
    sys.exit(1 if tally.keys() - {"same", "same instructions, another order"} else 0)


if __name__ == "__main__":
    main()
