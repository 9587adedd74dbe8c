/* Copies with non-temporal (streaming) stores, the GIL released.
 *
 * A plain memcpy of a buffer that does not fit in cache reads every destination line before it
 * writes it (read-for-ownership): three bytes of memory traffic per byte copied. Streaming stores
 * write whole lines without reading them, so a copy costs two. glibc switches to them only above
 * x86_non_temporal_threshold (3/4 of the reported L3 share, 99 MiB on a VM that reports 260 MiB of
 * L3), so large collective copies below that pay the extra read. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_copy.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#define HAVE_STREAM 1
#else
#define HAVE_STREAM 0
#endif

static void stream_copy(char *dst, const char *src, size_t n)
{
#if HAVE_STREAM
    size_t head = (size_t)(-(uintptr_t)dst) & 63; /* bring dst to a cache-line boundary */
    if (head > n)
        head = n;
    memcpy(dst, src, head);
    dst += head, src += head, n -= head;
    for (; n >= 64; dst += 64, src += 64, n -= 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)src);
        __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)dst, a);
        _mm_stream_si128((__m128i *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(dst + 48), d);
    }
    _mm_sfence(); /* streaming stores are weakly ordered: publish them before returning */
#endif
    memcpy(dst, src, n);
}

/* run `fn(dst, src, nbytes)` on the three integer arguments, the GIL released */
static PyObject *call3(const char *name, void (*fn)(char *, const char *, size_t), PyObject *const *args,
                       Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "%s(dst_addr, src_addr, nbytes) takes 3 integers", name);
        return NULL;
    }
    void *dst = PyLong_AsVoidPtr(args[0]);
    void *src = PyLong_AsVoidPtr(args[1]);
    Py_ssize_t n = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "nbytes must be >= 0");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    fn((char *)dst, (const char *)src, (size_t)n);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static void move_bytes(char *dst, const char *src, size_t n) { rf_move(dst, src, n); }

static PyObject *copy(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return call3("copy", stream_copy, args, nargs);
}

static PyObject *move(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    return call3("move", move_bytes, args, nargs);
}

static PyMethodDef methods[] = {
    {"copy", (PyCFunction)(void (*)(void))copy, METH_FASTCALL,
     "copy(dst_addr, src_addr, nbytes): copy nbytes with streaming stores (no read of the destination)."},
    {"move", (PyCFunction)(void (*)(void))move, METH_FASTCALL,
     "move(dst_addr, src_addr, nbytes): memmove without the 4 KiB-alias slow case of rep movsb (_copy.h)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_streamcopy", "Streaming-store copies for large collective buffers.", -1, methods,
};

PyMODINIT_FUNC PyInit__streamcopy(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "STREAMING", HAVE_STREAM) < 0 ||
                      PyModule_AddIntConstant(m, "ALIAS_MIN_BYTES", RF_ALIAS_MIN_BYTES) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
