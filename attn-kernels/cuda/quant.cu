// Dense quantized decode attention: the int8 (q8_0 blocks), int4 (q4_0 blocks) and fp8
// (E4M3 + f16 scale per token) baselines of the SWAN frontier study, attended as stored — each
// lane decodes its key row block by block into the dot product, each warp decodes value rows
// dimension-parallel; no row is ever dequantized to memory. Split-K partials; combine.cu
// finishes the softmax. Kernel names carry the codec. Codecs: encoded.cuh; layout and
// decomposition: common.cuh.
#include "encoded.cuh"

#define QUANT_DECODE(NAME, C)                                                                \
  extern "C" __global__ void __launch_bounds__(KV_WARPS * 32)                               \
      quant_decode_##NAME(DenseHeads kd, DenseHeads vd, DecodeArgs a) {                     \
    const CsrHeads none = {};                                                                \
    decode_core<CsrRows<F16, U8>, QuantRows<C, false>, false, true>(none, none, kd, vd, a);  \
  }

QUANT_DECODE(int8, QInt8)
QUANT_DECODE(int4, QInt4)
QUANT_DECODE(fp8, QFp8)
