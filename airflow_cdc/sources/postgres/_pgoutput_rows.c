/*
 * Row decoding of the compiled pgoutput decoder: one Insert/Update/Delete message into the
 * relation's Arrow-layout buffers (see _pgoutput.c for the contract).  Every read is bounds
 * checked first; a malformed row returns -1 and leaves no trace, so Python can reject it.
 */
#include "_pgoutput.h"

/* ---------------------------------------------------------------- growable byte buffers */

int
buf_reserve(Buf *b, Py_ssize_t extra)
{
    if (extra <= b->cap - b->len)
        return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < extra) {
        if (cap > PY_SSIZE_T_MAX / 2)
            return -1;
        cap *= 2;
    }
    char *p = PyMem_RawRealloc(b->p, (size_t)cap);
    if (p == NULL)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static int
buf_put(Buf *b, const void *src, Py_ssize_t n)
{
    if (buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->p + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

void
buf_free(Buf *b)
{
    PyMem_RawFree(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* Set or clear bit ``row`` of an LSB-first bitmap, growing it with zero bytes. */
int
bit_put(Buf *b, Py_ssize_t row, int on)
{
    Py_ssize_t need = row / 8 + 1;
    if (b->len < need) {
        if (buf_reserve(b, need - b->len) < 0)
            return -1;
        memset(b->p + b->len, 0, (size_t)(need - b->len));
        b->len = need;
    }
    if (on)
        b->p[row >> 3] |= (char)(1 << (row & 7));
    else
        b->p[row >> 3] &= (char)~(1 << (row & 7));
    return 0;
}

/* Clear bits ``from`` .. ``to - 1`` of an LSB-first bitmap, growing it with zero bytes. */
static int
bits_clear(Buf *b, Py_ssize_t from, Py_ssize_t to)
{
    if (from >= to)
        return 0;
    Py_ssize_t need = (to + 7) / 8;
    if (b->len < need) {
        if (buf_reserve(b, need - b->len) < 0)
            return -1;
        memset(b->p + b->len, 0, (size_t)(need - b->len));
        b->len = need;
    }
    for (; from < to && (from & 7); from++)
        b->p[from >> 3] &= (char)~(1 << (from & 7));
    Py_ssize_t whole = (to - from) / 8;
    if (whole > 0) {
        memset(b->p + (from >> 3), 0, (size_t)whole);
        from += whole * 8;
    }
    for (; from < to; from++)
        b->p[from >> 3] &= (char)~(1 << (from & 7));
    return 0;
}

Py_ssize_t
bits_set(const Buf *b, Py_ssize_t n)
{
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        count += (b->p[i >> 3] >> (i & 7)) & 1;
    return count;
}

PyObject *
buf_bytes(const Buf *b, Py_ssize_t len)
{
    return PyBytes_FromStringAndSize(len ? b->p : NULL, len);
}

/* ---------------------------------------------------------------- per-relation buffers */

const char OPS[3] = {'c', 'u', 'd'};

void
rel_free(Rel *r)
{
    if (r == NULL)
        return;
    for (int k = 0; k < 2; k++) {
        if (r->img[k].cols != NULL) {
            for (int j = 0; j < r->nsel; j++) {
                buf_free(&r->img[k].cols[j].off);
                buf_free(&r->img[k].cols[j].data);
                buf_free(&r->img[k].cols[j].valid);
                buf_free(&r->img[k].cols[j].toast);
            }
            PyMem_Free(r->img[k].cols);
        }
        buf_free(&r->img[k].present);
    }
    Buf *bufs[] = {&r->ops, &r->pos, &r->ts, &r->xid, &r->lsn, &r->seqoff, &r->seqdata,
                   &r->ooff, &r->odata, &r->ovalid, &r->olsn};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        buf_free(bufs[i]);
    PyMem_Free(r->map);
    PyMem_Free(r->key);
    PyMem_Free(r);
}

/* Store one value (state 0), SQL NULL (1) or unchanged TOAST (2) as row ``row`` of a column. */
static int
col_put(Col *c, Py_ssize_t row, const unsigned char *v, uint32_t vlen, int state)
{
    if (buf_reserve(&c->off, (row + 2) * 4 - c->off.len) < 0)
        return -2;
    int32_t *off = (int32_t *)c->off.p;
    if (row == 0)
        off[0] = 0;
    int64_t end = (int64_t)off[row] + (state == 0 ? vlen : 0);
    if (end > INT32_MAX)
        return -1;  /* cannot be an Arrow string array: let the Python path take the row */
    if (state == 0 && buf_put(&c->data, v, vlen) < 0)
        return -2;
    off[row + 1] = (int32_t)end;
    c->off.len = (row + 2) * 4;
    if (bit_put(&c->valid, row, state == 0) < 0)
        return -2;
    /* the TOAST bitmap is kept from the piece's first value not sent on (earlier rows: zeros) */
    if (state == 2 && !c->toasted) {
        if (bits_clear(&c->toast, 0, row) < 0)
            return -2;
        c->toasted = 1;
    }
    if (c->toasted && bit_put(&c->toast, row, state == 2) < 0)
        return -2;
    return 0;
}

/* Whether row ``row`` of a column holds an unchanged-TOAST value. */
static inline int
toast_at(const Col *c, Py_ssize_t row)
{
    return c->toasted && ((c->toast.p[row >> 3] >> (row & 7)) & 1);
}

/* Write the image's absent rows ``img->filled`` .. ``upto - 1``: every column null, no TOAST,
 * not present (see Image).  Returns 0 or -2 (memory error set). */
int
image_fill(const Rel *r, Image *img, Py_ssize_t upto)
{
    Py_ssize_t from = img->filled;
    if (from >= upto)
        return 0;
    for (int j = 0; j < r->nsel; j++) {
        Col *c = &img->cols[j];
        if (buf_reserve(&c->off, (upto + 1) * 4 - c->off.len) < 0)
            return -2;
        int32_t *off = (int32_t *)c->off.p;
        if (from == 0)
            off[0] = 0;
        int32_t end = off[from];
        for (Py_ssize_t i = from + 1; i <= upto; i++)
            off[i] = end;
        c->off.len = (upto + 1) * 4;
        if (bits_clear(&c->valid, from, upto) < 0 || (c->toasted && bits_clear(&c->toast, from, upto) < 0))
            return -2;
    }
    if (bits_clear(&img->present, from, upto) < 0)
        return -2;
    img->filled = upto;
    return 0;
}

/* Parse one TupleData at ``pos`` into image ``img`` as row ``row``.
 * Returns the offset after it, -1 when malformed (or unrepresentable), -2 on memory error. */
static Py_ssize_t
tuple_put(Rel *r, Image *img, const unsigned char *buf, Py_ssize_t len, Py_ssize_t pos, Py_ssize_t row)
{
    if (image_fill(r, img, row) < 0)
        return -2;
    if (len - pos < 2)
        return -1;
    int ncols = be16(buf + pos);
    pos += 2;
    if (ncols < r->need)
        return -1;
    for (int i = 0; i < ncols; i++) {
        if (pos >= len)
            return -1;
        unsigned char kind = buf[pos];
        int slot = i < r->need ? r->map[i] : -1;
        int rc = 0;
        if (kind == 't' || kind == 'b') {
            if (len - pos < 5)
                return -1;
            uint32_t vlen = be32(buf + pos + 1);
            if ((Py_ssize_t)vlen > len - pos - 5)
                return -1;
            if (slot >= 0)
                rc = col_put(&img->cols[slot], row, buf + pos + 5, vlen, 0);
            pos += 5 + (Py_ssize_t)vlen;
        }
        else if (kind == 'n' || kind == 'u') {
            if (slot >= 0)
                rc = col_put(&img->cols[slot], row, NULL, 0, kind == 'n' ? 1 : 2);
            pos += 1;
        }
        else {
            return -1;
        }
        if (rc < 0)
            return rc;
    }
    if (bit_put(&img->present, row, 1) < 0)
        return -2;
    img->filled = row + 1;
    return pos;
}

/* Forget whatever a rejected row ``row`` (and any later one) wrote; its bits are rewritten by
 * the next row or by image_fill. */
void
rel_rollback(Rel *r, Py_ssize_t row)
{
    for (int k = 0; k < 2; k++) {
        Image *img = &r->img[k];
        if (img->filled > row)
            img->filled = row;
        Py_ssize_t f = img->filled;
        for (int j = 0; j < r->nsel; j++) {
            Col *c = &img->cols[j];
            c->data.len = f == 0 ? 0 : ((int32_t *)c->off.p)[f];
            c->off.len = f == 0 ? 0 : (f + 1) * 4;
        }
    }
}

static char *
put_u64(char *out, uint64_t v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *out++ = tmp[--n];
    return out;
}

static char *
put_i64(char *out, int64_t v)
{
    if (v < 0) {
        *out++ = '-';
        return put_u64(out, (uint64_t)0 - (uint64_t)v);
    }
    return put_u64(out, (uint64_t)v);
}

/* ``source.origin`` / ``origin_lsn`` of row ``r->n``: 0, -1 (leave the row to Python) or -2.
 * Nothing is stored while no row of the piece has an origin; the first one that has fills the
 * buffers with nulls for the rows before it. */
static int
origin_put(Txn *tx, Rel *r)
{
    Py_ssize_t row = r->n;
    int has = tx->origin != NULL;
    if (!has && !r->origins)
        return 0;
    if (!r->origins) {
        if (buf_reserve(&r->ooff, (row + 2) * 4) < 0 || buf_reserve(&r->olsn, (row + 1) * 8) < 0)
            return -2;
        memset(r->ooff.p, 0, (size_t)(row + 1) * 4);
        memset(r->olsn.p, 0, (size_t)row * 8);
        r->ooff.len = (row + 1) * 4;
        r->olsn.len = row * 8;
        r->odata.len = r->ovalid.len = 0;
        r->origins = 1;
    }
    uint64_t lsn = has ? tx->origin_lsn : 0;
    if ((has && buf_put(&r->odata, tx->origin_utf8, tx->origin_len) < 0) || bit_put(&r->ovalid, row, has) < 0
        || buf_put(&r->olsn, &lsn, 8) < 0)
        return -2;
    if (r->odata.len > INT32_MAX)
        return -1;
    int32_t end = (int32_t)r->odata.len;
    return buf_put(&r->ooff, &end, 4) < 0 ? -2 : 0;
}

/* Envelope facts of an accepted event. */
static int
meta_put(Txn *tx, Rel *r, int op, int64_t change_lsn)
{
    unsigned char key[POS_LEN];
    uint64_t seq = (uint64_t)tx->seq;
    for (int i = 0; i < 4; i++)
        key[i] = (unsigned char)(tx->epoch >> (24 - 8 * i));
    for (int i = 0; i < 8; i++) {
        key[4 + i] = (unsigned char)(tx->final_lsn >> (56 - 8 * i));
        key[12 + i] = (unsigned char)(seq >> (56 - 8 * i));
    }
    /* Debezium's sequence: ["<last commit LSN>","<change LSN>"], null before the first commit */
    char text[64], *t = text;
    *t++ = '[';
    if (tx->has_prev) {
        *t++ = '"';
        t = put_u64(t, tx->prev);
        *t++ = '"';
    }
    else {
        memcpy(t, "null", 4);
        t += 4;
    }
    memcpy(t, ",\"", 2);
    t = put_i64(t + 2, change_lsn);
    *t++ = '"';
    *t++ = ']';
    if (r->n == 0) {
        int32_t zero = 0;
        if (buf_put(&r->seqoff, &zero, 4) < 0)
            return -2;
    }
    if (buf_put(&r->ops, &OPS[op], 1) < 0 || buf_put(&r->pos, key, POS_LEN) < 0
        || buf_put(&r->ts, &tx->ts_us, 8) < 0 || buf_put(&r->xid, &tx->xid, 8) < 0
        || buf_put(&r->lsn, &change_lsn, 8) < 0 || buf_put(&r->seqdata, text, t - text) < 0)
        return -2;
    if (r->seqdata.len > INT32_MAX)
        return -1;
    int32_t end = (int32_t)r->seqdata.len;
    return buf_put(&r->seqoff, &end, 4) < 0 ? -2 : origin_put(tx, r);
}

/* Whether row ``row`` of an image holds an unchanged-TOAST value in a captured column. */
static int
has_toast(const Rel *r, const Image *img, Py_ssize_t row)
{
    for (int j = 0; j < r->nsel; j++)
        if (toast_at(&img->cols[j], row))
            return 1;
    return 0;
}

/* Forget every trace of rows ``row`` and later: column buffers and envelope buffers. */
static void
rel_cut(Rel *r, Py_ssize_t row)
{
    rel_rollback(r, row);
    r->ops.len = row;
    r->pos.len = row * POS_LEN;
    r->ts.len = r->xid.len = r->lsn.len = row * 8;
    r->seqoff.len = row ? (row + 1) * 4 : 0;
    r->seqdata.len = row ? ((int32_t *)r->seqoff.p)[row] : 0;
    if (r->origins && row == 0)
        r->origins = 0;
    else if (r->origins) {
        r->ooff.len = (row + 1) * 4;
        r->odata.len = ((int32_t *)r->ooff.p)[row];
        r->olsn.len = row * 8;
    }
}

/* Whether row ``row``'s after image has other key values than its before image (the text as
 * sent; an unchanged-TOAST key value did not change) -- as stream.key_changed. */
static int
key_moved(Rel *r, Py_ssize_t row)
{
    for (int k = 0; k < r->nkey; k++) {
        Col *a = &r->img[0].cols[r->key[k]], *b = &r->img[1].cols[r->key[k]];
        if (toast_at(b, row))
            continue;
        int va = (a->valid.p[row >> 3] >> (row & 7)) & 1, vb = (b->valid.p[row >> 3] >> (row & 7)) & 1;
        if (va != vb)
            return 1;
        if (!va)
            continue;
        int32_t *oa = (int32_t *)a->off.p, *ob = (int32_t *)b->off.p;
        int32_t la = oa[row + 1] - oa[row], lb = ob[row + 1] - ob[row];
        if (la != lb || (la && memcmp(a->data.p + oa[row], b->data.p + ob[row], (size_t)la) != 0))
            return 1;
    }
    return 0;
}

/* The envelope of the row just decoded at ``r->n`` (op 0/1/2 = c/u/d): 0, or -1/-2 as change_put. */
static int
row_done(Txn *tx, Rel *r, int op, int64_t change_lsn)
{
    tx->seq++;
    int rc = meta_put(tx, r, op, change_lsn);
    if (rc < 0) {
        tx->seq--;
        return rc;
    }
    r->n++;
    r->counts[op]++;
    tx->events++;
    return 0;
}

/* A key-changing update: Debezium's d (before = old image) then c (after = new image), at
 * consecutive sequence numbers; the c row keeps the old image as its before image, which the
 * table sink turns into ``__old_key``.  ``newpos`` is the new tuple's offset.  Either both
 * (unskipped) rows are added or none: returns the rows added, -1 or -2. */
static int
key_change_put(Txn *tx, Rel *r, const unsigned char *buf, Py_ssize_t len, Py_ssize_t newpos,
               int64_t change_lsn)
{
    Py_ssize_t row = r->n;
    int64_t seq = tx->seq;
    Py_ssize_t p = 0, added = 0;
    rel_rollback(r, row);
    for (int half = 0; half < 2 && p >= 0; half++) {
        int op = half == 0 ? 2 : 0;
        if (tx->skip[op])
            continue;
        p = tuple_put(r, &r->img[0], buf, len, 6, r->n);
        if (p >= 0 && op == 0)  /* the d half's after image is absent (filled in later) */
            p = tuple_put(r, &r->img[1], buf, len, newpos, r->n);
        if (p >= 0)
            p = row_done(tx, r, op, change_lsn);
        if (p >= 0)
            added++;
    }
    if (p < 0) {
        for (Py_ssize_t i = row; i < r->n; i++)
            r->counts[r->ops.p[i] == 'c' ? 0 : 2]--;
        tx->events -= r->n - row;
        tx->seq = seq;
        r->n = row;
        rel_cut(r, row);
        return (int)p;
    }
    if (added)
        r->bytes += len;
    return (int)added;
}

/* Decode one I/U/D message into the relation's buffers.
 * Returns 1 or 2 (events added), 0 (skipped op), -1 (leave the row to Python) or -2 (error set). */
int
change_put(Txn *tx, Rel *r, const unsigned char *buf, Py_ssize_t len, int64_t change_lsn)
{
    Py_ssize_t row = r->n, p;
    unsigned char kind = buf[0], marker = buf[5];
    int op;
    if (kind == 'I') {
        op = 0;  /* no before image: image_fill writes it when needed */
        p = marker == 'N' ? tuple_put(r, &r->img[1], buf, len, 6, row) : -1;
    }
    else if (kind == 'U') {
        op = 1;
        if (marker == 'N') {
            p = tuple_put(r, &r->img[1], buf, len, 6, row);
        }
        else if (marker == 'K' || marker == 'O') {
            p = tuple_put(r, &r->img[0], buf, len, 6, row);
            Py_ssize_t newpos = p + 1;
            if (p >= 0)
                p = (p < len && buf[p] == 'N') ? tuple_put(r, &r->img[1], buf, len, newpos, row) : -1;
            /* unchanged TOAST next to an old image: Python fills it from the old values */
            if (p >= 0 && has_toast(r, &r->img[1], row))
                p = -1;
            if (p >= 0 && key_moved(r, row))
                return key_change_put(tx, r, buf, len, newpos, change_lsn);
        }
        else {
            p = -1;
        }
    }
    else {
        op = 2;
        p = (marker == 'K' || marker == 'O') ? tuple_put(r, &r->img[0], buf, len, 6, row) : -1;
    }
    if (p >= 0 && tx->skip[op]) {
        rel_rollback(r, row);
        return 0;
    }
    if (p >= 0)
        p = row_done(tx, r, op, change_lsn);
    if (p < 0) {
        if (p == -1)  /* the envelope buffers may hold part of this row: cut them back */
            rel_cut(r, row);
        else
            rel_rollback(r, row);
        return (int)p;
    }
    r->bytes += len;
    return 1;
}
