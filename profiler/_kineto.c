/* Columnar parser for Kineto Chrome traces: JSON bytes -> the columns of profiler/parse.py's frame.
 *
 * Why C: a 100 MB trace holds ~450k events. Decoding them into Python objects and then building
 * columns from those objects costs ~3 us per event; reading the JSON straight into typed column
 * buffers costs ~0.2 us. This module does only that reading. Every rule about what a column
 * means stays in parse.py, which turns the buffers into polars columns and runs the same tail
 * (filters, thread names, classification) as its pure-Python parser.
 *
 * Contract: for any input, parse() either returns exactly the columns that the pure-Python
 * parser in parse.py would build, or raises Fallback, and parse.py then runs that parser (which
 * also produces the error messages for malformed files). So anything unusual -- invalid JSON, a
 * string escape in a key, a numeric string whose polars cast we do not mimic, numbers outside
 * int64 -- is a Fallback, never a guess. tests/profiler/test_fast_parser.py checks equality on
 * every real trace we have and on hand-made quirks.
 *
 * Input: the whole file (parse()), or its chunks as they are inflated (Stream: feed(), then
 * finish()), which gives the same result wherever the chunks are cut (tests/profiler/
 * test_parse_stream.py): the document is read one unit at a time (doc_step), and strings and raw
 * values are copied out of the input, so a chunk can be freed once read.
 *
 * Value rules (what polars' lenient casts in the Python parser do):
 *   int columns   int -> itself; float -> truncated if inside int64, else null; true/false ->
 *                 1/0; digits-only string (optional sign) -> its value, null if outside int64;
 *                 string without digits or "0x..." -> null; null/missing -> null. The tid column also
 *                 reads torch 1.8/1.9's "stream <N>" as N (parse.py's STREAM_TID_RE).
 *   float columns int/float -> double (correctly rounded); true/false -> null; string without
 *                 digits nor inf/nan -> null; null/missing -> null.
 *   text columns  string -> itself (interned); null/missing -> null.
 *   Anything else is a Fallback.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static PyObject *Fallback;

#include "_kineto_json.h" /* JSON values: strings, numbers, skipping */
#include "_kineto_rows.h" /* column buffers, the string table, each column's value rules, emit */

/* The document, {"traceEvents": [...], ...} (distributedInfo and deviceProperties kept as JSON
 * text) or the bare-array form, read one unit at a time (an event, a top-level key and its value,
 * a separator). doc_step reads from `data` as far as whole units go and says where it stopped:
 *   DOC_DONE     the document ended with the input (final);
 *   DOC_MORE     a unit runs past the input's end: *used bytes are read, the rest is to be
 *                given again with more after it (not final);
 *   DOC_DECLINE  anything else, trailing bytes included: a Fallback.
 * A unit that does not parse before the end of a chunk is taken to be cut by it; malformed JSON
 * therefore declines only with the final chunk, which parse.py then reads whole. */
enum { ST_DOC, ST_OBJ_FIRST, ST_KEY, ST_AFTER_VALUE, ST_ARR_FIRST, ST_EVENT, ST_AFTER_EVENT, ST_END };
enum { DOC_DONE, DOC_MORE, DOC_DECLINE };

static int keep_text(Buf *b, const unsigned char *s, const unsigned char *e) {
    b->len = 0;
    if (buf_reserve(b, (size_t)(e - s) + 1)) return FAIL;
    memcpy(b->data, s, (size_t)(e - s));
    b->len = (size_t)(e - s);
    return 0;
}

static int doc_step(Ctx *cx, const unsigned char *data, size_t len, int final, size_t *used) {
    Cur c = {data, data + len};
    const unsigned char *k;
    size_t n;
    for (;;) {
        const unsigned char *unit = c.p; /* where this unit starts: read again from here if cut */
        ws(&c);
        if (cx->state != ST_END && c.p >= c.end) goto cut;
        switch (cx->state) {
        case ST_DOC:
            if (*c.p == '[') cx->bare = 1, cx->state = ST_ARR_FIRST;
            else if (*c.p == '{') cx->state = ST_OBJ_FIRST;
            else return DOC_DECLINE;
            c.p++;
            break;
        case ST_OBJ_FIRST:
            if (*c.p == '}') c.p++, cx->state = ST_END;
            else cx->state = ST_KEY;
            break;
        case ST_KEY:
            if (read_key(&c, &k, &n)) goto cut;
            if (n == 11 && !memcmp(k, "traceEvents", 11)) {
                if (cx->seen_events) return DOC_DECLINE; /* a second traceEvents: which wins is msgspec's business */
                if (c.p >= c.end) goto cut;
                if (*c.p != '[') return DOC_DECLINE;
                c.p++;
                cx->state = ST_ARR_FIRST;
            } else {
                int info = n == 15 && !memcmp(k, "distributedInfo", 15), dev = n == 16 && !memcmp(k, "deviceProperties", 16);
                const unsigned char *s = c.p;
                if (skip_value(&c, 1)) goto cut;
                /* A number ending with the chunk may go on in the next one ("x": 12|3): only a
                 * value followed by something is whole (an event's values are: its '}' follows). */
                if (!final && c.p >= c.end) goto cut;
                if (info || dev) { /* a repeated key: the last one, as before */
                    if (keep_text(info ? &cx->info : &cx->dev, s, c.p)) return DOC_DECLINE;
                    *(info ? &cx->has_info : &cx->has_dev) = 1;
                }
                cx->state = ST_AFTER_VALUE;
            }
            break;
        case ST_AFTER_VALUE:
            if (*c.p == ',') cx->state = ST_KEY;
            else if (*c.p == '}') cx->state = ST_END;
            else return DOC_DECLINE;
            c.p++;
            break;
        case ST_ARR_FIRST:
            if (*c.p == ']') {
                c.p++;
                cx->seen_events = 1;
                cx->state = cx->bare ? ST_END : ST_AFTER_VALUE;
            } else cx->state = ST_EVENT;
            break;
        case ST_EVENT: {
            int r = parse_event(&c, cx);
            if (r == HARD) return DOC_DECLINE;
            if (r) goto cut;
            cx->state = ST_AFTER_EVENT;
            break;
        }
        case ST_AFTER_EVENT:
            if (*c.p == ',') cx->state = ST_EVENT;
            else if (*c.p == ']') cx->seen_events = 1, cx->state = cx->bare ? ST_END : ST_AFTER_VALUE;
            else return DOC_DECLINE;
            c.p++;
            break;
        case ST_END:
            if (c.p < c.end) return DOC_DECLINE;
            if (!final) { *used = len; return DOC_MORE; }
            return cx->seen_events ? DOC_DONE : DOC_DECLINE;
        }
        continue;
    cut:
        if (final) return DOC_DECLINE;
        *used = (size_t)(unit - data);
        return DOC_MORE;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Python interface                                                                          */

static void ctx_free(Ctx *cx) {
    if (!cx) return;
    Buf *bufs[] = {&cx->ph, &cx->thr_pid, &cx->thr_tid, &cx->thr_pid_ok, &cx->thr_tid_ok, &cx->thr_name,
                   &cx->intern.strs, &cx->intern.text, &cx->raw_text, &cx->info, &cx->dev};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]->data);
    for (int k = 0; k < N_INT; k++) { free(cx->ints[k].data); free(cx->ints_ok[k].data); }
    for (int k = 0; k < N_FLT; k++) { free(cx->flts[k].data); free(cx->flts_ok[k].data); }
    for (int k = 0; k < N_STR; k++) free(cx->strs[k].data);
    for (int k = 0; k < N_RAW; k++) { free(cx->raw_row[k].data); free(cx->raw_s[k].data); free(cx->raw_e[k].data); }
    free(cx->intern.slots);
    free(cx);
}

/* A new reading, its buffers sized for `size_hint` bytes of JSON (~200 bytes an event) so that
 * they rarely move; NULL on memory. */
static Ctx *ctx_new(size_t size_hint) {
    Ctx *cx = calloc(1, sizeof(Ctx));
    if (!cx) return NULL;
    for (int k = 0; k < N_INT; k++) { cx->ints[k].item = 8; cx->ints_ok[k].item = 1; }
    for (int k = 0; k < N_FLT; k++) { cx->flts[k].item = 8; cx->flts_ok[k].item = 1; }
    for (int k = 0; k < N_STR; k++) cx->strs[k].item = 4;
    for (int k = 0; k < N_RAW; k++) cx->raw_row[k].item = cx->raw_s[k].item = cx->raw_e[k].item = 8;
    cx->ph.item = cx->raw_text.item = cx->info.item = cx->dev.item = cx->intern.text.item = 1;
    cx->thr_pid.item = cx->thr_tid.item = 8;
    cx->thr_pid_ok.item = cx->thr_tid_ok.item = 1;
    cx->thr_name.item = 4;
    cx->intern.strs.item = sizeof(Str);
    size_t guess = size_hint / 200 + 16;
    int bad = 0;
    for (int k = 0; k < N_INT && !bad; k++) bad = buf_reserve(&cx->ints[k], guess) || buf_reserve(&cx->ints_ok[k], guess);
    for (int k = 0; k < N_FLT && !bad; k++) bad = buf_reserve(&cx->flts[k], guess) || buf_reserve(&cx->flts_ok[k], guess);
    for (int k = 0; k < N_STR && !bad; k++) bad = buf_reserve(&cx->strs[k], guess);
    bad = bad || buf_reserve(&cx->ph, guess) || intern_grow(&cx->intern);
    if (bad) { ctx_free(cx); return NULL; }
    return cx;
}

/* The buffer as bytes, its own memory freed at once: for the small buffers that Python slices or
 * decodes (raw values' text, thread names, the JSON of distributedInfo); the columns are Columns. */
static PyObject *buf_bytes(Buf *b) {
    PyObject *out = PyBytes_FromStringAndSize(b->data ? b->data : "", (Py_ssize_t)(b->len * b->item));
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    return out;
}

/* A column's memory handed to Python as it is, without a copy: a read-only buffer that
 * np.frombuffer (parse_fast.py) reads in place, freed with the last array over it. Copying the
 * columns into bytes had cost a 100 MB trace ~60 MB of fresh pages, a sixth of a cold run's page
 * faults. Pickled (prescan.py) as bytes. */
typedef struct {
    PyObject_HEAD
    char *data;
    Py_ssize_t len;
} Column;

static void column_dealloc(Column *c) {
    free(c->data);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static int column_getbuffer(Column *c, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)c, c->data ? c->data : (char *)"", c->len, 1, flags);
}

static Py_ssize_t column_length(Column *c) { return c->len; }

static PyObject *column_reduce(Column *c, PyObject *unused) {
    (void)unused;
    return Py_BuildValue("(O(y#))", (PyObject *)&PyBytes_Type, c->data ? c->data : "", c->len);
}

/* Equal to any bytes-like object of the same bytes, as bytes is (the tests compare results). */
static PyObject *column_richcompare(Column *c, PyObject *other, int op) {
    Py_buffer view;
    if ((op != Py_EQ && op != Py_NE) || PyObject_GetBuffer(other, &view, PyBUF_SIMPLE)) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    int same = view.len == c->len && (c->len == 0 || memcmp(view.buf, c->data, (size_t)c->len) == 0);
    PyBuffer_Release(&view);
    return PyBool_FromLong(op == Py_EQ ? same : !same);
}

static PyBufferProcs column_as_buffer = {.bf_getbuffer = (getbufferproc)column_getbuffer};
static PySequenceMethods column_as_sequence = {.sq_length = (lenfunc)column_length};
static PyMethodDef column_methods[] = {
    {"__reduce__", (PyCFunction)column_reduce, METH_NOARGS, "pickled as bytes"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject ColumnType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "profiler._kineto.Column",
    .tp_basicsize = sizeof(Column),
    .tp_dealloc = (destructor)column_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A parsed column's bytes, read-only (the buffer protocol; len() in bytes).",
    .tp_as_buffer = &column_as_buffer,
    .tp_richcompare = (richcmpfunc)column_richcompare,
    .tp_hash = PyObject_HashNotImplemented,
    .tp_as_sequence = &column_as_sequence,
    .tp_methods = column_methods,
};

/* The buffer as a Column, which takes its memory (trimmed to its length); the Buf is left empty. */
static PyObject *buf_column(Buf *b) {
    Column *c = PyObject_New(Column, &ColumnType);
    if (!c) return NULL;
    size_t n = b->len * b->item;
    char *d = n && n < b->cap * b->item ? realloc(b->data, n) : NULL; /* shrinking: mremap, or in place */
    c->data = d ? d : b->data;
    c->len = (Py_ssize_t)n;
    b->data = NULL;
    b->len = b->cap = 0;
    return (PyObject *)c;
}

/* Sets d[key] = value and drops the reference; returns 0, or -1 with an exception set. */
static int put(PyObject *d, const char *key, PyObject *value) {
    if (!value) return -1;
    int r = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return r;
}

static PyObject *build_result(Ctx *cx) {
    PyObject *out = PyDict_New(), *sub = NULL;
    if (!out) return NULL;
    if (put(out, "n", PyLong_FromSize_t(cx->ph.len)) || put(out, "ph", buf_column(&cx->ph))) goto fail;
#define SUBDICT(key, count, names, body)                                \
    if (!(sub = PyDict_New())) goto fail;                                 \
    for (int k = 0; k < (count); k++)                                     \
        if (put(sub, names[k], (body))) goto fail;                        \
    if (put(out, key, sub)) { sub = NULL; goto fail; }                    \
    sub = NULL;
    SUBDICT("ints", N_INT, INT_NAMES, Py_BuildValue("(NN)", buf_column(&cx->ints[k]), buf_column(&cx->ints_ok[k])))
    SUBDICT("floats", N_FLT, FLT_NAMES, Py_BuildValue("(NN)", buf_column(&cx->flts[k]), buf_column(&cx->flts_ok[k])))
    SUBDICT("strs", N_STR, STR_NAMES, buf_column(&cx->strs[k]))
    SUBDICT("raws", N_RAW, RAW_NAMES, Py_BuildValue("(NNN)", buf_bytes(&cx->raw_row[k]), buf_bytes(&cx->raw_s[k]), buf_bytes(&cx->raw_e[k])))
#undef SUBDICT
    if (put(out, "raw_text", buf_bytes(&cx->raw_text))) goto fail;
    /* Interned strings: code k is strings[k]; index 0 is None (null). Escaped ones are handed
     * over as their raw JSON text (bytes) for parse.py to decode. */
    Str *strs = (Str *)cx->intern.strs.data;
    PyObject *list = PyList_New((Py_ssize_t)cx->intern.strs.len + 1);
    if (!list) goto fail;
    Py_INCREF(Py_None);
    PyList_SET_ITEM(list, 0, Py_None);
    for (size_t k = 0; k < cx->intern.strs.len; k++) {
        const char *t = (const char *)str_text(&cx->intern, &strs[k]);
        PyObject *s = strs[k].esc ? PyBytes_FromStringAndSize(t - 1, (Py_ssize_t)strs[k].n + 2)
                                  : PyUnicode_DecodeUTF8(t, (Py_ssize_t)strs[k].n, "strict");
        if (!s) { Py_DECREF(list); goto fail; }
        PyList_SET_ITEM(list, (Py_ssize_t)k + 1, s);
    }
    if (put(out, "strings", list)) goto fail;
    if (put(out, "threads", Py_BuildValue("(NNNNN)", buf_bytes(&cx->thr_pid), buf_bytes(&cx->thr_pid_ok), buf_bytes(&cx->thr_tid),
                                          buf_bytes(&cx->thr_tid_ok), buf_bytes(&cx->thr_name))))
        goto fail;
    if (put(out, "counts", Py_BuildValue("{sLsLsL}", "flow", (long long)cx->n_flow, "meta", (long long)cx->n_meta, "other",
                                         (long long)cx->n_other)))
        goto fail;
    if (put(out, "distributedInfo", cx->has_info ? buf_bytes(&cx->info) : Py_NewRef(Py_None)) ||
        put(out, "deviceProperties", cx->has_dev ? buf_bytes(&cx->dev) : Py_NewRef(Py_None)))
        goto fail;
    return out;
fail:
    Py_XDECREF(sub);
    Py_DECREF(out);
    return NULL;
}

/* The result of a finished reading, or Fallback (a string that is not UTF-8 among them). */
static PyObject *result_or_fallback(Ctx *cx) {
    PyObject *res = build_result(cx);
    if (!res && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        PyErr_SetString(Fallback, "a string that is not UTF-8");
    }
    return res;
}

static PyObject *declined(void) {
    PyErr_SetString(Fallback, "input the fast parser leaves to the Python one");
    return NULL;
}

static PyObject *parse(PyObject *self, PyObject *arg) {
    (void)self;
    /* bytes only: they end in a NUL, which bounds CPython's dtoa (parse_number's slow path reads
     * until the number stops) even when a truncated file ends inside a number. */
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "parse() takes bytes");
        return NULL;
    }
    Py_ssize_t len = PyBytes_GET_SIZE(arg);
    Ctx *cx = ctx_new((size_t)len);
    if (!cx) { /* as for any input it cannot take: msgspec's parser then reads it */
        PyErr_SetString(Fallback, "out of memory");
        return NULL;
    }
    /* The GIL stays held: CPython's dtoa (the slow path of parse_number) needs it. */
    size_t used = 0;
    PyObject *res = doc_step(cx, (const unsigned char *)PyBytes_AS_STRING(arg), (size_t)len, 1, &used) == DOC_DONE
                        ? result_or_fallback(cx) : declined();
    ctx_free(cx);
    return res;
}

/* ---------------------------------------------------------------------------------------- */
/* Stream: the same reading, fed the file in chunks as it is inflated, so that the whole JSON is
 * never in memory (a 100 MB trace's bytes were the biggest part of a worker's peak). Each feed
 * reads the whole units it now holds and keeps the cut one; finish() reads the rest and returns
 * parse()'s dict. Malformed input raises Fallback, at the latest from finish(). */

typedef struct {
    PyObject_HEAD
    Ctx *cx;                /* NULL once finished or declined */
    unsigned char *buf;     /* the unread bytes, then a NUL (see parse()) */
    size_t len, cap;
    size_t retry_at;        /* read again only with this many bytes: a long cut unit is not re-read per chunk */
} Stream;

static void stream_dealloc(Stream *st) {
    ctx_free(st->cx);
    free(st->buf);
    Py_TYPE(st)->tp_free((PyObject *)st);
}

static int stream_init(Stream *st, PyObject *args, PyObject *kw) {
    static char *names[] = {"size_hint", NULL};
    Py_ssize_t hint = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|n", names, &hint)) return -1;
    ctx_free(st->cx);
    st->cx = ctx_new(hint > 0 ? (size_t)hint : 0);
    st->len = st->retry_at = 0;
    if (!st->cx) { PyErr_NoMemory(); return -1; }
    return 0;
}

static PyObject *stream_stop(Stream *st) {
    ctx_free(st->cx);
    st->cx = NULL;
    free(st->buf);
    st->buf = NULL;
    st->len = st->cap = 0;
    return declined();
}

static PyObject *stream_feed(Stream *st, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE)) return NULL;
    if (!st->cx) { /* checked after GetBuffer, which may run Python code (a __buffer__ calling finish()) */
        PyBuffer_Release(&view);
        return stream_stop(st);
    }
    size_t need = st->len + (size_t)view.len + 1;
    if (need > st->cap) {
        size_t cap = st->cap ? st->cap : 1 << 16;
        while (cap < need) cap *= 2;
        unsigned char *b = realloc(st->buf, cap);
        if (!b) { PyBuffer_Release(&view); return PyErr_NoMemory(); }
        st->buf = b;
        st->cap = cap;
    }
    memcpy(st->buf + st->len, view.buf, (size_t)view.len);
    st->len += (size_t)view.len;
    st->buf[st->len] = 0;
    PyBuffer_Release(&view);
    if (st->len < st->retry_at) Py_RETURN_NONE;
    size_t used = 0;
    if (doc_step(st->cx, st->buf, st->len, 0, &used) != DOC_MORE) return stream_stop(st);
    memmove(st->buf, st->buf + used, st->len - used);
    st->len -= used;
    st->buf[st->len] = 0;
    st->retry_at = 2 * st->len;
    Py_RETURN_NONE;
}

static PyObject *stream_finish(Stream *st, PyObject *unused) {
    (void)unused;
    if (!st->cx) return stream_stop(st);
    size_t used = 0;
    static const unsigned char empty[1] = {0};
    int r = doc_step(st->cx, st->buf ? st->buf : empty, st->len, 1, &used);
    PyObject *res = r == DOC_DONE ? result_or_fallback(st->cx) : declined();
    ctx_free(st->cx);
    st->cx = NULL;
    free(st->buf);
    st->buf = NULL;
    st->len = st->cap = 0;
    return res;
}

static PyMemberDef stream_members[] = {
    {"pending", T_PYSSIZET, offsetof(Stream, len), READONLY, "bytes fed and kept unread (a unit cut by the last chunk's end)"},
    {NULL, 0, 0, 0, NULL}};

static PyMethodDef stream_methods[] = {
    {"feed", (PyCFunction)stream_feed, METH_O, "feed(chunk): the next bytes of the file; raises Fallback once the input is declined."},
    {"finish", (PyCFunction)stream_finish, METH_NOARGS, "finish() -> parse()'s dict for all the bytes fed; raises Fallback."},
    {NULL, NULL, 0, NULL}};

static PyTypeObject StreamType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "profiler._kineto.Stream",
    .tp_basicsize = sizeof(Stream),
    .tp_dealloc = (destructor)stream_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Stream(size_hint=0): parse() fed in chunks (feed, then finish).",
    .tp_methods = stream_methods,
    .tp_members = stream_members,
    .tp_init = (initproc)stream_init,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef methods[] = {
    {"parse", parse, METH_O,
     "parse(raw: bytes) -> dict of column buffers (see profiler/parse.py); raises Fallback for input "
     "that the pure-Python parser must handle."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "profiler._kineto", "Columnar Kineto trace parser.", -1, methods};

PyMODINIT_FUNC PyInit__kineto(void) {
    /* Emptied first: the tables are filled by appending, and the module may be initialised again
       (loaded under another name) in one process. */
    memset(EVENT_BY_LEN, 0, sizeof EVENT_BY_LEN);
    memset(ARG_BY_LEN, 0, sizeof ARG_BY_LEN);
    if (bucket_keys(EVENT_BY_LEN, EVENT_KEYS, N_EVENT) || bucket_keys(ARG_BY_LEN, ARG_KEYS, N_ARGS)) {
        PyErr_SetString(PyExc_ImportError, "profiler._kineto: a key table does not fit its buckets");
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Fallback = PyErr_NewException("profiler._kineto.Fallback", PyExc_ValueError, NULL);
    if (!Fallback || PyModule_AddObject(m, "Fallback", Fallback)) {
        Py_XDECREF(Fallback);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(Fallback);
    if (PyType_Ready(&StreamType) < 0 || PyModule_AddObjectRef(m, "Stream", (PyObject *)&StreamType) < 0 ||
        PyType_Ready(&ColumnType) < 0 || PyModule_AddObjectRef(m, "Column", (PyObject *)&ColumnType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
