/* The hot path in C: path-node statistics, host-clock region enter/exit, and the
 * decorator's call wrapper. Optional: instrument/registry.py and instrument/regions/
 * hold the pure-Python equivalents, used when this module is missing or when
 * INSTRUMENT_NO_EXTENSIONS=1. Both give the same numbers (same histogram buckets).
 *
 * Thread safety comes from the GIL: each function below runs from start to end without
 * releasing it (except where it calls back into Python, on slow paths only), so a
 * record is one indivisible update of its node and flush's take() sees whole records.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define NBUCKETS 384
#define MANTISSA_SHIFT 49             /* keep the exponent and top 3 mantissa bits */
#define ONE_KEY ((int64_t)1023 << 3)  /* (bits of 1.0) >> MANTISSA_SHIFT */

/* Bound once by bind_stack() and bind(): the frame context variable, the host clock that may be read
 * directly, the region classes, and the node base type for children created in Python. */
static PyObject *frame_var = NULL;
static PyObject *root_frame = NULL;
static PyObject *perf_counter_ns = NULL;
static PyTypeObject *cpu_region_type = NULL;
static PyTypeObject *skipped_region_type = NULL;

static PyObject *str_child, *str_cpu, *str_exit_top, *str_call;

/* -- path nodes ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *name;
    PyObject *path;
    PyObject *parent;
    PyObject *children;
    PyObject *mode;
    Py_ssize_t level;
    int64_t count;
    unsigned __int128 total;
    int64_t min;
    int64_t max;
    unsigned __int128 sumsq;
    uint64_t hist[NBUCKETS];
} NodeObject;

static PyTypeObject NodeType;

static inline int
bucket_of(int64_t v)
{
    if (v <= 0) {
        return 0;
    }
    double d = (double)v;
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    int64_t b = (int64_t)(bits >> MANTISSA_SHIFT) - ONE_KEY + 1;
    return b >= NBUCKETS ? NBUCKETS - 1 : (int)b;
}

static inline void
node_add(NodeObject *n, int64_t v)
{
    if (v < 0) { /* a clock swapped mid-region; durations are never negative */
        v = 0;
    }
    if (n->count == 0) {
        n->min = n->max = v;
    }
    else {
        if (v < n->min) n->min = v;
        if (v > n->max) n->max = v;
    }
    n->count++;
    n->total += (unsigned __int128)v;
    n->sumsq += (unsigned __int128)v * (unsigned __int128)v;
    n->hist[bucket_of(v)]++;
}

static void
node_reset(NodeObject *n)
{
    n->count = n->min = n->max = 0;
    n->total = n->sumsq = 0;
    memset(n->hist, 0, sizeof n->hist);
}

static PyObject *
u128_to_long(unsigned __int128 x)
{
    PyObject *hi = PyLong_FromUnsignedLongLong((unsigned long long)(x >> 64));
    PyObject *lo = PyLong_FromUnsignedLongLong((unsigned long long)x);
    PyObject *shift = PyLong_FromLong(64);
    PyObject *shifted = NULL, *out = NULL;
    if (hi && lo && shift && (shifted = PyNumber_Lshift(hi, shift))) {
        out = PyNumber_Or(shifted, lo);
    }
    Py_XDECREF(hi);
    Py_XDECREF(lo);
    Py_XDECREF(shift);
    Py_XDECREF(shifted);
    return out;
}

static PyObject *
Node_add(NodeObject *self, PyObject *arg)
{
    long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred()) {
        return NULL;
    }
    node_add(self, (int64_t)v);
    Py_RETURN_NONE;
}

static PyObject *
Node_take(NodeObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->count == 0) {
        Py_RETURN_NONE;
    }
    /* Copy first: building Python objects may run other threads (GIL switches). */
    NodeObject snap;
    snap.count = self->count;
    snap.total = self->total;
    snap.min = self->min;
    snap.max = self->max;
    snap.sumsq = self->sumsq;
    memcpy(snap.hist, self->hist, sizeof snap.hist);
    node_reset(self);

    PyObject *hist = PyDict_New();
    if (hist == NULL) {
        return NULL;
    }
    for (int b = 0; b < NBUCKETS; b++) {
        if (snap.hist[b] == 0) {
            continue;
        }
        PyObject *k = PyLong_FromLong(b);
        PyObject *v = PyLong_FromUnsignedLongLong(snap.hist[b]);
        int rc = (k && v) ? PyDict_SetItem(hist, k, v) : -1;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (rc < 0) {
            Py_DECREF(hist);
            return NULL;
        }
    }
    PyObject *total = u128_to_long(snap.total);
    PyObject *sumsq = u128_to_long(snap.sumsq);
    if (total == NULL || sumsq == NULL) {
        Py_XDECREF(total);
        Py_XDECREF(sumsq);
        Py_DECREF(hist);
        return NULL;
    }
    return Py_BuildValue("(LNNLLN)", (long long)snap.count, total, sumsq, (long long)snap.min,
                         (long long)snap.max, hist);
}

static PyObject *
Node_clear_stats(NodeObject *self, PyObject *Py_UNUSED(ignored))
{
    node_reset(self);
    Py_RETURN_NONE;
}

static PyObject *
Node_has_records(NodeObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(self->count > 0);
}

static int
Node_traverse(NodeObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->name);
    Py_VISIT(self->path);
    Py_VISIT(self->parent);
    Py_VISIT(self->children);
    Py_VISIT(self->mode);
    return 0;
}

static int
Node_clear(NodeObject *self)
{
    Py_CLEAR(self->name);
    Py_CLEAR(self->path);
    Py_CLEAR(self->parent);
    Py_CLEAR(self->children);
    Py_CLEAR(self->mode);
    return 0;
}

static void
Node_dealloc(NodeObject *self)
{
    /* Python subclasses' own dealloc releases their (heap) type, not this one. */
    PyObject_GC_UnTrack(self);
    Node_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Node_methods[] = {
    {"add", (PyCFunction)Node_add, METH_O, "Record one duration in ns."},
    {"take", (PyCFunction)Node_take, METH_NOARGS,
     "Return (count, total, sumsq, min, max, hist) and reset; None if nothing recorded."},
    {"clear_stats", (PyCFunction)Node_clear_stats, METH_NOARGS, "Forget what was recorded."},
    {"has_records", (PyCFunction)Node_has_records, METH_NOARGS,
     "True if anything was recorded since the last take."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Node_members[] = {
    {"name", T_OBJECT, offsetof(NodeObject, name), 0, NULL},
    {"path", T_OBJECT, offsetof(NodeObject, path), 0, NULL},
    {"parent", T_OBJECT, offsetof(NodeObject, parent), 0, NULL},
    {"children", T_OBJECT, offsetof(NodeObject, children), 0, NULL},
    {"mode", T_OBJECT, offsetof(NodeObject, mode), 0, NULL},
    {"level", T_PYSSIZET, offsetof(NodeObject, level), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject NodeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._speedups.NodeBase",
    .tp_doc = "Statistics of one path, updated in C (see instrument.registry.PathNode).",
    .tp_basicsize = sizeof(NodeObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)Node_dealloc,
    .tp_traverse = (traverseproc)Node_traverse,
    .tp_clear = (inquiry)Node_clear,
    .tp_methods = Node_methods,
    .tp_members = Node_members,
};

/* -- where the innermost frame lives ----------------------------------------------------
 * In plain code (no Context.run() active on this thread) the innermost frame is kept in a
 * thread-local pointer, so entering and exiting a region updates no context variable.
 * Inside Context.run() -- asyncio and trio tasks, to_thread, copy_context().run() -- it is
 * kept in the context variable, so every task has its own stack; a task that has not
 * opened a region yet nests under the regions open in the plain code around it
 * (asyncio.run() inside a region). bind_thread_stack() turns the thread-local part on
 * once the layout check in regions/native.py has passed; until then only the variable is used. */

#ifdef Py_GIL_DISABLED
#error "the C hot path relies on the GIL; free-threaded builds use the pure-Python path"
#endif

/* The layout below is read only on the CPython versions it was checked against (the
 * leading fields of PyContext in Include/internal/pycore_context.h, 3.10 to 3.13, with the
 * test suite run on each: docs/compatibility.md). On any other version the thread-local
 * stack is refused, not guessed: every frame stays in the context variable. */
#if PY_VERSION_HEX >= 0x030A0000 && PY_VERSION_HEX < 0x030E0000
#define CONTEXT_LAYOUT_KNOWN 1
#else
#define CONTEXT_LAYOUT_KNOWN 0
#endif

typedef struct { /* the leading fields of CPython's PyContext (3.10 to 3.13) */
    PyObject_HEAD
    PyObject *ctx_prev;
    PyObject *ctx_vars;
    PyObject *ctx_weakreflist;
    int ctx_entered;
} ContextHead;

static int
check_bound(void)
{
    if (frame_var == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "instrument._speedups used before bind()");
        return -1;
    }
    return 0;
}

static int thread_stack_on = 0;
static _Thread_local PyObject *thread_top = NULL; /* strong reference, or NULL */

static inline int
in_context_run(void)
{
    if (!CONTEXT_LAYOUT_KNOWN) {
        return 1; /* unknown layout: behave as inside a task, i.e. use the variable */
    }
    PyObject *ctx = PyThreadState_Get()->context;
    return ctx != NULL && ((ContextHead *)ctx)->ctx_entered;
}

/* A new reference to the innermost frame of this thread or task. */
static PyObject *
top_get(void)
{
    if (thread_top != NULL && thread_stack_on && !in_context_run()) {
        Py_INCREF(thread_top);
        return thread_top;
    }
    PyObject *value;
    if (PyContextVar_Get(frame_var, NULL, &value) < 0) {
        return NULL;
    }
    /* in a task that has opened no region yet: under the plain code's open regions */
    if (value == root_frame && thread_top != NULL) {
        Py_DECREF(value);
        Py_INCREF(thread_top);
        return thread_top;
    }
    return value;
}

static int
top_set(PyObject *frame)
{
    if (thread_stack_on && !in_context_run()) {
        Py_INCREF(frame);
        Py_XSETREF(thread_top, frame);
        return 0;
    }
    PyObject *token = PyContextVar_Set(frame_var, frame);
    if (token == NULL) {
        return -1;
    }
    Py_DECREF(token);
    return 0;
}

static PyObject *
get_top(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return check_bound() < 0 ? NULL : top_get();
}

static PyObject *
set_top(PyObject *module, PyObject *frame)
{
    if (check_bound() < 0 || top_set(frame) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
context_run_active(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(in_context_run());
}

static PyObject *
bind_thread_stack(PyObject *module, PyObject *on)
{
    int truth = PyObject_IsTrue(on);
    if (truth < 0) {
        return NULL;
    }
    if (truth && !CONTEXT_LAYOUT_KNOWN) {
        PyErr_SetString(PyExc_RuntimeError,
                        "instrument: the thread-local region stack is not supported on this "
                        "Python version (unchecked context layout)");
        return NULL;
    }
    thread_stack_on = truth;
    Py_RETURN_NONE;
}

/* -- regions --------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *name;
    PyObject *clock;
    PyObject *now;
    Py_ssize_t level;
} RegionObject;

static PyTypeObject RegionType;

static inline int
read_now(PyObject *now, int64_t *out)
{
    if (now == perf_counter_ns) { /* CPython's perf_counter_ns is CLOCK_MONOTONIC on Linux */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        *out = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
        return 0;
    }
    PyObject *r = PyObject_CallNoArgs(now);
    if (r == NULL) {
        return -1;
    }
    long long v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

/* Open a host-clock frame for `self` in this context. On success returns 0 and new
 * references to the parent frame and the node, and the start time. */
static int
open_cpu(RegionObject *self, PyObject **parent_out, NodeObject **node_out, int64_t *t0)
{
    PyObject *parent = top_get();
    if (parent == NULL || !PyTuple_CheckExact(parent) || PyTuple_GET_SIZE(parent) != 5 ||
        !PyObject_TypeCheck(PyTuple_GET_ITEM(parent, 0), &NodeType) ||
        ((NodeObject *)PyTuple_GET_ITEM(parent, 0))->children == NULL) {
        Py_XDECREF(parent);
        PyErr_SetString(PyExc_RuntimeError, "instrument: malformed region frame");
        return -1;
    }
    PyObject *pnode = PyTuple_GET_ITEM(parent, 0);
    PyObject *node = PyDict_GetItemWithError(((NodeObject *)pnode)->children, self->name);
    if (node != NULL) {
        Py_INCREF(node);
    }
    else {
        if (PyErr_Occurred()) {
            Py_DECREF(parent);
            return -1;
        }
        PyObject *level = PyLong_FromSsize_t(self->level);
        node = level ? PyObject_CallMethodObjArgs(pnode, str_child, self->name, level,
                                                  str_cpu, NULL)
                     : NULL;
        Py_XDECREF(level);
        if (node == NULL) {
            Py_DECREF(parent);
            return -1;
        }
        if (!PyObject_TypeCheck(node, &NodeType)) {
            PyErr_SetString(PyExc_TypeError, "path node is not a NodeBase");
            Py_DECREF(node);
            Py_DECREF(parent);
            return -1;
        }
    }
    PyObject *t0obj = NULL, *frame = NULL;
    int rc = -1;
    if (read_now(self->now, t0) == 0 && (t0obj = PyLong_FromLongLong(*t0)) != NULL &&
        (frame = PyTuple_Pack(5, node, t0obj, parent, (PyObject *)self, Py_None)) != NULL) {
        rc = top_set(frame);
    }
    Py_XDECREF(t0obj);
    Py_XDECREF(frame);
    if (rc < 0) {
        Py_DECREF(node);
        Py_DECREF(parent);
        return -1;
    }
    *parent_out = parent;
    *node_out = (NodeObject *)node;
    return 0;
}

static PyObject *
Region_cpu_enter(RegionObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *parent;
    NodeObject *node;
    int64_t t0;
    if (check_bound() < 0 || open_cpu(self, &parent, &node, &t0) < 0) {
        return NULL;
    }
    Py_DECREF(parent);
    Py_DECREF(node);
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *
Region_cpu_exit(RegionObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t t1;
    if (check_bound() < 0 || read_now(self->now, &t1) < 0) {
        return NULL;
    }
    PyObject *frame = top_get();
    if (frame == NULL) {
        return NULL;
    }
    if (PyTuple_GET_ITEM(frame, 3) != (PyObject *)self || PyTuple_GET_ITEM(frame, 4) != Py_None) {
        Py_DECREF(frame);  /* not our frame on top: the general (Python) exit */
        PyObject *r = PyObject_CallMethodNoArgs((PyObject *)self, str_exit_top);
        if (r == NULL) {
            return NULL;
        }
        Py_DECREF(r);
        Py_RETURN_NONE;
    }
    if (top_set(PyTuple_GET_ITEM(frame, 2)) < 0) {
        Py_DECREF(frame);
        return NULL;
    }
    long long t0 = PyLong_AsLongLong(PyTuple_GET_ITEM(frame, 1));
    node_add((NodeObject *)PyTuple_GET_ITEM(frame, 0), t1 - (int64_t)t0);
    Py_DECREF(frame);
    Py_RETURN_NONE;
}

static PyObject *
Region_skip_enter(RegionObject *self, PyObject *Py_UNUSED(ignored))
{
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *
Region_skip_exit(RegionObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *frame;
    if (check_bound() < 0 || (frame = top_get()) == NULL) {
        return NULL;
    }
    int owned = PyTuple_GET_ITEM(frame, 3) == (PyObject *)self;
    Py_DECREF(frame);
    if (owned) { /* entered while enabled, exited after disable(): close it */
        PyObject *r = PyObject_CallMethodNoArgs((PyObject *)self, str_exit_top);
        if (r == NULL) {
            return NULL;
        }
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
}

static PyMethodDef Region_methods[] = {
    {"_cpu_enter", (PyCFunction)Region_cpu_enter, METH_NOARGS, "Host-clock __enter__."},
    {"_cpu_exit", (PyCFunction)(void (*)(void))Region_cpu_exit, METH_FASTCALL,
     "Host-clock __exit__."},
    {"_skip_enter", (PyCFunction)Region_skip_enter, METH_NOARGS, "Disabled __enter__."},
    {"_skip_exit", (PyCFunction)(void (*)(void))Region_skip_exit, METH_FASTCALL,
     "Disabled __exit__ (closes a frame opened before disable())."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Region_members[] = {
    {"name", T_OBJECT, offsetof(RegionObject, name), 0, NULL},
    {"clock", T_OBJECT, offsetof(RegionObject, clock), 0, NULL},
    {"_now", T_OBJECT, offsetof(RegionObject, now), 0, NULL},
    {"level", T_PYSSIZET, offsetof(RegionObject, level), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static int
Region_traverse(RegionObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->name);
    Py_VISIT(self->clock);
    Py_VISIT(self->now);
    return 0;
}

static int
Region_clear(RegionObject *self)
{
    Py_CLEAR(self->name);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->now);
    return 0;
}

static void
Region_dealloc(RegionObject *self)
{
    PyObject_GC_UnTrack(self);
    Region_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject RegionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._speedups.RegionBase",
    .tp_doc = "Fields and host-clock enter/exit of a region (see instrument.regions.region.Region).",
    .tp_basicsize = sizeof(RegionObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)Region_dealloc,
    .tp_traverse = (traverseproc)Region_traverse,
    .tp_clear = (inquiry)Region_clear,
    .tp_methods = Region_methods,
    .tp_members = Region_members,
};

/* -- objects holding one region (CallTimer, Active) ------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *region;
} HolderObject;

/* A new `type` object holding the one RegionBase in `args`. */
static HolderObject *
Holder_new(PyTypeObject *type, PyObject *args)
{
    PyObject *region;
    if (!PyArg_ParseTuple(args, "O!", &RegionType, &region)) {
        return NULL;
    }
    HolderObject *self = (HolderObject *)type->tp_alloc(type, 0);
    if (self != NULL) {
        Py_INCREF(region);
        self->region = region;
    }
    return self;
}

static int
Holder_traverse(HolderObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->region);
    return 0;
}

static int
Holder_clear(HolderObject *self)
{
    Py_CLEAR(self->region);
    return 0;
}

static void
Holder_dealloc(HolderObject *self)
{
    PyObject_GC_UnTrack(self);
    Holder_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* -- the decorator's wrapper: wrapper(wrapped, instance, args, kwargs) for wrapt --------- */

typedef struct {
    PyObject_HEAD
    PyObject *region;
    vectorcallfunc vectorcall;
} CallTimerObject;

static PyObject *
CallTimer_vectorcall(CallTimerObject *self, PyObject *const *args, size_t nargsf,
                     PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 4 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError,
                        "CallTimer expects (wrapped, instance, args, kwargs)");
        return NULL;
    }
    PyObject *wrapped = args[0], *cargs = args[2], *ckw = args[3];
    if (ckw == Py_None) {
        ckw = NULL;
    }
    PyObject *region = self->region;
    PyTypeObject *type = Py_TYPE(region);
    if (type != cpu_region_type) {
        if (type == skipped_region_type) {
            return PyObject_Call(wrapped, cargs, ckw);
        }
        return PyObject_CallMethodObjArgs(region, str_call, wrapped, cargs,
                                          ckw ? ckw : Py_None, NULL);
    }
    PyObject *parent;
    NodeObject *node;
    int64_t t0, t1;
    if (check_bound() < 0 || open_cpu((RegionObject *)region, &parent, &node, &t0) < 0) {
        return NULL;
    }
    PyObject *result = PyObject_Call(wrapped, cargs, ckw);
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);  /* keep the call's exception untouched */
    int clock_ok = read_now(((RegionObject *)region)->now, &t1) == 0;
    int restored = top_set(parent) == 0;
    if (clock_ok) {
        node_add(node, t1 - t0);
    }
    if (!clock_ok || !restored) {
        PyErr_Clear();  /* instrumentation must not replace the call's outcome */
    }
    PyErr_Restore(et, ev, tb);
    Py_DECREF(parent);
    Py_DECREF(node);
    return result;
}

static PyObject *
CallTimer_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    CallTimerObject *self = (CallTimerObject *)Holder_new(type, args);
    if (self != NULL) {
        self->vectorcall = (vectorcallfunc)CallTimer_vectorcall;
    }
    return (PyObject *)self;
}

static PyMemberDef CallTimer_members[] = {
    {"region", T_OBJECT, offsetof(CallTimerObject, region), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject CallTimerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._speedups.CallTimer",
    .tp_doc = "wrapt wrapper timing each call of a function as one region.",
    .tp_basicsize = sizeof(CallTimerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = CallTimer_new,
    .tp_dealloc = (destructor)Holder_dealloc,
    .tp_traverse = (traverseproc)Holder_traverse,
    .tp_clear = (inquiry)Holder_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(CallTimerObject, vectorcall),
    .tp_members = CallTimer_members,
};

/* -- Active(region): true unless the region is skipped (wrapt's `enabled=`) ---------- */

typedef struct {
    PyObject_HEAD
    PyObject *region;
} ActiveObject;

static PyObject *
Active_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    return (PyObject *)Holder_new(type, args);
}

static int
Active_bool(ActiveObject *self)
{
    return Py_TYPE(self->region) != skipped_region_type;
}

static PyNumberMethods Active_as_number = {
    .nb_bool = (inquiry)Active_bool,
};

static PyTypeObject ActiveType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._speedups.Active",
    .tp_doc = "Active(region): truthy unless the region is skipped; wrapt's enabled= flag, "
              "so a disabled decorated function is called directly.",
    .tp_basicsize = sizeof(ActiveObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Active_new,
    .tp_dealloc = (destructor)Holder_dealloc,
    .tp_traverse = (traverseproc)Holder_traverse,
    .tp_clear = (inquiry)Holder_clear,
    .tp_as_number = &Active_as_number,
};

/* -- timed(name): the cached region by name, without a Python-level call ------------- */

typedef struct {
    PyObject_HEAD
    PyObject *by_name;
    PyObject *slow;
    PyObject *dict;
    vectorcallfunc vectorcall;
} DispatchObject;

static PyObject *
Dispatch_vectorcall(DispatchObject *self, PyObject *const *args, size_t nargsf,
                    PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs == 1 && (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0) &&
        PyUnicode_CheckExact(args[0])) {
        PyObject *found = PyDict_GetItemWithError(self->by_name, args[0]);
        if (found != NULL) {
            Py_INCREF(found);
            return found;
        }
        if (PyErr_Occurred()) {
            return NULL;
        }
    }
    return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
}

static PyObject *
Dispatch_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *by_name, *slow;
    if (!PyArg_ParseTuple(args, "O!O:Dispatch", &PyDict_Type, &by_name, &slow)) {
        return NULL;
    }
    DispatchObject *self = (DispatchObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    Py_INCREF(by_name);
    self->by_name = by_name;
    Py_INCREF(slow);
    self->slow = slow;
    self->vectorcall = (vectorcallfunc)Dispatch_vectorcall;
    return (PyObject *)self;
}

static int
Dispatch_traverse(DispatchObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->by_name);
    Py_VISIT(self->slow);
    Py_VISIT(self->dict);
    return 0;
}

static int
Dispatch_clear(DispatchObject *self)
{
    Py_CLEAR(self->by_name);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->dict);
    return 0;
}

static void
Dispatch_dealloc(DispatchObject *self)
{
    PyObject_GC_UnTrack(self);
    Dispatch_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyGetSetDef Dispatch_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DispatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._speedups.Dispatch",
    .tp_doc = "Dispatch(by_name, slow): call -> by_name[name] for one str argument, "
              "else slow(*args, **kwargs).",
    .tp_basicsize = sizeof(DispatchObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = Dispatch_new,
    .tp_dealloc = (destructor)Dispatch_dealloc,
    .tp_traverse = (traverseproc)Dispatch_traverse,
    .tp_clear = (inquiry)Dispatch_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(DispatchObject, vectorcall),
    .tp_dictoffset = offsetof(DispatchObject, dict),
    .tp_getset = Dispatch_getset,
};

/* -- module ---------------------------------------------------------------------------- */

static PyObject *
bind_stack(PyObject *module, PyObject *args)
{
    PyObject *var, *root;
    if (!PyArg_ParseTuple(args, "OO!:bind_stack", &var, &PyTuple_Type, &root)) {
        return NULL;
    }
    if (!PyContextVar_CheckExact(var)) {
        PyErr_SetString(PyExc_TypeError, "bind_stack() needs the frame ContextVar");
        return NULL;
    }
    Py_INCREF(var);
    Py_XSETREF(frame_var, var);
    Py_INCREF(root);
    Py_XSETREF(root_frame, root);
    Py_RETURN_NONE;
}

static PyObject *
bind(PyObject *module, PyObject *args)
{
    PyObject *clock, *cpu, *skipped;
    if (!PyArg_ParseTuple(args, "OO!O!:bind", &clock, &PyType_Type, &cpu, &PyType_Type,
                          &skipped)) {
        return NULL;
    }
    Py_INCREF(clock);
    Py_XSETREF(perf_counter_ns, clock);
    Py_INCREF(cpu);
    Py_XSETREF(cpu_region_type, (PyTypeObject *)cpu);
    Py_INCREF(skipped);
    Py_XSETREF(skipped_region_type, (PyTypeObject *)skipped);
    Py_RETURN_NONE;
}

static PyObject *
bucket(PyObject *module, PyObject *arg)
{
    long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred()) {
        return NULL;
    }
    return PyLong_FromLong(bucket_of((int64_t)v));
}

static PyMethodDef module_methods[] = {
    {"bind_stack", bind_stack, METH_VARARGS,
     "bind_stack(frame_var, root_frame): the context variable holding the innermost frame."},
    {"bind", bind, METH_VARARGS,
     "bind(perf_counter_ns, CpuRegion, SkippedRegion): the clock read directly and the "
     "region classes of the call wrapper."},
    {"get_top", get_top, METH_NOARGS, "The innermost frame of this thread or task."},
    {"set_top", set_top, METH_O, "Make a frame the innermost of this thread or task."},
    {"context_run_active", context_run_active, METH_NOARGS,
     "True inside Context.run() (a task); used by the layout check."},
    {"bind_thread_stack", bind_thread_stack, METH_O,
     "Keep plain code's frames thread-locally (after the layout check passed)."},
    {"bucket", bucket, METH_O, "The histogram bucket of a duration in ns (for tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "instrument._speedups",
    .m_doc = "Optional C hot path of instrument (pure-Python fallback in regions/registry).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&NodeType) < 0 || PyType_Ready(&RegionType) < 0 ||
        PyType_Ready(&CallTimerType) < 0 || PyType_Ready(&DispatchType) < 0 ||
        PyType_Ready(&ActiveType) < 0) {
        return NULL;
    }
    str_child = PyUnicode_InternFromString("child");
    str_cpu = PyUnicode_InternFromString("cpu");
    str_exit_top = PyUnicode_InternFromString("_exit_top");
    str_call = PyUnicode_InternFromString("_call");
    if (!str_child || !str_cpu || !str_exit_top || !str_call) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(m, "NBUCKETS", NBUCKETS) < 0 ||
        PyModule_AddIntConstant(m, "CONTEXT_LAYOUT_KNOWN", CONTEXT_LAYOUT_KNOWN) < 0 ||
        PyModule_AddObjectRef(m, "NodeBase", (PyObject *)&NodeType) < 0 ||
        PyModule_AddObjectRef(m, "RegionBase", (PyObject *)&RegionType) < 0 ||
        PyModule_AddObjectRef(m, "CallTimer", (PyObject *)&CallTimerType) < 0 ||
        PyModule_AddObjectRef(m, "Dispatch", (PyObject *)&DispatchType) < 0 ||
        PyModule_AddObjectRef(m, "Active", (PyObject *)&ActiveType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
