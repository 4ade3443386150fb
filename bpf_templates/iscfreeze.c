/* iscfreeze.c: request-queue freezes and quiesces, who started them, how
 * long the queue stayed frozen/quiesced, and the submitters that waited. */
/* Kernel types read (from BTF or the headers, as in common.h):
 * @struct request_queue disk? backing_dev_info? mq_freeze_depth quiesce_depth?
 * @struct gendisk major first_minor disk_name
 * @struct backing_dev_info? dev_name
 */
#if !BTF_TYPES
#include <linux/blkdev.h>
#include <linux/backing-dev-defs.h>
#include <linux/kdev_t.h>
#endif

#define MIN_NS ({{MIN_US}} * 1000ULL)
#define FILTER_SET {{FILTER_SET}}
/* 1: q->disk (5.15+); 0: q->backing_dev_info->dev_name ("8:16"), resolved in user space */
#define QUEUE_DISK {{QUEUE_DISK}}
/* 1: q->quiesce_depth counts nested quiesces; 0: one unquiesce ends it */
#define QUIESCE_DEPTH {{QUIESCE_DEPTH}}

#define KIND_FREEZE 0
#define KIND_QUIESCE 1
#define TYPE_END 0
#define TYPE_WAIT 1
#define NAME_LEN 32
#define REQ_NOWAIT_FLAG 1 /* BLK_MQ_REQ_NOWAIT */

struct qkey {
    u64 q;
    u32 kind;
    u32 pad;
};

/* One freeze or quiesce in progress, per queue and kind. Nesting is the
 * kernel's own: it ends when mq_freeze_depth / quiesce_depth returns to 0. */
struct state_t {
    u64 start;
    u64 waiters;
    u32 pid;
    u32 tid;
    s32 stack;
    u32 dev;
    char comm[TASK_COMM_LEN];
    char disk[NAME_LEN];
};
BPF_HASH(active, struct qkey, struct state_t, 4096);
BPF_STACK_TRACE(stacks, 1024);
/* Whole-disk dev_t numbers to trace, filled from user space. */
BPF_HASH(disks, u32, u8, 1024);

struct wait_t {
    u64 ts;
    u64 q;
    u64 freeze_start;
};
BPF_HASH(waiting, u64, struct wait_t, 10240);

/* Per queue and kind, for the summary: every freeze, whatever the threshold. */
struct total_t {
    u64 count;
    u64 time_ns;
    u64 waits;
    u64 wait_ns;
    u64 max_wait_ns;
    u32 dev;
    u32 pad;
    char disk[NAME_LEN];
};
BPF_HASH(totals, struct qkey, struct total_t, 4096);

struct event {
    u64 type;
    u64 q;
    u64 start;     /* freeze start (for TYPE_WAIT: of the freeze waited for) */
    u64 end;       /* unfreeze (TYPE_WAIT: when the wait ended) */
    u64 value;     /* TYPE_END: submitters that blocked; TYPE_WAIT: wait ns */
    u32 kind;
    u32 pid;
    u32 tid;
    u32 dev;
    s32 stack;
    u32 pad;
    char comm[TASK_COMM_LEN];
    char disk[NAME_LEN];
};

static __always_inline u32 queue_dev(struct request_queue *q, char *name)
{
#if QUEUE_DISK
    struct gendisk *gd = NULL;
    bpf_probe_read_kernel(&gd, sizeof(gd), &q->disk);
    if (!gd)
        return 0;
    int major = 0, minor = 0;
    bpf_probe_read_kernel(&major, sizeof(major), &gd->major);
    bpf_probe_read_kernel(&minor, sizeof(minor), &gd->first_minor);
    bpf_probe_read_kernel_str(name, NAME_LEN, gd->disk_name);
    return MKDEV(major, minor);
#else
    struct backing_dev_info *bdi = NULL;
    bpf_probe_read_kernel(&bdi, sizeof(bdi), &q->backing_dev_info);
    if (bdi)
        bpf_probe_read_kernel_str(name, NAME_LEN, bdi->dev_name);
    return 0;
#endif
}

static __always_inline int begin(struct pt_regs *ctx, struct request_queue *q, u32 kind)
{
    struct qkey k = {};
    k.q = (u64)q;
    k.kind = kind;
    if (active.lookup(&k))
        return 0; /* nested, or a wrapper and the function it calls */
    struct state_t n = {};
    n.dev = queue_dev(q, n.disk);
#if FILTER_SET
    u32 dev = n.dev;
    if (!disks.lookup(&dev)) {
        count(CTR_FREEZE_UNFILTERED);
        return 0;
    }
#endif
    u64 id = bpf_get_current_pid_tgid();
    n.start = bpf_ktime_get_ns();
    n.pid = id >> 32;
    n.tid = (u32)id;
    n.stack = stacks.get_stackid(ctx, 0);
    bpf_get_current_comm(&n.comm, sizeof(n.comm));
    active.insert(&k, &n);
    return 0;
}

static __always_inline int end(struct pt_regs *ctx, struct request_queue *q, u32 kind)
{
    struct qkey k = {};
    k.q = (u64)q;
    k.kind = kind;
    struct state_t *s = active.lookup(&k);
    if (!s)
        return 0;
    int depth = 1;
    if (kind == KIND_FREEZE) {
        bpf_probe_read_kernel(&depth, sizeof(depth), &q->mq_freeze_depth);
    } else {
#if QUIESCE_DEPTH
        bpf_probe_read_kernel(&depth, sizeof(depth), &q->quiesce_depth);
#endif
    }
    if (depth > 1)
        return 0; /* an inner unfreeze: the queue stays frozen */
    struct event e = {};
    e.type = TYPE_END;
    e.q = k.q;
    e.kind = kind;
    e.start = s->start;
    e.end = bpf_ktime_get_ns();
    e.value = s->waiters;
    e.pid = s->pid;
    e.tid = s->tid;
    e.dev = s->dev;
    e.stack = s->stack;
    __builtin_memcpy(&e.comm, s->comm, sizeof(e.comm));
    __builtin_memcpy(&e.disk, s->disk, sizeof(e.disk));
    active.delete(&k);

    struct total_t zero = {};
    struct total_t *t = totals.lookup_or_try_init(&k, &zero);
    if (t) {
        __sync_fetch_and_add(&t->count, 1);
        __sync_fetch_and_add(&t->time_ns, e.end - e.start);
        t->dev = e.dev;
        __builtin_memcpy(&t->disk, e.disk, sizeof(t->disk));
    }
    if (e.end - e.start < MIN_NS)
        return 0;
    submit_event(ctx, &e, sizeof(e));
    return 0;
}

int freeze_begin(struct pt_regs *ctx, struct request_queue *q)
{
    return begin(ctx, q, KIND_FREEZE);
}

int freeze_end(struct pt_regs *ctx, struct request_queue *q)
{
    return end(ctx, q, KIND_FREEZE);
}

int quiesce_begin(struct pt_regs *ctx, struct request_queue *q)
{
    return begin(ctx, q, KIND_QUIESCE);
}

int quiesce_end(struct pt_regs *ctx, struct request_queue *q)
{
    return end(ctx, q, KIND_QUIESCE);
}

/* A submitter entering a frozen queue: counted on entry (so the freeze's
 * line knows how many to expect), timed to the return. */
static __always_inline int wait_begin(struct request_queue *q)
{
    struct qkey k = {};
    k.q = (u64)q;
    k.kind = KIND_FREEZE;
    struct state_t *s = active.lookup(&k);
    if (!s)
        return 0;
    __sync_fetch_and_add(&s->waiters, 1);
    struct wait_t w = {};
    w.ts = bpf_ktime_get_ns();
    w.q = k.q;
    w.freeze_start = s->start;
    u64 id = bpf_get_current_pid_tgid();
    waiting.update(&id, &w);
    return 0;
}

/* blk_queue_enter(q, flags): NOWAIT callers never sleep. */
int wait_enter_queue(struct pt_regs *ctx, struct request_queue *q, unsigned int flags)
{
    if (flags & REQ_NOWAIT_FLAG)
        return 0;
    return wait_begin(q);
}

/* __bio_queue_enter(q, bio): the slow path of bio_queue_enter (6.1+). */
int wait_enter_bio(struct pt_regs *ctx, struct request_queue *q)
{
    return wait_begin(q);
}

int wait_return(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    struct wait_t *w = waiting.lookup(&id);
    if (!w)
        return 0;
    struct event e = {};
    e.type = TYPE_WAIT;
    e.end = bpf_ktime_get_ns();
    e.value = e.end - w->ts;
    e.q = w->q;
    e.start = w->freeze_start;
    waiting.delete(&id);
    e.kind = KIND_FREEZE;
    e.pid = id >> 32;
    e.tid = (u32)id;
    bpf_get_current_comm(&e.comm, sizeof(e.comm));

    struct qkey k = {};
    k.q = e.q;
    k.kind = KIND_FREEZE;
    struct total_t zero = {};
    struct total_t *t = totals.lookup_or_try_init(&k, &zero);
    if (t) {
        __sync_fetch_and_add(&t->waits, 1);
        __sync_fetch_and_add(&t->wait_ns, e.value);
        if (e.value > t->max_wait_ns)
            t->max_wait_ns = e.value;
    }
    submit_event(ctx, &e, sizeof(e));
    return 0;
}
