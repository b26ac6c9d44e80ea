// remat/distributed/data_parallel.h — data-parallel training over processes and machines, on c10d's Gloo
// process group (ProcessGroupGloo with a TCPStore: the distributed engine in LibTorch's CPU builds),
// composed with every checkpoint form.
//
//   auto group = remat::distributed::ProcessGroup::join();          // RANK, WORLD_SIZE, MASTER_ADDR/PORT
//   remat::distributed::GradientSynchronizer sync(group, model->parameters());
//   sync.broadcast_parameters();                                    // every rank starts from rank 0's
//   loss = model->forward(my_slice); loss.backward(); sync.finish(); optimizer.step();
//
// Gradients are averaged over ranks in buckets (25 MiB by default, as DDP's), each all-reduced as
// soon as every gradient in it is ready — from hooks on the parameters' gradient accumulators, so
// communication overlaps the rest of backward and its recomputes — and always in the same bucket
// order on every rank. The autograd engine sums every use of a parameter in one backward before its
// accumulator runs — a module checkpointed twice, a parameter used inside and outside a checkpoint —
// so a gradient is ready when its accumulator has fired as often as in the first synchronised step;
// one that fires after its bucket left (a parameter first used later, a second backward pass) makes
// finish() reduce that bucket again, whole, never half-summed. Parameters unused in a step on every
// rank keep no gradient, as in one process; unused on some ranks only, they count as zero there.
//
// Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) every rank joins the launcher's store as a
// client, under torchrun's prefix; otherwise rank 0 hosts the store on MASTER_PORT.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

namespace remat::distributed {

/// How a process joins: unset fields come from the environment (RANK, WORLD_SIZE, MASTER_ADDR,
/// MASTER_PORT, REMAT_DIST_TIMEOUT in seconds).
struct JoinOptions {
  /// This process's rank; -1: RANK.
  TORCH_ARG(int, rank) = -1;
  /// The number of ranks; -1: WORLD_SIZE.
  TORCH_ARG(int, world_size) = -1;
  /// Rank 0's address (it hosts the store); empty: MASTER_ADDR.
  TORCH_ARG(std::string, master_addr) = "";
  /// Rank 0's store port; -1: MASTER_PORT.
  TORCH_ARG(int, master_port) = -1;
  /// How long a collective or the rendezvous may wait for the other ranks before failing; 0:
  /// REMAT_DIST_TIMEOUT (seconds), or 300 s.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::milliseconds(0);
};

/// True when this remat was built with c10d's Gloo group (LibTorch built with it, gloo's headers
/// found, REMAT_DISTRIBUTED not OFF). Otherwise ProcessGroup::join throws, naming what was missing;
/// launch_local and the rest of remat work the same.
bool available();
/// Throws the error join() would when !available(): for a launcher, before it starts any rank.
void check_available();

/// True when WORLD_SIZE is set in the environment: this process is one rank of a launched job.
bool launched_by_environment();

/// Runs `argv` (argv[0] the program; "/proc/self/exe" for this one) as `nproc` local ranks, as
/// torchrun does on one machine: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free
/// MASTER_PORT in each one's environment; the stdout of ranks above 0 is discarded. Waits for all;
/// when one fails, the others get `grace` to stop on their own, then SIGTERM. Returns 0, or the
/// exit status of the first rank that failed (128 + signal when one was killed).
int launch_local(int nproc, const std::vector<std::string>& argv, std::chrono::milliseconds grace);

class ProcessGroup {
 public:
  /// Joins the group: connects to (or, rank 0, hosts) the store, then builds the Gloo group. Clear
  /// errors for missing or inconsistent variables, a taken port, an unreachable master.
  static std::shared_ptr<ProcessGroup> join(const JoinOptions& options = {});
  ~ProcessGroup();

  int rank() const;
  int world_size() const;
  std::chrono::milliseconds timeout() const;

  /// Every rank passes `lines` describing what must agree ("layers 8", "plan ..."); throws on every
  /// rank, naming the first line in which some rank differs from rank 0, when they do not agree.
  void check_same(const std::string& what, const std::vector<std::string>& lines);
  /// Rank `root`'s text, on every rank (through the store).
  std::string share(const std::string& what, const std::string& text, int root = 0);

  /// In place: every rank's tensors become rank `root`'s.
  void broadcast(std::vector<at::Tensor> tensors, int root = 0);
  /// In place, summed over ranks.
  void allreduce_sum(at::Tensor tensor);
  /// The mean of `value` over ranks.
  double mean(double value);
  void barrier();

  /// Starts an in-place sum over ranks; wait() blocks until done (throws if a peer failed).
  class Pending {
   public:
    void wait();
    bool started() const { return impl_ != nullptr; }

   private:
    friend class ProcessGroup;
    struct Impl;
    std::shared_ptr<Impl> impl_;
  };
  Pending allreduce_sum_async(at::Tensor tensor);

 private:
  struct Impl;
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct SynchronizerOptions {
  /// Bytes of gradients per bucket (all-reduced together, as soon as all of them are ready).
  TORCH_ARG(int64_t, bucket_bytes) = 25 * 1024 * 1024;
  /// false: every bucket is reduced in finish(), after backward (no overlap), for comparison.
  TORCH_ARG(bool, overlap) = true;
};

/// What one synchronised step cost in communication.
struct SyncStats {
  double wait_seconds = 0;          ///< finish() blocked on communication
  int buckets = 0;                  ///< reduced this step
  int buckets_during_backward = 0;  ///< of them, started from hooks before finish()
  int buckets_reduced_again = 0;    ///< a gradient fired more often than in the first step
};

class GradientSynchronizer {
 public:
  /// `parameters`: those whose gradients are averaged (a module's parameters(), in order); every
  /// rank must pass the same shapes in the same order (checked).
  GradientSynchronizer(std::shared_ptr<ProcessGroup> group, std::vector<at::Tensor> parameters,
                       SynchronizerOptions options = {});
  ~GradientSynchronizer();
  GradientSynchronizer(const GradientSynchronizer&) = delete;
  GradientSynchronizer& operator=(const GradientSynchronizer&) = delete;

  /// Makes every rank's parameters (and `buffers`) rank 0's.
  void broadcast_parameters(std::vector<at::Tensor> buffers = {});
  /// After backward: reduces the buckets not yet started, waits for all, and leaves each parameter's
  /// gradient the mean over ranks. Outside no_sync, call once per backward.
  SyncStats finish();

  /// While alive, backward passes only accumulate gradients locally (gradient accumulation); the
  /// next finish() outside it averages the accumulated gradients.
  class NoSync {
   public:
    explicit NoSync(GradientSynchronizer& owner);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    GradientSynchronizer& owner_;
  };
  NoSync no_sync() { return NoSync(*this); }

  /// Bytes of the flat bucket buffers, allocated once at construction (outside any step).
  int64_t bucket_bytes_allocated() const;
  int buckets() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace remat::distributed
