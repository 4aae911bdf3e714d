// Checkpoints: the manifest and CRC-32; save/load of a checkpoint directory in this process
// (world of one) with every kind of damage; and, over real processes (checkpoint_worker),
// resume equal bitwise to an uninterrupted run after the job was killed, at world 1 and 2,
// from end-of-epoch and mid-epoch save points; a job killed at each stage of a save; loading
// at another world size; a save killed before each of its filesystem changes in turn; a rerun
// under the same pid (a container restart); and a short run of the Fashion-MNIST raw_mlp
// example.

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "accelerate/accelerator.hpp"
#include "accelerate/checkpointing/checkpoint.hpp"
#include "accelerate/checkpointing/checkpoint_manifest.hpp"
#include "accelerate/checkpointing/optimizer_state.hpp"
#include "backends/comm/local_communicator.hpp"
#include "backends/comm/registry.hpp"
#include "backends/optim/sgd.hpp"
#include "examples/raw_mlp/mlp.hpp"
#include "tests/support/ranks.hpp"
#include "tests/support/skip.hpp"

using namespace accel;
using namespace accel::test;
namespace fs = std::filesystem;

namespace {

// A fresh directory under /tmp (or `base`), removed again (quietly) at the end of the test.
class TempDir {
 public:
  explicit TempDir(const fs::path& base = fs::temp_directory_path()) {
    static int n = 0;
    path_ =
        base / ("accel_checkpoint_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

// The message of the CheckpointError fn throws ("" and a failed check if none).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  FAIL_CHECK("no CheckpointError");
  return "";
}

std::span<const char> view(const std::string& s) { return {s.data(), s.size()}; }

// Shared blobs a and b, per-rank blob r, as a world of one saves them.
void save_small(const fs::path& dir, std::uint64_t step = 3) {
  LocalCommunicator comm;
  const std::string a = "alpha bytes", b1(500, 'b'), b2(500, 'b'), r = "rank state";
  CheckpointContents c;
  c.meta.step = step;
  c.meta.epoch = 1;
  c.meta.batch = 2;
  c.meta.seed = 9;
  c.shared = {{"a", {view(a)}}, {"b", {view(b1), view(b2)}}};
  c.per_rank = {{"r", {view(r)}}};
  save_checkpoint(comm, dir.string(), c);
}

std::vector<fs::path> siblings_of(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir.parent_path()))
    if (e.path().filename().string().starts_with(dir.filename().string() + "."))
      out.push_back(e.path());
  return out;
}

// The siblings of dir whose names start with "DIR<marker>" (".old-", ".trash-").
std::vector<fs::path> siblings_of(const fs::path& dir, const std::string& marker) {
  std::vector<fs::path> out;
  for (const fs::path& p : siblings_of(dir))
    if (p.filename().string().starts_with(dir.filename().string() + marker)) out.push_back(p);
  return out;
}

// save_small(dir, step) in a child process that SIGKILLs itself just before the filesystem
// change (hook stage "fs:*") for which die(stage, index) says so: a real crash mid-save.
// `take_old` first renames every DIR.old-* to DIR.old-<child's pid>, as a rerun whose pid
// repeats (a container restart) would find the copy its predecessor moved aside.
// Returns true when the child was killed, false when the save completed.
bool save_in_child(const fs::path& dir, std::uint64_t step,
                   const std::function<bool(std::string_view, std::size_t)>& die,
                   bool take_old = false) {
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::size_t n = 0;
    checkpoint_testing::set_stage_hook([&](std::string_view stage) {
      if (stage.starts_with("fs:") && die(stage, n++)) ::kill(::getpid(), SIGKILL);
    });
    try {
      if (take_old)
        for (const fs::path& old : siblings_of(dir, ".old-"))
          fs::rename(old, dir.string() + ".old-" + std::to_string(::getpid()));
      save_small(dir, step);
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  if (WIFSIGNALED(status)) {
    REQUIRE(WTERMSIG(status) == SIGKILL);
    return true;
  }
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return false;
}

// The filesystem changes ("fs:*" stages) of save_small(dir, step), in order.
std::vector<std::string> fs_changes_of_save(const fs::path& dir, std::uint64_t step) {
  std::vector<std::string> ops;
  checkpoint_testing::set_stage_hook([&](std::string_view stage) {
    if (stage.starts_with("fs:")) ops.emplace_back(stage);
  });
  save_small(dir, step);
  checkpoint_testing::set_stage_hook(nullptr);
  return ops;
}

bool gloo_available() { return communicator_available("gloo"); }

std::size_t batches_per_epoch(int world) {
  return (90 + 4 * std::size_t(world) - 1) / (4 * std::size_t(world));
}

launch::GroupResult run_worker(int world, std::vector<std::string> args,
                               bool stop_on_failure = true) {
  RanksOptions options;
  options.stop_on_failure = stop_on_failure;
  options.timeout = std::chrono::milliseconds(60000);
  if (world > 1) options.env = {{"ACCEL_COMM_BACKEND", "gloo"}};
  return run_ranks(world, "checkpoint_worker", args, options);
}

std::string output_of(const launch::GroupResult& r) {
  std::string all;
  for (const auto& w : r.workers) all += w.output;
  return all;
}

void expect_success(const launch::GroupResult& r) {
  INFO(describe(r));
  REQUIRE(r.exit_code() == 0);
}

// A rank SIGKILLed itself (the others may then have failed or been stopped, in either order).
void expect_killed(const launch::GroupResult& r) {
  INFO(describe(r));
  REQUIRE(r.exit_code() != 0);
  REQUIRE(std::any_of(r.workers.begin(), r.workers.end(),
                      [](const launch::WorkerExit& w) { return w.signal == SIGKILL; }));
}

// The "done: ..." line of each rank (micro-batches seen: per-rank state restored).
std::vector<std::string> done_lines(const launch::GroupResult& r) {
  std::vector<std::string> out;
  for (const auto& w : r.workers) {
    const auto at = w.output.find("done:");
    out.push_back(at == std::string::npos ? "" : w.output.substr(at, w.output.find('\n', at) - at));
  }
  return out;
}

}  // namespace

TEST_CASE("crc32 and the manifest") {
  const std::string check = "123456789";
  CHECK(crc32(view(check)) == 0xCBF43926u);  // the standard check value
  CHECK(crc32(view(check.substr(4)), crc32(view(check.substr(0, 4)))) == 0xCBF43926u);
  const std::string long_text(1001, 'x');  // through the 8-byte loop and the tail
  std::uint32_t byte_at_a_time = 0;
  for (char c : long_text) byte_at_a_time = crc32(std::span(&c, 1), byte_at_a_time);
  CHECK(crc32(view(long_text)) == byte_at_a_time);

  Manifest m;
  m.meta = {2, 2, 14, 1, 3, 42};
  m.blobs = {{"parameters", 5130, 0x1c291ca3u}, {"rng.rank0", 6980, 0x0a9b7e21u}};
  const std::string text = format_manifest(m);
  const Manifest back = parse_manifest(text, "M");
  CHECK(back.meta.world_size == 2);
  CHECK(back.meta.step == 14);
  CHECK(back.meta.epoch == 1);
  CHECK(back.meta.batch == 3);
  CHECK(back.meta.seed == 42);
  REQUIRE(back.blobs.size() == 2);
  CHECK(back.blobs[1].name == "rng.rank0");
  CHECK(back.blobs[1].size == 6980);
  CHECK(back.blobs[1].crc32 == 0x0a9b7e21u);

  CHECK(error_of([&] {
          parse_manifest(text.substr(0, text.size() / 2), "M");
        }).find("M: truncated") == 0);
  std::string changed = text;
  changed[changed.find("step: 14") + 6] = '5';
  CHECK(error_of([&] { parse_manifest(changed, "M"); }).find("M: manifest checksum mismatch") == 0);
  CHECK_THROWS_AS(check_blob_name("../x"), InvalidArgument);
  CHECK_THROWS_AS(check_blob_name(".hidden"), InvalidArgument);
  CHECK_THROWS_AS(check_blob_name("a b"), InvalidArgument);
}

TEST_CASE("optimizer state bytes parse; truncated or overlong ones are refused, nothing loaded") {
  // SGD with momentum on two segments: one state array each, the momentum buffer.
  std::vector<float> a = {1, 2, 3}, ga = {0.5f, -1, 2}, b = {4, 5}, gb = {1, 1};
  const std::vector<ParamSegment> segments = {
      {0, buffer_of(std::span(a)), buffer_of(std::span(ga)), 0},
      {0, buffer_of(std::span(b)), buffer_of(std::span(gb)), 3}};
  Sgd sgd(SgdOptions{.lr = 0.1, .momentum = 0.9});
  sgd.step(segments);
  sgd.step(segments);
  const std::string bytes = sgd.save_state();
  const SavedOptimizerState saved = parse_optimizer_state(bytes, "test");
  CHECK(saved.step == 2);
  REQUIRE(saved.segments.size() == 2);
  CHECK(saved.segments[0].count == 3);
  CHECK(saved.segments[1].count == 2);
  CHECK(saved.segments[0].slots == 1);
  // Momentum after two steps of the same gradient g: g + 0.9 g.
  CHECK(saved.segments[0].slot(0) == std::vector<float>{0.5f + 0.9f * 0.5f, -1.9f, 3.8f});

  CHECK_THROWS_WITH_AS(parse_optimizer_state(bytes.substr(0, bytes.size() - 1), "test"),
                       doctest::Contains("test: truncated in segment 1"), InvalidArgument);
  CHECK_THROWS_WITH_AS(parse_optimizer_state(bytes + "x", "test"),
                       doctest::Contains("test: 1 bytes left over"), InvalidArgument);
  CHECK_THROWS_WITH_AS(read_optimizer_bytes(bytes.substr(0, 12), "ck/state.optimizer"),
                       doctest::Contains("ck/state.optimizer: optimizer state: truncated at the "
                                         "segment count"),
                       CheckpointError);
  // A damaged blob changes nothing: the optimizer still saves what it had.
  Sgd other(SgdOptions{.lr = 0.1, .momentum = 0.9});
  other.load_state(bytes);
  CHECK_THROWS_AS(other.load_state(bytes.substr(0, bytes.size() - 4)), InvalidArgument);
  CHECK(other.save_state() == bytes);
}

TEST_CASE("a checkpoint directory round-trips; damage is reported naming the file") {
  TempDir tmp;
  const fs::path dir = tmp / "ck";
  save_small(dir);
  CHECK(fs::exists(dir / "MANIFEST"));
  CHECK(siblings_of(dir).empty());  // no DIR.tmp-* or DIR.old-* left

  LoadedCheckpoint ck = read_checkpoint(dir.string() + "/", 0, 1);
  CHECK(ck.dir == dir.string());
  CHECK(ck.meta.step == 3);
  CHECK(ck.meta.batch == 2);
  CHECK(ck.shared_blob("a") == "alpha bytes");
  CHECK(ck.shared_blob("b") == std::string(1000, 'b'));
  CHECK(ck.per_rank_loaded);
  CHECK(ck.per_rank.at("r") == "rank state");
  CHECK(error_of([&] { ck.shared_blob("zz"); }).find("zz: missing") != std::string::npos);
  // Another world size: shared blobs only.
  ck = read_checkpoint(dir.string(), 1, 2);
  CHECK(!ck.per_rank_loaded);
  CHECK(ck.per_rank.empty());

  SUBCASE("a flipped byte") {
    std::string b = read_bytes(dir / "b");
    b[700] ^= 0x10;
    write_bytes(dir / "b", b);
    const std::string e = error_of([&] { read_checkpoint(dir.string(), 0, 1); });
    CHECK(e.find((dir / "b").string() + ": checksum mismatch") == 0);
  }
  SUBCASE("a missing blob") {
    fs::remove(dir / "a");
    const std::string e = error_of([&] { read_checkpoint(dir.string(), 0, 1); });
    CHECK(e.find((dir / "a").string() + ": missing") == 0);
  }
  SUBCASE("a truncated blob") {
    write_bytes(dir / "b", std::string(999, 'b'));
    const std::string e = error_of([&] { read_checkpoint(dir.string(), 0, 1); });
    CHECK(e.find((dir / "b").string() + ": size 999 bytes, MANIFEST says 1000") == 0);
  }
  SUBCASE("a truncated manifest") {
    const std::string m = read_bytes(dir / "MANIFEST");
    write_bytes(dir / "MANIFEST", m.substr(0, m.size() - 12));
    const std::string e = error_of([&] { read_checkpoint(dir.string(), 0, 1); });
    CHECK(e.find((dir / "MANIFEST").string() + ": truncated manifest") == 0);
  }
  SUBCASE("a missing manifest") {
    fs::remove(dir / "MANIFEST");
    const std::string e = error_of([&] { read_checkpoint(dir.string(), 0, 1); });
    CHECK(e.find((dir / "MANIFEST").string() + ": missing") == 0);
  }
  SUBCASE("no checkpoint at all") {
    const std::string e = error_of([&] { read_checkpoint((tmp / "nothing").string(), 0, 1); });
    CHECK(e.find("nothing: no checkpoint there") != std::string::npos);
    CHECK(!checkpoint_exists((tmp / "nothing").string()));
    fs::create_directories(tmp / "empty");  // made by `mkdir -p` before the first run
    CHECK(!checkpoint_exists((tmp / "empty").string()));
    save_small(tmp / "empty");
    CHECK(read_checkpoint((tmp / "empty").string(), 0, 1).meta.step == 3);
  }
}

TEST_CASE(
    "the recovery rule: DIR, else DIR.old-*; DIR.tmp-* never read and cleaned by the next save") {
  TempDir tmp;
  const fs::path dir = tmp / "ck";
  save_small(dir, 3);
  // Names that are not ours (our ids are 16 hex digits, or a pid in older versions) are a
  // user's: never read or removed, though saved later than ours.
  const std::vector<std::string> users = {"ck.old-backup", "ck.tmp-keep", "ck.trash-mine",
                                          "ck.trash-2024"};
  for (const std::string& mine : users) save_small(tmp / mine, 1);
  // A crash between the two renames: DIR moved aside, the new one still DIR.tmp-*.
  fs::rename(dir, tmp / "ck.old-4242");
  fs::create_directories(tmp / "ck.tmp-777");
  write_bytes(tmp / "ck.tmp-777" / "MANIFEST", "half");
  CHECK(checkpoint_exists(dir.string()));
  CHECK(resolve_checkpoint_dir(dir.string()) == (tmp / "ck.old-4242").string());
  CHECK(read_checkpoint(dir.string(), 0, 1).meta.step == 3);

  save_small(dir, 4);  // the next save puts a new DIR in place and removes both leftovers
  CHECK(read_checkpoint(dir.string(), 0, 1).meta.step == 4);
  for (const std::string& mine : users) {
    CHECK(read_checkpoint((tmp / mine).string(), 0, 1).meta.step == 1);
    fs::remove_all(tmp / mine);
  }
  CHECK(siblings_of(dir).empty());

  // A directory that is not a checkpoint is never replaced.
  fs::create_directories(tmp / "mine");
  write_bytes(tmp / "mine" / "notes.txt", "keep me");
  const std::string e = error_of([&] { save_small(tmp / "mine"); });
  CHECK(e.find("not a checkpoint") != std::string::npos);
  CHECK(read_bytes(tmp / "mine" / "notes.txt") == "keep me");
}

TEST_CASE("a save killed before each of its filesystem changes in turn loses nothing") {
  // Starting points: a complete DIR; and DIR moved aside by a crash between the two renames,
  // its copy named after the pid of the process that saves next (a restart with the same pid).
  for (const bool moved_aside : {false, true}) {
    CAPTURE(moved_aside);
    auto start = [&](const fs::path& dir) {
      save_small(dir, 3);
      if (moved_aside)
        REQUIRE(save_in_child(dir, 4,
                              [](std::string_view s, std::size_t) { return s == "fs:rename in"; }));
    };
    // The same save uninterrupted, to know which changes come before the new DIR is in place.
    std::vector<std::string> ops;
    {
      TempDir probe;
      start(probe / "ck");
      for (const fs::path& old : siblings_of(probe / "ck", ".old-"))
        fs::rename(old, (probe / "ck").string() + ".old-" + std::to_string(::getpid()));
      ops = fs_changes_of_save(probe / "ck", 4);
    }
    REQUIRE(std::count(ops.begin(), ops.end(), "fs:rename in") == 1);
    const std::size_t in_place =
        std::size_t(std::find(ops.begin(), ops.end(), "fs:rename in") - ops.begin());
    // In memory where there is some: what is tested is a killed process, not a lost disk
    // cache, and the sweep's thousands of fsyncs would take seconds on a disk.
    const fs::path base =
        fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    std::size_t kills = 0;
    for (std::size_t k = 0; k <= ops.size(); ++k) {
      CAPTURE(k);
      CAPTURE(k < ops.size() ? ops[k] : std::string("(none: the save completes)"));
      TempDir tmp(base);
      const fs::path dir = tmp / "ck";
      start(dir);
      const bool killed = save_in_child(
          dir, 4, [&](std::string_view, std::size_t n) { return n == k; }, true);
      CHECK(killed == (k < ops.size()));
      kills += killed;
      // The newest complete checkpoint loads: the new one once it was renamed in.
      const std::uint64_t newest = k > in_place ? 4 : 3;
      CHECK(read_checkpoint(dir.string(), 0, 1).meta.step == newest);
      // Nothing half-deleted is left where the loader would consider it.
      for (const fs::path& old : siblings_of(dir, ".old-")) {
        CAPTURE(old);
        CHECK_NOTHROW(read_checkpoint(old.string(), 0, 1));
      }
      // Loading finishes an interrupted removal; the next save removes every other leftover.
      LocalCommunicator comm;
      CHECK(load_checkpoint(comm, dir.string()).meta.step == newest);
      CHECK(siblings_of(dir, ".trash-").empty());
      save_small(dir, 5);
      CHECK(read_checkpoint(dir.string(), 0, 1).meta.step == 5);
      CHECK(siblings_of(dir).empty());
    }
    CHECK(kills == ops.size());
    const std::string start_name =
        moved_aside ? "after a crash between the renames" : "over a complete DIR";
    MESSAGE(start_name << ": " << kills
                       << " kill points, one before each filesystem change of the save");
  }
}

TEST_CASE("load_state checks the model and the registered states before applying anything") {
  TempDir tmp;
  const std::string dir = (tmp / "ck").string();
  raw_mlp::Mlp saved_model({6, 8, 3}, 1);
  {
    Accelerator acc;
    std::vector<ParamRef> params;
    for (auto& L : saved_model.layers()) {
      params.push_back({"w", buffer_of(std::span(L.weight)), buffer_of(std::span(L.weight_grad))});
      params.push_back({"b", buffer_of(std::span(L.bias)), buffer_of(std::span(L.bias_grad))});
    }
    acc.prepare_parameters(params);
    acc.register_state(
        "opt", [] { return std::string("O"); }, [](const std::string&) {});
    acc.set_epoch(2);
    acc.save_state(dir);
  }
  auto try_load = [&](std::vector<int> sizes, bool register_opt, bool register_extra) {
    raw_mlp::Mlp model(sizes, 2);
    Accelerator acc;
    std::vector<ParamRef> params;
    for (auto& L : model.layers()) {
      params.push_back({"w", buffer_of(std::span(L.weight)), buffer_of(std::span(L.weight_grad))});
      params.push_back({"b", buffer_of(std::span(L.bias)), buffer_of(std::span(L.bias_grad))});
    }
    acc.prepare_parameters(params);
    std::string loaded;
    if (register_opt)
      acc.register_state(
          "opt", [] { return std::string(); }, [&](const std::string& s) { loaded = s; });
    if (register_extra)
      acc.register_state(
          "sched", [] { return std::string(); }, [](const std::string&) {});
    const auto before = model.layers()[0].weight;
    std::string error;
    try {
      acc.load_state(dir);
    } catch (const CheckpointError& e) {
      error = e.what();
      CHECK(model.layers()[0].weight == before);  // nothing applied
      CHECK(loaded.empty());
    }
    if (error.empty()) {
      CHECK(loaded == "O");
      CHECK(model.layers()[0].weight == saved_model.layers()[0].weight);
      CHECK(acc.resume_epoch() == 2);
      CHECK(acc.resume_batch() == 0);
    }
    return error;
  };
  CHECK(try_load({6, 8, 3}, true, false) == "");
  CHECK(try_load({6, 9, 3}, true, false)
            .find("the parameters differ from the checkpoint's (parameters.layout): the checkpoint "
                  "has 'param 0 f32 48 w', this job has 'param 0 f32 54 w'") != std::string::npos);
  CHECK(try_load({6, 8, 3}, false, false).find("has 'state.opt', which nothing registered") !=
        std::string::npos);
  CHECK(try_load({6, 8, 3}, true, true).find("state.sched: missing") != std::string::npos);
}

namespace {
std::vector<ParamRef> refs_of(raw_mlp::Mlp& model) {
  std::vector<ParamRef> params;
  for (auto& L : model.layers()) {
    params.push_back({"w", buffer_of(std::span(L.weight)), buffer_of(std::span(L.weight_grad))});
    params.push_back({"b", buffer_of(std::span(L.bias)), buffer_of(std::span(L.bias_grad))});
  }
  return params;
}

// One step of both models on made-up gradients (a fixed function of the step), so the SGD
// momentum state matters after a resume.
void step_both(Accelerator& acc, raw_mlp::Mlp& a, raw_mlp::Mlp& b, int step) {
  for (raw_mlp::Mlp* m : {&a, &b})
    for (auto& L : m->layers()) {
      for (std::size_t i = 0; i < L.weight_grad.size(); ++i)
        L.weight_grad[i] = float(std::sin(double(i + 1) * (step + 1)));
      for (std::size_t i = 0; i < L.bias_grad.size(); ++i) L.bias_grad[i] = float(step) * 0.25f;
    }
  for (std::size_t i = 0; i < 2 * a.layers().size(); ++i) acc.grad_ready(0, i);
  for (std::size_t i = 0; i < 2 * b.layers().size(); ++i) acc.grad_ready(1, i);
  REQUIRE(acc.sync_gradients());
  acc.optimizer_step();  // both
}
}  // namespace

TEST_CASE("two raw models: each steps its own optimizer; a checkpoint carries both") {
  TempDir tmp;
  const std::string dir = (tmp / "ck").string();
  auto straight = [&](int steps, raw_mlp::Mlp& a, raw_mlp::Mlp& b) {
    Accelerator acc;
    Sgd sgd_a({.lr = 0.1, .momentum = 0.9}), sgd_b({.lr = 0.05, .momentum = 0.5});
    CHECK(acc.prepare(refs_of(a), sgd_a) == 0);
    CHECK(acc.prepare(refs_of(b), sgd_b) == 1);
    CHECK(acc.num_models() == 2);
    for (int s = 0; s < steps; ++s) step_both(acc, a, b, s);
    if (steps == 3) acc.save_state(dir);
  };
  raw_mlp::Mlp a1({4, 5, 2}, 1), b1({3, 2}, 2);
  straight(6, a1, b1);
  raw_mlp::Mlp a2({4, 5, 2}, 1), b2({3, 2}, 2);
  straight(3, a2, b2);
  for (const char* blob : {"parameters", "parameters.layout", "optimizer", "parameters_1",
                           "parameters_1.layout", "optimizer_1"})
    CHECK_MESSAGE(std::filesystem::exists(dir + "/" + blob), blob);
  {
    raw_mlp::Mlp a3({4, 5, 2}, 7), b3({3, 2}, 8);  // other initial weights: the load replaces them
    Accelerator acc;
    Sgd sgd_a({.lr = 0.1, .momentum = 0.9}), sgd_b({.lr = 0.05, .momentum = 0.5});
    acc.prepare(refs_of(a3), sgd_a);
    acc.prepare(refs_of(b3), sgd_b);
    acc.load_state(dir);
    CHECK(acc.step() == 3);
    for (int s = 3; s < 6; ++s) step_both(acc, a3, b3, s);
    CHECK(a3.layers()[0].weight == a1.layers()[0].weight);  // bitwise: momentum came back too
    CHECK(a3.layers()[1].bias == a1.layers()[1].bias);
    CHECK(b3.layers()[0].weight == b1.layers()[0].weight);
    CHECK(b3.layers()[0].bias == b1.layers()[0].bias);
  }
  // Loaded with one model prepared, the second model's blobs are named.
  raw_mlp::Mlp a4({4, 5, 2}, 1);
  Accelerator acc;
  Sgd sgd_a({.lr = 0.1, .momentum = 0.9});
  acc.prepare(refs_of(a4), sgd_a);
  std::string error;
  try {
    acc.load_state(dir);
  } catch (const CheckpointError& e) {
    error = e.what();
  }
  INFO(error);
  CHECK(error.find("model 1's, but this job prepared 1 model(s)") != std::string::npos);
}

TEST_CASE("resume after the process was killed equals the uninterrupted run, bitwise") {
  if (skip_unless(gloo_available(), "gloo communicator not built")) return;
  for (int world : {1, 2}) {
    CAPTURE(world);
    TempDir tmp;
    const std::string a = (tmp / "a.bin").string(), b = (tmp / "b.bin").string();
    expect_success(run_worker(world, {"--epochs", "2", "--out", a}));
    const std::size_t nb = batches_per_epoch(world);
    // End of epoch 1, in the middle of epoch 1, in the middle of epoch 2.
    for (std::size_t k : {nb, std::size_t(5), nb + 3}) {
      CAPTURE(k);
      const std::string dir = (tmp / ("ck" + std::to_string(k))).string();
      expect_killed(run_worker(world, {"--epochs", "2", "--checkpoint", dir, "--save_at",
                                       std::to_string(k), "--die_after_save"}));
      const auto resumed =
          run_worker(world, {"--epochs", "2", "--checkpoint", dir, "--resume", "--out", b});
      expect_success(resumed);
      const std::string expected_at =
          "resumed at epoch " + std::to_string(k / nb) + " batch " + std::to_string(k % nb);
      CHECK(output_of(resumed).find(expected_at) != std::string::npos);
      const std::string want = read_bytes(a), got = read_bytes(b);
      CHECK(want.size() > 0);
      CHECK(got == want);
    }
  }
}

TEST_CASE("resume with gradient accumulation and per-rank state at world 2") {
  if (skip_unless(gloo_available(), "gloo communicator not built")) return;
  TempDir tmp;
  const std::string a = (tmp / "a.bin").string(), b = (tmp / "b.bin").string();
  const std::string dir = (tmp / "ck").string();
  const auto straight =
      run_worker(2, {"--epochs", "2", "--accumulation", "2", "--per_rank_state", "--out", a});
  expect_success(straight);
  expect_killed(run_worker(2, {"--epochs", "2", "--accumulation", "2", "--per_rank_state",
                               "--checkpoint", dir, "--save_at", "4", "--die_after_save"}));
  const auto resumed = run_worker(2, {"--epochs", "2", "--accumulation", "2", "--per_rank_state",
                                      "--checkpoint", dir, "--resume", "--out", b});
  expect_success(resumed);
  CHECK(read_bytes(b) == read_bytes(a));
  CHECK(done_lines(resumed) == done_lines(straight));  // each rank's own counter came back

  // Between accumulation steps the partial gradients would be lost: refused.
  const auto refused = run_worker(2, {"--epochs", "1", "--accumulation", "2", "--checkpoint",
                                      (tmp / "ck2").string(), "--save_at", "3"});
  CHECK(refused.exit_code() == 2);
  CHECK(output_of(refused).find("save_state between accumulation steps") != std::string::npos);
}

TEST_CASE("a job killed at any stage of a save leaves a loadable checkpoint") {
  if (skip_unless(gloo_available(), "gloo communicator not built")) return;
  TempDir tmp;
  const std::string a = (tmp / "a.bin").string(), b = (tmp / "b.bin").string();
  expect_success(run_worker(2, {"--epochs", "2", "--out", a}));
  const std::size_t nb = batches_per_epoch(2);
  const std::string first = std::to_string(nb), second = std::to_string(nb + 2);
  int n = 0;
  for (const std::string stage :
       {"blobs_written", "manifest_written", "moved_aside", "renamed", "fs:rename trash"}) {
    CAPTURE(stage);
    const fs::path dir = tmp / ("ck_" + std::to_string(n++));
    expect_killed(run_worker(2, {"--epochs", "2", "--checkpoint", dir.string(), "--save_at",
                                 first + "," + second, "--crash_stage", stage}));
    // The first save is there whole until the second one's rename; after it, the second.
    const bool new_one = stage == "renamed" || stage == "fs:rename trash";
    CHECK(fs::exists(dir) == (stage != "moved_aside"));
    const LoadedCheckpoint ck = read_checkpoint(dir.string(), 0, 2);
    CHECK(ck.meta.epoch == 1);
    CHECK(ck.meta.batch == (new_one ? 2u : 0u));

    const auto resumed = run_worker(2, {"--epochs", "2", "--checkpoint", dir.string(), "--resume",
                                        "--save_epochs", "--out", b});
    expect_success(resumed);
    CHECK(read_bytes(b) == read_bytes(a));
    CHECK(siblings_of(dir).empty());  // the resumed run's save removed the leftovers
  }
  // Killed during the very first save: no checkpoint, and a run starts from scratch.
  const fs::path fresh = tmp / "ck_first";
  expect_killed(run_worker(2, {"--epochs", "2", "--checkpoint", fresh.string(), "--save_at", first,
                               "--crash_stage", "manifest_written"}));
  CHECK(!checkpoint_exists(fresh.string()));
}

TEST_CASE("a job killed while the previous checkpoint is removed leaves nothing half-deleted") {
  if (skip_unless(gloo_available(), "gloo communicator not built")) return;
  TempDir tmp;
  const fs::path dir = tmp / "ck";
  const std::string nb = std::to_string(batches_per_epoch(2));
  // The second save's removals: rank 0's two index files, then the previous checkpoint's
  // files; killed before the second of those, so the previous checkpoint is half gone.
  expect_killed(run_worker(2, {"--epochs", "2", "--checkpoint", dir.string(), "--save_at",
                               nb + "," + std::to_string(batches_per_epoch(2) + 2), "--crash_stage",
                               "fs:remove", "--crash_count", "4"}));
  // The second save is in place, and the crash did interrupt a removal.
  CHECK(read_checkpoint(dir.string(), 0, 2).meta.batch == 2);
  CHECK(!siblings_of(dir).empty());
  for (const fs::path& old : siblings_of(dir, ".old-")) {
    CAPTURE(old);
    CHECK_NOTHROW(read_checkpoint(old.string(), 0, 2));  // none the loader could pick is partial
  }
  // The job resumes and completes without saving again: nothing is left beside DIR.
  const auto resumed = run_worker(2, {"--epochs", "2", "--checkpoint", dir.string(), "--resume"});
  expect_success(resumed);
  CHECK(siblings_of(dir).empty());
}

// The pid line a checkpoint_worker printed first ("pid 2").
std::string pid_line(const launch::GroupResult& r) {
  const std::string out = output_of(r);
  return out.substr(0, out.find('\n'));
}

TEST_CASE("a rerun with the same pid (a container restart) keeps the last complete checkpoint") {
  // Each run in a fresh pid namespace, as a restarted container is: the worker gets the same
  // pid every time (sh is the namespace's init, the worker its first child).
  const auto in_new_pid_namespace = [](const std::vector<std::string>& args) {
    launch::WorkerSpec spec;
    spec.argv = {"unshare",
                 "--pid",
                 "--fork",
                 "--mount-proc",
                 "/bin/sh",
                 "-c",
                 "\"$0\" \"$@\"; exit $?",
                 bin_path("checkpoint_worker")};
    spec.argv.insert(spec.argv.end(), args.begin(), args.end());
    spec.label = "rank 0";
    spec.unset_env = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "ACCEL_COMM_BACKEND"};
    spec.env = {{"OMP_NUM_THREADS", "1"}};
    launch::WorkerGroupOptions options;
    options.capture = true;
    options.echo = false;
    options.timeout = std::chrono::seconds(60);
    return launch::run_worker_group({spec}, options);
  };
  const auto probe = in_new_pid_namespace({"--epochs", "0"});
  if (skip_unless(probe.exit_code() == 0,
                  "cannot run a process in a new pid namespace (unshare --pid --fork "
                  "--mount-proc needs CAP_SYS_ADMIN): " +
                      probe.failure_report()))
    return;
  TempDir tmp;
  const std::string a = (tmp / "a.bin").string(), b = (tmp / "b.bin").string();
  const std::string dir = (tmp / "ck").string();
  expect_success(run_worker(1, {"--epochs", "3", "--out", a}));
  const std::string nb = std::to_string(batches_per_epoch(1));
  // Killed at its 3rd rename: the second save's new directory is not yet in place and the
  // first one (epoch 1) is the moved-aside copy.
  const auto first = in_new_pid_namespace({"--epochs", "3", "--checkpoint", dir, "--save_at",
                                           nb + "," + std::to_string(2 * batches_per_epoch(1)),
                                           "--crash_stage", "fs:rename in"});
  INFO(describe(first));
  REQUIRE(first.exit_code() == 128 + SIGKILL);
  // Rerun with the same pid, killed at its 1st rename (its first save's new directory).
  const auto second = in_new_pid_namespace({"--epochs", "3", "--checkpoint", dir, "--resume",
                                            "--save_at", nb, "--crash_stage", "fs:rename in"});
  INFO(describe(second));
  REQUIRE(second.exit_code() == 128 + SIGKILL);
  CHECK(output_of(second).find("resumed at epoch 1 batch 0") != std::string::npos);
  CHECK(pid_line(second) == pid_line(first));  // the collision is real
  // Rerun: it still resumes from epoch 1, and ends where the uninterrupted run did.
  const auto third = in_new_pid_namespace(
      {"--epochs", "3", "--checkpoint", dir, "--resume", "--save_epochs", "--out", b});
  INFO(describe(third));
  REQUIRE(third.exit_code() == 0);
  CHECK(pid_line(third) == pid_line(first));
  CHECK(output_of(third).find("resumed at epoch 1 batch 0") != std::string::npos);
  CHECK(read_bytes(b) == read_bytes(a));
  CHECK(siblings_of(fs::path(dir)).empty());
}

TEST_CASE("loading at another world size works only where nothing depends on it") {
  if (skip_unless(gloo_available(), "gloo communicator not built")) return;
  TempDir tmp;
  const std::string end_of_epoch = (tmp / "end").string(), mid = (tmp / "mid").string(),
                    per_rank = (tmp / "per_rank").string();
  const std::string nb = std::to_string(batches_per_epoch(2));
  expect_killed(run_worker(
      2, {"--epochs", "2", "--checkpoint", end_of_epoch, "--save_at", nb, "--die_after_save"}));
  expect_killed(
      run_worker(2, {"--epochs", "2", "--checkpoint", mid, "--save_at", "5", "--die_after_save"}));
  expect_killed(run_worker(2, {"--epochs", "2", "--checkpoint", per_rank, "--save_at", nb,
                               "--per_rank_state", "--die_after_save"}));

  const auto ok = run_worker(1, {"--epochs", "2", "--checkpoint", end_of_epoch, "--resume"});
  expect_success(ok);
  CHECK(output_of(ok).find("resumed at epoch 1 batch 0") != std::string::npos);

  const auto mid_epoch = run_worker(1, {"--epochs", "2", "--checkpoint", mid, "--resume"});
  CHECK(mid_epoch.exit_code() == 2);
  CHECK(output_of(mid_epoch).find(mid + ": saved mid-epoch (epoch 0, batch 5) by 2 processes") !=
        std::string::npos);

  const auto ranks =
      run_worker(1, {"--epochs", "2", "--checkpoint", per_rank, "--resume", "--per_rank_state"});
  CHECK(ranks.exit_code() == 2);
  CHECK(output_of(ranks).find("per-rank state 'counter' cannot be matched to ranks") !=
        std::string::npos);
}

TEST_CASE("a damaged checkpoint fails on every rank, naming the file") {
  if (skip_unless(gloo_available(), "gloo communicator not built")) return;
  TempDir tmp;
  const fs::path dir = tmp / "ck";
  expect_killed(run_worker(
      2, {"--epochs", "2", "--checkpoint", dir.string(), "--save_at", "3", "--die_after_save"}));
  SUBCASE("a flipped byte in the parameters") {
    std::string p = read_bytes(dir / "parameters");
    p[p.size() / 2] ^= 0x01;
    write_bytes(dir / "parameters", p);
    const auto r =
        run_worker(2, {"--epochs", "2", "--checkpoint", dir.string(), "--resume"}, false);
    INFO(describe(r));
    CHECK(r.exit_code() == 2);
    for (const auto& w : r.workers)
      CHECK(w.output.find((dir / "parameters").string() + ": checksum mismatch") !=
            std::string::npos);
  }
  SUBCASE("rank 1's RNG state missing: rank 0 learns it from rank 1") {
    fs::remove(dir / "rng.rank1");
    const auto r =
        run_worker(2, {"--epochs", "2", "--checkpoint", dir.string(), "--resume"}, false);
    INFO(describe(r));
    CHECK(r.exit_code() == 2);
    CHECK(r.workers[1].output.find((dir / "rng.rank1").string() + ": missing") !=
          std::string::npos);
    CHECK(r.workers[0].output.find("rank 1 could not read the checkpoint") != std::string::npos);
  }
}

TEST_CASE("examples/raw_mlp trains on Fashion-MNIST and resumes from its checkpoint") {
  const std::string data = "/usr/share/datasets/fashion-mnist";
  if (skip_unless(fs::exists(data + "/train-images-idx3-ubyte.gz"),
                  "Fashion-MNIST not installed at " + data))
    return;
  if (skip_unless(fs::exists(bin_path("raw_mlp")), "raw_mlp example not built")) return;
  if (skip_unless(gloo_available(), "gloo communicator not built")) return;
  TempDir tmp;
  const std::string dir = (tmp / "ck").string();
  RanksOptions options;
  options.env = {{"ACCEL_COMM_BACKEND", "gloo"}};
  const std::vector<std::string> common = {
      "--train_samples", "3000", "--test_samples", "1000", "--hidden",         "32",
      "--batch_size",    "32",   "--lr",           "0.03", "--checkpoint_dir", dir,
      "--data_dir",      data};
  auto args = common;
  args.insert(args.end(), {"--epochs", "1"});
  const auto first = run_ranks(2, "raw_mlp", args, options);
  INFO(describe(first));
  REQUIRE(first.exit_code() == 0);
  const std::string out0 = first.workers[0].output;
  const auto at = out0.find("test accuracy 0.");
  REQUIRE(at != std::string::npos);
  CHECK(std::stod(out0.substr(at + 14, 6)) > 0.6);  // 10 classes: chance is 0.1
  CHECK(first.workers[1].output.find("test accuracy") == std::string::npos);  // main process only

  args = common;
  args.insert(args.end(), {"--epochs", "2"});
  const auto second = run_ranks(2, "raw_mlp", args, options);
  INFO(describe(second));
  REQUIRE(second.exit_code() == 0);
  CHECK(second.workers[0].output.find("resumed from " + dir + ": epoch 2, batch 0") !=
        std::string::npos);
  CHECK(second.workers[0].output.find("epoch 2/2: loss") != std::string::npos);
  CHECK(second.workers[0].output.find("epoch 1/2") == std::string::npos);
}

namespace {
// The entries of `dir`, sorted.
std::vector<std::string> entries_of(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<ParamRef> mlp_params(raw_mlp::Mlp& model) {
  std::vector<ParamRef> params;
  for (auto& L : model.layers()) {
    params.push_back({"w", buffer_of(std::span(L.weight)), buffer_of(std::span(L.weight_grad))});
    params.push_back({"b", buffer_of(std::span(L.bias)), buffer_of(std::span(L.bias_grad))});
  }
  return params;
}
}  // namespace

TEST_CASE(
    "project checkpoints: automatic naming, total_limit 2 keeps the newest two complete, "
    "load_state() reads the newest") {
  TempDir tmp;
  AcceleratorOptions options;
  options.project_dir = (tmp / "project").string();
  options.automatic_checkpoint_naming = true;
  options.total_limit = 2;
  const fs::path root = tmp / "project" / "checkpoints";
  raw_mlp::Mlp model({6, 8, 3}, 1);
  {
    Accelerator acc(options);
    acc.prepare_parameters(mlp_params(model));
    CHECK(acc.latest_checkpoint().empty());
    for (int i = 0; i < 4; ++i) {
      acc.set_epoch(std::uint64_t(i) + 1);
      CHECK(acc.save_state() == (root / ("checkpoint_" + std::to_string(i))).string());
    }
    CHECK(entries_of(root) == std::vector<std::string>{"checkpoint_2", "checkpoint_3"});
    // A save that fails before its new checkpoint is complete removes nothing: the two
    // newest complete ones stay (never fewer than total_limit - 1).
    checkpoint_testing::set_stage_hook([](std::string_view stage) {
      if (stage == "manifest_written") throw CheckpointError("injected failure");
    });
    acc.set_epoch(5);
    CHECK_THROWS_AS(acc.save_state(), CheckpointError);
    checkpoint_testing::set_stage_hook(nullptr);
    CHECK(checkpoint_exists((root / "checkpoint_2").string()));
    CHECK(checkpoint_exists((root / "checkpoint_3").string()));
    CHECK(!checkpoint_exists((root / "checkpoint_4").string()));
    // The next one takes index 4, its leftovers cleared, and the oldest goes.
    acc.set_epoch(6);
    CHECK(acc.save_state() == (root / "checkpoint_4").string());
    CHECK(entries_of(root) == std::vector<std::string>{"checkpoint_3", "checkpoint_4"});
  }
  Accelerator resumed(options);
  resumed.prepare_parameters(mlp_params(model));
  CHECK(resumed.latest_checkpoint() == (root / "checkpoint_4").string());
  resumed.load_state();
  CHECK(resumed.resume_epoch() == 6);
}

namespace {
// The named checkpoints under root that load (checkpoint_exists by the recovery rule).
std::vector<int> complete_named(const fs::path& root, int up_to) {
  std::vector<int> out;
  for (int i = 0; i <= up_to; ++i)
    if (checkpoint_exists((root / ("checkpoint_" + std::to_string(i))).string())) out.push_back(i);
  return out;
}

// save_state() three times with total_limit 2 (local, one process); the third save's
// filesystem changes are listed in `ops`, or with `kill_at` the process SIGKILLs itself before
// change number kill_at of that save. Returns whether it was killed.
bool three_named_saves(const AcceleratorOptions& options, std::vector<std::string>* ops,
                       std::size_t kill_at) {
  auto saves = [&] {
    raw_mlp::Mlp model({6, 8, 3}, 1);
    Accelerator acc(options);
    acc.prepare_parameters(mlp_params(model));
    acc.save_state();
    acc.save_state();
    std::size_t n = 0;
    checkpoint_testing::set_stage_hook([&](std::string_view stage) {
      if (!stage.starts_with("fs:")) return;
      if (ops) ops->emplace_back(stage);
      if (n++ == kill_at) ::kill(::getpid(), SIGKILL);
    });
    acc.save_state();
    checkpoint_testing::set_stage_hook(nullptr);
  };
  if (ops) {
    saves();
    return false;
  }
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    try {
      saves();
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  if (WIFSIGNALED(status)) return WTERMSIG(status) == SIGKILL;
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return false;
}
}  // namespace

TEST_CASE(
    "total_limit 2, a process killed before each filesystem change of the third save: the "
    "newest two complete checkpoints always stay, and the next save leaves exactly two") {
  const fs::path base =
      fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  AcceleratorOptions options;
  options.communicator = "local";
  options.automatic_checkpoint_naming = true;
  options.total_limit = 2;
  std::vector<std::string> ops;
  {
    TempDir probe(base);
    options.project_dir = (probe / "project").string();
    three_named_saves(options, &ops, std::size_t(-1));
  }
  REQUIRE(ops.size() > 10);
  std::size_t kills = 0;
  for (std::size_t k = 0; k <= ops.size(); ++k) {
    CAPTURE(k);
    CAPTURE(k < ops.size() ? ops[k] : std::string("(none: the save completes)"));
    TempDir tmp(base);
    options.project_dir = (tmp / "project").string();
    const fs::path root = tmp / "project" / "checkpoints";
    kills += three_named_saves(options, nullptr, k);
    // Before checkpoint_2 is in place, 0 and 1 are complete; after, 1 and 2 (and 0 until its
    // removal finished): never fewer than the newest two.
    const std::vector<int> complete = complete_named(root, 3);
    CAPTURE(complete.size());
    const bool new_one = std::count(complete.begin(), complete.end(), 2) == 1;
    CHECK(std::count(complete.begin(), complete.end(), 1) == 1);
    CHECK(std::count(complete.begin(), complete.end(), new_one ? 2 : 0) == 1);
    // A restarted job resumes from the newest, and its next save leaves exactly two, nothing
    // else beside them.
    raw_mlp::Mlp model({6, 8, 3}, 1);
    Accelerator acc(options);
    acc.prepare_parameters(mlp_params(model));
    CHECK(acc.latest_checkpoint() == (root / (new_one ? "checkpoint_2" : "checkpoint_1")).string());
    acc.load_state();
    acc.save_state();
    const std::string next = new_one ? "checkpoint_3" : "checkpoint_2";
    const std::string before = new_one ? "checkpoint_2" : "checkpoint_1";
    CAPTURE(entries_of(root));
    CHECK(entries_of(root) == std::vector<std::string>{before, next});
  }
  CHECK(kills == ops.size());
  MESSAGE(kills << " kill points in the third save, one before each filesystem change");
}

TEST_CASE("project checkpoints: without automatic naming or a checkpoint, the error says why") {
  TempDir tmp;
  AcceleratorOptions options;
  options.project_dir = (tmp / "project").string();
  {
    Accelerator plain(options);
    try {
      plain.save_state();
      FAIL("save_state() without automatic_checkpoint_naming was accepted");
    } catch (const InvalidArgument& e) {
      CHECK(std::string(e.what()).find("needs automatic_checkpoint_naming true") !=
            std::string::npos);
    }
  }
  options.automatic_checkpoint_naming = true;
  Accelerator acc(options);
  raw_mlp::Mlp model({6, 8, 3}, 1);
  acc.prepare_parameters(mlp_params(model));
  try {
    acc.load_state();
    FAIL("load_state() without a checkpoint was accepted");
  } catch (const CheckpointError& e) {
    CHECK(std::string(e.what()).find("no complete checkpoint under " +
                                     (tmp / "project" / "checkpoints").string()) !=
          std::string::npos);
  }
  AcceleratorOptions limit_only;
  limit_only.total_limit = 3;
  try {
    Accelerator refused(limit_only);
    FAIL("total_limit without automatic_checkpoint_naming was accepted");
  } catch (const std::exception& e) {
    CHECK(std::string(e.what()).find("total_limit needs automatic_checkpoint_naming") !=
          std::string::npos);
  }
}

TEST_CASE("save_on_each_node where the machines share the directory: refused, naming it") {
  // Two "machines" (NODE_RANK 0 and 1) on this host, so one filesystem: each machine's first
  // rank would write the same DIR. The writers find each other's marks and the save fails on
  // every rank, leaving nothing.
  TempDir dir;
  const std::string ck = (dir / "ck").string();
  RanksOptions options;
  options.nodes = 2;
  // Both ranks fail; rank 0 may end first: let rank 1 say why too.
  options.stop_on_failure = false;
  options.env = {{"ACCEL_COMM_BACKEND", "gloo"}, {"ACCEL_SAVE_ON_EACH_NODE", "true"}};
  const auto r = run_ranks(2, "checkpoint_worker",
                           {"--epochs", "1", "--checkpoint", ck, "--save_at", "1"}, options);
  INFO(describe(r));
  CHECK(r.exit_code() != 0);
  CHECK(output_of(r).find(ck + ": the machines share this directory") != std::string::npos);
  CHECK(output_of(r).find("save_on_each_node is for machines without a shared filesystem") !=
        std::string::npos);
  for (const auto& e : std::filesystem::directory_iterator(dir / ""))
    CHECK_MESSAGE(e.path().filename().string().rfind("ck", 0) != 0, e.path().string());
}

TEST_CASE("save_on_each_node with zero_stage 3 is refused as a config error") {
  AcceleratorOptions options;
  options.communicator = "local";
  options.distributed_type = "ZERO";
  options.zero_stage = 3;
  options.save_on_each_node = true;
  CHECK_THROWS_WITH(Accelerator{options},
                    doctest::Contains("save_on_each_node with zero_stage 3 is not supported yet"));
}
