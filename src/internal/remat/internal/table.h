// remat/internal/table.h — the one table renderer of remat's reports (the CLI's, the cost table's,
// the examples'): one row type: columns declared once, rows of cells that carry a text for people and a
// value for machines, rendered as a plain-text table (columns sized to their widest cell, numbers
// right-aligned), CSV, Markdown or JSON (an array of objects keyed by the columns' keys).
//
//   Table t({{"strategy", "strategy"}, {"peak_bytes", "activation peak"}});
//   t.add_row({"block", {format_bytes(b), b}});
//   t.print(std::cerr); write(t.csv()); json["rows"] = t.json();
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace remat {

/// A column: its key (CSV header, JSON field) and its title (table and Markdown header). A plain
/// string is both. A data column (Column::data) goes to CSV and JSON only: plans, exact numbers.
struct Column {
  Column(const char* title) : key(title), title(title) {}
  Column(std::string title) : key(title), title(std::move(title)) {}
  Column(std::string key_, std::string title_) : key(std::move(key_)), title(std::move(title_)) {}
  static Column data(std::string key) {
    Column c(key, key);
    c.for_people = false;
    return c;
  }
  std::string key, title;
  bool for_people = true;  ///< shown in the text table and Markdown
};

/// A cell: what people read, and what machines get (the text itself unless given).
struct Cell {
  Cell(const char* text_) : text(text_), value(text_) {}
  Cell(std::string text_) : text(text_), value(std::move(text_)) {}
  Cell(std::string text_, nlohmann::json value_) : text(std::move(text_)), value(std::move(value_)) {}
  std::string text;
  nlohmann::json value;
};

class Table {
 public:
  Table(std::vector<Column> columns) : columns_(std::move(columns)) {}
  /// A row of exactly one cell per column.
  void add_row(std::vector<Cell> cells);
  size_t rows() const { return rows_.size(); }

  void print(std::ostream& out) const;
  std::string csv() const;
  std::string markdown() const;
  nlohmann::json json() const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<Cell>> rows_;
};

/// A CSV field: quoted, with inner quotes doubled, when it holds a comma, a quote or a newline.
std::string csv_field(const std::string& text);

/// A number with a fixed count of decimals: fixed(3.14159, 2) is "3.14".
std::string fixed(double value, int decimals);

/// A fraction as a signed percentage: percent(0.253) is "+25.3%".
std::string percent(double fraction);

/// "1.254 s", or "3.41 ms" below a tenth of a second.
std::string format_seconds(double seconds);

}  // namespace remat
