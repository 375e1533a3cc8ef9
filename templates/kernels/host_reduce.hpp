// The host skeleton's reductions (host_kernel.hpp includes it; generated sources paste it
// there): each reduction pass over the chunks (fusedopt_reduce_host) and the finalize that
// combines the chunk partials (fusedopt_finalize_host), in a fixed order. Not a header of
// its own: it needs what host_kernel.hpp defines before it.
// ---- reductions: two fixed-order stages, so the bits never depend on the thread count ----
// Stage 1 (fusedopt_reduce_host): each chunk's accumulators, over FO_LANES interleaved
// lanes combined in lane order, into L->partials. Which thread runs a chunk does not matter.
// Stage 2 (fusedopt_finalize_host): per tensor and globally, the chunk partials in chunk
// order, in double.

FO_FN double fo_combine(bool is_max, double a, double b) {
  return is_max ? fo_maxnan_d(a, b) : a + b;
}

#if FO_FACTORED
/// Chunk c of tensor t (whole rows) into the FO_LANES lanes of each accumulator of pass
/// kPass, and its rows' means and its columns' partial sums.
template <int kPass>
FO_FN void fo_reduce_rows(const fo_launch* L, long long c, const fo_chunk& chunk,
                          const fo_tensor& t, const fo_uniform& u, const fo_tvals& tv,
                          float (*lanes)[FO_LANES], bool check) {
  // Row sums are complete within the chunk (whole rows): each row's mean is written
  // here; column sums are this chunk's partials, combined by the finalize in chunk order.
  const long long R = fo_rows_of(*L, chunk.tensor), C = fo_cols_of(*L, chunk.tensor);
  const fo_rcx X0 = fo_rc_chunk_base<kPass>(L, c, chunk, u, tv);
  double* colp = L->col_partials + L->chunk_cols[c];  // [slot * C + column]
  float rv[FO_NUM_ROWV];
  for (long long k = 0; k < C * FO_NUM_COL_SLOTS; ++k) colp[k] = 0.0;
#if FO_NUM_QUANT > 0
  // Quantized states: each block dequantized once, when the walk reaches it (the pass
  // writes no state).
  const fo_qtensor q = fo_qbind(L->ptrs + (long long)chunk.tensor * FO_NUM_ROLES,
                                (long long)L->tensor_info[4 * (long long)chunk.tensor]);
  const long long numel = (long long)L->tensor_info[4 * (long long)chunk.tensor];
  float stage[FO_NUM_QUANT][FO_QUANT_BLOCK];
  long long staged = -1;  // the first element of the block in the stage
  fo_tensor qs = t;
#endif
  for (long long r = chunk.begin / C; r < chunk.end / C; ++r) {
    const fo_rcx X = fo_rc_row<kPass>(X0, r, R, u, tv, rv);
    const long long c0 = X0.col + (r / R) * C;
    // The row's sums in FO_LANES lanes of double (column cc in lane cc % FO_LANES),
    // combined in lane order at its end; each column's sum in its own partial.
    double rr[FO_NUM_ROW_SLOTS][FO_LANES];
    for (int s = 0; s < FO_NUM_ROW_SLOTS; ++s) {
      for (int l = 0; l < FO_LANES; ++l) rr[s][l] = 0.0;
    }
#if FO_NUM_QUANT > 0
    for (long long cc = 0; cc < C; ++cc) {
      const long long i = r * C + cc;
      if (staged < 0 || i >= staged + FO_QUANT_BLOCK) {
        staged = i - i % FO_QUANT_BLOCK;
        const long long left = numel - staged;
        qs = fo_q_view(t, staged, stage);
        fo_q_stage_in(q, staged, (int)(left < FO_QUANT_BLOCK ? left : FO_QUANT_BLOCK), stage);
      }
      fo_reduce_element_rc<kPass>(qs, i - staged, u, tv, X, c0 + cc, &lanes[0][cc % FO_LANES],
                                  FO_LANES, check, &rr[0][cc % FO_LANES], colp + cc);
    }
#else
    long long cc = 0;
    for (; cc + FO_LANES <= C; cc += FO_LANES) {
#pragma omp simd
      for (int l = 0; l < FO_LANES; ++l) {
        fo_reduce_element_rc<kPass>(t, r * C + cc + l, u, tv, X, c0 + cc + l, &lanes[0][l],
                                    FO_LANES, check, &rr[0][l], colp + cc + l);
      }
    }
    for (int l = 0; cc < C; ++cc, ++l) {
      fo_reduce_element_rc<kPass>(t, r * C + cc, u, tv, X, c0 + cc, &lanes[0][l], FO_LANES, check,
                                  &rr[0][l], colp + cc);
    }
#endif
    for (int s = 0; s < FO_NUM_ROW_SLOTS; ++s) {
      if (fo_row_slot_pass(s) != kPass) continue;
      double sum = 0.0;
      for (int l = 0; l < FO_LANES; ++l) sum += rr[s][l];
      L->row_totals[X.row * FO_NUM_ROW_SLOTS + s] = sum / C;
    }
  }
}
#endif

template <int kPass>
static void fo_reduce_run(const fo_launch* L) {
  const double step = fo_launch_step(L);
  const float inv_grad_scale = fo_unscale_factor(L->inv_grad_scale, L->grad_scale_ptr);
  const int count = fo_acc_count(kPass);
  const bool check = kPass == 0 && L->check_grads != 0;
#pragma omp parallel if (L->num_chunks > 1)
  {
    int group = -1;
    fo_uniform U;
#pragma omp for schedule(static)
    for (long long c = 0; c < L->num_chunks; ++c) {
      const fo_chunk chunk = L->chunks[c];
      if (chunk.group != group) {
        U = fo_prepare(L->hypers + (long long)chunk.group * FO_NUM_HYPERS, step, inv_grad_scale,
                       L->global_totals);
        U.seed = L->seed;
        group = chunk.group;
      }
      const fo_tensor t = fo_bind_tensor(L, chunk.tensor);
      const fo_uniform u = U;
      const fo_tvals tv = fo_chunk_values(L, chunk.tensor, chunk.group, step, 0);
      float lanes[FO_MAX_ACC][FO_LANES];
      for (int j = 0; j < FO_MAX_ACC; ++j) {
        for (int l = 0; l < FO_LANES; ++l) lanes[j][l] = 0.0f;
      }
#if FO_FACTORED
      fo_reduce_rows<kPass>(L, c, chunk, t, u, tv, lanes, check);
#elif FO_NUM_QUANT > 0
      // Block by block through the dequantized stage (the pass writes no state: quantized
      // bindings recompute).
      const fo_qtensor q = fo_qbind(L->ptrs + (long long)chunk.tensor * FO_NUM_ROLES,
                                    (long long)L->tensor_info[4 * (long long)chunk.tensor]);
      float stage[FO_NUM_QUANT][FO_QUANT_BLOCK];
      for (long long b = chunk.begin; b < chunk.end; b += FO_QUANT_BLOCK) {
        const int n = (int)(chunk.end - b < FO_QUANT_BLOCK ? chunk.end - b : FO_QUANT_BLOCK);
        const fo_tensor s = fo_q_view(t, b, stage);
        fo_q_stage_in(q, b, n, stage);
        int j = 0;
        for (; j + FO_LANES <= n; j += FO_LANES) {
#pragma omp simd
          for (int l = 0; l < FO_LANES; ++l) {
            fo_reduce_element<kPass>(s, j + l, u, tv, &lanes[0][l], FO_LANES, check);
          }
        }
        for (int l = 0; j < n; ++j, ++l) {
          fo_reduce_element<kPass>(s, j, u, tv, &lanes[0][l], FO_LANES, check);
        }
      }
#else
      long long i = chunk.begin;
      for (; i + FO_LANES <= chunk.end; i += FO_LANES) {
#pragma omp simd
        for (int l = 0; l < FO_LANES; ++l) {
          fo_reduce_element<kPass>(t, i + l, u, tv, &lanes[0][l], FO_LANES, check);
        }
      }
      for (int l = 0; i < chunk.end; ++i, ++l) {
        fo_reduce_element<kPass>(t, i, u, tv, &lanes[0][l], FO_LANES, check);
      }
#endif
      for (int j = 0; j < count; ++j) {
        const bool is_max = fo_acc_max(kPass, j) != 0;
        float acc = lanes[j][0];
        for (int l = 1; l < FO_LANES; ++l)
          acc = is_max ? fo_maxnan(acc, lanes[j][l]) : acc + lanes[j][l];
        L->partials[c * FO_MAX_ACC + j] = acc;
      }
    }
  }
}

/// Reduction pass `pass` (0-based, below FO_REDUCTION_PASSES): every chunk's partials.
FO_EXTERN_C void fusedopt_reduce_host(const fo_launch* L, int pass) {
  if (fo_launch_skipped(L)) return;
  FO_REDUCE_DISPATCH(L, pass);  // one case per reduction pass of the rule (codegen)
}

#if FO_FACTORED
/// A factored rule's part of fusedopt_finalize_host for pass `pass`: the column and matrix
/// means, in the stages of L->rc_stage (abi.h).
static void fo_finalize_rc_host(const fo_launch* L, int pass) {
  const int stage = L->rc_stage;
  if (stage == 3) {
    // The matrix means over rows of the tensors whose sums span pieces, from the combined sums.
    for (long long t = 0; t < L->num_tensors; ++t) {
      const double* sh = fo_rc_shard(*L, t);
      if (!sh || !fo_rc_matrix_pass(*L, pass, t)) continue;
      const long long cols = L->rc_offsets[3 * t + 4] - L->rc_offsets[3 * t + 1];
      for (int s = 0; s < FO_NUM_MATRIX_SLOTS; ++s) {
        if (!fo_matrix_slot_col(s))
          fo_rc_matrix_store(*L, pass, t, 0, s, sh[cols * FO_NUM_COL_SLOTS + s]);
      }
    }
    return;
  }
  // After every per-tensor and global total: the column and matrix means.
  const double step = fo_launch_step(L);
  const float inv_grad_scale = fo_unscale_factor(L->inv_grad_scale, L->grad_scale_ptr);
  // The column means over the team, each thread a range of each tensor's columns (a
  // tensor whose sums span pieces: thread 0, through the shard).
#pragma omp parallel if (L->num_chunks > 1)
  {
#ifdef _OPENMP
    const long long nt = omp_get_num_threads(), id = omp_get_thread_num();
#else
    const long long nt = 1, id = 0;
#endif
    for (long long t = 0; t < L->num_tensors; ++t) {
      const long long cols = L->rc_offsets[3 * t + 4] - L->rc_offsets[3 * t + 1];
      if (fo_rc_shard(*L, t)) {
        if (id == 0) fo_rc_col_means(*L, pass, t, 0, 1);
      } else if (stage != 1) {
        fo_rc_col_range(L, pass, t, cols * id / nt, cols * (id + 1) / nt);
      }
    }
  }
  if (stage == 1) return;
  for (long long t = 0; t < L->num_tensors; ++t) {
    double* sh = fo_rc_shard(*L, t);
    const long long cols = L->rc_offsets[3 * t + 4] - L->rc_offsets[3 * t + 1];
    if (sh) {  // what the hook combines next: this pass's matrix sums over rows, else 0
      for (long long k = 0; k < cols * FO_NUM_COL_SLOTS + FO_NUM_MATRIX_SLOTS; ++k) sh[k] = 0.0;
    }
    if (!fo_rc_matrix_pass(*L, pass, t)) continue;
    for (long long b = 0; b < fo_rc_matrices(*L, t); ++b) {
      double sums[FO_NUM_MATRIX_SLOTS > 0 ? FO_NUM_MATRIX_SLOTS : 1];
      fo_rc_matrix_partials(*L, pass, t, b, step, inv_grad_scale, 0, 1, sums);
      for (int s = 0; s < FO_NUM_MATRIX_SLOTS; ++s) {
        if (sh && !fo_matrix_slot_col(s)) {
          if (fo_matrix_slot_pass(s) == pass) sh[cols * FO_NUM_COL_SLOTS + s] = sums[s];
        } else {
          fo_rc_matrix_store(*L, pass, t, b, s, sums[s]);
        }
      }
    }
  }
}
#endif

/// Combines pass `pass`'s chunk partials into the per-tensor and global totals, then a
/// factored rule's column and matrix means; with pieces in stages (L->rc_stage, abi.h).
FO_EXTERN_C void fusedopt_finalize_host(const fo_launch* L, int pass) {
  if (fo_launch_skipped(L)) return;
  const int count = fo_acc_count(pass);
  for (int j = 0; j < count && L->rc_stage <= 1; ++j) {
    const bool is_max = fo_acc_max(pass, j) != 0;
    const int slot = fo_acc_slot(pass, j);
    if (slot >= 0) {
      for (long long t = 0; t < L->num_tensors; ++t) {
        const long long first = L->tensor_chunks[2 * t];
        const long long n = L->tensor_chunks[2 * t + 1];
        double acc = 0.0;
        for (long long c = first; c < first + n; ++c)
          acc = fo_combine(is_max, acc, L->partials[c * FO_MAX_ACC + j]);
        L->tensor_totals[t * FO_NUM_TENSOR_SLOTS + slot] = acc;
      }
    } else {
      double acc = 0.0;
      for (long long c = 0; c < L->num_chunks; ++c)
        acc = fo_combine(is_max, acc, L->partials[c * FO_MAX_ACC + j]);
      double* g = L->global_totals + (-1 - slot);
      *g = L->global_accumulate ? fo_combine(is_max, *g, acc) : acc;
    }
  }
#if FO_FACTORED
  fo_finalize_rc_host(L, pass);
#endif
}
