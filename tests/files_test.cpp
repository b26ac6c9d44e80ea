// write_file_atomically and read_regular_file: regular files replaced whole and read whole, special files refused and left as they
// were, symbolic links followed (the link kept), permissions kept, no temporaries left behind.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "remat/internal/files.h"
#include "support/compare.h"

namespace fs = std::filesystem;

namespace {

class AtomicWrite : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "remat-files-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    folder_ = pattern;
  }
  void TearDown() override { fs::remove_all(folder_); }

  std::string at(const std::string& name) const { return (folder_ / name).string(); }
  static std::string contents(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // How many entries the folder holds: a temporary left behind shows up here.
  int entries() const {
    return static_cast<int>(std::distance(fs::directory_iterator(folder_), fs::directory_iterator()));
  }

  static std::string refusal(const std::string& path) {
    return remat::testing::error_of([&] { remat::write_file_atomically(path, "new"); });
  }

  static std::string refusal_to_read(const std::string& path) {
    return remat::testing::error_of([&] { remat::read_regular_file(path, "--profile"); });
  }

  fs::path folder_;
};

TEST_F(AtomicWrite, ReplacesARegularFileWholeAndLeavesNoTemporary) {
  remat::write_file_atomically(at("plan.json"), "first");
  remat::write_file_atomically(at("plan.json"), "second, longer");
  EXPECT_EQ(contents(at("plan.json")), "second, longer");
  EXPECT_EQ(entries(), 1);
}

TEST_F(AtomicWrite, RefusesAFifoAndLeavesIt) {
  ASSERT_EQ(::mkfifo(at("fifo").c_str(), 0600), 0);
  const std::string message = refusal(at("fifo"));
  EXPECT_NE(message.find("it is a FIFO"), std::string::npos) << message;
  EXPECT_NE(message.find("regular files only"), std::string::npos) << message;
  EXPECT_TRUE(fs::is_fifo(at("fifo")));
  EXPECT_EQ(entries(), 1);
}

TEST_F(AtomicWrite, RefusesASocketAndAFolder) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string socket_path = at("socket");
  ASSERT_LT(socket_path.size(), sizeof(address.sun_path));
  socket_path.copy(address.sun_path, socket_path.size());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  EXPECT_NE(refusal(socket_path).find("it is a socket"), std::string::npos);
  EXPECT_TRUE(fs::is_socket(socket_path));
  ::close(fd);
  fs::create_directory(at("folder"));
  EXPECT_NE(refusal(at("folder")).find("it is a folder"), std::string::npos);
  EXPECT_TRUE(fs::is_directory(at("folder")));
}

TEST_F(AtomicWrite, RefusesALinkToASpecialFileAndKeepsBoth) {
  // What /dev/stdout and /dev/full-style links are; a FIFO stands in for the device node, so a
  // regression cannot replace a real device on the test machine.
  ASSERT_EQ(::mkfifo(at("fifo").c_str(), 0600), 0);
  fs::create_symlink(at("fifo"), at("link"));
  const std::string message = refusal(at("link"));
  EXPECT_NE(message.find("it is a FIFO (through a symbolic link)"), std::string::npos) << message;
  EXPECT_TRUE(fs::is_symlink(at("link")));
  EXPECT_TRUE(fs::is_fifo(at("fifo")));
}

TEST_F(AtomicWrite, FollowsALinkToARegularFileAndKeepsTheLink) {
  remat::write_file_atomically(at("real.json"), "old");
  fs::create_symlink("real.json", at("link.json"));
  remat::write_file_atomically(at("link.json"), "new");
  EXPECT_TRUE(fs::is_symlink(at("link.json")));
  EXPECT_EQ(contents(at("real.json")), "new");
  EXPECT_EQ(entries(), 2);
}

TEST_F(AtomicWrite, RefusesADanglingLink) {
  fs::create_symlink(at("missing"), at("dangling"));
  EXPECT_NE(refusal(at("dangling")).find("symbolic link to a missing file"), std::string::npos);
  EXPECT_FALSE(fs::exists(at("missing")));
}

TEST_F(AtomicWrite, KeepsThePermissionsOfTheFileItReplaces) {
  remat::write_file_atomically(at("private.json"), "old");
  fs::permissions(at("private.json"), fs::perms::owner_read | fs::perms::owner_write);
  remat::write_file_atomically(at("private.json"), "new");
  EXPECT_EQ(fs::status(at("private.json")).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
}

TEST_F(AtomicWrite, AMissingFolderIsAClearError) {
  const std::string message = refusal(at("no/such/folder/plan.json"));
  EXPECT_NE(message.find("check that its folder exists"), std::string::npos) << message;
}

}  // namespace

namespace {

TEST_F(AtomicWrite, ReadsARegularFileWhole) {
  remat::write_file_atomically(at("profile.json"), std::string(100000, 'x'));
  EXPECT_EQ(remat::read_regular_file(at("profile.json"), "--profile"), std::string(100000, 'x'));
}

TEST_F(AtomicWrite, ReadingRefusesFifosDevicesFoldersAndHugeFilesWithoutReading) {
  ASSERT_EQ(::mkfifo(at("fifo").c_str(), 0600), 0);  // no writer: a plain read would block forever
  EXPECT_NE(
      refusal_to_read(at("fifo")).find("--profile '" + at("fifo") + "' is a FIFO; give the name of a regular file"),
      std::string::npos);
  EXPECT_NE(refusal_to_read("/dev/zero").find("is a character device"), std::string::npos);  // would never end
  EXPECT_NE(refusal_to_read(folder_.string()).find("is a folder"), std::string::npos);
  remat::write_file_atomically(at("big"), std::string(2000, 'x'));
  REMAT_EXPECT_ERROR(remat::read_regular_file(at("big"), "--plan", 1000), "holds 2000 bytes, more than the 1000");
  EXPECT_NE(refusal_to_read(at("missing")).find("' does not exist."), std::string::npos);
}

}  // namespace
