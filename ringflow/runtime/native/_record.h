/* Internal to the call recorder in C (the _record extension, built from _record.c and the _record_*.c files):
 * an entry's fields, the caches keyed by a code object's address, the call ring's layout and structs, and what
 * one file of the recorder takes from another. */
#ifndef RINGFLOW_RECORD_H
#define RINGFLOW_RECORD_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#if PY_VERSION_HEX < 0x030B0000
#error "the C recorder needs Python 3.11 (PyFrame_GetLasti, PyErr_GetHandledException); older ones record in Python"
#endif
#if PY_VERSION_HEX < 0x030C0000
#define RAW_FRAMES 1   /* 3.11: read _PyInterpreterFrame (code, last instruction, caller) directly (_record_site.c) */
#else
#define RAW_FRAMES 0
#endif
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

enum { LANE, SEQ, META, DESC, T_ENQ, T_START, T_END, CODE, LINE, STATUS, ALGO, ASYNC, NFIELDS };

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

static inline size_t rec_hash_ptr(const void *p, long salt)
{
    uint64_t x = ((uint64_t)(uintptr_t)p >> 4) ^ ((uint64_t)salt * 0x9E3779B97F4A7C15ULL);
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ULL;
    return (size_t)(x ^ (x >> 32));
}

/* the slot of key, or the empty slot where it would go */
static inline Slot *rec_table_find(Table *t, PyObject *key)
{
    size_t i = rec_hash_ptr(key, 0) & t->mask;
    while (t->slots[i].key != NULL && t->slots[i].key != key)
        i = (i + 1) & t->mask;
    return &t->slots[i];
}

static inline int64_t rec_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
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

/* one extension module's internals: not exported from its shared object */
#pragma GCC visibility push(hidden)

/* _record.c */
extern PyObject *g_internal, *g_queued, *g_is_internal, *g_getframe;
extern long g_max_walk, g_flush_every;
extern int g_untrack;
extern PyObject *s_pending, *s_seqs, *s_size, *s_comm, *s_last_schedule, *s_flush, *s_failed, *s_site, *s_sink,
    *s_append, *s_co_filename, *s_name, *s_entry, *s_async_op, *s_empty, *s_calls;
int rec_ready(void);

/* _record_site.c */
extern Table rec_t_internal, rec_t_sites;
int rec_table_init(Table *t);
void rec_table_clear(Table *t);
void rec_table_put(Table *t, PyObject *key, long value);
#if RAW_FRAMES
void rec_path_clear(void);
#endif
int rec_user_site(PyObject **code, PyObject **line, long *lineno);
int rec_call_site(PyObject **code, PyObject **line, PyObject **queued);

/* _record_slots.c */
extern int64_t *volatile g_rings[MAX_RINGS];
void rec_mslot_release(MSlot *m);
MSlot *rec_mem_take(Ring *r, int64_t pos, MSlot *old, MSlot *old_last);
MSlot *rec_mem_live(Ring *r, int64_t pos);
PyObject *rec_mem_entry(MSlot *m);
int64_t rec_i64_or(PyObject *v, int64_t dflt);
void rec_map_write(Ring *r, int64_t pos, long lane, int async, int64_t seq, int64_t enq, int64_t start,
               int64_t end, PyObject *meta, PyObject *desc, PyObject *code, int64_t line, PyObject *status);
void rec_map_start(Ring *r, int64_t pos, int64_t t);
void rec_map_exit(Ring *r, int64_t pos, int64_t start, PyObject *status, int64_t end);
void rec_map_exit_entry(Ring *r, int64_t pos, PyObject *e);
int64_t rec_ring_keep(Ring *r, PyObject *e);
void rec_ring_last_entry(Ring *r, PyObject *e);
int64_t rec_ring_find(Ring *r, PyObject *e);
void rec_ring_hole(Ring *r, int64_t pos);
void rec_ring_release(Ring *r);
int rec_ring_attach(Ring *r, PyObject *mapping, Py_ssize_t slots_at, PyObject *namer);

/* _record_ring.c */
extern PyTypeObject rec_RingType;
PyObject *rec_install_term_handler(PyObject *mod, PyObject *unused);

/* _record_call.c */
PyObject *rec_call(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames);
PyObject *rec_run(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames);

/* _record_pack.c */
PyObject *rec_pack(PyObject *mod, PyObject *const *args, Py_ssize_t nargs);

#pragma GCC visibility pop
#endif
