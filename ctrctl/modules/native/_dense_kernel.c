/* Native CPU GEMM for the MLPs' linear layers, float32, with the layers' epilogues fused.
 *
 * No torch headers: Python passes tensors as addresses (tensor.data_ptr()) and strides (see
 * ctrctl/modules/mlp.py, which composes a layer's forward and backward from it):
 *
 *     C (M x N, contiguous) = A' B [+ bias, then ReLU]
 *
 * with A(i, k) = a[i * a_row + k * a_col], B(k, j) = b[k * b_row + j * b_col], and A' = A
 * where mask(i, k) > 0 and 0 elsewhere (mask laid out as A: the ReLU's backward on the
 * output gradient); with row_sums, row_sums[i] += sum_k A'(i, k) as well (a bias gradient).
 * Forward of a layer is x W^T + b then ReLU; backward is dx = g W and dW = g^T x for the
 * masked output gradient g, whose column sums are db.
 *
 * Why: on AMD's CPUs torch's float32 matmul (Intel's MKL) runs at 40-55% of the FMA peak on
 * these shapes (measured on a Zen 3 EPYC: 36-42 GFLOP/s of 87 on one core; this GEMM 55-70%),
 * and on AMD's CPUs with AVX-512 it runs AVX2 code (on a Zen 5 EPYC: 95 GFLOP/s, where the
 * core's AVX-512 FMA peak is 248 and this GEMM's AVX-512 build reaches 180-200). On Intel's
 * CPUs MKL is faster, and the MLPs keep it (ctrctl/modules/mlp.py).
 *
 * The algorithm is the classic blocked one (Goto's, as in BLIS): for NC columns of C at a
 * time, for KC of the inner dimension at a time, B's KC x NC block is packed into NR-column
 * strips (L2/L3); for MC rows at a time, A's MC x KC block is packed into MR-row strips (L2);
 * each MR x NR tile of C is then one strip of A times one strip of B, accumulated in
 * registers (8 x 32 floats with AVX-512: sixteen 16-float vectors; 4 x 24 with AVX2: twelve
 * 8-float vectors) over KC by broadcast multiply-adds, and
 * added to C. The bias and the ReLU are applied when a tile's last KC block is added, so
 * the output is written once more per extra KC block, never read again for them.
 *
 * Threads split C's rows (in whole strips); when the inner dimension is longer than C is
 * tall (dW = g^T x: 512 rows, a batch of 4096 to sum over), they split the inner dimension
 * instead, each summing its share into memory of its own, added into C at the end (the bias
 * and ReLU are never asked for there). Summation order differs from MKL's, and
 * multiply-adds fuse where the CPU has FMA: results agree with torch to float32 rounding.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

#include "_native_threads.h"

/* The largest blocks a build packs (its MR x NR tiles and KC, MC are set where it is
 * included; NC is every build's). */
#define PACK_MC 192
#define PACK_KC 384
#define PACK_NR 64
#define NC 2048
#define MIN_WORK (1 << 21) /* multiply-adds per thread: about 0.05 ms */

typedef struct {
    int64_t M, N, K;
    const float *a, *mask;
    int64_t a_row, a_col;
    const float *b;
    int64_t b_row, b_col;
    float *c;
    const float *bias;
    int relu;
    float *row_sums;
    int split_k;
    float *partial, *partial_sums; /* split_k: threads 1.. sum into these */
    int failed[MAX_THREADS];
} Gemm;

/* Each thread's packed blocks, kept for the thread's life (the OpenMP runtime's threads
 * live as long as the process): a fresh megabyte per call would be fresh pages each time. */
typedef struct {
    float *a, *b;
    int64_t b_floats;
} Packs;

static __thread Packs packs_of_thread;

static Packs *thread_packs(int64_t N) {
    Packs *p = &packs_of_thread;
    /* Columns rounded up to whole strips of any build's width. */
    const int64_t cols = ((N < NC ? N : NC) + PACK_NR - 1) / PACK_NR * PACK_NR + PACK_NR;
    if (!p->a) {
        p->a = aligned_alloc(64, PACK_MC * PACK_KC * sizeof(float));
        if (!p->a) return NULL;
    }
    if (p->b_floats < PACK_KC * cols) {
        free(p->b);
        p->b = aligned_alloc(64, PACK_KC * cols * sizeof(float));
        p->b_floats = p->b ? PACK_KC * cols : 0;
        if (!p->b) return NULL;
    }
    return p;
}

/* The calling thread's blocks, freed: for the threads of the build without OpenMP, which
 * start and end with each call (OpenMP's live on, and keep theirs). */
static void release_thread_packs(void) {
#ifndef _OPENMP
    Packs *p = &packs_of_thread;
    free(p->a);
    free(p->b);
    memset(p, 0, sizeof *p);
#endif
}

/* ---- the loops, once per instruction set ------------------------------------------------ */

#ifdef X86_DISPATCH
/* AVX-512: 8 x 32 tiles, sixteen 16-float accumulators. */
#define NAME(x) x##_avx512
#define TARGET __attribute__((target("avx512f,fma")))
#define VEC 16
#define MR 8
#define NV 2
#include "_dense_loops.h"
#undef NAME
#undef TARGET

/* AVX2 + FMA: the header's 4 x 24 tiles, twelve 8-float accumulators. */
#define NAME(x) x##_avx2
#define TARGET __attribute__((target("avx2,fma")))
#include "_dense_loops.h"
#undef NAME
#undef TARGET
#endif

/* Plain x86-64 (SSE2), and every other machine: the same tiles. */
#define NAME(x) x##_base
#define TARGET
#include "_dense_loops.h"
#undef NAME
#undef TARGET

typedef struct {
    const char *name, *describe;
    task_fn gemm;
    int (*supported)(void);
    int mr; /* rows of a tile */
} Loops;


static const Loops LOOPS[] = {
#ifdef X86_DISPATCH
    {"avx512f", "avx512f (8 x 32 tiles)", gemm_task_avx512, has_avx512, 8},
    {"avx2", "avx2+fma (4 x 24 tiles)", gemm_task_avx2, has_avx2, 4},
#endif
    {"base", "baseline (4 x 24 tiles)", gemm_task_base, always, 4},
};
#define NUM_LOOPS (sizeof LOOPS / sizeof LOOPS[0])

static const Loops *loops = &LOOPS[NUM_LOOPS - 1];

LOOPS_BINDINGS("dense gemm")

/* The calling thread's memory for the other threads' partial sums (split_k). */
static __thread float *partial_of_thread;
static __thread int64_t partial_floats;

static float *partial_memory(int64_t floats) {
    if (partial_floats < floats) {
        free(partial_of_thread);
        partial_of_thread = malloc(floats * sizeof(float));
        partial_floats = partial_of_thread ? floats : 0;
    }
    return partial_of_thread;
}

/* gemm(M, N, K, a, a_row, a_col, mask, b, b_row, b_col, c, bias, relu, row_sums, nthreads):
 * addresses as ints, 0 for none (mask, bias, row_sums). */
static PyObject *py_gemm(PyObject *self, PyObject *args) {
    (void)self;
    long long M, N, K, a, a_row, a_col, mask, b, b_row, b_col, c, bias, row_sums;
    int relu, nthreads;
    if (!PyArg_ParseTuple(args, "LLLLLLLLLLLLiLi", &M, &N, &K, &a, &a_row, &a_col, &mask, &b,
                          &b_row, &b_col, &c, &bias, &relu, &row_sums, &nthreads))
        return NULL;
    if (M < 0 || N < 0 || K < 0 || !c || (K > 0 && (!a || !b))) {
        PyErr_SetString(PyExc_ValueError, "dense gemm: negative sizes or a missing operand");
        return NULL;
    }
    Gemm g;
    memset(&g, 0, sizeof g);
    g.M = M, g.N = N, g.K = K;
    g.a = (const float *)(intptr_t)a, g.a_row = a_row, g.a_col = a_col;
    g.mask = (const float *)(intptr_t)mask;
    g.b = (const float *)(intptr_t)b, g.b_row = b_row, g.b_col = b_col;
    g.c = (float *)(intptr_t)c;
    g.bias = (const float *)(intptr_t)bias;
    g.relu = relu;
    g.row_sums = (float *)(intptr_t)row_sums;
    if (M == 0 || N == 0) Py_RETURN_NONE;

    if (nthreads < 1) nthreads = 1;
    if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;
    /* A thread per MIN_WORK multiply-adds at most: waking a team costs more than a small
     * product (and spins against other processes' threads on a shared machine). */
    const double work = (double)M * (double)N * (double)K;
    if (work < (double)nthreads * MIN_WORK)
        nthreads = work < 2.0 * MIN_WORK ? 1 : (int)(work / MIN_WORK);
    /* Enough rows for every thread a few strips, or else the inner dimension is split. */
    const int64_t mr = loops->mr;
    g.split_k = nthreads > 1 && K > M && M < (int64_t)nthreads * mr * 16 && !g.bias && !g.relu;
    if (!g.split_k && nthreads > (M + mr - 1) / mr) nthreads = (int)((M + mr - 1) / mr);
    if (g.split_k) {
        const int64_t floats = (nthreads - 1) * M * (N + (g.row_sums ? 1 : 0));
        float *memory = partial_memory(floats);
        if (!memory) return PyErr_NoMemory();
        g.partial = memory;
        g.partial_sums = memory + (nthreads - 1) * M * N;
    }
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    run_parallel(loops->gemm, &g, nthreads);
    if (g.split_k) {
        for (int t = 1; t < nthreads; t++) {
            const float *part = g.partial + (int64_t)(t - 1) * M * N;
            for (int64_t i = 0; i < M * N; i++) g.c[i] += part[i];
            if (g.row_sums)
                for (int64_t i = 0; i < M; i++) g.row_sums[i] += g.partial_sums[(t - 1) * M + i];
        }
    }
    Py_END_ALLOW_THREADS
    for (int t = 0; t < MAX_THREADS; t++) failed |= g.failed[t];
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* Whether this GEMM is the faster one here: an AMD CPU with AVX2 and FMA (measured on a
 * Zen 3 EPYC: MKL's sgemm reaches about half the core's FMA peak there, this GEMM 60-70%;
 * on a Zen 5 EPYC this GEMM's AVX-512 build is twice MKL's speed; on Intel's CPUs the
 * AVX2 build measured slower than MKL, and the AVX-512 build is unmeasured there). */
static PyObject *py_preferred(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
#ifdef X86_DISPATCH
    if (__builtin_cpu_is("amd") && has_avx2()) Py_RETURN_TRUE;
#endif
    Py_RETURN_FALSE;
}

static PyMethodDef methods[] = {
    {"gemm", py_gemm, METH_VARARGS, "C = mask(A) B [+ bias, ReLU]; see the source."},
    {"isa", py_isa, METH_NOARGS, "The instruction set of the loops in use."},
    {"use", py_use, METH_VARARGS, "Use the loops named (avx512f, avx2, base) if the CPU can."},
    {"preferred", py_preferred, METH_NOARGS, "Whether this GEMM is the faster one here."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_dense_kernel",
                                    "Native CPU GEMM for the MLPs.", -1, methods, NULL,
                                    NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__dense_kernel(void) {
    choose_loops();
    return PyModule_Create(&module);
}
