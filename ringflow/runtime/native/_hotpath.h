/* Internal to the native executor (the _hotpath extension, built from _hotpath.c and the _hotpath_*.c files):
 * the shared-memory protocol's numbers under the short names the executor uses, the codes of a plan's rows, the
 * plan and Runner structs, and what one file of the executor takes from another. */
#ifndef RINGFLOW_HOTPATH_H
#define RINGFLOW_HOTPATH_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stddef.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* the shared-memory protocol's numbers: generated from transport/protocol.py by setup.py */
#include "_protocol.h"
#include "_copy.h"
#define W_TAIL RF_W_TAIL
#define W_SWAIT RF_W_SWAIT
#define W_RWAIT RF_W_RWAIT
#define W_CMA RF_W_CMA
#define W_PID RF_W_PID
#define W_SHEAD RF_W_SHEAD
#define W_SSEQ RF_W_SSEQ
#define W_RSEQ RF_W_RSEQ
#define SLOT_HDR_WORD RF_SLOT_HDR_WORD
#define HDR_WORDS RF_HDR_WORDS
#define DATA_OFF RF_DATA_OFF
#define MAX_SLOTS RF_MAX_SLOTS
#define REF_CMA RF_REF_CMA
#define KIND_DATA RF_KIND_DATA
#define KIND_CHECK RF_KIND_CHECK
#define KIND_RELAY RF_KIND_RELAY
#define ZERO_COPY_MIN_BYTES ((int64_t)RF_ZERO_COPY_MIN_BYTES)
#define PIPELINE_MIN_BYTES ((int64_t)RF_PIPELINE_MIN_BYTES)
#define MIN_SLICE_BYTES ((int64_t)RF_MIN_SLICE_BYTES)
#define SLICES_PER_SLOT_MESSAGE ((int64_t)RF_SLICES_PER_SLOT_MESSAGE)
#define DETAIL_MAX ((int64_t)RF_DETAIL_MAX)

enum { T_SEND = 0, T_RECV = 1, T_RECV_REDUCE = 2, T_COPY = 3, T_REDUCE = 4 };
enum { RC_DONE = 0, RC_STALLED = 1, RC_MISMATCH = 2, RC_PROTOCOL = 3, RC_CMA = 4, RC_REGION = 5 };
enum { CHECK_RC = 16 }; /* a Runner's check exchange returned CHECK_RC + its rc (the plan has not started) */
enum { D_BOOL, D_I8, D_U8, D_I16, D_U16, D_I32, D_U32, D_I64, D_U64, D_F16, D_BF16, D_F32, D_F64 };
enum { O_SUM, O_PROD, O_MIN, O_MAX, O_BAND, O_BOR, O_BXOR };
#define NCOLS 18   /* int64 columns of a plan's row (_hotpath_plan.c) */

/* ------------------------------------------------------------------ the plan */
typedef struct {
    int type, kind, peer, prev; /* prev: the earlier op of this step on the same connection, or -1 */
    volatile uint64_t *ctl;     /* the connection's control words */
    char *slots;
    uint64_t nslots, slot_bytes;
    char *data, *src;           /* data: what is sent / where it lands; src: the reduce's other operand */
    int dbuf, sbuf;             /* which call buffer (0 IN, 1 OUT, 2 SCRATCH, 3 the plan's own) each lies in */
    int64_t doff, soff;         /* and at which byte offset */
    int64_t nbytes, want;       /* want < 0: an argument-check message of any size, discarded */
    int64_t cma_min;            /* a send from here up goes by address when the receiver can read it */
    int pipelined, bell, snapshot;
    int early;                  /* a local op that may run once the step's receives passed their checks */
    uint64_t ref_rid, ref_off;  /* a send from a comm.alloc region: (region id + 1, offset); 0: none (per call) */
    char *snap;                 /* the snapshot of a send whose source this step overwrites */
    char *region;               /* the peer's alloc region this receive reads (set by Python) */
    uint64_t region_rid, region_size;
    /* progress */
    int done, first, drain;
    int64_t off, total, slice;
    uint64_t posted;
    uint64_t tail_seen;         /* the receiver's tail as last read (a send reads it again only when that is full) */
    uint64_t got_total, got_sig, got_rid;
    int bad;
    char *detail;
    int64_t detail_len;
} hop_t;

typedef struct {
    PyObject_HEAD
    hop_t *ops;
    int nops, nsteps, *step_start; /* ops of step s: [step_start[s], step_start[s + 1]) */
    int dtype, op, itemsize;
    struct sockaddr_un *bells;
    socklen_t *bell_len;
    int nbells;
    char *bounce;
    int64_t bounce_bytes;
    char *base[4];                 /* this call's IN, OUT and SCRATCH addresses, and the plan's own payload */
    uint64_t sig, op_seq;          /* this call's signature (32 bits, as on the wire) and sequence number */
    const uint64_t *spans;         /* this call's comm.alloc regions: (start, end, region id) triples */
    int64_t nspans;
    int step;                      /* the step to resume at */
    int step_started;
    int early_ran;                 /* the step's early local ops have run */
    int err_op;                    /* the op an error or a region request is about */
    int64_t err_code;
    PyObject *keep;                /* arrays this plan points into */
} HotPlan;

/* A Runner is a call remembered for the very arrays it was made with (fastcall.py): its native plan, the buffer
 * addresses, and what determines the plan about each array (weak reference, state words). `go` re-checks them all
 * and runs the plan, so a repeated call costs one C call beyond the communicator's own bookkeeping. */
typedef struct {
    PyObject_HEAD
    HotPlan *plan;
    HotPlan *check;              /* the argument-check exchange run before the plan, or NULL (the plan checks) */
    PyObject *xref, *xstate;     /* weakref.ref to x, and array_state(x) when remembered */
    PyObject *outref, *outstate; /* the same for out; NULL where the call had no out */
    uint64_t sig, base[3];
    int bell;
    double hot_s, spin_s;
    double deadline;             /* the deadline of the latest go(), for resuming a call go() left unfinished */
} Runner;

/* The leading fields of numpy's PyArrayObject_fields (numpy/ndarraytypes.h; the same in NumPy 1 and 2). */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    intptr_t *dimensions;
    intptr_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} ArrayFields;

#define ARRAY_C_CONTIGUOUS 0x0001   /* NPY_ARRAY_C_CONTIGUOUS */
#define ARRAY_ALIGNED 0x0100        /* NPY_ARRAY_ALIGNED */
#define ARRAY_WRITEABLE 0x0400      /* NPY_ARRAY_WRITEABLE */

/* A Door (_hotpath_door.c) is one collective's entry on one communicator: the calls it remembered for their very
 * arrays (DoorEntry: a Runner and what the call's bookkeeping names) and the call shapes it remembered for any
 * arrays of that shape (ShapeEntry, _hotpath_shape.c: the same, plus the shape its arrays must have). */
enum { DOOR_ENTRIES = 16, SHAPE_ENTRIES = 8, SHAPE_MAX_DIMS = 8 };

typedef struct {
    Runner *runner;      /* NULL: a free entry */
    PyObject *arg, *prep, *hot, *last_desc, *schedule, *regions, *resume;
    PyObject *what, *meta;   /* the recorder's description and meta of the call */
} DoorEntry;

enum { SHAPE_OUT_NONE, SHAPE_OUT_X, SHAPE_OUT_ARRAY };   /* out=None (in place), out=x, out another array */

typedef struct {
    DoorEntry c;         /* the call (its Runner's own addresses unused: each call passes its arrays') */
    PyObject *type;      /* numpy.ndarray: x (and out) are exactly of this type */
    PyObject *xdescr, *odescr;   /* x's dtype object, and out's (NULL unless SHAPE_OUT_ARRAY) */
    int xnd, ond, out;
    intptr_t xdims[SHAPE_MAX_DIMS], odims[SHAPE_MAX_DIMS];
    int64_t xbytes, obytes;
    PyObject *scratch;   /* the plan's own scratch array, or NULL: SCRATCH is then out's address */
    uint64_t scratch_addr;
} ShapeEntry;

typedef struct {
    PyObject_HEAD
    PyObject *dict;      /* the communicator's __dict__ */
    PyObject *lane;      /* its collective lane (`_outstanding` counts queued asynchronous calls) */
    PyObject *miss;      /* what call() returns where the door does not apply */
    PyObject *inner;     /* the door's own `run` (call() without the recorder), handed to the recorder */
    int next, next_shape;    /* the entry set() / set_shape() replaces when none is free */
    DoorEntry e[DOOR_ENTRIES];
    ShapeEntry s[SHAPE_ENTRIES];
} Door;

/* one extension module's internals: not exported from its shared object */
#pragma GCC visibility push(hidden)

/* _hotpath_reduce.c */
int rf_reduce(int dtype, int op, void *out, const void *a, const void *b, int64_t n);

/* _hotpath_shm.c */
extern unsigned long long rf_n_runs, rf_n_cma_reads;
extern __thread unsigned long long rf_n_waits, rf_wait_ns, rf_n_sleeps, rf_n_rings;
int64_t rf_slice_bytes(int64_t total, int64_t slot_bytes);
int rf_alloc_bounce(HotPlan *p, int64_t nbytes);
int rf_send_progress(HotPlan *p, hop_t *o);
int rf_recv_progress(HotPlan *p, hop_t *o, uint64_t sig);
int rf_ready(hop_t *o);
void rf_set_waiting(hop_t *o, uint64_t flag);

/* _hotpath_run.c */
double rf_now_s(void);
PyObject *rf_set_spin_yield(PyObject *self, PyObject *arg);
int rf_run_plan(HotPlan *p, uint64_t sig, uint64_t op_seq, double deadline, int bell, double hot_s, double spin_s,
                uint64_t in_addr, uint64_t out_addr, uint64_t scratch_addr, const uint64_t *spans, int64_t nspans);

/* _hotpath_plan.c */
extern PyTypeObject rf_HotPlanType;
PyObject *rf_make_plan(PyObject *self, PyObject *args);

/* _hotpath_runner.c */
extern PyTypeObject rf_RunnerType;
PyObject *rf_set_array_type(PyObject *self, PyObject *arg);
PyObject *rf_array_state(PyObject *self, PyObject *arg);
PyObject *rf_address(PyObject *self, PyObject *arg);
PyObject *rf_make_runner(PyObject *self, PyObject *args);
int rf_same_array(PyObject *obj, PyObject *ref, PyObject *state);
int rf_is_array_type(PyObject *t);
int rf_run_call(Runner *r, uint64_t op_seq, double timeout_s, const uint64_t *spans, int64_t nspans);
int rf_run_call_at(Runner *r, const uint64_t *base, uint64_t op_seq, double timeout_s, const uint64_t *spans,
                   int64_t nspans);

/* _hotpath_door.c */
extern PyTypeObject rf_DoorType;
PyObject *rf_make_door(PyObject *self, PyObject *args);
int rf_intern_names(void);
void rf_entry_forget(DoorEntry *e);
void rf_entry_fill(DoorEntry *e, PyObject *const *args);
int rf_entry_traverse(DoorEntry *e, visitproc visit, void *arg);

/* _hotpath_shape.c */
void rf_shape_forget(ShapeEntry *s);
ShapeEntry *rf_shape_find(Door *d, PyObject *x, PyObject *out, PyObject *arg, int *err, uint64_t *base);
PyObject *rf_door_set_shape(Door *d, PyObject *const *args, Py_ssize_t nargs);
int rf_shape_traverse(ShapeEntry *s, visitproc visit, void *arg);

#pragma GCC visibility pop
#endif
