/* The call recorder's per-call path (record.py's Recorder.call and call_site_of) in C.
 *
 * `call` is a method descriptor: `class NativeRecorder(Recorder): call = _record.call` runs
 * rec.call(lane, description, meta, guard, fn, deadline, entry=None, async_op=False) here, with the
 * entries, sequence numbers and call sites of the Python version, which stays the reference, and the
 * same caching rules (record._sites, record._internal, MAX_WALK) in tables keyed by code address.
 * Times are CLOCK_MONOTONIC ns, the clock of time.perf_counter_ns on Linux. `pack` turns a batch of
 * entries into the base64 text of the record file's int64 rows. `Ring` writes each call into a flight ring
 * file's mapping (runtime/flightring.py describes the layout; its PyRing is the reference) as the call is
 * entered, started and ended; `install_term_handler` marks every ring ended on SIGTERM, even while Python
 * code cannot run (a rank blocked in a native wait), then lets the signal kill the process. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#if PY_VERSION_HEX < 0x030B0000
#error "the C recorder needs Python 3.11 (PyFrame_GetLasti, PyErr_GetHandledException); older ones record in Python"
#endif
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

enum { LANE, SEQ, META, DESC, T_ENQ, T_START, T_END, CODE, LINE, STATUS, ALGO, ASYNC, NFIELDS };

/* set by setup(): record.py's _internal, thread-local queued site, _is_internal and knobs */
static PyObject *g_internal, *g_queued, *g_is_internal, *g_getframe;
static long g_max_walk = 24, g_flush_every = 1024;
static int g_untrack = 1;

/* Caches keyed by a code object's address (each holds a reference, so the address stays its own):
 * hashing a code object, as a dict keyed by it does, hashes its constants and nested code each time. */
typedef struct {
    PyObject *key;
    long value;
} Slot;

typedef struct {
    Slot *slots;
    size_t mask, count, max_count;   /* max_count: cleared when a new key would pass it */
} Table;

static Table t_internal = {NULL, 0, 0, 1 << 14};   /* record._internal: code -> outside (0) or inside (1) */
static Table t_sites = {NULL, 0, 0, 4097};          /* record._sites (cleared past 4096, as there) */

static inline size_t hash_ptr(const void *p, long salt)
{
    uint64_t x = ((uint64_t)(uintptr_t)p >> 4) ^ ((uint64_t)salt * 0x9E3779B97F4A7C15ULL);
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ULL;
    return (size_t)(x ^ (x >> 32));
}

static int table_init(Table *t)
{
    size_t cap = 1;
    while (cap < 2 * t->max_count)
        cap <<= 1;
    if ((t->slots = PyMem_Calloc(cap, sizeof(Slot))) == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->mask = cap - 1;
    return 0;
}

/* the slot of key, or the empty slot where it would go */
static inline Slot *table_find(Table *t, PyObject *key)
{
    size_t i = hash_ptr(key, 0) & t->mask;
    while (t->slots[i].key != NULL && t->slots[i].key != key)
        i = (i + 1) & t->mask;
    return &t->slots[i];
}

static void table_clear(Table *t)
{
    for (size_t i = 0; i <= t->mask; i++) {
        PyObject *k = t->slots[i].key;
        t->slots[i].key = NULL;
        Py_XDECREF(k);
    }
    t->count = 0;
}

static void table_put(Table *t, PyObject *key, long value)
{
    Slot *s = table_find(t, key);
    if (s->key == NULL) {
        if (t->count >= t->max_count) {
            table_clear(t);
            s = table_find(t, key);
        }
        s->key = Py_NewRef(key);
        t->count++;
    }
    s->value = value;
}

/* a frame's line, cached per (code, instruction offset): finding it walks the code's line table */
#define LINE_SLOTS 1024
static struct {
    PyObject *code, *line;
    int lasti;
} lines[LINE_SLOTS];

static PyObject *s_ring, *s_pending, *s_seqs, *s_coll_seq, *s_last, *s_size, *s_comm, *s_last_schedule,
    *s_flush, *s_failed, *s_site, *s_sink, *s_append, *s_co_filename, *s_name, *s_entry, *s_async_op, *s_empty, *s_fring;

static inline int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int ready(void)
{
    if (g_internal == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ringflow.runtime.native._record: setup() was not called");
        return 0;
    }
    return 1;
}

/* record._inside: 1 if code is ringflow's, torch's or a thread start's, cached per code; -1 on error */
static int inside(PyObject *code)
{
    Slot *slot = table_find(&t_internal, code);
    if (slot->key != NULL)
        return (int)slot->value;
    PyObject *v = PyDict_GetItemWithError(g_internal, code);   /* record.py's cache, then its rule */
    if (v != NULL) {
        Py_INCREF(v);
    } else {
        if (PyErr_Occurred())
            return -1;
        PyObject *fname = PyObject_GetAttr(code, s_co_filename);
        if (fname == NULL)
            return -1;
        v = PyObject_CallOneArg(g_is_internal, fname);
        Py_DECREF(fname);
        if (v == NULL || PyDict_SetItem(g_internal, code, v) < 0) {
            Py_XDECREF(v);
            return -1;
        }
    }
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (t >= 0)
        table_put(&t_internal, code, t);
    return t;
}

/* record._internal.get(code) of a frame: 1, 0, or -1 when not known yet (-2 on error) */
static int internal_of(PyFrameObject *f)
{
    PyObject *code = (PyObject *)PyFrame_GetCode(f);
    Slot *slot = table_find(&t_internal, code);
    int r;
    if (slot->key != NULL) {
        r = (int)slot->value;
    } else {
        PyObject *v = PyDict_GetItemWithError(g_internal, code);
        r = v == NULL ? (PyErr_Occurred() ? -2 : -1) : v == Py_True ? 1 : v == Py_False ? 0 : -1;
        if (r >= 0)
            table_put(&t_internal, code, r);
    }
    Py_DECREF(code);
    return r;
}

/* the site a worker thread's job was queued from (with_site), else (None, 0, no queue time) */
static int queued_site(PyObject **code, PyObject **line, PyObject **queued)
{
    PyObject *s = PyObject_GetAttr(g_queued, s_site);
    if (s == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
    }
    int t = s == NULL ? 0 : PyObject_IsTrue(s);
    if (t < 0) {
        Py_DECREF(s);
        return -1;
    }
    if (!t) {
        Py_XDECREF(s);
        *code = Py_NewRef(Py_None);
        *line = PyLong_FromLong(0);
        *queued = NULL;
        return 0;
    }
    PyObject *c = PySequence_GetItem(s, 0), *l = PySequence_GetItem(s, 1), *q = PySequence_GetItem(s, 2);
    Py_DECREF(s);
    int qt = q == NULL ? -1 : PyObject_IsTrue(q);
    if (c == NULL || l == NULL || qt < 0) {
        Py_XDECREF(c), Py_XDECREF(l), Py_XDECREF(q);
        return -1;
    }
    if (!qt)
        Py_CLEAR(q);
    *code = c, *line = l, *queued = q;
    return 0;
}

static int found(PyFrameObject *g, PyObject **code, PyObject **line)
{
    PyObject *c = (PyObject *)PyFrame_GetCode(g);
    int lasti = PyFrame_GetLasti(g);
    size_t i = hash_ptr(c, lasti) & (LINE_SLOTS - 1);
    if (lines[i].code != c || lines[i].lasti != lasti || lasti < 0) {
        PyObject *l = PyLong_FromLong(PyFrame_GetLineNumber(g));
        if (l == NULL) {
            Py_DECREF(c);
            return -1;
        }
        PyObject *oc = lines[i].code, *ol = lines[i].line;
        lines[i].code = Py_NewRef(c), lines[i].line = l, lines[i].lasti = lasti;
        Py_XDECREF(oc), Py_XDECREF(ol);
    }
    *code = c;
    *line = Py_NewRef(lines[i].line);
    return 0;
}

/* record.call_site_of: new references to code and line, *queued NULL or the (non-zero) queue time.
 * Depths count as in the Python version (0: call_site_of, 1: Recorder.call), so t_sites holds what
 * record._sites would: the frame this is called from (PyEval_GetFrame) is depth 2. */
static int call_site(PyObject **code, PyObject **line, PyObject **queued)
{
    PyFrameObject *f = NULL, *g = NULL;
    PyObject *fcode = NULL;
    int rc = -1;
    *queued = NULL;
    /* sys._getframe(2) from here: the frame 4 up from call_site_of, made without making those below it */
    static PyObject *two;
    if (two == NULL && (two = PyLong_FromLong(2)) == NULL)
        return -1;
    f = (PyFrameObject *)PyObject_CallOneArg(g_getframe, two);
    if (f == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError))   /* a shallow stack */
            return -1;
        PyErr_Clear();
    }
    if (f != NULL) {
        fcode = (PyObject *)PyFrame_GetCode(f);
        Slot *slot = table_find(&t_sites, fcode);
        if (slot->key != NULL) {
            long d = slot->value;
            if (d < 0) {
                rc = queued_site(code, line, queued);
                goto done;
            }
            /* the remembered depth holds if the frames below it are ringflow's or torch's */
            int broke = 0;
            g = (PyFrameObject *)Py_NewRef(f);
            for (long i = 0; i < d - 4; i++) {
                int v = g == NULL ? -1 : internal_of(g);
                if (v == -2)
                    goto done;
                if (v != 1) {
                    broke = 1;
                    break;
                }
                PyFrameObject *b = PyFrame_GetBack(g);
                Py_SETREF(g, b);
            }
            if (!broke && g != NULL) {
                int v = internal_of(g);
                if (v == -2)
                    goto done;
                if (v == 0) {
                    rc = found(g, code, line);
                    goto done;
                }
            }
            Py_CLEAR(g);
        }
    }
    /* walk from depth 2 (the caller: PyEval_GetFrame) outward to the first frame outside ringflow and torch */
    long n = 0, limit = g_max_walk - 2;
    g = (PyFrameObject *)Py_XNewRef(PyEval_GetFrame());
    while (g != NULL && n < limit) {
        PyObject *gc = (PyObject *)PyFrame_GetCode(g);
        int t = inside(gc);
        Py_DECREF(gc);
        if (t < 0)
            goto done;
        if (!t)
            break;
        PyFrameObject *b = PyFrame_GetBack(g);
        Py_SETREF(g, b);
        n++;
    }
    if (g != NULL && n >= limit)
        Py_CLEAR(g);
    if (f != NULL)
        table_put(&t_sites, fcode, g != NULL ? n + 2 : -1);
    rc = g != NULL ? found(g, code, line) : queued_site(code, line, queued);
done:
    Py_XDECREF(g);
    Py_XDECREF(f);
    Py_XDECREF(fcode);
    return rc;
}

/* an attribute of the recorder, from its __dict__ d (a dict lookup, where getattr first searches the class) */
static PyObject *attr(PyObject *d, PyObject *self, PyObject *name)
{
    PyObject *v = PyDict_GetItemWithError(d, name);
    if (v != NULL)
        return Py_NewRef(v);
    return PyErr_Occurred() ? NULL : PyObject_GetAttr(self, name);
}

static PyObject *plus_one(PyObject *v)
{
    static PyObject *one;
    if (one == NULL && (one = PyLong_FromLong(1)) == NULL)
        return NULL;
    return PyNumber_Add(v, one);
}

/* the next sequence number of this call's lane (collectives) or key (lane, peer, tag) */
static PyObject *next_seq(PyObject *d, PyObject *self, PyObject *lane, long lane_v, PyObject *description,
                          PyObject *meta)
{
    if (lane_v == 0) {
        PyObject *seq = attr(d, self, s_coll_seq);
        PyObject *nxt = seq == NULL ? NULL : plus_one(seq);
        if (nxt == NULL || PyDict_SetItem(d, s_coll_seq, nxt) < 0) {
            Py_XDECREF(seq), Py_XDECREF(nxt);
            return NULL;
        }
        Py_DECREF(nxt);
        return seq;
    }
    int mt = PyObject_IsTrue(meta);
    if (mt < 0)
        return NULL;
    PyObject *key;
    if (mt) {
        PyObject *peer = PySequence_GetItem(meta, 3), *tag = PySequence_GetItem(meta, 4);
        key = peer == NULL || tag == NULL ? NULL : PyTuple_Pack(3, lane, peer, tag);
        Py_XDECREF(peer), Py_XDECREF(tag);
    } else {
        key = PyTuple_Pack(2, lane, description);
    }
    PyObject *seqs = key == NULL ? NULL : attr(d, self, s_seqs);
    PyObject *seq = NULL, *nxt = NULL;
    if (seqs != NULL) {
        if (PyDict_CheckExact(seqs)) {   /* seqs.get(key, 0) */
            seq = PyDict_GetItemWithError(seqs, key);
            seq = seq != NULL ? Py_NewRef(seq) : PyErr_Occurred() ? NULL : PyLong_FromLong(0);
        } else if ((seq = PyObject_GetItem(seqs, key)) == NULL && PyErr_ExceptionMatches(PyExc_KeyError)) {
            PyErr_Clear();
            seq = PyLong_FromLong(0);
        }
        nxt = seq == NULL ? NULL : plus_one(seq);
        if (nxt == NULL || PyObject_SetItem(seqs, key, nxt) < 0)
            Py_CLEAR(seq);
    }
    Py_XDECREF(nxt), Py_XDECREF(seqs), Py_XDECREF(key);
    return seq;
}

/* the entry of a new call, in the ring (and pending when recording) */
static PyObject *make_entry(PyObject *d, PyObject *self, PyObject *lane, long lane_v, PyObject *description,
                            PyObject *meta, PyObject *async_op)
{
    PyObject *code, *line, *queued, *e = NULL;
    if (call_site(&code, &line, &queued) < 0)
        return NULL;
    PyObject *seq = next_seq(d, self, lane, lane_v, description, meta);
    int at = seq == NULL ? -1 : PyObject_IsTrue(async_op);
    PyObject *enq = at < 0 ? NULL : queued != NULL ? Py_NewRef(queued) : PyLong_FromLongLong(mono_ns());
    if (enq == NULL || (e = PyList_New(NFIELDS)) == NULL) {
        Py_XDECREF(seq), Py_XDECREF(enq), Py_DECREF(code), Py_DECREF(line), Py_XDECREF(queued);
        return NULL;
    }
    PyList_SET_ITEM(e, LANE, Py_NewRef(lane));
    PyList_SET_ITEM(e, SEQ, seq);
    PyList_SET_ITEM(e, META, Py_NewRef(meta));
    PyList_SET_ITEM(e, DESC, Py_NewRef(description));
    PyList_SET_ITEM(e, T_ENQ, enq);
    PyList_SET_ITEM(e, T_START, PyLong_FromLong(0));
    PyList_SET_ITEM(e, T_END, PyLong_FromLong(0));
    PyList_SET_ITEM(e, CODE, code);
    PyList_SET_ITEM(e, LINE, line);
    PyList_SET_ITEM(e, STATUS, Py_NewRef(s_empty));
    PyList_SET_ITEM(e, ALGO, Py_NewRef(Py_None));
    PyList_SET_ITEM(e, ASYNC, Py_NewRef(at ? async_op : (queued != NULL ? Py_True : Py_False)));
    /* an entry refers to no container that refers back to it: the collector need not look at it */
    if (g_untrack)
        PyObject_GC_UnTrack(e);
    if (queued != NULL) {
        Py_DECREF(queued);
        PyObject *sink = PyObject_GetAttr(g_queued, s_sink);
        if (sink == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                goto fail;
            PyErr_Clear();
        } else if (sink != Py_None) {
            PyObject *pair = PyTuple_Pack(2, self, e);
            PyObject *r = pair == NULL ? NULL : PyObject_CallMethodOneArg(sink, s_append, pair);
            Py_XDECREF(pair);
            if (r == NULL) {
                Py_DECREF(sink);
                goto fail;
            }
            Py_DECREF(r);
        }
        Py_XDECREF(sink);
    }
    PyObject *ring = attr(d, self, s_ring);
    PyObject *r = ring == NULL ? NULL : PyObject_CallMethodOneArg(ring, s_append, e);
    Py_XDECREF(ring);
    if (r == NULL)
        goto fail;
    Py_DECREF(r);
    PyObject *pending = attr(d, self, s_pending);
    if (pending == NULL)
        goto fail;
    if (pending != Py_None) {
        Py_ssize_t n = -1;
        if (PyList_CheckExact(pending)) {
            if (PyList_Append(pending, e) == 0)
                n = PyList_GET_SIZE(pending);
        } else {
            PyObject *ar = PyObject_CallMethodOneArg(pending, s_append, e);
            Py_XDECREF(ar);
            n = ar == NULL ? -1 : PyObject_Length(pending);
        }
        Py_DECREF(pending);
        if (n < 0)
            goto fail;
        if (n >= g_flush_every) {
            PyObject *fr = PyObject_CallMethodNoArgs(self, s_flush);
            if (fr == NULL)
                goto fail;
            Py_DECREF(fr);
        }
    } else {
        Py_DECREF(pending);
    }
    return e;
fail:
    Py_DECREF(e);
    return NULL;
}

/* ---------------------------------------------------------------- the flight ring (runtime/flightring.py) */
enum { S_GEN, S_LANE, S_SEQ, S_ENQ, S_START, S_END, S_OP, S_DTYPE, S_COUNT, S_ROOT, S_REDOP, S_SITE, S_LINE,
       S_STATUS, S_OF, S_SPARE, SLOT_WORDS };
enum { H_HEAD = 3, H_STATE = 4, H_END_NS = 5, H_SIGNAL = 6 };   /* header words */
enum { RING_RUNNING = 0, RING_SIGNALLED = 3 };
#define WAIT_LANE 3
#define RING_NONE INT64_MIN
#define MAX_RINGS 256

typedef struct {
    PyObject_HEAD
    Py_buffer view;      /* the file's mapping, held (so not closed) until release() */
    int64_t *hdr, *slots;
    int64_t nslots, head;
    PyObject *namer;     /* obj -> the offset of its text in the names area (flightring.Names) */
    Table names;         /* what namer said, per object */
    int reg;             /* index in g_rings, -1 */
} Ring;

static PyTypeObject RingType;
/* every live ring's header, for the SIGTERM handler (which may run in any thread, at any time) */
static int64_t *volatile g_rings[MAX_RINGS];

static int64_t i64_or(PyObject *v, int64_t dflt)
{
    if (v == Py_None)
        return dflt;
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if ((x == -1 && PyErr_Occurred()) || overflow) {
        PyErr_Clear();
        return dflt;
    }
    return (int64_t)x;
}

/* the offset of obj's text in the names area; -1 when unknown (the area full, or the namer failed) */
static int64_t name_id(Ring *r, PyObject *obj)
{
    if (obj == Py_None)
        return -1;
    Slot *s = table_find(&r->names, obj);
    if (s->key != NULL)
        return s->value;
    PyObject *v = PyObject_CallOneArg(r->namer, obj);
    int64_t id = v == NULL ? -1 : i64_or(v, -1);
    Py_XDECREF(v);
    if (v == NULL) {
        PyErr_Clear();
        return -1;
    }
    table_put(&r->names, obj, id);
    return id;
}

static inline int64_t *slot_of(Ring *r, int64_t pos)
{
    return r->slots + (pos % r->nslots) * SLOT_WORDS;
}

/* write a new call's slot; its position (-1: the ring is released). Never raises. */
static int64_t ring_enter(Ring *r, PyObject *e)
{
    if (r->slots == NULL || !PyList_Check(e) || PyList_GET_SIZE(e) != NFIELDS)
        return -1;
    PyObject **f = ((PyListObject *)e)->ob_item;
    int64_t pos = r->head++, *s = slot_of(r, pos);   /* taken first: a namer call may let another thread in */
    long lane = (long)i64_or(f[LANE], 0);
    __atomic_store_n(&s[S_GEN], 0, __ATOMIC_RELEASE);
    PyObject *m = f[META];
    if (PyTuple_Check(m) && PyTuple_GET_SIZE(m) == 5) {
        PyObject **q = ((PyTupleObject *)m)->ob_item;
        s[S_OP] = name_id(r, q[0]);
        s[S_DTYPE] = name_id(r, q[1]);
        s[S_COUNT] = i64_or(q[2], 0);
        s[S_ROOT] = i64_or(q[3], RING_NONE);
        s[S_REDOP] = lane == 0 ? name_id(r, q[4]) : i64_or(q[4], -1);
    } else {
        s[S_OP] = name_id(r, f[DESC]);
        s[S_DTYPE] = -1, s[S_COUNT] = 0, s[S_ROOT] = RING_NONE, s[S_REDOP] = -1;
    }
    int at = PyObject_IsTrue(f[ASYNC]);
    if (at < 0) {
        PyErr_Clear();
        at = 0;
    }
    s[S_LANE] = lane | (at ? 256 : 0);
    s[S_SEQ] = i64_or(f[SEQ], -1);
    s[S_ENQ] = i64_or(f[T_ENQ], 0);
    s[S_START] = i64_or(f[T_START], 0);
    s[S_END] = i64_or(f[T_END], 0);
    s[S_SITE] = name_id(r, f[CODE]);
    s[S_LINE] = i64_or(f[LINE], 0);
    s[S_STATUS] = PyUnicode_Check(f[STATUS]) && PyUnicode_GET_LENGTH(f[STATUS]) > 0 ? name_id(r, f[STATUS]) : -1;
    s[S_OF] = lane == WAIT_LANE ? name_id(r, f[DESC]) : -1;
    s[S_SPARE] = 0;
    __atomic_store_n(&s[S_GEN], pos + 1, __ATOMIC_RELEASE);
    __atomic_store_n(&r->hdr[H_HEAD], r->head, __ATOMIC_RELEASE);
    return pos;
}

static inline int64_t *live_slot(Ring *r, int64_t pos)
{
    if (pos < 0 || r->slots == NULL)
        return NULL;
    int64_t *s = slot_of(r, pos);
    return s[S_GEN] == pos + 1 ? s : NULL;   /* else overwritten since */
}

static void ring_start(Ring *r, int64_t pos, int64_t t)
{
    int64_t *s = live_slot(r, pos);
    if (s != NULL)
        s[S_START] = t;
}

static void ring_exit(Ring *r, int64_t pos, PyObject *e)
{
    int64_t *s = live_slot(r, pos);
    if (s == NULL || !PyList_Check(e) || PyList_GET_SIZE(e) != NFIELDS)
        return;
    PyObject **f = ((PyListObject *)e)->ob_item;
    s[S_START] = i64_or(f[T_START], 0);
    s[S_STATUS] = PyUnicode_Check(f[STATUS]) && PyUnicode_GET_LENGTH(f[STATUS]) > 0 ? name_id(r, f[STATUS]) : -1;
    __atomic_store_n(&s[S_END], i64_or(f[T_END], 0), __ATOMIC_RELEASE);
}

/* the position of an entry written earlier (an asynchronous call run later), -1 if overwritten */
static int64_t ring_find(Ring *r, PyObject *e)
{
    if (r->slots == NULL || !PyList_Check(e) || PyList_GET_SIZE(e) != NFIELDS)
        return -1;
    PyObject **f = ((PyListObject *)e)->ob_item;
    int64_t lane = i64_or(f[LANE], -1), seq = i64_or(f[SEQ], -1), enq = i64_or(f[T_ENQ], -1);
    for (int64_t pos = r->head - 1; pos >= 0 && pos >= r->head - r->nslots; pos--) {
        int64_t *s = slot_of(r, pos);
        if (s[S_GEN] == pos + 1 && (s[S_LANE] & 255) == lane && s[S_SEQ] == seq && s[S_ENQ] == enq)
            return pos;
    }
    return -1;
}

static void ring_release(Ring *r)
{
    if (r->reg >= 0) {
        g_rings[r->reg] = NULL;
        r->reg = -1;
    }
    r->hdr = r->slots = NULL;
    if (r->view.obj != NULL)
        PyBuffer_Release(&r->view);
}

/* Ring(mapping, slots_at, nslots, namer) */
static PyObject *ring_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"mapping", "slots_at", "nslots", "namer", NULL};
    PyObject *mapping, *namer;
    Py_ssize_t slots_at, nslots;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OnnO", names, &mapping, &slots_at, &nslots, &namer))
        return NULL;
    if (nslots < 1 || slots_at < 64 || slots_at % 8) {
        PyErr_SetString(PyExc_ValueError, "Ring: nslots >= 1 and a slots_at past the header, a multiple of 8");
        return NULL;
    }
    Ring *r = (Ring *)type->tp_alloc(type, 0);
    if (r == NULL)
        return NULL;
    r->reg = -1;
    r->names.max_count = 1024;
    if (PyObject_GetBuffer(mapping, &r->view, PyBUF_WRITABLE | PyBUF_SIMPLE) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    if (r->view.len < slots_at + nslots * SLOT_WORDS * 8 || ((uintptr_t)r->view.buf & 7)) {
        PyErr_SetString(PyExc_ValueError, "Ring: the mapping is smaller than its slots (or not 8-byte aligned)");
        Py_DECREF(r);
        return NULL;
    }
    if (table_init(&r->names) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    r->hdr = (int64_t *)r->view.buf;
    r->slots = (int64_t *)((char *)r->view.buf + slots_at);
    r->nslots = nslots;
    r->head = r->hdr[H_HEAD];
    r->namer = Py_NewRef(namer);
    for (int i = 0; i < MAX_RINGS; i++) {
        if (g_rings[i] == NULL) {
            g_rings[i] = r->hdr;
            r->reg = i;
            break;
        }
    }
    return (PyObject *)r;
}

static void ring_dealloc(Ring *r)
{
    ring_release(r);
    if (r->names.slots != NULL) {
        table_clear(&r->names);
        PyMem_Free(r->names.slots);
    }
    Py_XDECREF(r->namer);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *ring_enter_m(Ring *r, PyObject *e)
{
    return PyLong_FromLongLong(ring_enter(r, e));
}

static int pos_entry(PyObject *const *args, Py_ssize_t nargs, int64_t *pos)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "(pos, entry) expected");
        return -1;
    }
    *pos = PyLong_AsLongLong(args[0]);
    return *pos == -1 && PyErr_Occurred() ? -1 : 0;
}

static PyObject *ring_start_m(Ring *r, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t pos;
    if (pos_entry(args, nargs, &pos) < 0)
        return NULL;
    if (PyList_Check(args[1]) && PyList_GET_SIZE(args[1]) == NFIELDS)
        ring_start(r, pos, i64_or(PyList_GET_ITEM(args[1], T_START), 0));
    Py_RETURN_NONE;
}

static PyObject *ring_exit_m(Ring *r, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t pos;
    if (pos_entry(args, nargs, &pos) < 0)
        return NULL;
    ring_exit(r, pos, args[1]);
    Py_RETURN_NONE;
}

static PyObject *ring_find_m(Ring *r, PyObject *e)
{
    return PyLong_FromLongLong(ring_find(r, e));
}

static PyObject *ring_release_m(Ring *r, PyObject *unused)
{
    ring_release(r);
    Py_RETURN_NONE;
}

static PyMethodDef ring_methods[] = {
    {"enter", (PyCFunction)ring_enter_m, METH_O, "enter(entry) -> pos: write a new call's slot (-1: released)."},
    {"start", (PyCFunction)(void (*)(void))ring_start_m, METH_FASTCALL, "start(pos, entry): the call started."},
    {"exit", (PyCFunction)(void (*)(void))ring_exit_m, METH_FASTCALL, "exit(pos, entry): its end and status."},
    {"find", (PyCFunction)ring_find_m, METH_O, "find(entry) -> pos of an entry written earlier, or -1."},
    {"release", (PyCFunction)ring_release_m, METH_NOARGS, "release(): stop writing; the mapping may be closed."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ringflow.runtime.native._record.Ring",
    .tp_basicsize = sizeof(Ring),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = ring_new,
    .tp_dealloc = (destructor)ring_dealloc,
    .tp_methods = ring_methods,
    .tp_doc = "Ring(mapping, slots_at, nslots, namer): a flight ring's writer (runtime/flightring.py's layout).",
};

/* SIGTERM: mark every live ring ended (plain stores into shared mappings: async-signal-safe), then die of it */
static void on_term(int sig)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t now = (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    for (int i = 0; i < MAX_RINGS; i++) {
        int64_t *h = g_rings[i];
        if (h != NULL && h[H_STATE] == RING_RUNNING) {
            h[H_END_NS] = now, h[H_SIGNAL] = sig;
            __atomic_store_n(&h[H_STATE], RING_SIGNALLED, __ATOMIC_RELEASE);
        }
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static PyObject *install_term_handler(PyObject *mod, PyObject *unused)
{
    struct sigaction old, act;
    if (sigaction(SIGTERM, NULL, &old) < 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) {
        if (old.sa_handler == on_term)
            Py_RETURN_TRUE;
        Py_RETURN_FALSE;   /* someone handles SIGTERM (or ignores it): leave it to them */
    }
    memset(&act, 0, sizeof act);
    act.sa_handler = on_term;
    sigemptyset(&act.sa_mask);
    act.sa_flags = SA_RESTART;
    if (sigaction(SIGTERM, &act, NULL) < 0)
        Py_RETURN_FALSE;
    Py_RETURN_TRUE;
}

/* the guarded call raised: note when and what, run rec.failed(exc) as the handled exception, raise again */
static PyObject *call_failed(PyObject *self, PyObject *e, Ring *ring, int64_t pos)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (type == NULL) {
        PyErr_SetString(PyExc_SystemError, "the guarded call failed without an exception");
        return NULL;
    }
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *name = PyObject_GetAttr(type, s_name);
    if (name == NULL || PyList_SetItem(e, STATUS, name) < 0 ||
        PyList_SetItem(e, T_END, PyLong_FromLongLong(mono_ns())) < 0) {
        Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
        return NULL;
    }
    if (ring != NULL)
        ring_exit(ring, pos, e);
    PyObject *outer = PyErr_GetHandledException();
    PyErr_SetHandledException(value);
    PyObject *r = PyObject_CallMethodOneArg(self, s_failed, value);
    PyErr_SetHandledException(outer);
    Py_XDECREF(outer);
    if (r == NULL) {   /* the new error propagates, the call's as its context */
        PyObject *t2, *v2, *tb2;
        PyErr_Fetch(&t2, &v2, &tb2);
        PyErr_NormalizeException(&t2, &v2, &tb2);
        if (v2 != NULL && v2 != value)
            PyException_SetContext(v2, value);   /* takes the reference */
        else
            Py_DECREF(value);
        Py_XDECREF(type), Py_XDECREF(tb);
        PyErr_Restore(t2, v2, tb2);
        return NULL;
    }
    Py_DECREF(r);
    PyErr_Restore(type, value, tb);
    return NULL;
}

/* Recorder.call(self, lane, description, meta, guard, fn, deadline, entry=None, async_op=False) */
static PyObject *rec_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 7 || nargs > 9) {
        PyErr_Format(PyExc_TypeError, "call(lane, description, meta, guard, fn, deadline, entry=None, "
                     "async_op=False) takes 6 to 8 arguments after the recorder (%zd given)", nargs - 1);
        return NULL;
    }
    if (!ready())
        return NULL;
    PyObject *entry = nargs > 7 ? args[7] : Py_None, *async_op = nargs > 8 ? args[8] : Py_False;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *k = PyTuple_GET_ITEM(kwnames, i);
        if (k == s_entry || PyUnicode_Compare(k, s_entry) == 0)
            entry = args[nargs + i];
        else if (k == s_async_op || PyUnicode_Compare(k, s_async_op) == 0)
            async_op = args[nargs + i];
        else {
            PyErr_Format(PyExc_TypeError, "call() got an unexpected keyword argument '%U'", k);
            return NULL;
        }
    }
    PyObject *self = args[0], *lane = args[1], *description = args[2], *meta = args[3], *guard = args[4];
    long lane_v = PyLong_AsLong(lane);
    if (lane_v == -1 && PyErr_Occurred())
        return NULL;
    PyObject *d = PyObject_GenericGetDict(self, NULL), *e;   /* the recorder's attributes */
    if (d == NULL)
        return NULL;
    PyObject *fr = PyDict_GetItemWithError(d, s_fring);   /* the flight ring, if it is a C one */
    Ring *ring = fr != NULL && PyObject_TypeCheck(fr, &RingType) ? (Ring *)Py_NewRef(fr) : NULL;
    int64_t pos = -1;
    if (fr == NULL && PyErr_Occurred()) {
        Py_DECREF(d);
        return NULL;
    }
    if (entry == Py_None) {
        if ((e = make_entry(d, self, lane, lane_v, description, meta, async_op)) == NULL) {
            Py_DECREF(d);
            Py_XDECREF(ring);
            return NULL;
        }
        if (ring != NULL)
            pos = ring_enter(ring, e);
    } else {
        e = Py_NewRef(entry);
        if (ring != NULL && guard != Py_None)
            pos = ring_find(ring, e);
    }
    if (guard == Py_None) {
        Py_DECREF(d);
        Py_XDECREF(ring);
        return e;
    }
    if (!PyList_Check(e) || PyList_GET_SIZE(e) != NFIELDS) {
        PyErr_SetString(PyExc_TypeError, "call(entry=...) takes an entry of this recorder (a list of 12 fields)");
        goto fail;
    }
    int64_t t0 = mono_ns();
    if (PyList_SetItem(e, T_START, PyLong_FromLongLong(t0)) < 0)
        goto fail;
    if (ring != NULL)
        ring_start(ring, pos, t0);
    if (lane_v == 0 && PyDict_SetItem(d, s_last, e) < 0)
        goto fail;
    PyObject *gargs[4] = {NULL, args[5], args[6], lane};
    PyObject *r = PyObject_Vectorcall(guard, gargs + 1, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (r == NULL) {
        call_failed(self, e, ring, pos);
        goto fail;
    }
    Py_DECREF(r);
    if (PyList_SetItem(e, T_END, PyLong_FromLongLong(mono_ns())) < 0)
        goto fail;
    if (ring != NULL)
        ring_exit(ring, pos, e);
    if (lane_v == 0) {
        PyObject *size = attr(d, self, s_size);
        long n = size == NULL ? -1 : PyLong_AsLong(size);
        Py_XDECREF(size);
        if (n == -1 && PyErr_Occurred())
            goto fail;
        if (n > 1) {   /* the schedule's name is read when the entry is written */
            PyObject *comm = attr(d, self, s_comm);
            PyObject *sched = comm == NULL ? NULL : PyObject_GetAttr(comm, s_last_schedule);
            Py_XDECREF(comm);
            if (sched == NULL || PyList_SetItem(e, ALGO, sched) < 0)
                goto fail;
        }
    }
    Py_DECREF(d);
    Py_XDECREF(ring);
    return e;
fail:
    Py_DECREF(d);
    Py_XDECREF(ring);
    Py_DECREF(e);
    return NULL;
}

/* ---------------------------------------------------------------- the method descriptor */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
} Method;

static PyObject *method_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

static PyTypeObject MethodType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ringflow.runtime.native._record.method",
    .tp_basicsize = sizeof(Method),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(Method, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = method_get,
    .tp_doc = "Recorder.call in C: a method of the recorder class it is put in.",
};

/* ---------------------------------------------------------------- the record file's rows */
/* pack(entries, desc_id) -> str: the base64 text of the little-endian int64 quintuples (seq, enq_ns, start_ns,
 * end_ns, desc id), one per entry;
 * desc_id(entry) gives an entry's description id. A run of entries of one description (the same lane,
 * meta, description, site, status, algorithm, async and whether it ended) asks desc_id once. */
static int equal(PyObject *a, PyObject *b)
{
    if (a == b)
        return 1;
    int r = PyObject_RichCompareBool(a, b, Py_EQ);
    if (r < 0)
        PyErr_Clear();
    return r > 0;
}

/* record.desc_key(ns, a) == record.desc_key(ns, b), or 0 where unsure (then desc_id decides) */
static int same_desc(PyObject *a, PyObject *b)
{
    PyObject **x = ((PyListObject *)a)->ob_item, **y = ((PyListObject *)b)->ob_item;
    if (x[CODE] != y[CODE] || x[ALGO] != y[ALGO] || !equal(x[LANE], y[LANE]) || !equal(x[LINE], y[LINE]) ||
        !equal(x[STATUS], y[STATUS]) || !equal(x[ASYNC], y[ASYNC]) || !equal(x[DESC], y[DESC]))
        return 0;
    int ea = PyObject_IsTrue(x[T_END]), eb = PyObject_IsTrue(y[T_END]);
    if (ea < 0 || eb < 0) {
        PyErr_Clear();
        return 0;
    }
    if (ea != eb)
        return 0;
    PyObject *m = x[META], *n = y[META];
    if (m == n)
        return 1;
    /* the key holds the ids of the meta's operation and dtype, and its count, root or peer and reduction or tag */
    if (!PyTuple_CheckExact(m) || !PyTuple_CheckExact(n) || PyTuple_GET_SIZE(m) != 5 || PyTuple_GET_SIZE(n) != 5)
        return 0;
    PyObject **p = ((PyTupleObject *)m)->ob_item, **q = ((PyTupleObject *)n)->ob_item;
    return p[0] == q[0] && p[1] == q[1] && equal(p[2], q[2]) && equal(p[3], q[3]) && equal(p[4], q[4]);
}

static int as_i64(PyObject *v, int64_t *out)
{
    int overflow;   /* the ...AndOverflow form: PyLong_AsLongLong goes through a byte array past one digit */
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "pack: a recorder field does not fit in int64");
        return -1;
    }
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)x;
    return 0;
}

/* standard base64 with padding, as base64.b64encode */
static void b64(const unsigned char *in, size_t n, unsigned char *out)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t i = 0;
    for (; i + 3 <= n; i += 3, out += 4) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        out[0] = abc[v >> 18], out[1] = abc[(v >> 12) & 63], out[2] = abc[(v >> 6) & 63], out[3] = abc[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0);
        out[0] = abc[v >> 18], out[1] = abc[(v >> 12) & 63];
        out[2] = i + 1 < n ? abc[(v >> 6) & 63] : '=';
        out[3] = '=';
    }
}

static PyObject *pack(PyObject *mod, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "pack(entries: list, desc_id) -> str");
        return NULL;
    }
    PyObject *entries = args[0], *desc_id = args[1], *prev = NULL, *out = NULL;
    Py_ssize_t n = PyList_GET_SIZE(entries);
    size_t nbytes = (size_t)n * 5 * sizeof(int64_t);
    int64_t *rows = PyMem_Malloc(nbytes + 1), *row = rows, id = -1;
    if (rows == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++, row += 5) {
        if (i >= PyList_GET_SIZE(entries)) {   /* desc_id is Python: it could change the list */
            PyErr_SetString(PyExc_RuntimeError, "pack: the entries changed while they were packed");
            goto done;
        }
        PyObject *e = Py_NewRef(PyList_GET_ITEM(entries, i));
        if (!PyList_Check(e) || PyList_GET_SIZE(e) != NFIELDS) {
            PyErr_SetString(PyExc_TypeError, "pack: an entry is not a recorder entry (a list of 12 fields)");
            Py_DECREF(e);
            goto done;
        }
        int bad = 0;
        if (prev == NULL || !same_desc(prev, e)) {
            PyObject *k = PyObject_CallOneArg(desc_id, e);
            bad = k == NULL || as_i64(k, &id) < 0;
            Py_XDECREF(k);
        }
        PyObject **f = ((PyListObject *)e)->ob_item;
        Py_XSETREF(prev, e);   /* held: the previous entry of the next round */
        if (bad || as_i64(f[SEQ], &row[0]) < 0 || as_i64(f[T_ENQ], &row[1]) < 0 ||
            as_i64(f[T_START], &row[2]) < 0 || as_i64(f[T_END], &row[3]) < 0)
            goto done;
        row[4] = id;
    }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    for (int64_t *p = rows; p < row; p++)   /* the file's rows are little-endian */
        *p = (int64_t)__builtin_bswap64((uint64_t)*p);
#endif
    if ((out = PyUnicode_New((Py_ssize_t)((nbytes + 2) / 3 * 4), 127)) != NULL)
        b64((const unsigned char *)rows, nbytes, PyUnicode_1BYTE_DATA(out));
done:
    Py_XDECREF(prev);
    PyMem_Free(rows);
    return out;
}

/* ---------------------------------------------------------------- set-up */
static PyObject *setup(PyObject *mod, PyObject *args, PyObject *kw)
{
    static char *names[] = {"internal", "queued", "is_internal", "max_walk", "flush_every", "untrack", NULL};
    PyObject *internal, *queued, *is_internal;
    long max_walk, flush_every;
    int untrack = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OOll|p", names, &PyDict_Type, &internal, &queued,
                                     &is_internal, &max_walk, &flush_every, &untrack))
        return NULL;
    if (g_getframe == NULL) {
        PyObject *gf = PySys_GetObject("_getframe");   /* borrowed */
        if (gf == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "sys._getframe is missing");
            return NULL;
        }
        g_getframe = Py_NewRef(gf);
    }
    if (t_internal.slots == NULL && (table_init(&t_internal) < 0 || table_init(&t_sites) < 0))
        return NULL;
    if (internal != g_internal)   /* a new record._internal: what the C side remembered may differ */
        table_clear(&t_internal);
    Py_XSETREF(g_internal, Py_NewRef(internal));
    Py_XSETREF(g_queued, Py_NewRef(queued));
    Py_XSETREF(g_is_internal, Py_NewRef(is_internal));
    g_max_walk = max_walk, g_flush_every = flush_every, g_untrack = untrack;
    Py_RETURN_NONE;
}

static PyObject *clock_ns(PyObject *mod, PyObject *unused)
{
    return PyLong_FromLongLong(mono_ns());
}

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)(void (*)(void))setup, METH_VARARGS | METH_KEYWORDS,
     "setup(internal, queued, is_internal, max_walk, flush_every, untrack=True): record.py's _internal, its "
     "thread-local queued site, _is_internal, MAX_WALK and FLUSH_EVERY; untrack: entries are not the collector's."},
    {"pack", (PyCFunction)(void (*)(void))pack, METH_FASTCALL,
     "pack(entries, desc_id) -> str: base64 of the little-endian int64 rows (seq, enq, start, end, desc id)."},
    {"install_term_handler", install_term_handler, METH_NOARGS,
     "install_term_handler() -> bool: on SIGTERM mark every ring ended, then die of it (only if SIGTERM is unhandled)."},
    {"clock_ns", clock_ns, METH_NOARGS, "clock_ns() -> int: CLOCK_MONOTONIC in ns, the clock of the entries."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_record", "The call recorder's per-call path (record.py's Recorder.call) in C.", -1,
    methods,
};

#define INTERN(var, text)                                   \
    if ((var = PyUnicode_InternFromString(text)) == NULL) \
        return NULL;

PyMODINIT_FUNC PyInit__record(void)
{
    INTERN(s_ring, "ring") INTERN(s_pending, "pending") INTERN(s_seqs, "seqs") INTERN(s_coll_seq, "coll_seq")
    INTERN(s_last, "last") INTERN(s_size, "size") INTERN(s_comm, "comm") INTERN(s_last_schedule, "last_schedule")
    INTERN(s_flush, "flush") INTERN(s_failed, "failed") INTERN(s_site, "site") INTERN(s_sink, "sink")
    INTERN(s_append, "append") INTERN(s_co_filename, "co_filename") INTERN(s_name, "__name__")
    INTERN(s_entry, "entry") INTERN(s_async_op, "async_op") INTERN(s_empty, "") INTERN(s_fring, "fring")
    if (PyType_Ready(&MethodType) < 0 || PyType_Ready(&RingType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Method *call = PyObject_New(Method, &MethodType);
    if (call == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    call->vectorcall = rec_call;
    if (PyModule_AddObjectRef(m, "Ring", (PyObject *)&RingType) < 0) {
        Py_DECREF(call);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddObject(m, "call", (PyObject *)call) < 0) {
        Py_DECREF(call);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
