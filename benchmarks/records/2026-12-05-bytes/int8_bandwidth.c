#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
#include <omp.h>
int mlxspec_draft_gemm(int M, int N, int K, const float *A, int lda, const uint8_t *B, float *C, int ldc);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    int K = atoi(argv[1]), N = atoi(argv[2]), M = argc > 3 ? atoi(argv[3]) : 1;
    size_t sz = (size_t)K * N; int nb = (int)(400000000 / sz); if (nb < 1) nb = 1;
    uint8_t **B = malloc(sizeof(void *) * nb);
    for (int i = 0; i < nb; i++) { B[i] = aligned_alloc(64, (sz + 63) / 64 * 64); for (size_t j = 0; j < sz; j++) B[i][j] = (uint8_t)(j * 2654435761u >> 13); }
    float *A = malloc(sizeof(float) * K * 16), *C = malloc(sizeof(float) * N * 16);
    for (int i = 0; i < K * 16; i++) A[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    for (int th = 1; th <= 2; th++) {
        omp_set_num_threads(th);
        double best = 1e9;
        for (int r = 0; r < 5; r++) {
            double t0 = now();
            for (int i = 0; i < nb; i++) { for (int j = 0; j < N * M; j++) C[j] = 1.0f; mlxspec_draft_gemm(M, N, K, A, K, B[i], C, N); }
            double t = (now() - t0) / nb; if (t < best) best = t;
        }
        printf("K=%d N=%d M=%d threads %d: %.1f us  %.1f GB/s\n", K, N, M, th, best * 1e6, sz / best / 1e9);
    }
    return 0;
}
