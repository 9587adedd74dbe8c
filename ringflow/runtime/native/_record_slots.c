/* The call ring's slots: a communicator's last calls kept in memory (entry lists, or a synchronous collective's
 * fields) and, once a flight ring file's mapping is attached, written into the file's slots as each call is
 * entered, started and ended (runtime/recording/flightring.py describes the layout). */
#include "_record.h"

/* every live ring's header, for the SIGTERM handler (which may run in any thread, at any time) */
int64_t *volatile g_rings[MAX_RINGS];

void rec_mslot_release(MSlot *m)
{
    Py_XDECREF(m->entry), Py_XDECREF(m->meta), Py_XDECREF(m->desc), Py_XDECREF(m->code), Py_XDECREF(m->status);
    Py_XDECREF(m->algo);
    memset(m, 0, sizeof *m);
}

/* Take the slot of position pos (the ring's next) for a new call; what it held goes to *old (or, the latest
 * collective's, to r->last, whose previous content goes to *old_last), released by the caller once the new
 * call is in: releasing runs deallocators, which may run Python code. */
MSlot *rec_mem_take(Ring *r, int64_t pos, MSlot *old, MSlot *old_last)
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
MSlot *rec_mem_live(Ring *r, int64_t pos)
{
    if (pos < 0)
        return NULL;
    MSlot *m = &r->mem[pos % r->nslots];
    if (m->gen == pos + 1)
        return m;
    return r->last.gen == pos + 1 ? &r->last : NULL;
}

/* a new reference to a slot's entry: the list it holds, or one made of its fields */
PyObject *rec_mem_entry(MSlot *m)
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

int64_t rec_i64_or(PyObject *v, int64_t dflt)
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
    Slot *s = rec_table_find(&r->names, obj);
    if (s->key != NULL)
        return s->value;
    PyObject *v = PyObject_CallOneArg(r->namer, obj);
    int64_t id = v == NULL ? -1 : rec_i64_or(v, -1);
    Py_XDECREF(v);
    if (v == NULL) {
        PyErr_Clear();
        return -1;
    }
    rec_table_put(&r->names, obj, id);
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
void rec_map_write(Ring *r, int64_t pos, long lane, int async, int64_t seq, int64_t enq, int64_t start,
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
            s[S_COUNT] = rec_i64_or(q[2], 0);
            s[S_ROOT] = rec_i64_or(q[3], RING_NONE);
            s[S_REDOP] = lane == 0 ? name_id(r, q[4]) : rec_i64_or(q[4], -1);
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

void rec_map_start(Ring *r, int64_t pos, int64_t t)
{
    int64_t *s = live_slot(r, pos);
    if (s != NULL)
        s[S_START] = t;
}

void rec_map_exit(Ring *r, int64_t pos, int64_t start, PyObject *status, int64_t end)
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

void rec_map_exit_entry(Ring *r, int64_t pos, PyObject *e)
{
    if (!PyList_Check(e) || PyList_GET_SIZE(e) != NFIELDS)
        return;
    PyObject **f = ((PyListObject *)e)->ob_item;
    rec_map_exit(r, pos, rec_i64_or(f[T_START], 0), f[STATUS], rec_i64_or(f[T_END], 0));
}

/* keep a new call's entry (in memory, and in the file's slot); its position, -1 for what is not an entry.
 * Never raises. */
int64_t rec_ring_keep(Ring *r, PyObject *e)
{
    if (r->mem == NULL || !PyList_Check(e) || PyList_GET_SIZE(e) != NFIELDS)
        return -1;
    int64_t pos = r->head++;   /* taken first: a namer call may let another thread in */
    MSlot old, old_last, *m = rec_mem_take(r, pos, &old, &old_last);
    m->entry = Py_NewRef(e);
    PyObject **f = ((PyListObject *)e)->ob_item;
    long lane = (long)rec_i64_or(f[LANE], 0);
    int at = PyObject_IsTrue(f[ASYNC]);
    if (at < 0) {
        PyErr_Clear();
        at = 0;
    }
    rec_map_write(r, pos, lane, at, rec_i64_or(f[SEQ], -1), rec_i64_or(f[T_ENQ], 0), rec_i64_or(f[T_START], 0),
              rec_i64_or(f[T_END], 0), f[META], f[DESC], f[CODE], rec_i64_or(f[LINE], 0), f[STATUS]);
    rec_mslot_release(&old);
    rec_mslot_release(&old_last);
    return pos;
}

/* the latest collective is entry e (an entry-path call) */
void rec_ring_last_entry(Ring *r, PyObject *e)
{
    MSlot old = r->last;
    memset(&r->last, 0, sizeof r->last);
    r->last.entry = Py_NewRef(e);
    r->last_pos = LAST_HELD;
    rec_mslot_release(&old);
}

/* the position of an entry kept earlier (an asynchronous call run later), -1 if overwritten */
int64_t rec_ring_find(Ring *r, PyObject *e)
{
    for (int64_t pos = r->head - 1; r->mem != NULL && pos >= 0 && pos >= r->head - r->nslots; pos--) {
        MSlot *m = &r->mem[pos % r->nslots];
        if (m->gen == pos + 1 && m->entry == e)
            return pos;
    }
    return -1;
}

/* leave the slot of the call at pos empty, in memory and in the file (a call taken back: it did not run) */
void rec_ring_hole(Ring *r, int64_t pos)
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
    rec_mslot_release(&old);
}

void rec_ring_release(Ring *r)
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
int rec_ring_attach(Ring *r, PyObject *mapping, Py_ssize_t slots_at, PyObject *namer)
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
    if (rec_table_init(&r->names) < 0) {
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
