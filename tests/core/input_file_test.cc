// Files a user names are looked at before they are opened: pipes, devices and folders refused by
// name without blocking, errors naming where the path came from (tessel/core/input_file.h).
#include "tessel/core/input_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "tessel/core/error.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

TEST(InputFile, RefusesWhatIsNotARegularFileWithoutOpeningIt) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("tessel_input_file_{}", ::getpid());
  fs::create_directories(dir);
  const std::string fifo = (dir / "pipe").string(), text = (dir / "a.yaml").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::ofstream(text) << "key: value\n";
  fs::create_symlink(text, dir / "link.yaml");
  EXPECT_EQ(read_input_file(text, "config"), "key: value\n");
  EXPECT_EQ(read_input_file((dir / "link.yaml").string(), "config"), "key: value\n");  // links are followed
  const std::string long_name = "/tmp/" + std::string(4096, 'z');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {fifo, "a named pipe, not a regular file"},
      {"/dev/null", "a device, not a regular file"},
      {dir.string(), "a folder, not a file"},
      {(dir / "none.yaml").string(), "no such file"},
      {text + "/x", "no such file (a part of the path is not a folder)"},
      {long_name, "the name is longer than this system allows"},
      {"", "an empty file name"}};
  for (const auto& [path, want] : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(input_file_problem(path), want) << path;
    try {
      read_input_file(path, "config model.hf_config");
      ADD_FAILURE() << path << " was read";
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()), fmt::format("config model.hf_config '{}': {}", shown_path(path), want));
    }
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0) << path;
  }
  EXPECT_EQ(shown_path(long_name).size(), 120 + std::string("... (4101 characters)").size());
  EXPECT_THROW(read_input_file(text, "config", 4), InputError);  // over the size bound
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessel
