"""Ranks as processes: where they are (dist), how they start locally (launch), how a stuck or
failed one ends them all (watchdog, sentinel, failures), and injected faults for tests.
"""
