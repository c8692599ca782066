// Flash-decoding combine: merges the per-warp partials (m_p, l_p, acc_p) of one q-head into
// the final attention output o = sum_p e^{m_p - M} acc_p / sum_p e^{m_p - M} l_p and its
// log-sum-exp M + ln(sum). grid = (n_q), block = COMBINE_THREADS, dynamic shared memory =
// n_parts floats. A q-head with no rows (all m_p = -inf) gets o = 0 and lse = -inf.
#include "common.cuh"

#define COMBINE_THREADS 256

__device__ float block_reduce(float x, bool is_max, float* red) {
  const u32 lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  x = is_max ? warp_max(x) : warp_sum(x);
  __syncthreads();
  if (lane == 0) red[warp] = x;
  __syncthreads();
  x = lane < COMBINE_THREADS / 32 ? red[lane] : (is_max ? KV_NEG_INF : 0.f);
  return is_max ? warp_max(x) : warp_sum(x);
}

extern "C" __global__ void __launch_bounds__(COMBINE_THREADS)
    combine_partials_f32(const float* part_acc, const float* part_ml, float* out, float* lse,
                         u32 n_parts, u32 d) {
  extern __shared__ float w_s[];
  __shared__ float red[COMBINE_THREADS / 32];
  const u64 qh = blockIdx.x;
  const float* ml = part_ml + qh * n_parts * 2;
  float m = KV_NEG_INF;
  for (u32 p = threadIdx.x; p < n_parts; p += blockDim.x) m = fmaxf(m, ml[2 * p]);
  m = block_reduce(m, true, red);
  float l = 0.f;
  for (u32 p = threadIdx.x; p < n_parts; p += blockDim.x) {
    const float w = m == KV_NEG_INF ? 0.f : expf(ml[2 * p] - m);
    w_s[p] = w;
    l += w * ml[2 * p + 1];
  }
  l = block_reduce(l, false, red);
  __syncthreads();
  const float inv = l > 0.f ? 1.f / l : 0.f;
  const float* acc = part_acc + qh * n_parts * d;
  for (u32 c = threadIdx.x; c < d; c += blockDim.x) {
    float o = 0.f;
    for (u32 p = 0; p < n_parts; ++p) o = fmaf(w_s[p], acc[(u64)p * d + c], o);
    out[qh * d + c] = o * inv;
  }
  if (threadIdx.x == 0) lse[qh] = l > 0.f ? m + logf(l) : KV_NEG_INF;
}
