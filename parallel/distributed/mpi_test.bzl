"""mpi_test(): a C++ test that `bazel test` runs as an MPI job, once per number of ranks."""

def mpi_test(
        name,
        srcs,
        deps,
        ranks = [2, 3],
        size = "small",
        tags = [],
        env = {},
        target_compatible_with = [],
        **kwargs):
    """A cc_binary `<name>_bin` and one sh_test `<name>_<n>ranks` per n in `ranks`, running it
    under mpirun (parallel/distributed/mpi_test.sh) with `env` set for every rank; `name` is a
    test_suite of them all. Rank 0 writes gtest's XML report for Bazel."""
    native.cc_binary(
        name = name + "_bin",
        srcs = srcs,
        deps = deps,
        testonly = 1,
        target_compatible_with = target_compatible_with,
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
            env = env,
            target_compatible_with = target_compatible_with,
            # mpirun's daemons and shared-memory files do not fit Bazel's sandbox.
            tags = tags + ["no-sandbox"],
        )
        tests.append(":" + test)
    native.test_suite(name = name, tests = tests, tags = tags)
