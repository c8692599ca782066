// kvtide decode-attention kernels: row sources for the encoded KV formats.
//
// Owns the device side of what kv-sparse stores besides CSR and plain dense rows, as row
// sources of common.cuh's split-K core (decode_core):
//  * QuantRows — dense quantized rows (kv-sparse `quant`): q8_0 int8 blocks, q4_0 int4 blocks
//    and fp8 E4M3 with one f16 scale per token, the dense baselines SWAN is compared with;
//  * CodedRows — SWAN's coded sparse rows (method section, "Memory footprint"; kv-sparse
//    `coded`): an index part (u8 / u16 list, or a d_h-bit mask, components ascending) then a
//    value part (fp8 elements under the per-head scale, or int8 / int4 codes after one f16
//    scale per row), paged like CSR rows, as the history of the hybrid cache (§3).
// The host validates every cache first (attn-kernels/src/cuda/encoded.rs); on top of that a
// lane never reads past its row's k entries, never trusts a mask past d_h and skips any index
// >= d_h, so corrupt bytes cannot reach outside q_s / acc_s. The Rust KernelEmulation mirrors
// each dot product below operation for operation.
#pragma once
#include "common.cuh"

// ---------------------------------------------------------------- layouts (mirrored in Rust)

// Coded rows of all kv-heads: kv-sparse's CodedView bytes, heads concatenated. Head h's row r
// occupies bytes [start(r), start(r + 1)) of `bytes` with
//   start(r) = head_base[h] + block_base[h * (n_blocks + 1) + r / rows_per_block]
//              + offsets[h * rows + r]
// and block_base[h * (n_blocks + 1) + n_blocks] = the head's byte count.
struct CodedHeads {
  const u8* bytes;
  const u16* offsets;      // [n_kv][rows], relative to the row's block
  const u64* block_base;   // [n_kv][n_blocks + 1], relative to the head
  const u64* head_base;    // [n_kv], absolute
  u32 rows;                // rows per head
  u32 rows_per_block;
  u32 n_blocks;            // blocks per head
  float value_scale;       // per-head multiplier of decoded values (1 unless set)
};

// ---------------------------------------------------------------- byte helpers

__device__ __forceinline__ u32 load_u16_bytes(const u8* p) {
  return (u32)__ldg(p) | ((u32)__ldg(p + 1) << 8);
}

// Two E4M3FN codes (low byte = first) to f32, natively on sm_89+.
__device__ __forceinline__ void fp8x2_to_f32(u16 w, float& lo, float& hi) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 890)
  u32 h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(w));
  lo = f16_bits_to_f32((u16)(h2 & 0xffffu));
  hi = f16_bits_to_f32((u16)(h2 >> 16));
#else
  lo = fp8_bits_to_f32((u8)(w & 0xffu));
  hi = fp8_bits_to_f32((u8)(w >> 8));
#endif
}

// ---------------------------------------------------------------- dense quantized codecs
//
// A codec gives row_bytes(d), dot(row, q_s, d, gc, s) (one lane, one row) and get(row, c)
// (element c, decoded exactly: code times f16 scale is exact in f32).

// q8_0: per 32 elements an f16 scale then 32 i8 (34 bytes). Rows and blocks have even sizes,
// so 16-bit loads are aligned. dot = sum over blocks of scale * (sum_j q_j code_j).
struct QInt8 {
  static __device__ __forceinline__ u64 row_bytes(u32 d) { return (u64)(d / 32) * 34; }
  static __device__ __forceinline__ void dot(const u8* row, const float* q_s, u32 d, u32 gc,
                                             float* s) {
    float t[KV_MAX_G];
#pragma unroll
    for (int g = 0; g < KV_MAX_G; ++g) t[g] = 0.f;
    for (u32 b = 0; b < d / 32; ++b) {
      const u16* blk = (const u16*)(row + 34 * b);
      const float sc = f16_bits_to_f32(__ldg(blk));
      float tb[KV_MAX_G];
#pragma unroll
      for (int g = 0; g < KV_MAX_G; ++g) tb[g] = 0.f;
#pragma unroll 4
      for (u32 w = 0; w < 16; ++w) {
        const u32 two = __ldg(blk + 1 + w);
        const float x0 = (float)(signed char)(two & 0xffu);
        const float x1 = (float)(signed char)(two >> 8);
#pragma unroll
        for (int g = 0; g < KV_MAX_G; ++g) {
          if (g < (int)gc) {
            const float* qq = q_s + g * d + 32 * b + 2 * w;
            tb[g] = fmaf(qq[0], x0, tb[g]);
            tb[g] = fmaf(qq[1], x1, tb[g]);
          }
        }
      }
#pragma unroll
      for (int g = 0; g < KV_MAX_G; ++g) t[g] = fmaf(tb[g], sc, t[g]);
    }
#pragma unroll
    for (int g = 0; g < KV_MAX_G; ++g) s[g] = t[g];
  }
  static __device__ __forceinline__ float get(const u8* row, u32 c) {
    const u8* blk = row + 34 * (c >> 5);
    const float sc = f16_bits_to_f32(__ldg((const u16*)blk));
    return (float)(signed char)__ldg(blk + 2 + (c & 31u)) * sc;
  }
};

// q4_0: per 32 elements an f16 scale then 16 bytes; byte j holds element j (low nibble) and
// element j + 16 (high nibble), each stored as q + 8. dot accumulates byte by byte, low then
// high nibble, and scales per block like QInt8.
struct QInt4 {
  static __device__ __forceinline__ u64 row_bytes(u32 d) { return (u64)(d / 32) * 18; }
  static __device__ __forceinline__ void dot(const u8* row, const float* q_s, u32 d, u32 gc,
                                             float* s) {
    float t[KV_MAX_G];
#pragma unroll
    for (int g = 0; g < KV_MAX_G; ++g) t[g] = 0.f;
    for (u32 b = 0; b < d / 32; ++b) {
      const u16* blk = (const u16*)(row + 18 * b);
      const float sc = f16_bits_to_f32(__ldg(blk));
      float tb[KV_MAX_G];
#pragma unroll
      for (int g = 0; g < KV_MAX_G; ++g) tb[g] = 0.f;
#pragma unroll 2
      for (u32 w = 0; w < 8; ++w) {
        const u32 two = __ldg(blk + 1 + w);
#pragma unroll
        for (u32 half = 0; half < 2; ++half) {
          const u32 byte = (two >> (8 * half)) & 0xffu;
          const float lo = (float)((int)(byte & 15u) - 8);
          const float hi = (float)((int)(byte >> 4) - 8);
          const u32 j = 2 * w + half;
#pragma unroll
          for (int g = 0; g < KV_MAX_G; ++g) {
            if (g < (int)gc) {
              const float* qq = q_s + g * d + 32 * b + j;
              tb[g] = fmaf(qq[0], lo, tb[g]);
              tb[g] = fmaf(qq[16], hi, tb[g]);
            }
          }
        }
      }
#pragma unroll
      for (int g = 0; g < KV_MAX_G; ++g) t[g] = fmaf(tb[g], sc, t[g]);
    }
#pragma unroll
    for (int g = 0; g < KV_MAX_G; ++g) s[g] = t[g];
  }
  static __device__ __forceinline__ float get(const u8* row, u32 c) {
    const u8* blk = row + 18 * (c >> 5);
    const u32 j = c & 31u;
    const u32 byte = __ldg(blk + 2 + (j & 15u));
    const u32 code = j < 16 ? (byte & 15u) : (byte >> 4);
    return (float)((int)code - 8) * f16_bits_to_f32(__ldg((const u16*)blk));
  }
};

// fp8 rows: an f16 scale then d E4M3FN codes (2 + d bytes; d may be odd, so the scale is read
// bytewise). dot = scale * (sum_c q_c e4m3_c), codes decoded in pairs when d is even.
struct QFp8 {
  static __device__ __forceinline__ u64 row_bytes(u32 d) { return 2 + (u64)d; }
  static __device__ __forceinline__ void dot(const u8* row, const float* q_s, u32 d, u32 gc,
                                             float* s) {
    float t[KV_MAX_G];
#pragma unroll
    for (int g = 0; g < KV_MAX_G; ++g) t[g] = 0.f;
    const float sc = f16_bits_to_f32((u16)load_u16_bytes(row));
    if ((d & 1u) == 0) {
      const u16* codes = (const u16*)(row + 2);  // even row size: 2-byte aligned
#pragma unroll 4
      for (u32 w = 0; w < d / 2; ++w) {
        float x0, x1;
        fp8x2_to_f32(__ldg(codes + w), x0, x1);
#pragma unroll
        for (int g = 0; g < KV_MAX_G; ++g) {
          if (g < (int)gc) {
            const float* qq = q_s + g * d + 2 * w;
            t[g] = fmaf(qq[0], x0, t[g]);
            t[g] = fmaf(qq[1], x1, t[g]);
          }
        }
      }
    } else {
      for (u32 c = 0; c < d; ++c) {
        const float x = fp8_bits_to_f32(__ldg(row + 2 + c));
#pragma unroll
        for (int g = 0; g < KV_MAX_G; ++g)
          if (g < (int)gc) t[g] = fmaf(q_s[g * d + c], x, t[g]);
      }
    }
#pragma unroll
    for (int g = 0; g < KV_MAX_G; ++g) s[g] = t[g] * sc;
  }
  static __device__ __forceinline__ float get(const u8* row, u32 c) {
    return fp8_bits_to_f32(__ldg(row + 2 + c)) * f16_bits_to_f32((u16)load_u16_bytes(row));
  }
};

// Dense quantized rows [n_kv][n_rows][C::row_bytes(d)] in a DenseHeads block (pos == 0), or an
// arena read through position lists (GATHER).
template <class C, bool GATHER>
struct QuantRows {
  typedef DenseHeads Heads;
  static __device__ __forceinline__ u32 rows_of(const DenseHeads& b, u32 h) {
    return dense_rows_of<GATHER>(b, h);
  }
  static __device__ __forceinline__ const u8* row(const DenseHeads& b, u32 h, u32 r, u32 d) {
    return (const u8*)b.rows + dense_row_index<GATHER>(b, h, r) * C::row_bytes(d);
  }
  static __device__ __forceinline__ void dot(const DenseHeads& kd, u32 h, u32 r,
                                             const float* q_s, u32 d, u32 gc, float* s) {
    C::dot(row(kd, h, r, d), q_s, d, gc, s);
  }
  // acc[g][lane + 32 m] += p[g][j] * v_j for every dense row j of the tile (dense_values).
  static __device__ __forceinline__ void values(WarpState& st, const DenseHeads& vd, u32 h,
                                                u32 t0, u32 end, u32 S, const float* p_s, u32 d,
                                                u32 gc, u32 lane) {
    for (u32 j = 0; j < KV_TILE && t0 + j < end; ++j) {
      if (t0 + j < S) continue;
      const u8* v = row(vd, h, t0 + j - S, d);
      float x[KV_MAX_DPL];
#pragma unroll
      for (int m = 0; m < KV_MAX_DPL; ++m) {
        const u32 c = lane + 32u * m;
        x[m] = c < d ? C::get(v, c) : 0.f;
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
};

// ---------------------------------------------------------------- coded value codecs
//
// k_for(rest, entry) = entries of a row whose bytes after the fixed index part number `rest`
// (list entries of `entry` bytes each; floor division: exact for every row the host accepts,
// and never more entries than the row holds otherwise); code(vals, j) = entry j's code;
// row_scale(vals) = the row's f16 scale (1 for fp8 elements, which use the per-head scale).

struct CFp8 {
  static __device__ __forceinline__ u32 k_for(u32 rest, u32 entry) { return rest / (entry + 1); }
  static __device__ __forceinline__ float code(const u8* vals, u32 j) {
    return fp8_bits_to_f32(__ldg(vals + j));
  }
  static __device__ __forceinline__ float row_scale(const u8*) { return 1.f; }
  enum { SCALE_BYTES = 0 };
};

struct CInt8 {
  static __device__ __forceinline__ u32 k_for(u32 rest, u32 entry) {
    return rest < 2 ? 0 : (rest - 2) / (entry + 1);
  }
  static __device__ __forceinline__ float code(const u8* vals, u32 j) {
    return (float)(signed char)__ldg(vals + 2 + j);
  }
  static __device__ __forceinline__ float row_scale(const u8* vals) {
    return f16_bits_to_f32((u16)load_u16_bytes(vals));
  }
  enum { SCALE_BYTES = 2 };
};

// int4 values: entry 2i in the low nibble of byte i, entry 2i + 1 in its high nibble, q + 8.
struct CInt4 {
  static __device__ __forceinline__ u32 k_for(u32 rest, u32 entry) {
    return rest < 2 ? 0 : 2 * ((rest - 2) / (2 * entry + 1));
  }
  static __device__ __forceinline__ float code(const u8* vals, u32 j) {
    const u32 byte = __ldg(vals + 2 + (j >> 1));
    return (float)((int)((j & 1u) ? (byte >> 4) : (byte & 15u)) - 8);
  }
  static __device__ __forceinline__ float row_scale(const u8* vals) {
    return f16_bits_to_f32((u16)load_u16_bytes(vals));
  }
  enum { SCALE_BYTES = 2 };
};

// ---------------------------------------------------------------- coded index codecs
//
// walk<VC>(row, vals, k, d, f) calls f(i, code_j) for the row's entries j = 0 .. k-1 in
// order, skipping any index >= d.

// u8 / u16 list (IX = U8 / U16), read bytewise: a row starts at any byte.
template <class IX>
struct ListIndex {
  enum { ENTRY = sizeof(typename IX::raw) };
  static __device__ __forceinline__ u32 fixed_bytes(u32) { return 0; }
  template <class VC, class F>
  static __device__ __forceinline__ void walk(const u8* row, const u8* vals, u32 k, u32 d,
                                              F& f) {
    for (u32 j = 0; j < k; ++j) {
      const u32 i = ENTRY == 1 ? (u32)__ldg(row + j) : load_u16_bytes(row + 2 * j);
      const float v = VC::code(vals, j);
      if (i >= d) continue;
      f(i, v);
    }
  }
};

// d-bit mask (bit i % 8 of byte i / 8), components ascending, k = popcount. The lane takes the
// mask 32 bits at a time and peels set bits with ffs; a running count (the popcount prefix of
// the words before) gives each bit its value slot, and the walk stops after k entries.
struct MaskIndex {
  enum { ENTRY = 0 };
  static __device__ __forceinline__ u32 fixed_bytes(u32 d) { return (d + 7) / 8; }
  template <class VC, class F>
  static __device__ __forceinline__ void walk(const u8* row, const u8* vals, u32 k, u32 d,
                                              F& f) {
    const u32 nb = (d + 7) / 8;
    u32 j = 0;
    for (u32 w = 0; w < nb && j < k; w += 4) {
      u32 bits = 0;
      for (u32 b = 0; b < 4 && w + b < nb; ++b) bits |= (u32)__ldg(row + w + b) << (8 * b);
      while (bits != 0 && j < k) {
        const u32 i = 8 * w + (u32)(__ffs((int)bits) - 1);
        bits &= bits - 1;
        const float v = VC::code(vals, j++);
        if (i < d) f(i, v);
      }
    }
  }
};

// ---------------------------------------------------------------- the coded sparse source

__device__ __forceinline__ u64 coded_row_start(const CodedHeads& c, u32 h, u32 r) {
  const u64 hb = (u64)h * (c.n_blocks + 1);
  if (r >= c.rows) return c.head_base[h] + c.block_base[hb + c.n_blocks];
  return c.head_base[h] + c.block_base[hb + r / c.rows_per_block] + c.offsets[(u64)h * c.rows + r];
}

// One row located and sized: its index part, value part, entries and value multiplier
// (row scale times per-head scale).
struct CodedRowRef {
  const u8* row;
  const u8* vals;
  u32 k;
  float factor;
};

template <class XC, class VC>
__device__ __forceinline__ CodedRowRef coded_row(const CodedHeads& c, u32 h, u32 r, u32 d) {
  const u64 e0 = coded_row_start(c, h, r), e1 = coded_row_start(c, h, r + 1);
  // A row lives inside one block (u16 offsets), so a longer extent is corrupt: read nothing.
  const u32 len = (e1 > e0 && e1 - e0 <= 0xffffu) ? (u32)(e1 - e0) : 0;
  const u32 fixed = XC::fixed_bytes(d);
  CodedRowRef x;
  x.row = c.bytes + e0;
  x.k = len < fixed ? 0 : min(VC::k_for(len - fixed, (u32)XC::ENTRY), d);
  x.vals = x.row + fixed + x.k * (u32)XC::ENTRY;
  x.factor = x.k == 0 ? 0.f : VC::row_scale(x.vals) * c.value_scale;
  return x;
}

template <class XC, class VC>
struct CodedRows {
  typedef CodedHeads Heads;
  static __device__ __forceinline__ u32 rows(const CodedHeads& c) { return c.rows; }

  // s[g] = factor * (sum over entries of q_g[i] * code), like sparse_dot.
  static __device__ __forceinline__ void dot(const CodedHeads& c, u32 h, u32 r,
                                             const float* q_s, u32 d, u32 gc, float* s) {
    const CodedRowRef x = coded_row<XC, VC>(c, h, r, d);
    float t[KV_MAX_G];
#pragma unroll
    for (int g = 0; g < KV_MAX_G; ++g) t[g] = 0.f;
    auto f = [&](u32 i, float v) {
#pragma unroll
      for (int g = 0; g < KV_MAX_G; ++g)
        if (g < (int)gc) t[g] = fmaf(q_s[g * d + i], v, t[g]);
    };
    XC::template walk<VC>(x.row, x.vals, x.k, d, f);
#pragma unroll
    for (int g = 0; g < KV_MAX_G; ++g) s[g] = t[g] * x.factor;
  }

  // acc_s[g][i] += p[g] * (code * factor), like sparse_scatter.
  static __device__ __forceinline__ void scatter(const CodedHeads& c, u32 h, u32 r,
                                                 const float* p, float* acc_s, u32 d, u32 gc) {
    const CodedRowRef x = coded_row<XC, VC>(c, h, r, d);
    auto f = [&](u32 i, float v) {
      const float y = v * x.factor;
#pragma unroll
      for (int g = 0; g < KV_MAX_G; ++g)
        if (g < (int)gc) atomicAdd(&acc_s[g * d + i], p[g] * y);
    };
    XC::template walk<VC>(x.row, x.vals, x.k, d, f);
  }
};
