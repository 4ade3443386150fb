/* submitslower.c: bio submissions (submit_bio_noacct / generic_make_request)
 * of MIN_US or more, timed per thread from entry to return. */
/* Kernel types read (from BTF or the headers, as in common.h):
 * @struct bio bi_bdev? bi_disk? bi_partno?
 * @struct block_device bd_dev bd_disk
 * @struct gendisk major first_minor
 */
#if !BTF_TYPES
#include <linux/blk_types.h>
#include <linux/blkdev.h>
#include <linux/kdev_t.h>
#endif

#define MIN_NS ({{MIN_US}} * 1000ULL)
#define FILTER_PID {{FILTER_PID}}
#define PID_VALUE {{PID}}
#define FILTER_DEV {{FILTER_DEV}}
#define DEV_VALUE {{DEV}}
#define FILTER_SET {{FILTER_SET}}
/* 1: bio->bi_bdev (5.12+); 0: bio->bi_disk + bi_partno */
#define BIO_BDEV {{BIO_BDEV}}

struct start_t {
    u64 ts;
    u32 dev;    /* the bio's device (a partition if it targets one) */
    u32 disk;   /* its whole disk */
    u32 depth;  /* nested submissions on this thread (stacked devices) */
};
BPF_HASH(start, u64, struct start_t, 10240);
/* Whole-disk dev_t numbers to trace (--iscsi), filled from user space. */
BPF_HASH(disks, u32, u8, 1024);

struct event {
    u64 ts;      /* when the submission returned */
    u64 lat;
    u32 pid;
    u32 tid;
    u32 dev;
    u32 disk;
    char comm[TASK_COMM_LEN];
};

int submit_entry(struct pt_regs *ctx, struct bio *bio)
{
    u64 id = bpf_get_current_pid_tgid();
#if FILTER_PID
    if ((id >> 32) != PID_VALUE)
        return 0;
#endif
    struct start_t *s = start.lookup(&id);
    if (s) {
        s->depth++;
        return 0;
    }
    struct start_t n = {};
    struct gendisk *gd = NULL;
    int major = 0, minor = 0;
#if BIO_BDEV
    struct block_device *bdev = NULL;
    bpf_probe_read_kernel(&bdev, sizeof(bdev), &bio->bi_bdev);
    if (!bdev)
        return 0;
    bpf_probe_read_kernel(&n.dev, sizeof(n.dev), &bdev->bd_dev);
    bpf_probe_read_kernel(&gd, sizeof(gd), &bdev->bd_disk);
#else
    u8 partno = 0;
    bpf_probe_read_kernel(&gd, sizeof(gd), &bio->bi_disk);
    bpf_probe_read_kernel(&partno, sizeof(partno), &bio->bi_partno);
#endif
    if (gd) {
        bpf_probe_read_kernel(&major, sizeof(major), &gd->major);
        bpf_probe_read_kernel(&minor, sizeof(minor), &gd->first_minor);
    }
    n.disk = MKDEV(major, minor);
#if !BIO_BDEV
    n.dev = n.disk + partno;
#endif
#if FILTER_DEV
    if (n.disk != DEV_VALUE)
        return 0;
#endif
#if FILTER_SET
    u32 disk = n.disk;
    if (!disks.lookup(&disk))
        return 0;
#endif
    n.ts = bpf_ktime_get_ns();
    start.update(&id, &n);
    return 0;
}

int submit_return(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    struct start_t *s = start.lookup(&id);
    if (!s)
        return 0;
    if (s->depth) {
        s->depth--;
        return 0;
    }
    u64 now = bpf_ktime_get_ns();
    struct event e = {};
    e.ts = now;
    e.lat = now - s->ts;
    e.dev = s->dev;
    e.disk = s->disk;
    start.delete(&id);
    count(CTR_SUBMIT_TIMED);
    if (e.lat < MIN_NS)
        return 0;
    e.pid = id >> 32;
    e.tid = (u32)id;
    bpf_get_current_comm(&e.comm, sizeof(e.comm));
    submit_event(ctx, &e, sizeof(e));
    return 0;
}
