/* iscsi_stages.c: per-command timing of the iSCSI initiator, shared by
 * isclatency and iscstat. Keyed by the SCSI command (struct scsi_cmnd *),
 * never per connection, so any number of commands in flight are timed.
 *
 *   t_queue  entry of iscsi_queuecommand       the command enters libiscsi
 *   t_prep   entry of iscsi_prep_scsi_cmd_pdu  the xmit worker takes it, CmdSN given
 *   t_sent   return of iscsi_tcp_task_xmit==0  command PDU (+immediate and
 *                                              unsolicited data) handed to TCP
 *   t_rx     entry of iscsi_tcp_hdr_recv_done  the first PDU back for the task
 *            (RX_HDR; else return of           (Data-In, R2T or SCSI Response),
 *            iscsi_itt_to_ctask)               its header received
 *   t_dout   return of iscsi_tcp_task_xmit==0  the last Data-Out handed to TCP
 *            after an R2T
 *   t_done   entry of iscsi_complete_task(COMPLETED) the response completes it
 *
 * With FENTRY the programs are fentry/fexit (src/bpf/fentry.rs loads them
 * against the modules' BTF): fexit sees the arguments and the return value
 * together. Without, kprobes and kretprobes, with the arguments saved per
 * thread at entry for the return probe.
 *
 * WAIT = t_prep - t_queue, SEND = t_sent - t_prep, RESP = t_done - t_sent.
 * Without HAVE_SENT (iscsi_tcp_task_xmit not traceable) SEND is unknown:
 * recorded as 0, shown by every tool as '-', and RESP = t_done - t_prep.
 * A command that ends any other way (abort, session recovery, never sent)
 * is dropped from the map and counted, never timed.
 *
 * RESP = NET + TARGET (HAVE_RX, iscsi_tcp only): NET is what the network
 * takes: one round trip of the connection (net_round_trip below) for each
 * exchange with the target, plus the data transfer the initiator sees
 * (first Data-In to the end for reads; R2T to the last Data-Out handed to
 * TCP for writes); TARGET is the rest:
 *   read / no R2T:  NET = min(rx - sent, RTT) + (done - rx)
 *   write with R2T: NET = min(rx - sent, RTT) + (dout - rx) + min(done - dout, RTT)
 * A command with no PDU back seen, or no socket (not iscsi_tcp), or no
 * round trip known (net_round_trip: then network or target cannot be told
 * apart, counted on its own as well), or whose first PDU back came before
 * its send call returned (a busy xmit worker: the round trip is then inside
 * SEND and cannot be told apart), is not split (counted, shown as '-'). RETX: the socket's
 * total_retrans at completion minus at PDU preparation: TCP segments
 * retransmitted on the command's connection while it was in flight. */
/* The kernel types read here. With BTF_TYPES, src/kernel/types.rs writes
 * just these from the running kernel's BTF (much faster to compile);
 * else the headers below are compiled.
 * @struct Scsi_Host host_no
 * @struct scsi_cmnd device sc_data_direction sdb.length cmnd result
 * @struct scsi_device channel id lun
 * @struct iscsi_task sc conn state hdr
 * @struct iscsi_conn cls_conn session dd_data
 * @struct iscsi_cls_conn cid
 * @struct iscsi_session cls_session age cmds_max cmds
 * @struct iscsi_cls_session sid transport
 * @struct iscsi_transport name
 * @struct iscsi_tcp_conn iscsi_conn dd_data in.hdr in.hdr_buf
 * @struct socket sk
 * @struct tcp_sock total_retrans rtt_min rx_opt.rcv_tsval
 * @struct request bio __sector cmd_flags
 * @struct bio bi_iter.bi_sector
 * @enum DMA_FROM_DEVICE DMA_TO_DEVICE ISCSI_TASK_COMPLETED ISCSI_TASK_PENDING
 */
#if !BTF_TYPES
#include <scsi/scsi_cmnd.h>
#include <scsi/scsi_device.h>
#include <scsi/scsi_host.h>
#include <scsi/libiscsi.h>
#include <scsi/scsi_transport_iscsi.h>
#include <scsi/libiscsi_tcp.h>
#endif

/* Where the members of the connection's socket are (src/kernel/types.rs
 * NET_MEMBERS): on the headers path, byte offsets from vmlinux's BTF where
 * it has them, so no networking headers are compiled (on 5.10 they took
 * the preprocessed text from 54,500 lines to 94,700); else from the types
 * compiled (BTF-written, or the headers). */
#define NET_OFFSETS {{NET_OFFSETS}}
#if NET_OFFSETS
#define SOCKET_SK_OFF {{SOCKET_SK_OFF}}
#define TCP_TOTAL_RETRANS_OFF {{TCP_TOTAL_RETRANS_OFF}}
#define TCP_RTT_MIN_OFF {{TCP_RTT_MIN_OFF}}
#define TCP_RCV_TSVAL_OFF {{TCP_RCV_TSVAL_OFF}}
#else
#if !BTF_TYPES
#include <linux/net.h>
#include <linux/tcp.h>
#endif
#define SOCKET_SK_OFF __builtin_offsetof(struct socket, sk)
#define TCP_TOTAL_RETRANS_OFF __builtin_offsetof(struct tcp_sock, total_retrans)
#define TCP_RTT_MIN_OFF __builtin_offsetof(struct tcp_sock, rtt_min)
#define TCP_RCV_TSVAL_OFF __builtin_offsetof(struct tcp_sock, rx_opt.rcv_tsval)
#endif

#define FILTER_HOST {{FILTER_HOST}}
#define FILTER_DEV {{FILTER_DEV}}
#define FILTER_LUN {{FILTER_LUN}}
#define FILTER_LUN_VALUE {{LUN}}
#define FILTER_CID {{FILTER_CID}}
#define FILTER_CID_VALUE {{CID}}
#define FILTER_PID {{FILTER_PID}}
#define FILTER_PID_VALUE {{PID}}
/* Only I/O issued from a cgroup v2 or below it (the cgroup array's slot 0,
 * filled from user space): told where the issuer is seen (needs ISSUER). */
#define FILTER_CGROUP {{FILTER_CGROUP}}
/* 0: all, 1: reads only, 2: writes only */
#define FILTER_DIR {{FILTER_DIR}}
#define HAVE_SENT {{HAVE_SENT}}
#define HAVE_RX {{HAVE_RX}}
/* The first PDU back seen at iscsi_tcp_hdr_recv_done's entry: once per
 * PDU header (a 4 KiB read's one Data-In carries its status: one run),
 * where iscsi_itt_to_ctask's return runs twice for that Data-In. */
#define RX_HDR {{RX_HDR}}
/* iscsi_requeue_task traced: it runs for each R2T (libiscsi_tcp's
 * iscsi_tcp_r2t_rsp), so a command whose first PDU back was an R2T is one
 * with r2t > 0 (a write's PDUs back are R2Ts, then its response; a read's
 * never are), and the PDU's opcode need not be read. */
#define HAVE_R2T {{HAVE_R2T}}
#define FENTRY {{FENTRY}}
/* Who issued each command and where: the process's name, the SCSI
 * channel and target id. isclatency prints them; iscstat does not, and
 * saves their reads on every command. The CDB's opcode is read for both:
 * it tells the commands the target answers from memory (NO_MEDIA_OP). */
#define WHO {{WHO}}
/* The process that submitted each command's I/O to the block layer
 * (isclatency --issuer), seen at the raw tracepoint block:block_getrq:
 * it runs in the submitting task once per new request, after the bio was
 * split and every merge tried, with the bio that becomes the request's
 * first (rq->bio). Its bio is argument GETRQ_BIO_ARG: 1 before 5.11
 * (q, bio, rw), 0 after (bio). */
#define ISSUER {{ISSUER}}
#define GETRQ_BIO_ARG {{GETRQ_BIO_ARG}}
#if FILTER_CGROUP && !ISSUER
#error "the cgroup filter needs the issuer (ISSUER)"
#endif
/* struct inflight's issuer: what COMM and PID are. */
#define ISSUER_NOT_TRACED 0
#define ISSUER_KNOWN 1
#define ISSUER_UNKNOWN 2
/* A kernel thread submitted the I/O (the writeback flusher, a journal):
 * COMM and PID are the thread, its cgroup the one the kernel charged the
 * bio to (BIO_CGROUP). */
#define ISSUER_KERNEL_THREAD 3

/* A kernel thread writes for others: where BIO_CGROUP, the issuer's cgroup
 * is then the one its bio is charged to, bio->bi_blkg->blkcg->css.cgroup
 * (writeback: the cgroup that dirtied the pages, where the memory and io
 * controllers are on for it; else the root). struct blkcg_gq is private
 * to block/ by 6.1, so the members are read at byte offsets from
 * vmlinux's BTF (src/kernel/types.rs BIO_CGROUP_MEMBERS). The cgroup
 * filter then asks whether that cgroup is the filter's or below it:
 * its ancestor at the filter's level (cgroup->ancestors[], the ids
 * themselves before 6.1: CGROUP_ANCESTOR_IDS) is the filter's cgroup. */
#define BIO_CGROUP {{BIO_CGROUP}}
#if BIO_CGROUP
#define TASK_FLAGS_OFF {{TASK_FLAGS_OFF}}
#define BIO_BLKG_OFF {{BIO_BLKG_OFF}}
#define BLKG_BLKCG_OFF {{BLKG_BLKCG_OFF}}
#define BLKCG_CGROUP_OFF {{BLKCG_CGROUP_OFF}}
#define CGROUP_KN_OFF {{CGROUP_KN_OFF}}
#define KERNFS_ID_OFF {{KERNFS_ID_OFF}}
#define CGROUP_LEVEL_OFF {{CGROUP_LEVEL_OFF}}
#define CGROUP_ANCESTORS_OFF {{CGROUP_ANCESTORS_OFF}}
#define CGROUP_ANCESTOR_IDS {{CGROUP_ANCESTOR_IDS}}
#define FILTER_CGROUP_ID {{FILTER_CGROUP_ID}}
#define FILTER_CGROUP_LEVEL {{FILTER_CGROUP_LEVEL}}
#define PF_KTHREAD_FLAG 0x00200000 /* include/linux/sched.h, 5.10 to 7.3 */
#endif

/* The CDB: `unsigned char *cmnd` before 5.19 (pointing at the command's
 * own buffer), `unsigned char cmnd[32]` after. Chosen from the headers. */
#define CDB_POINTER {{CDB_POINTER}}

#define DIR_OTHER 0
#define DIR_READ 1
#define DIR_WRITE 2

/* iSCSI opcodes of the PDUs that come back for a task (RFC 7143). */
#define ISCSI_OP_SCSI_RSP 0x21
#define ISCSI_OP_DATA_IN 0x25
#define ISCSI_OP_R2T 0x31
/* A NOP-Out whose ITT is not this one asks for a NOP-In back. */
#define ISCSI_OP_NOOP_OUT 0x00
#define ISCSI_ITT_RESERVED 0xffffffff
/* An ITT's index into its session's task table (libiscsi.h ISCSI_ITT_MASK;
 * the session's age is in bits 28-31). */
#define ISCSI_ITT_INDEX_MASK 0x1fff
/* SCSI commands the target answers from memory, without its storage (SPC,
 * SBC): TEST UNIT READY, INQUIRY, MODE SENSE(6), READ CAPACITY(10), MODE
 * SENSE(10), REPORT LUNS. Their exchange is a clean round trip. */
#define NO_MEDIA_OP(op) ((op) == 0x00 || (op) == 0x12 || (op) == 0x1a || \
                         (op) == 0x25 || (op) == 0x5a || (op) == 0xa0)
/* RETX of a command whose connection's socket could not be read. */
#define RETX_UNKNOWN 0xffffffff

struct inflight {
    u64 ts_queue;
    u64 ts_prep;
    u64 ts_sent;
    u64 ts_rx;
    u64 ts_dout;
    u64 sk;
    u64 lun;
    u32 host;
    u32 channel;
    u32 id;
    u32 pid;
    u32 sid;
    u32 cid;
    u32 bytes;
    u32 r2t;
    s64 rev_us;    /* reverse delay of the first PDU back (net_round_trip) */
    u32 rtt_us;
    u32 retrans0;
    u8 dir;
    u8 opcode;
    u8 rx_op;
    u8 net_from;
    u8 issuer;     /* ISSUER_*: what issuer_pid and issuer_comm hold */
    char comm[TASK_COMM_LEN];
#if ISSUER
    u64 issuer_cgroup;
    u32 issuer_pid;
    char issuer_comm[TASK_COMM_LEN];
#endif
};

struct stage_times {
    u64 wait;
    u64 send;
    u64 resp;
    u64 net;
    u64 target;
    u64 total;
    u32 retrans;   /* RETX_UNKNOWN: no socket */
    u32 split;     /* NET and TARGET known: NET_FROM_*, else 0 */
};

/* One entry per command slot (a SCSI host's struct scsi_cmnd, one per
 * request tag: can_queue of them per iSCSI session) that has carried a
 * traced command. An entry stays when its command ends (ts_queue 0) and the
 * next command in the slot reuses it in place: a lookup and stores per
 * command, where an insert and a delete would each take the map's locks.
 * Slots of sessions gone are the least recently used and give way first. */
BPF_TABLE("lru_hash", u64, struct inflight, inflight, 16384);
#if !FENTRY
BPF_HASH(xmit_arg, u64, u64, 4096);
#endif
/* Sets filled from user space: SCSI hosts (sessions), and host<<32|lun. */
BPF_HASH(host_filter, u32, u8, 1024);
BPF_HASH(dev_filter, u64, u8, 1024);

/* The command in flight in slot key, else NULL. */
static __always_inline struct inflight *inflight_live(u64 key)
{
    struct inflight *f = inflight.lookup(&key);
    return f && f->ts_queue ? f : NULL;
}

#if ISSUER
/* A bio that began a request, and who submitted it: the bio's first
 * sector tells a later bio at the same address apart (a request whose
 * first bio never passed block_getrq: a front merge, a passthrough
 * command's mapped buffer, a dm clone). */
struct issuer {
    u64 sector;
    u64 cgroup;    /* the task's cgroup v2 id (BIO_CGROUP: its bio's for a kernel thread) */
    u32 pid;
    u16 in_cgroup; /* FILTER_CGROUP: that cgroup is the filter's or below it */
    u16 kernel_thread;
    char comm[TASK_COMM_LEN];
};
/* Keyed by struct bio *; bios come back at the same addresses, so an entry
 * is rewritten in place more often than inserted. Bios of every block
 * device pass here; the least recently used give way. */
BPF_TABLE("lru_hash", u64, struct issuer, issuer_by_bio, 16384);
#if FILTER_CGROUP
BPF_CGROUP_ARRAY(cgroup_filter, 1);
#endif

#if BIO_CGROUP
static __always_inline u64 read_u64(u64 addr)
{
    u64 v = 0;
    bpf_probe_read_kernel(&v, sizeof(v), (void *)addr);
    return v;
}

/* The struct cgroup * a bio is charged to, 0 where it has no blkg. */
static __always_inline u64 bio_cgroup(u64 bio)
{
    u64 blkg = read_u64(bio + BIO_BLKG_OFF);
    u64 blkcg = blkg ? read_u64(blkg + BLKG_BLKCG_OFF) : 0;
    return blkcg ? read_u64(blkcg + BLKCG_CGROUP_OFF) : 0;
}

static __always_inline u64 cgroup_id_of(u64 cgrp)
{
    u64 kn = read_u64(cgrp + CGROUP_KN_OFF);
    return kn ? read_u64(kn + KERNFS_ID_OFF) : 0;
}

#if FILTER_CGROUP
/* The filter's cgroup is cgrp or one of its ancestors. */
static __always_inline int cgroup_under_filter(u64 cgrp)
{
    int level = -1;
    bpf_probe_read_kernel(&level, sizeof(level), (void *)(cgrp + CGROUP_LEVEL_OFF));
    if (level < FILTER_CGROUP_LEVEL)
        return 0;
    u64 at = read_u64(cgrp + CGROUP_ANCESTORS_OFF + 8 * FILTER_CGROUP_LEVEL);
#if CGROUP_ANCESTOR_IDS
    return at == FILTER_CGROUP_ID;
#else
    return at && cgroup_id_of(at) == FILTER_CGROUP_ID;
#endif
}
#endif
#endif

int issuer_getrq(struct bpf_raw_tracepoint_args *ctx)
{
    u64 bio = ctx->args[GETRQ_BIO_ARG];
    struct issuer v = {};
    bpf_probe_read_kernel(&v.sector, sizeof(v.sector), &((struct bio *)bio)->bi_iter.bi_sector);
    v.pid = bpf_get_current_pid_tgid() >> 32;
    v.cgroup = bpf_get_current_cgroup_id();
#if FILTER_CGROUP
    v.in_cgroup = cgroup_filter.check_current_task(0) == 1;
#endif
#if BIO_CGROUP
    u32 task_flags = 0;
    bpf_probe_read_kernel(&task_flags, sizeof(task_flags), (void *)(bpf_get_current_task() + TASK_FLAGS_OFF));
    if (task_flags & PF_KTHREAD_FLAG) {
        v.kernel_thread = 1;
        u64 cgrp = bio_cgroup(bio);
        if (cgrp) {
            v.cgroup = cgroup_id_of(cgrp);
#if FILTER_CGROUP
            v.in_cgroup = cgroup_under_filter(cgrp);
#endif
        }
    }
#endif
    bpf_get_current_comm(&v.comm, sizeof(v.comm));
    struct issuer *old = issuer_by_bio.lookup(&bio);
    if (old)
        *old = v;
    else
        issuer_by_bio.insert(&bio, &v);
    return 0;
}

/* The command's request (blk_mq_rq_from_pdu: the scsi_cmnd follows it),
 * its first bio and sector: the issuer recorded for that bio at that
 * sector, else unknown (COMM and PID stay the dispatching context).
 * Returns 0 for a command the cgroup filter drops (its issuer not in the
 * cgroup, or not known). A
 * passthrough request (REQ_OP_DRV_IN/OUT 34/35, on 5.10 also
 * REQ_OP_SCSI_IN/OUT 32/33, in the low 8 bits of cmd_flags: the SCSI
 * midlayer's own commands and SG_IO) and a flush (no bio) never passed
 * block_getrq: unknown. */
static __always_inline int issuer_of(struct scsi_cmnd *sc, struct inflight *f)
{
    struct request *rq = (struct request *)((char *)sc - sizeof(struct request));
    u64 bio = 0, sector = 0;
    u32 flags = 0;
    bpf_probe_read_kernel(&flags, sizeof(flags), &rq->cmd_flags);
    bpf_probe_read_kernel(&bio, sizeof(bio), &rq->bio);
    bpf_probe_read_kernel(&sector, sizeof(sector), &rq->__sector);
    if ((flags & 0xff) >= 32)
        bio = 0;
    struct issuer *v = bio ? issuer_by_bio.lookup(&bio) : NULL;
    if (!v || v->sector != sector) {
        f->issuer = ISSUER_UNKNOWN;
        return !FILTER_CGROUP;
    }
    if (FILTER_CGROUP && !v->in_cgroup)
        return 0;
    f->issuer = v->kernel_thread ? ISSUER_KERNEL_THREAD : ISSUER_KNOWN;
    f->issuer_pid = v->pid;
    f->issuer_cgroup = v->cgroup;
    __builtin_memcpy(&f->issuer_comm, v->comm, sizeof(f->issuer_comm));
    return 1;
}
#endif

/* Defined by the tool's template: what to do with a timed command. */
static __always_inline void on_command_done(void *ctx,
        struct inflight *f, struct stage_times *t, int result);

static __always_inline int stage_queuecommand(struct Scsi_Host *shost,
                                              struct scsi_cmnd *sc)
{
    struct inflight f = {};
    struct scsi_device *sdev = sc->device;
    u64 key = (u64)sc;
    int ddir = sc->sc_data_direction;

    f.host = shost->host_no;
    f.lun = sdev->lun;
    f.dir = ddir == DMA_FROM_DEVICE ? DIR_READ : (ddir == DMA_TO_DEVICE ? DIR_WRITE : DIR_OTHER);
#if WHO || FILTER_PID
    f.pid = bpf_get_current_pid_tgid() >> 32;
#endif

    if (FILTER_HOST && !host_filter.lookup(&f.host))
        return 0;
    if (FILTER_LUN && f.lun != FILTER_LUN_VALUE)
        return 0;
    if (FILTER_DEV) {
        u64 dev = ((u64)f.host << 32) | (u32)f.lun;
        if (!dev_filter.lookup(&dev))
            return 0;
    }
    if (FILTER_DIR == 1 && f.dir != DIR_READ)
        return 0;
    if (FILTER_DIR == 2 && f.dir != DIR_WRITE)
        return 0;
    if (FILTER_PID && f.pid != FILTER_PID_VALUE)
        return 0;

    f.bytes = sc->sdb.length;
#if CDB_POINTER
    unsigned char *cdb = NULL;
    bpf_probe_read_kernel(&cdb, sizeof(cdb), &sc->cmnd);
    if (cdb)
        bpf_probe_read_kernel(&f.opcode, sizeof(f.opcode), cdb);
#else
    bpf_probe_read_kernel(&f.opcode, sizeof(f.opcode), &sc->cmnd[0]);
#endif
#if WHO
    f.channel = sdev->channel;
    f.id = sdev->id;
    bpf_get_current_comm(&f.comm, sizeof(f.comm));
#endif
#if ISSUER
    if (!issuer_of(sc, &f))
        return 0;
#endif
    f.ts_queue = bpf_ktime_get_ns();
    struct inflight *old = inflight.lookup(&key);
    if (!old) {
        if (inflight.insert(&key, &f) != 0)
            count(CTR_INFLIGHT_FULL);
        return 0;
    }
    if (old->ts_queue) {
        /* A command in flight in this slot already. Not prepared: its last
         * dispatch never got a task (iscsi_queuecommand refused it as busy,
         * or failed it at once, e.g. while the session was down) and the
         * midlayer dispatches it again: no program runs on the return of
         * iscsi_queuecommand, so that dispatch is seen ending here.
         * Prepared: the end of the command before was never seen (the
         * kernel skipped a program). Counted, then replaced. */
        count(old->ts_prep == 0 ? CTR_DISPATCH_BUSY : CTR_END_NOT_SEEN);
    }
    *old = f;
    return 0;
}

/* The TCP socket behind an iscsi_tcp connection, else 0: conn->dd_data is
 * the iscsi_tcp_conn, whose dd_data is the iscsi_sw_tcp_conn (not in the
 * public headers), whose first member is `struct socket *sock` on every
 * kernel from 5.10 to 7.3 (drivers/scsi/iscsi_tcp.h). Other transports
 * (cxgbi, bnx2i, qedi) keep something else there: checked by name. */
static __always_inline u64 conn_sock(struct iscsi_conn *conn, struct iscsi_cls_session *cls)
{
    /* Explicit reads: also called with pointers read from memory, whose
     * member reads bcc does not turn into probe reads. */
    char name[4] = {};
    struct iscsi_transport *tr = NULL;
    const char *n = NULL;
    bpf_probe_read_kernel(&tr, sizeof(tr), &cls->transport);
    if (tr)
        bpf_probe_read_kernel(&n, sizeof(n), &tr->name);
    if (n)
        bpf_probe_read_kernel(&name, sizeof(name), n);
    if (name[0] != 't' || name[1] != 'c' || name[2] != 'p' || name[3] != 0)
        return 0;
    struct iscsi_tcp_conn *tc = NULL;
    void *sw = NULL;
    void *sock = NULL, *sk = NULL;   /* struct socket *, struct sock * */
    bpf_probe_read_kernel(&tc, sizeof(tc), &conn->dd_data);
    if (tc)
        bpf_probe_read_kernel(&sw, sizeof(sw), &tc->dd_data);
    if (sw)
        bpf_probe_read_kernel(&sock, sizeof(sock), sw);
    if (!sock)
        return 0;      /* released: the connection is going down */
    bpf_probe_read_kernel(&sk, sizeof(sk), (char *)sock + SOCKET_SK_OFF);
    return (u64)sk;
}

/* The socket's own count of retransmitted segments (what ss -ti shows). */
static __always_inline u32 sock_retrans(u64 sk)
{
    u32 r = 0;
    bpf_probe_read_kernel(&r, sizeof(r), (char *)sk + TCP_TOTAL_RETRANS_OFF);
    return r;
}

/* The connection's round trip now, for NET. TCP's own minimum RTT
 * (tcp_min_rtt) cannot be used alone: it keeps its floor for at least its
 * window (300 s) after the network slows, and skips every sample of a lone
 * command PDU's ACK (flagged maybe-delayed) without ageing, so it may
 * never rise. TCP's smoothed RTT cannot either: the target delays its ACK
 * of a command and sends it with the response, so most samples carry the
 * target's service time. What is used instead, per TCP socket:
 *
 * - The reverse delay of the first PDU back for each command: r = its
 *   arrival - the target's TCP timestamp (TSval) in it. The target stamps
 *   TSval when TCP sends the segment, after its service time, so r changes
 *   exactly as the target -> initiator delay changes, whatever the target
 *   does; its absolute value holds an unknown clock offset, so only its
 *   changes are used. TSval ticks in ms (in us with the tcp_usec_ts route
 *   feature on the target, Linux 6.7+): the rate is measured over the first
 *   TSVAL_RATE_NS. Its minimum over a window removes the ms truncation when the
 *   answers leave at random phases of the tick; changes under NET_GAP_US
 *   and a tick are not followed.
 * - Clean round trips: a write's command PDU to its first R2T, which the
 *   target sends before touching storage, and a command the target answers
 *   from memory (NO_MEDIA_OP: TEST UNIT READY, INQUIRY, MODE SENSE, READ
 *   CAPACITY, REPORT LUNS; multipathd's path checker, udev and smartd send
 *   them), its PDU to its first PDU back (NET_FROM_ROUND_TRIP); and a
 *   NOP-Out ping to its NOP-In (libiscsi pings a connection that has
 *   received nothing for noop_out_interval, 5 s by default; the target
 *   answers from its receive path), so an idle connection has one.
 * - Bounds: every command's own first exchange (its first PDU back minus
 *   its send) is at least the round trip, and TCP's minimum RTT at most
 *   (unless the network got faster without TCP taking a sample). Where the
 *   least exchange seen in the last NET_RECENT_NS lies within NET_GAP_US of
 *   TCP's minimum, the round trip is known that closely; where the gap is
 *   wider (a network already slow when the tool started: TCP's minimum
 *   holds its floor from before for its 300 s window), the target's time
 *   and the network's cannot be told apart, and the command is not split.
 *
 * Minima are kept in two bins of NET_BIN_NS (the window: the last 4 to 8
 * s), and the least reverse delay and exchange also in a recent window
 * (two bins of NET_RECENT_NS / 2), which shows a rise of the network's
 * delay within NET_RECENT_NS where the bins' minima hold the old floor
 * until they age out: a recent least reverse delay more than NET_GAP_US
 * and a tick above the one the round trip counts from is followed from
 * there. The round trip is the minimum clean round trip in the window; else,
 * assuming the path is symmetric (a change of the reverse delay is matched
 * in the forward one), the anchor plus twice the change of the reverse
 * delay since (NET_FROM_REVERSE), raised to TCP's minimum RTT if below it
 * by less than its own error; else TCP's minimum RTT where the bounds hold
 * it (no anchor yet, no TSval yet, the target sends none, or the anchor's
 * reverse delay came late: NET_FROM_TCP_MIN); else none. The anchor is the last bin's minimum clean
 * round trip and the minimum reverse delay of the same clean exchanges (so
 * a change within the bin moves both alike); for clean round trips taken
 * before the TSval rate was known (a new connection's scan), the least
 * reverse delay of the first bin that has one, over that whole bin
 * (NET_PENDING_NS); or, in a bin without clean round trips and while no
 * clean one has anchored it, TCP's minimum RTT
 * where the bin's least exchange holds it (NET_GAP_US), with the minimum
 * reverse delay of the same exchanges: an exchange from before a change
 * and a reverse delay from after it are never paired. */
#define NET_FROM_ROUND_TRIP 1
#define NET_FROM_REVERSE 2
#define NET_FROM_TCP_MIN 3
#define NET_BIN_NS 4000000000ULL
/* The bounds: how close (us) the least exchange must come to TCP's
 * minimum RTT, and how long (ns) an exchange counts as recent. */
#define NET_GAP_US 1000
/* A clean round trip shorter than TCP's minimum RTT by more than this (us)
 * is not one: its send call returned late (the sender preempted after it
 * handed the PDU to TCP), so the exchange counts from too late. TCP took
 * its minimum from the same exchange's ACK at the latest, so a faster
 * network lowers it first. */
#define NET_SEND_LAG_US 200
#define NET_RECENT_NS 500000000ULL
/* The TSval rate is measured over at least this long (ns); clean round
 * trips seen before it is known anchor the estimate with the reverse
 * delays of the first exchanges after, if those come within
 * NET_PENDING_NS. */
#define TSVAL_RATE_NS 100000000ULL
#define NET_PENDING_NS 30000000000ULL
#define R_NONE 0x7fffffffffffffffLL
/* A TSval that moved more than this away from the clock is a new
 * connection on a reused socket address: its state starts again. */
#define TSVAL_JUMP_US 5000000LL

struct net_est {
    u64 bin_start;     /* ns */
    s64 r_cur;         /* min reverse delay in the bin, us (R_NONE: none) */
    s64 r_prev;        /* in the bin before */
    s64 rt_r_cur;      /* min reverse delay of the bin's clean round trips */
    s64 anchor_r;      /* the reverse delay anchor_rtt goes with */
    u64 t_first;       /* when ext_first was seen (TSval rate), ns */
    u64 t_last;        /* the latest sample, ns */
    u64 ext_first;     /* TSval, unwrapped, at t_first */
    u64 ext_last;      /* the highest TSval seen, unwrapped */
    u32 ts_last;       /* its raw value */
    u32 unit_us;       /* us per TSval tick: 1000 or 1; 0: rate not known */
    u32 rt_cur;        /* min clean round trip in the bin, us (0: none) */
    u32 rt_prev;
    u32 anchor_rtt;    /* us; 0: none yet */
    u32 anchor_clean;  /* anchor_rtt is a clean round trip */
    u32 anchor_track;  /* anchor_r follows the bin's least reverse delay until it ends */
    u32 ub_cur;        /* least exchange of the bin's samples with r, us (0: none) */
    s64 ub_r_cur;      /* least reverse delay of the same samples */
    s64 rt_r_prev;     /* rt_r_cur of the bin before */
    /* The recent window: two bins of NET_RECENT_NS / 2. */
    u64 rec_start;     /* ns */
    s64 rec_r_cur;     /* least reverse delay (R_NONE: none) */
    s64 rec_r_prev;
    u32 rec_ub_cur;    /* least exchange, us (0: none) */
    u32 rec_ub_prev;
    u32 pend_rt;       /* least clean round trip before the TSval rate, us (0: none) */
    u64 pend_t;        /* when, ns */
    u32 ping_rt;       /* a ping's round trip before the TSval rate, us (0: none) */
    u64 ping_t;        /* its NOP-In's arrival, ns */
    u64 ping_ext;      /* and TSval, unwrapped */
};

BPF_TABLE("lru_hash", u64, struct net_est, net_est, 4096);

static __always_inline void net_restart(struct net_est *e, u64 now, u32 tsval)
{
    e->bin_start = now;
    e->r_cur = R_NONE;
    e->r_prev = R_NONE;
    e->rt_r_cur = R_NONE;
    e->anchor_r = R_NONE;
    e->t_first = now;
    e->t_last = now;
    e->ext_first = tsval;
    e->ext_last = tsval;
    e->ts_last = tsval;
    e->unit_us = 0;
    e->rt_cur = 0;
    e->rt_prev = 0;
    e->anchor_rtt = 0;
    e->anchor_clean = 0;
    e->anchor_track = 0;
    e->ub_cur = 0;
    e->ub_r_cur = R_NONE;
    e->rt_r_prev = R_NONE;
    e->rec_start = now;
    e->rec_r_cur = R_NONE;
    e->rec_r_prev = R_NONE;
    e->rec_ub_cur = 0;
    e->rec_ub_prev = 0;
    e->pend_rt = 0;
    e->pend_t = now;
    e->ping_rt = 0;
}

/* TCP's minimum RTT (us) if an exchange of ub us bounds it within
 * NET_GAP_US, else 0. */
static __always_inline u32 net_bounded(u32 tcp_min, u32 ub)
{
    if (!tcp_min || !ub)
        return 0;
    s64 gap = (s64)ub - (s64)tcp_min;
    return gap <= NET_GAP_US && gap >= -NET_GAP_US ? tcp_min : 0;
}

/* Take a command's own exchange (us, 0: none) into the recent window, and
 * return TCP's minimum RTT if the window's least exchange holds it, else 0. */
static __always_inline u32 net_floor(struct net_est *e, u64 now, u32 first_us, u32 tcp_min)
{
    u64 age = now - e->rec_start;
    if (age >= NET_RECENT_NS / 2) {
        e->rec_ub_prev = age < NET_RECENT_NS ? e->rec_ub_cur : 0;
        e->rec_r_prev = age < NET_RECENT_NS ? e->rec_r_cur : R_NONE;
        e->rec_ub_cur = 0;
        e->rec_r_cur = R_NONE;
        e->rec_start = now;
    }
    if (first_us && (!e->rec_ub_cur || first_us < e->rec_ub_cur))
        e->rec_ub_cur = first_us;
    u32 ub = e->rec_ub_cur;
    if (e->rec_ub_prev && (!ub || e->rec_ub_prev < ub))
        ub = e->rec_ub_prev;
    return net_bounded(tcp_min, ub);
}

/* Start a new bin once the current one is NET_BIN_NS old, anchoring the
 * estimate on the one that ends (tcp_min: TCP's minimum RTT, 0: none). */
static __always_inline void net_roll(struct net_est *e, u64 now, u32 tcp_min)
{
    if (now - e->bin_start < NET_BIN_NS)
        return;
    e->anchor_track = 0;
    if (e->rt_cur && e->rt_r_cur != R_NONE) {
        e->anchor_rtt = e->rt_cur;
        e->anchor_r = e->rt_r_cur;
        e->anchor_clean = 1;
    } else if (e->ub_r_cur != R_NONE && !e->anchor_clean && net_bounded(tcp_min, e->ub_cur)) {
        e->anchor_rtt = tcp_min;
        e->anchor_r = e->ub_r_cur;
    }
    if (now - e->bin_start < 2 * NET_BIN_NS) {
        e->r_prev = e->r_cur;
        e->rt_prev = e->rt_cur;
        e->rt_r_prev = e->rt_r_cur;
    } else {
        e->r_prev = R_NONE;
        e->rt_prev = 0;
        e->rt_r_prev = R_NONE;
    }
    e->r_cur = R_NONE;
    e->rt_r_cur = R_NONE;
    e->rt_cur = 0;
    e->ub_cur = 0;
    e->ub_r_cur = R_NONE;
    e->bin_start = now;
}

/* TCP's minimum RTT, us (0: no sample yet). rtt_min is a struct minmax
 * { struct minmax_sample { u32 t, v; } s[3]; }: s[0].v, at +4, is
 * tcp_min_rtt() (include/net/tcp.h); ~0 before any sample. */
static __always_inline u32 tcp_min_rtt_us(u64 sk)
{
    u32 rtt = 0;
    bpf_probe_read_kernel(&rtt, sizeof(rtt), (char *)sk + TCP_RTT_MIN_OFF + 4);
    return rtt == 0xffffffff ? 0 : rtt;
}

/* At the first PDU back for a command (now: its arrival, ns; first_us:
 * its exchange, arrival minus send, us, 0: not known): take the segment's
 * TSval, which TCP parsed just before it called the socket's data_ready
 * (iscsi_tcp reads PDUs from there), and return the round trip (us, 0:
 * unknown) and what it came from; *rev: the reverse delay (us, R_NONE:
 * unknown). */
static __always_inline u32 net_round_trip(u64 sk, u64 now, u32 first_us, u8 *from, s64 *rev)
{
    *rev = R_NONE;
    u32 tsval = 0;
    u32 tcp_min = tcp_min_rtt_us(sk);
    bpf_probe_read_kernel(&tsval, sizeof(tsval), (char *)sk + TCP_RCV_TSVAL_OFF);
    *from = NET_FROM_TCP_MIN;
    struct net_est *e = net_est.lookup(&sk);
    if (!e) {
        struct net_est n = {};
        net_restart(&n, now, tsval);
        u32 v = net_floor(&n, now, first_us, tcp_min);
        net_est.update(&sk, &n);
        return v;
    }
    s32 d = (s32)(tsval - e->ts_last);
    s64 elapsed_us = (s64)((now - e->t_last) / 1000);
    if (e->unit_us) {
        s64 ticked_us = (s64)d * e->unit_us;
        if (ticked_us - elapsed_us > TSVAL_JUMP_US || elapsed_us - ticked_us > TSVAL_JUMP_US) {
            net_restart(e, now, tsval);
            return net_floor(e, now, first_us, tcp_min);
        }
    }
    u64 ext = e->ext_last + (s64)d;
    if (d > 0) {
        e->ext_last = ext;
        e->ts_last = tsval;
    }
    e->t_last = now;
    u32 floor = net_floor(e, now, first_us, tcp_min);
    if (!e->unit_us) {
        u64 dt = now - e->t_first;
        if (dt < TSVAL_RATE_NS)
            return floor;
        if (dt > 100000000000ULL) {    /* idle since: measure from here */
            e->t_first = now;
            e->ext_first = ext;
            return floor;
        }
        /* ticks per second: 500..2000 is ms, 500k..2M is us; else (no
         * timestamps, a stalled clock) measure again from here */
        u64 ticks = (ext - e->ext_first) * 1000000000ULL;
        if (ext > e->ext_first && ticks >= 500 * dt && ticks <= 2000 * dt) {
            e->unit_us = 1000;
        } else if (ext > e->ext_first && ticks >= 500000 * dt && ticks <= 2000000 * dt) {
            e->unit_us = 1;
        } else {
            e->t_first = now;
            e->ext_first = ext;
            return floor;
        }
    }
    s64 r = (s64)(now / 1000) - (s64)(ext * e->unit_us);
    *rev = r;
    net_roll(e, now, tcp_min);
    if (r < e->r_cur)
        e->r_cur = r;
    if (e->anchor_track && r < e->anchor_r)
        e->anchor_r = r;
    if (r < e->rec_r_cur)
        e->rec_r_cur = r;
    /* ub_cur and ub_r_cur over the same exchanges: the anchor pairs them. */
    if (first_us) {
        if (!e->ub_cur || first_us < e->ub_cur)
            e->ub_cur = first_us;
        if (r < e->ub_r_cur)
            e->ub_r_cur = r;
    }
    /* Clean round trips seen before the TSval rate was known (a new
     * connection's scan: INQUIRY, READ CAPACITY, ...) have no reverse
     * delay of their own: the least reverse delay of the bin they anchor,
     * followed until it ends (its first samples may have come late), is
     * theirs. */
    if (e->pend_rt) {
        if (!e->anchor_clean && now - e->pend_t < NET_PENDING_NS && e->r_cur != R_NONE) {
            e->anchor_rtt = e->pend_rt;
            e->anchor_r = e->r_cur;
            e->anchor_clean = 1;
            e->anchor_track = 1;
        }
        e->pend_rt = 0;
    }
    /* A ping answered before the TSval rate was known (the first the tool
     * sees on an idle connection) kept its own TSval: with the rate, its
     * reverse delay, so it anchors the estimate with its own pair. */
    if (e->ping_rt) {
        if (!e->anchor_clean && now - e->ping_t < NET_PENDING_NS) {
            e->anchor_rtt = e->ping_rt;
            e->anchor_r = (s64)(e->ping_t / 1000) - (s64)(e->ping_ext * e->unit_us);
            e->anchor_clean = 1;
            e->anchor_track = 0;
        }
        e->ping_rt = 0;
    }
    s64 rmin = e->r_cur < e->r_prev ? e->r_cur : e->r_prev;
    /* The bins' minima show a rise only once they age out (up to 2 x
     * NET_BIN_NS); the recent window's within NET_RECENT_NS. A recent
     * least reverse delay above the bins' by more than NET_GAP_US and a
     * tick is a rise of the network's delay: it is followed from there. */
    s64 recent = e->rec_r_cur < e->rec_r_prev ? e->rec_r_cur : e->rec_r_prev;
    s64 rise = (s64)NET_GAP_US + (s64)e->unit_us;
    u32 rt = e->rt_cur;
    s64 rt_r = e->rt_r_cur;
    if (e->rt_prev && (!rt || e->rt_prev < rt)) {
        rt = e->rt_prev;
        rt_r = e->rt_r_prev;
    }
    if (rt) {
        if (recent == R_NONE || rt_r == R_NONE || recent - rt_r <= rise) {
            *from = NET_FROM_ROUND_TRIP;
            return rt;
        }
        s64 v = (s64)rt + 2 * (recent - rt_r);
        *from = NET_FROM_REVERSE;
        return v > 0 && v < 0xffffffffLL ? (u32)v : 0;
    }
    if (!e->anchor_rtt)
        return floor;
    if (recent != R_NONE && recent - rmin > rise)
        rmin = recent;
    s64 dr = rmin - e->anchor_r;
    /* A change within NET_GAP_US and a tick is not followed, as for a clean
     * round trip above: answers that leave on a fixed phase of the tick (a
     * target completing from a timer) keep the same truncation in every
     * sample, and minima do not remove it; and an anchor taken from one
     * exchange (a ping: one every noop_out_interval, and none once traffic
     * flows) holds its own truncation, up to a tick, and the initiator's lag
     * in taking it (1.5 ms seen under emulation), which the following reads'
     * minimum does not. */
    if (dr <= rise && dr >= -rise)
        dr = 0;
    s64 v = (s64)e->anchor_rtt + 2 * dr;
    /* TCP's minimum RTT is a lower bound (TCP takes a faster network's RTT
     * at once). Below it by no more than the estimate's own error (a tick
     * of the reverse delay each way, a send call's lag), the round trip is
     * TCP's minimum; further below, the anchor's reverse delay came late
     * (a loaded host) or from before a change: the bounds decide. */
    if (v < (s64)tcp_min) {
        if (v < (s64)tcp_min - 2 * (s64)e->unit_us - NET_SEND_LAG_US)
            return floor;
        v = tcp_min;
    }
    *from = NET_FROM_REVERSE;
    return v > 0 && v < 0xffffffffLL ? (u32)v : 0;
}

/* A clean round trip (us) on socket sk at now (ns), whose answer came
 * with reverse delay rev (us, R_NONE: unknown). */
static __always_inline void net_clean_round_trip(u64 sk, u64 now, u64 rt_us, s64 rev)
{
    struct net_est *e = net_est.lookup(&sk);
    if (!e || rt_us == 0 || rt_us >= 0xffffffffULL)
        return;
    if (rt_us + NET_SEND_LAG_US < tcp_min_rtt_us(sk))
        return;
    net_roll(e, now, 0);
    if (!e->rt_cur || rt_us < e->rt_cur)
        e->rt_cur = rt_us;
    if (rev < e->rt_r_cur)
        e->rt_r_cur = rev;
    if (rev == R_NONE && (!e->pend_rt || rt_us < e->pend_rt)) {
        e->pend_rt = rt_us;
        e->pend_t = now;
    }
}

/* A command's first PDU back was an R2T, or it is one the target answers
 * from memory: its round trip from the command PDU handed to TCP is a
 * clean one (the target sent it before storage). */
static __always_inline void stage_clean_round_trip(struct inflight *f)
{
    if (f->sk && f->ts_sent && f->ts_rx > f->ts_sent)
        net_clean_round_trip(f->sk, f->ts_rx, (f->ts_rx - f->ts_sent) / 1000, f->rev_us);
}

/* NOP-Out pings handed to TCP, by task: when, and the connection's socket. */
struct ping {
    u64 ts_sent;
    u64 sk;
};
BPF_TABLE("lru_hash", u64, struct ping, pings, 256);

/* The socket of a task without a SCSI command if it is a NOP-Out ping (one
 * the target answers with a NOP-In), else 0. The PDU header is read as
 * RFC 7143 lays it out: the opcode in byte 0 (with the immediate bit),
 * the ITT in bytes 16-19. */
static __always_inline u64 ping_sock(struct iscsi_task *task)
{
    void *hdr = NULL;
    u8 op = 0xff;
    u32 itt = ISCSI_ITT_RESERVED;
    bpf_probe_read_kernel(&hdr, sizeof(hdr), &task->hdr);
    if (!hdr)
        return 0;
    bpf_probe_read_kernel(&op, sizeof(op), hdr);
    bpf_probe_read_kernel(&itt, sizeof(itt), (char *)hdr + 16);
    if ((op & 0x3f) != ISCSI_OP_NOOP_OUT || itt == ISCSI_ITT_RESERVED)
        return 0;
    struct iscsi_conn *conn = NULL;
    struct iscsi_session *session = NULL;
    struct iscsi_cls_session *cls = NULL;
    bpf_probe_read_kernel(&conn, sizeof(conn), &task->conn);
    if (conn)
        bpf_probe_read_kernel(&session, sizeof(session), &conn->session);
    if (session)
        bpf_probe_read_kernel(&cls, sizeof(cls), &session->cls_session);
    return cls ? conn_sock(conn, cls) : 0;
}

/* A task without a SCSI command handed to TCP (ret 0 from the send call),
 * sk: its socket if it is a ping, else 0. A ping whose NOP-In completed it
 * before its send call returned leaves an entry behind: one of another
 * kind of task on the same memory removes it. */
static __always_inline void stage_ping_sent(u64 task, u64 sk, int ret)
{
    if (!sk) {
        pings.delete(&task);
        return;
    }
    if (ret != 0)
        return;
    struct ping p = {.ts_sent = bpf_ktime_get_ns(), .sk = sk};
    pings.update(&task, &p);
}

/* A task without a SCSI command completes: for a ping answered, its
 * exchange is a clean round trip, whose NOP-In brought its reverse delay.
 * Always paired with that reverse delay: the first ping the tool sees on a
 * connection comes before the TSval rate is known, and the next sample may
 * come after a change of the network (pings come every noop_out_interval),
 * so such a ping keeps its TSval until the rate is known (net_round_trip),
 * never a reverse delay from another exchange.
 * Taken where the estimate has no clean round trip behind it, or where it
 * is below every clean round trip the estimate holds by more than
 * NET_GAP_US (the network got faster); else left: its reverse delay, taken
 * on an idle connection, is the least the receive path ever adds, and
 * against it the reverse delays of a loaded receive path that follows
 * (answers waiting to be read) would look like a rise of the network
 * (iodepth 32 under a 10.3 ms round trip: NET's mean 13.1-13.5 ms). The
 * test is on the clean round trips themselves, not on the estimate, so that
 * two tools that see the same exchanges take the same pings. */
static __always_inline void stage_ping_answered(u64 task, int state)
{
    struct ping *p = pings.lookup(&task);
    if (!p)
        return;
    u64 sent = p->ts_sent, sk = p->sk;
    pings.delete(&task);
    u64 now = bpf_ktime_get_ns();
    if (state != ISCSI_TASK_COMPLETED || now <= sent || now - sent >= 0xffffffffULL * 1000)
        return;
    u32 rt_us = (now - sent) / 1000;
    u8 from = 0;
    s64 rev = R_NONE;
    net_round_trip(sk, now, rt_us, &from, &rev);
    struct net_est *e = net_est.lookup(&sk);
    if (!e)
        return;
    if (rev != R_NONE) {
        u32 least = e->anchor_clean ? e->anchor_rtt : 0;
        if (e->rt_cur && (!least || e->rt_cur < least))
            least = e->rt_cur;
        if (e->rt_prev && (!least || e->rt_prev < least))
            least = e->rt_prev;
        if (!least || rt_us + NET_GAP_US < least)
            net_clean_round_trip(sk, now, rt_us, rev);
        return;
    }
    /* The rate not known yet: the NOP-In's TSval is the highest the
     * estimate has seen (it came after every earlier segment). */
    if (!e->unit_us && !e->anchor_clean && rt_us + NET_SEND_LAG_US >= tcp_min_rtt_us(sk)) {
        e->ping_rt = rt_us;
        e->ping_t = now;
        e->ping_ext = e->ext_last;
    }
}

static __always_inline int stage_prep(struct iscsi_task *task)
{
    u64 key = (u64)task->sc;
    if (!key)
        return 0;
    struct inflight *f = inflight_live(key);
    if (!f)
        return 0;
    u32 cid = task->conn->cls_conn->cid;
    if (FILTER_CID && cid != FILTER_CID_VALUE) {
        f->ts_queue = 0;
        return 0;
    }
    f->cid = cid;
    struct iscsi_cls_session *cls = task->conn->session->cls_session;
    f->sid = cls->sid;
    f->sk = conn_sock(task->conn, cls);
    f->retrans0 = f->sk ? sock_retrans(f->sk) : 0;
    f->ts_prep = bpf_ktime_get_ns();
    return 0;
}

static __always_inline int stage_xmit_done(u64 key, int ret)
{
    if (ret != 0)
        return 0;      /* not all sent yet (e.g. socket full): retried later */
    struct inflight *f = inflight_live(key);
    if (!f || f->ts_prep == 0)
        return 0;
    if (f->ts_sent == 0)
        f->ts_sent = bpf_ktime_get_ns();
    else if (f->ts_rx)
        f->ts_dout = bpf_ktime_get_ns();   /* Data-Out answering an R2T */
    return 0;
}

/* The command (key) when no PDU has come back for it yet, else NULL:
 * later PDUs of the same command are ignored. */
static __always_inline struct inflight *stage_rx_pending(u64 key)
{
    struct inflight *f = inflight_live(key);
    if (!f || f->ts_prep == 0 || f->ts_rx || f->sk == 0)
        return NULL;
    return f;
}

/* The first PDU back for a command: its time, its opcode (0 where not
 * read), and the connection's floor RTT at that moment. */
static __always_inline int stage_rx_first(struct inflight *f, u8 op)
{
    f->ts_rx = bpf_ktime_get_ns();
    f->rx_op = op;
    /* The exchange: from the send (PDU preparation without HAVE_SENT). */
    u64 sent = HAVE_SENT ? f->ts_sent : f->ts_prep;
    u32 first_us = 0;
    if (sent && f->ts_rx > sent && f->ts_rx - sent < 0xffffffffULL * 1000)
        first_us = (f->ts_rx - sent) / 1000;
    f->rtt_us = net_round_trip(f->sk, f->ts_rx, first_us, &f->net_from, &f->rev_us);
#if !HAVE_R2T
    if (f->rx_op == ISCSI_OP_R2T)
        stage_clean_round_trip(f);
#endif
    if (NO_MEDIA_OP(f->opcode))
        stage_clean_round_trip(f);
    return 0;
}

#if RX_HDR
/* A session's age, the size of its task table and the table, read at once
 * where they lie within 32 bytes from age on (every kernel from 5.10 to
 * 7.3), one member at a time elsewhere. */
#define SESSION_AT(m) (__builtin_offsetof(struct iscsi_session, m) - \
                       __builtin_offsetof(struct iscsi_session, age))
#define SESSION_TT_SPAN (__builtin_offsetof(struct iscsi_session, age) < \
                         __builtin_offsetof(struct iscsi_session, cmds_max) && \
                         __builtin_offsetof(struct iscsi_session, cmds_max) < \
                         __builtin_offsetof(struct iscsi_session, cmds) ? \
                         SESSION_AT(cmds) + sizeof(void *) : 1000)

/* A PDU's header, received whole (tc->in.hdr_buf), before libiscsi_tcp
 * dissects it: the command it is for is found from its ITT as
 * iscsi_verify_itt and iscsi_itt_to_task find it (the session's age in
 * the top bits, the index into the session's task table in the low ones;
 * iscsi_tcp builds ITTs so, in host byte order). Only a Data-In, an R2T or
 * a SCSI Response is for a command; any other PDU returns at its opcode. */
static __always_inline int stage_rx_hdr(struct iscsi_tcp_conn *tc)
{
    u8 bhs[20] = {};
    bpf_probe_read_kernel(bhs, sizeof(bhs), &tc->in.hdr_buf);
    u8 op = bhs[0] & 0x3f;
    if (op != ISCSI_OP_DATA_IN && op != ISCSI_OP_R2T && op != ISCSI_OP_SCSI_RSP)
        return 0;
    u32 itt;
    __builtin_memcpy(&itt, &bhs[16], sizeof(itt));   /* as the kernel stored it */
    if (itt == ISCSI_ITT_RESERVED)
        return 0;
    struct iscsi_conn *conn = NULL;
    struct iscsi_session *session = NULL;
    bpf_probe_read_kernel(&conn, sizeof(conn), &tc->iscsi_conn);
    if (!conn)
        return 0;
    bpf_probe_read_kernel(&session, sizeof(session), &conn->session);
    if (!session)
        return 0;
    int age = 0, cmds_max = 0;
    void *cmds = NULL;
    if (SESSION_TT_SPAN <= sizeof(u64) * 4) {
        /* the three members in one read: they lie together */
        u64 tt[4] = {};
        bpf_probe_read_kernel(tt, SESSION_TT_SPAN, &session->age);
        __builtin_memcpy(&age, (u8 *)tt + SESSION_AT(age), sizeof(age));
        __builtin_memcpy(&cmds_max, (u8 *)tt + SESSION_AT(cmds_max), sizeof(cmds_max));
        __builtin_memcpy(&cmds, (u8 *)tt + SESSION_AT(cmds), sizeof(cmds));
    } else {
        bpf_probe_read_kernel(&age, sizeof(age), &session->age);
        bpf_probe_read_kernel(&cmds_max, sizeof(cmds_max), &session->cmds_max);
        bpf_probe_read_kernel(&cmds, sizeof(cmds), &session->cmds);
    }
    u32 i = itt & ISCSI_ITT_INDEX_MASK;
    if ((itt >> 28) != (u32)age || i >= (u32)cmds_max || !cmds)
        return 0;
    struct iscsi_task *task = NULL;
    bpf_probe_read_kernel(&task, sizeof(task), (struct iscsi_task **)cmds + i);
    u64 key = 0;
    if (task)
        bpf_probe_read_kernel(&key, sizeof(key), &task->sc);
    if (!key)
        return 0;
    struct inflight *f = stage_rx_pending(key);
    if (!f)
        return 0;
    return stage_rx_first(f, op);
}
#endif

#if !RX_HDR
/* The task iscsi_itt_to_ctask returned (where RX_HDR cannot be traced). */
static __always_inline int stage_rx(struct iscsi_task *task)
{
    /* A return value: bcc does not turn its member reads into probe reads
     * in a kretprobe, so they are explicit. */
    u64 key = 0;
    if (!task)
        return 0;
    bpf_probe_read_kernel(&key, sizeof(key), &task->sc);
    if (!key)
        return 0;      /* NOP-In, TMF, login */
    struct inflight *f = stage_rx_pending(key);
    if (!f)
        return 0;
    u8 op = 0;
#if !HAVE_R2T
    struct iscsi_conn *conn = NULL;
    struct iscsi_tcp_conn *tc = NULL;
    void *hdr = NULL;
    bpf_probe_read_kernel(&conn, sizeof(conn), &task->conn);
    if (conn)
        bpf_probe_read_kernel(&tc, sizeof(tc), &conn->dd_data);
    if (tc)
        bpf_probe_read_kernel(&hdr, sizeof(hdr), &tc->in.hdr);
    if (hdr)
        bpf_probe_read_kernel(&op, sizeof(op), hdr);   /* iscsi_hdr.opcode */
    op &= 0x3f;
#endif
    return stage_rx_first(f, op);
}
#endif

static __always_inline int stage_r2t(struct iscsi_task *task)
{
    u64 key = (u64)task->sc;
    if (!key)
        return 0;
    struct inflight *f = inflight_live(key);
    if (!f)
        return 0;
    /* The R2Ts of one task come one at a time, in its connection's
     * receive path. */
    if (f->r2t++ == 0)
        stage_clean_round_trip(f);
    return 0;
}

static __always_inline int stage_complete(void *ctx, struct iscsi_task *task, int state)
{
    u64 key = (u64)task->sc;
    if (!key) {
        /* management task (NOP-Out, TMF, login) */
        stage_ping_answered((u64)task, state);
        return 0;
    }
    struct inflight *f = inflight_live(key);
    if (!f)
        return 0;
    u64 now = bpf_ktime_get_ns();
    int task_state = task->state;
    if (state != ISCSI_TASK_COMPLETED || f->ts_prep == 0 ||
        task_state == ISCSI_TASK_PENDING) {
        /* aborted, failed by session recovery, or never sent */
        f->ts_queue = 0;
        count(CTR_ENDED_NO_RESPONSE);
        return 0;
    }
    struct stage_times t = {};
    if (now < f->ts_queue)
        now = f->ts_queue;
    u64 prep = f->ts_prep < f->ts_queue ? f->ts_queue : f->ts_prep;
    if (prep > now)
        prep = now;
#if HAVE_SENT
    u64 sent = f->ts_sent;
    if (sent == 0 || sent > now)
        sent = now;    /* the response beat the send call's return */
    if (sent < prep)
        sent = prep;
#else
    /* SEND cannot be told apart: it stays 0 and every tool shows it as
     * unknown; RESP counts from PDU preparation. */
    u64 sent = prep;
#endif
    t.wait = prep - f->ts_queue;
    t.send = sent - prep;
    t.resp = now - sent;
    t.total = now - f->ts_queue;
    t.retrans = RETX_UNKNOWN;
    if (f->sk) {
        u32 r = sock_retrans(f->sk);
        if (r >= f->retrans0)
            t.retrans = r - f->retrans0;
    }
#if HAVE_RX
#if HAVE_SENT
    int rx_before_sent = f->ts_sent == 0 || f->ts_rx < f->ts_sent;
#else
    int rx_before_sent = 0;
#endif
    if (f->ts_rx && !rx_before_sent && f->sk && f->rtt_us) {
        u64 rtt = (u64)f->rtt_us * 1000;
        u64 rx = f->ts_rx < sent ? sent : (f->ts_rx > now ? now : f->ts_rx);
        u64 first = rx - sent;
        u64 net = first < rtt ? first : rtt;
        if (HAVE_R2T ? f->r2t > 0 : f->rx_op == ISCSI_OP_R2T) {
            u64 dout = f->ts_dout < rx ? rx : (f->ts_dout > now ? now : f->ts_dout);
            u64 last = now - dout;
            net += (dout - rx) + (last < rtt ? last : rtt);
        } else {
            net += now - rx;
        }
        t.net = net;
        t.target = t.resp - net;
        t.split = f->net_from;
    } else {
        count(CTR_NOT_SPLIT);
        if (f->ts_rx && !rx_before_sent && f->sk)
            count(CTR_NET_UNKNOWN);
    }
#endif
    struct scsi_cmnd *sc = task->sc;
    on_command_done(ctx, f, &t, sc->result);
    f->ts_queue = 0;
    return 0;
}

#if FENTRY
/* ctx[i] is argument i; an fexit program's ctx[nargs] is the return value. */
int fentry_queuecommand(u64 *ctx)
{
    return stage_queuecommand((struct Scsi_Host *)ctx[0], (struct scsi_cmnd *)ctx[1]);
}

int fentry_prep(u64 *ctx)
{
    return stage_prep((struct iscsi_task *)ctx[0]);
}

int fexit_xmit(u64 *ctx)
{
    struct iscsi_task *task = (struct iscsi_task *)ctx[0];
    u64 key = (u64)task->sc;
    if (!key) {
        stage_ping_sent((u64)task, ping_sock(task), (int)ctx[1]);
        return 0;
    }
    return stage_xmit_done(key, (int)ctx[1]);
}

int fentry_r2t(u64 *ctx)
{
    return stage_r2t((struct iscsi_task *)ctx[0]);
}

#if RX_HDR
/* iscsi_tcp_hdr_recv_done(tcp_conn, segment) */
int fentry_rx_hdr(u64 *ctx)
{
    return stage_rx_hdr((struct iscsi_tcp_conn *)ctx[0]);
}
#else
/* iscsi_itt_to_ctask(conn, itt): ctx[2] is the task it returns. */
int fexit_rx(u64 *ctx)
{
    return stage_rx((struct iscsi_task *)ctx[2]);
}
#endif

int fentry_complete(u64 *ctx)
{
    return stage_complete(ctx, (struct iscsi_task *)ctx[0], (int)ctx[1]);
}
#else
int stages_queuecommand(struct pt_regs *ctx, struct Scsi_Host *shost,
                        struct scsi_cmnd *sc)
{
    return stage_queuecommand(shost, sc);
}

int stages_prep(struct pt_regs *ctx, struct iscsi_task *task)
{
    return stage_prep(task);
}

/* xmit_arg holds the command (struct scsi_cmnd *), or a ping's task with
 * bit 0 set (both pointers are aligned) and its socket in ping_arg. */
BPF_HASH(ping_arg, u64, u64, 64);

int stages_xmit(struct pt_regs *ctx, struct iscsi_task *task)
{
    u64 id = bpf_get_current_pid_tgid();
    u64 key = (u64)task->sc;
    if (key) {
        if (inflight_live(key))
            xmit_arg.update(&id, &key);
        return 0;
    }
    u64 sk = ping_sock(task);
    if (!sk) {
        stage_ping_sent((u64)task, 0, 0);
        return 0;
    }
    u64 t = (u64)task | 1;
    xmit_arg.update(&id, &t);
    ping_arg.update(&id, &sk);
    return 0;
}

int stages_xmit_ret(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u64 *keyp = xmit_arg.lookup(&id);
    if (!keyp)
        return 0;
    u64 key = *keyp;
    xmit_arg.delete(&id);
    if (key & 1) {
        u64 *sk = ping_arg.lookup(&id);
        if (sk) {
            stage_ping_sent(key & ~1ULL, *sk, PT_REGS_RC(ctx));
            ping_arg.delete(&id);
        }
        return 0;
    }
    return stage_xmit_done(key, PT_REGS_RC(ctx));
}

int stages_r2t(struct pt_regs *ctx, struct iscsi_task *task)
{
    return stage_r2t(task);
}

#if RX_HDR
int stages_rx_hdr(struct pt_regs *ctx, struct iscsi_tcp_conn *tc)
{
    return stage_rx_hdr(tc);
}
#else
int stages_rx_ret(struct pt_regs *ctx)
{
    return stage_rx((struct iscsi_task *)PT_REGS_RC(ctx));
}
#endif

int stages_complete(struct pt_regs *ctx, struct iscsi_task *task, int state)
{
    return stage_complete(ctx, task, state);
}
#endif
