#!/usr/bin/env python3
"""The structure's counts a review asks for, from the sources as they are:
  - TorchAccelerator's members by access (public / protected / private, and friends);
  - include arrows back up inside accelerate/torch/: a file (not the hub's own .cpp) that
    includes torch_accelerator.hpp while the hub includes it, or its header, directly or not;
  - files per folder under accelerate/.
  scripts/house_counts.py        (from the project root)
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HUB = "accelerate/torch/torch_accelerator.hpp"


def class_body(text, name):
    start = re.search(r"^class %s\b[^;{]*\{" % name, text, re.M)
    depth, i = 1, start.end()
    while depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[start.end():i - 1]


def members(body):
    """Declarations at the class's own depth, one per statement, by access."""
    counts = {"public": 0, "protected": 0, "private": 0, "friend": 0}
    access, depth, statement_open = "private", 0, False
    for raw in body.split("\n"):
        line = re.sub(r"//.*", "", raw).strip()
        if not line:
            continue
        if depth == 0:
            m = re.match(r"(public|protected|private):$", line)
            if m:
                access = m.group(1)
            elif not statement_open and not re.match(r"(template\b|requires\b)", line):
                counts["friend" if line.startswith("friend ") else access] += 1
                statement_open = True
        depth += line.count("{") - line.count("}")
        if depth == 0 and (line.endswith(";") or line.endswith("}")):
            statement_open = False
    return counts


def includes(path):
    with open(os.path.join(ROOT, path)) as f:
        return re.findall(r'^#include "([^"]+)"', f.read(), re.M)


def reachable(start):
    seen, todo = set(), [start]
    while todo:
        for inc in includes(todo.pop()):
            if inc not in seen and os.path.exists(os.path.join(ROOT, inc)):
                seen.add(inc)
                todo.append(inc)
    return seen


def main():
    with open(os.path.join(ROOT, HUB)) as f:
        counts = members(class_body(f.read(), "TorchAccelerator"))
    print("TorchAccelerator members: public %(public)d, protected %(protected)d, "
          "private %(private)d, friends %(friend)d" % counts)
    below = reachable(HUB)
    back = []
    for folder, _, files in os.walk(os.path.join(ROOT, "accelerate/torch")):
        for name in files:
            path = os.path.relpath(os.path.join(folder, name), ROOT)
            if path == HUB or name.startswith("torch_accelerator") or HUB not in includes(path):
                continue
            header = re.sub(r"\.cpp$", ".hpp", path)
            if path in below or header in below:
                back.append(path)
    back.sort()
    print("arrows back up in accelerate/torch/: %d %s" % (len(back), " ".join(back)))
    for folder, _, files in sorted(os.walk(os.path.join(ROOT, "accelerate"))):
        sources = [f for f in files if f.endswith((".hpp", ".cpp"))]
        if sources:
            print("%-40s %d files" % (os.path.relpath(folder, ROOT) + "/", len(sources)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
