#!/usr/bin/env bash
# test_cases.py on made-up test logs: a target whose every case skipped becomes SKIPPED and is
# named on stderr with gtest's reason; one that skipped some stays PASSED and is named; one
# with no skipped case, a non-gtest XML, a missing XML and a failed target pass through as they
# were; shards are added up; --require-run fails when anything skipped.
set -euo pipefail
script="tools/testing/test_cases.py"
logs="$TEST_TMPDIR/testlogs"
mkdir -p "$logs/pkg/all_skipped" "$logs/pkg/some_skipped" "$logs/pkg/none_skipped" \
  "$logs/pkg/sharded/shard_1_of_2" "$logs/pkg/sharded/shard_2_of_2" "$logs/pkg/plain"

case_run() { echo "<testcase name=\"$1\" status=\"run\" result=\"completed\"/>"; }
case_skipped() {
  echo "<testcase name=\"$1\" status=\"run\" result=\"skipped\"><skipped message=\"a.cc:1&#x0A;no GPU here\"/></testcase>"
}
suite() { echo "<testsuites><testsuite name=\"S\">$*</testsuite></testsuites>"; }
suite "$(case_skipped A)$(case_skipped B)" >"$logs/pkg/all_skipped/test.xml"
suite "$(case_run A)$(case_skipped B)" >"$logs/pkg/some_skipped/test.xml"
suite "$(case_run A)$(case_run B)" >"$logs/pkg/none_skipped/test.xml"
suite "$(case_skipped A)" >"$logs/pkg/sharded/shard_1_of_2/test.xml"
suite "$(case_skipped B)" >"$logs/pkg/sharded/shard_2_of_2/test.xml"
echo "not xml" >"$logs/pkg/plain/test.xml"

input='//pkg:all_skipped      PASSED in 1.0s
//pkg:some_skipped   (cached) PASSED in 0.5s
//pkg:none_skipped       PASSED in 0.1s
//pkg:sharded            PASSED in 0.3s
//pkg:plain              PASSED in 0.2s
//pkg:missing            PASSED in 0.2s
//pkg:failed             FAILED in 0.2s'
out="$(python3 "$script" --step=tandem "$logs" <<<"$input" 2>"$TEST_TMPDIR/err")"
err="$(cat "$TEST_TMPDIR/err")"
expect_out='//pkg:all_skipped      SKIPPED (all 2 cases skipped) in 1.0s
//pkg:some_skipped   (cached) PASSED in 0.5s
//pkg:none_skipped       PASSED in 0.1s
//pkg:sharded            SKIPPED (all 2 cases skipped) in 0.3s
//pkg:plain              PASSED in 0.2s
//pkg:missing            PASSED in 0.2s
//pkg:failed             FAILED in 0.2s'
expect_err='tandem //pkg:all_skipped: 2 of 2 cases skipped: no GPU here
tandem //pkg:some_skipped: 1 of 2 cases skipped: no GPU here
tandem //pkg:sharded: 2 of 2 cases skipped: no GPU here'
fail=0
if [[ "$out" != "$expect_out" ]]; then
  printf 'stdout was:\n%s\nexpected:\n%s\n' "$out" "$expect_out"; fail=1
fi
if [[ "$err" != "$expect_err" ]]; then
  printf 'stderr was:\n%s\nexpected:\n%s\n' "$err" "$expect_err"; fail=1
fi
if python3 "$script" --require-run "$logs" <<<"//pkg:some_skipped  PASSED" >/dev/null 2>&1; then
  echo "--require-run passed although a case skipped"; fail=1
fi
python3 "$script" --require-run "$logs" <<<"//pkg:none_skipped  PASSED" >/dev/null ||
  { echo "--require-run failed although every case ran"; fail=1; }
exit "$fail"
