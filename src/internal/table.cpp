#include "remat/internal/table.h"

#include <algorithm>
#include <cctype>
#include <ostream>

#include <fmt/format.h>

#include "remat/base/error.h"

namespace remat {

void Table::add_row(std::vector<Cell> cells) {
  REMAT_CHECK(cells.size() == columns_.size(), "Table: a row of ", cells.size(), " cells for ", columns_.size(),
              " columns.");
  rows_.push_back(std::move(cells));
}

void Table::print(std::ostream& out) const {
  std::vector<size_t> shown;
  for (size_t c = 0; c < columns_.size(); ++c) {
    if (columns_[c].for_people) shown.push_back(c);
  }
  const size_t n = shown.size();
  std::vector<size_t> width(n, 0);
  std::vector<bool> left(n, false);  // columns of numbers align right, columns of words left
  for (size_t i = 0; i < n; ++i) {
    width[i] = columns_[shown[i]].title.size();
    for (const auto& row : rows_) {
      const std::string& text = row[shown[i]].text;
      width[i] = std::max(width[i], text.size());
      const char first = text.empty() ? '0' : text[0];
      if (!(std::isdigit(static_cast<unsigned char>(first)) || first == '+' || first == '-' || first == '.'))
        left[i] = true;
    }
  }
  auto line = [&](auto text_of) {
    std::string text;
    for (size_t i = 0; i < n; ++i) {
      const bool last = i + 1 == n;
      const size_t pad = last && left[i] ? 0 : width[i];  // no trailing blanks
      const std::string cell = text_of(shown[i]);
      text += (i == 0 ? "" : "  ") + (left[i] ? fmt::format("{:<{}}", cell, pad) : fmt::format("{:>{}}", cell, pad));
    }
    out << text << "\n";
  };
  line([&](size_t c) { return columns_[c].title; });
  size_t total = 0;
  for (size_t w : width) total += w + 2;
  out << std::string(total > 2 ? total - 2 : 0, '-') << "\n";
  for (const auto& row : rows_) line([&](size_t c) { return row[c].text; });
}

namespace {

// A value as CSV writes it: strings and numbers as they are, null as nothing.
std::string csv_value(const nlohmann::json& value) {
  if (value.is_null()) return "";
  if (value.is_string()) return csv_field(value.get<std::string>());
  if (value.is_boolean()) return value.get<bool>() ? "1" : "0";
  return csv_field(value.dump());
}

}  // namespace

std::string Table::csv() const {
  std::string text;
  for (size_t c = 0; c < columns_.size(); ++c) text += (c ? "," : "") + csv_field(columns_[c].key);
  text += "\n";
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) text += (c ? "," : "") + csv_value(row[c].value);
    text += "\n";
  }
  return text;
}

std::string Table::markdown() const {
  auto escaped = [](const std::string& cell) {
    std::string out;
    for (char ch : cell) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
    return out;
  };
  std::string text = "|", rule = "|";
  for (const auto& column : columns_) {
    if (!column.for_people) continue;
    text += " " + escaped(column.title) + " |";
    rule += "---|";
  }
  text += "\n" + rule + "\n";
  for (const auto& row : rows_) {
    text += "|";
    for (size_t c = 0; c < row.size(); ++c) {
      if (columns_[c].for_people) text += " " + escaped(row[c].text) + " |";
    }
    text += "\n";
  }
  return text;
}

nlohmann::json Table::json() const {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : rows_) {
    nlohmann::json object = nlohmann::json::object();
    for (size_t c = 0; c < row.size(); ++c) object[columns_[c].key] = row[c].value;
    rows.push_back(std::move(object));
  }
  return rows;
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string fixed(double value, int decimals) { return fmt::format("{:.{}f}", value, decimals); }

std::string percent(double fraction) { return fmt::format("{:+.1f}%", 100.0 * fraction); }

std::string format_seconds(double seconds) {
  if (seconds >= 0.1) return fmt::format("{:.3f} s", seconds);
  const double ms = seconds * 1e3;
  return fmt::format("{:.{}f} ms", ms, ms < 10 ? 2 : 1);
}

}  // namespace remat
