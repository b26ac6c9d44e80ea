#include "remat/planning/shape_costs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "base/json_fields.h"
#include "planning/cost_numbers.h"
#include "remat/base/error.h"

namespace remat {
namespace {

constexpr int64_t kMaxDimensions = 8;
constexpr int64_t kMaxTerms = 16;
constexpr int64_t kMaxSamples = 64;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + ")";
}

void check_terms(const ShapeTerms& terms, const std::string& who) {
  const auto dims = static_cast<int64_t>(terms.dimensions.size());
  REMAT_CHECK(dims >= 1 && dims <= kMaxDimensions, who, ": the shape terms name ", dims, " dimensions; give 1 to ",
              kMaxDimensions, " (\"batch\", \"length\").");
  const auto count = static_cast<int64_t>(terms.exponents.size());
  REMAT_CHECK(count >= 1 && count <= kMaxTerms, who, ": ", count, " shape terms; give 1 to ", kMaxTerms, ".");
  for (const auto& term : terms.exponents) {
    REMAT_CHECK(static_cast<int64_t>(term.size()) == dims, who, ": a term has ", term.size(), " exponents for ", dims,
                " dimensions.");
    for (const int64_t e : term) REMAT_CHECK(e >= 0 && e <= 4, who, ": exponents lie in [0, 4], got ", e, ".");
  }
}

void check_shape(const ShapeTerms& terms, const std::vector<int64_t>& shape, const std::string& who) {
  REMAT_CHECK(shape.size() == terms.dimensions.size(), who, ": the shape ", shape_text(shape), " has ", shape.size(),
              " values; the fit's dimensions are ", terms.describe(), " (one value each).");
  for (const int64_t v : shape) {
    REMAT_CHECK(v >= 1 && v <= (int64_t{1} << 24), who, ": the shape ", shape_text(shape),
                " has a value outside [1, 2^24].");
  }
}

// The terms' values at a shape (least_squares scales them to condition the system it solves).
std::vector<double> term_values(const ShapeTerms& terms, const std::vector<int64_t>& shape) {
  std::vector<double> out;
  for (const auto& term : terms.exponents) {
    double v = 1;
    for (size_t d = 0; d < term.size(); ++d) v *= std::pow(static_cast<double>(shape[d]), static_cast<double>(term[d]));
    out.push_back(v);
  }
  return out;
}

// Least squares: the coefficients c minimising |A c − y| (A: samples × terms, full column rank),
// by the normal equations on columns scaled to at most 1, solved with partial pivoting.
std::vector<std::vector<double>> least_squares(const std::vector<std::vector<double>>& a,
                                               const std::vector<std::vector<double>>& ys) {
  const size_t rows = a.size(), cols = a[0].size();
  std::vector<double> scale(cols, 0);
  for (const auto& row : a) {
    for (size_t j = 0; j < cols; ++j) scale[j] = std::max(scale[j], std::abs(row[j]));
  }
  // Row-major cols × cols: the normal matrix, and beside it the identity that becomes its inverse
  // (Gauss-Jordan: one factorisation for every right-hand side).
  std::vector<double> normal(cols * cols, 0.0), inverse(cols * cols, 0.0);
  for (size_t i = 0; i < cols; ++i) {
    inverse[i * cols + i] = 1;
    for (size_t j = 0; j < cols; ++j) {
      for (size_t r = 0; r < rows; ++r) normal[i * cols + j] += a[r][i] / scale[i] * a[r][j] / scale[j];
    }
  }
  for (size_t k = 0; k < cols; ++k) {
    size_t pivot = k;
    for (size_t i = k + 1; i < cols; ++i) {
      if (std::abs(normal[i * cols + k]) > std::abs(normal[pivot * cols + k])) pivot = i;
    }
    REMAT_CHECK(std::abs(normal[pivot * cols + k]) > 1e-12,
                "ShapeCosts::fit: the shapes do not tell the terms apart (two terms take proportional values on "
                "every shape profiled); profile shapes that vary each dimension on its own.");
    for (size_t j = 0; j < cols; ++j) {
      std::swap(normal[k * cols + j], normal[pivot * cols + j]);
      std::swap(inverse[k * cols + j], inverse[pivot * cols + j]);
    }
    const double p = normal[k * cols + k];
    for (size_t j = 0; j < cols; ++j) {
      normal[k * cols + j] /= p;
      inverse[k * cols + j] /= p;
    }
    for (size_t i = 0; i < cols; ++i) {
      const double f = normal[i * cols + k];
      if (i == k || f == 0) continue;
      for (size_t j = 0; j < cols; ++j) {
        normal[i * cols + j] -= f * normal[k * cols + j];
        inverse[i * cols + j] -= f * inverse[k * cols + j];
      }
    }
  }
  std::vector<std::vector<double>> out;
  out.reserve(ys.size());
  std::vector<double> rhs(cols);
  for (const auto& y : ys) {
    for (size_t j = 0; j < cols; ++j) {
      rhs[j] = 0;
      for (size_t r = 0; r < rows; ++r) rhs[j] += a[r][j] / scale[j] * y[r];
    }
    std::vector<double> c(cols, 0.0);
    for (size_t i = 0; i < cols; ++i) {
      for (size_t j = 0; j < cols; ++j) c[i] += inverse[i * cols + j] * rhs[j];
      c[i] /= scale[i];
    }
    out.push_back(std::move(c));
  }
  return out;
}

// The byte counts' names, in the order for_each_cost_number visits them: "stages[3] conv3.options[0]
// full.kept_bytes".
std::vector<std::string> byte_names(const CostTable& table) {
  std::vector<std::string> names;
  for (const auto& field : detail::table_fields().bytes) names.emplace_back(field.first);
  for (size_t i = 0; i < table.stages.size(); ++i) {
    const StageCost& stage = table.stages[i];
    const std::string where = "stages[" + std::to_string(i) + "] " + stage.name;
    for (const auto& field : detail::stage_fields().bytes) names.push_back(where + "." + field.first);
    for (size_t k = 0; k < stage.options.size(); ++k) {
      const std::string option = where + ".options[" + std::to_string(k) + "] " + stage.options[k].option;
      for (const auto& field : detail::run_fields().bytes) names.push_back(option + "." + field.first);
      if (!stage.options[k].graph_only) continue;
      for (const auto& field : detail::run_fields().bytes) names.push_back(option + ".graph_only." + field.first);
    }
  }
  return names;
}

double evaluate(const std::vector<double>& coefficients, const std::vector<double>& terms) {
  double v = 0;
  for (size_t i = 0; i < terms.size(); ++i) v += coefficients[i] * terms[i];
  return v;
}

}  // namespace

ShapeTerms ShapeTerms::batch_only() { return {{"batch"}, {{0}, {1}}}; }

ShapeTerms ShapeTerms::length_only() { return {{"length"}, {{0}, {1}, {2}}}; }

std::vector<int64_t> ShapeTerms::lengths_to_profile(std::vector<int64_t> lengths) {
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  if (lengths.size() <= 3) return lengths;
  return {lengths.front(), lengths[lengths.size() / 2], lengths.back()};
}

ShapeTerms ShapeTerms::batch_and_length() {
  return {{"batch", "length"}, {{0, 0}, {1, 0}, {0, 1}, {0, 2}, {1, 1}, {1, 2}}};
}

std::string ShapeTerms::describe() const {
  std::string out;
  for (const auto& term : exponents) {
    std::string monomial;
    for (size_t d = 0; d < term.size() && d < dimensions.size(); ++d) {
      if (term[d] == 0) continue;
      monomial += (monomial.empty() ? "" : "·") + dimensions[d] + (term[d] > 1 ? "^" + std::to_string(term[d]) : "");
    }
    out += (out.empty() ? "" : " + ") + (monomial.empty() ? "1" : monomial);
  }
  return out;
}

ShapeCosts ShapeCosts::fit(const std::vector<ShapedCosts>& samples, ShapeTerms terms) {
  check_terms(terms, "ShapeCosts::fit");
  const auto count = static_cast<int64_t>(samples.size());
  REMAT_CHECK(count >= static_cast<int64_t>(terms.exponents.size()) && count <= kMaxSamples, "ShapeCosts::fit: ", count,
              " profiled shapes for ", terms.exponents.size(), " terms (", terms.describe(),
              "); give at least one shape per term (and at most ", kMaxSamples, ").");
  ShapeCosts fitted;
  fitted.terms_ = std::move(terms);
  for (const auto& sample : samples) {
    check_shape(fitted.terms_, sample.shape, "ShapeCosts::fit");
    sample.costs.check_well_formed("ShapeCosts::fit: the table at " + shape_text(sample.shape));
    const std::string difference = detail::cost_shape_difference(samples[0].costs, sample.costs);
    REMAT_CHECK(difference.empty(), "ShapeCosts::fit: the tables at ", shape_text(samples[0].shape), " and ",
                shape_text(sample.shape), " are not of one chain (", difference,
                "); profile the same chain, with the same options, at every shape.");
    fitted.shapes_.push_back(sample.shape);
  }
  // Columns: one per number of the table, in the walk's order; rows: the shapes.
  std::vector<std::vector<double>> columns;
  for (size_t r = 0; r < samples.size(); ++r) {
    size_t k = 0;
    auto add = [&](double v) {
      if (r == 0) columns.emplace_back();
      columns[k++].push_back(v);
    };
    detail::for_each_cost_number(
        samples[r].costs, [&](double seconds) { add(seconds); },
        [&](int64_t bytes) { add(static_cast<double>(bytes)); });
  }
  std::vector<std::vector<double>> a;
  for (const auto& shape : fitted.shapes_) a.push_back(term_values(fitted.terms_, shape));
  fitted.coefficients_ = least_squares(a, columns);
  fitted.template_ = samples[0].costs;
  fitted.template_.source = "fitted over " + std::to_string(count) + " shapes (" + fitted.terms_.describe() +
                            ") from: " + samples[0].costs.source;
  for (auto& stage : fitted.template_.stages) stage.measured_rounds = 0;
  return fitted;
}

CostTable ShapeCosts::at(const std::vector<int64_t>& shape) const {
  check_shape(terms_, shape, "ShapeCosts::at");
  const std::vector<double> values = term_values(terms_, shape);
  CostTable table = template_;
  size_t k = 0;
  detail::for_each_cost_number(
      table, [&](double& seconds) { seconds = std::max(0.0, evaluate(coefficients_[k++], values)); },
      [&](int64_t& bytes) {
        const double v = std::round(evaluate(coefficients_[k++], values));
        REMAT_CHECK(v < 9e18, "ShapeCosts::at: the shape ", shape_text(shape), " needs more than 2^63 bytes.");
        bytes = std::max<int64_t>(0, static_cast<int64_t>(v));
      });
  return table;
}

bool ShapeCosts::covers(const std::vector<int64_t>& shape) const {
  if (shape.size() != terms_.dimensions.size()) return false;
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
    for (const auto& s : shapes_) {
      lo = std::min(lo, s[d]);
      hi = std::max(hi, s[d]);
    }
    if (shape[d] < lo || shape[d] > hi) return false;
  }
  return true;
}

ShapeFitCheck ShapeCosts::check(const ShapedCosts& held_out) const {
  const CostTable fitted = at(held_out.shape);
  const std::string difference = detail::cost_shape_difference(fitted, held_out.costs);
  REMAT_CHECK(difference.empty(), "ShapeCosts::check: the table at ", shape_text(held_out.shape),
              " is not of the fitted chain (", difference, ").");
  ShapeFitCheck check;
  std::vector<int64_t> fitted_bytes, profiled_bytes;
  detail::for_each_cost_number(
      fitted, [](double) {}, [&](int64_t b) { fitted_bytes.push_back(b); });
  detail::for_each_cost_number(
      held_out.costs, [](double) {}, [&](int64_t b) { profiled_bytes.push_back(b); });
  const std::vector<std::string> names = byte_names(fitted);
  for (size_t i = 0; i < fitted_bytes.size(); ++i) {
    const int64_t error = std::abs(fitted_bytes[i] - profiled_bytes[i]);
    const bool transient = names[i].find("extra_bytes") != std::string::npos;
    int64_t& worst = transient ? check.max_transient_error : check.max_byte_error;
    if (error <= worst) continue;
    worst = error;
    (transient ? check.worst_transient : check.worst_bytes) = names[i] + ": " + std::to_string(fitted_bytes[i]) +
                                                              " fitted, " + std::to_string(profiled_bytes[i]) +
                                                              " profiled";
  }
  const Prediction f = simulate(fitted.unchecked_plan(CheckpointMode::non_reentrant), fitted);
  const Prediction p = simulate(held_out.costs.unchecked_plan(CheckpointMode::non_reentrant), held_out.costs);
  check.peak_error = static_cast<double>(f.peak_bytes) / static_cast<double>(std::max<int64_t>(p.peak_bytes, 1)) - 1;
  check.step_seconds_error = p.step_seconds > 0 ? f.step_seconds / p.step_seconds - 1 : 0;
  return check;
}

std::string ShapeCosts::to_json() const {
  nlohmann::json j = {{"format", "remat-shape-costs"},
                      {"version", 1},
                      {"dimensions", terms_.dimensions},
                      {"terms", terms_.exponents},
                      {"shapes", shapes_},
                      {"coefficients", coefficients_},
                      {"table", nlohmann::json::parse(template_.to_json())}};
  return j.dump(1);
}

ShapeCosts ShapeCosts::from_json(const std::string& text, const std::string& source_name) {
  const std::string expected = "shape costs written by ShapeCosts::to_json";
  const nlohmann::json j = detail::parse_json_document(text, source_name, 10, expected);
  const detail::JsonFields top(j, source_name);
  REMAT_CHECK(j.contains("format") && j["format"] == "remat-shape-costs" && j.contains("version") && j["version"] == 1,
              source_name, ": not remat shape costs (expected \"format\": \"remat-shape-costs\", \"version\": 1).");
  ShapeCosts fitted;
  auto integers = [&](const nlohmann::json& v, const std::string& where) {
    REMAT_CHECK(v.is_array(), source_name, ": ", where, " must be an array of integers.");
    std::vector<int64_t> out;
    for (const auto& x : v) {
      REMAT_CHECK(x.is_number_integer(), source_name, ": ", where, " must hold integers.");
      out.push_back(x.get<int64_t>());
    }
    return out;
  };
  const nlohmann::json& dimensions = top.array("dimensions");
  for (const auto& d : dimensions) {
    REMAT_CHECK(d.is_string(), source_name, ": \"dimensions\" must hold names.");
    fitted.terms_.dimensions.push_back(d.get<std::string>());
  }
  for (const auto& t : top.array("terms")) fitted.terms_.exponents.push_back(integers(t, "\"terms\""));
  check_terms(fitted.terms_, source_name);
  for (const auto& s : top.array("shapes")) {
    fitted.shapes_.push_back(integers(s, "\"shapes\""));
    check_shape(fitted.terms_, fitted.shapes_.back(), source_name);
  }
  REMAT_CHECK(fitted.shapes_.size() >= fitted.terms_.exponents.size() &&
                  static_cast<int64_t>(fitted.shapes_.size()) <= kMaxSamples,
              source_name, ": ", fitted.shapes_.size(), " shapes for ", fitted.terms_.exponents.size(), " terms.");
  REMAT_CHECK(j.contains("table") && j["table"].is_object(), source_name, ": no \"table\" (the fitted chain's).");
  fitted.template_ = CostTable::from_json(j["table"].dump(), source_name + ": table");
  size_t numbers = 0;
  detail::for_each_cost_number(
      fitted.template_, [&](double) { ++numbers; }, [&](int64_t) { ++numbers; });
  const nlohmann::json& coefficients = top.array("coefficients");
  REMAT_CHECK(coefficients.size() == numbers, source_name, ": ", coefficients.size(),
              " coefficient rows for a table of ", numbers, " numbers.");
  for (const auto& row : coefficients) {
    REMAT_CHECK(row.is_array() && row.size() == fitted.terms_.exponents.size(), source_name,
                ": each coefficient row has one number per term (", fitted.terms_.exponents.size(), ").");
    std::vector<double> c;
    for (const auto& x : row) {
      REMAT_CHECK(x.is_number() && std::isfinite(x.get<double>()), source_name,
                  ": coefficients must be finite numbers.");
      c.push_back(x.get<double>());
    }
    fitted.coefficients_.push_back(std::move(c));
  }
  return fitted;
}

}  // namespace remat
