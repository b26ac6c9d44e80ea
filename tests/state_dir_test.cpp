// remat/train/state_dir.h: saved state folders: crashes and kills while saving lose nothing, what is read is
// checked (checksums, links, special files, nesting), and saves remove only what remat wrote.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "remat/chain/plan.h"
#include "remat/planning/cost_model.h"
#include "remat/train/state_dir.h"
#include "support/compare.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;

using remat::testing::error_of;
using remat::testing::read_file;
using remat::testing::TempDir;
using remat::testing::write_file;

TEST(StateDir, ACrashWhileSavingKeepsThePreviousState) {
  TempDir dir;
  remat::train::save_state_dir(dir.path(), 1, {{"step", 1}},
                               [](const fs::path& into) { write_file(into / "a.bin", "first"); });
  EXPECT_THROW(remat::train::save_state_dir(dir.path(), 2, {{"step", 2}},
                                            [](const fs::path& into) {
                                              write_file(into / "a.bin", "half-writ");
                                              throw std::runtime_error("disk full");
                                            }),
               std::runtime_error);
  const auto [state, meta] = remat::train::load_state_dir(dir.path());
  EXPECT_EQ(meta["step"], 1);
  EXPECT_EQ(read_file(state / "a.bin"), "first");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 2) << "only 'latest' and step-000001 remain: no temporary directory is left behind";
}

TEST(StateDir, KeepsTheNewestStatesAndChecksMetaJsonItself) {
  TempDir dir;
  for (int step = 1; step <= 4; ++step) {
    remat::train::save_state_dir(
        dir.path(), step, {{"step", step}},
        [&](const fs::path& into) { write_file(into / "a.bin", std::to_string(step)); }, 2);
  }
  std::vector<std::string> states;
  for (const auto& e : fs::directory_iterator(dir.path())) states.push_back(e.path().filename().string());
  std::sort(states.begin(), states.end());
  EXPECT_EQ(states, (std::vector<std::string>{"latest", "step-000003", "step-000004"}));
  const auto [state, meta] = remat::train::load_state_dir(dir.path());
  EXPECT_EQ(meta["step"], 4);

  // One changed digit in meta.json (not in any data file) is caught, and the error stays short.
  const fs::path meta_path = state / "meta.json";
  std::string text = read_file(meta_path);
  const auto at = text.find("\"step\": 4");
  ASSERT_NE(at, std::string::npos) << text;
  text[at + 8] = '5';
  write_file(meta_path, text);
  const std::string message = error_of([&] { remat::train::load_state_dir(dir.path()); });
  EXPECT_NE(message.find("meta.json' does not match its checksum"), std::string::npos) << message;
  EXPECT_LT(message.size(), 600u) << message;
  REMAT_EXPECT_ERROR(remat::train::save_state_dir(
                         dir.path(), 5, {}, [](const fs::path&) {}, 0),
                     "keep_last must be at least 1");
}

// Re-saving a step (train --steps 0 --resume D --save-state D) killed before each of its file
// operations in turn: whatever instant the kill comes at, the folder loads a complete state (the old
// or the new one), and the next save leaves nothing of the dead one behind.
TEST(StateDir, AResaveKilledBeforeAnyFileOperationLosesNothing) {
  auto state_of = [](const fs::path& dir) {
    const auto [state, meta] = remat::train::load_state_dir(dir);
    return read_file(state / "a.bin");
  };
  bool reached_the_end = false;
  for (int operation = 1; !reached_the_end && operation < 64; ++operation) {
    TempDir dir;
    remat::train::save_state_dir(dir.path(), 7, {{"step", 7}},
                                 [](const fs::path& into) { write_file(into / "a.bin", "old"); });
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {  // only file operations here: no LibTorch in the forked child
      try {
        remat::train::crash_state_save_before_operation_for_testing(operation);
        remat::train::save_state_dir(dir.path(), 7, {{"step", 7}},
                                     [](const fs::path& into) { write_file(into / "a.bin", "new"); });
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    reached_the_end = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    EXPECT_TRUE(reached_the_end || (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)) << "operation " << operation;
    const std::string loaded = state_of(dir.path());
    EXPECT_TRUE(loaded == "old" || loaded == "new") << "killed before operation " << operation << ": " << loaded;
    if (reached_the_end) EXPECT_EQ(loaded, "new");
    // The next save (in this process) removes what the dead one left.
    remat::train::save_state_dir(dir.path(), 8, {{"step", 8}},
                                 [](const fs::path& into) { write_file(into / "a.bin", "next"); });
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-000008"}))
        << "after a kill before operation " << operation;
    EXPECT_EQ(state_of(dir.path()), "next");
  }
  EXPECT_TRUE(reached_the_end) << "the hook never let a save finish";
}

TEST(StateDir, DeletingTheChecksumKeyDoesNotTurnVerificationOff) {
  TempDir dir;
  const fs::path state = remat::train::save_state_dir(dir.path(), 3, {{"step", 3}},
                                                      [](const fs::path& into) { write_file(into / "a.bin", "x"); });
  nlohmann::json meta = nlohmann::json::parse(read_file(state / "meta.json"));
  meta.erase("meta_fnv1a64");
  meta["step"] = 300;
  write_file(state / "meta.json", meta.dump(2));
  REMAT_EXPECT_ERROR(remat::train::load_state_dir(dir.path()), "meta.json' has no checksum (meta_fnv1a64)");
}

// Saved state behind links and special files: `latest` is replaced as a name (a planted link is
// replaced, never written through), and every file of a state is read without blocking, checked
// to be a regular file of a bounded size on the opened descriptor, and said missing when it is.
TEST(StateDir, ALinkPlantedAsLatestIsReplacedNotWrittenThrough) {
  TempDir dir;
  const fs::path victim = dir.path() / "victim.txt";
  write_file(victim, "precious");
  const fs::path state_dir = dir.path() / "state";
  fs::create_directories(state_dir);
  fs::create_symlink("../victim.txt", state_dir / "latest");
  remat::train::save_state_dir(state_dir, 2, {{"step", 2}},
                               [](const fs::path& into) { write_file(into / "a.bin", "x"); });
  EXPECT_EQ(read_file(victim), "precious") << "the file the link named is untouched";
  EXPECT_FALSE(fs::is_symlink(state_dir / "latest")) << "the link itself was replaced by the new 'latest'";
  EXPECT_EQ(read_file(state_dir / "latest"), "step-000002\n");
  EXPECT_EQ(remat::train::load_state_dir(state_dir).second["step"], 2);
}

TEST(StateDir, SpecialFilesInAStateAreRefusedWithoutBlocking) {
  TempDir dir;
  const auto save = [&] {
    fs::remove_all(dir.path() / "s");
    return remat::train::save_state_dir(dir.path() / "s", 1, {{"step", 1}},
                                        [](const fs::path& into) { write_file(into / "model.pt", "weights"); });
  };
  const auto load = [&] { return error_of([&] { remat::train::load_state_dir(dir.path() / "s"); }); };
  const auto started = std::chrono::steady_clock::now();
  fs::path state = save();
  // A FIFO as `latest`: a plain open would wait for a writer forever.
  fs::remove(dir.path() / "s" / "latest");
  ASSERT_EQ(::mkfifo((dir.path() / "s" / "latest").c_str(), 0600), 0);
  EXPECT_NE(load().find("the state's 'latest' file '" + (dir.path() / "s" / "latest").string() + "' is a FIFO"),
            std::string::npos)
      << load();
  // A FIFO or a folder where a state file was.
  state = save();
  fs::remove(state / "model.pt");
  ASSERT_EQ(::mkfifo((state / "model.pt").c_str(), 0600), 0);
  EXPECT_NE(load().find("model.pt' is not a regular file (a FIFO)"), std::string::npos) << load();
  state = save();
  fs::remove(state / "model.pt");
  fs::create_directory(state / "model.pt");
  EXPECT_NE(load().find("model.pt' is not a regular file (a folder)"), std::string::npos) << load();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10)) << "nothing waited on a FIFO";
  // Missing files are missing, not "invalid JSON".
  state = save();
  fs::remove(state / "model.pt");
  EXPECT_NE(load().find("state file '" + (state / "model.pt").string() + "' is missing."), std::string::npos) << load();
  state = save();
  fs::remove(state / "meta.json");
  EXPECT_NE(load().find("meta.json' is missing; the state is corrupt."), std::string::npos) << load();
  // meta.json padded with NULs to 70 MB: refused by its size before it is read.
  state = save();
  { std::ofstream(state / "meta.json", std::ios::app) << std::string(70u << 20, '\0'); }
  EXPECT_NE(load().find("holds 73400"), std::string::npos) << load();
  EXPECT_NE(load().find("more than the 16777216"), std::string::npos) << load();
  // A few NULs (which the JSON parser would stop at), then text that is not JSON: both in remat's
  // words, no nlohmann exception text.
  state = save();
  { std::ofstream(state / "meta.json", std::ios::app) << std::string(8, '\0'); }
  EXPECT_NE(load().find("meta.json' holds a NUL byte at byte "), std::string::npos) << load();
  write_file(state / "meta.json", "{\"files\": [1, 2,");
  EXPECT_NE(load().find("is not valid JSON (it stops making sense at byte"), std::string::npos) << load();
  EXPECT_EQ(load().find("json.exception"), std::string::npos) << load();
}

TEST(StateDir, LatestMustNameOneStateFolderAndIsQuotedPrintably) {
  TempDir dir;
  remat::train::save_state_dir(dir.path(), 1, {{"step", 1}},
                               [](const fs::path& into) { write_file(into / "a.bin", "x"); });
  const auto load = [&] { return error_of([&] { remat::train::load_state_dir(dir.path()); }); };
  write_file(dir.path() / "latest", "step-000001\r\n");
  EXPECT_NE(load().find("but holds 'step-000001\\r'"), std::string::npos) << load();
  write_file(dir.path() / "latest", "../../etc\n");
  EXPECT_NE(load().find("should name one state folder (like step-000040) but holds '../../etc'"), std::string::npos)
      << load();
  write_file(dir.path() / "latest", "\x1b[31mred\n");
  EXPECT_NE(load().find("holds '\\x1b[31mred'"), std::string::npos) << load();
  write_file(dir.path() / "latest", std::string(5000, 'a'));
  EXPECT_NE(load().find("holds 5000 bytes, more than the 4096"), std::string::npos) << load();
  write_file(dir.path() / "latest", "step-000001\n");
  EXPECT_EQ(remat::train::load_state_dir(dir.path()).second["step"], 1);
}

// Issue 39: a save deleted a user's .old-notes/, .tmp-mine/, step-0000-notes/, step-000001-backup/
// and .tmp-userfile-99999998 from the state folder. Only names remat writes, exactly, are removed:
// its states (step- and six digits, a re-save's .K) and its dead saves' temporaries.
TEST(StateDir, SavesRemoveOnlyWhatRematWrote) {
  TempDir dir;
  const std::vector<std::string> users = {".old-notes", ".tmp-mine",    "step-0000-notes", "step-000001-backup",
                                          "step-1",     "step-000002x", "step-000003.01",  ".tmp-step-000001-x"};
  for (const auto& name : users) {
    fs::create_directories(dir.path() / name);
    write_file(dir.path() / name / "marker", name);
  }
  write_file(dir.path() / ".tmp-userfile-99999998", "mine");
  write_file(dir.path() / "step-000000", "a file, not a state");
  fs::create_directories(dir.path() / "step-000001");  // a folder of a state's name, but no state in it
  write_file(dir.path() / "step-000001" / "marker", "mine");
  // What a save killed by kill -9 leaves (a process id that cannot be alive: above pid_max).
  fs::create_directories(dir.path() / ".tmp-step-000007-99999998");
  write_file(dir.path() / "latest.tmp.99999998.0", "step-000007\n");
  for (int step = 2; step <= 5; ++step) {
    remat::train::save_state_dir(dir.path(), step, {{"step", step}},
                                 [&](const fs::path& into) { write_file(into / "a.bin", std::to_string(step)); });
  }
  // A re-save of step 5 (step-000005.1) and then later steps prune both of step 5's states.
  remat::train::save_state_dir(
      dir.path(), 5, {{"step", 5}}, [](const fs::path& into) { write_file(into / "a.bin", "5 again"); }, 2);
  EXPECT_TRUE(fs::is_directory(dir.path() / "step-000005")) << "kept: the newest 2 are step-000005 and its re-save";
  EXPECT_TRUE(fs::is_directory(dir.path() / "step-000005.1"));
  remat::train::save_state_dir(dir.path(), 6, {{"step", 6}},
                               [](const fs::path& into) { write_file(into / "a.bin", "6"); });

  for (const auto& name : users) {
    EXPECT_EQ(read_file(dir.path() / name / "marker"), name) << name << " was removed or changed";
  }
  EXPECT_EQ(read_file(dir.path() / ".tmp-userfile-99999998"), "mine");
  EXPECT_EQ(read_file(dir.path() / "step-000000"), "a file, not a state");
  EXPECT_EQ(read_file(dir.path() / "step-000001" / "marker"), "mine");
  // remat's own leftovers and old states are gone, as before.
  EXPECT_FALSE(fs::exists(dir.path() / ".tmp-step-000007-99999998")) << "a dead save's temporary stays";
  EXPECT_FALSE(fs::exists(dir.path() / "latest.tmp.99999998.0")) << "a dead save's 'latest' temporary stays";
  for (const char* old : {"step-000002", "step-000003", "step-000004", "step-000005", "step-000005.1"}) {
    EXPECT_FALSE(fs::exists(dir.path() / old)) << old << " was not pruned";
  }
  EXPECT_EQ(remat::train::load_state_dir(dir.path()).second["step"], 6);
}

// Issue 39: a meta.json with one extra field nested 100,000 deep passed the parser, then its
// checksum's dump() recursed until the stack overflowed (SIGSEGV). Refused before parsing; and so
// is a plan or a profile nested as deep.
TEST(StateDir, ADeeplyNestedMetaJsonIsRefusedBeforeParsing) {
  TempDir dir;
  const fs::path state = remat::train::save_state_dir(dir.path(), 1, {{"step", 1}},
                                                      [](const fs::path& into) { write_file(into / "a.bin", "x"); });
  std::string meta = read_file(state / "meta.json");
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  meta.insert(meta.find('{') + 1, "\"extra\": " + deep + ", ");
  write_file(state / "meta.json", meta);
  const auto start = std::chrono::steady_clock::now();
  const std::string message = error_of([&] { remat::train::load_state_dir(dir.path()); });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  EXPECT_NE(message.find("meta.json': the JSON nests arrays and objects more than 16 levels deep"), std::string::npos)
      << message;
  EXPECT_NE(message.find("the state is corrupt. Resume from another copy"), std::string::npos) << message;

  const std::string deep_plan = "{\"format\": \"remat-plan\", \"plan\": " + deep + "}";
  REMAT_EXPECT_ERROR(remat::Plan::from_json(deep_plan, "deep.json"),
                     "deep.json: the JSON nests arrays and objects more than 515 levels deep");
  REMAT_EXPECT_ERROR(remat::CostTable::from_json("{\"stages\": " + deep + "}", "deep-profile.json"),
                     "deep-profile.json: the JSON nests arrays and objects more than");
}
