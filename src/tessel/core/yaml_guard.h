// A first pass over YAML text, before any node tree is built or walked: refuses what would make
// a later walk slow or a key ambiguous, naming the file, the line and the key path.
//
//  - Aliases are expanded only by counting: a document whose nodes, with every alias expanded,
//    exceed kMaxYamlNodes is refused. Ten aliases of ten aliases nine levels deep fit in under a
//    kilobyte and expand to 10^9 nodes; a walk of them (a duplicate-key check, a conversion to
//    JSON) would run for minutes.
//  - A key given twice in one mapping is refused (yaml-cpp keeps both and reads the first).
//  - A key that is not a plain value (a mapping, a list, null) is refused.
//
// Header-only: yaml-cpp is linked by the readers that include this (the training config, the
// cluster file), not by core.
#pragma once

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tessel/core/error.h"

namespace tessel {

// Nodes of one YAML document with its aliases expanded. Configs and cluster files hold a few
// hundred; a Hugging Face config.json a few thousand at most.
inline constexpr int64_t kMaxYamlNodes = 100'000;

namespace detail {

class YamlGuard : public YAML::EventHandler {
 public:
  // `label` starts a key's name in messages: "config 'train.lr' is given twice".
  YamlGuard(std::string source, std::string label) : source_(std::move(source)), label_(std::move(label)) {}

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    if (key_expected()) fail(mark, "a key must be a name, not null (nothing, or ~)");
    leaf(mark, anchor, std::nullopt);
  }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor, const std::string& value) override {
    leaf(mark, anchor, value);
  }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    auto it = anchors_.find(anchor);
    const int64_t size = it == anchors_.end() ? 1 : it->second.size;
    if (key_expected()) {
      if (it == anchors_.end() || !it->second.scalar)
        fail(mark, "a key must be a plain name, not an alias of a mapping, a list or null");
      take_key(mark, *it->second.scalar);
      count(mark, size);
      return;
    }
    count(mark, size);
    add_child(size);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    open(mark, anchor, false);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    open(mark, anchor, true);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Frame {
    bool map = false;
    bool at_key = true;  // a mapping's next child is a key
    std::string path, key;
    std::map<std::string, int> keys;  // key -> line of its first appearance
    int64_t size = 1;
    YAML::anchor_t anchor = 0;
  };
  struct Anchor {
    int64_t size = 1;
    std::optional<std::string> scalar;  // the value of an anchored plain value
  };

  bool key_expected() const { return !stack_.empty() && stack_.back().map && stack_.back().at_key; }

  [[noreturn]] void fail(const YAML::Mark& mark, const std::string& why) const {
    std::string where = mark.line >= 0 ? fmt::format("{}:{}", source_, mark.line + 1) : source_;
    const std::string path = stack_.empty() ? "" : stack_.back().path;
    throw InputError(path.empty() ? fmt::format("{}: {}", where, why)
                                  : fmt::format("{}: {} (in {} '{}')", where, why, label_, path));
  }

  void count(const YAML::Mark& mark, int64_t nodes) {
    total_ += nodes;
    if (total_ > kMaxYamlNodes)
      fail(mark, fmt::format("more than {} nodes with its aliases (*name) expanded; a file this reader takes is "
                             "far smaller — write the values out instead of nesting aliases",
                             kMaxYamlNodes));
  }

  void take_key(const YAML::Mark& mark, const std::string& key) {
    Frame& f = stack_.back();
    const std::string full = f.path.empty() ? key : f.path + "." + key;
    auto [it, fresh] = f.keys.emplace(key, mark.line + 1);
    if (!fresh) {
      const std::string where = mark.line >= 0 ? fmt::format("{}:{}", source_, mark.line + 1) : source_;
      throw InputError(fmt::format("{}: {} '{}' is given twice (first at line {}); give it once", where, label_, full,
                                   it->second));
    }
    f.key = key;
    f.at_key = false;
  }

  // A finished child of `size` nodes: counted into its parent; a mapping's next child is a key.
  void add_child(int64_t size) {
    if (stack_.empty()) return;
    Frame& f = stack_.back();
    f.size = std::min(f.size + size, kMaxYamlNodes + 1);
    if (f.map) f.at_key = true;
  }

  void leaf(const YAML::Mark& mark, YAML::anchor_t anchor, const std::optional<std::string>& value) {
    if (key_expected()) {
      take_key(mark, *value);
      count(mark, 1);
      if (anchor) anchors_[anchor] = Anchor{1, value};
      return;
    }
    count(mark, 1);
    if (anchor) anchors_[anchor] = Anchor{1, value};
    add_child(1);
  }

  void open(const YAML::Mark& mark, YAML::anchor_t anchor, bool map) {
    if (key_expected()) fail(mark, "a key must be a plain name, not a mapping or a list");
    count(mark, 1);
    Frame f;
    f.map = map;
    f.anchor = anchor;
    if (!stack_.empty()) {
      const Frame& parent = stack_.back();
      f.path = parent.map && !parent.key.empty() ? (parent.path.empty() ? parent.key : parent.path + "." + parent.key)
                                                 : parent.path;
    }
    stack_.push_back(std::move(f));
  }

  void close() {
    Frame f = std::move(stack_.back());
    stack_.pop_back();
    if (f.anchor) anchors_[f.anchor] = Anchor{f.size, std::nullopt};
    add_child(f.size);
  }

  std::string source_, label_;
  std::vector<Frame> stack_;
  std::map<YAML::anchor_t, Anchor> anchors_;
  int64_t total_ = 0;
};

}  // namespace detail

// Checks the first document of `text` (the one YAML::Load reads) as the header says; throws
// InputError naming `source` and the line. Text that is not valid YAML is refused here too:
// "SOURCE: not valid YAML: ...". `label` names keys in messages ("config", "key").
inline void check_yaml_text(const std::string& text, const std::string& source, const std::string& label) {
  std::stringstream in(text);
  detail::YamlGuard guard(source, label);
  try {
    YAML::Parser parser(in);
    parser.HandleNextDocument(guard);
  } catch (const YAML::Exception& e) {
    throw InputError(fmt::format("{}: not valid YAML: {}", source, e.what()));
  }
}

}  // namespace tessel
