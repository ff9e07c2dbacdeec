/* The seed dialect's commonest rules in C: the parse stage's fast path.
 *
 * `parse(message, counts)` returns the event `seed.py` would return for a message matched by
 * one of the seed rules below (block alloc / free, scheduling, preemption, request summary,
 * queue and GPU gauges), after adding 1 to `counts[kind]`; or None, and then the caller runs
 * the pure-Python `parse_line`, which stays the reference.
 *
 * Equivalence is by construction: only ASCII messages are looked at, and each rule follows the
 * path its regex tries first (greedy quantifiers, optional groups present, alternatives in
 * order). A rule that does not match on that path answers None, never "malformed", so every
 * doubtful line (backtracking, non-ASCII digits or spaces, an overflowing number, ...) goes to
 * the regexes. Numbers are converted as Python does: int() of the digits, float() of the text
 * through PyOS_string_to_double, then the same division or multiplication.
 *
 * Events are the dataclasses of bridge/parse/events.py: allocated by their type and their slots
 * filled directly (a frozen dataclass's __init__ goes through object.__setattr__, the slowest
 * part of building one). `init(classes)` gives the classes.
 */
#include "_native.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    Cls cls;        /* the event dataclass (bridge/_native.h) */
    PyObject *kind; /* counter key */
} EventClass;

enum { SUMMARY, SCHEDULED, PREEMPTED, QUEUE, ALLOCATED, FREED, GPU, ACCESS, N_CLASSES };
static const char *class_names[N_CLASSES] = {
    "RequestSummary", "Scheduled", "Preempted", "QueueState", "BlockAllocated", "BlockFreed", "GpuMemory", "AccessLog",
};
static EventClass classes[N_CLASSES];
static int ready = 0;
static PyObject *empty_str, *lines_str, *kind_str, *one_int;

/* The class, and its counter key from events.KIND (`kinds`): the names are written once, there. */
static int load_class(EventClass *c, PyObject *cls, PyObject *kinds) {
    if (cls_load(&c->cls, cls) < 0)
        return -1;
    PyObject *kind = PyDict_GetItemWithError(kinds, cls);
    if (kind == NULL || !PyUnicode_CheckExact(kind)) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "KIND has no name for %R", cls);
        return -1;
    }
    Py_XSETREF(c->kind, Py_NewRef(kind));
    return 0;
}

/* counts[kind] += 1 */
static int bump(PyObject *counts, PyObject *kind) {
    PyObject *n = PyDict_GetItemWithError(counts, kind);
    if (n == NULL && PyErr_Occurred())
        return -1;
    PyObject *next = n == NULL ? PyLong_FromLong(1) : PyNumber_Add(n, one_int);
    int rc = next == NULL ? -1 : PyDict_SetItem(counts, kind, next);
    Py_XDECREF(next);
    return rc;
}

/* A new instance with its slots set from `values` (references stolen, NULL on error). A class
 * whose fields are not the `n` values a rule makes (a field added in Python, not here) is
 * declined: Py_None, borrowed, and the Python rules answer. */
#define MAKE(cls, v) make((cls), (v), (int)(sizeof(v) / sizeof((v)[0])))
static PyObject *make(EventClass *c, PyObject **values, int n) {
    if (n != c->cls.n) {
        for (int i = 0; i < n; i++)
            Py_XDECREF(values[i]);
        return Py_None;
    }
    return cls_make(&c->cls, values);
}

/* -- a cursor over an ASCII message ------------------------------------------------------ */

typedef struct {
    const char *s;
    Py_ssize_t n, i;
} Cur;

typedef struct {
    Py_ssize_t a, b; /* [a, b) */
} Span;

static inline int is_space(unsigned char c) { /* Python's `\s` on ASCII */
    return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f);
}
static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static inline int lit(Cur *c, const char *text, Py_ssize_t len) {
    if (c->n - c->i < len || memcmp(c->s + c->i, text, len) != 0)
        return 0;
    c->i += len;
    return 1;
}
#define LIT(c, text) lit((c), (text), (Py_ssize_t)sizeof(text) - 1)

/* `([^\s:,]+)` */
static int id_(Cur *c, Span *sp) {
    Py_ssize_t i = c->i;
    while (i < c->n) {
        unsigned char ch = c->s[i];
        if (is_space(ch) || ch == ':' || ch == ',')
            break;
        i++;
    }
    if (i == c->i)
        return 0;
    sp->a = c->i;
    sp->b = c->i = i;
    return 1;
}

/* `([^,\s]+)`: ':' allowed */
static int reason_(Cur *c, Span *sp) {
    Py_ssize_t i = c->i;
    while (i < c->n && !is_space((unsigned char)c->s[i]) && c->s[i] != ',')
        i++;
    if (i == c->i)
        return 0;
    sp->a = c->i;
    sp->b = c->i = i;
    return 1;
}

/* `(\S+)` */
static int nonspace(Cur *c, Span *sp) {
    Py_ssize_t i = c->i;
    while (i < c->n && !is_space((unsigned char)c->s[i]))
        i++;
    if (i == c->i)
        return 0;
    sp->a = c->i;
    sp->b = c->i = i;
    return 1;
}

/* The bounds of bridge/parse/numbers.py: a number near one is declined (the line goes to the
 * Python rules, which count it malformed when it is out). 18 digits always fit int64. */
#define MAX_DIGITS 18
#define MAX_DURATION_S (30 * 86400.0)
#define INT64_LIMIT 9223372036854775808.0 /* 2^63 */

/* `(\d+)`, with an optional leading '-' when `sign`; no match beyond MAX_DIGITS digits */
static int digits(Cur *c, Span *sp, int sign) {
    Py_ssize_t i = c->i;
    if (sign && i < c->n && c->s[i] == '-')
        i++;
    Py_ssize_t d = i;
    while (i < c->n && is_digit(c->s[i]))
        i++;
    if (i == d || i - d > MAX_DIGITS)
        return 0;
    sp->a = c->i;
    sp->b = c->i = i;
    return 1;
}

/* `(\d+(?:\.\d+)?)` */
static int number(Cur *c, Span *sp) {
    Py_ssize_t start = c->i;
    if (!digits(c, sp, 0))
        return 0;
    if (c->i + 1 < c->n && c->s[c->i] == '.' && is_digit(c->s[c->i + 1])) {
        Py_ssize_t i = c->i + 1;
        while (i < c->n && is_digit(c->s[i]))
            i++;
        c->i = i;
    }
    sp->a = start;
    sp->b = c->i;
    return 1;
}

static void spaces(Cur *c) {
    while (c->i < c->n && is_space((unsigned char)c->s[c->i]))
        c->i++;
}

/* `\s*(ns|us|µs|ms|min|s|m)?` → the divisor (1.0 when absent: duration_s(x, "s")). µs is not
 * ASCII, so never seen here. */
static double duration_unit(Cur *c) {
    spaces(c);
    const char *p = c->s + c->i;
    Py_ssize_t left = c->n - c->i;
    if (left >= 2 && p[1] == 's' && (p[0] == 'n' || p[0] == 'u' || p[0] == 'm')) {
        c->i += 2;
        return p[0] == 'n' ? 1e9 : p[0] == 'u' ? 1e6 : 1e3;
    }
    if (left >= 3 && p[0] == 'm' && p[1] == 'i' && p[2] == 'n') {
        c->i += 3;
        return 1.0 / 60;
    }
    if (left >= 1 && p[0] == 's') {
        c->i += 1;
        return 1.0;
    }
    if (left >= 1 && p[0] == 'm') {
        c->i += 1;
        return 1.0 / 60;
    }
    return 1.0;
}

/* `\s*([KMGT]i?B|B)?` → the factor of _SIZE_UNITS (1 when absent) */
static double size_unit(Cur *c) {
    spaces(c);
    const char *p = c->s + c->i;
    Py_ssize_t left = c->n - c->i;
    if (left >= 1 && (p[0] == 'K' || p[0] == 'M' || p[0] == 'G' || p[0] == 'T')) {
        int power = p[0] == 'K' ? 1 : p[0] == 'M' ? 2 : p[0] == 'G' ? 3 : 4;
        double base = 1000.0;
        Py_ssize_t len = 0;
        if (left >= 3 && p[1] == 'i' && p[2] == 'B') {
            base = 1024.0;
            len = 3;
        } else if (left >= 2 && p[1] == 'B') {
            len = 2;
        }
        if (len) {
            double f = 1.0;
            for (int k = 0; k < power; k++)
                f *= base;
            c->i += len;
            return f;
        }
        return 1.0;
    }
    if (left >= 1 && p[0] == 'B')
        c->i += 1;
    return 1.0;
}

/* -- values ------------------------------------------------------------------------------- */

static PyObject *str_of(Cur *c, Span sp) { /* the message is ASCII: no UTF-8 decoding needed */
    PyObject *o = PyUnicode_New(sp.b - sp.a, 127);
    if (o != NULL)
        memcpy(PyUnicode_1BYTE_DATA(o), c->s + sp.a, sp.b - sp.a);
    return o;
}

/* int() of a span `digits` took: at most MAX_DIGITS digits, so it fits a long long */
static PyObject *int_of(Cur *c, Span sp) {
    Py_ssize_t len = sp.b - sp.a;
    const char *p = c->s + sp.a;
    long long v = 0;
    int neg = 0;
    if (*p == '-') {
        neg = 1;
        p++;
        len--;
    }
    for (Py_ssize_t k = 0; k < len; k++)
        v = v * 10 + (p[k] - '0');
    return PyLong_FromLongLong(neg ? -v : v);
}

/* float(text), or -1.0 with *ok = 0 when it is not finite (the caller then declines). */
static double double_of(Cur *c, Span sp, int *ok) {
    /* `\d+(\.\d+)?` with at most 15 digits: the mantissa and 10^k are exact doubles, so one
     * division is the correctly rounded value float() gives (Clinger's fast path). */
    static const double pow10[16] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13,
                                     1e14, 1e15};
    if (sp.b - sp.a <= 16) {
        uint64_t m = 0;
        int digits = 0, frac = -1;
        for (Py_ssize_t i = sp.a; i < sp.b; i++) {
            char ch = c->s[i];
            if (ch == '.' && frac < 0) {
                frac = 0;
            } else if (is_digit(ch)) {
                m = m * 10 + (uint64_t)(ch - '0');
                digits++;
                if (frac >= 0)
                    frac++;
            } else {
                digits = 99; /* not this shape: the general path */
                break;
            }
        }
        if (digits >= 1 && digits <= 15)
            return frac > 0 ? (double)m / pow10[frac] : (double)m;
    }
    char small[64];
    Py_ssize_t len = sp.b - sp.a;
    char *buf = len < (Py_ssize_t)sizeof small ? small : PyMem_Malloc(len + 1);
    if (buf == NULL) {
        *ok = 0;
        return -1.0;
    }
    memcpy(buf, c->s + sp.a, len);
    buf[len] = 0;
    double v = PyOS_string_to_double(buf, NULL, NULL);
    if (buf != small)
        PyMem_Free(buf);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        *ok = 0;
    }
    if (!isfinite(v))
        *ok = 0;
    return v;
}

/* int(float(number) * factor), as size_bytes; declines (ok = 0) when not finite or beyond int64 */
static PyObject *size_of(Cur *c, Span sp, double factor, int *ok) {
    double v = double_of(c, sp, ok);
    if (!*ok)
        return NULL;
    v = v * factor;
    if (!(v < INT64_LIMIT)) {
        *ok = 0;
        return NULL;
    }
    return PyLong_FromDouble(v);
}

/* value / divisor in seconds, as duration_s; ok = 0 (decline) beyond numbers.seconds' bounds */
static double seconds_of(Cur *c, Span sp, double divisor, int *ok) {
    double v = double_of(c, sp, ok);
    if (!*ok)
        return -1.0;
    v = v / divisor;
    if (!(v >= 0.0 && v <= MAX_DURATION_S))
        *ok = 0;
    return v;
}

#define DECLINE ((PyObject *)Py_None)

/* The vLLM plugin's exact time, `, t=<s>[.<frac>]` after a line's last field (seed.py's _AT).
 * Taken here only in its plain form: one `, t=` in the line, at its end, 1-10 digits of seconds
 * (at most 9e9) and 1-9 of fraction. Then *ns is the time, *has = 1, and c->n is cut before it:
 * the rule must end exactly at the cut (`AT_END`), or Python's regex may read the line another
 * way. No `, t=` at all: *has = 0. Anything else: 0, and the line goes to the Python rules. */
static int exact_time_id(Cur *c, long long *ns, int *has, Span *iid, int *has_iid);

static int exact_time(Cur *c, long long *ns, int *has) { return exact_time_id(c, ns, has, NULL, NULL); }

/* exact_time, and the plugin's `, internal_id=<id>` right after the time, ending the line (seed.py's
 * _internal): taken only when `iid` is given, the id 1-256 printable ASCII bytes but `,` and `:`
 * (a subset of the regex's `[^\s:,]`, so where C takes a line Python reads it alike). */
static int exact_time_id(Cur *c, long long *ns, int *has, Span *iid, int *has_iid) {
    Py_ssize_t pos = -1;
    for (Py_ssize_t i = 0; i + 4 <= c->n; i++)
        if (c->s[i] == ',' && c->s[i + 1] == ' ' && c->s[i + 2] == 't' && c->s[i + 3] == '=') {
            if (pos >= 0)
                return 0;
            pos = i;
        }
    *has = pos >= 0;
    if (pos < 0)
        return 1;
    Py_ssize_t i = pos + 4;
    long long secs = 0, frac = 0;
    int nd = 0, nf = 0;
    while (i < c->n && is_digit(c->s[i]) && nd <= 10) {
        secs = secs * 10 + (c->s[i++] - '0');
        nd++;
    }
    if (nd == 0 || nd > 10 || secs > 9000000000LL)
        return 0;
    if (i < c->n && c->s[i] == '.') {
        i++;
        while (i < c->n && is_digit(c->s[i]) && nf <= 9) {
            frac = frac * 10 + (c->s[i++] - '0');
            nf++;
        }
        if (nf == 0 || nf > 9)
            return 0;
        for (int k = nf; k < 9; k++)
            frac *= 10;
    }
    if (iid != NULL) {
        *has_iid = 0;
        static const char key[] = ", internal_id=";
        Py_ssize_t k = (Py_ssize_t)(sizeof key - 1);
        if (i < c->n && i + k < c->n && memcmp(c->s + i, key, (size_t)k) == 0) {
            Py_ssize_t a = i + k, b = a;
            while (b < c->n && c->s[b] > 0x20 && c->s[b] < 0x7f && c->s[b] != ',' && c->s[b] != ':')
                b++;
            if (b != c->n || b == a || b - a > 256)
                return 0;
            iid->a = a;
            iid->b = b;
            *has_iid = 1;
            i = b;
        }
    }
    if (i != c->n)
        return 0;
    *ns = secs * 1000000000LL + frac;
    c->n = pos;
    return 1;
}

#define AT_END(c, has) (!(has) || (c)->i == (c)->n)
#define AT_VALUE(has, ns) ((has) ? PyLong_FromLongLong(ns) : Py_NewRef(Py_None))

/* -- the rules ------------------------------------------------------------------------------ */

static PyObject *allocated(Cur *c) {
    Span block, rid, num;
    long long at = 0;
    int has = 0;
    if (!LIT(c, "Allocated block ") || !exact_time(c, &at, &has) || !id_(c, &block) || !LIT(c, " for request ") ||
        !id_(c, &rid) || !LIT(c, ", size=") || !number(c, &num))
        return DECLINE;
    double factor = size_unit(c);
    if (!AT_END(c, has))
        return DECLINE;
    int ok = 1;
    PyObject *size = size_of(c, num, factor, &ok);
    if (!ok)
        return DECLINE;
    if (size == NULL)
        return NULL;
    PyObject *v[4] = {str_of(c, block), str_of(c, rid), size, AT_VALUE(has, at)};
    return MAKE(&classes[ALLOCATED], v);
}

static PyObject *freed(Cur *c) {
    Span block, rid, reason;
    long long at = 0;
    int has = 0;
    if (!LIT(c, "Freed block ") || !exact_time(c, &at, &has) || !id_(c, &block) || !LIT(c, " for request ") ||
        !id_(c, &rid))
        return DECLINE;
    int has_reason = LIT(c, ", reason=") && nonspace(c, &reason);
    if (!AT_END(c, has))
        return DECLINE;
    PyObject *why = has_reason ? str_of(c, reason) : Py_NewRef(empty_str);
    /* internal_id: None. The plugin states none on a block's line (seed.py); one that did fails
     * exact_time, and Python reads it. */
    PyObject *v[6] = {str_of(c, block), str_of(c, rid), why, PyLong_FromLong(1), AT_VALUE(has, at),
                      Py_NewRef(Py_None)};
    return MAKE(&classes[FREED], v);
}

static PyObject *scheduling(Cur *c) {
    Span rid, prio, blocks, remaining, queued;
    long long at = 0;
    int has = 0;
    Span iid;
    int has_iid = 0;
    if (!LIT(c, "Scheduling request ") || !exact_time_id(c, &at, &has, &iid, &has_iid) || !id_(c, &rid) ||
        !LIT(c, ": priority=") ||
        !digits(c, &prio, 1) || !LIT(c, ", num_scheduled_blocks=") || !digits(c, &blocks, 0) ||
        !LIT(c, ", remaining_blocks=") || !digits(c, &remaining, 0))
        return DECLINE;
    int has_q = 0;
    double qv = 0.0;
    int has_queued = LIT(c, ", queued=");
    if (has_queued && number(c, &queued)) {
        double div = duration_unit(c);
        int ok = 1;
        double v = seconds_of(c, queued, div, &ok);
        if (!ok)
            return DECLINE;
        qv = v;
        has_q = 1;
    } else if (has_queued && c->i < c->n && is_digit(c->s[c->i])) {
        return DECLINE; /* more digits than `digits` takes: the regex reads them, Python decides */
    }
    if (!AT_END(c, has))
        return DECLINE;
    PyObject *q = has_q ? PyFloat_FromDouble(qv) : Py_NewRef(Py_None);
    PyObject *v[7] = {str_of(c, rid), int_of(c, prio), int_of(c, blocks), int_of(c, remaining), q, AT_VALUE(has, at),
                      has_iid ? str_of(c, iid) : Py_NewRef(Py_None)};
    return MAKE(&classes[SCHEDULED], v);
}

static PyObject *summary(Cur *c) {
    Span rid, prompt, generated, t[3];
    double div[3];
    long long at = 0;
    int has = 0;
    static const char *labels[3] = {", ttft=", ", itl=", ", total_latency="};
    if (!LIT(c, "Request ") || !exact_time(c, &at, &has) || !id_(c, &rid) || !LIT(c, ": prompt_tokens=") ||
        !digits(c, &prompt, 0) || !LIT(c, ", generated_tokens=") || !digits(c, &generated, 0))
        return DECLINE;
    for (int k = 0; k < 3; k++) {
        if (!lit(c, labels[k], (Py_ssize_t)strlen(labels[k])) || !number(c, &t[k]))
            return DECLINE;
        div[k] = duration_unit(c);
    }
    if (!AT_END(c, has))
        return DECLINE;
    double secs[3];
    for (int k = 0; k < 3; k++) {
        int ok = 1;
        secs[k] = seconds_of(c, t[k], div[k], &ok);
        if (!ok)
            return DECLINE;
    }
    /* times: None. The plugin's trailing fields (`, arrival=…`) fail AT_END above: Python reads them. */
    PyObject *v[8] = {str_of(c, rid), int_of(c, prompt), int_of(c, generated), PyFloat_FromDouble(secs[0]),
                      PyFloat_FromDouble(secs[1]), PyFloat_FromDouble(secs[2]), AT_VALUE(has, at),
                      Py_NewRef(Py_None)};
    return MAKE(&classes[SUMMARY], v);
}

static PyObject *preempting(Cur *c) {
    Span rid, reason, blocks;
    long long at = 0;
    int has = 0;
    Span iid;
    int has_iid = 0;
    if (!LIT(c, "Preempting request ") || !exact_time_id(c, &at, &has, &iid, &has_iid) || !id_(c, &rid) ||
        !LIT(c, ": reason=") ||
        !reason_(c, &reason) || !LIT(c, ", preempted_blocks=") || !digits(c, &blocks, 0) || !AT_END(c, has))
        return DECLINE;
    PyObject *v[5] = {str_of(c, rid), str_of(c, reason), int_of(c, blocks), AT_VALUE(has, at),
                      has_iid ? str_of(c, iid) : Py_NewRef(Py_None)};
    return MAKE(&classes[PREEMPTED], v);
}

static int requests_word(Cur *c) { /* ` requests?` */
    if (!LIT(c, " request"))
        return 0;
    if (c->i < c->n && c->s[c->i] == 's')
        c->i++;
    return 1;
}

static PyObject *queue(Cur *c) {
    Span running, waiting, free_, total;
    if (!LIT(c, "Running queue: ") || !digits(c, &running, 0) || !requests_word(c) || !LIT(c, ", waiting queue: ") ||
        !digits(c, &waiting, 0) || !requests_word(c) || !LIT(c, ", free blocks: ") || !digits(c, &free_, 0) ||
        !LIT(c, "/") || !digits(c, &total, 0))
        return DECLINE;
    PyObject *v[4] = {int_of(c, running), int_of(c, waiting), int_of(c, free_), int_of(c, total)};
    return MAKE(&classes[QUEUE], v);
}

static PyObject *gpu(Cur *c) {
    Span used, total, pct, cache, kv_used, kv_total;
    double fu, ft, fc;
    if (!LIT(c, "GPU memory usage: ") || !number(c, &used))
        return DECLINE;
    fu = size_unit(c);
    spaces(c);
    if (!LIT(c, "/"))
        return DECLINE;
    spaces(c);
    if (!number(c, &total))
        return DECLINE;
    ft = size_unit(c);
    if (!LIT(c, " (") || !number(c, &pct) || !LIT(c, "%), cache usage: ") || !number(c, &cache))
        return DECLINE;
    fc = size_unit(c);
    if (!LIT(c, ", kv_cache blocks: ") || !digits(c, &kv_used, 0) || !LIT(c, "/") || !digits(c, &kv_total, 0))
        return DECLINE;
    int ok = 1;
    double p = double_of(c, pct, &ok);
    if (!ok)
        return DECLINE;
    PyObject *u = size_of(c, used, fu, &ok);
    PyObject *t = ok ? size_of(c, total, ft, &ok) : NULL;
    PyObject *ca = ok ? size_of(c, cache, fc, &ok) : NULL;
    if (!ok) {
        Py_XDECREF(u);
        Py_XDECREF(t);
        Py_XDECREF(ca);
        return PyErr_Occurred() ? NULL : DECLINE;
    }
    PyObject *v[6] = {u, t, PyFloat_FromDouble(p / 100.0), ca, int_of(c, kv_used), int_of(c, kv_total)};
    return MAKE(&classes[GPU], v);
}

/* -- module ----------------------------------------------------------------------------------- */

static PyObject *init(PyObject *self, PyObject *mapping) {
    PyObject *kinds = PyMapping_GetItemString(mapping, "KIND");
    if (kinds == NULL)
        return NULL;
    if (!PyDict_Check(kinds)) {
        Py_DECREF(kinds);
        PyErr_SetString(PyExc_TypeError, "KIND must be a dict");
        return NULL;
    }
    for (int k = 0; k < N_CLASSES; k++) {
        PyObject *cls = PyMapping_GetItemString(mapping, class_names[k]);
        int r = cls == NULL ? -1 : load_class(&classes[k], cls, kinds);
        Py_XDECREF(cls);
        if (r < 0) {
            Py_DECREF(kinds);
            return NULL;
        }
    }
    Py_DECREF(kinds);
    ready = 1;
    Py_RETURN_NONE;
}

/* The event for `msg` (counted in `counts`), Py_None (borrowed: ask the Python rules) or NULL. */
static PyObject *parse_core(PyObject *msg, PyObject *counts) {
    if (PyUnicode_READY(msg) < 0)
        return NULL;
    if (!PyUnicode_IS_ASCII(msg) || PyUnicode_GET_LENGTH(msg) < 4)
        return Py_None;
    Cur c = {(const char *)PyUnicode_1BYTE_DATA(msg), PyUnicode_GET_LENGTH(msg), 0};
    PyObject *event;
    int which;
    switch (c.s[0]) {
    case 'A': which = ALLOCATED; event = allocated(&c); break;
    case 'F': which = FREED; event = freed(&c); break;
    case 'S': which = SCHEDULED; event = scheduling(&c); break;
    case 'R':
        if (c.s[2] == 'q') {
            which = SUMMARY;
            event = summary(&c);
        } else {
            which = QUEUE;
            event = queue(&c);
        }
        break;
    case 'P': which = PREEMPTED; event = preempting(&c); break;
    case 'G': which = GPU; event = gpu(&c); break;
    default: return Py_None;
    }
    if (event == NULL || event == Py_None)
        return event;
    if (bump(counts, classes[which].kind) < 0) {
        Py_DECREF(event);
        return NULL;
    }
    return event;
}

static PyObject *parse(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyUnicode_Check(args[0]) || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "parse(message: str, counts: dict)");
        return NULL;
    }
    if (!ready) {
        PyErr_SetString(PyExc_RuntimeError, "init() first");
        return NULL;
    }
    PyObject *r = parse_core(args[0], args[1]);
    return r == Py_None ? Py_NewRef(Py_None) : r;
}

/* -- the rest of upstream.fallback, for the commonest lines no rule takes ---------------------- *
 *
 * `fallback` answers a line no rule takes: vLLM modules' chatter by prefix or by module, and
 * header-less writers (uvicorn, torch's glog, tqdm). These answer the same from the same tables
 * (`tables`, set once by bridge/parse/__init__.py from upstream.py, read-only there), for the
 * cases they are sure of; anything else, Python. A line whose key a rule claims counts as
 * unclaimed only when its key's guards (`GUARDS`) all say no: then its rules would not run.
 */
static PyObject *rule_keys, *rule_guards, *notice_groups, *module_cache, *request_modules, *vllm_other,
    *chatter_levels, *noise, *torch_log, *uvicorn_rule;
static PyObject *uvicorn_str, *unrecognised_str, *marks[4], *rate_marks[2], *glog_marks[3], *newline_str,
    *glog_end_str;

static int table(PyObject *d, const char *name, PyTypeObject *type, PyObject **slot) {
    PyObject *v = PyDict_GetItemString(d, name);
    if (v == NULL || (type != NULL && !Py_IS_TYPE(v, type))) {
        PyErr_Format(PyExc_TypeError, "tables: %s missing or not a %s", name, type != NULL ? type->tp_name : "value");
        return -1;
    }
    Py_XSETREF(*slot, Py_NewRef(v));
    return 0;
}

static PyObject *tables(PyObject *self, PyObject *d) {
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "tables(dict)");
        return NULL;
    }
    if (table(d, "rule_keys", &PyDict_Type, &rule_keys) < 0 || table(d, "guards", &PyDict_Type, &rule_guards) < 0 ||
        table(d, "notice_groups", &PyDict_Type, &notice_groups) < 0 ||
        table(d, "module_cache", &PyDict_Type, &module_cache) < 0 ||
        table(d, "request_modules", &PyFrozenSet_Type, &request_modules) < 0 ||
        table(d, "vllm_other", NULL, &vllm_other) < 0 || table(d, "chatter_levels", &PyFrozenSet_Type, &chatter_levels) < 0 ||
        table(d, "noise", NULL, &noise) < 0 || table(d, "torch_log", NULL, &torch_log) < 0 ||
        table(d, "uvicorn_rule", NULL, &uvicorn_rule) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* How the rules stand on `msg`: 0 no key claims it, 1 claimed but every guard of the key says no
 * (its rules would not run), 2 a rule may take it (`*rules`, borrowed: the key's rules), -1 error. */
static int claim(PyObject *msg, PyObject **rules) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(msg);
    PyObject *key = PyUnicode_Substring(msg, 0, n < 4 ? n : 4);
    if (key == NULL)
        return -1;
    *rules = PyDict_GetItemWithError(rule_keys, key);
    PyObject *guard = *rules == NULL ? NULL : PyDict_GetItemWithError(rule_guards, key);
    Py_DECREF(key);
    if (PyErr_Occurred())
        return -1;
    if (*rules == NULL)
        return 0;
    if (guard == NULL || !PyTuple_CheckExact(guard))
        return 2;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(guard); i++) {
        PyObject *prefix = PyTuple_GET_ITEM(guard, i);
        if (!PyUnicode_CheckExact(prefix))
            return 2;
        Py_ssize_t hit = PyUnicode_Tailmatch(msg, prefix, 0, PY_SSIZE_T_MAX, -1);
        if (hit != 0)
            return hit < 0 ? -1 : 2;
    }
    return 1;
}

/* 1 when `msg` holds one of `subs` within [0, end), 0 when not, -1 on error */
static int holds(PyObject *msg, PyObject **subs, int count, Py_ssize_t end) {
    for (int k = 0; k < count; k++) {
        Py_ssize_t at = PyUnicode_Find(msg, subs[k], 0, end, 1);
        if (at != -1)
            return at == -2 ? -1 : 1;
    }
    return 0;
}

/* A new reference to the Notice, or Py_None (borrowed: Python answers), NULL on error. */
static PyObject *chatter(PyObject *msg, PyObject *level, PyObject *origin) {
    int in = PySet_Contains(chatter_levels, level);
    if (in <= 0)
        return in < 0 ? NULL : Py_None;
    Py_ssize_t uv = PyUnicode_Tailmatch(origin, uvicorn_str, 0, PY_SSIZE_T_MAX, -1);
    if (uv != 0)
        return uv < 0 ? NULL : Py_None;
    PyObject *rules;
    int claimed = claim(msg, &rules);
    if (claimed != 0 && claimed != 1)
        return claimed < 0 ? NULL : Py_None;
    Py_ssize_t n = PyUnicode_GET_LENGTH(msg);
    int bar = holds(msg, marks, 4, n); /* "%", "|", "it]", "s]": a progress bar may be there */
    if (bar != 0)
        return bar < 0 ? NULL : Py_None;
    if (n > 0) {
        PyObject *first = PyUnicode_Substring(msg, 0, 1);
        if (first == NULL)
            return NULL;
        PyObject *group = PyDict_GetItemWithError(notice_groups, first);
        Py_DECREF(first);
        if (group == NULL && PyErr_Occurred())
            return NULL;
        if (group != NULL) {
            if (!PyTuple_CheckExact(group))
                return Py_None;
            for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(group); i++) {
                PyObject *entry = PyTuple_GET_ITEM(group, i); /* (notice, prefixes) */
                if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 2)
                    return Py_None;
                PyObject *prefixes = PyTuple_GET_ITEM(entry, 1);
                if (!PyTuple_CheckExact(prefixes))
                    return Py_None;
                for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(prefixes); j++) {
                    PyObject *prefix = PyTuple_GET_ITEM(prefixes, j);
                    if (!PyUnicode_CheckExact(prefix))
                        return Py_None;
                    Py_ssize_t hit = PyUnicode_Tailmatch(msg, prefix, 0, PY_SSIZE_T_MAX, -1);
                    if (hit < 0)
                        return NULL;
                    if (hit)
                        return Py_NewRef(PyTuple_GET_ITEM(entry, 0));
                }
            }
        }
    }
    PyObject *module = PyDict_GetItemWithError(module_cache, origin);
    if (module == NULL)
        return PyErr_Occurred() ? NULL : Py_None; /* Python works it out, and caches it */
    in = PySet_Contains(request_modules, module);
    if (in < 0)
        return NULL;
    if (in) /* a request or engine module's line: Python's fallback reads some by what they say
             * (`upstream._BY_TEXT`, a request id first), and counts the rest */
        return Py_None;
    return Py_NewRef(vllm_other);
}

/* uvicorn's `(?:INFO|WARNING|ERROR):\s+\S+ - "(\S+) (\S+) HTTP/[\d.]+" (\d{3})` (upstream._uvicorn):
 * the AccessLog, or Py_None (borrowed). Every quantifier is followed by what it cannot match, so
 * the first path is the only one. */
static PyObject *access_line(PyObject *msg) {
    if (!PyUnicode_IS_ASCII(msg))
        return Py_None;
    Cur c = {(const char *)PyUnicode_1BYTE_DATA(msg), PyUnicode_GET_LENGTH(msg), 0};
    Span host, method, path, version, status;
    if (!(LIT(&c, "INFO:") || LIT(&c, "WARNING:") || LIT(&c, "ERROR:")))
        return Py_None;
    Py_ssize_t gap = c.i;
    spaces(&c);
    if (c.i == gap || !nonspace(&c, &host) || !LIT(&c, " - \"") || !nonspace(&c, &method) || !LIT(&c, " ") ||
        !nonspace(&c, &path) || !LIT(&c, " HTTP/"))
        return Py_None;
    version.a = c.i;
    while (c.i < c.n && (is_digit(c.s[c.i]) || c.s[c.i] == '.'))
        c.i++;
    if (c.i == version.a || !LIT(&c, "\" ") || c.n - c.i < 3 || !is_digit(c.s[c.i]) || !is_digit(c.s[c.i + 1]) ||
        !is_digit(c.s[c.i + 2]))
        return Py_None;
    status.a = c.i;
    status.b = c.i + 3;
    for (Py_ssize_t i = path.a; i < path.b; i++) /* path.split("?", 1)[0] */
        if (c.s[i] == '?') {
            path.b = i;
            break;
        }
    PyObject *v[3] = {str_of(&c, method), str_of(&c, path), int_of(&c, status)};
    if (v[0] == NULL || v[1] == NULL || v[2] == NULL) {
        for (int k = 0; k < 3; k++)
            Py_XDECREF(v[k]);
        return NULL;
    }
    return MAKE(&classes[ACCESS], v);
}

/* A line with no vLLM header (level and origin ""): what the key's rules and then fallback
 * answer, for uvicorn's access line, torch's glog warning and a tqdm bar showing its rate.
 * A new reference, Py_None (borrowed: Python answers) or NULL. */
static PyObject *headerless(PyObject *msg) {
    PyObject *rules;
    int claimed = claim(msg, &rules);
    if (claimed < 0)
        return NULL;
    if (claimed == 2) { /* a rule may take it: only uvicorn's, alone under its key, is done here */
        if (PyTuple_CheckExact(rules) && PyTuple_GET_SIZE(rules) == 1 && PyTuple_GET_ITEM(rules, 0) == uvicorn_rule)
            return access_line(msg);
        return Py_None;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(msg);
    if (n == 0)
        return Py_None;
    int r;
    if (PyUnicode_READ_CHAR(msg, 0) == '[') {
        /* `\[W[\d ].*?\] ` of _GLOG on one line, with no `[E`, `[F`, `[PG ` in its first 40
         * characters: a warning, not an error (fallback's own test) */
        if (n < 5 || PyUnicode_READ_CHAR(msg, 1) != 'W')
            return Py_None;
        Py_UCS4 d = PyUnicode_READ_CHAR(msg, 2);
        if (!(d == ' ' || (d >= '0' && d <= '9')))
            return Py_None;
        Py_ssize_t nl = PyUnicode_Find(msg, newline_str, 0, n, 1);
        Py_ssize_t end = nl == -2 ? -2 : PyUnicode_Find(msg, glog_end_str, 3, n, 1);
        if (nl == -2 || end == -2)
            return NULL;
        if (nl != -1 || end == -1)
            return Py_None;
        r = holds(msg, glog_marks, 3, n < 40 ? n : 40);
        return r < 0 ? NULL : r ? Py_None : Py_NewRef(torch_log);
    }
    r = holds(msg, rate_marks, 2, n); /* `it/s\]|s/it\]`: _PROGRESS finds a bar */
    return r < 0 ? NULL : r ? Py_NewRef(noise) : Py_None;
}

/* slot += 1 for an int slot at `offset` of `obj`; -1 on error, 1 when it is not a plain int */
static int bump_slot(PyObject *obj, Py_ssize_t offset) {
    PyObject **p = (PyObject **)((char *)obj + offset);
    if (*p == NULL || !PyLong_CheckExact(*p))
        return 1;
    Py_ssize_t v = PyLong_AsSsize_t(*p);
    if (v == -1 && PyErr_Occurred())
        return -1;
    PyObject *next = PyLong_FromSsize_t(v + 1);
    if (next == NULL)
        return -1;
    Py_SETREF(*p, next);
    return 0;
}

/* -- Parse: Parser.__call__ as one C call ---------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *stats, *counts, *rest, *full;
    Py_ssize_t lines_offset, unrecognised_offset; /* ParseStats.lines, .unrecognised */
} Parse;

static int parse_traverse(Parse *self, visitproc visit, void *arg) {
    Py_VISIT(self->stats);
    Py_VISIT(self->counts);
    Py_VISIT(self->rest);
    Py_VISIT(self->full);
    return 0;
}

static int parse_clear(Parse *self) {
    Py_CLEAR(self->stats);
    Py_CLEAR(self->counts);
    Py_CLEAR(self->rest);
    Py_CLEAR(self->full);
    return 0;
}

static void parse_dealloc(Parse *self) {
    PyObject_GC_UnTrack(self);
    parse_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* (message, level="", origin="") → stats.lines += 1, then the C rules, else rest(message, level, origin) */
static PyObject *parse_call(Parse *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL || nargs < 1 || nargs > 3 || !PyUnicode_Check(args[0]) || !ready)
        goto python; /* whatever Python makes of it, counting included */
    int counted = bump_slot(self->stats, self->lines_offset); /* stats.lines += 1 */
    if (counted < 0)
        return NULL;
    if (counted > 0) /* not a plain int: nothing changed */
        goto python;
    PyObject *event = parse_core(args[0], self->counts);
    if (event != Py_None)
        return event;
    PyObject *empty = empty_str, *level = nargs > 1 ? args[1] : empty, *origin = nargs > 2 ? args[2] : empty;
    if (rule_keys != NULL && PyUnicode_CheckExact(level) && PyUnicode_CheckExact(origin)) {
        if (PyUnicode_GET_LENGTH(level) == 0)
            event = PyUnicode_GET_LENGTH(origin) == 0 ? headerless(args[0]) : Py_None;
        else
            event = PyUnicode_GET_LENGTH(origin) == 0 ? Py_None : chatter(args[0], level, origin);
        if (event == NULL)
            return NULL;
        if (event != Py_None) { /* Parser._rest counts its kind: a Notice's own, else KIND's */
            PyObject *kind = Py_IS_TYPE(event, classes[ACCESS].cls.type) ? Py_NewRef(classes[ACCESS].kind)
                                                                         : PyObject_GetAttr(event, kind_str);
            int rc = kind == NULL ? -1 : bump(self->counts, kind);
            Py_XDECREF(kind);
            if (rc < 0) {
                Py_DECREF(event);
                return NULL;
            }
            return event;
        }
    }
    return PyObject_CallFunctionObjArgs(self->rest, args[0], level, origin, NULL);
python: /* whatever the Python method makes of such a call, counting included */
    return PyObject_Vectorcall(self->full, args, nargsf, kwnames);
}

static PyObject *parse_new(PyTypeObject *type, PyObject *args, PyObject *kwargs);

static PyTypeObject ParseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "bridge.parse._fastseed.Parse",
    .tp_basicsize = sizeof(Parse),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = 0, /* set at module init */
    .tp_new = parse_new,
    .tp_dealloc = (destructor)parse_dealloc,
    .tp_traverse = (traverseproc)parse_traverse,
    .tp_clear = (inquiry)parse_clear,
    .tp_call = PyVectorcall_Call,
    .tp_doc = "Parse(stats, counts, rest, full): Parser.__call__ in C; `rest` is the bound Parser._rest, "
              "`full` the bound Parser.__call__ (for calls it does not take)",
};

typedef struct {
    Parse base;
    vectorcallfunc vectorcall;
} ParseVC;

static PyObject *parse_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *stats, *counts, *rest, *full;
    if (!PyArg_ParseTuple(args, "OO!OO", &stats, &PyDict_Type, &counts, &rest, &full))
        return NULL;
    PyObject *d = _PyType_Lookup(Py_TYPE(stats), lines_str);
    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type) || ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
        PyErr_SetString(PyExc_TypeError, "stats.lines must be a slot");
        return NULL;
    }
    ParseVC *self = (ParseVC *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->base.stats = Py_NewRef(stats);
    self->base.counts = Py_NewRef(counts);
    self->base.rest = Py_NewRef(rest);
    self->base.full = Py_NewRef(full);
    self->base.lines_offset = ((PyMemberDescrObject *)d)->d_member->offset;
    d = _PyType_Lookup(Py_TYPE(stats), unrecognised_str);
    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type) || ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_TypeError, "stats.unrecognised must be a slot");
        return NULL;
    }
    self->base.unrecognised_offset = ((PyMemberDescrObject *)d)->d_member->offset;
    self->vectorcall = (vectorcallfunc)parse_call;
    return (PyObject *)self;
}

static PyMethodDef methods[] = {
    {"init", (PyCFunction)init, METH_O, "init(classes: Mapping[str, type]): the event dataclasses"},
    {"tables", (PyCFunction)tables, METH_O,
     "tables({rule_keys, guards, notice_groups, module_cache, request_modules, vllm_other, chatter_levels, noise, "
     "torch_log, uvicorn_rule}): upstream.fallback's tables"},
    {"parse", (PyCFunction)(void (*)(void))parse, METH_FASTCALL,
     "parse(message, counts) -> event or None (None: ask the Python rules)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastseed", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastseed(void) {
    empty_str = PyUnicode_InternFromString("");
    lines_str = PyUnicode_InternFromString("lines");
    unrecognised_str = PyUnicode_InternFromString("unrecognised");
    kind_str = PyUnicode_InternFromString("kind");
    uvicorn_str = PyUnicode_InternFromString("uvicorn");
    marks[0] = PyUnicode_InternFromString("%");
    marks[1] = PyUnicode_InternFromString("|");
    marks[2] = PyUnicode_InternFromString("it]");
    marks[3] = PyUnicode_InternFromString("s]");
    rate_marks[0] = PyUnicode_InternFromString("it/s]");
    rate_marks[1] = PyUnicode_InternFromString("s/it]");
    glog_marks[0] = PyUnicode_InternFromString("[E");
    glog_marks[1] = PyUnicode_InternFromString("[F");
    glog_marks[2] = PyUnicode_InternFromString("[PG ");
    newline_str = PyUnicode_InternFromString("\n");
    glog_end_str = PyUnicode_InternFromString("] ");
    one_int = PyLong_FromLong(1);
    if (empty_str == NULL || lines_str == NULL || unrecognised_str == NULL || kind_str == NULL || uvicorn_str == NULL ||
        !marks[0] || !marks[1] || !marks[2] || !marks[3] || !rate_marks[0] || !rate_marks[1] || !glog_marks[0] ||
        !glog_marks[1] || !glog_marks[2] || !newline_str || !glog_end_str || !one_int)
        return NULL;
    ParseType.tp_basicsize = sizeof(ParseVC);
    ParseType.tp_vectorcall_offset = offsetof(ParseVC, vectorcall);
    if (PyType_Ready(&ParseType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Parse", (PyObject *)&ParseType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
