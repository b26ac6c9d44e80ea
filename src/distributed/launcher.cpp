// The local launcher: runs a program as several ranks on this machine, as torchrun does.
#include "remat/distributed/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "remat/base/error.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern "C" char** environ;

namespace remat::distributed {
namespace {

using Clock = std::chrono::steady_clock;

// A port nobody listens on now (the kernel's choice for port 0); another process could take it
// before rank 0 does, which rank 0 then reports.
int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REMAT_CHECK(fd >= 0, "distributed: cannot open a socket to find a free port.");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  ::close(fd);
  REMAT_CHECK(ok, "distributed: cannot find a free port on 127.0.0.1.");
  return ntohs(address.sin_port);
}

int exit_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

bool launched_by_environment() {
  const char* world = std::getenv("WORLD_SIZE");
  return world != nullptr && *world != '\0';
}

int launch_local(int nproc, const std::vector<std::string>& argv, std::chrono::milliseconds grace) {
  REMAT_CHECK(nproc >= 1, "distributed: launch_local needs at least 1 process, got ", nproc, ".");
  REMAT_CHECK(!argv.empty(), "distributed: launch_local needs a program to run.");
  const std::string port = std::to_string(free_local_port());
  // Arguments and environments are built before fork: the child may only exec (or fail) after it.
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::vector<std::string>> environments(static_cast<size_t>(nproc));
  std::vector<std::vector<char*>> envps(static_cast<size_t>(nproc));
  static const char* overridden[] = {"RANK=", "LOCAL_RANK=", "WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT="};
  for (int rank = 0; rank < nproc; ++rank) {
    auto& e = environments[static_cast<size_t>(rank)];
    for (char** v = environ; *v != nullptr; ++v) {
      const std::string entry = *v;
      bool replaced = false;
      for (const char* name : overridden) replaced = replaced || entry.rfind(name, 0) == 0;
      if (!replaced) e.push_back(entry);
    }
    e.push_back("RANK=" + std::to_string(rank));
    e.push_back("LOCAL_RANK=" + std::to_string(rank));
    e.push_back("WORLD_SIZE=" + std::to_string(nproc));
    e.push_back("MASTER_ADDR=127.0.0.1");
    e.push_back("MASTER_PORT=" + port);
    for (auto& entry : e) envps[static_cast<size_t>(rank)].push_back(entry.data());
    envps[static_cast<size_t>(rank)].push_back(nullptr);
  }
  const int null = ::open("/dev/null", O_WRONLY);
  std::vector<pid_t> children;
  const pid_t launcher = ::getpid();
  for (int rank = 0; rank < nproc; ++rank) {
    const pid_t pid = ::fork();
    REMAT_CHECK(pid >= 0, "distributed: cannot start rank ", rank, " (fork failed).");
    if (pid == 0) {
      // The ranks go with the launcher, however it ends (kill -9 included): no orphans training on.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) ::_exit(1);  // it ended before the line above ran
      if (rank > 0 && null >= 0) ::dup2(null, STDOUT_FILENO);
      ::execve(args[0], args.data(), envps[static_cast<size_t>(rank)].data());
      ::_exit(127);
    }
    children.push_back(pid);
  }
  if (null >= 0) ::close(null);
  int first_failure = 0;
  size_t running = children.size();
  std::optional<Clock::time_point> deadline;
  while (running > 0) {
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, deadline ? WNOHANG : 0);
    if (done > 0) {
      const auto it = std::find(children.begin(), children.end(), done);
      if (it == children.end()) continue;
      *it = -1;
      --running;
      const int code = exit_status(status);
      if (code != 0 && first_failure == 0) {
        first_failure = code;
        deadline = Clock::now() + grace;
      }
    } else if (deadline && Clock::now() >= *deadline) {
      for (pid_t pid : children) {
        if (pid > 0) ::kill(pid, SIGTERM);
      }
      deadline = Clock::now() + std::chrono::hours(24);  // now wait for them to go
    } else if (deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  return first_failure;
}

}  // namespace remat::distributed
