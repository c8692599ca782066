// Hybrid decode attention over SWAN's coded rows (SWAN §3 and the method section's "Memory
// footprint"): the coded sparse history — index list or bitmask, fp8 / int8 / int4 values —
// followed by the dense f16 / bf16 buffer of recent tokens, under ONE softmax. Scores gather
// the query at each row's kept components; value rows scatter into a d-wide accumulator; no
// row is ever densified. Split-K partials; combine.cu merges them.
// Kernel names: coded_decode_<index: u8 | u16 | mask>_<values: fp8 | int8 | int4>_<buffer>.
// Codecs: encoded.cuh; layout and decomposition: common.cuh.
#include "encoded.cuh"

#define CODED_DECODE(XN, XC, VN, VC, BN, B)                                                  \
  extern "C" __global__ void __launch_bounds__(KV_WARPS * 32)                               \
      coded_decode_##XN##_##VN##_##BN(CodedHeads ks, CodedHeads vs, DenseHeads kd,           \
                                      DenseHeads vd, DecodeArgs a) {                         \
    decode_core<CodedRows<XC, VC>, PlainRows<B, false>, true, true>(ks, vs, kd, vd, a);      \
  }

#define CODED_DECODE_VALUES(XN, XC, BN, B)  \
  CODED_DECODE(XN, XC, fp8, CFp8, BN, B)    \
  CODED_DECODE(XN, XC, int8, CInt8, BN, B)  \
  CODED_DECODE(XN, XC, int4, CInt4, BN, B)

#define CODED_DECODE_INDICES(BN, B)                \
  CODED_DECODE_VALUES(u8, ListIndex<U8>, BN, B)    \
  CODED_DECODE_VALUES(u16, ListIndex<U16>, BN, B)  \
  CODED_DECODE_VALUES(mask, MaskIndex, BN, B)

CODED_DECODE_INDICES(f16, F16)
CODED_DECODE_INDICES(bf16, BF16)
