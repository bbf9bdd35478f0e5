#!/usr/bin/env python3
"""Offline stand-in for Bazel's LcovMerger / CoverageOutputGenerator.

Two modes, chosen by the flags Bazel passes:

  --coverage_dir=D --output_file=F [--filter_sources=RE ...]
  [--source_file_manifest=M] [--sources_to_replace_file=S]
      (lcov_merger, run by collect_coverage.sh after each covered test)
      Reads every gcc *.gcov.json.gz (gcc >= 9 "gcov -i" output), every
      old-style intermediate *.gcov text file and every LCOV *.dat file under D
      and writes a single LCOV tracefile to F.

  --reports_file=R --output_file=F [--filter_sources=RE ...]
      (coverage_report_generator, run once for --combined_report=lcov)
      Merges the LCOV files listed in R (one path per line) into F.

Only the Python standard library is used; unknown flags are ignored.
"""

import gzip
import json
import os
import re
import sys


class FileCov:
    """Coverage of one source file."""

    def __init__(self):
        self.lines = {}  # line -> count
        self.functions = {}  # name -> start line
        self.fn_hits = {}  # name -> count
        self.branches = {}  # (line, block, branch) -> count or None ("-")

    def add_line(self, line, count):
        self.lines[line] = self.lines.get(line, 0) + count

    def add_function(self, name, line, count):
        self.functions.setdefault(name, line)
        self.fn_hits[name] = self.fn_hits.get(name, 0) + count

    def add_branch(self, key, count):
        old = self.branches.get(key)
        if count is None:
            self.branches.setdefault(key, None)
        else:
            self.branches[key] = (old or 0) + count


class Report:
    def __init__(self):
        self.files = {}

    def file(self, path):
        path = os.path.normpath(path)
        if path.startswith("/proc/self/cwd/"):
            path = path[len("/proc/self/cwd/"):]
        if path not in self.files:
            self.files[path] = FileCov()
        return self.files[path]

    # ---- readers -------------------------------------------------------
    def read_gcov_json(self, path):
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            doc = json.load(f)
        for fentry in doc.get("files", []):
            cov = self.file(fentry["file"])
            for fn in fentry.get("functions", []):
                name = fn.get("name") or fn.get("demangled_name")
                cov.add_function(name, int(fn.get("start_line", 0)),
                                 int(fn.get("execution_count", 0)))
            for ln in fentry.get("lines", []):
                line = int(ln["line_number"])
                cov.add_line(line, int(ln.get("count", 0)))
                for i, br in enumerate(ln.get("branches", [])):
                    cov.add_branch((line, 0, i), int(br.get("count", 0)))

    def read_gcov_text(self, path):
        """gcc < 9 "gcov -i" intermediate text format."""
        cov = None
        with open(path, encoding="utf-8", errors="replace") as f:
            for raw in f:
                tag, _, value = raw.strip().partition(":")
                if tag == "file":
                    cov = self.file(value)
                elif cov is None:
                    continue
                elif tag == "function":
                    parts = value.split(",")
                    if len(parts) >= 4:  # start,end,count,name
                        cov.add_function(parts[3], int(parts[0]), int(parts[2]))
                    elif len(parts) == 3:  # start,count,name
                        cov.add_function(parts[2], int(parts[0]), int(parts[1]))
                elif tag == "lcount":
                    parts = value.split(",")
                    cov.add_line(int(parts[0]), int(parts[1]))

    def read_lcov(self, path):
        cov = None
        with open(path, encoding="utf-8", errors="replace") as f:
            for raw in f:
                line = raw.strip()
                tag, _, value = line.partition(":")
                if tag == "SF":
                    cov = self.file(value)
                elif cov is None:
                    continue
                elif tag == "DA":
                    parts = value.split(",")
                    cov.add_line(int(parts[0]), int(float(parts[1])))
                elif tag == "FN":
                    lineno, _, name = value.partition(",")
                    cov.functions.setdefault(name, int(lineno))
                    cov.fn_hits.setdefault(name, 0)
                elif tag == "FNDA":
                    count, _, name = value.partition(",")
                    cov.functions.setdefault(name, 0)
                    cov.fn_hits[name] = cov.fn_hits.get(name, 0) + int(count)
                elif tag == "BRDA":
                    parts = value.split(",")
                    if len(parts) == 4:
                        key = (int(parts[0]), int(parts[1]), int(parts[2]))
                        cov.add_branch(key, None if parts[3] == "-" else int(parts[3]))
                elif line == "end_of_record":
                    cov = None

    # ---- filtering / output ---------------------------------------------
    def filter(self, exclude_res, keep_only=None):
        out = {}
        for path, cov in self.files.items():
            if any(r.match(path) for r in exclude_res):
                continue
            if keep_only is not None and path not in keep_only:
                continue
            if not cov.lines and not cov.functions:
                continue
            out[path] = cov
        self.files = out

    def write(self, path):
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for src in sorted(self.files):
                cov = self.files[src]
                f.write("SF:%s\n" % src)
                for name, line in sorted(cov.functions.items(), key=lambda kv: (kv[1], kv[0])):
                    f.write("FN:%d,%s\n" % (line, name))
                for name in sorted(cov.functions, key=lambda n: (cov.functions[n], n)):
                    f.write("FNDA:%d,%s\n" % (cov.fn_hits.get(name, 0), name))
                f.write("FNF:%d\n" % len(cov.functions))
                f.write("FNH:%d\n" % sum(1 for n in cov.functions if cov.fn_hits.get(n, 0) > 0))
                for key in sorted(cov.branches):
                    count = cov.branches[key]
                    f.write("BRDA:%d,%d,%d,%s\n" % (key + ("-" if count is None else count,)))
                if cov.branches:
                    f.write("BRF:%d\n" % len(cov.branches))
                    f.write("BRH:%d\n" % sum(1 for c in cov.branches.values() if c))
                for line in sorted(cov.lines):
                    f.write("DA:%d,%d\n" % (line, cov.lines[line]))
                f.write("LH:%d\n" % sum(1 for c in cov.lines.values() if c > 0))
                f.write("LF:%d\n" % len(cov.lines))
                f.write("end_of_record\n")
        os.replace(tmp, path)


def parse_args(argv):
    opts = {"filter_sources": []}
    for arg in argv:
        if not arg.startswith("--") or "=" not in arg:
            continue
        key, _, value = arg[2:].partition("=")
        if key == "filter_sources":
            opts["filter_sources"].append(value)
        else:
            opts[key] = value
    return opts


def manifest_sources(path):
    """Source files listed in the instrumented-files manifest (None if unusable)."""
    if not path or not os.path.isfile(path):
        return None
    srcs = set()
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            line = raw.strip()
            if line and not line.endswith((".gcno", ".txt")):
                srcs.add(os.path.normpath(line))
    return srcs or None


def merge_coverage_dir(opts):
    cov_dir = opts["coverage_dir"]
    output = os.path.abspath(opts["output_file"])
    report = Report()
    for root, _, names in os.walk(cov_dir):
        for name in sorted(names):
            path = os.path.join(root, name)
            if os.path.abspath(path) == output:
                continue
            try:
                if name.endswith(".gcov.json.gz"):
                    report.read_gcov_json(path)
                elif name.endswith(".gcov"):
                    report.read_gcov_text(path)
                elif name.endswith(".dat") and os.path.getsize(path) > 0:
                    report.read_lcov(path)
            except (OSError, ValueError, KeyError, EOFError) as e:
                sys.stderr.write("lcov_merger: skipping %s: %s\n" % (path, e))
    keep = manifest_sources(opts.get("source_file_manifest"))
    report.filter([re.compile(r) for r in opts["filter_sources"]], keep)
    report.write(output)


def merge_reports(opts):
    report = Report()
    with open(opts["reports_file"], encoding="utf-8") as f:
        for raw in f:
            path = raw.strip()
            if path and os.path.isfile(path) and os.path.getsize(path) > 0:
                report.read_lcov(path)
    report.filter([re.compile(r) for r in opts["filter_sources"]])
    report.write(opts["output_file"])


def main(argv):
    opts = parse_args(argv[1:])
    if "output_file" not in opts:
        sys.stderr.write(__doc__)
        return 2
    if "reports_file" in opts:
        merge_reports(opts)
    elif "coverage_dir" in opts:
        merge_coverage_dir(opts)
    else:
        sys.stderr.write(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
