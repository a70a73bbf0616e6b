/* Native CPU table-batched embedding bags: pooled lookup, and a backward that fuses the
 * optimizer update (exact SGD, exact Adagrad, exact row-wise Adagrad).
 *
 * No torch headers: Python passes tensors as addresses (tensor.data_ptr()) and sizes, every
 * tensor contiguous and of the dtype named below. Batch layout (TBE): F features of B bags
 * each, bag k = f * B + b holds ids indices[offsets[k] .. offsets[k + 1]).
 *
 * Per feature f (int64 arrays of length F):
 *   weights[f]  address of row 0 of f's table (float32, rows[f] x dims[f], row-major)
 *   states[f]   address of f's optimizer state (float32: rows[f] for row-wise Adagrad,
 *               rows[f] x dims[f] for Adagrad, unused for SGD)
 *   dims[f]     embedding dim; rows[f] table rows
 *   cols[f]     first output column of f (output is B x out_stride, float32)
 *   keys[f]     first key of f's table in one numbering of all rows of all tables
 *               (features of one table share it): keys[f] + id names a row everywhere.
 *
 * forward(...)  -> -1; the position of the first id outside its table; or -2 when offsets
 *                  decrease (the caller raises on either).
 * workspace_size(n) -> bytes of scratch that backward needs for n ids (it allocates its own
 *                  when the caller passes less).
 * backward(...) sums the gradient of each distinct row over every bag and feature that
 *               looked it up (a stable radix sort by key keeps the ids' order, so repeated
 *               ids are summed in the order the plain-torch reference's index_add_ sums
 *               them; each feature's ids on their own where no table has two features),
 *               then updates each row once. With per-sample weights it also returns
 *               d loss / d weight per id, from the weights before the update.
 *
 * Threads: as many as the caller says (torch.get_num_threads()), torch's own OpenMP threads
 * where the build has OpenMP, pthreads per call elsewhere (_native_threads.h). Forward splits
 * the batch by samples, the per-feature sorts by feature, the update by distinct rows (each
 * row belongs to one thread, so no locks). The GIL is released while working.
 *
 * The inner loops are built for AVX-512, AVX2+FMA and plain x86-64 (GCC/Clang target_clones:
 * the loader picks one for this CPU at import); other machines build the portable loops.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_native_threads.h"

enum { OPT_SGD = 0, OPT_ADAGRAD = 1, OPT_ROWWISE_ADAGRAD = 2 };
enum { WD_NONE = 0, WD_L2 = 1, WD_DECOUPLED = 2 };

typedef struct {
    int64_t F, B;
    const int64_t *indices, *offsets;
    const float *psw; /* per-sample weights or NULL */
    const int64_t *weights, *states, *dims, *rows, *cols, *keys;
    int mean;
} Batch;

/* ---- forward ----------------------------------------------------------------------------- */

typedef struct {
    const Batch *batch;
    float *out;
    int64_t out_stride;
    int64_t bad[MAX_THREADS]; /* first bad id position per thread, -1 if none */
    int decreasing[MAX_THREADS]; /* a bag whose end is before its start */
} Forward;

/* The build turns off floating-point contraction (-ffp-contract=off), so every operation
 * rounds where the plain-torch reference rounds; the one place torch fuses (its weighted
 * embedding_bag runs FBGEMM's FMA kernel) fuses here explicitly. */
INLINE void fma_into(float *restrict y, const float *restrict x, float a, int64_t n) {
    for (int64_t j = 0; j < n; j++) y[j] = fmaf(a, x[j], y[j]);
}

INLINE void axpy(float *restrict y, const float *restrict x, float a, int64_t n) {
    for (int64_t j = 0; j < n; j++) y[j] += a * x[j];
}

INLINE void add(float *restrict y, const float *restrict x, int64_t n) {
    for (int64_t j = 0; j < n; j++) y[j] += x[j];
}

/* Rows are read at random from tables far larger than the caches, and nothing in a row's
 * address is predictable to the hardware prefetcher: the loops ask for rows before they
 * need them, so the misses overlap. Forward: the rows of the next sample's bag of the same
 * feature, into L2; the update: the weight row, the row's state and the gradient rows of
 * the ids PREFETCH_IDS ahead. Measured on bench_train's 26 x 100k x 64 at one thread, on
 * huge pages: lookup 8.3-8.6 -> 6.5-6.8 ms, update 22.6 -> 10.7-12.5 ms (without huge pages
 * the lookup's prefetch gained nothing: page walks were the limit). */
#define PREFETCH_IDS 16
enum { PREFETCH_READ, PREFETCH_WRITE };
/* Into L2 (prefetcht2 / prefetchw): into L1 the update was 10-18% slower, its 16 ids x 9 lines
 * ahead being more than L1's fill buffers hold. */
INLINE void prefetch_row(const void *p, int64_t bytes, int mode) {
    const char *c = (const char *)p;
    for (int64_t off = 0; off < bytes; off += 64) {
        if (mode == PREFETCH_WRITE)
            __builtin_prefetch(c + off, 1, 1);
        else
            __builtin_prefetch(c + off, 0, 1);
    }
}

CLONES static void forward_task(void *arg, int thread, int nthreads) {
    Forward *fw = (Forward *)arg;
    const Batch *bt = fw->batch;
    int64_t b0, b1, bad = -1;
    share(bt->B, thread, nthreads, &b0, &b1);
    for (int64_t b = b0; b < b1; b++) {
        float *out_row = fw->out + b * fw->out_stride;
        for (int64_t f = 0; f < bt->F; f++) {
            const int64_t D = bt->dims[f], rows = bt->rows[f];
            const float *W = (const float *)(intptr_t)bt->weights[f];
            float *restrict o = out_row + bt->cols[f];
            const int64_t k = f * bt->B + b;
            const int64_t s = bt->offsets[k], e = bt->offsets[k + 1];
            if (b + 1 < b1) /* the next sample's rows of this table, into L2 */
                for (int64_t i = bt->offsets[k + 1]; i < bt->offsets[k + 2]; i++) {
                    const int64_t id = bt->indices[i];
                    if (id >= 0 && id < rows) prefetch_row(W + id * D, D * 4, PREFETCH_READ);
                }
            memset(o, 0, (size_t)D * sizeof(float));
            if (e < s) fw->decreasing[thread] = 1;
            for (int64_t i = s; i < e; i++) {
                const int64_t id = bt->indices[i];
                if (id < 0 || id >= rows) {
                    if (bad < 0 || i < bad) bad = i;
                    continue;
                }
                if (bt->psw)
                    fma_into(o, W + id * D, bt->psw[i], D);
                else
                    add(o, W + id * D, D);
            }
            if (bt->mean && e > s) {
                const float len = (float)(e - s);
                for (int64_t j = 0; j < D; j++) o[j] /= len;
            }
        }
    }
    fw->bad[thread] = bad;
}

/* ---- backward ---------------------------------------------------------------------------- */

typedef struct {
    const Batch *batch;
    const float *grad; /* B x grad_stride */
    int64_t grad_stride;
    float *grad_psw; /* per id, or NULL */
    int64_t n;       /* ids */
    int64_t *key, *pos, *key_tmp, *pos_tmp;
    int32_t *feature_of; /* per id: its feature */
    int64_t *bag_of;     /* per id: its sample b */
    int kind, wd_mode;
    float lr, eps, wd;
    int64_t max_dim;
    int failed[MAX_THREADS];
} Backward;

/* Pass 1, by bags: each id's key, feature and sample, and the per-sample-weight gradient
 * (taken before any row changes). */
CLONES static void keys_task(void *arg, int thread, int nthreads) {
    Backward *bw = (Backward *)arg;
    const Batch *bt = bw->batch;
    const int64_t bags = bt->F * bt->B;
    int64_t k0, k1;
    share(bags, thread, nthreads, &k0, &k1);
    for (int64_t k = k0; k < k1; k++) {
        const int64_t f = k / bt->B, b = k % bt->B;
        const int64_t s = bt->offsets[k], e = bt->offsets[k + 1];
        const int64_t D = bt->dims[f];
        const float *g = bw->grad + b * bw->grad_stride + bt->cols[f];
        const float *W = (const float *)(intptr_t)bt->weights[f];
        const float len = (float)(e - s);
        for (int64_t i = s; i < e; i++) {
            const int64_t id = bt->indices[i];
            bw->key[i] = bt->keys[f] + id;
            bw->pos[i] = i;
            bw->feature_of[i] = (int32_t)f;
            bw->bag_of[i] = b;
            if (bw->grad_psw) {
                const float *w = W + id * D;
                float acc[16] = {0};
                int64_t j = 0;
                if (bt->mean) {
                    for (; j + 16 <= D; j += 16)
                        for (int l = 0; l < 16; l++) acc[l] += (g[j + l] / len) * w[j + l];
                    for (; j < D; j++) acc[0] += (g[j] / len) * w[j];
                } else {
                    for (; j + 16 <= D; j += 16)
                        for (int l = 0; l < 16; l++) acc[l] += g[j + l] * w[j + l];
                    for (; j < D; j++) acc[0] += g[j] * w[j];
                }
                float total = 0.0f;
                for (int l = 0; l < 16; l++) total += acc[l];
                bw->grad_psw[i] = total;
            }
        }
    }
}

/* Stable LSD radix sort by key of the (key, pos) pairs in [s, e), whose keys lie in
 * [base, base + span): digits of up to 11 bits, as few passes as the span needs; the result
 * ends in key/pos (key_tmp/pos_tmp are the other buffer). count: 2^11 int64s of scratch.
 * Returns 1 when a key was outside the span (the result is then not sorted). */
static int sort_keys(Backward *bw, int64_t s, int64_t e, int64_t base, int64_t span,
                     int64_t *count) {
    int bits = 0;
    while (bits < 63 && ((span - 1) >> bits) > 0) bits++;
    if (bits == 0 || e - s < 2) return 0; /* one key, or fewer than two pairs: in order */
    const int passes = (bits + 10) / 11, digit = (bits + passes - 1) / passes;
    const int64_t buckets = (int64_t)1 << digit;
    int64_t *src_k = bw->key + s, *src_p = bw->pos + s;
    int64_t *dst_k = bw->key_tmp + s, *dst_p = bw->pos_tmp + s;
    const int64_t n = e - s;
    for (int p = 0; p < passes; p++) {
        const int shift = p * digit;
        memset(count, 0, sizeof(int64_t) * (size_t)buckets);
        for (int64_t i = 0; i < n; i++) count[((src_k[i] - base) >> shift) & (buckets - 1)]++;
        int64_t sum = 0;
        for (int64_t d = 0; d < buckets; d++) {
            const int64_t c = count[d];
            count[d] = sum;
            sum += c;
        }
        for (int64_t i = 0; i < n; i++) {
            const int64_t at = count[((src_k[i] - base) >> shift) & (buckets - 1)]++;
            dst_k[at] = src_k[i];
            dst_p[at] = src_p[i];
        }
        int64_t *t = src_k; src_k = dst_k; dst_k = t;
        t = src_p; src_p = dst_p; dst_p = t;
    }
    if (src_k != bw->key + s) {
        memcpy(bw->key + s, src_k, sizeof(int64_t) * (size_t)n);
        memcpy(bw->pos + s, src_p, sizeof(int64_t) * (size_t)n);
    }
    for (int64_t i = s + 1; i < e; i++)
        if (bw->key[i] < bw->key[i - 1]) return 1;
    return 0;
}

static int compare_keys(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Where every table is looked up by one feature (no two features share a key base), the ids
 * of feature f are the contiguous block offsets[f * B] .. offsets[(f + 1) * B] and their
 * keys the range keys[f] .. keys[f] + rows[f]: no key is in two blocks, so sorting each block
 * by id groups every row's ids as the whole sort does, in the same (stable) order. The
 * blocks are sorted in parallel, each within itself (a few KB to MB: its buckets stay in the
 * caches, where one sort of all ids scattered into 2,048 buckets over the whole array), with
 * digits of up to 11 bits, as few passes as the table's row count needs. */
/* No two features share a key base (O(F log F) on a copy; no memory: the whole sort). */
static int tables_have_one_feature(const Batch *bt) {
    int64_t *sorted = (int64_t *)malloc(sizeof(int64_t) * (size_t)(bt->F > 0 ? bt->F : 1));
    if (!sorted) return 0;
    memcpy(sorted, bt->keys, sizeof(int64_t) * (size_t)bt->F);
    qsort(sorted, (size_t)bt->F, sizeof(int64_t), compare_keys);
    int one = 1;
    for (int64_t f = 1; f < bt->F && one; f++) one = sorted[f] != sorted[f - 1];
    free(sorted);
    return one;
}

typedef struct {
    Backward *bw;
    int64_t next; /* the next feature block a thread takes (atomic) */
} BlockSort;

static void block_sort_task(void *arg, int thread, int nthreads) {
    (void)nthreads;
    BlockSort *bs = (BlockSort *)arg;
    Backward *bw = bs->bw;
    const Batch *bt = bw->batch;
    int64_t *count = (int64_t *)malloc(sizeof(int64_t) << 11);
    if (!count) {
        bw->failed[thread] = 1;
        return;
    }
    for (;;) {
        const int64_t f = __atomic_fetch_add(&bs->next, 1, __ATOMIC_RELAXED);
        if (f >= bt->F) break;
        if (sort_keys(bw, bt->offsets[f * bt->B], bt->offsets[(f + 1) * bt->B], bt->keys[f],
                      bt->rows[f], count))
            bw->failed[thread] = 2;
    }
    free(count);
}

INLINE void update_row(const Backward *bw, float *restrict w, float *restrict state,
                       const float *restrict g, int64_t D) {
    const float lr = bw->lr, eps = bw->eps;
    if (bw->kind == OPT_SGD) {
        for (int64_t j = 0; j < D; j++) w[j] -= lr * g[j];
    } else if (bw->kind == OPT_ADAGRAD) {
        for (int64_t j = 0; j < D; j++) {
            const float acc = state[j] + g[j] * g[j];
            state[j] = acc;
            w[j] -= lr * g[j] / (sqrtf(acc) + eps);
        }
    } else {
        const float wd = bw->wd;
        float acc[16] = {0};
        int64_t j = 0;
        if (bw->wd_mode == WD_L2) {
            for (; j + 16 <= D; j += 16)
                for (int l = 0; l < 16; l++) {
                    const float d = g[j + l] + wd * w[j + l];
                    acc[l] += d * d;
                }
            for (; j < D; j++) {
                const float d = g[j] + wd * w[j];
                acc[0] += d * d;
            }
        } else {
            for (; j + 16 <= D; j += 16)
                for (int l = 0; l < 16; l++) acc[l] += g[j + l] * g[j + l];
            for (; j < D; j++) acc[0] += g[j] * g[j];
        }
        float total = 0.0f;
        for (int l = 0; l < 16; l++) total += acc[l];
        const float sum = state[0] + total / (float)D;
        state[0] = sum;
        const float m = lr / (sqrtf(sum) + eps);
        const float c = bw->wd_mode == WD_L2 ? 1.0f - m * wd
                        : bw->wd_mode == WD_DECOUPLED ? 1.0f - lr * wd
                                                      : 1.0f;
        if (c == 1.0f)
            for (int64_t i = 0; i < D; i++) w[i] -= m * g[i];
        else
            for (int64_t i = 0; i < D; i++) w[i] = c * w[i] - m * g[i];
    }
}

/* Pass 2, by distinct rows: a thread owns the runs of equal keys that start in its share. */
CLONES static void update_task(void *arg, int thread, int nthreads) {
    Backward *bw = (Backward *)arg;
    const Batch *bt = bw->batch;
    const int64_t n = bw->n;
    const int64_t *key = bw->key, *pos = bw->pos;
    int64_t lo, hi;
    share(n, thread, nthreads, &lo, &hi);
    while (lo < n && lo > 0 && key[lo] == key[lo - 1]) lo++;
    while (hi < n && hi > 0 && key[hi] == key[hi - 1]) hi++;
    float *g = (float *)malloc(sizeof(float) * (size_t)(bw->max_dim > 0 ? bw->max_dim : 1));
    if (!g) {
        bw->failed[thread] = 1;
        return;
    }
    int64_t i = lo, ahead = lo;
    while (i < hi) {
        /* the rows of the ids PREFETCH_IDS ahead (a repeated key's weights only once) */
        for (; ahead < hi && ahead < i + PREFETCH_IDS; ahead++) {
            const int64_t p = pos[ahead], f = bw->feature_of[p], D = bt->dims[f];
            const int64_t id = key[ahead] - bt->keys[f];
            prefetch_row(bw->grad + bw->bag_of[p] * bw->grad_stride + bt->cols[f], D * 4,
                         PREFETCH_READ);
            if (ahead > lo && key[ahead] == key[ahead - 1]) continue;
            prefetch_row((const float *)(intptr_t)bt->weights[f] + id * D, D * 4,
                         PREFETCH_WRITE);
            if (bw->kind == OPT_ADAGRAD)
                prefetch_row((const float *)(intptr_t)bt->states[f] + id * D, D * 4,
                             PREFETCH_WRITE);
            if (bw->kind == OPT_ROWWISE_ADAGRAD)
                __builtin_prefetch((const float *)(intptr_t)bt->states[f] + id, 1, 3);
        }
        const int64_t k = key[i];
        const int64_t f0 = bw->feature_of[pos[i]];
        const int64_t D = bt->dims[f0];
        memset(g, 0, sizeof(float) * (size_t)D);
        for (; i < hi && key[i] == k; i++) {
            const int64_t p = pos[i];
            const int64_t f = bw->feature_of[p], b = bw->bag_of[p];
            const float *src = bw->grad + b * bw->grad_stride + bt->cols[f];
            if (bt->mean) {
                const int64_t bag = f * bt->B + b;
                const float len = (float)(bt->offsets[bag + 1] - bt->offsets[bag]);
                const float a = bt->psw ? bt->psw[p] : 1.0f;
                for (int64_t j = 0; j < D; j++) g[j] += (src[j] / len) * a;
            } else if (bt->psw) {
                axpy(g, src, bt->psw[p], D);
            } else {
                add(g, src, D);
            }
        }
        const int64_t id = k - bt->keys[f0];
        float *w = (float *)(intptr_t)bt->weights[f0] + id * D;
        float *state = NULL;
        if (bw->kind == OPT_ADAGRAD) state = (float *)(intptr_t)bt->states[f0] + id * D;
        if (bw->kind == OPT_ROWWISE_ADAGRAD) state = (float *)(intptr_t)bt->states[f0] + id;
        update_row(bw, w, state, g, D);
    }
    free(g);
}

/* ---- Python bindings ---------------------------------------------------------------------- */

static int parse_batch(Batch *bt, long long F, long long B, long long indices, long long offsets,
                       long long psw, long long weights, long long states, long long dims,
                       long long rows, long long cols, long long keys, int mean) {
    if (F < 0 || B < 0) {
        PyErr_SetString(PyExc_ValueError, "negative feature or batch count");
        return -1;
    }
    *bt = (Batch){F, B, (const int64_t *)(intptr_t)indices, (const int64_t *)(intptr_t)offsets,
                  (const float *)(intptr_t)psw, (const int64_t *)(intptr_t)weights,
                  (const int64_t *)(intptr_t)states, (const int64_t *)(intptr_t)dims,
                  (const int64_t *)(intptr_t)rows, (const int64_t *)(intptr_t)cols,
                  (const int64_t *)(intptr_t)keys, mean};
    return 0;
}

static PyObject *py_forward(PyObject *self, PyObject *args) {
    (void)self;
    long long F, B, indices, offsets, psw, weights, dims, rows, cols, out, out_stride;
    int mean, nthreads;
    if (!PyArg_ParseTuple(args, "LLLLLLLLLLLii", &F, &B, &indices, &offsets, &psw, &weights,
                          &dims, &rows, &cols, &out, &out_stride, &mean, &nthreads))
        return NULL;
    Batch bt;
    if (parse_batch(&bt, F, B, indices, offsets, psw, weights, 0, dims, rows, cols, 0, mean))
        return NULL;
    Forward fw = {&bt, (float *)(intptr_t)out, out_stride, {0}, {0}};
    if (nthreads > B) nthreads = (int)(B > 0 ? B : 1);
    for (int t = 0; t < MAX_THREADS; t++) fw.bad[t] = -1;
    Py_BEGIN_ALLOW_THREADS
    run_parallel(forward_task, &fw, nthreads);
    Py_END_ALLOW_THREADS
    int64_t bad = -1;
    for (int t = 0; t < MAX_THREADS; t++)
        if (fw.bad[t] >= 0 && (bad < 0 || fw.bad[t] < bad)) bad = fw.bad[t];
    for (int t = 0; t < MAX_THREADS; t++)
        if (fw.decreasing[t]) bad = -2;
    return PyLong_FromLongLong(bad);
}

static PyObject *py_backward(PyObject *self, PyObject *args) {
    (void)self;
    long long F, B, indices, offsets, psw, weights, states, dims, rows, cols, keys, grad,
        grad_stride, grad_psw, max_key, max_dim, workspace, workspace_bytes;
    int mean, kind, wd_mode, nthreads;
    float lr, eps, wd;
    if (!PyArg_ParseTuple(args, "LLLLLLLLLLLLLLLLiifffiiLL", &F, &B, &indices, &offsets, &psw,
                          &weights, &states, &dims, &rows, &cols, &keys, &grad, &grad_stride,
                          &grad_psw, &max_key, &max_dim, &mean, &kind, &lr, &eps, &wd,
                          &wd_mode, &nthreads, &workspace, &workspace_bytes))
        return NULL;
    if (kind < OPT_SGD || kind > OPT_ROWWISE_ADAGRAD || wd_mode < WD_NONE ||
        wd_mode > WD_DECOUPLED) {
        PyErr_SetString(PyExc_ValueError, "unknown optimizer or weight decay mode");
        return NULL;
    }
    Batch bt;
    if (parse_batch(&bt, F, B, indices, offsets, psw, weights, states, dims, rows, cols, keys,
                    mean))
        return NULL;
    const int64_t n = F * B > 0 ? bt.offsets[F * B] - bt.offsets[0] : 0;
    if (n <= 0) Py_RETURN_NONE;
    if (bt.offsets[0] != 0) {
        PyErr_SetString(PyExc_ValueError, "offsets must start at 0");
        return NULL;
    }
    Backward bw = {0};
    bw.batch = &bt;
    bw.grad = (const float *)(intptr_t)grad;
    bw.grad_stride = grad_stride;
    bw.grad_psw = (float *)(intptr_t)grad_psw;
    bw.n = n;
    bw.kind = kind;
    bw.wd_mode = wd_mode;
    bw.lr = lr;
    bw.eps = eps;
    bw.wd = wd;
    bw.max_dim = max_dim;
    /* The caller's workspace when it is large enough (kept between calls: no page faults
     * on fresh memory every step), else our own. */
    const long long needed = (long long)n * (5 * sizeof(int64_t) + sizeof(int32_t));
    int own = workspace == 0 || workspace_bytes < needed;
    int64_t *block = own ? (int64_t *)malloc((size_t)needed) : (int64_t *)(intptr_t)workspace;
    if (!block) return PyErr_NoMemory();
    int32_t *features = (int32_t *)(block + 5 * n);
    bw.key = block;
    bw.pos = block + n;
    bw.key_tmp = block + 2 * n;
    bw.pos_tmp = block + 3 * n;
    bw.bag_of = block + 4 * n;
    bw.feature_of = features;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t bags = F * B;
    run_parallel(keys_task, &bw, (int)(nthreads < bags ? nthreads : bags));
    if (tables_have_one_feature(&bt)) {
        BlockSort bs = {&bw, 0};
        run_parallel(block_sort_task, &bs, (int)(nthreads < F ? nthreads : F));
    } else {
        int64_t *count = (int64_t *)malloc(sizeof(int64_t) << 11);
        /* max_key: the rows of all tables together, one past the largest key */
        failed = !count ? 1 : sort_keys(&bw, 0, n, 0, max_key, count) ? 2 : 0;
        free(count);
    }
    for (int t = 0; t < MAX_THREADS; t++) failed |= bw.failed[t];
    if (!failed) run_parallel(update_task, &bw, (int)(nthreads < n ? nthreads : n));
    for (int t = 0; t < MAX_THREADS; t++) failed |= bw.failed[t];
    Py_END_ALLOW_THREADS
    if (own) free(block);
    if (failed & 2) { /* forward checks the ids first: only a caller that skipped it */
        PyErr_SetString(PyExc_ValueError, "an id outside its table reached backward");
        return NULL;
    }
    if (failed) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_workspace_size(PyObject *self, PyObject *args) {
    (void)self;
    long long n;
    if (!PyArg_ParseTuple(args, "L", &n)) return NULL;
    return PyLong_FromLongLong(n * (long long)(5 * sizeof(int64_t) + sizeof(int32_t)));
}

static PyObject *py_isa(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyUnicode_FromString(KERNEL_ISA);
}

static PyMethodDef methods[] = {
    {"forward", py_forward, METH_VARARGS, "Pooled lookup of every bag; see the source."},
    {"backward", py_backward, METH_VARARGS,
     "Summed gradient per distinct row and the fused optimizer update; see the source."},
    {"workspace_size", py_workspace_size, METH_VARARGS, "Scratch bytes backward needs."},
    {"isa", py_isa, METH_NOARGS, "The instruction sets the loops are built for."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_embedding_kernel",
                                    "Native CPU embedding bags with a fused optimizer.", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__embedding_kernel(void) { return PyModule_Create(&module); }
