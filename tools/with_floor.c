/* The floor of a `with` region on this interpreter (tools/with_floor.py builds and runs it):
 * a context manager whose __enter__/__exit__ are bound once, as instrument's C regions
 * are, doing nothing (`Floor(0)`) or reading CLOCK_MONOTONIC at enter and exit and keeping
 * the difference in a C field (`Floor(1)`): no frame, no tree, no statistics. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>

typedef struct {
    PyObject_HEAD
    int clock;
    int64_t t0, total;
    PyObject *enter, *exit; /* bound once */
} FloorObject;

static inline int64_t
now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static PyObject *
floor_enter(FloorObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (self->clock) {
        self->t0 = now();
    }
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *
floor_exit(FloorObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (self->clock) {
        self->total += now() - self->t0;
    }
    Py_RETURN_NONE;
}

static PyMethodDef defs[2] = {
    {"__enter__", (PyCFunction)(void (*)(void))floor_enter, METH_FASTCALL, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))floor_exit, METH_FASTCALL, NULL},
};

typedef struct {
    PyObject_HEAD
    int which;
} DescrObject;

static PyTypeObject FloorType, DescrType;

static PyObject *
descr_get(DescrObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || !PyObject_TypeCheck(obj, &FloorType)) {
        Py_INCREF(self);
        return (PyObject *)self;
    }
    PyObject **slot = self->which ? &((FloorObject *)obj)->exit : &((FloorObject *)obj)->enter;
    if (*slot == NULL && (*slot = PyCFunction_New(&defs[self->which], obj)) == NULL) {
        return NULL;
    }
    Py_INCREF(*slot);
    return *slot;
}

static PyTypeObject DescrType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "with_floor.Descr",
    .tp_basicsize = sizeof(DescrObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_descr_get = (descrgetfunc)descr_get,
};

static PyObject *
floor_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    int clock = 0;
    if (!PyArg_ParseTuple(args, "|p", &clock)) {
        return NULL;
    }
    FloorObject *self = (FloorObject *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->clock = clock;
    }
    return (PyObject *)self;
}

static PyObject *
floor_total(FloorObject *self, void *closure)
{
    return PyLong_FromLongLong(self->total);
}

static PyGetSetDef floor_getset[] = {
    {"total", (getter)floor_total, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static int
floor_traverse(FloorObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->enter);
    Py_VISIT(self->exit);
    return 0;
}

static int
floor_clear(FloorObject *self)
{
    Py_CLEAR(self->enter);
    Py_CLEAR(self->exit);
    return 0;
}

static void
floor_dealloc(FloorObject *self)
{
    PyObject_GC_UnTrack(self);
    floor_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject FloorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "with_floor.Floor",
    .tp_basicsize = sizeof(FloorObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = floor_new,
    .tp_dealloc = (destructor)floor_dealloc,
    .tp_traverse = (traverseproc)floor_traverse,
    .tp_clear = (inquiry)floor_clear,
    .tp_getset = floor_getset,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "with_floor", NULL, -1, NULL};

PyMODINIT_FUNC
PyInit_with_floor(void)
{
    if (PyType_Ready(&DescrType) < 0 || PyType_Ready(&FloorType) < 0) {
        return NULL;
    }
    for (int which = 0; which < 2; which++) {
        DescrObject *d = PyObject_New(DescrObject, &DescrType);
        if (d == NULL) {
            return NULL;
        }
        d->which = which;
        int rc = PyDict_SetItemString(FloorType.tp_dict, defs[which].ml_name, (PyObject *)d);
        Py_DECREF(d);
        if (rc < 0) {
            return NULL;
        }
    }
    PyType_Modified(&FloorType);
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddObjectRef(m, "Floor", (PyObject *)&FloorType) < 0) {
        Py_CLEAR(m);
    }
    return m;
}
