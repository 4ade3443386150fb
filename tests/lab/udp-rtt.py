#!/usr/bin/env python3
# UDP round trips over lo (the lab guest has no ping): N echoes, min/mean/median/p90/max in ms.
#   tests/lab/run -- sh -c "python3 tests/lab/udp-rtt.py 300; tc qdisc add dev lo root netem delay 5ms; python3 tests/lab/udp-rtt.py 300"
import socket, sys, time, statistics
n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); srv.bind(("127.0.0.1", 0))
port = srv.getsockname()[1]
def echo():
    while True:
        d, a = srv.recvfrom(64)
        if d == b"q": return
        srv.sendto(d, a)
import os
if os.fork() == 0:  # the echo in its own process: no GIL hand-over in the round trip
    echo(); os._exit(0)
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); c.settimeout(2)
rtt = []
for i in range(n):
    t = time.monotonic_ns(); c.sendto(b"x", ("127.0.0.1", port)); c.recvfrom(64)
    rtt.append((time.monotonic_ns() - t) / 1e6); time.sleep(0.01)
c.sendto(b"q", ("127.0.0.1", port))
rtt.sort()
print("UDP RTT ms over %d: min %.3f mean %.3f median %.3f p90 %.3f max %.3f" % (n, rtt[0], statistics.mean(rtt), rtt[n // 2], rtt[int(n * 0.9)], rtt[-1]))
