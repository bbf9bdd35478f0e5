#!/usr/bin/env python3
"""Reads the cases behind Bazel's per-target test summary, so "PASSED" means a case ran.

A gtest target whose every case called GTEST_SKIP (the CUDA tests on a machine without a GPU)
exits 0, and Bazel reports it PASSED. This script reads each summary line on stdin
(`//tensor/cuda:cuda_elementwise_test   PASSED in 2.0s`), finds the target's test.xml files under
the test-log folder (bazel-testlogs/<package>/<name>/[shard_*/]test.xml) and writes the line
back, with PASSED turned into SKIPPED when no case of the target ran. On stderr it names every
target that skipped all or some of its cases, with gtest's reason.

  bazel test //... 2>&1 | grep -E '^//' | python3 tools/testing/test_cases.py bazel-testlogs
  # //tensor/cuda:cuda_elementwise_test  SKIPPED (all 20 cases skipped) in 2.0s
  # stderr: //tensor/cuda:cuda_elementwise_test: 20 of 20 cases skipped: no usable CUDA device...

--require-run: exit 1 when any case of the given targets skipped (for steps where every case
must run, such as the CUDA simulator's).
"""

import argparse
import glob
import os
import re
import sys
import xml.etree.ElementTree as ET

SUMMARY = re.compile(r"^(?P<label>(//|@)[^ ]+)(?P<mid> +(\(cached\) +)?)(?P<status>PASSED|FLAKY)\b")


def cases_of(testlogs, label):
    """(cases, skipped, first skip reason) over the target's test.xml files, or None."""
    if label.startswith("@"):
        return None
    package, _, name = label[2:].partition(":")
    folder = os.path.join(testlogs, package, name)
    files = sorted(glob.glob(os.path.join(folder, "test.xml")) +
                   glob.glob(os.path.join(folder, "shard_*", "test.xml")))
    if not files:
        return None
    cases = skipped = 0
    reason = ""
    for path in files:
        try:
            root = ET.parse(path).getroot()
        except (ET.ParseError, OSError):
            return None  # Not gtest's XML (or unreadable): leave the target's status alone.
        for case in root.iter("testcase"):
            cases += 1
            skip = case.find("skipped")
            if case.get("result") == "skipped" or skip is not None:
                skipped += 1
                if not reason and skip is not None:
                    # gtest's message is "file:line\nreason": keep the reason.
                    lines = (skip.get("message") or "").splitlines()
                    reason = (lines[-1] if lines else "").strip()
    return cases, skipped, reason


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("testlogs", help="the bazel-testlogs folder of the run that printed stdin")
    parser.add_argument("--step", default="", help="a name to put before each stderr line")
    parser.add_argument("--require-run", action="store_true",
                        help="exit 1 if any case skipped")
    args = parser.parse_args()
    any_skipped = False
    for line in sys.stdin:
        line = line.rstrip("\n")
        match = SUMMARY.match(line)
        if not match:
            print(line)
            continue
        found = cases_of(args.testlogs, match.group("label"))
        if found is None or found[1] == 0:
            print(line)
            continue
        cases, skipped, reason = found
        any_skipped = True
        why = f": {reason}" if reason else ""
        prefix = f"{args.step} " if args.step else ""
        print(f"{prefix}{match.group('label')}: {skipped} of {cases} cases skipped{why}",
              file=sys.stderr)
        if skipped == cases:
            rest = line[match.end():]
            print(f"{match.group('label')}{match.group('mid')}SKIPPED (all {cases} cases skipped)"
                  f"{rest}")
        else:
            print(line)
    if args.require_run and any_skipped:
        print("test_cases.py: some cases skipped where every case must run (see above)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
