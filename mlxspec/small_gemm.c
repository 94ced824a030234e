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
 * Every output element is the sum over k = 0..K-1, in that order, of one fused
 * multiply-add per term, whatever M, the tiling and the thread split: a row's
 * result does not depend on which other rows share the call ("batch
 * invariance"), so a verify pass scores each position exactly as a plain step
 * would.
 */
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

#define SMALL_M_MAX 32 /* more rows: the packing GEMM's better use of compute wins */
#define NB 64          /* output columns per tile: four 16-float vectors */
#define MB 4           /* activation rows per register tile */
#define KB 256         /* weight rows per pass over a tile (the tile's weights stay in L2) */
#define MIN_PARALLEL_WORK (1 << 18) /* multiply-adds below which one thread does it all */

enum { ROW_MAJOR = 101, NO_TRANS = 111 };

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                         float *, int);
static sgemm_fn real_sgemm;
static int enabled = 1;
static long calls; /* products this kernel computed (tests read it) */

typedef float v16 __attribute__((vector_size(64)));

static inline v16 load16(const float *p) { v16 v; memcpy(&v, p, sizeof v); return v; }
static inline void store16(float *p, v16 v) { memcpy(p, &v, sizeof v); }

/* acc[m][0..NB) += sum over k in [k0,k1) of A[m][k] * B[k][0..NB), for m < mb (<= MB). */
static void tile(int mb, int k0, int k1, const float *A, int lda, const float *B, int ldb, float *acc)
{
    v16 c[MB][4];
    for (int m = 0; m < MB; m++)
        for (int j = 0; j < 4; j++)
            c[m][j] = m < mb ? load16(acc + m * NB + 16 * j) : (v16){0};
    for (int k = k0; k < k1; k++) {
        const float *b = B + (size_t)k * ldb;
        v16 b0 = load16(b), b1 = load16(b + 16), b2 = load16(b + 32), b3 = load16(b + 48);
#pragma GCC unroll 4
        for (int m = 0; m < MB; m++) {
            if (m < mb) {
                v16 a = (v16){0} + A[(size_t)m * lda + k];
                c[m][0] += a * b0;
                c[m][1] += a * b1;
                c[m][2] += a * b2;
                c[m][3] += a * b3;
            }
        }
    }
    for (int m = 0; m < mb; m++)
        for (int j = 0; j < 4; j++)
            store16(acc + m * NB + 16 * j, c[m][j]);
}

static void finish(int M, int nw, float alpha, const float *acc, float beta, float *C, int ldc)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < nw; n++) {
            float v = alpha * acc[m * NB + n];
            C[(size_t)m * ldc + n] = beta == 0.0f ? v : v + beta * C[(size_t)m * ldc + n];
        }
}

static void column_block(int nb, int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                         float beta, float *C, int ldc)
{
    float acc[SMALL_M_MAX * NB] __attribute__((aligned(64)));
    int n0 = nb * NB, nw = N - n0 < NB ? N - n0 : NB;
    memset(acc, 0, sizeof(float) * M * NB);
    if (nw < NB) { /* the last, narrower block: scalar, same order of terms */
        for (int m = 0; m < M; m++)
            for (int n = 0; n < nw; n++) {
                float s = 0.0f;
                for (int k = 0; k < K; k++)
                    s = __builtin_fmaf(A[(size_t)m * lda + k], B[(size_t)k * ldb + n0 + n], s);
                acc[m * NB + n] = s;
            }
    } else {
        for (int k0 = 0; k0 < K; k0 += KB) {
            int k1 = k0 + KB < K ? k0 + KB : K;
            for (int m0 = 0; m0 < M; m0 += MB)
                tile(M - m0 < MB ? M - m0 : MB, k0, k1, A + (size_t)m0 * lda, lda, B + n0, ldb, acc + m0 * NB);
        }
    }
    finish(M, nw, alpha, acc, beta, C + n0, ldc);
}

/* B transposed (B is N x K, row-major: attention scores, mlx-lm's weight layout):
 * each output element a dot product over k, 16 lanes then their sum, in a fixed order. */
static float dot(const float *a, const float *b, int K)
{
    v16 s = {0};
    int k = 0;
    for (; k + 16 <= K; k += 16)
        s += load16(a + k) * load16(b + k);
    float t = 0.0f;
    for (int i = 0; i < 16; i++)
        t += s[i];
    for (; k < K; k++)
        t = __builtin_fmaf(a[k], b[k], t);
    return t;
}

static void small_sgemm_bt(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                           float beta, float *C, int ldc)
{
#pragma omp parallel for schedule(static) if ((long)M * N * K >= MIN_PARALLEL_WORK)
    for (int n = 0; n < N; n++)
        for (int m = 0; m < M; m++) {
            float v = alpha * dot(A + (size_t)m * lda, B + (size_t)n * ldb, K);
            float *c = C + (size_t)m * ldc + n;
            *c = beta == 0.0f ? v : v + beta * *c;
        }
}

static void small_sgemm(int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                        float beta, float *C, int ldc)
{
    int blocks = (N + NB - 1) / NB;
#pragma omp parallel for schedule(static) if ((long)M * N * K >= MIN_PARALLEL_WORK)
    for (int nb = 0; nb < blocks; nb++)
        column_block(nb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void cblas_sgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc)
{
    if (enabled && order == ROW_MAJOR && trans_a == NO_TRANS && M >= 1 && M <= SMALL_M_MAX && N >= 1 && K >= 1) {
        __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
        if (trans_b == NO_TRANS)
            small_sgemm(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
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
    return real_sgemm != NULL && real_sgemm != cblas_sgemm ? 0 : -1;
}

/* 1: small products here (the default); 0: every call to the other BLAS.  Returns the old setting. */
int mlxspec_gemm_enable(int on)
{
    int old = enabled;
    enabled = on != 0;
    return old;
}

int mlxspec_gemm_enabled(void) { return enabled; }
long mlxspec_gemm_calls(void) { return __atomic_load_n(&calls, __ATOMIC_RELAXED); }
int mlxspec_gemm_max_rows(void) { return SMALL_M_MAX; }
