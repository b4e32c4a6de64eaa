// Checking and reading the files a user names: see input_file.h.
#include "tessel/core/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tessel/core/error.h"

namespace tessel {

namespace {

// What a stat() result that is not a regular file is, in words.
std::string kind_problem(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "a folder, not a file";
  if (S_ISFIFO(mode)) return "a named pipe, not a regular file";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device, not a regular file";
  if (S_ISSOCK(mode)) return "a socket, not a regular file";
  return "not a regular file";
}

std::string errno_problem(int err) {
  switch (err) {
    case ENOENT: return "no such file";
    case ENOTDIR: return "no such file (a part of the path is not a folder)";
    case ENAMETOOLONG: return "the name is longer than this system allows";
    case EACCES: return "permission denied";
    case ELOOP: return "too many symbolic links";
    default: return std::strerror(err);
  }
}

}  // namespace

std::string shown_path(const std::string& path) {
  constexpr size_t kShown = 120;
  if (path.size() <= kShown) return path;
  return fmt::format("{}... ({} characters)", path.substr(0, kShown), path.size());
}

std::string input_file_problem(const std::string& path) {
  if (path.empty()) return "an empty file name";
  if (path.find('\0') != std::string::npos) return "the name holds a NUL byte";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return errno_problem(errno);
  return kind_problem(st.st_mode);
}

void check_input_file(const std::string& path, std::string_view what) {
  const std::string problem = input_file_problem(path);
  if (!problem.empty()) throw InputError(fmt::format("{} '{}': {}", what, shown_path(path), problem));
}

std::string read_input_file(const std::string& path, std::string_view what, size_t max_bytes) {
  check_input_file(path, what);
  // O_NONBLOCK: should the path have become a pipe since the stat, open() returns at once and
  // the fstat below refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw InputError(fmt::format("{} '{}': {}", what, shown_path(path), errno_problem(errno)));
  struct stat st {};
  std::string problem = ::fstat(fd, &st) != 0 ? errno_problem(errno) : kind_problem(st.st_mode);
  if (problem.empty() && static_cast<uint64_t>(st.st_size) > max_bytes)
    problem = fmt::format("{} bytes, more than the {} a file of this kind may hold", st.st_size, max_bytes);
  std::string text;
  if (problem.empty()) {
    text.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < text.size()) {
      const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        problem = errno_problem(errno);
        break;
      }
      if (n == 0) break;  // the file shrank while being read
      got += static_cast<size_t>(n);
    }
    text.resize(got);
  }
  ::close(fd);
  if (!problem.empty()) throw InputError(fmt::format("{} '{}': {}", what, shown_path(path), problem));
  return text;
}

}  // namespace tessel
