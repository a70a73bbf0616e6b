/* Native CPU dot interaction of DLRM, forward and backward, float32.
 *
 * No torch headers: Python passes tensors as addresses (tensor.data_ptr()) and sizes, every
 * tensor contiguous float32 (see ctrctl/modules/interaction.py, which checks that).
 *
 * For sample b there are n vectors of width D: v_0 = dense[b] when the model has dense input,
 * then the F pooled sparse embeddings sparse[b, f]. Forward writes
 *
 *     out[b] = [dense[b] (with dense input), v_i . v_j for i < j (row by row), zeros]
 *
 * up to out_stride columns. Backward, for G = d loss / d out and S the symmetric n x n
 * matrix with S[i][j] = S[j][i] = G at pair (i, j) and a zero diagonal:
 *
 *     d v_i = sum_j S[i][j] v_j        (+ G[b, :D] for v_0 = dense)
 *
 * Per sample the n vectors (27 x 64 floats = 6.9 KB for Criteo's DLRM) stay in L1. Forward
 * copies them once into a (D, n rounded up to L) block (L x L blocks transposed in
 * registers) and accumulates L columns of a row of the Gram matrix at a time by broadcast
 * multiply-adds, 8, 4, 2 or 1 rows at once (no horizontal sums; only columns right of the
 * diagonal are computed); backward accumulates L dims of d v_i at a time over
 * the vectors. L is the floats of one vector register: the loops (_interaction_loops.h)
 * are built for AVX-512 (16), AVX2 + FMA (8) and plain x86-64 or other CPUs (4), and the
 * widest the CPU runs is picked at import (its features, not its model). torch's bmm is
 * what this replaces: on CPU it runs 4,096 tiny GEMMs per batch and the gather,
 * concatenation and scatter around it each pass over memory again.
 *
 * The summation order differs from bmm's (and multiply-adds fuse where the CPU has FMA), so
 * results agree with torch to float32 rounding, not bitwise. Samples are split over threads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

#include "_native_threads.h"

typedef struct {
    int64_t B, F, D;
    const float *dense;  /* (B, D), or NULL without dense input */
    const float *sparse; /* (B, F, D) */
    float *out;          /* forward: (B, out_stride) */
    int64_t out_stride;
    const float *grad; /* backward: (B, grad_stride), laid out as out */
    int64_t grad_stride;
    float *grad_dense;  /* (B, D), or NULL */
    float *grad_sparse; /* (B, F, D) */
    int failed[MAX_THREADS];
} Interaction;

INLINE int64_t vectors(const Interaction *it) { return it->F + (it->dense != NULL); }

INLINE const float *vec(const Interaction *it, int64_t b, int64_t i) {
    if (it->dense) {
        if (i == 0) return it->dense + b * it->D;
        i -= 1;
    }
    return it->sparse + (b * it->F + i) * it->D;
}

/* Position of pair (i, i + 1) among the pairs of n vectors, row by row. */
INLINE int64_t row_start(int64_t i, int64_t n) { return i * n - i * (i + 1) / 2; }

/* Both directions ask for sample b + AHEAD's vectors (backward: and its gradient) while
 * working on sample b: measured about 8% off forward and 14% off backward at one thread
 * (asking for the lines backward will write as well was slower). */
#define AHEAD 2
INLINE void prefetch_block(const float *p, int64_t floats) {
    const char *c = (const char *)p;
    for (int64_t off = 0; off < floats * (int64_t)sizeof(float); off += 64)
        __builtin_prefetch(c + off, 0, 3);
}


/* ---- the loops, once per instruction set ------------------------------------------------ */

#ifdef X86_DISPATCH
#define LANES 16
#define NAME(x) x##_avx512
#define TARGET __attribute__((target("avx512f")))
#include "_interaction_loops.h"
#undef LANES
#undef NAME
#undef TARGET

#define LANES 8
#define NAME(x) x##_avx2
#define TARGET __attribute__((target("avx2,fma")))
#include "_interaction_loops.h"
#undef LANES
#undef NAME
#undef TARGET
#endif

/* Plain x86-64 (SSE2), and every other machine (NEON's registers hold four floats too). */
#define LANES 4
#define NAME(x) x##_base
#define TARGET
#include "_interaction_loops.h"
#undef LANES
#undef NAME
#undef TARGET

typedef struct {
    const char *name, *describe;
    task_fn forward, backward;
    int (*supported)(void);
} Loops;


/* Widest first. */
static const Loops LOOPS[] = {
#ifdef X86_DISPATCH
    {"avx512f", "avx512f (16 floats)", forward_task_avx512, backward_task_avx512, has_avx512},
    {"avx2", "avx2+fma (8 floats)", forward_task_avx2, backward_task_avx2, has_avx2},
#endif
    {"base", "baseline (4 floats)", forward_task_base, backward_task_base, always},
};
#define NUM_LOOPS (sizeof LOOPS / sizeof LOOPS[0])

static const Loops *loops = &LOOPS[NUM_LOOPS - 1];

LOOPS_BINDINGS("interaction")

static int run(task_fn fn, Interaction *it, int nthreads) {
    if (nthreads > it->B) nthreads = (int)(it->B > 0 ? it->B : 1);
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    run_parallel(fn, it, nthreads);
    Py_END_ALLOW_THREADS
    for (int t = 0; t < MAX_THREADS; t++) failed |= it->failed[t];
    if (failed) PyErr_NoMemory();
    return failed;
}

/* The sizes and inputs both directions share; width: out_stride (forward) or grad_stride
 * (backward), which must hold [dense, pairs]. 0, or -1 with a ValueError set. */
static int prepare(Interaction *it, long long B, long long F, long long D, long long dense,
                   long long sparse, long long width, const char *what) {
    const long long n = F + (dense != 0);
    if (B < 0 || F < 1 || D <= 0 || n < 2 || width < (dense ? D : 0) + n * (n - 1) / 2) {
        PyErr_Format(PyExc_ValueError, "interaction: bad sizes, or %s narrower than its pairs",
                     what);
        return -1;
    }
    memset(it, 0, sizeof *it);
    it->B = B, it->F = F, it->D = D;
    it->dense = (const float *)(intptr_t)dense;
    it->sparse = (const float *)(intptr_t)sparse;
    return 0;
}

static PyObject *py_forward(PyObject *self, PyObject *args) {
    (void)self;
    long long B, F, D, dense, sparse, out, out_stride;
    int nthreads;
    Interaction it;
    if (!PyArg_ParseTuple(args, "LLLLLLLi", &B, &F, &D, &dense, &sparse, &out, &out_stride,
                          &nthreads) ||
        prepare(&it, B, F, D, dense, sparse, out_stride, "output"))
        return NULL;
    it.out = (float *)(intptr_t)out;
    it.out_stride = out_stride;
    if (run(loops->forward, &it, nthreads)) return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_backward(PyObject *self, PyObject *args) {
    (void)self;
    long long B, F, D, dense, sparse, grad, grad_stride, grad_dense, grad_sparse;
    int nthreads;
    Interaction it;
    if (!PyArg_ParseTuple(args, "LLLLLLLLLi", &B, &F, &D, &dense, &sparse, &grad, &grad_stride,
                          &grad_dense, &grad_sparse, &nthreads) ||
        prepare(&it, B, F, D, dense, sparse, grad_stride, "gradient"))
        return NULL;
    if (dense && !grad_dense) {
        PyErr_SetString(PyExc_ValueError, "interaction: no buffer for the dense gradient");
        return NULL;
    }
    it.grad = (const float *)(intptr_t)grad;
    it.grad_stride = grad_stride;
    it.grad_dense = (float *)(intptr_t)grad_dense;
    it.grad_sparse = (float *)(intptr_t)grad_sparse;
    if (run(loops->backward, &it, nthreads)) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"forward", py_forward, METH_VARARGS, "[dense, pairwise dots, zeros] per sample."},
    {"isa", py_isa, METH_NOARGS, "The instruction set of the loops in use."},
    {"use", py_use, METH_VARARGS, "Use the loops named (avx512f, avx2, base) if the CPU can."},
    {"backward", py_backward, METH_VARARGS, "Gradients of dense and sparse; see the source."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_interaction_kernel",
                                    "Native CPU dot interaction of DLRM.", -1, methods, NULL,
                                    NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__interaction_kernel(void) {
    choose_loops();
    return PyModule_Create(&module);
}
