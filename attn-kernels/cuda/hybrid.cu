// Hybrid decode attention (SWAN §3, Algorithm 1): the sparse CSR history followed by the dense
// buffer of recent tokens, both under ONE softmax. A split may straddle the boundary; every
// partial carries its own running max, so the flash-decoding combine (combine.cu) is exact.
// Kernel names: hybrid_decode_<sparse values>_<indices>_<buffer>. Layout: common.cuh.
#include "common.cuh"

#define HYBRID_DECODE(VN, V, IN, I, BN, B)                                                   \
  extern "C" __global__ void __launch_bounds__(KV_WARPS * 32)                               \
      hybrid_decode_##VN##_##IN##_##BN(CsrHeads ks, CsrHeads vs, DenseHeads kd,              \
                                       DenseHeads vd, DecodeArgs a) {                        \
    decode_partial<V, I, B, true, true, false>(ks, vs, kd, vd, a);                           \
  }

// Supported (sparse values, dense buffer) pairs: 16-bit values with the same 16-bit buffer,
// fp8 values with either 16-bit buffer, and f32/f32 (the lossless mode, k = d_h).
#define HYBRID_DECODE_PAIRS(IN, I)                  \
  HYBRID_DECODE(f16, F16, IN, I, f16, F16)          \
  HYBRID_DECODE(bf16, BF16, IN, I, bf16, BF16)      \
  HYBRID_DECODE(fp8, FP8, IN, I, f16, F16)          \
  HYBRID_DECODE(fp8, FP8, IN, I, bf16, BF16)        \
  HYBRID_DECODE(f32, F32, IN, I, f32, F32)

HYBRID_DECODE_PAIRS(u8, U8)
HYBRID_DECODE_PAIRS(u16, U16)
