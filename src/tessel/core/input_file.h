// Files a user names — configs, Hugging Face config.json files, cluster descriptions, token
// files — are looked at with stat() before they are opened, so a named pipe, a device or a folder
// is refused by name at once instead of blocking forever in open() or failing later in a
// library's words, and an over-long name or missing file is an error naming the key that gave it.
#pragma once

#include <string>
#include <string_view>

namespace tessel {

// `path` for a message: itself, or its first 120 characters and its length when longer (a name
// over the system's limit is thousands of characters).
std::string shown_path(const std::string& path);

// Why `path` is not a regular file that can be read ("no such file", "a named pipe, not a
// regular file", "a folder, not a file", "the name is longer than this system allows", ...), or
// "" when it is one. Follows symbolic links. Never opens the file.
std::string input_file_problem(const std::string& path);

// Throws InputError "WHAT 'PATH': PROBLEM" unless input_file_problem(path) is "". `what` names
// where the path came from: "config model.hf_config", "--cluster", "data file".
void check_input_file(const std::string& path, std::string_view what);

// check_input_file, then the whole file. The file is opened without blocking and checked again,
// so a file swapped for a pipe between the two looks is refused too. Files over `max_bytes`
// are refused (text inputs are small; this is not the reader for token files).
std::string read_input_file(const std::string& path, std::string_view what, size_t max_bytes = size_t{64} << 20);

}  // namespace tessel
