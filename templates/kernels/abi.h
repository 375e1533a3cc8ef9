// The launch ABI between the runtime and generated kernels: what a launch passes in.
// Plain C++ valid on the host and under NVRTC; the runtime includes this very file.
#ifndef FUSEDOPT_ABI_H
#define FUSEDOPT_ABI_H

// Bump when you change this: any struct below or an exported entry point's signature.
#define FO_ABI_VERSION 2

/// One work item: elements [begin, end) of tensor `tensor`, whose hypers are group `group`.
struct fo_chunk {
  int tensor;
  int group;
  long long begin;
  long long end;
};

/// Everything a launch needs. Pointers are device pointers for CUDA kernels and host
/// pointers for host kernels.
struct fo_launch {
  const fo_chunk* chunks;       ///< the chunk table, sorted by group
  long long num_chunks;
  void* const* ptrs;            ///< [tensor * FO_NUM_ROLES + role]
  const float* hypers;          ///< [group * FO_NUM_HYPERS + hyper], declaration order
  float step;                   ///< 1-based step, used when step_ptr is null
  float inv_grad_scale;         ///< used when inv_grad_scale_ptr is null
  const float* step_ptr;        ///< capturable mode: read the step here
  const float* inv_grad_scale_ptr;
  const unsigned char* aligned;  ///< per tensor: 1 if every role's pointer is 16-byte aligned (device); null = never vectorise
};

#endif  // FUSEDOPT_ABI_H
