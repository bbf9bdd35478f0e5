"""A minimal bool build setting (Bazel 4.2.3 has no bazel_skylib here)."""

BoolSettingInfo = provider(
    doc = "Value of a bool_flag.",
    fields = {"value": "bool"},
)

def _bool_flag_impl(ctx):
    return [BoolSettingInfo(value = ctx.build_setting_value)]

bool_flag = rule(
    implementation = _bool_flag_impl,
    build_setting = config.bool(flag = True),
    doc = "A bool flag settable on the command line: --//pkg:name=true|false.",
)
