// Sparse CSR decode attention (SWAN §3): scores q·k_j gathered from the dense query by the
// row's stored indices, value rows scattered into a d-wide accumulator; no dense row is ever
// materialized. Split-K partials; combine.cu finishes the softmax. Kernel names carry the
// value dtype and the index dtype. Layout and decomposition: common.cuh.
#include "common.cuh"

#define SPARSE_DECODE(VN, V, IN, I)                                                          \
  extern "C" __global__ void __launch_bounds__(KV_WARPS * 32)                               \
      sparse_decode_##VN##_##IN(CsrHeads ks, CsrHeads vs, DecodeArgs a) {                   \
    const DenseHeads none = {};                                                              \
    decode_partial<V, I, F16, true, false, false>(ks, vs, none, none, a);                    \
  }

#define SPARSE_DECODE_VALUES(IN, I) \
  SPARSE_DECODE(f16, F16, IN, I)    \
  SPARSE_DECODE(bf16, BF16, IN, I)  \
  SPARSE_DECODE(fp8, FP8, IN, I)    \
  SPARSE_DECODE(f32, F32, IN, I)

SPARSE_DECODE_VALUES(u8, U8)
SPARSE_DECODE_VALUES(u16, U16)
