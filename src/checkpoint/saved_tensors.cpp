#include "remat/checkpoint/saved_tensors.h"

#include <memory>

#include "checkpoint/forward_state.h"

namespace remat {
namespace {

struct StopAtLastSaved {};

// Counts, or keeps the saved tensors until the `last`-th and then abandons the forward.
struct CountOrKeep final : detail::SavedTensorHooks {
  CountOrKeep(size_t& count, std::vector<at::Tensor>* kept, size_t last)
      : SavedTensorHooks("remat's saved-tensor measurement"), count_(count), kept_(kept), last_(last) {}
  void call_pack_hook(const at::Tensor& tensor) override {
    ++count_;
    if (kept_ == nullptr) return;
    kept_->push_back(tensor.detach());
    if (kept_->size() == last_) throw StopAtLastSaved{};
  }
  at::Tensor call_unpack_hook() override {
    TORCH_CHECK(false, "remat: the graph of a forward run by count_saved_tensors or run_until_saved keeps no saved ",
                "tensors and cannot be back-propagated; run the function again for its backward.");
  }

 private:
  size_t& count_;
  std::vector<at::Tensor>* kept_;
  size_t last_;
};

}  // namespace

size_t count_saved_tensors(const std::function<void()>& forward) {
  size_t count = 0;
  detail::SavedTensorHooksScope hooks([&] { return std::make_unique<CountOrKeep>(count, nullptr, 0); });
  forward();
  return count;
}

void run_without_saving(const std::function<void()>& forward) {
  detail::DropSavedTensorsScope drop_saved;
  forward();
}

std::vector<at::Tensor> run_until_saved(const std::function<void()>& forward, size_t count) {
  std::vector<at::Tensor> kept;
  if (count == 0) return kept;
  size_t seen = 0;
  detail::SavedTensorHooksScope hooks([&] { return std::make_unique<CountOrKeep>(seen, &kept, count); });
  try {
    forward();
  } catch (const StopAtLastSaved&) {
  }
  return kept;
}

}  // namespace remat
