// The one list of a cost table's numbers, typed as seconds or bytes: JSON (cost_model.cpp),
// interpolation across batch sizes and time scaling (throughput.cpp) all walk it, so a field added
// here is written, read, fitted and scaled alike, and one left out is none of them.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "remat/planning/cost_model.h"

namespace remat::detail {

template <typename Owner>
struct NumberFields {
  std::vector<std::pair<const char*, double Owner::*>> seconds;
  std::vector<std::pair<const char*, int64_t Owner::*>> bytes;
  std::vector<const char*> optional;  // read as 0 when absent (fields added after version 1)
};

const NumberFields<StageRunCost>& run_fields();
const NumberFields<StageCost>& stage_fields();
const NumberFields<CostTable>& table_fields();

// Calls seconds(double&) and bytes(int64_t&) (const references for a const table) on every number
// of `table`, always in the same order: the table's own, then each stage's, its options' and their
// graph-only runs'. Tables of one shape (same stages and options) line up number by number.
template <typename Table, typename Seconds, typename Bytes>
void for_each_cost_number(Table& table, Seconds&& seconds, Bytes&& bytes) {
  static_assert(std::is_same_v<std::remove_const_t<Table>, CostTable>, "a CostTable");
  auto visit = [&](auto& owner, const auto& fields) {
    for (const auto& field : fields.seconds) seconds(owner.*(field.second));
    for (const auto& field : fields.bytes) bytes(owner.*(field.second));
  };
  visit(table, table_fields());
  for (auto& stage : table.stages) {
    visit(stage, stage_fields());
    for (auto& option : stage.options) {
      auto& run = static_cast<std::conditional_t<std::is_const_v<Table>, const StageRunCost&, StageRunCost&>>(option);
      visit(run, run_fields());
      if (option.graph_only) visit(*option.graph_only, run_fields());
    }
  }
}

// Where two tables differ in anything but their numbers, source and threads (granularity, stage
// names and blocks, options, graph-only runs); empty when they line up.
std::string cost_shape_difference(const CostTable& a, const CostTable& b);

}  // namespace remat::detail
