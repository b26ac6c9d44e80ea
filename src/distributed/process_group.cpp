// The process group: the environment a rank joins from, the rendezvous (store and Gloo group),
// and the collectives.
#include "remat/distributed/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "base/torch_compat.h"
#include "remat/base/error.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

namespace remat::distributed {
namespace {

using Clock = std::chrono::steady_clock;

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

// A whole number from the environment, or `fallback` when unset; a clear error when malformed.
int64_t env_int(const char* name, int64_t fallback, int64_t low, int64_t high) {
  const char* text = env(name);
  if (text == nullptr) return fallback;
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  REMAT_CHECK(end != text && *end == '\0' && value >= low && value <= high, "distributed: the environment variable ",
              name, "='", text, "' is not a whole number in [", low, ", ", high, "].");
  return value;
}

// The first line of an exception's message, shortened: LibTorch's carry backtraces.
std::string first_line(const std::exception& e) {
  std::string text = e.what();
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) text = c10_error->what_without_backtrace();
  text = text.substr(0, text.find('\n'));
  return text.size() > 200 ? text.substr(0, 200) + "..." : text;
}

bool is_loopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1"; }

std::vector<uint8_t> bytes_of(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

}  // namespace

bool available() { return true; }
void check_available() {}

namespace {

// Waits until something accepts TCP connections at host:port, or `deadline` passes. The store's
// own client retries past its timeout: 2.x's waits a random back-off after a timed-out connect,
// so an unreachable master was reported 8-25 s late. Probing first keeps the timeout the user set.
// Returns the last connect error (empty once connected).
std::string wait_until_accepting(const std::string& host, int port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  std::string last_error = "no attempt";
  for (auto pause = std::chrono::milliseconds(50);; pause = std::min(2 * pause, std::chrono::milliseconds(1000))) {
    addrinfo* found = nullptr;
    const int resolved = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    if (resolved != 0) {
      last_error = std::string("cannot resolve the address: ") + ::gai_strerror(resolved);
    } else {
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        const bool connected = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
        last_error = connected ? "" : std::strerror(errno);
        ::close(fd);
        if (connected) break;
      }
      ::freeaddrinfo(found);
      if (last_error.empty()) return last_error;
    }
    const auto now = Clock::now();
    if (now >= deadline) return last_error;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
  }
}

}  // namespace

struct ProcessGroup::Impl {
  int rank = 0;
  int world_size = 1;
  std::chrono::milliseconds timeout{0};
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
  int64_t store_sequence = 0;  // keys of successive check_same / share calls
  // mean()'s one number, allocated once: Gloo's worker thread drops its reference to a collective's
  // tensors a moment after wait() returns, so a fresh tensor per call would be freed at a random
  // time, perhaps inside the next step's measured window (its activation peak then 8 bytes off).
  at::Tensor scalar = at::zeros({1}, at::kDouble);

  // Waits for a collective, turning a failed peer into an error that says what happened.
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) const {
    try {
      work->wait();
    } catch (const std::exception& e) {
      REMAT_CHECK(false, "distributed: rank ", rank, " of ", world_size, ": ", what, " failed (", first_line(e),
                  "). Another rank probably exited or was killed: see its output. This rank stops too.");
    }
  }
};

struct ProcessGroup::Pending::Impl {
  c10::intrusive_ptr<c10d::Work> work;
  const ProcessGroup::Impl* group = nullptr;
};

void ProcessGroup::Pending::wait() {
  REMAT_CHECK(impl_ != nullptr, "distributed: wait() on a reduction that was never started.");
  impl_->group->wait(impl_->work, "a gradient all-reduce");
}

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;

int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::world_size() const { return impl_->world_size; }
std::chrono::milliseconds ProcessGroup::timeout() const { return impl_->timeout; }

namespace {

// Where and how the ranks meet: from the options, else from the environment torchrun sets.
struct Rendezvous {
  int rank = 0, world = 1;
  std::chrono::milliseconds timeout{0};
  std::string addr;
  int64_t port = -1;
};

Rendezvous rendezvous_of(const JoinOptions& options) {
  Rendezvous r;
  const int64_t world = options.world_size() > 0 ? options.world_size() : env_int("WORLD_SIZE", -1, 1, 1 << 20);
  REMAT_CHECK(world >= 1,
              "distributed: WORLD_SIZE is not set. Launch with torchrun (or distributed::launch_local), or set "
              "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT on every process.");
  const int64_t rank = options.rank() >= 0 ? options.rank() : env_int("RANK", -1, 0, world - 1);
  REMAT_CHECK(rank >= 0 && rank < world, "distributed: RANK must be set to a number in [0, WORLD_SIZE) = [0, ", world,
              "), got ", rank < 0 && env("RANK") == nullptr ? std::string("nothing") : std::to_string(rank), ".");
  r.rank = static_cast<int>(rank);
  r.world = static_cast<int>(world);
  r.timeout = options.timeout().count() > 0
                  ? options.timeout()
                  : std::chrono::milliseconds(1000 * env_int("REMAT_DIST_TIMEOUT", 300, 1, 7 * 24 * 3600));
  r.addr = !options.master_addr().empty() ? options.master_addr() : (env("MASTER_ADDR") ? env("MASTER_ADDR") : "");
  r.port = options.master_port() > 0 ? options.master_port() : env_int("MASTER_PORT", -1, 1, 65535);
  REMAT_CHECK(world == 1 || (!r.addr.empty() && r.port > 0), "distributed: MASTER_ADDR and MASTER_PORT must name ",
              "rank 0's machine and a free port (e.g. MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 on one machine); got '",
              r.addr, "' and ", r.port < 0 ? std::string("nothing") : std::to_string(r.port), ".");
  if (r.addr.empty()) r.addr = "127.0.0.1";
  return r;
}

// The store: torchrun's agent hosts it when it says so; otherwise rank 0 does.
c10::intrusive_ptr<c10d::Store> connect_store(const Rendezvous& r) {
  const bool agent_store =
      env("TORCHELASTIC_USE_AGENT_STORE") != nullptr && std::string(env("TORCHELASTIC_USE_AGENT_STORE")) == "True";
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(r.port > 0 ? r.port : 29500);
  store_options.isServer = !agent_store && r.rank == 0;
  store_options.numWorkers = static_cast<std::size_t>(r.world);
  store_options.waitWorkers = false;  // the Gloo rendezvous below waits for everyone, under the timeout
  store_options.timeout = r.timeout;
  detail::use_classic_tcp_store_backend(store_options);  // Debian's LibTorch 2.x has no libuv
  auto unreachable = [&](const std::string& reason) {
    REMAT_CHECK(false, "distributed: rank ", r.rank, " cannot reach the store at ", r.addr, ":", r.port, " (", reason,
                ") within ", r.timeout.count() / 1000, " s: is rank 0 running, and do MASTER_ADDR and MASTER_PORT ",
                "name its machine and port?");
  };
  if (!store_options.isServer) {
    const std::string reason = wait_until_accepting(r.addr, store_options.port, Clock::now() + r.timeout);
    if (!reason.empty()) unreachable(reason);
  }
  try {
    c10::intrusive_ptr<c10d::Store> tcp = c10::make_intrusive<c10d::TCPStore>(r.addr, store_options);
    if (!agent_store) return tcp;
    // torchrun's keys live under its prefix (torch/distributed/rendezvous.py)
    const int64_t restart = env_int("TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 20);
    return c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + std::to_string(restart), tcp);
  } catch (const std::exception& e) {
    const std::string reason = first_line(e);
    REMAT_CHECK(!store_options.isServer, "distributed: rank 0 cannot host the store on port ", r.port, " (", reason,
                "): the port is taken or not allowed (choose another MASTER_PORT), or MASTER_ADDR (", r.addr,
                ") is not an address of this machine that it can reach.");
    unreachable(reason);
  }
  return {};
}

c10::intrusive_ptr<c10d::ProcessGroupGloo> connect_gloo(const c10::intrusive_ptr<c10d::Store>& store,
                                                        const Rendezvous& r) {
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(r.timeout);
  if (const char* interface = env("GLOO_SOCKET_IFNAME")) {
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(interface));
  } else if (is_loopback(r.addr)) {
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  gloo_options->threads = 2;
  const auto meeting = Clock::now();
  try {
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, r.rank, r.world, gloo_options);
  } catch (const std::exception& e) {
    // Well before the timeout it is not a missing rank but a connection Gloo could not make.
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - meeting);
    REMAT_CHECK(waited < r.timeout / 2, "distributed: rank ", r.rank, " of ", r.world,
                ": the ranks did not all meet within ", r.timeout.count() / 1000, " s (", first_line(e),
                "). Start all ", r.world, " ranks with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE.");
    REMAT_CHECK(false, "distributed: rank ", r.rank, " of ", r.world, ": Gloo could not connect the ranks (",
                first_line(e), ") after ", waited.count() / 1000.0, " s, before the ", r.timeout.count() / 1000,
                " s timeout: check that MASTER_ADDR (", r.addr, ") is an address of rank 0's machine that every ",
                "rank can reach, or name the network interface with GLOO_SOCKET_IFNAME.");
  }
  return {};
}

}  // namespace

std::shared_ptr<ProcessGroup> ProcessGroup::join(const JoinOptions& options) {
  const Rendezvous r = rendezvous_of(options);
  auto impl = std::make_unique<Impl>();
  impl->rank = r.rank;
  impl->world_size = r.world;
  impl->timeout = r.timeout;
  impl->store = connect_store(r);
  impl->gloo = connect_gloo(impl->store, r);
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

void ProcessGroup::check_same(const std::string& what, const std::vector<std::string>& lines) {
  std::string mine;
  for (const auto& line : lines) mine += line + "\n";
  const std::string prefix = "remat/check/" + std::to_string(impl_->store_sequence++) + "/";
  std::vector<std::string> all(static_cast<size_t>(impl_->world_size));
  try {
    impl_->store->set(prefix + std::to_string(impl_->rank), bytes_of(mine));
    for (int r = 0; r < impl_->world_size; ++r) {
      const auto got = impl_->store->get(prefix + std::to_string(r));
      all[static_cast<size_t>(r)] = std::string(got.begin(), got.end());
    }
  } catch (const std::exception& e) {
    REMAT_CHECK(false, "distributed: rank ", impl_->rank, ": comparing ", what, " with the other ranks failed (",
                first_line(e), "); another rank exited before the start.");
  }
  auto split = [](const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  };
  const auto reference = split(all[0]);
  for (int r = 1; r < impl_->world_size; ++r) {
    const auto other = split(all[static_cast<size_t>(r)]);
    for (size_t i = 0; i < std::max(reference.size(), other.size()); ++i) {
      const std::string a = i < reference.size() ? reference[i] : "(nothing)";
      const std::string b = i < other.size() ? other[i] : "(nothing)";
      REMAT_CHECK(a == b, "distributed: the ranks disagree on ", what, ": rank 0 has '", a, "', rank ", r, " has '", b,
                  "'. Start every rank with the same model, plan and data.");
    }
  }
}

std::string ProcessGroup::share(const std::string& what, const std::string& text, int root) {
  const std::string key = "remat/share/" + std::to_string(impl_->store_sequence++) + "/" + what;
  try {
    if (impl_->rank == root) impl_->store->set(key, bytes_of(text));
    const auto got = impl_->store->get(key);
    return std::string(got.begin(), got.end());
  } catch (const std::exception& e) {
    REMAT_CHECK(false, "distributed: rank ", impl_->rank, ": receiving ", what, " from rank ", root, " failed (",
                first_line(e), ").");
  }
  return {};
}

void ProcessGroup::broadcast(std::vector<at::Tensor> tensors, int root) {
  if (impl_->world_size == 1 || tensors.empty()) return;
  c10d::BroadcastOptions options;
  options.rootRank = root;
  impl_->wait(impl_->gloo->broadcast(tensors, options), "a broadcast");
}

void ProcessGroup::allreduce_sum(at::Tensor tensor) {
  if (impl_->world_size == 1) return;
  std::vector<at::Tensor> tensors = {std::move(tensor)};
  impl_->wait(impl_->gloo->allreduce(tensors), "an all-reduce");
}

ProcessGroup::Pending ProcessGroup::allreduce_sum_async(at::Tensor tensor) {
  std::vector<at::Tensor> tensors = {std::move(tensor)};
  Pending pending;
  pending.impl_ = std::make_shared<Pending::Impl>();
  pending.impl_->group = impl_.get();
  try {
    pending.impl_->work = impl_->gloo->allreduce(tensors);
  } catch (const std::exception& e) {
    REMAT_CHECK(false, "distributed: rank ", impl_->rank, ": starting an all-reduce failed (", first_line(e), ").");
  }
  return pending;
}

double ProcessGroup::mean(double value) {
  impl_->scalar.fill_(value);
  allreduce_sum(impl_->scalar);
  return impl_->scalar.item<double>() / impl_->world_size;
}

void ProcessGroup::barrier() {
  if (impl_->world_size == 1) return;
  impl_->wait(impl_->gloo->barrier(), "a barrier");
}

}  // namespace remat::distributed
