// Factored (row/column) state: what the host and CUDA skeletons share, pasted between the
// generated part and the skeleton (codegen/source.cpp), so both targets run the same code.
// Each chunk of a factored rule covers whole rows of one matrix (exec/plan.cpp). One
// thread runs each function for one tensor, in a fixed order: deterministic.
#if FO_FACTORED

/// Tensor t's first row, column and matrix, and the launch's row/column arrays.
FO_FN fo_rcx fo_rc_base(const fo_launch& L, long long t) {
  const long long* o = L.rc_offsets;
  const long long n = L.num_tensors;
  fo_rcx X;
  X.rs = L.row_states;
  X.cs = L.col_states;
  X.rt = L.row_totals;
  X.ct = L.col_totals;
  X.mt = L.matrix_totals;
  X.nrows = o[3 * n];
  X.ncols = o[3 * n + 1];
  X.row = o[3 * t];
  X.col = o[3 * t + 1];
  X.mat = o[3 * t + 2];
  X.rv = 0;  // set by the caller before element code runs (fo_rc_values_at or the host's)
  X.cv = 0;
  X.cvs = 1;
  X.cv0 = 0;
  return X;
}
/// Rows and columns of each of tensor t's matrices (its last two dimensions).
FO_FN long long fo_rows_of(const fo_launch& L, long long t) {
  return (long long)L.tensor_info[4 * t + 2];
}
FO_FN long long fo_cols_of(const fo_launch& L, long long t) {
  return (long long)L.tensor_info[4 * t + 3];
}
/// Rows of each of tensor t's matrices in its whole tensor (a piece's whole: L.tensor_whole),
/// which its column means and matrix means over rows divide by.
FO_FN long long fo_whole_rows_of(const fo_launch& L, long long t) {
  return L.tensor_whole ? (long long)L.tensor_whole[4 * t + 2] : fo_rows_of(L, t);
}
/// Tensor t's sums that span pieces (abi.h's shard), or null: it has none (a whole tensor,
/// or a piece whose matrices are its own).
FO_FN double* fo_rc_shard(const fo_launch& L, long long t) {
  return L.shard_offsets && L.shard_offsets[t] >= 0 ? L.shard + L.shard_offsets[t] : 0;
}
/// Element i's row, column and matrix (X0: its tensor's base).
FO_FN fo_rcx fo_rc_at(const fo_rcx& X0, long long i, long long R, long long C) {
  fo_rcx X = X0;
  const long long r = i / C;
  X.row += r;
  X.mat += r / R;
  X.col += (r / R) * C + (i - r * C);
  return X;
}
/// Tensor t's uniform and per-tensor values for group `group` at `step`.
FO_FN fo_tvals fo_rc_tvals(const fo_launch& L, long long t, int group, double step) {
  fo_tvals T;
  fo_tensor_values(L.tensor_totals ? L.tensor_totals + t * FO_NUM_TENSOR_SLOTS : 0,
                   L.scalars ? L.scalars + t * FO_NUM_SCALARS : 0,
                   L.hypers + (long long)group * FO_NUM_HYPERS, step, L.global_totals,
                   L.tensor_whole  ? L.tensor_whole + t * 4
                   : L.tensor_info ? L.tensor_info + t * 4
                                   : 0,
                   T, 0);
  return T;
}

/// X with one element's row and column values of pass kPass (fo_row_values, fo_col_values)
/// computed into rv and cv: where each thread takes an element (CUDA). The host computes a
/// row's once per row and a column's once per chunk instead.
template <int kPass>
FO_FN fo_rcx fo_rc_values_at(fo_rcx X, const fo_uniform& U, const fo_tvals& T, float* rv,
                             float* cv) {
  fo_row_values<kPass>(X, X.col, U, T, rv, 1);
  fo_col_values<kPass>(X, X.col, U, T, cv, 1);
  X.rv = rv;
  X.cv = cv;
  X.cvs = 1;
  X.cv0 = X.col;
  return X;
}

/// Tensor t's column means of pass `pass`: each column's chunk partials (slot-major per
/// chunk: [slot * C + column in its matrix]), in chunk order, over the whole tensor's rows.
/// This caller takes columns first, first + stride, ... (the host: all; a CUDA block: one
/// per thread, coalesced over the partials). Each matrix has the same number of chunks, in
/// matrix order (whole rows of one matrix each: exec/plan.cpp). The mean over no rows is
/// 0. A tensor with sums that span pieces (fo_rc_shard) takes two stages: 1 writes the sums
/// into the shard (other slots and the matrix sums 0), the hook combines them across ranks,
/// and 2 divides them; stage 1 does nothing for other tensors.
FO_FN void fo_rc_col_means(const fo_launch& L, int pass, long long t, long long first,
                           long long stride) {
  const long long* o = L.rc_offsets;
  const long long R = fo_rows_of(L, t), C = fo_cols_of(L, t), Rw = fo_whole_rows_of(L, t);
  const fo_rcx X0 = fo_rc_base(L, t);
  const long long cols = o[3 * t + 4] - o[3 * t + 1];
  const long long c0 = L.tensor_chunks[2 * t], n = L.tensor_chunks[2 * t + 1];
  const long long per = C > 0 && cols >= C ? n / (cols / C) : 0;  // chunks per matrix
  double* const sh = fo_rc_shard(L, t);
  if (L.rc_stage == 1 && !sh) return;
  if (sh && L.rc_stage == 1 && first == 0) {
    for (int m = 0; m < FO_NUM_MATRIX_SLOTS; ++m) sh[cols * FO_NUM_COL_SLOTS + m] = 0.0;
  }
  for (int s = 0; s < FO_NUM_COL_SLOTS; ++s) {
    const bool mine = fo_col_slot_pass(s) == pass;
    if (!mine && !(sh && L.rc_stage == 1)) continue;
    for (long long k = first; k < cols; k += stride) {
      const long long b = k / C, cc = k - b * C;  // column cc of matrix b
      double v = 0.0;
      if (sh && L.rc_stage == 2) {
        v = sh[k * FO_NUM_COL_SLOTS + s];
      } else {
        for (long long ch = c0 + b * per; ch < c0 + (b + 1) * per && R > 0 && mine; ++ch)
          v += L.col_partials[L.chunk_cols[ch] + s * C + cc];
      }
      if (sh && L.rc_stage == 1) {
        sh[k * FO_NUM_COL_SLOTS + s] = v;  // the raw sum, combined across ranks
      } else {
        L.col_totals[(X0.col + k) * FO_NUM_COL_SLOTS + s] = Rw > 0 ? v / Rw : 0.0;
      }
    }
  }
}

/// Whether pass `pass` has matrix slots for tensor t (which then has matrices): the caller
/// of fo_rc_matrix_partials runs it for matrices 0 .. fo_rc_matrices(L, t) - 1.
FO_FN bool fo_rc_matrix_pass(const fo_launch& L, int pass, long long t) {
  const long long* o = L.rc_offsets;
  bool matrix_slots = false;
  for (int m = 0; m < FO_NUM_MATRIX_SLOTS; ++m) matrix_slots |= fo_matrix_slot_pass(m) == pass;
  return matrix_slots && o[3 * t + 5] - o[3 * t + 2] > 0;
}
FO_FN long long fo_rc_matrices(const fo_launch& L, long long t) {
  return L.rc_offsets[3 * t + 5] - L.rc_offsets[3 * t + 2];
}

/// This caller's part of matrix b of tensor t's matrix sums of pass `pass` (after its
/// column means: fo_rc_col_means): rows and columns first, first + stride, ... (the host:
/// all; a CUDA block: one per thread), each slot's sum into sums[slot].
FO_FN void fo_rc_matrix_partials(const fo_launch& L, int pass, long long t, long long b,
                                 double step, float inv_grad_scale, long long first,
                                 long long stride, double* sums) {
  const long long R = fo_rows_of(L, t), C = fo_cols_of(L, t);
  const fo_rcx X0 = fo_rc_base(L, t);
  const bool rows = L.rc_offsets[3 * t + 3] - L.rc_offsets[3 * t] > 0;
  const int group = L.tensor_groups[t];
  const fo_uniform U = fo_prepare(L.hypers + (long long)group * FO_NUM_HYPERS, step, inv_grad_scale,
                                  L.global_totals);
  const fo_tvals T = fo_rc_tvals(L, t, group, step);
  float out[FO_NUM_ROW_STATES + FO_NUM_COL_STATES + 1];
  double m[FO_NUM_MATRIX_SLOTS];
  for (int s = 0; s < FO_NUM_MATRIX_SLOTS; ++s) sums[s] = 0.0;
  fo_rcx X = X0;
  X.mat = X0.mat + b;
  for (long long r = first; r < R && rows; r += stride) {
    X.row = X0.row + b * R + r;
    fo_row_stage(X, U, T, out, m);
    for (int s = 0; s < FO_NUM_MATRIX_SLOTS; ++s) {
      if (fo_matrix_slot_pass(s) == pass && !fo_matrix_slot_col(s)) sums[s] += m[s];
    }
  }
  for (long long cc = first; cc < C; cc += stride) {
    X.col = X0.col + b * C + cc;
    fo_col_stage(X, U, T, out, m);
    for (int s = 0; s < FO_NUM_MATRIX_SLOTS; ++s) {
      if (fo_matrix_slot_pass(s) == pass && fo_matrix_slot_col(s)) sums[s] += m[s];
    }
  }
}

/// Slot s of matrix b of tensor t: its mean from the sum over its rows (or columns).
FO_FN void fo_rc_matrix_store(const fo_launch& L, int pass, long long t, long long b, int s,
                              double sum) {
  if (fo_matrix_slot_pass(s) != pass) return;
  const long long count = fo_matrix_slot_col(s) ? fo_cols_of(L, t) : fo_whole_rows_of(L, t);
  L.matrix_totals[(fo_rc_base(L, t).mat + b) * FO_NUM_MATRIX_SLOTS + s] =
      count > 0 ? sum / count : 0.0;
}

/// Tensor t's row and column states: with `init`, their initial values; else the step's
/// (each row's and column's statements over the values before the step). Runs before the
/// tensor's scalar states are written (the row values read them as the step did). This
/// caller takes rows and columns first, first + stride, ... (the host: all of them; a CUDA
/// block: one per thread): each is independent of the others.
FO_FN void fo_rc_write(const fo_launch& L, long long t, int init, double step, float inv_grad_scale,
                       long long first, long long stride) {
  const long long* o = L.rc_offsets;
  const long long R = fo_rows_of(L, t), C = fo_cols_of(L, t);
  const fo_rcx X0 = fo_rc_base(L, t);
  const long long rows = o[3 * t + 3] - o[3 * t], cols = o[3 * t + 4] - o[3 * t + 1];
  const int group = L.tensor_groups[t];
  const double* h = L.hypers + (long long)group * FO_NUM_HYPERS;
  if (init) {
    float rs0[FO_NUM_ROW_STATES + 1], cs0[FO_NUM_COL_STATES + 1];
    fo_rc_init(h, rs0, cs0);
    for (int k = 0; k < FO_NUM_ROW_STATES; ++k) {
      for (long long r = first; r < rows; r += stride)
        L.row_states[k * X0.nrows + X0.row + r] = rs0[k];
    }
    for (int k = 0; k < FO_NUM_COL_STATES; ++k) {
      for (long long c = first; c < cols; c += stride)
        L.col_states[k * X0.ncols + X0.col + c] = cs0[k];
    }
    return;
  }
  const fo_uniform U = fo_prepare(h, step, inv_grad_scale, L.global_totals);
  const fo_tvals T = fo_rc_tvals(L, t, group, step);
  float out[FO_NUM_ROW_STATES + FO_NUM_COL_STATES + 1];
  double m[FO_NUM_MATRIX_SLOTS];
  fo_rcx X = X0;
  for (long long r = first; r < rows && FO_NUM_ROW_STATES > 0; r += stride) {
    X.row = X0.row + r;
    X.mat = X0.mat + (R > 0 ? r / R : 0);
    fo_row_stage(X, U, T, out, m);
    for (int k = 0; k < FO_NUM_ROW_STATES; ++k) L.row_states[k * X0.nrows + X.row] = out[k];
  }
  for (long long c = first; c < cols && FO_NUM_COL_STATES > 0; c += stride) {
    X.col = X0.col + c;
    X.mat = X0.mat + (C > 0 ? c / C : 0);
    fo_col_stage(X, U, T, out, m);
    for (int k = 0; k < FO_NUM_COL_STATES; ++k) L.col_states[k * X0.ncols + X.col] = out[k];
  }
}

#endif  // FO_FACTORED
