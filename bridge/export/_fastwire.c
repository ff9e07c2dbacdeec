/* The export stage's fast path: a RequestTimeline → its spans' OTLP wire bytes.
 *
 * `spans(t, cache)` returns the bytes WireEncoder appends for the timeline's spans (each
 * span as a ScopeSpans.spans field: tag, length, Span), or None when the timeline holds
 * anything unusual (a negative or oversized time or count, a non-str id, ids of another
 * length): the Python encoder then writes `mapping`'s records and fails the way it always did.
 * The ids are computed here as mapping.request_spans gets them from bridge/export/ids.py
 * (BLAKE2b, same personalisation, same inputs): from the source, request id and occurrence, or,
 * for a half of a disaggregated request (mapping.pd_key), from the prefill's engine request id
 * alone, the decode's root linking to the prefill's; `cache` keeps the encoded root events
 * shared by many requests.
 *
 * It follows bridge/export/mapping.py's request_spans without building its records (that
 * costs more than all of this), and spells none of its names: span names, kinds, id kinds,
 * attribute keys and values, the personalisation and the cache bound are handed over by
 * `configure` (wire._load_fast), the P/D ones too (the role attribute and its two values, where
 * each half keeps the prefill's id, the id kind word, each root's span id index). What it
 * writes, in wire.py's field order:
 *   root:  trace_id, span_id, [parent_span_id], name, kind, start, end, attributes (the
 *          timing ones put in place or appended), events, dropped, links, status
 *   phase: trace_id, span_id, parent = root, name, kind, start, end, attributes, events, dropped
 * and an attribute value is encoded as wire.any_value does: str, bool, int (two's complement,
 * 64 bits), float (double), list/tuple (ArrayValue), else str(value). tests/test_mapping.py holds
 * it to mapping's records on every saved input; tests/test_native.py on generated odd ones.
 */
#include "_native.h"
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Buf;

static int grow(Buf *b, Py_ssize_t need) {
    if (b->len + need <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + need)
        cap *= 2;
    char *p = PyMem_Realloc(b->p, cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int put(Buf *b, const void *data, Py_ssize_t n) {
    if (grow(b, n) < 0)
        return -1;
    memcpy(b->p + b->len, data, n);
    b->len += n;
    return 0;
}

static inline int put1(Buf *b, unsigned char c) {
    if (grow(b, 1) < 0)
        return -1;
    b->p[b->len++] = (char)c;
    return 0;
}

static inline int varint(Buf *b, uint64_t v) {
    if (grow(b, 10) < 0)
        return -1;
    while (v >= 0x80) {
        b->p[b->len++] = (char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    b->p[b->len++] = (char)v;
    return 0;
}

static inline int fixed64(Buf *b, unsigned char tag, uint64_t v) {
    if (grow(b, 9) < 0)
        return -1;
    b->p[b->len++] = (char)tag;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(b->p + b->len, &v, 8);
    b->len += 8;
#else
    for (int k = 0; k < 8; k++)
        b->p[b->len++] = (char)(v >> (8 * k));
#endif
    return 0;
}

/* A length-delimited field: `open` writes the tag and reserves `reserve` bytes for the length
 * (1 for attributes and values, 2 for events and spans: their usual sizes), `close` writes
 * the length and, when it took another number of bytes, moves the body. */
static inline Py_ssize_t open_sized(Buf *b, unsigned char tag, int reserve) {
    if (grow(b, 1 + reserve) < 0)
        return -1;
    b->p[b->len++] = (char)tag;
    Py_ssize_t at = b->len;
    b->p[at] = (char)reserve; /* remembered until close */
    b->len += reserve;
    return at;
}
#define open_field(b, tag) open_sized((b), (tag), 1)

static inline int close_field(Buf *b, Py_ssize_t at) {
    int reserve = (unsigned char)b->p[at];
    Py_ssize_t body = b->len - at - reserve;
    unsigned char v[10];
    int n = 0;
    uint64_t x = (uint64_t)body;
    while (x >= 0x80) {
        v[n++] = (unsigned char)((x & 0x7F) | 0x80);
        x >>= 7;
    }
    v[n++] = (unsigned char)x;
    if (n != reserve) {
        if (n > reserve && grow(b, n - reserve) < 0)
            return -1;
        memmove(b->p + at + n, b->p + at + reserve, body);
        b->len += n - reserve;
    }
    memcpy(b->p + at, v, n);
    return 0;
}

static int put_str_field(Buf *b, unsigned char tag, PyObject *s) {
    Py_ssize_t n;
    const char *u;
    if (PyUnicode_IS_COMPACT_ASCII(s)) { /* its bytes are its UTF-8 */
        n = PyUnicode_GET_LENGTH(s);
        u = (const char *)PyUnicode_DATA(s);
    } else if ((u = PyUnicode_AsUTF8AndSize(s, &n)) == NULL) {
        return -1;
    }
    if (grow(b, 11 + n) < 0)
        return -1;
    char *p = b->p + b->len;
    *p++ = (char)tag;
    uint64_t x = (uint64_t)n;
    while (x >= 0x80) {
        *p++ = (char)((x & 0x7F) | 0x80);
        x >>= 7;
    }
    *p++ = (char)x;
    memcpy(p, u, n);
    b->len = p + n - b->p;
    return 0;
}

/* -- ids: BLAKE2b (RFC 7693) with ids.py's personalisation ------------------------------------------- */

static const uint64_t B2_IV[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};
static const uint8_t B2_SIGMA[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

typedef struct {
    uint64_t h[8], t;
    uint8_t buf[128];
    size_t n;
    int outlen;
} B2;

static inline uint64_t load64(const uint8_t *p) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t w;
    memcpy(&w, p, 8);
    return w;
#endif
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--)
        v = (v << 8) | p[k];
    return v;
}
static inline uint64_t rotr64(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

static void b2_compress(B2 *c, int last) {
    uint64_t v[16], m[16];
    for (int i = 0; i < 8; i++) {
        v[i] = c->h[i];
        v[i + 8] = B2_IV[i];
    }
    v[12] ^= c->t; /* messages here are far below 2^64 bytes: the high counter word stays 0 */
    if (last)
        v[14] = ~v[14];
    for (int i = 0; i < 16; i++)
        m[i] = load64(c->buf + 8 * i);
#define G(a, b, c_, d, x, y)              \
    do {                                  \
        v[a] = v[a] + v[b] + (x);         \
        v[d] = rotr64(v[d] ^ v[a], 32);   \
        v[c_] = v[c_] + v[d];             \
        v[b] = rotr64(v[b] ^ v[c_], 24);  \
        v[a] = v[a] + v[b] + (y);         \
        v[d] = rotr64(v[d] ^ v[a], 16);   \
        v[c_] = v[c_] + v[d];             \
        v[b] = rotr64(v[b] ^ v[c_], 63);  \
    } while (0)
    for (int r = 0; r < 12; r++) {
        const uint8_t *s = B2_SIGMA[r];
        G(0, 4, 8, 12, m[s[0]], m[s[1]]);
        G(1, 5, 9, 13, m[s[2]], m[s[3]]);
        G(2, 6, 10, 14, m[s[4]], m[s[5]]);
        G(3, 7, 11, 15, m[s[6]], m[s[7]]);
        G(0, 5, 10, 15, m[s[8]], m[s[9]]);
        G(1, 6, 11, 12, m[s[10]], m[s[11]]);
        G(2, 7, 8, 13, m[s[12]], m[s[13]]);
        G(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
#undef G
    for (int i = 0; i < 8; i++)
        c->h[i] ^= v[i] ^ v[i + 8];
}

static uint8_t PERSON[16]; /* ids.py's personalisation, zero-padded to 16 bytes: set by configure */

static void b2_init(B2 *c, int outlen) {
    for (int i = 0; i < 8; i++)
        c->h[i] = B2_IV[i];
    c->h[0] ^= 0x01010000ULL ^ (uint64_t)outlen; /* depth 1, fanout 1, no key */
    c->h[6] ^= load64(PERSON);
    c->h[7] ^= load64(PERSON + 8);
    c->t = 0;
    c->n = 0;
    c->outlen = outlen;
}

static void b2_update(B2 *c, const void *data, size_t len) {
    const uint8_t *p = data;
    while (len > 0) {
        if (c->n == 128) { /* keep the last block for b2_final */
            c->t += 128;
            b2_compress(c, 0);
            c->n = 0;
        }
        size_t take = 128 - c->n < len ? 128 - c->n : len;
        memcpy(c->buf + c->n, p, take);
        c->n += take;
        p += take;
        len -= take;
    }
}

/* the digest, with ids.py's rule: an all-zero id becomes ...0001 */
static void b2_final(B2 *c, uint8_t *out) {
    c->t += c->n;
    memset(c->buf + c->n, 0, 128 - c->n);
    b2_compress(c, 1);
    int zero = 1;
    for (int i = 0; i < c->outlen; i++) {
        out[i] = (uint8_t)(c->h[i / 8] >> (8 * (i % 8)));
        zero &= out[i] == 0;
    }
    if (zero)
        out[c->outlen - 1] = 1;
}

/* trace_id(key, what, a, b): four fields joined by 0x1f, as ids.trace_id hashes them. */
static void trace_id4(uint8_t *out, const char *k, Py_ssize_t nk, PyObject *what,
                      const char *a, Py_ssize_t na, const char *b, Py_ssize_t nb) {
    B2 c;
    b2_init(&c, 16);
    b2_update(&c, k, nk);
    b2_update(&c, "\x1f", 1);
    b2_update(&c, PyBytes_AS_STRING(what), PyBytes_GET_SIZE(what));
    b2_update(&c, "\x1f", 1);
    b2_update(&c, a, na);
    b2_update(&c, "\x1f", 1);
    b2_update(&c, b, nb);
    b2_final(&c, out);
}

static PyObject *digest(PyObject *self, PyObject *args) {
    /* digest(data: bytes, size: int) -> bytes: the personalised BLAKE2b (tests compare it
     * with hashlib) */
    Py_buffer data;
    int size;
    if (!PyArg_ParseTuple(args, "y*i", &data, &size))
        return NULL;
    if (size < 1 || size > 64) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "size must be 1..64");
        return NULL;
    }
    B2 c;
    uint8_t out[64];
    b2_init(&c, size);
    b2_update(&c, data.buf, data.len);
    b2_final(&c, out);
    PyBuffer_Release(&data);
    return PyBytes_FromStringAndSize((const char *)out, size);
}

/* -- attributes -------------------------------------------------------------------------------- */

static int any_value_body(Buf *b, PyObject *v, int depth) {
    if (PyUnicode_Check(v))
        return put_str_field(b, 0x0a, v);
    if (PyBool_Check(v)) {
        unsigned char t[2] = {0x10, v == Py_True ? 1 : 0};
        return put(b, t, 2);
    }
    if (PyLong_Check(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (x == -1 && PyErr_Occurred())
            return -1;
        if (overflow) { /* beyond int64: the nearest double, as wire._big_float, never the low 64 bits */
            double d = PyLong_AsDouble(v);
            if (d == -1.0 && PyErr_Occurred()) {
                PyErr_Clear();
                d = overflow > 0 ? HUGE_VAL : -HUGE_VAL;
            }
            uint64_t bits;
            memcpy(&bits, &d, 8);
            return fixed64(b, 0x21, bits);
        }
        return put1(b, 0x18) < 0 ? -1 : varint(b, (uint64_t)x);
    }
    if (PyFloat_Check(v)) {
        double d = PyFloat_AS_DOUBLE(v);
        uint64_t bits;
        memcpy(&bits, &d, 8);
        return fixed64(b, 0x21, bits);
    }
    if (PyList_Check(v) || PyTuple_Check(v)) {
        if (depth > 50) {
            PyErr_SetString(PyExc_RecursionError, "attribute value nested too deeply");
            return -1;
        }
        PyObject *seq = PySequence_Fast(v, "");
        if (seq == NULL)
            return -1;
        Py_ssize_t at = open_field(b, 0x2a);
        int r = at < 0 ? -1 : 0;
        for (Py_ssize_t k = 0; r == 0 && k < PySequence_Fast_GET_SIZE(seq); k++) {
            Py_ssize_t item = open_field(b, 0x0a);
            r = item < 0 ? -1 : any_value_body(b, PySequence_Fast_GET_ITEM(seq, k), depth + 1);
            if (r == 0)
                r = close_field(b, item);
        }
        Py_DECREF(seq);
        if (r == 0)
            r = close_field(b, at);
        return r;
    }
    PyObject *s = PyObject_Str(v);
    if (s == NULL)
        return -1;
    int r = put_str_field(b, 0x0a, s);
    Py_DECREF(s);
    return r;
}

/* KeyValue as a whole field of `tag`: key (field 1), value (field 2: AnyValue) */
static int key_value(Buf *b, unsigned char tag, PyObject *k, PyObject *v) {
    if (!PyUnicode_Check(k)) {
        PyErr_SetString(PyExc_TypeError, "attribute keys must be str");
        return -1;
    }
    Py_ssize_t at = open_field(b, tag);
    if (at < 0 || put_str_field(b, 0x0a, k) < 0)
        return -1;
    Py_ssize_t val = open_field(b, 0x12);
    if (val < 0 || any_value_body(b, v, 0) < 0 || close_field(b, val) < 0)
        return -1;
    return close_field(b, at);
}

/* The attributes of `attrs` in order, a key of `over_keys` taking its value from `over_values`
 * in place; the override keys not in `attrs` follow, in their order. */
static int attributes(Buf *b, unsigned char tag, PyObject *attrs, PyObject **over_keys, PyObject **over_values,
                      int n_over) {
    if (!PyDict_Check(attrs)) {
        PyErr_SetString(PyExc_TypeError, "attrs must be a dict");
        return -1;
    }
    int seen[4] = {0, 0, 0, 0};
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(attrs, &pos, &k, &v)) {
        for (int j = 0; j < n_over; j++) {
            if (!seen[j]) {
                PyObject *o = over_keys[j];
                int eq = k == o || (PyUnicode_Check(k) && PyUnicode_GET_LENGTH(k) == PyUnicode_GET_LENGTH(o) &&
                                    PyUnicode_Compare(k, o) == 0);
                if (eq) {
                    seen[j] = 1;
                    v = over_values[j];
                    break;
                }
            }
        }
        Py_INCREF(k);
        Py_INCREF(v);
        int r = key_value(b, tag, k, v);
        Py_DECREF(k);
        Py_DECREF(v);
        if (r < 0)
            return -1;
    }
    for (int j = 0; j < n_over; j++)
        if (!seen[j] && key_value(b, tag, over_keys[j], over_values[j]) < 0)
            return -1;
    return 0;
}

/* -- timelines ------------------------------------------------------------------------------------ */

/* The dataclasses of bridge/assemble/timeline.py are slotted: attr_get reads their slots. */
static Attr s_phases, s_parent, s_pd_context, s_trace_id, s_span_id, s_start_ns, s_end_ns, s_attrs, s_events, s_dropped_events, s_error_type, s_error_message, s_start_timing, s_end_timing, s_name, s_ts_ns;
static PyObject *s_incident; /* IncidentEvent's slot */
static Attr s_kind = {NULL}, s_incident_occurrence = {NULL};

/* The mapping's names and the encoder's limits: none is spelled here. `configure` (called once
 * by wire._load_fast) takes them from bridge/export/mapping.py, ids.py and wire.py. */
static PyObject *k_timing, *k_timing_start, *k_timing_end, *v_inferred, *v_observed, *k_incident_kind;
static PyObject *incident_type;            /* mapping's IncidentEvent: a root event of exactly this type links */
static PyObject *request_ids, *engine_ids; /* the kind words of ids.trace_id, as UTF-8 bytes */
static PyObject *request_span, *engine_span; /* the root's and an incident's span names, as UTF-8 bytes */
static unsigned char root_head[64], phase_kind[11]; /* Span.name + Span.kind of the root; Span.kind of a phase */
static Py_ssize_t root_head_len, phase_kind_len, cache_limit;
static int configured;

#define DECLINE 1 /* return code: hand the timeline to the Python encoder */

/* a non-negative int that fits 64 bits, else DECLINE */
static int u64_of(PyObject *v, uint64_t *out) {
    if (!PyLong_CheckExact(v))
        return DECLINE;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (overflow || x < 0)
        return DECLINE; /* struct.pack('<Q') and varint() are left to fail (or not) as they do */
    *out = (uint64_t)x;
    return 0;
}

static int get_u64(PyObject *obj, Attr *name, uint64_t *out) {
    PyObject *v = attr_get(obj, name);
    if (v == NULL)
        return -1;
    int r = u64_of(v, out);
    Py_DECREF(v);
    return r;
}

static int id_bytes(PyObject *v, Py_ssize_t size) { return PyBytes_CheckExact(v) && PyBytes_GET_SIZE(v) == size; }


/* One event (Span.events field) into b */
static int event(Buf *b, PyObject *e);

/* Span.events: each encoded, or taken from `cache` (id → (event, bytes): the root events are
 * shared by every request in flight, so each is encoded once; the event is held so that its
 * id is not reused while cached). `cache` may be NULL. */
static int events(Buf *b, PyObject *list, PyObject *cache) {
    if (!PyList_Check(list))
        return DECLINE;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(list); k++) {
        PyObject *e = PyList_GET_ITEM(list, k);
        if (cache == NULL) {
            Py_INCREF(e);
            int r = event(b, e);
            Py_DECREF(e);
            if (r != 0)
                return r;
            continue;
        }
        PyObject *key = PyLong_FromVoidPtr(e);
        if (key == NULL)
            return -1;
        PyObject *hit = PyDict_GetItemWithError(cache, key);
        if (hit != NULL) {
            PyObject *bytes = PyTuple_GET_ITEM(hit, 1);
            Py_DECREF(key);
            if (put(b, PyBytes_AS_STRING(bytes), PyBytes_GET_SIZE(bytes)) < 0)
                return -1;
            continue;
        }
        if (PyErr_Occurred()) {
            Py_DECREF(key);
            return -1;
        }
        Py_ssize_t at = b->len;
        Py_INCREF(e);
        int r = event(b, e);
        if (r == 0) {
            PyObject *bytes = PyBytes_FromStringAndSize(b->p + at, b->len - at);
            PyObject *entry = bytes ? PyTuple_Pack(2, e, bytes) : NULL;
            Py_XDECREF(bytes);
            if (entry == NULL)
                r = -1;
            else {
                if (PyDict_GET_SIZE(cache) >= cache_limit)
                    PyDict_Clear(cache);
                r = PyDict_SetItem(cache, key, entry);
                Py_DECREF(entry);
            }
        }
        Py_DECREF(e);
        Py_DECREF(key);
        if (r != 0)
            return r;
    }
    return 0;
}

static int event(Buf *b, PyObject *e) {
    {
        uint64_t ts;
        int r = get_u64(e, &s_ts_ns, &ts);
        PyObject *name = r == 0 ? attr_get(e, &s_name) : NULL;
        PyObject *attrs = name ? attr_get(e, &s_attrs) : NULL;
        if (attrs != NULL) {
            Py_ssize_t at = open_sized(b, 0x5a, 2);
            if (at < 0 || fixed64(b, 0x09, ts) < 0 || !PyUnicode_Check(name) || put_str_field(b, 0x12, name) < 0 ||
                attributes(b, 0x1a, attrs, NULL, NULL, 0) < 0)
                r = PyErr_Occurred() ? -1 : DECLINE;
            else
                r = close_field(b, at);
        } else if (r == 0) {
            r = -1;
        }
        Py_XDECREF(name);
        Py_XDECREF(attrs);
        if (r != 0)
            return r;
    }
    return 0;
}

static int dropped(Buf *b, PyObject *obj) {
    PyObject *v = attr_get(obj, &s_dropped_events);
    if (v == NULL)
        return -1;
    int truth = PyObject_IsTrue(v);
    uint64_t n = 0;
    int r = truth < 0 ? -1 : truth ? u64_of(v, &n) : 0;
    Py_DECREF(v);
    if (r == 0 && truth && (put1(b, 0x60) < 0 || varint(b, n) < 0))
        r = -1;
    return r;
}

/* _phase_timing(start, end) */
static PyObject *phase_timing(PyObject *start, PyObject *end) {
    int eq = PyObject_RichCompareBool(start, end, Py_EQ);
    if (eq < 0)
        return NULL;
    if (eq)
        return Py_NewRef(start);
    int a = PyObject_RichCompareBool(start, v_inferred, Py_EQ);
    int c = a == 1 ? 1 : a < 0 ? -1 : PyObject_RichCompareBool(end, v_inferred, Py_EQ);
    if (a < 0 || c < 0)
        return NULL;
    return Py_NewRef(c ? v_inferred : v_observed);
}

/* Span.links: first, for a disaggregated decode, one to its prefill's root (`pd_link`: that
 * root's span id, in trace `tid`; no attributes); then one per IncidentEvent among the root's
 * events, to that incident's `vllm.engine` span, ids as ids.incident_ids gives them (source key
 * `k`): mapping.request_spans' links, as wire.WireEncoder._link writes them. */
static int links(Buf *b, PyObject *evs, const char *k, Py_ssize_t nk, PyObject *tid, const uint8_t *pd_link) {
    if (pd_link != NULL) {
        uint8_t body[2 + 2 + 16 + 2 + 8] = {0x6a, 2 + 16 + 2 + 8, 0x0a, 0x10}; /* Span.links, its length */
        memcpy(body + 4, PyBytes_AS_STRING(tid), 16);
        body[20] = 0x12;
        body[21] = 0x08;
        memcpy(body + 22, pd_link, 8);
        if (put(b, body, sizeof body) < 0)
            return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(evs); i++) {
        PyObject *e = PyList_GET_ITEM(evs, i);
        if ((PyObject *)Py_TYPE(e) != incident_type)
            continue;
        PyObject *inc = PyObject_GetAttr(e, s_incident);
        if (inc == NULL)
            return -1;
        if (inc == Py_None) {
            Py_DECREF(inc);
            continue;
        }
        PyObject *kind = attr_get(inc, &s_kind);
        PyObject *occ = kind ? attr_get(inc, &s_incident_occurrence) : NULL;
        Py_DECREF(inc);
        int r = occ == NULL ? -1 : 0;
        Py_ssize_t nkind = 0, nocc = 0;
        const char *ukind = NULL, *uocc = NULL;
        if (r == 0 && (!PyUnicode_CheckExact(kind) || !PyUnicode_CheckExact(occ)))
            r = DECLINE;
        if (r == 0 && ((ukind = PyUnicode_AsUTF8AndSize(kind, &nkind)) == NULL ||
                       (uocc = PyUnicode_AsUTF8AndSize(occ, &nocc)) == NULL)) {
            PyErr_Clear(); /* not encodable: the Python encoder raises its own error */
            r = DECLINE;
        }
        if (r == 0) {
            B2 c;
            uint8_t ids[2 + 16 + 2 + 8] = {0x0a, 0x10};
            trace_id4(ids + 2, k, nk, engine_ids, ukind, nkind, uocc, nocc);
            ids[18] = 0x12;
            ids[19] = 0x08;
            b2_init(&c, 8); /* span_id(trace_id, ENGINE_SPAN) */
            b2_update(&c, ids + 2, 16);
            b2_update(&c, PyBytes_AS_STRING(engine_span), PyBytes_GET_SIZE(engine_span));
            b2_update(&c, "\x1f" "0", 2);
            b2_final(&c, ids + 20);
            Py_ssize_t at = open_field(b, 0x6a), kv = -1, v = -1;
            r = at < 0 || put(b, ids, sizeof ids) < 0 || (kv = open_field(b, 0x22)) < 0 ||
                put_str_field(b, 0x0a, k_incident_kind) < 0 || (v = open_field(b, 0x12)) < 0 ||
                put_str_field(b, 0x0a, kind) < 0 || close_field(b, v) < 0 || close_field(b, kv) < 0 ||
                close_field(b, at) < 0 ? -1 : 0;
        }
        Py_XDECREF(kind);
        Py_XDECREF(occ);
        if (r != 0)
            return r;
    }
    return 0;
}

/* One span, as ScopeSpans.spans, into b. 0, DECLINE or -1. `pd_link`: see links(). */
static int span(Buf *b, PyObject *obj, PyObject *tid, PyObject *sid, PyObject *parent_sid, int root, PyObject *cache,
                const char *k, Py_ssize_t nk, const uint8_t *pd_link) {
    uint64_t start, end;
    int r;
    if ((r = get_u64(obj, &s_start_ns, &start)) != 0 || (r = get_u64(obj, &s_end_ns, &end)) != 0)
        return r;
    Py_ssize_t at = open_sized(b, 0x12, 2);
    if (at < 0)
        return -1;
    unsigned char ids[2] = {0x0a, 0x10};
    if (put(b, ids, 2) < 0 || put(b, PyBytes_AS_STRING(tid), 16) < 0)
        return -1;
    ids[0] = 0x12;
    ids[1] = 0x08;
    if (put(b, ids, 2) < 0 || put(b, PyBytes_AS_STRING(sid), 8) < 0)
        return -1;
    if (parent_sid != NULL) {
        ids[0] = 0x22;
        if (put(b, ids, 2) < 0 || put(b, PyBytes_AS_STRING(parent_sid), 8) < 0)
            return -1;
    }
    PyObject *start_t = attr_get(obj, &s_start_timing);
    PyObject *end_t = start_t ? attr_get(obj, &s_end_timing) : NULL;
    PyObject *attrs = end_t ? attr_get(obj, &s_attrs) : NULL;
    PyObject *evs = attrs ? attr_get(obj, &s_events) : NULL;
    PyObject *name = NULL, *timing = NULL;
    r = evs ? 0 : -1;
    if (r == 0) {
        if (root) {
            r = put(b, root_head, root_head_len);
        } else {
            name = attr_get(obj, &s_name);
            r = name == NULL ? -1 : !PyUnicode_Check(name) ? DECLINE : put_str_field(b, 0x2a, name);
            if (r == 0)
                r = put(b, phase_kind, phase_kind_len);
        }
    }
    if (r == 0)
        r = fixed64(b, 0x39, start) < 0 || fixed64(b, 0x41, end) < 0 ? -1 : 0;
    if (r == 0) {
        if (root) {
            PyObject *keys[2] = {k_timing_start, k_timing_end}, *values[2] = {start_t, end_t};
            r = attributes(b, 0x4a, attrs, keys, values, 2);
        } else {
            timing = phase_timing(start_t, end_t);
            PyObject *keys[3] = {k_timing, k_timing_start, k_timing_end}, *values[3] = {timing, start_t, end_t};
            r = timing == NULL ? -1 : attributes(b, 0x4a, attrs, keys, values, 3);
        }
    }
    if (r == 0)
        r = events(b, evs, root ? cache : NULL);
    if (r == 0)
        r = dropped(b, obj);
    if (r == 0 && root)
        r = links(b, evs, k, nk, tid, pd_link);
    if (r == 0 && root) {
        PyObject *et = attr_get(obj, &s_error_type);
        int truth = et == NULL ? -1 : PyObject_IsTrue(et);
        Py_XDECREF(et);
        if (truth < 0) {
            r = -1;
        } else if (truth) {
            PyObject *msg = attr_get(obj, &s_error_message);
            int has = msg == NULL ? -1 : PyObject_IsTrue(msg);
            if (has < 0 || (has && !PyUnicode_Check(msg))) {
                r = has < 0 ? -1 : DECLINE;
            } else {
                Py_ssize_t st = open_field(b, 0x7a);
                if (st < 0 || (has && put_str_field(b, 0x12, msg) < 0) || put1(b, 0x18) < 0 || put1(b, 0x02) < 0)
                    r = -1;
                else
                    r = close_field(b, st);
            }
            Py_XDECREF(msg);
        }
    }
    Py_XDECREF(start_t);
    Py_XDECREF(end_t);
    Py_XDECREF(attrs);
    Py_XDECREF(evs);
    Py_XDECREF(name);
    Py_XDECREF(timing);
    if (r == 0)
        r = close_field(b, at);
    return r;
}

/* `pd`: a half of a disaggregated request, whose trace is, without a caller's context of its
 * own (`parent`), the one read from the P/D key (`pd_context`): mapping.pd_trace. */
static PyObject *encode(PyObject *t, PyObject *tid, PyObject *root_id, PyObject *phase_ids, PyObject *cache,
                        const char *key, Py_ssize_t nkey, int pd, const uint8_t *pd_link) {
    if (!id_bytes(root_id, 8) || !PyList_CheckExact(phase_ids))
        Py_RETURN_NONE;
    PyObject *parent = attr_get(t, &s_parent);
    if (pd && parent == Py_None) {
        Py_DECREF(parent);
        parent = attr_get(t, &s_pd_context);
    }
    PyObject *phases = parent ? attr_get(t, &s_phases) : NULL;
    PyObject *ptid = NULL, *psid = NULL;
    /* One buffer kept between calls (it grows to the largest request once); a nested call,
     * which only odd attribute values could cause through their __str__, gets its own. */
    static Buf kept = {NULL, 0, 0};
    static int kept_busy = 0;
    int own = kept_busy;
    Buf b = own ? (Buf){NULL, 0, 0} : kept;
    b.len = 0;
    kept_busy = 1;
    int r = phases == NULL ? -1 : 0;
    if (r == 0 && (!PyList_Check(phases) || PyList_GET_SIZE(phases) != PyList_GET_SIZE(phase_ids)))
        r = DECLINE;
    if (r == 0 && parent != Py_None) { /* into the caller's trace, under its span when known */
        ptid = attr_get(parent, &s_trace_id);
        psid = ptid ? attr_get(parent, &s_span_id) : NULL;
        if (psid == NULL)
            r = -1;
        else if (!id_bytes(ptid, 16))
            r = DECLINE;
        else {
            int truth = PyObject_IsTrue(psid);
            if (truth < 0)
                r = -1;
            else if (!truth)
                Py_CLEAR(psid);
            else if (!id_bytes(psid, 8))
                r = DECLINE;
        }
        tid = ptid;
    }
    if (r == 0 && !id_bytes(tid, 16))
        r = DECLINE;
    if (r == 0)
        r = span(&b, t, tid, root_id, psid, 1, cache, key, nkey, pd_link);
    for (Py_ssize_t k = 0; r == 0 && k < PyList_GET_SIZE(phases); k++) {
        PyObject *sid = PyList_GET_ITEM(phase_ids, k);
        if (!id_bytes(sid, 8)) {
            r = DECLINE;
            break;
        }
        PyObject *p = PyList_GET_ITEM(phases, k);
        Py_INCREF(p);
        r = span(&b, p, tid, sid, root_id, 0, NULL, key, nkey, NULL);
        Py_DECREF(p);
    }
    Py_XDECREF(parent);
    Py_XDECREF(phases);
    Py_XDECREF(ptid);
    Py_XDECREF(psid);
    PyObject *out = NULL;
    if (r == 0)
        out = PyBytes_FromStringAndSize(b.p, b.len);
    else if (r == DECLINE && !PyErr_Occurred())
        out = Py_NewRef(Py_None);
    if (own) {
        PyMem_Free(b.p);
    } else {
        kept = b;
        kept_busy = 0;
    }
    return out;
}

static Attr s_source = {NULL}, s_key = {NULL}, s_request_id = {NULL}, s_occurrence = {NULL}, s_index = {NULL};

/* a str attribute as UTF-8; NULL (with or without an error set) when it is not an exact str */
static const char *utf8_attr(PyObject *obj, Attr *a, PyObject **hold, Py_ssize_t *len) {
    *hold = attr_get(obj, a);
    if (*hold == NULL || !PyUnicode_CheckExact(*hold))
        return NULL;
    const char *u = PyUnicode_AsUTF8AndSize(*hold, len);
    if (u == NULL)
        PyErr_Clear(); /* not encodable: the Python encoder raises its own error */
    return u;
}

/* mapping.pd_key: which half of a disaggregated request a root's attributes say it is (its role
 * and where that half keeps the prefill's engine request id are configure's), the id in *key
 * (a new reference, an exact str; a prefill without one: its request id `rid`) and, when the id
 * lacks vLLM's random suffix, the prefill's engine id in *engine (a new reference or NULL);
 * PD_NONE when they name none. Anything but exact strs where the pipeline puts them: DECLINE
 * (Python compares and formats whatever it is). */
enum { PD_NONE = 0, PD_PREFILL = 2, PD_DECODE = 3 };
static PyObject *k_pd_role, *v_pd_prefill, *v_pd_decode, *k_pd_prefill_key, *k_pd_decode_key;
static PyObject *k_pd_prefill_engine, *k_pd_decode_engine;
static PyObject *pd_ids_kind;                          /* mapping.PD_IDS as UTF-8 bytes */
static char pd_prefill_suffix[32], pd_decode_suffix[32]; /* "\x1f<index>" of each half's root span id */
static int pd_prefill_suffix_len, pd_decode_suffix_len;

/* mapping._RANDOM_SUFFIX: `-` and 8 lowercase hex digits at the end (ASCII: the UTF-8's last 9 bytes) */
static int random_suffix(const char *u, Py_ssize_t n) {
    if (n < 9 || u[n - 9] != '-')
        return 0;
    for (Py_ssize_t i = n - 8; i < n; i++)
        if (!((u[i] >= '0' && u[i] <= '9') || (u[i] >= 'a' && u[i] <= 'f')))
            return 0;
    return 1;
}

static int pd_half(PyObject *attrs, PyObject *rid, PyObject **key, PyObject **engine) {
    if (!PyDict_CheckExact(attrs))
        return DECLINE;
    PyObject *role = PyDict_GetItemWithError(attrs, k_pd_role); /* borrowed */
    if (role == NULL)
        return PyErr_Occurred() ? -1 : PD_NONE;
    if (!PyUnicode_CheckExact(role))
        return DECLINE;
    int half = PyUnicode_Compare(role, v_pd_prefill) == 0 ? PD_PREFILL
               : PyUnicode_Compare(role, v_pd_decode) == 0 ? PD_DECODE : PD_NONE;
    if (half == PD_NONE)
        return PD_NONE;
    PyObject *k = PyDict_GetItemWithError(attrs, half == PD_PREFILL ? k_pd_prefill_key : k_pd_decode_key);
    if (k == NULL && PyErr_Occurred())
        return -1;
    if (k == NULL && half == PD_PREFILL) /* `attrs.get(INTERNAL_ID, request_id)` */
        k = rid;
    if (k == NULL)
        return PD_NONE;
    if (PyUnicode_Check(k) && !PyUnicode_CheckExact(k))
        return DECLINE;
    if (!PyUnicode_Check(k) || PyUnicode_GET_LENGTH(k) == 0) /* `isinstance(key, str) and key` */
        return PD_NONE;
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(k, &n);
    if (u == NULL) {
        PyErr_Clear(); /* not encodable: the Python encoder raises its own error */
        return DECLINE;
    }
    if (!random_suffix(u, n)) { /* ids not randomised: the prefill's engine id goes first, when known */
        PyObject *e = PyDict_GetItemWithError(attrs, half == PD_PREFILL ? k_pd_prefill_engine : k_pd_decode_engine);
        if (e == NULL && PyErr_Occurred())
            return -1;
        if (e != NULL && PyUnicode_Check(e) && !PyUnicode_CheckExact(e))
            return DECLINE;
        if (e != NULL && PyUnicode_Check(e) && PyUnicode_GET_LENGTH(e) > 0)
            *engine = Py_NewRef(e);
    }
    *key = Py_NewRef(k);
    return half;
}

/* span_id(trace, REQUEST_SPAN, index), `suffix` being "\x1f<index>" */
static void root_span_id(const uint8_t *trace, const char *suffix, Py_ssize_t n, uint8_t *out) {
    B2 c;
    b2_init(&c, 8);
    b2_update(&c, trace, 16);
    b2_update(&c, PyBytes_AS_STRING(request_span), PyBytes_GET_SIZE(request_span));
    b2_update(&c, suffix, n);
    b2_final(&c, out);
}

static PyObject *spans(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    /* spans(timeline, cache) -> bytes | None: `request` with the ids of mapping.request_spans
     * (ids.py's hashes) computed here */
    if (nargs != 2 || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "spans(timeline, cache: dict)");
        return NULL;
    }
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "_fastwire.configure() first");
        return NULL;
    }
    PyObject *t = args[0], *src = NULL, *key = NULL, *rid = NULL, *occ = NULL, *phases = NULL, *ids = NULL;
    PyObject *tid = NULL, *root = NULL, *out = NULL, *attrs = NULL, *pd_key = NULL, *pd_engine = NULL;
    Py_ssize_t nk, nr, no, npd, npe = 0;
    const char *k, *r, *o, *pd, *pe = NULL;
    B2 c;
    uint8_t d[16], rootd[8], linkd[8];
    src = attr_get(t, &s_source);
    if (src == NULL)
        return NULL;
    k = utf8_attr(src, &s_key, &key, &nk);
    attrs = k ? attr_get(t, &s_attrs) : NULL;
    if (attrs == NULL)
        goto done;
    rid = attr_get(t, &s_request_id);
    if (rid == NULL)
        goto done;
    int half = pd_half(attrs, rid, &pd_key, &pd_engine);
    Py_CLEAR(rid);
    if (half == DECLINE || half < 0)
        goto done;
    if (half == PD_NONE) {
        r = utf8_attr(t, &s_request_id, &rid, &nr);
        o = r ? utf8_attr(t, &s_occurrence, &occ, &no) : NULL;
        if (o == NULL)
            goto done;
        trace_id4(d, k, nk, request_ids, r, nr, o, no);
        b2_init(&c, 8); /* span_id(trace_id + occurrence, REQUEST_SPAN) */
        b2_update(&c, d, 16);
        b2_update(&c, o, no);
        b2_update(&c, PyBytes_AS_STRING(request_span), PyBytes_GET_SIZE(request_span));
        b2_update(&c, "\x1f" "0", 2);
        b2_final(&c, rootd);
    } else { /* pd_ids(key, role): no source, no request id, so another agent agrees */
        if ((pd = PyUnicode_AsUTF8AndSize(pd_key, &npd)) == NULL ||
            (pd_engine != NULL && (pe = PyUnicode_AsUTF8AndSize(pd_engine, &npe)) == NULL)) {
            PyErr_Clear(); /* not encodable: the Python encoder raises its own error */
            goto done;
        }
        b2_init(&c, 16); /* trace_id("", PD_IDS, key, ""), the key `engine\x1fid` or `id` */
        b2_update(&c, "\x1f", 1);
        b2_update(&c, PyBytes_AS_STRING(pd_ids_kind), PyBytes_GET_SIZE(pd_ids_kind));
        b2_update(&c, "\x1f", 1);
        if (pe != NULL) {
            b2_update(&c, pe, npe);
            b2_update(&c, "\x1f", 1);
        }
        b2_update(&c, pd, npd);
        b2_update(&c, "\x1f", 1);
        b2_final(&c, d);
        if (half == PD_PREFILL) {
            root_span_id(d, pd_prefill_suffix, pd_prefill_suffix_len, rootd);
        } else { /* the decode's root, and its link to the prefill's */
            root_span_id(d, pd_decode_suffix, pd_decode_suffix_len, rootd);
            root_span_id(d, pd_prefill_suffix, pd_prefill_suffix_len, linkd);
        }
    }
    if ((tid = PyBytes_FromStringAndSize((const char *)d, 16)) == NULL)
        goto done;
    if ((root = PyBytes_FromStringAndSize((const char *)rootd, 8)) == NULL)
        goto done;
    phases = attr_get(t, &s_phases);
    if (phases == NULL || !PyList_CheckExact(phases))
        goto done;
    Py_ssize_t n = PyList_GET_SIZE(phases);
    if ((ids = PyList_New(n)) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) { /* span_id(root_id, name, index) */
        PyObject *p = PyList_GET_ITEM(phases, i), *name, *index;
        Py_ssize_t nn;
        const char *u = utf8_attr(p, &s_name, &name, &nn);
        index = u ? attr_get(p, &s_index) : NULL;
        char num[32];
        int ok = index != NULL && PyLong_CheckExact(index);
        long long x = ok ? PyLong_AsLongLong(index) : 0;
        if (ok && x == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            ok = 0;
        }
        if (ok) {
            int len = snprintf(num, sizeof num, "%lld", x);
            b2_init(&c, 8);
            b2_update(&c, rootd, 8);
            b2_update(&c, u, nn);
            b2_update(&c, "\x1f", 1);
            b2_update(&c, num, len);
            b2_final(&c, d);
            PyObject *b = PyBytes_FromStringAndSize((const char *)d, 8);
            if (b == NULL)
                ok = 0;
            else
                PyList_SET_ITEM(ids, i, b);
        }
        Py_XDECREF(name);
        Py_XDECREF(index);
        if (!ok)
            goto done;
    }
    out = encode(t, tid, root, ids, args[1], k, nk, half != PD_NONE, half == PD_DECODE ? linkd : NULL);
done:
    Py_XDECREF(src);
    Py_XDECREF(key);
    Py_XDECREF(attrs);
    Py_XDECREF(pd_key);
    Py_XDECREF(pd_engine);
    Py_XDECREF(rid);
    Py_XDECREF(occ);
    Py_XDECREF(phases);
    Py_XDECREF(ids);
    Py_XDECREF(tid);
    Py_XDECREF(root);
    if (out == NULL && !PyErr_Occurred())
        out = Py_NewRef(Py_None);
    return out;
}

static PyObject *key_values(PyObject *self, PyObject *args) {
    /* key_values(tag, attrs) -> bytes: every attribute as a whole field of `tag` (tests) */
    int tag;
    PyObject *attrs;
    if (!PyArg_ParseTuple(args, "iO", &tag, &attrs))
        return NULL;
    Buf b = {NULL, 0, 0};
    PyObject *out = NULL;
    if (attributes(&b, (unsigned char)tag, attrs, NULL, NULL, 0) == 0)
        out = PyBytes_FromStringAndSize(b.p ? b.p : "", b.len);
    PyMem_Free(b.p);
    return out;
}

/* one item of configure's dict: a str (kept, and as UTF-8 bytes when `utf8`), an int or bytes */
static PyObject *config_item(PyObject *d, const char *key, int want_str) {
    PyObject *v = PyDict_GetItemString(d, key);
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "configure: %s missing", key);
        return NULL;
    }
    if (want_str && !PyUnicode_CheckExact(v)) {
        PyErr_Format(PyExc_TypeError, "configure: %s must be a str", key);
        return NULL;
    }
    return Py_NewRef(v);
}

static int config_str(PyObject *d, const char *key, PyObject **out) {
    PyObject *v = config_item(d, key, 1);
    if (v == NULL)
        return -1;
    Py_XSETREF(*out, v);
    return 0;
}

static int config_utf8(PyObject *d, const char *key, PyObject **out) {
    PyObject *v = config_item(d, key, 1);
    PyObject *u = v ? PyUnicode_AsUTF8String(v) : NULL;
    Py_XDECREF(v);
    if (u == NULL)
        return -1;
    Py_XSETREF(*out, u);
    return 0;
}

static int config_int(PyObject *d, const char *key, long long lo, long long hi, long long *out) {
    PyObject *v = config_item(d, key, 0);
    if (v == NULL)
        return -1;
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (x < lo || x > hi) {
        PyErr_Format(PyExc_ValueError, "configure: %s out of range", key);
        return -1;
    }
    *out = x;
    return 0;
}

static PyObject *configure(PyObject *self, PyObject *d) {
    /* configure(names: dict): the mapping's names and the encoder's limits (wire._load_fast) */
    if (!PyDict_Check(d)) {
        PyErr_SetString(PyExc_TypeError, "configure(names: dict)");
        return NULL;
    }
    long long server, internal, limit, pd_prefill_index, pd_decode_index;
    PyObject *person = NULL, *type = NULL;
    if (config_str(d, "timing", &k_timing) < 0 || config_str(d, "timing_start", &k_timing_start) < 0 ||
        config_str(d, "timing_end", &k_timing_end) < 0 || config_str(d, "inferred", &v_inferred) < 0 ||
        config_str(d, "observed", &v_observed) < 0 || config_str(d, "incident_kind", &k_incident_kind) < 0 ||
        config_utf8(d, "request_ids", &request_ids) < 0 || config_utf8(d, "engine_ids", &engine_ids) < 0 ||
        config_utf8(d, "request_span", &request_span) < 0 || config_utf8(d, "engine_span", &engine_span) < 0 ||
        config_int(d, "kind_server", 0, 127, &server) < 0 || config_int(d, "kind_internal", 0, 127, &internal) < 0 ||
        config_int(d, "cache_limit", 1, PY_SSIZE_T_MAX, &limit) < 0 ||
        (person = config_item(d, "person", 0)) == NULL || (type = config_item(d, "incident_event", 0)) == NULL ||
        config_str(d, "pd_role", &k_pd_role) < 0 || config_str(d, "pd_prefill", &v_pd_prefill) < 0 ||
        config_str(d, "pd_decode", &v_pd_decode) < 0 || config_str(d, "pd_prefill_key", &k_pd_prefill_key) < 0 ||
        config_str(d, "pd_decode_key", &k_pd_decode_key) < 0 || config_utf8(d, "pd_ids", &pd_ids_kind) < 0 ||
        config_str(d, "pd_prefill_engine", &k_pd_prefill_engine) < 0 ||
        config_str(d, "pd_decode_engine", &k_pd_decode_engine) < 0 ||
        config_int(d, "pd_prefill_index", LLONG_MIN, LLONG_MAX, &pd_prefill_index) < 0 ||
        config_int(d, "pd_decode_index", LLONG_MIN, LLONG_MAX, &pd_decode_index) < 0)
        goto fail;
    if (!PyBytes_CheckExact(person) || PyBytes_GET_SIZE(person) > 16 || !PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "configure: person must be bytes (16 at most), incident_event a type");
        goto fail;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(request_span);
    if (n > (Py_ssize_t)sizeof root_head - 4) { /* tag, a 1-byte length, the kind field */
        PyErr_SetString(PyExc_ValueError, "configure: request_span too long");
        goto fail;
    }
    root_head[0] = 0x2a; /* Span.name */
    root_head[1] = (unsigned char)n;
    memcpy(root_head + 2, PyBytes_AS_STRING(request_span), n);
    root_head[2 + n] = 0x30; /* Span.kind */
    root_head[3 + n] = (unsigned char)server;
    root_head_len = 4 + n;
    phase_kind[0] = 0x30;
    phase_kind[1] = (unsigned char)internal;
    phase_kind_len = 2;
    pd_prefill_suffix_len = snprintf(pd_prefill_suffix, sizeof pd_prefill_suffix, "\x1f%lld", pd_prefill_index);
    pd_decode_suffix_len = snprintf(pd_decode_suffix, sizeof pd_decode_suffix, "\x1f%lld", pd_decode_index);
    memset(PERSON, 0, sizeof PERSON);
    memcpy(PERSON, PyBytes_AS_STRING(person), PyBytes_GET_SIZE(person));
    Py_XSETREF(incident_type, type);
    type = NULL;
    cache_limit = (Py_ssize_t)limit;
    configured = 1;
    Py_DECREF(person);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(person);
    Py_XDECREF(type);
    configured = 0;
    return NULL;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_O, "configure(names) -> None: the mapping's names, before spans()"},
    {"spans", (PyCFunction)(void (*)(void))spans, METH_FASTCALL,
     "spans(timeline, cache) -> bytes of its spans, ids included, or None (use the Python encoder)"},
    {"key_values", key_values, METH_VARARGS, "key_values(tag, attrs) -> bytes"},
    {"digest", digest, METH_VARARGS, "digest(data, size) -> the personalised BLAKE2b of ids.py"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastwire", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastwire(void) {
    INTERN(s_phases.name, "phases");
    INTERN(s_parent.name, "parent");
    INTERN(s_pd_context.name, "pd_context");
    INTERN(s_trace_id.name, "trace_id");
    INTERN(s_span_id.name, "span_id");
    INTERN(s_start_ns.name, "start_ns");
    INTERN(s_end_ns.name, "end_ns");
    INTERN(s_attrs.name, "attrs");
    INTERN(s_events.name, "events");
    INTERN(s_dropped_events.name, "dropped_events");
    INTERN(s_error_type.name, "error_type");
    INTERN(s_error_message.name, "error_message");
    INTERN(s_start_timing.name, "start_timing");
    INTERN(s_end_timing.name, "end_timing");
    INTERN(s_name.name, "name");
    INTERN(s_ts_ns.name, "ts_ns");
    INTERN(s_source.name, "source");
    INTERN(s_key.name, "key");
    INTERN(s_request_id.name, "request_id");
    INTERN(s_occurrence.name, "occurrence");
    INTERN(s_index.name, "index");
    INTERN(s_incident, "incident");
    INTERN(s_kind.name, "kind");
    INTERN(s_incident_occurrence.name, "occurrence");
    return PyModule_Create(&module);
}
