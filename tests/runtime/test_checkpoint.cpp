// Checkpoints: a saved and reloaded optimizer takes the same next step, bit for bit; a
// checkpoint that does not fit is refused with a clear error and changes nothing.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "common/host_tensors.hpp"
#include "common/temp_dir.hpp"
#include "fusedopt/error.hpp"
#include "io/safetensors.hpp"
#include "presets.hpp"

namespace fusedopt::testing {
namespace {

using fusedopt::DType;
using fusedopt::Optimizer;

using TempFolder = fusedopt::testing::TempDir;

/// Params and grads of given sizes and dtypes, named n0, n1, ... in two groups.
struct Model {
  std::vector<HostTensor> p, g;
  std::vector<std::string> names;
  Model(const std::vector<std::int64_t>& sizes, const std::vector<DType>& dtypes) {
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      p.emplace_back(sizes[k], dtypes[k % dtypes.size()]);
      g.emplace_back(sizes[k], dtypes[k % dtypes.size()]);
      names.push_back("n" + std::to_string(k));
    }
  }
  std::vector<fusedopt::ParamGroup> groups() {
    std::vector<fusedopt::ParamGroup> out(2);
    for (std::size_t k = 0; k < p.size(); ++k) {
      out[k % 2].params.push_back(p[k].tensor(names[k]));
      out[k % 2].grads.push_back(g[k].tensor());
    }
    out[1].hypers = {{"lr", 3e-3}};
    return out;
  }
  /// This model's params copied into `other` (same sizes and dtypes).
  void copy_params_to(Model& other) const {
    for (std::size_t k = 0; k < p.size(); ++k) {
      for (std::int64_t i = 0; i < p[k].numel(); ++i) other.p[k].set(i, p[k].get(i));
    }
  }
};

/// A copy of checkpoint `from` at `to` with metadata `key` set to `value` (the tensors as they
/// are), as a tool editing the file would write it.
void rewrite_metadata(const std::string& from, const std::string& to, const std::string& key,
                      const std::string& value) {
  fusedopt::io::SafetensorsFile f = fusedopt::io::read_safetensors(from);
  std::vector<fusedopt::io::TensorView> views;
  for (const auto& [name, e] : f.tensors) {
    views.push_back({name, e.dtype, e.shape, f.tensor_data(name), e.end - e.begin});
  }
  f.metadata[key] = value;
  fusedopt::io::write_safetensors(to, views, f.metadata);
}

/// Every byte an optimizer holds for `model`: params, states, masters, step, hypers.
std::vector<std::string> snapshot(Optimizer& opt, Model& model, bool master) {
  std::vector<std::string> out;
  auto bytes = [](const void* d, std::int64_t n, DType t) {
    return d ? std::string(static_cast<const char*>(d), n * fusedopt::dtype_size(t))
             : std::string();
  };
  for (std::size_t k = 0; k < model.p.size(); ++k) {
    out.push_back(bytes(model.p[k].data(), model.p[k].numel(), model.p[k].dtype()));
    std::vector<std::string> states = {"m", "v"};
    if (master) states.push_back("master");
    for (const std::string& s : states) {
      const fusedopt::Tensor t = opt.state(s, static_cast<int>(k));
      out.push_back(bytes(t.data, t.numel, t.dtype));
    }
  }
  out.push_back(std::to_string(opt.step_count()));
  for (int grp = 0; grp < 2; ++grp) out.push_back(fmt_double(opt.hyper("lr", grp)));
  return out;
}

void fill_grads(Model& m, std::mt19937& rng) {
  for (HostTensor& t : m.g) fill_normal(t, rng);
}

}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("a reloaded optimizer takes the same next step as the saver, bit for bit") {
    use_private_cache();
    TempFolder dir;
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed);
    std::mt19937 rng(seed);
    const std::vector<std::int64_t> sizes = {1000, 0, 77, 4099, 1};
    for (bool master : {false, true}) {
      INFO("master weights: " << master);
      const std::vector<DType> dtypes =
          master ? std::vector<DType>{DType::BF16, DType::F32} : std::vector<DType>{DType::F32};
      fusedopt::OptimizerOptions options;
      options.master_weights = master;
      Model a(sizes, dtypes);
      for (HostTensor& t : a.p) fill_normal(t, rng);
      Optimizer opt_a(fusedopt::Rule::preset("adamw"), a.groups(), options);
      opt_a.set_hyper("lr", 0.1 + 1e-9, 0);  // must survive the round trip exactly
      opt_a.set_hyper("beta2", 0.95);
      for (int t = 0; t < 5; ++t) {
        fill_grads(a, rng);
        opt_a.step();
      }
      const auto file = dir.path() / (master ? "master.safetensors" : "plain.safetensors");
      opt_a.save(file);

      Model b(sizes, dtypes);
      a.copy_params_to(b);
      Optimizer opt_b(fusedopt::Rule::preset("adamw"), b.groups(), options);
      opt_b.load(file);
      CHECK(opt_b.step_count() == 5);
      CHECK(opt_b.hyper("lr", 0) == 0.1 + 1e-9);
      CHECK(opt_b.hyper("lr", 1) == 3e-3);
      CHECK(opt_b.hyper("beta2", 1) == 0.95);
      CHECK(snapshot(opt_a, a, master) == snapshot(opt_b, b, master));

      fill_grads(a, rng);
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        for (std::int64_t i = 0; i < sizes[k]; ++i) b.g[k].set(i, a.g[k].get(i));
      }
      opt_a.step();
      opt_b.step();
      CHECK(opt_b.step_count() == 6);
      CHECK(snapshot(opt_a, a, master) == snapshot(opt_b, b, master));
    }
  }

  TEST_CASE("a param name a checkpoint cannot carry is refused at construction, by name") {
    // A tab or newline broke the checkpoint's params table (fusedopt-ckpt then dropped the
    // param's states and exited 0); a name that is not UTF-8 failed only at save().
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"x\t3\tfp32\ny", "'x\\x093\\x09fp32\\x0ay'): the name holds a tab"},
        {"a\tb", "'a\\x09b'): the name holds a tab"},
        {"nl\n", "'nl\\x0a'): the name holds a newline"},
        {std::string("nul\0", 4), "'nul\\x00'): the name holds a control character"},
        {"layer\xff", "'layer\\xff'): the name is not valid UTF-8"}};
    for (const auto& [name, why] : bad) {
      HostTensor p0(3, DType::F32), g0(3, DType::F32), p1(3, DType::F32), g1(3, DType::F32);
      fusedopt::ParamGroup group;
      group.params = {p0.tensor("ok"), p1.tensor(name)};
      group.grads = {g0.tensor(), g1.tensor()};
      CAPTURE(why);
      CHECK_THROWS_WITH_AS(Optimizer(fusedopt::Rule::preset("adamw"), {group}),
                           ("group 0, param 1 (" + why +
                            ", which a checkpoint cannot carry (names key checkpoints: they "
                            "must be UTF-8 without control characters)")
                               .c_str(),
                           fusedopt::UsageError);
    }
    // Any other UTF-8, '/' and spaces included, is a name.
    HostTensor p(3, DType::F32), g(3, DType::F32);
    fusedopt::ParamGroup group;
    group.params = {p.tensor("bloc/é ü 名前")};
    group.grads = {g.tensor()};
    CHECK_NOTHROW(Optimizer(fusedopt::Rule::preset("adamw"), {group}));
  }

  TEST_CASE("a checkpoint names each state and master and records the rule, step and hypers") {
    use_private_cache();
    TempFolder dir;
    Model a({3, 0}, {DType::BF16});
    fusedopt::OptimizerOptions options;
    options.master_weights = true;
    Optimizer opt(fusedopt::Rule::preset("adamw"), a.groups(), options);
    opt.step();
    opt.save(dir.path() / "c.safetensors");
    const fusedopt::io::SafetensorsFile f =
        fusedopt::io::read_safetensors(dir.path() / "c.safetensors");
    std::vector<std::string> names;
    for (const auto& [name, entry] : f.tensors) names.push_back(name);
    CHECK(names ==
          std::vector<std::string>{"n0/m", "n0/master", "n0/v", "n1/m", "n1/master", "n1/v"});
    CHECK(f.tensors.at("n0/master").dtype == "F32");
    CHECK(f.tensors.at("n0/m").shape == std::vector<std::int64_t>{3});
    CHECK(f.tensors.at("n1/v").shape == std::vector<std::int64_t>{0});
    CHECK(f.metadata.at("rule") == "adamw");
    CHECK(f.metadata.at("step") == "1");
    CHECK(f.metadata.at("state_dtype") == "fp32");
    CHECK(f.metadata.at("kernel_keys") == opt.stats().kernel_keys.at(0));
    CHECK(f.metadata.at("hypers") ==
          "group0:lr=0.001,beta1=0.90000000000000002,beta2=0.999,eps=1e-08,weight_decay=0.01,"
          "maximize=0;group1:lr=0.0030000000000000001,beta1=0.90000000000000002,beta2=0.999,"
          "eps=1e-08,weight_decay=0.01,maximize=0");
  }

  TEST_CASE("load refuses a checkpoint that does not fit, clearly, and changes nothing") {
    use_private_cache();
    TempFolder dir;
    std::mt19937 rng(fresh_seed());
    const std::vector<std::int64_t> sizes = {12, 5, 40};
    Model target(sizes, {DType::F32});
    for (HostTensor& t : target.p) fill_normal(t, rng);
    Optimizer opt(fusedopt::Rule::preset("adamw"), target.groups());
    opt.set_hyper("lr", 0.02);
    for (int t = 0; t < 2; ++t) {
      fill_grads(target, rng);
      opt.step();
    }
    const std::vector<std::string> before = snapshot(opt, target, false);
    const std::string where = (dir.path() / "x.safetensors").string();

    auto saved_by = [&](const std::string& rule, const std::vector<std::int64_t>& s,
                        fusedopt::OptimizerOptions options = {}, int drop_last = 0) {
      Model m(s, {DType::F32});
      for (int k = 0; k < drop_last; ++k) {
        m.p.pop_back();
        m.g.pop_back();
      }
      for (HostTensor& t : m.p) fill_normal(t, rng);
      Optimizer o(fusedopt::Rule::preset(rule), m.groups(), options);
      o.step();
      o.save(where);
    };
    auto refused = [&](const std::string& message) {
      CHECK_THROWS_WITH_AS(opt.load(where), message.c_str(), fusedopt::Error);
      CHECK(snapshot(opt, target, false) == before);
    };

    saved_by("adam", sizes);
    refused("cannot load checkpoint " + where +
            ": it was saved by rule 'adam', this optimizer runs rule 'adamw'");
    saved_by("adamw", sizes, {}, 1);
    refused("cannot load checkpoint " + where + ": tensor 'n2/m' is missing");
    saved_by("adamw", {12, 6, 40});
    refused("cannot load checkpoint " + where +
            ": tensor 'n1/m' has shape [6], this optimizer's has [5]");
    fusedopt::OptimizerOptions bf16;
    bf16.state_dtype = DType::BF16;
    saved_by("adamw", sizes, bf16);
    refused("cannot load checkpoint " + where +
            ": tensor 'n0/m' is BF16, this optimizer keeps it as F32");
    saved_by("adamw", {12, 5, 40, 8});
    refused("cannot load checkpoint " + where +
            ": it holds tensor 'n3/m', which this optimizer has no param or state for");

    // A damaged file: the io module's own diagnosis, behind ours.
    saved_by("adamw", sizes);
    std::filesystem::resize_file(where, std::filesystem::file_size(where) - 7);
    CHECK_THROWS_AS(opt.load(where), fusedopt::Error);
    try {
      opt.load(where);
    } catch (const fusedopt::Error& e) {
      const std::string what = e.what();
      CHECK(what.rfind("cannot load checkpoint: " + where + ": ", 0) == 0);
    }
    CHECK(snapshot(opt, target, false) == before);
    // One flipped bit in a state's bytes: a well-formed file, caught by the data checksum.
    saved_by("adamw", sizes);
    {
      std::fstream f(where, std::ios::binary | std::ios::in | std::ios::out);
      f.seekg(-5, std::ios::end);
      const char c = static_cast<char>(f.get());
      f.seekp(-5, std::ios::end);
      f.put(static_cast<char>(c ^ 0x10));
    }
    try {
      opt.load(where);
      FAIL("a checkpoint with a flipped bit loaded");
    } catch (const fusedopt::Error& e) {
      CHECK(std::string(e.what()).find("does not match its checksum") != std::string::npos);
    }
    CHECK(snapshot(opt, target, false) == before);
    {
      std::ofstream junk(where, std::ios::binary | std::ios::trunc);
      junk << "this is not a safetensors file at all";
    }
    CHECK_THROWS_AS(opt.load(where), fusedopt::Error);
    CHECK(snapshot(opt, target, false) == before);
    std::filesystem::remove(where);
    CHECK_THROWS_AS(opt.load(where), fusedopt::Error);
    CHECK(snapshot(opt, target, false) == before);

    // A rule of the same name with another text is another rule.
    Model m(sizes, {DType::F32});
    std::string text = fusedopt::preset_text("adamw");
    text += "\n# edited\n";
    Optimizer edited(fusedopt::Rule::parse(text, "adamw.rule"), m.groups());
    edited.save(where);
    refused("cannot load checkpoint " + where +
            ": rule 'adamw' was saved with a different text (the rule changed since)");
  }

  TEST_CASE("a checkpoint with a step count out of range or a hyper given twice is refused") {
    use_private_cache();
    TempFolder dir;
    const std::string where = (dir.path() / "ckpt.safetensors").string();
    Model m({7, 3}, {DType::F32});
    std::mt19937 rng(fresh_seed());
    for (HostTensor& t : m.p) fill_normal(t, rng);
    Optimizer opt(fusedopt::Rule::preset("adamw"), m.groups());
    opt.step();
    opt.save(where);
    // The same file with another step count in its metadata.
    auto with_step = [&](const std::string& step) {
      const std::string out = (dir.path() / ("step-" + step + ".safetensors")).string();
      rewrite_metadata(where, out, "step", step);
      return out;
    };
    {
      // A hyper twice in a group (the last group here): refused, not "the last one wins".
      const std::string hypers = fusedopt::io::read_safetensors(where).metadata.at("hypers");
      const std::string twice = (dir.path() / "twice.safetensors").string();
      rewrite_metadata(where, twice, "hypers", hypers + ",lr=0.5");
      CHECK_THROWS_WITH_AS(
          opt.load(twice),
          ("cannot load checkpoint " + twice + ": hyper 'lr' appears twice in group 1").c_str(),
          fusedopt::IoError);  // malformed: not what save() writes
    }
    const std::string huge = with_step("9223372036854775807");
    CHECK_THROWS_WITH_AS(opt.load(huge),
                         ("cannot load checkpoint " + huge +
                          ": step 9223372036854775807 is above the most steps an optimizer "
                          "takes (2^53)")
                             .c_str(),
                         fusedopt::IoError);
    CHECK(opt.step_count() == 1);
    // 2^53 itself loads; the next step would pass the limit and is refused, not wrapped.
    opt.load(with_step("9007199254740992"));
    CHECK(opt.step_count() == (std::int64_t{1} << 53));
    CHECK_THROWS_WITH_AS(opt.step(),
                         "the optimizer has taken 9007199254740992 steps, the most it takes (2^53)",
                         fusedopt::UsageError);
    CHECK(opt.step_count() == (std::int64_t{1} << 53));
  }

  TEST_CASE("the step reaches the kernel exactly past 2^24 (it is a double, not a float)") {
    use_private_cache();
    TempFolder dir;
    const std::string where = (dir.path() / "ckpt.safetensors").string();
    Model m({9}, {DType::F32});
    std::mt19937 rng(fresh_seed());
    for (HostTensor& t : m.p) fill_normal(t, rng);
    // The update is (step - 2^25) * g: 1 * g at step 2^25 + 1, which a float step (2^25 + 1
    // rounds to 2^25) would make 0.
    std::vector<fusedopt::ParamGroup> groups = m.groups();
    groups.resize(1);  // the tensor is in group 0; group 1 (empty) would set an lr
    Optimizer opt(
        fusedopt::Rule::parse("param p\ngrad g\np = p - (step - 33554432) * g\n", "steps.rule"),
        groups);
    opt.save(where);
    const std::string moved = (dir.path() / "moved.safetensors").string();
    rewrite_metadata(where, moved, "step", "33554432");
    opt.load(moved);
    fill_grads(m, rng);
    std::vector<double> want;
    for (std::int64_t i = 0; i < m.p[0].numel(); ++i) {
      want.push_back(m.p[0].get(i) - 1.0 * m.g[0].get(i));
    }
    opt.step();
    CHECK(opt.step_count() == 33554433);
    for (std::int64_t i = 0; i < m.p[0].numel(); ++i) {
      CHECK(m.p[0].get(i) == doctest::Approx(want[static_cast<std::size_t>(i)]).epsilon(1e-6));
    }
  }

  TEST_CASE("a checkpoint's numbers are read strictly: one spelling, finite hypers in range") {
    use_private_cache();
    TempFolder dir;
    const std::string where = (dir.path() / "ckpt.safetensors").string();
    Model m({7, 3}, {DType::F32});
    std::mt19937 rng(fresh_seed());
    for (HostTensor& t : m.p) fill_normal(t, rng);
    Optimizer opt(fusedopt::Rule::preset("adamw"), m.groups());
    fill_grads(m, rng);
    opt.step();
    opt.save(where);
    fill_grads(m, rng);
    opt.step();
    const std::vector<std::string> before = snapshot(opt, m, false);
    const std::string hypers = fusedopt::io::read_safetensors(where).metadata.at("hypers");
    REQUIRE(hypers.rfind("group0:lr=0.001,", 0) == 0);
    int n = 0;
    // As a tool editing the file would write it (with a fresh, valid checksum): what the
    // parser itself must refuse.
    auto edited = [&](const std::string& key, const std::string& value) {
      const std::string out = (dir.path() / ("e" + std::to_string(n++) + ".safetensors")).string();
      rewrite_metadata(where, out, key, value);
      return out;
    };
    for (const char* step : {" 1", "+1", "01", "0x1", "1.0", "1e0", "-3", "1 ", ""}) {
      CAPTURE(step);
      const std::string file = edited("step", step);
      CHECK_THROWS_WITH_AS(
          opt.load(file),
          ("cannot load checkpoint " + file + ": step '" + step + "' is not a step count").c_str(),
          fusedopt::IoError);
      CHECK(snapshot(opt, m, false) == before);
    }
    for (const char* lr :
         {"nan", "NaN", "inf", "-inf", "1e400", "0x1p-10", " 0.5", "+0.5", "0.5 ", "1e", "."}) {
      CAPTURE(lr);
      std::string text = hypers;
      text.replace(text.find("lr=0.001"), 8, std::string("lr=") + lr);
      const std::string file = edited("hypers", text);
      CHECK_THROWS_WITH_AS(
          opt.load(file),
          ("cannot load checkpoint " + file + ": hyper 'lr' of group 0 has the value '" + lr +
           "', not a finite decimal number")
              .c_str(),
          fusedopt::IoError);
      CHECK(snapshot(opt, m, false) == before);
    }
    {
      // Finite as a double, but not as the fp32 the kernels compute in.
      std::string text = hypers;
      text.replace(text.find("lr=0.001"), 8, "lr=1e300");
      const std::string file = edited("hypers", text);
      CHECK_THROWS_AS(opt.load(file), fusedopt::UsageError);
      try {
        opt.load(file);
      } catch (const fusedopt::Error& e) {
        CAPTURE(e.what());
        CHECK(std::string(e.what()).find("'lr'") != std::string::npos);
      }
      CHECK(snapshot(opt, m, false) == before);
    }
    // What save() writes loads.
    opt.load(where);
    CHECK(opt.step_count() == 1);
  }

  TEST_CASE("every single-bit flip of a checkpoint is refused, or loads bit-identically") {
    use_private_cache();
    TempFolder dir;
    const std::string saved = (dir.path() / "a.safetensors").string();
    const std::string later = (dir.path() / "b.safetensors").string();
    const std::string flipped = (dir.path() / "f.safetensors").string();
    Model m({6, 3, 0}, {DType::BF16, DType::F32});
    std::mt19937 rng(fresh_seed());
    for (HostTensor& t : m.p) fill_normal(t, rng);
    fusedopt::OptimizerOptions options;
    options.master_weights = true;
    Optimizer opt(fusedopt::Rule::preset("adamw"), m.groups(), options);
    opt.set_hyper("lr", 0.0125, 0);
    fill_grads(m, rng);
    opt.step();
    opt.save(saved);
    const std::vector<std::string> at_save = snapshot(opt, m, true);
    // The optimizer under test is one step further: a load that went through shows.
    fill_grads(m, rng);
    opt.step();
    opt.set_hyper("lr", 0.5, 1);
    opt.save(later);
    const std::vector<std::string> current = snapshot(opt, m, true);
    REQUIRE(current != at_save);

    std::string good;
    {
      std::ifstream in(saved, std::ios::binary);
      good.assign(std::istreambuf_iterator<char>(in), {});
    }
    int refused = 0, identical = 0;
    for (std::size_t i = 0; i < good.size(); ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        std::string bad = good;
        bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
        {
          std::ofstream out(flipped, std::ios::binary | std::ios::trunc);
          out.write(bad.data(), static_cast<std::streamsize>(bad.size()));
        }
        INFO("byte ", i, " of ", good.size(), ", bit ", bit);
        bool loaded = true;
        try {
          opt.load(flipped);
        } catch (const fusedopt::Error&) {
          loaded = false;
        }
        if (!loaded) {
          ++refused;
          REQUIRE(snapshot(opt, m, true) == current);
          continue;
        }
        ++identical;
        REQUIRE(snapshot(opt, m, true) == at_save);
        opt.load(later);
      }
    }
    MESSAGE(fmt::format("{} bytes, {} flips: {} refused, {} loaded bit-identically", good.size(),
                        good.size() * 8, refused, identical));
    CHECK(refused + identical == static_cast<int>(good.size() * 8));
  }
}

}  // namespace fusedopt::testing
