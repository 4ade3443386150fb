/* iscstates.c: iSCSI connection failures and recoveries. Control paths
 * only (a handful of hits per failure), all kprobes; the one per-I/O probe
 * (the raw tracepoint block_rq_complete: errors and the longest request
 * held up, per SCSI host) is attached by user space at the first failure,
 * never while sessions are healthy.
 * The kernel functions probed per kernel: docs/kernels.md. */
/* Kernel types read (from BTF or the headers, as in common.h):
 * @struct iscsi_cls_conn dd_data cid
 * @struct iscsi_conn session stop_stage
 * @struct iscsi_session cls_session
 * @struct iscsi_cls_session sid recovery_tmo block_work unblock_work recovery_work
 * @struct iscsi_task sc state
 * @struct scsi_cmnd device
 * @struct scsi_device host request_queue
 * @struct Scsi_Host host_no
 * @struct request start_time_ns q cmd_flags
 * @enum ISCSI_TASK_COMPLETED ISCSI_TASK_PENDING ISCSI_TASK_FREE
 */
#if !BTF_TYPES
#include <linux/blkdev.h>
#include <linux/blk-mq.h>
#include <scsi/scsi_cmnd.h>
#include <scsi/scsi_device.h>
#include <scsi/scsi_host.h>
#include <scsi/scsi_transport_iscsi.h>
#include <scsi/libiscsi.h>
#endif

#define SCSI_MLQUEUE_EH_RETRY 0x1057

/* Event types: src/states/mod.rs (Kind) has the same numbers; a test checks. */
#define EV_CONN_ERROR 1
#define EV_CONN_STOP 2
#define EV_CONN_START 3
#define EV_BLOCK 4
#define EV_UNBLOCK 5
#define EV_RECOVERY_TIMEOUT 6
#define EV_REQUEUE 7

struct event {
    u64 ts;
    u64 oldest_ns;  /* EV_CONN_STOP: age of the oldest command flushed (0: none) */
    u32 type;
    u32 sid;
    u32 cid;
    s32 code;       /* CONN_ERROR: enum iscsi_err; CONN_STOP: flag; CONN_START: stop_stage before; REQUEUE: host */
    u32 sent;       /* CONN_STOP: commands flushed that had been sent */
    u32 unsent;     /* CONN_STOP: commands flushed before they were sent */
    s32 recovery_tmo;
    u32 pad;
};

/* An iscsi_conn_stop in progress, per thread: the commands it flushes. */
struct stop_t {
    u64 cls_conn;
    u64 oldest_start;
    u32 sent;
    u32 unsent;
    s32 flag;
    u32 pad;
};
BPF_HASH(stopping, u64, struct stop_t, 1024);

/* Per SCSI host of an iSCSI session, written by user space (src/states/mod.rs
 * Held): the window of its latest recovery episode, from its first failure
 * event to the unblock (until ~0 while it lasts). Requests of other hosts
 * are not looked at. */
struct held_t {
    u64 from;
    u64 until;
};
BPF_HASH(held, u32, struct held_t, 1024);
/* Per host: the block layer's requests that ended in an error; and, per
 * CPU, the longest time a request held up by the episode (started before
 * its end, completed after its start) took from its start
 * (rq->start_time_ns, where iostat's await counts from) to its final
 * completion. Read by user space. */
BPF_HASH(rq_errors, u32, u64, 1024);
BPF_PERCPU_HASH(held_longest, u32, u64, 1024);

static __always_inline void conn_ids(struct iscsi_cls_conn *cls_conn, struct event *e)
{
    struct iscsi_conn *conn = NULL;
    struct iscsi_session *session = NULL;
    struct iscsi_cls_session *cls_session = NULL;
    bpf_probe_read_kernel(&e->cid, sizeof(e->cid), &cls_conn->cid);
    bpf_probe_read_kernel(&conn, sizeof(conn), &cls_conn->dd_data);
    if (!conn)
        return;
    bpf_probe_read_kernel(&session, sizeof(session), &conn->session);
    if (!session)
        return;
    bpf_probe_read_kernel(&cls_session, sizeof(cls_session), &session->cls_session);
    if (!cls_session)
        return;
    bpf_probe_read_kernel(&e->sid, sizeof(e->sid), &cls_session->sid);
    bpf_probe_read_kernel(&e->recovery_tmo, sizeof(e->recovery_tmo), &cls_session->recovery_tmo);
}

/* iscsi_conn_error_event(cls_conn, err): the first failure of a connection. */
int conn_error(struct pt_regs *ctx, struct iscsi_cls_conn *cls_conn, int err)
{
    struct event e = {};
    e.ts = bpf_ktime_get_ns();
    e.type = EV_CONN_ERROR;
    e.code = err;
    conn_ids(cls_conn, &e);
    submit_event(ctx, &e, sizeof(e));
    return 0;
}

/* iscsi_conn_stop(cls_conn, flag): flag 3 recovery, 1 terminate (logout). */
int conn_stop(struct pt_regs *ctx, struct iscsi_cls_conn *cls_conn, int flag)
{
    u64 id = bpf_get_current_pid_tgid();
    struct stop_t s = {};
    s.cls_conn = (u64)cls_conn;
    s.flag = flag;
    stopping.update(&id, &s);
    return 0;
}

/* fail_scsi_task / __fail_scsi_task(task, err), inside iscsi_conn_stop. */
int flush_task(struct pt_regs *ctx, struct iscsi_task *task)
{
    u64 id = bpf_get_current_pid_tgid();
    struct stop_t *s = stopping.lookup(&id);
    if (!s)
        return 0;
    struct scsi_cmnd *sc = NULL;
    int state = 0;
    bpf_probe_read_kernel(&sc, sizeof(sc), &task->sc);
    bpf_probe_read_kernel(&state, sizeof(state), &task->state);
    if (!sc || state == ISCSI_TASK_COMPLETED || state == ISCSI_TASK_FREE)
        return 0;
    if (state == ISCSI_TASK_PENDING)
        s->unsent++;
    else
        s->sent++;
    /* blk_mq_rq_from_pdu: the request is just before its scsi_cmnd. */
    struct request *rq = (struct request *)((char *)sc - sizeof(struct request));
    u64 start = 0;
    bpf_probe_read_kernel(&start, sizeof(start), &rq->start_time_ns);
    if (start && (s->oldest_start == 0 || start < s->oldest_start))
        s->oldest_start = start;
    return 0;
}

int conn_stop_ret(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    struct stop_t *s = stopping.lookup(&id);
    if (!s)
        return 0;
    struct event e = {};
    e.ts = bpf_ktime_get_ns();
    e.type = EV_CONN_STOP;
    e.code = s->flag;
    e.sent = s->sent;
    e.unsent = s->unsent;
    if (s->oldest_start && s->oldest_start < e.ts)
        e.oldest_ns = e.ts - s->oldest_start;
    conn_ids((struct iscsi_cls_conn *)s->cls_conn, &e);
    stopping.delete(&id);
    submit_event(ctx, &e, sizeof(e));
    return 0;
}

/* iscsi_conn_start(cls_conn): a login (stop_stage 0) or a relogin (3). */
int conn_start(struct pt_regs *ctx, struct iscsi_cls_conn *cls_conn)
{
    struct event e = {};
    e.ts = bpf_ktime_get_ns();
    e.type = EV_CONN_START;
    struct iscsi_conn *conn = NULL;
    bpf_probe_read_kernel(&conn, sizeof(conn), &cls_conn->dd_data);
    if (conn)
        bpf_probe_read_kernel(&e.code, sizeof(e.code), &conn->stop_stage);
    conn_ids(cls_conn, &e);
    submit_event(ctx, &e, sizeof(e));
    return 0;
}

static __always_inline int session_event(struct pt_regs *ctx, struct iscsi_cls_session *s, u32 type)
{
    struct event e = {};
    e.ts = bpf_ktime_get_ns();
    e.type = type;
    bpf_probe_read_kernel(&e.sid, sizeof(e.sid), &s->sid);
    bpf_probe_read_kernel(&e.recovery_tmo, sizeof(e.recovery_tmo), &s->recovery_tmo);
    submit_event(ctx, &e, sizeof(e));
    return 0;
}

/* The work functions: the session is the struct around the work item. */
int session_block(struct pt_regs *ctx, void *work)
{
    return session_event(ctx, (struct iscsi_cls_session *)((char *)work - __builtin_offsetof(struct iscsi_cls_session, block_work)), EV_BLOCK);
}

/* The unblock is sent at the return of __iscsi_unblock_session, when the
 * disks run again: user space counts the I/O errors of the episode then,
 * and requests rejected until scsi_target_unblock are all in. */
BPF_HASH(unblocking, u64, u64, 1024);

int session_unblock(struct pt_regs *ctx, void *work)
{
    u64 id = bpf_get_current_pid_tgid();
    u64 w = (u64)work;
    unblocking.update(&id, &w);
    return 0;
}

int session_unblock_ret(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u64 *w = unblocking.lookup(&id);
    if (!w)
        return 0;
    char *work = (char *)*w;
    unblocking.delete(&id);
    return session_event(ctx, (struct iscsi_cls_session *)(work - __builtin_offsetof(struct iscsi_cls_session, unblock_work)), EV_UNBLOCK);
}

/* recovery_work is a delayed_work: its work_struct is its first member. */
int session_timeout(struct pt_regs *ctx, void *work)
{
    return session_event(ctx, (struct iscsi_cls_session *)((char *)work - __builtin_offsetof(struct iscsi_cls_session, recovery_work)), EV_RECOVERY_TIMEOUT);
}

/* __scsi_queue_insert(cmd, reason, unbusy): the SCSI midlayer puts a
 * command back to be sent again (EH_RETRY: a command recovery flushed). */
int requeue(struct pt_regs *ctx, struct scsi_cmnd *cmd, int reason)
{
    if (reason != SCSI_MLQUEUE_EH_RETRY)
        return 0;
    struct scsi_device *sdev = NULL;
    struct Scsi_Host *shost = NULL;
    bpf_probe_read_kernel(&sdev, sizeof(sdev), &cmd->device);
    if (!sdev)
        return 0;
    bpf_probe_read_kernel(&shost, sizeof(shost), &sdev->host);
    if (!shost)
        return 0;
    struct event e = {};
    e.ts = bpf_ktime_get_ns();
    e.type = EV_REQUEUE;
    bpf_probe_read_kernel(&e.code, sizeof(e.code), &shost->host_no);
    submit_event(ctx, &e, sizeof(e));
    return 0;
}

/* Raw tracepoint block_rq_complete(rq, error, nr_bytes), attached at the
 * first failure; error is an int on 5.10 and a blk_status_t after: either
 * way non-zero is a failure. */
int rq_done(struct bpf_raw_tracepoint_args *ctx)
{
    struct request *rq = (struct request *)ctx->args[0];
    u32 error = (u32)ctx->args[1];
    u32 nr_bytes = (u32)ctx->args[2];
    /* Requests of the block layer's users only, ending: not a passthrough
     * request (the SCSI midlayer's own commands, e.g. iscsid's rescan
     * after a relogin: REQ_OP_DRV_IN/OUT 34/35, on 5.10 also
     * REQ_OP_SCSI_IN/OUT 32/33, in the low 8 bits of cmd_flags), and not
     * the call that completes no bytes of a command SCSI then retries. */
    u32 flags = 0;
    bpf_probe_read_kernel(&flags, sizeof(flags), &rq->cmd_flags);
    u32 op = flags & 0xff;
    if ((op >= 32 && op <= 35) || nr_bytes == 0)
        return 0;
    /* blk_mq_rq_to_pdu: a SCSI request's scsi_cmnd follows it. Another
     * driver keeps something else there: a SCSI request is one whose
     * device's queue is the request's own. */
    struct scsi_cmnd *sc = (struct scsi_cmnd *)((char *)rq + sizeof(struct request));
    struct scsi_device *sdev = NULL;
    struct Scsi_Host *shost = NULL;
    void *q = NULL, *sq = NULL;
    bpf_probe_read_kernel(&sdev, sizeof(sdev), &sc->device);
    if (!sdev)
        return 0;
    bpf_probe_read_kernel(&q, sizeof(q), &rq->q);
    bpf_probe_read_kernel(&sq, sizeof(sq), &sdev->request_queue);
    if (!q || q != sq)
        return 0;
    bpf_probe_read_kernel(&shost, sizeof(shost), &sdev->host);
    if (!shost)
        return 0;
    u32 host = 0;
    bpf_probe_read_kernel(&host, sizeof(host), &shost->host_no);
    struct held_t *h = held.lookup(&host);
    if (!h)
        return 0;      /* not an iSCSI session's host */
    u64 zero = 0;
    if (error) {
        u64 *n = rq_errors.lookup_or_try_init(&host, &zero);
        if (n)
            __sync_fetch_and_add(n, 1);
    }
    u64 start = 0, now = bpf_ktime_get_ns();
    bpf_probe_read_kernel(&start, sizeof(start), &rq->start_time_ns);
    /* 0: the queue keeps no start times (no I/O statistics, no scheduler). */
    if (start == 0 || start >= now || start >= h->until || now < h->from)
        return 0;
    u64 took = now - start;
    u64 *m = held_longest.lookup_or_try_init(&host, &zero);
    if (m && took > *m)
        *m = took;
    return 0;
}
