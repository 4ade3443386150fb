#!/usr/bin/env python3
# A tracer for tests/lab/bench that costs what the stage tools' probes cost:
# entry and return of each FUNC with the same body (a hash update at entry,
# a lookup and delete at return), as kprobe/kretprobe or fentry/fexit.
#   probe-cost.py kprobe|fentry FUNC[,FUNC...]
import signal, sys
from bcc import BPF
mode, funcs = sys.argv[1], sys.argv[2].split(",")
text = "#include <uapi/linux/ptrace.h>\nBPF_HASH(start, u64, u64, 10240);\n"
for f in funcs:
    if mode == "kprobe":
        text += ("int kprobe__%s(struct pt_regs *ctx) { u64 k = bpf_get_current_pid_tgid(), t = bpf_ktime_get_ns(); start.update(&k, &t); return 0; }\n"
                 "int kretprobe__%s(struct pt_regs *ctx) { u64 k = bpf_get_current_pid_tgid(); if (start.lookup(&k)) start.delete(&k); return 0; }\n") % (f, f)
    else:
        text += ("KFUNC_PROBE(%s) { u64 k = bpf_get_current_pid_tgid(), t = bpf_ktime_get_ns(); start.update(&k, &t); return 0; }\n"
                 "KRETFUNC_PROBE(%s) { u64 k = bpf_get_current_pid_tgid(); if (start.lookup(&k)) start.delete(&k); return 0; }\n") % (f, f)
b = BPF(text=text)
signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
print("Tracing %d probes (%s)" % (2 * len(funcs), mode), flush=True)
signal.pause()
