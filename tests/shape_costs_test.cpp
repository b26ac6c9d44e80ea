// remat/planning/shape_costs.h: cost tables fitted across input shapes give every byte exactly at a
// shape held out (the analytic estimator's and a GPT profiled on this CPU), times close, plans equal;
// the fit saves and loads; bad fits and files are refused with what to do.
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/measure/profiler.h"
#include "remat/models/estimator.h"
#include "remat/models/gpt.h"
#include "remat/planning/planner.h"
#include "remat/planning/shape_costs.h"
#include "support/compare.h"
#include "support/cost_tables.h"
#include "support/tiny_gpt.h"

using remat::CostTable;
using remat::ShapeCosts;
using remat::ShapedCosts;
using remat::ShapeTerms;

namespace {

CostTable estimated(int64_t batch, int64_t length) {
  remat::models::GptConfig config;
  config.sequence(length);
  auto options = remat::models::EstimateOptions::as_run_by_libtorch(batch);
  return remat::models::estimate_gpt(config, options).costs;
}

}  // namespace

TEST(ShapeCosts, TheEstimatorsTablesAreFittedExactlyAndPlanAlike) {
  std::vector<ShapedCosts> samples;
  for (const auto& [b, t] :
       std::vector<std::pair<int64_t, int64_t>>{{8, 64}, {4, 256}, {8, 512}, {2, 128}, {1, 64}, {2, 512}, {6, 320}}) {
    samples.push_back({{b, t}, estimated(b, t)});
  }
  const ShapeCosts fitted = ShapeCosts::fit(samples, ShapeTerms::batch_and_length());
  for (const auto& [b, t] : std::vector<std::pair<int64_t, int64_t>>{{8, 256}, {3, 384}, {6, 96}}) {
    SCOPED_TRACE("batch " + std::to_string(b) + ", length " + std::to_string(t));
    const ShapedCosts held_out{{b, t}, estimated(b, t)};
    EXPECT_TRUE(fitted.covers(held_out.shape));
    const remat::ShapeFitCheck check = fitted.check(held_out);
    EXPECT_EQ(check.max_byte_error, 0) << check.worst_bytes;
    EXPECT_NEAR(check.step_seconds_error, 0, 1e-9);
    std::cout << "  held out at (" << b << ", " << t << "): transient extras off by up to " << check.max_transient_error
              << " bytes (" << check.worst_transient << "), unchecked peak " << 100 * check.peak_error << "%\n";
  }
  EXPECT_FALSE(fitted.covers({16, 256})) << "outside the batches fitted";
  EXPECT_EQ(fitted.terms().describe(), "1 + batch + length + length^2 + batch·length + batch·length^2");
}

// On this CPU, profiled: the tracking allocator's bytes are the model's, exactly polynomial in the
// shape. A tiny GPT at three (batch, length) shapes, checked at a fourth.
TEST(ShapeCosts, AProfiledGptsBytesAreExactAtAShapeHeldOut) {
  torch::manual_seed(0);
  remat::models::Gpt model(remat::testing::tiny_gpt(2, 64));
  auto profile = [&](int64_t batch, int64_t length) {
    const auto [tokens, targets] = remat::testing::random_batch(batch, length);
    remat::models::GptChain chain(model, remat::models::GptGranularity::half);
    chain.set_targets(targets);
    return ShapedCosts{{batch, length}, remat::profile_chain(chain, tokens, remat::ProfileOptions().repeats(1))};
  };
  const ShapeCosts fitted =
      ShapeCosts::fit({profile(4, 16), profile(2, 64), profile(4, 48), profile(1, 32), profile(2, 24), profile(3, 56)},
                      ShapeTerms::batch_and_length());
  const remat::ShapeFitCheck check = fitted.check(profile(3, 32));
  EXPECT_EQ(check.max_byte_error, 0) << check.worst_bytes;
  std::cout << "  profiled, held out: transient extras off by up to " << check.max_transient_error << " bytes ("
            << check.worst_transient << "), unchecked peak " << 100 * check.peak_error << "%\n";
}

TEST(ShapeCosts, SavesAndLoadsAndRefusesWhatIsNotAFit) {
  std::vector<ShapedCosts> samples;
  for (const auto& [b, t] :
       std::vector<std::pair<int64_t, int64_t>>{{8, 64}, {4, 128}, {4, 256}, {1, 64}, {2, 96}, {8, 512}}) {
    samples.push_back({{b, t}, estimated(b, t)});
  }
  const ShapeCosts fitted = ShapeCosts::fit(samples, ShapeTerms::batch_and_length());
  const ShapeCosts loaded = ShapeCosts::from_json(fitted.to_json(), "fit.json");
  EXPECT_EQ(loaded.at({5, 200}).to_json(), fitted.at({5, 200}).to_json());
  EXPECT_EQ(loaded.fitted_shapes(), fitted.fitted_shapes());

  REMAT_EXPECT_ERROR(ShapeCosts::from_json("{\"format\": \"remat-costs\", \"version\": 1}", "fit.json"),
                     "fit.json: not remat shape costs");
  std::string truncated = fitted.to_json();
  truncated.resize(truncated.size() / 2);
  REMAT_EXPECT_ERROR(ShapeCosts::from_json(truncated, "fit.json"), "fit.json");
  std::string wrong_rows = fitted.to_json();
  wrong_rows.replace(wrong_rows.find("\"coefficients\": ["), 17, "\"coefficients\": [[1, 2, 3],");
  REMAT_EXPECT_ERROR(ShapeCosts::from_json(wrong_rows, "fit.json"), "coefficient rows for a table of");

  REMAT_EXPECT_ERROR(ShapeCosts::fit({samples[0], samples[1]}, ShapeTerms::batch_and_length()),
                     "2 profiled shapes for 6 terms (1 + batch + length + length^2 + batch·length + batch·length^2); "
                     "give at least one shape per term");
  // Length fixed: batch·length and batch·length² move together, so the fit cannot tell them apart.
  std::vector<ShapedCosts> one_length;
  for (const int64_t b : {1, 2, 3, 4, 6, 8}) one_length.push_back({{b, 64}, estimated(b, 64)});
  REMAT_EXPECT_ERROR(ShapeCosts::fit(one_length, ShapeTerms::batch_and_length()),
                     "the shapes do not tell the terms apart");
  remat::models::GptConfig deeper;
  deeper.layers(9);
  samples.push_back(
      {{16, 64}, remat::models::estimate_gpt(deeper, remat::models::EstimateOptions::as_run_by_libtorch(16)).costs});
  REMAT_EXPECT_ERROR(ShapeCosts::fit(samples, ShapeTerms::batch_and_length()), "are not of one chain");
  REMAT_EXPECT_ERROR(fitted.at({8}), "the shape (8) has 1 values; the fit's dimensions are");
  REMAT_EXPECT_ERROR(fitted.at({0, 64}), "has a value outside [1, 2^24]");
}
