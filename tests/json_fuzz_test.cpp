// The two JSON loaders under a few thousand mutated inputs each (values of every wrong type and
// size swapped in anywhere, text cut, bytes flipped, deep nesting): every input either loads into
// something the simulator accepts or is refused with remat's own error naming the file. Never
// nlohmann-json's exception, a crash, a hang, or a table whose sums overflow.
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "remat/planning/cost_model.h"
#include "remat/chain/plan.h"

namespace {

constexpr int kMutationsPerLoader = 2500;

remat::CostTable four_stage_table() {
  remat::CostTable t;
  t.granularity = "toy";
  t.segment_bytes = 8;
  for (int i = 0; i < 4; ++i) {
    remat::StageCost s;
    s.name = "s" + std::to_string(i);
    s.output_bytes = 100 + i;
    s.input_grad_bytes = i == 0 ? 0 : 100 + i - 1;
    s.nograd_seconds = 0.5;
    s.nograd_extra_bytes = 10;
    s.parameter_bytes = 4;
    for (const char* name : {"full", "lean"}) {
      remat::StageOptionCost o;
      o.option = name;
      o.forward_seconds = 1;
      o.backward_seconds = 2;
      o.kept_bytes = 300;
      o.forward_extra_bytes = 20;
      o.backward_extra_bytes = 30;
      if (i == 3) o.graph_only = static_cast<remat::StageRunCost>(o);
      s.options.push_back(o);
    }
    t.stages.push_back(s);
  }
  return t;
}

remat::Plan nested_plan(const remat::CostTable& t) {
  remat::Plan p;
  p.granularity = t.granularity;
  for (const auto& s : t.stages) {
    p.stage_names.push_back(s.name);
    p.options.push_back("full");
  }
  using remat::PlanItem;
  p.items = {PlanItem::checkpointed({PlanItem::run(0), PlanItem::checkpointed({PlanItem::run(1)}), PlanItem::run(2)}),
             PlanItem::run(3)};
  return p;
}

nlohmann::json deep(int levels) {
  std::string text;
  for (int i = 0; i < levels; ++i) text += "[";
  for (int i = 0; i < levels; ++i) text += "]";
  return nlohmann::json::parse(text);
}

// Values a hostile or broken file puts where a field should be.
std::vector<nlohmann::json> hostile_values() {
  return {nullptr,
          true,
          -1,
          0,
          1,
          1.5,
          -0.0,
          1e30,
          -1e30,
          INT64_MAX,
          INT64_MIN,
          uint64_t{1} << 63,
          (int64_t{1} << 53) + 1,
          "",
          "x",
          std::string(10000, 'a'),
          "full",
          "s0",
          "checkpoint",
          nlohmann::json::array(),
          nlohmann::json::object(),
          nlohmann::json::array({1, "a"}),
          nlohmann::json{{"checkpoint", nlohmann::json::array()}},
          deep(2000)};
}

// Every value of the document, by pointer (iteratively), so one can be replaced.
std::vector<nlohmann::json::json_pointer> all_pointers(const nlohmann::json& root) {
  std::vector<nlohmann::json::json_pointer> out, stack{nlohmann::json::json_pointer()};
  while (!stack.empty()) {
    auto p = stack.back();
    stack.pop_back();
    out.push_back(p);
    const auto& v = root[p];
    if (v.is_object()) {
      for (const auto& [key, _] : v.items()) stack.push_back(p / key);
    } else if (v.is_array()) {
      for (size_t i = 0; i < v.size(); ++i) stack.push_back(p / i);
    }
  }
  return out;
}

std::string mutate(const nlohmann::json& valid, std::mt19937& rng) {
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  const std::string text = valid.dump();
  switch (pick(5)) {
    case 0: {  // a hostile value anywhere
      nlohmann::json doc = valid;
      const auto pointers = all_pointers(doc);
      const auto values = hostile_values();
      doc[pointers[pick(pointers.size())]] = values[pick(values.size())];
      return doc.dump();
    }
    case 1: {  // a field removed
      nlohmann::json doc = valid;
      const auto pointers = all_pointers(doc);
      const auto target = pointers[pick(pointers.size())];
      if (target.empty()) return "{}";
      auto& parent = doc[target.parent_pointer()];
      if (parent.is_object())
        parent.erase(target.back());
      else
        parent.erase(static_cast<size_t>(std::stoul(target.back())));
      return doc.dump();
    }
    case 2:  // cut short
      return text.substr(0, pick(text.size()));
    case 3: {  // a few bytes flipped
      std::string t = text;
      for (int k = 0; k < 3; ++k) t[pick(t.size())] = static_cast<char>(pick(256));
      return t;
    }
    default: {  // two documents' fields mixed: a value from one place put in another
      nlohmann::json doc = valid;
      const auto pointers = all_pointers(doc);
      doc[pointers[pick(pointers.size())]] = nlohmann::json(doc[pointers[pick(pointers.size())]]);
      return doc.dump();
    }
  }
}

// Loads `text`; on success runs `use` on the result. Anything thrown must be remat's own error.
template <typename Load, typename Use>
void expect_loaded_or_refused_clearly(const std::string& text, const std::string& source, Load&& load, Use&& use) {
  try {
    use(load(text));
  } catch (const c10::Error& e) {
    const std::string message = e.what_without_backtrace();
    EXPECT_EQ(message.rfind("remat: ", 0), 0u) << message;
    EXPECT_NE(message.find(source), std::string::npos) << "the error does not name the file: " << message;
    EXPECT_LT(message.size(), 2000u) << "the error echoes too much of the input: " << message.substr(0, 200);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "a raw exception escaped: " << e.what() << "\ninput: " << text.substr(0, 300);
  }
}

}  // namespace

TEST(JsonFuzz, MutatedCostTablesLoadSanelyOrAreRefusedNamingTheFile) {
  const remat::CostTable table = four_stage_table();
  const remat::Plan plan = nested_plan(table);
  const nlohmann::json valid = nlohmann::json::parse(table.to_json());
  std::mt19937 rng(2026);
  for (int i = 0; i < kMutationsPerLoader; ++i) {
    expect_loaded_or_refused_clearly(
        mutate(valid, rng), "costs.json",
        [](const std::string& t) { return remat::CostTable::from_json(t, "costs.json"); },
        [&](const remat::CostTable& loaded) {
          if (loaded.stages.size() != plan.stage_names.size()) return;
          remat::Plan p = plan;
          for (size_t s = 0; s < p.options.size(); ++s) p.options[s] = loaded.stages[s].options.front().option;
          for (size_t s = 0; s < p.stage_names.size(); ++s) p.stage_names[s] = loaded.stages[s].name;
          const remat::Prediction prediction = remat::simulate(p, loaded);
          EXPECT_GE(prediction.peak_bytes, 0) << "the simulator's sums overflowed";
          EXPECT_LE(prediction.peak_bytes, int64_t{1} << 55);
        });
  }
}

TEST(JsonFuzz, MutatedPlansLoadSanelyOrAreRefusedNamingTheFile) {
  const remat::CostTable table = four_stage_table();
  const nlohmann::json valid = nlohmann::json::parse(nested_plan(table).to_json());
  std::mt19937 rng(52744);
  for (int i = 0; i < kMutationsPerLoader; ++i) {
    expect_loaded_or_refused_clearly(
        mutate(valid, rng), "plan.json", [](const std::string& t) { return remat::Plan::from_json(t, "plan.json"); },
        [&](const remat::Plan& loaded) {
          if (loaded.stage_names.size() != table.stages.size()) return;
          remat::CostTable t = table;
          for (size_t s = 0; s < t.stages.size(); ++s) {
            t.stages[s].name = loaded.stage_names[s];
            for (auto& o : t.stages[s].options) o.option = loaded.options[s];
          }
          EXPECT_GE(remat::simulate(loaded, t).peak_bytes, 0);
        });
  }
}

TEST(JsonLoaders, NameTheFileAndTheFieldForEachKindOfBadValue) {
  const nlohmann::json valid = nlohmann::json::parse(four_stage_table().to_json());
  auto error_for = [&](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json doc = valid;
    change(doc);
    try {
      remat::CostTable::from_json(doc.dump(), "costs.json");
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  auto expect_all = [](const std::string& message, std::vector<std::string> fragments) {
    for (const auto& f : fragments) EXPECT_NE(message.find(f), std::string::npos) << "'" << f << "' not in " << message;
  };
  // 1e30 is not "negative"; INT64_MAX on every option no longer overflows into a plan that "fits".
  expect_all(error_for([](nlohmann::json& d) { d["stages"][0]["options"][1]["kept_bytes"] = 1e30; }),
             {"costs.json: stages[0].options[1]: field 'kept_bytes'", "from 0 to 2^53", "(not an integer)"});
  expect_all(error_for([](nlohmann::json& d) {
               for (auto& s : d["stages"]) {
                 for (auto& o : s["options"]) o["forward_extra_bytes"] = INT64_MAX;
               }
             }),
             {"stages[0].options[0]: field 'forward_extra_bytes'", "2^53"});
  expect_all(error_for([](nlohmann::json& d) {
               for (auto& s : d["stages"]) s["output_bytes"] = (int64_t{1} << 52);
             }),
             {"add up to more than 2^53 bytes", "stages[1]"});
  expect_all(error_for([](nlohmann::json& d) { d["stages"][2]["name"] = 7; }),
             {"costs.json: stages[2]: field 'name' must be a string, found 7"});
  expect_all(error_for([](nlohmann::json& d) { d["stages"][2]["nograd_seconds"] = "fast"; }),
             {"field 'nograd_seconds' must be a number of seconds", "\"fast\""});
  expect_all(error_for([](nlohmann::json& d) { d["format"] = 5; }), {"costs.json: not a remat cost table"});
  expect_all(error_for([](nlohmann::json& d) { d["stages"][1].erase("options"); }),
             {"stages[1]: field 'options' is missing"});

  nlohmann::json plan = nlohmann::json::parse(nested_plan(four_stage_table()).to_json());
  plan["version"] = "1";
  try {
    remat::Plan::from_json(plan.dump(), "plan.json");
    FAIL() << "a string version was accepted";
  } catch (const c10::Error& e) {
    expect_all(e.what_without_backtrace(), {"plan.json: plan format version \"1\" is not supported"});
  }
}
