"""After writing N GB without fsync (as a conversion does), how busy is the machine (steal, system...) for a while?"""
import os, sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
from mlxspec.machine_load import machine_busy_seconds
def fields():
    with open("/proc/stat") as f: h = f.readline().split()
    return [int(x) for x in h[1:]]
def dirty():
    for l in open("/proc/meminfo"):
        if l.startswith(("Dirty:", "Writeback:")): yield l.split()[1]
gb = float(sys.argv[1]); path = "/root/wb.bin"
buf = os.urandom(1 << 24)
t0 = time.monotonic()
if gb:
    with open(path, "wb") as f:
        for _ in range(int(gb * 64)): f.write(buf)
print(f"wrote {gb} GB in {time.monotonic()-t0:.1f}s", flush=True)
names = "user nice system idle iowait irq softirq steal".split()
prev = fields(); tp = time.monotonic()
for i in range(12):
    time.sleep(5)
    cur = fields(); dt = time.monotonic() - tp; hz = os.sysconf("SC_CLK_TCK")
    d = {n: (c - p) / hz / dt for n, c, p in zip(names, cur, prev)}
    print(f"{5*(i+1):3d}s " + " ".join(f"{n}={d[n]:.2f}" for n in names), "dirty/wb kB", list(dirty()), flush=True)
    prev, tp = cur, time.monotonic()
if gb: os.remove(path)
