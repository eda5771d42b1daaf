"""Collective sweeps over sizes, in nccl-tests' vocabulary (cases) and bus-bandwidth factors
(busbw).
"""
