"""The convoy effect behind the load's short GIL switch interval, on any CPU: a thread doing
torch work that releases the GIL (400 rounds of a clone and an in-place multiply of a 4-MB
tensor) alone, and beside a thread running pure Python, at three switch intervals.

    python docs/bench/gil_convoy.py
"""

import sys
import threading
import time

import torch

x = torch.randn(1 << 20)


def torch_work(rounds=400):
    t = time.perf_counter()
    for _ in range(rounds):
        y = x.clone()
        y.mul_(2)
    return time.perf_counter() - t


def python_work(stop):
    while not stop.is_set():
        sum(i * i for i in range(1000))


torch_work()  # first touch
for interval in (0.005, 0.001, 0.0002):
    sys.setswitchinterval(interval)
    alone = torch_work()
    stop = threading.Event()
    busy = threading.Thread(target=python_work, args=(stop,))
    busy.start()
    time.sleep(0.05)
    beside = torch_work()
    stop.set()
    busy.join()
    print(f"switch {interval * 1e3:.1f} ms: alone {alone:.2f} s, beside Python {beside:.2f} s")
