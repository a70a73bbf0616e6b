/* The dense kernel's GEMM for one instruction set; included by _dense_kernel.c once per
 * instruction set it builds for, with
 *
 *     NAME(x)  the name of this build's x (x ## _avx2 ...);
 *     TARGET   the function attribute that builds for the instruction set (or nothing);
 *
 * and optionally the build's shape (undefined again at the end), by default 4 x 24 tiles of
 * 8-float vectors, blocks of 256 x 128:
 *
 *     VEC      floats per vector (16: one AVX-512 register; 8: one AVX2 register, or two
 *              SSE registers in the baseline build);
 *     MR, NV   a tile of C is MR rows (a multiple of 4) by NR = NV * VEC columns;
 *     KC, MC   the inner dimension's and C's rows' blocks (MC a multiple of MR; MC x KC
 *              and KC x NC no more than the packs of _dense_kernel.c hold).
 *
 * The algorithm is the header's of _dense_kernel.c.
 */

#ifndef VEC
#define VEC 8
#endif
#ifndef MR
#define MR 4
#endif
#ifndef NV
#define NV 3
#endif
#ifndef KC
#define KC 256
#endif
#ifndef MC
#define MC 128
#endif
#define NR (NV * VEC)

typedef float NAME(vf) __attribute__((vector_size(VEC * sizeof(float))));
typedef int32_t NAME(vi) __attribute__((vector_size(VEC * sizeof(int32_t))));

TARGET INLINE NAME(vf) NAME(load)(const float *p) {
    NAME(vf) v;
    memcpy(&v, p, sizeof v);
    return v;
}
TARGET INLINE void NAME(store)(float *p, NAME(vf) v) { memcpy(p, &v, sizeof v); }

typedef float NAME(v4) __attribute__((vector_size(4 * sizeof(float))));
typedef int32_t NAME(i4) __attribute__((vector_size(4 * sizeof(int32_t))));

TARGET INLINE NAME(v4) NAME(load4)(const float *p) {
    NAME(v4) v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* v where mask > 0, else 0 (the ReLU's backward; NaN masks to 0, as torch's does). */
TARGET INLINE NAME(v4) NAME(masked4)(NAME(v4) v, const float *mask) {
    if (!mask) return v;
    const NAME(i4) keep = NAME(load4)(mask) > (NAME(v4)){0};
    return (NAME(v4))((NAME(i4))v & keep);
}

/* A's rows [i0, i0 + mc) x columns [k0, k0 + kc) into MR-row strips, k-major inside a strip
 * (pa[s * MR * kc + k * MR + r] = A(i0 + s * MR + r, k0 + k)), rows past the end zero; where
 * the GEMM masks A, entries whose mask is <= 0 are zero. With row_sums, each packed value
 * is also added to row_sums[row]. Whole strips of A's two layouts go four rows by four
 * values at a time: columns of A contiguous (g^T: four rows of a column are one load) or
 * rows contiguous (x, g: a 4 x 4 block is transposed in registers). */
TARGET static void NAME(pack_a)(const Gemm *g, int64_t i0, int64_t mc, int64_t k0, int64_t kc,
                                float *pa, float *row_sums) {
    if (g->a_row == 1 && mc % MR == 0 && mc <= MC) {
        /* Columns of A contiguous: a column's mc values at once, four rows at a time (strip
         * by strip would read each line of A once per strip). */
        NAME(v4) sums[MC / 4];
        memset(sums, 0, sizeof sums);
        for (int64_t k = 0; k < kc; k++) {
            const int64_t at = i0 + (k0 + k) * g->a_col;
            for (int64_t q = 0; q < mc / 4; q++) {
                const NAME(v4) v = NAME(masked4)(NAME(load4)(g->a + at + q * 4),
                                                 g->mask ? g->mask + at + q * 4 : NULL);
                memcpy(pa + q / (MR / 4) * MR * kc + k * MR + q % (MR / 4) * 4, &v, sizeof v);
                sums[q] += v;
            }
        }
        if (row_sums)
            for (int64_t q = 0; q < mc / 4; q++)
                for (int r = 0; r < 4; r++) row_sums[i0 + q * 4 + r] += sums[q][r];
        return;
    }
    for (int64_t s = 0; s < mc; s += MR, pa += MR * kc) {
        const int64_t rows = mc - s < MR ? mc - s : MR;
        const int64_t first = (i0 + s) * g->a_row + k0 * g->a_col;
        const float *a = g->a + first, *mask = g->mask ? g->mask + first : NULL;
        int64_t k = 0;
        if (rows == MR && g->a_col == 1) {
            const int64_t ld = g->a_row;
            for (; k + 4 <= kc; k += 4)
                for (int q0 = 0; q0 < MR; q0 += 4) {
                    NAME(v4) r[4];
                    for (int q = 0; q < 4; q++) {
                        const int64_t at = (q0 + q) * ld + k;
                        r[q] = NAME(masked4)(NAME(load4)(a + at), mask ? mask + at : NULL);
                    }
                    const NAME(v4) t0 = SHUFFLE2(r[0], r[1], MASK(NAME(i4), 0, 4, 1, 5));
                    const NAME(v4) t1 = SHUFFLE2(r[0], r[1], MASK(NAME(i4), 2, 6, 3, 7));
                    const NAME(v4) t2 = SHUFFLE2(r[2], r[3], MASK(NAME(i4), 0, 4, 1, 5));
                    const NAME(v4) t3 = SHUFFLE2(r[2], r[3], MASK(NAME(i4), 2, 6, 3, 7));
                    const NAME(v4) out[4] = {
                        SHUFFLE2(t0, t2, MASK(NAME(i4), 0, 1, 4, 5)),
                        SHUFFLE2(t0, t2, MASK(NAME(i4), 2, 3, 6, 7)),
                        SHUFFLE2(t1, t3, MASK(NAME(i4), 0, 1, 4, 5)),
                        SHUFFLE2(t1, t3, MASK(NAME(i4), 2, 3, 6, 7)),
                    };
                    for (int q = 0; q < 4; q++)
                        memcpy(pa + (k + q) * MR + q0, &out[q], sizeof out[q]);
                }
        }
        for (; k < kc; k++) { /* the rest, one value at a time */
            float *dst = pa + k * MR;
            for (int64_t r = 0; r < rows; r++) {
                const int64_t at = r * g->a_row + k * g->a_col;
                dst[r] = mask && !(mask[at] > 0.0f) ? 0.0f : a[at];
            }
            for (int64_t r = rows; r < MR; r++) dst[r] = 0.0f;
        }
        if (row_sums)
            for (int64_t r = 0; r < rows; r++) {
                float sum = 0.0f;
                for (int64_t q = 0; q < kc; q++) sum += pa[q * MR + r];
                row_sums[i0 + s + r] += sum;
            }
    }
}

/* B's rows [k0, k0 + kc) x columns [j0, j0 + nc) into NR-column strips, k-major inside a
 * strip (pb[s * NR * kc + k * NR + c] = B(k0 + k, j0 + s * NR + c)), columns past the end
 * zero. */
TARGET static void NAME(pack_b)(const Gemm *g, int64_t k0, int64_t kc, int64_t j0, int64_t nc,
                                float *pb) {
    for (int64_t s = 0; s < nc; s += NR, pb += NR * kc) {
        const int64_t cols = nc - s < NR ? nc - s : NR;
        for (int64_t k = 0; k < kc; k++) {
            const float *src = g->b + (k0 + k) * g->b_row + (j0 + s) * g->b_col;
            float *dst = pb + k * NR;
            if (g->b_col == 1 && cols == NR) {
                memcpy(dst, src, NR * sizeof(float));
                continue;
            }
            for (int64_t c = 0; c < cols; c++) dst[c] = src[c * g->b_col];
            for (int64_t c = cols; c < NR; c++) dst[c] = 0.0f;
        }
    }
}

/* The MR x NR tile at c (row stride ldc) += or = one A strip times one B strip over kc;
 * rows x cols of it are real. last: add the bias and apply the ReLU after the sum. */
TARGET static void NAME(tile)(const Gemm *g, int64_t kc, const float *restrict pa,
                              const float *restrict pb, float *c, int64_t ldc, int64_t rows,
                              int64_t cols, int64_t j, int accumulate, int last) {
    /* The tile of C is read (accumulate) or written after the loop: ask for its lines now,
     * or the loop's end waits on memory (C does not fit in the caches). */
    for (int r = 0; r < MR && r < rows; r++) {
        for (int64_t e = 0; e < cols; e += 16) __builtin_prefetch(c + r * ldc + e, 1, 3);
        __builtin_prefetch(c + r * ldc + cols - 1, 1, 3);
    }
    NAME(vf) acc[MR][NV];
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = (NAME(vf)){0};
    _Pragma("GCC unroll 4") for (int64_t k = 0; k < kc; k++) {
        NAME(vf) b[NV];
        for (int v = 0; v < NV; v++) b[v] = NAME(load)(pb + k * NR + v * VEC);
        __builtin_prefetch(pb + (k + 8) * NR);
        for (int r = 0; r < MR; r++) {
            const float a = pa[k * MR + r];
            for (int v = 0; v < NV; v++) acc[r][v] += a * b[v];
        }
    }
    if (rows == MR && cols == NR) {
        for (int r = 0; r < MR; r++)
            for (int v = 0; v < NV; v++) {
                float *dst = c + r * ldc + v * VEC;
                NAME(vf) x = acc[r][v];
                if (accumulate) x += NAME(load)(dst);
                if (last && g->bias) x += NAME(load)(g->bias + j + v * VEC);
                if (last && g->relu) { /* max(x, 0), NaN kept (as torch's ReLU keeps it) */
                    const NAME(vi) drop = x <= (NAME(vf)){0};
                    x = (NAME(vf))((NAME(vi))x & ~drop);
                }
                NAME(store)(dst, x);
            }
        return;
    }
    float spill[MR][NR]; /* an edge tile: the rows x cols inside C, one at a time */
    for (int r = 0; r < MR; r++)
        for (int v = 0; v < NV; v++) NAME(store)(&spill[r][v * VEC], acc[r][v]);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t e = 0; e < cols; e++) {
            float x = spill[r][e] + (accumulate ? c[r * ldc + e] : 0.0f);
            if (last && g->bias) x += g->bias[j + e];
            if (last && g->relu && x <= 0.0f) x = 0.0f;
            c[r * ldc + e] = x;
        }
}

/* C rows [i0, i1) over A's columns [k0, k1): the blocked loops (see the header). */
TARGET static int NAME(gemm_block)(const Gemm *g, float *c, int64_t i0, int64_t i1, int64_t k0,
                                   int64_t k1, float *row_sums) {
    Packs *packs = thread_packs(g->N);
    if (!packs) return -1;
    for (int64_t j0 = 0; j0 < g->N; j0 += NC) {
        const int64_t nc = g->N - j0 < NC ? g->N - j0 : NC;
        for (int64_t p0 = k0; p0 < k1; p0 += KC) {
            const int64_t kc = k1 - p0 < KC ? k1 - p0 : KC;
            NAME(pack_b)(g, p0, kc, j0, nc, packs->b);
            for (int64_t m0 = i0; m0 < i1; m0 += MC) {
                const int64_t mc = i1 - m0 < MC ? i1 - m0 : MC;
                NAME(pack_a)(g, m0, mc, p0, kc, packs->a, j0 == 0 ? row_sums : NULL);
                for (int64_t s = 0; s < nc; s += NR)
                    for (int64_t r = 0; r < mc; r += MR)
                        NAME(tile)(g, kc, packs->a + r * kc, packs->b + s * kc,
                                   c + (m0 + r) * g->N + j0 + s, g->N,
                                   mc - r < MR ? mc - r : MR, nc - s < NR ? nc - s : NR,
                                   j0 + s, p0 > k0, p0 + kc >= k1);
            }
        }
    }
    if (k1 <= k0) /* no inner dimension: C = bias (then ReLU) */
        for (int64_t i = i0; i < i1; i++)
            for (int64_t j = 0; j < g->N; j++) {
                const float x = g->bias ? g->bias[j] : 0.0f;
                c[i * g->N + j] = g->relu && !(x > 0.0f) ? 0.0f : x;
            }
    return 0;
}

TARGET static void NAME(gemm_task)(void *ctx, int thread, int nthreads) {
    Gemm *g = (Gemm *)ctx;
    int64_t lo, hi;
    if (g->split_k) {
        share(g->K, thread, nthreads, &lo, &hi);
        float *c = thread == 0 ? g->c : g->partial + (int64_t)(thread - 1) * g->M * g->N;
        float *sums = g->row_sums ? (thread == 0 ? g->row_sums
                                                 : g->partial_sums + (thread - 1) * g->M)
                                  : NULL;
        if (thread > 0 && sums) memset(sums, 0, g->M * sizeof(float));
        if (hi > lo) {
            if (NAME(gemm_block)(g, c, 0, g->M, lo, hi, sums)) g->failed[thread] = 1;
        } else {
            memset(c, 0, g->M * g->N * sizeof(float));
        }
    } else {
        /* Rows in whole MR strips, so a thread's strips are the ones one thread would pack. */
        const int64_t strips = (g->M + MR - 1) / MR;
        share(strips, thread, nthreads, &lo, &hi);
        lo *= MR, hi = hi * MR < g->M ? hi * MR : g->M;
        if (hi > lo && NAME(gemm_block)(g, g->c, lo, hi, 0, g->K, g->row_sums))
            g->failed[thread] = 1;
    }
    if (thread > 0) release_thread_packs();
}

#undef NR
#undef VEC
#undef MR
#undef NV
#undef KC
#undef MC
