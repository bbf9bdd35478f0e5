"""CUDA support for Bazel 4.2.3 (which has no CUDA rules of its own).

Public API (load("//tools/cuda:cuda.bzl", ...)):

  cuda_library(name, srcs, hdrs, deps, copts, defines, local_defines,
               includes, alwayslink, gpu_arches, ...)
      Compiles .cu files with nvcc into PIC objects and provides CcInfo, so
      cc_library/cc_test/cc_binary can depend on it. Links @local_cuda//:cudart.
      Only buildable when //tools/cuda:enabled is true; otherwise it is
      incompatible and `bazel build/test //...` skips it.
  cuda_cc_library / cuda_cc_binary / cuda_cc_test(name, ...)
      cc_library / cc_binary / cc_test that are likewise skipped when CUDA is
      disabled (for host code that uses the CUDA runtime, cuBLAS, NCCL, ...).
      cuda_cc_test adds the tags "cuda" and "gpu".
  if_cuda(if_true, if_false = [])
      select() on //tools/cuda:cuda_enabled, for deps/defines/srcs of targets
      that build either way. True under --config=cudasim too.
  if_nccl(if_true, if_false = [])
      Like if_cuda: true wherever CUDA is enabled, NCCL being the simulator's under
      --config=cudasim.
  if_cudasim(if_true, if_false = [])
      select() on //tools/cuda:cudasim_enabled.
  cuda_target_compatible_with()
      The target_compatible_with value the macros above use, for other rules.
  CUDA_FOUND, NVCC_PATH, CUDA_PATH, CUDA_VERSION
      Re-exported from @local_cuda//:defs.bzl (what the repository rule found).

The //tools/cuda:enabled flag defaults to CUDA_FOUND; `--config=cpu` (in
.bazelrc) sets it to false. `--config=cudasim` sets it and //tools/cuda:cudasim to true:
cuda_library then compiles its .cu files with the C++ compiler against //tools/cudasim (see
tools/cudasim/README.md) and @local_cuda's cudart, cublas and nccl resolve to the simulator's.
A repository that depends on Tandem sets it as
--@tandem//tools/cuda:enabled=false. Labels here are Label()s, resolved in
Tandem's repository, so the macros work from other repositories too.
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")
load(
    "@local_cuda//:defs.bzl",
    _CUDA_FOUND = "CUDA_FOUND",
    _CUDA_PATH = "CUDA_PATH",
    _CUDA_VERSION = "CUDA_VERSION",
    _NVCC_PATH = "NVCC_PATH",
)

CUDA_FOUND = _CUDA_FOUND
CUDA_PATH = _CUDA_PATH
CUDA_VERSION = _CUDA_VERSION
NVCC_PATH = _NVCC_PATH

# The H200 is compute capability 9.0. Each entry "NN" yields SASS for sm_NN;
# PTX for the highest one is embedded too, so later GPUs can JIT it.
DEFAULT_GPU_ARCHES = ["90"]

_CUDA_ENABLED = str(Label("//tools/cuda:cuda_enabled"))
_CUDASIM_ENABLED = str(Label("//tools/cuda:cudasim_enabled"))
_INCOMPATIBLE = ["@platforms//:incompatible"]

def if_cuda(if_true, if_false = []):
    """Returns a select() that is `if_true` when CUDA is enabled, else `if_false`."""
    return select({
        _CUDA_ENABLED: if_true,
        "//conditions:default": if_false,
    })

def if_cudasim(if_true, if_false = []):
    """`if_true` under --config=cudasim, else `if_false`."""
    return select({
        _CUDASIM_ENABLED: if_true,
        "//conditions:default": if_false,
    })

def if_nccl(if_true, if_false = []):
    """`if_true` when CUDA is enabled (NCCL is the simulator's under --config=cudasim)."""
    return select({
        _CUDA_ENABLED: if_true,
        "//conditions:default": if_false,
    })

def cuda_target_compatible_with():
    """target_compatible_with that makes a target skipped when CUDA is disabled."""
    return select({
        _CUDA_ENABLED: [],
        "//conditions:default": _INCOMPATIBLE,
    })

def _toolkit_compatible_with():
    """Compatible only with real CUDA (nvcc, the toolkit's libraries), not with cudasim."""
    return select({
        _CUDASIM_ENABLED: _INCOMPATIBLE,
        _CUDA_ENABLED: [],
        "//conditions:default": _INCOMPATIBLE,
    })

def _cudasim_compatible_with():
    return select({
        _CUDASIM_ENABLED: [],
        "//conditions:default": _INCOMPATIBLE,
    })

# ---------------------------------------------------------------------------
# The rule.
# ---------------------------------------------------------------------------

_CUDA_SRC_EXTS = (".cu",)
_LOCAL_CUDA_ROOT = Label("@local_cuda//:BUILD.bazel").workspace_root  # external/local_cuda

def _is_toolkit_dir(d):
    """Include dirs of @local_cuda itself: nvcc adds the toolkit's headers itself."""
    r = _LOCAL_CUDA_ROOT
    return d == r or d.startswith(r + "/") or d.endswith("/" + r) or ("/" + r + "/") in d
_HDR_EXTS = (".h", ".hh", ".hpp", ".hxx", ".inc", ".inl", ".cuh", ".ipp")

def _package_relative(ctx, path):
    """Turns a package-relative include dir into execroot-relative dirs."""
    pkg = ctx.label.package
    root = ctx.label.workspace_root  # "" or "external/repo"
    rel = "/".join([p for p in [root, pkg, path] if p and p != "."])
    rel = rel or "."
    return [rel, ctx.bin_dir.path + "/" + rel if rel != "." else ctx.bin_dir.path]

def _cuda_library_impl(ctx):
    if not _CUDA_FOUND:
        fail("%s: CUDA is enabled (--//tools/cuda:enabled=true) but no CUDA toolkit " % ctx.label +
             "was found at $CUDA_PATH (default /usr/local/cuda). Use --config=cpu, or " +
             "install the toolkit and run `bazel sync --configure`.")

    cc_toolchain = find_cpp_toolchain(ctx)
    feature_configuration = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )

    dep_infos = [d[CcInfo] for d in ctx.attr.deps] + [
        ctx.attr._cuda_headers[CcInfo],
        ctx.attr._cudart[CcInfo],
    ]
    dep_cc = cc_common.merge_cc_infos(cc_infos = dep_infos)
    dep_ctx = dep_cc.compilation_context

    # This target's own compilation context (what dependents see).
    own_includes = []
    for inc in ctx.attr.includes:
        own_includes.extend(_package_relative(ctx, inc))
    root = ctx.label.workspace_root or "."
    own_quote = [root, ctx.bin_dir.path + ("/" + ctx.label.workspace_root if ctx.label.workspace_root else "")]
    own_ctx = cc_common.create_compilation_context(
        headers = depset(ctx.files.hdrs),
        includes = depset(own_includes),
        quote_includes = depset(own_quote),
        defines = depset(ctx.attr.defines),
    )

    # nvcc command line, common part.
    args = [
        "-x",
        "cu",
        "-std=c++17",
        "-ccbin",
        cc_toolchain.compiler_executable,
        "-Xcompiler",
        "-fPIC",
        "--expt-relaxed-constexpr",
        "--extended-lambda",
        # No contraction of a * b + c into one FMA: every operation rounds once, as on the CPU
        # (x86-64's baseline has no FMA) and under cudasim (-ffp-contract=off), so the CPU stays
        # the bit-exact oracle of the kernels. Contraction made LayerNorm's grad_x of a
        # one-element row 1e-5 instead of 0 on an H200 (fma(dy, w, -round(dy * w)) is the
        # product's rounding error, times rstd). A kernel bound by arithmetic rather than
        # memory can still ask for fmaf() where it wants one, mirrored by std::fma on the CPU;
        # cuBLAS and tensor-core instructions are not affected.
        "-fmad=false",
    ]
    mode = ctx.var.get("COMPILATION_MODE", "fastbuild")
    if mode == "opt":
        args += ["-O3", "-DNDEBUG"]
    elif mode == "dbg":
        args += ["-O0", "-g", "-lineinfo"]
    else:
        args += ["-O2"]

    arches = sorted(ctx.attr.gpu_arches)
    for arch in arches:
        args.append("-gencode=arch=compute_{a},code=sm_{a}".format(a = arch))
    if arches:
        args.append("-gencode=arch=compute_{a},code=compute_{a}".format(a = arches[-1]))

    # Include dirs: ".", the bin/genfiles dirs (generated headers), then the
    # deps' dirs. nvcc has no -iquote, so quote includes become -I.
    inc_args = []
    seen = {}
    for d in [".", ctx.bin_dir.path, ctx.genfiles_dir.path]:
        if d not in seen:
            seen[d] = True
            inc_args.append("-I" + d)
    # The toolkit's own headers are skipped: nvcc adds them itself.
    for d in own_quote + own_includes + dep_ctx.quote_includes.to_list() + dep_ctx.includes.to_list():
        if d not in seen and not _is_toolkit_dir(d):
            seen[d] = True
            inc_args.append("-I" + d)
    for d in dep_ctx.system_includes.to_list():
        if d not in seen and not _is_toolkit_dir(d):
            seen[d] = True
            inc_args += ["-isystem", d]
    args += inc_args

    defines = dep_ctx.defines.to_list() + ctx.attr.defines + ctx.attr.local_defines
    args += ["-D" + d for d in defines]
    args += [ctx.expand_make_variables("copts", c, {}) for c in ctx.attr.copts]

    inputs = depset(
        ctx.files.srcs + ctx.files.hdrs,
        transitive = [dep_ctx.headers, cc_toolchain.all_files],
    )

    objs = []
    for src in ctx.files.srcs:
        if not src.path.endswith(_CUDA_SRC_EXTS):
            continue
        stem = src.short_path
        if ctx.label.package and stem.startswith(ctx.label.package + "/"):
            stem = stem[len(ctx.label.package) + 1:]
        stem = stem.rsplit(".", 1)[0].replace("../", "_external/")
        obj = ctx.actions.declare_file("_objs/%s/%s.pic.o" % (ctx.label.name, stem))
        ctx.actions.run(
            executable = _NVCC_PATH,
            arguments = args + ["-c", src.path, "-o", obj.path],
            inputs = inputs,
            outputs = [obj],
            mnemonic = "NvccCompile",
            progress_message = "Compiling CUDA %s" % src.short_path,
            use_default_shell_env = True,
        )
        objs.append(obj)

    # PIC objects serve both pic and non-pic links (opt-mode binaries link
    # non-pic objects; -fPIC code is fine there).
    compilation_outputs = cc_common.create_compilation_outputs(
        objects = depset(objs),
        pic_objects = depset(objs),
    )
    linking_context, linking_outputs = cc_common.create_linking_context_from_compilation_outputs(
        actions = ctx.actions,
        feature_configuration = feature_configuration,
        cc_toolchain = cc_toolchain,
        compilation_outputs = compilation_outputs,
        linking_contexts = [dep_cc.linking_context],
        name = ctx.label.name,
        alwayslink = ctx.attr.alwayslink,
        user_link_flags = ctx.attr.linkopts,
        disallow_dynamic_library = True,
    )

    cc_info = cc_common.merge_cc_infos(
        direct_cc_infos = [CcInfo(compilation_context = own_ctx, linking_context = linking_context)],
        cc_infos = dep_infos,
    )

    files = list(objs)
    lib = linking_outputs.library_to_link
    if lib:
        for f in [lib.static_library, lib.pic_static_library]:
            if f:
                files.append(f)

    runfiles = ctx.runfiles(files = ctx.files.data)
    for d in ctx.attr.deps + ctx.attr.data:
        runfiles = runfiles.merge(d[DefaultInfo].default_runfiles)

    return [
        DefaultInfo(files = depset(files), runfiles = runfiles),
        cc_info,
        # nvcc output is not instrumented, but coverage of the cc deps must
        # still reach tests that depend on them through this target.
        coverage_common.instrumented_files_info(
            ctx,
            source_attributes = [],
            dependency_attributes = ["deps", "data"],
        ),
    ]

_cuda_library = rule(
    implementation = _cuda_library_impl,
    attrs = {
        "srcs": attr.label_list(
            allow_files = _CUDA_SRC_EXTS + _HDR_EXTS,
            doc = ".cu files (compiled) and private headers.",
        ),
        "hdrs": attr.label_list(
            allow_files = _HDR_EXTS,
            doc = "Public headers, .h or .cuh. Keep the ones plain C++ includes free of CUDA types.",
        ),
        "deps": attr.label_list(providers = [CcInfo], doc = "cc_library / cuda_library deps."),
        "data": attr.label_list(allow_files = True),
        "copts": attr.string_list(doc = "Extra nvcc flags (use -Xcompiler X for host-compiler flags)."),
        "defines": attr.string_list(doc = "-D for this target and its dependents."),
        "local_defines": attr.string_list(doc = "-D for this target only."),
        "includes": attr.string_list(doc = "Package-relative include dirs, propagated like cc_library's."),
        "linkopts": attr.string_list(),
        "alwayslink": attr.bool(default = False),
        "gpu_arches": attr.string_list(
            default = DEFAULT_GPU_ARCHES,
            doc = "Compute capabilities, e.g. [\"90\"]: SASS for each, PTX for the highest.",
        ),
        "_cuda_headers": attr.label(default = Label("@local_cuda//:cuda_headers")),
        "_cudart": attr.label(default = Label("@local_cuda//:cudart")),
        "_cc_toolchain": attr.label(default = Label("@bazel_tools//tools/cpp:current_cc_toolchain")),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    incompatible_use_toolchain_transition = True,
    doc = "Compiles .cu files with nvcc and provides CcInfo. Use the cuda_library macro.",
)

# ---------------------------------------------------------------------------
# Macros: what BUILD files use.
# ---------------------------------------------------------------------------

def _with_cuda_compat(kwargs):
    extra = kwargs.pop("target_compatible_with", [])
    if kwargs.pop("cudasim_only", False):
        kwargs["target_compatible_with"] = _cudasim_compatible_with() + extra
        return kwargs
    kwargs["target_compatible_with"] = cuda_target_compatible_with() + extra
    return kwargs

# Flags for the host compiler when cudasim compiles a .cu file: nvcc's `-Xcompiler X` become X,
# -D/-I/-U pass through, the rest (nvcc-only) are dropped.
def _cudasim_copts(copts):
    out = []
    take_next = False
    for c in copts:
        if take_next:
            out.extend(c.split(","))
            take_next = False
        elif c == "-Xcompiler":
            take_next = True
        elif c.startswith("-Xcompiler="):
            out.extend(c[len("-Xcompiler="):].split(","))
        elif c.startswith("-D") or c.startswith("-I") or c.startswith("-U"):
            out.append(c)
    return out

def cuda_library(
        name,
        srcs = [],
        hdrs = [],
        deps = [],
        copts = [],
        defines = [],
        local_defines = [],
        includes = [],
        linkopts = [],
        alwayslink = False,
        data = [],
        visibility = None,
        tags = [],
        testonly = False,
        target_compatible_with = [],
        cudasim_only = False,
        **kwargs):
    """nvcc-compiled library; skipped (incompatible) when CUDA is disabled.

    Under --config=cudasim the same sources are compiled by the C++ compiler against
    //tools/cudasim instead (each .cu file through //tools/cudasim:rewrite, then with
    -ffp-contract=off -O2 and `-include cuda_runtime.h`). `name` is an alias of whichever
    applies; `name`_nvcc and `name`_cudasim are the two builds.

    Args:
      name: target name.
      srcs: .cu files (compiled) and private headers.
      hdrs: public headers (.h/.cuh).
      deps, copts, defines, local_defines, includes, linkopts, alwayslink, data, visibility,
        tags, testonly, target_compatible_with: as for cc_library (copts are nvcc flags).
      cudasim_only: build only under --config=cudasim (the simulator's own tests).
      **kwargs: gpu_arches, ... (nvcc only).
    """
    _cuda_library(
        name = name + "_nvcc",
        srcs = srcs,
        hdrs = hdrs,
        deps = deps,
        copts = copts,
        defines = defines,
        local_defines = local_defines,
        includes = includes,
        linkopts = linkopts,
        alwayslink = alwayslink,
        data = data,
        visibility = ["//visibility:private"],
        tags = tags,
        testonly = testonly,
        target_compatible_with = (_INCOMPATIBLE if cudasim_only else _toolkit_compatible_with()) +
                                 target_compatible_with,
        **kwargs
    )

    package = native.package_name()
    generated = []
    private_hdrs = []
    textual = []
    for src in srcs:
        if src.endswith(".cu"):
            stem = src.split(":")[-1][:-len(".cu")]
            out = "_cudasim/%s/%s.cu.cc" % (name, stem)
            native.genrule(
                name = "%s_cudasim_rewrite_%s" % (name, stem.replace("/", "_")),
                srcs = [src],
                outs = [out],
                tools = [Label("//tools/cudasim:rewrite")],
                cmd = "$(execpath %s) $< $@ %s" % (
                    str(Label("//tools/cudasim:rewrite")),
                    (package + "/" if package else "") + stem + ".cu",
                ),
                tags = tags,
                testonly = testonly,
                visibility = ["//visibility:private"],
                target_compatible_with = _cudasim_compatible_with(),
            )
            generated.append(out)
        elif src.endswith(".cuh"):
            textual.append(src)
        else:
            private_hdrs.append(src)
    native.cc_library(
        name = name + "_cudasim",
        srcs = generated + private_hdrs,
        hdrs = [h for h in hdrs if not h.endswith(".cuh")],
        textual_hdrs = textual + [h for h in hdrs if h.endswith(".cuh")],
        deps = deps + [Label("//tools/cudasim:cudart")],
        copts = [
            "-O2",
            "-ffp-contract=off",
            "-Wno-unknown-pragmas",
            "-include",
            "cuda_runtime.h",
            "-iquote",
            package or ".",
        ] + _cudasim_copts(copts),
        defines = defines,
        local_defines = local_defines + ["TANDEM_CUDASIM_DEVICE_CODE=1"],
        includes = includes,
        linkopts = linkopts,
        alwayslink = alwayslink,
        data = data,
        visibility = ["//visibility:private"],
        tags = tags,
        testonly = testonly,
        target_compatible_with = _cudasim_compatible_with() + target_compatible_with,
    )

    native.alias(
        name = name,
        actual = select({
            _CUDASIM_ENABLED: ":" + name + "_cudasim",
            "//conditions:default": ":" + name + "_nvcc",
        }),
        visibility = visibility,
        tags = tags,
        testonly = testonly,
    )

def cuda_cc_library(name, **kwargs):
    """cc_library (host code using CUDA libraries); skipped when CUDA is disabled."""
    native.cc_library(name = name, **_with_cuda_compat(kwargs))

def cuda_cc_binary(name, **kwargs):
    """cc_binary that needs CUDA; skipped when CUDA is disabled."""
    native.cc_binary(name = name, **_with_cuda_compat(kwargs))

def cuda_cc_test(name, tags = [], **kwargs):
    """cc_test that needs CUDA; skipped when CUDA is disabled (cudasim_only = True: unless
    under --config=cudasim).

    Tagged "cuda" and "gpu" (filter with --test_tag_filters=-gpu). The test
    itself should GTEST_SKIP() when cudaGetDeviceCount() fails or finds no
    device, so it passes on machines with the toolkit but no GPU. Under
    --config=cudasim it runs on the simulator.
    """
    native.cc_test(
        name = name,
        tags = tags + [t for t in ["cuda", "gpu"] if t not in tags],
        **_with_cuda_compat(kwargs)
    )
