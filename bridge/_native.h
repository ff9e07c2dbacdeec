/* What the stages' C fast paths (bridge/<stage>/_fast*.c) share: reading and writing the slots
 * of the slotted dataclasses at the stages' seams, and interning names at module init.
 * Header-only, so each extension stays one source file and no stage links against another.
 */
#ifndef BRIDGE_NATIVE_H
#define BRIDGE_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* An attribute name, and where the types seen so far keep it (up to four types per name). */
typedef struct {
    const char *text;   /* the name, interned into `name` at module init */
    PyObject *name;
    PyTypeObject *type[4];
    Py_ssize_t offset[4];
} Attr;

/* The plain object slot of `tp` that `a` names, remembered for `tp`: its offset, or -1 when
 * `tp` keeps it otherwise (a property, a dict, a custom getattr; `write`: a read-only or custom
 * setattr too). */
static inline Py_ssize_t attr_offset(PyTypeObject *tp, Attr *a, int write) {
    for (int k = 0; k < 4; k++)
        if (a->type[k] == tp)
            return a->offset[k];
    if (tp->tp_getattro != PyObject_GenericGetAttr || (write && tp->tp_setattro != PyObject_GenericSetAttr))
        return -1;
    PyObject *d = _PyType_Lookup(tp, a->name);
    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type))
        return -1;
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != T_OBJECT_EX || (write && (m->flags & READONLY)))
        return -1;
    for (int k = 0; k < 4; k++) {
        if (a->type[k] == NULL) {
            a->type[k] = (PyTypeObject *)Py_NewRef(tp); /* held: the pointer stays valid */
            a->offset[k] = m->offset;
            break;
        }
    }
    return m->offset;
}

/* getattr(obj, a) as a new reference, read from the slot directly when it is a plain one. */
static inline PyObject *attr_get(PyObject *obj, Attr *a) {
    Py_ssize_t off = attr_offset(Py_TYPE(obj), a, 0);
    if (off >= 0) {
        PyObject *v = *(PyObject **)((char *)obj + off);
        if (v != NULL)
            return Py_NewRef(v);
    }
    return PyObject_GetAttr(obj, a->name); /* not a plain slot, or unset: getattr answers or raises */
}

/* A borrowed pointer to obj's slot storage for `a`, or NULL when it is not a plain slot (the
 * caller then declines). `write`: the caller will set it. */
static inline PyObject **attr_slot(PyObject *obj, Attr *a, int write) {
    Py_ssize_t off = attr_offset(Py_TYPE(obj), a, write);
    return off < 0 ? NULL : (PyObject **)((char *)obj + off);
}

/* A slotted dataclass made without its __init__: the offsets of its fields' slots, in field
 * order (`__dataclass_fields__` is ordered). Used where the Python side would make the same
 * frozen instance; the values are the ones its __init__ would store. */
#define MAX_FIELDS 20
typedef struct {
    PyTypeObject *type;
    Py_ssize_t offsets[MAX_FIELDS];
    int n;
} Cls;

static inline int cls_load(Cls *c, PyObject *cls) {
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "not a class");
        return -1;
    }
    PyObject *fields = PyObject_GetAttrString(cls, "__dataclass_fields__");
    if (fields == NULL)
        return -1;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    int n = 0;
    while (PyDict_Next(fields, &pos, &key, &value)) {
        PyObject *d = n < MAX_FIELDS ? PyDict_GetItemWithError(((PyTypeObject *)cls)->tp_dict, key) : NULL;
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type) ||
            ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
            Py_DECREF(fields);
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "%R: not a slot (or more than %d fields)", key, MAX_FIELDS);
            return -1;
        }
        c->offsets[n++] = ((PyMemberDescrObject *)d)->d_member->offset;
    }
    Py_DECREF(fields);
    Py_XSETREF(c->type, (PyTypeObject *)Py_NewRef(cls));
    c->n = n;
    return 0;
}

/* An instance with its c->n slots set from v (references stolen; NULL if any is NULL). The
 * caller checks that it has c->n values: a field added in Python and not here must decline. */
static inline PyObject *cls_make(Cls *c, PyObject **v) {
    int i;
    for (i = 0; i < c->n; i++)
        if (v[i] == NULL)
            goto fail;
    PyObject *obj = c->type->tp_alloc(c->type, 0);
    if (obj == NULL)
        goto fail;
    for (i = 0; i < c->n; i++)
        *(PyObject **)((char *)obj + c->offsets[i]) = v[i];
    return obj;
fail:
    for (i = 0; i < c->n; i++)
        Py_XDECREF(v[i]);
    return NULL;
}

#define INTERN(var, text)                                 \
    if ((var = PyUnicode_InternFromString(text)) == NULL) \
    return NULL

#endif
