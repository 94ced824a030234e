#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <omp.h>
void cblas_sgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float beta, float *C, int ldc);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    int K = atoi(argv[1]), N = atoi(argv[2]), M = argc > 3 ? atoi(argv[3]) : 1;
    size_t sz = (size_t)K * N; int nb = (int)(400000000 / (sz * 4)); if (nb < 1) nb = 1;
    float **B = malloc(sizeof(void *) * nb);
    for (int i = 0; i < nb; i++) { B[i] = aligned_alloc(64, (sz * 4 + 63) / 64 * 64); for (size_t j = 0; j < sz; j++) B[i][j] = (float)((j * 2654435761u >> 13) & 255) / 128.0f - 1.0f; }
    float *A = malloc(sizeof(float) * K * 16), *C = malloc(sizeof(float) * N * 16);
    for (int i = 0; i < K * 16; i++) A[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    uint32_t bits = 0x7E5A3C01u; float alpha; memcpy(&alpha, &bits, 4);
    for (int th = 1; th <= 2; th++) {
        omp_set_num_threads(th);
        double best = 1e9;
        for (int r = 0; r < 5; r++) {
            double t0 = now();
            for (int i = 0; i < nb; i++) cblas_sgemm(101, 111, 111, M, N, K, alpha, A, K, B[i], N, 0.0f, C, N);
            double t = (now() - t0) / nb; if (t < best) best = t;
        }
        printf("f32 K=%d N=%d M=%d threads %d: %.1f us  %.1f GB/s\n", K, N, M, th, best * 1e6, sz * 4 / best / 1e9);
    }
    return 0;
}
