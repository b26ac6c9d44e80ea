#include "remat/planning/cost_model.h"

#include "remat/memory/memory.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/json_fields.h"
#include "planning/cost_numbers.h"
#include "remat/base/error.h"
#include "remat/internal/table.h"

namespace remat {

using detail::run_fields;
using detail::stage_fields;
using detail::table_fields;

bool StageCost::has_option(const std::string& wanted) const {
  return std::any_of(options.begin(), options.end(), [&](const StageOptionCost& o) { return o.option == wanted; });
}

const StageOptionCost& StageCost::option(const std::string& wanted) const {
  for (const auto& o : options) {
    if (o.option == wanted) return o;
  }
  REMAT_CHECK(false, "the cost table has no option '", detail::shortened(wanted), "' for stage '",
              detail::shortened(name), "'; profile the model again.");
  return options.front();
}

double StageCost::relative_spread() const {
  if (options.empty()) return 0.0;
  const double seconds = options.front().forward_seconds + options.front().backward_seconds;
  return seconds > 0 ? spread_seconds / seconds : 0.0;
}

std::vector<std::string> CostTable::unstable_stages(double tolerance) const {
  std::vector<std::string> names;
  for (const auto& s : stages) {
    if (s.relative_spread() > tolerance) names.push_back(s.name);
  }
  return names;
}

namespace {

struct Simulated {
  int64_t peak = 0;
  double seconds = 0;
};

// Parameter bytes of stages [first, last] from running sums (prefix[k]: stages before k), so that a
// segment of n stages is simulated in O(n), not O(n^2).
int64_t parameter_bytes_between(const std::vector<int64_t>& prefix, int64_t first, int64_t last) {
  return first > last ? 0 : prefix[static_cast<size_t>(last + 1)] - prefix[static_cast<size_t>(first)];
}

// The cost of back-propagating items covering stages [s, t], with a(s-1) held outside the count
// and δ(t) counted: the recurrence of docs/planner.md, applied to one given plan. Inside a
// checkpointed segment (`in_segment`) the parameter gradients of stages already back-propagated
// are held until the segment's backward returns them all at once (the recompute's engine captures
// them; reentrant mode only); outside, each is added into .grad as soon as it is computed.
// Each item's cost needs the cost of the items after it: they are costed last to first, in a loop
// (a plan may have 100,000 items); only nested segments recurse, as deep as the plan nests
// (Plan::kMaxNesting at most).
struct Charges {
  std::vector<double> stage_seconds;  // what the plan charges each stage
  int64_t segments = 0;
};

Simulated simulate_items(const std::vector<PlanItem>& items, int64_t t, bool in_segment, const Plan& plan,
                         const CostTable& costs, const std::vector<int64_t>& parameter_prefix, Charges& charges) {
  const auto& stages = costs.stages;
  const int64_t grad_t = stages[t].output_bytes;
  // Non-reentrant segments add each parameter's gradient into .grad as its node finishes.
  const bool captures = plan.mode == CheckpointMode::reentrant;
  // A reentrant segment's backward receives δ(t) as its argument and holds it until it returns:
  // through the backward of every item before its last, not only the last stage's.
  const int64_t held_grad = in_segment && captures ? grad_t : 0;
  Simulated rest;  // of the items after the current one
  for (size_t i = items.size(); i-- > 0;) {
    const PlanItem& item = items[i];
    const bool has_rest = i + 1 < items.size();
    // The stages [first, e] this item runs (a stage item: e == first).
    const auto [first, e] = item.is_stage() ? std::make_pair(item.stage, item.stage) : stage_range(item.segment);
    Simulated result;
    if (item.is_stage()) {
      const StageCost& c = stages[first];
      // The last stage of a segment's items is recomputed graph-only (run_plan does so).
      const bool segment_end = in_segment && !has_rest;
      const StageOptionCost& option = c.option(plan.options[first]);
      const StageRunCost& o = segment_end ? option.at_segment_end() : option;
      const int64_t captured = in_segment && captures ? parameter_bytes_between(parameter_prefix, first + 1, t) : 0;
      result.peak = std::max(grad_t + o.kept_bytes + o.forward_extra_bytes,
                             c.output_bytes + o.kept_bytes + c.input_grad_bytes + o.backward_extra_bytes + captured +
                                 (first < t ? held_grad : 0));
      // Inside a segment the stage runs in its recompute, which costs it more than its forward.
      result.seconds = o.forward_seconds + o.backward_seconds + (in_segment ? c.recompute_extra_seconds : 0.0);
      charges.stage_seconds[static_cast<size_t>(first)] += result.seconds;
      if (has_rest) {
        result.peak = std::max(result.peak, o.kept_bytes + rest.peak);
        result.seconds += rest.seconds;
      }
      rest = result;
      continue;
    }
    // A checkpointed segment [first, e]: a forward that keeps only boundaries, then (after the
    // rest's backward) its inner plan with δ(e) counted.
    const int64_t segment = costs.segment_bytes;
    result.seconds = costs.segment_seconds();
    for (int64_t k = first; k <= e; ++k) {
      const int64_t held_input = k == first ? 0 : stages[k - 1].output_bytes;
      result.peak =
          std::max(result.peak, segment + grad_t + held_input + stages[k].output_bytes + stages[k].nograd_extra_bytes);
      result.seconds += stages[k].nograd_seconds;
      charges.stage_seconds[static_cast<size_t>(k)] += stages[k].nograd_seconds;
    }
    ++charges.segments;
    if (has_rest) {
      result.peak = std::max(result.peak, segment + stages[e].output_bytes + rest.peak);
      result.seconds += rest.seconds;
    }
    // During its backward a segment holds its saved RNG state and, while recomputing, a copy of
    // the current one (restored afterwards): two states; and, inside an enclosing segment, the
    // gradients that one has captured from the stages after e.
    const int64_t captured = in_segment && captures ? parameter_bytes_between(parameter_prefix, e + 1, t) : 0;
    const Simulated inner =
        simulate_items(item.segment, e, /*in_segment=*/true, plan, costs, parameter_prefix, charges);
    result.peak = std::max(result.peak, 2 * segment + captured + (e < t ? held_grad : 0) + inner.peak);
    result.seconds += inner.seconds;
    rest = result;
  }
  return rest;
}

template <typename Owner>
void write_numbers(const Owner& from, const detail::NumberFields<Owner>& fields, nlohmann::json& to) {
  for (const auto& [name, member] : fields.seconds) to[name] = from.*member;
  for (const auto& [name, member] : fields.bytes) to[name] = from.*member;
}

// Reads the fields into `to`, as JSON numbers of the right kind; their ranges are checked on the
// whole table afterwards (CostTable::check_well_formed), as for a table built in code.
template <typename Owner>
void read_numbers(const detail::JsonFields& from, const detail::NumberFields<Owner>& fields, Owner& to) {
  auto absent = [&](const char* name) {
    const auto& optional = fields.optional;
    return !from.has(name) && std::find(optional.begin(), optional.end(), std::string(name)) != optional.end();
  };
  for (const auto& [name, member] : fields.seconds) to.*member = absent(name) ? 0.0 : from.seconds(name);
  for (const auto& [name, member] : fields.bytes) to.*member = absent(name) ? 0 : from.bytes(name);
}

// What every refusal of a table's number ends with: how to fix it.
constexpr const char* kFixTable =
    " Correct the table where it is made (its numbers are measured or estimated costs), or profile the model again.";

// Checks one owner's numbers and adds its sizes to `total`, refusing a sum beyond 2^53 bytes: each
// size is at most 2^53 and so is the running sum, so the addition itself cannot overflow.
// `label()` names the owner ("stages[3].options[0]", "" for the table): built only for an error,
// since simulate checks every table it is given.
template <typename Owner, typename Label>
void check_numbers(const Owner& owner, const detail::NumberFields<Owner>& fields, const std::string& who,
                   const Label& label, int64_t& total) {
  auto where = [&] { return label().empty() ? who : who + ": " + label(); };
  for (const auto& [name, member] : fields.seconds) {
    const double value = owner.*member;
    REMAT_CHECK(std::isfinite(value) && value >= 0, where(), ": field '", name, "' must be ", detail::kSecondsExpected,
                ", found ", value, ".", kFixTable);
  }
  for (const auto& [name, member] : fields.bytes) {
    const int64_t value = owner.*member;
    REMAT_CHECK(value >= 0 && value <= detail::kMaxBytes, where(), ": field '", name, "' must be ",
                detail::kBytesExpected, ", found ", value, ".", kFixTable);
    total += value;
    REMAT_CHECK(total <= detail::kMaxBytes, who, ": the table's sizes add up to more than 2^53 bytes (8 PiB) by ",
                label().empty() ? std::string("its own fields") : label(), "; no model holds that much.", kFixTable);
  }
}

nlohmann::json run_cost_json(const StageRunCost& c) {
  nlohmann::json j = nlohmann::json::object();
  write_numbers(c, run_fields(), j);
  return j;
}

}  // namespace

namespace detail {

const NumberFields<StageRunCost>& run_fields() {
  static const NumberFields<StageRunCost> fields{
      {{"forward_seconds", &StageRunCost::forward_seconds}, {"backward_seconds", &StageRunCost::backward_seconds}},
      {{"kept_bytes", &StageRunCost::kept_bytes},
       {"forward_extra_bytes", &StageRunCost::forward_extra_bytes},
       {"backward_extra_bytes", &StageRunCost::backward_extra_bytes}},
      {}};
  return fields;
}

const NumberFields<StageCost>& stage_fields() {
  static const NumberFields<StageCost> fields{{{"nograd_seconds", &StageCost::nograd_seconds},
                                               {"recompute_extra_seconds", &StageCost::recompute_extra_seconds},
                                               {"spread_seconds", &StageCost::spread_seconds}},
                                              {{"output_bytes", &StageCost::output_bytes},
                                               {"input_grad_bytes", &StageCost::input_grad_bytes},
                                               {"parameter_bytes", &StageCost::parameter_bytes},
                                               {"nograd_extra_bytes", &StageCost::nograd_extra_bytes}},
                                              {"parameter_bytes", "recompute_extra_seconds", "spread_seconds"}};
  return fields;
}

// Absent in tables written before each was measured: no charge, as then.
const NumberFields<CostTable>& table_fields() {
  static const NumberFields<CostTable> fields{
      {{"segment_forward_seconds", &CostTable::segment_forward_seconds},
       {"segment_backward_seconds", &CostTable::segment_backward_seconds},
       {"segment_spread_seconds", &CostTable::segment_spread_seconds}},
      {{"segment_bytes", &CostTable::segment_bytes}},
      {"segment_forward_seconds", "segment_backward_seconds", "segment_spread_seconds", "segment_bytes"}};
  return fields;
}

std::string cost_shape_difference(const CostTable& a, const CostTable& b) {
  if (a.granularity != b.granularity) return "granularity";
  if (a.stages.size() != b.stages.size()) return "the number of stages";
  for (size_t i = 0; i < a.stages.size(); ++i) {
    const StageCost &s = a.stages[i], &t = b.stages[i];
    const std::string where = "stages[" + std::to_string(i) + "]";
    if (s.name != t.name || s.block != t.block) return where;
    if (s.options.size() != t.options.size()) return where + ".options";
    for (size_t k = 0; k < s.options.size(); ++k) {
      if (s.options[k].option != t.options[k].option ||
          s.options[k].graph_only.has_value() != t.options[k].graph_only.has_value()) {
        return where + ".options[" + std::to_string(k) + "]";
      }
    }
  }
  return "";
}

}  // namespace detail

Prediction simulate(const Plan& plan, const CostTable& costs) {
  // Every index and number the simulation reads, checked before it reads any (tables and plans
  // may be built in code, with none of the loaders' checks).
  plan.check_well_formed("simulate");
  costs.check_well_formed("simulate: the cost table");
  REMAT_CHECK(plan.stage_names.size() == costs.stages.size(), "simulate: the plan has ", plan.stage_names.size(),
              " stages but the cost table ", costs.stages.size(), "; simulate a plan made for the table's chain.");
  const auto n = static_cast<int64_t>(costs.stages.size());
  std::vector<int64_t> parameter_prefix(static_cast<size_t>(n) + 1, 0);
  for (int64_t k = 0; k < n; ++k) parameter_prefix[k + 1] = parameter_prefix[k] + costs.stages[k].parameter_bytes;
  Charges charges{std::vector<double>(static_cast<size_t>(n), 0.0), 0};
  const Simulated s = simulate_items(plan.items, n - 1, /*in_segment=*/false, plan, costs, parameter_prefix, charges);
  Prediction p;
  p.peak_bytes = s.peak;
  p.step_seconds = s.seconds;
  for (int64_t d : plan.recompute_depths()) p.recomputed_stages += d;
  p.segments = charges.segments;
  p.segment_spread_seconds = static_cast<double>(charges.segments) * costs.segment_spread_seconds;
  double variance = p.segment_spread_seconds * p.segment_spread_seconds;
  p.stage_spread_seconds.resize(static_cast<size_t>(n));
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    p.stage_spread_seconds[i] = costs.stages[i].relative_spread() * charges.stage_seconds[i];
    variance += p.stage_spread_seconds[i] * p.stage_spread_seconds[i];
  }
  p.step_seconds_spread = std::sqrt(variance);
  p.stage_seconds = std::move(charges.stage_seconds);
  return p;
}

double predicted_overhead(const Prediction& plan, const Prediction& unchecked) {
  return unchecked.step_seconds > 0 ? plan.step_seconds / unchecked.step_seconds - 1 : 0.0;
}

double predicted_overhead_spread(const Prediction& plan, const Prediction& unchecked) {
  if (unchecked.step_seconds <= 0) return 0.0;
  if (plan.stage_seconds.size() != unchecked.stage_seconds.size() ||
      plan.stage_spread_seconds.size() != plan.stage_seconds.size() ||
      unchecked.stage_spread_seconds.size() != unchecked.stage_seconds.size()) {
    return plan.step_seconds_spread / unchecked.step_seconds;  // not of one table: no cancelling
  }
  const double segments = plan.segment_spread_seconds - unchecked.segment_spread_seconds;
  double variance = segments * segments;
  for (size_t i = 0; i < plan.stage_seconds.size(); ++i) {
    // Each stage's relative spread, from whichever prediction charged it.
    const double relative = plan.stage_seconds[i] > 0 ? plan.stage_spread_seconds[i] / plan.stage_seconds[i]
                            : unchecked.stage_seconds[i] > 0
                                ? unchecked.stage_spread_seconds[i] / unchecked.stage_seconds[i]
                                : 0.0;
    const double extra = relative * (plan.stage_seconds[i] - unchecked.stage_seconds[i]);
    variance += extra * extra;
  }
  return std::sqrt(variance) / unchecked.step_seconds;
}

std::string CostTable::to_json() const {
  nlohmann::json stages_json = nlohmann::json::array();
  for (const auto& s : stages) {
    nlohmann::json options_json = nlohmann::json::array();
    for (const auto& o : s.options) {
      nlohmann::json option_json = run_cost_json(o);
      option_json["option"] = o.option;
      if (o.graph_only) option_json["graph_only"] = run_cost_json(*o.graph_only);
      options_json.push_back(option_json);
    }
    nlohmann::json stage_json = {{"name", s.name}, {"block", s.block}, {"options", options_json}};
    write_numbers(s, stage_fields(), stage_json);
    stages_json.push_back(stage_json);
  }
  nlohmann::json table = {{"format", "remat-costs"}, {"version", 1},       {"granularity", granularity},
                          {"source", source},        {"threads", threads}, {"stages", stages_json}};
  write_numbers(*this, table_fields(), table);
  return table.dump(2);
}

CostTable CostTable::from_json(const std::string& text, const std::string& source_name) {
  const std::string expected = "a cost table written by CostTable::to_json";
  const nlohmann::json j = detail::parse_json_document(text, source_name, 8, expected);
  const detail::JsonFields top(j, source_name);
  REMAT_CHECK(j.contains("format") && j["format"] == "remat-costs" && j.contains("version") && j["version"] == 1,
              source_name, ": not a remat cost table (expected \"format\": \"remat-costs\", \"version\": 1).");
  CostTable table;
  table.granularity = top.string("granularity");
  table.source = top.string_or("source", source_name);
  table.threads = top.string_or("threads", "");
  read_numbers(top, table_fields(), table);
  const nlohmann::json& stages = top.array("stages");
  for (size_t i = 0; i < stages.size(); ++i) {
    const detail::JsonFields f(stages[i], source_name + ": stages[" + std::to_string(i) + "]");
    StageCost c;
    c.name = f.string("name");
    read_numbers(f, stage_fields(), c);
    c.block = f.integer_or("block", -1);
    const nlohmann::json& options = f.array("options");
    for (size_t k = 0; k < options.size(); ++k) {
      const detail::JsonFields o(options[k], f.where() + ".options[" + std::to_string(k) + "]");
      StageOptionCost oc;
      oc.option = o.string("option");
      read_numbers(o, run_fields(), static_cast<StageRunCost&>(oc));
      if (o.has("graph_only")) {
        oc.graph_only.emplace();
        read_numbers(detail::JsonFields(options[k]["graph_only"], o.where() + ".graph_only"), run_fields(),
                     *oc.graph_only);
      }
      c.options.push_back(oc);
    }
    table.stages.push_back(c);
  }
  // The one check of what the numbers mean, shared with tables built in code.
  table.check_well_formed(source_name);
  return table;
}

void CostTable::check_well_formed(const std::string& who) const {
  REMAT_CHECK(!stages.empty(), who, ": the cost table has no stages; give it one per stage of the chain.");
  // Each size is at most 2^53 bytes and so is their sum: no simulation or plan of the table can
  // overflow int64, however its sizes are combined.
  int64_t total = 0;
  check_numbers(
      *this, table_fields(), who, [] { return std::string(); }, total);
  const auto n = static_cast<int64_t>(stages.size());
  for (size_t i = 0; i < stages.size(); ++i) {
    const StageCost& c = stages[i];
    auto stage_label = [i] { return "stages[" + std::to_string(i) + "]"; };
    check_numbers(c, stage_fields(), who, stage_label, total);
    REMAT_CHECK(c.block >= -1 && c.block <= n, who, ": ", stage_label(), ": field 'block' must be -1 ",
                "(outside any block) or a block index below the number of stages, found ", c.block, ".");
    REMAT_CHECK(!c.options.empty(), who, ": ", stage_label(), ": stage '", detail::shortened(c.name),
                "' has no options; give it at least one, its default first.");
    for (size_t k = 0; k < c.options.size(); ++k) {
      const StageOptionCost& o = c.options[k];
      auto option_label = [&] { return stage_label() + ".options[" + std::to_string(k) + "]"; };
      check_numbers(static_cast<const StageRunCost&>(o), run_fields(), who, option_label, total);
      if (o.graph_only) {
        check_numbers(
            *o.graph_only, run_fields(), who, [&] { return option_label() + ".graph_only"; }, total);
      }
    }
  }
}

std::string CostTable::to_table() const {
  auto mib = [](int64_t bytes) { return fixed(mebibytes(bytes), 2); };
  auto ms = [](double seconds) { return fixed(seconds * 1e3, 2); };
  Table table({"stage", "option", "output", "kept", "fwd+", "bwd+", "nograd+", "fwd ms", "bwd ms", "± ms", "runs",
               "nograd ms", "recomp+ ms", "end fwd", "end kept"});
  int64_t total_kept = 0;
  for (const auto& s : stages) {
    for (size_t i = 0; i < s.options.size(); ++i) {
      const auto& o = s.options[i];
      const bool first = i == 0;  // the stage's own columns once, on its default option's row
      table.add_row({first ? s.name : "", o.option, first ? mib(s.output_bytes) : "", mib(o.kept_bytes),
                     mib(o.forward_extra_bytes), mib(o.backward_extra_bytes), first ? mib(s.nograd_extra_bytes) : "",
                     ms(o.forward_seconds), ms(o.backward_seconds), first ? ms(s.spread_seconds) : "",
                     first && s.measured_rounds > 0 ? std::to_string(s.measured_rounds) : "",
                     first ? ms(s.nograd_seconds) : "", first ? ms(s.recompute_extra_seconds) : "",
                     ms(o.at_segment_end().forward_seconds), mib(o.at_segment_end().kept_bytes)});
    }
    total_kept += s.options.front().kept_bytes;
  }
  std::ostringstream os;
  os << "costs (" << source << "), sizes in MiB, times in ms\n";
  if (!threads.empty()) os << "timed under " << threads << "\n";
  table.print(os);
  os << "each checkpointed segment: " << fixed(segment_forward_seconds * 1e6, 1) << " us forward, "
     << fixed(segment_backward_seconds * 1e6, 1) << " us backward by itself (± "
     << fixed(segment_spread_seconds * 1e6, 1) << " us), " << fixed(static_cast<double>(segment_bytes) / 1024, 1)
     << " KiB held\n";
  os << "total kept with every stage recorded (default options): " << mib(total_kept) << " MiB\n";
  os << "± ms: half-width of a ~95% interval of fwd + bwd within a step; runs: measured runs of the stage; "
        "recomp+: what a recompute for a backward adds to fwd; end fwd, end kept: as the last stage of a recomputed "
        "segment (graph-only: no output computed)\n";
  return os.str();
}

Plan CostTable::unchecked_plan(CheckpointMode mode) const {
  std::vector<std::string> names, defaults;
  for (const auto& stage : stages) {
    REMAT_CHECK(!stage.options.empty(), "the cost table's stage '", stage.name, "' has no options.");
    names.push_back(stage.name);
    defaults.push_back(stage.options.front().option);
  }
  return Plan::unchecked(granularity, std::move(names), std::move(defaults), mode);
}

void CostTable::scale_times(double factor) {
  detail::for_each_cost_number(
      *this, [factor](double& seconds) { seconds *= factor; }, [](int64_t&) {});
}

void CostTable::validate_against(const Chain& chain) const {
  check_well_formed();
  REMAT_CHECK(granularity == chain.granularity() && static_cast<int64_t>(stages.size()) == chain.size(),
              "the cost table describes ", stages.size(), " stages at granularity '", granularity,
              "' but the chain has ", chain.size(), " at '", chain.granularity(), "'; profile this model.");
  for (int64_t i = 0; i < chain.size(); ++i) {
    REMAT_CHECK(stages[i].name == chain.stages()[i].name, "the cost table's stage ", i, " is '", stages[i].name,
                "' but the chain's is '", chain.stages()[i].name, "'; profile this model.");
  }
}

}  // namespace remat
