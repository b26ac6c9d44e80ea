#include "remat/chain/plan.h"

#include <algorithm>
#include <unordered_map>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "checkpoint/recompute_state.h"
#include "remat/checkpoint/checkpoint.h"
#include "base/json_fields.h"
#include "remat/base/error.h"
#include "base/json_nesting.h"

namespace remat {

namespace {

std::vector<std::string> chain_names_of(const Chain& chain) {
  std::vector<std::string> names;
  for (const auto& s : chain.stages()) names.push_back(s.name);
  return names;
}

// For error messages: a file's names may be long or many.
std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) {
    if (out.size() > 300) return out + " ...";
    out += (out.empty() ? "" : " ") + detail::shortened(n);
  }
  return out;
}

void append_compact(const Plan& plan, const std::vector<PlanItem>& items, std::string& out) {
  for (const auto& item : items) {
    if (!out.empty() && out.back() != '[') out += ' ';
    if (item.is_stage()) {
      out += plan.stage_names.at(item.stage);
      const std::string& option = plan.options.at(item.stage);
      if (plan.default_options.empty() || option != plan.default_options.at(item.stage)) out += ":" + option;
    } else {
      out += '[';
      append_compact(plan, item.segment, out);
      out += ']';
    }
  }
}

nlohmann::json items_to_json(const Plan& plan, const std::vector<PlanItem>& items) {
  nlohmann::json array = nlohmann::json::array();
  for (const auto& item : items) {
    if (item.is_stage()) {
      array.push_back(plan.stage_names.at(item.stage));
    } else {
      array.push_back({{"checkpoint", items_to_json(plan, item.segment)}});
    }
  }
  return array;
}

// Checks that `items` run stages next, next+1, ... in order; advances `next`. Recursive: the
// plan's nesting is checked first (Plan::check_nesting).
void check_coverage(const std::vector<PlanItem>& items, const Plan& plan, int64_t& next, const std::string& source) {
  const auto n = static_cast<int64_t>(plan.stage_names.size());
  for (const auto& item : items) {
    if (item.is_stage()) {
      REMAT_CHECK(item.stage < n, source, ": an item runs stage ", item.stage, " but the plan has ", n,
                  " stages (indices 0 to ", n - 1, "); give each stage i of the chain one item, ",
                  "PlanItem::run(i), in chain order.");
      REMAT_CHECK(item.stage == next, source, ": stages must appear once each, in chain order; expected '",
                  next < n ? detail::shortened(plan.stage_names[next]) : std::string("<end>"), "' but found '",
                  detail::shortened(plan.stage_names[item.stage]), "'.");
      ++next;
    } else {
      REMAT_CHECK(!item.segment.empty(), source, ": a checkpointed segment is empty; give it at least one stage.");
      check_coverage(item.segment, plan, next, source);
    }
  }
}

// Each stage's index by name (the first of repeated names), so that reading a plan is linear in its size.
using StageIndex = std::unordered_map<std::string, int64_t>;

std::vector<PlanItem> items_from_json(const nlohmann::json& array, const std::vector<std::string>& names,
                                      const StageIndex& index, const std::string& source) {
  REMAT_CHECK(array.is_array(), source, ": a plan or segment must be a JSON array of stage names and ",
              "{\"checkpoint\": [...]} objects.");
  std::vector<PlanItem> items;
  for (const auto& element : array) {
    if (element.is_string()) {
      const auto name = element.get<std::string>();
      const auto it = index.find(name);
      REMAT_CHECK(it != index.end(), source, ": unknown stage '", detail::shortened(name),
                  "'; the plan's stages are: ", join_names(names), ".");
      items.push_back(PlanItem::run(it->second));
    } else {
      REMAT_CHECK(element.is_object() && element.size() == 1 && element.contains("checkpoint"), source,
                  ": expected a stage name or {\"checkpoint\": [...]}, found ", detail::describe_json(element), ".");
      items.push_back(PlanItem::checkpointed(items_from_json(element["checkpoint"], names, index, source)));
    }
  }
  return items;
}

// A SAX pass that builds nothing: it counts the elements of each list in the plan object (stages,
// options, plan items) and stops at the first beyond `most`, so that a huge file for a small model
// costs a scan of its start, not a parse of the whole.
class ListLengthCheck : public nlohmann::json::json_sax_t {
 public:
  explicit ListLengthCheck(int64_t most) : most_(most) {}
  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override {
    if (!value()) return false;
    counts_.push_back(-1);  // an object: its members are not counted
    return true;
  }
  bool key(string_t& key) override {
    if (counts_.size() == 1) key_ = key;
    return true;
  }
  bool end_object() override { return pop(); }
  bool start_array(std::size_t) override {
    if (!value()) return false;
    counts_.push_back(0);
    return true;
  }
  bool end_array() override { return pop(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;  // the real parse says what is wrong
  }
  bool too_long() const { return too_long_; }
  const std::string& list() const { return list_; }

 private:
  // Counts a value in the enclosing list; false (stop) once a list of the plan object is too long.
  bool value() {
    if (counts_.size() == 2 && counts_.back() >= 0 && ++counts_.back() > most_) {
      too_long_ = true;
      list_ = key_;
      return false;
    }
    return true;
  }
  bool pop() {
    if (!counts_.empty()) counts_.pop_back();
    return true;
  }
  int64_t most_;
  std::vector<int64_t> counts_;
  std::string key_, list_;
  bool too_long_ = false;
};

void refuse_longer_lists(const std::string& text, const std::string& source, int64_t most) {
  ListLengthCheck check(most);
  nlohmann::json::sax_parse(text, &check, nlohmann::json::input_format_t::json, /*strict=*/false);
  REMAT_CHECK(!check.too_long(), source, ": field '", detail::shortened(check.list()), "' lists more than ", most,
              " entries, but this model's chains have at most ", most, " stages: the plan was made for another model. ",
              "Make the plan for this model.");
}

void collect_depths(const std::vector<PlanItem>& items, int64_t depth, std::vector<int64_t>& out) {
  for (const auto& item : items) {
    if (item.is_stage()) {
      out.at(item.stage) = depth;
    } else {
      collect_depths(item.segment, depth + 1, out);
    }
  }
}

// What a plan's checkpointed segments hold until their recomputes have run, in backward.
struct PlanRun {
  Chain* chain = nullptr;
  std::shared_ptr<Chain> owner;     // the shared_ptr form of run_plan: keeps *chain alive
  std::weak_ptr<const void> alive;  // *chain's lifetime, for the reference form
  Plan plan;
};

at::Tensor run_items(const std::shared_ptr<const PlanRun>& run, const std::vector<PlanItem>& items, at::Tensor x,
                     bool graph_only);

// `graph_only`: the item is the last of a segment recomputed for its backward, whose result only
// roots the graph; a stage then runs graph-only, stopping early.
at::Tensor run_item(const std::shared_ptr<const PlanRun>& run, const PlanItem& item, const at::Tensor& x,
                    bool graph_only) {
  Chain& chain = *run->chain;
  const Plan& plan = run->plan;
  if (item.is_stage()) return chain.run_stage(item.stage, x, plan.options[item.stage], graph_only, run->owner);
  const std::vector<PlanItem>* segment = &item.segment;  // lives in run->plan, which the lambda holds
  const auto [first, last] = stage_range(*segment);
  std::string name = plan.stage_names[first] + (first == last ? "" : ".." + plan.stage_names[last]);
  std::vector<at::Tensor> buffers;
  for (int64_t s = first; s <= last; ++s) {
    for (auto& b : chain.stage_buffers(s)) buffers.push_back(std::move(b));
  }
  return checkpoint(
      [run, segment, name](const at::Tensor& in) {
        // A chain made in a function that returns the loss is gone by backward: say so, rather
        // than call into freed memory.
        REMAT_CHECK(!run->alive.expired(), "run_plan: the chain was destroyed before backward recomputed its ",
                    "checkpointed segment '", name, "'. A segment's recompute runs the chain's stages in backward: ",
                    "keep the chain (e.g. the SequentialChain) alive until backward has run (make it outside ",
                    "the function that returns the loss, or call backward inside it), or give run_plan a ",
                    "std::shared_ptr to it, which it holds until then.");
        // This lambda is the checkpoint's function: what it returns is exactly what the
        // checkpoint's backward discards. Only it reads the flag (nested checkpoints' forward
        // calls reset it), and it passes it to its last stage alone.
        return run_items(run, *segment, in, detail::recomputing_graph_only());
      },
      x,
      CheckpointOptions()
          .name(name)
          .restore_after_recompute(std::move(buffers))
          .mode(plan.mode)
          // A reentrant segment checks its parameters' versions itself and recomputes its last
          // stage graph-only, which a call-by-call check would refuse; a non-reentrant one checks.
          .check_reads(plan.mode == CheckpointMode::non_reentrant));
}

// `graph_only`: the items are a segment recomputed for its backward (see run_item).
at::Tensor run_items(const std::shared_ptr<const PlanRun>& run, const std::vector<PlanItem>& items, at::Tensor x,
                     bool graph_only) {
  for (size_t i = 0; i < items.size(); ++i) x = run_item(run, items[i], x, graph_only && i + 1 == items.size());
  return x;
}

at::Tensor run_observed(Chain& chain, std::shared_ptr<Chain> owner, const Plan& plan, const at::Tensor& input,
                        const PlanItemObserver& observer) {
  // By name and granularity, not only by count: a plan of another chain of the same length would
  // otherwise run, checkpointing the wrong stages.
  plan.validate_against(chain);
  // Segments' recomputes run during backward, after this returns: they hold the plan themselves.
  auto run = std::make_shared<const PlanRun>(PlanRun{&chain, std::move(owner), chain.lifetime(), plan});
  at::Tensor x = input;
  for (size_t k = 0; k < run->plan.items.size(); ++k) {
    if (observer.before) observer.before(k);
    x = run_item(run, run->plan.items[k], x, /*graph_only=*/false);
    if (observer.after) observer.after(k, x);
  }
  return x;
}

}  // namespace

std::pair<int64_t, int64_t> stage_range(const std::vector<PlanItem>& items) {
  int64_t first = -1, last = -1;
  for (const auto& item : items) {
    const auto [f, l] = item.is_stage() ? std::make_pair(item.stage, item.stage) : stage_range(item.segment);
    if (f < 0) continue;
    if (first < 0) first = f;
    last = l;
  }
  return {first, last};
}

Plan Plan::unchecked(std::string granularity, std::vector<std::string> stage_names,
                     std::vector<std::string> default_options, CheckpointMode mode) {
  REMAT_CHECK(default_options.size() == stage_names.size(),
              "an unchecked plan needs one default option per stage: ", stage_names.size(), " stages, ",
              default_options.size(), " options.");
  Plan plan;
  plan.granularity = std::move(granularity);
  plan.stage_names = std::move(stage_names);
  plan.options = default_options;
  plan.default_options = std::move(default_options);
  plan.mode = mode;
  for (size_t i = 0; i < plan.stage_names.size(); ++i) plan.items.push_back(PlanItem::run(static_cast<int64_t>(i)));
  return plan;
}

Plan Plan::unchecked(const Chain& chain) {
  std::vector<std::string> names, defaults;
  for (const auto& stage : chain.stages()) {
    REMAT_CHECK(!stage.options.empty(), "stage '", stage.name,
                "' lists no options; give it at least one (its default).");
    names.push_back(stage.name);
    defaults.push_back(stage.options.front());
  }
  return unchecked(chain.granularity(), std::move(names), std::move(defaults));
}

Plan Plan::without_checkpoints() const {
  Plan plain = unchecked(granularity, stage_names, default_options.empty() ? options : default_options, mode);
  if (default_options.empty()) plain.default_options.clear();  // still unknown
  return plain;
}

std::string Plan::to_string() const {
  std::string out;
  append_compact(*this, items, out);
  if (mode == CheckpointMode::non_reentrant) out += " (non-reentrant)";
  return out;
}

std::string Plan::to_json() const {
  nlohmann::json j = {{"format", "remat-plan"}, {"version", 1},       {"granularity", granularity},
                      {"stages", stage_names},  {"options", options}, {"plan", items_to_json(*this, items)}};
  if (!default_options.empty()) j["default_options"] = default_options;
  j["checkpoint_mode"] = remat::to_string(mode);
  return j.dump(2);
}

Plan Plan::from_json(const std::string& text, const std::string& source, int64_t max_stages) {
  // Before any parse: brackets nest one deeper than the values json_deeper_than counts below.
  check_json_nesting(text, source, 2 * kMaxNesting + 3, "a plan written by Plan::to_json");
  if (max_stages >= 0) refuse_longer_lists(text, source, max_stages);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    REMAT_CHECK(false, source, ": not valid JSON (", detail::describe_parse_error(e),
                "). Expected a plan written by Plan::to_json.");
  }
  REMAT_CHECK(!detail::json_deeper_than(j, 2 * kMaxNesting + 2), source, ": the JSON nests deeper than any plan can (",
              kMaxNesting, " checkpoint levels at most). Expected a plan written by Plan::to_json.");
  REMAT_CHECK(j.is_object() && j.contains("format") && j["format"] == "remat-plan", source,
              ": not a remat plan (expected an object with \"format\": \"remat-plan\").");
  REMAT_CHECK(j.contains("version") && j["version"] == 1, source, ": plan format version ",
              j.contains("version") ? detail::describe_json(j["version"]) : std::string("(none)"),
              " is not supported; this remat reads version 1.");
  auto require = [&](const char* field, bool ok, const char* what) {
    REMAT_CHECK(j.contains(field) && ok, source, ": field '", field, "' must be ", what, ".");
  };
  require("granularity", j.contains("granularity") && j["granularity"].is_string(),
          "a string (the chain's granularity)");
  require("stages", j.contains("stages") && j["stages"].is_array() && !j["stages"].empty(),
          "a non-empty array of stage names");
  require("options", j.contains("options") && j["options"].is_array(), "an array with one option name per stage");
  require("plan", j.contains("plan") && j["plan"].is_array(), "an array of stage names and {\"checkpoint\": [...]}");
  Plan plan;
  plan.granularity = j["granularity"].get<std::string>();
  for (const auto& s : j["stages"]) {
    REMAT_CHECK(s.is_string(), source, ": field 'stages' must hold strings, found ", detail::describe_json(s), ".");
    plan.stage_names.push_back(s.get<std::string>());
  }
  for (const auto& o : j["options"]) {
    REMAT_CHECK(o.is_string(), source, ": field 'options' must hold strings, found ", detail::describe_json(o), ".");
    plan.options.push_back(o.get<std::string>());
  }
  REMAT_CHECK(plan.options.size() == plan.stage_names.size(), source, ": 'options' has ", plan.options.size(),
              " entries but there are ", plan.stage_names.size(), " stages; give one option per stage.");
  if (j.contains("default_options")) {
    const auto& defaults = j["default_options"];
    REMAT_CHECK(
        defaults.is_array() && defaults.size() == plan.stage_names.size() &&
            std::all_of(defaults.begin(), defaults.end(), [](const nlohmann::json& d) { return d.is_string(); }),
        source, ": field 'default_options' must be an array of ", plan.stage_names.size(),
        " option names, one per stage.");
    for (const auto& d : defaults) plan.default_options.push_back(d.get<std::string>());
  }
  if (j.contains("checkpoint_mode")) {  // absent in plans written before the mode existed: reentrant
    const auto& mode = j["checkpoint_mode"];
    try {
      REMAT_CHECK(mode.is_string(), "not a string");
      plan.mode = parse_checkpoint_mode(mode.get<std::string>());
    } catch (const c10::Error&) {
      REMAT_CHECK(false, source, ": field 'checkpoint_mode' must be \"reentrant\" or \"non-reentrant\", found ",
                  detail::describe_json(mode), ".");
    }
  }
  // {"checkpoint": [...]} is two JSON levels per segment; the field itself, one more.
  const int64_t most = std::min<int64_t>(static_cast<int64_t>(plan.stage_names.size()), kMaxNesting);
  REMAT_CHECK(!detail::json_deeper_than(j["plan"], 2 * most + 1), source, ": field 'plan' nests checkpoints more than ",
              most, " levels deep; a plan of ", plan.stage_names.size(), " stages can use at most ", most,
              " (one stage per level; remat accepts at most ", kMaxNesting, ").");
  StageIndex index;
  index.reserve(plan.stage_names.size());
  for (size_t i = 0; i < plan.stage_names.size(); ++i) index.emplace(plan.stage_names[i], static_cast<int64_t>(i));
  plan.items = items_from_json(j["plan"], plan.stage_names, index, source);
  // The checks of its structure, shared with plans built in code.
  plan.check_well_formed(source);
  return plan;
}

void Plan::check_well_formed(const std::string& who) const {
  const auto n = static_cast<int64_t>(stage_names.size());
  REMAT_CHECK(n >= 1, who, ": the plan has no stages; give it the chain's stage names, in order.");
  REMAT_CHECK(options.size() == stage_names.size(), who, ": the plan has ", options.size(),
              " stage options (Plan::options) for ", n, " stages; give one option per stage (its default where ",
              "nothing else: CostTable::unchecked_plan and Plan::unchecked start from those).");
  REMAT_CHECK(default_options.empty() || default_options.size() == stage_names.size(), who, ": the plan has ",
              default_options.size(), " default options (Plan::default_options) for ", n,
              " stages; give one per stage, or none.");
  check_nesting(who);
  int64_t next = 0;
  check_coverage(items, *this, next, who);
  REMAT_CHECK(next == n, who, ": the plan stops at stage '", detail::shortened(stage_names[next]),
              "'; it must cover every stage.");
}

void Plan::validate_against(const Chain& chain) const {
  // The count before any name: a plan file of a million names for a chain of six is refused at once.
  const bool same_count = static_cast<int64_t>(stage_names.size()) == chain.size();
  const std::vector<std::string> chain_names = chain_names_of(chain);
  REMAT_CHECK(same_count && granularity == chain.granularity() && stage_names == chain_names,
              "the plan was made for a chain of ", stage_names.size(), " stages at granularity '",
              detail::shortened(granularity), "' (", join_names(stage_names), ") but this model's chain has ",
              chain_names.size(), " stages at granularity '", chain.granularity(), "' (", join_names(chain_names),
              "). Make the plan for this chain: the same stages at the same ", "granularity.");
  check_well_formed("the plan");
  for (size_t i = 0; i < options.size(); ++i) {
    const auto allowed = chain.accepted_options(static_cast<int64_t>(i));
    REMAT_CHECK(std::find(allowed.begin(), allowed.end(), options[i]) != allowed.end(), "stage '", chain_names[i],
                "' has no option '", options[i], "'; it offers: ", join_names(allowed), ".");
  }
}

void Plan::check_nesting(const std::string& who) const {
  const int64_t most = std::min<int64_t>(static_cast<int64_t>(stage_names.size()), kMaxNesting);
  std::vector<std::pair<const std::vector<PlanItem>*, int64_t>> stack{{&items, 0}};
  while (!stack.empty()) {
    const auto [level, depth] = stack.back();
    stack.pop_back();
    REMAT_CHECK(depth <= most, who, ": checkpointed segments nest more than ", most, " levels deep; a plan of ",
                stage_names.size(), " stages can use at most ", most, " (one stage per level; remat accepts at most ",
                kMaxNesting, ").");
    for (const auto& item : *level) {
      if (!item.is_stage()) stack.emplace_back(&item.segment, depth + 1);
    }
  }
}

void Plan::bind_to(const Chain& chain) {
  validate_against(chain);
  default_options.clear();
  for (const auto& stage : chain.stages()) default_options.push_back(stage.options.at(0));
}

std::vector<int64_t> Plan::recompute_depths() const {
  std::vector<int64_t> depths(stage_names.size(), 0);
  collect_depths(items, 0, depths);
  return depths;
}

at::Tensor run_plan(Chain& chain, const Plan& plan, const at::Tensor& input) {
  return run_observed(chain, nullptr, plan, input, {});
}

at::Tensor run_plan(std::shared_ptr<Chain> chain, const Plan& plan, const at::Tensor& input) {
  REMAT_CHECK(chain != nullptr, "run_plan: the chain is null; give it the chain the plan was made for.");
  Chain& held = *chain;
  return run_observed(held, std::move(chain), plan, input, {});
}

at::Tensor run_plan_observed(Chain& chain, const Plan& plan, const at::Tensor& input,
                             const PlanItemObserver& observer) {
  return run_observed(chain, nullptr, plan, input, observer);
}

}  // namespace remat
