// kvtide decode-attention kernels: shared device code.
//
// Owns the value codecs (f16, bf16, f32, fp8 E4M3FN), the device view of kv-sparse's CSR
// blocks, and the one split-K ("flash-decoding") partial-softmax core that every decode
// kernel family instantiates (SWAN §3 hybrid cache: sparse history + dense buffer under one
// softmax; WnW §2.3 gathered attention over resident positions).
//
// Work decomposition (the Rust launcher in attn-kernels/src/cuda mirrors it exactly):
//   grid  = (n_splits, n_kv_heads), block = KV_WARPS warps.
//   A block owns rows [blockIdx.x * rows_per_split, +rows_per_split) of one kv-head's row
//   sequence (sparse rows first, then dense rows: token order). Its warps take tiles of
//   KV_TILE rows round-robin; lane i of a warp owns row i of the tile (thread per row) for
//   the scores and for the sparse value scatter, and owns dims {lane + 32 m} for the dense
//   value accumulation. Every warp keeps its own running max / sum per q-head and writes one
//   partial (m, l, acc[d]) — "part" = blockIdx.x * KV_WARPS + warp. combine.cu merges parts.
//   One pass over a kv-head's rows serves up to KV_MAX_G q-heads of its GQA group.
#pragma once

#ifdef __CUDACC_RTC__
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
#else
#include <stdint.h>
typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;
#endif

#define KV_WARPS 4
#define KV_TILE 32
#define KV_MAX_G 8
#define KV_MAX_DPL 8 /* dims per lane: head_dim <= 256 */
#define KV_NEG_INF (__int_as_float(0xff800000u))

// ---------------------------------------------------------------- layouts (mirrored in Rust)

// The CSR rows of all kv-heads of one layer, as kv-sparse stores them (blocks uploaded as-is).
// Head h's row r starts at
//   head_nnz[h] + block_base[h * (n_blocks + 1) + r / rows_per_block] + offsets[h * rows + r]
// and ends where row r + 1 starts; block_base[h * (n_blocks + 1) + n_blocks] is the head's nnz.
struct CsrHeads {
  const void* indices;     // u8 or u16 [total nnz]
  const void* values;      // value type [total nnz]
  const u16* offsets;      // [n_kv][rows], relative to the row's block
  const u64* block_base;   // [n_kv][n_blocks + 1], relative to the head
  const u64* head_nnz;     // [n_kv], absolute
  u32 rows;                // rows per head
  u32 rows_per_block;
  u32 n_blocks;            // blocks per head
  float value_scale;       // decoded values are multiplied by this (fp8 scaling; else 1)
};

// Dense rows. Plain: rows [n_kv][n_rows][d], pos == 0. Gathered: rows is an arena
// [n_kv][capacity][d] and head h reads arena rows pos[pos_off[h] .. pos_off[h + 1]].
struct DenseHeads {
  const void* rows;
  const u32* pos;
  const u32* pos_off;      // [n_kv + 1]
  u32 n_rows;
  u32 capacity;
};

struct DecodeArgs {
  const float* q;          // [n_q][d], rotated query of every q-head of the layer
  float* part_acc;         // [n_q][n_parts][d]
  float* part_ml;          // [n_q][n_parts][2]: running max, running sum
  float* scores;           // optional [n_q][max_rows]: scaled logits (gathered anchor weights)
  u32 d;
  u32 group;               // q-heads per kv-head
  u32 g0;                  // first q-head of the group served by this launch
  u32 gc;                  // q-heads served by this launch (<= KV_MAX_G)
  u32 rows_per_split;      // multiple of KV_TILE
  u32 n_parts;             // gridDim.x * KV_WARPS
  float scale;             // softmax scale (1/sqrt(d) by default)
  u32 max_rows;            // row stride of `scores`
};

// ---------------------------------------------------------------- value codecs

__device__ __forceinline__ float f16_bits_to_f32(u16 b) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(b));
  return f;
}

// OCP E4M3FN: bias 7, no infinities, S.1111.111 is NaN.
__device__ __forceinline__ float fp8_bits_to_f32(u8 b) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 890)
  u32 h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"((u16)b));
  return f16_bits_to_f32((u16)(h2 & 0xffffu));
#else
  // Re-bias the exponent into an f32 (subnormal E4M3 lands on subnormal f32, exact), then
  // scale by 2^120 = 2^(127 - 7). Exact for every code; NaN handled explicitly.
  if ((b & 0x7fu) == 0x7fu) return __int_as_float(0x7fc00000);
  u32 bits = ((u32)(b & 0x7fu) << 20) | ((u32)(b & 0x80u) << 24);
  return __int_as_float((int)bits) * 1.329227995784916e36f; /* 2^120 */
#endif
}

struct F32 {
  typedef float raw;
  static __device__ __forceinline__ float get(raw x) { return x; }
  enum { PER16 = 4 };
  static __device__ __forceinline__ void unpack16(uint4 w, float* o) {
    o[0] = __uint_as_float(w.x); o[1] = __uint_as_float(w.y);
    o[2] = __uint_as_float(w.z); o[3] = __uint_as_float(w.w);
  }
};

struct F16 {
  typedef u16 raw;
  static __device__ __forceinline__ float get(raw x) { return f16_bits_to_f32(x); }
  enum { PER16 = 8 };
  static __device__ __forceinline__ void unpack16(uint4 w, float* o) {
    const u32 v[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      o[2 * i] = f16_bits_to_f32((u16)(v[i] & 0xffffu));
      o[2 * i + 1] = f16_bits_to_f32((u16)(v[i] >> 16));
    }
  }
};

struct BF16 {
  typedef u16 raw;
  static __device__ __forceinline__ float get(raw x) { return __uint_as_float((u32)x << 16); }
  enum { PER16 = 8 };
  static __device__ __forceinline__ void unpack16(uint4 w, float* o) {
    const u32 v[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      o[2 * i] = __uint_as_float(v[i] << 16);
      o[2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
    }
  }
};

struct FP8 {
  typedef u8 raw;
  static __device__ __forceinline__ float get(raw x) { return fp8_bits_to_f32(x); }
};

struct U8 { typedef u8 raw; };
struct U16 { typedef u16 raw; };

// ---------------------------------------------------------------- warp helpers

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// ---------------------------------------------------------------- CSR rows

__device__ __forceinline__ u64 csr_row_start(const CsrHeads& c, u32 h, u32 r) {
  if (r >= c.rows) return c.head_nnz[h] + c.block_base[(u64)h * (c.n_blocks + 1) + c.n_blocks];
  return c.head_nnz[h] + c.block_base[(u64)h * (c.n_blocks + 1) + r / c.rows_per_block] +
         c.offsets[(u64)h * c.rows + r];
}

// s[g] += (q_g . row) over the row's stored entries, q gathered from shared memory by index.
template <class KV, class IX>
__device__ __forceinline__ void sparse_dot(const CsrHeads& c, u32 h, u32 r, const float* q_s,
                                           u32 d, u32 gc, float* s) {
  const typename IX::raw* idx = (const typename IX::raw*)c.indices;
  const typename KV::raw* val = (const typename KV::raw*)c.values;
  const u64 e1 = csr_row_start(c, h, r + 1);
  float t[KV_MAX_G];
#pragma unroll
  for (int g = 0; g < KV_MAX_G; ++g) t[g] = 0.f;
  for (u64 e = csr_row_start(c, h, r); e < e1; ++e) {
    const u32 i = (u32)idx[e];
    const float v = KV::get(val[e]);
    if (i >= d) continue;  // corrupt index: the host validates; never read outside q_s
#pragma unroll
    for (int g = 0; g < KV_MAX_G; ++g)
      if (g < (int)gc) t[g] = fmaf(q_s[g * d + i], v, t[g]);
  }
#pragma unroll
  for (int g = 0; g < KV_MAX_G; ++g) s[g] = t[g] * c.value_scale;
}

// acc_s[g][idx] += p[g] * value, scattered with shared-memory atomics (rows of one warp may
// share indices).
template <class KV, class IX>
__device__ __forceinline__ void sparse_scatter(const CsrHeads& c, u32 h, u32 r, const float* p,
                                               float* acc_s, u32 d, u32 gc) {
  const typename IX::raw* idx = (const typename IX::raw*)c.indices;
  const typename KV::raw* val = (const typename KV::raw*)c.values;
  const u64 e1 = csr_row_start(c, h, r + 1);
  for (u64 e = csr_row_start(c, h, r); e < e1; ++e) {
    const u32 i = (u32)idx[e];
    const float v = KV::get(val[e]) * c.value_scale;
    if (i >= d) continue;
#pragma unroll
    for (int g = 0; g < KV_MAX_G; ++g)
      if (g < (int)gc) atomicAdd(&acc_s[g * d + i], p[g] * v);
  }
}

// ---------------------------------------------------------------- dense rows

template <bool GATHER>
__device__ __forceinline__ u64 dense_row_index(const DenseHeads& b, u32 h, u32 r) {
  if (GATHER) return (u64)h * b.capacity + b.pos[b.pos_off[h] + r];
  return (u64)h * b.n_rows + r;
}

template <bool GATHER>
__device__ __forceinline__ u32 dense_rows_of(const DenseHeads& b, u32 h) {
  if (GATHER) return b.pos_off[h + 1] - b.pos_off[h];
  return b.n_rows;
}

// s[g] = q_g . row, with 16-byte loads when the row length allows.
template <class T>
__device__ __forceinline__ void dense_dot(const typename T::raw* row, const float* q_s, u32 d,
                                          u32 gc, float* s) {
  float t[KV_MAX_G];
#pragma unroll
  for (int g = 0; g < KV_MAX_G; ++g) t[g] = 0.f;
  if (d % T::PER16 == 0) {
    const uint4* w = (const uint4*)row;
    for (u32 c = 0; c < d; c += T::PER16) {
      float x[T::PER16];
      T::unpack16(__ldg(w + c / T::PER16), x);
#pragma unroll
      for (int g = 0; g < KV_MAX_G; ++g) {
        if (g < (int)gc) {
          const float* qq = q_s + g * d + c;
#pragma unroll
          for (int j = 0; j < T::PER16; ++j) t[g] = fmaf(qq[j], x[j], t[g]);
        }
      }
    }
  } else {
    for (u32 c = 0; c < d; ++c) {
      const float x = T::get(row[c]);
#pragma unroll
      for (int g = 0; g < KV_MAX_G; ++g)
        if (g < (int)gc) t[g] = fmaf(q_s[g * d + c], x, t[g]);
    }
  }
#pragma unroll
  for (int g = 0; g < KV_MAX_G; ++g) s[g] = t[g];
}

// ---------------------------------------------------------------- the split-K core

struct WarpState {
  float m[KV_MAX_G];                  // running max (warp-uniform)
  float l[KV_MAX_G];                  // this lane's share of the running sum
  float acc[KV_MAX_G][KV_MAX_DPL];    // dense-value accumulator, dims lane + 32 m
};

template <bool SPARSE, bool DENSE>
__device__ __forceinline__ void state_rescale(WarpState& st, const float* alpha, float* acc_s,
                                              u32 d, u32 gc, u32 lane) {
#pragma unroll
  for (int g = 0; g < KV_MAX_G; ++g) {
    if (g < (int)gc && alpha[g] != 1.f) {
      if (DENSE)
#pragma unroll
        for (int m = 0; m < KV_MAX_DPL; ++m) st.acc[g][m] *= alpha[g];
      if (SPARSE)
        for (u32 c = lane; c < d; c += 32) acc_s[g * d + c] *= alpha[g];
    }
  }
}

// Softmax bookkeeping for one tile: new running max, rescale factors, p = exp(s - m).
__device__ __forceinline__ void tile_softmax(WarpState& st, float* s, bool valid, float* alpha,
                                             float* p, float* p_s, u32 gc, u32 lane) {
#pragma unroll
  for (int g = 0; g < KV_MAX_G; ++g) {
    if (g >= (int)gc) { alpha[g] = 1.f; p[g] = 0.f; continue; }
    const float mt = warp_max(valid ? s[g] : KV_NEG_INF);
    const float mn = fmaxf(st.m[g], mt);
    if (mn == KV_NEG_INF) { alpha[g] = 1.f; p[g] = 0.f; p_s[g * KV_TILE + lane] = 0.f; continue; }
    alpha[g] = expf(st.m[g] - mn);
    p[g] = valid ? expf(s[g] - mn) : 0.f;
    st.l[g] = st.l[g] * alpha[g] + p[g];
    st.m[g] = mn;
    p_s[g * KV_TILE + lane] = p[g];
  }
}

// acc[g][lane + 32 m] += p[g][j] * v_j for every dense row j of the tile.
template <class BUF, bool GATHER>
__device__ __forceinline__ void dense_values(WarpState& st, const DenseHeads& vd, u32 h,
                                             u32 t0, u32 end, u32 S, const float* p_s, u32 d,
                                             u32 gc, u32 lane) {
  const typename BUF::raw* base = (const typename BUF::raw*)vd.rows;
  for (u32 j = 0; j < KV_TILE && t0 + j < end; ++j) {
    if (t0 + j < S) continue;
    const typename BUF::raw* row = base + dense_row_index<GATHER>(vd, h, t0 + j - S) * d;
    float x[KV_MAX_DPL];
#pragma unroll
    for (int m = 0; m < KV_MAX_DPL; ++m) {
      const u32 c = lane + 32u * m;
      x[m] = c < d ? BUF::get(row[c]) : 0.f;
    }
#pragma unroll
    for (int g = 0; g < KV_MAX_G; ++g) {
      if (g < (int)gc) {
        const float pj = p_s[g * KV_TILE + j];
#pragma unroll
        for (int m = 0; m < KV_MAX_DPL; ++m) st.acc[g][m] = fmaf(pj, x[m], st.acc[g][m]);
      }
    }
  }
}

// Write this warp's partial (m, l, acc) for every q-head it served.
template <bool SPARSE, bool DENSE>
__device__ __forceinline__ void write_partial(const WarpState& st, const float* acc_s,
                                              const DecodeArgs& a, u32 h, u32 part, u32 lane) {
#pragma unroll
  for (int g = 0; g < KV_MAX_G; ++g) {
    if (g >= (int)a.gc) continue;
    const u64 qh = (u64)h * a.group + a.g0 + g;
    const float l = warp_sum(st.l[g]);
    float* out = a.part_acc + (qh * a.n_parts + part) * a.d;
#pragma unroll
    for (int m = 0; m < KV_MAX_DPL; ++m) {
      const u32 c = lane + 32u * m;
      if (c < a.d) out[c] = (DENSE ? st.acc[g][m] : 0.f) + (SPARSE ? acc_s[g * a.d + c] : 0.f);
    }
    if (lane == 0) {
      a.part_ml[(qh * a.n_parts + part) * 2] = st.m[g];
      a.part_ml[(qh * a.n_parts + part) * 2 + 1] = l;
    }
  }
}

template <bool SPARSE>
__device__ __forceinline__ bool is_sparse_row(u32 r, u32 S) {
  if (SPARSE) return r < S;
  return false;
}

// ---------------------------------------------------------------- row sources
//
// decode_core reads rows only through two row sources, so a new storage format is a new
// source, not a new core. A sparse source SP provides
//   typedef Heads;                    its parameter block
//   rows(heads)                       rows per head
//   dot(ks, h, r, q_s, d, gc, s)      s[g] = q_g . key row r (one lane, one row)
//   scatter(vs, h, r, p, acc_s, d, gc) acc_s[g][i] += p[g] * value row r (shared atomics)
// and a dense source DN provides
//   typedef Heads; rows_of(heads, h); dot(kd, h, r, q_s, d, gc, s)  as above, and
//   values(st, vd, h, t0, end, S, p_s, d, gc, lane)  the warp-cooperative value pass.

// kv-sparse CSR rows (SWAN §3): values of type KV, indices of type IX.
template <class KV, class IX>
struct CsrRows {
  typedef CsrHeads Heads;
  static __device__ __forceinline__ u32 rows(const CsrHeads& c) { return c.rows; }
  static __device__ __forceinline__ void dot(const CsrHeads& c, u32 h, u32 r, const float* q_s,
                                             u32 d, u32 gc, float* s) {
    sparse_dot<KV, IX>(c, h, r, q_s, d, gc, s);
  }
  static __device__ __forceinline__ void scatter(const CsrHeads& c, u32 h, u32 r, const float* p,
                                                 float* acc_s, u32 d, u32 gc) {
    sparse_scatter<KV, IX>(c, h, r, p, acc_s, d, gc);
  }
};

// Plain dense rows of type BUF, direct or gathered through position lists.
template <class BUF, bool GATHER>
struct PlainRows {
  typedef DenseHeads Heads;
  static __device__ __forceinline__ u32 rows_of(const DenseHeads& b, u32 h) {
    return dense_rows_of<GATHER>(b, h);
  }
  static __device__ __forceinline__ void dot(const DenseHeads& kd, u32 h, u32 r,
                                             const float* q_s, u32 d, u32 gc, float* s) {
    const typename BUF::raw* row =
        (const typename BUF::raw*)kd.rows + dense_row_index<GATHER>(kd, h, r) * d;
    dense_dot<BUF>(row, q_s, d, gc, s);
  }
  static __device__ __forceinline__ void values(WarpState& st, const DenseHeads& vd, u32 h,
                                                u32 t0, u32 end, u32 S, const float* p_s, u32 d,
                                                u32 gc, u32 lane) {
    dense_values<BUF, GATHER>(st, vd, h, t0, end, S, p_s, d, gc, lane);
  }
};

// Shared memory: q_s [gc][d] for the block, then per warp acc_s [gc][d] and p_s [gc][KV_TILE].
template <class SP, class DN, bool SPARSE, bool DENSE>
__device__ __forceinline__ void decode_core(const typename SP::Heads& ks,
                                            const typename SP::Heads& vs,
                                            const typename DN::Heads& kd,
                                            const typename DN::Heads& vd, const DecodeArgs& a) {
  extern __shared__ float smem[];
  const u32 h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31u;
  const u32 d = a.d, gc = a.gc;
  float* q_s = smem;
  float* acc_s = smem + gc * d + warp * (gc * d + gc * KV_TILE);
  float* p_s = acc_s + gc * d;
  for (u32 i = threadIdx.x; i < gc * d; i += blockDim.x)
    q_s[i] = a.q[((u64)h * a.group + a.g0 + i / d) * d + i % d] * a.scale;
  if (SPARSE)
    for (u32 i = lane; i < gc * d; i += 32) acc_s[i] = 0.f;
  __syncthreads();

  WarpState st;
#pragma unroll
  for (int g = 0; g < KV_MAX_G; ++g) {
    st.m[g] = KV_NEG_INF;
    st.l[g] = 0.f;
#pragma unroll
    for (int m = 0; m < KV_MAX_DPL; ++m) st.acc[g][m] = 0.f;
  }
  const u32 S = SPARSE ? SP::rows(ks) : 0;
  const u32 total = S + (DENSE ? DN::rows_of(kd, h) : 0);
  const u32 begin = blockIdx.x * a.rows_per_split;
  const u32 end = min(total, begin + a.rows_per_split);
  for (u32 t0 = begin + warp * KV_TILE; t0 < end; t0 += KV_WARPS * KV_TILE) {
    const u32 r = t0 + lane;
    const bool valid = r < end;
    float s[KV_MAX_G], alpha[KV_MAX_G], p[KV_MAX_G];
    const bool sparse_row = is_sparse_row<SPARSE>(r, S);
    if (valid && sparse_row) {
      SP::dot(ks, h, r, q_s, d, gc, s);
    } else if (valid && DENSE) {
      DN::dot(kd, h, r - S, q_s, d, gc, s);
    }
    if (valid && a.scores != 0) {
#pragma unroll
      for (int g = 0; g < KV_MAX_G; ++g)
        if (g < (int)gc) a.scores[((u64)h * a.group + a.g0 + g) * a.max_rows + r] = s[g];
    }
    tile_softmax(st, s, valid, alpha, p, p_s, gc, lane);
    state_rescale<SPARSE, DENSE>(st, alpha, acc_s, d, gc, lane);
    __syncwarp();
    if (valid && sparse_row) SP::scatter(vs, h, r, p, acc_s, d, gc);
    if (DENSE && t0 + KV_TILE > S) DN::values(st, vd, h, t0, end, S, p_s, d, gc, lane);
    __syncwarp();
  }
  write_partial<SPARSE, DENSE>(st, acc_s, a, h, blockIdx.x * KV_WARPS + warp, lane);
}

// The CSR / plain-dense instantiation every kernel of dense, sparse, hybrid and gathered uses.
template <class KV, class IX, class BUF, bool SPARSE, bool DENSE, bool GATHER>
__device__ __forceinline__ void decode_partial(const CsrHeads& ks, const CsrHeads& vs,
                                               const DenseHeads& kd, const DenseHeads& vd,
                                               const DecodeArgs& a) {
  decode_core<CsrRows<KV, IX>, PlainRows<BUF, GATHER>, SPARSE, DENSE>(ks, vs, kd, vd, a);
}
