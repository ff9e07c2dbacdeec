/* The assemble stage's per-line fast path: KV block lines of a request already open.
 *
 * `Feeder(assembler, feed, BlockAllocated, BlockFreed, SpanEvent, RequestSummary)` is a
 * callable that Assembler installs as its instance's `feed`. Called with (record, event), it
 * does what `Assembler.feed` → `_on_allocated` / `_on_freed` / `_on_summary` do, for the
 * commonest case only:
 *
 *   - the event is a BlockAllocated, BlockFreed or RequestSummary (exact types; a summary
 *     without the vLLM plugin's phase times);
 *   - the record's time is not newer than the assembler's clock (no tick is due), nor a day or
 *     more older (a clock set back: `_clock_jumped`), and no NCCL timeout is held;
 *   - the request id is open (so `_seed_id` is the id itself), and, for an allocation or a
 *     summary, not over (so `_start` continues it rather than starting a new occurrence);
 *   - the record's time decides the tick; the event's own exact time (`at_ns`, when an int)
 *     is the time it is recorded at, as `_exact` makes it in Python;
 *   - a free names one block, and comes after the request's end or is a preemption's (a
 *     release before the end's line, as the vLLM plugin writes, is left to Python);
 *   - the request is no upstream one (`extra` is None) for a summary, or for a free after its
 *     end: one that vLLM's API server logs lingers for its `Generated response` lines
 *     (`_awaits_api`), which is Python's.
 *
 * Any other call goes to `feed`, the Python method, which stays the reference; the checks are
 * all made before anything is changed, so a declined line is handled by Python alone. A free
 * or a summary that completes a finished request calls the assembler's own `_finish`.
 */
#include "_native.h"

/* attr_slot (bridge/_native.h) is given each Attr for the fields of read-only objects (records,
 * frozen events) or of RequestState, never both: a type it has seen is not checked again. */

enum {
    R_ts_ns, R_offset,                                 /* Record */
    E_request_id, E_block, E_size_bytes, E_reason, E_at_ns, E_times, /* the events */
    S_terminal_ns, S_last_ns, S_last_offset, S_allocated, S_freed, S_held, S_block_events, S_block_dropped,
    S_last_free_ns, S_outcome, S_summary, S_request_id, S_events, S_dropped, S_min_free_ratio,
    S_max_gpu_ratio, S_extra,                          /* RequestState */
    N_ATTRS
};
static Attr attrs_[N_ATTRS] = {
    {"ts_ns"}, {"offset"},
    {"request_id"}, {"block"}, {"size_bytes"}, {"reason"}, {"at_ns"}, {"times"},
    {"terminal_ns"}, {"last_ns"}, {"last_offset"}, {"allocated"}, {"freed"}, {"held"}, {"block_events"},
    {"block_dropped"}, {"last_free_ns"}, {"outcome"}, {"summary"}, {"request_id"}, {"events"}, {"dropped"},
    {"min_free_ratio"}, {"max_gpu_ratio"}, {"extra"},
};
static PyObject *s_now, *s_next_sweep, *s_pending_nccl, *s_open, *s_finish, *s_in_flight, *v_finished, *k_id, *k_size, *k_reason, *n_allocated, *n_freed,
    *v_timeout, *v_preempted, *zero_int;

#define BLOCK_EVENTS_KEPT (8 * 32) /* state.py: BLOCK_EVENTS_KEPT = 8 * EVENT_CAP */

typedef struct {
    PyObject_HEAD
    PyObject *assembler, *feed, *open, *allocated_type, *freed_type, *summary_type;
    PyTypeObject *event_type;
    Py_ssize_t event_offsets[3]; /* SpanEvent: name, ts_ns, attrs */
} Feeder;

static int feeder_traverse(Feeder *self, visitproc visit, void *arg) {
    Py_VISIT(self->assembler);
    Py_VISIT(self->feed);
    Py_VISIT(self->open);
    Py_VISIT(self->allocated_type);
    Py_VISIT(self->freed_type);
    Py_VISIT(self->summary_type);
    Py_VISIT(self->event_type);
    return 0;
}

static int feeder_clear(Feeder *self) {
    Py_CLEAR(self->assembler);
    Py_CLEAR(self->feed);
    Py_CLEAR(self->open);
    Py_CLEAR(self->allocated_type);
    Py_CLEAR(self->freed_type);
    Py_CLEAR(self->summary_type);
    Py_CLEAR(self->event_type);
    return 0;
}

static void feeder_dealloc(Feeder *self) {
    PyObject_GC_UnTrack(self);
    feeder_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *fallback(Feeder *self, PyObject *record, PyObject *event) {
    return PyObject_CallFunctionObjArgs(self->feed, record, event, NULL);
}

/* *p += delta, for a slot holding an int */
static int add(PyObject **p, long delta) {
    PyObject *d = PyLong_FromLong(delta);
    PyObject *v = d ? PyNumber_Add(*p, d) : NULL;
    Py_XDECREF(d);
    if (v == NULL)
        return -1;
    Py_SETREF(*p, v);
    return 0;
}

/* clock.py BEHIND_NS: a step back this long is a clock jump, which feed() handles (the module's
 * BEHIND_NS; tests/test_clock_jumps.py checks it is clock.py's). */
#define BEHIND_NS (86400LL * 1000000000LL)

/* 1 when `ts` lies BEHIND_NS or more before `now` (both ints), 0 if not, -1 on error. Stamps past
 * int64 (after 2262) are compared as Python ints. */
static int set_back(PyObject *now, PyObject *ts) {
    int o1 = 0, o2 = 0;
    long long a = PyLong_AsLongLongAndOverflow(now, &o1), b = PyLong_AsLongLongAndOverflow(ts, &o2);
    if ((a == -1 || b == -1) && PyErr_Occurred())
        return -1;
    if (!o1 && !o2)
        return a >= b && (unsigned long long)a - (unsigned long long)b >= (unsigned long long)BEHIND_NS;
    PyObject *limit = PyLong_FromLongLong(BEHIND_NS), *d = PyNumber_Subtract(now, ts);
    int r = limit && d ? PyObject_RichCompareBool(d, limit, Py_GE) : -1;
    Py_XDECREF(limit);
    Py_XDECREF(d);
    return r;
}

/* feed()'s checks: no tick due and no NCCL timeout held. 1: go on, 0: decline, -1: error.
 * A later stamp before the next sweep only advances `_now`, as feed() does: CRI and JSON
 * stamps differ on every line, and declining those would leave their lines to Python. */
static int quiet(Feeder *self, PyObject *ts) {
    PyObject *now = PyObject_GetAttr(self->assembler, s_now);
    if (now == NULL)
        return -1;
    int newer = PyObject_RichCompareBool(ts, now, Py_GT);
    int behind = newer == 0 ? set_back(now, ts) : 0;
    Py_DECREF(now);
    if (newer < 0 || behind < 0)
        return -1;
    if (behind)
        return 0; /* the clock was set back: feed()'s `_clock_jumped` */
    if (newer) {
        PyObject *sweep = PyObject_GetAttr(self->assembler, s_next_sweep);
        if (sweep == NULL)
            return -1;
        int due = PyObject_RichCompareBool(ts, sweep, Py_GE);
        Py_DECREF(sweep);
        if (due != 0)
            return due < 0 ? -1 : 0;
        if (PyObject_SetAttr(self->assembler, s_now, ts) < 0)
            return -1;
    }
    PyObject *pending = PyObject_GetAttr(self->assembler, s_pending_nccl);
    if (pending == NULL)
        return -1;
    Py_DECREF(pending);
    return pending == Py_None;
}

/* _on_summary for an open request not yet over: _start continues it, r.summary = ev,
 * _terminate(r, ts, "finished"), and _finish(r) when it holds no block. */
/* requests.py: `if r.held <= 0: self._finish(r)` (after the summary), or with `and r.outcome !=
 * "timeout"` (after a free: a timeout may still get its API line) when `unless_timeout`. -1 on error. */
static int finish_drained(Feeder *self, PyObject *r, PyObject *held, PyObject *outcome, int unless_timeout) {
    int drained = PyObject_RichCompareBool(held, zero_int, Py_LE);
    int timeout = drained == 1 && unless_timeout ? PyObject_RichCompareBool(outcome, v_timeout, Py_EQ) : 0;
    if (drained <= 0 || timeout != 0)
        return drained < 0 || timeout < 0 ? -1 : 0;
    PyObject *x = PyObject_CallMethodOneArg(self->assembler, s_finish, r);
    Py_XDECREF(x);
    return x == NULL ? -1 : 0;
}

static PyObject *summary(Feeder *self, PyObject *record, PyObject *event, PyObject *at) {
    PyObject **p_ts = attr_slot(record, &attrs_[R_ts_ns], 0), **p_off = attr_slot(record, &attrs_[R_offset], 0);
    PyObject **p_rid = attr_slot(event, &attrs_[E_request_id], 0);
    /* a summary with the vLLM plugin's phase times (`times`) is Python's (`_plugin_times`) */
    PyObject **p_times = attr_slot(event, &attrs_[E_times], 0);
    if (!p_ts || !p_off || !p_rid || !*p_ts || !*p_off || !*p_rid || !PyLong_CheckExact(*p_ts) || !p_times ||
        *p_times != Py_None)
        return fallback(self, record, event);
    PyObject *ts = *p_ts;
    int go = quiet(self, ts);
    if (go <= 0)
        return go < 0 ? NULL : fallback(self, record, event);
    if (at != NULL)
        ts = at; /* _exact() */
    PyObject *r = PyDict_GetItemWithError(self->open, *p_rid);
    if (r == NULL)
        return PyErr_Occurred() ? NULL : fallback(self, record, event);
    PyObject *in_flight = PyObject_GetAttr(self->assembler, s_in_flight);
    if (in_flight == NULL)
        return NULL;
    Py_INCREF(r);
    PyObject **terminal = attr_slot(r, &attrs_[S_terminal_ns], 1), **last_ns = attr_slot(r, &attrs_[S_last_ns], 1);
    PyObject **last_offset = attr_slot(r, &attrs_[S_last_offset], 1), **held = attr_slot(r, &attrs_[S_held], 1);
    PyObject **outcome = attr_slot(r, &attrs_[S_outcome], 1), **sum = attr_slot(r, &attrs_[S_summary], 1);
    PyObject **request_id = attr_slot(r, &attrs_[S_request_id], 1), **extra = attr_slot(r, &attrs_[S_extra], 1);
    PyObject *result = NULL;
    if (!PyDict_CheckExact(in_flight) || !terminal || !last_ns || !last_offset || !held || !outcome || !sum ||
        !request_id || !extra || !*terminal || !*last_ns || !*last_offset || !*held || !*outcome || !*sum ||
        !*request_id || !*extra || *terminal != Py_None || *extra != Py_None) {
        result = fallback(self, record, event);
        goto done;
    }
    /* A twin (a second request under a reused id) is open under `<id>\0<occurrence>`, and
     * `_terminate` takes it out of `_in_flight` under that key: Python's. */
    int own = *request_id == *p_rid ? 1 : PyObject_RichCompareBool(*request_id, *p_rid, Py_EQ);
    if (own <= 0) {
        result = own < 0 ? NULL : fallback(self, record, event);
        goto done;
    }
    /* The line is taken. _start: */
    int later = PyObject_RichCompareBool(ts, *last_ns, Py_GT);
    if (later < 0)
        goto done;
    if (later)
        Py_SETREF(*last_ns, Py_NewRef(ts));
    Py_SETREF(*last_offset, Py_NewRef(*p_off));
    Py_SETREF(*sum, Py_NewRef(event));
    /* _terminate: */
    Py_SETREF(*terminal, Py_NewRef(ts));
    Py_SETREF(*outcome, Py_NewRef(v_finished));
    if (PyDict_Contains(in_flight, *request_id) == 1 && PyDict_DelItem(in_flight, *request_id) < 0)
        goto done;
    if (PyErr_Occurred())
        goto done;
    if (finish_drained(self, r, *held, *outcome, 0) < 0)
        goto done;
    result = Py_NewRef(Py_None);
done:
    Py_DECREF(r);
    Py_DECREF(in_flight);
    return result;
}

static PyObject *feeder_call(Feeder *self, PyObject *args, PyObject *kwargs) {
    PyObject *record, *event;
    if (kwargs != NULL || !PyArg_UnpackTuple(args, "feed", 2, 2, &record, &event))
        return PyObject_Call(self->feed, args, kwargs);
    PyObject *etype = (PyObject *)Py_TYPE(event);
    if (etype != self->summary_type && etype != self->allocated_type && etype != self->freed_type)
        return fallback(self, record, event);
    /* the event's own exact time (the vLLM plugin's `t=`), borrowed, or NULL: `_exact` */
    PyObject **p_at = attr_slot(event, &attrs_[E_at_ns], 0);
    if (p_at == NULL || *p_at == NULL || (*p_at != Py_None && !PyLong_CheckExact(*p_at)))
        return fallback(self, record, event);
    PyObject *at = *p_at == Py_None ? NULL : *p_at;
    if (etype == self->summary_type)
        return summary(self, record, event, at);
    int alloc = etype == self->allocated_type;
    if (!alloc && etype != self->freed_type)
        return fallback(self, record, event);

    PyObject **p_ts = attr_slot(record, &attrs_[R_ts_ns], 0), **p_off = attr_slot(record, &attrs_[R_offset], 0);
    PyObject **p_rid = attr_slot(event, &attrs_[E_request_id], 0), **p_block = attr_slot(event, &attrs_[E_block], 0);
    PyObject **p_extra = attr_slot(event, &attrs_[alloc ? E_size_bytes : E_reason], 0);
    if (!p_ts || !p_off || !p_rid || !p_block || !p_extra || !*p_ts || !*p_off || !*p_rid || !*p_block || !*p_extra ||
        !PyLong_CheckExact(*p_ts) || (!alloc && (!PyUnicode_Check(*p_block) || PyUnicode_GET_LENGTH(*p_block) == 0)))
        return fallback(self, record, event);  /* `Freed <n> blocks`: block "" and a count */
    PyObject *ts = *p_ts;

    int go = quiet(self, ts); /* feed(): no tick due, no NCCL timeout held */
    if (go <= 0)
        return go < 0 ? NULL : fallback(self, record, event);
    if (at != NULL)
        ts = at; /* _exact(): from here on the event's own time, as the handlers see it */

    /* _seed_id(): the id is open; _start(): and, for an allocation, not over */
    PyObject *r = PyDict_GetItemWithError(self->open, *p_rid);
    if (r == NULL) {
        if (PyErr_Occurred())
            return NULL;
        return fallback(self, record, event);
    }
    Py_INCREF(r);
    PyObject **terminal = attr_slot(r, &attrs_[S_terminal_ns], 1), **last_ns = attr_slot(r, &attrs_[S_last_ns], 1);
    PyObject **last_offset = attr_slot(r, &attrs_[S_last_offset], 1), **count = attr_slot(r, &attrs_[alloc ? S_allocated : S_freed], 1);
    PyObject **held = attr_slot(r, &attrs_[S_held], 1), **block_events = attr_slot(r, &attrs_[S_block_events], 1);
    PyObject **block_dropped = attr_slot(r, &attrs_[S_block_dropped], 1), **last_free = attr_slot(r, &attrs_[S_last_free_ns], 1);
    PyObject **outcome = attr_slot(r, &attrs_[S_outcome], 1), **extra = attr_slot(r, &attrs_[S_extra], 1);
    if (!terminal || !last_ns || !last_offset || !count || !held || !block_events || !block_dropped || !last_free ||
        !outcome || !extra || !*terminal || !*last_ns || !*last_offset || !*count || !*held || !*block_events ||
        !*block_dropped || !*last_free || !*outcome || !*extra || (alloc && *terminal != Py_None) ||
        (!alloc && *terminal != Py_None && *extra != Py_None) ||
        (*block_events != Py_None && !PyList_CheckExact(*block_events))) {
        Py_DECREF(r);
        return fallback(self, record, event);
    }
    if (!alloc && *terminal == Py_None) {
        int preempted = PyObject_RichCompareBool(*p_extra, v_preempted, Py_EQ);
        if (preempted <= 0) {
            Py_DECREF(r);
            return preempted < 0 ? NULL : fallback(self, record, event);
        }
    }

    /* The line is taken. */
    PyObject *result = NULL;
    int later = PyObject_RichCompareBool(ts, *last_ns, Py_GT);
    if (later < 0)
        goto done;
    if (later)
        Py_SETREF(*last_ns, Py_NewRef(ts));
    Py_SETREF(*last_offset, Py_NewRef(*p_off));
    if (add(count, 1) < 0 || add(held, alloc ? 1 : -1) < 0)
        goto done;
    PyObject *attrs = PyDict_New();
    if (attrs == NULL || PyDict_SetItem(attrs, k_id, *p_block) < 0 ||
        (alloc && PyDict_SetItem(attrs, k_size, *p_extra) < 0)) {
        Py_XDECREF(attrs);
        goto done;
    }
    if (!alloc) {
        int truth = PyObject_IsTrue(*p_extra);
        if (truth < 0 || (truth && PyDict_SetItem(attrs, k_reason, *p_extra) < 0)) {
            Py_DECREF(attrs);
            goto done;
        }
    }
    PyObject *ev = self->event_type->tp_alloc(self->event_type, 0);
    if (ev == NULL) {
        Py_DECREF(attrs);
        goto done;
    }
    *(PyObject **)((char *)ev + self->event_offsets[0]) = Py_NewRef(alloc ? n_allocated : n_freed);
    *(PyObject **)((char *)ev + self->event_offsets[1]) = Py_NewRef(ts);
    *(PyObject **)((char *)ev + self->event_offsets[2]) = attrs;
    /* RequestState.add_block_event */
    if (*block_events == Py_None) {
        PyObject *list = PyList_New(0);
        if (list == NULL) {
            Py_DECREF(ev);
            goto done;
        }
        Py_SETREF(*block_events, list);
    }
    int rc = PyList_GET_SIZE(*block_events) >= BLOCK_EVENTS_KEPT ? add(block_dropped, 1)
                                                                  : PyList_Append(*block_events, ev);
    Py_DECREF(ev);
    if (rc < 0)
        goto done;
    if (!alloc && *terminal != Py_None) {
        Py_SETREF(*last_free, Py_NewRef(ts));
        if (finish_drained(self, r, *held, *outcome, 1) < 0)
            goto done;
    }
    result = Py_NewRef(Py_None);
done:
    Py_DECREF(r);
    return result;
}

static PyObject *feeder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *assembler, *feed, *allocated, *freed, *span_event, *summary;
    if (!PyArg_ParseTuple(args, "OOOOOO", &assembler, &feed, &allocated, &freed, &span_event, &summary))
        return NULL;
    if (!PyType_Check(allocated) || !PyType_Check(freed) || !PyType_Check(span_event) || !PyType_Check(summary)) {
        PyErr_SetString(PyExc_TypeError,
                        "Feeder(assembler, feed, BlockAllocated, BlockFreed, SpanEvent, RequestSummary)");
        return NULL;
    }
    PyObject *open = PyObject_GetAttr(assembler, s_open);
    if (open == NULL)
        return NULL;
    if (!PyDict_CheckExact(open)) {
        Py_DECREF(open);
        PyErr_SetString(PyExc_TypeError, "assembler._open must be a dict");
        return NULL;
    }
    Feeder *self = (Feeder *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(open);
        return NULL;
    }
    static const char *fields[3] = {"name", "ts_ns", "attrs"};
    for (int k = 0; k < 3; k++) {
        PyObject *d = PyDict_GetItemString(((PyTypeObject *)span_event)->tp_dict, fields[k]);
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type) ||
            ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
            Py_DECREF(open);
            Py_DECREF(self);
            PyErr_Format(PyExc_TypeError, "SpanEvent.%s is not a slot", fields[k]);
            return NULL;
        }
        self->event_offsets[k] = ((PyMemberDescrObject *)d)->d_member->offset;
    }
    self->assembler = Py_NewRef(assembler);
    self->feed = Py_NewRef(feed);
    self->open = open;
    self->allocated_type = Py_NewRef(allocated);
    self->freed_type = Py_NewRef(freed);
    self->summary_type = Py_NewRef(summary);
    self->event_type = (PyTypeObject *)Py_NewRef(span_event);
    return (PyObject *)self;
}

static PyTypeObject FeederType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "bridge.assemble._fastfeed.Feeder",
    .tp_basicsize = sizeof(Feeder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = feeder_new,
    .tp_dealloc = (destructor)feeder_dealloc,
    .tp_traverse = (traverseproc)feeder_traverse,
    .tp_clear = (inquiry)feeder_clear,
    .tp_call = (ternaryfunc)feeder_call,
    .tp_doc = "Feeder(assembler, feed, BlockAllocated, BlockFreed, SpanEvent, RequestSummary): the assembler's feed, "
               "KV block and summary lines in C",
};

/* -- fan_out: a gauge event on every request in flight --------------------------------------------- */

#define EVENT_CAP 32 /* state.py */

/* fan_out(in_flight, event, low, high) -> bool: for each RequestState r of the dict, what
 * _on_queue / _on_gpu do: r.add_event(event, True); then, when `low` is not None, lower
 * r.min_free_ratio to it, and when `high` is not None, raise r.max_gpu_ratio to it (the same
 * comparisons). False, with nothing done, when a value is not a plain RequestState: the
 * caller then runs its Python loop. */
static PyObject *fan_out(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyDict_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "fan_out(in_flight: dict, event, low, high)");
        return NULL;
    }
    PyObject *states = args[0], *event = args[1], *low = args[2], *high = args[3];
    PyObject *key, *r;
    Py_ssize_t pos = 0;
    while (PyDict_Next(states, &pos, &key, &r)) { /* check first: all or nothing */
        PyObject **e = attr_slot(r, &attrs_[S_events], 1), **d = attr_slot(r, &attrs_[S_dropped], 1);
        PyObject **lo = attr_slot(r, &attrs_[S_min_free_ratio], 1), **hi = attr_slot(r, &attrs_[S_max_gpu_ratio], 1);
        if (!e || !d || !lo || !hi || !*e || !*d || !*lo || !*hi || (*e != Py_None && !PyList_CheckExact(*e)))
            Py_RETURN_FALSE;
    }
    pos = 0;
    while (PyDict_Next(states, &pos, &key, &r)) {
        Py_INCREF(r);
        PyObject **e = attr_slot(r, &attrs_[S_events], 1), **d = attr_slot(r, &attrs_[S_dropped], 1);
        PyObject **lo = attr_slot(r, &attrs_[S_min_free_ratio], 1), **hi = attr_slot(r, &attrs_[S_max_gpu_ratio], 1);
        int rc = 0;
        if (*e == Py_None) { /* add_event */
            PyObject *list = PyList_New(0);
            if (list == NULL)
                rc = -1;
            else
                Py_SETREF(*e, list);
        }
        if (rc == 0)
            rc = PyList_GET_SIZE(*e) >= EVENT_CAP ? add(d, 1) : PyList_Append(*e, event);
        if (rc == 0 && low != Py_None) {
            int lower = *lo == Py_None ? 1 : PyObject_RichCompareBool(low, *lo, Py_LT);
            if (lower < 0)
                rc = -1;
            else if (lower)
                Py_SETREF(*lo, Py_NewRef(low));
        }
        if (rc == 0 && high != Py_None) {
            int higher = *hi == Py_None ? 1 : PyObject_RichCompareBool(high, *hi, Py_GT);
            if (higher < 0)
                rc = -1;
            else if (higher)
                Py_SETREF(*hi, Py_NewRef(high));
        }
        Py_DECREF(r);
        if (rc < 0)
            return NULL;
    }
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"fan_out", (PyCFunction)(void (*)(void))fan_out, METH_FASTCALL,
     "fan_out(in_flight, event, low, high) -> bool: a gauge event on every request in flight"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastfeed", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastfeed(void) {
    for (int k = 0; k < N_ATTRS; k++)
        INTERN(attrs_[k].name, attrs_[k].text);
    INTERN(s_now, "_now");
    INTERN(s_next_sweep, "_next_sweep");
    INTERN(s_pending_nccl, "_pending_nccl");
    INTERN(s_open, "_open");
    INTERN(s_finish, "_finish");
    INTERN(k_id, "vllm.kv_block.id");
    INTERN(k_size, "vllm.kv_block.size_bytes");
    INTERN(k_reason, "vllm.kv_block.reason");
    INTERN(n_allocated, "vllm.kv_block.allocated");
    INTERN(n_freed, "vllm.kv_block.freed");
    INTERN(v_timeout, "timeout");
    INTERN(v_preempted, "preempted");
    INTERN(v_finished, "finished");
    if ((zero_int = PyLong_FromLong(0)) == NULL)
        return NULL;
    INTERN(s_in_flight, "_in_flight");
    if (PyType_Ready(&FeederType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Feeder", (PyObject *)&FeederType) < 0 ||
        PyModule_AddObject(m, "BEHIND_NS", PyLong_FromLongLong(BEHIND_NS)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
