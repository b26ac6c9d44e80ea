// The process group of a remat built without c10d's Gloo group (REMAT_DISTRIBUTED=OFF, or a LibTorch
// without it): join says so and why; no group can exist, so its members are never reached.
#include "remat/distributed/data_parallel.h"

#include "remat/base/error.h"

#ifndef REMAT_DISTRIBUTED_MISSING
#define REMAT_DISTRIBUTED_MISSING "c10d's Gloo group was not found"
#endif

namespace remat::distributed {
namespace {

[[noreturn]] void unavailable() {
  REMAT_CHECK(false, "distributed: this remat was built without data-parallel training (", REMAT_DISTRIBUTED_MISSING,
              "). Rebuild it against a LibTorch with c10d's Gloo group ",
              "(Debian's libtorch-dev with libgloo-dev, PyTorch's own archives) and REMAT_DISTRIBUTED=ON, ",
              "or train in one process.");
}

}  // namespace

bool available() { return false; }
void check_available() { unavailable(); }

struct ProcessGroup::Impl {};
struct ProcessGroup::Pending::Impl {};

std::shared_ptr<ProcessGroup> ProcessGroup::join(const JoinOptions&) { unavailable(); }
ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;
int ProcessGroup::rank() const { unavailable(); }
int ProcessGroup::world_size() const { unavailable(); }
std::chrono::milliseconds ProcessGroup::timeout() const { unavailable(); }
void ProcessGroup::check_same(const std::string&, const std::vector<std::string>&) { unavailable(); }
std::string ProcessGroup::share(const std::string&, const std::string&, int) { unavailable(); }
void ProcessGroup::broadcast(std::vector<at::Tensor>, int) { unavailable(); }
void ProcessGroup::allreduce_sum(at::Tensor) { unavailable(); }
ProcessGroup::Pending ProcessGroup::allreduce_sum_async(at::Tensor) { unavailable(); }
double ProcessGroup::mean(double) { unavailable(); }
void ProcessGroup::barrier() { unavailable(); }
void ProcessGroup::Pending::wait() { unavailable(); }

}  // namespace remat::distributed
