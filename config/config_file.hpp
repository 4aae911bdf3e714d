#pragma once
// Config files: where the default one lives, reading one (every problem named by file, line
// and key), and writing one atomically so an interrupted write leaves the old file intact.

#include <cstddef>
#include <string>

#include "config/config.hpp"

namespace accel::config {

// The largest config file read (a real one is under 1 KiB): anything bigger is a mistake,
// refused by name before it is read into memory.
inline constexpr std::size_t kMaxConfigFileBytes = std::size_t(1) << 20;

// $ACCEL_CONFIG_FILE if set, else $XDG_CONFIG_HOME/accelerate-cpp/default_config.yaml, else
// ~/.config/accelerate-cpp/default_config.yaml.
std::string default_config_path();

// The file over the defaults (detected on this machine), checked key by key and across keys.
// Throws ConfigError "PATH:LINE: key 'KEY': PROBLEM" (or "PATH: ..." when the file cannot be
// read, is not a regular file or is over kMaxConfigFileBytes; "PATH:LINE: invalid YAML: ..."
// when it does not parse; "PATH:LINE: ..." for a second document or a quote never closed).
// A key with no value is an error; `key: null` leaves it at its default. Accelerate keys without a
// meaning here land in notes, not errors.
ResolvedConfig load_config_file(const std::string& path);

// The YAML `save_config` writes: the keys that apply to this config (is_written), in schema
// order, quoted where YAML 1.1 readers (PyYAML) would otherwise misread them ('NO', 'no').
std::string to_yaml(const Config&);

// Checks the config (ConfigError if its keys contradict each other), then writes it with
// write_file_atomically (foundation/file_io.hpp), creating the directory.
void save_config(const std::string& path, const Config&);

}  // namespace accel::config
