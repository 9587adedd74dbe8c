/* The call recorder's per-call path (record.py's Recorder.call and call_site_of) in C.
 *
 * `call` is a method descriptor: `class NativeRecorder(Recorder): call = _record.call` runs
 * rec.call(lane, description, meta, guard, fn, deadline, entry=None, async_op=False) here, with the
 * entries, sequence numbers and call sites of the Python version, which stays the reference.
 * `Ring` keeps a communicator's last calls in memory and, once a flight ring file's mapping is attached, in
 * the file too (runtime/flightring.py describes its layout; its PyRing is the reference), each call written as
 * it is entered, started and ended. A synchronous collective of a communicator that is not recording every call
 * (the repeated call of a training loop under `ringflow run`) makes no Python object: its fields go into the
 * ring in place, and its entry list is made only when read (Ring.entries, Ring.last). Other calls keep entry
 * lists, as record.py does. Call sites are found by walking the interpreter's frames without making frame
 * objects (CPython 3.11's frame layout; other versions make frame objects and remember depths, as record.py).
 * Times are CLOCK_MONOTONIC ns, the clock of time.perf_counter_ns on Linux. `pack` turns a batch of entries
 * into the base64 text of the record file's int64 rows; `install_term_handler` marks every ring ended on
 * SIGTERM, even while Python code cannot run (a rank blocked in a native wait), then lets the signal kill the
 * process. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#if PY_VERSION_HEX < 0x030B0000
#error "the C recorder needs Python 3.11 (PyFrame_GetLasti, PyErr_GetHandledException); older ones record in Python"
#endif
#if PY_VERSION_HEX < 0x030C0000
#define RAW_FRAMES 1   /* 3.11: read _PyInterpreterFrame (code, last instruction, caller) directly */
#define Py_BUILD_CORE
#include "internal/pycore_frame.h"
#undef Py_BUILD_CORE
#else
#define RAW_FRAMES 0
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
    long lineno;
    int lasti;
} lines[LINE_SLOTS];

static PyObject *s_pending, *s_seqs, *s_size, *s_comm, *s_last_schedule, *s_flush, *s_failed, *s_site, *s_sink,
    *s_append, *s_co_filename, *s_name, *s_entry, *s_async_op, *s_empty, *s_calls;

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

/* code's line at instruction offset lasti, through the cache (lineno: the line, used on a miss); -1 on error */
static int cached_line(PyObject *c, int lasti, long lineno, PyObject **line, long *out)
{
    size_t i = hash_ptr(c, lasti) & (LINE_SLOTS - 1);
    if (lines[i].code != c || lines[i].lasti != lasti || lasti < 0) {
        PyObject *l = PyLong_FromLong(lineno);
        if (l == NULL)
            return -1;
        PyObject *oc = lines[i].code, *ol = lines[i].line;
        lines[i].code = Py_NewRef(c), lines[i].line = l, lines[i].lineno = lineno, lines[i].lasti = lasti;
        Py_XDECREF(oc), Py_XDECREF(ol);
    }
    if (line != NULL)
        *line = Py_NewRef(lines[i].line);
    *out = lines[i].lineno;
    return 0;
}

#if RAW_FRAMES
/* the line of a frame's last instruction (PyFrame_GetLineNumber), through the cache */
static int frame_line(_PyInterpreterFrame *f, PyObject **line, long *out)
{
    PyObject *c = (PyObject *)f->f_code;
    int lasti = _PyInterpreterFrame_LASTI(f);
    size_t i = hash_ptr(c, lasti) & (LINE_SLOTS - 1);
    if (lines[i].code == c && lines[i].lasti == lasti && lasti >= 0) {
        if (line != NULL)
            *line = Py_NewRef(lines[i].line);
        *out = lines[i].lineno;
        return 0;
    }
    return cached_line(c, lasti, PyCode_Addr2Line(f->f_code, lasti * (int)sizeof(_Py_CODEUNIT)), line, out);
}

/* The codes of the frames the latest site was found through, the user's last, or (path_none) of every frame
 * walked where none was the user's: a call made along the same codes (the repeated call of a loop) has its site in
 * the same place, or none, found without classifying each frame again. Held, so no other code takes an address it
 * names. */
#define PATH_MAX_FRAMES 64
static PyObject *path[PATH_MAX_FRAMES];
static int path_n, path_none;

static void path_clear(void)
{
    for (int i = 0; i < path_n; i++)
        Py_CLEAR(path[i]);
    path_n = 0;
}

static void path_keep(PyObject *const *seen, int n, int none)
{
    path_clear();
    for (int i = 0; i < n; i++)
        path[i] = Py_NewRef(seen[i]);
    path_n = n, path_none = none;
}

/* the next frame from g outward that PyFrame_GetBack would give (incomplete frames skipped) */
static inline _PyInterpreterFrame *complete_from(_PyInterpreterFrame *g)
{
    while (g != NULL && _PyFrame_IsIncomplete(g))
        g = g->previous;
    return g;
}

/* The user's call site of a call entered now: the first frame outside ringflow and torch from the recorder's
 * caller outward, within MAX_WALK - 2 frames (as record.call_site_of counts them). 1: found (code a new
 * reference, its line as *lineno and, if line is given, as a new int); 0: none; -1: error. */
static int user_site(PyObject **code, PyObject **line, long *lineno)
{
    _PyInterpreterFrame *f = PyThreadState_Get()->cframe->current_frame, *g;
    int n = 0;
    for (g = complete_from(f); g != NULL && n < path_n; g = complete_from(g->previous)) {   /* the latest path? */
        if ((PyObject *)g->f_code != path[n])
            break;
        if (++n == path_n) {
            if (!path_none)
                goto found;
            if (n >= g_max_walk - 2 || complete_from(g->previous) == NULL)   /* the walk would stop here again */
                return 0;
            break;
        }
    }
    PyObject *seen[PATH_MAX_FRAMES];
    n = 0;
    for (g = complete_from(f); g != NULL && n < g_max_walk - 2; g = complete_from(g->previous)) {
        int t = inside((PyObject *)g->f_code);
        if (t < 0)
            return -1;
        if (n < PATH_MAX_FRAMES)
            seen[n] = (PyObject *)g->f_code;
        n++;
        if (!t) {
            if (n <= PATH_MAX_FRAMES)
                path_keep(seen, n, 0);
            goto found;
        }
    }
    if (n <= PATH_MAX_FRAMES)
        path_keep(seen, n, 1);
    return 0;
found:
    if (frame_line(g, line, lineno) < 0)
        return -1;
    *code = Py_NewRef((PyObject *)g->f_code);
    return 1;
}
#else
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

static int found(PyFrameObject *g, PyObject **code, PyObject **line, long *lineno)
{
    PyObject *c = (PyObject *)PyFrame_GetCode(g);
    int lasti = PyFrame_GetLasti(g);
    size_t i = hash_ptr(c, lasti) & (LINE_SLOTS - 1);
    int hit = lines[i].code == c && lines[i].lasti == lasti && lasti >= 0;
    if (cached_line(c, lasti, hit ? lines[i].lineno : PyFrame_GetLineNumber(g), line, lineno) < 0) {
        Py_DECREF(c);
        return -1;
    }
    *code = c;
    return 1;
}

/* user_site with frame objects: depths count as in the Python version (0: call_site_of, 1: Recorder.call),
 * so t_sites holds what record._sites would: the frame this is called from (PyEval_GetFrame) is depth 2. */
static int user_site(PyObject **code, PyObject **line, long *lineno)
{
    PyFrameObject *f = NULL, *g = NULL;
    PyObject *fcode = NULL;
    int rc = -1;
    static PyObject *two;   /* sys._getframe(2) from here: the frame 4 up from call_site_of */
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
                rc = 0;
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
                    rc = found(g, code, line, lineno);
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
    rc = g != NULL ? found(g, code, line, lineno) : 0;
done:
    Py_XDECREF(g);
    Py_XDECREF(f);
    Py_XDECREF(fcode);
    return rc;
}
#endif

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

/* record.call_site_of: new references to code and line, *queued NULL or the (non-zero) queue time */
static int call_site(PyObject **code, PyObject **line, PyObject **queued)
{
    long lineno;
    *queued = NULL;
    int r = user_site(code, line, &lineno);
    return r < 0 ? -1 : r > 0 ? 0 : queued_site(code, line, queued);
}

/* ---------------------------------------------------------------- the call ring */
enum { S_GEN, S_LANE, S_SEQ, S_ENQ, S_START, S_END, S_OP, S_DTYPE, S_COUNT, S_ROOT, S_REDOP, S_SITE, S_LINE,
       S_STATUS, S_OF, S_SPARE, SLOT_WORDS };
enum { H_HEAD = 3, H_STATE = 4, H_END_NS = 5, H_SIGNAL = 6, H_TAKEN = 12 };   /* header words */
enum { RING_RUNNING = 0, RING_SIGNALLED = 3 };
#define WAIT_LANE 3
#define RING_NONE INT64_MIN
#define MAX_RINGS 256
#define LAST_HELD (-2)   /* last_pos: the latest collective is the entry held in `last` */

/* one call in memory: an entry list, or (entry NULL) a synchronous collective's fields */
typedef struct {
    int64_t gen;                                     /* the call's position + 1; 0: empty */
    PyObject *entry;
    PyObject *meta, *desc, *code, *status, *algo;    /* status NULL: none; algo NULL: None */
    int64_t seq, enq, start, end, line;
} MSlot;

typedef struct {
    PyObject_HEAD
    MSlot *mem;          /* the last nslots calls */
    MSlot last;          /* the latest collective where its slot was taken since (or it is an entry) */
    int64_t last_pos;    /* its position; -1: none yet; LAST_HELD: in `last` */
    int64_t nslots, head, coll_seq;
    PyObject *comm;      /* the communicator (a weak proxy): its last_schedule names a collective's algorithm */
    long size;           /* the communicator's size: one rank runs no schedule */
    Py_buffer view;      /* the file's mapping, held (so not closed) until release() */
    int64_t *hdr, *slots;
    PyObject *namer;     /* obj -> the offset of its text in the names area (flightring.Names) */
    Table names;         /* what namer said, per object */
    PyObject *k_meta, *k_desc, *k_code;   /* the latest collective's static part (held) ... */
    int64_t k_words[6];  /* ... as its slot's words: op, dtype, count, root, reduction, site */
    int reg;             /* index in g_rings, -1 */
} Ring;

static PyTypeObject RingType;
/* every live ring's header, for the SIGTERM handler (which may run in any thread, at any time) */
static int64_t *volatile g_rings[MAX_RINGS];

static void mslot_release(MSlot *m)
{
    Py_XDECREF(m->entry), Py_XDECREF(m->meta), Py_XDECREF(m->desc), Py_XDECREF(m->code), Py_XDECREF(m->status);
    Py_XDECREF(m->algo);
    memset(m, 0, sizeof *m);
}

/* Take the slot of position pos (the ring's next) for a new call; what it held goes to *old (or, the latest
 * collective's, to r->last, whose previous content goes to *old_last), released by the caller once the new
 * call is in: releasing runs deallocators, which may run Python code. */
static MSlot *mem_take(Ring *r, int64_t pos, MSlot *old, MSlot *old_last)
{
    MSlot *m = &r->mem[pos % r->nslots];
    *old = *m;
    memset(old_last, 0, sizeof *old_last);
    if (old->gen != 0 && old->gen - 1 == r->last_pos) {
        *old_last = r->last;
        r->last = *old;
        memset(old, 0, sizeof *old);
    }
    memset(m, 0, sizeof *m);
    m->gen = pos + 1;
    return m;
}

/* the call at pos, where it still is (its slot, or `last`); NULL if overwritten */
static MSlot *mem_live(Ring *r, int64_t pos)
{
    if (pos < 0)
        return NULL;
    MSlot *m = &r->mem[pos % r->nslots];
    if (m->gen == pos + 1)
        return m;
    return r->last.gen == pos + 1 ? &r->last : NULL;
}

/* a new reference to a slot's entry: the list it holds, or one made of its fields */
static PyObject *mem_entry(MSlot *m)
{
    if (m->entry != NULL)
        return Py_NewRef(m->entry);
    PyObject *e = PyList_New(NFIELDS), *v[NFIELDS] = {
        PyLong_FromLong(0), PyLong_FromLongLong(m->seq), Py_NewRef(m->meta), Py_NewRef(m->desc),
        PyLong_FromLongLong(m->enq), PyLong_FromLongLong(m->start), PyLong_FromLongLong(m->end),
        Py_NewRef(m->code), PyLong_FromLongLong(m->line), Py_NewRef(m->status ? m->status : s_empty),
        Py_NewRef(m->algo ? m->algo : Py_None), Py_NewRef(Py_False)};
    int bad = e == NULL;
    for (int i = 0; i < NFIELDS; i++) {
        bad |= v[i] == NULL;
        if (e != NULL)
            PyList_SET_ITEM(e, i, v[i]);
        else
            Py_XDECREF(v[i]);
    }
    if (bad) {
        Py_XDECREF(e);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    return e;
}

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
    if (obj == Py_None || obj == NULL || r->namer == NULL)
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

static inline int64_t status_id(Ring *r, PyObject *status)
{
    return status != NULL && PyUnicode_Check(status) && PyUnicode_GET_LENGTH(status) > 0 ? name_id(r, status) : -1;
}

/* write the file's slot of a new call at pos (nothing without a mapping). Never raises. */
static void map_write(Ring *r, int64_t pos, long lane, int async, int64_t seq, int64_t enq, int64_t start,
                      int64_t end, PyObject *meta, PyObject *desc, PyObject *code, int64_t line, PyObject *status)
{
    if (r->slots == NULL)
        return;
    int64_t *s = slot_of(r, pos);
    __atomic_store_n(&s[S_GEN], 0, __ATOMIC_RELEASE);
    PyObject *old[3] = {NULL, NULL, NULL};
    if (lane == 0 && meta == r->k_meta && desc == r->k_desc && code == r->k_code) {   /* a repeated collective */
        memcpy(&s[S_OP], r->k_words, 5 * sizeof(int64_t));
        s[S_SITE] = r->k_words[5];
    } else {
        if (PyTuple_Check(meta) && PyTuple_GET_SIZE(meta) == 5) {
            PyObject **q = ((PyTupleObject *)meta)->ob_item;
            s[S_OP] = name_id(r, q[0]);
            s[S_DTYPE] = name_id(r, q[1]);
            s[S_COUNT] = i64_or(q[2], 0);
            s[S_ROOT] = i64_or(q[3], RING_NONE);
            s[S_REDOP] = lane == 0 ? name_id(r, q[4]) : i64_or(q[4], -1);
        } else {
            s[S_OP] = name_id(r, desc);
            s[S_DTYPE] = -1, s[S_COUNT] = 0, s[S_ROOT] = RING_NONE, s[S_REDOP] = -1;
        }
        s[S_SITE] = name_id(r, code);
        if (lane == 0 && r->slots != NULL) {   /* what a collective's static part names: kept with its objects */
            old[0] = r->k_meta, old[1] = r->k_desc, old[2] = r->k_code;
            r->k_meta = Py_NewRef(meta), r->k_desc = Py_NewRef(desc), r->k_code = Py_XNewRef(code);
            memcpy(r->k_words, &s[S_OP], 5 * sizeof(int64_t));
            r->k_words[5] = s[S_SITE];
        }
    }
    s[S_LANE] = lane | (async ? 256 : 0);
    s[S_SEQ] = seq, s[S_ENQ] = enq, s[S_START] = start, s[S_END] = end;
    s[S_LINE] = line;
    s[S_STATUS] = status_id(r, status);
    s[S_OF] = lane == WAIT_LANE ? name_id(r, desc) : -1;
    s[S_SPARE] = 0;
    if (r->slots != NULL) {   /* else released while a namer ran */
        __atomic_store_n(&s[S_GEN], pos + 1, __ATOMIC_RELEASE);
        __atomic_store_n(&r->hdr[H_HEAD], pos + 1 > r->hdr[H_HEAD] ? pos + 1 : r->hdr[H_HEAD], __ATOMIC_RELEASE);
    }
    Py_XDECREF(old[0]), Py_XDECREF(old[1]), Py_XDECREF(old[2]);
}

/* the file's slot of the call at pos, if it is still that call's */
static inline int64_t *live_slot(Ring *r, int64_t pos)
{
    if (pos < 0 || r->slots == NULL)
        return NULL;
    int64_t *s = slot_of(r, pos);
    return s[S_GEN] == pos + 1 ? s : NULL;   /* else overwritten since */
}

static void map_start(Ring *r, int64_t pos, int64_t t)
{
    int64_t *s = live_slot(r, pos);
    if (s != NULL)
        s[S_START] = t;
}

static void map_exit(Ring *r, int64_t pos, int64_t start, PyObject *status, int64_t end)
{
    int64_t *s = live_slot(r, pos);
    if (s == NULL)
        return;
    int64_t st = status_id(r, status);
    if ((s = live_slot(r, pos)) == NULL)
        return;
    s[S_START] = start;
    s[S_STATUS] = st;
    __atomic_store_n(&s[S_END], end, __ATOMIC_RELEASE);
}

static void map_exit_entry(Ring *r, int64_t pos, PyObject *e)
{
    if (!PyList_Check(e) || PyList_GET_SIZE(e) != NFIELDS)
        return;
    PyObject **f = ((PyListObject *)e)->ob_item;
    map_exit(r, pos, i64_or(f[T_START], 0), f[STATUS], i64_or(f[T_END], 0));
}

/* keep a new call's entry (in memory, and in the file's slot); its position, -1 for what is not an entry.
 * Never raises. */
static int64_t ring_keep(Ring *r, PyObject *e)
{
    if (r->mem == NULL || !PyList_Check(e) || PyList_GET_SIZE(e) != NFIELDS)
        return -1;
    int64_t pos = r->head++;   /* taken first: a namer call may let another thread in */
    MSlot old, old_last, *m = mem_take(r, pos, &old, &old_last);
    m->entry = Py_NewRef(e);
    PyObject **f = ((PyListObject *)e)->ob_item;
    long lane = (long)i64_or(f[LANE], 0);
    int at = PyObject_IsTrue(f[ASYNC]);
    if (at < 0) {
        PyErr_Clear();
        at = 0;
    }
    map_write(r, pos, lane, at, i64_or(f[SEQ], -1), i64_or(f[T_ENQ], 0), i64_or(f[T_START], 0),
              i64_or(f[T_END], 0), f[META], f[DESC], f[CODE], i64_or(f[LINE], 0), f[STATUS]);
    mslot_release(&old);
    mslot_release(&old_last);
    return pos;
}

/* the latest collective is entry e (an entry-path call) */
static void ring_last_entry(Ring *r, PyObject *e)
{
    MSlot old = r->last;
    memset(&r->last, 0, sizeof r->last);
    r->last.entry = Py_NewRef(e);
    r->last_pos = LAST_HELD;
    mslot_release(&old);
}

/* the position of an entry kept earlier (an asynchronous call run later), -1 if overwritten */
static int64_t ring_find(Ring *r, PyObject *e)
{
    for (int64_t pos = r->head - 1; r->mem != NULL && pos >= 0 && pos >= r->head - r->nslots; pos--) {
        MSlot *m = &r->mem[pos % r->nslots];
        if (m->gen == pos + 1 && m->entry == e)
            return pos;
    }
    return -1;
}

/* leave the slot of the call at pos empty, in memory and in the file (a call taken back: it did not run) */
static void ring_hole(Ring *r, int64_t pos)
{
    if (pos < 0 || r->mem == NULL)
        return;
    MSlot *m = &r->mem[pos % r->nslots], old = {0};
    if (m->gen == pos + 1) {
        old = *m;
        memset(m, 0, sizeof *m);
    }
    int64_t *s = live_slot(r, pos);
    if (s != NULL) {
        __atomic_store_n(&s[S_GEN], 0, __ATOMIC_RELEASE);
        __atomic_store_n(&r->hdr[H_TAKEN], r->hdr[H_TAKEN] + 1, __ATOMIC_RELEASE);
    }
    mslot_release(&old);
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

/* attach a flight ring file's mapping (flightring.create) to a ring: every call from now on is written there */
static int ring_attach(Ring *r, PyObject *mapping, Py_ssize_t slots_at, PyObject *namer)
{
    if (r->view.obj != NULL || r->names.slots != NULL) {
        PyErr_SetString(PyExc_ValueError, "Ring.attach: the ring has a mapping already");
        return -1;
    }
    if (slots_at < 64 || slots_at % 8) {
        PyErr_SetString(PyExc_ValueError, "Ring: a slots_at past the header, a multiple of 8");
        return -1;
    }
    r->names.max_count = 1024;
    if (PyObject_GetBuffer(mapping, &r->view, PyBUF_WRITABLE | PyBUF_SIMPLE) < 0)
        return -1;
    if (r->view.len < slots_at + r->nslots * SLOT_WORDS * 8 || ((uintptr_t)r->view.buf & 7)) {
        PyErr_SetString(PyExc_ValueError, "Ring: the mapping is smaller than its slots (or not 8-byte aligned)");
        PyBuffer_Release(&r->view);
        return -1;
    }
    if (table_init(&r->names) < 0) {
        PyBuffer_Release(&r->view);
        return -1;
    }
    r->hdr = (int64_t *)r->view.buf;
    r->slots = (int64_t *)((char *)r->view.buf + slots_at);
    Py_XSETREF(r->namer, Py_NewRef(namer));
    for (int i = 0; i < MAX_RINGS; i++) {
        if (g_rings[i] == NULL) {
            g_rings[i] = r->hdr;
            r->reg = i;
            break;
        }
    }
    return 0;
}

/* Ring(mapping, slots_at, nslots, namer, comm=None, size=1); mapping None: in memory until attach() */
static PyObject *ring_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"mapping", "slots_at", "nslots", "namer", "comm", "size", NULL};
    PyObject *mapping, *namer, *comm = Py_None;
    Py_ssize_t slots_at, nslots;
    long size = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OnnO|Ol", names, &mapping, &slots_at, &nslots, &namer, &comm,
                                     &size))
        return NULL;
    if (nslots < 1) {
        PyErr_SetString(PyExc_ValueError, "Ring: nslots >= 1");
        return NULL;
    }
    Ring *r = (Ring *)type->tp_alloc(type, 0);
    if (r == NULL)
        return NULL;
    r->reg = -1;
    r->last_pos = -1;
    r->nslots = nslots;
    r->size = size;
    r->comm = Py_NewRef(comm);
    if ((r->mem = PyMem_Calloc((size_t)nslots, sizeof(MSlot))) == NULL) {
        Py_DECREF(r);
        return PyErr_NoMemory();
    }
    if (mapping != Py_None && ring_attach(r, mapping, slots_at, namer) < 0) {
        Py_DECREF(r);
        return NULL;
    }
    return (PyObject *)r;
}

static int ring_traverse(Ring *r, visitproc visit, void *arg)
{
    for (int64_t i = 0; r->mem != NULL && i <= r->nslots; i++) {
        MSlot *m = i < r->nslots ? &r->mem[i] : &r->last;
        Py_VISIT(m->entry);
        Py_VISIT(m->meta);
        Py_VISIT(m->desc);
        Py_VISIT(m->code);
        Py_VISIT(m->status);
        Py_VISIT(m->algo);
    }
    Py_VISIT(r->comm);
    Py_VISIT(r->namer);
    Py_VISIT(r->k_meta);
    Py_VISIT(r->k_desc);
    Py_VISIT(r->k_code);
    return 0;
}

static int ring_clear(Ring *r)
{
    for (int64_t i = 0; r->mem != NULL && i < r->nslots; i++)
        mslot_release(&r->mem[i]);
    mslot_release(&r->last);
    r->last_pos = -1;
    Py_CLEAR(r->comm);
    Py_CLEAR(r->namer);
    Py_CLEAR(r->k_meta);
    Py_CLEAR(r->k_desc);
    Py_CLEAR(r->k_code);
    return 0;
}

static void ring_dealloc(Ring *r)
{
    PyObject_GC_UnTrack(r);
    ring_release(r);
    ring_clear(r);
    PyMem_Free(r->mem);
    if (r->names.slots != NULL) {
        table_clear(&r->names);
        PyMem_Free(r->names.slots);
    }
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *ring_enter_m(Ring *r, PyObject *e)
{
    return PyLong_FromLongLong(ring_keep(r, e));
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
        map_start(r, pos, i64_or(PyList_GET_ITEM(args[1], T_START), 0));
    Py_RETURN_NONE;
}

static PyObject *ring_exit_m(Ring *r, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t pos;
    if (pos_entry(args, nargs, &pos) < 0)
        return NULL;
    map_exit_entry(r, pos, args[1]);
    Py_RETURN_NONE;
}

static PyObject *ring_find_m(Ring *r, PyObject *e)
{
    return PyLong_FromLongLong(ring_find(r, e));
}

static PyObject *ring_cancel_m(Ring *r, PyObject *pos)
{
    int64_t p = PyLong_AsLongLong(pos);
    if (p == -1 && PyErr_Occurred())
        return NULL;
    ring_hole(r, p);
    Py_RETURN_NONE;
}

static PyObject *ring_release_m(Ring *r, PyObject *unused)
{
    ring_release(r);
    Py_RETURN_NONE;
}

static PyObject *ring_attach_m(Ring *r, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t slots_at;
    if (nargs != 3 || (slots_at = PyLong_AsSsize_t(args[1])) == -1) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "attach(mapping, slots_at, namer)");
        return NULL;
    }
    if (ring_attach(r, args[0], slots_at, args[2]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *ring_entries_m(Ring *r, PyObject *unused)
{
    PyObject *out = PyList_New(0);
    for (int64_t pos = r->head - r->nslots > 0 ? r->head - r->nslots : 0; out != NULL && pos < r->head; pos++) {
        MSlot *m = &r->mem[pos % r->nslots];
        if (m->gen != pos + 1)
            continue;
        PyObject *e = mem_entry(m);
        if (e == NULL || PyList_Append(out, e) < 0)
            Py_CLEAR(out);
        Py_XDECREF(e);
    }
    return out;
}

static PyObject *ring_last_m(Ring *r, PyObject *unused)
{
    MSlot *m = r->last_pos == LAST_HELD ? &r->last : mem_live(r, r->last_pos);
    return m == NULL ? Py_NewRef(Py_None) : mem_entry(m);
}

static PyObject *ring_get_coll_seq(Ring *r, void *unused)
{
    return PyLong_FromLongLong(r->coll_seq);
}

static int ring_set_coll_seq(Ring *r, PyObject *v, void *unused)
{
    long long x = v == NULL ? -1 : PyLong_AsLongLong(v);
    if (x == -1 && (v == NULL || PyErr_Occurred())) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "coll_seq cannot be deleted");
        return -1;
    }
    r->coll_seq = x;
    return 0;
}

static PyGetSetDef ring_getset[] = {
    {"coll_seq", (getter)ring_get_coll_seq, (setter)ring_set_coll_seq, "the next collective's sequence number", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef ring_methods[] = {
    {"enter", (PyCFunction)ring_enter_m, METH_O, "enter(entry) -> pos: keep a new call's entry (-1: not an entry)."},
    {"start", (PyCFunction)(void (*)(void))ring_start_m, METH_FASTCALL, "start(pos, entry): the call started."},
    {"exit", (PyCFunction)(void (*)(void))ring_exit_m, METH_FASTCALL, "exit(pos, entry): its end and status."},
    {"find", (PyCFunction)ring_find_m, METH_O, "find(entry) -> pos of an entry kept earlier, or -1."},
    {"cancel", (PyCFunction)ring_cancel_m, METH_O, "cancel(pos): leave the call's slot empty (it did not run)."},
    {"release", (PyCFunction)ring_release_m, METH_NOARGS, "release(): stop writing the file; the mapping may be closed."},
    {"attach", (PyCFunction)(void (*)(void))ring_attach_m, METH_FASTCALL,
     "attach(mapping, slots_at, namer): write every call from now on into a flight ring file's mapping too."},
    {"entries", (PyCFunction)ring_entries_m, METH_NOARGS, "entries() -> the kept calls' entries, oldest first."},
    {"last", (PyCFunction)ring_last_m, METH_NOARGS, "last() -> the latest collective's entry, or None."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "ringflow.runtime.native._record.Ring",
    .tp_basicsize = sizeof(Ring),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = ring_new,
    .tp_dealloc = (destructor)ring_dealloc,
    .tp_traverse = (traverseproc)ring_traverse,
    .tp_clear = (inquiry)ring_clear,
    .tp_methods = ring_methods,
    .tp_getset = ring_getset,
    .tp_doc = "Ring(mapping, slots_at, nslots, namer, comm=None, size=1): a communicator's last calls, in memory "
              "and in a flight ring file's mapping (runtime/flightring.py's layout; mapping None: attach() later).",
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


/* ---------------------------------------------------------------- the recorded call */
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

/* the next sequence number of this call's lane (collectives: the ring's count) or key (lane, peer, tag) */
static PyObject *next_seq(PyObject *d, PyObject *self, Ring *ring, PyObject *lane, long lane_v,
                          PyObject *description, PyObject *meta)
{
    if (lane_v == 0)
        return PyLong_FromLongLong(ring->coll_seq++);
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

/* the entry of a new call, kept in the ring (*pos: its position) and in pending when recording */
static PyObject *make_entry(PyObject *d, PyObject *self, Ring *ring, PyObject *lane, long lane_v,
                            PyObject *description, PyObject *meta, PyObject *async_op, int64_t *pos)
{
    PyObject *code, *line, *queued, *e = NULL;
    if (call_site(&code, &line, &queued) < 0)
        return NULL;
    PyObject *seq = next_seq(d, self, ring, lane, lane_v, description, meta);
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
    *pos = ring_keep(ring, e);
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

/* The guarded call raised (the error set; *type_name a new reference to its type's name, NULL on error): fetch it.
 * Returns 0, or -1 with an error set (then nothing is fetched). */
static int fetch_failure(PyObject **type, PyObject **value, PyObject **tb, PyObject **type_name)
{
    PyErr_Fetch(type, value, tb);
    if (*type == NULL) {
        PyErr_SetString(PyExc_SystemError, "the guarded call failed without an exception");
        return -1;
    }
    PyErr_NormalizeException(type, value, tb);
    if (*tb != NULL)
        PyException_SetTraceback(*value, *tb);
    if ((*type_name = PyObject_GetAttr(*type, s_name)) == NULL) {
        Py_XDECREF(*type), Py_XDECREF(*value), Py_XDECREF(*tb);
        return -1;
    }
    return 0;
}

/* run rec.failed(exc) as the handled exception, then raise the call's error again (or failed's, the call's as
 * its context); takes the references */
static PyObject *reraise_after_failed(PyObject *self, PyObject *type, PyObject *value, PyObject *tb)
{
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

/* an entry-path call raised: note when and what in its entry and the file */
static PyObject *call_failed(PyObject *self, PyObject *e, Ring *ring, int64_t pos)
{
    PyObject *type, *value, *tb, *name;
    if (fetch_failure(&type, &value, &tb, &name) < 0)
        return NULL;
    if (PyList_SetItem(e, STATUS, name) < 0 || PyList_SetItem(e, T_END, PyLong_FromLongLong(mono_ns())) < 0) {
        Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
        return NULL;
    }
    map_exit_entry(ring, pos, e);
    return reraise_after_failed(self, type, value, tb);
}

/* Note a synchronous collective entered at t0 as fields in the ring (no entry list): its position. code (the
 * user's site, a new reference) and line come from user_site. */
static int64_t inline_enter(Ring *ring, PyObject *description, PyObject *meta, PyObject *code, long line,
                            int64_t t0)
{
    int64_t pos = ring->head++, seq = ring->coll_seq++;
    MSlot old, old_last, *m = mem_take(ring, pos, &old, &old_last);
    m->meta = Py_NewRef(meta), m->desc = Py_NewRef(description), m->code = code;
    m->seq = seq, m->enq = m->start = t0, m->line = line;
    ring->last_pos = pos;
    map_write(ring, pos, 0, 0, seq, t0, t0, 0, meta, description, code, line, NULL);
    mslot_release(&old);
    mslot_release(&old_last);
    return pos;
}

/* the inline call at pos raised (the error set): note when and what, run rec.failed, raise again */
static PyObject *inline_failed(PyObject *self, Ring *ring, int64_t pos, int64_t t0, int64_t t1)
{
    PyObject *type, *value, *tb, *name;
    if (fetch_failure(&type, &value, &tb, &name) < 0)
        return NULL;
    MSlot *m = mem_live(ring, pos);
    if (m != NULL) {
        m->end = t1;
        Py_XSETREF(m->status, Py_NewRef(name));
    }
    map_exit(ring, pos, t0, name, t1);
    Py_DECREF(name);
    return reraise_after_failed(self, type, value, tb);
}

/* the inline call at pos ended at t1: its algorithm (the communicator's last schedule) and end; -1 on error */
static int inline_exit(Ring *ring, int64_t pos, int64_t t0, int64_t t1)
{
    PyObject *sched = NULL;
    if (ring->size > 1 && ring->comm != NULL) {   /* the schedule's name is read when the entry is written */
        PyObject *comm = PyWeakref_Check(ring->comm) ? PyWeakref_GetObject(ring->comm) : ring->comm;
        if (comm == NULL || (comm != Py_None && (sched = PyObject_GetAttr(comm, s_last_schedule)) == NULL))
            return -1;
    }
    MSlot *m = mem_live(ring, pos);
    if (m != NULL) {
        m->end = t1;
        Py_XSETREF(m->algo, sched);
    } else {
        Py_XDECREF(sched);
    }
    map_exit(ring, pos, t0, NULL, t1);
    return 0;
}

/* take back the collective at pos, numbered seq, which did not run (the full path records it): its slot left
 * empty, its sequence number and the latest collective (prev_last) as they were */
static void take_back(Ring *r, int64_t pos, int64_t seq, int64_t prev_last)
{
    ring_hole(r, pos);
    if (r->coll_seq == seq + 1)
        r->coll_seq = seq;
    if (r->last_pos == pos)
        r->last_pos = prev_last;
}

/* A synchronous collective, not recorded in full: its fields go into the ring's slot in place (no entry list). */
static PyObject *call_inline(PyObject *self, Ring *ring, PyObject *const *args, PyObject *code, long line)
{
    int64_t t0 = mono_ns(), pos = inline_enter(ring, args[2], args[3], code, line, t0);
    PyObject *gargs[4] = {NULL, args[5], args[6], args[1]};
    PyObject *r = PyObject_Vectorcall(args[4], gargs + 1, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    int64_t t1 = mono_ns();
    if (r == NULL)
        return inline_failed(self, ring, pos, t0, t1);
    Py_DECREF(r);
    if (inline_exit(ring, pos, t0, t1) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* an entry-path call: Recorder.call's steps as record.py takes them */
static PyObject *call_entry(PyObject *self, PyObject *d, Ring *ring, PyObject *const *args, long lane_v,
                            PyObject *entry, PyObject *async_op)
{
    PyObject *lane = args[1], *description = args[2], *meta = args[3], *guard = args[4], *e;
    int64_t pos = -1;
    if (entry == Py_None) {
        if ((e = make_entry(d, self, ring, lane, lane_v, description, meta, async_op, &pos)) == NULL)
            return NULL;
    } else {
        e = Py_NewRef(entry);
        if (guard != Py_None)
            pos = ring_find(ring, e);
    }
    if (guard == Py_None)
        return e;
    if (!PyList_Check(e) || PyList_GET_SIZE(e) != NFIELDS) {
        PyErr_SetString(PyExc_TypeError, "call(entry=...) takes an entry of this recorder (a list of 12 fields)");
        goto fail;
    }
    int64_t t0 = mono_ns();
    if (PyList_SetItem(e, T_START, PyLong_FromLongLong(t0)) < 0)
        goto fail;
    map_start(ring, pos, t0);
    if (lane_v == 0)
        ring_last_entry(ring, e);
    PyObject *gargs[4] = {NULL, args[5], args[6], lane};
    PyObject *r = PyObject_Vectorcall(guard, gargs + 1, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (r == NULL) {
        call_failed(self, e, ring, pos);
        goto fail;
    }
    Py_DECREF(r);
    if (PyList_SetItem(e, T_END, PyLong_FromLongLong(mono_ns())) < 0)
        goto fail;
    map_exit_entry(ring, pos, e);
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
    Py_DECREF(e);
    Py_RETURN_NONE;
fail:
    Py_DECREF(e);
    return NULL;
}

/* the recorder's __dict__ (*d, a new reference) and its C ring (a new reference); NULL with an error set */
static Ring *recorder_ring(PyObject *self, PyObject **d)
{
    if (!ready() || (*d = PyObject_GenericGetDict(self, NULL)) == NULL)
        return NULL;
    PyObject *rv = PyDict_GetItemWithError(*d, s_calls);
    if (rv == NULL || !PyObject_TypeCheck(rv, &RingType)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "the recorder keeps no _record.Ring as `calls` "
                            "(record_native.NativeRecorder makes one)");
        Py_CLEAR(*d);
        return NULL;
    }
    return (Ring *)Py_NewRef(rv);
}

/* the user's site of a collective kept as fields: 1 (code a new reference: None, line 0, where no frame is the
 * user's), 0 where it is kept as an entry (recording every call, or a worker thread's queued job), -1 on error */
static int inline_site(PyObject *d, PyObject **code, long *line)
{
    PyObject *pending = PyDict_GetItemWithError(d, s_pending);
    if (pending != Py_None)
        return PyErr_Occurred() ? -1 : 0;
    int r = user_site(code, NULL, line);
    if (r != 0)
        return r;
    /* every frame is ringflow's (a benchmark run as __main__) or torch's: call_site's (None, 0) unless a queued
     * job's site and queue time apply, which an entry keeps */
    PyObject *s = PyObject_GetAttr(g_queued, s_site);
    if (s == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_AttributeError))
            return -1;
        PyErr_Clear();
    }
    int queued = s == NULL ? 0 : PyObject_IsTrue(s);
    Py_XDECREF(s);
    if (queued != 0)
        return queued < 0 ? -1 : 0;
    *code = Py_NewRef(Py_None), *line = 0;
    return 1;
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
    long lane_v = PyLong_AsLong(args[1]);
    if (lane_v == -1 && PyErr_Occurred())
        return NULL;
    PyObject *d, *r = NULL;
    Ring *ring = recorder_ring(args[0], &d);
    if (ring == NULL)
        return NULL;
    if (entry == Py_None && lane_v == 0 && args[4] != Py_None && (async_op == Py_False || async_op == Py_None)) {
        PyObject *code;
        long line;
        int site = inline_site(d, &code, &line);
        if (site != 0) {
            r = site < 0 ? NULL : call_inline(args[0], ring, args, code, line);
            goto done;
        }
    }
    r = call_entry(args[0], d, ring, args, lane_v, entry, async_op);
done:
    Py_DECREF(d);
    Py_DECREF(ring);
    return r;
}

/* remove the item of list `l` that is e (or, pairs, whose second item is e), from the end */
static void remove_identical(PyObject *l, PyObject *e, int pairs)
{
    if (l == NULL || !PyList_Check(l))
        return;
    for (Py_ssize_t i = PyList_GET_SIZE(l) - 1; i >= 0; i--) {
        PyObject *it = PyList_GET_ITEM(l, i);
        if (pairs ? PyTuple_Check(it) && PyTuple_GET_SIZE(it) == 2 && PyTuple_GET_ITEM(it, 1) == e : it == e) {
            if (PyList_SetSlice(l, i, i + 1, NULL) < 0)
                PyErr_Clear();
            return;
        }
    }
}

/* run, kept as an entry: Recorder.run's steps as record.py takes them */
static PyObject *run_entry(PyObject *self, PyObject *d, Ring *ring, PyObject *const *args, Py_ssize_t nargs)
{
    static PyObject *zero;
    if (zero == NULL && (zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    int64_t pos = -1, prev_last = ring->last_pos;
    MSlot prev = ring->last;   /* held again below: ring_last_entry releases the ring's */
    Py_XINCREF(prev.entry), Py_XINCREF(prev.meta), Py_XINCREF(prev.desc), Py_XINCREF(prev.code);
    Py_XINCREF(prev.status), Py_XINCREF(prev.algo);
    PyObject *e = make_entry(d, self, ring, zero, 0, args[1], args[2], Py_False, &pos), *r = NULL;
    int64_t seq = ring->coll_seq - 1;
    if (e == NULL)
        goto done;
    int64_t t0 = mono_ns();
    if (PyList_SetItem(e, T_START, PyLong_FromLongLong(t0)) < 0)
        goto done;
    map_start(ring, pos, t0);
    ring_last_entry(ring, e);
    r = PyObject_Vectorcall(args[4], args + 5, (size_t)(nargs - 5), NULL);
    if (r == NULL) {
        call_failed(self, e, ring, pos);
    } else if (r == args[3]) {   /* ran nothing */
        take_back(ring, pos, seq, prev_last);
        MSlot held = ring->last;
        ring->last = prev, ring->last_pos = prev_last;
        memset(&prev, 0, sizeof prev);
        mslot_release(&held);
        PyObject *pending = PyDict_GetItemWithError(d, s_pending);
        remove_identical(pending, e, 0);
        PyObject *sink = PyObject_GetAttr(g_queued, s_sink);
        if (sink == NULL)
            PyErr_Clear();
        remove_identical(sink, e, 1);
        Py_XDECREF(sink);
    } else if (PyList_SetItem(e, T_END, PyLong_FromLongLong(mono_ns())) < 0) {
        Py_CLEAR(r);
    } else {
        map_exit_entry(ring, pos, e);
        PyObject *size = attr(d, self, s_size);
        long n = size == NULL ? -1 : PyLong_AsLong(size);
        Py_XDECREF(size);
        if (n > 1) {   /* the schedule's name is read when the entry is written */
            PyObject *comm = attr(d, self, s_comm);
            PyObject *sched = comm == NULL ? NULL : PyObject_GetAttr(comm, s_last_schedule);
            Py_XDECREF(comm);
            if (sched == NULL || PyList_SetItem(e, ALGO, sched) < 0)
                Py_CLEAR(r);
        } else if (n == -1 && PyErr_Occurred()) {
            Py_CLEAR(r);
        }
    }
done:
    mslot_release(&prev);
    Py_XDECREF(e);
    return r;
}

/* Recorder.run(self, description, meta, miss, fn, *args): fn(*args), a collective run without the
 * communicator's guard (the remembered-call path on NumPy arrays), recorded as call() records one; fn returning
 * `miss` ran nothing, and its record is taken back */
static PyObject *rec_run(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 5 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0)) {
        PyErr_SetString(PyExc_TypeError, "run(description, meta, miss, fn, *args) takes no keyword arguments");
        return NULL;
    }
    PyObject *d, *r, *code;
    long line;
    Ring *ring = recorder_ring(args[0], &d);
    if (ring == NULL)
        return NULL;
    int site = inline_site(d, &code, &line);
    if (site > 0) {
        int64_t prev_last = ring->last_pos, t0 = mono_ns(), seq = ring->coll_seq;
        int64_t pos = inline_enter(ring, args[1], args[2], code, line, t0);
        r = PyObject_Vectorcall(args[4], args + 5, (size_t)(nargs - 5), NULL);
        int64_t t1 = mono_ns();
        if (r == NULL)
            r = inline_failed(args[0], ring, pos, t0, t1);
        else if (r == args[3])
            take_back(ring, pos, seq, prev_last);
        else if (inline_exit(ring, pos, t0, t1) < 0)
            Py_CLEAR(r);
    } else {
        r = site < 0 ? NULL : run_entry(args[0], d, ring, args, nargs);
    }
    Py_DECREF(d);
    Py_DECREF(ring);
    return r;
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
    .tp_doc = "Recorder.call or Recorder.run in C: a method of the recorder class it is put in.",
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
#if RAW_FRAMES
    path_clear();   /* found under the knobs as they were */
#endif
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
    INTERN(s_calls, "calls") INTERN(s_pending, "pending") INTERN(s_seqs, "seqs")
    INTERN(s_size, "size") INTERN(s_comm, "comm") INTERN(s_last_schedule, "last_schedule")
    INTERN(s_flush, "flush") INTERN(s_failed, "failed") INTERN(s_site, "site") INTERN(s_sink, "sink")
    INTERN(s_append, "append") INTERN(s_co_filename, "co_filename") INTERN(s_name, "__name__")
    INTERN(s_entry, "entry") INTERN(s_async_op, "async_op") INTERN(s_empty, "")
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
    Method *run = PyObject_New(Method, &MethodType);
    if (run == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    run->vectorcall = rec_run;
    if (PyModule_AddObject(m, "run", (PyObject *)run) < 0) {
        Py_DECREF(run);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
