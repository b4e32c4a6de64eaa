// The cluster readers on arbitrary text: an input starting with '@' is a preset spec
// ("dgx-h100:16") for cluster_preset, any other a cluster YAML for parse_cluster. A Cluster
// or a tessel::Error naming the key, never a crash or a sanitizer report; and the YAML of a
// cluster that was read is read back to the same YAML.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tessel/core/error.h"
#include "tessel/plan/cluster.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  tessel::plan::Cluster cluster;
  try {
    cluster = !text.empty() && text[0] == '@' ? tessel::plan::cluster_preset(std::string_view(text).substr(1))
                                              : tessel::plan::parse_cluster(text, "fuzz.yaml");
  } catch (const tessel::Error&) {
    return 0;
  }
  (void)cluster.devices();
  const std::string once = cluster.to_yaml();
  std::string twice;
  try {
    twice = tessel::plan::parse_cluster(once, "to_yaml()").to_yaml();
  } catch (const tessel::Error& e) {
    std::fprintf(stderr, "to_yaml() wrote a cluster that parse_cluster refuses: %s\n%s\n", e.what(), once.c_str());
    std::abort();
  }
  if (once != twice) {
    std::fprintf(stderr, "to_yaml() does not read back the same:\n%s\n---\n%s\n", once.c_str(), twice.c_str());
    std::abort();
  }
  return 0;
}
