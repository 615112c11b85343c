import time, os, numpy as np, xxhash
from concurrent.futures import ThreadPoolExecutor
from psrl.ps.checksum import checksum_and_word_sum, checksum
N = 8 << 30
buf = np.ones(N, dtype=np.uint8); buf[::4096] = 7
B = 64 << 20
views = [memoryview(buf)[o:o+B] for o in range(0, N, B)]
def run(fn, threads):
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fn, views[:4]))
        t = time.perf_counter(); list(pool.map(fn, views)); dt = time.perf_counter() - t
    return N / dt / 1e9
def wsum(v):
    a = np.frombuffer(v, dtype="<u8"); return int(a.sum(dtype=np.uint64))
for threads in (8, 16):
    print(threads, "xxh3", round(run(checksum, threads),1), "dual", round(run(checksum_and_word_sum, threads),1), "wsum", round(run(wsum, threads),1), "GB/s", flush=True)
t = time.perf_counter(); dst = np.empty_like(buf); np.copyto(dst, buf); print("memcpy 1 thread", round(N/(time.perf_counter()-t)/1e9,1))
