#!/usr/bin/env python3
# A tracer for tests/lab/bench and tests/lab/cost that costs what the stage
# tools' probes cost: entry and return of each FUNC with the same body, as
# kprobe/kretprobe or fentry/fexit. The body keeps a time per thread from
# entry to return in (MAP, default hash):
#   hash:  a hash map (update at entry, lookup and delete at return), as the
#          stage tools keep a command;
#   slot:  an LRU hash whose entry stays and is reused in place, as the
#          stage tools keep a command slot (a lookup and writes at entry,
#          an insert the first time; a lookup and a write at return);
#   array: an array slot by the thread's id with an owner check (a lookup
#          and two writes at entry, a lookup, a compare and a write at
#          return);
#   none:  no map (the clock read only), the floor of a program run.
#   probe-cost.py kprobe|fentry FUNC[,FUNC...] [hash|slot|array|none]
import signal, sys
from bcc import BPF
mode, funcs = sys.argv[1], sys.argv[2].split(",")
store = sys.argv[3] if len(sys.argv) > 3 else "hash"
BODY = {
    "hash": ("u64 k = bpf_get_current_pid_tgid(), t = bpf_ktime_get_ns(); start.update(&k, &t); return 0;",
             "u64 k = bpf_get_current_pid_tgid(); if (start.lookup(&k)) start.delete(&k); return 0;"),
    "slot": ("u64 k = bpf_get_current_pid_tgid(), t = bpf_ktime_get_ns(); u64 *v = slots_lru.lookup(&k); "
             "if (v) *v = t; else slots_lru.insert(&k, &t); return 0;",
             "u64 k = bpf_get_current_pid_tgid(); u64 *v = slots_lru.lookup(&k); if (v && *v) *v = 0; return 0;"),
    "array": ("u64 k = bpf_get_current_pid_tgid(); u32 i = (u32)k & 4095; struct slot *s = slots.lookup(&i); "
              "if (s) { s->owner = k; s->t = bpf_ktime_get_ns(); } return 0;",
              "u64 k = bpf_get_current_pid_tgid(); u32 i = (u32)k & 4095; struct slot *s = slots.lookup(&i); "
              "if (s && s->owner == k) s->owner = 0; return 0;"),
    "none": ("bpf_ktime_get_ns(); return 0;", "return 0;"),
}
if mode not in ("kprobe", "fentry") or store not in BODY:
    sys.exit("usage: probe-cost.py kprobe|fentry FUNC[,FUNC...] [hash|slot|array|none]")
entry, ret = BODY[store]
text = ("#include <uapi/linux/ptrace.h>\nBPF_HASH(start, u64, u64, 10240);\n"
        "BPF_TABLE(\"lru_hash\", u64, u64, slots_lru, 10240);\n"
        "struct slot { u64 owner; u64 t; };\nBPF_ARRAY(slots, struct slot, 4096);\n")
for f in funcs:
    if mode == "kprobe":
        text += ("int kprobe__%s(struct pt_regs *ctx) { %s }\n"
                 "int kretprobe__%s(struct pt_regs *ctx) { %s }\n") % (f, entry, f, ret)
    else:
        text += "KFUNC_PROBE(%s) { %s }\nKRETFUNC_PROBE(%s) { %s }\n" % (f, entry, f, ret)
b = BPF(text=text)
signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
print("Tracing %d probes (%s, %s)" % (2 * len(funcs), mode, store), flush=True)
signal.pause()
