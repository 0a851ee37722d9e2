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
#include <math.h>

/* Code layout: HOT functions (what a region, a timed call and auto's per-step calls run)
 * go together into .text.hot, so that a step's visits touch few code pages and lines;
 * COLD ones (errors, fallbacks) go out of the way, with the branches that lead to them. */
#if defined(__GNUC__)
#define HOT __attribute__((hot))
#define COLD __attribute__((cold, noinline))
#define NOINLINE __attribute__((noinline))
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define HOT
#define COLD
#define NOINLINE
#define UNLIKELY(x) (x)
#endif

#define NBUCKETS 384
#define MANTISSA_SHIFT 49             /* keep the exponent and top 3 mantissa bits */
#define ONE_KEY ((int64_t)1023 << 3)  /* (bits of 1.0) >> MANTISSA_SHIFT */

/* Bound once by bind_stack() and bind(): the frame context variable, the host clock that may be read
 * directly, the region classes, and the node base type for children created in Python. */
static PyObject *frame_var = NULL;
static PyObject *root_frame = NULL;
/* The frame type (regions/frames.py's Frame: a NamedTuple, so a tuple subclass with the
 * tuple's layout), taken from the root frame by bind_stack(). C builds frames of this type
 * and reads their fields by position. */
static PyTypeObject *frame_type = NULL;
static PyObject *perf_counter_ns = NULL;
static PyTypeObject *cpu_region_type = NULL;
static PyTypeObject *skipped_region_type = NULL;
/* region.timed_coroutine: what a timed call that returned a coroutine returns instead */
static PyObject *timed_coroutine = NULL;

static PyObject *str_child, *str_cpu, *str_exit_top, *str_call, *str_drop_innermost;

/* -- fields: typed, never deleted ------------------------------------------------------
 * Every object field the C code reads is a descriptor that checks the type of what is
 * assigned and refuses deletion, so no Python caller can leave a NULL or a wrong type
 * where the hot path reads it. instrument/_fields.py applies the same rules, with the same
 * messages, to the pure-Python classes. */

enum { F_ANY, F_STR, F_CALLABLE, F_DICT, F_NODE_OR_NONE, F_LEVEL };

static const char *const field_accepts[] = {
    "any object", "a str", "a callable", "a dict", "a path node or None", "an int >= 0",
};

typedef struct {
    const char *owner; /* "region" or "path node" */
    const char *name;
    Py_ssize_t offset;
    int kind;
} FieldSpec;

#define FIELD_SLOT(self, f) ((PyObject **)((char *)(self) + (f)->offset))

static PyTypeObject NodeType;

static int
field_refuse_delete(const FieldSpec *f)
{
    PyErr_Format(PyExc_AttributeError,
                 "instrument: the %s field '%s' cannot be deleted (it is set once, at "
                 "construction)",
                 f->owner, f->name);
    return -1;
}

static int
field_wrong_type(const FieldSpec *f, PyObject *value)
{
    PyErr_Format(PyExc_TypeError, "instrument: the %s field '%s' must be %s, got %R", f->owner,
                 f->name, field_accepts[f->kind], value);
    return -1;
}

static PyObject *
field_get(PyObject *self, void *closure)
{
    const FieldSpec *f = closure;
    PyObject *v = *FIELD_SLOT(self, f);
    if (v == NULL) { /* never set (__init__ not run): as for an unset __slots__ field */
        PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute '%s'",
                     Py_TYPE(self)->tp_name, f->name);
        return NULL;
    }
    Py_INCREF(v);
    return v;
}

static int
field_set(PyObject *self, PyObject *value, void *closure)
{
    const FieldSpec *f = closure;
    if (value == NULL) {
        return field_refuse_delete(f);
    }
    int ok;
    switch (f->kind) {
    case F_STR: ok = PyUnicode_Check(value); break;
    case F_CALLABLE: ok = PyCallable_Check(value); break;
    case F_DICT: ok = PyDict_Check(value); break;
    case F_NODE_OR_NONE: ok = value == Py_None || PyObject_TypeCheck(value, &NodeType); break;
    default: ok = 1;
    }
    if (!ok) {
        return field_wrong_type(f, value);
    }
    Py_INCREF(value);
    Py_XSETREF(*FIELD_SLOT(self, f), value);
    return 0;
}

static PyObject *
level_get(PyObject *self, void *closure)
{
    const FieldSpec *f = closure;
    return PyLong_FromSsize_t(*(Py_ssize_t *)((char *)self + f->offset));
}

static int
level_set(PyObject *self, PyObject *value, void *closure)
{
    const FieldSpec *f = closure;
    if (value == NULL) {
        return field_refuse_delete(f);
    }
    if (!PyLong_Check(value) || PyBool_Check(value)) {
        return field_wrong_type(f, value);
    }
    Py_ssize_t v = PyLong_AsSsize_t(value);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (v < 0) {
        PyErr_Format(PyExc_ValueError, "instrument: the %s field '%s' must be %s, got %R",
                     f->owner, f->name, field_accepts[F_LEVEL], value);
        return -1;
    }
    *(Py_ssize_t *)((char *)self + f->offset) = v;
    return 0;
}

#define FIELD_GETSET(spec) {(spec).name, field_get, field_set, NULL, (void *)&(spec)}
#define LEVEL_GETSET(spec) {(spec).name, level_get, level_set, NULL, (void *)&(spec)}

/* -- path nodes ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *name;
    PyObject *path;
    PyObject *parent;
    PyObject *children;
    PyObject *mode;
    Py_ssize_t level;
    Py_ssize_t idle; /* flushes in a row without a record (take_tree counts them) */
    int64_t count;
    unsigned __int128 total;
    int64_t min;
    int64_t max;
    unsigned __int128 sumsq;
    uint64_t hist[NBUCKETS];
} NodeObject;

HOT static inline int
bucket_of(int64_t v)
{
    if (v <= 0) {
        return 0;
    }
    if (v < ((int64_t)1 << 53)) { /* exact as a double: its exponent and top 3 mantissa bits */
        int e = 63 - __builtin_clzll((unsigned long long)v);
        int m = (int)((e >= 3 ? v >> (e - 3) : v << (3 - e)) & 7);
        int b = (e << 3) + m + 1;
        return b >= NBUCKETS ? NBUCKETS - 1 : b;
    }
    double d = (double)v;
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    int64_t b = (int64_t)(bits >> MANTISSA_SHIFT) - ONE_KEY + 1;
    return b >= NBUCKETS ? NBUCKETS - 1 : (int)b;
}

HOT static inline void
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

/* Empty the node's figures; its records lie in the buckets `first` to `last` (those of
 * its min and max), the only ones cleared. */
static void
node_reset(NodeObject *n, int first, int last)
{
    n->count = n->min = n->max = 0;
    n->total = n->sumsq = 0;
    memset(&n->hist[first], 0, (size_t)(last - first + 1) * sizeof n->hist[0]);
}

/* A Python int of a 128-bit value (without the shifts when it fits 64 bits). */
static PyObject *
u128_to_long(unsigned __int128 x)
{
    if (x >> 64 == 0) {
        return PyLong_FromUnsignedLongLong((unsigned long long)x);
    }
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

/* num / den as Python's int true division gives it (correctly rounded): plain doubles
 * while both are exact as doubles, Python ints beyond. */
static int
exact_ratio(unsigned __int128 num, unsigned __int128 den, double *out)
{
    const unsigned __int128 exact = (unsigned __int128)1 << 53;
    if (num <= exact && den <= exact) {
        *out = (double)num / (double)den;
        return 0;
    }
    PyObject *n = u128_to_long(num), *d = n ? u128_to_long(den) : NULL;
    PyObject *q = d ? PyNumber_TrueDivide(n, d) : NULL;
    Py_XDECREF(n);
    Py_XDECREF(d);
    if (q == NULL) {
        return -1;
    }
    *out = PyFloat_AsDouble(q);
    Py_DECREF(q);
    return 0;
}

/* The value a histogram bucket stands for: its midpoint (see stats.bucket_bounds). */
static double
bucket_mid(int b)
{
    if (b == 0) {
        return 0.5;
    }
    uint64_t lo_bits = (uint64_t)(b + ONE_KEY - 1) << MANTISSA_SHIFT;
    uint64_t hi_bits = (uint64_t)(b + ONE_KEY) << MANTISSA_SHIFT;
    double lo, hi;
    memcpy(&lo, &lo_bits, sizeof lo);
    memcpy(&hi, &hi_bits, sizeof hi);
    return (lo + hi) / 2;
}

static const double QUANTILES[3] = {0.5, 0.9, 0.99};

/* One node's figures for one interval, taken out of it. */
typedef struct {
    int64_t count;
    unsigned __int128 total;
    unsigned __int128 sumsq;
    int64_t min;
    int64_t max;
    double q[3]; /* QUANTILES, ns */
} Taken;

/* Take what `n` recorded (count > 0) into `t` and reset it: the quantiles come from the
 * histogram, whose records all lie between the buckets of min and max, so only those
 * buckets are read and cleared. No Python call: one indivisible step under the GIL. */
static void
node_take_into(NodeObject *n, Taken *t)
{
    int64_t count = n->count;
    double lo = (double)n->min, hi = (double)n->max;
    int first = bucket_of(n->min), last = bucket_of(n->max), b = first;
    uint64_t seen = 0;
    for (int i = 0; i < 3; i++) {
        double rank = QUANTILES[i] * (double)count;
        while ((double)seen < rank && b <= last) {
            seen += n->hist[b++];
        }
        if ((double)seen < rank) {
            t->q[i] = hi;
            continue;
        }
        double mid = bucket_mid(b - 1);
        t->q[i] = mid < lo ? lo : (mid > hi ? hi : mid);
    }
    t->count = count;
    t->total = n->total;
    t->sumsq = n->sumsq;
    t->min = n->min;
    t->max = n->max;
    node_reset(n, first, last);
}

/* mean, min, max, std, p50, p90, p99 in seconds, exactly as stats.Accumulator.summary()
 * computes them (integer sums, correctly rounded ratios). */
static int
taken_figures(const Taken *t, double out[7])
{
    int64_t count = t->count;
    double mean, variance = 0.0;
    unsigned __int128 c = (unsigned __int128)count, num;
    if (exact_ratio(t->total, c, &mean) < 0) {
        return -1;
    }
    /* count * sumsq - total^2 >= 0 (Cauchy-Schwarz); Python ints when it would overflow */
    if (!__builtin_mul_overflow(c, t->sumsq, &num) && t->total < ((unsigned __int128)1 << 64)) {
        num -= t->total * t->total;
        if (exact_ratio(num, c * c, &variance) < 0) {
            return -1;
        }
    }
    else {
        PyObject *cl = PyLong_FromLongLong(count), *s = u128_to_long(t->sumsq);
        PyObject *tt = u128_to_long(t->total), *a = NULL, *b = NULL, *d = NULL, *v = NULL;
        if (cl && s && tt && (a = PyNumber_Multiply(cl, s)) && (b = PyNumber_Multiply(tt, tt)) &&
            (d = PyNumber_Subtract(a, b))) {
            Py_SETREF(a, PyNumber_Multiply(cl, cl));
            v = a ? PyNumber_TrueDivide(d, a) : NULL;
        }
        Py_XDECREF(cl);
        Py_XDECREF(s);
        Py_XDECREF(tt);
        Py_XDECREF(a);
        Py_XDECREF(b);
        Py_XDECREF(d);
        if (v == NULL) {
            return -1;
        }
        variance = PyFloat_AsDouble(v);
        Py_DECREF(v);
    }
    out[0] = mean / 1e9;
    out[1] = (double)t->min / 1e9;
    out[2] = (double)t->max / 1e9;
    out[3] = sqrt(variance > 0.0 ? variance : 0.0) / 1e9;
    out[4] = t->q[0] / 1e9;
    out[5] = t->q[1] / 1e9;
    out[6] = t->q[2] / 1e9;
    return 0;
}

static PyObject *
Node_take(NodeObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->count == 0) {
        Py_RETURN_NONE;
    }
    Taken t;
    double f[7];
    node_take_into(self, &t);
    if (taken_figures(&t, f) < 0) {
        return NULL;
    }
    PyObject *total = u128_to_long(t.total);
    if (total == NULL) {
        return NULL;
    }
    return Py_BuildValue("(LNddddddd)", (long long)t.count, total, f[0], f[1], f[2], f[3], f[4],
                         f[5], f[6]);
}

/* Add what `src` recorded (count > 0) to `dst`; its records lie in the buckets of its min
 * to its max, the only ones read. */
static void
node_merge(NodeObject *dst, const NodeObject *src)
{
    if (dst->count == 0) {
        dst->min = src->min;
        dst->max = src->max;
    }
    else {
        if (src->min < dst->min) dst->min = src->min;
        if (src->max > dst->max) dst->max = src->max;
    }
    dst->count += src->count;
    dst->total += src->total;
    dst->sumsq += src->sumsq;
    for (int b = bucket_of(src->min), last = bucket_of(src->max); b <= last; b++) {
        dst->hist[b] += src->hist[b];
    }
}

/* drain_into(readers): add what this node recorded since its last take to each node of
 * `readers` (a list or tuple of NodeBase, not this one) and reset it, in one indivisible
 * step; return (count, total ns) of what it held, or None. */
static PyObject *
Node_drain_into(NodeObject *self, PyObject *readers)
{
    if (!PyList_Check(readers) && !PyTuple_Check(readers)) {
        return PyErr_Format(PyExc_TypeError,
                            "drain_into: readers must be a list or tuple of path nodes, got %R",
                            readers);
    }
    PyObject *seq = PySequence_Fast(readers, "drain_into: readers must be a list or tuple");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **each = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyObject_TypeCheck(each[i], &NodeType) || each[i] == (PyObject *)self) {
            PyErr_Format(PyExc_TypeError,
                         "drain_into: each reader must be another path node, got %R", each[i]);
            Py_DECREF(seq);
            return NULL;
        }
    }
    if (self->count == 0) {
        Py_DECREF(seq);
        Py_RETURN_NONE;
    }
    PyObject *total = u128_to_long(self->total); /* made before anything changes */
    PyObject *out = total ? Py_BuildValue("(LN)", (long long)self->count, total) : NULL;
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* no Python call from here to the reset */
        node_merge((NodeObject *)each[i], self);
    }
    node_reset(self, bucket_of(self->min), bucket_of(self->max));
    Py_DECREF(seq);
    return out;
}

static PyObject *
Node_clear_stats(NodeObject *self, PyObject *Py_UNUSED(ignored))
{
    node_reset(self, 0, NBUCKETS - 1);
    Py_RETURN_NONE;
}

static PyObject *
Node_has_records(NodeObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(self->count > 0);
}

/* The C types are static: their own instances hold no reference to the type, and for a
 * heap subclass (PathNode, CpuRegion, ...) CPython's subtype_traverse visits the type
 * before calling this function. Visiting Py_TYPE(self) here too would count that reference
 * twice (a gc_refs underflow: the debug build aborts in gc.collect()). A heap type visits
 * its type only when it is itself the type that owns this tp_traverse. */
static int
Node_traverse(NodeObject *self, visitproc visit, void *arg)
{
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
     "Return (count, total ns, mean, min, max, std, p50, p90, p99) (seconds but the total) "
     "and reset; None if nothing recorded."},
    {"drain_into", (PyCFunction)Node_drain_into, METH_O,
     "Add what was recorded since the last take to each of the given path nodes and reset; "
     "return (count, total ns) or None."},
    {"clear_stats", (PyCFunction)Node_clear_stats, METH_NOARGS, "Forget what was recorded."},
    {"has_records", (PyCFunction)Node_has_records, METH_NOARGS,
     "True if anything was recorded since the last take."},
    {NULL, NULL, 0, NULL},
};

static const FieldSpec node_fields[] = {
    {"path node", "name", offsetof(NodeObject, name), F_STR},
    {"path node", "path", offsetof(NodeObject, path), F_STR},
    {"path node", "parent", offsetof(NodeObject, parent), F_NODE_OR_NONE},
    {"path node", "children", offsetof(NodeObject, children), F_DICT},
    {"path node", "mode", offsetof(NodeObject, mode), F_STR},
    {"path node", "level", offsetof(NodeObject, level), F_LEVEL},
    {"path node", "idle", offsetof(NodeObject, idle), F_LEVEL},
};

static PyGetSetDef Node_getset[] = {
    FIELD_GETSET(node_fields[0]), FIELD_GETSET(node_fields[1]), FIELD_GETSET(node_fields[2]),
    FIELD_GETSET(node_fields[3]), FIELD_GETSET(node_fields[4]), LEVEL_GETSET(node_fields[5]),
    LEVEL_GETSET(node_fields[6]), {NULL, NULL, NULL, NULL, NULL},
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
    .tp_getset = Node_getset,
};

/* -- take_tree: a flush's walk of the path tree ------------------------------------------
 * take_tree(root, idle_limit, keep, concurrent[, source]) does in one pass what
 * registry.collect() needs of every path (registry._take_tree is the same in Python): take
 * each node's interval figures (node_take_into; from `source[node]` instead when a dict is
 * given: a reader's own records), count idle flushes, release the idle leaves nothing else
 * holds, and return the nodes with records (or in `keep`) as columns, in tree order
 * (parents first, siblings by creation). Phases: walk and check (no change and no Python
 * object made, so no other code runs and the children dicts cannot change under it), look
 * up the sources, take (no Python call: every node is taken in one indivisible step), build
 * the columns, release. The caller (registry.collect) holds the registry lock. */

typedef struct {
    NodeObject *node;        /* strong reference */
    Py_ssize_t parent;       /* walk index of the parent; -1 below the root */
    Py_ssize_t reach;        /* the highest level of the node and its ancestors */
    Py_ssize_t row;          /* output row; -1: left out */
    Py_ssize_t released;     /* children released in this pass (each holds a reference) */
    NodeObject *from;        /* where its figures are taken from (strong; NULL: none) */
    Taken taken;
} TreeItem;

typedef struct {
    PyObject *children;
    Py_ssize_t pos;
    Py_ssize_t index; /* walk index of the node owning `children` */
} TreeLevel;

static int
grow(void **buf, Py_ssize_t *cap, Py_ssize_t need, size_t size)
{
    if (need <= *cap) {
        return 0;
    }
    Py_ssize_t n = *cap ? *cap : 64;
    while (n < need) {
        n *= 2;
    }
    void *p = PyMem_Realloc(*buf, (size_t)n * size);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *buf = p;
    *cap = n;
    return 0;
}

/* Deeper than this, a tree is a cycle (a node among its own descendants). */
#define MAX_WALK_DEPTH (1 << 16)

/* Every node below root, preorder, each with a strong reference; -1 on a child that is
 * not a path node, a node without its fields, or a cycle. */
static int
walk_tree(NodeObject *root, TreeItem **items, Py_ssize_t *count)
{
    TreeLevel *stack = NULL;
    Py_ssize_t depth = 0, stack_cap = 0, cap = 0, n = 0;
    int rc = -1;
    if (root->children == NULL) {
        *count = 0;
        return 0;
    }
    if (grow((void **)&stack, &stack_cap, 1, sizeof *stack) < 0) {
        return -1;
    }
    stack[depth++] = (TreeLevel){root->children, 0, -1};
    while (depth > 0) {
        TreeLevel *top = &stack[depth - 1];
        PyObject *key, *value;
        if (!PyDict_Next(top->children, &top->pos, &key, &value)) {
            depth--;
            continue;
        }
        if (!PyObject_TypeCheck(value, &NodeType)) {
            PyErr_Format(PyExc_TypeError,
                         "take_tree: a path node's children must be path nodes, got %R under "
                         "the key %R",
                         value, key);
            goto done;
        }
        NodeObject *node = (NodeObject *)value;
        if (node->path == NULL || node->mode == NULL || node->children == NULL) {
            PyErr_SetString(PyExc_TypeError,
                            "take_tree: a path node without its path, mode or children");
            goto done;
        }
        if (grow((void **)items, &cap, n + 1, sizeof **items) < 0) {
            goto done;
        }
        Py_ssize_t parent = top->index;
        Py_ssize_t reach = parent < 0 ? 0 : (*items)[parent].reach;
        Py_INCREF(node);
        (*items)[n] = (TreeItem){node, parent, node->level > reach ? node->level : reach, -1, 0,
                                 NULL};
        if (PyDict_GET_SIZE(node->children) > 0) {
            if (depth >= MAX_WALK_DEPTH) {
                PyErr_Format(PyExc_ValueError,
                             "take_tree: the path tree is deeper than %d nodes below %R (a "
                             "node among its own children?)",
                             MAX_WALK_DEPTH, key);
                n++;
                goto done;
            }
            if (grow((void **)&stack, &stack_cap, depth + 1, sizeof *stack) < 0) {
                n++;
                goto done;
            }
            stack[depth++] = (TreeLevel){node->children, 0, n};
        }
        n++;
    }
    rc = 0;
done:
    PyMem_Free(stack);
    *count = n;
    return rc;
}

/* Release the idle leaves (idle >= idle_limit, no children) that nothing but their
 * parent's children dict holds, children before parents; returns how many, -1 on error. */
static Py_ssize_t
release_idle(TreeItem *items, Py_ssize_t n, Py_ssize_t idle_limit, PyObject *concurrent)
{
    Py_ssize_t released = 0;
    for (Py_ssize_t k = n - 1; k >= 0; k--) {
        NodeObject *node = items[k].node;
        if (node->idle < idle_limit || PyDict_GET_SIZE(node->children) > 0 ||
            node->parent == NULL || node->parent == Py_None || node->name == NULL) {
            continue;
        }
        int in_concurrent = 0;
        if (concurrent != NULL && (in_concurrent = PySet_Contains(concurrent, (PyObject *)node)) < 0) {
            return -1;
        }
        /* the parent's dict, items[k], the concurrent set, released children's parent */
        if (Py_REFCNT(node) > 2 + in_concurrent + items[k].released) {
            continue;
        }
        PyObject *siblings = ((NodeObject *)node->parent)->children;
        if (siblings == NULL || PyDict_GetItemWithError(siblings, node->name) != (PyObject *)node) {
            if (PyErr_Occurred()) {
                return -1;
            }
            continue;
        }
        if (PyDict_DelItem(siblings, node->name) < 0 ||
            (in_concurrent && PySet_Discard(concurrent, (PyObject *)node) < 0)) {
            return -1;
        }
        Py_ssize_t parent = items[k].parent;
        if (parent >= 0 && (PyObject *)items[parent].node == node->parent) {
            items[parent].released++;
        }
        released++;
    }
    return released;
}

static PyObject *
take_tree(PyObject *module, PyObject *args)
{
    PyObject *root, *keep, *concurrent, *source = Py_None;
    Py_ssize_t idle_limit;
    if (!PyArg_ParseTuple(args, "O!nOO|O:take_tree", &NodeType, &root, &idle_limit, &keep,
                          &concurrent, &source)) {
        return NULL;
    }
    if (source != Py_None && !PyDict_Check(source)) {
        return PyErr_Format(PyExc_TypeError, "take_tree: source must be a dict or None, got %R",
                            source);
    }
    source = source == Py_None ? NULL : source;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (source != NULL && PyDict_Next(source, &pos, &key, &value)) {
        if (!PyObject_TypeCheck(value, &NodeType)) {
            return PyErr_Format(PyExc_TypeError,
                                "take_tree: source values must be path nodes, got %R", value);
        }
    }
    if (keep != Py_None && !PyAnySet_Check(keep)) {
        return PyErr_Format(PyExc_TypeError, "take_tree: keep must be a set or None, got %R",
                            keep);
    }
    if (concurrent != Py_None && !PySet_Check(concurrent)) {
        return PyErr_Format(PyExc_TypeError,
                            "take_tree: concurrent must be a set or None, got %R", concurrent);
    }
    keep = keep == Py_None ? NULL : keep;
    concurrent = concurrent == Py_None ? NULL : concurrent;
    TreeItem *items = NULL;
    double *figures = NULL;
    int64_t *links = NULL;
    Py_ssize_t n = 0, rows = 0, released = 0;
    long long regions = 0;
    PyObject *out = NULL, *lists[5] = {NULL, NULL, NULL, NULL, NULL}, *fig = NULL, *lnk = NULL;
    if (walk_tree((NodeObject *)root, &items, &n) < 0) {
        goto done;
    }
    for (Py_ssize_t k = 0; source != NULL && k < n; k++) { /* each node's figures' holder */
        PyObject *from = PyDict_GetItemWithError(source, (PyObject *)items[k].node);
        if (from == NULL) {
            if (PyErr_Occurred()) {
                goto done;
            }
            continue;
        }
        if (!PyObject_TypeCheck(from, &NodeType)) {
            PyErr_Format(PyExc_TypeError, "take_tree: source values must be path nodes, got %R",
                         from);
            goto done;
        }
        Py_INCREF(from);
        items[k].from = (NodeObject *)from;
    }
    for (Py_ssize_t k = 0; k < n; k++) { /* take: no Python call until every node is taken */
        NodeObject *node = items[k].node;
        NodeObject *from = source == NULL ? node : items[k].from;
        if (from != NULL && from->count > 0) {
            node_take_into(from, &items[k].taken);
            node->idle = 0;
            items[k].row = rows++;
            regions += items[k].taken.count;
        }
        else {
            items[k].taken.count = 0;
            if (from != node && node->count > 0) {
                node->idle = 0; /* recorded since its records went to the readers: not idle */
            }
            else if (node->idle < PY_SSIZE_T_MAX) {
                node->idle++;
            }
        }
    }
    for (Py_ssize_t k = 0; keep != NULL && k < n; k++) {
        if (items[k].row < 0) {
            int found = PySet_Contains(keep, (PyObject *)items[k].node);
            if (found < 0) {
                goto done;
            }
            items[k].row = found ? 0 : -1; /* numbered below */
        }
    }
    if (keep != NULL) { /* rows in tree order again, now with the kept nodes */
        rows = 0;
        for (Py_ssize_t k = 0; k < n; k++) {
            if (items[k].row >= 0) {
                items[k].row = rows++;
            }
        }
    }
    figures = PyMem_Calloc((size_t)(rows ? rows : 1), 7 * sizeof(double));
    links = PyMem_Calloc((size_t)(rows ? rows : 1), 3 * sizeof(int64_t));
    if (figures == NULL || links == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (int i = 0; i < 5; i++) {
        if ((lists[i] = PyList_New(rows)) == NULL) {
            goto done;
        }
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        TreeItem *it = &items[k];
        Py_ssize_t r = it->row;
        if (r < 0) {
            continue;
        }
        if (it->taken.count > 0 && taken_figures(&it->taken, &figures[7 * r]) < 0) {
            goto done;
        }
        PyObject *count = PyLong_FromLongLong(it->taken.count);
        PyObject *total = count ? u128_to_long(it->taken.total) : NULL;
        if (total == NULL) {
            Py_XDECREF(count);
            goto done;
        }
        NodeObject *node = it->node;
        Py_INCREF(node);
        Py_INCREF(node->path);
        Py_INCREF(node->mode);
        PyList_SET_ITEM(lists[0], r, (PyObject *)node);
        PyList_SET_ITEM(lists[1], r, node->path);
        PyList_SET_ITEM(lists[2], r, node->mode);
        PyList_SET_ITEM(lists[3], r, count);
        PyList_SET_ITEM(lists[4], r, total);
        links[3 * r] = it->parent < 0 ? -1 : items[it->parent].row;
        links[3 * r + 1] = node->level;
        links[3 * r + 2] = it->reach;
    }
    released = release_idle(items, n, idle_limit, concurrent);
    if (released < 0) {
        goto done;
    }
    fig = PyBytes_FromStringAndSize((const char *)figures, (Py_ssize_t)(rows * 7 * sizeof(double)));
    lnk = fig ? PyBytes_FromStringAndSize((const char *)links,
                                          (Py_ssize_t)(rows * 3 * sizeof(int64_t)))
              : NULL;
    if (lnk != NULL) {
        out = Py_BuildValue("(OOOOOOOLn)", lists[0], lists[1], lists[2], lists[3], lists[4], fig,
                            lnk, regions, released);
    }
done:
    for (int i = 0; i < 5; i++) {
        Py_XDECREF(lists[i]);
    }
    Py_XDECREF(fig);
    Py_XDECREF(lnk);
    PyMem_Free(figures);
    PyMem_Free(links);
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_DECREF(items[k].node);
        Py_XDECREF(items[k].from);
    }
    PyMem_Free(items);
    return out;
}
/* -- end of take_tree ------------------------------------------------------------------ */

/* A region frame is a Frame (node, t0, parent frame, owner, event): whatever Python code put
 * in the context variable or passed to set_top() is checked before its items are read. */
static PyTypeObject *node_types_seen[4]; /* NodeBase subclasses seen (strong, kept) */

/* PyObject_TypeCheck(o, &NodeType), remembering a few subclasses (PathNode) so that the
 * hot path compares pointers instead of walking the MRO. */
static NOINLINE int
is_node_type(PyTypeObject *t)
{
    if (!PyType_IsSubtype(t, &NodeType)) {
        return 0;
    }
    for (int i = 0; i < 4; i++) {
        if (node_types_seen[i] == t) {
            return 1;
        }
        if (node_types_seen[i] == NULL) {
            Py_INCREF(t);
            node_types_seen[i] = t;
            return 1;
        }
    }
    return 1;
}

HOT static inline int
is_node(PyObject *o)
{
    PyTypeObject *t = Py_TYPE(o);
    if (t == &NodeType || t == node_types_seen[0] || t == node_types_seen[1]) {
        return 1;
    }
    return is_node_type(t);
}

HOT static inline int
is_frame(PyObject *f)
{
    return Py_IS_TYPE(f, frame_type) && PyTuple_GET_SIZE(f) == 5 && is_node(PyTuple_GET_ITEM(f, 0)) &&
           ((NodeObject *)PyTuple_GET_ITEM(f, 0))->children != NULL;
}

COLD static int
malformed_frame(void)
{
    PyErr_SetString(PyExc_RuntimeError, "instrument: malformed region frame");
    return -1;
}

/* -- where the innermost frame lives ----------------------------------------------------
 * C versions of instrument/regions/frames.py's _get and _set (get_top / set_top), with the
 * same semantics: the innermost frame of each contextvars.Context is what the frame context
 * variable holds in that context (a thread, an asyncio task, a greenlet, a
 * copy_context().run()), and a copied context starts from the frame current at copy time.
 *
 * Setting a context variable allocates (a new HAMT and a Token) on every region enter and
 * exit. To avoid that, the variable holds, once per context, a small mutable *stack
 * holder* created for that context (its owner) whose `top` is the innermost frame; a
 * transition swaps holder->top in place. That is only the same as setting the variable when
 * no other context can see the holder: a copy of the context (a task, copy_context()) shares
 * the variable's mapping, so it would see later swaps. So a transition swaps in place only
 * when the holder is *exclusive*: its owner is the running context and no mapping but the
 * owner's reaches it (holder_is_exclusive walks the owner's HAMT from the root to the holder,
 * every object on the way referenced once). Otherwise the old holder is left alone -- it
 * keeps the top the copy saw, and its owner never changes it again, since the owner's
 * variable no longer points to it -- and the context gets a fresh holder (one variable set).
 * A context that reads a holder it does not own (a task reading its creator's holder) sees
 * its top, which is the frame current when the context was copied.
 *
 * The layout of PyContext and of CPython's HAMT (Python/hamt.c) is read only on the
 * versions it was checked against (3.10 to 3.13, the test suite run on each:
 * docs/compatibility.md), and only once probe_layout() has confirmed it at run time; on
 * any other version every transition sets the variable to the frame itself, as the
 * pure-Python path does (the same results, slower). */

#ifdef Py_GIL_DISABLED
#error "the C hot path relies on the GIL; free-threaded builds use the pure-Python path"
#endif

#if PY_VERSION_HEX >= 0x030A0000 && PY_VERSION_HEX < 0x030E0000
#define CONTEXT_LAYOUT_KNOWN 1
#else
#define CONTEXT_LAYOUT_KNOWN 0
#endif

typedef struct { /* the leading fields of CPython's PyContext (3.10 to 3.13) */
    PyObject_HEAD
    PyObject *ctx_prev;
    PyObject *ctx_vars; /* a PyHamtObject */
    PyObject *ctx_weakreflist;
    int ctx_entered;
} ContextHead;

typedef struct { /* PyHamtObject (Include/internal/pycore_hamt.h) */
    PyObject_HEAD
    PyObject *h_root;
} HamtHead;

typedef struct { /* PyHamtNode_Bitmap (Python/hamt.c): key/value pairs, key NULL = subnode */
    PyObject_VAR_HEAD
    uint32_t b_bitmap;
    PyObject *b_array[1];
} HamtBitmap;

typedef struct { /* PyHamtNode_Array */
    PyObject_HEAD
    PyObject *a_array[32];
    Py_ssize_t a_count;
} HamtArray;

typedef struct { /* PyHamtNode_Collision: key/value pairs of one hash */
    PyObject_VAR_HEAD
    int32_t c_hash;
    PyObject *c_array[1];
} HamtCollision;

typedef struct { /* the leading fields of CPython's PyContextVar (3.10 to 3.13) */
    PyObject_HEAD
    PyObject *var_name;
    PyObject *var_default;
    PyObject *var_cached; /* the value last read, valid for (thread id, context version) */
    uint64_t var_cached_tsid;
    uint64_t var_cached_tsver;
} VarHead;

static PyTypeObject *hamt_type, *bitmap_type, *array_type, *collision_type;
static int32_t frame_var_hash; /* the frame variable's hash as the HAMT folds it */
static Py_ssize_t root_slot = 0; /* where the variable was last found in a root bitmap node */
static int holders_on = 0;     /* probe_layout() passed: frames live in stack holders */

COLD static int
not_bound(void)
{
    PyErr_SetString(PyExc_RuntimeError, "instrument._speedups used before bind_stack()");
    return -1;
}

static inline int
check_bound(void)
{
    return frame_var != NULL ? 0 : not_bound();
}

typedef struct {
    PyObject_HEAD
    PyObject *owner; /* the Context this holder was made for (strong), or NULL */
    PyObject *top;   /* the innermost frame (strong) */
} StackObject;

static int
Stack_traverse(StackObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->owner);
    Py_VISIT(self->top);
    return 0;
}

static int
Stack_clear(StackObject *self)
{
    Py_CLEAR(self->owner);
    Py_CLEAR(self->top);
    return 0;
}

static void
Stack_dealloc(StackObject *self)
{
    PyObject_GC_UnTrack(self);
    Stack_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject StackType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._speedups.StackHolder",
    .tp_doc = "The region stack of one context: its innermost frame (internal).",
    .tp_basicsize = sizeof(StackObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)Stack_dealloc,
    .tp_traverse = (traverseproc)Stack_traverse,
    .tp_clear = (inquiry)Stack_clear,
};

/* Learn the HAMT node types from their names (they are not exported). */
static PyTypeObject *
hamt_node_kind(PyObject *node)
{
    PyTypeObject *t = Py_TYPE(node);
    if (t == bitmap_type || t == array_type || t == collision_type) {
        return t;
    }
    const char *name = t->tp_name;
    if (strcmp(name, "hamt_bitmap_node") == 0) {
        return bitmap_type = t;
    }
    if (strcmp(name, "hamt_array_node") == 0) {
        return array_type = t;
    }
    if (strcmp(name, "hamt_collision_node") == 0) {
        return collision_type = t;
    }
    return NULL;
}

/* The number of bits set (inline: without -mpopcnt, __builtin_popcount is a libgcc call). */
static inline uint32_t
popcount32(uint32_t x)
{
    x = x - ((x >> 1) & 0x55555555u);
    x = (x & 0x33333333u) + ((x >> 2) & 0x33333333u);
    x = (x + (x >> 4)) & 0x0f0f0f0fu;
    return (x * 0x01010101u) >> 24;
}

/* True if `ctx` is the only context whose variables reach `holder`: the HAMT object and
 * every node from its root down to the holder are referenced once, and the holder once by
 * its node plus `extra` references held by the caller. Any copy of the context (shared
 * HAMT), or a mapping derived from one (sharing a node on the way), makes it false. */
static NOINLINE int holder_walk(PyObject *node, PyObject *holder, Py_ssize_t extra);

HOT static inline int
holder_is_exclusive(PyObject *ctx, PyObject *holder, Py_ssize_t extra)
{
    PyObject *vars = ((ContextHead *)ctx)->ctx_vars;
    if (vars == NULL || Py_TYPE(vars) != hamt_type || Py_REFCNT(vars) != 1) {
        return 0;
    }
    PyObject *node = ((HamtHead *)vars)->h_root;
    /* the usual case first: the variable is a key of the root, at the slot it had last time
     * (what the slot holds now is read, so a stale slot number only means the walk below) */
    if (node != NULL && Py_TYPE(node) == bitmap_type && Py_REFCNT(node) == 1 &&
        root_slot < Py_SIZE(node) && ((HamtBitmap *)node)->b_array[root_slot] == frame_var) {
        return ((HamtBitmap *)node)->b_array[root_slot + 1] == holder &&
               Py_REFCNT(holder) == 1 + extra;
    }
    return holder_walk(node, holder, extra);
}

/* holder_is_exclusive's walk from the HAMT's root `node` down to the variable. */
static NOINLINE int
holder_walk(PyObject *node, PyObject *holder, Py_ssize_t extra)
{
    for (uint32_t shift = 0; node != NULL && shift < 35; shift += 5) {
        if (Py_REFCNT(node) != 1) {
            return 0;
        }
        PyTypeObject *kind = hamt_node_kind(node);
        uint32_t index = ((uint32_t)frame_var_hash >> shift) & 0x1f;
        if (kind == bitmap_type) {
            HamtBitmap *b = (HamtBitmap *)node;
            uint32_t bit = (uint32_t)1 << index;
            if (!(b->b_bitmap & bit)) {
                return 0;
            }
            uint32_t i = 2 * popcount32(b->b_bitmap & (bit - 1));
            if (b->b_array[i] == NULL) {
                node = b->b_array[i + 1];
                continue;
            }
            if (shift == 0) {
                root_slot = (Py_ssize_t)i;
            }
            return b->b_array[i] == frame_var && b->b_array[i + 1] == holder &&
                   Py_REFCNT(holder) == 1 + extra;
        }
        if (kind == array_type) {
            node = ((HamtArray *)node)->a_array[index];
            continue;
        }
        if (kind == collision_type) {
            HamtCollision *c = (HamtCollision *)node;
            for (Py_ssize_t i = 0; i + 1 < Py_SIZE(c); i += 2) {
                if (c->c_array[i] == frame_var) {
                    return c->c_array[i + 1] == holder && Py_REFCNT(holder) == 1 + extra;
                }
            }
        }
        return 0;
    }
    return 0;
}

/* frames._get, keeping what the variable holds: a new reference to the innermost frame of
 * this context, and in *value a new reference to the variable's value (a holder or a frame),
 * for top_swap(). `ts`: this thread's state (PyThreadState_Get(), read once per call). */
HOT static inline PyObject *
top_read(PyThreadState *ts, PyObject **value)
{
#if CONTEXT_LAYOUT_KNOWN
    VarHead *var = (VarHead *)frame_var;
    if (holders_on && ts->context != NULL && var->var_cached != NULL &&
        var->var_cached_tsid == ts->id && var->var_cached_tsver == ts->context_ver) {
        *value = var->var_cached; /* PyContextVar_Get's own cache, read inline */
        Py_INCREF(*value);
    }
    else
#endif
    if (PyContextVar_Get(frame_var, NULL, value) < 0) {
        *value = NULL;
        return NULL;
    }
    PyObject *top = *value;
    if (Py_IS_TYPE(top, &StackType)) {
        top = ((StackObject *)top)->top;
    }
    Py_INCREF(top);
    return top;
}

/* frames._get: a new reference to the innermost frame of this context. */
HOT static PyObject *
top_get(void)
{
    PyObject *value, *top = top_read(PyThreadState_Get(), &value);
    Py_XDECREF(value);
    return top;
}

/* frames._set, given what the variable held (`value`, from top_read, still referenced by
 * the caller): make `frame` the innermost frame of this context -- in place when this
 * context's holder is exclusive, else by setting the variable (a fresh holder). */
static int top_swap_set(PyThreadState *ts, PyObject *frame);

HOT static inline int
top_swap(PyThreadState *ts, PyObject *value, PyObject *frame)
{
    PyObject *ctx = ts->context;
    if (holders_on && Py_IS_TYPE(value, &StackType) && ((StackObject *)value)->owner == ctx &&
        ctx != NULL && holder_is_exclusive(ctx, value, 1)) {
        Py_INCREF(frame);
        Py_SETREF(((StackObject *)value)->top, frame);
        return 0;
    }
    return top_swap_set(ts, frame);
}

/* top_swap's other case: set the variable (a fresh holder, when holders are on). */
static NOINLINE int
top_swap_set(PyThreadState *ts, PyObject *frame)
{
    PyObject *ctx, *token;
    if (holders_on) { /* this context's first transition, or its holder is shared */
        StackObject *fresh = PyObject_GC_New(StackObject, &StackType);
        if (fresh == NULL) {
            return -1;
        }
        fresh->owner = NULL;
        Py_INCREF(frame);
        fresh->top = frame;
        PyObject_GC_Track(fresh);
        token = PyContextVar_Set(frame_var, (PyObject *)fresh);
        if (token != NULL) {
            ctx = ts->context; /* exists now, if it did not before */
            Py_XINCREF(ctx);
            fresh->owner = ctx;
        }
        Py_DECREF(fresh);
    }
    else {
        token = PyContextVar_Set(frame_var, frame);
    }
    if (token == NULL) {
        return -1;
    }
    Py_DECREF(token);
    return 0;
}

/* frames._set: make `frame` the innermost frame of this context. */
HOT static int
top_set(PyObject *frame)
{
    PyThreadState *ts = PyThreadState_Get();
    PyObject *value, *top = top_read(ts, &value); /* (PyContextVar_Get's cache, inline) */
    if (top == NULL) {
        return -1;
    }
    Py_DECREF(top);
    int rc = top_swap(ts, value, frame);
    Py_DECREF(value);
    return rc;
}

static PyObject *
get_top(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return check_bound() < 0 ? NULL : top_get();
}

static PyObject *
set_top(PyObject *module, PyObject *frame)
{
    if (!is_frame(frame)) {
        PyErr_Format(PyExc_TypeError,
                     "set_top() needs a region frame (node, t0, parent, owner, event), got %R",
                     frame);
        return NULL;
    }
    if (check_bound() < 0 || top_set(frame) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* PyContextVar_Get fills the variable's cache as VarHead says (top_read reads it). */
static int
var_cache_confirmed(StackObject *probe)
{
    PyObject *got = NULL;
    if (PyContextVar_Get(frame_var, NULL, &got) < 0 || got != (PyObject *)probe) {
        Py_XDECREF(got);
        return 0;
    }
    Py_DECREF(got);
#if CONTEXT_LAYOUT_KNOWN
    PyThreadState *ts = PyThreadState_Get();
    VarHead *var = (VarHead *)frame_var;
    return var->var_cached == (PyObject *)probe && var->var_cached_tsid == ts->id &&
           var->var_cached_tsver == ts->context_ver;
#else
    return 0;
#endif
}

/* Confirm the layout read above on this interpreter, in a fresh context: a holder set
 * there is exclusive, and stops being so once the context is copied. */
static int
layout_confirmed(void)
{
    if (!CONTEXT_LAYOUT_KNOWN) {
        return 0;
    }
    PyObject *ctx = PyContext_New();
    if (ctx == NULL || PyContext_Enter(ctx) < 0) {
        Py_XDECREF(ctx);
        return -1;
    }
    int ok = 0;
    StackObject *probe = PyObject_GC_New(StackObject, &StackType);
    PyObject *token = NULL, *copy = NULL;
    if (probe != NULL) {
        probe->owner = NULL;
        probe->top = Py_NewRef(root_frame);
        PyObject_GC_Track(probe);
        token = PyContextVar_Set(frame_var, (PyObject *)probe);
        PyObject *vars = ((ContextHead *)ctx)->ctx_vars;
        if (token != NULL && vars != NULL && strcmp(Py_TYPE(vars)->tp_name, "hamt") == 0) {
            hamt_type = Py_TYPE(vars);
            Py_CLEAR(token); /* a token holds the previous value only; released */
            ok = holder_is_exclusive(ctx, (PyObject *)probe, 1) && var_cache_confirmed(probe);
            copy = ok ? PyContext_CopyCurrent() : NULL;
            ok = ok && copy != NULL && !holder_is_exclusive(ctx, (PyObject *)probe, 1);
        }
    }
    Py_XDECREF(copy);
    Py_XDECREF(token);
    Py_XDECREF(probe);
    if (PyContext_Exit(ctx) < 0) {
        ok = -1;
    }
    Py_DECREF(ctx);
    if (ok < 0 || PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return ok;
}

static PyObject *
use_holders(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    if (check_bound() < 0) {
        return NULL;
    }
    holders_on = layout_confirmed();
    return PyBool_FromLong(holders_on);
}

/* -- regions --------------------------------------------------------------------------- */

/* CpuRegion's and SkippedRegion's __enter__ / __exit__ (see "bound once" below) */
enum { M_CPU_ENTER, M_CPU_EXIT, M_SKIP_ENTER, M_SKIP_EXIT, N_METHODS };

typedef struct {
    PyObject_HEAD
    PyObject *name;
    PyObject *clock;
    PyObject *now;
    Py_ssize_t level;
    PyObject *bound[N_METHODS]; /* its methods bound once, made on first lookup */
    /* the child node last found for this region: cache_child (borrowed) is
     * children[cache_name] of the children dict whose version tag is cache_version; a dict's
     * version tag changes on every change and is never reused, by that or any other dict */
    PyObject *cache_name;
    PyObject *cache_child;
    uint64_t cache_version; /* 0: nothing cached */
} RegionObject;

static PyTypeObject RegionType;

/* A dict's version tag (PEP 509) where CPython keeps one (to 3.13); 0 elsewhere, which
 * turns the lookup caches off. */
#if PY_VERSION_HEX < 0x030E0000
#define HAVE_DICT_VERSION 1
static inline uint64_t
dict_version(PyObject *d)
{
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
    return ((PyDictObject *)d)->ma_version_tag;
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
}
#else
#define HAVE_DICT_VERSION 0
static inline uint64_t
dict_version(PyObject *d)
{
    return 0;
}
#endif

/* -1 with AttributeError (as for an unset __slots__ field) if __init__ never ran; the
 * field named is the one the Python code would read first (enter: name, exit: _now). */
COLD static int
region_unset_error(RegionObject *self, int exiting)
{
    const char *field = (self->now == NULL && (exiting || self->name != NULL)) ? "_now" : "name";
    PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute '%s'",
                 Py_TYPE(self)->tp_name, field);
    return -1;
}

static inline int
region_unset(RegionObject *self, int exiting)
{
    if (self->name != NULL && self->now != NULL) {
        return 0;
    }
    return region_unset_error(self, exiting);
}

COLD static int
arity_error(const char *format, Py_ssize_t nargs)
{
    PyErr_Format(PyExc_TypeError, format, nargs);
    return -1;
}

static inline int
exit_arity(Py_ssize_t nargs)
{
    if (nargs == 3) {
        return 0;
    }
    return arity_error("__exit__() takes 3 arguments (exc_type, exc, tb), got %zd", nargs);
}

static inline int
enter_arity(Py_ssize_t nargs)
{
    if (nargs == 0) {
        return 0;
    }
    return arity_error("__enter__() takes no arguments, got %zd", nargs);
}

/* A clock other than perf_counter_ns: called. */
static int
read_now_called(PyObject *now, int64_t *out)
{
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

HOT static inline int
read_now(PyObject *now, int64_t *out)
{
    if (now == perf_counter_ns) { /* CPython's perf_counter_ns is CLOCK_MONOTONIC on Linux */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        *out = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
        return 0;
    }
    return read_now_called(now, out);
}

/* -- frames: start times and spare frames ----------------------------------------------
 * A frame's start time is a Python int (frames are the tuples frames.py describes). A
 * frame that nothing references any more once it is closed -- nor its start time -- is
 * kept as a spare (up to SPARE_FRAMES) and refilled by the next enter: its int is set to
 * the new start time in place when it has as many digits (no other reference exists, so
 * no one can see it change), which saves allocating and freeing a tuple and an int per
 * region. A spare holds None in place of its node and parent and an empty list in place
 * of its owner, so it keeps nothing alive, is harmless where gc.get_objects() shows it, and
 * stays tracked by the garbage collector (which untracks a tuple holding only untracked
 * objects; a frame is always tracked). Off from 3.14, whose reference counts no longer say
 * "no other reference". */

#if PY_VERSION_HEX < 0x030E0000
#define SPARE_FRAMES 16
#else
#define SPARE_FRAMES 0
#endif

#if PY_VERSION_HEX < 0x030C0000
#define LONG_DIGITS(o) (((PyLongObject *)(o))->ob_digit)
#else
#define LONG_DIGITS(o) (((PyLongObject *)(o))->long_value.ob_digit)
#endif

/* The number of digits of a positive int as CPython stores it, or -1 if it is not positive
 * (or, from 3.14, not known). */
static inline Py_ssize_t
long_positive_size(PyObject *o)
{
#if PY_VERSION_HEX < 0x030C0000
    Py_ssize_t size = Py_SIZE(o);
    return size > 0 ? size : -1;
#elif SPARE_FRAMES
    uintptr_t tag = ((PyLongObject *)o)->long_value.lv_tag;
    return (tag & 3) == 0 ? (Py_ssize_t)(tag >> 3) : -1; /* sign bits 0: positive */
#else
    return -1;
#endif
}

/* The value of the int `o` (a frame's start time) in *out; 0, or -1 with an exception. */
HOT static inline int
long_read(PyObject *o, int64_t *out)
{
    if (PyLong_CheckExact(o) && long_positive_size(o) == 2) {
        *out = (int64_t)LONG_DIGITS(o)[0] | ((int64_t)LONG_DIGITS(o)[1] << PyLong_SHIFT);
        return 0;
    }
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

/* Set the int `o`, referenced by a spare frame only, to v in place; -1 (nothing changed)
 * unless v > 0 has exactly as many digits as `o`. */
HOT static inline int
long_reuse(PyObject *o, int64_t v)
{
    if (v <= 0) {
        return -1;
    }
    int bits = 64 - __builtin_clzll((unsigned long long)v);
    Py_ssize_t n = (bits + PyLong_SHIFT - 1) / PyLong_SHIFT;
    if (long_positive_size(o) != n) {
        return -1;
    }
    digit *d = LONG_DIGITS(o);
    for (uint64_t u = (uint64_t)v; u != 0; u >>= PyLong_SHIFT) {
        *d++ = (digit)(u & PyLong_MASK);
    }
    return 0;
}

/* Put `item` (a reference taken over) in place of the item `i` of the frame being built:
 * None in a spare, NULL in a new tuple. */
HOT static inline void
frame_put(PyObject *frame, Py_ssize_t i, PyObject *item)
{
    PyObject *old = PyTuple_GET_ITEM(frame, i);
    PyTuple_SET_ITEM(frame, i, item);
    Py_XDECREF(old);
}

static PyObject *spare_frames[SPARE_FRAMES > 0 ? SPARE_FRAMES : 1];
static PyObject *spare_marker = NULL; /* a spare's owner: an empty list (module init) */
static int n_spare = 0;

/* frame_make's other case: `spare` (not NULL) with a new int for its start time t0, or a
 * new frame (None, t0, NULL, NULL, None). NULL on failure, the spare kept. */
static NOINLINE PyObject *
frame_with_new_start(PyObject *spare, int64_t t0)
{
    PyObject *t = PyLong_FromLongLong(t0);
    if (t == NULL) {
        if (spare != NULL) {
            spare_frames[n_spare++] = spare;
        }
        return NULL;
    }
    if (spare != NULL) {
        PyObject *old = PyTuple_GET_ITEM(spare, 1);
        PyTuple_SET_ITEM(spare, 1, t);
        Py_DECREF(old);
        return spare;
    }
    /* a Frame with its items NULL (what PyTuple_New gives a tuple), tracked by the gc */
    PyObject *frame = frame_type->tp_alloc(frame_type, 5);
    if (frame == NULL) {
        Py_DECREF(t);
        return NULL;
    }
    PyTuple_SET_ITEM(frame, 1, t);
    Py_INCREF(Py_None);
    PyTuple_SET_ITEM(frame, 4, Py_None);
    return frame;
}

/* A new frame (node, t0, parent, owner, None): a spare refilled, or a new tuple. Takes
 * over the references to `node` and `parent`, also on failure (NULL). */
HOT static PyObject *
frame_make(PyObject *node, int64_t t0, PyObject *parent, PyObject *owner)
{
    PyObject *frame = NULL;
    while (n_spare > 0) {
        frame = spare_frames[--n_spare];
        if (Py_REFCNT(frame) == 1 && Py_REFCNT(PyTuple_GET_ITEM(frame, 1)) == 1) {
            break;
        }
        /* reached since it was kept (gc.get_objects()): Python code may hold it or its
         * int, which must not change under it; let it go */
        Py_DECREF(frame);
        frame = NULL;
    }
    if (frame == NULL || long_reuse(PyTuple_GET_ITEM(frame, 1), t0) < 0) {
        frame = frame_with_new_start(frame, t0);
        if (frame == NULL) {
            Py_DECREF(node);
            Py_DECREF(parent);
            return NULL;
        }
    }
    Py_INCREF(owner);
    frame_put(frame, 0, node);
    frame_put(frame, 2, parent);
    frame_put(frame, 3, owner);
    return frame;
}

/* Release our reference to a closed frame: kept as a spare when it was the last one to
 * the frame and to its start time. */
HOT static inline void
frame_release(PyObject *frame)
{
#if SPARE_FRAMES
    if (Py_REFCNT(frame) == 1 && n_spare < SPARE_FRAMES && spare_marker != NULL &&
        Py_IS_TYPE(frame, frame_type) && PyTuple_GET_SIZE(frame) == 5 && PyTuple_GET_ITEM(frame, 4) == Py_None) {
        PyObject *t = PyTuple_GET_ITEM(frame, 1);
        if (t != NULL && PyLong_CheckExact(t) && Py_REFCNT(t) == 1) {
            PyObject *node = PyTuple_GET_ITEM(frame, 0), *parent = PyTuple_GET_ITEM(frame, 2);
            PyObject *owner = PyTuple_GET_ITEM(frame, 3);
            Py_INCREF(Py_None);
            Py_INCREF(Py_None);
            Py_INCREF(spare_marker);
            PyTuple_SET_ITEM(frame, 0, Py_None);
            PyTuple_SET_ITEM(frame, 2, Py_None);
            PyTuple_SET_ITEM(frame, 3, spare_marker);
            spare_frames[n_spare++] = frame;
            Py_DECREF(node); /* may free objects: the spare is consistent already */
            Py_DECREF(parent);
            Py_DECREF(owner);
            return;
        }
    }
#endif
    Py_DECREF(frame);
}

/* The child node named like `self` under `pnode` (a new reference), made by pnode.child()
 * when missing (regions/region.py's Region._open). */
static NOINLINE PyObject *child_lookup(RegionObject *self, NodeObject *pnode, uint64_t version);

HOT static inline PyObject *
child_of(RegionObject *self, NodeObject *pnode)
{
    uint64_t version = HAVE_DICT_VERSION ? dict_version(pnode->children) : 0;
    if (version != 0 && version == self->cache_version && self->name == self->cache_name) {
        Py_INCREF(self->cache_child);
        return self->cache_child;
    }
    return child_lookup(self, pnode, version);
}

/* child_of's other case: looked up (and remembered), or made. */
static NOINLINE PyObject *
child_lookup(RegionObject *self, NodeObject *pnode, uint64_t version)
{
    PyObject *node = PyDict_GetItemWithError(pnode->children, self->name);
    if (node != NULL) {
        Py_INCREF(node);
        if (version != 0 && PyUnicode_CheckExact(self->name) &&
            is_node(node)) {
            Py_INCREF(self->name);
            Py_XSETREF(self->cache_name, self->name);
            self->cache_child = node;
            self->cache_version = version;
        }
    }
    else {
        if (PyErr_Occurred()) {
            return NULL;
        }
        PyObject *level = PyLong_FromSsize_t(self->level);
        node = level ? PyObject_CallMethodObjArgs((PyObject *)pnode, str_child, self->name,
                                                  level, str_cpu, NULL)
                     : NULL;
        Py_XDECREF(level);
        if (node == NULL) {
            return NULL;
        }
    }
    if (!is_node(node)) {
        PyErr_SetString(PyExc_TypeError, "path node is not a NodeBase");
        Py_DECREF(node);
        return NULL;
    }
    return node;
}

/* regions/region.py's Region._open for the host clock (CpuRegion.__enter__): open a frame
 * for `self` in this context. Returns a new reference to the frame (node, t0, parent,
 * self, None) and its start time in *t0, or NULL. */
HOT static PyObject *
open_cpu(RegionObject *self, int64_t *t0)
{
    if (UNLIKELY(region_unset(self, 0) < 0)) {
        return NULL;
    }
    PyObject *held = NULL;
    PyThreadState *ts = PyThreadState_Get(); /* this thread's, for the whole call */
    PyObject *parent = top_read(ts, &held);
    if (UNLIKELY(parent == NULL || !is_frame(parent))) {
        Py_XDECREF(parent);
        Py_XDECREF(held);
        if (!PyErr_Occurred()) {
            malformed_frame();
        }
        return NULL;
    }
    PyObject *node = child_of(self, (NodeObject *)PyTuple_GET_ITEM(parent, 0));
    if (UNLIKELY(node == NULL)) {
        Py_DECREF(parent);
        Py_DECREF(held);
        return NULL;
    }
    if (UNLIKELY(read_now(self->now, t0) < 0)) {
        Py_DECREF(node);
        Py_DECREF(parent);
        Py_DECREF(held);
        return NULL;
    }
    PyObject *frame = frame_make(node, *t0, parent, (PyObject *)self);
    /* Python code may have run since top_read (a new child): top_swap re-checks */
    if (UNLIKELY(frame != NULL && top_swap(ts, held, frame) < 0)) {
        Py_CLEAR(frame);
    }
    Py_DECREF(held);
    return frame;
}

/* CpuRegion.__enter__ */
HOT static PyObject *
Region_cpu_enter(RegionObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t t0;
    PyObject *frame;
    if (enter_arity(nargs) < 0 || check_bound() < 0 || (frame = open_cpu(self, &t0)) == NULL) {
        return NULL;
    }
    Py_DECREF(frame); /* this context's stack holds it */
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *exit_clock_failed(RegionObject *self, PyObject *failing);
static PyObject *exit_not_top(RegionObject *self, PyObject *failing);

/* CpuRegion.__exit__: the innermost frame is ours -> restore its parent and record;
 * otherwise Region._exit_top (Python) closes ours further down. */
HOT static PyObject *
Region_cpu_exit(RegionObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t t1;
    if (UNLIKELY(exit_arity(nargs) < 0 || check_bound() < 0 || region_unset(self, 1) < 0)) {
        return NULL;
    }
    /* failing: the block raised (__exit__'s exc_type is not None) */
    PyObject *failing = (nargs >= 1 && args[0] != Py_None) ? Py_True : Py_False;
    if (UNLIKELY(read_now(self->now, &t1) < 0)) {
        return exit_clock_failed(self, failing);
    }
    PyObject *held;
    PyThreadState *ts = PyThreadState_Get();
    PyObject *frame = top_read(ts, &held);
    if (UNLIKELY(frame == NULL)) {
        return NULL;
    }
    if (UNLIKELY(!is_frame(frame))) {
        Py_DECREF(frame);
        Py_DECREF(held);
        malformed_frame();
        return NULL;
    }
    if (UNLIKELY(PyTuple_GET_ITEM(frame, 3) != (PyObject *)self ||
                 PyTuple_GET_ITEM(frame, 4) != Py_None)) {
        Py_DECREF(frame);
        Py_DECREF(held);
        return exit_not_top(self, failing);
    }
    int rc = top_swap(ts, held, PyTuple_GET_ITEM(frame, 2));
    Py_DECREF(held);
    int64_t t0;
    if (UNLIKELY(rc < 0 || long_read(PyTuple_GET_ITEM(frame, 1), &t0) < 0)) {
        Py_DECREF(frame);
        return NULL;
    }
    node_add((NodeObject *)PyTuple_GET_ITEM(frame, 0), t1 - t0);
    frame_release(frame);
    Py_RETURN_NONE;
}

/* CpuRegion.__exit__ when the clock failed: close the frame, record nothing; the block's
 * own exception, if any, propagates instead of the clock's (Region._drop_innermost). */
COLD static PyObject *
exit_clock_failed(RegionObject *self, PyObject *failing)
{
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    PyObject *r = PyObject_CallMethodNoArgs((PyObject *)self, str_drop_innermost);
    if (r == NULL) {
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(tb);
        return NULL;
    }
    Py_DECREF(r);
    if (failing == Py_True) {
        Py_XDECREF(et);
        Py_XDECREF(ev);
        Py_XDECREF(tb);
        Py_RETURN_NONE;
    }
    PyErr_Restore(et, ev, tb);
    return NULL;
}

/* CpuRegion.__exit__ when our frame is not the innermost: Region._exit_top (Python)
 * closes ours further down. */
COLD static PyObject *
exit_not_top(RegionObject *self, PyObject *failing)
{
    PyObject *r = PyObject_CallMethodOneArg((PyObject *)self, str_exit_top, failing);
    if (r == NULL) {
        return NULL;
    }
    Py_DECREF(r);
    Py_RETURN_NONE;
}

/* SkippedRegion.__enter__ */
static PyObject *
Region_skip_enter(RegionObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (enter_arity(nargs) < 0) {
        return NULL;
    }
    Py_INCREF(self);
    return (PyObject *)self;
}

/* SkippedRegion.__exit__ */
static PyObject *
Region_skip_exit(RegionObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *frame;
    if (exit_arity(nargs) < 0 || check_bound() < 0 || (frame = top_get()) == NULL) {
        return NULL;
    }
    if (!is_frame(frame)) {
        Py_DECREF(frame);
        malformed_frame();
        return NULL;
    }
    int owned = PyTuple_GET_ITEM(frame, 3) == (PyObject *)self;
    Py_DECREF(frame);
    if (owned) { /* entered while enabled, exited after disable(): close it */
        PyObject *failing = (nargs >= 1 && args[0] != Py_None) ? Py_True : Py_False;
        PyObject *r = PyObject_CallMethodOneArg((PyObject *)self, str_exit_top, failing);
        if (r == NULL) {
            return NULL;
        }
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
}

/* -- __enter__ / __exit__ bound once ----------------------------------------------------
 * A `with` statement looks __enter__ and __exit__ up on the region's type and binds both
 * to the region, every time: for a method, two new bound-method objects per `with`.
 * CpuRegion's and SkippedRegion's __enter__/__exit__ are RegionMethod descriptors (the
 * RegionBase attributes _cpu_enter, _cpu_exit, _skip_enter, _skip_exit), whose binding
 * is one object per region and method, a builtin method made on the first lookup and kept
 * by the region: a `with` then binds by taking a reference. Called unbound
 * (CpuRegion.__enter__(region)) a descriptor takes the region as its first argument. */

typedef PyObject *(*region_method)(RegionObject *, PyObject *const *, Py_ssize_t);

static const struct {
    const char *attr; /* the RegionBase attribute */
    const char *name; /* the method it stands for */
    region_method fn;
} region_methods[N_METHODS] = {
    [M_CPU_ENTER] = {"_cpu_enter", "__enter__", Region_cpu_enter},
    [M_CPU_EXIT] = {"_cpu_exit", "__exit__", Region_cpu_exit},
    [M_SKIP_ENTER] = {"_skip_enter", "__enter__", Region_skip_enter},
    [M_SKIP_EXIT] = {"_skip_exit", "__exit__", Region_skip_exit},
};

typedef struct {
    PyObject_HEAD
    int kind;
    vectorcallfunc vectorcall;
} MethodObject;

static PyTypeObject MethodType;

/* What a descriptor binds to: a builtin method of the region (so that CPython's call of
 * __exit__ takes its specialized path for builtins). */
static PyMethodDef bound_defs[N_METHODS] = {
    [M_CPU_ENTER] = {"__enter__", (PyCFunction)(void (*)(void))Region_cpu_enter, METH_FASTCALL,
                     NULL},
    [M_CPU_EXIT] = {"__exit__", (PyCFunction)(void (*)(void))Region_cpu_exit, METH_FASTCALL,
                    NULL},
    [M_SKIP_ENTER] = {"__enter__", (PyCFunction)(void (*)(void))Region_skip_enter,
                      METH_FASTCALL, NULL},
    [M_SKIP_EXIT] = {"__exit__", (PyCFunction)(void (*)(void))Region_skip_exit, METH_FASTCALL,
                     NULL},
};

static int
no_keywords(const char *name, PyObject *kwnames)
{
    if (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0) {
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s() takes no keyword arguments", name);
    return -1;
}

COLD static int
not_a_region(MethodObject *self, PyObject *obj)
{
    PyErr_Format(PyExc_TypeError,
                 "descriptor '%s' for 'instrument._speedups.RegionBase' objects doesn't apply "
                 "to a '%.100s' object",
                 region_methods[self->kind].attr, Py_TYPE(obj)->tp_name);
    return -1;
}

/* descriptor.__get__(region): the region's bound method of this kind, made once */
HOT static PyObject *
Method_get(MethodObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL) {
        Py_INCREF(self);
        return (PyObject *)self;
    }
    PyTypeObject *type_of = Py_TYPE(obj);
    if (type_of != cpu_region_type && type_of != skipped_region_type &&
        !PyObject_TypeCheck(obj, &RegionType)) {
        not_a_region(self, obj);
        return NULL;
    }
    PyObject **slot = &((RegionObject *)obj)->bound[self->kind];
    if (*slot == NULL) {
        PyObject *b = PyCFunction_New(&bound_defs[self->kind], obj);
        if (b == NULL) {
            return NULL;
        }
        if (*slot == NULL) {
            *slot = b;
        }
        else { /* made meanwhile (not without the GIL released, but cheap to handle) */
            Py_DECREF(b);
        }
    }
    Py_INCREF(*slot);
    return *slot;
}

/* descriptor(region, *args): the method called unbound */
static PyObject *
Method_vectorcall(MethodObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (no_keywords(region_methods[self->kind].name, kwnames) < 0) {
        return NULL;
    }
    if (nargs < 1) {
        PyErr_Format(PyExc_TypeError, "unbound %s() needs a region argument",
                     region_methods[self->kind].attr);
        return NULL;
    }
    if (!PyObject_TypeCheck(args[0], &RegionType)) {
        not_a_region(self, args[0]);
        return NULL;
    }
    return region_methods[self->kind].fn((RegionObject *)args[0], args + 1, nargs - 1);
}

static PyObject *
Method_repr(MethodObject *self)
{
    return PyUnicode_FromFormat("<region method '%s' (%s) of 'RegionBase' objects>",
                                region_methods[self->kind].attr, region_methods[self->kind].name);
}

static PyObject *
Method_name(MethodObject *self, void *closure)
{
    return PyUnicode_FromString(region_methods[self->kind].name);
}

static PyGetSetDef Method_getset[] = {
    {"__name__", (getter)Method_name, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject MethodType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._speedups.RegionMethod",
    .tp_doc = "CpuRegion's or SkippedRegion's __enter__ or __exit__: binds once per region.",
    .tp_basicsize = sizeof(MethodObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_dealloc = (destructor)PyObject_Del,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(MethodObject, vectorcall),
    .tp_descr_get = (descrgetfunc)Method_get,
    .tp_repr = (reprfunc)Method_repr,
    .tp_getset = Method_getset,
};

/* Make the types above ready and add the four descriptors to RegionBase (module init). */
static int
add_region_methods(void)
{
    if (PyType_Ready(&MethodType) < 0) {
        return -1;
    }
    if (spare_marker == NULL && (spare_marker = PyList_New(0)) == NULL) {
        return -1;
    }
    for (int kind = 0; kind < N_METHODS; kind++) {
        MethodObject *m = PyObject_New(MethodObject, &MethodType);
        if (m == NULL) {
            return -1;
        }
        m->kind = kind;
        m->vectorcall = (vectorcallfunc)Method_vectorcall;
        int rc = PyDict_SetItemString(RegionType.tp_dict, region_methods[kind].attr,
                                      (PyObject *)m);
        Py_DECREF(m);
        if (rc < 0) {
            return -1;
        }
    }
    PyType_Modified(&RegionType);
    return 0;
}


static const FieldSpec region_fields[] = {
    {"region", "name", offsetof(RegionObject, name), F_STR},
    {"region", "clock", offsetof(RegionObject, clock), F_ANY},
    {"region", "_now", offsetof(RegionObject, now), F_CALLABLE},
    {"region", "level", offsetof(RegionObject, level), F_LEVEL},
};

static PyGetSetDef Region_getset[] = {
    FIELD_GETSET(region_fields[0]), FIELD_GETSET(region_fields[1]),
    FIELD_GETSET(region_fields[2]), LEVEL_GETSET(region_fields[3]),
    {NULL, NULL, NULL, NULL, NULL},
};

static int
Region_traverse(RegionObject *self, visitproc visit, void *arg)
{ /* not the type: see Node_traverse */
    Py_VISIT(self->name);
    Py_VISIT(self->clock);
    Py_VISIT(self->now);
    for (int kind = 0; kind < N_METHODS; kind++) {
        Py_VISIT(self->bound[kind]);
    }
    return 0;
}

static int
Region_clear(RegionObject *self)
{
    Py_CLEAR(self->name);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->now);
    for (int kind = 0; kind < N_METHODS; kind++) {
        Py_CLEAR(self->bound[kind]);
    }
    self->cache_version = 0;
    Py_CLEAR(self->cache_name);
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
    .tp_getset = Region_getset,
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

/* A timed call returned a coroutine (a plain callable around an `async def`): the region
 * times the coroutine until it ends (timed_coroutine(region, coroutine), returned in its
 * place), not the call that made it, which is not recorded. Restores the parent frame.
 * Takes over the references to `frame` and `result`. */
static NOINLINE PyObject *
finish_coroutine_call(RegionObject *region, PyObject *frame, PyObject *result)
{
    if (top_set(PyTuple_GET_ITEM(frame, 2)) < 0) {
        PyErr_Clear(); /* instrumentation must not replace the call's outcome */
    }
    frame_release(frame);
    if (timed_coroutine == NULL) {
        return result;
    }
    PyObject *timed = PyObject_CallFunctionObjArgs(timed_coroutine, (PyObject *)region, result,
                                                   NULL);
    Py_DECREF(result);
    return timed;
}

/* The end of one timed host-clock call (decorators.py's wrapper, the `finally` of
 * frames._close): read the clock, restore the parent frame, record; return the call's
 * outcome unchanged -- or the clock's error when the call succeeded but the clock failed,
 * as for a `with` block; a coroutine goes to finish_coroutine_call. Takes over the
 * references to `frame` (open_cpu's) and `result`. */
static NOINLINE PyObject *
finish_timed_call_general(RegionObject *region, PyObject *frame, int64_t t0, PyObject *result)
{
    if (result != NULL && PyCoro_CheckExact(result)) {
        return finish_coroutine_call(region, frame, result);
    }
    PyObject *parent = PyTuple_GET_ITEM(frame, 2);
    NodeObject *node = (NodeObject *)PyTuple_GET_ITEM(frame, 0);
    int64_t t1;
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb); /* keep the call's exception untouched */
    int clock_ok = read_now(region->now, &t1) == 0;
    PyObject *ct = NULL, *cv = NULL, *ctb = NULL;
    if (!clock_ok) {
        PyErr_Fetch(&ct, &cv, &ctb); /* the clock's error */
    }
    int restored = top_set(parent) == 0;
    if (clock_ok) {
        node_add(node, t1 - t0);
    }
    if (!restored) {
        PyErr_Clear(); /* instrumentation must not replace the call's outcome */
    }
    frame_release(frame);
    if (!clock_ok && result != NULL) {
        Py_DECREF(result);
        PyErr_Restore(ct, cv, ctb);
        return NULL;
    }
    Py_XDECREF(ct);
    Py_XDECREF(cv);
    Py_XDECREF(ctb);
    PyErr_Restore(et, ev, tb);
    return result;
}

/* finish_timed_call_general's common case inline: the call returned (so no exception is
 * set) something other than a coroutine, and the clock is perf_counter_ns (it cannot
 * fail). */
HOT static inline PyObject *
finish_timed_call(RegionObject *region, PyObject *frame, int64_t t0, PyObject *result)
{
    if (UNLIKELY(result == NULL || region->now != perf_counter_ns || PyCoro_CheckExact(result))) {
        return finish_timed_call_general(region, frame, t0, result);
    }
    int64_t t1;
    read_now(perf_counter_ns, &t1);
    if (UNLIKELY(top_set(PyTuple_GET_ITEM(frame, 2)) < 0)) {
        PyErr_Clear(); /* instrumentation must not replace the call's outcome */
    }
    node_add((NodeObject *)PyTuple_GET_ITEM(frame, 0), t1 - t0);
    frame_release(frame);
    return result;
}

/* One timed call of wrapped(*cargs, **ckw): cargs a tuple, ckw a dict. */
static PyObject *
call_timed(PyObject *region, PyObject *wrapped, PyObject *cargs, PyObject *ckw)
{
    PyTypeObject *type = Py_TYPE(region);
    if (type != cpu_region_type) {
        if (type == skipped_region_type) {
            return PyObject_Call(wrapped, cargs, ckw);
        }
        return PyObject_CallMethodObjArgs(region, str_call, wrapped, cargs, ckw, NULL);
    }
    PyObject *frame;
    int64_t t0;
    if (check_bound() < 0 || (frame = open_cpu((RegionObject *)region, &t0)) == NULL) {
        return NULL;
    }
    PyObject *result = PyObject_Call(wrapped, cargs, ckw);
    return finish_timed_call((RegionObject *)region, frame, t0, result);
}

/* args/kwargs that are not a tuple/dict (wrapt always passes those): converted as
 * wrapped(*args, **kwargs) in the pure-Python wrapper converts them, or a TypeError as
 * that call raises it. */
static PyObject *
call_timed_converted(PyObject *region, PyObject *wrapped, PyObject *cargs, PyObject *ckw)
{
    PyObject *dkw = PyDict_New(); /* **kwargs first, as CPython evaluates f(*args, **kwargs) */
    if (dkw == NULL || PyDict_Update(dkw, ckw) < 0) {
        if (dkw != NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
            PyErr_Format(PyExc_TypeError, "CallTimer: kwargs must be a mapping, not %.200s",
                         Py_TYPE(ckw)->tp_name);
        }
        Py_XDECREF(dkw);
        return NULL;
    }
    PyObject *targs = PySequence_Tuple(cargs);
    if (targs == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Format(PyExc_TypeError, "CallTimer: args must be an iterable, not %.200s",
                         Py_TYPE(cargs)->tp_name);
        }
        Py_DECREF(dkw);
        return NULL;
    }
    PyObject *result = call_timed(region, wrapped, targs, dkw);
    Py_DECREF(targs);
    Py_DECREF(dkw);
    return result;
}

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
    if (self->region == NULL) { /* cleared by the garbage collector */
        PyErr_SetString(PyExc_RuntimeError, "CallTimer used after it was cleared");
        return NULL;
    }
    if (!PyTuple_Check(cargs) || !PyDict_Check(ckw)) {
        return call_timed_converted(self->region, wrapped, cargs, ckw);
    }
    return call_timed(self->region, wrapped, cargs, ckw);
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
    if (self->region == NULL) { /* cleared by the garbage collector */
        PyErr_SetString(PyExc_RuntimeError, "Active used after it was cleared");
        return -1;
    }
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
    /* the name last answered (strong) and its region (borrowed: by_name[last_name] while
     * by_name's version tag is last_version, as for RegionObject's child cache) */
    PyObject *last_name;
    PyObject *last_found;
    uint64_t last_version; /* 0: nothing remembered */
} DispatchObject;

HOT static PyObject *
Dispatch_vectorcall(DispatchObject *self, PyObject *const *args, size_t nargsf,
                    PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (self->slow == NULL) { /* cleared by the garbage collector */
        PyErr_SetString(PyExc_RuntimeError, "Dispatch used after it was cleared");
        return NULL;
    }
    if (nargs == 1 && (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0) &&
        PyUnicode_CheckExact(args[0])) {
        uint64_t version = HAVE_DICT_VERSION ? dict_version(self->by_name) : 0;
        if (args[0] == self->last_name && version == self->last_version && version != 0) {
            Py_INCREF(self->last_found);
            return self->last_found;
        }
        PyObject *found = PyDict_GetItemWithError(self->by_name, args[0]);
        if (found != NULL) {
            Py_INCREF(found);
            if (version != 0) {
                Py_INCREF(args[0]);
                Py_XSETREF(self->last_name, args[0]);
                self->last_found = found;
                self->last_version = version;
            }
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
    self->last_version = 0;
    Py_CLEAR(self->last_name);
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

/* -- the reporter's steps (instrument/stepcounter.py is the definition) ----------------
 * A call ends one step: the time since the last goes into `times`; a warm-up step drops
 * the open step's counts, any other adds its time and (on_counts()) its counts; at every
 * multiple of `every` steps of the run it returns on_due(). The clock is _state.now and the
 * stepping thread registry.stepping_thread, read from those modules' dicts (bind_steps). */

static PyObject *steps_state = NULL;    /* instrument._state.__dict__ */
static PyObject *steps_registry = NULL; /* instrument.registry.__dict__ */
static PyObject *str_now, *str_stepping_thread;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int64_t every; /* 0: None */
    int64_t warmup;
    int64_t run_steps, steps, warm_steps, counted_ns, last_tick;
    PyObject *times; /* a NodeBase made by __init__ */
    PyObject *pending;
    PyObject *on_counts, *on_due;
} StepCounterObject;

static int
steps_unbound(void)
{
    if (steps_state == NULL || steps_registry == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "instrument: StepCounter used before bind_steps(_state, registry)");
        return 1;
    }
    return 0;
}

HOT static int
steps_now(int64_t *out)
{
    PyObject *now = PyDict_GetItemWithError(steps_state, str_now);
    if (now == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_RuntimeError, "instrument: _state.now is missing");
        }
        return -1;
    }
    Py_INCREF(now); /* the clock may be Python code that replaces it */
    int r = read_now(now, out);
    Py_DECREF(now);
    return r;
}

/* registry.stepping_thread = this thread's ident, unless it already is */
static int
steps_mark_thread(void)
{
    unsigned long ident = PyThread_get_thread_ident();
    PyObject *current = PyDict_GetItemWithError(steps_registry, str_stepping_thread);
    if (current == NULL && PyErr_Occurred()) {
        return -1;
    }
    if (current != NULL && PyLong_CheckExact(current)) {
        unsigned long value = PyLong_AsUnsignedLong(current);
        if (value == (unsigned long)-1 && PyErr_Occurred()) {
            PyErr_Clear(); /* negative or too large: not this thread */
        }
        else if (value == ident) {
            return 0;
        }
    }
    PyObject *id = PyLong_FromUnsignedLong(ident);
    if (id == NULL) {
        return -1;
    }
    int r = PyDict_SetItem(steps_registry, str_stepping_thread, id);
    Py_DECREF(id);
    return r;
}

static int
StepCounter_cleared(StepCounterObject *self)
{
    if (self->times == NULL || self->on_counts == NULL || self->on_due == NULL ||
        self->pending == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "instrument: StepCounter used before __init__ or after it was cleared");
        return 1;
    }
    return 0;
}

HOT static PyObject *
StepCounter_vectorcall(StepCounterObject *self, PyObject *const *args, size_t nargsf,
                       PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) != 0 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "StepCounter() takes no arguments");
        return NULL;
    }
    if (steps_unbound() || StepCounter_cleared(self)) {
        return NULL;
    }
    int64_t now;
    if (steps_now(&now) < 0 || steps_mark_thread() < 0) {
        return NULL;
    }
    int64_t spent = now - self->last_tick;
    self->last_tick = now;
    node_add((NodeObject *)self->times, spent);
    if (self->run_steps + self->steps < self->warmup) {
        self->warm_steps++;
        Py_INCREF(Py_None);
        Py_SETREF(self->pending, Py_None);
    }
    else {
        self->counted_ns += spent;
        if (self->pending != Py_None) {
            PyObject *r = PyObject_CallNoArgs(self->on_counts);
            if (r == NULL) {
                return NULL;
            }
            Py_DECREF(r);
        }
    }
    self->steps++;
    if (self->every > 0 && (self->run_steps + self->steps) % self->every == 0) {
        PyObject *on_due = self->on_due; /* on_due() may run __init__ again */
        Py_INCREF(on_due);
        PyObject *r = PyObject_CallNoArgs(on_due);
        Py_DECREF(on_due);
        return r;
    }
    Py_RETURN_NONE;
}

/* every: None or an int > 0 (stored as 0 for None); warmup: an int >= 0 */
HOT static int
steps_read_count(PyObject *value, int every, int64_t *out)
{
    const char *name = every ? "every" : "warmup";
    if (every && value == Py_None) {
        *out = 0;
        return 0;
    }
    long long v = -1;
    if (PyLong_Check(value) && !PyBool_Check(value)) {
        int overflow;
        v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (v == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (overflow > 0) {
            PyErr_Format(PyExc_OverflowError, "%s must be at most 2**63 - 1, got %R", name,
                         value);
            return -1;
        }
        if (overflow < 0) {
            v = -1;
        }
    }
    if (every ? v <= 0 : v < 0) {
        if (every) {
            PyErr_Format(PyExc_ValueError,
                         "every must be a positive int (steps between flushes) or None, got %R",
                         value);
        }
        else {
            PyErr_Format(PyExc_ValueError, "warmup must be an int >= 0, got %R", value);
        }
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

static int
StepCounter_init(StepCounterObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"every", "warmup", "on_counts", "on_due", NULL};
    PyObject *every, *warmup, *on_counts, *on_due;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO:StepCounter", kwlist, &every, &warmup,
                                     &on_counts, &on_due)) {
        return -1;
    }
    if (!PyCallable_Check(on_counts) || !PyCallable_Check(on_due)) {
        PyErr_SetString(PyExc_TypeError,
                        "StepCounter(every, warmup, on_counts, on_due) needs two callables");
        return -1;
    }
    int64_t every_n, warmup_n, now;
    if (steps_read_count(every, 1, &every_n) < 0 || steps_read_count(warmup, 0, &warmup_n) < 0 ||
        steps_unbound() ||
        steps_now(&now) < 0) {
        return -1;
    }
    PyObject *times = PyObject_CallNoArgs((PyObject *)&NodeType);
    if (times == NULL) {
        return -1;
    }
    self->every = every_n;
    self->warmup = warmup_n;
    self->run_steps = self->steps = self->warm_steps = self->counted_ns = 0;
    self->last_tick = now;
    Py_XSETREF(self->times, times);
    Py_INCREF(Py_None);
    Py_XSETREF(self->pending, Py_None);
    Py_INCREF(on_counts);
    Py_XSETREF(self->on_counts, on_counts);
    Py_INCREF(on_due);
    Py_XSETREF(self->on_due, on_due);
    return 0;
}

static PyObject *
StepCounter_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    StepCounterObject *self = (StepCounterObject *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->vectorcall = (vectorcallfunc)StepCounter_vectorcall;
    }
    return (PyObject *)self;
}

static PyObject *
StepCounter_end_interval(StepCounterObject *self, PyObject *Py_UNUSED(ignored))
{
    int64_t steps = self->steps;
    self->run_steps += steps;
    self->steps = self->warm_steps = self->counted_ns = 0;
    return PyLong_FromLongLong(steps);
}

static PyObject *
StepCounter_get_every(StepCounterObject *self, void *closure)
{
    if (self->every == 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLongLong(self->every);
}

static int
StepCounter_set_count(StepCounterObject *self, PyObject *value, void *closure)
{
    int every = closure != NULL;
    if (value == NULL) {
        PyErr_Format(PyExc_AttributeError, "instrument: StepCounter.%s cannot be deleted",
                     every ? "every" : "warmup");
        return -1;
    }
    return steps_read_count(value, every, every ? &self->every : &self->warmup);
}

static PyObject *
StepCounter_get_warmup(StepCounterObject *self, void *closure)
{
    return PyLong_FromLongLong(self->warmup);
}

static PyObject *
StepCounter_get_int(StepCounterObject *self, void *closure)
{
    return PyLong_FromLongLong(*(int64_t *)((char *)self + (Py_ssize_t)closure));
}

static PyObject *
StepCounter_get_times(StepCounterObject *self, void *closure)
{
    if (StepCounter_cleared(self)) {
        return NULL;
    }
    Py_INCREF(self->times);
    return self->times;
}

static PyObject *
StepCounter_get_pending(StepCounterObject *self, void *closure)
{
    PyObject *p = self->pending != NULL ? self->pending : Py_None;
    Py_INCREF(p);
    return p;
}

static int
StepCounter_set_pending(StepCounterObject *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "instrument: StepCounter.pending cannot be deleted");
        return -1;
    }
    Py_INCREF(value);
    Py_XSETREF(self->pending, value);
    return 0;
}

#define STEPS_FIELD(name) (void *)offsetof(StepCounterObject, name)

static PyGetSetDef StepCounter_getset[] = {
    {"every", (getter)StepCounter_get_every, (setter)StepCounter_set_count,
     "Steps between reports (None: only on demand).", "every"},
    {"warmup", (getter)StepCounter_get_warmup, (setter)StepCounter_set_count,
     "Steps at the start of the run counted as warm-up.", NULL},
    {"steps", (getter)StepCounter_get_int, NULL, "Steps ended in this interval.",
     STEPS_FIELD(steps)},
    {"warm_steps", (getter)StepCounter_get_int, NULL, "Of those, the warm-up ones.",
     STEPS_FIELD(warm_steps)},
    {"counted_ns", (getter)StepCounter_get_int, NULL, "The time of the others.",
     STEPS_FIELD(counted_ns)},
    {"run_steps", (getter)StepCounter_get_int, NULL, "Steps of the earlier intervals.",
     STEPS_FIELD(run_steps)},
    {"times", (getter)StepCounter_get_times, NULL,
     "This interval's step times (its take() resets them).", NULL},
    {"pending", (getter)StepCounter_get_pending, (setter)StepCounter_set_pending,
     "The open step's counts (the reporter's; None when there are none).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef StepCounter_methods[] = {
    {"end_interval", (PyCFunction)StepCounter_end_interval, METH_NOARGS,
     "Start the next interval: the ended one's steps join the run's; returns them."},
    {NULL, NULL, 0, NULL},
};

static int
StepCounter_traverse(StepCounterObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->times);
    Py_VISIT(self->pending);
    Py_VISIT(self->on_counts);
    Py_VISIT(self->on_due);
    return 0;
}

static int
StepCounter_clear(StepCounterObject *self)
{
    Py_CLEAR(self->times);
    Py_CLEAR(self->pending);
    Py_CLEAR(self->on_counts);
    Py_CLEAR(self->on_due);
    return 0;
}

static void
StepCounter_dealloc(StepCounterObject *self)
{
    PyObject_GC_UnTrack(self);
    StepCounter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject StepCounterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._speedups.StepCounter",
    .tp_doc = "StepCounter(every, warmup, on_counts, on_due): a reporter's steps "
              "(instrument/stepcounter.py); call it to end one.",
    .tp_basicsize = sizeof(StepCounterObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = StepCounter_new,
    .tp_init = (initproc)StepCounter_init,
    .tp_dealloc = (destructor)StepCounter_dealloc,
    .tp_traverse = (traverseproc)StepCounter_traverse,
    .tp_clear = (inquiry)StepCounter_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(StepCounterObject, vectorcall),
    .tp_getset = StepCounter_getset,
    .tp_methods = StepCounter_methods,
};

/* -- auto's per-step hooks in C (BackwardCall, StepGuard): their shared layout ----------
 * Each keeps six references, set once by its constructor, then a __dict__ (for
 * functools.update_wrapper), right after its vectorcall slot: HookObject is that layout,
 * and one maker, traverse, clear and dealloc serve both (their structs name the six). */

#define HOOK_REFS 6

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *refs[HOOK_REFS + 1]; /* the six, then __dict__ */
} HookObject;

/* A new hook of `type` holding `values` (new references taken), called by `call`. */
static PyObject *
hook_make(PyTypeObject *type, PyObject *const values[HOOK_REFS], vectorcallfunc call)
{
    HookObject *self = (HookObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = call;
    for (int i = 0; i < HOOK_REFS; i++) {
        Py_INCREF(values[i]);
        self->refs[i] = values[i];
    }
    return (PyObject *)self;
}

/* 1 (with a RuntimeError naming the hook) if the collector has cleared it */
HOT static int
hook_cleared(PyObject *self, const char *name)
{
    for (int i = 0; i < HOOK_REFS; i++) {
        if (((HookObject *)self)->refs[i] == NULL) {
            PyErr_Format(PyExc_RuntimeError, "%s used after it was cleared", name);
            return 1;
        }
    }
    return 0;
}

static int
hook_traverse(PyObject *self, visitproc visit, void *arg)
{
    for (int i = 0; i <= HOOK_REFS; i++) {
        Py_VISIT(((HookObject *)self)->refs[i]);
    }
    return 0;
}

static int
hook_clear(PyObject *self)
{
    for (int i = 0; i <= HOOK_REFS; i++) {
        Py_CLEAR(((HookObject *)self)->refs[i]);
    }
    return 0;
}

static void
hook_dealloc(PyObject *self)
{
    PyObject_GC_UnTrack(self);
    hook_clear(self);
    Py_TYPE(self)->tp_free(self);
}

static PyGetSetDef hook_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* the six references of a hook's struct, then its dict, laid out as HookObject's */
#define HOOK_LAYOUT(T, first, dict)                                                        \
    _Static_assert(offsetof(T, first) == offsetof(HookObject, refs) &&                     \
                       offsetof(T, dict) == offsetof(HookObject, refs) +                   \
                                                HOOK_REFS * sizeof(PyObject *) &&          \
                       sizeof(T) == sizeof(HookObject),                                    \
                   #T " is not laid out as HookObject")

/* -- backward(): the common case of hooks/backward.py's wrapper ------------------------
 * BackwardCall(python, region, original, compiling, graph_task, namespace). A call made
 * with no compiled code around it (compiling() is None), the region on the host clock, not
 * inside the region already and not inside autograd's engine (graph_task() == -1) sets
 * namespace["_parent"] to the innermost frame's node and times original(*args, **kwargs)
 * in the region: what the Python wrapper `python` does then. Every other call is
 * python(*args, **kwargs) itself. */

static PyObject *timed_region_vectorcall(RegionObject *region, PyObject *wrapped,
                                         PyObject *const *args, size_t nargsf,
                                         PyObject *kwnames);
static PyObject *str_parent;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *python, *region, *original, *compiling, *graph_task, *namespace;
    PyObject *dict;
} BackwardCallObject;

HOOK_LAYOUT(BackwardCallObject, python, dict);

/* 1: the common case, with `*top` the innermost frame (a new reference); 0: python's
 * (or original's, `*top` NULL and `*inside` set); -1: an error */
HOT static int
backward_common(BackwardCallObject *self, PyObject **top, int *inside)
{
    *top = NULL;
    *inside = 0;
    PyObject *r = PyObject_CallNoArgs(self->compiling);
    if (r == NULL) {
        return -1;
    }
    int compiled = r != Py_None;
    Py_DECREF(r);
    if (compiled || Py_TYPE(self->region) != cpu_region_type || frame_var == NULL) {
        return 0;
    }
    PyObject *frame = top_get();
    if (frame == NULL) {
        return -1;
    }
    if (!is_frame(frame)) {
        Py_DECREF(frame); /* python's call reports it */
        return 0;
    }
    if (PyTuple_GET_ITEM(frame, 3) == self->region) {
        Py_DECREF(frame);
        *inside = 1;
        return 0;
    }
    PyObject *task = PyObject_CallNoArgs(self->graph_task);
    long long id = task == NULL ? -1 : PyLong_AsLongLong(task);
    Py_XDECREF(task);
    if (task == NULL || (id == -1 && PyErr_Occurred())) {
        Py_DECREF(frame);
        return -1;
    }
    if (id != -1) {
        Py_DECREF(frame);
        *inside = 1;
        return 0;
    }
    *top = frame;
    return 1;
}

HOT static PyObject *
BackwardCall_vectorcall(BackwardCallObject *self, PyObject *const *args, size_t nargsf,
                        PyObject *kwnames)
{
    if (hook_cleared((PyObject *)self, "BackwardCall")) {
        return NULL;
    }
    PyObject *top;
    int inside;
    int common = backward_common(self, &top, &inside);
    if (common < 0) {
        return NULL;
    }
    /* held across the call: it may run any Python code */
    PyObject *region = self->region, *original = self->original, *python = self->python;
    if (!common) {
        PyObject *callee = inside ? original : python;
        Py_INCREF(callee);
        PyObject *result = PyObject_Vectorcall(callee, args, nargsf, kwnames);
        Py_DECREF(callee);
        return result;
    }
    int failed = PyDict_SetItem(self->namespace, str_parent, PyTuple_GET_ITEM(top, 0)) < 0;
    Py_DECREF(top);
    if (failed) {
        return NULL;
    }
    Py_INCREF(region);
    Py_INCREF(original);
    PyObject *result =
        timed_region_vectorcall((RegionObject *)region, original, args, nargsf, kwnames);
    Py_DECREF(original);
    Py_DECREF(region);
    return result;
}

static PyObject *
BackwardCall_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *python, *region, *original, *compiling, *graph_task, *namespace;
    if ((kwds != NULL && PyDict_GET_SIZE(kwds)) ||
        !PyArg_ParseTuple(args, "OOOOOO!:BackwardCall", &python, &region, &original, &compiling,
                          &graph_task, &PyDict_Type, &namespace)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "BackwardCall() takes no keyword arguments");
        }
        return NULL;
    }
    if (!PyCallable_Check(python) || !PyCallable_Check(original) ||
        !PyCallable_Check(compiling) || !PyCallable_Check(graph_task) ||
        !PyObject_TypeCheck(region, &RegionType)) {
        PyErr_SetString(PyExc_TypeError,
                        "BackwardCall(python, region, original, compiling, graph_task, "
                        "namespace) needs four callables, a region and a dict");
        return NULL;
    }
    PyObject *const values[HOOK_REFS] = {python,     region,     original,
                                         compiling, graph_task, namespace};
    return hook_make(type, values, (vectorcallfunc)BackwardCall_vectorcall);
}

static PyTypeObject BackwardCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._speedups.BackwardCall",
    .tp_doc = "BackwardCall(python, region, original, compiling, graph_task, namespace): "
              "hooks/backward.py's wrapper python, its common case in C.",
    .tp_basicsize = sizeof(BackwardCallObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = BackwardCall_new,
    .tp_dealloc = hook_dealloc,
    .tp_traverse = hook_traverse,
    .tp_clear = hook_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(BackwardCallObject, vectorcall),
    .tp_dictoffset = offsetof(BackwardCallObject, dict),
    .tp_getset = hook_getset,
};

/* -- optimizer.step(): the common case of hooks/optim.py's guard ------------------------
 * StepGuard(python, region, call, hooks, own, compiling), bound to the optimizer (it is a
 * descriptor, as a function is). A step with no arguments, no compiled code around it
 * (compiling() is None), the region on the host clock and not open on top, neither the
 * guard (call.running) nor GradScaler.step (hooks._scaled) running already: call.running
 * and call.guarded set while own() -- or type(optimizer).step(optimizer) when own is None --
 * runs timed in the region, then, for the ticking optimizer (hooks._ticker),
 * hooks.on_step() (hooks._tick_outside() if compiled code runs around it by then): what
 * `python` does then. Every other call is python(optimizer, *args, **kwargs). */

static PyObject *str_running, *str_guarded, *str_scaled, *str_ticker, *str_on_step,
    *str_tick_outside, *str_step;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *python, *region, *call, *hooks, *own, *compiling;
    PyObject *dict;
} StepGuardObject;

HOOK_LAYOUT(StepGuardObject, python, dict);

/* 1 if obj.name is true, 0 if false, -1 on an error */
HOT static int
attr_true(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) {
        return -1;
    }
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

static int
compiled_around(PyObject *compiling)
{
    PyObject *r = PyObject_CallNoArgs(compiling);
    if (r == NULL) {
        return -1;
    }
    int compiled = r != Py_None;
    Py_DECREF(r);
    return compiled;
}

/* -- one optimizer's step() call, as its guard sees it (hooks/optim.py's _PyCall) ---------
 * running, guarded, entered (bools) and nested (an int): read and set in place by StepGuard
 * and StandAside, and as attributes by the Python hooks. */

typedef struct {
    PyObject_HEAD
    char running, guarded, entered;
    Py_ssize_t nested;
} StepCallObject;

static PyTypeObject StepCallType;

static PyMemberDef StepCall_members[] = {
    {"running", T_BOOL, offsetof(StepCallObject, running), 0, "The guard's step is running."},
    {"guarded", T_BOOL, offsetof(StepCallObject, guarded), 0,
     "The guard times this step itself (the step hooks stand aside)."},
    {"entered", T_BOOL, offsetof(StepCallObject, entered), 0,
     "The pre hook opened the region in this call."},
    {"nested", T_PYSSIZET, offsetof(StepCallObject, nested), 0,
     "Nested runs of the hooks open (a subclass's super().step())."},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *
StepCall_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "StepCall() takes no arguments");
        return NULL;
    }
    return type->tp_alloc(type, 0);
}

static PyTypeObject StepCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._speedups.StepCall",
    .tp_doc = "StepCall(): one optimizer's step() call as its guard sees it.",
    .tp_basicsize = sizeof(StepCallObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = StepCall_new,
    .tp_members = StepCall_members,
};

/* call.<flag> (str_running or str_guarded): 1, 0, or -1 on an error */
HOT static int
call_flag(PyObject *call, PyObject *name)
{
    if (Py_IS_TYPE(call, &StepCallType)) {
        StepCallObject *c = (StepCallObject *)call;
        return name == str_running ? c->running : c->guarded;
    }
    return attr_true(call, name);
}

/* 1: the common case; 0: python's; -1: an error */
HOT static int
guard_common(StepGuardObject *self, Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames)) ||
        Py_TYPE(self->region) != cpu_region_type || frame_var == NULL) {
        return 0;
    }
    int r = compiled_around(self->compiling);
    if (r != 0) {
        return r < 0 ? -1 : 0;
    }
    if ((r = call_flag(self->call, str_running)) != 0 ||
        (r = attr_true(self->hooks, str_scaled)) != 0) {
        return r < 0 ? -1 : 0;
    }
    PyObject *top = top_get();
    if (top == NULL) {
        return -1;
    }
    r = is_frame(top) && PyTuple_GET_ITEM(top, 3) != self->region;
    Py_DECREF(top);
    return r;
}

HOT static int
guard_flags(PyObject *call, PyObject *value)
{
    if (Py_IS_TYPE(call, &StepCallType)) {
        ((StepCallObject *)call)->running = ((StepCallObject *)call)->guarded = value == Py_True;
        return 0;
    }
    return PyObject_SetAttr(call, str_running, value) < 0 ||
                   PyObject_SetAttr(call, str_guarded, value) < 0
               ? -1
               : 0;
}

/* the ticking optimizer's step ended: hooks.on_step(), or hooks._tick_outside() */
HOT static int
guard_tick(StepGuardObject *self, PyObject *optimizer)
{
    PyObject *ticker = PyObject_GetAttr(self->hooks, str_ticker);
    if (ticker == NULL) {
        return -1;
    }
    int ticking = ticker == optimizer;
    Py_DECREF(ticker);
    if (!ticking) {
        return 0;
    }
    int compiled = compiled_around(self->compiling);
    if (compiled < 0) {
        return -1;
    }
    PyObject *tick = PyObject_GetAttr(self->hooks, compiled ? str_tick_outside : str_on_step);
    if (tick == NULL) {
        return -1;
    }
    PyObject *r = PyObject_CallNoArgs(tick);
    Py_DECREF(tick);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

HOT static PyObject *
guard_run(StepGuardObject *self, PyObject *optimizer)
{
    if (guard_flags(self->call, Py_True) < 0) {
        return NULL;
    }
    PyObject *result;
    if (self->own != Py_None) {
        result = timed_region_vectorcall((RegionObject *)self->region, self->own, NULL, 0, NULL);
    }
    else {
        PyObject *step = PyObject_GetAttr((PyObject *)Py_TYPE(optimizer), str_step);
        result = step == NULL ? NULL
                              : timed_region_vectorcall((RegionObject *)self->region, step,
                                                        &optimizer, 1, NULL);
        Py_XDECREF(step);
    }
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb); /* the step's exception, kept while the flags go down */
    if (guard_flags(self->call, Py_False) < 0) {
        if (result != NULL) {
            Py_DECREF(result);
            Py_XDECREF(et);
            Py_XDECREF(ev);
            Py_XDECREF(tb);
            return NULL;
        }
        PyErr_Clear();
    }
    PyErr_Restore(et, ev, tb);
    if (result != NULL && guard_tick(self, optimizer) < 0) {
        Py_CLEAR(result);
    }
    return result;
}

HOT static PyObject *
StepGuard_vectorcall(StepGuardObject *self, PyObject *const *args, size_t nargsf,
                     PyObject *kwnames)
{
    if (hook_cleared((PyObject *)self, "StepGuard")) {
        return NULL;
    }
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    /* held across the call: the step may run any Python code */
    StepGuardObject *held = self;
    Py_INCREF(held);
    PyObject *result;
    int common = guard_common(self, nargs, kwnames);
    if (common < 0) {
        result = NULL;
    }
    else if (common) {
        PyObject *optimizer = args[0];
        Py_INCREF(optimizer);
        result = guard_run(self, optimizer);
        Py_DECREF(optimizer);
    }
    else {
        result = PyObject_Vectorcall(self->python, args, nargsf, kwnames);
    }
    Py_DECREF(held);
    return result;
}

static PyObject *
StepGuard_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static PyObject *
StepGuard_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *python, *region, *call, *hooks, *own, *compiling;
    if ((kwds != NULL && PyDict_GET_SIZE(kwds)) ||
        !PyArg_ParseTuple(args, "OOOOOO:StepGuard", &python, &region, &call, &hooks, &own,
                          &compiling)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "StepGuard() takes no keyword arguments");
        }
        return NULL;
    }
    if (!PyCallable_Check(python) || !PyCallable_Check(compiling) ||
        !(own == Py_None || PyCallable_Check(own)) || !PyObject_TypeCheck(region, &RegionType)) {
        PyErr_SetString(PyExc_TypeError,
                        "StepGuard(python, region, call, hooks, own, compiling) needs a callable, "
                        "a region, two objects, a callable or None, and a callable");
        return NULL;
    }
    PyObject *const values[HOOK_REFS] = {python, region, call, hooks, own, compiling};
    return hook_make(type, values, (vectorcallfunc)StepGuard_vectorcall);
}

static PyTypeObject StepGuardType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._speedups.StepGuard",
    .tp_doc = "StepGuard(python, region, call, hooks, own, compiling): hooks/optim.py's "
              "guard python, its common case in C; binds like a function.",
    .tp_basicsize = sizeof(StepGuardObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = StepGuard_new,
    .tp_dealloc = hook_dealloc,
    .tp_traverse = hook_traverse,
    .tp_clear = hook_clear,
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = StepGuard_get,
    .tp_vectorcall_offset = offsetof(StepGuardObject, vectorcall),
    .tp_dictoffset = offsetof(StepGuardObject, dict),
    .tp_getset = hook_getset,
};

/* -- the optimizer's step hooks while the guard runs ------------------------------------
 * StandAside(call, hook): None while call.guarded (the StepGuard times this step), else
 * hook(*args, **kwargs) -- the first line of hooks/optim.py's step hooks, which then do
 * nothing; torch calls them around every step. */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *call, *hook;
} StandAsideObject;

HOT static PyObject *
StandAside_vectorcall(StandAsideObject *self, PyObject *const *args, size_t nargsf,
                      PyObject *kwnames)
{
    if (self->call == NULL || self->hook == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "StandAside used after it was cleared");
        return NULL;
    }
    int guarded = call_flag(self->call, str_guarded);
    if (guarded < 0) {
        return NULL;
    }
    if (guarded) {
        Py_RETURN_NONE;
    }
    PyObject *hook = self->hook;
    Py_INCREF(hook);
    PyObject *result = PyObject_Vectorcall(hook, args, nargsf, kwnames);
    Py_DECREF(hook);
    return result;
}

static PyObject *
StandAside_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *call, *hook;
    if ((kwds != NULL && PyDict_GET_SIZE(kwds)) ||
        !PyArg_ParseTuple(args, "OO:StandAside", &call, &hook)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "StandAside() takes no keyword arguments");
        }
        return NULL;
    }
    if (!PyCallable_Check(hook)) {
        PyErr_SetString(PyExc_TypeError, "StandAside(call, hook) needs a callable hook");
        return NULL;
    }
    StandAsideObject *self = (StandAsideObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = (vectorcallfunc)StandAside_vectorcall;
    Py_INCREF(call);
    self->call = call;
    Py_INCREF(hook);
    self->hook = hook;
    return (PyObject *)self;
}

static int
StandAside_traverse(StandAsideObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->call);
    Py_VISIT(self->hook);
    return 0;
}

static int
StandAside_clear(StandAsideObject *self)
{
    Py_CLEAR(self->call);
    Py_CLEAR(self->hook);
    return 0;
}

static void
StandAside_dealloc(StandAsideObject *self)
{
    PyObject_GC_UnTrack(self);
    StandAside_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject StandAsideType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "instrument._speedups.StandAside",
    .tp_doc = "StandAside(call, hook): None while call.guarded, else hook(*args, **kwargs).",
    .tp_basicsize = sizeof(StandAsideObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = StandAside_new,
    .tp_dealloc = (destructor)StandAside_dealloc,
    .tp_traverse = (traverseproc)StandAside_traverse,
    .tp_clear = (inquiry)StandAside_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(StandAsideObject, vectorcall),
};

/* -- module ---------------------------------------------------------------------------- */

/* The module keeps process-wide state (the bound frame variable, the region classes, the
 * thread-local stack), which one interpreter's bind() would take from another: the C path
 * runs in the main interpreter only, and sub-interpreters use the pure-Python path. */
static int
refuse_subinterpreter(void)
{
    if (PyInterpreterState_Get() == PyInterpreterState_Main()) {
        return 0;
    }
    PyErr_SetString(PyExc_ImportError,
                    "instrument._speedups: the C accelerator runs in the main interpreter only "
                    "(sub-interpreters use the pure-Python path)");
    return -1;
}

static PyObject *
bind_stack(PyObject *module, PyObject *args)
{
    PyObject *var, *root;
    if (!PyArg_ParseTuple(args, "OO!:bind_stack", &var, &PyTuple_Type, &root)) {
        return NULL;
    }
    PyTypeObject *type = Py_TYPE(root);
    /* a tuple subclass without instance fields (a NamedTuple's __slots__ = ()): C fills and
     * reuses its instances like tuples */
    if (type->tp_basicsize != PyTuple_Type.tp_basicsize ||
        type->tp_itemsize != PyTuple_Type.tp_itemsize || type->tp_dictoffset != 0 ||
        type->tp_weaklistoffset != 0) {
        PyErr_Format(PyExc_TypeError,
                     "bind_stack() needs the root frame of a tuple type without instance "
                     "fields (a NamedTuple), got %R",
                     root);
        return NULL;
    }
    if (refuse_subinterpreter() < 0) {
        return NULL;
    }
    if (!PyContextVar_CheckExact(var)) {
        PyErr_SetString(PyExc_TypeError, "bind_stack() needs the frame ContextVar");
        return NULL;
    }
    PyTypeObject *bound_type = frame_type; /* is_frame() reads frame_type */
    frame_type = type;
    int ok = is_frame(root);
    frame_type = bound_type;
    if (!ok) {
        PyErr_Format(PyExc_TypeError,
                     "bind_stack() needs a region frame (node, t0, parent, owner, event), got %R",
                     root);
        return NULL;
    }
    Py_hash_t hash = PyObject_Hash(var);
    if (hash == -1 || (!(StackType.tp_flags & Py_TPFLAGS_READY) && PyType_Ready(&StackType) < 0)) {
        return NULL;
    }
    /* the HAMT folds a 64-bit hash to 32 bits like this (Python/hamt.c, hamt_hash) */
#if SIZEOF_PY_HASH_T <= 4
    frame_var_hash = (int32_t)hash;
#else
    int32_t folded = (int32_t)(hash & 0xffffffffl) ^ (int32_t)(hash >> 32);
    frame_var_hash = folded == -1 ? -2 : folded;
#endif
    holders_on = 0; /* until use_holders() confirms the layout for this variable */
    Py_INCREF(var);
    Py_XSETREF(frame_var, var);
    Py_INCREF(root);
    Py_XSETREF(root_frame, root);
    Py_INCREF(type);
    Py_XSETREF(frame_type, type);
    Py_RETURN_NONE;
}

static PyObject *
bind(PyObject *module, PyObject *args)
{
    PyObject *clock, *cpu, *skipped, *coroutine;
    if (!PyArg_ParseTuple(args, "OO!O!O:bind", &clock, &PyType_Type, &cpu, &PyType_Type,
                          &skipped, &coroutine)) {
        return NULL;
    }
    if (refuse_subinterpreter() < 0) {
        return NULL;
    }
    if (!PyCallable_Check(clock) || !PyType_IsSubtype((PyTypeObject *)cpu, &RegionType) ||
        !PyType_IsSubtype((PyTypeObject *)skipped, &RegionType) || !PyCallable_Check(coroutine)) {
        PyErr_SetString(PyExc_TypeError,
                        "bind(perf_counter_ns, CpuRegion, SkippedRegion, timed_coroutine) needs "
                        "a callable, two RegionBase subclasses and a callable");
        return NULL;
    }
    Py_INCREF(coroutine);
    Py_XSETREF(timed_coroutine, coroutine);
    Py_INCREF(clock);
    Py_XSETREF(perf_counter_ns, clock);
    Py_INCREF(cpu);
    Py_XSETREF(cpu_region_type, (PyTypeObject *)cpu);
    Py_INCREF(skipped);
    Py_XSETREF(skipped_region_type, (PyTypeObject *)skipped);
    Py_RETURN_NONE;
}

static PyObject *
bind_steps(PyObject *module, PyObject *args)
{
    PyObject *state, *registry;
    if (!PyArg_ParseTuple(args, "O!O!:bind_steps", &PyModule_Type, &state, &PyModule_Type,
                          &registry)) {
        return NULL;
    }
    if (refuse_subinterpreter() < 0) {
        return NULL;
    }
    PyObject *state_dict = PyModule_GetDict(state), *registry_dict = PyModule_GetDict(registry);
    Py_INCREF(state_dict);
    Py_XSETREF(steps_state, state_dict);
    Py_INCREF(registry_dict);
    Py_XSETREF(steps_registry, registry_dict);
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

static PyObject *timed_function_types(PyObject *module, PyObject *args); /* at the end */

static PyMethodDef module_methods[] = {
    {"bind_stack", bind_stack, METH_VARARGS,
     "bind_stack(frame_var, root_frame): the context variable holding the innermost frame."},
    {"bind", bind, METH_VARARGS,
     "bind(perf_counter_ns, CpuRegion, SkippedRegion, timed_coroutine): the clock read "
     "directly, the region classes of the call wrapper, and what times a coroutine a timed "
     "call returned."},
    {"bind_steps", bind_steps, METH_VARARGS,
     "bind_steps(_state, registry): the modules whose now and stepping_thread a "
     "StepCounter reads and sets."},
    {"get_top", get_top, METH_NOARGS, "frames._get: the innermost frame of this context."},
    {"set_top", set_top, METH_O, "frames._set: make a frame the innermost of this context."},
    {"use_holders", use_holders, METH_NOARGS,
     "Keep each context's frames in a stack holder if the context layout is confirmed on "
     "this interpreter (else one variable set per transition); returns whether it is."},
    {"bucket", bucket, METH_O, "The histogram bucket of a duration in ns (for tests)."},
    {"take_tree", take_tree, METH_VARARGS, "take_tree(root, idle_limit, keep, concurrent[, source]): see registry._take_tree."},
    {"timed_function_types", timed_function_types, METH_VARARGS,
     "timed_function_types(wrapt FunctionWrapper, BoundFunctionWrapper): the decorator's "
     "wrapper types derived from them, calling the wrapped function directly: (for a plain "
     "function, for any other callable, bound)."},
    {NULL, NULL, 0, NULL},
};

static int
module_exec(PyObject *m)
{
    if (refuse_subinterpreter() < 0) {
        return -1;
    }
    if (PyType_Ready(&NodeType) < 0 || PyType_Ready(&RegionType) < 0 ||
        PyType_Ready(&CallTimerType) < 0 || PyType_Ready(&DispatchType) < 0 ||
        PyType_Ready(&ActiveType) < 0 || PyType_Ready(&StepCounterType) < 0 ||
        PyType_Ready(&BackwardCallType) < 0 || PyType_Ready(&StepGuardType) < 0 ||
        PyType_Ready(&StandAsideType) < 0 || PyType_Ready(&StepCallType) < 0 ||
        add_region_methods() < 0) {
        return -1;
    }
    if (str_child == NULL) {
        str_child = PyUnicode_InternFromString("child");
        str_cpu = PyUnicode_InternFromString("cpu");
        str_exit_top = PyUnicode_InternFromString("_exit_top");
        str_call = PyUnicode_InternFromString("_call");
        str_drop_innermost = PyUnicode_InternFromString("_drop_innermost");
        str_now = PyUnicode_InternFromString("now");
        str_stepping_thread = PyUnicode_InternFromString("stepping_thread");
        str_parent = PyUnicode_InternFromString("_parent");
        str_running = PyUnicode_InternFromString("running");
        str_guarded = PyUnicode_InternFromString("guarded");
        str_scaled = PyUnicode_InternFromString("_scaled");
        str_ticker = PyUnicode_InternFromString("_ticker");
        str_on_step = PyUnicode_InternFromString("on_step");
        str_tick_outside = PyUnicode_InternFromString("_tick_outside");
        str_step = PyUnicode_InternFromString("step");
        if (!str_parent || !str_running || !str_guarded || !str_scaled || !str_ticker ||
            !str_on_step || !str_tick_outside || !str_step ||
            !str_child || !str_cpu || !str_exit_top || !str_call || !str_drop_innermost ||
            !str_now || !str_stepping_thread) {
            Py_CLEAR(str_child);
            return -1;
        }
    }
    if (PyModule_AddIntConstant(m, "NBUCKETS", NBUCKETS) < 0 ||
        PyModule_AddIntConstant(m, "CONTEXT_LAYOUT_KNOWN", CONTEXT_LAYOUT_KNOWN) < 0 ||
        PyModule_AddObjectRef(m, "NodeBase", (PyObject *)&NodeType) < 0 ||
        PyModule_AddObjectRef(m, "RegionBase", (PyObject *)&RegionType) < 0 ||
        PyModule_AddObjectRef(m, "CallTimer", (PyObject *)&CallTimerType) < 0 ||
        PyModule_AddObjectRef(m, "Dispatch", (PyObject *)&DispatchType) < 0 ||
        PyModule_AddObjectRef(m, "Active", (PyObject *)&ActiveType) < 0 ||
        PyModule_AddObjectRef(m, "StepCounter", (PyObject *)&StepCounterType) < 0 ||
        PyModule_AddObjectRef(m, "BackwardCall", (PyObject *)&BackwardCallType) < 0 ||
        PyModule_AddObjectRef(m, "StepGuard", (PyObject *)&StepGuardType) < 0 ||
        PyModule_AddObjectRef(m, "StandAside", (PyObject *)&StandAsideType) < 0 ||
        PyModule_AddObjectRef(m, "StepCall", (PyObject *)&StepCallType) < 0) {
        return -1;
    }
    return 0;
}

/* Multi-phase init, so that module_exec runs in every interpreter that imports the module
 * (single-phase init would copy the main interpreter's module into a sub-interpreter
 * without asking) and can refuse the non-main ones. */
static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "instrument._speedups",
    .m_doc = "Optional C hot path of instrument (pure-Python fallback in regions/registry).",
    .m_size = 0,
    .m_methods = module_methods,
    .m_slots = module_slots,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModuleDef_Init(&module_def);
}

/* -- the decorated function itself: a wrapt FunctionWrapper that calls directly ---------
 * wrapt's FunctionWrapper calls wrapper(wrapped, instance, args, kwargs): a tuple, a dict
 * and a __self__ lookup per call, two thirds of a timed call. timed_function_types()
 * derives from wrapt's C FunctionWrapper and BoundFunctionWrapper (so the result is still
 * a wrapt object: introspection, binding, __wrapped__, signature, isinstance) a pair of
 * types whose vectorcall, while the wrapper is a CallTimer on a host-clock region, opens
 * the region, calls the wrapped function with the caller's own arguments and closes it.
 * That is what CallTimer does: it ignores `instance`, and every binding wrapt applies ends
 * in wrapped(*args, **kwargs). A skipped region calls the function directly (wrapt's
 * enabled= flag); any other region, or a wrapper set by hand, takes wrapt's own call.
 * Around a plain Python function the type is also a method descriptor, as functions are:
 * obj.method(x) then calls it with (obj, x) -- the function's own call -- without making
 * a bound wrapper first (attribute access, obj.method, still makes one).
 * wrapt's object layout is copied below and checked on live objects before use. */

typedef struct { /* wrapt._wrappers: WraptObjectProxyObject + WraptFunctionWrapperObject */
    PyObject_HEAD
    PyObject *dict;
    PyObject *wrapped;
    PyObject *weakreflist;
    int init_called;
    PyObject *instance;
    PyObject *wrapper;
    PyObject *enabled;
    PyObject *binding;
    PyObject *parent;
    PyObject *owner;
} WraptFunctionWrapperLayout;

typedef struct {
    WraptFunctionWrapperLayout base;
    vectorcallfunc vectorcall;
} TimedWrapperObject;

static PyTypeObject *timed_function_type = NULL, *timed_callable_type = NULL;
static PyTypeObject *timed_bound_type = NULL;
static ternaryfunc wrapt_function_call = NULL, wrapt_bound_call = NULL;
static newfunc wrapt_function_new = NULL, wrapt_bound_new = NULL;

/* wrapt's own call with a tuple and a dict made from vectorcall arguments. */
COLD static PyObject *
timed_generic_call(PyObject *self, ternaryfunc call, PyObject *const *args, size_t nargsf,
                   PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    PyObject *tuple = PyTuple_New(nargs), *kwargs = NULL, *result = NULL;
    if (tuple == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(tuple, i, args[i]);
    }
    if (nkw > 0) {
        kwargs = PyDict_New();
        for (Py_ssize_t i = 0; kwargs != NULL && i < nkw; i++) {
            if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) {
                Py_CLEAR(kwargs);
            }
        }
        if (kwargs == NULL) {
            Py_DECREF(tuple);
            return NULL;
        }
    }
    result = call(self, tuple, kwargs);
    Py_DECREF(tuple);
    Py_XDECREF(kwargs);
    return result;
}

/* Call `wrapped` timed as the host-clock region `region` (finish_timed_call: the call's
 * outcome, or the clock's error after a successful call). */
HOT static PyObject *
timed_region_vectorcall(RegionObject *region, PyObject *wrapped, PyObject *const *args,
                        size_t nargsf, PyObject *kwnames)
{
    PyObject *frame;
    int64_t t0;
    if ((frame = open_cpu(region, &t0)) == NULL) {
        return NULL;
    }
    PyObject *result = PyObject_Vectorcall(wrapped, args, nargsf, kwnames);
    return finish_timed_call(region, frame, t0, result);
}

HOT static PyObject *
timed_wrapper_call(TimedWrapperObject *self, ternaryfunc generic, PyObject *const *args,
                   size_t nargsf, PyObject *kwnames)
{
    WraptFunctionWrapperLayout *w = &self->base;
    PyObject *wrapper = w->wrapper, *enabled = w->enabled, *wrapped = w->wrapped;
    if (wrapped == NULL || wrapper == NULL || enabled == NULL ||
        Py_TYPE(wrapper) != &CallTimerType || Py_TYPE(enabled) != &ActiveType ||
        ((ActiveObject *)enabled)->region != ((CallTimerObject *)wrapper)->region) {
        return timed_generic_call((PyObject *)self, generic, args, nargsf, kwnames);
    }
    PyObject *region = ((CallTimerObject *)wrapper)->region;
    PyTypeObject *type = Py_TYPE(region);
    if (type != cpu_region_type && type != skipped_region_type) {
        return timed_generic_call((PyObject *)self, generic, args, nargsf, kwnames);
    }
    /* held across the call: the call may re-initialize this wrapper */
    Py_INCREF(wrapped);
    Py_INCREF(region);
    PyObject *result = type == skipped_region_type
                           ? PyObject_Vectorcall(wrapped, args, nargsf, kwnames)
                           : timed_region_vectorcall((RegionObject *)region, wrapped, args,
                                                     nargsf, kwnames);
    Py_DECREF(region);
    Py_DECREF(wrapped);
    return result;
}

HOT static PyObject *
timed_function_vectorcall(TimedWrapperObject *self, PyObject *const *args, size_t nargsf,
                          PyObject *kwnames)
{
    return timed_wrapper_call(self, wrapt_function_call, args, nargsf, kwnames);
}

HOT static PyObject *
timed_bound_vectorcall(TimedWrapperObject *self, PyObject *const *args, size_t nargsf,
                       PyObject *kwnames)
{
    return timed_wrapper_call(self, wrapt_bound_call, args, nargsf, kwnames);
}

static PyObject *
timed_function_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *self = wrapt_function_new(type, args, kwds);
    if (self != NULL) {
        ((TimedWrapperObject *)self)->vectorcall = (vectorcallfunc)timed_function_vectorcall;
    }
    return self;
}

static PyObject *
timed_bound_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *self = wrapt_bound_new(type, args, kwds);
    if (self != NULL) {
        ((TimedWrapperObject *)self)->vectorcall = (vectorcallfunc)timed_bound_vectorcall;
    }
    return self;
}

static PyMemberDef timed_wrapper_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(TimedWrapperObject, vectorcall), READONLY,
     NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot timed_function_slots[] = {
    {Py_tp_traverse, NULL},   /* wrapt's, set by timed_function_types() */
    {Py_tp_clear, NULL},      /* wrapt's, likewise */
    {Py_tp_descr_get, NULL},  /* wrapt's, likewise: PyType_Ready wants it given, not
                                 inherited, with Py_TPFLAGS_METHOD_DESCRIPTOR */
    {Py_tp_new, timed_function_new},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_members, timed_wrapper_members},
    {Py_tp_doc, "A wrapt FunctionWrapper timing each call as one region (see "
                "instrument._speedups.timed_function_types)."},
    {0, NULL},
};

static PyType_Slot timed_bound_slots[] = {
    {Py_tp_traverse, NULL}, /* wrapt's, set by timed_function_types() */
    {Py_tp_clear, NULL},    /* wrapt's, likewise */
    {Py_tp_new, timed_bound_new},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_members, timed_wrapper_members},
    {Py_tp_doc, "The bound form of TimedFunctionWrapper (a wrapt BoundFunctionWrapper)."},
    {0, NULL},
};

/* Mutable, as their wrapt bases are (Python 3.14 refuses an immutable type over a mutable
 * base; 3.12 and 3.13 warn). */
static PyType_Spec timed_function_spec = {
    .name = "instrument._speedups.TimedFunctionWrapper",
    .basicsize = sizeof(TimedWrapperObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
             Py_TPFLAGS_METHOD_DESCRIPTOR,
    .slots = timed_function_slots,
};

static PyType_Spec timed_callable_spec = {
    .name = "instrument._speedups.TimedCallableWrapper",
    .basicsize = sizeof(TimedWrapperObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .slots = timed_function_slots,
};

static PyType_Spec timed_bound_spec = {
    .name = "instrument._speedups.TimedBoundFunctionWrapper",
    .basicsize = sizeof(TimedWrapperObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .slots = timed_bound_slots,
};

/* Whether `type` is a C wrapt function wrapper type laid out as copied above: its size,
 * and the fields of an object built by calling it with `args`, checked against `expect`
 * (wrapped, instance, wrapper, enabled, binding, parent, owner; NULL: not checked). */
static int
wrapt_layout_matches(PyObject *type, PyObject *args, PyObject *const *expect)
{
    if (!PyType_Check(type) || !PyType_HasFeature((PyTypeObject *)type, Py_TPFLAGS_HEAPTYPE) ||
        ((PyTypeObject *)type)->tp_basicsize != sizeof(WraptFunctionWrapperLayout) ||
        ((PyTypeObject *)type)->tp_itemsize != 0 || ((PyTypeObject *)type)->tp_call == NULL ||
        ((PyTypeObject *)type)->tp_new == NULL || ((PyTypeObject *)type)->tp_traverse == NULL ||
        ((PyTypeObject *)type)->tp_clear == NULL) {
        return 0;
    }
    PyObject *probe = PyObject_Call(type, args, NULL);
    if (probe == NULL) {
        return -1;
    }
    WraptFunctionWrapperLayout *w = (WraptFunctionWrapperLayout *)probe;
    PyObject *fields[7] = {w->wrapped, w->instance, w->wrapper, w->enabled,
                           w->binding, w->parent,   w->owner};
    int same = Py_TYPE(probe) == (PyTypeObject *)type;
    for (int i = 0; i < 7; i++) {
        if (expect[i] != NULL && fields[i] != expect[i]) {
            same = 0;
        }
    }
    Py_DECREF(probe);
    return same;
}

/* A new type from `spec` deriving from `base`; with `bound`, binding to that type. */
static PyObject *
derive(PyType_Spec *spec, PyObject *base, PyObject *bound)
{
    PyObject *bases = PyTuple_Pack(1, base);
    PyObject *type = bases ? PyType_FromSpecWithBases(spec, bases) : NULL;
    Py_XDECREF(bases);
    if (type != NULL && bound != NULL) {
        if (PyDict_SetItemString(((PyTypeObject *)type)->tp_dict, "__bound_function_wrapper__",
                                 bound) < 0) {
            Py_CLEAR(type);
        }
        else {
            PyType_Modified((PyTypeObject *)type);
        }
    }
    return type;
}

static PyObject *
timed_function_types(PyObject *module, PyObject *args)
{
    PyObject *function_type, *bound_type;
    if (!PyArg_ParseTuple(args, "OO:timed_function_types", &function_type, &bound_type)) {
        return NULL;
    }
    if (timed_function_type != NULL) {
        if ((PyObject *)timed_function_type->tp_base != function_type ||
            (PyObject *)timed_bound_type->tp_base != bound_type) {
            PyErr_SetString(PyExc_TypeError,
                            "timed_function_types() was already bound to other wrapt types");
            return NULL;
        }
        return PyTuple_Pack(3, timed_function_type, timed_callable_type, timed_bound_type);
    }
    /* probes: a builtin to wrap (binding "builtin"), distinct markers for every field */
    PyObject *wrapped = PyObject_GetAttrString(module, "bucket");
    PyObject *wrapper = PyLong_FromLong(1001), *enabled = PyLong_FromLong(1002);
    PyObject *instance = PyLong_FromLong(1003), *owner = PyLong_FromLong(1004);
    PyObject *binding = PyUnicode_FromString("function");
    PyObject *fargs = NULL, *bargs = NULL;
    int ok = -1;
    if (wrapped && wrapper && enabled && instance && owner && binding &&
        (fargs = PyTuple_Pack(3, wrapped, wrapper, enabled)) != NULL &&
        (bargs = PyTuple_Pack(7, wrapped, instance, wrapper, enabled, binding, Py_None, owner)) !=
            NULL) {
        PyObject *fexpect[7] = {wrapped, NULL, wrapper, enabled, NULL, Py_None, NULL};
        PyObject *bexpect[7] = {wrapped, instance, wrapper, enabled, binding, Py_None, owner};
        ok = wrapt_layout_matches(function_type, fargs, fexpect);
        if (ok == 1) {
            ok = wrapt_layout_matches(bound_type, bargs, bexpect);
        }
    }
    Py_XDECREF(wrapped);
    Py_XDECREF(wrapper);
    Py_XDECREF(enabled);
    Py_XDECREF(instance);
    Py_XDECREF(owner);
    Py_XDECREF(binding);
    Py_XDECREF(fargs);
    Py_XDECREF(bargs);
    if (ok < 0) {
        return NULL;
    }
    if (ok == 1 && ((PyTypeObject *)function_type)->tp_descr_get == NULL) {
        ok = 0; /* not a descriptor: methods would not bind */
    }
    if (ok == 0) {
        PyErr_SetString(PyExc_TypeError,
                        "timed_function_types() needs wrapt's C FunctionWrapper and "
                        "BoundFunctionWrapper with the layout this module was written for");
        return NULL;
    }
    /* the slots[0] and [1] placeholders: wrapt's own GC functions, as for any subtype */
    timed_function_slots[0].pfunc = (void *)((PyTypeObject *)function_type)->tp_traverse;
    timed_function_slots[1].pfunc = (void *)((PyTypeObject *)function_type)->tp_clear;
    timed_function_slots[2].pfunc = (void *)((PyTypeObject *)function_type)->tp_descr_get;
    timed_bound_slots[0].pfunc = (void *)((PyTypeObject *)bound_type)->tp_traverse;
    timed_bound_slots[1].pfunc = (void *)((PyTypeObject *)bound_type)->tp_clear;
    PyObject *btype = derive(&timed_bound_spec, bound_type, NULL);
    PyObject *ftype = btype ? derive(&timed_function_spec, function_type, btype) : NULL;
    PyObject *ctype = ftype ? derive(&timed_callable_spec, function_type, btype) : NULL;
    if (ctype == NULL) {
        Py_XDECREF(btype);
        Py_XDECREF(ftype);
        return NULL;
    }
    wrapt_function_call = ((PyTypeObject *)function_type)->tp_call;
    wrapt_function_new = ((PyTypeObject *)function_type)->tp_new;
    wrapt_bound_call = ((PyTypeObject *)bound_type)->tp_call;
    wrapt_bound_new = ((PyTypeObject *)bound_type)->tp_new;
    timed_function_type = (PyTypeObject *)ftype;
    timed_callable_type = (PyTypeObject *)ctype;
    timed_bound_type = (PyTypeObject *)btype;
    return PyTuple_Pack(3, ftype, ctype, btype);
}
