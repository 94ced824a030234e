/* int8 products for a draft model's weights (draft_weights.py), built into the same
 * library as small_gemm.c, which hands it the calls marked PACKED_I8.
 *
 * A draft only proposes tokens (the target decides), so its products may round:
 * weights are int8 with one scale per output column, and each row of activations
 * is rounded to int8 in blocks of QB values, each block with its own scale (the
 * Q8_0 scheme of llama.cpp: a block's largest value maps to 127).  The products
 * are integer dot products (AVX-512 VNNI: 64 multiply-adds per instruction; AVX2:
 * 32 per four, see DOT4), so
 * a draft step costs its weight bytes -- a quarter of float32 -- and little else.
 *
 * Weights arrive as unsigned bytes u = q + 128 (q in [-127, 127]) in column blocks
 * of NB columns; inside a block, each group of four consecutive k holds NB
 * columns of four bytes (VNNI's operand layout).  For a row a (int8 a_q, block
 * scale d, block sum S = sum of a_q over the block) and a column n:
 *     sum_k a[k] w[k][n]  ~  s[n] * sum_blocks d * (sum_k u[k][n] a_q[k] - 128 S)
 * The integer part is exact; each block adds its float term with one fused
 * multiply-add, in block order, the same in the vector and the scalar code.
 *
 * From AMX_MIN_ROWS rows on (a tree level, a verify-sized draft call, a prompt),
 * where VNNI is compute-bound, a block's integer sums come from AMX tiles
 * (TDPBSUD: 16 rows x 16 columns x 32 inputs an instruction, reading the same
 * weight layout: a tile of 16 columns is 64 bytes of each 256-byte row of four
 * inputs).  They are the same integers, and the float steps are the same, so a
 * product is bit for bit the VNNI code's (tests compare them).  Linux must grant
 * the process the tile state (arch_prctl); where it does not, VNNI does it all.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "thread_pool.h"

#define NB 64  /* output columns per block: four 16-lane vectors (as small_gemm.c) */
#define QB 32  /* activation values per quantisation block */
#define MB 6   /* activation rows per register tile: 24 integer accumulators */
#define CHUNK 32 /* rows per pass over the weights (each pass keeps its float sums on the stack) */
#define MIN_PARALLEL_WORK (1 << 18)

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define HAVE_VNNI 1
#else
#define HAVE_VNNI 0
#endif
#if !HAVE_VNNI && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HAVE_AVX2_I8 1 /* the same integer sums from VPMADDUBSW (see DOT4 below) */
#else
#define HAVE_AVX2_I8 0
#endif
#define HAVE_I8 (HAVE_VNNI || HAVE_AVX2_I8)
#if HAVE_VNNI && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#include <sys/syscall.h>
#include <unistd.h>
#define HAVE_AMX 1
#else
#define HAVE_AMX 0
#endif
#define AMX_MIN_ROWS 3 /* rows from which the AMX tiles take a product (fewer: the VNNI code streams as fast) */
#define AMX_ROWS 16    /* rows per tile */

int mlxspec_draft_gemm_available(void) { return HAVE_I8; }

/* Column block nb of a product for M (<= CHUNK) rounded rows (see mlxspec_draft_run) */
typedef void (*mlxspec_draft_block_fn)(int nb, int M, int N, int K, const int8_t *qa, const float *ascale,
                                       const int32_t *asum, const uint8_t *B, float *C, int ldc);

static int amx; /* products over AMX_MIN_ROWS+ rows on AMX tiles: the same integer sums, so the same result */

/* 1: products of AMX_MIN_ROWS+ rows on AMX tiles where Linux grants them (the default); 0: VNNI only.  Returns
 * the old setting, -1 when AMX is not available. */
int mlxspec_draft_amx(int on)
{
#if HAVE_AMX
    static int granted = -1;
    if (granted < 0)
        granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
    if (granted) {
        int old = amx;
        amx = on != 0;
        return old;
    }
#endif
    (void)on;
    return -1;
}

#if HAVE_VNNI
/* Row x (K values, K a multiple of QB) -> int8 q, a scale and a sum per block: q = x * (127 / top)
 * rounded to nearest (ties to even), top the block's largest |x|. */
static void quantise_row(const float *x, int K, int8_t *q, float *scale, int32_t *sum)
{
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (int b = 0; b < K / QB; b++) {
        const float *v = x + b * QB;
        __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
        float top = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        __m512 s = _mm512_set1_ps(top > 0.0f ? 127.0f / top : 0.0f);
        __m512i t0 = _mm512_min_epi32(hi, _mm512_max_epi32(lo, _mm512_cvtps_epi32(_mm512_mul_ps(v0, s))));
        __m512i t1 = _mm512_min_epi32(hi, _mm512_max_epi32(lo, _mm512_cvtps_epi32(_mm512_mul_ps(v1, s))));
        _mm_storeu_si128((__m128i *)(q + b * QB), _mm512_cvtepi32_epi8(t0));
        _mm_storeu_si128((__m128i *)(q + b * QB + 16), _mm512_cvtepi32_epi8(t1));
        scale[b] = top / 127.0f;
        sum[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(t0, t1));
    }
}

/* acc[m][0..NB) += the blocks' terms for rows m < mb of one full column block */
static inline __attribute__((always_inline)) void tile_rows(int mb, int K, const int8_t *qa, const float *ascale,
                                                            const int32_t *asum, const uint8_t *w, float *acc)
{
    int blocks = K / QB;
    for (int b = 0; b < blocks; b++) {
        __m512i c[MB][4];
        for (int m = 0; m < MB; m++)
            for (int j = 0; j < 4; j++)
                c[m][j] = _mm512_setzero_si512();
        for (int g = 0; g < QB / 4; g++) {
            const uint8_t *p = w + ((size_t)b * (QB / 4) + g) * NB * 4;
            __m512i w0 = _mm512_loadu_si512(p), w1 = _mm512_loadu_si512(p + 64), w2 = _mm512_loadu_si512(p + 128),
                    w3 = _mm512_loadu_si512(p + 192);
            _Pragma("GCC unroll 6") for (int m = 0; m < MB; m++)
            {
                if (m < mb) {
                    int32_t four;
                    memcpy(&four, qa + (size_t)m * K + b * QB + g * 4, 4);
                    __m512i a = _mm512_set1_epi32(four);
                    c[m][0] = _mm512_dpbusd_epi32(c[m][0], w0, a);
                    c[m][1] = _mm512_dpbusd_epi32(c[m][1], w1, a);
                    c[m][2] = _mm512_dpbusd_epi32(c[m][2], w2, a);
                    c[m][3] = _mm512_dpbusd_epi32(c[m][3], w3, a);
                }
            }
        }
        for (int m = 0; m < mb; m++) {
            __m512i corr = _mm512_set1_epi32(128 * asum[(size_t)m * blocks + b]);
            __m512 d = _mm512_set1_ps(ascale[(size_t)m * blocks + b]);
            for (int j = 0; j < 4; j++) {
                float *o = acc + m * NB + 16 * j;
                __m512 t = _mm512_cvtepi32_ps(_mm512_sub_epi32(c[m][j], corr));
                _mm512_storeu_ps(o, _mm512_fmadd_ps(t, d, _mm512_loadu_ps(o)));
            }
        }
    }
}

static void tile(int mb, int K, const int8_t *qa, const float *ascale, const int32_t *asum, const uint8_t *w,
                 float *acc)
{ /* a copy per row count: each keeps exactly its accumulators in registers */
    switch (mb) {
    case 1: tile_rows(1, K, qa, ascale, asum, w, acc); break;
    case 2: tile_rows(2, K, qa, ascale, asum, w, acc); break;
    case 3: tile_rows(3, K, qa, ascale, asum, w, acc); break;
    case 4: tile_rows(4, K, qa, ascale, asum, w, acc); break;
    case 5: tile_rows(5, K, qa, ascale, asum, w, acc); break;
    default: tile_rows(6, K, qa, ascale, asum, w, acc);
    }
}
#elif HAVE_AVX2_I8
#define MB2 2 /* rows per register tile: 8 integer accumulators of 8 columns (tile_one_row, tile_two_rows) */

/* As the AVX-512 quantise_row, one value at a time: the same float multiply, the same rounding (to nearest,
 * ties to even: the rounding mode VCVTPS2DQ uses), so the same bytes, scales and sums. */
static void quantise_row(const float *x, int K, int8_t *q, float *scale, int32_t *sum)
{
    for (int b = 0; b < K / QB; b++) {
        const float *v = x + b * QB;
        float top = 0.0f;
        int nan = 0;
        for (int i = 0; i < QB; i++) {
            float m = fabsf(v[i]);
            nan |= m != m;
            top = m > top ? m : top;
        }
        if (nan) /* a NaN makes the block's scale NaN, so the product is NaN and the draft's NaN check speaks
                  * (fmaxf drops a NaN: the product was finite nonsense) */
            top = NAN;
        float s = top > 0.0f ? 127.0f / top : 0.0f;
        int32_t t = 0;
        for (int i = 0; i < QB; i++) {
            long r = lrintf(v[i] * s);
            int8_t c = (int8_t)(r < -127 ? -127 : r > 127 ? 127 : r);
            q[b * QB + i] = c;
            t += c;
        }
        scale[b] = top / 127.0f;
        sum[b] = t;
    }
}

/* The integer sums of a group of four inputs for 8 columns (`p`: their 32 bytes): VPMADDUBSW multiplies
 * unsigned by signed bytes and adds pairs with saturation, so the weights go in as signed q = u - 128
 * (u XOR 0x80) with the activation's sign moved onto them, times |a|: |a| |q| <= 127 x 127, so a pair never
 * saturates, and the integer sum is the VNNI code's sum u a - 128 S exactly; the float steps are the same
 * too, so the product is bit for bit the same. */
#define DOT4(c, p, a, abs_a)                                                                                        \
    c = _mm256_add_epi32(                                                                                           \
        c, _mm256_madd_epi16(_mm256_maddubs_epi16(abs_a, _mm256_sign_epi8(_mm256_xor_si256(                          \
                                                      _mm256_loadu_si256((const __m256i *)(p)), flip), a)), ones)); \
    __asm__ volatile("" : "+x"(c) : : "memory") /* in source order: GCC hoisted all eight loads, and with them \
                                                  * in registers, kept four sums on the stack */
/* the four inputs of row m of group g of block b in every lane, and their magnitudes */
#define ROW_INPUTS(m, a, abs_a)                                                                                     \
    int32_t four##m;                                                                                                \
    memcpy(&four##m, qa + (size_t)(m) * K + b * QB + g * 4, 4);                                                    \
    __m256i a = _mm256_set1_epi32(four##m), abs_a = _mm256_abs_epi8(a)
/* acc[m][8 j..8 j+8) += sum t of a block, scaled by row m's block scale */
#define ADD_BLOCK(m, j, t)                                                                                          \
    _mm256_storeu_ps(acc + (m) * NB + 8 * (j), _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), d##m,                         \
                                                             _mm256_loadu_ps(acc + (m) * NB + 8 * (j))))

/* acc[0][0..64) += the blocks' terms for one row and a whole column block: eight named accumulators (an
 * array of them was kept in memory, each sum stored and loaded again every group) */
static void tile_one_row(int K, const int8_t *qa, const float *ascale, const uint8_t *w, float *acc)
{
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    for (int b = 0; b < K / QB; b++) {
        __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
        for (int g = 0; g < QB / 4; g++) {
            const uint8_t *p = w + ((size_t)b * (QB / 4) + g) * NB * 4;
            ROW_INPUTS(0, a, abs_a);
            DOT4(c0, p, a, abs_a);
            DOT4(c1, p + 32, a, abs_a);
            DOT4(c2, p + 64, a, abs_a);
            DOT4(c3, p + 96, a, abs_a);
            DOT4(c4, p + 128, a, abs_a);
            DOT4(c5, p + 160, a, abs_a);
            DOT4(c6, p + 192, a, abs_a);
            DOT4(c7, p + 224, a, abs_a);
        }
        __m256 d0 = _mm256_set1_ps(ascale[b]);
        ADD_BLOCK(0, 0, c0), ADD_BLOCK(0, 1, c1), ADD_BLOCK(0, 2, c2), ADD_BLOCK(0, 3, c3);
        ADD_BLOCK(0, 4, c4), ADD_BLOCK(0, 5, c5), ADD_BLOCK(0, 6, c6), ADD_BLOCK(0, 7, c7);
    }
}

/* acc[0..2][0..32) += the blocks' terms for two rows and 32 columns of a block (`w` at the strip's first
 * column): eight named accumulators */
static void tile_two_rows(int K, const int8_t *qa, const float *ascale, const uint8_t *w, float *acc)
{
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    int blocks = K / QB;
    for (int b = 0; b < blocks; b++) {
        __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, e0 = c0, e1 = c0, e2 = c0, e3 = c0;
        for (int g = 0; g < QB / 4; g++) {
            const uint8_t *p = w + ((size_t)b * (QB / 4) + g) * NB * 4;
            ROW_INPUTS(0, a, abs_a);
            ROW_INPUTS(1, x, abs_x);
            DOT4(c0, p, a, abs_a);
            DOT4(e0, p, x, abs_x);
            DOT4(c1, p + 32, a, abs_a);
            DOT4(e1, p + 32, x, abs_x);
            DOT4(c2, p + 64, a, abs_a);
            DOT4(e2, p + 64, x, abs_x);
            DOT4(c3, p + 96, a, abs_a);
            DOT4(e3, p + 96, x, abs_x);
        }
        __m256 d0 = _mm256_set1_ps(ascale[b]), d1 = _mm256_set1_ps(ascale[(size_t)blocks + b]);
        ADD_BLOCK(0, 0, c0), ADD_BLOCK(0, 1, c1), ADD_BLOCK(0, 2, c2), ADD_BLOCK(0, 3, c3);
        ADD_BLOCK(1, 0, e0), ADD_BLOCK(1, 1, e1), ADD_BLOCK(1, 2, e2), ADD_BLOCK(1, 3, e3);
    }
}

static void tile(int mb, int K, const int8_t *qa, const float *ascale, const int32_t *asum, const uint8_t *w,
                 float *acc)
{
    (void)asum; /* the sums of q, not u: no correction */
    if (mb == 1)
        tile_one_row(K, qa, ascale, w, acc);
    else
        for (int s = 0; s < NB; s += 32) /* two strips of 32 columns, the second finds the block in L2 */
            tile_two_rows(K, qa, ascale, w + 4 * s, acc + s);
}
#endif

#if HAVE_I8
#if HAVE_VNNI
#define TILE_ROWS MB
#else
#define TILE_ROWS MB2
#endif

#if HAVE_AMX
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config;

/* acc[m][0..NB) += the blocks' terms for rows m < mb (<= AMX_ROWS) of one full column block, the integer sums
 * on AMX tiles: tiles 0-3 the sums of the four 16-column groups, 4 a block of the rows, 5-7 the weights */
static void tile_amx(int mb, int K, const int8_t *qa, const float *ascale, const int32_t *asum, const uint8_t *w,
                     float *acc)
{
    int32_t sums[AMX_ROWS * NB] __attribute__((aligned(64)));
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 4; t++)
        cfg.rows[t] = (uint8_t)mb, cfg.colsb[t] = 64;
    cfg.rows[4] = (uint8_t)mb, cfg.colsb[4] = QB;
    for (int t = 5; t < 8; t++)
        cfg.rows[t] = QB / 4, cfg.colsb[t] = 64;
    _tile_loadconfig(&cfg);
    int blocks = K / QB;
    for (int b = 0; b < blocks; b++) {
        const uint8_t *p = w + (size_t)b * (QB / 4) * NB * 4; /* QB/4 rows of 256 bytes: 16 columns each 64 */
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        _tile_loadd(4, qa + b * QB, K);
        _tile_loadd(5, p, NB * 4);
        _tile_loadd(6, p + 64, NB * 4);
        _tile_loadd(7, p + 128, NB * 4);
        _tile_dpbsud(0, 4, 5);
        _tile_dpbsud(1, 4, 6);
        _tile_dpbsud(2, 4, 7);
        _tile_loadd(5, p + 192, NB * 4);
        _tile_dpbsud(3, 4, 5);
        _tile_stored(0, sums, NB * 4);
        _tile_stored(1, sums + 16, NB * 4);
        _tile_stored(2, sums + 32, NB * 4);
        _tile_stored(3, sums + 48, NB * 4);
        for (int m = 0; m < mb; m++) { /* as tile_rows */
            __m512i corr = _mm512_set1_epi32(128 * asum[(size_t)m * blocks + b]);
            __m512 d = _mm512_set1_ps(ascale[(size_t)m * blocks + b]);
            for (int j = 0; j < 4; j++) {
                float *o = acc + m * NB + 16 * j;
                __m512 t = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_load_si512(sums + m * NB + 16 * j), corr));
                _mm512_storeu_ps(o, _mm512_fmadd_ps(t, d, _mm512_loadu_ps(o)));
            }
        }
    }
}
#endif

/* Column block nb for M (<= CHUNK) quantised rows; C = result x C (C holds the column scales). */
static void column_block(int nb, int M, int N, int K, const int8_t *qa, const float *ascale, const int32_t *asum,
                         const uint8_t *B, float *C, int ldc)
{
    float acc[CHUNK * NB];
    int n0 = nb * NB, nw = N - n0 < NB ? N - n0 : NB, blocks = K / QB;
    const uint8_t *w = B + (size_t)n0 * K;
    memset(acc, 0, sizeof(float) * M * NB);
#if HAVE_AMX
    if (nw == NB && amx && M >= AMX_MIN_ROWS) {
        for (int m0 = 0; m0 < M; m0 += AMX_ROWS)
            tile_amx(M - m0 < AMX_ROWS ? M - m0 : AMX_ROWS, K, qa + (size_t)m0 * K, ascale + (size_t)m0 * blocks,
                     asum + (size_t)m0 * blocks, w, acc + m0 * NB);
    } else
#endif
    if (nw == NB) {
        for (int m0 = 0; m0 < M; m0 += TILE_ROWS) {
            int mb = M - m0 < TILE_ROWS ? M - m0 : TILE_ROWS;
            tile(mb, K, qa + (size_t)m0 * K, ascale + (size_t)m0 * blocks, asum + (size_t)m0 * blocks, w,
                 acc + m0 * NB);
        }
    } else { /* the last, narrower block: scalar, the same terms in the same order */
        for (int m = 0; m < M; m++)
            for (int n = 0; n < nw; n++) {
                float s = 0.0f;
                for (int b = 0; b < blocks; b++) {
                    int32_t t = 0;
                    for (int k = b * QB; k < (b + 1) * QB; k++)
                        t += (int32_t)w[((size_t)(k / 4) * nw + n) * 4 + k % 4] * qa[(size_t)m * K + k];
                    s = fmaf((float)(t - 128 * asum[(size_t)m * blocks + b]), ascale[(size_t)m * blocks + b], s);
                }
                acc[m * NB + n] = s;
            }
    }
    for (int m = 0; m < M; m++)
        for (int n = 0; n < nw; n++)
            C[(size_t)m * ldc + n0 + n] *= acc[m * NB + n];
}

/* Rows A[0..M) rounded as above into q (M x K), a scale and a sum per block of QB */
static void quantise_rows(int M, int K, const float *A, int lda, int8_t *q, float *scale, int32_t *sum)
{
    int blocks = K / QB;
    for (int m = 0; m < M; m++)
        quantise_row(A + (size_t)m * lda, K, q + (size_t)m * K, scale + (size_t)m * blocks, sum + (size_t)m * blocks);
}

/* Are products of AMX_MIN_ROWS+ rows on AMX tiles now (draft_gemm4.c follows the same setting)? */
int mlxspec_draft_amx_on(void) { return HAVE_AMX && amx; }

/* A chunk of rows of a rounded product, for its parallel loop (thread_pool.h) */
struct rounded_call {
    mlxspec_draft_block_fn block;
    int rows, N, K, ldc;
    const int8_t *qa;
    const float *ascale;
    const int32_t *asum;
    const uint8_t *B;
    float *C;
};

static void rounded_block(long nb, void *ctx)
{
    const struct rounded_call *r = ctx;
    r->block((int)nb, r->rows, r->N, r->K, r->qa, r->ascale, r->asum, r->B, r->C, r->ldc);
}

/* A product of M rows by a rounded B (this file's int8, draft_gemm4.c's 4-bit): the rows rounded as above,
 * then `block` computes column block nb for up to CHUNK rows at a time, blocks in parallel; 0, or -1 when K
 * is not a multiple of QB or memory ran out.  Shared by both formats. */
int mlxspec_draft_run(int M, int N, int K, const float *A, int lda, const uint8_t *B, float *C, int ldc,
                      mlxspec_draft_block_fn block)
{
    if (K % QB != 0)
        return -1;
    int blocks = K / QB;
    int8_t *qa = malloc((size_t)M * K);
    float *ascale = malloc(sizeof(float) * (size_t)M * blocks);
    int32_t *asum = malloc(sizeof(int32_t) * (size_t)M * blocks);
    if (qa == NULL || ascale == NULL || asum == NULL) {
        free(qa), free(ascale), free(asum);
        return -1;
    }
    quantise_rows(M, K, A, lda, qa, ascale, asum);
    for (int m0 = 0; m0 < M; m0 += CHUNK) {
        int rows = M - m0 < CHUNK ? M - m0 : CHUNK;
        struct rounded_call r = {block, rows, N, K, ldc, qa + (size_t)m0 * K, ascale + (size_t)m0 * blocks,
                                 asum + (size_t)m0 * blocks, B, C + (size_t)m0 * ldc};
        mlxspec_par_for((N + NB - 1) / NB, (long)rows * N * K >= MIN_PARALLEL_WORK, rounded_block, &r);
    }
    free(qa), free(ascale), free(asum);
    return 0;
}

/* C[0..M) = (A B) x C for int8 B (see the top); 0, or -1 when K is not a multiple of QB or memory ran out. */
int mlxspec_draft_gemm(int M, int N, int K, const float *A, int lda, const uint8_t *B, float *C, int ldc)
{
    return mlxspec_draft_run(M, N, K, A, lda, B, C, ldc, column_block);
}
#else
int mlxspec_draft_run(int M, int N, int K, const float *A, int lda, const uint8_t *B, float *C, int ldc,
                      mlxspec_draft_block_fn block)
{
    (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)C, (void)ldc, (void)block;
    return -1; /* never called without VNNI */
}

int mlxspec_draft_amx_on(void) { return 0; }

int mlxspec_draft_gemm(int M, int N, int K, const float *A, int lda, const uint8_t *B, float *C, int ldc)
{
    (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)C, (void)ldc;
    return -1; /* never called: mlxspec_draft_gemm_available() says 0 */
}
#endif
