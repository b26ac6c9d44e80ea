// Internal: whether the function running on this thread is being recomputed by a checkpoint's
// backward for its graph only. Then the values it returns are never read: the backward takes
// their autograd graph as the root and releases them (create_graph aside, where they may be).
// run_items uses it to run a segment's last stage graph-only (Chain::forward_stage_graph_only).
#pragma once

namespace remat::detail {

/// True only directly inside a function a checkpoint's backward recomputes without create_graph;
/// every checkpoint's forward call of its function (nested ones too) sees false.
bool recomputing_graph_only();

/// Sets the flag for the lifetime of the scope, then puts the previous value back.
class RecomputingGraphOnlyScope {
 public:
  explicit RecomputingGraphOnlyScope(bool value);
  ~RecomputingGraphOnlyScope();
  RecomputingGraphOnlyScope(const RecomputingGraphOnlyScope&) = delete;
  RecomputingGraphOnlyScope& operator=(const RecomputingGraphOnlyScope&) = delete;

 private:
  bool previous_;
};

}  // namespace remat::detail
