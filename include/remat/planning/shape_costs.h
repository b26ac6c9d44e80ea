// remat/planning/shape_costs.h — costs that follow the input's shape: cost tables profiled at a few
// shapes, fitted stage by stage, instantiated for any shape without running the model.
//
//   // Profiled at six or more (batch, length) shapes: bytes are sums of 1, B, T, T², B·T, B·T².
//   remat::ShapeCosts fitted = remat::ShapeCosts::fit(profiles, remat::ShapeTerms::batch_and_length());
//   remat::CostTable at_384 = fitted.at({8, 384});          // no step run; microseconds
//   remat::ShapeFitCheck check = fitted.check({{8, 384}, profiled_at_384});   // held out: 0 bytes off
//
// Every byte count of the table a plan holds (a stage's output, what each option keeps, gradients,
// the segment's) is a polynomial in the shape's dimensions with the terms given, fitted exactly
// (least squares over at least as many shapes as terms, rounded to whole bytes); the transient
// extras, each the largest of several buffers, are fitted alike and exact only within one regime
// (ShapeFitCheck says by how much they miss: verify a plan made on them); every time is fitted by
// least squares with the same terms (at least 0), its spread scaled with it. Names, options, blocks
// and granularity must agree across the tables: they are the chain's, not the shape's. A fit is saved
// as JSON ("remat-shape-costs", version 1) and read back with the same checks; `covers` says whether a
// shape lies within the fitted range (extrapolated times are guesses: profile such a shape instead).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "remat/planning/cost_model.h"

namespace remat {

/// The monomials a cost is a sum of: each term's exponent per shape dimension.
struct ShapeTerms {
  std::vector<std::string> dimensions;          ///< "batch", "length"
  std::vector<std::vector<int64_t>> exponents;  ///< one per term, one exponent per dimension

  /// batch: 1, B (a model whose activations scale with the batch alone).
  static ShapeTerms batch_only();
  /// length, at one batch size: 1, T, T² (a Transformer trained on sequences of varying length;
  /// three lengths tell the terms apart).
  static ShapeTerms length_only();
  /// (batch, length): 1, B, T, T², B·T, B·T² (a Transformer: per sequence, per position, the causal
  /// mask, per token, attention scores per pair of tokens).
  static ShapeTerms batch_and_length();
  /// Of the lengths to be run, those to profile for length_only(): the least, the middle and the
  /// greatest (three tell 1, T and T² apart), or every distinct one where there are at most three
  /// (then nothing is fitted); sorted.
  static std::vector<int64_t> lengths_to_profile(std::vector<int64_t> lengths);
  /// "1 + batch·length + batch·length^2".
  std::string describe() const;
};

/// A cost table and the shape it was profiled at (one value per ShapeTerms dimension).
struct ShapedCosts {
  std::vector<int64_t> shape;
  CostTable costs;
};

/// How far a fit lies from a table profiled at a shape it was not fitted on.
struct ShapeFitCheck {
  /// The largest |fitted − profiled| over the bytes held (outputs, what each option keeps, gradients,
  /// parameters, the segment's): polynomials in the shape, so 0 where the terms are right.
  int64_t max_byte_error = 0;
  std::string worst_bytes;  ///< where: "stages[1] conv1.options[0] full.kept_bytes: 10 fitted, 12 profiled"
  /// The same over the transient extras (forward_extra_bytes, backward_extra_bytes, nograd_extra_bytes):
  /// each is the largest of several buffers alive at once, a maximum of polynomials, exact only
  /// where the same buffer peaks at every shape fitted (profile shapes of one regime, or verify).
  int64_t max_transient_error = 0;
  std::string worst_transient;
  double peak_error = 0;          ///< simulated unchecked peak, fitted over profiled, minus one
  double step_seconds_error = 0;  ///< simulated unchecked step time, fitted over profiled, minus one
};

class ShapeCosts {
 public:
  /// Fits `samples` (at least as many distinct shapes as terms, every table of the same chain).
  static ShapeCosts fit(const std::vector<ShapedCosts>& samples, ShapeTerms terms);
  /// The cost table at `shape` (one positive value per dimension).
  CostTable at(const std::vector<int64_t>& shape) const;
  /// Whether every dimension of `shape` lies within the fitted shapes' range.
  bool covers(const std::vector<int64_t>& shape) const;
  ShapeFitCheck check(const ShapedCosts& held_out) const;

  const ShapeTerms& terms() const { return terms_; }
  const std::vector<std::vector<int64_t>>& fitted_shapes() const { return shapes_; }

  std::string to_json() const;
  static ShapeCosts from_json(const std::string& text, const std::string& source_name = "shape costs");

 private:
  ShapeTerms terms_;
  std::vector<std::vector<int64_t>> shapes_;
  CostTable template_;                             ///< the first table: names, options, blocks
  std::vector<std::vector<double>> coefficients_;  ///< per number of the table (its walk's order), per term
};

}  // namespace remat
