/* isclatency.c: one event per iSCSI command of MIN_US or more. */
#define MIN_NS ({{MIN_US}} * 1000ULL)

struct event {
    u64 ts_queue;
    u64 wait;
    u64 send;
    u64 resp;
    u64 total;
    u64 net;
    u64 target;
    u64 lun;
    u64 issuer_cgroup; /* ISSUER_KNOWN, _KERNEL_THREAD: its cgroup v2 id */
    u32 host;
    u32 channel;
    u32 id;
    u32 sid;
    u32 cid;
    u32 pid;
    u32 bytes;
    u32 r2t;
    u32 retrans;
    s32 result;
    u8 dir;
    u8 opcode;
    u8 split;
    u8 issuer;     /* ISSUER_* of iscsi_stages.c */
    char comm[TASK_COMM_LEN];         /* the context that dispatched it */
    char issuer_comm[TASK_COMM_LEN];  /* ISSUER_KNOWN, _KERNEL_THREAD: who submitted it */
    u32 issuer_pid;
};

static __always_inline void on_command_done(void *ctx,
        struct inflight *f, struct stage_times *t, int result)
{
    if (t->total < MIN_NS)
        return;
    struct event e = {};
    e.ts_queue = f->ts_queue;
    e.wait = t->wait;
    e.send = t->send;
    e.resp = t->resp;
    e.total = t->total;
    e.net = t->net;
    e.target = t->target;
    e.retrans = t->retrans;
    e.split = t->split;
    e.lun = f->lun;
    e.host = f->host;
    e.channel = f->channel;
    e.id = f->id;
    e.sid = f->sid;
    e.cid = f->cid;
    e.pid = f->pid;
    e.bytes = f->bytes;
    e.r2t = f->r2t;
    e.result = result;
    e.dir = f->dir;
    e.opcode = f->opcode;
    __builtin_memcpy(&e.comm, f->comm, sizeof(e.comm));
#if ISSUER
    e.issuer = f->issuer;
    e.issuer_pid = f->issuer_pid;
    e.issuer_cgroup = f->issuer_cgroup;
    __builtin_memcpy(&e.issuer_comm, f->issuer_comm, sizeof(e.issuer_comm));
#endif
    submit_event(ctx, &e, sizeof(e));
}
