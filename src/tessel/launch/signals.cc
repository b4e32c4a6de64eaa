// The stop handler only stores the signal and writes a prepared message (both
// async-signal-safe); the training loop polls requested() between steps.
#include "tessel/launch/signals.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "tessel/core/error.h"
#include "tessel/launch/attempt.h"

namespace tessel {

std::string signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : std::to_string(sig); }

void write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    const ssize_t k = ::write(fd, s.data(), s.size());
    if (k > 0) {
      s.remove_prefix(static_cast<std::size_t>(k));
    } else if (k < 0 && errno == EINTR) {
      continue;
    } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
    } else {
      return;
    }
  }
}

namespace {

volatile sig_atomic_t g_requested = 0;
std::atomic<bool> g_installed{false};
char g_note[512];  // written before the handlers are installed, read only by them
size_t g_note_len = 0;
struct sigaction g_old_int, g_old_term;

extern "C" void on_stop_signal(int sig) {
  if (g_requested != 0) {  // the second one: stop now, the way the signal normally does
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigemptyset(&dfl.sa_mask);
    ::sigaction(sig, &dfl, nullptr);
    ::raise(sig);
    return;
  }
  const int saved_errno = errno;  // the interrupted code may be about to read it
  g_requested = sig;
  write_all(STDERR_FILENO, sig == SIGINT ? "\nSIGINT: " : "\nSIGTERM: ");
  write_all(STDERR_FILENO, std::string_view(g_note, g_note_len));
  errno = saved_errno;
}

}  // namespace

StopSignals::StopSignals(const std::string& note) {
  TESSEL_CHECK(!g_installed.exchange(true), "StopSignals: already installed");
  g_note_len = std::min(note.size() + 1, sizeof(g_note));
  std::memcpy(g_note, note.data(), g_note_len - 1);
  g_note[g_note_len - 1] = '\n';
  g_requested = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  ::sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a read or write in progress carries on
  ::sigaction(SIGINT, &sa, &g_old_int);
  ::sigaction(SIGTERM, &sa, &g_old_term);
}

StopSignals::~StopSignals() {
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  g_installed = false;
}

int StopSignals::requested() const { return g_requested; }

void say(const std::string& line) { write_all(2, line + "\n"); }

// ---------------------------------------------------------------------------------------
// The launcher's signals: SIGINT, SIGTERM and SIGCHLD write their number to a self-pipe.

namespace {

int g_signal_pipe = -1;
std::atomic<bool> g_scope_active{false};
constexpr int kScopeSignals[4] = {SIGINT, SIGTERM, SIGCHLD, SIGPIPE};

extern "C" void on_launcher_signal(int sig) {
  const int saved = errno;
  const auto b = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t k = ::write(g_signal_pipe, &b, 1);
  errno = saved;
}

}  // namespace

SignalScope::SignalScope() {
  // The handlers and the pipe they write to are process-wide: one launch at a time.
  TESSEL_CHECK(!g_scope_active.exchange(true), "run_launch: another launch is already running in this process");
  auto [r, w] = net::make_pipe();
  read_ = std::move(r);
  write_ = std::move(w);
  g_signal_pipe = write_.get();
  struct sigaction sa {};
  sa.sa_handler = on_launcher_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (std::size_t i = 0; i < 3; ++i) ::sigaction(kScopeSignals[i], &sa, &old_[i]);
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  ::sigaction(SIGPIPE, &ign, &old_[3]);
}

SignalScope::~SignalScope() {
  for (std::size_t i = 0; i < 4; ++i) ::sigaction(kScopeSignals[i], &old_[i], nullptr);
  g_signal_pipe = -1;
  g_scope_active = false;
}

std::vector<int> SignalScope::take() {
  std::vector<int> out;
  unsigned char buf[64];
  while (true) {
    const ssize_t k = ::read(read_.get(), buf, sizeof buf);
    if (k > 0) {
      out.insert(out.end(), buf, buf + k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    return out;
  }
}

}  // namespace tessel
