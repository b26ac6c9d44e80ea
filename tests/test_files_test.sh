#!/usr/bin/env bash
# Tests are named after what they test: every public header with behaviour has tests/<header>_test.cpp,
# so that a reader of a header finds its tests by name. The exceptions, with where their tests are:
set -u
root=${1:?usage: test_files_test.sh SOURCE_DIR}
declare -A tested_elsewhere=(
  [error]="every test: REMAT_CHECK's messages are what the suites assert"
  [data_parallel]="distributed_test.sh with distributed_worker.cpp (processes, not a GoogleTest file)"
  [gpt_granularity]="gpt_test.cpp and policies_test.cpp (the GPT's chains at both granularities)"
  [gpt_planning]="profiler_test.cpp, planner_test.cpp and make_plan_test.cpp (the GPT as the planner's subject)"
  [gpt_policies]="policies_test.cpp (the GPT's policies beside the generic ones)"
  [config_json]="json_fuzz_test.cpp and trainer_test.cpp (the configuration file read and refused)"
  [corpus]="trainer_test.cpp (the corpus and its batches, as the trainer reads them)"
)
status=0
for header in "$root"/include/remat/*/*.h "$root"/models/include/remat/models/*.h "$root"/train/include/remat/train/*.h; do
  name=$(basename "$header" .h)
  [ -f "$root/tests/${name}_test.cpp" ] && continue
  [ -n "${tested_elsewhere[$name]+set}" ] && continue
  echo "${header#"$root"/}: no tests/${name}_test.cpp (name its tests after it, or say where they are in tests/test_files_test.sh)"
  status=1
done
for file in "$root"/tests/*_test.cpp; do
  name=$(basename "$file" _test.cpp)
  case $name in own_model | json_fuzz | cuda | c_api) continue ;; esac  # scenarios across headers, GPU, the C API
  found=$(find "$root/include/remat" "$root/models/include" "$root/train/include" "$root/src/internal" \
    -name "$name.h" -print -quit)
  [ -n "$found" ] || { echo "tests/${name}_test.cpp names no header"; status=1; }
done
[ $status -eq 0 ] && echo "test files named after their headers"
exit $status
