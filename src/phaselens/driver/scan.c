/* The C twin of scan.py (its docstring says what and why): the same `run(data, key)`, one
 * glibc's (SIMD) memmem over the buffer for what breaks a run, then memchr and memmem per
 * event, instead of a dozen Python bytes scans (~30 us each on a 57 KB response).
 * Built by setup.py as phaselens.driver.scan beside scan.py; tests/driver/test_scan.py
 * compares the two. */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE /* memmem */
#include <Python.h>
#include <stdint.h>
#include <string.h>

static const char OPEN[] = "data: {";

/* Where `m` first occurs in s[0:cut] (else cut): memchr for its byte m[r] (chosen rare in
 * JSON events), then a compare there. glibc's memmem takes ~17 us over a 57 KB response on
 * the 2-vCPU VM, its (SIMD) memchr under 1 us. */
static Py_ssize_t first(const char *s, Py_ssize_t cut, const char *m, Py_ssize_t r) {
    Py_ssize_t ml = (Py_ssize_t)strlen(m);
    const char *p = s + r, *end = s + cut;
    while (p < end && (p = memchr(p, m[r], (size_t)(end - p))) != NULL) {
        if (p - s - r + ml <= cut && memcmp(p - r, m, (size_t)ml) == 0)
            return p - s - r;
        p++;
    }
    return cut;
}

static PyObject *run(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer d, k;
    if (!PyArg_ParseTuple(args, "y*y*", &d, &k))
        return NULL;
    const char *s = (const char *)d.buf, *key = (const char *)k.buf;
    Py_ssize_t size = d.len, kl = k.len, pos = 0, n = 0, cap = 0;
    int64_t *ends = NULL;
    PyObject *out = NULL;
    /* what breaks a run, found once over the buffer: events reaching past it are not counted */
    Py_ssize_t cut = size;
    const char *cr = memchr(s, '\r', (size_t)size);
    if (cr != NULL)
        cut = cr - s;
    cut = first(s, cut, "\"usage\"", 4); /* 'g' */
    cut = first(s, cut, "\"error\"", 2); /* 'r' */
    cut = first(s, cut, "[DONE]", 1);    /* 'D' */
    /* (a key is a JSON key with its quotes) */
    while (kl > 0 && key[0] == '"' && cut - pos >= 7 && memcmp(s + pos, OPEN, 7) == 0) {
        const char *nl = memchr(s + pos, '\n', (size_t)(cut - pos));
        if (nl == NULL)
            break;
        Py_ssize_t e = nl - s;
        if (e + 1 >= size || s[e + 1] != '\n' || s[e - 1] != '}')
            break;
        const char *kp = memmem(s + pos, (size_t)(e - pos), key, (size_t)kl);
        if (kp == NULL)
            break;
        Py_ssize_t at = kp - s;
        if (at + kl >= e || s[at + kl] == '"' ||
            memmem(kp + 1, (size_t)(e - at - 1), key, (size_t)kl) != NULL)
            break;
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            int64_t *grown = PyMem_Realloc(ends, (size_t)cap * sizeof *ends);
            if (grown == NULL) {
                PyErr_NoMemory();
                goto done;
            }
            ends = grown;
        }
        ends[n++] = e + 1;
        pos = e + 2;
    }
    /* (y# makes None of a NULL pointer: no events, no buffer, an empty bytes) */
    out = Py_BuildValue("(nny#)", pos, n, n ? (const char *)ends : "", n * (Py_ssize_t)sizeof *ends);
done:
    PyMem_Free(ends);
    PyBuffer_Release(&d);
    PyBuffer_Release(&k);
    return out;
}

static PyMethodDef methods[] = {
    {"run", run, METH_VARARGS, "(q, n, ends): the longest run of plain content events (scan.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "scan", NULL, -1, methods};

PyMODINIT_FUNC PyInit_scan(void) { return PyModule_Create(&module); }
