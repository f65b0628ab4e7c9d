// The CUBIN cache without a GPU: memory and disk hits and misses, files that must not be
// used (corrupt, truncated, another key, another toolchain, not regular, too large) each
// ignored and replaced, processes racing on one key, and folders that cannot be written.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dispatch/cuda/codegen.h"
#include "dispatch/cuda/nvrtc_cache.h"

namespace sg {
namespace {

namespace fs = std::filesystem;

constexpr int kArch = 90;

// A program per `variant` (a multiple of 0.5, giving its element count), so tests do not
// share keys.
KernelSource Program(float variant) {
  codegen::ElementwiseChain chain{{DType::kF32},
                                  {{codegen::EwOp::kSilu, 0}},
                                  {1},
                                  256 + static_cast<int64_t>(variant * 2.0f)};
  return codegen::GenerateElementwise(chain).value().source;
}

class TempFolder {
 public:
  TempFolder() {
    std::string t = (fs::path(::testing::TempDir()) / "sg_nvrtc_XXXXXX").string();
    path_ = mkdtemp(t.data());
  }
  ~TempFolder() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::string> Entries(const std::string& folder) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(folder)) names.push_back(e.path().filename().string());
  return names;
}

std::shared_ptr<const std::string> MustGet(CubinCache& cache, const KernelSource& s) {
  absl::StatusOr<std::shared_ptr<const std::string>> r = cache.Get(s, kArch);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : nullptr;
}

TEST(CubinCache, MemoryOnlyWithoutAFolder) {
  CubinCache cache(CubinCacheOptions{});
  EXPECT_FALSE(cache.disk_status().ok());
  EXPECT_EQ(cache.FilePath(Program(1), kArch), "");
  const KernelSource a = Program(1.5f), b = Program(2.5f);
  auto first = MustGet(cache, a);
  auto again = MustGet(cache, a);
  auto other = MustGet(cache, b);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first.get(), again.get()) << "the same bytes from memory";
  EXPECT_NE(*first, *other);
  CubinCacheStats s = cache.stats();
  EXPECT_EQ(s.compiles, 2);
  EXPECT_EQ(s.memory_hits, 1);
  EXPECT_EQ(s.disk_hits + s.disk_writes, 0);
}

TEST(CubinCache, KeyCoversOptionsAndArchitecture) {
  CubinCache cache(CubinCacheOptions{});
  KernelSource a = Program(3.0f);
  KernelSource b = a;
  b.options.push_back("-lineinfo");
  ASSERT_NE(MustGet(cache, a), nullptr);
  ASSERT_NE(MustGet(cache, b), nullptr);
  ASSERT_TRUE(cache.Get(a, 89).ok());
  EXPECT_EQ(cache.stats().compiles, 3);
  EXPECT_EQ(cache.stats().memory_hits, 0);
  KernelSource renamed = a;
  renamed.name = "another_name.cu";
  ASSERT_NE(MustGet(cache, renamed), nullptr);
  EXPECT_EQ(cache.stats().memory_hits, 1) << "the file name in messages is not part of the key";
}

TEST(CubinCache, SecondStartLoadsFromDisk) {
  TempFolder dir;
  const KernelSource s = Program(4.0f);
  std::string compiled;
  {
    CubinCache first({dir.path()});
    ASSERT_TRUE(first.disk_status().ok()) << first.disk_status();
    compiled = *MustGet(first, s);
    EXPECT_EQ(first.stats().compiles, 1);
    EXPECT_EQ(first.stats().disk_writes, 1);
    EXPECT_TRUE(fs::is_regular_file(first.FilePath(s, kArch)));
  }
  CubinCache second({dir.path()});
  auto loaded = MustGet(second, s);
  ASSERT_NE(loaded, nullptr);
  EXPECT_EQ(*loaded, compiled);
  CubinCacheStats st = second.stats();
  EXPECT_EQ(st.compiles, 0);
  EXPECT_EQ(st.disk_hits, 1);
  EXPECT_EQ(st.disk_rejected, 0) << st.last_rejection;
  MustGet(second, s);
  EXPECT_EQ(second.stats().memory_hits, 1);
  EXPECT_EQ(Entries(dir.path()).size(), 1u) << "no temporary files left behind";
}

// Writes a valid file for `s`, damages it with `damage`, and expects a new cache to
// reject it for `reason`, compile, and leave a valid file that the next start reads.
void ExpectRejectedAndRebuilt(const KernelSource& s, const std::function<void(const std::string&)>& damage,
                              absl::string_view reason) {
  TempFolder dir;
  std::string path;
  std::string good;
  {
    CubinCache writer({dir.path()});
    MustGet(writer, s);
    path = writer.FilePath(s, kArch);
    good = ReadAll(path);
  }
  damage(path);
  {
    CubinCache cache({dir.path()});
    auto got = MustGet(cache, s);
    CubinCacheStats st = cache.stats();
    EXPECT_EQ(st.disk_rejected, 1) << reason;
    EXPECT_NE(st.last_rejection.find(std::string(reason)), std::string::npos) << st.last_rejection;
    EXPECT_EQ(st.disk_hits, 0);
    EXPECT_EQ(st.compiles, 1);
    EXPECT_EQ(st.disk_writes, 1);
    EXPECT_TRUE(cache.disk_status().ok()) << cache.disk_status();
  }
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(path))) << "replaced by a regular file";
  EXPECT_EQ(ReadAll(path), good) << "the rebuilt file is the good one";
  CubinCache next({dir.path()});
  MustGet(next, s);
  EXPECT_EQ(next.stats().disk_hits, 1) << next.stats().last_rejection;
}

TEST(CubinCache, CorruptFileIsRebuilt) {
  // A flipped bit in the payload, then one in the key text.
  ExpectRejectedAndRebuilt(Program(5.0f), [](const std::string& p) {
    std::string b = ReadAll(p);
    b[b.size() - 7] ^= 0x10;
    WriteAll(p, b);
  }, "checksum");
  ExpectRejectedAndRebuilt(Program(5.0f), [](const std::string& p) {
    std::string b = ReadAll(p);
    b[70] ^= 0x01;
    WriteAll(p, b);
  }, "checksum");
  ExpectRejectedAndRebuilt(Program(5.0f), [](const std::string& p) {
    std::string b = ReadAll(p);
    b[0] = 'X';
    WriteAll(p, b);
  }, "magic");
}

TEST(CubinCache, TruncatedFileIsRebuilt) {
  ExpectRejectedAndRebuilt(Program(6.0f), [](const std::string& p) {
    std::string b = ReadAll(p);
    WriteAll(p, b.substr(0, b.size() / 2));
  }, "truncated");
  ExpectRejectedAndRebuilt(Program(6.0f), [](const std::string& p) {
    WriteAll(p, ReadAll(p).substr(0, 20));
  }, "shorter than its header");
  ExpectRejectedAndRebuilt(Program(6.0f), [](const std::string& p) { WriteAll(p, ""); },
                           "shorter than its header");
  ExpectRejectedAndRebuilt(Program(6.0f), [](const std::string& p) {
    WriteAll(p, ReadAll(p) + "trailing");
  }, "padded");
}

TEST(CubinCache, FileOfAnotherKeyIsRebuilt) {
  // A valid file for another program under this program's name (as a hash collision
  // would leave it).
  const KernelSource other = Program(7.5f);
  ExpectRejectedAndRebuilt(Program(7.0f), [&](const std::string& p) {
    TempFolder elsewhere;
    CubinCache c({elsewhere.path()});
    MustGet(c, other);
    WriteAll(p, ReadAll(c.FilePath(other, kArch)));
  }, "another program");
}

TEST(CubinCache, StaleFileOfAnotherToolchainIsRebuilt) {
  TempFolder dir;
  const KernelSource s = Program(8.0f);
  NvrtcToolchain old_driver = NvrtcToolchain::Current();
  old_driver.driver_version = 12040;
  NvrtcToolchain new_driver = old_driver;
  new_driver.driver_version = 13000;
  NvrtcToolchain new_nvrtc = new_driver;
  new_nvrtc.nvrtc_minor += 1;
  {
    CubinCache c({dir.path()}, old_driver);
    MustGet(c, s);
  }
  const std::string path = CubinCache({dir.path()}, new_driver).FilePath(s, kArch);
  for (const NvrtcToolchain& t : {new_driver, new_nvrtc}) {
    CubinCache c({dir.path()}, t);
    MustGet(c, s);
    EXPECT_EQ(c.stats().disk_rejected, 1);
    EXPECT_NE(c.stats().last_rejection.find("stale"), std::string::npos) << c.stats().last_rejection;
    EXPECT_EQ(c.stats().compiles, 1);
    EXPECT_EQ(c.stats().disk_writes, 1);
    EXPECT_EQ(c.FilePath(s, kArch), path) << "replaced in place, not left behind";
  }
  CubinCache c({dir.path()}, new_nvrtc);
  MustGet(c, s);
  EXPECT_EQ(c.stats().disk_hits, 1);
  EXPECT_EQ(Entries(dir.path()).size(), 1u);
}

TEST(CubinCache, OnlyRegularFilesAreRead) {
  // A link to a valid file is not followed; a FIFO does not hang the reader.
  const KernelSource s = Program(9.0f);
  ExpectRejectedAndRebuilt(s, [](const std::string& p) {
    const std::string target = p + ".elsewhere";
    fs::rename(p, target);
    fs::create_symlink(target, p);
  }, "cannot be opened");
  ExpectRejectedAndRebuilt(s, [](const std::string& p) {
    fs::remove(p);
    ASSERT_EQ(mkfifo(p.c_str(), 0600), 0);
  }, "not a regular file");
}

TEST(CubinCache, OversizedFilesAreNeitherReadNorWritten) {
  TempFolder dir;
  const KernelSource s = Program(10.0f);
  {
    CubinCache c({dir.path()});
    MustGet(c, s);
  }
  CubinCache small({dir.path(), /*max_file_bytes=*/1024});
  MustGet(small, s);
  EXPECT_EQ(small.stats().disk_rejected, 1);
  EXPECT_NE(small.stats().last_rejection.find("limit"), std::string::npos) << small.stats().last_rejection;
  EXPECT_EQ(small.stats().compiles, 1);
  EXPECT_EQ(small.stats().disk_writes, 0);
}

TEST(CubinCache, UnwritableFolderDegradesToMemory) {
  TempFolder dir;
  WriteAll(dir.sub("a_file"), "x");
  // A folder below a regular file cannot exist, for root too.
  CubinCache cache({dir.sub("a_file/kernels")});
  EXPECT_EQ(cache.disk_status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(cache.disk_status().message().find("a_file/kernels"), absl::string_view::npos)
      << cache.disk_status();
  const KernelSource s = Program(11.0f);
  ASSERT_NE(MustGet(cache, s), nullptr);
  MustGet(cache, s);
  EXPECT_EQ(cache.stats().compiles, 1);
  EXPECT_EQ(cache.stats().memory_hits, 1);
  EXPECT_EQ(cache.stats().disk_writes, 0);

  if (geteuid() != 0) {  // permissions do not bind root
    fs::create_directory(dir.sub("read_only"));
    fs::permissions(dir.sub("read_only"), fs::perms::owner_read | fs::perms::owner_exec);
    CubinCache ro({dir.sub("read_only")});
    EXPECT_FALSE(ro.disk_status().ok());
    EXPECT_NE(ro.disk_status().message().find("not writable"), absl::string_view::npos);
    EXPECT_TRUE(ro.Get(s, kArch).ok());
    fs::permissions(dir.sub("read_only"), fs::perms::owner_all);
  }
}

TEST(CubinCache, FolderIsCreated) {
  TempFolder dir;
  CubinCache cache({dir.sub("a/b/kernels")});
  EXPECT_TRUE(cache.disk_status().ok()) << cache.disk_status();
  MustGet(cache, Program(12.0f));
  EXPECT_EQ(Entries(dir.sub("a/b/kernels")).size(), 1u);
}

// One cache per folder and process, so that every dispatcher finds what another compiled.
TEST(CubinCache, SharedPerFolder) {
  TempFolder dir;
  const std::shared_ptr<CubinCache> memory = SharedCubinCache("");
  EXPECT_EQ(SharedCubinCache(""), memory);
  EXPECT_FALSE(memory->disk_status().ok());
  const std::shared_ptr<CubinCache> disk = SharedCubinCache(dir.path());
  EXPECT_NE(disk, memory);
  EXPECT_EQ(SharedCubinCache(dir.path()), disk);
  EXPECT_TRUE(disk->disk_status().ok()) << disk->disk_status();
  const int64_t compiles = disk->stats().compiles;
  MustGet(*disk, Program(13.0f));
  MustGet(*SharedCubinCache(dir.path()), Program(13.0f));
  EXPECT_EQ(disk->stats().compiles, compiles + 1);
  EXPECT_EQ(Entries(dir.path()).size(), 1u);
}

// Processes started at once, compiling the same key into one folder: all succeed, one
// valid file remains, no temporary file is left.
TEST(CubinCache, ConcurrentProcessesLeaveOneValidFile) {
  constexpr int kProcesses = 4;
  for (int round = 0; round < 2; ++round) {
    TempFolder dir;
    const KernelSource s = Program(13.0f + round);
    int go[2];
    ASSERT_EQ(pipe(go), 0);
    std::vector<pid_t> children;
    for (int i = 0; i < kProcesses; ++i) {
      const pid_t pid = fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        close(go[1]);
        char c;
        (void)!read(go[0], &c, 1);  // returns when the parent closes its end: all start together
        CubinCache cache({dir.path()});
        absl::StatusOr<std::shared_ptr<const std::string>> r = cache.Get(s, kArch);
        const CubinCacheStats st = cache.stats();
        const bool ok = r.ok() && !(*r)->empty() && cache.disk_status().ok() &&
                        st.disk_rejected == 0 && st.compiles + st.disk_hits == 1;
        _exit(ok ? 0 : 1);
      }
      children.push_back(pid);
    }
    close(go[0]);
    close(go[1]);
    for (pid_t pid : children) {
      int status = 0;
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child failed, status " << status;
    }
    EXPECT_EQ(Entries(dir.path()).size(), 1u);
    CubinCache after({dir.path()});
    ASSERT_NE(MustGet(after, s), nullptr);
    EXPECT_EQ(after.stats().disk_hits, 1) << after.stats().last_rejection;
    EXPECT_EQ(*MustGet(after, s), CompileToCubin(s, kArch).value());
  }
}

}  // namespace
}  // namespace sg
