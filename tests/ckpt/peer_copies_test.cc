// In-memory checkpoints on machines that do not share a folder (peer_copies.h): thread ranks
// play machines, each with its own folder. Every rank r holds a tensor "t<r>" of its own, so
// rank r writes exactly one piece and the pieces of every machine can be told apart.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tessel/ckpt/peer_copies.h"
#include "tessel/ckpt/sharded.h"
#include "tessel/comm/thread_backend.h"
#include "tessel/comm/world.h"
#include "tessel/core/json.h"

namespace tessel {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kStep = 7;

fs::path temp(const std::string& name) {
  return fs::temp_directory_path() / fmt::format("tessel_peer_{}_{}", ::getpid(), name);
}

Tensor value_of(int r) {
  std::vector<float> v(15);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(100 * r + static_cast<int>(i));
  return Tensor::from_vector(v, {3, 5});
}

// A world of `folders.size()` ranks, rank r writing into folders[r], saves step kStep.
void save_on(const std::vector<fs::path>& folders) {
  const int n = static_cast<int>(folders.size());
  spawn(n, [&](int rank) {
    ProcessGroup* g = world_group().get();
    const std::vector<int> machines = folder_machines(folders[static_cast<size_t>(rank)].string(), g);
    CheckpointContent c;
    c.step = kStep;
    c.groups["model"].push_back({fmt::format("t{}", rank), value_of(rank), {}});
    save_sharded_checkpoint(folders[static_cast<size_t>(rank)].string(), c, g,
                            {.keep_last = 1, .machines = machine_count(machines) > 1 ? machines : std::vector<int>{}});
  });
}

Json manifest_of(const fs::path& folder) {
  std::ifstream in(folder / fmt::format("step-{:06d}", kStep) / "manifest.json");
  std::stringstream s;
  s << in.rdbuf();
  return Json::parse(s.str());
}

std::string ints(const Json& j) {
  std::string out;
  for (const Json& v : j.as_array()) out += std::to_string(v.as_int());
  return out;
}

// Every tensor t0..t<saved-1> read back from `folder`'s step has the value rank r saved.
void expect_whole(const fs::path& folder, int saved) {
  const std::string step = (folder / fmt::format("step-{:06d}", kStep)).string();
  ASSERT_EQ(checkpoint_incomplete(step), "") << step;
  CheckpointReader reader(step);
  std::vector<CheckpointTensor> targets;
  for (int r = 0; r < saved; ++r) targets.push_back({fmt::format("t{}", r), Tensor::zeros({3, 5}), {}});
  reader.read(targets);
  for (int r = 0; r < saved; ++r) {
    const Tensor want = value_of(r);
    for (int64_t i = 0; i < 15; ++i)
      ASSERT_EQ(targets[static_cast<size_t>(r)].value.data<float>()[i], want.data<float>()[i])
          << folder << " t" << r << "[" << i << "]";
  }
}

// What the machines left choose, each rank reading from folders[rank]: the step, or -1.
std::vector<int64_t> recover_on(const std::vector<fs::path>& folders) {
  const int n = static_cast<int>(folders.size());
  std::vector<int64_t> got(static_cast<size_t>(n), -2);
  spawn(n, [&](int rank) {
    ProcessGroup* g = world_group().get();
    const std::string dir = folders[static_cast<size_t>(rank)].string();
    const auto steps = memory_steps_held(dir, g, folder_machines(dir, g), false);
    got[static_cast<size_t>(rank)] = steps.empty() ? -1 : steps.front().first;
  });
  return got;
}

class PeerCopies : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int m = 0; m < 5; ++m) {
      folders.push_back(temp(fmt::format("{}_m{}", ::testing::UnitTest::GetInstance()->current_test_info()->name(), m)));
      fs::remove_all(folders.back());
    }
  }
  void TearDown() override {
    for (const fs::path& f : folders) fs::remove_all(f);
  }
  std::vector<fs::path> folders;
};

TEST_F(PeerCopies, TwoMachinesEachHoldEveryPiece) {
  // Ranks 0, 1 on machine A, ranks 2, 3 on machine B.
  save_on({folders[0], folders[0], folders[1], folders[1]});
  for (int m = 0; m < 2; ++m) {
    const Json mc = manifest_of(folders[static_cast<size_t>(m)]).at("memory_copies");
    EXPECT_EQ(ints(mc.at("own")), m == 0 ? "01" : "23");
    EXPECT_EQ(ints(mc.at("peer")), m == 0 ? "23" : "01");
    expect_whole(folders[static_cast<size_t>(m)], 4);
  }
  // Machine B is lost: A alone resumes from memory.
  fs::remove_all(folders[1]);
  EXPECT_EQ(recover_on({folders[0], folders[0]}), (std::vector<int64_t>{kStep, kStep}));
}

TEST_F(PeerCopies, RingOfFourKeepsOwnAndPreviousMachinesPieces) {
  save_on({folders[0], folders[1], folders[2], folders[3]});
  for (int m = 0; m < 4; ++m) {
    const Json mc = manifest_of(folders[static_cast<size_t>(m)]).at("memory_copies");
    EXPECT_EQ(ints(mc.at("own")), std::to_string(m));
    EXPECT_EQ(ints(mc.at("peer")), std::to_string((m + 3) % 4));
    // Alone, a machine's folder is not a whole step.
    const std::string why = checkpoint_incomplete((folders[static_cast<size_t>(m)] / "step-000007").string());
    EXPECT_NE(why.find("peer copies"), std::string::npos) << why;
  }
}

TEST_F(PeerCopies, SurvivorsAndANewMachineCopyWhatEachLacks) {
  save_on({folders[0], folders[1], folders[2], folders[3]});
  fs::remove_all(folders[1]);  // machine 1 lost: its pieces live on in machine 2's peer copy
  // The machines left, and a new one (folder 4, empty), one rank each.
  EXPECT_EQ(recover_on({folders[0], folders[2], folders[3], folders[4]}),
            (std::vector<int64_t>{kStep, kStep, kStep, kStep}));
  for (int m : {0, 2, 3, 4}) {
    expect_whole(folders[static_cast<size_t>(m)], 4);
    EXPECT_EQ(manifest_of(folders[static_cast<size_t>(m)]).find("memory_copies"), nullptr);
  }
}

TEST_F(PeerCopies, LosingAMachineAndItsPeerFallsBackToDisk) {
  save_on({folders[0], folders[1], folders[2], folders[3]});
  // Machine 1's pieces were on machine 1 and, as peer copies, on machine 2: both lost.
  fs::remove_all(folders[1]);
  fs::remove_all(folders[2]);
  EXPECT_EQ(recover_on({folders[0], folders[3]}), (std::vector<int64_t>{-1, -1}));
  EXPECT_NE(checkpoint_incomplete((folders[0] / "step-000007").string()), "");
}

}  // namespace
}  // namespace tessel
