// AcceleratorOptions' config keys: each one a key of the config schema, and a value set in
// code is the one the Accelerator runs with (the top layer over the file and the environment).

#include <doctest/doctest.h>

#include <string>

#include "accelerate/accelerator.hpp"
#include "config/config.hpp"
#include "tests/support/files.hpp"

using namespace accel;
using namespace accel::test;

TEST_CASE("every config key AcceleratorOptions carries is a key of the schema") {
#define ACCEL_CHECK_SCHEMA_KEY(type, key) \
  CHECK_MESSAGE(config::find_key(#key) != nullptr, #key " is not a config key");
  ACCEL_CONFIG_KEYS_IN_CODE(ACCEL_CHECK_SCHEMA_KEY)
#undef ACCEL_CHECK_SCHEMA_KEY
}

TEST_CASE("a value set in code wins over the config file's, and the accessors read it") {
  TempDir dir("accel_options");
  write_file(dir.file("config.yaml"),
             "distributed_type: MULTI_CPU\ngradient_accumulation_steps: 2\nproject_dir: from_file\n"
             "state_dict_type: FULL_STATE_DICT\n");
  AcceleratorOptions options;
  options.communicator = "local";
  options.config_file = dir.file("config.yaml");
  options.gradient_accumulation_steps = 3;
  options.project_dir = dir.file("from_code");
  options.state_dict_type = "SHARDED_STATE_DICT";
  options.auto_wrap_policy = "NO_WRAP";
  options.activation_checkpointing = true;
  options.mixed_precision = "bf16";
  options.global_batch_size = 6;
  Accelerator acc(options);
  CHECK(acc.gradient_accumulation_steps() == 3);
  CHECK(acc.project_dir() == dir.file("from_code"));
  CHECK(acc.logging_dir() == dir.file("from_code"));  // project_dir when logging_dir is not set
  CHECK(acc.state_dict_type() == config::StateDictType::SHARDED_STATE_DICT);
  CHECK(acc.auto_wrap_policy() == config::AutoWrapPolicy::NO_WRAP);
  CHECK(acc.activation_checkpointing());
  CHECK(acc.mixed_precision() == "bf16");
  CHECK(acc.batch_size_for(100) == 6);  // a world of one: the whole global batch
}

TEST_CASE("a code value the schema refuses names the key") {
  AcceleratorOptions options;
  options.communicator = "local";
  options.state_dict_type = "HALF_STATE_DICT";
  CHECK_THROWS_WITH_AS(Accelerator{options}, doctest::Contains("state_dict_type"), ConfigError);
}
