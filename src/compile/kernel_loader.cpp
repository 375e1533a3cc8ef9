// load_kernel: the target a device asks for, the provider's binary, the backend's load.
#include "compile/kernel_loader.hpp"

#include <string>
#include <tuple>
#include <utility>

#include "compile/compiler.hpp"
#include "compile/device_target.hpp"
#include "compile/kernel_provider.hpp"

namespace fusedopt::runtime {

namespace {

/// The driver's version (from the backend) and NVRTC's, which decide what a GPU loads.
CudaVersions cuda_versions(const DeviceImageKind& kind) {
  CudaVersions v;
  v.driver = kind.driver_version;
  std::tie(v.nvrtc_major, v.nvrtc_minor) = jit::nvrtc_version();
  v.nvrtc_archs = jit::nvrtc_supported_archs();
  return v;
}

}  // namespace

std::unique_ptr<Module> load_kernel(Backend& backend, std::shared_ptr<const lang::Rule> rule,
                                    const DTypeBinding& dtypes, ReductionStrategy strategy,
                                    cache::KernelCache& cache) {
  const DeviceImageKind kind = backend.image_kind();
  CudaVersions versions;
  Target target = Target::host();
  if (kind.kind == DeviceImageKind::Kind::CudaEmulator) target = Target::emu();
  if (kind.kind == DeviceImageKind::Kind::Cuda) {
    versions = cuda_versions(kind);
    target = choose_cuda_target(kind.sm, versions);
  }
  auto image = [&](const Target& t) {
    provider::ProvidedKernel built = provider::provide({rule, nullptr, dtypes, t, strategy}, cache);
    std::shared_ptr<const std::string> binary = built.binary;
    return KernelImage{t, std::move(binary), built.take_info()};
  };
  std::string refusal;
  std::unique_ptr<Module> module = backend.load(image(target), &refusal);
  if (module) return module;
  // The driver refused a CUBIN: PTX for it to finish (or UnavailableError saying why not).
  target = ptx_fallback(kind.sm, versions, refusal);
  module = backend.load(image(target), &refusal);
  if (!module) throw InternalError("load_kernel: " + backend.name() + " refused PTX: " + refusal);
  return module;
}

}  // namespace fusedopt::runtime
