/* JSON values for _kineto.c (included once, there): whitespace, strings (strict UTF-8, checked
 * escapes), numbers (correctly rounded), literals, and skipping what is not read. Each function
 * reads at a cursor and returns FAIL where the text does not parse, including where it stops at the
 * cursor's end: a streamed chunk may end anywhere, and the caller then reads the unit again with
 * more bytes (doc_step in _kineto.c). */

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
