/* The assemble stage's fast path: a finished request's state → its RequestTimeline.
 *
 * `request_timeline(r, source, thresholds, parent)` is build.py's `_request_timeline`
 * (with `_place_block_events`, `_request_attrs` and diagnosis.diagnose) statement for
 * statement, and returns an equal RequestTimeline built of the same objects: the same
 * SpanEvents, the same attribute values where Python reuses them, in the same order.
 * It returns None, and build.py then runs the Python function (the reference), whenever the
 * state holds anything but the plain types the pipeline puts there: a time that is not an int
 * of less than 62 bits, a duration or threshold that is not a float, a summary without an
 * end, ... so every odd case, and every error, stays Python's.
 */
#include "_native.h"
#include <math.h>
#include <stdint.h>

enum {
    A_summary, A_terminal_ns, A_last_ns, A_first_ns, A_outcome, A_timeout_after_s, A_schedules, A_preemptions,
    A_last_free_ns, A_events, A_dropped, A_block_events, A_block_dropped, A_request_id, A_occurrence,
    A_error_type, A_error_message, A_first_offset, A_last_offset, A_allocated, A_freed, A_queue_at_schedule,
    A_gpu_at_schedule, A_min_free_ratio, A_max_gpu_ratio, A_extra, A_sampled_preemptions,
    A_e2e_s, A_ttft_s, A_itl_s, A_prompt_tokens, A_generated_tokens,
    A_priority, A_blocks, A_remaining_blocks, A_queued_s, A_reason,
    A_running, A_waiting, A_free_blocks, A_total_blocks,
    A_used_bytes, A_total_bytes, A_utilization, A_kv_blocks_used, A_kv_blocks_total,
    A_t_ttft_s, A_t_itl_s, A_t_free_blocks_ratio, A_t_gpu_memory_ratio,
    A_ts_ns, A_source, A_release_ns,
    A_times, A_arrival_ns, A_first_token_ns, A_last_token_ns, A_scheduled_ns, A_seen, A_coarse_start, A_at_ns,
    N_ATTRS
};
static Attr attrs_[N_ATTRS] = {
    {"summary"}, {"terminal_ns"}, {"last_ns"}, {"first_ns"}, {"outcome"}, {"timeout_after_s"}, {"schedules"},
    {"preemptions"}, {"last_free_ns"}, {"events"}, {"dropped"}, {"block_events"}, {"block_dropped"},
    {"request_id"}, {"occurrence"}, {"error_type"}, {"error_message"}, {"first_offset"}, {"last_offset"},
    {"allocated"}, {"freed"}, {"queue_at_schedule"}, {"gpu_at_schedule"}, {"min_free_ratio"}, {"max_gpu_ratio"},
    {"extra"}, {"sampled_preemptions"},
    {"e2e_s"}, {"ttft_s"}, {"itl_s"}, {"prompt_tokens"}, {"generated_tokens"},
    {"priority"}, {"blocks"}, {"remaining_blocks"}, {"queued_s"}, {"reason"},
    {"running"}, {"waiting"}, {"free_blocks"}, {"total_blocks"},
    {"used_bytes"}, {"total_bytes"}, {"utilization"}, {"kv_blocks_used"}, {"kv_blocks_total"},
    {"ttft_s"}, {"itl_s"}, {"free_blocks_ratio"}, {"gpu_memory_ratio"},
    {"ts_ns"}, {"source"}, {"release_ns"},
    {"times"}, {"arrival_ns"}, {"first_token_ns"}, {"last_token_ns"}, {"scheduled_ns"}, {"seen"}, {"coarse_start"},
    {"at_ns"},
};
#define GET(obj, k) attr_get((obj), &attrs_[k])

/* -- construction of the timeline dataclasses ------------------------------------------------- */

static Cls phase_cls, timeline_cls;
static PyObject *REPORTED, *OBSERVED, *INFERRED;
static PyObject *s_preprocess, *s_queued, *s_prefill, *s_preempted, *s_decode, *s_freed, *s_timeout, *s_failed;
static PyObject *d_slow_ttft, *d_slow_itl, *d_memory_pressure, *d_gpu_memory_high, *d_preempted;
static int ready = 0;


/* -- values ----------------------------------------------------------------------------------------- */

#define LIMIT ((int64_t)1 << 61) /* times beyond it: declined (Python's ints never overflow) */
#define DECLINE 1

/* an exact int within ±LIMIT → *out; DECLINE otherwise */
static int i64(PyObject *v, int64_t *out) {
    if (v == NULL)
        return -1;
    if (!PyLong_CheckExact(v))
        return DECLINE;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (overflow || x >= LIMIT || x <= -LIMIT)
        return DECLINE;
    *out = x;
    return 0;
}

/* getattr that must be an int (new ref in *obj when wanted) */
static int get_i64(PyObject *o, int k, int64_t *out) {
    PyObject *v = GET(o, k);
    int r = i64(v, out);
    Py_XDECREF(v);
    return r;
}

/* an int attribute or None → *out, *has; DECLINE for anything else */
static int get_opt_i64(PyObject *o, int k, int64_t *out, int *has) {
    PyObject *v = GET(o, k);
    if (v == NULL)
        return -1;
    *has = v != Py_None;
    int r = *has ? i64(v, out) : 0;
    Py_DECREF(v);
    return r;
}

/* _ns(seconds) = round(seconds * 1e9), for a float; DECLINE when out of range */
static int ns_of(PyObject *v, int64_t *out) {
    if (v == NULL)
        return -1;
    if (!PyFloat_CheckExact(v))
        return DECLINE;
    double x = PyFloat_AS_DOUBLE(v) * 1e9;
    if (!isfinite(x) || fabs(x) >= (double)LIMIT)
        return DECLINE;
    double rnd = nearbyint(x); /* round half to even, as Python's round() */
    *out = (int64_t)rnd;
    return 0;
}

typedef struct {
    PyObject *name; /* borrowed constant */
    Py_ssize_t index;
    int64_t start, end;
    PyObject *st, *et; /* borrowed constants */
    PyObject *attrs;   /* owned dict or NULL (then a new empty dict) */
    PyObject *events;  /* owned list, created at placement */
    int64_t dropped;
} P;

static int64_t clamp(int64_t v, PyObject *timing, const int64_t *low, const int64_t *high, PyObject **out) {
    if (low != NULL && v < *low) {
        *out = INFERRED;
        return *low;
    }
    if (high != NULL && v > *high) {
        *out = INFERRED;
        return *high;
    }
    *out = timing;
    return v;
}

/* The interned str of an attribute key, by the address of its C literal (one lookup table:
 * PyDict_SetItemString would make and hash a new str every time). */
#define KEYS 128
static struct {
    const char *text;
    PyObject *str;
} keys[KEYS];

static PyObject *key_of(const char *text) {
    size_t h = ((size_t)text >> 3) % KEYS;
    for (size_t n = 0; n < KEYS; n++, h = (h + 1) % KEYS) {
        if (keys[h].text == text)
            return keys[h].str;
        if (keys[h].text == NULL) {
            PyObject *str = PyUnicode_InternFromString(text);
            if (str == NULL)
                return NULL;
            keys[h].text = text;
            keys[h].str = str;
            return str;
        }
    }
    PyErr_SetString(PyExc_SystemError, "_fastbuild: more keys than KEYS"); /* not reached */
    return NULL;
}

static int set_item(PyObject *d, const char *key, PyObject *v) { /* steals v */
    if (v == NULL)
        return -1;
    PyObject *k = key_of(key);
    int r = k == NULL ? -1 : PyDict_SetItem(d, k, v);
    Py_DECREF(v);
    return r;
}

static int set_attr_of(PyObject *d, const char *key, PyObject *obj, int k) {
    return set_item(d, key, GET(obj, k));
}

/* a float attribute or None → *out, *has; DECLINE for anything else */
static int opt_float(PyObject *v, double *out, int *has) {
    if (v == NULL)
        return -1;
    if (v == Py_None) {
        *has = 0;
        return 0;
    }
    if (!PyFloat_CheckExact(v))
        return DECLINE;
    *has = 1;
    *out = PyFloat_AS_DOUBLE(v);
    return 0;
}

/* stable insertion sort of a list of events by their ts_ns (list.sort(key=ts_ns)) */
static int sort_events(PyObject *list) {
    Py_ssize_t n = PyList_GET_SIZE(list);
    if (n < 2)
        return 0;
    int64_t stack_keys[128];
    int64_t *keys = n <= 128 ? stack_keys : PyMem_Malloc(n * sizeof(int64_t));
    if (keys == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int r = 0;
    for (Py_ssize_t i = 0; i < n && r == 0; i++)
        r = get_i64(PyList_GET_ITEM(list, i), A_ts_ns, &keys[i]);
    if (r == 0) {
        PyObject **items = ((PyListObject *)list)->ob_item;
        for (Py_ssize_t i = 1; i < n; i++) {
            int64_t k = keys[i];
            PyObject *it = items[i];
            Py_ssize_t j = i;
            while (j > 0 && keys[j - 1] > k) {
                keys[j] = keys[j - 1];
                items[j] = items[j - 1];
                j--;
            }
            keys[j] = k;
            items[j] = it;
        }
    }
    if (keys != stack_keys)
        PyMem_Free(keys);
    return r;
}

/* -- the function ------------------------------------------------------------------------------------ */

static Py_ssize_t EVENT_CAP = 0; /* state.py's, given at init: one source */
#define MAX_PHASES 64 /* more preemptions than this: declined */

#define TRY(expr)                  \
    do {                           \
        rc = (expr);               \
        if (rc != 0)               \
            goto done;             \
    } while (0)
#define NEED(ptr)                  \
    do {                           \
        if ((ptr) == NULL) {       \
            rc = -1;               \
            goto done;             \
        }                          \
    } while (0)
#define DECLINE_IF(cond)           \
    do {                           \
        if (cond) {                \
            rc = DECLINE;          \
            goto done;             \
        }                          \
    } while (0)

static PyObject *request_timeline(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "request_timeline(r, source, thresholds, parent)");
        return NULL;
    }
    if (!ready) {
        PyErr_SetString(PyExc_RuntimeError, "init() first");
        return NULL;
    }
    PyObject *r = args[0], *source = args[1], *th = args[2], *parent = args[3];
    int rc = 0;
    P ph[MAX_PHASES];
    int np = 0;
    PyObject *s = NULL, *terminal = NULL, *outcome = NULL, *schedules = NULL, *preemptions = NULL;
    PyObject *first = NULL, *root_events = NULL, *attrs = NULL, *block_events = NULL, *tmp = NULL;
    PyObject *q = NULL, *g = NULL, *extra = NULL, *result = NULL, *found = NULL, *times = NULL;

    int64_t terminal_ns = 0, last_ns, first_ns, end;
    int has_terminal;
    NEED(s = GET(r, A_summary));
    NEED(terminal = GET(r, A_terminal_ns));
    has_terminal = terminal != Py_None;
    if (has_terminal)
        TRY(i64(terminal, &terminal_ns));
    TRY(get_i64(r, A_last_ns, &last_ns));
    TRY(get_i64(r, A_first_ns, &first_ns));
    NEED(outcome = GET(r, A_outcome));
    DECLINE_IF(!PyUnicode_CheckExact(outcome));
    end = has_terminal ? terminal_ns : last_ns;
    PyObject *end_timing = has_terminal ? OBSERVED : INFERRED;

    int has_arrival = 0, has_ft = 0;
    int64_t arrival = 0, first_token = 0;
    PyObject *ft_timing = REPORTED;
    double ttft_s = 0, itl_s = 0;
    if (s != Py_None) {
        int64_t e2e, ttft;
        DECLINE_IF(!has_terminal);
        PyObject *v;
        NEED(v = GET(s, A_e2e_s));
        rc = ns_of(v, &e2e);
        Py_DECREF(v);
        if (rc)
            goto done;
        NEED(v = GET(s, A_ttft_s));
        rc = ns_of(v, &ttft);
        if (rc == 0)
            ttft_s = PyFloat_AS_DOUBLE(v);
        Py_DECREF(v);
        if (rc)
            goto done;
        NEED(v = GET(s, A_itl_s));
        rc = PyFloat_CheckExact(v) ? 0 : DECLINE;
        if (rc == 0)
            itl_s = PyFloat_AS_DOUBLE(v);
        Py_DECREF(v);
        if (rc)
            goto done;
        arrival = terminal_ns - e2e;
        if (arrival < 0)
            arrival = 0;
        has_arrival = 1;
        first_token = clamp(arrival + ttft, REPORTED, NULL, &terminal_ns, &ft_timing);
        has_ft = 1;
    } else {
        int t = PyUnicode_Compare(outcome, s_timeout) == 0;
        if (t) {
            PyObject *after = GET(r, A_timeout_after_s);
            NEED(after);
            if (after != Py_None) {
                int64_t a;
                rc = ns_of(after, &a);
                if (rc == 0 && !has_terminal)
                    rc = DECLINE;
                if (rc == 0) {
                    arrival = terminal_ns - a;
                    if (arrival < 0)
                        arrival = 0;
                    has_arrival = 1;
                }
            }
            Py_DECREF(after);
            if (rc)
                goto done;
        }
    }

    /* vLLM's own stamps (the plugin's end line): exact boundaries */
    int has_lt = 0, has_t_ft = 0, has_t_lt = 0, has_t_sched = 0;
    int64_t last_token = 0, t_ft = 0, t_lt = 0, t_sched = 0;
    NEED(times = GET(r, A_times));
    if (times != Py_None) {
        int64_t t_arrival;
        int has_t_arrival;
        TRY(get_opt_i64(times, A_arrival_ns, &t_arrival, &has_t_arrival));
        TRY(get_opt_i64(times, A_first_token_ns, &t_ft, &has_t_ft));
        TRY(get_opt_i64(times, A_last_token_ns, &t_lt, &has_t_lt));
        TRY(get_opt_i64(times, A_scheduled_ns, &t_sched, &has_t_sched));
        if (has_t_arrival && (!has_terminal || t_arrival <= terminal_ns)) {
            arrival = t_arrival;
            has_arrival = 1;
        }
        if (has_t_ft) {
            /* vLLM's first NEW_TOKEN stamp: prefill ends there */
            first_token = clamp(t_ft, OBSERVED, NULL, has_terminal ? &terminal_ns : NULL, &ft_timing);
            has_ft = 1;
            if (has_t_lt) {
                PyObject *unused;
                last_token = clamp(t_lt, OBSERVED, &first_token, has_terminal ? &terminal_ns : NULL, &unused);
                has_lt = 1;
            }
        }
    }

    int has_sched = 0;
    int64_t sched0 = 0;
    PyObject *sched_timing = NULL;
    Py_ssize_t n_sched = 0;
    NEED(schedules = GET(r, A_schedules));
    if (schedules != Py_None) {
        DECLINE_IF(!PyList_CheckExact(schedules));
        n_sched = PyList_GET_SIZE(schedules);
    }
    if (n_sched > 0) {
        PyObject *pair = PyList_GET_ITEM(schedules, 0);
        DECLINE_IF(!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2);
        int64_t ts;
        TRY(i64(PyTuple_GET_ITEM(pair, 0), &ts));
        first = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
        int64_t high = has_ft ? first_token : end;
        sched0 = clamp(ts, OBSERVED, has_arrival ? &arrival : NULL, &high, &sched_timing);
        has_sched = 1;
    }

    /* the engine's own arrival: the plugin's exact first schedule less the engine's queue time */
    int has_engine_in = 0, start_inferred = 0;
    int64_t engine_in = 0;
    PyObject *engine_in_timing = NULL;
    if (has_sched && sched_timing == OBSERVED) {
        NEED(tmp = GET(first, A_at_ns));
        int at_none = tmp == Py_None;
        Py_CLEAR(tmp);
        if (!at_none) {
            NEED(tmp = GET(first, A_queued_s));
            if (tmp != Py_None) {
                int64_t queued;
                TRY(ns_of(tmp, &queued));
                engine_in = clamp(sched0 - queued, OBSERVED, has_arrival ? &arrival : NULL, &sched0, &engine_in_timing);
                has_engine_in = 1;
            }
            Py_CLEAR(tmp);
        }
    }
    if (!has_arrival && has_engine_in) {
        NEED(tmp = GET(r, A_coarse_start));
        DECLINE_IF(tmp != Py_True && tmp != Py_False);
        int coarse = tmp == Py_True;
        Py_CLEAR(tmp);
        if (coarse && first_ns <= engine_in && engine_in < first_ns + 1000000000LL) {
            first_ns = engine_in; /* the receipt said its second only: the root starts at the engine's arrival */
            start_inferred = 1;
        }
    }
    if (has_engine_in) {
        int64_t seen;
        TRY(get_i64(r, A_seen, &seen));
        if ((has_arrival || seen) && (has_arrival ? arrival : first_ns) < engine_in)
            ph[np++] = (P){s_preprocess, 0, has_arrival ? arrival : first_ns, engine_in, has_arrival ? REPORTED : OBSERVED,
                           engine_in_timing};
        if (has_arrival && arrival - 1000000000LL < first_ns)
            first_ns = arrival;
        ph[np++] = (P){s_queued, 0, engine_in, sched0, engine_in_timing, sched_timing};
    } else if (has_arrival && (has_sched || PyUnicode_Compare(outcome, s_timeout) == 0 ||
                               PyUnicode_Compare(outcome, s_failed) == 0)) {
        P *p = &ph[np++];
        *p = (P){s_queued, 0, arrival, has_sched ? sched0 : end, REPORTED, has_sched ? sched_timing : INFERRED};
    }
    if (has_sched) {
        P *p = &ph[np++];
        *p = (P){s_prefill, 0, sched0, 0, sched_timing, NULL};
        NEED(p->attrs = PyDict_New());
        TRY(set_attr_of(p->attrs, "vllm.scheduling.priority", first, A_priority));
        NEED(tmp = GET(first, A_blocks));
        int no_blocks = tmp == Py_None; /* the plugin's end line: the engine core's lines, which count them, off */
        Py_CLEAR(tmp);
        if (!no_blocks) {
            TRY(set_attr_of(p->attrs, "vllm.scheduling.blocks", first, A_blocks));
            TRY(set_attr_of(p->attrs, "vllm.scheduling.remaining_blocks", first, A_remaining_blocks));
        }
        if (n_sched > 1)
            TRY(set_item(p->attrs, "vllm.scheduling.count", PyLong_FromSsize_t(n_sched)));
        if (has_ft) {
            p->end = first_token;
            p->et = ft_timing;
        } else {
            p->end = sched0 > end ? sched0 : end;
            p->et = INFERRED;
        }
    }
    int64_t low = has_arrival ? arrival : first_ns;
    NEED(preemptions = GET(r, A_preemptions));
    if (preemptions != Py_None) {
        DECLINE_IF(!PyList_CheckExact(preemptions));
        Py_ssize_t n = PyList_GET_SIZE(preemptions);
        DECLINE_IF(n > MAX_PHASES - 5);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *entry = PyList_GET_ITEM(preemptions, i);
            DECLINE_IF(!PyList_CheckExact(entry) || PyList_GET_SIZE(entry) != 3);
            int64_t p_start, p_end;
            TRY(i64(PyList_GET_ITEM(entry, 0), &p_start));
            PyObject *pe = PyList_GET_ITEM(entry, 1), *ev = PyList_GET_ITEM(entry, 2);
            P *p = &ph[np++];
            *p = (P){s_preempted, i};
            p->start = clamp(p_start, OBSERVED, &low, &end, &p->st);
            if (pe == Py_None) {
                p->end = p->start > end ? p->start : end;
                p->et = INFERRED;
            } else {
                TRY(i64(pe, &p_end));
                p->end = clamp(p_end, OBSERVED, &p->start, NULL, &p->et);
            }
            NEED(p->attrs = PyDict_New());
            NEED(tmp = GET(ev, A_blocks));
            int no_blocks = tmp == Py_None; /* the plugin's stamps: no reason or blocks */
            Py_CLEAR(tmp);
            if (!no_blocks) {
                TRY(set_attr_of(p->attrs, "vllm.preemption.reason", ev, A_reason));
                TRY(set_attr_of(p->attrs, "vllm.preemption.blocks", ev, A_blocks));
            }
        }
    }
    if (s != Py_None) {
        P *p = &ph[np++];
        *p = (P){s_decode, 0, first_token, has_lt ? last_token : terminal_ns, ft_timing, OBSERVED};
        NEED(p->attrs = PyDict_New());
        TRY(set_attr_of(p->attrs, "gen_ai.usage.output_tokens", s, A_generated_tokens));
        TRY(set_attr_of(p->attrs, "vllm.itl_s", s, A_itl_s));
    } else if (has_ft && has_lt) { /* ended (aborted) after its first token */
        ph[np++] = (P){s_decode, 0, first_token, last_token, ft_timing, OBSERVED};
    }
    if (has_terminal) {
        /* build.py: freed from the end's line, or from the release when that came first */
        PyObject *lf = GET(r, A_last_free_ns);
        NEED(lf);
        if (lf != Py_None) {
            int64_t last_free, release = 0, free_start = terminal_ns;
            PyObject *rel = GET(r, A_release_ns);
            rc = rel == NULL ? -1 : i64(lf, &last_free);
            if (rc == 0 && rel != Py_None) {
                rc = i64(rel, &release);
                if (rc == 0 && release < terminal_ns)
                    free_start = release;
            }
            Py_XDECREF(rel);
            if (rc == 0) {
                P *p = &ph[np++];
                *p = (P){s_freed, 0, free_start, last_free, OBSERVED, OBSERVED};
            }
        }
        Py_DECREF(lf);
        if (rc)
            goto done;
    }

    /* A first line stamped in the whole second before the reported arrival: that second truncated. */
    if (has_arrival && first_ns % 1000000000LL == 0 && arrival - 1000000000LL < first_ns && first_ns < arrival)
        first_ns = arrival;
    int64_t start = low < first_ns ? low : first_ns, stop = end > last_ns ? end : last_ns;
    for (int i = 0; i < np; i++) {
        if (ph[i].start < start)
            start = ph[i].start;
        if (ph[i].end > stop)
            stop = ph[i].end;
    }
    for (int i = 0; i < np; i++) {
        if (ph[i].end < ph[i].start) {
            ph[i].end = ph[i].start;
            ph[i].et = INFERRED;
        }
    }

    /* root events, then KV block events placed on their phase */
    int64_t dropped;
    NEED(tmp = GET(r, A_events));
    if (tmp == Py_None)
        root_events = PyList_New(0);
    else if (PyList_CheckExact(tmp))
        root_events = PyList_GetSlice(tmp, 0, PyList_GET_SIZE(tmp));
    else
        DECLINE_IF(1);
    NEED(root_events);
    Py_CLEAR(tmp);
    TRY(get_i64(r, A_dropped, &dropped));
    for (int i = 0; i < np; i++)
        NEED(ph[i].events = PyList_New(0));
    NEED(block_events = GET(r, A_block_events));
    if (block_events != Py_None) {
        DECLINE_IF(!PyList_CheckExact(block_events));
        int order[MAX_PHASES], nc = 0;
        PyObject *placement[5] = {s_freed, s_preempted, s_decode, s_prefill, s_queued};
        for (int k = 0; k < 5; k++)
            for (int i = 0; i < np; i++)
                if (ph[i].name == placement[k])
                    order[nc++] = i;
        int root_blocks = 0;
        for (Py_ssize_t k = 0; k < PyList_GET_SIZE(block_events); k++) {
            PyObject *e = PyList_GET_ITEM(block_events, k);
            int64_t ts;
            TRY(get_i64(e, A_ts_ns, &ts));
            int target = -1;
            for (int c = 0; c < nc; c++) {
                P *p = &ph[order[c]];
                if ((p->start <= ts && ts < p->end) || (ts == p->end && p->name == s_freed)) {
                    target = order[c];
                    break;
                }
            }
            if (target < 0) {
                if (root_blocks < EVENT_CAP) {
                    if (PyList_Append(root_events, e) < 0)
                        NEED(NULL);
                    root_blocks++;
                } else {
                    dropped++;
                }
            } else if (PyList_GET_SIZE(ph[target].events) < EVENT_CAP) {
                if (PyList_Append(ph[target].events, e) < 0)
                    NEED(NULL);
            } else {
                ph[target].dropped++;
            }
        }
    }
    int64_t block_dropped;
    TRY(get_i64(r, A_block_dropped, &block_dropped));
    dropped += block_dropped;

    /* _request_attrs */
    NEED(attrs = PyDict_New());
    TRY(set_attr_of(attrs, "vllm.request.id", r, A_request_id));
    TRY(set_item(attrs, "vllm.outcome", Py_NewRef(outcome)));
    if (s != Py_None) {
        TRY(set_attr_of(attrs, "gen_ai.usage.input_tokens", s, A_prompt_tokens));
        TRY(set_attr_of(attrs, "gen_ai.usage.output_tokens", s, A_generated_tokens));
        TRY(set_attr_of(attrs, "vllm.ttft_s", s, A_ttft_s));
        TRY(set_attr_of(attrs, "vllm.itl_s", s, A_itl_s));
        TRY(set_attr_of(attrs, "vllm.e2e_s", s, A_e2e_s));
        TRY(set_attr_of(attrs, "gen_ai.latency.time_to_first_token", s, A_ttft_s));
        TRY(set_attr_of(attrs, "gen_ai.latency.e2e", s, A_e2e_s));
    }
    PyObject *queue_s = NULL;
    if (has_arrival && has_sched) {
        int64_t diff = sched0 - arrival;
        DECLINE_IF(diff >= ((int64_t)1 << 53) || diff <= -((int64_t)1 << 53));
        queue_s = PyFloat_FromDouble((double)diff / 1e9); /* int / int: exact operands, one rounding */
        NEED(queue_s);
        Py_INCREF(queue_s);
        TRY(set_item(attrs, "vllm.queue_s", queue_s));
    }
    PyObject *engine_queue = NULL;
    if (n_sched > 0) {
        engine_queue = GET(first, A_queued_s);
        if (engine_queue == NULL) {
            Py_XDECREF(queue_s);
            NEED(NULL);
        }
        if (engine_queue == Py_None)
            Py_CLEAR(engine_queue);
        else
            rc = set_item(attrs, "vllm.engine_queue_s", Py_NewRef(engine_queue));
    }
    if (rc == 0) {
        PyObject *in_queue = engine_queue != NULL ? engine_queue : queue_s;
        if (in_queue != NULL)
            rc = set_item(attrs, "gen_ai.latency.time_in_queue", Py_NewRef(in_queue));
    }
    Py_XDECREF(queue_s);
    Py_XDECREF(engine_queue);
    if (rc)
        goto done;
    if (times != Py_None && has_t_sched && has_t_ft) {
        /* vLLM's native-tracing intervals, from the same stamps */
        int64_t diffs[3] = {t_ft - t_sched, t_lt - t_ft, t_lt - t_sched};
        const char *keys[3] = {"gen_ai.latency.time_in_model_prefill", "gen_ai.latency.time_in_model_decode",
                               "gen_ai.latency.time_in_model_inference"};
        for (int k = 0; k < (has_t_lt ? 3 : 1); k++) {
            DECLINE_IF(diffs[k] >= ((int64_t)1 << 53) || diffs[k] <= -((int64_t)1 << 53));
            TRY(set_item(attrs, keys[k], PyFloat_FromDouble((double)diffs[k] / 1e9)));
        }
    }
    int64_t sampled, n_preempted;
    TRY(get_i64(r, A_sampled_preemptions, &sampled));
    n_preempted = (preemptions != Py_None ? PyList_GET_SIZE(preemptions) : 0) + sampled;
    TRY(set_item(attrs, "vllm.preemptions", PyLong_FromLongLong(n_preempted)));
    TRY(set_attr_of(attrs, "vllm.kv_blocks", r, A_allocated));
    TRY(set_attr_of(attrs, "vllm.kv_blocks.freed", r, A_freed));
    PyObject *error_type = GET(r, A_error_type);
    NEED(error_type);
    if (error_type != Py_None)
        rc = set_item(attrs, "error.type", Py_NewRef(error_type));
    Py_DECREF(error_type);
    if (rc)
        goto done;
    NEED(q = GET(r, A_queue_at_schedule));
    NEED(g = GET(r, A_gpu_at_schedule));
    int64_t free_blocks = 0, total_blocks = 0;
    double utilization = 0;
    if (q != Py_None) {
        TRY(set_attr_of(attrs, "vllm.queue.running", q, A_running));
        TRY(set_attr_of(attrs, "vllm.queue.waiting", q, A_waiting));
        TRY(set_attr_of(attrs, "vllm.kv.free_blocks", q, A_free_blocks));
        TRY(set_attr_of(attrs, "vllm.kv.total_blocks", q, A_total_blocks));
        TRY(get_i64(q, A_free_blocks, &free_blocks));
        TRY(get_i64(q, A_total_blocks, &total_blocks));
        DECLINE_IF(free_blocks >= ((int64_t)1 << 53) || free_blocks <= -((int64_t)1 << 53) ||
                   total_blocks >= ((int64_t)1 << 53) || total_blocks <= -((int64_t)1 << 53));
    }
    if (g != Py_None) {
        TRY(set_attr_of(attrs, "vllm.gpu.memory.used_bytes", g, A_used_bytes));
        TRY(set_attr_of(attrs, "vllm.gpu.memory.total_bytes", g, A_total_bytes));
        TRY(set_attr_of(attrs, "vllm.gpu.memory.utilization", g, A_utilization));
        TRY(set_attr_of(attrs, "vllm.kv_cache.blocks_used", g, A_kv_blocks_used));
        TRY(set_attr_of(attrs, "vllm.kv_cache.blocks_total", g, A_kv_blocks_total));
        PyObject *u = GET(g, A_utilization);
        int has;
        rc = opt_float(u, &utilization, &has);
        Py_XDECREF(u);
        if (rc == 0 && !has)
            rc = DECLINE;
        if (rc)
            goto done;
    }
    double min_free = 0, max_gpu = 0;
    int has_min_free, has_max_gpu;
    NEED(tmp = GET(r, A_min_free_ratio));
    TRY(opt_float(tmp, &min_free, &has_min_free));
    Py_CLEAR(tmp);
    NEED(tmp = GET(r, A_max_gpu_ratio));
    TRY(opt_float(tmp, &max_gpu, &has_max_gpu));
    Py_CLEAR(tmp);
    if (q != Py_None && total_blocks != 0) {
        double ratio = (double)free_blocks / (double)total_blocks;
        if (!has_min_free || ratio < min_free)
            min_free = ratio;
        has_min_free = 1;
    }
    if (g != Py_None) {
        if (!has_max_gpu || utilization > max_gpu)
            max_gpu = utilization;
        has_max_gpu = 1;
    }
    double t_ttft, t_itl, t_free, t_gpu;
    int has;
    int th_keys[4] = {A_t_ttft_s, A_t_itl_s, A_t_free_blocks_ratio, A_t_gpu_memory_ratio};
    double *th_vals[4] = {&t_ttft, &t_itl, &t_free, &t_gpu};
    for (int k = 0; k < 4; k++) {
        NEED(tmp = GET(th, th_keys[k]));
        TRY(opt_float(tmp, th_vals[k], &has));
        DECLINE_IF(!has);
        Py_CLEAR(tmp);
    }
    NEED(found = PyList_New(0));
    if (s != Py_None && ttft_s > t_ttft && PyList_Append(found, d_slow_ttft) < 0)
        NEED(NULL);
    if (s != Py_None && itl_s > t_itl && PyList_Append(found, d_slow_itl) < 0)
        NEED(NULL);
    if (has_min_free && min_free < t_free && PyList_Append(found, d_memory_pressure) < 0)
        NEED(NULL);
    if (has_max_gpu && max_gpu > t_gpu && PyList_Append(found, d_gpu_memory_high) < 0)
        NEED(NULL);
    if (n_preempted && PyList_Append(found, d_preempted) < 0)
        NEED(NULL);
    if (PyList_GET_SIZE(found) > 0)
        TRY(set_item(attrs, "vllm.diagnosis", Py_NewRef(found)));
    NEED(extra = GET(r, A_extra));
    if (extra != Py_None) {
        int truth = PyObject_IsTrue(extra);
        NEED(truth < 0 ? NULL : extra);
        if (truth)
            TRY(PyDict_Update(attrs, extra));
    }

    int inferred = start_inferred || end_timing == INFERRED;
    for (int i = 0; i < np && !inferred; i++)
        inferred = ph[i].st == INFERRED || ph[i].et == INFERRED;
    TRY(set_item(attrs, "vllm.timing", Py_NewRef(inferred ? INFERRED : has_arrival ? REPORTED : OBSERVED)));
    TRY(sort_events(root_events));
    if (parent != Py_None)
        TRY(set_attr_of(attrs, "vllm.trace_context", parent, A_source));

    /* the phases, then the timeline */
    PyObject *phases = PyList_New(np);
    NEED(phases);
    for (int i = 0; i < np; i++) {
        P *p = &ph[i];
        PyObject *v[9] = {Py_NewRef(p->name), PyLong_FromSsize_t(p->index), PyLong_FromLongLong(p->start),
                          PyLong_FromLongLong(p->end), Py_NewRef(p->st), Py_NewRef(p->et),
                          p->attrs ? Py_NewRef(p->attrs) : PyDict_New(), Py_NewRef(p->events),
                          PyLong_FromLongLong(p->dropped)};
        PyObject *obj = phase_cls.n == 9 ? cls_make(&phase_cls, v) : NULL;
        if (obj == NULL) {
            Py_DECREF(phases);
            NEED(NULL);
        }
        PyList_SET_ITEM(phases, i, obj);
    }
    PyObject *v[18] = {
        Py_NewRef(source), GET(r, A_request_id), GET(r, A_occurrence), PyLong_FromLongLong(start),
        PyLong_FromLongLong(stop), Py_NewRef(start_inferred ? INFERRED : has_arrival && arrival <= first_ns ? REPORTED : OBSERVED),
        Py_NewRef(end_timing), Py_NewRef(outcome), GET(r, A_error_type), GET(r, A_error_message),
        Py_NewRef(attrs), Py_NewRef(root_events), PyLong_FromLongLong(dropped), phases,
        GET(r, A_first_offset), GET(r, A_last_offset), Py_NewRef(parent), Py_NewRef(Py_None),
    };
    result = timeline_cls.n == 18 ? cls_make(&timeline_cls, v) : NULL;
    if (result == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "RequestTimeline changed shape");
    rc = result == NULL ? -1 : 0;

done:
    for (int i = 0; i < np; i++) {
        Py_XDECREF(ph[i].attrs);
        Py_XDECREF(ph[i].events);
    }
    Py_XDECREF(s);
    Py_XDECREF(terminal);
    Py_XDECREF(outcome);
    Py_XDECREF(schedules);
    Py_XDECREF(preemptions);
    Py_XDECREF(first);
    Py_XDECREF(root_events);
    Py_XDECREF(attrs);
    Py_XDECREF(block_events);
    Py_XDECREF(tmp);
    Py_XDECREF(q);
    Py_XDECREF(g);
    Py_XDECREF(extra);
    Py_XDECREF(found);
    Py_XDECREF(times);
    if (rc == DECLINE) {
        Py_XDECREF(result);
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    if (rc != 0) {
        Py_XDECREF(result);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_SystemError, "_fastbuild: error without exception");
        return NULL;
    }
    return result;
}

static PyObject *init(PyObject *self, PyObject *args) {
    PyObject *phase, *timeline, *reported, *observed, *inferred;
    Py_ssize_t event_cap;
    if (!PyArg_ParseTuple(args, "OOUUUn", &phase, &timeline, &reported, &observed, &inferred, &event_cap))
        return NULL;
    if (event_cap < 1) {
        PyErr_SetString(PyExc_ValueError, "EVENT_CAP must be at least 1");
        return NULL;
    }
    EVENT_CAP = event_cap;
    if (cls_load(&phase_cls, phase) < 0 || cls_load(&timeline_cls, timeline) < 0)
        return NULL;
    if (phase_cls.n != 9 || timeline_cls.n != 18) {
        PyErr_SetString(PyExc_TypeError, "Phase or RequestTimeline changed shape: update _fastbuild.c");
        return NULL;
    }
    Py_XSETREF(REPORTED, Py_NewRef(reported));
    Py_XSETREF(OBSERVED, Py_NewRef(observed));
    Py_XSETREF(INFERRED, Py_NewRef(inferred));
    ready = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"init", init, METH_VARARGS, "init(Phase, RequestTimeline, REPORTED, OBSERVED, INFERRED, EVENT_CAP)"},
    {"request_timeline", (PyCFunction)(void (*)(void))request_timeline, METH_FASTCALL,
     "request_timeline(r, source, thresholds, parent) -> RequestTimeline, or None (use the Python one)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastbuild", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastbuild(void) {
    for (int k = 0; k < N_ATTRS; k++)
        INTERN(attrs_[k].name, attrs_[k].text);
    INTERN(s_preprocess, "preprocess");
    INTERN(s_queued, "queued");
    INTERN(s_prefill, "prefill");
    INTERN(s_preempted, "preempted");
    INTERN(s_decode, "decode");
    INTERN(s_freed, "freed");
    INTERN(s_timeout, "timeout");
    INTERN(s_failed, "failed");
    INTERN(d_slow_ttft, "slow_ttft");
    INTERN(d_slow_itl, "slow_itl");
    INTERN(d_memory_pressure, "memory_pressure");
    INTERN(d_gpu_memory_high, "gpu_memory_high");
    INTERN(d_preempted, "preempted");
    return PyModule_Create(&module);
}
