// `tessel ckpt inspect DIR` (what a checkpoint folder holds and whether each step is complete)
// and `tessel ckpt export DIR OUT` (one consolidated Hugging Face checkpoint: model.safetensors
// and config.json).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "tessel/ckpt/checkpoint.h"
#include "tessel/ckpt/safetensors.h"
#include "tessel/ckpt/sharded.h"
#include "tessel/cli/commands.h"
#include "tessel/core/error.h"
#include "tessel/engine/training.h"

namespace tessel {

namespace {

namespace fs = std::filesystem;

bool is_step_folder(const fs::path& p) {
  return fs::exists(p / "manifest.json") || fs::exists(p / "trainer.json") ||
         checkpoint_step_of(p.filename().string()) >= 0;
}

// The folders `path` names: itself when a step folder, else its step folders and the
// temporary folders of unfinished saves, oldest first.
std::vector<fs::path> step_folders(const fs::path& path) {
  if (is_step_folder(path)) return {path};
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(path)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && (is_step_folder(e.path()) || (name.rfind(".step-", 0) == 0 && name.find(".tmp") != std::string::npos)))
      out.push_back(e.path());
  }
  std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) {
    auto key = [](const fs::path& p) {
      std::string n = p.filename().string();
      if (n[0] == '.') n = n.substr(1);
      return std::make_pair(n.size(), n);  // step-1000000 after step-999999
    };
    return key(a) < key(b);
  });
  return out;
}

// One step folder: a line, and with `tensors` one line per tensor. Returns whether complete.
bool inspect_step(const fs::path& dir, bool tensors, bool verify) {
  const std::string name = dir.filename().string();
  if (name[0] == '.') {
    std::printf("%s  INCOMPLETE: an unfinished save (it is removed at the next save or resume)\n", name.c_str());
    return false;
  }
  std::string why = checkpoint_incomplete(dir.string());
  std::optional<CheckpointReader> reader;
  if (why.empty()) {
    try {
      reader.emplace(dir.string());
      if (verify) why = reader->verify(0, 1);
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  if (!why.empty()) {
    std::printf("%s  INCOMPLETE: %s\n", name.c_str(), why.c_str());
    return false;
  }
  const Json& t = reader->trainer();
  std::string layout = "one rank";
  if (const Json* l = t.find("layout"); l && l->is_object())
    layout = fmt::format("{} on {} {} rank{}", l->at("parallel").as_string(), l->at("world_size").as_int(),
                         l->at("backend").as_string(), l->at("world_size").as_int() == 1 ? "" : "s");
  std::map<std::string, int> count;
  std::map<std::string, double> bytes;
  std::set<std::string> files;
  for (const std::string& n : reader->names()) {
    const std::string g = reader->group(n);
    ++count[g];
    bytes[g] += static_cast<double>(shape_numel(reader->shape(n)) *
                                    static_cast<int64_t>(safetensors_dtype_size(reader->dtype(n))));
  }
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") files.insert(e.path().filename().string());
  std::string groups;
  for (const auto& [g, c] : count)
    groups += fmt::format("{}{} {} tensors ({})", groups.empty() ? "" : ", ", g, c,
                          bytes_str(static_cast<int64_t>(bytes[g])));
  std::printf("%s  complete%s: step %lld, %s model, saved by %s; %s in %zu files\n", name.c_str(),
              verify ? " (checksums verified)" : "", static_cast<long long>(reader->step()),
              t.find("arch") ? t.at("arch").as_string().c_str() : "?", layout.c_str(), groups.c_str(), files.size());
  if (tensors) {
    const fs::path index = dir / "checkpoint.json";
    Json idx;
    if (fs::exists(index)) {
      std::ifstream in(index);
      std::stringstream text;
      text << in.rdbuf();
      idx = Json::parse(text.str());
    }
    for (const std::string& n : reader->names()) {
      std::string placements, pieces;
      if (idx.is_object())
        if (const Json* e = idx.at("tensors").find(n)) {
          placements = e->at("placements").as_string();
          pieces = fmt::format("{} piece{}", e->at("pieces").as_array().size(), e->at("pieces").as_array().size() == 1 ? "" : "s");
        }
      std::printf("  %-56s %-5s %-16s %s %s\n", n.c_str(), reader->dtype(n).c_str(), shape_str(reader->shape(n)).c_str(),
                  placements.c_str(), pieces.c_str());
    }
  }
  return true;
}

// Hugging Face's config.json for the checkpoint's model, from the settings trainer.json records.
Json hf_config(const Json& trainer) {
  const Json* s = trainer.find("settings");
  TESSEL_CHECK_AS(CheckpointError, s && s->is_object(), "trainer.json records no model settings (a checkpoint from an "
                  "older tessel); export needs them for config.json");
  auto text = [&](const std::string& key) {
    const Json* v = s->find("model." + key);
    TESSEL_CHECK_AS(CheckpointError, v != nullptr, "trainer.json's settings lack model.{}", key);
    return v->as_string();
  };
  auto integer = [&](const std::string& key) { return Json(static_cast<int64_t>(std::stoll(text(key)))); };
  auto real = [&](const std::string& key) { return Json(std::stod(text(key))); };
  Json c = Json::Object{};
  const std::string arch = text("arch");
  if (arch == "gpt2") {
    c["architectures"] = Json(Json::Array{Json("GPT2LMHeadModel")});
    c["model_type"] = "gpt2";
    for (const char* k : {"n_layer", "n_embd", "n_head", "vocab_size", "n_positions"}) c[k] = integer(k);
    c["n_ctx"] = integer("n_positions");
    c["layer_norm_epsilon"] = real("layer_norm_epsilon");
    c["initializer_range"] = real("initializer_range");
    c["resid_pdrop"] = real("dropout");
    // Recorded only where they differ from the residual rate.
    c["embd_pdrop"] = s->find("model.embd_dropout") ? real("embd_dropout") : real("dropout");
    c["attn_pdrop"] = s->find("model.attn_dropout") ? real("attn_dropout") : real("dropout");
    c["activation_function"] = "gelu_new";
    c["tie_word_embeddings"] = true;
  } else {
    const bool moe = arch == "mixtral";
    c["architectures"] = Json(Json::Array{Json(moe ? "MixtralForCausalLM" : "LlamaForCausalLM")});
    c["model_type"] = moe ? "mixtral" : "llama";
    if (moe) {
      for (const char* k : {"num_local_experts", "num_experts_per_tok"}) c[k] = integer(k);
      c["router_aux_loss_coef"] = real("router_aux_loss_coef");
      TESSEL_CHECK_AS(CheckpointError, text("decoder_sparse_step") == "1" && text("shared_expert_intermediate_size") == "0" &&
                          text("router_scores") == "softmax" && text("norm_topk_prob") == "true" &&
                          std::stod(text("capacity_factor")) == 0,
                      "this mixture of experts is not a Mixtral (dense blocks, a shared expert, sigmoid or "
                      "unnormalised scores, or a capacity): Hugging Face's MixtralForCausalLM would compute another "
                      "model; export refuses rather than mislabel it");
    }
    for (const char* k : {"num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                          "intermediate_size", "vocab_size", "max_position_embeddings"})
      c[k] = integer(k);
    c["rope_theta"] = real("rope_theta");
    c["rms_norm_eps"] = real("rms_norm_eps");
    c["initializer_range"] = real("initializer_range");
    c["hidden_act"] = "silu";
    c["tie_word_embeddings"] = false;
  }
  c["torch_dtype"] = "float32";
  return c;
}

}  // namespace

std::vector<Command> register_ckpt(CLI::App& app) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "inspect and export training checkpoints");
  ckpt->require_subcommand(1);

  struct Args {
    std::string dir, out;
    bool tensors = false, verify = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* inspect = ckpt->add_subcommand(
      "inspect", "list the step folders of a checkpoint folder (or one step folder): complete or not and why, the "
                 "step, the layout that saved it, its tensors and sizes; exit 0 when a complete step is there");
  inspect->add_option("dir", a->dir, "a --save folder, or one step-NNNNNN folder in it")->required();
  inspect->add_flag("--tensors", a->tensors, "also list every tensor: dtype, shape, saved placements, pieces");
  inspect->add_flag("--verify", a->verify, "also check every piece against its checksum (reads the whole checkpoint)");
  CLI::App* exp = ckpt->add_subcommand(
      "export", "write one consolidated Hugging Face checkpoint (model.safetensors + config.json) from a step folder "
                "(or the newest complete one in a --save folder), whatever layout saved it");
  exp->add_option("dir", a->dir, "a --save folder, or one step-NNNNNN folder in it")->required();
  exp->add_option("out", a->out, "the folder to write (created; existing files of the same names are replaced)")->required();
  return {{inspect,
           [a] {
             if (!fs::is_directory(a->dir)) throw BadInput(fmt::format("'{}' is not a folder", a->dir));
             const std::vector<fs::path> steps = step_folders(a->dir);
             if (steps.empty()) throw BadInput(fmt::format("no step-NNNNNN folder in '{}'", a->dir));
             bool any = false;
             for (const fs::path& p : steps) any = inspect_step(p, a->tensors, a->verify) || any;
             return any ? 0 : 2;
           }},
          {exp, [a] {
             std::string step;
             try {
               step = choose_checkpoint(a->dir, nullptr);
             } catch (const CheckpointError& e) {
               throw BadInput(e.what());
             }
             CheckpointReader reader(step);
             std::map<std::string, Tensor> model;
             std::vector<CheckpointTensor> targets;
             for (const std::string& n : reader.names()) {
               if (reader.group(n) != "model") continue;
               model[n] = Tensor::empty(reader.shape(n), safetensors_tessel_dtype(reader.dtype(n)));
               targets.push_back({n, model[n], {}});
             }
             if (model.empty()) throw BadInput(fmt::format("'{}' holds no model tensors", step));
             const Json config = hf_config(reader.trainer());
             reader.read(targets);
             // Mixtral's experts are stacked here ([E, ...] per matrix) and one tensor each there.
             if (config.at("model_type").as_string() == "mixtral")
               for (const auto& t : targets)
                 if (t.name.find(".block_sparse_moe.experts.w") != std::string::npos) split_stacked(model, t.name);
             std::error_code ec;
             fs::create_directories(a->out, ec);
             if (ec) throw BadInput(fmt::format("cannot create '{}': {}", a->out, ec.message()));
             save_safetensors((fs::path(a->out) / "model.safetensors").string(), model, {{"format", "pt"}});
             std::ofstream out(fs::path(a->out) / "config.json");
             out << config.dump() << "\n";
             out.close();
             TESSEL_CHECK(out.good(), "writing '{}' failed", (fs::path(a->out) / "config.json").string());
             std::printf("exported %s (step %lld, %zu tensors) to %s/model.safetensors and config.json\n", step.c_str(),
                         static_cast<long long>(reader.step()), model.size(), a->out.c_str());
             return 0;
           }}};
}

}  // namespace tessel
