/* The dot interaction's loops for one vector width; included by _interaction_kernel.c once
 * per instruction set it builds for, with
 *
 *     LANES    floats per vector: 16 (one AVX-512 register), 8 (one AVX2 register) or 4
 *              (one SSE or NEON register). Sixteen floats on AVX2 are two registers: eight
 *              rows of accumulators then fill all sixteen and spill, and the transposes'
 *              two-source shuffles have no AVX2 instruction; measured on an AVX2 CPU,
 *              forward 51 -> 17 ms and backward 118 -> 17 ms (bench_train's batch, one
 *              thread) with 8.
 *     NAME(x)  the name of this width's x (x ## _avx512 ...);
 *     TARGET   the function attribute that builds for the instruction set (or nothing).
 *
 * The algorithm is the header's of _interaction_kernel.c; only the width differs.
 */

typedef float NAME(vf) __attribute__((vector_size(LANES * sizeof(float))));
typedef int32_t NAME(vi) __attribute__((vector_size(LANES * sizeof(int32_t))));

/* Loads and stores are unaligned. */
TARGET INLINE NAME(vf) NAME(load)(const float *p) {
    NAME(vf) v;
    memcpy(&v, p, sizeof v);
    return v;
}
TARGET INLINE void NAME(store)(float *p, NAME(vf) v) { memcpy(p, &v, sizeof v); }

/* One stage of a LANES x LANES transpose: rows lo and hi = lo + S swap the S-wide blocks
 * lo[c + S] <-> hi[c] (c with bit S clear); after S = LANES / 2, ..., 2, 1 every row is a
 * column. In registers (two-source shuffles): no scalar store per element. */
#define STAGE(S, LO_MASK, HI_MASK)                                                         \
    for (int r = 0; r < LANES; r++)                                                        \
        if (!(r & (S))) {                                                                  \
            const NAME(vf) lo = m[r], hi = m[r + (S)];                                     \
            m[r] = SHUFFLE2(lo, hi, LO_MASK);                                              \
            m[r + (S)] = SHUFFLE2(lo, hi, HI_MASK);                                        \
        }

/* xt[(d0 + c) * width + r0 + r] = vector r0 + r, dim d0 + c, for a LANES x LANES block
 * (vectors past the last are zeros). */
TARGET INLINE void NAME(transpose_block)(float *xt, int64_t width, const float *const *xs,
                                         int64_t n, int64_t r0, int64_t d0) {
    NAME(vf) m[LANES];
    for (int r = 0; r < LANES; r++)
        m[r] = r0 + r < n ? NAME(load)(xs[r0 + r] + d0) : (NAME(vf)){0};
#if LANES == 16
    STAGE(8, MASK(NAME(vi), 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23),
          MASK(NAME(vi), 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31))
    STAGE(4, MASK(NAME(vi), 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27),
          MASK(NAME(vi), 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31))
    STAGE(2, MASK(NAME(vi), 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29),
          MASK(NAME(vi), 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31))
    STAGE(1, MASK(NAME(vi), 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30),
          MASK(NAME(vi), 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31))
#elif LANES == 8
    STAGE(4, MASK(NAME(vi), 0, 1, 2, 3, 8, 9, 10, 11), MASK(NAME(vi), 4, 5, 6, 7, 12, 13, 14, 15))
    STAGE(2, MASK(NAME(vi), 0, 1, 8, 9, 4, 5, 12, 13), MASK(NAME(vi), 2, 3, 10, 11, 6, 7, 14, 15))
    STAGE(1, MASK(NAME(vi), 0, 8, 2, 10, 4, 12, 6, 14), MASK(NAME(vi), 1, 9, 3, 11, 5, 13, 7, 15))
#elif LANES == 4
    STAGE(2, MASK(NAME(vi), 0, 1, 4, 5), MASK(NAME(vi), 2, 3, 6, 7))
    STAGE(1, MASK(NAME(vi), 0, 4, 2, 6), MASK(NAME(vi), 1, 5, 3, 7))
#else
#error "LANES must be 16, 8 or 4"
#endif
    for (int c = 0; c < LANES; c++) NAME(store)(xt + (d0 + c) * width + r0, m[c]);
}
#undef STAGE

/* G rows of the Gram matrix, from row i0, columns from j0 on: G independent accumulators
 * share every column load (and hide the multiply-add latency). */
#define GRAM_ROWS(G)                                                                       \
    for (int64_t j0 = (i0 + 1) / LANES * LANES; j0 < width; j0 += LANES) {                 \
        NAME(vf) acc[G];                                                                   \
        for (int g = 0; g < (G); g++) acc[g] = (NAME(vf)){0};                              \
        for (int64_t d = 0; d < D; d++) {                                                  \
            const NAME(vf) col = NAME(load)(xt + d * width + j0);                          \
            for (int g = 0; g < (G); g++) acc[g] += col * xs[i0 + g][d];                   \
        }                                                                                  \
        for (int g = 0; g < (G); g++) NAME(store)(z + g * width + j0, acc[g]);             \
    }

#define GROUP 8

TARGET static void NAME(forward_task)(void *arg, int thread, int nthreads) {
    Interaction *it = (Interaction *)arg;
    const int64_t n = vectors(it), D = it->D, width = (n + LANES - 1) / LANES * LANES;
    const int64_t head = it->dense ? D : 0, pairs = n * (n - 1) / 2;
    const int64_t whole = D / LANES * LANES; /* dims moved by block transposes */
    /* xt: the vectors as columns, padded with zero columns; z: GROUP rows of the Gram
     * matrix; xs: where each vector is */
    float *xt = (float *)calloc((size_t)(D * width + GROUP * width), sizeof(float));
    const float **xs = (const float **)malloc(sizeof(float *) * (size_t)n);
    if (!xt || !xs) {
        free(xt);
        free(xs);
        it->failed[thread] = 1;
        return;
    }
    float *z = xt + D * width;
    int64_t b0, b1;
    share(it->B, thread, nthreads, &b0, &b1);
    for (int64_t b = b0; b < b1; b++) {
        float *out = it->out + b * it->out_stride;
        for (int64_t i = 0; i < n; i++) xs[i] = vec(it, b, i);
        if (b + AHEAD < b1) prefetch_block(it->sparse + (b + AHEAD) * it->F * D, it->F * D);
        for (int64_t r0 = 0; r0 < width; r0 += LANES)
            for (int64_t d0 = 0; d0 < whole; d0 += LANES)
                NAME(transpose_block)(xt, width, xs, n, r0, d0);
        for (int64_t i = 0; i < n; i++)
            for (int64_t d = whole; d < D; d++) xt[d * width + i] = xs[i][d];
        if (head) memcpy(out, it->dense + b * D, sizeof(float) * (size_t)D);
        for (int64_t i0 = 0; i0 + 1 < n;) {
            const int64_t rows = n - 1 - i0; /* rows i0.. that still have pairs */
            const int64_t g_rows = rows >= 8 ? 8 : rows >= 4 ? 4 : rows >= 2 ? 2 : 1;
            if (g_rows == 8) {
                GRAM_ROWS(8)
            } else if (g_rows == 4) {
                GRAM_ROWS(4)
            } else if (g_rows == 2) {
                GRAM_ROWS(2)
            } else {
                GRAM_ROWS(1)
            }
            for (int64_t g = 0; g < g_rows; g++) {
                const int64_t i = i0 + g;
                memcpy(out + head + row_start(i, n), z + g * width + i + 1,
                       sizeof(float) * (size_t)(n - i - 1));
            }
            i0 += g_rows;
        }
        for (int64_t c = head + pairs; c < it->out_stride; c++) out[c] = 0.0f;
    }
    free(xt);
    free(xs);
}
#undef GRAM_ROWS
#undef GROUP

/* Backward: d v_i = sum_j S[i][j] v_j for two rows i at once, W vectors of LANES dims each
 * (W = CHUNK: eight independent accumulators, half the registers of any width), starting
 * at dim d0; init adds G[b, :D] to the dense vector's row. */
#define CHUNK 4
#define BACKWARD_CHUNK(W)                                                                 \
    do {                                                                                   \
        NAME(vf) a[W], c[W];                                                               \
        for (int w = 0; w < W; w++) {                                                      \
            a[w] = first_dense ? NAME(load)(g + d0 + w * LANES) : (NAME(vf)){0};           \
            c[w] = (NAME(vf)){0};                                                          \
        }                                                                                  \
        for (int64_t j = 0; j < n; j++) {                                                  \
            const float sa = s0[j], sc = s1[j];                                            \
            for (int w = 0; w < W; w++) {                                                  \
                const NAME(vf) x = NAME(load)(xs[j] + d0 + w * LANES);                     \
                a[w] += x * sa;                                                            \
                c[w] += x * sc;                                                            \
            }                                                                              \
        }                                                                                  \
        for (int w = 0; w < W; w++) {                                                      \
            NAME(store)(dst0 + d0 + w * LANES, a[w]);                                      \
            if (dst1) NAME(store)(dst1 + d0 + w * LANES, c[w]);                            \
        }                                                                                  \
    } while (0)

TARGET static void NAME(backward_task)(void *arg, int thread, int nthreads) {
    Interaction *it = (Interaction *)arg;
    const int64_t n = vectors(it), D = it->D, head = it->dense ? D : 0;
    /* s: S with one more row of zeros (the partner of an odd last row); xs as forward */
    float *s = (float *)calloc((size_t)((n + 1) * n), sizeof(float));
    const float **xs = (const float **)malloc(sizeof(float *) * (size_t)n);
    if (!s || !xs) {
        free(s);
        free(xs);
        it->failed[thread] = 1;
        return;
    }
    int64_t b0, b1;
    share(it->B, thread, nthreads, &b0, &b1);
    for (int64_t b = b0; b < b1; b++) {
        const float *g = it->grad + b * it->grad_stride;
        if (b + AHEAD < b1) {
            prefetch_block(it->sparse + (b + AHEAD) * it->F * D, it->F * D);
            prefetch_block(it->grad + (b + AHEAD) * it->grad_stride, it->grad_stride);
        }
        for (int64_t i = 0; i < n; i++) {
            xs[i] = vec(it, b, i);
            const float *row = g + head + row_start(i, n) - (i + 1);
            for (int64_t j = i + 1; j < n; j++) s[i * n + j] = s[j * n + i] = row[j];
        }
        for (int64_t i = 0; i < n; i += 2) {
            const float *s0 = s + i * n, *s1 = s + (i + 1) * n;
            const int first_dense = it->dense != NULL && i == 0;
            float *dst0 = first_dense ? it->grad_dense + b * D
                                      : it->grad_sparse + (b * it->F + i - (head > 0)) * D;
            float *dst1 = i + 1 < n ? it->grad_sparse + (b * it->F + i + 1 - (head > 0)) * D
                                    : NULL;
            int64_t d0 = 0;
            for (; d0 + CHUNK * LANES <= D; d0 += CHUNK * LANES) BACKWARD_CHUNK(CHUNK);
            for (; d0 + LANES <= D; d0 += LANES) BACKWARD_CHUNK(1);
            for (; d0 < D; d0++) { /* the last D % LANES dims */
                float a = first_dense ? g[d0] : 0.0f, c = 0.0f;
                for (int64_t j = 0; j < n; j++) {
                    a += s0[j] * xs[j][d0];
                    c += s1[j] * xs[j][d0];
                }
                dst0[d0] = a;
                if (dst1) dst1[d0] = c;
            }
        }
    }
    free(s);
    free(xs);
}
#undef CHUNK
#undef BACKWARD_CHUNK
