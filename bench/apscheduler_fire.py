"""APScheduler 3 on the same fire workload as dagcron's engine benchmark.

Usage: python3 bench/apscheduler_fire.py MODE N SECONDS
  MODE every-second: N jobs firing every second
  MODE hourly:       N jobs, each once an hour at a distinct second
Prints one JSON object: fires, fires_per_s, p50_ms, p99_ms, max_ms, rss_mib.
"""
import json
import math
import resource
import sys
import threading
import time

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.executors.pool import ThreadPoolExecutor

mode, n, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
late = []
lock = threading.Lock()


def job():
    now = time.time()
    # Every job fires on a whole second: lateness is the distance past it.
    with lock:
        late.append((now - math.floor(now)) * 1000.0)


sched = BackgroundScheduler(executors={"default": ThreadPoolExecutor(20)}, job_defaults={"misfire_grace_time": 30, "coalesce": False, "max_instances": 1000})
for i in range(n):
    if mode == "every-second":
        sched.add_job(job, "cron", second="*")
    else:
        second_of_hour = i * 3600 // n
        sched.add_job(job, "cron", second=second_of_hour % 60, minute=second_of_hour // 60)
sched.start()
start = time.time()
time.sleep(seconds)
sched.shutdown(wait=False)
with lock:
    data = sorted(late)
rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def pct(p):
    return data[min(len(data) - 1, int(len(data) * p))] if data else None


print(json.dumps({"fires": len(data), "fires_per_s": len(data) / seconds, "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": data[-1] if data else None, "rss_mib": rss_mib}))
