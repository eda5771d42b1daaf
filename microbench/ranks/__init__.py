"""Ranks as processes: where they are (dist), how they start locally (launch), how a stuck or
failed one ends them all (watchdog, sentinel, failures), whether they outnumber their host's
CPUs (cpus), and injected faults for tests.
"""
