/* What the native CPU kernels share: loops built for several instruction sets, and a
 * thread runner. Built with OpenMP (setup.py tries -fopenmp first) it runs the work on the
 * OpenMP runtime torch loads (libgomp.so.1: one library, one thread pool, no second runtime
 * beside torch's); built without (a compiler with no OpenMP) it starts pthreads per call
 * and joins them before returning. Included by _embedding_kernel.c, _interaction_kernel.c
 * and _dense_kernel.c.
 */
#ifndef CTRCTL_NATIVE_THREADS_H
#define CTRCTL_NATIVE_THREADS_H

#include <pthread.h>
#include <stdint.h>

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#define X86_DISPATCH 1
/* The clones are chosen by the CPU's features. (GCC's "arch=haswell" clone is chosen by the
 * CPU's model: it never ran on AMD's AVX2 CPUs nor on Intel's after Haswell without
 * AVX-512, which took the plain x86-64 loops. "arch=x86-64-v3" is AVX2 + FMA, by feature;
 * GCC before 12 and Clang have no such clone, and get an "avx2" one.) */
#if defined(__clang__) || __GNUC__ < 12
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#define KERNEL_ISA "avx512f,avx2,x86-64 (runtime dispatch)"
#else
#define CLONES __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#define KERNEL_ISA "avx512f,x86-64-v3 (avx2+fma),x86-64 (runtime dispatch)"
#endif
#else
#define CLONES
#define KERNEL_ISA "portable"
#endif
#define INLINE static inline __attribute__((always_inline))

/* Whether the CPU runs a build of the loops (the tables of loops of the kernels that pick
 * theirs at import). */
static inline int always(void) { return 1; }
#ifdef X86_DISPATCH
static inline int has_avx512(void) { return __builtin_cpu_supports("avx512f"); }
static inline int has_avx2(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

/* For a kernel that picks its loops at import: choose_loops() (the first of LOOPS this CPU
 * runs, by its features) and the Python functions isa() (the loops in use) and use(name)
 * (whether this CPU runs the loops named; then they are the ones called: for tests, which
 * compare every build the CPU runs with a reference). The kernel's file defines LOOPS (a
 * table, widest first, whose entries have name, describe and supported), NUM_LOOPS and
 * loops (the entry in use) before it, and has included Python.h and string.h; KERNEL names
 * the kernel in use()'s error. */
#ifdef X86_DISPATCH
#define CPU_INIT() __builtin_cpu_init()
#else
#define CPU_INIT() ((void)0)
#endif
#define LOOPS_BINDINGS(KERNEL)                                                              \
    static void choose_loops(void) {                                                       \
        CPU_INIT();                                                                         \
        for (size_t i = 0; i < NUM_LOOPS; i++)                                              \
            if (LOOPS[i].supported()) {                                                     \
                loops = &LOOPS[i];                                                          \
                return;                                                                     \
            }                                                                               \
    }                                                                                       \
    static PyObject *py_isa(PyObject *self, PyObject *args) {                               \
        (void)self;                                                                         \
        (void)args;                                                                         \
        return PyUnicode_FromString(loops->describe);                                       \
    }                                                                                       \
    static PyObject *py_use(PyObject *self, PyObject *args) {                               \
        (void)self;                                                                         \
        const char *name;                                                                   \
        if (!PyArg_ParseTuple(args, "s", &name)) return NULL;                               \
        for (size_t i = 0; i < NUM_LOOPS; i++)                                              \
            if (strcmp(LOOPS[i].name, name) == 0) {                                         \
                if (!LOOPS[i].supported()) Py_RETURN_FALSE;                                 \
                loops = &LOOPS[i];                                                          \
                Py_RETURN_TRUE;                                                             \
            }                                                                               \
        PyErr_Format(PyExc_ValueError, KERNEL ": no loops named '%s'", name);              \
        return NULL;                                                                        \
    }

/* A shuffle of two vectors' lanes, as GCC and Clang each spell it. */
#if defined(__clang__)
#define SHUFFLE2(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#define MASK(type, ...) __VA_ARGS__
#else
#define SHUFFLE2(a, b, mask) __builtin_shuffle(a, b, mask)
#define MASK(type, ...) ((type){__VA_ARGS__})
#endif

#define MAX_THREADS 64

/* ---- threads --------------------------------------------------------------------------- */

typedef void (*task_fn)(void *ctx, int thread, int nthreads);

#ifdef _OPENMP
#include <omp.h>
/* nthreads >= 2 threads of the OpenMP runtime torch already runs (the extension links
 * libgomp.so.1, the same library torch loads, so there is one thread pool): its workers are
 * the ones that would otherwise keep spinning after torch's last parallel op, competing with
 * threads of our own for the cores (measured: the interaction and the embedding update took
 * 1.5-1.8x longer inside a 2-thread training step than alone). Each thread's share comes
 * from the count that actually runs. */
static void run_team(task_fn fn, void *ctx, int nthreads) {
#pragma omp parallel num_threads(nthreads)
    fn(ctx, omp_get_thread_num(), omp_get_num_threads());
}
#else
typedef struct {
    task_fn fn;
    void *ctx;
    int thread, nthreads;
} Task;

static void *task_main(void *arg) {
    Task *t = (Task *)arg;
    t->fn(t->ctx, t->thread, t->nthreads);
    return NULL;
}

/* nthreads >= 2 pthreads (the calling one included); the shares of threads that cannot
 * start run on the calling thread (each share once: the update must not run twice). */
static void run_team(task_fn fn, void *ctx, int nthreads) {
    pthread_t ids[MAX_THREADS];
    Task tasks[MAX_THREADS];
    for (int t = 0; t < nthreads; t++) tasks[t] = (Task){fn, ctx, t, nthreads};
    int started = 0;
    for (int t = 1; t < nthreads; t++) {
        if (pthread_create(&ids[t], NULL, task_main, &tasks[t]) != 0) break;
        started = t;
    }
    for (int t = started + 1; t < nthreads; t++) fn(ctx, t, nthreads);
    fn(ctx, 0, nthreads);
    for (int t = 1; t <= started; t++) pthread_join(ids[t], NULL);
}
#endif

/* Run fn on nthreads threads (the calling one included). */
static void run_parallel(task_fn fn, void *ctx, int nthreads) {
    if (nthreads < 1) nthreads = 1;
    if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;
    if (nthreads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    run_team(fn, ctx, nthreads);
}

static inline void share(int64_t n, int thread, int nthreads, int64_t *lo, int64_t *hi) {
    *lo = n * thread / nthreads;
    *hi = n * (thread + 1) / nthreads;
}

#endif
