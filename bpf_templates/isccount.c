/* isccount.c: the chain proof. Counts SCSI commands entering
 * iscsi_queuecommand per SCSI host, and completed responses per session id. */
#include <scsi/scsi_cmnd.h>
#include <scsi/scsi_host.h>
#include <scsi/libiscsi.h>
#include <scsi/scsi_transport_iscsi.h>

BPF_HASH(entered, u32, u64, 1024);
BPF_HASH(completed, u32, u64, 1024);

int count_queuecommand(struct pt_regs *ctx, struct Scsi_Host *shost, struct scsi_cmnd *sc)
{
    u32 host = shost->host_no;
    entered.increment(host);
    return 0;
}

int count_complete(struct pt_regs *ctx, struct iscsi_task *task, int state)
{
    if (!task->sc || state != {{COMPLETED_STATE}})
        return 0;
    u32 sid = task->conn->session->cls_session->sid;
    completed.increment(sid);
    return 0;
}
