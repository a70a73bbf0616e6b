/* Fast path of `ctrctl preprocess`: delimited text lines to transformed columns, in one pass,
 * and a HyperLogLog sketch of the ids written (the manifest's cardinalities on large data).
 *
 * parse_block(data, sep, kinds, sizes, fills, transforms, lows, highs, max_rows,
 *             label_out, dense_out, sparse_out, missing_out) -> (rows, bad_offset)
 *
 * Each schema column has a kind: 'L' label ("0" or "1"), 'I' dense integer, 'H' sparse hex
 * key, 'N' sparse signed integer key, 'X' ignored. A dense value is missing -> fill, then
 * transformed ('l' clip at 0 then log1p, 'c' clip to [low, high], 'n' none) and stored as
 * float32; a sparse key becomes key mod size (floor modulo for signed keys), missing -> 0.
 * Outputs are column-major with a stride of max_rows: dense column j of row i is
 * dense_out[j * max_rows + i]; missing_out[i] has bit j set when dense value j of row i was
 * missing (at most 64 dense columns).
 *
 * Only rows that are certainly well formed are accepted. At the first row that is not (a bad
 * label, number or key, more fields than the schema, an empty line), parsing stops and its
 * byte offset is returned: the caller then takes the general path, which reports or skips
 * such rows. A row with fewer fields than the schema has its trailing fields missing, as real
 * Criteo files lose trailing tabs. The GIL is released while parsing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const char *kinds;
    const int64_t *sizes;
    const double *fills;
    const char *transforms;
    const double *lows;
    const double *highs;
    Py_ssize_t ncols;
    uint64_t magics[256]; /* fastmod constants per column, 0 where sizes exceed 32 bits */
} Columns;

static const signed char *hex_table(void) {
    static signed char table[256];
    static int ready = 0;
    if (!ready) {
        for (int i = 0; i < 256; i++) table[i] = -1;
        for (int i = 0; i < 10; i++) table['0' + i] = (signed char)i;
        for (int i = 0; i < 6; i++) {
            table['a' + i] = (signed char)(10 + i);
            table['A' + i] = (signed char)(10 + i);
        }
        ready = 1;
    }
    return table;
}

/* log1p of the small integers that dominate count features, computed once. */
#define LOG_TABLE_SIZE 65536
static float log_table[LOG_TABLE_SIZE];

static void fill_log_table(void) {
    static int ready = 0;
    if (ready) return;
    for (int i = 0; i < LOG_TABLE_SIZE; i++) log_table[i] = (float)log1p((double)i);
    ready = 1;
}

/* key mod size without a division for 32-bit keys and sizes (Lemire's fastmod). */
static inline uint64_t mod_u64(uint64_t key, uint64_t size, uint64_t magic) {
#ifdef __SIZEOF_INT128__
    if (magic != 0 && key <= UINT32_MAX) {
        uint64_t low = magic * key;
        return (uint64_t)(((__uint128_t)low * size) >> 64);
    }
#else
    (void)magic;
#endif
    return key % size;
}

static float dense_int_value(int64_t value, char transform, double low, double high) {
    if (transform == 'l' && value < LOG_TABLE_SIZE) return log_table[value < 0 ? 0 : value];
    double x = (double)value;
    if (transform == 'l') return (float)log1p(x);
    if (transform == 'c') x = x < low ? low : (x > high ? high : x);
    return (float)x;
}

static float dense_value(double value, char transform, double low, double high) {
    if (transform == 'l') {
        value = log1p(value < 0.0 ? 0.0 : value);
    } else if (transform == 'c') {
        value = value < low ? low : (value > high ? high : value);
    }
    return (float)value;
}

/* Eight hex digits at p, all at once (SWAR): 1 and the value, or 0 if one is not a digit.
 * Byte i of the little-endian word is character i; within the value it is nibble 7 - i. */
static inline int hex8(const char *p, uint64_t *out) {
    const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
    uint64_t x;
    memcpy(&x, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    x = __builtin_bswap64(x);
#endif
    if (x & high) return 0;
    /* Per byte (each < 0x80): high bit set where byte >= lo, and where byte <= hi. */
#define GE(v, lo) ((((v) | high) - (lo) * ones) & high)
#define LE(v, hi) ((((hi) * ones | high) - (v)) & high)
    uint64_t lower = x | 0x2020202020202020ULL;
    uint64_t digit = GE(x, 0x30) & LE(x, 0x39);
    uint64_t letter = GE(lower, 0x61) & LE(lower, 0x66);
#undef GE
#undef LE
    if ((digit | letter) != high) return 0;
    /* Nibble per byte: low four bits, plus 9 for letters (bit 6 set). */
    uint64_t v = (x & 0x0F0F0F0F0F0F0F0FULL) + 9 * ((x >> 6) & ones);
    /* Pack: byte pairs, then 16-bit pairs, then the two halves, first character highest. */
    v = ((v & 0x000F000F000F000FULL) << 4) | ((v & 0x0F000F000F000F00ULL) >> 8);
    v = ((v & 0x000000FF000000FFULL) << 8) | ((v & 0x00FF000000FF0000ULL) >> 16);
    *out = ((v & 0xFFFF) << 16) | ((v >> 32) & 0xFFFF);
    return 1;
}

/* Digits of a decimal integer at *pp (at most 19, so no overflow), with an optional '-'.
 * Returns 0 for an empty field, 1 for a number in int64 range, -1 for anything else. */
static int scan_int(const char **pp, const char *end, int64_t *out) {
    const char *p = *pp, *digits;
    int negative = p < end && *p == '-';
    p += negative;
    digits = p;
    uint64_t value = 0;
    while (p < end) {
        unsigned digit = (unsigned)(*p - '0');
        if (digit > 9) break;
        value = value * 10 + digit;
        p++;
    }
    *pp = p;
    Py_ssize_t n = p - digits;
    if (n == 0) return negative ? -1 : 0;
    if (n > 19) return -1;
    if (negative) {
        if (value > (uint64_t)INT64_MAX + 1) return -1;
        *out = (int64_t)(0 - value);
    } else {
        if (value > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)value;
    }
    return 1;
}

/* Parses one line [p, end) (no terminator) into row `row`; 0 when it is not well formed.
 * Each field is scanned once: its value is parsed while looking for the separator. */
static int parse_line(const char *p, const char *end, char sep, const Columns *cols,
                      const signed char *hex, Py_ssize_t row, Py_ssize_t stride,
                      int8_t *label, float *dense, int64_t *sparse, uint64_t *missing) {
    if (p == end) return 0; /* an empty line has no label */
    Py_ssize_t d = 0, s = 0;
    uint64_t missed = 0;
    int more = 1; /* whether a field starts at p */
    for (Py_ssize_t c = 0; c < cols->ncols; c++) {
        char kind = cols->kinds[c];
        if (!more) return 0; /* fewer fields than columns: cut short (polars counts it) */
        switch (kind) {
        case 'L':
            if (!more || (*p != '0' && *p != '1')) return 0;
            label[row] = (int8_t)(*p - '0');
            p++;
            break;
        case 'I': {
            int64_t parsed = 0;
            int found = more ? scan_int(&p, end, &parsed) : 0;
            if (found < 0) return 0;
            if (found) {
                dense[d * stride + row] = dense_int_value(parsed, cols->transforms[c],
                                                          cols->lows[c], cols->highs[c]);
            } else {
                dense[d * stride + row] = dense_value(cols->fills[c], cols->transforms[c],
                                                      cols->lows[c], cols->highs[c]);
                missed |= (uint64_t)1 << d;
            }
            d++;
            break;
        }
        case 'H': {
            uint64_t key = 0;
            int64_t id = 0;
            if (more && end - p >= 8 && (end - p == 8 || p[8] == sep) && hex8(p, &key)) {
                p += 8; /* the common case: exactly eight digits, as in Criteo */
                id = (int64_t)mod_u64(key, (uint64_t)cols->sizes[c], cols->magics[c]);
            } else if (more) {
                const char *start = p;
                while (p < end) {
                    int digit = hex[(unsigned char)*p];
                    if (digit < 0) break;
                    key = (key << 4) | (uint64_t)digit;
                    p++;
                }
                if (p - start > 16) return 0;
                if (p > start) id = (int64_t)mod_u64(key, (uint64_t)cols->sizes[c], cols->magics[c]);
            }
            sparse[s * stride + row] = id;
            s++;
            break;
        }
        case 'N': {
            int64_t key = 0, id = 0, size = cols->sizes[c];
            int found = more ? scan_int(&p, end, &key) : 0;
            if (found < 0) return 0;
            if (found) {
                id = key % size;
                if (id < 0) id += size;
            }
            sparse[s * stride + row] = id;
            s++;
            break;
        }
        default: /* 'X': a column the dataset does not keep */
            while (more && p < end && *p != sep) p++;
            break;
        }
        if (!more) continue;
        if (p == end) {
            more = 0;
        } else if (*p == sep) {
            p++;
        } else {
            return 0; /* junk after a value */
        }
    }
    missing[row] = missed;
    return !more; /* a separator after the last column: more fields than the schema */
}

static PyObject *parse_block(PyObject *self, PyObject *args) {
    Py_buffer data, kinds, sizes, fills, transforms, lows, highs;
    Py_buffer label, dense, sparse, missing;
    int sep;
    Py_ssize_t max_rows;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iy*y*y*y*y*y*nw*w*w*w*", &data, &sep, &kinds, &sizes,
                          &fills, &transforms, &lows, &highs, &max_rows, &label, &dense,
                          &sparse, &missing))
        return NULL;
    Columns cols = {kinds.buf, sizes.buf, fills.buf, transforms.buf, lows.buf, highs.buf,
                    kinds.len, {0}};
    Py_ssize_t rows = 0, bad = -1;
    int too_small = 0;
    Py_ssize_t n_dense = 0, n_sparse = 0;
    for (Py_ssize_t c = 0; c < kinds.len; c++) {
        char k = ((const char *)kinds.buf)[c];
        n_dense += k == 'I';
        n_sparse += k == 'H' || k == 'N';
        if ((k == 'H' || k == 'N') && sizes.len >= (c + 1) * 8 && ((const int64_t *)sizes.buf)[c] <= 0)
            too_small = 1;
    }
    if (too_small || kinds.len > 256 || sizes.len < kinds.len * 8 || fills.len < kinds.len * 8 ||
        lows.len < kinds.len * 8 || highs.len < kinds.len * 8 || transforms.len < kinds.len ||
        label.len < max_rows ||
        dense.len < n_dense * max_rows * 4 || sparse.len < n_sparse * max_rows * 8 ||
        missing.len < max_rows * 8 || n_dense > 64) {
        too_small = 1;
    } else {
        const signed char *hex = hex_table();
        const int64_t *size = sizes.buf;
        fill_log_table();
        for (Py_ssize_t c = 0; c < kinds.len; c++) {
            if (size[c] > 0 && size[c] <= (int64_t)UINT32_MAX)
                cols.magics[c] = UINT64_MAX / (uint64_t)size[c] + 1;
        }
        const char *p = data.buf, *end = p + data.len;
        Py_BEGIN_ALLOW_THREADS
        while (p < end) {
            const char *line_end = memchr(p, '\n', (size_t)(end - p));
            const char *next = line_end ? line_end + 1 : end;
            if (!line_end) line_end = end;
            if (line_end > p && line_end[-1] == '\r') line_end--;
            if (rows == max_rows ||
                !parse_line(p, line_end, (char)sep, &cols, hex, rows, max_rows, label.buf,
                            dense.buf, sparse.buf, missing.buf)) {
                bad = p - (const char *)data.buf;
                break;
            }
            rows++;
            p = next;
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&kinds);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&fills);
    PyBuffer_Release(&transforms);
    PyBuffer_Release(&lows);
    PyBuffer_Release(&highs);
    PyBuffer_Release(&label);
    PyBuffer_Release(&dense);
    PyBuffer_Release(&sparse);
    PyBuffer_Release(&missing);
    if (too_small) {
        PyErr_SetString(PyExc_ValueError, "parse_block: a buffer is too small or a hash size is not positive");
        return NULL;
    }
    return Py_BuildValue("nn", rows, bad);
}

/* splitmix64's finalizer: spreads ids over all 64 bits for the sketch below. */
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline int leading_zeros(uint64_t w) {
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_clzll(w);
#else
    int n = 0;
    while (!(w & 0x8000000000000000ULL)) {
        w <<= 1;
        n++;
    }
    return n;
#endif
}

/* hll_add(registers, ids, bits): adds int64 ids to a HyperLogLog sketch of 2**bits uint8
 * registers (register = top `bits` bits of the hash, value = 1 + leading zeros of the rest). */
static PyObject *hll_add(PyObject *self, PyObject *args) {
    Py_buffer registers, ids;
    int bits;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*y*i", &registers, &ids, &bits)) return NULL;
    int ok = bits >= 4 && bits <= 18 && registers.len >= ((Py_ssize_t)1 << bits) &&
             ids.len % 8 == 0;
    if (ok) {
        uint8_t *reg = registers.buf;
        const int64_t *id = ids.buf;
        Py_ssize_t n = ids.len / 8;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++) {
            uint64_t h = mix64((uint64_t)id[i]);
            uint64_t slot = h >> (64 - bits);
            uint64_t rest = (h << bits) | ((uint64_t)1 << (bits - 1));
            uint8_t rank = (uint8_t)(leading_zeros(rest) + 1);
            if (reg[slot] < rank) reg[slot] = rank;
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&registers);
    PyBuffer_Release(&ids);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "hll_add: registers too small or ids not int64");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* count_lines(buffer) -> the number of '\n' bytes in it (memchr, no Python objects). */
static PyObject *count_lines(PyObject *self, PyObject *args) {
    Py_buffer data;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
    Py_ssize_t count = 0;
    const char *p = data.buf, *end = p + data.len;
    Py_BEGIN_ALLOW_THREADS
    while (p < end && (p = memchr(p, '\n', (size_t)(end - p))) != NULL) {
        count++;
        p++;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    return PyLong_FromSsize_t(count);
}

/* last_line_end(buffer, start, stop) -> one past the last '\n' in [start, stop), or -1. */
static PyObject *last_line_end(PyObject *self, PyObject *args) {
    Py_buffer data;
    Py_ssize_t start, stop, found = -1;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nn", &data, &start, &stop)) return NULL;
    if (start < 0) start = 0;
    if (stop > data.len) stop = data.len;
    const char *base = data.buf;
    for (Py_ssize_t i = stop - 1; i >= start; i--) {
        if (base[i] == '\n') {
            found = i + 1;
            break;
        }
    }
    PyBuffer_Release(&data);
    return PyLong_FromSsize_t(found);
}

static PyMethodDef methods[] = {
    {"last_line_end", last_line_end, METH_VARARGS, "One past the last newline in a range."},
    {"count_lines", count_lines, METH_VARARGS, "Count the newline bytes of a buffer."},
    {"hll_add", hll_add, METH_VARARGS, "Add int64 ids to a HyperLogLog sketch; see the source."},
    {"parse_block", parse_block, METH_VARARGS,
     "Parse whole delimited lines into label, dense and sparse columns; see the source."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastparse",
                                    "Native fast path of ctrctl preprocess.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastparse(void) { return PyModule_Create(&module); }
