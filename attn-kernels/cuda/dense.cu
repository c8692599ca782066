// Dense decode attention (the f16/bf16/f32 baseline SWAN is measured against): split-K
// partials over a kv-head's dense K/V rows [n_kv][n_rows][d]; combine.cu finishes the softmax.
// Kernel names carry the storage dtype. Layout and decomposition: common.cuh.
#include "common.cuh"

#define DENSE_DECODE(NAME, T)                                                                \
  extern "C" __global__ void __launch_bounds__(KV_WARPS * 32)                               \
      dense_decode_##NAME(DenseHeads kd, DenseHeads vd, DecodeArgs a) {                     \
    const CsrHeads none = {};                                                                \
    decode_partial<F16, U8, T, false, true, false>(none, none, kd, vd, a);                   \
  }

DENSE_DECODE(f16, F16)
DENSE_DECODE(bf16, BF16)
DENSE_DECODE(f32, F32)
