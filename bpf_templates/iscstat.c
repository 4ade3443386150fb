/* iscstat.c: per-row aggregates of the per-command stages, in the kernel.
 * A row is a session:connection (and LUN with PER_LUN, direction with
 * PER_DIR). User space flips an epoch, waits for programs in flight to
 * finish, then reads and deletes the entries of the old epoch: no
 * per-command events cross to user space and no update is lost between
 * reading and clearing. epoch[EPOCH_ROWS] (rows and Prometheus buckets)
 * flips at every interval and every scrape; epoch[EPOCH_FINE] (the fine
 * histograms, only kept with FINE_HIST) at every interval only, so a
 * scrape never walks them. */
#define PER_LUN {{PER_LUN}}
#define PER_DIR {{PER_DIR}}
/* Exact Prometheus histogram buckets (src/stages/stats.rs LE_NS holds the same
 * bounds): counted per row, stage and bucket when --prom-file is given. */
#define PROM {{PROM}}
/* Fine histograms for percentiles and log2 histograms (-P, -H). */
#define FINE_HIST {{FINE_HIST}}
/* Rows per issuer's cgroup (--by-cgroup): at most CGROUP_ROWS cgroups get
 * rows of their own, the first seen; the commands of any other cgroup go to
 * the row of CGROUP_OTHER, and those with no issuer known (the kernel's own
 * commands, flushes, front merges) to CGROUP_NOT_KNOWN. A cgroup's id is
 * never 0 (the root's is 1) nor all ones. src/stages/stats.rs holds the
 * same two values (a test checks). */
#define PER_CGROUP {{PER_CGROUP}}
#define CGROUP_ROWS {{CGROUP_ROWS}}
#define CGROUP_NOT_KNOWN 0
#define CGROUP_OTHER 0xffffffffffffffffULL
#if PER_CGROUP && !ISSUER
#error "rows per cgroup need the issuer (ISSUER)"
#endif
#define EPOCH_ROWS 0
#define EPOCH_FINE 1
/* Stage numbers of sum[], max[] and hist_key.stage; src/stages/stats.rs STAGES
 * lists them in this order (a test checks). */
#define STAGE_WAIT 0
#define STAGE_SEND 1
#define STAGE_RESP 2
#define STAGE_NET 3
#define STAGE_TARGET 4
#define STAGE_TOTAL 5
#define STAGES 6

struct row_key {
    u32 epoch;
    u32 sid;
    u32 cid;
    u32 host;
    u64 lun;
    u32 dir;
    u32 pad;
    u64 cgroup;    /* PER_CGROUP: the issuer's cgroup id or CGROUP_*, else 0 */
};

struct row_val {
    u64 count;
    u64 bytes;
    u64 split;     /* commands with NET and TARGET, of count */
    u64 sum[STAGES];
    u64 max[STAGES];
};

struct hist_key {
    struct row_key row;
    u32 stage;
    u32 bucket;
};

struct conn_key {
    u32 sid;
    u32 cid;
};

struct conn_tcp {
    u64 sk;        /* the socket: a new one after relogin */
    u32 first;     /* its total_retrans when we first timed a command on it */
    u32 retrans;   /* its total_retrans at the latest completion */
};

BPF_ARRAY(epoch, u32, 2);
BPF_HASH(conns, struct conn_key, struct conn_tcp, 1024);
BPF_PERCPU_HASH(rows, struct row_key, struct row_val, 4096);
BPF_HASH(hists, struct hist_key, u64, 65536);
BPF_HASH(prom, struct hist_key, u64, 16384);
#if PER_CGROUP
/* The cgroups that have rows: filled here, as they are first seen. */
BPF_HASH(cgroup_rows, u64, u8, CGROUP_ROWS);

static __always_inline u64 row_cgroup(struct inflight *f)
{
    if (f->issuer != ISSUER_KNOWN && f->issuer != ISSUER_KERNEL_THREAD)
        return CGROUP_NOT_KNOWN;
    u64 id = f->issuer_cgroup;
    u8 one = 1;
    if (cgroup_rows.lookup(&id))
        return id;
    /* Full: E2BIG; taken by another CPU meanwhile: EEXIST, and it has it. */
    if (cgroup_rows.insert(&id, &one) == 0 || cgroup_rows.lookup(&id))
        return id;
    return CGROUP_OTHER;
}
#endif

static __always_inline u32 le_index(u64 ns)
{
    if (ns <= 100000ULL) return 0;
    if (ns <= 250000ULL) return 1;
    if (ns <= 500000ULL) return 2;
    if (ns <= 1000000ULL) return 3;
    if (ns <= 2500000ULL) return 4;
    if (ns <= 5000000ULL) return 5;
    if (ns <= 10000000ULL) return 6;
    if (ns <= 25000000ULL) return 7;
    if (ns <= 50000000ULL) return 8;
    if (ns <= 100000000ULL) return 9;
    if (ns <= 250000000ULL) return 10;
    if (ns <= 500000000ULL) return 11;
    if (ns <= 1000000000ULL) return 12;
    if (ns <= 2500000000ULL) return 13;
    if (ns <= 5000000000ULL) return 14;
    if (ns <= 10000000000ULL) return 15;
    return 16;
}

static __always_inline u32 log2_floor(u64 v)
{
    u32 r = 0;
    if (v >> 32) { v >>= 32; r += 32; }
    if (v >> 16) { v >>= 16; r += 16; }
    if (v >> 8) { v >>= 8; r += 8; }
    if (v >> 4) { v >>= 4; r += 4; }
    if (v >> 2) { v >>= 2; r += 2; }
    if (v >> 1) { r += 1; }
    return r;
}

/* Log-linear buckets of microseconds: 16 per power of two (at most 1/16
 * wide), so 1.0 ms and 1.3 ms land in different buckets, and log2
 * histograms in us are exact unions of them. src/stages/stats.rs holds the
 * inverse. */
static __always_inline u32 fine_bucket(u64 ns)
{
    u64 v = ns / 1000;
    if (v < 16)
        return v;
    u32 msb = log2_floor(v);
    return (msb - 3) * 16 + ((v >> (msb - 4)) & 15);
}

/* hk: the row in the rows epoch; fk: the same row in the fine epoch. */
static __always_inline void add_stage(struct row_val *v, struct hist_key *hk, struct hist_key *fk, int i, u64 ns)
{
    v->sum[i] += ns;
    if (ns > v->max[i])
        v->max[i] = ns;
    if (FINE_HIST) {
        fk->stage = i;
        fk->bucket = fine_bucket(ns);
        hists.atomic_increment(*fk);
    }
    if (PROM) {
        hk->stage = i;
        hk->bucket = le_index(ns);
        prom.atomic_increment(*hk);
    }
}

static __always_inline void on_command_done(void *ctx,
        struct inflight *f, struct stage_times *t, int result)
{
    u32 slot = EPOCH_ROWS;
    u32 *ep = epoch.lookup(&slot);
    struct row_key k = {};
    k.epoch = ep ? *ep : 0;
    k.sid = f->sid;
    k.cid = f->cid;
    k.host = f->host;
    k.lun = PER_LUN ? f->lun : 0;
    k.dir = PER_DIR ? f->dir : 0;
#if PER_CGROUP
    k.cgroup = row_cgroup(f);
#endif
    struct row_val zv = {};
    struct row_val *v = rows.lookup_or_try_init(&k, &zv);
    if (!v) {
        count(CTR_LOST);
        return;
    }
    v->count += 1;
    v->bytes += f->bytes;
    struct hist_key hk = {}, fk = {};
    hk.row = k;
    fk.row = k;
    if (FINE_HIST) {
        slot = EPOCH_FINE;
        ep = epoch.lookup(&slot);
        fk.row.epoch = ep ? *ep : 0;
    }
    add_stage(v, &hk, &fk, STAGE_WAIT, t->wait);
#if HAVE_SENT
    add_stage(v, &hk, &fk, STAGE_SEND, t->send);  /* else unknown: no SEND statistics at all */
#endif
    add_stage(v, &hk, &fk, STAGE_RESP, t->resp);
    if (t->split) {
        v->split += 1;
        add_stage(v, &hk, &fk, STAGE_NET, t->net);
        add_stage(v, &hk, &fk, STAGE_TARGET, t->target);
    }
    add_stage(v, &hk, &fk, STAGE_TOTAL, t->total);
    /* The socket's retransmit count as last seen, per connection, and as
     * it was when the first command timed on that socket was prepared:
     * user space reports its growth per interval (src/stages/stats.rs
     * Retransmits). A relogin brings a new socket: counted from its own. */
    if (f->sk && t->retrans != RETX_UNKNOWN) {
        struct conn_key ck = {};
        ck.sid = f->sid;
        ck.cid = f->cid;
        u32 r = f->retrans0 + t->retrans;
        struct conn_tcp *c = conns.lookup(&ck);
        if (c && c->sk == f->sk) {
            if (r > c->retrans)
                c->retrans = r;
        } else if (c) {
            c->sk = f->sk;
            c->first = f->retrans0;
            c->retrans = r;
        } else {
            struct conn_tcp nc = {};
            nc.sk = f->sk;
            nc.first = f->retrans0;
            nc.retrans = r;
            conns.update(&ck, &nc);
        }
    }
}
