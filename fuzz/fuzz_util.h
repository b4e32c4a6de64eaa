// Helpers shared by the harnesses: the input as an in-memory file with a path, and a scratch
// folder for the process.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace tessel::fuzz {

// `bytes` as a memory-backed regular file, readable at path(); closed when destroyed.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) : fd_(::memfd_create("tessel-fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) std::abort();
    for (size_t done = 0; done < size;) {
      const ssize_t k = ::write(fd_, data + done, size - done);
      if (k <= 0) std::abort();
      done += static_cast<size_t>(k);
    }
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

// A fresh folder for this process under /dev/shm (else /tmp), removed at exit.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::string templ = std::string(::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") + "/tessel-fuzz-XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) std::abort();
    static std::string to_remove = templ;
    std::atexit([] { (void)std::system(("rm -rf '" + to_remove + "'").c_str()); });
    return templ;
  }();
  return dir;
}

}  // namespace tessel::fuzz
