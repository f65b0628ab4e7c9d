// Runs a libFuzzer harness's LLVMFuzzerTestOneInput on files given as arguments (or on
// every file of a folder given), once each, without libFuzzer. The normal build links each
// harness with this driver so that every committed corpus input, crashes found earlier
// included, is a plain regression test under ctest with any compiler.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// Corpus inputs are small; a larger file is a mistake in the arguments.
constexpr std::uintmax_t kMaxInputBytes = std::uintmax_t{64} << 20;

bool RunFile(const std::filesystem::path& path) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec || size > kMaxInputBytes) {
    std::fprintf(stderr, "replay: %s: %s\n", path.c_str(),
                 ec ? ec.message().c_str() : "larger than 64 MiB");
    return false;
  }
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) {
    std::fprintf(stderr, "replay: %s: read failed\n", path.c_str());
    return false;
  }
  // A copy of exactly the input's size, so that ASan sees a read past its end.
  std::vector<uint8_t> data(bytes.begin(), bytes.end());
  LLVMFuzzerTestOneInput(data.data(), data.size());
  std::fprintf(stderr, "replay: %s: ok (%zu bytes)\n", path.c_str(), data.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <input file or folder>...\n", argv[0]);
    return 2;
  }
  int runs = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    std::error_code ec;
    if (std::filesystem::is_directory(arg, ec)) {
      for (const auto& entry : std::filesystem::directory_iterator(arg, ec)) {
        if (!entry.is_regular_file()) continue;
        if (!RunFile(entry.path())) return 1;
        ++runs;
      }
      if (ec) {
        std::fprintf(stderr, "replay: %s: %s\n", argv[i], ec.message().c_str());
        return 1;
      }
    } else {
      if (!RunFile(arg)) return 1;
      ++runs;
    }
  }
  // An empty folder would pass silently otherwise.
  if (runs == 0) {
    std::fprintf(stderr, "replay: no inputs\n");
    return 1;
  }
  return 0;
}
