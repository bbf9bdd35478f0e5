#!/usr/bin/env python3
"""Checks that no file in tensor/ includes a header of a higher layer, and that no file outside
tensor/ includes one of tensor's internal headers. Tests and benchmarks may include anything.

  python3 tools/check_layers.py        # prints each violation; exit status 1 if any

The layers, bottom to top, are the folders of tensor/ (README.md, "Architecture").
"""
import os
import re
import sys

LAYERS = ["base", "runtime", "kernels", "cpu", "cuda", "core", "ops"]
# cpu and cuda are one level: backends never include each other.
RANK = {"base": 0, "runtime": 1, "kernels": 2, "cpu": 3, "cuda": 3, "core": 4, "ops": 5}
TOP = 6  # tensor/tensor.h, gradcheck, testing


def rank_of(path):
    parts = path.split("/")
    if len(parts) > 2 and parts[1] in RANK:
        return RANK[parts[1]]
    return TOP


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    os.chdir(root)
    problems = []
    for top, dirs, files in os.walk("."):
        dirs[:] = [d for d in dirs if not d.startswith((".", "bazel-")) and d != "third_party"]
        for name in files:
            if not name.endswith((".h", ".cc", ".cu")):
                continue
            path = os.path.normpath(os.path.join(top, name))
            is_test = name.endswith(("_test.cc", "_benchmark.cc", "_testing.h"))
            with open(path, encoding="utf-8", errors="replace") as f:
                for number, line in enumerate(f, 1):
                    m = re.match(r'\s*#include "(tensor/[^"]+)"', line)
                    if not m:
                        continue
                    header = m.group(1)
                    if not path.startswith("tensor/"):
                        if "/internal/" in header:
                            problems.append(f"{path}:{number}: includes {header}, internal to tensor/")
                        continue
                    if is_test:
                        continue
                    if rank_of(header) > rank_of(path):
                        problems.append(f"{path}:{number}: includes {header}, a higher layer")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
