// HostModule: a kernel compiled for the host CPU, dlopen'ed; its entry points run on the
// calling thread and its OpenMP team, so a launch is done when it returns and the stream
// is ignored.
#include "device/host_module.hpp"

#include "fusedopt/error.hpp"
#include "support/check.hpp"
#include "support/dynlib.hpp"

namespace fusedopt::runtime {

namespace {

using EntryPoint = void (*)(const fo_launch*);
using CheckPoint = int (*)(const fo_launch*);
using PassPoint = void (*)(const fo_launch*, int);

class HostModule final : public Module {
 public:
  explicit HostModule(KernelImage image)
      : Module(std::move(image.info)),
        lib_(support::load_host_module(info().key, *image.binary, "fusedopt-" + layout().name)) {
    const std::string& rule_name = layout().name;
    auto abi = reinterpret_cast<int (*)()>(lib_->symbol("fusedopt_abi_version"));
    step_ = reinterpret_cast<EntryPoint>(lib_->symbol("fusedopt_step_host"));
    init_ = reinterpret_cast<EntryPoint>(lib_->symbol("fusedopt_init_host"));
    check_ = reinterpret_cast<CheckPoint>(lib_->symbol("fusedopt_check_host"));
    reduce_ = reinterpret_cast<PassPoint>(lib_->symbol("fusedopt_reduce_host"));
    finalize_ = reinterpret_cast<PassPoint>(lib_->symbol("fusedopt_finalize_host"));
    scalars_ = reinterpret_cast<PassPoint>(lib_->symbol("fusedopt_scalars_host"));
    if (!abi || !step_ || !init_ || !check_ || !reduce_ || !finalize_ || !scalars_) {
      throw InternalError("host kernel for '" + rule_name + "' lacks its entry points");
    }
    FUSEDOPT_CHECK_INTERNAL(abi() == FO_ABI_VERSION, "host kernel ABI {} != runtime ABI {}", abi(),
                            FO_ABI_VERSION);
  }

  void step(const fo_launch& L, void*) override {
    if (L.num_chunks > 0) step_(&L);
  }
  void init(const fo_launch& L, void*) override {
    if (L.num_chunks > 0) init_(&L);
  }
  void reduce(int pass, const fo_launch& L, void*) override { reduce_(&L, pass); }
  void finalize(int pass, const fo_launch& L, void*) override { finalize_(&L, pass); }
  void scalars(bool init, const fo_launch& L, void*) override { scalars_(&L, init ? 1 : 0); }
  void check(const fo_launch& L, double* flag, void*) override {
    if (L.num_chunks > 0 && check_(&L) == 0) *flag = 1.0;
  }
  // The count and the scaler's update: a few instructions here, as the CUDA kernels'
  // one-thread launches do them.
  void advance_step(double* steps_taken, const double* skip, void*) override {
    if (skip == nullptr || *skip == 0.0) *steps_taken += 1.0;
  }
  void update_scale(fo_scaler* scaler, const double* found, float growth, float backoff,
                    int interval, void*) override {
    fo_update_scale(scaler, *found != 0.0, growth, backoff, interval);
  }
  bool counts_by_launch() const override { return false; }

 private:
  std::shared_ptr<const support::DynLib> lib_;
  EntryPoint step_ = nullptr;
  EntryPoint init_ = nullptr;
  CheckPoint check_ = nullptr;
  PassPoint reduce_ = nullptr;
  PassPoint finalize_ = nullptr;
  PassPoint scalars_ = nullptr;
};

}  // namespace

std::unique_ptr<Module> load_host_module(KernelImage image) {
  return std::make_unique<HostModule>(std::move(image));
}

}  // namespace fusedopt::runtime
