"""mpi_test(): a C++ test that `bazel test` runs as an MPI job, once per number of ranks."""

def mpi_test(name, srcs, deps, ranks = [2, 3], size = "small", tags = [], **kwargs):
    """A cc_binary `<name>_bin` and one sh_test `<name>_<n>ranks` per n in `ranks`, running it
    under mpirun (parallel/distributed/mpi_test.sh); `name` is a test_suite of them all."""
    native.cc_binary(
        name = name + "_bin",
        srcs = srcs,
        deps = deps,
        testonly = 1,
        **kwargs
    )
    tests = []
    for n in ranks:
        test = "%s_%dranks" % (name, n)
        native.sh_test(
            name = test,
            srcs = ["//parallel/distributed:mpi_test.sh"],
            args = [str(n), "$(rootpath :%s_bin)" % name],
            data = [":%s_bin" % name],
            size = size,
            # mpirun's daemons and shared-memory files do not fit Bazel's sandbox.
            tags = tags + ["no-sandbox"],
        )
        tests.append(":" + test)
    native.test_suite(name = name, tests = tests, tags = tags)
