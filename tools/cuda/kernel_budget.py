#!/usr/bin/env python3
"""The resource budget of every CUDA kernel: compiles each .cu file of the repository for sm_90
with `nvcc -Xptxas -v` (the flags of tools/cuda/cuda.bzl under -c opt, what the GPU bundle
runs), prints a table of each kernel's registers, static shared memory, stack frame and
theoretical occupancy at its launch block size, and fails on any register spill or
local-memory stack frame that tools/cuda/kernel_budget_allow.txt does not allow, and on any kernel
of TENSOR_CORE_KERNELS without a tensor-core instruction (`mma`/`wmma`/`wgmma`) in its PTX (or
missing from its file). Run it after changing a kernel; .ci/run runs it as a step.

  python3 tools/cuda/kernel_budget.py                 # every .cu file, one nvcc per core
  python3 tools/cuda/kernel_budget.py tensor/cuda/attention_kernels.cu
  python3 tools/cuda/kernel_budget.py --ptxas-log saved.txt tensor/cuda/reduce_kernels.cu  # no nvcc
  python3 tools/cuda/kernel_budget.py --ptxas-log saved.txt --ptx-log saved.ptx \
      tensor/cuda/attention_kernels.cu   # the tensor-core check too, without nvcc

Exit status: 0 within budget, or skipped (no nvcc: it says so on its last line); 1 over
budget; 2 a file did not compile or the allow-list is malformed.
"""
import argparse
import concurrent.futures
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
ALLOW_LIST = os.path.join(ROOT, "tools", "cuda", "kernel_budget_allow.txt")
ARCH = "90"

# sm_90 (H100/H200) per-SM limits, as the toolkit's cuda_occupancy.h computes with them.
REGISTERS_PER_SM = 65536
REGISTER_GRANULARITY = 256  # registers are allocated per warp in units of this many
SUB_PARTITIONS = 4  # each holds a quarter of the registers; a warp's live in one
WARPS_PER_SM = 64  # 2048 threads
BLOCKS_PER_SM = 32
SHARED_PER_SM = 228 * 1024
SHARED_GRANULARITY = 128
SHARED_RESERVED_PER_BLOCK = 1024  # the system's share of each block's shared memory on sm_80+
ASSUMED_BLOCK = 256  # when the launch's block size is not a constant the script can read

# Kernels that must use tensor cores: (file, glob over the kernel's short name). Each must exist
# when its file is checked and have an mma instruction in its PTX: a change that loses them (a
# path taken only on the simulator, a type that stops matching WMMA's) fails here, not on a GPU.
TENSOR_CORE_KERNELS = [
    ("tensor/cuda/attention_kernels.cu", "Attention*TensorCoreKernel<BFloat16>"),
    ("tensor/cuda/attention_kernels.cu", "Attention*TensorCoreKernel<Half>"),
]
TENSOR_CORE_INSTRUCTION = re.compile(r"\b(?:wmma\.mma|mma\.sync|wgmma\.mma_async)\b")


def nvcc_command(source, output, extra_copts):
    """tools/cuda/cuda.bzl's nvcc command line under -c opt, device code only (-cubin)."""
    nvcc = os.path.join(os.environ.get("CUDA_PATH", "/usr/local/cuda"), "bin", "nvcc")
    return [
        nvcc, "-x", "cu", "-std=c++17", "-ccbin", os.environ.get("CC", "gcc"),
        "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr", "--extended-lambda",
        "-O3", "-DNDEBUG", "-gencode=arch=compute_{0},code=sm_{0}".format(ARCH),
        "-I" + ROOT, "-Xptxas", "-v", "-cubin", "-o", output,
    ] + extra_copts + [source]


def cuda_library_copts(source):
    """The nvcc copts of the cuda_library in the source's BUILD file that compiles it (e.g.
    --fmad=false for the optimizer kernels: contraction changes registers)."""
    build = os.path.join(os.path.dirname(source), "BUILD")
    if not os.path.exists(build):
        return []
    with open(build, encoding="utf-8") as f:
        text = f.read()
    name = os.path.basename(source)
    for block in re.findall(r"cuda_library\((.*?)\n\)", text, re.S):
        srcs = re.search(r"srcs\s*=\s*\[(.*?)\]", block, re.S)
        if srcs and '"%s"' % name in srcs.group(1):
            copts = re.search(r"copts\s*=\s*\[(.*?)\]", block, re.S)
            return re.findall(r'"([^"]*)"', copts.group(1)) if copts else []
    return []


def sources():
    """Every .cu file git knows (or, outside a git checkout, every one under ROOT)."""
    try:
        out = subprocess.run(["git", "ls-files", "*.cu"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
        return sorted(os.path.join(ROOT, p) for p in out.split())
    except (OSError, subprocess.CalledProcessError):
        found = []
        for top, dirs, files in os.walk(ROOT):
            dirs[:] = [d for d in dirs if not d.startswith((".", "bazel-"))]
            found += [os.path.join(top, f) for f in files if f.endswith(".cu")]
        return sorted(found)


def compile_one(source, want_ptx):
    """(source, ptxas output, PTX or None, error or None); PTX only when `want_ptx`."""
    with tempfile.TemporaryDirectory() as tmp:
        command = nvcc_command(source, os.path.join(tmp, "out.cubin"), cuda_library_copts(source))
        run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        text = run.stdout + run.stderr
        if run.returncode != 0:
            return source, text, None, text
        if not want_ptx:
            return source, text, None, None
        ptx_file = os.path.join(tmp, "out.ptx")
        command = [a for a in nvcc_command(source, ptx_file, cuda_library_copts(source))
                   if a not in ("-Xptxas", "-v")]
        command[command.index("-cubin")] = "-ptx"
        run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if run.returncode != 0:
            return source, text, None, run.stdout + run.stderr
        with open(ptx_file, encoding="utf-8") as f:
            return source, text, f.read(), None


def ptx_tensor_core_entries(ptx):
    """Mangled names of the PTX's entry functions, each with whether its body has a
    tensor-core instruction."""
    entries = {}
    parts = re.split(r"\.entry\s+([\w$]+)\s*\(", ptx)
    for name, body in zip(parts[1::2], parts[2::2]):
        body = re.split(r"\.(?:entry|func)\s", body, 1)[0]
        entries[name] = bool(TENSOR_CORE_INSTRUCTION.search(body))
    return entries


def required_tensor_cores(source, extra):
    """The globs of TENSOR_CORE_KERNELS for `source` (or `extra`, given on the command line)."""
    if extra:
        return extra
    relative = os.path.relpath(source, ROOT)
    return [glob for path, glob in TENSOR_CORE_KERNELS if path == relative]


def parse_ptxas(text):
    """Kernels and device functions from `-Xptxas -v` output: a dict of mangled name to
    {registers, smem, stack, spill_stores, spill_loads, entry}."""
    functions = {}
    current = None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            current = functions.setdefault(m.group(1), {"entry": True})
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            current = functions.setdefault(m.group(1), {"entry": False})
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                      line)
        if m:
            current["stack"], current["spill_stores"], current["spill_loads"] = map(int, m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m:
            current["registers"] = int(m.group(1))
            smem = re.search(r"(\d+) bytes smem", line)
            current["smem"] = int(smem.group(1)) if smem else 0
    for f in functions.values():
        for key in ("registers", "smem", "stack", "spill_stores", "spill_loads"):
            f.setdefault(key, 0)
    return functions


def demangle(names):
    names = list(names)
    if not names or shutil.which("c++filt") is None:
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                         text=True).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def shorten(name):
    """`void tandem::cuda::(anonymous namespace)::Kernel<float>(args...)` -> `Kernel<float>`."""
    for prefix in ("tandem::", "cuda::", "(anonymous namespace)::", "cudasim_tests::"):
        name = name.replace(prefix, "")
    if name.endswith(")"):  # drop the parameter list: the ( that matches the last )
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    if name.startswith("void "):
        name = name[len("void "):]
    return name


def base_name(short):
    """The kernel's identifier: `Map1ContiguousKernel<float, ...>` -> `Map1ContiguousKernel`."""
    return re.split(r"[<(]", short, 1)[0].split("::")[-1]


def evaluate(expression, constants):
    """The integer value of a launch's block expression, or None when it is not made of
    literals and the file's integer constants."""
    expression = expression.strip()
    names = re.findall(r"[A-Za-z_]\w*", expression)
    if any(n not in constants for n in names) or not re.fullmatch(r"[\w\s+\-*/()]*", expression):
        return None
    try:
        value = eval(re.sub(r"[A-Za-z_]\w*", lambda m: str(constants[m.group(0)]), expression)
                     .replace("/", "//"), {"__builtins__": {}})
    except Exception:  # noqa: BLE001 (anything that is not plain arithmetic)
        return None
    return value if isinstance(value, int) and value > 0 else None


def split_top_level(text):
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(c, 0)
        if c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def block_sizes(source_text):
    """Per kernel identifier: (threads, how it was found) from its launches (`<<<grid, block`),
    else from its __launch_bounds__."""
    constants = {}
    for m in re.finditer(r"constexpr\s+(?:int|int64_t|unsigned|size_t|int32_t)\s+(\w+)\s*=\s*"
                         r"([^;]+);", source_text):
        value = evaluate(m.group(2), constants)
        if value is not None:
            constants[m.group(1)] = value
    sizes = {}
    for m in re.finditer(r"(\w+)\s*(?:<[^<>;]*(?:<[^<>;]*>[^<>;]*)*>)?\s*<<<(.*?)>>>", source_text,
                         re.S):
        parts = split_top_level(m.group(2))
        if len(parts) < 2:
            continue
        value = evaluate(parts[1], constants)
        if value is not None:
            sizes[m.group(1)] = max(value, sizes.get(m.group(1), (0, ""))[0]), "launch"
    for m in re.finditer(r"__launch_bounds__\(\s*([^,)]+)[^)]*\)\s*(\w+)\s*\(", source_text):
        value = evaluate(m.group(1), constants)
        if value is not None and m.group(2) not in sizes:
            sizes[m.group(2)] = value, "bounds"
    return sizes


def occupancy(registers, threads, smem):
    """Theoretical occupancy (active warps / 64) of blocks of `threads` on an sm_90 SM, and
    what limits it: cudaOccupancyMaxActiveBlocksPerMultiprocessor's arithmetic."""
    warps = -(-threads // 32)
    limits = {"blocks": BLOCKS_PER_SM, "threads": WARPS_PER_SM // warps}
    if registers > 0:
        per_warp = -(-registers * 32 // REGISTER_GRANULARITY) * REGISTER_GRANULARITY
        warps_per_sub_partition = REGISTERS_PER_SM // SUB_PARTITIONS // per_warp
        limits["registers"] = warps_per_sub_partition * SUB_PARTITIONS // warps
    per_block = -(-(smem + SHARED_RESERVED_PER_BLOCK) // SHARED_GRANULARITY) * SHARED_GRANULARITY
    limits["shared"] = SHARED_PER_SM // per_block
    limiter = min(limits, key=lambda k: limits[k])
    blocks = limits[limiter]
    return blocks * warps / WARPS_PER_SM, limiter


def read_allow_list(path):
    """[(glob, reason)] from `glob  # reason` lines; a line without a reason is an error."""
    entries = []
    if not os.path.exists(path):
        return entries
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            pattern, _, reason = line.partition("#")
            if not pattern.strip() or not reason.strip():
                raise ValueError("%s:%d: expected `kernel-glob  # reason`, found %r; every allowed "
                                 "spill or stack needs its reason" % (path, number, line))
            entries.append((pattern.strip(), reason.strip()))
    return entries


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help=".cu files (default: every one in the repository)")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--allow", default=ALLOW_LIST, help="the allow-list file")
    parser.add_argument("--ptxas-log", help="read this saved ptxas output for the one .cu file "
                        "given instead of compiling it")
    parser.add_argument("--ptx-log", help="with --ptxas-log: that file's saved PTX, for the "
                        "tensor-core check")
    parser.add_argument("--require-mma", action="append", default=[], metavar="GLOB",
                        help="kernels that must have tensor-core instructions, instead of "
                        "TENSOR_CORE_KERNELS's (repeatable)")
    args = parser.parse_args(argv)
    files = [os.path.abspath(f) for f in args.files] or sources()
    try:
        allow = read_allow_list(args.allow)
    except ValueError as error:
        print("kernel_budget: %s" % error)
        return 2

    if args.ptxas_log:
        if len(files) != 1:
            print("kernel_budget: --ptxas-log takes exactly one .cu file (for its launch sizes), "
                  "found %d" % len(files))
            return 2
        with open(args.ptxas_log, encoding="utf-8") as f:
            log = f.read()
        ptx = None
        if args.ptx_log:
            with open(args.ptx_log, encoding="utf-8") as f:
                ptx = f.read()
        results = [(files[0], log, ptx, None)]
    else:
        nvcc = nvcc_command("x.cu", "x.cubin", [])[0]
        if not os.access(nvcc, os.X_OK):
            print("kernel_budget: skipped: no nvcc at %s (set CUDA_PATH to the CUDA toolkit to "
                  "check the kernels' registers, spills and stack)" % nvcc)
            return 0
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
            results = list(pool.map(
                lambda f: compile_one(f, bool(required_tensor_cores(f, args.require_mma))),
                files))

    failed_compiles = [(s, e) for s, _, _, e in results if e is not None]
    for source, error in failed_compiles:
        print("kernel_budget: nvcc failed on %s:\n%s" % (os.path.relpath(source, ROOT), error))
    if failed_compiles:
        return 2

    rows, over, used_allow, no_tensor_cores = [], [], set(), []
    for source, text, ptx, _ in results:
        with open(source, encoding="utf-8") as f:
            sizes = block_sizes(f.read())
        functions = parse_ptxas(text)
        names = demangle(functions)
        relative = os.path.relpath(source, ROOT)
        required = required_tensor_cores(source, args.require_mma)
        if required and ptx is None:
            no_tensor_cores.append("%s: no PTX to check %s for tensor-core instructions (pass "
                                   "--ptx-log with --ptxas-log)" % (relative, ", ".join(required)))
        elif required:
            entries = ptx_tensor_core_entries(ptx)
            shorts = {m: shorten(n) for m, n in demangle(entries).items()}
            for glob in required:
                matched = [m for m in entries if fnmatch.fnmatchcase(shorts[m], glob)]
                if not matched:
                    no_tensor_cores.append("%s: no kernel matches %s, which must run on tensor "
                                           "cores" % (relative, glob))
                no_tensor_cores += ["%s: %s has no mma/wmma instruction in its PTX; it must run on "
                                    "tensor cores" % (relative, shorts[m])
                                    for m in matched if not entries[m]]
        for mangled, f in sorted(functions.items(), key=lambda item: names[item[0]]):
            short = shorten(names[mangled])
            threads, how = sizes.get(base_name(short), (ASSUMED_BLOCK, "assumed"))
            row = dict(f, name=short, file=os.path.relpath(source, ROOT), threads=threads, how=how)
            if f["entry"]:
                row["occupancy"], row["limiter"] = occupancy(f["registers"], threads, f["smem"])
            rows.append(row)
            if f["spill_stores"] or f["spill_loads"] or f["stack"]:
                reasons = [r for g, r in allow if fnmatch.fnmatchcase(short, g)]
                used_allow.update(g for g, _ in allow if fnmatch.fnmatchcase(short, g))
                if reasons:
                    row["allowed"] = reasons[0]
                else:
                    over.append(row)

    width = min(72, max([len(r["name"]) for r in rows] + [6]))
    print("%-*s %4s %6s %5s %6s %6s  %s" % (width, "kernel", "regs", "smem", "stack", "spill",
                                             "block", "occupancy (limited by)"))
    for r in rows:
        name = r["name"] if len(r["name"]) <= width else r["name"][:width - 3] + "..."
        block = ("%d%s" % (r["threads"], {"launch": "", "bounds": "b", "assumed": "*"}[r["how"]])
                 if r["entry"] else "-")
        occ = ("%3.0f%% (%s)" % (100 * r["occupancy"], r["limiter"]) if r["entry"]
               else "device function")
        print("%-*s %4d %6d %5d %6d %6s  %s%s" % (
            width, name, r["registers"], r["smem"], r["stack"],
            r["spill_stores"] + r["spill_loads"], block, occ,
            "  allowed: " + r["allowed"] if "allowed" in r else ""))
    print("block: from the launch's <<<>>>; b: its __launch_bounds__ (an upper bound: the launch "
          "computes it); *: not a constant here, %d assumed. smem is static shared memory; "
          "occupancy leaves out dynamic shared memory, which the launch sizes." % ASSUMED_BLOCK)
    for g, reason in allow:
        if g not in used_allow:
            print("kernel_budget: note: allow-list entry %r (%s) matches no kernel with a spill or "
                  "stack any more; remove it" % (g, reason))
    for r in over:
        print("kernel_budget: OVER BUDGET: %s (%s): %d bytes stack frame, %d bytes spill stores, "
              "%d bytes spill loads at %d registers; expected none. Keep arrays indexed with "
              "constants (unrolled loops), or add `%s  # why` to %s" % (
                  r["name"], r["file"], r["stack"], r["spill_stores"], r["spill_loads"],
                  r["registers"], base_name(r["name"]) + "*", os.path.relpath(args.allow, ROOT)))
    for message in no_tensor_cores:
        print("kernel_budget: NO TENSOR CORES: " + message)
    kernels = sum(1 for r in rows if r["entry"])
    print("kernel_budget: %d kernels in %d files, %d over budget (spill or stack), %d allowed, %d "
          "tensor-core failures" % (kernels, len(results), len(over),
                                    sum(1 for r in rows if "allowed" in r), len(no_tensor_cores)))
    return 1 if over or no_tensor_cores else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
