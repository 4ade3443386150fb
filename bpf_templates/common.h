/* common.h: what every storprototrace program starts with.
 * BTF_TYPES (defined before this text by src/kernel/types.rs): the kernel
 * types the program reads are written from the running kernel's BTF,
 * instead of compiling the kernel's headers. pt_regs is what kprobe
 * handlers read.
 * @struct pt_regs *
 */
#ifndef BTF_TYPES
#define BTF_TYPES 0
#endif
#if BTF_TYPES
#define TASK_COMM_LEN 16
/* include/linux/kdev_t.h: the kernel's own dev_t encoding */
#define MINORBITS 20
#define MKDEV(ma, mi) (((ma) << MINORBITS) | (mi))
#else
#include <uapi/linux/ptrace.h>
#include <linux/sched.h>
#endif

/* Events go through the BPF ring buffer where the kernel has one (5.8+),
 * else through a perf buffer. A failed submit is counted, never silent. */
#define USE_RINGBUF {{USE_RINGBUF}}
#if USE_RINGBUF
#define EVENT_PAGES {{EVENT_PAGES}}  /* src/bpf/runner.rs (EventBuffer) */
BPF_RINGBUF_OUTPUT(events, EVENT_PAGES);
#define RINGBUF_BATCH 64
BPF_PERCPU_ARRAY(ringbuf_batch, u32, 1);
#else
BPF_PERF_OUTPUT(events);
#endif

/* counters[i]: one name per slot, for every tool; src/bpf/maps.rs (Counter)
 * has the same names and numbers, and a test checks that they agree. */
#define CTR_LOST 0               /* an event or row that did not fit */
#define CTR_ENDED_NO_RESPONSE 1  /* command aborted, failed by recovery, never sent */
#define CTR_DISPATCH_BUSY 2      /* dispatched again after a dispatch that got no task */
#define CTR_INFLIGHT_FULL 3      /* in-flight map refused a slot: not timed */
#define CTR_END_NOT_SEEN 4       /* command memory reused while still in our map */
#define CTR_FREEZE_UNFILTERED 5  /* iscfreeze: freezes of disks not traced */
#define CTR_SUBMIT_TIMED 6       /* submitslower: submissions timed */
#define CTR_NOT_SPLIT 7          /* command timed, RESP not split into NET/TARGET */
#define CTR_NET_UNKNOWN 8        /* of those: no round trip known (network or target) */
#define CTR_SLOTS 9
BPF_ARRAY(counters, u64, CTR_SLOTS);

static __always_inline void count(int slot)
{
    u64 *v = counters.lookup(&slot);
    if (v)
        __sync_fetch_and_add(v, 1);
}

/* Send one event; a full buffer is counted as lost, never silent.
 * (bcc rewrites map calls only outside macros, hence a function.) */
static __always_inline void submit_event(void *ctx, void *ev, u32 size)
{
#if USE_RINGBUF
    /* Wake the reader once per RINGBUF_BATCH events of a CPU; it also
     * drains the buffer at every poll timeout (100 ms, src/bpf/runner.rs), so
     * a lone event waits at most that long: one wake-up per batch instead
     * of one per event. (libbcc 0.26 has no ringbuf_query.) */
    u32 zero = 0;
    u32 *n = ringbuf_batch.lookup(&zero);
    u64 flags = BPF_RB_NO_WAKEUP;
    if (n && ++*n >= RINGBUF_BATCH) {
        *n = 0;
        flags = BPF_RB_FORCE_WAKEUP;
    }
    int rc = events.ringbuf_output(ev, size, flags);
#else
    int rc = events.perf_submit(ctx, ev, size);
#endif
    if (rc != 0)
        count(CTR_LOST);
}
