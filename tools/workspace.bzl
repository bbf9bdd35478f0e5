"""tandem_dependencies(): every external repository Tandem's targets need.

One list, used by Tandem's own WORKSPACE and by any repository that depends on
Tandem. A dependent repository's WORKSPACE is:

    local_repository(name = "tandem", path = "/path/to/tandem")  # or http_archive, git_repository
    load("@tandem//tools:workspace.bzl", "tandem_dependencies")
    tandem_dependencies()

Each repository below is declared only if the WORKSPACE has not declared one of
that name before the call, so a dependent repository can bring its own (say its
own @gtest); it must then offer the targets Tandem uses (@gtest//:gtest and
:gtest_main, @absl//:absl, @openblas//:openblas, @onednn//:onednn, @zlib//:zlib, ...).

Every label and path here is relative to the repository this file lives in
(Label("//...") in a .bzl file means Tandem, whatever name the dependent
repository gave it), never to the main repository: a plain "//third_party:x"
string would name the *dependent* repository's package.

Repositories declared:

  rules_cc, rules_java, remote_coverage_tools, platforms
      Offline stand-ins from third_party/bazel/ (Bazel 4.2.3 would otherwise try
      to download the first three on every C++ build or test; see
      third_party/README.md).
  gtest, benchmark, absl, openblas, onednn, zlib, mpi
      System libraries from Debian packages (tools/setup.sh), exposed by the
      third_party/*.BUILD files.
  local_cuda
      The CUDA toolkit at $CUDA_PATH (default /usr/local/cuda), or stubs where
      there is none (tools/cuda/cuda_configure.bzl).
"""

load("//tools/cuda:cuda_configure.bzl", "cuda_configure")

# A file in third_party/: its directory is where the stand-ins and BUILD files
# live. (Not a label inside third_party/bazel/: each stand-in there has its own
# WORKSPACE file, and Tandem's .bazelignore hides that directory from //....)
_THIRD_PARTY_ANCHOR = Label("//third_party:BUILD")

def _stand_in_repository_impl(repository_ctx):
    third_party = repository_ctx.path(repository_ctx.attr._anchor).dirname
    src = third_party.get_child("bazel").get_child(repository_ctx.attr.dir)
    if not src.exists:
        fail("%s: no directory %s" % (repository_ctx.name, src))

    # Like local_repository, but with a path that is found from this file's
    # repository (local_repository's relative path would be taken relative to
    # the main repository, which is wrong when Tandem is a dependency).
    for child in src.readdir():
        if child.basename not in ("WORKSPACE", "WORKSPACE.bazel"):
            repository_ctx.symlink(child, child.basename)
    repository_ctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % repository_ctx.name)

_stand_in_repository = repository_rule(
    implementation = _stand_in_repository_impl,
    attrs = {
        "dir": attr.string(mandatory = True, doc = "Directory under third_party/bazel/."),
        "_anchor": attr.label(default = _THIRD_PARTY_ANCHOR),
    },
    # Symlinks to files in Tandem's tree: re-create them whenever Bazel
    # re-fetches, never cache a copy.
    local = True,
    doc = "An offline stand-in from Tandem's third_party/bazel/<dir>.",
)

def _system_library(name, build_file):
    native.new_local_repository(
        name = name,
        build_file = str(Label("//third_party:" + build_file)),
        path = "/usr",
    )

def _maybe(repo_rule, name, **kwargs):
    """Declares `name` unless the WORKSPACE already declared it."""
    if not native.existing_rule(name):
        repo_rule(name = name, **kwargs)

def tandem_dependencies():
    """Declares the repositories Tandem's targets need (see this file's docstring)."""

    # Offline stand-ins for repositories Bazel itself asks for.
    for name in ["rules_cc", "rules_java", "remote_coverage_tools", "platforms"]:
        _maybe(_stand_in_repository, name, dir = name)

    # System libraries from Debian packages (installed by tools/setup.sh).
    for name in ["gtest", "benchmark", "absl", "openblas", "onednn", "zlib", "mpi"]:
        _maybe(_system_library, name, build_file = name + ".BUILD")

    # The CUDA toolkit, or stubs without one. //tools/cuda:enabled defaults to
    # whether it was found.
    _maybe(cuda_configure, "local_cuda")
