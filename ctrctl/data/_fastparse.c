/* Fast path of `ctrctl preprocess`: delimited text lines to transformed columns, in one pass.
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

/* A signed decimal integer of [p, end) as int64; 0 when malformed or out of range. */
static int parse_int(const char *p, const char *end, int64_t *out) {
    int negative = 0;
    if (p < end && *p == '-') {
        negative = 1;
        p++;
    }
    if (p == end) return 0;
    uint64_t value = 0;
    for (; p < end; p++) {
        unsigned digit = (unsigned)(*p - '0');
        if (digit > 9) return 0;
        if (value > (UINT64_MAX - digit) / 10) return 0;
        value = value * 10 + digit;
    }
    if (negative) {
        if (value > (uint64_t)INT64_MAX + 1) return 0;
        *out = (int64_t)(0 - value);
    } else {
        if (value > (uint64_t)INT64_MAX) return 0;
        *out = (int64_t)value;
    }
    return 1;
}

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

/* An unsigned hex key of at most 16 digits; 0 when malformed. */
static int parse_hex(const char *p, const char *end, const signed char *hex, uint64_t *out) {
    Py_ssize_t n = end - p;
    if (n < 1 || n > 16) return 0;
    uint64_t value = 0;
    for (; p < end; p++) {
        int digit = hex[(unsigned char)*p];
        if (digit < 0) return 0;
        value = (value << 4) | (uint64_t)digit;
    }
    *out = value;
    return 1;
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

/* Parses one line [p, end) (no terminator) into row `row`; 0 when it is not well formed. */
static int parse_line(const char *p, const char *end, char sep, const Columns *cols,
                      const signed char *hex, Py_ssize_t row, Py_ssize_t stride,
                      int8_t *label, float *dense, int64_t *sparse, uint64_t *missing) {
    if (p == end) return 0; /* an empty line has no label */
    Py_ssize_t d = 0, s = 0;
    uint64_t missed = 0;
    int more = 1; /* whether a field starts at p */
    for (Py_ssize_t c = 0; c < cols->ncols; c++) {
        const char *field = p, *stop = p;
        if (more) {
            while (stop < end && *stop != sep) stop++;
            if (stop == end) {
                more = 0;
                p = end;
            } else {
                p = stop + 1;
            }
        }
        Py_ssize_t len = stop - field;
        switch (cols->kinds[c]) {
        case 'L':
            if (len != 1 || (field[0] != '0' && field[0] != '1')) return 0;
            label[row] = (int8_t)(field[0] - '0');
            break;
        case 'I': {
            float value;
            if (len == 0) {
                value = dense_value(cols->fills[c], cols->transforms[c], cols->lows[c],
                                    cols->highs[c]);
                missed |= (uint64_t)1 << d;
            } else {
                int64_t parsed;
                if (!parse_int(field, stop, &parsed)) return 0;
                value = dense_int_value(parsed, cols->transforms[c], cols->lows[c],
                                        cols->highs[c]);
            }
            dense[d * stride + row] = value;
            d++;
            break;
        }
        case 'H': {
            uint64_t key = 0;
            int64_t id = 0;
            if (len > 0) {
                if (!parse_hex(field, stop, hex, &key)) return 0;
                id = (int64_t)mod_u64(key, (uint64_t)cols->sizes[c], cols->magics[c]);
            }
            sparse[s * stride + row] = id;
            s++;
            break;
        }
        case 'N': {
            int64_t key = 0, id = 0, size = cols->sizes[c];
            if (len > 0) {
                if (!parse_int(field, stop, &key)) return 0;
                id = key % size;
                if (id < 0) id += size;
            }
            sparse[s * stride + row] = id;
            s++;
            break;
        }
        default: /* 'X': a column the dataset does not keep */
            break;
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

static PyMethodDef methods[] = {
    {"parse_block", parse_block, METH_VARARGS,
     "Parse whole delimited lines into label, dense and sparse columns; see the source."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastparse",
                                    "Native fast path of ctrctl preprocess.", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastparse(void) { return PyModule_Create(&module); }
