/* Entry-loop floor of the sparse decode kernels on this CPU (results/bench-attn/README.md).
 *
 * One tile of 32 CSR rows x 64 entries (u8 indices into d = 128, fp8 codes), everything in
 * L1, each variant timed as the best of 60 rounds of 1000 passes (rounds interleave the
 * variants): the score pass (s_r = sum_j qt[idx_j] * val_j over
 * 4 query lanes) and the value pass (acc[idx_j] += p_r * val_j) written several ways. The
 * variants named "kernel" are the instruction mix of attn-kernels' AVX2 path
 * (attn-kernels/src/cpu/avx2.rs: row_score / row_scatter): eight u8 indices per 64-bit load,
 * each fp8 code looked up in a 256-entry table, the 4 lanes of a GQA group in one 128-bit FMA.
 *
 *   gcc -O2 -march=native floor.c -o floor && ./floor
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ROWS 32
#define K 64
#define D 128
static uint8_t idx[ROWS * K], code[ROWS * K];
static float val[ROWS * K];
static float qt[256 * 4] __attribute__((aligned(64)));  /* [dim][lane] */
static float qh[4 * 256] __attribute__((aligned(64)));  /* [lane][dim] */
static float acc[256 * 4] __attribute__((aligned(64))); /* [dim][lane] */
static float tab[256], s[ROWS * 4];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* fp8 E4M3FN -> f32, eight at a time (as avx2.rs fp8x8). */
static inline __m256 fp8x8(__m128i v) {
    __m256i b = _mm256_cvtepu8_epi32(v);
    __m256i mag = _mm256_and_si256(b, _mm256_set1_epi32(0x7f));
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
    __m256 x = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(mag, 20)), _mm256_set1_ps(0x1p120f));
    __m256i nan = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7f));
    return _mm256_or_ps(_mm256_or_ps(x, _mm256_castsi256_ps(nan)), _mm256_castsi256_ps(sign));
}

/* The same decode without denormal arithmetic: the 7 magnitude bits placed into an f16
 * (exponent bias 15 instead of 7), widened by vcvtph2ps and scaled by 2^8, so fp8
 * subnormals (codes with a zero exponent) never reach the multiplier as f32 denormals. */
static inline __m256 fp8x8_via_f16(__m128i v) {
    __m128i b = _mm_cvtepu8_epi16(v);
    __m128i mag = _mm_and_si128(b, _mm_set1_epi16(0x7f));
    __m128i h = _mm_or_si128(_mm_slli_epi16(mag, 7), _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8));
    __m256 x = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
    __m256i nan = _mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f)));
    return _mm256_or_ps(x, _mm256_castsi256_ps(nan));
}

#define BYTE(w, u) (((w) >> (8 * (u))) & 0xff)
#define LANE(v, u) _mm_permute_ps(v, (u) * 0x55)

/* The score loop shared by the variants below that differ only in where entry u of the
 * current 8 (at j + u) gets its value from; `cx` holds the 8 codes of one 64-bit load. A
 * variant that does not read `cp`, `vp` or `cx` compiles without them. */
#define SCORE_VARIANT(name, value)                                                               \
    __attribute__((noinline)) static void name(void) {                                           \
        for (int r = 0; r < ROWS; r++) {                                                         \
            __m128 a[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()}; \
            const uint8_t *ip = idx + r * K, *cp = code + r * K;                                 \
            const float *vp = val + r * K;                                                       \
            (void)cp;                                                                            \
            (void)vp;                                                                            \
            for (int j = 0; j < K; j += 8) {                                                     \
                uint64_t ix, cx;                                                                 \
                memcpy(&ix, ip + j, 8);                                                          \
                memcpy(&cx, cp + j, 8);                                                          \
                _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++)                              \
                    a[u & 3] = _mm_fmadd_ps(_mm_load_ps(qt + 4 * BYTE(ix, u)), (value), a[u & 3]); \
            }                                                                                    \
            _mm_storeu_ps(s + 4 * r, _mm_add_ps(_mm_add_ps(a[0], a[1]), _mm_add_ps(a[2], a[3]))); \
        }                                                                                        \
    }

/* kernel: u64 index load, code byte + table broadcast, FMA with the query row as operand. */
SCORE_VARIANT(score_kernel, _mm_broadcast_ss(tab + cp[j + u]))
/* values already f32: one load fewer per entry than the table. */
SCORE_VARIANT(score_f32, _mm_broadcast_ss(vp + j + u))
/* codes also read eight per 64-bit load and peeled off by shifts (ALU instead of loads). */
SCORE_VARIANT(score_codes_u64, _mm_broadcast_ss(tab + BYTE(cx, u)))

/* values decoded eight at a time in registers, each broadcast by an in-register shuffle. */
__attribute__((noinline)) static void score_reg_decode(void) {
    for (int r = 0; r < ROWS; r++) {
        __m128 a[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
        const uint8_t *ip = idx + r * K, *cp = code + r * K;
        for (int j = 0; j < K; j += 8) {
            uint64_t ix;
            memcpy(&ix, ip + j, 8);
            __m256 v = fp8x8(_mm_loadl_epi64((const __m128i *)(cp + j)));
            __m128 h[2] = {_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)};
            a[0] = _mm_fmadd_ps(_mm_load_ps(qt + 4 * BYTE(ix, 0)), LANE(h[0], 0), a[0]);
            a[1] = _mm_fmadd_ps(_mm_load_ps(qt + 4 * BYTE(ix, 1)), LANE(h[0], 1), a[1]);
            a[2] = _mm_fmadd_ps(_mm_load_ps(qt + 4 * BYTE(ix, 2)), LANE(h[0], 2), a[2]);
            a[3] = _mm_fmadd_ps(_mm_load_ps(qt + 4 * BYTE(ix, 3)), LANE(h[0], 3), a[3]);
            a[0] = _mm_fmadd_ps(_mm_load_ps(qt + 4 * BYTE(ix, 4)), LANE(h[1], 0), a[0]);
            a[1] = _mm_fmadd_ps(_mm_load_ps(qt + 4 * BYTE(ix, 5)), LANE(h[1], 1), a[1]);
            a[2] = _mm_fmadd_ps(_mm_load_ps(qt + 4 * BYTE(ix, 6)), LANE(h[1], 2), a[2]);
            a[3] = _mm_fmadd_ps(_mm_load_ps(qt + 4 * BYTE(ix, 7)), LANE(h[1], 3), a[3]);
        }
        _mm_storeu_ps(s + 4 * r, _mm_add_ps(_mm_add_ps(a[0], a[1]), _mm_add_ps(a[2], a[3])));
    }
}

/* two rows per 256-bit FMA (lanes 0-3 row r, 4-7 row r+1), f32 values. */
__attribute__((noinline)) static void score_row_pairs(void) {
    for (int r = 0; r < ROWS; r += 2) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;
        const uint8_t *ip = idx + r * K, *iq = ip + K;
        const float *vp = val + r * K, *vq = vp + K;
        for (int j = 0; j < K; j += 2) {
            __m256 q0 = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_load_ps(qt + 4 * ip[j])), _mm_load_ps(qt + 4 * iq[j]), 1);
            __m256 v0 = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_broadcast_ss(vp + j)), _mm_broadcast_ss(vq + j), 1);
            a0 = _mm256_fmadd_ps(q0, v0, a0);
            __m256 q1 = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_load_ps(qt + 4 * ip[j + 1])), _mm_load_ps(qt + 4 * iq[j + 1]), 1);
            __m256 v1 = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_broadcast_ss(vp + j + 1)), _mm_broadcast_ss(vq + j + 1), 1);
            a1 = _mm256_fmadd_ps(q1, v1, a1);
        }
        _mm256_storeu_ps(s + 4 * r, _mm256_add_ps(a0, a1));
    }
}

/* AVX2 gathers: per 8 entries one gather per query lane from head-major queries. */
__attribute__((noinline)) static void score_gather(void) {
    for (int r = 0; r < ROWS; r++) {
        __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        const uint8_t *ip = idx + r * K, *cp = code + r * K;
        for (int j = 0; j < K; j += 8) {
            __m256i ix = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(ip + j)));
            __m256 v = fp8x8(_mm_loadl_epi64((const __m128i *)(cp + j)));
            _Pragma("GCC unroll 4") for (int h = 0; h < 4; h++)
                a[h] = _mm256_fmadd_ps(_mm256_i32gather_ps(qh + 256 * h, ix, 4), v, a[h]);
        }
        float o[8];
        for (int h = 0; h < 4; h++) {
            _mm256_storeu_ps(o, a[h]);
            s[4 * r + h] = o[0] + o[1] + o[2] + o[3] + o[4] + o[5] + o[6] + o[7];
        }
    }
}

/* the values of the whole tile decoded to f32 eight at a time (what score_f32 and
 * scatter_f32 would read after such a pass). */
static float decoded[ROWS * K] __attribute__((aligned(64)));
__attribute__((noinline)) static void decode_tile(void) {
    for (int j = 0; j < ROWS * K; j += 8)
        _mm256_store_ps(decoded + j, fp8x8(_mm_loadl_epi64((const __m128i *)(code + j))));
}

__attribute__((noinline)) static void decode_tile_via_f16(void) {
    for (int j = 0; j < ROWS * K; j += 8)
        _mm256_store_ps(decoded + j, fp8x8_via_f16(_mm_loadl_epi64((const __m128i *)(code + j))));
}

#define SCATTER(vexpr)                                                       \
    do {                                                                     \
        float *o = acc + 4 * BYTE(ix, u);                                    \
        _mm_store_ps(o, _mm_fmadd_ps(w, (vexpr), _mm_load_ps(o)));           \
    } while (0)

/* The value loop shared by the variants below; `value` as in SCORE_VARIANT. */
#define SCATTER_VARIANT(name, value)                                                             \
    __attribute__((noinline)) static void name(void) {                                           \
        for (int r = 0; r < ROWS; r++) {                                                         \
            __m128 w = _mm_loadu_ps(s + 4 * r);                                                  \
            const uint8_t *ip = idx + r * K, *cp = code + r * K;                                 \
            const float *vp = val + r * K;                                                       \
            (void)cp;                                                                            \
            (void)vp;                                                                            \
            for (int j = 0; j < K; j += 8) {                                                     \
                uint64_t ix, cx;                                                                 \
                memcpy(&ix, ip + j, 8);                                                          \
                memcpy(&cx, cp + j, 8);                                                          \
                _Pragma("GCC unroll 8") for (int u = 0; u < 8; u++) SCATTER(value);              \
            }                                                                                    \
        }                                                                                        \
    }

/* kernel: read-modify-write of the group's 4 accumulators per entry. */
SCATTER_VARIANT(scatter_kernel, _mm_broadcast_ss(tab + cp[j + u]))
SCATTER_VARIANT(scatter_f32, _mm_broadcast_ss(vp + j + u))
SCATTER_VARIANT(scatter_codes_u64, _mm_broadcast_ss(tab + BYTE(cx, u)))

__attribute__((noinline)) static void scatter_reg_decode(void) {
    for (int r = 0; r < ROWS; r++) {
        __m128 w = _mm_loadu_ps(s + 4 * r);
        const uint8_t *ip = idx + r * K, *cp = code + r * K;
        for (int j = 0; j < K; j += 8) {
            uint64_t ix;
            memcpy(&ix, ip + j, 8);
            __m256 v = fp8x8(_mm_loadl_epi64((const __m128i *)(cp + j)));
            __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
            int u;
            u = 0; SCATTER(LANE(lo, 0));
            u = 1; SCATTER(LANE(lo, 1));
            u = 2; SCATTER(LANE(lo, 2));
            u = 3; SCATTER(LANE(lo, 3));
            u = 4; SCATTER(LANE(hi, 0));
            u = 5; SCATTER(LANE(hi, 1));
            u = 6; SCATTER(LANE(hi, 2));
            u = 7; SCATTER(LANE(hi, 3));
        }
    }
}

/* Seconds per entry of `passes` calls of f. */
static double time_once(void (*f)(void), int passes) {
    double a = now();
    for (int i = 0; i < passes; i++) f();
    return (now() - a) / passes / (ROWS * K) * 1e9;
}

int main(void) {
    srand(1);
    for (int r = 0; r < ROWS; r++) {
        int perm[D];
        for (int i = 0; i < D; i++) perm[i] = i;
        for (int i = 0; i < K; i++) { /* k distinct indices per row */
            int j = i + rand() % (D - i), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
            idx[r * K + i] = (uint8_t)perm[i];
            code[r * K + i] = (uint8_t)(rand() % 0x70);
            val[r * K + i] = (rand() % 100) / 50.f - 1;
        }
    }
    for (int i = 0; i < 1024; i++) qt[i] = qh[i] = (rand() % 100) / 100.f;
    for (int i = 0; i < 256; i++) tab[i] = i * 0.01f;
    for (int i = 0; i < ROWS * 4; i++) s[i] = 1e-3f;
    struct { const char *name; void (*f)(void); } v[] = {
        {"score_kernel", score_kernel},         {"score_f32", score_f32},
        {"score_codes_u64", score_codes_u64},   {"score_reg_decode", score_reg_decode},
        {"score_row_pairs", score_row_pairs},   {"score_gather", score_gather},
        {"scatter_kernel", scatter_kernel},     {"scatter_f32", scatter_f32},
        {"scatter_codes_u64", scatter_codes_u64}, {"scatter_reg_decode", scatter_reg_decode},
        {"decode_tile", decode_tile},           {"decode_tile_via_f16", decode_tile_via_f16},
    };
    for (int c = 0; c < 256; c++) { /* both decodes agree on every code (NaN as NaN) */
        __m128i v = _mm_set1_epi8((char)c);
        float a[8], b[8];
        _mm256_storeu_ps(a, fp8x8(v));
        _mm256_storeu_ps(b, fp8x8_via_f16(v));
        if (memcmp(a, b, 4) != 0 && !(a[0] != a[0] && b[0] != b[0])) {
            printf("decode mismatch at code %d: %g vs %g\n", c, a[0], b[0]);
            return 1;
        }
    }
    /* Rounds visit every variant in turn, so a noisy spell of the machine hits them all
     * alike; each figure is the best round. */
    enum { N = sizeof v / sizeof v[0] };
    double best[N];
    for (unsigned i = 0; i < N; i++) best[i] = 1e9;
    for (int round = 0; round < 60; round++)
        for (unsigned i = 0; i < N; i++) {
            double t = time_once(v[i].f, 1000);
            if (t < best[i]) best[i] = t;
        }
    for (unsigned i = 0; i < N; i++) printf("%-20s %.3f ns/entry\n", v[i].name, best[i]);
    printf("(checksum %g %g %g)\n", s[0], acc[0], decoded[1]);
    return 0;
}
