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
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static PyObject *Fallback;

/* ---------------------------------------------------------------------------------------- */
/* Values                                                                                    */

enum { V_MISSING = 0, V_NULL, V_INT, V_FLOAT, V_STR, V_TRUE, V_FALSE, V_OTHER };

typedef struct {
    int kind;
    int esc;                      /* V_STR: the text holds a backslash escape */
    int64_t i;                    /* V_INT */
    double d;                     /* V_FLOAT */
    const unsigned char *vs, *ve; /* the value's JSON text (strings: with their quotes) */
} Val;

typedef struct {
    const unsigned char *p, *end;
} Cur;

#define FAIL (-1)
#define MAX_DEPTH 512

static inline void ws(Cur *c) {
    if (c->p < c->end && *c->p > ' ') return; /* the usual case: no blank at all */
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) c->p++;
}

static inline int hexval(unsigned char ch) {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

/* The value of the 4 hex digits at p, or FAIL (also when fewer than 4 bytes remain). */
static int hex4(const unsigned char *p, const unsigned char *end) {
    if (end - p < 4) return FAIL;
    int u = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(p[k]);
        if (h < 0) return FAIL;
        u = u * 16 + h;
    }
    return u;
}

/* Length of the well-formed UTF-8 sequence at p (lead byte >= 0x80), or FAIL: no overlong
 * forms, no surrogates, nothing past U+10FFFF. */
static int utf8_len(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    int n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return FAIL;
    if (end - p < n) return FAIL;
    if (p[1] < lo || p[1] > hi) return FAIL;
    for (int k = 2; k < n; k++)
        if (p[k] < 0x80 || p[k] > 0xBF) return FAIL;
    return n;
}

/* Nonzero where one of the 8 bytes in x needs a look of its own in a string: a quote, a
 * backslash, a control byte (< 0x20) or a non-ASCII byte. Plain ASCII is passed 8 bytes at a
 * time (SWAR; a false alarm only sends those bytes through the byte loop). */
#define ONES 0x0101010101010101ull
#define HIGHS 0x8080808080808080ull
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "scan_string's SWAR loop assumes a little-endian CPU"
#endif
static inline uint64_t str_special(uint64_t x) {
    uint64_t q = x ^ (ONES * '"'), b = x ^ (ONES * '\\');
    return (((q - ONES) & ~q) | ((b - ONES) & ~b) | (x - ONES * 0x20) | x) & HIGHS;
}

/* c->p at the opening quote; leaves c->p after the closing one. */
static int scan_string(Cur *c, int *esc) {
    const unsigned char *p = c->p + 1, *end = c->end;
    int e = 0;
    for (;;) {
        while (end - p >= 8) {
            uint64_t x;
            memcpy(&x, p, 8);
            uint64_t m = str_special(x);
            if (m) { /* the lowest flagged byte is always a true one (borrows only run upward) */
                p += __builtin_ctzll(m) >> 3;
                break;
            }
            p += 8;
        }
        if (p >= end) return FAIL;
        unsigned char ch = *p;
        if (ch == '"') break;
        if (ch < 0x20) return FAIL;
        if (ch >= 0x80) { /* strict UTF-8, as the Python parser checks it (stricter only declines) */
            int n = utf8_len(p, end);
            if (n < 0) return FAIL;
            p += n;
            continue;
        }
        if (ch == '\\') {
            e = 1;
            if (p + 1 >= end) return FAIL;
            unsigned char n = p[1];
            if (n == 'u') {
                /* UTF-16 halves must pair (high then low), as msgspec requires even in skipped values */
                int u = hex4(p + 2, end);
                if (u < 0 || (u >= 0xDC00 && u <= 0xDFFF)) return FAIL;
                if (u >= 0xD800 && u <= 0xDBFF) {
                    int lo = (p + 8 <= end && p[6] == '\\' && p[7] == 'u') ? hex4(p + 8, end) : -1;
                    if (lo < 0xDC00 || lo > 0xDFFF) return FAIL;
                    p += 12;
                } else p += 6;
                continue;
            }
            if (!(n == '"' || n == '\\' || n == '/' || n == 'b' || n == 'f' || n == 'n' || n == 'r' || n == 't')) return FAIL;
            p += 2;
            continue;
        }
        p++;
    }
    *esc = e;
    c->p = p + 1;
    return 0;
}

static const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                               1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* JSON number grammar. Integers -> V_INT (Fallback-worthy FAIL when outside int64, where the
 * Python parser would hold a big int); others -> V_FLOAT, correctly rounded: Clinger's fast path
 * (mantissa < 2^53, |exponent| <= 22: one IEEE operation) or CPython's own dtoa. */
static int parse_number(Cur *c, Val *v) {
    const unsigned char *s = c->p, *p = c->p, *end = c->end;
    int neg = 0;
    if (p < end && *p == '-') { neg = 1; p++; }
    if (p >= end) return FAIL;
    uint64_t m = 0;
    int digits = 0, big = 0, frac = 0, has_frac = 0, has_exp = 0;
    if (*p == '0') {
        p++;
        digits = 1;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') {
            if (m > (UINT64_MAX - 9) / 10) big = 1;
            else m = m * 10 + (uint64_t)(*p - '0');
            p++;
            digits++;
        }
    } else {
        return FAIL;
    }
    if (p < end && *p == '.') {
        has_frac = 1;
        p++;
        const unsigned char *f0 = p;
        while (p < end && *p >= '0' && *p <= '9') {
            if (m > (UINT64_MAX - 9) / 10) big = 1;
            else m = m * 10 + (uint64_t)(*p - '0');
            p++;
        }
        if (p == f0) return FAIL;
        frac = (int)(p - f0);
    }
    long exp = 0;
    if (p < end && (*p == 'e' || *p == 'E')) {
        has_exp = 1;
        p++;
        int eneg = 0;
        if (p < end && (*p == '+' || *p == '-')) { eneg = *p == '-'; p++; }
        const unsigned char *e0 = p;
        while (p < end && *p >= '0' && *p <= '9') {
            if (exp < 100000) exp = exp * 10 + (*p - '0');
            p++;
        }
        if (p == e0) return FAIL;
        if (eneg) exp = -exp;
    }
    c->p = p;
    v->vs = s;
    v->ve = p;
    if (!has_frac && !has_exp) {
        if (big) return FAIL;
        if (neg) {
            if (m > (uint64_t)INT64_MAX + 1) return FAIL;
            v->i = (m == (uint64_t)INT64_MAX + 1) ? INT64_MIN : -(int64_t)m;
        } else {
            if (m > (uint64_t)INT64_MAX) return FAIL;
            v->i = (int64_t)m;
        }
        v->kind = V_INT;
        return 0;
    }
    long e10 = exp - frac;
    double d;
    if (!big && m < ((uint64_t)1 << 53) && e10 >= -22 && e10 <= 22) {
        d = (double)m;
        d = e10 < 0 ? d / POW10[-e10] : d * POW10[e10];
        if (neg) d = -d;
    } else {
        char *endp = NULL;
        /* PyOS_string_to_double needs no terminator: it stops where the number stops. */
        d = PyOS_string_to_double((const char *)s, &endp, NULL);
        if (d == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return FAIL; }
        if ((const unsigned char *)endp != p || isinf(d) || isnan(d)) return FAIL;
    }
    v->kind = V_FLOAT;
    v->d = d;
    return 0;
}

static int skip_value(Cur *c, int depth);

static int skip_container(Cur *c, int depth) {
    unsigned char close = *c->p == '{' ? '}' : ']';
    int obj = close == '}';
    if (depth > MAX_DEPTH) return FAIL;
    c->p++;
    ws(c);
    if (c->p < c->end && *c->p == close) { c->p++; return 0; }
    for (;;) {
        if (obj) {
            int esc;
            if (c->p >= c->end || *c->p != '"' || scan_string(c, &esc)) return FAIL;
            ws(c);
            if (c->p >= c->end || *c->p != ':') return FAIL;
            c->p++;
            ws(c);
        }
        if (skip_value(c, depth + 1)) return FAIL;
        ws(c);
        if (c->p >= c->end) return FAIL;
        if (*c->p == ',') { c->p++; ws(c); continue; }
        if (*c->p == close) { c->p++; return 0; }
        return FAIL;
    }
}

static int match_lit(Cur *c, const char *lit, size_t n) {
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, lit, n)) return FAIL;
    c->p += n;
    return 0;
}

/* Any JSON value; scalars are decoded into v, containers only skipped (V_OTHER, text kept). */
static int parse_value(Cur *c, Val *v, int depth) {
    v->esc = 0;
    if (c->p >= c->end) return FAIL;
    const unsigned char *s = c->p;
    switch (*c->p) {
    case '"':
        if (scan_string(c, &v->esc)) return FAIL;
        v->kind = V_STR;
        break;
    case '{':
    case '[':
        if (skip_container(c, depth)) return FAIL;
        v->kind = V_OTHER;
        break;
    case 't':
        if (match_lit(c, "true", 4)) return FAIL;
        v->kind = V_TRUE;
        break;
    case 'f':
        if (match_lit(c, "false", 5)) return FAIL;
        v->kind = V_FALSE;
        break;
    case 'n':
        if (match_lit(c, "null", 4)) return FAIL;
        v->kind = V_NULL;
        break;
    default:
        return parse_number(c, v);
    }
    v->vs = s;
    v->ve = c->p;
    return 0;
}

static int skip_value(Cur *c, int depth) {
    if (c->p >= c->end) return FAIL;
    switch (*c->p) {
    case '"': {
        int esc;
        return scan_string(c, &esc);
    }
    case '{':
    case '[':
        return skip_container(c, depth);
    default: {
        Val v;
        return parse_value(c, &v, depth);
    }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Growable column buffers and the string table                                              */

typedef struct {
    char *data;
    size_t item, len, cap;
} Buf;

static int buf_reserve(Buf *b, size_t n) {
    if (n <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < n) cap *= 2;
    char *d = realloc(b->data, cap * b->item);
    if (!d) return FAIL;
    b->data = d;
    b->cap = cap;
    return 0;
}

static inline int buf_push(Buf *b, const void *x) {
    if (b->len == b->cap && buf_reserve(b, b->len + 1)) return FAIL;
    memcpy(b->data + b->len * b->item, x, b->item);
    b->len++;
    return 0;
}

/* Typed pushes for the column buffers: fixed-size stores instead of a memcpy call per value. */
#define TYPED_PUSH(fn, T)                                                        \
    static inline int fn(Buf *b, T x) {                                          \
        if (b->len == b->cap && buf_reserve(b, b->len + 1)) return FAIL;         \
        ((T *)b->data)[b->len++] = x;                                            \
        return 0;                                                                \
    }
TYPED_PUSH(push_i64, int64_t)
TYPED_PUSH(push_i32, int32_t)
TYPED_PUSH(push_u8, uint8_t)
TYPED_PUSH(push_f64, double)

typedef struct {
    const unsigned char *s; /* string content (between the quotes), escapes not decoded */
    uint32_t n;
    int esc;
} Str;

typedef struct {
    int32_t *slots; /* index into strs + 1; 0 = empty */
    size_t mask;
    Buf strs;       /* of Str; code k (1-based) is strs[k-1] */
} Intern;

static inline uint64_t hash_bytes(const unsigned char *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    while (n >= 8) {
        uint64_t x;
        memcpy(&x, s, 8);
        h = (h ^ x) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t x = 0;
    memcpy(&x, s, n);
    h = (h ^ x) * 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 29);
}

static int intern_grow(Intern *t) {
    size_t cap = t->mask ? (t->mask + 1) * 2 : 4096;
    int32_t *slots = calloc(cap, sizeof(int32_t));
    if (!slots) return FAIL;
    Str *strs = (Str *)t->strs.data;
    for (size_t k = 0; k < t->strs.len; k++) {
        size_t h = (size_t)hash_bytes(strs[k].s, strs[k].n) & (cap - 1);
        while (slots[h]) h = (h + 1) & (cap - 1);
        slots[h] = (int32_t)(k + 1);
    }
    free(t->slots);
    t->slots = slots;
    t->mask = cap - 1;
    return 0;
}

/* The 1-based code of string value v (a V_STR), adding it when new; FAIL on memory. */
static int32_t intern(Intern *t, const Val *v) {
    const unsigned char *s = v->vs + 1;
    size_t n = (size_t)(v->ve - v->vs) - 2;
    if (n > UINT32_MAX) return FAIL;
    if ((t->strs.len + 1) * 2 > t->mask + 1 && intern_grow(t)) return FAIL;
    size_t h = (size_t)hash_bytes(s, n) & t->mask;
    Str *strs = (Str *)t->strs.data;
    for (;;) {
        int32_t k = t->slots[h];
        if (!k) break;
        if (strs[k - 1].n == n && !memcmp(strs[k - 1].s, s, n)) return k;
        h = (h + 1) & t->mask;
    }
    Str e = {s, (uint32_t)n, v->esc};
    if (buf_push(&t->strs, &e)) return FAIL;
    if (t->strs.len > INT32_MAX - 1) return FAIL;
    t->slots[h] = (int32_t)t->strs.len;
    return (int32_t)t->strs.len;
}

/* ---------------------------------------------------------------------------------------- */
/* Fields                                                                                    */

/* Event keys and args keys we read; everything else is skipped. Names as in the trace. */
enum { E_PH, E_CAT, E_NAME, E_PID, E_TID, E_TS, E_DUR, N_EVENT };
static const char *EVENT_KEYS[N_EVENT] = {"ph", "cat", "name", "pid", "tid", "ts", "dur"};

enum {
    A_STREAM, A_CORRELATION, A_EXTERNAL_ID, A_COLLECTIVE, A_IN_NELEMS, A_OUT_NELEMS, A_DTYPE,
    A_GROUP_NAME, A_GROUP_DESC, A_GROUP_RANKS, A_GROUP_SIZE, A_INPUT_DIMS, A_INPUT_TYPE,
    A_COPY_BYTES, A_MEM_BYTES, A_MEM_TOTAL_ALLOCATED, A_MEM_TOTAL_RESERVED, A_MEM_ADDR,
    A_MEM_DEVICE_TYPE, A_MEM_DEVICE_ID, A_NAME, N_ARGS
};
static const char *ARG_KEYS[N_ARGS] = {
    "stream", "correlation", "External id", "Collective name", "In msg nelems", "Out msg nelems", "dtype",
    "Process Group Name", "Process Group Description", "Process Group Ranks", "Group size", "Input Dims",
    "Input type", "bytes", "Bytes", "Total Allocated", "Total Reserved", "Addr", "Device Type", "Device Id",
    "name"};

/* Output columns, in the order of the names handed to Python (parse.py maps them to SCHEMA). */
enum { I_PID, I_TID, I_STREAM, I_CORRELATION, I_EXTERNAL_ID, I_IN_NELEMS, I_OUT_NELEMS, I_GROUP_SIZE,
       I_COPY_BYTES, I_MEM_BYTES, I_MEM_TOTAL_ALLOCATED, I_MEM_TOTAL_RESERVED, I_MEM_ADDR,
       I_MEM_DEVICE_TYPE, I_MEM_DEVICE_ID, N_INT };
static const char *INT_NAMES[N_INT] = {
    "pid", "tid", "stream", "correlation", "external_id", "in_nelems", "out_nelems", "group_size",
    "copy_bytes", "mem_bytes", "mem_total_allocated_bytes", "mem_total_reserved_bytes", "mem_addr",
    "mem_device_type", "mem_device_id"};
/* where each int column comes from: an event key (>= 0) or an args key (encoded -1 - A_x) */
static const int INT_SRC[N_INT] = {
    E_PID, E_TID, -1 - A_STREAM, -1 - A_CORRELATION, -1 - A_EXTERNAL_ID, -1 - A_IN_NELEMS, -1 - A_OUT_NELEMS,
    -1 - A_GROUP_SIZE, -1 - A_COPY_BYTES, -1 - A_MEM_BYTES, -1 - A_MEM_TOTAL_ALLOCATED, -1 - A_MEM_TOTAL_RESERVED,
    -1 - A_MEM_ADDR, -1 - A_MEM_DEVICE_TYPE, -1 - A_MEM_DEVICE_ID};

enum { F_TS, F_DUR, N_FLT };
static const char *FLT_NAMES[N_FLT] = {"ts_us", "dur_us"};
static const int FLT_SRC[N_FLT] = {E_TS, E_DUR};

enum { S_CAT, S_NAME, S_COLLECTIVE, S_DTYPE, S_GROUP_NAME, S_GROUP_DESC, N_STR };
static const char *STR_NAMES[N_STR] = {"cat", "name", "collective", "dtype", "group_name", "group_desc"};
static const int STR_SRC[N_STR] = {E_CAT, E_NAME, -1 - A_COLLECTIVE, -1 - A_DTYPE, -1 - A_GROUP_NAME, -1 - A_GROUP_DESC};

/* Raw JSON kept only where present (and, for the shapes, only on communication events). */
enum { R_GROUP_RANKS, R_INPUT_DIMS, R_INPUT_TYPE, N_RAW };
static const char *RAW_NAMES[N_RAW] = {"group_ranks", "input_dims", "input_type"};
static const int RAW_SRC[N_RAW] = {A_GROUP_RANKS, A_INPUT_DIMS, A_INPUT_TYPE};

/* Mirrors parse.py's _COMM_NAME_PREFIXES. */
static const char *COMM_PREFIXES[] = {"c10d::", "gloo:", "nccl:", "record_param_comms"};


/* Keys by length (filled at import): a key is compared only with the few of its length. */
#define MAX_KEY 32
#define MAX_SAME_LEN 8
typedef struct {
    int n;
    int idx[MAX_SAME_LEN];
} KeyBucket;
static KeyBucket EVENT_BY_LEN[MAX_KEY], ARG_BY_LEN[MAX_KEY];

static int bucket_keys(KeyBucket *by_len, const char *const *keys, int n) {
    for (int i = 0; i < n; i++) {
        size_t len = strlen(keys[i]);
        if (len >= MAX_KEY || by_len[len].n == MAX_SAME_LEN) return FAIL;
        by_len[len].idx[by_len[len].n++] = i;
    }
    return 0;
}

static inline int key_index(const KeyBucket *by_len, const char *const *keys, const unsigned char *k, size_t len) {
    if (len >= MAX_KEY) return -1;
    const KeyBucket *b = &by_len[len];
    for (int j = 0; j < b->n; j++) {
        const char *key = keys[b->idx[j]];
        size_t i = 0;
        while (i < len && key[i] == (char)k[i]) i++;
        if (i == len) return b->idx[j];
    }
    return -1;
}

typedef struct {
    Buf ints[N_INT], ints_ok[N_INT], flts[N_FLT], flts_ok[N_FLT], strs[N_STR], ph;
    Buf raw_row[N_RAW], raw_s[N_RAW], raw_e[N_RAW]; /* row index, byte offsets into the input */
    Buf thr_pid, thr_tid, thr_pid_ok, thr_tid_ok, thr_name;  /* thread_name metadata, in order */
    Intern intern;
    int64_t n_flow, n_meta, n_other;
    Val ev[N_EVENT], args[N_ARGS];
    int has_args; /* the event's args is an object */
    uint32_t ev_set, args_set; /* which of ev[] / args[] hold a value: only those are reset per event */
} Ctx;

static int has_digit(const Val *v) {
    for (const unsigned char *p = v->vs + 1; p < v->ve - 1; p++)
        if (*p >= '0' && *p <= '9') return 1;
    return 0;
}

/* A float as int64, truncated toward zero as polars' cast does; 0 (null) outside int64. */
static inline int trunc_i64(double d, int64_t *out) {
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) return 0;
    *out = (int64_t)d;
    return 1;
}

/* Int column value; returns 1 valid, 0 null, FAIL for a Fallback. */
static int to_int(const Val *v, int64_t *out) {
    switch (v->kind) {
    case V_MISSING:
    case V_NULL:
        return 0;
    case V_INT:
        *out = v->i;
        return 1;
    case V_FLOAT:
        return trunc_i64(v->d, out);
    case V_TRUE:
        *out = 1;
        return 1;
    case V_FALSE:
        *out = 0;
        return 1;
    case V_STR: {
        if (v->esc) return FAIL;
        const unsigned char *p = v->vs + 1, *e = v->ve - 1;
        if (!has_digit(v)) return 0;
        if (e - p > 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) { /* ROCm's "0x0": polars gives null */
            for (const unsigned char *q = p + 2; q < e; q++)
                if (hexval(*q) < 0) return FAIL;
            return 0;
        }
        int neg = 0;
        if (p < e && (*p == '+' || *p == '-')) { neg = *p == '-'; p++; }
        if (p == e) return FAIL;
        uint64_t m = 0;
        int over = 0;
        for (; p < e; p++) {
            if (*p < '0' || *p > '9') return FAIL; /* "12.0", "1e3", " 12": polars' rules vary */
            if (m > (UINT64_MAX - 9) / 10) over = 1;
            else m = m * 10 + (uint64_t)(*p - '0');
        }
        if (over || m > (uint64_t)INT64_MAX + (neg ? 1u : 0u)) return 0;
        *out = neg ? (m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m) : (int64_t)m;
        return 1;
    }
    default:
        return FAIL;
    }
}

static int ci_contains(const unsigned char *p, const unsigned char *e, const char *w) {
    size_t n = strlen(w);
    for (; p + n <= e; p++) {
        size_t k = 0;
        while (k < n && (p[k] | 0x20) == (unsigned char)w[k]) k++;
        if (k == n) return 1;
    }
    return 0;
}

static int to_float(const Val *v, double *out) {
    switch (v->kind) {
    case V_MISSING:
    case V_NULL:
        return 0;
    case V_INT:
        *out = (double)v->i;
        return 1;
    case V_FLOAT:
        *out = v->d;
        return 1;
    case V_TRUE:
    case V_FALSE:
        return 0; /* a boolean is not a time: null, so parse.py drops the event (as the Python parser) */
    case V_STR:
        if (v->esc || has_digit(v) || ci_contains(v->vs + 1, v->ve - 1, "inf") || ci_contains(v->vs + 1, v->ve - 1, "nan"))
            return FAIL;
        return 0;
    default:
        return FAIL;
    }
}

/* Digits [p, e) as int64: 1 valid, 0 past int64 (null, as polars' cast and _as_int), FAIL if not all digits. */
static int digits_i64(const unsigned char *p, const unsigned char *e, int64_t *out) {
    if (p == e) return FAIL;
    uint64_t m = 0;
    int over = 0;
    for (; p < e; p++) {
        if (*p < '0' || *p > '9') return FAIL;
        if (m > (UINT64_MAX - 9) / 10) over = 1;
        else m = m * 10 + (uint64_t)(*p - '0');
    }
    if (over || m > (uint64_t)INT64_MAX) return 0;
    *out = (int64_t)m;
    return 1;
}

/* parse.py's STREAM_TID_RE: torch < 1.10 writes a GPU event's tid as "stream <N>", read as N.
 * 1 valid, 0 null (N past int64), FAIL when the value is not such a string. */
static int stream_tid(const Val *v, int64_t *out) {
    static const char pre[] = "stream ";
    const size_t n = sizeof pre - 1;
    if (v->kind != V_STR || v->esc || (size_t)(v->ve - v->vs) <= n + 2 || memcmp(v->vs + 1, pre, n)) return FAIL;
    return digits_i64(v->vs + 1 + n, v->ve - 1, out);
}

/* parse.py's _as_tid / _as_int for thread-name keys: int, float truncated (None outside int64), bool/other -> None,
 * strings without digits -> None, "stream <N>" -> N, digits-only strings as int(s, 0) reads them (a leading
 * zero is its error: None); other strings with digits -> Fallback. */
static int as_int_key(const Val *v, int64_t *out) {
    switch (v->kind) {
    case V_INT:
        *out = v->i;
        return 1;
    case V_FLOAT:
        return trunc_i64(v->d, out); /* outside int64: None, as _as_int */
    case V_STR: {
        if (v->esc) return FAIL;
        if (!has_digit(v)) return 0;
        int s = stream_tid(v, out);
        if (s >= 0) return s;
        const unsigned char *p = v->vs + 1, *e = v->ve - 1;
        if (*p == '0') { /* "0", "00": 0; "007": int(s, 0) refuses it */
            while (p < e && *p == '0') p++;
            if (p == e) { *out = 0; return 1; }
            for (; p < e; p++)
                if (*p < '0' || *p > '9') return FAIL;
            return 0;
        }
        return digits_i64(p, e, out);
    }
    default:
        return 0;
    }
}

static inline int str_is(const Val *v, const char *lit) {
    size_t n = strlen(lit);
    return v->kind == V_STR && !v->esc && (size_t)(v->ve - v->vs) == n + 2 && !memcmp(v->vs + 1, lit, n);
}

static inline const Val *src_val(Ctx *cx, int src) {
    return src >= 0 ? &cx->ev[src] : &cx->args[-1 - src];
}

/* One parsed event -> its row (kept ph X/i/I) or counts. */
static int emit(Ctx *cx, const unsigned char *base) {
    const Val *ph = &cx->ev[E_PH];
    uint8_t kind;
    if (str_is(ph, "X")) kind = 0;
    else if (str_is(ph, "i") || str_is(ph, "I")) kind = 1;
    else {
        if (ph->kind == V_STR && ph->esc) return FAIL;
        if (str_is(ph, "s") || str_is(ph, "f") || str_is(ph, "t")) cx->n_flow++;
        else if (str_is(ph, "M")) {
            cx->n_meta++;
            const Val *name = &cx->args[A_NAME];
            if (cx->ev[E_NAME].kind == V_STR && cx->ev[E_NAME].esc) return FAIL;
            if (str_is(&cx->ev[E_NAME], "thread_name") && cx->has_args && name->kind == V_STR) {
                int64_t pid = 0, tid = 0;
                int pok = as_int_key(&cx->ev[E_PID], &pid), tok = as_int_key(&cx->ev[E_TID], &tid);
                if (pok < 0 || tok < 0) return FAIL;
                int32_t code = intern(&cx->intern, name);
                if (code < 0) return FAIL;
                if (push_i64(&cx->thr_pid, pid) || push_i64(&cx->thr_tid, tid) || push_u8(&cx->thr_pid_ok, (uint8_t)pok) ||
                    push_u8(&cx->thr_tid_ok, (uint8_t)tok) || push_i32(&cx->thr_name, code))
                    return FAIL;
            }
        } else cx->n_other++;
        return 0;
    }
    int64_t row = (int64_t)cx->ph.len;
    if (push_u8(&cx->ph, kind)) return FAIL;
    for (int k = 0; k < N_INT; k++) {
        int64_t x = 0;
        int ok = k == I_TID ? stream_tid(&cx->ev[E_TID], &x) : FAIL;
        if (ok < 0) ok = to_int(src_val(cx, INT_SRC[k]), &x);
        if (ok < 0) return FAIL;
        if (push_i64(&cx->ints[k], x) || push_u8(&cx->ints_ok[k], (uint8_t)ok)) return FAIL;
    }
    for (int k = 0; k < N_FLT; k++) {
        double x = 0.0;
        int ok = to_float(&cx->ev[FLT_SRC[k]], &x);
        if (ok < 0) return FAIL;
        if (push_f64(&cx->flts[k], x) || push_u8(&cx->flts_ok[k], (uint8_t)ok)) return FAIL;
    }
    for (int k = 0; k < N_STR; k++) {
        const Val *v = src_val(cx, STR_SRC[k]);
        int32_t code = 0;
        if (v->kind == V_STR) {
            code = intern(&cx->intern, v);
            if (code < 0) return FAIL;
        } else if (v->kind != V_MISSING && v->kind != V_NULL) return FAIL;
        if (push_i32(&cx->strs[k], code)) return FAIL;
    }
    /* Shapes are only read for communication events; with an escaped name parse.py decides. */
    const Val *name = &cx->ev[E_NAME];
    int comm = 0;
    if (name->kind == V_STR) {
        if (name->esc) comm = 1;
        for (size_t k = 0; k < sizeof COMM_PREFIXES / sizeof *COMM_PREFIXES && !comm; k++) {
            size_t n = strlen(COMM_PREFIXES[k]);
            comm = (size_t)(name->ve - name->vs) >= n + 2 && !memcmp(name->vs + 1, COMM_PREFIXES[k], n);
        }
    }
    for (int k = 0; k < N_RAW; k++) {
        const Val *v = &cx->args[RAW_SRC[k]];
        if (v->kind == V_MISSING || (k != R_GROUP_RANKS && !comm)) continue;
        int64_t s = v->vs - base, e = v->ve - base;
        if (push_i64(&cx->raw_row[k], row) || push_i64(&cx->raw_s[k], s) || push_i64(&cx->raw_e[k], e)) return FAIL;
    }
    return 0;
}

static inline int read_key(Cur *c, const unsigned char **k, size_t *n) {
    int esc;
    if (c->p >= c->end || *c->p != '"') return FAIL;
    const unsigned char *s = c->p + 1;
    if (scan_string(c, &esc) || esc) return FAIL; /* an escaped key: rare enough to leave to Python */
    *k = s;
    *n = (size_t)(c->p - 1 - s);
    ws(c);
    if (c->p >= c->end || *c->p != ':') return FAIL;
    c->p++;
    ws(c);
    return 0;
}

static int parse_args(Cur *c, Ctx *cx) {
    c->p++; /* '{' */
    ws(c);
    if (c->p < c->end && *c->p == '}') { c->p++; return 0; }
    for (;;) {
        const unsigned char *k;
        size_t n;
        if (read_key(c, &k, &n)) return FAIL;
        int i = key_index(ARG_BY_LEN, ARG_KEYS, k, n);
        if (i >= 0) {
            cx->args_set |= 1u << i;
            if (parse_value(c, &cx->args[i], 2)) return FAIL;
        } else if (skip_value(c, 2)) return FAIL;
        ws(c);
        if (c->p >= c->end) return FAIL;
        if (*c->p == ',') { c->p++; ws(c); continue; }
        if (*c->p == '}') { c->p++; return 0; }
        return FAIL;
    }
}

_Static_assert(N_EVENT <= 32 && N_ARGS <= 32, "ev_set / args_set are 32-bit masks");

/* Marks the values named in *set missing (every reader looks at kind first) and empties the set:
 * cheaper than clearing all N_ARGS values twice per event. */
static inline void clear_vals(Val *vals, uint32_t *set) {
    for (uint32_t m = *set; m; m &= m - 1) vals[__builtin_ctz(m)].kind = V_MISSING;
    *set = 0;
}

static int parse_event(Cur *c, Ctx *cx, const unsigned char *base) {
    if (c->p >= c->end || *c->p != '{') return FAIL; /* not an event object: Python names it */
    clear_vals(cx->ev, &cx->ev_set);
    clear_vals(cx->args, &cx->args_set);
    cx->has_args = 0;
    c->p++;
    ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return emit(cx, base);
    }
    for (;;) {
        const unsigned char *k;
        size_t n;
        if (read_key(c, &k, &n)) return FAIL;
        if (n == 4 && !memcmp(k, "args", 4)) {
            /* a repeated "args" replaces the earlier one, as in the Python decoder */
            clear_vals(cx->args, &cx->args_set);
            cx->has_args = 0;
            if (c->p < c->end && *c->p == '{') {
                if (parse_args(c, cx)) return FAIL;
                cx->has_args = 1;
            } else if (match_lit(c, "null", 4)) return FAIL; /* args of another type: Python's error */
        } else {
            int i = key_index(EVENT_BY_LEN, EVENT_KEYS, k, n);
            if (i >= 0) {
                cx->ev_set |= 1u << i;
                if (parse_value(c, &cx->ev[i], 1)) return FAIL;
            } else if (skip_value(c, 1)) return FAIL;
        }
        ws(c);
        if (c->p >= c->end) return FAIL;
        if (*c->p == ',') { c->p++; ws(c); continue; }
        if (*c->p == '}') { c->p++; break; }
        return FAIL;
    }
    return emit(cx, base);
}

static int parse_events(Cur *c, Ctx *cx, const unsigned char *base) {
    c->p++; /* '[' */
    ws(c);
    if (c->p < c->end && *c->p == ']') { c->p++; return 0; }
    for (;;) {
        if (parse_event(c, cx, base)) return FAIL;
        ws(c);
        if (c->p >= c->end) return FAIL;
        if (*c->p == ',') { c->p++; ws(c); continue; }
        if (*c->p == ']') { c->p++; return 0; }
        return FAIL;
    }
}

typedef struct {
    Py_ssize_t s, e; /* byte range of a value in the input; s = -1: absent */
} Span;

/* The whole document: {"traceEvents": [...], ...} (distributedInfo and deviceProperties kept as
 * byte ranges) or the bare-array form. FAIL for anything else, trailing bytes included. */
static int parse_doc(Cur *c, Ctx *cx, const unsigned char *base, Span *info, Span *dev) {
    int seen_events = 0;
    ws(c);
    if (c->p < c->end && *c->p == '[') {
        if (parse_events(c, cx, base)) return FAIL;
        seen_events = 1;
    } else if (c->p < c->end && *c->p == '{') {
        c->p++;
        ws(c);
        if (c->p < c->end && *c->p == '}') c->p++;
        else for (;;) {
            const unsigned char *k;
            size_t n;
            if (read_key(c, &k, &n)) return FAIL;
            if (n == 11 && !memcmp(k, "traceEvents", 11)) {
                /* a second traceEvents: which one wins is msgspec's business */
                if (seen_events || c->p >= c->end || *c->p != '[' || parse_events(c, cx, base)) return FAIL;
                seen_events = 1;
            } else if ((n == 15 && !memcmp(k, "distributedInfo", 15)) || (n == 16 && !memcmp(k, "deviceProperties", 16))) {
                Span *sp = n == 15 ? info : dev;
                sp->s = c->p - base;
                if (skip_value(c, 1)) return FAIL;
                sp->e = c->p - base;
            } else if (skip_value(c, 1)) return FAIL;
            ws(c);
            if (c->p < c->end && *c->p == ',') { c->p++; ws(c); continue; }
            if (c->p < c->end && *c->p == '}') { c->p++; break; }
            return FAIL;
        }
    } else return FAIL;
    ws(c);
    return (c->p == c->end && seen_events) ? 0 : FAIL;
}

/* ---------------------------------------------------------------------------------------- */
/* Python interface                                                                          */

static void ctx_free(Ctx *cx) {
    Buf *bufs[] = {&cx->ph, &cx->thr_pid, &cx->thr_tid, &cx->thr_pid_ok, &cx->thr_tid_ok, &cx->thr_name, &cx->intern.strs};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]->data);
    for (int k = 0; k < N_INT; k++) { free(cx->ints[k].data); free(cx->ints_ok[k].data); }
    for (int k = 0; k < N_FLT; k++) { free(cx->flts[k].data); free(cx->flts_ok[k].data); }
    for (int k = 0; k < N_STR; k++) free(cx->strs[k].data);
    for (int k = 0; k < N_RAW; k++) { free(cx->raw_row[k].data); free(cx->raw_s[k].data); free(cx->raw_e[k].data); }
    free(cx->intern.slots);
}

/* The buffer as bytes, its own memory freed at once: the columns are copied one at a time, so
 * the copy never doubles the parse's memory (ctx_free frees what is left). */
static PyObject *buf_bytes(Buf *b) {
    PyObject *out = PyBytes_FromStringAndSize(b->data ? b->data : "", (Py_ssize_t)(b->len * b->item));
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    return out;
}

/* Sets d[key] = value and drops the reference; returns 0, or -1 with an exception set. */
static int put(PyObject *d, const char *key, PyObject *value) {
    if (!value) return -1;
    int r = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return r;
}

static PyObject *span_bytes(const unsigned char *base, Span sp) {
    return sp.s >= 0 ? PyBytes_FromStringAndSize((const char *)base + sp.s, sp.e - sp.s) : Py_NewRef(Py_None);
}

static PyObject *build_result(Ctx *cx, const unsigned char *base, Span info, Span dev) {
    PyObject *out = PyDict_New(), *sub = NULL;
    if (!out) return NULL;
    if (put(out, "n", PyLong_FromSize_t(cx->ph.len)) || put(out, "ph", buf_bytes(&cx->ph))) goto fail;
#define SUBDICT(key, count, names, body)                                \
    if (!(sub = PyDict_New())) goto fail;                                 \
    for (int k = 0; k < (count); k++)                                     \
        if (put(sub, names[k], (body))) goto fail;                        \
    if (put(out, key, sub)) { sub = NULL; goto fail; }                    \
    sub = NULL;
    SUBDICT("ints", N_INT, INT_NAMES, Py_BuildValue("(NN)", buf_bytes(&cx->ints[k]), buf_bytes(&cx->ints_ok[k])))
    SUBDICT("floats", N_FLT, FLT_NAMES, Py_BuildValue("(NN)", buf_bytes(&cx->flts[k]), buf_bytes(&cx->flts_ok[k])))
    SUBDICT("strs", N_STR, STR_NAMES, buf_bytes(&cx->strs[k]))
    SUBDICT("raws", N_RAW, RAW_NAMES, Py_BuildValue("(NNN)", buf_bytes(&cx->raw_row[k]), buf_bytes(&cx->raw_s[k]), buf_bytes(&cx->raw_e[k])))
#undef SUBDICT
    /* Interned strings: code k is strings[k]; index 0 is None (null). Escaped ones are handed
     * over as their raw JSON text (bytes) for parse.py to decode. */
    Str *strs = (Str *)cx->intern.strs.data;
    PyObject *list = PyList_New((Py_ssize_t)cx->intern.strs.len + 1);
    if (!list) goto fail;
    Py_INCREF(Py_None);
    PyList_SET_ITEM(list, 0, Py_None);
    for (size_t k = 0; k < cx->intern.strs.len; k++) {
        PyObject *s = strs[k].esc ? PyBytes_FromStringAndSize((const char *)strs[k].s - 1, (Py_ssize_t)strs[k].n + 2)
                                  : PyUnicode_DecodeUTF8((const char *)strs[k].s, (Py_ssize_t)strs[k].n, "strict");
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
    if (put(out, "distributedInfo", span_bytes(base, info)) || put(out, "deviceProperties", span_bytes(base, dev)))
        goto fail;
    return out;
fail:
    Py_XDECREF(sub);
    Py_DECREF(out);
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
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE)) return NULL;
    const unsigned char *base = view.buf;
    Cur c = {base, base + view.len};
    Ctx *cx = calloc(1, sizeof(Ctx));
    if (!cx) { PyBuffer_Release(&view); return PyErr_NoMemory(); }
    for (int k = 0; k < N_INT; k++) { cx->ints[k].item = 8; cx->ints_ok[k].item = 1; }
    for (int k = 0; k < N_FLT; k++) { cx->flts[k].item = 8; cx->flts_ok[k].item = 1; }
    for (int k = 0; k < N_STR; k++) cx->strs[k].item = 4;
    for (int k = 0; k < N_RAW; k++) cx->raw_row[k].item = cx->raw_s[k].item = cx->raw_e[k].item = 8;
    cx->ph.item = 1;
    cx->thr_pid.item = cx->thr_tid.item = 8;
    cx->thr_pid_ok.item = cx->thr_tid_ok.item = 1;
    cx->thr_name.item = 4;
    cx->intern.strs.item = sizeof(Str);

    /* A guess at the event count (~200 bytes each) so the buffers rarely move. */
    size_t guess = (size_t)view.len / 200 + 16;
    int bad = 0;
    for (int k = 0; k < N_INT && !bad; k++) bad = buf_reserve(&cx->ints[k], guess) || buf_reserve(&cx->ints_ok[k], guess);
    for (int k = 0; k < N_FLT && !bad; k++) bad = buf_reserve(&cx->flts[k], guess) || buf_reserve(&cx->flts_ok[k], guess);
    for (int k = 0; k < N_STR && !bad; k++) bad = buf_reserve(&cx->strs[k], guess);
    bad = bad || buf_reserve(&cx->ph, guess) || intern_grow(&cx->intern);

    /* The GIL stays held: CPython's dtoa (the slow path of parse_number) needs it. */
    Span info = {-1, -1}, dev = {-1, -1};
    int declined = bad || parse_doc(&c, cx, base, &info, &dev);

    PyObject *res = NULL;
    if (declined) PyErr_SetString(Fallback, bad ? "out of memory" : "input the fast parser leaves to the Python one");
    else {
        res = build_result(cx, base, info, dev);
        if (!res && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            PyErr_SetString(Fallback, "a string that is not UTF-8");
        }
    }
    ctx_free(cx);
    free(cx);
    PyBuffer_Release(&view);
    return res;
}

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
    return m;
}
