// What the MPI backend does to buffers besides sending them: MPI datatypes for
// Nekton dtypes, element counts that fit MPI's int, and the f32 staging of
// 16-bit reductions (MPI has no bf16: widen, reduce in f32, round once).
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

#include "core/tensor.h"

namespace nk::dist::mpi {

// The MPI type of one element: FLOAT, DOUBLE, INT32_T, INT64_T, UINT8_T, and
// UINT16_T for bf16/f16 (moved as bits, never reduced as such).
MPI_Datatype element_type(DType t);
// MPI counts are int: throws nk::Error "<where>: N elements ..." past INT_MAX.
int mpi_count(int64_t n, const std::string& where);

bool is_16bit(DType t);
// dst[0, n) = x's n 16-bit elements as f32.
void widen(const Tensor& x, float* dst);
// x = src / divisor, rounded once to x's 16-bit dtype (divisor 1: a sum or max).
void narrow(const float* src, const Tensor& x, int divisor);
// x /= d, for the sum behind an average (f32 or f64).
void divide(const Tensor& x, int d);

}  // namespace nk::dist::mpi
