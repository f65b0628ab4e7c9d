// The program's console helpers: progress stays quiet for a short task and, past a couple
// of seconds, says how far it is and how long is left; input text is bounded and a file
// that is not a regular file is named as such.
#include "tools/console.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace sg::cli {
namespace {

TEST(ConsoleTest, ProgressIsQuietForShortTasksAndEstimatesLongOnes) {
  ::testing::internal::CaptureStderr();
  {
    Progress quick("prefill", 100, "tokens");
    quick.Update(50);
    quick.Update(100);
  }
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");

  ::testing::internal::CaptureStderr();
  {
    Progress slow("prefill", 1000, "tokens");
    std::this_thread::sleep_for(std::chrono::milliseconds(2100));
    slow.Update(250);
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(absl::StrContains(err, "stepgraph: prefill 250/1000 tokens, ")) << err;
  EXPECT_TRUE(absl::StrContains(err, " tokens/s, about ")) << err;
  // A quarter done in about 2.1 s leaves about 6 s.
  EXPECT_TRUE(absl::StrContains(err, " s left")) << err;

  // A task that ends before it said anything says nothing at its end either.
  ::testing::internal::CaptureStderr();
  {
    Progress ends("prefill", 1000, "tokens");
    std::this_thread::sleep_for(std::chrono::milliseconds(2100));
    ends.Update(1000);
  }
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST(ConsoleTest, DurationsReadAsPeopleSayThem) {
  EXPECT_EQ(Duration(7.4), "7 s");
  EXPECT_EQ(Duration(185), "3 min 5 s");
  EXPECT_EQ(Duration(3720), "1 h 2 min");
}

TEST(ConsoleTest, TextFilesAreRegularFilesOfBoundedSize) {
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("sg_console_test_" + std::to_string(getpid())))
                              .string();
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/prompt.txt") << "hello\n";
  absl::StatusOr<std::string> ok = ReadTextFile(dir + "/prompt.txt", "--file");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "hello\n");
  absl::StatusOr<std::string> folder = ReadTextFile(dir, "--file");
  ASSERT_FALSE(folder.ok());
  EXPECT_TRUE(absl::StrContains(folder.status().message(), "is not a regular file"))
      << folder.status();
  absl::StatusOr<std::string> missing = ReadTextFile(dir + "/missing.txt", "--file");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "--file: cannot open"))
      << missing.status();
  // A file larger than 64 MiB is refused by its size, before anything is read.
  std::filesystem::resize_file(dir + "/prompt.txt", (std::uintmax_t{64} << 20) + 1);
  absl::StatusOr<std::string> big = ReadTextFile(dir + "/prompt.txt", "--file");
  ASSERT_FALSE(big.ok());
  EXPECT_TRUE(absl::StrContains(big.status().message(), "more than 64 MiB")) << big.status();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sg::cli
