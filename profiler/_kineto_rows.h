/* The rows for _kineto.c (included once, there): growable column buffers, the string table, the
 * event and args keys read, the value rules of each column (see _kineto.c's header), and one
 * event -> its row (emit). */

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
    size_t at;  /* in Intern.text: the opening quote; the content (escapes not decoded) follows */
    uint32_t n; /* content bytes */
    int esc;
} Str;

/* The distinct strings, copied out of the input (a streamed input's chunks are freed as it goes):
 * a 100 MB trace holds a few thousand of them. */
typedef struct {
    int32_t *slots; /* index into strs + 1; 0 = empty */
    size_t mask;
    Buf strs;       /* of Str; code k (1-based) is strs[k-1] */
    Buf text;       /* each string with its quotes, one after the other */
} Intern;

static inline const unsigned char *str_text(const Intern *t, const Str *e) {
    return (const unsigned char *)t->text.data + e->at + 1;
}

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
        size_t h = (size_t)hash_bytes(str_text(t, &strs[k]), strs[k].n) & (cap - 1);
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
        if (strs[k - 1].n == n && !memcmp(str_text(t, &strs[k - 1]), s, n)) return k;
        h = (h + 1) & t->mask;
    }
    Str e = {t->text.len, (uint32_t)n, v->esc};
    if (buf_reserve(&t->text, t->text.len + n + 2)) return FAIL;
    memcpy(t->text.data + t->text.len, v->vs, n + 2);
    t->text.len += n + 2;
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
    Buf raw_row[N_RAW], raw_s[N_RAW], raw_e[N_RAW]; /* row index, byte range in raw_text */
    Buf raw_text;                                   /* those values' JSON text, copied out of the input */
    Buf thr_pid, thr_tid, thr_pid_ok, thr_tid_ok, thr_name;  /* thread_name metadata, in order */
    Intern intern;
    int64_t n_flow, n_meta, n_other;
    Val ev[N_EVENT], args[N_ARGS];
    int has_args; /* the event's args is an object */
    uint32_t ev_set, args_set; /* which of ev[] / args[] hold a value: only those are reset per event */
    /* Where the document's reading stands (doc_step), so that a streamed input can stop at a
     * chunk's end and go on with the next. */
    int state, bare, seen_events;
    Buf info, dev; /* distributedInfo and deviceProperties as JSON text */
    int has_info, has_dev;
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
static int emit(Ctx *cx) {
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
        size_t n = (size_t)(v->ve - v->vs), s = cx->raw_text.len;
        if (buf_reserve(&cx->raw_text, s + n)) return FAIL;
        memcpy(cx->raw_text.data + s, v->vs, n);
        cx->raw_text.len += n;
        if (push_i64(&cx->raw_row[k], row) || push_i64(&cx->raw_s[k], (int64_t)s) || push_i64(&cx->raw_e[k], (int64_t)(s + n)))
            return FAIL;
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

/* FAIL where the event's JSON does not parse (or stops: a streamed chunk's end); HARD where it
 * parses but emit declines it, after pushing part of a row: never to be read again. */
#define HARD (-2)
static int parse_event(Cur *c, Ctx *cx) {
    if (c->p >= c->end || *c->p != '{') return FAIL; /* not an event object: Python names it */
    clear_vals(cx->ev, &cx->ev_set);
    clear_vals(cx->args, &cx->args_set);
    cx->has_args = 0;
    c->p++;
    ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return emit(cx) ? HARD : 0;
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
    return emit(cx) ? HARD : 0;
}
