/* One process-wide pool of worker threads for the kernels' parallel loops (small_gemm.c, draft_gemm.c).
 *
 * MLX's CPU backend runs each stream's work on a thread of its own.  With OpenMP, every thread that
 * started a parallel loop got a team of its own: a second MLX stream (mlx-lm's generate makes one) added
 * a second team, and libgomp, once it manages more threads than there are CPUs, cuts the spin of idle
 * threads to 100 iterations -- every later product then woke its workers from sleep.  Measured on the
 * default pair, one process, interleaved: a plain step 141 -> 147 ms and a tree generation 6-9 % slower,
 * for the rest of the process, after a single mlx-lm run.  Here there is one pool whatever thread calls:
 * the caller takes the first share of a loop, the pool's workers the others; a loop that arrives while
 * another runs (two streams at once) runs on its caller alone.
 *
 * Idle workers spin SPIN_COUNT pauses (about a millisecond: a forward's products come tens of
 * microseconds apart), then sleep on a futex, so an idle process (a chat waiting for input, a server)
 * burns nothing.  Threads: OMP_NUM_THREADS if set (as with OpenMP before), else the CPUs this process
 * may run on.  Shares are contiguous ranges of the loop's indices and every index computes its own outputs,
 * so the split never changes a result (small_gemm.c's batch invariance).
 */
#define _GNU_SOURCE
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "thread_pool.h"

#define SPIN_COUNT 30000 /* pauses an idle worker spins before it sleeps (libgomp's GOMP_SPINCOUNT was set so) */
#define MAX_THREADS 64

static pthread_mutex_t busy = PTHREAD_MUTEX_INITIALIZER; /* one loop at a time on the pool */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int threads = 1;          /* the caller and the workers */
static unsigned generation;      /* futex word: bumped for each loop */
static int sleepers;             /* workers asleep on `generation` (or about to be) */
static int pending;              /* workers that have not finished the current loop */
static long loops;               /* loops run on the pool (tests read it) */
static struct {
    mlxspec_par_body body;
    void *ctx;
    long n;
    int shares;
} job;

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void run_share(int t, int shares, long n, mlxspec_par_body body, void *ctx)
{
    long lo = n * t / shares, hi = n * (t + 1) / shares;
    for (long i = lo; i < hi; i++)
        body(i, ctx);
}

static void *worker(void *arg)
{
    int t = (int)(long)arg;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        long spins = 0;
        while ((g = __atomic_load_n(&generation, __ATOMIC_ACQUIRE)) == seen) {
            if (spins++ < SPIN_COUNT) {
                relax();
                continue;
            }
            __atomic_add_fetch(&sleepers, 1, __ATOMIC_SEQ_CST);
            syscall(SYS_futex, &generation, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0); /* returns if it moved on */
            __atomic_sub_fetch(&sleepers, 1, __ATOMIC_SEQ_CST);
        }
        seen = g;
        if (t < job.shares)
            run_share(t, job.shares, job.n, job.body, job.ctx);
        __atomic_sub_fetch(&pending, 1, __ATOMIC_RELEASE);
    }
    return NULL;
}

static void after_fork_in_child(void)
{
    /* the workers did not come along: the child runs every loop on its caller */
    threads = 1;
    pthread_mutex_init(&busy, NULL);
}

static void start(void)
{
    int n = 0;
    const char *env = getenv("OMP_NUM_THREADS");
    if (env != NULL && *env)
        n = atoi(env);
    if (n <= 0) {
        cpu_set_t set;
        n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    }
    if (n > MAX_THREADS)
        n = MAX_THREADS;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int made = 1;
    for (int t = 1; t < n; t++) {
        pthread_t id;
        if (pthread_create(&id, &attr, worker, (void *)(long)t) != 0)
            break;
        made++;
    }
    pthread_attr_destroy(&attr);
    threads = made;
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

void mlxspec_par_for(long n, int parallel, mlxspec_par_body body, void *ctx)
{
    if (parallel && n > 1)
        pthread_once(&once, start);
    if (!parallel || n < 2 || threads < 2 || pthread_mutex_trylock(&busy) != 0) {
        for (long i = 0; i < n; i++)
            body(i, ctx);
        return;
    }
    int shares = threads < n ? threads : (int)n;
    job.body = body, job.ctx = ctx, job.n = n, job.shares = shares;
    __atomic_store_n(&pending, threads - 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&generation, 1, __ATOMIC_SEQ_CST); /* publishes the job */
    if (__atomic_load_n(&sleepers, __ATOMIC_SEQ_CST))
        syscall(SYS_futex, &generation, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    run_share(0, shares, n, body, ctx);
    for (long spins = 0; __atomic_load_n(&pending, __ATOMIC_ACQUIRE); spins++)
        if (spins < SPIN_COUNT)
            relax();
        else
            sched_yield(); /* a worker was descheduled: give it the CPU */
    loops++;
    pthread_mutex_unlock(&busy);
}

/* The pool's threads, the caller's included (1 until a loop first ran in parallel). */
int mlxspec_pool_threads(void) { return threads; }

/* Loops the pool has run in parallel. */
long mlxspec_pool_loops(void) { return loops; }
