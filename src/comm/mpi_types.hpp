// MPI's view of fusedopt's element types and reductions, shared by the MPI transport and
// its shared-memory engine: fp16 and bf16 travel as 2-byte elements reduced by our own
// MPI_Ops (widened to fp32, rounded once); a max propagates NaN. Only with MPI.
#pragma once

#include <mpi.h>

#include <string>

#include "backend.hpp"

namespace fusedopt::comm::detail {

/// MPI's text for error `code`.
std::string mpi_error_text(int code);
/// The MPI type of `d` (fp64 when `f64`).
MPI_Datatype mpi_type(DType d, bool f64);
/// The MPI op of `op` over `d` (fp64 when `f64`).
MPI_Op mpi_op(DType d, bool f64, ReduceOp op);
/// Whether MPI_Finalize has run.
bool mpi_finalized();

}  // namespace fusedopt::comm::detail
