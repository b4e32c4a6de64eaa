// Training configs: a YAML file with sections model, data, train, parallel and log (the values:
// tessel/engine/run_config.h), read strictly — an unknown key or a value of the wrong type is an
// error naming its key path and line — with `--set key.path=value` overrides applied first.
// Model sizes use Hugging Face's config names, and `model.hf_config: config.json` takes them
// from a Hugging Face config file.
#pragma once

#include <string>
#include <vector>

#include "tessel/engine/run_config.h"

namespace tessel {

// What the config is read for: training needs every section; planning reads the model and the
// train section's sizes, so a config of a `model` section alone is enough.
enum class ConfigUse { training, planning };

// Reads and validates a config file (paths in it are relative to the file's folder). Every error
// is an InputError naming the file and the key: a config that is not a regular file (a pipe, a
// folder), YAML aliases expanding past kMaxYamlNodes, a key given twice or not a plain name, a
// number that is not finite, a size past the bounds of tessel/core/limits.h.
RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides = {},
                          ConfigUse use = ConfigUse::training);
// Same from YAML text; `base_dir` resolves relative paths.
RunConfig parse_run_config(const std::string& yaml_text, const std::vector<std::string>& overrides,
                           const std::string& base_dir, const std::string& source_name,
                           ConfigUse use = ConfigUse::training);

}  // namespace tessel
