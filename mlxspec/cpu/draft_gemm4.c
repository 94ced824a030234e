/* 4-bit products for a draft model's weights (draft_weights.py), built into the same
 * library as small_gemm.c, which hands it the calls marked PACKED_I4.
 *
 * A draft step streams every draft weight once and its int8 products (draft_gemm.c)
 * run at the memory's speed, so half the bytes is nearly half the time.  Weights are
 * 4-bit with one float16 scale per group of QB inputs of a column (llama.cpp's Q4_0
 * grouping); activations are rounded to int8 in blocks of QB exactly as draft_gemm.c
 * rounds them (mlxspec_draft_quantise), so each block's integer sum is exact:
 *     sum_k a[k] w[k][n]  ~  sum_blocks (d * g[n]) * (sum_k u[k][n] a_q[k] - 8 S)
 * with u = q + 8 (q in [-8, 7]) the stored nibble, d and S the activation block's
 * scale and sum, g[n] the weight group's scale; each block adds its float term with
 * one fused multiply-add, in block order, the same in the vector and the AMX code.
 *
 * Layout: column blocks of NB = 64 outputs (N must be a multiple of 64), each
 * self-contained -- K * 32 bytes of nibbles, then K / QB * 64 float16 scales -- so a
 * fused projection is its parts' blocks side by side.  Inside a block's nibbles, QB
 * inputs take 1024 bytes: four pairs of input groups (g, g + 1) of four inputs each,
 * 256 bytes a pair, byte 4 n + i holding input 4 g + i of column n in its low nibble
 * and input 4 (g + 1) + i in its high nibble -- so masking and shifting one load
 * gives draft_gemm.c's int8 operand layout for each group.
 *
 * The result is written to C (beta 0); the bias, if any, is added after.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define NB 64 /* output columns per block (draft_gemm.c's) */
#define QB 32 /* inputs per activation block and per weight group */
#define MB 6  /* activation rows per register tile */
#define CHUNK 32 /* rows per column-block call (draft_gemm.c's mlxspec_draft_run) */
#define AMX_MIN_ROWS 3
#define AMX_ROWS 16
#define BLOCK_NIBBLE_BYTES (QB * NB / 2) /* one group of QB inputs of a column block */

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__F16C__)
#include <immintrin.h>
#define HAVE_VNNI4 1
#else
#define HAVE_VNNI4 0
#endif
#if HAVE_VNNI4 && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define HAVE_AMX4 1
#else
#define HAVE_AMX4 0
#endif

int mlxspec_draft_gemm4_available(void) { return HAVE_VNNI4; }

#if HAVE_VNNI4
typedef void (*mlxspec_draft_block_fn)(int nb, int M, int N, int K, const int8_t *qa, const float *ascale,
                                       const int32_t *asum, const uint8_t *B, float *C, int ldc);
int mlxspec_draft_run(int M, int N, int K, const float *A, int lda, const uint8_t *B, float *C, int ldc,
                      mlxspec_draft_block_fn block);
int mlxspec_draft_amx_on(void);

/* The block's QB inputs of one pair of groups as two int8-layout operands (four vectors each) */
static inline __attribute__((always_inline)) void unpack_pair(const uint8_t *p, __m512i lo[4], __m512i hi[4])
{
    const __m512i mask = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < 4; j++) {
        __m512i v = _mm512_loadu_si512(p + 64 * j);
        lo[j] = _mm512_and_si512(v, mask);
        hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
    }
}

/* acc[m][0..NB) += block b's term for rows m < mb: (sum - 8 S) x (d x g), g the group's float16 scales */
static inline __attribute__((always_inline)) void add_block(int mb, int blocks, int b, __m512i c[][4],
                                                            const float *ascale, const int32_t *asum,
                                                            const uint16_t *gs, float *acc)
{
    __m512 g[4];
    for (int j = 0; j < 4; j++)
        g[j] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(gs + (size_t)b * NB + 16 * j)));
    for (int m = 0; m < mb; m++) {
        __m512i corr = _mm512_set1_epi32(8 * asum[(size_t)m * blocks + b]);
        __m512 d = _mm512_set1_ps(ascale[(size_t)m * blocks + b]);
        for (int j = 0; j < 4; j++) {
            float *o = acc + m * NB + 16 * j;
            __m512 t = _mm512_cvtepi32_ps(_mm512_sub_epi32(c[m][j], corr));
            _mm512_storeu_ps(o, _mm512_fmadd_ps(t, _mm512_mul_ps(d, g[j]), _mm512_loadu_ps(o)));
        }
    }
}

static inline __attribute__((always_inline)) void tile_rows4(int mb, int K, const int8_t *qa, const float *ascale,
                                                             const int32_t *asum, const uint8_t *w,
                                                             const uint16_t *gs, float *acc)
{
    int blocks = K / QB;
    for (int b = 0; b < blocks; b++) {
        __m512i c[MB][4];
        for (int m = 0; m < MB; m++)
            for (int j = 0; j < 4; j++)
                c[m][j] = _mm512_setzero_si512();
        for (int pr = 0; pr < QB / 8; pr++) {
            __m512i lo[4], hi[4];
            unpack_pair(w + (size_t)b * BLOCK_NIBBLE_BYTES + pr * NB * 4, lo, hi);
            for (int half = 0; half < 2; half++) {
                __m512i *wv = half ? hi : lo;
                int g = 2 * pr + half;
                _Pragma("GCC unroll 6") for (int m = 0; m < MB; m++)
                {
                    if (m < mb) {
                        int32_t four;
                        memcpy(&four, qa + (size_t)m * K + b * QB + g * 4, 4);
                        __m512i a = _mm512_set1_epi32(four);
                        for (int j = 0; j < 4; j++)
                            c[m][j] = _mm512_dpbusd_epi32(c[m][j], wv[j], a);
                    }
                }
            }
        }
        add_block(mb, blocks, b, c, ascale, asum, gs, acc);
    }
}

static void tile4(int mb, int K, const int8_t *qa, const float *ascale, const int32_t *asum, const uint8_t *w,
                  const uint16_t *gs, float *acc)
{ /* a copy per row count: each keeps exactly its accumulators in registers */
    switch (mb) {
    case 1: tile_rows4(1, K, qa, ascale, asum, w, gs, acc); break;
    case 2: tile_rows4(2, K, qa, ascale, asum, w, gs, acc); break;
    case 3: tile_rows4(3, K, qa, ascale, asum, w, gs, acc); break;
    case 4: tile_rows4(4, K, qa, ascale, asum, w, gs, acc); break;
    case 5: tile_rows4(5, K, qa, ascale, asum, w, gs, acc); break;
    default: tile_rows4(6, K, qa, ascale, asum, w, gs, acc);
    }
}

#if HAVE_AMX4
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config4;

/* As tile4 for mb <= AMX_ROWS rows, the integer sums on AMX tiles: each block's nibbles are first widened
 * to draft_gemm.c's int8 layout (2048 bytes), then tiles 0-3 sum the four 16-column groups as there */
static void tile_amx4(int mb, int K, const int8_t *qa, const float *ascale, const int32_t *asum, const uint8_t *w,
                      const uint16_t *gs, float *acc)
{
    int32_t sums[AMX_ROWS * NB] __attribute__((aligned(64)));
    uint8_t u[QB / 4 * NB * 4] __attribute__((aligned(64)));
    tile_config4 cfg;
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
        for (int pr = 0; pr < QB / 8; pr++) {
            __m512i lo[4], hi[4];
            unpack_pair(w + (size_t)b * BLOCK_NIBBLE_BYTES + pr * NB * 4, lo, hi);
            for (int j = 0; j < 4; j++) {
                _mm512_store_si512(u + (2 * pr) * NB * 4 + 64 * j, lo[j]);
                _mm512_store_si512(u + (2 * pr + 1) * NB * 4 + 64 * j, hi[j]);
            }
        }
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        _tile_loadd(4, qa + b * QB, K);
        _tile_loadd(5, u, NB * 4);
        _tile_loadd(6, u + 64, NB * 4);
        _tile_loadd(7, u + 128, NB * 4);
        _tile_dpbsud(0, 4, 5);
        _tile_dpbsud(1, 4, 6);
        _tile_dpbsud(2, 4, 7);
        _tile_loadd(5, u + 192, NB * 4);
        _tile_dpbsud(3, 4, 5);
        _tile_stored(0, sums, NB * 4);
        _tile_stored(1, sums + 16, NB * 4);
        _tile_stored(2, sums + 32, NB * 4);
        _tile_stored(3, sums + 48, NB * 4);
        __m512i c[AMX_ROWS][4];
        for (int m = 0; m < mb; m++)
            for (int j = 0; j < 4; j++)
                c[m][j] = _mm512_load_si512(sums + m * NB + 16 * j);
        add_block(mb, blocks, b, c, ascale, asum, gs, acc);
    }
}
#endif

/* Column block nb for M (<= CHUNK) rounded rows: C[m][n0 + n] = the product */
static void column_block4(int nb, int M, int N, int K, const int8_t *qa, const float *ascale, const int32_t *asum,
                          const uint8_t *B, float *C, int ldc)
{
    (void)N; /* whole column blocks only */
    float acc[CHUNK * NB];
    int blocks = K / QB;
    const uint8_t *w = B + (size_t)nb * ((size_t)K * NB / 2 + (size_t)blocks * NB * 2);
    const uint16_t *gs = (const uint16_t *)(w + (size_t)K * NB / 2);
    memset(acc, 0, sizeof(float) * M * NB);
#if HAVE_AMX4
    if (M >= AMX_MIN_ROWS && mlxspec_draft_amx_on()) {
        for (int m0 = 0; m0 < M; m0 += AMX_ROWS)
            tile_amx4(M - m0 < AMX_ROWS ? M - m0 : AMX_ROWS, K, qa + (size_t)m0 * K, ascale + (size_t)m0 * blocks,
                      asum + (size_t)m0 * blocks, w, gs, acc + m0 * NB);
    } else
#endif
        for (int m0 = 0; m0 < M; m0 += MB)
            tile4(M - m0 < MB ? M - m0 : MB, K, qa + (size_t)m0 * K, ascale + (size_t)m0 * blocks,
                  asum + (size_t)m0 * blocks, w, gs, acc + m0 * NB);
    for (int m = 0; m < M; m++)
        memcpy(C + (size_t)m * ldc + (size_t)nb * NB, acc + m * NB, sizeof(float) * NB);
}

/* C[0..M) = A B for 4-bit B (see the top); 0, or -1 when N or K do not fit the layout or memory ran out. */
int mlxspec_draft_gemm4(int M, int N, int K, const float *A, int lda, const uint8_t *B, float *C, int ldc)
{
    if (N % NB != 0)
        return -1;
    return mlxspec_draft_run(M, N, K, A, lda, B, C, ldc, column_block4);
}
#else
int mlxspec_draft_gemm4(int M, int N, int K, const float *A, int lda, const uint8_t *B, float *C, int ldc)
{
    (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)C, (void)ldc;
    return -1; /* never called: mlxspec_draft_gemm4_available() says 0 */
}
#endif
