/* The kernels' parallel loops (thread_pool.c). */
#ifndef MLXSPEC_THREAD_POOL_H
#define MLXSPEC_THREAD_POOL_H

typedef void (*mlxspec_par_body)(long i, void *ctx);

/* body(i, ctx) for every i in [0, n): on the pool's threads when `parallel`, else on the caller. */
void mlxspec_par_for(long n, int parallel, mlxspec_par_body body, void *ctx);

#endif
