// Gathered decode attention (WnW §2.3): each kv-head attends over its own list of resident
// positions inside a device arena [n_kv][capacity][d] (what the tiered store keeps on the GPU).
// With DecodeArgs.scores set, the scaled logits are kept so gathered_weights can return the
// softmax weights at every resident position, summed over the q-heads of the group — the
// anchor heads' importance signal. Layout and decomposition: common.cuh.
#include "common.cuh"

#define GATHERED_DECODE(NAME, T)                                                             \
  extern "C" __global__ void __launch_bounds__(KV_WARPS * 32)                               \
      gathered_decode_##NAME(DenseHeads kd, DenseHeads vd, DecodeArgs a) {                  \
    const CsrHeads none = {};                                                                \
    decode_partial<F16, U8, T, false, true, true>(none, none, kd, vd, a);                    \
  }

GATHERED_DECODE(f16, F16)
GATHERED_DECODE(bf16, BF16)
GATHERED_DECODE(f32, F32)

// weights[pos_off[h] + r] = sum over the group's q-heads g of exp(scores[g][r] - lse[g]).
// grid = (ceil(max_rows / blockDim.x), n_kv).
extern "C" __global__ void gathered_weights_f32(const float* scores, const float* lse,
                                                const u32* pos_off, float* weights, u32 group,
                                                u32 max_rows) {
  const u32 h = blockIdx.y;
  const u32 r = blockIdx.x * blockDim.x + threadIdx.x;
  const u32 n = pos_off[h + 1] - pos_off[h];
  if (r >= n) return;
  float w = 0.f;
  for (u32 g = 0; g < group; ++g) {
    const u64 qh = (u64)h * group + g;
    w += expf(scores[qh * max_rows + r] - lse[qh]);
  }
  weights[pos_off[h] + r] = w;
}
