/* Small-batch float32 matrix products for MLX's CPU backend (see small_gemm.py).
 *
 * MLX computes every float32 matmul with `cblas_sgemm`.  Decoding multiplies a
 * few rows of activations (1 for a plain step, 2-32 for a verify pass or a
 * draft tree level) by a large weight matrix.  General GEMM libraries pack the
 * weight into cache-sized panels on every call, which costs more than reading
 * it once; this kernel reads each weight row once, straight from memory, and
 * multiplies it into every activation row at the same time, so a product over
 * a few rows costs about what one row costs.
 *
 * This library exports `cblas_sgemm`.  Loaded (RTLD_GLOBAL) before MLX, it
 * takes the calls it is made for -- row-major, 1..SMALL_M_MAX rows of an
 * untransposed A (weights in the BLAS layout of blas_layout.py, or transposed:
 * attention scores, mlx-lm's layout) -- and forwards
 * every other call to the BLAS named by `mlxspec_gemm_init`.
 *
 * Packed weights (packed_weights.py) arrive marked by their `alpha` (one of
 * the PACKED_* bit patterns, values no real call uses): B is then stored in
 * column blocks -- each block of NB output columns holds its K rows
 * contiguously, so a block streams from memory in one run -- as float32, or as
 * float16 / bfloat16 (weights that are exactly representable there: half the
 * bytes, widened to float32 exactly before each multiply).  The caller passes a
 * 16-bit B as a float32 (K/2, N) matrix, A as (2M, K/2) and C as (2M, N), the
 * same memory; rows M..2M-1 of C are left as they were.  C = product + beta C
 * (the bias, which MLX's addmm has copied into C).  An int8 B (PACKED_I8: a
 * draft's rounded weights) goes to draft_gemm.c, with A as (4M, K/4) and C as
 * (4M, N) holding each column's scale.  The same bytes may come as
 * PACKED_I8_PAIRS: B as (K/2, N/2), A as (2M, K/2) and C, (2M, N/2), the M real
 * rows of N values end to end, holding each column's scale -- the output has
 * no rows to drop, and one row's C can be the scales as stored (draft_weights.py).
 * A 4-bit B (PACKED_I4) goes to draft_gemm4.c, with A as (8M, K/8), B as
 * (K/8, 9N/8) (nibbles and group scales) and beta 0.  Packed calls always
 * come here, whatever `enabled` says; more than SMALL_M_MAX rows (prefill) are
 * computed in chunks of rows.
 *
 * Every output element is the sum over k = 0..K-1, in that order, of one fused
 * multiply-add per term, whatever M, the tiling and the thread split: a row's
 * result does not depend on which other rows share the call ("batch
 * invariance"), so a verify pass scores each position exactly as a plain step
 * would.
 */
#include <dlfcn.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "thread_pool.h"
#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#define HAVE_F16 1
#else
#define HAVE_F16 0
#endif

#define SMALL_M_MAX 32 /* more rows: the packing GEMM's better use of compute wins (packed B: chunks of rows) */
#define NB 64          /* output columns per block (a packed block: its K rows of 64 contiguous) */
#ifdef __AVX512F__ /* 32 registers of 16 floats */
#define MB_ONE_PASS 10 /* most rows per register tile (40 accumulators: a few spill; 12 rows' too many); more: even passes */
#define JV(mb) 4       /* vectors per row in a register tile: the whole 64-column block */
#define EVEN_PASSES 1  /* 13 rows: 6 + 7 */
#define NREGS 32       /* vector registers */
#else /* AVX2 (16 registers of 8 floats): 8-12 accumulators, as BLIS's Haswell tile (6 x 16); the AVX-512 tile,
       * split in two registers per vector, ran 5 rows in 4.4 times one row's time (1.8 times now) */
#define MB_ONE_PASS 6  /* rows per register tile */
#define JV(mb) ((mb) == 1 ? 8 : (mb) <= 3 ? 4 : 2) /* strips of 64, 32 or 16 columns, each over the same rows */
#define NREGS 16       /* vector registers */
#define EVEN_PASSES 0  /* 13 rows: 1 + 6 + 6; full 6-row tiles do the most per weight loaded (kernel_ab against even
                        * passes, 4 + 4 + 5: 1.21x; 7 rows as 1 + 6, not 3 + 4: 1.14x) */
#endif
#define PF_NEAR 16     /* weight rows ahead that a step prefetches into L1, for 1-2 rows (the streamer alone falls behind) */
#define PF_FAR 256     /* ... into L2, for 3+ rows: the next pass's rows arrive while these are multiplied (1.12-1.27x) */
#define KB 256         /* weight rows per pass over a tile (the tile's weights stay in L2) */
#define MIN_PARALLEL_WORK (1 << 18) /* multiply-adds below which one thread does it all */

#define SWIGLU 0x7E5A3C10u      /* alpha bits of an element-wise call: C = silu(A) * C (lean_ops.py) */
#define SWIGLU_WIDTH 16         /* such a call comes as (rows, 16) products: N = K = lda = ldc = 16 */
#define SWIGLU_PARALLEL (1 << 16) /* elements below which one thread does it all */
#define SOFTMAX 0x7E5A3C11u     /* alpha bits of a row-wise call: each row of C becomes its softmax (kernel_ops.py) */
#define LOG_SOFTMAX 0x7E5A3C12u /* ... its log-softmax: x - (max + log(sum of exp(x - max))) */
#define SOFTMAX_PARALLEL (1 << 15) /* elements below which one thread does all rows */
#define PACKED_F32 0x7E5A3C01u  /* alpha bits of a call on packed B (packed_weights.py) */
#define PACKED_F16 0x7E5A3C02u
#define PACKED_BF16 0x7E5A3C03u
#define PACKED_I8 0x7E5A3C04u   /* int8 B, four A rows per real row, C = product x C (draft_gemm.c) */
#define PACKED_I4 0x7E5A3C05u   /* 4-bit B, eight A rows per real row, B (K/8, 9N/8), C = product (draft_gemm4.c) */
#define PACKED_I8_PAIRS 0x7E5A3C06u /* int8 B as (K/2, N/2), two A rows per real row, C = product x C (see the top) */

int mlxspec_draft_gemm(int M, int N, int K, const float *A, int lda, const uint8_t *B, float *C, int ldc);
int mlxspec_draft_gemm_available(void);
int mlxspec_draft_gemm4(int M, int N, int K, const float *A, int lda, const uint8_t *B, float *C, int ldc);
int mlxspec_draft_gemm4_available(void);
int mlxspec_draft_amx(int on);

enum { ROW_MAJOR = 101, NO_TRANS = 111 };
enum { F32, F16, BF16 }; /* how B's elements are stored */

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                         float *, int);
static sgemm_fn real_sgemm;
static int enabled = 1;
static long calls;        /* products this kernel computed (tests read it) */
static long packed_calls; /* of which on packed weights */

#if HAVE_F16
static inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
#endif

/* The register tile's vectors, of the machine's own width: GCC keeps a vector type wider than the
 * registers in memory, and on AVX2 a tile of 16-float vectors ran at a tenth of the FMA units' rate. */
#if defined(__AVX512F__)
#define VW 16
#elif defined(__AVX__)
#define VW 8
#else
#define VW 4
#endif
typedef float vn __attribute__((vector_size(4 * VW)));

static inline vn loadn(const float *p) { vn v; memcpy(&v, p, sizeof v); return v; }
static inline void storen(float *p, vn v) { memcpy(p, &v, sizeof v); }
static inline vn splatn(const float *p) /* a broadcast load (a lane-by-lane fill became 8 inserts) */
{
    float x = *p;
#if VW == 16
    return (vn){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
#elif VW == 8
    return (vn){x, x, x, x, x, x, x, x};
#else
    return (vn){x, x, x, x};
#endif
}
static inline vn loadn_bf16(const uint16_t *p)
{
    typedef uint16_t u16n __attribute__((vector_size(2 * VW)));
    typedef uint32_t u32n __attribute__((vector_size(4 * VW)));
    u16n h;
    memcpy(&h, p, sizeof h);
    u32n w = __builtin_convertvector(h, u32n) << 16;
    vn v;
    memcpy(&v, &w, sizeof v);
    return v;
}
#if HAVE_F16
static inline vn loadn_f16(const uint16_t *p)
{
#ifdef __AVX512F__
    return (vn)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#else
    return (vn)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#endif
}
#endif

/* element i of B, widened to float32 exactly */
static inline float element(int fmt, const void *B, size_t i)
{
    if (fmt == F32)
        return ((const float *)B)[i];
    uint16_t h = ((const uint16_t *)B)[i];
    if (fmt == BF16) {
        uint32_t w = (uint32_t)h << 16;
        float f;
        memcpy(&f, &w, sizeof f);
        return f;
    }
#if HAVE_F16
    return f16_to_f32(h);
#else
    return __builtin_nanf("");
#endif
}

/* acc[m][0..VW jv) += sum over k in [k0,k1) of A[m][k] * B[k][0..VW jv), for m < mb (<= MB_ONE_PASS);
 * B's rows are ldb elements apart (N for a plain B, NB inside a packed block), acc's NB.  `fetch`: the first
 * strip of a block prefetches every cache line of the rows ahead (the later strips find them in cache). */
#define TILE(NAME, T, LOAD)                                                                                         \
    static inline __attribute__((always_inline)) void NAME##_rows(int mb, int jv, int fetch, int k0, int k1,       \
                                                                  const float *A, int lda, const T *B, size_t ldb, \
                                                                  float *acc)                                       \
    {                                                                                                               \
        vn c[MB_ONE_PASS][NB / VW];                                                                                 \
        for (int m = 0; m < MB_ONE_PASS; m++)                                                                       \
            for (int j = 0; j < jv; j++)                                                                            \
                c[m][j] = m < mb ? loadn(acc + m * NB + VW * j) : (vn){0};                                          \
        for (int k = k0; k < k1; k++) {                                                                             \
            const T *b = B + (size_t)k * ldb;                                                                       \
            for (size_t line = 0; fetch && line < sizeof(T) * NB; line += 64) { /* every cache line of a row ahead */ \
                if (mb <= 2)                                                                                        \
                    __builtin_prefetch((const char *)(b + PF_NEAR * ldb) + line, 0, 3);                             \
                else                                                                                                \
                    __builtin_prefetch((const char *)(b + PF_FAR * ldb) + line, 0, 1);                              \
            }                                                                                                       \
            /* the weight vectors first, then each row's input, needs jv + 1 registers besides the sums; the     \
             * rows' inputs first, then each weight vector, mb + 1: AVX2's 3 x 4 tile fits in 16 only that way  \
             * (kernel_ab: 3 rows 1.11x, 9 = 3 + 6 rows 1.21x faster); the plain step's 1 x 8 keeps its order */ \
            if (mb > 1 && mb * jv + jv + 1 > NREGS && mb * jv + mb + 1 <= NREGS) {                                \
                vn a[MB_ONE_PASS];                                                                                  \
                for (int m = 0; m < mb; m++)                                                                        \
                    a[m] = splatn(A + (size_t)m * lda + k);                                                         \
                for (int j = 0; j < jv; j++) {                                                                      \
                    vn w = LOAD(b + VW * j);                                                                        \
                    for (int m = 0; m < mb; m++)                                                                    \
                        c[m][j] += a[m] * w;                                                                        \
                }                                                                                                   \
            } else {                                                                                            \
                vn w[NB / VW];                                                                                      \
                for (int j = 0; j < jv; j++)                                                                        \
                    w[j] = LOAD(b + VW * j);                                                                        \
                _Pragma("GCC unroll 10") for (int m = 0; m < MB_ONE_PASS; m++)                                      \
                {                                                                                                   \
                    if (m < mb) {                                                                                   \
                        vn a = splatn(A + (size_t)m * lda + k);                                                     \
                        for (int j = 0; j < jv; j++)                                                                \
                            c[m][j] += a * w[j];                                                                    \
                    }                                                                                               \
                }                                                                                                   \
            }                                                                                                       \
        }                                                                                                           \
        for (int m = 0; m < mb; m++)                                                                                \
            for (int j = 0; j < jv; j++)                                                                            \
                storen(acc + m * NB + VW * j, c[m][j]);                                                             \
    }                                                                                                               \
    static void NAME(int mb, int k0, int k1, const float *A, int lda, const T *B, size_t ldb, float *acc)          \
    { /* a copy per row count: each keeps exactly its accumulators in registers */                                  \
        switch (mb) {                                                                                               \
        case 1: STRIPS(NAME, 1); break;                                                                             \
        case 2: STRIPS(NAME, 2); break;                                                                             \
        case 3: STRIPS(NAME, 3); break;                                                                             \
        case 4: STRIPS(NAME, 4); break;                                                                             \
        case 5: STRIPS(NAME, 5); break;                                                                             \
        case 6: STRIPS(NAME, 6); break;                                                                             \
        IF_TEN_ROWS(case 7: STRIPS(NAME, 7); break;)                                                                \
        IF_TEN_ROWS(case 8: STRIPS(NAME, 8); break;)                                                                \
        IF_TEN_ROWS(case 9: STRIPS(NAME, 9); break;)                                                                \
        IF_TEN_ROWS(default: STRIPS(NAME, 10);)                                                                     \
        }                                                                                                           \
    }
/* the block's columns in strips of VW JV(mb), each over all of [k0, k1) */
#define STRIPS(NAME, mb)                                                                                            \
    for (int s = 0; s < NB; s += VW * JV(mb))                                                                       \
    NAME##_rows(mb, JV(mb), s == 0, k0, k1, A, lda, B + s, ldb, acc + s)
#if MB_ONE_PASS > 6
#define IF_TEN_ROWS(...) __VA_ARGS__
#else
#define IF_TEN_ROWS(...)
#endif
TILE(tile_f32, float, loadn)
TILE(tile_bf16, uint16_t, loadn_bf16)
#if HAVE_F16
TILE(tile_f16, uint16_t, loadn_f16)
#endif

static void finish(int M, int nw, float alpha, const float *acc, float beta, float *C, int ldc)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < nw; n++) {
            float v = alpha * acc[m * NB + n];
            C[(size_t)m * ldc + n] = beta == 0.0f ? v : v + beta * C[(size_t)m * ldc + n];
        }
}

/* Column block nb of C.  A plain B (packed == 0) is K x N row-major; a packed B
 * holds block nb at element nb * NB * K, its K rows of nw columns contiguous. */
static void column_block(int nb, int M, int N, int K, float alpha, const float *A, int lda, const void *B, int ldb,
                         int packed, int fmt, float beta, float *C, int ldc)
{
    float acc[SMALL_M_MAX * NB] __attribute__((aligned(64)));
    int n0 = nb * NB, nw = N - n0 < NB ? N - n0 : NB;
    size_t start = packed ? (size_t)n0 * K : (size_t)n0, stride = packed ? (size_t)nw : (size_t)ldb;
    memset(acc, 0, sizeof(float) * M * NB);
    if (nw < NB) { /* the last, narrower block: scalar, same order of terms */
        for (int m = 0; m < M; m++)
            for (int n = 0; n < nw; n++) {
                float s = 0.0f;
                for (int k = 0; k < K; k++)
                    s = __builtin_fmaf(A[(size_t)m * lda + k], element(fmt, B, start + k * stride + n), s);
                acc[m * NB + n] = s;
            }
    } else {
        for (int k0 = 0; k0 < K; k0 += KB) {
            int k1 = k0 + KB < K ? k0 + KB : K;
            /* the smaller pass first (the first streams the weights from memory, which hides a less efficient
             * tile), then even passes or full tiles (EVEN_PASSES) */
            int passes = (M + MB_ONE_PASS - 1) / MB_ONE_PASS;
            for (int p = 0, m0 = 0, mb; p < passes; p++, m0 += mb) {
                mb = EVEN_PASSES ? (M - m0) / (passes - p) : p == 0 ? M - MB_ONE_PASS * (passes - 1) : MB_ONE_PASS;
                const float *a = A + (size_t)m0 * lda;
                if (fmt == F32)
                    tile_f32(mb, k0, k1, a, lda, (const float *)B + start, stride, acc + m0 * NB);
                else if (fmt == BF16)
                    tile_bf16(mb, k0, k1, a, lda, (const uint16_t *)B + start, stride, acc + m0 * NB);
#if HAVE_F16
                else
                    tile_f16(mb, k0, k1, a, lda, (const uint16_t *)B + start, stride, acc + m0 * NB);
#endif
            }
        }
    }
    finish(M, nw, alpha, acc, beta, C + n0, ldc);
}

/* B transposed (B is N x K, row-major: attention scores, mlx-lm's weight layout):
 * each output element a dot product over k, 16 lanes then their sum, in a fixed order. */
static float dot(const float *a, const float *b, int K)
{
    vn s[16 / VW] = {{0}}; /* lane i of the 16 sums the terms k = i (mod 16), whatever the vector width */
    int k = 0;
    for (; k + 16 <= K; k += 16)
        for (int j = 0; j < 16 / VW; j++)
            s[j] += loadn(a + k + VW * j) * loadn(b + k + VW * j);
    float t = 0.0f;
    for (int j = 0; j < 16 / VW; j++)
        for (int i = 0; i < VW; i++)
            t += s[j][i];
    for (; k < K; k++)
        t = __builtin_fmaf(a[k], b[k], t);
    return t;
}

/* A product's arguments, for its parallel loop (thread_pool.h) */
struct product {
    int M, N, K, lda, ldb, packed, fmt, ldc;
    float alpha, beta;
    const float *A;
    const void *B;
    float *C;
};

static void bt_column(long n, void *ctx)
{
    const struct product *p = ctx;
    const float *B = p->B;
    for (int m = 0; m < p->M; m++) {
        float v = p->alpha * dot(p->A + (size_t)m * p->lda, B + (size_t)n * p->ldb, p->K);
        float *c = p->C + (size_t)m * p->ldc + n;
        *c = p->beta == 0.0f ? v : v + p->beta * *c;
    }
}

static void small_sgemm_bt(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                           float beta, float *C, int ldc)
{
    struct product p = {.M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc, .alpha = alpha, .beta = beta,
                        .A = A, .B = B, .C = C};
    mlxspec_par_for(N, (long)M * N * K >= MIN_PARALLEL_WORK, bt_column, &p);
}

static void product_block(long nb, void *ctx)
{
    const struct product *p = ctx;
    column_block((int)nb, p->M, p->N, p->K, p->alpha, p->A, p->lda, p->B, p->ldb, p->packed, p->fmt, p->beta, p->C,
                 p->ldc);
}

static void small_sgemm(int M, int N, int K, float alpha, const float *A, int lda, const void *B, int ldb, int packed,
                        int fmt, float beta, float *C, int ldc)
{
    struct product p = {.M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .packed = packed, .fmt = fmt, .ldc = ldc,
                        .alpha = alpha, .beta = beta, .A = A, .B = B, .C = C};
    mlxspec_par_for((N + NB - 1) / NB, (long)M * N * K >= MIN_PARALLEL_WORK, product_block, &p);
}

/* A call on packed weights: the shapes as the caller passed them (see the top). */
static void packed_sgemm(int fmt, int M, int N, int K, const float *A, int lda, const void *B, float beta, float *C,
                         int ldc)
{
    __atomic_add_fetch(&packed_calls, 1, __ATOMIC_RELAXED);
    if (fmt != F32) { /* 16-bit B: A and C have two rows per real row */
        if (M % 2 != 0 || lda != K) {
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++)
                    C[(size_t)m * ldc + n] = __builtin_nanf(""); /* loud, never silently wrong */
            return;
        }
        M /= 2;
        K *= 2;
        lda = K;
    }
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    /* a prompt: even chunks of at most SMALL_M_MAX rows, the weights streamed once per chunk -- 4.5x
     * faster than unpacking panels for OpenBLAS for 77 rows, 2.5x for 300 (the default target) */
    int chunks = (M + SMALL_M_MAX - 1) / SMALL_M_MAX;
    for (int c = 0, m0 = 0; c < chunks; c++) {
        int rows = (M - m0) / (chunks - c);
        small_sgemm(rows, N, K, 1.0f, A + (size_t)m0 * lda, lda, B, N, 1, fmt, beta, C + (size_t)m0 * ldc, ldc);
        m0 += rows;
    }
}

/* MLX's CPU exp and sigmoid (mlx/backend/cpu/simd/math.h, unary_ops.h: a Cephes polynomial
 * for 2^fraction, the exponent by bit shifting), computed 16 lanes at a time with the same
 * operations in the same order, so that each result is bit for bit MLX's own (lean_ops.py's
 * tests compare them): MLX 0.32's x86 build computes them one element at a time, ~16 ns each.
 * No contraction into fused multiply-adds other than MLX's own. */
#ifdef __AVX512F__
__attribute__((optimize("fp-contract=off"))) static inline __m512 mlx_exp16(__m512 x0)
{
    __m512 x = _mm512_mul_ps(x0, _mm512_set1_ps(1.442695f));
    __m512 ip = _mm512_roundscale_ps(_mm512_add_ps(x, _mm512_set1_ps(0.5f)), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 fp = _mm512_sub_ps(x, ip);
    __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, fp, _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, fp, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, fp, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, fp, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, fp, _mm512_set1_ps(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, fp, _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(ip), _mm512_set1_epi32(127)), 23);
    __m512 r = _mm512_mul_ps(_mm512_castsi512_ps(e), p);
    r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q), x0);
    r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(x0, _mm512_set1_ps(88.0f), _CMP_GT_OQ), _mm512_set1_ps(__builtin_inff()));
    return _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(x0, _mm512_set1_ps(-88.0f), _CMP_LT_OQ), _mm512_setzero_ps());
}
#endif

__attribute__((optimize("fp-contract=off"))) static inline float mlx_exp1(float x0)
{
    float x = x0 * 1.442695f;
    float ip = __builtin_floorf(x + 0.5f);
    float fp = x - ip;
    float p = 1.535336188319500e-4f;
    p = __builtin_fmaf(p, fp, 1.339887440266574e-3f);
    p = __builtin_fmaf(p, fp, 9.618437357674640e-3f);
    p = __builtin_fmaf(p, fp, 5.550332471162809e-2f);
    p = __builtin_fmaf(p, fp, 2.402264791363012e-1f);
    p = __builtin_fmaf(p, fp, 6.931472028550421e-1f);
    p = __builtin_fmaf(p, fp, 1.0f);
    int32_t e = (x0 == x0 && x0 <= 88.0f && x0 >= -88.0f ? (int32_t)ip + 127 : 0) << 23;
    float scale;
    memcpy(&scale, &e, sizeof scale);
    float r = x0 != x0 ? x0 : scale * p;
    r = x0 > 88.0f ? __builtin_inff() : r;
    return x0 < -88.0f ? 0.0f : r;
}

/* silu(g) * u = (g * sigmoid(g)) * u, sigmoid(g) = g < 0 ? y : 1 - y with y = 1 / (1 + exp(|g|)) */
__attribute__((optimize("fp-contract=off"))) static void swiglu_range(long i0, long i1, const float *g, float *c)
{
    long i = i0;
#ifdef __AVX512F__
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= i1; i += 16) {
        __m512 x = _mm512_loadu_ps(g + i);
        __m512 y = _mm512_div_ps(one, _mm512_add_ps(one, mlx_exp16(_mm512_abs_ps(x))));
        __m512 s = _mm512_mask_mov_ps(_mm512_sub_ps(one, y), _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), y);
        _mm512_storeu_ps(c + i, _mm512_mul_ps(_mm512_mul_ps(x, s), _mm512_loadu_ps(c + i)));
    }
#endif
    for (; i < i1; i++) {
        float x = g[i];
        float y = 1.0f / (1.0f + mlx_exp1(__builtin_fabsf(x)));
        c[i] = (x * (x < 0.0f ? y : 1.0f - y)) * c[i];
    }
}

struct swiglu_call {
    long n;
    const float *g;
    float *c;
};

static void swiglu_chunk(long j, void *ctx)
{
    const struct swiglu_call *s = ctx;
    swiglu_range(j * 4096, (j + 1) * 4096 < s->n ? (j + 1) * 4096 : s->n, s->g, s->c);
}

static void swiglu(long n, const float *g, float *c)
{
    struct swiglu_call s = {n, g, c};
    mlxspec_par_for((n + 4095) / 4096, n >= SWIGLU_PARALLEL, swiglu_chunk, &s);
}

/* softmax of one row, in place: max, exp(x - max) (MLX's exp), their sum (16 lanes, then the lanes
 * and the tail in a fixed order), times 1 / sum; or (log_space) the log-softmax, x - (max + log(sum)).
 * Each row alone: a row's result does not depend on the other rows of the call. */
__attribute__((optimize("fp-contract=off"))) static void softmax_row(float *x, int n, int log_space)
{
    int i = 0;
    float top = -__builtin_inff(), sum = 0.0f;
#ifdef __AVX512F__
    if (n >= 16) {
        __m512 t = _mm512_loadu_ps(x);
        for (i = 16; i + 16 <= n; i += 16)
            t = _mm512_max_ps(t, _mm512_loadu_ps(x + i));
        top = _mm512_reduce_max_ps(t);
    }
#endif
    for (; i < n; i++)
        top = x[i] > top ? x[i] : top;
    i = 0;
#ifdef __AVX512F__
    __m512 acc = _mm512_setzero_ps(), m = _mm512_set1_ps(top);
    for (; i + 16 <= n; i += 16) {
        __m512 e = mlx_exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), m));
        if (!log_space)
            _mm512_storeu_ps(x + i, e);
        acc = _mm512_add_ps(acc, e);
    }
    float lanes[16];
    _mm512_storeu_ps(lanes, acc);
    for (int j = 0; j < 16; j++)
        sum += lanes[j];
#endif
    for (; i < n; i++) {
        float e = mlx_exp1(x[i] - top);
        if (!log_space)
            x[i] = e;
        sum += e;
    }
    if (log_space) {
        float lse = top + logf(sum);
        for (i = 0; i < n; i++)
            x[i] -= lse;
        return;
    }
    float inv = 1.0f / sum;
    for (i = 0; i < n; i++)
        x[i] *= inv;
}

struct softmax_call {
    int N, ldc, log_space;
    float *C;
};

static void softmax_one(long m, void *ctx)
{
    const struct softmax_call *s = ctx;
    softmax_row(s->C + (size_t)m * s->ldc, s->N, s->log_space);
}

static void softmax_rows(int M, int N, float *C, int ldc, int log_space)
{
    struct softmax_call s = {N, ldc, log_space, C};
    mlxspec_par_for(M, (long)M * N >= SOFTMAX_PARALLEL, softmax_one, &s);
}

void cblas_sgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc)
{
    uint32_t bits;
    memcpy(&bits, &alpha, sizeof bits);
    if (bits == SOFTMAX || bits == LOG_SOFTMAX) { /* addmm(x, zeros (M, 1), zeros (1, N)): C holds x */
        if (order == ROW_MAJOR && trans_a == NO_TRANS && M >= 1 && N >= 1 && K == 1 && ldc == N && beta == 1.0f)
            softmax_rows(M, N, C, ldc, bits == LOG_SOFTMAX);
        else
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++)
                    C[(size_t)m * ldc + n] = __builtin_nanf("");
        return;
    }
    if (bits == SWIGLU) {
        int ok = order == ROW_MAJOR && trans_a == NO_TRANS && M >= 1 && N == SWIGLU_WIDTH && K == SWIGLU_WIDTH &&
                 lda == SWIGLU_WIDTH && ldc == SWIGLU_WIDTH && beta == 1.0f;
        if (ok)
            swiglu((long)M * SWIGLU_WIDTH, A, C);
        else
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++)
                    C[(size_t)m * ldc + n] = __builtin_nanf(""); /* loud, never silently wrong */
        return;
    }
    if (bits == PACKED_I8) {
        int ok = order == ROW_MAJOR && trans_a == NO_TRANS && trans_b == NO_TRANS && M >= 4 && M % 4 == 0 &&
                 N >= 1 && K >= 1 && lda == K && beta == 1.0f && mlxspec_draft_gemm_available();
        __atomic_add_fetch(&packed_calls, 1, __ATOMIC_RELAXED);
        if (!ok || mlxspec_draft_gemm(M / 4, N, 4 * K, A, 4 * K, (const uint8_t *)B, C, ldc) != 0)
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++)
                    C[(size_t)m * ldc + n] = __builtin_nanf(""); /* loud, never silently wrong */
        return;
    }
    if (bits == PACKED_I8_PAIRS) { /* the real product: M / 2 rows of 2N values, K = 2 x those given */
        int ok = order == ROW_MAJOR && trans_a == NO_TRANS && trans_b == NO_TRANS && M >= 2 && M % 2 == 0 &&
                 N >= 1 && K >= 1 && lda == K && ldc == N && beta == 1.0f && mlxspec_draft_gemm_available();
        __atomic_add_fetch(&packed_calls, 1, __ATOMIC_RELAXED);
        if (!ok || mlxspec_draft_gemm(M / 2, 2 * N, 2 * K, A, 2 * K, (const uint8_t *)B, C, 2 * ldc) != 0)
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++)
                    C[(size_t)m * ldc + n] = __builtin_nanf(""); /* loud, never silently wrong */
        return;
    }
    if (bits == PACKED_I4) { /* the real product: M / 8 rows, N = 8/9 of the columns given, K = 8 x those given */
        int ok = order == ROW_MAJOR && trans_a == NO_TRANS && trans_b == NO_TRANS && M >= 8 && M % 8 == 0 &&
                 N >= 9 && N % 9 == 0 && K >= 1 && lda == K && beta == 0.0f && mlxspec_draft_gemm4_available();
        __atomic_add_fetch(&packed_calls, 1, __ATOMIC_RELAXED);
        if (!ok || mlxspec_draft_gemm4(M / 8, N / 9 * 8, 8 * K, A, 8 * K, (const uint8_t *)B, C, ldc) != 0)
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++)
                    C[(size_t)m * ldc + n] = __builtin_nanf(""); /* loud, never silently wrong */
        return;
    }
    if ((bits == PACKED_F32 || bits == PACKED_BF16 || (HAVE_F16 && bits == PACKED_F16)) && order == ROW_MAJOR &&
        trans_a == NO_TRANS && trans_b == NO_TRANS && M >= 1 && N >= 1 && K >= 1) {
        packed_sgemm(bits == PACKED_F32 ? F32 : bits == PACKED_F16 ? F16 : BF16, M, N, K, A, lda, B, beta, C, ldc);
        return;
    }
    if (enabled && order == ROW_MAJOR && trans_a == NO_TRANS && M >= 1 && M <= SMALL_M_MAX && N >= 1 && K >= 1) {
        __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
        if (trans_b == NO_TRANS)
            small_sgemm(M, N, K, alpha, A, lda, B, ldb, 0, F32, beta, C, ldc);
        else
            small_sgemm_bt(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    real_sgemm(order, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* Bind the BLAS that takes every other call; 0 on success. */
int mlxspec_gemm_init(const char *blas_path)
{
    void *lib = dlopen(blas_path, RTLD_NOW | RTLD_GLOBAL);
    if (lib == NULL)
        return -1;
    real_sgemm = (sgemm_fn)dlsym(lib, "cblas_sgemm");
    mlxspec_draft_amx(1); /* the int8 products of many rows on AMX tiles, where granted */
    return real_sgemm != NULL && real_sgemm != cblas_sgemm ? 0 : -1;
}

/* 1: small products here (the default); 0: every unpacked call to the other BLAS.  Returns the old setting. */
int mlxspec_gemm_enable(int on)
{
    int old = enabled;
    enabled = on != 0;
    return old;
}

int mlxspec_gemm_enabled(void) { return enabled; }
long mlxspec_gemm_calls(void) { return __atomic_load_n(&calls, __ATOMIC_RELAXED); }
long mlxspec_gemm_packed_calls(void) { return __atomic_load_n(&packed_calls, __ATOMIC_RELAXED); }
int mlxspec_gemm_max_rows(void) { return SMALL_M_MAX; }
/* The packed formats this build reads: bit 0 float32, bit 1 float16, bit 2 bfloat16, bit 3 int8 and bit 4 4-bit
 * (a draft's). */
int mlxspec_gemm_formats(void)
{
    return 1 | (HAVE_F16 << 1) | 4 | (mlxspec_draft_gemm_available() << 3) | (mlxspec_draft_gemm4_available() << 4);
}
/* The element-wise operations this build computes: bit 0 SwiGLU, bit 1 row softmax, bit 2 row log-softmax. */
int mlxspec_gemm_elementwise(void) { return 1 | 2 | 4; }
