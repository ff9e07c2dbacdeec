/* The decode stage's fast path: one file's physical lines → Records, for the common line.
 *
 * `records(decoder, joiner, python, lines)` iterates like `for offset, raw in lines: yield
 * from python(raw, offset)` (RecordStream._python: Decoder, then Joiner), and gives the same
 * Records. It handles itself only the line that both Python classes would pass straight through:
 *
 *   - the file's framing is already known (plain, or CRI with decoder._unwrap a CriUnwrapper),
 *     and no partial line is held;
 *   - the line is ASCII (so valid UTF-8), has no ESC and no `\r` before its newline;
 *   - in a CRI file (containerd, CRI-O: `<RFC3339Nano> stdout|stderr P|F <text>`), it is a
 *     whole line (`F`; a `P` part, and the line that ends it, are Python's) on stdout or
 *     stderr, and its stamp is in the second its Rfc3339 has cached (`stamp[:19] == _base`),
 *     with a tail `_RFC3339_TAIL` reads on its first path: a fraction of any length (its first
 *     9 digits, padded to 9) or none, then `Z`, `z`, `±hh:mm`, `±hhmm` or none. Its time is
 *     that stamp, computed as Rfc3339 does (CLOCK_RUNTIME), and the header's is not read;
 *   - its text (the whole line, or what follows the CRI fields) starts with vLLM's header
 *     (`HEADER` in prefix.py, matched on the path the regex tries first), or with V1's process
 *     prefix (`_PROCESS` in prefix.py: `(APIServer pid=1) `, `(VllmWorker rank=0 pid=5) `,
 *     `(RayWorkerWrapper pid=2, ip=10.0.0.1) `) and that header right after it, which is what
 *     split_prefix takes first; the record's process is the prefix's group. A shipper's stamp,
 *     junk, or a header further on is Python's;
 *   - in a plain file, its `MM-DD HH:MM:SS` is the one the decoder's HeaderClock has cached;
 *   - the Joiner holds nothing and the record cannot start a group (level not ERROR or
 *     CRITICAL, message not `Memory profiling takes…`).
 *
 * It then does exactly what Decoder and Joiner do for such a line (stats.lines and
 * stats.records + 1, stats.prefixed + 1 for a prefixed one, decoder._last_ts = ts) and builds
 * the Record by filling its slots. Any other line is handed to `python(raw, offset)`: the
 * Python classes stay the reference and keep all the state; this file only reads it.
 *
 * Replay of the 1M-line seed log, CPU-µs per line, whole process, median of 9 runs
 * (`python bench/replay_cpu.py --cri --lines 1000000 --runs 3`, three times): CRI 8.76 → 5.54
 * since CRI lines are taken here too; plain unchanged (`--runs 1` alternated 8 times: 4.38
 * before, 4.28 after). The decode stage alone on the same files: CRI 3.67 → 0.60, plain 0.24;
 * most of what is left of the CRI figure's gap to plain is the ~10 % of its lines that stay
 * Python's (`P` parts and the lines that end them: 5 % of the seed log's lines are split).
 * That CRI log with V1's process prefix on every logical line (`python bench/decode_prefix.py`),
 * decode stage alone: 5.1 → 0.7 since prefixed lines are taken here too (none were before);
 * its whole replay 10.6 → 5.8. The seed logs, which have no prefix, are unchanged.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

/* -- slot access by the member descriptors' offsets ------------------------------------- */

typedef struct {
    const char *cls, *name;
    Py_ssize_t offset;
} Slot;

enum {
    DEC_STATS, DEC_FRAMING, DEC_PARTS, DEC_LAST_TS, DEC_CLOCK, DEC_UNWRAP, DEC_CUT,
    DEC_PART_OFFSET, DEC_PART_CHARS, DEC_PART_END, DEC_PART_TS, DEC_PART_STREAM, DEC_OTHERS,
    CLK_KEY, CLK_NS,
    CRI_STAMP, RFC_BASE, RFC_BASE_NS,
    ST_LINES, ST_RECORDS, ST_PREFIXED, ST_PARTIALS_JOINED,
    JN_PENDING,
    REC_TS, REC_CLOCK, REC_LEVEL, REC_ORIGIN, REC_MESSAGE, REC_OFFSET, REC_END, REC_PROCESS, REC_CONTINUED,
    N_SLOTS
};
static Slot slots[N_SLOTS] = {
    {"Decoder", "stats"}, {"Decoder", "_framing"}, {"Decoder", "_parts"}, {"Decoder", "_last_ts"},
    {"Decoder", "_clock"}, {"Decoder", "_unwrap"}, {"Decoder", "_cut"},
    {"Decoder", "_part_offset"}, {"Decoder", "_part_chars"}, {"Decoder", "_part_end"}, {"Decoder", "_part_ts"},
    {"Decoder", "_part_stream"}, {"Decoder", "_others"},
    {"HeaderClock", "_cache_key"}, {"HeaderClock", "_cache_ns"},
    {"CriUnwrapper", "_stamp"}, {"Rfc3339", "_base"}, {"Rfc3339", "_base_ns"},
    {"DecodeStats", "lines"}, {"DecodeStats", "records"}, {"DecodeStats", "prefixed"},
    {"DecodeStats", "partials_joined"},
    {"Joiner", "_pending"},
    {"Record", "ts_ns"}, {"Record", "clock"}, {"Record", "level"}, {"Record", "origin"}, {"Record", "message"},
    {"Record", "offset"}, {"Record", "end_offset"}, {"Record", "process"}, {"Record", "continued"},
};
static PyTypeObject *record_type, *decoder_type, *joiner_type, *clock_type, *stats_type, *cri_type, *rfc_type;
static PyObject *plain_str, *cri_str, *header_clock_str, *runtime_clock_str, *empty_str, *levels[5];
/* fast_line's answer for a line it took that makes no record (yet): a CRI `P` part it holds */
static PyObject *consumed;
static PyObject *stream_names[2]; /* "stdout", "stderr": Decoder._part_stream of a part C holds */
static const char *level_names[5] = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"};
static int ready = 0;

#define SLOT(obj, k) (*(PyObject **)((char *)(obj) + slots[k].offset))

static int find_slot(PyObject *classes, Slot *s) {
    PyObject *cls = PyMapping_GetItemString(classes, s->cls);
    if (cls == NULL)
        return -1;
    PyObject *name = PyUnicode_FromString(s->name);
    PyObject *descr = name ? PyObject_GetAttr(cls, name) : NULL;
    Py_XDECREF(name);
    Py_DECREF(cls);
    if (descr == NULL)
        return -1;
    int ok = PyObject_TypeCheck(descr, &PyMemberDescr_Type) &&
             ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
    if (ok)
        s->offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    Py_DECREF(descr);
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", s->cls, s->name);
        return -1;
    }
    return 0;
}

static int get_type(PyObject *classes, const char *name, PyTypeObject **out) {
    PyObject *cls = PyMapping_GetItemString(classes, name);
    if (cls == NULL)
        return -1;
    if (!PyType_Check(cls)) {
        Py_DECREF(cls);
        PyErr_Format(PyExc_TypeError, "%s is not a class", name);
        return -1;
    }
    Py_XSETREF(*out, (PyTypeObject *)cls);
    return 0;
}

static PyObject *init(PyObject *self, PyObject *args) {
    PyObject *classes, *plain, *cri, *header, *runtime;
    if (!PyArg_ParseTuple(args, "OUUUU", &classes, &plain, &cri, &header, &runtime))
        return NULL;
    for (int k = 0; k < N_SLOTS; k++)
        if (find_slot(classes, &slots[k]) < 0)
            return NULL;
    if (get_type(classes, "Record", &record_type) < 0 || get_type(classes, "Decoder", &decoder_type) < 0 ||
        get_type(classes, "Joiner", &joiner_type) < 0 || get_type(classes, "HeaderClock", &clock_type) < 0 ||
        get_type(classes, "DecodeStats", &stats_type) < 0 || get_type(classes, "CriUnwrapper", &cri_type) < 0 ||
        get_type(classes, "Rfc3339", &rfc_type) < 0)
        return NULL;
    /* make_record sets the REC_ slots, one per field: a field added to Record in Python and not
     * here would be left unset, so that is refused (fields are counted as cls_load does) */
    PyObject *fields = PyObject_GetAttrString((PyObject *)record_type, "__dataclass_fields__");
    Py_ssize_t n_fields = fields == NULL ? -1 : PyObject_Length(fields);
    Py_XDECREF(fields);
    if (n_fields < 0)
        return NULL;
    if (n_fields != REC_CONTINUED - REC_TS + 1) {
        PyErr_SetString(PyExc_TypeError, "Record changed shape: update _fastdecode.c");
        return NULL;
    }
    Py_XSETREF(plain_str, Py_NewRef(plain));
    Py_XSETREF(cri_str, Py_NewRef(cri));
    Py_XSETREF(header_clock_str, Py_NewRef(header));
    Py_XSETREF(runtime_clock_str, Py_NewRef(runtime));
    ready = 1;
    Py_RETURN_NONE;
}

/* -- the header ------------------------------------------------------------------------- */

static inline int is_space(unsigned char c) { /* Python's `\s` on ASCII */
    return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f);
}
static inline int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static inline int is_alpha_(unsigned char c) { /* [A-Za-z_] */
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}
static inline int is_word(unsigned char c) { return is_alpha_(c) || is_digit(c); } /* `\w` on ASCII */

typedef struct {
    int level;                    /* index in level_names */
    Py_ssize_t stamp;             /* 14 chars */
    Py_ssize_t origin_a, origin_b;
    Py_ssize_t end;               /* m.end(): where the message starts */
} Header;

/* HEADER = (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,]\d+)? \[?([^\s\]]+:\d+)\] ?
 * at position 0, on the regex's first path; 0 when that path fails (the caller declines). */
static int header(const char *s, Py_ssize_t n, Header *h) {
    Py_ssize_t i = 0;
    h->level = -1;
    for (int k = 0; k < 5; k++) {
        size_t len = strlen(level_names[k]);
        if ((Py_ssize_t)len < n && memcmp(s, level_names[k], len) == 0 && s[len] == ' ') {
            h->level = k;
            i = (Py_ssize_t)len + 1;
            break;
        }
    }
    if (h->level < 0 || n - i < 15)
        return 0;
    static const char shape[] = "dd-dd dd:dd:dd";
    for (int k = 0; k < 14; k++) {
        char c = s[i + k];
        if (shape[k] == 'd' ? !is_digit(c) : c != shape[k])
            return 0;
    }
    h->stamp = i;
    i += 14;
    if (i + 1 < n && (s[i] == '.' || s[i] == ',') && is_digit(s[i + 1])) {
        i += 2;
        while (i < n && is_digit(s[i]))
            i++;
    }
    if (i >= n || s[i] != ' ')
        return 0;
    i++;
    if (i < n && s[i] == '[')
        i++;
    Py_ssize_t a = i;
    while (i < n && !is_space(s[i]) && s[i] != ']')
        i++;
    /* the run must end with `:\d+` after at least one character, and be followed by `]` */
    if (i >= n || s[i] != ']')
        return 0;
    Py_ssize_t d = i;
    while (d > a && is_digit(s[d - 1]))
        d--;
    if (d == i || d - 1 <= a || s[d - 1] != ':')
        return 0;
    h->origin_a = a;
    h->origin_b = i;
    i++;
    if (i < n && s[i] == ' ')
        i++;
    h->end = i;
    return 1;
}

/* -- the process prefix: `(APIServer pid=1) `, `(RayWorkerWrapper pid=2, ip=10.0.0.1) ` -- */

/* A run of `[\w.-]`, or of `[\w.=-]` with `eq`, from i: where it stops. */
static Py_ssize_t word_end(const char *s, Py_ssize_t n, Py_ssize_t i, int eq) {
    while (i < n && (is_word(s[i]) || s[i] == '.' || s[i] == '-' || (eq && s[i] == '=')))
        i++;
    return i;
}

static inline int is_ip(unsigned char c) { /* [0-9A-Fa-f.:] */
    return is_digit(c) || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f') || c == '.' || c == ':';
}

/* ` pid=\d+(?:, ip=[0-9A-Fa-f.:]+)?\)` at i: where the `)` is, or -1. `\d+` and the address
 * run are taken whole: a digit or address character given back is not `,` or `)`, and without
 * the `, ip=…` part the `)` would have to be where its `,` is. */
static Py_ssize_t pid_close(const char *s, Py_ssize_t n, Py_ssize_t i) {
    if (n - i < 6 || memcmp(s + i, " pid=", 5) != 0 || !is_digit(s[i + 5]))
        return -1;
    for (i += 6; i < n && is_digit(s[i]); i++)
        ;
    if (n - i >= 6 && memcmp(s + i, ", ip=", 5) == 0 && is_ip(s[i + 5]))
        for (i += 6; i < n && is_ip(s[i]); i++)
            ;
    return i < n && s[i] == ')' ? i : -1;
}

/* _PROCESS.match(text) (prefix.py) on ASCII text:
 *     \(([A-Za-z_][\w.-]*(?: [A-Za-z_][\w.=-]*)*? pid=\d+(?:, ip=[0-9A-Fa-f.:]+)?)\) ?
 * Each word is a maximal run: what may follow one (a space) is in neither class, so the regex
 * gains nothing by giving characters back. At each space the lazy `*?` first tries the end
 * (` pid=\d+…)`), then takes one more word (which may itself read `pid=5`) and tries again.
 * Gives where the group ends (its `)`) and m.end() (after one space, if there is one); 0 when
 * it does not match. */
static int process_prefix(const char *s, Py_ssize_t n, Py_ssize_t *close, Py_ssize_t *end) {
    if (n < 2 || s[0] != '(' || !is_alpha_(s[1]))
        return 0;
    Py_ssize_t i = word_end(s, n, 2, 0);
    for (;;) {
        if (i >= n || s[i] != ' ')
            return 0;
        Py_ssize_t c = pid_close(s, n, i);
        if (c >= 0) {
            *close = c;
            *end = c + 1 < n && s[c + 1] == ' ' ? c + 2 : c + 1;
            return 1;
        }
        if (i + 1 >= n || !is_alpha_(s[i + 1]))
            return 0;
        i = word_end(s, n, i + 2, 1);
    }
}

/* All bytes below 0x80 and none ESC, eight at a time. */
static int ascii_without_esc(const char *s, Py_ssize_t n) {
    const uint64_t high = 0x8080808080808080ULL, ones = 0x0101010101010101ULL, esc = 0x1b * ones;
    Py_ssize_t k = 0;
    for (; k + 8 <= n; k += 8) {
        uint64_t w;
        memcpy(&w, s + k, 8);
        uint64_t x = w ^ esc; /* a zero byte where w has ESC */
        if ((w & high) || ((x - ones) & ~x & high))
            return 0;
    }
    for (; k < n; k++) {
        unsigned char c = s[k];
        if (c >= 0x80 || c == 0x1b)
            return 0;
    }
    return 1;
}

/* A str of ASCII bytes, without going through the UTF-8 decoder. */
static PyObject *ascii_str(const char *s, Py_ssize_t n) {
    PyObject *o = PyUnicode_New(n, 127);
    if (o != NULL)
        memcpy(PyUnicode_1BYTE_DATA(o), s, n);
    return o;
}

/* A small cache of the strings a log repeats, origins (`scheduler.py:234`) and processes
 * (`APIServer pid=1`): a log has a handful of each. */
#define NAMES 64
static PyObject *name_cache[NAMES];

static PyObject *name_str(const char *s, Py_ssize_t len) {
    unsigned h = 2166136261u;
    for (Py_ssize_t k = 0; k < len; k++)
        h = (h ^ (unsigned char)s[k]) * 16777619u;
    PyObject **slot = &name_cache[h % NAMES];
    PyObject *o = *slot;
    if (o != NULL && PyUnicode_GET_LENGTH(o) == len && memcmp(PyUnicode_1BYTE_DATA(o), s, len) == 0)
        return Py_NewRef(o);
    o = ascii_str(s, len);
    if (o != NULL)
        Py_XSETREF(*slot, Py_NewRef(o));
    return o;
}

/* An int slot as a Py_ssize_t; negative when it is not an exact int or does not fit (the
 * caller declines, before changing anything). */
static Py_ssize_t ssize_slot(PyObject *obj, int k) {
    PyObject *v = SLOT(obj, k);
    if (v == NULL || !PyLong_CheckExact(v))
        return -1;
    Py_ssize_t x = PyLong_AsSsize_t(v);
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return x;
}

/* The count held in a stats slot, when it is an int that can take one more; negative otherwise. */
static Py_ssize_t count(PyObject *stats, int k) {
    Py_ssize_t x = ssize_slot(stats, k);
    return x == PY_SSIZE_T_MAX ? -1 : x;
}

static int set_count(PyObject *stats, int k, Py_ssize_t x) {
    PyObject *v = PyLong_FromSsize_t(x);
    if (v == NULL)
        return -1;
    Py_XSETREF(SLOT(stats, k), v);
    return 0;
}

/* The header of a record that Decoder._record makes from `text` with no prefix, and that the
 * Joiner passes straight through: vLLM's header at the start (on the regex's first path), a
 * level and a message that cannot start a group. 0 to decline. */
static int passing_header(const char *text, Py_ssize_t len, Header *h) {
    if (!header(text, len, h) || h->level >= 3) /* ERROR and CRITICAL may start a group */
        return 0;
    static const char memory[] = "Memory profiling takes";
    Py_ssize_t msg_len = len - h->end;
    return !(msg_len >= (Py_ssize_t)sizeof memory - 1 && memcmp(text + h->end, memory, sizeof memory - 1) == 0);
}

/* What HeaderClock(stamp) gives for the header's `MM-DD HH:MM:SS` when it is the cached second
 * (borrowed); NULL otherwise (the caller declines: Python refreshes the cache). */
static PyObject *header_second(PyObject *decoder, const char *stamp) {
    PyObject *clock = SLOT(decoder, DEC_CLOCK);
    if (clock == NULL || Py_TYPE(clock) != clock_type)
        return NULL;
    PyObject *key = SLOT(clock, CLK_KEY), *ts = SLOT(clock, CLK_NS);
    if (key == NULL || ts == NULL || !PyUnicode_Check(key) || !PyUnicode_IS_ASCII(key) ||
        PyUnicode_GET_LENGTH(key) != 14 || memcmp(PyUnicode_1BYTE_DATA(key), stamp, 14) != 0)
        return NULL;
    return ts;
}

/* Whether the header's `MM-DD HH:MM:SS` names the same second of the minute as the epoch ns
 * `ns` (a header is local time, offset from UTC by whole minutes). */
static int same_second(const char *stamp, long long ns) {
    if (!is_digit(stamp[12]) || !is_digit(stamp[13]))
        return 0;
    return (stamp[12] - '0') * 10 + (stamp[13] - '0') == (int)((ns / 1000000000LL) % 60);
}

/* -- CRI framing ------------------------------------------------------------------------ */

static inline int digits2(const char *s) { return is_digit(s[0]) && is_digit(s[1]); }

/* Beyond this a base second is declined, so that adding the fraction and an offset cannot
 * overflow (2^62 ns: the years 1824 to 2116). */
#define BASE_NS_LIMIT ((long long)1 << 62)

/* CriUnwrapper(line) with its Rfc3339, for the common CRI line `<stamp> stdout|stderr F|P <text>`
 * (`*partial`: a `P` part, which fast_line holds as Decoder does), its stamp in the second Rfc3339 has cached
 * (`stamp[:19] == _base`, so `_base_ns` applies as is), and the stamp's tail read by
 * `_RFC3339_TAIL` on its first path: `.` and digits (the first 9 taken, padded to 9) or none,
 * then `Z`, `z`, `+hh:mm`, `+hhmm` (or `-`) or none, then the stamp's end. Gives where the
 * text starts (after the fourth field's space) and the stamp in ns, computed as Rfc3339 does;
 * 0 to decline (Python decides, and refreshes the cache on a new second). */
static int cri_frame(PyObject *decoder, const char *s, Py_ssize_t n, Py_ssize_t *text, long long *ns, int *partial,
                     int *err) {
    PyObject *unwrap = SLOT(decoder, DEC_UNWRAP);
    if (unwrap == NULL || Py_TYPE(unwrap) != cri_type)
        return 0;
    PyObject *rfc = SLOT(unwrap, CRI_STAMP);
    if (rfc == NULL || Py_TYPE(rfc) != rfc_type)
        return 0;
    PyObject *base = SLOT(rfc, RFC_BASE), *base_ns = SLOT(rfc, RFC_BASE_NS);
    if (base == NULL || base_ns == NULL || !PyUnicode_CheckExact(base) || !PyUnicode_IS_ASCII(base) ||
        PyUnicode_GET_LENGTH(base) != 19 || !PyLong_CheckExact(base_ns))
        return 0;
    /* line.split(" ", 3): the stamp runs to the first space, then `stdout`/`stderr`, `F` */
    const char *space = memchr(s, ' ', n);
    if (space == NULL)
        return 0;
    Py_ssize_t e = space - s;
    if (e < 19 || memcmp(s, PyUnicode_1BYTE_DATA(base), 19) != 0)
        return 0;
    if (n - e - 1 < 9 || (memcmp(s + e + 1, "stdout ", 7) != 0 && memcmp(s + e + 1, "stderr ", 7) != 0) ||
        (s[e + 8] != 'F' && s[e + 8] != 'P') || s[e + 9] != ' ')
        return 0;
    *partial = s[e + 8] == 'P';
    *err = s[e + 4] == 'e'; /* std(e)rr, not std(o)ut */
    /* _RFC3339_TAIL.match(stamp, 19): (?:\.(\d{1,9})\d*)?(Z|z|[+-]\d\d:?\d\d)?$ */
    Py_ssize_t i = 19;
    long long frac = 0, shift = 0;
    if (i < e && s[i] == '.') {
        if (i + 1 >= e || !is_digit(s[i + 1]))
            return 0;
        int k = 0;
        for (i++; i < e && is_digit(s[i]); i++, k++)
            if (k < 9)
                frac = frac * 10 + (s[i] - '0');
        for (; k < 9; k++) /* int(frac.ljust(9, "0")) */
            frac *= 10;
    }
    if (i < e && (s[i] == 'Z' || s[i] == 'z')) {
        i++;
    } else if (i < e && (s[i] == '+' || s[i] == '-')) {
        const char *tz = s + i;
        Py_ssize_t len = e - i; /* the offset must run to the stamp's end: `$` */
        if (!((len == 6 && digits2(tz + 1) && tz[3] == ':' && digits2(tz + 4)) ||
              (len == 5 && digits2(tz + 1) && digits2(tz + 3))))
            return 0;
        int hh = (tz[1] - '0') * 10 + (tz[2] - '0'), mm = (tz[len - 2] - '0') * 10 + (tz[len - 1] - '0');
        shift = (tz[0] == '+' ? 1 : -1) * (hh * 3600LL + mm * 60LL) * 1000000000LL;
        i = e;
    }
    if (i != e)
        return 0;
    int overflow;
    long long b = PyLong_AsLongLongAndOverflow(base_ns, &overflow);
    if (b == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (overflow || b > BASE_NS_LIMIT || b < -BASE_NS_LIMIT)
        return 0;
    *ns = b + frac - shift;
    if (*ns < 0) /* before 1970: Decoder replaces it (2^62 ns, the upper limit, is before 2500) */
        return 0;
    *text = e + 10;
    return 1;
}

/* The Record that Decoder._record makes for a taken line's text from its header on, with the
 * process prefix's group (empty: none): `ts` stolen, `clock` borrowed. */
static PyObject *make_record(const char *text, Py_ssize_t len, const Header *h, const char *process,
                             Py_ssize_t process_len, PyObject *ts, PyObject *clock, PyObject *offset,
                             Py_ssize_t end_offset) {
    PyObject *rec = record_type->tp_alloc(record_type, 0);
    if (rec == NULL) {
        Py_DECREF(ts);
        return NULL;
    }
    PyObject *origin = name_str(text + h->origin_a, h->origin_b - h->origin_a);
    PyObject *message = ascii_str(text + h->end, len - h->end);
    PyObject *end = PyLong_FromSsize_t(end_offset);
    PyObject *proc = process_len ? name_str(process, process_len) : Py_NewRef(empty_str);
    SLOT(rec, REC_TS) = ts;
    SLOT(rec, REC_CLOCK) = Py_NewRef(clock);
    SLOT(rec, REC_LEVEL) = Py_NewRef(levels[h->level]);
    SLOT(rec, REC_ORIGIN) = origin;
    SLOT(rec, REC_MESSAGE) = message;
    SLOT(rec, REC_OFFSET) = Py_NewRef(offset);
    SLOT(rec, REC_END) = end;
    SLOT(rec, REC_PROCESS) = proc;
    SLOT(rec, REC_CONTINUED) = Py_NewRef(Py_False);
    if (origin == NULL || message == NULL || end == NULL || proc == NULL) {
        Py_DECREF(rec);
        return NULL;
    }
    return rec;
}

/* Decoder._MAX_PARTIAL_CHARS: a partial line this long is cut, which is Python's to do. */
#define MAX_PARTIAL_CHARS (4 * 1024 * 1024)

/* Decoder.__call__ on a CRI `P` part: held in `_parts` (the first one's offset and stamp kept),
 * no record yet. `consumed` (borrowed) when held, Py_None to decline (a part that reaches
 * _MAX_PARTIAL_CHARS is cut, by Python), NULL on error. */
static PyObject *hold_part(PyObject *decoder, PyObject *stats, PyObject *parts, const char *text, Py_ssize_t len,
                           PyObject *offset, Py_ssize_t end, long long ns, Py_ssize_t lines, int err) {
    int first = PyList_GET_SIZE(parts) == 0;
    Py_ssize_t chars = first ? 0 : ssize_slot(decoder, DEC_PART_CHARS);
    if (chars < 0 || chars + len >= MAX_PARTIAL_CHARS)
        return Py_None;
    PyObject *part = ascii_str(text, len), *total = PyLong_FromSsize_t(chars + len), *end_o = PyLong_FromSsize_t(end);
    PyObject *ts = first ? PyLong_FromLongLong(ns) : NULL;
    if (part == NULL || total == NULL || end_o == NULL || (first && ts == NULL) || PyList_Append(parts, part) < 0 ||
        set_count(stats, ST_LINES, lines + 1) < 0) {
        Py_XDECREF(part);
        Py_XDECREF(total);
        Py_XDECREF(end_o);
        Py_XDECREF(ts);
        return NULL;
    }
    Py_DECREF(part);
    if (first) {
        Py_XSETREF(SLOT(decoder, DEC_PART_STREAM), Py_NewRef(stream_names[err]));
        Py_XSETREF(SLOT(decoder, DEC_PART_OFFSET), Py_NewRef(offset));
        Py_XSETREF(SLOT(decoder, DEC_PART_TS), ts);
    }
    Py_XSETREF(SLOT(decoder, DEC_PART_CHARS), total);
    Py_XSETREF(SLOT(decoder, DEC_PART_END), end_o);
    return consumed;
}

/* The parts held and this line's text, joined as Decoder._take_parts does, into a new buffer
 * (PyMem_Free it); NULL with no error set to decline (a part not an ASCII str: Python's). */
static char *joined(PyObject *parts, const char *text, Py_ssize_t len, Py_ssize_t *total) {
    Py_ssize_t n = len;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(parts); k++) {
        PyObject *p = PyList_GET_ITEM(parts, k);
        if (!PyUnicode_CheckExact(p) || !PyUnicode_IS_ASCII(p))
            return NULL;
        n += PyUnicode_GET_LENGTH(p);
    }
    char *buf = PyMem_Malloc(n > 0 ? n : 1);
    if (buf == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    Py_ssize_t at = 0;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(parts); k++) {
        PyObject *p = PyList_GET_ITEM(parts, k);
        memcpy(buf + at, PyUnicode_1BYTE_DATA(p), PyUnicode_GET_LENGTH(p));
        at += PyUnicode_GET_LENGTH(p);
    }
    memcpy(buf + at, text, len);
    *total = n;
    return buf;
}

/* The Record for this line, Py_None to decline (the caller asks the Python classes), `consumed`
 * for a part held, NULL on error. */
static PyObject *fast_line(PyObject *decoder, PyObject *joiner, PyObject *raw, PyObject *offset) {
    if (!PyBytes_CheckExact(raw) || !PyLong_CheckExact(offset))
        return Py_None;
    PyObject *framing = SLOT(decoder, DEC_FRAMING), *parts = SLOT(decoder, DEC_PARTS), *stats = SLOT(decoder, DEC_STATS);
    /* the rest of a cut partial line (Decoder._cut) is for Python to drop */
    PyObject *others = SLOT(decoder, DEC_OTHERS);
    /* another stream's partial line waiting (Decoder._others): which stream a line joins is Python's */
    if (parts == NULL || !PyList_CheckExact(parts) || SLOT(decoder, DEC_CUT) != Py_False ||
        others == NULL || !PyDict_CheckExact(others) || PyDict_GET_SIZE(others) != 0 ||
        SLOT(joiner, JN_PENDING) != Py_None || stats == NULL || Py_TYPE(stats) != stats_type)
        return Py_None;
    int cri = framing == cri_str;
    if (!cri && PyList_GET_SIZE(parts) != 0)
        return Py_None;
    Py_ssize_t lines = count(stats, ST_LINES), records = count(stats, ST_RECORDS);
    const char *s = PyBytes_AS_STRING(raw);
    Py_ssize_t size = PyBytes_GET_SIZE(raw), n = size;
    Py_ssize_t off = PyLong_AsSsize_t(offset);
    if (off == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return Py_None;
    }
    if (lines < 0 || records < 0 || off < 0 || off > PY_SSIZE_T_MAX - size)
        return Py_None;
    if (n > 0 && s[n - 1] == '\n')
        n--;
    if (n == 0 || s[n - 1] == '\n' || s[n - 1] == '\r' || !ascii_without_esc(s, n))
        return Py_None;

    /* The text Decoder.__call__ hands to _record: the whole line in a plain file; in a CRI one,
     * what follows the runtime's fields, with the runtime's stamp, after the parts it ends. */
    Py_ssize_t start = 0;
    long long ns = 0;
    int partial = 0, err = 0;
    if (cri ? !cri_frame(decoder, s, n, &start, &ns, &partial, &err) : framing != plain_str || SLOT(decoder, DEC_UNWRAP) != Py_None)
        return Py_None;
    if (cri && PyList_GET_SIZE(parts) != 0) { /* parts held: this line joins them only on their stream */
        PyObject *held_stream = SLOT(decoder, DEC_PART_STREAM);
        if (held_stream == NULL || !PyUnicode_CheckExact(held_stream) ||
            PyUnicode_CompareWithASCIIString(held_stream, err ? "stderr" : "stdout") != 0)
            return Py_None;
    }
    if (partial)
        return hold_part(decoder, stats, parts, s + start, n - start, offset, off + size, ns, lines, err);
    const char *text = s + start;
    Py_ssize_t len = n - start;
    Py_ssize_t held = PyList_GET_SIZE(parts), joined_chars = 0;
    PyObject *record_offset = offset;
    char *buf = NULL;
    if (held) { /* the `F` line ending the parts held: the record is theirs, as old as the first */
        Py_ssize_t chars = ssize_slot(decoder, DEC_PART_CHARS);
        PyObject *part_ts = SLOT(decoder, DEC_PART_TS);
        if (chars < 0 || ssize_slot(decoder, DEC_PART_OFFSET) < 0 || part_ts == NULL || !PyLong_CheckExact(part_ts))
            return Py_None;
        int overflow;
        ns = PyLong_AsLongLongAndOverflow(part_ts, &overflow);
        if (ns == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return Py_None;
        }
        if (overflow || ns < 0 || ns > BASE_NS_LIMIT) /* _record's range check is Python's */
            return Py_None;
        buf = joined(parts, text, len, &len);
        if (buf == NULL)
            return PyErr_Occurred() ? NULL : Py_None;
        if (len == 0 || buf[len - 1] == '\r' || !ascii_without_esc(buf, len)) {
            PyMem_Free(buf);
            return Py_None;
        }
        text = buf;
        joined_chars = chars + (n - start);
        record_offset = SLOT(decoder, DEC_PART_OFFSET); /* borrowed: nothing below replaces that slot */
    }
    /* _record hands a text that does not start with the header to split_prefix, which takes a
     * process prefix at its start and the header right after it (`(APIServer pid=1) INFO …`),
     * and counts the record in stats.prefixed. Anything else before a header (junk, a shipper's
     * stamp, a prefix the header does not follow at once) is Python's. */
    Py_ssize_t close = 0, head = 0, prefixed = 0, joins = 0;
    Header h;
    PyObject *ts = NULL;
    if ((len > 0 && text[0] == '(' && (!process_prefix(text, len, &close, &head) || (prefixed = count(stats, ST_PREFIXED)) < 0)) ||
        !passing_header(text + head, len - head, &h) || (held && (joins = count(stats, ST_PARTIALS_JOINED)) < 0) ||
        /* _record: a runtime stamp is the record's time (CLOCK_RUNTIME) and the header's stamp is
         * not read at all; without one, the header's second from the HeaderClock. */
        (!cri && (ts = header_second(decoder, text + head + h.stamp)) == NULL) ||
        /* _record bounds a runtime stamp by the header's second when it was read after that
         * second had passed: only a stamp in the header's second-of-minute is taken here (zones
         * differ by whole minutes), which Python would keep as it is. */
        (cri && !same_second(text + head + h.stamp, ns))) {
        PyMem_Free(buf);
        return Py_None;
    }

    /* From here on, the line is taken: Decoder.__call__ and _record's bookkeeping. */
    ts = cri ? PyLong_FromLongLong(ns) : Py_NewRef(ts);
    PyObject *chars_o = held ? PyLong_FromSsize_t(joined_chars) : NULL, *end_o = held ? PyLong_FromSsize_t(off + size) : NULL;
    if (ts == NULL || (held && (chars_o == NULL || end_o == NULL)) ||
        set_count(stats, ST_LINES, lines + 1) < 0 || set_count(stats, ST_RECORDS, records + 1) < 0 ||
        (head && set_count(stats, ST_PREFIXED, prefixed + 1) < 0) ||
        (held && (set_count(stats, ST_PARTIALS_JOINED, joins + held) < 0 || PyList_SetSlice(parts, 0, held, NULL) < 0))) {
        Py_XDECREF(ts);
        Py_XDECREF(chars_o);
        Py_XDECREF(end_o);
        PyMem_Free(buf);
        return NULL;
    }
    if (held) { /* what Decoder.__call__ left in them for the line that ended the parts */
        Py_XSETREF(SLOT(decoder, DEC_PART_CHARS), chars_o);
        Py_XSETREF(SLOT(decoder, DEC_PART_END), end_o);
    }
    Py_XSETREF(SLOT(decoder, DEC_LAST_TS), Py_NewRef(ts));
    PyObject *rec = make_record(text + head, len - head, &h, text + 1, head ? close - 1 : 0, ts,
                                cri ? runtime_clock_str : header_clock_str, record_offset, off + size);
    PyMem_Free(buf);
    return rec;
}

/* -- the iterator ------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *stream, *decoder, *joiner, *lines;
    PyObject *held;     /* records the Python path returned, not yet given out */
    Py_ssize_t held_i;
} Records;

static void records_dealloc(Records *self) {
    PyObject_GC_UnTrack(self);
    Py_XDECREF(self->stream);
    Py_XDECREF(self->decoder);
    Py_XDECREF(self->joiner);
    Py_XDECREF(self->lines);
    Py_XDECREF(self->held);
    PyObject_GC_Del(self);
}

static int records_traverse(Records *self, visitproc visit, void *arg) {
    Py_VISIT(self->stream);
    Py_VISIT(self->decoder);
    Py_VISIT(self->joiner);
    Py_VISIT(self->lines);
    Py_VISIT(self->held);
    return 0;
}

static PyObject *records_next(Records *self) {
    for (;;) {
        if (self->held != NULL) {
            if (self->held_i < PySequence_Fast_GET_SIZE(self->held))
                return Py_NewRef(PySequence_Fast_GET_ITEM(self->held, self->held_i++));
            Py_CLEAR(self->held);
        }
        PyObject *item = PyIter_Next(self->lines);
        if (item == NULL)
            return NULL; /* exhausted, or an error set */
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2) {
            Py_DECREF(item);
            PyErr_SetString(PyExc_TypeError, "lines must be (offset, raw) pairs");
            return NULL;
        }
        PyObject *offset = PyTuple_GET_ITEM(item, 0), *raw = PyTuple_GET_ITEM(item, 1);
        PyObject *rec = fast_line(self->decoder, self->joiner, raw, offset);
        if (rec == consumed) {
            Py_DECREF(item);
            continue;
        }
        if (rec != Py_None) {
            Py_DECREF(item);
            return rec;
        }
        PyObject *out = PyObject_CallFunctionObjArgs(self->stream, raw, offset, NULL);
        Py_DECREF(item);
        if (out == NULL)
            return NULL;
        self->held = PySequence_Fast(out, "RecordStream() must return a sequence");
        Py_DECREF(out);
        if (self->held == NULL)
            return NULL;
        self->held_i = 0;
    }
}

static PyTypeObject RecordsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "bridge.decode._fastdecode.Records",
    .tp_basicsize = sizeof(Records),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)records_dealloc,
    .tp_traverse = (traverseproc)records_traverse,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)records_next,
};

static PyObject *records(PyObject *self, PyObject *args) {
    PyObject *decoder, *joiner, *python, *lines;
    if (!PyArg_ParseTuple(args, "OOOO", &decoder, &joiner, &python, &lines))
        return NULL;
    if (!ready) {
        PyErr_SetString(PyExc_RuntimeError, "init() first");
        return NULL;
    }
    if (Py_TYPE(decoder) != decoder_type || Py_TYPE(joiner) != joiner_type) {
        PyErr_SetString(PyExc_TypeError, "records() needs a Decoder and a Joiner, not subclasses");
        return NULL;
    }
    PyObject *it = PyObject_GetIter(lines);
    if (it == NULL)
        return NULL;
    Records *r = PyObject_GC_New(Records, &RecordsType);
    if (r == NULL) {
        Py_DECREF(it);
        return NULL;
    }
    r->stream = Py_NewRef(python);
    r->decoder = Py_NewRef(decoder);
    r->joiner = Py_NewRef(joiner);
    r->lines = it;
    r->held = NULL;
    r->held_i = 0;
    PyObject_GC_Track(r);
    return (PyObject *)r;
}

static PyObject *line(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    /* line(decoder, joiner, raw, offset) -> Record or None: the fast path for one line alone
     * (tests; the live agent's per-line calls) */
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "line(decoder, joiner, raw, offset)");
        return NULL;
    }
    if (!ready || Py_TYPE(args[0]) != decoder_type || Py_TYPE(args[1]) != joiner_type) {
        PyErr_SetString(PyExc_TypeError, "line() needs init(), a Decoder and a Joiner");
        return NULL;
    }
    PyObject *r = fast_line(args[0], args[1], args[2], args[3]);
    return r == Py_None || r == consumed ? Py_NewRef(r) : r;
}

static PyMethodDef methods[] = {
    {"init", init, METH_VARARGS, "init(classes, PLAIN, CRI, CLOCK_HEADER, CLOCK_RUNTIME)"},
    {"records", records, METH_VARARGS, "records(decoder, joiner, python, lines) -> iterator of Records"},
    {"line", (PyCFunction)(void (*)(void))line, METH_FASTCALL,
     "line(decoder, joiner, raw, offset) -> Record | CONSUMED (a part held) | None (declined)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastdecode", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastdecode(void) {
    if (PyType_Ready(&RecordsType) < 0)
        return NULL;
    empty_str = PyUnicode_InternFromString("");
    if (!empty_str)
        return NULL;
    for (int k = 0; k < 5; k++)
        if ((levels[k] = PyUnicode_InternFromString(level_names[k])) == NULL)
            return NULL;
    if ((consumed = PyTuple_New(0)) == NULL)
        return NULL;
    if ((stream_names[0] = PyUnicode_InternFromString("stdout")) == NULL ||
        (stream_names[1] = PyUnicode_InternFromString("stderr")) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddObjectRef(m, "CONSUMED", consumed) < 0)
        Py_CLEAR(m);
    return m;
}
