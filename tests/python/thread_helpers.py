"""Running a call from several threads at once, for the thread tests."""

import threading


def run_in_threads(call, threads=8, calls=100):
    """call() `calls` times in each of `threads` threads started at once;
    the exceptions they raised."""
    start, failures = threading.Barrier(threads), []

    def work():
        try:
            start.wait()
            for _ in range(calls):
                call()
        except Exception as e:  # noqa: BLE001 -- every failure is reported
            failures.append(f"{type(e).__name__}: {e}")

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return failures
