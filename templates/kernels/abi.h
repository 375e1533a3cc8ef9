// The launch ABI between the runtime and generated kernels: what a launch passes in.
// Plain C++ valid on the host and under NVRTC; the runtime includes this very file.
#ifndef FUSEDOPT_ABI_H
#define FUSEDOPT_ABI_H

// Bump when you change this: any struct below or an exported entry point's signature.
#define FO_ABI_VERSION 15

// Launch constants shared by the runtime and the kernels (one source for both):
/// Threads per block of every CUDA kernel (the runtime's kCudaBlock).
#define FO_CUDA_BLOCK 512

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
  const fo_chunk* chunks;  ///< the chunk table, sorted by group
  long long num_chunks;
  void* const* ptrs;             ///< [tensor * FO_NUM_ROLES + role]
  const double* hypers;          ///< [group * FO_NUM_HYPERS + hyper], declaration order (fo_prepare
                                 ///< computes uniform values from them in double)
  double step;                   ///< 1-based step, used when step_ptr is null
  float inv_grad_scale;          ///< what grads are multiplied by (see fo_unscale_factor)
  const double* step_ptr;        ///< non-null: the steps taken, counted on the device (exact to
                                 ///< 2^53); the launch's step is *step_ptr + 1
  const float* grad_scale_ptr;   ///< non-null: a device GradScaler's fo_scaler::scale; grads
                                 ///< are then multiplied by inv_grad_scale / *grad_scale_ptr
  const unsigned char* aligned;  ///< per tensor: 1 if every role's pointer is aligned to 4
                                 ///< of its elements (16 bytes fp32, 8 bytes 16-bit)
                                 ///< (device); null = never vectorise

  // Reductions (rules with reduction passes; null/0 otherwise).
  float* partials;                 ///< [chunk * FO_MAX_ACC + j]: each chunk's accumulators
  double* tensor_totals;           ///< [tensor * FO_NUM_TENSOR_SLOTS + slot]: raw per-tensor totals
  double* global_totals;           ///< [FO_NUM_GLOBAL_SLOTS]: raw global totals, one row shared
                                   ///< by every kernel of an optimizer (the last slot: grad check)
  const long long* tensor_chunks;  ///< [2 * tensor]: first chunk of the tensor, chunk count
  long long num_tensors;           ///< tensors of the plan (also set for rules with scalar states)
  int global_accumulate;           ///< finalize: 0 = write the global totals, 1 = combine into them
  int check_grads;                 ///< pass 0 also counts non-finite unscaled gradients
  /// Non-null: when *skip_if_set != 0 (a non-finite gradient was found on the device), the
  /// launch does nothing (every entry but init and the grad check; host and CUDA alike).
  const double* skip_if_set;

  // Per-tensor scalar states (rules that declare `scalar`; null/0 otherwise).
  double* scalars;           ///< [tensor * FO_NUM_SCALARS + k]: each scalar's value before
                             ///< the step; fusedopt_scalars writes the step's results
  const int* tensor_groups;  ///< [tensor]: its group (every tensor, empty ones included)
  /// [tensor * 4]: each tensor's built-in values numel, dims, rows, cols (the rule's
  /// `numel dims rows cols`), as doubles.
  const double* tensor_info;
  /// [2 * tensor]: the param the tensor is (its index in the optimizer) and the index of its
  /// first element in that param (a ZeRO piece's offset): with `seed`, what keys the random
  /// numbers of stochastic rounding and rand(), so they do not depend on layout or sharding.
  /// Null: tensor t of the plan, from element 0.
  const long long* tensor_ids;
  unsigned long long seed;

  // Factored (row/column) values: rules with row/col states or row_mean, col_mean,
  // matrix_mean (FO_FACTORED; null otherwise). Chunks then cover whole rows of one matrix.
  const long long* rc_offsets;  ///< [3 * tensor + 0/1/2]: the tensor's first row, column and
                                ///< matrix; entries 3 * num_tensors + 0/1/2 are the totals
  float* row_states;            ///< [k * total rows + row]
  float* col_states;            ///< [k * total columns + column]
  double* row_totals;           ///< [row * FO_NUM_ROW_SLOTS + slot]: row_mean results
  double* col_totals;           ///< [column * FO_NUM_COL_SLOTS + slot]: col_mean results
  double* matrix_totals;        ///< [matrix * FO_NUM_MATRIX_SLOTS + slot]: matrix_mean results
  double* col_partials;         ///< chunk c's column sums at chunk_cols[c]: [column in its
                                ///< matrix * FO_NUM_COL_SLOTS + slot]
  const long long* chunk_cols;  ///< [chunk]: offset of its column sums in col_partials

  // Pieces (dim-0 shards of bigger tensors, Tensor::whole_shape; null/0 otherwise).
  /// [tensor * 4]: the whole tensor's numel, dims, rows, cols: what the rule's built-ins
  /// read, and the row counts column and matrix means divide by. Null: tensor_info.
  const double* tensor_whole;
  /// The sums of a factored rule that span pieces (a 1-D or 2-D piece's column sums and
  /// matrix sums over rows), combined across ranks by the reduction hook between the
  /// stages of a finalize: tensor t's at shard[shard_offsets[t]] (-1: none), its C columns'
  /// [column * FO_NUM_COL_SLOTS + slot], then FO_NUM_MATRIX_SLOTS matrix sums.
  double* shard;
  const long long* shard_offsets;
  /// Finalize: 0 = the whole finalize; with pieces 1 = the totals and the spanning column
  /// sums (into shard), 2 = the column means and matrix sums (spanning ones over rows into
  /// shard), 3 = the spanning matrix means over rows (from shard).
  int rc_stage;
};

/// A GradScaler's state (torch.amp.GradScaler's scale and growth tracker), kept in device
/// memory by a device GradScaler and updated there after each step, or on the host.
struct fo_scaler {
  float scale;         ///< the loss scale (fp32, as torch keeps it)
  int growth_tracker;  ///< good steps in a row since the scale last changed
  int found_inf;       ///< 1: the last step found a non-finite gradient and was skipped
};

/// torch's _amp_update_scale_: after a step that found a non-finite gradient (`found`),
/// scale *= backoff and the tracker restarts; after `interval` good steps in a row, scale
/// *= growth while the result stays finite. The products are fp32, as torch's are. One
/// definition for the host and the device (no library call: x - x is 0 only when x is
/// finite).
#ifdef __CUDACC__
#define FO_HOST_DEVICE __host__ __device__
#else
#define FO_HOST_DEVICE
#endif
FO_HOST_DEVICE inline void fo_update_scale(fo_scaler* s, int found, float growth, float backoff,
                                           int interval) {
  s->found_inf = found ? 1 : 0;
  if (found) {
    s->scale = s->scale * backoff;
    s->growth_tracker = 0;
  } else if (s->growth_tracker + 1 >= interval) {
    const float grown = s->scale * growth;
    if (grown - grown == 0.0f) s->scale = grown;
    s->growth_tracker = 0;
  } else {
    s->growth_tracker += 1;
  }
}

/// What a launch multiplies gradients by: `factor`, divided by the loss scale at `scale`
/// when non-null (a device GradScaler), in double and rounded once to fp32, as torch
/// computes its inverse scale (factor 1) and as the host GradScaler does (any factor, e.g.
/// 1 / ranks for data parallel).
FO_HOST_DEVICE inline float fo_unscale_factor(float factor, const float* scale) {
  return scale ? (float)((double)factor / (double)*scale) : factor;
}

/// A block-quantized state of one tensor of `numel` elements (DTypeBinding::quant) is one
/// piece of memory: its codes (8-bit: a byte each; 4-bit: two per byte, element 2j in the
/// high nibble of byte j), then, from the next multiple of 16 bytes, one fp32 absmax per
/// block of elements. The role pointer points at the codes.
FO_HOST_DEVICE inline long long fo_q_code_bytes(long long numel, int bits) {
  return bits == 4 ? (numel + 1) / 2 : numel;
}
FO_HOST_DEVICE inline long long fo_q_absmax_offset(long long numel, int bits) {
  return (fo_q_code_bytes(numel, bits) + 15) / 16 * 16;
}
FO_HOST_DEVICE inline long long fo_q_blocks(long long numel, int block) {
  return (numel + block - 1) / block;
}
/// Bytes of the whole piece (codes, padding, absmax).
FO_HOST_DEVICE inline long long fo_q_bytes(long long numel, int bits, int block) {
  return fo_q_absmax_offset(numel, bits) + 4 * fo_q_blocks(numel, block);
}

#endif  // FUSEDOPT_ABI_H
